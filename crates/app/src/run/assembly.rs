//! Component spawning: which components one configuration registers in its
//! iteration's kernel, one group per step (sources, discovery, the reconciler,
//! statuses, the webhook, deployment, the recorders).

use std::sync::Arc;

use hapwright_deployer::client::dataplane;
use hapwright_deployer::component::deployer::{self as deploy, Deployer};
use hapwright_deployer::component::scheduler::{self, Scheduler};
use hapwright_deployer::component::validator::{self, Validator};
use hapwright_deployer::driver::fleet;
use hapwright_eventbus::Kernel;
use hapwright_reconciler::debouncer::{self, Debouncer};
use hapwright_reconciler::executor::{self, Executor};
use hapwright_reconciler::renderer::{QuarantineSettings, Renderer, RendererComponent};
use hapwright_reconciler::status::{StatusComponent, StatusTemplates};
use hapwright_watchers::config::Source;
use hapwright_watchers::files::FilesSource;
use hapwright_watchers::http::HttpSource;
use hapwright_watchers::kubernetes::discovery::DEFAULT_DATAPLANE_CONTAINER;
use hapwright_watchers::kubernetes::{
    DiscoveryConfig, KubernetesSource, LeaderElectionConfig, PodDiscovery, QuarantineEvents,
    Restriction, StatusWriter, WatchedKind,
};

use super::process::Process;
use crate::build;
use crate::config::{self, Loaded};
use crate::status::{EventLog, StatusRecorder};
use crate::webhook;

/// An iteration's kernel while its components are registered, one group per step:
/// sources, discovery, the reconciler, statuses, the webhook, deployment and the
/// recorders, in that order.
pub(super) struct Assembly<'a> {
    pub(super) kernel: Kernel,
    pub(super) process: &'a Process,
    pub(super) loaded: &'a Loaded,
    /// The one validation service of this config: the validator component and the
    /// quarantine's search validate through it, and share its baseline (the last
    /// render that passed `haproxy -c`), so each can skip phase 2 by equivalence
    /// after the other's pass.
    pub(super) validation: validator::Service,
}

impl Assembly<'_> {
    fn config(&self) -> &config::Config {
        &self.loaded.config
    }

    /// One source per watched resource; files sources of one directory share one
    /// watch and scan (`FilesSource::share_scans`).
    pub(super) fn sources(&mut self) -> anyhow::Result<()> {
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
    pub(super) fn discovery(&mut self) {
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
    pub(super) fn reconciler(&mut self, renderer: Renderer) -> anyhow::Result<StatusTemplates> {
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
    pub(super) fn statuses(&mut self, status_templates: StatusTemplates) {
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
    pub(super) fn webhook(&mut self) -> anyhow::Result<()> {
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
    pub(super) fn deployment(&mut self) -> anyhow::Result<()> {
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
    pub(super) fn recorders(&mut self) {
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
