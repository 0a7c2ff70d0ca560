//! The debouncer's state machine step by step, without a runtime: each test feeds
//! inputs at chosen times and checks the actions and what it waits for next.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::EventId;
use tokio::time::Instant;

use super::Settings;
use super::state::{Action, Input, State, Trigger, Wait};

const MS: Duration = Duration::from_millis(1);

/// The trailing-only timings of the component tests.
fn trailing() -> Settings {
    Settings {
        debounce: 200 * MS,
        max_wait: Duration::from_secs(2),
        sync_timeout: Duration::from_secs(30),
        leading_edge: false,
        leading_group: 10 * MS,
    }
}

fn leading() -> Settings {
    Settings {
        leading_edge: true,
        ..trailing()
    }
}

/// A state machine over `sources`, driven through time from `t0`.
struct Machine {
    state: State,
    t0: Instant,
    next_id: u64,
}

impl Machine {
    fn new(settings: Settings, sources: &[&str]) -> (Self, Vec<Action>) {
        let sources: BTreeSet<Arc<str>> = sources.iter().map(|s| Arc::from(*s)).collect();
        let mut state = State::new(settings, sources);
        let t0 = Instant::now();
        let actions = state.step(Input::Started, t0);
        let machine = Self {
            state,
            t0,
            next_id: 1,
        };
        (machine, actions)
    }

    /// A machine over `sources` whose initial sync completed at `t0`.
    fn synced(settings: Settings, sources: &[&str]) -> Self {
        let (mut machine, _) = Self::new(settings, sources);
        for source in sources {
            machine.sync(source, Duration::ZERO);
        }
        machine
    }

    fn at(&self, after: Duration) -> Instant {
        self.t0 + after
    }

    fn id(&mut self) -> EventId {
        self.next_id += 1;
        EventId(self.next_id)
    }

    fn change(&mut self, source: &str, after: Duration) -> Vec<Action> {
        self.update(source, false, after)
    }

    /// A change that removed objects (a deleted file or object).
    fn removal(&mut self, source: &str, after: Duration) -> Vec<Action> {
        self.update(source, true, after)
    }

    fn update(&mut self, source: &str, removes: bool, after: Duration) -> Vec<Action> {
        let cause = self.id();
        let input = Input::Changed {
            source: source.into(),
            cause,
            removes,
        };
        self.state.step(input, self.at(after))
    }

    fn sync(&mut self, source: &str, after: Duration) -> Vec<Action> {
        let cause = self.id();
        let input = Input::Synced {
            source: source.into(),
            cause,
        };
        self.state.step(input, self.at(after))
    }

    fn queue_empty(&mut self, after: Duration) -> Vec<Action> {
        self.state.step(Input::QueueEmpty, self.at(after))
    }

    /// The executor reports a reconciliation finished.
    fn reconciled(&mut self, after: Duration) -> Vec<Action> {
        self.state.step(Input::Reconciled, self.at(after))
    }

    /// The renderer reports a render done.
    fn rendered(&mut self, after: Duration) -> Vec<Action> {
        self.state.step(Input::Rendered, self.at(after))
    }

    /// Whether the machine waits only for the events already queued.
    fn waits_for_the_queue(&self) -> bool {
        self.state.wait() == Wait::Queued
    }

    /// The deadline the machine waits for, as time since `t0`.
    fn deadline(&self) -> Option<Duration> {
        match self.state.wait() {
            Wait::Until(deadline) => deadline.map(|at| at - self.t0),
            Wait::Queued => panic!("waits for the queue, not a deadline"),
        }
    }

    /// Passes the deadline the machine waits for.
    fn pass_deadline(&mut self) -> Vec<Action> {
        let at = self.deadline().expect("a deadline");
        self.state.step(Input::Deadline, self.at(at))
    }
}

/// The one trigger among `actions`.
fn trigger(actions: &[Action]) -> &Trigger {
    let triggers: Vec<&Trigger> = actions
        .iter()
        .filter_map(|action| match action {
            Action::Trigger(trigger) => Some(trigger),
            _ => None,
        })
        .collect();
    assert_eq!(triggers.len(), 1, "{actions:?}");
    triggers[0]
}

fn names(trigger: &Trigger) -> Vec<&str> {
    trigger.sources.iter().map(AsRef::as_ref).collect()
}

#[test]
fn no_sources_fire_at_start() {
    let (machine, actions) = Machine::new(trailing(), &[]);
    let first = trigger(&actions);
    assert_eq!(first.reason, "initial render (no watched resources)");
    assert!(first.sources.is_empty());
    assert_eq!(first.waited, Duration::ZERO);
    assert_eq!(machine.deadline(), None);
}

#[test]
fn the_first_trigger_waits_for_every_source_to_sync() {
    let (mut m, actions) = Machine::new(trailing(), &["services", "endpoints"]);
    assert!(actions.is_empty());
    assert_eq!(m.deadline(), Some(Duration::from_secs(30)));
    // Changes during the sync only join the first trigger.
    assert!(m.change("services", MS).is_empty());
    assert!(m.sync("services", 2 * MS).is_empty());
    assert_eq!(m.deadline(), Some(Duration::from_secs(30)));
    let actions = m.sync("endpoints", 10 * MS);
    let first = trigger(&actions);
    assert_eq!(first.reason, "initial sync complete: endpoints, services");
    assert_eq!(names(first), ["services"]);
    assert_eq!(first.waited, 9 * MS);
    assert_eq!(m.deadline(), None);
}

#[test]
fn a_sync_from_an_unwatched_source_is_ignored() {
    let (mut m, _) = Machine::new(trailing(), &["services"]);
    assert!(m.sync("other", MS).is_empty());
    assert_eq!(
        trigger(&m.sync("services", 2 * MS)).reason,
        "initial sync complete: services"
    );
}

#[test]
fn the_sync_timeout_names_late_sources_until_they_catch_up() {
    let (mut m, _) = Machine::new(trailing(), &["a", "b", "c"]);
    m.sync("a", MS);
    m.change("a", 2 * MS);
    let actions = m.pass_deadline();
    assert_eq!(
        actions[0],
        Action::Unhealthy("initial sync not complete after 30s: b, c".to_owned())
    );
    assert_eq!(
        trigger(&actions).reason,
        "initial sync timed out after 30s; still waiting for: b, c; changed: a"
    );
    assert_eq!(m.deadline(), None);
    // One late source catches up, then the other.
    assert_eq!(
        m.sync("b", Duration::from_secs(31)),
        [Action::Unhealthy(
            "initial sync not complete after 30s: c".to_owned()
        )]
    );
    assert_eq!(m.sync("c", Duration::from_secs(32)), [Action::Healthy]);
    // A second sync of a source changes nothing.
    assert!(m.sync("c", Duration::from_secs(33)).is_empty());
}

#[test]
fn a_trigger_fires_the_quiet_period_after_the_last_change() {
    let mut m = Machine::synced(trailing(), &["services", "endpoints"]);
    assert!(m.change("services", Duration::ZERO).is_empty());
    assert_eq!(m.deadline(), Some(200 * MS));
    assert!(m.change("endpoints", 150 * MS).is_empty());
    assert!(m.change("services", 300 * MS).is_empty());
    assert_eq!(m.deadline(), Some(500 * MS));
    let actions = m.pass_deadline();
    let t = trigger(&actions);
    assert_eq!(t.reason, "resources changed: endpoints, services");
    assert_eq!(names(t), ["endpoints", "services"]);
    assert_eq!(t.waited, 500 * MS);
    assert_eq!(t.cause, Some(EventId(m.next_id)), "the last change");
    assert_eq!(m.deadline(), None);
}

#[test]
fn max_wait_caps_a_constant_stream_of_changes() {
    let mut m = Machine::synced(trailing(), &["services"]);
    for step in 0..20u32 {
        assert!(m.change("services", step * 100 * MS).is_empty());
    }
    // The quiet period would end at 2.1 s; max wait ends the batch at 2 s.
    assert_eq!(m.deadline(), Some(Duration::from_secs(2)));
    let actions = m.pass_deadline();
    let t = trigger(&actions);
    assert_eq!(
        t.reason,
        "resources changed: services (max wait 2s reached)"
    );
    assert_eq!(t.waited, Duration::from_secs(2));
    // The next change opens a new batch.
    m.change("services", 2050 * MS);
    assert_eq!(m.deadline(), Some(2250 * MS));
}

#[test]
fn without_the_leading_edge_a_lone_change_waits_for_the_quiet_period() {
    let mut m = Machine::synced(trailing(), &["services"]);
    assert!(m.change("services", Duration::from_secs(5)).is_empty());
    assert_eq!(m.deadline(), Some(5200 * MS));
}

#[test]
fn a_lone_change_after_a_quiet_period_fires_once_the_queue_is_empty() {
    let mut m = Machine::synced(leading(), &["services"]);
    let t = Duration::from_secs(1);
    assert_eq!(m.change("services", t), [Action::Yield]);
    assert_eq!(m.state.wait(), Wait::Queued);
    let actions = m.queue_empty(t);
    let first = trigger(&actions);
    assert_eq!(first.reason, "resources changed: services (leading edge)");
    assert_eq!(first.waited, Duration::ZERO);
    assert!(first.cause.is_some());
    assert_eq!(m.deadline(), None);
    // Another quiet period, another leading edge.
    assert_eq!(m.change("services", 2 * t), [Action::Yield]);
}

#[test]
fn changes_already_queued_go_with_the_leading_trigger() {
    let mut m = Machine::synced(leading(), &["services", "endpoints"]);
    let t = Duration::from_secs(1);
    assert_eq!(m.change("services", t), [Action::Yield]);
    // Queued behind it: taken in, no second yield.
    assert!(m.change("endpoints", t).is_empty());
    assert_eq!(m.state.wait(), Wait::Queued);
    let actions = m.queue_empty(t);
    let first = trigger(&actions);
    assert_eq!(
        first.reason,
        "resources changed: endpoints, services (leading edge)"
    );
    assert_eq!(names(first), ["endpoints", "services"]);
    assert_eq!(m.deadline(), None);
}

#[test]
fn changes_within_the_leading_group_fire_at_its_end() {
    let mut m = Machine::synced(leading(), &["services", "endpoints"]);
    let t = Duration::from_secs(1);
    m.change("services", t);
    m.queue_empty(t);
    assert!(m.change("endpoints", t + 2 * MS).is_empty());
    assert_eq!(m.deadline(), Some(t + 10 * MS));
    let actions = m.pass_deadline();
    let second = trigger(&actions);
    assert_eq!(
        second.reason,
        "resources changed: endpoints (with the leading change)"
    );
    assert!(second.follow_up, "the rest of the leading change");
    assert_eq!(second.waited, 8 * MS);
    assert_eq!(m.deadline(), None);
}

#[test]
fn changes_within_the_leading_group_go_once_the_leading_reconciliation_finished() {
    let mut m = Machine::synced(leading(), &["ingresses", "secrets"]);
    let t = Duration::from_secs(1);
    m.reconciled(t - 500 * MS);
    m.change("secrets", t);
    assert!(!trigger(&m.queue_empty(t)).follow_up, "a leading trigger");
    // While the leading reconciliation runs, a change waits (for its end or the
    // group's).
    assert!(m.change("ingresses", t + 2 * MS).is_empty());
    assert_eq!(m.deadline(), Some(t + 10 * MS));
    // It finished: the change goes now, with whatever is already queued.
    assert_eq!(m.reconciled(t + 4 * MS), [Action::Yield]);
    assert!(m.waits_for_the_queue());
    let actions = m.queue_empty(t + 4 * MS);
    let second = trigger(&actions);
    assert_eq!(
        second.reason,
        "resources changed: ingresses (with the leading change)"
    );
    assert!(second.follow_up, "the rest of the leading change");
    assert_eq!(second.waited, 2 * MS);
    assert_eq!(m.deadline(), None);

    // Within the group still, while that one reconciles: a change waits again ...
    assert!(m.change("secrets", t + 6 * MS).is_empty());
    assert_eq!(m.deadline(), Some(t + 10 * MS));
    // ... and goes at the group's end if the reconciliation is not done by then.
    let actions = m.pass_deadline();
    assert_eq!(
        trigger(&actions).reason,
        "resources changed: secrets (with the leading change)"
    );
}

#[test]
fn changes_within_the_leading_group_go_once_the_leading_render_is_done() {
    let mut m = Machine::synced(leading(), &["ingresses", "secrets"]);
    let t = Duration::from_secs(1);
    m.reconciled(t - 500 * MS);
    m.change("ingresses", t);
    assert!(!trigger(&m.queue_empty(t)).follow_up, "a leading trigger");
    // The Secret the Ingress names, while the Ingress alone renders: it waits.
    assert!(m.change("secrets", t + MS).is_empty());
    assert_eq!(m.deadline(), Some(t + 10 * MS));
    // The render is done (its validation runs): the Secret goes now, so the
    // incomplete render is superseded before it is deployed.
    assert_eq!(m.rendered(t + 6 * MS), [Action::Yield]);
    let actions = m.queue_empty(t + 6 * MS);
    let second = trigger(&actions);
    assert_eq!(names(second), ["secrets"]);
    assert!(second.follow_up);
    // A change while the follow-up renders waits for its render's end or the
    // group's (the superseded reconciliation reports no end).
    assert!(m.change("ingresses", t + 8 * MS).is_empty());
    assert_eq!(m.deadline(), Some(t + 10 * MS));
    assert_eq!(m.rendered(t + 9 * MS), [Action::Yield]);
    assert_eq!(names(trigger(&m.queue_empty(t + 9 * MS))), ["ingresses"]);
}

#[test]
fn a_change_within_the_leading_group_goes_at_once_when_the_executor_is_idle() {
    let mut m = Machine::synced(leading(), &["ingresses", "secrets"]);
    let t = Duration::from_secs(1);
    m.reconciled(t - 500 * MS);
    m.change("secrets", t);
    trigger(&m.queue_empty(t));
    // The leading render was quick (its output did not change).
    assert!(m.reconciled(t + MS).is_empty());
    assert_eq!(m.change("ingresses", t + 3 * MS), [Action::Yield]);
    // Queued behind it: goes with it.
    assert!(m.change("secrets", t + 3 * MS).is_empty());
    let actions = m.queue_empty(t + 3 * MS);
    assert_eq!(names(trigger(&actions)), ["ingresses", "secrets"]);
    // After the group, changes wait for the quiet period as before, idle or not.
    m.reconciled(t + 5 * MS);
    assert!(m.change("ingresses", t + 12 * MS).is_empty());
    assert_eq!(m.deadline(), Some(t + 212 * MS));
}

#[test]
fn a_removal_within_the_leading_group_waits_for_the_quiet_period_even_when_idle() {
    let mut m = Machine::synced(leading(), &["services"]);
    let t = Duration::from_secs(1);
    m.reconciled(t - 500 * MS);
    m.change("services", t);
    trigger(&m.queue_empty(t));
    assert!(m.reconciled(t + MS).is_empty());
    assert!(m.removal("services", t + 2 * MS).is_empty());
    assert_eq!(m.deadline(), Some(t + 202 * MS));
    assert!(m.reconciled(t + 3 * MS).is_empty());
    assert_eq!(m.deadline(), Some(t + 202 * MS));
}

#[test]
fn changes_after_the_leading_group_wait_for_the_quiet_period() {
    let mut m = Machine::synced(leading(), &["services"]);
    let t = Duration::from_secs(1);
    m.change("services", t);
    m.queue_empty(t);
    // Within `debounce` of the leading change: batched, not a new leading edge.
    assert!(m.change("services", t + 50 * MS).is_empty());
    assert_eq!(m.deadline(), Some(t + 250 * MS));
    let actions = m.pass_deadline();
    assert_eq!(trigger(&actions).reason, "resources changed: services");
}

#[test]
fn a_leading_trigger_is_not_held_past_max_wait_by_a_full_queue() {
    let mut m = Machine::synced(leading(), &["services", "endpoints"]);
    let t = Duration::from_secs(1);
    assert_eq!(m.change("services", t), [Action::Yield]);
    for step in 1..20u32 {
        assert!(m.change("services", t + step * 100 * MS).is_empty());
    }
    // The queue never emptied: at max wait the leading trigger goes before the next
    // change is taken in, which opens the next batch.
    let actions = m.change("endpoints", t + Duration::from_secs(2));
    let first = trigger(&actions);
    assert_eq!(first.reason, "resources changed: services (leading edge)");
    assert_eq!(first.waited, Duration::from_secs(2));
    assert_eq!(m.deadline(), Some(t + Duration::from_secs(2) + 10 * MS));
}

#[test]
fn the_leading_edge_waits_for_the_initial_sync_and_a_quiet_period() {
    let (mut m, _) = Machine::new(leading(), &["services"]);
    // Before the first trigger: no leading edge.
    assert!(m.change("services", Duration::ZERO).is_empty());
    trigger(&m.sync("services", 50 * MS));
    // The change during the sync was recent: this one is batched.
    assert!(m.change("services", 100 * MS).is_empty());
    assert_eq!(m.deadline(), Some(300 * MS));
}

#[test]
fn an_empty_queue_without_a_leading_trigger_does_nothing() {
    let mut m = Machine::synced(leading(), &["services"]);
    assert!(m.queue_empty(Duration::from_secs(1)).is_empty());
    assert!(
        m.state
            .step(Input::Deadline, m.at(Duration::from_secs(2)))
            .is_empty()
    );
}

#[test]
fn a_lone_removal_after_a_quiet_period_waits_for_the_quiet_period() {
    let mut m = Machine::synced(leading(), &["services"]);
    let t = Duration::from_secs(1);
    // No leading edge: nothing to yield for, the quiet period is the deadline.
    assert!(m.removal("services", t).is_empty());
    assert_eq!(m.state.wait(), Wait::Until(Some(m.at(t + 200 * MS))));
    let actions = m.pass_deadline();
    let t1 = trigger(&actions);
    assert_eq!(
        t1.reason,
        "resources changed: services (objects removed: after the quiet period)"
    );
    assert_eq!(t1.waited, 200 * MS);
    assert_eq!(m.deadline(), None);
    // The next addition after a quiet period takes the leading edge again.
    assert_eq!(m.change("services", 2 * t), [Action::Yield]);
}

#[test]
fn a_stream_of_removals_goes_out_as_one_trigger() {
    let mut m = Machine::synced(leading(), &["services", "endpoints"]);
    let t = Duration::from_secs(1);
    // Ten files deleted 5 ms apart, each reaching both sources.
    for step in 0..10u32 {
        assert!(m.removal("services", t + step * 5 * MS).is_empty());
        assert!(m.removal("endpoints", t + step * 5 * MS).is_empty());
        // Neither a leading trigger nor the end of a leading group is due.
        assert_eq!(m.deadline(), Some(t + step * 5 * MS + 200 * MS));
    }
    let actions = m.pass_deadline();
    let one = trigger(&actions);
    assert_eq!(names(one), ["endpoints", "services"]);
    assert_eq!(one.waited, 245 * MS);
    assert_eq!(one.cause, Some(EventId(m.next_id)), "the last deletion");
    assert_eq!(m.deadline(), None);
}

#[test]
fn a_removal_queued_behind_a_leading_change_holds_the_leading_trigger() {
    let mut m = Machine::synced(leading(), &["services", "endpoints"]);
    let t = Duration::from_secs(1);
    assert_eq!(m.change("services", t), [Action::Yield]);
    // The same scan removed objects of the other source: the batch waits.
    assert!(m.removal("endpoints", t).is_empty());
    assert_eq!(m.deadline(), Some(t + 200 * MS));
    assert!(m.queue_empty(t).is_empty());
    let actions = m.pass_deadline();
    assert_eq!(names(trigger(&actions)), ["endpoints", "services"]);
}

#[test]
fn a_removal_within_the_leading_group_waits_for_the_quiet_period() {
    let mut m = Machine::synced(leading(), &["services"]);
    let t = Duration::from_secs(1);
    // An addition goes at once.
    m.change("services", t);
    trigger(&m.queue_empty(t));
    // A deletion 2 ms later is not sent at the end of the leading group (10 ms)
    // but waits for the quiet period, so the deletions after it join it.
    assert!(m.removal("services", t + 2 * MS).is_empty());
    assert_eq!(m.deadline(), Some(t + 202 * MS));
    assert!(m.removal("services", t + 20 * MS).is_empty());
    assert_eq!(m.deadline(), Some(t + 220 * MS));
    let actions = m.pass_deadline();
    assert_eq!(
        trigger(&actions).reason,
        "resources changed: services (objects removed: after the quiet period)"
    );
    assert_eq!(m.deadline(), None);
}

#[test]
fn max_wait_still_caps_a_constant_stream_of_removals() {
    let mut m = Machine::synced(leading(), &["services"]);
    let t = Duration::from_secs(1);
    for step in 0..30u32 {
        m.removal("services", t + step * 100 * MS);
    }
    assert_eq!(m.deadline(), Some(t + Duration::from_secs(2)));
    let actions = m.pass_deadline();
    assert_eq!(
        trigger(&actions).reason,
        "resources changed: services (objects removed: after the quiet period) (max wait 2s reached)"
    );
}

#[test]
fn without_the_leading_edge_a_removal_reads_as_any_change() {
    let mut m = Machine::synced(trailing(), &["services"]);
    assert!(m.removal("services", Duration::from_secs(1)).is_empty());
    let actions = m.pass_deadline();
    assert_eq!(trigger(&actions).reason, "resources changed: services");
}
