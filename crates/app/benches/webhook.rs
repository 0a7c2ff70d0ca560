//! Admission webhook decision latency at 1,000 existing Services (each with an
//! EndpointSlice), with the quickstart's templates: p50 and p99 of
//! [`Engine::review`] (parse, apply, render, phase 1, phase 2) for two kinds of
//! review, next to one bare phase 2 (`haproxy -c`) of the same configuration
//! (target: p99 ≤ 2× one phase 2).
//!
//! - `endpoint update`: an EndpointSlice moves to another address. The render
//!   differs from the last candidate that passed `haproxy -c` only in a server
//!   address, so phase 2 passes by structural equivalence.
//! - `new Service`: a Service that adds a backend. The structure changes, so
//!   `haproxy -c` runs.
//!
//! Run: `cargo bench -p hapwright-app --bench webhook` (`WEBHOOK_BENCH_REVIEWS` sets
//! the reviews per kind, default 100).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hapwright_app::build;
use hapwright_app::config::{self, FailurePolicy};
use hapwright_app::webhook::{Current, Engine, Settings, Target};
use hapwright_deployer::component::validator;
use hapwright_eventbus::model::{ObjectKey, ResourceSnapshot};
use serde_json::{Value, json};

const EXISTING: usize = 1_000;

fn service(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": format!("svc-{i}"), "namespace": "default",
                      "annotations": { "hapwright.io/host": format!("svc-{i}.example.test") } },
        "spec": { "ports": [{ "port": 80 }] },
    })
}

fn slice(i: usize, address: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": { "name": format!("svc-{i}-abc12"), "namespace": "default",
                      "labels": { "kubernetes.io/service-name": format!("svc-{i}") } },
        "addressType": "IPv4",
        "ports": [{ "port": 9101 }],
        "endpoints": [{ "addresses": [address], "conditions": { "ready": true } }],
    })
}

fn review(uid: usize, operation: &str, object: &Value, old: Option<&Value>) -> Vec<u8> {
    let api_version = object["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid.to_string(),
            "kind": { "group": group, "version": version, "kind": object["kind"] },
            "resource": { "group": group, "version": version, "resource": "x" },
            "name": object["metadata"]["name"], "namespace": "default",
            "operation": operation, "userInfo": {},
            "object": object, "oldObject": old,
        }
    }))
    .unwrap()
}

fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    samples[rank - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test` runs it once, quickly.
    let quick = !std::env::args().any(|a| a == "--bench");
    let reviews: usize = std::env::var("WEBHOOK_BENCH_REVIEWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 3 } else { 100 });
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/quickstart/hapwright.yaml"),
    )
    .unwrap();
    let (config, _) = config::parse(&text, &dir.path().join("hapwright.yaml"), "hapwright.yaml")
        .expect("the quickstart config parses");

    let current = Current::new();
    let mut targets = Vec::new();
    for (name, objects) in [
        ("services", (0..EXISTING).map(service).collect::<Vec<_>>()),
        (
            "endpoints",
            (0..EXISTING).map(|i| slice(i, "127.0.0.1")).collect(),
        ),
    ] {
        let resource = &config.watched_resources.resources[name];
        let target = Target::new(name, resource).unwrap();
        let mut snapshot = ResourceSnapshot::new(resource.index_by.clone());
        for object in &objects {
            let key = ObjectKey::new("default", object["metadata"]["name"].as_str().unwrap());
            snapshot.upsert(key, object);
        }
        let source: Arc<str> = Arc::from(name);
        current.update(&source, Arc::new(snapshot), None);
        current.synced(&source);
        targets.push(target);
    }
    let validator_config = build::validator_config(&config);
    let engine = Engine::new(
        build::renderer(&config).unwrap(),
        build::webhook_validate(validator_config.clone()),
        targets,
        Settings {
            timeout: Duration::from_secs(30),
            failure_policy: FailurePolicy::Fail,
        },
        current.clone(),
        None,
    );

    runtime.block_on(async {
        // One bare phase 2 of the current configuration, for the target.
        let renderer = build::renderer(&config).unwrap();
        let resources = current.get().resources;
        let rendered = renderer.render(&resources).unwrap();
        let mut phase2 = Vec::new();
        for _ in 0..reviews.clamp(3, 20) {
            let started = Instant::now();
            validator::validate_phase2(&rendered, &validator_config)
                .await
                .expect("the base configuration is valid");
            phase2.push(started.elapsed());
        }

        // Warm up: the first review renders everything and runs haproxy -c.
        let warm = engine
            .review(&review(0, "CREATE", &service(EXISTING), None))
            .await;
        assert_eq!(warm.body["response"]["allowed"], true, "{}", warm.body);

        let mut endpoint = Vec::new();
        for n in 0..reviews {
            let i = n % EXISTING;
            let body = review(
                n,
                "UPDATE",
                &slice(i, &format!("127.0.{}.{}", 1 + n / 250, 1 + n % 250)),
                Some(&slice(i, "127.0.0.1")),
            );
            let started = Instant::now();
            let answer = engine.review(&body).await;
            endpoint.push(started.elapsed());
            assert_eq!(answer.body["response"]["allowed"], true, "{}", answer.body);
        }
        let mut created = Vec::new();
        for n in 0..reviews {
            let body = review(n, "CREATE", &service(EXISTING + 1 + n), None);
            let started = Instant::now();
            let answer = engine.review(&body).await;
            created.push(started.elapsed());
            assert_eq!(answer.body["response"]["allowed"], true, "{}", answer.body);
        }

        let one_phase2 = quantile(&mut phase2, 0.5);
        println!("webhook decision latency, {EXISTING} Services + {EXISTING} EndpointSlices, {reviews} reviews each");
        println!("| review | p50 | p99 | p99 / one phase 2 |");
        println!("|---|---:|---:|---:|");
        for (what, samples) in [("endpoint update", &mut endpoint), ("new Service", &mut created)] {
            let p50 = quantile(samples, 0.5);
            let p99 = quantile(samples, 0.99);
            println!(
                "| {what} | {} | {} | {:.2}× |",
                ms(p50),
                ms(p99),
                p99.as_secs_f64() / one_phase2.as_secs_f64()
            );
        }
        println!("| one phase 2 (`haproxy -c`, median) | {} | | |", ms(one_phase2));
    });
}
