//! Everything in hapwright that talks to HAProxy: what a configuration means, how to
//! reach an instance, how to deploy to it, and the components that do it on the bus.
//!
//! # Layout
//!
//! ```text
//! haproxy/       what hapwright knows about HAProxy's configuration (no I/O but files)
//!   config/        phase-1 checks of haproxy.cfg; re-exports the bus's model
//!   plan           the change plan between two configs: runtime ops or a reload
//!   files/         the config directory: safe writes, version marker, state record
//! client/        talking to a HAProxy process
//!   socket         unix/TCP CLI transport, retry policy
//!   master         master CLI (show proc, reload, @1 show env)
//!   runtime        runtime API (servers, maps, ACLs, certificates), typed errors
//!   dataplane      HAProxy Data Plane API v3 HTTP client
//! driver/        one `Driver` trait per instance, and the decision decide → execute
//!   socket         SocketDriver: runtime API + files + confirmed reload
//!   dataplane      DataplaneDriver: the same plan through the Data Plane API
//!   managed        ManagedHaproxy: the supervisor of HAProxy processes hapwright runs
//!   fleet          drivers for static Data Plane and discovered instances
//! component/     the bus components
//!   validator      TemplateRendered → ValidationCompleted (parsed model attached)
//!   scheduler      ValidationCompleted → DeploymentScheduled (rate limit, latest wins)
//!   deployer       DeploymentScheduled → a round over the fleet
//!   instance       one worker per instance: plan, reload window, retries, drift
//! safety         the safety valve: what a render would remove, and the threshold
//! config         the `haproxy:` section of the config file and controller timings
//! metrics        deployment metrics
//! version_check  the instances' HAProxy line against the validator's (haproxy -v)
//! ```
//!
//! Data moves one way: a render is validated (and parsed once), scheduled, handed to
//! each instance's worker, which plans against what its instance runs and drives the
//! instance through its [`Driver`]; the drivers use the clients and the config
//! directory. Components never call each other: they meet on the bus.

pub mod client;
pub mod component;
pub mod config;
pub mod driver;
pub mod haproxy;
pub mod metrics;
pub mod safety;
pub mod version_check;

pub use driver::Driver;
