//! The transport under the runtime API and the master CLI: one short connection per
//! command over a Unix socket or TCP, with the half-close HAProxy 2.6's master CLI
//! needs and a timeout on every step.
//!
//! # Retry policy
//!
//! HAProxy's CLI has no request ids, so a command that reached HAProxy cannot be told
//! apart from one that did not once the exchange breaks. The policy follows from that:
//! - [`CliClient::exchange`] (commands that change something): retried with backoff
//!   only while *connecting* fails (refused, socket file missing, connect timeout),
//!   because then not a byte was sent. Once the request was written, any failure is
//!   returned as is: sending `set server`, `add map` or `reload` twice is not safe.
//! - [`CliClient::query`] (read-only `show ...` commands): also retried after a broken
//!   exchange (reset, early close), since running a read twice does no harm. The
//!   master CLI resets connections for up to ~1.5 s during a reload.
//! - A timeout is never retried: the peer is alive but slow, and a retry would only
//!   add load.
//!
//! Also defines [`InstanceConfig`], the plain description of one socket instance the
//! drivers and the managed-process supervisor are built from.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::time::timeout;

/// Where a socket listens: a Unix socket path or a TCP `host:port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SocketAddress {
    /// A Unix domain socket.
    Unix(PathBuf),
    /// A TCP `host:port`.
    Tcp(String),
}

impl SocketAddress {
    /// The form HAProxy's `-S` and `stats socket` accept: the path, or `ipv4@host:port`.
    pub fn haproxy_bind(&self) -> String {
        match self {
            SocketAddress::Unix(path) => path.display().to_string(),
            SocketAddress::Tcp(addr) => format!("ipv4@{addr}"),
        }
    }
}

impl fmt::Display for SocketAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SocketAddress::Unix(path) => write!(f, "{}", path.display()),
            SocketAddress::Tcp(addr) => f.write_str(addr),
        }
    }
}

impl FromStr for SocketAddress {
    type Err = std::convert::Infallible;

    /// `unix@/path`, `/path`, `./path` → Unix; `tcp@host:port`, `ipv4@host:port`,
    /// `host:port` → TCP. Anything else is taken as a (relative) Unix path.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Some(path) = text.strip_prefix("unix@") {
            return Ok(SocketAddress::Unix(path.into()));
        }
        for prefix in ["tcp@", "ipv4@", "ipv6@"] {
            if let Some(addr) = text.strip_prefix(prefix) {
                return Ok(SocketAddress::Tcp(addr.to_owned()));
            }
        }
        let looks_tcp = !text.contains('/')
            && text
                .rsplit_once(':')
                .is_some_and(|(_, port)| port.parse::<u16>().is_ok());
        Ok(if looks_tcp {
            SocketAddress::Tcp(text.to_owned())
        } else {
            SocketAddress::Unix(text.into())
        })
    }
}

/// One HAProxy instance reached through local sockets.
///
/// The lead maps the `haproxy.instances[]` entries of the controller config onto this.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceConfig {
    /// Unique instance name (metrics label, events, logs).
    pub name: String,
    /// The master CLI (`-S`): reloads, `show proc`, and `@1` for runtime commands.
    pub master: SocketAddress,
    /// A worker stats socket with `level admin`; `None` sends runtime commands through
    /// the master as `@1 <command>`.
    pub runtime: Option<SocketAddress>,
    /// Where `haproxy.cfg`, `maps/`, `files/` and `certs/` land. HAProxy must run with
    /// this as its working directory so relative paths in the config resolve.
    pub config_dir: PathBuf,
    /// Whether hapwright starts and supervises this HAProxy itself.
    pub managed: bool,
    /// Environment of the managed process (`${VAR}` in the config).
    pub env: BTreeMap<String, String>,
    /// Permissions of the files written into `config_dir` (`socket.certMode`,
    /// `socket.certGroup`): give them to the instance's
    /// [`ConfigDir`](crate::haproxy::files::ConfigDir) with `with_modes`.
    pub file_modes: crate::haproxy::files::FileModes,
    /// `haproxy.dynamicBackends`: whether added and removed `backend NAME from
    /// PROFILE` sections go through the runtime API (HAProxy 3.4 and later).
    pub dynamic_backends: bool,
}

impl InstanceConfig {
    /// An unmanaged instance talking to `master`, writing into `config_dir`.
    pub fn new(
        name: impl Into<String>,
        master: SocketAddress,
        config_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            name: name.into(),
            master,
            runtime: None,
            config_dir: config_dir.into(),
            managed: false,
            env: BTreeMap::new(),
            file_modes: crate::haproxy::files::FileModes::default(),
            dynamic_backends: false,
        }
    }

    /// Sets [`InstanceConfig::dynamic_backends`] (`haproxy.dynamicBackends`).
    #[must_use]
    pub fn with_dynamic_backends(mut self, enabled: bool) -> Self {
        self.dynamic_backends = enabled;
        self
    }
}

impl From<&crate::config::Address> for SocketAddress {
    fn from(address: &crate::config::Address) -> Self {
        match address {
            crate::config::Address::Unix(path) => SocketAddress::Unix(path.clone()),
            crate::config::Address::Tcp(addr) => SocketAddress::Tcp(addr.clone()),
        }
    }
}

impl InstanceConfig {
    /// The socket instance described by a `haproxy.instances[]` entry; `None` for a
    /// Data Plane API instance.
    pub fn from_config(instance: &crate::config::Instance) -> Option<Self> {
        let socket = instance.socket.as_ref()?;
        Some(Self {
            name: instance.name.clone(),
            master: (&socket.master).into(),
            runtime: socket.runtime.as_ref().map(SocketAddress::from),
            config_dir: socket.config_dir.clone(),
            managed: instance.managed,
            env: instance.environment(),
            file_modes: crate::haproxy::files::FileModes::from_config(socket),
            dynamic_backends: false,
        })
    }
}

/// Timeouts and retries of one socket client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    /// Bound on connecting.
    pub connect_timeout: Duration,
    /// Bound on one whole exchange (write, half-close, read to EOF).
    pub io_timeout: Duration,
    /// Connection attempts while the socket refuses connections.
    pub attempts: usize,
    /// First retry delay; doubles up to [`max_delay`](Self::max_delay).
    pub min_delay: Duration,
    /// Longest retry delay.
    pub max_delay: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(10),
            attempts: 6,
            min_delay: Duration::from_millis(20),
            max_delay: Duration::from_millis(500),
        }
    }
}

/// Why a socket exchange failed. Only [`SocketError::Connect`] proves that nothing was
/// sent; after the other two the command may or may not have run.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Could not connect (after the retries): nothing was sent.
    #[error("cannot connect to {address}")]
    Connect {
        /// The socket.
        address: SocketAddress,
        /// The last error.
        #[source]
        source: io::Error,
    },
    /// The exchange did not finish in time: the command may have run.
    #[error("{address} did not answer `{command}` within {timeout:?}")]
    Timeout {
        /// The socket.
        address: SocketAddress,
        /// The command (first line).
        command: String,
        /// The bound.
        timeout: Duration,
    },
    /// Reading or writing failed after connecting: the command may have run.
    #[error("talking to {address} failed")]
    Io {
        /// The socket.
        address: SocketAddress,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

impl SocketError {
    /// Whether the command provably was not sent (connecting failed), so sending it
    /// again cannot run it twice.
    pub fn nothing_sent(&self) -> bool {
        matches!(self, SocketError::Connect { .. })
    }

    /// Whether the error says the peer is not (yet) accepting connections or dropped
    /// the exchange, the states a master CLI passes through during a reload. Only
    /// read-only commands may be retried on all of these (see the module docs).
    pub fn is_unavailable(&self) -> bool {
        self.nothing_sent()
            || matches!(self, SocketError::Io { source, .. } if is_transient(source))
    }
}

fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::NotFound
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof
    )
}

/// A line-protocol client: one connection per command, `command\n`, half-close, read
/// to EOF. Cheap to clone.
#[derive(Clone, Debug)]
pub struct CliClient {
    address: SocketAddress,
    config: ClientConfig,
}

impl CliClient {
    /// A client for `address` with default timeouts.
    pub fn new(address: SocketAddress) -> Self {
        Self {
            address,
            config: ClientConfig::default(),
        }
    }

    /// Replaces the timeouts and retries.
    #[must_use]
    pub fn with_config(mut self, config: ClientConfig) -> Self {
        self.config = config;
        self
    }

    /// The socket this client talks to.
    pub fn address(&self) -> &SocketAddress {
        &self.address
    }

    /// The timeouts and retries.
    pub fn config(&self) -> ClientConfig {
        self.config
    }

    /// Sends one command line (with an optional `<<` payload, which must already be
    /// part of `request`) and returns everything HAProxy answered.
    ///
    /// Retried with exponential backoff only while connecting fails, when nothing was
    /// sent ([`SocketError::nothing_sent`]); once the request was written, a broken
    /// exchange is returned at once, because the command may already have run.
    pub async fn exchange(&self, request: &str) -> Result<String, SocketError> {
        self.with_retries(request, SocketError::nothing_sent).await
    }

    /// Sends a read-only command (`show ...`). Unlike [`exchange`](Self::exchange) it
    /// is also retried when the exchange broke after the request was written: running
    /// a read twice changes nothing. Never use it for a command that changes state.
    pub async fn query(&self, request: &str) -> Result<String, SocketError> {
        self.with_retries(request, SocketError::is_unavailable)
            .await
    }

    async fn with_retries(
        &self,
        request: &str,
        retry: fn(&SocketError) -> bool,
    ) -> Result<String, SocketError> {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(self.config.min_delay)
            .with_max_delay(self.config.max_delay)
            .with_max_times(self.config.attempts.saturating_sub(1));
        (|| self.exchange_once(request))
            .retry(backoff)
            .sleep(tokio::time::sleep)
            .when(retry)
            .await
    }

    /// Sends `requests` (command lines, each with its `<<` payload if it has one) on
    /// one connection in interactive mode (`prompt`), all written at once, and
    /// returns each one's answer, in order. HAProxy runs them one after the other,
    /// as if each had its own connection, but the exchange costs one round trip
    /// instead of one per command: the commands of one runtime change (a
    /// certificate's `new`, `set` and `commit`) reach HAProxy together.
    ///
    /// Retried like [`exchange`](Self::exchange): only while connecting fails. An
    /// answer that is missing (the exchange broke half-way) is an
    /// [`SocketError::Io`] error: some of the commands may have run.
    pub async fn exchange_all(&self, requests: &[String]) -> Result<Vec<String>, SocketError> {
        let mut session = String::from("prompt\n");
        for request in requests {
            session.push_str(request);
            if !request.ends_with('\n') {
                session.push('\n');
            }
        }
        session.push_str("quit\n");
        let answer = self.exchange(&session).await?;
        split_prompted(&answer, requests.len()).ok_or_else(|| SocketError::Io {
            address: self.address.clone(),
            source: io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the interactive session ended before the answer to each of {} commands",
                    requests.len()
                ),
            ),
        })
    }

    /// One attempt, without retries.
    pub async fn exchange_once(&self, request: &str) -> Result<String, SocketError> {
        let connect_timeout = self.config.connect_timeout;
        let connect_error = |source: io::Error| SocketError::Connect {
            address: self.address.clone(),
            source,
        };
        let timed_out = || SocketError::Timeout {
            address: self.address.clone(),
            command: request.lines().next().unwrap_or_default().to_owned(),
            timeout: self.config.io_timeout,
        };
        match &self.address {
            SocketAddress::Unix(path) => {
                let stream = timeout(connect_timeout, UnixStream::connect(path))
                    .await
                    .map_err(|_| connect_error(io::ErrorKind::TimedOut.into()))?
                    .map_err(connect_error)?;
                timeout(self.config.io_timeout, talk(stream, request))
                    .await
                    .map_err(|_| timed_out())?
            }
            SocketAddress::Tcp(addr) => {
                let stream = timeout(connect_timeout, TcpStream::connect(addr.as_str()))
                    .await
                    .map_err(|_| connect_error(io::ErrorKind::TimedOut.into()))?
                    .map_err(connect_error)?;
                stream.set_nodelay(true).ok();
                timeout(self.config.io_timeout, talk(stream, request))
                    .await
                    .map_err(|_| timed_out())?
            }
        }
        .map_err(|source| SocketError::Io {
            address: self.address.clone(),
            source,
        })
    }
}

/// The answers of an interactive session ([`CliClient::exchange_all`]): HAProxy
/// writes its prompt (`> ` from a worker, `master> ` or `master[…]> ` from the
/// master) at the start of a line after each answer, and a `+ ` per payload line it
/// reads. The text before the first prompt answers `prompt` itself; the next
/// `count` answers, each ended by a prompt, are the commands'. `None` when fewer
/// came.
fn split_prompted(output: &str, count: usize) -> Option<Vec<String>> {
    let prompt_at = |line: &str| -> Option<usize> {
        let rest = line.strip_prefix("master").map_or(line, |rest| {
            rest.strip_prefix('[')
                .and_then(|inner| inner.split_once(']').map(|(_, after)| after))
                .unwrap_or(rest)
        });
        rest.starts_with("> ").then(|| line.len() - rest.len() + 2)
    };
    let mut answers: Vec<String> = Vec::new();
    let mut current: Option<String> = None;
    for line in output.split_inclusive('\n') {
        match prompt_at(line) {
            Some(skip) => {
                if let Some(done) = current.take() {
                    answers.push(done);
                }
                let mut rest = &line[skip..];
                // A prompt right after a prompt: the one `quit` got, or the master's
                // own after the worker's answer.
                while let Some(next) = prompt_at(rest) {
                    if !answers.is_empty() {
                        answers.push(String::new());
                    }
                    rest = &rest[next..];
                }
                while let Some(after) = rest.strip_prefix("+ ") {
                    rest = after;
                }
                current = Some(rest.to_owned());
            }
            None => {
                if let Some(text) = current.as_mut() {
                    text.push_str(line);
                }
            }
        }
    }
    // The text after the last prompt answers nothing: HAProxy prompts when it is
    // done with a command, so an answer is whole only when a prompt follows it.
    drop(current);
    (answers.len() >= count).then(|| {
        answers.truncate(count);
        answers
    })
}

async fn talk<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &str,
) -> io::Result<String> {
    let mut bytes = Vec::with_capacity(request.len() + 1);
    bytes.extend_from_slice(request.as_bytes());
    if !request.ends_with('\n') {
        bytes.push(b'\n');
    }
    stream.write_all(&bytes).await?;
    // HAProxy 2.6's master CLI only answers and closes after the client half-closes.
    stream.shutdown().await?;
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(
            "/run/haproxy/master.sock".parse::<SocketAddress>().unwrap(),
            SocketAddress::Unix("/run/haproxy/master.sock".into())
        );
        assert_eq!(
            "127.0.0.1:9999".parse::<SocketAddress>().unwrap(),
            SocketAddress::Tcp("127.0.0.1:9999".into())
        );
        assert_eq!(
            "unix@master.sock".parse::<SocketAddress>().unwrap(),
            SocketAddress::Unix("master.sock".into())
        );
        assert_eq!(
            "master.sock".parse::<SocketAddress>().unwrap(),
            SocketAddress::Unix("master.sock".into())
        );
        assert_eq!(
            SocketAddress::Tcp("127.0.0.1:1".into()).haproxy_bind(),
            "ipv4@127.0.0.1:1"
        );
    }

    /// As HAProxy 2.6 answered five commands (two with payloads) in one session,
    /// from a worker socket and through the master CLI (`@1`).
    #[test]
    fn a_session_splits_into_one_answer_per_command() {
        let worker = "\n> New empty certificate store 'c.pem'!\n\n> + + + Transaction created for certificate c.pem!\n\n> Committing c.pem\nSuccess!\n\n> Can't delete the entry: certificate 'c.pem' can't be found in crt-list 'l'!\n\n> + + Inserting certificate 'c.pem' in crt-list 'l'.\nSuccess!\n\n> ";
        let master = worker.replace("\n> ", "\nmaster> ").trim_start().to_owned() + "master> ";
        let reload_failed = master.replace("master> ", "master[ReloadFailed]> ");
        for output in [worker.to_owned(), master, reload_failed] {
            let answers = split_prompted(&output, 5).expect("five answers");
            assert_eq!(
                answers,
                [
                    "New empty certificate store 'c.pem'!\n\n",
                    "Transaction created for certificate c.pem!\n\n",
                    "Committing c.pem\nSuccess!\n\n",
                    "Can't delete the entry: certificate 'c.pem' can't be found in crt-list 'l'!\n\n",
                    "Inserting certificate 'c.pem' in crt-list 'l'.\nSuccess!\n\n",
                ],
                "{output:?}"
            );
            // Fewer answers than commands: the session broke.
            assert_eq!(split_prompted(&output, 7), None);
        }
        let cut = &worker[..worker.find("> Committing").expect("in the text")];
        // The second answer has no prompt after it: it may be cut short.
        assert_eq!(split_prompted(cut, 2), None);
        assert_eq!(split_prompted(cut, 1).map(|a| a.len()), Some(1));
        assert_eq!(split_prompted("", 1), None);
    }
}
