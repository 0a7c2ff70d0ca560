//! Resource objects as lazy template values over their stored JSON text.
//!
//! A snapshot keeps each object as its compact JSON text
//! ([`StoredObject`]). Templates read that text in place: a [`Doc`] wraps one stored
//! object with a **tape**, a flat structural index of the text built on the first
//! read of the object and kept for as long as the object is unchanged, and every
//! JSON object or array inside it reaches templates as a [`View`] (the document and
//! the position of the node). Nothing is converted ahead of time, and the controller
//! keeps no second copy of the objects:
//!
//! - the tape holds two numbers per JSON value (where it starts in the text and how
//!   many tape entries its subtree spans), 16-bit numbers when the text is shorter
//!   than 64 KiB, so a few bytes per value next to the text itself;
//! - an attribute or item lookup walks the children of one node on the tape (the
//!   subtree size skips over nested values), comparing key text in place;
//! - scalars are decoded from the text when read: strings are borrowed from the text
//!   and copied into the value (unescaped only when they contain an escape),
//!   numbers parsed as `serde_json` parses them;
//! - nested objects and arrays are views again: one small allocation per container
//!   a template reaches.
//!
//! To templates a view is exactly `minijinja`'s own map or list: keys in the order
//! written, attribute and item lookup, `in`, iteration, `|items`, `|dictsort`,
//! `|tojson`, `==`, printing, `.get()`/`.items()` behave the same (the tests of
//! [`super::context`] compare every one of them with the built-in values).
//!
//! Why a tape over the text: a tree of converted template values (what the renderer
//! kept before) took over five times the memory of the text, for every object,
//! read or not; scanning the text without an index would make every lookup step
//! over the text of all earlier members, nested values included. The tape is the
//! smallest structure that lets a lookup skip a nested value in one step. Its costs
//! are on the read: a member lookup compares the member names of its object in turn
//! (no hash or sorted index, which would cost memory for every object), and every
//! container a template reaches is a small allocation.
//!
//! Arrays remember how `sort_by` ordered them, as [`ResourceList`]s do: the order
//! is kept in the [`Doc`] as positions (never as values, which would hold the
//! document and make a reference cycle), so a nested list such as an endpoint
//! slice's `endpoints` sorts once per object version, not once per render.
//!
//! [`ResourceList`]: super::context::ResourceList

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use hapwright_eventbus::model::StoredObject;
use minijinja::value::{Enumerator, Object, ObjectExt, ObjectRepr, Value};

use super::words::equal_bytes;

/// At most this many `sort_by` orders are remembered per array (as for
/// [`super::context::ResourceList`]).
const SORT_MEMO_LIMIT: usize = 8;

// === tape ===

/// The structural index of one JSON text: for every JSON value in document order,
/// where its tape entry starts in the text and how many entries its subtree spans
/// (1 for a scalar). The children of the entry at `i` follow it directly; the next
/// sibling is at `i + size`. For an object member the entry starts at its key (the
/// opening quote), so one entry serves the key and the value.
enum Tape {
    /// Texts shorter than 64 KiB (nearly every object): 4 bytes per value.
    Narrow(Box<[[u16; 2]]>),
    /// Longer texts.
    Wide(Box<[[u32; 2]]>),
}

impl Tape {
    /// The tape of `text`, which must be valid JSON.
    fn build(text: &str) -> Self {
        let entries = scan(text.as_bytes());
        if text.len() <= usize::from(u16::MAX) {
            // Every entry starts inside the text and spans at most one entry per byte.
            Self::Narrow(
                entries
                    .iter()
                    .map(|&[start, size]| [start as u16, size as u16])
                    .collect(),
            )
        } else {
            Self::Wide(entries.into_boxed_slice())
        }
    }

    /// `(start, size)` of entry `i`.
    fn get(&self, i: usize) -> (usize, usize) {
        match self {
            Self::Narrow(entries) => {
                let [start, size] = entries[i];
                (usize::from(start), usize::from(size))
            }
            Self::Wide(entries) => {
                let [start, size] = entries[i];
                (start as usize, size as usize)
            }
        }
    }
}

fn skip_ws(b: &[u8], mut pos: usize) -> usize {
    while pos < b.len() && matches!(b[pos], b' ' | b'\t' | b'\n' | b'\r') {
        pos += 1;
    }
    pos
}

/// The end (one past the closing quote) of the string starting at `pos` (its opening
/// quote), and whether it contains an escape. Reads eight bytes at a time where the
/// text has them (strings are most of what lookups step over).
fn string_end(b: &[u8], pos: usize) -> (usize, bool) {
    let mut i = pos + 1;
    let mut escaped = false;
    loop {
        while let Some(chunk) = b.get(i..i + 8) {
            let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            let found = quote_or_backslash(word);
            if found == 0 {
                i += 8;
            } else {
                i += (found.trailing_zeros() / 8) as usize;
                break;
            }
        }
        match b.get(i) {
            Some(b'"') => return (i + 1, escaped),
            Some(b'\\') => {
                escaped = true;
                i += 2;
            }
            Some(_) => i += 1,
            None => return (b.len(), escaped),
        }
    }
}

/// The quotes and backslashes of `word` (eight bytes of text read little-endian), as
/// [`equal_bytes`] flags them: exact for the first, which is all [`string_end`] reads.
fn quote_or_backslash(word: u64) -> u64 {
    equal_bytes(word, b'"') | equal_bytes(word, b'\\')
}

/// Where the string whose opening quote is at `pos` ends (one past its closing quote)
/// when it is `key`. `plain`: the key holds no backslash or quote, so the text of an
/// equal name is the key's bytes unless the name holds an escape. Compares in place;
/// unescapes only names with an escape.
#[inline]
fn name_end(text: &str, pos: usize, key: &str, plain: bool) -> Option<usize> {
    let b = text.as_bytes();
    if !plain {
        return (string_at(text, pos) == key).then(|| string_end(b, pos).0);
    }
    let name = &b[pos + 1..];
    let k = key.as_bytes();
    // The common case first: a name as long as the key, then the same bytes. (A name
    // written with an escape is longer than its text, and one with a different
    // length is only compared below, byte by byte up to where it differs.)
    if name.get(k.len()) == Some(&b'"') && name[..k.len()] == *k {
        return Some(pos + k.len() + 2);
    }
    let same = name.iter().zip(k).take_while(|(a, b)| a == b).count();
    match name.get(same) {
        // The name holds an escape from here on: compare it unescaped.
        Some(b'\\') => (string_at(text, pos) == key).then(|| string_end(b, pos).0),
        Some(b'"') => (same == k.len()).then_some(pos + same + 2),
        _ => None,
    }
}

/// The tape entry of the member named `key` among the children of object entry
/// `node`, and where its name ends: the loop of [`View::find`], once per tape width
/// so the entries are read without a branch on the width. Most member names differ
/// from the key in their first byte, which is checked before anything else.
fn find_member<T: Entry>(
    entries: &[[T; 2]],
    node: usize,
    text: &str,
    key: &str,
    plain: bool,
) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    let end = node + entries[node][1].get();
    let first = key.as_bytes().first().copied().unwrap_or(b'"');
    let mut i = node + 1;
    while i < end {
        let [start, size] = entries[i];
        let start = start.get();
        // `start` is the member's opening quote; the name follows.
        let lead = b.get(start + 1).copied();
        if (lead == Some(first) || lead == Some(b'\\') || !plain)
            && let Some(name_end) = name_end(text, start, key, plain)
        {
            return Some((i, name_end));
        }
        i += size.get();
    }
    None
}

/// A tape number of either width.
trait Entry: Copy {
    fn get(self) -> usize;
}

impl Entry for u16 {
    fn get(self) -> usize {
        usize::from(self)
    }
}

impl Entry for u32 {
    fn get(self) -> usize {
        self as usize
    }
}

/// The end of the number or literal starting at `pos`.
fn scalar_end(b: &[u8], mut pos: usize) -> usize {
    while pos < b.len() && !matches!(b[pos], b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r') {
        pos += 1;
    }
    pos
}

/// The tape entries of a valid JSON text (see [`Tape`]). Iterative, so deep nesting
/// cannot overflow the stack.
fn scan(b: &[u8]) -> Vec<[u32; 2]> {
    let mut entries: Vec<[u32; 2]> = Vec::with_capacity(b.len() / 12 + 1);
    // Open containers: (entry, is an object).
    let mut open: Vec<(usize, bool)> = Vec::new();
    let mut pos = skip_ws(b, 0);
    // The entry start of the next value (its key for an object member).
    let mut entry_start = pos;
    loop {
        // A value at `pos`.
        entries.push([entry_start as u32, 1]);
        match b.get(pos) {
            Some(b'{') | Some(b'[') => {
                open.push((entries.len() - 1, b[pos] == b'{'));
                pos = skip_ws(b, pos + 1);
                if matches!(b.get(pos), Some(b'}') | Some(b']')) {
                    // Empty: closed below.
                } else {
                    let (next, start) = member_start(b, pos, open.last().is_some_and(|o| o.1));
                    entry_start = start;
                    pos = next;
                    continue;
                }
            }
            Some(b'"') => pos = string_end(b, pos).0,
            Some(_) => pos = scalar_end(b, pos),
            None => break,
        }
        // After a value: close containers, or go on with the next member.
        loop {
            pos = skip_ws(b, pos);
            let Some(&(entry, is_object)) = open.last() else {
                return entries;
            };
            match b.get(pos) {
                Some(b',') => {
                    let (next, start) = member_start(b, skip_ws(b, pos + 1), is_object);
                    entry_start = start;
                    pos = next;
                    break;
                }
                Some(b'}') | Some(b']') => {
                    entries[entry][1] = (entries.len() - entry) as u32;
                    open.pop();
                    pos += 1;
                }
                // Not valid JSON: stop, with what was found.
                _ => return entries,
            }
        }
    }
    entries
}

/// For the next child of a container at `pos`: where its value starts and where its
/// entry starts (its key, in an object).
fn member_start(b: &[u8], pos: usize, in_object: bool) -> (usize, usize) {
    if !in_object {
        return (pos, pos);
    }
    let (key_end, _) = string_end(b, pos);
    let colon = skip_ws(b, key_end);
    (skip_ws(b, colon + 1), pos)
}

// === impl Doc ===

/// One stored object as templates read it: the text, its tape (built on first
/// read) and the remembered `sort_by` orders of its arrays.
pub(crate) struct Doc {
    object: StoredObject,
    tape: OnceLock<Tape>,
    sorted: Mutex<Vec<ArrayMemo>>,
}

/// One remembered `sort_by` of the array at `node`: the children's tape entries in
/// sorted order (`None`: already in that order).
struct ArrayMemo {
    node: u32,
    paths: Box<[Box<str>]>,
    reverse: bool,
    order: Option<Box<[u32]>>,
}

impl fmt::Debug for Doc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Doc").field(&self.object).finish()
    }
}

impl Doc {
    /// The template value of `object`: a view of its root (or the scalar it is).
    pub(crate) fn root(object: StoredObject) -> Value {
        let doc = Arc::new(Self {
            object,
            tape: OnceLock::new(),
            sorted: Mutex::new(Vec::new()),
        });
        let start = skip_ws(doc.text().as_bytes(), 0);
        value_at(&doc, 0, start)
    }

    fn text(&self) -> &str {
        self.object.json()
    }

    fn tape(&self) -> &Tape {
        self.tape.get_or_init(|| Tape::build(self.text()))
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, Vec<ArrayMemo>> {
        self.sorted
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The value starting at byte `start`, tape entry `node`.
fn value_at(doc: &Arc<Doc>, node: usize, start: usize) -> Value {
    let text = doc.text();
    let b = text.as_bytes();
    match b.get(start) {
        Some(b'{') | Some(b'[') => Value::from_object(View {
            doc: doc.clone(),
            node: node as u32,
            start: start as u32,
        }),
        Some(b'"') => Value::from(string_at(text, start)),
        Some(b't') => Value::from(true),
        Some(b'f') => Value::from(false),
        Some(b'n') | None => Value::from(()),
        Some(_) => number(&text[start..scalar_end(b, start)]),
    }
}

/// The string starting at `start` (its opening quote), unescaped.
fn string_at(text: &str, start: usize) -> Cow<'_, str> {
    let (end, escaped) = string_end(text.as_bytes(), start);
    if escaped {
        Cow::Owned(serde_json::from_str(&text[start..end]).expect("a stored string is valid JSON"))
    } else {
        Cow::Borrowed(&text[start + 1..end - 1])
    }
}

/// A JSON number as `serde_json` hands it to a deserializer: non-negative integers
/// as `u64`, negative ones as `i64`, everything else (fractions, exponents, integers
/// out of range) as `f64`.
fn number(text: &str) -> Value {
    if !text.contains(['.', 'e', 'E']) {
        if text.starts_with('-') {
            if let Ok(n) = text.parse::<i64>() {
                return Value::from(n);
            }
        } else if let Ok(n) = text.parse::<u64>() {
            return Value::from(n);
        }
    }
    Value::from(serde_json::from_str::<f64>(text).expect("a stored number is valid JSON"))
}

// === impl View ===

/// A JSON object or array inside a stored object; see the [module docs](self).
pub(crate) struct View {
    doc: Arc<Doc>,
    /// Tape entry.
    node: u32,
    /// Where the value (`{` or `[`) starts in the text.
    start: u32,
}

impl fmt::Debug for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("View")
            .field("node", &self.node)
            .field("start", &self.start)
            .finish()
    }
}

/// One child of a view: its tape entry, its key (an object member) and where its
/// value starts.
struct Child {
    node: usize,
    /// The key's text between the quotes, and whether it has escapes.
    key: Option<(usize, usize, bool)>,
    start: usize,
}

impl View {
    fn is_object(&self) -> bool {
        self.doc.text().as_bytes()[self.start as usize] == b'{'
    }

    /// The children, in the order written.
    fn children(&self) -> impl Iterator<Item = Child> + '_ {
        let tape = self.doc.tape();
        let b = self.doc.text().as_bytes();
        let is_object = self.is_object();
        let node = self.node as usize;
        let end = node + tape.get(node).1;
        let mut i = node + 1;
        std::iter::from_fn(move || {
            if i >= end {
                return None;
            }
            let (entry, size) = tape.get(i);
            let child = if is_object {
                let (key_end, escaped) = string_end(b, entry);
                let colon = skip_ws(b, key_end);
                Child {
                    node: i,
                    key: Some((entry + 1, key_end - 1, escaped)),
                    start: skip_ws(b, colon + 1),
                }
            } else {
                Child {
                    node: i,
                    key: None,
                    start: entry,
                }
            };
            i += size;
            Some(child)
        })
    }

    fn len(&self) -> usize {
        self.children().count()
    }

    fn key_of(&self, child: &Child) -> Value {
        match child.key {
            Some((start, end, escaped)) => {
                let text = self.doc.text();
                if escaped {
                    Value::from(string_at(text, start - 1).into_owned())
                } else {
                    Value::from(&text[start..end])
                }
            }
            None => Value::UNDEFINED,
        }
    }

    fn value_of(&self, child: &Child) -> Value {
        value_at(&self.doc, child.node, child.start)
    }

    /// The value of member `key`. The hottest path of rendering (every attribute a
    /// template reads), so it walks the tape itself: a member name is compared in
    /// place and only the matching member's value position is worked out.
    fn find(&self, key: &str) -> Option<Value> {
        if !self.is_object() {
            return None;
        }
        let b = self.doc.text().as_bytes();
        let plain = !key.bytes().any(|c| c == b'\\' || c == b'"');
        let node = self.node as usize;
        let (found, key_end) = match self.doc.tape() {
            Tape::Narrow(entries) => find_member(entries, node, self.doc.text(), key, plain),
            Tape::Wide(entries) => find_member(entries, node, self.doc.text(), key, plain),
        }?;
        let colon = skip_ws(b, key_end);
        Some(value_at(&self.doc, found, skip_ws(b, colon + 1)))
    }

    /// An array's items.
    pub(crate) fn items(&self) -> Vec<Value> {
        self.children().map(|child| self.value_of(&child)).collect()
    }

    /// Whether this is an array (only arrays remember `sort_by` orders).
    pub(crate) fn is_array(&self) -> bool {
        !self.is_object()
    }

    /// A remembered `sort_by(paths, reverse)` of this array: `Some(None)` when the
    /// array is already in that order, `Some(Some(sorted))` otherwise; `None` when
    /// not remembered.
    pub(crate) fn sorted(&self, paths: &[Cow<'_, str>], reverse: bool) -> Option<Option<Value>> {
        let order: Option<Vec<u32>> = {
            let memo = self.doc.memo();
            let found = memo.iter().find(|memo| {
                memo.node == self.node
                    && memo.reverse == reverse
                    && memo.paths.len() == paths.len()
                    && memo.paths.iter().zip(paths).all(|(a, b)| **a == **b)
            })?;
            found.order.as_ref().map(|order| order.to_vec())
        };
        Some(order.map(|order| {
            let children: Vec<Child> = self.children().collect();
            Value::from(
                order
                    .into_iter()
                    .map(|position| self.value_of(&children[position as usize]))
                    .collect::<Vec<_>>(),
            )
        }))
    }

    /// Remembers the result of `sort_by(paths, reverse)` as positions of the items
    /// in sorted order (`None`: already in order); see [`Self::sorted`].
    pub(crate) fn remember_sorted(
        &self,
        paths: &[Cow<'_, str>],
        reverse: bool,
        order: Option<&[usize]>,
    ) {
        let mut memo = self.doc.memo();
        if memo.iter().filter(|m| m.node == self.node).count() < SORT_MEMO_LIMIT {
            // One memo per document is usual (an endpoint slice's `endpoints`): no
            // spare room, which every object would carry.
            memo.reserve_exact(1);
            memo.push(ArrayMemo {
                node: self.node,
                paths: paths.iter().map(|p| Box::from(p.as_ref())).collect(),
                reverse,
                order: order.map(|order| order.iter().map(|&i| i as u32).collect()),
            });
        }
    }
}

impl Object for View {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        if self.is_object() {
            ObjectRepr::Map
        } else {
            ObjectRepr::Seq
        }
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        if self.is_object() {
            // JSON keys are strings: any other key finds nothing, as in the built-in
            // map.
            self.find(key.as_str()?)
        } else {
            let index = key.as_usize()?;
            self.children()
                .nth(index)
                .map(|child| self.value_of(&child))
        }
    }

    fn get_value_by_str(self: &Arc<Self>, key: &str) -> Option<Value> {
        if self.is_object() {
            self.find(key)
        } else {
            None
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        if self.is_object() {
            // Reversible (key, value) pairs, like the built-in map (`|reverse`,
            // `|items`, `|dictsort` and equality read the pairs without lookups).
            self.mapped_rev_key_value_enumerator(|this| {
                let pairs: Vec<(Value, Value)> = this
                    .children()
                    .map(|child| (this.key_of(&child), this.value_of(&child)))
                    .collect();
                Box::new(pairs.into_iter())
            })
        } else {
            Enumerator::Values(self.items())
        }
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.len())
    }

    fn is_true(self: &Arc<Self>) -> bool {
        self.children().next().is_some()
    }
}

/// The identity of a view (its document and node), `None` for any other value.
/// Documents are immutable and kept while their object is unchanged, so while a
/// clone of the value is held, the same identity means the same, unchanged content.
pub(crate) fn identity(value: &Value) -> Option<(usize, u32)> {
    value
        .downcast_object_ref::<View>()
        .map(|view| (Arc::as_ptr(&view.doc) as usize, view.node))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entries(text: &str) -> Vec<(usize, usize)> {
        let tape = Tape::build(text);
        let len = match &tape {
            Tape::Narrow(e) => e.len(),
            Tape::Wide(e) => e.len(),
        };
        (0..len).map(|i| tape.get(i)).collect()
    }

    #[test]
    fn the_tape_has_one_entry_per_value_starting_at_member_keys() {
        let text = r#"{"a":1,"b":[true,{"c":"x\"}"}],"d":{}}"#;
        assert_eq!(
            entries(text),
            vec![
                (0, 7),  // the object
                (1, 1),  // "a":1
                (7, 4),  // "b":[...]
                (12, 1), // true
                (17, 2), // {"c":...}
                (18, 1), // "c":"x\"}"
                (31, 1), // "d":{}
            ]
        );
        assert_eq!(entries("[]"), vec![(0, 1)]);
        assert_eq!(entries("-1.5e3"), vec![(0, 1)]);
    }

    #[test]
    fn member_names_compare_in_place_and_through_escapes() {
        let text = r#"{"ab":1,"a":2,"\u0061c":3,"a\\b":4,"x\"":5,"":6,"é":7,"a\"":8}"#;
        let starts: Vec<usize> = entries(text)[1..].iter().map(|&(s, _)| s).collect();
        let names: Vec<String> = starts
            .iter()
            .map(|&s| string_at(text, s).into_owned())
            .collect();
        assert_eq!(names[2], "ac");
        for key in [
            "ab", "a", "ac", "a\\b", "x\"", "", "é", "abc", "b", "a\"", "\u{e9}",
        ] {
            let plain = !key.bytes().any(|c| c == b'\\' || c == b'"');
            for (&start, name) in starts.iter().zip(&names) {
                assert_eq!(
                    name_end(text, start, key, plain),
                    (name == key).then(|| string_end(text.as_bytes(), start).0),
                    "{key:?} against {name:?}"
                );
            }
        }
    }

    /// [`string_end`] one byte at a time, as it was before it read words.
    fn string_end_bytewise(b: &[u8], pos: usize) -> (usize, bool) {
        let mut i = pos + 1;
        let mut escaped = false;
        while i < b.len() {
            match b[i] {
                b'"' => return (i + 1, escaped),
                b'\\' => {
                    escaped = true;
                    i += 2;
                }
                _ => i += 1,
            }
        }
        (b.len(), escaped)
    }

    proptest::proptest! {
        /// Strings of quotes, backslashes, multi-byte and plain characters, at every
        /// offset against the eight-byte words, with or without text after them.
        #[test]
        fn string_ends_are_found_word_by_word_as_byte_by_byte(
            chars in proptest::collection::vec(
                proptest::sample::select(vec!['a', '"', '\\', '\u{e9}', '\u{20ac}', '\n', '/', '\u{1}']),
                0..40,
            ),
            before in 0usize..9,
            after in proptest::sample::select(vec!["", ",\"k\":1}", "\"\"\\\"x"]),
        ) {
            let string: String = chars.into_iter().collect();
            let text = format!("{}{}{after}", " ".repeat(before), serde_json::to_string(&string).expect("a string"));
            let b = text.as_bytes();
            proptest::prop_assert_eq!(string_end(b, before), string_end_bytewise(b, before));
            let (end, _) = string_end(b, before);
            proptest::prop_assert_eq!(string_at(&text, before), string.as_str());
            proptest::prop_assert_eq!(end, before + serde_json::to_string(&string).expect("a string").len());
        }
    }

    #[test]
    fn long_texts_use_wide_entries() {
        let long = json!({"a": "x".repeat(70_000), "b": [1, 2]});
        let stored = StoredObject::from_value(&long);
        let value = Doc::root(stored);
        assert_eq!(value.get_attr("b").expect("b").len(), Some(2));
        let view = value.downcast_object_ref::<View>().expect("a view");
        assert!(matches!(view.doc.tape(), Tape::Wide(_)));
        assert_eq!(
            value.get_attr("a").expect("a").as_str().map(str::len),
            Some(70_000)
        );
    }

    #[test]
    fn scalars_decode_as_serde_json_reads_them() {
        let object = json!({
            "u": 18446744073709551615u64, "i": -9223372036854775808i64, "f": 1e300,
            "neg": -0.25, "big": 1.8446744073709552e19, "s": "tab\there \u{e9} \"q\"",
            "k\"ey": 1, "n": null, "t": true, "e": "",
        });
        let stored = StoredObject::from_value(&object);
        let ours = Doc::root(stored.clone());
        let theirs: Value = stored.deserialize().expect("valid JSON");
        for key in ["u", "i", "f", "neg", "big", "s", "k\"ey", "n", "t", "e"] {
            let (a, b) = (
                ours.get_attr(key).expect("found"),
                theirs.get_attr(key).expect("found"),
            );
            assert_eq!(a, b, "{key}");
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{key}");
        }
        assert_eq!(ours.to_string(), theirs.to_string());
    }
}
