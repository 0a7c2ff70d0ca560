//! Everything in hapwright that talks to HAProxy: the configuration tokenizer and
//! model, the two-phase validator, the deployment scheduler and the drivers that apply
//! a rendered configuration to HAProxy instances.

pub mod config;

pub mod dataplane;
pub mod deployer;
pub mod drift;
pub mod driver;
pub mod files;
pub mod fleet;
mod flow;
pub mod haproxy_config;
pub mod managed;
pub mod master;
pub mod metrics;
pub mod plan;
pub mod runtime;
pub mod scheduler;
pub mod socket;
pub mod validator;
