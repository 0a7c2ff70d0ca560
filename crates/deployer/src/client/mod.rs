//! Talking to a HAProxy process: the CLI transport ([`socket`]), the [`master`] CLI,
//! the [`runtime`] API and the [`dataplane`] API client. Each module's error type says
//! which step failed and whether anything reached HAProxy.

pub mod dataplane;
pub mod master;
pub mod runtime;
pub mod socket;
