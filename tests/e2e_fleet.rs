//! The fleet through the real binary: a map changed behind hapwright's back and
//! loaded by a reload outside hapwright is found by the instance's drift check
//! (`driftPreventionInterval`) and repaired with a `drift` reload; a managed instance
//! removed from the config has its HAProxy drained and stopped.

use hapwright_e2e::{
    Controller, WAIT, accepts_connections, free_port, master_command, processes_matching,
    replace_once, second_instance, with_second_instance,
};

#[test]
fn an_out_of_band_change_and_reload_is_repaired_within_one_interval() {
    let controller = Controller::start_with(|config| {
        replace_once(
            config,
            "minReloadInterval: 2s",
            "minReloadInterval: 500ms\n  driftPreventionInterval: 1s",
        )
    });
    let deployed = controller.wait_deployed();
    let map = controller.dir().join("run/haproxy/maps/hosts.map");
    let good = std::fs::read_to_string(&map).expect("the rendered map");
    assert!(good.contains("web.example.test"), "{good}");

    // Someone routes web.example.test elsewhere by hand and reloads HAProxy.
    let changed = good.replace("web.example.test", "hand-edited.example.test");
    std::fs::write(&map, &changed).expect("edit the map");
    master_command(&controller.master_socket(), "reload").expect("reload by hand");

    controller.wait_until("the drift is detected and repaired", WAIT, || {
        let drift = controller.metric("hapwright_drift_detected_total{instance=\"local\"}");
        let now = std::fs::read_to_string(&map).ok()?;
        let instance = controller.instance();
        (drift >= 1.0
            && now == good
            && instance.reload_reason.as_deref() == Some("drift")
            && instance.reloads > deployed.reloads)
            .then_some(())
    });
    let log = controller.log_text();
    assert!(log.contains("Drift detected"), "{log}");
}

#[test]
fn a_managed_instance_removed_from_the_config_has_its_haproxy_stopped() {
    // A second managed HAProxy beside the quickstart's.
    let port = free_port();
    let second = second_instance(port);
    let controller = Controller::start_with(|config| with_second_instance(config, port));
    let needle = "run/edge-2/haproxy.cfg";
    controller.wait_until("edge-2 serves", WAIT, || {
        (accepts_connections(port) && !processes_matching("haproxy", needle).is_empty())
            .then_some(())
    });
    // The first instance runs the render too (readiness needs one instance only).
    controller.wait_deployed();
    let first = controller.master();

    // The config without edge-2: its HAProxy is drained and stopped, the first
    // instance keeps running (no restart, no reload) and serving.
    let config = controller.read_config();
    assert!(config.contains(&second), "the test config has edge-2");
    controller.write_config(&config.replacen(&second, "", 1));
    controller.wait_until("edge-2's HAProxy is stopped", WAIT, || {
        (processes_matching("haproxy", needle).is_empty() && !accepts_connections(port))
            .then_some(())
    });
    assert!(
        controller
            .log_text()
            .contains("Managed instance removed from the config"),
        "the log says why: {}",
        controller.log_tail(30)
    );
    let after = controller.master();
    assert_eq!(
        after.reloads, first.reloads,
        "the first instance did not reload"
    );
    assert!(
        accepts_connections(controller.ports().http),
        "the first instance serves"
    );
}
