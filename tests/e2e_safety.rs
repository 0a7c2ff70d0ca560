//! The safety valve end to end, with the real binary, a real managed HAProxy and the
//! files source: emptying the resource directory does not take the routes down.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hapwright_e2e::{Controller, Value, WAIT, quick_pacing, service_manifest};

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

    // The directory's last file goes. Measured against the most served within
    // confirmAfter (api included), that removes every route: held whole, so api
    // is back too while the removal is held.
    let manifest = controller.read_resource("web.yaml");
    std::fs::remove_file(controller.resource_path("web.yaml")).expect("remove web.yaml");
    // The file's EndpointSlice and Service leave through two watched resources and
    // may reach two renders; the later one replaces the held one.
    let full = |s: &Value| {
        s["held"] == true
            && s["hold"]["removal"]["backends"] == serde_json::json!({"removed": 2, "total": 3})
            && s["hold"]["removal"]["mapEntries"] == serde_json::json!({"removed": 2, "total": 2})
    };
    let safety = wait_safety(&controller, "the valve holds the whole removal", full);
    let removed = &safety["hold"]["removal"]["removedBackends"];
    assert!(
        removed
            .as_array()
            .is_some_and(|names| names.contains(&"be_default_web".into())
                && names.contains(&"be_default_api".into())),
        "{safety}"
    );
    wait_for_status(&controller, "api.example.test", 200);
    // The running config keeps serving, and everything says why.
    assert_eq!(controller.body("web.example.test"), web);
    let (health, reason) = scheduler_health(&controller);
    assert_eq!(health, "degraded", "{reason}");
    assert!(
        reason.contains("would remove 2 of 3 backends (67%)") && reason.contains("POST /-/approve"),
        "{reason}"
    );
    let page = controller.status_page();
    assert!(page.contains("Safety valve: a change is held"), "{page}");
    assert!(page.contains("<code>be_default_web</code>"), "{page}");
    assert!(page.contains("X-Hapwright-Approve: 1"), "{page}");
    assert_eq!(controller.metric("hapwright_safety_valve_held"), 1.0);
    assert_eq!(controller.body("web.example.test"), web);

    // The file comes back: the hold ends and the route never went away; api, whose
    // removal was small on its own, goes now.
    controller.write_resource("web.yaml", &manifest);
    let safety = wait_safety(&controller, "the hold ends", |s| s["held"] == false);
    assert_eq!(safety["lastRelease"]["reason"], "recovered", "{safety}");
    assert_eq!(controller.body("web.example.test"), web);
    wait_for_status(&controller, "api.example.test", 404);
    assert_eq!(scheduler_health(&controller).0, "healthy");
    assert_eq!(controller.metric("hapwright_safety_valve_held"), 0.0);

    // Emptied again, and this time the operator approves: the routes go.
    std::fs::remove_file(controller.resource_path("web.yaml")).expect("remove web.yaml");
    wait_safety(&controller, "the valve holds the whole removal again", full);
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

/// Ten routes, `svc0.example.test` to `svc9.example.test`, from ten resource files,
/// all served by the web v1 demo app; waits until each answers.
fn ten_routes(controller: &Controller) -> String {
    let port = controller.ports().web_v1;
    for i in 0..10 {
        controller.write_resource(
            &format!("svc{i}.yaml"),
            &service_manifest(&format!("svc{i}"), &format!("svc{i}.example.test"), port),
        );
    }
    let body = controller.demo_body(port);
    for i in 0..10 {
        controller.wait_for_body(&format!("svc{i}.example.test"), &body);
    }
    controller.wait_deployed();
    body
}

/// Deletes the ten files one after another, 5 ms apart (a script removing them one
/// by one): each deletion reaches hapwright on its own, so the first is a render that
/// removes one route of ten, well within `maxRemoval`.
fn delete_ten_routes(controller: &Controller) {
    for i in 0..10 {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::remove_file(controller.resource_path(&format!("svc{i}.yaml")))
            .expect("remove a route's file");
    }
}

/// The hosts of `ten_routes` that do not answer `body`.
fn routes_down(controller: &Controller, body: &str) -> Vec<String> {
    (0..10)
        .map(|i| format!("svc{i}.example.test"))
        .filter(|host| !matches!(controller.route(host), Ok(reply) if reply.status == 200 && reply.body == body))
        .collect()
}

/// Asks each host of `ten_routes` in turn until `watching` turns false; returns
/// every answer other than 200 with `body` ("svc3.example.test: 404", at most 20).
fn watch_routes(controller: &Controller, body: &str, watching: &AtomicBool) -> Vec<String> {
    let mut misses = Vec::new();
    let (mut asked, mut missed) = (0_u64, 0_u64);
    while watching.load(Ordering::Relaxed) {
        for i in 0..10 {
            let host = format!("svc{i}.example.test");
            asked += 1;
            let miss = match controller.route(&host) {
                Ok(reply) if reply.status == 200 && reply.body == body => continue,
                Ok(reply) => format!("{host}: {}", reply.status),
                Err(error) => format!("{host}: {error}"),
            };
            missed += 1;
            if misses.len() < 20 {
                misses.push(miss);
            }
        }
    }
    eprintln!("watched the ten routes: {asked} requests, {missed} misses");
    misses
}

/// Waits until every host of `ten_routes` answers `body` (the kept config runs).
fn wait_all_up(controller: &Controller, body: &str) {
    controller.wait_until("all ten routes answer", WAIT, || {
        routes_down(controller, body).is_empty().then_some(())
    });
}

/// The valve holds the removal of the ten routes (and no more).
fn holds_ten(safety: &Value) -> bool {
    safety["held"] == true && safety["hold"]["removal"]["backends"]["removed"] == 10
}

/// Ten route files deleted milliseconds apart: no route may answer anything but its page
/// at any moment, since the first deletions are not deployed before the rest arrive (the
/// debouncer gives a removal no leading edge) and the whole removal is held.
#[test]
fn ten_routes_deleted_as_a_stream_are_held_whole_and_a_new_host_still_goes_live() {
    let controller = Controller::start_with(|config| quick_pacing(config, "100ms"));
    controller.wait_deployed();
    let body = ten_routes(&controller);

    // Every route is asked in turn, over and over, from before the first deletion
    // until the valve holds all ten: not one answer may miss (a first deletion
    // deployed alone would answer 404 until the hold puts it back).
    let watching = AtomicBool::new(true);
    let (safety, misses) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| watch_routes(&controller, &body, &watching));
        delete_ten_routes(&controller);
        let safety = wait_safety(&controller, "the valve holds all ten", holds_ten);
        wait_all_up(&controller, &body);
        watching.store(false, Ordering::Relaxed);
        (safety, watcher.join().expect("route watcher"))
    });
    assert_eq!(
        safety["hold"]["removal"]["backends"]["removed"], 10,
        "{safety}"
    );
    // What ran all along is the full config, then the render with the ten routes
    // kept: 0 routes down, and they stay up.
    assert_eq!(
        misses,
        Vec::<String>::new(),
        "routes down during the stream"
    );
    assert_eq!(routes_down(&controller, &body), Vec::<String>::new());
    assert_eq!(controller.metric("hapwright_safety_valve_held"), 1.0);
    let page = controller.status_page();
    assert!(page.contains("Safety valve: a change is held"), "{page}");

    // Another tenant adds a host while the removal is held: it goes live, and the
    // held routes keep serving.
    let v2 = controller.demo_body(controller.ports().web_v2);
    controller.write_resource(
        "new.yaml",
        &service_manifest("new", "new.example.test", controller.ports().web_v2),
    );
    controller.wait_for_body("new.example.test", &v2);
    assert_eq!(routes_down(&controller, &body), Vec::<String>::new());
    let safety = controller.json("/debug/safety");
    assert!(holds_ten(&safety), "still held: {safety}");

    // Approved: the ten routes go, the new host stays.
    let (status, reply) = controller.status_post("/-/approve");
    assert_eq!(status, 202, "{reply}");
    wait_for_status(&controller, "svc0.example.test", 404);
    assert_eq!(routes_down(&controller, &body).len(), 10);
    assert_eq!(controller.body("new.example.test"), v2);
}

#[test]
fn a_held_removal_stays_held_across_a_restart_and_a_kill() {
    let mut controller = Controller::start_with(|config| quick_pacing(config, "100ms"));
    controller.wait_deployed();
    let body = ten_routes(&controller);
    delete_ten_routes(&controller);
    let held = wait_safety(&controller, "the valve holds all ten", holds_ten);
    wait_all_up(&controller, &body);
    let record = controller.dir().join("run/haproxy/.hapwright-valve.json");
    assert!(
        record.exists(),
        "the hold is recorded beside the deployed files"
    );

    // SIGKILL: the controller dies (and its managed HAProxy with it). The new
    // process measures its first render against the record: the removal is held
    // again, with its first start, and the first deployment serves the ten routes.
    controller.kill();
    controller.relaunch(&[]);
    let again = wait_safety(&controller, "held after the kill", holds_ten);
    assert_eq!(again["hold"]["since"], held["hold"]["since"], "{again}");
    assert_eq!(again["hold"]["releaseAt"], held["hold"]["releaseAt"]);
    wait_all_up(&controller, &body);
    assert_eq!(routes_down(&controller, &body), Vec::<String>::new());

    // A clean restart: the same.
    controller.terminate(WAIT);
    controller.relaunch(&[]);
    let again = wait_safety(&controller, "held after the restart", holds_ten);
    assert_eq!(again["hold"]["since"], held["hold"]["since"], "{again}");
    wait_all_up(&controller, &body);
    assert_eq!(routes_down(&controller, &body), Vec::<String>::new());

    // Undone: the files come back, the hold ends and so does its record.
    ten_routes(&controller);
    let safety = wait_safety(&controller, "the hold ends", |s| s["held"] == false);
    assert_eq!(safety["lastRelease"]["reason"], "recovered", "{safety}");
    assert!(!record.exists(), "the record goes with the hold");
    assert_eq!(routes_down(&controller, &body), Vec::<String>::new());
}
