//! The HTTP surface over a real socket.

use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::model::{
    DeployStrategy, Diagnostic, ObjectKey, ResourceChange, ResourceSnapshot,
};
use hapwright_eventbus::{
    CorrelationId, HealthState, InstanceDeployed, ReconciliationStarted, ResourceIndexUpdated,
    ResourceSyncComplete, TemplateRenderFailed, TemplateRendered,
};
use serde_json::json;

use super::*;

mod approve;
mod hardening;
use crate::status::tests::{event, rendered};

struct Harness {
    server: HttpServer,
    store: StatusStore,
    reloads: mpsc::Receiver<ReloadRequest>,
    policy: Arc<ArcSwap<Policy>>,
    approve: ApproveHandle,
    client: reqwest::Client,
}

impl Harness {
    async fn start() -> Self {
        Self::start_with(Limits::default()).await
    }

    async fn start_with(limits: Limits) -> Self {
        let registry = Registry::new();
        let counter = prometheus::IntCounter::new("hapwright_test_total", "test").unwrap();
        registry.register(Box::new(counter)).unwrap();
        let store = StatusStore::default();
        let (reload, reloads) = ReloadHandle::channel();
        let state = HttpState::new(store.clone(), registry, reload);
        let policy = state.policy.clone();
        let approve = state.approve.clone();
        let server = HttpServer::bind("127.0.0.1:0".parse().unwrap(), router(state), limits)
            .await
            .unwrap();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        Self {
            server,
            store,
            reloads,
            policy,
            approve,
            client,
        }
    }

    fn set_policy(&self, edit: impl FnOnce(&mut Policy)) {
        let mut policy = Policy::clone(&self.policy.load());
        edit(&mut policy);
        self.policy.store(Arc::new(policy));
    }

    /// One raw HTTP/1.1 request (so the `Host` header is exactly `host`) on a
    /// fresh connection: status and body.
    async fn raw(&self, method: &str, path: &str, host: &str, headers: &str) -> (u16, String) {
        raw_request(self.server.local_addr(), method, path, host, headers).await
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.server.local_addr(), path)
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let response = self.client.get(self.url(path)).send().await.unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    async fn json(&self, path: &str) -> (u16, serde_json::Value) {
        let (status, body) = self.get(path).await;
        (
            status,
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}")),
        )
    }
}

#[tokio::test]
async fn health_readiness_metrics_and_reload() {
    let mut h = Harness::start().await;
    assert_eq!(h.get("/healthz").await, (200, "ok\n".into()));
    let (status, body) = h.json("/readyz").await;
    assert_eq!(status, 503);
    assert_eq!(body["ready"], false);
    assert!(body["reason"].as_str().unwrap().contains("no deployment"));

    h.store.apply(
        &event(
            1,
            None,
            InstanceDeployed {
                instance: "local".into(),
                hash: rendered().hash(),
                strategy: DeployStrategy::Runtime,
                reason: None,
                duration: Duration::from_millis(2),
            },
        ),
        None,
    );
    assert_eq!(h.json("/readyz").await.0, 200);

    let (status, metrics) = h.get("/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("hapwright_test_total 0"), "{metrics}");

    let mut reloads = std::mem::replace(&mut h.reloads, ReloadHandle::channel().1);
    let answered = tokio::spawn(async move {
        let request = reloads.recv().await.unwrap();
        let source = request.source;
        request.answer(ReloadOutcome::Accepted);
        source
    });
    let response = h
        .client
        .post(h.url("/-/reload"))
        .header("X-Hapwright-Reload", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 202);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["status"], "accepted");
    assert_eq!(answered.await.unwrap(), ReloadSource::Http);
    assert_eq!(
        h.client
            .get(h.url("/-/reload"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        405
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn rendered_files_hide_certificates_and_pem_blocks() {
    let h = Harness::start().await;
    let (status, body) = h.json("/debug/rendered").await;
    assert_eq!(status, 404);
    assert_eq!(body["error"], "nothing rendered yet");

    let config = rendered();
    h.store.apply(
        &event(
            1,
            None,
            TemplateRendered {
                config: config.clone(),
                duration: Duration::ZERO,
                render: Default::default(),
            },
        ),
        None,
    );
    let (status, body) = h.json("/debug/rendered").await;
    assert_eq!(status, 200);
    assert_eq!(body["hash"], config.hash().to_string());
    let text = body.to_string();
    assert!(!text.contains("MIIE"), "key material leaked: {text}");
    assert!(!text.contains("AAAA"), "certificate leaked: {text}");
    let files = body["files"].as_array().unwrap();
    let cert = files
        .iter()
        .find(|f| f["path"] == "certs/site.pem")
        .unwrap();
    assert!(cert["content"].as_str().unwrap().starts_with("<redacted: "));
    let inline = files
        .iter()
        .find(|f| f["path"] == "files/inline.pem")
        .unwrap();
    assert_eq!(inline["content"], "before\n<redacted CERTIFICATE>\nafter\n");
    h.server.shutdown().await;
}

#[tokio::test]
async fn resources_are_listed_with_secret_data_hidden() {
    let h = Harness::start().await;
    let (status, body) = h.json("/debug/resources/secrets").await;
    assert_eq!(status, 404);
    assert_eq!(body["known"], json!([]));

    let mut snapshot = ResourceSnapshot::new(vec![]);
    snapshot.upsert(
        ObjectKey::new("default", "tls"),
        &json!({"kind": "Secret", "metadata": {"name": "tls"}, "data": {"tls.key": "c2VjcmV0"}}),
    );
    h.store.apply(
        &event(
            1,
            None,
            ResourceIndexUpdated {
                source: "secrets".into(),
                snapshot: Arc::new(snapshot),
                change: Arc::new(ResourceChange::default()),
            },
        ),
        None,
    );
    let (status, body) = h.json("/debug/resources/secrets").await;
    assert_eq!(status, 200);
    assert_eq!(body["count"], 1);
    assert_eq!(body["objects"][0]["data"]["tls.key"], "<redacted>");
    assert_eq!(body["objects"][0]["metadata"]["name"], "tls");
    h.server.shutdown().await;
}

#[tokio::test]
async fn a_watched_resource_answers_before_its_first_sync() {
    let h = Harness::start().await;
    h.store
        .set_watched_resources(["services".to_owned(), "endpoints".to_owned()]);
    let (status, body) = h.json("/debug/resources/services").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"name": "services", "count": 0, "objects": [], "synced": false})
    );
    h.store.apply(
        &event(
            1,
            None,
            ResourceIndexUpdated {
                source: "services".into(),
                snapshot: Arc::new(ResourceSnapshot::new(vec![])),
                change: Arc::new(ResourceChange::default()),
            },
        ),
        None,
    );
    h.store.apply(
        &event(
            2,
            None,
            ResourceSyncComplete {
                source: "services".into(),
            },
        ),
        None,
    );
    let (status, body) = h.json("/debug/resources/services").await;
    assert_eq!((status, &body["synced"]), (200, &json!(true)), "{body}");
    let (status, body) = h.json("/debug/resources/nope").await;
    assert_eq!(status, 404);
    assert_eq!(body["known"], json!(["endpoints", "services"]));
    h.server.shutdown().await;
}

#[tokio::test]
async fn every_configured_instance_is_listed_from_the_start() {
    let h = Harness::start().await;
    h.store
        .set_static_instances(["edge-1".to_owned(), "edge-2".to_owned()]);
    let (_, body) = h.json("/debug/instances").await;
    let states: Vec<(String, String)> = body
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["name"].as_str().unwrap().to_owned(),
                i["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            ("edge-1".to_owned(), "pending".to_owned()),
            ("edge-2".to_owned(), "pending".to_owned())
        ]
    );
    h.store.apply(
        &event(
            1,
            None,
            InstanceDeployed {
                instance: "edge-1".into(),
                hash: rendered().hash(),
                strategy: DeployStrategy::Runtime,
                reason: Some(hapwright_eventbus::model::DeployReason {
                    reload: None,
                    detail: "server be/s1: weight 10 → 20".into(),
                }),
                duration: Duration::from_millis(2),
            },
        ),
        None,
    );
    let (_, body) = h.json("/debug/instances").await;
    assert_eq!(body[0]["state"], "deployed");
    // One shape for every strategy: `reload` is there, null when not a reload.
    assert_eq!(
        body[0]["last_reason"],
        json!({"reload": null, "detail": "server be/s1: weight 10 → 20"})
    );
    assert_eq!(body[1]["state"], "pending");
    h.server.shutdown().await;
}

#[tokio::test]
async fn events_can_be_limited_and_filtered_by_correlation() {
    let h = Harness::start().await;
    let wanted = CorrelationId::new();
    for i in 0..10u64 {
        let correlation = (i >= 5).then_some(wanted);
        h.store.remember_event(Arc::new(event(
            i,
            correlation,
            ReconciliationStarted {
                reason: i.to_string(),
                follow_up: false,
            },
        )));
    }
    let (_, body) = h.json("/debug/events?limit=3").await;
    let ids: Vec<u64> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [7, 8, 9]);
    let (_, body) = h
        .json(&format!("/debug/events?correlation_id={wanted}"))
        .await;
    assert_eq!(body["events"].as_array().unwrap().len(), 5);
    assert_eq!(body["events"][0]["type"], "ReconciliationStarted");
    let (status, body) = h.json("/debug/events?correlation_id=not-hex").await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("not-hex"));
    h.server.shutdown().await;
}

#[tokio::test]
async fn status_page_and_components_show_health_and_escape_html() {
    let h = Harness::start().await;
    let (_, components) = h.json("/debug/components").await;
    assert_eq!(components, json!([]));

    // A kernel's health table, as the reinit loop hands it to the store.
    let bus = hapwright_eventbus::Bus::new(
        Default::default(),
        &hapwright_eventbus::BusMetrics::register(&Registry::new()).unwrap(),
    );
    let mut kernel = hapwright_eventbus::Kernel::new(bus);
    kernel.register(crate::status::EventLog::new(h.store.clone()));
    h.store.set_health(kernel.health());
    let running = kernel.start().unwrap();
    let (_, components) = h.json("/debug/components").await;
    assert_eq!(components[0]["name"], "event-log");
    assert_eq!(components[0]["health"], HealthState::Healthy.as_str());
    assert!(components[0]["since"].as_f64().unwrap() > 0.0);

    h.store.apply(
        &event(
            1,
            None,
            TemplateRenderFailed {
                errors: vec![Diagnostic::error("unexpected `<script>` in template").at(
                    hapwright_eventbus::model::SourceLocation::new(
                        "backend-servers",
                        Some(7),
                        None,
                    ),
                )],
            },
        ),
        None,
    );
    let (status, page) = h.get("/").await;
    assert_eq!(status, 200);
    assert!(page.contains(r#"<table id="components">"#));
    assert!(page.contains("event-log"));
    assert!(page.contains(r#"<table id="instances">"#));
    assert!(
        page.contains("backend-servers:7: unexpected `&lt;script&gt;` in template"),
        "{page}"
    );
    assert!(!page.contains("<script>"));
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "no external assets"
    );
    running.shutdown(Duration::from_secs(5)).await;
    h.server.shutdown().await;
}

#[tokio::test]
async fn the_metrics_listener_serves_only_scrape_and_probes() {
    let store = StatusStore::default();
    let (reload, _rx) = ReloadHandle::channel();
    let state = HttpState::new(store, Registry::new(), reload);
    let server = HttpServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        metrics_router(state),
        Limits::default(),
    )
    .await
    .unwrap();
    let base = format!("http://{}", server.local_addr());
    let client = reqwest::Client::new();
    assert_eq!(
        client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        client
            .get(format!("{base}/debug/config"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        404
    );
    assert_eq!(
        client
            .post(format!("{base}/-/reload"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        404
    );
    server.shutdown().await;
}

#[test]
fn pem_redaction_handles_several_and_unterminated_blocks() {
    let text = "a\n-----BEGIN RSA PRIVATE KEY-----\nx\n-----END RSA PRIVATE KEY-----\nb\n-----BEGIN CERTIFICATE-----\ny\n";
    assert_eq!(
        redact_pem(text),
        "a\n<redacted RSA PRIVATE KEY>\nb\n<redacted CERTIFICATE>"
    );
    assert_eq!(redact_pem("plain"), "plain");
    assert_eq!(redact_pem("-----BEGIN broken"), "<redacted PEM block>");
}

/// A mandatory component that stops: `/healthz` stays 200 during the grace, then
/// answers 503 naming it, on both listeners.
#[tokio::test]
async fn healthz_fails_when_a_mandatory_component_stays_exited_past_the_grace() {
    use hapwright_eventbus::{Component, ComponentError, Context, Kernel};

    struct Deployer;
    #[async_trait::async_trait]
    impl Component for Deployer {
        fn name(&self) -> &str {
            "deployer"
        }
        async fn run(self: Box<Self>, _ctx: Context) -> Result<(), ComponentError> {
            Err("lost the instance table".into())
        }
    }
    struct EventLogLike;
    #[async_trait::async_trait]
    impl Component for EventLogLike {
        fn name(&self) -> &str {
            "event-log"
        }
        fn mandatory(&self) -> bool {
            false
        }
        async fn run(self: Box<Self>, _ctx: Context) -> Result<(), ComponentError> {
            panic!("ring overflow")
        }
    }

    let h = Harness::start().await;
    let (reload, _rx) = ReloadHandle::channel();
    let scrape = HttpServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        metrics_router(HttpState::new(h.store.clone(), Registry::new(), reload)),
        Limits::default(),
    )
    .await
    .unwrap();
    let grace = Duration::from_secs(1);
    h.store.set_liveness_grace(grace);
    let bus = hapwright_eventbus::Bus::new(
        hapwright_eventbus::BusConfig::default(),
        &hapwright_eventbus::BusMetrics::register(&Registry::new()).unwrap(),
    );
    let mut kernel = Kernel::new(bus);
    kernel.register(Deployer).register(EventLogLike);
    h.store.set_health(kernel.health());
    let mut running = kernel.start().unwrap();
    let exited_at = tokio::time::Instant::now();
    running.failed().await;

    // Within the grace: still live (the optional component's panic never counts).
    let answer = h.get("/healthz").await;
    if exited_at.elapsed() < grace {
        assert_eq!(answer, (200, "ok\n".into()));
    }

    let deadline = exited_at + Duration::from_secs(10);
    let body = loop {
        let (status, body) = h.get("/healthz").await;
        if status == 503 {
            break serde_json::from_str::<serde_json::Value>(&body).unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/healthz still {status} long after the grace"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(exited_at.elapsed() >= grace);
    assert_eq!(body["live"], false);
    let reason = body["reason"].as_str().unwrap();
    assert!(reason.contains("`deployer` has been exited"), "{reason}");
    assert_eq!(body["components"].as_array().unwrap().len(), 1);
    assert_eq!(body["components"][0]["component"], "deployer");
    assert_eq!(body["components"][0]["state"], "exited");
    assert_eq!(
        body["components"][0]["reason"],
        "failed: lost the instance table"
    );
    assert!(body["components"][0]["since"].as_f64().unwrap() > 1.7e9);

    let on_scrape = reqwest::get(format!("http://{}/healthz", scrape.local_addr()))
        .await
        .unwrap();
    assert_eq!(on_scrape.status().as_u16(), 503);

    // Stopping the iteration on purpose (a reload) is not a failure.
    running.shutdown(Duration::from_secs(1)).await;
    assert_eq!(h.get("/healthz").await.0, 200);
    scrape.shutdown().await;
    h.server.shutdown().await;
}

#[tokio::test]
async fn readyz_stays_200_while_a_failing_instance_serves_its_last_good_config() {
    let h = Harness::start().await;
    h.store
        .set_static_instances(["local".to_owned(), "edge-2".to_owned()]);
    let deployed = |id, instance: &str| {
        event(
            id,
            None,
            InstanceDeployed {
                instance: instance.into(),
                hash: rendered().hash(),
                strategy: DeployStrategy::Runtime,
                reason: None,
                duration: Duration::from_millis(2),
            },
        )
    };
    h.store.apply(&deployed(1, "local"), None);
    h.store.apply(&deployed(2, "edge-2"), None);
    assert_eq!(h.json("/readyz").await.0, 200);

    h.store.apply(
        &event(
            3,
            None,
            hapwright_eventbus::InstanceDeploymentFailed {
                instance: "edge-2".into(),
                hash: rendered().hash(),
                error: Diagnostic::error("reload failed: [ALERT] cannot bind socket"),
            },
        ),
        None,
    );
    // edge-2 serves its last good config: the failure shows, readiness stays.
    let (status, body) = h.json("/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ready"], true);
    assert_eq!(body["failing"][0]["instance"], "edge-2");
    assert!(
        body["failing"][0]["error"]
            .as_str()
            .unwrap()
            .contains("cannot bind socket"),
        "{body}"
    );

    h.store.apply(&deployed(4, "edge-2"), None);
    assert_eq!(
        h.json("/readyz").await,
        (200, json!({"ready": true, "failing": []}))
    );
    h.server.shutdown().await;
}

/// Sends one HTTP/1.1 request with exactly this `Host` on a fresh connection and
/// reads the whole answer (the request asks the server to close): status and body.
async fn raw_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    host: &str,
    headers: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer))
        .await
        .expect("no answer within 10s")
        .unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn quarantined_objects_are_listed_counted_and_shown_on_the_status_page() {
    let h = Harness::start().await;
    let (_, body) = h.json("/debug/quarantine").await;
    assert_eq!(body, json!({"count": 0, "objects": []}));

    let registry = Registry::new();
    let metrics = crate::status::StatusMetrics::register(&registry).unwrap();
    let object = hapwright_eventbus::QuarantinedObject {
        resource: Arc::from("services"),
        kind: Some("Service".to_owned()),
        namespace: "default".to_owned(),
        name: "web".to_owned(),
        change: "modified",
        errors: vec![
            Diagnostic::error("could not resolve address '300.1.2.3'").at(
                hapwright_eventbus::model::SourceLocation::new("backend", Some(9), None),
            ),
        ],
        since: std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
    };
    let searched = |objects: Vec<hapwright_eventbus::QuarantinedObject>| {
        hapwright_eventbus::QuarantineSearched {
            objects,
            released: Vec::new(),
            accepted: 50,
            probes: 7,
            gave_up: None,
        }
    };
    h.store
        .apply(&event(1, None, searched(vec![object])), Some(&metrics));
    let (_, body) = h.json("/debug/quarantine").await;
    assert_eq!(body["count"], 1);
    let listed = &body["objects"][0];
    assert_eq!(
        (
            &listed["resource"],
            &listed["kind"],
            &listed["namespace"],
            &listed["name"]
        ),
        (
            &json!("services"),
            &json!("Service"),
            &json!("default"),
            &json!("web")
        )
    );
    assert_eq!(listed["errors"][0]["location"]["file"], "backend");
    assert_eq!(listed["errors"][0]["location"]["line"], 9);
    assert_eq!(listed["since"], 1_700_000_000.0);
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(
        text.contains(r#"hapwright_quarantined_objects{resource="services"} 1"#),
        "{text}"
    );
    let (_, page) = h.get("/").await;
    assert!(page.contains(r#"<table id="quarantine">"#), "{page}");
    assert!(page.contains("Service default&#x2f;web"), "{page}");
    assert!(page.contains("could not resolve address"), "{page}");

    // Released: the list, the gauge and the page section empty again.
    h.store
        .apply(&event(2, None, searched(Vec::new())), Some(&metrics));
    let (_, body) = h.json("/debug/quarantine").await;
    assert_eq!(body["count"], 0);
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(!text.contains(r#"hapwright_quarantined_objects{resource="services"} 1"#));
    let (_, page) = h.get("/").await;
    assert!(!page.contains(r#"<table id="quarantine">"#));
    h.server.shutdown().await;
}

#[tokio::test]
async fn rendered_statuses_and_their_errors_are_on_debug_status() {
    let h = Harness::start().await;
    let (_, body) = h.json("/debug/status").await;
    assert_eq!(body, json!({"hash": null, "statuses": [], "errors": []}));

    let rendered = hapwright_eventbus::StatusRendered {
        hash: hapwright_eventbus::model::ContentHash::of(b"deployed"),
        statuses: Arc::from(vec![hapwright_eventbus::RenderedStatus {
            resource: Arc::from("ingresses"),
            api_version: "networking.k8s.io/v1".to_owned(),
            kind: "Ingress".to_owned(),
            namespace: "shop".to_owned(),
            name: "web".to_owned(),
            status: json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}}),
            current: false,
        }]),
        errors: vec![Diagnostic::error("shop/bad: no address").at(
            hapwright_eventbus::model::SourceLocation::new(
                "statusTemplates.ingresses",
                Some(3),
                None,
            ),
        )],
    };
    h.store.apply(&event(1, None, rendered), None);
    let (_, body) = h.json("/debug/status").await;
    let status = &body["statuses"][0];
    assert_eq!(
        (
            &status["kind"],
            &status["namespace"],
            &status["name"],
            &status["current"]
        ),
        (
            &json!("Ingress"),
            &json!("shop"),
            &json!("web"),
            &json!(false)
        )
    );
    assert_eq!(
        status["status"]["loadBalancer"]["ingress"][0]["ip"],
        "192.0.2.7"
    );
    assert_eq!(
        body["errors"][0]["location"]["file"],
        "statusTemplates.ingresses"
    );
    assert_eq!(body["errors"][0]["location"]["line"], 3);
    assert!(body["hash"].is_string(), "{body}");
}

#[test]
fn certificate_digests_are_reused_by_content_only() {
    let shared: Arc<str> = Arc::from("-----BEGIN CERTIFICATE-----\nAAAA\n");
    let first = RenderedConfig::builder("global\n")
        .certificate("a.pem", shared.clone())
        .certificate("b.pem", "PEM of b\n")
        .build();
    let shown = ShownDigests::default();
    let digests = shown.of(&first);
    assert_eq!(digests["a.pem"], ContentHash::of(shared.as_bytes()));
    assert_eq!(digests["b.pem"], ContentHash::of(b"PEM of b\n"));
    // A kept digest is used for the same content by pointer: planted here, it shows.
    let planted = ContentHash::of(b"planted");
    shown
        .0
        .lock()
        .unwrap()
        .insert("a.pem".to_owned(), (shared.clone(), planted));
    let second = RenderedConfig::builder("global\n")
        .certificate("a.pem", shared.clone())
        .certificate("c.pem", "PEM of c\n")
        .build();
    let digests = shown.of(&second);
    assert_eq!(digests["a.pem"], planted);
    assert_eq!(digests["c.pem"], ContentHash::of(b"PEM of c\n"));
    assert!(!shown.0.lock().unwrap().contains_key("b.pem"), "b is gone");
    // Equal text in another allocation is hashed, never taken from the name alone.
    let copy = RenderedConfig::builder("global\n")
        .certificate("a.pem", String::from(&*shared))
        .build();
    assert_eq!(shown.of(&copy)["a.pem"], ContentHash::of(shared.as_bytes()));
}
