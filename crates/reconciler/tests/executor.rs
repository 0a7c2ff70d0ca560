//! The executor: one reconciliation at a time, latest wins, stale results ignored,
//! correlation ids and per-stage durations — with fake renderer and validator
//! components the tests drive by hand, and end to end with the real renderer.

mod support;

use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::model::{Diagnostic, RenderedConfig};
use hapwright_eventbus::{
    Component, ComponentError, Context, CorrelationId, Event, EventKind, EventPayload, Interest,
    ReconciliationTriggered, Stage, TemplateRenderFailed, TemplateRendered, ValidationFailed,
    ValidationPhase,
};
use hapwright_reconciler::executor::{Executor, Retry, Settings};
use hapwright_reconciler::renderer::{Renderer, RendererComponent, Templates};
use support::{AutoValidator, Harness, snapshot};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

/// Forwards every event of one kind to the test, which answers in its place.
struct Fake {
    name: &'static str,
    kind: EventKind,
    tx: mpsc::UnboundedSender<Arc<Event>>,
}

#[async_trait::async_trait]
impl Component for Fake {
    fn name(&self) -> &str {
        self.name
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([self.kind])
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        while let Some(event) = ctx.next_event().await {
            let _ = self.tx.send(event);
        }
        Ok(())
    }
}

const OBSERVED: [EventKind; 5] = [
    EventKind::ReconciliationStarted,
    EventKind::ReconciliationCompleted,
    EventKind::ReconciliationFailed,
    EventKind::TemplateRendered,
    EventKind::TemplateRenderFailed,
];

struct Pipeline {
    h: Harness,
    renders: mpsc::UnboundedReceiver<Arc<Event>>,
    validations: mpsc::UnboundedReceiver<Arc<Event>>,
}

fn pipeline(settings: Settings) -> Pipeline {
    let (render_tx, renders) = mpsc::unbounded_channel();
    let (validate_tx, validations) = mpsc::unbounded_channel();
    let h = Harness::start(
        vec![
            Box::new(Executor::new(settings)),
            Box::new(Fake {
                name: "fake-renderer",
                kind: EventKind::ReconciliationStarted,
                tx: render_tx,
            }),
            Box::new(Fake {
                name: "fake-validator",
                kind: EventKind::TemplateRendered,
                tx: validate_tx,
            }),
        ],
        &OBSERVED,
    );
    Pipeline {
        h,
        renders,
        validations,
    }
}

async fn recv(rx: &mut mpsc::UnboundedReceiver<Arc<Event>>) -> Arc<Event> {
    timeout(Duration::from_secs(60), rx.recv())
        .await
        .expect("a request within 60 s")
        .expect("channel open")
}

fn config(main: &str) -> Arc<RenderedConfig> {
    Arc::new(RenderedConfig::main_only(main))
}

fn trigger(reason: &str) -> ReconciliationTriggered {
    ReconciliationTriggered {
        reason: reason.into(),
        sources: vec!["services".into()],
        waited: std::time::Duration::ZERO,
        follow_up: false,
    }
}

impl Pipeline {
    /// Asserts that no render is asked for within an hour (of paused time): `why`
    /// says what the test expects to have stopped.
    async fn no_render_for_an_hour(&mut self, why: &str) {
        assert!(
            timeout(Duration::from_secs(3600), self.renders.recv())
                .await
                .is_err(),
            "{why}"
        );
    }

    fn trigger(&self, reason: &str) {
        self.h.publisher.publish(trigger(reason));
    }

    /// Waits for the render request and answers it with `main`.
    async fn render(&mut self, main: &str) -> Arc<Event> {
        let request = recv(&mut self.renders).await;
        self.h.publisher.reply(
            &request,
            TemplateRendered {
                config: config(main),
                duration: Duration::from_millis(1),
                render: Default::default(),
            },
        );
        request
    }

    async fn validate_ok(&mut self) -> Arc<Event> {
        let request = recv(&mut self.validations).await;
        let EventPayload::TemplateRendered(rendered) = &request.payload else {
            unreachable!()
        };
        self.h
            .publisher
            .reply(&request, support::validated(&rendered.config));
        request
    }

    /// The next reconciliation outcome (Completed or Failed).
    async fn outcome(&mut self) -> Arc<Event> {
        loop {
            let event = self.h.next().await;
            if matches!(
                event.kind(),
                EventKind::ReconciliationCompleted | EventKind::ReconciliationFailed
            ) {
                return event;
            }
        }
    }
}

fn stages(event: &Event) -> Vec<(Stage, Duration)> {
    match &event.payload {
        EventPayload::ReconciliationCompleted(done) => done.stages.clone(),
        other => panic!("expected completion, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_reconciliation_is_trigger_render_validate_with_one_correlation_id() {
    let mut p = pipeline(Settings::default());
    let t0 = Instant::now();
    p.trigger("resources changed: services");

    let started = p.h.next_of(EventKind::ReconciliationStarted).await;
    let id = started
        .correlation_id
        .expect("the executor assigns a correlation id");
    let EventPayload::ReconciliationStarted(s) = &started.payload else {
        unreachable!()
    };
    assert_eq!(s.reason, "resources changed: services");
    assert!(!s.follow_up);
    assert!(started.caused_by.is_some(), "caused by the trigger");

    tokio::time::sleep(Duration::from_millis(300)).await;
    let request = p.render("global\n").await;
    assert_eq!(request.correlation_id, Some(id));
    tokio::time::sleep(Duration::from_secs(2)).await;
    p.validate_ok().await;

    let done = p.outcome().await;
    assert_eq!(done.correlation_id, Some(id));
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted);
    assert_eq!(
        stages(&done),
        vec![
            (Stage::Render, Duration::from_millis(300)),
            (Stage::Validate, Duration::from_secs(2)),
        ]
    );
    let EventPayload::ReconciliationCompleted(c) = &done.payload else {
        unreachable!()
    };
    assert_eq!(c.duration, Duration::from_millis(2300));
    assert_eq!(done.at - t0, Duration::from_millis(2300));
}

#[tokio::test(start_paused = true)]
async fn a_newer_trigger_during_validation_supersedes_and_stale_results_are_ignored() {
    let mut p = pipeline(Settings::default());
    p.trigger("first");
    p.render("v1\n").await;
    let stale = recv(&mut p.validations).await;
    let first_id = stale.correlation_id.unwrap();

    // While v1 validates, new data arrives.
    p.trigger("second");
    let second_request = p.render("v2\n").await;
    let second_id = second_request.correlation_id.unwrap();
    assert_ne!(first_id, second_id);

    // The old validation finishes first: ignored.
    let EventPayload::TemplateRendered(old) = &stale.payload else {
        unreachable!()
    };
    p.h.publisher.reply(&stale, support::validated(&old.config));
    p.validate_ok().await;

    let done = p.outcome().await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted);
    assert_eq!(done.correlation_id, Some(second_id));
    assert!(
        p.h.next_within(Duration::from_secs(30)).await.is_none(),
        "no outcome for the superseded reconciliation"
    );
}

#[tokio::test(start_paused = true)]
async fn a_newer_trigger_during_render_restarts_with_the_newest_data() {
    let mut p = pipeline(Settings::default());
    p.trigger("first");
    let first = recv(&mut p.renders).await;
    p.trigger("second");
    let second = recv(&mut p.renders).await;
    assert_ne!(first.correlation_id, second.correlation_id);
    let EventPayload::ReconciliationStarted(s) = &second.payload else {
        unreachable!()
    };
    assert_eq!(s.reason, "second");

    // The renderer answers the old request late; the executor does not validate it.
    p.h.publisher.reply(
        &first,
        TemplateRenderFailed {
            errors: vec![Diagnostic::error("stale")],
        },
    );
    p.h.publisher.reply(
        &second,
        TemplateRendered {
            config: config("new\n"),
            duration: Duration::ZERO,
            render: Default::default(),
        },
    );
    p.validate_ok().await;
    let done = p.outcome().await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted);
    assert_eq!(done.correlation_id, second.correlation_id);
}

#[tokio::test(start_paused = true)]
async fn queued_triggers_start_one_reconciliation_for_the_newest() {
    let mut p = pipeline(Settings::default());
    p.trigger("one");
    p.trigger("two");
    // The newest is the rest of a leading change: the reconciliation says so, for
    // the scheduler.
    p.h.publisher.publish(ReconciliationTriggered {
        follow_up: true,
        ..trigger("three")
    });
    let request = recv(&mut p.renders).await;
    let EventPayload::ReconciliationStarted(s) = &request.payload else {
        unreachable!()
    };
    assert_eq!(s.reason, "three");
    assert!(s.follow_up);
    assert!(
        timeout(Duration::from_secs(10), p.renders.recv())
            .await
            .is_err(),
        "only one reconciliation starts"
    );
}

#[tokio::test(start_paused = true)]
async fn render_failure_fails_the_reconciliation_in_the_render_stage() {
    let mut p = pipeline(Settings::default());
    p.trigger("x");
    let request = recv(&mut p.renders).await;
    p.h.publisher.reply(
        &request,
        TemplateRenderFailed {
            errors: vec![Diagnostic::error("fail(): nope")],
        },
    );
    let failed = p.outcome().await;
    assert_eq!(failed.correlation_id, request.correlation_id);
    let EventPayload::ReconciliationFailed(f) = &failed.payload else {
        panic!("expected failure, got {failed:?}")
    };
    assert_eq!(f.stage, Stage::Render);
    assert_eq!(f.errors[0].message, "fail(): nope");
}

#[tokio::test(start_paused = true)]
async fn identical_output_short_circuits_validation() {
    let mut p = pipeline(Settings::default());
    p.trigger("first");
    p.render("same\n").await;
    p.validate_ok().await;
    assert_eq!(p.outcome().await.kind(), EventKind::ReconciliationCompleted);

    // Same bytes again: completed without waiting for the validator.
    p.trigger("second");
    tokio::time::sleep(Duration::from_millis(50)).await;
    p.render("same\n").await;
    let done = p.outcome().await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted);
    assert_eq!(
        stages(&done),
        vec![(Stage::Render, Duration::from_millis(50))]
    );
}

#[tokio::test(start_paused = true)]
async fn identical_output_after_a_validation_failure_fails_again_without_validation() {
    let mut p = pipeline(Settings::default());
    p.trigger("first");
    p.render("bad\n").await;
    let request = recv(&mut p.validations).await;
    p.h.publisher.reply(
        &request,
        ValidationFailed {
            hash: config("bad\n").hash(),
            phase: ValidationPhase::Haproxy,
            errors: vec![Diagnostic::error("unknown keyword 'bad'")],
        },
    );
    assert_eq!(p.outcome().await.kind(), EventKind::ReconciliationFailed);
    // Same bytes again: the same verdict, without asking the validator.
    p.trigger("second");
    p.render("bad\n").await;
    let failed = p.outcome().await;
    let EventPayload::ReconciliationFailed(f) = &failed.payload else {
        panic!("expected failure")
    };
    assert_eq!(f.stage, Stage::Validate);
    assert_eq!(f.errors[0].message, "unknown keyword 'bad'");
}

#[tokio::test(start_paused = true)]
async fn a_stage_that_never_finishes_times_out() {
    let mut p = pipeline(Settings {
        stage_timeout: Duration::from_secs(45),
        ..Settings::default()
    });
    p.trigger("x");
    let request = p.render("cfg\n").await;
    let t_render = Instant::now();
    let _ignored = recv(&mut p.validations).await;
    let failed = p.outcome().await;
    assert_eq!(failed.at - t_render, Duration::from_secs(45));
    assert_eq!(failed.correlation_id, request.correlation_id);
    let EventPayload::ReconciliationFailed(f) = &failed.payload else {
        panic!("expected failure")
    };
    assert_eq!(f.stage, Stage::Validate);
    assert_eq!(f.errors[0].message, "validation did not finish within 45s");
    // The executor is free again.
    p.trigger("y");
    let next = recv(&mut p.renders).await;
    assert_ne!(next.correlation_id, request.correlation_id);
}

#[tokio::test(start_paused = true)]
async fn end_to_end_with_the_real_renderer() {
    let renderer = Renderer::new(
        Templates::new(
            "{% for s in resources.services.list() %}backend {{ s.metadata.name }}\n{% endfor %}",
        ),
        &["services"],
    )
    .expect("templates load");
    let mut h = Harness::start(
        vec![
            Box::new(Executor::new(Settings::default())),
            Box::new(RendererComponent::new(renderer)),
            Box::new(AutoValidator),
        ],
        &OBSERVED,
    );
    h.update("services", snapshot("web"));
    h.publisher.publish(trigger("go"));
    let rendered = h.next_of(EventKind::TemplateRendered).await;
    let EventPayload::TemplateRendered(r) = &rendered.payload else {
        unreachable!()
    };
    assert_eq!(r.config.main().as_ref(), "backend web\n");
    let done = h.next_of(EventKind::ReconciliationCompleted).await;
    assert_eq!(done.correlation_id, rendered.correlation_id);
    let first_hash = r.config.hash();

    // New data: rendered with it; the renderer's health stays healthy.
    h.update("services", snapshot("api"));
    h.publisher.publish(trigger("again"));
    let rendered = h.next_of(EventKind::TemplateRendered).await;
    let EventPayload::TemplateRendered(r) = &rendered.payload else {
        unreachable!()
    };
    assert_eq!(r.config.main().as_ref(), "backend api\n");
    assert_ne!(r.config.hash(), first_hash);
    h.next_of(EventKind::ReconciliationCompleted).await;

    // Unchanged data: the same Arc comes back and the reconciliation completes.
    h.publisher.publish(trigger("unchanged"));
    let again = h.next_of(EventKind::TemplateRendered).await;
    let EventPayload::TemplateRendered(a) = &again.payload else {
        unreachable!()
    };
    assert!(Arc::ptr_eq(&a.config, &r.config));
    h.next_of(EventKind::ReconciliationCompleted).await;
}

#[tokio::test(start_paused = true)]
async fn end_to_end_render_errors_fail_the_reconciliation_and_mark_the_renderer_unhealthy() {
    let renderer =
        Renderer::new(Templates::new("x\n{{ fail('no') }}"), &[] as &[&str]).expect("loads");
    let mut h = Harness::start(
        vec![
            Box::new(Executor::new(Settings::default())),
            Box::new(RendererComponent::new(renderer)),
            Box::new(AutoValidator),
        ],
        &OBSERVED,
    );
    h.publisher.publish(trigger("go"));
    let failed = h.next_of(EventKind::ReconciliationFailed).await;
    let EventPayload::ReconciliationFailed(f) = &failed.payload else {
        unreachable!()
    };
    assert_eq!(f.stage, Stage::Render);
    assert_eq!(f.errors[0].to_string(), "haproxy.cfg:2:4: fail(): no");
    let health = h.kernel.health().get("renderer").unwrap();
    assert_eq!(health.state, hapwright_eventbus::HealthState::Unhealthy);
}

#[tokio::test(start_paused = true)]
async fn the_renderer_renders_only_the_newest_of_queued_starts() {
    let renderer = Renderer::new(
        Templates::new(
            "{{ resources.services.list() | map(attribute='metadata.name') | join(',') }}",
        ),
        &["services"],
    )
    .expect("loads");
    let mut h = Harness::start(vec![Box::new(RendererComponent::new(renderer))], &OBSERVED);
    let ids: Vec<CorrelationId> = (0..3).map(|_| CorrelationId::new()).collect();
    h.update("services", snapshot("old"));
    for id in &ids {
        h.publish_with(
            hapwright_eventbus::ReconciliationStarted {
                reason: "r".into(),
                follow_up: false,
            },
            hapwright_eventbus::EventMeta::correlated(*id),
        );
    }
    h.update("services", snapshot("new"));
    let rendered = h.next_of(EventKind::TemplateRendered).await;
    assert_eq!(rendered.correlation_id, Some(ids[2]));
    let EventPayload::TemplateRendered(r) = &rendered.payload else {
        unreachable!()
    };
    assert_eq!(
        r.config.main().as_ref(),
        "new\n",
        "rendered with the newest data"
    );
    assert!(h.next_within(Duration::from_secs(10)).await.is_none());
}

// === quarantine ===

fn searched(gave_up: Option<&'static str>) -> hapwright_eventbus::QuarantineSearched {
    hapwright_eventbus::QuarantineSearched {
        objects: Vec::new(),
        released: Vec::new(),
        accepted: 3,
        probes: 4,
        gave_up,
    }
}

impl Pipeline {
    /// Waits for the validation request and rejects it.
    async fn validate_fail(&mut self, message: &str) -> Arc<Event> {
        let request = recv(&mut self.validations).await;
        let EventPayload::TemplateRendered(rendered) = &request.payload else {
            unreachable!()
        };
        self.h.publisher.reply(
            &request,
            ValidationFailed {
                hash: rendered.config.hash(),
                phase: ValidationPhase::Haproxy,
                errors: vec![Diagnostic::error(message)],
            },
        );
        request
    }
}

fn quarantine_pipeline() -> Pipeline {
    pipeline(Settings {
        quarantine: true,
        ..Settings::default()
    })
}

#[tokio::test(start_paused = true)]
async fn with_quarantine_a_failure_waits_for_the_search_and_the_rest_completes() {
    let mut p = quarantine_pipeline();
    p.trigger("x");
    let request = p.render("all\n").await;
    p.validate_fail("bad object").await;
    // No outcome yet: the search runs.
    while let Some(event) = p.h.next_within(Duration::from_secs(1)).await {
        assert!(
            !matches!(
                event.kind(),
                EventKind::ReconciliationCompleted | EventKind::ReconciliationFailed
            ),
            "the executor waits for the search: {event:?}"
        );
    }
    p.h.publisher.reply(&request, searched(None));
    p.h.publisher.reply(
        &request,
        TemplateRendered {
            config: config("the rest\n"),
            duration: Duration::from_millis(1),
            render: Default::default(),
        },
    );
    p.validate_ok().await;
    let outcome = p.outcome().await;
    assert_eq!(outcome.kind(), EventKind::ReconciliationCompleted);
    assert_eq!(outcome.correlation_id, request.correlation_id);
}

#[tokio::test(start_paused = true)]
async fn with_quarantine_a_search_that_gives_up_fails_with_the_original_errors() {
    let mut p = quarantine_pipeline();
    p.trigger("x");
    let request = p.render("all\n").await;
    p.validate_fail("template bug").await;
    p.h.publisher
        .reply(&request, searched(Some("baseline_fails")));
    let outcome = p.outcome().await;
    let EventPayload::ReconciliationFailed(failed) = &outcome.payload else {
        panic!("fails: {outcome:?}");
    };
    assert_eq!(failed.stage, Stage::Validate);
    assert_eq!(failed.errors[0].message, "template bug");
}

#[tokio::test(start_paused = true)]
async fn with_quarantine_a_second_failure_fails_at_once() {
    let mut p = quarantine_pipeline();
    p.trigger("x");
    let request = p.render("all\n").await;
    p.validate_fail("first").await;
    p.h.publisher.reply(&request, searched(None));
    p.h.publisher.reply(
        &request,
        TemplateRendered {
            config: config("the rest\n"),
            duration: Duration::from_millis(1),
            render: Default::default(),
        },
    );
    p.validate_fail("second").await;
    let outcome = p.outcome().await;
    let EventPayload::ReconciliationFailed(failed) = &outcome.payload else {
        panic!("fails: {outcome:?}");
    };
    assert_eq!(failed.errors[0].message, "second");
}

// === retries of a rejected change ===

fn retrying_pipeline(attempts: usize) -> Pipeline {
    pipeline(Settings {
        quarantine: true,
        retry: Retry {
            first: Duration::from_secs(5),
            max: Duration::from_secs(12),
            attempts,
        },
        ..Settings::default()
    })
}

impl Pipeline {
    /// Renders `main`, fails its validation, and answers the search with
    /// `gave_up`; returns the failed outcome.
    async fn reject(&mut self, gave_up: &'static str) -> Arc<Event> {
        let request = self.render("all\n").await;
        self.validate_fail("haproxy -c timed out").await;
        self.h.publisher.reply(&request, searched(Some(gave_up)));
        let outcome = self.outcome().await;
        assert_eq!(outcome.kind(), EventKind::ReconciliationFailed);
        outcome
    }

    /// The reason of the next reconciliation started.
    async fn started(&mut self) -> String {
        let started = self.h.next_of(EventKind::ReconciliationStarted).await;
        let EventPayload::ReconciliationStarted(s) = &started.payload else {
            unreachable!()
        };
        s.reason.clone()
    }
}

#[tokio::test(start_paused = true)]
async fn a_change_rejected_for_a_tool_failure_is_retried_with_backoff_until_attempts_run_out() {
    let mut p = retrying_pipeline(3);
    p.trigger("x");
    assert_eq!(p.started().await, "x");
    let mut failed = p.reject("tool_failure").await;
    // 5 s, 10 s, then 12 s (the longest delay), then no more.
    for (attempt, delay) in [(1, 5), (2, 10), (3, 12)] {
        assert_eq!(
            p.started().await,
            format!("retry {attempt} after tool_failure")
        );
        assert_eq!(
            Instant::now() - failed.at,
            Duration::from_secs(delay),
            "retry {attempt}"
        );
        // The same render is validated again, not failed by the short-circuit.
        failed = p.reject("tool_failure").await;
    }
    p.no_render_for_an_hour("no retry after the attempts ran out")
        .await;
    // A new change starts a new series.
    p.trigger("y");
    assert_eq!(p.started().await, "y");
    let failed = p.reject("bound_reached").await;
    assert_eq!(p.started().await, "retry 1 after bound_reached");
    assert_eq!(Instant::now() - failed.at, Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_retry_that_validates_ends_the_retries() {
    let mut p = retrying_pipeline(5);
    p.trigger("x");
    p.reject("baseline_fails").await;
    assert_eq!(p.started().await, "retry 1 after baseline_fails");
    p.render("all\n").await;
    p.validate_ok().await;
    assert_eq!(p.outcome().await.kind(), EventKind::ReconciliationCompleted);
    p.no_render_for_an_hour("no retry after success").await;
}

#[tokio::test(start_paused = true)]
async fn a_template_error_of_the_last_good_objects_is_not_retried() {
    let mut p = retrying_pipeline(5);
    p.trigger("x");
    let request = recv(&mut p.renders).await;
    p.h.publisher.reply(
        &request,
        TemplateRenderFailed {
            errors: vec![Diagnostic::error("undefined value")],
        },
    );
    p.h.publisher
        .reply(&request, searched(Some("baseline_fails")));
    assert_eq!(p.outcome().await.kind(), EventKind::ReconciliationFailed);
    p.no_render_for_an_hour("a render error would fail again")
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_new_change_cancels_the_pending_retry() {
    let mut p = retrying_pipeline(5);
    p.trigger("x");
    p.reject("tool_failure").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    p.trigger("y");
    assert_eq!(p.started().await, "y");
    p.render("new\n").await;
    p.validate_ok().await;
    assert_eq!(p.outcome().await.kind(), EventKind::ReconciliationCompleted);
    p.no_render_for_an_hour("the retry was cancelled").await;
}
