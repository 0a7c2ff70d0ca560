//! The master CLI client (`haproxy -W -S <socket>`): `show version`, `show proc`,
//! `reload` and `@1 show env`.
//!
//! How a reload tells its outcome depends on the HAProxy line ([`Version`]):
//! - HAProxy 2.6's `reload` answers nothing and closes the connection; success or
//!   failure shows only in `show proc` (`<reloads> [failed: N]`).
//! - From 2.7 on, `reload` waits for the new worker and answers `Success=1` or
//!   `Success=0`, then `--` and the startup log ([`ReloadAnswer`]). On 3.x a `reload`
//!   while another one (or the master's own start) is still loading a worker is
//!   refused with `Success=0` and `Another reload is still in progress.`.
//!
//! From 3.1 on, the master lists a new worker in `show proc` before the worker loaded
//! its config; `@1 …` then answers `Can't find the target PID matching the prefix
//! '@1'`, or worse, is held and holds up the worker's start until the client gives
//! up. [`MasterClient::worker_ready`] asks the master only (`show startup-logs` says
//! `Loading success.` once the worker is ready), and `@1` is sent after it. From
//! 3.2 on, after a failed reload the worker that keeps serving is listed under
//! `# old workers` and `# workers` is empty ([`ProcInfo::has_serving_worker`]).
//!
//! The driver builds the confirmed reload on top of these primitives.

use std::time::Duration;

use crate::client::socket::{CliClient, ClientConfig, SocketAddress, SocketError};

/// What the master answers to `@1 …` while it has no worker that finished loading.
const NO_WORKER_ANSWER: &str = "Can't find the target PID";

/// A HAProxy release line (`major.minor`), as `show version` and `haproxy -v` report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// `3` in `3.4.7-1`.
    pub major: u32,
    /// `4` in `3.4.7-1`.
    pub minor: u32,
}

impl Version {
    /// The first line whose `reload` on the master CLI answers with its outcome.
    pub const RELOAD_ANSWERS: Version = Version { major: 2, minor: 7 };

    /// Parses the first word that looks like a version: `3.4.7-1`,
    /// `2.6.12-1+deb12u4` (`show version`), or `HAProxy version 3.0.11-1+deb13u4 …`
    /// (`haproxy -v`).
    pub fn parse(text: &str) -> Option<Self> {
        text.split_whitespace().find_map(|word| {
            let mut parts = word.split(['.', '-', '+']);
            let major = parts.next()?.parse().ok()?;
            let minor = parts.next()?.parse().ok()?;
            Some(Version { major, minor })
        })
    }

    /// The first line whose worker loads the config itself, after the master listed
    /// it in `show proc` (the master logs `Initializing new worker`).
    pub const WORKER_LOADS_CONFIG: Version = Version { major: 3, minor: 1 };

    /// Whether the master CLI's `reload` answers `Success=1`/`Success=0` (2.7 on).
    pub fn reload_answers(self) -> bool {
        self >= Self::RELOAD_ANSWERS
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The master CLI's answer to `reload` (HAProxy 2.7 and later).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReloadAnswer {
    /// `Success=1`: the new worker loaded the config and serves.
    Succeeded {
        /// The startup log after `--`.
        log: String,
    },
    /// `Success=0` with `Another reload is still in progress.`: nothing was started
    /// (a reload, or the master's own start, is still loading a worker); sending
    /// `reload` again once that one is done is safe.
    Busy,
    /// `Success=0`: the new config did not load; the old worker keeps serving.
    Failed {
        /// The startup log after `--`, with HAProxy's `[ALERT]` lines.
        log: String,
    },
}

impl ReloadAnswer {
    /// The `[ALERT]` lines of the startup log, without pids, each distinct line once.
    pub fn alerts(&self) -> Vec<String> {
        match self {
            ReloadAnswer::Succeeded { log } | ReloadAnswer::Failed { log } => {
                alert_lines(log.lines())
            }
            ReloadAnswer::Busy => Vec::new(),
        }
    }
}

/// Parses the answer to `reload`: `Success=1` or `Success=0`, then `--` and the
/// startup log. `None` for anything else (HAProxy 2.6 answers nothing).
pub fn parse_reload_answer(text: &str) -> Option<ReloadAnswer> {
    let text = text.trim_start();
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
    let success = match first.trim() {
        "Success=1" => true,
        "Success=0" => false,
        _ => return None,
    };
    let log = rest
        .strip_prefix("--\n")
        .or_else(|| (rest.trim() == "--").then_some(""))
        .unwrap_or(rest)
        .trim_end()
        .to_owned();
    Some(if success {
        ReloadAnswer::Succeeded { log }
    } else if log
        .lines()
        .any(|line| line.contains("Another reload is still in progress"))
    {
        ReloadAnswer::Busy
    } else {
        ReloadAnswer::Failed { log }
    })
}

/// The `[ALERT]` lines among `lines`, without the pid, each distinct line once:
/// HAProxy repeats the same alert from the master and each worker, and again on
/// every failed start.
pub fn alert_lines<'a>(lines: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    lines
        .into_iter()
        .filter(|line| line.contains("[ALERT]"))
        .map(|line| without_pid(line.trim()))
        .filter(|line| seen.insert(line.clone()))
        .collect()
}

/// `[ALERT]    (12345) : config : …` → `[ALERT] config : …`: the pid differs between
/// otherwise identical lines and says nothing to the reader.
fn without_pid(line: &str) -> String {
    let Some(rest) = line.strip_prefix("[ALERT]") else {
        return line.to_owned();
    };
    let rest = rest.trim_start();
    let rest = match rest.strip_prefix('(').and_then(|r| r.split_once(')')) {
        Some((pid, after)) if pid.chars().all(|c| c.is_ascii_digit()) => after.trim_start(),
        _ => rest,
    };
    let rest = rest.strip_prefix(':').map_or(rest, str::trim_start);
    format!("[ALERT] {rest}")
}

/// The master's view of its processes, parsed from `show proc`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcInfo {
    /// The master's PID.
    pub master_pid: u32,
    /// Reload attempts since the master started.
    pub reloads: u64,
    /// Consecutive failed reloads (0 after a success).
    pub failed: u64,
    /// PIDs of the current workers.
    pub workers: Vec<u32>,
    /// PIDs of old workers still draining connections (from 3.2 on, after a failed
    /// reload, also the worker that keeps serving).
    pub old_workers: Vec<u32>,
}

impl ProcInfo {
    /// Whether a worker serves: a current one, or — from 3.2 on, which lists the
    /// serving worker under `# old workers` after a failed reload — an old one while
    /// the last reload failed.
    pub fn has_serving_worker(&self) -> bool {
        !self.workers.is_empty() || (self.failed > 0 && !self.old_workers.is_empty())
    }
}

/// Why a master CLI call failed.
#[derive(Debug, thiserror::Error)]
pub enum MasterError {
    /// The socket exchange failed.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The answer did not look like `show proc` output.
    #[error("unexpected `show proc` answer: {0:?}")]
    UnexpectedProc(String),
    /// The answer to `show version` named no version.
    #[error("unexpected `show version` answer: {0:?}")]
    UnexpectedVersion(String),
    /// The master has no worker that loaded its config yet (it is starting): `@1 …`
    /// reached nobody.
    #[error("the master has no worker that answers `{0}` yet")]
    NoWorker(String),
}

/// Talks to the master CLI.
#[derive(Clone, Debug)]
pub struct MasterClient {
    cli: CliClient,
}

impl MasterClient {
    /// A client for the master socket at `address`.
    pub fn new(address: SocketAddress) -> Self {
        Self {
            cli: CliClient::new(address),
        }
    }

    /// A client over an existing transport (custom timeouts).
    pub fn from_cli(cli: CliClient) -> Self {
        Self { cli }
    }

    /// The transport.
    pub fn cli(&self) -> &CliClient {
        &self.cli
    }

    /// Sends any master CLI command line and returns the answer; retried only while
    /// connecting fails, since the command may change something.
    pub async fn command(&self, line: &str) -> Result<String, SocketError> {
        self.cli.exchange(line).await
    }

    /// `show proc`, parsed.
    pub async fn show_proc(&self) -> Result<ProcInfo, MasterError> {
        // A read: retried even after a broken exchange (see `socket`'s retry policy).
        let text = self.cli.query("show proc").await?;
        parse_show_proc(&text).ok_or(MasterError::UnexpectedProc(text))
    }

    /// `show proc` with a single attempt (no retries): for polling during a reload.
    pub async fn try_show_proc(&self) -> Result<ProcInfo, MasterError> {
        let text = self.cli.exchange_once("show proc").await?;
        parse_show_proc(&text).ok_or(MasterError::UnexpectedProc(text))
    }

    /// `show version`: the master's HAProxy line.
    pub async fn version(&self) -> Result<Version, MasterError> {
        let text = self.cli.query("show version").await?;
        Version::parse(&text).ok_or(MasterError::UnexpectedVersion(text))
    }

    /// Whether the master lists a serving worker that loaded its config, asking the
    /// master only (one attempt each, for readiness polls). Up to 3.0 the master
    /// loads the config before it starts a worker, so a listed worker is ready. From
    /// 3.1 on the master lists the new worker while it is still loading, and a `@1 …`
    /// sent then can stall the worker's start until the client gives up (seen on
    /// 3.4.7: 10 s); the master's own `show startup-logs` says `Loading success.` once
    /// the worker is ready. After a failed reload the serving worker is the old one.
    pub async fn worker_ready(&self) -> bool {
        let Ok(info) = self.try_show_proc().await else {
            return false;
        };
        if !info.has_serving_worker() {
            return false;
        }
        if info.failed > 0 {
            return true;
        }
        let Ok(text) = self.cli.exchange_once("show version").await else {
            return false;
        };
        match Version::parse(&text) {
            Some(version) if version >= Version::WORKER_LOADS_CONFIG => self
                .cli
                .exchange_once("show startup-logs")
                .await
                .is_ok_and(|logs| logs.contains("Loading success.")),
            _ => true,
        }
    }

    /// Sends `reload` and returns the master's answer (HAProxy 2.7 and later, see
    /// [`parse_reload_answer`]), waiting up to `within` for it: the master answers
    /// once the new worker loaded or failed. Retried only while connecting fails
    /// (nothing was sent).
    pub async fn reload_answered(&self, within: Duration) -> Result<String, SocketError> {
        let cli = self.cli.clone().with_config(ClientConfig {
            io_timeout: within,
            ..self.cli.config()
        });
        cli.exchange("reload").await
    }

    /// Sends `reload`. Retries only while the connection is refused (nothing was sent);
    /// once the command was written, a reset or close counts as sent, because sending
    /// it twice would start two reloads.
    pub async fn send_reload(&self, attempts: usize, delay: Duration) -> Result<(), SocketError> {
        let mut last = None;
        for attempt in 0..attempts.max(1) {
            if attempt > 0 {
                tokio::time::sleep(delay * attempt as u32).await;
            }
            match self.cli.exchange_once("reload").await {
                Ok(_) => return Ok(()),
                Err(SocketError::Io { .. }) => return Ok(()),
                Err(error @ SocketError::Timeout { .. }) => return Err(error),
                Err(error @ SocketError::Connect { .. }) => last = Some(error),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    /// `@1 show env <name>` on the current worker: the value, or `None` when unset.
    /// Sent once the master reports a worker that loaded its config
    /// ([`Self::worker_ready`]), which is waited for until the client's I/O timeout
    /// has passed; then [`MasterError::NoWorker`].
    pub async fn worker_env(&self, name: &str) -> Result<Option<String>, MasterError> {
        let command = format!("@1 show env {name}");
        let config = self.cli.config();
        let deadline = tokio::time::Instant::now() + config.io_timeout;
        let mut delay = config.min_delay;
        loop {
            if self.worker_ready().await {
                let text = self.cli.query(&command).await?;
                if !text.contains(NO_WORKER_ANSWER) {
                    let prefix = format!("{name}=");
                    return Ok(text
                        .lines()
                        .find_map(|line| line.strip_prefix(&prefix))
                        .map(str::to_owned));
                }
            }
            if tokio::time::Instant::now() + delay > deadline {
                return Err(MasterError::NoWorker(command));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(100));
        }
    }
}

/// Parses `show proc` output.
pub fn parse_show_proc(text: &str) -> Option<ProcInfo> {
    #[derive(PartialEq)]
    enum Block {
        Master,
        Workers,
        OldWorkers,
        Other,
    }
    let mut info = ProcInfo::default();
    let mut block = Block::Master;
    let mut seen_master = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with("#<") {
            continue;
        }
        if let Some(title) = line.strip_prefix('#') {
            block = match title.trim() {
                "workers" => Block::Workers,
                "old workers" => Block::OldWorkers,
                _ => Block::Other,
            };
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(pid), Some(kind)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        match (&block, kind) {
            (Block::Master, "master") => {
                info.master_pid = pid;
                info.reloads = fields.next()?.parse().ok()?;
                let rest: Vec<&str> = fields.collect();
                let failed = rest
                    .windows(2)
                    .find(|w| w[0] == "[failed:")
                    .and_then(|w| w[1].trim_end_matches(']').parse().ok())
                    .unwrap_or(0);
                info.failed = failed;
                seen_master = true;
            }
            (Block::Workers, "worker") => info.workers.push(pid),
            (Block::OldWorkers, "worker") => info.old_workers.push(pid),
            _ => {}
        }
    }
    seen_master.then_some(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_show_proc() {
        let text = "#<PID>          <type>          <reloads>       <uptime>        <version>\n\
            15024           master          3 [failed: 1]   0d00h00m03s     2.6.12-1+deb12u4\n\
            # workers\n\
            15030           worker          1               0d00h00m03s     2.6.12-1+deb12u4\n\
            # old workers\n\
            15001           worker          2               0d00h00m09s     2.6.12-1+deb12u4\n\
            # programs\n\n";
        let info = parse_show_proc(text).unwrap();
        assert_eq!(info.master_pid, 15024);
        assert_eq!(info.reloads, 3);
        assert_eq!(info.failed, 1);
        assert_eq!(info.workers, vec![15030]);
        assert_eq!(info.old_workers, vec![15001]);
        assert!(parse_show_proc("Unknown command\n").is_none());
    }

    #[test]
    fn parses_show_proc_of_3_0_and_3_4() {
        // 3.0.11 and 3.4.7 with an old worker draining a connection after a reload;
        // 3.4 prints no `# programs` block and pads every column.
        for text in [
            include_str!("fixtures/show-proc-3.0-old-worker.txt"),
            include_str!("fixtures/show-proc-3.4-old-worker.txt"),
        ] {
            let info = parse_show_proc(text).unwrap();
            assert_eq!((info.reloads, info.failed), (1, 0), "{text}");
            assert_eq!(info.workers.len(), 1, "{text}");
            assert_eq!(info.old_workers.len(), 1, "{text}");
            assert!(info.has_serving_worker());
        }
        // 3.4.7 after a failed reload: `# workers` is empty, and the worker that keeps
        // serving is listed first under `# old workers`.
        let text = include_str!("fixtures/show-proc-3.4-after-failure.txt");
        let info = parse_show_proc(text).unwrap();
        assert_eq!((info.master_pid, info.reloads, info.failed), (25277, 2, 1));
        assert!(info.workers.is_empty());
        assert_eq!(info.old_workers, vec![25282, 25279]);
        assert!(info.has_serving_worker());
        let starting = ProcInfo {
            master_pid: 1,
            ..ProcInfo::default()
        };
        assert!(!starting.has_serving_worker());
    }

    #[test]
    fn versions_parse_from_show_version_and_haproxy_v() {
        let v = |text| Version::parse(text).unwrap();
        assert_eq!(v("2.6.12-1+deb12u4\n\n"), Version { major: 2, minor: 6 });
        assert_eq!(v("3.4.7-1\n"), Version { major: 3, minor: 4 });
        assert_eq!(
            v("HAProxy version 3.0.11-1+deb13u4 2026/10/15 - https://haproxy.org/"),
            Version { major: 3, minor: 0 }
        );
        assert_eq!(v("3.2-dev7\n").to_string(), "3.2");
        assert!(!v("2.6.12").reload_answers());
        assert!(v("2.7.0").reload_answers());
        assert!(v("3.0.11").reload_answers());
        assert!(v("3.4.7-1").reload_answers());
        assert!(Version::parse("Unknown command.\n").is_none());
    }

    #[test]
    fn reload_answers_of_3_0_and_3_4_parse() {
        // Captured from 3.0.11 (trixie) and 3.4.7 (experimental): a good config, a
        // config with an unknown keyword, and 3.4's answer while the master's own
        // start is still loading the first worker.
        for text in [
            include_str!("fixtures/reload-3.0-success.txt"),
            include_str!("fixtures/reload-3.4-success.txt"),
        ] {
            let answer = parse_reload_answer(text).unwrap();
            let ReloadAnswer::Succeeded { log } = &answer else {
                panic!("{answer:?}");
            };
            assert!(log.starts_with("[NOTICE]"), "{log}");
            assert!(log.ends_with("Loading success."), "{log}");
            assert!(answer.alerts().is_empty());
        }
        assert!(
            include_str!("fixtures/reload-3.0-success.txt").contains("New worker (25181) forked")
        );
        assert!(
            include_str!("fixtures/reload-3.4-success.txt")
                .contains("Initializing new worker (25282)")
        );
        for text in [
            include_str!("fixtures/reload-3.0-failure.txt"),
            include_str!("fixtures/reload-3.4-failure.txt"),
        ] {
            let answer = parse_reload_answer(text).unwrap();
            assert!(matches!(answer, ReloadAnswer::Failed { .. }), "{answer:?}");
            assert_eq!(
                answer.alerts(),
                [
                    "[ALERT] config : parsing [cfg3:16] : unknown keyword 'bogus_keyword' in 'backend' section",
                    "[ALERT] config : Error(s) found in configuration file : cfg3",
                    "[ALERT] config : Fatal errors found in configuration.",
                ]
            );
        }
        assert_eq!(
            parse_reload_answer(include_str!("fixtures/reload-3.4-busy.txt")),
            Some(ReloadAnswer::Busy)
        );
        // A failure without a log is still a failure.
        assert_eq!(
            parse_reload_answer("Success=0\n--\n\n"),
            Some(ReloadAnswer::Failed { log: String::new() })
        );
        // 2.6 answers nothing; anything else is no answer either.
        assert_eq!(parse_reload_answer(""), None);
        assert_eq!(parse_reload_answer("Unknown command.\n"), None);
    }
}
