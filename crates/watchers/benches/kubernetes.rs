//! Benchmarks of the `kubernetes` source's core ([`Store`]), without HTTP:
//!
//! - `kubernetes_store/relist_10k`: a (re)list of 10,000 EndpointSlice-like objects
//!   of about 1 KB (with `managedFields` and the last-applied annotation to strip)
//!   applied to an empty store: fill in `apiVersion`/`kind`, strip, serialize,
//!   index, then the one change;
//! - `kubernetes_store/watch_event_on_10k`: one `MODIFIED` watch event applied to a
//!   store holding 10,000 objects, plus the change and the snapshot clone a
//!   publication takes.
//!
//! Run with `cargo bench -p hapwright-watchers --bench kubernetes`.

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use hapwright_watchers::config::default_index_by;
use hapwright_watchers::kubernetes::KubernetesSource;
use hapwright_watchers::kubernetes::source::Store;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::Event;
use serde_json::json;

const OBJECTS: usize = 10_000;

fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("discovery.k8s.io", "v1", "EndpointSlice"),
        "endpointslices",
    )
}

/// One EndpointSlice of about 1 KB as the API server lists it.
fn slice(index: usize, revision: usize) -> DynamicObject {
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("web-{index}-abcde"),
            "namespace": format!("ns-{}", index % 50),
            "resourceVersion": format!("{}", 1000 + index + revision),
            "uid": format!("0000-{index:08}"),
            "labels": {"kubernetes.io/service-name": format!("web-{index}"), "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"apiVersion\":\"discovery.k8s.io/v1\",\"kind\":\"EndpointSlice\"}"},
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "discovery.k8s.io/v1", "time": "2026-11-22T05:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:addressType": {}, "f:endpoints": {}, "f:ports": {}}}],
        },
        "addressType": "IPv4",
        "endpoints": (0..3).map(|e| json!({
            "addresses": [format!("10.{}.{}.{}", index / 65536 % 256, index / 256 % 256, e + revision % 200)],
            "conditions": {"ready": true, "serving": true, "terminating": false},
            "nodeName": format!("node-{e}"),
        })).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap()
}

fn filled(objects: &[DynamicObject]) -> Store {
    let mut store = Store::new(
        api_resource(),
        &[None],
        KubernetesSource::default_ignore_fields(),
        default_index_by(),
    );
    store.apply(0, Event::Init);
    for object in objects {
        store.apply(0, Event::InitApply(object.clone()));
    }
    store.apply(0, Event::InitDone);
    store
}

fn bench(c: &mut Criterion) {
    let objects: Vec<DynamicObject> = (0..OBJECTS).map(|i| slice(i, 0)).collect();
    let bytes: usize = objects
        .iter()
        .map(|o| serde_json::to_vec(o).unwrap().len())
        .sum();
    eprintln!(
        "kubernetes_store: {OBJECTS} objects, {} bytes of JSON each on average",
        bytes / OBJECTS
    );
    let mut group = c.benchmark_group("kubernetes_store");
    group.sample_size(10);
    group.bench_function("relist_10k", |b| {
        b.iter_batched(
            || objects.clone(),
            |objects| {
                let mut store = filled(&objects);
                let change = store.take_change();
                assert_eq!(change.added.len(), OBJECTS);
                store
            },
            BatchSize::LargeInput,
        );
    });
    let mut store = filled(&objects);
    store.take_change();
    let mut revision = 1;
    group.sample_size(100);
    group.bench_function("watch_event_on_10k", |b| {
        b.iter_batched(
            || {
                revision += 1;
                slice(4242, revision)
            },
            |object| {
                store.apply(0, Event::Apply(object));
                let change = store.take_change();
                assert_eq!(change.modified.len(), 1);
                std::sync::Arc::new(store.snapshot().clone())
            },
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
