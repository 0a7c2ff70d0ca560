//! Phase 2 by equivalence for certificates: certificate files added, changed or
//! removed, and crt-list lines added, changed or removed, pass without `haproxy -c`
//! when every changed certificate passes an in-process check that is strictly
//! narrower than what HAProxy accepts, and every changed crt-list line is written in
//! a narrow syntax (docs/validation.md, "Phase 2 by equivalence").
//!
//! A changed certificate (`certs/NAME.pem`) must:
//!
//! - hold only `CERTIFICATE` blocks and exactly one `PRIVATE KEY` (PKCS#8),
//!   `RSA PRIVATE KEY` or `EC PRIVATE KEY` block, nothing else but blank lines
//!   between them; base64 lines of at most 76 characters;
//! - have a first certificate (the leaf) that parses, signed with RSA PKCS#1 or
//!   ECDSA over SHA-256/384/512, whose public key is an RSA key of 2048–8192 bits
//!   or an EC key on P-256 or P-384, and the private key must load and match it;
//! - have a leaf of a kind the reference already served (the same key algorithm and
//!   size, signature algorithm, self-issued or not), so that OpenSSL's security
//!   level, whatever the system sets, accepted that kind, and chain certificates
//!   byte-identical to chain certificates of the reference;
//! - be named `NAME.pem` (letters, digits, `.`, `_`, `-`), no other certificate
//!   named `NAME.pem.*` or `NAME.*` (files HAProxy would load next to it), and be
//!   named in no other way than as the first word of crt-list lines.
//!
//! A changed file must be a crt-list: named in `haproxy.cfg` only as
//! `crt-list files/NAME`, by no other rendered file. Its lines that are not
//! byte-identical to a line of the reference's version are
//! `certs/NAME.pem [options] [filters]`: single spaces, no quotes, escapes, `$`,
//! `#` or control characters, at most [`MAX_LINE`] bytes; options byte-identical to
//! those of a line of the reference's version or `[alpn P1,P2…]`; filters host
//! names, `*.` wildcards, each optionally negated with `!`. Every line names a
//! certificate that exists, and at least one line remains.
//!
//! A removed certificate is named nowhere any more. `haproxy.cfg` must not set
//! `crt-base`, `key-base`, a security level, a `crt-store`, nor load the `certs`
//! directory as a whole.
//!
//! Certificates the check has seen are remembered by content, and what the
//! reference's certificates tell (their kinds, their chain certificates) is read
//! only as far as needed, so that the thousandth change after the last `haproxy -c`
//! costs what the first did.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use hapwright_eventbus::model::{ContentHash, FileGroup, RenderedConfig, same_file};
use rustls::pki_types::pem::{self, SectionKind};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, alg_id};
use rustls::sign::CertifiedKey;

use super::equivalence::{Baseline, Why, mentions};

/// Longest crt-list line (in bytes) the rule accepts when it changed.
pub const MAX_LINE: usize = 4096;

/// Most SNI filters on one changed crt-list line.
const MAX_FILTERS: usize = 64;

/// Longest base64 line of a PEM block the rule accepts.
const MAX_PEM_LINE: usize = 76;

/// Most certificate blocks (leaf and chain) in one PEM.
const MAX_CERTIFICATES: usize = 8;

/// How many certificate verdicts are remembered before the memory starts over.
const MAX_REMEMBERED: usize = 20_000;

/// Whether the certificates and files of `candidate` differ from the baseline's
/// only as the rule allows: `Ok(n)` with the number of certificates and crt-lists
/// that changed or went (0 when all are identical). The files must have the same
/// names (the caller checks it).
pub(crate) fn covered(baseline: &Baseline, candidate: &RenderedConfig) -> Result<usize, Why> {
    let old = &baseline.rendered;
    let changed_files: Vec<(&str, &str)> = candidate
        .files()
        .iter()
        .filter(|(name, content)| !same_file(old.files().get(*name), Some(content)))
        .map(|(name, content)| (name.as_str(), &**content))
        .collect();
    let (old_certs, new_certs) = (old.certificates(), candidate.certificates());
    let mut changed_certs: Vec<(&str, &Arc<str>)> = Vec::new();
    let mut removed_certs: Vec<&str> = Vec::new();
    for (name, _, now) in crate::haproxy::certs::file_changes(old_certs, new_certs) {
        match now {
            Some(content) => changed_certs.push((name, content)),
            None => removed_certs.push(name),
        }
    }
    let differences = changed_files.len() + changed_certs.len() + removed_certs.len();
    if differences == 0 {
        return Ok(0);
    }
    let main = candidate.main();
    main_allows_certificate_changes(main)?;
    let crt_lists = CrtLists::new(candidate);
    let paths = super::RenderedPaths::of(candidate);
    for (name, content) in &changed_files {
        if !crt_lists.names.contains(name) {
            return Err(Why(format!(
                "files/{name} changed and is not used only as a crt-list"
            )));
        }
        let before = old.files().get(*name);
        let after = candidate
            .files()
            .get(*name)
            .expect("a file of the candidate");
        CRT_LIST_ANSWERS.answer(name, before, after, &paths, || {
            match before.and_then(|before| {
                changed_lines_covered(name, before, old_certs, content, new_certs)
            }) {
                Some(answer) => answer,
                None => {
                    crt_list_covered(name, before.map_or("", |text| &**text), content, new_certs)
                }
            }
        })?;
    }
    for (name, _) in &changed_certs {
        certificate_name_covered(name, candidate, &crt_lists)?;
    }
    for name in &removed_certs {
        if mentions(main, name).next().is_some() || crt_lists.other_file_mentions(candidate, name) {
            return Err(Why(format!("certs/{name} was removed and is still named")));
        }
        if crt_lists.loads(name) {
            return Err(Why(format!(
                "certs/{name} was removed and a crt-list still loads it"
            )));
        }
    }
    if !changed_certs.is_empty() {
        let mut anchors = ANCHORS.lock().unwrap_or_else(PoisonError::into_inner);
        let anchors = Anchors::of(&mut anchors, baseline);
        for (name, content) in &changed_certs {
            let facts = analyse(content).map_err(|why| Why(format!("certs/{name}: {why}")))?;
            if !anchors.find(baseline, |found| found.leaves.contains(&facts.leaf)) {
                return Err(Why(format!(
                    "certs/{name}: the reference serves no certificate of its kind (key, signature)"
                )));
            }
            for (index, chain) in facts.chain.iter().enumerate() {
                if !anchors.find(baseline, |found| found.chain.contains(chain)) {
                    return Err(Why(format!(
                        "certs/{name}: chain certificate {} is not one the reference served",
                        index + 1
                    )));
                }
            }
        }
    }
    Ok(differences)
}

/// Whether the differences of certificates and files look like the rule's, judged
/// cheaply: every file that changed is named in `haproxy.cfg` after `crt-list`.
pub(crate) fn likely(old: &RenderedConfig, candidate: &RenderedConfig) -> bool {
    candidate
        .files()
        .iter()
        .filter(|(name, content)| !same_file(old.files().get(*name), Some(content)))
        .all(|(name, _)| candidate.main().contains(&format!("crt-list files/{name}")))
}

// === haproxy.cfg ===

/// Words that make certificate loading depend on more than the files: another base
/// directory, a security level, certificate stores.
const FORBIDDEN_WORDS: &[&str] = &[
    "crt-base",
    "key-base",
    "crt-store",
    "security-level",
    "ssl-security-level",
];

/// `haproxy.cfg` leaves certificate loading to the crt-lists and named files.
fn main_allows_certificate_changes(main: &str) -> Result<(), Why> {
    for line in main.lines() {
        let words = || line.split_ascii_whitespace();
        if let Some(word) = words().find(|word| FORBIDDEN_WORDS.contains(word)) {
            return Err(Why(format!(
                "certificates changed and haproxy.cfg uses '{word}'"
            )));
        }
        if line.to_ascii_uppercase().contains("SECLEVEL") {
            return Err(Why(
                "certificates changed and haproxy.cfg sets a security level".to_owned(),
            ));
        }
        if line.contains("crt") && line.contains('$') {
            return Err(Why(format!(
                "certificates changed and a line naming certificates has a '$': {}",
                line.trim()
            )));
        }
        if let Some(word) = words().find(|word| {
            matches!(
                word.trim_end_matches('/'),
                "certs" | "./certs" | "\"certs" | "'certs"
            )
        }) {
            return Err(Why(format!(
                "certificates changed and haproxy.cfg names the directory '{word}'"
            )));
        }
    }
    Ok(())
}

// === crt-lists ===

/// The candidate's crt-lists: files named in `haproxy.cfg` only after `crt-list`.
struct CrtLists<'a> {
    candidate: &'a RenderedConfig,
    names: HashSet<&'a str>,
    /// How many lines of all crt-lists load each certificate (`certs/NAME` first):
    /// read only when a certificate was removed.
    loaded: std::cell::OnceCell<HashMap<&'a str, usize>>,
}

impl<'a> CrtLists<'a> {
    fn new(candidate: &'a RenderedConfig) -> Self {
        let main = candidate.main();
        let mut names = HashSet::new();
        for name in candidate.files().keys() {
            let mut uses = 0;
            let mut only_crt_list = true;
            for line in main.lines() {
                for at in mentions(line, name) {
                    uses += 1;
                    let after_crt_list = line[..at]
                        .strip_suffix("crt-list files/")
                        .is_some_and(|before| before.ends_with([' ', '\t']));
                    let word_ends = line[at + name.len()..]
                        .chars()
                        .next()
                        .is_none_or(|c| c == ' ' || c == '\t');
                    only_crt_list &= after_crt_list && word_ends;
                }
            }
            let elsewhere = candidate
                .files()
                .iter()
                .any(|(other, text)| other != name && mentions(text, name).next().is_some());
            if uses > 0 && only_crt_list && !elsewhere {
                names.insert(name.as_str());
            }
        }
        Self {
            candidate,
            names,
            loaded: std::cell::OnceCell::new(),
        }
    }

    /// Whether a crt-list line loads `certs/<name>`.
    fn loads(&self, name: &str) -> bool {
        self.loaded().contains_key(name)
    }

    /// How many crt-list lines load each certificate.
    fn loaded(&self) -> &HashMap<&'a str, usize> {
        self.loaded.get_or_init(|| {
            let mut loaded = HashMap::new();
            for name in &self.names {
                for line in self.candidate.files()[*name].lines() {
                    if let Some(cert) = line
                        .split([' ', '\t'])
                        .next()
                        .and_then(|path| path.strip_prefix("certs/"))
                    {
                        *loaded.entry(cert).or_insert(0) += 1;
                    }
                }
            }
            loaded
        })
    }

    /// Whether a rendered file other than a crt-list names `name`.
    fn other_file_mentions(&self, candidate: &RenderedConfig, name: &str) -> bool {
        candidate
            .files()
            .iter()
            .filter(|(file, _)| !self.names.contains(file.as_str()))
            .any(|(_, text)| mentions(text, name).next().is_some())
    }
}

/// The answers of [`crt_list_covered`] for the last few crt-lists, by the
/// allocations of the list before and after and of the candidate's file names (what
/// the answer depends on: the names of the rendered certificates, not their
/// contents). Every validation compares with the same baseline until it moves, so a
/// renewal would otherwise read the same two 10,000-line lists again.
struct CrtListAnswers(Mutex<Vec<CrtListAnswer>>);

struct CrtListAnswer {
    name: Box<str>,
    before: Option<Arc<str>>,
    after: Arc<str>,
    paths: Arc<super::RenderedPaths>,
    answer: Result<(), Why>,
}

/// How many answers [`CrtListAnswers`] keeps.
const CRT_LIST_ANSWERS_KEPT: usize = 4;

static CRT_LIST_ANSWERS: CrtListAnswers = CrtListAnswers(Mutex::new(Vec::new()));

impl CrtListAnswers {
    fn answer(
        &self,
        name: &str,
        before: Option<&Arc<str>>,
        after: &Arc<str>,
        paths: &Arc<super::RenderedPaths>,
        check: impl FnOnce() -> Result<(), Why>,
    ) -> Result<(), Why> {
        let same = |kept: &CrtListAnswer| {
            Arc::ptr_eq(&kept.after, after)
                && Arc::ptr_eq(&kept.paths, paths)
                && *kept.name == *name
                && match (&kept.before, before) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                }
        };
        let found = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|kept| same(kept))
            .map(|kept| kept.answer.clone());
        if let Some(answer) = found {
            return answer;
        }
        let answer = check();
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() >= CRT_LIST_ANSWERS_KEPT {
            kept.remove(0);
        }
        kept.push(CrtListAnswer {
            name: Box::from(name),
            before: before.cloned(),
            after: Arc::clone(after),
            paths: Arc::clone(paths),
            answer: answer.clone(),
        });
        answer
    }
}

/// Whether the new content of crt-list `name` is covered.
fn crt_list_covered(name: &str, before: &str, after: &str, certs: &FileGroup) -> Result<(), Why> {
    if !(after.is_empty() || after.ends_with('\n')) {
        return Err(Why(format!("files/{name}: the last line has no newline")));
    }
    let old_lines: HashSet<&str> = before.lines().collect();
    let entries = lines_covered(
        name,
        (after, 0),
        |line| old_lines.contains(line),
        certs,
        || before.lines().filter_map(options_of).collect(),
    )?;
    if entries == 0 {
        return Err(Why(format!("files/{name} has no certificate left")));
    }
    Ok(())
}

/// Checks `lines`, lines of a changed crt-list (the first is line `first + 1` of
/// it), as [`crt_list_covered`] does: returns how many are entries, or why one is
/// refused. `unchanged` tells a line the reference's version has (only what it
/// loads is checked); `options` gives the options of the reference's lines, asked
/// once a line changed.
fn lines_covered<'a>(
    name: &str,
    (lines, first): (&str, usize),
    unchanged: impl Fn(&str) -> bool,
    certs: &FileGroup,
    options: impl FnOnce() -> HashSet<&'a str>,
) -> Result<usize, Why> {
    let mut options = Some(options);
    let mut old_options: Option<HashSet<&str>> = None;
    let mut entries = 0;
    for (index, line) in lines.lines().enumerate() {
        let at = || format!("files/{name}:{}", first + index + 1);
        if line.is_empty() {
            continue;
        }
        let unchanged = unchanged(line);
        if line.starts_with('#') && unchanged {
            continue;
        }
        entries += 1;
        let path = line.split([' ', '\t']).next().unwrap_or_default();
        if !path
            .strip_prefix("certs/")
            .is_some_and(|cert| certs.contains_key(cert))
        {
            return Err(Why(format!(
                "{}: loads '{path}', not a rendered certificate",
                at()
            )));
        }
        if unchanged {
            continue;
        }
        let old_options = old_options
            .get_or_insert_with(|| options.take().map(|read| read()).unwrap_or_default());
        crt_list_line_covered(line, old_options).map_err(|why| Why(format!("{}: {why}", at())))?;
    }
    Ok(entries)
}

/// What [`changed_lines_covered`] keeps of a crt-list of the reference: read once
/// per text (and the reference's certificates), so that a change to a list of
/// 10,000 lines checks the lines that changed, not the whole list.
struct ListBefore {
    text: Arc<str>,
    /// The reference's certificates the facts were read against.
    certs: FileGroup,
    /// Every line.
    lines: HashSet<Box<str>>,
    /// The `[…]` options of its lines.
    options: HashSet<Box<str>>,
    /// The certificates its entry lines load, with how many lines load each.
    loaded: HashMap<Box<str>, usize>,
    /// Its entry lines (not empty, not a comment).
    entries: usize,
    /// Every entry line loads one of the reference's certificates.
    all_rendered: bool,
}

/// How many crt-lists of the reference [`changed_lines_covered`] keeps.
const LISTS_BEFORE_KEPT: usize = 4;

static LISTS_BEFORE: Mutex<Vec<Arc<ListBefore>>> = Mutex::new(Vec::new());

impl ListBefore {
    /// The facts of `text` against `certs`, read once.
    fn of(text: &Arc<str>, certs: &FileGroup) -> Arc<Self> {
        let mut kept = LISTS_BEFORE.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = kept
            .iter()
            .find(|kept| Arc::ptr_eq(&kept.text, text) && kept.certs.ptr_eq(certs))
        {
            return Arc::clone(found);
        }
        let mut facts = Self {
            text: Arc::clone(text),
            certs: certs.clone(),
            lines: HashSet::new(),
            options: HashSet::new(),
            loaded: HashMap::new(),
            entries: 0,
            all_rendered: true,
        };
        for line in text.lines() {
            facts.lines.insert(line.into());
            if let Some(options) = options_of(line) {
                facts.options.insert(options.into());
            }
            match entry_certificate(line) {
                None => {}
                Some(Some(cert)) if certs.contains_key(cert) => {
                    facts.entries += 1;
                    *facts.loaded.entry(cert.into()).or_insert(0) += 1;
                }
                Some(_) => {
                    facts.entries += 1;
                    facts.all_rendered = false;
                }
            }
        }
        let facts = Arc::new(facts);
        if kept.len() >= LISTS_BEFORE_KEPT {
            kept.remove(0);
        }
        kept.push(Arc::clone(&facts));
        facts
    }
}

/// For a line of a crt-list that is also a line of the reference's version (so
/// [`crt_list_covered`] checks only what it loads): `None` for a line that is no
/// entry (empty, or a comment), else the certificate it loads (`None`: a path
/// outside `certs/`).
fn entry_certificate(line: &str) -> Option<Option<&str>> {
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let path = line.split([' ', '\t']).next().unwrap_or_default();
    Some(path.strip_prefix("certs/"))
}

/// [`crt_list_covered`] from the lines that differ between `before` (the
/// reference's version, with `old_certs` its certificates) and `after`: the
/// lines before and after them are lines of the reference's version, each loading
/// one of its certificates, so only a removed certificate could fail them.
/// `None` when that does not hold (some line of the reference loads something
/// else, or a line both share loads a removed certificate): the whole check
/// decides, and words the answer.
fn changed_lines_covered(
    name: &str,
    before: &Arc<str>,
    old_certs: &FileGroup,
    after: &str,
    certs: &FileGroup,
) -> Option<Result<(), Why>> {
    if before.is_empty() || !(after.is_empty() || after.ends_with('\n')) {
        return None;
    }
    let facts = ListBefore::of(before, old_certs);
    if !facts.all_rendered {
        return None;
    }
    let (was, now) = crate::haproxy::config::changed_lines(before, after);
    let mut was_loaded: HashMap<&str, usize> = HashMap::new();
    let mut was_entries = 0;
    for cert in was.lines().filter_map(entry_certificate) {
        was_entries += 1;
        *was_loaded.entry(cert.unwrap_or_default()).or_insert(0) += 1;
    }
    // A line both versions share that loads a certificate now gone.
    for item in old_certs.diff(certs) {
        if let imbl::ordmap::DiffItem::Remove(cert, _) = item {
            // The changed lines of the reference are some of its lines.
            let loaded = |counts: Option<&usize>| counts.copied().unwrap_or(0);
            if loaded(facts.loaded.get(cert.as_str())) > loaded(was_loaded.get(cert.as_str())) {
                return None;
            }
        }
    }
    // The changed lines, numbered as in `after`.
    let start = (now.as_ptr() as usize)
        .checked_sub(after.as_ptr() as usize)
        .filter(|start| *start <= after.len())?;
    let first = memchr::memchr_iter(b'\n', &after.as_bytes()[..start]).count();
    let shared_entries = facts.entries - was_entries.min(facts.entries);
    let changed_entries = lines_covered(
        name,
        (now, first),
        |line| facts.lines.contains(line),
        certs,
        || facts.options.iter().map(|options| &**options).collect(),
    );
    let entries = match changed_entries {
        Ok(entries) => shared_entries + entries,
        Err(why) => return Some(Err(why)),
    };
    if entries == 0 {
        return Some(Err(Why(format!("files/{name} has no certificate left"))));
    }
    Some(Ok(()))
}

/// The `[…]` options of a crt-list line, as written.
fn options_of(line: &str) -> Option<&str> {
    let rest = line.split_once(' ')?.1;
    if !rest.starts_with('[') {
        return None;
    }
    rest.find(']').map(|end| &rest[..=end])
}

/// Whether a changed crt-list line is in the narrow syntax.
fn crt_list_line_covered(line: &str, old_options: &HashSet<&str>) -> Result<(), Why> {
    if line.len() > MAX_LINE {
        return Err(Why(format!("line longer than {MAX_LINE} bytes")));
    }
    if !line.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        || line.contains(['"', '\'', '\\', '$', '#'])
    {
        return Err(Why(
            "a changed line has quotes, escapes, '$', '#' or control characters".to_owned(),
        ));
    }
    if line.contains("  ") || line.ends_with(' ') {
        return Err(Why(
            "words of a changed line are not single-spaced".to_owned()
        ));
    }
    let mut rest = line.split_once(' ').map_or("", |(_, rest)| rest);
    if let Some(options) = options_of(line) {
        if !old_options.contains(options) && !alpn_option(options) {
            return Err(Why(format!("options {options} are new")));
        }
        rest = rest[options.len()..].trim_start_matches(' ');
    }
    let filters: Vec<&str> = rest.split(' ').filter(|word| !word.is_empty()).collect();
    if filters.len() > MAX_FILTERS {
        return Err(Why(format!("more than {MAX_FILTERS} SNI filters")));
    }
    if let Some(filter) = filters.iter().find(|filter| !sni_filter(filter)) {
        return Err(Why(format!("'{filter}' is not a plain SNI filter")));
    }
    Ok(())
}

/// `[alpn P1,P2…]`, each protocol name 1-32 letters, digits, `.`, `_`, `/`, `-`.
fn alpn_option(options: &str) -> bool {
    options
        .strip_prefix("[alpn ")
        .and_then(|rest| rest.strip_suffix(']'))
        .is_some_and(|list| {
            list.split(',').all(|protocol| {
                (1..=32).contains(&protocol.len())
                    && protocol.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-')
                    })
            })
        })
}

/// A host name or `*.` wildcard, optionally negated with `!`: labels of 1-63
/// letters, digits, `-` or `_`, at most 253 bytes.
fn sni_filter(filter: &str) -> bool {
    let host = filter.strip_prefix('!').unwrap_or(filter);
    let host = host.strip_prefix("*.").unwrap_or(host);
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
        })
}

/// Whether a changed certificate's name and its uses are covered.
fn certificate_name_covered(
    name: &str,
    candidate: &RenderedConfig,
    crt_lists: &CrtLists<'_>,
) -> Result<(), Why> {
    let plain = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    let Some(stem) = name
        .strip_suffix(".pem")
        .filter(|stem| plain && !stem.is_empty())
    else {
        return Err(Why(format!(
            "certs/{name} changed and is not named NAME.pem"
        )));
    };
    let beside = format!("{stem}.");
    if let Some(other) = candidate
        .certificates()
        .range(beside.clone()..)
        .map(|(other, _)| other)
        .take_while(|other| other.starts_with(&beside))
        .find(|other| *other != name)
    {
        return Err(Why(format!(
            "certs/{name} changed and certs/{other} would be loaded with it"
        )));
    }
    if mentions(candidate.main(), name).next().is_some() {
        return Err(Why(format!(
            "certs/{name} changed and haproxy.cfg names it"
        )));
    }
    if crt_lists.other_file_mentions(candidate, name) {
        return Err(Why(format!(
            "certs/{name} changed and a file other than a crt-list names it"
        )));
    }
    Ok(())
}

// === PEM ===

/// What decides whether HAProxy loads a leaf certificate the way it loaded one of
/// the reference: its key algorithm and size, its signature algorithm, and whether
/// it is self-issued (OpenSSL does not check a self-signed certificate's digest).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct LeafKind {
    /// The contents of the subject public key's AlgorithmIdentifier.
    key_algorithm: Vec<u8>,
    /// The length of the SubjectPublicKeyInfo (the key size).
    key_length: usize,
    /// The DER of the certificate's signature AlgorithmIdentifier (contents).
    signature: Vec<u8>,
    self_issued: bool,
}

/// What a PEM that passed the check holds, key material aside.
#[derive(Debug)]
struct PemFacts {
    leaf: LeafKind,
    /// The DER of each chain certificate.
    chain: Vec<Vec<u8>>,
}

/// Verdicts by PEM content: a certificate is checked once.
type Verdicts = HashMap<Arc<str>, Result<Arc<PemFacts>, Why>>;

static VERDICTS: Mutex<Option<Verdicts>> = Mutex::new(None);

/// The check of one PEM, remembered by content.
fn analyse(content: &Arc<str>) -> Result<Arc<PemFacts>, Why> {
    if let Some(verdict) = VERDICTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .and_then(|verdicts| verdicts.get(content))
    {
        return verdict.clone();
    }
    let verdict = check_pem(content).map(Arc::new);
    let mut verdicts = VERDICTS.lock().unwrap_or_else(PoisonError::into_inner);
    let verdicts = verdicts.get_or_insert_with(HashMap::new);
    if verdicts.len() >= MAX_REMEMBERED {
        verdicts.clear();
    }
    verdicts.insert(Arc::clone(content), verdict.clone());
    verdict
}

/// The narrow check of one PEM. Errors name what failed, never key material.
fn check_pem(content: &str) -> Result<PemFacts, Why> {
    let (certificates, keys) = pem_structure(content)?;
    if certificates == 0 || certificates > MAX_CERTIFICATES {
        return Err(Why(format!(
            "{certificates} certificates (1 to {MAX_CERTIFICATES} are checked)"
        )));
    }
    if keys != 1 {
        return Err(Why(format!("{keys} private keys (exactly one is checked)")));
    }
    let mut reader = content.as_bytes();
    let mut chain = Vec::new();
    let mut key = None;
    while let Some((kind, der)) =
        pem::from_buf(&mut reader).map_err(|_| "a PEM block does not decode".to_owned())?
    {
        match kind {
            SectionKind::Certificate => chain.push(der),
            SectionKind::PrivateKey => key = Some(PrivateKeyDer::Pkcs8(der.into())),
            SectionKind::RsaPrivateKey => key = Some(PrivateKeyDer::Pkcs1(der.into())),
            SectionKind::EcPrivateKey => key = Some(PrivateKeyDer::Sec1(der.into())),
            _ => return Err(Why("an unexpected PEM block".to_owned())),
        }
    }
    let key = key.ok_or("no private key")?;
    if chain.len() != certificates {
        return Err(Why("a PEM block does not decode".to_owned()));
    }
    let leaf_der = chain.remove(0);
    let leaf = leaf_kind(&leaf_der).ok_or("the certificate is not X.509 DER")?;
    let key_algorithm = leaf.key_algorithm.as_slice();
    let supported_key = key_algorithm == alg_id::RSA_ENCRYPTION.as_ref()
        || key_algorithm == alg_id::ECDSA_P256.as_ref()
        || key_algorithm == alg_id::ECDSA_P384.as_ref();
    if !supported_key {
        return Err(Why(
            "the certificate's key is neither RSA nor EC P-256/P-384".to_owned(),
        ));
    }
    let supported_signature = [
        alg_id::RSA_PKCS1_SHA256,
        alg_id::RSA_PKCS1_SHA384,
        alg_id::RSA_PKCS1_SHA512,
        alg_id::ECDSA_SHA256,
        alg_id::ECDSA_SHA384,
        alg_id::ECDSA_SHA512,
    ]
    .iter()
    .any(|algorithm| leaf.signature == algorithm.as_ref());
    if !supported_signature {
        return Err(Why(
            "the certificate's signature algorithm is not RSA or ECDSA with SHA-2".to_owned(),
        ));
    }
    for certificate in &chain {
        leaf_kind(certificate).ok_or("a chain certificate is not X.509 DER")?;
    }
    let signing = rustls::crypto::aws_lc_rs::sign::any_supported_type(&key)
        .map_err(|_| "the private key does not load as RSA 2048-8192 or ECDSA".to_owned())?;
    if !matches!(
        signing.algorithm(),
        rustls::SignatureAlgorithm::RSA | rustls::SignatureAlgorithm::ECDSA
    ) {
        return Err(Why("the private key is neither RSA nor ECDSA".to_owned()));
    }
    let certified = CertifiedKey::new(vec![CertificateDer::from(leaf_der)], signing);
    certified
        .keys_match()
        .map_err(|_| "the private key does not match the certificate".to_owned())?;
    Ok(PemFacts { leaf, chain })
}

/// Counts the certificate and key blocks of a PEM written strictly: only blocks of
/// the known labels, base64 lines inside them, blank lines between them.
fn pem_structure(content: &str) -> Result<(usize, usize), Why> {
    const LABELS: &[&str] = &[
        "CERTIFICATE",
        "PRIVATE KEY",
        "RSA PRIVATE KEY",
        "EC PRIVATE KEY",
    ];
    let (mut certificates, mut keys) = (0, 0);
    let mut open: Option<&str> = None;
    for (index, line) in content.split('\n').enumerate() {
        let at = index + 1;
        match open {
            None => {
                if line.is_empty() {
                    continue;
                }
                let label = line
                    .strip_prefix("-----BEGIN ")
                    .and_then(|rest| rest.strip_suffix("-----"))
                    .filter(|label| LABELS.contains(label))
                    .ok_or_else(|| {
                        format!("line {at} is not the start of a certificate or key block")
                    })?;
                open = Some(label);
            }
            Some(label) => {
                if let Some(end) = line
                    .strip_prefix("-----END ")
                    .and_then(|rest| rest.strip_suffix("-----"))
                {
                    if end != label {
                        return Err(Why(format!("line {at} ends another block")));
                    }
                    if label == "CERTIFICATE" {
                        certificates += 1;
                    } else {
                        keys += 1;
                    }
                    open = None;
                    continue;
                }
                let base64 = !line.is_empty()
                    && line.len() <= MAX_PEM_LINE
                    && line
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
                if !base64 {
                    return Err(Why(format!("line {at} is not base64")));
                }
            }
        }
    }
    if open.is_some() {
        return Err(Why("a block has no end".to_owned()));
    }
    Ok((certificates, keys))
}

/// One DER element: its tag, its contents and what follows it (definite lengths of
/// at most 4 bytes, single-byte tags).
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count || rest[0] == 0 {
            return None;
        }
        let (bytes, rest) = rest.split_at(count);
        let length = bytes
            .iter()
            .fold(0usize, |length, &b| (length << 8) | usize::from(b));
        (length, rest)
    };
    (rest.len() >= length).then(|| {
        let (contents, rest) = rest.split_at(length);
        (tag, contents, rest)
    })
}

/// A DER element of the expected tag.
fn expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    der_element(input)
        .and_then(|(found, contents, rest)| (found == tag).then_some((contents, rest)))
}

const SEQUENCE: u8 = 0x30;

/// The kind of an X.509 certificate (DER), when its outer structure parses.
fn leaf_kind(der: &[u8]) -> Option<LeafKind> {
    let (certificate, rest) = expect(der, SEQUENCE)?;
    if !rest.is_empty() {
        return None;
    }
    let (tbs, rest) = expect(certificate, SEQUENCE)?;
    let (signature, rest) = expect(rest, SEQUENCE)?;
    let (_, rest) = expect(rest, 0x03)?;
    if !rest.is_empty() {
        return None;
    }
    let mut fields = tbs;
    if fields.first() == Some(&0xa0) {
        fields = expect(fields, 0xa0)?.1;
    }
    let (_, fields) = expect(fields, 0x02)?; // serial
    let (_, fields) = expect(fields, SEQUENCE)?; // signature
    let (issuer, fields) = expect(fields, SEQUENCE)?;
    let (_, fields) = expect(fields, SEQUENCE)?; // validity
    let (subject, fields) = expect(fields, SEQUENCE)?;
    let (spki, after) = expect(fields, SEQUENCE)?;
    let spki_length = fields.len() - after.len();
    let (algorithm, _) = expect(spki, SEQUENCE)?;
    Some(LeafKind {
        key_algorithm: algorithm.to_vec(),
        key_length: spki_length,
        signature: signature.to_vec(),
        self_issued: issuer == subject,
    })
}

// === what the reference served ===

/// The kinds of leaf and the chain certificates the reference served (the
/// certificates its crt-lists load), read only as far as a question needs.
#[derive(Default)]
struct Anchors {
    baseline: Option<ContentHash>,
    /// The certificates the reference's crt-lists load.
    loaded: Vec<String>,
    /// How many of them were read.
    read: usize,
    leaves: HashSet<LeafKind>,
    chain: HashSet<Vec<u8>>,
}

static ANCHORS: Mutex<Option<Anchors>> = Mutex::new(None);

impl Anchors {
    /// The anchors of `baseline`, started over when they were read from another
    /// reference.
    fn of<'a>(anchors: &'a mut Option<Anchors>, baseline: &Baseline) -> &'a mut Anchors {
        let hash = baseline.rendered.hash();
        if anchors.as_ref().and_then(|anchors| anchors.baseline) != Some(hash) {
            let mut loaded: Vec<String> = CrtLists::new(&baseline.rendered)
                .loaded()
                .keys()
                .map(|name| (*name).to_owned())
                .collect();
            loaded.sort_unstable();
            *anchors = Some(Anchors {
                baseline: Some(hash),
                loaded,
                ..Anchors::default()
            });
        }
        anchors.get_or_insert_with(Anchors::default)
    }

    /// Whether `found` holds, reading more of the reference until it does.
    fn find(&mut self, baseline: &Baseline, found: impl Fn(&Anchors) -> bool) -> bool {
        while !found(self) {
            let Some(name) = self.loaded.get(self.read) else {
                return false;
            };
            self.read += 1;
            let Some(content) = baseline.rendered.certificates().get(name) else {
                continue;
            };
            let mut reader = content.as_bytes();
            let mut first = true;
            while let Ok(Some((kind, der))) = pem::from_buf(&mut reader) {
                if kind != SectionKind::Certificate {
                    continue;
                }
                if first {
                    self.leaves.extend(leaf_kind(&der));
                    first = false;
                } else {
                    self.chain.insert(der);
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sni_filters() {
        for good in [
            "a.test",
            "*.a.test",
            "!a.test",
            "!*.a-b_c.test",
            "localhost",
        ] {
            assert!(sni_filter(good), "{good}");
        }
        let long_label = "x".repeat(64);
        for bad in [
            "",
            "*",
            "*.",
            "!",
            "a..b",
            ".a",
            "a.",
            "*.*.a",
            "a\"b",
            "é.test",
            "$HOST",
            "a,b",
            &long_label,
        ] {
            assert!(!sni_filter(bad), "{bad}");
        }
    }

    /// The check from the changed lines answers as the whole check: random
    /// crt-lists of the reference (entries, comments, blank lines, lines outside
    /// `certs/` or in a syntax the rule refuses) edited line by line, with
    /// certificates added and removed, compared after every edit.
    #[test]
    fn changed_lines_are_checked_as_the_whole_list() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut draw = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let names = ["a.pem", "b.pem", "c.pem", "d.pem", "e.pem", "f.pem"];
        let line = |draw: &mut dyn FnMut(u64) -> u64| -> String {
            let cert = names[draw(names.len() as u64) as usize];
            match draw(12) {
                0 => String::new(),
                1 => "# served by hapwright".to_owned(),
                2 => format!("# {cert}"),
                3 => "other/x.pem x.test".to_owned(),
                4 => format!("certs/{cert}  x.test"),
                5 => format!("certs/{cert} [verify none] v.test"),
                6 => format!("certs/{cert} [ssl-min-ver TLSv1.3] m.test"),
                7 => format!("certs/{cert} \"q.test\""),
                8 => format!("certs/{cert}"),
                _ => format!("certs/{cert} {}.test", draw(20)),
            }
        };
        let (mut fast, mut total) = (0, 0);
        for _ in 0..400 {
            let mut old_certs = FileGroup::new();
            for name in names {
                if draw(4) != 0 {
                    old_certs.insert(name.to_owned(), Arc::from(name));
                }
            }
            let mut lines: Vec<String> = (0..1 + draw(12)).map(|_| line(&mut draw)).collect();
            // Mostly lists whose every entry loads a certificate of the reference.
            if draw(3) != 0 {
                lines.retain(|l| {
                    entry_certificate(l)
                        .is_none_or(|cert| cert.is_some_and(|cert| old_certs.contains_key(cert)))
                });
            }
            fn text(lines: &[String], newline: bool) -> Arc<str> {
                let mut text = lines.join("\n");
                if newline {
                    text.push('\n');
                }
                Arc::from(text)
            }
            let before = text(&lines, draw(20) != 0);
            let mut certs = old_certs.clone();
            for _ in 0..1 + draw(4) {
                let at = draw(lines.len() as u64 + 1) as usize;
                match draw(5) {
                    0 if at < lines.len() => {
                        lines.remove(at);
                    }
                    1 if at < lines.len() => lines[at] = line(&mut draw),
                    2 => {
                        certs.remove(names[draw(names.len() as u64) as usize]);
                    }
                    3 => {
                        let name = names[draw(names.len() as u64) as usize];
                        certs.insert(name.to_owned(), Arc::from(name));
                    }
                    _ => lines.insert(at, line(&mut draw)),
                }
                let after = text(&lines, draw(20) != 0);
                if *after == *before {
                    continue;
                }
                total += 1;
                let whole = crt_list_covered("tls.crtlist", &before, &after, &certs);
                if let Some(answer) =
                    changed_lines_covered("tls.crtlist", &before, &old_certs, &after, &certs)
                {
                    fast += 1;
                    assert_eq!(answer, whole, "before {before:?}, after {after:?}");
                }
            }
        }
        // The shortcut answers most of them.
        assert!(fast * 2 > total, "{fast} of {total}");
    }

    #[test]
    fn crt_list_lines() {
        let old: HashSet<&str> = HashSet::from(["[verify none]"]);
        for good in [
            "certs/a.pem",
            "certs/a.pem a.test !b.a.test *.a.test",
            "certs/a.pem [alpn h2,http/1.1] a.test",
            "certs/a.pem [verify none] a.test",
        ] {
            assert!(crt_list_line_covered(good, &old).is_ok(), "{good}");
        }
        for bad in [
            "certs/a.pem  a.test",
            "certs/a.pem a.test ",
            "certs/a.pem\ta.test",
            "certs/a.pem [alpn h2 a.test",
            "certs/a.pem [alpn ] a.test",
            "certs/a.pem [ssl-min-ver TLSv1.3] a.test",
            "certs/a.pem \"a.test\"",
            "certs/a.pem a.test # comment",
        ] {
            assert!(crt_list_line_covered(bad, &old).is_err(), "{bad}");
        }
        let many = format!("certs/a.pem {}", vec!["a.test"; MAX_FILTERS + 1].join(" "));
        assert!(crt_list_line_covered(&many, &old).is_err());
    }

    #[test]
    fn pem_structure_is_strict() {
        let block =
            |label: &str| format!("-----BEGIN {label}-----\nTUlJQg==\n-----END {label}-----\n");
        let good = block("CERTIFICATE") + "\n" + &block("PRIVATE KEY");
        assert_eq!(pem_structure(&good), Ok((1, 1)));
        for bad in [
            format!("text\n{good}"),
            good.replace('\n', "\r\n"),
            block("CERTIFICATE") + &block("DH PARAMETERS"),
            block("ENCRYPTED PRIVATE KEY"),
            good.replacen("TUlJQg==", "TUlJQg==\n", 1),
            good.replacen("TUlJQg==", &"A".repeat(77), 1),
            good.replacen("-----END CERTIFICATE-----", "-----END PRIVATE KEY-----", 1),
            good[..good.len() - 10].to_owned(),
        ] {
            assert!(pem_structure(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn der_is_walked_defensively() {
        assert_eq!(der_element(&[0x30, 0x00]), Some((0x30, &[][..], &[][..])));
        assert_eq!(
            der_element(&[0x30, 0x81, 0x01, 0x05]),
            Some((0x30, &[5u8][..], &[][..]))
        );
        for bad in [
            &[][..],
            &[0x30],
            &[0x30, 0x02, 0x00],
            &[0x1f, 0x00],
            &[0x30, 0x80],
            &[0x30, 0x85, 1, 1, 1, 1, 1],
            &[0x30, 0x81, 0x00],
        ] {
            assert_eq!(der_element(bad), None, "{bad:?}");
        }
        assert_eq!(leaf_kind(&[0x30, 0x03, 0x30, 0x01, 0x00]), None);
        assert!(check_pem("garbage\n").is_err());
    }
}
