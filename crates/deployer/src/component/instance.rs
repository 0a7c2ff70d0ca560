//! One instance's owner: a task per instance that alone holds what the instance runs,
//! decides each deployment's plan and keeps the instance's reload window.
//!
//! The deployer hands every worker the desired config through a watch channel (the
//! newest replaces a waiting one: latest wins) and hears back one [`Report`] per
//! attempt. A worker:
//! - plans once per deployment from the validator's parsed model ([`driver::decide`]);
//! - applies a runtime-only plan at once, whatever other instances do — one instance
//!   waiting for its reload window, unreachable or restarting never holds the others;
//! - holds a plan that reloads until `minReloadInterval` has passed since this
//!   instance's last reload (a refused runtime change that falls back to a reload
//!   waits the same way), and re-plans if a newer config arrives meanwhile;
//! - retries a failed deployment with backoff (1 s doubling to 60 s), with the newest
//!   config;
//! - carries out each deployment's changes in a task of their own: when the attempt's
//!   deadline (`deploymentTimeout`) passes while they run, they are not cut half-way
//!   (which would leave the instance in a state no record describes); the next attempt
//!   waits for them and plans from the config they deployed;
//! - checks drift every `driftPreventionInterval` (leader only): the worker's version
//!   marker and files against its record; a difference publishes `DriftDetected` and
//!   reloads the instance onto the desired config (reason `drift`);
//! - for a managed HAProxy, records starts that no deployment caused (the supervisor
//!   restarted a crashed process) as deployments of the files on disk.
//!
//! The worker alone writes its instance's state (an [`InstanceRecord`]: what it runs,
//! the last error, its reloads and reload window). It starts from the record the
//! [`LastDeployedStore`] kept (which outlives a controller reinit, so an unchanged
//! render after a reinit is a no-op) and publishes a snapshot there after every
//! change; the deployer and the HTTP server only read those snapshots. Removing an
//! instance ([`Handle::remove`]) waits for its worker to stop, and the worker clears
//! its own record and metric series on the way out, even when its attempt in flight
//! had to be aborted, so an instance re-added under the same name starts clean.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

use hapwright_eventbus::model::{
    ContentHash, DeployStrategy, Diagnostic, ReloadReason, RenderedConfig,
};
use hapwright_eventbus::{
    DriftDetected, Event, EventPayload, InstanceDeployed, InstanceDeploymentFailed, Publisher,
};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::component::deployer::{InstanceRecord, LastDeployedStore};
use crate::driver::managed::ManagedHaproxy;
use crate::driver::{self, Driver, Executed};
use crate::driver::{DeployError, Deployed};
use crate::haproxy::config::Config as Model;
use crate::haproxy::plan::ChangePlan;
use crate::metrics::Metrics;

/// Timings of one instance's worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    /// Deadline of one deployment attempt.
    pub deployment_timeout: Duration,
    /// Minimum time between two reloads of this instance.
    pub min_reload_interval: Duration,
    /// First retry delay after a failure.
    pub min_retry_delay: Duration,
    /// Longest retry delay.
    pub max_retry_delay: Duration,
    /// Time between two drift checks.
    pub drift_interval: Duration,
    /// Deadline of one drift check.
    pub drift_timeout: Duration,
}

/// What an instance should run, and why.
#[derive(Clone, Debug)]
pub(crate) struct Desired {
    /// The config.
    pub config: Arc<RenderedConfig>,
    /// Its parsed model (from the validator).
    pub model: Arc<Model>,
    /// The event that asked for it (`DeploymentScheduled`), for replies.
    pub cause: Arc<Event>,
    /// Compare what the instance runs before planning.
    pub drift_check: bool,
    /// The deployer's round this belongs to.
    pub round: u64,
}

/// How an attempt ended.
#[derive(Clone, Debug)]
pub(crate) enum Outcome {
    /// The instance runs the config.
    Deployed,
    /// It does not; the error is in the event and the worker's record.
    Failed,
    /// A newer config replaced it before it was deployed.
    Superseded,
}

/// One attempt's outcome, for the deployer's round bookkeeping and health.
#[derive(Clone, Debug)]
pub(crate) struct Report {
    /// The instance.
    pub instance: String,
    /// The round the attempt belonged to; `None` for retries, drift repairs and
    /// adopted starts, whose round was already reported.
    pub round: Option<u64>,
    /// How it ended.
    pub outcome: Outcome,
}

/// What the worker shares with the deployer.
#[derive(Clone)]
pub(crate) struct Shared {
    pub settings: Settings,
    pub store: LastDeployedStore,
    pub metrics: Metrics,
    pub publisher: Publisher,
    pub managed: Option<ManagedHaproxy>,
    pub leader: Option<watch::Receiver<bool>>,
    pub reports: mpsc::UnboundedSender<Report>,
    /// Bounds the deployments running at the same time across the fleet.
    pub permits: Arc<Semaphore>,
    /// Reads the instance's HAProxy version after each reload or start.
    pub versions: Option<crate::version_check::VersionCheck>,
}

/// The deployer's handle on a running worker; dropping it stops the worker.
pub(crate) struct Handle {
    desired: watch::Sender<Option<Desired>>,
    cancel: CancellationToken,
    /// Cancelled before `cancel` when the instance is removed: the worker then
    /// clears its record and metric series as it ends.
    removed: CancellationToken,
    task: tokio_util::task::AbortOnDropHandle<()>,
}

impl Handle {
    /// Starts the worker of `driver`.
    pub fn spawn(driver: Arc<dyn Driver>, shared: Shared, parent: &CancellationToken) -> Self {
        let (desired, receiver) = watch::channel(None);
        let cancel = parent.child_token();
        let removed = CancellationToken::new();
        let span = tracing::info_span!("instance", instance = %driver.name());
        let record = shared.store.get(driver.name()).unwrap_or_default();
        let worker = Worker {
            _retire: Retire {
                name: driver.name().to_owned(),
                store: shared.store.clone(),
                metrics: shared.metrics.clone(),
                removed: removed.clone(),
            },
            driver,
            shared,
            record,
            current: None,
            unreported: None,
            fallback: None,
            retry: None,
            in_flight: None,
        };
        let task = tokio::spawn(worker.run(receiver, cancel.clone()).instrument(span));
        Self {
            desired,
            cancel,
            removed,
            task: tokio_util::task::AbortOnDropHandle::new(task),
        }
    }

    /// Hands the worker a new desired config (replacing one it has not taken yet).
    pub fn send(&self, desired: Desired) {
        self.desired.send_replace(Some(desired));
    }

    /// Stops the worker, keeping its record (a controller reinit or shutdown): waits
    /// up to `grace` for it to finish its attempt, then aborts it, and returns once
    /// it is gone.
    pub async fn stop(self, grace: Duration) {
        self.cancel.cancel();
        let mut task = self.task;
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            task.abort();
            // Returns once the aborted worker is dropped (and has retired).
            let _ = task.await;
        }
    }

    /// Removes the instance: tells the worker at once that it is removed and to
    /// stop, and returns the stop to wait for (like [`Handle::stop`]); the worker
    /// clears its record and metric series as it ends. Once the returned future
    /// completes nothing of the instance is left, and nothing writes it back.
    pub fn remove(self, grace: Duration) -> impl Future<Output = ()> + Send + 'static {
        self.removed.cancel();
        self.cancel.cancel();
        self.stop(grace)
    }
}

/// Clears a removed instance's record and metric series when its worker ends,
/// however it ends (returned, or aborted in the middle of an attempt).
struct Retire {
    name: String,
    store: LastDeployedStore,
    metrics: Metrics,
    removed: CancellationToken,
}

impl Drop for Retire {
    fn drop(&mut self) {
        if self.removed.is_cancelled() {
            self.store.clear(&self.name);
            self.metrics.forget(&self.name);
            tracing::debug!(instance = %self.name, "Instance removed; its record and metric series are gone");
        }
    }
}

struct Worker {
    driver: Arc<dyn Driver>,
    shared: Shared,
    /// The instance's state; this worker is its only writer, and publishes it to
    /// the store after every change.
    record: InstanceRecord,
    /// Dropped last (declared last): clears the record of a removed instance.
    _retire: Retire,
    /// What the instance should run.
    current: Option<Desired>,
    /// The round of `current` when no attempt has reported it yet.
    unreported: Option<u64>,
    /// The reload that replaces a refused runtime change of `current`.
    fallback: Option<ChangePlan>,
    /// The retry delays of the current run of failed attempts (1 s doubling to
    /// 60 s by default); `None` after a success or a newer config.
    retry: Option<ExponentialBackoff>,
    /// A deployment carried out in its own task that outlived its attempt's
    /// deadline: it goes on (stopping a runtime change or a file write half-way
    /// would leave the instance in a state no record describes), and the next
    /// attempt waits for it before it plans.
    in_flight: Option<InFlight>,
}

/// A deployment being carried out: the config it deploys and its task (aborted
/// when the worker goes).
struct InFlight {
    desired: Desired,
    started: Instant,
    task: tokio_util::task::AbortOnDropHandle<Result<Step, DeployError>>,
}

/// What one attempt came to.
enum Step {
    Done(Deployed),
    /// A reload must wait for the instance's reload window.
    Wait(Instant),
    /// The runtime change was refused; reload (within the window).
    Fallback(ChangePlan),
}

impl Worker {
    fn name(&self) -> &str {
        self.driver.name()
    }

    fn is_leader(&self) -> bool {
        self.shared.leader.as_ref().is_none_or(|l| *l.borrow())
    }

    /// Publishes the record's snapshot for the deployer and the HTTP server.
    fn publish_record(&self) {
        self.shared.store.publish(self.name(), self.record.clone());
    }

    async fn run(
        mut self,
        mut desired: watch::Receiver<Option<Desired>>,
        cancel: CancellationToken,
    ) {
        let settings = self.shared.settings;
        let mut drift = tokio::time::interval_at(
            Instant::now() + settings.drift_interval,
            settings.drift_interval,
        );
        drift.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ready = self
            .shared
            .managed
            .as_ref()
            .filter(|_| self.driver.managed_socket().is_some())
            .map(ManagedHaproxy::ready_events);
        // Starts that came up while no deployer ran (e.g. during a reinit).
        if ready.is_some() && self.is_leader() {
            self.adopt_start().await;
        }
        let mut attempt_at: Option<Instant> = None;
        loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => return,
                changed = desired.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let Some(next) = desired.borrow_and_update().clone() else { continue };
                    self.take(next);
                    // At once, not through a zero-length timer (which waits for the
                    // timer wheel's next tick).
                    attempt_at = self.attempt().await;
                }
                () = hapwright_eventbus::sleep_until(attempt_at) => {
                    attempt_at = self.attempt().await;
                }
                _ = drift.tick() => {
                    if attempt_at.is_none() && self.is_leader() && self.drifted().await {
                        attempt_at = Some(Instant::now());
                    }
                }
                () = ready_changed(&mut ready) => {
                    if self.is_leader() && self.adopt_start().await && self.current.is_some() {
                        attempt_at = Some(Instant::now());
                    }
                }
            }
        }
    }

    /// Takes a newer desired config; the one it replaces is reported superseded when
    /// no attempt reported it yet.
    fn take(&mut self, next: Desired) {
        if let Some(round) = self.unreported.take()
            && round != next.round
        {
            self.report(Some(round), Outcome::Superseded);
        }
        let drift_check = next.drift_check
            || self
                .current
                .as_ref()
                .is_some_and(|c| c.drift_check && c.config.hash() == next.config.hash());
        self.unreported = Some(next.round);
        self.fallback = None;
        self.retry = None;
        self.current = Some(Desired {
            drift_check,
            ..next
        });
        self.shared.metrics.out_of_sync(self.driver.name());
    }

    fn report(&self, round: Option<u64>, outcome: Outcome) {
        let _ = self.shared.reports.send(Report {
            instance: self.name().to_owned(),
            round,
            outcome,
        });
    }

    fn reload_window(&self) -> Option<Instant> {
        let at = self.record.last_reload? + self.shared.settings.min_reload_interval;
        (at > Instant::now()).then_some(at)
    }

    /// One deployment attempt of `current`; returns when to try again.
    async fn attempt(&mut self) -> Option<Instant> {
        let desired = self.current.clone()?;
        let span = tracing::info_span!(
            "deploy_instance",
            instance = %self.name(),
            correlation_id = desired.cause.correlation_id.map(tracing::field::display),
            hash = %desired.config.hash().short(),
            strategy = tracing::field::Empty,
            reason = tracing::field::Empty,
        );
        let permit = self.shared.permits.clone().acquire_owned().await.ok();
        let started = Instant::now();
        let timeout = self.shared.settings.deployment_timeout;
        let step = tokio::time::timeout(timeout, self.step(&desired))
            .instrument(span.clone())
            .await;
        drop(permit);
        let elapsed = started.elapsed();
        let _entered = span.enter();
        match step {
            Ok(Ok(Step::Wait(at))) => {
                tracing::info!(
                    wait_ms = at.saturating_duration_since(Instant::now()).as_millis() as u64,
                    "Reload waits for this instance's reload window"
                );
                Some(at)
            }
            Ok(Ok(Step::Fallback(plan))) => {
                self.fallback = Some(plan);
                Some(self.reload_window().unwrap_or_else(Instant::now))
            }
            Ok(Ok(Step::Done(deployed))) => {
                self.succeeded(&desired, deployed, elapsed);
                None
            }
            Ok(Err(error)) => {
                let unknown = leaves_state_unknown(&error);
                Some(self.failed(&desired, error.to_diagnostic(), unknown, elapsed))
            }
            Err(_) if self.in_flight.is_some() => {
                // The changes go on in their task; the next attempt waits for them
                // and plans from what they leave.
                let diagnostic = Diagnostic::error(format!(
                    "deployment did not finish within {timeout:?} (controller.deploymentTimeout); \
                     it goes on, and the next attempt waits for it"
                ));
                Some(self.failed(&desired, diagnostic, false, elapsed))
            }
            Err(_) => {
                let diagnostic = Diagnostic::error(format!(
                    "deployment did not finish within {timeout:?} (controller.deploymentTimeout); \
                     what the instance runs is unknown until the next deployment"
                ));
                Some(self.failed(&desired, diagnostic, true, elapsed))
            }
        }
    }

    async fn step(&mut self, desired: &Desired) -> Result<Step, DeployError> {
        if let Some(step) = self.finish_in_flight(desired).await {
            return step;
        }
        let driver = self.driver.clone();
        let running = self.record.deployed.clone();
        if let Some(started) = driver
            .start_if_stopped(&desired.config, &desired.model, running.as_ref())
            .await
        {
            return started.map(Step::Done);
        }
        let running = match running {
            Some(running) => Some(running),
            None => driver.recover(&desired.config).await?,
        };
        if let Some(fallback) = self.fallback.clone() {
            if let Some(at) = self.reload_window() {
                return Ok(Step::Wait(at));
            }
            self.fallback = None;
            let span = driver::reload_span(&fallback);
            let config = desired.config.clone();
            let model = desired.model.clone();
            return self
                .carry_out(
                    desired,
                    async move {
                        driver
                            .reload_with(config, model, running.as_deref(), fallback)
                            .instrument(span)
                            .await
                            .map(Step::Done)
                    }
                    .in_current_span(),
                )
                .await;
        }
        let planning = std::time::Instant::now();
        let mut decision = driver::decide(
            &*driver,
            &desired.config,
            &desired.model,
            running.as_deref(),
            desired.drift_check,
        )
        .await?;
        tracing::debug!(
            elapsed = ?planning.elapsed(),
            ops = decision.plan.ops.len(),
            reload = decision.reloads(),
            "Planned the deployment"
        );
        if running.is_none()
            && let Some(error) = self.record.last_error.as_deref()
        {
            // Not a first deployment: the instance ran something hapwright deployed,
            // but neither this worker's record nor the instance tells what any more.
            decision.plan = ChangePlan::reload(
                ReloadReason::FirstDeploy,
                format!(
                    "what the instance runs is unknown after a failed deployment ({error}); \
                     every file is written again"
                ),
            );
        }
        if decision.reloads()
            && let Some(at) = self.reload_window()
        {
            if decision.running_unknown {
                // Keep what the check found (a drift) for when the window opens.
                if let Some(current) = self.current.as_mut() {
                    current.drift_check = true;
                }
            }
            return Ok(Step::Wait(at));
        }
        let (config, model) = (desired.config.clone(), desired.model.clone());
        let execution = async move {
            match driver::execute(&*driver, &config, &model, running.as_ref(), decision).await? {
                Executed::Done(deployed) => Ok(Step::Done(deployed)),
                Executed::RuntimeFailed { fallback } => Ok(Step::Fallback(fallback)),
            }
        };
        self.carry_out(desired, execution.in_current_span()).await
    }

    /// Carries out a deployment of `desired` in its own task and waits for it. When
    /// the attempt's deadline ends the wait, the task goes on ([`Worker::in_flight`]).
    async fn carry_out(
        &mut self,
        desired: &Desired,
        execution: impl Future<Output = Result<Step, DeployError>> + Send + 'static,
    ) -> Result<Step, DeployError> {
        self.in_flight = Some(InFlight {
            desired: desired.clone(),
            started: Instant::now(),
            task: tokio_util::task::AbortOnDropHandle::new(tokio::spawn(execution)),
        });
        self.finish_in_flight(desired)
            .await
            .unwrap_or_else(|| unreachable!("a deployment was just started"))
    }

    /// Waits for the deployment in flight, if any. Its outcome is this attempt's when
    /// it deployed `desired`; when it deployed an older config, that config is
    /// recorded as what the instance runs (or the instance's state as unknown, after
    /// a failure that leaves it so) and `None` lets the attempt plan from there.
    async fn finish_in_flight(&mut self, desired: &Desired) -> Option<Result<Step, DeployError>> {
        let in_flight = self.in_flight.as_mut()?;
        // Cancellable: a deadline that ends the wait keeps the task in `in_flight`.
        let joined = (&mut in_flight.task).await;
        let in_flight = self.in_flight.take()?;
        let outcome = match joined {
            Ok(outcome) => outcome,
            Err(join) => {
                // It panicked half-way: plan again from what can be told.
                let message = format!("the deployment ended abnormally: {join}");
                tracing::error!(error = %message, "Deployment task failed");
                self.record.unknown(message);
                self.publish_record();
                return None;
            }
        };
        if in_flight.desired.config.hash() == desired.config.hash() {
            return Some(outcome);
        }
        let elapsed = in_flight.started.elapsed();
        match outcome {
            Ok(Step::Done(deployed)) => {
                tracing::info!(
                    hash = %in_flight.desired.config.hash().short(),
                    strategy = %deployed.strategy,
                    duration_ms = elapsed.as_millis() as u64,
                    "An earlier deployment that outlived its deadline finished; planning from it"
                );
                let hash = in_flight.desired.config.hash();
                let event = self.record_deployed(hash, deployed, elapsed);
                self.shared.publisher.reply(&in_flight.desired.cause, event);
            }
            Ok(Step::Fallback(plan)) => {
                // Its runtime change failed half-way; the reload that replaces it
                // deploys the newest config instead.
                self.fallback = Some(plan);
            }
            Ok(Step::Wait(_)) => {}
            Err(error) => {
                let message = error.to_diagnostic().message;
                tracing::warn!(error = %message, "An earlier deployment that outlived its deadline failed");
                if leaves_state_unknown(&error) {
                    self.record.unknown(message);
                } else {
                    self.record.failed(message);
                }
                self.publish_record();
            }
        }
        None
    }

    fn succeeded(&mut self, desired: &Desired, deployed: Deployed, elapsed: Duration) {
        // On the `deploy_instance` span, so a trace of the deployment says how and why.
        let span = tracing::Span::current();
        span.record("strategy", deployed.strategy.as_str());
        span.record("reason", deployed.reason.detail.as_str());
        tracing::info!(
            strategy = %deployed.strategy,
            reason = %deployed.reason.detail,
            duration_ms = elapsed.as_millis() as u64,
            "Instance deployed"
        );
        if deployed.strategy == DeployStrategy::Reload
            && let Some(versions) = &self.shared.versions
        {
            versions.spawn_check(self.driver.clone());
        }
        let event = self.record_deployed(desired.config.hash(), deployed, elapsed);
        self.shared.publisher.reply(&desired.cause, event);
        if let Some(current) = self.current.as_mut() {
            current.drift_check = false;
        }
        self.retry = None;
        let round = self.unreported.take();
        self.report(round, Outcome::Deployed);
    }

    /// Counts and records a deployment of `hash`; returns its event, for the caller to
    /// publish after the record is published (whoever reacts to the event finds it).
    fn record_deployed(
        &mut self,
        hash: ContentHash,
        deployed: Deployed,
        elapsed: Duration,
    ) -> InstanceDeployed {
        let name = self.name().to_owned();
        self.shared
            .metrics
            .deployment(&name, deployed.strategy, true, elapsed.as_secs_f64());
        let event = InstanceDeployed {
            instance: name.clone(),
            hash,
            strategy: deployed.strategy,
            reason: Some(deployed.reason.clone()),
            duration: elapsed,
        };
        let reloaded_at = (deployed.strategy == DeployStrategy::Reload).then(Instant::now);
        self.record.succeeded(deployed, reloaded_at);
        self.publish_record();
        event
    }

    /// Records a failed attempt; returns when to retry.
    fn failed(
        &mut self,
        desired: &Desired,
        error: Diagnostic,
        unknown: bool,
        elapsed: Duration,
    ) -> Instant {
        let name = self.name().to_owned();
        tracing::warn!(error = %error.message, "Instance deployment failed");
        self.shared
            .metrics
            .deployment(&name, DeployStrategy::Reload, false, elapsed.as_secs_f64());
        if unknown {
            self.record.unknown(error.message.clone());
        } else {
            self.record.failed(error.message.clone());
        }
        self.publish_record();
        self.shared.publisher.reply(
            &desired.cause,
            InstanceDeploymentFailed {
                instance: name,
                hash: desired.config.hash(),
                error,
            },
        );
        let round = self.unreported.take();
        self.report(round, Outcome::Failed);
        let settings = self.shared.settings;
        let delay = self
            .retry
            .get_or_insert_with(|| {
                ExponentialBuilder::new()
                    .with_min_delay(settings.min_retry_delay)
                    .with_max_delay(settings.max_retry_delay)
                    .with_factor(2.0)
                    .without_max_times()
                    .build()
            })
            .next()
            .unwrap_or(settings.max_retry_delay);
        tracing::info!(?delay, "Retrying the instance");
        Instant::now() + delay
    }

    /// Checks whether the instance still runs what it was given; on a drift, marks
    /// the current config for a drift-checked redeployment and returns `true`.
    async fn drifted(&mut self) -> bool {
        let name = self.name().to_owned();
        let Some(deployed) = self.record.deployed.clone() else {
            return false;
        };
        let check = tokio::time::timeout(
            self.shared.settings.drift_timeout,
            self.driver.check_drift(&deployed),
        )
        .instrument(tracing::debug_span!("drift_check", instance = %name))
        .await;
        let detail = match check {
            Ok(Ok(Some(detail))) => detail,
            Ok(Ok(None)) => return false,
            Ok(Err(error)) => {
                tracing::warn!(instance = %name, error = %error.to_diagnostic().message, "Drift check failed");
                return false;
            }
            Err(_) => {
                tracing::warn!(instance = %name, timeout = ?self.shared.settings.drift_timeout, "Drift check timed out");
                return false;
            }
        };
        tracing::warn!(instance = %name, %detail, "Drift detected; re-deploying");
        self.shared.metrics.drift_detected(&name);
        self.shared.metrics.out_of_sync(&name);
        self.shared.publisher.publish(DriftDetected {
            instance: name,
            detail,
        });
        match self.current.as_mut() {
            Some(current) => {
                current.drift_check = true;
                true
            }
            None => false,
        }
    }

    /// Records an unaccounted start of a managed instance as a deployment. Returns
    /// `true` when the instance now runs something other than the current config
    /// (so it is deployed again).
    async fn adopt_start(&mut self) -> bool {
        let Some(socket) = self.driver.managed_socket() else {
            return false;
        };
        let name = self.name().to_owned();
        let deployed_before = self.record.deployed.is_some() || self.record.reloads > 0;
        let mut known: Vec<Arc<RenderedConfig>> = self
            .current
            .as_ref()
            .map(|c| c.config.clone())
            .into_iter()
            .collect();
        known.extend(self.record.deployed.as_ref().map(|d| d.config.clone()));
        let started = Instant::now();
        let Some(outcome) = socket.adopt_managed_start(deployed_before, &known).await else {
            return false;
        };
        let elapsed = started.elapsed();
        let cause = self.current.as_ref().map(|c| c.cause.clone());
        let publisher = self.shared.publisher.clone();
        let publish = move |payload: EventPayload| match &cause {
            Some(cause) => publisher.reply(cause, payload),
            None => publisher.publish(payload),
        };
        match outcome {
            Ok(deployed) => {
                let hash = deployed.config.hash();
                tracing::info!(
                    strategy = %deployed.strategy,
                    reason = %deployed.reason.detail,
                    hash = %hash.short(),
                    "Managed HAProxy started; recorded as a deployment"
                );
                let event = self.record_deployed(hash, deployed, elapsed);
                publish(event.into());
                let behind = self
                    .current
                    .as_ref()
                    .is_some_and(|c| c.config.hash() != hash);
                if behind {
                    self.shared.metrics.out_of_sync(&name);
                } else if self.current.is_some() {
                    let round = self.unreported.take();
                    self.retry = None;
                    self.report(round, Outcome::Deployed);
                }
                behind
            }
            Err(error) => {
                let diagnostic = error.to_diagnostic();
                tracing::warn!(
                    error = %diagnostic.message,
                    "Managed HAProxy started, but what it runs is unknown"
                );
                self.record.unknown(diagnostic.message.clone());
                self.publish_record();
                self.shared.metrics.out_of_sync(&name);
                if let Some(current) = &self.current {
                    publish(
                        InstanceDeploymentFailed {
                            instance: name,
                            hash: current.config.hash(),
                            error: diagnostic,
                        }
                        .into(),
                    );
                }
                self.current.is_some()
            }
        }
    }
}

/// Whether what the instance runs cannot be told after `error`: a reload may still
/// complete, or the files may not be what it runs.
fn leaves_state_unknown(error: &DeployError) -> bool {
    matches!(
        error,
        DeployError::RestoreFailed { .. }
            | DeployError::ReloadTimeout(_)
            | DeployError::MarkerMismatch { .. }
    )
}

/// Completes when a managed HAProxy came up; never without a supervisor.
async fn ready_changed(events: &mut Option<watch::Receiver<u64>>) {
    match events {
        Some(receiver) => {
            if receiver.changed().await.is_err() {
                *events = None;
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}
