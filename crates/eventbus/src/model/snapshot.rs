//! Persistent, indexed resource snapshots.

use std::fmt;
use std::sync::Arc;

use imbl::{OrdMap, OrdSet};
use serde::Serialize;
use serde_json::Value;

use super::FieldPath;
use super::{ContentHash, IndexedObject, StoredObject};

/// Identity of a stored object: its namespace and name. Objects without a namespace
/// (cluster-scoped Kubernetes kinds) use the empty string as namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ObjectKey {
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
}

impl ObjectKey {
    /// Builds a key from a namespace and a name.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// What one update did to a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ResourceChange {
    /// Objects that did not exist before.
    pub added: Vec<ObjectKey>,
    /// Objects whose content changed.
    pub modified: Vec<ObjectKey>,
    /// Objects that are gone.
    pub removed: Vec<ObjectKey>,
}

impl ResourceChange {
    /// True when the update changed nothing.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.modified.is_empty() && self.removed.is_empty()
    }

    /// Number of objects touched.
    pub fn len(&self) -> usize {
        self.added.len() + self.modified.len() + self.removed.len()
    }
}

/// An index lookup that could not be answered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// More keys were given than the snapshot has `indexBy` paths.
    #[error("{given} index keys given, but only {available} indexBy paths are configured")]
    TooManyKeys {
        /// Keys passed to the lookup.
        given: usize,
        /// Configured `indexBy` paths.
        available: usize,
    },
    /// An exactly-one lookup matched several objects.
    #[error("expected at most one object for keys {keys:?}, found {count}")]
    Ambiguous {
        /// Keys passed to the lookup.
        keys: Vec<String>,
        /// How many objects matched.
        count: usize,
    },
}

/// The objects of one watched resource at one moment, with their `indexBy` index.
///
/// The snapshot is a persistent structure (`imbl` B-trees): cloning is O(1) and shares
/// all nodes, and [`upsert`](Self::upsert) / [`remove`](Self::remove) on a clone cost
/// O(log n) and copy only the touched path. A source keeps its latest snapshot, clones
/// it, applies a change and publishes the result; earlier snapshots stay valid and
/// unchanged for whoever still holds them.
///
/// Objects are stored as their compact JSON text ([`StoredObject`]), with the
/// `indexBy` values computed once at [`upsert`](Self::upsert) time; consumers
/// deserialize the text into the form they work with.
#[derive(Clone)]
pub struct ResourceSnapshot {
    index_by: Arc<[FieldPath]>,
    objects: OrdMap<ObjectKey, IndexedObject>,
    /// One ordered set over (index values, object key): prefix lookups are a range
    /// scan, and an object costs one small entry instead of a bucket of its own.
    index: OrdSet<(Arc<[String]>, ObjectKey)>,
    /// Set by sources whose objects come from one payload (an HTTP source): the
    /// payload's hash. The quarantine then treats every change of this resource as
    /// one unit, accepted or held back together, so templates never see half a
    /// list. Not part of equality: two payloads giving the same objects are equal.
    unit: Option<ContentHash>,
}

impl fmt::Debug for ResourceSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceSnapshot")
            .field("index_by", &self.index_by)
            .field("objects", &self.objects.len())
            .finish()
    }
}

impl PartialEq for ResourceSnapshot {
    fn eq(&self, other: &Self) -> bool {
        self.index_by == other.index_by
            && self.objects.len() == other.objects.len()
            && self
                .objects
                .iter()
                .zip(other.objects.iter())
                .all(|((ka, a), (kb, b))| ka == kb && a.object == b.object)
    }
}

impl ResourceSnapshot {
    /// An empty snapshot indexed by the given paths (in order).
    pub fn new(index_by: Vec<FieldPath>) -> Self {
        Self {
            index_by: index_by.into(),
            objects: OrdMap::new(),
            index: OrdSet::new(),
            unit: None,
        }
    }

    /// The payload hash when this snapshot is one unit for the quarantine (see
    /// [`set_unit`](Self::set_unit)); `None` for per-object sources.
    pub fn unit(&self) -> Option<ContentHash> {
        self.unit
    }

    /// Marks the snapshot as the objects of one payload with hash `unit`: a failing
    /// change of it is quarantined as a whole (all its objects keep their last good
    /// versions) instead of object by object.
    pub fn set_unit(&mut self, unit: Option<ContentHash>) {
        self.unit = unit;
    }

    /// The `indexBy` paths, in order.
    pub fn index_by(&self) -> &[FieldPath] {
        &self.index_by
    }

    /// What changed from `old` to this snapshot, as a source reports an update: the
    /// objects added, modified and removed, in key order. The parts the two share
    /// (a snapshot derived from `old` shares all but the touched paths) are not
    /// compared.
    pub fn change_since(&self, old: &ResourceSnapshot) -> ResourceChange {
        use imbl::ordmap::DiffItem;
        let mut change = ResourceChange::default();
        for item in old.objects.diff(&self.objects) {
            match item {
                DiffItem::Add(key, _) => change.added.push(key.clone()),
                DiffItem::Update { new: (key, _), .. } => change.modified.push(key.clone()),
                DiffItem::Remove(key, _) => change.removed.push(key.clone()),
            }
        }
        change
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// True when the snapshot holds no objects.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Inserts or replaces an object (serialized and indexed here). Returns `None`
    /// when an identical object was already stored (nothing changed), otherwise
    /// whether it was added or modified.
    pub fn upsert(&mut self, key: ObjectKey, object: &Value) -> Option<UpsertOutcome> {
        let indexed = IndexedObject::new(object, &self.index_by);
        self.upsert_indexed(key, indexed)
    }

    /// [`upsert`](Self::upsert) of an object already serialized and indexed, with
    /// [`IndexedObject::new`] over this snapshot's [`index_by`](Self::index_by) paths.
    pub fn upsert_indexed(
        &mut self,
        key: ObjectKey,
        object: IndexedObject,
    ) -> Option<UpsertOutcome> {
        debug_assert_eq!(
            object.index_key.len(),
            self.index_by.len(),
            "indexed with other indexBy paths"
        );
        let IndexedObject {
            object: stored,
            index_key,
        } = object;
        let outcome = match self.objects.get(&key) {
            Some(old) if old.object == stored => return None,
            Some(old) => {
                if old.index_key != index_key {
                    self.index.remove(&(old.index_key.clone(), key.clone()));
                    self.index.insert((index_key.clone(), key.clone()));
                }
                UpsertOutcome::Modified
            }
            None => {
                self.index.insert((index_key.clone(), key.clone()));
                UpsertOutcome::Added
            }
        };
        self.objects.insert(
            key,
            IndexedObject {
                object: stored,
                index_key,
            },
        );
        Some(outcome)
    }

    /// Removes an object; returns it when it was present.
    pub fn remove(&mut self, key: &ObjectKey) -> Option<StoredObject> {
        let stored = self.objects.remove(key)?;
        self.index.remove(&(stored.index_key, key.clone()));
        Some(stored.object)
    }

    /// The object stored under `key`.
    pub fn get_by_key(&self, key: &ObjectKey) -> Option<&StoredObject> {
        self.objects.get(key).map(|stored| &stored.object)
    }

    /// The object stored under `key` with its `indexBy` values, ready to go back into
    /// a snapshot with the same paths through
    /// [`upsert_indexed`](Self::upsert_indexed) without serializing or indexing it
    /// again (quarantine rebuilds snapshots from two versions of each object this
    /// way).
    pub fn get_indexed(&self, key: &ObjectKey) -> Option<&IndexedObject> {
        self.objects.get(key)
    }

    /// The `indexBy` values of the object stored under `key`: what a consumer needs
    /// to tell which `fetch` lookups a change to that object can affect.
    pub fn index_key(&self, key: &ObjectKey) -> Option<&[String]> {
        self.objects
            .get(key)
            .map(|stored| stored.index_key.as_ref())
    }

    /// Every object with its key, in key order (namespace, then name).
    pub fn iter(&self) -> impl Iterator<Item = (&ObjectKey, &StoredObject)> + '_ {
        self.objects
            .iter()
            .map(|(key, stored)| (key, &stored.object))
    }

    /// Every object, in key order.
    pub fn list(&self) -> impl Iterator<Item = &StoredObject> + '_ {
        self.objects.values().map(|stored| &stored.object)
    }

    /// Every object with its `indexBy` values and key, in index order (index values,
    /// then key: the order of [`fetch`](Self::fetch)).
    pub fn iter_indexed(
        &self,
    ) -> impl Iterator<Item = (&[String], &ObjectKey, &StoredObject)> + '_ {
        self.index.iter().filter_map(|(index_key, key)| {
            self.get_by_key(key)
                .map(|object| (index_key.as_ref(), key, object))
        })
    }

    /// Objects whose leading index values equal `keys`, ordered by index values and
    /// then by object key. With no keys, every object in index order. Costs
    /// O(log n + matches).
    pub fn fetch<S: AsRef<str>>(&self, keys: &[S]) -> Result<Vec<&StoredObject>, LookupError> {
        if keys.len() > self.index_by.len() {
            return Err(LookupError::TooManyKeys {
                given: keys.len(),
                available: self.index_by.len(),
            });
        }
        let prefix: Arc<[String]> = keys.iter().map(|k| k.as_ref().to_owned()).collect();
        let start = (prefix.clone(), ObjectKey::new("", ""));
        let out = self
            .index
            .range(start..)
            .take_while(|(index_key, _)| index_key.starts_with(&prefix))
            .filter_map(|(_, key)| self.get_by_key(key))
            .collect();
        Ok(out)
    }

    /// The single object whose leading index values equal `keys`, `None` when there is
    /// none, and an error when there are several.
    pub fn get<S: AsRef<str>>(&self, keys: &[S]) -> Result<Option<&StoredObject>, LookupError> {
        let mut found = self.fetch(keys)?;
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop()),
            count => Err(LookupError::Ambiguous {
                keys: keys.iter().map(|k| k.as_ref().to_owned()).collect(),
                count,
            }),
        }
    }
}

/// Whether [`ResourceSnapshot::upsert`] added or replaced an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpsertOutcome {
    /// The key was new.
    Added,
    /// The key existed with different content.
    Modified,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(ns: &str, name: &str, service: Option<&str>) -> Value {
        let mut labels = serde_json::Map::new();
        if let Some(service) = service {
            labels.insert("kubernetes.io/service-name".into(), json!(service));
        }
        json!({"metadata": {"namespace": ns, "name": name, "labels": labels}})
    }

    fn by_service() -> ResourceSnapshot {
        ResourceSnapshot::new(vec![
            FieldPath::parse("metadata.namespace").unwrap(),
            FieldPath::parse(r"metadata.labels.kubernetes\.io/service-name").unwrap(),
        ])
    }

    fn names(values: Vec<&StoredObject>) -> Vec<String> {
        values
            .into_iter()
            .map(|v| v.parse()["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn fetch_by_leading_keys_and_exactly_one() {
        let mut snap = by_service();
        snap.upsert(
            ObjectKey::new("a", "web-1"),
            &slice("a", "web-1", Some("web")),
        );
        snap.upsert(
            ObjectKey::new("a", "web-2"),
            &slice("a", "web-2", Some("web")),
        );
        snap.upsert(
            ObjectKey::new("a", "api-1"),
            &slice("a", "api-1", Some("api")),
        );
        snap.upsert(
            ObjectKey::new("b", "web-1"),
            &slice("b", "web-1", Some("web")),
        );

        assert_eq!(
            names(snap.fetch(&["a", "web"]).unwrap()),
            ["web-1", "web-2"]
        );
        assert_eq!(
            names(snap.fetch(&["a"]).unwrap()),
            ["api-1", "web-1", "web-2"]
        );
        assert_eq!(snap.fetch::<&str>(&[]).unwrap().len(), 4);
        assert!(snap.fetch(&["c"]).unwrap().is_empty());
        assert_eq!(
            names(vec![snap.get(&["a", "api"]).unwrap().unwrap()]),
            ["api-1"]
        );
        assert_eq!(snap.get(&["a", "nope"]).unwrap(), None);
        assert!(matches!(
            snap.get(&["a", "web"]),
            Err(LookupError::Ambiguous { count: 2, .. })
        ));
        assert!(matches!(
            snap.fetch(&["a", "web", "x"]),
            Err(LookupError::TooManyKeys {
                given: 3,
                available: 2
            })
        ));
    }

    #[test]
    fn a_prefix_key_does_not_match_longer_values() {
        let mut snap = by_service();
        snap.upsert(ObjectKey::new("a", "1"), &slice("a", "1", Some("web")));
        snap.upsert(ObjectKey::new("ab", "2"), &slice("ab", "2", Some("web")));
        assert_eq!(names(snap.fetch(&["a"]).unwrap()), ["1"]);
    }

    #[test]
    fn objects_missing_an_index_path_are_indexed_under_empty_value() {
        let mut snap = by_service();
        snap.upsert(ObjectKey::new("a", "orphan"), &slice("a", "orphan", None));
        assert_eq!(names(snap.fetch(&["a", ""]).unwrap()), ["orphan"]);
        assert_eq!(snap.len(), 1);
    }

    #[test]
    fn reindexes_on_modify_and_unindexes_on_remove() {
        let mut snap = by_service();
        let key = ObjectKey::new("a", "s");
        assert_eq!(
            snap.upsert(key.clone(), &slice("a", "s", Some("web"))),
            Some(UpsertOutcome::Added)
        );
        assert_eq!(
            snap.upsert(key.clone(), &slice("a", "s", Some("web"))),
            None
        );
        assert_eq!(
            snap.upsert(key.clone(), &slice("a", "s", Some("api"))),
            Some(UpsertOutcome::Modified)
        );
        assert!(snap.fetch(&["a", "web"]).unwrap().is_empty());
        assert_eq!(snap.fetch(&["a", "api"]).unwrap().len(), 1);
        assert!(snap.remove(&key).is_some());
        assert!(snap.fetch(&["a"]).unwrap().is_empty());
        assert!(snap.is_empty());
        assert!(snap.remove(&key).is_none());
    }

    #[test]
    fn earlier_snapshots_are_unchanged_by_later_updates() {
        let mut first = by_service();
        first.upsert(ObjectKey::new("a", "1"), &slice("a", "1", Some("web")));
        let mut second = first.clone();
        second.upsert(ObjectKey::new("a", "2"), &slice("a", "2", Some("web")));
        second.remove(&ObjectKey::new("a", "1"));
        assert_eq!(names(first.list().collect()), ["1"]);
        assert_eq!(names(second.list().collect()), ["2"]);
        assert_ne!(first, second);
    }

    proptest::proptest! {
        /// The index always agrees with a brute-force scan, whatever the sequence of
        /// upserts and removals.
        #[test]
        fn index_matches_a_linear_scan(ops in proptest::collection::vec((0u8..6, 0u8..3, proptest::bool::ANY), 1..60)) {
            let mut snap = by_service();
            for (name, service, remove) in ops {
                let key = ObjectKey::new("ns", format!("o{name}"));
                if remove {
                    snap.remove(&key);
                } else {
                    snap.upsert(key, &slice("ns", &format!("o{name}"), Some(&format!("s{service}"))));
                }
            }
            for service in 0..3 {
                let wanted = format!("s{service}");
                let scanned: Vec<&StoredObject> = snap
                    .list()
                    .filter(|v| v.parse()["metadata"]["labels"]["kubernetes.io/service-name"] == wanted.as_str())
                    .collect();
                proptest::prop_assert_eq!(snap.fetch(&["ns", wanted.as_str()]).unwrap(), scanned);
            }
            let in_index_order: Vec<&StoredObject> = snap.iter_indexed().map(|(_, _, o)| o).collect();
            proptest::prop_assert_eq!(snap.fetch::<&str>(&[]).unwrap(), in_index_order);
        }
    }
}
