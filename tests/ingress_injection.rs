//! A tenant's Ingress and Service values never become HAProxy configuration with
//! the Ingress library in `examples/kubernetes-ingress/`, end to end with real
//! HAProxy whose environment holds a secret: a backend Service name carrying line
//! breaks and a `listen` section of its own is refused and its Ingress quarantined,
//! a `hapwright.io/balance` annotation with the same payload stays inside its
//! comment line, and the other tenants stay live throughout.

mod library;

use std::net::TcpStream;

use hapwright_e2e::{WAIT, free_port, poll};
use library::{Sidecar, loopback_slice, upstream};
use serde_json::{Value, json};

const SECRET: &str = "s3cr3t-only-haproxy-knows";

fn service(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": name, "namespace": namespace },
        "spec": { "ports": [ { "name": "http", "port": 80, "protocol": "TCP" } ] }
    })
}

fn ingress(namespace: &str, name: &str, host: &str, service: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": { "name": name, "namespace": namespace,
                      "creationTimestamp": "2026-01-01T00:00:00Z" },
        "spec": {
            "ingressClassName": "hapwright",
            "rules": [ { "host": host, "http": { "paths": [ {
                "path": "/", "pathType": "Prefix",
                "backend": { "service": { "name": service, "port": { "name": "http" } } }
            } ] } } ]
        }
    })
}

/// A `listen` section that answers with HAProxy's secret on `port`.
fn section(name: &str, port: u16) -> String {
    format!(
        "\nlisten {name}\n    bind 127.0.0.1:{port}\n    mode http\n    \
         http-request return status 200 lf-string %[env(SECRET)]\n#"
    )
}

#[test]
fn object_values_never_become_config_or_reach_haproxys_environment() {
    let http = free_port();
    let (break_port, balance_port) = (free_port(), free_port());
    let (victim, evil) = (upstream("victim"), upstream("evil"));
    let config = library::ingress_config(http, free_port());
    let victim_ingress = ingress("victim", "web", "victim.test", "web");
    let mut grab = service("aaa-evil", "grab");
    grab["metadata"]["annotations"] =
        json!({ "hapwright.io/balance": format!("leastconn{}", section("evil2", balance_port)) });
    let resources = [
        ("ingresses", json!([victim_ingress.clone()])),
        ("services", json!([service("victim", "web"), grab])),
        (
            "endpointslices",
            json!([
                loopback_slice("victim", "web", "http", &[victim]),
                loopback_slice("aaa-evil", "grab", "http", &[evil])
            ]),
        ),
        ("secrets", json!([])),
    ];
    let sidecar = Sidecar::start_with_env(
        "hapwright-ingress-injection-",
        config,
        &resources,
        http,
        reqwest::blocking::Client::builder(),
        &[("SECRET", SECRET)],
    );
    sidecar.expect(http, "victim.test", "/", 200, "victim");

    // The attacker's Ingresses arrive together: two good ones and one whose backend
    // name breaks out of its line.
    sidecar.change(
        "ingresses",
        &json!([
            victim_ingress,
            ingress("aaa-evil", "grab", "grab.test", "grab"),
            ingress("aaa-evil", "more", "more.test", "grab"),
            ingress(
                "aaa-evil",
                "breakout",
                "breakout.test",
                &format!("grab{}", section("evil", break_port))
            ),
        ]),
    );
    poll(WAIT, || {
        let (status, body) = sidecar.get(http, "grab.test", "/").ok()?;
        (status == 200 && body.starts_with("evil")).then_some(())
    })
    .unwrap_or_else(|_| sidecar.fail("the good Ingresses never went live"));
    sidecar.expect(http, "more.test", "/", 200, "evil");

    let quarantine = sidecar.quarantine(1);
    assert_eq!(
        quarantine["objects"][0]["resource"], "ingresses",
        "{quarantine}"
    );
    assert_eq!(quarantine["objects"][0]["name"], "breakout", "{quarantine}");

    // Neither section exists: no listener, no line of its own.
    for port in [break_port, balance_port] {
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "a tenant's listen section is live on {port}"
        );
    }
    let deployed = sidecar.deployed_config();
    for line in deployed.lines() {
        let line = line.trim_start();
        assert!(
            !line.starts_with("listen evil") && !line.starts_with("bind 127.0.0.1:"),
            "a tenant's line is in the config: {line}\n{deployed}"
        );
    }
    sidecar.expect(http, "victim.test", "/", 200, "victim");
    let (_, body) = sidecar
        .get(http, "breakout.test", "/")
        .unwrap_or_else(|e| sidecar.fail(&e));
    assert!(!body.contains(SECRET), "{body}");
}
