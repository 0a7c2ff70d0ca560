//! The safety valve end to end, with the real binary, a real managed HAProxy and the
//! files source: emptying the resource directory does not take the routes down.

use hapwright_e2e::{Controller, Value, WAIT};

/// `/debug/safety` once `check` accepts it.
fn wait_safety(controller: &Controller, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    controller.wait_until(what, WAIT, || {
        let safety = controller.json("/debug/safety");
        check(&safety).then_some(safety)
    })
}

fn scheduler_health(controller: &Controller) -> (String, String) {
    let components = controller.json("/debug/components");
    let scheduler = components
        .as_array()
        .and_then(|list| list.iter().find(|c| c["name"] == "scheduler"))
        .cloned()
        .unwrap_or_else(|| controller.fail(&format!("no scheduler in {components}")));
    (
        scheduler["health"].as_str().unwrap_or_default().to_owned(),
        scheduler["reason"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Waits until HAProxy answers `host` with `status`.
fn wait_for_status(controller: &Controller, host: &str, status: u16) {
    controller.wait_until(&format!("{host} answers {status}"), WAIT, || {
        controller
            .route(host)
            .ok()
            .filter(|reply| reply.status == status)
    });
}

#[test]
fn an_emptied_directory_is_held_until_the_files_return_or_an_approval() {
    let controller = Controller::start();
    controller.wait_deployed();
    let web = controller.demo_body(controller.ports().web_v1);
    controller.wait_for_body("web.example.test", &web);

    // A small removal goes out as usual: api is one of three backends, one of two
    // servers, one of two routes (not more than the default 50%).
    std::fs::remove_file(controller.resource_path("api.yaml")).expect("remove api.yaml");
    wait_for_status(&controller, "api.example.test", 404);

    // The directory's last file goes: no servers and no routes would be left.
    let manifest = controller.read_resource("web.yaml");
    std::fs::remove_file(controller.resource_path("web.yaml")).expect("remove web.yaml");
    // The file's EndpointSlice and Service leave through two watched resources and
    // may reach two renders; the later one replaces the held one.
    let full =
        "would remove 1 of 2 backends (50%), 1 of 1 servers (100%), 1 of 1 map entries (100%)";
    let safety = wait_safety(&controller, "the valve holds the whole removal", |s| {
        s["held"] == true && s["hold"]["summary"] == full
    });
    assert_eq!(
        safety["hold"]["removal"]["removedBackends"][0],
        "be_default_web"
    );
    // The running config keeps serving, and everything says why.
    assert_eq!(controller.body("web.example.test"), web);
    let (health, reason) = scheduler_health(&controller);
    assert_eq!(health, "degraded", "{reason}");
    assert!(
        reason.contains("would remove 1 of 2 backends (50%), 1 of 1 servers (100%)")
            && reason.contains("POST /-/approve"),
        "{reason}"
    );
    let page = controller.status_page();
    assert!(page.contains("Safety valve: a change is held"), "{page}");
    assert!(page.contains("<code>be_default_web</code>"), "{page}");
    assert!(page.contains("X-Hapwright-Approve: 1"), "{page}");
    assert_eq!(controller.metric("hapwright_safety_valve_held"), 1.0);
    assert_eq!(controller.body("web.example.test"), web);

    // The file comes back: the hold ends and the route never went away.
    controller.write_resource("web.yaml", &manifest);
    let safety = wait_safety(&controller, "the hold ends", |s| s["held"] == false);
    assert_eq!(safety["lastRelease"]["reason"], "recovered", "{safety}");
    assert_eq!(controller.body("web.example.test"), web);
    assert_eq!(scheduler_health(&controller).0, "healthy");
    assert_eq!(controller.metric("hapwright_safety_valve_held"), 0.0);

    // Emptied again, and this time the operator approves: the routes go.
    std::fs::remove_file(controller.resource_path("web.yaml")).expect("remove web.yaml");
    wait_safety(
        &controller,
        "the valve holds the whole removal again",
        |s| s["held"] == true && s["hold"]["summary"] == full,
    );
    assert_eq!(controller.body("web.example.test"), web);
    let (status, body) = controller.status_post("/-/approve");
    assert_eq!(status, 202, "{body}");
    wait_for_status(&controller, "web.example.test", 404);
    let safety = wait_safety(&controller, "the approval is recorded", |s| {
        s["lastRelease"]["reason"] == "approved"
    });
    assert_eq!(safety["held"], false, "{safety}");
    assert_eq!(
        controller.metric(r#"hapwright_safety_valve_releases_total{reason="approved"}"#),
        1.0
    );
    // Nothing more to approve.
    let (status, body) = controller.status_post("/-/approve");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("nothing-held"), "{body}");
}
