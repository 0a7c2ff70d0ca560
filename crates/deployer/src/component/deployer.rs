//! The deployer component: consumes `DeploymentScheduled`, hands the config to every
//! instance of the fleet — local socket and Data Plane API instances alike — and
//! publishes `DeploymentStarted` and, once every instance of the round has an
//! outcome, `DeploymentCompleted`.
//!
//! Each instance is owned by its own worker task (the `instance` module): it alone
//! holds what the instance runs, plans each deployment once, keeps the instance's
//! reload window (`minReloadInterval`), retries failures with backoff and checks for
//! drift. So runtime-only changes reach every instance that can take them while
//! another waits for its reload window, is unreachable or is being restarted. The
//! workers publish `InstanceDeployed` / `InstanceDeploymentFailed` themselves.
//!
//! Fleet: the static instances plus, per discovery source, the latest
//! `InstancesDiscovered` set. The deployer is the one owner of that membership: a
//! scheduled config goes to the instances it names (the static ones) and to every
//! discovered one, and a discovery change touches only the instances that came or
//! went. A newly discovered instance gets the last scheduled config at once; a vanished one is forgotten: its worker stops and clears its record
//! and metric series, and an instance of the same name discovered again waits for
//! that before it starts, clean.
//!
//! Leadership (optional, [`Deployer::with_leadership`]): while the watched value is
//! `false` the deployer only remembers the latest scheduled config (and workers skip
//! drift checks); when it turns `true` that config is deployed at once, with a drift
//! check (hot standby).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hapwright_eventbus::model::{ContentHash, InstanceRef, RenderedConfig};
use hapwright_eventbus::{
    Component, ComponentError, Context, DeploymentCompleted, DeploymentStarted, DeploymentSummary,
    Event, EventKind, EventPayload, Interest,
};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;

use crate::client::socket::InstanceConfig;
use crate::component::instance::{self, Desired, Handle, Outcome, Report};
use crate::driver::Driver;
use crate::driver::dataplane::DataplaneDriver;
use crate::driver::fleet::DiscoveredCredentials;
use crate::driver::managed::ManagedHaproxy;
use crate::driver::{Deployed, DriverConfig, SocketDriver};
use crate::haproxy::config::Config as Model;
use crate::metrics::Metrics;
use crate::version_check::VersionCheck;

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
    /// When hapwright last reloaded it (its reload window starts there).
    pub last_reload: Option<Instant>,
}

/// Per-instance "last deployed" state: what each instance's worker published about
/// its instance, and the deployer's memory across controller reinits. Create it once
/// per process and hand a clone to each kernel iteration's deployer.
///
/// Each record has one writer: the worker of its instance, which owns the record
/// while it runs (loading the previous one when it starts), publishes a snapshot
/// after every change and clears it when its instance is removed. Everybody else
/// (the deployer's health, `/debug/instances`, tests, benchmarks) reads snapshots.
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

    /// Publishes `record` as `instance`'s snapshot (its worker only).
    pub(crate) fn publish(&self, instance: &str, record: InstanceRecord) {
        self.lock().insert(instance.to_owned(), record);
    }

    /// Drops `instance`'s record (its worker only, when the instance is removed).
    pub(crate) fn clear(&self, instance: &str) {
        self.lock().remove(instance);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, InstanceRecord>> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl InstanceRecord {
    /// A successful deployment; `reloaded_at` is set when it reloaded the instance.
    pub(crate) fn succeeded(&mut self, deployed: Deployed, reloaded_at: Option<Instant>) {
        if let Some(at) = reloaded_at {
            self.reloads += 1;
            self.last_reload = Some(at);
        }
        self.last_attempt = Some(deployed.at);
        self.deployed = Some(Arc::new(deployed));
        self.last_error = None;
    }

    /// A failed deployment (the instance keeps running what it ran).
    pub(crate) fn failed(&mut self, error: String) {
        self.last_error = Some(error);
        self.last_attempt = Some(SystemTime::now());
    }

    /// What the instance runs is unknown (e.g. a restarted HAProxy does not run the
    /// files on disk); the next deployment works it out again.
    pub(crate) fn unknown(&mut self, error: String) {
        self.deployed = None;
        self.failed(error);
    }
}

/// Settings of the deployer component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Deadline of one deployment to one instance. The socket driver's reload
    /// confirmation gets this minus a margin ([`Config::reload_timeout`]), so a slow
    /// reload fails (and its files are restored) before the deadline cancels it.
    pub deployment_timeout: Duration,
    /// Minimum time between two reloads of one instance (`minReloadInterval`).
    pub min_reload_interval: Duration,
    /// Instances deployed at the same time (default 32: deployments mostly wait
    /// on sockets and HTTP, so a fleet goes out in one or two waves).
    pub concurrency: usize,
    /// First retry delay of a failed instance (doubles up to `max_retry_delay`).
    pub min_retry_delay: Duration,
    /// Longest retry delay.
    pub max_retry_delay: Duration,
    /// Time between two drift checks of an instance (`driftPreventionInterval`).
    pub drift_interval: Duration,
    /// Deadline of one drift check.
    pub drift_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            deployment_timeout: Duration::from_secs(30),
            min_reload_interval: Duration::from_secs(5),
            concurrency: 32,
            min_retry_delay: Duration::from_secs(1),
            max_retry_delay: Duration::from_secs(60),
            drift_interval: Duration::from_secs(60),
            drift_timeout: Duration::from_secs(10),
        }
    }
}

impl Config {
    /// The socket driver's reload confirmation timeout: the deployment timeout minus
    /// a margin (a fifth of it, at most 5 s) for writing and restoring files.
    pub fn reload_timeout(&self) -> Duration {
        let margin = (self.deployment_timeout / 5).min(Duration::from_secs(5));
        self.deployment_timeout.saturating_sub(margin)
    }

    /// How long a runtime address change or server removal waits for requests in
    /// flight: 10 s, at most a third of the deployment timeout, so the attempt ends
    /// within its deadline (a change that does not drain in time falls back to a
    /// reload).
    pub fn drain_timeout(&self) -> Duration {
        crate::client::runtime::DEFAULT_DRAIN_TIMEOUT.min(self.deployment_timeout / 3)
    }

    fn instance_settings(&self) -> instance::Settings {
        instance::Settings {
            deployment_timeout: self.deployment_timeout,
            min_reload_interval: self.min_reload_interval,
            min_retry_delay: self.min_retry_delay,
            max_retry_delay: self.max_retry_delay,
            drift_interval: self.drift_interval,
            drift_timeout: self.drift_timeout.min(self.drift_interval),
        }
    }
}

impl From<&crate::config::Timings> for Config {
    fn from(timings: &crate::config::Timings) -> Self {
        Self {
            deployment_timeout: timings.deployment_timeout.get(),
            min_reload_interval: timings.min_reload_interval.get(),
            drift_interval: timings.drift_prevention_interval.get(),
            ..Self::default()
        }
    }
}

/// The deployer component.
pub struct Deployer {
    config: Config,
    drivers: BTreeMap<String, Arc<dyn Driver>>,
    store: LastDeployedStore,
    managed: Option<ManagedHaproxy>,
    metrics: Metrics,
    credentials: Option<DiscoveredCredentials>,
    leader: Option<tokio::sync::watch::Receiver<bool>>,
    versions: Option<VersionCheck>,
}

impl std::fmt::Debug for Deployer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployer")
            .field("config", &self.config)
            .field("instances", &self.drivers.keys().collect::<Vec<_>>())
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
        let driver_config = DriverConfig {
            reload_timeout: config.reload_timeout(),
            drain_timeout: config.drain_timeout(),
            ..DriverConfig::default()
        };
        let drivers = instances
            .into_iter()
            .map(|instance| {
                let name = instance.name.clone();
                let driver = SocketDriver::new(instance, managed.clone(), metrics.clone())
                    .with_config(driver_config);
                (name, Arc::new(driver) as Arc<dyn Driver>)
            })
            .collect();
        Self::with_drivers(config, drivers, store, managed, metrics)
    }

    /// A deployer over ready-made drivers (custom timeouts, other transports).
    pub fn with_drivers(
        config: Config,
        drivers: BTreeMap<String, Arc<dyn Driver>>,
        store: LastDeployedStore,
        managed: Option<ManagedHaproxy>,
        metrics: Metrics,
    ) -> Self {
        Self {
            config,
            drivers,
            store,
            managed,
            metrics,
            credentials: None,
            leader: None,
            versions: None,
        }
    }

    /// Reads each instance's HAProxy version after every reload or start and
    /// compares its line with the validator's (see [`crate::version_check`]).
    #[must_use]
    pub fn with_version_check(mut self, versions: VersionCheck) -> Self {
        self.versions = Some(versions);
        self
    }

    /// Adds static Data Plane API instances.
    #[must_use]
    pub fn with_dataplane(mut self, drivers: impl IntoIterator<Item = DataplaneDriver>) -> Self {
        for driver in drivers {
            self.drivers.insert(
                driver.name().to_owned(),
                Arc::new(driver) as Arc<dyn Driver>,
            );
        }
        self
    }

    /// How to reach discovered Data Plane API instances (`InstancesDiscovered`).
    /// Without it a discovered instance is ignored with a warning.
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

    /// Names of the static instances.
    pub fn instance_names(&self) -> Vec<String> {
        self.drivers.keys().cloned().collect()
    }
}

/// The latest scheduled deployment: what every instance should run.
#[derive(Clone)]
struct Latest {
    config: Arc<RenderedConfig>,
    model: Arc<Model>,
    cause: Arc<Event>,
}

/// One `DeploymentScheduled` (or its share for new instances) until every instance
/// has an outcome.
struct Round {
    cause: Arc<Event>,
    hash: ContentHash,
    started: Instant,
    pending: BTreeSet<String>,
    succeeded: Vec<String>,
    failed: Vec<String>,
}

/// The deployer's running state.
struct Fleet {
    shared: instance::Shared,
    cancel: tokio_util::sync::CancellationToken,
    workers: BTreeMap<String, Handle>,
    static_names: BTreeSet<String>,
    discovered: BTreeMap<Arc<str>, BTreeSet<String>>,
    credentials: Option<DiscoveredCredentials>,
    rounds: BTreeMap<u64, Round>,
    next_round: u64,
    /// Workers of removed instances that are still stopping (finishing or
    /// aborting their attempt in flight), by instance name.
    stopping: BTreeMap<String, tokio::task::JoinHandle<()>>,
    /// Discovered instances refused before anything was sent to them (plain http
    /// across the network, an unusable address), with the reason.
    refused: BTreeMap<String, String>,
}

impl Fleet {
    /// Starts a round deploying `latest` to `instances`.
    fn start_round(
        &mut self,
        ctx: &Context,
        latest: &Latest,
        instances: &[String],
        drift_check: bool,
    ) {
        let round = self.next_round;
        self.next_round += 1;
        let hash = latest.config.hash();
        let mut pending = BTreeSet::new();
        let mut failed = Vec::new();
        for name in instances {
            match self.workers.get(name) {
                Some(worker) => {
                    worker.send(Desired {
                        config: latest.config.clone(),
                        model: latest.model.clone(),
                        cause: latest.cause.clone(),
                        drift_check,
                        round,
                    });
                    pending.insert(name.clone());
                }
                None => {
                    let error = hapwright_eventbus::model::Diagnostic::error(
                        self.refused.get(name).cloned().unwrap_or_else(|| {
                            format!("instance `{name}` has no driver in this deployer")
                        }),
                    );
                    ctx.publisher().reply(
                        &latest.cause,
                        hapwright_eventbus::InstanceDeploymentFailed {
                            instance: name.clone(),
                            hash,
                            error,
                        },
                    );
                    failed.push(name.clone());
                }
            }
        }
        let span = tracing::info_span!(
            "deployment",
            correlation_id = latest.cause.correlation_id.map(tracing::field::display),
            hash = %hash.short(),
        );
        span.in_scope(|| {
            tracing::info!(
                instances = instances.len(),
                drift_check,
                "Deployment started"
            );
        });
        ctx.publisher().reply(
            &latest.cause,
            DeploymentStarted {
                hash,
                instances: instances.to_vec(),
            },
        );
        self.rounds.insert(
            round,
            Round {
                cause: latest.cause.clone(),
                hash,
                started: Instant::now(),
                pending,
                succeeded: Vec::new(),
                failed,
            },
        );
        self.complete_rounds(ctx);
    }

    fn on_report(&mut self, ctx: &Context, report: Report) {
        if let Some(round) = report.round.and_then(|r| self.rounds.get_mut(&r))
            && round.pending.remove(&report.instance)
        {
            match report.outcome {
                Outcome::Deployed => round.succeeded.push(report.instance),
                Outcome::Failed => round.failed.push(report.instance),
                Outcome::Superseded => {}
            }
        }
        self.complete_rounds(ctx);
        self.report_health(ctx);
    }

    /// Publishes `DeploymentCompleted` for every round with no instance pending.
    fn complete_rounds(&mut self, ctx: &Context) {
        let done: Vec<u64> = self
            .rounds
            .iter()
            .filter(|(_, round)| round.pending.is_empty())
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            let Some(mut round) = self.rounds.remove(&id) else {
                continue;
            };
            round.succeeded.sort();
            round.failed.sort();
            ctx.publisher().reply(
                &round.cause,
                DeploymentCompleted {
                    summary: DeploymentSummary {
                        hash: round.hash,
                        succeeded: round.succeeded,
                        failed: round.failed,
                        duration: round.started.elapsed(),
                    },
                },
            );
        }
    }

    /// The instances a scheduled config goes to: those it names (the static ones)
    /// and every instance discovered now, this deployer being the one owner of
    /// fleet membership.
    fn targets(&self, named: &[String]) -> Vec<String> {
        let mut targets: BTreeSet<String> = named.iter().cloned().collect();
        targets.extend(self.discovered.values().flatten().cloned());
        targets.into_iter().collect()
    }

    /// Instances of the fleet whose last attempt failed, from the snapshots their
    /// workers publish.
    fn failing(&self) -> Vec<&str> {
        self.workers
            .keys()
            .filter(|name| {
                self.shared
                    .store
                    .get(name)
                    .is_some_and(|record| record.last_error.is_some())
            })
            .map(String::as_str)
            .collect()
    }

    fn report_health(&self, ctx: &Context) {
        let failing = self.failing();
        if failing.is_empty() {
            ctx.health().healthy();
        } else {
            ctx.health()
                .unhealthy(format!("deployment failed on {}", failing.join(", ")));
        }
    }

    /// Waits until the worker of a removed instance called `name` is gone (it
    /// cleared its record and metric series), so that a new one starts clean.
    async fn stopped(&mut self, name: &str) {
        if let Some(stopping) = self.stopping.remove(name) {
            let _ = stopping.await;
        }
    }

    fn add(&mut self, driver: Arc<dyn Driver>) {
        let name = driver.name().to_owned();
        self.shared.metrics.instance_known(&name);
        let handle = Handle::spawn(driver, self.shared.clone(), &self.cancel);
        self.workers.insert(name, handle);
    }

    /// Forgets an instance: removes its worker (which clears its record and metric
    /// series once its attempt in flight ended) and takes it out of the rounds
    /// waiting for it. The worker stops in the background; [`Fleet::stopped`] waits
    /// for it before an instance of the same name is added again.
    fn remove(&mut self, ctx: &Context, name: &str) {
        self.stopping.retain(|_, stopping| !stopping.is_finished());
        if let Some(worker) = self.workers.remove(name) {
            self.stopping.insert(
                name.to_owned(),
                tokio::spawn(worker.remove(Duration::from_secs(5))),
            );
        }
        if let Some(versions) = &self.shared.versions {
            versions.forget_instance(name);
        }
        for round in self.rounds.values_mut() {
            round.pending.remove(name);
        }
        self.complete_rounds(ctx);
    }

    /// Applies one `InstancesDiscovered`: workers for new instances, forgets the
    /// vanished ones. Returns the names added and the names newly refused (each
    /// refusal is logged and counted once, until the instance or its reason changes).
    async fn discovered(
        &mut self,
        ctx: &Context,
        source: &Arc<str>,
        instances: &[InstanceRef],
    ) -> (Vec<String>, Vec<String>) {
        let now: BTreeSet<String> = instances.iter().map(|i| i.name.clone()).collect();
        let before = self
            .discovered
            .insert(source.clone(), now.clone())
            .unwrap_or_default();
        let mut added = Vec::new();
        let mut refused = Vec::new();
        for instance in instances {
            if self.static_names.contains(&instance.name) {
                tracing::warn!(instance = %instance.name, %source, "A discovered instance has the name of a static one; keeping the static one");
                continue;
            }
            if self.workers.contains_key(&instance.name) {
                // Known already, from this source or another.
                continue;
            }
            let Some(credentials) = self.credentials.clone() else {
                tracing::warn!(instance = %instance.name, %source, "Discovered an instance, but no discovery credentials are configured");
                continue;
            };
            self.stopped(&instance.name).await;
            match credentials.driver(instance, &self.shared.metrics) {
                Ok(driver) => {
                    tracing::info!(instance = %instance.name, address = %instance.address, %source, "Instance discovered");
                    self.refused.remove(&instance.name);
                    self.shared.metrics.out_of_sync(&instance.name);
                    self.add(driver);
                    added.push(instance.name.clone());
                }
                Err(error) => {
                    let reason = error.reason();
                    let error =
                        std::iter::successors(Some(&error as &dyn std::error::Error), |e| {
                            e.source()
                        })
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(": ");
                    if self.refused.get(&instance.name) != Some(&error) {
                        tracing::warn!(instance = %instance.name, %source, %error, "Discovered instance refused; nothing is sent to it");
                        self.shared.metrics.refused(reason);
                        self.refused.insert(instance.name.clone(), error);
                        refused.push(instance.name.clone());
                    }
                }
            }
        }
        for name in before.difference(&now) {
            let elsewhere = self.static_names.contains(name)
                || self
                    .discovered
                    .iter()
                    .any(|(other, names)| other != source && names.contains(name));
            if elsewhere {
                continue;
            }
            tracing::info!(instance = %name, %source, "Instance gone; forgetting it");
            self.refused.remove(name);
            self.remove(ctx, name);
        }
        (added, refused)
    }

    async fn stop(self) {
        self.cancel.cancel();
        for (_, worker) in self.workers {
            worker.stop(Duration::from_secs(5)).await;
        }
        for (_, stopping) in self.stopping {
            let _ = stopping.await;
        }
    }
}

fn latest_of(event: &Arc<Event>) -> Option<(Latest, Vec<String>, bool)> {
    let EventPayload::DeploymentScheduled(scheduled) = &event.payload else {
        return None;
    };
    Some((
        Latest {
            config: scheduled.config.clone(),
            model: scheduled.model.clone(),
            cause: event.clone(),
        },
        scheduled.instances.clone(),
        scheduled.drift_check,
    ))
}

#[async_trait::async_trait]
impl Component for Deployer {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([
            EventKind::DeploymentScheduled,
            EventKind::InstancesDiscovered,
        ])
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        let managed_names: Vec<String> = self
            .drivers
            .values()
            .filter(|d| d.managed_socket().is_some())
            .map(|d| d.name().to_owned())
            .collect();
        let managed = self.managed.clone();
        let mut leader = self.leader.clone();
        let (reports, mut report_rx) = mpsc::unbounded_channel();
        let mut fleet = Fleet {
            shared: instance::Shared {
                settings: self.config.instance_settings(),
                store: self.store,
                metrics: self.metrics,
                publisher: ctx.publisher().clone(),
                managed: self.managed,
                leader: self.leader,
                reports,
                permits: Arc::new(Semaphore::new(self.config.concurrency.max(1))),
                versions: self.versions,
            },
            cancel: ctx.cancellation_token().child_token(),
            workers: BTreeMap::new(),
            static_names: self.drivers.keys().cloned().collect(),
            discovered: BTreeMap::new(),
            credentials: self.credentials,
            rounds: BTreeMap::new(),
            next_round: 0,
            stopping: BTreeMap::new(),
            refused: BTreeMap::new(),
        };
        if let Some(credentials) = &fleet.credentials {
            credentials.warn_if_insecure();
        }
        for driver in self.drivers.into_values() {
            fleet.add(driver);
        }
        // The latest scheduled config: what the instances should run.
        let mut last: Option<(Latest, Vec<String>)> = None;
        let mut is_leader = leader.as_ref().is_none_or(|l| *l.borrow());
        let mut health_tick = tokio::time::interval(Duration::from_secs(1));
        health_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ctx.health().healthy();
        loop {
            tokio::select! {
                biased;
                // Events first: a config scheduled before a takeover is the one it
                // deploys. `None`: the deployer should stop.
                event = ctx.next_event() => {
                    let Some(event) = event else { break };
                    match &event.payload {
                        EventPayload::DeploymentScheduled(_) => {
                            let Some((latest, instances, drift_check)) = latest_of(&event) else {
                                continue;
                            };
                            last = Some((latest.clone(), instances.clone()));
                            if !is_leader {
                                tracing::debug!(hash = %latest.config.hash().short(), "Not the leader; keeping the config for when this replica leads");
                                continue;
                            }
                            let targets = fleet.targets(&instances);
                            fleet.start_round(&ctx, &latest, &targets, drift_check);
                        }
                        EventPayload::InstancesDiscovered(discovered) => {
                            let (mut added, refused) = fleet.discovered(&ctx, &discovered.source, &discovered.instances).await;
                            // A new instance gets the last good config at once; a
                            // refused one fails in that round with its reason, so the
                            // refusal shows on the instance. The others run what they
                            // ran: no round, no change to their state.
                            added.extend(refused);
                            if let Some((latest, _)) = &last
                                && is_leader
                                && !added.is_empty()
                            {
                                fleet.start_round(&ctx, latest, &added, false);
                            }
                        }
                        _ => {}
                    }
                }
                became = leadership_changed(&mut leader) => {
                    let was = is_leader;
                    is_leader = became;
                    if was || !is_leader {
                        continue;
                    }
                    tracing::info!("Leadership acquired; deploying the latest config");
                    if let Some((latest, instances)) = &last {
                        let targets = fleet.targets(instances);
                        fleet.start_round(&ctx, latest, &targets, true);
                    }
                }
                Some(report) = report_rx.recv() => {
                    fleet.on_report(&ctx, report);
                }
                _ = health_tick.tick(), if !managed_names.is_empty() => {
                    if let Some(managed) = &managed {
                        report_managed_health(&ctx, managed, &managed_names, fleet.failing().is_empty()).await;
                    }
                }
            }
        }
        fleet.stop().await;
        Ok(())
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
/// no instance's last deployment failed.
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
            down.push(format!("{name}: {state}"));
        }
    }
    if !down.is_empty() {
        ctx.health()
            .unhealthy(format!("managed HAProxy not running ({})", down.join("; ")));
    } else if deployments_ok {
        ctx.health().healthy();
    }
}
