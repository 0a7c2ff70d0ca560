//! `hapwright run`: the reinit loop.
//!
//! Each valid configuration runs as one *iteration*: a fresh bus, fresh components,
//! one kernel. A new configuration (the file or a password file changed, SIGHUP,
//! `POST /-/reload`) is loaded and fully checked — YAML, semantics, template
//! compilation — while the old iteration keeps running. Only a valid one replaces it:
//! the old kernel is cancelled within a deadline and a new one is built.
//!
//! A mandatory component that exits outside shutdown (returns, fails or panics) gets
//! the same treatment: components cannot be rebuilt one by one (`run` consumes the
//! component, and subscriptions are fixed when the bus starts), so the whole
//! iteration is rebuilt from the running config after a [`RestartBackoff`] delay
//! (1 s doubling to 60 s; a run of 2 min resets it). The failed iteration keeps
//! running meanwhile, so its healthy components go on deploying. Every restart is
//! logged with the reason and counted in `hapwright_component_restarts_total`.
//!
//! What outlives iterations: the metrics registry, the HTTP listeners
//! (rebound only when `controller.listen` or `metricsListen` change), the managed
//! HAProxy processes, the status store and the last deployed state per instance — so
//! an unchanged render after a reinit is a no-op, not a reload. The Kubernetes client
//! and leader election (`controller.leaderElection`) outlive iterations too, so a
//! reinit never drops leadership; at shutdown the leader releases its Lease.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::client::dataplane;
use hapwright_deployer::component::deployer::{self as deploy, Deployer, LastDeployedStore};
use hapwright_deployer::component::scheduler::{self, Scheduler};
use hapwright_deployer::component::validator::{self, Validator};
use hapwright_deployer::driver::fleet;
use hapwright_deployer::driver::managed::ManagedHaproxy;
use hapwright_deployer::metrics::Metrics as DeployerMetrics;
use hapwright_deployer::version_check::VersionCheck;
use hapwright_eventbus::model::Diagnostic;
use hapwright_eventbus::{
    Bus, BusConfig, BusMetrics, ComponentFailure, Kernel, KernelMetrics, ReloadRequested,
    ReloadSource, RestartBackoff, RunningKernel,
};
use hapwright_reconciler::debouncer::{self, Debouncer};
use hapwright_reconciler::executor::{self, Executor};
use hapwright_reconciler::quarantine;
use hapwright_reconciler::renderer::{QuarantineSettings, Renderer, RendererComponent};
use hapwright_reconciler::status::{StatusComponent, StatusTemplates};
use hapwright_watchers::config::Source;
use hapwright_watchers::files::FilesSource;
use hapwright_watchers::http::{HttpSource, HttpSourceMetrics};
use hapwright_watchers::kubernetes::discovery::DEFAULT_DATAPLANE_CONTAINER;
use hapwright_watchers::kubernetes::{
    ClientFactory, DiscoveryConfig, DiscoveryMetrics, KubernetesSource, LeaderElection,
    LeaderElectionConfig, LeaderMetrics, PodDiscovery, QuarantineEvents, Restriction, StatusWriter,
    WatchedKind,
};
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::build;
use crate::commands::print_errors;
use crate::config::{self, ConfigWatcher, Loaded};
use crate::http::{
    self, HttpServer, HttpState, Limits, ReloadHandle, ReloadOutcome, ReloadRequest,
};
use crate::status::{ConfigStatus, EventLog, StatusMetrics, StatusRecorder, StatusStore};
use crate::telemetry;
use crate::webhook;

/// Exit codes.
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// The checked thing failed (or the controller could not run).
    pub const FAILURE: u8 = 1;
    /// Usage or config error.
    pub const CONFIG: u8 = 2;
}

/// Grace period for stopping an iteration's components.
const ITERATION_GRACE: Duration = Duration::from_secs(10);

/// Metrics of the reinit loop itself.
#[derive(Clone, Debug)]
struct ReloadMetrics {
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

    fn record(&self, success: bool) {
        let result = if success { "success" } else { "failure" };
        self.reloads.with_label_values(&[result]).inc();
        self.last_successful.set(i64::from(success));
    }
}

/// Everything that lives as long as the process.
struct Process {
    registry: Registry,
    store: StatusStore,
    bus_metrics: BusMetrics,
    kernel_metrics: KernelMetrics,
    status_metrics: StatusMetrics,
    status_write_metrics: hapwright_watchers::kubernetes::StatusMetrics,
    validator_metrics: validator::Metrics,
    deployer_metrics: DeployerMetrics,
    reload_metrics: ReloadMetrics,
    discovery_metrics: DiscoveryMetrics,
    http_source_metrics: HttpSourceMetrics,
    webhook_metrics: webhook::Metrics,
    /// The latest snapshots the admission webhook validates against, kept across
    /// iterations so a config reload does not leave it without objects.
    webhook_current: webhook::Current,
    /// The webhook engine of the running iteration, read by the webhook listener.
    webhook_slot: webhook::Slot,
    deployed: LastDeployedStore,
    /// The last validated snapshots, for the quarantine search after a reload.
    last_good: quarantine::LastGood,
    /// The quarantine kept beside the deployed files, read back once per process.
    quarantine: quarantine::Kept,
    /// What the safety valve measures against, across reloads.
    safety: hapwright_deployer::safety::Memory,
    managed: ManagedHaproxy,
    /// The instances' HAProxy versions against the validator's.
    versions: VersionCheck,
    /// The Kubernetes client, built on first use and shared by every iteration.
    kube: ClientFactory,
    /// Leader election, when `controller.leaderElection.enabled`: set up once, so
    /// leadership survives config reinits.
    leader: Option<LeaderElection>,
    /// The `leaderElection` section the election was started with.
    leader_config: config::LeaderElection,
    /// The `tracing` section the trace exporter was set up with (once per process).
    tracing_config: Option<config::Tracing>,
}

impl Process {
    fn new(loaded: &Loaded) -> prometheus::Result<Self> {
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
    fn leadership(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.leader.as_ref().map(LeaderElection::subscribe)
    }
}

/// A candidate configuration that passed every check, ready to replace the running one.
struct Candidate {
    loaded: Loaded,
    renderer: Renderer,
}

/// Loads and checks a config completely, without touching what runs.
fn prepare(loaded: Loaded) -> Result<Candidate, Vec<Diagnostic>> {
    let mut problems = Vec::new();
    let renderer = match build::renderer(&loaded.config) {
        Ok(renderer) => {
            for warning in loaded.templates_at.locate(renderer.warnings().to_vec()) {
                tracing::warn!(%warning, "Template warning");
            }
            Some(renderer)
        }
        Err(errors) => {
            problems.extend(loaded.templates_at.locate(errors));
            None
        }
    };
    // The webhook's certificate must load: a config that cannot serve it is
    // rejected before it replaces the running one (and before a reload request is
    // answered).
    if let Some(settings) = &loaded.config.controller.webhook
        && let Err(reason) = webhook::tls::acceptor(&settings.cert_file, &settings.key_file)
    {
        problems.push(
            Diagnostic::error(format!("controller.webhook: {reason}")).at(
                hapwright_eventbus::model::SourceLocation::new(
                    loaded.path.display().to_string(),
                    None,
                    None,
                ),
            ),
        );
    }
    match renderer {
        Some(renderer) if problems.is_empty() => Ok(Candidate { loaded, renderer }),
        _ => Err(problems),
    }
}

/// One running iteration.
struct Iteration {
    kernel: RunningKernel,
    /// What the config watcher of this iteration found.
    config_changes: tokio::sync::mpsc::UnboundedReceiver<config::ConfigChange>,
}

impl Iteration {
    /// Builds every component of `candidate` on a fresh bus and starts them.
    fn start(process: &Process, candidate: Candidate, generation: u64) -> anyhow::Result<Self> {
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

    async fn stop(self, grace: Duration) {
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

// === impl Assembly ===

/// An iteration's kernel while its components are registered, one group per step:
/// sources, discovery, the reconciler, statuses, the webhook, deployment and the
/// recorders, in that order.
struct Assembly<'a> {
    kernel: Kernel,
    process: &'a Process,
    loaded: &'a Loaded,
    /// The one validation service of this config: the validator component and the
    /// quarantine's search validate through it, and share its baseline (the last
    /// render that passed `haproxy -c`), so each can skip phase 2 by equivalence
    /// after the other's pass.
    validation: validator::Service,
}

impl Assembly<'_> {
    fn config(&self) -> &config::Config {
        &self.loaded.config
    }

    /// One source per watched resource; files sources of one directory share one
    /// watch and scan (`FilesSource::share_scans`).
    fn sources(&mut self) -> anyhow::Result<()> {
        let Self {
            kernel,
            process,
            loaded,
            ..
        } = self;
        let mut files_sources = Vec::new();
        for (name, resource) in &loaded.config.watched_resources.resources {
            let issue = |issue| anyhow::anyhow!("watchedResources.{name}: {issue}");
            match resource.source() {
                Some(Source::Kubernetes(_)) => {
                    let mut source = KubernetesSource::new(name, resource, process.kube.clone())
                        .map_err(issue)?;
                    if let Some(location) = loaded.resources_at.get(name) {
                        source = source.with_location(location.to_string());
                    }
                    kernel.register(source);
                }
                Some(Source::Http(_)) => {
                    kernel.register(
                        HttpSource::new(name, resource)
                            .map_err(issue)?
                            .with_metrics(process.http_source_metrics.clone()),
                    );
                }
                _ => files_sources.push(FilesSource::new(name, resource).map_err(issue)?),
            }
        }
        for source in FilesSource::share_scans(files_sources) {
            kernel.register(source);
        }
        Ok(())
    }

    /// HAProxy pods found in Kubernetes (`haproxy.discovery.kubernetes`).
    fn discovery(&mut self) {
        let Some(discovery) = self
            .config()
            .haproxy
            .discovery
            .as_ref()
            .and_then(|d| d.kubernetes.as_ref())
        else {
            return;
        };
        let config = DiscoveryConfig {
            namespace: discovery.namespace.clone(),
            label_selector: discovery.label_selector.clone(),
            port: discovery.port,
            scheme: discovery.scheme.clone(),
            dataplane_container: discovery
                .dataplane_container
                .clone()
                .unwrap_or_else(|| DEFAULT_DATAPLANE_CONTAINER.to_owned()),
            restriction: Restriction {
                service_account_name: discovery.service_account_name.clone(),
                owner_kind: discovery.owner_kind.clone(),
                owner_name: discovery.owner_name.clone(),
            },
        };
        let discovery = PodDiscovery::new(config, self.process.kube.clone())
            .with_metrics(self.process.discovery_metrics.clone());
        self.kernel.register(discovery);
    }

    /// The debouncer, the executor and the renderer (with the quarantine when
    /// `controller.quarantine` allows validations). Returns the status templates,
    /// which the renderer feeds when there are any.
    fn reconciler(&mut self, renderer: Renderer) -> anyhow::Result<StatusTemplates> {
        let config = &self.loaded.config;
        let debounce = config.controller.debounce();
        self.kernel.register(Debouncer::new(
            debouncer::Settings {
                debounce: debounce.debounce.get(),
                max_wait: debounce.max_wait.get(),
                leading_edge: debounce.leading_edge,
                ..debouncer::Settings::default()
            },
            build::watched_names(config),
        ));
        let quarantine = config.controller.quarantine.max_validations;
        self.kernel.register(Executor::new(executor::Settings {
            quarantine: quarantine > 0,
            ..executor::Settings::default()
        }));
        let mut renderer = RendererComponent::new(renderer);
        let status_templates = build::status_templates(config)
            .map_err(|errors| anyhow::anyhow!("the status templates do not compile: {errors:?}"))?;
        if !status_templates.is_empty() {
            renderer = renderer.with_template_inputs();
        }
        if quarantine > 0 {
            // The record of the quarantine goes beside the deployed files of every
            // local instance, as the safety valve's does.
            let local_dirs = build::socket_instances(config)
                .iter()
                .map(|i| i.config_dir.clone())
                .collect();
            self.process
                .quarantine
                .keep_in(local_dirs, Some(self.loaded.hash.to_string()));
            renderer = renderer.with_quarantine(QuarantineSettings {
                validate: build::quarantine_validate(self.validation.clone()),
                max_validations: quarantine,
                last_good: self.process.last_good.clone(),
                kept: self.process.quarantine.clone(),
            });
        }
        self.kernel.register(renderer);
        Ok(status_templates)
    }

    /// Statuses rendered from `statusTemplates` (written back to objects of
    /// Kubernetes sources), and Kubernetes Events for quarantined objects and the
    /// templates' notices.
    fn statuses(&mut self, status_templates: StatusTemplates) {
        let process = self.process;
        let kubernetes_kinds = kubernetes_kinds(self.config());
        if !status_templates.is_empty() {
            // Statuses are rendered for every object (files ones show on
            // /debug/status) and written only for objects of Kubernetes sources.
            let written: Vec<(Arc<str>, WatchedKind)> = kubernetes_kinds
                .iter()
                .filter(|(name, _)| status_templates.resources().any(|r| r == name))
                .cloned()
                .collect();
            self.kernel.register(StatusComponent::new(status_templates));
            if !written.is_empty() {
                let mut writer = StatusWriter::new(
                    process.kube.clone(),
                    written,
                    process.status_write_metrics.clone(),
                )
                .with_rate_limit(self.config().controller.status.rate_limit());
                if let Some(leader) = process.leadership() {
                    writer = writer.with_leadership(leader);
                }
                self.kernel.register(writer);
            }
        }
        // Quarantines and the templates' notices (`# hapwright:<Reason> ...` lines)
        // become Events on the objects of `kubernetes` resources.
        if !kubernetes_kinds.is_empty() {
            let mut events = QuarantineEvents::new(process.kube.clone(), kubernetes_kinds)
                .with_instance(LeaderElectionConfig::identity_from_environment());
            if let Some(leader) = process.leadership() {
                events = events.with_leadership(leader);
            }
            self.kernel.register(events);
        }
    }

    /// The admission webhook's feed of snapshots, and its engine for the listener
    /// (none without `controller.webhook`).
    fn webhook(&mut self) -> anyhow::Result<()> {
        let process = self.process;
        let config = &self.loaded.config;
        let Some(settings) = &config.controller.webhook else {
            process.webhook_slot.store(None);
            return Ok(());
        };
        self.kernel
            .register(webhook::Feed::new(process.webhook_current.clone()));
        let targets = settings
            .resources
            .iter()
            .filter_map(|name| {
                let resource = config.watched_resources.resources.get(name)?;
                Some(webhook::Target::new(name, resource))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let engine = webhook::Engine::new(
            build::renderer(config).map_err(|errors| {
                anyhow::anyhow!("the webhook's templates do not compile: {errors:?}")
            })?,
            build::webhook_validate(build::validator_config(config)),
            targets,
            webhook::Settings {
                timeout: settings.timeout.get(),
                failure_policy: settings.failure_policy,
            },
            process.webhook_current.clone(),
            Some(process.webhook_metrics.clone()),
        );
        process.webhook_slot.store(Some(Arc::new(engine)));
        Ok(())
    }

    /// The validator, the scheduler (with the safety valve) and the deployer, and
    /// the check of the instances' HAProxy versions against the validator's.
    fn deployment(&mut self) -> anyhow::Result<()> {
        let process = self.process;
        let config = &self.loaded.config;
        self.kernel.register(Validator::with_service(
            self.validation.clone(),
            process.validator_metrics.clone(),
        ));
        let timings = config.controller.deploy_timings();
        let instances = build::socket_instances(config);
        process
            .safety
            .keep_in(instances.iter().map(|i| i.config_dir.clone()).collect());
        let names = config.haproxy.instances.iter().map(|i| i.name.clone());
        self.kernel.register(
            Scheduler::new(scheduler::Config::from(&timings), names.collect())
                .with_safety(config.controller.safety.clone(), process.safety.clone()),
        );
        let dataplane = config
            .haproxy
            .instances
            .iter()
            .filter_map(|instance| {
                fleet::dataplane_driver(
                    instance,
                    dataplane::Settings::default(),
                    &process.deployer_metrics,
                )
                .map(|driver| {
                    driver.map_err(|e| anyhow::anyhow!("haproxy.instances.{}: {e}", instance.name))
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut deployer = Deployer::new(
            deploy::Config::from(&timings),
            instances,
            process.deployed.clone(),
            Some(process.managed.clone()),
            process.deployer_metrics.clone(),
        )
        .with_dataplane(dataplane);
        if let Some(credentials) = fleet::DiscoveredCredentials::from_config(&config.haproxy) {
            deployer = deployer.with_discovery(credentials);
        }
        if let Some(leader) = process.leadership() {
            deployer = deployer.with_leadership(leader);
        }
        self.kernel
            .register(deployer.with_version_check(process.versions.clone()));
        process.store.set_version_check(process.versions.clone());
        let versions = process.versions.clone();
        let binary = config.haproxy.binary.clone();
        tokio::spawn(async move { versions.read_validator(&binary).await });
        Ok(())
    }

    /// What the status store records from the bus: the pipeline's state and the
    /// event log.
    fn recorders(&mut self) {
        let store = &self.process.store;
        self.kernel.register(StatusRecorder::new(
            store.clone(),
            Some(self.process.status_metrics.clone()),
        ));
        self.kernel.register(EventLog::new(store.clone()));
    }
}

/// The watched resources of Kubernetes sources with their kinds (the objects
/// statuses and Events are written to).
fn kubernetes_kinds(config: &config::Config) -> Vec<(Arc<str>, WatchedKind)> {
    config
        .watched_resources
        .resources
        .iter()
        .filter_map(|(name, resource)| match resource.source() {
            Some(Source::Kubernetes(kubernetes)) => Some((
                Arc::from(name.as_str()),
                WatchedKind {
                    api_version: kubernetes.api_version.clone(),
                    kind: kubernetes.kind.clone(),
                },
            )),
            _ => None,
        })
        .collect()
}

/// What woke the loop up.
enum Wake {
    /// Load the config file again (SIGHUP, HTTP).
    Reload(ReloadRequest),
    /// The config watcher parsed a valid new config.
    Loaded(Box<Loaded>),
    /// The config watcher found the new config invalid.
    Invalid(Vec<Diagnostic>),
    /// SIGTERM or SIGINT.
    Shutdown(&'static str),
    /// A mandatory component exited outside shutdown.
    ComponentFailed(ComponentFailure),
    /// The restart delay after a component failure is over: rebuild the iteration.
    Restart,
    /// The iteration has run long enough since the last restart to count as healthy.
    Recovered,
}

fn config_status(loaded: &Loaded) -> ConfigStatus {
    ConfigStatus {
        path: loaded.path.display().to_string(),
        last_reload_successful: true,
        errors: Vec::new(),
        effective: serde_json::to_value(&loaded.config).unwrap_or(serde_json::Value::Null),
    }
}

/// Why a listener could not be (re)bound. Not retryable: the address is taken or not
/// ours; the message names the config key and the address so users know what to edit.
#[derive(Debug, thiserror::Error)]
#[error("controller.{key}: cannot listen on {addr}: {error}")]
struct ListenError {
    key: &'static str,
    addr: SocketAddr,
    error: std::io::Error,
}

/// Listeners that outlive iterations, rebound when their address changes.
struct Listeners {
    main: Option<(SocketAddr, HttpServer)>,
    metrics: Option<(SocketAddr, HttpServer)>,
    /// The admission webhook's HTTPS listener, when `controller.webhook` is set.
    webhook: Option<(webhook::Listen, HttpServer)>,
}

impl Listeners {
    /// Makes the listeners serve `listen` and `metrics_listen` within `limits`,
    /// binding the new address before letting go of the old one, so a failure leaves
    /// the current listeners as they were. (When the new address cannot be bound while
    /// the old one holds the port, e.g. `0.0.0.0:9400` replacing `127.0.0.1:9400` or
    /// the same address with new limits, the old one is released first and restored
    /// if the new bind still fails.)
    async fn ensure(
        &mut self,
        state: &HttpState,
        listen: SocketAddr,
        metrics_listen: Option<SocketAddr>,
        limits: &Limits,
    ) -> Result<(), ListenError> {
        let main = rebind(self.main.take(), Some(listen), limits, || {
            http::router(state.clone())
        })
        .await;
        let main = match main {
            Ok(main) => main,
            Err((old, error)) => {
                self.main = old;
                return Err(ListenError {
                    key: "listen",
                    addr: listen,
                    error,
                });
            }
        };
        self.main = main;
        let metrics = rebind(self.metrics.take(), metrics_listen, limits, || {
            http::metrics_router(state.clone())
        })
        .await;
        match metrics {
            Ok(metrics) => {
                self.metrics = metrics;
                Ok(())
            }
            Err((old, error)) => {
                self.metrics = old;
                Err(ListenError {
                    key: "metricsListen",
                    addr: metrics_listen.unwrap_or(listen),
                    error,
                })
            }
        }
    }

    /// Makes the webhook listener serve `wanted` (`None`: no listener), binding the
    /// new one before letting go of the old one when it can; on failure the old
    /// listener keeps serving.
    async fn ensure_webhook(
        &mut self,
        wanted: Option<webhook::Listen>,
        slot: &webhook::Slot,
    ) -> Result<(), webhook::ListenError> {
        if self.webhook.as_ref().map(|(listen, _)| listen) == wanted.as_ref() {
            return Ok(());
        }
        let Some(wanted) = wanted else {
            if let Some((_, old)) = self.webhook.take() {
                old.shutdown().await;
            }
            return Ok(());
        };
        match wanted.bind(slot.clone()).await {
            Ok(server) => {
                if let Some((_, old)) = self.webhook.replace((wanted, server)) {
                    old.shutdown().await;
                }
                Ok(())
            }
            Err(first) => {
                // The old listener may hold the port (same port, or a new certificate
                // or limit on the same address).
                let Some((old_listen, old)) = self.webhook.take() else {
                    return Err(first);
                };
                let certificate = matches!(first, webhook::ListenError::CertificateFailed { .. });
                if certificate || old_listen.addr.port() != wanted.addr.port() {
                    self.webhook = Some((old_listen, old));
                    return Err(first);
                }
                old.shutdown().await;
                match wanted.bind(slot.clone()).await {
                    Ok(server) => {
                        self.webhook = Some((wanted, server));
                        Ok(())
                    }
                    Err(error) => {
                        if let Ok(restored) = old_listen.bind(slot.clone()).await {
                            self.webhook = Some((old_listen, restored));
                        }
                        Err(error)
                    }
                }
            }
        }
    }

    async fn shutdown(self) {
        for server in self
            .main
            .into_iter()
            .chain(self.metrics)
            .map(|(_, server)| server)
            .chain(self.webhook.map(|(_, server)| server))
        {
            server.shutdown().await;
        }
    }
}

type Bound = Option<(SocketAddr, HttpServer)>;

/// Moves one listener from `current` to `wanted` (`None`: no listener) served within
/// `limits`. On failure returns the listener that is still serving (the old one) with
/// the error.
async fn rebind(
    current: Bound,
    wanted: Option<SocketAddr>,
    limits: &Limits,
    router: impl Fn() -> axum::Router,
) -> Result<Bound, (Bound, std::io::Error)> {
    let unchanged = match (&current, wanted) {
        (Some((addr, server)), Some(wanted)) => *addr == wanted && server.limits() == limits,
        (None, None) => true,
        _ => false,
    };
    if unchanged {
        return Ok(current);
    }
    let Some(addr) = wanted else {
        if let Some((_, old)) = current {
            old.shutdown().await;
        }
        return Ok(None);
    };
    match HttpServer::bind(addr, router(), limits.clone()).await {
        Ok(server) => {
            if let Some((_, old)) = current {
                old.shutdown().await;
            }
            Ok(Some((addr, server)))
        }
        Err(first) => {
            // The old listener may hold the port the new address needs.
            let Some((old_addr, old)) = current else {
                return Err((None, first));
            };
            if old_addr.port() != addr.port() {
                return Err((Some((old_addr, old)), first));
            }
            let old_limits = old.limits().clone();
            old.shutdown().await;
            match HttpServer::bind(addr, router(), limits.clone()).await {
                Ok(server) => Ok(Some((addr, server))),
                Err(error) => match HttpServer::bind(old_addr, router(), old_limits).await {
                    Ok(restored) => Err((Some((old_addr, restored)), error)),
                    Err(_) => Err((None, error)),
                },
            }
        }
    }
}

/// The webhook listener's settings of a `controller` section (`None`: no webhook).
fn webhook_listen(controller: &config::Controller) -> Option<webhook::Listen> {
    controller
        .webhook
        .as_ref()
        .map(|w| webhook::Listen::new(w, Limits::from(&controller.http)))
}

/// Runs the controller until SIGTERM/SIGINT. Returns the process exit code.
pub async fn run(path: PathBuf) -> u8 {
    let loaded = match config::load(&path) {
        Ok(loaded) => loaded,
        Err(errors) => {
            print_errors(&errors);
            return exit::CONFIG;
        }
    };
    let controller = loaded.config.controller.clone();
    let traces = match telemetry::init_logging(
        &controller.log_level,
        controller.log_format,
        controller.tracing.as_ref(),
    ) {
        Ok(traces) => traces,
        Err(error @ telemetry::LoggingError::FilterInvalid { .. }) => {
            eprintln!("{}: controller.logLevel: {error}", path.display());
            return exit::CONFIG;
        }
        Err(error) => {
            eprintln!(
                "{}: controller.tracing: {:#}",
                path.display(),
                anyhow::Error::from(error)
            );
            return exit::CONFIG;
        }
    };
    let code = run_configured(loaded).await;
    if let Some(traces) = traces {
        // Flush the spans of the last reconciliations (a blocking export).
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    code
}

/// [`run`] once logging (and traces) are set up.
async fn run_configured(loaded: config::Loaded) -> u8 {
    let candidate = match prepare(loaded) {
        Ok(candidate) => candidate,
        Err(errors) => {
            print_errors(&errors);
            return exit::CONFIG;
        }
    };
    match run_loop(candidate).await {
        Ok(()) => exit::OK,
        Err(error) => {
            tracing::error!(error = %format!("{error:#}"), "The controller stopped");
            eprintln!("hapwright: {error:#}");
            exit::FAILURE
        }
    }
}

async fn run_loop(candidate: Candidate) -> anyhow::Result<()> {
    let mut controller = Controller::spawn(&candidate.loaded).await?;
    let outcome = controller.run(candidate).await;
    controller.shutdown().await;
    outcome
}

/// The signals the controller answers: SIGHUP reloads, SIGTERM and SIGINT stop.
struct Signals {
    hangup: Signal,
    terminate: Signal,
    interrupt: Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            hangup: signal(SignalKind::hangup())?,
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }
}

/// Why the running iteration ends (after a wake-up that does not leave it running).
enum End {
    /// It is replaced by one built from the candidate, for the reason given.
    Replace(Box<Candidate>, &'static str),
    /// It stops, and so does the controller.
    Shutdown,
}

/// The running iteration and what the controller tracks about it.
struct Running {
    iteration: Iteration,
    /// Its config, kept to rebuild it from the same config after a component failure.
    config: Loaded,
    generation: u64,
    /// How long its components get to stop.
    grace: Duration,
    started: tokio::time::Instant,
    /// When it is rebuilt after a component failure.
    restart_at: Option<tokio::time::Instant>,
    /// Whether it follows a restart and has not yet run long enough to reset the
    /// backoff.
    recovering: bool,
    recovered_at: tokio::time::Instant,
}

// === impl Controller ===

/// The controller across config reloads: what outlives iterations (the process's
/// state, the HTTP listeners) and the inputs that end one (config changes, reload
/// requests, signals, component failures).
struct Controller {
    process: Process,
    config_path: PathBuf,
    http_state: HttpState,
    listeners: Listeners,
    reload_requests: tokio::sync::mpsc::Receiver<ReloadRequest>,
    signals: Signals,
    generation: u64,
    backoff: RestartBackoff,
}

impl Controller {
    /// Sets up what outlives iterations for the first config and binds its listeners.
    async fn spawn(first: &Loaded) -> anyhow::Result<Self> {
        let process = Process::new(first)?;
        let (reload, reload_requests) = ReloadHandle::channel();
        let http_state = HttpState::new(process.store.clone(), process.registry.clone(), reload);
        http_state
            .policy
            .store(Arc::new(http::Policy::from(&first.config.controller)));
        let signals = Signals::new()?;
        let mut listeners = Listeners {
            main: None,
            metrics: None,
            webhook: None,
        };
        let wanted = &first.config.controller;
        if let Err(error) = listeners
            .ensure(
                &http_state,
                wanted.listen,
                wanted.metrics_listen,
                &Limits::from(&wanted.http),
            )
            .await
        {
            process.managed.stop().await;
            anyhow::bail!("{error}");
        }
        if let Err(error) = listeners
            .ensure_webhook(webhook_listen(wanted), &process.webhook_slot)
            .await
        {
            process.managed.stop().await;
            listeners.shutdown().await;
            anyhow::bail!("{error}");
        }
        Ok(Self {
            process,
            config_path: first.path.clone(),
            http_state,
            listeners,
            reload_requests,
            signals,
            generation: 0,
            backoff: RestartBackoff::default(),
        })
    }

    /// Runs one iteration after the other, each until a valid replacement, until a
    /// shutdown signal or an iteration that cannot start.
    async fn run(&mut self, mut candidate: Candidate) -> anyhow::Result<()> {
        loop {
            let mut running = self.start_iteration(candidate)?;
            let end = loop {
                let wake = self.wake(&mut running).await;
                if let Some(end) = self.handle(&mut running, wake).await {
                    break end;
                }
            };
            let End::Replace(next, why) = end else {
                running.iteration.stop(running.grace).await;
                return Ok(());
            };
            tracing::info!(
                generation = running.generation,
                reason = why,
                "Restarting the controller iteration"
            );
            running.iteration.stop(running.grace).await;
            self.stop_removed_instances(&running.config, &next.loaded)
                .await;
            candidate = *next;
        }
    }

    /// Drains and stops the managed HAProxy of every instance the new config no
    /// longer has (or no longer manages); the others keep running across the swap.
    async fn stop_removed_instances(&self, old: &Loaded, new: &Loaded) {
        let kept: std::collections::BTreeSet<&str> = new
            .config
            .haproxy
            .instances
            .iter()
            .filter(|i| i.managed)
            .map(|i| i.name.as_str())
            .collect();
        for removed in old
            .config
            .haproxy
            .instances
            .iter()
            .filter(|i| i.managed && !kept.contains(i.name.as_str()))
        {
            tracing::info!(
                instance = %removed.name,
                "Managed instance removed from the config; draining and stopping its HAProxy"
            );
            self.process.managed.stop_instance(&removed.name).await;
        }
    }

    /// Publishes the candidate's config (status store, HTTP policy) and starts the
    /// next iteration from it.
    fn start_iteration(&mut self, candidate: Candidate) -> anyhow::Result<Running> {
        self.generation += 1;
        self.publish_config(&candidate.loaded);
        let grace =
            ITERATION_GRACE.max(candidate.loaded.config.controller.deployment_timeout.get());
        let config = candidate.loaded.clone();
        let started = tokio::time::Instant::now();
        let recovering = self.backoff.attempt() > 0;
        let recovered_at = started + self.backoff.reset_after();
        let iteration = Iteration::start(&self.process, candidate, self.generation)?;
        self.http_state
            .approve
            .set_publisher(iteration.kernel.bus().publisher());
        Ok(Running {
            iteration,
            config,
            generation: self.generation,
            grace,
            started,
            restart_at: None,
            recovering,
            recovered_at,
        })
    }

    /// What the status store and the HTTP server show of the config that starts.
    fn publish_config(&self, loaded: &Loaded) {
        let config = &loaded.config;
        let store = &self.process.store;
        self.http_state
            .policy
            .store(Arc::new(http::Policy::from(&config.controller)));
        store.set_config(config_status(loaded));
        store.set_liveness_grace(config.controller.liveness_grace.get());
        store.set_template_places(loaded.templates_at.clone());
        if let Some(leader) = self.process.leadership() {
            store.set_leadership(leader);
        }
        store.set_watched_resources(config.watched_resources.resources.keys().cloned());
        store.set_static_instances(config.haproxy.instances.iter().map(|i| i.name.clone()));
    }

    /// Waits for whatever may end or change the running iteration.
    async fn wake(&mut self, running: &mut Running) -> Wake {
        tokio::select! {
            // The watcher gone (it failed): the kernel reports that; this branch
            // just stops yielding.
            Some(change) = running.iteration.config_changes.recv() => match change {
                config::ConfigChange::Loaded(loaded) => Wake::Loaded(loaded),
                config::ConfigChange::Invalid(errors) => Wake::Invalid(errors),
            },
            Some(request) = self.reload_requests.recv() => Wake::Reload(request),
            _ = self.signals.hangup.recv() => Wake::Reload(ReloadRequest::new(ReloadSource::Sighup)),
            _ = self.signals.terminate.recv() => Wake::Shutdown("SIGTERM"),
            _ = self.signals.interrupt.recv() => Wake::Shutdown("SIGINT"),
            failure = running.iteration.kernel.failed() => Wake::ComponentFailed(failure),
            () = hapwright_eventbus::sleep_until(running.restart_at) => Wake::Restart,
            () = tokio::time::sleep_until(running.recovered_at), if running.recovering => Wake::Recovered,
        }
    }

    /// Decides what a wake-up means for the running iteration (`None`: it keeps
    /// running, as it does after an invalid config or a component failure).
    async fn handle(&mut self, running: &mut Running, wake: Wake) -> Option<End> {
        match wake {
            Wake::Shutdown(why) => {
                tracing::info!(reason = why, "Shutting down");
                Some(End::Shutdown)
            }
            Wake::ComponentFailed(failure) => {
                self.component_failed(running, &failure);
                None
            }
            Wake::Recovered => {
                tracing::info!(
                    generation = running.generation,
                    "Components ran well since the last restart"
                );
                self.backoff.reset();
                self.process.store.components_recovered();
                running.recovering = false;
                None
            }
            Wake::Restart => Self::restart(running),
            Wake::Invalid(errors) => self.reload(Err(errors), None).await,
            Wake::Loaded(loaded) if loaded.hash == running.config.hash => {
                // Back to the running config after an invalid edit: clear the error.
                self.keep_config(&loaded);
                None
            }
            Wake::Loaded(loaded) => self.reload(Ok(*loaded), None).await,
            Wake::Reload(request) => self.reload_requested(running, request).await,
        }
    }

    /// A mandatory component exited: the iteration is rebuilt after the backoff's
    /// delay (unless a rebuild is already scheduled) and keeps running meanwhile.
    fn component_failed(&mut self, running: &mut Running, failure: &ComponentFailure) {
        self.process.store.component_failed(&failure.component);
        running.recovering = false;
        if running.restart_at.is_some() {
            tracing::warn!(
                component = %failure.component,
                reason = %failure.reason,
                "Mandatory component exited; a restart is already scheduled"
            );
            return;
        }
        let delay = self.backoff.next_delay(running.started.elapsed());
        self.process
            .kernel_metrics
            .record_restart(&failure.component);
        tracing::warn!(
            component = %failure.component,
            reason = %failure.reason,
            attempt = self.backoff.attempt(),
            ?delay,
            generation = running.generation,
            "Mandatory component exited; restarting the controller iteration"
        );
        running.restart_at = Some(tokio::time::Instant::now() + delay);
    }

    /// The restart delay is over: the iteration is rebuilt from its own config.
    fn restart(running: &mut Running) -> Option<End> {
        match prepare(running.config.clone()) {
            Ok(next) => Some(End::Replace(
                Box::new(next),
                "restarting after a component failure",
            )),
            Err(errors) => {
                // The running config passed these checks before; only a changed
                // template file on disk could fail them now.
                for error in &errors {
                    tracing::error!(error = %error, "Cannot rebuild the controller iteration");
                }
                running.restart_at = None;
                None
            }
        }
    }

    /// SIGHUP or `POST /-/reload`: loads the config file again. A file equal to the
    /// running config rebuilds nothing, except on SIGHUP (the operator's way to force
    /// a full re-sync).
    async fn reload_requested(&mut self, running: &Running, request: ReloadRequest) -> Option<End> {
        let source = request.source;
        tracing::info!(?source, "Reloading the controller config");
        running
            .iteration
            .kernel
            .bus()
            .publisher()
            .publish(ReloadRequested { source });
        // Reading and checking the files blocks: off the async workers.
        let path = self.config_path.clone();
        let loaded = tokio::task::spawn_blocking(move || config::load(&path))
            .await
            .unwrap_or_else(|join| {
                Err(vec![Diagnostic::error(format!(
                    "loading the config file failed: {join}"
                ))])
            });
        match loaded {
            // The file (templates are inline) equals the running config.
            Ok(loaded) if loaded.hash == running.config.hash && source != ReloadSource::Sighup => {
                tracing::info!(?source, "Controller config unchanged; nothing to reload");
                self.keep_config(&loaded);
                request.answer(ReloadOutcome::Unchanged);
                None
            }
            other => self.reload(other, Some(request)).await,
        }
    }

    /// The config on disk equals the running one: a successful reload that changes
    /// nothing.
    fn keep_config(&self, loaded: &Loaded) {
        self.process.reload_metrics.record(true);
        self.process.store.set_config(config_status(loaded));
    }

    /// Checks a new config completely and moves the listeners to it; only a config
    /// that passes both replaces the running iteration. Answers the reload request
    /// that asked for it, if one did.
    async fn reload(
        &mut self,
        loaded: Result<Loaded, Vec<Diagnostic>>,
        mut asked: Option<ReloadRequest>,
    ) -> Option<End> {
        let candidate = loaded.and_then(prepare);
        // A positive verdict goes out before the listeners move: a listener that is
        // rebound drains its connections, this request's among them.
        if candidate.is_ok()
            && let Some(request) = asked.take()
        {
            request.answer(ReloadOutcome::Accepted);
        }
        let candidate = match candidate {
            Ok(next) => self
                .move_listeners(&next.loaded.config.controller)
                .await
                .map(|()| next),
            Err(errors) => Err(errors),
        };
        match candidate {
            Ok(next) => {
                self.process.reload_metrics.record(true);
                tracing::info!(hash = %next.loaded.hash.short(), "New controller config accepted");
                Some(End::Replace(Box::new(next), "valid new config"))
            }
            Err(errors) => {
                self.process.reload_metrics.record(false);
                for error in &errors {
                    tracing::error!(error = %error, "New controller config rejected; the running one stays");
                }
                if let Some(request) = asked.take() {
                    request.answer(ReloadOutcome::Rejected(
                        errors.iter().map(ToString::to_string).collect(),
                    ));
                }
                self.process.store.config_rejected(errors);
                None
            }
        }
    }

    /// Binds the new config's listeners while the old iteration still runs: an
    /// address that cannot be bound rejects the config like any other error.
    async fn move_listeners(&mut self, wanted: &config::Controller) -> Result<(), Vec<Diagnostic>> {
        let moved = match self
            .listeners
            .ensure(
                &self.http_state,
                wanted.listen,
                wanted.metrics_listen,
                &Limits::from(&wanted.http),
            )
            .await
        {
            Ok(()) => self
                .listeners
                .ensure_webhook(webhook_listen(wanted), &self.process.webhook_slot)
                .await
                .map_err(|error| error.to_string()),
            Err(error) => Err(error.to_string()),
        };
        moved.map_err(|error| {
            vec![
                Diagnostic::error(error).at(hapwright_eventbus::model::SourceLocation::new(
                    self.config_path.display().to_string(),
                    None,
                    None,
                )),
            ]
        })
    }

    /// Releases what outlives iterations: the Lease, the managed HAProxy processes
    /// and the listeners.
    async fn shutdown(self) {
        if let Some(election) = self.process.leader {
            // Release the Lease so a standby replica takes over without waiting for
            // it to expire.
            election.shutdown().await;
        }
        self.process.managed.stop().await;
        self.listeners.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> axum::Router {
        axum::Router::new().route("/", axum::routing::get(|| async { "up" }))
    }

    async fn serves(addr: SocketAddr) -> bool {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    }

    #[tokio::test]
    async fn a_listener_that_cannot_move_keeps_serving_where_it_was() {
        let old = HttpServer::bind("127.0.0.1:0".parse().unwrap(), router(), Limits::default())
            .await
            .unwrap();
        let old_addr = old.local_addr();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken_addr = taken.local_addr().unwrap();

        let (kept, error) = rebind(
            Some((old_addr, old)),
            Some(taken_addr),
            &Limits::default(),
            router,
        )
        .await
        .expect_err("the address is taken");
        assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse);
        let (kept_addr, kept) = kept.expect("the old listener is still there");
        assert_eq!(kept_addr, old_addr);
        assert!(serves(old_addr).await);

        // A free address moves it, and the old one is released.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let free_addr = free.local_addr().unwrap();
        drop(free);
        let moved = rebind(
            Some((kept_addr, kept)),
            Some(free_addr),
            &Limits::default(),
            router,
        )
        .await
        .map_err(|(_, e)| e)
        .unwrap()
        .unwrap();
        assert_eq!(moved.0, free_addr);
        assert!(serves(free_addr).await);
        assert!(!serves(old_addr).await);
        moved.1.shutdown().await;
        drop(taken);
    }

    #[tokio::test]
    async fn a_listen_address_that_cannot_be_bound_names_its_key_and_address() {
        let state = HttpState::new(
            crate::status::StatusStore::default(),
            Registry::new(),
            crate::http::ReloadHandle::channel().0,
        );
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken_addr = taken.local_addr().unwrap();
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let free_addr = free.local_addr().unwrap();
        drop(free);
        let mut listeners = Listeners {
            main: None,
            metrics: None,
            webhook: None,
        };
        let error = listeners
            .ensure(&state, free_addr, Some(taken_addr), &Limits::default())
            .await
            .expect_err("the metrics address is taken")
            .to_string();
        assert!(
            error.starts_with(&format!(
                "controller.metricsListen: cannot listen on {taken_addr}: "
            )),
            "{error}"
        );
        let error = listeners
            .ensure(&state, taken_addr, None, &Limits::default())
            .await
            .expect_err("the main address is taken")
            .to_string();
        assert!(
            error.starts_with(&format!(
                "controller.listen: cannot listen on {taken_addr}: "
            )),
            "{error}"
        );
        listeners.shutdown().await;
        drop(taken);
    }

    #[tokio::test]
    async fn an_unchanged_address_is_kept_and_none_closes_it() {
        let server = HttpServer::bind("127.0.0.1:0".parse().unwrap(), router(), Limits::default())
            .await
            .unwrap();
        let addr = server.local_addr();
        let same = rebind(Some((addr, server)), Some(addr), &Limits::default(), router)
            .await
            .map_err(|(_, e)| e)
            .unwrap();
        assert_eq!(same.as_ref().map(|(a, _)| *a), Some(addr));
        let closed = rebind(same, None, &Limits::default(), router)
            .await
            .map_err(|(_, e)| e)
            .unwrap();
        assert!(closed.is_none());
        assert!(!serves(addr).await);
    }
}
