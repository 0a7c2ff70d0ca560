//! The deployment decision both drivers share, once the driver knows what the
//! instance runs: a first deployment or a found drift reloads; otherwise the
//! [`ChangePlan`] between the running and the desired config decides between a no-op,
//! runtime changes (then the files are persisted without a reload, keeping the running
//! version marker) and a reload. A runtime change that fails falls back to a reload
//! (reason `runtime_failed`) whose detail says how it failed: refused by HAProxy, the
//! runtime API unreachable, a broken exchange, or requests in flight that did not
//! drain in time. The reload rebuilds every server, map and certificate from the
//! files, so a change left half-done is finished by it.
//!
//! The drivers supply the steps ([`Steps`]): the socket driver through the runtime API,
//! the master CLI and the config directory; the Data Plane driver through its API.

use std::sync::Arc;
use std::time::SystemTime;

use hapwright_eventbus::model::{DeployStrategy, ReloadReason, RenderedConfig};

use crate::driver::{DeployError, Deployed};
use crate::haproxy_config::Config;
use crate::plan::{self, ChangePlan};
use crate::runtime::RuntimeFailure;

/// A runtime change that failed, as both drivers report it: which change, how it
/// failed, and the underlying error.
#[derive(Debug, thiserror::Error)]
#[error("{op}")]
pub struct RuntimeOpsError {
    /// The change ([`RuntimeOp::describe`](crate::plan::RuntimeOp::describe)).
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

/// What a driver does for each step of a deployment.
#[async_trait::async_trait]
pub(crate) trait Steps: Sync {
    /// The instance's name, for logs.
    fn instance_name(&self) -> &str;

    /// `None` when the instance runs `running`, otherwise what differs.
    async fn find_drift(&self, running: &Deployed) -> Result<Option<String>, DeployError>;

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
}

/// Deploys `desired` to an instance that runs `running` (`None`: unknown, so the
/// first deployment reloads); `drift_check` first compares what the instance runs.
pub(crate) async fn deploy<S: Steps + ?Sized>(
    steps: &S,
    desired: Arc<RenderedConfig>,
    desired_model: Arc<Config>,
    running: Option<Arc<Deployed>>,
    drift_check: bool,
) -> Result<Deployed, DeployError> {
    let Some(running) = running else {
        let plan = ChangePlan::reload(
            ReloadReason::FirstDeploy,
            "first deployment to this instance",
        );
        return steps.reload_with(desired, desired_model, None, plan).await;
    };
    if drift_check && let Some(detail) = steps.find_drift(&running).await? {
        let plan = ChangePlan::reload(ReloadReason::Drift, detail);
        // What the instance holds is not what `running` says: write every file.
        return steps.reload_with(desired, desired_model, None, plan).await;
    }
    let plan = plan::plan(&running.config, &running.model, &desired, &desired_model);
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
                steps
                    .persist(&desired, &running.marker, &running.config)
                    .await?;
            }
            Ok(unchanged(DeployStrategy::Noop, 0))
        }
        DeployStrategy::Runtime => match steps.apply_runtime_ops(&plan).await {
            Ok(count) => {
                steps
                    .persist(&desired, &running.marker, &running.config)
                    .await?;
                Ok(unchanged(DeployStrategy::Runtime, count))
            }
            Err(error) => {
                let detail = error.fallback_detail();
                tracing::warn!(instance = %steps.instance_name(), class = ?error.class, %detail, "Runtime change failed; reloading instead");
                let mut fallback = ChangePlan::reload(ReloadReason::RuntimeFailed, detail);
                fallback.changed_servers = plan.changed_servers.clone();
                steps
                    .reload_with(desired, desired_model, Some(&running), fallback)
                    .await
            }
        },
        DeployStrategy::Reload => {
            steps
                .reload_with(desired, desired_model, Some(&running), plan)
                .await
        }
    }
}
