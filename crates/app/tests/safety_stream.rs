//! The safety valve against a mass removal that arrives through the Kubernetes source
//! as a stream: 1,000 Services deleted over 5 s, watch event by watch event, from a
//! scripted API server (`tower-test` behind a real `kube::Client`), through the real
//! source, debouncer, renderer, validator (both phases, the real `haproxy -c`) and
//! scheduler. Measured against the high-water mark, the stream is one removal: held
//! whole, and what is scheduled keeps serving every route.

#[path = "../../watchers/tests/kubernetes_mock/mod.rs"]
mod kubernetes_mock;
#[path = "../../deployer/tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use hapwright_app::build;
use hapwright_deployer::component::scheduler::{self, Scheduler};
use hapwright_deployer::component::validator::{self, Validator};
use hapwright_deployer::safety::{self, Memory};
use hapwright_eventbus::model::RenderedConfig;
use hapwright_eventbus::testing::TestBus;
use hapwright_eventbus::{EventKind, EventPayload, SafetyValveHeld, Subscription};
use hapwright_reconciler::debouncer::{self, Debouncer};
use hapwright_reconciler::executor::{self, Executor};
use hapwright_reconciler::renderer::RendererComponent;
use hapwright_watchers::config::Source;
use hapwright_watchers::kubernetes::KubernetesSource;
use kubernetes_mock::{ApiServer, event, list, pair, resource_list};
use serde_json::{Value, json};
use support::counts;
use tokio::time::timeout;

const SERVICES: usize = 1000;
const CONFIG: &str = r#"
watchedResources:
  services:
    kubernetes: { apiVersion: v1, kind: Service }
    indexBy: [metadata.namespace, metadata.name]
haproxyConfig:
  template: |
    defaults
        mode http
        timeout connect 2s
        timeout client 30s
        timeout server 30s
    frontend http
        bind 127.0.0.1:8080
        use_backend %[req.hdr(host),lower,map({{ path("hosts.map") }})]
    {%- for service in resources.services.list() | sort_by("metadata.name") %}
    backend be_{{ service.metadata.name }}
        server s1 {{ service.spec.clusterIP }}:80
    {%- endfor %}
maps:
  hosts.map:
    template: |
      {%- for service in resources.services.list() | sort_by("metadata.name") %}
      {{ service.metadata.name }}.test be_{{ service.metadata.name }}
      {%- endfor %}
controller:
  debounce: 100ms
  maxWait: 1s
  minDeploymentInterval: 200ms
  safety: { maxRemoval: 50%, confirmAfter: 5m }
"#;

fn service(index: usize, resource_version: usize) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": format!("svc{index:04}"),
            "namespace": "tenant",
            "resourceVersion": resource_version.to_string(),
            "uid": format!("uid-{index}"),
        },
        "spec": {"clusterIP": format!("10.1.{}.{}", index / 250, index % 250 + 1)},
    })
}

/// Answers the source's discovery and list with every Service; returns the list's
/// resourceVersion.
async fn list_all(api: &mut ApiServer) -> usize {
    api.expect_get("/api/v1")
        .await
        .respond(200, &resource_list("v1", "services", "Service", true));
    let items: Vec<Value> = (0..SERVICES).map(|i| service(i, i + 1)).collect();
    api.expect_list("/api/v1/services")
        .await
        .respond(200, &list("Service", &SERVICES.to_string(), &items));
    SERVICES
}

/// The last scheduled config once none comes for `quiet`.
async fn last_scheduled(
    scheduled: &mut Subscription,
    quiet: Duration,
) -> Option<Arc<RenderedConfig>> {
    let mut last = None;
    while let Ok(Some(event)) = timeout(quiet, scheduled.recv()).await {
        if let EventPayload::DeploymentScheduled(out) = &event.payload {
            last = Some(out.config.clone());
        }
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_services_deleted_over_five_seconds_are_held_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _) =
        hapwright_app::config::parse(CONFIG, &dir.path().join("hapwright.yaml"), "hapwright.yaml")
            .unwrap_or_else(|errors| panic!("{errors:?}"));
    let (client, mut api) = pair();
    let bus = TestBus::new();
    let registry = bus.registry().clone();
    let mut scheduled = bus.subscribe("test", [EventKind::DeploymentScheduled]);
    let mut valve = bus.subscribe("test-valve", [EventKind::SafetyValveHeld]);
    let kernel = bus.start(|kernel| {
        for (name, resource) in &config.watched_resources.resources {
            assert!(matches!(resource.source(), Some(Source::Kubernetes(_))));
            kernel.register(
                KubernetesSource::new(
                    name,
                    resource,
                    hapwright_watchers::kubernetes::ClientFactory::with_client(client.clone()),
                )
                .unwrap(),
            );
        }
        let debounce = config.controller.debounce();
        kernel.register(Debouncer::new(
            debouncer::Settings {
                debounce: debounce.debounce.get(),
                max_wait: debounce.max_wait.get(),
                leading_edge: debounce.leading_edge,
                ..debouncer::Settings::default()
            },
            build::watched_names(&config),
        ));
        kernel.register(Executor::new(executor::Settings::default()));
        kernel.register(RendererComponent::new(
            build::renderer(&config).unwrap_or_else(|e| panic!("{e:?}")),
        ));
        let mut validator_config = build::validator_config(&config);
        validator_config.scratch_root = Some(dir.path().to_owned());
        kernel.register(Validator::new(
            validator_config,
            validator::Metrics::register(&registry).unwrap(),
        ));
        kernel.register(
            Scheduler::new(
                scheduler::Config::from(&config.controller.deploy_timings()),
                vec!["local".to_owned()],
            )
            .with_safety(config.controller.safety.clone(), Memory::new()),
        );
    });

    let mut version = list_all(&mut api).await;
    let first = last_scheduled(&mut scheduled, Duration::from_secs(5))
        .await
        .expect("the full config is scheduled");
    assert_eq!(counts(&first), (SERVICES, SERVICES, SERVICES));

    // The Services are deleted 20 at a time, every 100 ms, over 5 s: each watch
    // answer carries 20 DELETED events and ends, and the source watches again from
    // the last resourceVersion.
    let mut next = 0;
    while next < SERVICES {
        let watch = api.expect_watch("/api/v1/services").await;
        assert_eq!(watch.param("resourceVersion"), Some(&*version.to_string()));
        let events: Vec<Value> = (next..next + 20)
            .map(|i| {
                version += 1;
                event("DELETED", &service(i, version))
            })
            .collect();
        watch.respond_events(&events);
        next += 20;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The source watches on; the stream is over.
    let idle = api.expect_watch("/api/v1/services").await;
    api.hold(idle);

    // Once the last deletion is rendered, the valve holds all of them at once ...
    let held: SafetyValveHeld = timeout(Duration::from_secs(300), async {
        loop {
            let event = valve.recv().await.expect("bus open");
            if let EventPayload::SafetyValveHeld(held) = &event.payload
                && held.removal.backends.removed == SERVICES
            {
                return held.clone();
            }
        }
    })
    .await
    .expect("the valve holds the whole removal");
    assert_eq!(held.removal.backends.total, SERVICES);
    assert_eq!(held.removal.map_entries.removed, SERVICES);
    // ... and whatever the first renders of the stream let out, what is scheduled
    // then serves every route again, and nothing after it takes them away.
    let out = timeout(Duration::from_secs(300), async {
        loop {
            let event = scheduled.recv().await.expect("bus open");
            if let EventPayload::DeploymentScheduled(out) = &event.payload
                && counts(&out.config) == (SERVICES, SERVICES, SERVICES)
            {
                return out.config.clone();
            }
        }
    })
    .await
    .expect("the kept config is scheduled");
    assert!(out.main().contains(safety::KEPT_HEADER));
    if let Some(later) = last_scheduled(&mut scheduled, Duration::from_secs(3)).await {
        assert_eq!(counts(&later), (SERVICES, SERVICES, SERVICES));
    }
    kernel.shutdown(Duration::from_secs(5)).await;
}
