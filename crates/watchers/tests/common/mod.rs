//! What every source test starts with: one component in a real kernel on a real
//! bus, and a subscription to the events the test reads, each read bounded by a
//! timeout ([`Harness`]). Each test file adds its own `start` and event readers in an
//! `impl Harness` block.

// Each test file uses a part of it.
#![allow(dead_code)]

use std::time::Duration;

use hapwright_eventbus::testing::{self, TestBus};
use hapwright_eventbus::{
    Component, EventKind, EventPayload, KindSet, RunningKernel, Subscription,
};

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
    let bus = TestBus::new();
    let events = bus.subscribe("test", kinds);
    let kernel = bus.start(|kernel| {
        for component in components {
            kernel.register(component);
        }
    });
    (kernel, events)
}

/// The next event's payload, waiting at most `wait`.
pub async fn next(events: &mut Subscription, wait: Duration) -> EventPayload {
    testing::next(events, wait).await.payload.clone()
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
            testing::stop(kernel).await;
        }
    }
}
