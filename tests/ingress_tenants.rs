//! Tenant isolation of the Ingress library in `examples/kubernetes-ingress/`, end to
//! end with real HAProxy and real requests: someone who may create Ingresses in their
//! own namespace (here `aaa-evil`, which sorts first) cannot take another
//! namespace's host through Host header spellings (`victim.test.`, `VICTIM.TEST`,
//! `victim.test:80`), through a regex path, through a newer Ingress for the same
//! paths, default backend or TLS host, or by bringing many certificates; with
//! `hostOwnership: namespace` not even other paths of the host. The refused parts
//! are named in the deployed `haproxy.cfg`.

mod library;

use hapwright_e2e::free_port;
use library::{Sidecar, library_path, loopback_slice, upstream};
use serde_json::{Value, json};

fn library_value() -> Value {
    library::library_value(&library_path("examples/kubernetes-ingress/hapwright.yaml"))
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
        "spec": { "ports": [ { "name": "http", "port": 80, "protocol": "TCP" } ] }
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

fn ingress(namespace: &str, name: &str, created: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["ingressClassName"] = json!("hapwright");
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": { "name": name, "namespace": namespace, "creationTimestamp": created },
        "spec": spec
    })
}

fn path(path: &str, kind: &str, service: &str) -> Value {
    json!({ "path": path, "pathType": kind, "backend": { "service": { "name": service, "port": { "name": "http" } } } })
}

/// The victim (`victim/web`, older), the attacker (`aaa-evil/grab`, newer, and
/// `aaa-evil/hoard`, the oldest of all, with 17 TLS Secrets) and a bystander
/// (`other/site`), with the library's settings changed by `settings`.
fn start(settings: Value) -> (Sidecar, Ports) {
    let library = library_value();
    let ports = Ports {
        http: free_port(),
        https: free_port(),
    };
    let (victim, evil, other) = (upstream("victim"), upstream("evil"), upstream("other"));
    let mut config = library::ingress_config(ports.http, ports.https);
    for (key, value) in settings.as_object().expect("settings") {
        config["extraContext"][key] = value.clone();
    }

    let hoard_tls: Vec<Value> = (0..17)
        .map(
            |i| json!({ "hosts": [format!("h{i}.evil.test")], "secretName": format!("hoard-{i}") }),
        )
        .collect();
    let mut secrets = vec![
        secret(&library, "victim", "victim-tls", "shop-tls"),
        secret(&library, "other", "other-tls", "shop-tls"),
        secret(&library, "aaa-evil", "grab-tls", "apps-wildcard-tls"),
    ];
    for i in 0..17 {
        secrets.push(secret(
            &library,
            "aaa-evil",
            &format!("hoard-{i}"),
            "apps-wildcard-tls",
        ));
    }
    let mut grab = ingress(
        "aaa-evil",
        "grab",
        "2026-06-01T00:00:00Z",
        json!({
            "defaultBackend": { "service": { "name": "grab", "port": { "name": "http" } } },
            "tls": [ { "hosts": ["victim.test", "Evil.Test."], "secretName": "grab-tls" } ],
            "rules": [
                { "host": "victim.test", "http": { "paths": [
                    path("/", "Prefix", "grab"), path("/login", "Exact", "grab"), path("/admin", "Prefix", "grab") ] } },
                { "host": "evil.test", "http": { "paths": [ path("/x|.*", "ImplementationSpecific", "grab") ] } },
                { "http": { "paths": [ path("/grab", "Prefix", "grab") ] } }
            ]
        }),
    );
    // Plain HTTP for evil.test, so the host checks below see its routes, not a
    // redirect to its certificate.
    grab["metadata"]["annotations"] =
        json!({ "hapwright.io/path-regex": "true", "hapwright.io/ssl-redirect": "false" });
    let mut web = ingress(
        "victim",
        "web",
        "2026-01-01T00:00:00Z",
        json!({
            "defaultBackend": { "service": { "name": "web", "port": { "name": "http" } } },
            "tls": [ { "hosts": ["victim.test"], "secretName": "victim-tls" } ],
            "rules": [ { "host": "victim.test", "http": { "paths": [
                path("/", "Prefix", "web"), path("/login", "Exact", "web") ] } } ]
        }),
    );
    // Plain HTTP stays plain for the victim; a redirect would be the attacker's.
    web["metadata"]["annotations"] = json!({ "hapwright.io/ssl-redirect": "false" });
    let mut site = ingress(
        "other",
        "site",
        "2026-03-01T00:00:00Z",
        json!({
            "tls": [ { "hosts": ["other.test"], "secretName": "other-tls" } ],
            "rules": [ { "host": "other.test", "http": { "paths": [ path("/", "Prefix", "site") ] } } ]
        }),
    );
    site["metadata"]["annotations"] = json!({ "hapwright.io/ssl-redirect": "false" });
    let ingresses = json!([
        grab,
        ingress(
            "aaa-evil",
            "hoard",
            "2025-01-01T00:00:00Z",
            json!({
                "tls": hoard_tls,
                "rules": [ { "host": "h0.evil.test", "http": { "paths": [ path("/", "Prefix", "grab") ] } } ]
            })
        ),
        web,
        site,
    ]);
    let resources = [
        ("ingresses", ingresses),
        (
            "services",
            json!([
                service("victim", "web"),
                service("aaa-evil", "grab"),
                service("other", "site")
            ]),
        ),
        ("secrets", Value::Array(secrets)),
        (
            "endpointslices",
            json!([
                loopback_slice("victim", "web", "http", &[victim]),
                loopback_slice("aaa-evil", "grab", "http", &[evil]),
                loopback_slice("other", "site", "http", &[other])
            ]),
        ),
    ];
    let sidecar = Sidecar::start(
        "hapwright-tenants-",
        config,
        &resources,
        ports.http,
        reqwest::blocking::Client::builder(),
    );
    (sidecar, ports)
}

#[test]
fn a_tenant_cannot_take_another_tenants_host_paths_default_backend_or_certificate() {
    let (sidecar, ports) = start(json!({}));
    let http = ports.http;

    // Host spellings, the newer object's paths and the regex (see the helper).
    sidecar.expect_hosts_stay_their_owners(http);
    // Host-less rules take unknown hosts; the default backend is the oldest one's.
    sidecar.expect(http, "unknown.test", "/grab", 200, "evil");
    sidecar.expect(http, "unknown.test", "/", 200, "victim");
    // The attacker's own TLS host redirects to HTTPS, where its certificate is.
    sidecar.expect(http, "h0.evil.test", "/", 308, "");

    // Certificates: the victim's for victim.test (shop-tls data), the bystander's
    // for other.test although the attacker's 17 Secrets are older, and every one of
    // the attacker's own (for its own hosts only).
    let victim_cert = sidecar.served_certificate(ports.https, "victim.test");
    assert!(
        victim_cert.contains("shop.example.test"),
        "victim.test: {victim_cert}"
    );
    let other_cert = sidecar.served_certificate(ports.https, "other.test");
    assert!(
        other_cert.contains("shop.example.test"),
        "other.test: {other_cert}"
    );
    let hoarded = sidecar.served_certificate(ports.https, "h16.evil.test");
    assert!(
        hoarded.contains("apps.example.test"),
        "h16.evil.test: {hoarded}"
    );
    let evil_cert = sidecar.served_certificate(ports.https, "evil.test");
    assert!(
        evil_cert.contains("apps.example.test"),
        "evil.test: {evil_cert}"
    );

    let config = sidecar.deployed_config();
    for conflict in [
        "# hapwright:Conflict Ingress aaa-evil/grab: prefix path victim.test/ is refused, it is served by the older Ingress victim/web",
        "# hapwright:Conflict Ingress aaa-evil/grab: exact path victim.test/login is refused, it is served by the older Ingress victim/web",
        "# hapwright:Conflict Ingress aaa-evil/grab: spec.defaultBackend refused, the default backend is that of the older Ingress victim/web",
        "# hapwright:Conflict Ingress aaa-evil/grab: TLS host victim.test is refused, Secret victim/victim-tls of an older Ingress serves it",
    ] {
        assert!(config.contains(conflict), "{conflict}\n{config}");
    }
}

#[test]
fn with_host_ownership_other_namespaces_cannot_add_paths_to_a_host() {
    let (sidecar, ports) = start(json!({ "hostOwnership": "namespace" }));
    let http = ports.http;
    sidecar.expect(http, "victim.test", "/", 200, "victim");
    sidecar.expect(http, "VICTIM.TEST.", "/login", 200, "victim");
    // /admin of the attacker's Ingress is refused: the victim's prefix / answers.
    sidecar.expect(http, "victim.test", "/admin", 200, "victim");
    sidecar.expect(http, "evil.test", "/x", 200, "evil");
    sidecar.expect(http, "other.test", "/", 200, "other");
    let victim_cert = sidecar.served_certificate(ports.https, "victim.test");
    assert!(
        victim_cert.contains("shop.example.test"),
        "victim.test: {victim_cert}"
    );
    let config = sidecar.deployed_config();
    let refused = "# hapwright:Conflict Ingress aaa-evil/grab: the rules for host victim.test are refused, the host belongs to namespace victim (hostOwnership)";
    assert!(config.contains(refused), "{config}");
}
