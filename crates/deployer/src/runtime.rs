//! The runtime API client: server state, dynamic servers, versioned map and ACL
//! replacement, and certificate transactions.
//!
//! Commands go either to a worker stats socket (`level admin`) or through the master
//! CLI as `@1 <command>`; both answer the same text. HAProxy's answers carry no status
//! code, so every method checks the answer against what success looks like for that
//! command and returns [`RuntimeError::Rejected`] with HAProxy's words otherwise.

use crate::socket::{CliClient, SocketAddress, SocketError};

/// Payload chunks stay below this many bytes: a `<<` payload must fit in one 16 KB
/// buffer, and a larger one is silently dropped by HAProxy 2.6.
pub const MAX_PAYLOAD_BYTES: usize = 14 * 1024;

/// Why a runtime command failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The socket exchange failed.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// HAProxy refused the command.
    #[error("HAProxy refused `{command}`: {}", answer.trim())]
    Rejected {
        /// The command line.
        command: String,
        /// HAProxy's answer.
        answer: String,
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
}

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
        Self { cli, via_master }
    }

    /// Sends one command (plus payload, if `request` has one) and returns the answer.
    pub async fn command(&self, request: &str) -> Result<String, SocketError> {
        if self.via_master {
            self.cli.exchange(&format!("@1 {request}")).await
        } else {
            self.cli.exchange(request).await
        }
    }

    /// Sends `commands` on one line separated by `;`, each addressed to the worker
    /// when going through the master CLI (there a prefix applies to one command
    /// only); returns the concatenated answers.
    async fn chained(&self, commands: &[&str]) -> Result<String, SocketError> {
        let prefix = if self.via_master { "@1 " } else { "" };
        let line = commands
            .iter()
            .map(|command| format!("{prefix}{command}"))
            .collect::<Vec<_>>()
            .join("; ");
        self.cli.exchange(&line).await
    }

    async fn expect(
        &self,
        request: &str,
        ok: impl Fn(&str) -> bool,
    ) -> Result<String, RuntimeError> {
        let answer = self.command(request).await?;
        if ok(&answer) {
            Ok(answer)
        } else {
            Err(RuntimeError::Rejected {
                command: request.lines().next().unwrap_or_default().to_owned(),
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
        let mut request = format!("set server {backend}/{server} addr {addr}");
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
            &format!("set server {backend}/{server} weight {weight}"),
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
            &format!("set server {backend}/{server} state {state}"),
            is_empty,
        )
        .await
        .map(drop)
    }

    /// `shutdown sessions server <be>/<srv>`: closes connections pinned to a server
    /// whose address just changed.
    pub async fn shutdown_sessions(&self, backend: &str, server: &str) -> Result<(), RuntimeError> {
        self.expect(
            &format!("shutdown sessions server {backend}/{server}"),
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
        let mut request = format!("add server {backend}/{server} {address}");
        for param in params {
            request.push(' ');
            request.push_str(param);
        }
        self.expect(&request, |a| a.contains("New server registered"))
            .await
            .map(drop)
    }

    /// `enable server <be>/<srv>`.
    pub async fn enable_server(&self, backend: &str, server: &str) -> Result<(), RuntimeError> {
        self.expect(&format!("enable server {backend}/{server}"), is_empty)
            .await
            .map(drop)
    }

    /// `enable health <be>/<srv>`: starts the checks of a dynamic server.
    pub async fn enable_health(&self, backend: &str, server: &str) -> Result<(), RuntimeError> {
        self.expect(&format!("enable health {backend}/{server}"), is_empty)
            .await
            .map(drop)
    }

    /// `del server <be>/<srv>` (the server must be in maintenance without connections).
    pub async fn del_server(&self, backend: &str, server: &str) -> Result<(), RuntimeError> {
        self.expect(&format!("del server {backend}/{server}"), |a| {
            a.contains("Server deleted")
        })
        .await
        .map(drop)
    }

    /// `show servers state [<be>]`, raw.
    pub async fn show_servers_state(&self, backend: Option<&str>) -> Result<String, RuntimeError> {
        let request = match backend {
            Some(backend) => format!("show servers state {backend}"),
            None => "show servers state".to_owned(),
        };
        Ok(self.command(&request).await?)
    }

    /// The file paths of the loaded maps or ACL files, as the config wrote them
    /// (`show map` / `show acl`; inline ACLs are left out).
    pub async fn pattern_files(&self, kind: PatternKind) -> Result<Vec<String>, RuntimeError> {
        let answer = self.command(&format!("show {}", kind.as_str())).await?;
        Ok(parse_pattern_listing(&answer))
    }

    /// Certificates known to HAProxy (`show ssl cert`), committed ones only.
    pub async fn ssl_certs(&self) -> Result<Vec<String>, RuntimeError> {
        let answer = self.command("show ssl cert").await?;
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
            .ok_or_else(|| RuntimeError::Rejected {
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
                        return Err(RuntimeError::Rejected {
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
            .command(&format!("show {kind_name} @{version} {file}"))
            .await?;
        let actual = staged.lines().filter(|l| !l.trim().is_empty()).count();
        if actual != entries.len() {
            return Err(RuntimeError::CountMismatch {
                file: file.to_owned(),
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
        let body: String = pem.lines().filter(|l| !l.trim().is_empty()).fold(
            String::with_capacity(pem.len()),
            |mut out, line| {
                out.push_str(line);
                out.push('\n');
                out
            },
        );
        let set = format!("set ssl cert {file} <<\n{body}\n");
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
    let mut batches = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    let mut size = 0;
    for command in commands {
        if !current.is_empty() && size + command.len() + PER_COMMAND > limit {
            batches.push(std::mem::take(&mut current));
            size = 0;
        }
        size += command.len() + PER_COMMAND;
        current.push(command);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
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
    use super::*;

    #[test]
    fn cli_words_escape_separators() {
        assert_eq!(cli_word("a.test"), "a.test");
        assert_eq!(cli_word("with space;semi\\"), "with\\ space\\;semi\\\\");
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
