//! Leader election at the protocol level: `kube-lease-manager` through a real
//! `kube::Client` against a fake Lease API served from a `tower-test` mock (GET,
//! create, server-side apply with field ownership conflicts, strategic merge).
//!
//! The lease manager measures lease expiry with the wall clock, so these tests run on
//! real time with 2-second leases; every wait is for a condition (a request the fake
//! served, a change on the is-leader channel), bounded by a timeout.

mod kubernetes_mock;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hapwright_watchers::kubernetes::{
    ClientFactory, LeaderElection, LeaderElectionConfig, LeaderMetrics,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kubernetes_mock::{ApiServer, Exchange, pair};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(20);
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ingress/leases";
const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/ingress/leases/hapwright-leader";

/// What the fake API server holds, and what it saw.
#[derive(Debug, Default)]
struct State {
    lease: Option<Value>,
    resource_version: u64,
    /// Answer everything with 403 (RBAC denied).
    deny: bool,
    /// Requests served, as `METHOD path content-type`.
    log: Vec<String>,
    /// Patches by content type, in order.
    patches: Vec<(String, Value)>,
}

impl State {
    fn holder(&self) -> Option<String> {
        self.lease
            .as_ref()
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
    }
}

/// The fake: a task answering the client's requests from [`State`]; every served
/// request bumps a counter the test can wait on.
struct FakeLeases {
    state: Arc<Mutex<State>>,
    served: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeLeases {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeLeases {
    fn start(mut api: ApiServer, initial: Option<Value>) -> Self {
        let state = Arc::new(Mutex::new(State {
            lease: initial,
            resource_version: 1,
            ..State::default()
        }));
        let (count, served) = watch::channel(0u64);
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let exchange = api.next().await;
                let (status, body) = serve(&mut shared.lock().unwrap(), &exchange);
                exchange.respond(status, &body);
                count.send_modify(|n| *n += 1);
            }
        });
        Self {
            state,
            served,
            task,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// Waits until `condition` holds after some served request.
    async fn wait_for(&mut self, what: &str, condition: impl Fn(&State) -> bool) {
        timeout(WAIT, async {
            loop {
                if self.with(|s| condition(s)) {
                    return;
                }
                self.served.changed().await.expect("the fake is running");
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "timed out waiting for: {what}; state: {:?}",
                self.with(|s| format!("{s:?}"))
            )
        });
    }
}

fn serve(state: &mut State, exchange: &Exchange) -> (u16, Value) {
    state.log.push(format!(
        "{} {} {}",
        exchange.method,
        exchange.path,
        exchange.content_type.clone().unwrap_or_default()
    ));
    if state.deny {
        return (
            403,
            kubernetes_mock::status(
                403,
                "Forbidden",
                "leases.coordination.k8s.io \"hapwright-leader\" is forbidden",
            ),
        );
    }
    let not_found = || {
        (
            404,
            kubernetes_mock::status(404, "NotFound", "leases \"hapwright-leader\" not found"),
        )
    };
    match (exchange.method.as_str(), exchange.path.as_str()) {
        ("GET", LEASE) => match &state.lease {
            Some(lease) => (200, lease.clone()),
            None => not_found(),
        },
        ("POST", LEASES) => {
            if state.lease.is_some() {
                return (
                    409,
                    kubernetes_mock::status(409, "AlreadyExists", "already exists"),
                );
            }
            let mut lease = exchange.json();
            state.resource_version += 1;
            lease["metadata"]["namespace"] = json!("ingress");
            lease["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
            lease["apiVersion"] = json!("coordination.k8s.io/v1");
            lease["kind"] = json!("Lease");
            state.lease = Some(lease.clone());
            (201, lease)
        }
        ("PATCH", LEASE) => {
            let Some(mut lease) = state.lease.clone() else {
                return not_found();
            };
            let content_type = exchange.content_type.clone().unwrap_or_default();
            let patch = exchange.json();
            state.patches.push((content_type.clone(), patch.clone()));
            let wanted = patch["spec"]["holderIdentity"].as_str();
            // Server-side apply: holderIdentity owned by another manager conflicts.
            if content_type.starts_with("application/apply-patch")
                && let (Some(current), Some(wanted)) = (state.holder(), wanted)
                && current != wanted
            {
                return (
                    409,
                    kubernetes_mock::status(
                        409,
                        "Conflict",
                        "Apply failed with 1 conflict: conflict with \"other\": .spec.holderIdentity",
                    ),
                );
            }
            if !lease["spec"].is_object() {
                lease["spec"] = json!({});
            }
            for (key, value) in patch["spec"].as_object().into_iter().flatten() {
                let spec = lease["spec"].as_object_mut().unwrap();
                if value.is_null() {
                    spec.remove(key);
                } else {
                    spec.insert(key.clone(), value.clone());
                }
            }
            state.resource_version += 1;
            lease["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
            state.lease = Some(lease.clone());
            (200, lease)
        }
        _ => (
            404,
            kubernetes_mock::status(404, "NotFound", "no such path in the fake"),
        ),
    }
}

fn now() -> Value {
    serde_json::to_value(MicroTime(Timestamp::now())).unwrap()
}

fn lease_held_by(holder: &str, duration: u64) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "hapwright-leader", "namespace": "ingress", "resourceVersion": "1"},
        "spec": {
            "holderIdentity": holder, "leaseDurationSeconds": duration,
            "acquireTime": now(), "renewTime": now(), "leaseTransitions": 3,
        },
    })
}

fn config(identity: &str) -> LeaderElectionConfig {
    LeaderElectionConfig {
        lease_name: "hapwright-leader".to_owned(),
        namespace: Some("ingress".to_owned()),
        identity: identity.to_owned(),
        lease_duration_seconds: 2,
        grace_seconds: 1,
    }
}

async fn becomes(receiver: &mut watch::Receiver<bool>, leader: bool) {
    timeout(WAIT, receiver.wait_for(|&v| v == leader))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for is-leader = {leader}"))
        .expect("the election is running");
}

fn metric(registry: &prometheus::Registry, name: &str) -> f64 {
    let mut text = String::new();
    prometheus::TextEncoder::new()
        .encode_utf8(&registry.gather(), &mut text)
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("metric {name} is registered:\n{text}"))
        .parse()
        .unwrap()
}

fn is_renewal(state: &State) -> bool {
    state.patches.iter().any(|(content_type, patch)| {
        content_type.starts_with("application/strategic-merge-patch")
            && patch["spec"].get("renewTime").is_some()
            && patch["spec"].get("holderIdentity").is_none()
    })
}

/// Replica `replica-a`'s election against a fake API server that starts with
/// `lease`, with `metrics` when given.
fn elect(lease: Option<Value>, metrics: Option<LeaderMetrics>) -> (FakeLeases, LeaderElection) {
    let (client, api) = pair();
    let fake = FakeLeases::start(api, lease);
    let election = LeaderElection::start(
        config("replica-a"),
        ClientFactory::with_client(client),
        metrics,
    );
    (fake, election)
}

#[tokio::test]
async fn acquires_a_missing_lease_renews_it_and_releases_it_at_shutdown() {
    let registry = prometheus::Registry::new();
    let metrics = LeaderMetrics::register(&registry).unwrap();
    let (mut fake, election) = elect(None, Some(metrics));
    let mut leader = election.subscribe();
    assert!(!*leader.borrow(), "a follower until the lease is held");

    becomes(&mut leader, true).await;
    assert!(election.is_leader());
    fake.with(|s| {
        assert!(
            s.log.iter().any(|l| l.starts_with("POST ")),
            "the lease was created: {:?}",
            s.log
        );
        assert_eq!(s.holder().as_deref(), Some("replica-a"));
        assert_eq!(s.lease.as_ref().unwrap()["spec"]["leaseTransitions"], 1);
    });
    assert_eq!(metric(&registry, "hapwright_leader"), 1.0);
    assert_eq!(metric(&registry, "hapwright_leader_transitions_total"), 1.0);

    // Renewed before it expires, and still the leader.
    fake.wait_for("a renewal", is_renewal).await;
    assert!(election.is_leader());
    assert_eq!(fake.with(|s| s.holder()).as_deref(), Some("replica-a"));

    election.shutdown().await;
    assert!(!*leader.borrow());
    assert_eq!(fake.with(|s| s.holder()), None, "released at shutdown");
    assert_eq!(metric(&registry, "hapwright_leader"), 0.0);
    assert_eq!(metric(&registry, "hapwright_leader_transitions_total"), 2.0);
}

#[tokio::test]
async fn a_lease_held_by_another_replica_keeps_this_one_a_follower_until_it_expires() {
    let (mut fake, election) = elect(Some(lease_held_by("replica-b", 2)), None);
    let mut leader = election.subscribe();
    // It read the lease and saw the other holder.
    fake.wait_for("the lease was read", |s| {
        s.log.iter().filter(|l| l.starts_with("GET ")).count() >= 2
    })
    .await;
    assert!(!election.is_leader());
    assert_eq!(fake.with(|s| s.holder()).as_deref(), Some("replica-b"));

    // replica-b stops renewing: once its lease expires, replica-a takes over.
    becomes(&mut leader, true).await;
    fake.with(|s| {
        assert_eq!(s.holder().as_deref(), Some("replica-a"));
        assert_eq!(s.lease.as_ref().unwrap()["spec"]["leaseTransitions"], 4);
    });
    election.shutdown().await;
}

#[tokio::test]
async fn losing_the_lease_to_another_holder_steps_down() {
    let registry = prometheus::Registry::new();
    let metrics = LeaderMetrics::register(&registry).unwrap();
    let (fake, election) = elect(None, Some(metrics));
    let mut leader = election.subscribe();
    becomes(&mut leader, true).await;

    // Another replica takes the lease over (as after a partition).
    fake.with(|s| s.lease = Some(lease_held_by("replica-b", 30)));
    becomes(&mut leader, false).await;
    assert!(!election.is_leader());
    assert_eq!(fake.with(|s| s.holder()).as_deref(), Some("replica-b"));
    assert_eq!(metric(&registry, "hapwright_leader"), 0.0);
    assert_eq!(metric(&registry, "hapwright_leader_transitions_total"), 2.0);
    election.shutdown().await;
    assert_eq!(
        fake.with(|s| s.holder()).as_deref(),
        Some("replica-b"),
        "a follower does not release another holder's lease"
    );
}

#[tokio::test]
async fn rbac_denied_never_leads_and_a_denied_renewal_steps_down() {
    let (mut fake, election) = elect(None, None);
    // Denied from the first request: the election's task runs at the first await.
    fake.with(|s| s.deny = true);
    let mut leader = election.subscribe();
    fake.wait_for("two denied attempts", |s| s.log.len() >= 2)
        .await;
    assert!(!election.is_leader());
    assert_eq!(fake.with(|s| s.lease.clone()), None);

    // RBAC fixed: it leads.
    fake.with(|s| s.deny = false);
    becomes(&mut leader, true).await;

    // Denied again: the renewal fails and it steps down at once.
    fake.with(|s| s.deny = true);
    becomes(&mut leader, false).await;

    // Allowed again: still the holder in the cluster, so it leads again.
    fake.with(|s| s.deny = false);
    becomes(&mut leader, true).await;
    election.shutdown().await;
    assert_eq!(fake.with(|s| s.holder()), None);
}
