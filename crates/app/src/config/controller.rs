//! The `controller` section: timings, listeners, logging and its checks.

#[allow(unused_imports)]
use super::*;

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

    pub(super) fn validate(&self) -> Vec<ConfigIssue> {
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
            issues.push(ConfigIssue::new("logLevel", message.to_string()));
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
pub(super) const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// The advice every `logLevel` error ends with.
const LOG_LEVEL_HINT: &str = "use one of trace, debug, info, warn, error, off, or a filter such \
                              as `info,hapwright_deployer=debug`";

/// Why `controller.logLevel` is refused.
#[derive(Debug, thiserror::Error)]
pub(super) enum LogLevelError {
    /// Nothing but blanks.
    #[error("logLevel is empty; {hint}", hint = LOG_LEVEL_HINT)]
    Empty,
    /// A bare word close to a level.
    #[error(
        "`{directive}` is not a log level, did you mean {level}? ({hint})",
        hint = LOG_LEVEL_HINT
    )]
    Misspelt {
        /// The word.
        directive: String,
        /// The level it is close to.
        level: String,
    },
    /// A bare word that is not a level.
    #[error("`{0}` is not a log level; {hint}", hint = LOG_LEVEL_HINT)]
    NotALevel(String),
    /// A filter `EnvFilter` refuses.
    #[error("not a log level or filter ({0}); {hint}", hint = LOG_LEVEL_HINT)]
    Filter(tracing_subscriber::filter::ParseError),
}

/// Checks `controller.logLevel`: a level, or a `RUST_LOG`-style filter whose every
/// directive names a level (`info,hapwright_deployer=debug`). A bare word that is not
/// a level is refused even though `EnvFilter` would take it as a target name: `inf` or
/// `verbose` would otherwise silently switch off every log line.
pub(super) fn check_log_level(value: &str) -> Result<(), LogLevelError> {
    if value.trim().is_empty() {
        return Err(LogLevelError::Empty);
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
                Some(level) => LogLevelError::Misspelt {
                    directive: directive.to_owned(),
                    level: level.to_owned(),
                },
                None => LogLevelError::NotALevel(directive.to_owned()),
            });
        }
    }
    tracing_subscriber::EnvFilter::try_new(value)
        .map(drop)
        .map_err(LogLevelError::Filter)
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
            assert!(check_log_level(value).is_ok(), "{value}");
        }
    }

    #[test]
    fn words_that_are_not_levels_are_refused_with_a_suggestion() {
        let err = |value: &str| check_log_level(value).unwrap_err().to_string();
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
