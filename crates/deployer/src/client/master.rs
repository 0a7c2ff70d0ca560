//! The master CLI client (`haproxy -W -S <socket>`): `show proc`, `reload` and
//! `@1 show env`.
//!
//! HAProxy 2.6's `reload` answers nothing and closes the connection; success or failure
//! shows only in `show proc` (`<reloads> [failed: N]`). The driver builds the confirmed
//! reload on top of these primitives.

use std::time::Duration;

use crate::client::socket::{CliClient, SocketAddress, SocketError};

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
    /// PIDs of old workers still draining connections.
    pub old_workers: Vec<u32>,
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
    pub async fn worker_env(&self, name: &str) -> Result<Option<String>, SocketError> {
        let text = self.cli.query(&format!("@1 show env {name}")).await?;
        let prefix = format!("{name}=");
        Ok(text
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map(str::to_owned))
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
}
