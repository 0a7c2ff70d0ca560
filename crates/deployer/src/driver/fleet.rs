//! Drivers for the fleet's instances: static Data Plane API instances from the config
//! file, and discovered ones (`InstancesDiscovered`) with the discovery credentials.
//! Every instance is a [`Driver`] to the deployer, whichever way it is reached.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use hapwright_eventbus::config::Secret;
use hapwright_eventbus::model::{InstanceDriver, InstanceRef};
use reqwest::Url;

use crate::client::dataplane::{DataplaneClient, DataplaneError, Endpoint, Settings};
use crate::driver::Driver;
use crate::driver::dataplane::DataplaneDriver;
use crate::metrics::Metrics;

/// Why a discovered instance cannot be driven. None of these is retryable until the
/// instance or the discovery settings change; nothing has been sent to the instance.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// Only Data Plane API instances can be discovered.
    #[error(
        "discovered instance `{0}` is a socket instance; only Data Plane API instances can be \
         discovered (a socket instance needs a configDir)"
    )]
    SocketInstance(String),
    /// The discovered address is not an `http(s)://host:port` URL hapwright can use.
    #[error("discovered instance `{instance}`: address `{address}` is not usable: {reason}")]
    AddressInvalid {
        /// The instance.
        instance: String,
        /// The address as discovered.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Plain `http` to a target that is not on this host, without
    /// `allowInsecureHttp`: the password and private keys would cross the network
    /// unencrypted, so nothing is sent.
    #[error(
        "discovered instance `{instance}` at {address} refused: plain http to a non-loopback \
         address would send the Data Plane password and private keys unencrypted; serve the \
         Data Plane API over https, or set discovery.kubernetes.allowInsecureHttp: true"
    )]
    InsecureHttpRefused {
        /// The instance.
        instance: String,
        /// The address as discovered.
        address: String,
    },
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

impl DiscoveryError {
    /// A short, fixed name of the refusal for metric labels (`insecure_http`,
    /// `invalid_address`, `socket_instance`, `client_failed`).
    pub fn reason(&self) -> &'static str {
        match self {
            DiscoveryError::SocketInstance(_) => "socket_instance",
            DiscoveryError::AddressInvalid { .. } => "invalid_address",
            DiscoveryError::InsecureHttpRefused { .. } => "insecure_http",
            DiscoveryError::ClientFailed { .. } => "client_failed",
        }
    }
}

/// How a discovered instance is reached, as decided by [`DiscoveredCredentials::transport`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// `https`, the certificate verified against the CA file (or the system roots).
    Https,
    /// Plain `http` to a loopback address (127.0.0.0/8, ::1): the traffic never
    /// leaves the host, so no opt-in is needed.
    LoopbackHttp,
    /// Plain `http` across the network, allowed by `allowInsecureHttp`.
    InsecureHttp,
}

/// How discovered Data Plane API instances are reached: the credentials of
/// `haproxy.discovery.kubernetes` and the client settings.
#[derive(Clone, Debug)]
pub struct DiscoveredCredentials {
    /// Basic-auth user.
    pub username: String,
    /// Basic-auth password.
    pub password: Secret,
    /// CA bundle the pods' certificates are verified against (in addition to the
    /// system roots).
    pub ca_file: Option<PathBuf>,
    /// Scheme put in front of a discovered `host:port` address (`http`, `https`).
    pub scheme: String,
    /// Plain `http` to non-loopback targets is allowed (`allowInsecureHttp`);
    /// otherwise such a target is refused before anything is sent to it.
    pub allow_insecure_http: bool,
    /// The DNS name verified in each target's certificate (and sent as TLS server
    /// name) instead of its IP address (`serverName`).
    pub server_name: Option<String>,
    /// Host names pinned to socket addresses, consulted before DNS (as curl's
    /// `--resolve`; the port comes from the URL). Empty from the config file: it lets
    /// a test reach a named, non-loopback target on a local server.
    pub resolve: Vec<(String, SocketAddr)>,
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
            allow_insecure_http: kubernetes.allow_insecure_http,
            server_name: kubernetes.server_name.clone(),
            resolve: Vec::new(),
            settings: Settings::default(),
        })
    }

    /// Logs a warning when plain `http` is allowed, so the choice shows at every
    /// start of the deployer and not only when a pod turns up.
    pub fn warn_if_insecure(&self) {
        if self.allow_insecure_http {
            tracing::warn!(
                scheme = %self.scheme,
                "Discovery allows plain http: the Data Plane password and private keys cross \
                 the network unencrypted to every discovered instance"
            );
        }
    }

    /// The URL of a discovered instance: its address, with [`scheme`](Self::scheme)
    /// in front when it has none.
    fn url_of(&self, instance: &InstanceRef) -> Result<Url, DiscoveryError> {
        let text = if instance.address.contains("://") {
            instance.address.clone()
        } else {
            format!("{}://{}", self.scheme, instance.address)
        };
        let invalid = |reason: String| DiscoveryError::AddressInvalid {
            instance: instance.name.clone(),
            address: instance.address.clone(),
            reason,
        };
        let url = Url::parse(&text).map_err(|e| invalid(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!(
                "scheme `{}` is not http or https",
                url.scheme()
            )));
        }
        if url.host().is_none() {
            return Err(invalid("no host".to_owned()));
        }
        Ok(url)
    }

    /// Decides how `instance` may be reached, before anything is sent to it:
    /// `https` always; plain `http` to a loopback IP address always; plain `http`
    /// anywhere else only with [`allow_insecure_http`](Self::allow_insecure_http).
    /// A host name never counts as loopback (it may resolve anywhere).
    ///
    /// # Errors
    ///
    /// [`DiscoveryError::InsecureHttpRefused`] and [`DiscoveryError::AddressInvalid`].
    pub fn transport(&self, instance: &InstanceRef) -> Result<Transport, DiscoveryError> {
        let url = self.url_of(instance)?;
        if url.scheme() == "https" {
            return Ok(Transport::Https);
        }
        if is_loopback(&url) {
            Ok(Transport::LoopbackHttp)
        } else if self.allow_insecure_http {
            Ok(Transport::InsecureHttp)
        } else {
            Err(DiscoveryError::InsecureHttpRefused {
                instance: instance.name.clone(),
                address: instance.address.clone(),
            })
        }
    }

    /// A driver for a discovered instance. The transport is checked first
    /// ([`transport`](Self::transport)): a refused instance gets no client, so no
    /// request, password or certificate ever reaches it.
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
        if instance.driver == InstanceDriver::Socket {
            return Err(DiscoveryError::SocketInstance(instance.name.clone()));
        }
        let transport = self.transport(instance)?;
        let url = self.url_of(instance)?;
        let mut resolve = self.resolve.clone();
        let mut request_url = url.clone();
        if let (Transport::Https, Some(server_name)) = (transport, &self.server_name) {
            // Connect to the pod's IP, but verify (and send as SNI) the configured
            // name: the URL carries the name, the resolver maps it to the pod.
            let Some(ip) = host_ip(&url) else {
                return Err(DiscoveryError::AddressInvalid {
                    instance: instance.name.clone(),
                    address: instance.address.clone(),
                    reason: "serverName needs an IP address to connect to".to_owned(),
                });
            };
            let port = url.port_or_known_default().unwrap_or(443);
            request_url.set_host(Some(server_name)).map_err(|e| {
                DiscoveryError::AddressInvalid {
                    instance: instance.name.clone(),
                    address: instance.address.clone(),
                    reason: format!("serverName `{server_name}`: {e}"),
                }
            })?;
            resolve.push((server_name.clone(), SocketAddr::new(ip, port)));
        }
        let address = url.as_str().trim_end_matches('/').to_owned();
        let endpoint = Endpoint {
            url: request_url.as_str().trim_end_matches('/').to_owned(),
            username: self.username.clone(),
            password: self.password.clone(),
            ca_file: self.ca_file.clone(),
        };
        let client = DataplaneClient::with_resolve(&endpoint, self.settings, &resolve).map_err(
            |source| DiscoveryError::ClientFailed {
                instance: instance.name.clone(),
                source,
            },
        )?;
        metrics.transport(&instance.name, transport == Transport::InsecureHttp);
        if transport == Transport::InsecureHttp {
            tracing::warn!(
                instance = %instance.name,
                %address,
                "Discovered instance reached over plain http (allowInsecureHttp); its Data Plane \
                 password and private keys cross the network unencrypted"
            );
        }
        Ok(Arc::new(DataplaneDriver::new(
            &instance.name,
            address,
            client,
            metrics.clone(),
        )))
    }
}

/// Whether `url`'s host is a loopback IP address (127.0.0.0/8, ::1, or an
/// IPv4-mapped 127.0.0.0/8).
fn is_loopback(url: &Url) -> bool {
    match host_ip(url) {
        Some(IpAddr::V4(ip)) => ip.is_loopback(),
        Some(IpAddr::V6(ip)) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        None => false,
    }
}

/// The IP address `url` names as its host; `None` for a host name.
fn host_ip(url: &Url) -> Option<IpAddr> {
    let host = url.host_str()?;
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials(scheme: &str, allow_insecure_http: bool) -> DiscoveredCredentials {
        DiscoveredCredentials {
            username: "admin".to_owned(),
            password: Secret::new("pw"),
            ca_file: None,
            scheme: scheme.to_owned(),
            allow_insecure_http,
            server_name: None,
            resolve: Vec::new(),
            settings: Settings::default(),
        }
    }

    fn pod(address: &str) -> InstanceRef {
        InstanceRef {
            name: "pod".to_owned(),
            driver: InstanceDriver::Dataplane,
            address: address.to_owned(),
        }
    }

    #[test]
    fn only_loopback_ip_addresses_may_use_http_without_the_opt_in() {
        let strict = credentials("http", false);
        for loopback in [
            "127.0.0.1:5555",
            "127.9.9.9:5555",
            "[::1]:5555",
            "http://[::ffff:127.0.0.1]:5555",
        ] {
            assert_eq!(
                strict.transport(&pod(loopback)).unwrap(),
                Transport::LoopbackHttp,
                "{loopback}"
            );
        }
        for remote in [
            "10.0.0.1:5555",
            "[fd00::1]:5555",
            "localhost:5555",
            "http://haproxy.ingress.svc:5555",
            "http://128.0.0.1:5555",
        ] {
            let error = strict.transport(&pod(remote)).unwrap_err();
            assert!(
                matches!(error, DiscoveryError::InsecureHttpRefused { .. }),
                "{remote}: {error}"
            );
            assert_eq!(error.reason(), "insecure_http");
        }
        assert_eq!(
            credentials("http", true)
                .transport(&pod("10.0.0.1:5555"))
                .unwrap(),
            Transport::InsecureHttp
        );
        assert_eq!(
            strict.transport(&pod("https://10.0.0.1:5555")).unwrap(),
            Transport::Https
        );
        assert_eq!(
            credentials("https", false)
                .transport(&pod("10.0.0.1:5555"))
                .unwrap(),
            Transport::Https
        );
        let error = strict.transport(&pod("ftp://10.0.0.1:21")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "discovered instance `pod`: address `ftp://10.0.0.1:21` is not usable: scheme `ftp` is not http or https"
        );
    }

    #[test]
    fn a_server_name_needs_an_ip_address_to_connect_to() {
        let metrics = Metrics::unregistered().unwrap();
        let mut named = credentials("https", false);
        named.server_name = Some("haproxy.ingress.svc".to_owned());
        let driver = named.driver(&pod("10.0.0.1:5555"), &metrics).unwrap();
        assert_eq!(driver.name(), "pod");
        let error = named
            .driver(&pod("https://haproxy-0.example:5555"), &metrics)
            .err()
            .unwrap();
        assert!(
            error
                .to_string()
                .ends_with("serverName needs an IP address to connect to"),
            "{error}"
        );
    }
}
