//! Leader election among hapwright replicas (`controller.leaderElection`) on a
//! `coordination.k8s.io/v1` Lease, with `kube-lease-manager`.
//!
//! # Behaviour
//!
//! - [`LeaderElection::start`] spawns one task for the life of the process (it is not
//!   part of a reinit iteration, so a config change never drops leadership). The task
//!   creates the Lease when missing, takes it when it is free or expired, renews it
//!   `grace` seconds before it expires, and publishes is-leader on a
//!   `tokio::sync::watch` channel ([`LeaderElection::subscribe`]); the deployer deploys
//!   only while it reads `true`. Everything else (watching, rendering, validating)
//!   runs on every replica, so a new leader deploys at once (hot standby).
//! - Holder identity: the pod name from `POD_NAME` (downward API), else the hostname
//!   (a pod's hostname is its name), else a random string.
//! - Any API failure (RBAC denied, the API unreachable, the Lease deleted) makes this
//!   replica step down at once (`false`) — it cannot prove it still holds the lease —
//!   and start over with backoff; if it still holds the Lease it becomes leader again
//!   on the first successful read.
//! - [`LeaderElection::shutdown`] releases the Lease when held, so a standby takes
//!   over without waiting for the lease to expire.
//! - Metrics ([`LeaderMetrics`]): `hapwright_leader` (1 while leader) and
//!   `hapwright_leader_transitions_total` (every change of that gauge).

use std::time::Duration;

use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use prometheus::{IntCounter, IntGauge, Registry};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{ClientError, ClientFactory, describe_error, retry_delays};

/// How long releasing the Lease at shutdown may take.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings of one election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    /// Name of the Lease.
    pub lease_name: String,
    /// Namespace of the Lease; `None`: the client's default namespace (in a pod, its
    /// own).
    pub namespace: Option<String>,
    /// This replica's holder identity.
    pub identity: String,
    /// Seconds a lease is valid after its last renewal: how long a crashed leader
    /// blocks a takeover.
    pub lease_duration_seconds: u64,
    /// The leader renews this many seconds before the lease expires. Must be shorter
    /// than the duration.
    pub grace_seconds: u64,
}

impl LeaderElectionConfig {
    /// Default lease duration: 15 s.
    pub const DEFAULT_LEASE_DURATION_SECONDS: u64 = 15;
    /// Default renewal margin: 5 s (renewals every 10 s).
    pub const DEFAULT_GRACE_SECONDS: u64 = 5;

    /// An election on Lease `lease_name` with this process's identity
    /// ([`identity_from_environment`](Self::identity_from_environment)) and the default
    /// timings.
    pub fn new(lease_name: impl Into<String>, namespace: Option<String>) -> Self {
        Self {
            lease_name: lease_name.into(),
            namespace,
            identity: Self::identity_from_environment(),
            lease_duration_seconds: Self::DEFAULT_LEASE_DURATION_SECONDS,
            grace_seconds: Self::DEFAULT_GRACE_SECONDS,
        }
    }

    /// `POD_NAME`, else the hostname, else `hapwright-<pid>`.
    pub fn identity_from_environment() -> String {
        if let Ok(name) = std::env::var("POD_NAME")
            && !name.trim().is_empty()
        {
            return name.trim().to_owned();
        }
        if let Ok(name) = std::fs::read_to_string("/proc/sys/kernel/hostname")
            && !name.trim().is_empty()
        {
            return name.trim().to_owned();
        }
        if let Ok(name) = std::env::var("HOSTNAME")
            && !name.trim().is_empty()
        {
            return name.trim().to_owned();
        }
        format!("hapwright-{}", std::process::id())
    }
}

/// `hapwright_leader` and `hapwright_leader_transitions_total`. Register once per
/// process.
#[derive(Clone, Debug)]
pub struct LeaderMetrics {
    leader: IntGauge,
    transitions: IntCounter,
}

impl LeaderMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let leader = IntGauge::new(
            "hapwright_leader",
            "1 while this replica may deploy: it holds the leader Lease, or leader election is off.",
        )?;
        let transitions = IntCounter::new(
            "hapwright_leader_transitions_total",
            "Times this replica became or stopped being the leader.",
        )?;
        registry.register(Box::new(leader.clone()))?;
        registry.register(Box::new(transitions.clone()))?;
        Ok(Self {
            leader,
            transitions,
        })
    }

    /// Marks this replica as always deploying (leader election off).
    pub fn set_always_leader(&self) {
        self.leader.set(1);
    }

    fn record(&self, leader: bool) {
        self.leader.set(i64::from(leader));
        self.transitions.inc();
    }
}

/// A running election. Dropping it without [`shutdown`](Self::shutdown) stops the
/// task without releasing the Lease (it then expires).
#[derive(Debug)]
pub struct LeaderElection {
    receiver: watch::Receiver<bool>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Drop for LeaderElection {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl LeaderElection {
    /// Starts the election task. This replica is a follower until the Lease is held.
    pub fn start(
        config: LeaderElectionConfig,
        client: ClientFactory,
        metrics: Option<LeaderMetrics>,
    ) -> Self {
        let (sender, receiver) = watch::channel(false);
        if let Some(metrics) = &metrics {
            metrics.leader.set(0);
        }
        let cancel = CancellationToken::new();
        let span = tracing::info_span!(
            "leader_election",
            lease = %config.lease_name,
            identity = %config.identity,
        );
        let state = Elector {
            config,
            client,
            sender,
            metrics,
            cancel: cancel.clone(),
        };
        let task = tokio::spawn(state.run().instrument(span));
        Self {
            receiver,
            cancel,
            task: Some(task),
        }
    }

    /// A receiver of is-leader: `true` while this replica holds the Lease.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.receiver.clone()
    }

    /// Whether this replica is the leader now.
    pub fn is_leader(&self) -> bool {
        *self.receiver.borrow()
    }

    /// Stops the election, releasing the Lease when held (bounded by a few seconds).
    /// Subscribers read `false` afterwards.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take()
            && let Err(error) = task.await
        {
            tracing::warn!(%error, "The leader election task failed");
        }
    }
}

struct Elector {
    config: LeaderElectionConfig,
    client: ClientFactory,
    sender: watch::Sender<bool>,
    metrics: Option<LeaderMetrics>,
    cancel: CancellationToken,
}

impl Elector {
    fn set(&self, leader: bool) {
        let changed = self.sender.send_if_modified(|current| {
            let changed = *current != leader;
            *current = leader;
            changed
        });
        if changed {
            if leader {
                tracing::info!("Became the leader: this replica deploys");
            } else {
                tracing::warn!("Not the leader any more: this replica stops deploying");
            }
            if let Some(metrics) = &self.metrics {
                metrics.record(leader);
            }
        }
    }

    async fn build(&self) -> Result<LeaseManager, LeaderError> {
        let client = self.client.get().await?;
        let namespace = self
            .config
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        LeaseManagerBuilder::new(client, &self.config.lease_name)
            .with_namespace(&namespace)
            .with_identity(&self.config.identity)
            .with_duration(self.config.lease_duration_seconds)
            .with_grace(self.config.grace_seconds)
            .build()
            .await
            .map_err(|error| LeaderError::LeaseUnusable {
                namespace,
                lease: self.config.lease_name.clone(),
                error,
            })
    }

    async fn run(self) {
        let mut delays = retry_delays();
        loop {
            let built = tokio::select! {
                biased;
                () = self.cancel.cancelled() => break,
                built = self.build() => built,
            };
            let manager = match built {
                Ok(manager) => manager,
                Err(reason) => {
                    tracing::warn!(%reason, "Leader election cannot start; retrying");
                    self.set(false);
                    let delay = delays.next().unwrap_or(Duration::from_secs(60));
                    if !super::sleep_or_cancel(delay, &self.cancel).await {
                        break;
                    }
                    continue;
                }
            };
            loop {
                let changed = tokio::select! {
                    biased;
                    () = self.cancel.cancelled() => {
                        if *self.sender.borrow() {
                            self.set(false);
                            match tokio::time::timeout(RELEASE_TIMEOUT, manager.release()).await {
                                Ok(Ok(())) => tracing::info!("Released the leader Lease"),
                                Ok(Err(error)) => tracing::warn!(error = %describe_lease_error(&error), "Cannot release the leader Lease; it expires on its own"),
                                Err(_) => tracing::warn!("Releasing the leader Lease timed out; it expires on its own"),
                            }
                        }
                        return;
                    }
                    changed = manager.changed() => changed,
                };
                match changed {
                    Ok(leader) => {
                        delays = retry_delays();
                        self.set(leader);
                    }
                    Err(error) => {
                        tracing::warn!(
                            error = %describe_lease_error(&error),
                            "Leader election failed; stepping down and starting over"
                        );
                        self.set(false);
                        break;
                    }
                }
            }
            let delay = delays.next().unwrap_or(Duration::from_secs(60));
            if !super::sleep_or_cancel(delay, &self.cancel).await {
                break;
            }
        }
        self.set(false);
    }
}

/// Why leader election cannot start. Retryable: this replica stays a follower (it
/// does not deploy), logs the message and tries again with backoff.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// No Kubernetes client could be built.
    #[error(transparent)]
    ClientUnavailable(#[from] ClientError),
    /// The Lease cannot be read or created (RBAC, namespace missing, API down).
    #[error(
        "cannot use Lease {namespace}/{lease}: {}",
        describe_lease_error(error)
    )]
    LeaseUnusable {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        lease: String,
        /// The lease manager's error, whose causes the message already lists.
        error: kube_lease_manager::LeaseManagerError,
    },
}

fn describe_lease_error(error: &kube_lease_manager::LeaseManagerError) -> String {
    match error {
        kube_lease_manager::LeaseManagerError::KubeError(error) => describe_error(error),
        other => other.to_string(),
    }
}
