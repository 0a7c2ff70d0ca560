//! Stored resource objects: the canonical compact JSON text of one object.

use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Serialize, Serializer};
use serde_json::Value;

use super::FieldPath;

/// One object of a [`ResourceSnapshot`](super::ResourceSnapshot), kept as its
/// canonical compact JSON text (`serde_json::to_string` of the parsed value; with
/// serde_json's `preserve_order` the keys keep their document order, so the same
/// value always gives the same text).
///
/// Text is about a seventh of the heap of a parsed `serde_json::Value` (no map or
/// string allocation per key, no 80-byte value per node), and every consumer reads
/// it in the form it needs: the renderer reads the text in place through a
/// structural index of its own, [`deserialize`](Self::deserialize) goes straight
/// from the text to any `Deserialize` type, [`parse`](Self::parse) gives a
/// `serde_json::Value`.
///
/// Cloning is O(1) (the text is shared). Equality compares the text.
#[derive(Clone)]
pub struct StoredObject {
    json: Arc<str>,
}

impl StoredObject {
    /// Serializes `value` compactly. A Kubernetes Secret's values are registered with
    /// the process-wide [`redact`](crate::redact) set here, where every object enters
    /// a snapshot, so they are hidden wherever hapwright shows rendered content.
    pub fn from_value(value: &Value) -> Self {
        crate::redact::global().register_object(value);
        // A `Value` has string keys only, so serializing it cannot fail.
        let json = serde_json::to_string(value).expect("a JSON value always serializes");
        Self { json: json.into() }
    }

    /// The compact JSON text.
    pub fn json(&self) -> &str {
        &self.json
    }

    /// The object as a `serde_json::Value`. Parses the text and allocates the whole
    /// tree on every call: for debugging, tests and occasional use.
    pub fn parse(&self) -> Value {
        self.deserialize()
            .expect("a stored object is always valid JSON")
    }

    /// Deserializes the text into `T` (e.g. `minijinja::Value`), with no
    /// intermediate `serde_json::Value`.
    pub fn deserialize<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.json)
    }

    /// An identity for the shared text: equal for clones of one `StoredObject`,
    /// different from every other object alive at the same time. Lets a consumer
    /// cache a converted form while it holds a clone.
    pub fn address(&self) -> usize {
        Arc::as_ptr(&self.json).cast::<u8>() as usize
    }

    /// Size of the JSON text in bytes.
    pub fn len(&self) -> usize {
        self.json.len()
    }

    /// True for an empty text (never the case for an object built from a value).
    pub fn is_empty(&self) -> bool {
        self.json.is_empty()
    }
}

impl From<&Value> for StoredObject {
    fn from(value: &Value) -> Self {
        Self::from_value(value)
    }
}

impl PartialEq for StoredObject {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.json, &other.json) || self.json == other.json
    }
}

impl Eq for StoredObject {}

impl fmt::Debug for StoredObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const PREFIX: usize = 80;
        if self.json.len() <= PREFIX {
            write!(f, "StoredObject({})", self.json)
        } else {
            let mut end = PREFIX;
            while !self.json.is_char_boundary(end) {
                end -= 1;
            }
            write!(
                f,
                "StoredObject({}… {} bytes)",
                &self.json[..end],
                self.json.len()
            )
        }
    }
}

impl Serialize for StoredObject {
    /// Writes the object as a JSON value (not as a string), by parsing the text.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.parse().serialize(serializer)
    }
}

/// A [`StoredObject`] with its `indexBy` values, ready for
/// [`ResourceSnapshot::upsert_indexed`](super::ResourceSnapshot::upsert_indexed).
/// Lets a source serialize and index objects where it parses them (on its worker
/// threads) and keep them in that form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexedObject {
    pub(super) object: StoredObject,
    pub(super) index_key: Arc<[String]>,
}

impl IndexedObject {
    /// Serializes `value` and computes its values for the `index_by` paths (which
    /// must be the paths of the snapshot it goes into).
    pub fn new(value: &Value, index_by: &[FieldPath]) -> Self {
        Self {
            object: StoredObject::from_value(value),
            index_key: index_by
                .iter()
                .map(|path| path.index_value(value))
                .collect(),
        }
    }

    /// The stored object.
    pub fn object(&self) -> &StoredObject {
        &self.object
    }

    /// The object's `indexBy` values, in path order.
    pub fn index_key(&self) -> &[String] {
        &self.index_key
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keeps_key_order_and_round_trips() {
        let value = json!({"z": 1, "a": [1.5, "x", null, true], "m": {"b": 2, "a": -3}});
        let stored = StoredObject::from_value(&value);
        assert_eq!(
            stored.json(),
            r#"{"z":1,"a":[1.5,"x",null,true],"m":{"b":2,"a":-3}}"#
        );
        assert_eq!(stored.parse(), value);
        assert_eq!(serde_json::to_value(&stored).unwrap(), value);
        assert_eq!(stored, StoredObject::from_value(&value.clone()));
        assert_ne!(stored, StoredObject::from_value(&json!({"z": 1})));
        assert_eq!(stored.address(), stored.clone().address());
    }

    #[test]
    fn debug_shows_a_prefix() {
        let long = StoredObject::from_value(&json!({"text": "é".repeat(100)}));
        let shown = format!("{long:?}");
        assert!(shown.starts_with("StoredObject({\"text\":\"é"));
        assert!(shown.ends_with(&format!("… {} bytes)", long.len())));
        assert_eq!(
            format!("{:?}", StoredObject::from_value(&json!({"a": 1}))),
            r#"StoredObject({"a":1})"#
        );
    }
}
