//! The admission webhook over real HTTPS: a test CA and server certificates made
//! with `openssl` in a temp directory, AdmissionReview JSON posted with reqwest,
//! phase 2 run by the real `haproxy`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[path = "../../../tests/support/certs.rs"]
mod certs;
#[macro_use]
mod support;

use certs::{ca, leaf};
use hapwright_app::build;
use hapwright_app::config::{self, Config, FailurePolicy};
use hapwright_app::http::{HttpServer, Limits};
use hapwright_app::webhook::{self, Current, Engine, Settings, Slot, Target};
use hapwright_eventbus::model::{ObjectKey, ResourceChange, ResourceSnapshot};
use hapwright_reconciler::quarantine::Validate;
use serde_json::{Value, json};

const CONFIG: &str = concat!(
    watched_services!(),
    haproxy_config_start!(),
    r#"    frontend http
        bind 127.0.0.1:18080
        default_backend be_none
    backend be_none
    {%- for svc in resources.services.list() %}

    {% include "backend" %}
    {%- endfor %}
templateSnippets:
  backend:
    template: |
      backend be_{{ svc.metadata.namespace }}_{{ svc.metadata.name }}
          balance {{ (svc.metadata.annotations | default({}))["example.com/balance"] | default("roundrobin") }}
          server s1 127.0.0.1:{{ svc.spec.ports[0].port }}
controller:
  webhook:
    certFile: tls.crt
    keyFile: tls.key
    resources: [services]
"#
);

// === the webhook under test ===

struct Webhook {
    server: Option<HttpServer>,
    client: reqwest::Client,
    url: String,
    addr: std::net::SocketAddr,
    current: Current,
    dir: tempfile::TempDir,
}

impl Webhook {
    fn config(dir: &Path) -> Config {
        let text = CONFIG;
        config::parse(text, &dir.join("hapwright.yaml"), "hapwright.yaml")
            .map(|(config, _)| config)
            .expect("the test config parses")
    }

    /// A webhook over the test config with `validate` (the real phases when
    /// `None`), serving a certificate of a test CA; the services resource holds one
    /// Service `default/web` and has finished its first listing when `synced`.
    async fn start(
        policy: FailurePolicy,
        timeout: Duration,
        validate: Option<Validate>,
        synced: bool,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca_pem = ca(dir.path(), "ca");
        leaf(dir.path(), "ca", "tls");
        let mut config = Self::config(dir.path());
        let settings = config.controller.webhook.clone().expect("webhook section");
        config.controller.webhook = None;
        let current = Current::new();
        let services: Arc<str> = Arc::from("services");
        let resource = &config.watched_resources.resources["services"];
        let mut snapshot = ResourceSnapshot::new(resource.index_by.clone());
        let key = ObjectKey::new("default", "web");
        snapshot.upsert(key.clone(), &service("web", None));
        current.update(
            &services,
            Arc::new(snapshot),
            Some(&ResourceChange {
                added: vec![key],
                ..ResourceChange::default()
            }),
        );
        if synced {
            current.synced(&services);
        }
        let engine = Engine::new(
            build::renderer(&config).expect("templates compile"),
            validate.unwrap_or_else(|| build::webhook_validate(build::validator_config(&config))),
            vec![Target::new("services", resource).unwrap()],
            Settings {
                timeout,
                failure_policy: policy,
            },
            current.clone(),
            None,
        );
        let slot = Slot::default();
        slot.store(Some(Arc::new(engine)));
        let mut listen = webhook::Listen::new(&settings, Limits::default());
        listen.addr = "127.0.0.1:0".parse().unwrap();
        listen.max_body = 64 * 1024;
        let server = listen
            .bind(slot)
            .await
            .expect("the webhook listener starts");
        let server_addr = server.local_addr();
        let url = format!("https://localhost:{}/validate", server_addr.port());
        let client = reqwest::Client::builder()
            .no_proxy()
            .resolve("localhost", server.local_addr())
            .tls_certs_only([reqwest::Certificate::from_pem(&ca_pem).unwrap()])
            .tls_info(true)
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        Self {
            server: Some(server),
            client,
            url,
            addr: server_addr,
            current,
            dir,
        }
    }

    async fn post(&self, body: &Value) -> (u16, Value) {
        self.post_raw(serde_json::to_vec(body).unwrap()).await
    }

    async fn post_raw(&self, body: Vec<u8>) -> (u16, Value) {
        let response = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("the webhook answers over HTTPS");
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// The DER of the certificate the listener presents on a new connection (a new
    /// client: a resumed TLS session would not show the server's certificate again).
    async fn served_certificate(&self) -> Vec<u8> {
        let ca_pem = std::fs::read(self.path("ca.crt")).unwrap();
        let client = reqwest::Client::builder()
            .no_proxy()
            .resolve("localhost", self.addr)
            .tls_certs_only([reqwest::Certificate::from_pem(&ca_pem).unwrap()])
            .tls_info(true)
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        let response = client
            .post(&self.url)
            .body("{}")
            .send()
            .await
            .expect("HTTPS request");
        response
            .extensions()
            .get::<reqwest::tls::TlsInfo>()
            .and_then(|info| info.peer_certificate())
            .expect("TLS info")
            .to_vec()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }
}

fn service(name: &str, balance: Option<&str>) -> Value {
    let mut object = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name, "namespace": "default" },
        "spec": { "ports": [{ "port": 9101 }] },
    });
    if let Some(balance) = balance {
        object["metadata"]["annotations"] = json!({ "example.com/balance": balance });
    }
    object
}

fn review(operation: &str, kind: &str, object: Option<Value>, old: Option<Value>) -> Value {
    let name = object
        .as_ref()
        .or(old.as_ref())
        .and_then(|o| o["metadata"]["name"].as_str())
        .unwrap_or("")
        .to_owned();
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{operation}-{name}"),
            "kind": { "group": "", "version": "v1", "kind": kind },
            "resource": { "group": "", "version": "v1", "resource": format!("{}s", kind.to_lowercase()) },
            "name": name,
            "namespace": "default",
            "operation": operation,
            "userInfo": { "username": "test" },
            "object": object,
            "oldObject": old,
            "dryRun": false,
        }
    })
}

fn response(body: &Value) -> &Value {
    &body["response"]
}

// === tests ===

#[tokio::test]
async fn a_valid_object_is_allowed_and_a_breaking_one_denied_with_the_template_line() {
    let webhook = Webhook::start(FailurePolicy::Fail, Duration::from_secs(20), None, true).await;

    let (status, body) = webhook
        .post(&review(
            "CREATE",
            "Service",
            Some(service("api", None)),
            None,
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["kind"], "AdmissionReview");
    assert_eq!(response(&body)["uid"], "uid-CREATE-api");
    assert_eq!(response(&body)["allowed"], true, "{body}");

    // `balance` with an algorithm HAProxy does not know: only phase 2 finds it.
    let bad = review(
        "CREATE",
        "Service",
        Some(service("api", Some("fastest"))),
        None,
    );
    let (status, body) = webhook.post(&bad).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(response(&body)["allowed"], false, "{body}");
    let message = response(&body)["status"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("Service default/api"), "{message}");
    assert!(
        message.contains("from backend:2"),
        "the snippet line: {message}"
    );
    assert!(
        message.contains("haproxy.cfg:14: balance only supports 'roundrobin'"),
        "HAProxy's message at the rendered line: {message}"
    );

    // A dry run is answered the same way.
    let mut dry = bad.clone();
    dry["request"]["dryRun"] = json!(true);
    let (_, body) = webhook.post(&dry).await;
    assert_eq!(response(&body)["allowed"], false, "{body}");
    assert_eq!(response(&body)["status"]["message"], message.as_str());

    // Updating the existing Service to the bad value is refused; deleting it is fine.
    let update = review(
        "UPDATE",
        "Service",
        Some(service("web", Some("fastest"))),
        Some(service("web", None)),
    );
    let (_, body) = webhook.post(&update).await;
    assert_eq!(response(&body)["allowed"], false, "{body}");
    let delete = review("DELETE", "Service", None, Some(service("web", None)));
    let (_, body) = webhook.post(&delete).await;
    assert_eq!(response(&body)["allowed"], true, "{body}");
    webhook.stop().await;
}

#[tokio::test]
async fn a_malformed_review_is_a_400_naming_the_field() {
    let webhook = Webhook::start(FailurePolicy::Fail, Duration::from_secs(20), None, true).await;
    let mut bad = review("CREATE", "Service", Some(service("api", None)), None);
    bad["request"]["operation"] = json!("UPSERT");
    let (status, body) = webhook.post(&bad).await;
    assert_eq!(status, 400, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("request.operation"), "{error}");
    assert!(error.contains("UPSERT"), "{error}");

    let (status, body) = webhook.post_raw(b"{not json".to_vec()).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("invalid AdmissionReview"),
        "{body}"
    );

    // A whole review followed by anything but blanks (found by fuzzing).
    let mut trailing = serde_json::to_vec(&review(
        "CREATE",
        "Service",
        Some(service("api", None)),
        None,
    ))
    .unwrap();
    trailing.extend_from_slice(b"\xa3\x82}]");
    let (status, body) = webhook.post_raw(trailing).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("trailing characters"),
        "{body}"
    );

    let (status, body) = webhook
        .post(
            &json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
                      "request": review("CREATE", "Service", None, None)["request"]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("admission.k8s.io/v1"),
        "{body}"
    );
    webhook.stop().await;
}

#[tokio::test]
async fn an_object_of_an_unvalidated_kind_is_allowed_with_a_warning() {
    let webhook = Webhook::start(FailurePolicy::Fail, Duration::from_secs(20), None, true).await;
    let config_map = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "settings", "namespace": "default" },
    });
    let (status, body) = webhook
        .post(&review("CREATE", "ConfigMap", Some(config_map), None))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(response(&body)["allowed"], true, "{body}");
    let warnings = response(&body)["warnings"].to_string();
    assert!(warnings.contains("v1/ConfigMap"), "{warnings}");
    webhook.stop().await;
}

#[tokio::test]
async fn an_oversized_review_is_refused_with_413() {
    let webhook = Webhook::start(FailurePolicy::Fail, Duration::from_secs(20), None, true).await;
    let mut big = service("big", None);
    big["metadata"]["annotations"] = json!({ "filler": "x".repeat(128 * 1024) });
    let (status, _) = webhook
        .post(&review("CREATE", "Service", Some(big), None))
        .await;
    assert_eq!(status, 413);
    webhook.stop().await;
}

/// A validation step that never finishes: the budget decides.
fn never() -> Validate {
    Arc::new(|_| Box::pin(std::future::pending()))
}

#[tokio::test]
async fn a_decision_over_budget_follows_the_failure_policy() {
    let object = review("CREATE", "Service", Some(service("api", None)), None);

    let fail = Webhook::start(
        FailurePolicy::Fail,
        Duration::from_millis(200),
        Some(never()),
        true,
    )
    .await;
    let (status, body) = fail.post(&object).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(response(&body)["allowed"], false, "{body}");
    let message = response(&body)["status"]["message"].as_str().unwrap();
    assert!(message.contains("controller.webhook.timeout"), "{message}");
    assert!(message.contains("failurePolicy Fail"), "{message}");
    fail.stop().await;

    let ignore = Webhook::start(
        FailurePolicy::Ignore,
        Duration::from_millis(200),
        Some(never()),
        true,
    )
    .await;
    let (_, body) = ignore.post(&object).await;
    assert_eq!(response(&body)["allowed"], true, "{body}");
    let warnings = response(&body)["warnings"].to_string();
    assert!(warnings.contains("failurePolicy Ignore"), "{warnings}");
    ignore.stop().await;
}

#[tokio::test]
async fn objects_are_not_judged_before_the_resource_is_loaded() {
    let webhook = Webhook::start(FailurePolicy::Fail, Duration::from_secs(20), None, false).await;
    let (_, body) = webhook
        .post(&review(
            "CREATE",
            "Service",
            Some(service("api", None)),
            None,
        ))
        .await;
    assert_eq!(response(&body)["allowed"], false, "{body}");
    let message = response(&body)["status"]["message"].as_str().unwrap();
    assert!(message.contains("not loaded yet"), "{message}");
    // Once the source has listed, the same object is judged on its merits.
    webhook.current.synced(&Arc::from("services"));
    let (_, body) = webhook
        .post(&review(
            "CREATE",
            "Service",
            Some(service("api", None)),
            None,
        ))
        .await;
    assert_eq!(response(&body)["allowed"], true, "{body}");
    webhook.stop().await;
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let webhook = Webhook::start(FailurePolicy::Fail, Duration::from_secs(20), None, true).await;
    let first = std::fs::read(webhook.path("tls.der")).unwrap();
    assert_eq!(webhook.served_certificate().await, first);

    // A new certificate from the same CA, moved into place as a Secret volume
    // update does.
    let second = leaf(webhook.dir.path(), "ca", "next");
    assert_ne!(first, second);
    std::fs::rename(webhook.path("next.key"), webhook.path("tls.key")).unwrap();
    std::fs::rename(webhook.path("next.crt"), webhook.path("tls.crt")).unwrap();
    assert_eq!(webhook.served_certificate().await, second);

    // A broken file keeps the last good certificate in service.
    std::fs::write(webhook.path("tls.crt"), "not a certificate").unwrap();
    assert_eq!(webhook.served_certificate().await, second);
    webhook.stop().await;
}
