//! `hapwright-benchsuite`: the benchmark suite driver behind `scripts/bench.sh`.
//!
//! It runs (a) `hapwright bench` on the realistic routing example, (b) end-to-end
//! latency, (c) reloads under churn and (d) controller memory with the real binary and
//! HAProxy, reads (e) and (f) from criterion's results (the script runs the criterion
//! benches first), and writes `docs/benchmarks.md` and `docs/benchmarks.png`. The
//! hand-written Analysis section of the previous report is kept.
//!
//! ```text
//! hapwright-benchsuite [--quick] [--repo DIR] [--font TTF] [--commands FILE]
//! ```
//!
//! The `hapwright` binary measured is `HAPWRIGHT_BIN`, else this binary's sibling
//! (`target/release/hapwright`), as in the e2e harness.

mod certs;
mod chart;
mod criterion;
mod report;
mod routes;
mod scale;
mod scenarios;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use report::{BenchReport, Machine, Results, ScenarioError};

/// Where `scripts/bench.sh` installs the font (Debian `fonts-dejavu-core`).
const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// The analysis a report starts with when the previous one has none.
const FRESH_ANALYSIS: &str = "## Analysis\n\nWrite here, by hand, what dominates where a target is missed (the suite keeps this section).";

struct Args {
    quick: bool,
    /// Only scenario (d), printed: for comparing the controller's memory of two builds.
    memory_only: bool,
    /// Only the runtime path of scenario (b), with traces off and on, printed: the
    /// cost of `controller.tracing` at sample ratio 1.
    tracing_overhead: bool,
    /// Only scenario (b) at this many backends, printed with its stage means and the
    /// reload target: for comparing the latency of two builds at one size.
    latency_only: Option<usize>,
    /// Only the route propagation of issue 37 at these sizes, printed: a new Service
    /// to its first answer and its removal, with and without `dynamicBackends` (run
    /// once with each HAProxy line first on `PATH`).
    route_propagation: Option<Vec<usize>>,
    /// With `route_propagation`: only the rows with dynamic backends on HAProxy 3.4
    /// (no reload rows, no long-lived streams), for comparing two builds there.
    dynamic_only: bool,
    /// Only section (i), certificates at scale, at these numbers of TLS Secrets,
    /// printed.
    certificates: Option<Vec<usize>>,
    /// Only the long-lived streams of (h) across this many route adds and removals,
    /// printed.
    long_lived: Option<usize>,
    /// The `haproxy` binary of HAProxy 3.4 (scripts/haproxy-lines.sh), for the rows
    /// of (h) with dynamic backends; without it (h) runs on the `PATH` one only.
    newer_haproxy: Option<PathBuf>,
    repo: PathBuf,
    hapwright: PathBuf,
    font: PathBuf,
    commands: Option<PathBuf>,
}

/// The comma-separated sizes given to `flag` (`100,1000`).
fn sizes(flag: &str, value: impl FnOnce(&str) -> Result<PathBuf>) -> Result<Vec<usize>> {
    let text = value(flag)?;
    let text = text.to_string_lossy();
    text.split(',')
        .map(|size| {
            size.trim()
                .parse()
                .with_context(|| format!("{flag} needs sizes like 100,1000, not `{size}`"))
        })
        .collect()
}

fn parse_args() -> Result<Args> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let mut args = Args {
        quick: false,
        memory_only: false,
        tracing_overhead: false,
        latency_only: None,
        route_propagation: None,
        dynamic_only: false,
        certificates: None,
        long_lived: None,
        newer_haproxy: None,
        repo: std::env::current_dir().context("current directory")?,
        // The binary the e2e harness runs too: `HAPWRIGHT_BIN`, else this one's sibling.
        hapwright: std::env::var_os("HAPWRIGHT_BIN")
            .map_or_else(|| exe.with_file_name("hapwright"), PathBuf::from),
        font: PathBuf::from(DEFAULT_FONT),
        commands: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .map(PathBuf::from)
                .with_context(|| format!("{name} needs a value"))
        };
        match arg.as_str() {
            "--quick" => args.quick = true,
            "--memory-only" => args.memory_only = true,
            "--tracing-overhead" => args.tracing_overhead = true,
            "--latency-only" => {
                let size = value("--latency-only")?;
                let size = size.to_string_lossy();
                args.latency_only = Some(size.parse().with_context(|| {
                    format!("--latency-only needs a number of backends, not `{size}`")
                })?);
            }
            "--route-propagation" => {
                args.route_propagation = Some(sizes("--route-propagation", value)?);
            }
            "--dynamic-only" => args.dynamic_only = true,
            "--certificates" => args.certificates = Some(sizes("--certificates", value)?),
            "--long-lived" => {
                let text = value("--long-lived")?;
                let text = text.to_string_lossy();
                args.long_lived = Some(text.parse().with_context(|| {
                    format!("--long-lived needs a number of route changes, not `{text}`")
                })?);
            }
            "--haproxy-3.4" => args.newer_haproxy = Some(value("--haproxy-3.4")?),
            "--repo" => args.repo = value("--repo")?,
            "--font" => args.font = value("--font")?,
            "--commands" => args.commands = Some(value("--commands")?),
            "-h" | "--help" => {
                println!(
                    "usage: hapwright-benchsuite [--quick] [--memory-only] [--tracing-overhead] [--latency-only BACKENDS] [--route-propagation SIZES [--dynamic-only]] [--certificates SIZES] [--long-lived CHANGES] [--haproxy-3.4 BINARY] [--repo DIR] [--font TTF] [--commands FILE]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument `{other}` (see --help)"),
        }
    }
    Ok(args)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    if args.memory_only {
        let memory = catch(|| scenarios::memory(5_000));
        println!("{memory:?}");
        return Ok(());
    }
    if args.tracing_overhead {
        let (changes, rounds) = if args.quick { (5, 1) } else { (20, 4) };
        for backends in [100, 1000] {
            let (off, on) = catch(|| scenarios::tracing_overhead(backends, changes, rounds))?;
            println!("{}", scenarios::describe(&off));
            println!("{}", scenarios::describe(&on));
            println!(
                "{backends} backends: traces on / off: p50 {:+.1} %, mean {:+.1} %",
                (on.quantile(0.5) / off.quantile(0.5) - 1.0) * 100.0,
                (on.mean() / off.mean() - 1.0) * 100.0,
            );
        }
        return Ok(());
    }
    if let Some(changes) = args.long_lived {
        let result = catch(|| routes::long_lived(100, 4, changes, args.newer_haproxy.as_deref()));
        println!("{result:?}");
        return Ok(());
    }
    if args.route_propagation.is_some() || args.certificates.is_some() {
        let changes = if args.quick { 5 } else { 20 };
        let mut summary = Vec::new();
        if let Some(sizes) = &args.route_propagation {
            let long_lived = if args.quick { 20 } else { 100 };
            if args.dynamic_only && args.newer_haproxy.is_none() {
                bail!("--dynamic-only needs --haproxy-3.4 BINARY");
            }
            let results = scale::propagation(
                sizes,
                changes,
                long_lived,
                args.newer_haproxy.as_deref(),
                args.dynamic_only,
            );
            println!("{}", scale::propagation_section(&Ok(results), &mut summary));
        }
        if let Some(sizes) = &args.certificates {
            let results = scale::certificates(sizes, changes.min(10));
            println!("{}", scale::certificates_section(&results, &mut summary));
        }
        return Ok(());
    }
    if let Some(backends) = args.latency_only {
        let changes = if args.quick { 5 } else { 20 };
        let (size, _) =
            catch(|| scenarios::latency(backends, changes, scenarios::Extras::default()))?;
        println!("{}", scenarios::describe(&size.runtime));
        println!("{}", scenarios::describe(&size.reload));
        println!("runtime stages: {:?}", size.runtime_stages);
        println!("reload stages: {:?}", size.reload_stages);
        println!(
            "HAProxy's own reload {:.1} ms; reload target {:.1} ms",
            size.haproxy_reload_ms,
            report::reload_target_ms(&size)
        );
        return Ok(());
    }
    let machine = machine();
    eprintln!("machine: {machine:?}");

    let work = tempfile::Builder::new()
        .prefix("hapwright-benchsuite-")
        .tempdir()
        .context("temporary directory")?;
    let config = write_routing_config(&args.repo, work.path())?;

    let scales = "10,100,1000,10000";
    eprintln!("(a) hapwright bench --scale {scales}");
    let bench = run_bench(&args.hapwright, &config, scales);
    if let Err(why) = &bench {
        eprintln!("(a) failed: {why}");
    }

    let changes = if args.quick { 5 } else { 20 };
    let (churn_count, churn_seconds) = if args.quick { (100, 5.0) } else { (1000, 30.0) };
    let (burst_count, burst_seconds) = (scenarios::CHURN_FILES, 1.0);
    let mut latency = Vec::new();
    let mut churn = Err(ScenarioError::NotRun);
    let mut burst = Err(ScenarioError::NotRun);
    let mut quarantine = Err(ScenarioError::NotRun);
    for backends in [100, 1000, 10_000] {
        eprintln!("(b) latency at {backends} backends, {changes} changes per path");
        let extras = if backends == 1000 {
            scenarios::Extras {
                burst: Some((burst_count, burst_seconds)),
                churn: Some((churn_count, churn_seconds)),
                quarantine: true,
            }
        } else {
            scenarios::Extras::default()
        };
        match catch(|| scenarios::latency(backends, changes, extras)) {
            Ok((size, extra)) => {
                eprintln!("    {}", scenarios::describe(&size.runtime));
                eprintln!("    {}", scenarios::describe(&size.reload));
                if let Some(b) = extra.burst {
                    eprintln!("(c) burst: {b:?}");
                    burst = Ok(b);
                }
                if let Some(c) = extra.churn {
                    eprintln!("(c) churn: {c:?}");
                    churn = Ok(c);
                }
                if let Some(q) = extra.quarantine {
                    eprintln!("(g) quarantine: {q:?}");
                    quarantine = Ok(q);
                }
                latency.push(Ok(size));
            }
            Err(why) => {
                eprintln!("    failed: {why}");
                if backends == 1000 {
                    churn = Err(ScenarioError::ControllerFailed(Box::new(why.clone())));
                    burst = Err(ScenarioError::ControllerFailed(Box::new(why.clone())));
                    quarantine = Err(ScenarioError::ControllerFailed(Box::new(why.clone())));
                }
                latency.push(Err(why));
            }
        }
    }
    let settings = std::fs::read_to_string(args.repo.join("examples/quickstart/hapwright.yaml"))
        .ok()
        .map(|text| scenarios::settings(&text));

    eprintln!("(d) memory with 10,000 objects");
    let memory = catch(|| scenarios::memory(5_000));
    eprintln!("    {memory:?}");

    let (propagation_changes, long_lived_changes, certificate_changes) = if args.quick {
        (3, 20, 3)
    } else {
        (10, 100, 10)
    };
    let propagation = Ok(scale::propagation(
        &[100, 1000, 10_000],
        propagation_changes,
        long_lived_changes,
        args.newer_haproxy.as_deref(),
        false,
    ));
    let certificates = scale::certificates(&[1000, 10_000], certificate_changes);

    let criterion = criterion::collect(&args.repo.join("target/criterion"));
    eprintln!("(e, f) {} criterion results", criterion.len());

    let commands = match &args.commands {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading {}", path.display()))?
            .lines()
            .map(str::to_owned)
            .collect(),
        None => Vec::new(),
    };
    let mut commands = commands;
    commands.push(format!(
        "#   in the suite: {} bench -c <routing.yaml written from crates/reconciler/testdata/routing/> --scale {scales} --output json",
        std::env::current_dir()
            .ok()
            .and_then(|cwd| args.hapwright.strip_prefix(cwd).ok())
            .unwrap_or(&args.hapwright)
            .display()
    ));
    commands.push(format!(
        "#   in the suite: the end-to-end scenarios (b)–(d) through tests/support (`hapwright run` on a copy of examples/quickstart/), {changes} changes per path, burst {burst_count} changes over {burst_seconds} s, churn {churn_count} changes over {churn_seconds} s"
    ));
    commands.push(format!(
        "#   in the suite: (h) route propagation at 100, 1000 and 10000 routes, {propagation_changes} adds and removals each{}, long-lived streams across {long_lived_changes}; (i) certificates with 1000 and 10000 TLS Secrets, {certificate_changes} adds, renewals and removals each",
        args.newer_haproxy
            .as_ref()
            .map(|b| format!(" (HAProxy 3.4: {})", b.display()))
            .unwrap_or_default()
    ));
    let results = Results {
        quick: args.quick,
        machine,
        bench,
        settings,
        latency,
        burst,
        churn,
        quarantine,
        memory,
        propagation,
        certificates,
        criterion,
        commands,
    };

    let docs = args.repo.join("docs");
    let md_path = docs.join("benchmarks.md");
    let previous = std::fs::read_to_string(&md_path).ok();
    let analysis = report::preserved_analysis(previous.as_deref(), FRESH_ANALYSIS);
    std::fs::write(&md_path, report::markdown(&results, &analysis))
        .with_context(|| format!("writing {}", md_path.display()))?;
    eprintln!("wrote {}", md_path.display());

    let results_json = args.repo.join("target/benchsuite-results.json");
    if let Ok(text) = serde_json::to_string_pretty(&results) {
        let _ = std::fs::write(&results_json, text);
    }

    chart::register_font(&args.font)?;
    let scales = results
        .bench
        .as_ref()
        .map(|b| b.scales.clone())
        .unwrap_or_default();
    let mut bars = Vec::new();
    for size in results.latency.iter().flatten() {
        bars.push((
            size.runtime.clone(),
            report::runtime_target_ms(size.runtime.backends),
        ));
        bars.push((size.reload.clone(), report::reload_target_ms(size)));
    }
    let png = docs.join("benchmarks.png");
    chart::draw(&png, &scales, &chart::bars(&bars))?;
    eprintln!("wrote {}", png.display());
    Ok(())
}

/// Runs a scenario, turning a panic (the harness panics on failures) into an error.
pub(crate) fn catch<T>(scenario: impl FnOnce() -> T) -> std::result::Result<T, ScenarioError> {
    std::panic::catch_unwind(AssertUnwindSafe(scenario))
        .map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "the scenario panicked".to_owned())
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .map_err(ScenarioError::Failed)
}

/// Writes a config file for the routing example (`crates/reconciler/testdata/routing/`)
/// under `dir` (JSON, which is YAML) and returns its path.
fn write_routing_config(repo: &Path, dir: &Path) -> Result<PathBuf> {
    let root = repo.join("crates/reconciler/testdata/routing");
    let read_dir = |sub: &str| -> Result<Value> {
        let mut out = serde_json::Map::new();
        let mut entries: Vec<PathBuf> = std::fs::read_dir(root.join(sub))
            .with_context(|| format!("reading {}", root.join(sub).display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let name = name.strip_suffix(".j2").unwrap_or(&name).to_owned();
            let text = std::fs::read_to_string(&path)?;
            out.insert(name, json!({ "template": text }));
        }
        Ok(Value::Object(out))
    };
    std::fs::create_dir_all(dir.join("resources"))?;
    let watched = |kind: &str, index: Value| json!({"files": {"path": "./resources"}, "kind": kind, "indexBy": index});
    let by_name = json!(["metadata.namespace", "metadata.name"]);
    let config = json!({
        "watchedResources": {
            "services": watched("Service", by_name.clone()),
            "endpoints": watched("EndpointSlice", json!(["metadata.namespace", "metadata.labels.kubernetes\\.io/service-name"])),
            "ingresses": watched("Ingress", by_name.clone()),
            "secrets": watched("Secret", by_name),
        },
        "haproxyConfig": {"template": std::fs::read_to_string(root.join("haproxy.cfg.j2"))?},
        "templateSnippets": read_dir("snippets")?,
        "maps": read_dir("maps")?,
        "files": read_dir("files")?,
        "sslCertificates": read_dir("certs")?,
        "templating": {"trimBlocks": true, "lstripBlocks": true},
        "extraContext": {
            "httpPort": 8080,
            "httpsPort": 8443,
            "maxconn": 50000,
            "supportEmail": "ops@example.com",
            "blockedAgents": ["evil.bot/1.0", "scanner (+http://x)"],
        },
    });
    let path = dir.join("routing.yaml");
    std::fs::write(&path, serde_json::to_string_pretty(&config)?)?;
    Ok(path)
}

/// `hapwright bench -c CONFIG --scale SCALES --output json`.
fn run_bench(
    hapwright: &Path,
    config: &Path,
    scales: &str,
) -> std::result::Result<BenchReport, ScenarioError> {
    let output = Command::new(hapwright)
        .args(["bench", "-c"])
        .arg(config)
        .args(["--scale", scales, "--output", "json"])
        .output()
        .map_err(|e| ScenarioError::BenchNotStarted {
            path: hapwright.display().to_string(),
            reason: e.to_string(),
        })?;
    if !output.status.success() {
        return Err(ScenarioError::BenchFailed {
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    serde_json::from_slice(&output.stdout).map_err(|e| ScenarioError::BenchReportUnreadable {
        reason: e.to_string(),
    })
}

fn machine() -> Machine {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let meminfo = read("/proc/meminfo");
    let haproxy = Command::new("haproxy")
        .arg("-vv")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .unwrap_or_else(|e| format!("haproxy -vv failed: {e}"));
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    Machine {
        cpus: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")?
                    .split_once(':')
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned()),
        memory_bytes: meminfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("MemTotal:")?
                    .split_whitespace()
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
            * 1024,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
        haproxy,
        load_average: read("/proc/loadavg")
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        date,
    }
}
