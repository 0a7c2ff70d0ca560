//! Which watched resources an admitted object belongs to, and the form it is stored
//! in: the same rules the sources apply, so the webhook's candidate snapshot holds
//! exactly what the source would store once the object is in the cluster.
//!
//! A `kubernetes` entry selects by group, version and kind, its `namespaces`, its
//! `labelSelector` (equality and set-based forms) and its `fieldSelector`
//! (`path=value`, `path==value`, `path!=value` over the object's fields). A `files`
//! entry selects by its `apiVersion` and `kind` filters.

use std::collections::BTreeMap;
use std::sync::Arc;

use hapwright_eventbus::model::{FieldPath, FieldPathError, ObjectKey};
use hapwright_watchers::config::{Source, WatchedResource};
use hapwright_watchers::kubernetes::KubernetesSource;
use hapwright_watchers::manifest::DEFAULT_NAMESPACE;
use serde_json::Value;

/// One watched resource the webhook validates.
#[derive(Clone, Debug)]
pub struct Target {
    /// The `watchedResources` name.
    pub name: Arc<str>,
    /// `apiVersion` objects must have (`None`: any).
    api_version: Option<String>,
    /// `kind` objects must have (`None`: any).
    kind: Option<String>,
    /// Namespaces selected (empty: every namespace).
    namespaces: Vec<String>,
    /// The parsed `labelSelector`.
    labels: Vec<Requirement>,
    /// The parsed `fieldSelector`: a field, its wanted value, and whether it must
    /// equal (`true`) or differ.
    fields: Vec<(FieldPath, String, bool)>,
    /// Fields the source strips before storing.
    ignore_fields: Vec<FieldPath>,
    /// A `files` entry keys a namespace-less object under `default`; a `kubernetes`
    /// entry under the empty namespace (cluster-scoped).
    files: bool,
    /// The entry's `indexBy`.
    pub index_by: Vec<FieldPath>,
}

/// Why a `labelSelector` or `fieldSelector` cannot be evaluated. Not retryable: the
/// config must be fixed.
#[derive(Debug, thiserror::Error)]
#[error("watchedResources.{resource}.kubernetes.{field}: cannot parse `{selector}`: {reason}")]
pub struct SelectorError {
    resource: String,
    field: &'static str,
    selector: String,
    reason: Syntax,
}

/// What is wrong in a selector: the part it is about and why.
#[derive(Debug, thiserror::Error)]
enum Syntax {
    /// `in` or `notin` without a parenthesised list.
    #[error("`{0}`: expected a list in parentheses")]
    NotAList(String),
    /// A label requirement of no known form.
    #[error("`{0}` is not a requirement")]
    NotARequirement(String),
    /// A field requirement without `=`, `==` or `!=`.
    #[error("`{0}` is not `field=value` or `field!=value`")]
    NotAComparison(String),
    /// A field requirement whose field path does not parse.
    #[error("`{part}`: {error}")]
    FieldPath {
        /// The requirement.
        part: String,
        /// Why its path does not parse.
        error: Box<FieldPathError>,
    },
}

impl SelectorError {
    /// The key of the selector (`labelSelector`, `fieldSelector`).
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// What is wrong with the selector, without the key it is written under.
    pub fn reason(&self) -> String {
        format!("cannot parse `{}`: {}", self.selector, self.reason)
    }
}

impl Target {
    /// The rules of watched resource `name`.
    ///
    /// # Errors
    ///
    /// Its `labelSelector` does not parse.
    pub fn new(name: &str, resource: &WatchedResource) -> Result<Self, SelectorError> {
        let mut target = Self {
            name: Arc::from(name),
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
            namespaces: Vec::new(),
            labels: Vec::new(),
            fields: Vec::new(),
            ignore_fields: resource.ignore_fields.clone(),
            files: true,
            index_by: resource.index_by.clone(),
        };
        if let Some(Source::Kubernetes(kubernetes)) = resource.source() {
            target.api_version = Some(kubernetes.api_version.clone());
            target.kind = Some(kubernetes.kind.clone());
            target.namespaces = kubernetes.namespaces.clone();
            target.files = false;
            let mut ignore = KubernetesSource::default_ignore_fields();
            ignore.extend(resource.ignore_fields.iter().cloned());
            target.ignore_fields = ignore;
            if let Some(selector) = &kubernetes.label_selector {
                target.labels = parse_selector(selector).map_err(|reason| SelectorError {
                    resource: name.to_owned(),
                    field: "labelSelector",
                    selector: selector.clone(),
                    reason,
                })?;
            }
            if let Some(selector) = &kubernetes.field_selector {
                target.fields = parse_field_selector(selector).map_err(|reason| SelectorError {
                    resource: name.to_owned(),
                    field: "fieldSelector",
                    selector: selector.clone(),
                    reason,
                })?;
            }
        }
        Ok(target)
    }

    /// Whether this entry keeps `object` (of `api_version`/`kind` in `namespace`).
    pub fn selects(&self, api_version: &str, kind: &str, namespace: &str, object: &Value) -> bool {
        let same = |wanted: &Option<String>, got: &str| wanted.as_deref().is_none_or(|w| w == got);
        let labels = labels_of(object);
        same(&self.api_version, api_version)
            && same(&self.kind, kind)
            && (self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace))
            && self.labels.iter().all(|r| r.matches(&labels))
            && self.fields.iter().all(|(path, value, equal)| {
                let found = path.lookup(object).map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                });
                (found.as_deref() == Some(value.as_str())) == *equal
            })
    }

    /// The key the source stores an object under.
    pub fn key(&self, namespace: &str, name: &str) -> ObjectKey {
        let namespace = if namespace.is_empty() && self.files {
            DEFAULT_NAMESPACE
        } else {
            namespace
        };
        ObjectKey::new(namespace, name)
    }

    /// The object as the source stores it: the ignored fields removed.
    pub fn prepare(&self, mut object: Value) -> Value {
        for field in &self.ignore_fields {
            field.remove(&mut object);
        }
        object
    }
}

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::Equals(key, value) => labels.get(key) == Some(value),
            Self::NotEquals(key, value) => labels.get(key) != Some(value),
            Self::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Self::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Self::Exists(key) => labels.contains_key(key),
            Self::DoesNotExist(key) => !labels.contains_key(key),
        }
    }
}

/// Parses a Kubernetes label selector (`a=b,c!=d,e in (x,y),f notin (z),g,!h`).
fn parse_selector(text: &str) -> Result<Vec<Requirement>, Syntax> {
    // Split on commas outside parentheses.
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    let mut requirements = Vec::new();
    for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
        let set = |rest: &str| -> Result<Vec<String>, Syntax> {
            let inner = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| Syntax::NotAList(part.to_owned()))?;
            Ok(inner.split(',').map(|v| v.trim().to_owned()).collect())
        };
        let requirement = if let Some((key, value)) = part.split_once("!=") {
            Requirement::NotEquals(key.trim().to_owned(), value.trim().to_owned())
        } else if let Some((key, value)) = part.split_once("==") {
            Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
        } else if let Some((key, value)) = part.split_once('=') {
            Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
        } else if let Some((key, rest)) = part.split_once(" notin ") {
            Requirement::NotIn(key.trim().to_owned(), set(rest)?)
        } else if let Some((key, rest)) = part.split_once(" in ") {
            Requirement::In(key.trim().to_owned(), set(rest)?)
        } else if let Some(key) = part.strip_prefix('!') {
            Requirement::DoesNotExist(key.trim().to_owned())
        } else if part.contains([' ', '(', ')']) {
            return Err(Syntax::NotARequirement(part.to_owned()));
        } else {
            Requirement::Exists(part.to_owned())
        };
        requirements.push(requirement);
    }
    Ok(requirements)
}

/// Parses a field selector (`type=kubernetes.io/tls,metadata.name!=x`).
fn parse_field_selector(text: &str) -> Result<Vec<(FieldPath, String, bool)>, Syntax> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|part| {
            let (path, value, equal) = if let Some((p, v)) = part.split_once("!=") {
                (p, v, false)
            } else if let Some((p, v)) = part.split_once("==") {
                (p, v, true)
            } else if let Some((p, v)) = part.split_once('=') {
                (p, v, true)
            } else {
                return Err(Syntax::NotAComparison(part.to_owned()));
            };
            let path = FieldPath::parse(path.trim()).map_err(|error| Syntax::FieldPath {
                part: part.to_owned(),
                error: Box::new(error),
            })?;
            Ok((path, value.trim().to_owned(), equal))
        })
        .collect()
}

/// The labels of an object (`metadata.labels`; string values only).
pub fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn label_selectors_match_as_kubernetes_does() {
        let selector = parse_selector("app=web, tier in (front, edge),!canary,env!=dev").unwrap();
        let all = |l: &BTreeMap<String, String>| selector.iter().all(|r| r.matches(l));
        assert!(all(&labels(&[("app", "web"), ("tier", "edge")])));
        assert!(!all(&labels(&[("app", "web"), ("tier", "back")])));
        assert!(!all(&labels(&[
            ("app", "web"),
            ("tier", "edge"),
            ("canary", "1")
        ])));
        assert!(!all(&labels(&[
            ("app", "web"),
            ("tier", "edge"),
            ("env", "dev")
        ])));
        assert!(parse_selector("app in web").is_err());
    }

    #[test]
    fn field_selectors_compare_the_object_fields() {
        let fields = parse_field_selector("type=kubernetes.io/tls,metadata.name!=skip").unwrap();
        let all = |o: &Value| {
            fields
                .iter()
                .all(|(p, v, eq)| (p.lookup(o).and_then(Value::as_str) == Some(v.as_str())) == *eq)
        };
        let secret =
            |t: &str, name: &str| serde_json::json!({"type": t, "metadata": {"name": name}});
        assert!(all(&secret("kubernetes.io/tls", "a")));
        assert!(!all(&secret("Opaque", "a")));
        assert!(!all(&secret("kubernetes.io/tls", "skip")));
        assert!(parse_field_selector("type").is_err());
    }
}
