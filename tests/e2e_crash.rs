//! Crash safety with the real binary and a real managed HAProxy: the controller is
//! SIGKILLed at each step of a reloading deployment (fault injection pauses it there,
//! `HAPWRIGHT_FAULTS`), then started again. The instance converges to the desired
//! config with at most one reload, the files on disk match the state record and the
//! running worker, nothing is left in the config or temporary directories, and there
//! is exactly one HAProxy master.
//!
//! Also: a write that fails (a full disk, injected) keeps the last good files and
//! shows the error on `/debug/instances`, the status page and in a metric.

use std::path::Path;
use std::time::Duration;

use hapwright_deployer::haproxy::files::{ConfigDir, RecordCheck};
use hapwright_e2e::{Controller, WAIT, master_command, poll, quick_pacing, service_manifest};

const SHOP: &str = "shop.example.test";

/// Faster pacing than the quickstart's, so a repair is not held by the windows.
fn quick(config: &str) -> String {
    quick_pacing(config, "100ms")
}

fn faults(dir: &Path, spec: &str) -> String {
    format!("arm={},{spec}", dir.join("arm").display())
}

/// Every temporary file hapwright's writer could leave in the config directory.
fn leftovers(config_dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for dir in ["", "maps", "files", "certs"] {
        let Ok(entries) = std::fs::read_dir(config_dir.join(dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.contains("hapwright-tmp") {
                found.push(format!("{dir}/{name}"));
            }
        }
    }
    found
}

fn crash_at(step: &str) {
    let marks = tempfile::tempdir().unwrap();
    let spec = faults(
        marks.path(),
        &format!("pause={step}:{}", marks.path().join("paused").display()),
    );
    let mut controller = Controller::start_with_env(quick, &[("HAPWRIGHT_FAULTS", spec.as_str())]);
    controller.wait_deployed();
    let port = controller.ports().web_v2;

    // Arm the pause, then make a change that needs a reload (a new backend).
    std::fs::write(marks.path().join("arm"), "").unwrap();
    controller.write_resource("shop.yaml", &service_manifest("shop", SHOP, port));
    let paused = poll(WAIT, || marks.path().join("paused").exists().then_some(()));
    if paused.is_err() {
        controller.fail(&format!("the deployment never reached {step}"));
    }
    controller.kill();
    std::fs::remove_file(marks.path().join("arm")).unwrap();

    // A new controller, no faults: it converges.
    controller.relaunch(&[]);
    controller.wait_for_body(SHOP, &controller.demo_body(port));
    let instance = controller.wait_deployed();
    let reloads = controller.metric(
        "hapwright_reloads_total{instance=\"local\",reason=\"first_deploy\",result=\"success\"}",
    ) + controller.metric(
        "hapwright_reloads_total{instance=\"local\",reason=\"restart\",result=\"success\"}",
    ) + controller.metric(
        "hapwright_reloads_total{instance=\"local\",reason=\"new_file\",result=\"success\"}",
    ) + controller.metric(
        "hapwright_reloads_total{instance=\"local\",reason=\"structure\",result=\"success\"}",
    );
    assert!(
        reloads <= 1.0,
        "at most one reload after the restart, saw {reloads} ({instance:?})"
    );

    // The files are the record's, and the record is what the worker runs.
    let config_dir = controller.dir().join("run/haproxy");
    let RecordCheck::Consistent { marker, .. } =
        ConfigDir::new(&config_dir).check_record().unwrap()
    else {
        controller.fail("the files do not match the state record");
    };
    let env = master_command(
        &controller.master_socket(),
        "@1 show env HAPWRIGHT_CONFIG_VERSION",
    )
    .unwrap();
    assert!(
        env.contains(&marker),
        "worker runs {env}, record says {marker}"
    );
    assert_eq!(leftovers(&config_dir), Vec::<String>::new());

    // Exactly one master, with its own workers.
    let master = controller.master();
    let mut expected = master.workers.clone();
    expected.push(master.master_pid);
    expected.sort_unstable();
    let settled = poll(Duration::from_secs(10), || {
        (controller.haproxy_pids() == expected).then_some(())
    });
    if settled.is_err() {
        controller.fail(&format!(
            "HAProxy processes {:?}, expected only {expected:?}",
            controller.haproxy_pids()
        ));
    }
}

#[test]
fn sigkill_after_the_side_files_converges() {
    crash_at("after-side-files");
}

#[test]
fn sigkill_before_the_reload_converges() {
    crash_at("before-reload");
}

#[test]
fn sigkill_after_the_reload_converges() {
    crash_at("after-reload");
}

#[test]
fn a_failing_write_keeps_the_last_good_files_and_says_so() {
    let marks = tempfile::tempdir().unwrap();
    let spec = faults(marks.path(), "fail-write=maps/hosts.map");
    let controller = Controller::start_with_env(quick, &[("HAPWRIGHT_FAULTS", spec.as_str())]);
    controller.wait_deployed();
    let config_dir = controller.dir().join("run/haproxy");
    let before = std::fs::read(config_dir.join("maps/hosts.map")).unwrap();
    let cfg_before = std::fs::read(config_dir.join("haproxy.cfg")).unwrap();

    std::fs::write(marks.path().join("arm"), "").unwrap();
    let port = controller.ports().web_v2;
    controller.write_resource("shop.yaml", &service_manifest("shop", SHOP, port));
    let error = controller.wait_until("the failure shows on /debug/instances", WAIT, || {
        controller.instance().last_error.map(|e| e.to_string())
    });
    assert!(error.contains("No space left on device"), "{error}");
    assert_eq!(
        std::fs::read(config_dir.join("maps/hosts.map")).unwrap(),
        before
    );
    assert_eq!(
        std::fs::read(config_dir.join("haproxy.cfg")).unwrap(),
        cfg_before
    );
    assert_eq!(leftovers(&config_dir), Vec::<String>::new());
    assert!(
        controller.metric(
            "hapwright_deployments_total{instance=\"local\",result=\"failure\",strategy=\"reload\"}"
        ) >= 1.0
    );
    assert!(controller.status_page().contains("No space left on device"));

    // The disk has room again: the retry deploys.
    std::fs::remove_file(marks.path().join("arm")).unwrap();
    controller.wait_for_body(SHOP, &controller.demo_body(port));
}
