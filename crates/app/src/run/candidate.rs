//! A candidate configuration: a loaded config checked completely (templates
//! compile, the webhook's certificate loads) without touching what runs.

use hapwright_eventbus::model::Diagnostic;
use hapwright_reconciler::renderer::Renderer;

use crate::build;
use crate::config::Loaded;
use crate::webhook;

/// A candidate configuration that passed every check, ready to replace the running one.
pub(super) struct Candidate {
    pub(super) loaded: Loaded,
    pub(super) renderer: Renderer,
}

/// Loads and checks a config completely, without touching what runs.
pub(super) fn prepare(loaded: Loaded) -> Result<Candidate, Vec<Diagnostic>> {
    let mut problems = Vec::new();
    let renderer = match build::renderer(&loaded.config) {
        Ok(renderer) => {
            for warning in loaded.templates_at.locate(renderer.warnings().to_vec()) {
                tracing::warn!(%warning, "Template warning");
            }
            Some(renderer)
        }
        Err(errors) => {
            problems.extend(loaded.templates_at.locate(errors));
            None
        }
    };
    // The webhook's certificate must load: a config that cannot serve it is
    // rejected before it replaces the running one (and before a reload request is
    // answered).
    if let Some(settings) = &loaded.config.controller.webhook
        && let Err(reason) = webhook::tls::acceptor(&settings.cert_file, &settings.key_file)
    {
        problems.push(
            Diagnostic::error(format!("controller.webhook: {reason}")).at(
                hapwright_eventbus::model::SourceLocation::new(
                    loaded.path.display().to_string(),
                    None,
                    None,
                ),
            ),
        );
    }
    match renderer {
        Some(renderer) if problems.is_empty() => Ok(Candidate { loaded, renderer }),
        _ => Err(problems),
    }
}
