//! Managed mode: hapwright starts HAProxy after the first render, two instances side by
//! side with their own env, restart after a crash, failed reloads report ALERT lines,
//! and `stop()` ends every process.

mod support;

use hapwright_deployer::Driver;
use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::driver::managed::{ManagedHaproxy, ProcessState, SupervisorConfig};
use hapwright_deployer::driver::{DeployError, SocketDriver};
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::model::{DeployStrategy, ReloadReason};
use support::{
    Backend, Haproxy, StopOnDrop, bodies, config, free_port, http_get, rendered, wait_for_body,
};
use tokio::time::timeout;

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_instances_start_restart_report_alerts_and_stop() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let managed = ManagedHaproxy::with_config("haproxy", support::quick_supervisor());
    let guard = StopOnDrop(managed.clone());
    // The port comes from the instance's env: one render serves both instances.
    let main = config(
        0,
        &format!("backend be_app\n    server s1 127.0.0.1:{}\n", a.port),
    )
    .replace("bind 127.0.0.1:0", "bind 127.0.0.1:${HTTP_PORT}");
    let v1 = rendered(&main, &[("hosts.map", "")]);
    let mut instances = Vec::new();
    for name in ["one", "two"] {
        let mut dir = Haproxy::dir_only(name);
        let port = free_port();
        dir.instance.managed = true;
        dir.instance
            .env
            .insert("HTTP_PORT".into(), port.to_string());
        let driver = SocketDriver::new(
            dir.instance.clone(),
            Some(managed.clone()),
            Metrics::unregistered().unwrap(),
        );
        let deployed = driver.deploy(v1.clone(), None, None, false).await.unwrap();
        assert_eq!(deployed.strategy, DeployStrategy::Reload);
        assert_eq!(deployed.reason.reload, Some(ReloadReason::FirstDeploy));
        wait_for_body(port, "app.test", "a").await;
        instances.push((dir, port, driver, Arc::new(deployed)));
    }

    // A failing reload (port in use) reports HAProxy's ALERT lines.
    let (_, port_one, driver_one, running_one) = &instances[0];
    let (_, port_two, _, _) = &instances[1];
    // HAProxy binds with SO_REUSEPORT, so the port must be held by a plain socket.
    let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = blocker.local_addr().unwrap().port();
    let bad = rendered(
        &format!(
            "{main}\nfrontend fe_clash\n    bind 127.0.0.1:{taken}\n    default_backend be_app\n"
        ),
        &[("hosts.map", "")],
    );
    let error = driver_one
        .deploy(bad, None, Some(running_one.clone()), false)
        .await
        .unwrap_err();
    let DeployError::ReloadFailed { alerts, .. } = &error else {
        panic!("unexpected error {error}");
    };
    assert!(
        alerts.iter().any(|l| l.contains("cannot bind socket")),
        "{alerts:?}"
    );
    assert_eq!(bodies(*port_one, "app.test", 2).await, vec!["200 a"; 2]);
    drop(blocker);

    // A structural change on instance one.
    let v2 = rendered(
        &main
            .replace(&a.port.to_string(), &b.port.to_string())
            .replace("server s1", "option forwardfor\n    server s1"),
        &[("hosts.map", "")],
    );
    let d2 = driver_one
        .deploy(v2, None, Some(running_one.clone()), false)
        .await
        .unwrap();
    assert_eq!(d2.strategy, DeployStrategy::Reload);
    assert_eq!(
        d2.reason.detail,
        "backend be_app: new keyword `option forwardfor`"
    );
    wait_for_body(*port_one, "app.test", "b").await;
    assert_eq!(bodies(*port_two, "app.test", 2).await, vec!["200 a"; 2]);

    // Killing the worker takes the master down (2.6); the supervisor restarts it.
    let (dir_one, ..) = &instances[0];
    let info = dir_one.master().show_proc().await.unwrap();
    let master_pid = info.master_pid;
    let worker = rustix::process::Pid::from_raw(info.workers[0] as i32).unwrap();
    rustix::process::kill_process(worker, rustix::process::Signal::KILL).unwrap();
    let mut state = managed.watch("one").await.unwrap();
    timeout(Duration::from_secs(15), async {
        loop {
            if let ProcessState::Running { pid } = &*state.borrow_and_update()
                && *pid != master_pid
            {
                return;
            }
            state.changed().await.unwrap();
        }
    })
    .await
    .expect("restarted");
    wait_for_body(*port_one, "app.test", "b").await;

    // Stop ends every process.
    let pids: Vec<u32> = {
        let mut pids = Vec::new();
        for (dir, ..) in &instances {
            let info = dir.master().show_proc().await.unwrap();
            pids.push(info.master_pid);
            pids.extend(info.workers);
        }
        pids
    };
    timeout(Duration::from_secs(15), managed.stop())
        .await
        .unwrap();
    timeout(Duration::from_secs(5), async {
        while pids.iter().any(|pid| alive(*pid)) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every HAProxy process exited");
    assert!(http_get(*port_one, "app.test").await.is_err());
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_served_by_another_haproxy_is_refused_with_its_owner() {
    let a = Backend::start("a").await;
    let port = free_port();
    let main = config(
        port,
        &format!("backend be_app\n    server s1 127.0.0.1:{}\n", a.port),
    );
    let v1 = rendered(&main, &[("hosts.map", "")]);
    // Another HAProxy, not hapwright's, already serves the port. With SO_REUSEPORT
    // a second one would start next to it and take half the connections.
    let foreign = Haproxy::start("foreign", &v1, "foreign").await;
    wait_for_body(port, "app.test", "a").await;

    let managed = ManagedHaproxy::with_config("haproxy", support::quick_supervisor());
    let guard = StopOnDrop(managed.clone());
    let mut dir = Haproxy::dir_only("mine");
    dir.instance.managed = true;
    let driver = SocketDriver::new(
        dir.instance.clone(),
        Some(managed.clone()),
        Metrics::unregistered().unwrap(),
    );
    let error = driver
        .deploy(v1.clone(), None, None, false)
        .await
        .expect_err("the port is taken by a foreign HAProxy")
        .to_string();
    assert!(
        error.contains(&format!(
            "127.0.0.1:{port} is already served by haproxy (pid "
        )),
        "{error}"
    );
    // Nothing of ours runs on the instance's config.
    assert!(
        hapwright_deployer::driver::managed::masters_of(
            &dir.instance.config_dir.join("haproxy.cfg")
        )
        .is_empty()
    );
    drop(guard);
    drop(foreign);
}

/// A stop drains: a request in flight finishes. A connection still open after
/// `hard_stop_after` is closed and the stop ends (bounded), with HAProxy gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_drains_requests_in_flight_and_cuts_what_outlasts_hard_stop_after() {
    use support::traffic;

    for (delay, hard_stop_after, finishes) in [
        // The request ends well within the bound: answered.
        (Duration::from_millis(800), Duration::from_secs(20), true),
        // The request outlasts the bound: cut.
        (Duration::from_secs(60), Duration::from_millis(500), false),
    ] {
        let backend = traffic::SlowBackend::start(delay).await;
        let managed = ManagedHaproxy::with_config(
            "haproxy",
            SupervisorConfig {
                ready_timeout: Duration::from_secs(10),
                stop_grace: Duration::from_secs(2),
                hard_stop_after,
                ..SupervisorConfig::default()
            },
        );
        let guard = StopOnDrop(managed.clone());
        let port = free_port();
        let main = config(
            port,
            &format!("backend be_app\n    server s1 127.0.0.1:{}\n", backend.port),
        );
        let mut dir = Haproxy::dir_only("drain");
        dir.instance.managed = true;
        let driver = SocketDriver::new(
            dir.instance.clone(),
            Some(managed.clone()),
            Metrics::unregistered().unwrap(),
        );
        driver
            .deploy(rendered(&main, &[("hosts.map", "")]), None, None, false)
            .await
            .unwrap();
        let pid = match managed.state("drain").await {
            Some(ProcessState::Running { pid }) => pid,
            other => panic!("not running: {other:?}"),
        };

        let mut client = traffic::Client::new(port, true);
        let request = tokio::spawn(async move { client.get().await });
        timeout(Duration::from_secs(10), async {
            while backend.arrivals().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the request reached the backend");
        timeout(Duration::from_secs(30), managed.stop())
            .await
            .expect("the stop is bounded by hard_stop_after");
        assert!(!alive(pid), "the master is gone");
        let outcome = request.await.unwrap();
        if finishes {
            assert_eq!(
                outcome.result,
                Ok((200, backend.port.to_string())),
                "answered during the drain"
            );
        } else {
            assert!(
                outcome.result.is_err(),
                "cut after hard_stop_after: {outcome:?}"
            );
        }
        drop(guard);
    }
}
