//! The `kubernetes` source: objects of one kind from the API server turned into
//! `ResourceIndexUpdated` events carrying indexed snapshots.
//!
//! # Behaviour
//!
//! - The kind is resolved through API discovery (`kube::discovery::pinned_kind`),
//!   which gives the real plural and whether the kind is namespaced. A kind the
//!   server does not serve, or a discovery request that is denied, makes the source
//!   `Unhealthy` with the reason (naming the config entry, `file:line` when known)
//!   and is retried with backoff (a CRD may be installed later); it never stops the
//!   controller, but the first render waits for every mandatory source.
//! - An **optional** resource (`optional: true`) whose kind the server does not serve
//!   (discovery has no such kind or group: 404, or the list answers 404) publishes an
//!   empty snapshot and `ResourceSyncComplete` once, so the first render goes ahead,
//!   and reports `Degraded` with the reason. Discovery is retried with the same
//!   backoff (at most a minute apart): a kind installed later is watched and its
//!   objects published as an ordinary change.
//! - One `kube::runtime::watcher` per configured namespace (all namespaces when none
//!   are listed, and always for cluster-scoped kinds), with the `labelSelector` and
//!   `fieldSelector`, merged into one stream. Each watcher lists, then watches from the
//!   list's resourceVersion, resumes after a dropped connection, relists after
//!   `410 Gone`, and asks for bookmarks; errors are retried with
//!   `WatchStreamExt::default_backoff`.
//! - `ignoreFields` are removed before an object is stored, after
//!   [`KubernetesSource::default_ignore_fields`] (`metadata.managedFields` and the
//!   `kubectl.kubernetes.io/last-applied-configuration` annotation). Objects from a
//!   list lack `apiVersion`/`kind`; the source fills them in, so templates see the
//!   same shape as from a manifest file.
//! - Objects are keyed by namespace/name (cluster-scoped: empty namespace) and stored
//!   in a [`ResourceSnapshot`] with the resource's `indexBy`: the same machinery as
//!   the files source.
//! - A (re)list is buffered and applied at its end as one change: objects missing
//!   from the new list are removed. Events that arrive together (a relist, a burst of
//!   watch events) are applied as one batch and published as one
//!   `ResourceIndexUpdated`, never one event per object.
//! - The first snapshot is published when every watcher finished its initial list,
//!   followed by `ResourceSyncComplete`; the debouncer holds the first render until
//!   then.
//! - Health: a failing list or watch (RBAC denied, the API unreachable) makes the
//!   source `Unhealthy` with the API's reason (`403 Forbidden: ...`); the objects
//!   already stored stay. The next successful list or event makes it healthy again,
//!   as do [`RECOVERY_QUIET_PERIOD`] (90 s) without another failure: the watcher
//!   retries at least every 30 s and reports each failure, and a resumed watch on a
//!   quiet resource delivers nothing else to go by.
//!   A `410 Gone` is routine: the source stays healthy, with a note, while it relists.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use hapwright_eventbus::config::ConfigIssue;
use hapwright_eventbus::model::{
    FieldPath, IndexedObject, ObjectKey, ResourceChange, ResourceSnapshot,
};
use hapwright_eventbus::{
    Component, ComponentError, Context, Health, HealthState, ResourceIndexUpdated,
    ResourceSyncComplete,
};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, TypeMeta};
use kube::discovery::{ApiCapabilities, Scope};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::time::Instant;
use tracing::Instrument;

use super::{
    ClientError, ClientFactory, describe_error, describe_watcher_error, is_gone, retry_delays,
};
use crate::config::{KubernetesConfig, WatchedResource};

/// Most watch events applied in one batch before a snapshot is published.
pub const MAX_BATCH: usize = 4096;

/// A failed watch that reports no new failure for this long is considered recovered.
pub const RECOVERY_QUIET_PERIOD: Duration = Duration::from_secs(90);

/// What one watcher stream covers: one namespace, or every namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
struct StreamScope {
    namespace: Option<String>,
}

impl StreamScope {
    fn covers(&self, key: &ObjectKey) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|namespace| key.namespace == namespace)
    }

    fn describe(&self) -> String {
        match &self.namespace {
            Some(namespace) => format!("namespace {namespace}"),
            None => "all namespaces".to_owned(),
        }
    }
}

#[derive(Debug)]
struct StreamState {
    scope: StreamScope,
    /// Objects of a (re)list in progress, applied at `InitDone`.
    relist: Option<BTreeMap<ObjectKey, IndexedObject>>,
    /// Whether the initial list finished once.
    synced: bool,
    /// Why the stream's last request failed, and when; cleared by the next success
    /// or after [`RECOVERY_QUIET_PERIOD`] without another failure.
    error: Option<(String, Instant)>,
    /// A routine condition worth showing (relisting after `410 Gone`).
    note: Option<String>,
    /// The last list answered 404: the API server does not serve the kind (now).
    missing: bool,
}

/// The synchronous core of the kubernetes source: applies watcher events of one or
/// more streams to the snapshot and accumulates what changed between publications.
#[derive(Debug)]
pub struct Store {
    api_resource: ApiResource,
    ignore_fields: Vec<FieldPath>,
    snapshot: ResourceSnapshot,
    streams: Vec<StreamState>,
    /// Keys touched since the last [`take_change`](Self::take_change), with whether
    /// each existed before.
    touched: BTreeMap<ObjectKey, bool>,
}

impl Store {
    /// A store for objects of `api_resource` from one stream per entry of
    /// `namespaces` (`None`: every namespace), stripping `ignore_fields` and indexing
    /// by `index_by`.
    pub fn new(
        api_resource: ApiResource,
        namespaces: &[Option<String>],
        ignore_fields: Vec<FieldPath>,
        index_by: Vec<FieldPath>,
    ) -> Self {
        Self {
            api_resource,
            ignore_fields,
            snapshot: ResourceSnapshot::new(index_by),
            streams: namespaces
                .iter()
                .map(|namespace| StreamState {
                    scope: StreamScope {
                        namespace: namespace.clone(),
                    },
                    relist: None,
                    synced: false,
                    error: None,
                    note: None,
                    missing: false,
                })
                .collect(),
            touched: BTreeMap::new(),
        }
    }

    /// The current snapshot (cheap to clone).
    pub fn snapshot(&self) -> &ResourceSnapshot {
        &self.snapshot
    }

    /// True once every stream finished its initial list.
    pub fn synced(&self) -> bool {
        self.streams.iter().all(|s| s.synced)
    }

    /// True when a stream's last list answered 404 Not Found: the API server does
    /// not serve the kind (any more).
    pub fn missing(&self) -> bool {
        self.streams.iter().any(|s| s.missing)
    }

    /// Applies one item of stream `stream`.
    pub fn handle(
        &mut self,
        stream: usize,
        item: Result<watcher::Event<DynamicObject>, watcher::Error>,
    ) {
        match item {
            Ok(event) => self.apply(stream, event),
            Err(error) => self.fail(stream, &error),
        }
    }

    /// Applies one watcher event of stream `stream`.
    pub fn apply(&mut self, stream: usize, event: watcher::Event<DynamicObject>) {
        match event {
            watcher::Event::Init => {
                self.streams[stream].relist = Some(BTreeMap::new());
            }
            watcher::Event::InitApply(object) => {
                if let Some((key, indexed)) = self.prepare(object) {
                    self.streams[stream]
                        .relist
                        .get_or_insert_with(BTreeMap::new)
                        .insert(key, indexed);
                }
            }
            watcher::Event::InitDone => {
                let listed = self.streams[stream].relist.take().unwrap_or_default();
                let scope = self.streams[stream].scope.clone();
                let stale: Vec<ObjectKey> = self
                    .snapshot
                    .iter()
                    .map(|(key, _)| key)
                    .filter(|key| scope.covers(key) && !listed.contains_key(*key))
                    .cloned()
                    .collect();
                for key in stale {
                    self.remove(key);
                }
                for (key, indexed) in listed {
                    self.upsert(key, indexed);
                }
                let state = &mut self.streams[stream];
                state.synced = true;
                state.error = None;
                state.note = None;
                state.missing = false;
            }
            watcher::Event::Apply(object) => {
                if let Some((key, indexed)) = self.prepare(object) {
                    self.upsert(key, indexed);
                }
                self.streams[stream].error = None;
            }
            watcher::Event::Delete(object) => {
                if let Some(key) = key_of(&object) {
                    self.remove(key);
                }
                self.streams[stream].error = None;
            }
        }
    }

    /// Records a failure of stream `stream`: `410 Gone` as a note (the watcher relists),
    /// anything else as the stream's error.
    pub fn fail(&mut self, stream: usize, error: &watcher::Error) {
        let state = &mut self.streams[stream];
        let reason = format!(
            "{}: {}",
            state.scope.describe(),
            describe_watcher_error(error)
        );
        state.missing = matches!(
            error,
            watcher::Error::InitialListFailed(kube::Error::Api(status)) if status.code == 404
        );
        if is_gone(error) {
            tracing::info!(%reason, "Watch expired; relisting");
            state.note = Some(format!("relisting after {reason}"));
        } else {
            tracing::warn!(%reason, "Kubernetes watch failed; retrying with backoff");
            state.error = Some((reason, Instant::now()));
        }
    }

    /// When the oldest recorded failure counts as recovered if nothing fails again.
    pub fn error_expiry(&self) -> Option<Instant> {
        self.streams
            .iter()
            .filter_map(|s| s.error.as_ref().map(|(_, at)| *at + RECOVERY_QUIET_PERIOD))
            .min()
    }

    /// Clears failures older than [`RECOVERY_QUIET_PERIOD`]: the watcher retries a
    /// failed request at least every 30 s and reports each failure, so a quiet period
    /// means the retry succeeded (a resumed watch that delivers no events yields
    /// nothing else to go by).
    pub fn expire_errors(&mut self, now: Instant) {
        for state in &mut self.streams {
            if let Some((reason, at)) = &state.error
                && *at + RECOVERY_QUIET_PERIOD <= now
            {
                tracing::info!(%reason, "No failure since; the watch recovered");
                state.error = None;
            }
        }
    }

    /// `Unhealthy` when a stream is failing, with the first failure and how many more
    /// streams fail as the reason; otherwise `Healthy`, with a note if a stream has one.
    pub fn health(&self) -> Health {
        let unhealthy = |reason: String| Health::new(HealthState::Unhealthy, Some(reason));
        let errors: Vec<&String> = self
            .streams
            .iter()
            .filter_map(|s| s.error.as_ref().map(|(reason, _)| reason))
            .collect();
        match errors.as_slice() {
            [] => Health::new(
                HealthState::Healthy,
                self.streams.iter().find_map(|s| s.note.clone()),
            ),
            [only] => unhealthy((*only).clone()),
            [first, rest @ ..] => unhealthy(format!(
                "{first} (and {} more namespace{} failing)",
                rest.len(),
                if rest.len() == 1 { "" } else { "s" }
            )),
        }
    }

    /// What changed since the last call, comparing each touched object's presence
    /// before and now.
    pub fn take_change(&mut self) -> ResourceChange {
        let mut change = ResourceChange::default();
        for (key, existed) in std::mem::take(&mut self.touched) {
            match (existed, self.snapshot.get_by_key(&key).is_some()) {
                (false, true) => change.added.push(key),
                (true, true) => change.modified.push(key),
                (true, false) => change.removed.push(key),
                (false, false) => {}
            }
        }
        change
    }

    fn upsert(&mut self, key: ObjectKey, indexed: IndexedObject) {
        let existed = self.snapshot.get_by_key(&key).is_some();
        if self.snapshot.upsert_indexed(key.clone(), indexed).is_some() {
            self.touched.entry(key).or_insert(existed);
        }
    }

    fn remove(&mut self, key: ObjectKey) {
        if self.snapshot.remove(&key).is_some() {
            self.touched.entry(key).or_insert(true);
        }
    }

    /// Fills in `apiVersion`/`kind`, strips the ignored fields, serializes and indexes.
    fn prepare(&self, mut object: DynamicObject) -> Option<(ObjectKey, IndexedObject)> {
        let key = key_of(&object)?;
        if object.types.is_none() {
            object.types = Some(TypeMeta {
                api_version: self.api_resource.api_version.clone(),
                kind: self.api_resource.kind.clone(),
            });
        }
        let mut value = match serde_json::to_value(&object) {
            Ok(value) => value,
            Err(error) => {
                tracing::warn!(object = %key, %error, "Cannot serialize an object; skipping it");
                return None;
            }
        };
        for field in &self.ignore_fields {
            field.remove(&mut value);
        }
        let indexed = IndexedObject::new(&value, self.snapshot.index_by());
        Some((key, indexed))
    }
}

fn key_of(object: &DynamicObject) -> Option<ObjectKey> {
    let Some(name) = object.metadata.name.clone() else {
        tracing::warn!("The API returned an object without metadata.name; skipping it");
        return None;
    };
    Some(ObjectKey::new(
        object.metadata.namespace.clone().unwrap_or_default(),
        name,
    ))
}

/// Splits `apiVersion` into group and version and names the kind.
pub fn group_version_kind(api_version: &str, kind: &str) -> GroupVersionKind {
    match api_version.split_once('/') {
        Some((group, version)) => GroupVersionKind::gvk(group, version, kind),
        None => GroupVersionKind::gvk("", api_version, kind),
    }
}

// === impl KubernetesSource ===

/// The `kubernetes` source component. Its name is `source/<resource name>`.
pub struct KubernetesSource {
    component: String,
    resource: Arc<str>,
    config: KubernetesConfig,
    index_by: Vec<FieldPath>,
    ignore_fields: Vec<FieldPath>,
    client: ClientFactory,
    optional: bool,
    /// Where the resource is configured (`hapwright.yaml:12`), for error messages.
    location: Option<String>,
}

impl std::fmt::Debug for KubernetesSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesSource")
            .field("resource", &self.resource)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl KubernetesSource {
    /// Builds the source for watched resource `name`. Fails when the resource has no
    /// `kubernetes` source.
    pub fn new(
        name: &str,
        resource: &WatchedResource,
        client: ClientFactory,
    ) -> Result<Self, ConfigIssue> {
        let Some(config) = &resource.kubernetes else {
            return Err(ConfigIssue::new(name, "not a `kubernetes` source"));
        };
        let mut ignore_fields = Self::default_ignore_fields();
        for field in &resource.ignore_fields {
            if !ignore_fields.contains(field) {
                ignore_fields.push(field.clone());
            }
        }
        Ok(Self {
            component: format!("source/{name}"),
            resource: name.into(),
            config: config.clone(),
            index_by: resource.index_by.clone(),
            ignore_fields,
            client,
            optional: resource.optional,
            location: None,
        })
    }

    /// Names where the resource is configured (`hapwright.yaml:12`), so a kind the
    /// API server does not serve is reported at the config entry that asks for it.
    #[must_use]
    pub fn with_location(mut self, location: impl Into<String>) -> Self {
        self.location = Some(location.into());
        self
    }

    /// `watchedResources.<name> (file:line)`: the config entry, for messages.
    fn entry(&self) -> String {
        match &self.location {
            Some(location) => format!("watchedResources.{} ({location})", self.resource),
            None => format!("watchedResources.{}", self.resource),
        }
    }

    /// The health reason of a source that cannot resolve its kind.
    fn unresolved(&self, error: &ResolveError) -> String {
        if error.is_not_served() {
            format!(
                "{}: {error}; mark it `optional: true` to render without it",
                self.entry()
            )
        } else {
            format!("{}: {error}", self.entry())
        }
    }

    /// The health reason of an optional source whose kind is not served.
    fn absent(&self, why: &str) -> String {
        format!(
            "optional {} is empty: {why}; its objects are picked up when the kind appears",
            self.entry()
        )
    }

    /// Fields stripped from every object before `ignoreFields`: `metadata.managedFields`
    /// and the `kubectl.kubernetes.io/last-applied-configuration` annotation (bulky,
    /// and never useful to a template).
    pub fn default_ignore_fields() -> Vec<FieldPath> {
        [
            "metadata.managedFields",
            r"metadata.annotations.kubectl\.kubernetes\.io/last-applied-configuration",
        ]
        .into_iter()
        .map(|p| FieldPath::parse(p).expect("static path parses"))
        .collect()
    }

    /// The client, the kind's API resource and its capabilities; the error's message
    /// is the reason for `Unhealthy`.
    async fn resolve(&self) -> Result<(kube::Client, ApiResource, ApiCapabilities), ResolveError> {
        let client = self.client.get().await?;
        let gvk = group_version_kind(&self.config.api_version, &self.config.kind);
        match kube::discovery::pinned_kind(&client, &gvk).await {
            Ok((resource, capabilities)) => Ok((client, resource, capabilities)),
            Err(kube::Error::Discovery(kube::error::DiscoveryError::MissingKind(_))) => {
                Err(ResolveError::KindNotServed {
                    api_version: self.config.api_version.clone(),
                    kind: self.config.kind.clone(),
                })
            }
            Err(error) => Err(ResolveError::DiscoveryFailed {
                api_version: self.config.api_version.clone(),
                kind: self.config.kind.clone(),
                error,
            }),
        }
    }

    /// The namespaces to watch: each configured one, or `None` for all (always for
    /// cluster-scoped kinds).
    fn namespaces(&self, capabilities: &ApiCapabilities) -> Vec<Option<String>> {
        if capabilities.scope == Scope::Cluster {
            if !self.config.namespaces.is_empty() {
                tracing::warn!(
                    kind = %self.config.kind,
                    "The kind is cluster-scoped; `namespaces` does not apply"
                );
            }
            return vec![None];
        }
        if self.config.namespaces.is_empty() {
            return vec![None];
        }
        let unique: BTreeSet<&String> = self.config.namespaces.iter().collect();
        unique.into_iter().map(|ns| Some(ns.clone())).collect()
    }

    fn watcher_config(&self) -> watcher::Config {
        let mut config = watcher::Config::default();
        if let Some(labels) = &self.config.label_selector {
            config = config.labels(labels);
        }
        if let Some(fields) = &self.config.field_selector {
            config = config.fields(fields);
        }
        config
    }
}

#[async_trait::async_trait]
impl Component for KubernetesSource {
    fn name(&self) -> &str {
        &self.component
    }

    async fn run(self: Box<Self>, ctx: Context) -> Result<(), ComponentError> {
        let span = tracing::info_span!(
            "kubernetes_source",
            source = %self.resource,
            api_version = %self.config.api_version,
            kind = %self.config.kind,
        );
        run(*self, ctx).instrument(span).await
    }
}

/// Why the source cannot start watching. Every variant is retryable: the source
/// reports `Unhealthy` with the message and resolves again with backoff (a CRD may be
/// installed, the API server may come back).
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// No Kubernetes client could be built.
    #[error(transparent)]
    ClientUnavailable(#[from] ClientError),
    /// API discovery worked but does not list the configured kind.
    #[error(
        "the API server does not serve kind `{kind}` in `{api_version}` (is the CRD installed?)"
    )]
    KindNotServed {
        /// The configured `apiVersion`.
        api_version: String,
        /// The configured `kind`.
        kind: String,
    },
    /// API discovery itself failed (unreachable, forbidden, ...).
    #[error(
        "cannot resolve `{api_version}` `{kind}` through API discovery: {}",
        describe_error(error)
    )]
    DiscoveryFailed {
        /// The configured `apiVersion`.
        api_version: String,
        /// The configured `kind`.
        kind: String,
        /// kube's error, whose causes the message already lists.
        error: kube::Error,
    },
}

impl ResolveError {
    /// Whether the API server does not serve the kind: discovery has no such kind, or
    /// no such group version (404). Denied or failed requests are not that.
    pub fn is_not_served(&self) -> bool {
        match self {
            ResolveError::KindNotServed { .. } => true,
            ResolveError::DiscoveryFailed {
                error: kube::Error::Api(status),
                ..
            } => status.code == 404,
            _ => false,
        }
    }
}

/// Publishes what an optional source holds while its kind is not served (nothing, or
/// what it held before), then `ResourceSyncComplete`: the first render need not wait.
fn publish_absent(
    source: &KubernetesSource,
    ctx: &Context,
    snapshot: ResourceSnapshot,
    change: ResourceChange,
) {
    tracing::info!(
        objects = snapshot.len(),
        "Optional resource's kind is not served; rendering without it"
    );
    ctx.publisher().publish(ResourceIndexUpdated {
        source: source.resource.clone(),
        snapshot: Arc::new(snapshot),
        change: Arc::new(change),
    });
    ctx.publisher().publish(ResourceSyncComplete {
        source: source.resource.clone(),
    });
}

type Tagged = (usize, Result<watcher::Event<DynamicObject>, watcher::Error>);

async fn run(source: KubernetesSource, ctx: Context) -> Result<(), ComponentError> {
    let mut delays = retry_delays();
    // Whether the first snapshot and `ResourceSyncComplete` went out.
    let mut synced = false;
    let (client, api_resource, capabilities) = loop {
        match source.resolve().await {
            Ok(resolved) => break resolved,
            Err(error) if source.optional && error.is_not_served() => {
                let reason = source.absent(&error.to_string());
                if synced {
                    tracing::debug!(%reason, "Optional Kubernetes resource still not served");
                } else {
                    tracing::info!(%reason, "Optional Kubernetes resource not served; checking again with backoff");
                }
                ctx.health().degraded(reason);
                if !synced {
                    synced = true;
                    publish_absent(
                        &source,
                        &ctx,
                        ResourceSnapshot::new(source.index_by.clone()),
                        ResourceChange::default(),
                    );
                }
                let delay = delays.next().unwrap_or(std::time::Duration::from_secs(60));
                if !super::sleep_or_cancel(delay, ctx.cancellation_token()).await {
                    return Ok(());
                }
            }
            Err(error) => {
                let reason = source.unresolved(&error);
                tracing::warn!(%reason, "Cannot start the Kubernetes source; retrying");
                ctx.health().unhealthy(reason);
                let delay = delays.next().unwrap_or(std::time::Duration::from_secs(60));
                if !super::sleep_or_cancel(delay, ctx.cancellation_token()).await {
                    return Ok(());
                }
            }
        }
    };
    let namespaces = source.namespaces(&capabilities);
    tracing::info!(
        plural = %api_resource.plural,
        namespaced = capabilities.scope == Scope::Namespaced,
        namespaces = ?namespaces,
        "Watching Kubernetes objects"
    );
    let config = source.watcher_config();
    let streams = namespaces.iter().enumerate().map(|(index, namespace)| {
        let api: Api<DynamicObject> = match namespace {
            Some(namespace) => Api::namespaced_with(client.clone(), namespace, &api_resource),
            None => Api::all_with(client.clone(), &api_resource),
        };
        watcher(api, config.clone())
            .default_backoff()
            .map(move |item| -> Tagged { (index, item) })
            .boxed()
    });
    let mut events = futures::stream::select_all(streams);
    let mut store = Store::new(
        api_resource,
        &namespaces,
        source.ignore_fields.clone(),
        source.index_by.clone(),
    );
    loop {
        let expiry = store.error_expiry();
        let first = tokio::select! {
            biased;
            () = ctx.cancelled() => return Ok(()),
            item = events.next() => Some(item),
            () = tokio::time::sleep_until(expiry.unwrap_or_else(Instant::now)), if expiry.is_some() => None,
        };
        let mut batch = 0;
        match first {
            None => store.expire_errors(Instant::now()),
            Some(None) => return Err("the Kubernetes watch streams ended".into()),
            Some(Some((index, item))) => {
                store.handle(index, item);
                batch = 1;
                while batch < MAX_BATCH {
                    match events.next().now_or_never() {
                        Some(Some((index, item))) => {
                            store.handle(index, item);
                            batch += 1;
                        }
                        _ => break,
                    }
                }
            }
        }
        // Health first, so whoever sees the update also sees the matching health.
        // Healthy only once every namespace has been listed.
        let missing = source.optional && store.missing();
        let health = store.health();
        match (health.state, health.reason) {
            (HealthState::Healthy, _) if !store.synced() => {}
            (HealthState::Healthy, None) => ctx.health().healthy(),
            (HealthState::Healthy, Some(note)) => ctx.health().healthy_because(note),
            (_, reason) if missing => {
                ctx.health()
                    .degraded(source.absent(&reason.unwrap_or_default()));
            }
            (_, reason) => ctx.health().unhealthy(reason.unwrap_or_default()),
        }
        if !synced && missing {
            // The list answers 404 (the CRD went away after discovery, or discovery
            // is stale): render without it; the watcher keeps retrying the list.
            synced = true;
            let change = store.take_change();
            publish_absent(&source, &ctx, store.snapshot().clone(), change);
            continue;
        }
        if !synced && !store.synced() {
            continue;
        }
        let change = store.take_change();
        let first_sync = !synced;
        if !change.is_empty() || first_sync {
            tracing::debug!(
                added = change.added.len(),
                modified = change.modified.len(),
                removed = change.removed.len(),
                objects = store.snapshot().len(),
                events = batch,
                "Resources updated"
            );
            ctx.publisher().publish(ResourceIndexUpdated {
                source: source.resource.clone(),
                snapshot: Arc::new(store.snapshot().clone()),
                change: Arc::new(change),
            });
        }
        if first_sync {
            synced = true;
            tracing::info!(objects = store.snapshot().len(), "Initial sync complete");
            ctx.publisher().publish(ResourceSyncComplete {
                source: source.resource.clone(),
            });
        }
    }
}
