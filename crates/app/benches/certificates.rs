//! The render of a new certificate in the Ingress library
//! (`examples/kubernetes-ingress/`) at 10,000 TLS Secrets, each used by its own
//! Ingress and host: a new Secret (one render: no Ingress names it yet), then its
//! Ingress (one render), a renewal of that Secret, and the removal of both, in
//! turn. Prints
//! the p50 and p95 of each render and of its stages (`RenderStats::stages`).
//!
//! This is the render part of the `--certificates` scenario of
//! `hapwright-benchsuite`, without HAProxy, the watchers, the validator or the
//! deployer beside it on the CPU: where a change's render time goes.
//!
//! Run: `cargo bench -p hapwright-app --bench certificates` (`CERT_BENCH_SECRETS`
//! sets the number of Secrets, default 10,000; `CERT_BENCH_CHANGES` the changes of
//! each kind, default 30).

use std::sync::Arc;
use std::time::Duration;

use hapwright_app::build;
use hapwright_app::config;
use hapwright_eventbus::model::{ObjectKey, ResourceChange, ResourceSnapshot, UpsertOutcome};
use hapwright_reconciler::renderer::{RenderStats, Renderer, Resources};
use serde_json::{Value, json};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn secret(name: &str, crt: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": { "name": name, "namespace": "bench" },
        "data": { "tls.crt": crt, "tls.key": "a2V5" }
    })
}

fn ingress(name: &str, host: &str, created: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": { "name": name, "namespace": "bench", "creationTimestamp": created },
        "spec": {
            "ingressClassName": "hapwright",
            "tls": [ { "hosts": [host], "secretName": name } ],
            "rules": [ { "host": host, "http": { "paths": [ {
                "path": "/", "pathType": "Prefix",
                "backend": { "service": { "name": "web", "port": { "number": 80 } } }
            } ] } } ]
        }
    })
}

/// The resources with both sources as they are, `change` applied to `source`.
struct Cluster {
    resources: Resources,
    snapshots: [(Arc<str>, ResourceSnapshot); 2],
}

impl Cluster {
    fn apply(&mut self, source: usize, key: ObjectKey, object: Option<&Value>) {
        let (name, snapshot) = &mut self.snapshots[source];
        let mut change = ResourceChange::default();
        match object {
            Some(object) => match snapshot.upsert(key.clone(), object) {
                Some(UpsertOutcome::Added) => change.added.push(key),
                Some(UpsertOutcome::Modified) => change.modified.push(key),
                None => {}
            },
            None => {
                snapshot.remove(&key);
                change.removed.push(key);
            }
        }
        self.resources
            .update(name, Arc::new(snapshot.clone()), Some(&change));
    }
}

#[derive(Default)]
struct Samples {
    total: Vec<Duration>,
    reuse: Vec<Duration>,
    templates: Vec<Duration>,
    sets: Vec<Duration>,
    finish: Vec<Duration>,
}

impl Samples {
    fn push(&mut self, elapsed: Duration, stats: &RenderStats) {
        self.total.push(elapsed);
        self.reuse.push(stats.stages.reuse);
        self.templates.push(stats.stages.templates);
        self.sets.push(stats.stages.sets);
        self.finish.push(stats.stages.finish);
    }

    fn print(&mut self, what: &str) {
        let row = |samples: &mut Vec<Duration>| {
            samples.sort();
            let at = |q: f64| {
                let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
                samples[rank - 1].as_secs_f64() * 1000.0
            };
            format!("{:.2} / {:.2}", at(0.5), at(0.95))
        };
        println!(
            "| {what} | {} | {} | {} | {} | {} |",
            row(&mut self.total),
            row(&mut self.reuse),
            row(&mut self.templates),
            row(&mut self.sets),
            row(&mut self.finish)
        );
    }
}

fn render(renderer: &Renderer, resources: &Resources, samples: &mut Samples) {
    let started = std::time::Instant::now();
    let (config, stats) = renderer.render_with_stats(resources);
    let elapsed = started.elapsed();
    config.expect("the change renders");
    assert!(stats.full_reason.is_none(), "incremental: {stats:?}");
    samples.push(elapsed, &stats);
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test` runs it once, small.
    let quick = !std::env::args().any(|a| a == "--bench");
    let number = |name: &str, default: usize, small: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(if quick { small } else { default })
    };
    let secrets = number("CERT_BENCH_SECRETS", 10_000, 50);
    let changes = number("CERT_BENCH_CHANGES", 30, 2);
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/kubernetes-ingress/hapwright.yaml"),
    )
    .unwrap();
    let (config, _) = config::parse(&text, &dir.path().join("hapwright.yaml"), "hapwright.yaml")
        .expect("the Ingress library parses");
    let renderer = build::renderer(&config).expect("the Ingress library loads");
    let index_by = |name: &str| config.watched_resources.resources[name].index_by.clone();
    let mut resources = Resources::new();
    for name in build::watched_names(&config) {
        resources.update(
            &Arc::from(name.as_str()),
            Arc::new(ResourceSnapshot::new(index_by(&name))),
            None,
        );
    }
    let mut ingresses = ResourceSnapshot::new(index_by("ingresses"));
    let mut tls = ResourceSnapshot::new(index_by("secrets"));
    for i in 0..secrets {
        let name = format!("bg-{i}");
        let created = "2020-01-01T00:00:00Z";
        tls.upsert(ObjectKey::new("bench", &name), &secret(&name, "Y3J0"));
        ingresses.upsert(
            ObjectKey::new("bench", &name),
            &ingress(&name, &format!("bg-{i}.example.test"), created),
        );
    }
    resources.update(&Arc::from("secrets"), Arc::new(tls.clone()), None);
    resources.update(&Arc::from("ingresses"), Arc::new(ingresses.clone()), None);
    let started = std::time::Instant::now();
    let first = renderer.render(&resources).expect("the first render");
    println!(
        "{secrets} TLS Secrets: first render {:.0} ms, {} files",
        started.elapsed().as_secs_f64() * 1000.0,
        first.iter().count()
    );
    let mut cluster = Cluster {
        resources,
        snapshots: [
            (Arc::from("secrets"), tls),
            (Arc::from("ingresses"), ingresses),
        ],
    };
    let (mut unused, mut add, mut renew, mut remove) = Default::default();
    for k in 0..changes {
        let name = format!("new-{k}");
        let key = ObjectKey::new("bench", &name);
        // The Secret first, as it often arrives: no Ingress names it yet.
        cluster.apply(0, key.clone(), Some(&secret(&name, "Y3J0")));
        render(&renderer, &cluster.resources, &mut unused);
        cluster.apply(
            1,
            key.clone(),
            Some(&ingress(
                &name,
                &format!("new-{k}.example.test"),
                "2030-01-01T00:00:00Z",
            )),
        );
        render(&renderer, &cluster.resources, &mut add);
        cluster.apply(0, key.clone(), Some(&secret(&name, "Y3J0Mg==")));
        render(&renderer, &cluster.resources, &mut renew);
        cluster.apply(1, key.clone(), None);
        cluster.apply(0, key, None);
        render(&renderer, &cluster.resources, &mut remove);
    }
    println!("\nms, p50 / p95 of {changes} renders each\n");
    println!("| change | render | reuse | templates | sets | finish |");
    println!("|---|---:|---:|---:|---:|---:|");
    unused.print("a Secret no Ingress names");
    add.print("new certificate (its Ingress)");
    renew.print("renewal");
    remove.print("removal");
}
