//! The fleet: every instance the deployer drives, static and discovered, each behind
//! a [`Driver`] (local sockets or the Data Plane API) so the deployer and the drift
//! monitor treat them alike.
//!
//! A [`Fleet`] is shared by the deployer (which adds and removes discovered
//! instances) and the drift monitor (which reads it), like the
//! [`LastDeployedStore`](crate::deployer::LastDeployedStore); components still never
//! call each other.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use hapwright_eventbus::config::Secret;
use hapwright_eventbus::model::{InstanceDriver, InstanceRef, RenderedConfig};

use crate::dataplane::{DataplaneDriver, DataplaneError, Endpoint, Settings};
use crate::driver::{DeployError, Deployed, SocketDriver};
use crate::haproxy_config::Config as Model;
use crate::metrics::Metrics;

/// One instance's driver.
#[derive(Clone, Debug)]
pub enum Driver {
    /// Local master CLI and runtime API sockets.
    Socket(Arc<SocketDriver>),
    /// The HAProxy Data Plane API.
    Dataplane(Arc<DataplaneDriver>),
}

impl Driver {
    /// The instance name.
    pub fn name(&self) -> &str {
        match self {
            Driver::Socket(driver) => &driver.instance().name,
            Driver::Dataplane(driver) => driver.name(),
        }
    }

    /// Which kind of driver.
    pub fn kind(&self) -> InstanceDriver {
        match self {
            Driver::Socket(_) => InstanceDriver::Socket,
            Driver::Dataplane(_) => InstanceDriver::Dataplane,
        }
    }

    /// The socket driver of a managed instance.
    pub fn managed_socket(&self) -> Option<&Arc<SocketDriver>> {
        match self {
            Driver::Socket(driver) if driver.instance().managed => Some(driver),
            _ => None,
        }
    }

    /// Deploys `desired` (see [`SocketDriver::deploy`] and
    /// [`DataplaneDriver::deploy`]).
    pub async fn deploy(
        &self,
        desired: Arc<RenderedConfig>,
        desired_model: Option<Arc<Model>>,
        running: Option<Arc<Deployed>>,
        drift_check: bool,
    ) -> Result<Deployed, DeployError> {
        match self {
            Driver::Socket(driver) => {
                driver
                    .deploy(desired, desired_model, running, drift_check)
                    .await
            }
            Driver::Dataplane(driver) => {
                driver
                    .deploy(desired, desired_model, running, drift_check)
                    .await
            }
        }
    }

    /// `None` when the instance runs `deployed`, otherwise what differs.
    pub async fn check_drift(&self, deployed: &Deployed) -> Result<Option<String>, DeployError> {
        match self {
            Driver::Socket(driver) => driver.check_drift(deployed).await,
            Driver::Dataplane(driver) => driver.check_drift(deployed).await,
        }
    }
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
    pub fn driver(&self, instance: &InstanceRef, metrics: &Metrics) -> Result<Driver, String> {
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
                    .map(|driver| Driver::Dataplane(Arc::new(driver)))
                    .map_err(|e| e.to_string())
            }
            InstanceDriver::Socket => Err(format!(
                "discovered instance `{}` is a socket instance; only Data Plane API \
                 instances can be discovered (a socket instance needs a configDir)",
                instance.name
            )),
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

/// The drivers of every instance, by name; cheap to clone and shared.
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    inner: Arc<RwLock<BTreeMap<String, Driver>>>,
}

impl Fleet {
    /// An empty fleet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The driver of `name`.
    pub fn get(&self, name: &str) -> Option<Driver> {
        self.read().get(name).cloned()
    }

    /// Every instance name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    /// Every driver, by name.
    pub fn drivers(&self) -> Vec<Driver> {
        self.read().values().cloned().collect()
    }

    /// Adds or replaces a driver.
    pub fn insert(&self, driver: Driver) {
        self.write().insert(driver.name().to_owned(), driver);
    }

    /// Removes a driver; returns whether it was there.
    pub fn remove(&self, name: &str) -> bool {
        self.write().remove(name).is_some()
    }

    /// Whether `name` is in the fleet.
    pub fn contains(&self, name: &str) -> bool {
        self.read().contains_key(name)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Driver>> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Driver>> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }
}
