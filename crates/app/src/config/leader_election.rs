//! The `controller.leaderElection` section.

#[allow(unused_imports)]
use super::*;

/// The `controller.leaderElection` section: hot-standby replicas elect one leader
/// through a `coordination.k8s.io/v1` Lease; only the leader deploys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LeaderElection {
    /// Whether to elect a leader. Off: this process always deploys.
    pub enabled: bool,
    /// Name of the Lease object.
    pub lease_name: String,
    /// Namespace of the Lease; unset: the client's default namespace (in a pod, the
    /// pod's own namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

impl Default for LeaderElection {
    fn default() -> Self {
        Self {
            enabled: false,
            lease_name: "hapwright-leader".to_owned(),
            namespace: None,
        }
    }
}

impl LeaderElection {
    pub(super) fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        if !is_dns_subdomain(&self.lease_name) {
            issues.push(ConfigIssue::new(
                "leaseName",
                format!(
                    "`{}` is not a valid Lease name (lowercase letters, digits, `-` and `.`, \
                     starting and ending with a letter or digit, at most 253 characters)",
                    self.lease_name
                ),
            ));
        }
        if let Some(namespace) = &self.namespace
            && !is_dns_label(namespace)
        {
            issues.push(ConfigIssue::new(
                "namespace",
                format!(
                    "`{namespace}` is not a valid namespace name (lowercase letters, digits \
                     and `-`, starting and ending with a letter or digit, at most 63 characters)"
                ),
            ));
        }
        issues
    }
}

/// An RFC 1123 label: what Kubernetes accepts as a namespace name.
pub(super) fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// An RFC 1123 subdomain: what Kubernetes accepts as most object names.
pub(super) fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
pub(crate) mod leader_election_tests {
    use super::*;

    pub(crate) fn parse_controller(controller: &str) -> Result<Config, Vec<String>> {
        let text = format!("haproxyConfig: {{ template: x }}\ncontroller:\n{controller}");
        parse(
            &text,
            Path::new("/nonexistent/hapwright.yaml"),
            "hapwright.yaml",
        )
        .map(|(config, _)| config)
        .map_err(|ds| ds.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn leader_election_defaults_to_off_with_a_lease_name() {
        let config = parse_controller("  logLevel: info\n").unwrap();
        let election = &config.controller.leader_election;
        assert!(!election.enabled);
        assert_eq!(election.lease_name, "hapwright-leader");
        assert_eq!(election.namespace, None);
    }

    #[test]
    fn leader_election_keys_load() {
        let config = parse_controller(
            "  leaderElection:\n    enabled: true\n    leaseName: ingress.leader\n    namespace: haproxy\n",
        )
        .unwrap();
        assert_eq!(
            config.controller.leader_election,
            LeaderElection {
                enabled: true,
                lease_name: "ingress.leader".to_owned(),
                namespace: Some("haproxy".to_owned()),
            }
        );
    }

    #[test]
    fn bad_lease_names_and_namespaces_are_located() {
        let errors = parse_controller(
            "  leaderElection:\n    enabled: true\n    leaseName: Bad_Name\n    namespace: -ns\n",
        )
        .unwrap_err();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("hapwright.yaml:5:"), "{errors:?}");
        assert!(
            errors[0].contains("controller.leaderElection.leaseName"),
            "{errors:?}"
        );
        assert!(errors[1].contains("hapwright.yaml:6:"), "{errors:?}");
        assert!(
            errors[1].contains("controller.leaderElection.namespace"),
            "{errors:?}"
        );
    }

    #[test]
    fn unknown_leader_election_keys_are_rejected() {
        let errors =
            parse_controller("  leaderElection:\n    enabled: true\n    leaseDurationz: 15s\n")
                .unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("leaseDurationz"), "{errors:?}");
    }
}
