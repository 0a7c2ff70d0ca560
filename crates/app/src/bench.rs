//! `hapwright bench`: how long a config's templates take to compile, render and
//! validate at growing numbers of objects, and how much memory that needs.
//!
//! For each scale the fixtures are generated ([`generate`]):
//!
//! - **Cluster mode**, when a watched resource has `kind: Service`, `EndpointSlice`,
//!   `Ingress`, `GatewayClass`, `Gateway` or `HTTPRoute`: `scale` Services in ten
//!   namespaces (`team-0` … `team-9`), each with one EndpointSlice of three endpoints
//!   (every seventh not ready), one Ingress and one HTTPRoute routing
//!   `svc-<i>.example.com` `/` and `/api` to it, one GatewayClass and one Gateway (HTTP
//!   and HTTPS listeners) for the HTTPRoutes, and one TLS Secret `default/tls` (a real
//!   self-signed certificate, so `haproxy -c` can load it) for a watched resource of
//!   `kind: Secret`. The same cluster as the renderer's criterion benchmark (see
//!   [`synthetic`]). Watched resources of other kinds get no objects.
//! - **Fixture mode** otherwise: the objects of every `validationTests` fixture (all
//!   tests with `_global` merged in, a later object with the same namespace/name
//!   replacing an earlier one), copied `scale` times. Copy `k` appends `-<k>` to every
//!   object's `metadata.name` and to every string value anywhere in the object that
//!   equals one of the fixture objects' names, so label selectors and references
//!   between the copies keep pointing at their own copy.
//!
//! What is measured per scale, in this order:
//!
//! - `compile_ms`: compiling every template with the load-time checks
//!   ([`build::renderer`]).
//! - `render_ms`: the median of several renders of every template (after one warm-up
//!   render, which builds the lookup indexes and the objects' structural indexes as
//!   the controller does after a change).
//! - `phase1_ms`: hapwright's parser and checks ([`validator::validate_phase1`]).
//! - `phase2_ms`: `haproxy -c` on the rendered files in a scratch directory, once per
//!   distinct instance environment ([`validator::validate_phase2`]).
//! - `peak_rss_bytes`: `VmHWM` from `/proc/self/status` at the end.
//!
//! **Per-scale peak memory.** A high-water mark only grows, so each scale runs in a
//! child process of the same binary (`hapwright bench --scale N --in-process`): its
//! `VmHWM` is the peak of generating, storing, rendering and validating that scale
//! alone, the parent's memory not included (`haproxy -c` is its own process and is
//! not counted either). Resetting the mark through `/proc/self/clear_refs` would keep
//! the allocator's retained pages from the previous, larger scale in the figure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hapwright_deployer::component::validator;
use hapwright_eventbus::model::{Diagnostic, ObjectKey, ResourceSnapshot};
use hapwright_reconciler::renderer::Resources;
use hapwright_reconciler::synthetic;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::build;
use crate::config::Config;
use crate::run::exit;
use crate::validation_tests::{self, OutputFormat};

/// Renders timed per scale after the warm-up render (the median is reported).
const RENDER_REPEATS_SMALL: usize = 7;
/// Renders timed per scale from [`LARGE_SCALE`] objects on.
const RENDER_REPEATS_LARGE: usize = 3;
/// From this scale on, fewer renders are timed.
const LARGE_SCALE: usize = 5_000;

/// A self-signed EC P-256 certificate for `CN=bench.hapwright.invalid` (valid until
/// 2126), base64 of its PEM, as a Secret's `tls.crt` holds it. Only used to give
/// `haproxy -c` a certificate it can load; the key below is public and worthless.
const BENCH_TLS_CRT: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJtekNDQVVHZ0F3SUJBZ0lVUksrRUovSlZYYWpzRlFXZEJRUDF5SkhmTXVjd0NnWUlLb1pJemowRUF3SXcKSWpFZ01CNEdBMVVFQXd3WFltVnVZMmd1YUdGd2QzSnBaMmgwTG1sdWRtRnNhV1F3SUJjTk1qWXhNVEl5TURRMApOak0wV2hnUE1qRXlOakV3TWprd05EUTJNelJhTUNJeElEQWVCZ05WQkFNTUYySmxibU5vTG1oaGNIZHlhV2RvCmRDNXBiblpoYkdsa01Ga3dFd1lIS29aSXpqMENBUVlJS29aSXpqMERBUWNEUWdBRVg4OStIalQ4THphVzY4L28KZVJkcUd2eGJyTk04eHRaTjVzRHorM0dkbk1Ca3ZGbVBvOStqRFF2TmxkQm5FZzh5UEMxZDFWWmZXZXJVN1pZOQpJOWVRTHFOVE1GRXdIUVlEVlIwT0JCWUVGQzlUZDJMd0llL3JtckNISlRYb3VLanVhZm5DTUI4R0ExVWRJd1FZCk1CYUFGQzlUZDJMd0llL3JtckNISlRYb3VLanVhZm5DTUE4R0ExVWRFd0VCL3dRRk1BTUJBZjh3Q2dZSUtvWkkKemowRUF3SURTQUF3UlFJaEFJU2I0RDRQZVBzQzlxaDF6Rjh0K0tWSHNyQitBTW9SWTJuQks4WFRTcm52QWlCagp1NTduTmRLOW5TaFNsQlUvZkNIL3NZcjkzWmR6TlNYdm1oNDE1a1lBMlE9PQotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg==";
/// The private key of [`BENCH_TLS_CRT`], base64 of its PEM (`tls.key`).
const BENCH_TLS_KEY: &str = "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JR0hBZ0VBTUJNR0J5cUdTTTQ5QWdFR0NDcUdTTTQ5QXdFSEJHMHdhd0lCQVFRZ1g3Qzhnc0R2NTdXKzcxc0EKbEN1SWpBOFk2N0szL0VXbnRvaVBwTkNCVnFHaFJBTkNBQVJmejM0ZU5Qd3ZOcGJyeitoNUYyb2EvRnVzMHp6RwoxazNtd1BQN2NaMmN3R1M4V1krajM2TU5DODJWMEdjU0R6SThMVjNWVmw5WjZ0VHRsajBqMTVBdQotLS0tLUVORCBQUklWQVRFIEtFWS0tLS0tCg==";

/// The measurements of one scale (one element of the JSON report's `scales`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScaleReport {
    /// The scale asked for: Services in cluster mode, fixture copies in fixture mode.
    pub scale: usize,
    /// Objects generated over all watched resources.
    pub objects: usize,
    /// Compiling every template, in milliseconds.
    pub compile_ms: f64,
    /// Median render of every template, in milliseconds.
    pub render_ms: f64,
    /// Validation phase 1 (hapwright's parser), in milliseconds.
    pub phase1_ms: f64,
    /// Validation phase 2 (`haproxy -c`), in milliseconds.
    pub phase2_ms: f64,
    /// Peak resident memory of the process that measured this scale.
    pub peak_rss_bytes: u64,
}

/// The whole `hapwright bench` report: `{"scales": [...]}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// One entry per scale, in the order asked for.
    pub scales: Vec<ScaleReport>,
}

/// Why `--scale` does not parse. Not retryable: the argument must be fixed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScaleError {
    /// An item is zero.
    #[error("scale `{item}` must be at least 1")]
    Zero {
        /// The item as written.
        item: String,
    },
    /// An item is empty or not a whole number.
    #[error("scale `{item}` is not a positive whole number (expected e.g. 10,100,1000)")]
    NotANumber {
        /// The item as written.
        item: String,
    },
}

/// Parses `--scale`: comma-separated positive integers (`_` allowed as a digit
/// separator), e.g. `10,100,1_000`.
///
/// # Errors
///
/// [`ScaleError`] for the first item that is empty, not a number or zero.
pub fn parse_scales(text: &str) -> Result<Vec<usize>, ScaleError> {
    text.split(',')
        .map(|item| {
            let item = item.trim();
            let digits: String = item.chars().filter(|c| *c != '_').collect();
            match digits.parse::<usize>() {
                Ok(0) => Err(ScaleError::Zero {
                    item: item.to_owned(),
                }),
                Ok(n) => Ok(n),
                Err(_) => Err(ScaleError::NotANumber {
                    item: item.to_owned(),
                }),
            }
        })
        .collect()
}

/// Why no fixtures can be generated for a config. Not retryable: the config must
/// change (a watched resource of a cluster kind, or `validationTests` fixtures).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GeneratorError {
    /// The tests whose fixtures would be copied cannot be selected.
    #[error(transparent)]
    TestsUnselectable(#[from] validation_tests::SelectError),
    /// Fixture mode: the `validationTests` fixtures do not load (one line each).
    #[error("{}", lines(errors))]
    FixturesInvalid {
        /// Every bad fixture object.
        errors: Vec<validation_tests::FixtureError>,
    },
    /// Fixture mode, but there are no fixture objects to copy.
    #[error(
        "nothing to generate fixtures from: no watched resource has kind Service, \
         EndpointSlice, Ingress, GatewayClass, Gateway or HTTPRoute, and validationTests \
         define no fixture objects"
    )]
    NothingToGenerate,
}

/// Items one per line.
fn lines<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// How fixtures are generated for a config.
#[derive(Clone, Debug, PartialEq)]
pub enum Generator {
    /// Services, EndpointSlices, Ingresses, Gateway API objects and a TLS Secret, by
    /// the watched resources' kinds.
    Cluster {
        /// Watched resource name → kind, for the kinds this generator produces.
        kinds: BTreeMap<String, String>,
    },
    /// Copies of the config's own `validationTests` fixture objects, by watched
    /// resource name (already normalized as the `files` source would).
    Fixtures {
        /// Watched resource name → the fixture objects.
        objects: BTreeMap<String, Vec<Value>>,
    },
}

/// The cluster `hapwright bench` generates: Services name their host in an
/// annotation, EndpointSlices have an `addressType`, and the Secret holds a real
/// certificate `haproxy -c` can load.
const CLUSTER_SHAPE: synthetic::Shape = synthetic::Shape {
    host_annotation: true,
    address_type: true,
    tls_crt: BENCH_TLS_CRT,
    tls_key: BENCH_TLS_KEY,
};

/// Chooses the generator for `config` (see the module docs).
///
/// # Errors
///
/// [`GeneratorError`]: fixture mode without any fixture object, or fixtures that do
/// not load.
pub fn generator(config: &Config) -> Result<Generator, GeneratorError> {
    let kinds: BTreeMap<String, String> = config
        .watched_resources
        .resources
        .iter()
        .filter_map(|(name, resource)| {
            // A `files` source names its kind at the top level, a `kubernetes`
            // source inside its own section.
            let kind = resource
                .kind
                .as_deref()
                .or(resource.kubernetes.as_ref().map(|k| k.kind.as_str()))?;
            synthetic::KINDS
                .contains(&kind)
                .then(|| (name.clone(), kind.to_owned()))
        })
        .collect();
    if kinds.values().any(|kind| kind != "Secret") {
        return Ok(Generator::Cluster { kinds });
    }
    let cases = validation_tests::cases(config, None)?;
    let mut merged = validation_tests::TestCase {
        name: "bench".to_owned(),
        description: None,
        fixture_layers: Vec::new(),
        extra_context: config.templates.extra_context.clone(),
        assertions: Vec::new(),
        deployment: None,
    };
    for case in cases {
        merged.fixture_layers.extend(case.fixture_layers);
    }
    // `_global`'s layer comes again with every test; a later layer's object replaces
    // an earlier one with the same namespace/name, so repeating it is harmless.
    let fixtures = validation_tests::load_fixtures(config, &merged)
        .map_err(|errors| GeneratorError::FixturesInvalid { errors })?;
    let mut objects = BTreeMap::new();
    let mut total = 0;
    if let Some(Value::Object(lists)) = fixtures.context.get("resources") {
        for (name, list) in lists {
            let list = list.as_array().cloned().unwrap_or_default();
            total += list.len();
            objects.insert(name.clone(), list);
        }
    }
    if total == 0 {
        return Err(GeneratorError::NothingToGenerate);
    }
    Ok(Generator::Fixtures { objects })
}

/// The objects of one scale for one watched resource (none when the generator makes
/// none for it), made one at a time as the iterator is read: [`resources`] stores
/// each as it comes, so no resource's objects are ever all held in their parsed form.
pub fn generate_one<'a>(
    generator: &'a Generator,
    name: &str,
    scale: usize,
) -> Box<dyn Iterator<Item = Value> + 'a> {
    match generator {
        Generator::Cluster { kinds } => match kinds.get(name) {
            Some(kind) => synthetic::objects_iter(kind, scale, &CLUSTER_SHAPE),
            None => Box::new(std::iter::empty()),
        },
        Generator::Fixtures { objects } => {
            let Some(list) = objects.get(name) else {
                return Box::new(std::iter::empty());
            };
            let names: BTreeSet<String> = objects
                .values()
                .flatten()
                .filter_map(|o| o.pointer("/metadata/name")?.as_str().map(str::to_owned))
                .collect();
            let names = std::rc::Rc::new(names);
            Box::new((0..scale).flat_map(move |k| {
                let suffix = format!("-{k}");
                let names = names.clone();
                list.iter().map(move |object| {
                    let mut copy = object.clone();
                    rename(&mut copy, &names, &suffix);
                    copy
                })
            }))
        }
    }
}

/// Appends `suffix` to every string in `value` that is one of `names`.
fn rename(value: &mut Value, names: &BTreeSet<String>, suffix: &str) {
    match value {
        Value::String(text) if names.contains(text.as_str()) => text.push_str(suffix),
        Value::Array(items) => items.iter_mut().for_each(|v| rename(v, names, suffix)),
        Value::Object(map) => map.values_mut().for_each(|v| rename(v, names, suffix)),
        _ => {}
    }
}

/// Generates the objects of one scale and turns them into the renderer's input: one
/// snapshot per watched resource (empty for those without objects), indexed by its
/// `indexBy`. Resource by resource, so the parsed objects of only one are alive at a
/// time (they take several times the memory of the stored objects). Returns the
/// resources and the number of objects.
pub fn resources(config: &Config, generator: &Generator, scale: usize) -> (Resources, usize) {
    let mut resources = Resources::new();
    let mut count = 0;
    for (name, resource) in &config.watched_resources.resources {
        let mut snapshot = ResourceSnapshot::new(resource.index_by.clone());
        for object in generate_one(generator, name, scale) {
            let metadata = &object["metadata"];
            let key = ObjectKey::new(
                metadata["namespace"].as_str().unwrap_or("default"),
                metadata["name"].as_str().unwrap_or_default(),
            );
            snapshot.upsert(key, &object);
        }
        count += snapshot.len();
        resources.update(&Arc::from(name.as_str()), Arc::new(snapshot), None);
    }
    (resources, count)
}

/// Why a scale could not be measured. Not retryable: the config, its templates or
/// its fixtures must change. The messages name the step and list every diagnostic
/// with its source line.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// No fixtures can be generated for the config.
    #[error(transparent)]
    GeneratorUnavailable(#[from] GeneratorError),
    /// The templates do not compile.
    #[error("compiling the templates failed:{}", diagnostics(errors))]
    CompileFailed {
        /// The compiler's diagnostics.
        errors: Vec<Diagnostic>,
    },
    /// A render of the generated objects failed.
    #[error("rendering failed:{}", diagnostics(errors))]
    RenderFailed {
        /// The renderer's diagnostics.
        errors: Vec<Diagnostic>,
    },
    /// hapwright's parser rejects the render.
    #[error(
        "validation phase 1 (hapwright's parser) failed:{}",
        diagnostics(errors)
    )]
    Phase1Rejected {
        /// The parser's errors.
        errors: Vec<Diagnostic>,
    },
    /// `haproxy -c` rejects the render.
    #[error("validation phase 2 (haproxy -c) failed:{}", diagnostics(errors))]
    Phase2Rejected {
        /// HAProxy's errors.
        errors: Vec<Diagnostic>,
    },
}

/// Each diagnostic on its own line, followed by its source line when it has one.
fn diagnostics(errors: &[Diagnostic]) -> String {
    let mut out = String::new();
    for error in errors {
        out.push('\n');
        out.push_str(&error.to_string());
        if let Some(line) = &error.source_line {
            out.push_str("\n    | ");
            out.push_str(line);
        }
    }
    out
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1_000.0
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// `VmHWM` (peak resident set) of this process, in bytes; 0 where `/proc` has none.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| parse_status_kb(&status, "VmHWM:"))
        .map_or(0, |kb| kb * 1024)
}

/// The value in kB of the `/proc/<pid>/status` field `field` (e.g. `VmHWM:`).
pub fn parse_status_kb(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// Measures one scale in this process.
///
/// # Errors
///
/// See [`BenchError`].
pub async fn measure(config: &Config, scale: usize) -> Result<ScaleReport, BenchError> {
    let generator = generator(config)?;
    let started = Instant::now();
    let renderer =
        build::renderer(config).map_err(|errors| BenchError::CompileFailed { errors })?;
    let compile_ms = millis(started.elapsed());

    let (resources, objects) = resources(config, &generator, scale);
    let rendering = |errors| BenchError::RenderFailed { errors };
    // The warm-up render (it builds the lookup indexes) is a full render too: an
    // incremental render would leave its cache of snippet outputs in the renderer,
    // which no full render needs (the controller's memory, cache included, is
    // measured on the running controller).
    let mut rendered = renderer.render_full(&resources).map_err(rendering)?;
    let repeats = if scale >= LARGE_SCALE {
        RENDER_REPEATS_LARGE
    } else {
        RENDER_REPEATS_SMALL
    };
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        // The previous render is dropped first, outside the timing, so two renders
        // are never held at once.
        drop(rendered);
        let started = Instant::now();
        // A full render each time: with nothing changed, `render` would reuse every
        // file it may.
        rendered = renderer.render_full(&resources).map_err(rendering)?;
        times.push(millis(started.elapsed()));
    }
    let render_ms = median(times);

    let started = Instant::now();
    validator::validate_phase1(&rendered).map_err(|rejection| BenchError::Phase1Rejected {
        errors: rejection.errors,
    })?;
    let phase1_ms = millis(started.elapsed());

    let started = Instant::now();
    validator::validate_phase2(&rendered, &build::validator_config(config))
        .await
        .map_err(|rejection| BenchError::Phase2Rejected {
            errors: rejection.errors,
        })?;
    let phase2_ms = millis(started.elapsed());

    Ok(ScaleReport {
        scale,
        objects,
        compile_ms,
        render_ms,
        phase1_ms,
        phase2_ms,
        peak_rss_bytes: peak_rss_bytes(),
    })
}

/// Why the child process measuring one scale gave no figures. Not retried: the
/// command exits with [`ChildError::exit_code`].
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// The path of this binary is unknown, so no child can be started.
    #[error("cannot find this executable: {error}")]
    ExecutableUnknown {
        /// The operating system's error.
        error: std::io::Error,
    },
    /// The child process could not be started.
    #[error("cannot start the measuring process: {error}")]
    SpawnFailed {
        /// The operating system's error.
        error: std::io::Error,
    },
    /// The child failed; it has already printed why on the inherited stderr, so the
    /// parent prints nothing more and exits with the child's code.
    #[error("the measuring process exited with code {code}")]
    ChildFailed {
        /// The child's exit code (1 when it has none, e.g. killed by a signal).
        code: u8,
    },
    /// The child's output is not a JSON report.
    #[error("the measuring process printed no report: {error}")]
    ReportUnreadable {
        /// The JSON parser's error.
        error: serde_json::Error,
    },
    /// The child's report has no scale in it.
    #[error("the measuring process measured nothing")]
    NothingMeasured,
    /// The task waiting for the child failed (panicked or was cancelled).
    #[error("the benchmark failed: {error}")]
    WaitFailed {
        /// The task's error.
        error: tokio::task::JoinError,
    },
}

impl ChildError {
    /// The exit code `hapwright bench` ends with: the child's own, or
    /// [`exit::FAILURE`].
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::ChildFailed { code } => *code,
            _ => exit::FAILURE,
        }
    }

    /// Whether the parent should print the message (the child already printed its
    /// own error).
    fn should_print(&self) -> bool {
        !matches!(self, Self::ChildFailed { .. })
    }
}

/// Measures one scale in a child process of this binary (`bench --in-process`), so
/// its peak memory is its own.
///
/// # Errors
///
/// [`ChildError`]: the child failed (its stderr was passed through) or printed no
/// report.
pub fn measure_in_child(config_path: &Path, scale: usize) -> Result<ScaleReport, ChildError> {
    let exe = std::env::current_exe().map_err(|error| ChildError::ExecutableUnknown { error })?;
    let output = std::process::Command::new(exe)
        .arg("bench")
        .arg("-c")
        .arg(config_path)
        .arg("--scale")
        .arg(scale.to_string())
        .args(["--output", "json", "--in-process"])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|error| ChildError::SpawnFailed { error })?;
    if !output.status.success() {
        let code = output
            .status
            .code()
            .and_then(|c| u8::try_from(c).ok())
            .unwrap_or(exit::FAILURE);
        return Err(ChildError::ChildFailed { code });
    }
    let report: BenchReport = serde_json::from_slice(&output.stdout)
        .map_err(|error| ChildError::ReportUnreadable { error })?;
    report
        .scales
        .into_iter()
        .next()
        .ok_or(ChildError::NothingMeasured)
}

/// The text table of a report.
pub fn format_text(report: &BenchReport) -> String {
    let mut out = String::from(
        "     scale    objects  compile ms   render ms   phase1 ms   phase2 ms   peak RSS MiB\n",
    );
    for s in &report.scales {
        out.push_str(&format!(
            "{:>10} {:>10} {:>11.2} {:>11.2} {:>11.2} {:>11.2} {:>14.1}\n",
            s.scale,
            s.objects,
            s.compile_ms,
            s.render_ms,
            s.phase1_ms,
            s.phase2_ms,
            s.peak_rss_bytes as f64 / (1024.0 * 1024.0),
        ));
    }
    out
}

/// `bench -c FILE --scale LIST [--output text|json] [--in-process]`. Exit 0 when every
/// scale was measured, 1 when a template fails to compile or render or validation
/// rejects, 2 when the config file is invalid.
pub async fn command(path: &Path, scales: &[usize], output: OutputFormat, in_process: bool) -> u8 {
    let loaded = match crate::config::load(path) {
        Ok(loaded) => loaded,
        Err(errors) => {
            crate::commands::print_errors(&errors);
            return exit::CONFIG;
        }
    };
    let config = &loaded.config;
    if !in_process {
        // Fail fast, once, before starting a process per scale.
        if let Err(errors) = build::renderer(config) {
            crate::commands::print_errors(&errors);
            return exit::FAILURE;
        }
        if let Err(message) = generator(config) {
            eprintln!("{}: {message}", path.display());
            return exit::FAILURE;
        }
    }
    let mut report = BenchReport::default();
    for &scale in scales {
        let measured = if in_process {
            measure(config, scale)
                .await
                .map_err(|error| (exit::FAILURE, error.to_string()))
        } else {
            let path = path.to_owned();
            tokio::task::spawn_blocking(move || measure_in_child(&path, scale))
                .await
                .unwrap_or_else(|error| Err(ChildError::WaitFailed { error }))
                .map_err(|error| {
                    let message = if error.should_print() {
                        error.to_string()
                    } else {
                        String::new()
                    };
                    (error.exit_code(), message)
                })
        };
        match measured {
            Ok(scale) => report.scales.push(scale),
            Err((code, message)) => {
                if !message.is_empty() {
                    eprintln!("scale {scale}: {message}");
                }
                return code;
            }
        }
    }
    if output.print(&report, || format_text(&report)).is_err() {
        return exit::FAILURE;
    }
    exit::OK
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scales_parse_and_reject() {
        assert_eq!(parse_scales("10,100, 1_000").unwrap(), vec![10, 100, 1000]);
        assert_eq!(
            parse_scales("10,,100").unwrap_err(),
            ScaleError::NotANumber {
                item: String::new()
            }
        );
        assert!(
            parse_scales("10,,100")
                .unwrap_err()
                .to_string()
                .contains("``")
        );
        assert!(
            parse_scales("0")
                .unwrap_err()
                .to_string()
                .contains("at least 1")
        );
        assert!(
            parse_scales("ten")
                .unwrap_err()
                .to_string()
                .contains("`ten`")
        );
    }

    #[test]
    fn rename_suffixes_names_and_references() {
        let names = BTreeSet::from(["web".to_owned()]);
        let mut object = json!({"metadata": {"name": "web", "labels": {"app": "web", "x": "webby"}}, "list": ["web"]});
        rename(&mut object, &names, "-3");
        assert_eq!(
            object,
            json!({"metadata": {"name": "web-3", "labels": {"app": "web-3", "x": "webby"}}, "list": ["web-3"]})
        );
    }

    #[test]
    fn status_fields_parse() {
        let status = "Name:\thapwright\nVmHWM:\t   12345 kB\nVmRSS:\t 100 kB\n";
        assert_eq!(parse_status_kb(status, "VmHWM:"), Some(12345));
        assert_eq!(parse_status_kb(status, "VmRSS:"), Some(100));
        assert_eq!(parse_status_kb(status, "VmPeak:"), None);
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }
}
