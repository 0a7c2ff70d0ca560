//! A bus and kernel around the components under test, with a test subscription that
//! sees what they publish. Every wait is bounded.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::model::{ObjectKey, ResourceChange, ResourceSnapshot};
use hapwright_eventbus::{
    Bus, BusConfig, BusMetrics, Component, Event, EventKind, EventMeta, EventPayload, Kernel,
    Publisher, ResourceIndexUpdated, ResourceSyncComplete, RunningKernel, Subscription,
};
use prometheus::Registry;
use tokio::time::timeout;

/// Components running on a bus, plus a subscription for assertions.
pub struct Harness {
    pub publisher: Publisher,
    pub events: Subscription,
    pub kernel: RunningKernel,
}

impl Harness {
    /// Starts `components`; the test subscription receives `kinds`.
    pub fn start(components: Vec<Box<dyn Component>>, kinds: &[EventKind]) -> Self {
        let metrics = BusMetrics::register(&Registry::new()).expect("metrics");
        let bus = Bus::new(BusConfig::default(), &metrics);
        let events = bus
            .subscribe("test", kinds)
            .expect("subscribe before start");
        let publisher = bus.publisher();
        let mut kernel = Kernel::new(bus);
        for component in components {
            kernel.register_boxed(component);
        }
        let kernel = kernel.start().expect("kernel starts");
        Self {
            publisher,
            events,
            kernel,
        }
    }

    /// The next event, or `None` if nothing arrives within `wait`.
    pub async fn next_within(&mut self, wait: Duration) -> Option<Arc<Event>> {
        timeout(wait, self.events.recv()).await.ok().flatten()
    }

    /// The next event; panics if nothing arrives within a minute (of paused time).
    pub async fn next(&mut self) -> Arc<Event> {
        self.next_within(Duration::from_secs(60))
            .await
            .expect("an event within 60 s; the pipeline is likely stuck")
    }

    /// Skips events until one of `kind` arrives (bounded).
    pub async fn next_of(&mut self, kind: EventKind) -> Arc<Event> {
        loop {
            let event = self.next().await;
            if event.kind() == kind {
                return event;
            }
        }
    }

    pub fn update(&self, source: &str, snapshot: Arc<ResourceSnapshot>) {
        self.publisher.publish(ResourceIndexUpdated {
            source: source.into(),
            snapshot,
            change: Arc::new(ResourceChange::default()),
        });
    }

    pub fn synced(&self, source: &str) {
        self.publisher.publish(ResourceSyncComplete {
            source: source.into(),
        });
    }

    pub fn publish_with(&self, payload: impl Into<EventPayload>, meta: EventMeta) {
        self.publisher.publish_with(payload, meta);
    }
}

/// A one-object snapshot.
pub fn snapshot(name: &str) -> Arc<ResourceSnapshot> {
    let mut snap = ResourceSnapshot::new(Vec::new());
    snap.upsert(
        ObjectKey::new("default", name),
        &serde_json::json!({"metadata": {"namespace": "default", "name": name}}),
    );
    Arc::new(snap)
}
