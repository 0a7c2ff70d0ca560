//! The drift monitor (DESIGN §3): every `driftPreventionInterval` it checks each
//! instance of the [`Fleet`] that hapwright deployed to against what it deployed —
//! the running config's version marker (`HAPWRIGHT_CONFIG_VERSION`) and the files
//! (socket instances), or the configuration version and, when that moved, the
//! fetched raw configuration (Data Plane API instances). A difference publishes
//! `DriftDetected { instance, detail }` and counts
//! `hapwright_drift_detected_total{instance}`; the scheduler then re-deploys with a
//! drift check, which reloads the instance onto the desired config (reason `drift`).
//!
//! With a leadership gate ([`DriftMonitor::with_leadership`]) only the leader checks.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hapwright_eventbus::{Component, ComponentError, Context, DriftDetected};

use crate::deployer::LastDeployedStore;
use crate::fleet::Fleet;
use crate::metrics::Metrics;

/// Settings of the drift monitor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Time between two checks of the fleet.
    pub interval: Duration,
    /// Deadline of one instance's check.
    pub check_timeout: Duration,
    /// Instances checked at the same time.
    pub concurrency: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            check_timeout: Duration::from_secs(10),
            concurrency: 8,
        }
    }
}

impl From<&crate::config::Timings> for Config {
    fn from(timings: &crate::config::Timings) -> Self {
        Self {
            interval: timings.drift_prevention_interval.get(),
            ..Self::default()
        }
    }
}

/// The drift monitor component.
#[derive(Debug)]
pub struct DriftMonitor {
    config: Config,
    fleet: Fleet,
    store: LastDeployedStore,
    metrics: Metrics,
    leader: Option<tokio::sync::watch::Receiver<bool>>,
}

impl DriftMonitor {
    /// The component's name.
    pub const NAME: &'static str = "drift";

    /// A monitor over `fleet` (usually [`Deployer::fleet`](crate::deployer::Deployer::fleet))
    /// comparing with what `store` says was deployed.
    pub fn new(config: Config, fleet: Fleet, store: LastDeployedStore, metrics: Metrics) -> Self {
        Self {
            config,
            fleet,
            store,
            metrics,
            leader: None,
        }
    }

    /// Checks only while `leader` holds `true`.
    #[must_use]
    pub fn with_leadership(mut self, leader: tokio::sync::watch::Receiver<bool>) -> Self {
        self.leader = Some(leader);
        self
    }

    /// Checks every instance once; returns the drifted ones with what differs (and
    /// publishes nothing). Instances hapwright has not deployed to are skipped (the
    /// deployer's retries cover them); an unreachable one is logged and skipped.
    pub async fn check_all(&self) -> Vec<(String, String)> {
        let drivers = self.fleet.drivers();
        let found: Vec<Option<(String, String)>> = futures::stream::iter(drivers)
            .map(|driver| async move {
                let name = driver.name().to_owned();
                let deployed = self.store.deployed(&name)?;
                match tokio::time::timeout(
                    self.config.check_timeout,
                    driver.check_drift(&deployed),
                )
                .await
                {
                    Ok(Ok(Some(detail))) => Some((name, detail)),
                    Ok(Ok(None)) => None,
                    Ok(Err(error)) => {
                        tracing::warn!(instance = %name, error = %error.to_diagnostic().message, "Drift check failed");
                        None
                    }
                    Err(_) => {
                        tracing::warn!(instance = %name, timeout = ?self.config.check_timeout, "Drift check timed out");
                        None
                    }
                }
            })
            .buffer_unordered(self.config.concurrency.max(1))
            .collect()
            .await;
        let mut drifted: Vec<(String, String)> = found.into_iter().flatten().collect();
        drifted.sort();
        drifted
    }
}

#[async_trait::async_trait]
impl Component for DriftMonitor {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn provides(&self) -> Vec<String> {
        vec![Self::NAME.to_owned()]
    }

    async fn run(self: Box<Self>, ctx: Context) -> Result<(), ComponentError> {
        let monitor = Arc::new(*self);
        let start = tokio::time::Instant::now() + monitor.config.interval;
        let mut tick = tokio::time::interval_at(start, monitor.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ctx.health().healthy();
        loop {
            tokio::select! {
                biased;
                () = ctx.cancelled() => return Ok(()),
                _ = tick.tick() => {}
            }
            if monitor.leader.as_ref().is_some_and(|l| !*l.borrow()) {
                continue;
            }
            let span = tracing::debug_span!("drift_check");
            let drifted = tracing::Instrument::instrument(monitor.check_all(), span).await;
            for (instance, detail) in drifted {
                tracing::warn!(instance = %instance, %detail, "Drift detected; re-deploying");
                monitor.metrics.drift_detected(&instance);
                monitor.metrics.out_of_sync(&instance);
                ctx.publisher().publish(DriftDetected { instance, detail });
            }
        }
    }
}
