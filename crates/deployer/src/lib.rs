//! Everything in hapwright that talks to HAProxy: the configuration tokenizer and
//! model, the two-phase validator, the deployment scheduler and the drivers that apply
//! a rendered configuration to HAProxy instances.

pub mod config;

pub mod dataplane;
pub mod deployer;
pub mod driver;
pub mod files;
pub mod fleet;
pub mod flow;
pub mod haproxy_config;
mod instance;
pub mod managed;
pub mod master;
pub mod metrics;
pub mod plan;
pub mod runtime;
pub mod scheduler;
pub mod socket;
pub mod validator;

pub use flow::Driver;
