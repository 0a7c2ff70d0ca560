//! The deployer driving a fleet: the leadership gate (paused time), discovered
//! instances joining and leaving, plain-http discovered instances refused unless
//! opted in, a mixed fleet of three real HAProxy 2.6 processes
//! (socket driver) and two Data Plane API servers in one deployment, an instance
//! killed mid-deployment recovering through retries, and drift repaired after an
//! out-of-band change plus reload.

mod support;

use hapwright_deployer::Driver;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::client::dataplane::{DataplaneClient, Endpoint, Settings};
use hapwright_deployer::component::deployer::{Config, Deployer, LastDeployedStore};
use hapwright_deployer::component::scheduler::{self, Scheduler};
use hapwright_deployer::driver::SocketDriver;
use hapwright_deployer::driver::dataplane::DataplaneDriver;
use hapwright_deployer::driver::fleet::DiscoveredCredentials;
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::config::Secret;
use hapwright_eventbus::model::{
    ContentHash, DeployStrategy, InstanceDriver, InstanceRef, ReloadReason, RenderedConfig,
};
use hapwright_eventbus::testing::TestBus;
use hapwright_eventbus::{
    Event, EventKind, EventPayload, InstancesDiscovered, Kernel, Publisher, RunningKernel,
    Subscription,
};
use support::dataplane::{DataplaneServer, Faults, PASSWORD, USER};
use support::{
    Backend, BlackHole, Haproxy, config, counter, free_port, rendered, rendered_with, wait_for_body,
};
use tokio::sync::watch;
use tokio::time::timeout;

fn fast_settings() -> Settings {
    Settings {
        min_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        poll_interval: Duration::from_millis(5),
        ..Settings::default()
    }
}

fn fast_config() -> Config {
    Config {
        deployment_timeout: Duration::from_secs(20),
        min_reload_interval: Duration::from_millis(50),
        concurrency: 8,
        min_retry_delay: Duration::from_millis(100),
        max_retry_delay: Duration::from_millis(400),
        ..Config::default()
    }
}

fn dataplane_driver(name: &str, server: &DataplaneServer, metrics: &Metrics) -> DataplaneDriver {
    let endpoint = Endpoint {
        url: server.url.clone(),
        username: USER.to_owned(),
        password: Secret::new(PASSWORD),
        ca_file: None,
    };
    DataplaneDriver::new(
        name,
        server.url.clone(),
        DataplaneClient::new(&endpoint, fast_settings()).unwrap(),
        metrics.clone(),
    )
}

struct Harness {
    kernel: Option<RunningKernel>,
    publisher: Publisher,
    events: Subscription,
}

impl Harness {
    fn start(components: impl FnOnce(&mut Kernel)) -> Self {
        let bus = TestBus::new();
        let events = bus.subscribe(
            "test",
            [
                EventKind::DeploymentStarted,
                EventKind::InstanceDeployed,
                EventKind::InstanceDeploymentFailed,
                EventKind::DeploymentCompleted,
                EventKind::DriftDetected,
            ],
        );
        let publisher = bus.publisher();
        Self {
            kernel: Some(bus.start(components)),
            publisher,
            events,
        }
    }

    fn schedule(&self, config: &Arc<RenderedConfig>, instances: &[&str]) {
        self.publisher
            .publish(support::scheduled(config, instances));
    }

    /// The next event matching `pick`, within `within`.
    async fn next<T>(&mut self, within: Duration, mut pick: impl FnMut(&Event) -> Option<T>) -> T {
        timeout(within, async {
            loop {
                let event = self.events.recv().await.expect("bus open");
                if let Some(found) = pick(&event) {
                    return found;
                }
            }
        })
        .await
        .expect("event within the deadline")
    }

    /// Whether an event matching `pick` comes within `within`.
    async fn any(&mut self, within: Duration, mut pick: impl FnMut(&Event) -> bool) -> bool {
        timeout(within, async {
            loop {
                let event = self.events.recv().await.expect("bus open");
                if pick(&event) {
                    return;
                }
            }
        })
        .await
        .is_ok()
    }

    async fn completed(&mut self) -> (Vec<String>, Vec<String>) {
        self.next(Duration::from_secs(60), |event| match &event.payload {
            EventPayload::DeploymentCompleted(done) => {
                Some((done.summary.succeeded.clone(), done.summary.failed.clone()))
            }
            _ => None,
        })
        .await
    }

    async fn stop(mut self) {
        if let Some(kernel) = self.kernel.take() {
            kernel.shutdown(Duration::from_secs(10)).await;
        }
    }
}

fn plain(text: &str) -> Arc<RenderedConfig> {
    rendered(text, &[])
}

#[tokio::test(start_paused = true)]
async fn a_follower_deploys_only_while_it_leads() {
    let (leader, follower) = watch::channel(false);
    let deployer = Deployer::with_drivers(
        fast_config(),
        BTreeMap::new(),
        LastDeployedStore::new(),
        None,
        Metrics::unregistered().unwrap(),
    )
    .with_leadership(follower);
    let mut harness = Harness::start(|kernel| {
        kernel.register(deployer);
    });
    let (v1, v2) = (plain("global\n# v1\n"), plain("global\n# v2\n"));
    harness.schedule(&v1, &["ghost"]);
    harness.schedule(&v2, &["ghost"]);
    assert!(
        !harness
            .any(Duration::from_secs(3600), |e| matches!(
                e.payload,
                EventPayload::DeploymentStarted(_)
            ))
            .await,
        "a follower does not deploy"
    );

    // Leadership acquired: the latest config goes out at once.
    leader.send(true).unwrap();
    let hash = harness
        .next(Duration::from_millis(1), |e| match &e.payload {
            EventPayload::DeploymentStarted(started) => Some(started.hash),
            _ => None,
        })
        .await;
    assert_eq!(hash, v2.hash());
    // `ghost` has no driver: it fails (and there is nothing to retry).
    let (_, failed) = harness.completed().await;
    assert_eq!(failed, ["ghost"]);

    // Leadership lost: no retries while following.
    leader.send(false).unwrap();
    assert!(
        !harness
            .any(Duration::from_secs(3600), |e| matches!(
                e.payload,
                EventPayload::DeploymentStarted(_)
            ))
            .await,
        "no retries while following"
    );
    // A config scheduled meanwhile is remembered and deployed on the next takeover.
    let v3 = plain("global\n# v3\n");
    harness.schedule(&v3, &[]);
    leader.send(true).unwrap();
    let hash = harness
        .next(Duration::from_millis(1), |e| match &e.payload {
            EventPayload::DeploymentStarted(started) => Some(started.hash),
            _ => None,
        })
        .await;
    assert_eq!(hash, v3.hash());
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn without_a_leadership_gate_it_always_deploys() {
    let deployer = Deployer::with_drivers(
        fast_config(),
        BTreeMap::new(),
        LastDeployedStore::new(),
        None,
        Metrics::unregistered().unwrap(),
    );
    let mut harness = Harness::start(|kernel| {
        kernel.register(deployer);
    });
    let v1 = plain("global\n# v1\n");
    harness.schedule(&v1, &[]);
    let (succeeded, failed) = harness.completed().await;
    assert!(succeeded.is_empty() && failed.is_empty());
    harness.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_instances_get_the_last_config_at_once_and_are_forgotten_when_gone() {
    let (a, b) = (
        DataplaneServer::start("global\n").await,
        DataplaneServer::start("global\n").await,
    );
    let store = LastDeployedStore::new();
    let metrics = Metrics::unregistered().unwrap();
    let deployer = discovering_deployer(store.clone(), &metrics);
    let mut harness = Harness::start(|kernel| {
        kernel.register(deployer);
    });
    let v1 = plain("global\n    maxconn 100\n");
    harness.schedule(&v1, &[]);
    harness.completed().await;

    let discover = |instances: Vec<InstanceRef>| InstancesDiscovered {
        source: Arc::from("kubernetes"),
        instances: Arc::from(instances),
    };
    let pod = |name: &str, url: &str, driver| InstanceRef {
        name: name.to_owned(),
        driver,
        address: url.to_owned(),
    };
    harness.publisher.publish(discover(vec![
        pod("pod-a", &a.url, InstanceDriver::Dataplane),
        pod("pod-sock", "/run/x.sock", InstanceDriver::Socket),
    ]));
    // pod-a is on loopback: plain http needs no opt-in. pod-sock is refused, and
    // the refusal shows on it.
    let (succeeded, failed) = harness.completed().await;
    assert_eq!(
        (succeeded, failed),
        (vec!["pod-a".to_owned()], vec!["pod-sock".to_owned()])
    );
    assert!(a.state().running_raw.contains(&v1.hash().short()));
    assert_eq!(metrics.refused_count("socket_instance"), 1);
    assert!(!metrics.insecure_transport("pod-a"));
    assert!(
        store.get("pod-sock").is_none(),
        "socket instances are not discoverable"
    );

    // pod-a goes, pod-b comes.
    harness.publisher.publish(discover(vec![pod(
        "pod-b",
        &b.url,
        InstanceDriver::Dataplane,
    )]));
    let (succeeded, _) = harness.completed().await;
    assert_eq!(succeeded, ["pod-b"]);
    assert!(b.state().running_raw.contains(&v1.hash().short()));
    assert!(store.get("pod-a").is_none(), "the store forgot pod-a");
    assert!(store.deployed("pod-b").is_some());
    harness.stop().await;
}

/// A socket driver for each of `haproxies`, by instance name.
fn socket_drivers(haproxies: &[Haproxy], metrics: &Metrics) -> BTreeMap<String, Arc<dyn Driver>> {
    haproxies
        .iter()
        .map(|h| {
            (
                h.instance.name.clone(),
                Arc::new(SocketDriver::new(h.instance.clone(), None, metrics.clone()))
                    as Arc<dyn Driver>,
            )
        })
        .collect()
}

/// A deployer without static instances that reaches discovered ones over plain http
/// (the test servers are on loopback).
fn discovering_deployer(store: LastDeployedStore, metrics: &Metrics) -> Deployer {
    Deployer::with_drivers(fast_config(), BTreeMap::new(), store, None, metrics.clone())
        .with_discovery(DiscoveredCredentials {
            username: USER.to_owned(),
            password: Secret::new(PASSWORD),
            ca_file: None,
            scheme: "http".to_owned(),
            allow_insecure_http: false,
            server_name: None,
            resolve: Vec::new(),
            settings: fast_settings(),
        })
}

/// The next `InstanceDeployed` of `pod-0`: its hash and strategy.
async fn pod_deployed(harness: &mut Harness) -> (ContentHash, DeployStrategy) {
    harness
        .next(Duration::from_secs(20), |event| match &event.payload {
            EventPayload::InstanceDeployed(done) if done.instance == "pod-0" => {
                Some((done.hash, done.strategy))
            }
            _ => None,
        })
        .await
}

/// A pod removed while its worker's attempt is in flight, and back under the same
/// name at once (a StatefulSet pod replaced): the removal waits for the old worker,
/// which finishes its attempt and then clears its record and metric series, so the
/// new worker starts clean: its record and counters hold only its own deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_removed_mid_attempt_and_back_under_its_name_starts_clean() {
    let server = DataplaneServer::start("global\n").await;
    let store = LastDeployedStore::new();
    let registry = prometheus::Registry::new();
    let metrics = Metrics::register(&registry).unwrap();
    let deployer = discovering_deployer(store.clone(), &metrics);
    let mut harness = Harness::start(|kernel| {
        kernel.register(deployer);
    });
    let discover = |present: bool| InstancesDiscovered {
        source: Arc::from("kubernetes"),
        instances: Arc::from(if present {
            vec![InstanceRef {
                name: "pod-0".to_owned(),
                driver: InstanceDriver::Dataplane,
                address: server.url.clone(),
            }]
        } else {
            Vec::new()
        }),
    };
    let v1 = plain("global\n    maxconn 100\n");
    harness.schedule(&v1, &[]);
    harness.completed().await;
    harness.publisher.publish(discover(true));
    assert_eq!(pod_deployed(&mut harness).await.0, v1.hash());
    harness.completed().await;
    assert!(store.get("pod-0").is_some());

    // The next attempt is slow: every Data Plane API answer waits 100 ms.
    server.faults(Faults {
        delay: Some(Duration::from_millis(100)),
        ..Faults::default()
    });
    let v2 = plain("global\n    maxconn 200\n");
    let requests = server.state().log.len();
    harness.schedule(&v2, &["pod-0"]);
    server.wait_for_requests(requests + 1).await;
    // Gone while its attempt runs, and back at once.
    harness.publisher.publish(discover(false));
    harness.publisher.publish(discover(true));

    // The old worker's attempt ends first; then the new worker deploys v2.
    let (old_hash, _) = pod_deployed(&mut harness).await;
    assert_eq!(old_hash, v2.hash(), "the attempt in flight finished");
    let (new_hash, new_strategy) = pod_deployed(&mut harness).await;
    assert_eq!(new_hash, v2.hash());
    let record = store.get("pod-0").expect("the new worker's record");
    assert_eq!(
        record.reloads,
        u64::from(new_strategy == DeployStrategy::Reload),
        "only the new worker's reloads: {record:?}"
    );
    assert!(record.last_error.is_none());
    let pod = ("instance", "pod-0");
    assert_eq!(
        counter(&registry, "hapwright_deployments_total", &[pod]),
        1,
        "only the new worker's deployment is counted"
    );
    assert_eq!(
        support::series(&registry, "hapwright_instance_in_sync", &[pod]),
        [1.0]
    );

    assert_eq!(harness.completed().await.0, ["pod-0"]);

    // Gone for good (a round after it tells the removal was handled): once the
    // deployer stopped, nothing of it is left, and nothing wrote it back.
    harness.publisher.publish(discover(false));
    harness.schedule(&plain("global\n    maxconn 300\n"), &[]);
    harness.completed().await;
    harness.stop().await;
    assert!(store.get("pod-0").is_none(), "the record is cleared");
    assert!(
        support::series(&registry, "hapwright_deployments_total", &[pod]).is_empty(),
        "the metric series are gone"
    );
}

/// The deployer alone owns fleet membership: a pod joining gets the last config in a
/// round of its own, and the pod already running it sees no round, no attempt and no
/// drop of `hapwright_instance_in_sync` (the scheduler schedules nothing for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_pod_leaves_the_others_alone() {
    let (a, b) = (
        DataplaneServer::start("global\n").await,
        DataplaneServer::start("global\n").await,
    );
    let registry = prometheus::Registry::new();
    let metrics = Metrics::register(&registry).unwrap();
    let deployer = discovering_deployer(LastDeployedStore::new(), &metrics);
    let scheduler = Scheduler::new(
        scheduler::Config {
            min_deployment_interval: Duration::from_millis(50),
        },
        Vec::new(),
    );
    let mut harness = Harness::start(|kernel| {
        kernel.register(scheduler);
        kernel.register(deployer);
    });
    let pods = |servers: &[(&str, &DataplaneServer)]| InstancesDiscovered {
        source: Arc::from("kubernetes"),
        instances: servers
            .iter()
            .map(|(name, server)| InstanceRef {
                name: (*name).to_owned(),
                driver: InstanceDriver::Dataplane,
                address: server.url.clone(),
            })
            .collect(),
    };
    let started = |event: &Event| match &event.payload {
        EventPayload::DeploymentStarted(started) => Some((started.hash, started.instances.clone())),
        _ => None,
    };
    harness.publisher.publish(pods(&[("pod-a", &a)]));
    let v1 = plain("global\n    maxconn 100\n");
    harness.publisher.publish(support::validated(&v1));
    assert_eq!(
        harness.next(Duration::from_secs(30), started).await,
        (v1.hash(), vec!["pod-a".to_owned()])
    );
    assert_eq!(harness.completed().await.0, ["pod-a"]);
    let pod_a = ("instance", "pod-a");
    assert_eq!(
        counter(&registry, "hapwright_deployments_total", &[pod_a]),
        1
    );

    // pod-b joins: a round for pod-b alone.
    harness
        .publisher
        .publish(pods(&[("pod-a", &a), ("pod-b", &b)]));
    assert_eq!(
        harness.next(Duration::from_secs(30), started).await,
        (v1.hash(), vec!["pod-b".to_owned()])
    );
    assert_eq!(harness.completed().await.0, ["pod-b"]);
    // The next round is the next config's, for both; none came for pod-a between.
    let v2 = plain("global\n    maxconn 200\n");
    assert_eq!(
        counter(&registry, "hapwright_deployments_total", &[pod_a]),
        1
    );
    assert_eq!(
        support::series(&registry, "hapwright_instance_in_sync", &[pod_a]),
        [1.0]
    );
    harness.publisher.publish(support::validated(&v2));
    assert_eq!(
        harness.next(Duration::from_secs(30), started).await,
        (v2.hash(), vec!["pod-a".to_owned(), "pod-b".to_owned()])
    );
    harness.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_fleet_deploys_in_one_round_and_a_killed_instance_recovers() {
    let app = Backend::start("app").await;
    let next = Backend::start("next").await;
    // One render for the whole fleet: the frontend binds a unix socket relative to
    // each instance's directory (HAProxy's working directory), so the instances do
    // not compete for a port.
    let render = |server_port: u16, extra: &str| {
        rendered(
            &format!(
                "global\n    stats timeout 30s\n\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
frontend fe_main\n    bind unix@fe.sock\n    default_backend be_app\n{extra}\n\
backend be_app\n    balance roundrobin\n    server s1 127.0.0.1:{server_port}\n"
            ),
            &[],
        )
    };
    let v1 = render(app.port, "");
    let mut haproxies = Vec::new();
    for i in 0..3 {
        haproxies.push(Haproxy::start(&format!("local-{i}"), &v1, "boot").await);
    }
    let (dp1, dp2) = (
        DataplaneServer::start("global\n").await,
        DataplaneServer::start("global\n").await,
    );
    let metrics = Metrics::unregistered().unwrap();
    let drivers = socket_drivers(&haproxies, &metrics);
    let store = LastDeployedStore::new();
    let deployer =
        Deployer::with_drivers(fast_config(), drivers, store.clone(), None, metrics.clone())
            .with_dataplane([
                dataplane_driver("dp-1", &dp1, &metrics),
                dataplane_driver("dp-2", &dp2, &metrics),
            ]);
    let all: Vec<String> = deployer.instance_names();
    assert_eq!(all.len(), 5);
    let names: Vec<&str> = all.iter().map(String::as_str).collect();
    let mut harness = Harness::start(|kernel| {
        kernel.register(deployer);
    });

    harness.schedule(&v1, &names);
    let (succeeded, failed) = harness.completed().await;
    assert_eq!(succeeded.len(), 5, "failed: {failed:?}");

    // A runtime change reaches every instance without a reload.
    let v2 = render(next.port, "");
    harness.schedule(&v2, &names);
    let mut strategies = BTreeMap::new();
    while strategies.len() < 5 {
        let (name, strategy) = harness
            .next(Duration::from_secs(30), |e| match &e.payload {
                EventPayload::InstanceDeployed(d) => Some((d.instance.clone(), d.strategy)),
                _ => None,
            })
            .await;
        strategies.insert(name, strategy);
    }
    assert!(
        strategies.values().all(|s| *s == DeployStrategy::Runtime),
        "{strategies:?}"
    );
    harness.completed().await;
    for name in &names {
        assert_eq!(store.deployed(name).unwrap().config.hash(), v2.hash());
    }

    // local-2 dies during the next (reloading) deployment; the others go on.
    haproxies[2].kill();
    let v3 = render(next.port, "    option forwardfor\n");
    harness.schedule(&v3, &names);
    let (succeeded, failed) = harness.completed().await;
    assert_eq!(failed, ["local-2"]);
    assert_eq!(succeeded.len(), 4);
    // Its worker retries with backoff, failing while it is down; it comes back and
    // the retry repairs it.
    harness
        .next(Duration::from_secs(30), |e| match &e.payload {
            EventPayload::InstanceDeploymentFailed(f) if f.instance == "local-2" => Some(()),
            _ => None,
        })
        .await;
    haproxies[2].restart().await;
    let recovered = harness
        .next(Duration::from_secs(30), |e| match &e.payload {
            EventPayload::InstanceDeployed(done) if done.instance == "local-2" => Some(done.hash),
            _ => None,
        })
        .await;
    assert_eq!(recovered, v3.hash());
    assert_eq!(haproxies[2].config_version().await, Some(v3.hash().short()));
    assert!(dp1.state().running_raw.contains("option forwardfor"));
    harness.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_after_an_out_of_band_change_and_reload_is_repaired() {
    let app = Backend::start("app").await;
    let other = Backend::start("other").await;
    let port = free_port();
    let v1 = rendered(
        &config(
            port,
            &format!(
                "backend be_app\n    server s1 127.0.0.1:{}\n\nbackend be_other\n    server o1 127.0.0.1:{}\n",
                app.port, other.port
            ),
        ),
        &[("hosts.map", "other.test be_other\n")],
    );
    let haproxy = Haproxy::start("local", &v1, "boot").await;
    let metrics = Metrics::unregistered().unwrap();
    let store = LastDeployedStore::new();
    let drivers = BTreeMap::from([(
        "local".to_owned(),
        Arc::new(SocketDriver::new(
            haproxy.instance.clone(),
            None,
            metrics.clone(),
        )) as Arc<dyn Driver>,
    )]);
    let deployer = Deployer::with_drivers(
        Config {
            drift_interval: Duration::from_millis(300),
            ..fast_config()
        },
        drivers,
        store.clone(),
        None,
        metrics.clone(),
    );
    let scheduler = Scheduler::new(
        scheduler::Config {
            min_deployment_interval: Duration::from_millis(50),
        },
        vec!["local".to_owned()],
    );
    let mut harness = Harness::start(|kernel| {
        kernel.register(scheduler);
        kernel.register(deployer);
    });
    harness.publisher.publish(support::validated(&v1));
    let (succeeded, _) = harness.completed().await;
    assert_eq!(succeeded, ["local"]);
    wait_for_body(port, "other.test", "other").await;
    // What hapwright deployed is not drift.
    let probe = SocketDriver::new(haproxy.instance.clone(), None, metrics.clone());
    let deployed = store.deployed("local").unwrap();
    assert_eq!(probe.check_drift(&deployed).await.unwrap(), None);

    // Someone edits the map behind hapwright's back (keeping the marker) and reloads.
    std::fs::write(haproxy.path().join("maps/hosts.map"), "other.test be_app\n").unwrap();
    haproxy
        .master()
        .send_reload(40, Duration::from_millis(50))
        .await
        .unwrap();
    wait_for_body(port, "other.test", "app").await;

    let detail = harness
        .next(Duration::from_secs(30), |e| match &e.payload {
            EventPayload::DriftDetected(d) if d.instance == "local" => Some(d.detail.clone()),
            _ => None,
        })
        .await;
    assert!(detail.contains("changed outside hapwright"), "{detail}");
    let reason = harness
        .next(Duration::from_secs(30), |e| match &e.payload {
            EventPayload::InstanceDeployed(d) => d.reason.clone(),
            _ => None,
        })
        .await;
    assert_eq!(reason.reload, Some(ReloadReason::Drift), "{reason:?}");
    wait_for_body(port, "other.test", "other").await;
    assert_eq!(
        std::fs::read_to_string(haproxy.path().join("maps/hosts.map")).unwrap(),
        "other.test be_other\n"
    );
    assert!(metrics.drift_count("local") >= 1);
    harness.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_changes_reach_healthy_instances_while_one_hangs_and_it_catches_up() {
    let app = Backend::start("app").await;
    let next = Backend::start("next").await;
    let render = |server_port: u16| {
        rendered(
            &format!(
                "global\n    stats timeout 30s\n\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
frontend fe_main\n    bind unix@fe.sock\n    default_backend be_app\n\n\
backend be_app\n    balance roundrobin\n    server s1 127.0.0.1:{server_port}\n"
            ),
            &[],
        )
    };
    let v1 = render(app.port);
    let mut haproxies = Vec::new();
    for i in 0..3 {
        haproxies.push(Haproxy::start(&format!("local-{i}"), &v1, "boot").await);
    }
    let metrics = Metrics::unregistered().unwrap();
    let drivers = socket_drivers(&haproxies, &metrics);
    let store = LastDeployedStore::new();
    let deployer = Deployer::with_drivers(
        Config {
            deployment_timeout: Duration::from_secs(3),
            ..fast_config()
        },
        drivers,
        store.clone(),
        None,
        metrics.clone(),
    );
    let names = deployer.instance_names();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut harness = Harness::start(|kernel| {
        kernel.register(deployer);
    });
    harness.schedule(&v1, &names);
    let (succeeded, failed) = harness.completed().await;
    assert_eq!(succeeded.len(), 3, "failed: {failed:?}");

    // local-2 hangs: its master socket accepts and never answers.
    haproxies[2].kill();
    let hole = BlackHole::bind(&haproxies[2].master_path());
    let v2 = render(next.port);
    let v3 = render(app.port);
    harness.schedule(&v2, &names);
    // Each healthy instance takes v2, then v3 (scheduled as soon as both ran v2), at
    // runtime, while local-2's first attempt is still hanging: nothing waits for it.
    let mut seen: Vec<(
        String,
        Option<DeployStrategy>,
        hapwright_eventbus::model::ContentHash,
    )> = Vec::new();
    let mut v3_sent = false;
    while seen
        .iter()
        .filter(|(_, outcome, hash)| outcome.is_some() && *hash == v3.hash())
        .count()
        < 2
    {
        let event = harness
            .next(Duration::from_secs(30), |e| match &e.payload {
                EventPayload::InstanceDeployed(d) => {
                    Some((d.instance.clone(), Some(d.strategy), d.hash))
                }
                EventPayload::InstanceDeploymentFailed(f) => {
                    Some((f.instance.clone(), None, f.hash))
                }
                _ => None,
            })
            .await;
        assert!(
            event.1.is_some(),
            "local-2 failed before the others were done: {seen:?} then {event:?}"
        );
        assert_eq!(event.1, Some(DeployStrategy::Runtime), "{event:?}");
        seen.push(event);
        let on_v2 = seen.iter().filter(|(_, _, h)| *h == v2.hash()).count();
        if on_v2 == 2 && !v3_sent {
            harness.schedule(&v3, &names);
            v3_sent = true;
        }
    }
    let mut instances: Vec<&str> = seen.iter().map(|(n, ..)| n.as_str()).collect();
    instances.sort_unstable();
    assert_eq!(instances, ["local-0", "local-0", "local-1", "local-1"]);
    // Then the hanging instance's attempts time out and are reported.
    let failed = harness
        .next(Duration::from_secs(30), |e| match &e.payload {
            EventPayload::InstanceDeploymentFailed(f) => Some(f.instance.clone()),
            _ => None,
        })
        .await;
    assert_eq!(failed, "local-2");
    for haproxy in &haproxies[..2] {
        assert_eq!(
            store
                .deployed(&haproxy.instance.name)
                .unwrap()
                .config
                .hash(),
            v3.hash()
        );
    }

    // It comes back: the worker's retry brings it to the newest config.
    drop(hole);
    let _ = std::fs::remove_file(haproxies[2].master_path());
    haproxies[2].restart().await;
    let caught_up = harness
        .next(Duration::from_secs(30), |e| match &e.payload {
            EventPayload::InstanceDeployed(d) if d.instance == "local-2" => Some(d.hash),
            _ => None,
        })
        .await;
    assert_eq!(caught_up, v3.hash());
    assert_eq!(store.deployed("local-2").unwrap().config.hash(), v3.hash());
    harness.stop().await;
}

/// The outcome of discovering one Data Plane API server under a non-loopback name
/// (`pod-remote.hapwright.test`, pinned to the server's 127.0.0.1 port by the
/// client's resolver, so only the name decides) and one on 127.0.0.1, both over
/// plain http, after a config with a certificate was scheduled.
struct HttpDiscovery {
    remote: DataplaneServer,
    local: DataplaneServer,
    metrics: Metrics,
    succeeded: Vec<String>,
    failures: BTreeMap<String, String>,
    config: Arc<RenderedConfig>,
}

async fn discover_over_http(allow_insecure_http: bool) -> HttpDiscovery {
    const REMOTE: &str = "pod-remote.hapwright.test";
    let (remote, local) = (
        DataplaneServer::start("global\n").await,
        DataplaneServer::start("global\n").await,
    );
    let remote_addr: std::net::SocketAddr =
        remote.url.trim_start_matches("http://").parse().unwrap();
    let metrics = Metrics::unregistered().unwrap();
    let deployer = Deployer::with_drivers(
        fast_config(),
        BTreeMap::new(),
        LastDeployedStore::new(),
        None,
        metrics.clone(),
    )
    .with_discovery(DiscoveredCredentials {
        username: USER.to_owned(),
        password: Secret::new(PASSWORD),
        ca_file: None,
        scheme: "http".to_owned(),
        allow_insecure_http,
        server_name: None,
        resolve: vec![(REMOTE.to_owned(), remote_addr)],
        settings: fast_settings(),
    });
    let mut harness = Harness::start(|kernel| {
        kernel.register(deployer);
    });
    let config = rendered_with(
        "global\n    maxconn 100\n",
        &[],
        &[(
            "site.pem",
            "-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n",
        )],
    );
    harness.schedule(&config, &[]);
    harness.completed().await;
    let pod = |name: &str, address: String| InstanceRef {
        name: name.to_owned(),
        driver: InstanceDriver::Dataplane,
        address,
    };
    harness.publisher.publish(InstancesDiscovered {
        source: Arc::from("kubernetes"),
        instances: Arc::from(vec![
            pod("pod-local", local.url.clone()),
            // As the pod watcher builds it: no scheme, the credentials' one applies.
            pod("pod-remote", format!("{REMOTE}:{}", remote_addr.port())),
        ]),
    });
    let mut failures = BTreeMap::new();
    let succeeded = loop {
        let event = harness
            .next(Duration::from_secs(30), |e| match &e.payload {
                EventPayload::InstanceDeploymentFailed(f) => {
                    Some(Err((f.instance.clone(), f.error.message.clone())))
                }
                EventPayload::DeploymentCompleted(done) => Some(Ok(done.summary.succeeded.clone())),
                _ => None,
            })
            .await;
        match event {
            Err((instance, message)) => {
                failures.insert(instance, message);
            }
            Ok(succeeded) => break succeeded,
        }
    };
    harness.stop().await;
    HttpDiscovery {
        remote,
        local,
        metrics,
        succeeded,
        failures,
        config,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_instance_across_the_network_is_refused_and_gets_nothing() {
    let run = discover_over_http(false).await;
    // The refused instance never saw a request: no password, no certificate.
    assert_eq!(run.remote.state().log, Vec::<String>::new());
    assert!(run.remote.state().storage.is_empty());
    let error = &run.failures["pod-remote"];
    assert!(
        error.contains("plain http to a non-loopback address")
            && error.contains("allowInsecureHttp: true"),
        "{error}"
    );
    assert_eq!(run.metrics.refused_count("insecure_http"), 1);
    // The others go on: the loopback instance got the config and its certificate.
    assert_eq!(run.succeeded, ["pod-local"]);
    assert!(
        run.local
            .state()
            .running_raw
            .contains(&run.config.hash().short())
    );
    assert!(run.local.state().storage["ssl_certificates"].contains_key("site.pem"));
    assert!(!run.metrics.insecure_transport("pod-local"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_instance_across_the_network_is_deployed_when_opted_in() {
    let run = discover_over_http(true).await;
    assert!(run.failures.is_empty(), "{:?}", run.failures);
    let mut succeeded = run.succeeded.clone();
    succeeded.sort();
    assert_eq!(succeeded, ["pod-local", "pod-remote"]);
    // The password was accepted (the server answers 401 otherwise) and the
    // certificate arrived.
    assert!(
        run.remote
            .state()
            .running_raw
            .contains(&run.config.hash().short())
    );
    assert!(run.remote.state().storage["ssl_certificates"].contains_key("site.pem"));
    assert!(run.metrics.insecure_transport("pod-remote"));
    assert!(!run.metrics.insecure_transport("pod-local"));
    assert_eq!(run.metrics.refused_count("insecure_http"), 0);
}
