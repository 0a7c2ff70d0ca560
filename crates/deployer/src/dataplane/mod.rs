//! The HAProxy Data Plane API v3: the HTTP [`client`] and the deployment [`driver`].

pub mod client;
pub mod driver;

pub use client::{DataplaneClient, DataplaneError, Endpoint, Settings};
pub use driver::DataplaneDriver;
