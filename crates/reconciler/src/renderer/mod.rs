//! The template renderer: compiles the user's Jinja templates once per config and
//! renders `haproxy.cfg`, then every map, file and certificate, from the latest
//! resource snapshots.
//!
//! - [`Templates`] is the renderer's input: template sources, `extraContext`, the
//!   Jinja environment settings and the limits.
//! - [`Renderer::new`] names, instruments and compiles every template
//!   ([`construct`]) and runs the static checks ([`check`]); every problem comes back as a [`Diagnostic`] naming the
//!   template (`haproxy.cfg`, a snippet's name, `maps/<name>`, `files/<name>`,
//!   `certs/<name>`), the line and column, and the offending source line.
//! - [`Renderer::render`] renders everything into a [`RenderedConfig`] with its
//!   content hash and [source map](source_map); the same inputs always give the same
//!   bytes.
//! - [`RendererComponent`] runs it on the bus: it keeps the latest [`Resources`]
//!   (lazy template values over the snapshots' stored objects; see [`lazy`]) and
//!   renders for every `ReconciliationStarted`.
//!
//! Jinja2 semantics: minijinja with minijinja-contrib's Python-compatible methods
//! (`replace`, `format`, `split`, `startswith`, `get`, `items`, ...), `None`/`True`/
//! `False` printed as Python prints them, `trimBlocks`/`lstripBlocks` off and a
//! template's final newline dropped (also inside includes) unless configured — as in
//! Jinja2. Every rendered file is then ended with a newline if it lacks one.

mod check;
mod component;
mod construct;
mod context;
pub(crate) use context::{Read, ReadCheck, Recording};
pub mod escape;
mod fragments;
mod functions;
mod lazy;
mod output;
mod pass;
mod scan;
mod sets;
pub mod source_map;
mod words;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use hapwright_eventbus::config::ByteSize;
use hapwright_eventbus::model::{
    Diagnostic, FileKind, HashedMain, LineOrigin, RenderedConfig, RenderedFileRef, SourceLocation,
};
use minijinja::value::Value;
use minijinja::{Environment, ErrorKind, UndefinedBehavior};

pub use component::{QuarantineSettings, RendererComponent};
pub use context::{ResourceStore, Resources};
pub use sets::FileSet;

use scan::{Instrumented, LineIndex};
use source_map::MarkerTable;

/// Jinja environment settings (`templating` in the config file); the defaults are
/// Jinja2's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TemplatingSettings {
    /// Remove the first newline after a block tag (`{% ... %}`).
    pub trim_blocks: bool,
    /// Strip spaces and tabs from the start of a line up to a block tag.
    pub lstrip_blocks: bool,
    /// Make any use of an undefined value an error, not just printing it.
    pub strict_undefined: bool,
}

/// Limits that make a runaway template fail with a clear error instead of hanging
/// the controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderLimits {
    /// Instructions one template render may execute (`None`: unlimited). Each file
    /// (`haproxy.cfg`, each map, file and certificate) has its own budget.
    pub fuel: Option<u64>,
    /// Nesting depth of includes, macro calls and `render_glob`s (an include costs
    /// 10, a macro call 4; capped at 500 by the engine).
    pub recursion_limit: usize,
    /// Bytes one file may render to, and all files of one render together
    /// (`templating.maxOutputBytes`). Checked while the engine writes, so a loop that
    /// would print gigabytes stops at the cap.
    pub max_output_bytes: ByteSize,
}

/// The default of [`RenderLimits::max_output_bytes`]: room for a very large
/// cluster's `haproxy.cfg` (tens of thousands of backends take tens of MiB) plus
/// maps and a few thousand certificates, while a runaway template is stopped long
/// before it fills a controller's memory.
pub const DEFAULT_MAX_OUTPUT_BYTES: ByteSize = ByteSize::mib(128);

impl Default for RenderLimits {
    fn default() -> Self {
        Self {
            fuel: Some(50_000_000),
            recursion_limit: 200,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        }
    }
}

/// Everything the renderer is built from: the template sources by role, plus
/// `extraContext`, settings and limits.
#[derive(Clone, Debug, PartialEq)]
pub struct Templates {
    /// The `haproxy.cfg` template.
    pub main: String,
    /// Snippets by name, for `include` and `render_glob`.
    pub snippets: BTreeMap<String, String>,
    /// Map templates by file name (rendered to `maps/<name>`).
    pub maps: BTreeMap<String, String>,
    /// General file templates by file name (rendered to `files/<name>`).
    pub files: BTreeMap<String, String>,
    /// Certificate templates by file name (rendered to `certs/<name>`).
    pub certificates: BTreeMap<String, String>,
    /// File sets: one map, file or certificate per item of a list ([`sets`]).
    pub sets: Vec<FileSet>,
    /// Any data; templates see it as `extraContext`.
    pub extra_context: serde_json::Value,
    /// Jinja environment settings.
    pub settings: TemplatingSettings,
    /// Fuel and recursion limits.
    pub limits: RenderLimits,
}

impl Default for Templates {
    fn default() -> Self {
        Self {
            main: String::new(),
            snippets: BTreeMap::new(),
            maps: BTreeMap::new(),
            files: BTreeMap::new(),
            certificates: BTreeMap::new(),
            sets: Vec::new(),
            extra_context: serde_json::Value::Object(serde_json::Map::new()),
            settings: TemplatingSettings::default(),
            limits: RenderLimits::default(),
        }
    }
}

impl Templates {
    /// Templates with just a main template.
    pub fn new(main: impl Into<String>) -> Self {
        Self {
            main: main.into(),
            ..Self::default()
        }
    }
}

/// Checks templates the way loading the config does — every template compiles, every
/// `resources.X` is a watched resource, every literal `include`/`render_glob`
/// reference exists, no references form a cycle and every filter and test used
/// exists — without keeping the result.
///
/// # Errors
///
/// Every problem found, each naming the template, line and offending source line.
pub fn check<S: AsRef<str>>(templates: &Templates, watched: &[S]) -> Result<(), Vec<Diagnostic>> {
    Renderer::new(templates.clone(), watched).map(|_| ())
}

/// The template value of one stored object (`object` in status templates).
pub(crate) fn object_value(object: &hapwright_eventbus::model::StoredObject) -> Value {
    context::to_value(object)
}

/// A fresh `shared` memo, for renders outside [`Renderer::render`].
pub(crate) fn shared_value() -> Value {
    Value::from_object(context::Shared::default())
}

// === impl Entry ===

/// One template as compiled: its name, role, original source and instrumentation.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) name: Arc<str>,
    pub(crate) is_snippet: bool,
    /// The rendered file this template produces (none for snippets).
    pub(crate) output: Option<RenderedFileRef>,
    pub(crate) source: String,
    pub(crate) lines: LineIndex,
    pub(crate) instrumented: Instrumented,
}

impl Entry {
    /// Whether this template produces `haproxy.cfg`.
    fn is_main(&self) -> bool {
        self.output
            .as_ref()
            .is_some_and(|file| file.kind == FileKind::Main)
    }

    /// A diagnostic at a byte offset of the original source.
    pub(crate) fn diagnostic_at(&self, message: String, offset: usize) -> Diagnostic {
        let line = self.lines.line(offset);
        let column = self.lines.column(&self.source, offset);
        self.diagnostic(message, Some(line), Some(column))
    }

    fn diagnostic(&self, message: String, line: Option<u32>, column: Option<u32>) -> Diagnostic {
        let mut diagnostic =
            Diagnostic::error(message).at(SourceLocation::new(self.name.as_ref(), line, column));
        if let Some(text) = line.and_then(|line| self.lines.text(&self.source, line)) {
            diagnostic = diagnostic.with_source_line(text);
        }
        diagnostic
    }
}

// === impl Renderer ===

/// One file's render: its text and the origin of each line, or the error.
type RenderResult = Result<RenderedText, Diagnostic>;

/// A rendered file's text and each line's origin (by index into the marker table).
type RenderedText = (FileText, Arc<[Option<u32>]>);

/// A rendered file's text; `haproxy.cfg` comes with its part of the content hash.
#[derive(Clone)]
enum FileText {
    Main(HashedMain),
    Other(Arc<str>),
}

impl FileText {
    fn as_str(&self) -> &str {
        match self {
            Self::Main(main) => main.text(),
            Self::Other(text) => text,
        }
    }
}

/// Compiled templates, ready to render. Cheap to clone; rendering takes `&self` and
/// may run on any thread.
#[derive(Clone)]
pub struct Renderer {
    inner: Arc<Inner>,
}

struct Inner {
    env: Environment<'static>,
    entries: Vec<Entry>,
    by_name: BTreeMap<Arc<str>, usize>,
    markers: MarkerTable,
    /// The origin of every marker, shared by the source maps of all renders.
    origins: Arc<[LineOrigin]>,
    watched: Vec<Arc<str>>,
    extra_context: Value,
    limits: RenderLimits,
    /// Per entry: a map, file or certificate that renders on the pool at the same
    /// time as `haproxy.cfg` ([`check::independent`]).
    independent: Vec<bool>,
    /// Per entry: an output whose last render may be reused when nothing it read
    /// changed ([`check::self_contained`]).
    reusable: Vec<bool>,
    /// Per entry: an output that may be put together again from its last render's
    /// pieces when nothing its own template read changed ([`Renderer::render`]):
    /// a reusable one, or `haproxy.cfg` when it references templates by literal
    /// names only (it renders first, so `shared` starts empty for it; it is then
    /// [`Self::chained`] or reusable).
    spliceable: Vec<bool>,
    /// Per entry: an output that names `shared` and references templates by
    /// literal names only, reused when nothing it read changed and every such file
    /// before it was reused ([`check::chained`]).
    chained: Vec<bool>,
    /// The files of the last render, for reuse by the next.
    cache: Mutex<Option<Cache>>,
    /// The templates with cacheable `include`s rewritten into the fragment filter
    /// ([`fragments`]); `None` when nothing is cached below the file level.
    fragment_env: Option<Environment<'static>>,
    /// Per cacheable snippet: the variables it names and does not set.
    fragment_vars: Arc<BTreeMap<String, Vec<String>>>,
    /// The environment's functions, by name.
    globals: Arc<BTreeMap<String, Value>>,
    /// The loops of files rewritten into calls of the loop filter, by number
    /// ([`fragments::render_loop`]).
    loops: Arc<[fragments::LoopSpec]>,
    /// What the static checks warn about (the templates still load).
    warnings: Vec<Diagnostic>,
    /// The file sets ([`sets`]).
    sets: Vec<sets::SetSpec>,
    /// Per entry: the template of a file set (rendered per item by
    /// [`Renderer::render_sets`], not as a file of its own).
    in_set: Vec<bool>,
}

/// What the last render left for the next one: the resources it rendered from and,
/// per entry, the file it produced with what it read.
struct Cache {
    resources: Resources,
    files: Vec<Option<CachedFile>>,
    /// The snippet outputs used by files that are not kept.
    used: Vec<Arc<fragments::Used>>,
    /// The file sets' files.
    sets: sets::SetCache,
    /// What the folded loops left ([`fragments::FoldMemo`]).
    folds: fragments::Folds,
    /// The digest of each file's content, by the file's allocation
    /// ([`pass::Digests`]).
    digests: pass::Digests,
    /// Its maps, files and certificates and its source map, when it rendered file
    /// sets ([`pass::LastOutput`]).
    last: Option<pass::LastOutput>,
}

/// What one file read from the resources, the cached snippet outputs it used (kept
/// while the file is reused) and, when it printed them directly, its pieces.
#[derive(Default)]
struct FileReads {
    reads: Arc<[Read]>,
    /// Lists of reads noted whole (the iterations of a folded loop), beside
    /// `reads`.
    lists: Arc<[context::ReadLists]>,
    used: Arc<fragments::Used>,
    pieces: Option<Arc<fragments::Pieces>>,
    /// `shared` as the file left it: for `haproxy.cfg`, and for a file after it that
    /// wrote to it ([`check::chained`]).
    shared: Option<Arc<context::SharedValues>>,
}

/// One rendered file kept for reuse.
struct CachedFile {
    text: FileText,
    /// Size of the text, charged to the output budget when the file is reused.
    bytes: usize,
    /// Each line's origin, by index into the marker table.
    lines: Arc<[Option<u32>]>,
    /// What the file read (everything, or, with pieces, what its own template read:
    /// the fragments' reads stay with the fragments), and the rest of its render.
    reads: FileReads,
}

/// What to do with a file of the previous render.
enum Plan {
    /// Render it.
    Render,
    /// Put it together again from its pieces, rendering the changed fragments.
    Splice(Box<CachedFile>, Vec<fragments::PieceChange>),
}

/// How a render went: how many files were rendered and how many reused from the
/// previous render, and why it was a full render if it was one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RenderStats {
    /// Files rendered by the template engine.
    pub rendered: usize,
    /// Files taken unchanged from the previous render because nothing they read
    /// changed.
    pub reused: usize,
    /// Why nothing could be reused (`None`: the render was incremental).
    pub full_reason: Option<FullReason>,
    /// Snippet outputs (`include`s) rendered by the template engine.
    pub snippets_rendered: usize,
    /// Snippet outputs taken from the previous render.
    pub snippets_reused: usize,
    /// Files (among `rendered`) put together from the pieces of their previous
    /// render: their own text as it was, with only the snippet outputs whose reads
    /// changed rendered again.
    pub spliced: usize,
    /// Where the render's time went, in order: the reuse check, the templates, the
    /// files in order, the file sets, and the finish (digests, content hash, cache).
    pub stages: RenderStages,
}

/// Where one render's time went ([`RenderStats::stages`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenderStages {
    /// Deciding which files of the last render are reused.
    pub reuse: std::time::Duration,
    /// Rendering the files that were not.
    pub templates: std::time::Duration,
    /// Taking the files in order into the outputs and the source map.
    pub collect: std::time::Duration,
    /// The file sets (`forEach`).
    pub sets: std::time::Duration,
    /// The digests, the content hash and the cache for the next render.
    pub finish: std::time::Duration,
}

/// Why a render rendered every file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FullReason {
    /// The first render after the templates were loaded (or after a failed render).
    FirstRender,
    /// An incremental render failed; every file was rendered again so the errors are
    /// exactly those of a full render.
    RenderFailed,
    /// Every file was rendered again: each one names `shared`, references a
    /// template by a computed name, or read something that changed.
    EverythingChanged,
}

impl std::fmt::Display for FullReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::FirstRender => "first render",
            Self::RenderFailed => "an incremental render failed",
            Self::EverythingChanged => "every file depends on what changed",
        })
    }
}

impl std::fmt::Debug for Renderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renderer")
            .field(
                "templates",
                &self
                    .inner
                    .entries
                    .iter()
                    .map(|e| &e.name)
                    .collect::<Vec<_>>(),
            )
            .field("watched", &self.inner.watched)
            .finish()
    }
}

impl Renderer {
    /// Instruments and compiles every template once and runs the static checks.
    /// `watched` are the watched resource names (`resources.<name>`).
    ///
    /// # Errors
    ///
    /// Every compile error and static-check failure, each naming the template, line
    /// and column, with the offending source line.
    pub fn new<S: AsRef<str>>(
        templates: Templates,
        watched: &[S],
    ) -> Result<Self, Vec<Diagnostic>> {
        let Templates {
            main,
            snippets,
            maps,
            files,
            certificates,
            sets: file_sets,
            extra_context,
            settings,
            limits,
        } = templates;
        let mut diagnostics = Vec::new();
        let (mut sources, paths) = construct::name_outputs(
            main,
            [
                (FileKind::Map, maps),
                (FileKind::File, files),
                (FileKind::Certificate, certificates),
            ],
        );
        let set_entries = construct::name_sets(&mut sources, file_sets, &mut diagnostics);
        let snippet_names = construct::name_snippets(&mut sources, snippets, &mut diagnostics);
        let (entries, markers, by_name) = construct::instrument(sources);

        // Static checks.
        let watched: Vec<Arc<str>> = watched.iter().map(|w| Arc::from(w.as_ref())).collect();
        let watched_set: BTreeSet<&str> = watched.iter().map(AsRef::as_ref).collect();
        let (found, edges) = check::check(&entries, &watched_set);
        diagnostics.extend(found);

        // Compile.
        let mut env = match build_environment(
            settings,
            limits,
            snippet_names,
            paths,
            OutputSyntax::Haproxy,
        ) {
            Ok(env) => env,
            Err(error) => {
                diagnostics.push(Diagnostic::error(format!(
                    "invalid templating settings: {error}"
                )));
                return Err(diagnostics);
            }
        };
        let (
            found,
            check::Found {
                warnings,
                facts,
                variables,
            },
        ) = check::names_and_facts(&entries, &env);
        diagnostics.extend(found);
        let mut independent = check::independent(&entries, &edges, &facts);
        let mut reusable = check::self_contained(&entries, &edges, &facts);
        let (in_set, set_specs) = construct::compile_sets(
            &mut env,
            set_entries,
            &mut independent,
            &mut reusable,
            &mut diagnostics,
        );
        construct::compile_entries(&mut env, &entries, &mut diagnostics);
        if !diagnostics.is_empty() {
            return Err(diagnostics);
        }

        // What may be cached and reused between renders.
        // The config file's author wrote it: its strings are trusted text.
        let extra_context = functions::trusted_value(&extra_context);
        let globals = construct::globals(&env);
        let (fragment_env, fragment_vars, rewritten, loops) =
            fragment_environment(&env, (&entries, &edges), &facts, &variables, &globals);
        let spliceable = check::spliceable(&entries, &edges, &facts, &reusable, &rewritten);
        let spliceable = construct::outside_sets(spliceable, &in_set);
        let chained = check::chained(&entries, &edges, &facts, &reusable);
        let chained = construct::outside_sets(chained, &in_set);
        Ok(Self {
            inner: Arc::new(Inner {
                env,
                entries,
                by_name,
                origins: markers.origins(),
                markers,
                watched,
                extra_context,
                limits,
                independent,
                reusable,
                spliceable,
                chained,
                cache: Mutex::new(None),
                fragment_env,
                fragment_vars: Arc::new(fragment_vars),
                globals: Arc::new(globals),
                loops: loops.into(),
                warnings,
                sets: set_specs,
                in_set,
            }),
        })
    }

    /// What the static checks warn about: `|trusted` on values that may come from
    /// a watched resource. The templates load and render all the same.
    pub fn warnings(&self) -> &[Diagnostic] {
        &self.inner.warnings
    }

    /// The watched resource names this renderer was built for.
    pub fn watched(&self) -> &[Arc<str>] {
        &self.inner.watched
    }

    /// Renders `haproxy.cfg`, then every map, file and certificate, from `resources`.
    /// One `shared` memo spans the whole render.
    ///
    /// Files whose templates (with everything they include, import or `render_glob`)
    /// never name `shared` and reference templates only by literal names cannot
    /// observe the order files render in, so they render in parallel with
    /// `haproxy.cfg` on the renderer's thread pool (rayon's global pool, one thread per
    /// core). The others render after `haproxy.cfg`, in order, on the same thread as
    /// it. The calling thread waits. The output is the same either way.
    ///
    /// # Errors
    ///
    /// The render errors, each naming the template (or snippet) and line where it
    /// happened and, for errors inside includes, the include chain. When
    /// `haproxy.cfg` fails only its error is reported (the files that depend on it
    /// are not rendered); otherwise every failing file is reported.
    pub fn render(&self, resources: &Resources) -> Result<RenderedConfig, Vec<Diagnostic>> {
        self.render_with_stats(resources).0
    }

    /// [`Renderer::render`], incrementally: a file whose templates are
    /// [self-contained](check::self_contained) is taken unchanged from the previous
    /// render when every resource read it made then (`list()`, `fetch(keys...)`,
    /// `get(keys...)`, iterating or measuring a store) gives the same objects now.
    /// The output is byte for byte that of a full render; when an incremental render
    /// fails, everything is rendered again so the errors are too. Also says how many
    /// files were rendered and reused.
    pub fn render_with_stats(
        &self,
        resources: &Resources,
    ) -> (Result<RenderedConfig, Vec<Diagnostic>>, RenderStats) {
        let previous = self
            .inner
            .cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        let had_previous = previous.is_some();
        let (result, mut stats, cache) = self.render_once(resources, previous, true);
        let (result, stats, cache) = match result {
            Err(_) if stats.reused > 0 || self.inner.fragment_env.is_some() => {
                let (result, mut full, cache) = self.render_once(resources, None, false);
                full.full_reason = Some(FullReason::RenderFailed);
                (result, full, cache)
            }
            result => {
                if stats.reused == 0 && stats.snippets_reused == 0 {
                    stats.full_reason = Some(if had_previous {
                        FullReason::EverythingChanged
                    } else {
                        FullReason::FirstRender
                    });
                }
                (result, stats, cache)
            }
        };
        *self
            .inner
            .cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = cache;
        (result, stats)
    }

    /// [`Renderer::render`] without reusing anything and without remembering the
    /// result for the next incremental render: what an incremental render must
    /// equal, byte for byte.
    pub fn render_full(&self, resources: &Resources) -> Result<RenderedConfig, Vec<Diagnostic>> {
        self.render_once(resources, None, false).0
    }

    /// For each template, whether it renders in parallel with the others (see
    /// [`Renderer::render`]).
    #[cfg(test)]
    pub(crate) fn independent(&self) -> &[bool] {
        &self.inner.independent
    }

    /// Turns a render error into a diagnostic at the innermost template line, with the
    /// include chain.
    fn runtime_diagnostic(&self, error: &minijinja::Error) -> Diagnostic {
        let inner = &*self.inner;
        let mut chain: Vec<&minijinja::Error> = vec![error];
        let mut current: &(dyn std::error::Error + 'static) = error;
        while let Some(source) = current.source() {
            match source.downcast_ref::<minijinja::Error>() {
                Some(next) => {
                    chain.push(next);
                    current = next;
                }
                None => break,
            }
        }
        let innermost = chain
            .iter()
            .rev()
            .find(|e| e.name().is_some() && e.line().is_some() && e.kind() != ErrorKind::BadInclude)
            .or_else(|| chain.iter().rev().find(|e| e.name().is_some()))
            .copied()
            .unwrap_or(error);
        let mut message = self.message(innermost);
        let outer: Vec<String> = chain
            .iter()
            .rev()
            .filter(|e| !std::ptr::eq(**e, innermost) && e.kind() == ErrorKind::BadInclude)
            .filter_map(|e| Some(format!("{}:{}", e.name()?, e.line()?)))
            .collect();
        if !outer.is_empty() {
            message.push_str(&format!(
                " (included from {})",
                outer.join(", included from ")
            ));
        }
        let entry = innermost
            .name()
            .and_then(|name| inner.by_name.get(name))
            .map(|index| &inner.entries[*index]);
        let line = innermost.line().and_then(|l| u32::try_from(l).ok());
        match entry {
            Some(entry) => {
                let column = innermost.range().map(|range| {
                    let offset = entry.instrumented.original_offset(range.start);
                    entry.lines.column(&entry.source, offset)
                });
                entry.diagnostic(message, line, column)
            }
            None => {
                let mut diagnostic = Diagnostic::error(message);
                if let Some(name) = innermost.name() {
                    diagnostic = diagnostic.at(SourceLocation::new(name, line, None));
                }
                diagnostic
            }
        }
    }

    /// The error of a render stopped by `templating.maxOutputBytes`: at the template
    /// line that wrote last, naming the file being rendered, the cap and how to raise
    /// it.
    fn output_cap_diagnostic(
        &self,
        file: &Entry,
        exceeded: &output::Exceeded,
        budget: &output::Budget,
    ) -> Diagnostic {
        let cap = budget.cap();
        let what = match exceeded.scope {
            output::Scope::File => format!(
                "the output of {} grew past templating.maxOutputBytes ({cap})",
                file.name
            ),
            output::Scope::Total => format!(
                "all rendered files together grew past templating.maxOutputBytes ({cap}) \
                 while {} was rendering",
                file.name
            ),
        };
        let message = format!(
            "{what}: a loop or value produces far more output than expected \
             (raise templating.maxOutputBytes if the config really is that large)"
        );
        self.at_origin(file, exceeded.origin.as_ref(), message)
    }

    /// `message` located at the template line `origin` names, or at `file` when it
    /// names none.
    fn at_origin(&self, file: &Entry, origin: Option<&LineOrigin>, message: String) -> Diagnostic {
        let inner = &*self.inner;
        let at = origin.and_then(|origin| {
            let entry = &inner.entries[*inner.by_name.get(&origin.template)?];
            Some((entry, origin.line))
        });
        match at {
            Some((entry, line)) => entry.diagnostic(message, Some(line), None),
            None => file.diagnostic(message, None, None),
        }
    }

    /// A value refused where it landed: located at the template line that printed
    /// it, with the rendered file and line it would have landed on.
    fn refused_diagnostic(&self, file: &Entry, refused: &output::RefusedValue) -> Diagnostic {
        let message = format!(
            "{} (it would have landed on {} line {})",
            refused.refusal, file.name, refused.line
        );
        self.at_origin(file, refused.origin.as_ref(), message)
    }

    fn message(&self, error: &minijinja::Error) -> String {
        let detail = error.detail().map(strip_markers);
        match error.kind() {
            ErrorKind::OutOfFuel => format!(
                "template ran out of fuel after {} instructions: a loop or recursion does too much work \
                 (raise templating.fuel if the config really is that large)",
                self.inner.limits.fuel.unwrap_or_default()
            ),
            ErrorKind::UndefinedError => match detail {
                Some(detail) => format!("undefined value: {detail}"),
                None => "undefined value (strictUndefined is on: every value used must exist)"
                    .to_owned(),
            },
            ErrorKind::InvalidOperation
                if detail.as_deref().is_some_and(|d| d.starts_with("fail(): ")) =>
            {
                detail.unwrap_or_default()
            }
            kind => match detail {
                Some(detail) if detail.contains("recursion limit") => format!(
                    "{detail}: includes, macros or render_glob nest deeper than templating.recursionLimit ({})",
                    self.inner.limits.recursion_limit
                ),
                Some(detail) => format!("{kind}: {detail}"),
                None => kind.to_string(),
            },
        }
    }
}

/// The fragment environment (`None`: nothing is cached below the file level), the
/// variables of each cacheable snippet, the templates whose `include`s were
/// rewritten, and the loops rewritten.
type FragmentEnvironment = (
    Option<Environment<'static>>,
    BTreeMap<String, Vec<String>>,
    BTreeSet<Arc<str>>,
    Vec<fragments::LoopSpec>,
);

/// The environment for incremental renders: a copy of `env` whose templates print
/// every cacheable snippet through the fragment cache ([`fragments`]), with the
/// variables each cacheable snippet names and does not set and the templates
/// whose `include`s were rewritten. `None` when no template
/// includes a cacheable snippet, or when any template names `debug` (which prints the
/// whole context, the cache included).
fn fragment_environment(
    env: &Environment<'static>,
    (entries, edges): (&[Entry], &check::Edges<'_>),
    facts: &[Option<check::Facts>],
    variables: &[check::Variables],
    globals: &BTreeMap<String, Value>,
) -> FragmentEnvironment {
    let none = || (None, BTreeMap::new(), BTreeSet::new(), Vec::new());
    if facts.iter().any(|f| f.is_none_or(|f| f.names_debug)) {
        return none();
    }
    let mut vars: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // Snippets that name `shared` (or leave names set) but reference templates by
    // literal names only: the variables they name and do not set, and the names
    // they set, for loops that fold over them ([`fragments::render_fold`]).
    let mut folding: BTreeMap<String, (Vec<String>, BTreeSet<String>)> = BTreeMap::new();
    for (index, entry) in entries.iter().enumerate() {
        if !entry.is_snippet {
            continue;
        }
        let Some(reach) = check::reach(entries, edges, index) else {
            continue;
        };
        if !reach
            .iter()
            .all(|&i| facts[i].is_some_and(|f| !f.computed_reference))
        {
            continue;
        }
        let mut names = BTreeSet::new();
        for &i in &reach {
            match env.get_template(&entries[i].name) {
                Ok(template) => names.extend(template.undeclared_variables(false)),
                Err(_) => return none(),
            }
        }
        let assigned: BTreeSet<&String> =
            reach.iter().flat_map(|&i| &variables[i].assigned).collect();
        let reads_shared = reach
            .iter()
            .any(|&i| facts[i].is_some_and(|f| f.reads_shared));
        // An `include` leaves the names the snippet assigns set in the including
        // template; the cache cannot, so only a snippet whose assigned names no other
        // template uses, and that it does not read before assigning, is cached.
        let leaks = assigned.iter().any(|name| {
            names.contains(*name)
                || variables
                    .iter()
                    .enumerate()
                    .any(|(i, v)| !reach.contains(&i) && v.named.contains(*name))
        });
        if reads_shared || leaks {
            folding.insert(
                entry.name.to_string(),
                (
                    names.into_iter().collect(),
                    assigned.into_iter().cloned().collect(),
                ),
            );
            continue;
        }
        vars.insert(entry.name.to_string(), names.into_iter().collect());
    }
    // A loop folds over a snippet that names nothing but the loop variable,
    // `resources`, `extraContext`, `shared` and the renderer's functions, and sets
    // none of those: each iteration then depends only on its item, its reads and
    // `shared` as the iterations before it left it.
    let foldable = |snippet: &str, var: &str| -> Option<Arc<[String]>> {
        let (names, assigned) = folding.get(snippet)?;
        let fixed =
            |name: &str| name == var || matches!(name, "resources" | "extraContext" | "shared");
        let named_ok = names
            .iter()
            .all(|name| fixed(name) || (name != "loop" && globals.contains_key(name)));
        let sets_ok = !assigned
            .iter()
            .any(|name| fixed(name) || name == fragments::SESSION_VAR);
        (named_ok && sets_ok).then(|| names.clone().into())
    };
    let mut fragment_env = env.clone();
    fragment_env.add_filter(scan::FRAGMENT_FILTER, fragments::fragment);
    fragment_env.add_filter(scan::LOOP_FILTER, fragments::render_loop);
    fragment_env.add_filter(scan::LOOP_PROBE_FILTER, |_: Value| {
        Value::from_safe_string(LOOP_PROBE.to_owned())
    });
    let mut rewritten = BTreeSet::new();
    let mut loops = Vec::new();
    for entry in entries {
        let cacheable = |name: &str| vars.contains_key(name);
        let mut source = Cow::Borrowed(entry.instrumented.source.as_str());
        if entry.output.is_some() {
            // Loops whose snippet does not name `loop` (the rewritten loop has none).
            let loopable = |name: &str| {
                vars.get(name)
                    .is_some_and(|v| !v.iter().any(|v| v == "loop"))
            };
            let candidate = |name: &str| loopable(name) || folding.contains_key(name);
            let sites: Vec<(usize, scan::LoopSite)> = scan::find_loops(&source, &candidate)
                .into_iter()
                .filter_map(|site| {
                    let fold = if loopable(&site.snippet) {
                        None
                    } else {
                        Some(foldable(&site.snippet, &site.var)?)
                    };
                    let spec = loop_spec(&fragment_env, &site, fold)?;
                    loops.push(spec);
                    Some((loops.len() - 1, site))
                })
                .collect();
            if !sites.is_empty() {
                let sites: Vec<(usize, &scan::LoopSite)> =
                    sites.iter().map(|(number, site)| (*number, site)).collect();
                source = Cow::Owned(scan::rewrite_loops(&source, &sites));
            }
        }
        let loops_rewritten = matches!(source, Cow::Owned(_));
        let source = match scan::rewrite_includes(&source, &cacheable) {
            Some(rewritten) => rewritten,
            None if loops_rewritten => source.into_owned(),
            None => continue,
        };
        let source = scan::trust_literals(&source).unwrap_or(source);
        if fragment_env
            .add_template_owned(entry.name.to_string(), source)
            .is_err()
        {
            return none();
        }
        rewritten.insert(entry.name.clone());
    }
    if !rewritten.is_empty() {
        (Some(fragment_env), vars, rewritten, loops)
    } else {
        none()
    }
}

/// What the loop probe filter prints ([`scan::LoopSite::probe`]).
const LOOP_PROBE: &str = "\u{FFFE}hapwright-loop-probe\u{FFFE}";

/// A loop's spec: its probe rendered once tells the text each iteration prints
/// before and after the snippet's output. `None` when the probe does not render
/// to exactly that.
fn loop_spec(
    env: &Environment<'static>,
    site: &scan::LoopSite,
    fold: Option<Arc<[String]>>,
) -> Option<fragments::LoopSpec> {
    let probe = env.render_str(&site.probe, ()).ok()?;
    let (head, tail) = probe.split_once(LOOP_PROBE)?;
    if tail.contains(LOOP_PROBE) {
        return None;
    }
    Some(fragments::LoopSpec {
        var: site.var.clone(),
        iter: site.iter.clone(),
        snippet: site.snippet.clone(),
        head: Arc::from(head),
        tail: Arc::from(tail),
        fold,
    })
}

/// Removes source-map markers from text that ends up in a message.
fn strip_markers(text: &str) -> String {
    text.chars()
        .filter(|c| !('\u{FDD0}'..='\u{FDEF}').contains(c))
        .collect()
}

/// What an environment's templates render: HAProxy files, where untrusted values
/// are escaped for where they land ([`escape`]), or plain text (status documents,
/// serialized by their own code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OutputSyntax {
    Haproxy,
    Plain,
}

pub(crate) fn build_environment(
    settings: TemplatingSettings,
    limits: RenderLimits,
    snippets: Vec<String>,
    paths: BTreeMap<String, Vec<String>>,
    output: OutputSyntax,
) -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(settings.trim_blocks)
            .lstrip_blocks(settings.lstrip_blocks)
            .build()?,
    );
    env.set_undefined_behavior(if settings.strict_undefined {
        UndefinedBehavior::Strict
    } else {
        UndefinedBehavior::Lenient
    });
    env.set_auto_escape_callback(move |_| match output {
        // Captured output (macros, `{% set %}` blocks) is then trusted text whose
        // untrusted values are already marked ([`escape`]).
        OutputSyntax::Haproxy => minijinja::AutoEscape::Custom(escape::AUTO_ESCAPE.into()),
        OutputSyntax::Plain => minijinja::AutoEscape::None,
    });
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_fuel(limits.fuel);
    env.set_recursion_limit(limits.recursion_limit);
    env.set_debug(true);
    functions::register(&mut env, Arc::new(snippets), Arc::new(paths), output);
    Ok(env)
}

/// A compile error, located in the original source. The original (uninstrumented)
/// source is compiled again for the most precise message; if it compiles, the
/// instrumented error is reported.
fn compile_diagnostic(
    env: &Environment<'static>,
    entry: &Entry,
    error: &minijinja::Error,
) -> Diagnostic {
    let mut scratch = Environment::new();
    scratch.set_syntax(env.syntax().clone());
    let original = scratch
        .add_template_owned(entry.name.to_string(), entry.source.clone())
        .err();
    let (error, offsets_are_original) = match &original {
        Some(original) => (original, true),
        None => (error, false),
    };
    let detail = error.detail().map(strip_markers);
    let message = match detail {
        Some(detail) => format!("{}: {detail}", error.kind()),
        None => error.kind().to_string(),
    };
    let line = error.line().and_then(|l| u32::try_from(l).ok());
    let column = error.range().map(|range| {
        let offset = if offsets_are_original {
            range.start
        } else {
            entry.instrumented.original_offset(range.start)
        };
        entry.lines.column(&entry.source, offset)
    });
    entry.diagnostic(message, line, column)
}
