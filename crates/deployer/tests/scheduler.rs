//! Scheduler rate limits, latest-wins and skip rules, under paused time.

mod support;

use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::component::scheduler::{Config, Scheduler};
use hapwright_eventbus::model::{InstanceDriver, InstanceRef, RenderedConfig};
use hapwright_eventbus::testing::TestBus;
use hapwright_eventbus::{
    CorrelationId, DeploymentCompleted, DeploymentSummary, DriftDetected, Event, EventKind,
    EventMeta, EventPayload, InstancesDiscovered, ReconciliationStarted, RunningKernel,
    Subscription,
};
use tokio::time::{Instant, timeout};

/// A config told apart by `text`, after a `global` header so that it parses like
/// every config the validator passes on.
fn config(text: &str) -> Arc<RenderedConfig> {
    Arc::new(RenderedConfig::main_only(format!("global\n    # {text}")))
}

struct Harness {
    kernel: RunningKernel,
    scheduled: Subscription,
    publisher: hapwright_eventbus::Publisher,
}

fn start() -> Harness {
    let bus = TestBus::new();
    let scheduler = Scheduler::new(
        Config {
            min_deployment_interval: Duration::from_secs(2),
        },
        vec!["local".to_owned()],
    );
    let scheduled = bus.subscribe("test", [EventKind::DeploymentScheduled]);
    let publisher = bus.publisher();
    Harness {
        kernel: bus.start_one(scheduler),
        scheduled,
        publisher,
    }
}

impl Harness {
    fn validated(&self, config: &Arc<RenderedConfig>) -> CorrelationId {
        let correlation = CorrelationId::new();
        self.validated_in(correlation, config);
        correlation
    }

    /// `config` validated in reconciliation `correlation`.
    fn validated_in(&self, correlation: CorrelationId, config: &Arc<RenderedConfig>) {
        self.publisher.publish_with(
            support::validated(config),
            EventMeta::correlated(correlation),
        );
    }

    /// A reconciliation starts; `follow_up`: it runs the rest of a leading change.
    fn started(&self, follow_up: bool) -> CorrelationId {
        let correlation = CorrelationId::new();
        self.publisher.publish_with(
            ReconciliationStarted {
                reason: "resources changed: secrets".into(),
                follow_up,
            },
            EventMeta::correlated(correlation),
        );
        correlation
    }

    async fn next(&mut self) -> (Arc<Event>, Arc<RenderedConfig>, Vec<String>, bool) {
        let event = timeout(Duration::from_secs(120), self.scheduled.recv())
            .await
            .expect("a deployment is scheduled")
            .expect("bus open");
        let EventPayload::DeploymentScheduled(scheduled) = &event.payload else {
            panic!("unexpected event {event:?}");
        };
        let (config, instances, drift) = (
            scheduled.config.clone(),
            scheduled.instances.clone(),
            scheduled.drift_check,
        );
        (event, config, instances, drift)
    }

    async fn nothing_within(&mut self, window: Duration) {
        assert!(
            timeout(window, self.scheduled.recv()).await.is_err(),
            "nothing should be scheduled"
        );
    }

    async fn stop(self) {
        self.kernel.shutdown(Duration::from_secs(5)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn first_config_goes_out_at_once_and_later_ones_wait_for_the_interval() {
    let mut h = start();
    let t0 = Instant::now();
    let a = config("a\n");
    let correlation = h.validated(&a);
    let (event, got, instances, drift) = h.next().await;
    assert_eq!(got.hash(), a.hash());
    assert_eq!(instances, vec!["local"]);
    assert!(!drift);
    assert_eq!(event.correlation_id, Some(correlation));
    assert!(t0.elapsed() < Duration::from_millis(10));

    tokio::time::sleep(Duration::from_millis(100)).await;
    let b = config("b\n");
    h.validated(&b);
    let (_, got, _, _) = h.next().await;
    assert_eq!(got.hash(), b.hash());
    let elapsed = t0.elapsed();
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_millis(2100),
        "{elapsed:?}"
    );
    h.stop().await;
}

/// The rest of a change that reached several sources (an Ingress, then its Secret
/// a moment later) follows the leading deployment at once: once. The release after
/// it waits the whole interval again, and so does one after a follow-up that went
/// out early; a follow-up that a newer reconciliation superseded does not go out.
#[tokio::test(start_paused = true)]
async fn the_rest_of_a_leading_change_follows_it_at_once_once() {
    let mut h = start();
    let t0 = Instant::now();
    let leading = h.started(false);
    h.validated_in(leading, &config("ingress\n"));
    h.next().await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let rest = h.started(true);
    h.validated_in(rest, &config("ingress and secret\n"));
    let (event, got, _, _) = h.next().await;
    assert_eq!(got.hash(), config("ingress and secret\n").hash());
    assert_eq!(event.correlation_id, Some(rest));
    assert!(
        t0.elapsed() < Duration::from_millis(10),
        "{:?}",
        t0.elapsed()
    );

    // Another follow-up right after: it waits the interval from the one before.
    let again = h.started(true);
    h.validated_in(again, &config("again\n"));
    let (_, got, _, _) = h.next().await;
    assert_eq!(got.hash(), config("again\n").hash());
    let elapsed = t0.elapsed();
    assert!(
        elapsed >= Duration::from_millis(2005) && elapsed < Duration::from_millis(2100),
        "{elapsed:?}"
    );

    // A follow-up that a newer reconciliation superseded does not go out, and the
    // newer one waits the interval.
    let t1 = Instant::now();
    let stale = h.started(true);
    let newer = h.started(false);
    h.validated_in(stale, &config("stale\n"));
    h.validated_in(newer, &config("newer\n"));
    let (_, got, _, _) = h.next().await;
    assert_eq!(got.hash(), config("newer\n").hash());
    let elapsed = t1.elapsed();
    assert!(
        elapsed >= Duration::from_millis(1990) && elapsed < Duration::from_millis(2100),
        "{elapsed:?}"
    );

    // After a release that waited, the exemption is back.
    let t2 = Instant::now();
    let rest = h.started(true);
    h.validated_in(rest, &config("rest\n"));
    h.next().await;
    assert!(
        t2.elapsed() < Duration::from_millis(10),
        "{:?}",
        t2.elapsed()
    );
    h.stop().await;
}

/// The validated config of a reconciliation that a newer one superseded never goes
/// out, not even when nothing waits: the newer one's does.
#[tokio::test(start_paused = true)]
async fn a_superseded_reconciliations_config_is_not_deployed() {
    let mut h = start();
    let older = h.started(false);
    let newer = h.started(false);
    h.validated_in(older, &config("older\n"));
    h.nothing_within(Duration::from_secs(30)).await;
    h.validated_in(newer, &config("newer\n"));
    let (event, got, _, _) = h.next().await;
    assert_eq!(got.hash(), config("newer\n").hash());
    assert_eq!(event.correlation_id, Some(newer));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn newest_pending_config_wins() {
    let mut h = start();
    h.validated(&config("a\n"));
    h.next().await;
    for text in ["b\n", "c\n", "d\n"] {
        h.validated(&config(text));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, got, _, _) = h.next().await;
    assert_eq!(got.hash(), config("d\n").hash());
    h.nothing_within(Duration::from_secs(30)).await;
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn reloads_are_not_held_by_the_scheduler() {
    // The reload window is kept per instance by the deployer; the scheduler releases
    // every config after minDeploymentInterval, whatever it takes to apply it.
    let mut h = start();
    let t0 = Instant::now();
    for (round, text) in ["global\n", "defaults\n", "global\n    maxconn 5\n"]
        .into_iter()
        .enumerate()
    {
        let next = config(text);
        h.validated(&next);
        let (_, got, _, _) = h.next().await;
        assert_eq!(got.hash(), next.hash());
        let at = t0.elapsed();
        let expected = Duration::from_secs(2) * u32::try_from(round).unwrap();
        assert!(
            at >= expected && at < expected + Duration::from_millis(100),
            "{at:?}"
        );
    }
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn unchanged_hash_and_instances_are_skipped_and_drift_is_left_to_the_deployer() {
    let mut h = start();
    let a = config("a\n");
    h.validated(&a);
    h.next().await;
    h.validated(&a);
    h.nothing_within(Duration::from_secs(30)).await;

    // The instance's worker repairs a drift itself; the scheduler does not react.
    h.publisher.publish(DriftDetected {
        instance: "local".into(),
        detail: "marker differs".into(),
    });
    h.nothing_within(Duration::from_secs(30)).await;

    // A failed round makes the same hash deployable again.
    h.publisher.publish(DeploymentCompleted {
        summary: DeploymentSummary {
            hash: a.hash(),
            succeeded: Vec::new(),
            failed: vec!["local".into()],
            duration: Duration::ZERO,
        },
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    h.validated(&a);
    let (_, got, _, drift) = h.next().await;
    assert_eq!(got.hash(), a.hash());
    assert!(!drift);
    h.stop().await;
}

/// Fleet membership belongs to the deployer: a discovery change schedules nothing
/// (the deployer hands a new instance the last config itself), and a config names
/// the static instances only.
#[tokio::test(start_paused = true)]
async fn a_discovery_change_schedules_nothing() {
    let mut h = start();
    let a = config("a\n");
    h.validated(&a);
    let (_, got, instances, _) = h.next().await;
    assert_eq!(
        (got.hash(), instances),
        (a.hash(), vec!["local".to_owned()])
    );
    h.publisher.publish(InstancesDiscovered {
        source: "kubernetes".into(),
        instances: vec![InstanceRef {
            name: "pod-a".to_owned(),
            driver: InstanceDriver::Dataplane,
            address: "http://pod-a:5555".to_owned(),
        }]
        .into(),
    });
    h.nothing_within(Duration::from_secs(30)).await;
    let b = config("b\n");
    h.validated(&b);
    let (_, got, instances, _) = h.next().await;
    assert_eq!(
        (got.hash(), instances),
        (b.hash(), vec!["local".to_owned()])
    );
    h.stop().await;
}
