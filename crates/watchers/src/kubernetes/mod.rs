//! Everything that talks to the Kubernetes API: the `kubernetes` source,
//! HAProxy pod discovery and leader election.
//!
//! # Layout
//!
//! - [`ClientFactory`]: one [`kube::Client`] per process, built on first use from the
//!   in-cluster service account or the kubeconfig (`kube::Client::try_default`), or
//!   given (tests pass a `tower-test` mock).
//! - [`source`]: the `kubernetes` source component ([`KubernetesSource`]): a
//!   `kube::runtime::watcher` per namespace on `DynamicObject`, resolved through API
//!   discovery, feeding the same snapshot/`indexBy` machinery as the files source.
//! - [`discovery`]: the pod discovery component ([`PodDiscovery`]): ready HAProxy pods
//!   become Data Plane API deploy targets (`InstancesDiscovered`).
//! - [`events`]: Kubernetes Events on quarantined objects ([`QuarantineEvents`]),
//!   written by the leader through the `events.k8s.io/v1` API.
//! - [`status`]: statuses rendered by `statusTemplates` written to the objects'
//!   status subresource by server-side apply ([`StatusWriter`]), by the leader.
//! - [`leader`]: process-level leader election on a `coordination.k8s.io/v1` Lease
//!   ([`LeaderElection`]), publishing is-leader on a `tokio::sync::watch` channel.
//!
//! Errors from the API are turned into one-line reasons ([`describe_error`],
//! [`describe_watcher_error`]) that name the API's own reason and message, for
//! component health and logs.

pub mod discovery;
pub mod events;
pub mod leader;
pub mod source;
pub mod status;

use std::sync::Arc;

use kube::runtime::watcher;
use tokio::sync::Mutex;

pub use discovery::{DiscoveryConfig, DiscoveryMetrics, PodDiscovery, Restriction};
pub use events::{QuarantineEvents, WatchedKind};
pub use leader::{LeaderElection, LeaderElectionConfig, LeaderError, LeaderMetrics};
pub use source::{KubernetesSource, ResolveError};
pub use status::{RateLimit, StatusMetrics, StatusWriter};

/// Hands out the process's Kubernetes client, building it on first use.
///
/// Cloning shares the client. A failed build is not cached: the next [`get`](Self::get)
/// tries again (a kubeconfig may appear, the API server may come up).
#[derive(Clone, Default)]
pub struct ClientFactory {
    client: Arc<Mutex<Option<kube::Client>>>,
}

impl std::fmt::Debug for ClientFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientFactory").finish_non_exhaustive()
    }
}

impl ClientFactory {
    /// A factory that builds the client from the environment on first use: the
    /// in-cluster service account, else `KUBECONFIG` / `~/.kube/config`.
    pub fn from_environment() -> Self {
        Self::default()
    }

    /// A factory that always hands out `client` (tests pass a mock-backed client).
    pub fn with_client(client: kube::Client) -> Self {
        Self {
            client: Arc::new(Mutex::new(Some(client))),
        }
    }

    /// The client, building it when it does not exist yet.
    ///
    /// # Errors
    ///
    /// [`ClientError::BuildFailed`]; its message is a one-line reason for component
    /// health.
    pub async fn get(&self) -> Result<kube::Client, ClientError> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref() {
            return Ok(client.clone());
        }
        let client = kube::Client::try_default()
            .await
            .map_err(|error| ClientError::BuildFailed { error })?;
        *slot = Some(client.clone());
        Ok(client)
    }
}

/// Why no Kubernetes client is available. Retryable: the components that need a
/// client report `Unhealthy` with this message and try again with backoff, since a
/// service account token or kubeconfig may appear later.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Neither the in-cluster service account nor a kubeconfig gave a client.
    #[error(
        "cannot build a Kubernetes client (neither in-cluster service account nor \
         kubeconfig usable): {}",
        describe_error(error)
    )]
    BuildFailed {
        /// kube's error, whose causes the message already lists ([`describe_error`]).
        error: kube::Error,
    },
}

/// A one-line description of a client error: for API errors the status code, the
/// API's reason (`Forbidden`, `NotFound`, `Gone`) and its message.
pub fn describe_error(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => describe_status(status),
        other => {
            let mut text = other.to_string();
            let mut source = std::error::Error::source(other);
            while let Some(cause) = source {
                let line = cause.to_string();
                if !text.contains(&line) {
                    text.push_str(": ");
                    text.push_str(&line);
                }
                source = cause.source();
            }
            text
        }
    }
}

/// `403 Forbidden: <message>`: an API status in one line.
pub fn describe_status(status: &kube::core::Status) -> String {
    let reason = if status.reason.is_empty() {
        "error"
    } else {
        status.reason.as_str()
    };
    if status.message.is_empty() {
        format!("{} {reason}", status.code)
    } else {
        format!("{} {reason}: {}", status.code, status.message)
    }
}

/// A one-line description of a watcher error, naming the step that failed.
pub fn describe_watcher_error(error: &watcher::Error) -> String {
    match error {
        watcher::Error::InitialListFailed(e) => format!("list failed: {}", describe_error(e)),
        watcher::Error::WatchStartFailed(e) => {
            format!("watch could not start: {}", describe_error(e))
        }
        watcher::Error::WatchError(status) => format!("watch error: {}", describe_status(status)),
        watcher::Error::WatchFailed(e) => format!("watch failed: {}", describe_error(e)),
        watcher::Error::NoResourceVersion => {
            "the API returned no resourceVersion (does this kind support watch?)".to_owned()
        }
    }
}

/// True when a watcher error is `410 Gone` (the watch's resourceVersion expired): the
/// watcher relists on its own, so this is routine, not a failure.
pub fn is_gone(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchError(status) if status.code == 410)
}

/// Sleeps `delay` unless `cancel` fires first; returns false when cancelled.
pub(crate) async fn sleep_or_cancel(
    delay: std::time::Duration,
    cancel: &tokio_util::sync::CancellationToken,
) -> bool {
    tokio::select! {
        biased;
        () = cancel.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
}

/// Retry delays for API calls that have no backoff of their own (discovery of the
/// kind, building the client, the Lease): 1 s doubling to 60 s, with jitter, forever.
pub(crate) fn retry_delays() -> impl Iterator<Item = std::time::Duration> {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_secs(1))
        .with_max_delay(std::time::Duration::from_secs(60))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}
