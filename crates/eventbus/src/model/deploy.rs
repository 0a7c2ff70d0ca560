//! Deployment strategies, reasons and instance references.

use std::fmt;

use serde::Serialize;

/// How a rendered configuration reached an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeployStrategy {
    /// Nothing differed; nothing was sent.
    Noop,
    /// Applied through the runtime API, without a reload.
    Runtime,
    /// Files written and HAProxy reloaded.
    Reload,
}

impl DeployStrategy {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DeployStrategy::Noop => "noop",
            DeployStrategy::Runtime => "runtime",
            DeployStrategy::Reload => "reload",
        }
    }
}

impl fmt::Display for DeployStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The small, fixed set of reload causes used as a metric label. The exact cause goes
/// into [`DeployReason::detail`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReloadReason {
    /// The instance had no configuration from hapwright yet.
    FirstDeploy,
    /// A section or keyword changed that the runtime API cannot change.
    Structure,
    /// Server parameters changed that the runtime API cannot change.
    ServerOptions,
    /// A map, file or certificate appeared or disappeared.
    NewFile,
    /// The instance's configuration differed from the desired one.
    Drift,
    /// HAProxy was restarted.
    Restart,
    /// A runtime-only change could not be applied through the runtime API (refused,
    /// unreachable, broken exchange, or requests in flight that did not drain); the
    /// reload applies it instead and the detail says which.
    RuntimeFailed,
}

impl ReloadReason {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadReason::FirstDeploy => "first_deploy",
            ReloadReason::Structure => "structure",
            ReloadReason::ServerOptions => "server_options",
            ReloadReason::NewFile => "new_file",
            ReloadReason::Drift => "drift",
            ReloadReason::Restart => "restart",
            ReloadReason::RuntimeFailed => "runtime_failed",
        }
    }
}

/// Why a deployment used the strategy it used: the answer to "why did it reload?".
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeployReason {
    /// The reload class, when the strategy is `reload` (`null` in JSON otherwise, so
    /// the reason has one shape for every strategy).
    pub reload: Option<ReloadReason>,
    /// The exact cause, e.g. "backend be_x: new keyword `option httpchk`".
    pub detail: String,
}

/// How hapwright reaches an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceDriver {
    /// Local runtime API and master CLI sockets.
    Socket,
    /// The HAProxy Data Plane API.
    Dataplane,
}

/// A deploy target, static or discovered.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct InstanceRef {
    /// Unique instance name (a pod name for discovered instances).
    pub name: String,
    /// How to reach it.
    pub driver: InstanceDriver,
    /// Socket path, `host:port` or Data Plane API URL.
    pub address: String,
}
