//! Runs the culprit [search](super::search) against the real renderer and a
//! validation step, and keeps the list of quarantined objects.
//!
//! Each probe renders the last good snapshots with some changes applied (on the
//! blocking pool, as the renderer component does) and hands the result to a
//! [`Validate`] step. The validation phases live in the deployer crate; the
//! application passes them in, so this crate stays free of HAProxy.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use hapwright_eventbus::model::{Diagnostic, ObjectKey, RenderedConfig, StoredObject};

use super::changes::{ChangeSet, Snapshots};
use super::search::{self, Outcome, Probe, Rejection, Settings};
use crate::renderer::{Renderer, Resources};

/// Why a candidate did not validate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Every error, located where possible (template file and line, HAProxy's
    /// message).
    pub errors: Vec<Diagnostic>,
    /// The validating tool itself failed (missing binary, timeout): says nothing
    /// about the objects, so the search stops.
    pub tool_failure: bool,
}

/// A boxed future of a [`Validate`] step.
pub type ValidateFuture = Pin<Box<dyn Future<Output = Result<(), Failure>> + Send>>;

/// Validates one rendered candidate (phase 1 and phase 2, as the validator does).
pub type Validate = Arc<dyn Fn(Arc<RenderedConfig>) -> ValidateFuture + Send + Sync>;

/// A changed object that makes the candidate fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Culprit {
    /// The watched resource.
    pub resource: Arc<str>,
    /// The object's namespace and name.
    pub key: ObjectKey,
    /// `added`, `modified` or `removed`.
    pub change: &'static str,
    /// The version held back (`None` for a removal held back: the object stays).
    pub content: Option<StoredObject>,
    /// The last accepted version, served while the change is held back (`None` when
    /// the object is new: it stays out).
    pub last_accepted: Option<StoredObject>,
    /// The change is a whole payload ([`changes::PAYLOAD_NAME`](super::changes::PAYLOAD_NAME)):
    /// its versions are summaries, not objects.
    pub payload: bool,
    /// Why the candidate with this change failed.
    pub errors: Vec<Diagnostic>,
}

/// The result of a successful search.
#[derive(Clone, Debug)]
pub struct Isolated {
    /// The config of the accepted changes, rendered and validated (the last good
    /// objects' when no change was accepted: the search validates them again then).
    pub config: Option<Arc<RenderedConfig>>,
    /// The snapshots the config was rendered from: the new last good state.
    pub snapshots: Snapshots,
    /// Changes accepted.
    pub accepted: usize,
    /// The changes held back.
    pub culprits: Vec<Culprit>,
    /// Renders (and validations) made.
    pub probes: usize,
}

/// Why the search gave up; the caller rejects the whole change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GaveUp {
    /// Why.
    pub reason: Rejection,
    /// Renders (and validations) made.
    pub probes: usize,
    /// The errors of the probe that made the search give up: the last good
    /// objects' for [`Rejection::BaselineFails`] (compare them with the change's
    /// to tell whether the change fails the same way), the tool's for
    /// [`Rejection::ToolFailure`]; empty otherwise.
    pub errors: Vec<Diagnostic>,
}

impl GaveUp {
    /// True when the last good objects failed with the same errors as the change
    /// (`change`): the failure does not depend on the changed objects at all. By
    /// message, since the same error may point at other lines.
    pub fn same_errors(&self, change: &[Diagnostic]) -> bool {
        !self.errors.is_empty()
            && self.errors.len() == change.len()
            && self
                .errors
                .iter()
                .zip(change)
                .all(|(a, b)| a.message == b.message)
    }
}

/// Finds the changes of `set` that make the candidate fail, rendering with
/// `renderer` from `current` (the renderer's latest resources, whose converted
/// objects are reused) and validating with `validate`. `errors` are those of the
/// failed reconciliation: the changes whose new values they quote are tried as the
/// culprits first ([`hints`](super::hints)). At most
/// `settings.max_probes` renders and validations.
///
/// # Errors
///
/// [`GaveUp`] when the failure does not depend on the objects, or the bound is hit:
/// the whole change is rejected, as without quarantine.
pub async fn isolate(
    renderer: &Renderer,
    current: &Resources,
    set: &ChangeSet,
    validate: &Validate,
    settings: Settings,
    errors: &[Diagnostic],
) -> Result<Isolated, GaveUp> {
    let mut probe = RenderProbe {
        renderer,
        current,
        set,
        validate,
    };
    let suspects = super::hints::suspects(set, errors);
    let units: Vec<usize> = set
        .changes()
        .iter()
        .enumerate()
        .filter(|(_, change)| change.whole.is_some())
        .map(|(index, _)| index)
        .collect();
    match search::search_with_units(&mut probe, set.len(), None, settings, &suspects, &units).await
    {
        Outcome::Found {
            accepted,
            output,
            culprits,
            probes,
        } => Ok(Isolated {
            config: output,
            snapshots: set.applied(&accepted),
            accepted: accepted.len(),
            culprits: culprits
                .into_iter()
                .map(|(index, failure)| {
                    let change = &set.changes()[index];
                    Culprit {
                        resource: change.resource.clone(),
                        key: change.key.clone(),
                        change: change.kind(),
                        content: change.new.as_ref().map(|new| new.object().clone()),
                        last_accepted: change.old.as_ref().map(|old| old.object().clone()),
                        payload: change.whole.is_some(),
                        errors: failure.errors,
                    }
                })
                .collect(),
            probes,
        }),
        Outcome::Rejected {
            reason,
            probes,
            error,
        } => Err(GaveUp {
            reason,
            probes,
            errors: error.map(|failure| failure.errors).unwrap_or_default(),
        }),
    }
}

/// Renders `resources` with `renderer` (on the blocking pool, as the renderer
/// component does) and validates the result with `validate`: the check of one
/// candidate state, shared by the culprit search and the admission webhook, so both
/// judge a candidate exactly as a reconciliation would.
///
/// # Errors
///
/// The render errors (not a tool failure), or what `validate` found.
pub async fn render_and_validate(
    renderer: &Renderer,
    resources: Resources,
    validate: &Validate,
) -> Result<Arc<RenderedConfig>, Failure> {
    let renderer = renderer.clone();
    let rendered = tokio::task::spawn_blocking(move || renderer.render(&resources))
        .await
        .map_err(|join| Failure {
            errors: vec![Diagnostic::error(format!("the renderer crashed: {join}"))],
            tool_failure: true,
        })?
        .map_err(|errors| Failure {
            errors,
            tool_failure: false,
        })?;
    let rendered = Arc::new(rendered);
    validate(rendered.clone()).await?;
    Ok(rendered)
}

/// Renders and validates candidates.
struct RenderProbe<'a> {
    renderer: &'a Renderer,
    current: &'a Resources,
    set: &'a ChangeSet,
    validate: &'a Validate,
}

impl Probe for RenderProbe<'_> {
    type Output = Arc<RenderedConfig>;
    type Error = Failure;

    async fn probe(&mut self, applied: &[usize]) -> Result<Arc<RenderedConfig>, Failure> {
        let mut resources = self.current.clone();
        for (source, snapshot) in self.set.applied(applied) {
            resources.update(&source, snapshot, None);
        }
        render_and_validate(self.renderer, resources, self.validate).await
    }

    fn is_tool_failure(&self, error: &Failure) -> bool {
        error.tool_failure
    }
}

// === impl LastGood ===

/// The snapshots of the last render that validated, shared across controller config
/// reloads: after a reload, a failing change is searched against the objects that
/// last validated (rendered with the new templates), not against an empty state, so
/// a template edit that breaks every object of a kind is rejected as a whole instead
/// of quarantining those objects. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct LastGood(Arc<std::sync::Mutex<Snapshots>>);

impl LastGood {
    /// Nothing validated yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The snapshots last stored.
    pub fn get(&self) -> Snapshots {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Stores the snapshots of a render that validated.
    pub fn set(&self, snapshots: Snapshots) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = snapshots;
    }
}

// === impl Quarantine ===

/// One quarantined object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The object and why it is held back.
    pub culprit: Culprit,
    /// When it was quarantined.
    pub since: SystemTime,
}

/// The quarantined objects: changes held back at their last good version (or left
/// out, when new) until they change again.
#[derive(Clone, Debug, Default)]
pub struct Quarantine {
    entries: BTreeMap<(Arc<str>, ObjectKey), Entry>,
}

/// What [`Quarantine::settle`] changed, for the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Objects newly quarantined (or quarantined again with new content).
    pub quarantined: Vec<Culprit>,
    /// Objects released: their change validated, or they were changed back.
    pub released: Vec<Culprit>,
}

impl Quarantine {
    /// Nothing quarantined.
    pub fn new() -> Self {
        Self::default()
    }

    /// The quarantine of `entries` (read back from the record of an earlier run).
    pub fn from_entries(entries: impl IntoIterator<Item = Entry>) -> Self {
        Self {
            entries: entries
                .into_iter()
                .map(|entry| {
                    let id = (entry.culprit.resource.clone(), entry.culprit.key.clone());
                    (id, entry)
                })
                .collect(),
        }
    }

    /// Removes from `set` the changes of objects already quarantined with the same
    /// content: they stay at their last good version with no new search. A
    /// quarantined object that changed again stays in `set` and is retried.
    /// Returns how many changes were held back.
    pub fn hold_back(&self, set: &mut ChangeSet) -> usize {
        let before = set.len();
        set.retain(|change| {
            let held = self
                .entries
                .get(&(change.resource.clone(), change.key.clone()));
            !held.is_some_and(|entry| {
                entry.culprit.content.as_ref() == change.new.as_ref().map(|new| new.object())
            })
        });
        before - set.len()
    }

    /// Records the outcome of a reconciliation. `full` is every change from the
    /// last good state to the current one (before [`hold_back`](Self::hold_back)),
    /// `culprits` what the search found (empty when everything validated). An
    /// object stays quarantined while it is still changed with the content it was
    /// quarantined with; every other entry is released.
    pub fn settle(&mut self, full: &ChangeSet, culprits: &[Culprit], now: SystemTime) -> Settled {
        let mut entries = BTreeMap::new();
        for change in full.changes() {
            let id = (change.resource.clone(), change.key.clone());
            if let Some(entry) = self.entries.get(&id)
                && entry.culprit.content.as_ref() == change.new.as_ref().map(|new| new.object())
                && !culprits.iter().any(|c| c.resource == id.0 && c.key == id.1)
            {
                entries.insert(id, entry.clone());
            }
        }
        let mut settled = Settled::default();
        for culprit in culprits {
            let id = (culprit.resource.clone(), culprit.key.clone());
            let known = self
                .entries
                .get(&id)
                .is_some_and(|entry| entry.culprit.content == culprit.content);
            if !known {
                settled.quarantined.push(culprit.clone());
            }
            let since = match self.entries.get(&id) {
                Some(entry) if known => entry.since,
                _ => now,
            };
            entries.insert(
                id,
                Entry {
                    culprit: culprit.clone(),
                    since,
                },
            );
        }
        for (id, entry) in &self.entries {
            if !entries.contains_key(id) {
                settled.released.push(entry.culprit.clone());
            }
        }
        self.entries = entries;
        settled
    }

    /// Every quarantined object, by resource, then key.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> + '_ {
        self.entries.values()
    }

    /// Number of quarantined objects.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is quarantined.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Quarantined objects per watched resource (for
    /// `hapwright_quarantined_objects{resource}`).
    pub fn counts(&self) -> BTreeMap<Arc<str>, usize> {
        let mut counts = BTreeMap::new();
        for (resource, _) in self.entries.keys() {
            *counts.entry(resource.clone()).or_default() += 1;
        }
        counts
    }
}

#[cfg(test)]
mod tests;
