//! Change-plan computation at 10,000 backends (target ≤ 20 ms).
//!
//! `cargo bench -p hapwright-deployer --bench plan`

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use hapwright_deployer::haproxy::config as haproxy_config;
use hapwright_deployer::haproxy::plan;
use hapwright_eventbus::model::{RenderedConfig, SourceMap};

/// N backends with 3 servers each, as in the HAProxy 2.6 lab, plus an N-entry map.
fn render(backends: usize, changed_port: u16) -> RenderedConfig {
    let mut main = String::from(
        "global\n    maxconn 4096\n\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
frontend fe_main\n    bind 127.0.0.1:8080\n    use_backend %[req.hdr(host),lower,word(1,:),map(maps/hosts.map,be_default)]\n    default_backend be_default\n\n\
backend be_default\n    http-request return status 404\n\n",
    );
    let mut map = String::new();
    for i in 0..backends {
        writeln!(map, "host{i}.example.com be_{i}").unwrap();
        write!(main, "backend be_{i}\n    balance roundrobin\n").unwrap();
        for s in 0..3u16 {
            let port = if i == backends / 2 && s == 0 {
                changed_port
            } else {
                9001 + s
            };
            writeln!(main, "    server s{s} 127.0.0.1:{port} check").unwrap();
        }
        main.push('\n');
    }
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
    let running = render(10_000, 9001);
    let desired = render(10_000, 9101);
    let running_model = haproxy_config::parse(running.main()).unwrap();
    let desired_model = haproxy_config::parse(desired.main()).unwrap();
    let check = plan::plan(&running, &running_model, &desired, &desired_model);
    assert_eq!(
        check.ops.len(),
        2,
        "one address change plus its session shutdown"
    );
    let mut group = c.benchmark_group("plan_10000_backends");
    group.sample_size(20);
    group.bench_function("plan_parsed", |b| {
        b.iter(|| {
            plan::plan(
                black_box(&running),
                &running_model,
                black_box(&desired),
                &desired_model,
            )
        })
    });
    group.bench_function("parse_desired_and_plan", |b| {
        b.iter(|| {
            let model = haproxy_config::parse(black_box(desired.main())).unwrap();
            plan::plan(&running, &running_model, &desired, &model)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
