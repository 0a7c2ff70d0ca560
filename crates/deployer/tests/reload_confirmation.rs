//! A reload is confirmed the way the instance's HAProxy line offers it, on every
//! supported line (scripts/test.sh runs this file with 2.6, 3.0, 3.2 and 3.4 first on
//! `PATH`): from 2.7 on by the master CLI's answer to `reload` (`Success=1`, or
//! `Success=0` with the startup log's ALERT lines), on 2.6 by the `show proc` reload
//! counter. No reload is ever sent twice, and none waits out a timeout: a managed
//! start is ready once its worker answers, and instances whose worker is still
//! loading when the controller first talks to them (3.1 and later list it early) get
//! a runtime change at runtime, also while another instance hangs.

mod support;

use hapwright_deployer::Driver;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hapwright_deployer::driver::managed::ManagedHaproxy;
use hapwright_deployer::driver::{ConfirmedBy, DeployError, DriverConfig, SocketDriver};
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::EventPayload;
use hapwright_eventbus::model::{DeployStrategy, ReloadReason, RenderedConfig};
use hapwright_eventbus::testing::TestBus;
use support::{
    Backend, BlackHole, Haproxy, StopOnDrop, config, free_port, haproxy_line, rendered,
    wait_for_body,
};
use tokio::time::timeout;

/// The confirmation the line of the `haproxy` on `PATH` offers.
fn expected_confirmation() -> ConfirmedBy {
    if haproxy_line().reload_answers() {
        ConfirmedBy::Answer
    } else {
        ConfirmedBy::Counter
    }
}

/// A reload timeout far beyond anything a confirmed reload takes here, and a lost
/// reload noticed only after it: a test that passes did not wait either out.
fn patient() -> DriverConfig {
    DriverConfig {
        reload_timeout: Duration::from_secs(60),
        lost_reload_after: Duration::from_secs(60),
        ..DriverConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_start_and_its_reloads_are_confirmed_the_way_the_line_offers() {
    let line = haproxy_line();
    let expected = expected_confirmation();
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let managed = ManagedHaproxy::with_config("haproxy", support::quick_supervisor());
    let _guard = StopOnDrop(managed.clone());
    let port = free_port();
    let mut dir = Haproxy::dir_only("local");
    dir.instance.managed = true;
    let driver = SocketDriver::new(
        dir.instance.clone(),
        Some(managed.clone()),
        Metrics::unregistered().unwrap(),
    )
    .with_config(patient());
    let server = |backend: &Backend, extra: &str| {
        format!(
            "backend be_app\n    balance roundrobin\n{extra}    server s1 127.0.0.1:{}\n",
            backend.port
        )
    };
    let v1 = rendered(&config(port, &server(&a, "")), &[("hosts.map", "")]);

    // The start is the first deployment: the worker runs the written version as soon
    // as the supervisor calls it ready, so no reload follows it.
    let started = Instant::now();
    let running = timeout(
        Duration::from_secs(30),
        driver.deploy(v1.clone(), None, None, false),
    )
    .await
    .expect("the start is deployed")
    .unwrap();
    let start_took = started.elapsed();
    assert_eq!(running.reason.reload, Some(ReloadReason::FirstDeploy));
    assert_eq!(
        driver.last_reload(),
        None,
        "HAProxy {line}: the managed start needed a reload ({})",
        running.reason.detail
    );
    wait_for_body(port, "app.test", "a").await;

    // A structural change reloads, confirmed as the line offers, sent once.
    let v2 = rendered(
        &config(port, &server(&b, "    option forwardfor\n")),
        &[("hosts.map", "")],
    );
    let running = driver
        .deploy(v2, None, Some(Arc::new(running)), false)
        .await
        .unwrap();
    assert_eq!(running.strategy, DeployStrategy::Reload);
    let reload = driver.last_reload().expect("a reload");
    assert_eq!(reload.version, Some(line));
    assert_eq!(reload.by, expected, "HAProxy {line}: {reload:?}");
    assert_eq!(reload.resent, 0, "HAProxy {line}: {reload:?}");
    assert!(reload.succeeded);
    wait_for_body(port, "app.test", "b").await;

    // A config HAProxy refuses (its port is held by a plain socket: HAProxy binds
    // with SO_REUSEPORT) fails with the ALERT lines, from the answer on 2.7 and
    // later, from HAProxy's output on 2.6; the old worker keeps serving.
    let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = blocker.local_addr().unwrap().port();
    let bad = rendered(
        &format!(
            "{}\nfrontend fe_clash\n    bind 127.0.0.1:{taken}\n    default_backend be_app\n",
            config(port, &server(&b, "    option forwardfor\n"))
        ),
        &[("hosts.map", "")],
    );
    let error = driver
        .deploy(bad, None, Some(Arc::new(running)), false)
        .await
        .unwrap_err();
    let DeployError::ReloadFailed { failed, alerts } = &error else {
        panic!("HAProxy {line}: unexpected error {error}");
    };
    assert!(*failed >= 1);
    assert!(
        alerts.iter().any(|l| l.contains("cannot bind socket")),
        "HAProxy {line}: {alerts:?}"
    );
    let reload = driver.last_reload().expect("a reload");
    assert_eq!(reload.by, expected, "HAProxy {line}: {reload:?}");
    assert_eq!(reload.resent, 0, "HAProxy {line}: {reload:?}");
    assert!(!reload.succeeded);
    wait_for_body(port, "app.test", "b").await;
    drop(blocker);
    eprintln!(
        "HAProxy {line}: managed start deployed in {start_took:?}; reload confirmed by {:?}",
        reload.by
    );
}

/// A backend `be_app` with one server of the given weight, reached through a unix
/// socket frontend relative to the instance's directory (no port to share).
fn weighted(app: &Backend, weight: u32) -> Arc<RenderedConfig> {
    rendered(
        &format!(
            "global\n    stats timeout 30s\n\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
frontend fe_main\n    bind unix@fe.sock\n    default_backend be_app\n\n\
backend be_app\n    balance roundrobin\n    server s1 127.0.0.1:{} weight {weight}\n",
            app.port
        ),
        &[],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freshly_started_instances_take_a_runtime_change_at_runtime_in_step() {
    let line = haproxy_line();
    let app = Backend::start("app").await;
    let v1 = weighted(&app, 1);
    let mut haproxies = Vec::new();
    for i in 0..3 {
        // Returned as soon as the master lists a worker, which may still be loading.
        haproxies.push(Haproxy::start_listed(&format!("local-{i}"), &v1, &v1.hash().short()).await);
    }
    let metrics = Metrics::unregistered().unwrap();
    let drivers: Vec<SocketDriver> = haproxies
        .iter()
        .map(|h| {
            SocketDriver::new(h.instance.clone(), None, metrics.clone()).with_config(patient())
        })
        .collect();
    let v2 = weighted(&app, 2);
    let started = Instant::now();
    let deployed = timeout(
        Duration::from_secs(30),
        futures::future::join_all(
            drivers
                .iter()
                .map(|driver| driver.deploy(v2.clone(), None, None, false)),
        ),
    )
    .await
    .expect("all three deployed");
    let took = started.elapsed();
    for (haproxy, (driver, outcome)) in haproxies.iter().zip(drivers.iter().zip(deployed)) {
        let outcome = outcome.unwrap();
        assert_eq!(
            outcome.strategy,
            DeployStrategy::Runtime,
            "HAProxy {line}, {}: {}",
            haproxy.instance.name,
            outcome.reason.detail
        );
        assert_eq!(driver.last_reload(), None, "HAProxy {line}");
        assert_eq!(haproxy.reloads().await, 0, "HAProxy {line}");
    }
    eprintln!("HAProxy {line}: a runtime change reached three fresh instances in {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_instances_take_a_runtime_change_while_another_hangs() {
    let line = haproxy_line();
    let app = Backend::start("app").await;
    let v1 = weighted(&app, 1);
    // local-2 hangs: its master socket accepts and never answers. The healthy two
    // are started last and get the change while their workers may still be loading.
    let mut hanging = Haproxy::start("local-2", &v1, &v1.hash().short()).await;
    hanging.kill();
    let _hole = BlackHole::bind(&hanging.master_path());
    let mut haproxies = Vec::new();
    for i in 0..2 {
        haproxies.push(Haproxy::start_listed(&format!("local-{i}"), &v1, &v1.hash().short()).await);
    }
    haproxies.push(hanging);
    let metrics = Metrics::unregistered().unwrap();
    let drivers: BTreeMap<String, Arc<dyn Driver>> = haproxies
        .iter()
        .map(|h| {
            (
                h.instance.name.clone(),
                Arc::new(
                    SocketDriver::new(h.instance.clone(), None, metrics.clone())
                        .with_config(patient()),
                ) as Arc<dyn Driver>,
            )
        })
        .collect();
    // As the fleet benchmark: a first attempt that waited out a lost reload would
    // fail here and show as a failure below.
    let deployer = support::fleet_deployer(drivers, metrics);
    let names = deployer.instance_names();
    let bus = TestBus::new();
    let mut events = support::deployments(&bus);
    let publisher = bus.publisher();
    let kernel = bus.start_one(deployer);

    let v2 = weighted(&app, 2);
    let started = Instant::now();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    publisher.publish(support::scheduled(&v2, &names));
    let mut healthy = Vec::new();
    timeout(Duration::from_secs(30), async {
        while healthy.len() < 2 {
            let event = events.recv().await.expect("bus open");
            if let EventPayload::InstanceDeployed(done) = &event.payload {
                assert_eq!(done.hash, v2.hash());
                assert_eq!(
                    done.strategy,
                    DeployStrategy::Runtime,
                    "HAProxy {line}, {}",
                    done.instance
                );
                healthy.push(done.instance.clone());
            }
            if let EventPayload::InstanceDeploymentFailed(failed) = &event.payload {
                assert_eq!(
                    failed.instance, "local-2",
                    "HAProxy {line}: a healthy instance failed: {}",
                    failed.error.message
                );
            }
        }
    })
    .await
    .expect("both healthy instances deployed");
    let took = started.elapsed();
    healthy.sort_unstable();
    assert_eq!(healthy, ["local-0", "local-1"]);
    for haproxy in &haproxies[..2] {
        assert_eq!(haproxy.reloads().await, 0, "HAProxy {line}");
    }
    kernel.shutdown(Duration::from_secs(10)).await;
    eprintln!(
        "HAProxy {line}: a runtime change reached the two healthy instances in {took:?} while one hangs"
    );
}
