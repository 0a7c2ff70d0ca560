//! Quarantine on the bus: the executor, the real renderer with quarantine on and a
//! validator that rejects `INVALID`. A bad object among good changes is held back,
//! the good changes go through in the same reconciliation, and fixing the object
//! releases it.

mod support;

use std::sync::Arc;

use hapwright_eventbus::model::{Diagnostic, ObjectKey, RenderedConfig, ResourceSnapshot};
use hapwright_eventbus::{
    Component, ComponentError, Context, Event, EventKind, EventPayload, HealthState, Interest,
    ReconciliationTriggered, Stage,
};
use hapwright_reconciler::executor::{Executor, Settings};
use hapwright_reconciler::quarantine::{Failure, Kept, QUARANTINE_RECORD_FILE, Validate};
use hapwright_reconciler::renderer::{QuarantineSettings, Renderer, RendererComponent, Templates};
use support::{AutoValidator, Harness, check};

const OBSERVED: [EventKind; 5] = [
    EventKind::ReconciliationCompleted,
    EventKind::ReconciliationFailed,
    EventKind::TemplateRendered,
    EventKind::QuarantineSearched,
    EventKind::ValidationFailed,
];

const TEMPLATE: &str = "\
{% for s in resources.services %}backend {{ s.metadata.name }}
  # {{ s.spec.note }}
{% endfor %}";

fn services(notes: &[(usize, &str)]) -> Arc<ResourceSnapshot> {
    let mut snapshot = ResourceSnapshot::new(Vec::new());
    for (i, note) in notes {
        let name = format!("s{i:02}");
        snapshot.upsert(
            ObjectKey::new("default", name.clone()),
            &serde_json::json!({
                "kind": "Service",
                "metadata": {"namespace": "default", "name": name},
                "spec": {"note": note},
            }),
        );
    }
    Arc::new(snapshot)
}

fn trigger(reason: &str) -> ReconciliationTriggered {
    ReconciliationTriggered {
        reason: reason.into(),
        sources: vec!["services".into()],
        waited: std::time::Duration::ZERO,
        follow_up: false,
    }
}

fn harness(quarantine: bool) -> Harness {
    harness_with(TEMPLATE, quarantine)
}

fn harness_with(template: &str, quarantine: bool) -> Harness {
    harness_full(template, quarantine, false, &OBSERVED)
}

fn harness_full(
    template: &str,
    quarantine: bool,
    template_inputs: bool,
    observed: &[EventKind],
) -> Harness {
    harness_kept(template, quarantine, template_inputs, observed, Kept::new())
}

/// A harness whose quarantine is kept in `kept` (a record on disk).
fn harness_kept(
    template: &str,
    quarantine: bool,
    template_inputs: bool,
    observed: &[EventKind],
    kept: Kept,
) -> Harness {
    let renderer = Renderer::new(Templates::new(template), &["services"]).expect("loads");
    let validate: Validate = Arc::new(|config: Arc<RenderedConfig>| {
        let result = match check(&config) {
            Some(error) => Err(Failure {
                errors: vec![error],
                tool_failure: false,
            }),
            None => Ok(()),
        };
        Box::pin(async move { result })
    });
    let mut component = RendererComponent::new(renderer);
    if template_inputs {
        component = component.with_template_inputs();
    }
    if quarantine {
        component = component.with_quarantine(QuarantineSettings {
            validate,
            max_validations: 16,
            last_good: Default::default(),
            kept,
        });
    }
    Harness::start(
        vec![
            Box::new(Executor::new(Settings {
                quarantine,
                ..Settings::default()
            })),
            Box::new(component),
            Box::new(AutoValidator),
        ],
        observed,
    )
}

fn main_of(event: &Event) -> String {
    let EventPayload::TemplateRendered(rendered) = &event.payload else {
        panic!("not a render: {event:?}");
    };
    rendered.config.main().to_string()
}

/// Waits for the end of the reconciliation, returning the last render seen and the
/// quarantine searches.
async fn settle(h: &mut Harness) -> (Arc<Event>, Option<String>, Vec<Arc<Event>>) {
    let mut last_render = None;
    let mut searches = Vec::new();
    loop {
        let event = h.next().await;
        match event.kind() {
            EventKind::TemplateRendered => last_render = Some(main_of(&event)),
            EventKind::QuarantineSearched => searches.push(event),
            EventKind::ReconciliationCompleted | EventKind::ReconciliationFailed => {
                return (event, last_render, searches);
            }
            _ => {}
        }
    }
}

#[tokio::test(start_paused = true)]
async fn good_changes_go_live_and_the_bad_object_is_held_back_until_fixed() {
    let mut h = harness(true);
    let v1: Vec<(usize, &str)> = (0..51).map(|i| (i, "v1")).collect();
    h.update("services", services(&v1));
    h.publisher.publish(trigger("start"));
    let (done, _, searches) = settle(&mut h).await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted);
    assert!(searches.is_empty());

    // 50 good changes and a bad one in one reconciliation.
    let v2: Vec<(usize, &str)> = (0..51)
        .map(|i| (i, if i == 50 { "INVALID" } else { "v2" }))
        .collect();
    h.update("services", services(&v2));
    h.publisher.publish(trigger("burst"));
    let (done, render, searches) = settle(&mut h).await;
    assert_eq!(
        done.kind(),
        EventKind::ReconciliationCompleted,
        "the good changes complete the reconciliation: {done:?}"
    );
    let render = render.expect("the reduced change was rendered");
    assert_eq!(render.matches("# v2").count(), 50, "{render}");
    assert!(render.contains("backend s50\n  # v1"), "{render}");
    let [search] = &searches[..] else {
        panic!("one search: {searches:?}");
    };
    assert_eq!(search.correlation_id, done.correlation_id);
    let EventPayload::QuarantineSearched(found) = &search.payload else {
        unreachable!()
    };
    assert_eq!(found.gave_up, None);
    assert_eq!(found.accepted, 50);
    assert!(found.probes <= 16);
    assert_eq!(found.objects.len(), 1);
    let object = &found.objects[0];
    assert_eq!(
        (
            object.resource.as_ref(),
            object.kind.as_deref(),
            object.name.as_str()
        ),
        ("services", Some("Service"), "s50")
    );
    assert_eq!(object.errors[0].message, "unknown keyword 'INVALID'");

    // Unchanged: the held-back object needs no new search and nothing fails.
    h.publisher.publish(trigger("again"));
    let (done, _, searches) = settle(&mut h).await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted);
    assert!(searches.is_empty(), "{searches:?}");

    // Fixed: the object goes live and is released.
    let v3: Vec<(usize, &str)> = (0..51)
        .map(|i| (i, if i == 50 { "v3" } else { "v2" }))
        .collect();
    h.update("services", services(&v3));
    h.publisher.publish(trigger("fixed"));
    let (done, render, searches) = settle(&mut h).await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted);
    assert!(render.expect("rendered").contains("backend s50\n  # v3"));
    // The release follows the validation, so it may come after the completion.
    let released = match searches.last() {
        Some(search) => search.clone(),
        None => h.next_of(EventKind::QuarantineSearched).await,
    };
    let EventPayload::QuarantineSearched(released) = &released.payload else {
        unreachable!()
    };
    assert!(released.objects.is_empty());
    assert_eq!(released.released.len(), 1);
}

/// One "process": a harness whose quarantine is kept in `dir`, read back first.
fn process(dir: &std::path::Path) -> Harness {
    let kept = Kept::new();
    kept.keep_in(vec![dir.to_owned()], None);
    harness_kept(TEMPLATE, true, false, &OBSERVED, kept)
}

#[tokio::test(start_paused = true)]
async fn a_restarted_renderer_holds_a_recorded_object_back_at_its_last_accepted_version() {
    let dir = tempfile::tempdir().expect("a config directory");
    let record = dir.path().join(QUARANTINE_RECORD_FILE);
    let mut first = process(dir.path());
    first.update(
        "services",
        services(&[(0, "v1"), (1, "v1"), (2, "v1"), (3, "v1")]),
    );
    first.publisher.publish(trigger("start"));
    settle(&mut first).await;
    assert!(!record.exists(), "nothing quarantined, nothing recorded");
    // s01 and s03 break; s02 changes for the good.
    let broken = [(0, "v1"), (1, "INVALID"), (2, "v2"), (3, "INVALID")];
    first.update("services", services(&broken));
    first.publisher.publish(trigger("bad"));
    let (_, render, searches) = settle(&mut first).await;
    let render = render.expect("rendered");
    assert!(render.contains("backend s01\n  # v1"), "{render}");
    let EventPayload::QuarantineSearched(found) = &searches[0].payload else {
        unreachable!()
    };
    assert_eq!(found.objects.len(), 2);
    let since = found.objects[0].since;
    assert!(record.is_file(), "recorded before the config went out");
    drop(first);

    // A new process (a fresh renderer, nothing validated) reads the record back.
    // s01 is unchanged (still bad), s03 was fixed meanwhile, s02 changed again,
    // s00 is gone.
    let mut second = process(dir.path());
    second.update(
        "services",
        services(&[(1, "INVALID"), (2, "v3"), (3, "v4")]),
    );
    second.publisher.publish(trigger("start"));
    let (done, render, searches) = settle(&mut second).await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted, "{done:?}");
    let render = render.expect("rendered");
    assert_eq!(
        render, "backend s01\n  # v1\nbackend s02\n  # v3\nbackend s03\n  # v4\n",
        "s01 at its last accepted version, the rest as they are now"
    );
    let [restored] = &searches[..] else {
        panic!("one announcement: {searches:?}");
    };
    let EventPayload::QuarantineSearched(restored) = &restored.payload else {
        unreachable!()
    };
    assert_eq!(restored.probes, 0, "no new search");
    let names: Vec<&str> = restored.objects.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["s01"], "still quarantined, with why");
    assert_eq!(restored.objects[0].change, "modified");
    assert_eq!(restored.objects[0].since, since);
    assert_eq!(
        restored.objects[0].errors[0].message,
        "unknown keyword 'INVALID'"
    );
    let released: Vec<&str> = restored.released.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(
        released,
        ["s03"],
        "changed since: released, validated as usual"
    );

    // s01 fixed: it goes live and the record goes.
    second.update("services", services(&[(1, "v5"), (2, "v3"), (3, "v4")]));
    second.publisher.publish(trigger("fixed"));
    let (_, render, _) = settle(&mut second).await;
    assert!(render.expect("rendered").contains("backend s01\n  # v5"));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while record.exists() {
        assert!(tokio::time::Instant::now() < deadline, "the record goes");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn without_quarantine_the_whole_change_is_rejected() {
    let mut h = harness(false);
    h.update("services", services(&[(0, "v1"), (1, "v1")]));
    h.publisher.publish(trigger("start"));
    settle(&mut h).await;
    h.update("services", services(&[(0, "v2"), (1, "INVALID")]));
    h.publisher.publish(trigger("bad"));
    let (done, _, searches) = settle(&mut h).await;
    let EventPayload::ReconciliationFailed(failed) = &done.payload else {
        panic!("fails: {done:?}");
    };
    assert_eq!(failed.stage, Stage::Validate);
    assert!(searches.is_empty());
}

#[tokio::test(start_paused = true)]
async fn one_bad_object_beside_one_good_change_does_not_block_it() {
    let mut h = harness(true);
    h.update("services", services(&[(0, "v1"), (1, "v1")]));
    h.publisher.publish(trigger("start"));
    settle(&mut h).await;
    h.update("services", services(&[(0, "v2"), (1, "INVALID")]));
    h.publisher.publish(trigger("one good, one bad"));
    let (done, render, searches) = settle(&mut h).await;
    assert_eq!(
        done.kind(),
        EventKind::ReconciliationCompleted,
        "the good change completes the reconciliation: {done:?}"
    );
    let render = render.expect("the good change was rendered");
    assert!(render.contains("backend s00\n  # v2"), "{render}");
    assert!(render.contains("backend s01\n  # v1"), "{render}");
    let [search] = &searches[..] else {
        panic!("one search: {searches:?}");
    };
    let EventPayload::QuarantineSearched(search) = &search.payload else {
        unreachable!()
    };
    assert_eq!(search.gave_up, None);
    assert_eq!(search.accepted, 1);
    let names: Vec<&str> = search.objects.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["s01"]);
}

#[tokio::test(start_paused = true)]
async fn when_every_changed_object_fails_each_is_held_back() {
    let mut h = harness(true);
    h.update("services", services(&[(0, "v1"), (1, "v1")]));
    h.publisher.publish(trigger("start"));
    settle(&mut h).await;
    h.update("services", services(&[(0, "INVALID"), (1, "INVALID")]));
    h.publisher.publish(trigger("bad"));
    let (done, _, searches) = settle(&mut h).await;
    // The last good objects still validate, so the failure is the objects': both
    // are held back and the last good config stays.
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted, "{done:?}");
    let [search] = &searches[..] else {
        panic!("one search: {searches:?}");
    };
    let EventPayload::QuarantineSearched(search) = &search.payload else {
        unreachable!()
    };
    assert_eq!(search.gave_up, None);
    assert_eq!(search.accepted, 0);
    let names: Vec<&str> = search.objects.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["s00", "s01"]);
    assert_eq!(
        search.objects[0].errors[0].message,
        "unknown keyword 'INVALID'"
    );
}

#[tokio::test(start_paused = true)]
async fn a_bad_object_at_start_up_does_not_keep_the_others_out() {
    let mut h = harness(true);
    let notes: Vec<(usize, &str)> = (0..99)
        .map(|i| (i, if i == 42 { "INVALID" } else { "v1" }))
        .collect();
    h.update("services", services(&notes));
    h.publisher.publish(trigger("start"));
    let (done, render, _) = settle(&mut h).await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted);
    let render = render.expect("rendered");
    assert_eq!(render.matches("backend ").count(), 98);
    assert!(!render.contains("s42"));
}

/// The renderer's health in the running kernel.
fn renderer_health(h: &Harness) -> (HealthState, String) {
    let health = h
        .kernel
        .health()
        .get(RendererComponent::NAME)
        .expect("the renderer reports its health");
    (health.state, health.reason.unwrap_or_default())
}

#[tokio::test(start_paused = true)]
async fn the_renderer_is_degraded_while_objects_are_quarantined_and_healthy_after() {
    // A note `BROKEN` makes the render itself fail (not only the validation).
    let template = "\
{% for s in resources.services %}{% if s.spec.note == 'BROKEN' %}{{ fail('broken note in ' ~ s.metadata.name) }}{% endif %}backend {{ s.metadata.name }}
  # {{ s.spec.note }}
{% endfor %}";
    let mut h = harness_with(template, true);
    let v1: Vec<(usize, &str)> = (0..8).map(|i| (i, "v1")).collect();
    h.update("services", services(&v1));
    h.publisher.publish(trigger("start"));
    let (done, _, _) = settle(&mut h).await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted);
    assert_eq!(renderer_health(&h).0, HealthState::Healthy);

    // s03 breaks the render; the search isolates it and the rest goes live.
    let v2: Vec<(usize, &str)> = (0..8)
        .map(|i| (i, if i == 3 { "BROKEN" } else { "v2" }))
        .collect();
    h.update("services", services(&v2));
    h.publisher.publish(trigger("burst"));
    let (done, render, searches) = settle(&mut h).await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted, "{done:?}");
    assert_eq!(searches.len(), 1, "{searches:?}");
    assert!(render.expect("rendered").contains("backend s03\n  # v1"));
    let (state, reason) = renderer_health(&h);
    assert_eq!(state, HealthState::Degraded, "not failing: {reason}");
    assert!(
        reason.contains("1 object quarantined") && reason.contains("services default/s03"),
        "{reason}"
    );

    // Later renders keep it held back: still degraded, not healthy.
    let v3: Vec<(usize, &str)> = (0..8)
        .map(|i| (i, if i == 3 { "BROKEN" } else { "v3" }))
        .collect();
    h.update("services", services(&v3));
    h.publisher.publish(trigger("more"));
    let (done, _, _) = settle(&mut h).await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted);
    assert_eq!(renderer_health(&h).0, HealthState::Degraded);

    // Fixed: released, and the renderer is healthy again.
    let fixed: Vec<(usize, &str)> = (0..8).map(|i| (i, "v3")).collect();
    h.update("services", services(&fixed));
    h.publisher.publish(trigger("fixed"));
    let (done, _, searches) = settle(&mut h).await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted);
    if searches.is_empty() {
        h.next_of(EventKind::QuarantineSearched).await;
    }
    assert_eq!(renderer_health(&h), (HealthState::Healthy, String::new()));
}

#[tokio::test(start_paused = true)]
async fn the_render_of_the_accepted_changes_carries_the_snapshots_it_used() {
    let mut observed = OBSERVED.to_vec();
    observed.push(EventKind::TemplateInputs);
    let mut h = harness_full(TEMPLATE, true, true, &observed);
    let v1: Vec<(usize, &str)> = (0..8).map(|i| (i, "v1")).collect();
    h.update("services", services(&v1));
    h.publisher.publish(trigger("start"));
    let inputs = h.next_of(EventKind::TemplateInputs).await;
    let rendered = h.next_of(EventKind::TemplateRendered).await;
    let (EventPayload::TemplateInputs(inputs), EventPayload::TemplateRendered(rendered)) =
        (&inputs.payload, &rendered.payload)
    else {
        unreachable!()
    };
    assert_eq!(inputs.hash, rendered.config.hash());
    assert_eq!(inputs.snapshots["services"].len(), 8);
    let (done, _, _) = settle(&mut h).await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted);

    // s07 turns bad: the render of the accepted change (the others at v2, s07 held
    // back at v1) comes with exactly the snapshots it was rendered from.
    let v2: Vec<(usize, &str)> = (0..8)
        .map(|i| (i, if i == 7 { "INVALID" } else { "v2" }))
        .collect();
    h.update("services", services(&v2));
    h.publisher.publish(trigger("bad"));
    let mut last_inputs = None;
    loop {
        let event = h.next().await;
        match &event.payload {
            EventPayload::TemplateInputs(inputs) => last_inputs = Some(inputs.clone()),
            EventPayload::TemplateRendered(rendered) if !main_of(&event).contains("INVALID") => {
                let inputs = last_inputs.take().expect("inputs before the render");
                assert_eq!(inputs.hash, rendered.config.hash());
                let notes: Vec<String> = inputs.snapshots["services"]
                    .list()
                    .map(|o| o.parse()["spec"]["note"].as_str().unwrap().to_owned())
                    .collect();
                assert_eq!(notes, ["v2", "v2", "v2", "v2", "v2", "v2", "v2", "v1"]);
                break;
            }
            _ => {}
        }
    }
}

// === an environment problem ===

/// A validator that fails every config while `down` is set (a server name that
/// does not resolve while DNS is down), and otherwise like [`check`].
#[derive(Clone)]
struct Environment {
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl Environment {
    fn check(&self, config: &RenderedConfig) -> Option<Diagnostic> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Some(Diagnostic::error(
                "could not resolve address 'db.example.test'",
            ));
        }
        check(config)
    }
}

#[async_trait::async_trait]
impl Component for Environment {
    fn name(&self) -> &str {
        "validator"
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([EventKind::TemplateRendered])
    }

    async fn run(self: Box<Self>, ctx: Context) -> Result<(), ComponentError> {
        support::validate_with(ctx, |config| self.check(config)).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_change_rejected_while_the_environment_fails_goes_live_by_itself_once_it_recovers() {
    let environment = Environment {
        down: Arc::default(),
    };
    let renderer = Renderer::new(Templates::new(TEMPLATE), &["services"]).expect("loads");
    let probe_environment = environment.clone();
    let validate: Validate = Arc::new(move |config: Arc<RenderedConfig>| {
        let result = match probe_environment.check(&config) {
            Some(error) => Err(Failure {
                errors: vec![error],
                tool_failure: false,
            }),
            None => Ok(()),
        };
        Box::pin(async move { result })
    });
    let component = RendererComponent::new(renderer).with_quarantine(QuarantineSettings {
        validate,
        max_validations: 16,
        last_good: Default::default(),
        kept: Default::default(),
    });
    let mut h = Harness::start(
        vec![
            Box::new(Executor::new(Settings {
                quarantine: true,
                ..Settings::default()
            })),
            Box::new(component),
            Box::new(environment.clone()),
        ],
        &[
            EventKind::ReconciliationStarted,
            EventKind::ReconciliationCompleted,
            EventKind::ReconciliationFailed,
            EventKind::TemplateRendered,
            EventKind::QuarantineSearched,
        ],
    );
    h.update("services", services(&[(0, "v1"), (1, "v1")]));
    h.publisher.publish(trigger("start"));
    let (done, _, _) = settle(&mut h).await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted);

    // DNS goes down, then one object changes: everything fails, the last good
    // objects too, so nothing is quarantined and the change is rejected whole.
    environment
        .down
        .store(true, std::sync::atomic::Ordering::SeqCst);
    h.update("services", services(&[(0, "v2"), (1, "v1")]));
    h.publisher.publish(trigger("change"));
    let (done, _, searches) = settle(&mut h).await;
    assert_eq!(done.kind(), EventKind::ReconciliationFailed, "{done:?}");
    let [search] = &searches[..] else {
        panic!("one search: {searches:?}");
    };
    let EventPayload::QuarantineSearched(search) = &search.payload else {
        unreachable!()
    };
    assert_eq!(search.gave_up, Some("baseline_fails"));
    assert!(
        search.objects.is_empty(),
        "nothing is blamed on the objects"
    );
    let rejected_at = done.at;

    // DNS comes back; nothing changes, yet the change goes live on the retry.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    environment
        .down
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let started = h.next_of(EventKind::ReconciliationStarted).await;
    let EventPayload::ReconciliationStarted(started) = &started.payload else {
        unreachable!()
    };
    assert_eq!(started.reason, "retry 1 after baseline_fails");
    assert_eq!(
        tokio::time::Instant::now() - rejected_at,
        std::time::Duration::from_secs(5)
    );
    let (done, render, _) = settle(&mut h).await;
    assert_eq!(done.kind(), EventKind::ReconciliationCompleted, "{done:?}");
    assert!(
        render.expect("rendered").contains("backend s00\n  # v2"),
        "the change went live"
    );
}
