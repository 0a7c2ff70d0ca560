//! Quarantine end to end: one bad object among many good changes does not block
//! them; it keeps its last good state until it is fixed.

use hapwright_e2e::{Controller, WAIT, service_manifest};

const SERVICES: usize = 51;
const BAD: usize = 50;

fn host(i: usize) -> String {
    format!("svc-{i:02}.example.test")
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
    let controller = Controller::start();
    controller.wait_deployed();
    let ports = controller.ports();
    let (v1, api) = (
        controller.demo_body(ports.web_v1),
        controller.demo_body(ports.api),
    );

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
fn a_bad_new_object_is_left_out_and_the_rest_deploys() {
    let controller = Controller::start();
    controller.wait_deployed();
    let ports = controller.ports();
    controller.write_resource("many.yaml", &manifests(|_| ports.api, Some(7)));
    let api = controller.demo_body(ports.api);
    controller.wait_for_body(&host(0), &api);
    controller.wait_for_body(&host(SERVICES - 1), &api);
    let reply = controller.route(&host(7)).expect("HAProxy answers");
    assert_eq!(
        reply.status, 404,
        "the bad new object is left out: {reply:?}"
    );
}
