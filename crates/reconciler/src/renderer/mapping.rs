//! [`Mapping`]: the compact template value of a JSON object inside a resource.
//!
//! To templates a mapping is exactly what `minijinja`'s own map is (an object with
//! [`ObjectRepr::Map`], keys in the order written, looked up by string, iterated as
//! keys, `(key, value)` pairs for `|items`, `|dictsort`, `|tojson`, `==`, ...): the
//! built-in map is itself only an [`Object`] over an `IndexMap<Value, Value>`, and
//! [`Mapping`] answers every method of that trait the same way.
//!
//! It differs in what it costs. The built-in map is three heap blocks (the `Arc`'d
//! `IndexMap` struct of ~72 bytes, its entries at 56 bytes each with a stored hash,
//! grown by doubling, and a hash table), reached through two pointers. A [`Mapping`]
//! of up to [`INLINE_MAX`] entries is **one** block: the reference counts followed
//! directly by the `(key, value)` pairs (48 bytes each), so reading an attribute of
//! a map just reached touches the cache lines the reference-count increment already
//! loaded. Lookups scan the pairs comparing strings, as the built-in map does up to
//! 12 entries. Larger mappings (a ConfigMap's `data`, long annotation lists) keep
//! their pairs in a second block with a sorted index for binary search, so a lookup
//! stays O(log n). The empty mapping is one shared value.
//!
//! Keys of up to 22 bytes are stored inside the [`Value`] itself (no allocation).
//! Longer keys, mostly the prefixed label and annotation names that recur across many
//! objects (`kubernetes.io/service-name`, `meta.helm.sh/release-name`, ...), are
//! interned: see [`key`].

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};

use minijinja::value::{Enumerator, Object, ObjectExt, Value};

/// One `(key, value)` pair.
pub(crate) type Entry = (Value, Value);

/// Mappings of at most this many pairs are stored inline, in one allocation, and
/// looked up by a linear scan.
pub(crate) const INLINE_MAX: usize = 16;

/// Keys of at most this many bytes are stored inside the [`Value`] (minijinja's
/// small-string optimization), so interning them would gain nothing.
const INLINE_KEY_MAX: usize = 22;

/// Keys longer than this are not interned: long keys are rare and seldom repeat.
const INTERN_MAX_LEN: usize = 128;

/// The interner holds at most this many keys (at most ~0.7 MB with their text).
const INTERN_CAPACITY: usize = 4096;

/// Interned long keys. Keys come from user data (label and annotation names), so the
/// set must not grow with what users write: it is bounded by [`INTERN_CAPACITY`]
/// keys of at most [`INTERN_MAX_LEN`] bytes, and when full it is emptied and refills
/// with the keys seen from then on. The keys that recur across objects (the only
/// ones interning helps) are back after their next sighting; keys still used by live
/// values stay alive through those values, not through the set. A generational reset
/// keeps the code trivial and the lock short; an LRU would cost bookkeeping on every
/// hit for little gain.
static INTERNED: LazyLock<Mutex<HashSet<Arc<str>>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

/// A mapping key as a template value: short keys inline, longer ones (up to
/// [`INTERN_MAX_LEN`] bytes) shared through the bounded interner, so ten thousand
/// endpoint slices hold one `kubernetes.io/service-name`, not ten thousand.
pub(crate) fn key(text: &str) -> Value {
    if text.len() <= INLINE_KEY_MAX || text.len() > INTERN_MAX_LEN {
        return Value::from(text);
    }
    let mut interned = INTERNED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(shared) = interned.get(text) {
        return Value::from(shared.clone());
    }
    if interned.len() >= INTERN_CAPACITY {
        interned.clear();
    }
    let shared: Arc<str> = Arc::from(text);
    interned.insert(shared.clone());
    Value::from(shared)
}

/// A mapping key deserialized from JSON (always a string), through [`key`].
pub(crate) struct Key(pub(crate) Value);

impl<'de> serde::Deserialize<'de> for Key {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(KeyVisitor).map(Key)
    }
}

struct KeyVisitor;

impl serde::de::Visitor<'_> for KeyVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string mapping key")
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(key(v))
    }
}

// === storage ===

/// How a [`Mapping`] holds its pairs.
pub(crate) trait Entries: Send + Sync + 'static {
    /// The pairs, in the order written.
    fn entries(&self) -> &[Entry];

    /// The value of a string key.
    fn find(&self, key: &str) -> Option<&Value> {
        self.entries()
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }
}

impl<const N: usize> Entries for [Entry; N] {
    fn entries(&self) -> &[Entry] {
        self
    }
}

/// The pairs of a large mapping, with the positions of the string keys in key order
/// for binary search (`None` when a key is not a string, which JSON never has: then
/// lookups scan).
pub(crate) struct Indexed {
    entries: Box<[Entry]>,
    order: Option<Box<[u32]>>,
}

impl Entries for Indexed {
    fn entries(&self) -> &[Entry] {
        &self.entries
    }

    fn find(&self, key: &str) -> Option<&Value> {
        let Some(order) = &self.order else {
            return self
                .entries
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v);
        };
        let position = order
            .binary_search_by(|&i| key_str(&self.entries[i as usize]).cmp(key))
            .ok()?;
        Some(&self.entries[order[position] as usize].1)
    }
}

/// The key of an entry of an [`Indexed`] with an order (all keys are strings).
fn key_str(entry: &Entry) -> &str {
    entry.0.as_str().unwrap_or_default()
}

// === impl Mapping ===

/// A JSON object as a template value; see the [module docs](self).
pub(crate) struct Mapping<E>(E);

impl<E: Entries> Mapping<E> {
    /// The pairs, in the order written.
    pub(crate) fn entries(&self) -> &[Entry] {
        self.0.entries()
    }
}

impl<E: Entries> fmt::Debug for Mapping<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.entries().iter().map(|(k, v)| (k, v)))
            .finish()
    }
}

impl<E: Entries> Object for Mapping<E> {
    // `repr` is the default, `ObjectRepr::Map`, as for the built-in map.

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str() {
            Some(text) => self.0.find(text).cloned(),
            // Only a key equal to a non-string key finds it, as in the built-in map.
            None => self
                .entries()
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone()),
        }
    }

    fn get_value_by_str(self: &Arc<Self>, key: &str) -> Option<Value> {
        self.0.find(key).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        // Reversible (key, value) pairs, like the built-in map (`|reverse`,
        // `|items`, `|dictsort` and equality read the pairs without lookups).
        self.mapped_rev_key_value_enumerator(|this| {
            Box::new(this.entries().iter().map(|(k, v)| (k.clone(), v.clone())))
        })
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.entries().len())
    }

    fn is_true(self: &Arc<Self>) -> bool {
        !self.entries().is_empty()
    }
}

/// The one empty mapping (every `{}`, e.g. each Service's `status.loadBalancer`).
static EMPTY: LazyLock<Value> = LazyLock::new(|| Value::from_object(Mapping::<[Entry; 0]>([])));

/// An inline mapping of exactly `N` pairs taken from `pairs`.
fn inline<const N: usize>(pairs: &mut impl Iterator<Item = Entry>) -> Value {
    Value::from_object(Mapping::<[Entry; N]>(std::array::from_fn(|_| {
        pairs.next().expect("exactly N pairs")
    })))
}

/// A mapping of `len` pairs (no duplicate keys) from `pairs`: inline up to
/// [`INLINE_MAX`], else a vector.
fn from_unique(len: usize, pairs: impl Iterator<Item = Entry>) -> Value {
    let mut pairs = pairs;
    macro_rules! by_len {
        ($($n:literal)*) => {
            match len {
                0 => EMPTY.clone(),
                $($n => inline::<$n>(&mut pairs),)*
                _ => indexed(pairs.collect()),
            }
        };
    }
    by_len!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}

/// A large mapping with its lookup index (duplicate keys resolved as in
/// [`from_entries`]).
fn indexed(entries: Vec<Entry>) -> Value {
    let order = if entries.iter().all(|(k, _)| k.as_str().is_some()) {
        let mut order: Vec<u32> = (0..entries.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| {
            key_str(&entries[a as usize]).cmp(key_str(&entries[b as usize]))
        });
        if order
            .windows(2)
            .any(|w| key_str(&entries[w[0] as usize]) == key_str(&entries[w[1] as usize]))
        {
            return from_entries(dedup(entries));
        }
        Some(order.into_boxed_slice())
    } else {
        if has_duplicates(&entries) {
            return from_entries(dedup(entries));
        }
        None
    };
    Value::from_object(Mapping(Indexed {
        entries: entries.into_boxed_slice(),
        order,
    }))
}

/// Whether two pairs have equal keys (quadratic: for small mappings).
fn has_duplicates(entries: &[Entry]) -> bool {
    entries
        .iter()
        .enumerate()
        .any(|(i, (key, _))| entries[..i].iter().any(|(other, _)| other == key))
}

/// The pairs with each key once, at its first position, with its last value: what
/// the built-in map (an `IndexMap`) makes of repeated keys. Stored objects never
/// repeat a key (they are serialized from parsed JSON), so this is for fidelity only.
fn dedup(entries: Vec<Entry>) -> Vec<Entry> {
    let mut unique: Vec<Entry> = Vec::with_capacity(entries.len());
    let mut positions: HashMap<Value, usize> = HashMap::new();
    for (key, value) in entries {
        match positions.get(&key) {
            Some(&at) => unique[at].1 = value,
            None => {
                positions.insert(key.clone(), unique.len());
                unique.push((key, value));
            }
        }
    }
    unique
}

/// A mapping of `entries`, in their order; a repeated key keeps its first position
/// and its last value, as in `Value::from_pairs`.
pub(crate) fn from_entries(entries: Vec<Entry>) -> Value {
    if entries.len() <= INLINE_MAX {
        if has_duplicates(&entries) {
            let unique = dedup(entries);
            return from_unique(unique.len(), unique.into_iter());
        }
        return from_unique(entries.len(), entries.into_iter());
    }
    indexed(entries)
}

// === MappingBuilder ===

/// Upper bound (in pairs) of the scratch buffer kept between conversions.
const SCRATCH_KEEP: usize = 4096;

thread_local! {
    /// The pairs of the mappings being deserialized on this thread, innermost last:
    /// a nested mapping is finished before its parent continues, so one buffer
    /// serves them all and a mapping is built without a vector of its own.
    static SCRATCH: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
}

/// Builds one [`Mapping`] pair by pair (see [`SCRATCH`]). Dropped unfinished (an
/// error), it discards its pairs.
pub(crate) struct MappingBuilder {
    start: usize,
}

impl MappingBuilder {
    /// Starts a mapping.
    pub(crate) fn new() -> Self {
        Self {
            start: SCRATCH.with_borrow(Vec::len),
        }
    }

    /// Adds a pair.
    pub(crate) fn push(&mut self, key: Value, value: Value) {
        SCRATCH.with_borrow_mut(|scratch| scratch.push((key, value)));
    }

    /// The mapping.
    pub(crate) fn finish(self) -> Value {
        SCRATCH.with_borrow_mut(|scratch| {
            let pairs = &scratch[self.start..];
            let value = if pairs.len() <= INLINE_MAX && !has_duplicates(pairs) {
                from_unique(pairs.len(), scratch.drain(self.start..))
            } else {
                from_entries(scratch.drain(self.start..).collect())
            };
            if self.start == 0 && scratch.capacity() > SCRATCH_KEEP {
                scratch.shrink_to(SCRATCH_KEEP);
            }
            value
        })
    }
}

impl Drop for MappingBuilder {
    fn drop(&mut self) {
        // After `finish` the pairs are gone already; after an error they are dropped
        // here, outside the borrow (a value's drop never touches the scratch, but
        // keep the borrow short anyway).
        let discarded: Vec<Entry> = SCRATCH.with_borrow_mut(|scratch| {
            if scratch.len() > self.start {
                scratch.split_off(self.start)
            } else {
                Vec::new()
            }
        });
        drop(discarded);
    }
}

/// The identity of a resource mapping (the address of its storage), `None` for any
/// other value. Converted objects are immutable and kept while their object is
/// unchanged, so while a clone of the value is held, the same identity means the
/// same, unchanged content.
pub(crate) fn identity(value: &Value) -> Option<usize> {
    macro_rules! inline {
        ($($n:literal)*) => {
            $(
                if let Some(mapping) = value.downcast_object_ref::<Mapping<[Entry; $n]>>() {
                    return Some(std::ptr::from_ref(mapping) as usize);
                }
            )*
        };
    }
    inline!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
    value
        .downcast_object_ref::<Mapping<Indexed>>()
        .map(|mapping| std::ptr::from_ref(mapping) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(keys: &[&str]) -> Vec<Entry> {
        keys.iter()
            .enumerate()
            .map(|(i, k)| (Value::from(*k), Value::from(i)))
            .collect()
    }

    fn builtin(entries: &[Entry]) -> Value {
        Value::from_pairs(entries.iter().cloned())
    }

    #[test]
    fn every_size_and_repeated_keys_match_the_builtin_map() {
        for len in [0, 1, 2, 7, INLINE_MAX, INLINE_MAX + 1, 100] {
            let names: Vec<String> = (0..len).map(|i| format!("k{}", (i * 37) % 101)).collect();
            let mut entries = pairs(&names.iter().map(String::as_str).collect::<Vec<_>>());
            // A repeated key: first position, last value.
            if len > 1 {
                entries.push((entries[0].0.clone(), Value::from("last")));
            }
            let ours = from_entries(entries.clone());
            let theirs = builtin(&entries);
            assert_eq!(ours, theirs, "{len}");
            assert_eq!(ours.to_string(), theirs.to_string(), "{len}");
            assert_eq!(ours.len(), theirs.len(), "{len}");
            for (key, _) in &entries {
                let key = key.as_str().expect("string key");
                assert_eq!(ours.get_attr(key).ok(), theirs.get_attr(key).ok(), "{key}");
            }
            assert!(ours.get_attr("missing").expect("lookup").is_undefined());
            assert!(
                ours.get_item(&Value::from(0))
                    .expect("lookup")
                    .is_undefined()
            );
        }
    }

    #[test]
    fn non_string_keys_are_found_by_equal_keys_only() {
        let entries = vec![
            (Value::from(1), Value::from("one")),
            (Value::from("1"), Value::from("string one")),
        ];
        for ours in [
            from_entries(entries.clone()),
            indexed(
                entries
                    .iter()
                    .cloned()
                    .chain((0..INLINE_MAX).map(|i| (Value::from(format!("x{i}")), Value::from(i))))
                    .collect(),
            ),
        ] {
            assert_eq!(
                ours.get_item(&Value::from(1)).ok(),
                Some(Value::from("one"))
            );
            assert_eq!(ours.get_attr("1").ok(), Some(Value::from("string one")));
            assert!(
                ours.get_item(&Value::from(2))
                    .expect("lookup")
                    .is_undefined()
            );
        }
    }

    #[test]
    fn small_mappings_are_one_inline_block_and_empty_ones_shared() {
        let three = from_entries(pairs(&["a", "b", "c"]));
        assert!(three.downcast_object_ref::<Mapping<[Entry; 3]>>().is_some());
        let large = from_entries(pairs(
            &(0..20)
                .map(|i| format!("k{i}"))
                .collect::<Vec<_>>()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        ));
        assert!(large.downcast_object_ref::<Mapping<Indexed>>().is_some());
        let (a, b) = (from_entries(Vec::new()), from_entries(Vec::new()));
        assert!(!a.is_true());
        let a = a.as_object().expect("an object");
        let b = b.as_object().expect("an object");
        assert!(std::ptr::eq(
            a.downcast_ref::<Mapping<[Entry; 0]>>().expect("empty"),
            b.downcast_ref::<Mapping<[Entry; 0]>>().expect("empty")
        ));
    }

    #[test]
    fn long_keys_are_interned_and_the_interner_is_bounded() {
        let name = "kubernetes.io/service-name";
        let (a, b) = (key(name), key(name));
        assert_eq!(a.as_str(), Some(name));
        assert!(std::ptr::eq(
            a.as_str().expect("text").as_ptr(),
            b.as_str().expect("text").as_ptr()
        ));
        // Short and very long keys are not interned.
        let long = "x".repeat(INTERN_MAX_LEN + 1);
        assert!(!std::ptr::eq(
            key(&long).as_str().expect("text").as_ptr(),
            key(&long).as_str().expect("text").as_ptr()
        ));
        assert_eq!(key("metadata").as_str(), Some("metadata"));
        for i in 0..2 * INTERN_CAPACITY {
            key(&format!("example.com/one-off-annotation-{i}"));
        }
        let size = INTERNED.lock().expect("not poisoned").len();
        assert!(size <= INTERN_CAPACITY, "{size}");
        assert_eq!(key(name).as_str(), Some(name));
    }

    #[test]
    fn an_unfinished_builder_discards_its_pairs() {
        let mut outer = MappingBuilder::new();
        outer.push(Value::from("a"), Value::from(1));
        {
            let mut inner = MappingBuilder::new();
            inner.push(Value::from("lost"), Value::from(2));
            // Dropped without finish, as after a deserialization error.
        }
        let mut inner = MappingBuilder::new();
        inner.push(Value::from("x"), Value::from(3));
        outer.push(Value::from("b"), inner.finish());
        let value = outer.finish();
        assert_eq!(
            value,
            Value::from_pairs([
                (Value::from("a"), Value::from(1)),
                (
                    Value::from("b"),
                    Value::from_pairs([(Value::from("x"), Value::from(3))])
                ),
            ])
        );
        assert_eq!(SCRATCH.with_borrow(Vec::len), 0);
    }
}
