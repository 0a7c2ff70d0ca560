//! The publisher's spill queue: pipeline events waiting for room in the pipeline
//! channel, in publish order, bounded by [`BusConfig::spill_capacity`].
//!
//! The pipeline is latest-wins, so some events only matter until a newer one of the
//! same kind (and scope) exists: the newer one carries everything the older one did.
//! When the queue is full, the oldest such *superseded* event is dropped (and the
//! caller counts it); every other event is kept, past the capacity if need be, because
//! losing it would lose work. Superseded, by kind:
//!
//! - `ResourceIndexUpdated` of the same source: the newer snapshot is complete. The
//!   dropped event's change report is merged into the newer one (every object either
//!   names becomes "modified", except those still gone, which stay "removed"), so a
//!   consumer that applies changes incrementally still looks at every object that
//!   changed, and the debouncer still sees a removal;
//! - `InstancesDiscovered` of the same source: the newer instance set is complete;
//! - `ComponentHealthChanged` of the same component: only the current health counts;
//! - `ReconciliationTriggered`: one pending trigger starts the same reconciliation;
//! - `TemplateRendered` and `ValidationCompleted`: a newer render or validation
//!   belongs to a newer reconciliation, which replaces the older one.
//!
//! Never dropped: everything else — config changes, sync completions, the
//! reconciliation and deployment bookkeeping (`Started`, `Completed`, `Failed`, per
//! instance results), `DeploymentScheduled`, drift and reload requests.
//!
//! The event at the front may be on its way into the channel, so it is never dropped.
//!
//! [`BusConfig::spill_capacity`]: crate::BusConfig::spill_capacity

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use crate::event::{Event, EventKind, EventPayload, ResourceIndexUpdated};
use crate::model::ResourceChange;

/// What a newer event must share with an older one to supersede it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    kind: EventKind,
    scope: Option<Arc<str>>,
}

/// The key of an event that a newer one of the same key supersedes, if any.
fn key(event: &Event) -> Option<Key> {
    let (kind, scope) = match &event.payload {
        EventPayload::ResourceIndexUpdated(e) => {
            (EventKind::ResourceIndexUpdated, Some(e.source.clone()))
        }
        EventPayload::InstancesDiscovered(e) => {
            (EventKind::InstancesDiscovered, Some(e.source.clone()))
        }
        EventPayload::ComponentHealthChanged(e) => {
            (EventKind::ComponentHealthChanged, Some(e.component.clone()))
        }
        EventPayload::ReconciliationTriggered(_) => (EventKind::ReconciliationTriggered, None),
        EventPayload::TemplateRendered(_) => (EventKind::TemplateRendered, None),
        EventPayload::ValidationCompleted(_) => (EventKind::ValidationCompleted, None),
        _ => return None,
    };
    Some(Key { kind, scope })
}

/// The bounded queue. See the module documentation for what it drops.
#[derive(Debug)]
pub(crate) struct Spill {
    queue: VecDeque<Arc<Event>>,
    /// Events per key in `queue`.
    counts: HashMap<Key, usize>,
    /// Events in `queue` that have an older one of the same key.
    repeats: usize,
    capacity: usize,
}

impl Spill {
    /// An empty queue that starts dropping superseded events at `capacity`.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            counts: HashMap::new(),
            repeats: 0,
            capacity: capacity.max(1),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(crate) fn front(&self) -> Option<&Arc<Event>> {
        self.queue.front()
    }

    /// Removes the front event (it entered the channel).
    pub(crate) fn pop_front(&mut self) -> Option<Arc<Event>> {
        let event = self.queue.pop_front()?;
        self.forget(&event);
        Some(event)
    }

    /// Appends `event`. When the queue is full, first drops the oldest event that a
    /// newer one (queued, or `event`) supersedes and returns it; when there is none,
    /// the queue grows past its capacity.
    pub(crate) fn push(&mut self, event: Arc<Event>) -> Option<Arc<Event>> {
        let mut event = event;
        let dropped = if self.queue.len() >= self.capacity {
            self.drop_superseded(&mut event)
        } else {
            None
        };
        if let Some(key) = key(&event) {
            let count = self.counts.entry(key).or_default();
            if *count > 0 {
                self.repeats += 1;
            }
            *count += 1;
        }
        self.queue.push_back(event);
        dropped
    }

    fn forget(&mut self, event: &Event) {
        let Some(key) = key(event) else {
            return;
        };
        if let Some(count) = self.counts.get_mut(&key) {
            *count -= 1;
            if *count > 0 {
                self.repeats -= 1;
            } else {
                self.counts.remove(&key);
            }
        }
    }

    /// Drops the oldest superseded event after the front one; merges its change
    /// report into the event that supersedes it.
    fn drop_superseded(&mut self, incoming: &mut Arc<Event>) -> Option<Arc<Event>> {
        let incoming_key = key(incoming);
        let queued = |key: &Key| self.counts.get(key).copied().unwrap_or(0);
        if self.repeats == 0 && incoming_key.as_ref().is_none_or(|k| queued(k) == 0) {
            return None;
        }
        let front_key = self.queue.front().and_then(|e| key(e));
        // Events of `key` after the front one, plus the incoming one.
        let later = |key: &Key| {
            queued(key) - usize::from(front_key.as_ref() == Some(key))
                + usize::from(incoming_key.as_ref() == Some(key))
        };
        let (index, key) = self
            .queue
            .iter()
            .enumerate()
            .skip(1)
            .find_map(|(index, event)| {
                let key = key(event)?;
                // The first of its key found is the oldest; superseded when another
                // of the same key follows it.
                (later(&key) >= 2).then_some((index, key))
            })?;
        let dropped = self.queue.remove(index)?;
        self.forget(&dropped);
        if key.kind == EventKind::ResourceIndexUpdated {
            let newer = self
                .queue
                .iter_mut()
                .skip(index)
                .find(|event| self::key(event).as_ref() == Some(&key))
                .unwrap_or(incoming);
            *newer = merge_change(&dropped, newer);
        }
        Some(dropped)
    }
}

/// `newer` with a change report covering `older`'s as well: every object either
/// names, as modified (which means "look at this object again"), except the objects
/// still gone after `newer`, which stay removed (the debouncer holds a removal out of
/// its leading edge).
fn merge_change(older: &Event, newer: &Arc<Event>) -> Arc<Event> {
    let (EventPayload::ResourceIndexUpdated(old), EventPayload::ResourceIndexUpdated(new)) =
        (&older.payload, &newer.payload)
    else {
        return newer.clone();
    };
    let names = |change: &ResourceChange| {
        change
            .added
            .iter()
            .chain(&change.modified)
            .chain(&change.removed)
            .cloned()
            .collect::<Vec<_>>()
    };
    let back: BTreeSet<_> = new
        .change
        .added
        .iter()
        .chain(&new.change.modified)
        .collect();
    let removed: BTreeSet<_> = old
        .change
        .removed
        .iter()
        .filter(|key| !back.contains(key))
        .chain(&new.change.removed)
        .cloned()
        .collect();
    let modified: BTreeSet<_> = names(&old.change)
        .into_iter()
        .chain(names(&new.change))
        .filter(|key| !removed.contains(key))
        .collect();
    let mut merged = Event::clone(newer);
    merged.payload = EventPayload::ResourceIndexUpdated(ResourceIndexUpdated {
        change: Arc::new(ResourceChange {
            added: Vec::new(),
            modified: modified.into_iter().collect(),
            removed: removed.into_iter().collect(),
        }),
        ..new.clone()
    });
    Arc::new(merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventId;
    use crate::model::{ObjectKey, ResourceSnapshot};

    fn update(id: u64, added: &[&str], modified: &[&str], removed: &[&str]) -> Arc<Event> {
        let keys = |names: &[&str]| -> Vec<ObjectKey> {
            names
                .iter()
                .map(|name| ObjectKey::new("default", *name))
                .collect()
        };
        Arc::new(Event {
            id: EventId(id),
            correlation_id: None,
            caused_by: None,
            at: tokio::time::Instant::now(),
            unix_micros: 0,
            payload: EventPayload::ResourceIndexUpdated(ResourceIndexUpdated {
                source: "services".into(),
                snapshot: Arc::new(ResourceSnapshot::new(Vec::new())),
                change: Arc::new(ResourceChange {
                    added: keys(added),
                    modified: keys(modified),
                    removed: keys(removed),
                }),
            }),
        })
    }

    fn names(keys: &[ObjectKey]) -> Vec<String> {
        keys.iter().map(|key| key.name.clone()).collect()
    }

    #[test]
    fn a_merged_change_keeps_what_is_still_gone_removed() {
        let older = update(1, &["a"], &["b"], &["c", "d"]);
        // `d` came back; `e` went.
        let newer = update(2, &["d"], &[], &["e"]);
        let merged = merge_change(&older, &newer);
        let EventPayload::ResourceIndexUpdated(merged) = &merged.payload else {
            panic!("{merged:?}");
        };
        assert!(merged.change.added.is_empty());
        assert_eq!(names(&merged.change.modified), ["a", "b", "d"]);
        assert_eq!(names(&merged.change.removed), ["c", "e"]);
    }
}
