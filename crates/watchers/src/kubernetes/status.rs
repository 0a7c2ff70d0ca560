//! Status written back to Kubernetes objects: what `statusTemplates` rendered for an
//! object goes to its `status` subresource.
//!
//! [`StatusWriter`] follows `StatusRendered`. For every rendered status of an
//! object of a `kubernetes` watched resource that the object does not show yet and
//! that differs from what this writer last applied, it sends a server-side apply
//! patch to the status subresource (`PATCH .../<plural>/<name>/status`,
//! `application/apply-patch+yaml`, field manager `hapwright`, `force=true`) through
//! `kube::Api<DynamicObject>`, so any kind works, CRDs included. Objects of `files`
//! resources are never written: they are not in the cluster.
//!
//! Only the leader writes (with leader election on); a replica that becomes leader
//! writes what is still pending at once. Writes are rate-limited by a token bucket
//! (`controller.status.qps`, `burst`). A failed write (no RBAC for `<plural>/status`
//! `patch`, a conflict, the API down) is logged, counted
//! (`hapwright_status_writes_total{resource,result="failure"}`), makes the component
//! `degraded` with the reason, and is retried with backoff (1 s doubling to 60 s);
//! a newer render of the same object replaces the pending write. Status writes never
//! affect deployment.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::{
    Component, ComponentError, Context, EventKind, EventPayload, Interest, RenderedStatus,
};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::discovery::Scope;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{ClientFactory, WatchedKind};

/// The field manager of every status patch.
pub const FIELD_MANAGER: &str = "hapwright";

/// The writer's rate limit (`controller.status`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    /// Writes per second, sustained.
    pub qps: f64,
    /// Writes allowed at once after a quiet period.
    pub burst: u32,
}

impl Default for RateLimit {
    /// 10 writes per second with bursts of 20: a full pass over a few hundred
    /// objects after a restart takes seconds, and the API server (which admits a
    /// client's default 5 QPS / 10 burst for ordinary controllers) is not flooded.
    fn default() -> Self {
        Self {
            qps: 10.0,
            burst: 20,
        }
    }
}

/// The writer's metrics.
#[derive(Clone, Debug)]
pub struct StatusMetrics {
    writes: IntCounterVec,
    pending: IntGauge,
}

impl StatusMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = Self::unregistered()?;
        registry.register(Box::new(metrics.writes.clone()))?;
        registry.register(Box::new(metrics.pending.clone()))?;
        Ok(metrics)
    }

    /// The metrics registered nowhere (tests).
    pub fn unregistered() -> prometheus::Result<Self> {
        Ok(Self {
            writes: IntCounterVec::new(
                Opts::new(
                    "hapwright_status_writes_total",
                    "Status patches sent to Kubernetes objects, by watched resource and result.",
                ),
                &["resource", "result"],
            )?,
            pending: IntGauge::new(
                "hapwright_status_pending",
                "Rendered statuses the leader has not written yet (waiting for the rate \
                 limit or a retry); 0 on a follower.",
            )?,
        })
    }

    /// Writes of `resource` with `result` (`success`, `failure`) so far.
    pub fn writes(&self, resource: &str, result: &str) -> u64 {
        self.writes.with_label_values(&[resource, result]).get()
    }

    /// Statuses waiting to be written.
    pub fn pending(&self) -> i64 {
        self.pending.get()
    }

    fn start(&self, resource: &str) {
        for result in ["success", "failure"] {
            self.writes.with_label_values(&[resource, result]);
        }
    }
}

/// The component. See the [module docs](self).
pub struct StatusWriter {
    client: ClientFactory,
    kinds: BTreeMap<Arc<str>, WatchedKind>,
    leadership: Option<watch::Receiver<bool>>,
    rate: RateLimit,
    metrics: StatusMetrics,
}

impl std::fmt::Debug for StatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWriter")
            .field("kinds", &self.kinds)
            .field("rate", &self.rate)
            .finish_non_exhaustive()
    }
}

impl StatusWriter {
    /// The component name.
    pub const NAME: &'static str = "kubernetes-status";

    /// Writes statuses of the objects of `kinds` (watched resource name → its
    /// `apiVersion` and `kind`); statuses of other resources are never written.
    pub fn new(
        client: ClientFactory,
        kinds: impl IntoIterator<Item = (Arc<str>, WatchedKind)>,
        metrics: StatusMetrics,
    ) -> Self {
        Self {
            client,
            kinds: kinds.into_iter().collect(),
            leadership: None,
            rate: RateLimit::default(),
            metrics,
        }
    }

    /// Writes only while `leader` holds `true` (leader election on).
    #[must_use]
    pub fn with_leadership(mut self, leader: watch::Receiver<bool>) -> Self {
        self.leadership = Some(leader);
        self
    }

    /// The rate limit of writes (default [`RateLimit::default`]).
    #[must_use]
    pub fn with_rate_limit(mut self, rate: RateLimit) -> Self {
        self.rate = rate;
        self
    }
}

/// One object: watched resource, namespace, name.
type Key = (Arc<str>, String, String);

/// A token bucket on tokio's clock, so paused-time tests drive it.
struct Bucket {
    rate: RateLimit,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: RateLimit) -> Self {
        Self {
            rate,
            tokens: f64::from(rate.burst.max(1)),
            at: Instant::now(),
        }
    }

    /// Takes a token, or says when the next one is there.
    fn take(&mut self) -> Result<(), Instant> {
        let now = Instant::now();
        let capacity = f64::from(self.rate.burst.max(1));
        let qps = self.rate.qps.max(0.001);
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * qps).min(capacity);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(now + Duration::from_secs_f64((1.0 - self.tokens) / qps))
        }
    }
}

/// A write waiting to be sent.
struct Pending {
    status: RenderedStatus,
    /// Failed attempts so far.
    attempts: u32,
    /// Not before this time (after a failure).
    not_before: Option<Instant>,
    /// The last failure.
    error: Option<String>,
}

struct State {
    client: ClientFactory,
    kinds: BTreeMap<Arc<str>, WatchedKind>,
    metrics: StatusMetrics,
    resources: BTreeMap<Arc<str>, (ApiResource, Scope)>,
    /// What this writer last applied per object.
    applied: BTreeMap<Key, Value>,
    pending: BTreeMap<Key, Pending>,
    bucket: Bucket,
}

/// Why one status write failed (retryable: every variant is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// No Kubernetes client.
    #[error(transparent)]
    ClientUnavailable(#[from] super::ClientError),
    /// The kind's API resource could not be found through discovery.
    #[error("cannot resolve {api_version} {kind}: {reason}")]
    DiscoveryFailed {
        /// `apiVersion` of the kind.
        api_version: String,
        /// The kind.
        kind: String,
        /// The API's answer, in one line.
        reason: String,
    },
    /// The API refused or failed the patch.
    #[error("{0}")]
    PatchFailed(String),
}

impl State {
    /// Takes a new set of rendered statuses: every status the object does not show
    /// and this writer did not apply becomes pending; pending writes of objects
    /// that no longer render anything are dropped.
    fn rendered(&mut self, statuses: &[RenderedStatus]) {
        let mut pending = BTreeMap::new();
        for status in statuses {
            if !self.kinds.contains_key(&status.resource) {
                continue;
            }
            let key: Key = (
                status.resource.clone(),
                status.namespace.clone(),
                status.name.clone(),
            );
            if status.current {
                self.applied.insert(key, status.status.clone());
                continue;
            }
            if self.applied.get(&key) == Some(&status.status) {
                continue;
            }
            let (attempts, not_before, error) = match self.pending.remove(&key) {
                Some(old) => (old.attempts, old.not_before, old.error),
                None => (0, None, None),
            };
            pending.insert(
                key,
                Pending {
                    status: status.clone(),
                    attempts,
                    not_before,
                    error,
                },
            );
        }
        self.pending = pending;
    }

    /// Sends the pending writes that are due, as far as the rate limit allows; when
    /// something is left, the time to try again.
    async fn flush(&mut self) -> Option<Instant> {
        let now = Instant::now();
        let due: Vec<Key> = self
            .pending
            .iter()
            .filter(|(_, p)| p.not_before.is_none_or(|t| t <= now))
            .map(|(key, _)| key.clone())
            .collect();
        let mut wake: Option<Instant> = None;
        for key in due {
            if let Err(next) = self.bucket.take() {
                wake = Some(next);
                break;
            }
            let Some(pending) = self.pending.get(&key) else {
                continue;
            };
            let status = pending.status.clone();
            match self.write(&status).await {
                Ok(()) => {
                    self.metrics
                        .writes
                        .with_label_values(&[&status.resource, "success"])
                        .inc();
                    tracing::info!(
                        kind = status.kind,
                        namespace = status.namespace,
                        name = status.name,
                        "Status written"
                    );
                    self.pending.remove(&key);
                    self.applied.insert(key, status.status);
                }
                Err(error) => {
                    self.metrics
                        .writes
                        .with_label_values(&[&status.resource, "failure"])
                        .inc();
                    let reason = error.to_string();
                    tracing::warn!(
                        kind = status.kind,
                        namespace = status.namespace,
                        name = status.name,
                        error = %reason,
                        "Cannot write status"
                    );
                    if let Some(pending) = self.pending.get_mut(&key) {
                        pending.attempts += 1;
                        pending.not_before = Some(Instant::now() + backoff(pending.attempts));
                        pending.error = Some(reason);
                    }
                }
            }
        }
        let retry = self.pending.values().filter_map(|p| p.not_before).min();
        match (wake, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The first failure still pending, for health.
    fn failure(&self) -> Option<String> {
        self.pending.iter().find_map(|((_, namespace, name), p)| {
            let error = p.error.as_ref()?;
            let object = if namespace.is_empty() {
                name.clone()
            } else {
                format!("{namespace}/{name}")
            };
            Some(format!(
                "cannot write the status of {} {object}: {error}",
                p.status.kind
            ))
        })
    }

    async fn resource(
        &mut self,
        client: &kube::Client,
        resource: &Arc<str>,
    ) -> Result<(ApiResource, Scope), WriteError> {
        if let Some(found) = self.resources.get(resource) {
            return Ok(found.clone());
        }
        let kind = self
            .kinds
            .get(resource)
            .cloned()
            .unwrap_or_else(|| WatchedKind {
                api_version: String::new(),
                kind: String::new(),
            });
        let (group, version) = match kind.api_version.split_once('/') {
            Some((group, version)) => (group.to_owned(), version.to_owned()),
            None => (String::new(), kind.api_version.clone()),
        };
        let gvk = kube::api::GroupVersionKind::gvk(&group, &version, &kind.kind);
        let (api_resource, capabilities) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .map_err(|error| WriteError::DiscoveryFailed {
                api_version: kind.api_version.clone(),
                kind: kind.kind.clone(),
                reason: super::describe_error(&error),
            })?;
        let found = (api_resource, capabilities.scope);
        self.resources.insert(resource.clone(), found.clone());
        Ok(found)
    }

    async fn write(&mut self, status: &RenderedStatus) -> Result<(), WriteError> {
        let client = self.client.get().await?;
        let (api_resource, scope) = self.resource(&client, &status.resource).await?;
        let api: Api<DynamicObject> = match scope {
            Scope::Namespaced => Api::namespaced_with(client, &status.namespace, &api_resource),
            Scope::Cluster => Api::all_with(client, &api_resource),
        };
        let mut metadata = json!({"name": status.name});
        if scope == Scope::Namespaced {
            metadata["namespace"] = json!(status.namespace);
        }
        let patch = json!({
            "apiVersion": api_resource.api_version,
            "kind": api_resource.kind,
            "metadata": metadata,
            "status": status.status,
        });
        api.patch_status(
            &status.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|error| WriteError::PatchFailed(super::describe_error(&error)))?;
        Ok(())
    }
}

/// Delay before the `attempt`-th retry of one object: 1 s doubling to 60 s.
fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.saturating_sub(1).min(6)).min(Duration::from_secs(60))
}

#[async_trait::async_trait]
impl Component for StatusWriter {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([EventKind::StatusRendered])
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        let StatusWriter {
            client,
            kinds,
            mut leadership,
            rate,
            metrics,
        } = *self;
        for resource in kinds.keys() {
            metrics.start(resource);
        }
        metrics.pending.set(0);
        let mut state = State {
            client,
            kinds,
            metrics: metrics.clone(),
            resources: BTreeMap::new(),
            applied: BTreeMap::new(),
            pending: BTreeMap::new(),
            bucket: Bucket::new(rate),
        };
        let mut wake: Option<Instant> = None;
        ctx.health().healthy();
        loop {
            let leader = leadership.as_ref().is_none_or(|l| *l.borrow());
            if leader && wake.is_none_or(|at| at <= Instant::now()) {
                let cancel = ctx.cancellation_token().clone();
                wake = tokio::select! {
                    biased;
                    () = cancel.cancelled() => return Ok(()),
                    wake = state.flush() => wake,
                };
                match state.failure() {
                    Some(reason) => ctx.health().degraded(reason),
                    None => ctx.health().healthy(),
                }
            }
            metrics.pending.set(if leader {
                state.pending.len() as i64
            } else {
                0
            });
            let sleep = async {
                match wake {
                    Some(at) if leader => tokio::time::sleep_until(at).await,
                    _ => std::future::pending().await,
                }
            };
            let leadership_changed = async {
                match leadership.as_mut() {
                    Some(l) => {
                        if l.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                event = ctx.next_event() => {
                    let Some(event) = event else { return Ok(()) };
                    if let EventPayload::StatusRendered(rendered) = &event.payload {
                        state.rendered(&rendered.statuses);
                        // New writes go out as soon as the rate limit allows.
                        wake = None;
                    }
                }
                () = leadership_changed => {
                    if leadership.as_ref().is_some_and(|l| *l.borrow()) {
                        tracing::info!(pending = state.pending.len(), "Leading: writing pending statuses");
                        wake = None;
                    }
                }
                () = sleep => {
                    wake = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_bucket_allows_a_burst_then_the_rate() {
        let mut bucket = Bucket::new(RateLimit { qps: 2.0, burst: 3 });
        for _ in 0..3 {
            assert!(bucket.take().is_ok());
        }
        let next = bucket.take().unwrap_err();
        assert_eq!(next - Instant::now(), Duration::from_millis(500));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(bucket.take().is_ok());
        assert!(bucket.take().is_err());
    }

    #[test]
    fn backoff_doubles_to_a_minute() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(7), Duration::from_secs(60));
        assert_eq!(backoff(30), Duration::from_secs(60));
    }
}
