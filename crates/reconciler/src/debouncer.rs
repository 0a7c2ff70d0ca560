//! The debouncer: turns bursts of `ResourceIndexUpdated` into one
//! `ReconciliationTriggered`.
//!
//! - **Leading edge** (on by default): a change that follows at least `debounce`
//!   without any change fires at once, so a lone change is not delayed; changes
//!   already queued behind it go with it (files sources of one directory publish
//!   the updates of one scan back to back). Changes that follow it within the burst
//!   are coalesced as below. One change often reaches several sources a few
//!   milliseconds apart (Kubernetes watches of a Service and its EndpointSlice;
//!   `kubectl apply` of several objects): changes within `leading_group` of the
//!   leading trigger are gathered into one more trigger at the end of that short
//!   window, so the incomplete first render is superseded within milliseconds
//!   instead of after the quiet period. Later changes of the burst are coalesced as
//!   below. `leading_edge: false` keeps the purely trailing behaviour.
//! - **Quiet period**: a trigger fires `debounce` after the last change...
//! - **Max wait**: ...but never later than `max_wait` after the first change of a
//!   batch, so a constant stream of changes cannot starve deployment.
//! - **Initial sync gate**: the first trigger waits until every watched source has
//!   sent `ResourceSyncComplete` (and fires as soon as the last one has). After
//!   `sync_timeout` it proceeds anyway, names the late sources in the trigger's reason
//!   and in a warning, and reports itself unhealthy until they catch up.
//!
//! The trigger's `sources` are the sources that changed since the previous trigger,
//! in name order; its reason lists them.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::{
    Component, ComponentError, Context, EventId, EventKind, EventMeta, EventPayload, Interest,
    ReconciliationTriggered,
};
use tokio::time::Instant;

/// Debouncer timings (`controller.debounce`, `controller.maxWait`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Quiet time after the last change before a trigger fires.
    pub debounce: Duration,
    /// Longest time from the first change of a batch to its trigger.
    pub max_wait: Duration,
    /// How long the first trigger waits for every source's initial sync.
    pub sync_timeout: Duration,
    /// Fire at once on the first change after a quiet period of at least `debounce`
    /// (`controller.debounceLeadingEdge`).
    pub leading_edge: bool,
    /// How long after a leading trigger changes still count as part of the same
    /// change (gathered into one trigger at the end of this window).
    pub leading_group: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            debounce: Duration::from_millis(200),
            max_wait: Duration::from_secs(2),
            sync_timeout: Duration::from_secs(30),
            leading_edge: true,
            leading_group: Duration::from_millis(10),
        }
    }
}

/// The debouncer component. See the [module docs](self).
pub struct Debouncer {
    settings: Settings,
    sources: BTreeSet<Arc<str>>,
}

impl std::fmt::Debug for Debouncer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Debouncer")
            .field("settings", &self.settings)
            .field("sources", &self.sources)
            .finish()
    }
}

impl Debouncer {
    /// The component name.
    pub const NAME: &'static str = "debouncer";

    /// A debouncer whose first trigger waits for the initial sync of `sources` (the
    /// watched resource names). With no sources, the first trigger fires at start.
    pub fn new<S: Into<Arc<str>>>(
        settings: Settings,
        sources: impl IntoIterator<Item = S>,
    ) -> Self {
        Self {
            settings,
            sources: sources.into_iter().map(Into::into).collect(),
        }
    }
}

/// A batch of changes waiting for its trigger.
#[derive(Debug, Default)]
struct Batch {
    sources: BTreeSet<Arc<str>>,
    first: Option<Instant>,
    last: Option<Instant>,
    cause: Option<EventId>,
}

impl Batch {
    fn record(&mut self, source: &Arc<str>, cause: EventId, now: Instant) {
        self.sources.insert(source.clone());
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.cause = Some(cause);
    }

    fn names(&self) -> String {
        join(&self.sources)
    }
}

fn join(names: &BTreeSet<Arc<str>>) -> String {
    let mut out = String::new();
    for (index, name) in names.iter().enumerate() {
        if index > 0 {
            out.push_str(", ");
        }
        out.push_str(name);
    }
    out
}

#[async_trait::async_trait]
impl Component for Debouncer {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([
            EventKind::ResourceIndexUpdated,
            EventKind::ResourceSyncComplete,
        ])
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        let Debouncer { settings, sources } = *self;
        let publisher = ctx.publisher().clone();
        let started = Instant::now();
        let mut synced: BTreeSet<Arc<str>> = BTreeSet::new();
        let mut initial_done = false;
        let mut late: BTreeSet<Arc<str>> = BTreeSet::new();
        let mut batch = Batch::default();
        // When the last change arrived, batched or fired.
        let mut last_change: Option<Instant> = None;
        // End of the window after a leading trigger whose changes go out together.
        let mut group_until: Option<Instant> = None;
        // A leading trigger waits only for the events already queued.
        let mut leading_pending = false;

        let fire = |batch: &mut Batch, reason: String| {
            let batch = std::mem::take(batch);
            tracing::info!(%reason, "Reconciliation triggered");
            let waited = batch.first.map_or(Duration::ZERO, |first| first.elapsed());
            publisher.publish_with(
                ReconciliationTriggered {
                    reason,
                    sources: batch.sources.into_iter().collect(),
                    waited,
                },
                EventMeta {
                    correlation_id: None,
                    caused_by: batch.cause,
                },
            );
        };

        if sources.is_empty() {
            initial_done = true;
            fire(
                &mut batch,
                "initial render (no watched resources)".to_owned(),
            );
        }

        loop {
            let deadline = if !initial_done {
                Some(started + settings.sync_timeout)
            } else {
                match (batch.first, batch.last, group_until) {
                    // Changes that arrived right after a leading trigger.
                    (Some(first), Some(_), Some(group)) if first < group => Some(group),
                    (Some(first), Some(last), _) => {
                        Some((last + settings.debounce).min(first + settings.max_wait))
                    }
                    _ => None,
                }
            };
            let event = if leading_pending {
                // A leading trigger is due: first take what is already queued, so
                // updates published together (one scan of a directory) go together;
                // a queue that never empties still fires it after `max_wait`.
                let overdue = batch
                    .first
                    .is_some_and(|first| Instant::now() >= first + settings.max_wait);
                match (!overdue).then(|| ctx.try_next_event()).flatten() {
                    Some(event) => Some(event),
                    None => {
                        leading_pending = false;
                        let reason = format!("resources changed: {} (leading edge)", batch.names());
                        fire(&mut batch, reason);
                        group_until = Some(Instant::now() + settings.leading_group);
                        continue;
                    }
                }
            } else {
                tokio::select! {
                    biased;
                    () = hapwright_eventbus::sleep_until(deadline) => None,
                    event = ctx.next_event() => match event {
                        Some(event) => Some(event),
                        None => return Ok(()),
                    },
                }
            };
            let now = Instant::now();
            let Some(event) = event else {
                // A deadline passed.
                if !initial_done {
                    initial_done = true;
                    late = sources.difference(&synced).cloned().collect();
                    let names = join(&late);
                    tracing::warn!(
                        late = %names,
                        timeout = ?settings.sync_timeout,
                        "Sources did not finish their initial sync in time; rendering without them"
                    );
                    ctx.health().unhealthy(format!(
                        "initial sync not complete after {:?}: {names}",
                        settings.sync_timeout
                    ));
                    let mut reason = format!(
                        "initial sync timed out after {:?}; still waiting for: {names}",
                        settings.sync_timeout
                    );
                    if !batch.sources.is_empty() {
                        let _ = write!(reason, "; changed: {}", batch.names());
                    }
                    fire(&mut batch, reason);
                } else if group_until
                    .take()
                    .is_some_and(|group| batch.first.is_some_and(|first| first < group))
                {
                    let reason = format!(
                        "resources changed: {} (with the leading change)",
                        batch.names()
                    );
                    fire(&mut batch, reason);
                } else {
                    let mut reason = format!("resources changed: {}", batch.names());
                    if batch
                        .first
                        .is_some_and(|first| now >= first + settings.max_wait)
                    {
                        let _ = write!(reason, " (max wait {:?} reached)", settings.max_wait);
                    }
                    fire(&mut batch, reason);
                }
                continue;
            };
            match &event.payload {
                EventPayload::ResourceIndexUpdated(update) => {
                    let quiet = last_change.is_none_or(|last| now >= last + settings.debounce);
                    let nothing_pending = batch.first.is_none();
                    last_change = Some(now);
                    batch.record(&update.source, event.id, now);
                    if settings.leading_edge && initial_done && quiet && nothing_pending {
                        // The first change after a quiet period: it goes now, with
                        // whatever is already queued behind it (a moment's yield
                        // lets a publisher on another thread finish its group); the
                        // rest of a burst waits.
                        tokio::task::yield_now().await;
                        leading_pending = true;
                    }
                }
                EventPayload::ResourceSyncComplete(sync) => {
                    if !sources.contains(&sync.source) {
                        tracing::debug!(source = %sync.source, "Sync complete from an unwatched source");
                        continue;
                    }
                    synced.insert(sync.source.clone());
                    if late.remove(&sync.source) {
                        tracing::info!(source = %sync.source, "Late source finished its initial sync");
                        if late.is_empty() {
                            ctx.health().healthy();
                        } else {
                            ctx.health().unhealthy(format!(
                                "initial sync not complete after {:?}: {}",
                                settings.sync_timeout,
                                join(&late)
                            ));
                        }
                    }
                    if !initial_done && synced.is_superset(&sources) {
                        initial_done = true;
                        batch.cause = Some(event.id);
                        fire(
                            &mut batch,
                            format!("initial sync complete: {}", join(&sources)),
                        );
                    }
                }
                _ => {}
            }
        }
    }
}
