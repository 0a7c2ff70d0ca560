//! The certificate part of the change plan: certificates and crt-list entries
//! added, changed and removed through the runtime API, without a reload.
//!
//! A certificate that a bind line's `crt-list` names (and `haproxy.cfg` does not name
//! directly) is HAProxy's to add and drop at runtime: a new one is `new ssl cert`,
//! `set ssl cert` and `commit ssl cert`, a changed one `set` and `commit`, one no
//! entry uses any more `del ssl cert`. A crt-list line added, changed (its options
//! or SNI filters) or removed is `add ssl crt-list` / `del ssl crt-list`. The order
//! keeps every step valid: certificates are added before the entries that use them,
//! and removed after the entries that used them are gone.
//!
//! What cannot be done at runtime reloads, with the reason: a certificate directory
//! on a bind line (HAProxy would load every file in it at start, so a file added or
//! removed there changes what a fresh start serves), `crt-base` (the names HAProxy
//! gives certificates then differ from the paths in the crt-list), a certificate
//! named twice in one crt-list (entries are addressed by certificate), a crt-list
//! line naming a certificate hapwright does not render, and a PEM too large for one
//! runtime payload.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hapwright_eventbus::model::{FileGroup, ReloadReason, RenderedConfig, same_file, same_text};

use super::config::{Config, SectionKind};
use super::plan::{ChangePlan, Pem, RuntimeOp};
use crate::client::runtime::MAX_PAYLOAD_BYTES;

/// A crt-list file's entries by certificate: the line as written (borrowed from the
/// rendered file, so thousands of entries cost no copies).
type Entries<'a> = BTreeMap<&'a str, &'a str>;

/// What one side (running or desired) loads.
struct Side<'a> {
    config: &'a RenderedConfig,
    /// The crt-lists named on bind lines, by path.
    lists: BTreeSet<String>,
    /// `crt` arguments of bind lines (certificates or directories).
    crts: BTreeSet<String>,
    /// `crt-base` is set.
    based: bool,
}

impl<'a> Side<'a> {
    fn new(config: &'a RenderedConfig, model: &Config) -> Self {
        let mut lists = BTreeSet::new();
        let mut crts = BTreeSet::new();
        for section in model
            .sections_of(SectionKind::Frontend)
            .chain(model.sections_of(SectionKind::Listen))
        {
            for bind in section.directives_named("bind") {
                let mut words = bind.args.iter();
                while let Some(word) = words.next() {
                    match word.as_str() {
                        "crt-list" => lists.extend(words.next().cloned()),
                        "crt" => crts.extend(words.next().cloned()),
                        _ => {}
                    }
                }
            }
        }
        let based = model
            .global()
            .is_some_and(|g| g.directives_named("crt-base").next().is_some());
        Self {
            config,
            lists,
            crts,
            based,
        }
    }

    /// A rendered file by its path relative to the config directory.
    fn file(&self, path: &str) -> Option<&'a Arc<str>> {
        let (dir, name) = path.split_once('/')?;
        match dir {
            "maps" => self.config.maps().get(name),
            "files" => self.config.files().get(name),
            "certs" => self.config.certificates().get(name),
            _ => None,
        }
    }

    /// A `crt` argument that is not a rendered certificate: a directory (or a file
    /// hapwright does not render, which it cannot tell apart).
    fn directory(&self) -> Option<&String> {
        self.crts.iter().find(|crt| {
            crt.strip_prefix("certs/")
                .is_none_or(|name| !self.config.certificates().contains_key(name))
        })
    }
}

/// Parses a crt-list file: per certificate, its line. Blank lines and `#` comments
/// are skipped, as HAProxy does. `Err` names a certificate listed twice.
fn entries(content: &str) -> Result<Entries<'_>, Duplicate> {
    let mut out = Entries::new();
    for line in content.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let cert = line.split_whitespace().next().unwrap_or_default();
        if out.insert(cert, line).is_some() {
            return Err(Duplicate(cert.to_owned()));
        }
    }
    Ok(out)
}

/// A certificate (`certs/<name>`) a crt-list names twice.
#[derive(Debug, PartialEq, Eq)]
struct Duplicate(String);

/// A file whose content differs between two renders: its name, its content before
/// and after (`None`: not there).
pub(crate) type FileChange<'a> = (&'a str, Option<&'a Arc<str>>, Option<&'a Arc<str>>);

/// The files whose content differs between `old` and `new`, in name order: the
/// parts of the two groups that renders share are skipped ([`imbl::OrdMap::diff`]),
/// so a render that changes one of 10,000 certificates compares a few.
pub(crate) fn file_changes<'a>(old: &'a FileGroup, new: &'a FileGroup) -> Vec<FileChange<'a>> {
    use imbl::ordmap::DiffItem;
    old.diff(new)
        .map(|item| match item {
            DiffItem::Add(name, now) => (name.as_str(), None, Some(now)),
            DiffItem::Update {
                old: (name, was),
                new: (_, now),
            } => (name.as_str(), Some(was), Some(now)),
            DiffItem::Remove(name, was) => (name.as_str(), Some(was), None),
        })
        .collect()
}

/// The names of the certificates whose content differs between `old` and `new`
/// (added, changed or removed), in name order ([`file_changes`]).
fn differing<'a>(old: &'a FileGroup, new: &'a FileGroup) -> Vec<&'a str> {
    file_changes(old, new)
        .into_iter()
        .map(|(name, _, _)| name)
        .collect()
}

/// Plans the certificate and crt-list changes between `running` and `desired` into
/// `plan`; returns the changed files it took care of (the rest of the file planning
/// skips them; unchanged files need no plan).
pub(crate) fn plan_certificates(
    plan: &mut ChangePlan,
    running: (&RenderedConfig, &Config),
    desired: (&RenderedConfig, &Config),
) -> BTreeSet<String> {
    plan_certificates_in(plan, running, desired, true)
}

/// [`plan_certificates`]; `unchanged_lists: false` leaves out the shortcut for
/// unchanged crt-lists ([`plan_unchanged_lists`]), for the test that compares the
/// two.
fn plan_certificates_in(
    plan: &mut ChangePlan,
    (running, running_model): (&RenderedConfig, &Config),
    (desired, desired_model): (&RenderedConfig, &Config),
    unchanged_lists: bool,
) -> BTreeSet<String> {
    let old = Side::new(running, running_model);
    let new = Side::new(desired, desired_model);
    let mut handled = BTreeSet::new();
    if new.lists.is_empty() && old.lists.is_empty() {
        return handled;
    }
    if unchanged_lists && let Some(handled) = plan_unchanged_lists(plan, &old, &new) {
        return handled;
    }
    if unchanged_lists && let Some(handled) = plan_changed_lines(plan, &old, &new) {
        return handled;
    }

    // Each crt-list's entries before and after (only lists hapwright renders and
    // both sides load: a bind line that changed reloads anyway).
    let mut list_entries: Vec<(&String, Entries<'_>, Entries<'_>)> = Vec::new();
    for list in new.lists.intersection(&old.lists) {
        let (Some(before), Some(after)) = (old.file(list), new.file(list)) else {
            continue;
        };
        if !same_text(before, after) {
            handled.insert(list.clone());
            if unchanged_lists {
                read_facts_ahead(after.clone());
            }
        }
        match (entries(before), entries(after)) {
            (Ok(before), Ok(after)) => list_entries.push((list, before, after)),
            (Err(Duplicate(cert)), _) | (_, Err(Duplicate(cert))) => {
                plan.force(
                    ReloadReason::NewFile,
                    format!(
                        "{list} names {cert} twice; the runtime API addresses crt-list \
                         entries by certificate"
                    ),
                );
                return handled;
            }
        }
    }

    // Which certificates each side loads through crt-lists only.
    let loaded = |side: &Side<'_>, after: bool| -> BTreeSet<&str> {
        list_entries
            .iter()
            .flat_map(|(_, before, later)| if after { later.keys() } else { before.keys() })
            .copied()
            .filter(|cert| !side.crts.contains(*cert))
            .collect()
    };
    let loaded_before = loaded(&old, false);
    let loaded_after = loaded(&new, true);
    let adds: Vec<&str> = loaded_after.difference(&loaded_before).copied().collect();
    let dels: Vec<&str> = loaded_before.difference(&loaded_after).copied().collect();
    if (!adds.is_empty() || !dels.is_empty())
        && let Some(reason) = runtime_refusal(&old, &new)
    {
        plan.force(ReloadReason::NewFile, reason);
        return handled;
    }

    let mut cert_ops = Vec::new();
    // Certificates whose PEM changes: a commit puts the names they serve behind
    // those of the other entries, as a changed entry.
    let mut replaced = BTreeSet::new();
    for cert in &adds {
        let Some(pem) = new.file(cert) else {
            plan.force(
                ReloadReason::NewFile,
                format!(
                    "a crt-list names {cert}, which hapwright does not render; HAProxy \
                     reads it only when it loads the config"
                ),
            );
            return handled;
        };
        if pem.len() > MAX_PAYLOAD_BYTES {
            plan.force(
                ReloadReason::NewFile,
                format!("{cert} added and is too large for the runtime API"),
            );
            return handled;
        }
        handled.insert((*cert).to_owned());
        cert_ops.push(RuntimeOp::AddCertificate {
            file: (*cert).to_owned(),
            pem: Pem::from(pem.clone()),
        });
    }
    let changed_paths = changed_paths(running, desired);
    let loaded_both = |cert: &str| loaded_before.contains(cert) && loaded_after.contains(cert);
    if !replacements(
        plan,
        (&old, &new),
        &changed_paths,
        loaded_both,
        (&mut handled, &mut replaced, &mut cert_ops),
    ) {
        return handled;
    }
    let loaded_either = |cert: &str| loaded_before.contains(cert) || loaded_after.contains(cert);
    unloaded_certificates((&old, &new), &changed_paths, loaded_either, &mut handled);

    let mut entry_dels = Vec::new();
    let mut entry_sets = Vec::new();
    for (list, before, after) in &list_entries {
        if same_file(old.file(list), new.file(list)) && replaced.is_empty() {
            // The same lines and no certificate renewed behind them.
            continue;
        }
        let changed: Vec<&str> = after
            .iter()
            .filter(|(cert, line)| before.get(*cert) != Some(*line))
            .map(|(cert, _)| *cert)
            .collect();
        let renewed: Vec<&str> = after
            .keys()
            .copied()
            .filter(|cert| replaced.contains(cert) && !changed.contains(cert))
            .collect();
        if let Some(reason) = order_matters(list, after, &changed, &renewed) {
            plan.force(ReloadReason::NewFile, reason);
            return handled;
        }
        for cert in before.keys().filter(|c| !after.contains_key(*c)) {
            entry_dels.push(RuntimeOp::DelCrtListEntry {
                list: (*list).clone(),
                cert: (*cert).to_owned(),
            });
        }
        for (cert, line) in after {
            if before.get(cert) != Some(line) {
                entry_sets.push(RuntimeOp::SetCrtListEntry {
                    list: (*list).clone(),
                    cert: (*cert).to_owned(),
                    line: (*line).to_owned(),
                });
            }
        }
    }
    let removals = dels.into_iter().map(|cert| {
        handled.insert(cert.to_owned());
        RuntimeOp::DelCertificate {
            file: cert.to_owned(),
        }
    });
    let removals: Vec<RuntimeOp> = removals.collect();
    plan.ops.extend(cert_ops);
    plan.ops.extend(entry_dels);
    plan.ops.extend(entry_sets);
    plan.ops.extend(removals);
    handled
}

/// The paths (`certs/NAME`, and the maps and files a crt-list might name) whose
/// content differs between the two renders, in order.
fn changed_paths(running: &RenderedConfig, desired: &RenderedConfig) -> Vec<String> {
    let mut paths: Vec<String> = [
        ("maps", running.maps(), desired.maps()),
        ("files", running.files(), desired.files()),
        ("certs", running.certificates(), desired.certificates()),
    ]
    .into_iter()
    .flat_map(|(dir, old, new)| {
        differing(old, new)
            .into_iter()
            .map(move |name| format!("{dir}/{name}"))
    })
    .collect();
    paths.sort_unstable();
    paths
}

/// Plans `set ssl cert` and `commit ssl cert` for each changed file that both
/// sides load through a crt-list (`loaded_both`). `false` when the plan was
/// forced to a reload (a PEM too large for the runtime API).
fn replacements<'p>(
    plan: &mut ChangePlan,
    (old, new): (&Side<'_>, &Side<'_>),
    changed_paths: &'p [String],
    loaded_both: impl Fn(&str) -> bool,
    (handled, replaced, cert_ops): (
        &mut BTreeSet<String>,
        &mut BTreeSet<&'p str>,
        &mut Vec<RuntimeOp>,
    ),
) -> bool {
    for cert in changed_paths {
        if !loaded_both(cert) {
            continue;
        }
        let (Some(_), Some(after)) = (old.file(cert), new.file(cert)) else {
            continue;
        };
        handled.insert(cert.clone());
        if after.len() > MAX_PAYLOAD_BYTES {
            plan.force(
                ReloadReason::NewFile,
                format!("{cert} changed and is too large for the runtime API"),
            );
            return false;
        }
        replaced.insert(cert.as_str());
        cert_ops.push(RuntimeOp::ReplaceCertificate {
            file: cert.clone(),
            pem: Pem::from(after.clone()),
        });
    }
    true
}

/// Takes as handled the changed certificate files that no side loads through a
/// bind line (`loaded_either`: through a crt-list): files on disk only (unless a
/// bind line loads a directory, which may be `certs/`).
fn unloaded_certificates(
    (old, new): (&Side<'_>, &Side<'_>),
    changed_paths: &[String],
    loaded_either: impl Fn(&str) -> bool,
    handled: &mut BTreeSet<String>,
) {
    let directories = new.directory().is_some() || old.directory().is_some();
    for path in changed_paths
        .iter()
        .filter(|path| path.starts_with("certs/"))
    {
        let named = |side: &Side<'_>| {
            side.crts.contains(path)
                || side.lists.contains(path)
                || side.config.main().contains(path.as_str())
        };
        // The set lookups first: `named` searches haproxy.cfg.
        if !directories && !loaded_either(path) && !named(old) && !named(new) {
            handled.insert(path.clone());
        }
    }
}

/// What a crt-list's text holds, for the plans that follow a change of
/// certificates alone: kept per text (by pointer), so that renewing a certificate
/// reads its own line, not the 10,000 lines of the list.
///
/// The maps are persistent: the facts of a list changed in a few lines are those of
/// the list before, updated for the lines ([`ListFacts::after_change`]), sharing
/// the rest.
#[derive(Debug, Default, Clone, PartialEq)]
struct ListFacts {
    /// A certificate the list names twice.
    duplicate: bool,
    /// Per certificate, its line.
    lines: imbl::HashMap<Box<str>, Box<str>>,
    /// How many times the entries name each SNI filter (lowercase).
    filters: imbl::HashMap<Box<str>, usize>,
}

impl ListFacts {
    /// The facts of a list with no certificate named twice whose lines `was` (by
    /// certificate) became `now`, the other lines the same: these facts without
    /// `was` and with `now`.
    fn after_change(&self, was: &Entries<'_>, now: &Entries<'_>) -> Self {
        let mut facts = self.clone();
        for (cert, line) in was {
            facts.lines.remove(*cert);
            for name in filters(line) {
                if let Some(count) = facts.filters.get_mut(&*name) {
                    *count -= 1;
                    if *count == 0 {
                        facts.filters.remove(&*name);
                    }
                }
            }
        }
        for (cert, line) in now {
            facts.lines.insert((*cert).into(), (*line).into());
            for name in filters(line) {
                *facts.filters.entry(name.into()).or_insert(0) += 1;
            }
        }
        facts
    }
}

/// How much nicer than the rest of the controller the thread reading a changed
/// crt-list's facts ahead of the next plan is: it runs while the runtime commands
/// of the plan that started it (and HAProxy answering them) need the CPU.
const LIST_FACTS_NICE: i32 = 10;

/// Reads the facts of a changed crt-list's new text on another thread, off this
/// deployment's path and below its runtime commands: the next change is likely a
/// renewal behind the new lines, and its plan reads them.
fn read_facts_ahead(text: Arc<str>) {
    let _ = std::thread::Builder::new()
        .name("hapwright-crt-list".to_owned())
        .spawn(move || {
            hapwright_eventbus::kernel::lower_thread_priority(LIST_FACTS_NICE);
            drop(list_facts(&text));
        });
}

/// How many crt-list texts [`list_facts`] keeps.
const KEPT_LISTS: usize = 4;

static LIST_FACTS: std::sync::Mutex<Vec<(Arc<str>, Arc<ListFacts>)>> =
    std::sync::Mutex::new(Vec::new());

/// The facts of a crt-list text, read once per text.
fn list_facts(text: &Arc<str>) -> Arc<ListFacts> {
    let kept = LIST_FACTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // By pointer, else by content: a list rendered again to the same text, or read
    // back from disk, is not read again (comparing 10,000 lines costs far less).
    if let Some((_, facts)) = kept
        .iter()
        .find(|(seen, _)| Arc::ptr_eq(seen, text))
        .or_else(|| kept.iter().find(|(seen, _)| **seen == **text))
    {
        return facts.clone();
    }
    // Read without holding the lock: a plan never waits for the thread that reads
    // ahead, which runs at a lower priority.
    drop(kept);
    let facts = Arc::new(read_facts(text));
    keep_facts(text, facts.clone());
    facts
}

/// Keeps `facts` as those of `text` for [`list_facts`].
fn keep_facts(text: &Arc<str>, facts: Arc<ListFacts>) {
    let mut kept = LIST_FACTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if kept.iter().any(|(seen, _)| Arc::ptr_eq(seen, text)) {
        return;
    }
    if kept.len() >= KEPT_LISTS {
        kept.remove(0);
    }
    kept.push((text.clone(), facts));
}

/// The facts of a crt-list text, read line by line.
fn read_facts(text: &str) -> ListFacts {
    let mut facts = ListFacts::default();
    match entries(text) {
        Err(Duplicate(_)) => facts.duplicate = true,
        Ok(entries) => {
            for (cert, line) in entries {
                for name in filters(line) {
                    *facts.filters.entry(name.into()).or_insert(0) += 1;
                }
                facts.lines.insert(cert.into(), line.into());
            }
        }
    }
    facts
}

/// [`plan_certificates`] when every crt-list is the same text on both sides (and
/// the bind lines load the same lists and certificates): only renewed
/// certificates can change what is served, so no list is parsed again. `None`
/// when the general planning must decide (a list changed, or it would refuse or
/// explain something).
fn plan_unchanged_lists(
    plan: &mut ChangePlan,
    old: &Side<'_>,
    new: &Side<'_>,
) -> Option<BTreeSet<String>> {
    if old.lists != new.lists || old.crts != new.crts {
        return None;
    }
    let mut lists = Vec::new();
    for list in &new.lists {
        match (old.file(list), new.file(list)) {
            (Some(before), Some(after)) if same_text(before, after) => {
                lists.push(list_facts(after));
            }
            (None, None) => {}
            _ => return None,
        }
    }
    if lists.iter().any(|facts| facts.duplicate) {
        return None;
    }
    let loaded = |cert: &str| {
        !new.crts.contains(cert) && lists.iter().any(|facts| facts.lines.contains_key(cert))
    };
    let changed_paths = changed_paths(old.config, new.config);
    let mut handled = BTreeSet::new();
    let mut replaced = BTreeSet::new();
    let mut cert_ops = Vec::new();
    if !replacements(
        plan,
        (old, new),
        &changed_paths,
        loaded,
        (&mut handled, &mut replaced, &mut cert_ops),
    ) {
        return Some(handled);
    }
    unloaded_certificates((old, new), &changed_paths, loaded, &mut handled);
    // A renewed entry goes to the end of HAProxy's list when committed
    // ([`order_matters`]): it must serve names no other entry serves, or be the
    // list's one entry. Otherwise the general planning says why it reloads.
    for facts in &lists {
        for cert in replaced.iter().copied() {
            let Some(line) = facts.lines.get(cert) else {
                continue;
            };
            let names = filters(line);
            let alone = names
                .iter()
                .all(|name| facts.filters.get(&**name) == Some(&1));
            if !alone || (names.is_empty() && facts.lines.len() > 1) {
                return None;
            }
        }
    }
    plan.ops.extend(cert_ops);
    Some(handled)
}

/// One changed crt-list for [`plan_changed_lines`]: the facts of its text before,
/// and the entries of the lines that differ, before and after.
struct ListChange<'a> {
    name: &'a String,
    facts: Arc<ListFacts>,
    before: Entries<'a>,
    after: Entries<'a>,
    /// The text is the same on both sides.
    same: bool,
}

impl ListChange<'_> {
    /// Whether the list names `cert` before the change.
    fn had(&self, cert: &str) -> bool {
        self.facts.lines.contains_key(cert)
    }

    /// Whether the list names `cert` after the change: in a changed line, or in a
    /// line both sides share.
    fn has(&self, cert: &str) -> bool {
        self.after.contains_key(cert) || (self.had(cert) && !self.before.contains_key(cert))
    }

    /// The line of `cert` after the change.
    fn line(&self, cert: &str) -> Option<&str> {
        match self.after.get(cert) {
            Some(line) => Some(line),
            None if !self.before.contains_key(cert) => self.facts.lines.get(cert).map(|l| &**l),
            None => None,
        }
    }

    /// How many entries name SNI filter `name` after the change.
    fn serving(&self, name: &str) -> usize {
        let count = |entries: &Entries<'_>| {
            entries
                .values()
                .map(|line| filters(line).iter().filter(|n| **n == *name).count())
                .sum::<usize>()
        };
        (self.facts.filters.get(name).copied().unwrap_or(0) + count(&self.after))
            .saturating_sub(count(&self.before))
    }

    fn len_after(&self) -> usize {
        self.facts.lines.len() + self.after.len() - self.before.len()
    }
}

/// [`plan_certificates`] when crt-lists changed in a few lines (a Secret added,
/// changed or removed among thousands): the lines the two texts share at the start
/// and the end are the same entries on both sides, so only the lines between them
/// are parsed, and the rest of each list is known from the facts of its text
/// before ([`list_facts`], read after the deployment that made it). Plans what the
/// general planning plans (a test compares them); `None` when the general planning
/// must decide, and for everything it would refuse or explain: a certificate named
/// twice, a change that would reload, an entry whose place in the list matters.
fn plan_changed_lines(
    plan: &mut ChangePlan,
    old: &Side<'_>,
    new: &Side<'_>,
) -> Option<BTreeSet<String>> {
    if old.lists != new.lists || old.crts != new.crts {
        return None;
    }
    let mut handled = BTreeSet::new();
    let mut lists = Vec::new();
    for name in &new.lists {
        let (before, after) = match (old.file(name), new.file(name)) {
            (Some(before), Some(after)) => (before, after),
            (None, None) => continue,
            _ => return None,
        };
        let facts = list_facts(before);
        if facts.duplicate {
            return None;
        }
        let same = same_text(before, after);
        let (was, now) = if same {
            ("", "")
        } else {
            handled.insert(name.clone());
            // The lines around the bytes the texts do not share: the lines before
            // and after them are the same on both sides.
            crate::haproxy::config::changed_lines(before, after)
        };
        let (Ok(was), Ok(now)) = (entries(was), entries(now)) else {
            return None;
        };
        // A certificate of a changed line also named by a line both share.
        if now
            .keys()
            .any(|cert| facts.lines.contains_key(*cert) && !was.contains_key(cert))
        {
            return None;
        }
        lists.push(ListChange {
            name,
            facts,
            before: was,
            after: now,
            same,
        });
    }
    if lists.iter().all(|list| list.same) {
        // Nothing changed in any list: the other shortcut's case (or a refusal).
        return None;
    }
    let loaded_before = |cert: &str| !old.crts.contains(cert) && lists.iter().any(|l| l.had(cert));
    let loaded_after = |cert: &str| !new.crts.contains(cert) && lists.iter().any(|l| l.has(cert));
    // Only a changed line can add or remove a certificate.
    let touched: BTreeSet<&str> = lists
        .iter()
        .flat_map(|l| l.before.keys().chain(l.after.keys()).copied())
        .collect();
    let adds: Vec<&str> = touched
        .iter()
        .copied()
        .filter(|cert| loaded_after(cert) && !loaded_before(cert))
        .collect();
    let dels: Vec<&str> = touched
        .iter()
        .copied()
        .filter(|cert| loaded_before(cert) && !loaded_after(cert))
        .collect();
    if (!adds.is_empty() || !dels.is_empty()) && runtime_refusal(old, new).is_some() {
        return None;
    }
    let mut cert_ops = Vec::new();
    for cert in &adds {
        let pem = new.file(cert)?;
        if pem.len() > MAX_PAYLOAD_BYTES {
            return None;
        }
        handled.insert((*cert).to_owned());
        cert_ops.push(RuntimeOp::AddCertificate {
            file: (*cert).to_owned(),
            pem: Pem::from(pem.clone()),
        });
    }
    let changed_paths = changed_paths(old.config, new.config);
    let mut replaced = BTreeSet::new();
    let loaded_both = |cert: &str| loaded_before(cert) && loaded_after(cert);
    if !replacements(
        &mut ChangePlan::default(),
        (old, new),
        &changed_paths,
        loaded_both,
        (&mut handled, &mut replaced, &mut cert_ops),
    ) {
        return None;
    }
    let loaded_either = |cert: &str| loaded_before(cert) || loaded_after(cert);
    unloaded_certificates((old, new), &changed_paths, loaded_either, &mut handled);

    let mut entry_dels = Vec::new();
    let mut entry_sets = Vec::new();
    for list in &lists {
        if list.same && replaced.is_empty() {
            continue;
        }
        let changed: Vec<&str> = list
            .after
            .iter()
            .filter(|(cert, line)| list.before.get(*cert) != Some(*line))
            .map(|(cert, _)| *cert)
            .collect();
        let renewed: Vec<&str> = replaced
            .iter()
            .copied()
            .filter(|cert| list.has(cert) && !changed.contains(cert))
            .collect();
        // An entry that moves to the end of HAProxy's list must serve names no
        // other entry serves ([`order_matters`]); else the general planning says why
        // it reloads.
        for cert in changed.iter().chain(&renewed) {
            let names = filters(list.line(cert)?);
            let alone = names.iter().all(|name| list.serving(name) == 1);
            let renewed_only = !changed.contains(cert);
            if !alone || (names.is_empty() && (!renewed_only || list.len_after() > 1)) {
                return None;
            }
        }
        for cert in list.before.keys().filter(|c| !list.after.contains_key(*c)) {
            entry_dels.push(RuntimeOp::DelCrtListEntry {
                list: list.name.clone(),
                cert: (*cert).to_owned(),
            });
        }
        for cert in &changed {
            entry_sets.push(RuntimeOp::SetCrtListEntry {
                list: list.name.clone(),
                cert: (*cert).to_owned(),
                line: list.after[cert].to_owned(),
            });
        }
    }
    // The next plan starts from the new texts: their facts are these lists' facts,
    // updated for the changed lines (no list is read again).
    for list in lists.iter().filter(|list| !list.same) {
        if let Some(text) = new.file(list.name) {
            keep_facts(
                text,
                Arc::new(list.facts.after_change(&list.before, &list.after)),
            );
        }
    }
    for cert in &dels {
        handled.insert((*cert).to_owned());
    }
    plan.ops.extend(cert_ops);
    plan.ops.extend(entry_dels);
    plan.ops.extend(entry_sets);
    plan.ops
        .extend(dels.into_iter().map(|cert| RuntimeOp::DelCertificate {
            file: cert.to_owned(),
        }));
    Some(handled)
}

/// The SNI filters of a crt-list line (lowercase; `[options]` left out).
fn filters(line: &str) -> Vec<std::borrow::Cow<'_, str>> {
    let mut words = line.split_whitespace().skip(1).peekable();
    if words.peek().is_some_and(|w| w.starts_with('[')) {
        for word in words.by_ref() {
            if word.ends_with(']') {
                break;
            }
        }
    }
    words
        .map(|word| {
            if word.bytes().any(|b| b.is_ascii_uppercase()) {
                std::borrow::Cow::Owned(word.to_ascii_lowercase())
            } else {
                std::borrow::Cow::Borrowed(word)
            }
        })
        .collect()
}

/// Why the place of a changed entry in the list would matter, if it would: an entry
/// added or changed at runtime goes to the end of HAProxy's list, while a fresh
/// start reads the file in order, and when two entries serve one name the first
/// loaded wins. So a changed entry must have SNI filters (without them the names
/// come from the certificate) that no other entry of the list has. A `renewed`
/// entry (same line, new PEM) moves to the end as well when the new certificate is
/// committed: it may share no filter with another entry either, and without
/// filters it may be renewed at runtime only when it is the list's one entry.
fn order_matters(
    list: &str,
    after: &Entries<'_>,
    changed: &[&str],
    renewed: &[&str],
) -> Option<String> {
    if changed.is_empty() && renewed.is_empty() {
        // Nothing moves to the end of the list.
        return None;
    }
    let moved = |cert: &str| changed.contains(&cert) || renewed.contains(&cert);
    let mut owners: std::collections::HashMap<std::borrow::Cow<'_, str>, &str> =
        std::collections::HashMap::with_capacity(after.len());
    for (cert, line) in after {
        for name in filters(line) {
            if let Some(other) = owners.insert(name.clone(), cert)
                && (moved(cert) || moved(other))
            {
                return Some(format!(
                    "{list}: {other} and {cert} both serve {name}; which one wins depends \
                     on the order HAProxy loads them in"
                ));
            }
        }
    }
    let renewed = renewed.iter().filter(|_| after.len() > 1);
    changed
        .iter()
        .chain(renewed)
        .find(|cert| filters(after[**cert]).is_empty())
        .map(|cert| {
            format!(
                "{list}: the entry of {cert} has no SNI filters; the names it serves come \
                 from the certificate, so its place in the list decides"
            )
        })
}

/// Why certificates cannot be added or removed at runtime here, if they cannot.
fn runtime_refusal(old: &Side<'_>, new: &Side<'_>) -> Option<String> {
    if old.based || new.based {
        return Some(
            "certificates added or removed with crt-base set; HAProxy names them \
             by the full path, so they are loaded by a reload"
                .to_owned(),
        );
    }
    if let Some(directory) = new.directory().or_else(|| old.directory()) {
        return Some(format!(
            "certificates added or removed while a bind line loads `crt {directory}`, \
             which is not a certificate hapwright renders (a directory is read whole \
             when HAProxy starts)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::haproxy::plan::compute;
    use hapwright_eventbus::model::{DeployStrategy, SourceMap};

    fn render(global: &str, bind: &str, list: &str, certs: &[&str]) -> RenderedConfig {
        RenderedConfig::new(
            format!("global\n{global}\nfrontend f\n    mode http\n    bind :8443 ssl {bind}\n"),
            BTreeMap::new(),
            [("tls.crtlist".to_owned(), Arc::<str>::from(list))].into(),
            certs
                .iter()
                .map(|name| {
                    (
                        (*name).to_owned(),
                        Arc::<str>::from(format!("PEM of {name}")),
                    )
                })
                .collect(),
            SourceMap::default(),
        )
    }

    /// A render whose `haproxy.cfg` loads `files/tls.crtlist` (`list`) on one bind
    /// line, with `certs` as its certificates.
    fn list_render(list: &str, certs: BTreeMap<String, Arc<str>>) -> RenderedConfig {
        RenderedConfig::new(
            "global\nfrontend f\n    mode http\n    bind :8443 ssl crt-list files/tls.crtlist\n",
            BTreeMap::new(),
            [("tls.crtlist".to_owned(), Arc::<str>::from(list))].into(),
            certs,
            SourceMap::default(),
        )
    }

    type Shortcut = fn(&mut ChangePlan, &Side<'_>, &Side<'_>) -> Option<BTreeSet<String>>;

    /// Plans `running` → `desired` with the shortcuts and with the general planning
    /// alone, and asserts both plan (and take care of) the same; the number of
    /// operations when `shortcut` took the change.
    fn planned_as_in_general(
        running: &RenderedConfig,
        desired: &RenderedConfig,
        shortcut: Shortcut,
        context: &str,
    ) -> Option<usize> {
        let model = crate::haproxy::config::parse(running.main()).expect("parses");
        let mut general = ChangePlan::default();
        let handled_general =
            plan_certificates_in(&mut general, (running, &model), (desired, &model), false);
        let mut planned = ChangePlan::default();
        let handled = plan_certificates(&mut planned, (running, &model), (desired, &model));
        assert_eq!(planned, general, "{context}");
        assert_eq!(handled, handled_general, "{context}");
        let (old, new) = (Side::new(running, &model), Side::new(desired, &model));
        shortcut(&mut ChangePlan::default(), &old, &new).map(|_| general.ops.len())
    }

    /// The shortcut for unchanged crt-lists plans what the general planning plans:
    /// random lists (shared and missing SNI filters, comments, certificates named
    /// twice, certificates no list loads) with random certificates renewed.
    #[test]
    fn unchanged_lists_are_planned_as_in_general() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let (mut shortcuts, mut renewals) = (0, 0);
        for _ in 0..400 {
            let certs = 1 + next(6);
            let mut list = String::new();
            for cert in 0..certs {
                if next(5) == 0 {
                    list.push_str("# a comment\n");
                }
                if next(8) == 0 {
                    continue;
                }
                list.push_str(&format!("certs/c{cert}.pem"));
                if next(4) == 0 {
                    list.push_str(" [alpn h2]");
                }
                for _ in 0..next(3) {
                    list.push_str(&format!(" h{}.test", next(6)));
                }
                list.push('\n');
                if next(15) == 0 {
                    list.push_str(&format!("certs/c{cert}.pem dup.test\n"));
                }
            }
            let list: Arc<str> = Arc::from(list);
            let names: Vec<String> = (0..=certs).map(|c| format!("c{c}.pem")).collect();
            let running_certs: BTreeMap<String, Arc<str>> = names
                .iter()
                .map(|name| (name.clone(), Arc::from(format!("PEM of {name}"))))
                .collect();
            let mut desired_certs = running_certs.clone();
            for name in &names {
                if next(2) == 0 {
                    desired_certs.insert(name.clone(), Arc::from(format!("renewed {name}")));
                }
            }
            let (running, desired) = (
                list_render(&list, running_certs),
                list_render(&list, desired_certs),
            );
            if let Some(ops) =
                planned_as_in_general(&running, &desired, plan_unchanged_lists, &list)
            {
                shortcuts += 1;
                renewals += ops;
            }
        }
        assert!(
            shortcuts > 100 && renewals > 100,
            "{shortcuts} shortcuts, {renewals} renewals"
        );
    }

    /// The shortcut for crt-lists changed in a few lines plans what the general
    /// planning plans: random lists (shared, repeated and missing SNI filters,
    /// options, comments, certificates named twice, certificates no list loads or
    /// none renders), each changed by random lines added, removed and rewritten,
    /// with random certificates renewed, added and removed.
    #[test]
    fn changed_lines_are_planned_as_in_general() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let line = |next: &mut dyn FnMut(u64) -> u64| -> String {
            let mut text = match next(12) {
                0 => "# a comment".to_owned(),
                1 => String::new(),
                _ => format!("certs/c{}.pem", next(14)),
            };
            if text.starts_with("certs/") {
                if next(5) == 0 {
                    text.push_str(" [alpn h2]");
                }
                for _ in 0..next(3) {
                    text.push_str(&format!(" h{}.test", next(16)));
                }
            }
            text
        };
        let (mut shortcuts, mut ops, mut derived) = (0, 0, 0);
        for _ in 0..1500 {
            let mut lines: Vec<String> = (0..next(10)).map(|_| line(&mut next)).collect();
            let before = lines.join("\n") + if next(6) == 0 { "" } else { "\n" };
            for _ in 0..=next(3) {
                match next(3) {
                    0 => {
                        let at = next(lines.len() as u64 + 1) as usize;
                        lines.insert(at, line(&mut next));
                    }
                    1 if !lines.is_empty() => {
                        lines.remove(next(lines.len() as u64) as usize);
                    }
                    _ if !lines.is_empty() => {
                        let at = next(lines.len() as u64) as usize;
                        lines[at] = line(&mut next);
                    }
                    _ => {}
                }
            }
            let after = lines.join("\n") + if next(6) == 0 { "" } else { "\n" };
            let rendered = |next: &mut dyn FnMut(u64) -> u64| -> BTreeMap<String, Arc<str>> {
                let mut certs = BTreeMap::new();
                for c in 0..14 {
                    if next(8) != 0 {
                        let name = format!("c{c}.pem");
                        let pem = format!("PEM {} of {name}", next(2));
                        certs.insert(name, Arc::from(pem));
                    }
                }
                certs
            };
            let running = list_render(&before, rendered(&mut next));
            let desired = list_render(&after, rendered(&mut next));
            let context = format!("{before:?} -> {after:?}");
            if let Some(planned) =
                planned_as_in_general(&running, &desired, plan_changed_lines, &context)
            {
                shortcuts += 1;
                ops += planned;
            }
            // The facts the shortcut keeps for the next plan, derived from the list
            // before and the changed lines, are those of the list after.
            let facts = read_facts(&before);
            let (was, now) = crate::haproxy::config::changed_lines(&before, &after);
            if let (false, Ok(was), Ok(now)) = (facts.duplicate, entries(was), entries(now))
                && !now
                    .keys()
                    .any(|cert| facts.lines.contains_key(*cert) && !was.contains_key(cert))
            {
                assert_eq!(
                    facts.after_change(&was, &now),
                    read_facts(&after),
                    "{context}"
                );
                derived += 1;
            }
        }
        assert!(
            shortcuts > 300 && ops > 500 && derived > 300,
            "{shortcuts} shortcuts, {ops} operations, {derived} derived facts"
        );
    }

    #[test]
    fn certificates_and_entries_are_planned_in_a_valid_order() {
        let bind = "crt-list files/tls.crtlist";
        let old = render(
            "",
            bind,
            "certs/a.pem a.test\ncerts/b.pem b.test\n",
            &["a.pem", "b.pem"],
        );
        let new = render(
            "",
            bind,
            "certs/a.pem a.test www.a.test\ncerts/c.pem c.test\n",
            &["a.pem", "c.pem"],
        );
        let plan = compute(&old, &new);
        assert_eq!(
            plan.strategy(),
            DeployStrategy::Runtime,
            "{:?}",
            plan.reload
        );
        let described: Vec<String> = plan.ops.iter().map(RuntimeOp::describe).collect();
        assert_eq!(
            described,
            [
                "certs/c.pem added",
                "files/tls.crtlist entry certs/b.pem removed",
                "files/tls.crtlist entry certs/a.pem set",
                "files/tls.crtlist entry certs/c.pem set",
                "certs/b.pem removed",
            ]
        );
        // The PEM (with its key) never shows in debug output.
        let debug = format!("{plan:?}");
        assert!(!debug.contains("PEM of"), "{debug}");
        assert!(debug.contains("<PEM, 12 bytes, not shown>"), "{debug}");
    }

    #[test]
    fn a_certificate_file_nothing_loads_is_a_file_on_disk_only() {
        let bind = "crt-list files/tls.crtlist";
        let old = render("", bind, "certs/a.pem a.test\n", &["a.pem"]);
        let new = render("", bind, "certs/a.pem a.test\n", &["a.pem", "spare.pem"]);
        assert_eq!(compute(&old, &new).strategy(), DeployStrategy::Noop);
    }

    #[test]
    fn directories_and_crt_base_reload_with_the_reason() {
        let old = render(
            "",
            "crt certs/ crt-list files/tls.crtlist",
            "certs/a.pem a.test\n",
            &["a.pem"],
        );
        let new = render(
            "",
            "crt certs/ crt-list files/tls.crtlist",
            "certs/a.pem a.test\ncerts/b.pem b.test\n",
            &["a.pem", "b.pem"],
        );
        let reason = compute(&old, &new).reload.unwrap().detail;
        assert!(reason.contains("`crt certs/`"), "{reason}");

        let old = render(
            "    crt-base /etc/ssl",
            "crt-list files/tls.crtlist",
            "certs/a.pem a.test\n",
            &["a.pem"],
        );
        let new = render(
            "    crt-base /etc/ssl",
            "crt-list files/tls.crtlist",
            "certs/a.pem a.test\ncerts/b.pem b.test\n",
            &["a.pem", "b.pem"],
        );
        let reason = compute(&old, &new).reload.unwrap().detail;
        assert!(reason.contains("crt-base"), "{reason}");
    }

    #[test]
    fn crt_list_lines_are_keyed_by_certificate() {
        let parsed =
            entries("# comment\n\ncerts/a.pem [alpn h2] a.test\n  certs/b.pem b.test\n").unwrap();
        assert_eq!(parsed["certs/a.pem"], "certs/a.pem [alpn h2] a.test");
        assert_eq!(parsed["certs/b.pem"], "certs/b.pem b.test");
        assert_eq!(
            entries("certs/a.pem a.test\ncerts/a.pem b.test\n").unwrap_err(),
            Duplicate("certs/a.pem".to_owned())
        );
        assert_eq!(
            filters("certs/a.pem [alpn h2 ssl-min-ver TLSv1.2] A.test *.b.test !c.b.test"),
            ["a.test", "*.b.test", "!c.b.test"]
        );
        assert!(filters("certs/a.pem").is_empty());
    }

    /// A crt-list where `a` and `b` both serve a.test and `c` has no SNI filters, and
    /// the three certificate names.
    fn overlapping_list() -> (Entries<'static>, [String; 3]) {
        let list = entries("certs/a.pem a.test\ncerts/b.pem b.test A.test\ncerts/c.pem\n").unwrap();
        let names = ["certs/a.pem", "certs/b.pem", "certs/c.pem"].map(str::to_owned);
        (list, names)
    }

    #[test]
    fn a_changed_entry_sharing_a_name_or_without_filters_depends_on_order() {
        let (after, [a, b, c]) = overlapping_list();
        let reason = order_matters("files/l", &after, &[b.as_str()], &[]).unwrap();
        assert!(reason.contains("both serve a.test"), "{reason}");
        let reason = order_matters("files/l", &after, &[c.as_str()], &[]).unwrap();
        assert!(reason.contains("no SNI filters"), "{reason}");
        let apart = entries("certs/a.pem a.test\ncerts/b.pem b.test\n").unwrap();
        assert_eq!(
            order_matters("files/l", &apart, &[a.as_str(), b.as_str()], &[]),
            None
        );
    }

    #[test]
    fn a_renewed_certificate_moves_behind_the_others_when_committed() {
        let (after, [a, b, c]) = overlapping_list();
        // The first of two entries serving a.test: renewed, it would come second.
        let reason = order_matters("files/l", &after, &[], &[a.as_str()]).unwrap();
        assert!(reason.contains("both serve a.test"), "{reason}");
        let reason = order_matters("files/l", &after, &[], &[c.as_str()]).unwrap();
        assert!(reason.contains("no SNI filters"), "{reason}");
        // Names no other entry serves, or a list of one: renewed at runtime.
        let apart = entries("certs/a.pem a.test\ncerts/b.pem b.test\n").unwrap();
        assert_eq!(
            order_matters("files/l", &apart, &[], &[a.as_str(), b.as_str()]),
            None
        );
        let alone = entries("certs/c.pem\n").unwrap();
        assert_eq!(order_matters("files/l", &alone, &[], &[c.as_str()]), None);
    }
}
