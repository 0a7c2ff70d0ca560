//! The CPU stages of a new route with dynamic backends, at 1,000 and 10,000 routes:
//! phase 1 from the previous model (and, for comparison, of the whole text), the
//! guess made before it, the equivalence rule, the plan. The render adds one
//! `backend NAME from routes` section (in the middle of the backends, so half the
//! sections move, or near the end) and its `hosts.map` entry, as the quickstart's
//! route propagation benchmark does (docs/benchmarks.md, (h)).
//!
//! `cargo bench --profile profiling -p hapwright-deployer --bench route_add`

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use hapwright_deployer::component::validator::equivalence::{self, Baseline};
use hapwright_deployer::component::validator::validate_phase1_reusing;
use hapwright_deployer::haproxy::backends::Capability;
use hapwright_deployer::haproxy::plan::{self, PlanOptions};
use hapwright_eventbus::model::{RenderedConfig, SourceMap};

/// The quickstart with dynamic backends at `routes` routes, plus the route `extra`
/// when given (in name order, as the quickstart's templates sort them).
fn render(routes: usize, extra: Option<&str>) -> RenderedConfig {
    let mut main = String::from(
        "global\n    log stderr format raw local0 notice\n    stats socket ipv4@127.0.0.1:9999 level admin\n\n\
defaults routes\n    balance roundrobin\n    mode http\n    log global\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
defaults\n    mode http\n    log global\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
frontend http\n    bind 127.0.0.1:${HTTP_PORT}\n    http-request set-var(txn.host) req.hdr(host),field(1,:),lower\n    use_backend %[var(txn.host),map(maps/hosts.map)] if { var(txn.host),map(maps/hosts.map) -m found }\n    default_backend be_no_route\n\n\
backend be_no_route\n    http-request return status 404 content-type text/plain string \"no route\\n\"\n\n",
    );
    let mut names: Vec<String> = (0..routes).map(|i| format!("route-{i:06}")).collect();
    names.extend(extra.map(str::to_owned));
    names.sort_unstable();
    let mut map = String::new();
    for name in &names {
        writeln!(map, "{name}.example.test be_default_{name}").unwrap();
        writeln!(
            main,
            "backend be_default_{name} from routes\n    server s1 127.0.0.1:9201 check\n"
        )
        .unwrap();
    }
    main.push_str("frontend demo\n    bind 127.0.0.1:9101\n    http-request return status 200 content-type text/plain string \"web v1\\n\"\n");
    let mut maps = BTreeMap::new();
    maps.insert("hosts.map".to_owned(), Arc::<str>::from(map));
    RenderedConfig::new(
        main,
        maps,
        BTreeMap::new(),
        BTreeMap::new(),
        SourceMap::default(),
    )
}

fn bench(c: &mut Criterion) {
    // The new route sorts into the middle of the others, or among the last (as
    // `route-N` among `bulk-N` and `churn-N` in the benchmark of (h)).
    for (routes, at, position) in [
        (1_000, 500, "middle"),
        (10_000, 5_000, "middle"),
        (10_000, 9_998, "end"),
    ] {
        let running = Arc::new(render(routes, None));
        let desired = Arc::new(render(routes, Some(&format!("route-{at:06}a"))));
        let (_, running_model) = validate_phase1_reusing(None, &running).expect("phase 1");
        let (_, desired_model) =
            validate_phase1_reusing(Some((&running, &running_model)), &desired).expect("phase 1");
        let baseline = Baseline {
            rendered: Arc::clone(&running),
            model: Arc::new(running_model.clone()),
        };
        assert!(
            equivalence::compare(&baseline, &desired, &desired_model).is_equivalent(),
            "the add passes by equivalence"
        );
        let options = PlanOptions {
            dynamic_backends: Capability::On,
        };
        let planned = plan::plan_with(&running, &running_model, &desired, &desired_model, &options);
        assert!(planned.reload.is_none(), "{:?}", planned.reload);
        let mut group = c.benchmark_group(format!("route_add_{routes}_routes_{position}"));
        group.sample_size(20);
        group.bench_function("phase1_reusing", |b| {
            b.iter(|| {
                validate_phase1_reusing(Some((&running, &running_model)), black_box(&desired))
                    .expect("phase 1")
            })
        });
        group.bench_function("phase1_whole", |b| {
            b.iter(|| validate_phase1_reusing(None, black_box(&desired)).expect("phase 1"))
        });
        group.bench_function("likely_equivalent", |b| {
            b.iter(|| equivalence::likely_equivalent(&baseline, black_box(&desired)))
        });
        group.bench_function("equivalence", |b| {
            b.iter(|| equivalence::compare(&baseline, black_box(&desired), &desired_model))
        });
        group.bench_function("plan", |b| {
            b.iter(|| {
                plan::plan_with(
                    &running,
                    &running_model,
                    black_box(&desired),
                    &desired_model,
                    &options,
                )
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
