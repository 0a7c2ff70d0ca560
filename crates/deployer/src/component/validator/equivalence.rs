//! Phase 2 by structural equivalence: a conservative rule that decides, without
//! running HAProxy, that a candidate render differs from a render that passed
//! `haproxy -c` only in values that hapwright checks completely itself. Such a
//! candidate would pass `haproxy -c` too, so the validator records phase 2 as passed
//! and saves HAProxy's start-up time (tens of milliseconds even for a small config)
//! on the path of every endpoint change.
//!
//! The rule (docs/validation.md, "Phase 2 by equivalence"):
//!
//! - the same maps, files and certificates by name; files and certificates
//!   byte-identical;
//! - `haproxy.cfg`: the same sections in the same order (header lines as written)
//!   holding the same directives in the same order, each written exactly as before
//!   (comments and blank lines may come and go, so lines may move), except `server`
//!   lines of backend and listen sections, which may differ only in
//!   - the address, when both are IPv4 or IPv6 literals with a numeric port
//!     1–65535 (`10.0.0.1:8080`, `[2001:db8::1]:8080`),
//!   - the value after `weight` (0–256),
//!
//!   with the same server name and the same other words, and no quoting, escapes,
//!   `$` or `#` on either line (so the words are exactly the blank-separated parts);
//! - a map whose content differs must be used only as the file of `map`,
//!   `map_str`, `map_beg`, `map_sub`, `map_dir`, `map_dom` or `map_end` converters
//!   (string keys, string values: loading it cannot fail), referenced as
//!   `(maps/<name>` in `haproxy.cfg`, nowhere else (not in other rendered files),
//!   with no `$` on a line that mentions maps, ACL files or Lua; and its lines hold
//!   no control characters and stay under [`MAX_MAP_LINE`] bytes.
//!
//! - or, besides, added and removed `backend NAME from PROFILE` sections whose body
//!   holds only plain `server NAME IP:PORT` lines with `weight`, `check` or `proto h2`
//!   (see [`crate::haproxy::backends::equivalent`]), the other sections as above.
//!
//! The baseline's warnings are reported for the candidate at the lines their
//! directives moved to ([`moved_line`]).
//!
//! - or certificate files added, changed or removed and crt-list lines added,
//!   changed or removed, when every changed certificate passes a check narrower
//!   than HAProxy's ([`super::certificates`]).
//!
//! Anything else is [`Equivalence::Different`], and `haproxy -c` runs.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use hapwright_eventbus::model::{FileGroup, RenderedConfig, same_file, same_text};

use crate::haproxy::config::{Config as Model, Directive, Section};

/// Longest map line (in bytes) the rule accepts; HAProxy reads pattern files line
/// by line into a buffer, and a longer line is left to `haproxy -c`.
pub const MAX_MAP_LINE: usize = 4096;

/// Highest `weight` HAProxy 2.6 accepts on a `server` line.
const MAX_WEIGHT: u32 = 256;

/// Converters whose map file holds string keys and string values: HAProxy loads
/// every line of such a file without parsing it, so a load cannot fail.
const STRING_MAP_CONVERTERS: &[&str] = &[
    "map", "map_str", "map_beg", "map_sub", "map_dir", "map_dom", "map_end",
];

/// Why phase 2 was satisfied without running `haproxy -c`: the label of
/// `hapwright_validation_phase2_skipped_total{reason}` and of the log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// No directive, map, file or certificate differs (only comments or spacing).
    Identical,
    /// Only `server` addresses, ports or weights differ.
    Servers,
    /// Only entries of string-keyed maps differ.
    Maps,
    /// Both of the above.
    ServersAndMaps,
    /// Certificate files and crt-list lines (with, possibly, any of the above):
    /// [`super::certificates`].
    Certificates,
}

impl SkipReason {
    /// Every reason, so the counters start at 0.
    pub const ALL: [SkipReason; 5] = [
        SkipReason::Identical,
        SkipReason::Servers,
        SkipReason::Maps,
        SkipReason::ServersAndMaps,
        SkipReason::Certificates,
    ];

    /// The metric label and log value.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Identical => "identical",
            SkipReason::Servers => "equivalent_servers",
            SkipReason::Maps => "equivalent_maps",
            SkipReason::ServersAndMaps => "equivalent_servers_and_maps",
            SkipReason::Certificates => "certificates",
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The rule's answer for one candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Equivalence {
    /// The candidate passes phase 2 because the baseline did.
    Equivalent(SkipReason),
    /// Outside the rule: `haproxy -c` must run.
    Different(Why),
}

/// What first put a candidate outside the rule, in words for the debug log: only
/// displayed, never branched on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Why(pub(crate) String);

impl From<&str> for Why {
    fn from(why: &str) -> Self {
        Why(why.to_owned())
    }
}

impl From<String> for Why {
    fn from(why: String) -> Self {
        Why(why)
    }
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Equivalence {
    /// Whether phase 2 may be skipped.
    pub fn is_equivalent(&self) -> bool {
        matches!(self, Equivalence::Equivalent(_))
    }
}

/// A render that passed `haproxy -c`, with its parsed `haproxy.cfg`.
#[derive(Clone, Debug)]
pub struct Baseline {
    /// The files that passed.
    pub rendered: Arc<RenderedConfig>,
    /// Phase 1's model of its `haproxy.cfg`.
    pub model: Arc<Model>,
}

/// Applies the rule to `candidate` (with phase 1's model of its `haproxy.cfg`,
/// which must have passed phase 1) against `baseline`.
pub fn compare(baseline: &Baseline, candidate: &RenderedConfig, model: &Model) -> Equivalence {
    compare_counted(baseline, candidate, model).0
}

/// [`compare`], with how many differences the rule checked one by one when it
/// passed: added or removed backends, changed `server` lines, changed or removed
/// certificates and crt-lists (0 otherwise). Each of them is checked again on every
/// later comparison with the same baseline, so the validator refreshes a baseline
/// that many differences separate from what is rendered now (`Service::validate`).
pub fn compare_counted(
    baseline: &Baseline,
    candidate: &RenderedConfig,
    model: &Model,
) -> (Equivalence, usize) {
    match compare_inner(baseline, candidate, model) {
        Ok((reason, differences)) => (Equivalence::Equivalent(reason), differences),
        Err(why) => (Equivalence::Different(why), 0),
    }
}

/// Whether `candidate` looks close enough to `baseline` for the rule to pass it,
/// judged without phase 1's model: the same maps and files by name, files
/// byte-identical but for crt-lists, and `haproxy.cfg` with as many lines.
///
/// A guess, cheap enough to make before phase 1: the validator starts `haproxy -c`
/// alongside phase 1 when it is `false` (phase 2 will almost certainly have to
/// run) and waits for phase 1 and the rule when it is `true`. [`compare`] still
/// decides, so a wrong guess costs time, never correctness.
pub fn likely_equivalent(baseline: &Baseline, candidate: &RenderedConfig) -> bool {
    let old = &baseline.rendered;
    if same_names("maps", old.maps(), candidate.maps()).is_err()
        || same_names("files", old.files(), candidate.files()).is_err()
        || !super::certificates::likely(old, candidate)
    {
        return false;
    }
    // As many directive lines (comments and blank lines may come and go): the bytes
    // both texts share at the start and the end hold the same lines, so only the
    // lines around the bytes between them are counted.
    let (a, b) = crate::haproxy::config::changed_lines(old.main(), candidate.main());
    directive_lines(a) == directive_lines(b)
        || crate::haproxy::backends::likely_added_or_removed(a, b)
}

/// How many lines of `text` hold something other than blanks or a comment.
fn directive_lines(text: &str) -> usize {
    text.lines()
        .filter(|line| {
            line.bytes()
                .find(|c| !matches!(c, b' ' | b'\t' | b'\r'))
                .is_some_and(|c| c != b'#')
        })
        .count()
}

fn compare_inner(
    baseline: &Baseline,
    candidate: &RenderedConfig,
    model: &Model,
) -> Result<(SkipReason, usize), Why> {
    let old = &baseline.rendered;
    same_names("maps", old.maps(), candidate.maps())?;
    same_names("files", old.files(), candidate.files())?;
    // Files may differ only as crt-lists, together with certificates.
    let certificates = super::certificates::covered(baseline, candidate)?;
    let servers = if same_text(old.main(), candidate.main()) {
        0
    } else {
        // Added or removed `backend NAME from PROFILE` sections that hold only plain
        // server lines are covered too (crate::haproxy::backends::equivalent).
        compare_main(old.main(), &baseline.model, candidate.main(), model).or_else(|why| {
            crate::haproxy::backends::equivalent(
                old.main(),
                &baseline.model,
                candidate.main(),
                model,
            )
            .map_err(|other| other.unwrap_or(why))
        })?
    };
    let mut maps_changed = false;
    for (name, content) in candidate.maps() {
        if same_file(old.maps().get(name), Some(content)) {
            continue;
        }
        map_change_covered(name, content, candidate)?;
        maps_changed = true;
    }
    let reason = match (servers > 0, maps_changed) {
        _ if certificates > 0 => SkipReason::Certificates,
        (false, false) => SkipReason::Identical,
        (true, false) => SkipReason::Servers,
        (false, true) => SkipReason::Maps,
        (true, true) => SkipReason::ServersAndMaps,
    };
    Ok((reason, certificates + servers))
}

/// Whether the two groups name the same files (the parts renders share are
/// skipped); the first new name is reported before the first removed one.
fn same_names(dir: &str, old: &FileGroup, new: &FileGroup) -> Result<(), Why> {
    use imbl::ordmap::DiffItem;
    let mut removed = None;
    for item in old.diff(new) {
        match item {
            DiffItem::Add(name, _) => return Err(Why(format!("{dir}/{name} is new"))),
            DiffItem::Remove(name, _) => {
                removed.get_or_insert(name);
            }
            DiffItem::Update { .. } => {}
        }
    }
    match removed {
        Some(name) => Err(Why(format!("{dir}/{name} was removed"))),
        None => Ok(()),
    }
}

// === haproxy.cfg ===

/// Compares the two `haproxy.cfg` models directive by directive; `Ok(n)` with the
/// number of covered `server` changes found.
fn compare_main(old_text: &str, old: &Model, new_text: &str, new: &Model) -> Result<usize, Why> {
    if old.sections.len() != new.sections.len() {
        return Err(Why("the number of sections changed".to_owned()));
    }
    let mut servers_changed = 0;
    // Header lines are looked up by number once per section: index the lines once,
    // or a config with thousands of backends is compared in quadratic time.
    // Only once a section differs: sections both models share need no lines.
    let (old_lines, new_lines) = (std::cell::OnceCell::new(), std::cell::OnceCell::new());
    for (a, b) in old.sections.iter().zip(&new.sections) {
        // A section both models share comes from the same lines of both texts.
        if Arc::ptr_eq(a, b) {
            continue;
        }
        let header_a = old_lines.get_or_init(|| Lines::new(old_text)).get(a.line);
        let header_b = new_lines.get_or_init(|| Lines::new(new_text)).get(b.line);
        // Lines may move (comments and blank lines added or removed): HAProxy's
        // verdict does not depend on line numbers, and the baseline's warnings are
        // moved with them ([`moved_line`]).
        if a.kind != b.kind || a.name != b.name || a.args != b.args || header_a != header_b {
            return Err(Why(format!(
                "section header '{header_b}' at haproxy.cfg:{} differs",
                b.line
            )));
        }
        if a.directives.len() != b.directives.len() {
            return Err(Why(format!(
                "{} {} has a different number of directives",
                b.kind,
                b.name.as_deref().unwrap_or_default()
            )));
        }
        for (x, y) in a.directives.iter().zip(&b.directives) {
            if x.text == y.text {
                continue;
            }
            server_change_covered(b, x, y)
                .map_err(|why| Why(format!("haproxy.cfg:{}: {why}", y.line)))?;
            servers_changed += 1;
        }
    }
    Ok(servers_changed)
}

/// Where `line` of the baseline's `haproxy.cfg` (`old`) is in an equivalent
/// candidate's (`new`): the header or directive on it, found in the same section of
/// `new` (the same kind and name, counted in order), is on the returned line. A line
/// between directives (a comment) moves with its section's header. `None` when its
/// section is not in `new` (a removed backend): a warning about it no longer applies.
///
/// Only meaningful for two models the rule judged equivalent: their kept sections
/// hold the same directives in the same order.
pub fn moved_line(old: &Model, new: &Model, line: u32) -> Option<u32> {
    let at = old.sections.partition_point(|s| s.line <= line);
    let Some(index) = at.checked_sub(1) else {
        return Some(line);
    };
    let section = &old.sections[index];
    let same = |s: &&Arc<Section>| s.kind == section.kind && s.name == section.name;
    let ordinal = old.sections[..index].iter().filter(same).count();
    // By kind, name and rank, not by index: backends added and removed shift the
    // others. (Only for the few warnings a config has.)
    let moved = new.sections.iter().filter(same).nth(ordinal)?;
    if line == section.line {
        return Some(moved.line);
    }
    let directive = section.directives.partition_point(|d| d.line < line);
    match (
        section.directives.get(directive),
        moved.directives.get(directive),
    ) {
        (Some(was), Some(now)) if was.line == line => Some(now.line),
        _ => Some(moved.line + (line - section.line)),
    }
}

/// The lines of a text, for lookups by number.
struct Lines<'a>(Vec<&'a str>);

impl<'a> Lines<'a> {
    fn new(text: &'a str) -> Self {
        Self(text.split('\n').collect())
    }

    /// The trimmed text of 1-based `line` (empty for line 0, the preamble).
    fn get(&self, line: u32) -> &'a str {
        usize::try_from(line)
            .ok()
            .and_then(|l| l.checked_sub(1))
            .and_then(|index| self.0.get(index))
            .map_or("", |line| line.trim())
    }
}

/// Whether a `server` line changed only in covered values.
pub(crate) fn server_change_covered(
    section: &Section,
    old: &Directive,
    new: &Directive,
) -> Result<(), Why> {
    if !section.kind.has_servers() {
        return Err(Why(format!("'{}' changed outside a backend", new.keyword)));
    }
    if old.keyword != "server" || new.keyword != "server" {
        return Err(Why(format!(
            "'{}' changed (only server lines may)",
            new.keyword
        )));
    }
    let (Some(old_words), Some(new_words)) = (plain_words(&old.text), plain_words(&new.text))
    else {
        return Err(Why(
            "a changed server line uses quotes, escapes, '$' or '#'".to_owned(),
        ));
    };
    if old_words.len() != new_words.len() {
        return Err(Why("server keywords changed".to_owned()));
    }
    // [server, name, address, params…]
    if old_words.len() < 3 {
        return Err(Why("a server line without a name and an address".to_owned()));
    }
    if old_words[1] != new_words[1] {
        return Err(Why(format!(
            "server '{}' renamed to '{}'",
            old_words[1], new_words[1]
        )));
    }
    if old_words[2] != new_words[2] {
        if ip_port(old_words[2]).is_none() {
            return Err(Why(format!(
                "old address '{}' is not an IP literal with a port",
                old_words[2]
            )));
        }
        if ip_port(new_words[2]).is_none() {
            return Err(Why(format!(
                "address '{}' is not an IP literal with a port 1-65535",
                new_words[2]
            )));
        }
    }
    for index in 3..new_words.len() {
        let (a, b) = (old_words[index], new_words[index]);
        if a == b {
            continue;
        }
        let after_weight = old_words[index - 1] == "weight" && new_words[index - 1] == "weight";
        if !(after_weight && weight(a).is_some() && weight(b).is_some()) {
            return Err(Why(format!("server word '{a}' became '{b}'")));
        }
    }
    Ok(())
}

/// The words of a line that has no quoting, escapes, environment references or
/// comments, so that splitting on blanks gives exactly HAProxy's words.
pub(crate) fn plain_words(text: &str) -> Option<Vec<&str>> {
    if text.contains(['"', '\'', '\\', '$', '#'])
        || text.chars().any(|c| c.is_control() && c != '\t')
    {
        return None;
    }
    Some(text.split([' ', '\t']).filter(|w| !w.is_empty()).collect())
}

/// An IP literal with a port: `192.0.2.1:80`, `[2001:db8::1]:80` or
/// `2001:db8::1:80` (the last colon starts the port, as in HAProxy). The port is
/// 1-65535 written without a sign or leading zeros.
pub fn ip_port(word: &str) -> Option<(IpAddr, u16)> {
    let (host, port) = if let Some(rest) = word.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (
            IpAddr::V6(host.parse::<Ipv6Addr>().ok()?),
            after.strip_prefix(':')?,
        )
    } else {
        let (host, port) = word.rsplit_once(':')?;
        let ip = match host.parse::<Ipv4Addr>() {
            Ok(v4) => IpAddr::V4(v4),
            Err(_) => IpAddr::V6(host.parse::<Ipv6Addr>().ok()?),
        };
        (ip, port)
    };
    let canonical = !port.is_empty()
        && port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
        && !port.starts_with('0');
    if !canonical {
        return None;
    }
    let port: u16 = port.parse().ok()?;
    Some((host, port))
}

/// A server weight, 0-256, written without a sign or leading zeros.
pub(crate) fn weight(word: &str) -> Option<u32> {
    let canonical = !word.is_empty()
        && word.len() <= 3
        && word.bytes().all(|b| b.is_ascii_digit())
        && (word == "0" || !word.starts_with('0'));
    let value: u32 = word.parse().ok().filter(|_| canonical)?;
    (value <= MAX_WEIGHT).then_some(value)
}

// === maps ===

/// Whether a change of `maps/<name>` is covered: how `candidate` uses the map, and
/// what the new content holds.
fn map_change_covered(name: &str, content: &str, candidate: &RenderedConfig) -> Result<(), Why> {
    let path = format!("maps/{name}");
    let main: &str = candidate.main();
    if name.contains('\n') {
        return Err(Why(format!(
            "{path} changed and its use in haproxy.cfg is unknown"
        )));
    }
    // The first line with a '$' that mentions maps, ACL files or Lua, and the first
    // use of the map other than by a string map converter: found from the places
    // the text holds a '$' or the name, not line by line (a `haproxy.cfg` of 10,000
    // backends has 30,000 lines). The earlier line is the answer; on one line the
    // '$' is.
    let dollar = main
        .match_indices('$')
        .map(|(at, _)| line_at(main, at))
        .find(|(_, line)| line.contains("map") || line.contains("-f") || line.contains("lua"));
    let mut uses = 0;
    let mut other_use = None;
    for at in mentions(main, name) {
        let (start, line) = line_at(main, at);
        if !string_map_use(line, at - start, name) {
            other_use = Some((start, line));
            break;
        }
        uses += 1;
    }
    match (dollar, other_use) {
        (Some((at, line)), other) if other.is_none_or(|(other, _)| at <= other) => {
            return Err(Why(format!(
                "{path} changed and a line using maps or pattern files has a '$': {}",
                line.trim()
            )));
        }
        (_, Some((_, line))) => {
            return Err(Why(format!(
                "{path} changed and is used other than by a string map converter: {}",
                line.trim()
            )));
        }
        _ => {}
    }
    if uses == 0 {
        return Err(Why(format!(
            "{path} changed and its use in haproxy.cfg is unknown"
        )));
    }
    map_content_covered(&path, name, content, candidate)
}

/// The rest of [`map_change_covered`] once `haproxy.cfg` uses the map only through
/// string map converters: no other rendered file names it, and its new content has
/// no line too long or with a control character.
fn map_content_covered(
    path: &str,
    name: &str,
    content: &str,
    candidate: &RenderedConfig,
) -> Result<(), Why> {
    if let Some(file) = candidate
        .files()
        .iter()
        .find(|(_, text)| SCANS.mentions(text, name))
        .map(|(file, _)| file)
    {
        return Err(Why(format!("{path} changed and files/{file} mentions it")));
    }
    match candidate.maps().get(name) {
        Some(shared) if std::ptr::eq::<str>(&**shared, content) => SCANS.lines(path, shared),
        _ => map_lines_covered(path, content),
    }
}

/// The line checks of [`map_content_covered`]: no line too long or with a control
/// character.
fn map_lines_covered(path: &str, content: &str) -> Result<(), Why> {
    for (index, line) in content.split('\n').enumerate() {
        if line.len() > MAX_MAP_LINE {
            return Err(Why(format!(
                "{path}:{}: line longer than {MAX_MAP_LINE} bytes",
                index + 1
            )));
        }
        let control = if line.is_ascii() {
            line.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f)
        } else {
            line.chars().any(|c| c.is_control() && c != '\t')
        };
        if control {
            return Err(Why(format!("{path}:{}: control character", index + 1)));
        }
    }
    Ok(())
}

/// The answers of the scans of whole files that a validation repeats, by the
/// file's allocation: a render hands a map or file that did not change out again
/// (the same `Arc`), and every validation compares with the same baseline until it
/// moves, so without them each change would read the same 10,000-line maps and
/// crt-list again. Holding the contents keeps their addresses unique.
struct Scans {
    kept: std::sync::Mutex<Vec<Scan>>,
    /// Per map path, the last content whose lines passed [`map_lines_covered`]: the
    /// next version is checked in the lines around the bytes that differ
    /// ([`Scans::lines`]).
    passed: crate::haproxy::config::LastVersions<(), SCANS_KEPT>,
}

struct Scan {
    text: Arc<str>,
    /// The name looked for (`None`: the map line checks).
    name: Option<Box<str>>,
    answer: Result<(), Why>,
}

/// How many answers are kept: a few maps and files of the last renders.
const SCANS_KEPT: usize = 12;

static SCANS: Scans = Scans {
    kept: std::sync::Mutex::new(Vec::new()),
    passed: crate::haproxy::config::LastVersions::new(),
};

impl Scans {
    fn answer(
        &self,
        text: &Arc<str>,
        name: Option<&str>,
        scan: impl FnOnce() -> Result<(), Why>,
    ) -> Result<(), Why> {
        let found = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find(|kept| Arc::ptr_eq(&kept.text, text) && kept.name.as_deref() == name)
            .map(|kept| kept.answer.clone());
        if let Some(answer) = found {
            return answer;
        }
        let answer = scan();
        let mut kept = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if kept.len() >= SCANS_KEPT {
            kept.remove(0);
        }
        kept.push(Scan {
            text: Arc::clone(text),
            name: name.map(Box::from),
            answer: answer.clone(),
        });
        answer
    }

    /// Whether `text` names the file `name` ([`mentions`]).
    fn mentions(&self, text: &Arc<str>, name: &str) -> bool {
        self.answer(text, Some(name), || match mentions(text, name).next() {
            Some(_) => Err(Why(String::new())),
            None => Ok(()),
        })
        .is_err()
    }

    /// [`map_lines_covered`] of the map `path`'s content. When an earlier version of
    /// the map passed, only the lines around the bytes that differ from it are read
    /// (the others are its lines, which passed): a map of 10,000 lines that gains one
    /// reads a line or two. A line that fails is named from a scan of the whole.
    fn lines(&self, path: &str, text: &Arc<str>) -> Result<(), Why> {
        let answer = self.answer(text, None, || match self.passed.get(path) {
            Some((old, ())) => {
                let (_, changed) = crate::haproxy::config::changed_lines(&old, text);
                map_lines_covered(path, changed).or_else(|_| map_lines_covered(path, text))
            }
            None => map_lines_covered(path, text),
        });
        if answer.is_ok() {
            self.passed.put(path, text, ());
        }
        answer
    }
}

/// The line of `text` that holds byte `at` (without its newline), and where it
/// starts.
fn line_at(text: &str, at: usize) -> (usize, &str) {
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    (start, &text[start..end])
}

/// Where `text` names the file `name` as a whole word: occurrences inside a longer
/// file name (`myhosts.map`, `hosts.map2`) are other files and do not count.
pub(crate) fn mentions<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = usize> + 'a {
    let part_of_name = |c: Option<char>| {
        c.is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    text.match_indices(name)
        .map(|(at, _)| at)
        .filter(move |&at| {
            !part_of_name(text[..at].chars().next_back())
                && !part_of_name(text[at + name.len()..].chars().next())
        })
}

/// Whether the occurrence of `name` at byte `at` of `line` is `conv(maps/<name>)` or
/// `conv(maps/<name>,…` with `conv` a string map converter.
fn string_map_use(line: &str, at: usize, name: &str) -> bool {
    let after = line[at + name.len()..].chars().next();
    if !matches!(after, Some(')' | ',')) {
        return false;
    }
    let Some(call) = line[..at].strip_suffix("(maps/") else {
        return false;
    };
    let start = call
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    let converter = &call[start..];
    // A converter follows a comma (`req.hdr(host),map(…)`); `-` before it would make
    // it part of another word (`set-map(`).
    let before = call[..start].chars().next_back();
    STRING_MAP_CONVERTERS.contains(&converter) && matches!(before, Some(','))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_follow_their_directives() {
        let old = crate::haproxy::config::parse(
            "global\n    maxconn 10\n\nbackend a from p\n    server s 10.0.0.1:80\n\nfrontend f\n    bind :80\n    # note\n    use_backend a\n",
        )
        .unwrap();
        // Two comment lines before the frontend, one inside it, one more blank line.
        let new = crate::haproxy::config::parse(
            "global\n    maxconn 10\n\nbackend a from p\n    server s 10.0.0.1:80\n# x\n# y\n\nfrontend f\n    # z\n    bind :80\n\n    # note\n    use_backend a\n",
        )
        .unwrap();
        assert_eq!(
            moved_line(&old, &new, 2),
            Some(2),
            "global's directive stays"
        );
        assert_eq!(moved_line(&old, &new, 5), Some(5), "the server line stays");
        assert_eq!(moved_line(&old, &new, 7), Some(9), "the frontend header");
        assert_eq!(moved_line(&old, &new, 8), Some(11), "bind");
        assert_eq!(moved_line(&old, &new, 10), Some(14), "use_backend");
        assert_eq!(
            moved_line(&old, &new, 9),
            Some(11),
            "a comment moves with the header"
        );
        // Without the backend (a removed dynamic backend), a line inside it is gone
        // and the others are found by section.
        let fewer = crate::haproxy::config::parse(
            "global\n    maxconn 10\n\nfrontend f\n    bind :80\n    use_backend b\n",
        )
        .unwrap();
        assert_eq!(moved_line(&old, &fewer, 5), None);
        assert_eq!(moved_line(&old, &fewer, 10), Some(6));
        assert_eq!(moved_line(&old, &fewer, 2), Some(2));
        // One backend removed and another added: as many sections, shifted.
        let swapped = crate::haproxy::config::parse(
            "global\n    maxconn 10\n\nfrontend f\n    bind :80\n    use_backend b\n\nbackend b from p\n    server t 10.0.0.2:80\n",
        )
        .unwrap();
        assert_eq!(moved_line(&old, &swapped, 10), Some(6));
        assert_eq!(moved_line(&old, &swapped, 5), None);
    }

    #[test]
    fn ip_literals_with_ports() {
        assert!(ip_port("10.0.0.1:80").is_some());
        assert!(ip_port("[2001:db8::1]:8080").is_some());
        assert!(ip_port("2001:db8::1:8080").is_some());
        for bad in [
            "300.1.1.1:80",
            "1.2.3:80",
            "1.2.3.4",
            "1.2.3.4:0",
            "1.2.3.4:70000",
            "1.2.3.4:080",
            "1.2.3.4:+1",
            "web.local:80",
            "${IP}:80",
            "[2001:db8::1]",
            "unix@/x:80",
            "ipv4@1.2.3.4:80",
        ] {
            assert!(ip_port(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn weights() {
        assert_eq!(weight("0"), Some(0));
        assert_eq!(weight("256"), Some(256));
        assert_eq!(weight("257"), None);
        assert_eq!(weight("010"), None);
        assert_eq!(weight("-1"), None);
        assert_eq!(weight("1k"), None);
    }

    /// [`map_change_covered`] as it was written first, line by line: the reference
    /// the single pass over `haproxy.cfg` is compared with (the checks after it are
    /// shared).
    fn map_change_covered_by_lines(
        name: &str,
        content: &str,
        candidate: &RenderedConfig,
    ) -> Result<(), Why> {
        let path = format!("maps/{name}");
        let mut uses = 0;
        for line in candidate.main().split('\n') {
            let mentions_patterns =
                line.contains("map") || line.contains("-f") || line.contains("lua");
            if line.contains('$') && mentions_patterns {
                return Err(Why(format!(
                    "{path} changed and a line using maps or pattern files has a '$': {}",
                    line.trim()
                )));
            }
            for at in mentions(line, name) {
                if !string_map_use(line, at, name) {
                    return Err(Why(format!(
                        "{path} changed and is used other than by a string map converter: {}",
                        line.trim()
                    )));
                }
                uses += 1;
            }
        }
        if uses == 0 {
            return Err(Why(format!(
                "{path} changed and its use in haproxy.cfg is unknown"
            )));
        }
        map_content_covered(&path, name, content, candidate)
    }

    fn main_line() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            Just(
                "    use_backend %[req.hdr(host),lower,map(maps/hosts.map,be_default)]".to_owned()
            ),
            Just("    http-request set-var(txn.x) src,map_str(maps/hosts.map)".to_owned()),
            Just("    http-request set-map(maps/hosts.map) %[src] 1".to_owned()),
            Just("    acl a hdr(host) -f maps/hosts.map".to_owned()),
            Just("    http-request set-var(txn.y) str(${X})".to_owned()),
            Just("    http-request set-var(txn.y) str(${X}),map(maps/other.map)".to_owned()),
            Just("    lua-load x.lua $HOME".to_owned()),
            Just("    use_backend %[src,map_beg(maps/myhosts.map)] # hosts.map2".to_owned()),
            Just("backend be_default".to_owned()),
            Just("    server s1 127.0.0.1:80".to_owned()),
            Just(String::new()),
        ]
    }

    proptest::proptest! {
        /// The single pass over the text answers as the line-by-line reference, with
        /// the same reason.
        #[test]
        fn map_uses_in_one_pass_are_found_as_line_by_line(
            lines in proptest::collection::vec(main_line(), 0..12),
            content in proptest::sample::select(vec![
                "a.test be_a\n".to_owned(),
                "a.test be_a\nb.test\tbe_b\n".to_owned(),
                "a.test be\u{7f}\n".to_owned(),
                "a.test be\u{85}x\n".to_owned(),
                "é.test be_é\n".to_owned(),
                format!("{}\n", "x".repeat(MAX_MAP_LINE + 1)),
            ]),
            file in proptest::sample::select(vec!["", "hosts.map is here", "nothing"]),
        ) {
            let mut main = lines.join("\n");
            main.push('\n');
            let mut maps = std::collections::BTreeMap::new();
            maps.insert("hosts.map".to_owned(), Arc::<str>::from(content.as_str()));
            let mut files = std::collections::BTreeMap::new();
            if !file.is_empty() {
                files.insert("notes.txt".to_owned(), Arc::<str>::from(file));
            }
            let candidate = RenderedConfig::new(
                main,
                maps,
                files,
                std::collections::BTreeMap::new(),
                hapwright_eventbus::model::SourceMap::default(),
            );
            proptest::prop_assert_eq!(
                map_change_covered("hosts.map", &content, &candidate),
                map_change_covered_by_lines("hosts.map", &content, &candidate)
            );
        }
    }

    fn map_line() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            8 => "[a-z]{1,12}\\.test [a-z_]{1,10}",
            1 => Just("a.test be\u{7f}".to_owned()),
            1 => Just("é.test be\u{85}x".to_owned()),
            1 => Just("x".repeat(MAX_MAP_LINE + 1)),
            1 => Just("y".repeat(MAX_MAP_LINE)),
            1 => Just(String::new()),
        ]
    }

    proptest::proptest! {
        /// A map's versions checked one after another, each in the lines around
        /// what changed since the last one that passed, answer as a scan of the
        /// whole content, with the same line named.
        #[test]
        fn changed_map_lines_are_checked_as_the_whole_map(
            first in proptest::collection::vec(map_line(), 0..40),
            edits in proptest::collection::vec(
                (0usize..50, 0usize..4, proptest::collection::vec(map_line(), 0..3)),
                1..8,
            ),
        ) {
            let scans = Scans {
                kept: std::sync::Mutex::new(Vec::new()),
                passed: crate::haproxy::config::LastVersions::new(),
            };
            let mut lines = first;
            for (at, removed, added) in edits {
                let content: Arc<str> = Arc::from(format!("{}\n", lines.join("\n")).as_str());
                proptest::prop_assert_eq!(
                    scans.lines("maps/hosts.map", &content),
                    map_lines_covered("maps/hosts.map", &content)
                );
                let at = at.min(lines.len());
                let end = (at + removed).min(lines.len());
                lines.splice(at..end, added);
            }
        }
    }

    #[test]
    fn map_uses() {
        let line = "    use_backend %[req.hdr(host),lower,map(maps/hosts.map,be_default)]";
        let at = line.find("hosts.map").unwrap();
        assert!(string_map_use(line, at, "hosts.map"));
        assert_eq!(
            mentions("map(maps/myhosts.map) hosts.map2 hosts.map", "hosts.map").count(),
            1
        );
        for line in [
            "    use_backend %[src,map_ip(maps/hosts.map,be_default)]",
            "    http-request set-map(maps/hosts.map) %[src] x",
            "    acl a hdr(host) -f maps/hosts.map",
            "    use_backend %[req.hdr(host),map(./maps/hosts.map)]",
            "    use_backend %[req.hdr(host),map(hosts.map)]",
        ] {
            let at = line.find("hosts.map").unwrap();
            assert!(!string_map_use(line, at, "hosts.map"), "{line}");
        }
    }
}
