//! What the crates' tests share (feature `testing`, enabled by their
//! dev-dependencies only): components in a real kernel on a real bus, with the
//! test's subscriptions made before anything starts ([`TestBus`]), bounded reads
//! ([`next_within`], [`next`], [`next_of`], [`health_reported`]), a shutdown that checks nothing had to
//! be aborted ([`stop`]), and one loopback port allocator ([`free_port`]).
//!
//! Each test file keeps its own small `Harness` for what is particular to it (the
//! events it publishes, the API server it fakes) and builds it on these.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use prometheus::Registry;
use tokio::time::timeout;

use crate::{
    Bus, BusConfig, BusMetrics, Component, Event, EventKind, EventPayload, HealthState, Kernel,
    KindSet, Publisher, RunningKernel, Subscription,
};

/// A bus for one test, before its components start: subscribe first (so the test
/// sees every event), then [`start`](Self::start) the kernel.
pub struct TestBus {
    bus: Bus,
    registry: Registry,
}

impl Default for TestBus {
    fn default() -> Self {
        Self::new()
    }
}

impl TestBus {
    /// A bus with the default config and its metrics on a fresh registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let metrics = BusMetrics::register(&registry).expect("bus metrics register");
        Self {
            bus: Bus::new(BusConfig::default(), &metrics),
            registry,
        }
    }

    /// The registry the bus's metrics (and any the test adds) live in.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// A subscription named `name` to `kinds`.
    pub fn subscribe(&self, name: &str, kinds: impl Into<KindSet>) -> Subscription {
        self.bus
            .subscribe(name, kinds)
            .expect("subscribe before the kernel starts")
    }

    /// A publisher, for the events the test plays.
    pub fn publisher(&self) -> Publisher {
        self.bus.publisher()
    }

    /// Starts a kernel on the bus with `component` alone.
    pub fn start_one(self, component: impl Component) -> RunningKernel {
        self.start(|kernel| {
            kernel.register(component);
        })
    }

    /// Starts a kernel on the bus with the components `register` adds.
    pub fn start(self, register: impl FnOnce(&mut Kernel)) -> RunningKernel {
        let mut kernel = Kernel::new(self.bus);
        register(&mut kernel);
        kernel.start().expect("the kernel starts")
    }
}

/// The next event on `events`, or `None` when nothing arrives within `wait`.
pub async fn next_within(events: &mut Subscription, wait: Duration) -> Option<Arc<Event>> {
    timeout(wait, events.recv()).await.ok().flatten()
}

/// The next event on `events`; panics when nothing arrives within `wait`.
pub async fn next(events: &mut Subscription, wait: Duration) -> Arc<Event> {
    next_within(events, wait)
        .await
        .unwrap_or_else(|| panic!("no event within {wait:?}; the pipeline is likely stuck"))
}

/// Skips events until one of `kind` arrives; each read waits at most `wait`.
pub async fn next_of(events: &mut Subscription, kind: EventKind, wait: Duration) -> Arc<Event> {
    loop {
        let event = next(events, wait).await;
        if event.kind() == kind {
            return event;
        }
    }
}

/// Skips events until `component` reports `state` (`events` must include
/// `ComponentHealthChanged`); returns the reason it gave (empty without one). Each
/// read waits at most `wait`.
pub async fn health_reported(
    events: &mut Subscription,
    component: &str,
    state: HealthState,
    wait: Duration,
) -> String {
    loop {
        let event = next(events, wait).await;
        if let EventPayload::ComponentHealthChanged(changed) = &event.payload
            && changed.component.as_ref() == component
            && changed.health.state == state
        {
            return changed.health.reason.clone().unwrap_or_default();
        }
    }
}

/// Shuts `kernel` down and checks that every component stopped by itself.
pub async fn stop(kernel: RunningKernel) {
    let report = kernel.shutdown(Duration::from_secs(5)).await;
    assert!(report.aborted.is_empty(), "aborted at shutdown: {report:?}");
}

/// Next candidate port of this process. Candidates come from below the kernel's
/// ephemeral range (32768+), so outgoing connections never take one between the
/// moment it is picked and the moment HAProxy binds it; the start depends on the
/// process id so parallel test processes start far apart.
static NEXT_PORT: AtomicU16 = AtomicU16::new(0);
const PORT_RANGE: (u16, u16) = (20_000, 32_000);

/// A loopback TCP port nobody listens on right now. Ports are handed out in turn
/// (never the same one twice in a process while others remain), so two tests of
/// one process never race for one port between finding it free and binding it.
pub fn free_port() -> u16 {
    let span = PORT_RANGE.1 - PORT_RANGE.0;
    let _ = NEXT_PORT.compare_exchange(
        0,
        ((std::process::id() * 97) % u32::from(span)) as u16,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..span {
        let offset = NEXT_PORT.fetch_add(1, Ordering::SeqCst) % span;
        let port = PORT_RANGE.0 + offset;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {PORT_RANGE:?}");
}
