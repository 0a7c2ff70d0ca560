//! A test's fixtures turned into the snapshots the renderer reads, following the rules
//! of the `files` source ([`load_fixtures`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use hapwright_eventbus::model::{ObjectKey, ResourceSnapshot, StoredObject};
use hapwright_reconciler::renderer::Resources;
use hapwright_watchers::config::WatchedResource;
use hapwright_watchers::manifest;
use hapwright_watchers::yaml::Limits;
use serde_json::Value;

use super::cases::TestCase;
use crate::config::Config;

/// Why a fixture object cannot be loaded. Not retryable: the config's
/// `validationTests` must be fixed. Every message starts with the config path of the
/// object (`validationTests.t.fixtures.services[1]`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FixtureError {
    /// The fixtures name a resource that `watchedResources` does not define.
    #[error("{layer}.{resource}: `{resource}` is not a watched resource")]
    NotWatched {
        /// The fixture layer (`validationTests.t.fixtures`).
        layer: String,
        /// The unknown resource name.
        resource: String,
    },
    /// The manifest parser rejects the object (no `metadata.name`, not a mapping, ...).
    #[error("{at}: {message}")]
    ParseFailed {
        /// The object's config path.
        at: String,
        /// The parser's message.
        message: String,
    },
    /// A `List` fixture defines the same namespace/name twice.
    #[error("{at}: {message}")]
    ListRepeatsObject {
        /// The `List`'s config path.
        at: String,
        /// The parser's warning, naming the object.
        message: String,
    },
    /// Two items of one layer define the same namespace/name.
    #[error("{at}: object {key} is already defined by {first}")]
    DuplicateObject {
        /// The later item's config path.
        at: String,
        /// The repeated namespace/name.
        key: ObjectKey,
        /// The earlier item's config path.
        first: String,
    },
}

/// A test's resources: the snapshots the renderer reads and the context `jsonpath`
/// assertions evaluate.
#[derive(Clone, Debug)]
pub struct Fixtures {
    /// The template view of every watched resource.
    pub resources: Resources,
    /// `{"resources": {<name>: [objects in list() order]}, "extraContext": ...}`: every
    /// watched resource (empty when the test has no fixtures for it), objects as the
    /// templates see them.
    pub context: Value,
}

/// Builds a test's snapshots from its fixture layers, the way the `files` source reads
/// manifests: [`manifest::parse`] with the watched resource's filter, so `List` kinds
/// are unpacked, objects of another `apiVersion`/`kind` are dropped, a missing
/// namespace becomes `default` and `ignoreFields` are removed.
///
/// # Errors
///
/// One [`FixtureError`] per bad fixture object (no `metadata.name`, not a mapping, the
/// same namespace/name twice in one layer), each naming the object
/// (`validationTests.t.fixtures.services[1]`).
pub fn load_fixtures(config: &Config, case: &TestCase) -> Result<Fixtures, Vec<FixtureError>> {
    let watched = &config.watched_resources.resources;
    let mut objects: BTreeMap<&str, BTreeMap<ObjectKey, Arc<Value>>> = BTreeMap::new();
    let mut errors = Vec::new();
    for (label, layer) in &case.fixture_layers {
        for (name, items) in layer {
            let Some(resource) = watched.get(name) else {
                errors.push(FixtureError::NotWatched {
                    layer: label.clone(),
                    resource: name.clone(),
                });
                continue;
            };
            let mut seen: BTreeMap<ObjectKey, usize> = BTreeMap::new();
            let merged = objects.entry(name.as_str()).or_default();
            for (index, item) in items.iter().enumerate() {
                let at = format!("{label}.{name}[{index}]");
                match normalize(item, resource, &at) {
                    Ok(found) => {
                        for (key, object) in found {
                            if let Some(first) = seen.insert(key.clone(), index) {
                                errors.push(FixtureError::DuplicateObject {
                                    at: at.clone(),
                                    key,
                                    first: format!("{label}.{name}[{first}]"),
                                });
                                continue;
                            }
                            merged.insert(key, object);
                        }
                    }
                    Err(error) => errors.push(error),
                }
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut resources = Resources::new();
    let mut lists = serde_json::Map::new();
    for (name, resource) in watched {
        let mut snapshot = ResourceSnapshot::new(resource.index_by.clone());
        for (key, object) in objects.remove(name.as_str()).unwrap_or_default() {
            snapshot.upsert(key, &object);
        }
        lists.insert(
            name.clone(),
            Value::Array(snapshot.list().map(StoredObject::parse).collect()),
        );
        resources.update(&Arc::from(name.as_str()), Arc::new(snapshot), None);
    }
    let context = serde_json::json!({
        "resources": Value::Object(lists),
        "extraContext": case.extra_context,
    });
    Ok(Fixtures { resources, context })
}

/// One fixture item through the manifest parser: zero objects (filtered out), one, or
/// several (a `List`).
fn normalize(
    item: &Value,
    resource: &WatchedResource,
    at: &str,
) -> Result<Vec<(ObjectKey, Arc<Value>)>, FixtureError> {
    let filter = resource.filter();
    let parse_failed = |message: String| FixtureError::ParseFailed {
        at: at.to_owned(),
        message,
    };
    let bytes = serde_json::to_vec(item).map_err(|error| parse_failed(error.to_string()))?;
    let manifest = manifest::parse(&bytes, at, &filter, &Limits::default())
        .map_err(|diagnostic| parse_failed(diagnostic.message))?;
    if let Some(warning) = manifest.warnings.first() {
        return Err(FixtureError::ListRepeatsObject {
            at: at.to_owned(),
            message: warning.message.clone(),
        });
    }
    Ok(manifest.objects.into_iter().collect())
}
