//! The fragment cache: the output of an `include`d snippet, kept from one render to
//! the next with what it read, so a file that must render again (say `haproxy.cfg`,
//! which lists every service) reuses the snippet output of every loop iteration
//! whose object and reads did not change.
//!
//! A snippet is cached when it and every template it reaches name neither `shared`
//! nor `debug` and reference templates by literal names only; its `include` tags are
//! rewritten at load ([`super::scan::rewrite_includes`]) into a call of the
//! `__fragment` filter. The snippet's output can then depend only on the templates
//! and `extraContext` (fixed for the renderer's life), on the resources it reads
//! (recorded, as for files) and on the variables it names but does not set
//! (`undeclared_variables` of every template it reaches). Those variables are the
//! cache key: numbers, strings, booleans and `none` by value, resource objects by
//! identity (an object's lazy document is kept while its object is unchanged), the
//! renderer's functions as themselves. When a variable holds anything else (a list
//! the template built, a macro, `loop`) the snippet renders without the cache.
//!
//! On a miss the snippet renders on its own with exactly those variables, which
//! gives the bytes (source-map markers included) that including it gives.
//!
//! A file goes one step further when every snippet output it used went straight
//! into it ([`track_use`]): it keeps its own text with the place of each output
//! ([`Pieces`]). When nothing its own template read changed, the template would
//! write the same text and ask for the same snippet outputs again, so the next
//! render skips the template and puts the file together from the pieces, rendering
//! again only the snippet outputs whose reads changed ([`Session::splice`]). The
//! cost of a one-object change is then that object's snippets plus copying the
//! file, not a loop over every object.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use minijinja::value::{Object, Value, ValueKind};
use minijinja::{Error, State};

use super::context::{
    Read, ReadCheck, ReadLists, Recording, Resources, Shared, SharedValues, record_all,
    record_each, record_lists,
};
use super::lazy;
use super::output::Output;
use super::source_map::Mark;

/// The context variable holding the render's [`Session`].
pub(crate) const SESSION_VAR: &str = "__fragments";

/// One part of a fragment's key: a variable's value as far as output goes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Part {
    /// Not defined.
    Missing,
    /// A number, string, boolean or `none`, in a form that tells kinds apart.
    Plain(String),
    /// A resource object or list, by identity: a document and a node inside it, or
    /// a list (node 0).
    Object(usize, u32),
    /// One of the renderer's functions.
    Global,
}

/// A fragment's key: the snippet and its variables. Shared, so the lists of
/// fragments a file used (one entry per loop iteration) copy it cheaply.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key(Arc<KeyParts>);

#[derive(Debug, PartialEq, Eq, Hash)]
struct KeyParts {
    snippet: Arc<str>,
    parts: Vec<Part>,
}

/// A cached snippet output.
#[derive(Debug)]
pub(crate) struct Fragment {
    /// The output, markers included.
    text: Value,
    reads: Arc<[Read]>,
    /// The value of each variable the snippet names (in the order of the session's
    /// `vars`), to render it again with the same context. Also keeps the values
    /// keyed by identity alive, so the identities stay unique.
    values: Box<[Var]>,
}

/// A variable of a snippet's context.
#[derive(Debug, Clone)]
enum Var {
    /// Not defined, or one of the renderer's functions (a global of every render).
    Absent,
    /// The render's own `resources` or `extraContext` (a later render gives its own).
    Render,
    Value(Value),
}

impl Fragment {
    /// The output, markers included.
    pub(crate) fn text(&self) -> &str {
        self.text.as_str().unwrap_or_default()
    }

    /// Whether everything the snippet read gives the same answers over `new` as over
    /// `old`.
    pub(crate) fn unchanged(&self, old: &Resources, new: &Resources) -> bool {
        self.reads.iter().all(|read| read.unchanged(old, new))
    }

    /// [`Self::unchanged`] through a check shared by many fragments.
    pub(crate) fn unchanged_in(&self, check: &ReadCheck<'_>) -> bool {
        self.reads.iter().all(|read| check.unchanged(read))
    }

    /// What the snippet read.
    pub(crate) fn reads(&self) -> &[Read] {
        &self.reads
    }
}

/// Fragments by key.
#[derive(Debug, Default)]
pub(crate) struct Fragments {
    map: foldhash::HashMap<Key, Arc<Fragment>>,
}

impl Fragments {
    /// The fragments files used and printed, by key (the first one of a key wins;
    /// all of a key are the same output).
    fn from_used(previous: &Previous) -> Self {
        let mut map = foldhash::HashMap::default();
        for (key, fragment) in previous.used.iter().flat_map(|used| used.iter()) {
            map.entry(key.clone()).or_insert_with(|| fragment.clone());
        }
        for piece in previous.pieces.iter().flat_map(|p| p.fragments.iter()) {
            match &piece.items {
                None => {
                    map.entry(piece.key.clone())
                        .or_insert_with(|| piece.fragment.clone());
                }
                Some(items) => {
                    for item in &items.items {
                        map.entry(item.key.clone())
                            .or_insert_with(|| item.fragment.clone());
                    }
                }
            }
        }
        Self { map }
    }
}

/// What the previous render leaves for the fragment cache: the resources it rendered
/// from, the fragments its files used and the pieces of the files kept in pieces.
#[derive(Debug)]
pub(crate) struct Previous {
    pub(crate) resources: Resources,
    pub(crate) used: Vec<Arc<Used>>,
    pub(crate) pieces: Vec<Arc<Pieces>>,
    /// What each folded loop left, by loop number ([`render_fold`]).
    pub(crate) folds: Folds,
}

/// The folded loops' memos, by loop number.
pub(crate) type Folds = BTreeMap<usize, Arc<FoldMemo>>;

/// What a folded loop ([`render_fold`]) left for the next render: for each
/// iteration its item, what it read and where its text ends, and `shared` at the
/// start, after every `every`th iteration and at the end.
#[derive(Debug)]
pub(crate) struct FoldMemo {
    /// `shared` when the loop started.
    start: SharedValues,
    /// Persistent, like `reads` and `ends`: the next render keeps the iterations
    /// before the first that runs again without copying them.
    items: imbl::Vector<Value>,
    reads: ReadLists,
    /// Where each iteration's text ends in `text`.
    ends: imbl::Vector<usize>,
    /// The loop's text, as the file got it (shared, not copied, with the file).
    text: Value,
    /// How many iterations apart the checkpoints are.
    every: usize,
    /// `checkpoints[c]`: `shared` after the first `(c + 1) * every` iterations.
    checkpoints: Vec<SharedValues>,
    /// `shared` after the last iteration: objects added at the end of the list (a
    /// new object, oldest first) run only their own iterations.
    end: SharedValues,
}

/// Iterations between two kept states of `shared` in a folded loop: at least 32,
/// and no more than about 128 states per loop, so that memory stays bounded at
/// tens of thousands of objects while a change near the end runs at most `every`
/// iterations again.
fn fold_checkpoint_every(items: usize) -> usize {
    (items / 128).max(32)
}

/// A file's output in pieces: the text the file's own template wrote (markers
/// included) and, at positions in it, the fragments it printed there. When nothing
/// the file's own template read changed, it would write the same text and print the
/// same fragments again, so the file is the same pieces with changed fragments
/// rendered again (see [`track_use`] for why that holds).
#[derive(Debug)]
pub(crate) struct Pieces {
    /// The file's own text, markers included, fragments left out.
    pub(crate) own: Arc<str>,
    /// Each fragment printed, after `own[..at]`, in order.
    pub(crate) fragments: Vec<Piece>,
    /// Where the file's output was when its template finished.
    pub(crate) end: Mark,
}

/// One fragment printed directly into a file.
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    /// Where in [`Pieces::own`] it was printed.
    pub(crate) at: usize,
    pub(crate) key: Key,
    pub(crate) fragment: Arc<Fragment>,
    /// Where the file's output was before and after the fragment.
    pub(crate) before: Mark,
    pub(crate) after: Mark,
    /// For a rewritten loop ([`render_loop`]): its items, which later renders
    /// splice. `fragment` is then the loop's output until the template printed it
    /// (its reads are the list's and every item's), and afterwards an empty text
    /// with the list's reads: the file keeps its text, the items their outputs.
    pub(crate) items: Option<Arc<Items>>,
}

/// The output of a rewritten loop, item by item: for each object of the list, in
/// order, the loop's text before the snippet output, the output, and its text after.
#[derive(Debug)]
pub(crate) struct Items {
    /// The loop's number ([`Session`]'s `loops`).
    number: usize,
    /// What evaluating the list read.
    list_reads: Arc<[Read]>,
    /// The values of the snippet's other variables (in the order of the session's
    /// `vars`; the loop variable's place is [`Var::Absent`]).
    scope: Box<[Var]>,
    items: Vec<Item>,
    /// Where the file's output was before each item and after the last one (empty
    /// when not known).
    marks: Vec<Mark>,
    /// The loop's text before and after each snippet output.
    head: Arc<str>,
    tail: Arc<str>,
}

impl Items {
    /// The length of each item's text.
    fn lengths(&self) -> Vec<usize> {
        let around = self.head.len() + self.tail.len();
        self.items
            .iter()
            .map(|item| around + item.fragment.text().len())
            .collect()
    }
}

/// A loop of a file's own template rewritten into a call of [`render_loop`]
/// ([`super::scan::LoopSite`]).
#[derive(Debug)]
pub(crate) struct LoopSpec {
    /// The loop variable.
    pub(crate) var: String,
    /// The iterable, as written (it names only `resources`).
    pub(crate) iter: String,
    /// The snippet included for each item.
    pub(crate) snippet: String,
    /// The loop's text before and after each snippet output.
    pub(crate) head: Arc<str>,
    pub(crate) tail: Arc<str>,
    /// For a loop whose snippet names `shared` ([`render_fold`]): the variables the
    /// snippet names and does not set (the loop variable, `resources`,
    /// `extraContext`, `shared` and the renderer's functions only).
    pub(crate) fold: Option<Arc<[String]>>,
}

impl LoopSpec {
    /// The list the loop goes over, with `resources` as given, and what evaluating
    /// it read.
    fn list(
        &self,
        env: &minijinja::Environment<'_>,
        resources: &Value,
    ) -> (Result<Value, Error>, Arc<[Read]>) {
        let recording = Recording::start();
        let list = env.compile_expression(&self.iter).and_then(|expression| {
            expression.eval(minijinja::context! { resources => resources.clone() })
        });
        (list, recording.finish().into())
    }
}

/// One item of a loop: its snippet output.
#[derive(Debug, Clone)]
struct Item {
    key: Key,
    fragment: Arc<Fragment>,
}

/// What changed in a piece since the previous render.
#[derive(Debug, Default)]
pub(crate) struct PieceChange {
    /// The piece's index.
    pub(crate) piece: usize,
    /// For a loop: whether what the list read changed, and the items whose
    /// snippet outputs read something that changed (in order).
    list: bool,
    items: Vec<usize>,
}

impl Pieces {
    /// The pieces that read something that changed, in order.
    pub(crate) fn changes(&self, check: &ReadCheck<'_>) -> Vec<PieceChange> {
        let mut changes = Vec::new();
        for (index, piece) in self.fragments.iter().enumerate() {
            match &piece.items {
                None => {
                    if !piece.fragment.unchanged_in(check) {
                        changes.push(PieceChange {
                            piece: index,
                            ..PieceChange::default()
                        });
                    }
                }
                Some(items) => {
                    let list = !items.list_reads.iter().all(|read| check.unchanged(read));
                    let changed: Vec<usize> = items
                        .items
                        .iter()
                        .enumerate()
                        .filter(|(_, item)| !item.fragment.unchanged_in(check))
                        .map(|(index, _)| index)
                        .collect();
                    if list || !changed.is_empty() {
                        changes.push(PieceChange {
                            piece: index,
                            list,
                            items: changed,
                        });
                    }
                }
            }
        }
        changes
    }
}

/// What is tracked while a file renders on this thread: the fragments its own
/// template prints, and whether each went straight into the output.
struct Track {
    /// How many snippet renders deep the current `__fragment` call is (0: called by
    /// the file's own template).
    depth: u32,
    /// The fragment returned last by a call at depth 0, not yet seen in the output:
    /// where its text is in memory, and how long it is.
    pending: Option<(usize, usize, Piece)>,
    /// Every fragment printed so far went straight into the output.
    direct: bool,
    own: String,
    printed: Vec<Piece>,
    /// Every fragment returned at depth 0, printed directly or not.
    used: Vec<Arc<Fragment>>,
}

thread_local! {
    static TRACK: RefCell<Option<Track>> = const { RefCell::new(None) };
}

/// Tracks the fragments a file prints while it renders on this thread (the file's
/// own template runs on one thread from start to end).
pub(crate) struct FileTrack {
    outer: Option<Track>,
}

/// How a file's fragments went: its pieces when every fragment went straight into
/// the output, else the fragments used (whose reads are then the file's too).
pub(crate) enum Tracked {
    Pieces(Pieces),
    NotDirect(Vec<Arc<Fragment>>),
}

impl FileTrack {
    pub(crate) fn start() -> Self {
        let track = Track {
            depth: 0,
            pending: None,
            direct: true,
            own: String::new(),
            printed: Vec::new(),
            used: Vec::new(),
        };
        Self {
            outer: TRACK.with(|t| t.borrow_mut().replace(track)),
        }
    }

    /// How the file's fragments went; `end`: where the file's output is now.
    pub(crate) fn finish(mut self, end: Mark) -> Tracked {
        let outer = self.outer.take();
        let track = TRACK.with(|t| std::mem::replace(&mut *t.borrow_mut(), outer));
        match track {
            Some(track) if track.direct && track.pending.is_none() => Tracked::Pieces(Pieces {
                own: Arc::from(track.own),
                fragments: track.printed,
                end,
            }),
            Some(track) => Tracked::NotDirect(track.used),
            None => Tracked::NotDirect(Vec::new()),
        }
    }
}

impl Drop for FileTrack {
    fn drop(&mut self) {
        if let Some(outer) = self.outer.take() {
            TRACK.with(|t| *t.borrow_mut() = Some(outer));
        }
    }
}

/// Whether the current `__fragment` call comes from the file's own template (the
/// file is tracked and no snippet is rendering).
fn at_top() -> bool {
    TRACK.with(|t| t.borrow().as_ref().is_some_and(|t| t.depth == 0))
}

/// Enters (`+1`) or leaves (`-1`) a snippet render.
fn nest(step: i32) {
    TRACK.with(|t| {
        if let Some(track) = t.borrow_mut().as_mut() {
            track.depth = track.depth.saturating_add_signed(step);
        }
    });
}

/// Notes a fragment returned to the file's own template. It counts as printed
/// directly only when the very next write to the file's output is its text, at the
/// same address: a fragment captured (`{% set %}` block, macro, `{% filter %}`) is
/// written into a capture buffer instead, and whatever is written later comes from
/// another string. A fragment printed directly cannot have influenced anything the
/// template did, so when the template's own reads are unchanged it would print the
/// same fragments (same keys) at the same places again. Empty or inline-stored
/// (short) texts have no address of their own and are never taken as direct.
fn track_use(key: &Key, fragment: &Arc<Fragment>, items: Option<Items>) {
    TRACK.with(|t| {
        let mut t = t.borrow_mut();
        let Some(track) = t.as_mut() else { return };
        track.used.push(fragment.clone());
        if track.pending.is_some() {
            track.direct = false;
        }
        let text = fragment.text();
        if text.is_empty() {
            track.direct = false;
            track.pending = None;
            return;
        }
        track.pending = Some((
            text.as_ptr() as usize,
            text.len(),
            Piece {
                at: 0,
                key: key.clone(),
                fragment: fragment.clone(),
                before: Mark::default(),
                after: Mark::default(),
                items: items.map(Arc::new),
            },
        ));
    });
}

/// How a piece written to a tracked file's output went ([`track_write`]).
pub(crate) enum Direct {
    /// Part of the file's own text.
    Own,
    /// A snippet output printed directly.
    Fragment,
    /// A loop printed directly, made of items of these lengths.
    Loop(Vec<usize>),
}

/// Called by the file's output for every piece written, while a file is tracked:
/// whether the piece is a fragment or a loop printed directly (the output then tells
/// where it went, [`track_marks`], and where each item of a loop went,
/// [`track_item_marks`]).
pub(crate) fn track_write(piece: &str) -> Direct {
    TRACK.with(|t| {
        let mut t = t.borrow_mut();
        let Some(track) = t.as_mut() else {
            return Direct::Own;
        };
        if let Some((address, len, mut printed)) = track.pending.take() {
            if address == piece.as_ptr() as usize && len == piece.len() {
                printed.at = track.own.len();
                let direct = match &printed.items {
                    None => Direct::Fragment,
                    Some(items) => {
                        // Printed: the loop's whole text is not kept twice.
                        printed.fragment = Arc::new(Fragment {
                            text: Value::from(""),
                            reads: items.list_reads.clone(),
                            values: Box::new([]),
                        });
                        Direct::Loop(items.lengths())
                    }
                };
                track.printed.push(printed);
                return direct;
            }
            track.direct = false;
        }
        track.own.push_str(piece);
        Direct::Own
    })
}

/// Where each item of the loop just printed went: `marks` before each item and
/// after the last.
pub(crate) fn track_item_marks(marks: Vec<Mark>) {
    TRACK.with(|t| {
        if let Some(items) = t
            .borrow_mut()
            .as_mut()
            .and_then(|track| track.printed.last_mut())
            .and_then(|printed| printed.items.as_mut())
            .and_then(Arc::get_mut)
        {
            items.marks = marks;
        }
    });
}

/// Where the file's output was before and after the fragment just printed.
pub(crate) fn track_marks(before: Mark, after: Mark) {
    TRACK.with(|t| {
        if let Some(printed) = t
            .borrow_mut()
            .as_mut()
            .and_then(|track| track.printed.last_mut())
        {
            printed.before = before;
            printed.after = after;
        }
    });
}

/// The fragments one file used, in the order used.
pub(crate) type Used = Vec<(Key, Arc<Fragment>)>;

thread_local! {
    /// The fragments used by the file rendering on this thread.
    static USED: RefCell<Option<Used>> = const { RefCell::new(None) };
}

/// Collects the fragments a file uses while it renders on this thread (see
/// [`super::context::Recording`], which works the same way for reads).
pub(crate) struct UsedFragments {
    outer: Option<Used>,
}

impl UsedFragments {
    pub(crate) fn start() -> Self {
        Self {
            outer: USED.with(|used| used.borrow_mut().replace(Vec::new())),
        }
    }

    pub(crate) fn finish(mut self) -> Used {
        let outer = self.outer.take();
        USED.with(|used| std::mem::replace(&mut *used.borrow_mut(), outer))
            .unwrap_or_default()
    }
}

impl Drop for UsedFragments {
    fn drop(&mut self) {
        if let Some(outer) = self.outer.take() {
            USED.with(|used| *used.borrow_mut() = Some(outer));
        }
    }
}

fn note_used(key: &Key, fragment: &Arc<Fragment>) {
    USED.with(|used| {
        if let Some(used) = used.borrow_mut().as_mut() {
            used.push((key.clone(), fragment.clone()));
        }
    });
}

/// What the `__fragment` filter needs during one render.
#[derive(Debug)]
pub(crate) struct Session {
    /// What the previous render left.
    previous: Option<Previous>,
    /// The previous render's fragments by key, built when first asked for (a render
    /// that only reuses and splices files never asks).
    previous_map: std::sync::OnceLock<Fragments>,
    /// Fragments used in this render (the next render's `previous`).
    current: Mutex<Fragments>,
    resources: Resources,
    resources_value: Value,
    extra_context: Value,
    /// Per cacheable snippet: the variables it names and does not set.
    vars: Arc<BTreeMap<String, Vec<String>>>,
    /// The renderer's functions, by name.
    globals: Arc<BTreeMap<String, Value>>,
    /// The names of the cacheable snippets, to share in their keys.
    snippet_names: BTreeMap<String, Arc<str>>,
    /// Snippet outputs rendered and reused.
    rendered: AtomicUsize,
    reused: AtomicUsize,
    /// The rewritten loops, by number.
    loops: Arc<[LoopSpec]>,
    /// `templating.maxOutputBytes`.
    cap: u64,
    /// What the folded loops of this render left.
    folds: Mutex<Folds>,
}

impl Object for Session {}

impl Session {
    pub(crate) fn new(
        previous: Option<Previous>,
        resources: Resources,
        resources_value: Value,
        extra_context: Value,
        vars: Arc<BTreeMap<String, Vec<String>>>,
        globals: Arc<BTreeMap<String, Value>>,
        (loops, cap): (Arc<[LoopSpec]>, u64),
    ) -> Self {
        // About as many outputs as last time: the map does not grow while it fills.
        let expected = previous.as_ref().map_or(0, |previous| {
            previous.used.iter().map(|used| used.len()).sum::<usize>()
                + previous
                    .pieces
                    .iter()
                    .map(|pieces| pieces.fragments.len())
                    .sum::<usize>()
        });
        let snippet_names = vars
            .keys()
            .map(|name| (name.clone(), Arc::from(name.as_str())))
            .collect();
        Self {
            previous,
            previous_map: std::sync::OnceLock::new(),
            current: Mutex::new(Fragments {
                map: foldhash::HashMap::with_capacity_and_hasher(expected, Default::default()),
            }),
            resources,
            resources_value,
            extra_context,
            vars,
            globals,
            snippet_names,
            rendered: AtomicUsize::new(0),
            reused: AtomicUsize::new(0),
            loops,
            cap,
            folds: Mutex::new(Folds::new()),
        }
    }

    /// What the folded loops left for the next render: this render's memos, and the
    /// previous render's of loops that did not run (their file was reused or put
    /// together from its pieces, so nothing they read changed).
    pub(crate) fn take_folds(&self) -> Folds {
        let mut folds = std::mem::take(&mut *lock(&self.folds));
        if let Some(previous) = &self.previous {
            for (number, memo) in &previous.folds {
                folds.entry(*number).or_insert_with(|| memo.clone());
            }
        }
        folds
    }

    /// The key of the `number`th loop's piece.
    fn loop_key(&self, number: usize) -> Key {
        Key(Arc::new(KeyParts {
            snippet: Arc::from(format!("{}({number})", super::scan::LOOP_FILTER)),
            parts: Vec::new(),
        }))
    }

    /// How many snippet outputs were rendered and reused.
    pub(crate) fn counts(&self) -> (usize, usize) {
        (
            self.rendered.load(Ordering::Relaxed),
            self.reused.load(Ordering::Relaxed),
        )
    }

    /// The context a snippet renders in: the variables it names (`names`) with
    /// their `values`, and the session.
    fn context<'a>(
        &self,
        names: &'a [String],
        values: &[Var],
        session_value: &Value,
    ) -> BTreeMap<&'a str, Value> {
        let mut context: BTreeMap<&str, Value> = BTreeMap::new();
        for (name, var) in names.iter().zip(values) {
            let value = match var {
                Var::Absent => continue,
                Var::Render if name == "resources" => self.resources_value.clone(),
                Var::Render => self.extra_context.clone(),
                Var::Value(value) => value.clone(),
            };
            context.insert(name, value);
        }
        context.insert(SESSION_VAR, session_value.clone());
        context
    }

    /// The snippet's name, shared by every key of its outputs.
    fn snippet_name(&self, name: &str) -> Arc<str> {
        self.snippet_names
            .get(name)
            .cloned()
            .unwrap_or_else(|| Arc::from(name))
    }

    /// `fragment` (of the previous render) when nothing it read changed
    /// (`changed` false), else its snippet rendered again with the same variables,
    /// now.
    fn refresh(
        &self,
        env: &minijinja::Environment<'_>,
        session_value: &Value,
        key: &Key,
        fragment: &Arc<Fragment>,
        changed: bool,
    ) -> Result<Arc<Fragment>, Error> {
        if !changed {
            // Kept in the file's pieces, not in its list of fragments used.
            self.count(true);
            return Ok(fragment.clone());
        }
        let names = self
            .vars
            .get(&*key.0.snippet)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let context = self.context(names, &fragment.values, session_value);
        let recording = Recording::start();
        let rendered = env
            .get_template(&key.0.snippet)
            .and_then(|template| template.render(Value::from(context)));
        let reads: Arc<[Read]> = recording.finish().into();
        let fresh = Arc::new(Fragment {
            text: Value::from_safe_string(rendered?),
            reads,
            values: fragment.values.clone(),
        });
        note_used(key, &fresh);
        self.count(false);
        Ok(fresh)
    }

    /// A file put together again from its previous `pieces`: its own text as it
    /// was, each fragment [refreshed](Self::refresh) and each loop
    /// [put together again](Self::splice_loop), written into `out` as the engine
    /// would have written them. `changed` lists (in order) the pieces that read
    /// something that changed. `earlier` is the file's previous output (its text and
    /// line origins): a piece that is the same and starts in the same stripping
    /// state is copied from there instead of stripped again. Returns the new pieces.
    pub(crate) fn splice(
        &self,
        env: &minijinja::Environment<'_>,
        session_value: &Value,
        (pieces, changed): (&Pieces, &[PieceChange]),
        earlier: (&str, &[Option<u32>]),
        out: &mut Output<'_>,
    ) -> Result<Pieces, Error> {
        let mut fragments = Vec::with_capacity(pieces.fragments.len());
        let (mut at, mut mark) = (0, Mark::default());
        let mut changed = changed.iter().peekable();
        for (index, piece) in pieces.fragments.iter().enumerate() {
            write(
                out,
                earlier,
                &[&pieces.own[at..piece.at]],
                true,
                (&mark, &piece.before),
            )?;
            (at, mark) = (piece.at, piece.after);
            let change = changed.next_if(|change| change.piece == index);
            if let Some(items) = &piece.items {
                let before = out.mark();
                let items = self.splice_loop(env, session_value, (items, change), earlier, out)?;
                fragments.push(Piece {
                    at: piece.at,
                    key: piece.key.clone(),
                    fragment: piece.fragment.clone(),
                    before,
                    after: out.mark(),
                    items: Some(Arc::new(items)),
                });
                continue;
            }
            let fragment = self.refresh(
                env,
                session_value,
                &piece.key,
                &piece.fragment,
                change.is_some(),
            )?;
            let before = out.mark();
            let same = Arc::ptr_eq(&fragment, &piece.fragment);
            write(
                out,
                earlier,
                &[fragment.text()],
                same,
                (&piece.before, &piece.after),
            )?;
            fragments.push(Piece {
                at: piece.at,
                key: piece.key.clone(),
                fragment,
                before,
                after: out.mark(),
                items: None,
            });
        }
        write(
            out,
            earlier,
            &[&pieces.own[at..]],
            true,
            (&mark, &pieces.end),
        )?;
        Ok(Pieces {
            own: pieces.own.clone(),
            fragments,
            end: out.mark(),
        })
    }

    /// A loop's items put together again and written into `out`. When what its
    /// list read changed, the list is evaluated again: an item whose object was
    /// there before keeps its snippet output (rendered again when it read something
    /// that changed), a new object's is looked up or rendered. `earlier` is the
    /// file's previous output, as in [`Self::splice`].
    fn splice_loop(
        &self,
        env: &minijinja::Environment<'_>,
        session_value: &Value,
        (items, change): (&Items, Option<&PieceChange>),
        earlier: (&str, &[Option<u32>]),
        out: &mut Output<'_>,
    ) -> Result<Items, Error> {
        let spec = self.loops.get(items.number).ok_or_else(|| {
            Error::new(
                minijinja::ErrorKind::InvalidOperation,
                "a kept loop names no rewritten loop",
            )
        })?;
        let changed: &[usize] = change.map_or(&[], |change| &change.items);
        let marks_known = items.marks.len() == items.items.len() + 1;
        let mut marks = Vec::with_capacity(items.items.len() + 1);
        let mut kept = Vec::with_capacity(items.items.len());
        marks.push(out.mark());
        // Writes an item's text; `old`: the earlier item it is the same as.
        let mut put = |out: &mut Output<'_>, item: Item, old: Option<usize>| {
            let raw = [&*items.head, item.fragment.text(), &*items.tail];
            match old.filter(|_| marks_known) {
                Some(old) => write(
                    out,
                    earlier,
                    &raw,
                    true,
                    (&items.marks[old], &items.marks[old + 1]),
                )?,
                None => write(
                    out,
                    earlier,
                    &raw,
                    false,
                    (&Mark::default(), &Mark::default()),
                )?,
            }
            marks.push(out.mark());
            kept.push(item);
            Ok::<(), Error>(())
        };
        let list_reads = if change.is_some_and(|change| change.list) {
            let (list, list_reads) = spec.list(env, &self.resources_value);
            let list = list?;
            let mut next = 0;
            let mut by_key: Option<foldhash::HashMap<&Key, usize>> = None;
            // The other parts of every item's key come from the loop's scope: an
            // object with the identity of the next earlier item's has its key.
            let slot = self.loop_slot(&spec.snippet, &spec.var, &items.scope);
            for object in list.try_iter()? {
                let same_object = slot.zip(items.items.get(next)).is_some_and(|(slot, item)| {
                    let defined = Some(&object).filter(|v| !v.is_undefined());
                    match self.part_of(&spec.var, defined) {
                        (Some(part @ (Part::Object(..) | Part::Plain(_))), true) => {
                            item.key.0.parts.get(slot) == Some(&part)
                        }
                        _ => false,
                    }
                });
                let (key, values, cacheable) = if same_object {
                    (items.items[next].key.clone(), Vec::new(), true)
                } else {
                    self.key_of(&spec.snippet, |name| {
                        if name == spec.var {
                            Some(object.clone())
                        } else {
                            self.scope_value(&spec.snippet, &items.scope, name)
                        }
                    })
                };
                let old = if items.items.get(next).is_some_and(|item| item.key == key) {
                    next += 1;
                    Some(next - 1)
                } else {
                    by_key
                        .get_or_insert_with(|| {
                            items
                                .items
                                .iter()
                                .enumerate()
                                .map(|(index, item)| (&item.key, index))
                                .collect()
                        })
                        .get(&key)
                        .copied()
                };
                let item = match old {
                    Some(old) => {
                        let fragment = self.refresh(
                            env,
                            session_value,
                            &key,
                            &items.items[old].fragment,
                            changed.binary_search(&old).is_ok(),
                        )?;
                        Item { key, fragment }
                    }
                    // A new object's output: this render's, or rendered now (looking
                    // through every output of the previous render for one that
                    // some other file printed would cost more than rendering it).
                    None => match self.find(
                        env,
                        session_value,
                        (&spec.snippet, false),
                        (key, values, cacheable),
                    )? {
                        Found::Cached(key, fragment) => Item { key, fragment },
                        Found::Uncached(..) => {
                            return Err(Error::new(
                                minijinja::ErrorKind::InvalidOperation,
                                "a kept loop's snippet cannot be cached any more",
                            ));
                        }
                    },
                };
                let same =
                    old.filter(|&old| Arc::ptr_eq(&item.fragment, &items.items[old].fragment));
                put(out, item, same)?;
                self.within_cap(out.mark().text())?;
            }
            list_reads
        } else {
            for (index, old) in items.items.iter().enumerate() {
                let fragment = self.refresh(
                    env,
                    session_value,
                    &old.key,
                    &old.fragment,
                    changed.binary_search(&index).is_ok(),
                )?;
                let same = Arc::ptr_eq(&fragment, &old.fragment).then_some(index);
                put(
                    out,
                    Item {
                        key: old.key.clone(),
                        fragment,
                    },
                    same,
                )?;
            }
            items.list_reads.clone()
        };
        // Kept until the next change: a list that grew past the earlier one's length
        // left spare room.
        marks.shrink_to_fit();
        kept.shrink_to_fit();
        Ok(Items {
            number: items.number,
            list_reads,
            scope: items.scope.clone(),
            items: kept,
            marks,
            head: items.head.clone(),
            tail: items.tail.clone(),
        })
    }

    fn previous_map(&self) -> Option<(&Resources, &Fragments)> {
        let previous = self.previous.as_ref()?;
        Some((
            &previous.resources,
            self.previous_map
                .get_or_init(|| Fragments::from_used(previous)),
        ))
    }

    fn count(&self, reused: bool) {
        let counter = if reused { &self.reused } else { &self.rendered };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Writes `raw` (in parts), which gave `text[from..to]` of the earlier output
/// (`text`, `lines`): copied from there when `same` and the output is in the
/// stripping state it was in at `from`, else written (and stripped) again.
fn write(
    out: &mut Output<'_>,
    (text, lines): (&str, &[Option<u32>]),
    raw: &[&str],
    same: bool,
    (from, to): (&Mark, &Mark),
) -> Result<(), Error> {
    let result = if same && out.same_state(from, text) {
        out.copy(text, lines, from, to)
    } else {
        raw.iter().try_for_each(|part| out.put(part))
    };
    result.map_err(|error| {
        Error::new(minijinja::ErrorKind::WriteFailure, "could not write output").with_source(error)
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A snippet output looked up or rendered ([`Session::find`]).
enum Found {
    /// Through the cache.
    Cached(Key, Arc<Fragment>),
    /// Rendered without the cache (a variable holds a value the key cannot name),
    /// with what it read.
    Uncached(Value, Arc<[Read]>),
}

/// The render's [`Session`], from the context.
fn session_of(state: &State) -> Result<Value, Error> {
    let session_value = state.lookup(SESSION_VAR).unwrap_or_default();
    if session_value.downcast_object_ref::<Session>().is_none() {
        return Err(Error::new(
            minijinja::ErrorKind::InvalidOperation,
            "__fragment and __loop are for hapwright's own use",
        ));
    }
    Ok(session_value)
}

impl Session {
    /// The key of snippet `name`'s output with its variables as `lookup` gives
    /// them, their values (for its context), and whether the key names them all.
    fn key_of(&self, name: &str, lookup: impl Fn(&str) -> Option<Value>) -> (Key, Vec<Var>, bool) {
        let names = self.vars.get(name).map(Vec::as_slice).unwrap_or(&[]);
        let mut parts = Vec::with_capacity(names.len());
        let mut values = Vec::with_capacity(names.len());
        let mut cacheable = true;
        for var in names {
            let value = lookup(var).filter(|v| !v.is_undefined());
            let (part, identified) = self.part_of(var, value.as_ref());
            cacheable &= identified;
            match (part, value) {
                (None, _) => values.push(Var::Render),
                (Some(part @ Part::Global), _) | (Some(part), None) => {
                    values.push(Var::Absent);
                    parts.push(part);
                }
                (Some(part), Some(value)) => {
                    values.push(Var::Value(value));
                    parts.push(part);
                }
            }
        }
        let key = Key(Arc::new(KeyParts {
            snippet: self.snippet_name(name),
            parts,
        }));
        (key, values, cacheable)
    }

    /// What variable `var` with `value` (`None`: not defined) puts in a key: no
    /// part for the render's own `resources` and `extraContext`, and whether the
    /// value is identified (`false`: an object without an identity, which makes the
    /// key unusable for the cache).
    fn part_of(&self, var: &str, value: Option<&Value>) -> (Option<Part>, bool) {
        let Some(value) = value else {
            return (Some(Part::Missing), true);
        };
        let same = |other: &Value| minijinja::tests::is_sameas(value, other);
        let part = match var {
            "resources" if same(&self.resources_value) => return (None, true),
            "extraContext" if same(&self.extra_context) => return (None, true),
            _ if self.globals.get(var).is_some_and(same) => Part::Global,
            _ => match value.kind() {
                ValueKind::Undefined
                | ValueKind::None
                | ValueKind::Bool
                | ValueKind::Number
                | ValueKind::String => {
                    // A trusted string prints differently from an untrusted one.
                    let trust = if value.is_safe() { "trusted " } else { "" };
                    Part::Plain(format!("{trust}{value:?}"))
                }
                _ => match lazy::identity(value).or_else(|| list_identity(value)) {
                    Some((identity, node)) => Part::Object(identity, node),
                    None => return (Some(Part::Missing), false),
                },
            },
        };
        (Some(part), true)
    }

    /// Where the loop variable `var` of snippet `snippet` is among the parts of
    /// its keys, the other variables having the values of `scope` (the same for
    /// every item of the loop).
    fn loop_slot(&self, snippet: &str, var: &str, scope: &[Var]) -> Option<usize> {
        let mut slot = 0;
        for name in self.vars.get(snippet)? {
            if name == var {
                return Some(slot);
            }
            let value = self
                .scope_value(snippet, scope, name)
                .filter(|v| !v.is_undefined());
            if self.part_of(name, value.as_ref()).0.is_some() {
                slot += 1;
            }
        }
        None
    }

    /// Snippet `name`'s output for `key` (with `values`, [`Self::key_of`]): this
    /// render's, the previous render's when nothing it read changed (when `earlier`
    /// says to look there), or rendered now.
    fn find(
        &self,
        env: &minijinja::Environment<'_>,
        session_value: &Value,
        (name, earlier): (&str, bool),
        (key, values, cacheable): (Key, Vec<Var>, bool),
    ) -> Result<Found, Error> {
        if cacheable {
            if let Some(found) = lock(&self.current).map.get(&key).cloned() {
                self.count(true);
                return Ok(Found::Cached(key, found));
            }
            let previous = earlier.then(|| self.previous_map()).flatten();
            let previous = previous.and_then(|(old, fragments)| {
                let found = fragments.map.get(&key)?;
                found.unchanged(old, &self.resources).then(|| found.clone())
            });
            if let Some(found) = previous {
                lock(&self.current).map.insert(key.clone(), found.clone());
                self.count(true);
                return Ok(Found::Cached(key, found));
            }
        }
        let names = self.vars.get(name).map(Vec::as_slice).unwrap_or(&[]);
        let context = self.context(names, &values, session_value);
        let recording = Recording::start();
        nest(1);
        let rendered = env
            .get_template(name)
            .and_then(|template| template.render(Value::from(context)));
        nest(-1);
        let reads: Arc<[Read]> = recording.finish().into();
        let text = Value::from_safe_string(rendered?);
        if !cacheable {
            return Ok(Found::Uncached(text, reads));
        }
        self.count(false);
        let fragment = Arc::new(Fragment {
            text,
            reads,
            values: values.into_boxed_slice(),
        });
        lock(&self.current)
            .map
            .insert(key.clone(), fragment.clone());
        Ok(Found::Cached(key, fragment))
    }

    /// A variable of a loop's snippet other than the loop variable, as the loop saw
    /// it (`scope`), for this render.
    fn scope_value(&self, snippet: &str, scope: &[Var], name: &str) -> Option<Value> {
        let names = self.vars.get(snippet)?;
        let index = names.iter().position(|n| n == name)?;
        match scope.get(index)? {
            Var::Absent => None,
            Var::Render if name == "resources" => Some(self.resources_value.clone()),
            Var::Render => Some(self.extra_context.clone()),
            Var::Value(value) => Some(value.clone()),
        }
    }

    /// Refuses a loop's output past `templating.maxOutputBytes` while it is put
    /// together (the render then runs again in full and reports it).
    fn within_cap(&self, len: usize) -> Result<(), Error> {
        if len as u64 > self.cap {
            return Err(Error::new(
                minijinja::ErrorKind::InvalidOperation,
                "rendered output is larger than templating.maxOutputBytes",
            ));
        }
        Ok(())
    }
}

/// `{% filter __fragment("name") %}{% endfilter %}`: the output of
/// `{% include "name" %}`, from the cache when possible.
pub(crate) fn fragment(state: &State, _body: Value, name: &str) -> Result<Value, Error> {
    let session_value = session_of(state)?;
    let session = session_value
        .downcast_object_ref::<Session>()
        .expect("session_of checked the type");
    let key = session.key_of(name, |var| state.lookup(var));
    match session.find(state.env(), &session_value, (name, true), key)? {
        Found::Cached(key, found) => {
            // Called by the file's own template: the fragment's reads stay with it
            // (see [`track_use`]); called inside another snippet: they are that
            // snippet's reads.
            if at_top() {
                track_use(&key, &found, None);
            } else {
                record_all(&found.reads);
            }
            note_used(&key, &found);
            Ok(found.text.clone())
        }
        Found::Uncached(text, reads) => {
            record_all(&reads);
            Ok(text)
        }
    }
}

/// `{% filter __loop(n) %}{% endfilter %}`: the output of the `n`th rewritten loop
/// ([`super::scan::LoopSite`]): for each object of its list, the loop's text around
/// the output of its snippet for that object, through the cache. It is what the
/// loop prints: the snippet does not name `loop`, so each iteration prints the same
/// text around the snippet's output, and the snippet sees what the loop body would
/// show it.
///
/// Printed directly by a file whose output is kept in pieces, the loop is kept as
/// one piece of items, with what the list read apart from what the file's own
/// template read: a change to the list (an object added, removed or changed) puts
/// the loop together again without the template running ([`Session::splice`]).
pub(crate) fn render_loop(state: &State, _body: Value, number: usize) -> Result<Value, Error> {
    let session_value = session_of(state)?;
    let session = session_value
        .downcast_object_ref::<Session>()
        .expect("session_of checked the type");
    let spec = session.loops.get(number).ok_or_else(|| {
        Error::new(
            minijinja::ErrorKind::InvalidOperation,
            "__loop is for hapwright's own use",
        )
    })?;
    if let Some(names) = &spec.fold {
        return render_fold(state, (&session_value, session), (number, spec), names);
    }
    let resources = state.lookup("resources").unwrap_or_default();
    let (list, list_reads) = spec.list(state.env(), &resources);
    let list = list?;
    let names = session
        .vars
        .get(&spec.snippet)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let lookup = |item: &Value, name: &str| {
        if name == spec.var {
            Some(item.clone())
        } else {
            state.lookup(name)
        }
    };
    let mut text = String::new();
    let mut items = Vec::new();
    let mut uncached: Vec<Read> = Vec::new();
    // Kept as a piece only when the list can be evaluated again the same way.
    let mut pieces = minijinja::tests::is_sameas(&resources, &session.resources_value);
    for item in list.try_iter()? {
        let key = session.key_of(&spec.snippet, |name| lookup(&item, name));
        text.push_str(&spec.head);
        match session.find(state.env(), &session_value, (&spec.snippet, true), key)? {
            Found::Cached(key, fragment) => {
                text.push_str(fragment.text());
                items.push(Item { key, fragment });
            }
            Found::Uncached(output, reads) => {
                pieces = false;
                text.push_str(output.as_str().unwrap_or_default());
                uncached.extend(reads.iter().cloned());
            }
        }
        text.push_str(&spec.tail);
        session.within_cap(text.len())?;
    }
    for item in &items {
        note_used(&item.key, &item.fragment);
    }
    if pieces && at_top() {
        let scope = names
            .iter()
            .map(|name| {
                let value = (name != &spec.var)
                    .then(|| state.lookup(name))
                    .flatten()
                    .filter(|v| !v.is_undefined());
                let same = |v: &Value, other: &Value| minijinja::tests::is_sameas(v, other);
                match (name.as_str(), value) {
                    (_, None) => Var::Absent,
                    ("resources", Some(v)) if same(&v, &session.resources_value) => Var::Render,
                    ("extraContext", Some(v)) if same(&v, &session.extra_context) => Var::Render,
                    (_, Some(v)) => Var::Value(v),
                }
            })
            .collect();
        let reads: Vec<Read> = list_reads
            .iter()
            .cloned()
            .chain(
                items
                    .iter()
                    .flat_map(|item| item.fragment.reads.iter().cloned()),
            )
            .collect();
        let fragment = Arc::new(Fragment {
            text: Value::from_safe_string(text),
            reads: reads.into(),
            values: Box::new([]),
        });
        let items = Items {
            number,
            list_reads,
            scope,
            items,
            marks: Vec::new(),
            head: spec.head.clone(),
            tail: spec.tail.clone(),
        };
        track_use(&session.loop_key(number), &fragment, Some(items));
        return Ok(fragment.text.clone());
    }
    record_each(
        std::iter::once(&list_reads[..])
            .chain(items.iter().map(|item| &item.fragment.reads[..]))
            .chain(std::iter::once(&uncached[..])),
    );
    Ok(Value::from_safe_string(text))
}

/// The identity of a resource list (`list()`, `fetch()`, a list inside an object).
fn list_identity(value: &Value) -> Option<(usize, u32)> {
    value
        .downcast_object_ref::<super::context::ResourceList>()
        .map(|list| (std::ptr::from_ref(list) as usize, 0))
}

/// A rewritten loop whose snippet names `shared` (a fold over the list: each
/// iteration reads what the ones before it left in `shared`), such as a pass over
/// Ingresses, oldest first, where the first claim on a host wins.
///
/// An iteration's output and what it leaves in `shared` depend only on its item,
/// on `shared` as the iterations before it left it, and on what it reads from the
/// resources: the snippet names no other variable (`extraContext` and the
/// templates are fixed for the renderer's life). So when `shared` starts the same
/// as last time, the iterations up to the first whose item is not the same object
/// or whose reads changed would do what they did last time. The loop starts again
/// from the last kept state of `shared` before that iteration, with the text of
/// the iterations before it as it was, and runs the rest. Adding the newest object
/// to a list sorted by age runs its own iteration only (from the state at the
/// end), removing it at most [`fold_checkpoint_every`] iterations, instead of all
/// of them.
///
/// The file's own template sees all of it as its own: every iteration's reads are
/// recorded for the file (a change to any of them renders the file again) and the
/// loop's text is the file's.
fn render_fold(
    state: &State,
    (session_value, session): (&Value, &Session),
    (number, spec): (usize, &LoopSpec),
    names: &[String],
) -> Result<Value, Error> {
    let resources = state.lookup("resources").unwrap_or_default();
    let (list, list_reads) = spec.list(state.env(), &resources);
    let items: Vec<Value> = list?.try_iter()?.collect();
    let shared_value = state.lookup("shared").unwrap_or_default();
    let Some(shared) = shared_value.downcast_object_ref::<Shared>() else {
        return Err(Error::new(
            minijinja::ErrorKind::InvalidOperation,
            "a folded loop needs the render's shared memo",
        ));
    };
    let start = shared.snapshot();
    let every = fold_checkpoint_every(items.len());
    let previous = session.previous.as_ref().and_then(|previous| {
        let memo = previous.folds.get(&number)?;
        (memo.every == every && memo.start == start).then_some((memo, &previous.resources))
    });
    // How many iterations, from the first, would do what they did last time.
    let mut same = 0;
    if let Some((memo, old)) = previous {
        let check = ReadCheck::new(old, &session.resources);
        same = items
            .iter()
            .zip(memo.items.iter().zip(&memo.reads))
            .take_while(|(item, (was, reads))| {
                same_item(item, was) && reads.iter().all(|read| check.unchanged(read))
            })
            .count();
    }
    let resume = match previous {
        Some((memo, _)) if same == memo.items.len() => same,
        Some((memo, _)) => (same / every).min(memo.checkpoints.len()) * every,
        None => 0,
    };
    let mut memo = FoldMemo {
        end: start.clone(),
        start,
        items: imbl::Vector::new(),
        reads: imbl::Vector::new(),
        ends: imbl::Vector::new(),
        text: Value::UNDEFINED,
        every,
        checkpoints: Vec::with_capacity(items.len() / every),
    };
    let mut text = String::new();
    if let (Some((old, _)), true) = (previous, resume > 0) {
        memo.items = old.items.take(resume);
        memo.reads = old.reads.take(resume);
        memo.ends = old.ends.take(resume);
        text.push_str(&old.text.as_str().unwrap_or_default()[..old.ends[resume - 1]]);
        memo.checkpoints
            .extend_from_slice(&old.checkpoints[..resume / every]);
        if resume == old.items.len() {
            shared.restore(&old.end);
        } else {
            shared.restore(&old.checkpoints[resume / every - 1]);
        }
    }
    session.reused.fetch_add(resume, Ordering::Relaxed);
    let env = state.env();
    for (index, item) in items.iter().enumerate().skip(resume) {
        let mut context: BTreeMap<&str, Value> = BTreeMap::new();
        for name in names {
            let value = match name.as_str() {
                name if name == spec.var => item.clone(),
                "shared" => shared_value.clone(),
                "resources" | "extraContext" => state.lookup(name).unwrap_or_default(),
                // The renderer's functions: globals of every render.
                _ => continue,
            };
            context.insert(name.as_str(), value);
        }
        context.insert(SESSION_VAR, session_value.clone());
        let recording = Recording::start();
        nest(1);
        let rendered = env
            .get_template(&spec.snippet)
            .and_then(|template| template.render(Value::from(context)));
        nest(-1);
        let reads: Arc<[Read]> = recording.finish().into();
        let output = rendered?;
        text.push_str(&spec.head);
        text.push_str(&output);
        text.push_str(&spec.tail);
        session.within_cap(text.len())?;
        memo.items.push_back(item.clone());
        memo.reads.push_back(reads);
        memo.ends.push_back(text.len());
        if (index + 1) % every == 0 {
            memo.checkpoints.push(shared.snapshot());
        }
        session.count(false);
    }
    memo.end = shared.snapshot();
    record_all(&list_reads);
    record_lists(&memo.reads);
    memo.text = Value::from_safe_string(text);
    let text = memo.text.clone();
    lock(&session.folds).insert(number, Arc::new(memo));
    Ok(text)
}

/// Whether a folded loop's item is the one of the previous render: the same
/// resource object (unchanged objects keep their document), or an equal number,
/// string, boolean or `none`.
fn same_item(new: &Value, old: &Value) -> bool {
    match (lazy::identity(new), lazy::identity(old)) {
        (Some(new), Some(old)) => new == old,
        (None, None) => {
            matches!(
                new.kind(),
                ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::String
            ) && new.kind() == old.kind()
                && new.is_safe() == old.is_safe()
                && new == old
        }
        _ => false,
    }
}
