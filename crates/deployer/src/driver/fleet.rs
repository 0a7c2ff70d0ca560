//! Drivers for the fleet's instances: static Data Plane API instances from the config
//! file, and discovered ones (`InstancesDiscovered`) with the discovery credentials.
//! Every instance is a [`Driver`] to the deployer, whichever way it is reached.

use std::path::PathBuf;
use std::sync::Arc;

use hapwright_eventbus::config::Secret;
use hapwright_eventbus::model::{InstanceDriver, InstanceRef};

use crate::client::dataplane::{DataplaneError, Endpoint, Settings};
use crate::driver::Driver;
use crate::driver::dataplane::DataplaneDriver;
use crate::metrics::Metrics;

/// Why a discovered instance cannot be driven.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// Only Data Plane API instances can be discovered.
    #[error(
        "discovered instance `{0}` is a socket instance; only Data Plane API instances can be \
         discovered (a socket instance needs a configDir)"
    )]
    SocketInstance(String),
    /// The Data Plane API client could not be built (e.g. an unreadable CA file).
    #[error("discovered instance `{instance}`: the Data Plane API client cannot be built")]
    ClientFailed {
        /// The instance.
        instance: String,
        /// Why.
        #[source]
        source: DataplaneError,
    },
}

/// How discovered Data Plane API instances are reached: the credentials of
/// `haproxy.discovery.kubernetes` and the client settings.
#[derive(Clone, Debug)]
pub struct DiscoveredCredentials {
    /// Basic-auth user.
    pub username: String,
    /// Basic-auth password.
    pub password: Secret,
    /// CA bundle for `https` URLs.
    pub ca_file: Option<PathBuf>,
    /// Scheme put in front of a discovered `host:port` address (`http`, `https`).
    pub scheme: String,
    /// Client timeouts and retries.
    pub settings: Settings,
}

impl DiscoveredCredentials {
    /// The credentials of `haproxy.discovery.kubernetes`; `None` without discovery
    /// or without `username`/`passwordFile` (then discovered Data Plane instances
    /// are reached without a password, which the API normally refuses).
    pub fn from_config(config: &crate::config::Config) -> Option<Self> {
        let kubernetes = config.discovery.as_ref()?.kubernetes.as_ref()?;
        Some(Self {
            username: kubernetes.username.clone().unwrap_or_default(),
            password: kubernetes.password.clone().unwrap_or_default(),
            ca_file: kubernetes.ca_file.clone(),
            scheme: kubernetes.scheme.clone(),
            settings: Settings::default(),
        })
    }

    /// A driver for a discovered instance.
    ///
    /// # Errors
    ///
    /// [`DiscoveryError`]: the instance cannot be driven (not retryable until the
    /// instance or the credentials change).
    pub fn driver(
        &self,
        instance: &InstanceRef,
        metrics: &Metrics,
    ) -> Result<Arc<dyn Driver>, DiscoveryError> {
        match instance.driver {
            InstanceDriver::Dataplane => {
                let url = if instance.address.contains("://") {
                    instance.address.clone()
                } else {
                    format!("{}://{}", self.scheme, instance.address)
                };
                let endpoint = Endpoint {
                    url,
                    username: self.username.clone(),
                    password: self.password.clone(),
                    ca_file: self.ca_file.clone(),
                };
                DataplaneDriver::connect(&instance.name, &endpoint, self.settings, metrics.clone())
                    .map(|driver| Arc::new(driver) as Arc<dyn Driver>)
                    .map_err(|source| DiscoveryError::ClientFailed {
                        instance: instance.name.clone(),
                        source,
                    })
            }
            InstanceDriver::Socket => Err(DiscoveryError::SocketInstance(instance.name.clone())),
        }
    }
}

/// A Data Plane API driver for a static `haproxy.instances[]` entry; `None` for a
/// socket instance.
pub fn dataplane_driver(
    instance: &crate::config::Instance,
    settings: Settings,
    metrics: &Metrics,
) -> Option<Result<DataplaneDriver, DataplaneError>> {
    let target = instance.dataplane.as_ref()?;
    let endpoint = Endpoint {
        url: target.url.clone(),
        username: target.username.clone(),
        password: target.password.clone().unwrap_or_default(),
        ca_file: target.ca_file.clone(),
    };
    Some(DataplaneDriver::connect(
        &instance.name,
        &endpoint,
        settings,
        metrics.clone(),
    ))
}
