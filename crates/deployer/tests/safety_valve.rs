//! The scheduler's safety valve under paused time: a config that would remove too
//! much of the running one is held; the drop persisting for `confirmAfter`, an
//! approval or the sources coming back release it.

mod support;

use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::component::scheduler::{Config, Scheduler};
use hapwright_deployer::safety::{self, MaxRemoval, Memory};
use hapwright_eventbus::model::RenderedConfig;
use hapwright_eventbus::testing::TestBus;
use hapwright_eventbus::{
    EventKind, EventPayload, HealthState, Publisher, RunningKernel, SafetyValveApproved,
    SafetyValveHeld, SafetyValveReleased, Subscription,
};
use support::counts;
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
    let bus = TestBus::new();
    let scheduler = Scheduler::new(
        Config {
            min_deployment_interval: Duration::from_millis(100),
        },
        vec!["local".to_owned()],
    )
    .with_safety(safety, memory);
    let scheduled = bus.subscribe("test", [EventKind::DeploymentScheduled]);
    let valve = bus.subscribe(
        "test-valve",
        [EventKind::SafetyValveHeld, EventKind::SafetyValveReleased],
    );
    let publisher = bus.publisher();
    Harness {
        kernel: bus.start_one(scheduler),
        scheduled,
        valve,
        publisher,
    }
}

impl Harness {
    fn validated(&self, config: &Arc<RenderedConfig>) {
        self.publisher.publish(support::validated(config));
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
    // What goes out meanwhile is the render with the removed backends, servers and
    // map entries kept: the instances keep serving all four.
    let kept = h.deployed().await;
    assert_ne!(kept.hash(), shrunk.hash());
    assert_eq!(counts(&kept), (4, 8, 4));
    assert!(kept.main().contains(safety::KEPT_HEADER), "{}", kept.main());
    h.nothing_deployed_within(Duration::from_secs(200)).await;

    // Still dropping later on: the timer runs from the first held config, and the
    // newest held config is what goes out.
    let empty = config(0);
    h.validated(&empty);
    let again = h.held().await;
    assert_eq!(again.hash, empty.hash());
    assert_eq!(again.since, held.since);
    assert_eq!(counts(&*h.deployed().await), (4, 8, 4));
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
    assert_eq!(counts(&*h.deployed().await), (3, 6, 3));
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
    assert_eq!(counts(&*h.deployed().await), (4, 8, 4));

    // The same config as before comes back: the hold ends, and it goes out in place
    // of the config with the kept sections appended.
    h.validated(&running);
    let released = h.released().await;
    assert_eq!(
        (released.hash, released.reason),
        (running.hash(), "recovered")
    );
    assert_eq!(h.scheduler_health().0, HealthState::Healthy);
    assert_eq!(h.deployed().await.hash(), running.hash());
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
    assert_eq!(counts(&*h.deployed().await), (4, 8, 4));
    h.stop().await;

    tokio::time::advance(Duration::from_secs(100)).await;
    let mut h = start(settings(MaxRemoval::Percent(50)), memory);
    h.validated(&config(0));
    let held = h.held().await;
    assert_eq!(held.since, first.since, "the hold keeps its start");
    // The new scheduler knows of no release yet: the kept config goes out once more.
    assert_eq!(counts(&*h.deployed().await), (4, 8, 4));
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

/// Every deployment scheduled until none comes for a (paused) minute.
async fn drain(subscription: &mut Subscription) -> Vec<Arc<hapwright_eventbus::Event>> {
    let mut events = Vec::new();
    while let Ok(Some(event)) = timeout(Duration::from_secs(60), subscription.recv()).await {
        events.push(event);
    }
    events
}

#[tokio::test(start_paused = true)]
async fn a_removal_arriving_as_a_stream_is_held_whole() {
    let mut h = start(settings(MaxRemoval::Percent(50)), Memory::new());
    h.validated(&config(10));
    h.deployed().await;

    // Ten backends go one after another, 10 ms apart: each render removes one more
    // than the last deployed one.
    for left in (0..10).rev() {
        h.validated(&config(left));
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    let scheduled = drain(&mut h.scheduled).await;
    let last = scheduled.last().expect("deployments");
    let EventPayload::DeploymentScheduled(last) = &last.payload else {
        panic!("{last:?}");
    };
    // Measured against the high-water mark, the stream is one removal: held whole,
    // and what runs in the end serves all ten again.
    assert_eq!(counts(&last.config), (10, 20, 10));
    let valve = drain(&mut h.valve).await;
    let Some(EventPayload::SafetyValveHeld(held)) = valve.last().map(|e| &e.payload) else {
        panic!("the valve holds: {valve:?}");
    };
    assert_eq!(held.hash, config(0).hash());
    assert_eq!(
        held.removal.to_string(),
        "would remove 10 of 10 backends (100%), 20 of 20 servers (100%), 10 of 10 map entries (100%)"
    );
    assert_eq!(h.scheduler_health().0, HealthState::Degraded);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_shrink_over_longer_than_the_window_goes_out_by_itself() {
    let mut h = start(settings(MaxRemoval::Percent(50)), Memory::new());
    h.validated(&config(10));
    h.deployed().await;
    // One backend every 100 s, down to half of them and beyond: within any 300 s
    // (confirmAfter) no more than 3 of 7 go.
    for left in (3..10).rev() {
        tokio::time::advance(Duration::from_secs(100)).await;
        let next = config(left);
        h.validated(&next);
        assert_eq!(h.deployed().await.hash(), next.hash(), "{left} backends");
    }
    assert!(
        drain(&mut h.valve).await.is_empty(),
        "the valve never held a slow shrink"
    );
    assert_eq!(h.scheduler_health().0, HealthState::Healthy);

    // The same steps 10 s apart are a stream: held once the window lost more than
    // half of what it served.
    let mut h = start(settings(MaxRemoval::Percent(50)), Memory::new());
    h.validated(&config(10));
    h.deployed().await;
    for left in (3..10).rev() {
        tokio::time::advance(Duration::from_secs(10)).await;
        h.validated(&config(left));
    }
    let held = h.held().await;
    assert_eq!(held.removal.backends.total, 10);
    h.stop().await;
}

/// The tenants `keep` of be_0 to be_3 with their hosts, plus `extra` sections and
/// `extra_map` entries; `replaced_pod` gives be_0's first server a new address.
fn tenants(
    keep: &[usize],
    extra: &str,
    extra_map: &str,
    replaced_pod: bool,
) -> Arc<RenderedConfig> {
    let mut main = String::from("frontend http\n    bind :80\n");
    let mut map = String::new();
    for &b in keep {
        let first = if replaced_pod && b == 0 {
            "10.9.9.9".to_owned()
        } else {
            format!("10.0.0.{b}")
        };
        main.push_str(&format!(
            "backend be_{b}\n    server a {first}:80\n    server b 10.0.1.{b}:80\n"
        ));
        map.push_str(&format!("host{b}.test be_{b}\n"));
    }
    main.push_str(extra);
    map.push_str(extra_map);
    Arc::new(RenderedConfig::builder(main).map("hosts.map", map).build())
}

#[tokio::test(start_paused = true)]
async fn a_held_removal_holds_back_only_what_it_removes() {
    let mut h = start(settings(MaxRemoval::Percent(50)), Memory::new());
    h.validated(&tenants(&[0, 1, 2, 3], "", "", false));
    h.deployed().await;

    // Tenants 1 to 3 vanish; meanwhile another tenant adds a host and tenant 0's
    // first pod is replaced.
    let desired = tenants(
        &[0],
        "backend be_new\n    server n 10.0.2.1:80\n",
        "new.test be_new\n",
        true,
    );
    h.validated(&desired);
    let held = h.held().await;
    assert_eq!(held.hash, desired.hash());
    assert_eq!(held.removal.removed_backends, ["be_1", "be_2", "be_3"]);
    let out = h.deployed().await;
    assert_eq!(counts(&out), (5, 9, 5));
    let main = out.main();
    // The new host and the replaced pod are live ...
    assert!(main.contains("backend be_new"), "{main}");
    assert!(main.contains("server a 10.9.9.9:80"), "{main}");
    assert!(
        !main.contains("10.0.0.0:80"),
        "the replaced pod stays gone: {main}"
    );
    assert!(out.maps()["hosts.map"].contains("new.test be_new"));
    // ... and the removed tenants keep their backends and routes.
    for b in 1..4 {
        assert!(main.contains(&format!("backend be_{b}\n")), "{main}");
        assert!(out.maps()["hosts.map"].contains(&format!("host{b}.test be_{b}")));
    }
    hapwright_deployer::haproxy::config::parse(main).expect("the kept config parses");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_held_removal_survives_a_restart_through_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let memory = Memory::new();
    memory.keep_in(vec![dir.path().to_owned()]);
    let mut h = start(settings(MaxRemoval::Percent(50)), memory);
    h.validated(&config(4));
    h.deployed().await;
    assert!(!dir.path().join(safety::VALVE_RECORD_FILE).exists());
    h.validated(&config(0));
    let first = h.held().await;
    h.deployed().await;
    let record = safety::ValveRecord::read(dir.path())
        .unwrap()
        .expect("a record");
    assert_eq!(record.held_since, first.since);
    h.stop().await;

    // A new process: an empty memory reading the record back. Its first render is
    // measured against the recorded high-water mark, not taken as the first one.
    let memory = Memory::new();
    memory.keep_in(vec![dir.path().to_owned()]);
    let mut h = start(settings(MaxRemoval::Percent(50)), memory.clone());
    h.validated(&config(0));
    let held = h.held().await;
    assert_eq!(held.since, first.since, "the hold keeps its start");
    assert_eq!(counts(&*h.deployed().await), (4, 8, 4));

    // The sources come back: the hold ends and so does the record.
    h.validated(&config(4));
    assert_eq!(h.released().await.reason, "recovered");
    assert!(!dir.path().join(safety::VALVE_RECORD_FILE).exists());
    h.stop().await;

    // Held again, then confirmed by time after another restart.
    let mut h = start(settings(MaxRemoval::Percent(50)), memory);
    h.validated(&config(0));
    h.held().await;
    h.stop().await;
    let memory = Memory::new();
    memory.keep_in(vec![dir.path().to_owned()]);
    let mut h = start(settings(MaxRemoval::Percent(50)), memory);
    h.validated(&config(0));
    h.held().await;
    assert_eq!(counts(&*h.deployed().await), (4, 8, 4));
    assert_eq!(h.deployed().await.hash(), config(0).hash());
    assert_eq!(h.released().await.reason, "confirmed");
    assert!(!dir.path().join(safety::VALVE_RECORD_FILE).exists());
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_unreadable_record_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(safety::VALVE_RECORD_FILE), b"{not json").unwrap();
    let memory = Memory::new();
    memory.keep_in(vec![dir.path().to_owned()]);
    let mut h = start(settings(MaxRemoval::Percent(50)), memory);
    // Nothing is known: the first render is the first one.
    let empty = config(0);
    h.validated(&empty);
    assert_eq!(h.deployed().await.hash(), empty.hash());
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_window_keeps_only_configs_that_raise_the_mark() {
    let memory = Memory::new();
    let mut h = start(settings(MaxRemoval::Percent(50)), memory.clone());
    // Renders that remove nothing (the same backends, or more) replace each other.
    for backends in [4, 5, 6] {
        h.validated(&config(backends));
        h.deployed().await;
    }
    h.validated(&config(6));
    h.nothing_deployed_within(Duration::from_secs(1)).await;
    assert_eq!(memory.window_len(), 1);
    // A shrink keeps the larger configs it is measured against ...
    h.validated(&config(5));
    h.deployed().await;
    h.validated(&config(4));
    h.deployed().await;
    assert_eq!(memory.window_len(), 3);
    // ... until the kept config of a hold covers them all.
    h.validated(&config(1));
    h.held().await;
    assert_eq!(counts(&*h.deployed().await), (6, 12, 6));
    assert_eq!(memory.window_len(), 1);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_record_that_cannot_be_written_leaves_the_hold_in_memory() {
    // The "directory" is a file: every write of the record fails.
    let file = tempfile::NamedTempFile::new().unwrap();
    let memory = Memory::new();
    memory.keep_in(vec![file.path().to_owned()]);
    let mut h = start(settings(MaxRemoval::Percent(50)), memory);
    h.validated(&config(4));
    h.deployed().await;
    h.validated(&config(0));
    // Held and kept as usual, from memory.
    h.held().await;
    assert_eq!(counts(&*h.deployed().await), (4, 8, 4));
    assert_eq!(h.scheduler_health().0, HealthState::Degraded);
    h.validated(&config(4));
    assert_eq!(h.released().await.reason, "recovered");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_kept_config_that_fails_the_checks_lets_nothing_out() {
    let mut h = start(settings(MaxRemoval::Percent(50)), Memory::new());
    let listens = |names: &[&str], extra: &str| {
        let mut main = String::new();
        for name in names {
            main.push_str(&format!(
                "listen {name}\n    bind :80{}\n    server a 10.0.0.1:80\n",
                name.len()
            ));
        }
        main.push_str(extra);
        Arc::new(RenderedConfig::main_only(main))
    };
    h.validated(&listens(&["l1", "l22", "l333"], ""));
    h.deployed().await;
    // The render drops every listen and adds a frontend named like one of them:
    // putting `listen l1` back would clash with it.
    let desired = listens(&[], "frontend l1\n    bind :9000\n");
    h.validated(&desired);
    let held = h.held().await;
    assert_eq!(held.hash, desired.hash());
    h.nothing_deployed_within(Duration::from_secs(200)).await;
    let (state, reason) = h.scheduler_health();
    assert_eq!(state, HealthState::Degraded);
    assert!(
        reason.contains("nothing of it goes out") && reason.contains("l1"),
        "{reason}"
    );
    // Confirmed by time, the render itself goes out.
    assert_eq!(h.deployed().await.hash(), desired.hash());
    h.stop().await;
}
