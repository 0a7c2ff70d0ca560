//! Bus requirements R1–R4, each proven against the real bus.

use std::time::Duration;

use hapwright_eventbus::{
    Bus, BusConfig, BusError, BusMetrics, CorrelationId, DriftDetected, EventKind, EventMeta,
    KindSet, ResourceSyncComplete,
};
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::time::timeout;

fn bus_with(config: BusConfig) -> (Bus, Registry) {
    let registry = Registry::new();
    let metrics = BusMetrics::register(&registry).expect("metrics register once");
    (Bus::new(config, &metrics), registry)
}

fn sync(source: &str) -> ResourceSyncComplete {
    ResourceSyncComplete {
        source: source.into(),
    }
}

fn source_of(event: &hapwright_eventbus::Event) -> String {
    match &event.payload {
        hapwright_eventbus::EventPayload::ResourceSyncComplete(e) => e.source.to_string(),
        other => panic!("unexpected event {other:?}"),
    }
}

fn metric_value(registry: &Registry, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    let family = registry
        .gather()
        .into_iter()
        .find(|family| family.name() == name)?;
    let is_counter = family.get_field_type() == prometheus::proto::MetricType::COUNTER;
    family
        .get_metric()
        .iter()
        .find(|metric| {
            label.is_none_or(|(key, value)| {
                metric
                    .get_label()
                    .iter()
                    .any(|l| l.name() == key && l.value() == value)
            })
        })
        .map(|metric| {
            if is_counter {
                metric.get_counter().get_value()
            } else {
                metric.get_gauge().get_value()
            }
        })
}

/// R1: events published before start reach every subscriber registered before start,
/// in order, wherever the subscriber registered between the publishes.
#[tokio::test]
async fn r1_pre_start_events_are_replayed_in_order_to_every_early_subscriber() {
    let (bus, _registry) = bus_with(BusConfig {
        pipeline_capacity: 4,
        observer_capacity: 4,
        ..BusConfig::default()
    });
    let publisher = bus.publisher();
    publisher.publish(sync("e0"));
    let mut first = bus.subscribe("first", KindSet::all()).unwrap();
    // More than the capacity before start: the channel grows instead of losing.
    for i in 1..50 {
        publisher.publish(sync(&format!("e{i}")));
    }
    let mut second = bus.subscribe("second", KindSet::all()).unwrap();
    let mut observer = bus.observe("observer", KindSet::all()).unwrap();
    publisher.publish(sync("e50"));
    bus.start().unwrap();
    publisher.publish(sync("e51"));

    for sub in [&mut first, &mut second, &mut observer] {
        for i in 0..=51 {
            let event = timeout(Duration::from_secs(5), sub.recv())
                .await
                .expect("replay delivered")
                .expect("bus open");
            assert_eq!(
                source_of(&event),
                format!("e{i}"),
                "subscriber {}",
                sub.name()
            );
        }
    }
}

#[tokio::test]
async fn r1_subscribing_after_start_is_refused() {
    let (bus, _registry) = bus_with(BusConfig::default());
    bus.start().unwrap();
    assert_eq!(
        bus.subscribe("late", KindSet::all()).unwrap_err(),
        BusError::AlreadyStarted("late".into())
    );
    assert!(matches!(
        bus.observe("late-observer", KindSet::all()),
        Err(BusError::AlreadyStarted(_))
    ));
    assert_eq!(bus.start(), Err(BusError::StartedTwice));
}

#[test]
fn start_outside_a_runtime_is_an_error() {
    let (bus, _registry) = bus_with(BusConfig::default());
    assert_eq!(bus.start(), Err(BusError::NoRuntime));
}

/// Typed subscriptions see only their kinds; envelope fields are filled in.
#[tokio::test]
async fn subscriptions_filter_by_kind_and_events_carry_envelopes() {
    let (bus, _registry) = bus_with(BusConfig::default());
    let mut drift_only = bus
        .subscribe("drift-only", [EventKind::DriftDetected])
        .unwrap();
    bus.start().unwrap();
    let publisher = bus.publisher();
    let correlation = CorrelationId::new();
    let cause = publisher.publish_with(sync("ignored"), EventMeta::correlated(correlation));
    publisher.publish_with(
        DriftDetected {
            instance: "edge-1".into(),
            detail: "hash differs".into(),
        },
        EventMeta {
            correlation_id: Some(correlation),
            caused_by: Some(cause),
        },
    );
    let event = timeout(Duration::from_secs(5), drift_only.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(event.kind(), EventKind::DriftDetected);
    assert_eq!(event.correlation_id, Some(correlation));
    assert_eq!(event.caused_by, Some(cause));
    assert!(event.id > cause);
    assert!(event.unix_micros > 1_600_000_000_000_000);
    assert!(drift_only.try_recv().is_none());
}

/// R2: a deliberately slow pipeline subscriber receives all of 1,000,000 events in
/// order, while an observer on the same bus loses events and every loss is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_slow_pipeline_subscriber_loses_nothing_and_observer_losses_are_counted() {
    const TOTAL: u64 = 1_000_000;
    let (bus, registry) = bus_with(BusConfig {
        pipeline_capacity: 256,
        observer_capacity: 64,
        ..BusConfig::default()
    });
    let mut slow = bus.subscribe("slow", KindSet::all()).unwrap();
    let mut observer = bus.observe("debug-ring", KindSet::all()).unwrap();
    bus.start().unwrap();
    let publisher = bus.publisher();

    let slow_task = tokio::spawn(async move {
        let mut received = 0u64;
        let mut last_id = 0;
        while received < TOTAL {
            let event = slow.recv().await.expect("bus stays open");
            assert!(event.id.0 > last_id, "events arrive in publish order");
            last_id = event.id.0;
            received += 1;
            if received.is_multiple_of(64) {
                // Deliberately slow: give the publisher the processor often.
                tokio::task::yield_now().await;
            }
        }
        received
    });
    let observer_task = tokio::spawn(async move {
        let mut received = 0u64;
        loop {
            let event = observer.recv().await.expect("bus stays open");
            received += 1;
            if received.is_multiple_of(16) {
                tokio::task::yield_now().await;
            }
            if event.id.0 == TOTAL {
                // The newest event is never evicted, so the observer always sees it.
                return received;
            }
        }
    });

    for i in 0..TOTAL {
        publisher.publish(sync(if i % 2 == 0 { "a" } else { "b" }));
    }

    let slow_received = timeout(Duration::from_secs(120), slow_task)
        .await
        .expect("slow subscriber finishes")
        .unwrap();
    let observed = timeout(Duration::from_secs(120), observer_task)
        .await
        .expect("observer finishes")
        .unwrap();
    assert_eq!(slow_received, TOTAL);
    let dropped = metric_value(
        &registry,
        "hapwright_events_dropped_total",
        Some(("subscriber", "debug-ring")),
    )
    .unwrap_or(0.0) as u64;
    assert!(
        dropped > 0,
        "the observer must have fallen behind in this test"
    );
    assert_eq!(
        observed + dropped,
        TOTAL,
        "every observer loss is counted exactly"
    );
    assert_eq!(
        metric_value(
            &registry,
            "hapwright_events_dropped_total",
            Some(("subscriber", "slow"))
        )
        .unwrap_or(0.0),
        0.0
    );
    assert_eq!(
        metric_value(
            &registry,
            "hapwright_events_published_total",
            Some(("type", "ResourceSyncComplete"))
        ),
        Some(TOTAL as f64)
    );
}

/// R4: depth and lag are visible per subscriber, and the publish counts per type.
#[tokio::test]
async fn r4_depth_lag_and_counts_are_exported() {
    let (bus, registry) = bus_with(BusConfig {
        pipeline_capacity: 8,
        observer_capacity: 8,
        ..BusConfig::default()
    });
    let mut behind = bus.subscribe("behind", KindSet::all()).unwrap();
    let _observer = bus.observe("idle-observer", KindSet::all()).unwrap();
    bus.start().unwrap();
    let publisher = bus.publisher();
    for _ in 0..20 {
        publisher.publish(sync("x"));
    }
    // 8 events in the channel, 12 in the spill queue.
    assert_eq!(
        metric_value(
            &registry,
            "hapwright_event_subscriber_depth",
            Some(("subscriber", "behind"))
        ),
        Some(8.0)
    );
    assert_eq!(
        metric_value(&registry, "hapwright_event_spill_depth", None),
        Some(12.0)
    );
    for _ in 0..20 {
        timeout(Duration::from_secs(5), behind.recv())
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        metric_value(
            &registry,
            "hapwright_event_subscriber_depth",
            Some(("subscriber", "behind"))
        ),
        Some(0.0)
    );
    assert!(
        metric_value(
            &registry,
            "hapwright_event_subscriber_lag_seconds",
            Some(("subscriber", "behind"))
        )
        .is_some()
    );
    let mut text = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut text)
        .unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains(r#"hapwright_events_published_total{type="ResourceSyncComplete"} 20"#));
    assert!(text.contains(
        r#"hapwright_event_subscriber_depth{delivery="observer",subscriber="idle-observer"} 8"#
    ));
}

/// Metrics registered once serve every bus built afterwards (one bus per reinit).
#[tokio::test]
async fn metrics_follow_the_newest_bus() {
    let registry = Registry::new();
    let metrics = BusMetrics::register(&registry).unwrap();
    let old = Bus::new(BusConfig::default(), &metrics);
    let _old_sub = old.subscribe("old-sub", KindSet::all()).unwrap();
    let new = Bus::new(BusConfig::default(), &metrics);
    let _new_sub = new.subscribe("new-sub", KindSet::all()).unwrap();
    let gathered = registry.gather();
    let depth = gathered
        .iter()
        .find(|f| f.name() == "hapwright_event_subscriber_depth")
        .unwrap();
    let subscribers: Vec<&str> = depth
        .get_metric()
        .iter()
        .flat_map(|m| m.get_label().iter())
        .filter(|l| l.name() == "subscriber")
        .map(|l| l.value())
        .collect();
    assert_eq!(subscribers, ["new-sub"]);
    assert!(
        BusMetrics::register(&registry).is_err(),
        "registering twice is refused"
    );
}

/// Closing ends subscriptions after they drain what is already queued.
#[tokio::test]
async fn close_ends_subscriptions() {
    let (bus, _registry) = bus_with(BusConfig::default());
    let mut sub = bus.subscribe("s", KindSet::all()).unwrap();
    bus.start().unwrap();
    bus.publisher().publish(sync("last"));
    bus.close();
    assert_eq!(source_of(&sub.recv().await.unwrap()), "last");
    assert!(sub.recv().await.is_none());
    // Publishing on a closed bus is harmless.
    bus.publisher().publish(sync("ignored"));
}

/// The stream form delivers the same events.
#[tokio::test]
async fn subscription_stream_delivers_in_order() {
    use futures::StreamExt;
    let (bus, _registry) = bus_with(BusConfig::default());
    let sub = bus.subscribe("stream", KindSet::all()).unwrap();
    bus.start().unwrap();
    for i in 0..3 {
        bus.publisher().publish(sync(&i.to_string()));
    }
    bus.close();
    let got: Vec<String> = sub.into_stream().map(|e| source_of(&e)).collect().await;
    assert_eq!(got, ["0", "1", "2"]);
}

/// A flood with a stalled pipeline subscriber: the spill queue stays within its
/// capacity by dropping superseded events (counted by kind), and the subscriber still
/// gets every event nothing supersedes, the newest of each kind and every object any
/// dropped resource update named, in publish order.
#[tokio::test]
async fn a_flood_keeps_the_spill_bounded_and_drops_only_superseded_events() {
    use hapwright_eventbus::model::{ObjectKey, ResourceChange, ResourceSnapshot};
    use hapwright_eventbus::{EventPayload, ReconciliationTriggered, ResourceIndexUpdated};
    use std::collections::BTreeSet;
    use std::sync::Arc;

    const SPILL: usize = 64;
    const TOTAL: u64 = 5_000;
    let (bus, registry) = bus_with(BusConfig {
        pipeline_capacity: 4,
        observer_capacity: 4,
        spill_capacity: SPILL,
    });
    let mut stalled = bus.subscribe("stalled", KindSet::all()).unwrap();
    bus.start().unwrap();
    let publisher = bus.publisher();
    let snapshot = Arc::new(ResourceSnapshot::new(Vec::new()));

    let mut published_keys: [BTreeSet<ObjectKey>; 2] = Default::default();
    let mut drifts = Vec::new();
    let mut last_trigger = String::new();
    let mut last_id = 0;
    for i in 0..TOTAL {
        let id = if i % 100 == 0 {
            // Fewer than SPILL of these: they are never dropped.
            drifts.push(format!("i{i}"));
            publisher.publish(DriftDetected {
                instance: format!("i{i}"),
                detail: String::new(),
            })
        } else if i % 3 == 0 {
            let source = usize::from(i % 2 == 1);
            let key = ObjectKey::new("default", format!("obj-{i}"));
            published_keys[source].insert(key.clone());
            publisher.publish(ResourceIndexUpdated {
                source: ["a", "b"][source].into(),
                snapshot: snapshot.clone(),
                change: Arc::new(ResourceChange {
                    added: vec![key],
                    ..ResourceChange::default()
                }),
            })
        } else {
            last_trigger = format!("t{i}");
            publisher.publish(ReconciliationTriggered {
                reason: last_trigger.clone(),
                sources: Vec::new(),
                waited: std::time::Duration::ZERO,
                follow_up: false,
            })
        };
        last_id = id.0;
        let spilled = metric_value(&registry, "hapwright_event_spill_depth", None).unwrap();
        assert!(
            spilled as usize <= SPILL,
            "spill grew to {spilled} after {i}"
        );
    }

    let mut received = 0u64;
    let mut seen_drifts = Vec::new();
    let mut seen_keys: [BTreeSet<ObjectKey>; 2] = Default::default();
    let mut newest_trigger = None;
    let mut newest_update = [0u64; 2];
    let mut previous = 0;
    loop {
        let event = timeout(Duration::from_secs(10), stalled.recv())
            .await
            .expect("every queued event arrives")
            .expect("bus open");
        assert!(event.id.0 > previous, "publish order");
        previous = event.id.0;
        received += 1;
        match &event.payload {
            EventPayload::DriftDetected(d) => seen_drifts.push(d.instance.clone()),
            EventPayload::ReconciliationTriggered(t) => newest_trigger = Some(t.reason.clone()),
            EventPayload::ResourceIndexUpdated(u) => {
                let source = usize::from(u.source.as_ref() == "b");
                newest_update[source] = event.id.0;
                let change = &u.change;
                for key in change.added.iter().chain(&change.modified) {
                    seen_keys[source].insert(key.clone());
                }
            }
            other => panic!("unexpected {other:?}"),
        }
        if event.id.0 == last_id {
            break;
        }
    }

    assert_eq!(
        seen_drifts, drifts,
        "no event that nothing supersedes is lost"
    );
    assert_eq!(
        newest_trigger,
        Some(last_trigger),
        "the newest trigger arrives"
    );
    assert_eq!(
        seen_keys, published_keys,
        "the updates that arrive name every object the dropped ones named"
    );
    let dropped_of = |kind: &str| {
        metric_value(
            &registry,
            "hapwright_event_spill_dropped_total",
            Some(("kind", kind)),
        )
        .unwrap_or(0.0) as u64
    };
    let dropped = dropped_of("ReconciliationTriggered") + dropped_of("ResourceIndexUpdated");
    assert!(dropped > 0, "the flood overflowed the spill");
    assert_eq!(dropped_of("DriftDetected"), 0);
    assert_eq!(
        received + dropped,
        TOTAL,
        "every event is delivered or counted"
    );
    assert!(newest_update[0] > 0 && newest_update[1] > 0);
}

#[tokio::test]
async fn event_ids_continue_across_buses_sharing_metrics() {
    // One set of metrics per process; every config reload builds a new bus with it.
    let registry = Registry::new();
    let metrics = BusMetrics::register(&registry).unwrap();
    let mut last = 0;
    for generation in 0..3 {
        let bus = Bus::new(BusConfig::default(), &metrics);
        let mut sub = bus.subscribe("test", KindSet::all()).unwrap();
        bus.start().unwrap();
        let publisher = bus.publisher();
        for _ in 0..2 {
            publisher.publish(sync("s"));
        }
        for _ in 0..2 {
            let event = timeout(Duration::from_secs(5), sub.recv())
                .await
                .expect("event arrives")
                .expect("bus open");
            assert!(
                event.id.0 > last,
                "generation {generation}: id {} after {last}",
                event.id
            );
            last = event.id.0;
        }
    }
    assert_eq!(last, 6);
}

/// Events published together arrive together: once a subscriber has the first, the
/// others are already queued behind it, in order, with consecutive ids — also when
/// the group overflows the pipeline into the spill queue.
#[tokio::test]
async fn events_published_together_are_queued_together_in_order() {
    let (bus, registry) = bus_with(BusConfig {
        pipeline_capacity: 4,
        ..BusConfig::default()
    });
    let publisher = bus.publisher();
    let mut subscriber = bus.subscribe("debouncer", KindSet::all()).unwrap();
    bus.start().unwrap();

    let ids = publisher.publish_all(["services", "endpoints"].map(|s| sync(s).into()));
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[1].0, ids[0].0 + 1);
    let first = timeout(Duration::from_secs(5), subscriber.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (first.id, source_of(&first)),
        (ids[0], "services".to_owned())
    );
    let second = subscriber.try_recv().expect("queued with the first");
    assert_eq!(
        (second.id, source_of(&second)),
        (ids[1], "endpoints".to_owned())
    );
    assert!(subscriber.try_recv().is_none());

    // More than the pipeline holds: the rest goes through the spill queue, in order.
    let names: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
    publisher.publish_all(names.iter().map(|n| sync(n).into()));
    for name in &names {
        let event = timeout(Duration::from_secs(5), subscriber.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&source_of(&event), name);
    }
    assert_eq!(
        metric_value(
            &registry,
            "hapwright_events_published_total",
            Some(("type", "ResourceSyncComplete"))
        ),
        Some(12.0)
    );
}
