//! The `controller.http` section: the HTTP listeners.

#[allow(unused_imports)]
use super::*;

/// The `controller.http` section: timeouts and limits of the HTTP listeners
/// (`listen` and `metricsListen`, each with its own connection budget).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Http {
    /// Longest a client may take to send a complete request head: on a new
    /// connection counted from the accept, otherwise from its first byte. Bounds
    /// slowloris-style clients that trickle headers.
    pub header_read_timeout: Duration,
    /// A kept-alive connection with no request in flight and no traffic for this
    /// long is closed, so idle clients do not hold connection slots.
    pub idle_timeout: Duration,
    /// Longest a response write may make no progress (a client that stopped
    /// reading) before the connection is closed.
    pub write_timeout: Duration,
    /// Open connections per listener. Further clients wait in the kernel's accept
    /// queue until a connection closes.
    pub max_connections: usize,
    /// Requests handled at the same time per listener; more are answered 503 at once.
    pub max_concurrent_requests: usize,
    /// On shutdown (or when a listener moves), in-flight requests get this long to
    /// finish; then the remaining connections are dropped.
    pub shutdown_timeout: Duration,
    /// `POST /-/reload` acts at most once per this window; requests inside it are
    /// answered 429 with `Retry-After`.
    pub reload_interval: Duration,
}

impl Default for Http {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            max_connections: 256,
            max_concurrent_requests: 32,
            shutdown_timeout: Duration::from_secs(5),
            reload_interval: Duration::from_secs(5),
        }
    }
}

impl Http {
    pub(super) fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        for (field, value) in [
            ("headerReadTimeout", self.header_read_timeout),
            ("idleTimeout", self.idle_timeout),
            ("writeTimeout", self.write_timeout),
        ] {
            if value.get().is_zero() {
                issues.push(ConfigIssue::new(
                    field,
                    format!("{field} must be longer than 0s"),
                ));
            }
        }
        for (field, value) in [
            ("maxConnections", self.max_connections),
            ("maxConcurrentRequests", self.max_concurrent_requests),
        ] {
            if value == 0 {
                issues.push(ConfigIssue::new(
                    field,
                    format!("{field} must be at least 1"),
                ));
            }
        }
        issues
    }
}

/// Whether `name` can be a `Host` header's host part: a DNS name, an IPv4 address
/// or a bracketed IPv6 address, without a port.
pub(super) fn is_host_name(name: &str) -> bool {
    if let Some(inner) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        return inner.parse::<std::net::Ipv6Addr>().is_ok();
    }
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod http_tests {
    use super::*;
    use crate::config::leader_election::leader_election_tests::parse_controller;

    #[test]
    fn http_keys_load_with_defaults_for_the_rest() {
        let config = parse_controller(
            "  lifecycleApi: false\n  allowedHosts: [hapwright.internal, 10.0.0.5]\n  http:\n    idleTimeout: 5s\n    maxConnections: 64\n",
        )
        .unwrap();
        let controller = &config.controller;
        assert!(!controller.lifecycle_api);
        assert_eq!(controller.allowed_hosts, ["hapwright.internal", "10.0.0.5"]);
        assert_eq!(controller.http.idle_timeout, Duration::from_secs(5));
        assert_eq!(controller.http.max_connections, 64);
        assert_eq!(
            controller.http.header_read_timeout,
            Http::default().header_read_timeout
        );
        assert!(Controller::default().lifecycle_api);
    }

    #[test]
    fn bad_http_keys_are_located() {
        let errors = parse_controller(
            "  allowedHosts: [ok.example, 'http://bad.example:80']\n  http:\n    maxConnections: 0\n    writeTimeout: 0s\n",
        )
        .unwrap_err();
        assert_eq!(errors.len(), 3, "{errors:?}");
        let all = errors.join("\n");
        assert!(
            all.contains("hapwright.yaml:5:") && all.contains("controller.http.maxConnections"),
            "{all}"
        );
        assert!(
            all.contains("hapwright.yaml:6:") && all.contains("controller.http.writeTimeout"),
            "{all}"
        );
        assert!(
            all.contains("hapwright.yaml:3:") && all.contains("controller.allowedHosts[1]"),
            "{all}"
        );
        let unknown = parse_controller("  http:\n    idleTimout: 5s\n").unwrap_err();
        assert!(unknown[0].contains("idleTimout"), "{unknown:?}");
    }
}
