//! A bus and kernel around the components under test, with a test subscription that
//! sees what they publish. Every wait is bounded.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::model::{
    Diagnostic, ObjectKey, RenderedConfig, ResourceChange, ResourceSnapshot,
};
use hapwright_eventbus::testing::{self, TestBus};
use hapwright_eventbus::{
    Component, ComponentError, Context, Event, EventKind, EventMeta, EventPayload, Interest,
    Publisher, ResourceIndexUpdated, ResourceSyncComplete, RunningKernel, Subscription,
    ValidationCompleted, ValidationFailed, ValidationPhase,
};

/// How long one read waits (of paused time in most tests).
const WAIT: Duration = Duration::from_secs(60);

/// Components running on a bus, plus a subscription for assertions.
pub struct Harness {
    pub publisher: Publisher,
    pub events: Subscription,
    pub kernel: RunningKernel,
}

impl Harness {
    /// Starts `components`; the test subscription receives `kinds`.
    pub fn start(components: Vec<Box<dyn Component>>, kinds: &[EventKind]) -> Self {
        let bus = TestBus::new();
        let events = bus.subscribe("test", kinds);
        let publisher = bus.publisher();
        let kernel = bus.start(|kernel| {
            for component in components {
                kernel.register_boxed(component);
            }
        });
        Self {
            publisher,
            events,
            kernel,
        }
    }

    /// The next event, or `None` if nothing arrives within `wait`.
    pub async fn next_within(&mut self, wait: Duration) -> Option<Arc<Event>> {
        testing::next_within(&mut self.events, wait).await
    }

    /// The next event; panics if nothing arrives within a minute (of paused time).
    pub async fn next(&mut self) -> Arc<Event> {
        testing::next(&mut self.events, WAIT).await
    }

    /// Skips events until one of `kind` arrives (bounded).
    pub async fn next_of(&mut self, kind: EventKind) -> Arc<Event> {
        testing::next_of(&mut self.events, kind, WAIT).await
    }

    pub fn update(&self, source: &str, snapshot: Arc<ResourceSnapshot>) {
        self.publisher.publish(ResourceIndexUpdated {
            source: source.into(),
            snapshot,
            change: Arc::new(ResourceChange::default()),
        });
    }

    pub fn synced(&self, source: &str) {
        self.publisher.publish(ResourceSyncComplete {
            source: source.into(),
        });
    }

    pub fn publish_with(&self, payload: impl Into<EventPayload>, meta: EventMeta) {
        self.publisher.publish_with(payload, meta);
    }
}

/// A one-object snapshot.
pub fn snapshot(name: &str) -> Arc<ResourceSnapshot> {
    let mut snap = ResourceSnapshot::new(Vec::new());
    snap.upsert(
        ObjectKey::new("default", name),
        &serde_json::json!({"metadata": {"namespace": "default", "name": name}}),
    );
    Arc::new(snap)
}

/// Validates automatically: rejects configs containing `INVALID`.
pub struct AutoValidator;

/// The error for a config the validator rejects.
pub fn check(config: &RenderedConfig) -> Option<Diagnostic> {
    config
        .main()
        .contains("INVALID")
        .then(|| Diagnostic::error("unknown keyword 'INVALID'"))
}

#[async_trait::async_trait]
impl Component for AutoValidator {
    fn name(&self) -> &str {
        "validator"
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([EventKind::TemplateRendered])
    }

    async fn run(self: Box<Self>, ctx: Context) -> Result<(), ComponentError> {
        validate_with(ctx, check).await
    }
}

/// A validator's run loop: answers every `TemplateRendered` with
/// `config` validated (phase 2 run; the model left empty: the executor does not
/// read it).
pub fn validated(config: &Arc<RenderedConfig>) -> ValidationCompleted {
    ValidationCompleted {
        model: Default::default(),
        config: config.clone(),
        duration: Duration::ZERO,
        warnings: Vec::new(),
        phase2_skipped: None,
    }
}

/// `ValidationFailed` when `check` finds an error, `ValidationCompleted` otherwise.
pub async fn validate_with(
    mut ctx: Context,
    check: impl Fn(&RenderedConfig) -> Option<Diagnostic>,
) -> Result<(), ComponentError> {
    while let Some(event) = ctx.next_event().await {
        let EventPayload::TemplateRendered(rendered) = &event.payload else {
            continue;
        };
        match check(&rendered.config) {
            Some(error) => ctx.publisher().reply(
                &event,
                ValidationFailed {
                    hash: rendered.config.hash(),
                    phase: ValidationPhase::Haproxy,
                    errors: vec![error],
                },
            ),
            None => ctx.publisher().reply(&event, validated(&rendered.config)),
        };
    }
    Ok(())
}
