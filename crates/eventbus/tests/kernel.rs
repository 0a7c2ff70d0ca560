//! Kernel behaviour and bus requirement R3 (no deadlock in a publish storm
//! with cycles), with real components on a real bus.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hapwright_eventbus::{
    Bus, BusConfig, BusMetrics, Component, ComponentError, Context, DriftDetected, EventKind,
    EventPayload, HealthState, Interest, Kernel, KernelError, KernelMetrics, KindSet,
    ResourceSyncComplete, RestartBackoff,
};
use prometheus::Registry;
use tokio::time::timeout;

fn new_bus(capacity: usize) -> (Bus, Registry) {
    let registry = Registry::new();
    let metrics = BusMetrics::register(&registry).unwrap();
    let bus = Bus::new(
        BusConfig {
            pipeline_capacity: capacity,
            observer_capacity: 1024,
            ..BusConfig::default()
        },
        &metrics,
    );
    (bus, registry)
}

/// What a [`Probe`] does once started.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Waits for cancellation.
    Idle,
    /// Returns an error at once.
    Fail,
    /// Panics at once.
    Panic,
    /// Ignores cancellation forever.
    Stubborn,
    /// Walks through health states, then idles.
    Flapping,
    /// Runs this long, then returns an error.
    FailAfter(Duration),
}

/// A configurable test component that records when the kernel asks for its interest.
struct Probe {
    name: String,
    behaviour: Behaviour,
    mandatory: bool,
    log: Arc<Mutex<Vec<String>>>,
}

impl Probe {
    fn new(name: &str, log: &Arc<Mutex<Vec<String>>>) -> Self {
        Self {
            name: name.into(),
            behaviour: Behaviour::Idle,
            mandatory: true,
            log: log.clone(),
        }
    }

    fn behaving(mut self, behaviour: Behaviour) -> Self {
        self.behaviour = behaviour;
        self
    }

    fn optional(mut self) -> Self {
        self.mandatory = false;
        self
    }
}

#[async_trait::async_trait]
impl Component for Probe {
    fn name(&self) -> &str {
        &self.name
    }

    fn mandatory(&self) -> bool {
        self.mandatory
    }

    fn consumes(&self) -> Interest {
        self.log.lock().unwrap().push(self.name.clone());
        Interest::none()
    }

    async fn run(self: Box<Self>, ctx: Context) -> Result<(), ComponentError> {
        match self.behaviour {
            Behaviour::Idle => {
                ctx.cancelled().await;
                Ok(())
            }
            Behaviour::Fail => Err("backend unreachable".into()),
            Behaviour::Panic => panic!("boom in {}", self.name),
            Behaviour::Stubborn => loop {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            },
            Behaviour::Flapping => {
                ctx.health().unhealthy("directory ./resources is missing");
                ctx.health().unhealthy("directory ./resources is missing");
                ctx.health().healthy();
                ctx.cancelled().await;
                Ok(())
            }
            Behaviour::FailAfter(after) => {
                tokio::select! {
                    () = ctx.cancelled() => Ok(()),
                    () = tokio::time::sleep(after) => Err("lost the watch stream".into()),
                }
            }
        }
    }
}

fn log() -> Arc<Mutex<Vec<String>>> {
    Arc::new(Mutex::new(Vec::new()))
}

#[tokio::test]
async fn components_start_in_registration_order() {
    let (bus, _registry) = new_bus(64);
    let calls = log();
    let mut kernel = Kernel::new(bus);
    kernel
        .register(Probe::new("deployer", &calls))
        .register(Probe::new("validator", &calls))
        .register(Probe::new("status", &calls))
        .register(Probe::new("renderer", &calls));
    let running = kernel.start().unwrap();
    let expected = ["deployer", "validator", "status", "renderer"];
    assert_eq!(running.order(), expected);
    assert_eq!(
        *calls.lock().unwrap(),
        expected,
        "interests are taken in registration order"
    );
    let report = running.shutdown(Duration::from_secs(5)).await;
    assert_eq!(report.stopped.len(), 4);
    assert!(report.aborted.is_empty());
}

/// Consumes `ResourceSyncComplete` through its interest set and records the sources.
struct Listener {
    seen: Arc<Mutex<Vec<String>>>,
}

#[async_trait::async_trait]
impl Component for Listener {
    fn name(&self) -> &str {
        "listener"
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([EventKind::ResourceSyncComplete])
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        while let Some(event) = ctx.next_event().await {
            if let EventPayload::ResourceSyncComplete(done) = &event.payload {
                self.seen.lock().unwrap().push(done.source.to_string());
            }
        }
        self.seen.lock().unwrap().push("stopped".to_owned());
        Ok(())
    }
}

#[tokio::test]
async fn the_interest_set_sees_events_published_before_start_and_next_event_ends_on_stop() {
    let (bus, _registry) = new_bus(64);
    let publisher = bus.publisher();
    // Published before the kernel (and so the bus) starts: replayed (R1).
    publisher.publish(ResourceSyncComplete {
        source: Arc::from("early"),
    });
    // Not of interest: never delivered.
    publisher.publish(DriftDetected {
        instance: "x".into(),
        detail: "y".into(),
    });
    let seen = log();
    let mut kernel = Kernel::new(bus);
    kernel.register(Listener { seen: seen.clone() });
    let running = kernel.start().unwrap();
    publisher.publish(ResourceSyncComplete {
        source: Arc::from("late"),
    });
    timeout(Duration::from_secs(5), async {
        while seen.lock().unwrap().len() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("both events delivered");
    let report = running.shutdown(Duration::from_secs(5)).await;
    assert_eq!(report.stopped, ["listener"]);
    assert_eq!(*seen.lock().unwrap(), ["early", "late", "stopped"]);
}

#[tokio::test]
async fn duplicate_names_are_an_error() {
    let (bus, _registry) = new_bus(64);
    let calls = log();
    let mut kernel = Kernel::new(bus);
    kernel
        .register(Probe::new("x", &calls))
        .register(Probe::new("x", &calls));
    assert_eq!(
        kernel.start().unwrap_err(),
        KernelError::DuplicateName("x".into())
    );
}

#[tokio::test]
async fn a_panicking_or_failing_component_exits_while_the_others_keep_running() {
    let (bus, _registry) = new_bus(64);
    let calls = log();
    let mut watcher = bus
        .observe("test-health", [EventKind::ComponentHealthChanged])
        .unwrap();
    let mut survivor_feed = bus
        .subscribe("test-survivor", [EventKind::DriftDetected])
        .unwrap();
    let publisher = bus.publisher();
    let mut kernel = Kernel::new(bus);
    kernel
        .register(Probe::new("panicker", &calls).behaving(Behaviour::Panic))
        .register(Probe::new("failer", &calls).behaving(Behaviour::Fail))
        .register(Probe::new("survivor", &calls));
    let health = kernel.health();
    let running = kernel.start().unwrap();

    let mut exited = Vec::new();
    while exited.len() < 2 {
        let event = timeout(Duration::from_secs(5), watcher.recv())
            .await
            .unwrap()
            .unwrap();
        if let EventPayload::ComponentHealthChanged(change) = &event.payload
            && change.health.state == HealthState::Exited
        {
            exited.push((
                change.component.to_string(),
                change.health.reason.clone().unwrap(),
            ));
        }
    }
    exited.sort();
    assert_eq!(exited[0].0, "failer");
    assert_eq!(exited[0].1, "failed: backend unreachable");
    assert_eq!(exited[1].0, "panicker");
    assert_eq!(exited[1].1, "panicked: boom in panicker");

    // The bus still delivers and the survivor is still healthy.
    publisher.publish(DriftDetected {
        instance: "i".into(),
        detail: "d".into(),
    });
    assert!(
        timeout(Duration::from_secs(5), survivor_feed.recv())
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(health.get("survivor").unwrap().state, HealthState::Healthy);
    let report = running.shutdown(Duration::from_secs(5)).await;
    assert_eq!(report.stopped.len(), 3);
    assert_eq!(
        health.get("survivor").unwrap().reason.as_deref(),
        Some("stopped")
    );
}

#[tokio::test]
async fn health_transitions_are_published_once_per_change_and_exported() {
    let registry = Registry::new();
    let bus_metrics = BusMetrics::register(&registry).unwrap();
    let kernel_metrics = KernelMetrics::register(&registry).unwrap();
    let bus = Bus::new(BusConfig::default(), &bus_metrics);
    let mut watcher = bus
        .observe("test-health", [EventKind::ComponentHealthChanged])
        .unwrap();
    let calls = log();
    let mut kernel = Kernel::new(bus).with_metrics(kernel_metrics);
    kernel.register(Probe::new("source", &calls).behaving(Behaviour::Flapping));
    let health = kernel.health();
    let running = kernel.start().unwrap();

    let mut seen = Vec::new();
    while seen.len() < 4 {
        let event = timeout(Duration::from_secs(5), watcher.recv())
            .await
            .unwrap()
            .unwrap();
        if let EventPayload::ComponentHealthChanged(change) = &event.payload {
            seen.push(change.health.to_string());
        }
    }
    assert_eq!(
        seen,
        [
            "unknown",
            "healthy",
            "unhealthy: directory ./resources is missing",
            "healthy",
        ],
        "the repeated unhealthy report is not published twice"
    );
    let gauge = |state: &str| {
        registry
            .gather()
            .into_iter()
            .find(|f| f.name() == "hapwright_component_health")
            .unwrap()
            .get_metric()
            .iter()
            .find(|m| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == "state" && l.value() == state)
            })
            .map(|m| m.get_gauge().get_value())
    };
    assert_eq!(gauge("healthy"), Some(1.0));
    assert_eq!(gauge("unhealthy"), Some(0.0));
    running.shutdown(Duration::from_secs(5)).await;
    let final_health = health.get("source").unwrap();
    assert_eq!(final_health.state, HealthState::Exited);
    assert_eq!(gauge("exited"), Some(1.0));
}

#[tokio::test(start_paused = true)]
async fn shutdown_aborts_components_that_miss_the_deadline() {
    let (bus, _registry) = new_bus(64);
    let calls = log();
    let mut kernel = Kernel::new(bus);
    kernel
        .register(Probe::new("polite", &calls))
        .register(Probe::new("stubborn", &calls).behaving(Behaviour::Stubborn));
    let health = kernel.health();
    let running = kernel.start().unwrap();
    let started = tokio::time::Instant::now();
    let report = running.shutdown(Duration::from_secs(10)).await;
    assert_eq!(report.stopped, ["polite"]);
    assert_eq!(report.aborted, ["stubborn"]);
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(10),
        "waited exactly the grace period"
    );
    let stubborn = health.get("stubborn").unwrap();
    assert_eq!(stubborn.state, HealthState::Exited);
    assert_eq!(
        stubborn.reason.as_deref(),
        Some("did not stop within 10s; aborted")
    );
    assert_eq!(
        health.get("polite").unwrap().reason.as_deref(),
        Some("stopped")
    );
}

/// One stage of the R3 storm: receives events of one kind and republishes each as the
/// next kind, while handling, with a tiny channel so publishers spill constantly.
struct Relay {
    name: &'static str,
    input: EventKind,
    limit: u32,
    done: Arc<Mutex<u32>>,
}

fn hop_of(payload: &EventPayload) -> u32 {
    match payload {
        EventPayload::DriftDetected(e) => e.detail.parse().unwrap(),
        EventPayload::ResourceSyncComplete(e) => e.source.parse().unwrap(),
        EventPayload::ReconciliationStarted(e) => e.reason.parse().unwrap(),
        other => panic!("unexpected {other:?}"),
    }
}

#[async_trait::async_trait]
impl Component for Relay {
    fn name(&self) -> &str {
        self.name
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline(KindSet::of(&[self.input]))
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        loop {
            let Some(event) = ctx.next_event().await else {
                return Ok(());
            };
            let hop = hop_of(&event.payload);
            let publisher = ctx.publisher();
            match self.input {
                EventKind::DriftDetected => {
                    // Fan out: two events per input keeps every queue overfull.
                    for _ in 0..2 {
                        publisher.reply(
                            &event,
                            ResourceSyncComplete {
                                source: hop.to_string().into(),
                            },
                        );
                    }
                }
                EventKind::ResourceSyncComplete => {
                    // A kind the full spill queue never drops (a newer trigger
                    // would replace an older one), so every chain is counted.
                    publisher.reply(
                        &event,
                        hapwright_eventbus::ReconciliationStarted {
                            reason: hop.to_string(),
                            follow_up: false,
                        },
                    );
                }
                _ => {
                    if hop + 1 < self.limit {
                        publisher.reply(
                            &event,
                            DriftDetected {
                                instance: "x".into(),
                                detail: (hop + 1).to_string(),
                            },
                        );
                    } else {
                        *self.done.lock().unwrap() += 1;
                    }
                }
            }
        }
    }
}

/// R3: three components republishing to each other in a cycle, in a storm far larger
/// than the channel, finish under a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r3_publish_storm_with_cycles_does_not_deadlock() {
    const SEEDS: u32 = 200;
    const HOPS: u32 = 6;
    let (bus, _registry) = new_bus(4);
    let publisher = bus.publisher();
    let done = Arc::new(Mutex::new(0));
    let mut kernel = Kernel::new(bus);
    for (name, input) in [
        ("debouncer", EventKind::DriftDetected),
        ("executor", EventKind::ResourceSyncComplete),
        ("scheduler", EventKind::ReconciliationStarted),
    ] {
        kernel.register(Relay {
            name,
            input,
            limit: HOPS,
            done: done.clone(),
        });
    }
    let running = kernel.start().unwrap();
    for _ in 0..SEEDS {
        publisher.publish(DriftDetected {
            instance: "x".into(),
            detail: "0".into(),
        });
    }
    // Each seed doubles at every hop: SEEDS * 2^HOPS chains reach the end.
    let expected = SEEDS * 2u32.pow(HOPS);
    timeout(Duration::from_secs(60), async {
        while *done.lock().unwrap() < expected {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the storm completes: no deadlock");
    assert_eq!(*done.lock().unwrap(), expected);
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_mandatory_component_is_reported_and_an_optional_one_is_not() {
    let (bus, registry) = new_bus(64);
    let metrics = KernelMetrics::register(&registry).unwrap();
    let calls = log();
    let mut kernel = Kernel::new(bus).with_metrics(metrics);
    kernel
        .register(
            Probe::new("observer", &calls)
                .behaving(Behaviour::Panic)
                .optional(),
        )
        .register(
            Probe::new("renderer", &calls).behaving(Behaviour::FailAfter(Duration::from_secs(5))),
        )
        .register(Probe::new("deployer", &calls));
    let health = kernel.health();
    let mut running = kernel.start().unwrap();
    assert_eq!(
        health
            .mandatory()
            .keys()
            .map(|k| k.to_string())
            .collect::<Vec<_>>(),
        ["deployer", "renderer"]
    );

    // The optional observer's panic is only a health state.
    tokio::task::yield_now().await;
    let before = tokio::time::Instant::now();
    let failure = timeout(Duration::from_secs(30), running.failed())
        .await
        .expect("the renderer's failure is reported");
    assert_eq!(failure.component, "renderer");
    assert_eq!(failure.reason, "failed: lost the watch stream");
    assert_eq!(before.elapsed(), Duration::from_secs(5));
    let observer = health.get("observer").unwrap();
    assert_eq!(observer.state, HealthState::Exited);
    assert_eq!(
        observer.reason.as_deref(),
        Some("panicked: boom in observer")
    );

    // Nothing else is reported, and shutdown retires the mandatory set: components
    // stopped on purpose are not failures.
    assert!(
        timeout(Duration::from_secs(600), running.failed())
            .await
            .is_err()
    );
    running.shutdown(Duration::from_secs(5)).await;
    assert!(health.mandatory().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_mandatory_panic_is_reported_with_its_message() {
    let (bus, _registry) = new_bus(64);
    let calls = log();
    let mut kernel = Kernel::new(bus);
    kernel.register(Probe::new("executor", &calls).behaving(Behaviour::Panic));
    let mut running = kernel.start().unwrap();
    let failure = timeout(Duration::from_secs(5), running.failed())
        .await
        .unwrap();
    assert_eq!(failure.component, "executor");
    assert_eq!(failure.reason, "panicked: boom in executor");
    running.shutdown(Duration::from_secs(5)).await;
}

/// The restart loop the app runs: rebuild the kernel after each mandatory failure,
/// waiting the backoff delay. A component that fails after 1 s is restarted after
/// 1, 2, 4 … 60 s; once a run lasts past the reset period the delay is 1 s again.
#[tokio::test(start_paused = true)]
async fn mandatory_failures_are_restarted_with_doubling_backoff_and_reset() {
    let registry = Registry::new();
    let metrics = KernelMetrics::register(&registry).unwrap();
    let calls = log();
    let mut backoff = RestartBackoff::default();
    // How long each generation runs before it fails.
    let mut runs = vec![Duration::from_secs(1); 8];
    runs.push(Duration::from_secs(150));
    runs.push(Duration::from_secs(1));
    let mut delays = Vec::new();
    for run_for in runs {
        let (bus, _bus_registry) = new_bus(64);
        let mut kernel = Kernel::new(bus).with_metrics(metrics.clone());
        kernel.register(Probe::new("watcher", &calls).behaving(Behaviour::FailAfter(run_for)));
        let started = tokio::time::Instant::now();
        let mut running = kernel.start().unwrap();
        let failure = timeout(Duration::from_secs(3600), running.failed())
            .await
            .unwrap();
        let ran_for = started.elapsed();
        assert_eq!(ran_for, run_for);
        metrics.record_restart(&failure.component);
        running.shutdown(Duration::from_secs(5)).await;
        let delay = backoff.next_delay(ran_for);
        let waited = tokio::time::Instant::now();
        tokio::time::sleep(delay).await;
        delays.push(waited.elapsed().as_secs());
    }
    assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 1, 2]);
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(
        text.contains("hapwright_component_restarts_total{component=\"watcher\"} 10"),
        "{text}"
    );
}
