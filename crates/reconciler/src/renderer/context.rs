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

/// Converts one stored object into a template value, straight from its JSON text.
pub(crate) fn to_value(object: &StoredObject) -> Value {
    object
        .deserialize::<Value>()
        .expect("a stored object is valid JSON")
}

#[derive(Clone)]
struct Converted {
    /// Keeps the address alive (and so unique) while the entry exists.
    _object: StoredObject,
    value: Value,
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
            list: Value::from(self.objects),
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

impl Lookup {
    /// The node for `keys`, if any object matches.
    fn find(&self, keys: &[Cow<'_, str>]) -> Option<&LookupNode> {
        keys.iter()
            .try_fold(&self.root, |node, key| node.children.get(key.as_ref()))
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

    fn list_value(&self) -> Value {
        self.list
            .get_or_init(|| match &self.snapshot {
                Some(snapshot) => Value::from(
                    snapshot
                        .list()
                        .map(|o| self.value_of(o))
                        .collect::<Vec<_>>(),
                ),
                None => Value::from(Vec::<Value>::new()),
            })
            .clone()
    }

    /// The lookup keys of a `fetch`/`get` call: strings as they are, numbers and
    /// booleans in their JSON spelling.
    fn keys<'a>(&self, method: &str, args: &'a [Value]) -> Result<Vec<Cow<'a, str>>, Error> {
        args.iter()
            .map(|arg| {
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
            })
            .collect()
    }

    /// `fetch`/`get`: the index node of the keys (`None`: nothing matches), or the
    /// objects as a list when the index cannot answer (no keys, or too many).
    fn lookup(&self, method: &str, args: &[Value]) -> Result<Found<'_>, Error> {
        let keys = self.keys(method, args)?;
        let Some(snapshot) = &self.snapshot else {
            return Ok(Found::Node(None));
        };
        if keys.is_empty() || keys.len() > snapshot.index_by().len() {
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
        let lookup = self.lookup.get_or_init(|| self.build_lookup(snapshot));
        Ok(Found::Node(lookup.find(&keys)))
    }

    /// The matching objects as one list value (shared, not copied).
    fn fetch(&self, args: &[Value]) -> Result<Value, Error> {
        Ok(match self.lookup("fetch", args)? {
            Found::Node(Some(node)) => node.list.clone(),
            Found::Node(None) => Value::from(Vec::<Value>::new()),
            Found::List(list) => Value::from(list),
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
