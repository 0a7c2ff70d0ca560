//! Events per second through the bus versus the same traffic through a bare
//! `async-broadcast` channel, with 1 and 8 subscribers.
//!
//! Both sides move `EVENTS` messages from one publisher to every subscriber task on a
//! two-worker Tokio runtime, channel capacity 1024, nothing lost. The bus adds what it
//! exists for: event ids, timestamps, per-type counters, kind filtering, the spill
//! queue and per-subscriber accounting.
//!
//! Run: `cargo bench -p hapwright-eventbus --bench bus`

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hapwright_eventbus::{Bus, BusConfig, BusMetrics, KindSet, ResourceSyncComplete};
use prometheus::Registry;

const EVENTS: u64 = 20_000;
const CAPACITY: usize = 1024;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

async fn through_bus(metrics: &BusMetrics, subscribers: usize, source: &Arc<str>) {
    let bus = Bus::new(
        BusConfig {
            pipeline_capacity: CAPACITY,
            observer_capacity: CAPACITY,
            ..BusConfig::default()
        },
        metrics,
    );
    let mut tasks = Vec::with_capacity(subscribers);
    for index in 0..subscribers {
        let mut sub = bus
            .subscribe(format!("bench-{index}"), KindSet::all())
            .expect("before start");
        tasks.push(tokio::spawn(async move {
            let mut received = 0;
            while received < EVENTS {
                sub.recv().await.expect("open");
                received += 1;
            }
        }));
    }
    bus.start().expect("runtime present");
    let publisher = bus.publisher();
    for _ in 0..EVENTS {
        publisher.publish(ResourceSyncComplete {
            source: source.clone(),
        });
    }
    for task in tasks {
        task.await.expect("subscriber");
    }
    bus.close();
}

async fn through_bare_channel(subscribers: usize, source: &Arc<str>) {
    let (sender, template) = async_broadcast::broadcast::<Arc<ResourceSyncComplete>>(CAPACITY);
    let mut tasks = Vec::with_capacity(subscribers);
    for _ in 0..subscribers {
        let mut rx = template.clone();
        tasks.push(tokio::spawn(async move {
            let mut received = 0;
            while received < EVENTS {
                rx.recv_direct().await.expect("open");
                received += 1;
            }
        }));
    }
    drop(template);
    for _ in 0..EVENTS {
        sender
            .broadcast_direct(Arc::new(ResourceSyncComplete {
                source: source.clone(),
            }))
            .await
            .expect("receivers alive");
    }
    for task in tasks {
        task.await.expect("subscriber");
    }
}

fn bench(c: &mut Criterion) {
    let rt = runtime();
    let metrics = BusMetrics::register(&Registry::new()).expect("fresh registry");
    let source: Arc<str> = Arc::from("services");
    let mut group = c.benchmark_group("bus_throughput");
    group.throughput(Throughput::Elements(EVENTS));
    for subscribers in [1, 8] {
        group.bench_with_input(
            BenchmarkId::new("hapwright_bus", subscribers),
            &subscribers,
            |b, &n| b.to_async(&rt).iter(|| through_bus(&metrics, n, &source)),
        );
        group.bench_with_input(
            BenchmarkId::new("bare_async_broadcast", subscribers),
            &subscribers,
            |b, &n| b.to_async(&rt).iter(|| through_bare_channel(n, &source)),
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
