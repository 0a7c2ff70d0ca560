//! Benchmarks of the `files` source (issue #3 targets):
//!
//! - `initial_sync/10k_objects_1k_files`: list, read, hash, parse and index 10,000
//!   objects of about 1 KB spread over 1,000 files (target ≤ 1 s);
//! - `change_latency/write_to_event`: one file rewritten in that directory → the
//!   `ResourceIndexUpdated` event received from the bus, through real notify
//!   watching, with the settle delay set to zero so the number excludes any
//!   configured debounce (target ≤ 50 ms p50);
//! - memory per stored object: heap held by a scanner with the 10,000 objects,
//!   counted by an instrumented global allocator, per object and relative to the
//!   object's JSON size (target ≤ 3 KB of heap per 1 KB object). Printed once at
//!   start.
//!
//! Run with `cargo bench -p hapwright-watchers --bench files`.

use std::alloc::System;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use hapwright_eventbus::config::Duration as ConfigDuration;
use hapwright_eventbus::{Bus, BusConfig, BusMetrics, EventKind, EventPayload, Kernel};
use hapwright_watchers::FilesSource;
use hapwright_watchers::config::{FilesConfig, default_index_by};
use hapwright_watchers::files::{ScanMode, Scanner};
use hapwright_watchers::manifest::Filter;
use hapwright_watchers::yaml::Limits;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const FILES: usize = 1_000;
const PER_FILE: usize = 10;

/// Content revision of the rewritten file; never repeats, so every write is a change.
static REVISION: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

/// One Service manifest of about 1 KB of JSON.
fn object(file: usize, index: usize, revision: usize) -> String {
    let labels: String = (0..8)
        .map(|l| format!("    label-{l}.example.com/key: value-{file}-{index}-{l}\n"))
        .collect();
    let ports: String = (0..6)
        .map(|p| {
            format!(
                "    - {{name: port-{p}, port: {}, targetPort: {}, protocol: TCP}}\n",
                8000 + p,
                9000 + p + revision
            )
        })
        .collect();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: svc-{file}-{index}\n  namespace: ns-{}\n  labels:\n{labels}  annotations:\n    description: a service used to measure the files source, revision {revision}\nspec:\n  type: ClusterIP\n  clusterIP: 10.0.{}.{}\n  selector: {{app: app-{file}-{index}}}\n  ports:\n{ports}",
        file % 20,
        file % 250,
        index
    )
}

fn write_file(dir: &Path, file: usize, revision: usize) {
    let content: Vec<String> = (0..PER_FILE).map(|i| object(file, i, revision)).collect();
    std::fs::write(dir.join(format!("f{file:04}.yaml")), content.join("---\n")).unwrap();
}

fn populate(dir: &Path) {
    for file in 0..FILES {
        write_file(dir, file, 0);
    }
}

fn scanner(dir: &Path) -> Scanner {
    Scanner::new(
        "bench",
        &FilesConfig::new(dir),
        Filter::default(),
        default_index_by(),
        Limits::default(),
    )
}

fn memory_breakdown(dir: &Path) {
    let region = Region::new(GLOBAL);
    let mut values = Vec::new();
    for file in 0..FILES {
        let bytes = std::fs::read(dir.join(format!("f{file:04}.yaml"))).unwrap();
        let manifest = hapwright_watchers::manifest::parse(
            &bytes,
            "f",
            &Filter::default(),
            &Limits::default(),
        )
        .unwrap();
        values.extend(manifest.objects);
    }
    let stats = region.change();
    let held = stats.bytes_allocated as i64 - stats.bytes_deallocated as i64;
    println!(
        "breakdown: parsed serde_json values (transient: dropped once serialized): {} B/object",
        held / values.len() as i64
    );
    let region = Region::new(GLOBAL);
    let mut snapshot = hapwright_eventbus::model::ResourceSnapshot::new(default_index_by());
    for (key, value) in &values {
        snapshot.upsert(key.clone(), value);
    }
    let stats = region.change();
    let held = stats.bytes_allocated as i64 - stats.bytes_deallocated as i64;
    // The text of each object is one `Arc<str>` allocation: two counters + the bytes.
    let text: usize = snapshot.list().map(|o| o.len() + 16).sum();
    let count = values.len() as i64;
    println!(
        "breakdown: snapshot: {} B/object = JSON text {} + map, index and index keys {}",
        held / count,
        text as i64 / count,
        (held - text as i64) / count
    );
}

fn memory_report(dir: &Path) {
    memory_breakdown(dir);
    let region = Region::new(GLOBAL);
    let mut scanner = scanner(dir);
    let report = scanner.scan(ScanMode::Full);
    let stats = region.change();
    assert_eq!(report.change.added.len(), FILES * PER_FILE);
    let held = stats.bytes_allocated as i64 - stats.bytes_deallocated as i64;
    let json_bytes: usize = scanner
        .snapshot()
        .list()
        .map(hapwright_eventbus::model::StoredObject::len)
        .sum();
    let objects = scanner.snapshot().len();
    let per_object = held as f64 / objects as f64;
    let json_per_object = json_bytes as f64 / objects as f64;
    println!(
        "memory: {objects} objects, {held} bytes of heap held ({per_object:.0} B/object); \
         JSON size {json_per_object:.0} B/object; heap per 1 KB of JSON: {:.2} KB",
        per_object / json_per_object
    );
}

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path());
    memory_report(dir.path());
    if std::env::var_os("FILES_BENCH_MEMORY_ONLY").is_some() {
        return;
    }

    let mut group = c.benchmark_group("initial_sync");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    group.bench_function("10k_objects_1k_files", |b| {
        b.iter(|| {
            let mut scanner = scanner(dir.path());
            let report = scanner.scan(ScanMode::Full);
            assert_eq!(report.change.added.len(), FILES * PER_FILE);
            scanner
        });
    });
    group.finish();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("change_latency");
    group.sample_size(50);
    group.measurement_time(Duration::from_secs(10));
    group.bench_function("write_to_event", |b| {
        b.to_async(&runtime).iter_custom(|iterations| {
            let dir = dir.path().to_path_buf();
            async move {
                let registry = prometheus::Registry::new();
                let metrics = BusMetrics::register(&registry).unwrap();
                let bus = Bus::new(BusConfig::default(), &metrics);
                let mut events = bus
                    .subscribe("bench", [EventKind::ResourceIndexUpdated])
                    .unwrap();
                let mut config = FilesConfig::new(&dir);
                config.settle = ConfigDuration::from_millis(0);
                let mut kernel = Kernel::new(bus);
                kernel.register(FilesSource::from_parts(
                    "bench",
                    &config,
                    Filter::default(),
                    default_index_by(),
                ));
                let running = kernel.start().unwrap();
                events.recv().await.unwrap(); // initial sync
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    let revision = REVISION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let content: Vec<String> =
                        (0..PER_FILE).map(|o| object(7, o, revision)).collect();
                    let content = content.join("---\n");
                    let started = Instant::now();
                    std::fs::write(dir.join("f0007.yaml"), content).unwrap();
                    loop {
                        let event = tokio::time::timeout(Duration::from_secs(10), events.recv())
                            .await
                            .expect("update within 10 s")
                            .unwrap();
                        if let EventPayload::ResourceIndexUpdated(update) = &event.payload
                            && !update.change.modified.is_empty()
                        {
                            break;
                        }
                    }
                    total += started.elapsed();
                }
                running.shutdown(Duration::from_secs(5)).await;
                total
            }
        });
    });
    group.finish();
}

criterion_group!(files, benches);
criterion_main!(files);
