//! The `controller.tracing` section: where the trace of each reconciliation goes.

#[allow(unused_imports)]
use super::*;

/// The `controller.tracing` section: where the trace of each reconciliation goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Tracing {
    /// The OTLP/HTTP receiver (a collector or a tracing backend), e.g.
    /// `http://127.0.0.1:4318`. Spans go to `<endpoint>/v1/traces` unless the URL
    /// already has a path, in which case it is used as it is.
    pub endpoint: String,
    /// Share of reconciliations traced, from `0` (none) to `1` (all). Decided per
    /// reconciliation from its trace id, so a trace is complete or absent.
    #[serde(default)]
    pub sample_ratio: SampleRatio,
    /// `service.name` of the exported spans, to tell controllers apart in a backend
    /// that several of them feed.
    #[serde(default = "Tracing::default_service_name")]
    pub service_name: String,
    /// A link to the trace in the operator's tracing UI, with `{traceId}` where the
    /// trace id goes (`https://jaeger.example/trace/{traceId}`). The status page then
    /// links each recent reconciliation to its trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_url: Option<String>,
}

impl Tracing {
    pub(super) fn default_service_name() -> String {
        "hapwright".to_owned()
    }

    /// The URL spans are posted to.
    pub fn traces_url(&self) -> String {
        let endpoint = self.endpoint.trim_end_matches('/');
        match endpoint.parse::<hyper::Uri>() {
            Ok(uri) if uri.path().is_empty() || uri.path() == "/" => {
                format!("{endpoint}/v1/traces")
            }
            _ => self.endpoint.clone(),
        }
    }

    /// `traceUrl` with `trace_id` filled in.
    pub fn link(&self, trace_id: &str) -> Option<String> {
        self.trace_url
            .as_ref()
            .map(|url| url.replace("{traceId}", trace_id))
    }

    pub(super) fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        match self.endpoint.parse::<hyper::Uri>() {
            Ok(uri)
                if matches!(uri.scheme_str(), Some("http" | "https"))
                    && uri.host().is_some_and(|h| !h.is_empty()) => {}
            _ => issues.push(ConfigIssue::new(
                "endpoint",
                format!(
                    "`{}` is not an http:// or https:// URL with a host (for example \
                     http://127.0.0.1:4318)",
                    self.endpoint
                ),
            )),
        }
        let ratio = self.sample_ratio.get();
        if !(0.0..=1.0).contains(&ratio) {
            issues.push(ConfigIssue::new(
                "sampleRatio",
                format!("sampleRatio must be between 0 and 1, not {ratio}"),
            ));
        }
        if self.service_name.trim().is_empty() {
            issues.push(ConfigIssue::new("serviceName", "serviceName is empty"));
        }
        if let Some(url) = &self.trace_url
            && !url.contains("{traceId}")
        {
            issues.push(ConfigIssue::new(
                "traceUrl",
                format!("traceUrl `{url}` has no `{{traceId}}` placeholder for the trace id"),
            ));
        }
        issues
    }
}

/// `controller.tracing.sampleRatio`: a share between 0 and 1 (checked when the
/// config loads, so it is never NaN and compares like a number).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SampleRatio(f64);

impl SampleRatio {
    /// The share as a number.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl Default for SampleRatio {
    fn default() -> Self {
        Self(1.0)
    }
}

// Validation rejects NaN, the one value for which `==` is not an equivalence.
impl Eq for SampleRatio {}

#[cfg(test)]
mod tracing_tests {
    use crate::config::leader_election::leader_election_tests::parse_controller;

    #[test]
    fn tracing_is_off_by_default_and_loads_with_defaults() {
        let config = parse_controller("  logLevel: info\n").unwrap();
        assert_eq!(config.controller.tracing, None);
        let config = parse_controller("  tracing: { endpoint: http://127.0.0.1:4318 }\n").unwrap();
        let tracing = config.controller.tracing.unwrap();
        assert_eq!(tracing.sample_ratio.get(), 1.0);
        assert_eq!(tracing.service_name, "hapwright");
        assert_eq!(tracing.traces_url(), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(tracing.link("ab"), None);
    }

    #[test]
    fn tracing_keys_load() {
        let config = parse_controller(
            "  tracing:\n    endpoint: https://otel.example/custom/path\n    sampleRatio: 0.25\n    serviceName: edge\n    traceUrl: https://ui.example/trace/{traceId}\n",
        )
        .unwrap();
        let tracing = config.controller.tracing.unwrap();
        assert_eq!(tracing.sample_ratio.get(), 0.25);
        assert_eq!(tracing.service_name, "edge");
        assert_eq!(tracing.traces_url(), "https://otel.example/custom/path");
        assert_eq!(
            tracing.link("0abc").as_deref(),
            Some("https://ui.example/trace/0abc")
        );
    }

    #[test]
    fn bad_tracing_keys_are_located() {
        let errors = parse_controller(
            "  tracing:\n    endpoint: 127.0.0.1:4318\n    sampleRatio: 1.5\n    traceUrl: https://ui.example/trace\n",
        )
        .unwrap_err();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].contains("hapwright.yaml:4:"), "{errors:?}");
        assert!(
            errors[0].contains("controller.tracing.endpoint"),
            "{errors:?}"
        );
        assert!(errors[1].contains("hapwright.yaml:5:"), "{errors:?}");
        assert!(
            errors[1].contains("controller.tracing.sampleRatio"),
            "{errors:?}"
        );
        assert!(
            errors[2].contains("controller.tracing.traceUrl"),
            "{errors:?}"
        );
        let errors = parse_controller("  tracing: { endpoint: http://x:4318, sampleRate: 1 }\n")
            .unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("sampleRate"), "{errors:?}");
    }
}
