//! The quickstart end to end: routes served by the managed HAProxy, endpoint changes
//! applied through the runtime API, new routes with exactly one reload.

use hapwright_e2e::{Controller, Reply, WAIT, service_manifest};

const WEB: &str = "web.example.test";
const API: &str = "api.example.test";

/// The demo app port the quickstart's `web` EndpointSlice points at.
fn web_port(controller: &Controller) -> u16 {
    let manifest = controller.read_resource("web.yaml");
    let ports = controller.ports();
    [ports.web_v1, ports.web_v2]
        .into_iter()
        .find(|port| manifest.contains(&format!("port: {port}")))
        .unwrap_or_else(|| panic!("web.yaml points at no web demo app:\n{manifest}"))
}

#[test]
fn quickstart_serves_its_routes() {
    let controller = Controller::start();

    let web = web_port(&controller);
    assert_eq!(controller.body(WEB), controller.demo_body(web));
    assert_eq!(
        controller.body(API),
        controller.demo_body(controller.ports().api)
    );
    // Host matching is case-insensitive and ignores the port.
    let api_port_host = format!("API.example.test:{}", controller.ports().http);
    assert_eq!(
        controller.body(&api_port_host),
        controller.demo_body(controller.ports().api)
    );
    let unknown = controller
        .route("nope.example.test")
        .expect("HAProxy answers");
    assert_eq!(
        unknown,
        Reply {
            status: 404,
            body: "no route for this host name\n".to_owned()
        }
    );

    assert_eq!(controller.status_get("/healthz"), (200, "ok\n".to_owned()));
    let (status, body) = controller.status_get("/readyz");
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"ready":true,"failing":[]}"#)
    );

    // One deployment so far: the managed HAProxy's first start.
    let instance = controller.wait_deployed();
    assert_eq!(instance.last_strategy.as_deref(), Some("reload"));
    assert_eq!(instance.reload_reason.as_deref(), Some("first_deploy"));
    assert_eq!((instance.reloads, instance.deployments), (1, 1));
    assert!(instance.last_error.is_none(), "{instance:?}");
    let master = controller.master();
    assert_eq!(master.reloads, 0, "HAProxy was started, not reloaded");
    assert_eq!(master.workers.len(), 1, "{master:?}");
    assert_eq!(
        controller.haproxy_pids(),
        {
            let mut pids = vec![master.master_pid, master.workers[0]];
            pids.sort_unstable();
            pids
        },
        "the managed HAProxy runs from this controller's directory"
    );

    // The rendered files and the resources are visible on /debug.
    let rendered = controller.json("/debug/rendered");
    let files = rendered["files"].as_array().expect("files");
    let paths: Vec<&str> = files.iter().filter_map(|f| f["path"].as_str()).collect();
    assert!(paths.contains(&"haproxy.cfg"), "{paths:?}");
    assert!(paths.contains(&"maps/hosts.map"), "{paths:?}");
    let services = controller.json("/debug/resources/services");
    assert!(services["count"].as_u64().unwrap_or(0) >= 2, "{services}");
    assert_eq!(
        controller.metric(
            r#"hapwright_deployments_total{instance="local",result="success",strategy="reload"}"#
        ),
        1.0
    );
}

#[test]
fn endpoint_change_moves_traffic_without_reload() {
    let controller = Controller::start();
    let ports = controller.ports();
    let from = web_port(&controller);
    let to = if from == ports.web_v1 {
        ports.web_v2
    } else {
        ports.web_v1
    };
    assert_eq!(controller.body(WEB), controller.demo_body(from));
    let before = controller.wait_deployed();
    let master = controller.master();

    let manifest = controller.read_resource("web.yaml");
    controller.write_resource(
        "web.yaml",
        &manifest.replace(&format!("port: {from}"), &format!("port: {to}")),
    );
    controller.wait_for_body(WEB, &controller.demo_body(to));

    let after = controller.wait_deployed();
    assert_eq!(after.last_strategy.as_deref(), Some("runtime"), "{after:?}");
    assert!(
        after.last_reason.contains(&format!("127.0.0.1:{to}")),
        "the reason names the new address: {after:?}"
    );
    assert_eq!(after.reloads, before.reloads, "no reload: {after:?}");
    assert_eq!(after.deployments, before.deployments + 1);
    assert_eq!(
        controller.master(),
        master,
        "same HAProxy processes, no reload"
    );
    assert_eq!(
        controller.body(API),
        controller.demo_body(ports.api),
        "other routes unaffected"
    );
    let (_, metrics) = controller.status_get("/metrics");
    assert!(
        metrics.contains(
            r#"hapwright_validation_phase2_skipped_total{reason="equivalent_servers"} 1"#
        ),
        "only the server address changed, so haproxy -c was not run again:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("validation"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn adding_a_route_reloads_once() {
    let controller = Controller::start();
    let ports = controller.ports();
    let before = controller.wait_deployed();
    let master = controller.master();
    assert_eq!(
        controller.route("extra.example.test").map(|r| r.status),
        Ok(404)
    );

    controller.write_resource(
        "extra.yaml",
        &service_manifest("extra", "extra.example.test", ports.api),
    );
    controller.wait_for_body("extra.example.test", &controller.demo_body(ports.api));

    let after = controller.wait_deployed();
    assert_eq!(after.last_strategy.as_deref(), Some("reload"), "{after:?}");
    assert_eq!(
        after.reloads,
        before.reloads + 1,
        "exactly one reload: {after:?}"
    );
    assert_eq!(after.deployments, before.deployments + 1, "{after:?}");
    let now = controller.master();
    assert_eq!(
        now.master_pid, master.master_pid,
        "the master survives reloads"
    );
    assert_eq!(
        now.reloads,
        master.reloads + 1,
        "HAProxy reloaded once: {now:?}"
    );
    assert_eq!(
        controller.metric(
            r#"hapwright_deployments_total{instance="local",result="success",strategy="reload"}"#
        ),
        2.0
    );
    // The existing routes still answer after the reload.
    assert_eq!(
        controller.body(WEB),
        controller.demo_body(web_port(&controller))
    );
    assert_eq!(controller.body(API), controller.demo_body(ports.api));
    // Nothing more is pending: still one reload a moment later.
    let later = controller.wait_until("status settles", WAIT, || Some(controller.instance()));
    assert_eq!(later.reloads, after.reloads);
}
