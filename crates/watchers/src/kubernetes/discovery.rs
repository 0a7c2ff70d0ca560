//! HAProxy pod discovery (`haproxy.discovery.kubernetes`): pods matching a label
//! selector in one namespace, ready and with an IP, become Data Plane API deploy
//! targets.
//!
//! # Behaviour
//!
//! - A `kube::runtime::watcher` on `Pod`s in the namespace with the label selector
//!   (list, then watch; relists after `410 Gone`; errors retried with
//!   `default_backoff`).
//! - A pod is a target when its `Ready` condition is `True`, it has a `status.podIP`
//!   and it is not being deleted. It becomes
//!   `InstanceRef { name: <pod name>, driver: Dataplane, address: <scheme>://<podIP>:<port> }`
//!   (IPv6 addresses in brackets; `scheme` is `http` unless configured).
//! - After the initial list, and then whenever the set of targets changes (a pod
//!   becomes ready, loses readiness, gets a new IP, goes away), the whole set is
//!   published as one `InstancesDiscovered { source: "kubernetes", .. }`, sorted by
//!   name. Status updates that do not change the set publish nothing.
//! - Health as for the `kubernetes` source: a denied or failing list/watch makes the
//!   component `Unhealthy` with the API's reason, and the last published set stays.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use hapwright_eventbus::model::{InstanceDriver, InstanceRef};
use hapwright_eventbus::{Component, ComponentError, Context, InstancesDiscovered};
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
}

/// The deploy target a pod stands for, when it is one: ready, with an IP, not being
/// deleted.
pub fn instance_of(pod: &Pod, scheme: &str, port: u16) -> Option<InstanceRef> {
    let name = pod.metadata.name.clone()?;
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let ip = status.pod_ip.as_deref().filter(|ip| !ip.is_empty())?;
    if !ready {
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

/// The synchronous core of discovery: pods by name, and the targets they stand for.
#[derive(Debug, Default)]
pub struct PodSet {
    scheme: String,
    port: u16,
    /// Every matching pod by name, with its target when it is one.
    pods: BTreeMap<String, Option<InstanceRef>>,
    relist: Option<BTreeMap<String, Option<InstanceRef>>>,
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
            ..Self::default()
        }
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
                    let target = instance_of(&pod, &self.scheme, self.port);
                    self.relist
                        .get_or_insert_with(BTreeMap::new)
                        .insert(name, target);
                }
            }
            Ok(watcher::Event::InitDone) => {
                self.pods = self.relist.take().unwrap_or_default();
                self.synced = true;
                self.error = None;
                self.note = None;
            }
            Ok(watcher::Event::Apply(pod)) => {
                if let Some(name) = pod.metadata.name.clone() {
                    let target = instance_of(&pod, &self.scheme, self.port);
                    self.pods.insert(name, target);
                }
                self.error = None;
            }
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(name) = &pod.metadata.name {
                    self.pods.remove(name);
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
        self.pods.values().flatten().cloned().collect()
    }

    /// `Err(reason)` while the watch fails, `Ok(note)` otherwise.
    pub fn health(&self) -> Result<Option<String>, String> {
        match &self.error {
            Some((reason, _)) => Err(reason.clone()),
            None => Ok(self.note.clone()),
        }
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
        Self { config, client }
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
    let mut pods = PodSet::new(discovery.config.scheme.clone(), discovery.config.port);
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
        match pods.health() {
            Err(reason) => ctx.health().unhealthy(reason),
            Ok(_) if !pods.synced() => {}
            Ok(None) => ctx.health().healthy(),
            Ok(Some(note)) => ctx.health().healthy_because(note),
        }
        if !pods.synced() {
            continue;
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
