//! Shared by the tests and the benchmark: the realistic routing templates under
//! `testdata/routing/` and a generator of clusters of any size (services, endpoint
//! slices, ingresses and a TLS secret), deterministic for a given size.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use hapwright_eventbus::model::{FieldPath, ObjectKey, ResourceSnapshot};
use hapwright_reconciler::renderer::{Resources, Templates, TemplatingSettings};
use serde_json::{Value, json};

/// The watched resources of the routing example.
pub const WATCHED: [&str; 4] = ["services", "endpoints", "ingresses", "secrets"];

/// Reads `testdata/routing/`: `haproxy.cfg.j2`, `snippets/*.j2`, `maps/*.j2`,
/// `files/*.j2`, `certs/*.j2` (names without `.j2`).
pub fn routing_templates() -> Templates {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/routing");
    let read_dir = |dir: &str| -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for entry in std::fs::read_dir(root.join(dir)).expect("testdata directory") {
            let path = entry.expect("directory entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let name = name.strip_suffix(".j2").unwrap_or(&name).to_owned();
            out.insert(name, std::fs::read_to_string(&path).expect("template file"));
        }
        out
    };
    Templates {
        main: std::fs::read_to_string(root.join("haproxy.cfg.j2")).expect("haproxy.cfg.j2"),
        snippets: read_dir("snippets"),
        maps: read_dir("maps"),
        files: read_dir("files"),
        certificates: read_dir("certs"),
        extra_context: json!({
            "httpPort": 8080,
            "httpsPort": 8443,
            "maxconn": 50000,
            "supportEmail": "ops@example.com",
            "blockedAgents": ["evil.bot/1.0", "scanner (+http://x)"],
        }),
        settings: TemplatingSettings {
            trim_blocks: true,
            lstrip_blocks: true,
            strict_undefined: false,
        },
        ..Templates::default()
    }
}

fn snapshot(index_by: &[&str], objects: impl IntoIterator<Item = Value>) -> Arc<ResourceSnapshot> {
    let mut snap = ResourceSnapshot::new(
        index_by
            .iter()
            .map(|p| FieldPath::parse(p).expect("valid path"))
            .collect(),
    );
    for object in objects {
        let key = ObjectKey::new(
            object["metadata"]["namespace"].as_str().unwrap_or_default(),
            object["metadata"]["name"].as_str().unwrap_or_default(),
        );
        snap.upsert(key, &object);
    }
    Arc::new(snap)
}

/// The snapshots of a cluster with `n` services, by watched resource name.
///
/// Service `i` lives in namespace `team-{i % 10}`, has one endpoint slice with three
/// endpoints (every seventh endpoint is not ready) and one ingress routing
/// `svc-{i}.example.com/` and `/api` to it. Every fifth service has annotations.
/// One TLS secret `default/tls`.
pub fn cluster(n: usize) -> BTreeMap<&'static str, Arc<ResourceSnapshot>> {
    let namespace = |i: usize| format!("team-{}", i % 10);
    let services = (0..n).map(|i| {
        let mut metadata = json!({"namespace": namespace(i), "name": format!("svc-{i}")});
        if i % 5 == 0 {
            metadata["annotations"] = json!({
                "haproxy.org/balance": "leastconn",
                "haproxy.org/timeout-server": "1m",
            });
        }
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata,
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        })
    });
    let endpoints = (0..n).map(|i| {
        let endpoints: Vec<Value> = (0..3)
            .map(|e| {
                let ordinal = i * 3 + e;
                json!({
                    "addresses": [format!("10.{}.{}.{}", ordinal / 65536 % 256, ordinal / 256 % 256, ordinal % 256)],
                    "conditions": {"ready": ordinal % 7 != 6},
                    "targetRef": {"kind": "Pod", "name": format!("svc-{i}-pod-{e}")},
                })
            })
            .collect();
        json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "namespace": namespace(i),
                "name": format!("svc-{i}-abcde"),
                "labels": {"kubernetes.io/service-name": format!("svc-{i}")},
            },
            "endpoints": endpoints,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        })
    });
    let ingresses = (0..n).map(|i| {
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": {"namespace": namespace(i), "name": format!("ing-{i}")},
            "spec": {"rules": [{
                "host": format!("Svc-{i}.Example.com"),
                "http": {"paths": [
                    {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": format!("svc-{i}"), "port": {"number": 80}}}},
                    {"path": "/api", "pathType": "Prefix", "backend": {"service": {"name": format!("svc-{i}"), "port": {"number": 80}}}},
                ]},
            }]},
        })
    });
    let secrets = std::iter::once(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"namespace": "default", "name": "tls"},
        "type": "kubernetes.io/tls",
        // "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n" and a key.
        "data": {
            "tls.crt": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=",
            "tls.key": "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JSUUKLS0tLS1FTkQgUFJJVkFURSBLRVktLS0tLQo=",
        },
    }));
    let mut out = BTreeMap::new();
    out.insert(
        "services",
        snapshot(&["metadata.namespace", "metadata.name"], services),
    );
    out.insert(
        "endpoints",
        snapshot(
            &[
                "metadata.namespace",
                r"metadata.labels.kubernetes\.io/service-name",
            ],
            endpoints,
        ),
    );
    out.insert(
        "ingresses",
        snapshot(&["metadata.namespace", "metadata.name"], ingresses),
    );
    out.insert(
        "secrets",
        snapshot(&["metadata.namespace", "metadata.name"], secrets),
    );
    out
}

/// The template view of [`cluster`]`(n)`.
pub fn resources(n: usize) -> Resources {
    let mut resources = Resources::new();
    for (name, snapshot) in cluster(n) {
        resources.update(&Arc::from(name), snapshot, None);
    }
    resources
}
