//! The renderer as a bus component.

use std::sync::Arc;

use hapwright_eventbus::model::{RenderSummary, RenderedConfig};
use hapwright_eventbus::{
    Component, ComponentError, Context, Event, EventKind, EventPayload, Interest,
    TemplateRenderFailed, TemplateRendered,
};
use tracing::Instrument;

use super::{Renderer, Resources};

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
pub struct RendererComponent {
    renderer: Renderer,
}

impl std::fmt::Debug for RendererComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RendererComponent")
            .field("renderer", &self.renderer)
            .finish()
    }
}

impl RendererComponent {
    /// The component name.
    pub const NAME: &'static str = "renderer";

    /// A renderer component over compiled templates.
    pub fn new(renderer: Renderer) -> Self {
        Self { renderer }
    }
}

#[async_trait::async_trait]
impl Component for RendererComponent {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([
            EventKind::ResourceIndexUpdated,
            EventKind::ReconciliationStarted,
        ])
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        let RendererComponent { renderer } = *self;
        let mut resources = Resources::new();
        let mut last: Option<Arc<RenderedConfig>> = None;
        loop {
            let Some(event) = ctx.next_event().await else {
                return Ok(());
            };
            let mut request = take(&event, &mut resources);
            while let Some(event) = ctx.try_next_event() {
                if let Some(older) =
                    take(&event, &mut resources).and_then(|newer| request.replace(newer))
                {
                    tracing::debug!(
                        correlation_id = ?older.correlation_id,
                        "Skipping render of a superseded reconciliation"
                    );
                }
            }
            let Some(request) = request else {
                continue;
            };
            let span = tracing::info_span!(
                "render",
                correlation_id = %request
                    .correlation_id
                    .map(|id| id.to_string())
                    .unwrap_or_default()
            );
            let job_renderer = renderer.clone();
            let job_resources = resources.clone();
            let job = tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                let (result, stats) = job_renderer.render_with_stats(&job_resources);
                (result, stats, started.elapsed())
            });
            let outcome = tokio::select! {
                biased;
                () = ctx.cancelled() => return Ok(()),
                outcome = job => outcome,
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
                            full_because = stats.full_reason.map(|r| r.to_string()),
                            "Rendered configuration"
                        );
                        last = Some(config.clone());
                        ctx.health().healthy();
                        // Fragments: whole files and the snippet outputs inside
                        // the files that rendered.
                        let render = RenderSummary {
                            rendered: stats.rendered + stats.snippets_rendered,
                            reused: stats.reused + stats.snippets_reused,
                            full_reason: stats.full_reason.map(|r| r.to_string()),
                        };
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
fn take(event: &Arc<Event>, resources: &mut Resources) -> Option<Arc<Event>> {
    match &event.payload {
        EventPayload::ResourceIndexUpdated(update) => {
            resources.update(
                &update.source,
                update.snapshot.clone(),
                Some(&update.change),
            );
            None
        }
        EventPayload::ReconciliationStarted(_) => Some(event.clone()),
        _ => None,
    }
}
