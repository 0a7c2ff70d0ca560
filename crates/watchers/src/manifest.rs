//! Manifest files: YAML (multi-document) or JSON, `List` kinds unpacked, objects
//! filtered by `apiVersion`/`kind`, keyed by namespace/name and stripped of
//! `ignoreFields`.

// `Diagnostic` is the project's shared error type; these errors are the cold path of
// parsing a file, so its size does not matter.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::Arc;

use hapwright_eventbus::model::{Diagnostic, FieldPath, ObjectKey, SourceLocation};
use serde_json::Value;
use serde_saphyr::Spanned;

use crate::yaml::{Limits, decode_utf8, diagnostic};

/// Namespace given to objects without `metadata.namespace`.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Which objects of a manifest to keep, and what to strip from them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filter {
    /// Keep only objects with this `apiVersion`.
    pub api_version: Option<String>,
    /// Keep only objects of this `kind`.
    pub kind: Option<String>,
    /// Fields removed from every kept object.
    pub ignore_fields: Vec<FieldPath>,
}

impl Filter {
    fn keeps(&self, object: &Value) -> bool {
        let matches = |wanted: &Option<String>, field: &str| {
            wanted
                .as_deref()
                .is_none_or(|wanted| object.get(field).and_then(Value::as_str) == Some(wanted))
        };
        matches(&self.api_version, "apiVersion") && matches(&self.kind, "kind")
    }
}

/// The objects of one manifest file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Manifest {
    /// Kept objects by key. When a file defines a key twice, the first definition wins
    /// and a warning is added.
    pub objects: BTreeMap<ObjectKey, Arc<Value>>,
    /// Non-fatal findings (duplicates inside the file).
    pub warnings: Vec<Diagnostic>,
}

/// Parses a manifest file's bytes. Any problem (invalid UTF-8, YAML/JSON syntax, a
/// budget breach, an object without `metadata.name`) rejects the whole file with one
/// located diagnostic, so the caller can keep the file's last good objects.
pub fn parse(
    bytes: &[u8],
    file: &str,
    filter: &Filter,
    limits: &Limits,
) -> Result<Manifest, Diagnostic> {
    let text = decode_utf8(bytes, file)?;
    let documents: Vec<Spanned<Value>> =
        serde_saphyr::from_multiple_with_options(text, limits.options())
            .map_err(|error| diagnostic(&error, file, None))?;
    let mut manifest = Manifest::default();
    let mut first_seen: BTreeMap<ObjectKey, SourceLocation> = BTreeMap::new();
    for document in documents {
        let location = location_of(&document, file);
        let mut objects = Vec::new();
        unpack(document.value, &location, &mut objects)?;
        for (object, location) in objects {
            if !filter.keeps(&object) {
                continue;
            }
            let key = object_key(&object)
                .map_err(|error| Diagnostic::error(error.to_string()).at(location.clone()))?;
            let mut object = object;
            // As kubectl does: an object without a namespace lives in `default`, and
            // says so, so `indexBy: [metadata.namespace, ...]` and templates agree
            // with the object key.
            if let Some(Value::Object(metadata)) = object.get_mut("metadata") {
                let missing = match metadata.get("namespace") {
                    None | Some(Value::Null) => true,
                    Some(Value::String(ns)) => ns.is_empty(),
                    Some(_) => false,
                };
                if missing {
                    metadata.insert("namespace".to_owned(), Value::String(key.namespace.clone()));
                }
            }
            for field in &filter.ignore_fields {
                field.remove(&mut object);
            }
            if let Some(first) = first_seen.get(&key) {
                manifest.warnings.push(
                    Diagnostic::warning(format!(
                        "object {key} is defined again; the first definition at {first} wins"
                    ))
                    .at(location),
                );
                continue;
            }
            first_seen.insert(key.clone(), location);
            compact(&mut object);
            manifest.objects.insert(key, Arc::new(object));
        }
    }
    Ok(manifest)
}

/// Drops the spare capacity parsing left in strings, arrays and maps, for callers that
/// keep the parsed values. (The files source does not: it serializes each object to
/// its compact JSON text and drops the value, so this matters only to others.)
fn compact(value: &mut Value) {
    match value {
        Value::String(text) => text.shrink_to_fit(),
        Value::Array(items) => {
            items.shrink_to_fit();
            items.iter_mut().for_each(compact);
        }
        Value::Object(map) => {
            let old = std::mem::take(map);
            let mut new = serde_json::Map::with_capacity(old.len());
            for (mut key, mut item) in old {
                key.shrink_to_fit();
                compact(&mut item);
                new.insert(key, item);
            }
            *map = new;
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

fn location_of(document: &Spanned<Value>, file: &str) -> SourceLocation {
    let line = document.referenced.line();
    let column = document.referenced.column();
    if line == 0 {
        SourceLocation::new(file, None, None)
    } else {
        SourceLocation::new(
            file,
            u32::try_from(line).ok(),
            u32::try_from(column.max(1)).ok(),
        )
    }
}

/// Flattens a document into objects: a `*List` kind with `items`, or a top-level
/// array, yields its elements; a mapping yields itself; anything else is an error.
fn unpack(
    value: Value,
    location: &SourceLocation,
    out: &mut Vec<(Value, SourceLocation)>,
) -> Result<(), Diagnostic> {
    match value {
        Value::Object(mut map) => {
            let is_list = map
                .get("kind")
                .and_then(Value::as_str)
                .is_some_and(|kind| kind.ends_with("List"))
                && map.get("items").is_some_and(Value::is_array);
            if is_list {
                let Some(Value::Array(items)) = map.remove("items") else {
                    unreachable!("checked above");
                };
                for item in items {
                    unpack_item(item, location, out)?;
                }
            } else {
                out.push((Value::Object(map), location.clone()));
            }
            Ok(())
        }
        Value::Array(items) => {
            for item in items {
                unpack_item(item, location, out)?;
            }
            Ok(())
        }
        other => Err(Diagnostic::error(format!(
            "expected a Kubernetes object (a mapping with apiVersion, kind and metadata), found {}",
            type_name(&other)
        ))
        .at(location.clone())),
    }
}

fn unpack_item(
    item: Value,
    location: &SourceLocation,
    out: &mut Vec<(Value, SourceLocation)>,
) -> Result<(), Diagnostic> {
    if item.is_object() {
        out.push((item, location.clone()));
        Ok(())
    } else {
        Err(Diagnostic::error(format!(
            "list item is {}, expected a Kubernetes object",
            type_name(&item)
        ))
        .at(location.clone()))
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a sequence",
        Value::Object(_) => "a mapping",
    }
}

/// Why an object has no usable `namespace/name`. Not retryable: the manifest must be
/// fixed; the file's last good objects stay meanwhile.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ObjectKeyError {
    /// `metadata.name` is missing.
    #[error("{kind} has no metadata.name")]
    NameMissing {
        /// The object's `kind` (`object` when it has none).
        kind: String,
    },
    /// `metadata.name` is the empty string.
    #[error("{kind} has an empty metadata.name")]
    NameEmpty {
        /// The object's `kind`.
        kind: String,
    },
    /// `metadata.name` is not a string.
    #[error("{kind} has a metadata.name that is {found}, not a string")]
    NameNotString {
        /// The object's `kind`.
        kind: String,
        /// What it is instead (`a number`, `a mapping`, ...).
        found: &'static str,
    },
    /// `metadata.namespace` is neither absent, null nor a string.
    #[error("{kind} {name} has a metadata.namespace that is {found}, not a string")]
    NamespaceNotString {
        /// The object's `kind`.
        kind: String,
        /// The object's name.
        name: String,
        /// What the namespace is instead.
        found: &'static str,
    },
}

/// `namespace/name` of an object; namespace defaults to `default`.
///
/// # Errors
///
/// The name is missing, empty or not a string, or the namespace is not a string.
pub fn object_key(object: &Value) -> Result<ObjectKey, ObjectKeyError> {
    let metadata = object.get("metadata");
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("object")
        .to_owned();
    let name = match metadata.and_then(|m| m.get("name")) {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        Some(Value::String(_)) => return Err(ObjectKeyError::NameEmpty { kind }),
        Some(other) => {
            return Err(ObjectKeyError::NameNotString {
                kind,
                found: type_name(other),
            });
        }
        None => return Err(ObjectKeyError::NameMissing { kind }),
    };
    let namespace = match metadata.and_then(|m| m.get("namespace")) {
        None | Some(Value::Null) => DEFAULT_NAMESPACE.to_owned(),
        Some(Value::String(ns)) if ns.is_empty() => DEFAULT_NAMESPACE.to_owned(),
        Some(Value::String(ns)) => ns.clone(),
        Some(other) => {
            return Err(ObjectKeyError::NamespaceNotString {
                kind,
                name,
                found: type_name(other),
            });
        }
    };
    Ok(ObjectKey::new(namespace, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_missing_namespace_is_filled_in_as_default() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: b, namespace: prod}\n";
        let manifest = parse(
            text.as_bytes(),
            "m.yaml",
            &Filter::default(),
            &Limits::default(),
        )
        .unwrap();
        let a = &manifest.objects[&ObjectKey::new("default", "a")];
        assert_eq!(a["metadata"]["namespace"], json!("default"));
        let b = &manifest.objects[&ObjectKey::new("prod", "b")];
        assert_eq!(b["metadata"]["namespace"], json!("prod"));
    }

    fn keys(manifest: &Manifest) -> Vec<String> {
        manifest.objects.keys().map(ToString::to_string).collect()
    }

    fn parse_ok(text: &str, filter: &Filter) -> Manifest {
        parse(text.as_bytes(), "m.yaml", filter, &Limits::default()).unwrap()
    }

    #[test]
    fn multi_document_with_lists_and_filters() {
        let text = "\
apiVersion: v1
kind: Service
metadata: {name: a}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: c}
---
apiVersion: v1
kind: List
items:
  - {apiVersion: v1, kind: Service, metadata: {name: b, namespace: prod}}
  - {apiVersion: v1, kind: Secret, metadata: {name: s}}
";
        let all = parse_ok(text, &Filter::default());
        assert_eq!(
            keys(&all),
            ["default/a", "default/c", "default/s", "prod/b"]
        );
        let services = parse_ok(
            text,
            &Filter {
                kind: Some("Service".into()),
                ..Filter::default()
            },
        );
        assert_eq!(keys(&services), ["default/a", "prod/b"]);
        let other_version = parse_ok(
            text,
            &Filter {
                api_version: Some("v2".into()),
                ..Filter::default()
            },
        );
        assert!(other_version.objects.is_empty());
    }

    #[test]
    fn json_files_and_top_level_arrays() {
        let m = parse_ok(
            r#"[{"kind": "Service", "metadata": {"name": "x"}}]"#,
            &Filter::default(),
        );
        assert_eq!(keys(&m), ["default/x"]);
    }

    #[test]
    fn ignore_fields_are_stripped() {
        let filter = Filter {
            ignore_fields: vec![FieldPath::parse("metadata.managedFields").unwrap()],
            ..Filter::default()
        };
        let m = parse_ok(
            "metadata: {name: a, namespace: ns, managedFields: [1]}\n",
            &filter,
        );
        assert_eq!(
            *m.objects.values().next().unwrap().as_ref(),
            json!({"metadata": {"name": "a", "namespace": "ns"}})
        );
    }

    #[test]
    fn objects_without_names_fail_the_file_with_location() {
        let err = parse(
            b"metadata: {name: a}\n---\nkind: Service\nmetadata: {}\n",
            "m.yaml",
            &Filter::default(),
            &Limits::default(),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "m.yaml:3:1: Service has no metadata.name");
        let err = parse(
            b"just a string\n",
            "m.yaml",
            &Filter::default(),
            &Limits::default(),
        )
        .unwrap_err();
        assert!(err.message.contains("found a string"), "{err}");
    }

    #[test]
    fn duplicates_inside_a_file_keep_the_first_and_warn() {
        let m = parse_ok(
            "metadata: {name: a}\nspec: 1\n---\nmetadata: {name: a}\nspec: 2\n",
            &Filter::default(),
        );
        assert_eq!(m.objects.len(), 1);
        assert_eq!(m.objects.values().next().unwrap()["spec"], 1);
        assert_eq!(m.warnings.len(), 1);
        assert!(
            m.warnings[0].to_string().contains("m.yaml:4:1"),
            "{}",
            m.warnings[0]
        );
    }

    #[test]
    fn invalid_utf8_is_located() {
        let err = parse(
            b"a: 1\nb: \xff\xfe\n",
            "bad.yaml",
            &Filter::default(),
            &Limits::default(),
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with("bad.yaml:2:4: invalid UTF-8"),
            "{err}"
        );
    }
}
