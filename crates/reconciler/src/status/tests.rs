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
    let (statuses, errors) = templates.render(&snapshots, &serving(), "2026-01-01T00:00:00Z");
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

/// Statuses rendered from the resources kept from the last render, updated with
/// what changed in each snapshot, and from the outputs of the objects whose
/// template read nothing that changed, are those a fresh render gives: random
/// adds, changes and removals of Ingresses and Services (snapshots derived from
/// the previous ones, as sources publish them, and now and then unrelated ones),
/// with templates that read one Service, whole lists, a field of `deployment` or
/// all of it, under fleets that serve the render or not.
#[test]
fn statuses_from_the_kept_resources_are_those_of_a_fresh_render() {
    let template = "{% if object.spec.ingressClassName == 'haproxy' %}\
         {% set svc = resources.services.get('shop', object.spec.backend) %}\
         loadBalancer:\n  ingress:\n  - ip: {{ svc.spec.ip if svc else 'none' }}\n\
         {% if object.spec.backend == 'o1' %}programmed: {{ deployment.programmed }}\n{% endif %}\
         {% if object.spec.backend == 'o2' %}all: {{ deployment | tojson }}\n{% endif %}\
         {% if object.spec.backend in ['o3', 'o4'] %}\
         services: {{ resources.services.list() | sort(attribute='spec.ip') | map(attribute='metadata.name') | join(',') }}\n\
         ingresses: {{ resources.ingresses.list() | length }}\n{% endif %}{% endif %}";
    let kept = compile(template);
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut draw = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let by_name = || {
        vec![
            hapwright_eventbus::model::FieldPath::parse("metadata.namespace").expect("path"),
            hapwright_eventbus::model::FieldPath::parse("metadata.name").expect("path"),
        ]
    };
    let mut ingresses = ResourceSnapshot::new(Vec::new());
    let mut services = ResourceSnapshot::new(by_name());
    let (mut served, mut reused) = (0, 0);
    for step in 0..200 {
        for _ in 0..1 + draw(3) {
            let name = format!("o{}", draw(8));
            let key = ObjectKey::new("shop", &name);
            match draw(5) {
                0 => {
                    ingresses.remove(&key);
                }
                1 => {
                    services.remove(&key);
                }
                2 | 3 => {
                    let class = ["haproxy", "nginx"][draw(2) as usize];
                    let mut object = ingress(&name, class, json!({}));
                    object["spec"]["backend"] = json!(format!("o{}", draw(8)));
                    ingresses.upsert(key, &object);
                }
                _ => {
                    let object = json!({
                        "metadata": {"namespace": "shop", "name": name},
                        "spec": {"ip": format!("192.0.2.{}", draw(9))},
                    });
                    services.upsert(key, &object);
                }
            }
        }
        // Now and then snapshots built anew rather than derived.
        let fresh = |snapshot: &ResourceSnapshot| {
            let mut copy = ResourceSnapshot::new(Vec::new());
            for (key, object) in snapshot.iter() {
                copy.upsert(key.clone(), &object.parse());
            }
            copy
        };
        let (ing, svc) = if draw(10) == 0 {
            let mut svc = ResourceSnapshot::new(by_name());
            for (key, object) in services.iter() {
                svc.upsert(key.clone(), &object.parse());
            }
            (fresh(&ingresses), svc)
        } else {
            (ingresses.clone(), services.clone())
        };
        let snapshots = BTreeMap::from([
            (Arc::from("ingresses"), Arc::new(ing)),
            (Arc::from("services"), Arc::new(svc)),
        ]);
        let now = "2026-01-01T00:00:00Z";
        // Now and then an instance that does not serve the render.
        let fleet = match draw(4) {
            0 => Fleet {
                render: ContentHash::of(b"new"),
                instances: vec![runs("a", b"new", None), runs("b", b"old", None)],
            },
            _ => serving(),
        };
        let (statuses, errors) = kept.render(&snapshots, &fleet, now);
        reused += kept.reused();
        let (fresh_statuses, fresh_errors) = compile(template).render(&snapshots, &fleet, now);
        assert_eq!(statuses, fresh_statuses, "step {step}");
        assert_eq!(errors, fresh_errors, "step {step}");
        assert!(errors.is_empty(), "{errors:?}");
        served += statuses.len();
    }
    assert!(served > 200, "{served} statuses");
    // Most objects are taken as the round before left them.
    assert!(reused > served / 2, "{reused} of {served} taken");
}

#[test]
fn an_object_that_already_shows_the_status_is_current() {
    let templates = compile("loadBalancer:\n  ingress:\n  - ip: 192.0.2.7\n");
    let shown = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}});
    let snapshots = BTreeMap::from([(
        Arc::from("ingresses"),
        snapshot(&[ingress("web", "haproxy", shown)]),
    )]);
    let (statuses, _) = templates.render(&snapshots, &serving(), "2026-01-01T00:00:00Z");
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
    let (statuses, errors) = templates.render(&snapshots, &serving(), "2026-01-01T00:00:00Z");
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
    let (statuses, errors) = templates.render(&snapshots, &serving(), "now");
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
    let (statuses, _) = templates.render(&first, &serving(), "2026-01-01T00:00:00Z");
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
    let (statuses, _) = templates.render(&second, &serving(), "2026-06-01T00:00:00Z");
    assert_eq!(statuses[0].status, written);
    assert!(statuses[0].current);
}

#[test]
fn now_is_rfc3339_in_whole_seconds() {
    let now = now_rfc3339();
    assert_eq!(now.len(), "2026-11-25T01:02:03Z".len(), "{now}");
    assert!(now.ends_with('Z'));
}

// === the `deployment` rule ===

/// A fleet of one instance, `local`, running the render the statuses describe.
fn serving() -> Fleet {
    Fleet::serving(ContentHash::of(b"render"), ["local"])
}

fn snapshots(objects: &[Json]) -> Snapshots {
    Arc::new(BTreeMap::from([(
        Arc::from("ingresses"),
        snapshot(objects),
    )]))
}

fn web(path: &str, status: Json) -> Json {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"namespace": "shop", "name": "web", "resourceVersion": status.to_string()},
        "spec": {"ingressClassName": "haproxy", "rules": [{"http": {"paths": [{"path": path}]}}]},
        "status": status,
    })
}

fn runs(name: &str, hash: &[u8], snapshots: Option<Snapshots>) -> InstanceState {
    InstanceState {
        name: name.to_owned(),
        runs: Some(Running {
            hash: ContentHash::of(hash),
            snapshots,
        }),
        failure: None,
    }
}

/// `deployment` of `web` in `current` (the render `b"new"`) for these instances.
fn deployment_of(current: &Snapshots, instances: Vec<InstanceState>) -> Deployment {
    let fleet = Fleet {
        render: ContentHash::of(b"new"),
        instances,
    };
    let key = ObjectKey::new("shop", "web");
    let stored = current["ingresses"].get_by_key(&key).unwrap();
    fleet.deployment("ingresses", &key, stored)
}

#[test]
fn an_object_is_programmed_only_when_every_instance_runs_its_version() {
    let old = snapshots(&[web("/old", json!({}))]);
    let new = snapshots(&[web("/new", json!({}))]);

    // Both run the new render.
    let both = deployment_of(&new, vec![runs("a", b"new", None), runs("b", b"new", None)]);
    assert!(both.programmed);
    assert_eq!(both.message, "served by all 2 instances");
    assert!(both.waiting.is_empty());

    // b still runs the render before, which had another version of web.
    let lagging = deployment_of(
        &new,
        vec![
            runs("a", b"new", None),
            runs("b", b"old", Some(old.clone())),
        ],
    );
    assert!(!lagging.programmed);
    assert_eq!(lagging.waiting, ["b"]);
    assert_eq!(lagging.instances[1].state, "lagging");
    assert_eq!(
        lagging.message,
        "not yet served by instance b (runs an older config); 1 of 2 instances serve it"
    );

    // b's last attempt failed: named with the error, on one line.
    let mut failing = runs("b", b"old", Some(old.clone()));
    failing.failure = Some(Failure {
        hash: ContentHash::of(b"new"),
        error: "reload failed:\n  [ALERT] bad".to_owned(),
    });
    let failed = deployment_of(&new, vec![runs("a", b"new", None), failing]);
    assert!(!failed.programmed);
    assert_eq!(failed.instances[1].state, "failing");
    assert_eq!(
        failed.message,
        "not yet served by instance b (last deployment failed: reload failed: [ALERT] bad); \
         1 of 2 instances serve it"
    );

    // Nothing deployed to b yet; no instance at all.
    let pending = deployment_of(&new, vec![InstanceState::new("b")]);
    assert_eq!(
        pending.message,
        "not yet served by instance b (nothing deployed yet)"
    );
    let nobody = deployment_of(&new, Vec::new());
    assert!(!nobody.programmed, "no instance serves it");
}

#[test]
fn an_older_render_serves_an_object_it_holds_unchanged() {
    // The object changed only in status and resourceVersion (a status written
    // back): an instance on the older render serves it.
    let old = snapshots(&[web("/same", json!({}))]);
    let new = snapshots(&[web("/same", json!({"loadBalancer": {}}))]);
    let deployment = deployment_of(&new, vec![runs("b", b"old", Some(old.clone()))]);
    assert!(deployment.programmed, "{deployment:?}");
    assert_eq!(deployment.message, "served by instance b");

    // An older render whose snapshots are unknown serves nothing for sure.
    let unknown = deployment_of(&new, vec![runs("b", b"old", None)]);
    assert!(!unknown.programmed);

    // A failure for the very config the instance is believed to run: unknown state.
    let mut restarted = runs("b", b"new", None);
    restarted.failure = Some(Failure {
        hash: ContentHash::of(b"new"),
        error: "what it runs is unknown".to_owned(),
    });
    let restarted = deployment_of(&new, vec![restarted]);
    assert!(!restarted.programmed);
    assert_eq!(restarted.instances[0].state, "failing");
}

#[test]
fn long_errors_are_shortened() {
    let new = snapshots(&[web("/", json!({}))]);
    let mut failing = InstanceState::new("b");
    failing.failure = Some(Failure {
        hash: ContentHash::of(b"new"),
        error: "x".repeat(1000),
    });
    let deployment = deployment_of(&new, vec![failing]);
    let error = deployment.instances[0].error.clone().unwrap();
    assert_eq!(error.chars().count(), 240);
    assert!(error.ends_with('…'));
}

#[test]
fn templates_see_the_deployment() {
    let templates = compile(
        "conditions:\n- type: Programmed\n  status: \"{{ 'True' if deployment.programmed else 'False' }}\"\n  \
         message: {{ deployment.message | tojson }}\n",
    );
    let new = snapshots(&[web("/", json!({}))]);
    let mut failing = runs("b", b"old", None);
    failing.failure = Some(Failure {
        hash: ContentHash::of(b"new"),
        error: "connection refused".to_owned(),
    });
    let fleet = Fleet {
        render: ContentHash::of(b"new"),
        instances: vec![runs("a", b"new", None), failing],
    };
    let (statuses, errors) = templates.render(&new, &fleet, "now");
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(statuses[0].status["conditions"][0]["status"], "False");
    assert_eq!(
        statuses[0].status["conditions"][0]["message"],
        "not yet served by instance b (last deployment failed: connection refused); 1 of 2 \
         instances serve it"
    );
}

#[test]
fn objects_served_differently_see_their_own_deployment() {
    // Instance a runs an older render that holds `api` as it is now and `web` in
    // another version; instance b runs the current render.
    let templates = compile(
        "programmed: {{ deployment.programmed }}\nwaiting: \"{{ deployment.waiting | join(',') }}\"\n",
    );
    let api = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"namespace": "shop", "name": "api"},
        "spec": {"ingressClassName": "haproxy"},
    });
    let new = snapshots(&[api.clone(), web("/new", json!({}))]);
    let old = snapshots(&[api, web("/old", json!({}))]);
    let fleet = Fleet {
        render: ContentHash::of(b"new"),
        instances: vec![runs("a", b"old", Some(old)), runs("b", b"new", None)],
    };
    let (statuses, errors) = templates.render(&new, &fleet, "now");
    assert!(errors.is_empty(), "{errors:?}");
    let status = |name: &str| {
        statuses
            .iter()
            .find(|status| status.name == name)
            .map(|status| status.status.clone())
            .expect("a status")
    };
    assert_eq!(status("api"), json!({"programmed": true, "waiting": ""}));
    assert_eq!(status("web"), json!({"programmed": false, "waiting": "a"}));
}

// === Tracker ===

mod tracker {
    use super::*;
    use hapwright_eventbus::model::{DeployStrategy, Diagnostic as Diag};
    use hapwright_eventbus::{
        DeploymentCompleted, DeploymentStarted, DeploymentSummary, InstanceDeployed,
        InstanceDeploymentFailed, TemplateInputs,
    };
    use std::time::Duration;

    fn inputs(hash: &[u8], snapshots: &Snapshots) -> EventPayload {
        TemplateInputs {
            hash: ContentHash::of(hash),
            snapshots: snapshots.clone(),
        }
        .into()
    }

    fn started(hash: &[u8]) -> EventPayload {
        DeploymentStarted {
            hash: ContentHash::of(hash),
            instances: vec!["a".into(), "b".into()],
        }
        .into()
    }

    fn deployed(instance: &str, hash: &[u8]) -> EventPayload {
        InstanceDeployed {
            instance: instance.into(),
            hash: ContentHash::of(hash),
            strategy: DeployStrategy::Reload,
            reason: None,
            duration: Duration::ZERO,
        }
        .into()
    }

    fn failed(instance: &str, hash: &[u8]) -> EventPayload {
        InstanceDeploymentFailed {
            instance: instance.into(),
            hash: ContentHash::of(hash),
            error: Diag::error("connection refused"),
        }
        .into()
    }

    fn completed(hash: &[u8]) -> EventPayload {
        DeploymentCompleted {
            summary: DeploymentSummary {
                hash: ContentHash::of(hash),
                succeeded: Vec::new(),
                failed: Vec::new(),
                duration: Duration::ZERO,
            },
        }
        .into()
    }

    /// Feeds the static fleet `a`, `b` to a tracker.
    fn tracker() -> Tracker {
        // The scheduler names the static instances (`DeploymentScheduled`).
        Tracker {
            named: ["a".to_owned(), "b".to_owned()].into(),
            ..Tracker::default()
        }
    }

    /// One whole round: the render of `snapshots` deployed to both `a` and `b`.
    fn deploy_everywhere(t: &mut Tracker, hash: &[u8], snapshots: &Snapshots) {
        t.apply(&inputs(hash, snapshots));
        t.apply(&started(hash));
        t.apply(&deployed("a", hash));
        t.apply(&deployed("b", hash));
        t.apply(&completed(hash));
    }

    fn web_deployment(tracker: &Tracker) -> Deployment {
        let (snapshots, fleet) = tracker.job().expect("a render to describe");
        let key = ObjectKey::new("shop", "web");
        let stored = snapshots["ingresses"].get_by_key(&key).unwrap();
        fleet.deployment("ingresses", &key, stored)
    }

    #[test]
    fn a_round_renders_once_and_a_later_retry_renders_again() {
        let mut t = tracker();
        let new = snapshots(&[web("/new", json!({}))]);
        assert!(!t.apply(&inputs(b"new", &new)), "not deployed yet");
        assert!(t.job().is_none());
        assert!(!t.apply(&started(b"new")));
        assert!(!t.apply(&deployed("a", b"new")), "inside a round");
        assert!(!t.apply(&failed("b", b"new")), "inside a round");
        assert!(t.apply(&completed(b"new")), "the round's end renders");
        let deployment = web_deployment(&t);
        assert!(!deployment.programmed);
        assert_eq!(deployment.waiting, ["b"]);
        assert!(
            deployment.message.contains("connection refused"),
            "{deployment:?}"
        );

        // b's retry succeeds outside any round: render again, now programmed.
        assert!(t.apply(&deployed("b", b"new")));
        let deployment = web_deployment(&t);
        assert!(deployment.programmed, "{deployment:?}");
    }

    #[test]
    fn a_round_that_changes_nothing_renders_nothing() {
        let mut t = tracker();
        let new = snapshots(&[web("/new", json!({}))]);
        deploy_everywhere(&mut t, b"new", &new);
        // A drift check: a round of the same render, every instance still on it.
        assert!(!t.apply(&started(b"new")));
        assert!(!t.apply(&deployed("a", b"new")));
        assert!(!t.apply(&deployed("b", b"new")));
        assert!(!t.apply(&completed(b"new")), "nothing changed");
        // A failure, the same failure again, then the recovery.
        assert!(t.apply(&failed("b", b"new")), "b fails");
        assert!(!t.apply(&failed("b", b"new")), "the same failure");
        assert!(t.apply(&deployed("b", b"new")), "b recovers");
    }

    #[test]
    fn an_instance_on_the_previous_render_serves_what_did_not_change() {
        let mut t = tracker();
        let one = snapshots(&[web("/", json!({})), ingress("api", "haproxy", json!({}))]);
        deploy_everywhere(&mut t, b"one", &one);
        assert!(web_deployment(&t).programmed);

        // web changes; b refuses the new render and keeps the old one.
        let two = snapshots(&[web("/v2", json!({})), ingress("api", "haproxy", json!({}))]);
        t.apply(&inputs(b"two", &two));
        t.apply(&started(b"two"));
        t.apply(&deployed("a", b"two"));
        t.apply(&failed("b", b"two"));
        t.apply(&completed(b"two"));
        assert!(!web_deployment(&t).programmed);
        let (snapshots, fleet) = t.job().unwrap();
        let key = ObjectKey::new("shop", "api");
        let api = fleet.deployment(
            "ingresses",
            &key,
            snapshots["ingresses"].get_by_key(&key).unwrap(),
        );
        assert!(api.programmed, "api is the same in both renders: {api:?}");
    }

    #[test]
    fn discovered_instances_join_and_leave_the_fleet() {
        use hapwright_eventbus::InstancesDiscovered;
        use hapwright_eventbus::model::{InstanceDriver, InstanceRef};
        let pods = |names: &[&str]| -> EventPayload {
            InstancesDiscovered {
                source: Arc::from("kubernetes"),
                instances: names
                    .iter()
                    .map(|name| InstanceRef {
                        name: (*name).to_owned(),
                        driver: InstanceDriver::Dataplane,
                        address: String::new(),
                    })
                    .collect(),
            }
            .into()
        };
        let mut t = tracker();
        let one = snapshots(&[web("/", json!({}))]);
        deploy_everywhere(&mut t, b"one", &one);
        assert!(web_deployment(&t).programmed);

        // A new pod: nothing deployed to it yet.
        assert!(t.apply(&pods(&["pod-c"])));
        let deployment = web_deployment(&t);
        assert!(!deployment.programmed);
        assert_eq!(deployment.waiting, ["pod-c"]);
        assert_eq!(deployment.instances[2].state, "pending");

        // It fails, then goes away: it no longer counts, and is forgotten.
        t.apply(&failed("pod-c", b"one"));
        assert!(t.apply(&pods(&[])));
        assert!(web_deployment(&t).programmed);
        assert!(!t.instances.contains_key("pod-c"));
    }

    #[test]
    fn the_same_config_from_newer_data_renders_at_once() {
        let mut t = tracker();
        let one = snapshots(&[web("/", json!({}))]);
        deploy_everywhere(&mut t, b"one", &one);
        let newer = snapshots(&[web("/", json!({"loadBalancer": {}}))]);
        assert!(t.apply(&inputs(b"one", &newer)));
        let (snapshots, _) = t.job().unwrap();
        assert!(Arc::ptr_eq(&snapshots, &newer));
        assert!(web_deployment(&t).programmed);
    }
}

#[test]
fn an_objects_names_are_read_whatever_else_it_holds() {
    let read = |object: Json| {
        let stored = hapwright_eventbus::model::StoredObject::from_value(&object);
        let header = stored
            .deserialize::<Header>()
            .unwrap_or_else(|_| Header::from_value(&stored.parse()));
        (
            header.api_version,
            header.kind,
            header.metadata.namespace,
            header.metadata.name,
        )
    };
    let whole = ingress("web", "haproxy", json!({"loadBalancer": {}}));
    assert_eq!(
        read(whole),
        (
            "networking.k8s.io/v1".to_owned(),
            "Ingress".to_owned(),
            "shop".to_owned(),
            "web".to_owned()
        )
    );
    // Values of other types read as empty, as a whole-object lookup gives them.
    let odd = json!({"apiVersion": 1, "kind": null, "metadata": {"name": "x", "namespace": ["a"]}});
    assert_eq!(
        read(odd),
        (String::new(), String::new(), String::new(), "x".to_owned())
    );
    let no_mapping = json!({"apiVersion": "v1", "kind": "Service", "metadata": "x"});
    assert_eq!(
        read(no_mapping),
        (
            "v1".to_owned(),
            "Service".to_owned(),
            String::new(),
            String::new()
        )
    );
}

#[tokio::test]
async fn status_jobs_run_below_the_pipelines_priority_and_survive_a_panic() {
    let worker = Worker::start();
    let here = rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap();
    let there = worker
        .run(|| rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap())
        .await
        .unwrap();
    assert_eq!(there, (here + Worker::NICE).min(19));
    let crash = worker
        .run(|| -> u32 { panic!("template engine broke") })
        .await;
    assert!(
        crash
            .as_ref()
            .unwrap_err()
            .contains("template engine broke"),
        "{crash:?}"
    );
    // The thread goes on with the next job.
    assert_eq!(worker.run(|| 7).await, Ok(7));
}
