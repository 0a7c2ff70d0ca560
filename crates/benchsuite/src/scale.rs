//! Sections (h) route propagation and (i) certificates at scale: what runs them and
//! how the report shows them. Both also run on their own (`--route-propagation`,
//! `--certificates`), printing the same sections.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::catch;
use crate::certs::{self, CertPropagation};
use crate::report::{ScenarioError, fmt_num, verdict};
use crate::routes::{self, LongLived, Propagation};
use crate::scenarios::Latency;

/// One row group of (h): a size on one HAProxy line, with or without dynamic
/// backends.
#[derive(Clone, Debug, Serialize)]
pub struct PropagationRun {
    /// Routes served.
    pub backends: usize,
    /// The HAProxy line (`3.4`).
    pub line: String,
    /// `haproxy.dynamicBackends`.
    pub dynamic: bool,
    /// What it measured, or why not.
    pub result: Result<Propagation, ScenarioError>,
}

/// Everything (h) measured.
#[derive(Clone, Debug, Serialize)]
pub struct PropagationResults {
    /// Per size, line and mode.
    pub runs: Vec<PropagationRun>,
    /// Streams through an untouched route across route changes (3.4, dynamic).
    pub long_lived: Result<LongLived, ScenarioError>,
}

/// Runs (h): every size on HAProxy 3.4 (`newer`, when given) with and without
/// dynamic backends, and on the `haproxy` on `PATH` without; then the long-lived
/// streams on 3.4. With `dynamic_only`, only the rows with dynamic backends on 3.4.
pub fn propagation(
    sizes: &[usize],
    changes: usize,
    long_lived_changes: usize,
    newer: Option<&Path>,
    dynamic_only: bool,
) -> PropagationResults {
    let mut setups: Vec<(Option<&Path>, bool)> = Vec::new();
    if let Some(binary) = newer {
        setups.push((Some(binary), true));
        if !dynamic_only {
            setups.push((Some(binary), false));
        }
    }
    if !dynamic_only {
        setups.push((None, false));
    }
    let mut runs = Vec::new();
    for &backends in sizes {
        for &(binary, dynamic) in &setups {
            let line = routes::haproxy_line(binary);
            eprintln!(
                "(h) route propagation at {backends} routes, HAProxy {line}, dynamicBackends {dynamic}"
            );
            let result = catch(|| routes::route_propagation(backends, changes, dynamic, binary));
            if let Err(why) = &result {
                eprintln!("    failed: {why}");
            }
            runs.push(PropagationRun {
                backends,
                line,
                dynamic,
                result,
            });
        }
    }
    let long_lived = match newer {
        Some(_) if dynamic_only => Err(ScenarioError::NotRun),
        Some(binary) => {
            eprintln!("(h) long-lived streams across {long_lived_changes} route adds and removals");
            catch(|| routes::long_lived(100, 4, long_lived_changes, Some(binary)))
        }
        None => Err(ScenarioError::NotRun),
    };
    PropagationResults { runs, long_lived }
}

/// The (h) section.
pub fn propagation_section(
    results: &Result<PropagationResults, ScenarioError>,
    summary: &mut Vec<[String; 3]>,
) -> String {
    let mut section = String::new();
    let _ = writeln!(section, "## (h) Route propagation\n");
    let _ = writeln!(
        section,
        "The quickstart with N routes (as in (b)); one at a time, a new Service with its \
         host is written, and timed to the first answer from it through HAProxy; then \
         its file is deleted, and timed to the first `404 no route`. With \
         `haproxy.dynamicBackends` the quickstart renders its backends as `backend NAME \
         from routes`: on HAProxy 3.4 such a change is `add backend` … `publish \
         backend` (or the reverse) at runtime; without it, or on an older line, every \
         change is a reload. Reloads as counted by `hapwright_reloads_total` over the \
         changes.\n"
    );
    let results = match results {
        Ok(results) => results,
        Err(why) => {
            let _ = writeln!(section, "Not measured: {why}\n");
            return section;
        }
    };
    let _ = writeln!(
        section,
        "| routes | HAProxy | dynamicBackends | change | p50 | p95 | max | reloads | target (p50) | verdict |\n|---:|---|---|---|---:|---:|---:|---:|---|---|"
    );
    for run in &results.runs {
        let mode = if run.dynamic { "on" } else { "off" };
        match &run.result {
            Ok(p) => {
                for latency in [&p.add, &p.remove] {
                    let change = latency.path.split(' ').next().unwrap_or_default();
                    let dynamic_target = run.dynamic && run.line == "3.4";
                    let target = if run.backends >= 10_000 { 40.0 } else { 20.0 };
                    let (target_cell, v) = if dynamic_target && change == "add" {
                        let mut v = verdict(latency.quantile(0.5), target, "ms");
                        if p.reloads > 0.0 {
                            v = format!("✗ **missed**: {} reloads", p.reloads);
                        }
                        (format!("≤ {target} ms, 0 reloads"), v)
                    } else {
                        ("–".to_owned(), "–".to_owned())
                    };
                    let _ = writeln!(
                        section,
                        "| {} | {} | {mode} | {change} | {} | {} | {target_cell} | {v} |",
                        run.backends,
                        run.line,
                        quantile_cells(latency),
                        p.reloads,
                    );
                    if dynamic_target && change == "add" {
                        summary.push([
                            format!(
                                "New route at {} routes, HAProxy 3.4 dynamic backends (p50)",
                                run.backends
                            ),
                            format!("≤ {target} ms, 0 reloads"),
                            format!(
                                "{} ms, {} reloads — {v}",
                                fmt_num(latency.quantile(0.5)),
                                p.reloads
                            ),
                        ]);
                    }
                }
            }
            Err(why) => {
                let _ = writeln!(
                    section,
                    "| {} | {} | {mode} | – | not measured: {} | | | | | |",
                    run.backends,
                    run.line,
                    why.to_string().lines().next().unwrap_or_default()
                );
            }
        }
    }
    let _ = writeln!(section);
    let stages: Vec<_> = results
        .runs
        .iter()
        .filter(|run| run.dynamic && run.line == "3.4")
        .filter_map(|run| Some((run.backends, run.result.as_ref().ok()?.add_stages)))
        .collect();
    if !stages.is_empty() {
        let _ = writeln!(
            section,
            "Where an add's time went, HAProxy 3.4 with dynamic backends (means per add from \
             hapwright's histograms; phase 2 is `haproxy -c`, 0 when the render passed by \
             equivalence; deploy is the plan, the file writes and the runtime commands):\n\n\
             | routes | render | phase 1 | phase 2 | deploy | sum | phase 2 by equivalence |\n\
             |---:|---:|---:|---:|---:|---:|---:|"
        );
        for (backends, s) in stages {
            let _ = writeln!(section, "| {backends} | {} |", s.cells());
        }
        let _ = writeln!(section);
    }
    match &results.long_lived {
        Ok(l) => {
            let v = if l.closed == 0 {
                "✓ met".to_owned()
            } else {
                format!("✗ **missed**: {} closed", l.closed)
            };
            let _ = writeln!(
                section,
                "Long-lived connections, HAProxy 3.4 with dynamic backends at {} routes: {} \
                 streamed responses (a chunk every 50 ms) through an untouched route, while \
                 {} routes were added and removed again one after another (quick pacing: \
                 debounce 50 ms).\n\n| streams | route adds + removals | closed | bytes received | reloads | target | verdict |\n|---:|---:|---:|---:|---:|---|---|\n| {} | {} + {} | {} | {} | {} | 0 closed | {v} |\n",
                l.backends,
                l.streams,
                l.changes,
                l.streams,
                l.changes,
                l.changes,
                l.closed,
                l.bytes,
                l.reloads
            );
            summary.push([
                format!(
                    "Streams open across {} route adds and removals (3.4)",
                    l.changes
                ),
                "0 closed".to_owned(),
                format!("{} closed — {v}", l.closed),
            ]);
        }
        Err(why) => {
            let _ = writeln!(section, "Long-lived connections not measured: {why}\n");
        }
    }
    section
}

/// Runs (i) at every size.
pub fn certificates(
    sizes: &[usize],
    changes: usize,
) -> Vec<Result<CertPropagation, ScenarioError>> {
    sizes
        .iter()
        .map(|&secrets| {
            eprintln!("(i) certificates: {secrets} TLS Secrets, {changes} changes");
            let result = catch(|| certs::certificate_propagation(secrets, changes));
            if let Err(why) = &result {
                eprintln!("    failed: {why}");
            }
            result
        })
        .collect()
}

/// The (i) section.
pub fn certificates_section(
    results: &[Result<CertPropagation, ScenarioError>],
    summary: &mut Vec<[String; 3]>,
) -> String {
    let mut section = String::new();
    let _ = writeln!(section, "## (i) Certificates at scale\n");
    let _ = writeln!(
        section,
        "The Ingress library (`examples/kubernetes-ingress/`) with N TLS Secrets, each \
         used by its own Ingress and host (one PEM file and crt-list line each), files \
         sources standing in for the API server, HAProxy started as `deploy/sidecar/` \
         starts it (the `haproxy` on `PATH`). One at a time: a new Secret and its \
         Ingress written, until a TLS handshake with its host as SNI presents the new \
         certificate and the request answers; the Secret renewed (a new certificate), \
         until the handshake presents it; both deleted, until it is no longer \
         presented. The handshakes are tried 1 ms apart. Each change starts once \
         the last one is deployed and the controller's `minDeploymentInterval` (50 \
         ms) and `debounce` (20 ms) have passed since, so no change waits for a \
         rate limit. Reloads counted with the master's `show proc`. The full render \
         is the mean of the renders until the first deployment; peak RSS is \
         hapwright's `VmHWM`.\n"
    );
    let _ = writeln!(
        section,
        "| Secrets | change | p50 | p95 | max | target (p50) | verdict |\n|---:|---|---:|---:|---:|---|---|"
    );
    let mut totals = String::new();
    for result in results {
        match result {
            Ok(c) => {
                for (latency, target) in [
                    (&c.add, Some(25.0)),
                    (&c.renew, Some(20.0)),
                    (&c.remove, None),
                ] {
                    let (target_cell, v) = match target {
                        Some(t) => (format!("≤ {t} ms"), verdict(latency.quantile(0.5), t, "ms")),
                        None => ("–".to_owned(), "–".to_owned()),
                    };
                    let _ = writeln!(
                        section,
                        "| {} | {} | {} | {target_cell} | {v} |",
                        c.secrets,
                        latency.path,
                        quantile_cells(latency),
                    );
                    if let Some(t) = target {
                        summary.push([
                            format!("{} with {} TLS Secrets (p50)", latency.path, c.secrets),
                            format!("≤ {t} ms"),
                            format!("{} ms — {v}", fmt_num(latency.quantile(0.5))),
                        ]);
                    }
                }
                let _ = writeln!(
                    totals,
                    "| {} | {} | {} | {} ms | {} ms | {} s | {:.1} MiB |",
                    c.secrets,
                    c.add.samples_ms.len() * 3,
                    c.reloads,
                    fmt_num(c.full_render_ms),
                    fmt_num(c.change_render_ms),
                    fmt_num(c.startup_s),
                    c.peak_rss_bytes as f64 / (1024.0 * 1024.0),
                );
                summary.push([
                    format!(
                        "Reloads over the certificate changes, {} TLS Secrets",
                        c.secrets
                    ),
                    "0".to_owned(),
                    if c.reloads == 0 {
                        "0 — ✓ met".to_owned()
                    } else {
                        format!("{} — ✗ **missed**", c.reloads)
                    },
                ]);
            }
            Err(why) => {
                let _ = writeln!(
                    section,
                    "| – | not measured: {} | | | | | |",
                    why.to_string().lines().next().unwrap_or_default()
                );
            }
        }
    }
    let _ = writeln!(
        section,
        "\n| Secrets | changes | reloads | full render | render per change | start to first deployment | hapwright peak RSS |\n|---:|---:|---:|---:|---:|---:|---:|\n{totals}"
    );
    let stage_rows: String = results
        .iter()
        .filter_map(|c| c.as_ref().ok())
        .flat_map(|c| {
            ["new certificate", "renewal", "removal"]
                .into_iter()
                .zip(&c.stages)
                .map(move |(change, s)| format!("| {} | {change} | {} |\n", c.secrets, s.cells()))
        })
        .collect();
    if !stage_rows.is_empty() {
        let _ = writeln!(
            section,
            "Where a change's time went (means per change from hapwright's histograms; phase 2 \
             is `haproxy -c`, 0 when the render passed by equivalence; deploy is the plan, the \
             runtime commands and the file writes):\n\n\
             | Secrets | change | render | phase 1 | phase 2 | deploy | sum | phase 2 by equivalence |\n\
             |---:|---|---:|---:|---:|---:|---:|---:|\n{stage_rows}"
        );
    }
    section
}

/// The `p50 | p95 | max` cells of a table row, in milliseconds.
fn quantile_cells(latency: &Latency) -> String {
    format!(
        "{} ms | {} ms | {} ms",
        fmt_num(latency.quantile(0.5)),
        fmt_num(latency.quantile(0.95)),
        fmt_num(latency.quantile(1.0))
    )
}
