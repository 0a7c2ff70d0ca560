//! Kubernetes Events on quarantined objects: the object's owner sees why hapwright
//! holds the change back with `kubectl describe`, without access to hapwright.
//!
//! [`QuarantineEvents`] follows `QuarantineSearched`. For each newly quarantined
//! object of a `kubernetes` watched resource it writes a `Warning` Event
//! (`HapwrightQuarantined`) regarding the object, with the change held back and its
//! errors (template file and line, HAProxy's message); for each released object a
//! `Normal` Event (`HapwrightReleased`). Events go through the `events.k8s.io/v1`
//! API ([`kube::runtime::events::Recorder`], which also folds repeats into a
//! series). Objects of `files` resources get none: they are not in the cluster.
//!
//! Only the leader writes (with leader election on), so replicas do not repeat
//! each other's Events; an object quarantined while this replica followed is
//! announced at the next search after it leads. A failed write (no RBAC for
//! `events.k8s.io` `create`/`patch`, API down) is logged and makes the component
//! `degraded`; it never affects deployment.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hapwright_eventbus::model::{ObjectKey, ResourceSnapshot};
use hapwright_eventbus::{
    Component, ComponentError, Context, EventKind, EventPayload, Interest, QuarantinedObject,
};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::watch;

use super::ClientFactory;

/// The `reason` of the Event on a quarantined object.
pub const QUARANTINED_REASON: &str = "HapwrightQuarantined";
/// The `reason` of the Event on a released object.
pub const RELEASED_REASON: &str = "HapwrightReleased";
/// The `reportingController` of every Event.
pub const REPORTING_CONTROLLER: &str = "hapwright";
/// The Events API's limit on `note`, in bytes.
const MAX_NOTE: usize = 1024;

/// The `apiVersion` and `kind` of one `kubernetes` watched resource: what its
/// objects' Events regard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchedKind {
    /// `apiVersion` (`v1`, `networking.k8s.io/v1`).
    pub api_version: String,
    /// `kind`.
    pub kind: String,
}

/// The component. See the [module docs](self).
pub struct QuarantineEvents {
    client: ClientFactory,
    kinds: BTreeMap<Arc<str>, WatchedKind>,
    leadership: Option<watch::Receiver<bool>>,
    instance: Option<String>,
}

impl std::fmt::Debug for QuarantineEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuarantineEvents")
            .field("kinds", &self.kinds)
            .finish_non_exhaustive()
    }
}

impl QuarantineEvents {
    /// The component name.
    pub const NAME: &'static str = "kubernetes-events";

    /// Events for the objects of `kinds` (watched resource name → its `apiVersion`
    /// and `kind`); objects of other resources are left alone.
    pub fn new(
        client: ClientFactory,
        kinds: impl IntoIterator<Item = (Arc<str>, WatchedKind)>,
    ) -> Self {
        Self {
            client,
            kinds: kinds.into_iter().collect(),
            leadership: None,
            instance: None,
        }
    }

    /// Writes only while `leader` holds `true` (leader election on).
    #[must_use]
    pub fn with_leadership(mut self, leader: watch::Receiver<bool>) -> Self {
        self.leadership = Some(leader);
        self
    }

    /// The `reportingInstance` of the Events (the pod name), so replicas can be
    /// told apart; default: the controller name.
    #[must_use]
    pub fn with_instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = Some(instance.into());
        self
    }
}

/// What identifies one announcement: the object and the change held back.
type Announced = (Arc<str>, String, String, &'static str);

fn key(object: &QuarantinedObject) -> Announced {
    (
        object.resource.clone(),
        object.namespace.clone(),
        object.name.clone(),
        object.change,
    )
}

struct State {
    kinds: BTreeMap<Arc<str>, WatchedKind>,
    /// Latest snapshot per watched Kubernetes resource, for the objects' uids.
    snapshots: BTreeMap<Arc<str>, Arc<ResourceSnapshot>>,
    /// Quarantines already written as Events.
    announced: BTreeSet<Announced>,
    recorder: Option<Recorder>,
    client: ClientFactory,
    reporter: Reporter,
}

impl State {
    fn reference(&self, object: &QuarantinedObject) -> Option<ObjectReference> {
        let kind = self.kinds.get(&object.resource)?;
        let uid = self
            .snapshots
            .get(&object.resource)
            .and_then(|snapshot| {
                snapshot.get_by_key(&ObjectKey::new(
                    object.namespace.clone(),
                    object.name.clone(),
                ))
            })
            .and_then(|stored| {
                let value = stored.parse();
                value["metadata"]["uid"].as_str().map(str::to_owned)
            });
        Some(ObjectReference {
            api_version: Some(kind.api_version.clone()),
            kind: Some(object.kind.clone().unwrap_or_else(|| kind.kind.clone())),
            name: Some(object.name.clone()),
            namespace: (!object.namespace.is_empty()).then(|| object.namespace.clone()),
            uid,
            ..ObjectReference::default()
        })
    }

    async fn recorder(&mut self) -> Result<Recorder, super::ClientError> {
        if let Some(recorder) = &self.recorder {
            return Ok(recorder.clone());
        }
        let client = self.client.get().await?;
        let recorder = Recorder::new(client, self.reporter.clone());
        self.recorder = Some(recorder.clone());
        Ok(recorder)
    }

    /// Writes the Events of one search; the first failure, if any.
    async fn announce(
        &mut self,
        quarantined: &[QuarantinedObject],
        released: &[QuarantinedObject],
    ) -> Option<String> {
        let mut failure = None;
        for object in quarantined {
            let key = key(object);
            if self.announced.contains(&key) {
                continue;
            }
            let Some(reference) = self.reference(object) else {
                continue;
            };
            let event = Event {
                type_: EventType::Warning,
                reason: QUARANTINED_REASON.to_owned(),
                note: Some(quarantine_note(object)),
                action: "Validate".to_owned(),
                secondary: None,
            };
            match self.write(&event, &reference).await {
                Ok(()) => {
                    self.announced.insert(key);
                }
                Err(error) => {
                    failure.get_or_insert(error);
                }
            }
        }
        for object in released {
            let Some(reference) = self.reference(object) else {
                continue;
            };
            self.announced.retain(|(resource, namespace, name, _)| {
                !(resource == &object.resource
                    && namespace == &object.namespace
                    && name == &object.name)
            });
            let event = Event {
                type_: EventType::Normal,
                reason: RELEASED_REASON.to_owned(),
                note: Some(
                    "Released from hapwright's quarantine: the object's current version \
                     validates and is deployed."
                        .to_owned(),
                ),
                action: "Validate".to_owned(),
                secondary: None,
            };
            if let Err(error) = self.write(&event, &reference).await {
                failure.get_or_insert(error);
            }
        }
        failure
    }

    async fn write(&mut self, event: &Event, reference: &ObjectReference) -> Result<(), String> {
        let recorder = self.recorder().await.map_err(|e| e.to_string())?;
        recorder.publish(event, reference).await.map_err(|e| {
            let reason = super::describe_error(&e);
            tracing::warn!(
                kind = reference.kind.as_deref().unwrap_or_default(),
                namespace = reference.namespace.as_deref().unwrap_or_default(),
                name = reference.name.as_deref().unwrap_or_default(),
                reason = event.reason,
                error = %reason,
                "Cannot write a Kubernetes Event"
            );
            reason
        })?;
        tracing::info!(
            kind = reference.kind.as_deref().unwrap_or_default(),
            namespace = reference.namespace.as_deref().unwrap_or_default(),
            name = reference.name.as_deref().unwrap_or_default(),
            reason = event.reason,
            "Kubernetes Event written"
        );
        Ok(())
    }
}

/// The Event's note: the change held back and every error, within the API's limit.
pub fn quarantine_note(object: &QuarantinedObject) -> String {
    let errors: Vec<String> = object.errors.iter().map(ToString::to_string).collect();
    let note = format!(
        "hapwright holds this object's change ({}) back: the configuration fails with it, \
         and the rest of the change was deployed without it. {}",
        object.change,
        errors.join("; ")
    );
    truncate(note, MAX_NOTE)
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
    text
}

#[async_trait::async_trait]
impl Component for QuarantineEvents {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([
            EventKind::QuarantineSearched,
            EventKind::ResourceIndexUpdated,
        ])
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        let QuarantineEvents {
            client,
            kinds,
            leadership,
            instance,
        } = *self;
        let mut state = State {
            kinds,
            snapshots: BTreeMap::new(),
            announced: BTreeSet::new(),
            recorder: None,
            client,
            reporter: Reporter {
                controller: REPORTING_CONTROLLER.to_owned(),
                instance,
            },
        };
        ctx.health().healthy();
        while let Some(event) = ctx.next_event().await {
            match &event.payload {
                EventPayload::ResourceIndexUpdated(update)
                    if state.kinds.contains_key(&update.source) =>
                {
                    state
                        .snapshots
                        .insert(update.source.clone(), update.snapshot.clone());
                }
                EventPayload::QuarantineSearched(searched) => {
                    let leader = leadership.as_ref().is_none_or(|l| *l.borrow());
                    if !leader {
                        tracing::debug!("Not the leader: no Kubernetes Events for the quarantine");
                        continue;
                    }
                    match state.announce(&searched.objects, &searched.released).await {
                        Some(error) => ctx
                            .health()
                            .degraded(format!("cannot write Kubernetes Events: {error}")),
                        None => ctx.health().healthy(),
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_at_the_api_limit_on_a_character_boundary() {
        let text = "é".repeat(2000);
        let cut = truncate(text, MAX_NOTE);
        assert!(cut.len() <= MAX_NOTE);
        assert!(cut.ends_with('…'));
        assert_eq!(truncate("short".to_owned(), MAX_NOTE), "short");
    }
}
