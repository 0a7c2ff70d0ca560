//! The executor: runs one reconciliation at a time.
//!
//! A reconciliation is: trigger → render → validation outcome.
//!
//! 1. On `ReconciliationTriggered` the executor assigns a new [`CorrelationId`] and
//!    publishes `ReconciliationStarted` in it. The renderer renders on that event.
//! 2. `TemplateRendered` / `TemplateRenderFailed` in the current correlation ends the
//!    render stage. A render whose hash equals the last *settled* outcome (validated
//!    or rejected) short-circuits: the reconciliation completes (or fails) at once
//!    with that outcome, without waiting for validation.
//! 3. `ValidationCompleted` / `ValidationFailed` in the current correlation ends the
//!    reconciliation: `ReconciliationCompleted { duration, stages }` or
//!    `ReconciliationFailed { stage, errors }`.
//!
//! **Latest wins.** A trigger that arrives while a reconciliation is rendering or
//! validating supersedes it: the executor drops the in-flight correlation and starts
//! a new one with the newest data. Results that still arrive for a superseded
//! correlation are ignored (validators and other consumers can watch
//! `ReconciliationStarted` to abandon superseded work early). Triggers that are
//! already queued together start one reconciliation, for the newest.
//!
//! **Quarantine.** With [`Settings::quarantine`] on (the renderer then searches for
//! culprits), a failed render or validation does not fail the reconciliation at
//! once: the executor waits for the renderer's `QuarantineSearched` in the same
//! correlation. When the search gave up, the reconciliation fails with the original
//! errors; otherwise the `TemplateRendered` of the reduced change that follows goes
//! through validation as usual. A second failure in the same reconciliation fails
//! it.
//!
//! **Retry of a rejected change.** A change rejected whole because the search gave
//! up for a reason that may pass (`tool_failure`: `haproxy -c` timed out or could
//! not run; `bound_reached`; `baseline_fails` at validation: the last good objects
//! fail `haproxy -c` too, an environment problem such as a server name that no
//! longer resolves) is tried again on its own, without waiting for another change:
//! the executor publishes a `ReconciliationTriggered` (reason `retry N after
//! <reason>`) after a delay that doubles from [`Retry::first`] up to
//! [`Retry::max`], at most [`Retry::attempts`] times in a row. Any reconciliation
//! that starts cancels the pending retry; one that completes ends the series; one
//! that fails otherwise (a template error) ends it too, since trying the same
//! input again would fail the same way. A render equal to one rejected this way is
//! validated again rather than failed by the short-circuit above.
//!
//! A stage that takes longer than `stage_timeout` (a validator that never answers)
//! fails the reconciliation with that stage, so the executor never wedges.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use hapwright_eventbus::model::{ContentHash, Diagnostic};
use hapwright_eventbus::{
    Component, ComponentError, Context, CorrelationId, Event, EventKind, EventMeta, EventPayload,
    Interest, Publisher, ReconciliationCompleted, ReconciliationFailed, ReconciliationStarted,
    ReconciliationTriggered, Stage,
};
use tokio::time::Instant;

use crate::quarantine::Rejection;

/// Executor settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Longest time one stage (render, validation) may take before the
    /// reconciliation fails with that stage.
    pub stage_timeout: Duration,
    /// The renderer searches for culprits after a failure (see the
    /// [module docs](self)): wait for its `QuarantineSearched` before failing.
    pub quarantine: bool,
    /// Retries of a change rejected whole for a reason that may pass (see the
    /// [module docs](self)).
    pub retry: Retry,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            stage_timeout: Duration::from_secs(120),
            quarantine: false,
            retry: Retry::default(),
        }
    }
}

/// The schedule of retries of a rejected change: `first`, then doubling up to
/// `max`, at most `attempts` in a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    /// The delay before the first retry.
    pub first: Duration,
    /// The longest delay between two retries.
    pub max: Duration,
    /// Most retries after one rejection before waiting for a change again; 0 turns
    /// retries off.
    pub attempts: usize,
}

impl Default for Retry {
    /// 5 s, 10 s, 20 s … up to 5 minutes, 10 times (about 25 minutes in all).
    fn default() -> Self {
        Self {
            first: Duration::from_secs(5),
            max: Duration::from_secs(300),
            attempts: 10,
        }
    }
}

impl Retry {
    fn backoff(&self) -> ExponentialBackoff {
        ExponentialBuilder::new()
            .with_min_delay(self.first)
            .with_max_delay(self.max)
            .with_factor(2.0)
            .with_max_times(self.attempts)
            .build()
    }
}

/// The executor component. See the [module docs](self).
pub struct Executor {
    settings: Settings,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("settings", &self.settings)
            .finish()
    }
}

impl Executor {
    /// The component name.
    pub const NAME: &'static str = "executor";

    /// A new executor.
    pub fn new(settings: Settings) -> Self {
        Self { settings }
    }
}

/// The reconciliation in flight.
#[derive(Debug)]
struct InFlight {
    id: CorrelationId,
    started: Instant,
    stage: Stage,
    stage_started: Instant,
    stages: Vec<(Stage, Duration)>,
    span: tracing::Span,
    /// The failure the quarantine search is running for.
    failure: Option<(Stage, Vec<Diagnostic>)>,
    /// The quarantine search already ran once in this reconciliation.
    searched: bool,
}

impl InFlight {
    /// Closes the current stage and opens `next`.
    fn advance(&mut self, now: Instant, next: Stage) {
        self.stages.push((
            self.stage,
            now.saturating_duration_since(self.stage_started),
        ));
        self.stage = next;
        self.stage_started = now;
    }
}

/// The last outcome that settled a config, for the identical-output short-circuit.
#[derive(Clone, Debug)]
enum Settled {
    Valid(ContentHash),
    Invalid(ContentHash, Vec<Diagnostic>),
}

/// The retries of a rejected change.
#[derive(Debug)]
struct Retrying {
    /// The delays left in this series.
    backoff: ExponentialBackoff,
    /// Retries made in this series.
    attempt: usize,
    /// When the next retry fires; `None` while a reconciliation runs.
    at: Option<Instant>,
    /// Why the change was rejected.
    reason: &'static str,
}

struct State {
    publisher: Publisher,
    settings: Settings,
    in_flight: Option<InFlight>,
    settled: Option<Settled>,
    retrying: Option<Retrying>,
}

impl State {
    fn meta(id: CorrelationId, cause: &Event) -> EventMeta {
        EventMeta {
            correlation_id: Some(id),
            caused_by: Some(cause.id),
        }
    }

    /// Drops the in-flight reconciliation: a newer trigger replaces it.
    fn supersede(&mut self) {
        if let Some(old) = self.in_flight.take() {
            old.span.in_scope(|| {
                tracing::info!(stage = ?old.stage, "Reconciliation superseded by a newer trigger");
            });
        }
    }

    fn start(&mut self, trigger: &Arc<Event>, reason: String, coalesced: usize) {
        self.supersede();
        if let Some(retrying) = &mut self.retrying {
            // This reconciliation decides whether another retry follows.
            retrying.at = None;
        }
        let id = CorrelationId::new();
        let (waited, follow_up) = match &trigger.payload {
            EventPayload::ReconciliationTriggered(t) => (t.waited, t.follow_up),
            _ => (Duration::ZERO, false),
        };
        // `wait_us`: the debounce wait before the trigger. Trace exporters start the
        // span that long before it is created, so the reconciliation's trace begins
        // with the change that caused it.
        // Signed: trace exporters keep i64 fields as numbers.
        let wait_us = i64::try_from(waited.as_micros()).unwrap_or(i64::MAX);
        let span = tracing::info_span!(
            "reconciliation",
            correlation_id = %id,
            reason = %reason,
            wait_us,
        );
        span.in_scope(|| tracing::info!(coalesced, "Reconciliation started"));
        // The debounce wait as a stage of its own; it ended with the trigger.
        drop(tracing::info_span!(parent: &span, "debounce", wait_us));
        let now = Instant::now();
        self.in_flight = Some(InFlight {
            id,
            started: now,
            stage: Stage::Render,
            stage_started: now,
            stages: Vec::new(),
            span,
            failure: None,
            searched: false,
        });
        self.publisher.publish_with(
            ReconciliationStarted { reason, follow_up },
            Self::meta(id, trigger),
        );
    }

    /// The in-flight reconciliation if `event` belongs to it and it is in `stage`.
    fn current(&mut self, event: &Event, stage: Stage) -> Option<&mut InFlight> {
        match &mut self.in_flight {
            Some(flight) if event.correlation_id == Some(flight.id) && flight.stage == stage => {
                Some(flight)
            }
            _ => {
                tracing::debug!(
                    event = event.kind().as_str(),
                    correlation_id = event.correlation_id.map(tracing::field::display),
                    "Ignoring a result of a superseded or finished reconciliation"
                );
                None
            }
        }
    }

    fn complete(&mut self, cause: &Event, note: &str) {
        let Some(mut flight) = self.in_flight.take() else {
            return;
        };
        self.retrying = None;
        let now = Instant::now();
        flight.advance(now, flight.stage);
        let duration = now.saturating_duration_since(flight.started);
        flight.span.in_scope(|| {
            tracing::info!(?duration, stages = ?flight.stages, note, "Reconciliation completed");
        });
        self.publisher.publish_with(
            ReconciliationCompleted {
                duration,
                stages: flight.stages,
            },
            Self::meta(flight.id, cause),
        );
    }

    fn fail(&mut self, cause: &Event, stage: Stage, errors: Vec<Diagnostic>) {
        self.fail_retrying(cause, stage, errors, None);
    }

    /// Fails the reconciliation; `retry_after` names why the search gave up when
    /// trying again later may pass, which schedules the next retry.
    fn fail_retrying(
        &mut self,
        cause: &Event,
        stage: Stage,
        errors: Vec<Diagnostic>,
        retry_after: Option<&'static str>,
    ) {
        let Some(flight) = self.in_flight.take() else {
            return;
        };
        match retry_after {
            Some(reason) => {
                // The rejection may not be the render's fault: the same render is
                // validated again next time, not failed by the short-circuit.
                if matches!(self.settled, Some(Settled::Invalid(..))) {
                    self.settled = None;
                }
                self.schedule_retry(&flight.span, reason);
            }
            None => self.retrying = None,
        }
        flight.span.in_scope(|| {
            let first = errors.first().map(ToString::to_string).unwrap_or_default();
            tracing::warn!(?stage, errors = errors.len(), first = %first, "Reconciliation failed");
        });
        self.publisher.publish_with(
            ReconciliationFailed { stage, errors },
            Self::meta(flight.id, cause),
        );
    }

    fn handle(&mut self, event: &Arc<Event>) {
        match &event.payload {
            EventPayload::TemplateRendered(rendered) => {
                let hash = rendered.config.hash();
                let settled = self.settled.clone();
                let Some(flight) = self.current(event, Stage::Render) else {
                    return;
                };
                flight.advance(Instant::now(), Stage::Validate);
                match settled {
                    Some(Settled::Valid(last)) if last == hash => self.complete_unchanged(event),
                    Some(Settled::Invalid(last, errors)) if last == hash => {
                        self.fail(event, Stage::Validate, errors);
                    }
                    _ => {}
                }
            }
            EventPayload::TemplateRenderFailed(failed)
                if self.current(event, Stage::Render).is_some() =>
            {
                if self.await_quarantine(Stage::Render, &failed.errors) {
                    if let Some(flight) = &mut self.in_flight {
                        // The search gets a stage time of its own.
                        flight.stage_started = Instant::now();
                    }
                } else {
                    self.fail(event, Stage::Render, failed.errors.clone());
                }
            }
            EventPayload::ValidationCompleted(done)
                if self.current(event, Stage::Validate).is_some() =>
            {
                self.settled = Some(Settled::Valid(done.config.hash()));
                self.complete(event, "validated");
            }
            EventPayload::ValidationFailed(failed)
                if self.current(event, Stage::Validate).is_some() =>
            {
                self.settled = Some(Settled::Invalid(failed.hash, failed.errors.clone()));
                if self.await_quarantine(Stage::Validate, &failed.errors) {
                    if let Some(flight) = &mut self.in_flight {
                        flight.advance(Instant::now(), Stage::Render);
                    }
                } else {
                    self.fail(event, Stage::Validate, failed.errors.clone());
                }
            }
            EventPayload::QuarantineSearched(searched) => {
                let Some(flight) = &mut self.in_flight else {
                    return;
                };
                if event.correlation_id != Some(flight.id) || flight.failure.is_none() {
                    return;
                }
                if let Some(reason) = searched.gave_up {
                    flight.span.in_scope(|| {
                        tracing::info!(
                            reason,
                            probes = searched.probes,
                            "Quarantine search gave up: the whole change is rejected"
                        );
                    });
                    if let Some((stage, errors)) = flight.failure.take() {
                        let retry = retryable(reason, stage).then_some(reason);
                        self.fail_retrying(event, stage, errors, retry);
                    }
                } else {
                    flight.span.in_scope(|| {
                        tracing::info!(
                            accepted = searched.accepted,
                            quarantined = searched.objects.len(),
                            probes = searched.probes,
                            "Quarantine search done: rendering the change without the culprits"
                        );
                    });
                    flight.failure = None;
                }
            }
            _ => {}
        }
    }

    /// Schedules the next retry of a change rejected for `reason`, or ends the
    /// series when its attempts are used up.
    fn schedule_retry(&mut self, span: &tracing::Span, reason: &'static str) {
        let retry = self.settings.retry;
        let retrying = self.retrying.get_or_insert_with(|| Retrying {
            backoff: retry.backoff(),
            attempt: 0,
            at: None,
            reason,
        });
        retrying.reason = reason;
        match retrying.backoff.next() {
            Some(delay) => {
                retrying.at = Some(Instant::now() + delay);
                span.in_scope(|| {
                    tracing::info!(
                        reason,
                        ?delay,
                        attempt = retrying.attempt + 1,
                        of = retry.attempts,
                        "Rejected change will be retried"
                    );
                });
            }
            None => {
                span.in_scope(|| {
                    tracing::warn!(
                        reason,
                        retries = retrying.attempt,
                        "Rejected change not retried any more: waiting for a change"
                    );
                });
                self.retrying = None;
            }
        }
    }

    /// When the pending retry fires.
    fn retry_at(&self) -> Option<Instant> {
        self.retrying.as_ref().and_then(|retrying| retrying.at)
    }

    /// Fires the pending retry: a trigger the executor starts like any other.
    fn fire_retry(&mut self) {
        let Some(retrying) = &mut self.retrying else {
            return;
        };
        retrying.at = None;
        retrying.attempt += 1;
        self.publisher.publish(ReconciliationTriggered {
            reason: format!("retry {} after {}", retrying.attempt, retrying.reason),
            sources: Vec::new(),
            waited: Duration::ZERO,
            follow_up: false,
        });
    }

    /// With quarantine on, keeps a first failure for the renderer's search instead of
    /// failing; returns false when the reconciliation should fail now.
    fn await_quarantine(&mut self, stage: Stage, errors: &[Diagnostic]) -> bool {
        let quarantine = self.settings.quarantine;
        let Some(flight) = &mut self.in_flight else {
            return false;
        };
        if !quarantine || flight.searched {
            return false;
        }
        flight.searched = true;
        flight.failure = Some((stage, errors.to_vec()));
        true
    }

    /// Completes a reconciliation whose output equals the last validated config: the
    /// stages are the render only.
    fn complete_unchanged(&mut self, cause: &Event) {
        let Some(flight) = self.in_flight.take() else {
            return;
        };
        let now = Instant::now();
        let duration = now.saturating_duration_since(flight.started);
        flight.span.in_scope(|| {
            tracing::info!(
                ?duration,
                "Reconciliation completed: output unchanged, validation and deployment skipped"
            );
        });
        self.publisher.publish_with(
            ReconciliationCompleted {
                duration,
                stages: flight.stages,
            },
            Self::meta(flight.id, cause),
        );
    }

    fn time_out(&mut self) {
        let Some(flight) = &self.in_flight else {
            return;
        };
        let stage = flight.stage;
        let id = flight.id;
        let message = format!(
            "{} did not finish within {:?}",
            match stage {
                Stage::Render => "rendering",
                Stage::Validate => "validation",
            },
            self.settings.stage_timeout
        );
        self.retrying = None;
        if let Some(flight) = self.in_flight.take() {
            flight
                .span
                .in_scope(|| tracing::warn!(?stage, %message, "Reconciliation stage timed out"));
        }
        self.publisher.publish_with(
            ReconciliationFailed {
                stage,
                errors: vec![Diagnostic::error(message)],
            },
            EventMeta::correlated(id),
        );
    }
}

#[async_trait::async_trait]
impl Component for Executor {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([
            EventKind::ReconciliationTriggered,
            EventKind::TemplateRendered,
            EventKind::TemplateRenderFailed,
            EventKind::ValidationCompleted,
            EventKind::ValidationFailed,
            EventKind::QuarantineSearched,
        ])
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        let Executor { settings } = *self;
        let mut state = State {
            publisher: ctx.publisher().clone(),
            settings,
            in_flight: None,
            settled: None,
            retrying: None,
        };
        loop {
            let deadline = state
                .in_flight
                .as_ref()
                .map(|flight| flight.stage_started + settings.stage_timeout);
            let retry_at = state.retry_at();
            let event = tokio::select! {
                biased;
                () = hapwright_eventbus::sleep_until(deadline) => {
                    state.time_out();
                    continue;
                }
                () = hapwright_eventbus::sleep_until(retry_at) => {
                    state.fire_retry();
                    continue;
                }
                event = ctx.next_event() => match event {
                    Some(event) => event,
                    None => return Ok(()),
                },
            };
            // Take everything already queued: results are handled in order, and the
            // newest of the queued triggers starts one reconciliation at the end.
            let mut trigger: Option<(Arc<Event>, String)> = None;
            let mut coalesced = 0;
            let mut next = Some(event);
            while let Some(event) = next {
                if let EventPayload::ReconciliationTriggered(t) = &event.payload {
                    // A newer trigger supersedes the in-flight reconciliation now, so
                    // its results queued behind this trigger are ignored.
                    state.supersede();
                    coalesced += 1;
                    trigger = Some((event.clone(), t.reason.clone()));
                } else {
                    state.handle(&event);
                }
                next = ctx.try_next_event();
            }
            if let Some((event, reason)) = trigger {
                state.start(&event, reason, coalesced);
            }
        }
    }
}

/// True when a change the search gave up on for `reason` (in `stage`) may pass when
/// tried again unchanged: the validating tool failed, the bound was hit, or the
/// last good objects no longer pass validation (the environment changed). A render
/// error of the last good objects is the templates' and would fail again.
fn retryable(reason: &str, stage: Stage) -> bool {
    reason == Rejection::ToolFailure.as_str()
        || reason == Rejection::BoundReached.as_str()
        || (reason == Rejection::BaselineFails.as_str() && stage == Stage::Validate)
}
