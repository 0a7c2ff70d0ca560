//! Template context objects: `resources.<name>` stores over the latest snapshots and
//! the per-render `shared` memo.
//!
//! Resource objects reach templates as lazy values over the snapshot's stored JSON
//! text ([`super::lazy`]): nothing is converted ahead of time, a render allocates for
//! what the template touches, and the controller keeps no second copy of the objects.
//! [`Resources::update`] wraps only the objects a `ResourceIndexUpdated` added or
//! modified in a new document and keeps the documents of the others, so an object's
//! structural index (its tape, built on the first read) and the `sort_by` orders of
//! its arrays are computed once per object version. The cache is keyed by the address
//! of the stored text ([`StoredObject::address`]); the document holds a clone of the
//! object, so the address stays unique for as long as the entry exists. A lookup that
//! misses (a change report that left something out) wraps the object on the spot, so
//! the values are always right, only slower.
//!
//! Every list a template gets from the resources — `list()`, `fetch()` and the arrays
//! inside the objects — is a [`ResourceList`]: an ordinary sequence to templates that
//! also remembers how `sort_by` ordered it. Those lists live as long as their
//! snapshot version, so `resources.services.list() | sort_by(...)` and
//! `slice.endpoints | sort_by(...)` sort once per change, not once per render.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use hapwright_eventbus::model::{ResourceChange, ResourceSnapshot, StoredObject};
use minijinja::value::{Enumerator, Kwargs, Object, ObjectExt, ObjectRepr, Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

use super::lazy::Doc;

/// The address of a stored object, the key of the conversion cache.
fn address(object: &StoredObject) -> usize {
    object.address()
}

/// The template value of one stored object: a lazy view over its JSON text (see
/// [`super::lazy`]).
pub(crate) fn to_value(object: &StoredObject) -> Value {
    Doc::root(object.clone())
}

// === impl ResourceList ===

/// At most this many `sort_by` orders are remembered per list (templates sort a list
/// in one or two ways; the bound keeps a template that sorts by computed keys from
/// growing the memo without end).
const SORT_MEMO_LIMIT: usize = 8;

/// A list of resource objects as `list()` and `fetch()` return it: to templates an
/// ordinary sequence, which also remembers how `sort_by` ordered it. The list lives
/// as long as its snapshot version, so a template that sorts `list()` on every render
/// sorts once per change.
#[derive(Debug)]
pub(crate) struct ResourceList {
    items: Vec<Value>,
    /// For a store's `list()`: the address of each item's object, so the next
    /// version's list takes the values of the objects it shares with this one in
    /// one walk ([`ResourceStore::list_value`]). Empty for other lists.
    addresses: Vec<usize>,
    sorted: Mutex<Vec<SortMemo>>,
    /// How the previous version of this list was sorted, for a sort that is not
    /// remembered yet ([`Self::base_order`]).
    base: Option<SortBase>,
}

/// The orders `sort_by` gave the previous version of a `list()`: each sort's paths,
/// `reverse` and the sorted objects. The objects that did not change since keep
/// their values (and their order among themselves), so the new version's order is
/// that one with the changed objects taken out and put back where they sort.
/// Plain lists of values: a base never holds the list it came from, so versions do
/// not chain.
#[derive(Debug, Default)]
pub(crate) struct SortBase {
    orders: Vec<(Vec<Box<str>>, bool, Vec<Value>)>,
}

/// One remembered `sort_by`: its paths and `reverse`, and the sorted list (`None`:
/// the list was already in that order; never the list itself, which would be a
/// reference cycle).
#[derive(Debug)]
struct SortMemo {
    paths: Vec<Box<str>>,
    reverse: bool,
    sorted: Option<Value>,
}

impl ResourceList {
    /// The list as a template value.
    pub(crate) fn value(items: Vec<Value>) -> Value {
        Self::with_base(items, None)
    }

    fn with_base(items: Vec<Value>, base: Option<SortBase>) -> Value {
        Self::of_store(items, Vec::new(), base)
    }

    fn of_store(items: Vec<Value>, addresses: Vec<usize>, base: Option<SortBase>) -> Value {
        Value::from_object(Self {
            items,
            addresses,
            sorted: Mutex::new(Vec::new()),
            base,
        })
    }

    /// What the next version's list starts from: every order remembered here.
    fn base_for_next(&self) -> SortBase {
        let orders = self
            .memo()
            .iter()
            .map(|memo| {
                let items = match &memo.sorted {
                    Some(sorted) => match sorted.downcast_object_ref::<Vec<Value>>() {
                        Some(items) => items.clone(),
                        None => sorted.try_iter().map(Iterator::collect).unwrap_or_default(),
                    },
                    None => self.items.clone(),
                };
                (memo.paths.clone(), memo.reverse, items)
            })
            .collect();
        SortBase { orders }
    }

    /// How the previous version of this list was sorted by `sort_by(paths,
    /// reverse)`, when it was.
    pub(crate) fn base_order(&self, paths: &[Cow<'_, str>], reverse: bool) -> Option<&[Value]> {
        self.base
            .as_ref()?
            .orders
            .iter()
            .find_map(|(memo, rev, items)| {
                (*rev == reverse
                    && memo.len() == paths.len()
                    && memo.iter().zip(paths).all(|(a, b)| **a == **b))
                .then_some(items.as_slice())
            })
    }

    /// The objects.
    pub(crate) fn items(&self) -> &[Value] {
        &self.items
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, Vec<SortMemo>> {
        self.sorted
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A remembered `sort_by(paths, reverse)`: `Some(None)` when the list is already
    /// in that order, `Some(Some(sorted))` otherwise; `None` when not remembered.
    pub(crate) fn sorted(&self, paths: &[Cow<'_, str>], reverse: bool) -> Option<Option<Value>> {
        self.memo()
            .iter()
            .find(|memo| {
                memo.reverse == reverse
                    && memo.paths.len() == paths.len()
                    && memo.paths.iter().zip(paths).all(|(a, b)| **a == **b)
            })
            .map(|memo| memo.sorted.clone())
    }

    /// Remembers the result of `sort_by(paths, reverse)` (see [`Self::sorted`]).
    pub(crate) fn remember_sorted(
        &self,
        paths: &[Cow<'_, str>],
        reverse: bool,
        sorted: Option<Value>,
    ) {
        let mut memo = self.memo();
        if memo.len() < SORT_MEMO_LIMIT {
            memo.push(SortMemo {
                paths: paths.iter().map(|p| Box::from(p.as_ref())).collect(),
                reverse,
                sorted,
            });
        }
    }
}

impl Object for ResourceList {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.items.get(key.as_usize()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.items.len())
    }
}

// === impl ResourceStore ===

/// The template view of one watched resource: `list()`, `fetch(keys...)` and
/// `get(keys...)` over its latest snapshot, returning the objects' lazy values. Iterating
/// the store itself (`{% for s in resources.services %}`) is the same as `list()`.
pub struct ResourceStore {
    name: Arc<str>,
    /// Unique per store version in the process (0: the empty store, which never
    /// changes), so two stores with the same generation hold the same objects.
    generation: u64,
    /// The latest updates that led to this version, newest first (at most
    /// [`HISTORY`]): from which generation, and the index values of every object they
    /// added, changed or removed (before and after). Lets a lookup recorded on an
    /// earlier version be checked without repeating it.
    history: Arc<[Step]>,
    snapshot: Option<Arc<ResourceSnapshot>>,
    /// The template value (a lazy document) of every object, by its address.
    values: imbl::OrdMap<usize, Value>,
    list: OnceLock<Value>,
    /// The previous version's `list()`, when it was made and this version came
    /// from a reported update: this version's list takes its values for the
    /// objects both hold.
    previous_list: Mutex<Option<Value>>,
    /// How the previous version's `list()` was sorted, handed to this version's
    /// `list()` when it is made (see [`SortBase`]).
    sort_base: Mutex<Option<SortBase>>,
    lookup: OnceLock<Lookup>,
    /// Where this version's index comes from when it is first needed: the index of an
    /// earlier version and the index values every update since then touched, so only
    /// those paths are redone. `None`: built from all objects.
    lookup_base: Mutex<Option<LookupBase>>,
}

/// An earlier version's index and what changed since (see
/// [`ResourceStore::lookup_base`]).
#[derive(Debug)]
struct LookupBase {
    root: Arc<LookupNode>,
    touched: Vec<Arc<[String]>>,
}

/// A hash index over one snapshot for `fetch`/`get`: a trie over the `indexBy`
/// values, where the node reached by the keys `k1..km` holds the objects whose
/// leading index values are `k1..km`, in the snapshot's `fetch` order. Built on the
/// first lookup after a change (O(objects × indexBy paths)); a lookup in a render is
/// then one hash probe per key, with no allocation.
#[derive(Debug, Default)]
struct Lookup {
    root: Arc<LookupNode>,
}

/// The children of an index node: a persistent map, so the next version's index
/// shares every node an update did not touch.
type Children = imbl::GenericHashMap<
    Box<str>,
    Arc<LookupNode>,
    foldhash::fast::RandomState,
    imbl::shared_ptr::DefaultSharedPtr,
>;

/// One node of the index: at the depth of `indexBy` the objects with exactly those
/// index values; above it, the nodes one value further down.
#[derive(Debug, Default)]
struct LookupNode {
    /// Number of matching objects.
    count: usize,
    /// The objects of a node at full depth, in the snapshot's `fetch` order.
    objects: Vec<Value>,
    children: Children,
    /// The matching objects as one shared list value, made on the first `fetch`.
    list: OnceLock<Value>,
}

impl LookupNode {
    /// A node at full depth.
    fn leaf(objects: Vec<Value>) -> Self {
        Self {
            count: objects.len(),
            objects,
            ..Self::default()
        }
    }

    /// A node above full depth.
    fn inner(children: Children) -> Self {
        Self {
            count: children.values().map(|child| child.count).sum(),
            children,
            ..Self::default()
        }
    }

    /// The matching objects, in the snapshot's `fetch` order (index values, then
    /// object key): the children in the order of their index value.
    fn collect(&self, out: &mut Vec<Value>) {
        out.extend(self.objects.iter().cloned());
        let mut children: Vec<(&Box<str>, &Arc<LookupNode>)> = self.children.iter().collect();
        children.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (_, child) in children {
            child.collect(out);
        }
    }

    fn list(&self) -> Value {
        self.list
            .get_or_init(|| {
                if self.children.is_empty() {
                    return ResourceList::value(self.objects.clone());
                }
                let mut out = Vec::with_capacity(self.count);
                self.collect(&mut out);
                ResourceList::value(out)
            })
            .clone()
    }

    /// The object when exactly one matches (for `get`), otherwise undefined.
    fn single(&self) -> Value {
        match (self.count, self.objects.first()) {
            (1, Some(only)) => only.clone(),
            (1, None) => self
                .children
                .values()
                .find(|child| child.count == 1)
                .map_or(Value::UNDEFINED, |child| child.single()),
            _ => Value::UNDEFINED,
        }
    }

    /// This node with the node at `path` (below it) replaced by `leaf`, or with it
    /// removed when `leaf` is `None`; `None` when nothing is left.
    fn with(self: &Arc<Self>, path: &[String], leaf: Option<Arc<LookupNode>>) -> Option<Arc<Self>> {
        let Some((first, rest)) = path.split_first() else {
            return leaf;
        };
        let mut children = self.children.clone();
        let (before, child) = match children.get(first.as_str()) {
            Some(child) => (child.count, child.with(rest, leaf)),
            None => (0, Arc::new(LookupNode::default()).with(rest, leaf)),
        };
        // The count changes by the replaced child's, without summing every child.
        let count = self.count - before + child.as_ref().map_or(0, |child| child.count);
        match child {
            Some(child) => {
                children.insert(Box::from(first.as_str()), child);
            }
            None => {
                children.remove(first.as_str());
            }
        }
        (!children.is_empty()).then(|| {
            Arc::new(LookupNode {
                count,
                children,
                ..LookupNode::default()
            })
        })
    }
}

/// A node while the index is built from all objects: objects are collected before
/// the nodes become shared.
#[derive(Default)]
struct NodeBuilder {
    objects: Vec<Value>,
    children: foldhash::HashMap<Box<str>, NodeBuilder>,
}

impl NodeBuilder {
    fn finish(self) -> Arc<LookupNode> {
        if self.children.is_empty() {
            return Arc::new(LookupNode::leaf(self.objects));
        }
        let mut children = Children::default();
        for (key, child) in self.children {
            children.insert(key, child.finish());
        }
        Arc::new(LookupNode::inner(children))
    }
}

/// How many updates a store remembers (see [`ResourceStore::history`]).
const HISTORY: usize = 16;

/// One update of a store (see [`ResourceStore::history`]).
#[derive(Debug)]
struct Step {
    from: u64,
    touched: Vec<Arc<[String]>>,
}

impl fmt::Debug for ResourceStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `debug()` and `pprint` show the object count, which depends on every object.
        record(|| Read::List(self.name.clone()));
        f.debug_struct("ResourceStore")
            .field("name", &self.name)
            .field("objects", &self.len())
            .finish()
    }
}

impl ResourceStore {
    /// A store with no snapshot yet: every lookup finds nothing.
    pub fn empty(name: impl Into<Arc<str>>) -> Self {
        Self {
            name: name.into(),
            generation: 0,
            history: Arc::from([]),
            snapshot: None,
            values: imbl::OrdMap::new(),
            list: OnceLock::new(),
            previous_list: Mutex::new(None),
            sort_base: Mutex::new(None),
            lookup: OnceLock::new(),
            lookup_base: Mutex::new(None),
        }
    }

    /// A store over `snapshot`, with a lazy value for every object.
    pub fn from_snapshot(name: impl Into<Arc<str>>, snapshot: Arc<ResourceSnapshot>) -> Self {
        Self::empty(name).updated(snapshot, None)
    }

    /// The store after an update: objects named in `change` get new lazy values, the
    /// rest keep theirs (with their tapes and remembered sort orders). Without a
    /// change report, or when the report does not add up, every object is checked
    /// against the cache.
    pub fn updated(
        &self,
        snapshot: Arc<ResourceSnapshot>,
        change: Option<&ResourceChange>,
    ) -> Self {
        let mut values = self.values.clone();
        let incremental = match (change, &self.snapshot) {
            (Some(change), Some(old)) => {
                for key in change.removed.iter().chain(&change.modified) {
                    if let Some(object) = old.get_by_key(key) {
                        values.remove(&address(object));
                    }
                }
                for key in change.added.iter().chain(&change.modified) {
                    if let Some(object) = snapshot.get_by_key(key) {
                        values.insert(address(object), to_value(object));
                    }
                }
                values.len() == snapshot.len()
            }
            _ => false,
        };
        let touched_now = match (change, &self.snapshot) {
            (Some(change), Some(old)) if incremental && old.index_by() == snapshot.index_by() => {
                let mut touched: Vec<Arc<[String]>> = Vec::new();
                for key in change.removed.iter().chain(&change.modified) {
                    touched.extend(old.index_key(key).map(Arc::from));
                }
                for key in change.added.iter().chain(&change.modified) {
                    touched.extend(snapshot.index_key(key).map(Arc::from));
                }
                Some(touched)
            }
            _ => None,
        };
        let lookup_base = touched_now.as_ref().and_then(|touched| {
            let (root, mut all) = match self.lookup.get() {
                Some(lookup) => (lookup.root.clone(), Vec::new()),
                None => {
                    let base = self
                        .lookup_base
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    let base = base.as_ref()?;
                    (base.root.clone(), base.touched.clone())
                }
            };
            all.extend(touched.iter().cloned());
            // Past a quarter of the objects, building from all of them is as cheap.
            (all.len() <= snapshot.len() / 4 + 16).then_some(LookupBase { root, touched: all })
        });
        let history = match touched_now {
            Some(touched) => {
                let step = Step {
                    from: self.generation,
                    touched,
                };
                std::iter::once(step)
                    .chain(self.history.iter().take(HISTORY - 1).map(|s| Step {
                        from: s.from,
                        touched: s.touched.clone(),
                    }))
                    .collect()
            }
            _ => Arc::from([]),
        };
        // Only what an update reported: the objects it did not name keep their values.
        let sort_base = self
            .list
            .get()
            .filter(|_| incremental)
            .and_then(|list| list.downcast_object_ref::<ResourceList>())
            .map(ResourceList::base_for_next)
            .filter(|base| !base.orders.is_empty());
        let previous_list = self.list.get().filter(|_| incremental).cloned();
        if !incremental {
            let mut rebuilt = imbl::OrdMap::new();
            for object in snapshot.list() {
                let key = address(object);
                let value = match values.get(&key) {
                    Some(value) => value.clone(),
                    None => to_value(object),
                };
                rebuilt.insert(key, value);
            }
            values = rebuilt;
        }
        Self {
            name: self.name.clone(),
            generation: next_generation(),
            history,
            snapshot: Some(snapshot),
            values,
            list: OnceLock::new(),
            previous_list: Mutex::new(previous_list),
            sort_base: Mutex::new(sort_base),
            lookup: OnceLock::new(),
            lookup_base: Mutex::new(lookup_base),
        }
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.snapshot.as_ref().map_or(0, |s| s.len())
    }

    /// True when the store holds no objects.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn value_of(&self, object: &StoredObject) -> Value {
        match self.values.get(&address(object)) {
            Some(value) => value.clone(),
            None => to_value(object),
        }
    }

    /// Every object's value in the snapshot's order, with its address. The values
    /// of the objects `previous` (the last version's list) holds are taken from it
    /// in one walk (both lists are in key order, and an object this version
    /// dropped is passed over): an update of one of 10,000 objects looks up the
    /// values of the objects it touched, not of every object.
    fn list_items(
        &self,
        snapshot: &ResourceSnapshot,
        previous: Option<&Value>,
    ) -> (Vec<Value>, Vec<usize>) {
        let old = previous
            .and_then(|list| list.downcast_object_ref::<ResourceList>())
            .filter(|old| old.addresses.len() == old.items.len());
        let mut items = Vec::with_capacity(snapshot.len());
        let mut addresses = Vec::with_capacity(snapshot.len());
        let mut at = 0;
        for object in snapshot.list() {
            let here = address(object);
            let value = match old {
                Some(old) => {
                    // Objects of the last version that are gone (removed, or
                    // changed: a changed object is a new one) are passed over. The
                    // old list holds its objects, so no new object has the address
                    // of one of them.
                    while at < old.addresses.len()
                        && old.addresses[at] != here
                        && !self.values.contains_key(&old.addresses[at])
                    {
                        at += 1;
                    }
                    if old.addresses.get(at) == Some(&here) {
                        at += 1;
                        old.items[at - 1].clone()
                    } else {
                        self.value_of(object)
                    }
                }
                None => self.value_of(object),
            };
            items.push(value);
            addresses.push(here);
        }
        (items, addresses)
    }

    /// `list()`: every object in the snapshot's order, one shared value per version.
    pub(crate) fn list_value(&self) -> Value {
        record(|| Read::List(self.name.clone()));
        self.list
            .get_or_init(|| match &self.snapshot {
                Some(snapshot) => {
                    let base = self
                        .sort_base
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .take();
                    let previous = self
                        .previous_list
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .take();
                    let (items, addresses) = self.list_items(snapshot, previous.as_ref());
                    ResourceList::of_store(items, addresses, base)
                }
                None => ResourceList::value(Vec::new()),
            })
            .clone()
    }

    /// One lookup key of a `fetch`/`get` call: a string as it is, a number or boolean
    /// in its JSON spelling.
    fn key<'a>(&self, method: &str, arg: &'a Value) -> Result<Cow<'a, str>, Error> {
        if let Some(text) = arg.as_str() {
            Ok(Cow::Borrowed(text))
        } else if arg.is_number() || arg.kind() == ValueKind::Bool {
            Ok(Cow::Owned(arg.to_string()))
        } else {
            Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "resources.{}.{method}(): index keys must be strings, got {}",
                    self.name,
                    arg.kind()
                ),
            ))
        }
    }

    /// The lookup keys of a `fetch`/`get` call (see [`Self::key`]).
    fn keys<'a>(&self, method: &str, args: &'a [Value]) -> Result<Vec<Cow<'a, str>>, Error> {
        args.iter().map(|arg| self.key(method, arg)).collect()
    }

    /// `fetch`/`get`: the index node of the keys (`None`: nothing matches), or the
    /// objects as a list when the index cannot answer (no keys, or too many).
    fn lookup(&self, method: &str, args: &[Value]) -> Result<Found<'_>, Error> {
        record(|| match self.keys(method, args) {
            Ok(keys) if !keys.is_empty() => Read::Lookup(
                self.name.clone(),
                LookupKeys::new(keys.into_iter().map(Cow::into_owned).collect()),
            ),
            // Everything, or an error: depends on every object.
            _ => Read::List(self.name.clone()),
        });
        self.find(method, args)
    }

    /// [`Self::lookup`] without noting a read.
    fn find(&self, method: &str, args: &[Value]) -> Result<Found<'_>, Error> {
        let Some(snapshot) = &self.snapshot else {
            self.keys(method, args)?;
            return Ok(Found::Node(None));
        };
        if args.is_empty() || args.len() > snapshot.index_by().len() {
            let keys = self.keys(method, args)?;
            // No keys (everything, in index order) or an error: rare, ask the snapshot.
            let found = snapshot.fetch(&keys).map_err(|error| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    format!("resources.{}.{method}(): {error}", self.name),
                )
            })?;
            return Ok(Found::List(
                found.into_iter().map(|o| self.value_of(o)).collect(),
            ));
        }
        // The common case: one hash probe per key, no allocation. Every key is
        // checked, also after a miss.
        let lookup = self.lookup.get_or_init(|| self.build_lookup(snapshot));
        let mut node = Some(&*lookup.root);
        for arg in args {
            let key = self.key(method, arg)?;
            node = node.and_then(|node| node.children.get(key.as_ref()).map(|n| &**n));
        }
        Ok(Found::Node(node))
    }

    /// The matching objects as one list value (shared, not copied).
    fn fetch(&self, args: &[Value]) -> Result<Value, Error> {
        Ok(match self.lookup("fetch", args)? {
            Found::Node(Some(node)) => node.list(),
            Found::Node(None) => ResourceList::value(Vec::new()),
            Found::List(list) => ResourceList::value(list),
        })
    }

    /// The one matching object, `none` when nothing matches, an error for several.
    fn get(&self, args: &[Value]) -> Result<Value, Error> {
        let (count, single) = match self.lookup("get", args)? {
            Found::Node(Some(node)) => (node.count, node.single()),
            Found::Node(None) => (0, Value::UNDEFINED),
            Found::List(list) => (list.len(), list.into_iter().next().unwrap_or_default()),
        };
        match count {
            0 => Ok(Value::from(())),
            1 => Ok(single),
            count => Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "resources.{}.get({}): expected at most one object, found {count}; use fetch() for several",
                    self.name,
                    self.keys("get", args)?
                        .iter()
                        .map(|k| format!("{k:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }

    /// `has(keys..., fields=[...])`: whether `get(keys...)` finds an object and every
    /// listed field of it is set (Jinja's truthiness: a non-empty string, list or
    /// mapping, `true`, a non-zero number). The read noted is that answer only, so a
    /// change to the object that leaves it as it was (a renewed certificate's data)
    /// does not make the file render again.
    fn has(&self, args: &[Value]) -> Result<Value, Error> {
        let (args, kwargs) = match args.split_last() {
            Some((last, rest)) if last.is_kwargs() => (rest, Some(Kwargs::try_from(last.clone())?)),
            _ => (args, None),
        };
        let fields: Arc<[Arc<[String]>]> = match &kwargs {
            Some(kwargs) => {
                let fields = match kwargs.get::<Option<Value>>("fields")? {
                    Some(fields) => self.fields(&fields)?,
                    None => Arc::from([]),
                };
                kwargs.assert_all_used()?;
                fields
            }
            None => Arc::from([]),
        };
        let keys = self.keys("has", args)?;
        let depth = self
            .snapshot
            .as_ref()
            .map_or(usize::MAX, |s| s.index_by().len());
        if keys.is_empty() || keys.len() > depth {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "resources.{}.has() takes 1 to {depth} index keys, got {}",
                    self.name,
                    keys.len()
                ),
            ));
        }
        let answer = self.has_answer(&keys, &fields)?;
        record(|| {
            Read::Has(Arc::new(HasRead {
                name: self.name.clone(),
                keys: LookupKeys::new(keys.iter().map(|k| k.to_string()).collect()),
                fields: fields.clone(),
                answer,
            }))
        });
        Ok(Value::from(answer))
    }

    /// The `fields=` argument of `has()`: a list of fields, each a dotted path
    /// (`"spec.rules"`) or a list of keys (`["data", "tls.crt"]`, for keys with dots).
    fn fields(&self, fields: &Value) -> Result<Arc<[Arc<[String]>]>, Error> {
        let invalid = || {
            Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "resources.{}.has(): fields= takes a list of dotted paths or lists of keys, got {fields}",
                    self.name
                ),
            )
        };
        if fields.kind() != ValueKind::Seq {
            return Err(invalid());
        }
        let mut out = Vec::new();
        for field in fields.try_iter().map_err(|_| invalid())? {
            let path: Vec<String> = if let Some(text) = field.as_str() {
                text.split('.').map(str::to_owned).collect()
            } else if field.kind() == ValueKind::Seq {
                field
                    .try_iter()
                    .map_err(|_| invalid())?
                    .map(|key| key.as_str().map(str::to_owned).ok_or_else(invalid))
                    .collect::<Result<_, _>>()?
            } else {
                return Err(invalid());
            };
            if path.is_empty() || path.iter().any(String::is_empty) {
                return Err(invalid());
            }
            out.push(Arc::from(path));
        }
        Ok(out.into())
    }

    /// The answer of `has(keys..., fields=...)` over this version, without noting a
    /// read; an error when several objects match (as for `get`).
    fn has_answer<K: AsRef<str>>(
        &self,
        keys: &[K],
        fields: &[Arc<[String]>],
    ) -> Result<bool, Error> {
        let Some(snapshot) = &self.snapshot else {
            return Ok(false);
        };
        let lookup = self.lookup.get_or_init(|| self.build_lookup(snapshot));
        let mut node = Some(&*lookup.root);
        for key in keys {
            node = node.and_then(|node| node.children.get(key.as_ref()).map(|n| &**n));
        }
        let Some(node) = node else {
            return Ok(false);
        };
        match node.count {
            0 => Ok(false),
            1 => {
                let object = node.single();
                Ok(fields.iter().all(|path| field_set(&object, path)))
            }
            count => Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "resources.{}.has({}): expected at most one object, found {count}",
                    self.name,
                    keys.iter()
                        .map(|k| format!("{:?}", k.as_ref()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }

    fn build_lookup(&self, snapshot: &ResourceSnapshot) -> Lookup {
        // The snapshot's index order (index values, then object key) is its fetch
        // order, and the index values were computed when the objects were stored.
        let base = self
            .lookup_base
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(LookupBase { root, touched }) = base {
            // Redo only the paths an update touched, from this version's objects.
            let mut root = Some(root);
            let mut done: foldhash::HashSet<&[String]> = foldhash::HashSet::default();
            for path in &touched {
                if !done.insert(path) {
                    continue;
                }
                let objects: Vec<Value> = snapshot
                    .fetch(path)
                    .map(|found| found.into_iter().map(|o| self.value_of(o)).collect())
                    .unwrap_or_default();
                let leaf = (!objects.is_empty()).then(|| Arc::new(LookupNode::leaf(objects)));
                root = root.unwrap_or_default().with(path, leaf);
            }
            return Lookup {
                root: root.unwrap_or_default(),
            };
        }
        let mut root = NodeBuilder::default();
        for (index, _, object) in snapshot.iter_indexed() {
            let mut node = &mut root;
            for key in index {
                node = node.children.entry(Box::from(key.as_str())).or_default();
            }
            node.objects.push(self.value_of(object));
        }
        Lookup {
            root: root.finish(),
        }
    }
}

/// Whether the field at `path` of an object is set: present, and true as Jinja
/// tests it. A key that is a number indexes a list.
fn field_set(object: &Value, path: &[String]) -> bool {
    let mut value = object.clone();
    for key in path {
        let next = if value.kind() == ValueKind::Seq {
            match key.parse::<usize>() {
                Ok(index) => value.get_item(&Value::from(index)),
                Err(_) => return false,
            }
        } else {
            value.get_item(&Value::from(key.as_str()))
        };
        match next {
            Ok(next) if !next.is_undefined() && !next.is_none() => value = next,
            _ => return false,
        }
    }
    value.is_true()
}

/// What `fetch`/`get` found: an index node, or (without usable keys) a list.
enum Found<'a> {
    Node(Option<&'a LookupNode>),
    List(Vec<Value>),
}

impl Object for ResourceStore {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let item = self.list_value().get_item(key).ok()?;
        (!item.is_undefined()).then_some(item)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        record(|| Read::List(self.name.clone()));
        Enumerator::Seq(self.len())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        record(|| Read::List(self.name.clone()));
        Some(self.len())
    }

    fn call_method(
        self: &Arc<Self>,
        _state: &mut State<'_, '_>,
        method: &str,
        args: &[Value],
    ) -> Result<Value, Error> {
        match method {
            "list" => {
                if !args.is_empty() {
                    return Err(Error::new(
                        ErrorKind::TooManyArguments,
                        format!("resources.{}.list() takes no arguments", self.name),
                    ));
                }
                Ok(self.list_value())
            }
            "fetch" => self.fetch(args),
            "get" => self.get(args),
            "has" => self.has(args),
            // Not UnknownMethod: that would hand the call to the Python-compatibility
            // fallback and lose this message.
            _ => Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "resources.{} has no method {method}(); use list(), fetch(keys...), get(keys...) or has(keys...)",
                    self.name
                ),
            )),
        }
    }
}

// === reads ===

/// The source of [`ResourceStore`] generations.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

fn next_generation() -> u64 {
    GENERATIONS.fetch_add(1, Ordering::Relaxed)
}

/// One thing a template read from the resources while rendering: what its output
/// can depend on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Read {
    /// Every object of a store: `list()`, iterating the store, its length, a
    /// `fetch()` without keys.
    List(Arc<str>),
    /// The objects a `fetch(keys...)`/`get(keys...)` finds (the objects whose leading
    /// index values are these keys). The keys are shared: a reused snippet output's
    /// reads are copied into the reads of the file that includes it, once per render.
    Lookup(Arc<str>, LookupKeys),
    /// The answer of a `has(keys..., fields=...)`: the file depends on that answer
    /// only, not on the rest of the object.
    Has(Arc<HasRead>),
}

/// A [`Read::Has`]: the call and what it answered.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct HasRead {
    name: Arc<str>,
    keys: LookupKeys,
    fields: Arc<[Arc<[String]>]>,
    answer: bool,
}

/// Hashes the store, the keys' fingerprint and the answer, not the fields: equal
/// reads still hash alike, and a loop that reuses 10,000 iterations adds their
/// reads to a set without hashing every field path again.
impl std::hash::Hash for HasRead {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.keys.hash(state);
        self.answer.hash(state);
    }
}

/// The keys of a [`Read::Lookup`], with a fingerprint of them ([`keys_print`]) kept
/// beside them: a change to one object is checked against the reads of every object
/// a file in pieces holds, and comparing fingerprints does not read the keys' text.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct LookupKeys {
    keys: Arc<[String]>,
    print: u64,
}

/// Hashes the fingerprint alone (equal keys have equal fingerprints).
impl std::hash::Hash for LookupKeys {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.print);
    }
}

impl LookupKeys {
    fn new(keys: Arc<[String]>) -> Self {
        let print = keys_print(&keys);
        Self { keys, print }
    }
}

/// A fingerprint of a list of keys: equal lists have equal fingerprints.
fn keys_print(keys: &[String]) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = foldhash::fast::FixedState::with_seed(0).build_hasher();
    for key in keys {
        hasher.write_usize(key.len());
        hasher.write(key.as_bytes());
    }
    hasher.finish()
}

thread_local! {
    /// The reads of the file rendering on this thread (see [`Recording`]).
    // A hash set: a file of 10,000 backends makes over 100,000 lookups, and an
    // ordered set spent more on comparing keys than the lookups themselves cost.
    static READS: RefCell<Option<Recorded>> = const { RefCell::new(None) };
}

/// Lists of reads kept as they are (the reads of a folded loop's iterations,
/// which the loop keeps for the next render): persistent, so noting them costs
/// nothing per item.
pub(crate) type ReadLists = imbl::Vector<Arc<[Read]>>;

/// What a [`Recording`] noted so far.
#[derive(Default)]
struct Recorded {
    reads: foldhash::HashSet<Read>,
    /// Lists noted whole ([`record_lists`]).
    lists: Vec<ReadLists>,
}

/// Notes a read when a [`Recording`] is active on this thread.
fn record(read: impl FnOnce() -> Read) {
    READS.with(|reads| {
        if let Some(recorded) = reads.borrow_mut().as_mut() {
            recorded.reads.insert(read());
        }
    });
}

/// Notes reads made elsewhere (by a snippet whose cached output is used) when a
/// [`Recording`] is active on this thread.
pub(crate) fn record_all(found: &[Read]) {
    READS.with(|reads| {
        if let Some(recorded) = reads.borrow_mut().as_mut() {
            recorded.reads.extend(found.iter().cloned());
        }
    });
}

/// [`record_all`] of several lists of reads at once (a loop's iterations): the
/// set grows once for all of them rather than step by step.
pub(crate) fn record_each<'a>(lists: impl Iterator<Item = &'a [Read]> + Clone) {
    READS.with(|reads| {
        if let Some(recorded) = reads.borrow_mut().as_mut() {
            recorded
                .reads
                .reserve(lists.clone().map(<[Read]>::len).sum());
            for found in lists {
                recorded.reads.extend(found.iter().cloned());
            }
        }
    });
}

/// Notes `lists` whole: [`Recording::finish_apart`] hands them on as they are
/// (a folded loop's 10,000 iterations are not put into the file's set one by one),
/// [`Recording::finish`] with the other reads.
pub(crate) fn record_lists(lists: &ReadLists) {
    READS.with(|reads| {
        if let Some(recorded) = reads.borrow_mut().as_mut() {
            recorded.lists.push(lists.clone());
        }
    });
}

/// Collects every resource read on this thread while it lives: a file renders on
/// one thread from start to end, so its reads are exactly those made between
/// [`Recording::start`] and [`Recording::finish`]. Nests (the outer recording is
/// put back when an inner one finishes).
pub(crate) struct Recording {
    outer: Option<Recorded>,
}

impl Recording {
    /// Starts recording on this thread.
    pub(crate) fn start() -> Self {
        let outer = READS.with(|reads| reads.borrow_mut().replace(Recorded::default()));
        Self { outer }
    }

    /// The reads since [`Recording::start`].
    pub(crate) fn finish(self) -> Vec<Read> {
        let (mut reads, lists) = self.take();
        for list in lists {
            for found in &list {
                reads.extend(found.iter().cloned());
            }
        }
        reads.into_iter().collect()
    }

    /// The reads since [`Recording::start`], with the lists noted whole
    /// ([`record_lists`]) apart: a read may be in both.
    pub(crate) fn finish_apart(self) -> (Vec<Read>, Vec<ReadLists>) {
        let (reads, lists) = self.take();
        (reads.into_iter().collect(), lists)
    }

    fn take(mut self) -> (foldhash::HashSet<Read>, Vec<ReadLists>) {
        let outer = self.outer.take();
        READS
            .with(|reads| std::mem::replace(&mut *reads.borrow_mut(), outer))
            .map(|recorded| (recorded.reads, recorded.lists))
            .unwrap_or_default()
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if let Some(outer) = self.outer.take() {
            READS.with(|reads| *reads.borrow_mut() = Some(outer));
        }
    }
}

/// The objects of a `fetch(keys...)` on one store version.
fn lookup_objects<'a>(store: &'a ResourceStore, keys: &[String]) -> Option<Vec<&'a StoredObject>> {
    store.snapshot.as_ref()?.fetch(keys).ok()
}

/// Whether two lookups found the same objects with the same content, in the same
/// order (the same object, or an equal text).
fn same_objects(a: &[&StoredObject], b: &[&StoredObject]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(a, b)| address(a) == address(b) || a.json() == b.json())
}

impl Read {
    fn store(&self) -> &Arc<str> {
        match self {
            Self::List(name) | Self::Lookup(name, _) => name,
            Self::Has(has) => &has.name,
        }
    }

    /// The index keys of a lookup (`None`: a read of every object).
    fn keys(&self) -> Option<&LookupKeys> {
        match self {
            Self::List(_) => None,
            Self::Lookup(_, keys) => Some(keys),
            Self::Has(has) => Some(&has.keys),
        }
    }

    /// Whether this read gives the same answer over `new` as it gave over `old`:
    /// the same objects, with the same content, in the same order.
    pub(crate) fn unchanged(&self, old: &Resources, new: &Resources) -> bool {
        let (old, new) = (old.get(self.store()), new.get(self.store()));
        self.unchanged_in(&StoreDiff::between(old, new), old, new)
    }

    /// [`Self::unchanged`], given what changed in its store (`old` to `new`).
    fn unchanged_in(
        &self,
        diff: &StoreDiff<'_>,
        old: Option<&Arc<ResourceStore>>,
        new: Option<&Arc<ResourceStore>>,
    ) -> bool {
        let keys = match (diff, self.keys()) {
            (StoreDiff::Same, _) => return true,
            (_, None) => return false,
            (_, Some(keys)) => &keys.keys,
        };
        if let StoreDiff::Touched(steps) = diff {
            // Unchanged when no update since `old` touched an object under its keys.
            let touched = steps
                .iter()
                .flat_map(|step| &step.touched)
                .any(|touched| touched.starts_with(keys));
            if !touched {
                return true;
            }
        }
        if let Self::Has(has) = self {
            // The same answer over the new version, whatever else changed.
            return new
                .map_or(Ok(false), |new| new.has_answer(keys, &has.fields))
                .is_ok_and(|answer| answer == has.answer);
        }
        if let StoreDiff::Touched(_) = diff {
            return false;
        }
        let (Some(old), Some(new)) = (old, new) else {
            // A store without data answers nothing; the other might answer.
            let answer = old.or(new).and_then(|s| lookup_objects(s, keys));
            return answer.is_some_and(|found| found.is_empty());
        };
        let same_index = match (&old.snapshot, &new.snapshot) {
            (Some(a), Some(b)) => a.index_by() == b.index_by(),
            _ => false,
        };
        same_index
            && matches!(
                (lookup_objects(old, keys), lookup_objects(new, keys)),
                (Some(a), Some(b)) if same_objects(&a, &b)
            )
    }
}

/// What changed in one store between two versions.
#[derive(Clone, Copy)]
enum StoreDiff<'a> {
    /// Nothing (the same generation): every read of it is unchanged.
    Same,
    /// The updates since the old version, from the new store's history.
    Touched(&'a [Step]),
    /// Not known from the history: each lookup compares what it finds.
    Unknown,
}

impl<'a> StoreDiff<'a> {
    fn between(old: Option<&Arc<ResourceStore>>, new: Option<&'a Arc<ResourceStore>>) -> Self {
        let generation = |store: Option<&Arc<ResourceStore>>| store.map_or(0, |s| s.generation);
        if generation(old) == generation(new) {
            return Self::Same;
        }
        let (Some(old), Some(new)) = (old, new) else {
            return Self::Unknown;
        };
        match new.history.iter().position(|s| s.from == old.generation) {
            Some(position) => Self::Touched(&new.history[..=position]),
            None => Self::Unknown,
        }
    }
}

/// Checks many reads against the same two resource versions
/// ([`Read::unchanged`]), working out once per store what changed between them: a
/// file in pieces checks the reads of every snippet output it holds, one per object.
pub(crate) struct ReadCheck<'a> {
    old: &'a Resources,
    new: &'a Resources,
    /// Per store name seen: its two versions and what changed between them.
    stores: std::cell::RefCell<Vec<SeenStore<'a>>>,
}

type SeenStore<'a> = (
    Arc<str>,
    Option<&'a Arc<ResourceStore>>,
    Option<&'a Arc<ResourceStore>>,
    StoreDiff<'a>,
    TouchedPrints,
);

/// For a store whose updates since the old version are known: the length and
/// fingerprint of every leading part of every key they touched. A lookup whose keys'
/// length and fingerprint are not among them cannot be a leading part of a touched
/// key, so it is unchanged without comparing keys.
type TouchedPrints = Option<Vec<(usize, u64)>>;

fn touched_prints(diff: &StoreDiff<'_>) -> TouchedPrints {
    let StoreDiff::Touched(steps) = diff else {
        return None;
    };
    let mut prints: Vec<(usize, u64)> = steps
        .iter()
        .flat_map(|step| &step.touched)
        .flat_map(|touched| (1..=touched.len()).map(|n| (n, keys_print(&touched[..n]))))
        .collect();
    prints.sort_unstable();
    prints.dedup();
    Some(prints)
}

impl<'a> ReadCheck<'a> {
    pub(crate) fn new(old: &'a Resources, new: &'a Resources) -> Self {
        Self {
            old,
            new,
            stores: std::cell::RefCell::new(Vec::new()),
        }
    }

    /// [`Read::unchanged`] over the two versions.
    pub(crate) fn unchanged(&self, read: &Read) -> bool {
        let name = read.store();
        let mut stores = self.stores.borrow_mut();
        let index = match stores
            .iter()
            .position(|(seen, ..)| Arc::ptr_eq(seen, name) || seen == name)
        {
            Some(index) => index,
            None => {
                let (old, new) = (self.old.get(name), self.new.get(name));
                let diff = StoreDiff::between(old, new);
                let prints = touched_prints(&diff);
                stores.push((name.clone(), old, new, diff, prints));
                stores.len() - 1
            }
        };
        let (_, old, new, diff, prints) = &stores[index];
        if let (Some(prints), Some(keys)) = (prints, read.keys())
            && prints
                .binary_search(&(keys.keys.len(), keys.print))
                .is_err()
        {
            return true;
        }
        read.unchanged_in(diff, *old, *new)
    }
}

// === impl Resources ===

/// The latest template view of every watched resource. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Resources {
    stores: BTreeMap<Arc<str>, Arc<ResourceStore>>,
}

impl Resources {
    /// No resources yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies a `ResourceIndexUpdated`: wraps what changed, keeps the rest.
    pub fn update(
        &mut self,
        source: &Arc<str>,
        snapshot: Arc<ResourceSnapshot>,
        change: Option<&ResourceChange>,
    ) {
        let store = match self.stores.get(source) {
            Some(old) => old.updated(snapshot, change),
            None => ResourceStore::from_snapshot(source.clone(), snapshot),
        };
        self.stores.insert(source.clone(), Arc::new(store));
    }

    /// The snapshot behind every store, by watched resource name: the data a render
    /// from these resources sees.
    pub fn snapshots(&self) -> BTreeMap<Arc<str>, Arc<ResourceSnapshot>> {
        self.stores
            .iter()
            .filter_map(|(name, store)| Some((name.clone(), store.snapshot.clone()?)))
            .collect()
    }

    /// The store of one source.
    pub fn get(&self, source: &str) -> Option<&Arc<ResourceStore>> {
        self.stores.get(source)
    }

    /// The `resources` value of the template context: one entry per watched name
    /// (sources without data yet are empty).
    pub(crate) fn context_value(&self, watched: &[Arc<str>]) -> Value {
        let mut map: BTreeMap<Arc<str>, Value> = BTreeMap::new();
        for name in watched {
            let store = match self.stores.get(name) {
                Some(store) => store.clone(),
                None => Arc::new(ResourceStore::empty(name.clone())),
            };
            map.insert(name.clone(), Value::from_dyn_object(store));
        }
        Value::from(map)
    }
}

// === impl SharedList ===

/// A list built with `shared.append` or `shared.put`: a persistent vector, so an
/// append shares the items already there instead of copying them (a template that
/// appends once per object would otherwise copy the list once per object), while a
/// list read earlier with `shared.get` keeps the items it had. To templates it is a
/// plain list.
#[derive(Debug)]
struct SharedList {
    items: imbl::Vector<Value>,
    /// For a keyed list (`shared.put`): each key's place in `items`.
    keys: Option<imbl::OrdMap<String, usize>>,
}

/// The items of a list built in `shared` (`append` or `put`), borrowed: a filter
/// that walks thousands of them reads them in place, and can tell the items of a
/// list from the last render that are still there ([`super::functions`]'s
/// `map_lines`).
pub(crate) fn shared_items(value: &Value) -> Option<&imbl::Vector<Value>> {
    value
        .downcast_object_ref::<SharedList>()
        .map(|list| &list.items)
}

impl SharedList {
    fn appended(items: imbl::Vector<Value>) -> Value {
        Value::from_object(Self { items, keys: None })
    }
}

impl Object for SharedList {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let index = i64::try_from(key.clone()).ok()?;
        let index = if index < 0 {
            index + self.items.len() as i64
        } else {
            index
        };
        self.items.get(usize::try_from(index).ok()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.mapped_enumerator(|this| Box::new(this.items.iter().cloned()))
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.items.len())
    }
}

// === impl Shared ===

/// `shared`: a memo that lives for one render (`haproxy.cfg`, then every map, file
/// and certificate), so a value computed once can be reused by later templates.
///
/// `shared.get(key, default=none)`, `shared.set(key, value)`,
/// `shared.setdefault(key, value)`, `shared.append(key, item)`,
/// `shared.put(key, entry, item)` (a keyed list: a new entry goes at the end, an
/// entry put again is replaced where it is), `shared.has(key)`, `shared.keys()`;
/// `shared.key` and `shared["key"]` read. `set`, `append` and `put` return an empty
/// string, so `{{ shared.set("k", v) }}` prints nothing.
/// What `shared` holds: its keys in order, as `shared.keys()` lists them.
pub(crate) type SharedValues = imbl::OrdMap<String, Value>;

#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// A persistent map: what a file left here is kept for the next render
    /// ([`Self::snapshot`]) without copying tens of thousands of entries.
    values: Mutex<SharedValues>,
    /// How many times a template wrote to it (`set`, `setdefault`, `append`): a file
    /// that leaves it unchanged needs no snapshot of it to be reused.
    writes: AtomicU64,
}

impl Shared {
    /// How many writes so far (see [`Self::writes`]).
    pub(crate) fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    fn wrote(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    /// What `shared` holds now.
    pub(crate) fn snapshot(&self) -> SharedValues {
        self.lock().clone()
    }

    /// Makes `shared` hold what it held when `snapshot` was taken (values are never
    /// changed in place: `set` and `append` store new values).
    pub(crate) fn restore(&self, snapshot: &SharedValues) {
        *self.lock() = snapshot.clone();
    }

    /// The keys, in order.
    fn sorted_keys(&self) -> Vec<Value> {
        self.lock()
            .keys()
            .map(|k| Value::from(k.as_str()))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SharedValues> {
        self.values
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn key_arg(
    method: &str,
    args: &[Value],
    count: std::ops::RangeInclusive<usize>,
) -> Result<String, Error> {
    if !count.contains(&args.len()) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "shared.{method}() takes {} arguments, got {}",
                if count.start() == count.end() {
                    count.start().to_string()
                } else {
                    format!("{} to {}", count.start(), count.end())
                },
                args.len()
            ),
        ));
    }
    args[0].as_str().map(str::to_owned).ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "shared.{method}(): the key must be a string, got {}",
                args[0].kind()
            ),
        )
    })
}

impl Object for Shared {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.lock().get(key.as_str()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.sorted_keys())
    }

    fn call_method(
        self: &Arc<Self>,
        _state: &mut State<'_, '_>,
        method: &str,
        args: &[Value],
    ) -> Result<Value, Error> {
        match method {
            "get" => {
                let key = key_arg(method, args, 1..=2)?;
                Ok(self
                    .lock()
                    .get(&key)
                    .cloned()
                    .unwrap_or_else(|| args.get(1).cloned().unwrap_or(Value::from(()))))
            }
            "set" => {
                let key = key_arg(method, args, 2..=2)?;
                self.wrote();
                self.lock().insert(key, args[1].clone());
                Ok(Value::from(""))
            }
            "setdefault" => {
                let key = key_arg(method, args, 2..=2)?;
                self.wrote();
                Ok(self
                    .lock()
                    .entry(key)
                    .or_insert_with(|| args[1].clone())
                    .clone())
            }
            "append" => {
                let key = key_arg(method, args, 2..=2)?;
                self.wrote();
                let mut values = self.lock();
                let mut items = match values.get(&key) {
                    None => imbl::Vector::new(),
                    Some(existing) => match existing.downcast_object_ref::<SharedList>() {
                        Some(SharedList { keys: Some(_), .. }) => {
                            return Err(Error::new(
                                ErrorKind::InvalidOperation,
                                format!(
                                    "shared.append(): `{key}` is a keyed list (built with \
                                     shared.put); add to it with put"
                                ),
                            ));
                        }
                        Some(list) => list.items.clone(),
                        None => match existing.try_iter() {
                            Ok(iter) if existing.kind() == minijinja::value::ValueKind::Seq => {
                                iter.collect()
                            }
                            _ => {
                                return Err(Error::new(
                                    ErrorKind::InvalidOperation,
                                    format!(
                                        "shared.append(): `{key}` holds a {}, not a list",
                                        existing.kind()
                                    ),
                                ));
                            }
                        },
                    },
                };
                items.push_back(args[1].clone());
                values.insert(key, SharedList::appended(items));
                Ok(Value::from(""))
            }
            "put" => {
                let name = key_arg(method, args, 3..=3)?;
                let Some(entry) = args[1].as_str() else {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!(
                            "shared.put(): the entry's key must be a string, got {}",
                            args[1].kind()
                        ),
                    ));
                };
                self.wrote();
                let mut values = self.lock();
                let (mut items, mut keys) = match values.get(&name) {
                    None => (imbl::Vector::new(), imbl::OrdMap::new()),
                    Some(existing) => match existing.downcast_object_ref::<SharedList>() {
                        Some(SharedList {
                            items,
                            keys: Some(keys),
                        }) => (items.clone(), keys.clone()),
                        _ => {
                            return Err(Error::new(
                                ErrorKind::InvalidOperation,
                                format!(
                                    "shared.put(): `{name}` holds a {}, not a keyed list \
                                     (built with shared.put)",
                                    existing.kind()
                                ),
                            ));
                        }
                    },
                };
                match keys.get(entry) {
                    Some(&place) => {
                        items.set(place, args[2].clone());
                    }
                    None => {
                        keys.insert(entry.to_owned(), items.len());
                        items.push_back(args[2].clone());
                    }
                }
                values.insert(
                    name,
                    Value::from_object(SharedList {
                        items,
                        keys: Some(keys),
                    }),
                );
                Ok(Value::from(""))
            }
            "has" => {
                let key = key_arg(method, args, 1..=1)?;
                Ok(Value::from(self.lock().contains_key(&key)))
            }
            "keys" => Ok(Value::from(self.sorted_keys())),
            _ => Err(Error::new(
                ErrorKind::UnknownMethod,
                format!(
                    "shared has no method {method}(); use get, set, setdefault, append, put, has \
                     or keys"
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::lazy::View;
    use super::*;
    use serde_json::json;

    #[test]
    fn conversion_matches_minijinja_deserialization_with_resource_lists() {
        let objects = [
            json!({
                "metadata": {"name": "a", "labels": {"z": "1", "a": "2", "m": "3"}},
                "spec": {"ports": [{"port": 80, "name": "http"}, {"port": -1}], "empty": [], "x": {}},
                "numbers": [0, 1, -7, 18446744073709551615u64, 1.5, -0.25, 1e300],
                "other": [null, true, false, "", "ünïcödé \u{FDD0}", [[1], []]],
                "long": "a string longer than twenty-two bytes, stored on the heap",
                "annotations": {
                    "kubernetes.io/service-name": "web",
                    "meta.helm.sh/release-namespace": "default",
                    "exactly-twenty-two-byte": "k",
                    "twenty-three-bytes-long": "k",
                },
                "large": large_map(40),
                "inline": large_map(16),
                "nested": {"a": {"b": {"c": {}}}, "empty": {}},
            }),
            json!({}),
            large_map(17),
            json!([]),
            json!("text"),
            json!(null),
        ];
        for object in objects {
            let stored = StoredObject::from_value(&object);
            let ours = to_value(&stored);
            let theirs: Value = stored.deserialize().expect("valid JSON");
            assert_eq!(ours, theirs, "{object}");
            assert_eq!(ours.to_string(), theirs.to_string(), "{object}");
            assert_eq!(
                serde_json::to_string(&ours).expect("serializes"),
                serde_json::to_string(&theirs).expect("serializes"),
                "{object}"
            );
            assert_eq!(ours.kind(), theirs.kind());
        }
        let list = to_value(&StoredObject::from_value(&json!({"a": [3, 1, 2]})))
            .get_attr("a")
            .expect("attribute");
        assert!(
            list.downcast_object_ref::<View>()
                .is_some_and(View::is_array)
        );
        assert_eq!(list.len(), Some(3));
        assert_eq!(list.get_item(&Value::from(-1)).ok(), Some(Value::from(2)));
        assert!(
            !to_value(&StoredObject::from_value(&json!({"a": []})))
                .get_attr("a")
                .expect("attribute")
                .is_true()
        );
    }

    /// `{"key-00": 0, ...}`, keys in reverse order (so written order and key order
    /// differ).
    fn large_map(len: usize) -> serde_json::Value {
        serde_json::Value::Object(
            (0..len)
                .rev()
                .map(|i| (format!("key-{i:02}"), json!(i)))
                .collect(),
        )
    }

    /// The templates of [`templates_see_mappings_as_builtin_maps`], over `obj` (a
    /// resource object), `other` (the same object, always as built-in maps) and
    /// `second` (another object).
    const MAP_TEMPLATES: &[&str] = &[
        "{{ obj.metadata.name }}|{{ obj['metadata']['labels']['app'] }}|{{ obj.metadata.missing is undefined }}|{{ obj['nope'] is undefined }}",
        "{{ 'metadata' in obj }}|{{ 'nope' in obj }}|{{ 'app' in obj.metadata.labels }}|{{ 1 in obj }}|{{ 'key-33' in obj.large }}",
        "{% for k in obj %}{{ k }},{% endfor %}|{% for k in obj.large %}{{ k }},{% endfor %}|{% for k in obj.spec.empty %}x{% else %}none{% endfor %}",
        "{{ obj|length }}|{{ obj.large|length }}|{{ obj.spec.empty|length }}|{% if obj.spec.empty %}T{% else %}F{% endif %}|{% if obj.metadata %}T{% else %}F{% endif %}|{{ obj.spec.empty is true }}|{{ not obj.metadata }}",
        "{% for k, v in obj.metadata.labels|items %}{{ loop.index }}:{{ k }}={{ v }};{% endfor %}|{{ obj.large|items|list }}",
        "{% for k, v in obj.metadata.labels|dictsort %}{{ k }}={{ v }};{% endfor %}|{{ obj.metadata.labels|dictsort(reverse=true) }}|{{ obj.metadata.labels|dictsort(by='value') }}|{{ obj.large|dictsort|first }}",
        "{{ obj.metadata.labels|list }}|{{ obj.large|list }}|{{ obj.metadata.labels|reverse|list }}|{{ obj.metadata.labels|first }}|{{ obj.metadata.labels|join(',') }}",
        "{{ obj|tojson }}|{{ obj.metadata|tojson(indent=2) }}|{{ obj.spec.empty|tojson }}",
        "{{ obj }}|{{ obj.metadata }}|{{ obj.spec.empty }}|{{ obj|pprint }}|{{ obj.metadata|string }}",
        "{{ obj.metadata.labels == other.metadata.labels }}|{{ obj == other }}|{{ other == obj }}|{{ obj.spec == other.metadata }}|{{ obj.metadata != second.metadata }}|{{ obj.large == other.large }}",
        "{{ obj.spec.empty == {} }}|{{ obj.metadata.labels == {'app': 'web', 'tier': 'front', 'zone': 'a'} }}|{{ obj.metadata.labels == {'tier': 'front', 'app': 'web', 'zone': 'a'} }}|{{ obj.metadata.labels == {'app': 'web'} }}",
        "{{ [obj.metadata.labels, second.metadata.labels, {'app': 'a'}]|sort }}|{{ [obj.metadata.labels, other.metadata.labels]|unique|list|length }}|{{ obj.metadata.labels < second.metadata.labels }}",
        "{{ obj.metadata.labels.get('app') }}|{{ obj.metadata.labels.get('nope', 'dflt') }}|{{ obj.metadata.labels.get('nope') }}|{{ obj.large.get('key-07') }}",
        "{{ obj.metadata.labels.items()|list }}|{{ obj.metadata.labels.keys()|list }}|{{ obj.metadata.labels.values()|list }}|{% for k, v in obj.large.items() %}{{ k }}{{ v }}{% endfor %}",
        "{{ obj|attr('kind') }}|{{ obj.metadata|attr('name') }}|{{ obj.metadata|attr('nope') is undefined }}",
        "{{ obj.spec.ports|selectattr('name')|map(attribute='port')|list }}|{{ obj.spec.ports|map(attribute='name', default='x')|join(',') }}|{{ obj.spec.ports|selectattr('name', 'equalto', 'http')|list }}|{{ obj.spec.ports|rejectattr('name')|list }}|{{ [obj, second]|map(attribute='metadata.name')|list }}",
        "{{ obj.spec.ports|sort_by('name', '-port')|map(attribute='port')|join(',') }}|{{ [second, obj]|sort_by('metadata.labels.app')|map(attribute='metadata.name')|list }}|{{ [obj, second]|sort(attribute='metadata.name')|map(attribute='kind')|list }}",
        "{{ obj.metadata.annotations['kubernetes.io/service-name'] }}|{{ obj.metadata.annotations }}|{{ obj.large['key-39'] }}|{{ obj.large.nope is undefined }}",
        "{{ dict(obj.metadata.labels, extra=1) }}|{{ obj.metadata.labels|max }}|{{ obj.metadata.labels|min }}",
        "{% set ns = namespace(m=obj.metadata) %}{{ ns.m.name }}|{{ obj.spec.ports[0] }}|{{ obj.spec.ports|first|items|list }}|{{ obj.spec.ports|map('length')|list }}",
        "{{ obj.metadata.labels|batch(2)|list }}|{{ obj.metadata.labels|slice(2)|list }}",
        "{{ obj.spec.ports|reverse|list }}|{{ obj.spec.ports|last }}|{{ obj.spec.ports[-1] }}|{{ obj.spec.ports[1:] }}|{{ obj.spec.ports[5] is undefined }}|{% for p in obj.spec.ports %}{{ loop.revindex }}{{ loop.last }}{{ loop.length }};{% endfor %}",
        "{{ obj.spec.ports == other.spec.ports }}|{{ obj.spec.ports|first in other.spec.ports }}|{{ 443 in obj.spec.ports|map(attribute='port') }}|{{ obj.spec.ports|tojson }}|{{ obj.spec.ports|string }}|{{ obj.spec.ports|batch(2)|list }}|{{ obj.spec.ports|unique(attribute='port')|list|length }}",
        "{{ obj.metadata.labels|dictsort|reverse|list }}|{{ obj.spec.ports|map(attribute='name')|select|list }}|{{ obj.spec.ports|sort(attribute='port', reverse=true)|map(attribute='port')|list }}|{{ obj.large.values()|sum }}",
    ];

    /// Templates that fail, and must fail the same way over mappings.
    const MAP_ERROR_TEMPLATES: &[&str] = &[
        "{{ obj.metadata.labels|sum }}",
        "{{ obj.metadata.nope }}",
        "{{ obj.metadata.labels.nope() }}",
        "{{ obj.metadata.labels.get() }}",
        "{{ obj.metadata + 1 }}",
        "{{ obj.metadata.labels|groupby(0) }}",
    ];

    /// The result of `template` over `ctx`: its output or its error (kind and detail).
    fn render_map_template(
        env: &minijinja::Environment<'_>,
        template: &str,
        ctx: &Value,
    ) -> String {
        match env.render_str(template, ctx) {
            Ok(text) => text,
            Err(error) => format!("error {:?}: {:?}", error.kind(), error.detail()),
        }
    }

    fn map_test_env() -> minijinja::Environment<'static> {
        let mut env = minijinja::Environment::new();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        super::super::functions::register(
            &mut env,
            Arc::default(),
            Arc::default(),
            super::super::OutputSyntax::Plain,
        );
        env
    }

    #[test]
    fn templates_see_mappings_as_builtin_maps() {
        let object = json!({
            "kind": "Service",
            "metadata": {
                "name": "web",
                "labels": {"app": "web", "tier": "front", "zone": "a"},
                "annotations": {"kubernetes.io/service-name": "web", "meta.helm.sh/release-name": "r"},
            },
            "spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443}, {"port": 8080, "name": "alt"}], "empty": {}},
            "large": large_map(40),
        });
        let second = json!({
            "kind": "Service",
            "metadata": {"name": "api", "labels": {"app": "api", "tier": "back"}},
            "spec": {"ports": [], "empty": {}},
        });
        let env = map_test_env();
        let convert = |value: &serde_json::Value| {
            let stored = StoredObject::from_value(value);
            let ours = to_value(&stored);
            let theirs: Value = stored.deserialize().expect("valid JSON");
            (ours, theirs)
        };
        let (ours, theirs) = convert(&object);
        let (second_ours, second_theirs) = convert(&second);
        // `metadata` is a view over the stored text, not a converted map.
        assert!(
            ours.get_attr("metadata")
                .expect("attribute")
                .downcast_object_ref::<View>()
                .is_some()
        );
        let ours_ctx =
            minijinja::context! {obj => ours, other => theirs.clone(), second => second_ours};
        let theirs_ctx =
            minijinja::context! {obj => theirs.clone(), other => theirs, second => second_theirs};
        for template in MAP_TEMPLATES {
            let expected = render_map_template(&env, template, &theirs_ctx);
            assert!(!expected.starts_with("error"), "{template}: {expected}");
            assert_eq!(
                render_map_template(&env, template, &ours_ctx),
                expected,
                "{template}"
            );
        }
        for template in MAP_ERROR_TEMPLATES {
            let expected = render_map_template(&env, template, &theirs_ctx);
            assert!(expected.starts_with("error"), "{template}: {expected}");
            assert_eq!(
                render_map_template(&env, template, &ours_ctx),
                expected,
                "{template}"
            );
        }
    }

    #[test]
    fn resource_lookups_return_mappings_that_templates_read() {
        use hapwright_eventbus::model::{FieldPath, ObjectKey};
        let mut snapshot = ResourceSnapshot::new(vec![
            FieldPath::parse("metadata.namespace").expect("valid path"),
            FieldPath::parse(r"metadata.labels.kubernetes\.io/service-name").expect("valid path"),
        ]);
        for (name, service) in [("a-1", "a"), ("a-2", "a"), ("b-1", "b")] {
            snapshot.upsert(
                ObjectKey::new("default", name),
                &json!({"metadata": {"namespace": "default", "name": name, "labels": {"kubernetes.io/service-name": service}}, "spec": {"ready": name != "a-2"}}),
            );
        }
        let mut resources = Resources::new();
        let source: Arc<str> = Arc::from("slices");
        resources.update(&source, Arc::new(snapshot), None);
        let env = map_test_env();
        let ctx = minijinja::context! {resources => resources.context_value(&[source])};
        let template = "{% for s in resources.slices.fetch('default', 'a') %}{{ s.metadata.name }}:{{ s.spec.ready }}:{{ s.metadata.labels['kubernetes.io/service-name'] }};{% endfor %}\
            |{{ resources.slices.get('default', 'b').metadata|dictsort }}\
            |{{ resources.slices.get('default', 'b').spec|tojson }}\
            |{{ resources.slices.list()|selectattr('spec.ready')|map(attribute='metadata.name')|join(',') }}\
            |{{ resources.slices.list()|sort_by('-metadata.name')|map(attribute='metadata.name')|join(',') }}";
        assert_eq!(
            render_map_template(&env, template, &ctx),
            "a-1:True:a;a-2:False:a;\
             |[('labels', {'kubernetes.io/service-name': 'b'}), ('name', 'b-1'), ('namespace', 'default')]\
             |{\"ready\": true}\
             |a-1,b-1\
             |b-1,a-2,a-1"
        );
        let value = resources
            .get("slices")
            .expect("a store")
            .get(&[Value::from("default"), Value::from("b")])
            .expect("found");
        assert_eq!(
            serde_json::to_string(&value).expect("serializes"),
            r#"{"metadata":{"namespace":"default","name":"b-1","labels":{"kubernetes.io/service-name":"b"}},"spec":{"ready":true}}"#
        );
    }

    #[test]
    fn sort_memo_is_bounded_and_keyed_by_paths_and_direction() {
        let value = ResourceList::value(vec![Value::from(1), Value::from(2)]);
        let list = value.downcast_object_ref::<ResourceList>().expect("a list");
        let paths = |p: &[&'static str]| p.iter().map(|p| Cow::Borrowed(*p)).collect::<Vec<_>>();
        assert_eq!(list.sorted(&paths(&["a"]), false), None);
        list.remember_sorted(&paths(&["a"]), false, None);
        let reversed = Value::from(vec![Value::from(2), Value::from(1)]);
        list.remember_sorted(&paths(&["a"]), true, Some(reversed.clone()));
        assert_eq!(list.sorted(&paths(&["a"]), false), Some(None));
        assert_eq!(list.sorted(&paths(&["a"]), true), Some(Some(reversed)));
        assert_eq!(list.sorted(&paths(&["a", "b"]), false), None);
        assert_eq!(list.sorted(&paths(&["b"]), false), None);
        for i in 0..2 * SORT_MEMO_LIMIT {
            let path = format!("k{i}");
            list.remember_sorted(&[Cow::Owned(path)], false, None);
        }
        assert_eq!(list.memo().len(), SORT_MEMO_LIMIT);
    }
}

#[cfg(test)]
mod index_tests {
    use hapwright_eventbus::model::{FieldPath, ObjectKey, UpsertOutcome};
    use serde_json::json;

    use super::*;

    /// A small deterministic generator (xorshift), so failures repeat.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    /// The index of the random snapshots: namespace, then the `svc` label.
    fn by_namespace_and_service() -> Vec<FieldPath> {
        vec![
            FieldPath::parse("metadata.namespace").expect("path"),
            FieldPath::parse("metadata.labels.svc").expect("path"),
        ]
    }

    /// One random update of `snapshot` at `step`: one to `most` objects, each added,
    /// modified, moved to another label value or removed, named `o0`..`o{names - 1}`
    /// in one of `namespaces`, labelled with one of `services`.
    fn random_change(
        rng: &mut Rng,
        snapshot: &mut ResourceSnapshot,
        step: usize,
        (most, names): (usize, usize),
        (namespaces, services): (&[&str], &[&str]),
    ) -> ResourceChange {
        let mut change = ResourceChange::default();
        for _ in 0..1 + rng.below(most) {
            let key = ObjectKey::new(
                namespaces[rng.below(namespaces.len())],
                format!("o{}", rng.below(names)),
            );
            if rng.below(4) == 0 {
                if snapshot.remove(&key).is_some() {
                    change.removed.push(key);
                }
                continue;
            }
            let object = json!({
                "metadata": {"namespace": key.namespace, "name": key.name,
                             "labels": {"svc": services[rng.below(services.len())]}},
                "v": step,
            });
            match snapshot.upsert(key.clone(), &object) {
                Some(UpsertOutcome::Added) => change.added.push(key),
                Some(UpsertOutcome::Modified) => change.modified.push(key),
                None => {}
            }
        }
        change
    }

    /// Every `fetch`/`get` a template can make, answered as JSON text.
    fn answers(store: &ResourceStore, namespaces: &[&str], services: &[&str]) -> Vec<String> {
        let text = |result: Result<Value, Error>| match result {
            Ok(value) => serde_json::to_string(&value).expect("serializes"),
            Err(error) => format!("error: {error}"),
        };
        let mut out = Vec::new();
        for ns in namespaces {
            out.push(text(store.fetch(&[Value::from(*ns)])));
            for service in services {
                let args = [Value::from(*ns), Value::from(*service)];
                out.push(text(store.fetch(&args)));
                out.push(text(store.get(&args)));
            }
        }
        out
    }

    /// An index updated along the changes answers every lookup as one built from all
    /// objects of the same version does, over random additions, modifications, moves
    /// to other index values and removals, read after one or several updates.
    #[test]
    fn an_updated_index_answers_as_one_built_from_all_objects() {
        let index_by = by_namespace_and_service();
        let namespaces = ["a", "b", "c", "none"];
        let services = ["s0", "s1", "s2", "s3", "s4", "s5", "none"];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut snapshot = ResourceSnapshot::new(index_by);
        let mut store = ResourceStore::from_snapshot("slices", Arc::new(snapshot.clone()));
        let mut from_base = 0;
        for step in 0..600 {
            let change = random_change(
                &mut rng,
                &mut snapshot,
                step,
                (3, 12),
                (&namespaces[..3], &services[..6]),
            );
            store = store.updated(Arc::new(snapshot.clone()), Some(&change));
            // Read after one to three updates, so bases also chain.
            if rng.below(3) == 0 {
                let based = store.lookup_base.lock().expect("not poisoned").is_some();
                from_base += usize::from(based);
                let fresh = ResourceStore::from_snapshot("slices", Arc::new(snapshot.clone()));
                assert_eq!(
                    answers(&store, &namespaces, &services),
                    answers(&fresh, &namespaces, &services),
                    "after step {step} (index from an earlier one: {based})"
                );
            }
        }
        assert!(
            from_base > 50,
            "only {from_base} indexes were updated rather than built"
        );
    }

    /// A store's `list()` made from the last version's list (its values for the
    /// objects both hold) is the list of a store built from the snapshot: the same
    /// objects in the same order, each the value the store holds for it.
    #[test]
    fn a_list_from_the_last_versions_list_is_the_list_of_the_snapshot() {
        let index_by = by_namespace_and_service();
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut snapshot = ResourceSnapshot::new(index_by);
        let mut store = ResourceStore::from_snapshot("slices", Arc::new(snapshot.clone()));
        let (mut from_last, mut taken) = (0, 0);
        for step in 0..400 {
            let change = random_change(
                &mut rng,
                &mut snapshot,
                step,
                (3, 12),
                (&["a", "b", "c"], &["s0", "s1", "s2", "s3"]),
            );
            // Read the list after one to three updates: a version whose list was
            // never made hands nothing on.
            let listed = store.list.get().is_some();
            store = store.updated(Arc::new(snapshot.clone()), Some(&change));
            if rng.below(3) != 0 {
                continue;
            }
            from_last += usize::from(listed);
            let list = store.list_value();
            let list = list
                .downcast_object_ref::<ResourceList>()
                .expect("a resource list");
            let objects: Vec<&StoredObject> = snapshot.list().collect();
            assert_eq!(list.items.len(), objects.len(), "after step {step}");
            assert_eq!(list.addresses.len(), objects.len(), "after step {step}");
            for ((item, address_seen), object) in
                list.items.iter().zip(&list.addresses).zip(objects)
            {
                assert_eq!(*address_seen, address(object), "after step {step}");
                let held = store
                    .values
                    .get(&address(object))
                    .expect("a value per object");
                assert_eq!(
                    super::super::lazy::identity(item),
                    super::super::lazy::identity(held),
                    "after step {step}"
                );
                assert_eq!(
                    item.to_string(),
                    to_value(object).to_string(),
                    "after step {step}"
                );
                taken += usize::from(listed);
            }
        }
        assert!(
            from_last > 30 && taken > 200,
            "{from_last} lists from the last one, {taken} values"
        );
    }

    /// A check of many reads against two versions ([`ReadCheck`], which skips
    /// lookups by their keys' fingerprints) answers as each read's own check does,
    /// for every lookup of one to three keys, across one to four updates of random
    /// additions, modifications, moves and removals.
    #[test]
    fn a_read_check_answers_as_each_read_does() {
        let index_by = by_namespace_and_service();
        let namespaces = ["a", "b", "c"];
        let services = ["s0", "s1", "s2", "s3"];
        let name: Arc<str> = Arc::from("slices");
        let mut reads = Vec::new();
        for ns in namespaces {
            reads.push(vec![ns.to_owned()]);
            for service in services {
                reads.push(vec![ns.to_owned(), service.to_owned()]);
                reads.push(vec![ns.to_owned(), service.to_owned(), "x".to_owned()]);
            }
        }
        let reads: Vec<Read> = reads
            .into_iter()
            .map(|keys| Read::Lookup(name.clone(), LookupKeys::new(keys.into())))
            .chain([Read::List(name.clone())])
            .collect();
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut snapshot = ResourceSnapshot::new(index_by);
        let mut versions = vec![Resources::new()];
        let (mut changed, mut unchanged) = (0, 0);
        for step in 0..300 {
            let change = random_change(
                &mut rng,
                &mut snapshot,
                step,
                (2, 6),
                (&namespaces, &services),
            );
            let mut next = versions.last().expect("a version").clone();
            next.update(&name, Arc::new(snapshot.clone()), Some(&change));
            versions.push(next);
            let new = versions.last().expect("a version");
            let old = &versions[versions.len().saturating_sub(2 + rng.below(4))];
            let check = ReadCheck::new(old, new);
            for read in &reads {
                let expected = read.unchanged(old, new);
                assert_eq!(check.unchanged(read), expected, "{read:?} at step {step}");
                if expected {
                    unchanged += 1;
                } else {
                    changed += 1;
                }
            }
        }
        assert!(
            changed > 1_000 && unchanged > 1_000,
            "{changed} changed, {unchanged} unchanged"
        );
    }

    /// The read a `has()` notes is unchanged exactly when the same call over the new
    /// version answers as it did: a renewed value (a field set before and after)
    /// leaves it unchanged, a field emptied or an object added or removed changes
    /// it. Random updates of one to three objects, checked one to four versions on,
    /// through [`ReadCheck`] and each read's own check.
    #[test]
    fn a_has_read_depends_only_on_its_answer() {
        let index_by = vec![
            FieldPath::parse("metadata.namespace").expect("path"),
            FieldPath::parse("metadata.name").expect("path"),
        ];
        let name: Arc<str> = Arc::from("secrets");
        let mut rng = Rng(0x0bad_5eed_1234_5678);
        let mut snapshot = ResourceSnapshot::new(index_by);
        let mut versions = vec![Resources::new()];
        let calls: Vec<[Value; 3]> = ["a", "b"]
            .iter()
            .flat_map(|ns| (0..4).map(move |i| (ns, i)))
            .map(|(ns, i)| {
                [
                    Value::from(*ns),
                    Value::from(format!("s{i}")),
                    Value::from(Kwargs::from_iter([(
                        "fields",
                        Value::from(minijinja::value::Serde(json!([
                            ["data", "tls.crt"],
                            "data.key"
                        ]))),
                    )])),
                ]
            })
            .collect();
        let has = |resources: &Resources, call: &[Value]| -> (bool, Vec<Read>) {
            let recording = Recording::start();
            let store = resources.get(&name).expect("a store");
            let answer = store.has(call).expect("answers").is_true();
            (answer, recording.finish())
        };
        let (mut same, mut renewed, mut changed) = (0, 0, 0);
        for step in 0..400 {
            let mut change = ResourceChange::default();
            for _ in 0..1 + rng.below(3) {
                let key = ObjectKey::new(["a", "b"][rng.below(2)], format!("s{}", rng.below(4)));
                if rng.below(5) == 0 {
                    if snapshot.remove(&key).is_some() {
                        change.removed.push(key);
                    }
                    continue;
                }
                let crt = if rng.below(4) == 0 {
                    String::new()
                } else {
                    format!("pem {step}")
                };
                let mut data = json!({"tls.crt": crt});
                if rng.below(6) != 0 {
                    data["key"] = json!(format!("key {step}"));
                }
                let object = json!({
                    "metadata": {"namespace": key.namespace, "name": key.name},
                    "data": data,
                });
                match snapshot.upsert(key.clone(), &object) {
                    Some(UpsertOutcome::Added) => change.added.push(key),
                    Some(UpsertOutcome::Modified) => change.modified.push(key),
                    None => {}
                }
            }
            let mut next = versions.last().expect("a version").clone();
            next.update(&name, Arc::new(snapshot.clone()), Some(&change));
            versions.push(next);
            let new = versions.last().expect("a version");
            let old = &versions[versions.len().saturating_sub(2 + rng.below(4))];
            if old.get(&name).is_none() {
                continue;
            }
            let check = ReadCheck::new(old, new);
            for call in &calls {
                let (before, reads) = has(old, call);
                let (after, _) = has(new, call);
                assert_eq!(reads.len(), 1, "one read per call");
                let read = &reads[0];
                let expected = before == after;
                assert_eq!(
                    read.unchanged(old, new),
                    expected,
                    "{read:?} at step {step}"
                );
                assert_eq!(check.unchanged(read), expected, "{read:?} at step {step}");
                let key = ObjectKey::new(
                    call[0].as_str().expect("ns"),
                    call[1].as_str().expect("name"),
                );
                let text = |r: &Resources| {
                    r.get(&name).and_then(|s| {
                        s.snapshot
                            .as_ref()?
                            .get_by_key(&key)
                            .map(|o| o.json().to_owned())
                    })
                };
                match (expected, text(old) == text(new)) {
                    (true, true) => same += 1,
                    (true, false) => renewed += 1,
                    (false, _) => changed += 1,
                }
            }
        }
        assert!(
            same > 500 && renewed > 200 && changed > 200,
            "{same} same, {renewed} renewed, {changed} changed"
        );
    }

    /// `has()` refuses what it cannot answer: no keys, more keys than `indexBy`
    /// paths, fields that are not paths, unknown keyword arguments and several
    /// matching objects.
    #[test]
    fn has_refuses_bad_calls_with_clear_errors() {
        let index_by = by_namespace_and_service();
        let mut snapshot = ResourceSnapshot::new(index_by);
        for name in ["x", "y"] {
            let object =
                json!({"metadata": {"namespace": "a", "name": name, "labels": {"svc": "s"}}});
            snapshot.upsert(ObjectKey::new("a", name), &object);
        }
        let store = ResourceStore::from_snapshot("slices", Arc::new(snapshot));
        let kwargs = |key: &str, value: serde_json::Value| {
            Value::from(Kwargs::from_iter([(
                key,
                Value::from(minijinja::value::Serde(value)),
            )]))
        };
        let error = |args: &[Value]| store.has(args).expect_err("refused").to_string();
        assert!(error(&[]).contains("resources.slices.has() takes 1 to 2 index keys, got 0"));
        let three = [Value::from("a"), Value::from("s"), Value::from("x")];
        assert!(error(&three).contains("takes 1 to 2 index keys, got 3"));
        let bad_field = [Value::from("a"), kwargs("fields", json!([1]))];
        assert!(error(&bad_field).contains("fields= takes a list of dotted paths"));
        let empty_key = [Value::from("a"), kwargs("fields", json!(["data..x"]))];
        assert!(error(&empty_key).contains("fields= takes a list of dotted paths"));
        let unknown = [Value::from("a"), kwargs("field", json!(["data"]))];
        assert!(error(&unknown).contains("field"), "{}", error(&unknown));
        let several = [Value::from("a"), Value::from("s")];
        assert!(error(&several).contains("expected at most one object, found 2"));
        let missing = [Value::from("b")];
        assert!(!store.has(&missing).expect("answers").is_true());
        let list = [
            Value::from("a"),
            Value::from("s"),
            kwargs("fields", json!(["metadata.name"])),
        ];
        assert!(error(&list).contains("found 2"));
    }
}
