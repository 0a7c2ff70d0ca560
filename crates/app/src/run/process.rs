//! What lives as long as the process: the metrics registry and every metric set,
//! the status store, the managed HAProxy supervisor, the last deployed state per
//! instance, the quarantine and safety-valve memories, the Kubernetes client and
//! the leader election (set up once, so a reinit never drops leadership).

use hapwright_deployer::component::deployer::LastDeployedStore;
use hapwright_deployer::component::validator;
use hapwright_deployer::driver::managed::ManagedHaproxy;
use hapwright_deployer::metrics::Metrics as DeployerMetrics;
use hapwright_deployer::version_check::VersionCheck;
use hapwright_eventbus::{BusMetrics, KernelMetrics};
use hapwright_reconciler::quarantine;
use hapwright_watchers::http::HttpSourceMetrics;
use hapwright_watchers::kubernetes::{
    ClientFactory, DiscoveryMetrics, LeaderElection, LeaderElectionConfig, LeaderMetrics,
};
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

use crate::config::{self, Loaded};
use crate::status::{StatusMetrics, StatusStore};
use crate::telemetry;
use crate::webhook;

/// Metrics of the reinit loop itself.
#[derive(Clone, Debug)]
pub(super) struct ReloadMetrics {
    reloads: IntCounterVec,
    last_successful: IntGauge,
}

impl ReloadMetrics {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let reloads = IntCounterVec::new(
            Opts::new(
                "hapwright_config_reloads_total",
                "Controller config reload attempts (file change, SIGHUP, POST /-/reload).",
            ),
            &["result"],
        )?;
        let last_successful = IntGauge::new(
            "hapwright_config_last_reload_successful",
            "1 when the last controller config reload attempt succeeded.",
        )?;
        registry.register(Box::new(reloads.clone()))?;
        registry.register(Box::new(last_successful.clone()))?;
        for result in ["success", "failure"] {
            reloads.with_label_values(&[result]);
        }
        last_successful.set(1);
        Ok(Self {
            reloads,
            last_successful,
        })
    }

    pub(super) fn record(&self, success: bool) {
        let result = if success { "success" } else { "failure" };
        self.reloads.with_label_values(&[result]).inc();
        self.last_successful.set(i64::from(success));
    }
}

/// Everything that lives as long as the process.
pub(super) struct Process {
    pub(super) registry: Registry,
    pub(super) store: StatusStore,
    pub(super) bus_metrics: BusMetrics,
    pub(super) kernel_metrics: KernelMetrics,
    pub(super) status_metrics: StatusMetrics,
    pub(super) status_write_metrics: hapwright_watchers::kubernetes::StatusMetrics,
    pub(super) validator_metrics: validator::Metrics,
    pub(super) deployer_metrics: DeployerMetrics,
    pub(super) reload_metrics: ReloadMetrics,
    pub(super) discovery_metrics: DiscoveryMetrics,
    pub(super) http_source_metrics: HttpSourceMetrics,
    pub(super) webhook_metrics: webhook::Metrics,
    /// The latest snapshots the admission webhook validates against, kept across
    /// iterations so a config reload does not leave it without objects.
    pub(super) webhook_current: webhook::Current,
    /// The webhook engine of the running iteration, read by the webhook listener.
    pub(super) webhook_slot: webhook::Slot,
    pub(super) deployed: LastDeployedStore,
    /// The last validated snapshots, for the quarantine search after a reload.
    pub(super) last_good: quarantine::LastGood,
    /// The quarantine kept beside the deployed files, read back once per process.
    pub(super) quarantine: quarantine::Kept,
    /// What the safety valve measures against, across reloads.
    pub(super) safety: hapwright_deployer::safety::Memory,
    pub(super) managed: ManagedHaproxy,
    /// The instances' HAProxy versions against the validator's.
    pub(super) versions: VersionCheck,
    /// The Kubernetes client, built on first use and shared by every iteration.
    pub(super) kube: ClientFactory,
    /// Leader election, when `controller.leaderElection.enabled`: set up once, so
    /// leadership survives config reinits.
    pub(super) leader: Option<LeaderElection>,
    /// The `leaderElection` section the election was started with.
    pub(super) leader_config: config::LeaderElection,
    /// The `tracing` section the trace exporter was set up with (once per process).
    pub(super) tracing_config: Option<config::Tracing>,
}

impl Process {
    pub(super) fn new(loaded: &Loaded) -> prometheus::Result<Self> {
        let registry = telemetry::registry();
        let kube = ClientFactory::from_environment();
        let election = &loaded.config.controller.leader_election;
        let leader_metrics = LeaderMetrics::register(&registry)?;
        Ok(Self {
            bus_metrics: BusMetrics::register(&registry)?,
            kernel_metrics: KernelMetrics::register(&registry)?,
            status_metrics: StatusMetrics::register(&registry)?,
            status_write_metrics: hapwright_watchers::kubernetes::StatusMetrics::register(
                &registry,
            )?,
            validator_metrics: validator::Metrics::register(&registry)?,
            deployer_metrics: DeployerMetrics::register(&registry)?,
            versions: VersionCheck::register(&registry)?,
            reload_metrics: ReloadMetrics::register(&registry)?,
            discovery_metrics: DiscoveryMetrics::register(&registry)?,
            http_source_metrics: HttpSourceMetrics::register(&registry)?,
            webhook_metrics: webhook::Metrics::register(&registry)?,
            webhook_current: webhook::Current::new(),
            webhook_slot: webhook::Slot::default(),
            store: StatusStore::default(),
            deployed: LastDeployedStore::new(),
            last_good: quarantine::LastGood::new(),
            quarantine: {
                let faults = hapwright_deployer::haproxy::files::Faults::from_env();
                quarantine::Kept::new().with_pause(std::sync::Arc::new(move |step: &str| {
                    faults.reached(step);
                }))
            },
            safety: hapwright_deployer::safety::Memory::new(),
            managed: ManagedHaproxy::new(loaded.config.haproxy.binary.clone()),
            kube: kube.clone(),
            leader: if election.enabled {
                Some(LeaderElection::start(
                    LeaderElectionConfig::new(&election.lease_name, election.namespace.clone()),
                    kube,
                    Some(leader_metrics),
                ))
            } else {
                leader_metrics.set_always_leader();
                None
            },
            leader_config: election.clone(),
            tracing_config: loaded.config.controller.tracing.clone(),
            registry,
        })
    }

    /// The is-leader channel for the deployer (and its drift checks); `None` when every
    /// replica deploys (leader election off).
    pub(super) fn leadership(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.leader.as_ref().map(LeaderElection::subscribe)
    }
}
