//! Deployment metrics (DESIGN §4). Registered once per process with
//! [`Metrics::register`] and shared by every deployer iteration.

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};

use hapwright_eventbus::model::DeployStrategy;

/// The deployer's metrics.
#[derive(Clone, Debug)]
pub struct Metrics {
    deployments: IntCounterVec,
    duration: HistogramVec,
    reloads: IntCounterVec,
    runtime_commands: IntCounterVec,
    last_success: GaugeVec,
    in_sync: IntGaugeVec,
}

fn result(ok: bool) -> &'static str {
    if ok { "success" } else { "failure" }
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = Self::unregistered()?;
        registry.register(Box::new(metrics.deployments.clone()))?;
        registry.register(Box::new(metrics.duration.clone()))?;
        registry.register(Box::new(metrics.reloads.clone()))?;
        registry.register(Box::new(metrics.runtime_commands.clone()))?;
        registry.register(Box::new(metrics.last_success.clone()))?;
        registry.register(Box::new(metrics.in_sync.clone()))?;
        Ok(metrics)
    }

    /// Metrics registered nowhere (tests, benchmarks).
    pub fn unregistered() -> prometheus::Result<Self> {
        Ok(Self {
            deployments: IntCounterVec::new(
                Opts::new(
                    "hapwright_deployments_total",
                    "Deployments per instance, by strategy and result.",
                ),
                &["instance", "strategy", "result"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "hapwright_deployment_duration_seconds",
                    "Time to deploy a config to one instance.",
                )
                .buckets(vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0,
                ]),
                &["instance"],
            )?,
            reloads: IntCounterVec::new(
                Opts::new(
                    "hapwright_reloads_total",
                    "HAProxy reloads per instance, by result and reason.",
                ),
                &["instance", "result", "reason"],
            )?,
            runtime_commands: IntCounterVec::new(
                Opts::new(
                    "hapwright_runtime_commands_total",
                    "Runtime API changes per instance, by object and result.",
                ),
                &["instance", "object", "result"],
            )?,
            last_success: GaugeVec::new(
                Opts::new(
                    "hapwright_last_successful_deployment_timestamp_seconds",
                    "Unix time of the last successful deployment per instance.",
                ),
                &["instance"],
            )?,
            in_sync: IntGaugeVec::new(
                Opts::new(
                    "hapwright_instance_in_sync",
                    "1 when the instance runs the desired config, 0 otherwise.",
                ),
                &["instance"],
            )?,
        })
    }

    /// Records one deployment's outcome and duration.
    pub fn deployment(&self, instance: &str, strategy: DeployStrategy, ok: bool, seconds: f64) {
        self.deployments
            .with_label_values(&[instance, strategy.as_str(), result(ok)])
            .inc();
        self.duration
            .with_label_values(&[instance])
            .observe(seconds);
        if ok {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.last_success.with_label_values(&[instance]).set(now);
        }
        self.in_sync
            .with_label_values(&[instance])
            .set(i64::from(ok));
    }

    /// Records one reload attempt.
    pub fn reload(&self, instance: &str, ok: bool, reason: &str) {
        self.reloads
            .with_label_values(&[instance, result(ok), reason])
            .inc();
    }

    /// Records one runtime change (`object`: `server`, `map`, `acl`, `certificate`).
    pub fn runtime_command(&self, instance: &str, object: &str, ok: bool) {
        self.runtime_commands
            .with_label_values(&[instance, object, result(ok)])
            .inc();
    }

    /// Marks an instance as out of sync (a newer config is waiting for it).
    pub fn out_of_sync(&self, instance: &str) {
        self.in_sync.with_label_values(&[instance]).set(0);
    }
}
