//! HAProxy pod discovery at the protocol level: a real `kube::Client` and watcher
//! against a scripted API server (`tower-test`), a real kernel and bus. Absence of a
//! publication is proven by ordering: the next publication is the one expected.

mod common;

use common::Harness;
mod kubernetes_mock;

use std::time::Duration;

use hapwright_eventbus::model::{InstanceDriver, InstanceRef};
use hapwright_eventbus::{EventKind, EventPayload, HealthState};
use hapwright_watchers::kubernetes::discovery::{SOURCE, instance_of};
use hapwright_watchers::kubernetes::{ClientFactory, DiscoveryConfig, PodDiscovery};
use k8s_openapi::api::core::v1::Pod;
use kubernetes_mock::{event, list, pair};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(600);
const PODS: &str = "/api/v1/namespaces/ingress/pods";

impl Harness {
    fn start(client: kube::Client) -> Self {
        let discovery = PodDiscovery::new(
            DiscoveryConfig {
                namespace: "ingress".to_owned(),
                label_selector: "app=haproxy".to_owned(),
                port: 5555,
                scheme: "http".to_owned(),
            },
            ClientFactory::with_client(client),
        );
        Self::alone(
            discovery,
            [
                EventKind::InstancesDiscovered,
                EventKind::ComponentHealthChanged,
            ],
            WAIT,
        )
    }

    async fn discovered(&mut self) -> Vec<InstanceRef> {
        loop {
            if let EventPayload::InstancesDiscovered(discovered) = self.next().await {
                assert_eq!(&*discovered.source, SOURCE);
                return discovered.instances.to_vec();
            }
        }
    }

    async fn health(&mut self, state: HealthState) -> Option<String> {
        loop {
            match self.next().await {
                EventPayload::ComponentHealthChanged(changed)
                    if &*changed.component == PodDiscovery::NAME
                        && changed.health.state == state =>
                {
                    return changed.health.reason;
                }
                EventPayload::ComponentHealthChanged(_) => {}
                other => panic!("unexpected event while waiting for {state:?}: {other:?}"),
            }
        }
    }
}

fn pod(name: &str, ip: Option<&str>, ready: bool, resource_version: &str) -> Value {
    let mut status = json!({
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": if ready { "True" } else { "False" }},
        ],
    });
    if let Some(ip) = ip {
        status["podIP"] = json!(ip);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "ingress", "resourceVersion": resource_version,
            "labels": {"app": "haproxy"},
        },
        "spec": {"containers": [{"name": "haproxy", "image": "haproxy:2.6"}]},
        "status": status,
    })
}

fn target(name: &str, address: &str) -> InstanceRef {
    InstanceRef {
        name: name.to_owned(),
        driver: InstanceDriver::Dataplane,
        address: address.to_owned(),
    }
}

#[test]
fn only_ready_pods_with_an_ip_that_are_not_terminating_are_targets() {
    let parse = |value: Value| -> Pod { serde_json::from_value(value).unwrap() };
    assert_eq!(
        instance_of(&parse(pod("a", Some("10.0.0.1"), true, "1")), "http", 5555),
        Some(target("a", "http://10.0.0.1:5555"))
    );
    assert_eq!(
        instance_of(&parse(pod("v6", Some("fd00::1"), true, "1")), "http", 5555),
        Some(target("v6", "http://[fd00::1]:5555"))
    );
    assert_eq!(
        instance_of(
            &parse(pod("tls", Some("10.0.0.9"), true, "1")),
            "https",
            5556
        ),
        Some(target("tls", "https://10.0.0.9:5556"))
    );
    assert_eq!(
        instance_of(&parse(pod("b", Some("10.0.0.2"), false, "1")), "http", 5555),
        None
    );
    assert_eq!(
        instance_of(&parse(pod("c", None, true, "1")), "http", 5555),
        None
    );
    let mut terminating = pod("d", Some("10.0.0.4"), true, "1");
    terminating["metadata"]["deletionTimestamp"] = json!("2026-11-22T05:00:00Z");
    assert_eq!(instance_of(&parse(terminating), "http", 5555), None);
    let mut no_status = pod("e", Some("10.0.0.5"), true, "1");
    no_status.as_object_mut().unwrap().remove("status");
    assert_eq!(instance_of(&parse(no_status), "http", 5555), None);
}

#[tokio::test(start_paused = true)]
async fn ready_pods_become_dataplane_targets_and_changes_republish_the_set() {
    let (client, mut api) = pair();
    let mut harness = Harness::start(client);
    let listing = api.expect_list(PODS).await;
    assert_eq!(listing.param("labelSelector"), Some("app=haproxy"));
    listing.respond(
        200,
        &list(
            "Pod",
            "100",
            &[
                pod("haproxy-0", Some("10.0.0.1"), true, "90"),
                pod("haproxy-1", Some("10.0.0.2"), false, "91"),
                pod("haproxy-2", None, true, "92"),
                pod("haproxy-3", Some("fd00::3"), true, "93"),
            ],
        ),
    );
    assert_eq!(
        harness.discovered().await,
        vec![
            target("haproxy-0", "http://10.0.0.1:5555"),
            target("haproxy-3", "http://[fd00::3]:5555"),
        ]
    );

    // haproxy-1 becomes ready.
    let watch = api.expect_watch(PODS).await;
    assert_eq!(watch.param("resourceVersion"), Some("100"));
    assert_eq!(watch.param("labelSelector"), Some("app=haproxy"));
    watch.respond_events(&[event(
        "MODIFIED",
        &pod("haproxy-1", Some("10.0.0.2"), true, "101"),
    )]);
    assert_eq!(
        harness.discovered().await,
        vec![
            target("haproxy-0", "http://10.0.0.1:5555"),
            target("haproxy-1", "http://10.0.0.2:5555"),
            target("haproxy-3", "http://[fd00::3]:5555"),
        ]
    );

    // A status update that changes no target publishes nothing: the next publication
    // is the one after haproxy-3 goes away.
    api.expect_watch(PODS).await.respond_events(&[event(
        "MODIFIED",
        &pod("haproxy-0", Some("10.0.0.1"), true, "102"),
    )]);
    api.expect_watch(PODS).await.respond_events(&[
        event("DELETED", &pod("haproxy-3", Some("fd00::3"), true, "103")),
        event("ADDED", &pod("haproxy-4", None, false, "104")),
    ]);
    assert_eq!(
        harness.discovered().await,
        vec![
            target("haproxy-0", "http://10.0.0.1:5555"),
            target("haproxy-1", "http://10.0.0.2:5555"),
        ]
    );
    let watch = api.expect_watch(PODS).await;
    assert_eq!(watch.param("resourceVersion"), Some("104"));
    api.hold(watch);
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_denied_pod_list_is_unhealthy_and_an_empty_namespace_publishes_no_targets() {
    let (client, mut api) = pair();
    let mut harness = Harness::start(client);
    api.expect_list(PODS).await.respond_status(
        403,
        "Forbidden",
        "pods is forbidden: User \"system:serviceaccount:ingress:hapwright\" cannot list resource \"pods\"",
    );
    let reason = harness.health(HealthState::Unhealthy).await.unwrap();
    assert!(reason.contains("403 Forbidden"), "{reason}");
    assert!(reason.contains("cannot list resource"), "{reason}");
    api.expect_list(PODS)
        .await
        .respond(200, &list("Pod", "5", &[]));
    assert_eq!(harness.health(HealthState::Healthy).await, None);
    assert_eq!(harness.discovered().await, vec![]);
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_410_relist_replaces_the_pod_set() {
    let (client, mut api) = pair();
    let mut harness = Harness::start(client);
    api.expect_list(PODS).await.respond(
        200,
        &list(
            "Pod",
            "100",
            &[
                pod("haproxy-0", Some("10.0.0.1"), true, "90"),
                pod("haproxy-1", Some("10.0.0.2"), true, "91"),
            ],
        ),
    );
    assert_eq!(harness.discovered().await.len(), 2);
    api.expect_watch(PODS)
        .await
        .respond_events(&[kubernetes_mock::error_event(410, "Expired", "too old")]);
    // haproxy-0 went away while the watch was down; haproxy-2 came up.
    api.expect_list(PODS).await.respond(
        200,
        &list(
            "Pod",
            "200",
            &[
                pod("haproxy-1", Some("10.0.0.2"), true, "91"),
                pod("haproxy-2", Some("10.0.0.3"), true, "150"),
            ],
        ),
    );
    assert_eq!(
        harness.discovered().await,
        vec![
            target("haproxy-1", "http://10.0.0.2:5555"),
            target("haproxy-2", "http://10.0.0.3:5555"),
        ]
    );
    let watch = api.expect_watch(PODS).await;
    assert_eq!(watch.param("resourceVersion"), Some("200"));
    api.hold(watch);
    harness.stop().await;
}
