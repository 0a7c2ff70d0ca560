//! Dynamic backends (HAProxy 3.4 and later, `haproxy.dynamicBackends: true`): a render
//! whose only structural change is added or removed backends of the form
//!
//! ```text
//! backend be_shop from routes
//!     server s1 10.0.0.7:8080 check
//! ```
//!
//! (the profile a named `defaults` section the render leaves unchanged, the body
//! only `server` lines) is deployed without a reload. An added backend becomes
//! [`RuntimeOp::AddBackend`] — `add backend NAME from PROFILE`, its servers added and
//! enabled, `publish backend` — placed before every other change of the plan, so the
//! backend runs before a map entry routes to it. A removed backend becomes
//! [`RuntimeOp::DelBackend`] — `unpublish backend`, its servers drained (bounded by
//! the drain timeout), `del backend` — placed after every other change, so the map
//! entries that routed to it are gone first.
//!
//! Anything else — a backend with other directives, a profile that is not a named
//! `defaults` section or sets no `mode` (which `add backend` refuses), a server that
//! `add server` cannot create, another section added or removed, sections reordered —
//! reloads, and the plan says why. So does a line without `add backend`
//! ([`Capability::Unsupported`]).

use std::collections::HashSet;
use std::sync::Arc;

use hapwright_eventbus::model::ReloadReason;

use crate::client::master::Version;
use crate::component::validator::equivalence::Why;
use crate::haproxy::config::{Config, Section, SectionKind};
use crate::haproxy::plan::{self, NewServer, RuntimeOp};

/// The first HAProxy line with `add backend`.
pub const FIRST_LINE: Version = Version { major: 3, minor: 4 };

/// Whether an instance deploys added and removed backends at runtime.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Capability {
    /// `haproxy.dynamicBackends` is off (or the driver has no such commands).
    #[default]
    Off,
    /// It is on, but the instance cannot do it; the text says why (it ends up in
    /// the reload's reason).
    Unsupported(String),
    /// It is on and the instance runs a line with `add backend`.
    On,
}

impl Capability {
    /// The capability of an instance running `version` (`None`: the line could not
    /// be told) when `haproxy.dynamicBackends` is `enabled`.
    pub fn for_line(enabled: bool, version: Option<Version>) -> Self {
        match (enabled, version) {
            (false, _) => Capability::Off,
            (true, Some(version)) if version >= FIRST_LINE => Capability::On,
            (true, Some(version)) => Capability::Unsupported(format!(
                "HAProxy {version} has no `add backend` (dynamicBackends needs {FIRST_LINE} or later)"
            )),
            (true, None) => Capability::Unsupported(
                "the HAProxy line could not be told, so `add backend` is not used".to_owned(),
            ),
        }
    }
}

/// Backends a render adds and removes, when they can all be deployed at runtime.
#[derive(Debug, Default)]
pub struct BackendChanges<'a> {
    /// Added backends, in the order of the new config.
    pub added: Vec<&'a Section>,
    /// Removed backends, in the order of the old config.
    pub removed: Vec<&'a Section>,
    /// The addresses of `added` and `removed` (sections of the config being walked),
    /// so telling a section apart costs one lookup at 10,000 sections.
    added_at: HashSet<*const Section>,
    removed_at: HashSet<*const Section>,
}

impl<'a> BackendChanges<'a> {
    fn new(added: Vec<&'a Section>, removed: Vec<&'a Section>) -> Self {
        Self {
            added_at: added.iter().map(|s| std::ptr::from_ref(*s)).collect(),
            removed_at: removed.iter().map(|s| std::ptr::from_ref(*s)).collect(),
            added,
            removed,
        }
    }

    /// Whether `section` of the old config is one of the removed backends.
    pub fn is_removed(&self, section: &Section) -> bool {
        !self.removed_at.is_empty() && self.removed_at.contains(&std::ptr::from_ref(section))
    }

    /// Whether `section` of the new config is one of the added backends.
    pub fn is_added(&self, section: &Section) -> bool {
        !self.added_at.is_empty() && self.added_at.contains(&std::ptr::from_ref(section))
    }
}

fn key(section: &Section) -> (&str, Option<&str>) {
    (section.kind.keyword(), section.name.as_deref())
}

fn label(section: &Section) -> String {
    match &section.name {
        Some(name) => format!("{} {name}", section.kind.keyword()),
        None => section.kind.keyword().to_owned(),
    }
}

/// Splits the section lists of `old` and `new`, whose keys differ, into the added and
/// removed backends and the sections both keep. `Err` is the reload's reason: the
/// first added or removed section that cannot be deployed at runtime and why, or
/// `capability`'s reason when the instance cannot do it at all.
pub fn split<'a>(
    old: &'a Config,
    new: &'a Config,
    capability: &Capability,
) -> Result<BackendChanges<'a>, (ReloadReason, String)> {
    let (added, removed) = added_and_removed(old, new);
    let changes = BackendChanges::new(added, removed);
    let structure = |detail: String| (ReloadReason::Structure, detail);
    let first = changes
        .added
        .iter()
        .map(|s| (*s, "added", new))
        .chain(changes.removed.iter().map(|s| (*s, "removed", old)));
    for (section, what, config) in first.clone() {
        if section.kind != SectionKind::Backend {
            return Err(structure(format!("{} {what}", label(section))));
        }
        if let Capability::Off = capability {
            return Err(structure(format!("{} {what}", label(section))));
        }
        if let Err(why) = eligible(config, section) {
            return Err(structure(format!(
                "{} {what}; it cannot be {what} at runtime: {why}",
                label(section)
            )));
        }
    }
    if let Capability::Unsupported(why) = capability
        && let Some((section, what, _)) = first.clone().next()
    {
        return Err(structure(format!("{} {what}; {why}", label(section))));
    }
    let kept_old = old
        .sections
        .iter()
        .filter(|s| !changes.is_removed(s))
        .map(|s| key(s));
    let kept_new = new
        .sections
        .iter()
        .filter(|s| !changes.is_added(s))
        .map(|s| key(s));
    if !kept_old.eq(kept_new) {
        return Err(structure("sections reordered".to_owned()));
    }
    Ok(changes)
}

/// Most sections between the unchanged start and end of two configs for which
/// [`added_and_removed`] looks each one up in the other config; past it, it indexes
/// both configs.
const MAX_CHANGED_SECTIONS: usize = 16;

/// The sections of `new` whose key (kind and name) `old` lacks, in order, and those
/// of `old` that `new` lacks. Only sections between the start and the end both
/// configs share (by key) can be either, so when few are, each of them is looked up
/// in the other config instead of indexing both (a route added to 10,000).
pub(crate) fn added_and_removed<'a>(
    old: &'a Config,
    new: &'a Config,
) -> (Vec<&'a Section>, Vec<&'a Section>) {
    let (a, b) = (&old.sections, &new.sections);
    let same = |(x, y): &(&Arc<Section>, &Arc<Section>)| Arc::ptr_eq(x, y) || key(x) == key(y);
    let prefix = a.iter().zip(b).take_while(same).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(same)
        .count();
    let (middle_old, middle_new) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    if middle_old.len() + middle_new.len() <= MAX_CHANGED_SECTIONS {
        let lacks = |config: &Config, section: &Section| {
            !config
                .sections
                .iter()
                .any(|other| key(other) == key(section))
        };
        return (
            middle_new
                .iter()
                .map(|s| &**s)
                .filter(|s| lacks(old, s))
                .collect(),
            middle_old
                .iter()
                .map(|s| &**s)
                .filter(|s| lacks(new, s))
                .collect(),
        );
    }
    added_and_removed_indexed(old, new)
}

/// [`added_and_removed`] through an index of each config's keys.
pub(crate) fn added_and_removed_indexed<'a>(
    old: &'a Config,
    new: &'a Config,
) -> (Vec<&'a Section>, Vec<&'a Section>) {
    let (a, b) = (&old.sections, &new.sections);
    let old_keys: HashSet<_> = a.iter().map(|s| key(s)).collect();
    let new_keys: HashSet<_> = b.iter().map(|s| key(s)).collect();
    (
        b.iter()
            .map(|s| &**s)
            .filter(|s| !old_keys.contains(&key(s)))
            .collect(),
        a.iter()
            .map(|s| &**s)
            .filter(|s| !new_keys.contains(&key(s)))
            .collect(),
    )
}

/// Why a backend cannot be created (or deleted) with `add backend`, or one of its
/// servers with `add server`; the text ends up in the reload's reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotRuntime {
    /// The section is not `backend NAME from PROFILE`.
    #[error("it is not of the form `backend NAME from PROFILE`")]
    NotFromProfile,
    /// The profile names no `defaults` section.
    #[error("no `defaults {0}` section")]
    NoProfile(String),
    /// The profile sets no `mode`.
    #[error("`defaults {0}` sets no `mode`, which `add backend` needs")]
    ProfileWithoutMode(String),
    /// The body holds a directive other than `server`.
    #[error("line {line} `{text}`: only `server` lines can be created at runtime")]
    NotServerLine {
        /// 1-based line number.
        line: u32,
        /// The line as written.
        text: String,
    },
    /// The balance algorithm cannot add servers at runtime.
    #[error("balance `{0}` cannot add servers at runtime")]
    StaticBalance(String),
    /// Two servers share a name.
    #[error("duplicate server name {0}")]
    DuplicateServer(String),
    /// A server's address is neither an IP with a port nor `abns@NAME`.
    #[error("server {server} address `{address}` is not IP:port")]
    NotIpPort {
        /// The server name.
        server: String,
        /// The address as parsed.
        address: String,
    },
    /// A server has a parameter `add server` refuses.
    #[error("server {server} has `{param}`, which `add server` refuses")]
    Refused {
        /// The server name.
        server: String,
        /// The refused parameter.
        param: String,
    },
}

/// Why `section` of `config` cannot be created (or deleted) with `add backend`, if
/// it cannot.
fn eligible(config: &Config, section: &Section) -> Result<(), NotRuntime> {
    let Some(profile) = section.from_defaults() else {
        return Err(NotRuntime::NotFromProfile);
    };
    if section.args.len() != 2 {
        return Err(NotRuntime::NotFromProfile);
    }
    let Some(defaults) = config.section(SectionKind::Defaults, profile) else {
        return Err(NotRuntime::NoProfile(profile.to_owned()));
    };
    if defaults.last("mode").is_none() {
        return Err(NotRuntime::ProfileWithoutMode(profile.to_owned()));
    }
    if let Some(other) = section.directives.iter().find(|d| d.keyword != "server") {
        return Err(NotRuntime::NotServerLine {
            line: other.line,
            text: other.text.clone(),
        });
    }
    let balance = config.effective_balance(section);
    if !balance.is_dynamic() {
        return Err(NotRuntime::StaticBalance(balance.algorithm));
    }
    let mut names = HashSet::new();
    for server in section.servers() {
        if !names.insert(server.name.clone()) {
            return Err(NotRuntime::DuplicateServer(server.name));
        }
        plan::new_server(config, section, &server)?;
    }
    Ok(())
}

/// The runtime operations of `changes`: the added backends (to run before every other
/// change) and the removed ones (to run after every other change).
pub fn operations(new: &Config, changes: &BackendChanges<'_>) -> (Vec<RuntimeOp>, Vec<RuntimeOp>) {
    let added = changes
        .added
        .iter()
        .map(|section| {
            let servers: Vec<NewServer> = section
                .servers()
                .iter()
                .filter_map(|server| plan::new_server(new, section, server).ok())
                .collect();
            RuntimeOp::AddBackend {
                backend: section.name.clone().unwrap_or_default(),
                profile: section.from_defaults().unwrap_or_default().to_owned(),
                servers,
            }
        })
        .collect();
    let removed = changes
        .removed
        .iter()
        .map(|section| RuntimeOp::DelBackend {
            backend: section.name.clone().unwrap_or_default(),
        })
        .collect();
    (added, removed)
}

/// Phase 2 by equivalence for added and removed backends (the validator's rule,
/// `component::validator::equivalence`): `Ok` when `new` differs from `old` — a render
/// that passed `haproxy -c` — only in
///
/// - added `backend NAME from PROFILE` sections: NAME and every server name of the
///   characters HAProxy accepts in names (letters, digits, `-`, `_`, `.`, `:`),
///   PROFILE a named `defaults` section declared before it that sets `mode` and that
///   no proxy without `from` uses implicitly, and a body of plain `server NAME
///   IP:PORT` lines (no quoting, `$` or `#`) with at most `weight 0-256`, `check` and
///   `proto h2` after the address, server names unique;
/// - removed backends of that form whose name appears nowhere in `new`'s text (no
///   rule, `track` or sample fetch can still name them);
/// - the other sections, which must be those of `old` in the same order, each
///   written as before (on other lines, maybe) apart from covered `server`
///   changes.
///
/// Such a render passes `haproxy -c` because `old` did, so a new route is not held
/// back by HAProxy's start-up time. `Ok(n)`: `n` sections added or removed and
/// directives changed, which the rule checked one by one; `Err(None)`: no backend
/// was added or removed (the caller's own reason stands); `Err(Some(why))`: outside
/// the rule.
pub(crate) fn equivalent(
    old_text: &str,
    old: &Config,
    new_text: &str,
    new: &Config,
) -> Result<usize, Option<Why>> {
    use crate::component::validator::equivalence::{
        ip_port, plain_words, server_change_covered, weight,
    };
    if old.sections.len() == new.sections.len()
        && old
            .sections
            .iter()
            .zip(&new.sections)
            .all(|(a, b)| Arc::ptr_eq(a, b) || key(a) == key(b))
    {
        return Err(None);
    }
    let changes = split(old, new, &Capability::On).map_err(|(_, why)| Some(Why(why)))?;
    // Only once they are needed: sections both models share need no lines.
    let old_lines = std::cell::OnceCell::new();
    let new_lines = std::cell::OnceCell::new();
    fn lines<'t>(cell: &'t std::cell::OnceCell<Vec<&'t str>>, text: &'t str) -> &'t [&'t str] {
        cell.get_or_init(|| text.split('\n').collect())
    }
    fn line_of<'t>(lines: &[&'t str], line: u32) -> &'t str {
        usize::try_from(line)
            .ok()
            .and_then(|l| l.checked_sub(1))
            .and_then(|index| lines.get(index))
            .map_or("", |text| text.trim())
    }
    let name_ok = |name: &str| {
        !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
    };
    for section in &changes.added {
        let name = section.name.as_deref().unwrap_or_default();
        let profile = section.from_defaults().unwrap_or_default();
        let header = line_of(lines(&new_lines, new_text), section.line);
        if !name_ok(name) || header != format!("backend {name} from {profile}") {
            return Err(Some(Why(format!(
                "added section header '{header}' is not plain"
            ))));
        }
        let Some(index) = new
            .sections
            .iter()
            .position(|s| s.kind == SectionKind::Defaults && s.name.as_deref() == Some(profile))
        else {
            return Err(Some(Why(format!("no defaults section '{profile}'"))));
        };
        if new.sections[index].line > section.line {
            return Err(Some(Why(format!(
                "defaults '{profile}' is declared after backend {name}"
            ))));
        }
        let implicit = new.sections[index + 1..]
            .iter()
            .take_while(|s| s.kind != SectionKind::Defaults)
            .find(|s| s.kind.is_proxy() && s.from_defaults().is_none());
        if let Some(user) = implicit {
            return Err(Some(Why(format!(
                "defaults '{profile}' is also used implicitly by {} {}",
                user.kind,
                user.name.as_deref().unwrap_or_default()
            ))));
        }
        let mut servers = HashSet::new();
        for directive in &section.directives {
            let words = plain_words(&directive.text)
                .filter(|words| words.len() >= 3 && words[0] == "server")
                .ok_or_else(|| {
                    Some(Why(format!(
                        "haproxy.cfg:{}: not a plain server line",
                        directive.line
                    )))
                })?;
            if !name_ok(words[1]) || !servers.insert(words[1]) || ip_port(words[2]).is_none() {
                return Err(Some(Why(format!(
                    "haproxy.cfg:{}: server name or address outside the rule",
                    directive.line
                ))));
            }
            let mut params = words[3..].iter();
            while let Some(word) = params.next() {
                let covered = match *word {
                    "check" => true,
                    "weight" => params.next().is_some_and(|w| weight(w).is_some()),
                    "proto" => params.next() == Some(&"h2"),
                    _ => false,
                };
                if !covered {
                    return Err(Some(Why(format!(
                        "haproxy.cfg:{}: server word '{word}' outside the rule",
                        directive.line
                    ))));
                }
            }
        }
    }
    for section in &changes.removed {
        let name = section.name.as_deref().unwrap_or_default();
        if names_word(new_text, name) {
            return Err(Some(Why(format!(
                "removed backend {name} is still named in haproxy.cfg"
            ))));
        }
    }
    let kept_old = old.sections.iter().filter(|s| !changes.is_removed(s));
    let kept_new = new.sections.iter().filter(|s| !changes.is_added(s));
    let mut differences = changes.added.len() + changes.removed.len();
    for (a, b) in kept_old.zip(kept_new) {
        // A section both models share comes from the same lines of both texts.
        if Arc::ptr_eq(a, b) {
            continue;
        }
        let header = line_of(lines(&new_lines, new_text), b.line);
        if a.kind != b.kind
            || a.name != b.name
            || a.args != b.args
            || line_of(lines(&old_lines, old_text), a.line) != header
            || a.directives.len() != b.directives.len()
        {
            return Err(Some(Why(format!(
                "section '{header}' at haproxy.cfg:{} differs",
                b.line
            ))));
        }
        for (x, y) in a.directives.iter().zip(&b.directives) {
            if x.text != y.text {
                server_change_covered(b, x, y)
                    .map_err(|why| Some(Why(format!("haproxy.cfg:{}: {why}", y.line))))?;
                differences += 1;
            }
        }
    }
    Ok(differences)
}

/// A guess made before phase 1 (`equivalence::likely_equivalent`): whether the lines
/// that differ between two configs (`old` and `new`, from
/// [`changed_lines`](crate::haproxy::config::changed_lines)) hold a `backend NAME
/// from PROFILE` header, as a render that adds or removes a dynamic backend does.
/// Such a render usually passes phase 2 by [`equivalent`], so `haproxy -c` need not
/// start alongside phase 1; a wrong guess costs time only.
pub(crate) fn likely_added_or_removed(old: &str, new: &str) -> bool {
    [old, new].iter().any(|part| {
        part.lines().any(|line| {
            let mut words = line.split_ascii_whitespace();
            words.next() == Some("backend")
                && words.next().is_some()
                && words.next() == Some("from")
                && words.next().is_some()
                && words.next().is_none()
        })
    })
}

/// Whether `text` holds `name` as a whole word: not inside a longer name (`be_r1` in
/// `be_r10`), whatever surrounds it otherwise (`nbsrv(be_r1)`, `be_r1/s1`).
fn names_word(text: &str, name: &str) -> bool {
    let name_byte = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':');
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].bytes().next_back();
        let after = text[at + name.len()..].bytes().next();
        !before.is_some_and(name_byte) && !after.is_some_and(name_byte)
    })
}

#[cfg(test)]
mod guess_tests {
    /// The guess on two whole configs.
    fn likely_added_or_removed(old: &str, new: &str) -> bool {
        let (old, new) = crate::haproxy::config::changed_lines(old, new);
        super::likely_added_or_removed(old, new)
    }

    const OLD: &str = "defaults routes\n    mode http\n\nbackend be_a from routes\n    server a 10.0.0.1:80\n\nfrontend f\n    bind :80\n";

    #[test]
    fn an_added_or_removed_dynamic_backend_is_guessed() {
        let new = OLD.replace(
            "frontend f",
            "backend be_b from routes\n    server b 10.0.0.2:80\n\nfrontend f",
        );
        assert!(likely_added_or_removed(OLD, &new));
        assert!(likely_added_or_removed(&new, OLD));
    }

    #[test]
    fn other_changes_are_not() {
        let new = OLD.replace("    bind :80\n", "    bind :80\n    bind :81\n");
        assert!(!likely_added_or_removed(OLD, &new));
        let new = OLD.replace(
            "frontend f",
            "backend be_b\n    server b 10.0.0.2:80\n\nfrontend f",
        );
        assert!(!likely_added_or_removed(OLD, &new));
        // Bytes that differ inside a character: whole lines are compared.
        let (old, new) = ("backend b from r\n    x é\n", "backend b from r\n    x è\n");
        assert!(!likely_added_or_removed(old, new));
        assert!(likely_added_or_removed(
            "backend é from r\n",
            "backend è from r\n"
        ));
    }
}
