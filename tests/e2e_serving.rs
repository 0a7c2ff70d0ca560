//! A pod that serves stays in its Service, and leaves it without dropping requests:
//! `/readyz` stays 200 while a failed deployment leaves HAProxy on its last good
//! config, and stopping hapwright drains its managed HAProxy (the requests in flight
//! finish).

use std::time::{Duration, Instant};

use hapwright_e2e::{Controller, WAIT, quick_pacing, replace_once, service_manifest};

#[path = "../crates/deployer/tests/support/traffic.rs"]
#[allow(dead_code)]
mod traffic;

const WEB: &str = "web.example.test";

/// A `bind` that passes `haproxy -c` (which binds nothing) and fails when HAProxy
/// starts its listeners: 192.0.2.1 (TEST-NET-1) is no address of this host.
const UNBINDABLE: &str = "    frontend unbindable\n        bind 192.0.2.1:18081\n        default_backend be_no_route\n\n    backend be_no_route\n";

#[test]
fn a_deployment_that_fails_on_the_instance_leaves_readiness_up_while_the_old_config_serves() {
    let controller = Controller::start_with(|config| quick_pacing(config, "200ms"));
    let before = controller.wait_deployed();
    let web = controller.body(WEB);
    let config = controller.read_config();
    controller.write_config(&replace_once(
        &config,
        "    backend be_no_route\n",
        UNBINDABLE,
    ));

    let failing = controller.wait_until("the reload fails on the instance", WAIT, || {
        let instance = controller.instance();
        instance.last_error.clone().map(|error| (instance, error))
    });
    let (instance, error) = failing;
    assert!(
        error.to_string().contains("192.0.2.1:18081"),
        "the error names the listener: {error}"
    );
    assert_eq!(instance.deployments, before.deployments, "{instance:?}");

    // The old config serves, and readiness says so.
    assert_eq!(controller.body(WEB), web);
    let (status, body) = controller.status_get("/readyz");
    assert_eq!(status, 200, "{body}");
    let readiness: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(readiness["ready"], true);
    assert_eq!(readiness["failing"][0]["instance"], "local", "{readiness}");

    // The failure shows where an operator looks: metrics, /debug/instances, the page.
    assert_eq!(
        controller.metric("hapwright_instance_in_sync{instance=\"local\"}"),
        0.0
    );
    let instances = controller.json("/debug/instances");
    assert_eq!(instances[0]["state"], "failing", "{instances}");
    // The managed HAProxy runs haproxy.binary, the validator: the same line.
    assert!(
        instances[0]["haproxy_version"].is_string(),
        "read after the first start: {instances}"
    );
    assert_eq!(instances[0]["haproxy_line_mismatch"], false, "{instances}");
    assert_eq!(
        controller.metric("hapwright_instance_haproxy_line_mismatch{instance=\"local\"}"),
        0.0
    );
    let page = controller.status_page();
    assert!(
        page.contains("last deployment failed on local: serving the last good config"),
        "{page}"
    );

    // Still ready and serving after the retries.
    controller.wait_until("a retry fails too", WAIT, || {
        let error = controller.instance().last_error?;
        error
            .to_string()
            .contains("2 consecutive failures")
            .then_some(())
    });
    assert_eq!(controller.status_get("/readyz").0, 200);
    assert_eq!(controller.body(WEB), web);

    // Fixed: deployed, nothing failing.
    controller.write_config(&config);
    controller.wait_until("the fixed config deploys", WAIT, || {
        controller.instance().last_error.is_none().then_some(())
    });
    let (status, body) = controller.status_get("/readyz");
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"ready":true,"failing":[]}"#)
    );
}

/// Requests in flight when hapwright gets SIGTERM finish: the managed HAProxy is
/// drained (soft stop), not cut off.
#[test]
fn stopping_hapwright_finishes_every_request_in_flight() {
    const CLIENTS: usize = 8;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Slow enough that every client has a request in flight when the stop comes.
    let backend = runtime.block_on(traffic::SlowBackend::start(Duration::from_millis(1500)));
    let mut controller = Controller::start_with(|config| quick_pacing(config, "200ms"));
    controller.write_resource(
        "slow.yaml",
        &service_manifest("slow", "app.test", backend.port),
    );
    let http = controller.ports().http;
    controller.wait_until("the slow service routes", WAIT, || {
        let mut client = traffic::Client::new(http, false);
        let outcome = runtime.block_on(client.get());
        (outcome.result.ok()? == (200, backend.port.to_string())).then_some(())
    });
    let haproxy = controller.haproxy_pids();
    assert!(!haproxy.is_empty());

    // Keep-alive clients send one request after another.
    let stop = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let stop = stop.clone();
            runtime.spawn(async move {
                let mut client = traffic::Client::new(http, true);
                let mut outcomes = Vec::new();
                loop {
                    let outcome = client.get().await;
                    let done = Instant::now();
                    outcomes.push((outcome, done));
                    let stopped = *stop.lock().unwrap();
                    if stopped.is_some_and(|at| done > at) {
                        return outcomes;
                    }
                }
            })
        })
        .collect();
    // Every client has a request in flight: each waits 1.5 s at the backend.
    controller.wait_until("every client sent a request", WAIT, || {
        (backend.arrivals().len() >= CLIENTS).then_some(())
    });
    *stop.lock().unwrap() = Some(Instant::now());
    let status = controller.terminate(Duration::from_secs(60));
    let stopped_at = stop.lock().unwrap().expect("set above");
    assert_eq!(status.code(), Some(0), "clean exit: {status:?}");

    let outcomes: Vec<_> = clients
        .into_iter()
        .flat_map(|client| runtime.block_on(client).unwrap())
        .collect();
    let before: Vec<_> = outcomes
        .iter()
        .filter(|(outcome, _)| outcome.started < stopped_at)
        .collect();
    let in_flight = before.iter().filter(|(_, done)| *done > stopped_at).count();
    assert!(
        in_flight >= CLIENTS,
        "every client had a request in flight at the stop: {before:#?}"
    );
    let failed: Vec<_> = before
        .iter()
        .filter(|(outcome, _)| outcome.result != Ok((200, backend.port.to_string())))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests started before the stop failed: {failed:#?}",
        failed.len(),
        before.len()
    );
    let left = controller.haproxy_pids();
    assert!(left.is_empty(), "HAProxy processes left behind: {left:?}");
    let log = controller.log_text();
    assert!(
        log.contains("Managed HAProxy finished its connections"),
        "drained, not cut: {log}"
    );
}
