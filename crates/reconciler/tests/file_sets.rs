//! File sets: one map, file or certificate per item of a list, named by the item.
//! Names are checked like the config's file names, duplicates name both objects, a
//! change to one object renders only its file, and an incremental render equals a
//! full one.

use std::sync::Arc;

use hapwright_eventbus::model::{
    FileKind, ObjectKey, ResourceChange, ResourceSnapshot, UpsertOutcome,
};
use hapwright_reconciler::renderer::{FileSet, Renderer, Resources, Templates};
use serde_json::{Value, json};

const MAIN: &str = "global\n    daemon\n";

fn certificates() -> FileSet {
    FileSet {
        kind: FileKind::Certificate,
        key: "tls".into(),
        for_each: "resources.secrets.list() | selectattr('type', 'eq', 'kubernetes.io/tls')".into(),
        name: "{{ item.metadata.namespace }}_{{ item.metadata.name }}.pem".into(),
        template: "{{ item.data['tls.crt'] | b64decode }}{{ item.data['tls.key'] | b64decode }}"
            .into(),
    }
}

fn renderer(sets: Vec<FileSet>) -> Renderer {
    let templates = Templates {
        main: MAIN.into(),
        sets,
        ..Templates::default()
    };
    Renderer::new(templates, &["secrets"])
        .unwrap_or_else(|errors| panic!("templates do not load: {errors:#?}"))
}

fn secret(namespace: &str, name: &str, crt: &str) -> Value {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    json!({
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"namespace": namespace, "name": name},
        "data": {"tls.crt": b64(&format!("CRT {crt}\n")), "tls.key": b64("KEY\n")},
    })
}

/// The `secrets` snapshot and its template view, changed one object at a time.
struct Secrets {
    snapshot: ResourceSnapshot,
    resources: Resources,
}

impl Secrets {
    fn new() -> Self {
        Self {
            snapshot: ResourceSnapshot::new(Vec::new()),
            resources: Resources::new(),
        }
    }

    fn upsert(&mut self, object: Value) {
        let key = ObjectKey::new(
            object["metadata"]["namespace"].as_str().unwrap_or_default(),
            object["metadata"]["name"].as_str().unwrap_or_default(),
        );
        let mut change = ResourceChange::default();
        match self.snapshot.upsert(key.clone(), &object) {
            Some(UpsertOutcome::Added) => change.added.push(key),
            Some(UpsertOutcome::Modified) => change.modified.push(key),
            None => {}
        }
        self.publish(change);
    }

    fn remove(&mut self, namespace: &str, name: &str) {
        let key = ObjectKey::new(namespace, name);
        let mut change = ResourceChange::default();
        if self.snapshot.remove(&key).is_some() {
            change.removed.push(key);
        }
        self.publish(change);
    }

    fn publish(&mut self, change: ResourceChange) {
        self.resources.update(
            &Arc::from("secrets"),
            Arc::new(self.snapshot.clone()),
            Some(&change),
        );
    }
}

#[test]
fn one_certificate_per_secret_named_by_the_secret() {
    let renderer = renderer(vec![certificates()]);
    let mut secrets = Secrets::new();
    secrets.upsert(secret("shop", "web", "a"));
    secrets.upsert(secret("blog", "www", "b"));
    let mut opaque = secret("shop", "password", "x");
    opaque["type"] = json!("Opaque");
    secrets.upsert(opaque);
    let rendered = renderer.render(&secrets.resources).expect("renders");
    let names: Vec<&String> = rendered.certificates().keys().collect();
    assert_eq!(names, ["blog_www.pem", "shop_web.pem"]);
    assert_eq!(&*rendered.certificates()["shop_web.pem"], "CRT a\nKEY\n");
    // The source map knows where each line of an item's file came from.
    let origin = rendered
        .source_map()
        .origin(
            &hapwright_eventbus::model::RenderedFileRef {
                kind: FileKind::Certificate,
                name: "shop_web.pem".into(),
            },
            1,
        )
        .expect("line 1 has an origin");
    assert_eq!(&*origin.template, "certs/tls");
}

#[test]
fn a_change_to_one_object_renders_only_its_file() {
    let renderer = renderer(vec![certificates()]);
    let mut secrets = Secrets::new();
    for i in 0..50 {
        secrets.upsert(secret("shop", &format!("s{i}"), "v1"));
    }
    let (first, stats) = renderer.render_with_stats(&secrets.resources);
    let first = first.expect("renders");
    assert_eq!(first.certificates().len(), 50);
    assert_eq!(stats.reused, 0);

    secrets.upsert(secret("shop", "s7", "v2"));
    let (second, stats) = renderer.render_with_stats(&secrets.resources);
    let second = second.expect("renders");
    // haproxy.cfg (reads nothing) and 49 certificates are reused, one is rendered.
    assert_eq!(stats.rendered, 1, "{stats:?}");
    assert_eq!(stats.reused, 50, "{stats:?}");
    assert_eq!(&*second.certificates()["shop_s7.pem"], "CRT v2\nKEY\n");
    assert_eq!(second, renderer.render_full(&secrets.resources).unwrap());

    secrets.remove("shop", "s3");
    secrets.upsert(secret("shop", "new", "v1"));
    let (third, stats) = renderer.render_with_stats(&secrets.resources);
    let third = third.expect("renders");
    assert_eq!(stats.rendered, 1, "{stats:?}");
    assert!(!third.certificates().contains_key("shop_s3.pem"));
    assert!(third.certificates().contains_key("shop_new.pem"));
    assert_eq!(third, renderer.render_full(&secrets.resources).unwrap());
    assert_eq!(
        third.hash(),
        renderer.render_full(&secrets.resources).unwrap().hash()
    );
}

#[test]
fn items_whose_template_reads_resources_render_again_when_those_change() {
    let mut set = certificates();
    // Each file also lists how many secrets there are: a read of the whole store.
    set.template = "{{ item.metadata.name }} of {{ resources.secrets.list() | length }}".into();
    let renderer = renderer(vec![set]);
    let mut secrets = Secrets::new();
    secrets.upsert(secret("shop", "a", "1"));
    renderer.render_with_stats(&secrets.resources).0.unwrap();
    secrets.upsert(secret("shop", "b", "1"));
    let (rendered, stats) = renderer.render_with_stats(&secrets.resources);
    let rendered = rendered.unwrap();
    assert_eq!(&*rendered.certificates()["shop_a.pem"], "a of 2\n");
    assert_eq!(stats.rendered, 2, "{stats:?}");
    assert_eq!(rendered, renderer.render_full(&secrets.resources).unwrap());
}

#[test]
fn a_hostile_name_is_an_error_naming_the_object() {
    let renderer = renderer(vec![certificates()]);
    let mut secrets = Secrets::new();
    secrets.upsert(secret("shop", "web", "a"));
    for hostile in ["../../etc", "a b", ".hidden"] {
        let mut bad = secret("evil", hostile, "x");
        bad["metadata"]["namespace"] = json!(hostile);
        secrets.upsert(bad);
    }
    let errors = renderer.render(&secrets.resources).unwrap_err();
    assert_eq!(errors.len(), 3, "{errors:#?}");
    for error in &errors {
        assert!(
            error.message.starts_with("sslCertificates.tls: Secret "),
            "{}",
            error.message
        );
        assert!(
            error.message.contains("renders the file name"),
            "{}",
            error.message
        );
        let location = error.location.as_ref().expect("located");
        assert_eq!(location.file, "certs/tls");
    }
    assert!(
        errors
            .iter()
            .any(|e| e.message.contains("Secret ../../etc/../../etc")
                && e.message.contains("must not contain `/`")),
        "{errors:#?}"
    );
}

#[test]
fn two_items_with_one_name_are_an_error_naming_both() {
    let mut set = certificates();
    set.name = "{{ item.metadata.name }}.pem".into();
    let renderer = renderer(vec![set]);
    let mut secrets = Secrets::new();
    secrets.upsert(secret("blog", "web", "a"));
    secrets.upsert(secret("shop", "web", "b"));
    let errors = renderer.render(&secrets.resources).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0].message,
        "sslCertificates.tls: Secret shop/web and Secret blog/web both render certs/web.pem"
    );
}

#[test]
fn an_item_may_not_take_a_fixed_name() {
    let templates = Templates {
        main: MAIN.into(),
        certificates: [("shop_web.pem".to_owned(), "fixed".to_owned())].into(),
        sets: vec![certificates()],
        ..Templates::default()
    };
    let renderer = Renderer::new(templates, &["secrets"]).unwrap();
    let mut secrets = Secrets::new();
    secrets.upsert(secret("shop", "web", "a"));
    let errors = renderer.render(&secrets.resources).unwrap_err();
    assert!(
        errors[0]
            .message
            .contains("Secret shop/web and a fixed entry both render certs/shop_web.pem"),
        "{errors:#?}"
    );
}

#[test]
fn a_render_error_in_an_item_names_the_item_and_its_file() {
    let mut set = certificates();
    set.template = "{{ fail('no key in ' ~ item.metadata.name) }}".into();
    let renderer = renderer(vec![set]);
    let mut secrets = Secrets::new();
    secrets.upsert(secret("shop", "web", "a"));
    let errors = renderer.render(&secrets.resources).unwrap_err();
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0]
            .message
            .contains("no key in web (certs/shop_web.pem for Secret shop/web)"),
        "{}",
        errors[0].message
    );
    assert_eq!(errors[0].location.as_ref().unwrap().line, Some(1));
}

#[test]
fn for_each_must_give_a_list_and_broken_templates_fail_to_load() {
    let mut set = certificates();
    set.for_each = "42".into();
    let renderer = renderer(vec![set]);
    let errors = renderer.render(&Resources::new()).unwrap_err();
    assert!(
        errors[0]
            .message
            .contains("forEach gave number `42`, not a list"),
        "{errors:#?}"
    );
    // Nothing to iterate (an undefined value) renders no file.
    let mut set = certificates();
    set.for_each = "extraContext.nothing".into();
    let rendered = renderer_ok(set).render(&Resources::new()).unwrap();
    assert!(rendered.certificates().is_empty());

    for (for_each, name) in [("[1,", "x"), ("[1]", "{{ x")] {
        let mut set = certificates();
        set.for_each = for_each.into();
        set.name = name.into();
        let templates = Templates {
            main: MAIN.into(),
            sets: vec![set],
            ..Templates::default()
        };
        let errors = Renderer::new(templates, &["secrets"]).unwrap_err();
        assert!(
            errors[0].message.starts_with("certs/tls: its "),
            "{errors:#?}"
        );
    }
}

fn renderer_ok(set: FileSet) -> Renderer {
    renderer(vec![set])
}

#[test]
fn maps_and_files_may_be_sets_too_and_shared_is_seen() {
    let templates = Templates {
        main: "{% do shared.setdefault('hosts', ['a.example.com', 'b.example.com']) %}global\n"
            .into(),
        sets: vec![
            FileSet {
                kind: FileKind::Map,
                key: "per-host".into(),
                for_each: "shared.hosts".into(),
                name: "{{ item }}.map".into(),
                template: "{{ item }} be_{{ item | replace('.', '_') }}".into(),
            },
            FileSet {
                kind: FileKind::File,
                key: "pages".into(),
                for_each: "extraContext.pages".into(),
                name: "{{ item.code }}.http".into(),
                template: "HTTP/1.0 {{ item.code }}\n\n{{ item.text }}".into(),
            },
        ],
        extra_context: json!({"pages": [{"code": 503, "text": "down"}]}),
        ..Templates::default()
    };
    let renderer = Renderer::new(templates, &[] as &[&str]).unwrap();
    let rendered = renderer.render(&Resources::new()).unwrap();
    assert_eq!(
        &*rendered.maps()["a.example.com.map"],
        "a.example.com be_a_example_com\n"
    );
    assert_eq!(rendered.maps().len(), 2);
    assert_eq!(&*rendered.files()["503.http"], "HTTP/1.0 503\n\ndown\n");
}

mod support;

/// On the bus with quarantine on: an object whose item renders a hostile file name is
/// held back, the other objects' changes go live in the same reconciliation.
#[tokio::test(start_paused = true)]
async fn the_object_behind_a_bad_name_is_quarantined_not_the_whole_render() {
    use hapwright_eventbus::model::RenderedConfig;
    use hapwright_eventbus::{EventKind, EventPayload, ReconciliationTriggered};
    use hapwright_reconciler::executor::{Executor, Settings};
    use hapwright_reconciler::quarantine::Validate;
    use hapwright_reconciler::renderer::{QuarantineSettings, RendererComponent};

    let templates = Templates {
        main: MAIN.into(),
        sets: vec![FileSet {
            kind: FileKind::File,
            key: "notes".into(),
            for_each: "resources.services.list()".into(),
            name: "{{ item.spec.note }}.txt".into(),
            template: "{{ item.metadata.name }}".into(),
        }],
        ..Templates::default()
    };
    let renderer = Renderer::new(templates, &["services"]).expect("loads");
    let validate: Validate = Arc::new(|_: Arc<RenderedConfig>| Box::pin(async { Ok(()) }));
    let component = RendererComponent::new(renderer).with_quarantine(QuarantineSettings {
        validate,
        max_validations: 16,
        last_good: Default::default(),
        kept: Default::default(),
    });
    let mut h = support::Harness::start(
        vec![
            Box::new(Executor::new(Settings {
                quarantine: true,
                ..Settings::default()
            })),
            Box::new(component),
            Box::new(support::AutoValidator),
        ],
        &[
            EventKind::ReconciliationCompleted,
            EventKind::ReconciliationFailed,
            EventKind::TemplateRendered,
            EventKind::QuarantineSearched,
        ],
    );
    let services = |notes: &[&str]| {
        let mut snapshot = ResourceSnapshot::new(Vec::new());
        for (i, note) in notes.iter().enumerate() {
            let name = format!("s{i:02}");
            snapshot.upsert(
                ObjectKey::new("default", name.clone()),
                &json!({"kind": "Service", "metadata": {"namespace": "default", "name": name},
                        "spec": {"note": note}}),
            );
        }
        Arc::new(snapshot)
    };
    let trigger = || ReconciliationTriggered {
        reason: "test".into(),
        sources: vec!["services".into()],
        waited: std::time::Duration::ZERO,
        follow_up: false,
    };
    let settle = async |h: &mut support::Harness| {
        let mut files = None;
        let mut searches = Vec::new();
        loop {
            let event = h.next().await;
            match &event.payload {
                EventPayload::TemplateRendered(r) => {
                    files = Some(r.config.files().keys().cloned().collect::<Vec<_>>());
                }
                EventPayload::QuarantineSearched(s) => searches.push(s.clone()),
                _ => {}
            }
            if matches!(
                event.kind(),
                EventKind::ReconciliationCompleted | EventKind::ReconciliationFailed
            ) {
                return (event.kind(), files, searches);
            }
        }
    };
    h.update("services", services(&["a", "b"]));
    h.publisher.publish(trigger());
    let (kind, files, _) = settle(&mut h).await;
    assert_eq!(kind, EventKind::ReconciliationCompleted);
    assert_eq!(files.unwrap(), ["a.txt", "b.txt"]);

    h.update("services", services(&["a2", "../../etc/passwd"]));
    h.publisher.publish(trigger());
    let (kind, files, searches) = settle(&mut h).await;
    assert_eq!(kind, EventKind::ReconciliationCompleted);
    // s00's change went live; s01 is held at its last good version.
    assert_eq!(files.unwrap(), ["a2.txt", "b.txt"]);
    let [search] = &searches[..] else {
        panic!("one search: {searches:?}");
    };
    let names: Vec<&str> = search.objects.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["s01"]);
    let reason = format!("{:?}", search.objects[0]);
    assert!(reason.contains("renders the file name"), "{reason}");
}

/// A set of string items named by the item alone, whose items come and go: each
/// render after the first starts from the last one's files (only new and changed
/// items render, gone ones are taken out), and gives what a fresh renderer gives,
/// errors included (two items that render one name).
#[test]
fn string_items_that_come_and_go_render_as_in_full() {
    let set = FileSet {
        kind: FileKind::Certificate,
        key: "tls".into(),
        for_each: "resources.secrets.list() | map(attribute='metadata.name') | list".into(),
        name: "{{ item | replace('-', '_') }}.pem".into(),
        template: "CERT {{ item }}".into(),
    };
    let fixed = [("fixed.pem".to_owned(), "FIXED".to_owned())];
    let make = || {
        Renderer::new(
            Templates {
                main: MAIN.into(),
                certificates: fixed.clone().into(),
                sets: vec![set.clone()],
                ..Templates::default()
            },
            &["secrets"],
        )
        .unwrap()
    };
    let incremental = make();
    let mut secrets = Secrets::new();
    let check = |secrets: &Secrets, step: &str| {
        let (got, stats) = incremental.render_with_stats(&secrets.resources);
        let expected = make().render(&secrets.resources);
        match (&got, &expected) {
            (Ok(got), Ok(expected)) => {
                assert_eq!(got, expected, "{step}");
                assert_eq!(got.hash(), expected.hash(), "{step}");
                assert_eq!(got.source_map(), expected.source_map(), "{step}");
            }
            (Err(got), Err(expected)) => assert_eq!(got, expected, "{step}"),
            _ => panic!("{step}: {got:?} against {expected:?}"),
        }
        (got, stats)
    };
    for name in ["a-b", "c", "d"] {
        secrets.upsert(secret("ns", name, name));
    }
    let _ = check(&secrets, "first");
    secrets.upsert(secret("ns", "x", "x"));
    let (rendered, stats) = check(&secrets, "one added");
    let rendered = rendered.unwrap();
    assert_eq!(
        rendered.certificates().keys().collect::<Vec<_>>(),
        ["a_b.pem", "c.pem", "d.pem", "fixed.pem", "x.pem"]
    );
    assert_eq!(stats.rendered, 1, "only the new item renders: {stats:?}");
    secrets.upsert(secret("ns", "a_b", "clash"));
    let (errors, _) = check(&secrets, "a clash");
    let errors = errors.unwrap_err();
    assert!(
        errors[0].message.contains("both render certs/a_b.pem"),
        "{errors:#?}"
    );
    secrets.remove("ns", "a-b");
    let _ = check(&secrets, "the first of the two gone");
    secrets.remove("ns", "c");
    let (rendered, _) = check(&secrets, "one removed");
    assert!(!rendered.unwrap().certificates().contains_key("c.pem"));
    // Once the names in use are known, items that come and go are named and
    // checked alone: more adds and removals, a clash with a name in use, and the
    // clash resolved.
    for name in ["e", "f-g", "h"] {
        secrets.upsert(secret("ns", name, name));
        let (_, stats) = check(&secrets, &format!("{name} added"));
        assert_eq!(stats.rendered, 1, "{name} added: {stats:?}");
    }
    secrets.remove("ns", "d");
    let (rendered, stats) = check(&secrets, "d removed");
    assert!(!rendered.unwrap().certificates().contains_key("d.pem"));
    assert_eq!(stats.rendered, 0, "d removed: {stats:?}");
    secrets.upsert(secret("ns", "f_g", "clash"));
    let (errors, _) = check(&secrets, "a clash with a name in use");
    assert!(
        errors.unwrap_err()[0]
            .message
            .contains("both render certs/f_g.pem"),
        "a clash with a name in use"
    );
    secrets.remove("ns", "f-g");
    let _ = check(&secrets, "the clash resolved");
    secrets.upsert(secret("ns", "fixed", "clash"));
    let _ = check(&secrets, "an item on a fixed name");
}
