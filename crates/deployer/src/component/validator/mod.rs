//! The two-phase validator: every rendered configuration is checked by
//! hapwright's own parser (phase 1, [`ValidationPhase::Parse`]) and then by
//! `haproxy -c` (phase 2, [`ValidationPhase::Haproxy`]) before anything is deployed.
//!
//! - Phase 1 parses `haproxy.cfg` with [`crate::haproxy::config`] and runs its checks
//!   (duplicate proxy names, missing `use_backend`/`default_backend` targets,
//!   references to files that were not rendered). It is fast and its errors are
//!   precise; when it rejects, phase 2 does not run.
//! - Phase 2 writes every rendered file into a scratch directory at the path
//!   `path()` gives it (`haproxy.cfg`, `maps/…`, `files/…`, `certs/…`) and runs
//!   `haproxy -c -f haproxy.cfg` there, with the scratch directory as working
//!   directory so relative paths resolve as on an instance. It runs once per
//!   distinct instance environment (so `"${HTTP_PORT}"` validates as it will run),
//!   one run at a time in the whole process (each run may need hundreds of MB for
//!   large configs), each bounded by a timeout. `[ALERT]`/`[WARNING]` lines become
//!   diagnostics.
//! - The [`Validator`] component may record phase 2 as passed by [`equivalence`]
//!   instead: when a render differs from the last one that passed `haproxy -c` only
//!   in values phase 1 checks completely (server IP literals, ports, weights,
//!   string-map entries), HAProxy would accept it too, and its start-up time is
//!   saved. Each such decision is counted in
//!   `hapwright_validation_phase2_skipped_total{reason}` and logged.
//!
//! Every diagnostic is located in a rendered file (`haproxy.cfg:12`,
//! `files/ips.acl:2`), carries that rendered line, and names the template or
//! snippet line that produced it, through the renderer's source map.
//!
//! The [`Validator`] component does this for each `TemplateRendered` event and
//! replies `ValidationCompleted` or `ValidationFailed`; [`validate`] is the same
//! check as a plain function for the CLI. Latest wins down to the validation: a
//! newer render (another hash) stops the validation in progress, which is never
//! answered (`hapwright_validations_superseded_total`), and the render validated
//! last, published again, is answered from memory without validating again
//! (`hapwright_validations_remembered_total`).

mod alerts;
mod certificates;
pub mod equivalence;
mod scratch;

use scratch::write_scratch;
pub use scratch::{SCRATCH_PREFIX, sweep_scratch};

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::model::ContentHash;
use hapwright_eventbus::model::{
    Diagnostic, FileKind, RenderedConfig, Severity, SourceLocation, same_text,
};
use hapwright_eventbus::{
    Component, ComponentError, Context, Event, EventKind, EventPayload, HealthReporter, Interest,
    Publisher, ValidationCompleted, ValidationFailed, ValidationPhase,
};
use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry};
use tokio::io::AsyncReadExt;
use tokio::time::Instant;
use tracing::Instrument;

use crate::haproxy::config::{self as haproxy_config, MAIN_FILE, SectionKind};
use equivalence::{Baseline, Equivalence, SkipReason};

/// Only one `haproxy -c` runs at a time in the process: a run over a large config
/// needs hundreds of MB (haproxy-2.6.md §0), and several at once would only compete
/// for the same cores. The lock holds no state, so it cannot go stale across
/// controller reloads.
static PHASE2_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Differences from the baseline (added or removed backends, changed `server`
/// lines, changed certificates and crt-lists) past which a render that passed phase 2
/// by equivalence is checked with `haproxy -c` in the background, to become the
/// baseline: the rule checks every difference again on each comparison, so a
/// baseline that falls far behind what is rendered makes each validation longer.
pub const REFRESH_AFTER: usize = 32;

/// How much of `haproxy -c`'s output is kept; more is discarded.
const MAX_OUTPUT: u64 = 4 << 20;

/// Validator settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The HAProxy binary for phase 2 (a bare name is looked up on `PATH`).
    pub binary: PathBuf,
    /// One environment per distinct instance environment: phase 2 runs once per
    /// distinct entry, with these variables added to the controller's own
    /// environment. An empty list means one run with nothing added.
    pub envs: Vec<BTreeMap<String, String>>,
    /// Upper bound for one `haproxy -c` run; the process is killed after it.
    pub timeout: Duration,
    /// Where scratch directories are created (the system temp dir when `None`).
    pub scratch_root: Option<PathBuf>,
    /// Whether the [`Validator`] component may record phase 2 as passed by
    /// structural equivalence ([`equivalence`]) instead of running `haproxy -c`
    /// when a render differs from the last one that passed only in values phase 1
    /// checks completely. Saves HAProxy's start-up time on every endpoint change;
    /// off runs `haproxy -c` for every render.
    pub equivalence: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            binary: PathBuf::from("haproxy"),
            envs: Vec::new(),
            timeout: Duration::from_secs(30),
            scratch_root: None,
            equivalence: true,
        }
    }
}

/// Why a rendered configuration was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The phase that rejected it.
    pub phase: ValidationPhase,
    /// Every error, located and mapped to template lines where possible.
    pub errors: Vec<Diagnostic>,
    /// True when HAProxy could not judge the config at all (the binary is missing,
    /// the scratch directory cannot be written, the run timed out or crashed):
    /// the validator is then unhealthy, and the config may well be fine.
    pub tool_failure: bool,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let phase = match self.phase {
            ValidationPhase::Parse => "phase 1 (parse)",
            ValidationPhase::Haproxy => "phase 2 (haproxy -c)",
        };
        write!(f, "{phase} rejected the configuration")?;
        for error in &self.errors {
            write!(f, "\n  {error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Rejection {}

// === impl Metrics ===

/// `hapwright_validations_total{phase,result}`,
/// `hapwright_validation_duration_seconds{phase}`,
/// `hapwright_validation_phase2_skipped_total{reason}` and
/// `hapwright_validation_baseline_refreshes_total{result}`. Register once per process
/// and hand clones to each generation's validator.
#[derive(Clone, Debug)]
pub struct Metrics {
    validations: IntCounterVec,
    duration: HistogramVec,
    phase2_skipped: IntCounterVec,
    superseded: IntCounter,
    remembered: IntCounter,
    refreshes: IntCounterVec,
}

/// The results of `hapwright_validation_baseline_refreshes_total`.
const REFRESH_RESULTS: [&str; 3] = ["refreshed", "refused", "failed"];

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let validations = IntCounterVec::new(
            Opts::new(
                "hapwright_validations_total",
                "Validation runs per phase and result.",
            ),
            &["phase", "result"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "hapwright_validation_duration_seconds",
                "Time spent in each validation phase.",
            )
            .buckets(prometheus::exponential_buckets(0.001, 2.0, 16)?),
            &["phase"],
        )?;
        let phase2_skipped = IntCounterVec::new(
            Opts::new(
                "hapwright_validation_phase2_skipped_total",
                "Renders whose phase 2 passed by structural equivalence instead of haproxy -c, by reason.",
            ),
            &["reason"],
        )?;
        for reason in SkipReason::ALL {
            phase2_skipped.with_label_values(&[reason.as_str()]);
        }
        let superseded = IntCounter::new(
            "hapwright_validations_superseded_total",
            "Validations stopped because a newer render arrived before they finished.",
        )?;
        let remembered = IntCounter::new(
            "hapwright_validations_remembered_total",
            "Renders answered from the validation of the same render just before, without validating again.",
        )?;
        for phase in [ValidationPhase::Parse, ValidationPhase::Haproxy] {
            for result in ["success", "failure"] {
                validations.with_label_values(&[phase_label(phase), result]);
            }
        }
        let refreshes = IntCounterVec::new(
            Opts::new(
                "hapwright_validation_baseline_refreshes_total",
                "Background haproxy -c runs of renders that passed by equivalence far from the baseline, by result.",
            ),
            &["result"],
        )?;
        for result in REFRESH_RESULTS {
            refreshes.with_label_values(&[result]);
        }
        registry.register(Box::new(validations.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(phase2_skipped.clone()))?;
        registry.register(Box::new(superseded.clone()))?;
        registry.register(Box::new(remembered.clone()))?;
        registry.register(Box::new(refreshes.clone()))?;
        Ok(Self {
            validations,
            duration,
            phase2_skipped,
            superseded,
            remembered,
            refreshes,
        })
    }

    fn observe(&self, phase: ValidationPhase, success: bool, elapsed: Duration) {
        let phase = phase_label(phase);
        let result = if success { "success" } else { "failure" };
        self.validations.with_label_values(&[phase, result]).inc();
        self.duration
            .with_label_values(&[phase])
            .observe(elapsed.as_secs_f64());
    }
}

fn phase_label(phase: ValidationPhase) -> &'static str {
    match phase {
        ValidationPhase::Parse => "parse",
        ValidationPhase::Haproxy => "haproxy",
    }
}

// === validation ===

/// Validates a rendered configuration with both phases. Returns the warnings on
/// success.
///
/// # Errors
///
/// A [`Rejection`] naming the phase and every error. Phase 2 is skipped when
/// phase 1 rejects.
pub async fn validate(
    rendered: &RenderedConfig,
    config: &Config,
) -> Result<Vec<Diagnostic>, Rejection> {
    validate_with_metrics(rendered, config, None).await
}

/// [`validate`], recording each phase's outcome and time in `metrics`.
///
/// # Errors
///
/// As [`validate`].
pub async fn validate_with_metrics(
    rendered: &RenderedConfig,
    config: &Config,
    metrics: Option<&Metrics>,
) -> Result<Vec<Diagnostic>, Rejection> {
    validate_parsed(rendered, config, metrics)
        .await
        .map(|(warnings, _)| warnings)
}

/// [`validate_with_metrics`], also returning phase 1's parsed model of
/// `haproxy.cfg`, which travels on with the validated config (the deployer plans
/// from it without parsing again).
///
/// # Errors
///
/// As [`validate`].
pub async fn validate_parsed(
    rendered: &RenderedConfig,
    config: &Config,
    metrics: Option<&Metrics>,
) -> Result<(Vec<Diagnostic>, Arc<haproxy_config::Config>), Rejection> {
    let started = Instant::now();
    let phase1 = validate_phase1_parsed(rendered);
    if let Some(metrics) = metrics {
        metrics.observe(ValidationPhase::Parse, phase1.is_ok(), started.elapsed());
    }
    let (mut warnings, model) = phase1?;
    let started = Instant::now();
    let phase2 = validate_phase2(rendered, config).await;
    if let Some(metrics) = metrics {
        metrics.observe(ValidationPhase::Haproxy, phase2.is_ok(), started.elapsed());
    }
    warnings.extend(phase2?);
    Ok((warnings, Arc::new(model)))
}

/// Phase 1 alone: hapwright's parser and checks, plus a check that every rendered
/// file name is a plain relative path. Returns the warnings on success.
///
/// # Errors
///
/// A [`Rejection`] in [`ValidationPhase::Parse`] with every error found.
pub fn validate_phase1(rendered: &RenderedConfig) -> Result<Vec<Diagnostic>, Rejection> {
    validate_phase1_parsed(rendered).map(|(warnings, _)| warnings)
}

/// [`validate_phase1`], also returning the parsed model.
///
/// # Errors
///
/// As [`validate_phase1`].
pub fn validate_phase1_parsed(
    rendered: &RenderedConfig,
) -> Result<(Vec<Diagnostic>, haproxy_config::Config), Rejection> {
    validate_phase1_reusing(None, rendered)
}

/// [`validate_phase1_parsed`], parsing only the sections of `haproxy.cfg` that changed
/// since `previous` (a render and its model, which passed phase 1) where that gives
/// the same model ([`haproxy_config::parse_reusing`]).
///
/// # Errors
///
/// As [`validate_phase1`].
pub fn validate_phase1_reusing(
    previous: Option<(&RenderedConfig, &haproxy_config::Config)>,
    rendered: &RenderedConfig,
) -> Result<(Vec<Diagnostic>, haproxy_config::Config), Rejection> {
    let paths = RenderedPaths::of(rendered);
    let mut diagnostics = paths.problems.clone();
    let previous_paths = previous.map(|(rendered, _)| RenderedPaths::of(rendered));
    let previous =
        previous
            .zip(previous_paths.as_ref())
            .map(
                |((rendered, model), rendered_paths)| haproxy_config::Passed {
                    text: rendered.main(),
                    model,
                    rendered_paths: &rendered_paths.names,
                },
            );
    let (model, found) = haproxy_config::phase1_reusing(previous, rendered.main(), &paths.names);
    diagnostics.extend(found);
    let diagnostics: Vec<Diagnostic> = diagnostics
        .into_iter()
        .map(|d| attribute(d, rendered))
        .collect();
    let (errors, warnings): (Vec<_>, Vec<_>) = diagnostics
        .into_iter()
        .partition(|d| d.severity == Severity::Error);
    if errors.is_empty() {
        Ok((warnings, model))
    } else {
        Err(Rejection {
            phase: ValidationPhase::Parse,
            errors,
            tool_failure: false,
        })
    }
}

/// The paths of a render's files relative to the config directory, as phase 1
/// checks the config against them, and the names that are no plain relative path.
/// The last sets built are kept and handed out again to a render with the same
/// file names: consecutive renders nearly always have them (a certificate
/// renewed, a map line changed), and a set costs a string per file, 10,000 at
/// 10,000 certificates.
struct RenderedPaths {
    /// The paths, sharing the render's groups.
    names: haproxy_config::FileNames,
    problems: Vec<Diagnostic>,
}

/// How many sets [`RenderedPaths::of`] keeps (the render and the one it is
/// compared with).
const KEPT_PATHS: usize = 2;

/// The kept sets, each with the hash of the last render it was handed to (asked
/// again for that render, as phase 1 and the equivalence rule both do, the set is
/// found without comparing names).
static PATHS: std::sync::Mutex<Vec<(Arc<RenderedPaths>, ContentHash)>> =
    std::sync::Mutex::new(Vec::new());

impl RenderedPaths {
    /// The set of `rendered`: one kept set for every render with the same file
    /// names (the same `Arc`, so callers may remember answers by it).
    fn of(rendered: &RenderedConfig) -> Arc<Self> {
        let names = haproxy_config::FileNames::of(rendered);
        let mut kept = PATHS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let hash = rendered.hash();
        if let Some(at) = kept
            .iter()
            .position(|(_, last)| *last == hash)
            .or_else(|| kept.iter().position(|(paths, _)| paths.names.same(&names)))
        {
            let (found, _) = kept.remove(at);
            kept.push((found.clone(), hash));
            return found;
        }
        let problem = |path: &str| {
            (!is_plain_relative(path)).then(|| {
                let name = haproxy_config::FileNames::name_of(path);
                Diagnostic::error(format!(
                    "rendered file name '{name}' is not a plain file name (it must not be empty or contain '..' or a leading '/')"
                ))
            })
        };
        // Names only come: when the last set had no problem, only the new names
        // can have one.
        let problems = match kept.last() {
            Some((last, _)) if last.problems.is_empty() => names
                .changes_since(&last.names)
                .into_iter()
                .filter(|(_, new)| *new)
                .filter_map(|(path, _)| problem(&path))
                .collect(),
            _ => names.paths().filter_map(|path| problem(&path)).collect(),
        };
        let built = Arc::new(Self { names, problems });
        if kept.len() >= KEPT_PATHS {
            kept.remove(0);
        }
        kept.push((built.clone(), hash));
        built
    }
}

pub(crate) fn is_plain_relative(path: &str) -> bool {
    !path.is_empty()
        && path
            .split('/')
            .all(|segment| !matches!(segment, "" | "." | ".."))
}

/// Phase 2 alone: `haproxy -c` in a scratch directory, once per distinct
/// environment, serialized process-wide. Returns HAProxy's warnings on success.
///
/// # Errors
///
/// A [`Rejection`] in [`ValidationPhase::Haproxy`]: HAProxy's errors for the first
/// environment it rejects, or a tool failure.
pub async fn validate_phase2(
    rendered: &RenderedConfig,
    config: &Config,
) -> Result<Vec<Diagnostic>, Rejection> {
    let tool_failure = |message: String| Rejection {
        phase: ValidationPhase::Haproxy,
        errors: vec![Diagnostic::error(message)],
        tool_failure: true,
    };
    let scratch = {
        let rendered = rendered.clone();
        let root = config.scratch_root.clone();
        tokio::task::spawn_blocking(move || write_scratch(&rendered, root.as_deref()))
            .await
            .map_err(|e| tool_failure(format!("writing the scratch directory failed: {e}")))?
            .map_err(|e| tool_failure(format!("cannot write the scratch directory: {e}")))?
    };
    // Parsed only when an alert without a location needs placing.
    let mut model: Option<haproxy_config::Config> = None;
    let empty = BTreeMap::new();
    let envs: BTreeSet<&BTreeMap<String, String>> = config.envs.iter().collect();
    let envs: Vec<&BTreeMap<String, String>> = if envs.is_empty() {
        vec![&empty]
    } else {
        envs.into_iter().collect()
    };
    let annotate = envs.len() > 1;
    let mut warnings: Vec<Diagnostic> = Vec::new();
    for env in envs {
        let run = run_haproxy(config, scratch.path(), env).await;
        let scratch_text = scratch.path().to_string_lossy();
        let (run, alerts) = match run {
            Ok(run) => {
                let alerts = alerts::parse_stderr(&run.stderr, &scratch_text);
                (run, alerts)
            }
            Err(failure) => return Err(tool_failure(failure.to_string())),
        };
        let suffix = if annotate {
            env_note(env)
        } else {
            String::new()
        };
        let mut errors = Vec::new();
        for alert in alerts {
            let mut diagnostic = match alert.severity {
                Severity::Error => Diagnostic::error(format!("{}{suffix}", alert.message)),
                Severity::Warning => Diagnostic::warning(format!("{}{suffix}", alert.message)),
            };
            diagnostic.location = match alert.location {
                Some((file, line)) => Some(SourceLocation::new(file, Some(line), None)),
                None => {
                    let model = model
                        .get_or_insert_with(|| haproxy_config::parse_lenient(rendered.main()).0);
                    locate_proxy_message(&alert.message, model)
                }
            };
            let diagnostic = attribute(diagnostic, rendered);
            match alert.severity {
                Severity::Error => errors.push(diagnostic),
                Severity::Warning => {
                    if !warnings.contains(&diagnostic) {
                        warnings.push(diagnostic);
                    }
                }
            }
        }
        match run.status {
            RunStatus::Exited(0) => {}
            status => {
                if errors.is_empty() {
                    let detail = last_lines(&run.stdout, &run.stderr);
                    errors.push(Diagnostic::error(format!(
                        "haproxy -c {status}{suffix}{detail}"
                    )));
                }
                return Err(Rejection {
                    phase: ValidationPhase::Haproxy,
                    errors,
                    tool_failure: matches!(status, RunStatus::Signalled),
                });
            }
        }
    }
    scratch
        .close()
        .map_err(|e| tool_failure(format!("cannot remove the scratch directory: {e}")))?;
    Ok(warnings)
}

/// ` (with HTTP_PORT=8080)`.
fn env_note(env: &BTreeMap<String, String>) -> String {
    if env.is_empty() {
        return " (with no instance environment)".to_owned();
    }
    // Values read from files are secrets: the process-wide redaction set knows them.
    let redactor = hapwright_eventbus::redact::global();
    let pairs: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{k}={}", redactor.redact(v)))
        .collect();
    format!(" (with {})", pairs.join(", "))
}

/// `: <what haproxy said>` for a failure without `[ALERT]` lines: its stdout
/// verdict (`… will not start (no listener) => exit(2).`), else the last lines of
/// stderr.
fn last_lines(stdout: &str, stderr: &str) -> String {
    let verdict: Vec<&str> = stdout
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "Warnings were found.")
        .collect();
    let lines = if verdict.is_empty() {
        stderr
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("[NOTICE]"))
            .collect()
    } else {
        verdict
    };
    let tail = &lines[lines.len().saturating_sub(3)..];
    if tail.is_empty() {
        String::new()
    } else {
        format!(": {}", tail.join(" / "))
    }
}

/// How a `haproxy -c` run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunStatus {
    Exited(i32),
    Signalled,
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunStatus::Exited(code) => write!(f, "exited with code {code}"),
            RunStatus::Signalled => f.write_str("was killed by a signal"),
        }
    }
}

struct Run {
    status: RunStatus,
    stdout: String,
    stderr: String,
}

/// Why `haproxy -c` gave no verdict: a tool failure.
#[derive(Debug, thiserror::Error)]
enum RunError {
    /// The binary did not start.
    #[error("{}", crate::config::spawn_error(binary, error))]
    Spawn {
        /// `haproxy.binary`.
        binary: PathBuf,
        /// Why it did not start.
        error: std::io::Error,
    },
    /// Its output could not be read.
    #[error("reading the output of {} -c failed: {error}", binary.display())]
    Read {
        /// `haproxy.binary`.
        binary: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// It ran past the timeout and was killed.
    #[error("{} -c did not finish within {timeout:?} and was killed", binary.display())]
    TimedOut {
        /// `haproxy.binary`.
        binary: PathBuf,
        /// The timeout.
        timeout: Duration,
    },
}

/// Runs `binary -c -f haproxy.cfg` in `dir` with `env` added, under the process-wide
/// lock and the timeout. `Err` is a tool failure.
async fn run_haproxy(
    config: &Config,
    dir: &Path,
    env: &BTreeMap<String, String>,
) -> Result<Run, RunError> {
    let _serialized = PHASE2_LOCK.lock().await;
    let binary = config.binary.clone();
    let mut child = tokio::process::Command::new(&config.binary)
        .args(["-c", "-f", MAIN_FILE])
        .current_dir(dir)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|error| RunError::Spawn {
            binary: binary.clone(),
            error,
        })?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let outcome = tokio::time::timeout(config.timeout, async {
        tokio::try_join!(read_all(stdout), read_all(stderr), child.wait())
    })
    .await;
    match outcome {
        Ok(Ok((stdout, stderr, status))) => Ok(Run {
            status: status
                .code()
                .map_or(RunStatus::Signalled, RunStatus::Exited),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        }),
        Ok(Err(e)) => {
            let _ = child.kill().await;
            Err(RunError::Read { binary, error: e })
        }
        Err(_) => {
            // Kill and reap before the scratch directory goes away.
            let _ = child.kill().await;
            Err(RunError::TimedOut {
                binary,
                timeout: config.timeout,
            })
        }
    }
}

/// Reads a pipe to its end, keeping at most [`MAX_OUTPUT`] bytes.
async fn read_all<R: tokio::io::AsyncRead + Unpin>(pipe: Option<R>) -> std::io::Result<Vec<u8>> {
    let mut buffer = Vec::new();
    if let Some(pipe) = pipe {
        let mut limited = pipe.take(MAX_OUTPUT);
        limited.read_to_end(&mut buffer).await?;
        // Drain the rest so the child never blocks on a full pipe.
        tokio::io::copy(&mut limited.into_inner(), &mut tokio::io::sink()).await?;
    }
    Ok(buffer)
}

/// Places a location-less message that names a proxy (`Proxy 'fe': unable to find
/// required use_backend: 'x'.`) on the `use_backend`/`default_backend` line it is
/// about, or else on the proxy's header line.
fn locate_proxy_message(message: &str, model: &haproxy_config::Config) -> Option<SourceLocation> {
    static PROXY: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"(?i)\b(?:proxy|frontend|backend|listen) '([^']+)'")
            .expect("constant regex is valid")
    });
    static TARGET: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"required (use_backend|default_backend): '([^']*)'")
            .expect("constant regex is valid")
    });
    let name = PROXY.captures(message)?.get(1)?.as_str();
    let section = [
        SectionKind::Frontend,
        SectionKind::Listen,
        SectionKind::Backend,
    ]
    .into_iter()
    .find_map(|kind| model.section(kind, name))?;
    let mut line = section.line;
    if let Some(captures) = TARGET.captures(message)
        && let (Some(keyword), Some(target)) = (captures.get(1), captures.get(2))
    {
        let candidates: Vec<&haproxy_config::Directive> =
            section.directives_named(keyword.as_str()).collect();
        let exact = candidates
            .iter()
            .find(|d| d.args.first().map(String::as_str) == Some(target.as_str()));
        if let Some(directive) = exact {
            line = directive.line;
        } else if let [only] = candidates.as_slice() {
            line = only.line;
        }
    }
    Some(SourceLocation::new(MAIN_FILE, Some(line), None))
}

/// A warning of the baseline, for a render that passed by equivalence with lines
/// moved: its location and the `haproxy.cfg:N` it names in its text are moved with
/// their directives ([`equivalence::moved_line`]). `None` when it was about a
/// section the render no longer has.
fn moved_warning(
    mut warning: Diagnostic,
    old: &haproxy_config::Config,
    new: &haproxy_config::Config,
) -> Option<Diagnostic> {
    static NAMED: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"\bhaproxy\.cfg:(\d+)").expect("constant regex is valid")
    });
    if let Some(location) = &mut warning.location
        && location.file == MAIN_FILE
        && let Some(line) = location.line
    {
        location.line = Some(equivalence::moved_line(old, new, line)?);
        location.column = None;
    }
    if NAMED.is_match(&warning.message) {
        let mut gone = false;
        let message = NAMED.replace_all(
            &warning.message,
            |found: &regex::Captures<'_>| match found[1]
                .parse()
                .ok()
                .map(|line| equivalence::moved_line(old, new, line))
            {
                Some(Some(line)) => format!("{MAIN_FILE}:{line}"),
                Some(None) => {
                    gone = true;
                    found[0].to_owned()
                }
                None => found[0].to_owned(),
            },
        );
        if gone {
            return None;
        }
        warning.message = message.into_owned();
    }
    Some(warning)
}

/// Adds the rendered line and the template origin to a diagnostic located in a
/// rendered file.
fn attribute(mut diagnostic: Diagnostic, rendered: &RenderedConfig) -> Diagnostic {
    let Some(location) = &diagnostic.location else {
        return diagnostic;
    };
    let Some(line) = location.line else {
        return diagnostic;
    };
    if diagnostic.source_line.is_none()
        && let Some((file, content)) = rendered
            .iter()
            .find(|(file, _)| file.relative_path() == location.file)
        && let Some(index) = usize::try_from(line).ok().and_then(|l| l.checked_sub(1))
        && let Some(text) = content.split('\n').nth(index)
    {
        // Certificate files and PEM blocks hold private keys: their lines are never
        // copied into an error (which reaches logs, events and the status page).
        diagnostic.source_line = Some(
            if file.kind == FileKind::Certificate || inside_pem_block(content, index) {
                "[certificate or key material not shown]".to_owned()
            } else {
                text.trim().to_owned()
            },
        );
    }
    if let Some(origin) = rendered.source_map().origin_by_path(&location.file, line) {
        diagnostic.origin = Some(SourceLocation::new(
            origin.template.to_string(),
            Some(origin.line),
            None,
        ));
    }
    diagnostic
}

/// Whether line `index` (0-based) of `content` lies inside a PEM block
/// (`-----BEGIN …-----` to `-----END …-----`, both included).
fn inside_pem_block(content: &str, index: usize) -> bool {
    let mut inside = false;
    for (at, line) in content.split('\n').enumerate() {
        let line = line.trim();
        let begins = line.starts_with("-----BEGIN ");
        let ends = line.starts_with("-----END ");
        if at == index {
            return inside || begins || ends;
        }
        if begins {
            inside = true;
        } else if ends {
            inside = false;
        }
    }
    false
}

// === the validation service ===

/// The one validation service of a validator config: both phases, with phase 2
/// satisfied by structural [`equivalence`] with the last render that passed
/// `haproxy -c` here, the baseline this service alone owns.
///
/// The [`Validator`] component, the quarantine's search and the admission webhook
/// all validate through a service, so the decision is written once. The component
/// and the quarantine share one (clones share the baseline: either one's pass lets
/// the other skip phase 2 by equivalence); the webhook has one of its own, because
/// reviews are candidates, not what runs.
#[derive(Clone)]
pub struct Service {
    inner: Arc<ServiceInner>,
}

struct ServiceInner {
    config: Config,
    /// The last render that passed `haproxy -c`, with the warnings it printed.
    baseline: std::sync::Mutex<Option<(Baseline, Vec<Diagnostic>)>>,
    /// The background `haproxy -c` of a render that passed by equivalence far from
    /// the baseline ([`REFRESH_AFTER`]), while it runs.
    refresh: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The last render that passed phase 1, with its model: phase 1 parses only the
    /// sections the next render changed.
    parsed: std::sync::Mutex<Option<Parsed>>,
}

/// A render that passed phase 1, and phase 1's model of its `haproxy.cfg`.
type Parsed = (Arc<RenderedConfig>, Arc<haproxy_config::Config>);

impl fmt::Debug for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Service")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// What a passed validation found.
#[derive(Clone, Debug)]
pub struct Validated {
    /// Warnings of both phases (phase 2's from the baseline when it was skipped).
    pub warnings: Vec<Diagnostic>,
    /// Why phase 2 passed by equivalence instead of `haproxy -c`, when it did.
    pub phase2_skipped: Option<SkipReason>,
    /// Phase 1's model of `haproxy.cfg`.
    pub model: Arc<haproxy_config::Config>,
}

impl Service {
    /// A service validating with `config`, without a baseline yet.
    pub fn new(config: Config) -> Self {
        Self {
            inner: Arc::new(ServiceInner {
                config,
                baseline: std::sync::Mutex::new(None),
                refresh: std::sync::Mutex::new(None),
                parsed: std::sync::Mutex::new(None),
            }),
        }
    }

    /// The validator settings.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The last render that passed `haproxy -c` here.
    pub fn baseline(&self) -> Option<Baseline> {
        self.lock().as_ref().map(|(baseline, _)| baseline.clone())
    }

    /// The last render that passed phase 1 here, with its model.
    fn last_parsed(&self) -> Option<Parsed> {
        self.inner
            .parsed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Baseline, Vec<Diagnostic>)>> {
        self.inner
            .baseline
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Checks `rendered`, which passed by equivalence with `differences` from
    /// `from`, with `haproxy -c` in a task of its own; when it passes and `from` is
    /// still the baseline, it becomes the baseline. One such run at a time, and a
    /// validation that needs `haproxy -c` itself stops it (only one `haproxy -c`
    /// runs at a time in the process). When HAProxy refuses a render the rule
    /// passed, that is logged as an error and the baseline stays.
    fn refresh(
        &self,
        rendered: &Arc<RenderedConfig>,
        model: &Arc<haproxy_config::Config>,
        from: &Baseline,
        differences: usize,
        metrics: Option<&Metrics>,
    ) {
        let mut running = self
            .inner
            .refresh
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if running.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let service = self.clone();
        let (rendered, model, from) = (
            Arc::clone(rendered),
            Arc::clone(model),
            Arc::clone(&from.rendered),
        );
        let metrics = metrics.cloned();
        let span = tracing::info_span!(
            "refresh_baseline",
            hash = %rendered.hash().short(),
            baseline = %from.hash().short(),
            differences
        );
        *running = Some(tokio::spawn(
            async move {
                tracing::debug!("Checking a render far from the baseline with haproxy -c");
                let started = Instant::now();
                let outcome = validate_phase2(&rendered, &service.inner.config).await;
                let result = match outcome {
                    Ok(warnings) => {
                        let mut baseline = service.lock();
                        if baseline
                            .as_ref()
                            .is_some_and(|(current, _)| Arc::ptr_eq(&current.rendered, &from))
                        {
                            *baseline = Some((Baseline { rendered, model }, warnings));
                            tracing::info!(
                                elapsed_ms = started.elapsed().as_millis(),
                                "A render that passed by equivalence passed haproxy -c: it is the baseline now"
                            );
                        }
                        "refreshed"
                    }
                    Err(rejection) if rejection.tool_failure => {
                        tracing::warn!(%rejection, "Could not check the render with haproxy -c; the baseline stays");
                        "failed"
                    }
                    Err(rejection) => {
                        tracing::error!(
                            %rejection,
                            "haproxy -c refuses a render that passed phase 2 by equivalence; the baseline stays"
                        );
                        "refused"
                    }
                };
                if let Some(metrics) = &metrics {
                    metrics.refreshes.with_label_values(&[result]).inc();
                }
            }
            .instrument(span),
        ));
    }

    /// Stops the background `haproxy -c` of [`Self::refresh`], if one runs.
    fn cancel_refresh(&self) {
        if let Some(task) = self
            .inner
            .refresh
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }

    /// Waits until the background `haproxy -c` of a render far from the baseline,
    /// if one runs, has ended (and, when it passed, made that render the baseline).
    pub async fn refreshed(&self) {
        let task = self
            .inner
            .refresh
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// Both phases, with phase 2 satisfied by equivalence when the rule allows it;
    /// counted in `metrics` when given (the component's renders, not the
    /// quarantine's probes or the webhook's reviews). A render that passes
    /// `haproxy -c` becomes the baseline.
    ///
    /// When the render is unlikely to pass by equivalence
    /// ([`equivalence::likely_equivalent`] is false, or there is no baseline),
    /// `haproxy -c` starts at once in a task of its own and runs alongside phase 1,
    /// on the other core: a new backend or map then waits for the longer of the two
    /// phases, not for their sum. A phase 1 rejection stops that run (the child is
    /// killed, the scratch directory removed) and is the answer, as before.
    ///
    /// # Errors
    ///
    /// A [`Rejection`] naming the phase and every error.
    pub async fn validate(
        &self,
        rendered: &Arc<RenderedConfig>,
        metrics: Option<&Metrics>,
    ) -> Result<Validated, Rejection> {
        let config = &self.inner.config;
        // The baseline the rule compares with, when the rule applies.
        let baseline = self.lock().clone().filter(|_| config.equivalence);
        // `method`: `haproxy` when `haproxy -c` ran, `equivalence` when the rule
        // passed it without running HAProxy.
        let phase2_span = tracing::info_span!(
            "validate_phase2",
            method = tracing::field::Empty,
            early = tracing::field::Empty
        );
        let early = baseline
            .as_ref()
            .is_none_or(|(baseline, _)| !equivalence::likely_equivalent(baseline, rendered))
            .then(|| {
                phase2_span.record("early", true);
                self.cancel_refresh();
                let (rendered, config, metrics) =
                    (Arc::clone(rendered), config.clone(), metrics.cloned());
                tokio::spawn(
                    async move {
                        let started = Instant::now();
                        let phase2 = validate_phase2(&rendered, &config).await;
                        if let Some(metrics) = metrics {
                            metrics.observe(
                                ValidationPhase::Haproxy,
                                phase2.is_ok(),
                                started.elapsed(),
                            );
                        }
                        phase2
                    }
                    .instrument(phase2_span.clone()),
                )
            });
        // Stops the early run if this validation ends (or is dropped) without it.
        let early = early.map(tokio_util::task::AbortOnDropHandle::new);

        let started = Instant::now();
        // Off the async workers, so that the early run is spawned meanwhile (a task
        // spawned from a busy worker waits for that worker).
        let phase1 = {
            let (rendered, span) = (Arc::clone(rendered), tracing::info_span!("validate_phase1"));
            let previous = self.last_parsed();
            tokio::task::spawn_blocking(move || {
                span.in_scope(|| {
                    let previous = previous.as_ref().map(|(r, m)| (r.as_ref(), m.as_ref()));
                    validate_phase1_reusing(previous, &rendered)
                })
            })
            .await
            .map_err(|join| Rejection {
                phase: ValidationPhase::Parse,
                errors: vec![Diagnostic::error(format!("phase 1 crashed: {join}"))],
                tool_failure: true,
            })?
        };
        if let Some(metrics) = metrics {
            metrics.observe(ValidationPhase::Parse, phase1.is_ok(), started.elapsed());
        }
        let (mut warnings, model) = phase1?;
        let model = Arc::new(model);
        *self
            .inner
            .parsed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((Arc::clone(rendered), Arc::clone(&model)));
        if let Some((baseline, baseline_warnings)) = &baseline {
            match equivalence::compare_counted(baseline, rendered, &model) {
                (Equivalence::Equivalent(reason), differences) => {
                    drop(early);
                    if differences > REFRESH_AFTER {
                        self.refresh(rendered, &model, baseline, differences, metrics);
                    }
                    phase2_span.record("method", "equivalence");
                    let _entered = phase2_span.enter();
                    if let Some(metrics) = metrics {
                        metrics
                            .phase2_skipped
                            .with_label_values(&[reason.as_str()])
                            .inc();
                    }
                    tracing::info!(
                        reason = reason.as_str(),
                        baseline = %baseline.rendered.hash().short(),
                        "Phase 2 passed by structural equivalence, haproxy -c not run"
                    );
                    // (Compared only when there are warnings to move.)
                    let moved = !baseline_warnings.is_empty()
                        && !same_text(baseline.rendered.main(), rendered.main());
                    warnings.extend(baseline_warnings.iter().cloned().filter_map(|warning| {
                        let mut warning = if moved {
                            moved_warning(warning, &baseline.model, &model)?
                        } else {
                            warning
                        };
                        warning.source_line = None;
                        warning.origin = None;
                        Some(attribute(warning, rendered))
                    }));
                    return Ok(Validated {
                        warnings,
                        phase2_skipped: Some(reason),
                        model,
                    });
                }
                (Equivalence::Different(why), _) => {
                    tracing::debug!(%why, "Not equivalent to the last render that passed haproxy -c");
                }
            }
        }
        phase2_span.record("method", "haproxy");
        let phase2 = match early {
            Some(early) => match early.await {
                Ok(phase2) => phase2,
                Err(join) => Err(Rejection {
                    phase: ValidationPhase::Haproxy,
                    errors: vec![Diagnostic::error(format!("haproxy -c crashed: {join}"))],
                    tool_failure: true,
                }),
            },
            None => {
                self.cancel_refresh();
                let started = Instant::now();
                let phase2 = validate_phase2(rendered, config)
                    .instrument(phase2_span)
                    .await;
                if let Some(metrics) = metrics {
                    metrics.observe(ValidationPhase::Haproxy, phase2.is_ok(), started.elapsed());
                }
                phase2
            }
        };
        let phase2_warnings = phase2?;
        *self.lock() = Some((
            Baseline {
                rendered: Arc::clone(rendered),
                model: Arc::clone(&model),
            },
            phase2_warnings.clone(),
        ));
        warnings.extend(phase2_warnings);
        Ok(Validated {
            warnings,
            phase2_skipped: None,
            model,
        })
    }
}

// === impl Validator ===

/// The validator component: validates every `TemplateRendered` through its
/// [`Service`] and replies with `ValidationCompleted` or `ValidationFailed` (same
/// correlation id).
pub struct Validator {
    service: Service,
    metrics: Metrics,
    /// The answer for the last render validated (tool failures excepted), so that
    /// the same render again is answered without validating it again.
    last: Option<(ContentHash, Answer)>,
}

/// A validation's answer, as remembered for the same render.
#[derive(Clone)]
enum Answer {
    Valid {
        warnings: Vec<Diagnostic>,
        model: Arc<haproxy_config::Config>,
        phase2_skipped: Option<&'static str>,
    },
    Invalid {
        phase: ValidationPhase,
        errors: Vec<Diagnostic>,
    },
}

impl fmt::Debug for Validator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Validator")
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl Validator {
    /// The component's name and capability.
    pub const NAME: &'static str = "validator";

    /// A validator with its settings (in a service of its own) and the process's
    /// metrics.
    pub fn new(config: Config, metrics: Metrics) -> Self {
        Self::with_service(Service::new(config), metrics)
    }

    /// A validator validating through `service` (shared with the quarantine's
    /// search, so each one's pass is the other's baseline).
    pub fn with_service(service: Service, metrics: Metrics) -> Self {
        Self {
            service,
            metrics,
            last: None,
        }
    }

    /// Validates one `TemplateRendered` (or answers it from memory when it is the
    /// render validated last) and replies.
    async fn handle(&mut self, publisher: &Publisher, health: &HealthReporter, event: &Event) {
        let EventPayload::TemplateRendered(rendered) = &event.payload else {
            return;
        };
        let config = Arc::clone(&rendered.config);
        if let Some((_, answer)) = self
            .last
            .as_ref()
            .filter(|(hash, _)| *hash == config.hash())
        {
            self.metrics.remembered.inc();
            tracing::info!(
                hash = %config.hash().short(),
                "Render unchanged; answered from its last validation"
            );
            health.healthy();
            reply(publisher, event, config, Duration::ZERO, answer.clone());
            return;
        }
        let started = Instant::now();
        let outcome = self.service.validate(&config, Some(&self.metrics)).await;
        let duration = started.elapsed();
        let answer = match outcome {
            Ok(Validated {
                warnings,
                phase2_skipped,
                model,
            }) => {
                health.healthy();
                let skipped = phase2_skipped.map(SkipReason::as_str);
                tracing::info!(
                    duration_ms = duration.as_millis() as u64,
                    warnings = warnings.len(),
                    phase2 = skipped.map_or("haproxy -c", |_| "equivalent"),
                    "Configuration is valid"
                );
                for warning in &warnings {
                    tracing::warn!(warning = %warning, "HAProxy warning");
                }
                Answer::Valid {
                    warnings,
                    model,
                    phase2_skipped: skipped,
                }
            }
            Err(rejection) => {
                if rejection.tool_failure {
                    let reason = rejection
                        .errors
                        .first()
                        .map_or_else(|| "haproxy -c failed".to_owned(), ToString::to_string);
                    health.unhealthy(reason);
                } else {
                    health.healthy();
                }
                tracing::warn!(
                    phase = phase_label(rejection.phase),
                    errors = rejection.errors.len(),
                    first = %rejection.errors.first().map(ToString::to_string).unwrap_or_default(),
                    "Configuration rejected"
                );
                let answer = Answer::Invalid {
                    phase: rejection.phase,
                    errors: rejection.errors,
                };
                if rejection.tool_failure {
                    // The next try may find the tool working: not remembered.
                    self.last = None;
                    reply(publisher, event, config, duration, answer);
                    return;
                }
                answer
            }
        };
        self.last = Some((config.hash(), answer.clone()));
        reply(publisher, event, config, duration, answer);
    }
}

/// Publishes `answer` for `config` as the reply to `event`.
fn reply(
    publisher: &Publisher,
    event: &Event,
    config: Arc<RenderedConfig>,
    duration: Duration,
    answer: Answer,
) {
    match answer {
        Answer::Valid {
            warnings,
            model,
            phase2_skipped,
        } => {
            publisher.reply(
                event,
                ValidationCompleted {
                    config,
                    duration,
                    warnings,
                    model,
                    phase2_skipped,
                },
            );
        }
        Answer::Invalid { phase, errors } => {
            publisher.reply(
                event,
                ValidationFailed {
                    hash: config.hash(),
                    phase,
                    errors,
                },
            );
        }
    }
}

/// The hash of a `TemplateRendered`.
fn rendered_hash(event: &Event) -> Option<ContentHash> {
    match &event.payload {
        EventPayload::TemplateRendered(rendered) => Some(rendered.config.hash()),
        _ => None,
    }
}

#[async_trait::async_trait]
impl Component for Validator {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([EventKind::TemplateRendered])
    }

    async fn run(mut self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        // Scratch directories of a controller that was killed before it could
        // remove them.
        let root = self.service.config().scratch_root.clone();
        match tokio::task::spawn_blocking(move || sweep_scratch(root.as_deref())).await {
            Ok(Ok(removed)) if !removed.is_empty() => {
                tracing::info!(
                    count = removed.len(),
                    "Removed stale validation scratch directories"
                );
            }
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "Cannot sweep stale validation scratch directories");
            }
            Err(error) => {
                tracing::warn!(%error, "Sweeping stale validation scratch directories failed");
            }
        }
        ctx.health().healthy();
        let (publisher, health) = (ctx.publisher().clone(), ctx.health().clone());
        let superseded = self.metrics.superseded.clone();
        // Renders that arrived while one with the same hash was validated: answered
        // from memory once it is done.
        let mut waiting: std::collections::VecDeque<Arc<Event>> = Default::default();
        loop {
            let event = match waiting.pop_front() {
                Some(event) => event,
                None => match ctx.next_event().await {
                    Some(event) => event,
                    None => return Ok(()),
                },
            };
            let span = tracing::info_span!(
                "validation",
                correlation_id = event.correlation_id.map(tracing::field::display),
                event_id = %event.id,
            );
            let hash = rendered_hash(&event);
            // Dropping the validation (a newer render, or the component stopping)
            // kills the haproxy child and removes the scratch directory.
            let validation = self.handle(&publisher, &health, &event).instrument(span);
            tokio::pin!(validation);
            loop {
                tokio::select! {
                    biased;
                    () = &mut validation => break,
                    newer = ctx.next_event() => {
                        let Some(newer) = newer else { return Ok(()) };
                        if rendered_hash(&newer) == hash {
                            // The same render again: the answer is on its way.
                            waiting.push_back(newer);
                            continue;
                        }
                        // Latest wins: the validation of a superseded render stops.
                        superseded.inc();
                        tracing::info!(
                            superseded = %hash.map(|h| h.short()).unwrap_or_default(),
                            correlation_id = newer.correlation_id.map(tracing::field::display),
                            "A newer render arrived; the validation in progress stops"
                        );
                        waiting.clear();
                        waiting.push_back(newer);
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moved_warning_names_the_new_lines() {
        let old = haproxy_config::parse(
            "frontend f\n    bind :80\n    use_backend b\n\nbackend b from p\n    server s 10.0.0.1:80\n",
        )
        .unwrap();
        let new = haproxy_config::parse("# added\n\nfrontend f\n    bind :80\n    use_backend b\n")
            .unwrap();
        let mut warning =
            Diagnostic::warning("rule at haproxy.cfg:3 shadows [haproxy.cfg:2]; xhaproxy.cfg:3");
        warning.location = Some(SourceLocation::new(MAIN_FILE, Some(3), Some(5)));
        let moved = moved_warning(warning, &old, &new).unwrap();
        let location = moved.location.unwrap();
        assert_eq!((location.line, location.column), (Some(5), None));
        assert_eq!(
            moved.message,
            "rule at haproxy.cfg:5 shadows [haproxy.cfg:4]; xhaproxy.cfg:3"
        );
        // About the removed backend: dropped, whether by location or by text.
        let mut gone = Diagnostic::warning("server s has no check");
        gone.location = Some(SourceLocation::new(MAIN_FILE, Some(6), None));
        assert!(moved_warning(gone, &old, &new).is_none());
        let named = Diagnostic::warning("backend b at haproxy.cfg:5 is unused");
        assert!(moved_warning(named, &old, &new).is_none());
        // Another file's lines stay.
        let mut other = Diagnostic::warning("line 3 of maps/hosts.map");
        other.location = Some(SourceLocation::new("maps/hosts.map", Some(3), None));
        let kept = moved_warning(other, &old, &new).unwrap();
        assert_eq!(kept.location.unwrap().line, Some(3));
    }

    #[test]
    fn validation_failures_exist_at_zero_from_the_start() {
        let registry = Registry::new();
        Metrics::register(&registry).unwrap();
        let failures: Vec<String> = registry
            .gather()
            .into_iter()
            .filter(|family| family.name() == "hapwright_validations_total")
            .flat_map(|family| family.get_metric().to_vec())
            .filter(|metric| {
                metric
                    .get_label()
                    .iter()
                    .any(|p| p.name() == "result" && p.value() == "failure")
            })
            .map(|metric| {
                assert_eq!(metric.get_counter().get_value(), 0.0);
                metric
                    .get_label()
                    .iter()
                    .find(|p| p.name() == "phase")
                    .map(|p| p.value().to_owned())
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(failures, ["haproxy", "parse"]);
    }

    #[test]
    fn plain_relative_paths() {
        assert!(is_plain_relative("maps/hosts.map"));
        assert!(is_plain_relative("haproxy.cfg"));
        assert!(!is_plain_relative("maps/../../etc/passwd"));
        assert!(!is_plain_relative("/etc/passwd"));
        assert!(!is_plain_relative("maps/./x"));
        assert!(!is_plain_relative(""));
    }

    #[test]
    fn env_notes_and_tails() {
        let env: BTreeMap<String, String> = [("A".to_owned(), "1".to_owned())].into();
        assert_eq!(env_note(&env), " (with A=1)");
        assert_eq!(
            env_note(&BTreeMap::new()),
            " (with no instance environment)"
        );
        assert_eq!(last_lines("", "[NOTICE] x\na\n\nb\nc\nd"), ": b / c / d");
        assert_eq!(
            last_lines("Warnings were found.\nwill not start\n", "[WARNING] x"),
            ": will not start"
        );
        assert_eq!(last_lines("", ""), "");
    }

    #[test]
    fn key_material_is_never_copied_into_an_error() {
        let key =
            "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0B\n-----END PRIVATE KEY-----\n";
        let rendered = RenderedConfig::builder("global\n")
            .certificate("site.pem", format!("garbage\n{key}"))
            .map("keys.map", format!("a b\n{key}"))
            .build();
        let at = |file: &str, line: u32| {
            let mut diagnostic = Diagnostic::error("bad line");
            diagnostic.location = Some(SourceLocation::new(file, Some(line), None));
            attribute(diagnostic, &rendered).source_line.unwrap()
        };
        for (file, line) in [
            ("certs/site.pem", 1),
            ("certs/site.pem", 3),
            ("maps/keys.map", 3),
        ] {
            assert_eq!(
                at(file, line),
                "[certificate or key material not shown]",
                "{file}:{line}"
            );
        }
        assert_eq!(at("maps/keys.map", 1), "a b");
    }

    #[test]
    fn proxy_messages_find_their_line() {
        let model = haproxy_config::parse(
            "frontend fe\n    bind :80\n    use_backend be_x if { path /x }\n    default_backend \"${BE}\"\nbackend other\n",
        )
        .unwrap();
        let line = |message: &str| locate_proxy_message(message, &model).and_then(|l| l.line);
        assert_eq!(
            line("Proxy 'fe': unable to find required use_backend: 'be_x'."),
            Some(3)
        );
        assert_eq!(
            line("Proxy 'fe': unable to find required default_backend: 'nope'."),
            Some(4)
        );
        assert_eq!(
            line("'http-request' rules ignored for proxy 'fe' as they require HTTP mode."),
            Some(1)
        );
        assert_eq!(line("backend 'other' has no server available!"), Some(5));
        assert_eq!(line("proxy 'ghost' is missing"), None);
        assert_eq!(line("no proxy named"), None);
    }
}
