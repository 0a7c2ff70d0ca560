//! The renderer as a bus component.

use std::sync::Arc;
use std::time::SystemTime;

use hapwright_eventbus::model::{ObjectKey, RenderSummary, RenderedConfig, ResourceSnapshot};
use hapwright_eventbus::{
    Component, ComponentError, Context, CorrelationId, Event, EventKind, EventPayload, Interest,
    QuarantineSearched, QuarantinedObject, TemplateInputs, TemplateRenderFailed, TemplateRendered,
};
use tracing::Instrument;

use super::{Renderer, Resources};
use crate::quarantine::changes::Snapshots;
use crate::quarantine::{self, ChangeSet, Culprit, Kept, LastGood, Quarantine, Validate};

/// Renders the templates for every reconciliation.
///
/// Subscribes to `ResourceIndexUpdated` (keeps the latest [`Resources`], converting
/// only what changed) and `ReconciliationStarted` (the executor's request to render,
/// carrying the correlation id). Replies with `TemplateRendered` or
/// `TemplateRenderFailed` in the same correlation.
///
/// Latest wins: before rendering, every event already queued is taken first, so a
/// burst of starts renders once, for the newest, with the newest data. Output
/// identical to the previous render reuses the previous `Arc<RenderedConfig>` (same
/// hash); the executor completes such a reconciliation without waiting for
/// validation.
///
/// With [quarantine](RendererComponent::with_quarantine) on, it also follows the
/// validation outcome of its renders: after a failed render or validation it
/// searches which objects changed since the last validated snapshots cause the
/// failure (direct render and validation calls, at most `max_validations`), then
/// publishes `QuarantineSearched` and, when the culprits were found, a
/// `TemplateRendered` of the largest set of changes that validates, both in the
/// failed reconciliation's correlation. Quarantined objects are held back at their
/// last good version (left out when new) in every later render until they change
/// again. The quarantine is [kept](Kept) beside the deployed files; the first render
/// of the process restores it (see [`QuarantineSettings::kept`]).
pub struct RendererComponent {
    renderer: Renderer,
    quarantine: Option<QuarantineSettings>,
    template_inputs: bool,
}

/// How the renderer component isolates culprits.
#[derive(Clone)]
pub struct QuarantineSettings {
    /// Validates a candidate (both phases, as the validator does).
    pub validate: Validate,
    /// Most extra renders and validations per reconciliation
    /// (`controller.quarantine.maxValidations`).
    pub max_validations: usize,
    /// The last validated snapshots, kept by the application across config
    /// reloads (a fresh [`LastGood`] starts from nothing validated).
    pub last_good: LastGood,
    /// Where the quarantine is kept across restarts: the first render of the
    /// process restores what it read back (a fresh [`Kept`] keeps nothing).
    pub kept: Kept,
}

impl std::fmt::Debug for QuarantineSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuarantineSettings")
            .field("max_validations", &self.max_validations)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RendererComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RendererComponent")
            .field("renderer", &self.renderer)
            .field("quarantine", &self.quarantine)
            .finish()
    }
}

impl RendererComponent {
    /// The component name.
    pub const NAME: &'static str = "renderer";

    /// A renderer component over compiled templates.
    pub fn new(renderer: Renderer) -> Self {
        Self {
            renderer,
            quarantine: None,
            template_inputs: false,
        }
    }

    /// Publishes `TemplateInputs` (the snapshots a render used) before each
    /// `TemplateRendered`, for the status templates' component.
    #[must_use]
    pub fn with_template_inputs(mut self) -> Self {
        self.template_inputs = true;
        self
    }

    /// Turns quarantine on (see the type docs). The executor must be built with
    /// `quarantine` on too, so it waits for the search before failing.
    #[must_use]
    pub fn with_quarantine(mut self, settings: QuarantineSettings) -> Self {
        self.quarantine = Some(settings);
        self
    }
}

#[async_trait::async_trait]
impl Component for RendererComponent {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn consumes(&self) -> Interest {
        let mut kinds = vec![
            EventKind::ResourceIndexUpdated,
            EventKind::ReconciliationStarted,
        ];
        if self.quarantine.is_some() {
            kinds.extend([
                EventKind::TemplateRenderFailed,
                EventKind::ValidationCompleted,
                EventKind::ValidationFailed,
            ]);
        }
        Interest::pipeline(kinds.as_slice())
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        let RendererComponent {
            renderer,
            quarantine,
            template_inputs,
        } = *self;
        let mut resources = Resources::new();
        let mut last: Option<Arc<RenderedConfig>> = None;
        let mut guard = quarantine.map(|settings| Guard {
            template_inputs,
            ..Guard::new(settings)
        });
        loop {
            let Some(event) = ctx.next_event().await else {
                return Ok(());
            };
            let mut request = take(&event, &mut resources, guard.as_mut());
            if let Some(guard) = &mut guard {
                guard.outcome(&event, &renderer, &resources, &ctx).await;
            }
            while let Some(event) = ctx.try_next_event() {
                if let Some(guard) = &mut guard {
                    guard.outcome(&event, &renderer, &resources, &ctx).await;
                }
                if let Some(older) = take(&event, &mut resources, guard.as_mut())
                    .and_then(|newer| request.replace(newer))
                {
                    tracing::debug!(
                        correlation_id = older.correlation_id.map(tracing::field::display),
                        "Skipping render of a superseded reconciliation"
                    );
                }
            }
            let Some(request) = request else {
                continue;
            };
            let span = tracing::info_span!(
                "render",
                correlation_id = request.correlation_id.map(tracing::field::display)
            );
            let job_renderer = renderer.clone();
            if let Some(guard) = &mut guard {
                guard.restore(&request, &renderer, &resources, &ctx).await;
            }
            let job_resources = match &mut guard {
                Some(guard) => guard.start(&request, &resources),
                None => resources.clone(),
            };
            let inputs = template_inputs.then(|| Arc::new(job_resources.snapshots()));
            let job = tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                let (result, stats) = job_renderer.render_with_stats(&job_resources);
                (result, stats, started.elapsed())
            });
            let Some(outcome) = ctx.cancellation_token().run_until_cancelled(job).await else {
                return Ok(());
            };
            async {
                match outcome {
                    Ok((Ok(config), stats, duration)) => {
                        let unchanged = last.as_ref().is_some_and(|l| l.hash() == config.hash());
                        let config = match &last {
                            Some(last) if unchanged => last.clone(),
                            _ => Arc::new(config),
                        };
                        tracing::info!(
                            hash = %config.hash().short(),
                            bytes = config.main().len(),
                            files = config.iter().count(),
                            ?duration,
                            unchanged,
                            rendered_files = stats.rendered,
                            reused_files = stats.reused,
                            rendered_snippets = stats.snippets_rendered,
                            reused_snippets = stats.snippets_reused,
                            spliced_files = stats.spliced,
                            full_because = stats.full_reason.map(|r| r.to_string()),
                            "Rendered configuration"
                        );
                        tracing::debug!(
                            reuse = ?stats.stages.reuse,
                            templates = ?stats.stages.templates,
                            collect = ?stats.stages.collect,
                            sets = ?stats.stages.sets,
                            finish = ?stats.stages.finish,
                            "Render stages"
                        );
                        last = Some(config.clone());
                        report_health(&ctx, guard.as_ref());
                        // Fragments: whole files and the snippet outputs inside
                        // the files that rendered.
                        let render = RenderSummary {
                            rendered: stats.rendered + stats.snippets_rendered,
                            reused: stats.reused + stats.snippets_reused,
                            full_reason: stats.full_reason.map(|r| r.to_string()),
                        };
                        if let Some(snapshots) = inputs {
                            ctx.publisher().reply(
                                &request,
                                TemplateInputs {
                                    hash: config.hash(),
                                    snapshots,
                                },
                            );
                        }
                        ctx.publisher().reply(
                            &request,
                            TemplateRendered {
                                config,
                                duration,
                                render,
                            },
                        );
                    }
                    Ok((Err(errors), _, duration)) => {
                        for error in &errors {
                            tracing::warn!(%error, "Template render failed");
                        }
                        let first = errors.first().map(ToString::to_string).unwrap_or_default();
                        ctx.health()
                            .unhealthy(format!("last render failed: {first}"));
                        tracing::debug!(?duration, "Render failed");
                        ctx.publisher()
                            .reply(&request, TemplateRenderFailed { errors });
                    }
                    Err(join) => {
                        let message = format!("the renderer crashed: {join}");
                        tracing::error!(%message, "Template render failed");
                        ctx.health().unhealthy(message.clone());
                        ctx.publisher().reply(
                            &request,
                            TemplateRenderFailed {
                                errors: vec![hapwright_eventbus::model::Diagnostic::error(message)],
                            },
                        );
                    }
                }
            }
            .instrument(span)
            .await;
        }
    }
}

/// Applies a resource update, or returns a render request.
fn take(
    event: &Arc<Event>,
    resources: &mut Resources,
    guard: Option<&mut Guard>,
) -> Option<Arc<Event>> {
    match &event.payload {
        EventPayload::ResourceIndexUpdated(update) => {
            resources.update(
                &update.source,
                update.snapshot.clone(),
                Some(&update.change),
            );
            if let Some(guard) = guard {
                guard
                    .current
                    .insert(update.source.clone(), update.snapshot.clone());
            }
            None
        }
        EventPayload::ReconciliationStarted(_) => Some(event.clone()),
        _ => None,
    }
}

// === impl Guard ===

/// The quarantine state of the renderer component.
struct Guard {
    settings: QuarantineSettings,
    quarantine: Quarantine,
    /// The latest snapshot of every source.
    current: Snapshots,
    /// The snapshots of the last render that validated.
    last_good: Snapshots,
    /// `last_good` has validated (false until the first successful validation: the
    /// empty state is then probed too).
    validated: bool,
    pending: Option<Pending>,
    /// Publish `TemplateInputs` with the render of the accepted changes too.
    template_inputs: bool,
    /// The quarantine read back at start is still to be restored (at the first
    /// render, when every source has its objects).
    restore_pending: bool,
}

/// The render in flight, awaiting its validation outcome.
struct Pending {
    correlation: Option<CorrelationId>,
    /// The snapshots when the render started.
    at_start: Snapshots,
    /// The snapshots actually rendered (quarantined changes held back).
    candidate: Snapshots,
    /// The culprit search already ran for this reconciliation.
    searched: bool,
}

impl Guard {
    fn new(settings: QuarantineSettings) -> Self {
        Self {
            quarantine: Quarantine::new(),
            current: Snapshots::new(),
            last_good: settings.last_good.get(),
            // Objects that validated under other templates are the best baseline,
            // but it must be rendered and validated again.
            validated: false,
            pending: None,
            template_inputs: false,
            restore_pending: true,
            settings,
        }
    }

    /// Before the first render: restores the quarantine read back from the record
    /// of an earlier run. The last accepted versions of its objects go into the last
    /// good snapshots, so an object still at the version it was quarantined with is
    /// held back at its last accepted version (left out when it was new) with no new
    /// search; an object changed or deleted since is released and goes through
    /// validation as usual. A record written under another controller config is
    /// checked first: when the current objects render and validate as they are, the
    /// whole quarantine is released. Announces the result with a `QuarantineSearched` (for
    /// `/debug/quarantine`, the status page, metrics and Kubernetes Events) in the
    /// correlation of the first reconciliation.
    async fn restore(
        &mut self,
        request: &Arc<Event>,
        renderer: &Renderer,
        resources: &Resources,
        ctx: &Context,
    ) {
        if !std::mem::take(&mut self.restore_pending) {
            return;
        }
        let restored = self.settings.kept.take_restored();
        if let Some(baseline) = &restored.baseline {
            // Killed during a search: the objects it searched against are the
            // baseline again.
            for recorded in &baseline.resources {
                let Some(now) = self.current.get(recorded.resource.as_str()) else {
                    continue;
                };
                let mut snapshot = ResourceSnapshot::new(now.index_by().to_vec());
                for object in &recorded.objects {
                    snapshot.upsert(
                        ObjectKey::new(&object.namespace, &object.name),
                        &object.object,
                    );
                }
                self.last_good
                    .insert(Arc::from(recorded.resource.as_str()), Arc::new(snapshot));
            }
            self.settings.last_good.set(self.last_good.clone());
        }
        let entries = restored.entries;
        if entries.is_empty() {
            return;
        }
        let mut seeded: Snapshots = Snapshots::new();
        for entry in &entries {
            let culprit = &entry.culprit;
            let Some(now) = self.current.get(&culprit.resource) else {
                continue; // Not watched any more: the entry is released below.
            };
            let snapshot = seeded.entry(culprit.resource.clone()).or_insert_with(|| {
                Arc::new(match self.last_good.get(&culprit.resource) {
                    Some(before) => (**before).clone(),
                    None => ResourceSnapshot::new(now.index_by().to_vec()),
                })
            });
            let snapshot = Arc::make_mut(snapshot);
            match &culprit.last_accepted {
                Some(version) => {
                    snapshot.upsert(culprit.key.clone(), &version.parse());
                }
                None => {
                    snapshot.remove(&culprit.key);
                }
            }
        }
        self.last_good.extend(seeded);
        self.settings.last_good.set(self.last_good.clone());
        // Under another controller config the objects may be accepted now: the
        // current objects are checked once as they are, and the quarantine is
        // released when they pass (held back whole otherwise).
        let mut accepted = false;
        if !restored.hold {
            tracing::warn!(
                objects = entries.len(),
                "The controller config changed since the quarantine was recorded: checking the current objects with it"
            );
            match quarantine::render_and_validate(
                renderer,
                resources.clone(),
                &self.settings.validate,
            )
            .await
            {
                Ok(_) => accepted = true,
                Err(failure) => tracing::info!(
                    error = failure
                        .errors
                        .first()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                    "The current objects still fail: the recorded quarantine stays"
                ),
            }
        }
        self.quarantine = Quarantine::from_entries(entries);
        let now = SystemTime::now();
        let full = if accepted {
            ChangeSet::default()
        } else {
            ChangeSet::between(&self.last_good, &self.current)
        };
        let settled = self.quarantine.settle(&full, &[], now);
        for entry in self.quarantine.entries() {
            let culprit = &entry.culprit;
            tracing::warn!(
                resource = %culprit.resource,
                namespace = %culprit.key.namespace,
                name = %culprit.key.name,
                change = culprit.change,
                error = culprit.errors.first().map(ToString::to_string).unwrap_or_default(),
                "Object still quarantined after the restart: its last accepted version is served"
            );
        }
        log_released(&settled.released);
        if !settled.released.is_empty() || !restored.hold {
            // A record of another config is written again with this one.
            self.record().await;
        }
        report_health(ctx, Some(self));
        ctx.publisher().reply(
            request,
            QuarantineSearched {
                objects: self.objects(),
                released: objects(&settled.released, now),
                accepted: 0,
                probes: 0,
                gave_up: None,
            },
        );
    }

    /// Writes the last good objects a search is about to run against, or removes
    /// them once its outcome is recorded (on the blocking pool: it fsyncs).
    async fn baseline(&self, keep: bool) {
        let kept = self.settings.kept.clone();
        let snapshots = self.last_good.clone();
        let job = move || {
            if keep {
                kept.save_baseline(&snapshots);
            } else {
                kept.forget_baseline();
            }
        };
        if let Err(error) = tokio::task::spawn_blocking(job).await {
            tracing::error!(%error, "Quarantine: writing the last good objects crashed");
        }
    }

    /// Writes the record of the quarantine (on the blocking pool: it fsyncs).
    async fn record(&self) {
        let kept = self.settings.kept.clone();
        let quarantine = self.quarantine.clone();
        if let Err(error) = tokio::task::spawn_blocking(move || kept.save(&quarantine)).await {
            tracing::error!(%error, "Quarantine: writing the record crashed");
        }
    }

    /// Starts a render: the resources to render, with quarantined changes held
    /// back.
    fn start(&mut self, request: &Arc<Event>, resources: &Resources) -> Resources {
        let at_start = self.current.clone();
        let (candidate, job) = if self.quarantine.is_empty() {
            (at_start.clone(), resources.clone())
        } else {
            let mut set = ChangeSet::between(&self.last_good, &at_start);
            let held = self.quarantine.hold_back(&mut set);
            let all: Vec<usize> = (0..set.len()).collect();
            let candidate = set.applied(&all);
            let mut job = resources.clone();
            for (source, snapshot) in &candidate {
                job.update(source, snapshot.clone(), None);
            }
            tracing::debug!(held, "Holding quarantined objects back");
            (candidate, job)
        };
        self.pending = Some(Pending {
            correlation: request.correlation_id,
            at_start,
            candidate,
            searched: false,
        });
        job
    }

    /// Follows the outcome of the pending render: a validated render becomes the
    /// last good state; a failed one starts the culprit search.
    async fn outcome(
        &mut self,
        event: &Arc<Event>,
        renderer: &Renderer,
        resources: &Resources,
        ctx: &Context,
    ) {
        let Some(pending) = &mut self.pending else {
            return;
        };
        if event.correlation_id != pending.correlation || pending.correlation.is_none() {
            return;
        }
        match &event.payload {
            EventPayload::ValidationCompleted(_) => {
                let Some(pending) = self.pending.take() else {
                    return;
                };
                if !self.quarantine.is_empty() {
                    let full = ChangeSet::between(&self.last_good, &pending.at_start);
                    let settled = self.quarantine.settle(&full, &[], SystemTime::now());
                    if !settled.released.is_empty() {
                        log_released(&settled.released);
                        self.record().await;
                        report_health(ctx, Some(self));
                        ctx.publisher().reply(
                            event,
                            QuarantineSearched {
                                objects: self.objects(),
                                released: objects(&settled.released, SystemTime::now()),
                                accepted: 0,
                                probes: 0,
                                gave_up: None,
                            },
                        );
                    }
                }
                if self.settings.kept.may_hold_baseline() {
                    // A new last good state: the objects an earlier search ran
                    // against are not needed any more.
                    self.baseline(false).await;
                }
                self.settings.last_good.set(pending.candidate.clone());
                self.last_good = pending.candidate;
                self.validated = true;
                report_health(ctx, Some(self));
            }
            EventPayload::TemplateRenderFailed(_) | EventPayload::ValidationFailed(_)
                if !pending.searched =>
            {
                pending.searched = true;
                let mut set = ChangeSet::between(&self.last_good, &pending.at_start);
                let full = set.clone();
                self.quarantine.hold_back(&mut set);
                let settings = quarantine::Settings {
                    max_probes: self.settings.max_validations,
                    baseline_valid: self.validated,
                };
                let errors: &[hapwright_eventbus::model::Diagnostic] = match &event.payload {
                    EventPayload::TemplateRenderFailed(failed) => &failed.errors,
                    EventPayload::ValidationFailed(failed) => &failed.errors,
                    _ => &[],
                };
                if self.validated && !self.last_good.is_empty() {
                    // Until the outcome is recorded, a restart searches again
                    // against the same objects.
                    self.baseline(true).await;
                }
                let started = std::time::Instant::now();
                let result = quarantine::isolate(
                    renderer,
                    resources,
                    &set,
                    &self.settings.validate,
                    settings,
                    errors,
                )
                .await;
                match result {
                    Ok(isolated) => {
                        let now = SystemTime::now();
                        let settled = self.quarantine.settle(&full, &isolated.culprits, now);
                        log_quarantined(&settled.quarantined);
                        log_released(&settled.released);
                        if settled != quarantine::Settled::default() {
                            // On disk before the config that holds the culprits back
                            // goes out.
                            self.record().await;
                        }
                        self.baseline(false).await;
                        let config = match isolated.config {
                            Some(config) => Some(config),
                            None => render_snapshots(renderer, resources, &isolated.snapshots)
                                .await
                                .map(Arc::new),
                        };
                        let inputs = self
                            .template_inputs
                            .then(|| Arc::new(isolated.snapshots.clone()));
                        if let Some(pending) = &mut self.pending {
                            pending.candidate = isolated.snapshots;
                        }
                        if config.is_some() {
                            // The rest of the change rendered: the renderer works,
                            // holding the culprits back.
                            report_health(ctx, Some(self));
                        }
                        tracing::info!(
                            accepted = isolated.accepted,
                            quarantined = self.quarantine.len(),
                            probes = isolated.probes,
                            duration = ?started.elapsed(),
                            "Culprits isolated: the rest of the change goes on"
                        );
                        ctx.publisher().reply(
                            event,
                            QuarantineSearched {
                                objects: self.objects(),
                                released: objects(&settled.released, now),
                                accepted: isolated.accepted,
                                probes: isolated.probes,
                                gave_up: None,
                            },
                        );
                        if let (Some(config), Some(snapshots)) = (&config, inputs) {
                            ctx.publisher().reply(
                                event,
                                TemplateInputs {
                                    hash: config.hash(),
                                    snapshots,
                                },
                            );
                        }
                        match config {
                            Some(config) => ctx.publisher().reply(
                                event,
                                TemplateRendered {
                                    config,
                                    duration: started.elapsed(),
                                    render: RenderSummary {
                                        rendered: 0,
                                        reused: 0,
                                        full_reason: Some(
                                            "the culprit search rendered the accepted changes"
                                                .to_owned(),
                                        ),
                                    },
                                },
                            ),
                            None => ctx.publisher().reply(
                                event,
                                TemplateRenderFailed {
                                    errors: vec![hapwright_eventbus::model::Diagnostic::error(
                                        "the last good objects no longer render",
                                    )],
                                },
                            ),
                        };
                    }
                    Err(gave_up) => {
                        // What the last good objects (`baseline_fails`) or the tool
                        // (`tool_failure`) failed with, and for the former whether the
                        // change fails the same way (then the failure does not depend
                        // on the changed objects at all).
                        // The baseline stays on disk: the change is tried again
                        // against it (after a restart too) until a render validates.
                        let probe_error = gave_up.errors.first().map(ToString::to_string);
                        let same_error = (gave_up.reason == quarantine::Rejection::BaselineFails)
                            .then(|| gave_up.same_errors(errors));
                        tracing::info!(
                            reason = gave_up.reason.as_str(),
                            probes = gave_up.probes,
                            probe_error,
                            same_error,
                            "Culprit search gave up: the whole change is rejected"
                        );
                        ctx.publisher().reply(
                            event,
                            QuarantineSearched {
                                objects: self.objects(),
                                released: Vec::new(),
                                accepted: 0,
                                probes: gave_up.probes,
                                gave_up: Some(gave_up.reason.as_str()),
                            },
                        );
                    }
                }
            }
            _ => {}
        }
    }

    /// Every quarantined object, for the event.
    fn objects(&self) -> Vec<QuarantinedObject> {
        self.quarantine
            .entries()
            .map(|entry| object(&entry.culprit, entry.since))
            .collect()
    }
}

/// Quarantined objects named in the health reason; the count covers the rest.
const NAMED_IN_HEALTH: usize = 5;

/// Reports the renderer `Healthy` after a successful render, or `Degraded` while
/// objects are quarantined (naming them): it renders, but holds their changes back.
fn report_health(ctx: &Context, guard: Option<&Guard>) {
    let Some(guard) = guard.filter(|g| !g.quarantine.is_empty()) else {
        ctx.health().healthy();
        return;
    };
    let count = guard.quarantine.len();
    let mut names: Vec<String> = guard
        .quarantine
        .entries()
        .take(NAMED_IN_HEALTH)
        .map(|entry| {
            let key = &entry.culprit.key;
            if key.namespace.is_empty() {
                format!("{} {}", entry.culprit.resource, key.name)
            } else {
                format!("{} {}/{}", entry.culprit.resource, key.namespace, key.name)
            }
        })
        .collect();
    if count > NAMED_IN_HEALTH {
        names.push(format!("and {} more", count - NAMED_IN_HEALTH));
    }
    ctx.health().degraded(format!(
        "{count} object{} quarantined, {} changes held back until {} again: {} (see /debug/quarantine)",
        if count == 1 { "" } else { "s" },
        if count == 1 { "its" } else { "their" },
        if count == 1 { "it changes" } else { "they change" },
        names.join(", ")
    ));
}

/// Renders a set of snapshots (the last good state) on the blocking pool.
async fn render_snapshots(
    renderer: &Renderer,
    resources: &Resources,
    snapshots: &Snapshots,
) -> Option<RenderedConfig> {
    let mut job = resources.clone();
    for (source, snapshot) in snapshots {
        job.update(source, snapshot.clone(), None);
    }
    let renderer = renderer.clone();
    tokio::task::spawn_blocking(move || renderer.render(&job).ok())
        .await
        .ok()
        .flatten()
}

fn object(culprit: &Culprit, since: SystemTime) -> QuarantinedObject {
    let kind = culprit.content.as_ref().and_then(|content| {
        content
            .deserialize::<serde_json::Value>()
            .ok()?
            .get("kind")?
            .as_str()
            .map(str::to_owned)
    });
    QuarantinedObject {
        resource: culprit.resource.clone(),
        kind,
        namespace: culprit.key.namespace.clone(),
        name: culprit.key.name.clone(),
        change: culprit.change,
        errors: culprit.errors.clone(),
        since,
    }
}

fn objects(culprits: &[Culprit], since: SystemTime) -> Vec<QuarantinedObject> {
    culprits.iter().map(|c| object(c, since)).collect()
}

fn log_quarantined(culprits: &[Culprit]) {
    for culprit in culprits {
        let error = culprit
            .errors
            .first()
            .map(ToString::to_string)
            .unwrap_or_default();
        tracing::warn!(
            resource = %culprit.resource,
            namespace = %culprit.key.namespace,
            name = %culprit.key.name,
            change = culprit.change,
            %error,
            "Object quarantined: its change is held back"
        );
    }
}

fn log_released(culprits: &[Culprit]) {
    for culprit in culprits {
        tracing::info!(
            resource = %culprit.resource,
            namespace = %culprit.key.namespace,
            name = %culprit.key.name,
            "Object released from quarantine"
        );
    }
}
