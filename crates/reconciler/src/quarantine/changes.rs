//! The changed set: what differs, object by object, between the last snapshots that
//! validated and the current ones, and the snapshots with only some of those changes
//! applied.
//!
//! A change is one object of one watched resource (by [`ObjectKey`]) whose content
//! differs: added (no last good version), modified, or removed (no current
//! version). Applying a subset of the changes to the last good snapshots gives a
//! candidate where every other changed object keeps its last good version (or stays
//! absent, when it is new; or stays present, when its removal is left out).
//! Snapshots are persistent maps, so a candidate costs O(changes · log n), not a
//! copy of every object.
//!
//! A resource whose snapshot is one payload ([`ResourceSnapshot::unit`], an HTTP
//! source) changes as a whole: its changed objects form a single [`Change`] named
//! [`PAYLOAD_NAME`], whose versions summarize the payloads (hash and object count)
//! and which swaps the whole snapshot when applied. So the search accepts or holds
//! back a downloaded list as one unit, and the quarantine lists it once, not once per
//! line.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use hapwright_eventbus::model::{IndexedObject, ObjectKey, ResourceSnapshot};

/// Snapshots by watched resource name.
pub type Snapshots = BTreeMap<Arc<str>, Arc<ResourceSnapshot>>;

/// One changed object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The watched resource the object belongs to.
    pub resource: Arc<str>,
    /// The object's namespace and name.
    pub key: ObjectKey,
    /// The last good version; `None` when the object is new.
    pub old: Option<IndexedObject>,
    /// The current version; `None` when the object was removed.
    pub new: Option<IndexedObject>,
    /// For a payload change: the whole current snapshot of the resource, which
    /// replaces the last good one when the change is applied.
    pub whole: Option<Whole>,
}

/// The name of the single change of a payload resource (its namespace is empty).
pub const PAYLOAD_NAME: &str = "payload";

/// A whole snapshot carried by a payload change. Compared by identity: two payload
/// changes are the same change when they carry the same snapshot.
#[derive(Clone, Debug)]
pub struct Whole(pub Arc<ResourceSnapshot>);

impl PartialEq for Whole {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Whole {}

impl Change {
    /// `added`, `modified` or `removed`, for logs and the debug endpoint.
    pub fn kind(&self) -> &'static str {
        match (&self.old, &self.new) {
            (None, _) => "added",
            (Some(_), Some(_)) => "modified",
            (Some(_), None) => "removed",
        }
    }
}

/// The changes between the last good snapshots and the current ones, with the last
/// good snapshots they apply to.
#[derive(Clone, Debug, Default)]
pub struct ChangeSet {
    base: Snapshots,
    changes: Vec<Change>,
}

impl ChangeSet {
    /// The changes from `last_good` to `current`, ordered by resource name, then
    /// object key. A resource missing from `last_good` (nothing of it validated yet)
    /// counts as empty; a resource missing from `current` is not watched any more and
    /// is left out.
    pub fn between(last_good: &Snapshots, current: &Snapshots) -> Self {
        let mut base = Snapshots::new();
        let mut changes = Vec::new();
        for (resource, now) in current {
            let before = match last_good.get(resource) {
                Some(before) => before.clone(),
                None => Arc::new(ResourceSnapshot::new(now.index_by().to_vec())),
            };
            if Arc::ptr_eq(&before, now) {
                // Unchanged.
            } else if now.unit().is_some() || before.unit().is_some() {
                if *before != **now {
                    changes.push(payload_change(resource, &before, now));
                }
            } else {
                diff(resource, &before, now, &mut changes);
            }
            base.insert(resource.clone(), before);
        }
        Self { base, changes }
    }

    /// The changes, in order; [`applied`](Self::applied) takes indexes into this.
    pub fn changes(&self) -> &[Change] {
        &self.changes
    }

    /// Number of changes.
    pub fn len(&self) -> usize {
        self.changes.len()
    }

    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Drops the changes `keep` returns false for: they stay at their last good
    /// version in every candidate (for objects already quarantined with the same
    /// content, which need no new search).
    pub fn retain(&mut self, mut keep: impl FnMut(&Change) -> bool) {
        self.changes.retain(|change| keep(change));
    }

    /// The last good snapshots with the changes at `indexes` applied (indexes into
    /// [`changes`](Self::changes); out-of-range indexes are ignored).
    pub fn applied(&self, indexes: &[usize]) -> Snapshots {
        let mut out = self.base.clone();
        let mut touched: BTreeMap<Arc<str>, ResourceSnapshot> = BTreeMap::new();
        let mut wholes = Vec::new();
        for change in indexes.iter().filter_map(|i| self.changes.get(*i)) {
            if let Some(whole) = &change.whole {
                wholes.push((change.resource.clone(), whole.0.clone()));
                continue;
            }
            let snapshot = touched.entry(change.resource.clone()).or_insert_with(|| {
                match self.base.get(&change.resource) {
                    Some(base) => (**base).clone(),
                    None => ResourceSnapshot::new(Vec::new()),
                }
            });
            match &change.new {
                Some(new) => drop(snapshot.upsert_indexed(change.key.clone(), new.clone())),
                None => drop(snapshot.remove(&change.key)),
            }
        }
        for (resource, snapshot) in touched {
            out.insert(resource, Arc::new(snapshot));
        }
        for (resource, snapshot) in wholes {
            out.insert(resource, snapshot);
        }
        out
    }
}

/// The single change of a payload resource: its versions summarize each payload
/// (hash and object count; `None` for an empty one), so the quarantine holds back
/// and releases the payload by its hash.
fn payload_change(
    resource: &Arc<str>,
    before: &Arc<ResourceSnapshot>,
    now: &Arc<ResourceSnapshot>,
) -> Change {
    let summary = |snapshot: &ResourceSnapshot| {
        (!snapshot.is_empty()).then(|| {
            let hash = snapshot.unit().map(|h| h.to_string()).unwrap_or_default();
            IndexedObject::new(
                &serde_json::json!({
                    "payload": hash,
                    "objects": snapshot.len(),
                }),
                now.index_by(),
            )
        })
    };
    Change {
        resource: resource.clone(),
        key: ObjectKey::new("", PAYLOAD_NAME),
        old: summary(before),
        new: summary(now),
        whole: Some(Whole(now.clone())),
    }
}

/// Appends the differences between two snapshots of one resource (a merge over both
/// in key order).
fn diff(
    resource: &Arc<str>,
    before: &ResourceSnapshot,
    now: &ResourceSnapshot,
    changes: &mut Vec<Change>,
) {
    let mut old = before.iter().peekable();
    let mut new = now.iter().peekable();
    let change = |key: &ObjectKey, old: bool, new: bool| Change {
        resource: resource.clone(),
        key: key.clone(),
        old: old.then(|| before.get_indexed(key).cloned()).flatten(),
        new: new.then(|| now.get_indexed(key).cloned()).flatten(),
        whole: None,
    };
    loop {
        let order = match (old.peek(), new.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((a, _)), Some((b, _))) => a.cmp(b),
        };
        match order {
            Ordering::Less => {
                let (key, _) = old.next().expect("peeked");
                changes.push(change(key, true, false));
            }
            Ordering::Greater => {
                let (key, _) = new.next().expect("peeked");
                changes.push(change(key, false, true));
            }
            Ordering::Equal => {
                let (key, a) = old.next().expect("peeked");
                let (_, b) = new.next().expect("peeked");
                if a != b {
                    changes.push(change(key, true, true));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use hapwright_eventbus::model::FieldPath;
    use serde_json::json;

    use super::*;

    fn snapshot(objects: &[(&str, i64)]) -> Arc<ResourceSnapshot> {
        let mut snapshot = ResourceSnapshot::new(vec![
            FieldPath::parse("metadata.name").expect("a valid path"),
        ]);
        for (name, port) in objects {
            snapshot.upsert(
                ObjectKey::new("default", *name),
                &json!({"metadata": {"namespace": "default", "name": name}, "spec": {"port": port}}),
            );
        }
        Arc::new(snapshot)
    }

    fn ports(snapshots: &Snapshots, resource: &str) -> Vec<(String, i64)> {
        snapshots[resource]
            .iter()
            .map(|(key, object)| {
                (
                    key.name.clone(),
                    object.parse()["spec"]["port"].as_i64().expect("a port"),
                )
            })
            .collect()
    }

    #[test]
    fn finds_added_modified_and_removed_objects_per_resource() {
        let services: Arc<str> = Arc::from("services");
        let last_good =
            Snapshots::from([(services.clone(), snapshot(&[("a", 1), ("b", 2), ("c", 3)]))]);
        let current = Snapshots::from([
            (services.clone(), snapshot(&[("a", 1), ("b", 20), ("d", 4)])),
            (Arc::from("secrets"), snapshot(&[("s", 9)])),
        ]);
        let set = ChangeSet::between(&last_good, &current);
        let seen: Vec<(&str, &str, &str)> = set
            .changes()
            .iter()
            .map(|c| (c.resource.as_ref(), c.key.name.as_str(), c.kind()))
            .collect();
        assert_eq!(
            seen,
            [
                ("secrets", "s", "added"),
                ("services", "b", "modified"),
                ("services", "c", "removed"),
                ("services", "d", "added"),
            ]
        );

        // Nothing applied: the last good objects (and an empty new resource).
        let base = set.applied(&[]);
        assert_eq!(
            ports(&base, "services"),
            [("a".into(), 1), ("b".into(), 2), ("c".into(), 3)]
        );
        assert!(base["secrets"].is_empty());
        // Everything applied: the current objects.
        let all: Vec<usize> = (0..set.len()).collect();
        let full = set.applied(&all);
        assert_eq!(full["services"], current["services"]);
        assert_eq!(full["secrets"], current["secrets"]);
        // The modification reverted and the removal left out: b keeps its last good
        // port and c stays.
        let partial = set.applied(&[0, 3]);
        assert_eq!(
            ports(&partial, "services"),
            [
                ("a".into(), 1),
                ("b".into(), 2),
                ("c".into(), 3),
                ("d".into(), 4)
            ]
        );
    }

    #[test]
    fn identical_snapshots_have_no_changes() {
        let services: Arc<str> = Arc::from("services");
        let same = snapshot(&[("a", 1)]);
        let set = ChangeSet::between(
            &Snapshots::from([(services.clone(), same.clone())]),
            &Snapshots::from([(services.clone(), snapshot(&[("a", 1)]))]),
        );
        assert!(set.is_empty());
        let mut set = ChangeSet::between(
            &Snapshots::from([(services.clone(), same)]),
            &Snapshots::from([(services, snapshot(&[("a", 2), ("b", 1)]))]),
        );
        assert_eq!(set.len(), 2);
        set.retain(|change| change.key.name != "a");
        assert_eq!(
            ports(&set.applied(&[0]), "services"),
            [("a".into(), 1), ("b".into(), 1)]
        );
    }

    #[test]
    fn a_payload_resource_changes_as_one_unit() {
        let list: Arc<str> = Arc::from("allow");
        let services: Arc<str> = Arc::from("services");
        let payload = |hash: &[u8], names: &[(&str, i64)]| {
            let mut snapshot = (*snapshot(names)).clone();
            snapshot.set_unit(Some(hapwright_eventbus::model::ContentHash::of(hash)));
            Arc::new(snapshot)
        };
        let last_good = Snapshots::from([
            (list.clone(), payload(b"v1", &[("a", 1), ("b", 2)])),
            (services.clone(), snapshot(&[("web", 1)])),
        ]);
        let current = Snapshots::from([
            (
                list.clone(),
                payload(b"v2", &[("a", 1), ("c", 3), ("d", 4)]),
            ),
            (services.clone(), snapshot(&[("web", 2)])),
        ]);
        let set = ChangeSet::between(&last_good, &current);
        // Three changed lines of the payload are one change; the service is another.
        assert_eq!(set.len(), 2, "{:?}", set.changes());
        let unit = &set.changes()[0];
        assert_eq!(unit.key, ObjectKey::new("", PAYLOAD_NAME));
        assert_eq!(unit.kind(), "modified");
        assert_eq!(unit.new.as_ref().unwrap().object().parse()["objects"], 3);
        // Applying it swaps in the whole payload; leaving it out keeps the old one.
        let with = set.applied(&[0]);
        assert_eq!(with["allow"], current["allow"]);
        let without = set.applied(&[1]);
        assert_eq!(without["allow"], last_good["allow"]);
        assert_eq!(without["services"], current["services"]);
        // The same objects from another payload (hash) are no change.
        let same = Snapshots::from([(list.clone(), payload(b"v3", &[("a", 1), ("b", 2)]))]);
        assert!(ChangeSet::between(&last_good, &same).is_empty());
    }
}
