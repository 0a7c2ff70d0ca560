//! Render time of the realistic routing example (`testdata/routing/`) at 10, 100,
//! 1,000 and 10,000 services, each with an endpoint slice of three endpoints and an
//! ingress routing a host and a path through the maps. One render = `haproxy.cfg`,
//! `maps/hosts.map`, `maps/paths.map`, `files/503.http` and `certs/default.pem`,
//! markers stripped, source map and content hash built.
//!
//! `render` is a full render each time; `render_one_change` is the incremental
//! render after one endpoint slice changed (the change and its undoing applied in
//! turn to the resources rendered last, the update included), at 10,000 services.
//! `render_new_service` is the incremental render after a new service with its
//! endpoint slice and ingress (added and removed in turn), at 10,000 services: what
//! the controller's reload path renders.
//!
//! Also measured: building the template view of all four snapshots from scratch (what
//! happens once at start-up; later changes wrap only the changed objects). Objects
//! are read in place, so this no longer includes converting them; their structural
//! indexes are built by the first render.
//!
//! Renders with mimalloc as the allocator, as the `hapwright` binary does, and with
//! rayon's thread pool (one thread per core) for the files that render in parallel
//! with `haproxy.cfg`.
//!
//! Run: `cargo bench -p hapwright-reconciler --bench render`

#[path = "../testdata/fixtures.rs"]
mod fixtures;

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hapwright_eventbus::model::ResourceChange;
use hapwright_reconciler::renderer::{Renderer, Resources};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SIZES: [usize; 4] = [10, 100, 1_000, 10_000];

fn render(c: &mut Criterion) {
    let renderer = Renderer::new(fixtures::routing_templates(), &fixtures::WATCHED)
        .expect("the routing example loads");
    let mut group = c.benchmark_group("render");
    for n in SIZES {
        let resources = fixtures::resources(n);
        let config = renderer.render(&resources).expect("renders");
        assert!(config.main().lines().count() > n * 3);
        group.throughput(Throughput::Elements(n as u64));
        if n >= 1_000 {
            group.sample_size(20);
        }
        group.bench_with_input(
            BenchmarkId::from_parameter(n),
            &resources,
            |b, resources| {
                b.iter(|| renderer.render_full(resources).expect("renders"));
            },
        );
    }
    group.finish();
}

fn render_one_change(c: &mut Criterion) {
    let renderer = Renderer::new(fixtures::routing_templates(), &fixtures::WATCHED)
        .expect("the routing example loads");
    let mut group = c.benchmark_group("render_one_change");
    group.sample_size(20);
    let n = 10_000;
    let cluster = fixtures::cluster(n);
    let mut before = Resources::new();
    for (name, snapshot) in &cluster {
        before.update(&Arc::from(*name), snapshot.clone(), None);
    }
    // The same cluster with one endpoint of one slice no longer ready.
    let source: Arc<str> = Arc::from("endpoints");
    let unchanged = cluster.get("endpoints").expect("endpoints").clone();
    let (changed, change) = fixtures::one_endpoint_change(&cluster, n);
    let mut after = before.clone();
    after.update(&source, changed.clone(), Some(&change));
    let expected = renderer.render_full(&after).expect("renders");
    renderer.render(&before).expect("renders");
    assert_eq!(renderer.render(&after).expect("renders"), expected);
    group.throughput(Throughput::Elements(1));
    // Each iteration applies the change (or its undoing) to the resources rendered
    // last and renders, as the controller does: updates only go forward, so a
    // lookup is checked against the store's history of changed keys.
    group.bench_function(BenchmarkId::from_parameter(n), |b| {
        let mut current = after.clone();
        let mut flip = false;
        b.iter(|| {
            flip = !flip;
            let snapshot = if flip { &unchanged } else { &changed };
            current.update(&source, snapshot.clone(), Some(&change));
            renderer.render(&current).expect("renders")
        });
    });
    group.finish();
}

/// A new service (with its endpoint slice and ingress) at 10,000 services: a new
/// backend and map entries, what the controller's reload path renders. Each iteration
/// adds the service or removes it again.
fn render_new_service(c: &mut Criterion) {
    let renderer = Renderer::new(fixtures::routing_templates(), &fixtures::WATCHED)
        .expect("the routing example loads");
    let mut group = c.benchmark_group("render_new_service");
    group.sample_size(20);
    let n = 10_000;
    let cluster = fixtures::cluster(n);
    let without = fixtures::one_service_removed(&cluster, n);
    let mut resources = Resources::new();
    for (name, snapshot) in &cluster {
        resources.update(&Arc::from(*name), snapshot.clone(), None);
    }
    let full = resources.clone();
    let expected_with = renderer.render_full(&full).expect("renders");
    let apply = |resources: &mut Resources, add: bool| {
        for (name, snapshot, key) in &without {
            let (snapshot, change) = if add {
                let change = ResourceChange {
                    added: vec![key.clone()],
                    ..ResourceChange::default()
                };
                (cluster.get(name).expect("watched").clone(), change)
            } else {
                let change = ResourceChange {
                    removed: vec![key.clone()],
                    ..ResourceChange::default()
                };
                (snapshot.clone(), change)
            };
            resources.update(&Arc::from(*name), snapshot, Some(&change));
        }
    };
    renderer.render(&resources).expect("renders");
    apply(&mut resources, false);
    let expected_without = renderer.render_full(&resources).expect("renders");
    assert_eq!(
        renderer.render(&resources).expect("renders"),
        expected_without
    );
    apply(&mut resources, true);
    assert_eq!(renderer.render(&resources).expect("renders"), expected_with);
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::from_parameter(n), |b| {
        let mut add = true;
        b.iter(|| {
            add = !add;
            apply(&mut resources, add);
            renderer.render(&resources).expect("renders")
        });
    });
    group.finish();
}

fn convert(c: &mut Criterion) {
    let mut group = c.benchmark_group("convert_snapshots");
    group.sample_size(20);
    for n in [1_000, 10_000] {
        let snapshots = fixtures::cluster(n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(
            BenchmarkId::from_parameter(n),
            &snapshots,
            |b, snapshots| {
                b.iter(|| {
                    let mut resources = Resources::new();
                    for (name, snapshot) in snapshots {
                        resources.update(&Arc::from(*name), snapshot.clone(), None);
                    }
                    resources
                });
            },
        );
    }
    group.finish();
}

criterion_group!(
    benches,
    render,
    render_one_change,
    render_new_service,
    convert
);
criterion_main!(benches);
