//! Shared helpers for hapwright's end-to-end tests, which run the real binary.
//!
//! [`Controller`] runs `hapwright run` on a private copy of `examples/quickstart/`
//! (free loopback ports, its own temporary directory, its own managed HAProxy) and
//! cleans everything up when dropped, also when a test panics: SIGTERM, a bounded
//! wait, SIGKILL, then SIGKILL for any HAProxy whose command line names the
//! temporary directory.
//!
//! Every wait here is an explicit poll with a short interval inside a bounded
//! timeout; nothing sleeps for luck.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub use rustix::process::Signal;
pub use serde_json::Value;

/// Default bound for waiting on the controller (generous: CI machines are busy).
pub const WAIT: Duration = Duration::from_secs(30);
/// Interval between two polls of a condition.
pub const POLL: Duration = Duration::from_millis(50);

/// Path of the `hapwright` binary built alongside these tests.
///
/// `cargo test --workspace` builds every member's binaries before running any test;
/// the binary sits next to the test executable's `deps/` directory. `HAPWRIGHT_BIN`
/// overrides the path (for testing an installed binary).
pub fn hapwright_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("HAPWRIGHT_BIN") {
        return PathBuf::from(path);
    }
    let mut dir = std::env::current_exe().expect("test executable path");
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let binary = dir.join(format!("hapwright{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "{} is missing: run the end-to-end tests with `cargo test --workspace` \
         (or `cargo build -p hapwright-app` first)",
        binary.display()
    );
    binary
}

/// The quickstart example the harness copies.
pub fn quickstart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/quickstart")
}

/// Polls `check` every [`POLL`] until it returns `Some`, for at most `timeout`.
///
/// Returns `Err` with the time waited when it never did.
pub fn poll<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Result<T, Duration> {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return Ok(value);
        }
        if start.elapsed() >= timeout {
            return Err(start.elapsed());
        }
        std::thread::sleep(POLL);
    }
}

// === ports ===

/// A loopback TCP port nobody listens on right now: the allocator every crate's
/// tests share.
pub use hapwright_eventbus::testing::free_port;

/// The loopback ports of one controller (the quickstart's in parentheses).
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    /// HAProxy's frontend (8080, `HTTP_PORT`).
    pub http: u16,
    /// `controller.listen` (9400): metrics, health, debug, status page.
    pub status: u16,
    /// Demo app "web v1" (9101).
    pub web_v1: u16,
    /// Demo app "web v2" (9102).
    pub web_v2: u16,
    /// Demo app "api" (9201).
    pub api: u16,
}

impl Ports {
    fn allocate() -> Self {
        Self {
            http: free_port(),
            status: free_port(),
            web_v1: free_port(),
            web_v2: free_port(),
            api: free_port(),
        }
    }

    /// The quickstart's port numbers and their replacements.
    fn substitutions(&self) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            ("8080", self.http.to_string()),
            ("9400", self.status.to_string()),
            ("9101", self.web_v1.to_string()),
            ("9102", self.web_v2.to_string()),
            ("9201", self.api.to_string()),
        ])
    }
}

/// Replaces every maximal run of ASCII digits that is a key of `map` (so `19101`
/// is not touched by a `9101` entry, and replacements are never rewritten again).
pub fn replace_numbers(text: &str, map: &BTreeMap<&'static str, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
        out.push_str(&rest[..start]);
        let digits = &rest[start..];
        let end = digits
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(digits.len());
        let number = &digits[..end];
        out.push_str(map.get(number).map_or(number, String::as_str));
        rest = &digits[end..];
    }
    out.push_str(rest);
    out
}

/// Replaces the one occurrence of `from` in `text`; panics when there is none (the
/// quickstart changed and the test needs updating).
pub fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "expected `{from}` in the text to edit:\n{text}"
    );
    text.replacen(from, to, 1)
}

/// Writes `content` to `path` atomically (temporary dot file, then rename), so
/// watchers never read a half-written file.
pub fn write_atomically(path: &Path, content: &str) {
    let name = path.file_name().expect("a file name").to_string_lossy();
    let temp = path.with_file_name(format!(".{name}.e2e-tmp"));
    fs::write(&temp, content).unwrap_or_else(|e| panic!("write {}: {e}", temp.display()));
    fs::rename(&temp, path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
}

/// A Service and its EndpointSlice in the quickstart's format: `host` routes to
/// `127.0.0.1:port`.
pub fn service_manifest(name: &str, host: &str, port: u16) -> String {
    format!(
        "apiVersion: v1\n\
         kind: Service\n\
         metadata:\n  name: {name}\n  namespace: default\n  annotations:\n    hapwright.io/host: {host}\n\
         spec:\n  ports: [{{ port: 80 }}]\n\
         ---\n\
         apiVersion: discovery.k8s.io/v1\n\
         kind: EndpointSlice\n\
         metadata:\n  name: {name}-1\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {name}\n\
         addressType: IPv4\n\
         ports: [{{ port: {port} }}]\n\
         endpoints:\n  - addresses: [\"127.0.0.1\"]\n    conditions: {{ ready: true }}\n"
    )
}

// === processes ===

/// Sends `signal` to `pid`; a process that is already gone is not an error.
pub fn send_signal(pid: u32, signal: Signal) {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    let _ = rustix::process::kill_process(pid, signal);
}

/// Sends `signal` to the process group `pgid`; a group that is gone is not an error.
pub fn signal_group(pgid: u32, signal: Signal) {
    let Some(pid) = i32::try_from(pgid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    let _ = rustix::process::kill_process_group(pid, signal);
}

/// Pids of the running processes named `name` (the executable's base name) whose
/// command line contains `needle`.
pub fn processes_matching(name: &str, needle: &str) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let mut args = raw.split(|b| *b == 0).map(String::from_utf8_lossy);
            let Some(program) = args.next() else {
                return false;
            };
            let base = program.rsplit('/').next().unwrap_or_default().to_owned();
            let line = String::from_utf8_lossy(&raw).replace('\0', " ");
            base == name && line.contains(needle)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether something accepts TCP connections on `127.0.0.1:port`.
pub fn accepts_connections(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).is_ok()
}

/// Strips ANSI colour sequences from log text.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

// === HAProxy master CLI ===

/// What `show proc` on the master CLI says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasterProcs {
    /// The master's pid.
    pub master_pid: u32,
    /// How many times the master reloaded.
    pub reloads: u64,
    /// Pids of the workers, newest first (as HAProxy lists them).
    pub workers: Vec<u32>,
}

/// Sends one command to a HAProxy master CLI socket and returns the answer.
pub fn master_command(socket: &Path, command: &str) -> std::io::Result<String> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(format!("{command}\n").as_bytes())?;
    // The master answers once the request side is closed.
    stream.shutdown(Shutdown::Write)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// Parses `show proc`.
pub fn parse_show_proc(text: &str) -> Option<MasterProcs> {
    let mut master = None;
    let mut workers = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [pid, "master", reloads, ..] => {
                master = Some((pid.parse().ok()?, reloads.parse().ok()?));
            }
            [pid, "worker", ..] => workers.push(pid.parse().ok()?),
            _ => {}
        }
    }
    let (master_pid, reloads) = master?;
    Some(MasterProcs {
        master_pid,
        reloads,
        workers,
    })
}

// === the controller ===

/// `/debug/instances` for one instance.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceStatus {
    /// Instance name.
    pub name: String,
    /// Hash of the config it runs.
    pub last_hash: Option<String>,
    /// `noop`, `runtime` or `reload`.
    pub last_strategy: Option<String>,
    /// The reason's detail text.
    pub last_reason: String,
    /// The reload reason (`first_deploy`, `structure`, ...) when it reloaded.
    pub reload_reason: Option<String>,
    /// Reloads hapwright performed (the first start counts).
    pub reloads: u64,
    /// Successful deployments.
    pub deployments: u64,
    /// The last error, if the last deployment failed.
    pub last_error: Option<Value>,
}

impl InstanceStatus {
    fn from_json(value: &Value) -> Self {
        let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
        Self {
            name: text("name").unwrap_or_default(),
            last_hash: text("last_hash"),
            last_strategy: text("last_strategy"),
            last_reason: value
                .pointer("/last_reason/detail")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            reload_reason: value
                .pointer("/last_reason/reload")
                .and_then(Value::as_str)
                .map(str::to_owned),
            reloads: value.get("reloads").and_then(Value::as_u64).unwrap_or(0),
            deployments: value
                .get("deployments")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            last_error: value.get("last_error").filter(|e| !e.is_null()).cloned(),
        }
    }
}

/// An answer through HAProxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Body text.
    pub body: String,
}

/// A running `hapwright run` on a private copy of the quickstart.
pub struct Controller {
    child: Option<Child>,
    ports: Ports,
    log: PathBuf,
    client: reqwest::blocking::Client,
    // Last field: removed after `Drop::drop` stopped every process using it.
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("dir", &self.dir.path())
            .field("ports", &self.ports)
            .finish_non_exhaustive()
    }
}

impl Controller {
    /// Starts the quickstart as is (ports aside) and waits until `/readyz` is 200.
    pub fn start() -> Self {
        Self::start_with(|config| config.to_owned())
    }

    /// Like [`start`](Self::start), with `edit` applied to `hapwright.yaml` (after
    /// the port rewrite) before the controller starts.
    pub fn start_with(edit: impl FnOnce(&str) -> String) -> Self {
        Self::start_with_env(edit, &[])
    }

    /// Like [`start_with`](Self::start_with), with extra environment variables for
    /// `hapwright run` (e.g. `HAPWRIGHT_FAULTS`).
    pub fn start_with_env(edit: impl FnOnce(&str) -> String, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("hapwright-e2e-")
            .tempdir()
            .expect("temporary directory");
        let ports = Ports::allocate();
        let substitutions = ports.substitutions();
        let source = quickstart_dir();

        let config = fs::read_to_string(source.join("hapwright.yaml")).expect("quickstart config");
        for (old, new) in [
            ("HTTP_PORT: \"8080\"", "HTTP_PORT"),
            ("listen: 127.0.0.1:9400", "controller.listen"),
            ("port: 9101", "web v1 demo app"),
            ("port: 9102", "web v2 demo app"),
            ("port: 9201", "api demo app"),
        ] {
            assert!(
                config.contains(old),
                "examples/quickstart/hapwright.yaml no longer has `{old}` ({new}): update the e2e harness"
            );
        }
        let config = edit(&replace_numbers(&config, &substitutions));
        fs::write(dir.path().join("hapwright.yaml"), config).expect("write config");

        let resources = dir.path().join("resources");
        fs::create_dir(&resources).expect("resources dir");
        for entry in fs::read_dir(source.join("resources")).expect("quickstart resources") {
            let path = entry.expect("dir entry").path();
            if !path.is_file() {
                continue;
            }
            let text = fs::read_to_string(&path).expect("read manifest");
            fs::write(
                resources.join(path.file_name().expect("file name")),
                replace_numbers(&text, &substitutions),
            )
            .expect("write manifest");
        }

        let log = dir.path().join("hapwright.log");
        let child = launch(dir.path(), &log, env);
        let client = reqwest::blocking::Client::builder()
            .no_proxy()
            // A new connection per request: what a reload must never refuse.
            .pool_max_idle_per_host(0)
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .build()
            .expect("HTTP client");
        let mut controller = Self {
            child: Some(child),
            ports,
            log,
            client,
            dir,
        };
        controller.wait_ready();
        controller
    }

    fn wait_ready(&mut self) {
        let outcome = poll(WAIT, || {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Some(Err(status));
            }
            match self.try_status_get("/readyz") {
                Ok((200, _)) => Some(Ok(())),
                _ => None,
            }
        });
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(status)) => self.fail(&format!("hapwright exited before ready: {status}")),
            Err(waited) => self.fail(&format!("/readyz not 200 after {waited:?}")),
        }
    }

    /// Panics with `message` and the end of the controller's log.
    pub fn fail(&self, message: &str) -> ! {
        panic!(
            "{message}\n--- hapwright log (last lines, {}) ---\n{}",
            self.log.display(),
            self.log_tail(60)
        )
    }

    /// The last `lines` lines of the controller's stdout and stderr.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = strip_ansi(&fs::read_to_string(&self.log).unwrap_or_default());
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The whole log so far.
    pub fn log_text(&self) -> String {
        strip_ansi(&fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// Polls `check` until it returns `Some`, for at most `timeout`; panics with
    /// `what` and the log otherwise.
    pub fn wait_until<T>(
        &self,
        what: &str,
        timeout: Duration,
        check: impl FnMut() -> Option<T>,
    ) -> T {
        poll(timeout, check)
            .unwrap_or_else(|waited| self.fail(&format!("timed out after {waited:?}: {what}")))
    }

    /// The temporary directory holding the config, resources and run directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The config file.
    pub fn config_path(&self) -> PathBuf {
        self.dir().join("hapwright.yaml")
    }

    /// A file under `resources/`.
    pub fn resource_path(&self, name: &str) -> PathBuf {
        self.dir().join("resources").join(name)
    }

    /// The HAProxy master CLI socket.
    pub fn master_socket(&self) -> PathBuf {
        self.dir().join("run/master.sock")
    }

    /// The ports in use.
    pub fn ports(&self) -> Ports {
        self.ports
    }

    /// The pid of `hapwright run`.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Replaces the config file's content (atomically).
    pub fn write_config(&self, content: &str) {
        write_atomically(&self.config_path(), content);
    }

    /// The config file's content.
    pub fn read_config(&self) -> String {
        fs::read_to_string(self.config_path()).expect("read config")
    }

    /// Replaces (or creates) a file under `resources/` (atomically).
    pub fn write_resource(&self, name: &str, content: &str) {
        write_atomically(&self.resource_path(name), content);
    }

    /// A file under `resources/`.
    pub fn read_resource(&self, name: &str) -> String {
        fs::read_to_string(self.resource_path(name)).expect("read resource")
    }

    /// Moves the quickstart's `web` EndpointSlice to the other web demo app (a
    /// runtime change); returns the new port.
    pub fn move_web(&self) -> u16 {
        let ports = self.ports();
        let manifest = self.read_resource("web.yaml");
        let (from, to) = if manifest.contains(&format!("port: {}", ports.web_v1)) {
            (ports.web_v1, ports.web_v2)
        } else {
            (ports.web_v2, ports.web_v1)
        };
        self.write_resource(
            "web.yaml",
            &replace_once(&manifest, &format!("port: {from}"), &format!("port: {to}")),
        );
        to
    }

    // --- HTTP ---

    fn try_status_get(&self, path: &str) -> Result<(u16, String), reqwest::Error> {
        let response = self
            .client
            .get(format!("http://127.0.0.1:{}{path}", self.ports.status))
            .send()?;
        let status = response.status().as_u16();
        Ok((status, response.text()?))
    }

    /// `GET` on the controller's listener: status and body.
    pub fn status_get(&self, path: &str) -> (u16, String) {
        self.try_status_get(path)
            .unwrap_or_else(|e| self.fail(&format!("GET {path}: {e}")))
    }

    /// `POST` on the controller's listener, with the headers the lifecycle endpoints
    /// require (`X-Hapwright-Reload: 1` for `/-/reload`, `X-Hapwright-Approve: 1`
    /// for `/-/approve`): status and body.
    pub fn status_post(&self, path: &str) -> (u16, String) {
        let url = format!("http://127.0.0.1:{}{path}", self.ports.status);
        let request = self
            .client
            .post(url)
            .header("X-Hapwright-Reload", "1")
            .header("X-Hapwright-Approve", "1");
        let result = request.send().and_then(|r| {
            let status = r.status().as_u16();
            Ok((status, r.text()?))
        });
        result.unwrap_or_else(|e| self.fail(&format!("POST {path}: {e}")))
    }

    /// `GET` a JSON endpoint of the controller, expecting 200.
    pub fn json(&self, path: &str) -> Value {
        let (status, body) = self.status_get(path);
        if status != 200 {
            self.fail(&format!("GET {path}: status {status}: {body}"));
        }
        serde_json::from_str(&body)
            .unwrap_or_else(|e| self.fail(&format!("GET {path}: not JSON ({e}): {body}")))
    }

    /// The status page HTML.
    pub fn status_page(&self) -> String {
        let (status, body) = self.status_get("/");
        if status != 200 {
            self.fail(&format!("GET /: status {status}: {body}"));
        }
        body
    }

    /// One request through HAProxy with `Host: host`, on a new connection.
    pub fn route(&self, host: &str) -> Result<Reply, String> {
        let response = self
            .client
            .get(format!("http://127.0.0.1:{}/", self.ports.http))
            .header(reqwest::header::HOST, host)
            .send()
            .map_err(|e| format!("{e:?}"))?;
        let status = response.status().as_u16();
        let body = response.text().map_err(|e| format!("{e:?}"))?;
        Ok(Reply { status, body })
    }

    /// The body HAProxy answers for `host`, expecting 200.
    pub fn body(&self, host: &str) -> String {
        match self.route(host) {
            Ok(Reply { status: 200, body }) => body,
            other => self.fail(&format!("request for {host}: {other:?}")),
        }
    }

    /// Waits until HAProxy answers `host` with 200 and `body`.
    pub fn wait_for_body(&self, host: &str, body: &str) {
        let mut last = None;
        let found = poll(WAIT, || match self.route(host) {
            Ok(Reply {
                status: 200,
                body: b,
            }) if b == body => Some(()),
            other => {
                last = Some(other);
                None
            }
        });
        if found.is_err() {
            self.fail(&format!(
                "HAProxy never answered {body:?} for {host}; last answer {last:?}"
            ));
        }
    }

    /// The body a quickstart demo app on `port` answers with.
    pub fn demo_body(&self, port: u16) -> String {
        let p = self.ports;
        let name = if port == p.web_v1 {
            "web v1"
        } else if port == p.web_v2 {
            "web v2"
        } else if port == p.api {
            "api"
        } else {
            panic!("{port} is not a demo app port")
        };
        format!("{name} (port {port})\n")
    }

    /// The instance `local` in `/debug/instances`.
    pub fn instance(&self) -> InstanceStatus {
        let all = self.json("/debug/instances");
        let found = all
            .as_array()
            .and_then(|list| {
                list.iter()
                    .find(|i| i.get("name").and_then(Value::as_str) == Some("local"))
            })
            .map(InstanceStatus::from_json);
        found.unwrap_or_else(|| self.fail(&format!("no instance `local` in {all}")))
    }

    /// The value of one series in `/metrics`, e.g.
    /// `hapwright_config_reloads_total{result="success"}`; 0 when absent.
    pub fn metric(&self, series: &str) -> f64 {
        let (_, text) = self.status_get("/metrics");
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .map_or(0.0, |v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|e| self.fail(&format!("metric {series} = {v}: {e}")))
            })
    }

    /// The hash of the last render (`/debug/rendered`).
    pub fn rendered_hash(&self) -> Option<String> {
        let (status, body) = self.status_get("/debug/rendered");
        if status != 200 {
            return None;
        }
        let value: Value = serde_json::from_str(&body).ok()?;
        value.get("hash")?.as_str().map(str::to_owned)
    }

    /// Waits until the instance runs the last rendered config and returns its status.
    pub fn wait_deployed(&self) -> InstanceStatus {
        self.wait_until("the instance runs the last render", WAIT, || {
            let instance = self.instance();
            let rendered = self.rendered_hash()?;
            (instance.last_hash.as_deref() == Some(rendered.as_str())).then_some(instance)
        })
    }

    /// `show proc` on the managed HAProxy's master CLI.
    pub fn master(&self) -> MasterProcs {
        let socket = self.master_socket();
        let text = master_command(&socket, "show proc")
            .unwrap_or_else(|e| self.fail(&format!("show proc on {}: {e}", socket.display())));
        parse_show_proc(&text).unwrap_or_else(|| self.fail(&format!("bad show proc:\n{text}")))
    }

    /// Pids of the HAProxy processes of this controller (master and workers).
    pub fn haproxy_pids(&self) -> Vec<u32> {
        processes_matching("haproxy", &self.process_needle())
    }

    /// What the command lines of this controller's processes contain: the temporary
    /// directory with a trailing slash (so no other directory's name matches).
    fn process_needle(&self) -> String {
        format!("{}/", self.dir().display())
    }

    // --- signals and shutdown ---

    /// Sends `signal` to `hapwright run`.
    pub fn signal(&self, signal: Signal) {
        if let Some(child) = &self.child {
            send_signal(child.id(), signal);
        }
    }

    /// SIGKILLs `hapwright run` alone, as a crash or an OOM kill would: whatever it
    /// started (its managed HAProxy) is left as it is.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts `hapwright run` again on the same directory, config and ports (after
    /// [`kill`](Self::kill) or [`terminate`](Self::terminate)), with `env`, and waits
    /// until `/readyz` is 200. The log is appended to.
    pub fn relaunch(&mut self, env: &[(&str, &str)]) {
        assert!(self.child.is_none(), "the controller still runs");
        self.child = Some(launch(self.dir.path(), &self.log, env));
        self.wait_ready();
    }

    /// Sends SIGTERM and waits (bounded) for the exit; returns the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        self.signal(Signal::TERM);
        let Some(child) = self.child.as_mut() else {
            panic!("the controller was already stopped");
        };
        match poll(timeout, || child.try_wait().ok().flatten()) {
            Ok(status) => {
                self.child = None;
                status
            }
            Err(waited) => self.fail(&format!("hapwright still running {waited:?} after SIGTERM")),
        }
    }
}

/// The `haproxy.instances` entry of a second managed instance `edge-2` serving on
/// `port` (its demo app frontends on 127.0.0.2), as [`with_second_instance`] adds it.
pub fn second_instance(port: u16) -> String {
    format!(
        "    - name: edge-2\n      managed: true\n      socket:\n        master: ./run/edge-2.sock\n        \
         configDir: ./run/edge-2\n      env: {{ DEMO_ADDR: \"127.0.0.2\", HTTP_PORT: \"{port}\" }}\n"
    )
}

/// The quickstart config with a second managed instance ([`second_instance`]): the
/// demo app frontends bind `${DEMO_ADDR}`, 127.0.0.1 for the first instance and
/// 127.0.0.2 for the second, so the two HAProxy processes do not share an address.
pub fn with_second_instance(config: &str, port: u16) -> String {
    let config = replace_once(
        config,
        "bind 127.0.0.1:{{ app.port }}",
        "bind ${DEMO_ADDR}:{{ app.port }}",
    );
    let config = replace_once(
        &config,
        "env: { HTTP_PORT:",
        "env: { DEMO_ADDR: \"127.0.0.1\", HTTP_PORT:",
    );
    replace_once(
        &config,
        "\ncontroller:",
        &format!("\n{}\ncontroller:", second_instance(port)),
    )
}

/// The quickstart config with quicker pacing (debounce 50 ms, minDeploymentInterval
/// 100 ms, minReloadInterval `reload`), so tests that make many changes take seconds.
pub fn quick_pacing(config: &str, reload: &str) -> String {
    let config = replace_once(config, "debounce: 200ms", "debounce: 50ms");
    let config = replace_once(
        &config,
        "minDeploymentInterval: 500ms",
        "minDeploymentInterval: 100ms",
    );
    replace_once(
        &config,
        "minReloadInterval: 2s",
        &format!("minReloadInterval: {reload}"),
    )
}

/// Starts `hapwright run -c <dir>/hapwright.yaml` in `dir`, appending to `log`.
fn launch(dir: &Path, log: &Path, env: &[(&str, &str)]) -> Child {
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    let err = out.try_clone().expect("log file");
    let mut command = Command::new(hapwright_binary());
    command
        .arg("run")
        .arg("-c")
        .arg(dir.join("hapwright.yaml"))
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    for (key, value) in env {
        command.env(key, value);
    }
    command.spawn().expect("start hapwright run")
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            send_signal(child.id(), Signal::TERM);
            if poll(Duration::from_secs(10), || child.try_wait().ok().flatten()).is_err() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Whatever survived (the controller was killed, or it leaked its HAProxy).
        let needle = self.process_needle();
        for pid in processes_matching("haproxy", &needle) {
            send_signal(pid, Signal::KILL);
        }
        let _ = poll(Duration::from_secs(5), || {
            processes_matching("haproxy", &needle)
                .is_empty()
                .then_some(())
        });
        if std::thread::panicking() {
            eprintln!(
                "--- hapwright log ({}) ---\n{}",
                self.log.display(),
                self.log_tail(120)
            );
        }
    }
}
