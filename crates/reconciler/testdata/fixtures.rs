//! Shared by the tests and the benchmark: the realistic routing templates under
//! `testdata/routing/` and clusters of any size (services, endpoint slices, ingresses
//! and a TLS secret) from the crate's [`synthetic`] generator, as snapshots.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use hapwright_eventbus::model::{FieldPath, ObjectKey, ResourceSnapshot};
use hapwright_reconciler::renderer::{Resources, Templates, TemplatingSettings};
use hapwright_reconciler::synthetic;
use serde_json::{Value, json};

/// The renderer benchmark's cluster: no host annotation, no `addressType`, and a
/// placeholder certificate
/// (`-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n` and a key).
pub const SHAPE: synthetic::Shape = synthetic::Shape {
    host_annotation: false,
    address_type: false,
    tls_crt: "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=",
    tls_key: "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JSUUKLS0tLS1FTkQgUFJJVkFURSBLRVktLS0tLQo=",
};

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
        sets: Vec::new(),
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

/// A snapshot of `objects` (keyed by namespace and name) indexed by `index_by`.
pub fn snapshot(
    index_by: &[&str],
    objects: impl IntoIterator<Item = Value>,
) -> Arc<ResourceSnapshot> {
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

/// The snapshots of a cluster with `n` services, by watched resource name: the
/// [`synthetic`] cluster in the renderer benchmark's [`SHAPE`].
pub fn cluster(n: usize) -> BTreeMap<&'static str, Arc<ResourceSnapshot>> {
    let objects = |kind: &str| synthetic::objects(kind, n, &SHAPE);
    let services = objects("Service");
    let endpoints = objects("EndpointSlice");
    let ingresses = objects("Ingress");
    let secrets = objects("Secret");
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

/// The endpoint change the incremental benchmarks apply to [`cluster`]`(n)`: the
/// slice in the middle with its first endpoint no longer ready. Returns the changed
/// `endpoints` snapshot and the change report that leads to it.
pub fn one_endpoint_change(
    cluster: &BTreeMap<&'static str, Arc<ResourceSnapshot>>,
    n: usize,
) -> (
    Arc<ResourceSnapshot>,
    hapwright_eventbus::model::ResourceChange,
) {
    let mut snapshot = (**cluster.get("endpoints").expect("endpoints")).clone();
    let key = snapshot
        .iter()
        .map(|(k, _)| k.clone())
        .nth(n / 2)
        .expect("a slice");
    let mut slice = snapshot.get_by_key(&key).expect("exists").parse();
    slice["endpoints"][0]["conditions"]["ready"] = json!(false);
    snapshot.upsert(key.clone(), &slice);
    let change = hapwright_eventbus::model::ResourceChange {
        modified: vec![ObjectKey::new(key.namespace.clone(), key.name.clone())],
        ..Default::default()
    };
    (Arc::new(snapshot), change)
}

/// One new service of [`cluster`]`(n)`: the service in the middle (`svc-{n/2}`) with
/// its endpoint slice and ingress. Returns, per watched resource it touches, the
/// snapshot without the service's object and the key of that object (the snapshots of
/// `cluster` have it: adding it back is the change).
pub fn one_service_removed(
    cluster: &BTreeMap<&'static str, Arc<ResourceSnapshot>>,
    n: usize,
) -> Vec<(&'static str, Arc<ResourceSnapshot>, ObjectKey)> {
    let i = n / 2;
    let namespace = format!("team-{}", i % 10);
    [
        ("services", format!("svc-{i}")),
        ("endpoints", format!("svc-{i}-abcde")),
        ("ingresses", format!("ing-{i}")),
    ]
    .into_iter()
    .map(|(resource, name)| {
        let key = ObjectKey::new(namespace.clone(), name);
        let mut snapshot = (**cluster.get(resource).expect("watched")).clone();
        snapshot
            .remove(&key)
            .unwrap_or_else(|| panic!("{resource} has {key:?}"));
        (resource, Arc::new(snapshot), key)
    })
    .collect()
}
