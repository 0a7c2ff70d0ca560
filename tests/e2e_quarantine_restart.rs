//! The quarantine outlives a restart of hapwright, clean or killed: a quarantined
//! object keeps serving its last accepted version until it is fixed, and
//! `/debug/quarantine` still says why. Real binary, real HAProxy, real requests.

use std::path::PathBuf;

use hapwright_e2e::{Controller, WAIT, quick_pacing, service_manifest};
use serde_json::Value;

const GOOD: &str = "pair-good.example.test";
const BAD: &str = "pair-bad.example.test";

/// Two services: `pair-good` routed to `good_port`, `pair-bad` to `bad_port`, with
/// an address HAProxy refuses when `broken`.
fn pair(good_port: u16, bad_port: u16, broken: bool) -> String {
    let good = service_manifest("pair-good", GOOD, good_port);
    let other = service_manifest("pair-bad", BAD, bad_port);
    let other = if broken {
        other.replace("\"127.0.0.1\"", "\"300.1.2.3\"")
    } else {
        other
    };
    format!("{good}---\n{other}")
}

fn record_path(controller: &Controller) -> PathBuf {
    controller
        .dir()
        .join("run/haproxy/.hapwright-quarantine.json")
}

/// The last good objects of a search in progress.
fn baseline_path(controller: &Controller) -> PathBuf {
    controller
        .dir()
        .join("run/haproxy/.hapwright-quarantine-baseline.json")
}

/// Waits until `/debug/quarantine` names `pair-bad-1` (its EndpointSlice, whose
/// address is bad) with HAProxy's message.
fn wait_quarantined(controller: &Controller, what: &str) -> Value {
    controller.wait_until(what, WAIT, || {
        let quarantine = controller.json("/debug/quarantine");
        (quarantine["count"] == 1
            && quarantine["objects"][0]["name"] == "pair-bad-1"
            && quarantine.to_string().contains("300.1.2.3"))
        .then_some(quarantine["objects"][0].clone())
    })
}

/// Serves `pair-good` with the v1 app and `pair-bad` with the v1 app, then breaks
/// `pair-bad` (moved to the api app with a bad address) beside a good change
/// (`pair-good` to the api app). Returns the quarantined object.
fn quarantine_pair_bad(controller: &Controller) -> Value {
    let ports = controller.ports();
    let (v1, api) = (
        controller.demo_body(ports.web_v1),
        controller.demo_body(ports.api),
    );
    controller.write_resource("pair.yaml", &pair(ports.web_v1, ports.web_v1, false));
    controller.wait_for_body(GOOD, &v1);
    controller.wait_for_body(BAD, &v1);
    controller.write_resource("pair.yaml", &pair(ports.api, ports.api, true));
    controller.wait_for_body(GOOD, &api);
    wait_quarantined(controller, "pair-bad is quarantined")
}

#[test]
fn a_quarantined_object_keeps_its_last_accepted_version_across_a_restart_and_a_kill() {
    let mut controller = Controller::start_with(|config| quick_pacing(config, "100ms"));
    controller.wait_deployed();
    let ports = controller.ports();
    let (v1, v2, api) = (
        controller.demo_body(ports.web_v1),
        controller.demo_body(ports.web_v2),
        controller.demo_body(ports.api),
    );
    let quarantined = quarantine_pair_bad(&controller);
    assert_eq!(controller.body(BAD), v1, "the last accepted version serves");
    assert!(
        record_path(&controller).is_file(),
        "the quarantine is recorded beside the deployed files"
    );

    // (a) A clean restart, then (b) a SIGKILL: each time the first deployment of
    // the new process serves pair-bad's last accepted version, the quarantine names
    // it with HAProxy's message and its first start, and a change of another object
    // goes live while pair-bad stays held.
    for (step, good_port) in [("restart", ports.web_v2), ("kill", ports.web_v1)] {
        if step == "kill" {
            controller.kill();
        } else {
            controller.terminate(WAIT);
        }
        controller.relaunch(&[]);
        assert_eq!(
            controller.body(BAD),
            v1,
            "after the {step}: the last accepted version serves from the first deployment"
        );
        let again = wait_quarantined(&controller, &format!("quarantined after the {step}"));
        assert_eq!(again["since"], quarantined["since"], "{again}");
        assert_eq!(again["change"], "modified", "{again}");
        assert_eq!(
            controller.metric(r#"hapwright_quarantined_objects{resource="endpoints"}"#),
            1.0
        );
        let log = controller.log_text();
        assert!(
            log.contains("Object still quarantined after the restart"),
            "the log says why"
        );
        let page = controller.status_page();
        assert!(
            page.contains("pair-bad-1") && page.contains("300.1.2.3"),
            "the status page says why"
        );

        controller.write_resource("pair.yaml", &pair(good_port, ports.api, true));
        let served = if good_port == ports.web_v2 { &v2 } else { &v1 };
        controller.wait_for_body(GOOD, served);
        assert_eq!(controller.body(BAD), v1, "after the {step}: still held");
        wait_quarantined(&controller, "still quarantined");
    }

    // Fixed: pair-bad serves its new version, leaves the quarantine, and its record
    // goes.
    controller.write_resource("pair.yaml", &pair(ports.web_v1, ports.api, false));
    controller.wait_for_body(BAD, &api);
    controller.wait_until("the quarantine is empty", WAIT, || {
        (controller.json("/debug/quarantine")["count"] == 0).then_some(())
    });
    assert!(!record_path(&controller).exists(), "the record goes");

    // After another restart it is not quarantined.
    controller.kill();
    controller.relaunch(&[]);
    assert_eq!(controller.body(BAD), api);
    assert_eq!(controller.json("/debug/quarantine")["count"], 0);
}

#[test]
fn killed_around_the_record_of_a_new_quarantine() {
    // Killed once the record is written, before anything that depends on it went
    // out: the new process restores it, and pair-bad serves its last accepted
    // version.
    let marker = tempfile::tempdir().expect("a marker directory");
    let recorded = marker.path().join("recorded");
    let spec = format!("pause=quarantine-recorded:{}", recorded.display());
    let mut controller = Controller::start_with_env(
        |config| quick_pacing(config, "100ms"),
        &[("HAPWRIGHT_FAULTS", spec.as_str())],
    );
    controller.wait_deployed();
    let ports = controller.ports();
    let (v1, api) = (
        controller.demo_body(ports.web_v1),
        controller.demo_body(ports.api),
    );
    controller.write_resource("pair.yaml", &pair(ports.web_v1, ports.web_v1, false));
    controller.wait_for_body(BAD, &v1);
    controller.write_resource("pair.yaml", &pair(ports.api, ports.api, true));
    controller.wait_until("the record is written", WAIT, || {
        recorded.exists().then_some(())
    });
    assert!(record_path(&controller).is_file());
    assert!(
        baseline_path(&controller).is_file(),
        "the objects the search ran against are kept until its outcome is recorded"
    );
    controller.kill();
    controller.relaunch(&[]);
    assert_eq!(controller.body(BAD), v1, "the last accepted version serves");
    assert_eq!(controller.body(GOOD), api, "the good change goes live");
    wait_quarantined(&controller, "quarantined after the kill");
    controller.wait_until("the baseline goes", WAIT, || {
        (!baseline_path(&controller).exists()).then_some(())
    });

    // Killed after the quarantine was decided, before its record is written (here:
    // none on disk, the object was released). Nothing that depends on the decision
    // went out, and the objects the search ran against are on disk: the new process
    // searches again against them, and pair-bad keeps its last accepted version
    // (now the api app).
    controller.write_resource("pair.yaml", &pair(ports.api, ports.api, false));
    controller.wait_for_body(BAD, &api);
    controller.wait_until("the quarantine is empty", WAIT, || {
        (controller.json("/debug/quarantine")["count"] == 0).then_some(())
    });
    controller.kill();
    let decided = marker.path().join("decided");
    let spec = format!("pause=quarantine-decided:{}", decided.display());
    controller.relaunch(&[("HAPWRIGHT_FAULTS", spec.as_str())]);
    controller.write_resource("pair.yaml", &pair(ports.web_v1, ports.web_v1, true));
    controller.wait_until("the quarantine is decided", WAIT, || {
        decided.exists().then_some(())
    });
    assert!(
        !record_path(&controller).exists(),
        "killed before the record is written"
    );
    assert!(baseline_path(&controller).is_file());
    assert_eq!(controller.body(GOOD), api, "the decision did not go out");
    controller.kill();
    controller.relaunch(&[]);
    assert_eq!(controller.body(GOOD), v1, "the good change goes live");
    assert_eq!(
        controller.body(BAD),
        api,
        "the last accepted version serves after the kill"
    );
    let object = wait_quarantined(&controller, "quarantined again after the kill");
    assert_eq!(object["change"], "modified", "{object}");
    assert!(record_path(&controller).is_file(), "recorded this time");
    controller.wait_until("the baseline goes", WAIT, || {
        (!baseline_path(&controller).exists()).then_some(())
    });
}

#[test]
fn an_unreadable_record_is_logged_and_the_controller_starts_with_an_empty_quarantine() {
    let mut controller = Controller::start_with(|config| quick_pacing(config, "100ms"));
    controller.wait_deployed();
    let web = controller.body("web.example.test");
    controller.terminate(WAIT);
    std::fs::write(record_path(&controller), b"{ not a record").expect("write a broken record");
    controller.relaunch(&[]);
    assert_eq!(controller.body("web.example.test"), web);
    assert_eq!(controller.json("/debug/quarantine")["count"], 0);
    let log = controller.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("Quarantine: the record is unreadable"))
        .unwrap_or_else(|| controller.fail("no error about the unreadable record"));
    assert!(
        line.contains("run/haproxy/.hapwright-quarantine.json"),
        "the error names the file: {line}"
    );
    assert!(
        line.contains("key must be a string"),
        "and the cause: {line}"
    );
}

#[test]
fn a_restart_under_another_config_checks_the_quarantined_object_again() {
    let mut controller = Controller::start_with(|config| quick_pacing(config, "100ms"));
    controller.wait_deployed();
    let ports = controller.ports();
    let (v1, api) = (
        controller.demo_body(ports.web_v1),
        controller.demo_body(ports.api),
    );
    quarantine_pair_bad(&controller);

    // Another config that still refuses the object: checked again, it stays held at
    // its recorded last accepted version.
    let since = controller.json("/debug/quarantine")["objects"][0]["since"].clone();
    controller.terminate(WAIT);
    let config = controller.read_config();
    controller.write_config(&format!("{config}\n# edited while hapwright was stopped\n"));
    controller.relaunch(&[]);
    assert_eq!(controller.body(BAD), v1, "the last accepted version serves");
    let object = wait_quarantined(&controller, "still quarantined");
    assert_eq!(object["change"], "modified", "{object}");
    assert_eq!(object["since"], since, "{object}");
    let log = controller.log_text();
    assert!(
        log.contains("The controller config changed since the quarantine was recorded")
            && log.contains("The current objects still fail"),
        "the log says why the object is checked again"
    );

    // Templates that accept it: after the restart it is not quarantined, its
    // current version serves, and the record goes.
    controller.terminate(WAIT);
    let config = hapwright_e2e::replace_once(
        &controller.read_config(),
        "{{ endpoint.addresses[0] }}",
        "{{ endpoint.addresses[0] | replace('300.1.2.3', '127.0.0.1') }}",
    );
    controller.write_config(&config);
    controller.relaunch(&[]);
    assert_eq!(controller.body(BAD), api, "the current version serves");
    assert_eq!(controller.json("/debug/quarantine")["count"], 0);
    controller.wait_until("the record goes", WAIT, || {
        (!record_path(&controller).exists()).then_some(())
    });
}
