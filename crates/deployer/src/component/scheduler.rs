//! The deployment scheduler: turns `ValidationCompleted` into
//! `DeploymentScheduled`, rate-limited and latest-wins.
//!
//! - At most one deployment per `minDeploymentInterval`.
//! - One pending slot: a newer config replaces a waiting one.
//! - A config whose hash and instance set equal the last released ones is skipped.
//!
//! Reloads are not the scheduler's business: the reload window (`minReloadInterval`)
//! is kept per instance by the deployer, which alone knows what each instance runs,
//! so runtime-only changes keep flowing to every instance that can take them.
//! - A changed instance set (`InstancesDiscovered`) re-deploys the last config.
//! - A round with failed instances (`DeploymentCompleted`) forgets the last released
//!   hash, so the same config is not skipped when it comes again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::model::{ContentHash, ParsedConfig, RenderedConfig};
use hapwright_eventbus::{
    Component, ComponentError, Context, DeploymentScheduled, Event, EventKind, EventPayload,
    Interest,
};
use tokio::time::Instant;

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

    /// A scheduler deploying to `static_instances` plus every discovered instance.
    pub fn new(config: Config, static_instances: Vec<String>) -> Self {
        Self {
            config,
            static_instances,
        }
    }
}

struct Pending {
    config: Arc<RenderedConfig>,
    parsed: ParsedConfig,
    cause: Arc<Event>,
}

struct State {
    config: Config,
    static_instances: Vec<String>,
    discovered: BTreeMap<Arc<str>, Vec<String>>,
    latest: Option<(Arc<RenderedConfig>, ParsedConfig)>,
    pending: Option<Pending>,
    last_release: Option<Instant>,
    last_released: Option<(ContentHash, Vec<String>)>,
}

impl State {
    fn instances(&self) -> Vec<String> {
        let set: BTreeSet<&String> = self
            .static_instances
            .iter()
            .chain(self.discovered.values().flatten())
            .collect();
        set.into_iter().cloned().collect()
    }

    fn handle(&mut self, event: Arc<Event>) {
        match &event.payload {
            EventPayload::ValidationCompleted(validated) => {
                self.latest = Some((validated.config.clone(), validated.parsed.clone()));
                self.pending = Some(Pending {
                    config: validated.config.clone(),
                    parsed: validated.parsed.clone(),
                    cause: event.clone(),
                });
            }
            EventPayload::InstancesDiscovered(discovered) => {
                let before = self.instances();
                let names = discovered
                    .instances
                    .iter()
                    .map(|i| i.name.clone())
                    .collect();
                self.discovered.insert(discovered.source.clone(), names);
                if self.instances() != before
                    && self.pending.is_none()
                    && let Some((config, parsed)) = &self.latest
                {
                    self.pending = Some(Pending {
                        config: config.clone(),
                        parsed: parsed.clone(),
                        cause: event.clone(),
                    });
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
        Some(
            self.last_release
                .map_or_else(Instant::now, |t| t + self.config.min_deployment_interval),
        )
    }

    fn release(&mut self, ctx: &Context) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        let instances = self.instances();
        self.last_release = Some(Instant::now());
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
                parsed: pending.parsed,
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
            EventKind::ValidationCompleted,
            EventKind::InstancesDiscovered,
            EventKind::DeploymentCompleted,
        ])
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        let mut state = State {
            config: self.config,
            static_instances: self.static_instances,
            discovered: BTreeMap::new(),
            latest: None,
            pending: None,
            last_release: None,
            last_released: None,
        };
        ctx.health().healthy();
        loop {
            // Whatever already waits is part of the same burst: latest wins.
            while let Some(event) = ctx.try_next_event() {
                state.handle(event);
            }
            let ready_at = state.ready_at();
            if ready_at.is_some_and(|at| at <= Instant::now()) {
                // Outside the minDeploymentInterval window: out now, with no timer
                // (a zero-length sleep still waits for the timer wheel's next tick).
                state.release(&ctx);
                continue;
            }
            tokio::select! {
                biased;
                event = ctx.next_event() => match event {
                    Some(event) => state.handle(event),
                    None => return Ok(()),
                },
                () = sleep_until(ready_at) => state.release(&ctx),
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
