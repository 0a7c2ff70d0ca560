//! The ordered configuration model: sections, directives, servers and balance
//! algorithms, built from the words the tokenizer produces.

use std::fmt;
use std::sync::Arc;

use super::tokenizer::{quote_word, split_words};

/// Why a configuration could not be parsed: the 1-based line, the column when known,
/// and what is wrong (HAProxy's wording where it has one).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}{}: {message}", column.map(|c| format!(", column {c}")).unwrap_or_default())]
pub struct ParseError {
    /// 1-based line in the parsed text.
    pub line: u32,
    /// 1-based character column, when the error points at one character.
    pub column: Option<u32>,
    /// What is wrong.
    pub message: String,
}

/// The kind of a section, from its header keyword.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SectionKind {
    /// Synthetic section holding the conditional (`.if` …) and diagnostic (`.notice`
    /// …) lines that come before the first real section header. It has no header
    /// line and is only present when such lines exist.
    Preamble,
    /// `global`.
    Global,
    /// `defaults [name]`.
    Defaults,
    /// `frontend <name>`.
    Frontend,
    /// `backend <name>`.
    Backend,
    /// `listen <name>` (a frontend and a backend in one).
    Listen,
    /// `userlist <name>`.
    Userlist,
    /// `peers <name>`.
    Peers,
    /// `resolvers <name>`.
    Resolvers,
    /// `mailers <name>`.
    Mailers,
    /// `ring <name>`.
    Ring,
    /// `http-errors <name>`.
    HttpErrors,
    /// `cache <name>`.
    Cache,
    /// `program <name>`.
    Program,
    /// Another section keyword HAProxy knows (`log-forward`, `fcgi-app`, and the 3.x
    /// `crt-store`, `traces`, `acme`), kept by its keyword.
    Other(String),
}

/// Section keywords that are kept as [`SectionKind::Other`].
const OTHER_SECTIONS: &[&str] = &["log-forward", "fcgi-app", "crt-store", "traces", "acme"];

impl SectionKind {
    /// The kind a header keyword starts, or `None` when `keyword` is not a section
    /// keyword.
    pub fn from_keyword(keyword: &str) -> Option<Self> {
        Some(match keyword {
            "global" => Self::Global,
            "defaults" => Self::Defaults,
            "frontend" => Self::Frontend,
            "backend" => Self::Backend,
            "listen" => Self::Listen,
            "userlist" => Self::Userlist,
            "peers" => Self::Peers,
            "resolvers" => Self::Resolvers,
            "mailers" => Self::Mailers,
            "ring" => Self::Ring,
            "http-errors" => Self::HttpErrors,
            "cache" => Self::Cache,
            "program" => Self::Program,
            other if OTHER_SECTIONS.contains(&other) => Self::Other(other.to_owned()),
            _ => return None,
        })
    }

    /// The header keyword (`backend`); empty for [`SectionKind::Preamble`].
    pub fn keyword(&self) -> &str {
        match self {
            Self::Preamble => "",
            Self::Global => "global",
            Self::Defaults => "defaults",
            Self::Frontend => "frontend",
            Self::Backend => "backend",
            Self::Listen => "listen",
            Self::Userlist => "userlist",
            Self::Peers => "peers",
            Self::Resolvers => "resolvers",
            Self::Mailers => "mailers",
            Self::Ring => "ring",
            Self::HttpErrors => "http-errors",
            Self::Cache => "cache",
            Self::Program => "program",
            Self::Other(keyword) => keyword,
        }
    }

    /// Whether this is a proxy section (frontend, backend or listen), whose names
    /// must be unique.
    pub fn is_proxy(&self) -> bool {
        matches!(self, Self::Frontend | Self::Backend | Self::Listen)
    }

    /// Whether sections of this kind can hold `server` lines and take traffic from
    /// `use_backend` (backend and listen).
    pub fn has_servers(&self) -> bool {
        matches!(self, Self::Backend | Self::Listen)
    }
}

impl fmt::Display for SectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Preamble => f.write_str("(before the first section)"),
            other => f.write_str(other.keyword()),
        }
    }
}

/// One non-blank, non-comment line inside a section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Directive {
    /// The first word (`server`, `http-request`, `.if`).
    pub keyword: String,
    /// The other words, unquoted and unescaped; environment references (`${VAR}`)
    /// stay as written, so the model does not depend on the environment.
    pub args: Vec<String>,
    /// 1-based line number.
    pub line: u32,
    /// The line as written, with surrounding blanks removed.
    pub text: String,
}

impl Directive {
    /// Whether this is a conditional block line: `.if`, `.elif`, `.else`, `.endif`.
    pub fn is_conditional(&self) -> bool {
        matches!(self.keyword.as_str(), ".if" | ".elif" | ".else" | ".endif")
    }

    /// Whether the keyword and the arguments equal `other`'s (line and text ignored).
    pub fn same_words(&self, other: &Directive) -> bool {
        self.keyword == other.keyword && self.args == other.args
    }
}

/// A section: its header and its directives in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    /// What kind of section.
    pub kind: SectionKind,
    /// The name (first header argument); `None` for `global`, unnamed `defaults` and
    /// the preamble.
    pub name: Option<String>,
    /// Header arguments after the name (`from <defaults>` for proxies).
    pub args: Vec<String>,
    /// 1-based line of the header (0 for the preamble).
    pub line: u32,
    /// The directives, in file order, including conditional block lines.
    pub directives: Vec<Directive>,
}

impl Section {
    /// Every `server` line that names a server and an address, in file order.
    /// (A malformed `server` line, rejected by HAProxy, is left out.)
    pub fn servers(&self) -> Vec<Server> {
        self.directives
            .iter()
            .filter_map(Server::from_directive)
            .collect()
    }

    /// The `server` directives [`servers`](Self::servers) reads, without building
    /// them: every `server` line with at least a name and an address.
    pub fn server_directives(&self) -> impl Iterator<Item = &Directive> + '_ {
        self.directives
            .iter()
            .filter(|d| d.keyword == "server" && d.args.len() >= 2)
    }

    /// How many servers [`servers`](Self::servers) returns.
    pub fn server_count(&self) -> usize {
        self.server_directives().count()
    }

    /// The section's own `balance` (the last one wins, as in HAProxy), together with
    /// its own `hash-type`. Does not look at `defaults`; see
    /// [`Config::effective_balance`] for that.
    pub fn balance(&self) -> Option<Balance> {
        let balance = self.last("balance")?;
        let algorithm = balance.args.first()?.clone();
        Some(Balance {
            algorithm,
            args: balance.args[1..].to_vec(),
            hash_type: self.last("hash-type").map(|d| d.args.clone()),
        })
    }

    /// Every directive except `server` lines, in order: what must stay equal for a
    /// change to be applied to servers alone.
    pub fn directives_except_servers(&self) -> impl Iterator<Item = &Directive> + '_ {
        self.directives.iter().filter(|d| d.keyword != "server")
    }

    /// Directives with the given keyword, in order.
    pub fn directives_named<'a>(
        &'a self,
        keyword: &'a str,
    ) -> impl Iterator<Item = &'a Directive> + 'a {
        self.directives.iter().filter(move |d| d.keyword == keyword)
    }

    /// The last directive with the given keyword.
    pub fn last(&self, keyword: &str) -> Option<&Directive> {
        self.directives.iter().rev().find(|d| d.keyword == keyword)
    }

    /// The defaults section named in the header (`backend be from my-defaults`).
    pub fn from_defaults(&self) -> Option<&str> {
        match self.args.as_slice() {
            [from, name] if from == "from" => Some(name),
            _ => None,
        }
    }
}

/// A `server <name> <address>[:<port>] [params…]` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    /// Server name.
    pub name: String,
    /// Address without the port: an IP (IPv6 without brackets), a host name, a
    /// prefixed address (`ipv4@…`, `unix@…`), or an unexpanded `${VAR}`.
    pub address: String,
    /// The port, when it is written as a plain number (`None` when it is missing, an
    /// offset such as `+1`, a range, or an environment reference).
    pub port: Option<u16>,
    /// Every word after the address (`check`, `weight`, `10`, …).
    pub params: Vec<String>,
    /// 1-based line number.
    pub line: u32,
}

impl Server {
    /// The server a `server` directive declares; `None` for any other directive and
    /// for a `server` line without a name and an address.
    pub fn from_directive(directive: &Directive) -> Option<Server> {
        if directive.keyword != "server" {
            return None;
        }
        let [name, address, params @ ..] = directive.args.as_slice() else {
            return None;
        };
        let (address, port) = split_address(address);
        Some(Server {
            name: name.clone(),
            address,
            port,
            params: params.to_vec(),
            line: directive.line,
        })
    }
}

/// Splits `host:port`, `[v6]:port` and `v6:port` (the last colon separates the
/// port, as in HAProxy). Socket paths and `unix@`/`abns@`/`fd@`/`sockpair@`
/// addresses have no port.
pub fn split_address(text: &str) -> (String, Option<u16>) {
    const NO_PORT: &[&str] = &["unix@", "abns@", "fd@", "sockpair@", "/"];
    if NO_PORT.iter().any(|prefix| text.starts_with(prefix)) {
        return (text.to_owned(), None);
    }
    let (prefix, rest) = match text.find('@') {
        Some(at) => text.split_at(at + 1),
        None => ("", text),
    };
    let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
        match inner.split_once(']') {
            Some((host, after)) => (host, after.strip_prefix(':')),
            None => (rest, None),
        }
    } else {
        match rest.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        }
    };
    let port = port
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|p| p.parse::<u16>().ok());
    (format!("{prefix}{host}"), port)
}

/// A backend's load-balancing algorithm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Balance {
    /// The algorithm word as written (`roundrobin`, `random(2)`, `hdr(host)`).
    pub algorithm: String,
    /// Words after the algorithm (`url_param userid check_post` → `["check_post"]`).
    pub args: Vec<String>,
    /// The `hash-type` words that apply (`["consistent", "sdbm"]`), if any.
    pub hash_type: Option<Vec<String>>,
}

impl Balance {
    /// HAProxy's default: `roundrobin`, map-based hashing.
    pub fn default_roundrobin() -> Self {
        Self {
            algorithm: "roundrobin".to_owned(),
            args: Vec::new(),
            hash_type: None,
        }
    }

    /// The algorithm name without its parenthesised argument (`hdr(host)` → `hdr`).
    pub fn name(&self) -> &str {
        self.algorithm
            .split_once('(')
            .map_or(self.algorithm.as_str(), |(name, _)| name)
    }

    /// Whether the algorithm hashes a request property.
    pub fn is_hash_based(&self) -> bool {
        matches!(
            self.name(),
            "source" | "uri" | "url_param" | "hdr" | "rdp-cookie" | "hash"
        )
    }

    /// Whether HAProxy 2.6 accepts `add server` / `del server` on a backend using
    /// this algorithm: `roundrobin`, `leastconn`, `first`, `random`, or a hash-based
    /// algorithm with `hash-type consistent`. `static-rr` and map-based hashing are
    /// static (haproxy-2.6.md fact 5).
    pub fn is_dynamic(&self) -> bool {
        match self.name() {
            "roundrobin" | "leastconn" | "first" | "random" => true,
            _ if self.is_hash_based() => self
                .hash_type
                .as_ref()
                .and_then(|words| words.first())
                .is_some_and(|method| method == "consistent"),
            _ => false,
        }
    }
}

/// A parsed configuration: its sections in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Sections in file order; a [`SectionKind::Preamble`] section comes first when
    /// conditional or diagnostic lines precede the first header.
    ///
    /// Each section is shared: a model parsed from the previous one (phase 1 parsing
    /// only what changed) holds the very sections of it that did not change, so they
    /// are neither copied nor compared again ([`Arc::ptr_eq`] tells them apart: a
    /// section shared by two models comes from the same lines, on the same line
    /// numbers, of both texts).
    pub sections: Vec<Arc<Section>>,
}

impl Config {
    /// The first section of `kind` named `name`.
    pub fn section(&self, kind: SectionKind, name: &str) -> Option<&Section> {
        self.sections
            .iter()
            .map(|s| &**s)
            .find(|s| s.kind == kind && s.name.as_deref() == Some(name))
    }

    /// Sections of one kind, in order.
    pub fn sections_of(&self, kind: SectionKind) -> impl Iterator<Item = &Section> + '_ {
        self.sections
            .iter()
            .map(|s| &**s)
            .filter(move |s| s.kind == kind)
    }

    /// `backend` sections, in order (see also [`Config::server_proxies`]).
    pub fn backends(&self) -> impl Iterator<Item = &Section> + '_ {
        self.sections_of(SectionKind::Backend)
    }

    /// `frontend` sections, in order.
    pub fn frontends(&self) -> impl Iterator<Item = &Section> + '_ {
        self.sections_of(SectionKind::Frontend)
    }

    /// `listen` sections, in order.
    pub fn listens(&self) -> impl Iterator<Item = &Section> + '_ {
        self.sections_of(SectionKind::Listen)
    }

    /// Sections that can hold servers: backends and listens, in order.
    pub fn server_proxies(&self) -> impl Iterator<Item = &Section> + '_ {
        self.sections
            .iter()
            .map(|s| &**s)
            .filter(|s| s.kind.has_servers())
    }

    /// The `global` section, if any.
    pub fn global(&self) -> Option<&Section> {
        self.sections_of(SectionKind::Global).next()
    }

    /// The defaults section a proxy inherits from: the one named by `from`, or else
    /// the last `defaults` section before it (by line number).
    pub fn defaults_for(&self, section: &Section) -> Option<&Section> {
        if let Some(name) = section.from_defaults() {
            return self.section(SectionKind::Defaults, name);
        }
        self.sections
            .iter()
            .rev()
            .map(|s| &**s)
            .find(|s| s.kind == SectionKind::Defaults && s.line < section.line)
    }

    /// The balance algorithm a backend or listen section really uses: its own
    /// `balance`/`hash-type`, else those of its defaults section, else HAProxy's
    /// default (`roundrobin`).
    pub fn effective_balance(&self, section: &Section) -> Balance {
        let defaults = self.defaults_for(section);
        let hash_type = section
            .last("hash-type")
            .or_else(|| defaults.and_then(|d| d.last("hash-type")))
            .map(|d| d.args.clone());
        let mut balance = section
            .balance()
            .or_else(|| defaults.and_then(Section::balance))
            .unwrap_or_else(Balance::default_roundrobin);
        balance.hash_type = hash_type;
        balance
    }
}

// === parsing ===

/// Tracks `.if` nesting for structural errors.
struct Conditionals {
    /// For each open block: the line of its `.if` and whether `.else` was seen.
    open: Vec<(u32, bool)>,
}

impl Conditionals {
    fn step(&mut self, keyword: &str, line: u32) -> Result<(), ParseError> {
        let error = |message: String| {
            Err(ParseError {
                line,
                column: None,
                message,
            })
        };
        match keyword {
            ".if" => self.open.push((line, false)),
            ".elif" | ".else" => match self.open.last_mut() {
                None => return error(format!("lone '{keyword}' with no matching '.if'.")),
                Some((_, true)) => {
                    return error(format!("'{keyword}' after '.else' is unexpected."));
                }
                Some((_, seen_else)) => *seen_else = keyword == ".else",
            },
            ".endif" if self.open.pop().is_none() => {
                return error("lone '.endif' with no matching '.if'.".to_owned());
            }
            _ => {}
        }
        Ok(())
    }
}

/// Parses the whole text, keeping every line that can be parsed and returning every
/// error found (not only the first). Never panics.
pub fn parse_lenient(text: &str) -> (Config, Vec<ParseError>) {
    let mut sections: Vec<Section> = Vec::new();
    let mut errors = Vec::new();
    let mut conditionals = Conditionals { open: Vec::new() };
    for (index, raw) in text.split('\n').enumerate() {
        let line = u32::try_from(index + 1).unwrap_or(u32::MAX);
        let words = match split_words(raw) {
            Ok(words) => words,
            Err(err) => {
                errors.push(ParseError {
                    line,
                    column: Some(err.column),
                    message: format!("{}.", err.message),
                });
                continue;
            }
        };
        let mut words = words.into_iter();
        let Some(keyword) = words.next() else {
            continue;
        };
        let mut args: Vec<String> = words.collect();
        // Collected in place: the buffer of every word, keyword included.
        args.shrink_to_fit();
        if let Some(kind) = SectionKind::from_keyword(&keyword) {
            let (name, args) = match (&kind, args.split_first()) {
                (SectionKind::Global, _) | (_, None) => (None, args),
                (_, Some((name, rest))) => (Some(name.clone()), rest.to_vec()),
            };
            sections.push(Section {
                kind,
                name,
                args,
                line,
                directives: Vec::new(),
            });
            continue;
        }
        if keyword.starts_with('.')
            && let Err(error) = conditionals.step(&keyword, line)
        {
            errors.push(error);
            continue;
        }
        let directive = Directive {
            keyword,
            args,
            line,
            text: raw.trim_matches(|c: char| c.is_whitespace()).to_owned(),
        };
        match sections.last_mut() {
            Some(section) => section.directives.push(directive),
            None if directive.keyword.starts_with('.') => sections.push(Section {
                kind: SectionKind::Preamble,
                name: None,
                args: Vec::new(),
                line: 0,
                directives: vec![directive],
            }),
            None => errors.push(ParseError {
                line,
                column: None,
                message: format!("unknown keyword '{}' out of section.", directive.keyword),
            }),
        }
    }
    for (line, _) in conditionals.open {
        errors.push(ParseError {
            line,
            column: None,
            message: "non-terminated '.if' block.".to_owned(),
        });
    }
    errors.sort_by_key(|e| e.line);
    // The model lives as long as the deployment it describes: no spare capacity.
    for section in &mut sections {
        section.directives.shrink_to_fit();
    }
    let sections = sections.into_iter().map(Arc::new).collect();
    (Config { sections }, errors)
}

/// Parses a configuration. Fails with the first error (by line); never panics.
pub fn parse(text: &str) -> Result<Config, ParseError> {
    let (config, mut errors) = parse_lenient(text);
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(errors.swap_remove(0))
    }
}

// === printing ===

fn print_words<'a>(words: impl Iterator<Item = &'a String>, out: &mut String) {
    let mut last_empty = false;
    for (index, word) in words.enumerate() {
        if index > 0 {
            out.push(' ');
        }
        quote_word(word, out);
        last_empty = word.is_empty();
    }
    if last_empty {
        // HAProxy drops an empty last word unless blanks follow it.
        out.push(' ');
    }
}

/// Prints a configuration canonically: headers at column 0, directives indented by
/// four spaces, one blank line between sections, words quoted only where needed.
/// Comments and the original spacing are not kept; [`parse`] reads the output back
/// into the same sections, names and words.
pub fn print(config: &Config) -> String {
    let mut out = String::new();
    for section in &config.sections {
        if !out.is_empty() {
            out.push('\n');
        }
        if section.kind != SectionKind::Preamble {
            let keyword = section.kind.keyword().to_owned();
            let header = std::iter::once(&keyword)
                .chain(section.name.iter())
                .chain(section.args.iter());
            print_words(header, &mut out);
            out.push('\n');
        }
        for directive in &section.directives {
            out.push_str("    ");
            print_words(
                std::iter::once(&directive.keyword).chain(directive.args.iter()),
                &mut out,
            );
            out.push('\n');
        }
    }
    out
}
