//! Deployments that fail after files were written, against real HAProxy 2.6: the last
//! good files are put back and the failure is reported, with the deployer component
//! (instance workers, nested timeouts) driving the socket driver.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::component::deployer::{self, Deployer, LastDeployedStore};
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::EventPayload;
use hapwright_eventbus::model::{RenderedConfig, SourceMap};
use hapwright_eventbus::testing::TestBus;
use support::{Backend, Haproxy, config, free_port, wait_for_body};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_slower_than_the_deployment_timeout_restores_the_files_and_reports_it() {
    let app = Backend::start("app").await;
    let port = free_port();
    let main = config(
        port,
        &format!("backend be_app\n    server s1 127.0.0.1:{}\n", app.port),
    );
    let v1 = Arc::new(RenderedConfig::new(
        main.clone(),
        BTreeMap::from([("hosts.map".to_owned(), Arc::from(""))]),
        BTreeMap::new(),
        BTreeMap::new(),
        SourceMap::default(),
    ));
    // v2 loads a Lua file that keeps HAProxy busy for 4 s while it loads the config:
    // the reload takes longer than the 2 s deployment timeout.
    let slow = "local t = os.time()\nwhile os.time() - t < 4 do end\n";
    let v2 = Arc::new(RenderedConfig::new(
        main.replacen("global\n", "global\n    lua-load files/slow.lua\n", 1),
        BTreeMap::from([("hosts.map".to_owned(), Arc::from(""))]),
        BTreeMap::from([("slow.lua".to_owned(), Arc::from(slow))]),
        BTreeMap::new(),
        SourceMap::default(),
    ));
    let haproxy = Haproxy::start("slow", &v1, &v1.hash().short()).await;
    wait_for_body(port, "app.test", "app").await;
    let before = std::fs::read(haproxy.path().join("haproxy.cfg")).unwrap();

    let bus = TestBus::new();
    let registry = bus.registry().clone();
    let mut events = support::deployments(&bus);
    let publisher = bus.publisher();
    let metrics = Metrics::register(&registry).unwrap();
    let deployer = Deployer::new(
        deployer::Config {
            deployment_timeout: Duration::from_secs(2),
            // No retry while the test looks at the directory.
            min_retry_delay: Duration::from_secs(600),
            max_retry_delay: Duration::from_secs(600),
            ..deployer::Config::default()
        },
        vec![haproxy.instance.clone()],
        LastDeployedStore::new(),
        None,
        metrics.clone(),
    );
    let kernel = bus.start_one(deployer);
    let schedule = |config: &Arc<RenderedConfig>| {
        publisher.publish(support::scheduled(config, &["slow"]));
    };
    let mut outcome = async || support::next_outcome(&mut events, Duration::from_secs(30)).await;

    // What the instance runs is found on disk: a no-op.
    schedule(&v1);
    assert!(matches!(outcome().await, EventPayload::InstanceDeployed(_)));

    schedule(&v2);
    let EventPayload::InstanceDeploymentFailed(failed) = outcome().await else {
        panic!("the slow reload fails");
    };
    assert!(
        failed.error.message.contains("reload not confirmed within"),
        "{}",
        failed.error.message
    );
    // The last good files are back, byte for byte, and v2's new file is gone.
    assert_eq!(
        std::fs::read(haproxy.path().join("haproxy.cfg")).unwrap(),
        before
    );
    assert!(!haproxy.path().join("files/slow.lua").exists());
    let failures = registry
        .gather()
        .into_iter()
        .filter(|f| f.name() == "hapwright_deployments_total")
        .flat_map(|f| f.get_metric().to_vec())
        .filter(|m| m.get_label().iter().any(|l| l.value() == "failure"))
        .map(|m| m.get_counter().get_value())
        .sum::<f64>();
    assert_eq!(failures, 1.0);
    assert_eq!(metrics.restore_failure_count("slow"), 0);
    kernel.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_that_differ_from_the_state_record_are_repaired_with_one_reload() {
    use hapwright_deployer::Driver;
    use hapwright_deployer::driver::SocketDriver;
    use hapwright_deployer::haproxy::files::{ConfigDir, RecordCheck};
    use hapwright_eventbus::model::{DeployStrategy, ReloadReason};
    use std::os::unix::fs::PermissionsExt;

    let app = Backend::start("app").await;
    let other = Backend::start("other").await;
    let port = free_port();
    let main = config(
        port,
        &format!(
            "backend be_app\n    server s1 127.0.0.1:{}\n\nbackend be_other\n    server o1 127.0.0.1:{}\n",
            app.port, other.port
        ),
    );
    let cert = "-----BEGIN PRIVATE KEY-----\nnot a real key\n-----END PRIVATE KEY-----\n";
    let v1 = Arc::new(RenderedConfig::new(
        main,
        BTreeMap::from([("hosts.map".to_owned(), Arc::from("other.test be_other\n"))]),
        BTreeMap::new(),
        BTreeMap::from([("site.key".to_owned(), Arc::from(cert))]),
        SourceMap::default(),
    ));
    let haproxy = Haproxy::start("crashed", &v1, &v1.hash().short()).await;
    wait_for_body(port, "other.test", "other").await;
    let reloads = haproxy.reloads().await;

    // A controller was killed after writing the next render's map and before
    // haproxy.cfg: the marker still matches the worker, the map does not.
    std::fs::write(haproxy.path().join("maps/hosts.map"), "other.test be_app\n").unwrap();
    assert!(matches!(
        ConfigDir::new(haproxy.path()).check_record().unwrap(),
        RecordCheck::Mismatch { .. }
    ));

    // The next controller does not trust the directory: one reload rewrites it.
    let driver = SocketDriver::new(
        haproxy.instance.clone(),
        None,
        Metrics::unregistered().unwrap(),
    );
    let deployed = driver.deploy(v1.clone(), None, None, false).await.unwrap();
    assert_eq!(deployed.strategy, DeployStrategy::Reload);
    assert_eq!(deployed.reason.reload, Some(ReloadReason::FirstDeploy));
    assert_eq!(haproxy.reloads().await, reloads + 1);
    assert_eq!(
        std::fs::read_to_string(haproxy.path().join("maps/hosts.map")).unwrap(),
        "other.test be_other\n"
    );
    assert!(matches!(
        ConfigDir::new(haproxy.path()).check_record().unwrap(),
        RecordCheck::Consistent { .. }
    ));
    // Keys are readable by their owner only.
    let mode = std::fs::metadata(haproxy.path().join("certs/site.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");

    // Now the directory is trusted: the same render is a no-op.
    let again = driver.deploy(v1.clone(), None, None, false).await.unwrap();
    assert_eq!(again.strategy, DeployStrategy::Noop);
    assert_eq!(haproxy.reloads().await, reloads + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_that_fails_too_is_an_error_of_its_own_and_counted() {
    use hapwright_deployer::Driver;
    use hapwright_deployer::driver::{DeployError, SocketDriver};
    use hapwright_deployer::haproxy::files::Faults;

    let app = Backend::start("app").await;
    let port = free_port();
    let render = |extra: &str| {
        Arc::new(RenderedConfig::new(
            config(
                port,
                &format!(
                    "backend be_app\n{extra}    server s1 127.0.0.1:{}\n",
                    app.port
                ),
            ),
            BTreeMap::from([("hosts.map".to_owned(), Arc::from(""))]),
            BTreeMap::new(),
            BTreeMap::new(),
            SourceMap::default(),
        ))
    };
    let v1 = render("");
    let haproxy = Haproxy::start("broken-disk", &v1, &v1.hash().short()).await;
    let before = std::fs::read(haproxy.path().join("haproxy.cfg")).unwrap();
    let metrics = Metrics::unregistered().unwrap();
    // HAProxy refuses the next config, and putting the last good files back fails
    // (the disk filled up meanwhile).
    let driver = SocketDriver::new(haproxy.instance.clone(), None, metrics.clone())
        .with_faults(Faults::parse("fail-restore").unwrap());
    let running = driver.deploy(v1.clone(), None, None, false).await.unwrap();

    let v2 = render("    no-such-keyword here\n");
    let error = driver
        .deploy(v2, None, Some(Arc::new(running)), false)
        .await
        .unwrap_err();
    assert!(
        matches!(error, DeployError::RestoreFailed { .. }),
        "{error}"
    );
    let message = error.to_diagnostic().message;
    assert!(
        message.contains("HAProxy refused the new config")
            && message.contains("putting the last good files back")
            && message.contains("No space left"),
        "{message}"
    );
    assert_eq!(metrics.restore_failure_count("broken-disk"), 1);
    // The refused files stay on disk (that is what the error says), while the old
    // worker keeps serving the old config.
    assert_ne!(
        std::fs::read(haproxy.path().join("haproxy.cfg")).unwrap(),
        before
    );
    wait_for_body(port, "app.test", "app").await;
}
