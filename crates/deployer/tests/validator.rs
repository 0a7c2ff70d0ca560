//! The two-phase validator against the real `haproxy` binary (2.6, as Debian ships
//! it): invalid output is rejected in phase 1 or 2 with the rendered line and the
//! template line that produced it; valid output passes with HAProxy's warnings.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::component::validator::{self, Rejection, Validator};
use hapwright_eventbus::model::{
    FileKind, LineOrigin, RenderedConfig, RenderedFileRef, Severity, SourceLocation, SourceMap,
};
use hapwright_eventbus::{
    Bus, BusConfig, BusMetrics, CorrelationId, EventKind, EventMeta, EventPayload, Kernel,
    TemplateRendered, ValidationPhase,
};
use prometheus::Registry;
use tokio::time::timeout;

/// Bound for every wait in this file.
const WAIT: Duration = Duration::from_secs(30);

/// The haproxy binary under test: `HAPWRIGHT_TEST_HAPROXY`, else Debian's path,
/// else `haproxy` from `PATH`.
fn haproxy() -> PathBuf {
    if let Some(path) = std::env::var_os("HAPWRIGHT_TEST_HAPROXY") {
        return PathBuf::from(path);
    }
    let debian = Path::new("/usr/sbin/haproxy");
    if debian.exists() {
        debian.to_path_buf()
    } else {
        PathBuf::from("haproxy")
    }
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn settings(scratch: &Path, envs: Vec<BTreeMap<String, String>>) -> validator::Config {
    validator::Config {
        binary: haproxy(),
        envs,
        timeout: WAIT,
        scratch_root: Some(scratch.to_path_buf()),
        equivalence: true,
    }
}

/// A render whose main template includes the snippet `backend-servers`, producing rendered lines `snippet` (1-based, inclusive); the
/// other rendered lines come from `haproxy.cfg` lines shifted accordingly. `maps`
/// and `files` map their lines one to one to `maps/<name>` / `files/<name>`.
fn render(
    main: &str,
    snippet: std::ops::RangeInclusive<u32>,
    maps: &[(&str, &str)],
    files: &[(&str, &str)],
) -> RenderedConfig {
    let mut source_map = SourceMap::default();
    let lines = u32::try_from(main.lines().count()).unwrap();
    let snippet_len = snippet.end() - snippet.start() + 1;
    let origins = (1..=lines)
        .map(|line| {
            let (template, line) = if snippet.contains(&line) {
                ("backend-servers", line - snippet.start() + 1)
            } else if line > *snippet.end() {
                ("haproxy.cfg", line - snippet_len + 1)
            } else {
                ("haproxy.cfg", line)
            };
            Some(LineOrigin {
                template: template.into(),
                line,
            })
        })
        .collect();
    source_map.insert(
        RenderedFileRef {
            kind: FileKind::Main,
            name: "haproxy.cfg".into(),
        },
        origins,
    );
    let mut named = |kind: FileKind, entries: &[(&str, &str)]| {
        let mut out = BTreeMap::new();
        for (name, content) in entries {
            let file = RenderedFileRef {
                kind,
                name: (*name).to_owned(),
            };
            let template: Arc<str> = file.relative_path().into();
            let count = u32::try_from(content.lines().count()).unwrap();
            source_map.insert(
                file,
                (1..=count)
                    .map(|line| {
                        Some(LineOrigin {
                            template: template.clone(),
                            line,
                        })
                    })
                    .collect(),
            );
            out.insert((*name).to_owned(), Arc::from(*content));
        }
        out
    };
    let maps = named(FileKind::Map, maps);
    let files = named(FileKind::File, files);
    RenderedConfig::new(main, maps, files, BTreeMap::new(), source_map)
}

/// Rendered from a main template whose line 14 is `{% include "backend-servers" %}`;
/// the snippet renders lines 14–15.
const VALID: &str = "global
    log stderr format short local0 notice

defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s

frontend fe_main
    bind \"127.0.0.1:${HTTP_PORT}\"
    use_backend %[req.hdr(host),lower,map(maps/hosts.map,be_default)]
    default_backend be_default
backend be_default
    server s1 127.0.0.1:9001
";

fn valid() -> RenderedConfig {
    render(
        VALID,
        14..=15,
        &[("hosts.map", "example.com be_default\n")],
        &[],
    )
}

fn http_port() -> Vec<BTreeMap<String, String>> {
    vec![env(&[("HTTP_PORT", "18080")])]
}

fn rejected(result: Result<Vec<hapwright_eventbus::model::Diagnostic>, Rejection>) -> Rejection {
    match result {
        Ok(warnings) => panic!("expected a rejection, got success with {warnings:?}"),
        Err(rejection) => rejection,
    }
}

fn at(file: &str, line: u32) -> Option<SourceLocation> {
    Some(SourceLocation::new(file, Some(line), None))
}

async fn check(
    rendered: &RenderedConfig,
    config: &validator::Config,
) -> Result<Vec<hapwright_eventbus::model::Diagnostic>, Rejection> {
    timeout(WAIT * 2, validator::validate(rendered, config))
        .await
        .expect("validation finished in time")
}

fn is_empty_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().next().is_none()
}

#[tokio::test]
async fn valid_config_passes_both_phases_and_cleans_up() {
    let scratch = tempfile::tempdir().unwrap();
    // The map is referenced by a relative path inside a log-format expression: it is
    // only found because haproxy runs in the scratch directory.
    let warnings = check(&valid(), &settings(scratch.path(), http_port()))
        .await
        .unwrap();
    assert_eq!(warnings, []);
    assert!(is_empty_dir(scratch.path()), "scratch directory removed");
}

#[tokio::test]
async fn phase1_rejects_with_template_lines() {
    let scratch = tempfile::tempdir().unwrap();
    let text = VALID.replace(
        "    server s1 127.0.0.1:9001\n",
        "    server s1 127.0.0.1:9001\nbackend be_default\n",
    );
    let rendered = render(&text, 14..=15, &[("hosts.map", "a b\n")], &[]);
    let rejection = rejected(check(&rendered, &settings(scratch.path(), http_port())).await);
    assert_eq!(rejection.phase, ValidationPhase::Parse);
    assert!(!rejection.tool_failure);
    assert_eq!(rejection.errors.len(), 1);
    let error = &rejection.errors[0];
    assert_eq!(error.location, at("haproxy.cfg", 16));
    assert_eq!(error.origin, at("haproxy.cfg", 15));
    assert_eq!(error.source_line.as_deref(), Some("backend be_default"));
    assert_eq!(
        error.to_string(),
        "haproxy.cfg:16: backend 'be_default' has the same name as backend 'be_default' declared at haproxy.cfg:14. (from haproxy.cfg:15)"
    );
    assert!(is_empty_dir(scratch.path()), "phase 2 never ran");

    // A missing map and a missing backend, both caught before haproxy runs.
    let text = VALID.replace("default_backend be_default", "default_backend be_nope");
    let rendered = render(&text, 14..=15, &[], &[]);
    let rejection = rejected(check(&rendered, &settings(scratch.path(), http_port())).await);
    assert_eq!(rejection.phase, ValidationPhase::Parse);
    let lines: Vec<_> = rejection
        .errors
        .iter()
        .map(|e| e.location.clone())
        .collect();
    assert_eq!(lines, [at("haproxy.cfg", 12), at("haproxy.cfg", 13)]);
    assert!(
        rejection.errors[0]
            .message
            .contains("'maps/hosts.map', which is not a rendered file")
    );
}

#[tokio::test]
async fn phase2_rejects_with_snippet_lines() {
    let scratch = tempfile::tempdir().unwrap();
    let text = VALID.replace(
        "    server s1 127.0.0.1:9001\n",
        "    server s1 127.0.0.1:9001\n    serer s2 127.0.0.1:9002\n",
    );
    let rendered = render(&text, 14..=16, &[("hosts.map", "a b\n")], &[]);
    let rejection = rejected(check(&rendered, &settings(scratch.path(), http_port())).await);
    assert_eq!(rejection.phase, ValidationPhase::Haproxy);
    assert!(!rejection.tool_failure);
    assert_eq!(rejection.errors.len(), 1, "{:?}", rejection.errors);
    let error = &rejection.errors[0];
    assert_eq!(error.severity, Severity::Error);
    assert_eq!(error.location, at("haproxy.cfg", 16));
    assert_eq!(error.origin, at("backend-servers", 3));
    assert_eq!(
        error.source_line.as_deref(),
        Some("serer s2 127.0.0.1:9002")
    );
    assert!(
        error
            .message
            .starts_with("unknown keyword 'serer' in 'backend' section"),
        "{}",
        error.message
    );
    assert!(
        is_empty_dir(scratch.path()),
        "scratch directory removed after a rejection"
    );
}

#[tokio::test]
async fn location_less_alerts_land_on_the_directive() {
    let scratch = tempfile::tempdir().unwrap();
    // Phase 1 cannot know what "${BE}" expands to; haproxy reports it without a line.
    let text = VALID.replace("default_backend be_default", "default_backend \"${BE}\"");
    let rendered = render(&text, 14..=15, &[("hosts.map", "a b\n")], &[]);
    let envs = vec![env(&[("HTTP_PORT", "18080"), ("BE", "be_elsewhere")])];
    let rejection = rejected(check(&rendered, &settings(scratch.path(), envs)).await);
    assert_eq!(rejection.phase, ValidationPhase::Haproxy);
    let error = &rejection.errors[0];
    assert_eq!(
        error.message,
        "Proxy 'fe_main': unable to find required default_backend: 'be_elsewhere'."
    );
    assert_eq!(error.location, at("haproxy.cfg", 13));
    assert_eq!(error.origin, at("haproxy.cfg", 13));
    assert_eq!(
        error.source_line.as_deref(),
        Some("default_backend \"${BE}\"")
    );
}

#[tokio::test]
async fn every_instance_environment_is_validated() {
    let scratch = tempfile::tempdir().unwrap();
    let good = env(&[("HTTP_PORT", "18080")]);
    let bad = env(&[("HTTP_PORT", "notaport")]);
    // Duplicates run once; the bad environment is named in the error.
    let envs = vec![good.clone(), good.clone(), bad];
    let rejection = rejected(check(&valid(), &settings(scratch.path(), envs)).await);
    assert_eq!(rejection.phase, ValidationPhase::Haproxy);
    let error = &rejection.errors[0];
    assert_eq!(error.location, at("haproxy.cfg", 11));
    assert!(
        error.message.ends_with("(with HTTP_PORT=notaport)"),
        "{}",
        error.message
    );
    assert!(
        check(
            &valid(),
            &settings(scratch.path(), vec![good.clone(), good])
        )
        .await
        .is_ok()
    );
    // No environment at all: `${HTTP_PORT}` expands to nothing.
    let rejection = rejected(check(&valid(), &settings(scratch.path(), vec![])).await);
    assert!(
        rejection.errors[0]
            .message
            .contains("missing port specification"),
        "{:?}",
        rejection.errors
    );
}

#[tokio::test]
async fn pattern_file_errors_point_into_the_rendered_file() {
    let scratch = tempfile::tempdir().unwrap();
    let text = VALID.replace(
        "    default_backend be_default\n",
        "    default_backend be_default\n    acl blocked src -f files/ips.acl\n    http-request deny if blocked\n",
    );
    let rendered = render(
        &text,
        16..=17,
        &[("hosts.map", "a b\n")],
        &[("ips.acl", "10.0.0.1\nnot-an-ip\n")],
    );
    let rejection = rejected(check(&rendered, &settings(scratch.path(), http_port())).await);
    assert_eq!(rejection.phase, ValidationPhase::Haproxy);
    let error = &rejection.errors[0];
    assert_eq!(error.location, at("files/ips.acl", 2));
    assert_eq!(error.origin, at("files/ips.acl", 2));
    assert_eq!(error.source_line.as_deref(), Some("not-an-ip"));
    assert!(
        error.message.ends_with("(loaded at haproxy.cfg:14)"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn warnings_are_returned_with_their_lines() {
    let scratch = tempfile::tempdir().unwrap();
    let text = format!(
        "{VALID}listen tcp_only\n    bind 127.0.0.1:18081\n    mode tcp\n    option httplog\n    server s 127.0.0.1:9002\n"
    );
    let rendered = render(&text, 14..=15, &[("hosts.map", "a b\n")], &[]);
    let warnings = check(&rendered, &settings(scratch.path(), http_port()))
        .await
        .unwrap();
    assert!(!warnings.is_empty());
    let httplog = warnings
        .iter()
        .find(|w| w.message.contains("'option httplog' not usable"))
        .expect("the httplog warning");
    assert_eq!(httplog.severity, Severity::Warning);
    assert_eq!(httplog.location, at("haproxy.cfg", 19));
    assert_eq!(httplog.origin, at("haproxy.cfg", 18));
    assert_eq!(httplog.source_line.as_deref(), Some("option httplog"));
}

#[tokio::test]
async fn a_config_without_listeners_is_rejected() {
    let scratch = tempfile::tempdir().unwrap();
    let rendered = render("backend be\n    server s 127.0.0.1:9001\n", 0..=0, &[], &[]);
    let rejection = rejected(check(&rendered, &settings(scratch.path(), vec![])).await);
    assert_eq!(rejection.phase, ValidationPhase::Haproxy);
    assert!(!rejection.tool_failure);
    assert!(
        rejection.errors[0].message.contains("exited with code 2"),
        "{:?}",
        rejection.errors
    );
    assert!(
        rejection.errors[0].message.contains("no listener"),
        "{:?}",
        rejection.errors
    );
}

#[tokio::test]
async fn a_hanging_binary_is_killed_at_the_timeout() {
    let scratch = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let (script, pid_file) = hanging_binary(bin.path());
    let config = validator::Config {
        binary: script,
        envs: vec![],
        timeout: Duration::from_secs(2),
        scratch_root: Some(scratch.path().to_path_buf()),
        equivalence: true,
    };
    let rejection = rejected(check(&valid(), &config).await);
    assert!(rejection.tool_failure);
    assert_eq!(rejection.phase, ValidationPhase::Haproxy);
    assert!(
        rejection.errors[0]
            .message
            .contains("did not finish within 2s"),
        "{:?}",
        rejection.errors
    );
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    assert!(
        !Path::new(&format!("/proc/{}", pid.trim())).exists(),
        "the process was killed and reaped"
    );
    assert!(is_empty_dir(scratch.path()));
}

/// A stand-in binary that records its pid and hangs, for the timeout and
/// cancellation paths (real haproxy never hangs on `-c`).
fn hanging_binary(dir: &Path) -> (PathBuf, PathBuf) {
    stand_in(
        dir,
        "slow-haproxy",
        "#!/bin/sh\necho $$ > {pid}.tmp\nmv {pid}.tmp {pid}\nexec sleep 60\n",
    )
}

/// Writes the executable shell script `name` into `dir`, `{pid}` in `script` being
/// the pid file it may write; returns the script and the pid file.
fn stand_in(dir: &Path, name: &str, script: &str) -> (PathBuf, PathBuf) {
    let path = dir.join(name);
    let pid_file = dir.join("pid");
    std::fs::write(
        &path,
        script.replace("{pid}", &pid_file.display().to_string()),
    )
    .unwrap();
    let mut permissions = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&path, permissions).unwrap();
    (path, pid_file)
}

/// Whether a process is gone or a zombie awaiting its reaper.
fn is_dead(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(") ")
            .next()
            .is_some_and(|rest| rest.starts_with('Z')),
    }
}

/// The validator component alone in a kernel, with the test's subscription to its
/// answers (made before the kernel started).
struct Component {
    registry: Registry,
    bus: Bus,
    running: hapwright_eventbus::RunningKernel,
    answers: hapwright_eventbus::Subscription,
}

fn start_validator(config: validator::Config) -> Component {
    let registry = Registry::new();
    let bus = Bus::new(
        BusConfig::default(),
        &BusMetrics::register(&registry).unwrap(),
    );
    let answers = bus
        .subscribe(
            "probe",
            [EventKind::ValidationCompleted, EventKind::ValidationFailed],
        )
        .unwrap();
    let mut kernel = Kernel::new(bus.clone());
    kernel.register(Validator::new(
        config,
        validator::Metrics::register(&registry).unwrap(),
    ));
    let running = kernel.start().unwrap();
    Component {
        registry,
        bus,
        running,
        answers,
    }
}

/// Settings that run the hanging stand-in `binary`, killed after `timeout`.
fn hanging(binary: PathBuf, scratch: &Path, timeout: Duration) -> validator::Config {
    validator::Config {
        binary,
        timeout,
        ..settings(scratch, vec![])
    }
}

/// The stand-in's pid, once it runs (it renames its pid file into place). A process
/// has no event to wait on, so this polls, bounded by [`WAIT`].
async fn started_pid(pid_file: &Path) -> String {
    timeout(WAIT, async {
        loop {
            if let Ok(pid) = std::fs::read_to_string(pid_file) {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the stand-in binary started")
}

/// Waits (polling, bounded by [`WAIT`]) until `done` holds.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    timeout(WAIT, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}"));
}

#[tokio::test]
async fn shutdown_during_validation_kills_haproxy() {
    let scratch = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let (script, pid_file) = hanging_binary(bin.path());
    let component = start_validator(hanging(script, scratch.path(), Duration::from_secs(120)));
    component.bus.publisher().publish(TemplateRendered {
        config: Arc::new(valid()),
        duration: Duration::ZERO,
        render: Default::default(),
    });
    let pid = started_pid(&pid_file).await;
    let report = timeout(WAIT, component.running.shutdown(WAIT))
        .await
        .unwrap();
    assert_eq!(report.stopped, ["validator"]);
    eventually(
        "the child was killed when the validation was dropped",
        || is_dead(&pid),
    )
    .await;
    assert!(is_empty_dir(scratch.path()), "scratch directory removed");
}

#[tokio::test]
async fn a_missing_binary_is_a_tool_failure() {
    let scratch = tempfile::tempdir().unwrap();
    let config = validator::Config {
        binary: PathBuf::from("/nonexistent/haproxy"),
        ..settings(scratch.path(), vec![])
    };
    let rejection = rejected(check(&valid(), &config).await);
    assert!(rejection.tool_failure);
    assert!(
        rejection.errors[0].message.starts_with(
            "cannot run HAProxy: haproxy.binary `/nonexistent/haproxy` is not an executable file"
        ),
        "{:?}",
        rejection.errors
    );
    assert!(
        rejection
            .to_string()
            .starts_with("phase 2 (haproxy -c) rejected the configuration\n  cannot run")
    );
}

#[tokio::test]
async fn unsafe_file_names_never_leave_the_scratch_directory() {
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("root");
    let rendered = render(
        VALID,
        14..=15,
        &[("hosts.map", "a b\n"), ("../../escape", "x\n")],
        &[],
    );
    let rejection = rejected(check(&rendered, &settings(&root, http_port())).await);
    assert_eq!(rejection.phase, ValidationPhase::Parse);
    assert!(
        rejection.errors[0]
            .message
            .contains("'../../escape' is not a plain file name")
    );
    assert!(!scratch.path().join("escape").exists());
}

#[tokio::test]
async fn component_replies_on_the_bus_with_the_correlation_id() {
    let scratch = tempfile::tempdir().unwrap();
    let Component {
        registry,
        bus,
        running,
        answers: mut probe,
    } = start_validator(settings(scratch.path(), http_port()));

    let publisher = bus.publisher();
    let good = CorrelationId::new();
    publisher.publish_with(
        TemplateRendered {
            config: Arc::new(valid()),
            duration: Duration::ZERO,
            render: Default::default(),
        },
        EventMeta::correlated(good),
    );
    // Answered before the next render arrives (a newer one would supersede it).
    let first = timeout(WAIT, probe.recv()).await.unwrap().unwrap();
    let bad = CorrelationId::new();
    let broken = render(
        "frontend fe\n    bind :80\n    default_backend nope\n",
        0..=0,
        &[],
        &[],
    );
    publisher.publish_with(
        TemplateRendered {
            config: Arc::new(broken.clone()),
            duration: Duration::ZERO,
            render: Default::default(),
        },
        EventMeta::correlated(bad),
    );

    assert_eq!(first.correlation_id, Some(good));
    match &first.payload {
        EventPayload::ValidationCompleted(done) => {
            assert_eq!(done.config.hash(), valid().hash());
            assert!(done.warnings.is_empty());
        }
        other => panic!("expected ValidationCompleted, got {other:?}"),
    }
    let second = timeout(WAIT, probe.recv()).await.unwrap().unwrap();
    assert_eq!(second.correlation_id, Some(bad));
    match &second.payload {
        EventPayload::ValidationFailed(failed) => {
            assert_eq!(failed.hash, broken.hash());
            assert_eq!(failed.phase, ValidationPhase::Parse);
            assert_eq!(failed.errors[0].location, at("haproxy.cfg", 3));
        }
        other => panic!("expected ValidationFailed, got {other:?}"),
    }

    let text = metrics_text(&registry);
    assert!(
        text.contains(r#"hapwright_validations_total{phase="parse",result="success"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"hapwright_validations_total{phase="parse",result="failure"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"hapwright_validations_total{phase="haproxy",result="success"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"hapwright_validation_duration_seconds_count{phase="haproxy"} 1"#),
        "{text}"
    );
    let report = running.shutdown(WAIT).await;
    assert_eq!(report.stopped, ["validator"]);
    assert!(report.aborted.is_empty());
}

fn metrics_text(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus::TextEncoder::new()
        .encode_utf8(&registry.gather(), &mut out)
        .unwrap();
    out
}

#[tokio::test]
async fn the_component_sweeps_dead_scratch_dirs_and_names_its_own_with_its_pid() {
    let scratch = tempfile::tempdir().unwrap();
    // What a controller killed during phase 2 leaves behind: a reaped child's pid.
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let left = scratch
        .path()
        .join(format!("{}{dead_pid}-AbCdEf", validator::SCRATCH_PREFIX));
    std::fs::create_dir_all(left.join("maps")).unwrap();
    std::fs::write(left.join("haproxy.cfg"), "global\n").unwrap();

    let bin = tempfile::tempdir().unwrap();
    let (script, pid_file) = hanging_binary(bin.path());
    let component = start_validator(hanging(script, scratch.path(), Duration::from_secs(120)));
    component.bus.publisher().publish(TemplateRendered {
        config: Arc::new(valid()),
        duration: Duration::ZERO,
        render: Default::default(),
    });
    let pid = started_pid(&pid_file).await;
    let names: Vec<String> = std::fs::read_dir(scratch.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let report = timeout(WAIT, component.running.shutdown(WAIT))
        .await
        .unwrap();
    assert_eq!(report.stopped, ["validator"]);
    eventually("the child was killed", || is_dead(&pid)).await;
    assert!(
        !left.exists(),
        "the dead controller's scratch dir was swept"
    );
    let own = format!("{}{}-", validator::SCRATCH_PREFIX, std::process::id());
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].starts_with(&own), "{names:?}");
    assert!(is_empty_dir(scratch.path()), "scratch directory removed");
}

/// A render that is not close to the last one that passed starts `haproxy -c`
/// alongside phase 1; when phase 1 then rejects it, that run is stopped: the
/// rejection does not wait for it, its child is killed and its scratch directory
/// removed. Whether the stand-in gets to start before phase 1 ends depends on the
/// machine's load, so the scenario runs until it has (at most 5 times); every
/// attempt must leave nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_phase1_rejection_stops_the_haproxy_run_started_alongside_it() {
    let mut started = 0;
    for _ in 0..5 {
        if phase1_rejection_with_early_run().await {
            started += 1;
            break;
        }
    }
    assert_eq!(
        started, 1,
        "the stand-in haproxy -c never started while phase 1 ran"
    );
}

/// One attempt of the test above: whether the stand-in had started.
async fn phase1_rejection_with_early_run() -> bool {
    let scratch = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let (script, pid_file) = hanging_binary(bin.path());
    // A timeout far beyond WAIT: a validator that waited for the stand-in would time
    // out this test.
    let Component {
        registry,
        bus,
        running,
        answers: mut probe,
    } = start_validator(hanging(script, scratch.path(), Duration::from_secs(600)));
    // Many backends, so that phase 1 takes long enough for the stand-in to start,
    // and a duplicate one at the end for phase 1 to reject.
    let mut text = VALID.to_owned();
    for i in 0..5_000 {
        text.push_str(&format!("backend be_{i}\n    server s1 127.0.0.1:9001\n"));
    }
    text.push_str("backend be_default\n    server s1 127.0.0.1:9001\n");
    let lines = u32::try_from(text.lines().count()).unwrap();
    bus.publisher().publish(TemplateRendered {
        config: Arc::new(render(&text, 14..=15, &[("hosts.map", "a b\n")], &[])),
        duration: Duration::ZERO,
        render: Default::default(),
    });
    let answer = timeout(WAIT, probe.recv()).await.unwrap().unwrap();
    match &answer.payload {
        EventPayload::ValidationFailed(failed) => {
            assert_eq!(failed.phase, ValidationPhase::Parse);
            assert_eq!(failed.errors[0].location, at("haproxy.cfg", lines - 1));
        }
        other => panic!("expected ValidationFailed, got {other:?}"),
    }
    let pid = std::fs::read_to_string(&pid_file).ok();
    eventually(
        "the early run was killed and its scratch directory removed",
        || pid.as_deref().is_none_or(is_dead) && is_empty_dir(scratch.path()),
    )
    .await;
    let text = metrics_text(&registry);
    // A stopped run is no validation: nothing is counted for phase 2.
    assert!(
        text.contains(r#"hapwright_validations_total{phase="haproxy",result="failure"} 0"#)
            && !text.contains(r#"hapwright_validation_duration_seconds_count{phase="haproxy"}"#),
        "{text}"
    );
    let report = timeout(WAIT, running.shutdown(WAIT)).await.unwrap();
    assert_eq!(report.stopped, ["validator"]);
    pid.is_some()
}

/// A stand-in for `haproxy` that hangs (recording its pid) on a config holding
/// `# hang-here`, and runs the real binary on any other.
fn hanging_on_marker(dir: &Path) -> (PathBuf, PathBuf) {
    stand_in(
        dir,
        "haproxy-hanging-on-marker",
        &format!(
            "#!/bin/sh\nif grep -q '# hang-here' haproxy.cfg; then\n  echo $$ > {{pid}}.tmp\n  mv {{pid}}.tmp {{pid}}\n  exec sleep 60\nfi\nexec {} \"$@\"\n",
            haproxy().display()
        ),
    )
}

/// The next answer of the validator: the hash it is about, and whether it passed.
async fn next_answer(component: &mut Component) -> (hapwright_eventbus::model::ContentHash, bool) {
    let event = timeout(WAIT, component.answers.recv())
        .await
        .expect("an answer")
        .expect("bus open");
    match &event.payload {
        EventPayload::ValidationCompleted(done) => (done.config.hash(), true),
        EventPayload::ValidationFailed(failed) => (failed.hash, false),
        other => panic!("not an answer: {other:?}"),
    }
}

/// Latest wins down to the validation: a render that arrives while an older one is
/// still in `haproxy -c` stops that run (the child is killed, the scratch directory
/// removed, `hapwright_validations_superseded_total` counts it), and only the newer
/// one is answered.
#[tokio::test]
async fn a_newer_render_stops_the_validation_of_the_superseded_one() {
    let scratch = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let (script, pid_file) = hanging_on_marker(bin.path());
    let mut component = start_validator(validator::Config {
        binary: script,
        ..settings(scratch.path(), http_port())
    });
    let superseded = Arc::new(render(
        &format!("{VALID}# hang-here\n"),
        14..=15,
        &[("hosts.map", "example.com be_default\n")],
        &[],
    ));
    let newer = Arc::new(valid());
    let publisher = component.bus.publisher();
    publisher.publish(TemplateRendered {
        config: superseded.clone(),
        duration: Duration::ZERO,
        render: Default::default(),
    });
    let pid = started_pid(&pid_file).await;
    publisher.publish(TemplateRendered {
        config: newer.clone(),
        duration: Duration::ZERO,
        render: Default::default(),
    });
    assert_eq!(next_answer(&mut component).await, (newer.hash(), true));
    eventually("the superseded haproxy -c was killed", || is_dead(&pid)).await;
    assert_eq!(
        support::counter(
            &component.registry,
            "hapwright_validations_superseded_total",
            &[]
        ),
        1
    );
    assert!(
        component.answers.try_recv().is_none(),
        "the superseded render is never answered"
    );
    component.running.shutdown(WAIT).await;
    assert!(is_empty_dir(scratch.path()), "scratch directories removed");
}

/// The render validated last, published again (an unchanged render), is answered
/// from memory: the same answer, without phase 1 or `haproxy -c` running again.
#[tokio::test]
async fn an_unchanged_render_is_answered_from_memory() {
    let scratch = tempfile::tempdir().unwrap();
    let mut component = start_validator(settings(scratch.path(), http_port()));
    let config = Arc::new(valid());
    let publish = |component: &Component| {
        component.bus.publisher().publish(TemplateRendered {
            config: config.clone(),
            duration: Duration::ZERO,
            render: Default::default(),
        });
    };
    publish(&component);
    assert_eq!(next_answer(&mut component).await, (config.hash(), true));
    let runs = |component: &Component| {
        support::counter(&component.registry, "hapwright_validations_total", &[])
    };
    let before = runs(&component);
    assert!(before >= 2, "phase 1 and haproxy -c ran once each");
    publish(&component);
    assert_eq!(next_answer(&mut component).await, (config.hash(), true));
    assert_eq!(runs(&component), before, "nothing ran again");
    assert_eq!(
        support::counter(
            &component.registry,
            "hapwright_validations_remembered_total",
            &[]
        ),
        1
    );

    // A rejected render is remembered the same way.
    let broken = Arc::new(RenderedConfig::main_only("backend be\n    server s1 \"x\n"));
    for _ in 0..2 {
        component.bus.publisher().publish(TemplateRendered {
            config: broken.clone(),
            duration: Duration::ZERO,
            render: Default::default(),
        });
        assert_eq!(next_answer(&mut component).await, (broken.hash(), false));
    }
    assert_eq!(
        support::counter(
            &component.registry,
            "hapwright_validations_remembered_total",
            &[]
        ),
        2
    );
    component.running.shutdown(WAIT).await;
}
