//! Confirmed reloads against a real HAProxy 2.6: structural changes reload exactly
//! once, failed reloads restore the files, no update is lost and no request fails.

mod support;

use hapwright_deployer::Driver;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use hapwright_deployer::component::deployer::{self, Deployer, LastDeployedStore};
use hapwright_deployer::component::scheduler::{self, Scheduler};
use hapwright_deployer::driver::{DeployError, SocketDriver};
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::model::{DeployStrategy, ReloadReason};
use hapwright_eventbus::testing::TestBus;
use hapwright_eventbus::{EventKind, EventPayload};
use support::{Backend, Haproxy, bodies, config, free_port, http_get, rendered, wait_for_body};
use tokio::time::timeout;

fn backends(a: u16, extra: &str) -> String {
    format!("backend be_app\n    server s1 127.0.0.1:{a}\n{extra}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structural_change_reloads_once_and_a_failed_reload_restores_files() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let port = free_port();
    let v1 = rendered(&config(port, &backends(a.port, "")), &[("hosts.map", "")]);
    let haproxy = Haproxy::start("local", &v1, &v1.hash().short()).await;
    let driver = SocketDriver::new(
        haproxy.instance.clone(),
        None,
        Metrics::unregistered().unwrap(),
    );
    let running = driver.deploy(v1, None, None, false).await.unwrap();
    wait_for_body(port, "app.test", "a").await;
    let before = haproxy.reloads().await;

    let v2 = rendered(
        &config(
            port,
            &backends(
                a.port,
                &format!("\nbackend be_new\n    server n1 127.0.0.1:{}\n", b.port),
            ),
        ),
        &[("hosts.map", "new.test be_new\n")],
    );
    let d2 = driver
        .deploy(v2.clone(), None, Some(running.into()), false)
        .await
        .unwrap();
    assert_eq!(d2.strategy, DeployStrategy::Reload);
    assert_eq!(d2.reason.reload, Some(ReloadReason::Structure));
    assert_eq!(d2.reason.detail, "backend be_new added");
    assert_eq!(haproxy.reloads().await, before + 1, "exactly one reload");
    assert_eq!(bodies(port, "new.test", 3).await, vec!["200 b"; 3]);
    assert_eq!(haproxy.config_version().await, Some(v2.hash().short()));

    // A frontend on a port that is already taken: the reload fails.
    let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = blocker.local_addr().unwrap().port();
    let good_files = std::fs::read_to_string(haproxy.path().join("haproxy.cfg")).unwrap();
    let v3 = rendered(
        &config(
            port,
            &backends(
                a.port,
                &format!(
                    "\nbackend be_new\n    server n1 127.0.0.1:{}\n\nfrontend fe_taken\n    bind 127.0.0.1:{taken}\n    default_backend be_app\n",
                    b.port
                ),
            ),
        ),
        &[("hosts.map", "new.test be_new\n")],
    );
    let error = driver
        .deploy(v3, None, Some(d2.into()), false)
        .await
        .unwrap_err();
    assert!(
        matches!(error, DeployError::ReloadFailed { failed: 1, .. }),
        "{error}"
    );
    assert_eq!(haproxy.reloads().await, before + 2);
    // The old worker keeps serving, and the last good files are back.
    assert_eq!(bodies(port, "new.test", 3).await, vec!["200 b"; 3]);
    assert_eq!(
        std::fs::read_to_string(haproxy.path().join("haproxy.cfg")).unwrap(),
        good_files
    );
    drop(blocker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_structural_deploys_under_load_fail_no_request() {
    let a = Backend::start("a").await;
    let port = free_port();
    let render = |n: usize| {
        rendered(
            &config(
                port,
                &backends(
                    a.port,
                    &format!("    http-response set-header X-Version {n}\n"),
                ),
            ),
            &[("hosts.map", "")],
        )
    };
    let v0 = render(0);
    let haproxy = Haproxy::start("load", &v0, &v0.hash().short()).await;
    let driver = SocketDriver::new(
        haproxy.instance.clone(),
        None,
        Metrics::unregistered().unwrap(),
    );
    let mut running = Arc::new(driver.deploy(v0, None, None, false).await.unwrap());
    wait_for_body(port, "app.test", "a").await;
    let before = haproxy.reloads().await;

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let load = {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        tokio::spawn(async move {
            // Bounded: stops when told, or after 100 000 requests.
            for _ in 0..100_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match http_get(port, "app.test").await {
                    Ok((200, body)) if body == "a" => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    };
    for n in 1..=20 {
        let deployed = driver
            .deploy(render(n), None, Some(running.clone()), false)
            .await
            .unwrap();
        assert_eq!(deployed.strategy, DeployStrategy::Reload);
        running = Arc::new(deployed);
    }
    stop.store(true, Ordering::Relaxed);
    timeout(Duration::from_secs(10), load)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(haproxy.reloads().await, before + 20);
    assert!(ok.load(Ordering::Relaxed) > 20, "the load loop ran");
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_successive_changes_end_with_the_latest_live() {
    let (a, b, c) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    );
    let port = free_port();
    // Each version needs a reload (a new header line) and routes to another backend.
    let render = |n: usize, backend: u16| {
        rendered(
            &config(
                port,
                &format!(
                    "backend be_app\n    http-response set-header X-Version {n}\n    server s1 127.0.0.1:{backend}\n"
                ),
            ),
            &[("hosts.map", "")],
        )
    };
    let v1 = render(1, a.port);
    let haproxy = Haproxy::start("local", &v1, &v1.hash().short()).await;

    let bus = TestBus::new();
    let metrics = Metrics::register(bus.registry()).unwrap();
    let store = LastDeployedStore::new();
    let mut completed = bus.subscribe("test", [EventKind::DeploymentCompleted]);
    let publisher = bus.publisher();
    let kernel = bus.start(|kernel| {
        kernel.register(Scheduler::new(
            scheduler::Config {
                min_deployment_interval: Duration::from_millis(50),
            },
            vec!["local".to_owned()],
        ));
        kernel.register(Deployer::new(
            deployer::Config {
                min_reload_interval: Duration::from_millis(200),
                ..deployer::Config::default()
            },
            vec![haproxy.instance.clone()],
            store.clone(),
            None,
            metrics,
        ));
    });
    publisher.publish(support::validated(&v1));
    let v2 = render(2, b.port);
    let v3 = render(3, c.port);
    publisher.publish(support::validated(&v2));
    publisher.publish(support::validated(&v3));
    let done = timeout(Duration::from_secs(20), async {
        loop {
            let event = completed.recv().await.unwrap();
            if let EventPayload::DeploymentCompleted(done) = &event.payload
                && done.summary.hash == v3.hash()
            {
                return done.summary.clone();
            }
        }
    })
    .await
    .expect("the latest config is deployed");
    assert_eq!(done.succeeded, vec!["local"]);
    assert_eq!(bodies(port, "app.test", 3).await, vec!["200 c"; 3]);
    assert_eq!(haproxy.config_version().await, Some(v3.hash().short()));
    assert_eq!(store.deployed("local").unwrap().config.hash(), v3.hash());
    kernel.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_state_is_saved_only_inside_the_config_directory() {
    let a = Backend::start("a").await;
    let port = free_port();
    let outside = tempfile::tempdir().unwrap();
    let outside_file = outside.path().join("servers.state");
    // `extra` backends force a reload on every step.
    let with_state = |state_file: &str, extra: &str| {
        let main = config(port, &backends(a.port, extra)).replacen(
            "global\n",
            &format!("global\n    server-state-file {state_file}\n"),
            1,
        );
        rendered(&main, &[("hosts.map", "")])
    };
    let v1 = with_state(&outside_file.display().to_string(), "");
    let haproxy = Haproxy::start("local", &v1, &v1.hash().short()).await;
    let metrics = Metrics::unregistered().unwrap();
    let driver = SocketDriver::new(haproxy.instance.clone(), None, metrics.clone());
    let running = driver.deploy(v1, None, None, false).await.unwrap();
    wait_for_body(port, "app.test", "a").await;

    // A path outside the config directory: nothing is written there, the refusal
    // is counted, and the reload still happens.
    let before = haproxy.reloads().await;
    let v2 = with_state(
        &outside_file.display().to_string(),
        "\nbackend be_two\n    server t1 127.0.0.1:1\n",
    );
    let d2 = driver
        .deploy(v2, None, Some(running.into()), false)
        .await
        .unwrap();
    assert_eq!(d2.strategy, DeployStrategy::Reload);
    assert_eq!(haproxy.reloads().await, before + 1);
    assert!(
        std::fs::read_dir(outside.path()).unwrap().next().is_none(),
        "nothing may be written outside the config directory"
    );
    assert_eq!(metrics.state_file_refused_count("local"), 1);

    // Inside the config directory the state is saved before the reload.
    let v3 = with_state(
        "state/servers.state",
        "\nbackend be_three\n    server t1 127.0.0.1:1\n",
    );
    let d3 = driver
        .deploy(v3, None, Some(d2.into()), false)
        .await
        .unwrap();
    assert_eq!(d3.strategy, DeployStrategy::Reload);
    let saved = std::fs::read_to_string(haproxy.path().join("state/servers.state")).unwrap();
    assert!(saved.contains("be_app"), "{saved}");
    assert_eq!(metrics.state_file_refused_count("local"), 1);
}
