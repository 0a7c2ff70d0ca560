//! The end-to-end scenarios: the real `hapwright run` (through the e2e harness,
//! [`hapwright_e2e::Controller`], on a private copy of the quickstart) managing a real
//! HAProxy, with many more Services than the quickstart has.
//!
//! Every backend is a Service with one EndpointSlice of one endpoint pointing at one of
//! the demo apps the quickstart's HAProxy serves itself, so every route answers.

use hapwright_app::bench::parse_status_kb;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use hapwright_e2e::{Controller, Reply, master_command, parse_show_proc, service_manifest};
use serde::Serialize;

/// Longest wait for one change to show (a bound, not an expectation).
pub(crate) const CHANGE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for a large controller to be ready and deployed.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// The quickstart controller settings, which the latency targets are relative to.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Settings {
    /// `controller.debounce`.
    pub debounce_ms: f64,
    /// `controller.minDeploymentInterval`.
    pub min_deployment_interval_ms: f64,
    /// `controller.minReloadInterval`.
    pub min_reload_interval_ms: f64,
}

/// Reads the settings from the quickstart config text (`debounce: 200ms` lines).
pub fn settings(config: &str) -> Settings {
    let read = |key: &str, default: f64| {
        config
            .lines()
            .find_map(|line| duration_ms(line.trim().strip_prefix(key)?.trim()))
            .unwrap_or(default)
    };
    Settings {
        debounce_ms: read("debounce:", 200.0),
        min_deployment_interval_ms: read("minDeploymentInterval:", 500.0),
        min_reload_interval_ms: read("minReloadInterval:", 2000.0),
    }
}

/// `250ms`, `2s` or `1.5s` in milliseconds.
fn duration_ms(text: &str) -> Option<f64> {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.trim().parse().ok();
    }
    text.strip_suffix('s')?
        .trim()
        .parse::<f64>()
        .ok()
        .map(|s| s * 1_000.0)
}

/// Latency samples of one path at one size.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Backends (Services) the controller serves.
    pub backends: usize,
    /// `runtime` or `reload`.
    pub path: String,
    /// Milliseconds from the resource file write to the first answer of the new backend.
    pub samples_ms: Vec<f64>,
}

impl Latency {
    /// The mean of the samples (0 for none).
    pub fn mean(&self) -> f64 {
        if self.samples_ms.is_empty() {
            0.0
        } else {
            self.samples_ms.iter().sum::<f64>() / self.samples_ms.len() as f64
        }
    }

    /// The `q` quantile (nearest rank) of the samples.
    pub fn quantile(&self, q: f64) -> f64 {
        quantile(&self.samples_ms, q)
    }
}

/// Nearest-rank quantile; 0 for no samples.
pub fn quantile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Mean time per change of each pipeline stage, from the controller's histograms
/// (`_sum` differences over a run of changes, divided by the number of changes),
/// milliseconds. A stage that did not run for a change counts 0 for it, so the stages
/// add up to hapwright's share of the mean latency.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Stages {
    /// `hapwright_render_duration_seconds`.
    pub render_ms: f64,
    /// `hapwright_validation_duration_seconds{phase="parse"}`.
    pub phase1_ms: f64,
    /// `hapwright_validation_duration_seconds{phase="haproxy"}`, per change.
    pub phase2_ms: f64,
    /// Mean of one `haproxy -c` run (per run, not per change); 0 when none ran.
    pub phase2_run_ms: f64,
    /// How many times `haproxy -c` ran.
    pub phase2_runs: f64,
    /// How many renders passed phase 2 by structural equivalence instead
    /// (`hapwright_validation_phase2_skipped_total`).
    pub phase2_skipped: f64,
    /// `hapwright_deployment_duration_seconds`.
    pub deploy_ms: f64,
}

impl Stages {
    /// The stage means over `changes` changes between two `/metrics` texts.
    pub fn between(before: &str, after: &str, changes: usize) -> Self {
        let diff = |name: &str, filter: &str| {
            metric_sum(after, name, filter) - metric_sum(before, name, filter)
        };
        let per_change = |name: &str, filter: &str| {
            if changes == 0 {
                0.0
            } else {
                diff(&format!("{name}_sum"), filter) / changes as f64 * 1_000.0
            }
        };
        let phase = r#"phase="haproxy""#;
        let runs = diff("hapwright_validation_duration_seconds_count", phase);
        Self {
            render_ms: per_change("hapwright_render_duration_seconds", ""),
            phase1_ms: per_change("hapwright_validation_duration_seconds", r#"phase="parse""#),
            phase2_ms: per_change("hapwright_validation_duration_seconds", phase),
            phase2_run_ms: if runs > 0.0 {
                diff("hapwright_validation_duration_seconds_sum", phase) / runs * 1_000.0
            } else {
                0.0
            },
            phase2_runs: runs,
            phase2_skipped: diff("hapwright_validation_phase2_skipped_total", ""),
            deploy_ms: per_change("hapwright_deployment_duration_seconds", ""),
        }
    }

    /// The mean of each stage over `runs` (each one change's [`Stages::between`]);
    /// counts (`phase2_runs`, `phase2_skipped`) are summed, and `phase2_run_ms` is
    /// the mean over the runs that ran `haproxy -c`.
    pub fn mean(runs: &[Stages]) -> Self {
        let n = runs.len().max(1) as f64;
        let mean = |f: fn(&Stages) -> f64| runs.iter().map(f).sum::<f64>() / n;
        let phase2_runs: f64 = runs.iter().map(|s| s.phase2_runs).sum();
        Self {
            render_ms: mean(|s| s.render_ms),
            phase1_ms: mean(|s| s.phase1_ms),
            phase2_ms: mean(|s| s.phase2_ms),
            phase2_run_ms: if phase2_runs > 0.0 {
                runs.iter()
                    .map(|s| s.phase2_run_ms * s.phase2_runs)
                    .sum::<f64>()
                    / phase2_runs
            } else {
                0.0
            },
            phase2_runs,
            phase2_skipped: runs.iter().map(|s| s.phase2_skipped).sum(),
            deploy_ms: mean(|s| s.deploy_ms),
        }
    }

    /// The sum of the stages.
    pub fn total(&self) -> f64 {
        self.render_ms + self.phase1_ms + self.phase2_ms + self.deploy_ms
    }

    /// The `render | phase 1 | phase 2 | deploy | sum | phase 2 by equivalence`
    /// cells of a table row.
    pub fn cells(&self) -> String {
        format!(
            "{} ms | {} ms | {} ms | {} ms | {} ms | {}",
            crate::report::fmt_num(self.render_ms),
            crate::report::fmt_num(self.phase1_ms),
            crate::report::fmt_num(self.phase2_ms),
            crate::report::fmt_num(self.deploy_ms),
            crate::report::fmt_num(self.total()),
            self.phase2_skipped,
        )
    }
}

/// What the latency scenario at one size measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SizeResult {
    /// Runtime path (an endpoint's port changes: `set server addr`).
    pub runtime: Latency,
    /// Reload path (a new Service: a new backend and map entry).
    pub reload: Latency,
    /// HAProxy's own reload time: master CLI `reload` until `show proc` reports the
    /// new reload count, milliseconds, median of a few.
    pub haproxy_reload_ms: f64,
    /// Reloads counted by `hapwright_reloads_total` during the runtime-path changes.
    pub reloads_during_runtime: f64,
    /// Where the runtime path's time went.
    pub runtime_stages: Stages,
    /// Where the reload path's time went.
    pub reload_stages: Stages,
}

/// The churn scenario's outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Churn {
    /// Backends served.
    pub backends: usize,
    /// Endpoint changes written.
    pub changes: usize,
    /// Seconds over which they were written.
    pub seconds: f64,
    /// `hapwright_reloads_total` grew by this much.
    pub reloads: f64,
    /// Successful runtime-strategy deployments during the churn.
    pub runtime_deployments: f64,
    /// Successful deployments of any strategy during the churn.
    pub deployments: f64,
    /// Services the changes went to (round-robin).
    pub services: usize,
    /// Whether every churned route answered its last port afterwards.
    pub final_state_correct: bool,
    /// Milliseconds from the last write until every churned route answered its last
    /// port.
    pub settle_ms: f64,
}

/// The memory scenario's outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Memory {
    /// Objects (Services + EndpointSlices) watched.
    pub objects: usize,
    /// `VmRSS` of `hapwright run` once deployed, bytes.
    pub rss_bytes: u64,
    /// `VmHWM` (peak) of `hapwright run`, bytes.
    pub peak_rss_bytes: u64,
    /// `process_resident_memory_bytes` from `/metrics`.
    pub metric_rss_bytes: f64,
    /// Seconds from start until the first deployment finished.
    pub startup_s: f64,
}

/// The quarantine scenario's outcome: one write changes [`QUARANTINE_CHANGES`]
/// Services, one of them so that HAProxy refuses it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Quarantine {
    /// Backends served.
    pub backends: usize,
    /// Services changed by the write (one of them bad).
    pub changes: usize,
    /// Milliseconds from the write until every good change answered through HAProxy.
    pub live_ms: f64,
    /// The same write with every change good: milliseconds until all answered.
    pub all_good_ms: f64,
    /// One validation at this size (phase 1 and one `haproxy -c`, from the reload
    /// path's runs), milliseconds: the unit of the target.
    pub validation_ms: f64,
    /// Extra validations the culprit search made (its `QuarantineSearched` event).
    pub probes: u64,
    /// Objects quarantined after the write (`/debug/quarantine`).
    pub quarantined: u64,
    /// Whether the bad Service kept answering from its last good state.
    pub bad_kept_last_good: bool,
}

/// Services the quarantine scenario changes in one write.
pub const QUARANTINE_CHANGES: usize = 50;

/// How many extra Services the churn and the burst change (each in its own file).
pub const CHURN_FILES: usize = 100;

pub(crate) fn host(name: &str) -> String {
    format!("{name}.example.test")
}

/// Services per `bulk-<f>.yaml` file (the files source limits documents per file).
const BULK_PER_FILE: usize = 250;

/// Starts a controller with `backends` Services: the quickstart's `web` and `api`,
/// [`CHURN_FILES`] `churn-<j>` Services in files of their own, and the rest in
/// `bulk-<f>.yaml` files. Returns once HAProxy answers for the last of them and the
/// instance runs the last render.
fn start(backends: usize) -> (Controller, Settings) {
    start_with(backends, str::to_owned)
}

/// [`start`] with `edit` applied to the controller's config first.
pub(crate) fn start_with(
    backends: usize,
    edit: impl FnOnce(&str) -> String,
) -> (Controller, Settings) {
    let controller = Controller::start_with(edit);
    let settings = settings(&controller.read_config());
    let ports = controller.ports();
    let bulk = backends.saturating_sub(2 + CHURN_FILES);
    let names: Vec<String> = (0..bulk).map(|i| format!("bulk-{i}")).collect();
    for (f, chunk) in names.chunks(BULK_PER_FILE).enumerate() {
        let mut text = String::new();
        for name in chunk {
            text.push_str(&service_manifest(name, &host(name), ports.api));
            text.push_str("---\n");
        }
        controller.write_resource(&format!("bulk-{f}.yaml"), &text);
    }
    for j in 0..CHURN_FILES {
        let name = format!("churn-{j}");
        controller.write_resource(
            &format!("{name}.yaml"),
            &service_manifest(&name, &host(&name), ports.web_v1),
        );
    }
    let started = Instant::now();
    let last_churn = host(&format!("churn-{}", CHURN_FILES - 1));
    first_answer(
        &controller,
        &last_churn,
        &controller.demo_body(ports.web_v1),
        started,
        START_TIMEOUT,
    );
    if let Some(last) = names.last() {
        first_answer(
            &controller,
            &host(last),
            &controller.demo_body(ports.api),
            started,
            START_TIMEOUT,
        );
    }
    wait_deployed(&controller);
    (controller, settings)
}

/// Waits (bounded by [`START_TIMEOUT`]) until the instance runs the last render.
pub(crate) fn wait_deployed(controller: &Controller) {
    controller.wait_until("the instance runs the last render", START_TIMEOUT, || {
        let rendered = controller.rendered_hash()?;
        let instance = controller.instance();
        (instance.last_hash.as_deref() == Some(rendered.as_str())).then_some(())
    });
}

/// Sends requests for `host` back to back until one answers 200 with `body`; returns
/// the time since `since`.
pub(crate) fn first_answer(
    controller: &Controller,
    host: &str,
    body: &str,
    since: Instant,
    timeout: Duration,
) -> f64 {
    loop {
        if let Ok(Reply {
            status: 200,
            body: b,
        }) = controller.route(host)
            && b == body
        {
            return since.elapsed().as_secs_f64() * 1_000.0;
        }
        if since.elapsed() > timeout {
            controller.fail(&format!("{host} never answered {body:?}"));
        }
    }
}

/// Sum of every series of `name` in the controller's `/metrics` (optionally only the
/// series whose labels contain `filter`).
pub fn metric_sum(metrics: &str, name: &str, filter: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let bare = series.split('{').next()?;
            (bare == name && series.contains(filter)).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

pub(crate) fn metrics(controller: &Controller) -> String {
    controller.status_get("/metrics").1
}

/// Pauses for `ms` milliseconds: spacing between changes so that each starts from a
/// settled controller, outside the min-interval windows (not a wait for a result).
pub(crate) fn pause(ms: f64) {
    std::thread::sleep(Duration::from_secs_f64(ms / 1_000.0));
}

/// HAProxy's own reload time, in ms: one master CLI `reload` until `show proc` reports
/// the new reload count, asked every 10 ms as the controller asks while it reloads
/// (a tighter loop takes CPU from the reloading master). Under the load a measured
/// deployment runs under: requests sent back to back, for a host HAProxy has no route
/// for (as the new Service's host before the change is live).
fn haproxy_reload_ms(controller: &Controller) -> f64 {
    let socket = controller.master_socket();
    let before = controller.master().reloads;
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = controller.route(&host("not-routed"));
            }
        });
        let started = Instant::now();
        // The master closes the connection when it re-executes itself.
        let _ = master_command(&socket, "reload");
        loop {
            let reloaded = master_command(&socket, "show proc")
                .ok()
                .and_then(|text| parse_show_proc(&text))
                .is_some_and(|procs| procs.reloads > before);
            if reloaded {
                done.store(true, std::sync::atomic::Ordering::Relaxed);
                return started.elapsed().as_secs_f64() * 1_000.0;
            }
            if started.elapsed() > CHANGE_TIMEOUT {
                done.store(true, std::sync::atomic::Ordering::Relaxed);
                controller.fail("HAProxy did not reload");
            }
            pause(10.0);
        }
    })
}

/// What else runs at one size: `(count, seconds)` of the burst (changes to as many
/// different Services) and of the churn (round-robin over [`CHURN_FILES`] Services).
#[derive(Clone, Copy, Debug, Default)]
pub struct Extras {
    /// The burst, if any.
    pub burst: Option<(usize, f64)>,
    /// The churn, if any.
    pub churn: Option<(usize, f64)>,
    /// Whether the quarantine scenario runs.
    pub quarantine: bool,
}

/// What [`latency`] measured besides the latency itself.
#[derive(Clone, Debug, Default)]
pub struct ExtraResults {
    /// The burst.
    pub burst: Option<Churn>,
    /// The churn.
    pub churn: Option<Churn>,
    /// The quarantine scenario.
    pub quarantine: Option<Quarantine>,
}

/// The latency scenario (and, at the given size, the burst and the churn) for one size.
pub fn latency(backends: usize, changes: usize, extras: Extras) -> (SizeResult, ExtraResults) {
    let (controller, settings) = start(backends);
    let ports = controller.ports();
    let mut result = SizeResult::default();

    // Runtime path: web's endpoint flips between the two web demo apps.
    let before = metrics(&controller);
    let reloads_before = metric_sum(&before, "hapwright_reloads_total", "");
    let runtime = runtime_path(&controller, &settings, backends, changes);
    let after = metrics(&controller);
    result.reloads_during_runtime =
        metric_sum(&after, "hapwright_reloads_total", "") - reloads_before;
    result.runtime_stages = Stages::between(&before, &after, changes);
    result.runtime = runtime;
    let before = after;

    // Reload path: a new Service each time. After each change, HAProxy's own reload is
    // timed once: interleaved, both see the same state of a shared machine, whose
    // speed drifts by tens of percent over a run.
    let mut own_reloads = Vec::with_capacity(changes);
    let mut reload = Latency {
        backends,
        path: "reload".to_owned(),
        samples_ms: Vec::new(),
    };
    let api_body = controller.demo_body(ports.api);
    for k in 0..changes {
        let name = format!("added-{k}");
        let manifest = service_manifest(&name, &host(&name), ports.api);
        let started = Instant::now();
        controller.write_resource(&format!("{name}.yaml"), &manifest);
        reload.samples_ms.push(first_answer(
            &controller,
            &host(&name),
            &api_body,
            started,
            CHANGE_TIMEOUT,
        ));
        wait_deployed(&controller);
        pause(settings.min_reload_interval_ms + settings.debounce_ms);
        own_reloads.push(haproxy_reload_ms(&controller));
        pause(settings.debounce_ms);
    }
    let after = metrics(&controller);
    result.reload_stages = Stages::between(&before, &after, changes);
    result.reload = reload;
    result.haproxy_reload_ms = quantile(&own_reloads, 0.5);

    let burst = extras.burst.map(|(count, seconds)| {
        pause(settings.min_reload_interval_ms + settings.debounce_ms);
        run_churn(&controller, backends, count, seconds)
    });
    let churned = extras.churn.map(|(count, seconds)| {
        pause(settings.min_reload_interval_ms + settings.debounce_ms);
        run_churn(&controller, backends, count, seconds)
    });
    let validation_ms = result.reload_stages.phase1_ms + result.reload_stages.phase2_run_ms;
    let quarantine = extras.quarantine.then(|| {
        pause(settings.min_reload_interval_ms + settings.debounce_ms);
        run_quarantine(&controller, &settings, backends, validation_ms)
    });
    (
        result,
        ExtraResults {
            burst,
            churn: churned,
            quarantine,
        },
    )
}

/// `changes` runtime-path changes: `web`'s endpoint flips between the two web demo
/// apps; each sample is the time from the file write to the first answer from the
/// new app.
fn runtime_path(
    controller: &Controller,
    settings: &Settings,
    backends: usize,
    changes: usize,
) -> Latency {
    let ports = controller.ports();
    let web = host("web");
    let mut runtime = Latency {
        backends,
        path: "runtime".to_owned(),
        samples_ms: Vec::new(),
    };
    for k in 0..changes {
        let (from, to) = if k % 2 == 0 {
            (ports.web_v1, ports.web_v2)
        } else {
            (ports.web_v2, ports.web_v1)
        };
        let text = controller
            .read_resource("web.yaml")
            .replace(&format!("port: {from}"), &format!("port: {to}"));
        let expected = controller.demo_body(to);
        let started = Instant::now();
        controller.write_resource("web.yaml", &text);
        runtime.samples_ms.push(first_answer(
            controller,
            &web,
            &expected,
            started,
            CHANGE_TIMEOUT,
        ));
        wait_deployed(controller);
        pause(settings.min_deployment_interval_ms + settings.debounce_ms);
    }
    runtime
}

/// The runtime path with traces off and with every reconciliation traced
/// (`controller.tracing`, `sampleRatio: 1`) to an OTLP receiver on loopback that
/// accepts every export. Alternates `rounds` controllers of each kind, off first,
/// so drift of a shared machine falls on both; returns (off, on).
pub fn tracing_overhead(backends: usize, changes: usize, rounds: usize) -> (Latency, Latency) {
    let sink = Sink::start();
    let tracing = format!(
        "controller:\n  tracing: {{ endpoint: 'http://127.0.0.1:{}', sampleRatio: 1.0 }}\n",
        sink.port
    );
    let mut off = Latency {
        backends,
        path: "runtime, traces off".to_owned(),
        samples_ms: Vec::new(),
    };
    let mut on = Latency {
        backends,
        path: "runtime, traces on (ratio 1)".to_owned(),
        samples_ms: Vec::new(),
    };
    for round in 0..rounds {
        // The second controller of a round starts while the first one's HAProxy may
        // still be shutting down: alternate which one goes first, so neither side
        // always pays for that.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for traced in order {
            let into = if traced { &mut on } else { &mut off };
            let (controller, settings) = start_with(backends, |config| {
                if traced {
                    config.replacen("controller:\n", &tracing, 1)
                } else {
                    config.to_owned()
                }
            });
            let run = runtime_path(&controller, &settings, backends, changes);
            into.samples_ms.extend(run.samples_ms);
        }
    }
    assert!(
        sink.exports() > 0,
        "the traced controllers exported nothing: the comparison is void"
    );
    (off, on)
}

/// An OTLP/HTTP receiver that answers every request 200 and counts them.
struct Sink {
    port: u16,
    exports: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Sink {
    fn start() -> Self {
        use std::io::{BufRead, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the sink");
        let port = listener.local_addr().expect("address").port();
        let exports = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = exports.clone();
        // Ends with the process, like the connections it serves.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let count = count.clone();
                std::thread::spawn(move || {
                    let Ok(mut writer) = stream.try_clone() else {
                        return;
                    };
                    let mut reader = std::io::BufReader::new(stream);
                    loop {
                        let mut length = 0usize;
                        let mut line = String::new();
                        // The request line, then headers up to the empty line.
                        loop {
                            line.clear();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if line.trim_end().is_empty() {
                                break;
                            }
                            if let Some((name, value)) = line.split_once(':')
                                && name.eq_ignore_ascii_case("content-length")
                            {
                                length = value.trim().parse().unwrap_or(0);
                            }
                        }
                        let mut body = vec![0; length];
                        if reader.read_exact(&mut body).is_err() {
                            return;
                        }
                        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let reply = "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
                        if writer.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { port, exports }
    }

    fn exports(&self) -> usize {
        self.exports.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// [`QUARANTINE_CHANGES`] Services `q-<i>` in one file, each routed to `port`; the
/// one at `bad` gets an address HAProxy refuses (`300.1.2.3`).
fn quarantine_file(port: u16, bad: Option<usize>) -> String {
    (0..QUARANTINE_CHANGES)
        .map(|i| {
            let name = format!("q-{i}");
            let manifest = service_manifest(&name, &host(&name), port);
            if Some(i) == bad {
                manifest.replace("\"127.0.0.1\"", "\"300.1.2.3\"")
            } else {
                manifest
            }
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Writes `text` as the quarantine file and returns the milliseconds until the
/// first Service (`q-0`) answers `body`: one deployment applies every change, so
/// that is when the changes are live. Every other Service but `skip` is then
/// checked to answer `body` too (not timed: walking 50 hosts one request at a time
/// would add the client's own time).
fn write_and_wait_all(controller: &Controller, text: &str, body: &str, skip: Option<usize>) -> f64 {
    let started = Instant::now();
    controller.write_resource("quarantine.yaml", text);
    let live = first_answer(controller, &host("q-0"), body, started, CHANGE_TIMEOUT);
    for i in (1..QUARANTINE_CHANGES).filter(|i| Some(*i) != skip) {
        first_answer(
            controller,
            &host(&format!("q-{i}")),
            body,
            started,
            CHANGE_TIMEOUT,
        );
    }
    live
}

/// The quarantine scenario: [`QUARANTINE_CHANGES`] Services change in one write, one
/// of them bad; how long until the good ones are live, against the same write with
/// every change good and against one validation.
fn run_quarantine(
    controller: &Controller,
    settings: &Settings,
    backends: usize,
    validation_ms: f64,
) -> Quarantine {
    let ports = controller.ports();
    let (v1, api) = (
        controller.demo_body(ports.web_v1),
        controller.demo_body(ports.api),
    );
    let settle = || {
        wait_deployed(controller);
        pause(settings.min_reload_interval_ms + settings.debounce_ms);
    };
    // The Services exist (a reload) before anything is measured.
    write_and_wait_all(controller, &quarantine_file(ports.web_v1, None), &v1, None);
    settle();
    let all_good_ms = write_and_wait_all(controller, &quarantine_file(ports.api, None), &api, None);
    settle();
    let bad = QUARANTINE_CHANGES - 1;
    let live_ms = write_and_wait_all(
        controller,
        &quarantine_file(ports.web_v1, Some(bad)),
        &v1,
        Some(bad),
    );
    let bad_kept_last_good = matches!(
        controller.route(&host(&format!("q-{bad}"))),
        Ok(Reply { status: 200, body }) if body == api
    );
    let quarantined = controller.status_get("/debug/quarantine").1;
    let quarantined = serde_json::from_str::<serde_json::Value>(&quarantined)
        .ok()
        .and_then(|v| v["count"].as_u64())
        .unwrap_or(0);
    let events = controller.status_get("/debug/events?limit=1000").1;
    let probes = serde_json::from_str::<serde_json::Value>(&events)
        .ok()
        .as_ref()
        .and_then(last_probes)
        .unwrap_or(0);
    // Fixed again, so the controller is clean for what follows.
    write_and_wait_all(controller, &quarantine_file(ports.web_v1, None), &v1, None);
    settle();
    Quarantine {
        backends,
        changes: QUARANTINE_CHANGES,
        live_ms,
        all_good_ms,
        validation_ms,
        probes,
        quarantined,
        bad_kept_last_good,
    }
}

/// The `probes` of the last `QuarantineSearched` event in a `/debug/events` answer
/// (events are listed oldest first).
fn last_probes(value: &serde_json::Value) -> Option<u64> {
    match value {
        serde_json::Value::Object(map) => map
            .get("probes")
            .and_then(serde_json::Value::as_u64)
            .or_else(|| map.values().rev().find_map(last_probes)),
        serde_json::Value::Array(items) => items.iter().rev().find_map(last_probes),
        _ => None,
    }
}

/// `count` endpoint changes spread evenly over `seconds`, round-robin over the
/// `churn-<j>` Services, each flipping its port between the two web demo apps.
fn run_churn(controller: &Controller, backends: usize, count: usize, seconds: f64) -> Churn {
    let ports = controller.ports();
    let before = metrics(controller);
    let reloads_before = metric_sum(&before, "hapwright_reloads_total", "");
    let runtime_before = metric_sum(
        &before,
        "hapwright_deployments_total",
        r#"result="success",strategy="runtime""#,
    );
    let deployments_before = metric_sum(
        &before,
        "hapwright_deployments_total",
        r#"result="success""#,
    );
    // Where each Service's endpoint points now (an earlier run may have moved it).
    let mut port_of: BTreeMap<usize, u16> = (0..CHURN_FILES.min(count))
        .map(|j| {
            let text = controller.read_resource(&format!("churn-{j}.yaml"));
            let port = if text.contains(&format!("{{ port: {} }}", ports.web_v2)) {
                ports.web_v2
            } else {
                ports.web_v1
            };
            (j, port)
        })
        .collect();
    let interval = Duration::from_secs_f64(seconds / count as f64);
    let started = Instant::now();
    for k in 0..count {
        let j = k % port_of.len();
        let to = if port_of[&j] == ports.web_v1 {
            ports.web_v2
        } else {
            ports.web_v1
        };
        port_of.insert(j, to);
        let name = format!("churn-{j}");
        controller.write_resource(
            &format!("{name}.yaml"),
            &service_manifest(&name, &host(&name), to),
        );
        // Keep to the schedule: the next write is due at (k + 1) × interval.
        let due = interval * (k as u32 + 1);
        if let Some(left) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(left);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    // Every churned route must end on its last port (bounded wait: the last changes
    // are still inside the debounce window when the loop ends).
    let settled = Instant::now();
    let correct = || {
        port_of.iter().all(|(j, port)| {
            let expected = controller.demo_body(*port);
            matches!(controller.route(&host(&format!("churn-{j}"))), Ok(Reply { status: 200, body }) if body == expected)
        })
    };
    let final_state_correct = loop {
        if correct() {
            break true;
        }
        if settled.elapsed() > CHANGE_TIMEOUT {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let settle_ms = settled.elapsed().as_secs_f64() * 1_000.0;
    wait_deployed(controller);
    let after = metrics(controller);
    Churn {
        backends,
        changes: count,
        seconds,
        reloads: metric_sum(&after, "hapwright_reloads_total", "") - reloads_before,
        runtime_deployments: metric_sum(
            &after,
            "hapwright_deployments_total",
            r#"result="success",strategy="runtime""#,
        ) - runtime_before,
        deployments: metric_sum(&after, "hapwright_deployments_total", r#"result="success""#)
            - deployments_before,
        services: count.min(CHURN_FILES),
        final_state_correct,
        settle_ms,
    }
}

/// Starts a controller watching `services` Services and as many EndpointSlices, and
/// reads its memory once deployed.
pub fn memory(services: usize) -> Memory {
    let started = Instant::now();
    let (controller, _) = start(services);
    let startup_s = started.elapsed().as_secs_f64();
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", controller.pid())).unwrap_or_default();
    let kb = |field: &str| parse_status_kb(&status, field).unwrap_or(0) * 1024;
    Memory {
        objects: services * 2,
        rss_bytes: kb("VmRSS:"),
        peak_rss_bytes: kb("VmHWM:"),
        metric_rss_bytes: metric_sum(&metrics(&controller), "process_resident_memory_bytes", ""),
        startup_s,
    }
}

/// A human summary of samples, for logs.
pub fn describe(latency: &Latency) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "{} path at {} backends: p50 {:.1} ms, p95 {:.1} ms over {} changes",
        latency.path,
        latency.backends,
        latency.quantile(0.5),
        latency.quantile(0.95),
        latency.samples_ms.len()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_nearest_rank() {
        let samples: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(quantile(&samples, 0.5), 10.0);
        assert_eq!(quantile(&samples, 0.95), 19.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
        assert_eq!(quantile(&[3.0], 0.95), 3.0);
    }

    #[test]
    fn metric_sums_series() {
        let text = "# HELP hapwright_reloads_total x\n\
                    hapwright_reloads_total{instance=\"local\",result=\"success\",reason=\"first_deploy\"} 1\n\
                    hapwright_reloads_total{instance=\"local\",result=\"success\",reason=\"structure\"} 3\n\
                    hapwright_reloads_total_other 7\n\
                    process_resident_memory_bytes 1048576\n";
        assert_eq!(metric_sum(text, "hapwright_reloads_total", ""), 4.0);
        assert_eq!(
            metric_sum(text, "hapwright_reloads_total", "structure"),
            3.0
        );
        assert_eq!(
            metric_sum(text, "process_resident_memory_bytes", ""),
            1_048_576.0
        );
    }

    #[test]
    fn settings_read_the_controller_block() {
        let s =
            settings("controller:\n  debounce: 150ms\n  maxWait: 2s\n  minReloadInterval: 1.5s\n");
        assert_eq!(s.debounce_ms, 150.0);
        assert_eq!(s.min_reload_interval_ms, 1500.0);
        assert_eq!(s.min_deployment_interval_ms, 500.0);
    }
}
