//! Render time of the realistic routing example (`testdata/routing/`) at 10, 100,
//! 1,000 and 10,000 services, each with an endpoint slice of three endpoints and an
//! ingress routing a host and a path through the maps. One render = `haproxy.cfg`,
//! `maps/hosts.map`, `maps/paths.map`, `files/503.http` and `certs/default.pem`,
//! markers stripped, source map and content hash built.
//!
//! Also measured: converting all four snapshots to template values from scratch (what
//! happens once at start-up; later changes convert only the changed objects).
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
                b.iter(|| renderer.render(resources).expect("renders"));
            },
        );
    }
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

criterion_group!(benches, render, convert);
criterion_main!(benches);
