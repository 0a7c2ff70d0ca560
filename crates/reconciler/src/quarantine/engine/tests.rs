use std::sync::atomic::{AtomicUsize, Ordering};

use hapwright_eventbus::model::{FieldPath, ResourceSnapshot};
use serde_json::json;

use super::*;
use crate::renderer::Templates;

const TEMPLATE: &str = "\
{%- for s in resources.services %}
{%- if s.spec.port == 0 %}{{ fail('port 0 is not a port: ' ~ s.metadata.name) }}{% endif %}
backend {{ s.metadata.name }}
  server s1 127.0.0.1:{{ s.spec.port }}
{%- endfor %}
";

fn renderer(template: &str) -> Renderer {
    Renderer::new(Templates::new(template), &["services"]).expect("templates compile")
}

fn services(ports: &[(String, i64)]) -> Snapshots {
    let mut snapshot =
        ResourceSnapshot::new(vec![FieldPath::parse("metadata.name").expect("a path")]);
    for (name, port) in ports {
        snapshot.upsert(
            ObjectKey::new("default", name.clone()),
            &json!({"metadata": {"namespace": "default", "name": name}, "spec": {"port": port}}),
        );
    }
    Snapshots::from([(Arc::from("services"), Arc::new(snapshot))])
}

fn resources(snapshots: &Snapshots) -> Resources {
    let mut resources = Resources::new();
    for (source, snapshot) in snapshots {
        resources.update(source, snapshot.clone(), None);
    }
    resources
}

/// A stand-in for phase 2 that rejects port 666, as HAProxy would reject a
/// keyword, and counts its runs.
fn validate(runs: Arc<AtomicUsize>) -> Validate {
    Arc::new(move |config: Arc<RenderedConfig>| {
        runs.fetch_add(1, Ordering::SeqCst);
        let result = if config.main().contains(":666") {
            Err(Failure {
                errors: vec![Diagnostic::error("port 666 is cursed")],
                tool_failure: false,
            })
        } else {
            Ok(())
        };
        Box::pin(async move { result })
    })
}

fn names(range: std::ops::Range<usize>, port: impl Fn(usize) -> i64) -> Vec<(String, i64)> {
    range.map(|i| (format!("s{i:02}"), port(i))).collect()
}

const SETTINGS: Settings = Settings {
    max_probes: 16,
    baseline_valid: true,
};

#[tokio::test]
async fn fifty_good_changes_go_live_and_the_bad_one_keeps_its_last_good_version() {
    let renderer = renderer(TEMPLATE);
    let last_good = services(&names(0..51, |i| 1000 + i as i64));
    // 50 good changes and one bad one (s50's port becomes 0).
    let current = services(&names(0..51, |i| if i == 50 { 0 } else { 2000 + i as i64 }));
    let runs = Arc::new(AtomicUsize::new(0));
    let validate = validate(runs.clone());
    let mut quarantine = Quarantine::new();

    let mut set = ChangeSet::between(&last_good, &current);
    let full = set.clone();
    assert_eq!(quarantine.hold_back(&mut set), 0);
    let isolated = isolate(
        &renderer,
        &resources(&current),
        &set,
        &validate,
        SETTINGS,
        &[],
    )
    .await
    .expect("the culprit is isolated");
    let config = isolated.config.expect("a config for the accepted changes");
    for i in 0..50 {
        assert!(
            config.main().contains(&format!("127.0.0.1:{}\n", 2000 + i)),
            "change {i} is live:\n{}",
            config.main()
        );
    }
    assert!(
        config
            .main()
            .contains("backend s50\n  server s1 127.0.0.1:1050"),
        "s50 keeps its last good version"
    );
    assert_eq!(isolated.accepted, 50);
    assert!(isolated.probes <= 8, "{} probes", isolated.probes);
    assert!(
        runs.load(Ordering::SeqCst) < isolated.probes,
        "a candidate that fails to render is not validated"
    );
    let [culprit] = &isolated.culprits[..] else {
        panic!("one culprit: {:?}", isolated.culprits);
    };
    assert_eq!(culprit.key, ObjectKey::new("default", "s50"));
    assert_eq!(culprit.change, "modified");
    let error = &culprit.errors[0];
    assert!(
        error.message.contains("port 0 is not a port: s50"),
        "{error}"
    );
    let location = error.location.as_ref().expect("located");
    assert_eq!(location.file, "haproxy.cfg");
    assert_eq!(
        location.line,
        Some(2),
        "the template line of the fail() call"
    );

    let settled = quarantine.settle(&full, &isolated.culprits, SystemTime::UNIX_EPOCH);
    assert_eq!(settled.quarantined.len(), 1);
    assert!(settled.released.is_empty());
    assert_eq!(quarantine.counts()[&Arc::from("services")], 1);

    // The next reconciliation with the bad object unchanged needs no search.
    let last_good = isolated.snapshots;
    let mut set = ChangeSet::between(&last_good, &current);
    assert_eq!(set.len(), 1, "only the quarantined change is pending");
    assert_eq!(quarantine.hold_back(&mut set), 1);
    assert!(set.is_empty());

    // Fixing the object retries and releases it.
    let fixed = services(&names(
        0..51,
        |i| if i == 50 { 3050 } else { 2000 + i as i64 },
    ));
    let mut set = ChangeSet::between(&last_good, &fixed);
    let full = set.clone();
    assert_eq!(quarantine.hold_back(&mut set), 0, "new content is retried");
    let config = renderer
        .render(&resources(&fixed))
        .expect("the fixed object renders");
    assert!(config.main().contains("127.0.0.1:3050"));
    let settled = quarantine.settle(&full, &[], SystemTime::UNIX_EPOCH);
    assert_eq!(settled.released.len(), 1);
    assert!(quarantine.is_empty());
}

#[tokio::test]
async fn a_validation_failure_is_traced_to_its_object() {
    let renderer = renderer(TEMPLATE);
    let last_good = services(&[]);
    // The initial sync: 200 new objects, one of which HAProxy would reject.
    let current = services(&names(
        0..200,
        |i| if i == 137 { 666 } else { 1 + i as i64 },
    ));
    let runs = Arc::new(AtomicUsize::new(0));
    let settings = Settings {
        max_probes: 16,
        baseline_valid: false,
    };
    let set = ChangeSet::between(&last_good, &current);
    let isolated = isolate(
        &renderer,
        &resources(&current),
        &set,
        &validate(runs),
        settings,
        &[],
    )
    .await
    .expect("the culprit is isolated");
    assert_eq!(isolated.accepted, 199);
    assert_eq!(isolated.culprits.len(), 1);
    assert_eq!(isolated.culprits[0].key.name, "s137");
    assert_eq!(isolated.culprits[0].change, "added");
    assert_eq!(isolated.culprits[0].errors[0].message, "port 666 is cursed");
    assert_eq!(isolated.snapshots["services"].len(), 199);
    assert!(!isolated.config.expect("a config").main().contains("s137"));
}

#[tokio::test]
async fn a_broken_template_gives_up_after_one_render() {
    let renderer = renderer("{{ fail('broken') }}\n");
    let last_good = services(&names(0..10, |i| 1 + i as i64));
    let current = services(&names(0..10, |i| 100 + i as i64));
    let runs = Arc::new(AtomicUsize::new(0));
    let settings = Settings {
        max_probes: 16,
        baseline_valid: false,
    };
    let set = ChangeSet::between(&last_good, &current);
    let gave_up = isolate(
        &renderer,
        &resources(&current),
        &set,
        &validate(runs.clone()),
        settings,
        &[],
    )
    .await
    .expect_err("no quarantine for a template bug");
    assert_eq!(
        (gave_up.reason, gave_up.probes),
        (Rejection::BaselineFails, 1)
    );
    assert!(
        !gave_up.errors.is_empty(),
        "the last good objects' render errors are reported"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "nothing rendered to validate"
    );
}

#[tokio::test]
async fn a_failing_validation_tool_gives_up_at_once() {
    let renderer = renderer(TEMPLATE);
    let last_good = services(&names(0..10, |i| 1 + i as i64));
    let current = services(&names(0..10, |i| 100 + i as i64));
    let validate: Validate = Arc::new(|_| {
        Box::pin(async {
            Err(Failure {
                errors: vec![Diagnostic::error("haproxy: not found")],
                tool_failure: true,
            })
        })
    });
    let set = ChangeSet::between(&last_good, &current);
    let gave_up = isolate(
        &renderer,
        &resources(&current),
        &set,
        &validate,
        SETTINGS,
        &[],
    )
    .await
    .expect_err("a tool failure is not the objects' fault");
    assert_eq!(gave_up.reason, Rejection::ToolFailure);
    assert_eq!(gave_up.probes, 1);
}

#[tokio::test]
async fn an_error_that_quotes_the_bad_value_isolates_it_in_two_probes() {
    let renderer = renderer(TEMPLATE);
    let last_good = services(&names(0..51, |i| 1000 + i as i64));
    // 50 good changes and one HAProxy refuses (s17's port becomes 666).
    let current = services(&names(
        0..51,
        |i| if i == 17 { 666 } else { 2000 + i as i64 },
    ));
    let runs = Arc::new(AtomicUsize::new(0));
    let set = ChangeSet::between(&last_good, &current);
    let errors = [Diagnostic::error("port 666 is cursed")];
    let isolated = isolate(
        &renderer,
        &resources(&current),
        &set,
        &validate(runs.clone()),
        SETTINGS,
        &errors,
    )
    .await
    .expect("the culprit is isolated");
    assert_eq!(isolated.accepted, 50);
    let [culprit] = &isolated.culprits[..] else {
        panic!("one culprit: {:?}", isolated.culprits);
    };
    assert_eq!(culprit.key, ObjectKey::new("default", "s17"));
    // The other 50 together, then s17 alone for its own error.
    assert_eq!(isolated.probes, 2);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
