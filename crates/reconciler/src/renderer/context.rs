//! Template context objects: `resources.<name>` stores over the latest snapshots and
//! the per-render `shared` memo.
//!
//! Resource objects are converted to template values **once per change**, not once
//! per render: [`Resources::update`] converts only the objects a
//! `ResourceIndexUpdated` added or modified and keeps the values of the others. A
//! conversion deserializes the snapshot's stored JSON text straight into a template
//! value. The cache is keyed by the address of the stored text
//! ([`StoredObject::address`]); the cache holds a clone of the object, so the address
//! stays unique for as long as the entry exists. A lookup that misses (a change
//! report that left something out) converts on the spot, so the values are always
//! right, only slower.
//!
//! Every list a template gets from the resources — `list()`, `fetch()` and the arrays
//! inside the objects — is a [`ResourceList`]: an ordinary sequence to templates that
//! also remembers how `sort_by` ordered it. Those lists live as long as their
//! snapshot version, so `resources.services.list() | sort_by(...)` and
//! `slice.endpoints | sort_by(...)` sort once per change, not once per render.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use hapwright_eventbus::model::{ResourceChange, ResourceSnapshot, StoredObject};
use minijinja::value::{Enumerator, Object, ObjectRepr, Value};
use minijinja::{Error, ErrorKind, State};

/// The address of a stored object, the key of the conversion cache.
fn address(object: &StoredObject) -> usize {
    object.address()
}

/// Converts one stored object into a template value, straight from its JSON text:
/// objects become maps (keys in the order written), arrays [`ResourceList`]s (so a
/// nested list such as an endpoint slice's `endpoints` also remembers how `sort_by`
/// ordered it), numbers, strings, booleans and `null` what `minijinja` makes of them.
pub(crate) fn to_value(object: &StoredObject) -> Value {
    object
        .deserialize::<TemplateValue>()
        .expect("a stored object is valid JSON")
        .0
}

/// A template value deserialized from JSON (see [`to_value`]).
struct TemplateValue(Value);

impl<'de> serde::Deserialize<'de> for TemplateValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(TemplateValueVisitor)
            .map(TemplateValue)
    }
}

struct TemplateValueVisitor;

impl<'de> serde::de::Visitor<'de> for TemplateValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(TemplateValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(ResourceList::value(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        // Straight into the map, no intermediate list; keys (always strings in JSON)
        // become values the way `minijinja` makes them, without a `String` each.
        let mut error = None;
        let value = Value::from_pairs(std::iter::from_fn(|| {
            match map.next_entry::<TemplateValue, TemplateValue>() {
                Ok(entry) => entry.map(|(key, value)| (key.0, value.0)),
                Err(e) => {
                    error = Some(e);
                    None
                }
            }
        }));
        match error {
            Some(error) => Err(error),
            None => Ok(value),
        }
    }
}

#[derive(Clone)]
struct Converted {
    /// Keeps the address alive (and so unique) while the entry exists.
    _object: StoredObject,
    value: Value,
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
    sorted: Mutex<Vec<SortMemo>>,
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
        Value::from_object(Self {
            items,
            sorted: Mutex::new(Vec::new()),
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
/// `get(keys...)` over its latest snapshot, returning pre-converted values. Iterating
/// the store itself (`{% for s in resources.services %}`) is the same as `list()`.
pub struct ResourceStore {
    name: Arc<str>,
    snapshot: Option<Arc<ResourceSnapshot>>,
    values: imbl::HashMap<usize, Converted>,
    list: OnceLock<Value>,
    lookup: OnceLock<Lookup>,
}

/// A hash index over one snapshot for `fetch`/`get`: a trie over the `indexBy`
/// values, where the node reached by the keys `k1..km` holds the objects whose
/// leading index values are `k1..km`, in the snapshot's `fetch` order. Built on the
/// first lookup after a change (O(objects × indexBy paths)); a lookup in a render is
/// then one hash probe per key, with no allocation.
#[derive(Debug, Default)]
struct Lookup {
    root: LookupNode,
}

#[derive(Debug, Default)]
struct LookupNode {
    /// The matching objects as one shared list value.
    list: Value,
    /// The object when exactly one matches (for `get`), otherwise undefined.
    single: Value,
    /// Number of matching objects.
    count: usize,
    children: HashMap<Box<str>, LookupNode>,
}

/// A node while the index is built: objects are collected before they become one
/// list value.
#[derive(Default)]
struct NodeBuilder {
    objects: Vec<Value>,
    children: HashMap<Box<str>, NodeBuilder>,
}

impl NodeBuilder {
    fn finish(self) -> LookupNode {
        let count = self.objects.len();
        let single = match self.objects.as_slice() {
            [only] => only.clone(),
            _ => Value::UNDEFINED,
        };
        LookupNode {
            list: ResourceList::value(self.objects),
            single,
            count,
            children: self
                .children
                .into_iter()
                .map(|(key, child)| (key, child.finish()))
                .collect(),
        }
    }
}

impl fmt::Debug for ResourceStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
            snapshot: None,
            values: imbl::HashMap::new(),
            list: OnceLock::new(),
            lookup: OnceLock::new(),
        }
    }

    /// A store over `snapshot`, converting every object.
    pub fn from_snapshot(name: impl Into<Arc<str>>, snapshot: Arc<ResourceSnapshot>) -> Self {
        Self::empty(name).updated(snapshot, None)
    }

    /// The store after an update: objects named in `change` are (re)converted, the
    /// rest keep their values. Without a change report, or when the report does not
    /// add up, every object is checked against the cache.
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
                        values.insert(
                            address(object),
                            Converted {
                                _object: object.clone(),
                                value: to_value(object),
                            },
                        );
                    }
                }
                values.len() == snapshot.len()
            }
            _ => false,
        };
        if !incremental {
            let mut rebuilt = imbl::HashMap::new();
            for object in snapshot.list() {
                let key = address(object);
                let converted = match values.get(&key) {
                    Some(converted) => converted.clone(),
                    None => Converted {
                        _object: object.clone(),
                        value: to_value(object),
                    },
                };
                rebuilt.insert(key, converted);
            }
            values = rebuilt;
        }
        Self {
            name: self.name.clone(),
            snapshot: Some(snapshot),
            values,
            list: OnceLock::new(),
            lookup: OnceLock::new(),
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
            Some(converted) => converted.value.clone(),
            None => to_value(object),
        }
    }

    /// `list()`: every object in the snapshot's order, one shared value per version.
    pub(crate) fn list_value(&self) -> Value {
        self.list
            .get_or_init(|| match &self.snapshot {
                Some(snapshot) => {
                    ResourceList::value(snapshot.list().map(|o| self.value_of(o)).collect())
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
        } else if arg.is_number() || arg.kind() == minijinja::value::ValueKind::Bool {
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
        let mut node = Some(&lookup.root);
        for arg in args {
            let key = self.key(method, arg)?;
            node = node.and_then(|node| node.children.get(key.as_ref()));
        }
        Ok(Found::Node(node))
    }

    /// The matching objects as one list value (shared, not copied).
    fn fetch(&self, args: &[Value]) -> Result<Value, Error> {
        Ok(match self.lookup("fetch", args)? {
            Found::Node(Some(node)) => node.list.clone(),
            Found::Node(None) => ResourceList::value(Vec::new()),
            Found::List(list) => ResourceList::value(list),
        })
    }

    /// The one matching object, `none` when nothing matches, an error for several.
    fn get(&self, args: &[Value]) -> Result<Value, Error> {
        let (count, single) = match self.lookup("get", args)? {
            Found::Node(Some(node)) => (node.count, node.single.clone()),
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

    fn build_lookup(&self, snapshot: &ResourceSnapshot) -> Lookup {
        // The snapshot's index order (index values, then object key) is its fetch
        // order, and the index values were computed when the objects were stored.
        let mut root = NodeBuilder::default();
        for (index, _, object) in snapshot.iter_indexed() {
            let value = self.value_of(object);
            let mut node = &mut root;
            for key in index {
                node = node.children.entry(Box::from(key.as_str())).or_default();
                node.objects.push(value.clone());
            }
        }
        Lookup {
            root: root.finish(),
        }
    }
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
        Enumerator::Seq(self.len())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
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
            // Not UnknownMethod: that would hand the call to the Python-compatibility
            // fallback and lose this message.
            _ => Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "resources.{} has no method {method}(); use list(), fetch(keys...) or get(keys...)",
                    self.name
                ),
            )),
        }
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

    /// Applies a `ResourceIndexUpdated`: converts what changed, keeps the rest.
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

// === impl Shared ===

/// `shared`: a memo that lives for one render (`haproxy.cfg`, then every map, file
/// and certificate), so a value computed once can be reused by later templates.
///
/// `shared.get(key, default=none)`, `shared.set(key, value)`,
/// `shared.setdefault(key, value)`, `shared.append(key, item)`, `shared.has(key)`,
/// `shared.keys()`; `shared.key` and `shared["key"]` read. `set` and `append` return
/// an empty string, so `{{ shared.set("k", v) }}` prints nothing.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    values: Mutex<BTreeMap<String, Value>>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Value>> {
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
        Enumerator::Values(
            self.lock()
                .keys()
                .map(|k| Value::from(k.as_str()))
                .collect(),
        )
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
                self.lock().insert(key, args[1].clone());
                Ok(Value::from(""))
            }
            "setdefault" => {
                let key = key_arg(method, args, 2..=2)?;
                Ok(self
                    .lock()
                    .entry(key)
                    .or_insert_with(|| args[1].clone())
                    .clone())
            }
            "append" => {
                let key = key_arg(method, args, 2..=2)?;
                let mut values = self.lock();
                let mut items: Vec<Value> = match values.get(&key) {
                    None => Vec::new(),
                    Some(existing) => match existing.try_iter() {
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
                };
                items.push(args[1].clone());
                values.insert(key, Value::from(items));
                Ok(Value::from(""))
            }
            "has" => {
                let key = key_arg(method, args, 1..=1)?;
                Ok(Value::from(self.lock().contains_key(&key)))
            }
            "keys" => Ok(Value::from(
                self.lock()
                    .keys()
                    .map(|k| Value::from(k.as_str()))
                    .collect::<Vec<_>>(),
            )),
            _ => Err(Error::new(
                ErrorKind::UnknownMethod,
                format!(
                    "shared has no method {method}(); use get, set, setdefault, append, has or keys"
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
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
            }),
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
        assert!(list.downcast_object_ref::<ResourceList>().is_some());
        assert_eq!(list.len(), Some(3));
        assert_eq!(list.get_item(&Value::from(-1)).ok(), Some(Value::from(2)));
        assert!(
            !to_value(&StoredObject::from_value(&json!({"a": []})))
                .get_attr("a")
                .expect("attribute")
                .is_true()
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
