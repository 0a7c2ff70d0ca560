//! Quarantine end to end: one bad object among many good changes does not block
//! them; it keeps its last good state until it is fixed.

use hapwright_e2e::{Controller, Ports, WAIT, service_manifest};

const SERVICES: usize = 51;
const BAD: usize = 50;

fn host(i: usize) -> String {
    format!("svc-{i:02}.example.test")
}

/// A controller that deployed its first config, its ports and the bodies of its
/// demo backends `web v1` and `api`.
fn deployed() -> (Controller, Ports, String, String) {
    let controller = Controller::start();
    controller.wait_deployed();
    let ports = controller.ports();
    let v1 = controller.demo_body(ports.web_v1);
    let api = controller.demo_body(ports.api);
    (controller, ports, v1, api)
}

/// `SERVICES` services in one file, each routed to `port(i)`; `bad` gets an
/// address HAProxy cannot use.
fn manifests(port: impl Fn(usize) -> u16, bad: Option<usize>) -> String {
    (0..SERVICES)
        .map(|i| {
            let manifest = service_manifest(&format!("svc-{i:02}"), &host(i), port(i));
            if Some(i) == bad {
                manifest.replace("\"127.0.0.1\"", "\"300.1.2.3\"")
            } else {
                manifest
            }
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

#[test]
fn fifty_good_changes_go_live_and_the_bad_object_keeps_its_last_good_state() {
    let (controller, ports, v1, api) = deployed();

    controller.write_resource("many.yaml", &manifests(|_| ports.web_v1, None));
    controller.wait_for_body(&host(0), &v1);
    controller.wait_for_body(&host(BAD), &v1);

    // One write: 50 services move to the api app, and the 51st gets a bad address.
    controller.write_resource("many.yaml", &manifests(|_| ports.api, Some(BAD)));
    for i in 0..SERVICES {
        if i != BAD {
            controller.wait_for_body(&host(i), &api);
        }
    }
    assert_eq!(
        controller.body(&host(BAD)),
        v1,
        "the bad object keeps its last good state"
    );
    controller.wait_until("the quarantine is logged", WAIT, || {
        let log = controller.log_text();
        log.lines()
            .any(|l| l.contains("Object quarantined") && l.contains("svc-50"))
            .then_some(())
    });
    let (_, events) = controller.status_get("/debug/events?limit=1000");
    assert!(events.contains("QuarantineSearched"), "{events}");
    assert!(events.contains("300.1.2.3"), "HAProxy's message: {events}");
    // The error quotes the bad address, so the first guess is right: the other 50
    // together, then svc-50 alone.
    let mut searches = Vec::new();
    search_probes(&controller.json("/debug/events?limit=1000"), &mut searches);
    assert!(
        searches
            .iter()
            .any(|(probes, gave_up)| gave_up.is_empty() && *probes == 2),
        "{searches:?}"
    );

    // Fixing it releases it.
    controller.write_resource("many.yaml", &manifests(|_| ports.api, None));
    controller.wait_for_body(&host(BAD), &api);
    controller.wait_until("the release is logged", WAIT, || {
        let log = controller.log_text();
        log.lines()
            .any(|l| l.contains("Object released from quarantine") && l.contains("svc-50"))
            .then_some(())
    });
}

#[test]
fn one_good_change_beside_one_bad_object_goes_live() {
    let (controller, ports, v1, api) = deployed();
    let pair = |good_port: u16, bad: bool| {
        let good = service_manifest("pair-good", "pair-good.example.test", good_port);
        let other = service_manifest("pair-bad", "pair-bad.example.test", ports.web_v1);
        let other = if bad {
            other.replace("\"127.0.0.1\"", "\"300.1.2.3\"")
        } else {
            other
        };
        format!("{good}---\n{other}")
    };
    controller.write_resource("pair.yaml", &pair(ports.web_v1, false));
    controller.wait_for_body("pair-good.example.test", &v1);
    controller.wait_for_body("pair-bad.example.test", &v1);

    // One write, two changes: one good (a new port), one bad (an address HAProxy
    // refuses).
    controller.write_resource("pair.yaml", &pair(ports.api, true));
    controller.wait_for_body("pair-good.example.test", &api);
    assert_eq!(
        controller.body("pair-bad.example.test"),
        v1,
        "the bad object keeps its last good state"
    );
    let quarantine = controller.wait_until("pair-bad is quarantined", WAIT, || {
        let quarantine = controller.json("/debug/quarantine");
        (quarantine["count"] == 1).then_some(quarantine)
    });
    let object = &quarantine["objects"][0];
    assert_eq!(object["name"], "pair-bad-1", "{quarantine}");
    assert!(quarantine.to_string().contains("300.1.2.3"), "{quarantine}");
    let mut searches = Vec::new();
    search_probes(&controller.json("/debug/events?limit=1000"), &mut searches);
    assert!(
        searches.iter().all(|(_, gave_up)| gave_up.is_empty()),
        "the search never gives up: {searches:?}"
    );
}

#[test]
fn a_bad_new_object_is_left_out_and_the_rest_deploys() {
    let controller = Controller::start();
    controller.wait_deployed();
    let ports = controller.ports();
    controller.write_resource("many.yaml", &manifests(|_| ports.api, Some(7)));
    let api = controller.demo_body(ports.api);
    controller.wait_for_body(&host(0), &api);
    controller.wait_for_body(&host(SERVICES - 1), &api);
    // svc-07's Service and its EndpointSlice are new together and bad only together
    // (the slice's address is bad; without the Service it renders nothing). Which
    // of them the search holds back depends on whether the leading edge deployed the
    // Services before the slices arrived: either way the route never reaches the bad
    // address (no route: 404, or a backend without servers: 503).
    let reply = controller.route(&host(7)).expect("HAProxy answers");
    assert!(
        reply.status == 503 || reply.status == 404,
        "the bad new object is left out: {reply:?}"
    );
    controller.wait_until("svc-07 is quarantined", WAIT, || {
        let (_, body) = controller.status_get("/debug/quarantine");
        body.contains("\"name\":\"svc-07").then_some(())
    });
}

/// Every `probes` field of the `QuarantineSearched` events on `/debug/events`.
fn search_probes(value: &serde_json::Value, out: &mut Vec<(u64, String)>) {
    match value {
        serde_json::Value::Object(map) => {
            if let Some(probes) = map.get("probes").and_then(serde_json::Value::as_u64) {
                let gave_up = map
                    .get("gave_up")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                out.push((probes, gave_up));
            }
            map.values().for_each(|v| search_probes(v, out));
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| search_probes(v, out)),
        _ => {}
    }
}

#[test]
fn a_template_broken_for_every_object_is_rejected_as_before_within_the_bound() {
    let controller = Controller::start();
    controller.wait_deployed();
    let web = controller.body("web.example.test");
    let before = controller.instance();
    let failed = r#"hapwright_reconciliations_total{result="failure"}"#;

    // A template error that every service hits (and an empty resource set does not).
    let broken = hapwright_e2e::replace_once(
        &controller.read_config(),
        "      backend be_{{ ns }}_{{ name }}\n",
        "      backend be_{{ ns }}_{{ name }}\n      {{ fail('broken for every service') }}\n",
    );
    controller.write_config(&broken);
    controller.wait_until("the broken render is reported", WAIT, || {
        (controller.metric(failed) >= 1.0).then_some(())
    });
    let events = controller.json("/debug/events?limit=1000");
    let mut searches = Vec::new();
    search_probes(&events, &mut searches);
    assert!(!searches.is_empty(), "the search ran: {events}");
    // The objects are the ones that validated before the config change: nothing
    // changed that could be quarantined, so no extra validation is spent.
    for (probes, gave_up) in &searches {
        assert_eq!(*probes, 0, "{events}");
        assert_eq!(gave_up, "nothing_changed", "{events}");
    }
    assert_eq!(controller.json("/debug/quarantine")["count"], 0);
    assert_eq!(
        controller.body("web.example.test"),
        web,
        "the old config serves"
    );
    assert_eq!(controller.instance().deployments, before.deployments);
}

#[test]
fn a_bad_object_among_a_thousand_at_start_up_does_not_keep_the_rest_out() {
    const COUNT: usize = 1000;
    const BAD_AT_START: usize = 617;
    let resources = tempfile::tempdir().expect("a resources directory");
    let dir = resources.path().to_owned();
    let controller = Controller::start_with(|config| {
        // The api demo app's port, as the harness rewrote it.
        let api: u16 = config
            .split("name: \"api (port ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .and_then(|port| port.parse().ok())
            .expect("the api demo app's port");
        let many = (0..COUNT)
            .map(|i| {
                let manifest = service_manifest(&format!("svc-{i:04}"), &big_host(i), api);
                if i == BAD_AT_START {
                    manifest.replace("\"127.0.0.1\"", "\"300.1.2.3\"")
                } else {
                    manifest
                }
            })
            .collect::<Vec<_>>()
            .join("---\n");
        std::fs::write(dir.join("many.yaml"), many).expect("write the manifests");
        config.replace(
            "files: { path: ./resources }",
            &format!("files: {{ path: {} }}", dir.display()),
        )
    });
    let api = controller.demo_body(controller.ports().api);
    controller.wait_for_body(&big_host(0), &api);
    controller.wait_for_body(&big_host(COUNT - 1), &api);
    let reply = controller
        .route(&big_host(BAD_AT_START))
        .expect("HAProxy answers");
    assert_ne!(reply.status, 200, "the bad object is held back: {reply:?}");
    let quarantine = controller.json("/debug/quarantine");
    assert_eq!(quarantine["count"], 1, "{quarantine}");
    // The bad EndpointSlice only fails together with its Service (a slice alone
    // renders nothing): whichever of the two the search adds last is held back.
    let object = &quarantine["objects"][0];
    assert!(
        object["name"]
            .as_str()
            .unwrap_or("")
            .starts_with("svc-0617"),
        "{quarantine}"
    );
    let resource = object["resource"].as_str().expect("a resource");
    assert_eq!(
        controller.metric(&format!(
            r#"hapwright_quarantined_objects{{resource="{resource}"}}"#
        )),
        1.0
    );
}

fn big_host(i: usize) -> String {
    format!("svc-{i:04}.example.test")
}
