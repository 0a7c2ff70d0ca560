//! What every source test starts with: one component in a real kernel on a real
//! bus, and a subscription to the events the test reads, each read bounded by a
//! timeout ([`Harness`]). Each test file adds its own `start` and event readers in an
//! `impl Harness` block.

// Each test file uses a part of it.
#![allow(dead_code)]

use std::time::Duration;

use hapwright_eventbus::{
    Bus, BusConfig, BusMetrics, Component, EventKind, EventPayload, Kernel, KindSet, RunningKernel,
    Subscription,
};
use tokio::time::timeout;

/// Starts `component` alone in a kernel; returns the running kernel and a
/// subscription to `kinds`, made before the kernel started so it sees everything.
pub fn start_alone(
    component: impl Component,
    kinds: impl Into<KindSet>,
) -> (RunningKernel, Subscription) {
    start_together([component], kinds)
}

/// Starts `components` together in one kernel; returns the running kernel and a
/// subscription to `kinds`, made before the kernel started so it sees everything.
pub fn start_together<C: Component>(
    components: impl IntoIterator<Item = C>,
    kinds: impl Into<KindSet>,
) -> (RunningKernel, Subscription) {
    let registry = prometheus::Registry::new();
    let metrics = BusMetrics::register(&registry).unwrap();
    let bus = Bus::new(BusConfig::default(), &metrics);
    let events = bus.subscribe("test", kinds).unwrap();
    let mut kernel = Kernel::new(bus);
    for component in components {
        kernel.register(component);
    }
    (kernel.start().unwrap(), events)
}

/// The next event's payload, waiting at most `wait`.
pub async fn next(events: &mut Subscription, wait: Duration) -> EventPayload {
    let event = timeout(wait, events.recv())
        .await
        .expect("timed out waiting for an event")
        .expect("bus closed");
    event.payload.clone()
}

/// One component running alone in a kernel, the test's subscription, and how long
/// one read may wait.
pub struct Harness {
    /// The running kernel; `None` once stopped.
    pub kernel: Option<RunningKernel>,
    /// The test's subscription, made before the kernel started.
    pub events: Subscription,
    wait: Duration,
}

impl Harness {
    /// Starts `component` alone ([`start_alone`]); every [`Harness::next`] waits at
    /// most `wait`.
    pub fn alone(component: impl Component, kinds: impl Into<KindSet>, wait: Duration) -> Self {
        let (kernel, events) = start_alone(component, kinds);
        Self {
            kernel: Some(kernel),
            events,
            wait,
        }
    }

    /// Starts a resource source alone, subscribed to what sources publish: index
    /// updates, sync complete and health changes.
    pub fn source(component: impl Component, wait: Duration) -> Self {
        Self::alone(
            component,
            [
                EventKind::ResourceIndexUpdated,
                EventKind::ResourceSyncComplete,
                EventKind::ComponentHealthChanged,
            ],
            wait,
        )
    }

    /// The next event's payload.
    pub async fn next(&mut self) -> EventPayload {
        next(&mut self.events, self.wait).await
    }

    /// Shuts the kernel down and checks that no component had to be aborted.
    pub async fn stop(mut self) {
        if let Some(kernel) = self.kernel.take() {
            let report = kernel.shutdown(Duration::from_secs(5)).await;
            assert!(report.aborted.is_empty(), "{report:?}");
        }
    }
}
