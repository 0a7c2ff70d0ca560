//! Honest status end to end inside one controller iteration's bus: the real deployer
//! deploys to two real HAProxy 2.6 processes, one of them stopped; the status written
//! to a scripted Kubernetes API server (`tower-test` behind a real `kube::Client`)
//! says the route is not programmed and names the stopped instance with its error,
//! and once that instance is back and the deployer's retry reaches it, the status
//! says programmed.

#[path = "../../watchers/tests/kubernetes_mock/mod.rs"]
mod kubernetes_mock;
#[path = "../../deployer/tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::Driver;
use hapwright_deployer::component::deployer::{Config, Deployer, LastDeployedStore};
use hapwright_deployer::driver::SocketDriver;
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::model::{FieldPath, ObjectKey, RenderedConfig, ResourceSnapshot};
use hapwright_eventbus::testing::{self, TestBus};
use hapwright_eventbus::{DeploymentScheduled, TemplateInputs};
use hapwright_reconciler::renderer::Templates;
use hapwright_reconciler::status::{StatusComponent, StatusTemplates};
use hapwright_watchers::kubernetes::{ClientFactory, StatusMetrics, StatusWriter, WatchedKind};
use kubernetes_mock::{ApiServer, pair, resource_list};
use serde_json::{Value, json};
use support::{Haproxy, rendered};

/// The route's status: one parent with hapwright's Programmed condition, from
/// `deployment`.
const TEMPLATE: &str = r#"
parents:
- parentRef: {name: edge}
  controllerName: hapwright.io/gateway-controller
  conditions:
  - type: hapwright.io/Programmed
    status: "{{ 'True' if deployment.programmed else 'False' }}"
    reason: "{{ 'Programmed' if deployment.programmed else 'Pending' }}"
    message: {{ deployment.message | tojson }}
    waiting: {{ deployment.waiting | tojson }}
"#;

/// A config each instance can run: its frontend binds a unix socket in the
/// instance's own directory, so the two do not compete for a port.
fn config(extra: &str) -> Arc<RenderedConfig> {
    rendered(
        &format!(
            "global\n    stats timeout 30s\n\ndefaults\n    mode http\n    timeout connect 2s\n    \
             timeout client 10s\n    timeout server 10s\n\nfrontend fe_main\n    bind unix@fe.sock\n    \
             default_backend be_app\n{extra}\nbackend be_app\n    server s1 127.0.0.1:9\n"
        ),
        &[],
    )
}

fn route_snapshot() -> Arc<BTreeMap<Arc<str>, Arc<ResourceSnapshot>>> {
    let mut snapshot = ResourceSnapshot::new(
        ["metadata.namespace", "metadata.name"]
            .into_iter()
            .map(|p| FieldPath::parse(p).unwrap())
            .collect(),
    );
    snapshot.upsert(
        ObjectKey::new("shop", "storefront"),
        &json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"namespace": "shop", "name": "storefront", "generation": 1},
            "spec": {"parentRefs": [{"name": "edge"}]},
        }),
    );
    Arc::new(BTreeMap::from([(
        Arc::from("httproutes"),
        Arc::new(snapshot),
    )]))
}

/// The condition of the next status patch (discovery of the kind answered first),
/// answered with 200.
async fn next_condition(api: &mut ApiServer, discovered: &mut bool) -> Value {
    if !*discovered {
        api.expect_get("/apis/gateway.networking.k8s.io/v1")
            .await
            .respond(
                200,
                &resource_list(
                    "gateway.networking.k8s.io/v1",
                    "httproutes",
                    "HTTPRoute",
                    true,
                ),
            );
        *discovered = true;
    }
    let exchange = api.next().await;
    assert_eq!(exchange.method, http::Method::PATCH, "{exchange:?}");
    assert_eq!(
        exchange.path,
        "/apis/gateway.networking.k8s.io/v1/namespaces/shop/httproutes/storefront/status"
    );
    let body = exchange.json();
    exchange.respond(200, &body);
    body["status"]["parents"][0]["conditions"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_is_programmed_only_once_every_instance_serves_it() {
    let boot = config("");
    let serving = Haproxy::start("haproxy-0", &boot, "boot").await;
    let mut stopped = Haproxy::start("haproxy-1", &boot, "boot").await;
    // haproxy-1 refuses every deployment: nothing answers on its master socket.
    stopped.kill();

    let metrics = Metrics::unregistered().unwrap();
    let drivers: BTreeMap<String, Arc<dyn Driver>> = [&serving, &stopped]
        .into_iter()
        .map(|h| {
            (
                h.instance.name.clone(),
                Arc::new(SocketDriver::new(h.instance.clone(), None, metrics.clone()))
                    as Arc<dyn Driver>,
            )
        })
        .collect();
    let deployer = Deployer::with_drivers(
        Config {
            deployment_timeout: Duration::from_secs(20),
            min_reload_interval: Duration::from_millis(50),
            min_retry_delay: Duration::from_millis(100),
            max_retry_delay: Duration::from_millis(400),
            ..Config::default()
        },
        drivers,
        LastDeployedStore::new(),
        None,
        metrics,
    );
    let status = StatusTemplates::new(
        &Templates::new("global\n"),
        &BTreeMap::from([("httproutes".to_owned(), TEMPLATE.to_owned())]),
        &["httproutes"],
    )
    .unwrap();
    let (client, mut api) = pair();
    let bus = TestBus::new();
    let publisher = bus.publisher();
    let kernel = bus.start(|kernel| {
        kernel.register(deployer);
        kernel.register(StatusComponent::new(status).with_clock(|| "2026-01-01T00:00:00Z".into()));
        kernel.register(StatusWriter::new(
            ClientFactory::with_client(client),
            [(
                Arc::from("httproutes"),
                WatchedKind {
                    api_version: "gateway.networking.k8s.io/v1".into(),
                    kind: "HTTPRoute".into(),
                },
            )],
            StatusMetrics::unregistered().unwrap(),
        ));
    });

    // The render that adds the route goes to both instances.
    let v1 = config("    http-request set-header x-route storefront\n");
    publisher.publish(TemplateInputs {
        hash: v1.hash(),
        snapshots: route_snapshot(),
    });
    publisher.publish(DeploymentScheduled {
        model: hapwright_eventbus::model::haproxy::parse_main(&v1).unwrap(),
        config: v1.clone(),
        instances: vec!["haproxy-0".into(), "haproxy-1".into()],
        drift_check: false,
    });

    // haproxy-0 took it, haproxy-1 did not: not programmed, haproxy-1 named with
    // why.
    let mut discovered = false;
    let pending = next_condition(&mut api, &mut discovered).await;
    assert_eq!(pending["status"], "False", "{pending}");
    assert_eq!(pending["reason"], "Pending", "{pending}");
    assert_eq!(pending["waiting"], json!(["haproxy-1"]), "{pending}");
    let message = pending["message"].as_str().unwrap();
    assert!(
        message.starts_with("not yet served by instance haproxy-1 (last deployment failed: ")
            && message.ends_with("; 1 of 2 instances serve it"),
        "{message}"
    );

    // haproxy-1 comes back; the deployer's retry reaches it and the status flips.
    // Retries failing before that may rewrite the message; every write until the
    // flip still names haproxy-1.
    stopped.restart().await;
    let programmed = loop {
        let condition = next_condition(&mut api, &mut discovered).await;
        if condition["status"] == "True" {
            break condition;
        }
        assert_eq!(condition["waiting"], json!(["haproxy-1"]), "{condition}");
    };
    assert_eq!(programmed["reason"], "Programmed");
    assert_eq!(programmed["message"], "served by all 2 instances");
    assert_eq!(programmed["waiting"], json!([]));
    testing::stop(kernel).await;
}
