//! The deployer crate's bus components: the [`validator`], the [`scheduler`] and the
//! [`deployer`] with its per-instance workers.

pub mod deployer;
mod instance;
pub mod scheduler;
pub mod validator;
