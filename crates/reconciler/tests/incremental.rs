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

use hapwright_eventbus::model::{
    FieldPath, FileKind, ObjectKey, RenderedConfig, ResourceChange, ResourceSnapshot, UpsertOutcome,
};
use hapwright_reconciler::renderer::{
    FileSet, FullReason, Renderer, Resources, Templates, TemplatingSettings,
};
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
            Some(UpsertOutcome::Added) => change.added.push(key),
            Some(UpsertOutcome::Modified) => {
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
                    _ => object["data"]["tls.crt"] = json!(base64_value(rng, "Y3J0", id)),
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
                    ("secrets", 0) => {
                        object["data"]["tls.key"] = json!(base64_value(rng, "a2V5", id))
                    }
                    _ => object["metadata"]["resourceVersion"] = json!(id.to_string()),
                }
                self.upsert(source, object);
            }
        }
    }
}

/// A secret value: mostly valid base64 of text (`prefix`, itself valid, then three
/// digits), three times in a hundred not (the render then fails until a later change
/// repairs it, and the errors must be those of a full render too).
fn base64_value(rng: &mut Rng, prefix: &str, id: usize) -> String {
    if rng.chance(3) {
        return format!("{prefix}{id}");
    }
    // Three digits of `id`, base64-encoded: decodes to text.
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let digits = format!("{:03}", id % 1000);
    let bits = digits
        .bytes()
        .fold(0usize, |bits, byte| (bits << 8) | usize::from(byte));
    let quad: String = (0..4)
        .rev()
        .map(|i| char::from(CHARS[(bits >> (6 * i)) & 63]))
        .collect();
    format!("{prefix}{quad}")
}

/// Fails with the first difference between an incremental and a full render.
/// The incremental render's outcome equals the full render's: the same files,
/// source maps and hash, or the same errors.
fn assert_same_outcome<E: PartialEq + std::fmt::Debug>(
    step: usize,
    incremental: Result<RenderedConfig, E>,
    full: Result<RenderedConfig, E>,
) {
    match (incremental, full) {
        (Ok(got), Ok(expected)) => assert_same(step, &got, &expected),
        (Err(got), Err(expected)) => assert_eq!(got, expected, "errors differ after change {step}"),
        (got, expected) => panic!(
            "after change {step}: incremental {:?}, full {:?}",
            got.map(|c| c.hash()),
            expected.map(|c| c.hash())
        ),
    }
}

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

/// Runs `changes` random changes; returns how many files and snippet outputs were
/// reused, and how many files spliced, in total.
fn differential(templates: Templates, changes: usize, rng: &mut Rng) -> (usize, usize, usize) {
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
    let mut reused = (0, 0, 0);
    for step in 1..=changes {
        cluster.random_change(rng);
        let (result, stats) = incremental.render_with_stats(&cluster.resources);
        reused.0 += stats.reused;
        reused.1 += stats.snippets_reused;
        reused.2 += stats.spliced;
        assert_same_outcome(step, result, full.render_full(&cluster.resources));
    }
    reused
}

#[test]
fn incremental_renders_equal_full_renders_over_random_changes() {
    let mut rng = Rng(seed());
    let (files, snippets, spliced) = differential(fixtures::routing_templates(), 600, &mut rng);
    println!(
        "routing: {files} files and {snippets} snippet outputs reused, {spliced} files spliced"
    );
    assert!(
        files > 0,
        "the routing example reused no file in 600 changes"
    );
    assert!(
        snippets > 0,
        "the routing example reused no snippet in 600 changes"
    );
    // `haproxy.cfg` names `shared` and is still put together from its pieces.
    assert!(
        spliced > 0,
        "the routing example spliced no file in 600 changes"
    );
    let (files, snippets, spliced) = differential(routing_without_shared(), 600, &mut rng);
    println!(
        "routing without shared: {files} files and {snippets} snippet outputs reused, {spliced} files spliced"
    );
    assert!(
        spliced > 0,
        "routing without shared spliced no file in 600 changes"
    );
    assert!(
        files > 0,
        "routing without shared reused no file in 600 changes"
    );
    assert!(
        snippets > 0,
        "routing without shared reused no snippet in 600 changes"
    );
}

/// Endpoint changes are what files put together from their pieces serve: each
/// renders one backend again and copies the rest. Mostly such changes (a slice's
/// endpoints made ready or not, moved, added or removed, so the backend's length and
/// line count change), with other changes in between, each checked against a full
/// render.
#[test]
fn spliced_renders_equal_full_renders_over_random_endpoint_changes() {
    let mut rng = Rng(seed());
    for templates in [fixtures::routing_templates(), routing_without_shared()] {
        let incremental = renderer(templates.clone());
        let full = renderer(templates);
        let mut cluster = Cluster::new(40);
        let (first, _) = incremental.render_with_stats(&cluster.resources);
        first.expect("renders");
        let mut spliced = 0;
        // Endpoint changes between two renders that succeeded (a random change may
        // break the render until a later one repairs it, and a render after a
        // failure renders everything).
        let (mut eligible, mut last_ok) = (0, true);
        for step in 1..=300 {
            let slices = cluster.keys("endpoints");
            let endpoint_change = !(rng.chance(15) || slices.is_empty());
            if !endpoint_change {
                cluster.random_change(&mut rng);
            } else {
                let key = slices[rng.below(slices.len())].clone();
                let mut slice = cluster.object("endpoints", &key);
                let endpoints = slice["endpoints"].as_array_mut().expect("endpoints");
                match rng.below(4) {
                    0 if !endpoints.is_empty() => {
                        let ready = endpoints[0]["conditions"]["ready"] == json!(true);
                        endpoints[0]["conditions"]["ready"] = json!(!ready);
                    }
                    1 if !endpoints.is_empty() => {
                        endpoints[0]["addresses"] =
                            json!([format!("10.8.{}.{}", step / 256, step % 256)]);
                    }
                    2 if endpoints.len() > 1 => {
                        endpoints.pop();
                    }
                    _ => endpoints.push(json!({
                        "addresses": [format!("10.7.{}.{}", step / 256, step % 256)],
                        "conditions": {"ready": true},
                        "targetRef": {"name": format!("pod-extra-{step}")},
                    })),
                }
                cluster.upsert("endpoints", slice);
            }
            let (result, stats) = incremental.render_with_stats(&cluster.resources);
            spliced += stats.spliced;
            eligible += usize::from(endpoint_change && last_ok && result.is_ok());
            last_ok = result.is_ok();
            assert_same_outcome(step, result, full.render_full(&cluster.resources));
        }
        println!("{spliced} of {eligible} endpoint changes spliced haproxy.cfg");
        assert!(
            eligible > 30 && spliced * 2 > eligible,
            "only {spliced} of {eligible} endpoint changes spliced"
        );
    }
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
    // Inside `haproxy.cfg`, only that service's backend snippet renders again.
    assert_eq!((stats.snippets_rendered, stats.snippets_reused), (1, 4));
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

// === the examples shipped with hapwright ===

/// An example config: its templates, watched resources with their `indexBy` paths,
/// and every object its `validationTests` use, by watched resource.
struct Example {
    templates: Templates,
    index_by: BTreeMap<String, Vec<FieldPath>>,
    pool: BTreeMap<String, Vec<Value>>,
}

fn example(path: &str) -> Example {
    example_of(path, |_| true)
}

/// An example whose fixture pool holds only the fixtures of the validation tests
/// `keep` selects (and `_global`).
fn example_of(path: &str, keep: impl Fn(&Value) -> bool) -> Example {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    let text = std::fs::read_to_string(&file).expect("example config");
    let config: Value = serde_saphyr::from_str(&text).expect("valid YAML");
    let template = |v: &Value| v["template"].as_str().expect("a template").to_owned();
    // Fixed files by key; entries with `forEach` are file sets (one file per item).
    let group = |key: &str| -> BTreeMap<String, String> {
        config[key]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(_, v)| v.get("forEach").is_none())
                    .map(|(k, v)| (k.clone(), template(v)))
                    .collect()
            })
            .unwrap_or_default()
    };
    let sets: Vec<FileSet> = [
        ("maps", FileKind::Map),
        ("files", FileKind::File),
        ("sslCertificates", FileKind::Certificate),
    ]
    .into_iter()
    .flat_map(|(section, kind)| {
        config[section]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(move |(key, v)| {
                Some(FileSet {
                    kind,
                    key: key.clone(),
                    for_each: v.get("forEach")?.as_str()?.to_owned(),
                    name: v["name"].as_str().expect("a set's name").to_owned(),
                    template: template(v),
                })
            })
    })
    .collect();
    let flag = |key: &str| config["templating"][key].as_bool().unwrap_or(false);
    let templates = Templates {
        main: template(&config["haproxyConfig"]),
        snippets: group("templateSnippets"),
        maps: group("maps"),
        files: group("files"),
        certificates: group("sslCertificates"),
        sets,
        extra_context: config.get("extraContext").cloned().unwrap_or(json!({})),
        settings: TemplatingSettings {
            trim_blocks: flag("trimBlocks"),
            lstrip_blocks: flag("lstripBlocks"),
            strict_undefined: flag("strictUndefined"),
        },
        ..Templates::default()
    };
    let index_by = config["watchedResources"]
        .as_object()
        .expect("watchedResources")
        .iter()
        .map(|(name, source)| {
            let paths = source["indexBy"]
                .as_array()
                .map(|paths| {
                    paths
                        .iter()
                        .map(|p| FieldPath::parse(p.as_str().expect("a path")).expect("valid path"))
                        .collect()
                })
                .unwrap_or_default();
            (name.clone(), paths)
        })
        .collect();
    let mut pool: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for test in config["validationTests"].as_object().into_iter().flatten() {
        if test.0 != "_global" && !keep(test.1) {
            continue;
        }
        for (name, objects) in test.1["fixtures"].as_object().into_iter().flatten() {
            let objects = objects.as_array().into_iter().flatten().cloned();
            pool.entry(name.clone()).or_default().extend(objects);
        }
    }
    assert!(!pool.is_empty(), "{path}: no fixtures");
    Example {
        templates,
        index_by,
        pool,
    }
}

fn key_of(object: &Value) -> ObjectKey {
    ObjectKey::new(
        object["metadata"]["namespace"].as_str().unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or_default(),
    )
}

/// Random changes to an example's resources, built from its fixtures: objects
/// swapped for another fixture of the same resource (a modification, or an addition
/// under a new name), deleted, or moved to another index key.
fn example_differential(example: &Example, changes: usize, rng: &mut Rng) -> usize {
    example_differential_min(example, changes, rng, 50)
}

/// [`example_differential`], requiring at least `min_ok` percent of the renders to
/// succeed.
fn example_differential_min(
    example: &Example,
    changes: usize,
    rng: &mut Rng,
    min_ok: usize,
) -> usize {
    let watched: Vec<&str> = example.index_by.keys().map(String::as_str).collect();
    let load = |templates: Templates| {
        Renderer::new(templates, &watched)
            .unwrap_or_else(|errors| panic!("templates do not load: {errors:#?}"))
    };
    let incremental = load(example.templates.clone());
    let full = load(example.templates.clone());
    let mut snapshots: BTreeMap<String, ResourceSnapshot> = example
        .index_by
        .iter()
        .map(|(name, paths)| (name.clone(), ResourceSnapshot::new(paths.clone())))
        .collect();
    let mut resources = Resources::new();
    // Start from half of the fixtures.
    for (name, objects) in &example.pool {
        let Some(snapshot) = snapshots.get_mut(name) else {
            continue;
        };
        for object in objects.iter().step_by(2) {
            snapshot.upsert(key_of(object), object);
        }
        resources.update(&Arc::from(name.as_str()), Arc::new(snapshot.clone()), None);
    }
    let names: Vec<String> = example
        .pool
        .keys()
        .filter(|n| snapshots.contains_key(*n))
        .cloned()
        .collect();
    let mut reused = 0;
    let mut succeeded = 0;
    let mut failed = false;
    for step in 0..=changes {
        if step > 0 && failed && rng.chance(50) {
            // After a render the libraries refuse (a Secret an Ingress needs emptied
            // or deleted), half the time every fixture comes back as it is: one
            // change to many objects, and a way back to renders that succeed, so
            // that no seed leaves the rest of the run failing.
            for name in &names {
                let snapshot = snapshots.get_mut(name).expect("watched");
                let mut change = ResourceChange::default();
                for object in &example.pool[name] {
                    let key = key_of(object);
                    match snapshot.upsert(key.clone(), object) {
                        Some(UpsertOutcome::Added) => change.added.push(key),
                        Some(UpsertOutcome::Modified) => change.modified.push(key),
                        None => {}
                    }
                }
                resources.update(
                    &Arc::from(name.as_str()),
                    Arc::new(snapshot.clone()),
                    Some(&change),
                );
            }
        } else if step > 0 {
            let name = &names[rng.below(names.len())];
            let snapshot = snapshots.get_mut(name).expect("watched");
            let keys: Vec<ObjectKey> = snapshot.iter().map(|(k, _)| k.clone()).collect();
            let pool = &example.pool[name];
            let mut change = ResourceChange::default();
            let mut upsert = |snapshot: &mut ResourceSnapshot, object: Value| {
                let key = key_of(&object);
                match snapshot.upsert(key.clone(), &object) {
                    Some(UpsertOutcome::Added) => change.added.push(key),
                    Some(UpsertOutcome::Modified) => change.modified.push(key),
                    None => {}
                }
            };
            match rng.below(5) {
                // Delete.
                0 if !keys.is_empty() => {
                    let key = &keys[rng.below(keys.len())];
                    snapshot.remove(key);
                    change.removed.push(key.clone());
                }
                // Add a fixture under a new name.
                1 => {
                    let mut object = pool[rng.below(pool.len())].clone();
                    let name = object["metadata"]["name"]
                        .as_str()
                        .unwrap_or("x")
                        .to_owned();
                    object["metadata"]["name"] = json!(format!("{name}-{step}"));
                    upsert(snapshot, object);
                }
                // Re-index: another object's index values (a slice to another
                // service, an object to another namespace is a new key).
                2 if !keys.is_empty() => {
                    let key = &keys[rng.below(keys.len())];
                    let mut object = snapshot.get_by_key(key).expect("exists").parse();
                    let other = &pool[rng.below(pool.len())];
                    let label = "kubernetes.io/service-name";
                    if let Some(service) = other["metadata"]["labels"].get(label) {
                        object["metadata"]["labels"][label] = service.clone();
                    } else {
                        object["metadata"]["labels"]["moved"] = json!(step.to_string());
                    }
                    upsert(snapshot, object);
                }
                // One value of `data` renewed or emptied (a Secret's certificate
                // or key), everything else as it was.
                3 if !keys.is_empty() => {
                    let key = &keys[rng.below(keys.len())];
                    let mut object = snapshot.get_by_key(key).expect("exists").parse();
                    let fields: Vec<String> = object["data"]
                        .as_object()
                        .map(|data| data.keys().cloned().collect())
                        .unwrap_or_default();
                    if fields.is_empty() {
                        upsert(snapshot, pool[rng.below(pool.len())].clone());
                    } else {
                        let field = &fields[rng.below(fields.len())];
                        object["data"][field] = if rng.chance(20) {
                            json!("")
                        } else {
                            json!(base64_value(rng, "", step))
                        };
                        upsert(snapshot, object);
                    }
                }
                // A fixture as it is: modifies the object of that name, or adds it.
                _ => upsert(snapshot, pool[rng.below(pool.len())].clone()),
            }
            resources.update(
                &Arc::from(name.as_str()),
                Arc::new(snapshot.clone()),
                Some(&change),
            );
        }
        let (result, stats) = incremental.render_with_stats(&resources);
        reused += stats.reused;
        succeeded += usize::from(result.is_ok());
        failed = result.is_err();
        assert_same_outcome(step, result, full.render_full(&resources));
    }
    assert!(
        succeeded * 100 > changes * min_ok,
        "only {succeeded} of {changes} renders succeeded: the changes test little"
    );
    reused
}

#[test]
fn the_quickstart_and_the_ingress_library_render_incrementally_as_in_full() {
    let mut rng = Rng(seed());
    let quickstart = example("examples/quickstart/hapwright.yaml");
    let reused = example_differential(&quickstart, 300, &mut rng);
    println!("quickstart: {reused} files reused");
    let library = example("examples/kubernetes-ingress/hapwright.yaml");
    let reused = example_differential(&library, 300, &mut rng);
    println!("ingress library: {reused} files reused");
}

#[test]
fn snippets_print_the_same_through_the_cache_as_when_included() {
    let snippets: BTreeMap<String, String> = [
        ("sets", "{% set x = 'inner' %}[{{ x }}]"),
        ("reads-loop", "{{ loop.index }}:{{ svc.metadata.name }}"),
        ("reads-parent", "{{ prefix }}-{{ svc.metadata.name }}-{{ n }}"),
        ("nested", "<{% include 'reads-parent' %}|{% include \"sets\" -%}\n>"),
        ("with-macro", "{% from 'macros' import m %}{{ m(svc) }}"),
        ("macros", "{% macro m(s) %}m({{ s.metadata.name }}){% endmacro %}"),
        ("globbed-a", "ga"),
        ("globbed-b", "gb {{ svc.metadata.name }}"),
        ("globs", "{{ render_glob('globbed-*') }}"),
        ("endpoints", "{% for s in resources.endpoints.fetch(svc.metadata.namespace, svc.metadata.name) %}{{ s.metadata.name }} {% endfor %}"),
        ("trailing", "line\n"),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_owned(), s.to_owned()))
    .collect();
    let main = "{% set x = 'outer' %}{% set prefix = 'p' %}\
        {% for svc in resources.services.list() %}{% set n = loop.index * 2 %}\n\
        {% include 'sets' %}{{ x }}\n\
        {%- include 'reads-loop' %}\n\
        {% include 'reads-parent' -%}\n\
        {%+ include 'nested' +%}\n\
        {% include 'with-macro' %}\n  {% include 'globs' %}\n\
        {% include 'endpoints' %}{% include 'trailing' %}{% include 'trailing' %}\n\
        {% endfor %}";
    for (trim_blocks, lstrip_blocks) in [(false, false), (true, true)] {
        let templates = Templates {
            main: main.to_owned(),
            snippets: snippets.clone(),
            settings: TemplatingSettings {
                trim_blocks,
                lstrip_blocks,
                strict_undefined: false,
            },
            ..Templates::default()
        };
        let renderer = renderer(templates);
        let mut cluster = Cluster::new(4);
        for step in 0..3 {
            let (got, stats) = renderer.render_with_stats(&cluster.resources);
            let got = got.expect("renders");
            assert_same(
                step,
                &got,
                &renderer.render_full(&cluster.resources).expect("renders"),
            );
            if step > 0 {
                assert!(stats.snippets_reused > 0, "{stats:?}");
            }
            let key = cluster.keys("endpoints")[step].clone();
            let mut slice = cluster.object("endpoints", &key);
            slice["metadata"]["labels"]["extra"] = json!(step);
            cluster.upsert("endpoints", slice);
        }
    }
}

/// The quickstart writes each Service's backend through its `backend` snippet: after
/// one endpoint change, only that Service's snippet renders again.
#[test]
fn the_quickstart_renders_only_the_changed_backend_again() {
    let quickstart = example("examples/quickstart/hapwright.yaml");
    let watched: Vec<&str> = quickstart.index_by.keys().map(String::as_str).collect();
    let renderer = Renderer::new(quickstart.templates.clone(), &watched).expect("loads");
    let mut services = ResourceSnapshot::new(quickstart.index_by["services"].clone());
    let mut endpoints = ResourceSnapshot::new(quickstart.index_by["endpoints"].clone());
    let slice = |i: usize, ready: bool| {
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("svc-{i}-abc"), "namespace": "default",
                         "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
            "ports": [{"port": 9101}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready}}],
        })
    };
    for i in 0..20 {
        let service = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc-{i}"), "namespace": "default",
                         "annotations": {"hapwright.io/host": format!("svc-{i}.test")}},
        });
        services.upsert(key_of(&service), &service);
        endpoints.upsert(key_of(&slice(i, true)), &slice(i, true));
    }
    let mut resources = Resources::new();
    resources.update(&Arc::from("services"), Arc::new(services), None);
    resources.update(&Arc::from("endpoints"), Arc::new(endpoints.clone()), None);
    let (first, stats) = renderer.render_with_stats(&resources);
    first.expect("renders");
    // Each Service's backend and its `hosts.map` line.
    assert_eq!(stats.snippets_rendered, 40, "{stats:?}");

    let changed = slice(7, false);
    endpoints.upsert(key_of(&changed), &changed);
    resources.update(
        &Arc::from("endpoints"),
        Arc::new(endpoints),
        Some(&ResourceChange {
            modified: vec![key_of(&changed)],
            ..ResourceChange::default()
        }),
    );
    let (config, stats) = renderer.render_with_stats(&resources);
    assert_eq!(
        (stats.snippets_rendered, stats.snippets_reused),
        (1, 19),
        "{stats:?}"
    );
    assert_eq!(
        config.expect("renders").main(),
        renderer.render_full(&resources).expect("renders").main()
    );
}

/// A file is put together again from its pieces only when every snippet output it
/// used went straight into it: one captured by `{% set %}`, a `{% filter %}` block
/// or a macro may have been measured or changed, so such a file renders again.
/// Either way the output is that of a full render.
#[test]
fn only_files_that_print_snippet_outputs_directly_are_spliced() {
    // `edge` ends its output with a line break or in the middle of a line, so the
    // text after it starts a line of its own or continues the snippet's line (and
    // takes that line's origin): the stripping state at that point changes.
    let snippets: BTreeMap<String, String> = [
        (
            "ready",
            "{% for s in resources.endpoints.fetch(svc.metadata.namespace, svc.metadata.name) %}\
             {% for e in s.endpoints %}{{ e.conditions.ready }},{% endfor %}{% endfor %}",
        ),
        (
            "edge",
            "{% for s in resources.endpoints.fetch(svc.metadata.namespace, svc.metadata.name) %}\
             {% if s.endpoints[0].conditions.ready %}serving-traffic-normally\n\
             {% else %}draining-connections\nstill-on-this-line{% endif %}\
             {% endfor %}",
        ),
    ]
    .into_iter()
    .map(|(name, source)| (name.to_owned(), source.to_owned()))
    .collect();
    let each =
        |body: &str| format!("{{% for svc in resources.services.list() %}}{body}\n{{% endfor %}}");
    let cases = [
        (each("{% include 'ready' %}"), true),
        (
            each("[{% include 'ready' %}] {{ svc.metadata.name }}"),
            true,
        ),
        (each("{% include 'edge' %} tail"), true),
        (each("{% include 'edge' %}{% include 'ready' %} tail"), true),
        (
            each("{% set cap %}{% include 'ready' %}{% endset %}{{ cap | length }}"),
            false,
        ),
        (
            each("{% set cap %}{% include 'ready' %}{% endset %}{{ cap }}"),
            false,
        ),
        (
            each("{% filter upper %}{% include 'ready' %}{% endfilter %}"),
            false,
        ),
        (
            "{% macro m(svc) %}{% include 'ready' %}{% endmacro %}\
             {% for svc in resources.services.list() %}{{ m(svc) | length }}\n{% endfor %}"
                .to_owned(),
            false,
        ),
        (
            each("{% include 'ready' %} {% set cap %}{% include 'ready' %}{% endset %}"),
            false,
        ),
    ];
    for (main, direct) in cases {
        let templates = Templates {
            main: main.clone(),
            snippets: snippets.clone(),
            ..Templates::default()
        };
        let renderer = renderer(templates);
        let mut cluster = Cluster::new(4);
        renderer
            .render_with_stats(&cluster.resources)
            .0
            .expect("renders");
        for step in 0..4 {
            let key = cluster.keys("endpoints")[step].clone();
            let mut slice = cluster.object("endpoints", &key);
            let ready = slice["endpoints"][0]["conditions"]["ready"] == json!(true);
            slice["endpoints"][0]["conditions"]["ready"] = json!(!ready);
            cluster.upsert("endpoints", slice);
            let (got, stats) = renderer.render_with_stats(&cluster.resources);
            let full = renderer.render_full(&cluster.resources).expect("renders");
            assert_same(step, &got.expect("renders"), &full);
            assert_eq!(
                stats.spliced,
                usize::from(direct),
                "{main}: {stats:?} after change {step}"
            );
            if direct {
                // Each include of the changed service renders again, the others'
                // outputs are reused.
                let includes = main.matches("include").count();
                assert_eq!(
                    (stats.snippets_rendered, stats.snippets_reused),
                    (includes, 3 * includes),
                    "{main}"
                );
            }
        }
    }
}

/// Loops over a resource list whose body is one `include` are put together again
/// item by item: a Service added, removed or changed renders its own snippet
/// outputs, not the loop. Sorted ascending, descending (with ties kept in list
/// order) and not at all, with snippet outputs that are sometimes empty, checked
/// against a full render after each random change.
#[test]
fn loops_put_together_again_equal_full_renders_over_random_changes() {
    let mut templates = fixtures::routing_templates();
    templates.main = "global\n\
        {% for svc in resources.services.list() | sort_by(\"metadata.name\") %}\n\
        {% include \"backend\" %}\n\n\
        {% endfor %}\n\
        # by namespace, descending\n\
        {%- for svc in resources.services.list() | sort_by(\"-metadata.namespace\") -%}\n\
        \x20 {% include \"line\" %}\n\
        {%- endfor %}\n\
        {% for svc in resources.services.list() %}{% include \"maybe\" %}{% endfor %}\n\
        end\n"
        .to_owned();
    templates.snippets.insert(
        "line".into(),
        "{{ svc.metadata.name }}@{{ svc.metadata.namespace }}".into(),
    );
    templates.snippets.insert(
        "maybe".into(),
        "{% if (svc.metadata.annotations or {}).get(\"haproxy.org/balance\") %}\
         {{ svc.metadata.name }};{% endif %}"
            .into(),
    );
    let mut rng = Rng(seed());
    let (_, snippets, spliced) = differential(templates, 600, &mut rng);
    println!("loops: {snippets} snippet outputs reused, {spliced} files spliced");
    assert!(spliced > 0, "no file was spliced in 600 changes");
}

/// The quickstart's `haproxy.cfg` and `hosts.map` loop over the Services through
/// one snippet each: a Service added or removed renders its two snippet outputs (or
/// none) and puts both files together again without running their loops.
#[test]
fn the_quickstart_adds_and_removes_a_service_without_running_its_loops() {
    let quickstart = example("examples/quickstart/hapwright.yaml");
    let watched: Vec<&str> = quickstart.index_by.keys().map(String::as_str).collect();
    let renderer = Renderer::new(quickstart.templates.clone(), &watched).expect("loads");
    let mut services = ResourceSnapshot::new(quickstart.index_by["services"].clone());
    let service = |i: usize| {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc-{i:02}"), "namespace": "default",
                         "annotations": {"hapwright.io/host": format!("svc-{i}.test")}},
        })
    };
    for i in (0..40).step_by(2) {
        services.upsert(key_of(&service(i)), &service(i));
    }
    let mut resources = Resources::new();
    let endpoints = ResourceSnapshot::new(quickstart.index_by["endpoints"].clone());
    resources.update(&Arc::from("endpoints"), Arc::new(endpoints), None);
    resources.update(&Arc::from("services"), Arc::new(services.clone()), None);
    renderer.render(&resources).expect("renders");

    // A Service sorted into the middle of the list, then removed again.
    let added = service(21);
    for add in [true, false] {
        let change = if add {
            services.upsert(key_of(&added), &added);
            ResourceChange {
                added: vec![key_of(&added)],
                ..ResourceChange::default()
            }
        } else {
            services.remove(&key_of(&added));
            ResourceChange {
                removed: vec![key_of(&added)],
                ..ResourceChange::default()
            }
        };
        resources.update(
            &Arc::from("services"),
            Arc::new(services.clone()),
            Some(&change),
        );
        let (config, stats) = renderer.render_with_stats(&resources);
        let config = config.expect("renders");
        assert_eq!(stats.spliced, 2, "add {add}: {stats:?}");
        let rendered = if add { 2 } else { 0 };
        assert_eq!(
            (stats.snippets_rendered, stats.snippets_reused),
            (rendered, 40),
            "add {add}: {stats:?}"
        );
        assert_same(
            0,
            &config,
            &renderer.render_full(&resources).expect("renders"),
        );
        assert_eq!(
            config.main().contains("backend be_default_svc-21"),
            add,
            "add {add}"
        );
    }
}

/// A loop put together item by item fails as a full render does: a new object whose
/// snippet output fails to render, or items that grow the file past
/// `templating.maxOutputBytes`, give exactly the full render's errors, and the next
/// render after the cause is gone equals a full render again.
#[test]
fn a_loop_put_together_again_fails_as_a_full_render_does() {
    let mut templates = fixtures::routing_templates();
    templates.main = "{% for svc in resources.services.list() | sort_by(\"metadata.name\") %}\n\
                      {% include \"item\" %}\n\
                      {% endfor %}\n"
        .to_owned();
    templates.snippets.insert(
        "item".into(),
        "{% if svc.metadata.name == \"boom\" %}{{ no_such_function() }}{% endif %}\
         {% if svc.metadata.name.startswith(\"big\") %}{{ \"x\" * 5000 }}{% endif %}\
         item {{ svc.metadata.namespace }}/{{ svc.metadata.name }} of the loop"
            .into(),
    );
    // Only `haproxy.cfg`, so the cap is its alone: the base fits with four big items
    // (about 20 KiB), not with five (about 25 KiB).
    templates.maps.clear();
    templates.files.clear();
    templates.certificates.clear();
    templates.limits.max_output_bytes = "24KiB".parse().expect("a size");
    let renderer = renderer(templates);
    let mut cluster = Cluster::new(4);
    let service = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": "default"}})
    };
    renderer.render(&cluster.resources).expect("renders");
    // `fails`: whether the render fails; else whether it is put together again (a
    // render right after a failed one renders everything).
    let check = |cluster: &Cluster, fails: bool, spliced: bool| {
        let (result, stats) = renderer.render_with_stats(&cluster.resources);
        let full = renderer.render_full(&cluster.resources);
        assert_eq!(full.is_err(), fails, "{:?}", full.as_ref().err());
        if fails {
            assert_eq!(stats.full_reason, Some(FullReason::RenderFailed));
        } else {
            assert_eq!(stats.spliced, usize::from(spliced), "{stats:?}");
        }
        assert_same_outcome(0, result, full);
    };
    // A new object whose snippet output fails, then removed again.
    cluster.upsert("services", service("boom"));
    check(&cluster, true, false);
    cluster.remove("services", &ObjectKey::new("default", "boom"));
    check(&cluster, false, false);
    // Big items until the file no longer fits, then one of them removed again.
    for name in ["big-1", "big-2", "big-3", "big-4"] {
        cluster.upsert("services", service(name));
        check(&cluster, false, true);
    }
    cluster.upsert("services", service("big-5"));
    check(&cluster, true, false);
    cluster.remove("services", &ObjectKey::new("default", "big-5"));
    check(&cluster, false, false);
    cluster.remove("services", &ObjectKey::new("default", "big-4"));
    check(&cluster, false, true);
}

/// The Ingress library checks a TLS Secret with `has()`: a renewal (new data in the
/// same fields) renders only that Secret's PEM, every other file is reused; a Secret
/// emptied renders `haproxy.cfg` and the maps again (its host loses HTTPS). Both as
/// a full render gives.
#[test]
fn a_renewed_tls_secret_renders_only_its_certificate() {
    let library = example("examples/kubernetes-ingress/hapwright.yaml");
    let watched: Vec<&str> = library.index_by.keys().map(String::as_str).collect();
    let renderer = Renderer::new(library.templates.clone(), &watched).expect("loads");
    let mut ingresses = ResourceSnapshot::new(library.index_by["ingresses"].clone());
    let mut secrets = ResourceSnapshot::new(library.index_by["secrets"].clone());
    let secret = |i: usize, crt: &str| {
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": format!("tls-{i}"), "namespace": "shop"},
            "data": {"tls.crt": crt, "tls.key": "a2V5"},
        })
    };
    for i in 0..20 {
        let ingress = json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": format!("ing-{i}"), "namespace": "shop",
                         "creationTimestamp": format!("2026-01-01T00:00:{i:02}Z")},
            "spec": {
                "ingressClassName": "hapwright",
                "tls": [{"hosts": [format!("h{i}.example.test")], "secretName": format!("tls-{i}")}],
                "rules": [{"host": format!("h{i}.example.test"), "http": {"paths": [
                    {"path": "/", "pathType": "Prefix",
                     "backend": {"service": {"name": "web", "port": {"number": 80}}}},
                ]}}],
            },
        });
        ingresses.upsert(key_of(&ingress), &ingress);
        secrets.upsert(key_of(&secret(i, "Y3J0")), &secret(i, "Y3J0"));
    }
    let mut resources = Resources::new();
    resources.update(&Arc::from("ingresses"), Arc::new(ingresses), None);
    resources.update(&Arc::from("secrets"), Arc::new(secrets.clone()), None);
    let (first, _) = renderer.render_with_stats(&resources);
    let first = first.expect("renders");
    assert!(first.main().contains("ssl crt-list"), "HTTPS is served");
    let mut change = |resources: &mut Resources, crt: &str| {
        let changed = secret(7, crt);
        secrets.upsert(key_of(&changed), &changed);
        resources.update(
            &Arc::from("secrets"),
            Arc::new(secrets.clone()),
            Some(&ResourceChange {
                modified: vec![key_of(&changed)],
                ..ResourceChange::default()
            }),
        );
        let (config, stats) = renderer.render_with_stats(resources);
        let config = config.expect("renders");
        let full = renderer.render_full(resources).expect("renders");
        assert_same(0, &config, &full);
        (config, stats)
    };
    // Renewed: "crt2" instead of "crt".
    let (renewed, stats) = change(&mut resources, "Y3J0Mg==");
    assert_eq!(stats.rendered, 1, "only the PEM renders: {stats:?}");
    assert_eq!(renewed.main(), first.main());
    // Emptied: the host is no longer served over HTTPS.
    let (emptied, stats) = change(&mut resources, "");
    assert!(stats.rendered > 1, "haproxy.cfg renders again: {stats:?}");
    assert!(
        emptied
            .main()
            .contains("# TLS: Secret shop/tls-7 is missing or has no tls.crt/tls.key"),
        "{}",
        emptied.main()
    );
}

/// The Gateway API and ingress-nginx libraries, whose files build on what
/// `haproxy.cfg` left in `shared`: files reused after a change (`haproxy.cfg` and the
/// files after it whose reads did not change) give what a full render gives.
#[test]
fn the_gateway_and_ingress_nginx_libraries_render_incrementally_as_in_full() {
    let mut rng = Rng(seed());
    // The ingress-nginx library refuses some annotations with an error (quarantine
    // then holds the Ingress back): its pool is the fixtures of the tests that
    // render a valid configuration.
    let valid = |test: &Value| {
        test["assertions"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["type"] == "haproxy_valid"))
    };
    for (path, keep) in [
        ("examples/gateway-api/hapwright.yaml", None),
        ("examples/ingress-nginx/hapwright.yaml", Some(valid)),
    ] {
        let library = match keep {
            Some(keep) => example_of(path, keep),
            None => example(path),
        };
        // ingress-nginx refuses a Secret whose values do not decode (a renewal to
        // random data), so fewer of its renders succeed.
        let min_ok = if keep.is_some() { 15 } else { 50 };
        let reused = example_differential_min(&library, 200, &mut rng, min_ok);
        println!("{path}: {reused} files reused");
        assert!(reused > 0, "{path}: nothing was reused");
    }
}

/// The Ingress library's pass over every Ingress (a loop whose snippet reads and
/// writes `shared`) runs again only from the first Ingress that changed: a new
/// newest Ingress runs at most one checkpoint's worth of iterations, a change to
/// the oldest runs them all, and every render equals a full render.
#[test]
fn the_ingress_pass_runs_again_only_from_the_first_changed_ingress() {
    let library = example("examples/kubernetes-ingress/hapwright.yaml");
    let watched: Vec<&str> = library.index_by.keys().map(String::as_str).collect();
    let renderer = Renderer::new(library.templates.clone(), &watched).expect("loads");
    let mut ingresses = ResourceSnapshot::new(library.index_by["ingresses"].clone());
    let ingress = |i: usize, host: &str| {
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": format!("ing-{i}"), "namespace": "shop",
                         "creationTimestamp": format!("2026-01-01T00:{:02}:{:02}Z", i / 60, i % 60)},
            "spec": {
                "ingressClassName": "hapwright",
                "rules": [{"host": host, "http": {"paths": [
                    {"path": "/", "pathType": "Prefix",
                     "backend": {"service": {"name": "web", "port": {"number": 80}}}},
                ]}}],
            },
        })
    };
    const COUNT: usize = 300;
    for i in 0..COUNT {
        let object = ingress(i, &format!("h{i}.example.test"));
        ingresses.upsert(key_of(&object), &object);
    }
    let mut resources = Resources::new();
    resources.update(&Arc::from("ingresses"), Arc::new(ingresses.clone()), None);
    renderer.render_with_stats(&resources).0.expect("renders");
    // The first incremental render fills the pass's memo.
    let mut step = |resources: &mut Resources, object: Option<Value>, removed: Option<usize>| {
        let mut change = ResourceChange::default();
        if let Some(object) = object {
            match ingresses.upsert(key_of(&object), &object) {
                Some(UpsertOutcome::Added) => change.added.push(key_of(&object)),
                _ => change.modified.push(key_of(&object)),
            }
        }
        if let Some(i) = removed {
            let key = key_of(&ingress(i, ""));
            ingresses.remove(&key);
            change.removed.push(key);
        }
        resources.update(
            &Arc::from("ingresses"),
            Arc::new(ingresses.clone()),
            Some(&change),
        );
        let (config, stats) = renderer.render_with_stats(resources);
        let config = config.expect("renders");
        assert_same(
            0,
            &config,
            &renderer.render_full(resources).expect("renders"),
        );
        (config, stats)
    };
    step(
        &mut resources,
        Some(ingress(COUNT, "first.example.test")),
        None,
    );
    // A new newest Ingress: the pass keeps the iterations before the last kept state.
    let (config, stats) = step(
        &mut resources,
        Some(ingress(COUNT + 1, "newest.example.test")),
        None,
    );
    assert!(
        stats.snippets_reused >= COUNT - 32 && stats.snippets_rendered <= 40,
        "{stats:?}"
    );
    assert!(config.maps()["hosts.map"].contains("newest.example.test"));
    // The oldest Ingress takes the newest one's host: it wins it, and the pass runs
    // every iteration again.
    let (config, stats) = step(
        &mut resources,
        Some(ingress(0, "newest.example.test")),
        None,
    );
    assert!(stats.snippets_rendered > COUNT, "{stats:?}");
    assert!(
        config.main().contains(&format!(
            "Ingress shop/ing-{}: prefix path newest.example.test/ is refused, it is served by the older Ingress shop/ing-0",
            COUNT + 1
        )),
        "{}",
        config.main()
    );
    // A removal in the middle runs the iterations from there on.
    let (config, stats) = step(&mut resources, None, Some(COUNT / 2));
    assert!(
        stats.snippets_reused >= COUNT / 2 - 32 && stats.snippets_rendered <= COUNT / 2 + 40,
        "{stats:?}"
    );
    assert!(!config.maps()["hosts.map"].contains(&format!("h{}.example.test", COUNT / 2)));
}

/// Loops over `shared` (a pass where the first object to claim a host wins),
/// folded or not, give what a full render gives over random adds, changes, moves
/// and removals, failures included (an iteration that calls `fail()`); only the
/// foldable ones keep iterations between renders.
#[test]
fn loops_over_shared_equal_full_renders_over_random_changes() {
    let mut rng = Rng(seed());
    let claim = r#"{% set h = site.spec.host %}
{% if shared.has("host:" ~ h) %}
# {{ site.metadata.name }}: {{ h }} refused, {{ shared.get("host:" ~ h) }} has it
{% else %}
{% set _ = shared.set("host:" ~ h, site.metadata.name) %}
{% set _ = shared.append("lines", [h, site.metadata.name]) %}
{% if resources.secrets.get(site.metadata.namespace, h) %}{% set _ = shared.append("tls", h) %}{% endif %}
{% endif %}"#;
    let main = |before: &str, snippet: &str| {
        format!(
            "{before}{{% set _ = shared.set(\"lines\", []) %}}{{% set _ = shared.set(\"tls\", []) %}}\n\
             frontend f\n\
             {{% for site in resources.sites.list() | sort_by(\"spec.age\", \"metadata.name\") %}}\n\
             {{% include \"{snippet}\" %}}\n\
             {{% endfor %}}\n\
             # tls {{{{ shared.get(\"tls\") | join(\" \") }}}}\n"
        )
    };
    let variants = [
        // Foldable: the snippet names only site, resources, extraContext and shared.
        ("folded", main("", "claim"), claim.to_owned(), true),
        // Reads a variable of the including template: a plain loop every time.
        (
            "outer variable",
            main("{% set mark = \"#\" %}", "claim-marked"),
            claim.replace("# {{", "{{ mark }} {{"),
            false,
        ),
        // `shared` at the loop's start depends on the resources: kept iterations
        // are used only when it is the same as last time.
        (
            "changing start",
            main(
                "{% set _ = shared.set(\"count\", resources.sites.list() | length) %}",
                "claim",
            ),
            claim.replace(
                "{% set h = site.spec.host %}",
                "{% set h = site.spec.host %}{% if shared.get(\"count\") > 60 %}{% set h = h ~ \".many\" %}{% endif %}",
            ),
            true,
        ),
        // An iteration that fails: an incremental render fails as the full render
        // does, with the same error, and the next one starts over.
        (
            "failing",
            main("", "claim"),
            claim.replace(
                "{% set h = site.spec.host %}",
                "{% set h = site.spec.host %}{% if h == \"h13.test\" and site.spec.age % 2 == 0 %}{{ fail(\"site \" ~ site.metadata.name ~ \" is refused\") }}{% endif %}",
            ),
            true,
        ),
    ];
    for (what, main, snippet, folds) in variants {
        let mut failed = 0;
        let name = if what == "outer variable" {
            "claim-marked"
        } else {
            "claim"
        };
        let templates = Templates {
            main,
            snippets: BTreeMap::from([(name.to_owned(), snippet)]),
            maps: BTreeMap::from([(
                "hosts.map".to_owned(),
                "{% for l in shared.get(\"lines\") %}{{ l[0] }} {{ l[1] }}\n{% endfor %}"
                    .to_owned(),
            )]),
            settings: TemplatingSettings {
                trim_blocks: true,
                lstrip_blocks: true,
                strict_undefined: false,
            },
            ..Templates::default()
        };
        let load = || Renderer::new(templates.clone(), &["sites", "secrets"]).expect("loads");
        let (incremental, full) = (load(), load());
        let mut sites = ResourceSnapshot::new(vec![]);
        let mut secrets = ResourceSnapshot::new(vec![
            FieldPath::parse("metadata.namespace").expect("path"),
            FieldPath::parse("metadata.name").expect("path"),
        ]);
        let site = |n: usize, host: usize, age: usize| {
            json!({"metadata": {"name": format!("s{n}"), "namespace": "ns"},
                   "spec": {"host": format!("h{host}.test"), "age": age}})
        };
        // Sixty sites to start with: more than one kept copy of `shared` (every 32
        // iterations).
        for n in 0..60 {
            // Site 14 starts on h13.test with an even age: the failing variant
            // fails from the first render until a change moves it.
            let host = if n == 14 { 13 } else { rng.below(40) };
            let object = site(n, host, n);
            sites.upsert(key_of(&object), &object);
        }
        let mut resources = Resources::new();
        resources.update(&Arc::from("sites"), Arc::new(sites.clone()), None);
        resources.update(&Arc::from("secrets"), Arc::new(secrets.clone()), None);
        let mut kept = 0;
        for step in 0..150 {
            let mut change = ResourceChange::default();
            let source = if rng.chance(80) { "sites" } else { "secrets" };
            if source == "sites" {
                let n = rng.below(80);
                let key = key_of(&site(n, 0, 0));
                if rng.chance(25) && sites.get_by_key(&key).is_some() {
                    sites.remove(&key);
                    change.removed.push(key);
                } else {
                    // Mostly the newest, sometimes an old age: a change in the middle.
                    let age = if rng.chance(70) {
                        100 + step
                    } else {
                        rng.below(100)
                    };
                    match sites.upsert(key.clone(), &site(n, rng.below(40), age)) {
                        Some(UpsertOutcome::Added) => change.added.push(key),
                        Some(UpsertOutcome::Modified) => change.modified.push(key),
                        None => {}
                    }
                }
                resources.update(&Arc::from("sites"), Arc::new(sites.clone()), Some(&change));
            } else {
                let secret = json!({"metadata": {"name": format!("h{}.test", rng.below(40)), "namespace": "ns"}});
                let key = key_of(&secret);
                if rng.chance(50) {
                    if secrets.get_by_key(&key).is_none() {
                        secrets.upsert(key.clone(), &secret);
                        change.added.push(key);
                    }
                } else if secrets.get_by_key(&key).is_some() {
                    secrets.remove(&key);
                    change.removed.push(key);
                }
                resources.update(
                    &Arc::from("secrets"),
                    Arc::new(secrets.clone()),
                    Some(&change),
                );
            }
            let (result, stats) = incremental.render_with_stats(&resources);
            kept += stats.snippets_reused;
            failed += usize::from(result.is_err());
            assert_same_outcome(step, result, full.render_full(&resources));
        }
        if what == "failing" {
            // Whether iterations were kept depends on how long a failing site
            // stayed; that renders failed and equalled the full renders is the point.
            assert!(failed > 0, "no render failed");
        } else if folds {
            assert!(kept > 0, "{what}: no iteration was ever kept");
        } else {
            assert_eq!(kept, 0, "{what}: iterations were kept");
        }
    }
}
