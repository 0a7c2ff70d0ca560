use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, UNIX_EPOCH};

use hapwright_eventbus::model::SourceLocation;
use serde_json::json;

use super::*;

fn object(name: &str, port: i64) -> StoredObject {
    StoredObject::from_value(&json!({
        "kind": "Service",
        "metadata": {"namespace": "default", "name": name, "resourceVersion": "7"},
        "spec": {"port": port, "weight": 1.5, "labels": {"z": "1", "a": "2"}},
    }))
}

fn entry(name: &str, change: &'static str, held: Option<i64>, last: Option<i64>) -> Entry {
    Entry {
        culprit: Culprit {
            resource: Arc::from("services"),
            key: ObjectKey::new("default", name),
            change,
            content: held.map(|port| object(name, port)),
            last_accepted: last.map(|port| object(name, port)),
            payload: false,
            errors: vec![
                Diagnostic::error("invalid address: '300.1.2.3'").at(SourceLocation::new(
                    "haproxy.cfg",
                    Some(12),
                    None,
                )),
            ],
        },
        since: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
    }
}

fn three() -> Vec<Entry> {
    vec![
        entry("changed", "modified", Some(1), Some(2)),
        entry("gone", "removed", None, Some(3)),
        entry("new", "added", Some(4), None),
    ]
}

#[test]
fn the_record_round_trips_every_entry_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let kept = Kept::new();
    kept.keep_in(vec![dir.path().to_owned()], None);
    assert!(
        kept.take_restored().entries.is_empty(),
        "nothing on disk yet"
    );
    let quarantine = Quarantine::from_entries(three());
    kept.save(&quarantine);

    let path = dir.path().join(QUARANTINE_RECORD_FILE);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "objects may be Secrets");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|name| name != QUARANTINE_RECORD_FILE)
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // A new process reads it back: the same entries, the same object texts (the
    // held version is compared with the current one by its text).
    let again = Kept::new();
    again.keep_in(vec![dir.path().to_owned()], None);
    let restored = again.take_restored();
    assert_eq!(restored.entries, three());
    assert!(restored.hold, "the same config: held back again");
    assert!(again.take_restored().entries.is_empty(), "taken once");
    // Read once per process: a later call (a config reload) reads nothing again.
    again.keep_in(vec![dir.path().to_owned()], None);
    assert!(again.take_restored().entries.is_empty());
}

#[test]
fn an_empty_quarantine_removes_the_record_and_payloads_are_not_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(QUARANTINE_RECORD_FILE);
    let kept = Kept::new();
    kept.keep_in(vec![dir.path().to_owned()], None);
    let mut payload = entry("payload", "modified", Some(1), Some(2));
    payload.culprit.payload = true;
    payload.culprit.key = ObjectKey::new("", "payload");
    kept.save(&Quarantine::from_entries([
        payload,
        entry("new", "added", Some(4), None),
    ]));
    let record = QuarantineRecord::read(dir.path()).unwrap().unwrap();
    let names: Vec<&str> = record.objects.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["new"]);
    assert_eq!(record.objects[0].last_accepted, None);

    kept.save(&Quarantine::new());
    assert!(!path.exists(), "nothing quarantined: no record");
}

#[test]
fn saving_reports_the_steps_around_the_write_and_skips_what_is_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(QUARANTINE_RECORD_FILE);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let pause: Pause = {
        let seen = seen.clone();
        let path = path.clone();
        Arc::new(move |step: &str| {
            seen.lock().unwrap().push((step.to_owned(), path.exists()));
        })
    };
    let kept = Kept::new().with_pause(pause);
    kept.keep_in(vec![dir.path().to_owned()], None);
    let quarantine = Quarantine::from_entries(three());
    kept.save(&quarantine);
    kept.save(&quarantine);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (steps::DECIDED.to_owned(), false),
            (steps::RECORDED.to_owned(), true)
        ],
        "one write, the record on disk after it"
    );
}

#[test]
fn an_unreadable_record_is_ignored_and_replaced_by_the_next_save() {
    for content in [
        &b"{not json"[..],
        br#"{"format": 9, "writtenAt": {"secs_since_epoch": 1, "nanos_since_epoch": 0}, "objects": []}"#,
        br#"{"format": 1, "writtenAt": {"secs_since_epoch": 1, "nanos_since_epoch": 0}, "objects": [{"resource": "services", "namespace": "", "name": "a", "change": "renamed", "held": null, "lastAccepted": null, "errors": [], "since": {"secs_since_epoch": 1, "nanos_since_epoch": 0}}]}"#,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(QUARANTINE_RECORD_FILE);
        std::fs::write(&path, content).unwrap();
        let error = QuarantineRecord::read(dir.path()).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");

        let kept = Kept::new();
        kept.keep_in(vec![dir.path().to_owned()], None);
        assert!(kept.take_restored().entries.is_empty(), "starts with an empty quarantine");
        // The next change of the quarantine writes a good record over it.
        kept.save(&Quarantine::from_entries(three()));
        let record = QuarantineRecord::read(dir.path()).unwrap().unwrap();
        assert_eq!(record.objects.len(), 3);
    }
}

#[test]
fn the_newest_readable_record_of_several_directories_wins() {
    let (a, b, broken) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    Kept::new().save(&Quarantine::new());
    let old = Kept::new();
    old.keep_in(vec![a.path().to_owned()], None);
    old.save(&Quarantine::from_entries([entry(
        "old",
        "added",
        Some(1),
        None,
    )]));
    let new = Kept::new();
    new.keep_in(vec![b.path().to_owned()], None);
    new.save(&Quarantine::from_entries(three()));
    std::fs::write(broken.path().join(QUARANTINE_RECORD_FILE), b"").unwrap();

    let kept = Kept::new();
    kept.keep_in(
        vec![
            broken.path().to_owned(),
            b.path().to_owned(),
            a.path().to_owned(),
        ],
        None,
    );
    assert_eq!(kept.take_restored().entries, three());
}

#[test]
fn a_missing_config_directory_is_created_for_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let config_dir = dir.path().join("run/haproxy");
    let kept = Kept::new();
    kept.keep_in(vec![config_dir.clone()], None);
    kept.save(&Quarantine::from_entries(three()));
    assert!(config_dir.join(QUARANTINE_RECORD_FILE).is_file());
}

#[test]
fn a_record_of_another_config_is_restored_to_be_judged_again() {
    let dir = tempfile::tempdir().unwrap();
    let kept = Kept::new();
    kept.keep_in(vec![dir.path().to_owned()], Some("config-a".into()));
    kept.save(&Quarantine::from_entries(three()));
    let record = QuarantineRecord::read(dir.path()).unwrap().unwrap();
    assert_eq!(record.config.as_deref(), Some("config-a"));

    let same = Kept::new();
    same.keep_in(vec![dir.path().to_owned()], Some("config-a".into()));
    assert!(same.take_restored().hold);
    let other = Kept::new();
    other.keep_in(vec![dir.path().to_owned()], Some("config-b".into()));
    let restored = other.take_restored();
    assert_eq!(
        restored.entries,
        three(),
        "the last accepted versions are used"
    );
    assert!(!restored.hold, "new templates may accept the objects");

    // The same objects under a new config are written again, with that config.
    other.save(&Quarantine::from_entries(three()));
    let record = QuarantineRecord::read(dir.path()).unwrap().unwrap();
    assert_eq!(record.config.as_deref(), Some("config-b"));
}

#[test]
fn the_last_good_objects_of_a_search_are_kept_until_its_outcome_is_recorded() {
    use hapwright_eventbus::model::{ContentHash, ResourceSnapshot};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(BASELINE_FILE);
    let mut services = ResourceSnapshot::new(Vec::new());
    services.upsert(ObjectKey::new("default", "a"), &object("a", 1).parse());
    services.upsert(ObjectKey::new("", "b"), &object("b", 2).parse());
    let mut payload = ResourceSnapshot::new(Vec::new());
    payload.upsert(ObjectKey::new("", "x"), &json!({"x": 1}));
    payload.set_unit(Some(ContentHash::of(b"list")));
    let snapshots = Snapshots::from([
        (Arc::from("services"), Arc::new(services)),
        (Arc::from("allow"), Arc::new(payload)),
    ]);

    let kept = Kept::new();
    kept.keep_in(vec![dir.path().to_owned()], Some("config-a".into()));
    kept.save_baseline(&snapshots);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let baseline = Baseline::read(dir.path()).unwrap().unwrap();
    let resources: Vec<&str> = baseline
        .resources
        .iter()
        .map(|r| r.resource.as_str())
        .collect();
    assert_eq!(resources, ["services"], "a payload is not an object list");
    // In key order: namespace, then name.
    let objects = &baseline.resources[0].objects;
    assert_eq!(
        (objects[0].namespace.as_str(), objects[0].name.as_str()),
        ("", "b")
    );
    assert_eq!(objects[1].object, object("a", 1).parse());

    // Read back under the same config only.
    let same = Kept::new();
    same.keep_in(vec![dir.path().to_owned()], Some("config-a".into()));
    assert_eq!(same.take_restored().baseline, Some(baseline));
    let other = Kept::new();
    other.keep_in(vec![dir.path().to_owned()], Some("config-b".into()));
    assert_eq!(other.take_restored().baseline, None);

    // The search's outcome is recorded: the baseline goes.
    assert!(kept.may_hold_baseline());
    kept.forget_baseline();
    assert!(!path.exists());
    assert!(!kept.may_hold_baseline());
    // A process that only read it removes it too.
    kept.save_baseline(&snapshots);
    let reader = Kept::new();
    reader.keep_in(vec![dir.path().to_owned()], Some("config-a".into()));
    reader.forget_baseline();
    assert!(!path.exists());

    // A broken baseline is ignored.
    std::fs::write(&path, b"[").unwrap();
    let broken = Kept::new();
    broken.keep_in(vec![dir.path().to_owned()], Some("config-a".into()));
    assert_eq!(broken.take_restored().baseline, None);
}
