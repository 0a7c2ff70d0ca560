//! Incremental rendering: after a change, only the files that read what changed are
//! rendered again, and the output is byte for byte that of a full render.
//!
//! The differential test drives random changes (add, modify, delete, re-index)
//! across every resource kind of the routing example and checks after each that the
//! incremental render equals a full render of the same snapshots: every file, the
//! source map and the content hash. The seed is printed; set `HAPWRIGHT_SEED` to
//! replay a run.

#[path = "../testdata/fixtures.rs"]
mod fixtures;

use std::collections::BTreeMap;
use std::sync::Arc;

use hapwright_eventbus::model::{ObjectKey, RenderedConfig, ResourceChange, ResourceSnapshot};
use hapwright_reconciler::renderer::{FullReason, Renderer, Resources, Templates};
use serde_json::{Value, json};

/// A small seeded generator (SplitMix64): the same seed gives the same changes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

fn seed() -> u64 {
    let seed = std::env::var("HAPWRIGHT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    println!("HAPWRIGHT_SEED={seed}");
    seed
}

fn renderer(templates: Templates) -> Renderer {
    Renderer::new(templates, &fixtures::WATCHED)
        .unwrap_or_else(|errors| panic!("templates do not load: {errors:#?}"))
}

/// The routing example with `haproxy.cfg` not using `shared`, so `haproxy.cfg` can be
/// reused too.
fn routing_without_shared() -> Templates {
    let mut templates = fixtures::routing_templates();
    templates.main = templates
        .main
        .replace(
            r#"{{ shared.setdefault("fallback", "default_fallback") }}"#,
            "default_fallback",
        )
        .replace("{{ shared.fallback }}", "default_fallback");
    assert!(!templates.main.contains("shared"));
    templates
}

/// The watched snapshots, changed one object at a time, and the template view of
/// them updated with each change.
struct Cluster {
    snapshots: BTreeMap<&'static str, ResourceSnapshot>,
    resources: Resources,
    next: usize,
}

impl Cluster {
    fn new(n: usize) -> Self {
        let snapshots: BTreeMap<&'static str, ResourceSnapshot> = fixtures::cluster(n)
            .into_iter()
            .map(|(name, snapshot)| (name, (*snapshot).clone()))
            .collect();
        let mut resources = Resources::new();
        for (name, snapshot) in &snapshots {
            resources.update(&Arc::from(*name), Arc::new(snapshot.clone()), None);
        }
        Self {
            snapshots,
            resources,
            next: n,
        }
    }

    fn keys(&self, source: &str) -> Vec<ObjectKey> {
        self.snapshots[source]
            .iter()
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn object(&self, source: &str, key: &ObjectKey) -> Value {
        self.snapshots[source]
            .get_by_key(key)
            .expect("object exists")
            .parse()
    }

    fn upsert(&mut self, source: &'static str, object: Value) {
        let key = ObjectKey::new(
            object["metadata"]["namespace"].as_str().unwrap_or_default(),
            object["metadata"]["name"].as_str().unwrap_or_default(),
        );
        let snapshot = self.snapshots.get_mut(source).expect("watched");
        let mut change = ResourceChange::default();
        match snapshot.upsert(key.clone(), &object) {
            Some(hapwright_eventbus::model::UpsertOutcome::Added) => change.added.push(key),
            Some(hapwright_eventbus::model::UpsertOutcome::Modified) => {
                change.modified.push(key);
            }
            None => {}
        }
        self.publish(source, change);
    }

    fn remove(&mut self, source: &'static str, key: &ObjectKey) {
        let snapshot = self.snapshots.get_mut(source).expect("watched");
        let mut change = ResourceChange::default();
        if snapshot.remove(key).is_some() {
            change.removed.push(key.clone());
        }
        self.publish(source, change);
    }

    fn publish(&mut self, source: &'static str, change: ResourceChange) {
        let snapshot = Arc::new(self.snapshots[source].clone());
        self.resources
            .update(&Arc::from(source), snapshot, Some(&change));
    }

    /// One random change: add, modify, delete or re-index an object of a random kind.
    fn random_change(&mut self, rng: &mut Rng) {
        let id = self.next;
        self.next += 1;
        let source = ["services", "endpoints", "ingresses", "secrets"][rng.below(4)];
        let keys = self.keys(source);
        let pick = |rng: &mut Rng| (!keys.is_empty()).then(|| keys[rng.below(keys.len())].clone());
        match (rng.below(4), pick(rng)) {
            // Add: a new object, sometimes pointing at an existing service.
            (0, _) | (_, None) => {
                let existing = rng.below(id.max(1));
                let object = match source {
                    "services" => json!({
                        "metadata": {"namespace": format!("team-{}", rng.below(3)), "name": format!("svc-{id}")},
                        "spec": {"ports": [{"port": 80}]},
                    }),
                    "endpoints" => json!({
                        "metadata": {
                            "namespace": format!("team-{}", existing % 10),
                            "name": format!("svc-{existing}-{id}"),
                            "labels": {"kubernetes.io/service-name": format!("svc-{existing}")},
                        },
                        "endpoints": [{"addresses": [format!("10.9.{}.{}", id / 256 % 256, id % 256)], "conditions": {"ready": rng.chance(80)}, "targetRef": {"name": format!("pod-{id}")}}],
                        "ports": [{"port": 8000 + rng.below(3)}],
                    }),
                    "ingresses" => json!({
                        "metadata": {"namespace": format!("team-{}", existing % 10), "name": format!("ing-{id}")},
                        "spec": {"rules": [{"host": format!("Host-{}.example.com", rng.below(20)), "http": {"paths": [
                            {"path": (["/", "/api", "/v2"][rng.below(3)]), "backend": {"service": {"name": format!("svc-{existing}")}}},
                        ]}}]},
                    }),
                    _ => json!({
                        "metadata": {"namespace": "default", "name": (["tls", "other"][rng.below(2)])},
                        "data": {"tls.crt": "Y3J0", "tls.key": format!("a2V5{}", ["", "MQ==", "Mg=="][rng.below(3)])},
                    }),
                };
                self.upsert(source, object);
            }
            // Delete (never the TLS secret: the certificate template requires it).
            (1, Some(key)) if !(source == "secrets" && key.name == "tls") => {
                self.remove(source, &key);
            }
            // Re-index: move an object to another index key.
            (2, Some(key)) => {
                let mut object = self.object(source, &key);
                match source {
                    "endpoints" => {
                        object["metadata"]["labels"]["kubernetes.io/service-name"] =
                            json!(format!("svc-{}", rng.below(id.max(1))));
                    }
                    "services" | "ingresses" => {
                        // The name is the object key: a rename is a delete and an add.
                        self.remove(source, &key);
                        object["metadata"]["name"] = json!(format!("{}-r{id}", key.name));
                    }
                    _ => object["data"]["tls.crt"] = json!(format!("Y3J0{id}")),
                }
                self.upsert(source, object);
            }
            // Modify a field a template reads (or one it does not).
            (_, Some(key)) => {
                let mut object = self.object(source, &key);
                match (source, rng.below(2)) {
                    ("services", 0) => {
                        object["metadata"]["annotations"] =
                            json!({"haproxy.org/balance": (["source", "leastconn"][rng.below(2)])});
                    }
                    ("endpoints", 0) => {
                        object["endpoints"][0]["conditions"]["ready"] = json!(rng.chance(50));
                    }
                    ("ingresses", 0) => {
                        object["spec"]["rules"][0]["host"] =
                            json!(format!("Changed-{id}.example.com"));
                    }
                    ("secrets", 0) => object["data"]["tls.key"] = json!(format!("a2V5{id}")),
                    _ => object["metadata"]["resourceVersion"] = json!(id.to_string()),
                }
                self.upsert(source, object);
            }
        }
    }
}

/// Fails with the first difference between an incremental and a full render.
fn assert_same(step: usize, incremental: &RenderedConfig, full: &RenderedConfig) {
    let files = |c: &RenderedConfig| {
        c.iter()
            .map(|(file, text)| (file.relative_path(), text.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        files(incremental),
        files(full),
        "files differ after change {step}"
    );
    assert_eq!(
        incremental.source_map(),
        full.source_map(),
        "source maps differ after change {step}"
    );
    assert_eq!(
        incremental.hash(),
        full.hash(),
        "hash differs after change {step}"
    );
    assert!(incremental == full, "configs differ after change {step}");
}

/// Runs `changes` random changes; returns how many files were reused in total.
fn differential(templates: Templates, changes: usize, rng: &mut Rng) -> usize {
    let incremental = renderer(templates.clone());
    let full = renderer(templates);
    let mut cluster = Cluster::new(12);
    let (first, stats) = incremental.render_with_stats(&cluster.resources);
    assert_eq!(stats.full_reason, Some(FullReason::FirstRender));
    assert_same(
        0,
        &first.expect("renders"),
        &full.render_full(&cluster.resources).expect("renders"),
    );
    let mut reused = 0;
    for step in 1..=changes {
        cluster.random_change(rng);
        let (result, stats) = incremental.render_with_stats(&cluster.resources);
        reused += stats.reused;
        let expected = full.render_full(&cluster.resources);
        match (result, expected) {
            (Ok(got), Ok(expected)) => assert_same(step, &got, &expected),
            (Err(got), Err(expected)) => {
                assert_eq!(got, expected, "errors differ after change {step}")
            }
            (got, expected) => panic!(
                "after change {step}: incremental {:?}, full {:?}",
                got.map(|c| c.hash()),
                expected.map(|c| c.hash())
            ),
        }
    }
    reused
}

#[test]
fn incremental_renders_equal_full_renders_over_random_changes() {
    let mut rng = Rng(seed());
    let reused = differential(fixtures::routing_templates(), 600, &mut rng);
    assert!(
        reused > 0,
        "the routing example reused no file in 600 changes"
    );
    let reused = differential(routing_without_shared(), 600, &mut rng);
    assert!(
        reused > 0,
        "routing without shared reused no file in 600 changes"
    );
}

#[test]
fn only_files_that_read_what_changed_render_again() {
    let renderer = renderer(routing_without_shared());
    let mut cluster = Cluster::new(5);
    let (_, stats) = renderer.render_with_stats(&cluster.resources);
    assert_eq!((stats.rendered, stats.reused), (5, 0));

    // Nothing changed: every file is reused.
    let (_, stats) = renderer.render_with_stats(&cluster.resources);
    assert_eq!(
        (stats.rendered, stats.reused, stats.full_reason),
        (0, 5, None)
    );

    // An endpoint slice: only `haproxy.cfg` reads endpoints.
    let key = cluster.keys("endpoints")[0].clone();
    let mut slice = cluster.object("endpoints", &key);
    slice["endpoints"][0]["conditions"]["ready"] = json!(false);
    cluster.upsert("endpoints", slice);
    let (config, stats) = renderer.render_with_stats(&cluster.resources);
    assert_eq!((stats.rendered, stats.reused), (1, 4));
    assert_eq!(
        config.expect("renders"),
        renderer.render_full(&cluster.resources).expect("renders")
    );

    // A field of a service that an ingress points at: `haproxy.cfg` lists services,
    // the maps `get` that very service; the 503 page and the certificate read none.
    let key = cluster.keys("services")[0].clone();
    let mut service = cluster.object("services", &key);
    service["metadata"]["labels"] = json!({"x": "y"});
    cluster.upsert("services", service);
    let (_, stats) = renderer.render_with_stats(&cluster.resources);
    assert_eq!((stats.rendered, stats.reused), (3, 2));

    // A service no ingress points at: the maps' lookups find the same objects.
    cluster.upsert(
        "services",
        json!({"metadata": {"namespace": "team-0", "name": "lonely"}, "spec": {}}),
    );
    let (_, stats) = renderer.render_with_stats(&cluster.resources);
    assert_eq!((stats.rendered, stats.reused), (1, 4));

    // The secret: `haproxy.cfg` and the certificate read it.
    let key = ObjectKey::new("default", "tls");
    let mut secret = cluster.object("secrets", &key);
    secret["data"]["tls.key"] = json!("bmV3");
    cluster.upsert("secrets", secret);
    let (config, stats) = renderer.render_with_stats(&cluster.resources);
    assert_eq!((stats.rendered, stats.reused), (2, 3));
    assert_eq!(
        config.expect("renders").certificates()["default.pem"]
            .as_ref()
            .lines()
            .nth(3),
        Some("new")
    );
}

#[test]
fn a_failing_incremental_render_reports_what_a_full_render_reports() {
    let renderer = renderer(routing_without_shared());
    let mut cluster = Cluster::new(3);
    renderer.render(&cluster.resources).expect("renders");
    // The certificate fails without its secret; the other files could be reused.
    cluster.remove("secrets", &ObjectKey::new("default", "tls"));
    let (result, stats) = renderer.render_with_stats(&cluster.resources);
    let errors = result.expect_err("the certificate needs the secret");
    assert_eq!(
        errors,
        renderer.render_full(&cluster.resources).expect_err("fails")
    );
    assert_eq!(stats.full_reason, Some(FullReason::RenderFailed));
    assert_eq!(stats.reused, 0);
}
