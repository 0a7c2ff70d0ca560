//! The deployment decision both drivers share, once the driver knows what the
//! instance runs: a first deployment or a found drift reloads; otherwise the
//! [`ChangePlan`] between the running and the desired config decides between a no-op,
//! runtime changes (then the files are persisted without a reload, keeping the running
//! version marker) and a reload. A runtime change the instance refuses falls back to a
//! reload whose reason names the refused change.
//!
//! The drivers supply the steps ([`Steps`]): the socket driver through the runtime API,
//! the master CLI and the config directory; the Data Plane driver through its API.

use std::sync::Arc;
use std::time::SystemTime;

use hapwright_eventbus::model::{DeployStrategy, ReloadReason, RenderedConfig};

use crate::driver::{DeployError, Deployed};
use crate::haproxy_config::Config;
use crate::plan::{self, ChangePlan};

/// What a driver does for each step of a deployment.
#[async_trait::async_trait]
pub(crate) trait Steps: Sync {
    /// The instance's name, for logs.
    fn instance_name(&self) -> &str;

    /// `None` when the instance runs `running`, otherwise what differs.
    async fn find_drift(&self, running: &Deployed) -> Result<Option<String>, DeployError>;

    /// Applies the plan's runtime operations in order: how many, or what was refused.
    async fn apply_runtime_ops(&self, plan: &ChangePlan) -> Result<usize, String>;

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
            Err(detail) => {
                tracing::warn!(instance = %steps.instance_name(), %detail, "Runtime change refused; reloading instead");
                let mut fallback = ChangePlan::reload(
                    ReloadReason::Structure,
                    format!("runtime change refused ({detail})"),
                );
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
