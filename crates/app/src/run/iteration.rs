//! One iteration: a fresh bus, the components of one valid configuration, one
//! kernel; started from a candidate and stopped within a grace period.

use std::time::Duration;

use hapwright_deployer::component::validator;
use hapwright_eventbus::{Bus, BusConfig, Kernel, RunningKernel};

use super::assembly::Assembly;
use super::candidate::Candidate;
use super::process::Process;
use crate::build;
use crate::config::{self, ConfigWatcher};

/// One running iteration.
pub(super) struct Iteration {
    pub(super) kernel: RunningKernel,
    /// What the config watcher of this iteration found.
    pub(super) config_changes: tokio::sync::mpsc::UnboundedReceiver<config::ConfigChange>,
}

impl Iteration {
    /// Builds every component of `candidate` on a fresh bus and starts them.
    pub(super) fn start(
        process: &Process,
        candidate: Candidate,
        generation: u64,
    ) -> anyhow::Result<Self> {
        let Candidate { loaded, renderer } = candidate;
        let config = &loaded.config;
        let bus = Bus::new(BusConfig::default(), &process.bus_metrics);
        let (changes, config_changes) = tokio::sync::mpsc::unbounded_channel();
        let kernel = Kernel::new(bus)
            .with_metrics(process.kernel_metrics.clone())
            .with_generation(generation);
        process.store.set_health(kernel.health());
        let mut parts = Assembly {
            kernel,
            process,
            loaded: &loaded,
            validation: validator::Service::new(build::validator_config(config)),
        };
        parts.kernel.register(ConfigWatcher::new(&loaded, changes));
        process
            .managed
            .set_hard_stop_after(config.haproxy.hard_stop_after.get());
        warn_of_restart_only_changes(process, config);
        parts.sources()?;
        parts.discovery();
        let status_templates = parts.reconciler(renderer)?;
        parts.statuses(status_templates);
        parts.webhook()?;
        parts.deployment()?;
        parts.recorders();

        let kernel = parts.kernel.start()?;
        tracing::info!(generation, components = ?kernel.order(), "Controller iteration started");
        Ok(Self {
            kernel,
            config_changes,
        })
    }

    pub(super) async fn stop(self, grace: Duration) {
        let report = self.kernel.shutdown(grace).await;
        if !report.aborted.is_empty() {
            tracing::warn!(aborted = ?report.aborted, "Some components were aborted at the deadline");
        }
    }
}

/// Sections that take effect only when hapwright restarts.
fn warn_of_restart_only_changes(process: &Process, config: &config::Config) {
    if config.controller.leader_election != process.leader_config {
        tracing::warn!(
            "controller.leaderElection changed; the change takes effect when hapwright restarts"
        );
    }
    if config.controller.tracing != process.tracing_config {
        tracing::warn!(
            "controller.tracing changed; the change takes effect when hapwright restarts"
        );
    }
}
