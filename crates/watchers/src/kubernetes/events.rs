//! Kubernetes Events on quarantined objects, and on objects the templates report
//! about: the object's owner sees why hapwright holds the change back, or what the
//! templates refused of it, with `kubectl describe`, without access to hapwright.
//!
//! **Notices.** A `haproxy.cfg` comment line of the form
//! `# hapwright:<Reason> <Kind> <namespace>/<name>: <message>` (for example
//! `# hapwright:Conflict Ingress shop/web: prefix path a.test/ is refused, ...`) is a
//! notice about that object ([`notices`]). After each render the leader writes a
//! `Warning` Event `Hapwright<Reason>` with the message for every notice that is new
//! since the last render, on the object of the `kubernetes` watched resource of that
//! kind; a notice that disappears is forgotten, so it is written again if it returns.
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
/// The `reason` prefix of the Event for a notice (`HapwrightConflict`).
pub const NOTICE_REASON_PREFIX: &str = "Hapwright";
/// The comment that starts a notice line in `haproxy.cfg`.
const NOTICE_MARK: &str = "# hapwright:";
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

/// A notice the templates wrote about one object ([module docs](self)).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Notice {
    /// `Conflict` in `# hapwright:Conflict ...`: letters and digits only.
    pub reason: String,
    /// The object's `kind`.
    pub kind: String,
    /// The object's namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// What the templates say about it (the Event's note).
    pub message: String,
}

/// The notices of a rendered `haproxy.cfg`: every line
/// `# hapwright:<Reason> <Kind> <namespace>/<name>[:] <message>` (leading blanks
/// allowed; `Reason` and `Kind` CamelCase words). Lines that do not have this shape
/// are ignored.
pub fn notices(config: &str) -> BTreeSet<Notice> {
    config
        .lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix(NOTICE_MARK)?;
            let (reason, rest) = rest.split_once(' ')?;
            let (kind, rest) = rest.trim_start().split_once(' ')?;
            let (object, message) = rest.trim_start().split_once(' ').unwrap_or((rest, ""));
            let object = object.strip_suffix(':').unwrap_or(object);
            let (namespace, name) = object.split_once('/')?;
            // `Conflict`, `Ingress`: CamelCase words, as Event reasons and kinds are.
            let word = |w: &str| {
                w.len() <= 64
                    && w.starts_with(|c: char| c.is_ascii_uppercase())
                    && w.chars().all(|c| c.is_ascii_alphanumeric())
            };
            if !word(reason) || !word(kind) || namespace.is_empty() || name.is_empty() {
                return None;
            }
            let message = message.trim();
            let message = message.strip_prefix(": ").unwrap_or(message);
            Some(Notice {
                reason: reason.to_owned(),
                kind: kind.to_owned(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                message: message.to_owned(),
            })
        })
        .collect()
}

struct State {
    kinds: BTreeMap<Arc<str>, WatchedKind>,
    /// Notices of the last render already written as Events.
    noticed: BTreeSet<Notice>,
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
        Some(self.object_reference(
            &object.resource,
            kind,
            object.kind.clone(),
            &object.namespace,
            &object.name,
        ))
    }

    /// The object a notice regards: of the first `kubernetes` watched resource of
    /// its kind.
    fn notice_reference(&self, notice: &Notice) -> Option<ObjectReference> {
        let (resource, kind) = self.kinds.iter().find(|(_, k)| k.kind == notice.kind)?;
        Some(self.object_reference(resource, kind, None, &notice.namespace, &notice.name))
    }

    fn object_reference(
        &self,
        resource: &Arc<str>,
        kind: &WatchedKind,
        object_kind: Option<String>,
        namespace: &str,
        name: &str,
    ) -> ObjectReference {
        let uid = self
            .snapshots
            .get(resource)
            .and_then(|snapshot| snapshot.get_by_key(&ObjectKey::new(namespace, name)))
            .and_then(|stored| {
                let value = stored.parse();
                value["metadata"]["uid"].as_str().map(str::to_owned)
            });
        ObjectReference {
            api_version: Some(kind.api_version.clone()),
            kind: Some(object_kind.unwrap_or_else(|| kind.kind.clone())),
            name: Some(name.to_owned()),
            namespace: (!namespace.is_empty()).then(|| namespace.to_owned()),
            uid,
            ..ObjectReference::default()
        }
    }

    /// Writes a Warning Event for each notice of a render that the last render did
    /// not have; the first failure, if any (a notice whose Event failed is tried
    /// again after the next render).
    async fn notify(&mut self, current: BTreeSet<Notice>) -> Option<WriteError> {
        let mut failure = None;
        self.noticed.retain(|notice| current.contains(notice));
        for notice in current {
            if self.noticed.contains(&notice) {
                continue;
            }
            let Some(reference) = self.notice_reference(&notice) else {
                continue;
            };
            let event = Event {
                type_: EventType::Warning,
                reason: format!("{NOTICE_REASON_PREFIX}{}", notice.reason),
                note: Some(truncate(notice.message.clone(), MAX_NOTE)),
                action: "Render".to_owned(),
                secondary: None,
            };
            match self.write(&event, &reference).await {
                Ok(()) => {
                    self.noticed.insert(notice);
                }
                Err(error) => {
                    failure.get_or_insert(error);
                }
            }
        }
        failure
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
    ) -> Option<WriteError> {
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

    async fn write(
        &mut self,
        event: &Event,
        reference: &ObjectReference,
    ) -> Result<(), WriteError> {
        let recorder = self.recorder().await?;
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
            WriteError::Publish(e)
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

/// Why a Kubernetes Event was not written.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    /// No client to write with.
    #[error(transparent)]
    Client(#[from] super::ClientError),
    /// The API server refused the Event or did not answer.
    #[error("{}", super::describe_error(.0))]
    Publish(kube::Error),
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
            EventKind::TemplateRendered,
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
            noticed: BTreeSet::new(),
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
                EventPayload::TemplateRendered(rendered) => {
                    let leader = leadership.as_ref().is_none_or(|l| *l.borrow());
                    if !leader {
                        // A new leader writes what is still noticed then.
                        state.noticed.clear();
                        continue;
                    }
                    match state.notify(notices(rendered.config.main())).await {
                        Some(error) => ctx
                            .health()
                            .degraded(format!("cannot write Kubernetes Events: {error}")),
                        None => ctx.health().healthy(),
                    }
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
