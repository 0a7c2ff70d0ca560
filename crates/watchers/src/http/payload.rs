//! How an `http` source's body becomes objects.
//!
//! - `json` / `yaml`: a top-level array gives one object per element; a single
//!   mapping is one object; an empty body or `null` gives none. (YAML may hold several
//!   documents; each is read the same way.) An element that is not a mapping
//!   becomes `{value: ELEMENT}`.
//! - `lines`: one object `{line: TEXT}` per line, trimmed, skipping empty lines and
//!   lines that start with `#`.
//! - `text`: one object `{text: BODY}`.
//!
//! Every object gets a key that depends only on its own content, so an item that did
//! not change keeps its key and its stored object, and a render only redoes what
//! reads the changed items: a mapping with a string `metadata.name` is keyed by
//! `metadata.namespace` (or empty) and that name, like a manifest; another mapping
//! by a hash of its content; a line by its text; the text object by `text`. Two items
//! with one key (a repeated line) are one object.

// `Diagnostic` is the located error every parser of this crate returns.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;

use hapwright_eventbus::model::{ContentHash, Diagnostic, ObjectKey, SourceLocation};
use serde_json::{Value, json};

use crate::config::HttpFormat;
use crate::yaml::{self, Limits};

/// Objects parsed from one body, by key, and how many items repeated a key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parsed {
    /// The objects, by key.
    pub objects: BTreeMap<ObjectKey, Value>,
    /// Items dropped because an earlier item had the same key.
    pub duplicates: usize,
}

/// Parses `body` as `format`. `file` names the body in errors (the URL).
///
/// # Errors
///
/// A located diagnostic (`file:line:column: cause`) when the body is not valid
/// UTF-8, JSON or YAML.
pub fn parse(
    body: &[u8],
    format: HttpFormat,
    file: &str,
    limits: &Limits,
) -> Result<Parsed, Diagnostic> {
    let mut parsed = Parsed::default();
    let mut add = |key: ObjectKey, value: Value| match parsed.objects.entry(key) {
        std::collections::btree_map::Entry::Occupied(_) => parsed.duplicates += 1,
        std::collections::btree_map::Entry::Vacant(slot) => {
            slot.insert(value);
        }
    };
    match format {
        HttpFormat::Json => {
            if body.iter().all(u8::is_ascii_whitespace) {
                return Ok(parsed);
            }
            let value: Value = serde_json::from_slice(body).map_err(|error| {
                Diagnostic::error(format!("invalid JSON: {error}")).at(SourceLocation::new(
                    file,
                    u32::try_from(error.line()).ok(),
                    u32::try_from(error.column()).ok(),
                ))
            })?;
            items(value, &mut add);
        }
        HttpFormat::Yaml => {
            let text = yaml::decode_utf8(body, file)?;
            for document in yaml::parse_documents(text, file, limits)? {
                items(document, &mut add);
            }
        }
        HttpFormat::Lines => {
            let text = yaml::decode_utf8(body, file)?;
            for line in text.lines().map(str::trim) {
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                add(ObjectKey::new("", line), json!({ "line": line }));
            }
        }
        HttpFormat::Text => {
            let text = yaml::decode_utf8(body, file)?;
            add(ObjectKey::new("", "text"), json!({ "text": text }));
        }
    }
    Ok(parsed)
}

fn items(value: Value, add: &mut impl FnMut(ObjectKey, Value)) {
    match value {
        Value::Null => {}
        Value::Array(elements) => {
            for element in elements {
                item(element, add);
            }
        }
        other => item(other, add),
    }
}

fn item(value: Value, add: &mut impl FnMut(ObjectKey, Value)) {
    let value = match value {
        Value::Object(_) => value,
        other => json!({ "value": other }),
    };
    let named = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .map(|name| {
            let namespace = value
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or_default();
            ObjectKey::new(namespace, name)
        });
    let key = named.unwrap_or_else(|| {
        let hash = ContentHash::of(value.to_string().as_bytes()).to_string();
        ObjectKey::new("", &hash[..16])
    });
    add(key, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(parsed: &Parsed) -> Vec<String> {
        parsed.objects.keys().map(|k| k.name.clone()).collect()
    }

    #[test]
    fn lines_skip_comments_and_blanks_and_collapse_repeats() {
        let parsed = parse(
            b"# allow list\n10.0.0.0/8\n\n  192.168.0.0/16  \n10.0.0.0/8\n",
            HttpFormat::Lines,
            "u",
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(names(&parsed), ["10.0.0.0/8", "192.168.0.0/16"]);
        assert_eq!(parsed.duplicates, 1);
        assert_eq!(
            parsed.objects[&ObjectKey::new("", "192.168.0.0/16")],
            json!({"line": "192.168.0.0/16"})
        );
    }

    #[test]
    fn json_arrays_mappings_and_scalars() {
        let limits = Limits::default();
        let parsed = parse(
            br#"[{"metadata": {"name": "a"}, "x": 1}, {"x": 2}, "plain"]"#,
            HttpFormat::Json,
            "u",
            &limits,
        )
        .unwrap();
        assert_eq!(parsed.objects.len(), 3);
        assert!(parsed.objects.contains_key(&ObjectKey::new("", "a")));
        assert!(
            parsed
                .objects
                .values()
                .any(|v| v == &json!({"value": "plain"}))
        );
        // The key of an unnamed item depends only on its content.
        let again = parse(br#"[{"x": 2}]"#, HttpFormat::Json, "u", &limits).unwrap();
        assert!(
            parsed
                .objects
                .contains_key(again.objects.keys().next().unwrap())
        );
        let one = parse(br#"{"tenant": "t1"}"#, HttpFormat::Json, "u", &limits).unwrap();
        assert_eq!(one.objects.len(), 1);
        assert!(
            parse(b"  \n", HttpFormat::Json, "u", &limits)
                .unwrap()
                .objects
                .is_empty()
        );
    }

    #[test]
    fn yaml_and_text() {
        let limits = Limits::default();
        let parsed = parse(
            b"- {metadata: {namespace: ns, name: a}}\n- {metadata: {name: b}}\n",
            HttpFormat::Yaml,
            "u",
            &limits,
        )
        .unwrap();
        assert_eq!(names(&parsed), ["b", "a"]);
        let text = parse(b"hello\n", HttpFormat::Text, "u", &limits).unwrap();
        assert_eq!(
            text.objects[&ObjectKey::new("", "text")],
            json!({"text": "hello\n"})
        );
    }

    #[test]
    fn errors_are_located() {
        let error = parse(
            b"[1,\n  2,,]",
            HttpFormat::Json,
            "https://example.test/x",
            &Limits::default(),
        )
        .unwrap_err();
        assert_eq!(error.location.as_ref().unwrap().line, Some(2));
        assert!(
            error.to_string().starts_with("https://example.test/x:2:"),
            "{error}"
        );
        let error = parse(b"a: [", HttpFormat::Yaml, "u", &Limits::default()).unwrap_err();
        assert!(error.location.is_some(), "{error}");
        assert!(parse(&[0xff, 0xfe], HttpFormat::Lines, "u", &Limits::default()).is_err());
    }
}
