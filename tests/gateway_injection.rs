//! A tenant's route values never become HAProxy configuration with the Gateway API
//! library in `examples/gateway-api/`, end to end with real HAProxy whose
//! environment holds a secret: a backendRef name carrying line breaks and a
//! `listen` section of its own is refused and its route quarantined (the other
//! tenants stay live, nothing listens where the section asked), and redirect
//! paths (full and prefix), rewritten paths and response header values carrying
//! `%[env(SECRET)]`, `${SECRET}`, quotes and backslashes reach clients and backends
//! as the text written, never as the secret.

mod library;

use std::net::TcpStream;

use hapwright_e2e::{WAIT, free_port, poll};
use library::{Sidecar, library_path, loopback_slice, upstream};
use serde_json::{Value, json};

const SECRET: &str = "s3cr3t-only-haproxy-knows";
const PROBE: &str = "%[env(SECRET)]${SECRET}";

fn service(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": name, "namespace": namespace },
        "spec": { "ports": [ { "port": 80, "protocol": "TCP" } ] }
    })
}

fn route(namespace: &str, name: &str, hostname: &str, rules: Value) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": { "name": name, "namespace": namespace,
                      "creationTimestamp": "2026-06-01T00:00:00Z" },
        "spec": {
            "parentRefs": [ { "name": "edge", "namespace": "infra" } ],
            "hostnames": [ hostname ],
            "rules": rules
        }
    })
}

fn prefix(path: &str) -> Value {
    json!([ { "path": { "type": "PathPrefix", "value": path } } ])
}

/// The attacker's routes with expansion probes in every value the library writes
/// into a log-format string.
fn probing_route() -> Value {
    route(
        "aaa-evil",
        "probe",
        "evil.test",
        json!([
            { "matches": prefix("/full"), "filters": [ { "type": "RequestRedirect",
                "requestRedirect": { "path": { "type": "ReplaceFullPath",
                    "replaceFullPath": format!("/to/{PROBE}") } } } ] },
            { "matches": prefix("/prefix"), "filters": [ { "type": "RequestRedirect",
                "requestRedirect": { "path": { "type": "ReplacePrefixMatch",
                    "replacePrefixMatch": format!("/p{PROBE}") } } } ] },
            { "matches": prefix("/rewrite"), "filters": [ { "type": "URLRewrite",
                "urlRewrite": { "path": { "type": "ReplaceFullPath",
                    "replaceFullPath": format!("/r{PROBE}") } } } ],
              "backendRefs": [ { "name": "grab", "port": 80 } ] },
            { "matches": prefix("/header"), "filters": [ { "type": "ResponseHeaderModifier",
                "responseHeaderModifier": { "set": [
                    { "name": "X-Probe", "value": format!("{PROBE} \"q\" \\ 100%") } ] } } ],
              "backendRefs": [ { "name": "grab", "port": 80 } ] }
        ]),
    )
}

/// A route whose backendRef name ends the comment the library writes it into and
/// adds a `listen` section answering with the secret.
fn breaking_route(evil_port: u16) -> Value {
    let name = format!(
        "grab\nlisten evil\n    bind 127.0.0.1:{evil_port}\n    mode http\n    \
         http-request return status 200 lf-string %[env(SECRET)]\n#"
    );
    route(
        "aaa-evil",
        "breakout",
        "breakout.test",
        json!([ { "matches": prefix("/"), "backendRefs": [ { "name": name, "port": 80 } ] } ]),
    )
}

#[test]
fn route_values_never_become_config_or_reach_haproxys_environment() {
    let library = library::library_value(&library_path("examples/gateway-api/hapwright.yaml"));
    let http = free_port();
    let evil_port = free_port();
    let (victim, evil) = (upstream("victim"), upstream("evil"));
    let config = library::gateway_config();
    let global = &library["validationTests"]["_global"]["fixtures"];
    let gateways = json!([ {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": { "name": "edge", "namespace": "infra",
                      "creationTimestamp": "2025-01-01T00:00:00Z" },
        "spec": { "gatewayClassName": "hapwright", "listeners": [
            { "name": "http", "protocol": "HTTP", "port": http,
              "allowedRoutes": { "namespaces": { "from": "All" } } } ] }
    } ]);
    let victim_route = route(
        "victim",
        "web",
        "victim.test",
        json!([ { "matches": prefix("/"), "backendRefs": [ { "name": "web", "port": 80 } ] } ]),
    );
    let resources = [
        ("gatewayclasses", global["gatewayclasses"].clone()),
        ("gateways", gateways),
        ("httproutes", json!([victim_route.clone()])),
        ("grpcroutes", json!([])),
        ("tlsroutes", json!([])),
        ("tcproutes", json!([])),
        ("referencegrants", json!([])),
        ("namespaces", global["namespaces"].clone()),
        (
            "services",
            json!([service("victim", "web"), service("aaa-evil", "grab")]),
        ),
        (
            "endpointslices",
            json!([
                loopback_slice("victim", "web", "", &[victim]),
                loopback_slice("aaa-evil", "grab", "", &[evil])
            ]),
        ),
        ("secrets", json!([])),
    ];
    let sidecar = Sidecar::start_with_env(
        "hapwright-gateway-injection-",
        config,
        &resources,
        http,
        reqwest::blocking::Client::builder(),
        &[("SECRET", SECRET)],
    );
    sidecar.expect(http, "victim.test", "/", 200, "victim");

    // The attacker adds its routes at once (with two good changes beside the bad
    // one: quarantine holds back the odd bad object, not half of a change).
    let bystander = route(
        "bystander",
        "site",
        "bystander.test",
        json!([ { "matches": prefix("/"), "backendRefs": [ { "name": "web", "port": 80 } ] } ]),
    );
    sidecar.change(
        "httproutes",
        &json!([
            victim_route,
            bystander,
            probing_route(),
            breaking_route(evil_port)
        ]),
    );
    // The probing route goes live; the breaking one is held back.
    let probed = poll(WAIT, || {
        let (status, location, _) = sidecar
            .send(
                sidecar
                    .client
                    .get(format!("http://127.0.0.1:{http}/full"))
                    .header("host", "evil.test"),
            )
            .ok()?;
        (status == 302).then_some(location)
    })
    .unwrap_or_else(|_| sidecar.fail("the probing route never went live"));
    assert!(probed.ends_with(&format!("/to/{PROBE}")), "{probed}");

    let quarantine = sidecar.quarantine(1);
    let held = &quarantine["objects"][0];
    assert_eq!(held["resource"], "httproutes", "{quarantine}");
    assert_eq!(held["name"], "breakout", "{quarantine}");
    assert!(
        quarantine.to_string().contains("refused"),
        "the reason names the refusal: {quarantine}"
    );

    // Nothing of the tenant's section exists: no listener, no such line.
    assert!(
        TcpStream::connect(("127.0.0.1", evil_port)).is_err(),
        "the tenant's listen section is live"
    );
    let deployed = sidecar.deployed_config();
    assert!(!deployed.contains("listen evil"), "{deployed}");

    // Every probe comes back as written.
    let (status, location, _) = sidecar
        .send(
            sidecar
                .client
                .get(format!("http://127.0.0.1:{http}/prefix/rest"))
                .header("host", "evil.test"),
        )
        .unwrap_or_else(|e| sidecar.fail(&e));
    assert_eq!(status, 302);
    assert!(location.ends_with(&format!("/p{PROBE}/rest")), "{location}");
    let (status, body) = sidecar
        .get(http, "evil.test", "/rewrite")
        .unwrap_or_else(|e| sidecar.fail(&e));
    assert_eq!(status, 200);
    assert!(
        body.starts_with(&format!("evil\nGET /r{PROBE} HTTP/1.1")),
        "the backend saw another path: {body}"
    );
    let response = sidecar
        .client
        .get(format!("http://127.0.0.1:{http}/header"))
        .header("host", "evil.test")
        .send()
        .unwrap_or_else(|e| sidecar.fail(&format!("{e}")));
    assert_eq!(
        response
            .headers()
            .get("x-probe")
            .and_then(|v| v.to_str().ok()),
        Some(format!("{PROBE} \"q\" \\ 100%").as_str())
    );
    for text in [probed, location, body] {
        assert!(
            !text.contains(SECRET),
            "the secret reached a response: {text}"
        );
    }
    // The other tenant stayed live throughout.
    sidecar.expect(http, "victim.test", "/", 200, "victim");
}
