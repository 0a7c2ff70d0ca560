//! Statuses written back to Kubernetes objects, at the protocol level: a scripted
//! API server (`tower-test`) behind a real `kube::Client` sees exactly the
//! server-side apply patches the leader sends to the status subresource.

mod kubernetes_mock;

use std::time::Duration;

use hapwright_eventbus::model::ContentHash;
use hapwright_eventbus::{HealthState, RenderedStatus, StatusRendered};
use hapwright_watchers::kubernetes::status::FIELD_MANAGER;
use hapwright_watchers::kubernetes::{RateLimit, StatusMetrics, StatusWriter};
use kubernetes_mock::{Exchange, Writing, resource_list};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::timeout;

const DISCOVERY: &str = "/apis/networking.k8s.io/v1";

fn status_path(name: &str) -> String {
    format!("/apis/networking.k8s.io/v1/namespaces/shop/ingresses/{name}/status")
}

struct Harness {
    writing: Writing,
    metrics: StatusMetrics,
    discovered: bool,
}

fn start(leader: Option<watch::Receiver<bool>>, rate: RateLimit) -> Harness {
    let metrics = StatusMetrics::unregistered().unwrap();
    let written = metrics.clone();
    let writing = Writing::start(|client, kernel| {
        let mut component =
            StatusWriter::new(client, kubernetes_mock::ingresses(), written).with_rate_limit(rate);
        if let Some(leader) = leader {
            component = component.with_leadership(leader);
        }
        kernel.register(component);
    });
    Harness {
        writing,
        metrics,
        discovered: false,
    }
}

fn status(resource: &str, name: &str, ip: &str, current: bool) -> RenderedStatus {
    RenderedStatus {
        resource: resource.into(),
        api_version: "networking.k8s.io/v1".into(),
        kind: "Ingress".into(),
        namespace: "shop".into(),
        name: name.into(),
        status: json!({"loadBalancer": {"ingress": [{"ip": ip}]}}),
        current,
    }
}

impl Harness {
    fn rendered(&self, statuses: Vec<RenderedStatus>) {
        self.writing.publisher.publish(StatusRendered {
            hash: ContentHash::of(b"render"),
            statuses: statuses.into(),
            errors: Vec::new(),
        });
    }

    /// The next request; the first one resolves the kind through discovery.
    async fn request(&mut self) -> Exchange {
        if !self.discovered {
            let exchange = self.writing.api.expect_get(DISCOVERY).await;
            exchange.respond(
                200,
                &resource_list("networking.k8s.io/v1", "ingresses", "Ingress", true),
            );
            self.discovered = true;
        }
        self.writing.api.next().await
    }

    /// The next status patch, answered with 200; returns its path and body.
    async fn patched(&mut self) -> (String, Value) {
        let exchange = self.request().await;
        check_patch(&exchange);
        let body = exchange.json();
        let path = exchange.path.clone();
        exchange.respond(200, &body);
        (path, body)
    }

    async fn health(&mut self, state: HealthState) -> String {
        self.writing.health(StatusWriter::NAME, state).await
    }

    /// Lets every task run until idle (time is paused: returns once nothing is left
    /// to do before a timer), then checks the API server saw no request.
    async fn assert_no_request(&mut self) {
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            timeout(Duration::from_millis(1), self.writing.api.next())
                .await
                .is_err(),
            "no request expected"
        );
    }

    async fn stop(self) {
        self.writing.stop().await;
    }
}

/// A server-side apply of the status subresource by hapwright, forced.
fn check_patch(exchange: &Exchange) {
    assert_eq!(exchange.method, http::Method::PATCH, "{exchange:?}");
    assert_eq!(
        exchange.content_type.as_deref(),
        Some("application/apply-patch+yaml"),
        "{exchange:?}"
    );
    assert_eq!(exchange.param("fieldManager"), Some(FIELD_MANAGER));
    assert_eq!(exchange.param("force"), Some("true"));
}

#[tokio::test(start_paused = true)]
async fn the_leader_applies_changed_statuses_to_the_status_subresource_once() {
    let mut h = start(None, RateLimit::default());
    h.rendered(vec![
        status("ingresses", "web", "192.0.2.7", false),
        // The object already shows it: nothing to write.
        status("ingresses", "api", "192.0.2.7", true),
        // Objects of a `files` resource are never written.
        status("services", "web", "192.0.2.7", false),
    ]);
    let (path, body) = h.patched().await;
    assert_eq!(path, status_path("web"));
    assert_eq!(
        body,
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "web", "namespace": "shop"},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}},
        })
    );
    h.assert_no_request().await;
    // The same statuses again: nothing is written.
    h.rendered(vec![
        status("ingresses", "web", "192.0.2.7", false),
        status("ingresses", "api", "192.0.2.7", true),
    ]);
    h.assert_no_request().await;
    // A changed status is written again.
    h.rendered(vec![status("ingresses", "web", "192.0.2.8", false)]);
    let (path, body) = h.patched().await;
    assert_eq!(path, status_path("web"));
    assert_eq!(
        body["status"]["loadBalancer"]["ingress"][0]["ip"],
        "192.0.2.8"
    );
    h.assert_no_request().await;
    assert_eq!(h.metrics.writes("ingresses", "success"), 2);
    assert_eq!(h.metrics.writes("ingresses", "failure"), 0);
    assert_eq!(h.metrics.pending(), 0);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_follower_writes_nothing_until_it_leads() {
    let (leader, follower) = watch::channel(false);
    let mut h = start(Some(follower), RateLimit::default());
    h.rendered(vec![status("ingresses", "web", "192.0.2.7", false)]);
    h.assert_no_request().await;
    assert_eq!(h.metrics.pending(), 0, "a follower reports nothing pending");
    leader.send_replace(true);
    let (path, _) = h.patched().await;
    assert_eq!(path, status_path("web"));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_refused_patch_degrades_the_component_counts_and_is_retried_with_backoff() {
    let mut h = start(None, RateLimit::default());
    h.health(HealthState::Healthy).await;
    h.rendered(vec![status("ingresses", "web", "192.0.2.7", false)]);
    let exchange = h.request().await;
    check_patch(&exchange);
    exchange.respond_status(
        409,
        "Conflict",
        "Apply failed with 1 conflict: conflict with \"other\" using networking.k8s.io/v1: .status.loadBalancer",
    );
    let reason = h.health(HealthState::Degraded).await;
    assert!(
        reason.starts_with("cannot write the status of Ingress shop/web: 409 Conflict"),
        "{reason}"
    );
    assert_eq!(h.metrics.writes("ingresses", "failure"), 1);
    assert_eq!(h.metrics.pending(), 1);
    let failed_at = tokio::time::Instant::now();
    // Retried by itself after the backoff, without a new render.
    let exchange = h.request().await;
    check_patch(&exchange);
    assert!(tokio::time::Instant::now() - failed_at >= Duration::from_secs(1));
    exchange.respond_status(500, "InternalError", "etcdserver: request timed out");
    let reason = h.health(HealthState::Degraded).await;
    assert!(reason.contains("500 InternalError"), "{reason}");
    let (path, _) = h.patched().await;
    assert_eq!(path, status_path("web"));
    h.health(HealthState::Healthy).await;
    h.assert_no_request().await;
    assert_eq!(h.metrics.writes("ingresses", "failure"), 2);
    assert_eq!(h.metrics.writes("ingresses", "success"), 1);
    assert_eq!(h.metrics.pending(), 0);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn writes_are_rate_limited() {
    let mut h = start(None, RateLimit { qps: 1.0, burst: 2 });
    let names = ["a", "b", "c", "d"];
    h.rendered(
        names
            .iter()
            .map(|n| status("ingresses", n, "192.0.2.7", false))
            .collect(),
    );
    let started = tokio::time::Instant::now();
    let mut seen = Vec::new();
    for _ in names {
        let (path, _) = h.patched().await;
        seen.push((path, tokio::time::Instant::now() - started));
    }
    // Two at once (the burst), then one per second.
    assert!(seen[1].1 < Duration::from_millis(100), "{seen:?}");
    assert!(seen[2].1 >= Duration::from_millis(900), "{seen:?}");
    assert!(seen[3].1 >= Duration::from_millis(1900), "{seen:?}");
    let mut paths: Vec<String> = seen.into_iter().map(|(p, _)| p).collect();
    paths.sort();
    let expected: Vec<String> = names.iter().map(|n| status_path(n)).collect();
    assert_eq!(paths, expected);
    h.stop().await;
}
