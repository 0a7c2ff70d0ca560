//! The deployer component: consumes `DeploymentScheduled`, deploys to every instance
//! of the fleet — local socket and Data Plane API instances alike — in parallel
//! (bounded), and publishes `DeploymentStarted`, `InstanceDeployed` /
//! `InstanceDeploymentFailed` and `DeploymentCompleted`.
//!
//! Fleet: the static instances plus, per discovery source, the latest
//! `InstancesDiscovered` set. A newly discovered instance gets the last scheduled
//! config at once; a vanished one is forgotten (its store record and metric series
//! go). A failing instance never blocks the others.
//!
//! Leadership (optional, [`Deployer::with_leadership`]): while the watched value is
//! `false` the deployer only remembers the latest scheduled config; when it turns
//! `true` that config is deployed at once, with a drift check (hot standby).
//!
//! What each instance runs is kept in a [`LastDeployedStore`] created outside the
//! kernel iteration, so an unchanged render after a controller reinit is a no-op. A
//! failed instance is retried with backoff (1 s doubling to 60 s) with the newest
//! config; a newer `DeploymentScheduled` replaces a waiting one (latest wins).
//!
//! Managed mode: every start of a managed HAProxy is a deployment (a reload with reason
//! `first_deploy` or `restart`) of the files on disk. A start that no deployment caused
//! (the supervisor restarted a crashed process, or a failed start came up on a later
//! attempt) is recorded as soon as the supervisor reports it ready, and before any
//! deployment to that instance, so it is never mistaken for a no-op.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use hapwright_eventbus::model::{ContentHash, Diagnostic, InstanceRef, RenderedConfig};
use hapwright_eventbus::{
    Bus, BusError, Component, ComponentError, Context, DeploymentCompleted, DeploymentStarted,
    DeploymentSummary, Event, EventKind, EventPayload, InstanceDeployed, InstanceDeploymentFailed,
    Subscription,
};
use tokio::time::Instant;
use tracing::Instrument;

use crate::dataplane::DataplaneDriver;
use crate::driver::{Deployed, SocketDriver};
use crate::fleet::{DiscoveredCredentials, Driver, Fleet};
use crate::haproxy_config::{self, Config as Model};
use crate::managed::ManagedHaproxy;
use crate::metrics::Metrics;
use crate::plan;
use crate::scheduler::ReloadClassifier;
use crate::socket::InstanceConfig;

/// One instance's record in the [`LastDeployedStore`].
#[derive(Clone, Debug, Default)]
pub struct InstanceRecord {
    /// What the instance runs after the last successful deployment.
    pub deployed: Option<Arc<Deployed>>,
    /// The last deployment error, cleared by a success.
    pub last_error: Option<String>,
    /// When the last attempt finished.
    pub last_attempt: Option<SystemTime>,
    /// Reloads hapwright performed on this instance.
    pub reloads: u64,
}

/// Per-instance "last deployed" state, shared between the scheduler's classifier,
/// the deployer and the debug endpoints. Create it once per process and hand clones
/// to each kernel iteration.
#[derive(Clone, Debug, Default)]
pub struct LastDeployedStore {
    inner: Arc<Mutex<HashMap<String, InstanceRecord>>>,
}

impl LastDeployedStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// What `instance` runs, if hapwright deployed to it.
    pub fn deployed(&self, instance: &str) -> Option<Arc<Deployed>> {
        self.lock().get(instance).and_then(|r| r.deployed.clone())
    }

    /// The record of one instance.
    pub fn get(&self, instance: &str) -> Option<InstanceRecord> {
        self.lock().get(instance).cloned()
    }

    /// Every record, by instance name (for `/debug/instances`).
    pub fn snapshot(&self) -> BTreeMap<String, InstanceRecord> {
        self.lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Records a successful deployment.
    pub fn record_success(&self, instance: &str, deployed: Deployed) {
        let mut inner = self.lock();
        let record = inner.entry(instance.to_owned()).or_default();
        if deployed.strategy == hapwright_eventbus::model::DeployStrategy::Reload {
            record.reloads += 1;
        }
        record.last_attempt = Some(deployed.at);
        record.deployed = Some(Arc::new(deployed));
        record.last_error = None;
    }

    /// Records a failed deployment (the instance keeps running what it ran).
    pub fn record_failure(&self, instance: &str, error: String) {
        let mut inner = self.lock();
        let record = inner.entry(instance.to_owned()).or_default();
        record.last_error = Some(error);
        record.last_attempt = Some(SystemTime::now());
    }

    /// Records that what `instance` runs is unknown (e.g. a restarted HAProxy does not
    /// run the files on disk); the next deployment works it out again.
    pub fn record_unknown(&self, instance: &str, error: String) {
        let mut inner = self.lock();
        let record = inner.entry(instance.to_owned()).or_default();
        record.deployed = None;
        record.last_error = Some(error);
        record.last_attempt = Some(SystemTime::now());
    }

    /// Forgets an instance (e.g. its HAProxy was replaced).
    pub fn forget(&self, instance: &str) {
        self.lock().remove(instance);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, InstanceRecord>> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The scheduler's [`ReloadClassifier`] over a [`LastDeployedStore`]: a deployment
/// needs a reload when an instance has no record yet or its change plan says so.
#[derive(Clone, Debug)]
pub struct StoreClassifier {
    store: LastDeployedStore,
}

impl StoreClassifier {
    /// A classifier reading `store`.
    pub fn new(store: LastDeployedStore) -> Self {
        Self { store }
    }
}

impl ReloadClassifier for StoreClassifier {
    fn needs_reload(&self, config: &RenderedConfig, instances: &[String]) -> bool {
        let model = haproxy_config::parse(config.main()).unwrap_or_default();
        instances
            .iter()
            .any(|instance| match self.store.deployed(instance) {
                None => true,
                Some(running) => plan::plan(&running.config, &running.model, config, &model)
                    .reload
                    .is_some(),
            })
    }
}

/// Settings of the deployer component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Deadline of one deployment to one instance.
    pub deployment_timeout: Duration,
    /// Instances deployed at the same time (default 32: deployments mostly wait
    /// on sockets and HTTP, so a fleet goes out in one or two waves).
    pub concurrency: usize,
    /// First retry delay of a failed instance (doubles up to `max_retry_delay`).
    pub min_retry_delay: Duration,
    /// Longest retry delay.
    pub max_retry_delay: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            deployment_timeout: Duration::from_secs(30),
            concurrency: 32,
            min_retry_delay: Duration::from_secs(1),
            max_retry_delay: Duration::from_secs(60),
        }
    }
}

impl From<&crate::config::Timings> for Config {
    fn from(timings: &crate::config::Timings) -> Self {
        Self {
            deployment_timeout: timings.deployment_timeout.get(),
            ..Self::default()
        }
    }
}

/// The deployer component.
pub struct Deployer {
    config: Config,
    fleet: Fleet,
    store: LastDeployedStore,
    managed: Option<ManagedHaproxy>,
    metrics: Metrics,
    credentials: Option<DiscoveredCredentials>,
    leader: Option<tokio::sync::watch::Receiver<bool>>,
    subscription: Option<Subscription>,
}

impl std::fmt::Debug for Deployer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployer")
            .field("config", &self.config)
            .field("instances", &self.fleet.names())
            .finish_non_exhaustive()
    }
}

impl Deployer {
    /// The component's name.
    pub const NAME: &'static str = "deployer";

    /// A deployer for the socket `instances`. `store` and `managed` are created once
    /// per process, outside the kernel iteration; `managed` is needed when an instance
    /// has `managed: true`.
    pub fn new(
        config: Config,
        instances: Vec<InstanceConfig>,
        store: LastDeployedStore,
        managed: Option<ManagedHaproxy>,
        metrics: Metrics,
    ) -> Self {
        let drivers = instances
            .into_iter()
            .map(|instance| {
                let name = instance.name.clone();
                let driver = SocketDriver::new(instance, managed.clone(), metrics.clone());
                (name, Arc::new(driver))
            })
            .collect();
        Self::with_drivers(config, drivers, store, managed, metrics)
    }

    /// A deployer over ready-made drivers (custom timeouts).
    pub fn with_drivers(
        config: Config,
        drivers: BTreeMap<String, Arc<SocketDriver>>,
        store: LastDeployedStore,
        managed: Option<ManagedHaproxy>,
        metrics: Metrics,
    ) -> Self {
        let fleet = Fleet::new();
        for driver in drivers.into_values() {
            fleet.insert(Driver::Socket(driver));
        }
        Self {
            config,
            fleet,
            store,
            managed,
            metrics,
            credentials: None,
            leader: None,
            subscription: None,
        }
    }

    /// Adds static Data Plane API instances.
    #[must_use]
    pub fn with_dataplane(self, drivers: impl IntoIterator<Item = DataplaneDriver>) -> Self {
        for driver in drivers {
            self.fleet.insert(Driver::Dataplane(Arc::new(driver)));
        }
        self
    }

    /// How to reach discovered Data Plane API instances (`InstancesDiscovered`).
    /// Without it a discovered instance fails its deployments with an error that
    /// says so.
    #[must_use]
    pub fn with_discovery(mut self, credentials: DiscoveredCredentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Gates deployments on leadership: only while `leader` holds `true` does the
    /// deployer deploy (a follower keeps the latest scheduled config); on a
    /// `false`→`true` change it deploys that config at once. Without it, it always
    /// deploys.
    #[must_use]
    pub fn with_leadership(mut self, leader: tokio::sync::watch::Receiver<bool>) -> Self {
        self.leader = Some(leader);
        self
    }

    /// The fleet this deployer drives (for the drift monitor and status).
    pub fn fleet(&self) -> Fleet {
        self.fleet.clone()
    }
}

#[derive(Clone)]
struct Round {
    config: Arc<RenderedConfig>,
    instances: Vec<String>,
    drift_check: bool,
    cause: Arc<Event>,
}

struct Runner {
    config: Config,
    fleet: Fleet,
    store: LastDeployedStore,
    metrics: Metrics,
    credentials: Option<DiscoveredCredentials>,
    static_names: std::collections::BTreeSet<String>,
}

impl Runner {
    async fn deploy_round(&self, ctx: &Context, round: &Round) -> Vec<String> {
        let started = Instant::now();
        let hash = round.config.hash();
        let publisher = ctx.publisher();
        publisher.reply(
            &round.cause,
            DeploymentStarted {
                hash,
                instances: round.instances.clone(),
            },
        );
        let model = Arc::new(haproxy_config::parse(round.config.main()).unwrap_or_default());
        let results: Vec<(String, Result<(), Diagnostic>)> =
            futures::stream::iter(round.instances.clone())
                .map(|instance| {
                    let model = model.clone();
                    let span = tracing::info_span!(
                        "deploy_instance",
                        instance = %instance,
                        correlation_id = ?round.cause.correlation_id,
                        hash = %hash.short(),
                    );
                    async move {
                        let outcome = self.deploy_one(ctx, round, &instance, model).await;
                        (instance, outcome)
                    }
                    .instrument(span)
                })
                .buffer_unordered(self.config.concurrency.max(1))
                .collect()
                .await;
        let mut succeeded = Vec::new();
        let mut failed = Vec::new();
        for (instance, outcome) in results {
            match outcome {
                Ok(()) => succeeded.push(instance),
                Err(_) => failed.push(instance),
            }
        }
        succeeded.sort();
        failed.sort();
        if failed.is_empty() {
            ctx.health().healthy();
        } else {
            ctx.health()
                .unhealthy(format!("deployment failed on {}", failed.join(", ")));
        }
        publisher.reply(
            &round.cause,
            DeploymentCompleted {
                summary: DeploymentSummary {
                    hash,
                    succeeded,
                    failed: failed.clone(),
                    duration: started.elapsed(),
                },
            },
        );
        failed
    }

    async fn deploy_one(
        &self,
        ctx: &Context,
        round: &Round,
        instance: &str,
        model: Arc<Model>,
    ) -> Result<(), Diagnostic> {
        let hash = round.config.hash();
        let publisher = ctx.publisher();
        let Some(driver) = self.fleet.get(instance) else {
            let error = Diagnostic::error(format!(
                "instance `{instance}` has no driver in this deployer"
            ));
            publisher.reply(
                &round.cause,
                InstanceDeploymentFailed {
                    instance: instance.to_owned(),
                    hash,
                    error: error.clone(),
                },
            );
            return Err(error);
        };
        // A start of a managed HAProxy not recorded yet is a deployment of its own;
        // when it runs the desired config it is this instance's deployment.
        if let Some(Ok(adopted)) = self
            .adopt_start(ctx, Some(&round.cause), instance, Some(&round.config))
            .await
            && adopted == hash
        {
            return Ok(());
        }
        let started = Instant::now();
        let running = self.store.deployed(instance);
        let outcome = tokio::time::timeout(
            self.config.deployment_timeout,
            driver.deploy(
                round.config.clone(),
                Some(model),
                running,
                round.drift_check,
            ),
        )
        .await;
        let elapsed = started.elapsed();
        match outcome {
            Ok(Ok(deployed)) => {
                tracing::info!(
                    strategy = %deployed.strategy,
                    reason = %deployed.reason.detail,
                    duration_ms = elapsed.as_millis() as u64,
                    "Instance deployed"
                );
                self.metrics
                    .deployment(instance, deployed.strategy, true, elapsed.as_secs_f64());
                publisher.reply(
                    &round.cause,
                    InstanceDeployed {
                        instance: instance.to_owned(),
                        hash,
                        strategy: deployed.strategy,
                        reason: Some(deployed.reason.clone()),
                        duration: elapsed,
                    },
                );
                self.store.record_success(instance, deployed);
                Ok(())
            }
            Ok(Err(error)) => {
                let diagnostic = error.to_diagnostic();
                Err(self.failed(ctx, round, instance, diagnostic, elapsed))
            }
            Err(_) => {
                let diagnostic = Diagnostic::error(format!(
                    "deployment did not finish within {:?}",
                    self.config.deployment_timeout
                ));
                Err(self.failed(ctx, round, instance, diagnostic, elapsed))
            }
        }
    }

    /// Records an unaccounted start of a managed `instance` (see
    /// [`SocketDriver::adopt_managed_start`]) as a deployment, publishing
    /// `InstanceDeployed` (in reply to `cause`, if any). Returns the hash it runs;
    /// `None` when there was no such start. A failure is only logged and recorded in
    /// the store: the caller reports it (or deploys anyway).
    async fn adopt_start(
        &self,
        ctx: &Context,
        cause: Option<&Arc<Event>>,
        instance: &str,
        desired: Option<&Arc<RenderedConfig>>,
    ) -> Option<Result<ContentHash, Diagnostic>> {
        let driver = self.fleet.get(instance)?;
        let driver = driver.managed_socket()?;
        let started = Instant::now();
        let record = self.store.get(instance);
        let deployed_before = record.is_some_and(|r| r.deployed.is_some() || r.reloads > 0);
        let mut known: Vec<Arc<RenderedConfig>> = desired.cloned().into_iter().collect();
        known.extend(self.store.deployed(instance).map(|d| d.config.clone()));
        let outcome = driver.adopt_managed_start(deployed_before, &known).await?;
        let elapsed = started.elapsed();
        let publisher = ctx.publisher();
        let publish = |payload: EventPayload| match cause {
            Some(cause) => publisher.reply(cause, payload),
            None => publisher.publish(payload),
        };
        match outcome {
            Ok(deployed) => {
                let hash = deployed.config.hash();
                tracing::info!(
                    instance,
                    strategy = %deployed.strategy,
                    reason = %deployed.reason.detail,
                    hash = %hash.short(),
                    "Managed HAProxy started; recorded as a deployment"
                );
                self.metrics
                    .deployment(instance, deployed.strategy, true, elapsed.as_secs_f64());
                if desired.is_some_and(|d| d.hash() != hash) {
                    self.metrics.out_of_sync(instance);
                }
                publish(
                    InstanceDeployed {
                        instance: instance.to_owned(),
                        hash,
                        strategy: deployed.strategy,
                        reason: Some(deployed.reason.clone()),
                        duration: elapsed,
                    }
                    .into(),
                );
                self.store.record_success(instance, deployed);
                Some(Ok(hash))
            }
            Err(error) => {
                let diagnostic = error.to_diagnostic();
                tracing::warn!(
                    instance,
                    error = %diagnostic.message,
                    "Managed HAProxy started, but what it runs is unknown"
                );
                self.store
                    .record_unknown(instance, diagnostic.message.clone());
                self.metrics.out_of_sync(instance);
                Some(Err(diagnostic))
            }
        }
    }

    /// Records the unaccounted starts of every managed instance. An instance that now
    /// runs the desired config (of `last`, the latest scheduled round) leaves the
    /// retry; one that runs something else is deployed again right away.
    async fn adopt_starts(
        &self,
        ctx: &Context,
        names: &[String],
        last: Option<&Round>,
        retry: &mut Option<(Round, Instant, u32)>,
    ) {
        for name in names {
            let last = last.filter(|round| round.instances.contains(name));
            let Some(outcome) = self
                .adopt_start(
                    ctx,
                    last.map(|round| &round.cause),
                    name,
                    last.map(|round| &round.config),
                )
                .await
            else {
                continue;
            };
            let Some(last) = last else {
                continue;
            };
            if let Err(error) = &outcome {
                ctx.publisher().reply(
                    &last.cause,
                    InstanceDeploymentFailed {
                        instance: name.clone(),
                        hash: last.config.hash(),
                        error: error.clone(),
                    },
                );
            }
            if matches!(outcome, Ok(hash) if hash == last.config.hash()) {
                if let Some((round, ..)) = retry.as_mut() {
                    round.instances.retain(|instance| instance != name);
                }
                if retry
                    .as_ref()
                    .is_some_and(|(round, ..)| round.instances.is_empty())
                {
                    *retry = None;
                }
                continue;
            }
            match retry.as_mut() {
                Some((round, at, _)) => {
                    if !round.instances.contains(name) {
                        round.instances.push(name.clone());
                    }
                    *at = Instant::now();
                }
                None => {
                    let mut round = last.clone();
                    round.instances = vec![name.clone()];
                    *retry = Some((round, Instant::now(), 1));
                }
            }
        }
    }

    fn failed(
        &self,
        ctx: &Context,
        round: &Round,
        instance: &str,
        error: Diagnostic,
        elapsed: Duration,
    ) -> Diagnostic {
        tracing::warn!(error = %error.message, "Instance deployment failed");
        self.metrics.deployment(
            instance,
            hapwright_eventbus::model::DeployStrategy::Reload,
            false,
            elapsed.as_secs_f64(),
        );
        self.store.record_failure(instance, error.message.clone());
        ctx.publisher().reply(
            &round.cause,
            InstanceDeploymentFailed {
                instance: instance.to_owned(),
                hash: round.config.hash(),
                error: error.clone(),
            },
        );
        error
    }
}

fn round_of(event: &Arc<Event>) -> Option<Round> {
    match &event.payload {
        EventPayload::DeploymentScheduled(scheduled) => Some(Round {
            config: scheduled.config.clone(),
            instances: scheduled.instances.clone(),
            drift_check: scheduled.drift_check,
            cause: event.clone(),
        }),
        _ => None,
    }
}

#[async_trait::async_trait]
impl Component for Deployer {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn provides(&self) -> Vec<String> {
        vec![Self::NAME.to_owned()]
    }

    fn subscribe(&mut self, bus: &Bus) -> Result<(), BusError> {
        self.subscription = Some(bus.subscribe(
            Self::NAME,
            [
                EventKind::DeploymentScheduled,
                EventKind::InstancesDiscovered,
            ],
        )?);
        Ok(())
    }

    async fn run(self: Box<Self>, ctx: Context) -> Result<(), ComponentError> {
        let mut subscription = self
            .subscription
            .ok_or("deployer started without subscribing")?;
        let managed_names: Vec<String> = self
            .fleet
            .drivers()
            .iter()
            .filter(|d| d.managed_socket().is_some())
            .map(|d| d.name().to_owned())
            .collect();
        let managed = self.managed;
        let mut leader = self.leader;
        let runner = Runner {
            config: self.config,
            static_names: self.fleet.names().into_iter().collect(),
            fleet: self.fleet,
            store: self.store,
            metrics: self.metrics,
            credentials: self.credentials,
        };
        let mut fleet = FleetState::default();
        let mut retry: Option<(Round, Instant, u32)> = None;
        // The latest scheduled round: what the instances should run.
        let mut last: Option<Round> = None;
        let mut is_leader = leader.as_ref().is_none_or(|l| *l.borrow());
        let mut ready_events = managed
            .as_ref()
            .filter(|_| !managed_names.is_empty())
            .map(ManagedHaproxy::ready_events);
        // Starts that came up while no deployer ran (e.g. during a reinit).
        if is_leader {
            runner
                .adopt_starts(&ctx, &managed_names, None, &mut retry)
                .await;
        }
        let mut health_tick = tokio::time::interval(Duration::from_secs(1));
        health_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ctx.health().healthy();
        loop {
            let retry_at = retry.as_ref().filter(|_| is_leader).map(|(_, at, _)| *at);
            let mut round = tokio::select! {
                biased;
                () = ctx.cancelled() => return Ok(()),
                became = leadership_changed(&mut leader) => {
                    let was = is_leader;
                    is_leader = became;
                    if was || !is_leader {
                        continue;
                    }
                    tracing::info!("Leadership acquired; deploying the latest config");
                    let Some(last) = &last else { continue };
                    let mut round = last.clone();
                    round.drift_check = true;
                    round
                }
                event = subscription.recv() => {
                    let Some(event) = event else { return Ok(()) };
                    match &event.payload {
                        EventPayload::DeploymentScheduled(_) => match round_of(&event) {
                            Some(round) => round,
                            None => continue,
                        },
                        EventPayload::InstancesDiscovered(discovered) => {
                            let added = runner.discovered(
                                &mut fleet,
                                &discovered.source,
                                &discovered.instances,
                                &mut last,
                                &mut retry,
                            );
                            // A new instance gets the last good config at once.
                            match (&last, is_leader && !added.is_empty()) {
                                (Some(last), true) => {
                                    let mut round = last.clone();
                                    round.instances = added;
                                    round.drift_check = false;
                                    round
                                }
                                _ => continue,
                            }
                        }
                        _ => continue,
                    }
                }
                () = ready_changed(&mut ready_events) => {
                    if is_leader {
                        runner
                            .adopt_starts(&ctx, &managed_names, last.as_ref(), &mut retry)
                            .await;
                    }
                    if let Some(managed) = &managed {
                        report_managed_health(&ctx, managed, &managed_names, retry.is_none()).await;
                    }
                    continue;
                }
                () = sleep_until(retry_at) => {
                    let (round, _, _) = retry.as_ref().expect("retry is set");
                    round.clone()
                }
                _ = health_tick.tick(), if !managed_names.is_empty() => {
                    if let Some(managed) = &managed {
                        report_managed_health(&ctx, managed, &managed_names, retry.is_none()).await;
                    }
                    continue;
                }
            };
            // Latest wins: a newer scheduled deployment replaces this one; instance
            // changes that came meanwhile apply to it.
            while let Some(newer) = subscription.try_recv() {
                match &newer.payload {
                    EventPayload::InstancesDiscovered(discovered) => {
                        let added = runner.discovered(
                            &mut fleet,
                            &discovered.source,
                            &discovered.instances,
                            &mut last,
                            &mut retry,
                        );
                        round.instances.retain(|name| runner.fleet.contains(name));
                        for name in added {
                            if !round.instances.contains(&name) {
                                round.instances.push(name);
                            }
                        }
                    }
                    _ => {
                        if let Some(newer) = round_of(&newer) {
                            let drift = round.drift_check || newer.drift_check;
                            round = newer;
                            round.drift_check = drift;
                        }
                    }
                }
            }
            // A retry or a round for new instances is a part of the latest one.
            if !last
                .as_ref()
                .is_some_and(|l| Arc::ptr_eq(&l.cause, &round.cause))
            {
                last = Some(round.clone());
            }
            if !is_leader {
                tracing::debug!(hash = %round.config.hash().short(), "Not the leader; keeping the config for when this replica leads");
                continue;
            }
            let span = tracing::info_span!(
                "deployment",
                correlation_id = ?round.cause.correlation_id,
                hash = %round.config.hash().short(),
            );
            let failed = runner.deploy_round(&ctx, &round).instrument(span).await;
            let is_retry = retry
                .as_ref()
                .is_some_and(|(r, _, _)| Arc::ptr_eq(&r.cause, &round.cause));
            // Instances of a waiting retry that this round did not cover stay in it.
            let mut still_failing = failed;
            if is_retry && let Some((waiting, ..)) = &retry {
                for name in &waiting.instances {
                    if !round.instances.contains(name) && !still_failing.contains(name) {
                        still_failing.push(name.clone());
                    }
                }
            }
            retry = if still_failing.is_empty() {
                None
            } else {
                let attempt = if is_retry {
                    retry.as_ref().map_or(1, |(_, _, n)| n + 1)
                } else {
                    1
                };
                let delay = runner
                    .config
                    .min_retry_delay
                    .saturating_mul(1 << (attempt - 1).min(16))
                    .min(runner.config.max_retry_delay);
                tracing::info!(?delay, instances = ?still_failing, "Retrying failed instances");
                Some((
                    Round {
                        config: round.config.clone(),
                        instances: still_failing,
                        drift_check: round.drift_check,
                        cause: round.cause.clone(),
                    },
                    Instant::now() + delay,
                    attempt,
                ))
            };
        }
    }
}

/// The discovered instances, per discovery source.
#[derive(Debug, Default)]
struct FleetState {
    discovered: BTreeMap<Arc<str>, std::collections::BTreeSet<String>>,
}

impl Runner {
    /// Applies one `InstancesDiscovered`: drivers for new instances, forgets the
    /// vanished ones (store, metrics, retry, the latest round). Returns the names
    /// added to the fleet.
    fn discovered(
        &self,
        state: &mut FleetState,
        source: &Arc<str>,
        instances: &[InstanceRef],
        last: &mut Option<Round>,
        retry: &mut Option<(Round, Instant, u32)>,
    ) -> Vec<String> {
        let now: std::collections::BTreeSet<String> =
            instances.iter().map(|i| i.name.clone()).collect();
        let before = state
            .discovered
            .insert(source.clone(), now.clone())
            .unwrap_or_default();
        let elsewhere = |name: &String, state: &FleetState| {
            self.static_names.contains(name)
                || state
                    .discovered
                    .iter()
                    .any(|(other, names)| other != source && names.contains(name))
        };
        let mut added = Vec::new();
        for instance in instances {
            if self.static_names.contains(&instance.name) {
                tracing::warn!(instance = %instance.name, %source, "A discovered instance has the name of a static one; keeping the static one");
                continue;
            }
            if self.fleet.contains(&instance.name) && before.contains(&instance.name) {
                continue;
            }
            if self.fleet.contains(&instance.name) {
                // Already known through another source.
                continue;
            }
            let Some(credentials) = &self.credentials else {
                tracing::warn!(instance = %instance.name, %source, "Discovered an instance, but no discovery credentials are configured");
                continue;
            };
            match credentials.driver(instance, &self.metrics) {
                Ok(driver) => {
                    tracing::info!(instance = %instance.name, address = %instance.address, %source, "Instance discovered");
                    self.fleet.insert(driver);
                    self.metrics.out_of_sync(&instance.name);
                    added.push(instance.name.clone());
                }
                Err(error) => {
                    tracing::warn!(instance = %instance.name, %source, %error, "Discovered instance ignored");
                }
            }
        }
        for name in before.difference(&now) {
            if elsewhere(name, state) {
                continue;
            }
            tracing::info!(instance = %name, %source, "Instance gone; forgetting it");
            self.fleet.remove(name);
            self.store.forget(name);
            self.metrics.forget(name);
            if let Some((round, ..)) = retry.as_mut() {
                round.instances.retain(|i| i != name);
            }
            if retry.as_ref().is_some_and(|(r, ..)| r.instances.is_empty()) {
                *retry = None;
            }
        }
        if let Some(last) = last.as_mut() {
            last.instances.retain(|i| self.fleet.contains(i));
            for name in &added {
                if !last.instances.contains(name) {
                    last.instances.push(name.clone());
                }
            }
        }
        added
    }
}

/// Completes with the new value when the leadership value changes; never without a
/// leadership gate (or once its sender is gone).
async fn leadership_changed(leader: &mut Option<tokio::sync::watch::Receiver<bool>>) -> bool {
    match leader {
        Some(receiver) => {
            if receiver.changed().await.is_err() {
                // The elector is gone: keep the last value and stop watching.
                *leader = None;
                return std::future::pending().await;
            }
            *receiver.borrow_and_update()
        }
        None => std::future::pending().await,
    }
}

/// Unhealthy while a managed HAProxy is down; healthy again once every one runs and
/// no failed deployment is waiting for a retry.
async fn report_managed_health(
    ctx: &Context,
    managed: &ManagedHaproxy,
    names: &[String],
    deployments_ok: bool,
) {
    let mut down = Vec::new();
    for name in names {
        if let Some(state) = managed.state(name).await
            && !state.is_running()
        {
            down.push(format!("{name}: {state:?}"));
        }
    }
    if !down.is_empty() {
        ctx.health()
            .unhealthy(format!("managed HAProxy not running ({})", down.join("; ")));
    } else if deployments_ok {
        ctx.health().healthy();
    }
}

/// Completes when a managed HAProxy came up; never without a supervisor.
async fn ready_changed(events: &mut Option<tokio::sync::watch::Receiver<u64>>) {
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

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
