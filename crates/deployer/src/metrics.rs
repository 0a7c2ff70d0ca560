//! Deployment metrics. Registered once per process with
//! [`Metrics::register`] and shared by every deployer iteration.

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};

use hapwright_eventbus::model::{DeployStrategy, ReloadReason};

/// Every reload reason, so each instance's `reloads_total` series exist from the start.
const RELOAD_REASONS: [ReloadReason; 7] = [
    ReloadReason::FirstDeploy,
    ReloadReason::Structure,
    ReloadReason::ServerOptions,
    ReloadReason::NewFile,
    ReloadReason::Drift,
    ReloadReason::Restart,
    ReloadReason::RuntimeFailed,
];

/// The objects runtime commands change (the `object` label).
const RUNTIME_OBJECTS: [&str; 6] = ["server", "map", "acl", "certificate", "crt_list", "backend"];

/// The deployer's metrics.
#[derive(Clone, Debug)]
pub struct Metrics {
    deployments: IntCounterVec,
    duration: HistogramVec,
    reloads: IntCounterVec,
    runtime_commands: IntCounterVec,
    last_success: GaugeVec,
    in_sync: IntGaugeVec,
    drift: IntCounterVec,
    restore_failures: IntCounterVec,
    state_file_refused: IntCounterVec,
    insecure: IntGaugeVec,
    refused: IntCounterVec,
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
        registry.register(Box::new(metrics.drift.clone()))?;
        registry.register(Box::new(metrics.restore_failures.clone()))?;
        registry.register(Box::new(metrics.state_file_refused.clone()))?;
        registry.register(Box::new(metrics.insecure.clone()))?;
        registry.register(Box::new(metrics.refused.clone()))?;
        for reason in [
            "insecure_http",
            "invalid_address",
            "socket_instance",
            "client_failed",
        ] {
            metrics.refused.with_label_values(&[reason]);
        }
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
                    "Runtime API commands sent per instance, by object and result (one \
                     change can take several commands: a server address change counts 2).",
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
            drift: IntCounterVec::new(
                Opts::new(
                    "hapwright_drift_detected_total",
                    "Times a drift check found an instance running another config than deployed.",
                ),
                &["instance"],
            )?,
            restore_failures: IntCounterVec::new(
                Opts::new(
                    "hapwright_file_restore_failures_total",
                    "Times the last good files could not be put back after a failed deployment; \
                     the config directory then holds files HAProxy does not run.",
                ),
                &["instance"],
            )?,
            state_file_refused: IntCounterVec::new(
                Opts::new(
                    "hapwright_server_state_file_refused_total",
                    "Reloads whose server-state-file path lay outside the instance's config \
                     directory (or could not be checked), so no server state was saved.",
                ),
                &["instance"],
            )?,
            insecure: IntGaugeVec::new(
                Opts::new(
                    "hapwright_instance_insecure_transport",
                    "1 for a discovered instance reached over plain http across the network \
                     (allowInsecureHttp), 0 for https or loopback.",
                ),
                &["instance"],
            )?,
            refused: IntCounterVec::new(
                Opts::new(
                    "hapwright_discovered_instances_refused_total",
                    "Discovered instances refused before anything was sent to them, by reason \
                     (insecure_http, invalid_address, socket_instance, client_failed).",
                ),
                &["reason"],
            )?,
        })
    }

    /// Creates every counter series of `instance` at 0 (deployments by strategy and
    /// result, reloads by result and reason, runtime commands by object and result,
    /// drift, restore failures, refused state files), so `increase()` and `rate()`
    /// alerts see the first event instead of a series that appears already at 1.
    pub fn instance_known(&self, instance: &str) {
        for ok in [true, false] {
            for strategy in [
                DeployStrategy::Noop,
                DeployStrategy::Runtime,
                DeployStrategy::Reload,
            ] {
                self.deployments
                    .with_label_values(&[instance, strategy.as_str(), result(ok)]);
            }
            for reason in RELOAD_REASONS {
                self.reloads
                    .with_label_values(&[instance, result(ok), reason.as_str()]);
            }
            for object in RUNTIME_OBJECTS {
                self.runtime_commands
                    .with_label_values(&[instance, object, result(ok)]);
            }
        }
        self.drift.with_label_values(&[instance]);
        self.restore_failures.with_label_values(&[instance]);
        self.state_file_refused.with_label_values(&[instance]);
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

    /// Records one drift found on `instance`.
    pub fn drift_detected(&self, instance: &str) {
        self.drift.with_label_values(&[instance]).inc();
    }

    /// Records a failed restore of the last good files on `instance`.
    pub fn restore_failed(&self, instance: &str) {
        self.restore_failures.with_label_values(&[instance]).inc();
    }

    /// Records a server state file not written because its path was refused.
    pub fn state_file_refused(&self, instance: &str) {
        self.state_file_refused.with_label_values(&[instance]).inc();
    }

    /// Refused server state file paths recorded for `instance` (tests, status).
    pub fn state_file_refused_count(&self, instance: &str) -> u64 {
        self.state_file_refused.with_label_values(&[instance]).get()
    }

    /// Failed restores recorded for `instance` (tests, status).
    pub fn restore_failure_count(&self, instance: &str) -> u64 {
        self.restore_failures.with_label_values(&[instance]).get()
    }

    /// Drift detections recorded for `instance` (tests, status).
    pub fn drift_count(&self, instance: &str) -> u64 {
        self.drift.with_label_values(&[instance]).get()
    }

    /// Records how a discovered instance is reached: `insecure` when plain http
    /// crosses the network.
    pub fn transport(&self, instance: &str, insecure: bool) {
        self.insecure
            .with_label_values(&[instance])
            .set(i64::from(insecure));
    }

    /// Whether `instance` is marked as reached over plain http across the network
    /// (tests, status).
    pub fn insecure_transport(&self, instance: &str) -> bool {
        self.insecure.with_label_values(&[instance]).get() == 1
    }

    /// Counts one discovered instance refused for `reason`.
    pub fn refused(&self, reason: &str) {
        self.refused.with_label_values(&[reason]).inc();
    }

    /// Discovered instances refused for `reason` so far (tests, status).
    pub fn refused_count(&self, reason: &str) -> u64 {
        self.refused.with_label_values(&[reason]).get()
    }

    /// Drops every series labelled with `instance` (a discovered instance that went
    /// away), so removed pods do not linger in `/metrics`.
    pub fn forget(&self, instance: &str) {
        let labels: std::collections::HashMap<&str, &str> =
            std::iter::once(("instance", instance)).collect();
        let _ = self.duration.remove(&labels);
        let _ = self.last_success.remove(&labels);
        let _ = self.in_sync.remove(&labels);
        let _ = self.drift.remove(&labels);
        let _ = self.state_file_refused.remove(&labels);
        let _ = self.restore_failures.remove(&labels);
        let _ = self.insecure.remove(&labels);
        for vec in [&self.deployments, &self.reloads, &self.runtime_commands] {
            for family in prometheus::core::Collector::collect(vec) {
                for metric in family.get_metric() {
                    let pairs = metric.get_label();
                    if pairs
                        .iter()
                        .any(|p| p.name() == "instance" && p.value() == instance)
                    {
                        let values: std::collections::HashMap<&str, &str> =
                            pairs.iter().map(|p| (p.name(), p.value())).collect();
                        let _ = vec.remove(&values);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_of_a_known_instance_start_at_zero() {
        let registry = Registry::new();
        let metrics = Metrics::register(&registry).unwrap();
        metrics.instance_known("edge");
        let series = |name: &str, labels: &[(&str, &str)]| -> Option<f64> {
            registry
                .gather()
                .into_iter()
                .filter(|family| family.name() == name)
                .flat_map(|family| family.get_metric().to_vec())
                .find(|metric| {
                    labels.iter().all(|(k, v)| {
                        metric
                            .get_label()
                            .iter()
                            .any(|p| p.name() == *k && p.value() == *v)
                    })
                })
                .map(|metric| metric.get_counter().get_value())
        };
        let edge = ("instance", "edge");
        let failure = ("result", "failure");
        assert_eq!(series("hapwright_drift_detected_total", &[edge]), Some(0.0));
        assert_eq!(
            series(
                "hapwright_deployments_total",
                &[edge, ("strategy", "reload"), failure]
            ),
            Some(0.0)
        );
        assert_eq!(
            series(
                "hapwright_reloads_total",
                &[edge, ("reason", "structure"), failure]
            ),
            Some(0.0)
        );
        assert_eq!(
            series(
                "hapwright_runtime_commands_total",
                &[edge, ("object", "server"), failure]
            ),
            Some(0.0)
        );
        assert_eq!(
            series("hapwright_file_restore_failures_total", &[edge]),
            Some(0.0)
        );
    }

    #[test]
    fn forgetting_an_instance_drops_its_series() {
        let registry = Registry::new();
        let metrics = Metrics::register(&registry).unwrap();
        for instance in ["gone", "kept"] {
            metrics.deployment(instance, DeployStrategy::Reload, true, 0.1);
            metrics.reload(instance, true, "first_deploy");
            metrics.runtime_command(instance, "server", false);
            metrics.drift_detected(instance);
        }
        assert_eq!(metrics.drift_count("gone"), 1);
        metrics.forget("gone");
        let mut seen = std::collections::BTreeSet::new();
        for family in registry.gather() {
            for metric in family.get_metric() {
                for label in metric.get_label() {
                    if label.name() == "instance" {
                        seen.insert((family.name().to_owned(), label.value().to_owned()));
                    }
                }
            }
        }
        assert!(seen.iter().all(|(_, i)| i == "kept"), "{seen:?}");
        assert!(seen.contains(&(
            "hapwright_drift_detected_total".to_owned(),
            "kept".to_owned()
        )));
        assert!(seen.contains(&("hapwright_reloads_total".to_owned(), "kept".to_owned())));
    }
}
