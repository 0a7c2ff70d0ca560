//! The debouncer under paused time: quiet period, max wait, bursts, and the initial
//! sync gate with its timeout.

mod support;

use std::time::Duration;

use hapwright_eventbus::{EventKind, EventPayload, HealthState, ReconciliationTriggered};
use hapwright_reconciler::debouncer::{Debouncer, Settings};
use support::{Harness, snapshot};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

fn settings() -> Settings {
    Settings {
        debounce: Duration::from_millis(200),
        max_wait: Duration::from_secs(2),
        sync_timeout: Duration::from_secs(30),
        // The trailing-only behaviour; the leading edge has its own tests below.
        leading_edge: false,
        leading_group: Duration::from_millis(10),
    }
}

fn leading() -> Settings {
    Settings {
        leading_edge: true,
        ..settings()
    }
}

fn start(settings: Settings, sources: &[&str]) -> Harness {
    Harness::start(
        vec![Box::new(Debouncer::new(settings, sources.iter().copied()))],
        &[EventKind::ReconciliationTriggered],
    )
}

fn trigger(event: &hapwright_eventbus::Event) -> &ReconciliationTriggered {
    match &event.payload {
        EventPayload::ReconciliationTriggered(t) => t,
        other => panic!("expected a trigger, got {other:?}"),
    }
}

/// Publishes `count` updates, `every` apart, alternating over `sources`, from a task.
fn stream(
    h: &Harness,
    sources: &'static [&'static str],
    count: usize,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let publisher = h.publisher.clone();
    tokio::spawn(async move {
        for i in 0..count {
            publisher.publish(hapwright_eventbus::ResourceIndexUpdated {
                source: sources[i % sources.len()].into(),
                snapshot: snapshot(&format!("s{i}")),
                change: Default::default(),
            });
            tokio::time::sleep(every).await;
        }
    })
}

/// Starts a debouncer over `sources` and completes their initial sync.
async fn synced(settings: Settings, sources: &[&str]) -> Harness {
    let mut harness = start(settings, sources);
    for source in sources {
        harness.synced(source);
    }
    let first = harness.next().await;
    assert!(trigger(&first).reason.starts_with("initial sync complete"));
    harness
}

#[tokio::test(start_paused = true)]
async fn fires_after_the_quiet_period_following_the_last_change() {
    let mut h = synced(settings(), &["services", "endpoints"]).await;
    let t0 = Instant::now();
    h.update("services", snapshot("a"));
    tokio::time::sleep(150 * MS).await;
    h.update("endpoints", snapshot("b"));
    tokio::time::sleep(150 * MS).await;
    h.update("services", snapshot("c"));

    let event = h.next().await;
    // Last change at 300 ms, quiet period 200 ms.
    assert_eq!(event.at - t0, 500 * MS);
    let t = trigger(&event);
    assert_eq!(t.reason, "resources changed: endpoints, services");
    let sources: Vec<&str> = t.sources.iter().map(AsRef::as_ref).collect();
    assert_eq!(sources, ["endpoints", "services"]);
    assert!(event.caused_by.is_some());
    // Nothing else follows.
    assert!(h.next_within(Duration::from_secs(10)).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn max_wait_bounds_a_constant_stream_of_changes() {
    let mut h = synced(settings(), &["services"]).await;
    let t0 = Instant::now();
    let stream = stream(&h, &["services"], 60, 100 * MS);
    let first = h.next().await;
    assert_eq!(first.at - t0, Duration::from_secs(2));
    assert_eq!(
        trigger(&first).reason,
        "resources changed: services (max wait 2s reached)"
    );
    let second = h.next().await;
    assert_eq!(second.at - first.at, Duration::from_secs(2));
    stream.await.unwrap();
    // The third batch starts with the change at 4 s (handled right after the second
    // trigger fired), so max wait closes it at 6 s, after the stream's last change
    // (5.9 s); nothing follows.
    let third = h.next().await;
    assert_eq!(third.at - t0, Duration::from_secs(6));
    assert!(h.next_within(Duration::from_secs(10)).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_ten_thousand_updates_gives_one_trigger() {
    let mut h = synced(settings(), &["services", "endpoints"]).await;
    let t0 = Instant::now();
    for i in 0..10_000 {
        let source = if i % 2 == 0 { "services" } else { "endpoints" };
        h.update(source, snapshot("x"));
    }
    let event = h.next().await;
    assert_eq!(event.at - t0, 200 * MS);
    assert_eq!(trigger(&event).sources.len(), 2);
    assert!(h.next_within(Duration::from_secs(60)).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn first_trigger_waits_for_every_source_to_sync() {
    let mut h = start(settings(), &["services", "endpoints"]);
    let t0 = Instant::now();
    h.update("services", snapshot("a"));
    h.synced("services");
    // Changes before the initial sync never trigger on their own.
    assert!(h.next_within(Duration::from_secs(10)).await.is_none());
    h.update("endpoints", snapshot("b"));
    h.synced("endpoints");
    let event = h.next().await;
    assert_eq!(
        event.at - t0,
        Duration::from_secs(10),
        "fires as soon as the last source syncs"
    );
    let t = trigger(&event);
    assert_eq!(t.reason, "initial sync complete: endpoints, services");
    assert_eq!(t.sources.len(), 2);
    assert!(h.next_within(Duration::from_secs(10)).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn sync_timeout_proceeds_and_names_the_late_source() {
    let mut h = start(settings(), &["services", "endpoints"]);
    let t0 = Instant::now();
    h.synced("services");
    h.update("services", snapshot("a"));
    let event = h.next().await;
    assert_eq!(event.at - t0, Duration::from_secs(30));
    assert_eq!(
        trigger(&event).reason,
        "initial sync timed out after 30s; still waiting for: endpoints; changed: services"
    );
    let health = h.kernel.health().get("debouncer").expect("health");
    assert_eq!(health.state, HealthState::Unhealthy);
    assert!(health.reason.unwrap().contains("endpoints"));

    // The late source catches up: healthy again, and its data triggers normally.
    h.synced("endpoints");
    h.update("endpoints", snapshot("b"));
    let event = h.next().await;
    assert_eq!(trigger(&event).reason, "resources changed: endpoints");
    assert_eq!(
        h.kernel.health().get("debouncer").unwrap().state,
        HealthState::Healthy
    );
}

#[tokio::test(start_paused = true)]
async fn no_sources_means_an_immediate_first_render() {
    let mut h = start(settings(), &[]);
    let t0 = Instant::now();
    let event = h.next().await;
    assert_eq!(event.at, t0);
    assert_eq!(
        trigger(&event).reason,
        "initial render (no watched resources)"
    );
}

#[tokio::test(start_paused = true)]
async fn sync_complete_from_unknown_sources_is_ignored() {
    let mut h = start(settings(), &["services"]);
    h.synced("other");
    assert!(h.next_within(Duration::from_secs(5)).await.is_none());
    h.synced("services");
    assert!(h.next_within(Duration::from_secs(1)).await.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_lone_change_after_a_quiet_period_fires_at_once() {
    let mut h = synced(leading(), &["services"]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    h.update("services", snapshot("a"));
    let event = h.next().await;
    assert_eq!(event.at, t0);
    assert_eq!(
        trigger(&event).reason,
        "resources changed: services (leading edge)"
    );
    assert!(event.caused_by.is_some());
    assert!(h.next_within(Duration::from_secs(10)).await.is_none());

    // Once more after another quiet period.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t1 = Instant::now();
    h.update("services", snapshot("b"));
    assert_eq!(h.next().await.at, t1);
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_a_hundred_changes_in_a_second_makes_at_most_three_triggers() {
    let mut h = synced(leading(), &["services", "endpoints"]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    let burst = stream(&h, &["services", "endpoints"], 100, 10 * MS);
    let mut triggers = Vec::new();
    while let Some(event) = h.next_within(Duration::from_secs(5)).await {
        triggers.push(event);
    }
    burst.await.unwrap();
    assert!(triggers.len() <= 3, "{} triggers", triggers.len());
    // The first change went at once; the rest were coalesced into what followed,
    // the last one the quiet period after the burst's last change (990 ms).
    assert_eq!(triggers[0].at, t0);
    assert!(trigger(&triggers[0]).reason.ends_with("(leading edge)"));
    let last = triggers.last().unwrap();
    assert_eq!(last.at - t0, 1190 * MS);
    assert_eq!(trigger(last).sources.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn with_the_leading_edge_max_wait_still_bounds_a_constant_stream() {
    let mut h = synced(leading(), &["services"]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    let stream = stream(&h, &["services"], 60, 100 * MS);
    let first = h.next().await;
    assert_eq!(first.at, t0);
    // The change at 100 ms opens the next batch; max wait closes it at 2.1 s.
    let second = h.next().await;
    assert_eq!(second.at - t0, 2100 * MS);
    assert!(trigger(&second).reason.ends_with("(max wait 2s reached)"));
    let third = h.next().await;
    assert_eq!(third.at - second.at, Duration::from_secs(2));
    stream.await.unwrap();
    // Changes never stopped for a debounce period: no second leading edge.
    let mut rest = Vec::new();
    while let Some(event) = h.next_within(Duration::from_secs(10)).await {
        rest.push(event);
    }
    assert!(
        rest.iter()
            .all(|e| !trigger(e).reason.ends_with("(leading edge)")),
        "{rest:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn changes_right_after_the_initial_sync_are_coalesced() {
    // A change during the initial sync counts as recent: the next one is batched.
    let mut h = start(leading(), &["services"]);
    h.update("services", snapshot("a"));
    h.synced("services");
    let first = h.next().await;
    assert!(trigger(&first).reason.starts_with("initial sync complete"));
    let t0 = Instant::now();
    h.update("services", snapshot("b"));
    let event = h.next().await;
    assert_eq!(event.at - t0, 200 * MS);
}

#[tokio::test(start_paused = true)]
async fn a_change_reaching_two_sources_goes_out_complete_right_after_the_leading_edge() {
    // One file holding a Service and its EndpointSlice: two sources, 2 ms apart.
    let mut h = synced(leading(), &["services", "endpoints"]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    h.update("services", snapshot("a"));
    tokio::time::sleep(2 * MS).await;
    h.update("endpoints", snapshot("b"));
    let first = h.next().await;
    assert_eq!(first.at, t0);
    let second = h.next().await;
    // At the end of the leading group, not after the quiet period.
    assert_eq!(second.at - t0, 10 * MS);
    assert_eq!(
        trigger(&second).reason,
        "resources changed: endpoints (with the leading change)"
    );
    assert!(h.next_within(Duration::from_secs(10)).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn updates_published_together_go_out_in_the_leading_trigger() {
    // One shared scan of a directory publishes a Service's and its EndpointSlice's
    // updates back to back: both are queued when the debouncer wakes.
    let mut h = synced(leading(), &["services", "endpoints"]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    h.update("services", snapshot("a"));
    h.update("endpoints", snapshot("b"));
    let first = h.next().await;
    assert_eq!(first.at, t0);
    let t = trigger(&first);
    assert_eq!(
        t.reason,
        "resources changed: endpoints, services (leading edge)"
    );
    let sources: Vec<&str> = t.sources.iter().map(AsRef::as_ref).collect();
    assert_eq!(sources, ["endpoints", "services"]);
    // Nothing left for the end of the leading group.
    assert!(h.next_within(Duration::from_secs(10)).await.is_none());
}

/// Ten files deleted 5 ms apart after a quiet period: the first deletion takes no
/// leading edge, the rest join it, and one trigger goes out after the quiet period,
/// so the safety valve measures the whole removal.
#[tokio::test(start_paused = true)]
async fn a_stream_of_deletions_goes_out_whole_after_the_quiet_period() {
    use hapwright_eventbus::model::{ObjectKey, ResourceChange};

    let mut h = synced(leading(), &["services"]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    let publisher = h.publisher.clone();
    let deletions = tokio::spawn(async move {
        for i in 0..10 {
            if i > 0 {
                tokio::time::sleep(5 * MS).await;
            }
            publisher.publish(hapwright_eventbus::ResourceIndexUpdated {
                source: "services".into(),
                snapshot: snapshot("left"),
                change: std::sync::Arc::new(ResourceChange {
                    removed: vec![ObjectKey::new("default", format!("svc{i}"))],
                    ..ResourceChange::default()
                }),
            });
        }
    });
    let event = h.next().await;
    deletions.await.unwrap();
    assert_eq!(
        event.at,
        t0 + 45 * MS + 200 * MS,
        "the quiet period after the last"
    );
    assert_eq!(
        trigger(&event).reason,
        "resources changed: services (objects removed: after the quiet period)"
    );
    assert!(h.next_within(Duration::from_secs(10)).await.is_none());

    // An addition after a quiet period still goes at once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t1 = Instant::now();
    h.update("services", snapshot("new"));
    assert_eq!(h.next().await.at, t1);
}

#[tokio::test(start_paused = true)]
async fn a_change_right_after_the_leading_edge_goes_when_the_executor_reports_its_end() {
    let mut h = synced(leading(), &["ingresses", "secrets"]).await;
    let done = || hapwright_eventbus::ReconciliationCompleted {
        duration: 3 * MS,
        stages: Vec::new(),
    };
    h.publisher.publish(done());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    h.update("secrets", snapshot("a"));
    assert_eq!(h.next().await.at, t0);
    // The Ingress arrives while the leading reconciliation runs: it waits ...
    tokio::time::sleep(2 * MS).await;
    h.update("ingresses", snapshot("b"));
    assert!(h.next_within(MS).await.is_none());
    // ... for the executor's end (here 3 ms after the leading edge), not for the
    // leading group's (10 ms).
    h.publisher.publish(done());
    let second = h.next().await;
    assert_eq!(second.at - t0, 3 * MS);
    assert_eq!(
        trigger(&second).reason,
        "resources changed: ingresses (with the leading change)"
    );
    assert!(h.next_within(Duration::from_secs(1)).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_change_right_after_the_leading_edge_goes_when_the_leading_render_is_done() {
    let mut h = synced(leading(), &["ingresses", "secrets"]).await;
    h.publisher
        .publish(hapwright_eventbus::ReconciliationCompleted {
            duration: 3 * MS,
            stages: Vec::new(),
        });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    // The Ingress first: the leading render serves its host on plain HTTP.
    h.update("ingresses", snapshot("a"));
    assert_eq!(h.next().await.at, t0);
    // Its Secret arrives while that render runs: it waits ...
    tokio::time::sleep(MS).await;
    h.update("secrets", snapshot("b"));
    assert!(h.next_within(MS).await.is_none());
    // ... for the render's end (4 ms after the leading edge), not for its validation
    // or the group's end (10 ms): the incomplete render is superseded before it is
    // deployed.
    tokio::time::sleep(2 * MS).await;
    h.publisher.publish(hapwright_eventbus::TemplateRendered {
        config: std::sync::Arc::new(hapwright_eventbus::model::RenderedConfig::main_only(
            "global\n",
        )),
        duration: 4 * MS,
        render: Default::default(),
    });
    let second = h.next().await;
    assert_eq!(second.at - t0, 4 * MS);
    assert_eq!(
        trigger(&second).reason,
        "resources changed: secrets (with the leading change)"
    );
    assert!(trigger(&second).follow_up);
    assert!(h.next_within(Duration::from_secs(1)).await.is_none());
}
