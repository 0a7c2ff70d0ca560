//! The deployment scheduler: turns `ValidationCompleted` into
//! `DeploymentScheduled`, rate-limited and latest-wins.
//!
//! - At most one deployment per `minDeploymentInterval`, where one change spread
//!   over sources counts once: the debouncer fires a leading-edge change at once
//!   and gathers what reached other sources within its leading group into one more
//!   trigger (`ReconciliationTriggered::follow_up`: an Ingress and its Secret
//!   applied together). That reconciliation's deployment follows the leading one
//!   at once instead of an interval later (once; the next waits the whole interval
//!   after it).
//! - One pending slot: a newer config replaces a waiting one, and the validated
//!   config of a reconciliation that a newer one superseded (`ReconciliationStarted`
//!   since) never goes out: latest wins.
//! - A config whose hash and instance set equal the last released ones is skipped.
//!
//! Reloads are not the scheduler's business: the reload window (`minReloadInterval`)
//! is kept per instance by the deployer, which alone knows what each instance runs,
//! so runtime-only changes keep flowing to every instance that can take them.
//!
//! Fleet membership is not the scheduler's business either: it names the static
//! instances, and the deployer, the one owner of the fleet, adds the discovered ones
//! and hands a newly discovered instance the last config itself. So a discovery
//! change schedules nothing, and instances whose config did not change see no round.
//! - A round with failed instances (`DeploymentCompleted`) forgets the last released
//!   hash, so the same config is not skipped when it comes again.
//!
//! **Safety valve** ([`Scheduler::with_safety`], see [`crate::safety`]). The scheduler
//! is the last step before a config reaches the instances and the one component that
//! knows which configs it let through, so the valve lives here. A validated config
//! that would remove more than `maxRemoval` of the high-water mark (the most that the
//! configs let through within the last `confirmAfter` served) is held: the scheduler
//! reports `Degraded` and publishes `SafetyValveHeld`, and lets out the config with
//! what it removes kept ([`safety::keep_held`]), so every other change still goes
//! live. The hold ends, with `SafetyValveReleased`, when
//! - a later config under the threshold arrives (`recovered`: it goes out instead),
//! - the removal has lasted `confirmAfter` since the first held config (`confirmed`:
//!   the newest held config goes out),
//! - `SafetyValveApproved` arrives (`approved`: the held config goes out),
//! - the valve was turned off by a controller config reload (`disabled`: the next
//!   config goes out).
//!
//! A held removal is kept on disk ([`safety::ValveRecord`]) and outlives a restart.
//! The first config is never held: nothing runs that it could remove.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::model::{ContentHash, RenderedConfig};
use hapwright_eventbus::{
    Component, ComponentError, Context, CorrelationId, DeploymentScheduled, Event, EventKind,
    EventPayload, Interest, SafetyRemoval, SafetyValveHeld, SafetyValveReleased,
};
use tokio::time::Instant;

use crate::haproxy::config::Config as Model;
use crate::safety::{self, Kept, Released};

/// Rate limits of the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Minimum time between two released deployments.
    pub min_deployment_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            min_deployment_interval: Duration::from_secs(2),
        }
    }
}

impl From<&crate::config::Timings> for Config {
    fn from(timings: &crate::config::Timings) -> Self {
        Self {
            min_deployment_interval: timings.min_deployment_interval.get(),
        }
    }
}

/// The scheduler component.
pub struct Scheduler {
    config: Config,
    static_instances: Vec<String>,
    valve: Option<Valve>,
}

/// The safety valve's settings and process-wide memory.
#[derive(Clone, Debug)]
struct Valve {
    config: safety::Config,
    memory: safety::Memory,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("config", &self.config)
            .field("static_instances", &self.static_instances)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// The component's name.
    pub const NAME: &'static str = "scheduler";

    /// A scheduler deploying to `static_instances` (the deployer adds the discovered
    /// instances it owns).
    pub fn new(config: Config, static_instances: Vec<String>) -> Self {
        Self {
            config,
            static_instances,
            valve: None,
        }
    }

    /// Turns the safety valve on (unless `config.max_removal` is off): a config that
    /// would remove too much of what the last released one serves is held (see the
    /// [module docs](self)). `memory` outlives the scheduler, so the config released
    /// before a controller config reload is still the baseline after it; with the
    /// valve off the baseline is still kept, and a hold from before the reload ends
    /// (`disabled`).
    #[must_use]
    pub fn with_safety(mut self, config: safety::Config, memory: safety::Memory) -> Self {
        self.valve = Some(Valve { config, memory });
        self
    }
}

/// A config the safety valve holds.
struct Hold {
    held: Pending,
    /// The held config, measured.
    desired: Released,
    /// When it goes out by itself (`confirmAfter` after the first held config).
    release_at: Instant,
}

struct Pending {
    config: Arc<RenderedConfig>,
    model: Arc<Model>,
    cause: Arc<Event>,
}

struct State {
    config: Config,
    static_instances: Vec<String>,
    pending: Option<Pending>,
    last_release: Option<Instant>,
    last_released: Option<(ContentHash, Vec<String>)>,
    valve: Option<Valve>,
    hold: Option<Hold>,
    /// The newest reconciliation started, and whether it runs the rest of a change
    /// the debouncer's leading edge fired for (`ReconciliationStarted::follow_up`):
    /// the validated configs of older ones are superseded.
    newest: Option<(CorrelationId, bool)>,
    /// A follow-up went out inside the interval after the release before it: the
    /// next release waits the whole interval again.
    follow_up_released: bool,
}

impl State {
    fn instances(&self) -> Vec<String> {
        let set: BTreeSet<&String> = self.static_instances.iter().collect();
        set.into_iter().cloned().collect()
    }

    fn handle(&mut self, event: Arc<Event>, ctx: &Context) {
        match &event.payload {
            EventPayload::ReconciliationStarted(started) => {
                self.newest = event.correlation_id.map(|id| (id, started.follow_up));
            }
            EventPayload::ValidationCompleted(_)
                if event.correlation_id.is_some()
                    && self
                        .newest
                        .is_some_and(|(newest, _)| event.correlation_id != Some(newest)) =>
            {
                // Latest wins: a newer reconciliation started after this one, with
                // newer data; its result goes out instead.
                tracing::debug!(
                    correlation_id = event.correlation_id.map(tracing::field::display),
                    "Ignoring the validated config of a superseded reconciliation"
                );
            }
            EventPayload::ValidationCompleted(validated) => {
                let pending = Pending {
                    config: validated.config.clone(),
                    model: validated.model.clone(),
                    cause: event.clone(),
                };
                self.offer(pending, ctx);
            }
            EventPayload::SafetyValveApproved(_) => {
                if self.hold.is_some() {
                    tracing::info!("Safety valve release approved");
                    self.release_hold("approved", ctx);
                } else {
                    tracing::info!("Safety valve approval ignored: nothing is held");
                }
            }
            EventPayload::DeploymentCompleted(completed)
                if !completed.summary.failed.is_empty() =>
            {
                self.last_released = None;
            }
            _ => {}
        }
    }

    /// A validated config: pending for release, or held by the safety valve, which
    /// then lets out the config with what it removes kept.
    fn offer(&mut self, pending: Pending, ctx: &Context) {
        let Some(valve) = self.valve.clone() else {
            self.accept(pending);
            return;
        };
        let model = pending.model.clone();
        let desired = Released::new(pending.config.clone(), model);
        let window = valve.config.confirm_after.get();
        if valve.config.max_removal.is_on()
            && let Some(high) = valve.memory.high_water(window)
        {
            let removal = safety::assess(&high.footprint, &desired.footprint);
            if safety::exceeds(&removal, valve.config.max_removal) {
                let kept = safety::keep_held(&desired, &high.sources);
                self.hold(&valve, pending, desired, &kept, removal, ctx);
                return;
            }
        }
        let was_held = self.hold.take().is_some() || valve.memory.held_since().is_some();
        let reason = if valve.config.max_removal.is_on() {
            valve.memory.end_hold();
            valve.memory.released(desired);
            "recovered"
        } else {
            valve.memory.released_over(desired);
            "disabled"
        };
        if was_held {
            tracing::info!(
                hash = %pending.config.hash().short(),
                reason,
                "Safety valve released: a new config replaces the held one"
            );
            ctx.publisher().reply(
                &pending.cause,
                SafetyValveReleased {
                    hash: pending.config.hash(),
                    reason,
                },
            );
            ctx.health().healthy();
        }
        self.accept(pending);
    }

    fn accept(&mut self, pending: Pending) {
        self.pending = Some(pending);
    }

    /// Holds the removal `desired` makes; what goes out is `kept`: the desired config
    /// with what it removes put back (see [`safety::keep_held`]).
    fn hold(
        &mut self,
        valve: &Valve,
        held: Pending,
        desired: Released,
        kept: &Kept,
        removal: SafetyRemoval,
        ctx: &Context,
    ) {
        if kept.problems.is_empty() {
            valve
                .memory
                .released(Released::new(kept.config.clone(), kept.model.clone()));
        }
        let (since, since_wall) = valve.memory.hold();
        let confirm_after = valve.config.confirm_after.get();
        let max = valve.config.max_removal;
        tracing::warn!(
            correlation_id = held.cause.correlation_id.map(tracing::field::display),
            hash = %held.config.hash().short(),
            deployed = %kept.config.hash().short(),
            removal = %removal,
            max_removal = %max,
            confirm_after = %valve.config.confirm_after,
            kept_backends = kept.backends,
            kept_servers = kept.servers,
            kept_map_entries = kept.map_entries,
            "Safety valve holds a removal; every other change goes out with the removed items kept"
        );
        let meanwhile = match kept.problems.first() {
            None => "the removed items stay deployed and every other change goes out".to_owned(),
            Some(problem) => format!(
                "nothing of it goes out, since the render with the removed items kept fails \
                 the checks ({problem})"
            ),
        };
        ctx.health().degraded(format!(
            "safety valve holds a change that {removal} (maxRemoval {max}) against the most \
             served within controller.safety.confirmAfter; {meanwhile}; the removal goes out \
             by itself once it has lasted {}, at once with POST /-/approve, or is dropped when \
             the sources come back",
            valve.config.confirm_after
        ));
        ctx.publisher().reply(
            &held.cause,
            SafetyValveHeld {
                hash: held.config.hash(),
                removal,
                max_removal: max.to_string(),
                since: since_wall,
                release_at: since_wall + confirm_after,
            },
        );
        let deployed = Pending {
            config: kept.config.clone(),
            model: kept.model.clone(),
            cause: held.cause.clone(),
        };
        self.hold = Some(Hold {
            held,
            desired,
            release_at: since + confirm_after,
        });
        if kept.problems.is_empty() {
            self.accept(deployed);
        } else {
            let problems: Vec<String> = kept.problems.iter().map(ToString::to_string).collect();
            tracing::error!(
                hash = %deployed.config.hash().short(),
                problems = %problems.join("; "),
                "Safety valve: the render with the removed items kept fails the checks; \
                 nothing of the held render goes out"
            );
        }
    }

    /// Lets the held config out (`confirmed` or `approved`).
    fn release_hold(&mut self, reason: &'static str, ctx: &Context) {
        let Some(hold) = self.hold.take() else {
            return;
        };
        if let Some(valve) = &self.valve {
            valve.memory.released_over(hold.desired);
        }
        let hash = hold.held.config.hash();
        tracing::warn!(hash = %hash.short(), reason, "Safety valve released the held config");
        ctx.publisher()
            .reply(&hold.held.cause, SafetyValveReleased { hash, reason });
        ctx.health().healthy();
        self.accept(hold.held);
    }

    /// When the pending deployment may go out; `None` when nothing is pending (a
    /// skipped duplicate is dropped here).
    fn ready_at(&mut self) -> Option<Instant> {
        let instances = self.instances();
        let pending = self.pending.as_ref()?;
        if self.last_released.as_ref() == Some(&(pending.config.hash(), instances)) {
            tracing::debug!(hash = %pending.config.hash().short(), "Skipping deployment: hash and instances unchanged");
            self.pending = None;
            return None;
        }
        if self.follows_up(pending) {
            return Some(Instant::now());
        }
        Some(
            self.last_release
                .map_or_else(Instant::now, |t| t + self.config.min_deployment_interval),
        )
    }

    /// Whether `pending` completes the change the last release went out for: the
    /// debouncer gathered the changes that reached other sources within its leading
    /// group into one more trigger (an Ingress and its Secret applied together),
    /// and its deployment follows the leading one at once, once per interval. One
    /// change spread over sources counts once against `minDeploymentInterval`.
    fn follows_up(&self, pending: &Pending) -> bool {
        self.newest.is_some_and(|(newest, follow_up)| {
            follow_up && pending.cause.correlation_id == Some(newest)
        }) && !self.follow_up_released
    }

    fn release(&mut self, ctx: &Context) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        let instances = self.instances();
        let now = Instant::now();
        self.follow_up_released = self.follows_up(&pending)
            && self
                .last_release
                .is_some_and(|t| now < t + self.config.min_deployment_interval);
        if self.follow_up_released {
            tracing::debug!(hash = %pending.config.hash().short(), "The rest of the leading change goes out at once");
        }
        self.last_release = Some(now);
        self.last_released = Some((pending.config.hash(), instances.clone()));
        let span = tracing::info_span!(
            "schedule",
            correlation_id = pending.cause.correlation_id.map(tracing::field::display),
            hash = %pending.config.hash().short(),
        );
        let _entered = span.enter();
        tracing::info!(instances = instances.len(), "Deployment scheduled");
        ctx.publisher().reply(
            &pending.cause,
            DeploymentScheduled {
                config: pending.config,
                instances,
                drift_check: false,
                model: pending.model,
            },
        );
    }
}

#[async_trait::async_trait]
impl Component for Scheduler {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([
            EventKind::ReconciliationStarted,
            EventKind::ValidationCompleted,
            EventKind::DeploymentCompleted,
            EventKind::SafetyValveApproved,
        ])
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        let mut state = State {
            config: self.config,
            static_instances: self.static_instances,
            pending: None,
            last_release: None,
            last_released: None,
            valve: self.valve,
            hold: None,
            newest: None,
            follow_up_released: false,
        };
        ctx.health().healthy();
        loop {
            // Whatever already waits is part of the same burst: latest wins.
            while let Some(event) = ctx.try_next_event() {
                state.handle(event, &ctx);
            }
            let ready_at = state.ready_at();
            if ready_at.is_some_and(|at| at <= Instant::now()) {
                // Outside the minDeploymentInterval window: out now, with no timer
                // (a zero-length sleep still waits for the timer wheel's next tick).
                state.release(&ctx);
                continue;
            }
            let confirm_at = state.hold.as_ref().map(|hold| hold.release_at);
            tokio::select! {
                biased;
                event = ctx.next_event() => match event {
                    Some(event) => state.handle(event, &ctx),
                    None => return Ok(()),
                },
                () = hapwright_eventbus::sleep_until(confirm_at) => state.release_hold("confirmed", &ctx),
                () = hapwright_eventbus::sleep_until(ready_at) => state.release(&ctx),
            }
        }
    }
}
