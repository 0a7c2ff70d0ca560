//! The one driver abstraction and the deployment decision every driver shares.
//!
//! A [`Driver`] reaches one HAProxy instance — the socket driver through the runtime
//! API, the master CLI and the config directory; the Data Plane driver through its
//! API — and supplies the steps of a deployment. What to do with them is decided
//! here, the same way for both:
//!
//! 1. [`decide`]: a first deployment (what the instance runs is unknown) or a found
//!    drift reloads; otherwise the [`ChangePlan`] between the running and the desired
//!    config decides between a no-op, runtime changes and a reload. The plan is
//!    computed once per deployment, from the validator's parsed model.
//! 2. [`execute`]: runtime changes are applied, then the files are persisted without a
//!    reload (keeping the running version marker); a reload writes every file and is
//!    confirmed. A runtime change that fails comes back as [`Executed::RuntimeFailed`]
//!    with the reload that replaces it (reason `runtime_failed`), so the caller can
//!    hold that reload to the instance's reload window like any other. Its detail says
//!    how the change failed ([`RuntimeOpsError::fallback_detail`]): refused by HAProxy,
//!    the runtime API unreachable, a broken exchange, or requests in flight that did
//!    not drain in time. The reload rebuilds every server, map and certificate from the
//!    files, so a change left half-done is finished by it.
//!
//! The instance's owner (the `instance` module) calls the two steps apart; [`Driver::deploy`]
//! runs them back to back (tests, `hapwright bench`).

pub mod dataplane;
pub mod fleet;
pub mod listeners;
pub mod managed;
pub mod socket;
pub mod state_file;

pub use dataplane::DataplaneDriver;
pub use socket::{
    ConfirmedBy, DeployError, Deployed, DriverConfig, Recorded, ReloadConfirmation, SocketDriver,
};

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use tracing::Instrument;

use hapwright_eventbus::model::{DeployStrategy, InstanceDriver, ReloadReason, RenderedConfig};

use crate::client::runtime::RuntimeFailure;
use crate::haproxy::config::Config;
use crate::haproxy::plan::{self, ChangePlan, PlanOptions};
use crate::version_check::VersionError;

/// A runtime change that failed, as both drivers report it: which change, how it
/// failed, and the underlying error.
#[derive(Debug, thiserror::Error)]
#[error("{op}")]
pub struct RuntimeOpsError {
    /// The change ([`RuntimeOp::describe`](crate::haproxy::plan::RuntimeOp::describe)).
    pub op: String,
    /// How it failed; decides the reload fallback's wording.
    pub class: RuntimeFailure,
    /// The driver's error.
    #[source]
    pub error: Box<dyn std::error::Error + Send + Sync>,
}

impl RuntimeOpsError {
    /// A failure of `op` classified as `class`.
    pub fn new(
        op: String,
        class: RuntimeFailure,
        error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            op,
            class,
            error: error.into(),
        }
    }

    /// The reload fallback's detail: the class in words, then the change and every
    /// cause.
    pub fn fallback_detail(&self) -> String {
        let mut causes = self.op.clone();
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&*self.error);
        while let Some(cause) = source {
            causes.push_str(": ");
            causes.push_str(&cause.to_string());
            source = cause.source();
        }
        let what = match self.class {
            RuntimeFailure::Refused => "runtime change refused by HAProxy",
            RuntimeFailure::Unreachable => "runtime API unreachable",
            RuntimeFailure::Protocol => "runtime API exchange failed",
            RuntimeFailure::Drain => "runtime change did not drain in time",
        };
        format!("{what} ({causes})")
    }
}

/// One HAProxy instance, as the deployer drives it.
#[async_trait::async_trait]
pub trait Driver: Send + Sync + fmt::Debug {
    /// The instance's name.
    fn name(&self) -> &str;

    /// How the instance is reached.
    fn kind(&self) -> InstanceDriver;

    /// The socket driver of a managed instance (hapwright supervises its process).
    fn managed_socket(&self) -> Option<&SocketDriver> {
        None
    }

    /// What the instance runs when the deployer does not know (the first deployment
    /// after a controller start): `None` when it cannot be told, so the deployment
    /// reloads. `desired` is the config about to be deployed, which a driver may
    /// recognise on the instance.
    async fn recover(
        &self,
        desired: &Arc<RenderedConfig>,
    ) -> Result<Option<Arc<Deployed>>, DeployError>;

    /// Deploys by starting the instance when it is a managed HAProxy that is not
    /// running; `None` when the instance runs (or is not managed).
    async fn start_if_stopped(
        &self,
        desired: &Arc<RenderedConfig>,
        desired_model: &Arc<Config>,
        running: Option<&Arc<Deployed>>,
    ) -> Option<Result<Deployed, DeployError>> {
        let _ = (desired, desired_model, running);
        None
    }

    /// What the instance can do beyond the runtime changes every line offers (dynamic
    /// backends); asked once per plan.
    async fn plan_options(&self) -> PlanOptions {
        PlanOptions::default()
    }

    /// `None` when the instance runs `running`, otherwise what differs.
    async fn check_drift(&self, running: &Deployed) -> Result<Option<String>, DeployError>;

    /// The version of the HAProxy serving the instance (`3.0.11-1`), as its runtime
    /// API's `show info` reports it, for [`crate::version_check`]. `Err` with the
    /// reason when it cannot be asked.
    async fn haproxy_version(&self) -> Result<String, VersionError> {
        Err(VersionError::Unsupported)
    }

    /// Applies the plan's runtime operations in order: how many, or which one failed
    /// and how.
    async fn apply_runtime_ops(&self, plan: &ChangePlan) -> Result<usize, RuntimeOpsError>;

    /// Persists the desired files without a reload, keeping `marker`.
    async fn persist(
        &self,
        desired: &Arc<RenderedConfig>,
        marker: &str,
        previous: &Arc<RenderedConfig>,
    ) -> Result<(), DeployError>;

    /// Writes every file and performs a confirmed reload.
    async fn reload_with(
        &self,
        desired: Arc<RenderedConfig>,
        desired_model: Arc<Config>,
        running: Option<&Deployed>,
        plan: ChangePlan,
    ) -> Result<Deployed, DeployError>;

    /// Deploys `desired` at once: [`decide`] then [`execute`], a refused runtime
    /// change reloading straight away. `running` is what the last deployment left
    /// (`None`: [`Driver::recover`] is asked); `desired_model` is parsed when not
    /// given, and a `haproxy.cfg` that does not parse fails the deployment with
    /// [`DeployError::Unparsable`].
    async fn deploy(
        &self,
        desired: Arc<RenderedConfig>,
        desired_model: Option<Arc<Config>>,
        running: Option<Arc<Deployed>>,
        drift_check: bool,
    ) -> Result<Deployed, DeployError> {
        deploy(self, desired, desired_model, running, drift_check).await
    }
}

/// See [`Driver::deploy`].
pub(crate) async fn deploy<D: Driver + ?Sized>(
    driver: &D,
    desired: Arc<RenderedConfig>,
    desired_model: Option<Arc<Config>>,
    running: Option<Arc<Deployed>>,
    drift_check: bool,
) -> Result<Deployed, DeployError> {
    let desired_model = match desired_model {
        Some(model) => model,
        None => hapwright_eventbus::model::haproxy::parse_main(&desired)?,
    };
    if let Some(started) = driver
        .start_if_stopped(&desired, &desired_model, running.as_ref())
        .await
    {
        return started;
    }
    let running = match running {
        Some(running) => Some(running),
        None => driver.recover(&desired).await?,
    };
    let decision = decide(
        driver,
        &desired,
        &desired_model,
        running.as_deref(),
        drift_check,
    )
    .await?;
    match execute(driver, &desired, &desired_model, running.as_ref(), decision).await? {
        Executed::Done(deployed) => Ok(deployed),
        Executed::RuntimeFailed { fallback } => {
            driver
                .reload_with(desired, desired_model, running.as_deref(), fallback)
                .await
        }
    }
}

/// What [`decide`] found.
#[derive(Clone, Debug)]
pub struct Decision {
    /// The plan.
    pub plan: ChangePlan,
    /// Set when the instance does not run what the deployer thought (a drift): the
    /// reload writes every file and keeps nothing of the old record.
    pub running_unknown: bool,
}

impl Decision {
    /// Whether carrying it out reloads the instance.
    pub fn reloads(&self) -> bool {
        self.plan.strategy() == DeployStrategy::Reload
    }
}

/// The plan that moves the instance from `running` (`None`: unknown) to `desired`;
/// `drift_check` first asks the instance whether it runs `running` at all.
pub async fn decide<D: Driver + ?Sized>(
    driver: &D,
    desired: &RenderedConfig,
    desired_model: &Config,
    running: Option<&Deployed>,
    drift_check: bool,
) -> Result<Decision, DeployError> {
    let Some(running) = running else {
        return Ok(Decision {
            plan: plan_against(None, desired, desired_model, &PlanOptions::default()),
            running_unknown: true,
        });
    };
    if drift_check && let Some(detail) = driver.check_drift(running).await? {
        return Ok(Decision {
            plan: ChangePlan::reload(ReloadReason::Drift, detail),
            running_unknown: true,
        });
    }
    let options = driver.plan_options().await;
    Ok(Decision {
        plan: plan_against(Some(running), desired, desired_model, &options),
        running_unknown: false,
    })
}

/// The plan [`decide`] makes once it knows what the instance runs (`None`: it cannot
/// be told, so the deployment reloads) and what the instance can do: the whole rule
/// set, without I/O. `hapwright plan` calls it with what it read from a config
/// directory or rendered from fixtures, so its verdict is the deployer's.
pub fn plan_against(
    running: Option<&Deployed>,
    desired: &RenderedConfig,
    desired_model: &Config,
    options: &PlanOptions,
) -> ChangePlan {
    match running {
        None => ChangePlan::reload(
            ReloadReason::FirstDeploy,
            "first deployment to this instance",
        ),
        Some(running) => plan::plan_with(
            &running.config,
            &running.model,
            desired,
            desired_model,
            options,
        ),
    }
}

/// What [`execute`] did.
#[derive(Debug)]
pub enum Executed {
    /// The instance runs the desired config.
    Done(Deployed),
    /// A runtime change was refused; nothing else was changed on the instance
    /// beyond the runtime changes before it. `fallback` is the reload that replaces
    /// the plan.
    RuntimeFailed {
        /// The reload to perform instead, its reason naming the refused change.
        fallback: ChangePlan,
    },
}

/// Carries out `plan` (from [`decide`]) on the instance.
pub async fn execute<D: Driver + ?Sized>(
    driver: &D,
    desired: &Arc<RenderedConfig>,
    desired_model: &Arc<Config>,
    running: Option<&Arc<Deployed>>,
    decision: Decision,
) -> Result<Executed, DeployError> {
    let Decision {
        plan,
        running_unknown,
    } = decision;
    let known = running.filter(|_| !running_unknown);
    let Some(running) = known else {
        let span = reload_span(&plan);
        return driver
            .reload_with(desired.clone(), desired_model.clone(), None, plan)
            .instrument(span)
            .await
            .map(Executed::Done);
    };
    let unchanged = |strategy, runtime_commands| Deployed {
        config: desired.clone(),
        model: desired_model.clone(),
        marker: running.marker.clone(),
        strategy,
        reason: plan.reason(),
        runtime_commands,
        at: SystemTime::now(),
    };
    match plan.strategy() {
        DeployStrategy::Noop => {
            if running.config.hash() != desired.hash() {
                driver
                    .persist(desired, &running.marker, &running.config)
                    .await?;
            }
            Ok(Executed::Done(unchanged(DeployStrategy::Noop, 0)))
        }
        DeployStrategy::Runtime => match driver
            .apply_runtime_ops(&plan)
            .instrument(tracing::info_span!(
                "runtime_batch",
                // Signed: trace exporters keep i64 fields as numbers.
                operations = i64::try_from(plan.ops.len()).unwrap_or(i64::MAX)
            ))
            .await
        {
            Ok(count) => {
                driver
                    .persist(desired, &running.marker, &running.config)
                    .await?;
                Ok(Executed::Done(unchanged(DeployStrategy::Runtime, count)))
            }
            Err(error) => {
                let detail = error.fallback_detail();
                tracing::warn!(instance = %driver.name(), class = ?error.class, %detail, "Runtime change failed; reloading instead");
                let mut fallback = ChangePlan::reload(ReloadReason::RuntimeFailed, detail);
                fallback.changed_servers = plan.changed_servers.clone();
                Ok(Executed::RuntimeFailed { fallback })
            }
        },
        DeployStrategy::Reload => {
            let span = reload_span(&plan);
            driver
                .reload_with(desired.clone(), desired_model.clone(), Some(running), plan)
                .instrument(span)
                .await
                .map(Executed::Done)
        }
    }
}

/// The span around one confirmed reload, named `reload` with the reload class and
/// its exact cause: trace views (and logs) show why the instance reloaded.
pub(crate) fn reload_span(plan: &ChangePlan) -> tracing::Span {
    let reason = plan.reason();
    tracing::info_span!(
        "reload",
        reason = reason.reload.map(ReloadReason::as_str),
        detail = %reason.detail,
    )
}
