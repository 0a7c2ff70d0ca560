//! Drift prevention through the real binary: a map changed behind hapwright's back and
//! loaded by a reload outside hapwright is found by the instance's drift check
//! (`driftPreventionInterval`) and repaired with a `drift` reload.

use hapwright_e2e::{Controller, WAIT, master_command, replace_once};

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
