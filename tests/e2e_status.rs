//! Status templates end to end: the real binary renders each object's status after
//! the render that routes it is deployed to a real HAProxy, shows it on
//! `/debug/status`, and never writes statuses of `files` objects anywhere; with two
//! instances, one that cannot take the config is named in the status until it
//! does.

use std::time::Duration;

use hapwright_e2e::{Controller, WAIT, free_port, replace_once, with_second_instance};
use serde_json::Value;

/// Each Service's status: the ports of its EndpointSlices, and a Routed condition.
const STATUS_TEMPLATES: &str = r#"
statusTemplates:
  services:
    template: |
      {% set slices = resources.endpoints.fetch(object.metadata.namespace, object.metadata.name) %}
      routedTo: "{% for s in slices %}{% for p in s.ports %}{{ p.port }}{% endfor %}{% endfor %}"
      conditions:
      - type: Routed
        status: "True"
        reason: Deployed
"#;

/// `routedTo` of the `web` Service on `/debug/status`, with the render's hash.
fn web_status(controller: &Controller) -> Option<(String, String)> {
    let body: Value = controller.json("/debug/status");
    let hash = body["hash"].as_str()?.to_owned();
    let web = body["statuses"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == "web" && s["resource"] == "services")?;
    assert_eq!(web["current"], false, "a files object never shows a status");
    assert_eq!(web["status"]["conditions"][0]["type"], "Routed", "{body}");
    assert!(
        web["status"]["conditions"][0]["lastTransitionTime"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{body}"
    );
    Some((web["status"]["routedTo"].as_str()?.to_owned(), hash))
}

#[test]
fn statuses_follow_deployments_and_files_objects_are_only_shown() {
    let controller = Controller::start_with(|config| format!("{config}{STATUS_TEMPLATES}"));
    let ports = controller.ports();
    let (routed, first_hash) = controller.wait_until("web's status", WAIT, || {
        web_status(&controller).filter(|(r, _)| *r == ports.web_v1.to_string())
    });
    assert_eq!(routed, ports.web_v1.to_string());
    assert_eq!(
        Some(first_hash.clone()),
        controller.rendered_hash(),
        "statuses come from the deployed render"
    );

    // Move web to the other demo app: its status follows the new deployment.
    let manifest = controller.read_resource("web.yaml");
    controller.write_resource(
        "web.yaml",
        &replace_once(
            &manifest,
            &format!("port: {}", ports.web_v1),
            &format!("port: {}", ports.web_v2),
        ),
    );
    controller.wait_until("web's status after the move", WAIT, || {
        web_status(&controller)
            .filter(|(r, hash)| *r == ports.web_v2.to_string() && *hash != first_hash)
    });

    // Only files sources: the renderer runs, no writer exists.
    let components = controller.json("/debug/components");
    let names: Vec<&str> = components
        .as_array()
        .expect("components")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert!(names.contains(&"status-renderer"), "{names:?}");
    assert!(!names.contains(&"kubernetes-status"), "{names:?}");
}

/// Each Service's status: hapwright's Programmed condition, from `deployment`.
const PROGRAMMED_TEMPLATES: &str = r#"
statusTemplates:
  services:
    template: |
      conditions:
      - type: Programmed
        status: "{{ 'True' if deployment.programmed else 'False' }}"
        reason: "{{ 'Programmed' if deployment.programmed else 'Pending' }}"
        message: {{ deployment.message | tojson }}
"#;

/// The `web` Service's Programmed condition on `/debug/status`.
fn web_condition(controller: &Controller) -> Option<Value> {
    let body: Value = controller.json("/debug/status");
    body["statuses"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == "web" && s["resource"] == "services")
        .map(|web| web["status"]["conditions"][0].clone())
}

#[test]
fn a_service_is_programmed_only_once_a_second_instance_that_cannot_start_serves_it() {
    // A second managed HAProxy whose port is taken: it cannot start, so it takes no
    // config until the port is free. Its demo app frontends bind another loopback
    // address than the first instance's.
    let port = free_port();
    let taken = std::net::TcpListener::bind(("127.0.0.1", port)).expect("hold the port");
    let controller = Controller::start_with(|config| {
        format!(
            "{}{PROGRAMMED_TEMPLATES}",
            with_second_instance(config, port)
        )
    });

    let pending = controller.wait_until("web pending on edge-2", WAIT, || {
        web_condition(&controller).filter(|c| c["reason"] == "Pending")
    });
    assert_eq!(pending["status"], "False", "{pending}");
    let message = pending["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("not yet served by instance edge-2 (")
            && message.ends_with("; 1 of 2 instances serve it"),
        "{message}"
    );

    // The port frees up; the supervisor's next start comes up and takes the config.
    drop(taken);
    let programmed = controller.wait_until("web programmed", Duration::from_secs(90), || {
        web_condition(&controller).filter(|c| c["status"] == "True")
    });
    assert_eq!(programmed["reason"], "Programmed");
    assert_eq!(programmed["message"], "served by all 2 instances");
}
