//! Status templates: the `status` hapwright writes back to watched objects, rendered
//! by user templates from the data of the deployed render.
//!
//! - [`StatusTemplates`] compiles one template per watched resource
//!   (`statusTemplates.<resource>`) with the same environment as the other templates
//!   (settings, limits, functions, filters and snippets), and renders it once per
//!   object of that resource with `object`, `resources` and `extraContext` in
//!   context. The output is YAML (or JSON): the content of the object's `status`.
//!   Empty output leaves the object's status alone. An error for one object is
//!   reported with the template, line and object, and the other objects still
//!   render.
//! - [`fill_transition_times`] gives every rendered condition without
//!   `lastTransitionTime` the time the object already shows for the same condition
//!   type and status, else now — so an unchanged status renders to the same value
//!   and is not written again.
//! - [`StatusComponent`] runs it on the bus: it keeps the snapshots of recent
//!   renders (`TemplateInputs`) and renders statuses from the newest render whose
//!   deployment round finished (`DeploymentCompleted`), at once when a new render
//!   equals that one, and again whenever an instance's deployment state changes
//!   outside a round (a retry that succeeded or failed, a discovered instance), so
//!   a condition that waits for a lagging instance flips once it catches up. It
//!   publishes `StatusRendered`, and runs beside the pipeline, never on its latency
//!   path.
//! - Each object's template sees `deployment` ([`fleet::Deployment`]): whether every
//!   instance of the fleet runs a config made from this version of the object, and
//!   which instances do not and why (the rule: [`fleet`]). The fleet and each
//!   instance's state come from the deployer's events (`DeploymentScheduled`,
//!   `InstancesDiscovered`, `InstanceDeployed`, `InstanceDeploymentFailed`), the
//!   component's own [`Tracker`].

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use hapwright_eventbus::model::{
    ContentHash, Diagnostic, FileKind, ResourceSnapshot, SourceLocation, StoredObject,
};
use hapwright_eventbus::{
    Component, ComponentError, Context, EventKind, EventPayload, Interest, RenderedStatus,
    StatusRendered,
};
use minijinja::value::{Enumerator, Object, ObjectRepr, Value};
use minijinja::{Environment, ErrorKind};
use serde_json::Value as Json;

use crate::renderer::{Read, ReadCheck, Recording, Resources, Templates};

pub mod fleet;

pub use fleet::{Deployment, Failure, Fleet, InstanceState, Running, Serving, Snapshots};

/// The name of a status template in errors: the config key that holds it.
pub fn template_name(resource: &str) -> String {
    format!("statusTemplates.{resource}")
}

/// Compiled status templates, ready to render. Cheap to clone.
#[derive(Clone)]
pub struct StatusTemplates {
    inner: Arc<Inner>,
}

struct Inner {
    env: Environment<'static>,
    /// Watched resource name → template name.
    templates: BTreeMap<Arc<str>, String>,
    watched: Vec<Arc<str>>,
    extra_context: Value,
    /// The resources of the last statuses rendered: the next render updates them
    /// with what changed in each snapshot instead of converting every object again
    /// (and releasing every converted object of the last render).
    resources: std::sync::Mutex<Option<Resources>>,
    /// The objects of the last statuses rendered, by the object's address (with
    /// the object, which keeps the address its own): their names, read once while
    /// the object does not change, and what their template printed.
    objects: std::sync::Mutex<HashMap<usize, KeptObject>>,
    /// How many objects the last round took as they were.
    reused: std::sync::atomic::AtomicUsize,
}

/// What the last round kept of one object ([`Inner::objects`]).
struct KeptObject {
    /// Held, never read: while it is, no other object can have its address.
    _object: StoredObject,
    header: Arc<Header>,
    output: Option<Arc<KeptOutput>>,
}

/// What an object's template printed, and what that depended on besides the
/// object, the templates and `extraContext` (fixed for the renderer's life): the
/// resources it read and the fields of `deployment` it read. The next round takes
/// the output as it is when none of those changed.
struct KeptOutput {
    reads: Arc<[Read]>,
    fields: u8,
    deployment: Deployment,
    output: Result<Arc<str>, Diagnostic>,
}

impl KeptOutput {
    /// Whether `deployment` has the fields the template read as they were.
    fn same_fields(&self, deployment: &Deployment) -> bool {
        let (old, new) = (&self.deployment, deployment);
        let same = [
            old.programmed == new.programmed,
            old.message == new.message,
            old.hash == new.hash,
            old.waiting == new.waiting,
            old.instances == new.instances,
        ];
        same.iter()
            .enumerate()
            .all(|(bit, same)| self.fields & (1 << bit) == 0 || *same)
            && (self.fields & OTHER_FIELD == 0)
    }
}

/// The fields of [`Deployment`] as templates name them, in the bit order of
/// [`KeptOutput::fields`].
const DEPLOYMENT_FIELDS: [&str; 5] = ["programmed", "message", "hash", "waiting", "instances"];

/// A read of `deployment` that names no one field (a lookup of another key):
/// nothing can be taken as it was.
const OTHER_FIELD: u8 = 1 << 7;

/// Every field: `deployment` read as a whole (iterated, printed, compared).
const ALL_FIELDS: u8 = (1 << DEPLOYMENT_FIELDS.len()) - 1;

/// An object's `deployment` value, noting which fields its template reads.
#[derive(Debug)]
struct DeploymentView {
    value: Value,
    read: std::sync::atomic::AtomicU8,
}

impl DeploymentView {
    fn note(&self, bits: u8) {
        self.read
            .fetch_or(bits, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Object for DeploymentView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let bit = key
            .as_str()
            .and_then(|key| DEPLOYMENT_FIELDS.iter().position(|field| *field == key))
            .map_or(OTHER_FIELD, |at| 1 << at);
        self.note(bit);
        self.value
            .get_item(key)
            .ok()
            .filter(|value| !value.is_undefined())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.note(ALL_FIELDS);
        Enumerator::Str(&DEPLOYMENT_FIELDS)
    }
}

impl std::fmt::Debug for StatusTemplates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusTemplates")
            .field(
                "resources",
                &self.inner.templates.keys().collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl StatusTemplates {
    /// Compiles `status` (watched resource name → template source) in the
    /// environment of `templates` (its snippets, settings, limits, `extraContext`
    /// and file paths for `path()`). `watched` are the watched resource names.
    ///
    /// # Errors
    ///
    /// Every compile error, naming `statusTemplates.<resource>` (or the snippet), the
    /// line and the offending source line; a key that names no watched resource.
    pub fn new<S: AsRef<str>>(
        templates: &Templates,
        status: &BTreeMap<String, String>,
        watched: &[S],
    ) -> Result<Self, Vec<Diagnostic>> {
        let watched: Vec<Arc<str>> = watched.iter().map(|w| Arc::from(w.as_ref())).collect();
        let mut diagnostics = Vec::new();
        let mut paths: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (kind, group) in [
            (FileKind::Map, &templates.maps),
            (FileKind::File, &templates.files),
            (FileKind::Certificate, &templates.certificates),
        ] {
            for name in group.keys() {
                paths
                    .entry(name.clone())
                    .or_default()
                    .push(kind.relative_path(name));
            }
        }
        let snippets: Vec<String> = templates.snippets.keys().cloned().collect();
        let mut env = match crate::renderer::build_environment(
            templates.settings,
            templates.limits,
            snippets,
            paths,
            crate::renderer::OutputSyntax::Plain,
        ) {
            Ok(env) => env,
            Err(error) => {
                return Err(vec![Diagnostic::error(format!(
                    "invalid templating settings: {error}"
                ))]);
            }
        };
        let mut sources: Vec<(String, String)> = templates
            .snippets
            .iter()
            .map(|(name, source)| (name.clone(), source.clone()))
            .collect();
        let mut names = BTreeMap::new();
        for (resource, source) in status {
            if !watched.iter().any(|w| w.as_ref() == resource) {
                diagnostics.push(
                    Diagnostic::error(format!(
                        "`{resource}` is not a watched resource; status templates render the \
                         objects of one of watchedResources ({})",
                        watched
                            .iter()
                            .map(AsRef::as_ref)
                            .collect::<Vec<&str>>()
                            .join(", ")
                    ))
                    .at(SourceLocation::new(
                        template_name(resource),
                        None,
                        None,
                    )),
                );
                continue;
            }
            names.insert(Arc::<str>::from(resource.as_str()), template_name(resource));
            sources.push((template_name(resource), source.clone()));
        }
        for (name, source) in sources {
            if let Err(error) = env.add_template_owned(name.clone(), source.clone()) {
                diagnostics.push(diagnostic(&name, &source, &error, None));
            }
        }
        if !diagnostics.is_empty() {
            return Err(diagnostics);
        }
        Ok(Self {
            inner: Arc::new(Inner {
                env,
                templates: names,
                watched,
                extra_context: Value::from(minijinja::value::Serde(&templates.extra_context)),
                resources: std::sync::Mutex::new(None),
                objects: std::sync::Mutex::new(HashMap::new()),
                reused: std::sync::atomic::AtomicUsize::new(0),
            }),
        })
    }

    /// How many objects the last [`render`](Self::render) took as the round before
    /// left them (neither the object, the resources its template read nor the
    /// fields of `deployment` it read changed), without running their template.
    pub fn reused(&self) -> usize {
        self.inner.reused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// True when no status template is configured.
    pub fn is_empty(&self) -> bool {
        self.inner.templates.is_empty()
    }

    /// The watched resources that have a status template.
    pub fn resources(&self) -> impl Iterator<Item = &Arc<str>> + '_ {
        self.inner.templates.keys()
    }

    /// Renders the status of every object of every resource with a status template,
    /// from `snapshots` (of the render `fleet.render`); each object's template sees
    /// in `deployment` which instances of `fleet` serve it ([`Fleet::deployment`]);
    /// `now` (RFC 3339) is the `lastTransitionTime` of conditions that are new or
    /// changed. Objects whose template renders nothing are left out. Returns the
    /// statuses in resource, namespace, name order and one error per failing object.
    pub fn render(
        &self,
        snapshots: &BTreeMap<Arc<str>, Arc<ResourceSnapshot>>,
        fleet: &Fleet,
        now: &str,
    ) -> (Vec<RenderedStatus>, Vec<Diagnostic>) {
        let inner = &*self.inner;
        let mut kept = inner
            .resources
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let resources = kept.get_or_insert_with(Resources::new);
        let before = resources.snapshots();
        // The resources the kept outputs were rendered from (none: nothing is taken).
        let mut before_resources = (!before.is_empty()).then(|| resources.clone());
        if !before.keys().all(|source| snapshots.contains_key(source)) {
            *resources = Resources::new();
            before_resources = None;
        }
        for (source, snapshot) in snapshots {
            match before.get(source) {
                Some(old) if Arc::ptr_eq(old, snapshot) => {}
                Some(old) => {
                    let change = snapshot.change_since(old);
                    resources.update(source, snapshot.clone(), Some(&change));
                }
                None => resources.update(source, snapshot.clone(), None),
            }
        }
        let resources_value = resources.context_value(&inner.watched);
        let resources_now = resources.clone();
        drop(kept);
        let mut last_objects = std::mem::take(
            &mut *inner
                .objects
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let mut objects = HashMap::with_capacity(last_objects.len());
        // What the last round's templates read is checked against its resources.
        let check = before_resources
            .as_ref()
            .map(|before| ReadCheck::new(before, &resources_now));
        // Objects served by the same instances see the same `deployment`: one value
        // for a run of them.
        let mut last_deployment: Option<(Deployment, Value)> = None;
        let mut reused = 0;
        let mut statuses = Vec::new();
        let mut errors = Vec::new();
        for (resource, name) in &inner.templates {
            let Some(snapshot) = snapshots.get(resource) else {
                continue;
            };
            let Ok(template) = inner.env.get_template(name) else {
                continue;
            };
            for (key, stored) in snapshot.iter() {
                // Only what names the object: most objects render no status, and
                // parsing each whole object after every deployment cost more than
                // their templates at thousands of objects.
                // The kept object holds its address: an entry under it is its own.
                let (header, kept_output) = match last_objects.remove(&stored.address()) {
                    Some(kept) => (kept.header, kept.output),
                    None => (
                        Arc::new(
                            stored
                                .deserialize()
                                .unwrap_or_else(|_| Header::from_value(&stored.parse())),
                        ),
                        None,
                    ),
                };
                let Header {
                    api_version,
                    kind,
                    metadata:
                        HeaderMetadata {
                            namespace,
                            name: object_name,
                        },
                } = &*header;
                let label = if namespace.is_empty() {
                    object_name.clone()
                } else {
                    format!("{namespace}/{object_name}")
                };
                let deployment = fleet.deployment(resource, key, stored);
                let taken = kept_output.filter(|kept| {
                    check.as_ref().is_some_and(|check| {
                        kept.same_fields(&deployment)
                            && kept.reads.iter().all(|read| check.unchanged(read))
                    })
                });
                let output = match taken {
                    Some(kept) => {
                        reused += 1;
                        kept
                    }
                    None => {
                        let value = match &last_deployment {
                            Some((last, value)) if *last == deployment => value.clone(),
                            _ => {
                                let value = Value::from(minijinja::value::Serde(&deployment));
                                last_deployment = Some((deployment.clone(), value.clone()));
                                value
                            }
                        };
                        let view = Arc::new(DeploymentView {
                            value,
                            read: std::sync::atomic::AtomicU8::new(0),
                        });
                        let context = Value::from(BTreeMap::from([
                            ("object", crate::renderer::object_value(stored)),
                            ("resources", resources_value.clone()),
                            ("extraContext", inner.extra_context.clone()),
                            ("shared", crate::renderer::shared_value()),
                            ("deployment", Value::from_dyn_object(view.clone())),
                        ]));
                        let recording = Recording::start();
                        let rendered = template.render(&context);
                        let reads = recording.finish();
                        let output = rendered.map(Arc::from).map_err(|error| {
                            let source = template.source().to_owned();
                            diagnostic(name, &source, &error, Some(&label))
                        });
                        Arc::new(KeptOutput {
                            reads: reads.into(),
                            fields: view.read.load(std::sync::atomic::Ordering::Relaxed),
                            deployment,
                            output,
                        })
                    }
                };
                objects.insert(
                    stored.address(),
                    KeptObject {
                        _object: stored.clone(),
                        header: Arc::clone(&header),
                        output: Some(Arc::clone(&output)),
                    },
                );
                let text = match &output.output {
                    Ok(text) => text,
                    Err(diagnostic) => {
                        errors.push(diagnostic.clone());
                        continue;
                    }
                };
                if text.trim().is_empty() {
                    continue;
                }
                let mut status: Json =
                    match serde_saphyr::from_str(text) {
                        Ok(status @ Json::Object(_)) => status,
                        Ok(other) => {
                            errors.push(
                            Diagnostic::error(format!(
                                "{resource} {label}: the status must be a mapping, the template \
                                 rendered {}",
                                kind_of(&other)
                            ))
                            .at(SourceLocation::new(name.clone(), None, None)),
                        );
                            continue;
                        }
                        Err(error) => {
                            errors.push(
                                Diagnostic::error(format!(
                                    "{resource} {label}: the rendered status is not YAML: {error}"
                                ))
                                .at(SourceLocation::new(
                                    name.clone(),
                                    None,
                                    None,
                                )),
                            );
                            continue;
                        }
                    };
                let shown = stored
                    .deserialize::<Shown>()
                    .map(|shown| shown.status)
                    .unwrap_or(Json::Null);
                fill_transition_times(&mut status, &shown, now);
                let current = is_subset(&status, &shown);
                statuses.push(RenderedStatus {
                    resource: resource.clone(),
                    api_version: api_version.clone(),
                    kind: kind.clone(),
                    namespace: namespace.clone(),
                    name: object_name.clone(),
                    status,
                    current,
                });
            }
        }
        *inner
            .objects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = objects;
        inner
            .reused
            .store(reused, std::sync::atomic::Ordering::Relaxed);
        (statuses, errors)
    }
}

/// What names an object: read without building the rest of it.
#[derive(Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Header {
    #[serde(deserialize_with = "string_or_default")]
    api_version: String,
    #[serde(deserialize_with = "string_or_default")]
    kind: String,
    metadata: HeaderMetadata,
}

impl Header {
    /// The same from a whole object, whatever its shape (non-strings read as empty).
    fn from_value(object: &Json) -> Self {
        let text = |value: &Json| value.as_str().unwrap_or_default().to_owned();
        Self {
            api_version: text(&object["apiVersion"]),
            kind: text(&object["kind"]),
            metadata: HeaderMetadata {
                namespace: text(&object["metadata"]["namespace"]),
                name: text(&object["metadata"]["name"]),
            },
        }
    }
}

#[derive(Default, serde::Deserialize)]
#[serde(default)]
struct HeaderMetadata {
    #[serde(deserialize_with = "string_or_default")]
    namespace: String,
    #[serde(deserialize_with = "string_or_default")]
    name: String,
}

/// The status an object shows now.
#[derive(serde::Deserialize)]
struct Shown {
    #[serde(default)]
    status: Json,
}

/// A string, or empty for anything else (as `value.as_str().unwrap_or_default()`).
fn string_or_default<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match <Json as serde::Deserialize>::deserialize(d)? {
        Json::String(text) => text,
        _ => String::new(),
    })
}

fn kind_of(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "a mapping",
    }
}

/// A located template error: the innermost template with a line, the object.
fn diagnostic(
    name: &str,
    source: &str,
    error: &minijinja::Error,
    object: Option<&str>,
) -> Diagnostic {
    let mut innermost = error;
    let mut current: &(dyn std::error::Error + 'static) = error;
    while let Some(next) = current.source() {
        match next.downcast_ref::<minijinja::Error>() {
            Some(inner) => {
                if inner.name().is_some() && inner.line().is_some() {
                    innermost = inner;
                }
                current = inner;
            }
            None => break,
        }
    }
    let detail = match innermost.detail() {
        Some(detail) => format!("{}: {detail}", innermost.kind()),
        None => innermost.kind().to_string(),
    };
    let message = match object {
        Some(object) => format!("{object}: {detail}"),
        None => detail,
    };
    let template = innermost.name().unwrap_or(name).to_owned();
    let line = innermost.line().and_then(|l| u32::try_from(l).ok());
    let mut diagnostic =
        Diagnostic::error(message).at(SourceLocation::new(template.clone(), line, None));
    let text = if template == name {
        line.and_then(|l| source.lines().nth(l as usize - 1))
    } else {
        None
    };
    if let Some(text) = text {
        diagnostic = diagnostic.with_source_line(text);
    }
    if innermost.kind() == ErrorKind::BadInclude && innermost.line().is_none() {
        return Diagnostic::error(format!(
            "{}{}",
            object.map(|o| format!("{o}: ")).unwrap_or_default(),
            error
        ))
        .at(SourceLocation::new(
            name,
            error.line().map(|l| l as u32),
            None,
        ));
    }
    diagnostic
}

/// Fills `lastTransitionTime` in every condition of `status` (an item of any
/// `conditions` list) that has none: the time `shown` (the object's current status)
/// gives the condition of the same `type` with the same `status` at the same place,
/// else `now` (Kubernetes' `meta.SetStatusCondition` semantics).
///
/// Places match by key in mappings; list items match the item of the shown list
/// with the same `name` (listeners), the same `parentRef` (route parents) or, failing
/// both, the same position.
pub fn fill_transition_times(status: &mut Json, shown: &Json, now: &str) {
    match status {
        Json::Object(map) => {
            for (key, value) in map.iter_mut() {
                let shown_value = shown.get(key).unwrap_or(&Json::Null);
                if key == "conditions"
                    && let Json::Array(conditions) = value
                {
                    for condition in conditions.iter_mut() {
                        fill_condition(condition, shown_value, now);
                    }
                    continue;
                }
                fill_transition_times(value, shown_value, now);
            }
        }
        Json::Array(items) => {
            let shown_items = shown.as_array();
            for (index, item) in items.iter_mut().enumerate() {
                let counterpart = shown_items
                    .and_then(|list| counterpart(item, index, list))
                    .unwrap_or(&Json::Null);
                fill_transition_times(item, counterpart, now);
            }
        }
        _ => {}
    }
}

fn counterpart<'a>(item: &Json, index: usize, shown: &'a [Json]) -> Option<&'a Json> {
    for key in ["name", "parentRef"] {
        if let Some(identity) = item.get(key) {
            return shown.iter().find(|s| s.get(key) == Some(identity));
        }
    }
    shown.get(index)
}

fn fill_condition(condition: &mut Json, shown: &Json, now: &str) {
    let Json::Object(map) = condition else {
        return;
    };
    if map.contains_key("lastTransitionTime") {
        return;
    }
    let previous = shown.as_array().and_then(|list| {
        list.iter().find(|c| {
            c.get("type") == map.get("type")
                && c.get("status") == map.get("status")
                && c.get("lastTransitionTime").is_some()
        })
    });
    let time = previous
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| Json::String(now.to_owned()));
    map.insert("lastTransitionTime".to_owned(), time);
}

/// True when every field of `rendered` is in `shown` with the same value (lists
/// item by item, of the same length).
pub fn is_subset(rendered: &Json, shown: &Json) -> bool {
    match (rendered, shown) {
        (Json::Object(a), Json::Object(b)) => a
            .iter()
            .all(|(key, value)| b.get(key).is_some_and(|other| is_subset(value, other))),
        (Json::Array(a), Json::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| is_subset(x, y))
        }
        (a, b) => a == b,
    }
}

/// The current time as Kubernetes writes it (RFC 3339, whole seconds, UTC).
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap_or_else(|_| jiff::Timestamp::now())
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

// === impl Tracker ===

/// How many renders' snapshots the component keeps while their deployment is
/// pending (the scheduler deploys the newest; older ones are dropped).
const PENDING: usize = 8;

/// What the status component knows from the bus: recent renders' snapshots, the
/// render the statuses describe, and each instance's deployment state, so statuses
/// can say which instances serve an object. Pure state, driven by
/// [`Tracker::apply`].
#[derive(Debug, Default)]
pub struct Tracker {
    /// Renders not deployed yet, oldest first.
    pending: VecDeque<(ContentHash, Snapshots)>,
    /// The newest render whose deployment round finished: the statuses describe it.
    reported: Option<(ContentHash, Snapshots)>,
    /// Deployment state per instance, from `InstanceDeployed` and
    /// `InstanceDeploymentFailed`.
    instances: BTreeMap<String, InstanceState>,
    /// The instances deployments name (`DeploymentScheduled`: the static ones).
    named: BTreeSet<String>,
    /// Discovered instances per discovery source (`InstancesDiscovered`).
    discovered: BTreeMap<Arc<str>, BTreeSet<String>>,
    /// Deployment rounds started and not completed: instance outcomes inside a round
    /// wait for its `DeploymentCompleted`, so a round renders once.
    open_rounds: usize,
    /// The fleet changed (an instance runs another render, failed or recovered,
    /// joined or left) since the statuses were last rendered: a round that changed
    /// nothing (a drift check) renders nothing.
    fleet_changed: bool,
}

impl Tracker {
    /// Takes one event; true when the statuses should be rendered again now.
    pub fn apply(&mut self, payload: &EventPayload) -> bool {
        match payload {
            EventPayload::TemplateInputs(inputs) => {
                if self
                    .reported
                    .as_ref()
                    .is_some_and(|(hash, _)| *hash == inputs.hash)
                {
                    // The same config from newer data (a status written back, a
                    // field only statuses read): describe the newest data.
                    self.reported = Some((inputs.hash, inputs.snapshots.clone()));
                    for instance in self.instances.values_mut() {
                        if let Some(runs) = instance.runs.as_mut()
                            && runs.hash == inputs.hash
                        {
                            runs.snapshots = Some(inputs.snapshots.clone());
                        }
                    }
                    return true;
                }
                self.pending.retain(|(hash, _)| *hash != inputs.hash);
                self.pending
                    .push_back((inputs.hash, inputs.snapshots.clone()));
                while self.pending.len() > PENDING {
                    self.pending.pop_front();
                }
                false
            }
            EventPayload::DeploymentScheduled(scheduled) => {
                self.named = scheduled.instances.iter().cloned().collect();
                false
            }
            EventPayload::InstancesDiscovered(discovered) => {
                let names = discovered
                    .instances
                    .iter()
                    .map(|i| i.name.clone())
                    .collect();
                if self.discovered.get(&discovered.source) != Some(&names) {
                    self.fleet_changed = true;
                }
                self.discovered.insert(discovered.source.clone(), names);
                // A vanished instance no longer counts, and its state (with the
                // snapshots of the render it ran) is let go.
                let Tracker {
                    instances,
                    named,
                    discovered,
                    ..
                } = self;
                instances.retain(|name, _| {
                    named.contains(name) || discovered.values().any(|d| d.contains(name))
                });
                self.render_now()
            }
            EventPayload::DeploymentStarted(_) => {
                self.open_rounds += 1;
                false
            }
            EventPayload::InstanceDeployed(deployed) => {
                let snapshots = self.snapshots_of(deployed.hash);
                let state = self.instance(&deployed.instance);
                let changed = state.failure.is_some()
                    || state.runs.as_ref().map(|r| r.hash) != Some(deployed.hash);
                self.fleet_changed |= changed;
                let state = self.instance(&deployed.instance);
                state.runs = Some(Running {
                    hash: deployed.hash,
                    snapshots,
                });
                state.failure = None;
                self.open_rounds == 0 && self.render_now()
            }
            EventPayload::InstanceDeploymentFailed(failed) => {
                let failure = Some(Failure {
                    hash: failed.hash,
                    error: failed.error.message.clone(),
                });
                let state = self.instance(&failed.instance);
                let changed = state.failure != failure;
                state.failure = failure;
                self.fleet_changed |= changed;
                self.open_rounds == 0 && self.render_now()
            }
            EventPayload::DeploymentCompleted(done) => {
                self.open_rounds = self.open_rounds.saturating_sub(1);
                let hash = done.summary.hash;
                if let Some(position) = self.pending.iter().position(|(h, _)| *h == hash) {
                    self.reported = Some(self.pending[position].clone());
                    self.pending.drain(..=position);
                    self.fleet_changed = true;
                }
                self.render_now()
            }
            _ => false,
        }
    }

    /// Whether to render the statuses now: there is a render to describe and
    /// something changed since the last rendering (which this answer accounts for).
    fn render_now(&mut self) -> bool {
        let now = self.reported.is_some() && self.fleet_changed;
        if now {
            self.fleet_changed = false;
        }
        now
    }

    /// The render the statuses describe now and the fleet to judge it against.
    pub fn job(&self) -> Option<(Snapshots, Fleet)> {
        let (hash, snapshots) = self.reported.as_ref()?;
        let names: BTreeSet<&String> = self
            .named
            .iter()
            .chain(self.discovered.values().flatten())
            .collect();
        let instances = names
            .into_iter()
            .map(|name| {
                self.instances
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| InstanceState::new(name.clone()))
            })
            .collect();
        Some((
            snapshots.clone(),
            Fleet {
                render: *hash,
                instances,
            },
        ))
    }

    fn instance(&mut self, name: &str) -> &mut InstanceState {
        self.instances
            .entry(name.to_owned())
            .or_insert_with(|| InstanceState::new(name))
    }

    /// The snapshots the render `hash` was made from, when still known.
    fn snapshots_of(&self, hash: ContentHash) -> Option<Snapshots> {
        self.reported
            .iter()
            .chain(self.pending.iter())
            .find(|(h, _)| *h == hash)
            .map(|(_, snapshots)| snapshots.clone())
            .or_else(|| {
                self.instances
                    .values()
                    .filter_map(|i| i.runs.as_ref())
                    .find(|runs| runs.hash == hash)
                    .and_then(|runs| runs.snapshots.clone())
            })
    }
}

// === impl StatusComponent ===

/// Renders statuses after deployments. See the [module docs](self).
pub struct StatusComponent {
    templates: StatusTemplates,
    clock: Arc<dyn Fn() -> String + Send + Sync>,
}

impl std::fmt::Debug for StatusComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusComponent")
            .field("templates", &self.templates)
            .finish_non_exhaustive()
    }
}

impl StatusComponent {
    /// The component name.
    pub const NAME: &'static str = "status-renderer";

    /// A component over compiled status templates. The renderer component must
    /// publish `TemplateInputs` (`RendererComponent::with_template_inputs`).
    pub fn new(templates: StatusTemplates) -> Self {
        Self {
            templates,
            clock: Arc::new(now_rfc3339),
        }
    }

    /// Uses `clock` for the time of new conditions (tests pin it).
    #[must_use]
    pub fn with_clock(mut self, clock: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }
}

#[async_trait::async_trait]
impl Component for StatusComponent {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([
            EventKind::TemplateInputs,
            EventKind::DeploymentScheduled,
            EventKind::InstancesDiscovered,
            EventKind::DeploymentStarted,
            EventKind::InstanceDeployed,
            EventKind::InstanceDeploymentFailed,
            EventKind::DeploymentCompleted,
        ])
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        let StatusComponent { templates, clock } = *self;
        let mut tracker = Tracker::default();
        let worker = Worker::start();
        ctx.health().healthy();
        while let Some(event) = ctx.next_event().await {
            if !tracker.apply(&event.payload) {
                continue;
            }
            let Some((snapshots, fleet)) = tracker.job() else {
                continue;
            };
            let hash = fleet.render;
            let job_templates = templates.clone();
            let now = clock();
            let job = worker.run(move || job_templates.render(&snapshots, &fleet, &now));
            let (statuses, errors) = tokio::select! {
                biased;
                () = ctx.cancelled() => return Ok(()),
                outcome = job => match outcome {
                    Ok(outcome) => outcome,
                    Err(crash) => (Vec::new(), vec![Diagnostic::error(format!("status rendering crashed: {crash}"))]),
                },
            };
            for error in &errors {
                tracing::warn!(error = %error, "Status template failed for one object");
            }
            tracing::debug!(
                hash = %hash.short(),
                statuses = statuses.len(),
                errors = errors.len(),
                reused = templates.reused(),
                "Rendered statuses"
            );
            match errors.first() {
                Some(first) if errors.len() == 1 => ctx
                    .health()
                    .degraded(format!("a status template failed: {first}")),
                Some(first) => ctx.health().degraded(format!(
                    "status templates failed for {} objects, first: {first}",
                    errors.len()
                )),
                None => ctx.health().healthy(),
            }
            ctx.publisher().reply(
                &event,
                StatusRendered {
                    hash,
                    statuses: statuses.into(),
                    errors,
                },
            );
        }
        Ok(())
    }
}

/// The thread status templates render on, below the pipeline's priority (nice
/// [`Worker::NICE`]): statuses are rendered after every deployment, from every
/// watched object (tens of milliseconds of CPU at 10,000 objects), and on a machine
/// with few cores they would otherwise take CPU from the next change's render and
/// deployment. When nothing else runs, the thread gets the CPU all the same.
struct Worker {
    jobs: std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl Worker {
    /// How much nicer than the rest of the controller the thread is.
    const NICE: i32 = 10;

    fn start() -> Self {
        let (jobs, queue) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let spawned = std::thread::Builder::new()
            .name("hapwright-status".to_owned())
            .spawn(move || {
                hapwright_eventbus::kernel::lower_thread_priority(Self::NICE);
                while let Ok(job) = queue.recv() {
                    job();
                }
            });
        if let Err(error) = spawned {
            // Each job then reports that it could not run.
            tracing::error!(%error, "Cannot start the status thread");
        }
        Self { jobs }
    }

    /// Runs `job` on the thread; `Err` with why when it panicked or could not run.
    fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> impl std::future::Future<Output = Result<T, String>> {
        let (done, outcome) = tokio::sync::oneshot::channel();
        let sent = self.jobs.send(Box::new(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
                .map_err(|panic| hapwright_eventbus::kernel::panic_message(panic.as_ref()));
            let _ = done.send(result);
        }));
        async move {
            if sent.is_err() {
                return Err("the status thread is not running".to_owned());
            }
            outcome
                .await
                .unwrap_or_else(|_| Err("the status thread stopped".to_owned()))
        }
    }
}

#[cfg(test)]
mod tests;
