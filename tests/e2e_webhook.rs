//! The admission webhook served by `hapwright run`: an object that would break the
//! quickstart's HAProxy config is refused with the template line, a good one is
//! admitted, and both are counted.

use std::path::Path;
use std::time::Duration;

#[path = "support/certs.rs"]
mod certs;

use hapwright_e2e::{Controller, free_port};
use serde_json::{Value, json};

/// A test CA and a server certificate for 127.0.0.1 it signed, in `dir`
/// (`tls.crt`, `tls.key`); returns the CA certificate (PEM).
fn certificate(dir: &Path) -> Vec<u8> {
    certs::leaf(dir, "ca", "tls");
    certs::ca(dir, "ca")
}

fn review(uid: &str, object: Value) -> Value {
    let kind = object["kind"].as_str().unwrap().to_owned();
    let api_version = object["apiVersion"].as_str().unwrap().to_owned();
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": { "group": group, "version": version, "kind": kind },
            "resource": { "group": group, "version": version, "resource": "things" },
            "name": object["metadata"]["name"],
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": { "username": "e2e" },
            "object": object,
            "dryRun": true,
        }
    })
}

fn slice(name: &str, service: &str, address: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": { "kubernetes.io/service-name": service },
        },
        "addressType": "IPv4",
        "ports": [{ "port": 9101 }],
        "endpoints": [{ "addresses": [address], "conditions": { "ready": true } }],
    })
}

#[test]
fn hapwright_run_refuses_a_breaking_object_and_admits_a_good_one() {
    let certs = tempfile::tempdir().unwrap();
    let ca = certificate(certs.path());
    let port = free_port();
    let controller = Controller::start_with(|config| {
        config.replace(
            "controller:\n",
            &format!(
                "controller:\n  webhook:\n    listen: 127.0.0.1:{port}\n    certFile: {}\n    keyFile: {}\n    resources: [services, endpoints]\n",
                certs.path().join("tls.crt").display(),
                certs.path().join("tls.key").display()
            ),
        )
    });
    controller.wait_deployed();
    let client = reqwest::blocking::Client::builder()
        .no_proxy()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let post = |body: &Value| -> Value {
        let response = client
            .post(format!("https://127.0.0.1:{port}/validate"))
            .json(body)
            .send()
            .unwrap_or_else(|e| controller.fail(&format!("webhook request: {e}")));
        assert_eq!(response.status().as_u16(), 200);
        response.json().unwrap()
    };

    let good = post(&review("good", slice("web-def34", "web", "127.0.0.2")));
    assert_eq!(good["response"]["allowed"], true, "{good}");
    assert_eq!(good["response"]["uid"], "good");

    let bad = post(&review("bad", slice("web-xyz99", "web", "300.1.2.3")));
    assert_eq!(bad["response"]["allowed"], false, "{bad}");
    let message = bad["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("EndpointSlice default/web-xyz99"),
        "{message}"
    );
    assert!(message.contains("300.1.2.3"), "{message}");
    assert!(
        message.contains("(from backend:"),
        "the template line: {message}"
    );

    assert_eq!(
        controller
            .metric(r#"hapwright_webhook_requests_total{decision="allowed",resource="endpoints"}"#),
        1.0
    );
    assert_eq!(
        controller
            .metric(r#"hapwright_webhook_requests_total{decision="denied",resource="endpoints"}"#),
        1.0
    );
    assert_eq!(
        controller.metric("hapwright_webhook_duration_seconds_count"),
        2.0
    );
}

#[test]
fn a_reload_with_an_unusable_certificate_is_rejected_and_the_webhook_keeps_serving() {
    let certs = tempfile::tempdir().unwrap();
    let ca = certificate(certs.path());
    let port = free_port();
    let controller = Controller::start_with(|config| {
        config.replace(
            "controller:\n",
            &format!(
                "controller:\n  webhook:\n    listen: 127.0.0.1:{port}\n    certFile: {}\n    keyFile: {}\n    resources: [services]\n",
                certs.path().join("tls.crt").display(),
                certs.path().join("tls.key").display()
            ),
        )
    });
    let client = reqwest::blocking::Client::builder()
        .no_proxy()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let allowed = || -> bool {
        let response = client
            .post(format!("https://127.0.0.1:{port}/validate"))
            .json(&review(
                "svc",
                json!({
                    "apiVersion": "v1", "kind": "Service",
                    "metadata": { "name": "other", "namespace": "default" },
                    "spec": { "ports": [{ "port": 80 }] },
                }),
            ))
            .send()
            .unwrap_or_else(|e| controller.fail(&format!("webhook request: {e}")));
        let body: Value = response.json().unwrap();
        body["response"]["allowed"].as_bool().unwrap()
    };
    assert!(allowed());

    // The key file of the new config does not exist.
    let config = controller.read_config();
    controller.write_config(&config.replace("tls.key", "missing.key"));
    let (status, body) = controller.status_post("/-/reload");
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("controller.webhook") && body.contains("missing.key"),
        "the error names the key and the file: {body}"
    );
    assert!(allowed(), "the running webhook listener keeps serving");
}
