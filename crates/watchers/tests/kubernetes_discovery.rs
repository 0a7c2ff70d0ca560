//! HAProxy pod discovery at the protocol level: a real `kube::Client` and watcher
//! against a scripted API server (`tower-test`), a real kernel and bus. Absence of a
//! publication is proven by ordering: the next publication is the one expected.
//! Pods matching the labels but not the service account or owner are skipped. A pod
//! is a target once its Data Plane API container is ready, before the pod is.

mod common;

use common::Harness;
mod kubernetes_mock;

use std::time::Duration;

use hapwright_eventbus::model::{InstanceDriver, InstanceRef};
use hapwright_eventbus::{EventKind, EventPayload, HealthState};
use hapwright_watchers::kubernetes::discovery::{
    DEFAULT_DATAPLANE_CONTAINER, SOURCE, dataplane_ready, instance_of,
};
use hapwright_watchers::kubernetes::{
    ClientFactory, DiscoveryConfig, DiscoveryMetrics, PodDiscovery, Restriction,
};
use k8s_openapi::api::core::v1::Pod;
use kubernetes_mock::{event, list, pair};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(600);
const PODS: &str = "/api/v1/namespaces/ingress/pods";

/// Answers the next list of pods with `pods`, at resource version `version`.
async fn list_pods(api: &mut kubernetes_mock::ApiServer, version: &str, pods: &[Value]) {
    api.expect_list(PODS)
        .await
        .respond(200, &list("Pod", version, pods));
}

impl Harness {
    fn start(client: kube::Client) -> Self {
        Self::restricted(client, Restriction::default(), None)
    }

    fn restricted(
        client: kube::Client,
        restriction: Restriction,
        metrics: Option<DiscoveryMetrics>,
    ) -> Self {
        let mut discovery = PodDiscovery::new(
            DiscoveryConfig {
                namespace: "ingress".to_owned(),
                label_selector: "app=haproxy".to_owned(),
                port: 5555,
                scheme: "http".to_owned(),
                dataplane_container: DEFAULT_DATAPLANE_CONTAINER.to_owned(),
                restriction,
            },
            ClientFactory::with_client(client),
        );
        if let Some(metrics) = metrics {
            discovery = discovery.with_metrics(metrics);
        }
        Self::alone(
            discovery,
            [
                EventKind::InstancesDiscovered,
                EventKind::ComponentHealthChanged,
            ],
            WAIT,
        )
    }

    /// The next health note of a Healthy discovery (earlier changes skipped).
    async fn healthy_note(&mut self) -> String {
        loop {
            if let Some(note) = self.health(HealthState::Healthy).await {
                return note;
            }
        }
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

/// A pod as deploy/controller/haproxy.yaml runs it: containers `haproxy` and
/// `dataplaneapi`, each ready or not. The pod's `Ready` condition is what the kubelet
/// makes of them: both ready.
fn controller_pod(
    name: &str,
    ip: &str,
    dataplane_ready: bool,
    haproxy_ready: bool,
    resource_version: &str,
) -> Value {
    let mut pod = pod(
        name,
        Some(ip),
        dataplane_ready && haproxy_ready,
        resource_version,
    );
    pod["spec"]["containers"] = json!([
        {"name": "haproxy", "image": "haproxytech/haproxy-debian:3.0"},
        {"name": "dataplaneapi", "image": "haproxytech/haproxy-debian:3.0"},
    ]);
    let status = |container: &str, ready: bool| {
        json!({
            "name": container, "ready": ready, "restartCount": 0,
            "image": "haproxytech/haproxy-debian:3.0", "imageID": "",
            "started": true, "state": {"running": {"startedAt": "2026-11-29T08:00:00Z"}},
        })
    };
    pod["status"]["containerStatuses"] = json!([
        status("haproxy", haproxy_ready),
        status("dataplaneapi", dataplane_ready),
    ]);
    pod
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
        instance_of(
            &parse(pod("a", Some("10.0.0.1"), true, "1")),
            "http",
            5555,
            "dataplaneapi"
        ),
        Some(target("a", "http://10.0.0.1:5555"))
    );
    assert_eq!(
        instance_of(
            &parse(pod("v6", Some("fd00::1"), true, "1")),
            "http",
            5555,
            "dataplaneapi"
        ),
        Some(target("v6", "http://[fd00::1]:5555"))
    );
    assert_eq!(
        instance_of(
            &parse(pod("tls", Some("10.0.0.9"), true, "1")),
            "https",
            5556,
            "dataplaneapi"
        ),
        Some(target("tls", "https://10.0.0.9:5556"))
    );
    assert_eq!(
        instance_of(
            &parse(pod("b", Some("10.0.0.2"), false, "1")),
            "http",
            5555,
            "dataplaneapi"
        ),
        None
    );
    assert_eq!(
        instance_of(
            &parse(pod("c", None, true, "1")),
            "http",
            5555,
            "dataplaneapi"
        ),
        None
    );
    let mut terminating = pod("d", Some("10.0.0.4"), true, "1");
    terminating["metadata"]["deletionTimestamp"] = json!("2026-11-22T05:00:00Z");
    assert_eq!(
        instance_of(&parse(terminating), "http", 5555, "dataplaneapi"),
        None
    );
    let mut no_status = pod("e", Some("10.0.0.5"), true, "1");
    no_status.as_object_mut().unwrap().remove("status");
    assert_eq!(
        instance_of(&parse(no_status), "http", 5555, "dataplaneapi"),
        None
    );
}

/// The HAProxy pod turns ready only once it serves a config hapwright deployed, so a
/// pod is a target as soon as its Data Plane API container is ready; waiting for the
/// whole pod would keep it from ever getting its first config.
#[test]
fn the_data_plane_api_container_decides_not_the_pods_readiness() {
    let parse = |value: Value| -> Pod { serde_json::from_value(value).unwrap() };
    // Serving the bootstrap config: HAProxy not ready, the pod not ready.
    let bootstrap = parse(controller_pod("new", "10.0.0.1", true, false, "1"));
    assert!(dataplane_ready(&bootstrap, "dataplaneapi"));
    assert_eq!(
        instance_of(&bootstrap, "https", 5555, "dataplaneapi"),
        Some(target("new", "https://10.0.0.1:5555"))
    );
    // The Data Plane API not up yet: not a target, even with HAProxy ready.
    let starting = parse(controller_pod("starting", "10.0.0.2", false, true, "1"));
    assert!(!dataplane_ready(&starting, "dataplaneapi"));
    assert_eq!(instance_of(&starting, "https", 5555, "dataplaneapi"), None);
    // Containers declared, no status yet (still pulling images).
    let mut pending = controller_pod("pending", "10.0.0.3", true, true, "1");
    pending["status"]
        .as_object_mut()
        .unwrap()
        .remove("containerStatuses");
    assert!(!dataplane_ready(&parse(pending), "dataplaneapi"));
    // Another container name, as configured.
    let mut renamed = controller_pod("renamed", "10.0.0.4", true, false, "1");
    renamed["spec"]["containers"][1]["name"] = json!("api");
    renamed["status"]["containerStatuses"][1]["name"] = json!("api");
    let renamed = parse(renamed);
    assert!(dataplane_ready(&renamed, "api"));
    // The pod has no `dataplaneapi` container: its own readiness decides.
    assert!(!dataplane_ready(&renamed, "dataplaneapi"));
    // The Data Plane API as a sidecar among the init containers.
    let mut sidecar = controller_pod("sidecar", "10.0.0.5", true, false, "1");
    let api = sidecar["spec"]["containers"][1].take();
    sidecar["spec"]["containers"] = json!([sidecar["spec"]["containers"][0].take()]);
    sidecar["spec"]["initContainers"] = json!([api]);
    let api_status = sidecar["status"]["containerStatuses"][1].take();
    sidecar["status"]["containerStatuses"] =
        json!([sidecar["status"]["containerStatuses"][0].take()]);
    sidecar["status"]["initContainerStatuses"] = json!([api_status]);
    assert!(dataplane_ready(&parse(sidecar), "dataplaneapi"));
    // One container running both (the pod() fixture): the pod's readiness.
    assert!(dataplane_ready(
        &parse(pod("single", Some("10.0.0.6"), true, "1")),
        "dataplaneapi"
    ));
    assert!(!dataplane_ready(
        &parse(pod("single", Some("10.0.0.6"), false, "1")),
        "dataplaneapi"
    ));
}

/// The same over the API: a pod serving its bootstrap config (Data Plane API ready,
/// HAProxy not, the pod not ready) is discovered; one whose Data Plane API is not
/// ready is not, until it is. HAProxy turning ready changes no target.
#[tokio::test(start_paused = true)]
async fn pods_not_ready_yet_are_targets_once_their_data_plane_api_is_ready() {
    let (client, mut api) = pair();
    let mut harness = Harness::start(client);
    list_pods(
        &mut api,
        "100",
        &[
            controller_pod("haproxy-bootstrap", "10.0.0.1", true, false, "90"),
            controller_pod("haproxy-starting", "10.0.0.2", false, false, "91"),
            controller_pod("haproxy-api-down", "10.0.0.3", false, true, "92"),
            controller_pod("haproxy-serving", "10.0.0.4", true, true, "93"),
        ],
    )
    .await;
    assert_eq!(
        harness.discovered().await,
        vec![
            target("haproxy-bootstrap", "http://10.0.0.1:5555"),
            target("haproxy-serving", "http://10.0.0.4:5555"),
        ]
    );

    // The first pod serves its deployed config and turns ready: the same targets, no
    // publication; the next one is haproxy-starting's Data Plane API coming up.
    api.expect_watch(PODS).await.respond_events(&[event(
        "MODIFIED",
        &controller_pod("haproxy-bootstrap", "10.0.0.1", true, true, "101"),
    )]);
    api.expect_watch(PODS).await.respond_events(&[event(
        "MODIFIED",
        &controller_pod("haproxy-starting", "10.0.0.2", true, false, "102"),
    )]);
    assert_eq!(
        harness.discovered().await,
        vec![
            target("haproxy-bootstrap", "http://10.0.0.1:5555"),
            target("haproxy-serving", "http://10.0.0.4:5555"),
            target("haproxy-starting", "http://10.0.0.2:5555"),
        ]
    );
    let watch = api.expect_watch(PODS).await;
    assert_eq!(watch.param("resourceVersion"), Some("102"));
    api.hold(watch);
    harness.stop().await;
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
    list_pods(&mut api, "5", &[]).await;
    assert_eq!(harness.health(HealthState::Healthy).await, None);
    assert_eq!(harness.discovered().await, vec![]);
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_410_relist_replaces_the_pod_set() {
    let (client, mut api) = pair();
    let mut harness = Harness::start(client);
    list_pods(
        &mut api,
        "100",
        &[
            pod("haproxy-0", Some("10.0.0.1"), true, "90"),
            pod("haproxy-1", Some("10.0.0.2"), true, "91"),
        ],
    )
    .await;
    assert_eq!(harness.discovered().await.len(), 2);
    api.expect_watch(PODS)
        .await
        .respond_events(&[kubernetes_mock::error_event(410, "Expired", "too old")]);
    // haproxy-0 went away while the watch was down; haproxy-2 came up.
    list_pods(
        &mut api,
        "200",
        &[
            pod("haproxy-1", Some("10.0.0.2"), true, "91"),
            pod("haproxy-2", Some("10.0.0.3"), true, "150"),
        ],
    )
    .await;
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

/// A labelled, ready pod running as `account`, controlled by `owner` (kind, name),
/// with a `pod-template-hash` label when given.
fn workload_pod(
    name: &str,
    ip: &str,
    account: &str,
    owner: Option<(&str, &str)>,
    hash: Option<&str>,
    resource_version: &str,
) -> Value {
    let mut pod = pod(name, Some(ip), true, resource_version);
    pod["spec"]["serviceAccountName"] = json!(account);
    if let Some((kind, owner)) = owner {
        pod["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps/v1", "kind": kind, "name": owner,
            "uid": format!("uid-{owner}"), "controller": true, "blockOwnerDeletion": true,
        }]);
    }
    if let Some(hash) = hash {
        pod["metadata"]["labels"]["pod-template-hash"] = json!(hash);
    }
    pod
}

#[test]
fn a_deployment_owns_its_pods_through_a_replicaset_named_after_it_and_the_pod_hash() {
    let parse = |value: Value| -> Pod { serde_json::from_value(value).unwrap() };
    let deployment = Restriction {
        owner_kind: Some("Deployment".to_owned()),
        owner_name: Some("haproxy".to_owned()),
        ..Restriction::default()
    };
    let owned = |owner: &str, hash: Option<&str>| {
        parse(workload_pod(
            "p",
            "10.0.0.1",
            "haproxy",
            Some(("ReplicaSet", owner)),
            hash,
            "1",
        ))
    };
    assert_eq!(
        deployment.skip_reason(&owned("haproxy-7d9f", Some("7d9f"))),
        None
    );
    // Another Deployment whose name starts with the same prefix.
    let reason = deployment
        .skip_reason(&owned("haproxy-evil-7d9f", Some("7d9f")))
        .unwrap();
    assert_eq!(
        reason,
        "is controlled by ReplicaSet `haproxy-evil-7d9f`, not Deployment `haproxy`"
    );
    assert!(
        deployment
            .skip_reason(&owned("haproxy-7d9f", None))
            .is_some(),
        "without the hash label the ReplicaSet cannot be tied to the Deployment"
    );
    let bare = parse(pod("p", Some("10.0.0.1"), true, "1"));
    assert_eq!(
        deployment.skip_reason(&bare).unwrap(),
        "has no controlling owner, not Deployment `haproxy`"
    );
    let any_daemonset = Restriction {
        owner_kind: Some("DaemonSet".to_owned()),
        ..Restriction::default()
    };
    assert_eq!(
        any_daemonset.skip_reason(&parse(workload_pod(
            "p",
            "10.0.0.1",
            "x",
            Some(("DaemonSet", "whatever")),
            None,
            "1"
        ))),
        None
    );
    assert_eq!(Restriction::default().skip_reason(&bare), None);
}

#[tokio::test(start_paused = true)]
async fn pods_of_another_service_account_or_owner_are_skipped_counted_and_named() {
    let (client, mut api) = pair();
    let metrics = DiscoveryMetrics::unregistered().unwrap();
    let mut harness = Harness::restricted(
        client,
        Restriction {
            service_account_name: Some("haproxy".to_owned()),
            owner_kind: Some("DaemonSet".to_owned()),
            owner_name: Some("haproxy".to_owned()),
        },
        Some(metrics.clone()),
    );
    let listing = api.expect_list(PODS).await;
    assert_eq!(listing.param("labelSelector"), Some("app=haproxy"));
    listing.respond(
        200,
        &list(
            "Pod",
            "100",
            &[
                workload_pod(
                    "haproxy-a",
                    "10.0.0.1",
                    "haproxy",
                    Some(("DaemonSet", "haproxy")),
                    None,
                    "90",
                ),
                // Same labels, another service account.
                workload_pod(
                    "intruder",
                    "10.0.0.66",
                    "default",
                    Some(("DaemonSet", "haproxy")),
                    None,
                    "91",
                ),
                // Same labels and account, another workload.
                workload_pod(
                    "copycat",
                    "10.0.0.67",
                    "haproxy",
                    Some(("DaemonSet", "copycat")),
                    None,
                    "92",
                ),
                // A bare pod.
                workload_pod("bare", "10.0.0.68", "haproxy", None, None, "93"),
            ],
        ),
    );
    // Health first: the note names every skipped pod with its reason.
    let note = harness.healthy_note().await;
    assert!(note.starts_with("3 pod(s) skipped"), "{note}");
    for wanted in [
        "intruder runs as service account `default`, not `haproxy`",
        "copycat is controlled by DaemonSet `copycat`, not DaemonSet `haproxy`",
        "bare has no controlling owner, not DaemonSet `haproxy`",
    ] {
        assert!(note.contains(wanted), "missing {wanted:?} in {note}");
    }
    assert_eq!(
        harness.discovered().await,
        vec![target("haproxy-a", "http://10.0.0.1:5555")]
    );
    assert_eq!(metrics.skipped(), 3);

    // The intruder switches to the right account: it becomes a target; the bare pod
    // goes away.
    api.expect_watch(PODS).await.respond_events(&[
        event(
            "MODIFIED",
            &workload_pod(
                "intruder",
                "10.0.0.66",
                "haproxy",
                Some(("DaemonSet", "haproxy")),
                None,
                "101",
            ),
        ),
        event(
            "DELETED",
            &workload_pod("bare", "10.0.0.68", "haproxy", None, None, "102"),
        ),
    ]);
    let note = harness.healthy_note().await;
    assert!(
        note.starts_with("1 pod(s) skipped by serviceAccountName/owner: copycat"),
        "{note}"
    );
    assert_eq!(
        harness.discovered().await,
        vec![
            target("haproxy-a", "http://10.0.0.1:5555"),
            target("intruder", "http://10.0.0.66:5555"),
        ]
    );
    assert_eq!(metrics.skipped(), 1);
    let watch = api.expect_watch(PODS).await;
    api.hold(watch);
    harness.stop().await;
}
