//! `POST /-/approve`, `/debug/safety` and the status page while the safety valve
//! holds a change.

use hapwright_eventbus::{
    Bus, BusConfig, BusMetrics, EventKind, EventPayload, RemovalCount, SafetyRemoval,
    SafetyValveHeld, SafetyValveReleased,
};

use super::*;

const APPROVE: &str = "X-Hapwright-Approve: 1\r\n";

fn held(store: &StatusStore, metrics: &crate::status::StatusMetrics) -> ContentHash {
    let hash = rendered().hash();
    let since = std::time::SystemTime::now();
    store.apply(
        &event(
            1,
            None,
            SafetyValveHeld {
                hash,
                removal: SafetyRemoval {
                    backends: RemovalCount {
                        removed: 2,
                        total: 3,
                    },
                    servers: RemovalCount {
                        removed: 100,
                        total: 120,
                    },
                    map_entries: RemovalCount::default(),
                    removed_backends: vec!["be_default_web".into(), "be_default_api".into()],
                },
                max_removal: "50%".into(),
                since,
                release_at: since + Duration::from_secs(300),
            },
        ),
        Some(metrics),
    );
    hash
}

#[tokio::test]
async fn approve_releases_a_held_change_through_the_bus_and_nothing_otherwise() {
    let h = Harness::start().await;
    let registry = Registry::new();
    let metrics = crate::status::StatusMetrics::register(&registry).unwrap();
    let bus = Bus::new(
        BusConfig::default(),
        &BusMetrics::register(&registry).unwrap(),
    );
    let mut approvals = bus
        .subscribe("test", [EventKind::SafetyValveApproved])
        .unwrap();
    bus.start().unwrap();
    h.approve.set_publisher(bus.publisher());

    // Without the header, from a foreign host, or with nothing held: nothing happens.
    let (status, body) = h.raw("POST", "/-/approve", "localhost", "").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("X-Hapwright-Approve: 1"), "{body}");
    let (status, _) = h.raw("POST", "/-/approve", "evil.example", APPROVE).await;
    assert_eq!(status, 403);
    let (status, body) = h.raw("POST", "/-/approve", "localhost", APPROVE).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""status":"nothing-held""#), "{body}");
    assert!(approvals.try_recv().is_none());
    let (_, safety) = h.json("/debug/safety").await;
    assert_eq!(safety["held"], false);

    let hash = held(&h.store, &metrics);
    let (_, safety) = h.json("/debug/safety").await;
    assert_eq!(safety["held"], true);
    assert_eq!(
        safety["hold"]["summary"],
        "would remove 2 of 3 backends (67%), 100 of 120 servers (83%)"
    );
    assert_eq!(safety["hold"]["removal"]["servers"]["removed"], 100);
    let (_, page) = h.get("/").await;
    assert!(page.contains("Safety valve: a change is held"), "{page}");
    assert!(
        page.contains("would remove 2 of 3 backends (67%)"),
        "{page}"
    );
    assert!(page.contains("<code>be_default_web</code>"), "{page}");
    assert!(page.contains("X-Hapwright-Approve: 1"), "{page}");
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(text.contains("hapwright_safety_valve_held 1"), "{text}");
    assert!(
        text.contains("hapwright_safety_valve_holds_total 1"),
        "{text}"
    );

    let (status, body) = h.raw("POST", "/-/approve", "localhost", APPROVE).await;
    assert_eq!(status, 202, "{body}");
    assert!(body.contains(r#""status":"approved""#), "{body}");
    let approval = approvals.try_recv().expect("the approval reached the bus");
    let EventPayload::SafetyValveApproved(approved) = &approval.payload else {
        panic!("{approval:?}");
    };
    assert_eq!(approved.hash, Some(hash));

    // A second approval inside the window is rate limited.
    let (status, body) = h.raw("POST", "/-/approve", "localhost", APPROVE).await;
    assert_eq!(status, 429, "{body}");
    assert!(approvals.try_recv().is_none());

    h.store.apply(
        &event(
            2,
            None,
            SafetyValveReleased {
                hash,
                reason: "approved",
            },
        ),
        Some(&metrics),
    );
    let (_, safety) = h.json("/debug/safety").await;
    assert_eq!(safety["held"], false);
    assert_eq!(safety["lastRelease"]["reason"], "approved");
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(text.contains("hapwright_safety_valve_held 0"), "{text}");
    assert!(
        text.contains(r#"hapwright_safety_valve_releases_total{reason="approved"} 1"#),
        "{text}"
    );

    // With the lifecycle API off the endpoint does not exist.
    h.set_policy(|p| p.lifecycle_api = false);
    let (status, _) = h.raw("POST", "/-/approve", "localhost", APPROVE).await;
    assert_eq!(status, 404);
    h.server.shutdown().await;
}
