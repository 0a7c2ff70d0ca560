//! What the controller knows about itself, for `/debug/*`, `/readyz`, the status page
//! and the reconciliation metrics.
//!
//! A [`StatusStore`] lives for the whole process (it outlives reinit iterations). Two
//! components feed it from the bus of each iteration:
//!
//! - [`StatusRecorder`], a pipeline subscriber (it never loses an event, so the
//!   metrics it derives are exact): reconciliations with per-stage timings, instance
//!   deployment state, the last render and validation errors, the latest resource
//!   snapshots, and the `hapwright_reconciliations_total`,
//!   `hapwright_reconciliation_duration_seconds` and `hapwright_render_duration_seconds`
//!   metrics;
//! - [`EventLog`], an observer: the ring of recent events behind `/debug/events`. It
//!   may lose events under overload; the bus counts every loss.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime};

use hapwright_eventbus::model::{
    ContentHash, DeployReason, DeployStrategy, Diagnostic, RenderedConfig, ResourceSnapshot,
};
use hapwright_eventbus::{
    Component, ComponentError, Context, CorrelationId, DeploymentCompleted, Event, EventPayload,
    HealthState, HealthTable, InstanceDeployed, InstanceDeploymentFailed, InstancesDiscovered,
    Interest, KindSet, QuarantineSearched, QuarantinedObject, ReconciliationCompleted,
    ReconciliationFailed, ReconciliationStarted, ResourceIndexUpdated, SafetyRemoval,
    SafetyValveHeld, SafetyValveReleased, Stage, TemplateRendered, ValidationPhase,
};

use crate::config::TemplatePlaces;
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use serde::Serialize;

/// How many recent events `/debug/events` can show.
pub const EVENT_RING: usize = 1000;
/// How many recent reconciliations the status page shows.
pub const RECONCILIATION_RING: usize = 50;

/// A change the safety valve holds, as `/debug/safety` and the status page show it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SafetyHold {
    /// Hash of the held config.
    pub hash: ContentHash,
    /// What it would remove.
    pub removal: SafetyRemoval,
    /// The same as one sentence (`would remove 2 of 3 backends (67%)`).
    pub summary: String,
    /// `controller.safety.maxRemoval` as configured.
    pub max_removal: String,
    /// Since when (seconds since the Unix epoch).
    pub since: f64,
    /// When it goes out by itself if the drop persists (seconds since the Unix epoch).
    pub release_at: f64,
}

/// How the last hold of the safety valve ended.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SafetyRelease {
    /// The config that went out.
    pub hash: ContentHash,
    /// `confirmed`, `approved`, `recovered` or `disabled`.
    pub reason: &'static str,
    /// When (seconds since the Unix epoch).
    pub at: f64,
}

/// One reconciliation as the status page shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ReconciliationRecord {
    /// Its correlation id.
    pub correlation_id: CorrelationId,
    /// The id of its OpenTelemetry trace (derived from the correlation id; exported
    /// when `controller.tracing` is on and the reconciliation was sampled).
    pub trace_id: String,
    /// Why it ran.
    pub reason: String,
    /// When it started (seconds since the Unix epoch).
    pub started: f64,
    /// `running`, `success` or `failure`.
    pub result: &'static str,
    /// Total seconds, once finished.
    pub duration: Option<f64>,
    /// Seconds per stage: `render` and `validate` when it completes, then
    /// `schedule` (validated until the scheduler lets the deployment go) and `deploy`
    /// (until every instance has answered), which come later.
    pub stages: BTreeMap<&'static str, f64>,
    /// How the templates rendered: `incremental` (only the files that read what
    /// changed), or `full, because ...`.
    pub render_mode: Option<String>,
    /// The stage that failed.
    pub failed_stage: Option<Stage>,
    /// Errors of a failed reconciliation.
    pub errors: Vec<Diagnostic>,
    /// When the last stage so far ended (seconds since the Unix epoch), to time the
    /// next one.
    #[serde(skip)]
    last_stage_end: Option<f64>,
}

/// Deployment state of one instance.
#[derive(Clone, Debug, Default, Serialize)]
pub struct InstanceStatus {
    /// Instance name.
    pub name: String,
    /// `pending` before the first deployment attempt to it finished, `deployed` when
    /// the last attempt succeeded, `failing` when it failed; so every configured
    /// instance shows up from the start, not only after its first deployment.
    pub state: &'static str,
    /// Hash of the config it runs, as far as hapwright knows.
    pub last_hash: Option<ContentHash>,
    /// Strategy of the last deployment.
    pub last_strategy: Option<DeployStrategy>,
    /// Reason for that strategy.
    pub last_reason: Option<DeployReason>,
    /// Reloads hapwright performed on it.
    pub reloads: u64,
    /// Deployments that succeeded.
    pub deployments: u64,
    /// The last error, cleared by the next success.
    pub last_error: Option<Diagnostic>,
    /// When it last took a config (seconds since the Unix epoch).
    pub last_success: Option<f64>,
    /// Its HAProxy version and the validator's, once read (`haproxy_version`,
    /// `validator_version`, `haproxy_line_mismatch`).
    #[serde(flatten)]
    pub haproxy: Option<hapwright_deployer::version_check::InstanceVersion>,
}

/// The last configuration problem found in the controller's own config file.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ConfigStatus {
    /// Path of the config file.
    pub path: String,
    /// Whether the last (re)load attempt succeeded.
    pub last_reload_successful: bool,
    /// Errors of the last failed attempt.
    pub errors: Vec<Diagnostic>,
    /// The effective config with secrets redacted.
    pub effective: serde_json::Value,
}

/// The last failed render or validation, with its errors mapped to template lines.
#[derive(Clone, Debug, Serialize)]
pub struct PipelineError {
    /// `render`, or the validation phase (`parse`, `haproxy`).
    pub stage: String,
    /// The errors.
    pub errors: Vec<Diagnostic>,
    /// When (seconds since the Unix epoch).
    pub at: f64,
}

/// The outcome of the last deployment attempt to one instance, for `/readyz`.
#[derive(Clone, Debug)]
enum Attempt {
    Succeeded,
    Failed { error: String, at: f64 },
}

/// An instance whose last deployment attempt failed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FailingInstance {
    /// Instance name.
    pub instance: String,
    /// What went wrong.
    pub error: String,
    /// When the attempt failed (seconds since the Unix epoch).
    pub since: f64,
}

/// Whether the controller is doing its job: `/readyz`.
///
/// Ready means serving: every watched resource of the running config finished its
/// first sync (so the webhook answers from complete data) and some instance took a
/// config hapwright deployed. Once reached it stays, for the life of the process: a
/// later failed deployment leaves the instance serving its last good config, which
/// the metrics, `/debug/instances` and the status page show, and taking every pod out
/// of its Service for it would turn one bad change into an outage.
#[derive(Clone, Debug, PartialEq)]
pub enum Readiness {
    /// Serving. `failing` names the known instances whose last deployment attempt
    /// failed: they serve their last good config.
    Ready {
        /// Known instances whose last deployment attempt failed.
        failing: Vec<FailingInstance>,
    },
    /// Not serving yet, with the reason and the instances whose last attempt failed.
    NotReady {
        /// Why, in one sentence.
        reason: String,
        /// Known instances whose last deployment attempt failed.
        failing: Vec<FailingInstance>,
    },
}

impl Readiness {
    /// Whether this is [`Readiness::Ready`].
    pub fn is_ready(&self) -> bool {
        matches!(self, Readiness::Ready { .. })
    }

    /// The known instances whose last deployment attempt failed.
    pub fn failing(&self) -> &[FailingInstance] {
        match self {
            Readiness::Ready { failing } | Readiness::NotReady { failing, .. } => failing,
        }
    }
}

/// A mandatory component that has been down longer than the liveness grace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeadComponent {
    /// Component name.
    pub component: String,
    /// `exited` or `unhealthy`.
    pub state: HealthState,
    /// The reason it gave (or the kernel gave for its exit).
    pub reason: Option<String>,
    /// Since when it has been down, counting from the first failure of a run of quick
    /// restarts (seconds since the Unix epoch).
    pub since: f64,
}

/// Whether the process still works: `/healthz`.
#[derive(Clone, Debug, PartialEq)]
pub enum Liveness {
    /// Every mandatory component runs (or has been down for less than the grace).
    Live,
    /// Mandatory components down longer than the grace, longest first.
    NotLive(Vec<DeadComponent>),
}

/// A mandatory component that failed and has not yet run long enough since to count
/// as recovered: its restarts are one outage for liveness.
#[derive(Clone, Debug)]
struct RestartStreak {
    component: String,
    since: SystemTime,
}

/// Default of `controller.livenessGrace`.
pub const DEFAULT_LIVENESS_GRACE: Duration = Duration::from_secs(300);

#[derive(Default)]
struct Inner {
    events: VecDeque<Arc<Event>>,
    reconciliations: VecDeque<ReconciliationRecord>,
    instances: BTreeMap<String, InstanceStatus>,
    last_error: Option<PipelineError>,
    rendered: Option<Arc<RenderedConfig>>,
    resources: BTreeMap<Arc<str>, Arc<ResourceSnapshot>>,
    config: ConfigStatus,
    health: HealthTable,
    /// Some deployment succeeded on some instance since the process started.
    deployed_once: bool,
    /// When readiness was first reached (seconds since the Unix epoch); it stays.
    ready_since: Option<f64>,
    /// Some render passed validation since the process started.
    validated_once: bool,
    /// Whether this replica leads (`None`: no leader election, it always deploys).
    leader: Option<tokio::sync::watch::Receiver<bool>>,
    /// Last deployment attempt per instance.
    attempts: BTreeMap<String, Attempt>,
    /// Instance names per discovery source (`InstancesDiscovered`).
    discovered: BTreeMap<Arc<str>, BTreeSet<String>>,
    /// Instances of the running config (`haproxy.instances`); `None` until set.
    static_instances: Option<BTreeSet<String>>,
    /// Where the running config's inline templates are, to name the config file
    /// line in render and validation errors.
    template_places: Arc<crate::config::TemplatePlaces>,
    /// Watched resources of the running config; `None` until set.
    watched: Option<BTreeSet<String>>,
    /// Watched resources that completed their first sync (`ResourceSyncComplete`).
    synced: BTreeSet<String>,
    /// `controller.livenessGrace`; `None` means the default.
    liveness_grace: Option<Duration>,
    restart_streak: Option<RestartStreak>,
    /// The objects quarantined now (from the latest `QuarantineSearched`).
    quarantine: Vec<QuarantinedObject>,
    /// The change the safety valve holds now.
    safety_hold: Option<SafetyHold>,
    /// How the last hold ended.
    safety_release: Option<SafetyRelease>,
    /// The latest statuses rendered by `statusTemplates`.
    statuses: Option<RenderedStatuses>,
    /// The instances' HAProxy versions against the validator's.
    versions: Option<hapwright_deployer::version_check::VersionCheck>,
}

/// The latest statuses rendered by `statusTemplates`, as `/debug/status` shows them.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RenderedStatuses {
    /// Hash of the deployed render they come from.
    pub hash: ContentHash,
    /// When they were rendered (seconds since the Unix epoch).
    pub at: f64,
    /// Every non-empty status, with `current` telling whether the object shows it.
    pub statuses: Arc<[hapwright_eventbus::RenderedStatus]>,
    /// Template errors, one per failing object.
    pub errors: Vec<Diagnostic>,
}

impl Inner {
    /// Whether an instance still belongs to the fleet: one of the configured ones or
    /// currently discovered (every instance counts before the config says which).
    fn knows(&self, instance: &str) -> bool {
        self.static_instances
            .as_ref()
            .is_none_or(|names| names.contains(instance))
            || self
                .discovered
                .values()
                .any(|names| names.contains(instance))
    }

    /// Watched resources of the running config that have not finished their first
    /// sync, in name order.
    fn unsynced(&self) -> Vec<&str> {
        self.watched
            .iter()
            .flatten()
            .filter(|name| !self.synced.contains(*name))
            .map(String::as_str)
            .collect()
    }

    /// A standby replica (leader election on, not the leader): it deploys nothing,
    /// so it is ready once its config validates.
    fn standby(&self) -> bool {
        self.leader.as_ref().is_some_and(|leader| !*leader.borrow())
    }

    /// Whether readiness is reached now: every watched resource synced, and some
    /// deployment succeeded (a standby replica: some render validated).
    fn reaches_readiness(&self) -> bool {
        self.unsynced().is_empty()
            && (self.deployed_once || (self.standby() && self.validated_once))
    }

    /// Records the moment readiness is first reached. Never undone.
    fn settle_readiness(&mut self, now: f64) {
        if self.ready_since.is_none() && self.reaches_readiness() {
            self.ready_since = Some(now);
        }
    }
}

/// Process-wide status, shared by the HTTP server and the recorders.
#[derive(Clone, Default)]
pub struct StatusStore {
    inner: Arc<RwLock<Inner>>,
}

impl std::fmt::Debug for StatusStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StatusStore")
    }
}

fn unix_now() -> f64 {
    unix_seconds(SystemTime::now())
}

fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl StatusStore {
    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The latest statuses rendered by `statusTemplates` (`/debug/status`).
    pub fn statuses(&self) -> Option<RenderedStatuses> {
        self.read().statuses.clone()
    }

    /// The objects quarantined now, with their errors (`/debug/quarantine`).
    pub fn quarantine(&self) -> Vec<QuarantinedObject> {
        self.read().quarantine.clone()
    }

    /// The change the safety valve holds now (`/debug/safety`, `POST /-/approve`).
    pub fn safety_hold(&self) -> Option<SafetyHold> {
        self.read().safety_hold.clone()
    }

    /// How the last hold of the safety valve ended.
    pub fn safety_release(&self) -> Option<SafetyRelease> {
        self.read().safety_release.clone()
    }

    /// Points the store at the health table of the running kernel iteration.
    pub fn set_health(&self, health: HealthTable) {
        self.write().health = health;
    }

    /// The health table of the running iteration.
    pub fn health(&self) -> HealthTable {
        self.read().health.clone()
    }

    /// Records the outcome of a config (re)load.
    pub fn set_config(&self, config: ConfigStatus) {
        self.write().config = config;
    }

    /// Records a rejected config, keeping the effective (running) one.
    pub fn config_rejected(&self, errors: Vec<Diagnostic>) {
        let mut inner = self.write();
        inner.config.last_reload_successful = false;
        inner.config.errors = errors;
    }

    /// The config status.
    pub fn config(&self) -> ConfigStatus {
        self.read().config.clone()
    }

    /// Whether the controller is ready (see [`readiness`](Self::readiness)).
    pub fn ready(&self) -> bool {
        self.readiness().is_ready()
    }

    /// Ready once every watched resource of the running config has synced and some
    /// deployment has succeeded; from then on for the life of the process (see
    /// [`Readiness`]). Derived only from events, so it does not depend on how the
    /// deployer organizes its work.
    pub fn readiness(&self) -> Readiness {
        {
            // A standby replica's leadership changes without an event.
            let inner = self.read();
            if inner.ready_since.is_none() && inner.reaches_readiness() {
                drop(inner);
                self.write().settle_readiness(unix_now());
            }
        }
        let inner = self.read();
        let failing: Vec<FailingInstance> = inner
            .attempts
            .iter()
            .filter(|(name, _)| inner.knows(name))
            .filter_map(|(name, attempt)| match attempt {
                Attempt::Succeeded => None,
                Attempt::Failed { error, at } => Some(FailingInstance {
                    instance: name.clone(),
                    error: error.clone(),
                    since: *at,
                }),
            })
            .collect();
        if inner.ready_since.is_some() {
            return Readiness::Ready { failing };
        }
        let unsynced = inner.unsynced();
        let reason = if !unsynced.is_empty() {
            format!(
                "waiting for the first sync of watched resource{} {}",
                if unsynced.len() == 1 { "" } else { "s" },
                unsynced.join(", ")
            )
        } else if inner.standby() {
            "standby replica: no render has passed validation yet".to_owned()
        } else if failing.is_empty() {
            "no deployment has succeeded on any instance yet".to_owned()
        } else {
            let names: Vec<&str> = failing.iter().map(|f| f.instance.as_str()).collect();
            format!(
                "no deployment has succeeded on any instance yet (failing: {})",
                names.join(", ")
            )
        };
        Readiness::NotReady { reason, failing }
    }

    /// When readiness was first reached (seconds since the Unix epoch).
    pub fn ready_since(&self) -> Option<f64> {
        self.read().ready_since
    }

    /// Gives the store this replica's leadership (leader election on): a standby
    /// replica deploys nothing, so it is ready once its sources synced and a render
    /// validated (it answers admission reviews and is ready to take over).
    pub fn set_leadership(&self, leader: tokio::sync::watch::Receiver<bool>) {
        self.write().leader = Some(leader);
    }

    /// Sets the instances of the running config, so instances removed from it no
    /// longer count for readiness.
    pub fn set_static_instances(&self, names: impl IntoIterator<Item = String>) {
        self.write().static_instances = Some(names.into_iter().collect());
    }

    /// Sets `controller.livenessGrace` (`0` turns the liveness check off).
    pub fn set_liveness_grace(&self, grace: Duration) {
        self.write().liveness_grace = Some(grace);
    }

    /// Records that a mandatory component failed and the iteration is being
    /// restarted. The first failure of a run of restarts is kept, so a component
    /// that fails again right after each restart is judged by how long it has been
    /// failing in all, not since its last restart.
    pub fn component_failed(&self, component: &str) {
        let mut inner = self.write();
        if inner
            .restart_streak
            .as_ref()
            .is_none_or(|streak| streak.component != component)
        {
            inner.restart_streak = Some(RestartStreak {
                component: component.to_owned(),
                since: SystemTime::now(),
            });
        }
    }

    /// The restarted components ran long enough to count as recovered.
    pub fn components_recovered(&self) {
        self.write().restart_streak = None;
    }

    /// Liveness now (see [`liveness_at`](Self::liveness_at)).
    pub fn liveness(&self) -> Liveness {
        self.liveness_at(SystemTime::now())
    }

    /// Not live when a mandatory component of the running iteration has been
    /// `Exited` or `Unhealthy` for at least `controller.livenessGrace` at `now`.
    pub fn liveness_at(&self, now: SystemTime) -> Liveness {
        let inner = self.read();
        let grace = inner.liveness_grace.unwrap_or(DEFAULT_LIVENESS_GRACE);
        if grace.is_zero() {
            return Liveness::Live;
        }
        let mut dead: Vec<(SystemTime, DeadComponent)> = inner
            .health
            .mandatory()
            .into_iter()
            .filter(|(_, health)| {
                matches!(health.state, HealthState::Exited | HealthState::Unhealthy)
            })
            .filter_map(|(name, health)| {
                let since = match &inner.restart_streak {
                    Some(streak) if streak.component == name.as_ref() => {
                        streak.since.min(health.since)
                    }
                    _ => health.since,
                };
                let down_for = now.duration_since(since).unwrap_or_default();
                (down_for >= grace).then(|| {
                    (
                        since,
                        DeadComponent {
                            component: name.to_string(),
                            state: health.state,
                            reason: health.reason,
                            since: unix_seconds(since),
                        },
                    )
                })
            })
            .collect();
        if dead.is_empty() {
            return Liveness::Live;
        }
        dead.sort_by_key(|(since, _)| *since);
        Liveness::NotLive(dead.into_iter().map(|(_, d)| d).collect())
    }

    /// The liveness grace in effect.
    pub fn liveness_grace(&self) -> Duration {
        self.read().liveness_grace.unwrap_or(DEFAULT_LIVENESS_GRACE)
    }

    /// Recent events, newest last, optionally only one correlation.
    pub fn events(&self, limit: usize, correlation: Option<CorrelationId>) -> Vec<Arc<Event>> {
        let inner = self.read();
        let mut picked: Vec<Arc<Event>> = inner
            .events
            .iter()
            .rev()
            .filter(|e| correlation.is_none() || e.correlation_id == correlation)
            .take(limit)
            .cloned()
            .collect();
        picked.reverse();
        picked
    }

    /// Recent reconciliations, newest first.
    pub fn reconciliations(&self) -> Vec<ReconciliationRecord> {
        self.read().reconciliations.iter().rev().cloned().collect()
    }

    /// Per-instance deployment state: every instance of the running config and every
    /// discovered one, with those not deployed to yet as `pending`.
    pub fn instances(&self) -> Vec<InstanceStatus> {
        let inner = self.read();
        let mut all = inner.instances.clone();
        let known = inner
            .static_instances
            .iter()
            .flatten()
            .chain(inner.discovered.values().flatten());
        for name in known {
            all.entry(name.clone()).or_insert_with(|| InstanceStatus {
                name: name.clone(),
                ..InstanceStatus::default()
            });
        }
        all.into_values()
            .map(|mut status| {
                status.haproxy = inner
                    .versions
                    .as_ref()
                    .and_then(|versions| versions.instance(&status.name));
                status.state = if status.last_error.is_some() {
                    "failing"
                } else if status.deployments > 0 {
                    "deployed"
                } else {
                    "pending"
                };
                status
            })
            .collect()
    }

    /// Sets where the instances' HAProxy versions come from (`/debug/instances`).
    pub fn set_version_check(&self, versions: hapwright_deployer::version_check::VersionCheck) {
        self.write().versions = Some(versions);
    }

    /// Sets where the running config's inline templates are written, so render and
    /// validation errors on the status page and `/debug/*` also name the config file
    /// line.
    pub fn set_template_places(&self, places: crate::config::TemplatePlaces) {
        self.write().template_places = Arc::new(places);
    }

    /// Sets the watched resources of the running config, so `/debug/resources/<name>`
    /// answers for them before their first sync.
    pub fn set_watched_resources(&self, names: impl IntoIterator<Item = String>) {
        let mut inner = self.write();
        inner.watched = Some(names.into_iter().collect());
        inner.settle_readiness(unix_now());
    }

    /// Whether `name` is a watched resource of the running config (any name counts
    /// before the config says which).
    pub fn is_watched(&self, name: &str) -> bool {
        self.read()
            .watched
            .as_ref()
            .is_some_and(|names| names.contains(name))
    }

    /// Whether the watched resource `name` has completed its first sync.
    pub fn is_synced(&self, name: &str) -> bool {
        self.read().synced.contains(name)
    }

    /// The last render or validation failure, until a later render validates.
    pub fn last_error(&self) -> Option<PipelineError> {
        self.read().last_error.clone()
    }

    /// The last rendered config.
    pub fn rendered(&self) -> Option<Arc<RenderedConfig>> {
        self.read().rendered.clone()
    }

    /// The latest snapshot of a watched resource.
    pub fn resources(&self, name: &str) -> Option<Arc<ResourceSnapshot>> {
        self.read().resources.get(name).cloned()
    }

    /// Names of the watched resources: those of the running config and those seen
    /// so far.
    pub fn resource_names(&self) -> Vec<String> {
        let inner = self.read();
        let names: BTreeSet<String> = inner
            .resources
            .keys()
            .map(|k| k.to_string())
            .chain(inner.watched.iter().flatten().cloned())
            .collect();
        names.into_iter().collect()
    }

    pub(crate) fn remember_event(&self, event: Arc<Event>) {
        let mut inner = self.write();
        if inner.events.len() == EVENT_RING {
            inner.events.pop_front();
        }
        inner.events.push_back(event);
    }

    /// Applies one pipeline event to the status (and the metrics, when given).
    pub(crate) fn apply(&self, event: &Event, metrics: Option<&StatusMetrics>) {
        let mut inner = self.write();
        let places = inner.template_places.clone();
        match &event.payload {
            EventPayload::ResourceIndexUpdated(update) => inner.index_updated(update, metrics),
            EventPayload::ReconciliationStarted(started) => {
                inner.reconciliation_started(event, started)
            }
            EventPayload::DeploymentScheduled(_) => inner.deployment_scheduled(event),
            EventPayload::ReconciliationCompleted(done) => {
                inner.reconciliation_completed(event, done, metrics)
            }
            EventPayload::ReconciliationFailed(failed) => {
                inner.reconciliation_failed(event, failed, &places, metrics)
            }
            EventPayload::TemplateRendered(rendered) => {
                inner.template_rendered(event, rendered, metrics)
            }
            EventPayload::TemplateRenderFailed(failed) => {
                inner.last_error = Some(PipelineError {
                    stage: "render".to_owned(),
                    errors: places.locate(failed.errors.clone()),
                    at: unix_now(),
                });
            }
            EventPayload::ValidationFailed(failed) => {
                inner.last_error = Some(PipelineError {
                    stage: match failed.phase {
                        ValidationPhase::Parse => "validation (phase 1: parser)",
                        ValidationPhase::Haproxy => "validation (phase 2: haproxy -c)",
                    }
                    .to_owned(),
                    errors: places.locate(failed.errors.clone()),
                    at: unix_now(),
                });
            }
            EventPayload::ValidationCompleted(_) => {
                inner.last_error = None;
                inner.validated_once = true;
            }
            EventPayload::StatusRendered(rendered) => {
                inner.statuses = Some(RenderedStatuses {
                    hash: rendered.hash,
                    at: unix_now(),
                    statuses: rendered.statuses.clone(),
                    errors: places.locate(rendered.errors.clone()),
                });
            }
            EventPayload::QuarantineSearched(searched) => {
                inner.quarantine_searched(searched, &places, metrics)
            }
            EventPayload::SafetyValveHeld(held) => inner.valve_held(held, metrics),
            EventPayload::SafetyValveReleased(released) => {
                inner.valve_released(event, released, metrics)
            }
            EventPayload::ResourceSyncComplete(sync) => {
                inner.synced.insert(sync.source.to_string());
            }
            EventPayload::InstanceDeployed(deployed) => inner.instance_deployed(event, deployed),
            EventPayload::InstanceDeploymentFailed(failed) => inner.instance_failed(event, failed),
            EventPayload::DeploymentCompleted(completed) => {
                inner.deployment_completed(event, completed)
            }
            EventPayload::InstancesDiscovered(discovered) => inner.instances_discovered(discovered),
            _ => {}
        }
        inner.settle_readiness(event.unix_micros as f64 / 1e6);
    }
}

fn stage_name(stage: Stage) -> &'static str {
    match stage {
        Stage::Render => "render",
        Stage::Validate => "validate",
    }
}

// === what each event changes ===

impl Inner {
    /// A source's objects: kept for the status page, counted in the metrics.
    fn index_updated(&mut self, update: &ResourceIndexUpdated, metrics: Option<&StatusMetrics>) {
        if let Some(metrics) = metrics {
            let objects = update.snapshot.len() as i64;
            metrics
                .watched_objects
                .with_label_values(&[update.source.as_ref()])
                .set(objects);
            metrics
                .resources
                .with_label_values(&[update.source.as_ref()])
                .set(objects);
        }
        self.resources
            .insert(update.source.clone(), update.snapshot.clone());
    }

    /// A reconciliation begins: a new record in the ring.
    fn reconciliation_started(&mut self, event: &Event, started: &ReconciliationStarted) {
        if self.reconciliations.len() == RECONCILIATION_RING {
            self.reconciliations.pop_front();
        }
        let correlation_id = event.correlation_id.unwrap_or_default();
        self.reconciliations.push_back(ReconciliationRecord {
            correlation_id,
            trace_id: correlation_id.trace_id_hex(),
            reason: started.reason.clone(),
            started: event.unix_micros as f64 / 1e6,
            result: "running",
            duration: None,
            stages: BTreeMap::new(),
            render_mode: None,
            failed_stage: None,
            errors: Vec::new(),
            last_stage_end: None,
        });
    }

    /// The render of a reconciliation is scheduled for deployment.
    fn deployment_scheduled(&mut self, event: &Event) {
        let now = event.unix_micros as f64 / 1e6;
        if let Some(record) = find_record(self, event.correlation_id)
            && let Some(validated) = record.last_stage_end
        {
            record.stages.insert("schedule", (now - validated).max(0.0));
            record.last_stage_end = Some(now);
        }
    }

    /// A reconciliation ends well: its stages and duration.
    fn reconciliation_completed(
        &mut self,
        event: &Event,
        done: &ReconciliationCompleted,
        metrics: Option<&StatusMetrics>,
    ) {
        if let Some(metrics) = metrics {
            metrics
                .reconciliations
                .with_label_values(&["success"])
                .inc();
            metrics
                .reconciliation_duration
                .observe(done.duration.as_secs_f64());
        }
        if let Some(record) = find_record(self, event.correlation_id) {
            record.result = "success";
            record.duration = Some(done.duration.as_secs_f64());
            record.stages = done
                .stages
                .iter()
                .map(|(stage, d)| (stage_name(*stage), d.as_secs_f64()))
                .collect();
            record.last_stage_end = Some(event.unix_micros as f64 / 1e6);
        }
    }

    /// A reconciliation fails: its stage and errors (located in the templates).
    fn reconciliation_failed(
        &mut self,
        event: &Event,
        failed: &ReconciliationFailed,
        places: &TemplatePlaces,
        metrics: Option<&StatusMetrics>,
    ) {
        if let Some(metrics) = metrics {
            metrics
                .reconciliations
                .with_label_values(&["failure"])
                .inc();
        }
        if let Some(record) = find_record(self, event.correlation_id) {
            record.result = "failure";
            record.failed_stage = Some(failed.stage);
            record.errors = places.locate(failed.errors.clone());
            record.duration = Some((event.unix_micros as f64 / 1e6 - record.started).max(0.0));
        }
    }

    /// A render: its timings and the last rendered config.
    fn template_rendered(
        &mut self,
        event: &Event,
        rendered: &TemplateRendered,
        metrics: Option<&StatusMetrics>,
    ) {
        if let Some(metrics) = metrics {
            metrics
                .render_duration
                .observe(rendered.duration.as_secs_f64());
            for (result, count) in [
                ("rendered", rendered.render.rendered),
                ("reused", rendered.render.reused),
            ] {
                metrics
                    .render_fragments
                    .with_label_values(&[result])
                    .inc_by(count as u64);
            }
        }
        if let Some(record) = find_record(self, event.correlation_id) {
            record.render_mode = Some(rendered.render.mode());
        }
        self.rendered = Some(rendered.config.clone());
    }

    /// The quarantine after a search: the objects held back, counted per resource.
    fn quarantine_searched(
        &mut self,
        searched: &QuarantineSearched,
        places: &TemplatePlaces,
        metrics: Option<&StatusMetrics>,
    ) {
        if let Some(metrics) = metrics {
            metrics.quarantined_objects.reset();
            for resource in self.watched.iter().flatten() {
                metrics
                    .quarantined_objects
                    .with_label_values(&[resource.as_str()])
                    .set(0);
            }
            for object in &searched.objects {
                metrics
                    .quarantined_objects
                    .with_label_values(&[object.resource.as_ref()])
                    .inc();
            }
        }
        self.quarantine = searched
            .objects
            .iter()
            .map(|object| QuarantinedObject {
                errors: places.locate(object.errors.clone()),
                ..object.clone()
            })
            .collect();
    }

    /// The safety valve holds a removal.
    fn valve_held(&mut self, held: &SafetyValveHeld, metrics: Option<&StatusMetrics>) {
        if let Some(metrics) = metrics {
            if self.safety_hold.is_none() {
                metrics.safety_holds.inc();
            }
            metrics.safety_held.set(1);
        }
        self.safety_hold = Some(SafetyHold {
            hash: held.hash,
            summary: held.removal.to_string(),
            removal: held.removal.clone(),
            max_removal: held.max_removal.clone(),
            since: unix_seconds(held.since),
            release_at: unix_seconds(held.release_at),
        });
    }

    /// The safety valve lets a removal go (or it was undone).
    fn valve_released(
        &mut self,
        event: &Event,
        released: &SafetyValveReleased,
        metrics: Option<&StatusMetrics>,
    ) {
        if let Some(metrics) = metrics {
            metrics.safety_held.set(0);
            metrics
                .safety_releases
                .with_label_values(&[released.reason])
                .inc();
        }
        self.safety_hold = None;
        self.safety_release = Some(SafetyRelease {
            hash: released.hash,
            reason: released.reason,
            at: event.unix_micros as f64 / 1e6,
        });
    }

    /// An instance took a config.
    fn instance_deployed(&mut self, event: &Event, deployed: &InstanceDeployed) {
        self.deployed_once = true;
        self.attempts
            .insert(deployed.instance.clone(), Attempt::Succeeded);
        let status = instance(self, &deployed.instance);
        status.last_hash = Some(deployed.hash);
        status.last_strategy = Some(deployed.strategy);
        status.last_reason = deployed.reason.clone();
        status.deployments += 1;
        if deployed.strategy == DeployStrategy::Reload {
            status.reloads += 1;
        }
        status.last_error = None;
        status.last_success = Some(event.unix_micros as f64 / 1e6);
    }

    /// An instance refused a config or could not be reached.
    fn instance_failed(&mut self, event: &Event, failed: &InstanceDeploymentFailed) {
        self.attempts.insert(
            failed.instance.clone(),
            Attempt::Failed {
                error: failed.error.to_string(),
                at: event.unix_micros as f64 / 1e6,
            },
        );
        instance(self, &failed.instance).last_error = Some(failed.error.clone());
    }

    /// A deployment round ends.
    fn deployment_completed(&mut self, event: &Event, completed: &DeploymentCompleted) {
        if let Some(record) = find_record(self, event.correlation_id)
            && record.stages.contains_key("schedule")
        {
            record
                .stages
                .insert("deploy", completed.summary.duration.as_secs_f64());
        }
        // The per-instance events carry the detail and come first; the summary
        // only fills in instances they did not mention, so a late summary
        // never overrides a newer per-instance outcome.
        let at = event.unix_micros as f64 / 1e6;
        for name in &completed.summary.succeeded {
            if !self.attempts.contains_key(name) {
                self.deployed_once = true;
                self.attempts.insert(name.clone(), Attempt::Succeeded);
            }
        }
        for name in &completed.summary.failed {
            self.attempts
                .entry(name.clone())
                .or_insert_with(|| Attempt::Failed {
                    error: "deployment failed".to_owned(),
                    at,
                });
        }
    }

    /// Discovered instances: the attempts of those gone are forgotten.
    fn instances_discovered(&mut self, discovered: &InstancesDiscovered) {
        let names: BTreeSet<String> = discovered
            .instances
            .iter()
            .map(|i| i.name.clone())
            .collect();
        let gone: Vec<String> = self
            .discovered
            .get(&discovered.source)
            .map(|old| old.difference(&names).cloned().collect())
            .unwrap_or_default();
        self.discovered.insert(discovered.source.clone(), names);
        for name in gone {
            if !self.knows(&name) {
                self.attempts.remove(&name);
            }
        }
    }
}

fn find_record(
    inner: &mut Inner,
    correlation: Option<CorrelationId>,
) -> Option<&mut ReconciliationRecord> {
    let correlation = correlation?;
    inner
        .reconciliations
        .iter_mut()
        .rev()
        .find(|r| r.correlation_id == correlation)
}

fn instance<'a>(inner: &'a mut Inner, name: &str) -> &'a mut InstanceStatus {
    inner
        .instances
        .entry(name.to_owned())
        .or_insert_with(|| InstanceStatus {
            name: name.to_owned(),
            ..InstanceStatus::default()
        })
}

// === impl StatusMetrics ===

/// Reconciliation metrics derived from events. Register once per process.
#[derive(Clone, Debug)]
pub struct StatusMetrics {
    watched_objects: IntGaugeVec,
    /// The deprecated name of `watched_objects`, kept for one release.
    resources: IntGaugeVec,
    reconciliations: IntCounterVec,
    reconciliation_duration: Histogram,
    render_duration: Histogram,
    quarantined_objects: IntGaugeVec,
    render_fragments: IntCounterVec,
    safety_held: IntGauge,
    safety_holds: IntCounter,
    safety_releases: IntCounterVec,
}

impl StatusMetrics {
    /// Creates and registers `hapwright_watched_objects{resource}` (and its
    /// deprecated former name `hapwright_resources{source}`),
    /// `hapwright_reconciliations_total{result}`,
    /// `hapwright_reconciliation_duration_seconds`,
    /// `hapwright_render_duration_seconds`,
    /// `hapwright_render_fragments_total{result}`, `hapwright_quarantined_objects`
    /// and the safety valve's `hapwright_safety_valve_held`,
    /// `hapwright_safety_valve_holds_total` and
    /// `hapwright_safety_valve_releases_total{reason}`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let buckets = vec![
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        ];
        let reconciliations = IntCounterVec::new(
            Opts::new(
                "hapwright_reconciliations_total",
                "Reconciliations by result (success or failure).",
            ),
            &["result"],
        )?;
        let reconciliation_duration = Histogram::with_opts(
            HistogramOpts::new(
                "hapwright_reconciliation_duration_seconds",
                "Time from trigger to the end of a successful reconciliation.",
            )
            .buckets(buckets.clone()),
        )?;
        let render_duration = Histogram::with_opts(
            HistogramOpts::new(
                "hapwright_render_duration_seconds",
                "Time to render all templates.",
            )
            .buckets(buckets),
        )?;
        let watched_objects = IntGaugeVec::new(
            Opts::new(
                "hapwright_watched_objects",
                "Objects in the latest snapshot of each watched resource.",
            ),
            &["resource"],
        )?;
        let resources = IntGaugeVec::new(
            Opts::new(
                "hapwright_resources",
                "Deprecated, use hapwright_watched_objects{resource}; removed in the next \
                 release. Objects in the latest snapshot of each watched resource.",
            ),
            &["source"],
        )?;
        let quarantined_objects = IntGaugeVec::new(
            Opts::new(
                "hapwright_quarantined_objects",
                "Objects held back by the quarantine, per watched resource: their change \
                 made the config fail and waits for a fix (see /debug/quarantine).",
            ),
            &["resource"],
        )?;
        registry.register(Box::new(quarantined_objects.clone()))?;
        registry.register(Box::new(watched_objects.clone()))?;
        registry.register(Box::new(resources.clone()))?;
        registry.register(Box::new(reconciliations.clone()))?;
        registry.register(Box::new(reconciliation_duration.clone()))?;
        registry.register(Box::new(render_duration.clone()))?;
        let render_fragments = IntCounterVec::new(
            Opts::new(
                "hapwright_render_fragments_total",
                "Rendered files and cached snippet outputs by result: rendered by the \
                 template engine, or reused unchanged from the previous render because \
                 nothing they read changed.",
            ),
            &["result"],
        )?;
        registry.register(Box::new(render_fragments.clone()))?;
        for result in ["success", "failure"] {
            reconciliations.with_label_values(&[result]);
        }
        for result in ["rendered", "reused"] {
            render_fragments.with_label_values(&[result]);
        }
        let safety_held = IntGauge::new(
            "hapwright_safety_valve_held",
            "1 while the safety valve holds a change that would remove more than \
             controller.safety.maxRemoval of the backends, servers or map entries served \
             within controller.safety.confirmAfter; the removed items stay deployed (see \
             /debug/safety; release it with POST /-/approve).",
        )?;
        let safety_holds = IntCounter::new(
            "hapwright_safety_valve_holds_total",
            "Times the safety valve started holding a change.",
        )?;
        let safety_releases = IntCounterVec::new(
            Opts::new(
                "hapwright_safety_valve_releases_total",
                "Holds of the safety valve that ended, by how: confirmed (the drop lasted \
                 confirmAfter), approved (POST /-/approve), recovered (the sources came back) \
                 or disabled (a config reload turned the valve off).",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(safety_held.clone()))?;
        registry.register(Box::new(safety_holds.clone()))?;
        registry.register(Box::new(safety_releases.clone()))?;
        for reason in ["confirmed", "approved", "recovered", "disabled"] {
            safety_releases.with_label_values(&[reason]);
        }
        Ok(Self {
            safety_held,
            safety_holds,
            safety_releases,
            watched_objects,
            resources,
            reconciliations,
            reconciliation_duration,
            render_duration,
            quarantined_objects,
            render_fragments,
        })
    }
}

// === components ===

/// Pipeline subscriber keeping the [`StatusStore`] and the reconciliation metrics.
pub struct StatusRecorder {
    store: StatusStore,
    metrics: Option<StatusMetrics>,
}

impl StatusRecorder {
    /// A recorder writing into `store`.
    pub fn new(store: StatusStore, metrics: Option<StatusMetrics>) -> Self {
        Self { store, metrics }
    }
}

#[async_trait::async_trait]
impl Component for StatusRecorder {
    fn name(&self) -> &str {
        "status"
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline(KindSet::all())
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        while let Some(event) = ctx.next_event().await {
            self.store.apply(&event, self.metrics.as_ref());
        }
        Ok(())
    }
}

/// Observer keeping the ring of recent events behind `/debug/events`.
pub struct EventLog {
    store: StatusStore,
}

impl EventLog {
    /// An event log writing into `store`.
    pub fn new(store: StatusStore) -> Self {
        Self { store }
    }
}

#[async_trait::async_trait]
impl Component for EventLog {
    fn name(&self) -> &str {
        "event-log"
    }

    /// The ring only serves `/debug/events`; losing it costs diagnostics, not
    /// deployments, so it neither restarts the iteration nor fails `/healthz`.
    fn mandatory(&self) -> bool {
        false
    }

    fn consumes(&self) -> Interest {
        Interest::observer(KindSet::all())
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        while let Some(event) = ctx.next_event().await {
            tracing::debug!(
                event = event.kind().as_str(),
                id = %event.id,
                correlation_id = event.correlation_id.map(tracing::field::display),
                "Event"
            );
            self.store.remember_event(event);
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests;
