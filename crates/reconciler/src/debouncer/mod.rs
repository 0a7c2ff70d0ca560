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
//!   instead of after the quiet period; and sooner, as soon as the leading
//!   reconciliation is past its render (`TemplateRendered`) or finished
//!   (`ReconciliationCompleted` or `Failed`): the renderer is then free, and the
//!   trigger supersedes at most the validation of the incomplete render, which is
//!   then not deployed on its own (one such trigger at a time: changes while it
//!   renders wait for its render's end or the window's). Later changes of
//!   the burst are coalesced as below. `leading_edge: false` keeps the purely trailing behaviour.
//! - **Removals take no leading edge**: a batch with a change that removed objects
//!   (a deleted file, Service, EndpointSlice, ...) fires only after the quiet period
//!   (or max wait), never on the leading edge or at the end of its group. Deletions
//!   rarely come alone (files removed one by one, a namespace emptied object by
//!   object): this way the rest of the stream joins the first one, and the safety
//!   valve sees the removal whole instead of letting its first part out. Additions
//!   and modifications (a pod replaced, an endpoint moved) keep the leading edge; a
//!   lone deletion goes out `debounce` after it.
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
//!
//! The rules above are a state machine (`state.rs`) that needs no runtime and is
//! tested step by step; the component only feeds it events, deadlines and the time,
//! and publishes what it decides.

mod state;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::{
    Component, ComponentError, Context, Event, EventKind, EventMeta, EventPayload, Interest,
    ReconciliationTriggered,
};
use tokio::time::Instant;

use state::{Action, Input, State, Trigger, Wait};

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

#[async_trait::async_trait]
impl Component for Debouncer {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([
            EventKind::ResourceIndexUpdated,
            EventKind::ResourceSyncComplete,
            EventKind::ReconciliationCompleted,
            EventKind::ReconciliationFailed,
            EventKind::TemplateRendered,
        ])
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        let Debouncer { settings, sources } = *self;
        let mut state = State::new(settings, sources);
        let mut actions = state.step(Input::Started, Instant::now());
        loop {
            for action in actions.drain(..) {
                act(&ctx, action).await;
            }
            let input = match state.wait() {
                Wait::Queued => match ctx.try_next_event() {
                    Some(event) => input(&event),
                    None => Some(Input::QueueEmpty),
                },
                Wait::Until(deadline) => tokio::select! {
                    biased;
                    () = hapwright_eventbus::sleep_until(deadline) => Some(Input::Deadline),
                    event = ctx.next_event() => match event {
                        Some(event) => input(&event),
                        None => return Ok(()),
                    },
                },
            };
            if let Some(input) = input {
                actions = state.step(input, Instant::now());
            }
        }
    }
}

/// The state machine's input for an event (`None`: not one the debouncer uses).
fn input(event: &Event) -> Option<Input> {
    match &event.payload {
        EventPayload::ResourceIndexUpdated(update) => Some(Input::Changed {
            source: update.source.clone(),
            cause: event.id,
            removes: !update.change.removed.is_empty(),
        }),
        EventPayload::ResourceSyncComplete(sync) => Some(Input::Synced {
            source: sync.source.clone(),
            cause: event.id,
        }),
        EventPayload::ReconciliationCompleted(_) | EventPayload::ReconciliationFailed(_) => {
            Some(Input::Reconciled)
        }
        EventPayload::TemplateRendered(_) => Some(Input::Rendered),
        _ => None,
    }
}

/// Carries out one of the state machine's actions.
async fn act(ctx: &Context, action: Action) {
    match action {
        Action::Trigger(Trigger {
            reason,
            sources,
            waited,
            cause,
            follow_up,
        }) => {
            tracing::info!(%reason, "Reconciliation triggered");
            ctx.publisher().publish_with(
                ReconciliationTriggered {
                    reason,
                    sources,
                    waited,
                    follow_up,
                },
                EventMeta {
                    correlation_id: None,
                    caused_by: cause,
                },
            );
        }
        // A moment's yield lets a publisher on another thread finish its group.
        Action::Yield => tokio::task::yield_now().await,
        Action::Healthy => ctx.health().healthy(),
        Action::Unhealthy(reason) => ctx.health().unhealthy(reason),
    }
}
