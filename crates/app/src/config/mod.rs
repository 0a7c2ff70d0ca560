//! The controller's config file: the whole-file [`Config`], the
//! [`Controller`] section, [`load`] with located errors, and the [`ConfigWatcher`]
//! component that reloads it when the file or a password file changes.
//!
//! Each crate owns the types of its section: `watchedResources` is
//! [`hapwright_watchers::Config`], the template keys are
//! [`hapwright_reconciler::config::Config`], `haproxy` is
//! [`hapwright_deployer::config::Config`]. This module assembles them, resolves
//! relative paths against the config file's directory, runs every section's semantic
//! checks plus the cross-section ones, reads password files, and turns every problem
//! into a [`Diagnostic`] at `file:line:column`.

mod locate;
mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use hapwright_deployer::config as deployer;
use hapwright_deployer::safety as deployer_safety;
use hapwright_eventbus::config::{ByteSize, ConfigIssue, Duration};
use hapwright_eventbus::model::{ContentHash, Diagnostic, SourceLocation};
use hapwright_reconciler::config as reconciler;
use hapwright_watchers::yaml::{self, Limits};
use serde::{Deserialize, Serialize};

pub use locate::Locator;
pub use watch::{ConfigChange, ConfigWatcher};

/// Config files larger than this are rejected before parsing.
pub const MAX_CONFIG_SIZE: u64 = 10 * 1024 * 1024;

/// The whole config file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "RawConfig", rename_all = "camelCase")]
pub struct Config {
    /// `watchedResources`.
    pub watched_resources: hapwright_watchers::Config,
    /// `haproxyConfig`, `templateSnippets`, `maps`, `files`, `sslCertificates`,
    /// `extraContext`, `templating`, `validationTests`, `statusTemplates`.
    #[serde(flatten)]
    pub templates: reconciler::Config,
    /// `haproxy`.
    pub haproxy: deployer::Config,
    /// `controller`.
    pub controller: Controller,
}

/// The file's top level as written; [`Config`] groups the template keys.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    #[serde(default)]
    watched_resources: hapwright_watchers::Config,
    haproxy_config: reconciler::Template,
    #[serde(default)]
    template_snippets: std::collections::BTreeMap<String, reconciler::Template>,
    #[serde(default)]
    maps: std::collections::BTreeMap<String, reconciler::Template>,
    #[serde(default)]
    files: std::collections::BTreeMap<String, reconciler::Template>,
    #[serde(default)]
    ssl_certificates: std::collections::BTreeMap<String, reconciler::Template>,
    #[serde(default = "empty_object")]
    extra_context: serde_json::Value,
    #[serde(default)]
    templating: reconciler::Templating,
    #[serde(default)]
    validation_tests: std::collections::BTreeMap<String, reconciler::ValidationTest>,
    #[serde(default)]
    status_templates: std::collections::BTreeMap<String, reconciler::Template>,
    #[serde(default)]
    haproxy: deployer::Config,
    #[serde(default)]
    controller: Controller,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

impl From<RawConfig> for Config {
    fn from(raw: RawConfig) -> Self {
        Self {
            watched_resources: raw.watched_resources,
            templates: reconciler::Config {
                haproxy_config: raw.haproxy_config,
                template_snippets: raw.template_snippets,
                maps: raw.maps,
                files: raw.files,
                ssl_certificates: raw.ssl_certificates,
                extra_context: raw.extra_context,
                templating: raw.templating,
                validation_tests: raw.validation_tests,
                status_templates: raw.status_templates,
            },
            haproxy: raw.haproxy,
            controller: raw.controller,
        }
    }
}

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// The `controller` section: timings, listeners and logging.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Controller {
    /// Quiet period after the last resource change before rendering.
    pub debounce: Duration,
    /// Longest a constant stream of changes may delay rendering.
    pub max_wait: Duration,
    /// The first change after a quiet period of at least `debounce` renders at once;
    /// `false` waits the quiet period after every change.
    pub debounce_leading_edge: bool,
    /// Minimum time between deployments.
    pub min_deployment_interval: Duration,
    /// Minimum time between reloads of one instance.
    pub min_reload_interval: Duration,
    /// Interval of the drift check.
    pub drift_prevention_interval: Duration,
    /// Deadline for deploying to one instance.
    pub deployment_timeout: Duration,
    /// Metrics, health, debug, reload and status page.
    pub listen: SocketAddr,
    /// Optional second listener serving only `/metrics`, `/healthz`, `/readyz`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<SocketAddr>,
    /// Log filter: a level (`info`) or a `RUST_LOG`-style directive list.
    pub log_level: String,
    /// Log format.
    pub log_format: LogFormat,
    /// Leader election among controller replicas (Kubernetes).
    pub leader_election: LeaderElection,
    /// How long a mandatory component may stay exited or unhealthy before
    /// `/healthz` fails, so a liveness probe restarts a controller that stopped
    /// working instead of one that is briefly restarting a component; `0s` turns the
    /// check off (`/healthz` then only says the process answers).
    pub liveness_grace: Duration,
    /// Timeouts and limits of both HTTP listeners, so a slow or hostile client cannot
    /// hold the controller's sockets, memory or shutdown hostage.
    pub http: Http,
    /// Host names (besides `localhost`, `127.0.0.1` and `[::1]`) that `/`, `/debug/*`
    /// and `/-/*` answer to. A browser tricked by DNS rebinding sends the attacker's
    /// name, so only names the operator expects are served.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    /// Whether `POST /-/reload` exists. Off: the endpoint answers 404 and only a
    /// file change or SIGHUP reloads the config.
    pub lifecycle_api: bool,
    /// When a change fails to render or validate, find the objects that cause it
    /// and let the rest of the change go live.
    pub quarantine: Quarantine,
    /// How fast the leader writes statuses rendered by `statusTemplates` to the
    /// Kubernetes API, so a full pass after a restart does not flood it.
    pub status: StatusWrites,
    /// A change that would remove more than a share of the running backends,
    /// servers or map entries is held instead of deployed (an emptied source must
    /// not take every route down).
    pub safety: deployer_safety::Config,
    /// The validating admission webhook: `kubectl apply` of an object that would
    /// make HAProxy reject the rendered config is refused up front, with the
    /// template line and HAProxy's message. Off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook: Option<Webhook>,
    /// OpenTelemetry traces of reconciliations, exported over OTLP/HTTP. Off when
    /// absent: no exporter, no layer, no cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracing: Option<Tracing>,
}

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
    fn default_service_name() -> String {
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

    fn validate(&self) -> Vec<ConfigIssue> {
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
    fn default_listen() -> SocketAddr {
        SocketAddr::from(([0, 0, 0, 0], 9443))
    }

    fn default_timeout() -> Duration {
        Duration::from_secs(8)
    }

    fn default_max_request_bytes() -> ByteSize {
        ByteSize::mib(4)
    }

    fn validate(&self, watched: &[&str]) -> Vec<ConfigIssue> {
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

/// The `controller.quarantine` section: how hard hapwright looks for the objects
/// that make a change fail, so one bad object does not block everyone else's
/// changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Quarantine {
    /// Extra renders and validations one failed reconciliation may spend on the
    /// search (one bad object among `n` changes costs about `log2(n) + 1`). When
    /// the search needs more, the whole change is rejected as it would be without
    /// quarantine. `0` turns quarantine off.
    pub max_validations: usize,
}

impl Default for Quarantine {
    fn default() -> Self {
        Self {
            max_validations: 16,
        }
    }
}

/// The `controller.status` section: the rate limit of status writes (a token
/// bucket: `burst` writes at once, then `qps` per second).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct StatusWrites {
    /// Status writes per second, sustained.
    pub qps: u32,
    /// Status writes allowed at once after a quiet period.
    pub burst: u32,
}

impl Default for StatusWrites {
    fn default() -> Self {
        let rate = hapwright_watchers::kubernetes::RateLimit::default();
        Self {
            qps: rate.qps as u32,
            burst: rate.burst,
        }
    }
}

impl StatusWrites {
    /// The writer's rate limit.
    pub fn rate_limit(&self) -> hapwright_watchers::kubernetes::RateLimit {
        hapwright_watchers::kubernetes::RateLimit {
            qps: f64::from(self.qps),
            burst: self.burst,
        }
    }

    fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        for (field, value) in [("qps", self.qps), ("burst", self.burst)] {
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
    fn validate(&self) -> Vec<ConfigIssue> {
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
fn is_host_name(name: &str) -> bool {
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
    fn validate(&self) -> Vec<ConfigIssue> {
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
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// An RFC 1123 subdomain: what Kubernetes accepts as most object names.
fn is_dns_subdomain(name: &str) -> bool {
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

impl Default for Controller {
    fn default() -> Self {
        let debounce = reconciler::Debounce::default();
        let timings = deployer::Timings::default();
        Self {
            debounce: debounce.debounce,
            max_wait: debounce.max_wait,
            debounce_leading_edge: debounce.leading_edge,
            min_deployment_interval: timings.min_deployment_interval,
            min_reload_interval: timings.min_reload_interval,
            drift_prevention_interval: timings.drift_prevention_interval,
            deployment_timeout: timings.deployment_timeout,
            listen: SocketAddr::from(([127, 0, 0, 1], 9400)),
            metrics_listen: None,
            log_level: "info".to_owned(),
            log_format: LogFormat::Text,
            leader_election: LeaderElection::default(),
            liveness_grace: Duration::from_secs(300),
            http: Http::default(),
            allowed_hosts: Vec::new(),
            lifecycle_api: true,
            quarantine: Quarantine::default(),
            status: StatusWrites::default(),
            safety: deployer_safety::Config::default(),
            webhook: None,
            tracing: None,
        }
    }
}

impl Controller {
    /// The debouncer's timings.
    pub fn debounce(&self) -> reconciler::Debounce {
        reconciler::Debounce {
            debounce: self.debounce,
            max_wait: self.max_wait,
            leading_edge: self.debounce_leading_edge,
        }
    }

    /// The scheduler's and deployer's timings.
    pub fn deploy_timings(&self) -> deployer::Timings {
        deployer::Timings {
            min_deployment_interval: self.min_deployment_interval,
            min_reload_interval: self.min_reload_interval,
            drift_prevention_interval: self.drift_prevention_interval,
            deployment_timeout: self.deployment_timeout,
        }
    }

    fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        if self.debounce > self.max_wait {
            issues.push(ConfigIssue::new(
                "maxWait",
                format!(
                    "maxWait ({}) is shorter than debounce ({}); it must be at least as long",
                    self.max_wait, self.debounce
                ),
            ));
        }
        if self.min_reload_interval < self.min_deployment_interval {
            issues.push(ConfigIssue::new(
                "minReloadInterval",
                format!(
                    "minReloadInterval ({}) is shorter than minDeploymentInterval ({})",
                    self.min_reload_interval, self.min_deployment_interval
                ),
            ));
        }
        for (field, value) in [
            ("driftPreventionInterval", self.drift_prevention_interval),
            ("deploymentTimeout", self.deployment_timeout),
        ] {
            if value.get().is_zero() {
                issues.push(ConfigIssue::new(
                    field,
                    format!("{field} must be longer than 0s"),
                ));
            }
        }
        if self.metrics_listen == Some(self.listen) {
            issues.push(ConfigIssue::new(
                "metricsListen",
                "metricsListen is the same address as listen",
            ));
        }
        if let Err(message) = check_log_level(&self.log_level) {
            issues.push(ConfigIssue::new("logLevel", message));
        }
        issues.extend(
            self.leader_election
                .validate()
                .into_iter()
                .map(|i| i.under("leaderElection")),
        );
        issues.extend(self.http.validate().into_iter().map(|i| i.under("http")));
        issues.extend(
            self.status
                .validate()
                .into_iter()
                .map(|i| i.under("status")),
        );
        issues.extend(
            self.safety
                .validate()
                .into_iter()
                .map(|i| i.under("safety")),
        );
        if let Some(tracing) = &self.tracing {
            issues.extend(tracing.validate().into_iter().map(|i| i.under("tracing")));
        }
        for (index, host) in self.allowed_hosts.iter().enumerate() {
            if !is_host_name(host) {
                issues.push(ConfigIssue::new(
                    format!("allowedHosts[{index}]"),
                    format!(
                        "`{host}` is not a host name or IP address (write it without scheme \
                         or port; IPv6 in brackets)"
                    ),
                ));
            }
        }
        issues
    }
}

/// The levels `logLevel` accepts on their own.
const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Checks `controller.logLevel`: a level, or a `RUST_LOG`-style filter whose every
/// directive names a level (`info,hapwright_deployer=debug`). A bare word that is not
/// a level is refused even though `EnvFilter` would take it as a target name: `inf` or
/// `verbose` would otherwise silently switch off every log line.
fn check_log_level(value: &str) -> Result<(), String> {
    const HINT: &str = "use one of trace, debug, info, warn, error, off, or a filter such \
                        as `info,hapwright_deployer=debug`";
    if value.trim().is_empty() {
        return Err(format!("logLevel is empty; {HINT}"));
    }
    for directive in value.split(',').map(str::trim) {
        let bare_word = !directive.contains(['=', ':', '[']);
        if bare_word && !LOG_LEVELS.iter().any(|l| l.eq_ignore_ascii_case(directive)) {
            let suggestion = hapwright_eventbus::config::did_you_mean(
                directive,
                LOG_LEVELS.iter().copied().chain(["warning", "verbose"]),
            )
            .map(|s| match s {
                "warning" => "warn",
                "verbose" => "debug",
                other => other,
            });
            return Err(match suggestion {
                Some(level) => {
                    format!("`{directive}` is not a log level, did you mean {level}? ({HINT})")
                }
                None => format!("`{directive}` is not a log level; {HINT}"),
            });
        }
    }
    tracing_subscriber::EnvFilter::try_new(value)
        .map(drop)
        .map_err(|error| format!("not a log level or filter ({error}); {HINT}"))
}

impl Config {
    /// Every section's semantic checks plus the cross-section ones, with paths from
    /// the top of the file. Does not touch the filesystem.
    pub fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues: Vec<ConfigIssue> = self
            .watched_resources
            .validate()
            .into_iter()
            .map(|i| i.under("watchedResources"))
            .collect();
        issues.extend(self.templates.validate());
        issues.extend(
            self.haproxy
                .validate()
                .into_iter()
                .map(|i| i.under("haproxy")),
        );
        issues.extend(
            self.controller
                .validate()
                .into_iter()
                .map(|i| i.under("controller")),
        );
        let watched: Vec<&str> = self
            .watched_resources
            .resources
            .keys()
            .map(String::as_str)
            .collect();
        if let Some(webhook) = &self.controller.webhook {
            issues.extend(
                webhook
                    .validate(&watched)
                    .into_iter()
                    .map(|i| i.under("controller.webhook")),
            );
            for name in &webhook.resources {
                if let Some(resource) = self.watched_resources.resources.get(name)
                    && let Err(error) = crate::webhook::Target::new(name, resource)
                {
                    issues.push(ConfigIssue::new(
                        format!("watchedResources.{name}.kubernetes.{}", error.field()),
                        format!("{} (the webhook evaluates it)", error.reason()),
                    ));
                }
            }
        }
        for resource in self.templates.status_templates.keys() {
            if !watched.contains(&resource.as_str()) {
                let hint =
                    hapwright_eventbus::config::did_you_mean(resource, watched.iter().copied())
                        .map(|s| format!(" did you mean {s}?"))
                        .unwrap_or_default();
                issues.push(ConfigIssue::new(
                    format!("statusTemplates.{resource}"),
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
        for (test, spec) in &self.templates.validation_tests {
            for resource in spec.fixtures.keys() {
                if !watched.contains(&resource.as_str()) {
                    issues.push(ConfigIssue::new(
                        format!("validationTests.{test}.fixtures.{resource}"),
                        format!(
                            "`{resource}` is not a watched resource (watchedResources has: {})",
                            if watched.is_empty() {
                                "none".to_owned()
                            } else {
                                watched.join(", ")
                            }
                        ),
                    ));
                }
            }
        }
        issues
    }

    /// Makes relative paths absolute against `base` (the config file's directory).
    pub fn resolve_paths(&mut self, base: &Path) {
        self.watched_resources.resolve_paths(base);
        self.haproxy.resolve_paths(base);
        if let Some(webhook) = &mut self.controller.webhook {
            for path in [&mut webhook.cert_file, &mut webhook.key_file] {
                if path.is_relative() {
                    *path = base.join(&*path);
                }
            }
        }
    }
}

/// Where one inline template is written in the config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TemplatePlace {
    /// Line of the template's first line.
    line: u32,
    /// Column where the template's text starts on its lines.
    column: u32,
    /// A block scalar (`|`, `>`): template line N is config line `line + N - 1`. A
    /// flow scalar is mapped for its first line only.
    block: bool,
}

/// Where each inline template (`haproxyConfig`, snippets, maps, files,
/// certificates) is written in the config file, so an error in a template also names
/// the config file line users edit: `hapwright.yaml:87:47 (maps/hosts.map line 4)`.
#[derive(Clone, Debug, Default)]
pub struct TemplatePlaces {
    file: String,
    places: std::collections::BTreeMap<String, TemplatePlace>,
}

impl TemplatePlaces {
    /// Finds every template of `config` in `text`, the file shown as `display`.
    pub fn new(text: &str, display: &str, config: &Config) -> Self {
        let locator = Locator::new(text);
        let lines: Vec<&str> = text.lines().collect();
        let templates = &config.templates;
        let names = std::iter::once(("haproxy.cfg".to_owned(), "haproxyConfig".to_owned()))
            .chain(
                templates
                    .template_snippets
                    .keys()
                    .map(|n| (n.clone(), format!("templateSnippets.{n}"))),
            )
            .chain(
                templates
                    .maps
                    .keys()
                    .map(|n| (format!("maps/{n}"), format!("maps.{n}"))),
            )
            .chain(
                templates
                    .files
                    .keys()
                    .map(|n| (format!("files/{n}"), format!("files.{n}"))),
            )
            .chain(
                templates
                    .ssl_certificates
                    .keys()
                    .map(|n| (format!("certs/{n}"), format!("sslCertificates.{n}"))),
            )
            .chain(templates.status_templates.keys().map(|n| {
                (
                    hapwright_reconciler::status::template_name(n),
                    format!("statusTemplates.{n}"),
                )
            }));
        let mut places = std::collections::BTreeMap::new();
        for (name, key) in names {
            let path = format!("{key}.template");
            let (Some((key_line, key_column)), Some((line, column))) =
                (locator.locate(&path), locator.value_at(&path))
            else {
                continue;
            };
            let Some(text_line) = lines.get(key_line as usize - 1) else {
                continue;
            };
            // After `template:` on the key's line: a block indicator, or the value.
            let after_key: String = text_line
                .chars()
                .skip(key_column as usize - 1)
                .skip_while(|c| *c != ':')
                .skip(1)
                .collect();
            let first = match after_key.trim_start().chars().next() {
                Some(c @ ('|' | '>')) => Some(c),
                _ => lines
                    .get(line as usize - 1)
                    .and_then(|l| l.chars().nth(column as usize - 1)),
            };
            let place = match first {
                Some('|' | '>') => {
                    // The content starts on the next line, at the indent of its first
                    // non-blank line.
                    let indent = lines
                        .iter()
                        .skip(key_line as usize)
                        .find(|l| !l.trim().is_empty())
                        .map_or(0, |l| l.len() - l.trim_start().len());
                    TemplatePlace {
                        line: key_line + 1,
                        column: u32::try_from(indent).unwrap_or(0) + 1,
                        block: true,
                    }
                }
                Some('"' | '\'') => TemplatePlace {
                    line,
                    column: column + 1,
                    block: false,
                },
                _ => TemplatePlace {
                    line,
                    column,
                    block: false,
                },
            };
            places.insert(name, place);
        }
        Self {
            file: display.to_owned(),
            places,
        }
    }

    /// Adds the config file place to every diagnostic that points at a line of an
    /// inline template.
    pub fn locate(&self, errors: Vec<Diagnostic>) -> Vec<Diagnostic> {
        errors
            .into_iter()
            .map(|error| match self.config_place(&error) {
                Some(place) => error.in_config(place),
                None => error,
            })
            .collect()
    }

    fn config_place(&self, error: &Diagnostic) -> Option<SourceLocation> {
        let template = error.template_location()?;
        let place = self.places.get(&template.file)?;
        let line = template.line?;
        let (line, column) = if place.block {
            (
                place.line + line - 1,
                Some(place.column + template.column.unwrap_or(1) - 1),
            )
        } else if line == 1 {
            (
                place.line,
                Some(place.column + template.column.unwrap_or(1) - 1),
            )
        } else {
            (place.line, None)
        };
        Some(SourceLocation::new(self.file.clone(), Some(line), column))
    }
}

/// A loaded, valid configuration.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The configuration, paths resolved, passwords read.
    pub config: Config,
    /// The config file as given.
    pub path: PathBuf,
    /// Hash over the config file and every password: equal hashes mean an identical
    /// effective configuration.
    pub hash: ContentHash,
    /// Files whose change means the configuration may have changed: the config file
    /// and every `passwordFile`.
    pub watched_files: Vec<PathBuf>,
    /// Where each inline template is written, to locate template errors in the file.
    pub templates_at: TemplatePlaces,
    /// Where each watched resource is configured, by name, for its source's errors.
    pub resources_at: std::collections::BTreeMap<String, SourceLocation>,
}

/// Where each `watchedResources.<name>` entry of `config` is in `text`.
fn resource_places(
    text: &str,
    display: &str,
    config: &Config,
) -> std::collections::BTreeMap<String, SourceLocation> {
    let locator = Locator::new(text);
    config
        .watched_resources
        .resources
        .keys()
        .filter_map(|name| {
            let (line, column) = locator.locate(&format!("watchedResources.{name}"))?;
            Some((
                name.clone(),
                SourceLocation::new(display, Some(line), Some(column)),
            ))
        })
        .collect()
}

/// Loads and validates the config file at `path`: read (at most
/// [`MAX_CONFIG_SIZE`]), parse (unknown keys, types, durations), resolve relative
/// paths against the file's directory, run every semantic check and read password
/// files. Every problem comes back as a diagnostic at `file:line:column`; parsing
/// stops at the first syntax or type error, semantic checks report all problems.
pub fn load(path: &Path) -> Result<Loaded, Vec<Diagnostic>> {
    let display = path.display().to_string();
    let at_file = |message: String| {
        vec![Diagnostic::error(message).at(SourceLocation::new(display.clone(), None, None))]
    };
    let meta = std::fs::metadata(path)
        .map_err(|error| at_file(format!("cannot read config file: {error}")))?;
    if meta.len() > MAX_CONFIG_SIZE {
        return Err(at_file(format!(
            "config file is too large: {} bytes, over the {} byte limit",
            meta.len(),
            MAX_CONFIG_SIZE
        )));
    }
    let bytes = std::fs::read(path)
        .map_err(|error| at_file(format!("cannot read config file: {error}")))?;
    let text = yaml::decode_utf8(&bytes, &display).map_err(|d| vec![d])?;
    parse(text, path, &display).map(|(config, hash)| Loaded {
        watched_files: std::iter::once(path.to_path_buf())
            .chain(config.haproxy.secret_files())
            .collect(),
        templates_at: TemplatePlaces::new(text, &display, &config),
        resources_at: resource_places(text, &display, &config),
        config,
        path: path.to_path_buf(),
        hash,
    })
}

/// Parses config text as if it were the file at `path` (which sets the base for
/// relative paths and the file name in errors).
pub fn parse(
    text: &str,
    path: &Path,
    display: &str,
) -> Result<(Config, ContentHash), Vec<Diagnostic>> {
    let blank = text.lines().all(|line| {
        let line = line.trim();
        line.is_empty() || line.starts_with('#') || line == "---" || line == "..."
    });
    if blank {
        return Err(vec![
            Diagnostic::error(
                "the config file is empty (it needs at least `haproxyConfig: { template: … }`)",
            )
            .at(SourceLocation::new(display, None, None)),
        ]);
    }
    let mut config: Config =
        yaml::parse_typed(text, display, &Limits::default()).map_err(|d| vec![d])?;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let base = absolute
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    config.resolve_paths(&base);
    let mut issues = config.validate();
    issues.extend(
        config
            .haproxy
            .load_secrets()
            .into_iter()
            .map(|i| i.under("haproxy")),
    );
    if !issues.is_empty() {
        let locator = Locator::new(text);
        return Err(issues
            .into_iter()
            .map(|issue| {
                let (line, column) = locator.locate(&issue.path).unzip();
                Diagnostic::error(issue.to_string()).at(SourceLocation::new(display, line, column))
            })
            .collect());
    }
    let mut hashed = text.as_bytes().to_vec();
    let static_passwords = config
        .haproxy
        .instances
        .iter()
        .filter_map(|instance| instance.dataplane.as_ref()?.password.as_ref());
    let discovery_password = config
        .haproxy
        .discovery
        .as_ref()
        .and_then(|d| d.kubernetes.as_ref()?.password.as_ref());
    for password in static_passwords.chain(discovery_password) {
        hashed.push(0);
        hashed.extend_from_slice(password.expose().as_bytes());
    }
    Ok((config, ContentHash::of(&hashed)))
}

#[cfg(test)]
mod leader_election_tests {
    use super::*;

    pub(super) fn parse_controller(controller: &str) -> Result<Config, Vec<String>> {
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

#[cfg(test)]
mod http_tests {
    use super::leader_election_tests::parse_controller;
    use super::*;

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

#[cfg(test)]
mod log_level_tests {
    use super::check_log_level;

    #[test]
    fn levels_and_filters_are_accepted() {
        for value in [
            "info",
            "DEBUG",
            "warn",
            "off",
            "info,hapwright_deployer=debug",
            "hapwright_app::http=trace",
            "error,[reconcile]=debug",
        ] {
            assert_eq!(check_log_level(value), Ok(()), "{value}");
        }
    }

    #[test]
    fn words_that_are_not_levels_are_refused_with_a_suggestion() {
        let err = |value: &str| check_log_level(value).unwrap_err();
        assert!(
            err("inf").contains("`inf` is not a log level, did you mean info?"),
            "{}",
            err("inf")
        );
        assert!(
            err("debugg").contains("did you mean debug?"),
            "{}",
            err("debugg")
        );
        assert!(
            err("verbose").contains("did you mean debug?"),
            "{}",
            err("verbose")
        );
        assert!(
            err("warning").contains("did you mean warn?"),
            "{}",
            err("warning")
        );
        assert!(
            err("chatty").contains("use one of trace, debug, info"),
            "{}",
            err("chatty")
        );
        assert!(err("info,loud").contains("`loud`"), "{}", err("info,loud"));
        assert!(err("").contains("empty"));
    }
}

#[cfg(test)]
mod wording_tests {
    use super::*;

    fn error(text: &str) -> String {
        let errors = parse(
            text,
            Path::new("/nonexistent/hapwright.yaml"),
            "hapwright.yaml",
        )
        .unwrap_err();
        errors[0].to_string()
    }

    #[test]
    fn parser_jargon_reads_as_plain_words_with_the_fix() {
        let cases = [
            (
                "haproxyConfig: { template: x }\nwatchedResources:\n  s:\n    files: { path: . }\n    indexBy: metadata.name\n",
                "hapwright.yaml:5:14: watchedResources.s.indexBy: expected a list (e.g. `[metadata.name]`)",
            ),
            (
                "haproxyConfig: x\n",
                "hapwright.yaml:1:16: haproxyConfig: expected `{ template: … }`",
            ),
            (
                "haproxyConfig: { template: x }\nmaps:\n  hosts.map: x\n",
                "hapwright.yaml:3:14: maps.hosts.map: expected `{ template: … }`",
            ),
            (
                "haproxyConfig: { template: x }\ntemplating: { fuel: lots }\n",
                "hapwright.yaml:2:21: templating.fuel: expected a whole number",
            ),
            (
                "haproxyConfig: { template: x }\ntemplating: { trimBlocks: maybe }\n",
                "hapwright.yaml:2:27: templating.trimBlocks: expected true or false",
            ),
            (
                "haproxyConfig: { template: x }\ncontroller:\n  listen: localhost:9400\n",
                "hapwright.yaml:3:11: controller.listen: expected ip:port (host names are not accepted)",
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(error(text), expected, "{text}");
        }
    }

    #[test]
    fn a_duplicate_key_has_no_placeholder_path() {
        let message = error("haproxyConfig: { template: x }\ncontroller: {}\ncontroller: {}\n");
        assert!(message.starts_with("hapwright.yaml:3:"), "{message}");
        assert!(!message.contains("?:"), "{message}");
        assert!(message.contains("duplicate"), "{message}");
    }

    #[test]
    fn an_empty_file_says_so() {
        for text in ["", "\n\n", "# nothing yet\n---\n"] {
            let message = error(text);
            assert!(
                message.starts_with("hapwright.yaml: the config file is empty"),
                "{message}"
            );
        }
    }
}

#[cfg(test)]
mod template_places_tests {
    use super::*;

    fn places(text: &str) -> TemplatePlaces {
        let (config, _) = parse(
            text,
            Path::new("/nonexistent/hapwright.yaml"),
            "hapwright.yaml",
        )
        .unwrap();
        TemplatePlaces::new(text, "hapwright.yaml", &config)
    }

    fn shown(places: &TemplatePlaces, error: Diagnostic) -> String {
        places.locate(vec![error])[0].to_string()
    }

    #[test]
    fn template_errors_name_the_config_file_line_and_column() {
        let text = "\
haproxyConfig:
  template: |
    global
        bogus on
maps:
  hosts.map: { template: \"{{ x | uper }}\" }
templateSnippets:
  be:
    template: >-
      backend {{ y }}
";
        let places = places(text);
        let at = |file: &str, line, column| {
            Diagnostic::error("oops").at(SourceLocation::new(file, Some(line), column))
        };
        assert_eq!(
            shown(&places, at("maps/hosts.map", 1, Some(8))),
            "hapwright.yaml:6:34 (maps/hosts.map line 1): oops"
        );
        assert_eq!(
            shown(&places, at("be", 1, None)),
            "hapwright.yaml:10:7 (be line 1): oops"
        );
        // A rendered line names its template line and where that is in the file.
        let rendered = Diagnostic::error("unknown keyword 'bogus'")
            .at(SourceLocation::new("haproxy.cfg", Some(2), None))
            .from_origin(SourceLocation::new("haproxy.cfg", Some(2), None));
        assert_eq!(
            shown(&places, rendered),
            "haproxy.cfg:2: unknown keyword 'bogus' (from haproxy.cfg:2, hapwright.yaml:4:5)"
        );
        // Anything else is left alone.
        assert_eq!(
            shown(&places, at("services.yaml", 3, None)),
            "services.yaml:3: oops"
        );
    }
}

#[cfg(test)]
mod safety_tests {
    use super::leader_election_tests::parse_controller;
    use super::*;
    use hapwright_deployer::safety::MaxRemoval;

    #[test]
    fn safety_keys_load_with_defaults_and_off() {
        let defaults = parse_controller("  logLevel: info\n").unwrap();
        assert_eq!(
            defaults.controller.safety.max_removal,
            MaxRemoval::Percent(50)
        );
        assert_eq!(
            defaults.controller.safety.confirm_after,
            Duration::from_secs(300)
        );
        let config =
            parse_controller("  safety: { maxRemoval: 30%, confirmAfter: 10m }\n").unwrap();
        assert_eq!(
            config.controller.safety.max_removal,
            MaxRemoval::Percent(30)
        );
        assert_eq!(
            config.controller.safety.confirm_after,
            Duration::from_secs(600)
        );
        let off = parse_controller("  safety: { maxRemoval: off }\n").unwrap();
        assert_eq!(off.controller.safety.max_removal, MaxRemoval::Off);
    }

    #[test]
    fn bad_safety_keys_are_located() {
        let errors = parse_controller("  safety:\n    maxRemoval: 150%\n").unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains("hapwright.yaml:4:")
                && errors[0].contains("controller.safety.maxRemoval")
                && errors[0].contains("a percentage from 0% to 100%"),
            "{errors:?}"
        );
        let errors = parse_controller("  safety:\n    confirmAfter: 0s\n").unwrap_err();
        assert!(
            errors[0].contains("hapwright.yaml:4:")
                && errors[0].contains("controller.safety.confirmAfter"),
            "{errors:?}"
        );
        let errors = parse_controller("  safety:\n    maxRemovel: 20%\n").unwrap_err();
        assert!(errors[0].contains("maxRemovel"), "{errors:?}");
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

#[cfg(test)]
mod status_template_tests {
    use super::*;

    fn parse_text(text: &str) -> Result<(Config, TemplatePlaces), Vec<String>> {
        parse(
            text,
            Path::new("/etc/hapwright/hapwright.yaml"),
            "hapwright.yaml",
        )
        .map(|(config, _)| {
            let places = TemplatePlaces::new(text, "hapwright.yaml", &config);
            (config, places)
        })
        .map_err(|ds| ds.iter().map(ToString::to_string).collect())
    }

    const WATCHED: &str = "watchedResources:\n  ingresses:\n    kubernetes: { apiVersion: networking.k8s.io/v1, kind: Ingress }\nhaproxyConfig: { template: x }\n";

    #[test]
    fn status_keys_load_with_defaults() {
        let (config, _) = parse_text(&format!(
            "{WATCHED}statusTemplates:\n  ingresses:\n    template: 'a: 1'\n"
        ))
        .unwrap();
        assert_eq!(
            config.templates.status_templates["ingresses"].template,
            "a: 1"
        );
        assert_eq!(
            config.controller.status,
            StatusWrites { qps: 10, burst: 20 }
        );
        let (config, _) = parse_text(&format!(
            "{WATCHED}controller:\n  status: {{ qps: 2, burst: 5 }}\n"
        ))
        .unwrap();
        assert_eq!(config.controller.status.rate_limit().qps, 2.0);
        assert_eq!(config.controller.status.rate_limit().burst, 5);
    }

    #[test]
    fn a_status_template_for_an_unwatched_resource_and_a_zero_rate_are_located() {
        let errors = parse_text(&format!(
            "{WATCHED}statusTemplates:\n  ingress:\n    template: 'a: 1'\ncontroller:\n  status: {{ qps: 0 }}\n"
        ))
        .unwrap_err()
        .join("\n");
        assert!(
            errors.contains("hapwright.yaml:6:")
                && errors.contains("statusTemplates.ingress")
                && errors.contains("`ingress` is not a watched resource; did you mean ingresses?"),
            "{errors}"
        );
        assert!(
            errors.contains("controller.status.qps: qps must be at least 1"),
            "{errors}"
        );
    }

    #[test]
    fn status_template_errors_name_the_config_file_line() {
        let text = format!(
            "{WATCHED}statusTemplates:\n  ingresses:\n    template: |\n      a: 1\n      b: {{{{ object. }}}}\n"
        );
        let (config, places) = parse_text(&text).unwrap();
        let errors = crate::build::renderer(&config).unwrap_err();
        let shown: Vec<String> = places
            .locate(errors)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(
            shown.iter().any(|e| e.starts_with("hapwright.yaml:9:")
                && e.contains("statusTemplates.ingresses line 2")),
            "{shown:?}"
        );
    }
}

#[cfg(test)]
mod tracing_tests {
    use super::leader_election_tests::parse_controller;

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
