//! File sets: a `maps`, `files` or `sslCertificates` entry with `forEach` and `name`
//! renders one file per item of a list, each named by its item.
//!
//! ```yaml
//! sslCertificates:
//!   tls:
//!     forEach: "resources.secrets.list() | selectattr('type', 'eq', 'kubernetes.io/tls')"
//!     name: "{{ item.metadata.namespace }}_{{ item.metadata.name }}.pem"
//!     template: |
//!       {{ item.data['tls.crt'] | b64decode }}
//!       {{ item.data['tls.key'] | b64decode }}
//! ```
//!
//! `forEach` is a Jinja expression evaluated in the render context (after
//! `haproxy.cfg`, so `shared` holds what it left there); `name` and `template` are
//! templates that see the item as `item`. Each name must follow the rules of file
//! names in the config, and be unique in its directory (among the fixed names and
//! every set's items); an item that breaks them fails the render with an error
//! naming the item's object, so the quarantine holds back that object only.
//!
//! Incremental: an item's file is reused when the same item (the same object, or an
//! equal value) renders the same name and nothing its template read from the
//! resources changed, so a change to one object renders only its file. Items of a
//! set whose template (with everything it includes) never names `shared` render in
//! parallel.

use std::collections::BTreeMap;
use std::sync::Arc;

use hapwright_eventbus::model::{Diagnostic, FileGroup, FileKind, RenderedFileRef, SourceLocation};
use minijinja::value::Value;
use rayon::prelude::*;

use super::context::{self, Read, Recording, Resources};
use super::{Renderer, escape, lazy, output};

/// A file set as the config gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSet {
    /// Where its files land (`maps/`, `files/` or `certs/`).
    pub kind: FileKind,
    /// Its key in the config (`sslCertificates.<key>`): names the set in errors.
    pub key: String,
    /// The Jinja expression giving the items.
    pub for_each: String,
    /// The file name template, rendered per item.
    pub name: String,
    /// The file's template, rendered per item.
    pub template: String,
}

/// A compiled file set.
#[derive(Debug)]
pub(crate) struct SetSpec {
    pub(crate) kind: FileKind,
    pub(crate) key: String,
    /// The entry of its template.
    pub(crate) entry: usize,
    /// The name of its name template in the environment.
    pub(crate) name_template: String,
    pub(crate) for_each: String,
    /// Its template neither names `shared` nor references a template by a computed
    /// name: its items render in parallel and may be reused.
    pub(crate) contained: bool,
    /// Its name template reads nothing but `item`, `extraContext` and functions
    /// whose answers are fixed for the config (no tags, no resources, no `shared`):
    /// a string item keeps the name it got last time without rendering it again.
    pub(crate) pure_name: bool,
}

/// Whether a name template depends on the item alone ([`SetSpec::pure_name`]):
/// `undeclared` are the variables it names and does not set.
pub(crate) fn pure_name(source: &str, undeclared: &std::collections::HashSet<String>) -> bool {
    const FIXED: [&str; 7] = [
        "item",
        "extraContext",
        "path",
        "fail",
        "range",
        "dict",
        "namespace",
    ];
    !source.contains("{%") && undeclared.iter().all(|name| FIXED.contains(&name.as_str()))
}

impl SetSpec {
    /// How the config names it: `sslCertificates.tls`.
    pub(crate) fn label(&self) -> String {
        let section = match self.kind {
            FileKind::Map => "maps",
            FileKind::File => "files",
            FileKind::Certificate => "sslCertificates",
            FileKind::Main => "haproxyConfig",
        };
        format!("{section}.{}", self.key)
    }
}

/// The name of a set's name template in the environment.
pub(crate) fn name_template(kind: FileKind, key: &str) -> String {
    format!("{}#name", kind.relative_path(key))
}

/// One item's file, kept for the next render.
pub(crate) struct CachedItem {
    item: Value,
    text: Arc<str>,
    lines: Arc<[Option<u32>]>,
    reads: Arc<[Read]>,
}

/// Per set, what the last render left for the next.
pub(crate) type SetCache = Vec<SetFiles>;

/// One set's files of the last render in item order, with their names, the fixed
/// names of its kind they were checked against and, when its name template depends
/// on the item alone ([`SetSpec::pure_name`]), the name each string item got.
#[derive(Default)]
pub(crate) struct SetFiles {
    files: Vec<(String, CachedItem)>,
    names: foldhash::HashMap<String, String>,
    fixed: Vec<String>,
    /// The names of `files`, when known (else empty): the items-come-and-go path
    /// checks a new item's name against them without hashing every name again.
    in_use: foldhash::HashSet<String>,
}

/// One item's file: which, its text and its lines' origins.
pub(crate) type SetFile = (RenderedFileRef, Arc<str>, Arc<[Option<u32>]>);

/// What the sets rendered.
pub(crate) struct Rendered {
    /// Every item's file, in set order then item order; for a kind in
    /// `from_last`, only the files that are new or rendered again.
    pub(crate) files: Vec<SetFile>,
    /// Per kind (maps, files, certificates), when its one set's files are the last
    /// render's but for a few: the names of the last render's files that are gone.
    /// The kind's files are then the last render's without those, with `files`
    /// added or replacing theirs.
    pub(crate) from_last: [Option<Vec<String>>; 3],
    pub(crate) cache: SetCache,
    pub(crate) rendered: usize,
    pub(crate) reused: usize,
}

/// Whether `old` and `new` are the same item: the same stored object, or equal
/// values.
fn same_item(old: &Value, new: &Value) -> bool {
    match (lazy::identity(old), lazy::identity(new)) {
        (Some(a), Some(b)) if a == b => true,
        _ => old == new,
    }
}

/// How errors name an item: the object it is (`Secret shop/tls`), or its value.
pub(crate) fn describe(item: &Value) -> String {
    let field = |value: &Value, key: &str| {
        value
            .get_attr(key)
            .ok()
            .filter(|v| !v.is_undefined() && !v.is_none())
    };
    if let Some(metadata) = field(item, "metadata")
        && let Some(name) = field(&metadata, "name")
    {
        let kind = field(item, "kind")
            .map(|k| format!("{k} "))
            .unwrap_or_default();
        return match field(&metadata, "namespace") {
            Some(namespace) => format!("{kind}{namespace}/{name}"),
            None => format!("{kind}{name}"),
        };
    }
    let text = item.to_string();
    let mut short: String = text.chars().take(80).collect();
    if short.len() < text.len() {
        short.push('…');
    }
    short
}

/// One item to render: its value and file name.
struct Item {
    value: Value,
    name: String,
}

impl Renderer {
    /// Renders every file set's items with `context` (the render's context, after
    /// `haproxy.cfg`), reusing what `previous` (the resources and set files of the
    /// last render) still holds. `taken` are the fixed file names per kind (maps,
    /// files, certificates).
    pub(crate) fn render_sets(
        &self,
        context: &Value,
        budget: &output::Budget,
        resources: &Resources,
        previous: Option<(Resources, SetCache)>,
        taken: [&FileGroup; 3],
        last_known: bool,
    ) -> Result<Rendered, Vec<Diagnostic>> {
        let inner = &*self.inner;
        let env = &inner.env;
        let (old_resources, mut old_sets) = match previous {
            Some((resources, sets)) => (Some(resources), sets),
            None => (None, Vec::new()),
        };
        old_sets.resize_with(inner.sets.len(), SetFiles::default);
        let check = old_resources
            .as_ref()
            .map(|old| context::ReadCheck::new(old, resources));
        let mut diagnostics = Vec::new();
        // Every name given so far per kind, with the item that has it (`None`: a
        // fixed entry); described only for an error.
        let mut names: [BTreeMap<String, Option<Value>>; 3] = Default::default();
        for (slot, fixed) in names.iter_mut().zip(taken) {
            for name in fixed.keys() {
                slot.insert(name.clone(), None);
            }
        }
        let who = |item: &Option<Value>| {
            item.as_ref()
                .map_or_else(|| "a fixed entry".to_owned(), describe)
        };
        let mut out = Rendered {
            files: Vec::new(),
            from_last: Default::default(),
            cache: Vec::with_capacity(inner.sets.len()),
            rendered: 0,
            reused: 0,
        };
        // Per kind: whether one set alone makes files of it.
        let alone = [FileKind::Map, FileKind::File, FileKind::Certificate].map(|kind| {
            inner
                .sets
                .iter()
                .filter(|set| slot_of(set.kind) == slot_of(kind))
                .count()
                == 1
        });
        let span = tracing::Span::current();
        for (set, mut old) in inner.sets.iter().zip(old_sets) {
            let entry = &inner.entries[set.entry];
            let label = set.label();
            let at = |message: String| self.set_error(set, message);
            let items = match env
                .compile_expression(&set.for_each)
                .and_then(|expression| expression.eval(context))
            {
                Ok(list) if list.is_undefined() || list.is_none() => Vec::new(),
                Ok(list) => match list.try_iter() {
                    Ok(iter) => iter.collect::<Vec<_>>(),
                    Err(_) => {
                        diagnostics.push(at(format!(
                            "{label}.forEach gave {} `{}`, not a list to render one file per item of",
                            list.kind(),
                            describe(&list)
                        )));
                        out.cache.push(SetFiles::default());
                        continue;
                    }
                },
                Err(error) => {
                    diagnostics.push(at(format!(
                        "{label}.forEach: {}",
                        self.runtime_diagnostic(&error).message
                    )));
                    out.cache.push(SetFiles::default());
                    continue;
                }
            };
            let slot = slot_of(set.kind);
            let fixed: Vec<String> = taken[slot].keys().cloned().collect();
            let render = |item: &Item| -> Result<CachedItem, Box<Diagnostic>> {
                let _entered = span.enter();
                let escaping = escape::Escaping::for_kind(set.kind);
                let mut output =
                    output::Output::new(&inner.markers, budget, entry.source.len(), escaping);
                let recording = Recording::start();
                let rendered = env
                    .get_template(&entry.name)
                    .and_then(|t| {
                        t.render_captured_to(item_context(context, &item.value), &mut output)
                    })
                    .map(drop);
                let reads = recording.finish();
                let who = describe(&item.value);
                match (rendered, output.exceeded()) {
                    (_, Some(exceeded)) => {
                        let mut d = self.output_cap_diagnostic(entry, exceeded, budget);
                        d.message = format!("{} (rendering {who})", d.message);
                        Err(Box::new(d))
                    }
                    (_, None) if output.refused().is_some() => {
                        let refused = output.refused().expect("checked");
                        let mut d = self.refused_diagnostic(entry, refused);
                        d.message = format!(
                            "{} ({} for {who})",
                            d.message,
                            set.kind.relative_path(&item.name)
                        );
                        Err(Box::new(d))
                    }
                    (Err(error), None) => {
                        let mut d = self.runtime_diagnostic(&error);
                        d.message = format!(
                            "{} ({} for {who})",
                            d.message,
                            set.kind.relative_path(&item.name)
                        );
                        Err(Box::new(d))
                    }
                    (Ok(()), None) => {
                        let stripped = output.finish();
                        Ok(CachedItem {
                            item: item.value.clone(),
                            text: Arc::from(stripped.text),
                            lines: Arc::from(stripped.lines),
                            reads: reads.into(),
                        })
                    }
                }
            };
            // The same items as last time, in the same order, named by the item
            // alone, checked against the same fixed names, and no other set of the
            // kind to collide with: the names are last time's, already checked, and
            // each item's file is its own of last time when its reads did not
            // change. A renewed certificate then costs its own file, not a pass over
            // every name: only the files that render again are handed on, to replace
            // theirs in the last render's files (`from_last`).
            let same_items = set.pure_name
                && check.is_some()
                && old.fixed == fixed
                && old.files.len() == items.len()
                && alone[slot]
                && old
                    .files
                    .iter()
                    .zip(&items)
                    .all(|((_, cached), value)| same_item(&cached.item, value));
            if same_items {
                let check = check.as_ref().expect("checked above");
                let mut files = std::mem::take(&mut old.files);
                let mut stale = Vec::new();
                for (index, ((name, cached), value)) in files.iter_mut().zip(items).enumerate() {
                    cached.item = value;
                    if set.contained && cached.reads.iter().all(|read| check.unchanged(read)) {
                        budget.charge(cached.text.len());
                    } else {
                        stale.push((
                            index,
                            Item {
                                value: cached.item.clone(),
                                name: name.clone(),
                            },
                        ));
                    }
                }
                let rendered: Vec<(usize, Result<CachedItem, Box<Diagnostic>>)> =
                    if set.contained && stale.len() > 1 {
                        stale
                            .par_iter()
                            .map(|(index, item)| (*index, render(item)))
                            .collect()
                    } else {
                        stale
                            .iter()
                            .map(|(index, item)| (*index, render(item)))
                            .collect()
                    };
                let mut replaced = 0;
                for (index, result) in rendered {
                    match result {
                        Ok(file) => {
                            let name = &files[index].0;
                            if last_known {
                                out.files.push(set_file(set.kind, name, &file));
                            }
                            files[index].1 = file;
                            replaced += 1;
                        }
                        Err(diagnostic) => diagnostics.push(*diagnostic),
                    }
                }
                out.rendered += replaced;
                out.reused += files.len() - replaced;
                if last_known {
                    out.from_last[slot] = Some(Vec::new());
                } else {
                    out.files.extend(
                        files
                            .iter()
                            .map(|(name, file)| set_file(set.kind, name, file)),
                    );
                }
                out.cache.push(SetFiles {
                    files,
                    names: std::mem::take(&mut old.names),
                    fixed,
                    in_use: std::mem::take(&mut old.in_use),
                });
                continue;
            }
            // Items added or removed, the others as last time, all strings named by
            // the item alone: the names of the items that stay are last time's (the
            // memo), and the kind's files are the last render's with the new and
            // changed ones added and the gone ones taken out (`from_last`). A new or
            // removed certificate then costs its own file and a pass over names,
            // not the copy of every name into new maps.
            if let Some(check) = check.as_ref()
                && set.pure_name
                && last_known
                && old.fixed == fixed
                && alone[slot]
                && items.iter().all(|item| item.as_str().is_some())
                && old
                    .files
                    .iter()
                    .all(|(_, cached)| cached.item.as_str().is_some())
            {
                match self.render_changed_items(
                    set,
                    &label,
                    context,
                    items,
                    &mut old,
                    taken[slot],
                    check,
                    budget,
                    &render,
                ) {
                    Ok(changed) => {
                        let ChangedItems {
                            files,
                            names: memo,
                            in_use,
                            removed,
                            rendered,
                            reused,
                            new_files,
                        } = changed;
                        out.rendered += rendered;
                        out.reused += reused;
                        out.files.extend(new_files);
                        out.from_last[slot] = Some(removed);
                        out.cache.push(SetFiles {
                            files,
                            names: memo,
                            fixed,
                            in_use,
                        });
                    }
                    Err(found) => {
                        diagnostics.extend(found);
                        out.cache.push(SetFiles::default());
                    }
                }
                continue;
            }
            // Names first: cheap, and every problem with them is found before any
            // file renders.
            let mut named: Vec<Item> = Vec::with_capacity(items.len());
            let mut memo = foldhash::HashMap::default();
            for value in items {
                // A string item of a pure name template keeps last render's name
                // (which passed the name rules then).
                let known = set
                    .pure_name
                    .then(|| value.as_str().and_then(|item| old.names.get(item)))
                    .flatten()
                    .cloned();
                let name = match known {
                    Some(name) => name,
                    None => match self.item_name(set, &label, context, &value) {
                        Ok(name) => name,
                        Err(diagnostic) => {
                            diagnostics.push(*diagnostic);
                            continue;
                        }
                    },
                };
                if let Some(first) = names[slot].get(&name) {
                    diagnostics.push(at(format!(
                        "{label}: {} and {} both render {}",
                        describe(&value),
                        who(first),
                        set.kind.relative_path(&name)
                    )));
                    continue;
                }
                if set.pure_name
                    && let Some(item) = value.as_str()
                {
                    memo.insert(item.to_owned(), name.clone());
                }
                names[slot].insert(name.clone(), Some(value.clone()));
                named.push(Item { value, name });
            }
            // Reuse (taken out of the last render's files, not copied), or render.
            let mut by_name: foldhash::HashMap<String, CachedItem> =
                std::mem::take(&mut old.files).into_iter().collect();
            let kept: Vec<Option<CachedItem>> = named
                .iter()
                .map(|item| {
                    let cached = by_name.remove(&item.name)?;
                    let check = check.as_ref()?;
                    (set.contained
                        && same_item(&cached.item, &item.value)
                        && cached.reads.iter().all(|read| check.unchanged(read)))
                    .then(|| CachedItem {
                        item: item.value.clone(),
                        ..cached
                    })
                })
                .collect();
            let render_or_keep = |(item, kept): (&Item, Option<CachedItem>)| match kept {
                Some(cached) => {
                    budget.charge(cached.text.len());
                    (true, Ok(cached))
                }
                None => (false, render(item)),
            };
            let work: Vec<(&Item, Option<CachedItem>)> = named.iter().zip(kept).collect();
            let results: Vec<(bool, Result<CachedItem, Box<Diagnostic>>)> = if set.contained {
                work.into_par_iter().map(render_or_keep).collect()
            } else {
                work.into_iter().map(render_or_keep).collect()
            };
            let mut cache = Vec::with_capacity(named.len());
            for (item, (was_reused, result)) in named.into_iter().zip(results) {
                match result {
                    Ok(file) => {
                        if was_reused {
                            out.reused += 1;
                        } else {
                            out.rendered += 1;
                        }
                        out.files.push(set_file(set.kind, &item.name, &file));
                        cache.push((item.name, file));
                    }
                    Err(diagnostic) => diagnostics.push(*diagnostic),
                }
            }
            out.cache.push(SetFiles {
                files: cache,
                names: memo,
                fixed,
                in_use: foldhash::HashSet::default(),
            });
        }
        if diagnostics.is_empty() {
            Ok(out)
        } else {
            Err(diagnostics)
        }
    }
}

/// What [`Renderer::render_changed_items`] made of one set.
struct ChangedItems {
    /// Every item's file, in item order (the cache for the next render).
    files: Vec<(String, CachedItem)>,
    /// The name of every string item seen lately.
    names: foldhash::HashMap<String, String>,
    /// The names of `files`.
    in_use: foldhash::HashSet<String>,
    /// The names of the last render's files that are gone.
    removed: Vec<String>,
    rendered: usize,
    reused: usize,
    /// The files that are new or rendered again.
    new_files: Vec<SetFile>,
}

impl Renderer {
    /// One set's files when its items (strings, named by the item alone) changed
    /// but most stayed: each item's name from the memo or rendered, checked
    /// (the name rules, the fixed names, no two items alike), each file taken
    /// from last time when its item and reads did not change, else rendered by
    /// `render`. Errors as the general path words them.
    #[allow(clippy::too_many_arguments)]
    fn render_changed_items(
        &self,
        set: &SetSpec,
        label: &str,
        context: &Value,
        items: Vec<Value>,
        old: &mut SetFiles,
        fixed: &FileGroup,
        check: &context::ReadCheck<'_>,
        budget: &output::Budget,
        render: &(dyn Fn(&Item) -> Result<CachedItem, Box<Diagnostic>> + Sync),
    ) -> Result<ChangedItems, Vec<Diagnostic>> {
        if let Some(done) = self.render_changed_stretch(
            set, label, context, &items, old, fixed, check, budget, render,
        ) {
            return done;
        }
        let at = |message: String| self.set_error(set, message);
        let mut diagnostics = Vec::new();
        let mut memo = std::mem::take(&mut old.names);
        let mut named: Vec<Item> = Vec::with_capacity(items.len());
        // Each name given so far, with the index in `named` of the item that has it.
        let mut given: foldhash::HashMap<String, usize> = foldhash::HashMap::default();
        given.reserve(items.len());
        for value in items {
            let item = value.as_str().expect("string items");
            let name = match memo.get(item) {
                Some(name) => name.clone(),
                None => match self.item_name(set, label, context, &value) {
                    Ok(name) => {
                        memo.insert(item.to_owned(), name.clone());
                        name
                    }
                    Err(diagnostic) => {
                        diagnostics.push(*diagnostic);
                        continue;
                    }
                },
            };
            if fixed.contains_key(&name) {
                diagnostics.push(at(format!(
                    "{label}: {} and a fixed entry both render {}",
                    describe(&value),
                    set.kind.relative_path(&name)
                )));
                continue;
            }
            if let Some(&first) = given.get(&name) {
                diagnostics.push(at(format!(
                    "{label}: {} and {} both render {}",
                    describe(&value),
                    describe(&named[first].value),
                    set.kind.relative_path(&name)
                )));
                continue;
            }
            given.insert(name.clone(), named.len());
            named.push(Item { value, name });
        }
        let mut last: Vec<Option<(String, CachedItem)>> = std::mem::take(&mut old.files)
            .into_iter()
            .map(Some)
            .collect();
        let mut removed = Vec::new();
        let mut by_name: foldhash::HashMap<&str, usize> = foldhash::HashMap::default();
        by_name.reserve(last.len());
        for (index, file) in last.iter().enumerate() {
            let (name, _) = file.as_ref().expect("all there");
            if given.contains_key(name) {
                by_name.insert(name.as_str(), index);
            } else {
                removed.push(name.clone());
            }
        }
        let found: Vec<Option<usize>> = named
            .iter()
            .map(|item| by_name.get(item.name.as_str()).copied())
            .collect();
        drop(by_name);
        let work: Vec<(Item, Option<CachedItem>)> = named
            .into_iter()
            .zip(found)
            .map(|(item, index)| {
                let kept = index
                    .and_then(|index| last[index].take())
                    .and_then(|(_, cached)| kept_file(set, check, cached, &item.value));
                (item, kept)
            })
            .collect();
        let out = ChangedItems {
            files: Vec::new(),
            names: memo,
            in_use: given.into_keys().collect(),
            removed,
            rendered: 0,
            reused: 0,
            new_files: Vec::new(),
        };
        out.fill(set, budget, render, work, diagnostics)
    }
}

/// A file of the last render kept for `value`: when the set is contained and the
/// item and the file's reads did not change, with this render's item.
fn kept_file(
    set: &SetSpec,
    check: &context::ReadCheck<'_>,
    cached: CachedItem,
    value: &Value,
) -> Option<CachedItem> {
    (set.contained
        && same_item(&cached.item, value)
        && cached.reads.iter().all(|read| check.unchanged(read)))
    .then(|| CachedItem {
        item: value.clone(),
        ..cached
    })
}

impl ChangedItems {
    /// Every item of `work` in order, with its kept file or rendered by `render`
    /// (in parallel when the set allows and more than one must render), into
    /// `files`; `diagnostics` (found before, such as name problems) and the
    /// render errors fail it. The memo forgets items long gone once it holds twice
    /// as many as there are.
    fn fill(
        mut self,
        set: &SetSpec,
        budget: &output::Budget,
        render: &(dyn Fn(&Item) -> Result<CachedItem, Box<Diagnostic>> + Sync),
        mut work: Vec<(Item, Option<CachedItem>)>,
        mut diagnostics: Vec<Diagnostic>,
    ) -> Result<Self, Vec<Diagnostic>> {
        let stale = work.iter().filter(|(_, kept)| kept.is_none()).count();
        let keep_or_render = |(item, kept): &mut (Item, Option<CachedItem>)| match kept.take() {
            Some(cached) => (true, Ok(cached)),
            None => (false, render(item)),
        };
        let results: Vec<(bool, Result<CachedItem, Box<Diagnostic>>)> =
            if set.contained && stale > 1 {
                work.par_iter_mut().map(keep_or_render).collect()
            } else {
                work.iter_mut().map(keep_or_render).collect()
            };
        self.files.reserve(work.len());
        for ((item, _), (was_kept, result)) in work.into_iter().zip(results) {
            match result {
                Ok(file) => {
                    if was_kept {
                        self.reused += 1;
                        budget.charge(file.text.len());
                    } else {
                        self.rendered += 1;
                        self.new_files.push(set_file(set.kind, &item.name, &file));
                    }
                    self.files.push((item.name, file));
                }
                Err(diagnostic) => diagnostics.push(*diagnostic),
            }
        }
        if !diagnostics.is_empty() {
            return Err(diagnostics);
        }
        if self.names.len() > 2 * self.files.len() + 64 {
            let live: std::collections::HashSet<&str> = self
                .files
                .iter()
                .filter_map(|(_, cached)| cached.item.as_str())
                .collect();
            self.names.retain(|item, _| live.contains(item.as_str()));
        }
        Ok(self)
    }
}

impl Renderer {
    /// [`Self::render_changed_items`] when this render's items are the last render's
    /// but for a stretch between the ones both lists start and end with (an item
    /// added at the end, one taken out): the items before and after the stretch keep
    /// their names and, unless their reads changed, their files; only the stretch's
    /// items are named and checked, against the names in use ([`SetFiles::in_use`])
    /// rather than against every name again. `None` when the general walk must
    /// decide: the names in use unknown, a long stretch, or any problem with a name
    /// (the general walk words those).
    #[allow(clippy::too_many_arguments)]
    fn render_changed_stretch(
        &self,
        set: &SetSpec,
        label: &str,
        context: &Value,
        items: &[Value],
        old: &mut SetFiles,
        fixed: &FileGroup,
        check: &context::ReadCheck<'_>,
        budget: &output::Budget,
        render: &(dyn Fn(&Item) -> Result<CachedItem, Box<Diagnostic>> + Sync),
    ) -> Option<Result<ChangedItems, Vec<Diagnostic>>> {
        if old.in_use.len() != old.files.len() || old.files.is_empty() {
            return None;
        }
        let same =
            |(file, item): (&(String, CachedItem), &Value)| file.1.item.as_str() == item.as_str();
        let head = old
            .files
            .iter()
            .zip(items)
            .take_while(|pair| same(*pair))
            .count();
        let room = old.files.len().min(items.len()) - head;
        let tail = old.files[head..]
            .iter()
            .rev()
            .zip(items[head..].iter().rev())
            .take(room)
            .take_while(|pair| same(*pair))
            .count();
        let (gone, new) = (head..old.files.len() - tail, head..items.len() - tail);
        if gone.len() + new.len() > items.len() / 4 + 8 {
            return None;
        }
        // The stretch's names: from the memo or rendered; any problem goes to the
        // general walk.
        let mut named: Vec<Item> = Vec::with_capacity(new.len());
        for value in &items[new.clone()] {
            let item = value.as_str()?;
            let name = match old.names.get(item) {
                Some(name) => name.clone(),
                None => self.item_name(set, label, context, value).ok()?,
            };
            named.push(Item {
                value: value.clone(),
                name,
            });
        }
        let leaving: foldhash::HashSet<&str> = old.files[gone.clone()]
            .iter()
            .map(|(name, _)| name.as_str())
            .collect();
        let mut arriving: foldhash::HashSet<&str> = foldhash::HashSet::default();
        for item in &named {
            let taken = old.in_use.contains(&item.name) && !leaving.contains(item.name.as_str());
            if taken || fixed.contains_key(&item.name) || !arriving.insert(&item.name) {
                return None;
            }
        }
        let arriving: foldhash::HashSet<String> = arriving.into_iter().map(str::to_owned).collect();
        // From here on the stretch replaces what it replaces.
        for item in &named {
            if let Some(text) = item.value.as_str() {
                old.names
                    .entry(text.to_owned())
                    .or_insert_with(|| item.name.clone());
            }
        }
        let mut files = std::mem::take(&mut old.files);
        let after: Vec<(String, CachedItem)> = files.split_off(gone.end);
        let gone_files = files.split_off(gone.start);
        let before = files;
        let mut removed = Vec::new();
        for (name, _) in &gone_files {
            old.in_use.remove(name);
            if !arriving.contains(name) {
                removed.push(name.clone());
            }
        }
        let mut leaving: foldhash::HashMap<String, CachedItem> = gone_files.into_iter().collect();
        old.in_use.extend(arriving);
        // Every item in order: its name, its kept file or `None` to render.
        let mut work: Vec<(Item, Option<CachedItem>)> = Vec::with_capacity(items.len());
        for ((name, cached), value) in before.into_iter().zip(&items[..head]) {
            let kept = kept_file(set, check, cached, value);
            work.push((
                Item {
                    value: value.clone(),
                    name,
                },
                kept,
            ));
        }
        for item in named {
            let kept = leaving
                .remove(&item.name)
                .and_then(|cached| kept_file(set, check, cached, &item.value));
            work.push((item, kept));
        }
        for ((name, cached), value) in after.into_iter().zip(&items[new.end..]) {
            let kept = kept_file(set, check, cached, value);
            work.push((
                Item {
                    value: value.clone(),
                    name,
                },
                kept,
            ));
        }
        let out = ChangedItems {
            files: Vec::new(),
            names: std::mem::take(&mut old.names),
            in_use: std::mem::take(&mut old.in_use),
            removed,
            rendered: 0,
            reused: 0,
            new_files: Vec::new(),
        };
        Some(out.fill(set, budget, render, work, Vec::new()))
    }

    /// An error about a set as a whole or an item's name: at the set's template (its
    /// first line, which the config file's location maps to).
    fn set_error(&self, set: &SetSpec, message: String) -> Diagnostic {
        let entry = &self.inner.entries[set.entry];
        Diagnostic::error(message).at(SourceLocation::new(entry.name.as_ref(), Some(1), None))
    }

    /// The file name `value` renders in `set`, checked against the name rules.
    fn item_name(
        &self,
        set: &SetSpec,
        label: &str,
        context: &Value,
        value: &Value,
    ) -> Result<String, Box<Diagnostic>> {
        let name = self
            .inner
            .env
            .get_template(&set.name_template)
            .and_then(|t| t.render(item_context(context, value)))
            .map_err(|error| {
                Box::new(self.set_error(
                    set,
                    format!(
                        "{label}.name for {}: {}",
                        describe(value),
                        self.runtime_diagnostic(&error).message
                    ),
                ))
            })?;
        if let Some(problem) = crate::config::file_name_problem(&name) {
            return Err(Box::new(self.set_error(
                set,
                format!(
                    "{label}: {} renders the file name {name:?}: {problem}",
                    describe(value)
                ),
            )));
        }
        Ok(name)
    }
}

/// An item's file as the render takes it in.
fn set_file(kind: FileKind, name: &str, file: &CachedItem) -> SetFile {
    (
        RenderedFileRef {
            kind,
            name: name.to_owned(),
        },
        file.text.clone(),
        file.lines.clone(),
    )
}

/// The index of a kind in the per-kind arrays (maps, files, certificates).
fn slot_of(kind: FileKind) -> usize {
    match kind {
        FileKind::Map => 0,
        FileKind::File => 1,
        _ => 2,
    }
}

/// The render context with `item` set.
fn item_context(context: &Value, item: &Value) -> Value {
    minijinja::context! { item => item.clone(), ..context.clone() }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::pure_name;

    fn vars(names: &[&str]) -> HashSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    /// A name template that reads only the item, `extraContext` and fixed functions
    /// keeps its names between renders; one that reads resources, `shared` or has
    /// tags (an include could read anything) renders for every item.
    #[test]
    fn only_names_of_the_item_alone_are_kept() {
        let item = r#"{{ item | replace("/", "_") }}.pem"#;
        assert!(pure_name(item, &vars(&["item"])));
        assert!(pure_name(item, &vars(&["item", "extraContext", "path"])));
        assert!(!pure_name(item, &vars(&["item", "resources"])));
        assert!(!pure_name(item, &vars(&["item", "shared"])));
        assert!(!pure_name("{% include 'x' %}{{ item }}", &vars(&["item"])));
    }
}
