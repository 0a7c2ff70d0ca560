//! The scheduler's safety valve under paused time: a config that would remove too
//! much of the running one is held; the drop persisting for `confirmAfter`, an
//! approval or the sources coming back release it.

use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::component::scheduler::{Config, Scheduler};
use hapwright_deployer::safety::{self, MaxRemoval, Memory};
use hapwright_eventbus::model::RenderedConfig;
use hapwright_eventbus::{
    Bus, BusConfig, BusMetrics, EventKind, EventPayload, HealthState, Kernel, Publisher,
    RunningKernel, SafetyValveApproved, SafetyValveHeld, SafetyValveReleased, Subscription,
    ValidationCompleted,
};
use prometheus::Registry;
use tokio::time::timeout;

/// `backends` backends of two servers each, plus the routes to them in a map.
fn config(backends: usize) -> Arc<RenderedConfig> {
    let mut main = String::from("frontend http\n    bind :80\n");
    let mut map = String::new();
    for b in 0..backends {
        main.push_str(&format!(
            "backend be_{b}\n    server a 10.0.0.{b}:80\n    server b 10.0.1.{b}:80\n"
        ));
        map.push_str(&format!("host{b}.test be_{b}\n"));
    }
    Arc::new(RenderedConfig::builder(main).map("hosts.map", map).build())
}

fn settings(max_removal: MaxRemoval) -> safety::Config {
    safety::Config {
        max_removal,
        confirm_after: Duration::from_secs(300).into(),
    }
}

struct Harness {
    kernel: RunningKernel,
    scheduled: Subscription,
    valve: Subscription,
    publisher: Publisher,
}

fn start(safety: safety::Config, memory: Memory) -> Harness {
    let registry = Registry::new();
    let bus = Bus::new(
        BusConfig::default(),
        &BusMetrics::register(&registry).unwrap(),
    );
    let scheduler = Scheduler::new(
        Config {
            min_deployment_interval: Duration::from_millis(100),
        },
        vec!["local".to_owned()],
    )
    .with_safety(safety, memory);
    let scheduled = bus
        .subscribe("test", [EventKind::DeploymentScheduled])
        .unwrap();
    let valve = bus
        .subscribe(
            "test-valve",
            [EventKind::SafetyValveHeld, EventKind::SafetyValveReleased],
        )
        .unwrap();
    let publisher = bus.publisher();
    let mut kernel = Kernel::new(bus);
    kernel.register(scheduler);
    Harness {
        kernel: kernel.start().unwrap(),
        scheduled,
        valve,
        publisher,
    }
}

impl Harness {
    fn validated(&self, config: &Arc<RenderedConfig>) {
        self.publisher.publish(ValidationCompleted {
            model: hapwright_eventbus::model::haproxy::parse_main(config)
                .expect("the test config parses"),
            config: config.clone(),
            duration: Duration::ZERO,
            warnings: Vec::new(),
            phase2_skipped: None,
        });
    }

    async fn deployed(&mut self) -> Arc<RenderedConfig> {
        let event = timeout(Duration::from_secs(600), self.scheduled.recv())
            .await
            .expect("a deployment is scheduled")
            .expect("bus open");
        let EventPayload::DeploymentScheduled(scheduled) = &event.payload else {
            panic!("unexpected event {event:?}");
        };
        scheduled.config.clone()
    }

    async fn nothing_deployed_within(&mut self, window: Duration) {
        if let Ok(event) = timeout(window, self.scheduled.recv()).await {
            panic!("nothing should be scheduled, got {event:?}");
        }
    }

    async fn held(&mut self) -> SafetyValveHeld {
        let event = timeout(Duration::from_secs(600), self.valve.recv())
            .await
            .expect("the valve reports")
            .expect("bus open");
        match &event.payload {
            EventPayload::SafetyValveHeld(held) => held.clone(),
            _ => panic!("expected a hold, got {event:?}"),
        }
    }

    async fn released(&mut self) -> SafetyValveReleased {
        let event = timeout(Duration::from_secs(600), self.valve.recv())
            .await
            .expect("the valve reports")
            .expect("bus open");
        match &event.payload {
            EventPayload::SafetyValveReleased(released) => released.clone(),
            _ => panic!("expected a release, got {event:?}"),
        }
    }

    fn scheduler_health(&self) -> (HealthState, String) {
        let health = self.kernel.health().get(Scheduler::NAME).unwrap();
        (health.state, health.reason.unwrap_or_default())
    }

    async fn stop(self) {
        self.kernel.shutdown(Duration::from_secs(5)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_large_drop_is_held_until_it_has_lasted_confirm_after() {
    let mut h = start(settings(MaxRemoval::Percent(50)), Memory::new());
    let running = config(4);
    h.validated(&running);
    assert_eq!(h.deployed().await.hash(), running.hash());

    // Three of four backends go: held, the running config stays.
    let shrunk = config(1);
    h.validated(&shrunk);
    let held = h.held().await;
    assert_eq!(held.hash, shrunk.hash());
    assert_eq!(
        held.removal.to_string(),
        "would remove 3 of 4 backends (75%), 6 of 8 servers (75%), 3 of 4 map entries (75%)"
    );
    assert_eq!(held.removal.removed_backends, ["be_1", "be_2", "be_3"]);
    assert_eq!(held.max_removal, "50%");
    assert_eq!(
        held.release_at.duration_since(held.since).unwrap(),
        Duration::from_secs(300)
    );
    let (state, reason) = h.scheduler_health();
    assert_eq!(state, HealthState::Degraded);
    assert!(
        reason.contains("would remove 3 of 4 backends (75%)") && reason.contains("/-/approve"),
        "{reason}"
    );
    h.nothing_deployed_within(Duration::from_secs(200)).await;

    // Still dropping later on: the timer runs from the first held config, and the
    // newest held config is what goes out.
    let empty = config(0);
    h.validated(&empty);
    let again = h.held().await;
    assert_eq!(again.hash, empty.hash());
    assert_eq!(again.since, held.since);
    h.nothing_deployed_within(Duration::from_secs(90)).await;

    let out = h.deployed().await;
    assert_eq!(out.hash(), empty.hash());
    let released = h.released().await;
    assert_eq!(
        (released.hash, released.reason),
        (empty.hash(), "confirmed")
    );
    assert_eq!(h.scheduler_health().0, HealthState::Healthy);

    // The emptied config is the new baseline: a later one is measured against it.
    let back = config(2);
    h.validated(&back);
    assert_eq!(h.deployed().await.hash(), back.hash());
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_approval_releases_the_held_config_at_once() {
    let mut h = start(settings(MaxRemoval::Percent(50)), Memory::new());
    h.validated(&config(3));
    h.deployed().await;
    // An approval with nothing held does nothing.
    h.publisher.publish(SafetyValveApproved { hash: None });
    h.nothing_deployed_within(Duration::from_secs(1)).await;

    let empty = config(0);
    h.validated(&empty);
    h.held().await;
    h.nothing_deployed_within(Duration::from_secs(10)).await;
    h.publisher.publish(SafetyValveApproved {
        hash: Some(empty.hash()),
    });
    assert_eq!(h.deployed().await.hash(), empty.hash());
    let released = h.released().await;
    assert_eq!(released.reason, "approved");
    assert_eq!(h.scheduler_health().0, HealthState::Healthy);
    // Nothing else goes out when confirmAfter would have passed.
    h.nothing_deployed_within(Duration::from_secs(400)).await;
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn sources_coming_back_drop_the_hold() {
    let mut h = start(settings(MaxRemoval::Percent(50)), Memory::new());
    let running = config(4);
    h.validated(&running);
    h.deployed().await;
    h.validated(&config(0));
    h.held().await;

    // The same config as before comes back: the hold ends, and nothing needs
    // deploying since the instances run it.
    h.validated(&running);
    let released = h.released().await;
    assert_eq!(
        (released.hash, released.reason),
        (running.hash(), "recovered")
    );
    assert_eq!(h.scheduler_health().0, HealthState::Healthy);
    h.nothing_deployed_within(Duration::from_secs(400)).await;

    // A small change within the limit goes out as usual.
    let smaller = config(3);
    h.validated(&smaller);
    assert_eq!(h.deployed().await.hash(), smaller.hash());
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_first_config_is_never_held_and_off_holds_nothing() {
    let mut h = start(settings(MaxRemoval::Percent(10)), Memory::new());
    // Nothing ran before: even an empty config goes out.
    let empty = config(0);
    h.validated(&empty);
    assert_eq!(h.deployed().await.hash(), empty.hash());
    h.stop().await;

    let mut h = start(settings(MaxRemoval::Off), Memory::new());
    h.validated(&config(4));
    h.deployed().await;
    h.validated(&empty);
    assert_eq!(h.deployed().await.hash(), empty.hash());
    assert_eq!(h.scheduler_health().0, HealthState::Healthy);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_baseline_and_the_hold_survive_a_new_scheduler() {
    // A controller config reload builds a new scheduler: with the process-wide
    // memory, its first config is still measured against what runs.
    let memory = Memory::new();
    let mut h = start(settings(MaxRemoval::Percent(50)), memory.clone());
    h.validated(&config(4));
    h.deployed().await;
    h.validated(&config(0));
    let first = h.held().await;
    h.stop().await;

    tokio::time::advance(Duration::from_secs(100)).await;
    let mut h = start(settings(MaxRemoval::Percent(50)), memory);
    h.validated(&config(0));
    let held = h.held().await;
    assert_eq!(held.since, first.since, "the hold keeps its start");
    h.nothing_deployed_within(Duration::from_secs(150)).await;
    // Confirmed 300 s after the first hold, not after the reload.
    assert_eq!(h.deployed().await.hash(), config(0).hash());
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn turning_the_valve_off_ends_a_hold_from_before_the_reload() {
    let memory = Memory::new();
    let mut h = start(settings(MaxRemoval::Percent(50)), memory.clone());
    h.validated(&config(4));
    h.deployed().await;
    h.validated(&config(0));
    h.held().await;
    h.stop().await;

    let mut h = start(settings(MaxRemoval::Off), memory);
    h.validated(&config(0));
    assert_eq!(h.deployed().await.hash(), config(0).hash());
    let released = h.released().await;
    assert_eq!(released.reason, "disabled");
    assert_eq!(h.scheduler_health().0, HealthState::Healthy);
    h.stop().await;
}
