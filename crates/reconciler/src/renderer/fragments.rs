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

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use minijinja::value::{Object, Value, ValueKind};
use minijinja::{Error, State};

use super::context::{Read, Recording, Resources, record_all};
use super::lazy;

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

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    snippet: Arc<str>,
    parts: Vec<Part>,
}

/// A cached snippet output.
#[derive(Debug)]
pub(crate) struct Fragment {
    /// The output, markers included.
    text: Value,
    reads: Arc<[Read]>,
    /// The values keyed by identity, kept alive so the identities stay unique.
    _keep: Vec<Value>,
}

/// Fragments by key.
#[derive(Debug, Default)]
pub(crate) struct Fragments {
    map: foldhash::HashMap<Key, Arc<Fragment>>,
}

impl Fragments {
    /// Adds the fragments a file used, for a file reused unchanged (so everything
    /// those fragments read is unchanged too).
    pub(crate) fn extend(&mut self, used: &[(Key, Arc<Fragment>)]) {
        for (key, fragment) in used {
            self.map
                .entry(key.clone())
                .or_insert_with(|| fragment.clone());
        }
    }
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
    /// Fragments of the previous render, with the resources they were rendered from.
    previous: Option<(Resources, Fragments)>,
    /// Fragments used in this render (the next render's `previous`).
    current: Mutex<Fragments>,
    resources: Resources,
    resources_value: Value,
    extra_context: Value,
    /// Per cacheable snippet: the variables it names and does not set.
    vars: Arc<BTreeMap<String, Vec<String>>>,
    /// The renderer's functions, by name.
    globals: Arc<BTreeMap<String, Value>>,
    counts: Mutex<(usize, usize)>,
}

impl Object for Session {}

impl Session {
    pub(crate) fn new(
        previous: Option<(Resources, Fragments)>,
        resources: Resources,
        resources_value: Value,
        extra_context: Value,
        vars: Arc<BTreeMap<String, Vec<String>>>,
        globals: Arc<BTreeMap<String, Value>>,
    ) -> Self {
        Self {
            previous,
            current: Mutex::new(Fragments::default()),
            resources,
            resources_value,
            extra_context,
            vars,
            globals,
            counts: Mutex::new((0, 0)),
        }
    }

    /// The fragments used in this render, and how many snippet outputs were
    /// rendered and reused.
    pub(crate) fn finish(&self) -> (Fragments, usize, usize) {
        let fragments = std::mem::take(&mut *lock(&self.current));
        let (rendered, reused) = *lock(&self.counts);
        (fragments, rendered, reused)
    }

    fn count(&self, reused: bool) {
        let mut counts = lock(&self.counts);
        if reused {
            counts.1 += 1;
        } else {
            counts.0 += 1;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `{% filter __fragment("name") %}{% endfilter %}`: the output of
/// `{% include "name" %}`, from the cache when possible.
pub(crate) fn fragment(state: &State, _body: Value, name: &str) -> Result<Value, Error> {
    let session_value = state.lookup(SESSION_VAR).unwrap_or_default();
    let Some(session) = session_value.downcast_object_ref::<Session>() else {
        return Err(Error::new(
            minijinja::ErrorKind::InvalidOperation,
            "__fragment is for hapwright's own use",
        ));
    };
    let names = session.vars.get(name).map(Vec::as_slice).unwrap_or(&[]);
    // The snippet's context and key.
    let mut context: BTreeMap<&str, Value> = BTreeMap::new();
    let mut parts = Vec::with_capacity(names.len());
    let mut keep = Vec::new();
    let mut cacheable = true;
    for var in names {
        let value = state.lookup(var);
        let Some(value) = value.filter(|v| !v.is_undefined()) else {
            parts.push(Part::Missing);
            continue;
        };
        let same = |other: &Value| minijinja::tests::is_sameas(&value, other);
        let part = match var.as_str() {
            "resources" if same(&session.resources_value) => None,
            "extraContext" if same(&session.extra_context) => None,
            _ if session.globals.get(var).is_some_and(same) => Some(Part::Global),
            _ => Some(match value.kind() {
                ValueKind::Undefined
                | ValueKind::None
                | ValueKind::Bool
                | ValueKind::Number
                | ValueKind::String => Part::Plain(format!("{value:?}")),
                _ => match lazy::identity(&value).or_else(|| list_identity(&value)) {
                    Some((identity, node)) => {
                        keep.push(value.clone());
                        Part::Object(identity, node)
                    }
                    None => {
                        cacheable = false;
                        Part::Missing
                    }
                },
            }),
        };
        if let Some(part) = part {
            if part != Part::Global {
                context.insert(var, value);
            }
            parts.push(part);
        } else {
            context.insert(var, value);
        }
    }
    context.insert(SESSION_VAR, session_value.clone());
    let key = Key {
        snippet: Arc::from(name),
        parts,
    };
    if cacheable {
        if let Some(found) = lock(&session.current).map.get(&key).cloned() {
            record_all(&found.reads);
            note_used(&key, &found);
            session.count(true);
            return Ok(found.text.clone());
        }
        let previous = session.previous.as_ref().and_then(|(old, fragments)| {
            let found = fragments.map.get(&key)?;
            found
                .reads
                .iter()
                .all(|read| read.unchanged(old, &session.resources))
                .then(|| found.clone())
        });
        if let Some(found) = previous {
            record_all(&found.reads);
            note_used(&key, &found);
            lock(&session.current).map.insert(key, found.clone());
            session.count(true);
            return Ok(found.text.clone());
        }
    }
    let recording = Recording::start();
    let rendered = state
        .env()
        .get_template(name)
        .and_then(|template| template.render(Value::from(context)));
    let reads: Arc<[Read]> = recording.finish().into();
    record_all(&reads);
    let text = Value::from(rendered?);
    if cacheable {
        session.count(false);
        let fragment = Arc::new(Fragment {
            text: text.clone(),
            reads,
            _keep: keep,
        });
        note_used(&key, &fragment);
        lock(&session.current).map.insert(key, fragment);
    }
    Ok(text)
}

/// The identity of a resource list (`list()`, `fetch()`, a list inside an object).
fn list_identity(value: &Value) -> Option<(usize, u32)> {
    value
        .downcast_object_ref::<super::context::ResourceList>()
        .map(|list| (std::ptr::from_ref(list) as usize, 0))
}
