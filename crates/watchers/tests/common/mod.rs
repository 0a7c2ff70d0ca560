//! What every source test starts with: one component in a real kernel on a real
//! bus, and a subscription to the events the test reads, each read bounded by a
//! timeout.

use std::time::Duration;

use hapwright_eventbus::{
    Bus, BusConfig, BusMetrics, Component, EventPayload, Kernel, KindSet, RunningKernel,
    Subscription,
};
use tokio::time::timeout;

/// Starts `component` alone in a kernel; returns the running kernel and a
/// subscription to `kinds`, made before the kernel started so it sees everything.
pub fn start_alone(
    component: impl Component,
    kinds: impl Into<KindSet>,
) -> (RunningKernel, Subscription) {
    let registry = prometheus::Registry::new();
    let metrics = BusMetrics::register(&registry).unwrap();
    let bus = Bus::new(BusConfig::default(), &metrics);
    let events = bus.subscribe("test", kinds).unwrap();
    let mut kernel = Kernel::new(bus);
    kernel.register(component);
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
