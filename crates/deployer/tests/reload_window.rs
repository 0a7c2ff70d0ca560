//! The reload window is kept per instance by its owner: an instance that must wait
//! for `minReloadInterval` holds only its own reload, never another instance's
//! runtime changes, and a newer config replaces the waiting one (one reload, not
//! two). Drivers are fakes behind the real [`Driver`] trait (the plans are real), under
//! paused time.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hapwright_deployer::Driver;
use hapwright_deployer::component::deployer::{Config, Deployer, LastDeployedStore};
use hapwright_deployer::driver::{DeployError, Deployed};
use hapwright_deployer::haproxy::config::Config as Model;
use hapwright_deployer::haproxy::plan::ChangePlan;
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::model::{DeployStrategy, InstanceDriver, RenderedConfig};
use hapwright_eventbus::testing::TestBus;
use hapwright_eventbus::{EventKind, EventPayload};
use tokio::time::{Instant, timeout};

/// What a fake instance was asked to do: (`reload` or `runtime`, hash, when).
type Calls = Arc<Mutex<Vec<(&'static str, String, Duration)>>>;

#[derive(Debug)]
struct Fake {
    name: String,
    calls: Calls,
    t0: Instant,
    /// How long applying a runtime change takes (a slow runtime socket).
    runtime_takes: Duration,
}

#[async_trait::async_trait]
impl Driver for Fake {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> InstanceDriver {
        InstanceDriver::Socket
    }

    async fn recover(
        &self,
        _desired: &Arc<RenderedConfig>,
    ) -> Result<Option<Arc<Deployed>>, DeployError> {
        Ok(None)
    }

    async fn check_drift(&self, _running: &Deployed) -> Result<Option<String>, DeployError> {
        Ok(None)
    }

    async fn apply_runtime_ops(
        &self,
        plan: &ChangePlan,
    ) -> Result<usize, hapwright_deployer::driver::RuntimeOpsError> {
        self.calls
            .lock()
            .unwrap()
            .push(("runtime", String::new(), self.t0.elapsed()));
        tokio::time::sleep(self.runtime_takes).await;
        Ok(plan.ops.len())
    }

    async fn persist(
        &self,
        desired: &Arc<RenderedConfig>,
        _marker: &str,
        _previous: &Arc<RenderedConfig>,
    ) -> Result<(), DeployError> {
        if let Some(last) = self.calls.lock().unwrap().last_mut()
            && last.0 == "runtime"
            && last.1.is_empty()
        {
            last.1 = desired.hash().short();
        }
        Ok(())
    }

    async fn reload_with(
        &self,
        desired: Arc<RenderedConfig>,
        _desired_model: Arc<Model>,
        _running: Option<&Deployed>,
        plan: ChangePlan,
    ) -> Result<Deployed, DeployError> {
        self.calls
            .lock()
            .unwrap()
            .push(("reload", desired.hash().short(), self.t0.elapsed()));
        let marker = desired.hash().short();
        Ok(Deployed::new(
            desired,
            marker,
            DeployStrategy::Reload,
            plan.reason(),
        )?)
    }
}

fn config(text: &str) -> Arc<RenderedConfig> {
    Arc::new(RenderedConfig::main_only(text))
}

const BACKEND: &str = "backend be\n    balance roundrobin\n";

#[tokio::test(start_paused = true)]
async fn one_instance_waiting_for_its_reload_window_holds_nobody_else() {
    let t0 = Instant::now();
    let (a_calls, b_calls) = (Calls::default(), Calls::default());
    let drivers: BTreeMap<String, Arc<dyn Driver>> = [("a", &a_calls), ("b", &b_calls)]
        .into_iter()
        .map(|(name, calls)| {
            (
                name.to_owned(),
                Arc::new(Fake {
                    name: name.to_owned(),
                    calls: calls.clone(),
                    t0,
                    runtime_takes: Duration::ZERO,
                }) as Arc<dyn Driver>,
            )
        })
        .collect();
    let bus = TestBus::new();
    let mut events = bus.subscribe("test", [EventKind::InstanceDeployed]);
    let publisher = bus.publisher();
    let kernel = bus.start(|kernel| {
        kernel.register(Deployer::with_drivers(
            Config {
                min_reload_interval: Duration::from_secs(10),
                ..Config::default()
            },
            drivers,
            LastDeployedStore::new(),
            None,
            Metrics::unregistered().unwrap(),
        ));
    });
    let schedule = |config: &Arc<RenderedConfig>, instances: &[&str]| {
        publisher.publish(support::scheduled(config, instances));
    };
    let mut deployed = async |instance: &str| {
        timeout(Duration::from_secs(60), async {
            loop {
                let event = events.recv().await.unwrap();
                if let EventPayload::InstanceDeployed(d) = &event.payload
                    && d.instance == instance
                {
                    return (d.hash.short(), d.strategy, t0.elapsed());
                }
            }
        })
        .await
        .expect("deployed in time")
    };

    // t=0: a runs v1, b runs v2 (first deployments reload).
    let v1 = config(&format!("{BACKEND}    server s1 10.0.0.1:80\n"));
    let v2 = config(&format!(
        "{BACKEND}    option forwardfor\n    server s1 10.0.0.1:80\n"
    ));
    schedule(&v1, &["a"]);
    schedule(&v2, &["b"]);
    assert_eq!(deployed("a").await.1, DeployStrategy::Reload);
    assert_eq!(deployed("b").await.1, DeployStrategy::Reload);

    // t=1: v2 everywhere. a needs a reload and waits for its window (t=10); b has it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    schedule(&v2, &["a", "b"]);
    let (hash, strategy, _) = deployed("b").await;
    assert_eq!((hash, strategy), (v2.hash().short(), DeployStrategy::Noop));

    // t=2: a server address changes: b takes it at runtime at once, while a still
    // waits for its reload window.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let v3 = config(&format!(
        "{BACKEND}    option forwardfor\n    server s1 10.0.0.2:80\n"
    ));
    schedule(&v3, &["a", "b"]);
    let (hash, strategy, at) = deployed("b").await;
    assert_eq!(
        (hash, strategy),
        (v3.hash().short(), DeployStrategy::Runtime)
    );
    assert!(at < Duration::from_secs(3), "{at:?}");
    assert_eq!(
        a_calls.lock().unwrap().len(),
        1,
        "a only had its first reload"
    );

    // a reloads once, onto the newest config, when its window opens.
    let (hash, strategy, at) = deployed("a").await;
    assert_eq!(
        (hash, strategy),
        (v3.hash().short(), DeployStrategy::Reload)
    );
    assert!(at >= Duration::from_secs(10), "{at:?}");
    let a = a_calls.lock().unwrap().clone();
    assert_eq!(a.len(), 2, "{a:?}");
    assert_eq!(a[1].0, "reload");
    assert_eq!(a[1].1, v3.hash().short());
    let b = b_calls.lock().unwrap().clone();
    assert_eq!(
        b.iter().map(|c| c.0).collect::<Vec<_>>(),
        ["reload", "runtime"],
        "{b:?}"
    );
    kernel.shutdown(Duration::from_secs(5)).await;
}

/// A config handed to `Driver::deploy` without a model is parsed there; one that does
/// not parse fails the deployment with its parse error (line and cause), and the
/// instance is never touched: no empty model is planned against.
#[tokio::test(start_paused = true)]
async fn a_config_that_does_not_parse_fails_with_its_cause_and_touches_nothing() {
    let calls = Calls::default();
    let fake = Fake {
        name: "local".into(),
        calls: calls.clone(),
        t0: Instant::now(),
        runtime_takes: Duration::ZERO,
    };
    let broken =
        config("global\n    log stderr format short\nbackend be\n    server s1 \"10.0.0.1:80\n");
    let error = fake
        .deploy(broken, None, None, false)
        .await
        .expect_err("an unparsable config cannot deploy");
    let DeployError::Unparsable(cause) = &error else {
        panic!("expected a parse error, got {error:?}");
    };
    assert_eq!(cause.line, 4, "{error}");
    assert!(error.to_string().contains("line 4"), "{error}");
    assert!(
        calls.lock().unwrap().is_empty(),
        "the driver was asked: {calls:?}"
    );

    let found = Deployed::new(
        config("frontend fe\n    bind :80 ssl crt \"x\n"),
        "v1".into(),
        DeployStrategy::Noop,
        hapwright_eventbus::model::DeployReason {
            reload: None,
            detail: "found running".into(),
        },
    )
    .expect_err("a record of an unparsable config has no model");
    assert_eq!(found.line, 2);
}

/// A runtime change slower than `deploymentTimeout` (a slow runtime socket, a change
/// of thousands of map entries) while a newer config arrives: the change is not cut
/// half-way, the next attempt waits for it and plans from the config it deployed, so
/// the newer config goes out at runtime too. Cutting it used to leave the worker
/// without a record and the newer config was deployed by a reload that called itself
/// "first deployment to this instance".
#[tokio::test(start_paused = true)]
async fn a_runtime_change_past_the_deadline_finishes_and_the_next_plans_from_it() {
    let t0 = Instant::now();
    let calls = Calls::default();
    let fake: Arc<dyn Driver> = Arc::new(Fake {
        name: "slow".into(),
        calls: calls.clone(),
        t0,
        runtime_takes: Duration::from_secs(5),
    });
    let bus = TestBus::new();
    let mut events = support::deployments(&bus);
    let publisher = bus.publisher();
    let kernel = bus.start(|kernel| {
        kernel.register(Deployer::with_drivers(
            Config {
                deployment_timeout: Duration::from_secs(2),
                min_reload_interval: Duration::ZERO,
                ..Config::default()
            },
            [("slow".to_owned(), fake)].into_iter().collect(),
            LastDeployedStore::new(),
            None,
            Metrics::unregistered().unwrap(),
        ));
    });
    let mut next = async || support::next_outcome(&mut events, Duration::from_secs(60)).await;
    let server = |addr: &str| config(&format!("{BACKEND}    server s1 {addr}:80\n"));
    let (v1, v2, v3) = (server("10.0.0.1"), server("10.0.0.2"), server("10.0.0.3"));

    publisher.publish(support::scheduled(&v1, &["slow"]));
    let EventPayload::InstanceDeployed(first) = next().await else {
        panic!("v1 is deployed");
    };
    assert_eq!(first.strategy, DeployStrategy::Reload);

    // v2 is a runtime change that takes 5 s; v3 arrives 1 s into it.
    publisher.publish(support::scheduled(&v2, &["slow"]));
    tokio::time::sleep(Duration::from_secs(1)).await;
    publisher.publish(support::scheduled(&v3, &["slow"]));

    // The attempt's deadline (2 s) passes: reported, with what happens next.
    let EventPayload::InstanceDeploymentFailed(cut) = next().await else {
        panic!("the attempt past its deadline is reported");
    };
    assert_eq!(cut.hash, v2.hash());
    assert!(
        cut.error.message.contains("it goes on"),
        "{}",
        cut.error.message
    );

    // v2's change finishes; it is recorded, then v3 goes out at runtime from it (its
    // change takes 5 s too). Attempts whose deadline passes meanwhile say that the
    // change goes on.
    let mut deployed = Vec::new();
    while deployed.len() < 2 {
        match next().await {
            EventPayload::InstanceDeployed(d) => deployed.push((d.hash, d.strategy, d.reason)),
            EventPayload::InstanceDeploymentFailed(f) => {
                assert_eq!(f.hash, v3.hash());
                assert!(f.error.message.contains("it goes on"), "{f:?}");
            }
            other => panic!("only deployments follow: {other:?}"),
        }
    }
    assert_eq!(
        deployed
            .iter()
            .map(|(hash, strategy, _)| (*hash, *strategy))
            .collect::<Vec<_>>(),
        [
            (v2.hash(), DeployStrategy::Runtime),
            (v3.hash(), DeployStrategy::Runtime)
        ],
        "{deployed:?}"
    );
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls.iter().map(|c| c.0).collect::<Vec<_>>(),
        ["reload", "runtime", "runtime"],
        "one reload only, the first: {calls:?}"
    );
    // v2's change ran whole (5 s from t=0), v3's started after it.
    assert!(calls[2].2 >= Duration::from_secs(5), "{calls:?}");
    kernel.shutdown(Duration::from_secs(5)).await;
}
