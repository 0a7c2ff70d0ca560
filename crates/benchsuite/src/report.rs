//! Writes `docs/benchmarks.md` from the suite's results, keeping the hand-written
//! analysis between [`ANALYSIS_BEGIN`] and [`ANALYSIS_END`] of the previous report.
//! The analysis quotes current figures only between figure markers, which each run
//! fills in ([`fill_figures`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::criterion::Estimate;
use crate::scenarios::{Churn, Memory, QUARANTINE_CHANGES, Quarantine, Settings, SizeResult};

/// Opens the hand-written analysis that regenerations keep.
pub const ANALYSIS_BEGIN: &str = "<!-- analysis:begin (hand-written, kept by scripts/bench.sh) -->";
/// Closes it.
pub const ANALYSIS_END: &str = "<!-- analysis:end -->";
/// Opens a figure in the analysis: `<!-- figure:target ROW -->` for the measured value
/// of the Targets row named ROW, `<!-- figure:criterion ID -->` for the median of a
/// criterion benchmark. The text up to [`FIGURE_END`] is replaced on every run.
const FIGURE_BEGIN: &str = "<!-- figure:";
/// Closes a figure.
const FIGURE_END: &str = "<!-- /figure -->";

/// `hapwright bench --output json` and one of its scales, as the command writes them.
pub use hapwright_app::bench::{BenchReport, ScaleReport};

/// The machine the suite ran on.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Machine {
    /// `nproc`.
    pub cpus: usize,
    /// CPU model name.
    pub cpu_model: String,
    /// Total memory, bytes.
    pub memory_bytes: u64,
    /// Kernel release.
    pub kernel: String,
    /// First line of `haproxy -vv`.
    pub haproxy: String,
    /// Load average when the suite started.
    pub load_average: String,
    /// UTC time of the run.
    pub date: String,
}

/// Why a part of the run has no figures; the report prints the message where the
/// figures would be (and serializes it as that text). Not retried: the suite records
/// the failure and goes on with the next scenario.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScenarioError {
    /// The scenario did not run (churn runs only with the 1,000-backend controller).
    #[error("not run")]
    NotRun,
    /// The scenario failed: the first line of the harness's panic message.
    #[error("{0}")]
    Failed(String),
    /// Churn runs on the 1,000-backend controller, which failed.
    #[error("the 1,000-backend controller failed: {0}")]
    ControllerFailed(Box<ScenarioError>),
    /// `hapwright bench` could not be started.
    #[error("cannot run {path}: {reason}")]
    BenchNotStarted {
        /// The binary.
        path: String,
        /// The operating system's message.
        reason: String,
    },
    /// `hapwright bench` exited with an error.
    #[error("`hapwright bench` exited with {status}: {stderr}")]
    BenchFailed {
        /// Its exit status.
        status: String,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// `hapwright bench` printed something that is not its JSON report.
    #[error("`hapwright bench` printed no report: {reason}")]
    BenchReportUnreadable {
        /// The JSON parser's message.
        reason: String,
    },
}

impl Serialize for ScenarioError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Everything one run measured; a missing part is `Err(why)`.
#[derive(Clone, Debug, Serialize)]
pub struct Results {
    /// `--quick` was given.
    pub quick: bool,
    /// Where it ran.
    pub machine: Machine,
    /// (a) `hapwright bench` on the routing config.
    pub bench: Result<BenchReport, ScenarioError>,
    /// The controller settings the latency targets are relative to.
    pub settings: Option<Settings>,
    /// (b) per size.
    pub latency: Vec<Result<SizeResult, ScenarioError>>,
    /// (c) the burst: changes to as many different Services within a second.
    pub burst: Result<Churn, ScenarioError>,
    /// (c) the churn.
    pub churn: Result<Churn, ScenarioError>,
    /// (g) one bad object among many changes.
    pub quarantine: Result<Quarantine, ScenarioError>,
    /// (d).
    pub memory: Result<Memory, ScenarioError>,
    /// (h) route propagation.
    pub propagation: Result<crate::scale::PropagationResults, ScenarioError>,
    /// (i) certificates at scale, per size.
    pub certificates: Vec<Result<crate::certs::CertPropagation, ScenarioError>>,
    /// (e) and (f): criterion ids → estimates.
    pub criterion: BTreeMap<String, Estimate>,
    /// The commands the script ran, in order.
    pub commands: Vec<String>,
}

/// The quarantine's target: the good changes live within 4 validations.
pub const QUARANTINE_TARGET_VALIDATIONS: f64 = 4.0;

/// (g): one bad object among many changes.
fn quarantine_section(
    result: &Result<Quarantine, ScenarioError>,
    summary: &mut Vec<[String; 3]>,
) -> String {
    let mut section = String::new();
    let _ = writeln!(
        section,
        "## (g) One bad object among many changes
"
    );
    let _ = writeln!(
        section,
        "The controller of (b) at 1,000 backends. One write to one file changes the \
         endpoints of {QUARANTINE_CHANGES} Services; one of them gets an address HAProxy \
         refuses. Measured from the write until the good changes answer through \
         HAProxy (the first of them; one deployment applies them all, and every other \
         one is then checked): the culprit search finds the bad object, the rest \
         deploys. For \
         comparison the same write with every change good, and one validation at this \
         size (phase 1 and one `haproxy -c`, from the reload path of (b)).\n"
    );
    match result {
        Ok(q) => {
            let target = q.validation_ms * QUARANTINE_TARGET_VALIDATIONS;
            let v = verdict(q.live_ms, target, "ms");
            let _ = writeln!(
                section,
                "| backends | changes | good changes live | all good | one validation | search validations | quarantined | bad object kept its last good state | target | verdict |\n|---:|---:|---:|---:|---:|---:|---:|---|---|---|"
            );
            let _ = writeln!(
                section,
                "| {} | {} | {} ms | {} ms | {} ms | {} | {} | {} | ≤ 4 validations = {} ms | {v} |\n",
                q.backends,
                q.changes,
                fmt_num(q.live_ms),
                fmt_num(q.all_good_ms),
                fmt_num(q.validation_ms),
                q.probes,
                q.quarantined,
                if q.bad_kept_last_good { "yes" } else { "no" },
                fmt_num(target),
            );
            summary.push([
                format!(
                    "1 bad object among {} changes, {} backends: good changes live",
                    q.changes, q.backends
                ),
                format!("≤ 4 validations ({} ms)", fmt_num(target)),
                format!("{} ms — {v}", fmt_num(q.live_ms)),
            ]);
        }
        Err(why) => {
            let _ = writeln!(section, "Not measured: {why}\n");
        }
    }
    section
}

/// The runtime path's latency target (p50): 40 ms up to 1,000 backends, 80 ms at more.
pub fn runtime_target_ms(backends: usize) -> f64 {
    if backends <= 1000 { 40.0 } else { 80.0 }
}

/// The reload path's latency target (p50): HAProxy's own reload, one `haproxy -c` (the
/// mean run of the same changes) and 30 ms.
pub fn reload_target_ms(size: &SizeResult) -> f64 {
    size.haproxy_reload_ms + size.reload_stages.phase2_run_ms + 30.0
}

/// How a measurement compares with its target (lower is better).
pub fn verdict(measured: f64, target: f64, unit: &str) -> String {
    if !measured.is_finite() || !target.is_finite() || target <= 0.0 {
        return "–".to_owned();
    }
    if measured <= target {
        format!("✓ met ({:.0} % of the target)", measured / target * 100.0)
    } else {
        format!(
            "✗ **missed** by {}{}{unit} ({:.2}× the target)",
            fmt_num(measured - target),
            if unit == "×" { "" } else { " " },
            measured / target
        )
    }
}

/// A target: whole numbers without decimals.
pub fn fmt_target(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        fmt_num(value)
    }
}

/// A number with a sensible number of digits.
pub fn fmt_num(value: f64) -> String {
    let abs = value.abs();
    if abs >= 100.0 {
        format!("{value:.0}")
    } else if abs >= 10.0 {
        format!("{value:.1}")
    } else if abs >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    }
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

/// The analysis block of a previous report, markers included, or a fresh one.
pub fn preserved_analysis(previous: Option<&str>, fallback: &str) -> String {
    if let Some(text) = previous
        && let Some(start) = text.find(ANALYSIS_BEGIN)
        && let Some(end) = text[start..].find(ANALYSIS_END)
    {
        return text[start..start + end + ANALYSIS_END.len()].to_owned();
    }
    format!("{ANALYSIS_BEGIN}\n{}\n{ANALYSIS_END}", fallback.trim_end())
}

/// The analysis with each figure's value replaced by this run's (see [`FIGURE_BEGIN`]);
/// a figure the run did not produce reads "not measured". `targets` are the rows of the
/// Targets table. Text after a marker that is not closed is left as it is.
pub fn fill_figures(
    analysis: &str,
    targets: &[[String; 3]],
    criterion: &BTreeMap<String, Estimate>,
) -> String {
    let mut out = String::with_capacity(analysis.len());
    let mut rest = analysis;
    while let Some(begin) = rest.find(FIGURE_BEGIN) {
        let after = &rest[begin + FIGURE_BEGIN.len()..];
        let (Some(key_end), Some(end)) = (after.find(" -->"), after.find(FIGURE_END)) else {
            break;
        };
        if key_end > end {
            break;
        }
        let key = after[..key_end].trim();
        let value = match key.split_once(' ') {
            Some(("target", row)) => {
                targets
                    .iter()
                    .find(|[what, ..]| what == row)
                    .map(|[_, _, measured]| {
                        measured.split(" — ").next().unwrap_or(measured).to_owned()
                    })
            }
            Some(("criterion", id)) => {
                estimate_ms(criterion, id).map(|v| format!("{} ms", fmt_num(v)))
            }
            _ => None,
        };
        out.push_str(&rest[..begin + FIGURE_BEGIN.len() + key_end + " -->".len()]);
        out.push_str(value.as_deref().unwrap_or("not measured"));
        out.push_str(FIGURE_END);
        rest = &after[end + FIGURE_END.len()..];
    }
    out.push_str(rest);
    out
}

fn estimate_ms(criterion: &BTreeMap<String, Estimate>, id: &str) -> Option<f64> {
    criterion.get(id).map(Estimate::median_ms)
}

fn ms_cell(value: Option<f64>) -> String {
    value.map_or_else(|| "not run".to_owned(), |v| format!("{} ms", fmt_num(v)))
}

/// The whole report.
pub fn markdown(results: &Results, analysis: &str) -> String {
    let mut out = String::new();
    let m = &results.machine;
    let _ = writeln!(out, "# Benchmarks\n");
    let _ = writeln!(
        out,
        "Generated by `scripts/bench.sh{}` on {} (`hapwright-benchsuite`, \
         `crates/benchsuite/`). Everything outside the **Analysis** section is rewritten \
         on each run; the Analysis section between the `analysis` markers is written by \
         hand and kept. {}\n",
        if results.quick { " --quick" } else { "" },
        m.date,
        if results.quick {
            "**This was a `--quick` smoke run: few samples, short criterion runs; the \
             numbers show that the suite works, not how fast hapwright is.**"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "![render time vs scale, and end-to-end latency](benchmarks.png)\n"
    );

    // --- machine ---
    let _ = writeln!(out, "## Machine\n");
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(out, "| CPUs (`nproc`) | {} |", m.cpus);
    let _ = writeln!(out, "| CPU model | {} |", m.cpu_model);
    let _ = writeln!(out, "| memory | {} |", mib(m.memory_bytes as f64));
    let _ = writeln!(out, "| kernel | {} |", m.kernel);
    let _ = writeln!(out, "| HAProxy (`haproxy -vv`) | {} |", m.haproxy);
    let _ = writeln!(out, "| load average at start | {} |\n", m.load_average);

    // --- summary ---
    let mut summary: Vec<[String; 3]> = Vec::new();

    // --- (a) ---
    let mut section = String::new();
    let _ = writeln!(
        section,
        "## (a) Render and validation at scale (`hapwright bench`)\n"
    );
    let _ = writeln!(
        section,
        "The realistic routing example (`crates/reconciler/testdata/routing/`, the same \
         templates as the renderer's criterion bench, written into a config file by the \
         suite) with N Services, each with an EndpointSlice of three endpoints and an \
         Ingress routing a host and `/api` through the maps, plus one TLS Secret. Each \
         scale runs in its own process; render is the median of several renders after a \
         warm-up render; phase 2 is a real `haproxy -c` on the rendered files; peak RSS \
         is that process's `VmHWM`.\n"
    );
    match &results.bench {
        Ok(bench) => {
            let _ = writeln!(
                section,
                "| scale (Services) | objects | compile | render | per Service | phase 1 | phase 2 (`haproxy -c`) | peak RSS |\n|---:|---:|---:|---:|---:|---:|---:|---:|"
            );
            for s in &bench.scales {
                let _ = writeln!(
                    section,
                    "| {} | {} | {} ms | {} ms | {:.1} µs | {} ms | {} ms | {} |",
                    s.scale,
                    s.objects,
                    fmt_num(s.compile_ms),
                    fmt_num(s.render_ms),
                    s.render_ms * 1000.0 / s.scale as f64,
                    fmt_num(s.phase1_ms),
                    fmt_num(s.phase2_ms),
                    mib(s.peak_rss_bytes as f64)
                );
            }
            if let Some(s) = bench.scales.iter().find(|s| s.scale == 10_000) {
                summary.push([
                    "full render 10,000 Services (`hapwright bench`)".to_owned(),
                    "≤ 40 ms".to_owned(),
                    format!(
                        "{} ms — {}",
                        fmt_num(s.render_ms),
                        verdict(s.render_ms, 40.0, "ms")
                    ),
                ]);
                if s.phase2_ms > 0.0 {
                    let ratio = s.render_ms / s.phase2_ms;
                    summary.push([
                        "full render vs `haproxy -c` on the same files, 10,000 Services".to_owned(),
                        "≤ 0.15×".to_owned(),
                        format!("{ratio:.2}× — {}", verdict(ratio, 0.15, "×")),
                    ]);
                }
                let peak = s.peak_rss_bytes as f64 / 1_048_576.0;
                summary.push([
                    "peak RSS of a full render, 10,000 Services (`hapwright bench`)".to_owned(),
                    "≤ 100 MiB".to_owned(),
                    format!(
                        "{} — {}",
                        mib(s.peak_rss_bytes as f64),
                        verdict(peak, 100.0, "MiB")
                    ),
                ]);
            }
            let _ = writeln!(section);
        }
        Err(why) => {
            let _ = writeln!(section, "Not measured: {why}\n");
        }
    }
    let section_a = section;

    // --- (b) ---
    let mut section = String::new();
    let _ = writeln!(section, "## (b) End-to-end latency with real HAProxy\n");
    let _ = writeln!(
        section,
        "`hapwright run` on a copy of `examples/quickstart/` (its managed HAProxy, the \
         `files` source) with N Services, each with one endpoint. Latency is measured \
         from the moment the resource file is written (atomically, by rename) to the \
         first HTTP answer through HAProxy that comes from the new backend (requests \
         sent back to back on new connections). **Runtime path**: `web`'s endpoint \
         moves to the other demo app (`set server addr`, no reload). **Reload path**: a \
         new Service with its host (a new backend and map entry: one reload). Changes \
         are spaced so each starts from a deployed state outside the minimum-interval \
         windows, after a quiet period, so the debouncer's leading edge takes each \
         change at once (bursts are measured in (c)). Controller settings: {}. \
         HAProxy's own reload time is the master CLI `reload` until `show proc` reports \
         the new reload count, timed once after each reload-path change on the same \
         config, polled as the controller polls, under the same requests (back to back, for a \
         host with no route): \
         interleaved, so both see the same state of the machine; the median.\n",
        results.settings.map_or_else(
            || "unknown".to_owned(),
            |s| format!(
                "debounce {} ms (leading edge on, the default), minDeploymentInterval {} ms, \
                 minReloadInterval {} ms",
                s.debounce_ms, s.min_deployment_interval_ms, s.min_reload_interval_ms
            )
        )
    );
    let _ = writeln!(
        section,
        "| backends | path | changes | p50 | p95 | max | target (p50) | verdict |\n|---:|---|---:|---:|---:|---:|---|---|"
    );
    let mut notes = String::new();
    let mut breakdown = String::new();
    let mut words = String::new();
    for size in &results.latency {
        match size {
            Ok(r) => {
                let runtime_target = runtime_target_ms(r.runtime.backends);
                let reload_target = reload_target_ms(r);
                for (lat, target, target_text) in [
                    (
                        &r.runtime,
                        runtime_target,
                        format!("≤ {} ms", fmt_num(runtime_target)),
                    ),
                    (
                        &r.reload,
                        reload_target,
                        format!(
                            "≤ HAProxy reload ({} ms) + `haproxy -c` ({} ms) + 30 ms = {} ms",
                            fmt_num(r.haproxy_reload_ms),
                            fmt_num(r.reload_stages.phase2_run_ms),
                            fmt_num(reload_target)
                        ),
                    ),
                ] {
                    let p50 = lat.quantile(0.5);
                    let max = lat.samples_ms.iter().copied().fold(0.0, f64::max);
                    let v = verdict(p50, target, "ms");
                    let _ = writeln!(
                        section,
                        "| {} | {} | {} | {} ms | {} ms | {} ms | {} | {} |",
                        lat.backends,
                        lat.path,
                        lat.samples_ms.len(),
                        fmt_num(p50),
                        fmt_num(lat.quantile(0.95)),
                        fmt_num(max),
                        target_text,
                        v
                    );
                    summary.push([
                        format!("{} path latency p50, {} backends", lat.path, lat.backends),
                        target_text,
                        format!("{} ms — {v}", fmt_num(p50)),
                    ]);
                }
                let _ = writeln!(
                    notes,
                    "- {} backends: HAProxy's own reload {} ms; reloads counted during the \
                     runtime-path changes: {} (expected 0).",
                    r.runtime.backends,
                    fmt_num(r.haproxy_reload_ms),
                    r.reloads_during_runtime
                );
                for (lat, stages) in [
                    (&r.runtime, &r.runtime_stages),
                    (&r.reload, &r.reload_stages),
                ] {
                    let rest = lat.mean() - stages.total();
                    let _ = writeln!(
                        breakdown,
                        "| {} | {} | {} ms | {} ms | {} ms | {} / {} | {} ms | {} ms | {} ms |",
                        lat.backends,
                        lat.path,
                        fmt_num(stages.render_ms),
                        fmt_num(stages.phase1_ms),
                        fmt_num(stages.phase2_ms),
                        stages.phase2_runs,
                        stages.phase2_skipped,
                        fmt_num(stages.deploy_ms),
                        fmt_num(rest),
                        fmt_num(lat.mean()),
                    );
                    let _ = writeln!(
                        words,
                        "- {} backends, {} path: of the mean {} ms per change, hapwright's \
                         stages take {} ms (render {} ms, phase 1 {} ms, phase 2 {} ms with \
                         `haproxy -c` run {} times and skipped by equivalence {} times over \
                         {} changes, deploy {} ms{}); the other {} ms are the files \
                         source's notification and scan, event hand-offs and the test \
                         client's request loop.",
                        lat.backends,
                        lat.path,
                        fmt_num(lat.mean()),
                        fmt_num(stages.total()),
                        fmt_num(stages.render_ms),
                        fmt_num(stages.phase1_ms),
                        fmt_num(stages.phase2_ms),
                        stages.phase2_runs,
                        stages.phase2_skipped,
                        lat.samples_ms.len(),
                        fmt_num(stages.deploy_ms),
                        if lat.path == "reload" {
                            ", which includes waiting for HAProxy's reload"
                        } else {
                            ""
                        },
                        fmt_num(rest),
                    );
                }
            }
            Err(why) => {
                let _ = writeln!(notes, "- Not measured: {why}");
            }
        }
    }
    let _ = writeln!(section, "\n{notes}");
    if !breakdown.is_empty() {
        let _ = writeln!(
            section,
            "Where the time goes (means per change from the controller's own histograms \
             over the same changes: `hapwright_render_duration_seconds`, \
             `hapwright_validation_duration_seconds{{phase}}`, \
             `hapwright_deployment_duration_seconds`, divided by the number of changes, so \
             a stage that did not run for a change counts 0 for it; \
             `hapwright_validation_phase2_skipped_total` counts the renders that passed \
             phase 2 by equivalence; the rest is the mean latency minus the stages: the \
             files source's notification and scan, event hand-offs, scheduling, the \
             request loop and, on a busy machine, waiting for a CPU; the reload path's \
             deploy includes HAProxy's reload; a `haproxy -c` that started alongside \
             phase 1 (docs/validation.md) overlaps it, and a render superseded by a \
             newer one counts too, so the stages can add up to more than the latency \
             and the rest can be negative):\n"
        );
        let _ = writeln!(
            section,
            "| backends | path | render | phase 1 | phase 2 (`haproxy -c`) | runs / skipped | deploy | rest | mean latency |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|"
        );
        let _ = writeln!(section, "{breakdown}");
        let _ = writeln!(
            section,
            "In words (generated from the table above):\n\n{words}"
        );
    }
    let section_b = section;

    // --- (c) ---
    let mut section = String::new();
    let _ = writeln!(section, "## (c) Bursts and reloads under endpoint churn\n");
    match &results.burst {
        Ok(b) => {
            let _ = writeln!(
                section,
                "**Burst**: {} endpoint changes to {} different Services (each in a file of \
                 its own, each endpoint moving to the other web demo app) written within \
                 {:.2} s into a controller serving {} backends; deployments \
                 (`hapwright_deployments_total{{result=\"success\"}}`) and reloads read \
                 from `/metrics` before and after.\n",
                b.changes, b.services, b.seconds, b.backends
            );
            let _ = writeln!(
                section,
                "| changes | Services | seconds | deployments | reloads | final routes correct | settled after the last write | target | verdict |\n|---:|---:|---:|---:|---:|---|---:|---|---|"
            );
            let met = b.deployments <= 3.0 && b.reloads == 0.0 && b.final_state_correct;
            let v = if met {
                "✓ met".to_owned()
            } else {
                format!(
                    "✗ **missed**: {} deployments, {} reloads, routes {}",
                    b.deployments,
                    b.reloads,
                    if b.final_state_correct {
                        "correct"
                    } else {
                        "wrong"
                    }
                )
            };
            let _ = writeln!(
                section,
                "| {} | {} | {:.2} | {} | {} | {} | {} ms | ≤ 3 deployments, 0 reloads, routes correct | {v} |\n",
                b.changes,
                b.services,
                b.seconds,
                b.deployments,
                b.reloads,
                if b.final_state_correct {
                    "yes"
                } else {
                    "**no**"
                },
                fmt_num(b.settle_ms)
            );
            summary.push([
                format!("burst of {} endpoint changes within 1 s", b.changes),
                "≤ 3 deployments, 0 reloads".to_owned(),
                format!("{} deployments, {} reloads — {v}", b.deployments, b.reloads),
            ]);
        }
        Err(why) => {
            let _ = writeln!(section, "Burst not measured: {why}\n");
        }
    }
    match &results.churn {
        Ok(c) => {
            let _ = writeln!(
                section,
                "**Churn**: {} endpoint changes written over {:.1} s (round-robin over {} \
                 Services in files of their own, each flipping its endpoint's port) into a \
                 controller serving {} backends; `hapwright_reloads_total` read from \
                 `/metrics` before and after.\n",
                c.changes, c.seconds, c.services, c.backends
            );
            let _ = writeln!(
                section,
                "| changes | seconds | reloads | runtime deployments | final routes correct | settled after the last write | target | verdict |\n|---:|---:|---:|---:|---|---:|---|---|"
            );
            let v = if c.reloads == 0.0 {
                "✓ met".to_owned()
            } else {
                format!("✗ **missed** by {} reloads", c.reloads)
            };
            let _ = writeln!(
                section,
                "| {} | {:.1} | {} | {} | {} | {} ms | 0 reloads | {v} |\n",
                c.changes,
                c.seconds,
                c.reloads,
                c.runtime_deployments,
                if c.final_state_correct {
                    "yes"
                } else {
                    "**no**"
                },
                fmt_num(c.settle_ms)
            );
            summary.push([
                format!("reloads under churn ({} changes)", c.changes),
                "0".to_owned(),
                format!("{} — {v}", c.reloads),
            ]);
        }
        Err(why) => {
            let _ = writeln!(section, "Not measured: {why}\n");
        }
    }
    let section_c = section;

    // --- (d) ---
    let mut section = String::new();
    let _ = writeln!(section, "## (d) Controller memory\n");
    match &results.memory {
        Ok(mem) => {
            let _ = writeln!(
                section,
                "`hapwright run` watching {} objects ({} Services and as many \
                 EndpointSlices) through the `files` source, read from \
                 `/proc/<pid>/status` once the first deployment finished ({:.1} s after \
                 the start).\n",
                mem.objects,
                mem.objects / 2,
                mem.startup_s
            );
            let v = verdict(mem.rss_bytes as f64 / 1048576.0, 50.0, "MiB");
            let _ = writeln!(
                section,
                "| objects | RSS (`VmRSS`) | peak (`VmHWM`) | `process_resident_memory_bytes` | target | verdict |\n|---:|---:|---:|---:|---|---|"
            );
            let _ = writeln!(
                section,
                "| {} | {} | {} | {} | ≤ 50 MiB | {v} |\n",
                mem.objects,
                mib(mem.rss_bytes as f64),
                mib(mem.peak_rss_bytes as f64),
                mib(mem.metric_rss_bytes),
            );
            summary.push([
                format!("controller RSS, {} objects", mem.objects),
                "≤ 50 MiB".to_owned(),
                format!("{} — {v}", mib(mem.rss_bytes as f64)),
            ]);
        }
        Err(why) => {
            let _ = writeln!(section, "Not measured: {why}\n");
        }
    }
    let section_d = section;

    // --- (g) ---
    let section_g = quarantine_section(&results.quarantine, &mut summary);

    // --- (e) ---
    let c = &results.criterion;
    let mut section = String::new();
    let _ = writeln!(section, "## (e) Validation versus bare `haproxy -c`\n");
    let _ = writeln!(
        section,
        "`cargo bench -p hapwright-deployer --bench validate`: configs with N backends of \
         3 servers and an N-entry map. `bare` is `haproxy -c -f haproxy.cfg` in a \
         directory that already holds the files; `hapwright` is `validator::validate` \
         (phase 1, a fresh scratch directory, `haproxy -c`, cleanup); `equivalence check` \
         is the structural comparison that replaces phase 2 when one server of the last \
         backend moves (an endpoint change); `overhead` runs \
         interleaved pairs and times only the difference, so both sides see the same \
         load. The ratio is (bare + overhead) / bare.\n"
    );
    let _ = writeln!(
        section,
        "| backends | bare `haproxy -c` | hapwright `validate` | overhead (pairs) | phase 1 | equivalence check | ratio | target | verdict |\n|---:|---:|---:|---:|---:|---:|---:|---|---|"
    );
    for n in [100, 1000, 10_000] {
        let bare = estimate_ms(c, &format!("validate/haproxy_c/{n}"));
        let own = estimate_ms(c, &format!("validate/hapwright/{n}"));
        let overhead = estimate_ms(c, &format!("validate/overhead/{n}"));
        let phase1 = estimate_ms(c, &format!("validate/phase1/{n}"));
        let equivalence = estimate_ms(c, &format!("validate/equivalence/{n}"));
        let ratio = match (bare, overhead) {
            (Some(b), Some(o)) if b > 0.0 => Some((b + o) / b),
            _ => None,
        };
        let v = ratio.map_or_else(|| "–".to_owned(), |r| verdict(r, 1.2, "×"));
        let _ = writeln!(
            section,
            "| {n} | {} | {} | {} | {} | {} | {} | ≤ 1.2× | {v} |",
            ms_cell(bare),
            ms_cell(own),
            ms_cell(overhead),
            ms_cell(phase1),
            ms_cell(equivalence),
            ratio.map_or_else(|| "–".to_owned(), |r| format!("{r:.2}×")),
        );
        if let Some(r) = ratio {
            summary.push([
                format!("validation vs bare `haproxy -c`, {n} backends"),
                "≤ 1.2×".to_owned(),
                format!("{r:.2}× — {v}"),
            ]);
        }
    }
    if let Ok(bench) = &results.bench {
        let _ = writeln!(
            section,
            "\nPhase 2 inside `hapwright bench` (section a) on the routing example, for \
             comparison: {}.",
            bench
                .scales
                .iter()
                .map(|s| format!("{} ms at {}", fmt_num(s.phase2_ms), s.scale))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(section);
    let section_e = section;

    // --- (f) ---
    let section_f = criterion_sections(c, &mut summary);

    // --- (h), (i) ---
    let section_h = crate::scale::propagation_section(&results.propagation, &mut summary);
    let section_i = crate::scale::certificates_section(&results.certificates, &mut summary);

    // --- assemble ---
    let _ = writeln!(out, "## Targets\n");
    let _ = writeln!(out, "| what | target | measured |\n|---|---|---|");
    for [what, target, measured] in &summary {
        let _ = writeln!(out, "| {what} | {target} | {measured} |");
    }
    let _ = writeln!(out);
    for section in [
        section_a, section_b, section_c, section_d, section_e, section_f, section_g, section_h,
        section_i,
    ] {
        out.push_str(&section);
    }
    let _ = writeln!(out, "## Commands\n");
    let _ = writeln!(
        out,
        "Everything above comes from `scripts/bench.sh{}`, which ran, in order:\n",
        if results.quick { " --quick" } else { "" }
    );
    let _ = writeln!(out, "```sh");
    for command in &results.commands {
        let _ = writeln!(out, "{command}");
    }
    let _ = writeln!(out, "```\n");
    out.push_str(&fill_figures(analysis, &summary, c));
    out.push('\n');
    out
}

fn criterion_sections(c: &BTreeMap<String, Estimate>, summary: &mut Vec<[String; 3]>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## (f) Criterion benchmarks\n");
    let _ = writeln!(
        s,
        "Medians of criterion's estimates (`target/criterion/<id>/new/estimates.json`), \
         with the median's 95 % confidence interval.\n"
    );

    // Event bus.
    let _ = writeln!(
        s,
        "### Event bus\n\n`cargo bench -p hapwright-eventbus --bench bus`: 20,000 events per iteration from one publisher, channel capacity 1024, two Tokio workers.\n"
    );
    let _ = writeln!(
        s,
        "| subscribers | hapwright bus | bare `async-broadcast` | ratio | target | verdict |\n|---:|---:|---:|---:|---|---|"
    );
    for n in [1, 8] {
        let bus = estimate_ms(c, &format!("bus_throughput/hapwright_bus/{n}"));
        let bare = estimate_ms(c, &format!("bus_throughput/bare_async_broadcast/{n}"));
        let ratio = bus.zip(bare).map(|(a, b)| a / b);
        let v = ratio.map_or_else(|| "–".to_owned(), |r| verdict(r, 1.5, "×"));
        let _ = writeln!(
            s,
            "| {n} | {} | {} | {} | ≤ 1.5× | {v} |",
            ms_cell(bus),
            ms_cell(bare),
            ratio.map_or_else(|| "–".to_owned(), |r| format!("{r:.2}×"))
        );
        if let Some(r) = ratio {
            summary.push([
                format!("event bus vs bare channel, {n} subscriber(s)"),
                "≤ 1.5×".to_owned(),
                format!("{r:.2}× — {v}"),
            ]);
        }
    }
    let _ = writeln!(s);

    // Files source.
    let _ = writeln!(
        s,
        "### Files source\n\n`cargo bench -p hapwright-watchers --bench files`: 1,000 files of 10 Service manifests (10,000 objects).\n"
    );
    let _ = writeln!(
        s,
        "| benchmark | median | target | verdict |\n|---|---:|---|---|"
    );
    for (id, what, target) in [
        (
            "initial_sync/10k_objects_1k_files",
            "initial sync of 10,000 objects",
            1000.0,
        ),
        (
            "change_latency/write_to_event",
            "file write → `ResourceIndexUpdated`",
            50.0,
        ),
    ] {
        let v = estimate_ms(c, id);
        let verdict_text = v.map_or_else(|| "–".to_owned(), |v| verdict(v, target, "ms"));
        let _ = writeln!(
            s,
            "| {what} (`{id}`) | {} | ≤ {} ms | {verdict_text} |",
            ms_cell(v),
            fmt_target(target)
        );
        if let Some(v) = v {
            summary.push([
                what.to_owned(),
                format!("≤ {} ms", fmt_target(target)),
                format!("{} ms — {verdict_text}", fmt_num(v)),
            ]);
        }
    }
    let _ = writeln!(s);

    // Renderer.
    let _ = writeln!(
        s,
        "### Renderer\n\n`cargo bench -p hapwright-reconciler --bench render`: the routing example, resources already converted, lookup indexes built.\n"
    );
    let _ = writeln!(
        s,
        "| services | render | per service | target | verdict |\n|---:|---:|---:|---|---|"
    );
    for (n, target) in [
        (10, None),
        (100, None),
        (1000, Some(5.0)),
        (10_000, Some(40.0)),
    ] {
        let v = estimate_ms(c, &format!("render/{n}"));
        let verdict_text = match (v, target) {
            (Some(v), Some(t)) => verdict(v, t, "ms"),
            _ => "".to_owned(),
        };
        let _ = writeln!(
            s,
            "| {n} | {} | {} | {} | {verdict_text} |",
            ms_cell(v),
            v.map_or_else(
                || "–".to_owned(),
                |v| format!("{:.1} µs", v * 1000.0 / n as f64)
            ),
            target.map_or_else(String::new, |t| format!("≤ {} ms", fmt_target(t)))
        );
        if let (Some(v), Some(t)) = (v, target) {
            summary.push([
                format!("render {n} services (criterion)"),
                format!("≤ {} ms", fmt_target(t)),
                format!("{} ms — {verdict_text}", fmt_num(v)),
            ]);
        }
    }
    let one = estimate_ms(c, "render_one_change/10000");
    let one_v = one.map_or_else(|| "–".to_owned(), |v| verdict(v, 5.0, "ms"));
    let _ = writeln!(
        s,
        "\nAfter one endpoint slice changed, at 10,000 services (`render_one_change/10000`, \
         incremental: only the output that read the changed slice renders again): {} — \
         target ≤ 5 ms, {one_v}.",
        one.map_or_else(
            || "not measured".to_owned(),
            |v| format!("{} ms", fmt_num(v))
        )
    );
    let _ = writeln!(
        s,
        "\nAfter a new service with its endpoint slice and ingress, at 10,000 services \
         (`render_new_service/10000`, what the reload path renders: `haproxy.cfg`'s \
         loop over the services is put together item by item, rendering the new \
         backend; the maps, whose loops over the ingresses are written inline, \
         run again): {}.",
        estimate_ms(c, "render_new_service/10000").map_or_else(
            || "not measured".to_owned(),
            |v| format!("{} ms", fmt_num(v))
        )
    );
    if let Some(v) = one {
        summary.push([
            "render after a one-object change, 10,000 Services (criterion)".to_owned(),
            "≤ 5 ms".to_owned(),
            format!("{} ms — {one_v}", fmt_num(v)),
        ]);
    }
    let _ = writeln!(
        s,
        "\n| converting all snapshots from scratch (start-up only) | median |\n|---:|---:|"
    );
    for n in [1000, 10_000] {
        let _ = writeln!(
            s,
            "| {n} services | {} |",
            ms_cell(estimate_ms(c, &format!("convert_snapshots/{n}")))
        );
    }
    let _ = writeln!(s);

    // Deployment plan and runtime deploy.
    let _ = writeln!(
        s,
        "### Deployment plan\n\n`cargo bench -p hapwright-deployer --bench plan`: 10,000 backends × 3 servers and a 10,000-entry map, one server address changed.\n"
    );
    let _ = writeln!(
        s,
        "| benchmark | median | target | verdict |\n|---|---:|---|---|"
    );
    let plan = estimate_ms(c, "plan_10000_backends/plan_parsed");
    let plan_v = plan.map_or_else(|| "–".to_owned(), |v| verdict(v, 20.0, "ms"));
    let _ = writeln!(
        s,
        "| plan, both configs parsed (`plan_10000_backends/plan_parsed`) | {} | ≤ 20 ms | {plan_v} |",
        ms_cell(plan)
    );
    let _ = writeln!(
        s,
        "| parsing the desired 1.3 MB config and planning (`parse_desired_and_plan`) | {} | | |\n",
        ms_cell(estimate_ms(c, "plan_10000_backends/parse_desired_and_plan"))
    );
    if let Some(v) = plan {
        summary.push([
            "change plan, 10,000 backends".to_owned(),
            "≤ 20 ms".to_owned(),
            format!("{} ms — {plan_v}", fmt_num(v)),
        ]);
    }
    let _ = writeln!(
        s,
        "### Runtime deploy\n\n`cargo bench -p hapwright-deployer --bench deploy`: one server change end to end against HAProxy through the master CLI (plan, `set server addr`, files rewritten with fsync).\n"
    );
    let deploy = estimate_ms(c, "runtime_deploy_one_server_change");
    let deploy_v = deploy.map_or_else(|| "–".to_owned(), |v| verdict(v, 5.0, "ms"));
    let _ = writeln!(
        s,
        "| benchmark | median | target | verdict |\n|---|---:|---|---|\n| `runtime_deploy_one_server_change` | {} | ≤ 5 ms | {deploy_v} |\n",
        ms_cell(deploy)
    );
    if let Some(v) = deploy {
        summary.push([
            "runtime deploy of one server change".to_owned(),
            "≤ 5 ms".to_owned(),
            format!("{} ms — {deploy_v}", fmt_num(v)),
        ]);
    }

    // Validation: see (e).
    let _ = writeln!(
        s,
        "### Validation\n\nThe `validate` bench's results are in section (e).\n"
    );

    // Fleet.
    let _ = writeln!(
        s,
        "### Fleet\n\n`cargo bench -p hapwright-deployer --bench fleet` (run when `crates/deployer/benches/fleet.rs` exists).\n"
    );
    let fleet: Vec<(&String, &Estimate)> = c
        .iter()
        .filter(|(id, _)| id.split('/').next().is_some_and(|g| g.contains("fleet")))
        .collect();
    if fleet.is_empty() {
        let _ = writeln!(
            s,
            "Not run: no `fleet` results under `target/criterion/`.\n"
        );
    } else {
        let _ = writeln!(
            s,
            "One runtime change (a server weight) deployed to a fleet in parallel. Target: \
             the largest fleet takes at most 3× one instance. `fleet_runtime_latency`: time \
             until every healthy instance of 10 took the change, all healthy and with one \
             instance hanging (it accepts on its master socket and never answers). Target: \
             ≤ 1.2× the all-healthy median.\n"
        );
        let _ = writeln!(s, "| benchmark | median | 95 % interval |\n|---|---:|---|");
        for (id, e) in &fleet {
            let _ = writeln!(
                s,
                "| `{id}` | {} ms | [{}, {}] ms |",
                fmt_num(e.median_ms()),
                fmt_num(e.low_ns / 1e6),
                fmt_num(e.high_ns / 1e6)
            );
        }
        let _ = writeln!(
            s,
            "\n| largest fleet | smallest | ratio | target | verdict |\n|---|---|---:|---|---|"
        );
        // `<group>/<kind>/<instances>`: the largest fleet of each kind against its
        // smallest.
        let mut kinds: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
        for (id, e) in &fleet {
            let parts: Vec<&str> = id.split('/').collect();
            if let [group, kind, count] = parts.as_slice()
                && *group == "fleet_runtime_change"
                && let Ok(count) = count.parse::<u64>()
            {
                kinds
                    .entry((*kind).to_owned())
                    .or_default()
                    .push((count, e.median_ms()));
            }
        }
        for (kind, mut sizes) in kinds {
            sizes.sort_by_key(|(count, _)| *count);
            let (Some(&(one, a)), Some(&(many, b))) = (sizes.first(), sizes.last()) else {
                continue;
            };
            if one == many || a <= 0.0 {
                continue;
            }
            let ratio = b / a;
            let v = verdict(ratio, 3.0, "×");
            let _ = writeln!(
                s,
                "| {many} × {kind}: {} ms | {one}: {} ms | {ratio:.2}× | ≤ 3× | {v} |",
                fmt_num(b),
                fmt_num(a)
            );
            summary.push([
                format!("fleet of {many} vs {one} ({kind})"),
                "≤ 3×".to_owned(),
                format!("{ratio:.2}× — {v}"),
            ]);
        }
        // One hanging instance of 10 must not slow the others' runtime path down.
        let latency = |kind: &str| {
            fleet
                .iter()
                .find(|(id, _)| id.as_str() == format!("fleet_runtime_latency/{kind}/10"))
                .map(|(_, e)| e.median_ms())
        };
        if let (Some(healthy), Some(hanging)) = (latency("all_healthy"), latency("one_hanging"))
            && healthy > 0.0
        {
            let ratio = hanging / healthy;
            let v = verdict(ratio, 1.2, "×");
            let _ = writeln!(
                s,
                "| 9 healthy of 10, one hanging: {} ms | 10 healthy: {} ms | {ratio:.2}× | ≤ 1.2× | {v} |",
                fmt_num(hanging),
                fmt_num(healthy)
            );
            summary.push([
                "runtime change, 1 of 10 instances hanging vs all healthy (p50)".to_owned(),
                "≤ 1.2×".to_owned(),
                format!("{ratio:.2}× — {v}"),
            ]);
        }
        let _ = writeln!(s);
    }

    // Everything.
    let _ = writeln!(
        s,
        "### All criterion results\n\n<details><summary>{} benchmarks</summary>\n",
        c.len()
    );
    let _ = writeln!(
        s,
        "| id | median | 95 % interval | mean |\n|---|---:|---|---:|"
    );
    for (id, e) in c {
        let _ = writeln!(
            s,
            "| `{id}` | {} ms | [{}, {}] ms | {} ms |",
            fmt_num(e.median_ms()),
            fmt_num(e.low_ns / 1e6),
            fmt_num(e.high_ns / 1e6),
            fmt_num(e.mean_ns / 1e6)
        );
    }
    let _ = writeln!(s, "\n</details>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_say_by_how_much() {
        assert!(verdict(40.0, 50.0, "ms").starts_with("✓ met (80 %"));
        let missed = verdict(212.0, 50.0, "ms");
        assert!(missed.contains("missed** by 162 ms"), "{missed}");
        assert!(missed.contains("4.24×"), "{missed}");
    }

    #[test]
    fn analysis_is_kept_between_markers() {
        let previous = format!("# old\n\n{ANALYSIS_BEGIN}\nmy notes\n{ANALYSIS_END}\ntrailing");
        assert_eq!(
            preserved_analysis(Some(&previous), "fresh"),
            format!("{ANALYSIS_BEGIN}\nmy notes\n{ANALYSIS_END}")
        );
        assert_eq!(
            preserved_analysis(Some("no markers"), "fresh\n"),
            format!("{ANALYSIS_BEGIN}\nfresh\n{ANALYSIS_END}")
        );
        assert_eq!(
            preserved_analysis(None, "fresh"),
            format!("{ANALYSIS_BEGIN}\nfresh\n{ANALYSIS_END}")
        );
    }

    #[test]
    fn figures_are_filled_from_the_run() {
        let targets = vec![[
            "controller RSS, 10000 objects".to_owned(),
            "≤ 50 MiB".to_owned(),
            "61.2 MiB — ✗ **missed** by 11.2 MiB (1.22× the target)".to_owned(),
        ]];
        let mut criterion = BTreeMap::new();
        criterion.insert(
            "render/1000".to_owned(),
            Estimate {
                median_ns: 3.5e6,
                low_ns: 3.4e6,
                high_ns: 3.6e6,
                mean_ns: 3.5e6,
            },
        );
        let analysis = "RSS <!-- figure:target controller RSS, 10000 objects -->68.0 MiB<!-- /figure -->, \
             render <!-- figure:criterion render/1000 -->3.58 ms<!-- /figure -->, \
             gone <!-- figure:criterion render/7 -->1 ms<!-- /figure -->, \
             odd <!-- figure:other x -->2<!-- /figure -->.";
        let filled = fill_figures(analysis, &targets, &criterion);
        assert_eq!(
            filled,
            "RSS <!-- figure:target controller RSS, 10000 objects -->61.2 MiB<!-- /figure -->, \
             render <!-- figure:criterion render/1000 -->3.50 ms<!-- /figure -->, \
             gone <!-- figure:criterion render/7 -->not measured<!-- /figure -->, \
             odd <!-- figure:other x -->not measured<!-- /figure -->."
        );
        assert_eq!(fill_figures(&filled, &targets, &criterion), filled);
        for untouched in [
            "no figures",
            "unclosed <!-- figure:criterion render/1000 -->3 ms and more",
            "no key end <!-- figure:criterion render/1000 <!-- /figure --> x",
        ] {
            assert_eq!(fill_figures(untouched, &targets, &criterion), untouched);
        }
    }

    #[test]
    fn the_quarantine_target_is_four_validations() {
        let mut summary = Vec::new();
        let text = quarantine_section(
            &Ok(Quarantine {
                backends: 1000,
                changes: 50,
                live_ms: 500.0,
                all_good_ms: 40.0,
                validation_ms: 100.0,
                probes: 7,
                quarantined: 1,
                bad_kept_last_good: true,
            }),
            &mut summary,
        );
        assert!(
            text.contains(
                "| 1000 | 50 | 500 ms | 40.0 ms | 100 ms | 7 | 1 | yes | ≤ 4 validations = 400 ms |"
            ),
            "{text}"
        );
        assert!(summary[0][2].contains("missed"), "{summary:?}");
    }

    #[test]
    fn report_has_every_section_and_keeps_analysis() {
        let mut criterion = BTreeMap::new();
        let e = Estimate {
            median_ns: 2e6,
            low_ns: 1.9e6,
            high_ns: 2.1e6,
            mean_ns: 2e6,
        };
        criterion.insert(
            "render/10000".to_owned(),
            Estimate {
                median_ns: 212e6,
                ..e
            },
        );
        criterion.insert(
            "validate/haproxy_c/100".to_owned(),
            Estimate {
                median_ns: 30e6,
                ..e
            },
        );
        criterion.insert(
            "validate/overhead/100".to_owned(),
            Estimate {
                median_ns: 3e6,
                ..e
            },
        );
        criterion.insert(
            "fleet_runtime_change/socket/1".to_owned(),
            Estimate {
                median_ns: 1e6,
                ..e
            },
        );
        criterion.insert(
            "fleet_runtime_change/socket/10".to_owned(),
            Estimate {
                median_ns: 4e6,
                ..e
            },
        );
        let results = Results {
            quick: true,
            machine: Machine::default(),
            bench: Ok(BenchReport {
                scales: vec![ScaleReport {
                    scale: 10_000,
                    objects: 30_001,
                    compile_ms: 2.0,
                    render_ms: 60.0,
                    phase1_ms: 20.0,
                    phase2_ms: 200.0,
                    peak_rss_bytes: 100 << 20,
                }],
            }),
            settings: None,
            latency: vec![Err(ScenarioError::Failed("skipped".to_owned()))],
            burst: Err(ScenarioError::NotRun),
            churn: Err(ScenarioError::NotRun),
            quarantine: Err(ScenarioError::NotRun),
            memory: Err(ScenarioError::Failed("skipped".to_owned())),
            propagation: Err(ScenarioError::NotRun),
            certificates: Vec::new(),
            criterion,
            commands: vec!["cargo build --release".to_owned()],
        };
        let analysis = preserved_analysis(None, "## Analysis\n\nkept");
        let text = markdown(&results, &analysis);
        for heading in [
            "## Machine",
            "## Targets",
            "## (a)",
            "## (b)",
            "## (c)",
            "## (d)",
            "## (e)",
            "## (f)",
            "### Event bus",
            "### Files source",
            "### Renderer",
            "### Deployment plan",
            "### Runtime deploy",
            "### Validation",
            "### Fleet",
            "## (g) One bad object among many changes",
            "## Commands",
            "## Analysis",
        ] {
            assert!(text.contains(heading), "missing {heading}");
        }
        assert!(text.contains("missed** by 20.0 ms"), "{text}");
        assert!(text.contains("1.10×"), "{text}");
        assert!(
            text.contains("| 10 × socket: 4.00 ms | 1: 1.00 ms | 4.00× | ≤ 3× | ✗ **missed** by 1.00× (1.33× the target) |"),
            "{text}"
        );
        assert_eq!(preserved_analysis(Some(&text), "other"), analysis);
    }

    #[test]
    fn latency_targets_and_words_come_from_the_same_numbers() {
        use crate::scenarios::{Latency, Stages};
        let stages = Stages {
            render_ms: 1.0,
            phase1_ms: 2.0,
            phase2_ms: 3.0,
            phase2_run_ms: 45.0,
            phase2_runs: 2.0,
            phase2_skipped: 18.0,
            deploy_ms: 4.0,
        };
        let size = SizeResult {
            runtime: Latency {
                backends: 10_000,
                path: "runtime".to_owned(),
                samples_ms: vec![20.0, 30.0],
            },
            reload: Latency {
                backends: 10_000,
                path: "reload".to_owned(),
                samples_ms: vec![200.0, 300.0],
            },
            haproxy_reload_ms: 100.0,
            reloads_during_runtime: 0.0,
            runtime_stages: stages,
            reload_stages: Stages {
                phase2_run_ms: 60.0,
                ..stages
            },
        };
        assert_eq!(runtime_target_ms(1000), 40.0);
        assert_eq!(runtime_target_ms(10_000), 80.0);
        assert_eq!(reload_target_ms(&size), 190.0);
        let burst = Churn {
            backends: 1000,
            changes: 100,
            seconds: 0.99,
            reloads: 0.0,
            runtime_deployments: 2.0,
            deployments: 2.0,
            services: 100,
            final_state_correct: true,
            settle_ms: 210.0,
        };
        let results = Results {
            quick: false,
            machine: Machine::default(),
            bench: Err(ScenarioError::NotRun),
            settings: None,
            latency: vec![Ok(size)],
            burst: Ok(burst),
            churn: Err(ScenarioError::NotRun),
            quarantine: Err(ScenarioError::NotRun),
            memory: Err(ScenarioError::NotRun),
            propagation: Err(ScenarioError::NotRun),
            certificates: Vec::new(),
            criterion: BTreeMap::new(),
            commands: Vec::new(),
        };
        let text = markdown(&results, "");
        // The table row and the sentence quote the same figures.
        assert!(
            text.contains("| 10000 | runtime | 1.00 ms | 2.00 ms | 3.00 ms | 2 / 18 | 4.00 ms | 15.0 ms | 25.0 ms |"),
            "{text}"
        );
        assert!(
            text.contains("10000 backends, runtime path: of the mean 25.0 ms per change, hapwright's stages take 10.0 ms"),
            "{text}"
        );
        assert!(
            text.contains(
                "`haproxy -c` run 2 times and skipped by equivalence 18 times over 2 changes"
            ),
            "{text}"
        );
        assert!(
            text.contains("| reload path latency p50, 10000 backends | ≤ HAProxy reload (100 ms) + `haproxy -c` (60.0 ms) + 30 ms = 190 ms |"),
            "{text}"
        );
        assert!(
            text.contains("| burst of 100 endpoint changes within 1 s | ≤ 3 deployments, 0 reloads | 2 deployments, 0 reloads — ✓ met |"),
            "{text}"
        );
    }
}
