use std::time::Duration;

use hapwright_eventbus::model::{InstanceDriver, InstanceRef, ReloadReason};
use hapwright_eventbus::{
    Bus, DeploymentCompleted, DeploymentSummary, EventId, InstanceDeployed,
    InstanceDeploymentFailed, InstancesDiscovered, Kernel, ReconciliationCompleted,
    ReconciliationFailed, ReconciliationStarted, ResourceSyncComplete, TemplateRenderFailed,
    TemplateRendered, ValidationCompleted,
};

use super::*;

pub(crate) fn event(
    id: u64,
    correlation: Option<CorrelationId>,
    payload: impl Into<EventPayload>,
) -> Event {
    Event {
        id: EventId(id),
        correlation_id: correlation,
        caused_by: None,
        at: tokio::time::Instant::now(),
        unix_micros: 1_700_000_000_000_000 + id * 1000,
        payload: payload.into(),
    }
}

pub(crate) fn rendered() -> Arc<RenderedConfig> {
    Arc::new(
        RenderedConfig::builder("global\n")
            .file(
                "inline.pem",
                "before\n-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\nafter\n",
            )
            .certificate(
                "site.pem",
                "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n",
            )
            .build(),
    )
}

#[test]
fn reconciliations_are_tracked_with_stage_timings_and_metrics() {
    let registry = Registry::new();
    let metrics = StatusMetrics::register(&registry).unwrap();
    let store = StatusStore::default();
    let ok = CorrelationId::new();
    let bad = CorrelationId::new();
    store.apply(
        &event(
            1,
            Some(ok),
            ReconciliationStarted {
                reason: "resources changed: services".into(),
                follow_up: false,
            },
        ),
        Some(&metrics),
    );
    store.apply(
        &event(
            2,
            Some(ok),
            ReconciliationCompleted {
                duration: Duration::from_millis(40),
                stages: vec![
                    (Stage::Render, Duration::from_millis(3)),
                    (Stage::Validate, Duration::from_millis(30)),
                ],
            },
        ),
        Some(&metrics),
    );
    store.apply(
        &event(
            3,
            Some(bad),
            ReconciliationStarted {
                reason: "drift".into(),
                follow_up: false,
            },
        ),
        Some(&metrics),
    );
    store.apply(
        &event(
            4,
            Some(bad),
            ReconciliationFailed {
                stage: Stage::Render,
                errors: vec![Diagnostic::error("boom")],
            },
        ),
        Some(&metrics),
    );
    let records = store.reconciliations();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].correlation_id, bad, "newest first");
    assert_eq!(records[0].result, "failure");
    assert_eq!(records[0].failed_stage, Some(Stage::Render));
    assert_eq!(records[1].result, "success");
    assert_eq!(records[1].stages["render"], 0.003);
    assert_eq!(records[1].duration, Some(0.04));
    let count = |result: &str| metrics.reconciliations.with_label_values(&[result]).get();
    assert_eq!(count("success"), 1);
    assert_eq!(count("failure"), 1);
    assert_eq!(metrics.reconciliation_duration.get_sample_count(), 1);
}

#[test]
fn the_reconciliation_ring_is_bounded() {
    let store = StatusStore::default();
    for i in 0..(RECONCILIATION_RING as u64 + 10) {
        store.apply(
            &event(
                i,
                Some(CorrelationId::new()),
                ReconciliationStarted {
                    reason: i.to_string(),
                    follow_up: false,
                },
            ),
            None,
        );
    }
    let records = store.reconciliations();
    assert_eq!(records.len(), RECONCILIATION_RING);
    assert_eq!(
        records[0].reason,
        (RECONCILIATION_RING as u64 + 9).to_string()
    );
}

#[test]
fn instances_readiness_and_errors() {
    let store = StatusStore::default();
    assert!(!store.ready());
    let hash = rendered().hash();
    store.apply(
        &event(
            1,
            None,
            InstanceDeploymentFailed {
                instance: "edge-2".into(),
                hash,
                error: Diagnostic::error("connection refused"),
            },
        ),
        None,
    );
    assert!(
        !store.ready(),
        "a failure does not make the controller ready"
    );
    store.apply(
        &event(
            2,
            None,
            InstanceDeployed {
                instance: "local".into(),
                hash,
                strategy: DeployStrategy::Reload,
                reason: Some(DeployReason {
                    reload: Some(ReloadReason::FirstDeploy),
                    detail: "first deployment".into(),
                }),
                duration: Duration::from_millis(80),
            },
        ),
        None,
    );
    // One instance took a config: ready, naming edge-2 whose last attempt failed.
    match store.readiness() {
        Readiness::Ready { failing } => {
            assert_eq!(failing.len(), 1);
            assert_eq!(failing[0].instance, "edge-2");
            assert!(
                failing[0].error.contains("connection refused"),
                "{failing:?}"
            );
        }
        Readiness::NotReady { reason, .. } => panic!("local serves: {reason}"),
    }
    let instances = store.instances();
    assert_eq!(instances.len(), 2);
    assert_eq!(instances[0].name, "edge-2");
    assert_eq!(
        instances[0].last_error.as_ref().unwrap().message,
        "connection refused"
    );
    assert_eq!(instances[1].reloads, 1);
    assert_eq!(instances[1].last_strategy, Some(DeployStrategy::Reload));
    assert_eq!(instances[1].last_hash, Some(hash));
}

#[test]
fn the_last_pipeline_error_is_kept_until_a_render_validates() {
    let store = StatusStore::default();
    let error = Diagnostic::error("unknown keyword 'bnd'");
    store.apply(
        &event(
            1,
            None,
            TemplateRenderFailed {
                errors: vec![error.clone()],
            },
        ),
        None,
    );
    assert_eq!(store.last_error().unwrap().stage, "render");
    let config = rendered();
    store.apply(
        &event(
            2,
            None,
            TemplateRendered {
                config: config.clone(),
                duration: Duration::from_millis(1),
                render: Default::default(),
            },
        ),
        None,
    );
    assert!(
        store.last_error().is_some(),
        "rendering alone does not clear it"
    );
    assert_eq!(store.rendered().unwrap().hash(), config.hash());
    store.apply(
        &event(
            3,
            None,
            ValidationCompleted {
                model: Default::default(),
                config,
                duration: Duration::from_millis(50),
                warnings: vec![],
                phase2_skipped: None,
            },
        ),
        None,
    );
    assert!(store.last_error().is_none());
}

#[test]
fn the_event_ring_keeps_the_newest_and_filters_by_correlation() {
    let store = StatusStore::default();
    let wanted = CorrelationId::new();
    for i in 0..(EVENT_RING as u64 + 5) {
        let correlation = (i % 2 == 0).then_some(wanted);
        store.remember_event(Arc::new(event(
            i,
            correlation,
            ReconciliationStarted {
                reason: String::new(),
                follow_up: false,
            },
        )));
    }
    let all = store.events(usize::MAX, None);
    assert_eq!(all.len(), EVENT_RING);
    assert_eq!(all.last().unwrap().id, EventId(EVENT_RING as u64 + 4));
    let last_three = store.events(3, Some(wanted));
    assert_eq!(
        last_three.iter().map(|e| e.id.0).collect::<Vec<_>>(),
        [
            EVENT_RING as u64,
            EVENT_RING as u64 + 2,
            EVENT_RING as u64 + 4
        ]
    );
}

#[test]
fn watched_objects_are_exported_per_resource_and_under_the_deprecated_name() {
    use hapwright_eventbus::ResourceIndexUpdated;
    use hapwright_eventbus::model::{ObjectKey, ResourceChange};
    let registry = Registry::new();
    let metrics = StatusMetrics::register(&registry).unwrap();
    let store = StatusStore::default();
    let mut snapshot = ResourceSnapshot::new(vec![]);
    for name in ["a", "b", "c"] {
        snapshot.upsert(ObjectKey::new("default", name), &serde_json::json!({}));
    }
    store.apply(
        &event(
            1,
            None,
            ResourceIndexUpdated {
                source: "services".into(),
                snapshot: Arc::new(snapshot),
                change: Arc::new(ResourceChange::default()),
            },
        ),
        Some(&metrics),
    );
    assert_eq!(
        metrics
            .watched_objects
            .with_label_values(&["services"])
            .get(),
        3
    );
    assert_eq!(metrics.resources.with_label_values(&["services"]).get(), 3);
    let help = |name: &str| {
        registry
            .gather()
            .into_iter()
            .find(|family| family.name() == name)
            .map(|family| family.help().to_owned())
            .unwrap_or_default()
    };
    assert!(
        help("hapwright_resources").starts_with("Deprecated"),
        "{}",
        help("hapwright_resources")
    );
    assert_eq!(store.resource_names(), ["services"]);
}

fn deployed(id: u64, instance: &str) -> Event {
    event(
        id,
        None,
        InstanceDeployed {
            instance: instance.into(),
            hash: rendered().hash(),
            strategy: DeployStrategy::Runtime,
            reason: None,
            duration: Duration::from_millis(2),
        },
    )
}

fn failed(id: u64, instance: &str, error: &str) -> Event {
    event(
        id,
        None,
        InstanceDeploymentFailed {
            instance: instance.into(),
            hash: rendered().hash(),
            error: Diagnostic::error(error),
        },
    )
}

fn failing_names(store: &StatusStore) -> Vec<String> {
    store
        .readiness()
        .failing()
        .iter()
        .map(|f| f.instance.clone())
        .collect()
}

#[test]
fn readiness_stays_while_instances_fail_and_names_them() {
    let store = StatusStore::default();
    store.set_static_instances(["a".to_owned(), "b".to_owned()]);
    store.apply(&deployed(1, "a"), None);
    store.apply(&deployed(2, "b"), None);
    assert_eq!(store.readiness(), Readiness::Ready { failing: vec![] });

    // b's next attempt fails: b serves its last good config, so still ready, naming
    // b and its error.
    store.apply(&failed(3, "b", "master CLI refused the connection"), None);
    assert_eq!(failing_names(&store), ["b"]);
    let Readiness::Ready { failing } = store.readiness() else {
        panic!("a failed attempt does not take readiness away")
    };
    assert!(
        failing[0].error.contains("master CLI refused"),
        "{failing:?}"
    );

    // It succeeds again: nothing failing.
    store.apply(&deployed(4, "b"), None);
    assert_eq!(store.readiness(), Readiness::Ready { failing: vec![] });

    // A summary never overrides a newer per-instance outcome; it only fills gaps.
    store.apply(&failed(5, "a", "reload failed"), None);
    store.apply(
        &event(
            6,
            None,
            DeploymentCompleted {
                summary: DeploymentSummary {
                    hash: rendered().hash(),
                    succeeded: vec!["b".into()],
                    failed: vec!["c".into()],
                    duration: Duration::from_millis(5),
                },
            },
        ),
        None,
    );
    // c is not configured (nor discovered), so it does not count.
    assert_eq!(failing_names(&store), ["a"]);

    // An instance removed from the config is no longer listed.
    store.set_static_instances(["b".to_owned()]);
    assert_eq!(store.readiness(), Readiness::Ready { failing: vec![] });
}

#[test]
fn discovered_instances_count_until_discovery_drops_them() {
    let store = StatusStore::default();
    store.set_static_instances([]);
    let discover = |id, names: &[&str]| {
        event(
            id,
            None,
            InstancesDiscovered {
                source: "kubernetes".into(),
                instances: names
                    .iter()
                    .map(|name| InstanceRef {
                        name: (*name).to_owned(),
                        driver: InstanceDriver::Dataplane,
                        address: format!("http://{name}:5555"),
                    })
                    .collect(),
            },
        )
    };
    store.apply(&discover(1, &["pod-a", "pod-b"]), None);
    store.apply(&deployed(2, "pod-a"), None);
    store.apply(&failed(3, "pod-b", "connection refused"), None);
    assert_eq!(failing_names(&store), ["pod-b"]);
    store.apply(&discover(4, &["pod-a"]), None);
    assert_eq!(store.readiness(), Readiness::Ready { failing: vec![] });
}

#[test]
fn readiness_waits_for_the_first_success() {
    let store = StatusStore::default();
    store.apply(&failed(1, "a", "connection refused"), None);
    let Readiness::NotReady { reason, failing } = store.readiness() else {
        panic!("nothing succeeded yet");
    };
    assert_eq!(
        reason,
        "no deployment has succeeded on any instance yet (failing: a)"
    );
    assert_eq!(failing.len(), 1);
}

/// Replicas answer webhook reviews from their watched resources, so a pod is ready
/// only once every watched resource finished its first sync, and a deployment
/// succeeded; from then on readiness stays, also across a config that adds a
/// resource that has not synced yet.
#[test]
fn readiness_waits_for_every_watched_resource_to_sync_once() {
    let synced = |id, source: &str| {
        event(
            id,
            None,
            ResourceSyncComplete {
                source: source.into(),
            },
        )
    };
    let store = StatusStore::default();
    store.set_watched_resources(["ingresses".to_owned(), "services".to_owned()]);
    store.apply(&synced(1, "services"), None);
    store.apply(&deployed(2, "a"), None);
    let Readiness::NotReady { reason, .. } = store.readiness() else {
        panic!("ingresses has not synced");
    };
    assert_eq!(
        reason,
        "waiting for the first sync of watched resource ingresses"
    );
    store.apply(&synced(3, "ingresses"), None);
    assert!(store.ready());
    let since = store.ready_since().expect("ready");

    // A reloaded config adds a resource: readiness stays.
    store.set_watched_resources(["ingresses".to_owned(), "gateways".to_owned()]);
    store.apply(&failed(4, "a", "reload failed"), None);
    assert!(store.ready());
    assert_eq!(store.ready_since(), Some(since));
}

/// A mandatory component that keeps failing right after each restart is judged from
/// its first failure; a recovery clears that; `0s` turns the check off.
#[tokio::test]
async fn liveness_counts_a_run_of_restarts_as_one_outage() {
    struct Quits;
    #[async_trait::async_trait]
    impl Component for Quits {
        fn name(&self) -> &str {
            "renderer"
        }
        async fn run(self: Box<Self>, _ctx: Context) -> Result<(), ComponentError> {
            Err("template cache corrupted".into())
        }
    }
    let store = StatusStore::default();
    store.set_liveness_grace(Duration::from_secs(60));
    let start = |store: &StatusStore| {
        let bus = Bus::new(
            hapwright_eventbus::BusConfig::default(),
            &hapwright_eventbus::BusMetrics::register(&Registry::new()).unwrap(),
        );
        let mut kernel = Kernel::new(bus);
        kernel.register(Quits);
        store.set_health(kernel.health());
        kernel.start().unwrap()
    };
    let mut first = start(&store);
    first.failed().await;
    store.component_failed("renderer");
    let now = SystemTime::now();
    assert_eq!(store.liveness_at(now), Liveness::Live);
    let Liveness::NotLive(dead) = store.liveness_at(now + Duration::from_secs(61)) else {
        panic!("exited for longer than the grace");
    };
    assert_eq!(dead[0].component, "renderer");
    assert_eq!(dead[0].state, HealthState::Exited);
    assert_eq!(
        dead[0].reason.as_deref(),
        Some("failed: template cache corrupted")
    );
    first.shutdown(Duration::from_secs(1)).await;

    // The rebuilt iteration fails again: still one outage, dated from the first.
    let mut second = start(&store);
    second.failed().await;
    store.component_failed("renderer");
    let Liveness::NotLive(dead) = store.liveness_at(now + Duration::from_secs(61)) else {
        panic!("the restart does not reset the outage");
    };
    assert!((dead[0].since - unix_seconds(now)).abs() < 1.0, "{dead:?}");

    store.set_liveness_grace(Duration::ZERO);
    assert_eq!(
        store.liveness_at(now + Duration::from_secs(3600)),
        Liveness::Live
    );
    store.set_liveness_grace(Duration::from_secs(60));
    store.components_recovered();
    assert_eq!(
        store.liveness_at(now + Duration::from_secs(30)),
        Liveness::Live,
        "after a recovery only the current exit counts"
    );
    second.shutdown(Duration::from_secs(1)).await;
    assert_eq!(
        store.liveness_at(now + Duration::from_secs(3600)),
        Liveness::Live,
        "a stopped iteration is not a failure"
    );
}

#[test]
fn reconciliations_fill_schedule_and_deploy_timings_when_the_deployment_ends() {
    use hapwright_eventbus::DeploymentScheduled;
    let store = StatusStore::default();
    let id = CorrelationId::new();
    store.apply(
        &event(
            1,
            Some(id),
            ReconciliationStarted {
                reason: "resources changed: services".into(),
                follow_up: false,
            },
        ),
        None,
    );
    store.apply(
        &event(
            2,
            Some(id),
            ReconciliationCompleted {
                duration: Duration::from_millis(1),
                stages: vec![
                    (Stage::Render, Duration::from_millis(1)),
                    (Stage::Validate, Duration::ZERO),
                ],
            },
        ),
        None,
    );
    // The scheduler lets it go 3 ms after validation (event times are 1 ms apart).
    store.apply(
        &event(
            5,
            Some(id),
            DeploymentScheduled {
                model: Default::default(),
                config: rendered(),
                instances: vec!["a".into()],
                drift_check: false,
            },
        ),
        None,
    );
    store.apply(
        &event(
            9,
            Some(id),
            DeploymentCompleted {
                summary: DeploymentSummary {
                    hash: rendered().hash(),
                    succeeded: vec!["a".into()],
                    failed: vec![],
                    duration: Duration::from_millis(40),
                },
            },
        ),
        None,
    );
    let record = &store.reconciliations()[0];
    let ms = |stage: &str| record.stages.get(stage).map(|s| (s * 1000.0).round());
    assert_eq!(ms("schedule"), Some(3.0), "{:?}", record.stages);
    assert_eq!(ms("deploy"), Some(40.0), "{:?}", record.stages);
}

#[test]
fn render_errors_name_the_config_file_line_of_inline_templates() {
    let text = "haproxyConfig:\n  template: |\n    global\n    {{ x | uper }}\n";
    let (config, _) = crate::config::parse(
        text,
        std::path::Path::new("/nonexistent/hapwright.yaml"),
        "hapwright.yaml",
    )
    .unwrap();
    let store = StatusStore::default();
    store.set_template_places(crate::config::TemplatePlaces::new(
        text,
        "hapwright.yaml",
        &config,
    ));
    let error = Diagnostic::error("unknown filter `uper`").at(
        hapwright_eventbus::model::SourceLocation::new("haproxy.cfg", Some(2), Some(8)),
    );
    store.apply(
        &event(
            1,
            None,
            TemplateRenderFailed {
                errors: vec![error],
            },
        ),
        None,
    );
    assert_eq!(
        store.last_error().unwrap().errors[0].to_string(),
        "hapwright.yaml:4:12 (haproxy.cfg line 2): unknown filter `uper`"
    );
}

#[test]
fn the_reconciliation_table_says_how_the_templates_rendered() {
    use hapwright_eventbus::model::RenderSummary;
    let registry = Registry::new();
    let metrics = StatusMetrics::register(&registry).unwrap();
    let store = StatusStore::default();
    let renders = [
        RenderSummary {
            rendered: 5,
            reused: 0,
            full_reason: Some("first render".into()),
        },
        RenderSummary {
            rendered: 1,
            reused: 4,
            full_reason: None,
        },
    ];
    for (i, render) in renders.into_iter().enumerate() {
        let correlation = CorrelationId::new();
        let id = 10 * i as u64;
        store.apply(
            &event(
                id + 1,
                Some(correlation),
                ReconciliationStarted {
                    reason: "resources changed: services".into(),
                    follow_up: false,
                },
            ),
            Some(&metrics),
        );
        store.apply(
            &event(
                id + 2,
                Some(correlation),
                TemplateRendered {
                    config: rendered(),
                    duration: Duration::from_millis(2),
                    render,
                },
            ),
            Some(&metrics),
        );
    }
    let records = store.reconciliations();
    assert_eq!(records[0].render_mode.as_deref(), Some("incremental"));
    assert_eq!(
        records[1].render_mode.as_deref(),
        Some("full, because first render")
    );
    let fragments = |result: &str| metrics.render_fragments.with_label_values(&[result]).get();
    assert_eq!((fragments("rendered"), fragments("reused")), (6, 4));
    let page = crate::status_page::render(&store).expect("the page renders");
    assert!(page.contains("<td>incremental</td>"), "{page}");
    assert!(
        page.contains("<td>full, because first render</td>"),
        "{page}"
    );
}

/// With leader election, a standby replica deploys nothing: it is ready once its
/// sources synced and a render validated, so the webhook Service and the disruption
/// budget count it.
#[test]
fn a_standby_replica_is_ready_once_a_render_validates() {
    let store = StatusStore::default();
    let (leads, leader) = tokio::sync::watch::channel(false);
    store.set_leadership(leader);
    store.set_watched_resources(["ingresses".to_owned()]);
    store.apply(
        &event(
            1,
            None,
            ResourceSyncComplete {
                source: "ingresses".into(),
            },
        ),
        None,
    );
    let Readiness::NotReady { reason, .. } = store.readiness() else {
        panic!("nothing validated yet");
    };
    assert_eq!(
        reason,
        "standby replica: no render has passed validation yet"
    );
    store.apply(
        &event(
            2,
            None,
            ValidationCompleted {
                config: rendered(),
                duration: Duration::from_millis(50),
                warnings: vec![],
                model: Default::default(),
                phase2_skipped: None,
            },
        ),
        None,
    );
    assert!(store.ready());

    // The leader's replica needs a deployment, not only a validated render.
    let store = StatusStore::default();
    let (_leads, leader) = tokio::sync::watch::channel(true);
    store.set_leadership(leader);
    store.set_watched_resources([]);
    store.apply(
        &event(
            1,
            None,
            ValidationCompleted {
                config: rendered(),
                duration: Duration::from_millis(50),
                warnings: vec![],
                model: Default::default(),
                phase2_skipped: None,
            },
        ),
        None,
    );
    assert!(!store.ready());
    store.apply(&deployed(2, "a"), None);
    assert!(store.ready());
    drop(leads);
}
