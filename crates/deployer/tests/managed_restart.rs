//! Managed mode, starts the deployer did not cause: a managed HAProxy that comes up late
//! (its port was held during the first deployment) or is restarted by the supervisor
//! after a crash is recorded as a reload (`first_deploy` / `restart`) as soon as it is
//! ready, never as a no-op, and the store then describes the files on disk. Also: what
//! HAProxy prints while hapwright stops it is logged at INFO, not WARN.
//!
//! This binary installs a global tracing subscriber, so it holds this one test only.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hapwright_deployer::component::deployer::{self, Deployer, LastDeployedStore};
use hapwright_deployer::driver::managed::{ManagedHaproxy, SupervisorConfig};
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::model::{DeployStrategy, ReloadReason};
use hapwright_eventbus::testing::TestBus;
use hapwright_eventbus::{EventPayload, InstanceDeployed};
use support::{
    Backend, Haproxy, StopOnDrop, config, counter, next_outcome, rendered, wait_for_body,
};
use tokio::time::timeout;
use tracing::{Level, span};

/// The `haproxy` target's log events: level and message.
type Captured = Arc<Mutex<Vec<(Level, String)>>>;

/// A minimal global subscriber keeping the events of HAProxy's output.
struct Capture(Captured);

struct Message<'a>(&'a mut String);

impl tracing::field::Visit for Message<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            *self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "haproxy"
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = String::new();
        event.record(&mut Message(&mut message));
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), message));
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

/// The next `InstanceDeployed` or `InstanceDeploymentFailed`, within `bound`.
fn deployed(payload: EventPayload) -> InstanceDeployed {
    match payload {
        EventPayload::InstanceDeployed(deployed) => deployed,
        other => panic!("expected InstanceDeployed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_and_restarted_managed_haproxy_are_recorded_as_reloads() {
    let captured = Captured::default();
    tracing::subscriber::set_global_default(Capture(captured.clone())).unwrap();

    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    // HAProxy binds with SO_REUSEPORT, so the port must be held by a plain socket;
    // bound but not listening, so that HAProxy itself tries and fails (a listening
    // socket is refused by hapwright before HAProxy starts).
    let blocker = tokio::net::TcpSocket::new_v4().unwrap();
    blocker.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = blocker.local_addr().unwrap().port();
    let main = config(
        port,
        &format!(
            "backend be_app\n    server s1 127.0.0.1:{}\n\nbackend be_b\n    server s1 127.0.0.1:{}\n",
            a.port, b.port
        ),
    );
    let v1 = rendered(&main, &[("hosts.map", "")]);
    // A map change only: deployed at runtime (and written to disk).
    let v2 = rendered(&main, &[("hosts.map", "b.test be_b\n")]);

    let managed = ManagedHaproxy::with_config(
        "haproxy",
        SupervisorConfig {
            max_backoff: Duration::from_millis(200),
            ..support::quick_supervisor()
        },
    );
    let guard = StopOnDrop(managed.clone());
    let mut dir = Haproxy::dir_only("late");
    dir.instance.managed = true;

    let bus = TestBus::new();
    let registry = bus.registry().clone();
    let store = LastDeployedStore::new();
    let mut events = support::deployments(&bus);
    let publisher = bus.publisher();
    // The deployer's own retry comes far too late to explain anything below.
    let deployer = Deployer::new(
        deployer::Config {
            min_retry_delay: Duration::from_secs(120),
            max_retry_delay: Duration::from_secs(120),
            ..deployer::Config::default()
        },
        vec![dir.instance.clone()],
        store.clone(),
        Some(managed.clone()),
        Metrics::register(&registry).unwrap(),
    );
    let kernel = bus.start_one(deployer);
    let schedule = |config: Arc<hapwright_eventbus::model::RenderedConfig>| {
        support::scheduled(&config, &["late"])
    };

    // The first deployment cannot start HAProxy: its port is held.
    publisher.publish(schedule(v1.clone()));
    let first = next_outcome(&mut events, Duration::from_secs(15)).await;
    assert!(
        matches!(first, EventPayload::InstanceDeploymentFailed(_)),
        "{first:?}"
    );
    let bind_alerts = captured
        .lock()
        .unwrap()
        .iter()
        .filter(|(level, line)| *level == Level::WARN && line.contains("[ALERT]"))
        .count();
    assert!(bind_alerts > 0, "a failed start's ALERT lines are warnings");

    // Released: the supervisor's next attempt comes up, and that start is the
    // deployment, recorded as soon as HAProxy is ready.
    drop(blocker);
    let late = deployed(next_outcome(&mut events, Duration::from_secs(15)).await);
    assert_eq!(late.hash, v1.hash());
    assert_eq!(late.strategy, DeployStrategy::Reload);
    let reason = late.reason.unwrap();
    assert_eq!(reason.reload, Some(ReloadReason::FirstDeploy), "{reason:?}");
    wait_for_body(port, "app.test", "a").await;
    let record = store.get("late").unwrap();
    assert_eq!(record.reloads, 1);
    assert!(record.last_error.is_none());
    let running = record.deployed.unwrap();
    assert_eq!(running.config.hash(), v1.hash());
    assert_eq!(running.strategy, DeployStrategy::Reload);
    let reloads = |reason| {
        counter(
            &registry,
            "hapwright_reloads_total",
            &[
                ("instance", "late"),
                ("result", "success"),
                ("reason", reason),
            ],
        )
    };
    assert_eq!(reloads("first_deploy"), 1);

    // A runtime-only change.
    publisher.publish(schedule(v2.clone()));
    let runtime = deployed(next_outcome(&mut events, Duration::from_secs(15)).await);
    assert_eq!(
        (runtime.hash, runtime.strategy),
        (v2.hash(), DeployStrategy::Runtime)
    );
    wait_for_body(port, "b.test", "b").await;

    // The worker dies, the master exits (2.6) and the supervisor restarts it with
    // the files on disk: recorded as a `restart` reload of v2, whose runtime change
    // was written to disk and so survives the restart.
    let info = dir.master().show_proc().await.unwrap();
    let worker = rustix::process::Pid::from_raw(info.workers[0] as i32).unwrap();
    rustix::process::kill_process(worker, rustix::process::Signal::KILL).unwrap();
    let restarted = deployed(next_outcome(&mut events, Duration::from_secs(15)).await);
    assert_eq!(restarted.hash, v2.hash());
    assert_eq!(restarted.strategy, DeployStrategy::Reload);
    assert_eq!(
        restarted.reason.unwrap().reload,
        Some(ReloadReason::Restart)
    );
    assert_ne!(
        dir.master().show_proc().await.unwrap().master_pid,
        info.master_pid
    );
    wait_for_body(port, "b.test", "b").await;
    let record = store.get("late").unwrap();
    assert_eq!(record.reloads, 2);
    let running = record.deployed.unwrap();
    assert_eq!(running.config.hash(), v2.hash());
    assert_eq!(running.reason.reload, Some(ReloadReason::Restart));
    assert_eq!(reloads("restart"), 1);
    assert_eq!(
        counter(
            &registry,
            "hapwright_deployments_total",
            &[("instance", "late"), ("strategy", "noop")],
        ),
        0,
        "no start was mistaken for a no-op"
    );

    // A clean stop: what HAProxy prints about it is expected, not a warning.
    kernel.shutdown(Duration::from_secs(5)).await;
    let before_stop = captured.lock().unwrap().len();
    timeout(Duration::from_secs(15), managed.stop())
        .await
        .expect("stopped");
    // The output pipes may deliver the last lines just after the process exited.
    let stop_lines = timeout(Duration::from_secs(5), async {
        loop {
            let lines: Vec<(Level, String)> = captured.lock().unwrap()[before_stop..].to_vec();
            if lines
                .iter()
                .any(|(_, line)| line.contains("exited with code"))
            {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("HAProxy reports its worker's exit on stop");
    assert!(
        stop_lines.iter().all(|(level, _)| *level != Level::WARN),
        "{stop_lines:?}"
    );
    // A drain (soft stop), not a kill: the worker finishes and exits on its own.
    assert!(
        stop_lines
            .iter()
            .any(|(_, line)| line.contains("exited with code 0 (Exit)")),
        "{stop_lines:?}"
    );
    drop(guard);
}
