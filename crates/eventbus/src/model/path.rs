//! kubectl-style field paths such as `metadata.labels.kubernetes\.io/service-name`.

use std::fmt;

use serde_json::Value;

/// A parsed field path into a JSON object, written the way kubectl writes them:
/// segments separated by dots, a literal dot escaped as `\.`, and array elements
/// addressed as `[N]` (`spec.ports[0].port`). A leading dot is accepted.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldPath {
    text: String,
    segments: Vec<Segment>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Segment {
    Key(String),
    Index(usize),
}

/// Why a field path could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FieldPathError {
    /// The path is empty.
    #[error("field path is empty")]
    Empty,
    /// Two dots in a row, or a dot at the end.
    #[error("field path `{path}` has an empty segment at character {position}")]
    EmptySegment {
        /// The path as written.
        path: String,
        /// 1-based character position of the empty segment.
        position: usize,
    },
    /// A backslash at the end of the path.
    #[error("field path `{path}` ends with a lone backslash")]
    TrailingEscape {
        /// The path as written.
        path: String,
    },
    /// An array index that is not a number or is not closed.
    #[error("field path `{path}` has an invalid array index at character {position}")]
    BadIndex {
        /// The path as written.
        path: String,
        /// 1-based character position of the `[`.
        position: usize,
    },
}

impl FieldPath {
    /// Parses a kubectl-style path.
    pub fn parse(text: &str) -> Result<Self, FieldPathError> {
        let body = text.strip_prefix('.').unwrap_or(text);
        if body.is_empty() {
            return Err(FieldPathError::Empty);
        }
        let offset = text.len() - body.len();
        let mut segments = Vec::new();
        let mut current = String::new();
        // Whether `current` holds a segment that was started (possibly empty after an index).
        let mut after_index = false;
        let mut chars = body.char_indices().peekable();
        let empty = |pos: usize| FieldPathError::EmptySegment {
            path: text.to_owned(),
            position: offset + pos + 1,
        };
        while let Some((pos, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, escaped)) => current.push(escaped),
                    None => {
                        return Err(FieldPathError::TrailingEscape {
                            path: text.to_owned(),
                        });
                    }
                },
                '.' => {
                    if current.is_empty() {
                        if !after_index {
                            return Err(empty(pos));
                        }
                    } else {
                        segments.push(Segment::Key(std::mem::take(&mut current)));
                    }
                    after_index = false;
                    if chars.peek().is_none() {
                        return Err(empty(pos + 1));
                    }
                }
                '[' => {
                    if !current.is_empty() {
                        segments.push(Segment::Key(std::mem::take(&mut current)));
                    } else if segments.is_empty() && !after_index {
                        return Err(empty(pos));
                    }
                    let mut digits = String::new();
                    let mut closed = false;
                    for (_, d) in chars.by_ref() {
                        if d == ']' {
                            closed = true;
                            break;
                        }
                        digits.push(d);
                    }
                    let index = digits.parse::<usize>().ok().filter(|_| closed).ok_or(
                        FieldPathError::BadIndex {
                            path: text.to_owned(),
                            position: offset + pos + 1,
                        },
                    )?;
                    segments.push(Segment::Index(index));
                    after_index = true;
                }
                other => current.push(other),
            }
        }
        if !current.is_empty() {
            segments.push(Segment::Key(current));
        }
        Ok(Self {
            text: text.to_owned(),
            segments,
        })
    }

    /// The path as the user wrote it.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Follows the path through `value`; `None` when any segment is missing.
    pub fn lookup<'a>(&self, value: &'a Value) -> Option<&'a Value> {
        self.segments
            .iter()
            .try_fold(value, |current, segment| match segment {
                Segment::Key(key) => current.as_object()?.get(key),
                Segment::Index(index) => current.as_array()?.get(*index),
            })
    }

    /// Removes the field the path points at; returns whether something was removed.
    pub fn remove(&self, value: &mut Value) -> bool {
        let Some((last, parents)) = self.segments.split_last() else {
            return false;
        };
        let mut current = value;
        for segment in parents {
            let next = match segment {
                Segment::Key(key) => current.as_object_mut().and_then(|o| o.get_mut(key)),
                Segment::Index(index) => current.as_array_mut().and_then(|a| a.get_mut(*index)),
            };
            match next {
                Some(next) => current = next,
                None => return false,
            }
        }
        match last {
            Segment::Key(key) => current
                .as_object_mut()
                .is_some_and(|o| o.shift_remove(key).is_some()),
            Segment::Index(index) => match current.as_array_mut() {
                Some(array) if *index < array.len() => {
                    array.remove(*index);
                    true
                }
                _ => false,
            },
        }
    }

    /// The value at the path as an index key: strings as they are, numbers and booleans
    /// in their JSON spelling, objects and arrays as compact JSON, and a missing or null
    /// field as the empty string (such objects are indexed, not dropped).
    pub fn index_value(&self, value: &Value) -> String {
        match self.lookup(value) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        }
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl serde::Serialize for FieldPath {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for FieldPath {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn escaped_dots_stay_in_one_segment() {
        let path = FieldPath::parse(r"metadata.labels.kubernetes\.io/service-name").unwrap();
        let object = json!({"metadata": {"labels": {"kubernetes.io/service-name": "web"}}});
        assert_eq!(path.index_value(&object), "web");
    }

    #[test]
    fn array_indexes_and_leading_dot() {
        let path = FieldPath::parse(".spec.ports[1].port").unwrap();
        let object = json!({"spec": {"ports": [{"port": 80}, {"port": 443}]}});
        assert_eq!(path.index_value(&object), "443");
        let nested = FieldPath::parse("a[0][1]").unwrap();
        assert_eq!(nested.index_value(&json!({"a": [[1, 2]]})), "2");
    }

    #[test]
    fn missing_and_null_fields_index_as_empty() {
        let path = FieldPath::parse("metadata.namespace").unwrap();
        assert_eq!(path.index_value(&json!({"metadata": {}})), "");
        assert_eq!(
            path.index_value(&json!({"metadata": {"namespace": null}})),
            ""
        );
        assert_eq!(path.index_value(&json!("scalar")), "");
    }

    #[test]
    fn non_string_values_use_json_spelling() {
        let path = FieldPath::parse("v").unwrap();
        assert_eq!(path.index_value(&json!({"v": true})), "true");
        assert_eq!(path.index_value(&json!({"v": {"a": 1}})), r#"{"a":1}"#);
    }

    #[test]
    fn malformed_paths_are_rejected_with_position() {
        assert_eq!(FieldPath::parse(""), Err(FieldPathError::Empty));
        assert_eq!(FieldPath::parse("."), Err(FieldPathError::Empty));
        assert!(matches!(
            FieldPath::parse("a..b"),
            Err(FieldPathError::EmptySegment { position: 3, .. })
        ));
        assert!(matches!(
            FieldPath::parse("a."),
            Err(FieldPathError::EmptySegment { .. })
        ));
        assert!(matches!(
            FieldPath::parse(r"a\"),
            Err(FieldPathError::TrailingEscape { .. })
        ));
        assert!(matches!(
            FieldPath::parse("a[x]"),
            Err(FieldPathError::BadIndex { position: 2, .. })
        ));
        assert!(matches!(
            FieldPath::parse("a[1"),
            Err(FieldPathError::BadIndex { .. })
        ));
    }

    #[test]
    fn remove_deletes_the_addressed_field() {
        let path = FieldPath::parse("metadata.managedFields").unwrap();
        let mut object = json!({"metadata": {"name": "a", "managedFields": [1]}});
        assert!(path.remove(&mut object));
        assert_eq!(object, json!({"metadata": {"name": "a"}}));
        assert!(!path.remove(&mut object));
    }

    proptest::proptest! {
        #[test]
        fn any_key_round_trips_through_escaping(key in "[a-z./\\-]{1,12}") {
            let escaped = key.replace('\\', "\\\\").replace('.', "\\.").replace('[', "\\[");
            let path = FieldPath::parse(&format!("labels.{escaped}")).unwrap();
            let mut labels = serde_json::Map::new();
            labels.insert(key.clone(), Value::String("x".into()));
            let object = json!({"labels": labels});
            proptest::prop_assert_eq!(path.index_value(&object), "x");
        }
    }
}
