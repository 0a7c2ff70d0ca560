//! Changing things the controller does not own: its templates and its config file.
//! A broken template or config never takes down what serves; fixing it recovers.

use hapwright_e2e::{Controller, Signal, WAIT, replace_once};

const WEB: &str = "web.example.test";
const API: &str = "api.example.test";
const FAIL_LINE: &str = r#"    {{ fail("broken on purpose") }}"#;
const SUCCESSFUL_RELOADS: &str = r#"hapwright_config_reloads_total{result="success"}"#;
const FAILED_RELOADS: &str = r#"hapwright_config_reloads_total{result="failure"}"#;
const FAILED_RECONCILIATIONS: &str = r#"hapwright_reconciliations_total{result="failure"}"#;

/// The health and reason of one component in `/debug/components`.
fn component(controller: &Controller, name: &str) -> (String, String) {
    let all = controller.json("/debug/components");
    let found = all.as_array().and_then(|list| {
        list.iter()
            .find(|c| c["name"].as_str() == Some(name))
            .map(|c| {
                (
                    c["health"].as_str().unwrap_or_default().to_owned(),
                    c["reason"].as_str().unwrap_or_default().to_owned(),
                )
            })
    });
    found.unwrap_or_else(|| controller.fail(&format!("no component {name} in {all}")))
}

/// The text of the status page element with `id`, or `None` when absent.
fn page_section(page: &str, id: &str) -> Option<String> {
    let start = page.find(&format!("id=\"{id}\""))?;
    let end = page[start..]
        .find("</div>")
        .map_or(page.len(), |e| start + e);
    Some(page[start..end].to_owned())
}

#[test]
fn broken_template_keeps_serving_and_fixing_it_recovers() {
    let controller = Controller::start();
    let original = controller.read_config();
    let web_before = controller.body(WEB);
    let before = controller.wait_deployed();

    // A template that compiles but fails when rendered, on a known template line.
    let broken = replace_once(
        &original,
        "    {{ render_glob(\"demo-*\") }}\n",
        &format!("    {{{{ render_glob(\"demo-*\") }}}}\n{FAIL_LINE}\n"),
    );
    let lines: Vec<&str> = broken.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("haproxyConfig:"))
        .expect("haproxyConfig key");
    assert_eq!(lines[header + 1].trim(), "template: |");
    let fail_at = lines
        .iter()
        .position(|l| *l == FAIL_LINE)
        .expect("fail line");
    let location = format!("haproxy.cfg:{}:", fail_at - (header + 1));
    controller.write_config(&broken);

    controller.wait_until("the broken render is reported", WAIT, || {
        (controller.metric(FAILED_RECONCILIATIONS) >= 1.0).then_some(())
    });
    let reason = controller.wait_until("the renderer is unhealthy", WAIT, || {
        let (health, reason) = component(&controller, "renderer");
        (health == "unhealthy").then_some(reason)
    });
    assert!(
        reason.contains(&location) && reason.contains("broken on purpose"),
        "renderer reason names the template line {location}: {reason}"
    );
    let page = controller.status_page();
    let error = page_section(&page, "last-error").unwrap_or_else(|| {
        controller.fail(&format!(
            "no last-error section on the status page:\n{page}"
        ))
    });
    // The page leads with where users edit: the config file's line, then the
    // template's.
    let page_location = format!("hapwright.yaml:{}:", fail_at + 1);
    let template_location = format!("(haproxy.cfg line {})", fail_at - (header + 1));
    assert!(error.contains(&page_location), "{page_location} in {error}");
    assert!(
        error.contains(&template_location),
        "{template_location} in {error}"
    );
    assert!(
        error.contains("| {{ fail(&quot;broken on purpose&quot;) }}"),
        "the page quotes the template line: {error}"
    );
    let events = controller.status_get("/debug/events?limit=200").1;
    assert!(events.contains(&location), "/debug/events has the error");

    // The old config keeps serving and the controller stays ready.
    assert_eq!(controller.status_get("/readyz").0, 200);
    assert_eq!(controller.body(WEB), web_before);
    // A resource change while broken renders (and fails) again: nothing deploys.
    let moved_to = controller.move_web();
    controller.wait_until("the second render fails too", WAIT, || {
        (controller.metric(FAILED_RECONCILIATIONS) >= 2.0).then_some(())
    });
    assert_eq!(controller.body(WEB), web_before, "the old config serves");
    let during = controller.instance();
    assert_eq!(during.deployments, before.deployments, "{during:?}");
    assert_eq!(controller.status_get("/readyz").0, 200);

    // Fixing the template recovers and applies the pending change, without a reload.
    controller.write_config(&original);
    controller.wait_for_body(WEB, &controller.demo_body(moved_to));
    let after = controller.wait_deployed();
    assert_eq!(after.reloads, before.reloads, "{after:?}");
    assert_eq!(after.last_strategy.as_deref(), Some("runtime"), "{after:?}");
    assert_eq!(component(&controller, "renderer").0, "healthy");
    let page = controller.status_page();
    assert!(
        page_section(&page, "last-error").is_none(),
        "the error is gone once a render validates:\n{page}"
    );
    assert_eq!(controller.metric(FAILED_RELOADS), 0.0);
}

#[test]
fn config_edit_with_the_same_output_reinits_without_restart_or_reload() {
    let controller = Controller::start();
    let before = controller.wait_deployed();
    let master = controller.master();
    let reloads_before = controller.metric(SUCCESSFUL_RELOADS);

    controller.write_config(&replace_once(
        &controller.read_config(),
        "debounce: 200ms",
        "debounce: 150ms",
    ));
    let after = controller.wait_until("the new iteration deploys", WAIT, || {
        let instance = controller.instance();
        (controller.metric(SUCCESSFUL_RELOADS) == reloads_before + 1.0
            && instance.deployments > before.deployments)
            .then_some(instance)
    });
    assert_eq!(after.deployments, before.deployments + 1, "{after:?}");
    assert_eq!(after.last_strategy.as_deref(), Some("noop"), "{after:?}");
    assert_eq!(after.reloads, before.reloads, "{after:?}");
    assert_eq!(after.last_hash, before.last_hash, "same output");
    assert_eq!(
        controller.master(),
        master,
        "HAProxy neither restarted nor reloaded"
    );
    let config = controller.json("/debug/config");
    assert_eq!(config["lastReloadSuccessful"], true, "{config}");
    assert_eq!(
        config["effective"]["controller"]["debounce"], "150ms",
        "the new config runs: {config}"
    );
    assert_eq!(
        controller.body(API),
        controller.demo_body(controller.ports().api)
    );
}

#[test]
fn invalid_config_edit_keeps_the_service_running() {
    let controller = Controller::start();
    let original = controller.read_config();
    let before = controller.wait_deployed();
    let master = controller.master();

    controller.write_config(&replace_once(
        &original,
        "debounce: 200ms",
        "debunce: 200ms",
    ));
    controller.wait_until("the invalid config is reported", WAIT, || {
        (controller.metric(FAILED_RELOADS) == 1.0).then_some(())
    });
    let config = controller.json("/debug/config");
    assert_eq!(config["lastReloadSuccessful"], false, "{config}");
    let errors = config["errorsText"].to_string();
    assert!(
        errors.contains("controller.debunce: unknown field, did you mean `debounce`?"),
        "{errors}"
    );
    assert!(
        errors.contains("hapwright.yaml:"),
        "errors name the file: {errors}"
    );
    assert_eq!(
        config["effective"]["controller"]["debounce"], "200ms",
        "the running config stays: {config}"
    );
    let page = controller.status_page();
    let section = page_section(&page, "config-errors")
        .unwrap_or_else(|| controller.fail(&format!("no config-errors section:\n{page}")));
    assert!(section.contains("debunce"), "{section}");
    assert_eq!(component(&controller, "config-watcher").0, "unhealthy");
    assert_eq!(controller.status_get("/readyz").0, 200);
    assert_eq!(
        controller.metric("hapwright_config_last_reload_successful"),
        0.0
    );

    // The running iteration is alive: it still follows resource changes.
    let to = controller.move_web();
    controller.wait_for_body(WEB, &controller.demo_body(to));
    assert_eq!(controller.wait_deployed().reloads, before.reloads);

    // Restoring the file clears the error; same config, so no new iteration.
    controller.write_config(&original);
    controller.wait_until("the error clears", WAIT, || {
        let config = controller.json("/debug/config");
        (config["lastReloadSuccessful"] == true).then_some(())
    });
    assert_eq!(
        controller.json("/debug/config")["errors"],
        serde_json::json!([])
    );
    assert_eq!(component(&controller, "config-watcher").0, "healthy");
    assert_eq!(
        controller.metric("hapwright_config_last_reload_successful"),
        1.0
    );
    assert_eq!(controller.master(), master);
    assert_eq!(controller.body(WEB), controller.demo_body(to));
}

#[test]
fn sighup_and_post_reload_reload_the_config() {
    let controller = Controller::start_with(|config| {
        replace_once(
            config,
            "  logLevel: info\n",
            "  logLevel: info\n  http: { reloadInterval: 2s }\n",
        )
    });
    let before = controller.wait_deployed();
    let master = controller.master();
    let successes = controller.metric(SUCCESSFUL_RELOADS);
    let iterations = || {
        controller
            .log_text()
            .matches("Controller iteration started")
            .count()
    };
    let started = iterations();

    // POST with the file unchanged: answered at once, nothing rebuilt; a burst of
    // further requests inside the window is refused.
    let (status, body) = controller.status_post("/-/reload");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""status":"unchanged""#), "{body}");
    for _ in 0..10 {
        let (status, body) = controller.status_post("/-/reload");
        assert_eq!(status, 429, "{body}");
    }
    assert_eq!(controller.metric(SUCCESSFUL_RELOADS), successes + 1.0);

    // SIGHUP always rebuilds (the way to force a full re-sync). It is handled after
    // the requests above, so exactly one rebuild means they caused none.
    controller.signal(Signal::HUP);
    let after = controller.wait_until("SIGHUP reinits", WAIT, || {
        let instance = controller.instance();
        (controller.metric(SUCCESSFUL_RELOADS) == successes + 2.0
            && instance.deployments > before.deployments)
            .then_some(instance)
    });
    assert_eq!(iterations(), started + 1, "one rebuild: SIGHUP's");
    assert_eq!(after.deployments, before.deployments + 1, "{after:?}");
    assert_eq!(after.last_strategy.as_deref(), Some("noop"), "{after:?}");
    assert_eq!(after.reloads, before.reloads, "{after:?}");
    assert_eq!(controller.master(), master, "HAProxy untouched");
    assert_eq!(
        controller.body(API),
        controller.demo_body(controller.ports().api)
    );
    assert!(
        controller
            .log_text()
            .contains("Reloading the controller config"),
        "the log says why"
    );
    // A reload request that finds an invalid file is a failed attempt, not a crash.
    controller.write_config("controller: [\n");
    controller.wait_until("the watcher rejects it", WAIT, || {
        (controller.metric(FAILED_RELOADS) >= 1.0).then_some(())
    });
    let failures = controller.metric(FAILED_RELOADS);
    let (status, body) = controller.wait_until("the reload window passes", WAIT, || {
        let (status, body) = controller.status_post("/-/reload");
        (status != 429).then_some((status, body))
    });
    assert_eq!(status, 422, "{body}");
    assert!(body.contains(r#""status":"rejected""#), "{body}");
    assert_eq!(controller.metric(FAILED_RELOADS), failures + 1.0);
    assert_eq!(controller.status_get("/readyz").0, 200);
    assert_eq!(
        controller.body(API),
        controller.demo_body(controller.ports().api)
    );
}
