//! One render, step by step ([`Renderer::render_once`]): take the previous render's
//! cache apart, build the context, decide per file whether it is reused, put
//! together again from its pieces or rendered, render (in parallel where a file
//! may), collect the files in order, render the file sets, and keep what the next
//! render may reuse.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use hapwright_eventbus::model::{
    Diagnostic, DigestResume, FileDigest, FileGroup, FileKind, HashedMain, RenderedConfig,
    RenderedFileRef, SourceMap,
};
use minijinja::Environment;
use minijinja::value::Value;

use super::context::{self, Recording, Resources};
use super::{
    Cache, CachedFile, Entry, FileReads, FileText, Inner, Plan, RenderResult, RenderStats,
    Renderer, escape, fragments, output, sets,
};

impl Renderer {
    /// One render, reusing files of `previous` whose reads did not change; returns
    /// the cache for the next render (none after a failure).
    pub(super) fn render_once(
        &self,
        resources: &Resources,
        previous: Option<Cache>,
        incremental: bool,
    ) -> (
        Result<RenderedConfig, Vec<Diagnostic>>,
        RenderStats,
        Option<Cache>,
    ) {
        let mut clock = std::time::Instant::now();
        let mut lap = || {
            let now = std::time::Instant::now();
            std::mem::replace(&mut clock, now).elapsed()
        };
        let previous = previous.map(Cache::take_apart).unwrap_or_default();
        let mut pass = Pass::new(self, resources, previous.fragments, incremental);
        let mut stats = RenderStats {
            reused: pass.reuse(previous.files, resources),
            ..RenderStats::default()
        };
        stats.stages.reuse = lap();
        pass.render_all();
        stats.stages.templates = lap();
        stats.spliced = pass.spliced.load(Ordering::Relaxed);
        let mut collected = pass.collect(&mut stats);
        stats.rendered -= stats.reused.min(stats.rendered);
        stats.stages.collect = lap();
        let set_cache = if collected.main.is_some() && !self.inner.sets.is_empty() {
            pass.render_sets(
                resources,
                previous.sets,
                previous.last,
                &mut collected,
                &mut stats,
            )
        } else {
            Vec::new()
        };
        stats.stages.sets = lap();
        if !collected.diagnostics.is_empty() {
            return (Err(collected.diagnostics), stats, None);
        }
        let (config, cache) = pass.finish(
            resources,
            collected,
            set_cache,
            previous.digests,
            &mut stats,
        );
        stats.stages.finish = lap();
        (Ok(config), stats, Some(cache))
    }
}

// === impl Cache ===

/// The previous render's cache, taken apart for the next render.
#[derive(Default)]
struct Previous {
    /// The resources it rendered from, and its files.
    files: Option<(Resources, Vec<Option<CachedFile>>)>,
    /// Its snippet outputs and pieces, for the fragment session.
    fragments: Option<fragments::Previous>,
    /// The resources it rendered from, and the file sets' files.
    sets: Option<(Resources, sets::SetCache)>,
    /// The digests of its files.
    digests: Digests,
    /// Its files and source map, when it rendered file sets.
    last: Option<LastOutput>,
}

/// A render's maps, files and certificates and its source map, shared with the
/// render, and the names of the files of each kind that no set made: a set whose
/// files are mostly last time's hands on only its new and changed files and the
/// names of the gone ones, and the next render's files of that kind are these,
/// updated ([`sets::Rendered::from_last`]).
pub(super) struct LastOutput {
    groups: [FileGroup; 3],
    source_map: Arc<SourceMap>,
    fixed: [Vec<String>; 3],
}

/// The digest of each file of a render, by kind and name, with the render's groups
/// they are of: the next render's digests are these, updated for the files its
/// groups do not share with these ([`imbl::OrdMap::diff`]), so a render that adds
/// or renews one of 10,000 certificates hashes one file and looks up none
/// ([`RenderedConfig::from_digested_groups`]).
#[derive(Default)]
pub(super) struct Digests {
    groups: [FileGroup; 3],
    digests: [imbl::OrdMap<String, FileDigest>; 3],
    /// For each large file (a map of thousands of lines), the states its next
    /// version's digest resumes from ([`FileDigest::of_resumable`]).
    resume: HashMap<(usize, String), DigestResume>,
    /// The render itself: a render that reused every file (by pointer) and the
    /// source map is this one, hash included, without hashing 10,000 entries again.
    config: Option<RenderedConfig>,
}

impl Digests {
    /// The digests of a render's maps, files and certificates (`haproxy.cfg` is
    /// hashed as it renders): `previous`'s for the files its groups share with
    /// `groups` or whose content did not change, else computed (on the thread pool
    /// when there are megabytes to hash, as in a first render).
    fn of(groups: &[FileGroup; 3], previous: Digests) -> Self {
        use imbl::ordmap::DiffItem;
        use rayon::prelude::*;
        /// Below this many bytes to hash, the files are hashed on this thread: the
        /// pool may be busy releasing the last render's values.
        const PARALLEL_BYTES: usize = 4 << 20;
        let Digests {
            groups: old_groups,
            mut digests,
            mut resume,
            ..
        } = previous;
        let mut missing: Vec<(usize, &String, &Arc<str>)> = Vec::new();
        for (slot, (old, new)) in old_groups.iter().zip(groups).enumerate() {
            for item in old.diff(new) {
                match item {
                    DiffItem::Add(name, content)
                    | DiffItem::Update {
                        new: (name, content),
                        ..
                    } => missing.push((slot, name, content)),
                    DiffItem::Remove(name, _) => {
                        digests[slot].remove(name);
                        resume.remove(&(slot, name.clone()));
                    }
                }
            }
        }
        let bytes: usize = missing.iter().map(|(_, _, content)| content.len()).sum();
        let digest = |(slot, name, content): &(usize, &String, &Arc<str>)| {
            let key = (*slot, (*name).clone());
            let (digest, next) = FileDigest::of_resumable(content, resume.get(&key));
            (key, digest, next)
        };
        let computed: Vec<_> = if bytes < PARALLEL_BYTES {
            missing.iter().map(digest).collect()
        } else {
            missing.par_iter().map(digest).collect()
        };
        for ((slot, name), digest, next) in computed {
            match next {
                Some(next) => resume.insert((slot, name.clone()), next),
                None => resume.remove(&(slot, name.clone())),
            };
            digests[slot].insert(name, digest);
        }
        Self {
            groups: groups.clone(),
            digests,
            resume,
            config: None,
        }
    }
}

impl Cache {
    fn take_apart(self) -> Previous {
        let Cache {
            resources,
            files,
            mut used,
            sets,
            folds,
            digests,
            last,
        } = self;
        used.extend(files.iter().flatten().map(|file| file.reads.used.clone()));
        let pieces = files
            .iter()
            .flatten()
            .filter_map(|file| file.reads.pieces.clone())
            .collect();
        let fragments = fragments::Previous {
            resources: resources.clone(),
            used,
            pieces,
            folds,
        };
        Previous {
            digests,
            last,
            sets: Some((resources.clone(), sets)),
            files: Some((resources, files)),
            fragments: Some(fragments),
        }
    }
}

// === impl Collected ===

/// The files of one render in entry order, as they came out.
struct Collected {
    main: Option<HashedMain>,
    /// Maps, files and certificates by name.
    outputs: [FileGroup; 3],
    source_map: SourceMap,
    diagnostics: Vec<Diagnostic>,
    /// Per entry: the file kept for the next render.
    cached: Vec<Option<CachedFile>>,
    /// The snippet outputs used by files that are not kept.
    uncached_used: Vec<Arc<fragments::Used>>,
    /// The names of the maps, files and certificates no set made, once the sets
    /// rendered.
    fixed: Option<[Vec<String>; 3]>,
    /// The last render's source map, when it is this render's too (then
    /// `source_map` is empty).
    shared_source_map: Option<Arc<SourceMap>>,
}

impl Collected {
    /// For each kind whose set's files are `last`'s but for a few (`from_last`):
    /// its files are `last`'s without the gone ones, with this render's fixed files
    /// of the kind replacing theirs (the set's new and changed files are added
    /// after).
    fn start_from(
        &mut self,
        last: &LastOutput,
        from_last: &[Option<Vec<String>>; 3],
        sets: &[sets::SetSpec],
    ) {
        for (slot, gone) in from_last.iter().enumerate() {
            if let Some(gone) = gone {
                // A persistent map: the copy shares `last`'s, and the changes below
                // copy the few nodes they touch.
                let mut group = last.groups[slot].clone();
                for name in gone {
                    group.remove(name);
                }
                group.extend(std::mem::take(&mut self.outputs[slot]));
                self.outputs[slot] = group;
            }
        }
        if !Self::every_set_from_last(from_last, sets) {
            // Some set renamed its files: the kinds from `last` take their files'
            // lines from it one by one (its other files may be gone).
            for (slot, gone) in from_last.iter().enumerate() {
                let Some(gone) = gone else {
                    continue;
                };
                let kind = KINDS[slot];
                for name in last.groups[slot].keys() {
                    if last.fixed[slot].binary_search(name).is_ok() || gone.contains(name) {
                        continue;
                    }
                    let file = RenderedFileRef {
                        kind,
                        name: name.clone(),
                    };
                    if let Some(lines) = last.source_map.lines(&file) {
                        self.source_map.insert_indexed(file, lines.clone());
                    }
                }
            }
        }
    }

    /// Whether every kind a set makes comes from `last`: the render has `last`'s
    /// files but for the gone ones and the new ones.
    fn every_set_from_last(from_last: &[Option<Vec<String>>; 3], sets: &[sets::SetSpec]) -> bool {
        sets.iter().all(|set| from_last[slot(set.kind)].is_some())
    }

    /// Once the files of every set are in: when every kind a set makes comes from
    /// `last`, the source map is `last`'s, shared when no file came or went and no
    /// file's lines changed (a renewed certificate has the lines of the one it
    /// replaces), else a copy without the gone files and with this render's lines
    /// taken in.
    fn source_map_from(
        &mut self,
        last: &LastOutput,
        from_last: &[Option<Vec<String>>; 3],
        sets: &[sets::SetSpec],
    ) {
        if !Self::every_set_from_last(from_last, sets) {
            return;
        }
        let own = std::mem::take(&mut self.source_map);
        let none_gone = from_last.iter().flatten().all(Vec::is_empty);
        if none_gone && last.source_map.covers(&own) {
            self.shared_source_map = Some(Arc::clone(&last.source_map));
            return;
        }
        let mut map = (*last.source_map).clone();
        for (slot, gone) in from_last.iter().enumerate() {
            let kind = KINDS[slot];
            for name in gone.iter().flatten() {
                map.remove(&RenderedFileRef {
                    kind,
                    name: name.clone(),
                });
            }
        }
        map.absorb(own);
        self.source_map = map;
    }

    /// Takes a rendered file into the config and the source map.
    fn add(&mut self, file: &RenderedFileRef, text: FileText, lines: Arc<[Option<u32>]>) {
        self.source_map.insert_indexed(file.clone(), lines);
        match (text, file.kind) {
            (FileText::Main(hashed), _) => self.main = Some(hashed),
            (FileText::Other(text), kind) => {
                drop(self.outputs[slot(kind)].insert(file.name.clone(), text));
            }
        }
    }
}

// === impl Pass ===

/// A file's new text and line origins, as the allocations of the last render's
/// when they are the same (`before`).
fn as_before(
    (text, lines): super::RenderedText,
    before: Option<super::RenderedText>,
) -> super::RenderedText {
    let Some((old_text, old_lines)) = before else {
        return (text, lines);
    };
    let text = if old_text.as_str() == text.as_str() {
        old_text
    } else {
        text
    };
    let lines = if old_lines == lines { old_lines } else { lines };
    (text, lines)
}

/// One render in progress: its context, what to do per file, and the results as
/// they come in. Files render on several threads ([`Renderer::render`]), each
/// taking its plan and setting its result and reads once.
struct Pass<'a> {
    renderer: &'a Renderer,
    inner: &'a Inner,
    env: &'a Environment<'static>,
    context: Value,
    /// The fragment session of an incremental render with cacheable `include`s.
    session: Option<Value>,
    /// The `shared` memo of the context.
    shared: Value,
    budget: output::Budget,
    plans: Vec<Mutex<Plan>>,
    results: Vec<OnceLock<RenderResult>>,
    reads: Vec<OnceLock<FileReads>>,
    /// The last render's text and line origins of each file that renders again: a
    /// file that renders to the same text is handed out as the same allocation
    /// ([`Pass::collect`]), so what compares renders by pointer (digests, the
    /// validator, the deployment plan) sees it unchanged.
    before: Vec<Option<super::RenderedText>>,
    /// How many files were put together again from their pieces.
    spliced: AtomicUsize,
}

impl<'a> Pass<'a> {
    fn new(
        renderer: &'a Renderer,
        resources: &Resources,
        previous_fragments: Option<fragments::Previous>,
        incremental: bool,
    ) -> Self {
        let inner = &*renderer.inner;
        let resources_value = resources.context_value(&inner.watched);
        let mut context = BTreeMap::from([
            ("resources", resources_value.clone()),
            ("extraContext", inner.extra_context.clone()),
            ("shared", Value::from_object(context::Shared::default())),
        ]);
        let env = match (&inner.fragment_env, incremental) {
            (Some(fragment_env), true) => fragment_env,
            _ => &inner.env,
        };
        let session = (incremental && inner.fragment_env.is_some()).then(|| {
            Value::from_object(fragments::Session::new(
                previous_fragments,
                resources.clone(),
                resources_value,
                inner.extra_context.clone(),
                inner.fragment_vars.clone(),
                inner.globals.clone(),
                (inner.loops.clone(), inner.limits.max_output_bytes.bytes()),
            ))
        });
        if let Some(session) = &session {
            context.insert(fragments::SESSION_VAR, session.clone());
        }
        let shared = context.get("shared").cloned().unwrap_or_default();
        let each = || inner.entries.iter();
        Self {
            renderer,
            inner,
            env,
            context: Value::from(context),
            session,
            shared,
            budget: output::Budget::new(inner.limits.max_output_bytes),
            plans: each().map(|_| Mutex::new(Plan::Render)).collect(),
            results: each().map(|_| OnceLock::new()).collect(),
            reads: each().map(|_| OnceLock::new()).collect(),
            before: each().map(|_| None).collect(),
            spliced: AtomicUsize::new(0),
        }
    }

    fn shared(&self) -> &context::Shared {
        self.shared
            .downcast_object_ref::<context::Shared>()
            .expect("shared is a Shared")
    }

    /// Takes files of the previous render whose reads give the same answers now
    /// as they are, and plans to put together again from their pieces those whose
    /// own template's reads do. Returns how many files were taken as they are.
    fn reuse(
        &mut self,
        previous: Option<(Resources, Vec<Option<CachedFile>>)>,
        resources: &Resources,
    ) -> usize {
        let Some((old, files)) = previous else {
            return 0;
        };
        let inner = self.inner;
        let check = context::ReadCheck::new(&old, resources);
        let mut reused = Vec::new();
        // While every file that renders one after the other (naming `shared`) so far
        // is taken or put together again, `shared` holds what it held last time.
        let mut chain = true;
        for (index, file) in files.into_iter().enumerate() {
            let in_order = inner.entries[index].output.is_some()
                && !inner.independent[index]
                && !inner.in_set[index];
            let Some(file) = file else {
                chain &= !in_order;
                continue;
            };
            let reusable = inner.reusable[index] || (inner.chained[index] && chain);
            let unchanged = || {
                file.reads.reads.iter().all(|read| check.unchanged(read))
                    && file.reads.lists.iter().all(|lists| {
                        lists
                            .iter()
                            .all(|reads| reads.iter().all(|read| check.unchanged(read)))
                    })
            };
            if !reusable || !unchanged() {
                chain &= !in_order;
                self.before[index] = Some((file.text, file.lines));
                continue;
            }
            // The pieces whose snippet outputs or lists read something that changed.
            let changed = file
                .reads
                .pieces
                .as_ref()
                .map_or_else(Vec::new, |pieces| pieces.changes(&check));
            let splice = !changed.is_empty();
            if splice && !(inner.spliceable[index] && self.session.is_some()) {
                chain &= !in_order;
                self.before[index] = Some((file.text, file.lines));
                continue;
            }
            if let Some(left) = &file.reads.shared {
                self.shared().restore(left);
            }
            if splice {
                *self.plans[index]
                    .get_mut()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Plan::Splice(Box::new(file), changed);
            } else {
                reused.push((index, file));
            }
        }
        let count = reused.len();
        for (index, file) in reused {
            self.budget.charge(file.bytes);
            let _ = self.results[index].set(Ok((file.text, file.lines)));
            let _ = self.reads[index].set(file.reads);
        }
        count
    }

    /// Renders every file that was not reused. The scope runs on the pool, so the
    /// pool's threads (one per core) do all the work and the calling thread only
    /// waits: `haproxy.cfg` and the files after it on one of them, the independent
    /// files on the others as they free up.
    fn render_all(&self) {
        let inner = self.inner;
        let span = tracing::Span::current();
        rayon::scope(|scope| {
            for (index, _) in inner.independent.iter().enumerate().filter(|(_, p)| **p) {
                if self.results[index].get().is_some() {
                    continue;
                }
                let span = &span;
                scope.spawn(move |_| span.in_scope(|| self.render_one(index)));
            }
            span.in_scope(|| {
                for (index, entry) in inner.entries.iter().enumerate() {
                    if entry.output.is_none() || inner.independent[index] || inner.in_set[index] {
                        continue;
                    }
                    self.render_one(index);
                    if entry.is_main() && self.results[index].get().is_some_and(Result::is_err) {
                        break;
                    }
                }
            });
        });
    }

    /// Renders one file, once. Everything per file happens here, in parallel where
    /// the file renders in parallel: marker stripping (while the engine writes), the
    /// shared copy of the text and, for `haproxy.cfg` (the largest file), its part of
    /// the content hash, while the other files may still be rendering.
    fn render_one(&self, index: usize) {
        if self.results[index].get().is_some() {
            return;
        }
        let entry = &self.inner.entries[index];
        let plan = std::mem::replace(
            &mut *self.plans[index]
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
            Plan::Render,
        );
        let escaping = entry.output.as_ref().map_or(escape::Escaping::Raw, |file| {
            escape::Escaping::for_kind(file.kind)
        });
        let mut out = output::Output::new(
            &self.inner.markers,
            &self.budget,
            entry.source.len(),
            escaping,
        );
        let (rendered, file_reads) = match (plan, &self.session) {
            (Plan::Splice(file, changed), Some(session)) => {
                self.splice(*file, &changed, session, &mut out)
            }
            _ => self.render_template(index, entry, &mut out),
        };
        let _ = self.reads[index].set(file_reads);
        self.finish_file(index, entry, rendered, out);
    }

    /// Puts a file together again from its previous render's pieces, rendering only
    /// the snippet outputs and loops whose reads changed.
    fn splice(
        &self,
        file: CachedFile,
        changed: &[fragments::PieceChange],
        session_value: &Value,
        out: &mut output::Output<'_>,
    ) -> (Result<(), minijinja::Error>, FileReads) {
        let session = session_value
            .downcast_object_ref::<fragments::Session>()
            .expect("the session is a Session");
        let pieces = file
            .reads
            .pieces
            .as_deref()
            .expect("a spliced file has pieces");
        let used = fragments::UsedFragments::start();
        self.spliced.fetch_add(1, Ordering::Relaxed);
        let earlier = (file.text.as_str(), &*file.lines);
        let spliced = session.splice(self.env, session_value, (pieces, changed), earlier, out);
        let used = used.finish();
        let (rendered, pieces) = match spliced {
            Ok(pieces) => (Ok(()), Some(Arc::new(pieces))),
            Err(error) => (Err(error), None),
        };
        let reads = FileReads {
            used: Arc::new(used),
            pieces,
            ..file.reads
        };
        (rendered, reads)
    }

    /// Renders a file's template, recording what it reads.
    fn render_template(
        &self,
        index: usize,
        entry: &Entry,
        out: &mut output::Output<'_>,
    ) -> (Result<(), minijinja::Error>, FileReads) {
        let recording = Recording::start();
        let writes = self.shared().writes();
        let used = fragments::UsedFragments::start();
        // Only a file that may be spliced keeps its own text apart.
        let track = (self.session.is_some() && self.inner.spliceable[index])
            .then(fragments::FileTrack::start);
        if track.is_some() {
            out.track();
        }
        let rendered = self
            .env
            .get_template(&entry.name)
            .and_then(|template| template.render_captured_to(&self.context, &mut *out))
            .map(drop);
        let end = out.mark();
        let pieces = match track.map(|track| track.finish(end)) {
            Some(fragments::Tracked::Pieces(pieces)) if !pieces.fragments.is_empty() => {
                Some(Arc::new(pieces))
            }
            Some(fragments::Tracked::NotDirect(used)) => {
                // The fragments' reads are the file's own.
                for fragment in used {
                    context::record_all(fragment.reads());
                }
                None
            }
            Some(fragments::Tracked::Pieces(_)) | None => None,
        };
        let used = used.finish();
        let shared = (self.inner.chained[index]
            && (entry.is_main() || self.shared().writes() != writes))
            .then(|| Arc::new(self.shared().snapshot()));
        let (reads, lists) = recording.finish_apart();
        let reads = FileReads {
            reads: reads.into(),
            lists: lists.into(),
            used: Arc::new(used),
            pieces,
            shared,
        };
        (rendered, reads)
    }

    /// Sets a file's result: its text with its line origins, or the diagnostic of
    /// what went wrong (the output cap, a refused value or a template error).
    fn finish_file(
        &self,
        index: usize,
        entry: &Entry,
        rendered: Result<(), minijinja::Error>,
        out: output::Output<'_>,
    ) {
        let renderer = self.renderer;
        let result = match (rendered, out.exceeded()) {
            (_, Some(exceeded)) => {
                Err(renderer.output_cap_diagnostic(entry, exceeded, &self.budget))
            }
            (_, None) if out.refused().is_some() => {
                Err(renderer.refused_diagnostic(entry, out.refused().expect("checked")))
            }
            (Err(error), None) => Err(renderer.runtime_diagnostic(&error)),
            (Ok(()), None) => {
                let stripped = out.finish();
                let text = if entry.is_main() {
                    FileText::Main(HashedMain::new(stripped.text))
                } else {
                    FileText::Other(Arc::from(stripped.text))
                };
                Ok((text, Arc::from(stripped.lines)))
            }
        };
        // Each index is rendered once.
        let _ = self.results[index].set(result);
    }

    /// Takes the files in entry order into the outputs and the source map, and
    /// keeps those the next render may reuse or splice. Stops at a failed
    /// `haproxy.cfg`.
    fn collect(&mut self, stats: &mut RenderStats) -> Collected {
        let inner = self.inner;
        let mut collected = Collected {
            main: None,
            outputs: Default::default(),
            source_map: SourceMap::with_origins(inner.origins.clone()),
            diagnostics: Vec::new(),
            cached: Vec::new(),
            uncached_used: Vec::new(),
            fixed: None,
            shared_source_map: None,
        };
        let mut cached: Vec<Option<CachedFile>> = inner.entries.iter().map(|_| None).collect();
        let results = std::mem::take(&mut self.results);
        let reads = std::mem::take(&mut self.reads);
        let before = std::mem::take(&mut self.before);
        for (((((entry, result), reads), cached), (&reusable, &chained)), before) in inner
            .entries
            .iter()
            .zip(results)
            .zip(reads)
            .zip(&mut cached)
            .zip(inner.reusable.iter().zip(&inner.chained))
            .zip(before)
        {
            let (Some(file), Some(result)) = (&entry.output, result.into_inner()) else {
                continue;
            };
            let (text, lines) = match result {
                Ok(rendered) => as_before(rendered, before),
                Err(diagnostic) => {
                    collected.diagnostics.push(diagnostic);
                    if file.kind == FileKind::Main {
                        break;
                    }
                    continue;
                }
            };
            stats.rendered += 1;
            // Only a file that may be reused or spliced is kept (its line origins
            // shared with the source map): a spliceable file is reusable or chained.
            let reads = reads.into_inner().unwrap_or_default();
            let keep = reusable || chained;
            if !keep {
                collected.uncached_used.push(reads.used.clone());
            }
            *cached = keep.then(|| CachedFile {
                bytes: match &text {
                    // Set by `finish`, from the finished config.
                    FileText::Main(_) => 0,
                    FileText::Other(text) => text.len(),
                },
                text: text.clone(),
                lines: lines.clone(),
                reads,
            });
            collected.add(file, text, lines);
        }
        collected.cached = cached;
        collected
    }

    /// Renders the file sets (after `haproxy.cfg`, seeing the other files' names)
    /// into `collected`; returns their cache. A kind whose set kept every name
    /// starts from `last`'s files of that kind.
    fn render_sets(
        &self,
        resources: &Resources,
        previous: Option<(Resources, sets::SetCache)>,
        last: Option<LastOutput>,
        collected: &mut Collected,
        stats: &mut RenderStats,
    ) -> sets::SetCache {
        let fixed: [Vec<String>; 3] =
            std::array::from_fn(|slot| collected.outputs[slot].keys().cloned().collect());
        let last = last.filter(|last| last.fixed == fixed);
        let [maps, files, certificates] = &collected.outputs;
        let rendered = self.renderer.render_sets(
            &self.context,
            &self.budget,
            resources,
            previous,
            [maps, files, certificates],
            last.is_some(),
        );
        collected.fixed = Some(fixed);
        match rendered {
            Ok(rendered) => {
                stats.rendered += rendered.rendered;
                stats.reused += rendered.reused;
                let last = last.filter(|_| rendered.from_last.iter().any(Option::is_some));
                if let Some(last) = &last {
                    collected.start_from(last, &rendered.from_last, &self.inner.sets);
                }
                for (file, text, lines) in rendered.files {
                    collected.outputs[slot(file.kind)].insert(file.name.clone(), text);
                    collected.source_map.insert_indexed(file, lines);
                }
                if let Some(last) = &last {
                    collected.source_map_from(last, &rendered.from_last, &self.inner.sets);
                }
                rendered.cache
            }
            Err(found) => {
                collected.diagnostics.extend(found);
                Vec::new()
            }
        }
    }

    /// The rendered config, and the cache the next render reuses from.
    fn finish(
        self,
        resources: &Resources,
        collected: Collected,
        set_cache: sets::SetCache,
        previous_digests: Digests,
        stats: &mut RenderStats,
    ) -> (RenderedConfig, Cache) {
        let Collected {
            main,
            outputs: [maps, files, certificates],
            source_map,
            mut cached,
            uncached_used,
            fixed,
            shared_source_map,
            ..
        } = collected;
        // Each file's digest: taken from the last render for a file it shares,
        // computed for the others; kept for the next render.
        let groups = [maps, files, certificates];
        // `haproxy.cfg` and the source map the last render's (by pointer) and every
        // other file the same: the render is the last one (an update no template
        // reads, such as a Secret no Ingress names yet), hash included.
        let same = previous_digests
            .config
            .as_ref()
            .filter(|last| {
                main.as_ref()
                    .is_some_and(|main| std::ptr::eq(main.text(), &**last.main()))
                    && shared_source_map
                        .as_ref()
                        .is_some_and(|map| Arc::ptr_eq(map, last.source_map_shared()))
                    && groups
                        .iter()
                        .zip(last.groups())
                        .all(|(group, was)| group.ptr_eq(was) || group.diff(was).next().is_none())
            })
            .cloned();
        let mut digests = Digests::of(&groups, previous_digests);
        let config = same.unwrap_or_else(|| {
            RenderedConfig::from_digested_groups(
                main.unwrap_or_else(|| HashedMain::new("")),
                groups,
                &digests.digests,
                shared_source_map.unwrap_or_else(|| Arc::new(source_map)),
            )
        });
        digests.config = Some(config.clone());
        let last = fixed.map(|fixed| LastOutput {
            groups: config.groups().map(FileGroup::clone),
            source_map: Arc::clone(config.source_map_shared()),
            fixed,
        });
        for (entry, cached) in self.inner.entries.iter().zip(&mut cached) {
            if let (true, Some(cached)) = (entry.is_main(), cached) {
                cached.bytes = config.main().len();
            }
        }
        let mut folds = fragments::Folds::new();
        if let Some(session) = self
            .session
            .as_ref()
            .and_then(|s| s.downcast_object_ref::<fragments::Session>())
        {
            (stats.snippets_rendered, stats.snippets_reused) = session.counts();
            folds = session.take_folds();
        }
        let cache = Cache {
            resources: resources.clone(),
            files: cached,
            used: uncached_used,
            sets: set_cache,
            folds,
            digests,
            last,
        };
        // The session holds the previous render's snippet outputs and the maps over
        // them: thousands of shared values to release. The render is done without
        // waiting for that; the release thread lets them go.
        release_later(Box::new((self.session, self.context)));
        (config, cache)
    }
}

/// Values to drop, sent to the release thread.
type Leftovers = Box<dyn Send>;

/// Drops `leftovers` (what a render leaves behind: its session, its context and the
/// resource versions only they still hold, tens of thousands of values at 10,000
/// objects) on a thread below the pipeline's priority (nice
/// [`RELEASE_NICE`]): on a machine with two cores the release would otherwise take
/// CPU from the next render, the validation and the deployment of the change that
/// follows, which wait for it. When nothing else runs, the thread gets the CPU all
/// the same. Without the thread (it could not start), the thread pool drops them.
fn release_later(leftovers: Leftovers) {
    static RELEASE: OnceLock<Option<std::sync::mpsc::Sender<Leftovers>>> = OnceLock::new();
    let sender = RELEASE.get_or_init(|| {
        let (sender, queue) = std::sync::mpsc::channel::<Leftovers>();
        std::thread::Builder::new()
            .name("hapwright-release".to_owned())
            .spawn(move || {
                hapwright_eventbus::kernel::lower_thread_priority(RELEASE_NICE);
                while let Ok(leftovers) = queue.recv() {
                    drop(leftovers);
                }
            })
            .map_err(|error| tracing::warn!(%error, "Cannot start the release thread"))
            .ok()
            .map(|_| sender)
    });
    let unsent = match sender {
        Some(sender) => sender.send(leftovers).err().map(|failed| failed.0),
        None => Some(leftovers),
    };
    if let Some(leftovers) = unsent {
        rayon::spawn(move || drop(leftovers));
    }
}

/// How much nicer than the rest of the controller the release thread is.
const RELEASE_NICE: i32 = 10;

/// The kinds of [`Collected::outputs`], by index.
const KINDS: [FileKind; 3] = [FileKind::Map, FileKind::File, FileKind::Certificate];

/// The index of a map, file or certificate in [`Collected::outputs`].
fn slot(kind: FileKind) -> usize {
    match kind {
        FileKind::Map => 0,
        FileKind::File => 1,
        _ => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tells `dropped` on which thread it was dropped.
    struct Watched(std::sync::mpsc::Sender<Option<String>>);

    impl Drop for Watched {
        fn drop(&mut self) {
            let _ = self
                .0
                .send(std::thread::current().name().map(str::to_owned));
        }
    }

    #[test]
    fn a_renders_leftovers_are_dropped_on_the_release_thread() {
        let (dropped, on) = std::sync::mpsc::channel();
        for _ in 0..3 {
            release_later(Box::new(Watched(dropped.clone())));
        }
        for _ in 0..3 {
            let thread = on
                .recv_timeout(std::time::Duration::from_secs(30))
                .expect("the leftovers are dropped");
            assert_eq!(thread.as_deref(), Some("hapwright-release"));
        }
    }
}
