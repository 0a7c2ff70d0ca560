//! HAProxy pod discovery (`haproxy.discovery.kubernetes`): pods matching a label
//! selector in one namespace, whose Data Plane API is ready and which have an IP,
//! become Data Plane API deploy targets.
//!
//! # Behaviour
//!
//! - A `kube::runtime::watcher` on `Pod`s in the namespace with the label selector
//!   (list, then watch; relists after `410 Gone`; errors retried with
//!   `default_backoff`).
//! - A pod is a target when its Data Plane API container (`dataplaneContainer`,
//!   `dataplaneapi` by default) is ready, it has a `status.podIP` and it is not being
//!   deleted. The pod's own `Ready` condition does not count: the HAProxy pod should
//!   turn ready only once it serves a config hapwright deployed, and hapwright can
//!   only deploy to a pod it discovered, so waiting for the whole pod would never
//!   end. A pod without a container of that name (HAProxy and the Data Plane API in
//!   one container) is a target while its `Ready` condition is `True`. It becomes
//!   `InstanceRef { name: <pod name>, driver: Dataplane, address: <scheme>://<podIP>:<port> }`
//!   (IPv6 addresses in brackets; `scheme` is `https` unless configured).
//! - With a [`Restriction`] (`serviceAccountName`, `ownerKind`/`ownerName`), a pod
//!   matching the labels but running as another service account or controlled by
//!   another workload is skipped: never a target, logged once (again only when its
//!   reason changes), counted in `hapwright_discovery_skipped_pods` and named in the
//!   component's health note. Labels are easy to copy; these fields narrow the match
//!   to the workload that really runs HAProxy. (The pod's certificate, checked by the
//!   deployer, is what proves its identity.)
//! - After the initial list, and then whenever the set of targets changes (a pod's
//!   Data Plane API becomes ready or loses readiness, a pod gets a new IP or goes
//!   away), the whole set is published as one
//!   `InstancesDiscovered { source: "kubernetes", .. }`, sorted by name. Status
//!   updates that do not change the set publish nothing.
//! - Health as for the `kubernetes` source: a denied or failing list/watch makes the
//!   component `Unhealthy` with the API's reason, and the last published set stays.

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus::{IntGauge, Registry};

use futures::{FutureExt, StreamExt};
use hapwright_eventbus::model::{InstanceDriver, InstanceRef};
use hapwright_eventbus::{
    Component, ComponentError, Context, Health, HealthState, InstancesDiscovered,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::Instrument;

use super::source::RECOVERY_QUIET_PERIOD;
use super::{ClientFactory, describe_watcher_error, is_gone, retry_delays};
use tokio::time::Instant;

/// The `source` of the published `InstancesDiscovered` events.
pub const SOURCE: &str = "kubernetes";

/// Which pods to deploy to (the watchers crate's copy of
/// `haproxy.discovery.kubernetes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// Namespace of the pods.
    pub namespace: String,
    /// Label selector (`app=haproxy`).
    pub label_selector: String,
    /// Data Plane API port on each pod.
    pub port: u16,
    /// URL scheme of the pods' Data Plane API (`http` or `https`).
    pub scheme: String,
    /// The container serving the Data Plane API: a pod is a target once this
    /// container is ready, whatever the readiness of its HAProxy container. Pods
    /// without a container of this name are targets while the pod is ready.
    pub dataplane_container: String,
    /// Which of the labelled pods may be targets.
    pub restriction: Restriction,
}

/// The default [`DiscoveryConfig::dataplane_container`], the container name of the
/// shipped HAProxy pods (deploy/controller/haproxy.yaml).
pub const DEFAULT_DATAPLANE_CONTAINER: &str = "dataplaneapi";

/// Narrows the pods matching the label selector to those of the workload that runs
/// HAProxy (`serviceAccountName`, `ownerKind`, `ownerName`). Empty: every labelled
/// pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restriction {
    /// The pod's `spec.serviceAccountName` must be this.
    pub service_account_name: Option<String>,
    /// The pod's controlling owner must be of this kind. `Deployment` is matched
    /// through the ReplicaSet it creates: a ReplicaSet named
    /// `<ownerName>-<pod-template-hash>`, the hash taken from the pod's
    /// `pod-template-hash` label, as the Deployment controller names them.
    pub owner_kind: Option<String>,
    /// With `owner_kind`: the owner's name.
    pub owner_name: Option<String>,
}

impl Restriction {
    /// Why `pod` is not a target under this restriction; `None` when it may be one.
    pub fn skip_reason(&self, pod: &Pod) -> Option<String> {
        if let Some(wanted) = &self.service_account_name {
            let actual = pod
                .spec
                .as_ref()
                .and_then(|spec| spec.service_account_name.as_deref())
                .unwrap_or("default");
            if actual != wanted {
                return Some(format!(
                    "runs as service account `{actual}`, not `{wanted}`"
                ));
            }
        }
        let Some(kind) = &self.owner_kind else {
            return None;
        };
        let wanted = match &self.owner_name {
            Some(name) => format!("{kind} `{name}`"),
            None => format!("a {kind}"),
        };
        let owner = pod
            .metadata
            .owner_references
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|owner| owner.controller == Some(true));
        let Some(owner) = owner else {
            return Some(format!("has no controlling owner, not {wanted}"));
        };
        let matches = if kind == "Deployment" {
            let hash = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get("pod-template-hash"));
            owner.kind == "ReplicaSet"
                && match (&self.owner_name, hash) {
                    (None, _) => true,
                    (Some(name), Some(hash)) => owner.name == format!("{name}-{hash}"),
                    (Some(_), None) => false,
                }
        } else {
            owner.kind == *kind && self.owner_name.as_ref().is_none_or(|n| owner.name == *n)
        };
        (!matches).then(|| {
            format!(
                "is controlled by {} `{}`, not {wanted}",
                owner.kind, owner.name
            )
        })
    }
}

/// `hapwright_discovery_skipped_pods`: pods matching the label selector that the
/// [`Restriction`] keeps from being targets. Register once per process.
#[derive(Clone, Debug)]
pub struct DiscoveryMetrics {
    skipped: IntGauge,
}

impl DiscoveryMetrics {
    /// Creates and registers the metric.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = Self::unregistered()?;
        registry.register(Box::new(metrics.skipped.clone()))?;
        Ok(metrics)
    }

    /// The metric registered nowhere (tests).
    pub fn unregistered() -> prometheus::Result<Self> {
        Ok(Self {
            skipped: IntGauge::new(
                "hapwright_discovery_skipped_pods",
                "Pods matching the discovery label selector that are not deploy targets \
                 because of serviceAccountName or ownerKind/ownerName.",
            )?,
        })
    }

    /// The current number of skipped pods (tests, status).
    pub fn skipped(&self) -> i64 {
        self.skipped.get()
    }
}

/// The deploy target a pod stands for, when it is one: its Data Plane API ready
/// (see [`dataplane_ready`]), with an IP, not being deleted.
pub fn instance_of(
    pod: &Pod,
    scheme: &str,
    port: u16,
    dataplane_container: &str,
) -> Option<InstanceRef> {
    let name = pod.metadata.name.clone()?;
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    let ip = status.pod_ip.as_deref().filter(|ip| !ip.is_empty())?;
    if !dataplane_ready(pod, dataplane_container) {
        return None;
    }
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_owned()
    };
    Some(InstanceRef {
        name,
        driver: InstanceDriver::Dataplane,
        address: format!("{scheme}://{host}:{port}"),
    })
}

/// Whether `pod`'s Data Plane API takes requests: the container `container` (a
/// regular container, or a sidecar among the init containers) reports `ready`. A pod
/// that has no such container is judged by its `Ready` condition instead.
///
/// The pod's `Ready` condition also waits for its HAProxy container, whose readiness
/// probe (in the shipped manifests) passes only once HAProxy serves a config
/// hapwright deployed; requiring it here would keep a new pod from ever getting
/// its first config.
pub fn dataplane_ready(pod: &Pod, container: &str) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let declared = pod.spec.as_ref().is_some_and(|spec| {
        spec.containers.iter().any(|c| c.name == container)
            || spec
                .init_containers
                .as_deref()
                .unwrap_or_default()
                .iter()
                .any(|c| c.name == container)
    });
    if !declared {
        return status
            .conditions
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
    }
    status
        .container_statuses
        .iter()
        .chain(status.init_container_statuses.iter())
        .flatten()
        .any(|c| c.name == container && c.ready)
}

/// What one labelled pod stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    /// A target, or `None` while it is not one (no IP, Data Plane API not ready,
    /// terminating).
    Pod(Option<InstanceRef>),
    /// Skipped by the [`Restriction`], with the reason.
    Skipped(String),
}

/// The synchronous core of discovery: pods by name, and the targets they stand for.
#[derive(Debug, Default)]
pub struct PodSet {
    scheme: String,
    port: u16,
    dataplane_container: String,
    restriction: Restriction,
    /// Every matching pod by name, with its target when it is one.
    pods: BTreeMap<String, Entry>,
    relist: Option<BTreeMap<String, Entry>>,
    /// Skip reasons already logged, by pod name.
    logged: BTreeMap<String, String>,
    synced: bool,
    error: Option<(String, Instant)>,
    note: Option<String>,
}

impl PodSet {
    /// An empty set for pods serving the Data Plane API at `scheme://<podIP>:port`.
    pub fn new(scheme: impl Into<String>, port: u16) -> Self {
        Self {
            scheme: scheme.into(),
            port,
            dataplane_container: DEFAULT_DATAPLANE_CONTAINER.to_owned(),
            ..Self::default()
        }
    }

    /// Takes a pod's Data Plane API as ready when its container `name` is.
    #[must_use]
    pub fn with_dataplane_container(mut self, name: impl Into<String>) -> Self {
        self.dataplane_container = name.into();
        self
    }

    /// Skips the pods `restriction` rules out.
    #[must_use]
    pub fn with_restriction(mut self, restriction: Restriction) -> Self {
        self.restriction = restriction;
        self
    }

    /// What `pod` stands for; logs a skip the first time its reason is seen.
    fn entry(&mut self, name: &str, pod: &Pod) -> Entry {
        match self.restriction.skip_reason(pod) {
            None => {
                self.logged.remove(name);
                Entry::Pod(instance_of(
                    pod,
                    &self.scheme,
                    self.port,
                    &self.dataplane_container,
                ))
            }
            Some(reason) => {
                if self.logged.get(name) != Some(&reason) {
                    tracing::warn!(pod = %name, %reason, "Pod matches the discovery labels but is skipped");
                    self.logged.insert(name.to_owned(), reason.clone());
                }
                Entry::Skipped(reason)
            }
        }
    }

    /// The pods skipped by the restriction, by name, with the reason.
    pub fn skipped(&self) -> BTreeMap<&str, &str> {
        self.pods
            .iter()
            .filter_map(|(name, entry)| match entry {
                Entry::Skipped(reason) => Some((name.as_str(), reason.as_str())),
                Entry::Pod(_) => None,
            })
            .collect()
    }

    /// True once the initial list finished.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// Applies one watcher item.
    pub fn handle(&mut self, item: Result<watcher::Event<Pod>, watcher::Error>) {
        match item {
            Ok(watcher::Event::Init) => self.relist = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(pod)) => {
                if let Some(name) = pod.metadata.name.clone() {
                    let entry = self.entry(&name, &pod);
                    self.relist
                        .get_or_insert_with(BTreeMap::new)
                        .insert(name, entry);
                }
            }
            Ok(watcher::Event::InitDone) => {
                self.pods = self.relist.take().unwrap_or_default();
                let pods = &self.pods;
                self.logged.retain(|name, _| pods.contains_key(name));
                self.synced = true;
                self.error = None;
                self.note = None;
            }
            Ok(watcher::Event::Apply(pod)) => {
                if let Some(name) = pod.metadata.name.clone() {
                    let entry = self.entry(&name, &pod);
                    self.pods.insert(name, entry);
                }
                self.error = None;
            }
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(name) = &pod.metadata.name {
                    self.pods.remove(name);
                    self.logged.remove(name);
                }
                self.error = None;
            }
            Err(error) => {
                let reason = describe_watcher_error(&error);
                if is_gone(&error) {
                    tracing::info!(%reason, "Pod watch expired; relisting");
                    self.note = Some(format!("relisting after {reason}"));
                } else {
                    tracing::warn!(%reason, "Pod watch failed; retrying with backoff");
                    self.error = Some((reason, Instant::now()));
                }
            }
        }
    }

    /// The current targets, sorted by name.
    pub fn instances(&self) -> Vec<InstanceRef> {
        self.pods
            .values()
            .filter_map(|entry| match entry {
                Entry::Pod(target) => target.clone(),
                Entry::Skipped(_) => None,
            })
            .collect()
    }

    /// `Unhealthy` with the reason while the watch fails, `Healthy` otherwise, with a
    /// note that names the skipped pods.
    pub fn health(&self) -> Health {
        if let Some((reason, _)) = &self.error {
            return Health::new(HealthState::Unhealthy, Some(reason.clone()));
        }
        let skipped = self.skipped();
        let skipped = (!skipped.is_empty()).then(|| {
            let pods: Vec<String> = skipped
                .iter()
                .map(|(name, reason)| format!("{name} {reason}"))
                .collect();
            format!(
                "{} pod(s) skipped by serviceAccountName/owner: {}",
                pods.len(),
                pods.join("; ")
            )
        });
        let note = match (&self.note, skipped) {
            (Some(note), Some(skipped)) => Some(format!("{note}; {skipped}")),
            (note, skipped) => skipped.or_else(|| note.clone()),
        };
        Health::new(HealthState::Healthy, note)
    }

    /// When the last failure counts as recovered if nothing fails again.
    pub fn error_expiry(&self) -> Option<Instant> {
        self.error
            .as_ref()
            .map(|(_, at)| *at + RECOVERY_QUIET_PERIOD)
    }

    /// Clears a failure older than [`RECOVERY_QUIET_PERIOD`] (see
    /// [`Store::expire_errors`](super::source::Store::expire_errors)).
    pub fn expire_errors(&mut self, now: Instant) {
        if let Some((reason, at)) = &self.error
            && *at + RECOVERY_QUIET_PERIOD <= now
        {
            tracing::info!(%reason, "No failure since; the pod watch recovered");
            self.error = None;
        }
    }
}

/// The pod discovery component, named `discovery/kubernetes`.
pub struct PodDiscovery {
    config: DiscoveryConfig,
    client: ClientFactory,
    metrics: Option<DiscoveryMetrics>,
}

impl std::fmt::Debug for PodDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodDiscovery")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl PodDiscovery {
    /// The component's name.
    pub const NAME: &'static str = "discovery/kubernetes";

    /// Discovery of the pods `config` selects, through `client`.
    pub fn new(config: DiscoveryConfig, client: ClientFactory) -> Self {
        Self {
            config,
            client,
            metrics: None,
        }
    }

    /// Reports skipped pods in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: DiscoveryMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

#[async_trait::async_trait]
impl Component for PodDiscovery {
    fn name(&self) -> &str {
        Self::NAME
    }

    async fn run(self: Box<Self>, ctx: Context) -> Result<(), ComponentError> {
        let span = tracing::info_span!(
            "pod_discovery",
            namespace = %self.config.namespace,
            selector = %self.config.label_selector,
        );
        run(*self, ctx).instrument(span).await
    }
}

async fn run(discovery: PodDiscovery, ctx: Context) -> Result<(), ComponentError> {
    let mut delays = retry_delays();
    let client = loop {
        match discovery.client.get().await {
            Ok(client) => break client,
            Err(reason) => {
                ctx.health().unhealthy(reason.to_string());
                let delay = delays.next().unwrap_or(std::time::Duration::from_secs(60));
                if !super::sleep_or_cancel(delay, ctx.cancellation_token()).await {
                    return Ok(());
                }
            }
        }
    };
    let api: Api<Pod> = Api::namespaced(client, &discovery.config.namespace);
    let config = watcher::Config::default().labels(&discovery.config.label_selector);
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut pods = PodSet::new(discovery.config.scheme.clone(), discovery.config.port)
        .with_dataplane_container(discovery.config.dataplane_container.clone())
        .with_restriction(discovery.config.restriction.clone());
    let mut published: Option<Vec<InstanceRef>> = None;
    loop {
        let expiry = pods.error_expiry();
        let first = tokio::select! {
            biased;
            () = ctx.cancelled() => return Ok(()),
            item = events.next() => Some(item),
            () = tokio::time::sleep_until(expiry.unwrap_or_else(Instant::now)), if expiry.is_some() => None,
        };
        match first {
            None => pods.expire_errors(Instant::now()),
            Some(None) => return Err("the pod watch stream ended".into()),
            Some(Some(item)) => {
                pods.handle(item);
                let mut batch = 1;
                while batch < super::source::MAX_BATCH {
                    match events.next().now_or_never() {
                        Some(Some(item)) => {
                            pods.handle(item);
                            batch += 1;
                        }
                        _ => break,
                    }
                }
            }
        }
        let health = pods.health();
        match (health.state, health.reason) {
            (HealthState::Healthy, _) if !pods.synced() => {}
            (HealthState::Healthy, None) => ctx.health().healthy(),
            (HealthState::Healthy, Some(note)) => ctx.health().healthy_because(note),
            (_, reason) => ctx.health().unhealthy(reason.unwrap_or_default()),
        }
        if !pods.synced() {
            continue;
        }
        if let Some(metrics) = &discovery.metrics {
            metrics
                .skipped
                .set(i64::try_from(pods.skipped().len()).unwrap_or(i64::MAX));
        }
        let instances = pods.instances();
        if published.as_ref() != Some(&instances) {
            tracing::info!(
                instances = ?instances.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
                "HAProxy pods discovered"
            );
            ctx.publisher().publish(InstancesDiscovered {
                source: Arc::from(SOURCE),
                instances: instances.clone().into(),
            });
            published = Some(instances);
        }
    }
}
