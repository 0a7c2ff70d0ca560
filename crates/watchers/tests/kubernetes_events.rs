//! Kubernetes Events on quarantined objects, at the protocol level: a scripted API
//! server (`tower-test`) behind a real `kube::Client` sees exactly the Events the
//! leader writes through `events.k8s.io/v1`.

mod kubernetes_mock;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hapwright_eventbus::model::{
    Diagnostic, ObjectKey, RenderedConfig, ResourceChange, ResourceSnapshot, SourceLocation,
};
use hapwright_eventbus::{
    HealthState, QuarantineSearched, QuarantinedObject, ResourceIndexUpdated, TemplateRendered,
};
use hapwright_watchers::kubernetes::QuarantineEvents;
use hapwright_watchers::kubernetes::events::{QUARANTINED_REASON, RELEASED_REASON, notices};
use kubernetes_mock::{Exchange, Writing};
use serde_json::{Value, json};
use tokio::sync::watch;

const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/shop/events";

struct Harness {
    writing: Writing,
}

fn start(leader: Option<watch::Receiver<bool>>) -> Harness {
    let writing = Writing::start(|client, kernel| {
        let mut component = QuarantineEvents::new(client, kubernetes_mock::ingresses())
            .with_instance("hapwright-0");
        if let Some(leader) = leader {
            component = component.with_leadership(leader);
        }
        kernel.register(component);
    });
    Harness { writing }
}

/// Checks that `event` is about the Ingress `shop/web`.
fn assert_regards_web(event: &Value) {
    assert_eq!(
        event["regarding"],
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "namespace": "shop", "name": "web", "uid": "uid-web",
        })
    );
}

/// A quarantined object of `resource`.
fn object(resource: &str, name: &str) -> QuarantinedObject {
    QuarantinedObject {
        resource: resource.into(),
        kind: None,
        namespace: "shop".into(),
        name: name.into(),
        change: "modified",
        errors: vec![
            Diagnostic::error("'server web-1' : could not resolve address '300.1.2.3'.")
                .at(SourceLocation::new("haproxy.cfg", Some(41), None))
                .from_origin(SourceLocation::new("backend", Some(7), None)),
        ],
        since: SystemTime::now(),
    }
}

fn searched(
    objects: Vec<QuarantinedObject>,
    released: Vec<QuarantinedObject>,
) -> QuarantineSearched {
    QuarantineSearched {
        objects,
        released,
        accepted: 3,
        probes: 2,
        gave_up: None,
    }
}

impl Harness {
    /// Publishes the `ingresses` snapshot holding `names` (with uids).
    fn ingresses(&self, names: &[&str]) {
        let mut snapshot = ResourceSnapshot::new(Vec::new());
        for name in names {
            snapshot.upsert(
                ObjectKey::new("shop", *name),
                &json!({
                    "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                    "metadata": {"namespace": "shop", "name": name, "uid": format!("uid-{name}")},
                }),
            );
        }
        self.writing.publisher.publish(ResourceIndexUpdated {
            source: "ingresses".into(),
            snapshot: Arc::new(snapshot),
            change: Arc::new(ResourceChange::default()),
        });
    }

    /// Publishes a quarantine search that holds back `objects` and releases
    /// `released`.
    fn search(&self, objects: Vec<QuarantinedObject>, released: Vec<QuarantinedObject>) {
        self.writing.publisher.publish(searched(objects, released));
    }

    /// The next Event the component creates; answers it as the API server would.
    async fn created(&mut self) -> Value {
        let exchange = self.writing.api.next().await;
        assert_eq!(exchange.method, http::Method::POST, "{exchange:?}");
        assert_eq!(exchange.path, EVENTS, "{exchange:?}");
        let body = exchange.json();
        exchange.respond(201, &body);
        body
    }

    /// Publishes a render whose `haproxy.cfg` is `main`.
    fn rendered(&self, main: &str) {
        self.writing.publisher.publish(TemplateRendered {
            config: Arc::new(RenderedConfig::builder(main).build()),
            duration: Duration::ZERO,
            render: Default::default(),
        });
    }

    async fn health(&mut self, state: HealthState) -> String {
        self.writing.health(QuarantineEvents::NAME, state).await
    }

    async fn stop(self) {
        self.writing.stop().await;
    }
}

#[tokio::test]
async fn a_quarantined_kubernetes_object_gets_a_warning_and_its_release_a_normal_event() {
    let mut h = start(None);
    h.ingresses(&["web", "api"]);
    // `services` comes from files: no Event for it, only for the Ingress.
    h.writing.publisher.publish(searched(
        vec![object("services", "web"), object("ingresses", "web")],
        Vec::new(),
    ));
    let event = h.created().await;
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], QUARANTINED_REASON);
    assert_eq!(event["reportingController"], "hapwright");
    assert_eq!(event["reportingInstance"], "hapwright-0");
    assert_regards_web(&event);
    let note = event["note"].as_str().unwrap();
    assert!(note.contains("(modified)"), "{note}");
    assert!(
        note.contains("haproxy.cfg:41: 'server web-1' : could not resolve address '300.1.2.3'. (from backend:7)"),
        "the template line and HAProxy's message: {note}"
    );

    // The next search still lists it: nothing new is written. The next request is
    // the release's Normal Event, not a repeated warning.
    h.search(vec![object("ingresses", "web")], Vec::new());
    h.search(Vec::new(), vec![object("ingresses", "web")]);
    let event = h.created().await;
    assert_eq!(event["type"], "Normal");
    assert_eq!(event["reason"], RELEASED_REASON);
    assert_eq!(event["regarding"]["name"], "web");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn only_the_leader_writes_events() {
    let (leader, follower) = watch::channel(false);
    let mut h = start(Some(follower));
    h.ingresses(&["web", "api"]);
    // While following: nothing is written for web, quarantined and released.
    h.search(vec![object("ingresses", "web")], Vec::new());
    h.search(Vec::new(), vec![object("ingresses", "web")]);
    // With paused time this returns once every task is idle: the component has
    // handled both searches as a follower.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Leading: the first Event the API server sees is api's.
    leader.send_replace(true);
    h.writing
        .publisher
        .publish(searched(vec![object("ingresses", "api")], Vec::new()));
    let event = h.created().await;
    assert_eq!(event["regarding"]["name"], "api", "{event}");
    assert_eq!(event["type"], "Warning");
    h.stop().await;
}

#[tokio::test]
async fn a_refused_write_degrades_the_component_and_is_retried() {
    let mut h = start(None);
    h.ingresses(&["web"]);
    h.health(HealthState::Healthy).await;
    h.writing
        .publisher
        .publish(searched(vec![object("ingresses", "web")], Vec::new()));
    let exchange: Exchange = h.writing.api.next().await;
    assert_eq!(exchange.path, EVENTS);
    exchange.respond_status(
        403,
        "Forbidden",
        "events.events.k8s.io is forbidden: User \"system:serviceaccount:ingress:hapwright\" cannot create resource \"events\"",
    );
    let reason = h.health(HealthState::Degraded).await;
    assert!(
        reason.starts_with("cannot write Kubernetes Events:") && reason.contains("Forbidden"),
        "{reason}"
    );
    // Not announced, so the next search tries again; success makes it healthy.
    h.writing
        .publisher
        .publish(searched(vec![object("ingresses", "web")], Vec::new()));
    let event = h.created().await;
    assert_eq!(event["reason"], QUARANTINED_REASON);
    h.health(HealthState::Healthy).await;
    h.stop().await;
}

/// `haproxy.cfg` with a notice about Ingress `shop/<name>`.
fn with_notice(name: &str) -> String {
    format!(
        "global\n    # a comment\n    # hapwright:Conflict Ingress shop/{name}: prefix path a.test/ is \
         refused, it is served by the older Ingress other/web\n# hapwright:bad reason x/y\n"
    )
}

#[test]
fn notices_are_read_from_their_comment_lines_only() {
    let found = notices(&with_notice("web"));
    assert_eq!(found.len(), 1, "{found:?}");
    let notice = found.iter().next().unwrap();
    assert_eq!(
        (
            notice.reason.as_str(),
            notice.kind.as_str(),
            notice.namespace.as_str(),
            notice.name.as_str()
        ),
        ("Conflict", "Ingress", "shop", "web")
    );
    assert_eq!(
        notice.message,
        "prefix path a.test/ is refused, it is served by the older Ingress other/web"
    );
    // A notice line's message may follow words after the object, and a value in
    // the line cannot start another one (it cannot hold a line break).
    let found = notices("# hapwright:Conflict Gateway shop/edge listener a: hostname taken\n");
    assert_eq!(
        found.iter().next().unwrap().message,
        "listener a: hostname taken"
    );
    assert!(
        notices("# hapwright:Conflict Ingress noslash: x\n# hapwright: Conflict Ingress a/b: x\n")
            .is_empty()
    );
}

#[tokio::test]
async fn a_notice_in_the_rendered_config_becomes_a_warning_once_and_again_after_it_went_away() {
    let mut h = start(None);
    h.ingresses(&["web", "api"]);
    h.rendered(&with_notice("web"));
    let event = h.created().await;
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], "HapwrightConflict");
    assert_eq!(event["action"], "Render");
    assert_regards_web(&event);
    assert!(
        event["note"]
            .as_str()
            .unwrap()
            .starts_with("prefix path a.test/ is refused"),
        "{event}"
    );
    // The same notice in the next render is not written again: the next request is
    // api's new notice.
    h.rendered(&format!("{}{}", with_notice("web"), with_notice("api")));
    let event = h.created().await;
    assert_eq!(event["regarding"]["name"], "api", "{event}");
    // Once it went away and came back, it is written again. A notice about a kind
    // no kubernetes resource watches (Service here) writes nothing.
    h.rendered("global\n# hapwright:Conflict Service shop/web: not watched from Kubernetes\n");
    h.rendered(&with_notice("web"));
    // The Events API folds the repeat into the first Event's series.
    let exchange = h.writing.api.next().await;
    assert_eq!(exchange.method, http::Method::PATCH, "{exchange:?}");
    assert!(
        exchange.path.starts_with(&format!("{EVENTS}/web.")),
        "{exchange:?}"
    );
    let body = exchange.json();
    exchange.respond(200, &body);
    h.stop().await;
}
