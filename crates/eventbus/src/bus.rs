//! The buffered publish/subscribe bus.
//!
//! Two `async-broadcast` channels carry every event:
//!
//! - the **pipeline** channel, without overflow: a message stays until every pipeline
//!   subscriber has taken it, so no pipeline subscriber ever loses an event (R2);
//! - the **observer** channel, in overflow mode: when an observer falls behind, the
//!   oldest events are evicted, and the observer's next receive reports how many it
//!   missed, which is counted in `hapwright_events_dropped_total{subscriber}`.
//!
//! **Before [`Bus::start`]** both channels keep a template receiver that is never
//! read; every subscription is a clone of it, so it sees every event published since
//! the bus was created, in order, whenever it registered (R1). The channels grow
//! while nobody drains them. Subscribing after start is refused.
//!
//! **Publishing never waits** (R3). [`Publisher::publish`] is a plain function: when
//! the pipeline channel is full it appends the event to a spill queue that a pump task
//! feeds into the channel, in order, as subscribers make room. A component may publish
//! from inside its event handler, in a storm, with cycles between components, and
//! never deadlock on its own subscription.
//!
//! **The spill queue is bounded** ([`BusConfig::spill_capacity`]): when it is full,
//! the oldest pipeline event that a newer one of the same kind supersedes (a newer
//! snapshot of the same source, a newer render, ...; the list is in the `spill`
//! module) is dropped, counted in `hapwright_event_spill_dropped_total{kind}` and
//! reported in a rate-limited warning. Events that no newer event replaces are never
//! dropped; they stay queued, past the capacity if need be.
//!
//! Per-type publish counts, per-subscriber queue depth and delivery lag, drop counts
//! and the spill depth are exported through [`BusMetrics`] (R4).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_broadcast::{Receiver, RecvError, Sender, TrySendError};
use futures::Stream;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::event::{Event, EventId, EventKind, EventMeta, EventPayload, KindSet};
use crate::spill::Spill;

/// Sizes of the bus's channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BusConfig {
    /// Events the pipeline channel holds before publishers spill.
    pub pipeline_capacity: usize,
    /// Events an observer may fall behind before it loses the oldest ones.
    pub observer_capacity: usize,
    /// Pipeline events the spill queue holds (after the pipeline channel is full)
    /// before it drops the oldest superseded one. Bounds the memory a stalled
    /// pipeline subscriber can pin: a queued resource update keeps its whole snapshot
    /// alive.
    pub spill_capacity: usize,
}

impl Default for BusConfig {
    fn default() -> Self {
        Self {
            pipeline_capacity: 1024,
            observer_capacity: 4096,
            spill_capacity: 4096,
        }
    }
}

/// Errors of the bus's set-up calls.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// `subscribe`/`observe` after `start`: the subscriber would miss the replay.
    #[error("cannot subscribe `{0}`: the bus has already started")]
    AlreadyStarted(String),
    /// `start` called twice.
    #[error("the bus has already started")]
    StartedTwice,
    /// `start` called outside a Tokio runtime.
    #[error("the bus must be started inside a Tokio runtime")]
    NoRuntime,
}

/// Whether a subscriber may lose events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// Never loses an event; a slow one delays delivery to others.
    Pipeline,
    /// May lose the oldest events under overload; every loss is counted.
    Observer,
}

impl Delivery {
    fn as_str(self) -> &'static str {
        match self {
            Delivery::Pipeline => "pipeline",
            Delivery::Observer => "observer",
        }
    }
}

// === impl BusMetrics ===

/// The bus's Prometheus metrics. Register them once per process and hand them to every
/// bus (one per reinit iteration): counters keep counting across iterations and the
/// depth gauges follow the newest bus.
#[derive(Clone)]
pub struct BusMetrics {
    published: Arc<[IntCounter]>,
    dropped: IntCounterVec,
    /// Superseded pipeline events dropped from a full spill queue, by kind.
    spill_dropped: Arc<[IntCounter]>,
    live: Arc<LiveCollector>,
    /// The next event id. Shared by every bus built with these metrics (one per
    /// process), so ids stay unique across config reloads and `/debug/events` never
    /// shows two events with the same id.
    next_id: Arc<AtomicU64>,
}

impl std::fmt::Debug for BusMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BusMetrics")
    }
}

impl BusMetrics {
    /// Creates the metrics and registers them in `registry`:
    /// `hapwright_events_published_total{type}`,
    /// `hapwright_events_dropped_total{subscriber}`,
    /// `hapwright_event_subscriber_depth{subscriber,delivery}`,
    /// `hapwright_event_subscriber_lag_seconds{subscriber,delivery}`,
    /// `hapwright_event_spill_depth` and `hapwright_event_spill_dropped_total{kind}`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let published_vec = IntCounterVec::new(
            Opts::new(
                "hapwright_events_published_total",
                "Events published on the bus, by event type.",
            ),
            &["type"],
        )?;
        let dropped = IntCounterVec::new(
            Opts::new(
                "hapwright_events_dropped_total",
                "Events an observer subscriber lost because it fell behind.",
            ),
            &["subscriber"],
        )?;
        let spill_dropped_vec = IntCounterVec::new(
            Opts::new(
                "hapwright_event_spill_dropped_total",
                "Pipeline events dropped from the full spill queue because a newer event \
                 of the same kind supersedes them.",
            ),
            &["kind"],
        )?;
        let live = Arc::new(LiveCollector::new()?);
        registry.register(Box::new(published_vec.clone()))?;
        registry.register(Box::new(dropped.clone()))?;
        registry.register(Box::new(spill_dropped_vec.clone()))?;
        registry.register(Box::new(LiveCollectorHandle(live.clone())))?;
        let published = EventKind::ALL
            .iter()
            .map(|kind| published_vec.with_label_values(&[kind.as_str()]))
            .collect();
        let spill_dropped = EventKind::ALL
            .iter()
            .map(|kind| spill_dropped_vec.with_label_values(&[kind.as_str()]))
            .collect();
        Ok(Self {
            published,
            dropped,
            spill_dropped,
            live,
            next_id: Arc::new(AtomicU64::new(1)),
        })
    }
}

/// Reports the live per-subscriber depth and lag of the newest bus at scrape time.
struct LiveCollector {
    depth: IntGaugeVec,
    lag: GaugeVec,
    spill: IntGauge,
    current: Mutex<Weak<Shared>>,
}

impl LiveCollector {
    fn new() -> prometheus::Result<Self> {
        Ok(Self {
            depth: IntGaugeVec::new(
                Opts::new(
                    "hapwright_event_subscriber_depth",
                    "Events published but not yet taken by a subscriber.",
                ),
                &["subscriber", "delivery"],
            )?,
            lag: GaugeVec::new(
                Opts::new(
                    "hapwright_event_subscriber_lag_seconds",
                    "Time between publication and delivery of the last event a subscriber took.",
                ),
                &["subscriber", "delivery"],
            )?,
            spill: IntGauge::new(
                "hapwright_event_spill_depth",
                "Events waiting for room in the pipeline channel.",
            )?,
            current: Mutex::new(Weak::new()),
        })
    }
}

struct LiveCollectorHandle(Arc<LiveCollector>);

impl Collector for LiveCollectorHandle {
    fn desc(&self) -> Vec<&Desc> {
        let live = &self.0;
        let mut descs = live.depth.desc();
        descs.extend(live.lag.desc());
        descs.extend(live.spill.desc());
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let live = &self.0;
        live.depth.reset();
        live.lag.reset();
        live.spill.set(0);
        let current = lock(&live.current).upgrade();
        if let Some(shared) = current {
            for sub in lock(&shared.subscribers).iter() {
                let labels = [sub.name.as_ref(), sub.delivery.as_str()];
                live.depth
                    .with_label_values(&labels)
                    .set(shared.depth(sub) as i64);
                live.lag
                    .with_label_values(&labels)
                    .set(Duration::from_nanos(sub.lag_nanos.load(Ordering::Relaxed)).as_secs_f64());
            }
            live.spill.set(lock(&shared.state).spill.len() as i64);
        }
        let mut families = live.depth.collect();
        families.extend(live.lag.collect());
        families.extend(live.spill.collect());
        families
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data (every critical
    // section is a few assignments), so keep going rather than poison the whole bus.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// === impl Bus ===

struct State {
    pipeline: Sender<Arc<Event>>,
    observer: Sender<Arc<Event>>,
    /// Never-read receivers that every pre-start subscription clones; dropped at start.
    templates: Option<Templates>,
    /// Pipeline events waiting for room, in publish order.
    spill: Spill,
    /// Spill length at which the next warning is logged.
    spill_warn_at: usize,
    /// Superseded events dropped since the last warning about it.
    spill_dropped_unreported: u64,
    /// When that warning was last logged.
    spill_drop_warned_at: Option<Instant>,
    started: bool,
}

/// The never-read receivers of both channels, cloned by every pre-start subscription.
struct Templates {
    pipeline: Receiver<Arc<Event>>,
    observer: Receiver<Arc<Event>>,
}

struct SubscriberStats {
    name: Arc<str>,
    delivery: Delivery,
    /// Events taken from the channel or lost to overflow.
    consumed: AtomicU64,
    /// Delivery lag of the last event taken, in nanoseconds.
    lag_nanos: AtomicU64,
    dropped: IntCounter,
}

struct Shared {
    config: BusConfig,
    state: Mutex<State>,
    subscribers: Mutex<Vec<Arc<SubscriberStats>>>,
    next_id: Arc<AtomicU64>,
    /// Events put into each channel so far.
    pipeline_seq: AtomicU64,
    observer_seq: AtomicU64,
    spill_ready: Arc<Notify>,
    shutdown: CancellationToken,
    metrics: BusMetrics,
    clock_base: (Instant, u64),
}

impl Shared {
    /// Events waiting for `sub`. An observer never has more waiting than its
    /// channel holds: older ones were evicted and count as dropped when it next
    /// receives.
    fn depth(&self, sub: &SubscriberStats) -> u64 {
        match sub.delivery {
            Delivery::Pipeline => self
                .pipeline_seq
                .load(Ordering::Relaxed)
                .saturating_sub(sub.consumed.load(Ordering::Relaxed)),
            Delivery::Observer => {
                let capacity = lock(&self.state).observer.capacity() as u64;
                self.observer_seq
                    .load(Ordering::Relaxed)
                    .saturating_sub(sub.consumed.load(Ordering::Relaxed))
                    .min(capacity)
            }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The event bus of one kernel iteration. Cheap to clone; all clones are the same bus.
#[derive(Clone)]
pub struct Bus {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus")
            .field("started", &lock(&self.shared.state).started)
            .finish()
    }
}

impl Bus {
    /// A new bus, not started. Its live metrics replace those of any earlier bus that
    /// used the same `metrics`, and it continues their event id sequence.
    pub fn new(config: BusConfig, metrics: &BusMetrics) -> Self {
        let (pipeline, pipeline_rx) = async_broadcast::broadcast(config.pipeline_capacity.max(1));
        let (observer, observer_rx) = async_broadcast::broadcast(config.observer_capacity.max(1));
        let unix_micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(State {
                pipeline,
                observer,
                templates: Some(Templates {
                    pipeline: pipeline_rx,
                    observer: observer_rx,
                }),
                spill: Spill::new(config.spill_capacity),
                spill_warn_at: 10_000,
                spill_dropped_unreported: 0,
                spill_drop_warned_at: None,
                started: false,
            }),
            subscribers: Mutex::new(Vec::new()),
            next_id: metrics.next_id.clone(),
            pipeline_seq: AtomicU64::new(0),
            observer_seq: AtomicU64::new(0),
            spill_ready: Arc::new(Notify::new()),
            shutdown: CancellationToken::new(),
            metrics: metrics.clone(),
            clock_base: (Instant::now(), unix_micros),
        });
        *lock(&metrics.live.current) = Arc::downgrade(&shared);
        Self { shared }
    }

    /// A handle for publishing events.
    pub fn publisher(&self) -> Publisher {
        Publisher {
            shared: self.shared.clone(),
        }
    }

    /// Registers a pipeline subscriber that receives every event of the given kinds,
    /// never losing one. Only before [`start`](Self::start).
    pub fn subscribe(
        &self,
        name: impl Into<Arc<str>>,
        kinds: impl Into<KindSet>,
    ) -> Result<Subscription, BusError> {
        self.register(name.into(), kinds.into(), Delivery::Pipeline)
    }

    /// Registers an observer subscriber (debug ring, event log, metrics) that may lose
    /// the oldest events when it falls behind; losses are counted. Only before
    /// [`start`](Self::start).
    pub fn observe(
        &self,
        name: impl Into<Arc<str>>,
        kinds: impl Into<KindSet>,
    ) -> Result<Subscription, BusError> {
        self.register(name.into(), kinds.into(), Delivery::Observer)
    }

    fn register(
        &self,
        name: Arc<str>,
        kinds: KindSet,
        delivery: Delivery,
    ) -> Result<Subscription, BusError> {
        let state = lock(&self.shared.state);
        let Some(templates) = state.templates.as_ref() else {
            return Err(BusError::AlreadyStarted(name.to_string()));
        };
        let rx = match delivery {
            Delivery::Pipeline => templates.pipeline.clone(),
            Delivery::Observer => templates.observer.clone(),
        };
        drop(state);
        let stats = Arc::new(SubscriberStats {
            dropped: self
                .shared
                .metrics
                .dropped
                .with_label_values(&[name.as_ref()]),
            name,
            delivery,
            consumed: AtomicU64::new(0),
            lag_nanos: AtomicU64::new(0),
        });
        lock(&self.shared.subscribers).push(stats.clone());
        Ok(Subscription { rx, kinds, stats })
    }

    /// Starts delivery: drops the template receivers (so the pre-start events go only
    /// to the subscriptions made so far), switches the observer channel to overflow
    /// mode and starts the spill pump. Must run inside a Tokio runtime.
    pub fn start(&self) -> Result<(), BusError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| BusError::NoRuntime)?;
        let mut state = lock(&self.shared.state);
        if state.started {
            return Err(BusError::StartedTwice);
        }
        state.started = true;
        state.templates = None;
        // Keep the whole replay and leave the configured room on top of it.
        let observer_capacity = state.observer.len() + self.shared.config.observer_capacity.max(1);
        state.observer.set_capacity(observer_capacity);
        state.observer.set_overflow(true);
        let pump_sender = state.pipeline.clone();
        drop(state);
        handle.spawn(pump(
            Arc::downgrade(&self.shared),
            pump_sender,
            self.shared.spill_ready.clone(),
            self.shared.shutdown.clone(),
        ));
        Ok(())
    }

    /// Closes the bus: subscribers receive what is already in their channel and then
    /// `None`; later publishes are discarded; the spill pump stops.
    pub fn close(&self) {
        let state = lock(&self.shared.state);
        state.pipeline.close();
        state.observer.close();
        drop(state);
        self.shared.shutdown.cancel();
    }
}

/// Moves spilled events into the pipeline channel, in order, as room appears.
async fn pump(
    shared: Weak<Shared>,
    sender: Sender<Arc<Event>>,
    ready: Arc<Notify>,
    shutdown: CancellationToken,
) {
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let next = lock(&strong.state).spill.front().cloned();
        drop(strong);
        match next {
            None => {
                if shutdown
                    .run_until_cancelled(ready.notified())
                    .await
                    .is_none()
                {
                    return;
                }
            }
            Some(event) => {
                let Some(sent) = shutdown
                    .run_until_cancelled(sender.broadcast_direct(event))
                    .await
                else {
                    return;
                };
                let sent = sent.is_ok();
                let Some(strong) = shared.upgrade() else {
                    return;
                };
                if sent {
                    strong.pipeline_seq.fetch_add(1, Ordering::Relaxed);
                }
                let mut state = lock(&strong.state);
                state.spill.pop_front();
                if state.spill.len() < strong.config.pipeline_capacity {
                    state.spill_warn_at = 10_000;
                }
            }
        }
    }
}

// === impl Publisher ===

/// Publishes events on a bus. Cheap to clone. Publishing never waits.
#[derive(Clone)]
pub struct Publisher {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Publisher")
    }
}

impl Publisher {
    /// Publishes an event without correlation; returns its id.
    pub fn publish(&self, payload: impl Into<EventPayload>) -> EventId {
        self.publish_with(payload, EventMeta::default())
    }

    /// Publishes an event caused by `cause`, inheriting its correlation id.
    pub fn reply(&self, cause: &Event, payload: impl Into<EventPayload>) -> EventId {
        self.publish_with(payload, EventMeta::caused_by(cause))
    }

    /// Publishes an event with explicit envelope fields; returns its id.
    pub fn publish_with(&self, payload: impl Into<EventPayload>, meta: EventMeta) -> EventId {
        let event = self.envelope(payload.into(), meta);
        let id = event.id;
        let mut state = lock(&self.shared.state);
        let spilled = deliver(&self.shared, &mut state, event);
        self.after_delivery(state, spilled);
        id
    }

    /// Publishes events that belong together (the updates of one scan of a
    /// directory) in order, under one hold of the bus: they get consecutive ids and
    /// no other publisher's event comes between them. Returns their ids.
    pub fn publish_all(&self, payloads: impl IntoIterator<Item = EventPayload>) -> Vec<EventId> {
        let events: Vec<Arc<Event>> = payloads
            .into_iter()
            .map(|payload| self.envelope(payload, EventMeta::default()))
            .collect();
        let ids = events.iter().map(|event| event.id).collect();
        let mut state = lock(&self.shared.state);
        let mut spilled = false;
        for event in events {
            spilled |= deliver(&self.shared, &mut state, event);
        }
        self.after_delivery(state, spilled);
        ids
    }

    /// The event for `payload`, with the next id, counted as published.
    fn envelope(&self, payload: EventPayload, meta: EventMeta) -> Arc<Event> {
        let shared = &*self.shared;
        let id = EventId(shared.next_id.fetch_add(1, Ordering::Relaxed));
        let at = Instant::now();
        let (base_at, base_micros) = shared.clock_base;
        let unix_micros = base_micros + at.saturating_duration_since(base_at).as_micros() as u64;
        let kind = payload.kind();
        shared.metrics.published[kind as usize].inc();
        Arc::new(Event {
            id,
            correlation_id: meta.correlation_id,
            caused_by: meta.caused_by,
            at,
            unix_micros,
            payload,
        })
    }

    /// After events were delivered: warns when the spill queue keeps growing and
    /// wakes the pump when something was spilled.
    fn after_delivery(&self, mut state: MutexGuard<'_, State>, spilled: bool) {
        let shared = &*self.shared;
        if !spilled {
            return;
        }
        let queued = state.spill.len();
        if queued >= state.spill_warn_at {
            state.spill_warn_at = queued * 2;
            drop(state);
            let slowest = slowest_pipeline_subscriber(shared);
            tracing::warn!(
                spilled = queued,
                slowest = slowest.as_deref().unwrap_or("none"),
                "Pipeline subscribers are falling behind; events are queued, not lost"
            );
        } else {
            drop(state);
        }
        shared.spill_ready.notify_one();
    }
}

/// Sends one event to the observer and the pipeline (or the spill queue); true when
/// it went to the spill queue.
fn deliver(shared: &Shared, state: &mut State, event: Arc<Event>) -> bool {
    let before_start = !state.started;
    if send_growing(&mut state.observer, event.clone(), before_start) {
        shared.observer_seq.fetch_add(1, Ordering::Relaxed);
    }
    if state.spill.is_empty() {
        match state.pipeline.try_broadcast(event) {
            Ok(_) => {
                shared.pipeline_seq.fetch_add(1, Ordering::Relaxed);
                false
            }
            Err(TrySendError::Full(event)) if before_start => {
                // Nobody drains before start: grow so the replay is complete.
                if send_growing(&mut state.pipeline, event, true) {
                    shared.pipeline_seq.fetch_add(1, Ordering::Relaxed);
                }
                false
            }
            Err(TrySendError::Full(event)) => {
                spill(shared, state, event);
                true
            }
            Err(TrySendError::Closed(_) | TrySendError::Inactive(_)) => false,
        }
    } else {
        spill(shared, state, event);
        true
    }
}

/// How often, at most, the warning about dropped superseded events is logged.
const SPILL_DROP_WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Queues `event` for the pump; counts and (rate-limited) reports a superseded event
/// the full queue dropped for it.
fn spill(shared: &Shared, state: &mut State, event: Arc<Event>) {
    let Some(dropped) = state.spill.push(event) else {
        return;
    };
    let kind = dropped.kind();
    shared.metrics.spill_dropped[kind as usize].inc();
    state.spill_dropped_unreported += 1;
    let now = Instant::now();
    let due = state
        .spill_drop_warned_at
        .is_none_or(|at| now.saturating_duration_since(at) >= SPILL_DROP_WARN_INTERVAL);
    if due {
        tracing::warn!(
            dropped = state.spill_dropped_unreported,
            kind = kind.as_str(),
            spilled = state.spill.len(),
            capacity = shared.config.spill_capacity,
            "Pipeline subscribers are falling behind; superseded events were dropped from the full spill queue"
        );
        state.spill_dropped_unreported = 0;
        state.spill_drop_warned_at = Some(now);
    }
}

/// Sends on `sender`; when `grow` and the channel is full, doubles its capacity first.
/// Returns whether the event entered the channel.
fn send_growing(sender: &mut Sender<Arc<Event>>, event: Arc<Event>, grow: bool) -> bool {
    match sender.try_broadcast(event) {
        Ok(_) => true,
        Err(TrySendError::Full(event)) if grow => {
            let capacity = sender.capacity();
            sender.set_capacity(capacity.saturating_mul(2));
            sender.try_broadcast(event).is_ok()
        }
        Err(_) => false,
    }
}

fn slowest_pipeline_subscriber(shared: &Shared) -> Option<String> {
    lock(&shared.subscribers)
        .iter()
        .filter(|sub| sub.delivery == Delivery::Pipeline)
        .max_by_key(|sub| shared.depth(sub))
        .map(|sub| sub.name.to_string())
}

// === impl Subscription ===

/// A named subscriber's queue. Receives the events of its kinds, in publish order.
pub struct Subscription {
    rx: Receiver<Arc<Event>>,
    kinds: KindSet,
    stats: Arc<SubscriberStats>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("name", &self.stats.name)
            .field("delivery", &self.stats.delivery)
            .finish()
    }
}

impl Subscription {
    /// The subscriber's name.
    pub fn name(&self) -> &str {
        &self.stats.name
    }

    /// Whether this subscriber may lose events.
    pub fn delivery(&self) -> Delivery {
        self.stats.delivery
    }

    /// The next event of the subscribed kinds; `None` once the bus is closed and
    /// drained. An observer that fell behind skips the evicted events, counting them.
    pub async fn recv(&mut self) -> Option<Arc<Event>> {
        loop {
            match self.rx.recv_direct().await {
                Ok(event) => {
                    if let Some(event) = self.accept(event) {
                        return Some(event);
                    }
                }
                Err(RecvError::Overflowed(missed)) => self.count_loss(missed),
                Err(RecvError::Closed) => return None,
            }
        }
    }

    /// The next event if one is ready, without waiting.
    pub fn try_recv(&mut self) -> Option<Arc<Event>> {
        loop {
            match self.rx.try_recv() {
                Ok(event) => {
                    if let Some(event) = self.accept(event) {
                        return Some(event);
                    }
                }
                Err(async_broadcast::TryRecvError::Overflowed(missed)) => self.count_loss(missed),
                Err(_) => return None,
            }
        }
    }

    /// The subscription as a stream (losses are still counted).
    pub fn into_stream(self) -> impl Stream<Item = Arc<Event>> + Send + 'static {
        futures::stream::unfold(self, |mut sub| async move {
            let event = sub.recv().await?;
            Some((event, sub))
        })
    }

    fn accept(&self, event: Arc<Event>) -> Option<Arc<Event>> {
        self.stats.consumed.fetch_add(1, Ordering::Relaxed);
        if !self.kinds.contains(event.kind()) {
            return None;
        }
        let lag = event.at.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.stats.lag_nanos.store(lag, Ordering::Relaxed);
        Some(event)
    }

    fn count_loss(&self, missed: u64) {
        self.stats.consumed.fetch_add(missed, Ordering::Relaxed);
        self.stats.dropped.inc_by(missed);
        tracing::warn!(
            subscriber = %self.stats.name,
            missed,
            "Observer fell behind and lost events"
        );
    }
}
