//! The runtime API client: server state, dynamic servers, versioned map and ACL
//! replacement, certificate transactions, and the lossless server moves and removals
//! built from them.
//!
//! Commands go either to a worker stats socket (`level admin`) or through the master
//! CLI as `@1 <command>`; both answer the same text. HAProxy's answers carry no status
//! code, so every method checks the answer against what success looks like for that
//! command and returns [`RuntimeError::Refused`] with HAProxy's words otherwise.
//!
//! Commands that change something are sent once (see the retry policy in
//! [`crate::client::socket`]); `show ...` reads go through [`CliClient::query`] and may be
//! retried.
//!
//! # Moving and removing servers without failing requests
//!
//! Measured on HAProxy 2.6.12 (see `docs/deployment.md`): `set server addr` closes the
//! server's *idle* connections, and new connections go to the new address at once,
//! but connections busy at that moment return to the idle pool when their request
//! ends and are reused for later requests, which then reach the old address.
//! `shutdown sessions server` fixes that by failing every request in flight (502).
//! Connections that finish while the server is in maintenance also go to the idle pool
//! and make `del server` refuse ("still has connections") until they are purged; a
//! second address change purges them. So [`RuntimeClient::move_server`] lets a
//! stand-in server carry the traffic while the real one drains in maintenance, and
//! [`RuntimeClient::remove_server`] drains before `del server`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::client::socket::{CliClient, SocketAddress, SocketError};

mod certs;
mod map_entries;

pub use certs::parse_crt_list_entries;
pub use map_entries::{MAX_ENTRY_COMMANDS, entry_commands};

/// Payload chunks stay below this many bytes: a `<<` payload must fit in one 16 KB
/// buffer, and a larger one is silently dropped by HAProxy 2.6.
pub const MAX_PAYLOAD_BYTES: usize = 14 * 1024;

/// How long a server move or removal waits for the requests in flight on the server by
/// default (see [`RuntimeClient::with_drain_timeout`]).
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a drain polls `show servers conn`.
const DRAIN_POLL: Duration = Duration::from_millis(10);

/// Why a runtime command failed. [`RuntimeError::class`] sorts the variants into the
/// classes a caller acts on differently (for example, the reload fallback's reason).
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Connecting to the socket failed (after retries): nothing was sent, nothing
    /// changed.
    #[error("cannot reach the runtime API to send `{command}`")]
    Unreachable {
        /// The command line.
        command: String,
        /// The connect error.
        #[source]
        source: SocketError,
    },
    /// The command was sent, but the exchange broke (reset, early close, timeout): it
    /// may or may not have run, so it is not sent again.
    #[error("`{command}` was sent but the exchange broke")]
    Exchange {
        /// The command line.
        command: String,
        /// The transport error.
        #[source]
        source: SocketError,
    },
    /// A word of the command holds a control character: it was not sent (a newline
    /// would end the command and run the rest as another admin command).
    #[error("refusing to send `{command}`: it holds a control character")]
    UnsafeCommand {
        /// The command line, control characters escaped.
        command: String,
    },
    /// HAProxy answered and refused the command.
    #[error("HAProxy refused `{command}`: {}", answer.trim())]
    Refused {
        /// The command line.
        command: String,
        /// HAProxy's answer.
        answer: String,
    },
    /// HAProxy answered something this client cannot make sense of.
    #[error("unexpected answer to `{command}`: {:?}", answer.trim())]
    Unexpected {
        /// The command line.
        command: String,
        /// HAProxy's answer.
        answer: String,
    },
    /// A file the change addresses is not loaded by HAProxy under that name.
    #[error("{file} is not loaded by HAProxy as {expected}")]
    NotLoaded {
        /// Path relative to the config directory.
        file: String,
        /// What it should have been loaded as ("a map or ACL file", "a certificate").
        expected: &'static str,
    },
    /// A staged map or ACL version did not hold what was sent (a dropped payload).
    #[error("{file}: staged version {version} holds {actual} entries, expected {expected}")]
    CountMismatch {
        /// Pattern file path as HAProxy knows it.
        file: String,
        /// Staged version.
        version: u64,
        /// Entries sent.
        expected: usize,
        /// Entries HAProxy holds.
        actual: usize,
    },
    /// Requests in flight on a server did not finish within the drain timeout.
    #[error("{backend}/{server} still had requests in flight after {after:?}")]
    DrainTimeout {
        /// Backend.
        backend: String,
        /// Server.
        server: String,
        /// The drain timeout.
        after: Duration,
    },
}

/// The classes of runtime failures: what a caller can conclude about the instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuntimeFailure {
    /// HAProxy answered and said no: the change cannot be made at runtime.
    Refused,
    /// Nothing was sent: the runtime API is not reachable.
    Unreachable,
    /// The exchange broke after sending, or the answer made no sense: the command may
    /// or may not have run.
    Protocol,
    /// Requests in flight did not finish in time, so the change was not completed.
    Drain,
}

impl RuntimeError {
    /// The class of this failure.
    pub fn class(&self) -> RuntimeFailure {
        match self {
            RuntimeError::Unreachable { .. } => RuntimeFailure::Unreachable,
            RuntimeError::Refused { .. }
            | RuntimeError::NotLoaded { .. }
            | RuntimeError::UnsafeCommand { .. } => RuntimeFailure::Refused,
            RuntimeError::Exchange { .. }
            | RuntimeError::Unexpected { .. }
            | RuntimeError::CountMismatch { .. } => RuntimeFailure::Protocol,
            RuntimeError::DrainTimeout { .. } => RuntimeFailure::Drain,
        }
    }

    fn from_socket(command: &str, source: SocketError) -> Self {
        let command = first_line(command);
        if source.nothing_sent() {
            RuntimeError::Unreachable { command, source }
        } else {
            RuntimeError::Exchange { command, source }
        }
    }
}

fn first_line(request: &str) -> String {
    request.lines().next().unwrap_or_default().to_owned()
}

/// A server's connections as `show servers conn` reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerConnections {
    /// Connections carrying a request now (`used_cur`).
    pub used: u64,
    /// Idle connections kept for reuse (`idle_cur`).
    pub idle: u64,
}

/// Which kind of pattern file a command addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PatternKind {
    /// A map (`map(<file>)` converters): `key value` lines.
    Map,
    /// An ACL pattern file (`-f <file>`): one pattern per line.
    Acl,
}

impl PatternKind {
    /// `map` or `acl`, as in the command names.
    pub fn as_str(self) -> &'static str {
        match self {
            PatternKind::Map => "map",
            PatternKind::Acl => "acl",
        }
    }
}

/// Talks to the runtime API of the current worker.
#[derive(Clone, Debug)]
pub struct RuntimeClient {
    cli: CliClient,
    via_master: bool,
    drain_timeout: Duration,
}

/// Numbers the stand-in servers of [`RuntimeClient::move_server`] so two moves never
/// pick the same name, even when an earlier stand-in was left behind.
static STAND_IN: AtomicU64 = AtomicU64::new(1);

impl RuntimeClient {
    /// Commands go straight to a worker stats socket.
    pub fn direct(address: SocketAddress) -> Self {
        Self::from_cli(CliClient::new(address), false)
    }

    /// Commands go through the master CLI, prefixed with `@1`.
    pub fn via_master(master: SocketAddress) -> Self {
        Self::from_cli(CliClient::new(master), true)
    }

    /// Over an existing transport; `via_master` adds the `@1` prefix.
    pub fn from_cli(cli: CliClient, via_master: bool) -> Self {
        Self {
            cli,
            via_master,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }

    /// How long [`move_server`](Self::move_server) and
    /// [`remove_server`](Self::remove_server) wait for requests in flight on a server
    /// before giving up; it bounds how long a deployment can take.
    #[must_use]
    pub fn with_drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// The drain bound.
    pub fn drain_timeout(&self) -> Duration {
        self.drain_timeout
    }

    fn addressed(&self, request: &str) -> String {
        if self.via_master {
            format!("@1 {request}")
        } else {
            request.to_owned()
        }
    }

    /// Sends one command that may change something (plus payload, if `request` has
    /// one) and returns the answer. Sent at most once unless connecting failed.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::UnsafeCommand`] before anything is sent when the command line
    /// holds a control character (a newline would start another admin command).
    pub async fn command(&self, request: &str) -> Result<String, RuntimeError> {
        check_line(request)?;
        self.cli
            .exchange(&self.addressed(request))
            .await
            .map_err(|e| RuntimeError::from_socket(request, e))
    }

    /// Sends a read-only command (`show ...`), retried after a broken exchange too.
    pub async fn query(&self, request: &str) -> Result<String, RuntimeError> {
        check_line(request)?;
        self.cli
            .query(&self.addressed(request))
            .await
            .map_err(|e| RuntimeError::from_socket(request, e))
    }

    /// Sends `commands` on one line separated by `;`, each addressed to the worker
    /// when going through the master CLI (there a prefix applies to one command
    /// only); returns the concatenated answers.
    async fn chained(&self, commands: &[&str]) -> Result<String, RuntimeError> {
        for command in commands {
            check_line(command)?;
        }
        let prefix = if self.via_master { "@1 " } else { "" };
        let line = commands
            .iter()
            .map(|command| format!("{prefix}{command}"))
            .collect::<Vec<_>>()
            .join("; ");
        self.cli
            .exchange(&line)
            .await
            .map_err(|e| RuntimeError::from_socket(commands.first().copied().unwrap_or(""), e))
    }

    /// Sends `requests` on one connection ([`CliClient::exchange_all`]), each
    /// addressed to the worker; returns their answers in order.
    async fn session(&self, requests: &[String]) -> Result<Vec<String>, RuntimeError> {
        for request in requests {
            check_line(request)?;
        }
        let addressed: Vec<String> = requests.iter().map(|r| self.addressed(r)).collect();
        self.cli
            .exchange_all(&addressed)
            .await
            .map_err(|e| RuntimeError::from_socket(requests.first().map_or("", String::as_str), e))
    }

    async fn expect(
        &self,
        request: &str,
        ok: impl Fn(&str) -> bool,
    ) -> Result<String, RuntimeError> {
        let answer = self.command(request).await?;
        if ok(&answer) {
            Ok(answer)
        } else if answer.trim().is_empty() {
            // HAProxy words every refusal; silence where an answer was due means the
            // exchange broke (e.g. the peer closed after reading).
            Err(RuntimeError::Unexpected {
                command: first_line(request),
                answer,
            })
        } else {
            Err(RuntimeError::Refused {
                command: first_line(request),
                answer,
            })
        }
    }

    /// `set server <be>/<srv> addr <ip> [port <port>]`.
    pub async fn set_server_addr(
        &self,
        backend: &str,
        server: &str,
        addr: &str,
        port: Option<u16>,
    ) -> Result<(), RuntimeError> {
        let mut request = format!(
            "set server {} addr {}",
            target(backend, server),
            cli_word(addr)
        );
        if let Some(port) = port {
            request.push_str(&format!(" port {port}"));
        }
        self.expect(&request, |a| {
            a.contains("changed from") || a.contains("no need to change")
        })
        .await
        .map(drop)
    }

    /// `set server <be>/<srv> weight <n>`.
    pub async fn set_server_weight(
        &self,
        backend: &str,
        server: &str,
        weight: u32,
    ) -> Result<(), RuntimeError> {
        self.expect(
            &format!("set server {} weight {weight}", target(backend, server)),
            is_empty,
        )
        .await
        .map(drop)
    }

    /// `set server <be>/<srv> state <ready|drain|maint>`.
    pub async fn set_server_state(
        &self,
        backend: &str,
        server: &str,
        state: &str,
    ) -> Result<(), RuntimeError> {
        self.expect(
            &format!(
                "set server {} state {}",
                target(backend, server),
                cli_word(state)
            ),
            is_empty,
        )
        .await
        .map(drop)
    }

    /// `add server <be>/<srv> <addr> <params..>` (the server starts in maintenance).
    pub async fn add_server(
        &self,
        backend: &str,
        server: &str,
        address: &str,
        params: &[String],
    ) -> Result<(), RuntimeError> {
        let request = add_server_command(backend, server, address, params);
        self.expect(&request, |a| a.contains("New server registered"))
            .await
            .map(drop)
    }

    /// `enable dynamic-cookie backend <be>`: HAProxy recomputes every server's dynamic
    /// cookie from its address and the backend's `dynamic-cookie-key`.
    pub async fn refresh_dynamic_cookies(&self, backend: &str) -> Result<(), RuntimeError> {
        self.expect(
            &format!("enable dynamic-cookie backend {}", cli_word(backend)),
            is_empty,
        )
        .await
        .map(drop)
    }

    /// `enable server <be>/<srv>`.
    pub async fn enable_server(&self, backend: &str, server: &str) -> Result<(), RuntimeError> {
        self.expect(
            &format!("enable server {}", target(backend, server)),
            is_empty,
        )
        .await
        .map(drop)
    }

    /// `enable health <be>/<srv>`: starts the checks of a dynamic server.
    pub async fn enable_health(&self, backend: &str, server: &str) -> Result<(), RuntimeError> {
        self.expect(
            &format!("enable health {}", target(backend, server)),
            is_empty,
        )
        .await
        .map(drop)
    }

    /// `del server <be>/<srv>` (the server must be in maintenance without connections).
    pub async fn del_server(&self, backend: &str, server: &str) -> Result<(), RuntimeError> {
        self.expect(&format!("del server {}", target(backend, server)), |a| {
            a.contains("Server deleted")
        })
        .await
        .map(drop)
    }

    /// A server's current connections (`show servers conn <be>`); `None` when the
    /// backend has no such server.
    pub async fn server_connections(
        &self,
        backend: &str,
        server: &str,
    ) -> Result<Option<ServerConnections>, RuntimeError> {
        let request = format!("show servers conn {}", cli_word(backend));
        let answer = self.query(&request).await?;
        parse_server_connections(&answer, backend, server).map_err(|_| RuntimeError::Unexpected {
            command: request,
            answer,
        })
    }

    /// Waits until no request is in flight on the server (`used_cur` 0), polling until
    /// the drain timeout.
    async fn drained(&self, backend: &str, server: &str) -> Result<(), RuntimeError> {
        let deadline = Instant::now() + self.drain_timeout;
        loop {
            match self.server_connections(backend, server).await? {
                None => return Ok(()),
                Some(conns) if conns.used == 0 => return Ok(()),
                Some(_) if Instant::now() >= deadline => {
                    return Err(RuntimeError::DrainTimeout {
                        backend: backend.to_owned(),
                        server: server.to_owned(),
                        after: self.drain_timeout,
                    });
                }
                Some(_) => tokio::time::sleep(DRAIN_POLL).await,
            }
        }
    }

    /// Moves a serving server to a new address without failing a request in flight
    /// and without a later request reaching the old address through a reused
    /// connection; the server keeps its name (the config's), so later plans and
    /// reloads find it.
    ///
    /// 1. `add server <be>/<srv>-hapwright-<n>` at the new address with `params`
    ///    (no health check: it is up at once), then `enable server`: a stand-in;
    /// 2. `set server <srv> state maint`: new requests go to the stand-in and the
    ///    other servers; requests in flight on `<srv>` go on;
    /// 3. wait until `<srv>` has no request in flight (bounded by the drain timeout);
    /// 4. `set server <srv> addr`: HAProxy closes the idle connections to the old
    ///    address, including those that finished during the drain; a connection
    ///    released just after that is closed by moving the port away and back
    ///    (still in maintenance) until `show servers conn` reports none;
    /// 5. `set server <srv> state ready`;
    /// 6. the stand-in goes to maintenance and is deleted once it has no
    ///    connections. If that does not happen within the drain timeout it stays in
    ///    maintenance (it points at the new address and takes no traffic) until the
    ///    next reload drops it; a warning says so.
    ///
    /// # Errors
    ///
    /// Any refused or failed step returns at once, leaving the instance between
    /// steps: callers fall back to a reload, which rebuilds every server from the
    /// config. [`RuntimeError::DrainTimeout`] when requests in flight on the server
    /// outlive the drain timeout.
    pub async fn move_server(
        &self,
        backend: &str,
        server: &str,
        addr: &str,
        port: Option<u16>,
        params: &[String],
    ) -> Result<(), RuntimeError> {
        let stand_in = format!(
            "{server}-hapwright-{}",
            STAND_IN.fetch_add(1, Ordering::Relaxed)
        );
        let address = match (addr.contains(':'), port) {
            (true, Some(port)) => format!("[{addr}]:{port}"),
            (false, Some(port)) => format!("{addr}:{port}"),
            (_, None) => addr.to_owned(),
        };
        self.add_server(backend, &stand_in, &address, params)
            .await?;
        self.enable_server(backend, &stand_in).await?;
        self.set_server_state(backend, server, "maint").await?;
        self.drained(backend, server).await?;
        self.set_server_addr(backend, server, addr, port).await?;
        self.settled(backend, server).await?;
        self.set_server_state(backend, server, "ready").await?;
        self.set_server_state(backend, &stand_in, "maint").await?;
        if !self.delete_drained(backend, &stand_in).await? {
            tracing::warn!(
                backend,
                server = %stand_in,
                after = ?self.drain_timeout,
                "Stand-in server still has connections; it stays in maintenance until the next reload"
            );
        }
        Ok(())
    }

    /// Removes a server without failing a request in flight: maintenance (no new
    /// requests; requests in flight go on), then `del server` once the server has no
    /// connections, bounded by the drain timeout. Idle connections that would keep
    /// `del server` refusing are closed by changing the address of the server in
    /// maintenance (it takes no traffic any more).
    ///
    /// Returns `false` when the drain timeout passed first: the server then stays in
    /// maintenance, taking no traffic, until the next reload drops it (it is no longer
    /// in the config); a warning says so. Adding a server of the same name later is
    /// refused by HAProxy, which falls back to that reload.
    pub async fn remove_server(&self, backend: &str, server: &str) -> Result<bool, RuntimeError> {
        self.set_server_state(backend, server, "maint").await?;
        let deleted = self.delete_drained(backend, server).await?;
        if !deleted {
            tracing::warn!(
                backend,
                server,
                after = ?self.drain_timeout,
                "Removed server still has requests in flight; it stays in maintenance until the next reload"
            );
        }
        Ok(deleted)
    }

    /// After the address change of a server in maintenance: waits until it has neither
    /// used nor idle connections. A connection released just after the change (its
    /// request ended as the address changed) lands in the idle pool with the old
    /// address; another address change closes it.
    async fn settled(&self, backend: &str, server: &str) -> Result<(), RuntimeError> {
        let deadline = Instant::now() + self.drain_timeout;
        loop {
            let conns = match self.server_connections(backend, server).await? {
                None => return Ok(()),
                Some(conns) if conns.used + conns.idle == 0 => return Ok(()),
                Some(conns) => conns,
            };
            if Instant::now() >= deadline {
                return Err(RuntimeError::DrainTimeout {
                    backend: backend.to_owned(),
                    server: server.to_owned(),
                    after: self.drain_timeout,
                });
            }
            if conns.used == 0 {
                self.purge_idle(backend, server, true).await?;
            } else {
                tokio::time::sleep(DRAIN_POLL).await;
            }
        }
    }

    /// `del server` on a server in maintenance, retried while HAProxy says it still
    /// has connections, until the drain timeout; `false` when time ran out.
    async fn delete_drained(&self, backend: &str, server: &str) -> Result<bool, RuntimeError> {
        let deadline = Instant::now() + self.drain_timeout;
        let mut purged = false;
        loop {
            match self.del_server(backend, server).await {
                Ok(()) => return Ok(true),
                Err(RuntimeError::Refused { answer, .. })
                    if answer.contains("still has connections") => {}
                Err(error) => return Err(error),
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            if !purged
                && let Some(conns) = self.server_connections(backend, server).await?
                && conns.used == 0
                && conns.idle > 0
            {
                self.purge_idle(backend, server, false).await?;
                purged = true;
                continue;
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }

    /// Closes the idle connections of a server in maintenance by moving its port (and
    /// back when `restore`): HAProxy 2.6 closes a server's idle connections on every
    /// address change, and a server in maintenance takes no traffic meanwhile.
    async fn purge_idle(
        &self,
        backend: &str,
        server: &str,
        restore: bool,
    ) -> Result<(), RuntimeError> {
        let request = format!("show servers state {}", cli_word(backend));
        let state = self.query(&request).await?;
        let (addr, port) =
            parse_server_address(&state, server).ok_or_else(|| RuntimeError::Unexpected {
                command: request,
                answer: state.clone(),
            })?;
        let other_port = if port == u16::MAX { 1 } else { port + 1 };
        self.set_server_addr(backend, server, &addr, Some(other_port))
            .await?;
        if restore {
            self.set_server_addr(backend, server, &addr, Some(port))
                .await?;
        }
        Ok(())
    }

    /// `show servers state [<be>]`, raw.
    pub async fn show_servers_state(&self, backend: Option<&str>) -> Result<String, RuntimeError> {
        let request = match backend {
            Some(backend) => format!("show servers state {}", cli_word(backend)),
            None => "show servers state".to_owned(),
        };
        self.query(&request).await
    }

    /// The file paths of the loaded maps or ACL files, as the config wrote them
    /// (`show map` / `show acl`; inline ACLs are left out).
    pub async fn pattern_files(&self, kind: PatternKind) -> Result<Vec<String>, RuntimeError> {
        let answer = self.query(&format!("show {}", kind.as_str())).await?;
        Ok(parse_pattern_listing(&answer))
    }

    /// Certificates known to HAProxy (`show ssl cert`), committed ones only.
    pub async fn ssl_certs(&self) -> Result<Vec<String>, RuntimeError> {
        let answer = self.query("show ssl cert").await?;
        let mut certs = Vec::new();
        let mut in_transaction = false;
        for line in answer.lines().map(str::trim) {
            if line.starts_with('#') {
                in_transaction = line.contains("transaction");
            } else if !line.is_empty() && !in_transaction {
                certs.push(line.trim_start_matches('*').to_owned());
            }
        }
        Ok(certs)
    }

    /// Atomically replaces the contents of a map or ACL file: `prepare`, `add @ver`
    /// payloads in chunks under [`MAX_PAYLOAD_BYTES`], a count check of the staged
    /// version, then `commit`. Returns the number of entries.
    ///
    /// `content` is the file as rendered; blank lines and `#` comments are skipped as
    /// HAProxy does when loading the file.
    pub async fn replace_patterns(
        &self,
        kind: PatternKind,
        file: &str,
        content: &str,
    ) -> Result<usize, RuntimeError> {
        let kind_name = kind.as_str();
        let path = file;
        let file = cli_word(file);
        let prepared = self
            .expect(&format!("prepare {kind_name} {file}"), |a| {
                a.contains("New version created")
            })
            .await?;
        let version: u64 = prepared
            .trim()
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| RuntimeError::Unexpected {
                command: format!("prepare {kind_name} {file}"),
                answer: prepared.clone(),
            })?;
        let entries: Vec<&str> = pattern_lines(content).collect();
        match kind {
            PatternKind::Map => {
                for chunk in chunk_lines(&entries, MAX_PAYLOAD_BYTES) {
                    let request = format!("add map @{version} {file} <<\n{chunk}\n");
                    self.expect(&request, is_empty).await?;
                }
            }
            PatternKind::Acl => {
                // HAProxy 2.6's `add acl` has no payload form: one pattern per
                // command, chained with `;` on lines under the payload limit.
                let commands: Vec<String> = entries
                    .iter()
                    .map(|pattern| format!("add acl @{version} {file} {}", cli_word(pattern)))
                    .collect();
                for batch in chain_commands(&commands, MAX_PAYLOAD_BYTES) {
                    let answer = self.chained(&batch).await?;
                    if !is_empty(&answer) {
                        return Err(RuntimeError::Refused {
                            command: format!(
                                "add acl @{version} {file} (a batch of {})",
                                batch.len()
                            ),
                            answer,
                        });
                    }
                }
            }
        }
        let staged = self
            .query(&format!("show {kind_name} @{version} {file}"))
            .await?;
        let actual = staged.lines().filter(|l| !l.trim().is_empty()).count();
        if actual != entries.len() {
            return Err(RuntimeError::CountMismatch {
                file: path.to_owned(),
                version,
                expected: entries.len(),
                actual,
            });
        }
        self.expect(&format!("commit {kind_name} @{version} {file}"), is_empty)
            .await?;
        Ok(entries.len())
    }

    /// Replaces a certificate referenced by the configuration: `set ssl cert <<` then
    /// `commit ssl cert` (aborted when the set is refused).
    pub async fn replace_certificate(&self, file: &str, pem: &str) -> Result<(), RuntimeError> {
        let file = cli_word(file);
        let set = set_cert_request(&file, pem);
        if let Err(error) = self
            .expect(&set, |a| {
                a.contains("Transaction created") || a.contains("Transaction updated")
            })
            .await
        {
            let _ = self.command(&format!("abort ssl cert {file}")).await;
            return Err(error);
        }
        self.expect(&format!("commit ssl cert {file}"), |a| {
            a.contains("Success")
        })
        .await
        .map(drop)
    }

    /// Sends one command of HAProxy's experimental set (the dynamic backend commands
    /// of 3.4) after `experimental-mode on` on the same connection, and checks the
    /// answer like [`Self::command`] callers do. Through the master CLI the mode is
    /// set on the master, which hands it on with the `@1` command.
    async fn experimental(
        &self,
        request: &str,
        ok: impl Fn(&str) -> bool,
    ) -> Result<String, RuntimeError> {
        check_line(request)?;
        let line = format!("experimental-mode on; {}", self.addressed(request));
        let answer = self
            .cli
            .exchange(&line)
            .await
            .map_err(|e| RuntimeError::from_socket(request, e))?;
        if ok(&answer) {
            Ok(answer)
        } else if answer.trim().is_empty() {
            Err(RuntimeError::Unexpected {
                command: first_line(request),
                answer,
            })
        } else {
            Err(RuntimeError::Refused {
                command: first_line(request),
                answer,
            })
        }
    }

    /// Sends `commands` on one line, with experimental mode on for it (the dynamic
    /// backend commands need it), and checks the answers together: each command's
    /// answer must hold its marker (`""`: nothing), in order, and nothing else may
    /// be said. One exchange instead of one per command: a new backend with its
    /// server is four commands. HAProxy runs every command of the line whatever the
    /// one before answered, so a caller sends together only commands whose partial
    /// effect is harmless (nothing routes to a backend before its map entry).
    pub async fn experimental_line(
        &self,
        commands: &[(String, &'static str)],
    ) -> Result<(), RuntimeError> {
        for (command, _) in commands {
            check_line(command)?;
        }
        let addressed: Vec<String> = commands.iter().map(|(c, _)| self.addressed(c)).collect();
        for range in line_ranges(&addressed, EXPERIMENTAL_LINE_BYTES) {
            let mut line = String::from("experimental-mode on");
            for command in &addressed[range.clone()] {
                line.push_str("; ");
                line.push_str(command);
            }
            self.check_line_answers(&commands[range], &line).await?;
        }
        Ok(())
    }

    /// Sends `line` (the commands of `commands`) and checks its answers as
    /// [`Self::experimental_line`] says.
    async fn check_line_answers(
        &self,
        commands: &[(String, &'static str)],
        line: &str,
    ) -> Result<(), RuntimeError> {
        let first = commands.first().map_or(String::new(), |(c, _)| c.clone());
        let answer = self
            .cli
            .exchange(line)
            .await
            .map_err(|e| RuntimeError::from_socket(&first, e))?;
        // The first command whose marker is missing is the one refused; text
        // besides the markers is a refusal of a command that answers nothing.
        let mut rest = answer.as_str();
        let mut said = String::new();
        for (command, marker) in commands.iter().filter(|(_, m)| !m.is_empty()) {
            let Some(at) = rest.find(marker) else {
                return Err(RuntimeError::Refused {
                    command: command.clone(),
                    answer,
                });
            };
            said.push_str(&rest[..at]);
            rest = &rest[at + marker.len()..];
        }
        said.push_str(rest);
        if said.trim().is_empty() {
            Ok(())
        } else {
            Err(RuntimeError::Refused {
                command: format!("{first} (one of {} commands on one line)", commands.len()),
                answer,
            })
        }
    }

    /// `add backend <be> from <profile>` (HAProxy 3.4): a new backend with the
    /// settings of the named `defaults` section, unpublished (no rule reaches it yet).
    pub async fn add_backend(&self, backend: &str, profile: &str) -> Result<(), RuntimeError> {
        self.experimental(&add_backend_command(backend, profile), |a| {
            a.contains(BACKEND_ADDED)
        })
        .await
        .map(drop)
    }

    /// A new backend of `profile` with its servers, published: `add backend`, then
    /// per server `add server` (with `enable health` and `enable server` as it asks),
    /// then `publish backend`, on one [`experimental_line`](Self::experimental_line)
    /// (cut at [`EXPERIMENTAL_LINE_BYTES`]). Only for a backend nothing routes to
    /// yet: HAProxy runs every command of a line whatever the one before answered.
    pub async fn add_published_backend<'a>(
        &self,
        backend: &str,
        profile: &str,
        servers: impl IntoIterator<Item = DynamicServer<'a>>,
    ) -> Result<(), RuntimeError> {
        let mut line = vec![(add_backend_command(backend, profile), BACKEND_ADDED)];
        for new in servers {
            line.push((
                add_server_command(backend, new.name, new.address, new.params),
                SERVER_ADDED,
            ));
            let target = target(backend, new.name);
            if new.health {
                line.push((format!("enable health {target}"), ""));
            }
            if new.enable {
                line.push((format!("enable server {target}"), ""));
            }
        }
        line.push((
            format!("publish backend {}", cli_word(backend)),
            BACKEND_PUBLISHED,
        ));
        self.experimental_line(&line).await
    }

    /// `unpublish backend <be>`: no rule selects it any more; streams already in it
    /// go on.
    pub async fn unpublish_backend(&self, backend: &str) -> Result<(), RuntimeError> {
        self.experimental(&format!("unpublish backend {}", cli_word(backend)), |a| {
            a.contains("Backend unpublished")
        })
        .await
        .map(drop)
    }

    /// `del backend <be>`: the backend must be unpublished and hold no server.
    pub async fn del_backend(&self, backend: &str) -> Result<(), RuntimeError> {
        self.experimental(&format!("del backend {}", cli_word(backend)), |a| {
            a.contains("Backend deleted")
        })
        .await
        .map(drop)
    }

    /// The names of a backend's servers as HAProxy runs them (`show servers conn`),
    /// stand-ins included.
    pub async fn backend_servers(&self, backend: &str) -> Result<Vec<String>, RuntimeError> {
        let request = format!("show servers conn {}", cli_word(backend));
        let answer = self.query(&request).await?;
        parse_backend_servers(&answer, backend).ok_or(RuntimeError::Unexpected {
            command: request,
            answer,
        })
    }

    /// Removes a whole backend without failing a request in flight: `unpublish
    /// backend` (no new request selects it; the map entries that routed to it are
    /// gone already), every server in maintenance, each deleted once its connections
    /// are gone (the servers drain together, so the drain timeout bounds the whole
    /// backend), then `del backend`.
    ///
    /// Returns `false` when the drain timeout passed first: the backend then stays
    /// unpublished, its remaining servers in maintenance, until the next reload drops
    /// it (it is no longer in the config); a warning says so. Adding a backend of the
    /// same name later is refused by HAProxy, which falls back to that reload.
    pub async fn remove_backend(&self, backend: &str) -> Result<bool, RuntimeError> {
        self.unpublish_backend(backend).await?;
        let servers = self.backend_servers(backend).await?;
        for server in &servers {
            self.set_server_state(backend, server, "maint").await?;
        }
        // One deadline for the whole backend: a server that drains late leaves the
        // next one only what is left of it.
        let deadline = Instant::now() + self.drain_timeout;
        for server in &servers {
            let bounded = self
                .clone()
                .with_drain_timeout(deadline.saturating_duration_since(Instant::now()));
            if !bounded.delete_drained(backend, server).await? {
                tracing::warn!(
                    backend,
                    server = %server,
                    after = ?self.drain_timeout,
                    "Removed backend still has requests in flight; it stays unpublished until the next reload"
                );
                return Ok(false);
            }
        }
        self.del_backend(backend).await?;
        Ok(true)
    }
}

/// The server names of `backend` in a `show servers conn <be>` answer; `None` when
/// the answer is not that table (HAProxy words an unknown backend in plain text).
pub fn parse_backend_servers(answer: &str, backend: &str) -> Option<Vec<String>> {
    let mut lines = answer.lines().filter(|l| !l.trim().is_empty());
    if !lines.next()?.starts_with("# bkname/svname") {
        return None;
    }
    Some(
        lines
            .filter_map(|line| line.split_whitespace().next())
            .filter_map(|id| id.split_once('/'))
            .filter(|(be, _)| *be == backend)
            .map(|(_, server)| server.to_owned())
            .collect(),
    )
}

/// Parses `show servers conn <be>` for one server: `Ok(None)` when it is not listed,
/// `Err` with what is wrong when the answer is not that table.
pub fn parse_server_connections(
    answer: &str,
    backend: &str,
    server: &str,
) -> Result<Option<ServerConnections>, &'static str> {
    const NOT_A_TABLE: &str = "not a `show servers conn` table";
    let mut lines = answer.lines();
    let header = lines.next().ok_or(NOT_A_TABLE)?;
    let columns: Vec<&str> = header
        .strip_prefix('#')
        .ok_or(NOT_A_TABLE)?
        .split_whitespace()
        .collect();
    let column = |name: &str| columns.iter().position(|c| *c == name).ok_or(NOT_A_TABLE);
    let (used_at, idle_at) = (column("used_cur")?, column("idle_cur")?);
    let key = format!("{backend}/{server}");
    for line in lines {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first() != Some(&key.as_str()) {
            continue;
        }
        let number = |at: usize| {
            fields
                .get(at)
                .and_then(|f| f.parse().ok())
                .ok_or("a connection count is not a number")
        };
        return Ok(Some(ServerConnections {
            used: number(used_at)?,
            idle: number(idle_at)?,
        }));
    }
    Ok(None)
}

/// The address and port of `server` in `show servers state <be>` output (fields
/// `srv_name` 4th, `srv_addr` 5th, `srv_port` 19th).
fn parse_server_address(state: &str, server: &str) -> Option<(String, u16)> {
    state.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 19 || fields[3] != server {
            return None;
        }
        Some((fields[4].to_owned(), fields[18].parse().ok()?))
    })
}

fn is_empty(answer: &str) -> bool {
    answer.trim().is_empty()
}

/// The entry lines of a map or ACL file: trimmed, without blanks and comments.
pub fn pattern_lines(content: &str) -> impl Iterator<Item = &str> {
    content
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// The command line of `request` (before a `<<` payload) has no control character:
/// HAProxy ends a command at a newline, so one inside a word would run what follows it
/// as another admin command. A payload is data and may span lines.
/// `set ssl cert <file> <<` with `pem` as its payload: its lines without the blank
/// ones (an empty line ends a payload), then the empty line.
pub(crate) fn set_cert_request(file: &str, pem: &str) -> String {
    let body: String = pem.lines().filter(|l| !l.trim().is_empty()).fold(
        String::with_capacity(pem.len()),
        |mut out, line| {
            out.push_str(line);
            out.push('\n');
            out
        },
    );
    format!("set ssl cert {file} <<\n{body}\n")
}

fn check_line(request: &str) -> Result<(), RuntimeError> {
    let line = match request.split_once("<<\n") {
        Some((line, _)) => line,
        None => request,
    };
    if line.chars().any(char::is_control) {
        return Err(RuntimeError::UnsafeCommand {
            command: line.escape_debug().to_string(),
        });
    }
    Ok(())
}

/// A server of a backend [`RuntimeClient::add_published_backend`] adds.
#[derive(Clone, Copy, Debug)]
pub struct DynamicServer<'a> {
    /// The server's name.
    pub name: &'a str,
    /// `ip:port`.
    pub address: &'a str,
    /// Its `add server` parameters.
    pub params: &'a [String],
    /// Whether to `enable health` (it has `check`).
    pub health: bool,
    /// Whether to `enable server` (it is not `disabled`).
    pub enable: bool,
}

/// What HAProxy answers to `add backend`, `add server` and `publish backend`.
const BACKEND_ADDED: &str = "New backend registered.";
const SERVER_ADDED: &str = "New server registered.";
const BACKEND_PUBLISHED: &str = "Backend published.";

fn add_backend_command(backend: &str, profile: &str) -> String {
    format!(
        "add backend {} from {}",
        cli_word(backend),
        cli_word(profile)
    )
}

fn add_server_command(backend: &str, server: &str, address: &str, params: &[String]) -> String {
    let mut request = format!(
        "add server {} {}",
        target(backend, server),
        cli_word(address)
    );
    for param in params {
        request.push(' ');
        request.push_str(&cli_word(param));
    }
    request
}

/// Longest command line [`RuntimeClient::experimental_line`] sends: through the
/// master CLI, HAProxy 3.4 ran only part of longer lines (of a 10,447-byte line of
/// `add server` commands, 257 of 260; of a 16,148-byte one, none), so a backend with
/// many servers goes on several lines, in order.
const EXPERIMENTAL_LINE_BYTES: usize = 4096;

/// `commands` cut into consecutive ranges whose line (`experimental-mode on`, then
/// each command after `; `) stays within `limit` bytes; a command longer than that
/// goes alone.
fn line_ranges(commands: &[String], limit: usize) -> Vec<std::ops::Range<usize>> {
    ranges_within(commands, "experimental-mode on".len(), "; ".len(), limit)
}

/// `commands` cut into consecutive ranges whose line, `head` bytes and then each
/// command with `per_command` bytes more, stays within `limit`; a command longer
/// than that goes alone.
fn ranges_within(
    commands: &[String],
    head: usize,
    per_command: usize,
    limit: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    let (mut start, mut len) = (0, head);
    for (index, command) in commands.iter().enumerate() {
        let more = per_command + command.len();
        if index > start && len + more > limit {
            ranges.push(start..index);
            (start, len) = (index, head);
        }
        len += more;
    }
    if start < commands.len() {
        ranges.push(start..commands.len());
    }
    ranges
}

/// `<backend>/<server>` with both names escaped as CLI words.
fn target(backend: &str, server: &str) -> String {
    format!("{}/{}", cli_word(backend), cli_word(server))
}

/// `word` as one CLI argument: HAProxy splits command lines at spaces and `;`, with
/// `\\` escaping the next character.
pub fn cli_word(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    for c in word.chars() {
        if matches!(c, ' ' | '\t' | ';' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Groups commands into batches whose `; `-joined line (with a worker prefix per
/// command) stays under `limit` bytes; a single longer command gets a batch of its own.
pub fn chain_commands(commands: &[String], limit: usize) -> Vec<Vec<&str>> {
    const PER_COMMAND: usize = "@1 ".len() + "; ".len();
    ranges_within(commands, 0, PER_COMMAND, limit)
        .into_iter()
        .map(|range| commands[range].iter().map(String::as_str).collect())
        .collect()
}

/// Joins lines into newline-separated chunks of at most `limit` bytes each (a single
/// longer line gets a chunk of its own).
pub fn chunk_lines(lines: &[&str], limit: usize) -> Vec<String> {
    let mut chunks = Vec::new();
    let mut current = String::new();
    for line in lines {
        if !current.is_empty() && current.len() + line.len() + 1 > limit {
            chunks.push(std::mem::take(&mut current));
        }
        current.push_str(line);
        current.push('\n');
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

/// Parses `show map` / `show acl` listings: `5 (maps/hosts.map) pattern loaded ...`.
pub fn parse_pattern_listing(answer: &str) -> Vec<String> {
    answer
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let start = line.find('(')?;
            let end = start + line[start..].find(')')?;
            let path = &line[start + 1..end];
            (!path.is_empty()).then(|| path.to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {

    /// A socket that answers one connection with `answer` and hands back the line it
    /// was sent.
    fn canned(
        dir: &std::path::Path,
        answer: &'static str,
    ) -> (
        super::super::socket::SocketAddress,
        tokio::task::JoinHandle<String>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let path = dir.join("cli.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let task = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut line = Vec::new();
            stream.read_to_end(&mut line).await.unwrap();
            stream.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8(line).unwrap()
        });
        (super::super::socket::SocketAddress::Unix(path), task)
    }

    #[test]
    fn long_command_lines_are_cut_in_order_within_the_limit() {
        let commands: Vec<String> = (0..10).map(|i| format!("command-{i:03}")).collect();
        // "experimental-mode on" is 20 bytes, each command 11 plus "; ".
        let whole = line_ranges(&commands, 1_000);
        assert_eq!((whole.len(), whole[0].clone()), (1, 0..10));
        let ranges = line_ranges(&commands, 20 + 3 * 13);
        assert_eq!(ranges, [0..3, 3..6, 6..9, 9..10]);
        // A command longer than the limit goes alone.
        let long = vec!["x".repeat(100), "y".to_owned(), "z".to_owned()];
        assert_eq!(line_ranges(&long, 50), [0..1, 1..3]);
        assert!(line_ranges(&[], 50).is_empty());
    }

    /// A backend with its server on one line: every answer checked, a refusal
    /// named by the command whose answer is missing, and anything said besides the
    /// expected answers taken for a refusal too.
    #[tokio::test]
    async fn commands_on_one_line_are_checked_answer_by_answer() {
        let line = || {
            vec![
                (
                    "add backend be_a from routes".to_owned(),
                    "New backend registered.",
                ),
                (
                    "add server be_a/s1 10.0.0.1:80".to_owned(),
                    "New server registered.",
                ),
                ("enable server be_a/s1".to_owned(), ""),
                ("publish backend be_a".to_owned(), "Backend published."),
            ]
        };
        let dir = tempfile::tempdir().unwrap();
        let (address, sent) = canned(
            dir.path(),
            "\nNew backend registered.\n\nNew server registered.\n\n\nBackend published.\n\n",
        );
        RuntimeClient::via_master(address)
            .experimental_line(&line())
            .await
            .unwrap();
        assert_eq!(
            sent.await.unwrap(),
            "experimental-mode on; @1 add backend be_a from routes; @1 add server be_a/s1 10.0.0.1:80; \
             @1 enable server be_a/s1; @1 publish backend be_a\n"
        );

        let dir = tempfile::tempdir().unwrap();
        let (address, _) = canned(
            dir.path(),
            "Error during backend creation : name is already used.\n\nNew server registered.\n\nBackend published.\n",
        );
        match RuntimeClient::via_master(address)
            .experimental_line(&line())
            .await
        {
            Err(RuntimeError::Refused { command, answer }) => {
                assert_eq!(command, "add backend be_a from routes");
                assert!(
                    answer.starts_with("Error during backend creation"),
                    "{answer}"
                );
            }
            other => panic!("{other:?}"),
        }

        let dir = tempfile::tempdir().unwrap();
        let (address, _) = canned(
            dir.path(),
            "New backend registered.\nNew server registered.\nNo such server.\nBackend published.\n",
        );
        match RuntimeClient::via_master(address)
            .experimental_line(&line())
            .await
        {
            Err(RuntimeError::Refused { command, answer }) => {
                assert_eq!(
                    command,
                    "add backend be_a from routes (one of 4 commands on one line)"
                );
                assert!(answer.contains("No such server."), "{answer}");
            }
            other => panic!("{other:?}"),
        }
    }
    use super::*;

    #[test]
    fn server_connections_parse_config_and_dynamic_rows() {
        // As HAProxy 2.6.12 prints it: a config server with idle pools, a dynamic one
        // without the per-thread column.
        let text = "# bkname/svname bkid/svid addr port - purge_delay used_cur used_max need_est unsafe_nb safe_nb idle_lim idle_cur idle_per_thr[2]\n\
            be/s1 3/1 127.0.0.1 19001 - 5000 1 3 3 2 0 -1 2 0 2\n\
            be/tmp 3/2 127.0.0.1 19002 - 0 0 1 1 0 0 0 0\n";
        assert_eq!(
            parse_server_connections(text, "be", "s1"),
            Ok(Some(ServerConnections { used: 1, idle: 2 }))
        );
        assert_eq!(
            parse_server_connections(text, "be", "tmp"),
            Ok(Some(ServerConnections { used: 0, idle: 0 }))
        );
        assert_eq!(parse_server_connections(text, "be", "gone"), Ok(None));
        assert!(parse_server_connections("Unknown command\n", "be", "s1").is_err());
        let state = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n\
            3 be 2 r1 127.0.0.1 2 0 1 1 175 1 0 0 0 0 0 0 - 19002 - 0 0 - - 0\n";
        assert_eq!(
            parse_server_address(state, "r1"),
            Some(("127.0.0.1".to_owned(), 19002))
        );
    }

    #[test]
    fn cli_words_escape_separators() {
        assert_eq!(cli_word("a.test"), "a.test");
        assert_eq!(cli_word("with space;semi\\"), "with\\ space\\;semi\\\\");
        assert_eq!(target("be;x", "s 1"), "be\\;x/s\\ 1");
    }

    #[test]
    fn control_characters_never_reach_the_socket() {
        assert!(check_line("set server be/s weight 5").is_ok());
        // A payload is data and spans lines.
        assert!(check_line("add map @1 maps/a.map <<\na b\nc d\n").is_ok());
        for bad in [
            "set server be/s\nshutdown sessions server be/s weight 5",
            "add map @1 maps/a\r.map <<\na b\n",
            "del server be/s\u{0}",
        ] {
            let error = check_line(bad).unwrap_err();
            assert!(
                matches!(error, RuntimeError::UnsafeCommand { .. }),
                "{bad:?}"
            );
            assert_eq!(error.class(), RuntimeFailure::Refused);
            assert!(!error.to_string().contains('\n'), "{error}");
        }
    }

    #[test]
    fn chained_batches_stay_under_the_limit() {
        let commands: Vec<String> = (0..3000)
            .map(|i| format!("add acl @1 files/blocked.acl 10.0.{}.{}", i / 256, i % 256))
            .collect();
        let batches = chain_commands(&commands, MAX_PAYLOAD_BYTES);
        assert!(batches.len() > 1);
        for batch in &batches {
            let line = batch
                .iter()
                .map(|c| format!("@1 {c}"))
                .collect::<Vec<_>>()
                .join("; ");
            assert!(line.len() <= MAX_PAYLOAD_BYTES, "{}", line.len());
        }
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 3000);
    }

    #[test]
    fn chunks_stay_under_the_limit() {
        let lines: Vec<String> = (0..2000)
            .map(|i| format!("host{i}.example.com be_{i}"))
            .collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let chunks = chunk_lines(&refs, MAX_PAYLOAD_BYTES);
        assert!(chunks.len() > 1);
        assert!(chunks.iter().all(|c| c.len() <= MAX_PAYLOAD_BYTES));
        assert_eq!(chunks.concat().lines().count(), 2000);
    }

    #[test]
    fn backend_server_lists_parse() {
        // `show servers conn be_new` on HAProxy 3.4.7.
        let answer = "# bkname/svname bkid/svid addr port - purge_delay served used_cur used_max need_est idle_sess unsafe_nb safe_nb idle_lim idle_cur idle_per_thr[2]\n\
                      be_new/s1 4/1 127.0.0.1 18998 - 5000 0 0 1 1 0 0 0 -1 0 0 0\n\
                      be_new/s2 4/2 127.0.0.1 18997 - 5000 0 0 1 1 0 0 0 -1 0 0 0\n\n";
        assert_eq!(
            super::parse_backend_servers(answer, "be_new"),
            Some(vec!["s1".to_owned(), "s2".to_owned()])
        );
        assert_eq!(
            super::parse_backend_servers("# bkname/svname bkid/svid addr\n\n", "be_new"),
            Some(Vec::new())
        );
        assert_eq!(
            super::parse_backend_servers("Can't find backend.\n", "be_new"),
            None
        );
    }

    #[test]
    fn listings_parse() {
        let text = "# id (file) description\n\
            5 (maps/hosts.map) pattern loaded from file 'maps/hosts.map' used by map at file 'haproxy.cfg' line 20. curr_ver=0 next_ver=0 entry_cnt=3\n\
            0 () acl 'path_beg' file 'haproxy.cfg' line 9. curr_ver=0 next_ver=0 entry_cnt=1\n";
        assert_eq!(parse_pattern_listing(text), vec!["maps/hosts.map"]);
        assert_eq!(
            pattern_lines("# c\n\n a b \nc d\n").collect::<Vec<_>>(),
            vec!["a b", "c d"]
        );
    }
}
