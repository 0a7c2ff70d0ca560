//! Managed mode: hapwright starts `haproxy -W -S <master> -f <configDir>/haproxy.cfg`
//! itself, with the config directory as working directory and the instance's `env`,
//! restarts it with backoff when the master exits (HAProxy 2.6's master exits when a
//! worker dies) and stops it on shutdown.
//!
//! [`ManagedHaproxy`] is created once per controller process, outside the kernel
//! iterations, so managed HAProxy processes outlive controller reinits; the deployer
//! only calls [`ManagedHaproxy::ensure_started`] after writing the first valid render.
//!
//! Every start that comes up is a deployment of the files on disk. The supervisor
//! numbers them and announces them on [`ManagedHaproxy::ready_events`]; the deployer
//! [claims](ManagedHaproxy::claim_start) each one exactly once, whether its own
//! `ensure_started` brought the process up or the supervisor restarted it on its own
//! (after a crash, or a failed start that later succeeds).
//!
//! # Stopping: a drain, not a cut
//!
//! When hapwright stops (or an instance leaves the config), its HAProxy is stopped
//! the way HAProxy's own documentation stops it without dropping traffic: SIGUSR1 to
//! the master, a *soft stop*. The workers close their listeners at once, answer the
//! requests in flight (idle keep-alive connections are closed, busy ones get
//! `Connection: close` on their last response) and exit when the last connection is
//! done. Connections that are still open [`hard_stop_after`](SupervisorConfig::hard_stop_after)
//! later (`haproxy.hardStopAfter`, default 30 s: long downloads, WebSockets) are cut
//! by SIGTERM, and a master that still lives [`stop_grace`](SupervisorConfig::stop_grace)
//! after that gets SIGKILL. A start that never came up is terminated at once: it
//! serves nothing.
//!
//! # Leftovers: never two masters
//!
//! A managed HAProxy must not outlive its controller unnoticed, nor be duplicated
//! when the controller starts again:
//!
//! - **Parent-death signal.** When `setpriv` (util-linux) is on `PATH`, HAProxy runs
//!   as `setpriv --pdeathsig KILL haproxy …`, so the kernel kills the master when the
//!   controller dies, even by SIGKILL (the workers follow their master). The signal
//!   is tied to the thread that spawned the process, so every start goes through one
//!   spawner thread that lives as long as the supervisor.
//! - **Pidfile.** The master's PID is written to `<configDir>/.hapwright-haproxy.pid`
//!   (a dot file: not part of the rendered layout) and removed when hapwright stops
//!   HAProxy.
//! - **Found at start.** Before its first start for an instance, the supervisor looks
//!   for masters left by an earlier controller: the pidfile's PID and every
//!   `haproxy -W … -f <configDir>/haproxy.cfg` master in `/proc`. One that answers
//!   `show proc` on the instance's master socket is *adopted* — no downtime; it is
//!   supervised by polling its PID, since it is not our child, and its output is not
//!   captured. Any other is stopped (SIGUSR1 soft stop, SIGTERM after the stop grace,
//!   then SIGKILL) before a new one starts.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::client::master::MasterClient;
use crate::client::socket::{CliClient, ClientConfig, InstanceConfig, SocketAddress};

/// Default of `haproxy.hardStopAfter`: how long a stopping managed HAProxy drains.
pub const DEFAULT_HARD_STOP_AFTER: Duration = Duration::from_secs(30);

/// Lines of HAProxy output kept per instance.
const LOG_LINES: usize = 400;

/// Name of the pidfile in an instance's config directory: the PID of the master
/// hapwright started (or adopted), so a later controller and operators can find it.
pub const PIDFILE: &str = ".hapwright-haproxy.pid";

/// Where the pidfile of `instance` is.
pub fn pidfile_path(instance: &InstanceConfig) -> PathBuf {
    instance.config_dir.join(PIDFILE)
}

/// The state of one managed HAProxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessState {
    /// Spawned, master CLI not answering yet.
    Starting,
    /// The master answers `show proc` with a worker.
    Running {
        /// The master's PID.
        pid: u32,
    },
    /// The master exited; a restart is scheduled.
    Restarting {
        /// Consecutive failed starts.
        attempt: u32,
        /// How the last process ended.
        reason: String,
    },
    /// Stopped on request.
    Stopped,
}

impl std::fmt::Display for ProcessState {
    /// In words, for health reasons and logs: `restarting after 6 failed starts
    /// (exited with status 1)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProcessState::Starting => f.write_str("starting"),
            ProcessState::Running { pid } => write!(f, "running (pid {pid})"),
            ProcessState::Restarting { attempt, reason } => {
                let starts = if *attempt == 1 { "start" } else { "starts" };
                write!(f, "restarting after {attempt} failed {starts} ({reason})")
            }
            ProcessState::Stopped => f.write_str("stopped"),
        }
    }
}

impl ProcessState {
    /// Whether HAProxy is up.
    pub fn is_running(&self) -> bool {
        matches!(self, ProcessState::Running { .. })
    }
}

/// Why a managed HAProxy could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ManagedError {
    /// The instance's master socket cannot be used to start HAProxy.
    #[error("instance `{0}` is not managed")]
    NotManaged(String),
    /// HAProxy did not come up in time; `alerts` holds its ALERT lines.
    #[error("managed HAProxy `{instance}` did not start: {reason}{}", format_alerts(.alerts))]
    StartFailed {
        /// Instance name.
        instance: String,
        /// What happened.
        reason: String,
        /// HAProxy's ALERT lines.
        alerts: Vec<String>,
    },
    /// The supervisor is shutting down.
    #[error("the managed HAProxy supervisor is stopped")]
    Stopped,
}

fn format_alerts(alerts: &[String]) -> String {
    if alerts.is_empty() {
        String::new()
    } else {
        format!(": {}", alerts.join(" | "))
    }
}

/// The last lines HAProxy printed (stdout and stderr), numbered so a caller can ask
/// for what came after a point (e.g. the ALERT lines of a failed reload).
#[derive(Clone, Debug, Default)]
pub struct LogBuffer {
    inner: Arc<Mutex<NumberedLines>>,
}

/// The number of the last line pushed, and the kept lines with their numbers.
type NumberedLines = (u64, VecDeque<(u64, String)>);

impl LogBuffer {
    /// Appends a line.
    pub fn push(&self, line: String) {
        let mut inner = self.inner.lock().expect("log buffer lock");
        inner.0 += 1;
        let seq = inner.0;
        if inner.1.len() == LOG_LINES {
            inner.1.pop_front();
        }
        inner.1.push_back((seq, line));
    }

    /// Number of the last line pushed (0 before any).
    pub fn position(&self) -> u64 {
        self.inner.lock().expect("log buffer lock").0
    }

    /// Lines pushed after `position`.
    pub fn since(&self, position: u64) -> Vec<String> {
        let inner = self.inner.lock().expect("log buffer lock");
        inner
            .1
            .iter()
            .filter(|(seq, _)| *seq > position)
            .map(|(_, line)| line.clone())
            .collect()
    }

    /// `[ALERT]` lines pushed after `position`, without the pid, each distinct line
    /// once: HAProxy repeats the same alert from the master and each worker, and
    /// again on every failed start.
    pub fn alerts_since(&self, position: u64) -> Vec<String> {
        let lines = self.since(position);
        crate::client::master::alert_lines(lines.iter().map(String::as_str))
    }
}

/// Starts of one supervised process that came up, and how many of them a deployment
/// accounted for.
#[derive(Debug, Default)]
struct Starts {
    ready: u64,
    claimed: u64,
}

/// Restart backoff of a managed HAProxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SupervisorConfig {
    /// First restart delay.
    pub min_backoff: Duration,
    /// Longest restart delay.
    pub max_backoff: Duration,
    /// A process that ran this long resets the backoff.
    pub stable_after: Duration,
    /// Bound on waiting for the master CLI after a start.
    pub ready_timeout: Duration,
    /// Grace between SIGTERM and SIGKILL on stop (and between SIGUSR1 and SIGTERM
    /// for a leftover master that is stopped rather than adopted).
    pub stop_grace: Duration,
    /// How long a stopping HAProxy may drain (soft stop, SIGUSR1) before the
    /// connections still open are cut (SIGTERM); `haproxy.hardStopAfter`. Changed at
    /// run time with [`ManagedHaproxy::set_hard_stop_after`].
    pub hard_stop_after: Duration,
    /// Start HAProxy under `setpriv --pdeathsig KILL` when `setpriv` is available,
    /// so it dies with the controller. Off only to simulate an older controller in
    /// tests.
    pub parent_death_signal: bool,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        Self {
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
            stable_after: Duration::from_secs(60),
            ready_timeout: Duration::from_secs(30),
            stop_grace: Duration::from_secs(5),
            hard_stop_after: DEFAULT_HARD_STOP_AFTER,
            parent_death_signal: true,
        }
    }
}

struct Supervised {
    config: InstanceConfig,
    state: watch::Receiver<ProcessState>,
    logs: LogBuffer,
    starts: Arc<Mutex<Starts>>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

struct Inner {
    binary: PathBuf,
    config: SupervisorConfig,
    processes: tokio::sync::Mutex<HashMap<String, Supervised>>,
    stopped: CancellationToken,
    /// Bumped whenever a start of any instance comes up.
    ready: Arc<watch::Sender<u64>>,
    /// The thread every HAProxy is spawned from; started on first use.
    spawner: OnceLock<Arc<Spawner>>,
    /// The drain bound in effect (milliseconds), shared with every supervisor.
    hard_stop_after: Arc<AtomicU64>,
}

/// Supervises the managed HAProxy processes of one controller process. Cheap to clone.
///
/// Dropping the last clone without [`stop`](Self::stop) still kills the processes
/// (their `Child` handles kill on drop), but only `stop` waits for them to exit.
#[derive(Clone)]
pub struct ManagedHaproxy {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ManagedHaproxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedHaproxy")
            .field("binary", &self.inner.binary)
            .finish_non_exhaustive()
    }
}

impl ManagedHaproxy {
    /// A supervisor running `binary` (a bare name is looked up on `PATH`).
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        Self::with_config(binary, SupervisorConfig::default())
    }

    /// A supervisor with custom backoff and timeouts.
    pub fn with_config(binary: impl Into<PathBuf>, config: SupervisorConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                binary: binary.into(),
                config,
                processes: tokio::sync::Mutex::new(HashMap::new()),
                stopped: CancellationToken::new(),
                ready: Arc::new(watch::channel(0).0),
                spawner: OnceLock::new(),
                hard_stop_after: Arc::new(AtomicU64::new(millis(config.hard_stop_after))),
            }),
        }
    }

    /// Starts HAProxy for `instance` unless it is already supervised with the same
    /// settings (a changed `env`, socket or directory restarts it), then waits until
    /// its master CLI answers. `haproxy.cfg` must already be in the config directory.
    pub async fn ensure_started(&self, instance: &InstanceConfig) -> Result<(), ManagedError> {
        if !instance.managed {
            return Err(ManagedError::NotManaged(instance.name.clone()));
        }
        if self.inner.stopped.is_cancelled() {
            return Err(ManagedError::Stopped);
        }
        let (mut state, logs) = {
            let mut processes = self.inner.processes.lock().await;
            let stale = processes
                .get(&instance.name)
                .is_some_and(|p| p.config != *instance || p.task.is_finished());
            if stale && let Some(old) = processes.remove(&instance.name) {
                old.cancel.cancel();
                let _ = old.task.await;
            }
            let supervised = processes
                .entry(instance.name.clone())
                .or_insert_with(|| self.spawn_supervisor(instance.clone()));
            (supervised.state.clone(), supervised.logs.clone())
        };
        let wait = async {
            loop {
                match &*state.borrow_and_update() {
                    ProcessState::Running { .. } => return Ok(()),
                    ProcessState::Restarting { reason, .. } => {
                        return Err(reason.clone());
                    }
                    ProcessState::Stopped => return Err("stopped".to_owned()),
                    ProcessState::Starting => {}
                }
                if state.changed().await.is_err() {
                    return Err("supervisor ended".to_owned());
                }
            }
        };
        let outcome = tokio::time::timeout(self.inner.config.ready_timeout, wait)
            .await
            .unwrap_or_else(|_| Err("master CLI did not answer in time".to_owned()));
        outcome.map_err(|reason| ManagedError::StartFailed {
            instance: instance.name.clone(),
            reason,
            alerts: logs.alerts_since(0),
        })
    }

    /// The current state of an instance's process, if supervised.
    pub async fn state(&self, instance: &str) -> Option<ProcessState> {
        let processes = self.inner.processes.lock().await;
        processes.get(instance).map(|p| p.state.borrow().clone())
    }

    /// A receiver of an instance's process state, if supervised.
    pub async fn watch(&self, instance: &str) -> Option<watch::Receiver<ProcessState>> {
        let processes = self.inner.processes.lock().await;
        processes.get(instance).map(|p| p.state.clone())
    }

    /// A receiver that changes whenever a start of any supervised instance comes up
    /// (its master answers with a worker). Use [`claim_start`](Self::claim_start) to
    /// find out which.
    pub fn ready_events(&self) -> watch::Receiver<u64> {
        self.inner.ready.subscribe()
    }

    /// Claims the start of `instance` that is running now, unless it was claimed
    /// before: returns the master's PID the first time it is asked about a start,
    /// `None` when the instance is not running or its start is already accounted for.
    /// Each start is thereby recorded as exactly one deployment.
    pub async fn claim_start(&self, instance: &str) -> Option<u32> {
        let processes = self.inner.processes.lock().await;
        let supervised = processes.get(instance)?;
        let mut starts = supervised.starts.lock().expect("starts lock");
        // The supervisor bumps `ready` and publishes `Running` under this lock, so the
        // two agree.
        let ProcessState::Running { pid } = *supervised.state.borrow() else {
            return None;
        };
        if starts.claimed >= starts.ready {
            return None;
        }
        starts.claimed = starts.ready;
        Some(pid)
    }

    /// The output buffer of an instance's process, if supervised.
    pub async fn logs(&self, instance: &str) -> Option<LogBuffer> {
        let processes = self.inner.processes.lock().await;
        processes.get(instance).map(|p| p.logs.clone())
    }

    /// Sets how long a stopping HAProxy drains before its open connections are cut
    /// (`haproxy.hardStopAfter`); applies to every stop from now on, also of the
    /// processes already running.
    pub fn set_hard_stop_after(&self, bound: Duration) {
        self.inner
            .hard_stop_after
            .store(millis(bound), Ordering::Relaxed);
    }

    /// The drain bound in effect.
    pub fn hard_stop_after(&self) -> Duration {
        Duration::from_millis(self.inner.hard_stop_after.load(Ordering::Relaxed))
    }

    /// Stops one instance's HAProxy (draining it as [`stop`](Self::stop) does) and
    /// forgets it: the instance was removed from the config. Later
    /// [`ensure_started`](Self::ensure_started) calls for the name start it again.
    pub async fn stop_instance(&self, instance: &str) {
        let supervised = self.inner.processes.lock().await.remove(instance);
        if let Some(supervised) = supervised {
            supervised.cancel.cancel();
            let _ = supervised.task.await;
        }
    }

    /// Stops every managed HAProxy, draining them in parallel (SIGUSR1; SIGTERM after
    /// `hard_stop_after`, SIGKILL after another `stop_grace`), and waits for them to
    /// exit. Later [`ensure_started`](Self::ensure_started) calls fail.
    pub async fn stop(&self) {
        self.inner.stopped.cancel();
        let all: Vec<Supervised> = self
            .inner
            .processes
            .lock()
            .await
            .drain()
            .map(|(_, p)| p)
            .collect();
        for supervised in &all {
            supervised.cancel.cancel();
        }
        for supervised in all {
            let _ = supervised.task.await;
        }
    }

    fn spawn_supervisor(&self, instance: InstanceConfig) -> Supervised {
        let (tx, rx) = watch::channel(ProcessState::Starting);
        let logs = LogBuffer::default();
        let starts = Arc::new(Mutex::new(Starts::default()));
        let cancel = self.inner.stopped.child_token();
        // A root span: the supervisor outlives the deployment that started it, and a
        // child would keep that deployment's span (and its trace) open.
        let span = tracing::info_span!(parent: None, "managed_haproxy", instance = %instance.name);
        let reporter = Reporter {
            state: tx,
            starts: starts.clone(),
            ready: self.inner.ready.clone(),
        };
        let spawner = self
            .inner
            .spawner
            .get_or_init(|| Arc::new(Spawner::start(self.inner.config.parent_death_signal)))
            .clone();
        let task = tokio::spawn(
            supervise(
                spawner,
                self.inner.binary.clone(),
                Stopping {
                    config: self.inner.config,
                    hard_stop_after: self.inner.hard_stop_after.clone(),
                },
                instance.clone(),
                reporter,
                logs.clone(),
                cancel.clone(),
            )
            .instrument(span),
        );
        Supervised {
            config: instance,
            state: rx,
            logs,
            starts,
            cancel,
            task,
        }
    }
}

/// Publishes the state of one supervised process.
struct Reporter {
    state: watch::Sender<ProcessState>,
    starts: Arc<Mutex<Starts>>,
    ready: Arc<watch::Sender<u64>>,
}

impl Reporter {
    fn send(&self, state: ProcessState) {
        self.state.send_replace(state);
    }

    /// A start came up: count it, then tell the deployer.
    fn running(&self, pid: u32) {
        {
            let mut starts = self.starts.lock().expect("starts lock");
            starts.ready += 1;
            self.state.send_replace(ProcessState::Running { pid });
        }
        self.ready.send_modify(|n| *n = n.wrapping_add(1));
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The supervisor's settings plus the drain bound, which may change while it runs.
struct Stopping {
    config: SupervisorConfig,
    hard_stop_after: Arc<AtomicU64>,
}

impl Stopping {
    fn drain(&self) -> Duration {
        Duration::from_millis(self.hard_stop_after.load(Ordering::Relaxed))
    }
}

async fn supervise(
    spawner: Arc<Spawner>,
    binary: PathBuf,
    stopping: Stopping,
    instance: InstanceConfig,
    state: Reporter,
    logs: LogBuffer,
    cancel: CancellationToken,
) {
    let config = &stopping.config;
    let mut backoff = hapwright_eventbus::RestartBackoff::new(
        config.min_backoff,
        config.max_backoff,
        config.stable_after,
    );
    let mut adopt = find_leftover(&instance, config).await;
    loop {
        state.send(ProcessState::Starting);
        let started = tokio::time::Instant::now();
        let outcome = if let Some(pid) = adopt.take() {
            logs.push(format!(
                "hapwright: adopted the HAProxy master (pid {pid}) left by an earlier controller; its output is not captured"
            ));
            run_adopted(pid, &instance, &stopping, &state, &cancel).await
        } else if let Err(conflict) = foreign_listeners(&instance).await {
            Exit::Failed(conflict.to_string())
        } else {
            match spawn(&spawner, &binary, &instance, &logs, &cancel).await {
                Ok((child, output)) => {
                    run_once(child, output, &instance, &stopping, &state, &cancel).await
                }
                Err(error) => Exit::Failed(crate::config::spawn_error(&binary, &error)),
            }
        };
        let reason = match outcome {
            Exit::Cancelled => {
                remove_pidfile(&instance);
                state.send(ProcessState::Stopped);
                tracing::info!("Managed HAProxy stopped");
                return;
            }
            Exit::Failed(reason) => reason,
        };
        let delay = backoff.next_delay(started.elapsed());
        let attempt = backoff.attempt();
        tracing::warn!(%reason, attempt, ?delay, "Managed HAProxy exited; restarting");
        state.send(ProcessState::Restarting { attempt, reason });
        if cancel
            .run_until_cancelled(tokio::time::sleep(delay))
            .await
            .is_none()
        {
            state.send(ProcessState::Stopped);
            return;
        }
    }
}

enum Exit {
    Cancelled,
    Failed(String),
}

async fn spawn(
    spawner: &Spawner,
    binary: &PathBuf,
    instance: &InstanceConfig,
    logs: &LogBuffer,
    stopping: &CancellationToken,
) -> std::io::Result<(Child, Output)> {
    let config_file = instance.config_dir.join("haproxy.cfg");
    let mut command = match &spawner.setpriv {
        Some(setpriv) => {
            let mut command = Command::new(setpriv);
            command.arg("--pdeathsig").arg("KILL").arg(binary);
            command
        }
        None => Command::new(binary),
    };
    command
        .arg("-W")
        .arg("-S")
        .arg(instance.master.haproxy_bind())
        .arg("-f")
        .arg(&config_file)
        .current_dir(&instance.config_dir)
        .envs(&instance.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let SocketAddress::Unix(path) = &instance.master {
        // A socket file left by a killed master would make the readiness probe
        // talk to nobody; HAProxy recreates it.
        let _ = std::fs::remove_file(path);
    }
    let mut child = spawner.spawn(command).await?;
    if let Some(pid) = child.id() {
        write_pidfile(instance, pid);
    }
    tracing::info!(pid = child.id(), config = %config_file.display(), "Started managed HAProxy");
    let mut output = Output(Vec::new());
    if let Some(stdout) = child.stdout.take() {
        output.0.push(tokio::spawn(pump_lines(
            stdout,
            logs.clone(),
            stopping.clone(),
        )));
    }
    if let Some(stderr) = child.stderr.take() {
        output.0.push(tokio::spawn(pump_lines(
            stderr,
            logs.clone(),
            stopping.clone(),
        )));
    }
    Ok((child, output))
}

/// The tasks forwarding a process's stdout and stderr ([`pump_lines`]).
struct Output(Vec<JoinHandle<()>>);

impl Output {
    /// Waits until both pipes reached their end, at most `within` (a worker that
    /// outlives its master may hold them open): what HAProxy printed before it
    /// exited, such as the ALERT lines of a failed start, is then in the log and
    /// the buffer before the exit is reported.
    async fn drained(self, within: Duration) {
        let _ = tokio::time::timeout(within, futures::future::join_all(self.0)).await;
    }
}

/// Refuses a start while another process listens on one of the config's `bind`
/// addresses (see [`super::listeners`]); processes running this instance's own config
/// are not foreign.
async fn foreign_listeners(instance: &InstanceConfig) -> Result<(), super::listeners::Foreign> {
    let config_file = instance.config_dir.join("haproxy.cfg");
    let env = instance.env.clone();
    tokio::task::spawn_blocking(move || {
        super::listeners::check_foreign(&config_file, &env, |pid| {
            runs_config(pid, &config_file)
                || parent_of(pid).is_some_and(|parent| runs_config(parent, &config_file))
        })
    })
    .await
    .unwrap_or(Ok(()))
}

/// Forwards HAProxy's output to the log and the buffer. `stopping` is cancelled before
/// hapwright terminates the process, so what HAProxy prints about being stopped (e.g.
/// `[ALERT] ... Current worker (N) exited with code 143 (Terminated)`) is expected and
/// logged at INFO; ALERT lines at any other time are warnings.
async fn pump_lines(stream: impl AsyncRead + Unpin, logs: LogBuffer, stopping: CancellationToken) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.contains("[ALERT]") && !stopping.is_cancelled() {
            tracing::warn!(target: "haproxy", "{line}");
        } else if line.contains("[ALERT]") {
            tracing::info!(target: "haproxy", stopping = true, "{line}");
        } else {
            tracing::debug!(target: "haproxy", "{line}");
        }
        logs.push(line);
    }
}

async fn run_once(
    mut child: Child,
    output: Output,
    instance: &InstanceConfig,
    stopping: &Stopping,
    state: &Reporter,
    cancel: &CancellationToken,
) -> Exit {
    let config = &stopping.config;
    let pid = child.id().unwrap_or_default();
    let master = MasterClient::from_cli(CliClient::new(instance.master.clone()).with_config(
        ClientConfig {
            attempts: 1,
            io_timeout: Duration::from_secs(2),
            ..ClientConfig::default()
        },
    ));
    let ready = async {
        let deadline = tokio::time::Instant::now() + config.ready_timeout;
        loop {
            // Ready once the worker itself answers: from 3.1 on the master lists it
            // in `show proc` before it loaded the config.
            if master.worker_ready().await {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        () = cancel.cancelled() => return terminate(child, config.stop_grace).await,
        status = child.wait() => {
            output.drained(Duration::from_millis(500)).await;
            return Exit::Failed(describe(status));
        }
        ready = ready => {
            if !ready {
                let _ = terminate(child, config.stop_grace).await;
                return Exit::Failed("master CLI did not answer in time".to_owned());
            }
        }
    }
    state.running(pid);
    tracing::info!(pid, "Managed HAProxy is ready");
    tokio::select! {
        () = cancel.cancelled() => drain(child, stopping.drain(), config.stop_grace).await,
        status = child.wait() => {
            output.drained(Duration::from_millis(500)).await;
            Exit::Failed(describe(status))
        }
    }
}

fn describe(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(status) => format!("HAProxy master exited ({status})"),
        Err(error) => format!("waiting for HAProxy failed: {error}"),
    }
}

/// Writes the pidfile; a failure only costs leftover detection by PID (the `/proc`
/// scan still finds the master), so it is logged, not fatal.
fn write_pidfile(instance: &InstanceConfig, pid: u32) {
    if let Err(error) = std::fs::write(pidfile_path(instance), format!("{pid}\n")) {
        tracing::warn!(%error, path = %pidfile_path(instance).display(), "Cannot write the HAProxy pidfile");
    }
}

fn remove_pidfile(instance: &InstanceConfig) {
    let _ = std::fs::remove_file(pidfile_path(instance));
}

/// Stops a serving HAProxy without dropping what it serves: SIGUSR1 (soft stop),
/// SIGTERM once `bound` has passed with connections still open, SIGKILL after another
/// `grace`.
async fn drain(mut child: Child, bound: Duration, grace: Duration) -> Exit {
    let Some(pid) = child
        .id()
        .and_then(|pid| rustix::process::Pid::from_raw(pid as i32))
    else {
        return Exit::Cancelled;
    };
    tracing::info!(hard_stop_after = ?bound, "Draining managed HAProxy (soft stop)");
    let started = tokio::time::Instant::now();
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::USR1);
    if tokio::time::timeout(bound, child.wait()).await.is_ok() {
        tracing::info!(
            drained_in = ?started.elapsed(),
            "Managed HAProxy finished its connections"
        );
        return Exit::Cancelled;
    }
    tracing::warn!(
        hard_stop_after = ?bound,
        "Managed HAProxy still had open connections after hardStopAfter; closing them"
    );
    terminate(child, grace).await
}

async fn terminate(mut child: Child, grace: Duration) -> Exit {
    if let Some(pid) = child
        .id()
        .and_then(|pid| rustix::process::Pid::from_raw(pid as i32))
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return Exit::Cancelled;
        }
    }
    let _ = child.kill().await;
    Exit::Cancelled
}

// === impl Spawner ===

/// A command to start and where to send the started child.
type SpawnRequest = (Command, oneshot::Sender<std::io::Result<Child>>);

/// Starts every managed HAProxy from one dedicated thread. The parent-death signal
/// fires when the thread that spawned the process exits, not the process; Tokio's
/// worker and blocking threads come and go, this one lives as long as the
/// supervisor (its last [`Arc`] holder).
struct Spawner {
    /// `setpriv`, when found and wanted.
    setpriv: Option<PathBuf>,
    requests: std::sync::mpsc::Sender<SpawnRequest>,
}

impl Spawner {
    /// Starts the thread. Must run inside a Tokio runtime: the children are
    /// registered with it (for `wait` and kill-on-drop).
    fn start(parent_death_signal: bool) -> Self {
        let setpriv = if parent_death_signal {
            let found = find_on_path("setpriv");
            if found.is_none() {
                tracing::warn!(
                    "setpriv not found; a managed HAProxy outlives a killed controller and is adopted or stopped at the next start"
                );
            }
            found
        } else {
            None
        };
        let (requests, receiver) = std::sync::mpsc::channel::<SpawnRequest>();
        let runtime = tokio::runtime::Handle::current();
        let spawned = std::thread::Builder::new()
            .name("haproxy-spawner".to_owned())
            .spawn(move || {
                let _runtime = runtime.enter();
                for (mut command, reply) in receiver {
                    let _ = reply.send(command.spawn());
                }
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "Cannot start the HAProxy spawner thread; starts will fail");
        }
        Self { setpriv, requests }
    }

    async fn spawn(&self, command: Command) -> std::io::Result<Child> {
        let (reply, answer) = oneshot::channel();
        let gone = || std::io::Error::other("the HAProxy spawner thread is gone");
        self.requests.send((command, reply)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

// === leftovers ===

/// Looks for HAProxy masters an earlier controller left running on `instance`'s
/// config. Returns the PID of the one to adopt (it answers `show proc` on the
/// instance's master socket with a worker); stops every other one first.
async fn find_leftover(instance: &InstanceConfig, config: &SupervisorConfig) -> Option<u32> {
    let config_file = instance.config_dir.join("haproxy.cfg");
    let mut candidates: BTreeSet<u32> = masters_of(&config_file).into_iter().collect();
    if let Some(pid) = std::fs::read_to_string(pidfile_path(instance))
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok())
        && runs_config(pid, &config_file)
    {
        candidates.insert(pid);
    }
    if candidates.is_empty() {
        return None;
    }
    let master = MasterClient::from_cli(CliClient::new(instance.master.clone()).with_config(
        ClientConfig {
            attempts: 1,
            io_timeout: Duration::from_secs(2),
            ..ClientConfig::default()
        },
    ));
    // The master CLI is down for up to ~1.5 s during a reload: ask for a while.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut adopted = None;
    loop {
        if let Ok(info) = master.try_show_proc().await
            && info.has_serving_worker()
            && candidates.contains(&info.master_pid)
        {
            adopted = Some(info.master_pid);
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for pid in candidates
        .iter()
        .copied()
        .filter(|pid| Some(*pid) != adopted)
    {
        tracing::warn!(
            pid,
            config = %config_file.display(),
            "Stopping an HAProxy master left by an earlier controller: it does not answer on the master socket"
        );
        stop_pid(pid, config.stop_grace).await;
    }
    if let Some(pid) = adopted {
        tracing::info!(
            pid,
            "Adopting the HAProxy master left by an earlier controller"
        );
        write_pidfile(instance, pid);
    }
    adopted
}

/// Supervises a master that is not our child: reports it running, then polls its PID
/// until it exits or the supervisor stops it.
async fn run_adopted(
    pid: u32,
    instance: &InstanceConfig,
    stopping: &Stopping,
    state: &Reporter,
    cancel: &CancellationToken,
) -> Exit {
    let config_file = instance.config_dir.join("haproxy.cfg");
    state.running(pid);
    loop {
        tokio::select! {
            () = cancel.cancelled() => {
                stop_pid_with(
                    pid,
                    (rustix::process::Signal::USR1, stopping.drain()),
                    stopping.config.stop_grace,
                )
                .await;
                return Exit::Cancelled;
            }
            () = tokio::time::sleep(Duration::from_millis(200)) => {
                if !runs_config(pid, &config_file) {
                    return Exit::Failed(format!("adopted HAProxy master (pid {pid}) exited"));
                }
            }
        }
    }
}

/// Stops a leftover master gently: SIGUSR1 (soft stop: the workers finish their
/// connections), SIGTERM after `grace`, SIGKILL after another `grace`.
async fn stop_pid(pid: u32, grace: Duration) {
    stop_pid_with(pid, (rustix::process::Signal::USR1, grace), grace).await;
}

/// Sends `first.0` and waits up to `first.1`, then SIGTERM and SIGKILL `grace` apart,
/// until `pid` is gone.
async fn stop_pid_with(pid: u32, first: (rustix::process::Signal, Duration), grace: Duration) {
    let Some(target) = rustix::process::Pid::from_raw(pid as i32) else {
        return;
    };
    for (signal, wait) in [
        first,
        (rustix::process::Signal::TERM, grace),
        (rustix::process::Signal::KILL, grace),
    ] {
        if !is_alive(pid) {
            return;
        }
        let _ = rustix::process::kill_process(target, signal);
        let deadline = tokio::time::Instant::now() + wait;
        while is_alive(pid) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Whether `pid` exists and is not a zombie.
fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesized command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The arguments of a running process, `None` when it is gone.
fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|arg| !arg.is_empty())
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect(),
    )
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` is a live master-worker HAProxy (`-W`) on `config_file`.
fn runs_config(pid: u32, config_file: &Path) -> bool {
    is_alive(pid)
        && cmdline(pid).is_some_and(|args| {
            args.iter().any(|a| a == "-W")
                && args
                    .windows(2)
                    .any(|w| w[0] == "-f" && Path::new(&w[1]) == config_file)
        })
}

/// Every HAProxy master running `config_file` in master-worker mode: the matching
/// processes whose parent is not a matching process (workers have the same command
/// line as their master).
pub fn masters_of(config_file: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let matching: BTreeSet<u32> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| runs_config(*pid, config_file))
        .collect();
    matching
        .iter()
        .copied()
        .filter(|pid| parent_of(*pid).is_none_or(|parent| !matching.contains(&parent)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_read_as_words_not_debug_text() {
        let state = ProcessState::Restarting {
            attempt: 6,
            reason: "exited with status 1".into(),
        };
        assert_eq!(
            state.to_string(),
            "restarting after 6 failed starts (exited with status 1)"
        );
        assert_eq!(
            ProcessState::Running { pid: 42 }.to_string(),
            "running (pid 42)"
        );
    }

    #[test]
    fn repeated_alerts_are_shown_once_without_pids() {
        let logs = LogBuffer::default();
        for pid in [100, 101, 100] {
            logs.push(format!(
                "[ALERT]    ({pid}) : Starting frontend fe: cannot bind socket (Address already in use) [0.0.0.0:80]"
            ));
        }
        logs.push("[NOTICE]   (100) : haproxy version is 2.6".into());
        logs.push("[ALERT]    (100) : Fatal errors found in configuration.".into());
        assert_eq!(
            logs.alerts_since(0),
            [
                "[ALERT] Starting frontend fe: cannot bind socket (Address already in use) [0.0.0.0:80]",
                "[ALERT] Fatal errors found in configuration.",
            ]
        );
    }
}
