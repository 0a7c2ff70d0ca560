//! Tenant isolation of the Gateway API library in `examples/gateway-api/`, end to
//! end with real HAProxy and real requests: someone who may create routes and
//! Gateways in their own namespace (here `aaa-evil`, which sorts first) cannot take
//! another namespace's hostname through Host header spellings (`victim.test.`,
//! `VICTIM.TEST`, `victim.test:80`), through a newer HTTPRoute for the same paths,
//! through a newer Gateway listener for the same hostname and port, or by bringing
//! many certificates; with `hostOwnership: namespace` not even other paths of
//! the hostname. The refused parts are named in the deployed `haproxy.cfg`.

mod library;

use hapwright_e2e::{WAIT, free_port, poll};
use library::{Sidecar, library_path, loopback_slice, upstream};
use serde_json::{Value, json};

fn library_value() -> Value {
    library::library_value(&library_path("examples/gateway-api/hapwright.yaml"))
}

struct Ports {
    http: u16,
    https: u16,
}

fn service(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name, "namespace": namespace },
        "spec": { "ports": [ { "port": 80, "protocol": "TCP" } ] }
    })
}

/// A TLS Secret with the certificate and key of `_global`'s Secret `template`
/// (`shop-tls`: CN shop.example.test, `apps-wildcard-tls`: CN *.apps.example.test).
fn secret(library: &Value, namespace: &str, name: &str, template: &str) -> Value {
    let data = library["validationTests"]["_global"]["fixtures"]["secrets"]
        .as_array()
        .expect("secrets")
        .iter()
        .find(|s| s["metadata"]["name"] == template)
        .expect("template secret")["data"]
        .clone();
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": { "name": name, "namespace": namespace }, "data": data
    })
}

fn gateway(namespace: &str, name: &str, created: &str, listeners: Value) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": { "name": name, "namespace": namespace, "creationTimestamp": created },
        "spec": { "gatewayClassName": "hapwright", "listeners": listeners }
    })
}

fn https(name: &str, port: u16, hostname: &str, secret: &str) -> Value {
    json!({ "name": name, "protocol": "HTTPS", "port": port, "hostname": hostname,
            "tls": { "certificateRefs": [ { "name": secret } ] } })
}

fn route(namespace: &str, name: &str, created: &str, hostnames: Value, rules: Value) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": { "name": name, "namespace": namespace, "creationTimestamp": created },
        "spec": {
            "parentRefs": [ { "name": "edge", "namespace": "infra", "sectionName": "http" } ],
            "hostnames": hostnames,
            "rules": rules
        }
    })
}

fn rule(kind: &str, path: &str, service: &str) -> Value {
    json!({ "matches": [ { "path": { "type": kind, "value": path } } ],
            "backendRefs": [ { "name": service, "port": 80 } ] })
}

/// The platform's Gateway `infra/edge` (the oldest), the victim's routes
/// (`victim/web`), the attacker's newer routes and Gateway with 17 certificates
/// (`aaa-evil/*`) and a bystander's newest Gateway and route (`other/site`), with
/// the library's settings changed by `settings`.
fn start(settings: Value) -> (Sidecar, Ports) {
    let library = library_value();
    let ports = Ports {
        http: free_port(),
        https: free_port(),
    };
    let (victim, evil, other) = (upstream("victim"), upstream("evil"), upstream("other"));
    let mut config = library::gateway_config();
    for (key, value) in settings.as_object().expect("settings") {
        config["extraContext"][key] = value.clone();
    }

    let mut secrets = vec![
        secret(&library, "infra", "victim-tls", "shop-tls"),
        secret(&library, "other", "other-tls", "shop-tls"),
        secret(&library, "aaa-evil", "grab-tls", "apps-wildcard-tls"),
    ];
    let mut grab_listeners = vec![
        https("victim", ports.https, "victim.test", "grab-tls"),
        https("evil", ports.https, "Evil.Test.", "grab-tls"),
    ];
    for i in 0..17 {
        let name = format!("hoard-{i}");
        secrets.push(secret(&library, "aaa-evil", &name, "apps-wildcard-tls"));
        grab_listeners.push(https(&name, ports.https, &format!("h{i}.evil.test"), &name));
    }
    let gateways = json!([
        gateway(
            "aaa-evil",
            "grab",
            "2026-06-01T00:00:00Z",
            Value::Array(grab_listeners)
        ),
        gateway(
            "infra",
            "edge",
            "2025-01-01T00:00:00Z",
            json!([
                { "name": "http", "protocol": "HTTP", "port": ports.http,
                  "allowedRoutes": { "namespaces": { "from": "All" } } },
                https("victim", ports.https, "victim.test", "victim-tls")
            ])
        ),
        gateway(
            "other",
            "site",
            "2026-09-01T00:00:00Z",
            json!([https("site", ports.https, "other.test", "other-tls")])
        ),
    ]);
    let httproutes = json!([
        route(
            "aaa-evil",
            "grab",
            "2026-06-01T00:00:00Z",
            json!(["victim.test"]),
            json!([
                rule("PathPrefix", "/", "grab"),
                rule("Exact", "/login", "grab"),
                rule("PathPrefix", "/admin", "grab")
            ])
        ),
        route(
            "aaa-evil",
            "catch-all",
            "2026-06-01T00:00:00Z",
            json!([]),
            json!([rule("PathPrefix", "/grab", "grab")])
        ),
        route(
            "aaa-evil",
            "regex",
            "2026-06-01T00:00:00Z",
            json!(["evil.test"]),
            json!([rule("RegularExpression", "/x|.*", "grab")])
        ),
        route(
            "victim",
            "web",
            "2026-01-01T00:00:00Z",
            json!(["Victim.Test"]),
            json!([
                rule("PathPrefix", "/", "web"),
                rule("Exact", "/login", "web")
            ])
        ),
        route(
            "other",
            "site",
            "2026-03-01T00:00:00Z",
            json!(["other.test"]),
            json!([rule("PathPrefix", "/", "site")])
        ),
    ]);
    let global = &library["validationTests"]["_global"]["fixtures"];
    let resources = [
        ("gatewayclasses", global["gatewayclasses"].clone()),
        ("gateways", gateways),
        ("httproutes", httproutes),
        ("grpcroutes", json!([])),
        ("tlsroutes", json!([])),
        ("tcproutes", json!([])),
        ("referencegrants", json!([])),
        ("namespaces", global["namespaces"].clone()),
        (
            "services",
            json!([
                service("victim", "web"),
                service("aaa-evil", "grab"),
                service("other", "site")
            ]),
        ),
        (
            "endpointslices",
            json!([
                loopback_slice("victim", "web", "", &[victim]),
                loopback_slice("aaa-evil", "grab", "", &[evil]),
                loopback_slice("other", "site", "", &[other])
            ]),
        ),
        ("secrets", Value::Array(secrets)),
    ];
    let sidecar = Sidecar::start(
        "hapwright-gateway-tenants-",
        config,
        &resources,
        ports.http,
        reqwest::blocking::Client::builder(),
    );
    (sidecar, ports)
}

/// The `hapwright.io/Conflicted` condition (status, reason) of HTTPRoute
/// `namespace/name`'s first parent, as rendered on `/debug/status`.
fn conflicted(sidecar: &Sidecar, namespace: &str, name: &str) -> (String, String) {
    poll(WAIT, || {
        let status = sidecar.rendered_status("httproutes", namespace, name)?;
        let condition = status["parents"][0]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "hapwright.io/Conflicted")?;
        Some((
            condition["status"].as_str()?.to_owned(),
            condition["reason"].as_str()?.to_owned(),
        ))
    })
    .unwrap_or_else(|_| {
        sidecar.fail(&format!(
            "no status rendered for HTTPRoute {namespace}/{name}"
        ))
    })
}

#[test]
fn a_tenant_cannot_take_another_tenants_hostname_paths_or_certificate() {
    let (sidecar, ports) = start(json!({}));
    let http = ports.http;

    // Host spellings, the newer object's paths and the regex (see the helper).
    sidecar.expect_hosts_stay_their_owners(http);
    sidecar.expect(http, "unknown.test", "/grab", 200, "evil");
    sidecar.expect(http, "unknown.test", "/", 404, "no route - 404");

    // Certificates: the platform's for victim.test (shop-tls data), the
    // bystander's for other.test although the attacker's Gateway with 19
    // certificates is older.
    for (name, expected) in [
        ("victim.test", "shop.example.test"),
        ("other.test", "shop.example.test"),
        ("evil.test", "apps.example.test"),
        // Every one of the attacker's own certificates, for its own hostnames.
        ("h16.evil.test", "apps.example.test"),
    ] {
        let subject = sidecar.served_certificate(ports.https, name);
        assert!(subject.contains(expected), "{name}: {subject}");
    }

    let config = sidecar.deployed_config();
    for conflict in [
        "# hapwright:Conflict HTTPRoute aaa-evil/grab: prefix path / on victim.test@",
        "# hapwright:Conflict HTTPRoute aaa-evil/grab: exact path /login on victim.test@",
        "# hapwright:Conflict Gateway aaa-evil/grab listener victim: hostname victim.test on port",
    ] {
        assert!(config.contains(conflict), "{conflict}\n{config}");
    }
    // The attacker's route says what it lost; the victim's has no conflict.
    assert_eq!(
        conflicted(&sidecar, "aaa-evil", "grab"),
        ("True".to_owned(), "MatchConflict".to_owned())
    );
    assert_eq!(
        conflicted(&sidecar, "victim", "web"),
        ("False".to_owned(), "NoConflicts".to_owned())
    );
}

#[test]
fn with_host_ownership_other_namespaces_cannot_add_paths_to_a_hostname() {
    let (sidecar, ports) = start(json!({ "hostOwnership": "namespace" }));
    let http = ports.http;
    sidecar.expect(http, "victim.test", "/", 200, "victim");
    sidecar.expect(http, "VICTIM.TEST.", "/login", 200, "victim");
    // /admin of the attacker's route is refused: the victim's prefix / answers.
    sidecar.expect(http, "victim.test", "/admin", 200, "victim");
    sidecar.expect(http, "evil.test", "/x", 200, "evil");
    sidecar.expect(http, "other.test", "/", 200, "other");
    let config = sidecar.deployed_config();
    let refused = "# hapwright:Conflict HTTPRoute aaa-evil/grab: hostname victim.test is refused, it belongs to namespace victim (hostOwnership)";
    assert!(config.contains(refused), "{config}");
    assert_eq!(
        conflicted(&sidecar, "aaa-evil", "grab"),
        ("True".to_owned(), "HostnameOwned".to_owned())
    );
}
