//! Status written back to Kubernetes, end to end inside one controller iteration's
//! bus: the status templates render from the deployed render's snapshots, and the
//! writer sends server-side apply patches to a scripted API server (`tower-test`
//! behind a real `kube::Client`).

#[path = "../../watchers/tests/kubernetes_mock/mod.rs"]
mod kubernetes_mock;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hapwright_eventbus::model::{ContentHash, FieldPath, ObjectKey, ResourceSnapshot};
use hapwright_eventbus::{DeploymentCompleted, DeploymentSummary, HealthState, TemplateInputs};
use hapwright_reconciler::renderer::Templates;
use hapwright_reconciler::status::{StatusComponent, StatusTemplates};
use hapwright_watchers::kubernetes::{StatusMetrics, StatusWriter};
use kubernetes_mock::{Exchange, Writing, resource_list};
use serde_json::{Value, json};

/// Publishes the Service's load-balancer address as the Ingress's, with a Ready
/// condition; fails for the Ingress named `bad`.
const TEMPLATE: &str = r#"{% if object.metadata.name == 'bad' %}{{ fail('cannot publish bad') }}{% endif %}
{% set lb = resources.services.get(extraContext.publishNamespace, extraContext.publishName) %}
loadBalancer:
  ingress:
  - ip: "{{ lb.status.loadBalancer.ingress[0].ip }}"
conditions:
- type: Ready
  status: "True"
  reason: Published
"#;

struct Harness {
    writing: Writing,
    clock: Arc<Mutex<String>>,
    discovered: bool,
}

fn start() -> Harness {
    let mut templates = Templates::new("global\n");
    templates.extra_context = json!({"publishNamespace": "ingress", "publishName": "haproxy"});
    let status = StatusTemplates::new(
        &templates,
        &BTreeMap::from([("ingresses".to_owned(), TEMPLATE.to_owned())]),
        &["ingresses", "services"],
    )
    .unwrap();
    let clock = Arc::new(Mutex::new("2026-01-01T00:00:00Z".to_owned()));
    let now = clock.clone();
    let writing = Writing::start(|client, kernel| {
        kernel
            .register(StatusComponent::new(status).with_clock(move || now.lock().unwrap().clone()));
        kernel.register(StatusWriter::new(
            client,
            kubernetes_mock::ingresses(),
            StatusMetrics::unregistered().unwrap(),
        ));
    });
    Harness {
        writing,
        clock,
        discovered: false,
    }
}

fn snapshot(objects: &[Value]) -> Arc<ResourceSnapshot> {
    let mut snapshot = ResourceSnapshot::new(
        ["metadata.namespace", "metadata.name"]
            .into_iter()
            .map(|p| FieldPath::parse(p).unwrap())
            .collect(),
    );
    for object in objects {
        snapshot.upsert(
            ObjectKey::new(
                object["metadata"]["namespace"].as_str().unwrap(),
                object["metadata"]["name"].as_str().unwrap(),
            ),
            object,
        );
    }
    Arc::new(snapshot)
}

fn ingress(name: &str, status: Value) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"namespace": "shop", "name": name},
        "status": status,
    })
}

fn service(ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "ingress", "name": "haproxy"},
        "status": {"loadBalancer": {"ingress": [{"ip": ip}]}},
    })
}

impl Harness {
    /// A render of `hash` from these objects.
    fn rendered(&self, hash: &[u8], ingresses: &[Value], ip: &str) {
        self.writing.publisher.publish(TemplateInputs {
            hash: ContentHash::of(hash),
            snapshots: Arc::new(BTreeMap::from([
                (Arc::from("ingresses"), snapshot(ingresses)),
                (Arc::from("services"), snapshot(&[service(ip)])),
            ])),
        });
    }

    fn deployed(&self, hash: &[u8]) {
        self.writing.publisher.publish(DeploymentCompleted {
            summary: DeploymentSummary {
                hash: ContentHash::of(hash),
                succeeded: vec!["local".into()],
                failed: Vec::new(),
                duration: Duration::from_millis(5),
            },
        });
    }

    /// The next status patch (after resolving the kind once), answered with 200.
    async fn patched(&mut self) -> (String, Value) {
        if !self.discovered {
            let exchange = self
                .writing
                .api
                .expect_get("/apis/networking.k8s.io/v1")
                .await;
            exchange.respond(
                200,
                &resource_list("networking.k8s.io/v1", "ingresses", "Ingress", true),
            );
            self.discovered = true;
        }
        let exchange: Exchange = self.writing.api.next().await;
        assert_eq!(exchange.method, http::Method::PATCH, "{exchange:?}");
        assert_eq!(
            exchange.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
        assert_eq!(exchange.param("fieldManager"), Some("hapwright"));
        assert_eq!(exchange.param("force"), Some("true"));
        let body = exchange.json();
        let path = exchange.path.clone();
        exchange.respond(200, &body);
        (path, body)
    }

    async fn health(&mut self, component: &str, state: HealthState) -> String {
        self.writing.health(component, state).await
    }
}

// Real time: the status component renders on the blocking pool, which paused time
// would not wait for. Every "nothing written" is proven by the next request the
// API server sees being the later, distinguishable write.
#[tokio::test]
async fn statuses_follow_deployments_keep_transition_times_and_survive_one_bad_object() {
    let mut h = start();
    // A render that is never deployed: its status (192.0.2.6) is never written.
    h.rendered(
        b"zero",
        &[ingress("web", json!({})), ingress("bad", json!({}))],
        "192.0.2.6",
    );
    // The deployed render: web's status is written; bad's template error is
    // reported and does not stop it.
    h.rendered(
        b"one",
        &[ingress("web", json!({})), ingress("bad", json!({}))],
        "192.0.2.7",
    );
    h.deployed(b"one");
    let (path, body) = h.patched().await;
    assert_eq!(
        path,
        "/apis/networking.k8s.io/v1/namespaces/shop/ingresses/web/status"
    );
    let written = body["status"].clone();
    assert_eq!(
        written,
        json!({
            "loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]},
            "conditions": [{"type": "Ready", "status": "True", "reason": "Published",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        })
    );
    let reason = h.health(StatusComponent::NAME, HealthState::Degraded).await;
    assert!(
        reason.contains("statusTemplates.ingresses:1")
            && reason.contains("shop/bad")
            && reason.contains("cannot publish bad"),
        "{reason}"
    );

    // The watch reports the written status back; the next render (same config)
    // renders it unchanged, later, with the condition's original time: no write.
    *h.clock.lock().unwrap() = "2026-02-02T00:00:00Z".to_owned();
    h.rendered(b"one", &[ingress("web", written.clone())], "192.0.2.7");

    // The Service's address changes (a new config): written only after its
    // deployment, and the Ready condition keeps its transition time. This is the
    // next request the API server sees.
    h.rendered(b"two", &[ingress("web", written.clone())], "192.0.2.8");
    h.deployed(b"two");
    let (_, body) = h.patched().await;
    assert_eq!(
        body["status"]["loadBalancer"]["ingress"][0]["ip"],
        "192.0.2.8"
    );
    assert_eq!(
        body["status"]["conditions"][0]["lastTransitionTime"],
        "2026-01-01T00:00:00Z"
    );
    h.health(StatusComponent::NAME, HealthState::Healthy).await;
    h.writing.stop().await;
}
