//! Deciding one AdmissionReview: the object is applied to a copy of the current
//! snapshots, the result is rendered and validated as a reconciliation would, and
//! the answer names the template line and HAProxy's message when it fails.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use hapwright_eventbus::model::{Diagnostic, ResourceChange, ResourceSnapshot};
use hapwright_reconciler::Renderer;
use hapwright_reconciler::quarantine::{self, Validate};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde_json::Value;
use tokio::time::Instant;

use super::Metrics;
use super::feed::Current;
use super::select::Target;
use crate::config::FailurePolicy;

/// Most validation errors quoted in one denial; the rest are counted.
const MAX_QUOTED: usize = 5;

/// How the webhook decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Budget for one decision.
    pub timeout: Duration,
    /// The answer when no decision is reached in time.
    pub failure_policy: FailurePolicy,
}

/// Decides reviews for one controller iteration: its templates, its validation
/// settings and the resources it opted in.
pub struct Engine {
    /// A renderer of its own: its incremental cache follows the webhook's
    /// candidates, not the reconciliations'.
    renderer: Renderer,
    validate: Validate,
    targets: Vec<Target>,
    settings: Settings,
    current: Current,
    metrics: Option<Metrics>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("targets", &self.targets)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The answer to one HTTP request: a status and a JSON body.
#[derive(Debug)]
pub struct Answer {
    /// 200 for a decided review, 400 for a malformed one.
    pub status: StatusCode,
    /// The AdmissionReview (or the error) as JSON.
    pub body: Value,
}

/// The outcome of one review before it is wrapped into the response.
#[derive(Debug)]
struct Decision {
    allowed: bool,
    message: Option<String>,
    warnings: Vec<String>,
    /// The watched resource the object belongs to, for the metrics.
    resource: String,
}

impl Decision {
    fn allow(resource: impl Into<String>) -> Self {
        Self {
            allowed: true,
            message: None,
            warnings: Vec::new(),
            resource: resource.into(),
        }
    }
}

impl Engine {
    /// An engine over compiled templates, a validation step, the opted-in resources
    /// and the current objects.
    pub fn new(
        renderer: Renderer,
        validate: Validate,
        targets: Vec<Target>,
        settings: Settings,
        current: Current,
        metrics: Option<Metrics>,
    ) -> Self {
        if let Some(metrics) = &metrics {
            for target in &targets {
                metrics.start_at_zero(&target.name);
            }
        }
        Self {
            renderer,
            validate,
            targets,
            settings,
            current,
            metrics,
        }
    }

    /// Answers one `POST /validate` body.
    pub async fn review(&self, body: &[u8]) -> Answer {
        let started = Instant::now();
        let request = match parse(body) {
            Ok(request) => request,
            Err(message) => {
                tracing::warn!(%message, "Malformed AdmissionReview refused");
                self.record("none", "invalid", started);
                return Answer {
                    status: StatusCode::BAD_REQUEST,
                    body: serde_json::json!({ "error": message.to_string() }),
                };
            }
        };
        let object = describe(&request);
        let decision =
            match tokio::time::timeout(self.settings.timeout, self.decide(&request)).await {
                Ok(decision) => decision,
                Err(_) => self.undecided(
                    self.resource_of(&request),
                    &format!(
                        "no decision within the webhook's {:?} budget (controller.webhook.timeout)",
                        self.settings.timeout
                    ),
                ),
            };
        let label = if decision.allowed {
            "allowed"
        } else {
            "denied"
        };
        self.record(&decision.resource, label, started);
        tracing::info!(
            uid = %request.uid,
            object = %object,
            operation = ?request.operation,
            dry_run = request.dry_run,
            resource = %decision.resource,
            decision = label,
            duration_ms = started.elapsed().as_millis() as u64,
            "Admission review answered"
        );
        let mut response = AdmissionResponse::from(&request);
        if !decision.allowed {
            response = response.deny(decision.message.unwrap_or_default());
        }
        if !decision.warnings.is_empty() {
            response.warnings = Some(decision.warnings);
        }
        Answer {
            status: StatusCode::OK,
            body: serde_json::to_value(response.into_review()).unwrap_or(Value::Null),
        }
    }

    fn record(&self, resource: &str, decision: &str, started: Instant) {
        if let Some(metrics) = &self.metrics {
            metrics.record(resource, decision, started.elapsed());
        }
    }

    /// The targets the request's object (new or old version) belongs to.
    fn matching(&self, request: &AdmissionRequest<DynamicObject>) -> Vec<(&Target, Change)> {
        let api_version = if request.kind.group.is_empty() {
            request.kind.version.clone()
        } else {
            format!("{}/{}", request.kind.group, request.kind.version)
        };
        let namespace = request.namespace.clone().unwrap_or_default();
        let new = request
            .object
            .as_ref()
            .map(|o| object_value(o, &api_version, &request.kind.kind, &namespace));
        let old = request
            .old_object
            .as_ref()
            .map(|o| object_value(o, &api_version, &request.kind.kind, &namespace));
        let name = Some(request.name.as_str())
            .filter(|n| !n.is_empty())
            .or_else(|| {
                [new.as_ref(), old.as_ref()]
                    .into_iter()
                    .flatten()
                    .find_map(|o| o.pointer("/metadata/name").and_then(Value::as_str))
                    .filter(|n| !n.is_empty())
            })
            .map_or_else(
                // A create relying on generateName: a name no object has stands in.
                || format!("{}-pending-admission", request.kind.kind.to_lowercase()),
                str::to_owned,
            );
        let selects = |target: &Target, object: &Option<Value>| {
            object
                .as_ref()
                .is_some_and(|o| target.selects(&api_version, &request.kind.kind, &namespace, o))
        };
        self.targets
            .iter()
            .filter_map(|target| {
                let key = target.key(&namespace, &name);
                let change = match (
                    &request.operation,
                    selects(target, &new),
                    selects(target, &old),
                ) {
                    (Operation::Delete, _, true) => Change::Remove(key),
                    (Operation::Create | Operation::Update, true, _) => {
                        Change::Upsert(key, target.prepare(new.clone()?))
                    }
                    // Relabelled out of the selection: gone from the resource.
                    (Operation::Update, false, true) => Change::Remove(key),
                    _ => return None,
                };
                Some((target, change))
            })
            .collect()
    }

    fn resource_of(&self, request: &AdmissionRequest<DynamicObject>) -> String {
        let names: Vec<&str> = self
            .matching(request)
            .into_iter()
            .map(|(t, _)| &*t.name)
            .collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(",")
        }
    }

    async fn decide(&self, request: &AdmissionRequest<DynamicObject>) -> Decision {
        if request.operation == Operation::Connect {
            return Decision::allow("none");
        }
        let changes = self.matching(request);
        if changes.is_empty() {
            let mut decision = Decision::allow("none");
            decision.warnings.push(format!(
                "hapwright does not validate {} objects (not selected by any resource in \
                 controller.webhook.resources); admitted unchecked",
                kind_name(request)
            ));
            return decision;
        }
        let resource = changes
            .iter()
            .map(|(t, _)| &*t.name)
            .collect::<Vec<_>>()
            .join(",");
        let state = self.current.get();
        if let Some((target, _)) = changes
            .iter()
            .find(|(t, _)| !state.synced.contains(&t.name))
        {
            return self.undecided(
                resource,
                &format!(
                    "the current `{}` objects are not loaded yet (the source has not finished \
                     its first listing)",
                    target.name
                ),
            );
        }
        let mut resources = state.resources.clone();
        let mut changed = false;
        for (target, change) in changes {
            let mut snapshot = state.snapshots.get(&target.name).map_or_else(
                || ResourceSnapshot::new(target.index_by.clone()),
                |s| (**s).clone(),
            );
            let mut delta = ResourceChange::default();
            match change {
                Change::Upsert(key, object) => match snapshot.upsert(key.clone(), &object) {
                    Some(hapwright_eventbus::model::UpsertOutcome::Added) => delta.added.push(key),
                    Some(_) => delta.modified.push(key),
                    None => {}
                },
                Change::Remove(key) => {
                    if snapshot.remove(&key).is_some() {
                        delta.removed.push(key);
                    }
                }
            }
            if !delta.is_empty() {
                changed = true;
                resources.update(&target.name, Arc::new(snapshot), Some(&delta));
            }
        }
        if !changed {
            // Nothing a template sees changes (a status update, an ignored field).
            return Decision::allow(resource);
        }
        match quarantine::render_and_validate(&self.renderer, resources, &self.validate).await {
            Ok(_) => Decision::allow(resource),
            Err(failure) if failure.tool_failure => self.undecided(
                resource,
                &format!("validation could not run: {}", quote(&failure.errors)),
            ),
            Err(failure) => Decision {
                allowed: false,
                message: Some(format!(
                    "hapwright: with this {} the HAProxy configuration would be invalid: {}",
                    describe(request),
                    quote(&failure.errors)
                )),
                warnings: Vec::new(),
                resource,
            },
        }
    }

    /// The answer when no decision could be reached, by the failure policy.
    fn undecided(&self, resource: String, why: &str) -> Decision {
        match self.settings.failure_policy {
            FailurePolicy::Fail => Decision {
                allowed: false,
                message: Some(format!(
                    "hapwright could not validate this object: {why} (failurePolicy Fail)"
                )),
                warnings: Vec::new(),
                resource,
            },
            FailurePolicy::Ignore => {
                let mut decision = Decision::allow(resource);
                decision.warnings.push(format!(
                    "hapwright could not validate this object: {why}; admitted unchecked \
                     (failurePolicy Ignore)"
                ));
                decision
            }
        }
    }
}

/// What a review does to one watched resource.
#[derive(Debug)]
enum Change {
    Upsert(hapwright_eventbus::model::ObjectKey, Value),
    Remove(hapwright_eventbus::model::ObjectKey),
}

/// Why a request body is not an AdmissionReview hapwright answers (a 400).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The body is not JSON of an AdmissionReview.
    #[error("invalid AdmissionReview: {0}")]
    Invalid(serde_json::Error),
    /// A value of the review has the wrong type or form.
    #[error("invalid AdmissionReview at {path}: {error}")]
    InvalidAt {
        /// Where, as `request.object.metadata`.
        path: String,
        /// What is wrong there.
        error: serde_json::Error,
    },
    /// Not `admission.k8s.io/v1` `AdmissionReview`.
    #[error(
        "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got `{api_version}` `{kind}`"
    )]
    WrongType {
        /// The review's `apiVersion`.
        api_version: String,
        /// The review's `kind`.
        kind: String,
    },
    /// The review holds no request.
    #[error("invalid AdmissionReview: `request` is missing")]
    NoRequest,
}

/// Parses and checks an AdmissionReview body; the error says where it is wrong.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, ReviewError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let review: AdmissionReview<DynamicObject> =
        serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
            let path = error.path().to_string();
            let error = error.into_inner();
            if path == "." {
                ReviewError::Invalid(error)
            } else {
                ReviewError::InvalidAt { path, error }
            }
        })?;
    // Nothing but blanks may follow the review (found by fuzzing: the reader stopped
    // at the review's closing brace and accepted whatever came after it).
    deserializer.end().map_err(ReviewError::Invalid)?;
    if review.types.api_version != "admission.k8s.io/v1" || review.types.kind != "AdmissionReview" {
        return Err(ReviewError::WrongType {
            api_version: review.types.api_version,
            kind: review.types.kind,
        });
    }
    review.try_into().map_err(|_| ReviewError::NoRequest)
}

/// The object as the sources store it: `apiVersion`, `kind` and (for a namespaced
/// request) `metadata.namespace` filled in.
fn object_value(object: &DynamicObject, api_version: &str, kind: &str, namespace: &str) -> Value {
    let mut value = serde_json::to_value(object).unwrap_or(Value::Null);
    if let Some(map) = value.as_object_mut() {
        map.entry("apiVersion")
            .or_insert_with(|| Value::from(api_version));
        map.entry("kind").or_insert_with(|| Value::from(kind));
        if !namespace.is_empty()
            && let Some(metadata) = map.get_mut("metadata").and_then(Value::as_object_mut)
        {
            metadata
                .entry("namespace")
                .or_insert_with(|| Value::from(namespace));
        }
    }
    value
}

fn kind_name(request: &AdmissionRequest<DynamicObject>) -> String {
    if request.kind.group.is_empty() {
        format!("{}/{}", request.kind.version, request.kind.kind)
    } else {
        format!(
            "{}/{}/{}",
            request.kind.group, request.kind.version, request.kind.kind
        )
    }
}

/// `Kind namespace/name` of the reviewed object.
fn describe(request: &AdmissionRequest<DynamicObject>) -> String {
    match request.namespace.as_deref().filter(|n| !n.is_empty()) {
        Some(namespace) => format!("{} {namespace}/{}", request.kind.kind, request.name),
        None => format!("{} {}", request.kind.kind, request.name),
    }
}

/// The first errors, each as `file:line: message (from template:line)`.
fn quote(errors: &[Diagnostic]) -> String {
    let mut text = errors
        .iter()
        .take(MAX_QUOTED)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    if errors.len() > MAX_QUOTED {
        text.push_str(&format!(" (and {} more)", errors.len() - MAX_QUOTED));
    }
    text
}
