//! The debouncer's decisions as a state machine that needs no runtime: the component
//! ([`super::Debouncer`]) asks [`State::wait`] what to wait for, feeds what happened
//! to [`State::step`] with the current time, and carries out the [`Action`]s it gets
//! back. Every rule of the [module docs](super) lives here.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::EventId;
use tokio::time::Instant;

use super::Settings;

/// What happened, as the debouncer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Input {
    /// The component started: the initial sync's timeout starts now.
    Started,
    /// A source published a new snapshot (`ResourceIndexUpdated`).
    Changed {
        /// The watched resource's name.
        source: Arc<str>,
        /// The event, for the trigger's `caused_by`.
        cause: EventId,
        /// Whether the update removed objects (its change lists removed ones).
        removes: bool,
    },
    /// A source finished its initial sync (`ResourceSyncComplete`).
    Synced {
        /// The watched resource's name.
        source: Arc<str>,
        /// The event, for the trigger's `caused_by`.
        cause: EventId,
    },
    /// The executor finished a reconciliation (`ReconciliationCompleted` or
    /// `ReconciliationFailed`): it is idle until the next trigger.
    Reconciled,
    /// The renderer finished a render (`TemplateRendered`): the reconciliation under
    /// way is past its render, and a trigger now would supersede only its
    /// validation.
    Rendered,
    /// No event was queued when [`Wait::Queued`] asked for one.
    QueueEmpty,
    /// The deadline of [`Wait::Until`] passed before an event came.
    Deadline,
}

/// What the component does for the state machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Publish a `ReconciliationTriggered`.
    Trigger(Trigger),
    /// Yield once, so a publisher on another thread finishes its group of updates
    /// before [`Wait::Queued`] reads the queue (a leading trigger is due).
    Yield,
    /// Report the component healthy.
    Healthy,
    /// Report the component unhealthy, with the reason.
    Unhealthy(String),
}

/// One `ReconciliationTriggered` to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Trigger {
    /// Why, for people ("resources changed: endpoints, services").
    pub(crate) reason: String,
    /// The sources that changed since the previous trigger, in name order.
    pub(crate) sources: Vec<Arc<str>>,
    /// How long the first of these changes waited.
    pub(crate) waited: Duration,
    /// The event that completed the batch (its last change, or the last sync).
    pub(crate) cause: Option<EventId>,
    /// The changes within the leading group of the trigger before it
    /// (`ReconciliationTriggered::follow_up`).
    pub(crate) follow_up: bool,
}

/// What the component waits for before the next [`State::step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// A leading trigger is due: take an event only if one is already queued, and
    /// feed [`Input::QueueEmpty`] when none is.
    Queued,
    /// The next event, or [`Input::Deadline`] once the deadline passes (`None`: no
    /// deadline).
    Until(Option<Instant>),
}

/// A batch of changes waiting for its trigger.
#[derive(Debug, Default)]
struct Batch {
    sources: BTreeSet<Arc<str>>,
    first: Option<Instant>,
    last: Option<Instant>,
    cause: Option<EventId>,
    /// Whether a change of the batch removed objects: then it waits for the quiet
    /// period (or max wait), never for the leading edge or its group.
    removes: bool,
}

impl Batch {
    fn record(&mut self, source: Arc<str>, cause: EventId, removes: bool, now: Instant) {
        self.sources.insert(source);
        self.removes |= removes;
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

/// The debouncer's state: the initial sync gate, the batch waiting for its trigger,
/// and the leading edge.
#[derive(Debug)]
pub(crate) struct State {
    settings: Settings,
    /// The watched sources the first trigger waits for.
    sources: BTreeSet<Arc<str>>,
    /// When the first trigger stops waiting for the initial sync.
    sync_deadline: Option<Instant>,
    /// The sources that finished their initial sync.
    synced: BTreeSet<Arc<str>>,
    /// Whether the first trigger went out.
    initial_done: bool,
    /// Sources still syncing when the first trigger went out without them.
    late: BTreeSet<Arc<str>>,
    batch: Batch,
    /// When the last change arrived, batched or fired.
    last_change: Option<Instant>,
    /// End of the window after a leading trigger whose changes go out together.
    group_until: Option<Instant>,
    /// A leading trigger waits only for the events already queued.
    leading_pending: bool,
    /// A trigger of changes within the leading group is due before the group's
    /// end, the executor being idle: it waits only for the events already queued.
    group_due: bool,
    /// Whether a trigger went out whose render has not finished yet, as far as
    /// the debouncer knows (a trigger from elsewhere is not seen).
    rendering: bool,
}

impl State {
    /// A debouncer whose first trigger waits for the initial sync of `sources`.
    pub(crate) fn new(settings: Settings, sources: BTreeSet<Arc<str>>) -> Self {
        Self {
            settings,
            sources,
            sync_deadline: None,
            synced: BTreeSet::new(),
            initial_done: false,
            late: BTreeSet::new(),
            batch: Batch::default(),
            last_change: None,
            group_until: None,
            leading_pending: false,
            group_due: false,
            rendering: false,
        }
    }

    /// What to wait for next.
    pub(crate) fn wait(&self) -> Wait {
        if self.leading_pending || self.group_due {
            return Wait::Queued;
        }
        if !self.initial_done {
            return Wait::Until(self.sync_deadline);
        }
        let deadline = match (self.batch.first, self.batch.last, self.group_until) {
            // Changes that arrived right after a leading trigger (a removal among
            // them waits for the quiet period instead).
            (Some(first), Some(_), Some(group)) if first < group && !self.batch.removes => {
                Some(group)
            }
            (Some(first), Some(last), _) => {
                Some((last + self.settings.debounce).min(first + self.settings.max_wait))
            }
            _ => None,
        };
        Wait::Until(deadline)
    }

    /// Takes `input`, which happened at `now`, and says what to do.
    pub(crate) fn step(&mut self, input: Input, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        match input {
            Input::Started => self.start(now, &mut actions),
            Input::Changed {
                source,
                cause,
                removes,
            } => {
                self.leading_if_overdue(now, &mut actions);
                self.change(source, cause, removes, now, &mut actions);
            }
            Input::Synced { source, cause } => {
                self.leading_if_overdue(now, &mut actions);
                self.sync(&source, cause, now, &mut actions);
            }
            Input::Reconciled | Input::Rendered => {
                self.rendering = false;
                self.group_if_idle(now, &mut actions);
            }
            Input::QueueEmpty => {
                if self.leading_pending {
                    self.fire_leading(now, &mut actions);
                } else if self.group_due {
                    self.fire_group(now, &mut actions);
                }
            }
            Input::Deadline => self.deadline(now, &mut actions),
        }
        actions
    }

    /// The initial sync's timeout starts; with no sources to wait for, the first
    /// trigger goes at once.
    fn start(&mut self, now: Instant, actions: &mut Vec<Action>) {
        self.sync_deadline = Some(now + self.settings.sync_timeout);
        if self.sources.is_empty() {
            self.initial_done = true;
            self.fire(
                "initial render (no watched resources)".to_owned(),
                now,
                actions,
            );
        }
    }

    /// A leading trigger that waited `max_wait` for the queue to empty goes before
    /// the next event is taken in.
    fn leading_if_overdue(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let overdue = self
            .batch
            .first
            .is_some_and(|first| now >= first + self.settings.max_wait);
        if self.leading_pending && overdue {
            self.fire_leading(now, actions);
        }
    }

    /// A change joins the batch; the first one after a quiet period makes a leading
    /// trigger due, which goes with whatever is already queued behind it. A batch
    /// that removes objects takes no leading edge: the first deletion of a stream
    /// (files deleted one by one, a namespace emptied) waits for the rest, so the
    /// safety valve measures the removal whole instead of letting its first part out.
    fn change(
        &mut self,
        source: Arc<str>,
        cause: EventId,
        removes: bool,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        let quiet = self
            .last_change
            .is_none_or(|last| now >= last + self.settings.debounce);
        let nothing_pending = self.batch.first.is_none();
        self.last_change = Some(now);
        self.batch.record(source, cause, removes, now);
        if self.batch.removes {
            // A leading trigger due for changes queued before this one waits too.
            self.leading_pending = false;
            self.group_due = false;
        } else if self.settings.leading_edge && self.initial_done && quiet && nothing_pending {
            self.leading_pending = true;
            actions.push(Action::Yield);
        } else {
            self.group_if_idle(now, actions);
        }
    }

    /// Changes within the leading group go out before the group's end once the
    /// leading reconciliation is past its render (rendered, or finished): the
    /// renderer is free, the incomplete render's validation is all they supersede,
    /// and waiting would only delay them (and let the incomplete config out first).
    /// Like a leading trigger, the trigger takes the events already queued with it.
    fn group_if_idle(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let in_group = match (self.batch.first, self.group_until) {
            (Some(first), Some(group)) => first < group && now < group,
            _ => false,
        };
        if in_group
            && !self.batch.removes
            && !self.rendering
            && !self.leading_pending
            && !self.group_due
        {
            self.group_due = true;
            actions.push(Action::Yield);
        }
    }

    /// The changes within the leading group go, before its end.
    fn fire_group(&mut self, now: Instant, actions: &mut Vec<Action>) {
        self.group_due = false;
        let reason = format!(
            "resources changed: {} (with the leading change)",
            self.batch.names()
        );
        self.fire_as(reason, true, now, actions);
    }

    /// A source's initial sync is complete: a late source clears the unhealthy
    /// report once all have caught up, and the last one fires the first trigger.
    fn sync(&mut self, source: &Arc<str>, cause: EventId, now: Instant, actions: &mut Vec<Action>) {
        if !self.sources.contains(source) {
            tracing::debug!(%source, "Sync complete from an unwatched source");
            return;
        }
        self.synced.insert(source.clone());
        if self.late.remove(source) {
            tracing::info!(%source, "Late source finished its initial sync");
            actions.push(if self.late.is_empty() {
                Action::Healthy
            } else {
                Action::Unhealthy(self.late_reason())
            });
        }
        if !self.initial_done && self.synced.is_superset(&self.sources) {
            self.initial_done = true;
            self.batch.cause = Some(cause);
            let reason = format!("initial sync complete: {}", join(&self.sources));
            self.fire(reason, now, actions);
        }
    }

    /// A deadline passed: the initial sync's timeout, the end of the leading group,
    /// or the batch's quiet period or max wait.
    fn deadline(&mut self, now: Instant, actions: &mut Vec<Action>) {
        if !self.initial_done {
            self.sync_timed_out(now, actions);
            return;
        }
        if self.batch.first.is_none() {
            // Nothing waits for a trigger (a deadline that was not asked for).
            return;
        }
        let grouped = self
            .group_until
            .take()
            .is_some_and(|group| self.batch.first.is_some_and(|first| first < group));
        let follow_up = grouped && !self.batch.removes;
        let reason = if follow_up {
            format!(
                "resources changed: {} (with the leading change)",
                self.batch.names()
            )
        } else {
            let mut reason = format!("resources changed: {}", self.batch.names());
            if self.batch.removes && self.settings.leading_edge {
                reason.push_str(" (objects removed: after the quiet period)");
            }
            if self
                .batch
                .first
                .is_some_and(|first| now >= first + self.settings.max_wait)
            {
                let _ = write!(reason, " (max wait {:?} reached)", self.settings.max_wait);
            }
            reason
        };
        self.fire_as(reason, follow_up, now, actions);
    }

    /// The first trigger goes without the sources that have not synced yet; the
    /// component is unhealthy until they have.
    fn sync_timed_out(&mut self, now: Instant, actions: &mut Vec<Action>) {
        self.initial_done = true;
        self.late = self.sources.difference(&self.synced).cloned().collect();
        let names = join(&self.late);
        let timeout = self.settings.sync_timeout;
        tracing::warn!(
            late = %names,
            ?timeout,
            "Sources did not finish their initial sync in time; rendering without them"
        );
        actions.push(Action::Unhealthy(self.late_reason()));
        let mut reason =
            format!("initial sync timed out after {timeout:?}; still waiting for: {names}");
        if !self.batch.sources.is_empty() {
            let _ = write!(reason, "; changed: {}", self.batch.names());
        }
        self.fire(reason, now, actions);
    }

    fn late_reason(&self) -> String {
        format!(
            "initial sync not complete after {:?}: {}",
            self.settings.sync_timeout,
            join(&self.late)
        )
    }

    /// The leading trigger goes; changes within `leading_group` from now go
    /// together at the end of that window.
    fn fire_leading(&mut self, now: Instant, actions: &mut Vec<Action>) {
        self.leading_pending = false;
        let reason = format!("resources changed: {} (leading edge)", self.batch.names());
        self.fire(reason, now, actions);
        self.group_until = Some(now + self.settings.leading_group);
    }

    /// Empties the batch into a trigger.
    fn fire(&mut self, reason: String, now: Instant, actions: &mut Vec<Action>) {
        self.fire_as(reason, false, now, actions);
    }

    /// [`Self::fire`], for the changes within the leading group when `follow_up`.
    fn fire_as(
        &mut self,
        reason: String,
        follow_up: bool,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        self.rendering = true;
        self.group_due = false;
        let batch = std::mem::take(&mut self.batch);
        actions.push(Action::Trigger(Trigger {
            follow_up,
            reason,
            waited: batch
                .first
                .map_or(Duration::ZERO, |first| now.saturating_duration_since(first)),
            sources: batch.sources.into_iter().collect(),
            cause: batch.cause,
        }));
    }
}
