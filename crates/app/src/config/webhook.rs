//! The `controller.webhook` section: the validating admission webhook.

#[allow(unused_imports)]
use super::*;

/// What the webhook answers when it cannot decide in time (or before the current
/// objects are loaded): the same choice as the `failurePolicy` of the
/// `ValidatingWebhookConfiguration`, so both ends agree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailurePolicy {
    /// Refuse the object: nothing unvalidated reaches the cluster, at the price of
    /// refusing changes while validation is slow or unavailable.
    #[default]
    Fail,
    /// Admit the object with a warning: the cluster stays writable, and a bad
    /// object is left to quarantine after the fact.
    Ignore,
}

impl FailurePolicy {
    /// The name as written in the config and in Kubernetes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "Fail",
            Self::Ignore => "Ignore",
        }
    }
}

/// The `controller.webhook` section: a validating admission webhook served on its
/// own HTTPS listener by every replica, so the API server can ask any of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Webhook {
    /// Address of the HTTPS listener (`POST /validate`). The API server connects to
    /// it through a Service, so it usually listens on every interface.
    #[serde(default = "Webhook::default_listen")]
    pub listen: SocketAddr,
    /// PEM certificate chain the listener presents (cert-manager or a Secret
    /// volume). Re-read when it changes, without a restart.
    pub cert_file: PathBuf,
    /// PEM private key of `certFile`.
    pub key_file: PathBuf,
    /// The watched resources (names under `watchedResources`) whose objects are
    /// validated; an object of any other kind is admitted with a warning.
    pub resources: Vec<String>,
    /// What to answer when no decision is reached within `timeout`.
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    /// Budget for one decision (render and both validation phases). Keep it below
    /// the `timeoutSeconds` of the `ValidatingWebhookConfiguration` (10 s by
    /// default), so hapwright answers before the API server gives up.
    #[serde(default = "Webhook::default_timeout")]
    pub timeout: Duration,
    /// Largest AdmissionReview body accepted; a larger one is answered 413. An
    /// update carries the object twice (new and old), each up to the API server's
    /// 1.5 MiB.
    #[serde(default = "Webhook::default_max_request_bytes")]
    pub max_request_bytes: ByteSize,
}

impl Webhook {
    pub(super) fn default_listen() -> SocketAddr {
        SocketAddr::from(([0, 0, 0, 0], 9443))
    }

    pub(super) fn default_timeout() -> Duration {
        Duration::from_secs(8)
    }

    pub(super) fn default_max_request_bytes() -> ByteSize {
        ByteSize::mib(4)
    }

    pub(super) fn validate(&self, watched: &[&str]) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        if self.resources.is_empty() {
            issues.push(ConfigIssue::new(
                "resources",
                "resources is empty: list the watchedResources entries whose objects the \
                 webhook validates",
            ));
        }
        for (index, resource) in self.resources.iter().enumerate() {
            if !watched.contains(&resource.as_str()) {
                let hint =
                    hapwright_eventbus::config::did_you_mean(resource, watched.iter().copied())
                        .map(|s| format!(" did you mean {s}?"))
                        .unwrap_or_default();
                issues.push(ConfigIssue::new(
                    format!("resources[{index}]"),
                    format!(
                        "`{resource}` is not a watched resource;{hint} (watchedResources has: {})",
                        if watched.is_empty() {
                            "none".to_owned()
                        } else {
                            watched.join(", ")
                        }
                    ),
                ));
            }
        }
        for (field, path) in [("certFile", &self.cert_file), ("keyFile", &self.key_file)] {
            if path.as_os_str().is_empty() {
                issues.push(ConfigIssue::new(field, format!("{field} is empty")));
            }
        }
        let timeout = self.timeout.get();
        if timeout.is_zero() || timeout > std::time::Duration::from_secs(30) {
            issues.push(ConfigIssue::new(
                "timeout",
                format!(
                    "timeout ({}) must be longer than 0s and at most 30s (the API server \
                     waits at most 30s for a webhook)",
                    self.timeout
                ),
            ));
        }
        if self.max_request_bytes.bytes() < 1024 {
            issues.push(ConfigIssue::new(
                "maxRequestBytes",
                "maxRequestBytes must be at least 1KiB",
            ));
        }
        issues
    }
}

#[cfg(test)]
mod webhook_tests {
    use super::*;

    fn parse_text(text: &str) -> Result<Config, Vec<String>> {
        parse(
            text,
            Path::new("/etc/hapwright/hapwright.yaml"),
            "hapwright.yaml",
        )
        .map(|(config, _)| config)
        .map_err(|ds| ds.iter().map(ToString::to_string).collect())
    }

    const WATCHED: &str = "watchedResources:\n  services:\n    kubernetes: { apiVersion: v1, kind: Service }\nhaproxyConfig: { template: x }\n";

    #[test]
    fn webhook_keys_load_with_defaults_and_paths_resolved() {
        let config = parse_text(&format!(
            "{WATCHED}controller:\n  webhook:\n    certFile: tls/tls.crt\n    keyFile: /run/tls/tls.key\n    resources: [services]\n"
        ))
        .unwrap();
        let webhook = config.controller.webhook.unwrap();
        assert_eq!(webhook.listen, "0.0.0.0:9443".parse().unwrap());
        assert_eq!(webhook.cert_file, Path::new("/etc/hapwright/tls/tls.crt"));
        assert_eq!(webhook.key_file, Path::new("/run/tls/tls.key"));
        assert_eq!(webhook.failure_policy, FailurePolicy::Fail);
        assert_eq!(webhook.timeout, Duration::from_secs(8));
        assert_eq!(webhook.max_request_bytes, ByteSize::mib(4));
    }

    #[test]
    fn webhook_resources_must_name_watched_resources_at_their_line() {
        let errors = parse_text(&format!(
            "{WATCHED}controller:\n  webhook:\n    certFile: a\n    keyFile: b\n    resources:\n      - services\n      - servics\n    timeout: 40s\n    failurePolicy: Ignore\n"
        ))
        .unwrap_err();
        let all = errors.join("\n");
        assert!(
            all.contains("hapwright.yaml:11:")
                && all.contains("controller.webhook.resources[1]")
                && all.contains("`servics` is not a watched resource; did you mean services?"),
            "{all}"
        );
        assert!(
            all.contains("hapwright.yaml:12:") && all.contains("controller.webhook.timeout"),
            "{all}"
        );
        let unknown = parse_text(&format!(
            "{WATCHED}controller:\n  webhook:\n    certFile: a\n    keyFile: b\n    resources: [services]\n    failurePolicy: Deny\n"
        ))
        .unwrap_err()
        .join("\n");
        assert!(unknown.contains("failurePolicy"), "{unknown}");
    }

    #[test]
    fn a_label_selector_the_webhook_cannot_evaluate_is_a_config_error() {
        let errors = parse_text(
            "watchedResources:\n  services:\n    kubernetes: { apiVersion: v1, kind: Service, labelSelector: 'app in web' }\nhaproxyConfig: { template: x }\ncontroller:\n  webhook: { certFile: a, keyFile: b, resources: [services] }\n",
        )
        .unwrap_err()
        .join("\n");
        assert!(
            errors.contains("hapwright.yaml:3:")
                && errors.contains("watchedResources.services.kubernetes.labelSelector"),
            "{errors}"
        );
    }
}
