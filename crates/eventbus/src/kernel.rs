//! The component kernel: registration, each component's interest set,
//! health tracking, failure isolation and shutdown with a deadline.
//!
//! # Interest sets
//!
//! A component declares what it consumes ([`Component::consumes`], an [`Interest`]);
//! the kernel subscribes it before the bus starts (so it sees every event published
//! since the bus was created, R1) and hands the subscription over in its [`Context`].
//! The run loop reads [`Context::next_event`], which ends (`None`) when the component
//! should stop, so the loop holds the component's logic alone.
//!
//! # Start order
//!
//! Components start in registration order. The bus keeps every event published before
//! it starts and delivers it to every subscriber registered before that, so the order
//! in which components start has no effect on what they receive; an earlier version
//! ordered start-up by declared requires/provides, which no component used.
//!
//! # Restarting failed components
//!
//! A component cannot be restarted on its own: [`Component::run`] consumes the
//! component, and its subscriptions were registered before the bus started (a late
//! subscriber would miss the replay, R1). So the kernel does not restart anything
//! itself. When a [mandatory](Component::mandatory) component exits outside shutdown
//! (returns, fails or panics), [`RunningKernel::failed`] reports it, and the owner —
//! the app's reinit loop — rebuilds the whole iteration after a [`RestartBackoff`]
//! delay, through the same path as a controller config reload. Optional components
//! (observers such as the event log) only turn `Exited`.

use std::any::Any;
use std::collections::BTreeSet;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tracing::Instrument;

use crate::bus::{Bus, BusError, Delivery, Publisher, Subscription};
use crate::event::{ComponentHealthChanged, Event, KindSet};
use crate::health::{HealthState, HealthTable};

/// The error a component's `run` may return. Anything that converts into a boxed
/// error works, including `anyhow::Error`.
pub type ComponentError = Box<dyn std::error::Error + Send + Sync>;

/// What a component consumes from the bus: event kinds and how they are delivered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Interest {
    kinds: Option<(KindSet, Delivery)>,
}

impl Interest {
    /// Nothing: the component only publishes (sources) or works on its own.
    pub fn none() -> Self {
        Self::default()
    }

    /// `kinds`, never lost (pipeline components).
    pub fn pipeline(kinds: impl Into<KindSet>) -> Self {
        Self {
            kinds: Some((kinds.into(), Delivery::Pipeline)),
        }
    }

    /// `kinds`, possibly lost under overload, every loss counted (observers such as
    /// the event log; `hapwright_events_dropped_total{subscriber}`).
    pub fn observer(kinds: impl Into<KindSet>) -> Self {
        Self {
            kinds: Some((kinds.into(), Delivery::Observer)),
        }
    }
}

/// A unit of the controller: built from config, talks to others only through the bus.
///
/// Lifecycle: the kernel subscribes every component to what it
/// [`consumes`](Self::consumes), in registration order, starts the bus, then spawns
/// [`run`](Self::run) for each. `run` reads [`Context::next_event`] until it returns
/// `None` (the component should stop).
#[async_trait::async_trait]
pub trait Component: Send + 'static {
    /// Unique name; used in logs, metrics, health and subscriber names.
    fn name(&self) -> &str;

    /// The events this component consumes ([`Context::next_event`] yields them).
    fn consumes(&self) -> Interest {
        Interest::none()
    }

    /// Whether the controller is broken without this component. A mandatory
    /// component that exits outside shutdown is reported by
    /// [`RunningKernel::failed`] (the app then rebuilds the iteration with backoff),
    /// and `/healthz` fails when it stays `Exited` or `Unhealthy` too long. Observers
    /// whose loss only costs diagnostics (the event log) say `false`.
    fn mandatory(&self) -> bool {
        true
    }

    /// Does the component's work until cancelled. Returning early, returning an error
    /// or panicking makes the component `Exited` with the reason; the others keep
    /// running, and for a [mandatory](Self::mandatory) component the kernel's owner
    /// hears about it through [`RunningKernel::failed`].
    async fn run(self: Box<Self>, ctx: Context) -> Result<(), ComponentError>;
}

/// Why the kernel refused to start.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    /// Two components with one name.
    #[error("two components are named `{0}`")]
    DuplicateName(String),
    /// A component's subscription failed.
    #[error("component `{component}` could not subscribe: {source}")]
    Subscribe {
        /// The component.
        component: String,
        /// The bus error.
        source: BusError,
    },
    /// The bus could not start.
    #[error("the bus could not start: {0}")]
    Bus(BusError),
}

// === impl KernelMetrics ===

/// `hapwright_component_health{component,state}`: 1 for a component's current state,
/// 0 for the others; `hapwright_component_restarts_total{component}`: restarts caused
/// by a mandatory component exiting. Register once per process and share across
/// kernels.
#[derive(Clone, Debug)]
pub struct KernelMetrics {
    health: IntGaugeVec,
    restarts: IntCounterVec,
}

impl KernelMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let health = IntGaugeVec::new(
            Opts::new(
                "hapwright_component_health",
                "Current health of each component (1 for the current state).",
            ),
            &["component", "state"],
        )?;
        let restarts = IntCounterVec::new(
            Opts::new(
                "hapwright_component_restarts_total",
                "Restarts of the controller's components after a mandatory component exited, by the component that exited.",
            ),
            &["component"],
        )?;
        registry.register(Box::new(health.clone()))?;
        registry.register(Box::new(restarts.clone()))?;
        Ok(Self { health, restarts })
    }

    /// Counts one restart caused by `component` exiting.
    pub fn record_restart(&self, component: &str) {
        self.restarts.with_label_values(&[component]).inc();
    }

    fn set(&self, component: &str, state: HealthState) {
        for candidate in HealthState::ALL {
            self.health
                .with_label_values(&[component, candidate.as_str()])
                .set(i64::from(candidate == state));
        }
    }
}

// === impl HealthReporter ===

/// Lets a component (and tasks it spawns) report its health. Changes are stored in
/// the kernel's [`HealthTable`], exported as metrics and published as
/// `ComponentHealthChanged`; repeating the current health does nothing.
#[derive(Clone)]
pub struct HealthReporter {
    component: Arc<str>,
    table: HealthTable,
    publisher: Publisher,
    metrics: Option<KernelMetrics>,
}

impl fmt::Debug for HealthReporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthReporter")
            .field("component", &self.component)
            .finish()
    }
}

impl HealthReporter {
    /// Reports `Healthy`.
    pub fn healthy(&self) {
        self.set(HealthState::Healthy, None);
    }

    /// Reports `Healthy` with a note (e.g. "watching 3 files").
    pub fn healthy_because(&self, note: impl Into<String>) {
        self.set(HealthState::Healthy, Some(note.into()));
    }

    /// Reports `Degraded` with the reason: the component works, but holds something
    /// back that an operator should look at.
    pub fn degraded(&self, reason: impl Into<String>) {
        self.set(HealthState::Degraded, Some(reason.into()));
    }

    /// Reports `Unhealthy` with the reason.
    pub fn unhealthy(&self, reason: impl Into<String>) {
        self.set(HealthState::Unhealthy, Some(reason.into()));
    }

    /// Sets any state.
    pub fn set(&self, state: HealthState, reason: Option<String>) {
        let Some(health) = self.table.set(&self.component, state, reason) else {
            return;
        };
        if let Some(metrics) = &self.metrics {
            metrics.set(&self.component, state);
        }
        let expected = health.reason.as_deref() == Some("stopped");
        match state {
            HealthState::Degraded | HealthState::Unhealthy | HealthState::Exited if !expected => {
                tracing::warn!(
                    component = %self.component,
                    health = %health,
                    "Component health changed"
                )
            }
            _ => tracing::info!(
                component = %self.component,
                health = %health,
                "Component health changed"
            ),
        }
        self.publisher.publish(ComponentHealthChanged {
            component: self.component.clone(),
            health,
        });
    }
}

/// Makes [`HealthReporter`]s for the components of one kernel.
#[derive(Clone)]
struct Reporters {
    table: HealthTable,
    publisher: Publisher,
    metrics: Option<KernelMetrics>,
}

impl Reporters {
    fn for_component(&self, name: &Arc<str>) -> HealthReporter {
        HealthReporter {
            component: name.clone(),
            table: self.table.clone(),
            publisher: self.publisher.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

// === impl Context ===

/// What a running component gets from the kernel.
#[derive(Debug)]
pub struct Context {
    name: Arc<str>,
    publisher: Publisher,
    cancel: CancellationToken,
    health: HealthReporter,
    events: Option<Subscription>,
}

impl Context {
    /// The component's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Publishes events on the kernel's bus.
    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    /// Reports health.
    pub fn health(&self) -> &HealthReporter {
        &self.health
    }

    /// Completes when the component should stop.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    /// Whether the component should stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The component's cancellation token, for tasks it spawns.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// The next event the component [consumes](Component::consumes), in publish
    /// order; `None` once the component should stop (cancelled, or the bus closed).
    /// Without an interest it waits for the stop. Cancellation-safe: use it as a
    /// `select!` branch next to timers.
    pub async fn next_event(&mut self) -> Option<Arc<Event>> {
        let Some(events) = self.events.as_mut() else {
            self.cancel.cancelled().await;
            return None;
        };
        self.cancel
            .run_until_cancelled(events.recv())
            .await
            .flatten()
    }

    /// An event that is already waiting, if any (to coalesce a burst: latest wins).
    pub fn try_next_event(&mut self) -> Option<Arc<Event>> {
        self.events.as_mut()?.try_recv()
    }
}

// === impl Kernel ===

/// Collects components, then starts them in registration order.
pub struct Kernel {
    bus: Bus,
    components: Vec<Box<dyn Component>>,
    health: HealthTable,
    metrics: Option<KernelMetrics>,
    generation: u64,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field(
                "components",
                &self
                    .components
                    .iter()
                    .map(|c| c.name().to_owned())
                    .collect::<Vec<_>>(),
            )
            .field("generation", &self.generation)
            .finish()
    }
}

impl Kernel {
    /// A kernel over `bus` (not yet started).
    pub fn new(bus: Bus) -> Self {
        Self {
            bus,
            components: Vec::new(),
            health: HealthTable::default(),
            metrics: None,
            generation: 0,
        }
    }

    /// Exports component health through `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: KernelMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Sets the reinit generation recorded on every component span.
    #[must_use]
    pub fn with_generation(mut self, generation: u64) -> Self {
        self.generation = generation;
        self
    }

    /// Adds a component.
    pub fn register(&mut self, component: impl Component) -> &mut Self {
        self.components.push(Box::new(component));
        self
    }

    /// Adds a boxed component.
    pub fn register_boxed(&mut self, component: Box<dyn Component>) -> &mut Self {
        self.components.push(component);
        self
    }

    /// The health table, readable while the kernel runs.
    pub fn health(&self) -> HealthTable {
        self.health.clone()
    }

    /// Subscribes the components to what they consume, starts the bus and spawns them.
    /// Must run inside a Tokio runtime.
    pub fn start(self) -> Result<RunningKernel, KernelError> {
        let Kernel {
            bus,
            components,
            health,
            metrics,
            generation,
        } = self;
        let mut seen = BTreeSet::new();
        for component in &components {
            if !seen.insert(component.name().to_owned()) {
                return Err(KernelError::DuplicateName(component.name().to_owned()));
            }
        }
        let publisher = bus.publisher();
        let reporters = Reporters {
            table: health.clone(),
            publisher: publisher.clone(),
            metrics,
        };
        let reporter = |name: &Arc<str>| reporters.for_component(name);

        let mut ordered = Vec::with_capacity(components.len());
        for component in components {
            let name: Arc<str> = component.name().into();
            reporter(&name).set(HealthState::Unknown, None);
            let mandatory = component.mandatory();
            let subscribe = |(kinds, delivery): (KindSet, Delivery)| match delivery {
                Delivery::Pipeline => bus.subscribe(name.clone(), kinds),
                Delivery::Observer => bus.observe(name.clone(), kinds),
            };
            let events = component
                .consumes()
                .kinds
                .map(subscribe)
                .transpose()
                .map_err(|source| KernelError::Subscribe {
                    component: name.to_string(),
                    source,
                })?;
            ordered.push((name, mandatory, component, events));
        }
        bus.start().map_err(KernelError::Bus)?;

        let cancel = CancellationToken::new();
        let (failures_tx, failures) = mpsc::unbounded_channel();
        let mut tasks = Vec::with_capacity(ordered.len());
        for (name, mandatory, component, events) in ordered {
            let health = reporter(&name);
            let ctx = Context {
                name: name.clone(),
                publisher: publisher.clone(),
                cancel: cancel.child_token(),
                health: health.clone(),
                events,
            };
            let span = tracing::info_span!("component", component = %name, generation);
            health.healthy();
            if mandatory {
                health_table_of(&health).set_mandatory(&name);
            }
            let failures = mandatory.then(|| failures_tx.clone());
            let handle = tokio::spawn(supervise(component, ctx, failures).instrument(span));
            tasks.push((name, handle));
        }
        Ok(RunningKernel {
            bus,
            tasks,
            cancel,
            health,
            reporters,
            failures,
        })
    }
}

fn health_table_of(reporter: &HealthReporter) -> &HealthTable {
    &reporter.table
}

/// A mandatory component that exited while the kernel was running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentFailure {
    /// The component's name.
    pub component: String,
    /// How it ended: `returned before shutdown`, `failed: …` or `panicked: …`.
    pub reason: String,
}

/// Runs one component and turns its end into an `Exited` health with the reason. A
/// mandatory component (`failures` is set) that ends before cancellation is also
/// reported there.
async fn supervise(
    component: Box<dyn Component>,
    ctx: Context,
    failures: Option<mpsc::UnboundedSender<ComponentFailure>>,
) {
    let health = ctx.health.clone();
    let cancel = ctx.cancel.clone();
    let outcome = AssertUnwindSafe(component.run(ctx)).catch_unwind().await;
    let reason = match outcome {
        Ok(Ok(())) if cancel.is_cancelled() => "stopped".to_owned(),
        Ok(Ok(())) => "returned before shutdown".to_owned(),
        Ok(Err(error)) => format!("failed: {}", error_chain(error.as_ref())),
        Err(panic) => format!("panicked: {}", panic_message(panic.as_ref())),
    };
    health.set(HealthState::Exited, Some(reason.clone()));
    if let Some(failures) = failures
        && !cancel.is_cancelled()
    {
        let _ = failures.send(ComponentFailure {
            component: health.component.to_string(),
            reason,
        });
    }
}

fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Lowers the calling thread's scheduling priority by `nice` (only this thread: on
/// Linux a thread id addresses one thread), for work beside the pipeline that must
/// not take CPU from a change on a machine with few cores (status templates, the
/// facts of a crt-list read ahead for the next plan); when nothing else runs, the
/// thread gets the CPU all the same. A failure leaves the priority as it was.
pub fn lower_thread_priority(nice: i32) {
    let me = rustix::thread::gettid();
    let current = rustix::process::getpriority_process(Some(me)).unwrap_or(0);
    if let Err(error) = rustix::process::setpriority_process(Some(me), current + nice) {
        tracing::debug!(%error, "Cannot lower the thread's priority");
    }
}

/// The text of a panic's payload (`&str` or `String`), for reports.
pub fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "unknown panic payload".to_owned()
    }
}

// === impl RestartBackoff ===

/// Delays between restarts after mandatory component failures: 1 s, doubling up to
/// 60 s; a run that lasted [`reset_after`](Self::reset_after) (2 min by default,
/// longer than the longest delay) counts as healthy and starts over at 1 s. The
/// doubling keeps a component that fails at once from spinning the controller; the
/// reset keeps a rare failure from inheriting an old, long delay. The delays come
/// from `backon`'s exponential backoff (no jitter); this type adds the reset. The
/// managed HAProxy's supervisor restarts its process with it too.
#[derive(Debug)]
pub struct RestartBackoff {
    builder: backon::ExponentialBuilder,
    delays: backon::ExponentialBackoff,
    max: Duration,
    reset_after: Duration,
    attempt: u32,
}

impl Default for RestartBackoff {
    fn default() -> Self {
        Self::new(
            Duration::from_secs(1),
            Duration::from_secs(60),
            Duration::from_secs(120),
        )
    }
}

impl RestartBackoff {
    /// A backoff starting at `initial`, doubling up to `max`, reset by a run of at
    /// least `reset_after`.
    pub fn new(initial: Duration, max: Duration, reset_after: Duration) -> Self {
        use backon::BackoffBuilder as _;
        let builder = backon::ExponentialBuilder::default()
            .with_min_delay(initial)
            .with_max_delay(max)
            .with_factor(2.0)
            .without_max_times();
        Self {
            builder,
            delays: builder.build(),
            max,
            reset_after,
            attempt: 0,
        }
    }

    /// The delay before the next restart, given how long the failed run lasted.
    pub fn next_delay(&mut self, ran_for: Duration) -> Duration {
        if ran_for >= self.reset_after {
            self.reset();
        }
        self.attempt = self.attempt.saturating_add(1);
        self.delays.next().unwrap_or(self.max).min(self.max)
    }

    /// Restarts since the last reset (0 when the last run was healthy).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// How long a run must last to count as healthy.
    pub fn reset_after(&self) -> Duration {
        self.reset_after
    }

    /// Starts over at the initial delay (a run lasted long enough).
    pub fn reset(&mut self) {
        use backon::BackoffBuilder as _;
        self.attempt = 0;
        self.delays = self.builder.build();
    }
}

// === impl RunningKernel ===

/// Components of one kernel, running.
pub struct RunningKernel {
    bus: Bus,
    tasks: Vec<(Arc<str>, JoinHandle<()>)>,
    cancel: CancellationToken,
    health: HealthTable,
    reporters: Reporters,
    failures: mpsc::UnboundedReceiver<ComponentFailure>,
}

impl fmt::Debug for RunningKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunningKernel")
            .field("components", &self.order())
            .finish()
    }
}

/// What happened at shutdown.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Components that stopped within the deadline.
    pub stopped: Vec<String>,
    /// Components that were aborted at the deadline.
    pub aborted: Vec<String>,
}

impl RunningKernel {
    /// Names of the running components, in start order.
    pub fn order(&self) -> Vec<String> {
        self.tasks
            .iter()
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// The health table.
    pub fn health(&self) -> HealthTable {
        self.health.clone()
    }

    /// The bus.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// Completes when every component has exited (on its own or after cancellation).
    pub async fn exited(&mut self) {
        for (_, handle) in &mut self.tasks {
            if !handle.is_finished() {
                let _ = handle.await;
            }
        }
    }

    /// Completes when a [mandatory](Component::mandatory) component exits before
    /// shutdown (returns, fails or panics), with its name and the reason; pending
    /// forever while they all run. Cancel-safe: a failure not yet taken stays queued.
    pub async fn failed(&mut self) -> ComponentFailure {
        match self.failures.recv().await {
            Some(failure) => failure,
            None => std::future::pending().await,
        }
    }

    /// Cancels every component and waits up to `grace` for them to return; the ones
    /// still running are aborted and marked `Exited` with that reason. Closes the bus.
    pub async fn shutdown(self, grace: Duration) -> ShutdownReport {
        let RunningKernel {
            bus,
            tasks,
            cancel,
            reporters,
            health,
            ..
        } = self;
        health.retire();
        cancel.cancel();
        let deadline = tokio::time::Instant::now() + grace;
        let mut report = ShutdownReport::default();
        for (name, mut handle) in tasks {
            match tokio::time::timeout_at(deadline, &mut handle).await {
                Ok(_) => report.stopped.push(name.to_string()),
                Err(_) => {
                    handle.abort();
                    let _ = handle.await;
                    tracing::warn!(component = %name, ?grace, "Component did not stop in time; aborted");
                    reporters.for_component(&name).set(
                        HealthState::Exited,
                        Some(format!("did not stop within {grace:?}; aborted")),
                    );
                    report.aborted.push(name.to_string());
                }
            }
        }
        bus.close();
        report
    }
}

/// Sleeps until `at`, and never completes for `None`: the `select!` branch of an
/// optional deadline (a retry, a release window, a debounce) in a component's loop.
pub async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
