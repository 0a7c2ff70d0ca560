//! The local-socket driver: one HAProxy instance reached through its master CLI, its
//! runtime API and its config directory, as a [`Driver`].
//!
//! The steps it gives the deployment flow ([`crate::driver`]):
//! - what the instance runs after a controller restart ([`Driver::recover`]): the
//!   files in the config directory, when they match the state record written after the
//!   last deployment and the record's marker is the worker's
//!   `HAPWRIGHT_CONFIG_VERSION`; anything else is unknown (one repair reload). The
//!   first call sweeps temporary files an earlier, killed controller left behind;
//! - runtime changes through the runtime API (address changes and removals drained,
//!   see [`crate::client::runtime`]), then the files rewritten with the running marker;
//! - a reload: snapshot the last good files, write the new ones (exclusive temporary
//!   files, fsync, rename, directory fsync), dump the server state file (without the
//!   lines of changed servers), then a confirmed reload — from HAProxy 2.7 on the
//!   master CLI's answer `Success=1` (`Success=0` carries the ALERT lines), on 2.6
//!   the `show proc` counter moved with `[failed: 0]`; then the version marker read
//!   back — and the state record last. The last
//!   good files are put back after every failure once files were written, also when
//!   the deployment is cancelled (a restore guard); a failed restore is an error of
//!   its own ([`DeployError::RestoreFailed`]).
//!
//! Every blocking file operation runs on the blocking pool and holds the directory's
//! files gate until it ends, so a cancelled deployment's write never overlaps the next.
//!
//! Managed mode: a start of the managed HAProxy is a deployment of the files on disk.
//! [`Driver::start_if_stopped`] starts a stopped process itself; a start it did not
//! cause (the supervisor restarted the process after a crash, or a failed start came
//! up on a later attempt) is recorded by [`SocketDriver::adopt_managed_start`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hapwright_eventbus::model::{
    DeployReason, DeployStrategy, Diagnostic, InstanceDriver, ReloadReason, RenderedConfig,
};
use tokio::time::Instant;

use crate::client::master::{
    MasterClient, MasterError, ProcInfo, ReloadAnswer, Version, parse_reload_answer,
};
use crate::client::runtime::{self, PatternKind, RuntimeClient, RuntimeError};
use crate::client::socket::{InstanceConfig, SocketError};
use crate::driver::Driver;
use crate::driver::managed::{LogBuffer, ManagedError, ManagedHaproxy};
use crate::driver::state_file;
use crate::haproxy::backends::Capability;
use crate::haproxy::config::{self as haproxy_config, Config, ParseError};
use crate::haproxy::files::{
    ConfigDir, DeployRecord, RecordCheck, VERSION_VARIABLE, steps, write_atomic,
};
use crate::haproxy::plan::{ChangePlan, PlanOptions, RuntimeOp};
use crate::metrics::Metrics;
use crate::version_check::VersionError;

/// What an instance runs after a successful deployment.
#[derive(Clone, Debug)]
pub struct Deployed {
    /// The rendered config the instance runs (without the version marker).
    pub config: Arc<RenderedConfig>,
    /// Its parsed model (kept so the next plan does not parse it again).
    pub model: Arc<Config>,
    /// The version marker the current worker was started with.
    pub marker: String,
    /// How the last deployment was applied.
    pub strategy: DeployStrategy,
    /// Why.
    pub reason: DeployReason,
    /// Runtime changes applied by the last deployment.
    pub runtime_commands: usize,
    /// When it finished.
    pub at: SystemTime,
}

impl Deployed {
    /// A record for `config`, parsing it. A `haproxy.cfg` that does not parse has
    /// no model to plan against: the error, never an empty model.
    pub fn new(
        config: Arc<RenderedConfig>,
        marker: String,
        strategy: DeployStrategy,
        reason: DeployReason,
    ) -> Result<Self, ParseError> {
        let model = Arc::new(haproxy_config::parse(config.main())?);
        Ok(Self {
            config,
            model,
            marker,
            strategy,
            reason,
            runtime_commands: 0,
            at: SystemTime::now(),
        })
    }
}

/// What a config directory says its instance runs, from its files and state record
/// alone: the first half of [`Driver::recover`] (the second asks the worker whether it
/// runs the recorded marker). `hapwright plan` uses it as is, without touching HAProxy.
#[derive(Debug)]
pub enum Recorded {
    /// The files are what the last successful deployment wrote.
    Found(Deployed),
    /// No state record: nothing was deployed here by hapwright (the next deployment
    /// reloads).
    NoRecord,
    /// The files differ from the state record (the next deployment rewrites them and
    /// reloads); the first difference.
    Mismatch(String),
    /// The recorded `haproxy.cfg` does not parse (the next deployment reloads).
    Unparsable(ParseError),
}

impl Recorded {
    /// Reads a [`ConfigDir::check_record`] answer.
    pub fn of(check: RecordCheck) -> Self {
        match check {
            RecordCheck::Consistent { marker, config } => match Deployed::new(
                Arc::new(config),
                marker,
                DeployStrategy::Noop,
                DeployReason {
                    reload: None,
                    detail: "found running".to_owned(),
                },
            ) {
                Ok(deployed) => Recorded::Found(deployed),
                Err(error) => Recorded::Unparsable(error),
            },
            RecordCheck::Missing => Recorded::NoRecord,
            RecordCheck::Mismatch { detail } => Recorded::Mismatch(detail),
        }
    }

    /// Reads `dir`'s files and state record (blocking).
    pub fn read(dir: &ConfigDir) -> std::io::Result<Self> {
        dir.check_record().map(Self::of)
    }
}

/// Why a deployment to one instance failed.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// The master CLI could not be reached or answered nonsense.
    #[error(transparent)]
    Master(#[from] MasterError),
    /// A `haproxy.cfg` to deploy or found running does not parse, so there is no
    /// model to plan against.
    #[error("haproxy.cfg does not parse: {0}")]
    Unparsable(#[from] ParseError),
    /// The master CLI socket failed.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// Writing or restoring the config files failed.
    #[error("writing the config files into {dir} failed")]
    Files {
        /// The config directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// HAProxy refused the new config; the old worker keeps serving. The last good
    /// files are put back (a failure to do so is [`DeployError::RestoreFailed`]).
    #[error("HAProxy refused the new config (reload failed, {failed} consecutive failures); the old worker keeps serving{}", alerts_suffix(.alerts))]
    ReloadFailed {
        /// `[failed: N]` after the attempt.
        failed: u64,
        /// HAProxy's ALERT lines, when the master's output is visible (managed mode).
        alerts: Vec<String>,
    },
    /// The reload counter did not move in time.
    #[error("reload not confirmed within {0:?}")]
    ReloadTimeout(Duration),
    /// The worker runs another config version than the one written.
    #[error("after the reload the worker reports version {actual:?}, expected {expected}")]
    MarkerMismatch {
        /// Written marker.
        expected: String,
        /// Marker the worker reports.
        actual: Option<String>,
    },
    /// The managed HAProxy did not start.
    #[error(transparent)]
    Managed(#[from] ManagedError),
    /// A Data Plane API call failed.
    #[error(transparent)]
    Dataplane(#[from] crate::client::dataplane::DataplaneError),
    /// A deployment failed after files were written, and putting the last good files
    /// back failed too: the config directory holds files HAProxy does not run, and
    /// the next reload or restart would load them. The instance is treated as
    /// unknown, so the next deployment rewrites every file and reloads.
    #[error("{failure}; putting the last good files back into {dir} failed too")]
    RestoreFailed {
        /// Why the deployment failed.
        failure: Box<DeployError>,
        /// The config directory.
        dir: PathBuf,
        /// Why the restore failed.
        #[source]
        source: std::io::Error,
    },
}

fn alerts_suffix(alerts: &[String]) -> String {
    if alerts.is_empty() {
        String::new()
    } else {
        format!(": {}", alerts.join(" | "))
    }
}

impl DeployError {
    /// The error as a diagnostic for `InstanceDeploymentFailed`.
    pub fn to_diagnostic(&self) -> Diagnostic {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        Diagnostic::error(text)
    }
}

/// How a reload was confirmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfirmedBy {
    /// The master CLI's answer to `reload` (`Success=1` / `Success=0`; HAProxy 2.7
    /// and later).
    Answer,
    /// The reload counter of `show proc` (HAProxy 2.6, or a later line whose answer
    /// broke off).
    Counter,
}

/// The last reload of an instance and how it was confirmed
/// ([`SocketDriver::last_reload`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReloadConfirmation {
    /// The HAProxy line the master reported before the reload (`None`: it could not
    /// be told, and the counter was used).
    pub version: Option<Version>,
    /// What confirmed it.
    pub by: ConfirmedBy,
    /// `reload` commands sent again: after a busy answer (`Another reload is still
    /// in progress`) or, on the counter path, after a lost one.
    pub resent: u32,
    /// Whether HAProxy loaded the new config.
    pub succeeded: bool,
    /// From the first `show proc` to the confirmation.
    pub duration: Duration,
}

/// What one reload came to: how it was confirmed, and on failure `[failed: N]` with
/// the ALERT lines the answer carried (none on the counter path).
struct ReloadOutcome {
    by: ConfirmedBy,
    resent: u32,
    failure: Option<(u64, Vec<String>)>,
}

/// Timeouts of the reload confirmation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverConfig {
    /// Bound on one confirmed reload (counter moved and worker answering).
    pub reload_timeout: Duration,
    /// Interval of `show proc` polls while waiting. Short, since the poll's
    /// granularity adds to every reload's latency; during the reload the master
    /// refuses connections, so most polls are a refused connect.
    pub poll_interval: Duration,
    /// A reload counter that stays put this long while the master answers means the
    /// `reload` was lost; it is sent again. Only on the counter path (HAProxy 2.6):
    /// later lines answer `reload` with its outcome.
    pub lost_reload_after: Duration,
    /// How long an address change or a server removal waits for the requests in
    /// flight on the old server to finish ([`RuntimeClient::with_drain_timeout`]).
    pub drain_timeout: Duration,
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self {
            reload_timeout: Duration::from_secs(30),
            poll_interval: Duration::from_millis(10),
            lost_reload_after: Duration::from_secs(3),
            drain_timeout: crate::client::runtime::DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

/// Deploys to one HAProxy instance through its local sockets.
#[derive(Debug)]
pub struct SocketDriver {
    instance: InstanceConfig,
    master: MasterClient,
    runtime: RuntimeClient,
    dir: ConfigDir,
    managed: Option<ManagedHaproxy>,
    metrics: Metrics,
    config: DriverConfig,
    /// Held by every blocking file operation until it ends, also when the deployment
    /// that started it was cancelled: the next operation on the directory waits for it.
    files_gate: Arc<tokio::sync::Mutex<()>>,
    /// Whether the leftovers of an earlier, killed controller were swept.
    swept: std::sync::atomic::AtomicBool,
    /// How the last reload was confirmed (diagnostics and tests).
    last_reload: std::sync::Mutex<Option<ReloadConfirmation>>,
    /// The HAProxy line the master reported last (asked before every reload, and
    /// when planning with `dynamicBackends` on and none is known).
    line: std::sync::Mutex<Option<Version>>,
    /// Whether the warning that this instance cannot add backends at runtime was
    /// logged (once per instance).
    warned_dynamic_backends: std::sync::atomic::AtomicBool,
    /// HAProxy's listings of the files it loaded, kept between deployments.
    listings: std::sync::Mutex<Listings>,
    /// The last state record written, with the render it describes: the next one
    /// takes the hashes of the files both renders share from it.
    last_record: std::sync::Mutex<Option<(Arc<RenderedConfig>, Arc<DeployRecord>)>>,
}

/// What HAProxy listed last of the files it loaded (`show map`, `show acl`,
/// `show ssl cert`, `show ssl crt-list`), kept between deployments so that a
/// runtime change does not list every certificate again (10,000 lines at 10,000
/// certificates). The name HAProxy knows a file by depends only on the config
/// directory and the config, so a kept listing stays right for the files in it; a
/// file missing from it (a certificate added since) is looked up in a fresh
/// listing, and a reload, a start or a failed runtime change forgets them all.
#[derive(Debug, Default)]
struct Listings {
    maps: Option<Arc<[String]>>,
    acls: Option<Arc<[String]>>,
    certs: Option<Arc<[String]>>,
    lists: Option<Arc<[String]>>,
}

/// One of the [`Listings`].
#[derive(Clone, Copy, Debug)]
enum Listing {
    Maps,
    Acls,
    Certs,
    Lists,
}

impl Listings {
    fn slot(&mut self, listing: Listing) -> &mut Option<Arc<[String]>> {
        match listing {
            Listing::Maps => &mut self.maps,
            Listing::Acls => &mut self.acls,
            Listing::Certs => &mut self.certs,
            Listing::Lists => &mut self.lists,
        }
    }
}

impl SocketDriver {
    /// A driver for `instance`; `managed` must be given for a `managed: true` instance.
    pub fn new(
        instance: InstanceConfig,
        managed: Option<ManagedHaproxy>,
        metrics: Metrics,
    ) -> Self {
        let master = MasterClient::new(instance.master.clone());
        let runtime = match &instance.runtime {
            Some(address) => RuntimeClient::direct(address.clone()),
            None => RuntimeClient::via_master(instance.master.clone()),
        };
        Self {
            dir: ConfigDir::for_instance(&instance),
            swept: std::sync::atomic::AtomicBool::new(false),
            last_reload: std::sync::Mutex::new(None),
            line: std::sync::Mutex::new(None),
            warned_dynamic_backends: std::sync::atomic::AtomicBool::new(false),
            listings: std::sync::Mutex::new(Listings::default()),
            last_record: std::sync::Mutex::new(None),
            managed: managed.filter(|_| instance.managed),
            instance,
            master,
            runtime,
            metrics,
            config: DriverConfig::default(),
            files_gate: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Replaces the reload timeouts.
    #[must_use]
    pub fn with_config(mut self, config: DriverConfig) -> Self {
        self.runtime = self
            .runtime
            .clone()
            .with_drain_timeout(config.drain_timeout);
        self.config = config;
        self
    }

    /// Replaces the injected faults of the config directory (tests; the binary reads
    /// them from `HAPWRIGHT_FAULTS`).
    #[must_use]
    pub fn with_faults(mut self, faults: crate::haproxy::files::Faults) -> Self {
        self.dir = self.dir.clone().with_faults(faults);
        self
    }

    /// The instance.
    pub fn instance(&self) -> &InstanceConfig {
        &self.instance
    }

    /// The master CLI client.
    pub fn master(&self) -> &MasterClient {
        &self.master
    }

    /// The runtime API client.
    pub fn runtime(&self) -> &RuntimeClient {
        &self.runtime
    }

    /// How the last reload this driver sent was confirmed; `None` before the first.
    pub fn last_reload(&self) -> Option<ReloadConfirmation> {
        self.last_reload.lock().expect("last reload lock").clone()
    }

    /// What the instance can do beyond every line's runtime changes: with
    /// `haproxy.dynamicBackends` on, whether its line has `add backend` (3.4 and
    /// later). The line is the one the master reported last, asked once when none
    /// is known. An instance that cannot logs one warning and reloads for added and
    /// removed backends, the plan's reason saying why.
    pub async fn dynamic_backends(&self) -> Capability {
        if !self.instance.dynamic_backends {
            return Capability::Off;
        }
        let known = *self.line.lock().expect("line lock");
        let version = match known {
            Some(version) => Some(version),
            None => match self.master.version().await {
                Ok(version) => {
                    *self.line.lock().expect("line lock") = Some(version);
                    Some(version)
                }
                Err(error) => {
                    tracing::warn!(instance = %self.instance.name, %error, "Cannot tell the HAProxy line; added and removed backends reload this time");
                    None
                }
            },
        };
        let capability = Capability::for_line(true, version);
        if let (Capability::Unsupported(why), Some(_)) = (&capability, version)
            && !self
                .warned_dynamic_backends
                .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            tracing::warn!(instance = %self.instance.name, reason = %why, "haproxy.dynamicBackends is on, but this instance cannot add backends at runtime; added and removed backends reload it");
        }
        capability
    }

    async fn drift_of(&self, running: &Deployed) -> Result<Option<String>, DeployError> {
        let actual = self.master.worker_env(VERSION_VARIABLE).await?;
        if actual.as_deref() != Some(running.marker.as_str()) {
            return Ok(Some(format!(
                "worker runs version {}, expected {}",
                actual.as_deref().unwrap_or("(none)"),
                running.marker
            )));
        }
        let on_disk = self
            .on_files(ConfigDir::read_rendered)
            .await
            .map_err(|e| self.files_error(e))?;
        let Some((config, marker)) = on_disk else {
            return Ok(Some(format!(
                "{} is missing",
                self.instance.config_dir.join("haproxy.cfg").display()
            )));
        };
        let (expected_main, _) = crate::haproxy::files::strip_version_marker(
            &crate::haproxy::files::with_version_marker(running.config.main(), &running.marker),
        );
        let same = marker.as_deref() == Some(running.marker.as_str())
            && **config.main() == *expected_main
            && config.maps() == running.config.maps()
            && config.files() == running.config.files()
            && config.certificates() == running.config.certificates();
        Ok((!same).then(|| {
            format!(
                "the files in {} were changed outside hapwright",
                self.instance.config_dir.display()
            )
        }))
    }

    /// What the instance runs according to its config directory: the files, when
    /// they match the state record written after the last deployment and the record's
    /// marker is what the worker reports. Anything else — no record (a directory from
    /// before records, or never deployed), files that differ from it (a controller
    /// killed half-way through writing), a worker that runs another version — is
    /// unknown, and the next deployment rewrites every file and reloads once.
    ///
    /// The first call also sweeps temporary files a killed controller left behind.
    async fn running_from_disk(&self) -> Option<Arc<Deployed>> {
        if !self.swept.swap(true, std::sync::atomic::Ordering::AcqRel) {
            match self.on_files(ConfigDir::sweep).await {
                Ok(removed) if !removed.is_empty() => {
                    tracing::warn!(instance = %self.instance.name, removed = ?removed, "Removed temporary files an earlier run left behind");
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(instance = %self.instance.name, %error, "Cannot sweep the config directory");
                }
            }
        }
        let check = match self.on_files(ConfigDir::check_record).await {
            Ok(check) => check,
            Err(error) => {
                tracing::warn!(instance = %self.instance.name, %error, "Cannot read the config directory; what the instance runs is unknown");
                return None;
            }
        };
        let deployed = match Recorded::of(check) {
            Recorded::Found(deployed) => deployed,
            Recorded::NoRecord => {
                tracing::info!(instance = %self.instance.name, "No state record in the config directory; the first deployment reloads");
                return None;
            }
            Recorded::Mismatch(detail) => {
                tracing::warn!(instance = %self.instance.name, %detail, "The config directory does not match its state record; the first deployment rewrites it and reloads");
                return None;
            }
            Recorded::Unparsable(error) => {
                tracing::warn!(instance = %self.instance.name, %error, "The recorded haproxy.cfg does not parse; the first deployment rewrites it and reloads");
                return None;
            }
        };
        let actual = self.master.worker_env(VERSION_VARIABLE).await.ok()?;
        if actual.as_deref() != Some(deployed.marker.as_str()) {
            tracing::warn!(instance = %self.instance.name, recorded = %deployed.marker, running = actual.as_deref().unwrap_or("(none)"), "The worker does not run the recorded files; the first deployment reloads");
            return None;
        }
        Some(Arc::new(deployed))
    }

    /// Writes the state record: `config` with `marker` is what the instance runs.
    /// Written last, after the files and any reload; a failure only means the next
    /// controller start reloads once, so it is logged, not returned.
    async fn record(&self, config: &Arc<RenderedConfig>, marker: &str, after_reload: bool) {
        let last = self
            .last_record
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let record = Arc::new(DeployRecord::new_reusing(
            config,
            marker,
            last.as_ref().map(|(config, record)| (&**config, &**record)),
        ));
        let written = record.clone();
        let outcome = self
            .on_files(move |dir| {
                if after_reload {
                    dir.faults().reached(steps::AFTER_RELOAD);
                }
                dir.write_record(&written)
            })
            .await;
        *self
            .last_record
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((config.clone(), record));
        if let Err(error) = outcome {
            tracing::warn!(instance = %self.instance.name, %error, "Cannot write the state record; the next controller start will reload this instance once");
        }
    }

    async fn start_managed(
        &self,
        managed: &ManagedHaproxy,
        desired: Arc<RenderedConfig>,
        desired_model: Arc<Config>,
        running: Option<Arc<Deployed>>,
    ) -> Result<Deployed, DeployError> {
        self.forget_listings();
        let marker = desired.hash().short();
        let guard = self
            .write_guarded(&desired, &marker, running.as_ref().map(|r| &r.config))
            .await?;
        let (reason, detail) = if running.is_some() {
            (ReloadReason::Restart, "managed HAProxy (re)started")
        } else {
            (ReloadReason::FirstDeploy, "managed HAProxy started")
        };
        match managed.ensure_started(&self.instance).await {
            Ok(()) => {
                // This deployment accounts for the start.
                managed.claim_start(&self.instance.name).await;
                // A start that was already under way when the files were written runs
                // the older files: reload onto the new ones.
                let actual = self.master.worker_env(VERSION_VARIABLE).await?;
                if actual.as_deref() != Some(marker.as_str()) {
                    let plan = ChangePlan::reload(
                        reason,
                        format!(
                            "{detail} with version {}; reloading onto {marker}",
                            actual.as_deref().unwrap_or("(none)")
                        ),
                    );
                    guard.disarm();
                    return self.reload(desired, desired_model, None, plan).await;
                }
                guard.disarm();
                self.record(&desired, &marker, true).await;
                self.metrics
                    .reload(&self.instance.name, true, reason.as_str());
                Ok(Deployed {
                    config: desired,
                    model: desired_model,
                    marker,
                    strategy: DeployStrategy::Reload,
                    reason: DeployReason {
                        reload: Some(reason),
                        detail: detail.to_owned(),
                    },
                    runtime_commands: 0,
                    at: SystemTime::now(),
                })
            }
            Err(error) => {
                self.metrics
                    .reload(&self.instance.name, false, reason.as_str());
                if guard.restores_nothing() {
                    // There were no files before: keep these, the supervisor goes on
                    // trying to start HAProxy with them.
                    guard.disarm();
                    return Err(error.into());
                }
                Err(guard.restore_after(error.into()).await)
            }
        }
    }

    /// Records a start of the managed HAProxy that no deployment accounted for: the
    /// supervisor restarted the process (after a crash, or a failed start that came
    /// up on a later attempt), and it runs the files on disk. Those become what the
    /// instance runs, as a reload with reason `restart` (`first_deploy` when
    /// `deployed_before` is false). Anything applied only at runtime is gone with the
    /// old process; runtime-only deployments rewrite the files, so they survive.
    ///
    /// `known` are configs to reuse (with their source maps) when the files are one
    /// of them. `None` when the instance is not managed or there is no such start.
    pub async fn adopt_managed_start(
        &self,
        deployed_before: bool,
        known: &[Arc<RenderedConfig>],
    ) -> Option<Result<Deployed, DeployError>> {
        let managed = self.managed.as_ref()?;
        let pid = managed.claim_start(&self.instance.name).await?;
        let reason = if deployed_before {
            ReloadReason::Restart
        } else {
            ReloadReason::FirstDeploy
        };
        let outcome = self.files_in_use().await;
        self.metrics
            .reload(&self.instance.name, outcome.is_ok(), reason.as_str());
        Some(outcome.and_then(|(config, marker)| {
            let config = known
                .iter()
                .find(|k| k.hash() == config.hash())
                .cloned()
                .unwrap_or_else(|| Arc::new(config));
            Deployed::new(
                config,
                marker,
                DeployStrategy::Reload,
                DeployReason {
                    reload: Some(reason),
                    detail: format!(
                        "managed HAProxy (pid {pid}) {} by the supervisor with the files on disk",
                        if deployed_before {
                            "restarted"
                        } else {
                            "started"
                        }
                    ),
                },
            )
            .map_err(DeployError::from)
        }))
    }

    /// The config on disk and its marker, checked against the worker's marker.
    async fn files_in_use(&self) -> Result<(RenderedConfig, String), DeployError> {
        let (config, marker) = self
            .on_files(ConfigDir::read_rendered)
            .await
            .map_err(|e| self.files_error(e))?
            .ok_or_else(|| self.files_error(std::io::ErrorKind::NotFound.into()))?;
        let actual = self.master.worker_env(VERSION_VARIABLE).await?;
        match marker {
            Some(marker) if actual.as_deref() == Some(marker.as_str()) => Ok((config, marker)),
            marker => Err(DeployError::MarkerMismatch {
                expected: marker.unwrap_or_else(|| "(no marker on disk)".to_owned()),
                actual,
            }),
        }
    }

    fn files_error(&self, source: std::io::Error) -> DeployError {
        DeployError::Files {
            dir: self.instance.config_dir.clone(),
            source,
        }
    }

    /// Runs blocking work on the config directory on the blocking pool. The files gate
    /// is held until the work ends, even when the caller is cancelled meanwhile, so
    /// no two file operations on one directory overlap.
    async fn on_files<T: Send + 'static>(
        &self,
        work: impl FnOnce(&ConfigDir) -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        run_on_files(self.files_gate.clone(), self.dir.clone(), work).await
    }

    /// Writes the files on the blocking pool: every file is fsynced, and a fleet's
    /// deployments run concurrently on the same executor threads.
    async fn write_files(
        &self,
        config: &Arc<RenderedConfig>,
        marker: &str,
        previous: Option<&Arc<RenderedConfig>>,
    ) -> Result<(), DeployError> {
        let (config, marker, previous) = (config.clone(), marker.to_owned(), previous.cloned());
        self.on_files(move |dir| dir.write(&config, &marker, previous.as_deref()))
            .await
            .map_err(|e| self.files_error(e))
    }

    /// Takes a snapshot of the directory, then writes `config`. The returned guard
    /// puts the snapshot back unless disarmed: on an error (here, when a write
    /// fails half-way) and when the deployment is cancelled.
    async fn write_guarded(
        &self,
        config: &Arc<RenderedConfig>,
        marker: &str,
        previous: Option<&Arc<RenderedConfig>>,
    ) -> Result<RestoreGuard, DeployError> {
        let backup = self
            .on_files(ConfigDir::snapshot)
            .await
            .map_err(|e| self.files_error(e))?;
        let guard = RestoreGuard {
            gate: self.files_gate.clone(),
            dir: self.dir.clone(),
            instance: self.instance.name.clone(),
            metrics: self.metrics.clone(),
            backup: Some(backup),
        };
        match self.write_files(config, marker, previous).await {
            Ok(()) => Ok(guard),
            Err(error) => Err(guard.restore_after(error).await),
        }
    }

    /// Applies runtime changes in order; returns how many, or which one failed and how.
    async fn apply_runtime(
        &self,
        plan: &ChangePlan,
    ) -> Result<usize, crate::driver::RuntimeOpsError> {
        let failed = |op: String, error: RuntimeError| {
            crate::driver::RuntimeOpsError::new(op, error.class(), error)
        };
        let started = std::time::Instant::now();
        let resolved = self
            .resolve_files(&plan.ops)
            .await
            .map_err(|error| failed("finding the files HAProxy loaded".to_owned(), error))?;
        tracing::debug!(elapsed = ?started.elapsed(), ops = plan.ops.len(), "Found the files HAProxy loaded");
        let mut count = 0;
        for (op, target) in plan.ops.iter().zip(resolved) {
            let started = std::time::Instant::now();
            let outcome = self.apply_op(op, target).await;
            tracing::debug!(op = %op.describe(), ok = outcome.is_ok(), elapsed = ?started.elapsed(), "Runtime command applied");
            self.metrics
                .runtime_command(&self.instance.name, op.object(), outcome.is_ok());
            match outcome {
                Ok(()) => count += 1,
                Err(error) => {
                    self.forget_listings();
                    return Err(failed(op.describe(), error));
                }
            }
            if count == 1
                && plan.ops.len() > 1
                && self.dir.faults().pauses_at(steps::AFTER_RUNTIME_OP)
            {
                let _ = self
                    .on_files(|dir| {
                        dir.faults().reached(steps::AFTER_RUNTIME_OP);
                        Ok(())
                    })
                    .await;
            }
        }
        // After the commands, not between them: rebuilding a listing of 10,000
        // certificates would delay the next command.
        self.keep_listings_of(&plan.ops);
        Ok(count)
    }

    /// Keeps the certificate listing true after certificates were added or removed
    /// at runtime (`ops`, all applied), so that the next change to one (a renewal
    /// right after the add) finds it without listing every certificate again.
    fn keep_listings_of(&self, ops: &[RuntimeOp]) {
        let mut added = std::collections::BTreeSet::<&str>::new();
        let mut removed = std::collections::BTreeSet::<&str>::new();
        for op in ops {
            match op {
                RuntimeOp::AddCertificate { file, .. } => {
                    removed.remove(file.as_str());
                    added.insert(file);
                }
                RuntimeOp::DelCertificate { file } => {
                    added.remove(file.as_str());
                    removed.insert(file);
                }
                _ => {}
            }
        }
        if added.is_empty() && removed.is_empty() {
            return;
        }
        let mut listings = self.listings.lock().expect("listings lock");
        let Some(kept) = listings.certs.as_mut() else {
            return;
        };
        let mut names: Vec<String> = kept
            .iter()
            .filter(|name| !added.contains(name.as_str()) && !removed.contains(name.as_str()))
            .cloned()
            .collect();
        names.extend(added.into_iter().map(str::to_owned));
        *kept = names.into();
    }

    /// Forgets the [`Listings`] (HAProxy loaded its configuration again, or a runtime
    /// change failed).
    fn forget_listings(&self) {
        *self.listings.lock().expect("listings lock") = Listings::default();
    }

    /// HAProxy's `listing`: the kept one unless `fresh`, else asked for and kept.
    async fn listing(&self, listing: Listing, fresh: bool) -> Result<Arc<[String]>, RuntimeError> {
        if !fresh
            && let Some(kept) = self
                .listings
                .lock()
                .expect("listings lock")
                .slot(listing)
                .clone()
        {
            return Ok(kept);
        }
        let listed: Arc<[String]> = match listing {
            Listing::Maps => self.runtime.pattern_files(PatternKind::Map).await?,
            Listing::Acls => self.runtime.pattern_files(PatternKind::Acl).await?,
            Listing::Certs => self.runtime.ssl_certs().await?,
            Listing::Lists => self.runtime.crt_lists().await?,
        }
        .into();
        *self.listings.lock().expect("listings lock").slot(listing) = Some(listed.clone());
        Ok(listed)
    }

    /// For each file op, the path and kind HAProxy knows the file by: from the kept
    /// listings, and when one of the files is not in them, from fresh ones.
    async fn resolve_files(
        &self,
        ops: &[RuntimeOp],
    ) -> Result<Vec<Option<(PatternKind, String)>>, RuntimeError> {
        match self.resolve_files_in(ops, false).await {
            Err(RuntimeError::NotLoaded { file, .. }) => {
                tracing::debug!(%file, "Not in the kept listing of loaded files; listing again");
                self.resolve_files_in(ops, true).await
            }
            resolved => resolved,
        }
    }

    async fn resolve_files_in(
        &self,
        ops: &[RuntimeOp],
        fresh: bool,
    ) -> Result<Vec<Option<(PatternKind, String)>>, RuntimeError> {
        let needs_patterns = ops
            .iter()
            .any(|op| matches!(op, RuntimeOp::ReplacePatterns { .. }));
        let needs_certs = ops
            .iter()
            .any(|op| matches!(op, RuntimeOp::ReplaceCertificate { .. }));
        let needs_lists = ops.iter().any(|op| {
            matches!(
                op,
                RuntimeOp::SetCrtListEntry { .. } | RuntimeOp::DelCrtListEntry { .. }
            )
        });
        let none = || -> Arc<[String]> { Arc::from(Vec::new()) };
        let (maps, acls) = if needs_patterns {
            (
                self.listing(Listing::Maps, fresh).await?,
                self.listing(Listing::Acls, fresh).await?,
            )
        } else {
            (none(), none())
        };
        let certs = if needs_certs {
            self.listing(Listing::Certs, fresh).await?
        } else {
            none()
        };
        let lists = if needs_lists {
            self.listing(Listing::Lists, fresh).await?
        } else {
            none()
        };
        let dir = self.instance.config_dir.display().to_string();
        let dir = dir.trim_end_matches('/');
        let find = |list: &[String], relative: &str| {
            let absolute = format!("{dir}/{relative}");
            let suffix = format!("/{relative}");
            list.iter()
                .find(|p| *p == relative || **p == absolute || p.ends_with(&suffix))
                .cloned()
        };
        ops.iter()
            .map(|op| match op {
                RuntimeOp::ReplacePatterns { file, .. } => {
                    if let Some(path) = find(&maps, file) {
                        Ok(Some((PatternKind::Map, path)))
                    } else if let Some(path) = find(&acls, file) {
                        Ok(Some((PatternKind::Acl, path)))
                    } else {
                        Err(RuntimeError::NotLoaded {
                            file: file.clone(),
                            expected: "a map or ACL file",
                        })
                    }
                }
                RuntimeOp::ReplaceCertificate { file, .. } => find(&certs, file)
                    .map(|path| Some((PatternKind::Map, path)))
                    .ok_or_else(|| RuntimeError::NotLoaded {
                        file: file.clone(),
                        expected: "a certificate",
                    }),
                RuntimeOp::SetCrtListEntry { list, .. }
                | RuntimeOp::DelCrtListEntry { list, .. } => find(&lists, list)
                    .map(|path| Some((PatternKind::Map, path)))
                    .ok_or_else(|| RuntimeError::NotLoaded {
                        file: list.clone(),
                        expected: "a crt-list",
                    }),
                _ => Ok(None),
            })
            .collect()
    }

    async fn apply_op(
        &self,
        op: &RuntimeOp,
        target: Option<(PatternKind, String)>,
    ) -> Result<(), RuntimeError> {
        let rt = &self.runtime;
        match op {
            RuntimeOp::SetAddr {
                backend,
                server,
                addr,
                port,
            } => rt.set_server_addr(backend, server, addr, *port).await,
            RuntimeOp::MoveServer {
                backend,
                server,
                addr,
                port,
                params,
            } => rt.move_server(backend, server, addr, *port, params).await,
            RuntimeOp::SetWeight {
                backend,
                server,
                weight,
            } => rt.set_server_weight(backend, server, *weight).await,
            RuntimeOp::SetState {
                backend,
                server,
                state,
            } => rt.set_server_state(backend, server, state).await,
            RuntimeOp::AddServer {
                backend,
                server,
                address,
                params,
                enable,
                health,
            } => {
                rt.add_server(backend, server, address, params).await?;
                if *health {
                    rt.enable_health(backend, server).await?;
                }
                if *enable {
                    rt.enable_server(backend, server).await?;
                }
                Ok(())
            }
            RuntimeOp::DelServer { backend, server } => {
                // Past the drain timeout the server stays in maintenance (logged by
                // the client) until the next reload; no request is cut short.
                rt.remove_server(backend, server).await.map(drop)
            }
            RuntimeOp::AddBackend {
                backend,
                profile,
                servers,
            } => {
                // One line: nothing routes to the backend before its map entry, which
                // comes after this operation, so a refusal in it leaves nothing in use
                // (the change then reloads).
                rt.add_published_backend(
                    backend,
                    profile,
                    servers.iter().map(|new| runtime::DynamicServer {
                        name: &new.server,
                        address: &new.address,
                        params: &new.params,
                        health: new.health,
                        enable: new.enable,
                    }),
                )
                .await
            }
            RuntimeOp::RefreshDynamicCookies { backend } => {
                rt.refresh_dynamic_cookies(backend).await
            }
            RuntimeOp::DelBackend { backend } => {
                // Past the drain timeout the backend stays unpublished (logged by the
                // client) until the next reload; no request is cut short.
                rt.remove_backend(backend).await.map(drop)
            }
            RuntimeOp::ReplacePatterns {
                content, previous, ..
            } => {
                let (kind, path) = target.expect("resolved before applying");
                let entries = previous
                    .as_ref()
                    .filter(|_| kind == PatternKind::Map)
                    .and_then(|previous| runtime::entry_commands(&path, previous, content));
                match entries {
                    Some(commands) => rt.update_map_entries(&commands).await.map(drop),
                    None => rt.replace_patterns(kind, &path, content).await.map(drop),
                }
            }
            RuntimeOp::ReplaceCertificate { pem, .. } => {
                let (_, path) = target.expect("resolved before applying");
                rt.replace_certificate(&path, pem).await
            }
            RuntimeOp::AddCertificate { file, pem } => rt.add_certificate(file, pem).await,
            RuntimeOp::DelCertificate { file } => rt.delete_certificate(file).await,
            RuntimeOp::SetCrtListEntry { cert, line, .. } => {
                let (_, list) = target.expect("resolved before applying");
                rt.set_crt_list_entry(&list, cert, line).await
            }
            RuntimeOp::DelCrtListEntry { cert, .. } => {
                let (_, list) = target.expect("resolved before applying");
                rt.delete_crt_list_entry(&list, cert).await
            }
        }
    }

    /// Writes the files and performs a confirmed reload; restores the files on failure.
    async fn reload(
        &self,
        desired: Arc<RenderedConfig>,
        desired_model: Arc<Config>,
        running: Option<&Deployed>,
        plan: ChangePlan,
    ) -> Result<Deployed, DeployError> {
        let reason = plan.reason();
        let label = reason.reload.unwrap_or(ReloadReason::Structure).as_str();
        let marker = desired.hash().short();
        // The running worker's server state is read while the files are written: the
        // two do not depend on each other, and both come before the reload.
        let (written, state) = tokio::join!(
            self.write_guarded(&desired, &marker, running.map(|r| &r.config)),
            self.read_server_state(&desired_model),
        );
        let guard = written?;
        if let Some((path, state)) = state {
            self.write_server_state(path, state, &plan).await;
        }
        let _ = self
            .on_files(|dir| {
                dir.faults().reached(steps::BEFORE_RELOAD);
                Ok(())
            })
            .await;
        let logs = match &self.managed {
            Some(managed) => managed.logs(&self.instance.name).await,
            None => None,
        };
        let outcome = self.confirmed_reload(&marker, logs.as_ref()).await;
        self.metrics
            .reload(&self.instance.name, outcome.is_ok(), label);
        match outcome {
            Ok(()) => {
                guard.disarm();
                self.record(&desired, &marker, true).await;
                tracing::info!(instance = %self.instance.name, reason = %reason.detail, "Reloaded");
                Ok(Deployed {
                    config: desired,
                    model: desired_model,
                    marker,
                    strategy: DeployStrategy::Reload,
                    reason,
                    runtime_commands: 0,
                    at: SystemTime::now(),
                })
            }
            Err(error) => Err(guard.restore_after(error).await),
        }
    }

    /// Sends `reload` and waits until the master confirms it ([`Self::reload_once`]),
    /// and reloads again if the files changed while it ran.
    async fn confirmed_reload(
        &self,
        marker: &str,
        logs: Option<&LogBuffer>,
    ) -> Result<(), DeployError> {
        for _round in 0..3 {
            self.reload_once(logs).await?;
            let actual = self.master.worker_env(VERSION_VARIABLE).await?;
            let on_disk = self.on_files(ConfigDir::marker).await.ok().flatten();
            if actual.as_deref() == Some(marker) && on_disk.as_deref() == Some(marker) {
                return Ok(());
            }
            if on_disk.as_deref() == Some(marker) && actual.as_deref() != Some(marker) {
                // The new worker did not pick up our files: try once more.
                tracing::warn!(instance = %self.instance.name, ?actual, expected = marker, "Version marker not live after reload; reloading again");
                continue;
            }
            tracing::warn!(instance = %self.instance.name, "Config files changed during the reload; reloading again");
            let (config, _) = self
                .on_files(ConfigDir::read_rendered)
                .await
                .map_err(|e| self.files_error(e))?
                .ok_or_else(|| self.files_error(std::io::ErrorKind::NotFound.into()))?;
            let marker_owned = marker.to_owned();
            self.on_files(move |dir| dir.write(&config, &marker_owned, None))
                .await
                .map_err(|e| self.files_error(e))?;
        }
        let actual = self.master.worker_env(VERSION_VARIABLE).await?;
        Err(DeployError::MarkerMismatch {
            expected: marker.to_owned(),
            actual,
        })
    }

    /// One reload, confirmed the way the instance's HAProxy line offers it: from 2.7 on
    /// by the master CLI's answer to `reload` ([`Self::reload_by_answer`]), on 2.6 by
    /// the reload counter of `show proc` ([`Self::reload_by_counter`]). The line is
    /// asked (`show version`) before every reload, so an HAProxy upgraded under a
    /// running controller is confirmed the new way. `Err(ReloadFailed)` when HAProxy
    /// refused the new config.
    async fn reload_once(&self, logs: Option<&LogBuffer>) -> Result<(), DeployError> {
        // What the new worker loads is listed again when asked for.
        self.forget_listings();
        let started = Instant::now();
        let before = self.master.show_proc().await?;
        let version = match self.master.version().await {
            Ok(version) => Some(version),
            Err(error) => {
                tracing::warn!(instance = %self.instance.name, %error, "Cannot tell the HAProxy line; confirming the reload by the reload counter");
                None
            }
        };
        if let Some(version) = version {
            *self.line.lock().expect("line lock") = Some(version);
        }
        let log_position = logs.map(LogBuffer::position);
        let outcome = if version.is_some_and(Version::reload_answers) {
            self.reload_by_answer(&before).await?
        } else {
            self.reload_by_counter(&before, false).await?
        };
        let confirmation = ReloadConfirmation {
            version,
            by: outcome.by,
            resent: outcome.resent,
            succeeded: outcome.failure.is_none(),
            duration: started.elapsed(),
        };
        tracing::debug!(instance = %self.instance.name, version = ?confirmation.version.map(|v| v.to_string()), by = ?confirmation.by, resent = confirmation.resent, succeeded = confirmation.succeeded, duration = ?confirmation.duration, "Reload confirmed");
        *self.last_reload.lock().expect("last reload lock") = Some(confirmation);
        let Some((failed, mut alerts)) = outcome.failure else {
            return Ok(());
        };
        if alerts.is_empty()
            && let (Some(logs), Some(position)) = (logs, log_position)
        {
            alerts = self.wait_for_alerts(logs, position).await;
        }
        Err(DeployError::ReloadFailed { failed, alerts })
    }

    /// The ALERT lines of a failed reload; the master prints them just before
    /// `[failed: N]` shows, so give the output pipe a moment.
    async fn wait_for_alerts(&self, logs: &LogBuffer, position: u64) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_millis(500);
        loop {
            let lines = logs.since(position);
            if lines.iter().any(|l| l.contains("Loading failure")) || Instant::now() >= deadline {
                return logs.alerts_since(position);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// HAProxy 2.7 and later: `reload` answers once the new worker loaded
    /// (`Success=1`) or failed to (`Success=0` and the startup log with its ALERT
    /// lines), so nothing is polled and no timeout is waited out. A `Success=0` that
    /// says another reload is still in progress (3.x, e.g. the master's own start
    /// still loading the first worker) started nothing: `reload` is sent again after
    /// [`DriverConfig::poll_interval`], within [`DriverConfig::reload_timeout`]. An
    /// answer that breaks off or is not understood falls back to the reload counter.
    async fn reload_by_answer(&self, before: &ProcInfo) -> Result<ReloadOutcome, DeployError> {
        let deadline = Instant::now() + self.config.reload_timeout;
        let mut busy = 0;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(DeployError::ReloadTimeout(self.config.reload_timeout));
            }
            let text = match self.master.reload_answered(remaining).await {
                Ok(text) => text,
                Err(SocketError::Timeout { .. }) => {
                    return Err(DeployError::ReloadTimeout(self.config.reload_timeout));
                }
                Err(SocketError::Io { source, .. }) => {
                    tracing::warn!(instance = %self.instance.name, error = %source, "The answer to reload broke off; confirming it by the reload counter");
                    return self.reload_by_counter(before, true).await;
                }
                Err(error) => return Err(error.into()),
            };
            match parse_reload_answer(&text) {
                Some(ReloadAnswer::Succeeded { .. }) => {
                    return Ok(ReloadOutcome {
                        by: ConfirmedBy::Answer,
                        resent: busy,
                        failure: None,
                    });
                }
                Some(answer @ ReloadAnswer::Failed { .. }) => {
                    let failed = match self.master.show_proc().await {
                        Ok(info) => info.failed.max(1),
                        Err(_) => 1,
                    };
                    return Ok(ReloadOutcome {
                        by: ConfirmedBy::Answer,
                        resent: busy,
                        failure: Some((failed, answer.alerts())),
                    });
                }
                Some(ReloadAnswer::Busy) => {
                    busy += 1;
                    tracing::debug!(instance = %self.instance.name, "Another reload is still in progress; sending reload again");
                    tokio::time::sleep(self.config.poll_interval).await;
                }
                None => {
                    tracing::warn!(instance = %self.instance.name, answer = %text.trim(), "The answer to reload was not understood; confirming it by the reload counter");
                    return self.reload_by_counter(before, true).await;
                }
            }
        }
    }

    /// HAProxy 2.6: `reload` answers nothing, so the reload counter of `show proc` is
    /// polled until it moved past `before` with a worker up (or the failure counted).
    /// A `reload` sent while the master CLI was down is lost: a counter that stays put
    /// for [`DriverConfig::lost_reload_after`] while the master answers means it is
    /// sent again. `sent`: the reload went out already (a fallback from the answer).
    async fn reload_by_counter(
        &self,
        before: &ProcInfo,
        sent: bool,
    ) -> Result<ReloadOutcome, DeployError> {
        let deadline = Instant::now() + self.config.reload_timeout;
        if !sent {
            self.master
                .send_reload(40, Duration::from_millis(50))
                .await?;
        }
        let mut unchanged_since: Option<Instant> = None;
        let mut resent = 0;
        loop {
            if Instant::now() >= deadline {
                return Err(DeployError::ReloadTimeout(self.config.reload_timeout));
            }
            tokio::time::sleep(self.config.poll_interval).await;
            match self.master.try_show_proc().await {
                Ok(info) if info.reloads > before.reloads => {
                    // The new worker must be up (or the failure recorded) before the
                    // version check.
                    if info.failed > 0 || !info.workers.is_empty() {
                        return Ok(ReloadOutcome {
                            by: ConfirmedBy::Counter,
                            resent,
                            failure: (info.failed > 0).then(|| (info.failed, Vec::new())),
                        });
                    }
                }
                Ok(_) => {
                    let since = *unchanged_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.config.lost_reload_after && resent < 3 {
                        tracing::warn!(instance = %self.instance.name, "Reload was lost; sending it again");
                        self.master
                            .send_reload(40, Duration::from_millis(50))
                            .await?;
                        unchanged_since = None;
                        resent += 1;
                    }
                }
                Err(_) => unchanged_since = None,
            }
        }
    }

    /// The running worker's `show servers state` and the path of the config's
    /// `server-state-file` to save it in. `None` when the config has no
    /// `server-state-file`, when the state cannot be read (logged), or when the path
    /// lies outside the config directory ([`state_file::resolve`]; counted and
    /// logged). The reload goes ahead either way.
    async fn read_server_state(&self, model: &Config) -> Option<(PathBuf, String)> {
        let global = model.global()?;
        let directive = global.last("server-state-file")?;
        let file = directive.args.first()?;
        let base = global
            .last("server-state-base")
            .and_then(|d| d.args.first());
        let path = match state_file::resolve(
            &self.instance.config_dir,
            file,
            base.map(String::as_str),
        ) {
            Ok(path) => path,
            Err(error) => {
                self.metrics.state_file_refused(&self.instance.name);
                tracing::warn!(
                    instance = %self.instance.name,
                    file = "haproxy.cfg",
                    line = directive.line,
                    error = %error,
                    "Server state not saved: server-state-file must stay inside the config directory"
                );
                return None;
            }
        };
        match self.runtime.show_servers_state(None).await {
            Ok(state) => Some((path, state)),
            Err(error) => {
                tracing::warn!(instance = %self.instance.name, %error, "Cannot dump the server state before reloading");
                None
            }
        }
    }

    /// Writes `state` to `path` without the lines of servers the plan changes (their
    /// state-file port would override the new config), on the blocking pool.
    async fn write_server_state(&self, path: PathBuf, state: String, plan: &ChangePlan) {
        let changed = plan.changed_servers.clone();
        let shown = path.display().to_string();
        let written = tokio::task::spawn_blocking(move || {
            write_atomic(&path, without_servers(&state, &changed).as_bytes())
        })
        .await
        .map_err(|error| error.to_string())
        .and_then(|written| written.map_err(|error| error.to_string()));
        if let Err(error) = written {
            tracing::warn!(instance = %self.instance.name, %error, path = %shown, "Cannot write the server state file");
        }
    }
}

/// `show servers state` output without the lines of `servers` (backend name, server
/// name); comments and short lines stay.
fn without_servers<'a>(
    state: &'a str,
    servers: &std::collections::HashSet<(String, String)>,
) -> std::borrow::Cow<'a, str> {
    if servers.is_empty() {
        return std::borrow::Cow::Borrowed(state);
    }
    let mut kept = String::with_capacity(state.len());
    for line in state.lines() {
        let mut fields = line.split_whitespace();
        let (backend, server) = (fields.nth(1), fields.nth(1));
        let dropped = !line.starts_with('#')
            && backend.zip(server).is_some_and(|(backend, server)| {
                servers.contains(&(backend.to_owned(), server.to_owned()))
            });
        if !dropped {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    std::borrow::Cow::Owned(kept)
}

/// Puts a snapshot of a config directory back unless disarmed. Dropped armed — the
/// deployment was cancelled, e.g. by the deployment timeout — it restores on the
/// blocking pool in the background, holding the files gate.
#[derive(Debug)]
struct RestoreGuard {
    gate: Arc<tokio::sync::Mutex<()>>,
    dir: ConfigDir,
    instance: String,
    metrics: Metrics,
    backup: Option<crate::haproxy::files::DirSnapshot>,
}

impl RestoreGuard {
    /// Whether the snapshot is empty (the directory had no files).
    fn restores_nothing(&self) -> bool {
        self.backup.as_ref().is_none_or(|b| b.files.is_empty())
    }

    /// The new files stay.
    fn disarm(mut self) {
        self.backup = None;
    }

    /// Restores now and returns `failure`, or [`DeployError::RestoreFailed`] when the
    /// restore failed.
    async fn restore_after(mut self, failure: DeployError) -> DeployError {
        let Some(backup) = self.backup.take() else {
            return failure;
        };
        let outcome = run_on_files(self.gate.clone(), self.dir.clone(), move |dir| {
            dir.restore(&backup)
        })
        .await;
        match outcome {
            Ok(()) => {
                tracing::info!(instance = %self.instance, "Last good files restored");
                failure
            }
            Err(source) => {
                tracing::error!(instance = %self.instance, error = %source, "Restoring the last good files failed");
                self.metrics.restore_failed(&self.instance);
                DeployError::RestoreFailed {
                    failure: Box::new(failure),
                    dir: self.dir.root().to_path_buf(),
                    source,
                }
            }
        }
    }
}

impl Drop for RestoreGuard {
    fn drop(&mut self) {
        let Some(backup) = self.backup.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (gate, dir, instance, metrics) = (
            self.gate.clone(),
            self.dir.clone(),
            self.instance.clone(),
            self.metrics.clone(),
        );
        tracing::warn!(instance = %instance, "Deployment cancelled after writing files; restoring the last good files");
        runtime.spawn(async move {
            if let Err(error) = run_on_files(gate, dir, move |dir| dir.restore(&backup)).await {
                tracing::error!(instance = %instance, %error, "Restoring the last good files failed");
                metrics.restore_failed(&instance);
            }
        });
    }
}

/// Runs `work` on the blocking pool while holding `gate` (taken before, released
/// after the work, whatever happens to the caller).
async fn run_on_files<T: Send + 'static>(
    gate: Arc<tokio::sync::Mutex<()>>,
    dir: ConfigDir,
    work: impl FnOnce(&ConfigDir) -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let held = gate.lock_owned().await;
    tokio::task::spawn_blocking(move || {
        let _held = held;
        work(&dir)
    })
    .await
    .unwrap_or_else(|join| Err(std::io::Error::other(join)))
}

#[async_trait::async_trait]
impl Driver for SocketDriver {
    fn name(&self) -> &str {
        &self.instance.name
    }

    async fn haproxy_version(&self) -> Result<String, VersionError> {
        let info = self.runtime.query("show info").await?;
        crate::version_check::info_version(&info)
            .map(str::to_owned)
            .ok_or(VersionError::NoInfoVersion)
    }

    fn kind(&self) -> InstanceDriver {
        InstanceDriver::Socket
    }

    fn managed_socket(&self) -> Option<&SocketDriver> {
        self.managed.is_some().then_some(self)
    }

    async fn recover(
        &self,
        _desired: &Arc<RenderedConfig>,
    ) -> Result<Option<Arc<Deployed>>, DeployError> {
        Ok(self.running_from_disk().await)
    }

    async fn start_if_stopped(
        &self,
        desired: &Arc<RenderedConfig>,
        desired_model: &Arc<Config>,
        running: Option<&Arc<Deployed>>,
    ) -> Option<Result<Deployed, DeployError>> {
        let managed = self.managed.as_ref()?;
        let up = managed
            .state(&self.instance.name)
            .await
            .is_some_and(|state| state.is_running());
        if up {
            return None;
        }
        Some(
            self.start_managed(
                managed,
                desired.clone(),
                desired_model.clone(),
                running.cloned(),
            )
            .await,
        )
    }

    async fn check_drift(&self, running: &Deployed) -> Result<Option<String>, DeployError> {
        self.drift_of(running).await
    }

    async fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            dynamic_backends: self.dynamic_backends().await,
        }
    }

    async fn apply_runtime_ops(
        &self,
        plan: &ChangePlan,
    ) -> Result<usize, crate::driver::RuntimeOpsError> {
        self.apply_runtime(plan).await
    }

    async fn persist(
        &self,
        desired: &Arc<RenderedConfig>,
        marker: &str,
        previous: &Arc<RenderedConfig>,
    ) -> Result<(), DeployError> {
        // What the runtime commands changed: HAProxy reads the files only on a
        // reload, which writes (and checks) every file.
        let (config, version, previous) = (desired.clone(), marker.to_owned(), previous.clone());
        self.on_files(move |dir| dir.write_changes(&config, &version, &previous))
            .await
            .map_err(|e| self.files_error(e))?;
        self.record(desired, marker, false).await;
        Ok(())
    }

    async fn reload_with(
        &self,
        desired: Arc<RenderedConfig>,
        desired_model: Arc<Config>,
        running: Option<&Deployed>,
        plan: ChangePlan,
    ) -> Result<Deployed, DeployError> {
        self.reload(desired, desired_model, running, plan).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::without_servers;

    /// `show servers state` as HAProxy 2.6 prints it (fields shortened after the port).
    const STATE: &str = "1\n\
        # be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state\n\
        3 be_web 1 web-1 10.0.0.1 2 0\n\
        3 be_web 2 web-2 10.0.0.2 2 0\n\
        4 be_api 1 web-1 10.0.1.1 2 0\n\
        \n";

    #[test]
    fn the_state_file_leaves_out_exactly_the_changed_servers() {
        let changed: HashSet<(String, String)> = [("be_web".to_owned(), "web-1".to_owned())]
            .into_iter()
            .collect();
        let kept = without_servers(STATE, &changed);
        assert_eq!(
            kept,
            "1\n\
             # be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state\n\
             3 be_web 2 web-2 10.0.0.2 2 0\n\
             4 be_api 1 web-1 10.0.1.1 2 0\n\
             \n"
        );
    }

    #[test]
    fn with_no_changed_server_the_state_is_written_as_read() {
        let kept = without_servers(STATE, &HashSet::new());
        assert!(matches!(kept, std::borrow::Cow::Borrowed(text) if text == STATE));
    }
}
