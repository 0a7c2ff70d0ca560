use super::*;
use hapwright_eventbus::model::ObjectKey;
use serde_json::json;

fn snapshot(objects: &[Json]) -> Arc<ResourceSnapshot> {
    let mut snapshot = ResourceSnapshot::new(Vec::new());
    for object in objects {
        snapshot.upsert(
            ObjectKey::new(
                object["metadata"]["namespace"].as_str().unwrap_or_default(),
                object["metadata"]["name"].as_str().unwrap(),
            ),
            object,
        );
    }
    Arc::new(snapshot)
}

fn ingress(name: &str, class: &str, status: Json) -> Json {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"namespace": "shop", "name": name},
        "spec": {"ingressClassName": class},
        "status": status,
    })
}

fn compile(template: &str) -> StatusTemplates {
    let mut templates = Templates::new("global\n");
    templates.extra_context = json!({"address": "192.0.2.7"});
    templates
        .snippets
        .insert("lb".into(), "ip: {{ extraContext.address }}".into());
    StatusTemplates::new(
        &templates,
        &BTreeMap::from([("ingresses".to_owned(), template.to_owned())]),
        &["ingresses", "services"],
    )
    .unwrap()
}

#[test]
fn renders_yaml_per_object_with_object_resources_and_extra_context() {
    let templates = compile(
        "{% if object.spec.ingressClassName == 'haproxy' %}\
         loadBalancer:\n  ingress:\n  - {% include 'lb' %}\n\
         services: {{ resources.services.list() | length }}\n{% endif %}",
    );
    let snapshots = BTreeMap::from([
        (
            Arc::from("ingresses"),
            snapshot(&[
                ingress("web", "haproxy", json!({})),
                ingress("other", "nginx", json!({})),
            ]),
        ),
        (
            Arc::from("services"),
            snapshot(&[json!({"metadata": {"namespace": "shop", "name": "a"}})]),
        ),
    ]);
    let (statuses, errors) = templates.render(&snapshots, "2026-01-01T00:00:00Z");
    assert!(errors.is_empty(), "{errors:?}");
    // `other` is of another class: its empty output leaves its status alone.
    assert_eq!(statuses.len(), 1, "{statuses:?}");
    let status = &statuses[0];
    assert_eq!(
        (status.namespace.as_str(), status.name.as_str()),
        ("shop", "web")
    );
    assert_eq!(status.kind, "Ingress");
    assert_eq!(status.api_version, "networking.k8s.io/v1");
    assert_eq!(
        status.status,
        json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}, "services": 1})
    );
    assert!(!status.current, "the object does not show it yet");
}

#[test]
fn an_object_that_already_shows_the_status_is_current() {
    let templates = compile("loadBalancer:\n  ingress:\n  - ip: 192.0.2.7\n");
    let shown = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}});
    let snapshots = BTreeMap::from([(
        Arc::from("ingresses"),
        snapshot(&[ingress("web", "haproxy", shown)]),
    )]);
    let (statuses, _) = templates.render(&snapshots, "2026-01-01T00:00:00Z");
    assert!(statuses[0].current);
}

#[test]
fn a_template_error_for_one_object_names_template_line_and_object_and_spares_the_others() {
    let templates = compile(
        "{% if object.metadata.name == 'bad' %}{{ fail('no address for ' ~ object.metadata.name) }}{% endif %}\n\
         ready: true\n",
    );
    let snapshots = BTreeMap::from([(
        Arc::from("ingresses"),
        snapshot(&[
            ingress("bad", "haproxy", json!({})),
            ingress("good", "haproxy", json!({})),
        ]),
    )]);
    let (statuses, errors) = templates.render(&snapshots, "2026-01-01T00:00:00Z");
    assert_eq!(statuses.len(), 1);
    assert_eq!(statuses[0].name, "good");
    assert_eq!(errors.len(), 1, "{errors:?}");
    let error = errors[0].to_string();
    assert!(error.contains("statusTemplates.ingresses:1"), "{error}");
    assert!(error.contains("shop/bad"), "{error}");
    assert!(error.contains("no address for bad"), "{error}");
}

#[test]
fn output_that_is_not_a_mapping_is_an_error_naming_the_object() {
    let templates = compile("- just a list\n");
    let snapshots = BTreeMap::from([(
        Arc::from("ingresses"),
        snapshot(&[ingress("web", "haproxy", json!({}))]),
    )]);
    let (statuses, errors) = templates.render(&snapshots, "now");
    assert!(statuses.is_empty());
    let error = errors[0].to_string();
    assert!(
        error.contains("shop/web") && error.contains("must be a mapping"),
        "{error}"
    );
}

#[test]
fn a_key_that_is_not_watched_and_a_syntax_error_are_located() {
    let templates = Templates::new("global\n");
    let errors = StatusTemplates::new(
        &templates,
        &BTreeMap::from([
            ("gateways".to_owned(), "a: 1".to_owned()),
            ("ingresses".to_owned(), "a: 1\nb: {{ object.\n".to_owned()),
        ]),
        &["ingresses"],
    )
    .unwrap_err();
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert!(
        text.iter()
            .any(|e| e.starts_with("statusTemplates.gateways")
                && e.contains("`gateways` is not a watched resource")),
        "{text:?}"
    );
    assert!(
        text.iter()
            .any(|e| e.starts_with("statusTemplates.ingresses:2")),
        "{text:?}"
    );
}

#[test]
fn last_transition_time_is_kept_while_a_condition_keeps_its_status() {
    let shown = json!({
        "conditions": [
            {"type": "Accepted", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"},
            {"type": "Programmed", "status": "False", "lastTransitionTime": "2020-01-01T00:00:00Z"},
        ],
        "listeners": [
            {"name": "https", "conditions": [
                {"type": "Programmed", "status": "True", "lastTransitionTime": "2021-01-01T00:00:00Z"}]},
        ],
    });
    let mut rendered = json!({
        "conditions": [
            {"type": "Accepted", "status": "True", "reason": "Accepted"},
            {"type": "Programmed", "status": "True", "reason": "Programmed"},
            {"type": "ResolvedRefs", "status": "True", "lastTransitionTime": "2019-01-01T00:00:00Z"},
        ],
        "listeners": [
            {"name": "http", "conditions": [{"type": "Programmed", "status": "True"}]},
            {"name": "https", "conditions": [{"type": "Programmed", "status": "True"}]},
        ],
    });
    fill_transition_times(&mut rendered, &shown, "2026-11-25T00:00:00Z");
    let conditions = &rendered["conditions"];
    // Same type and status: the time the object shows.
    assert_eq!(conditions[0]["lastTransitionTime"], "2020-01-01T00:00:00Z");
    // The status changed: now.
    assert_eq!(conditions[1]["lastTransitionTime"], "2026-11-25T00:00:00Z");
    // Given by the template: kept.
    assert_eq!(conditions[2]["lastTransitionTime"], "2019-01-01T00:00:00Z");
    // Listeners match by name, not position.
    assert_eq!(
        rendered["listeners"][0]["conditions"][0]["lastTransitionTime"],
        "2026-11-25T00:00:00Z"
    );
    assert_eq!(
        rendered["listeners"][1]["conditions"][0]["lastTransitionTime"],
        "2021-01-01T00:00:00Z"
    );
}

#[test]
fn an_unchanged_condition_renders_equal_across_renders() {
    let templates = compile("conditions:\n- type: Ready\n  status: \"True\"\n  reason: Deployed\n");
    let first = BTreeMap::from([(
        Arc::from("ingresses"),
        snapshot(&[ingress("web", "haproxy", json!({}))]),
    )]);
    let (statuses, _) = templates.render(&first, "2026-01-01T00:00:00Z");
    let written = statuses[0].status.clone();
    assert_eq!(
        written["conditions"][0]["lastTransitionTime"],
        "2026-01-01T00:00:00Z"
    );
    // The object now shows what was written; a later render keeps its time.
    let second = BTreeMap::from([(
        Arc::from("ingresses"),
        snapshot(&[ingress("web", "haproxy", written.clone())]),
    )]);
    let (statuses, _) = templates.render(&second, "2026-06-01T00:00:00Z");
    assert_eq!(statuses[0].status, written);
    assert!(statuses[0].current);
}

#[test]
fn now_is_rfc3339_in_whole_seconds() {
    let now = now_rfc3339();
    assert_eq!(now.len(), "2026-11-25T01:02:03Z".len(), "{now}");
    assert!(now.ends_with('Z'));
}
