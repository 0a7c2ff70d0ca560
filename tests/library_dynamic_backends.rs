//! Both template libraries render their per-route backends as `backend NAME from
//! routes`, so with `haproxy.dynamicBackends` on HAProxy 3.4 a new Ingress,
//! HTTPRoute or TCPRoute (`from tcproutes`) and its removal are deployed without a
//! reload. On older lines (run by
//! `scripts/test.sh` with each line first on `PATH`) the same changes reload, with the
//! reason on `/debug/instances`. Both run the hapwright binary with a sidecar HAProxy
//! started as the sidecar manifest starts it.

mod library;

use hapwright_deployer::client::master::Version;
use hapwright_e2e::free_port;
use library::{Sidecar, upstream};
use serde_json::{Value, json};

/// Whether the `haproxy` on `PATH` has `add backend`.
fn dynamic_line() -> bool {
    let output = std::process::Command::new("haproxy")
        .arg("-v")
        .output()
        .expect("haproxy -v runs");
    Version::parse(&String::from_utf8_lossy(&output.stdout))
        .is_some_and(|v| v >= Version { major: 3, minor: 4 })
}

/// A route change as `/debug/instances` reports it: runtime without a reload on 3.4,
/// else a reload saying why.
fn assert_route_change(sidecar: &Sidecar, deployed: &Value, reloads_before: u64, dynamic: bool) {
    if dynamic {
        assert_eq!(deployed["last_strategy"], "runtime", "{deployed}");
        assert_eq!(
            sidecar.master_reloads(),
            reloads_before,
            "HAProxy did not reload"
        );
    } else {
        assert_eq!(deployed["last_strategy"], "reload", "{deployed}");
        let reason = deployed.to_string();
        assert!(reason.contains("has no `add backend`"), "{deployed}");
    }
}

/// How many validations passed phase 2 by equivalence (`ValidationCompleted` events
/// with `phase2_skipped` on `/debug/events`): a new or removed route does not wait
/// for `haproxy -c`.
fn phase2_skipped(sidecar: &Sidecar) -> usize {
    let text = sidecar
        .client
        .get(format!("http://127.0.0.1:{}/debug/events", sidecar.status))
        .send()
        .and_then(|r| r.text())
        .unwrap_or_else(|e| sidecar.fail(&format!("/debug/events: {e}")));
    let events: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| sidecar.fail(&format!("{e}: {text}")));
    events
        .as_array()
        .or_else(|| events["events"].as_array())
        .unwrap_or_else(|| sidecar.fail(&format!("no events: {text}")))
        .iter()
        .filter(|e| e["type"] == "ValidationCompleted" && e["data"]["phase2_skipped"].is_string())
        .count()
}

fn service(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name, "namespace": "shop" },
        "spec": { "ports": [ { "port": 80, "protocol": "TCP" } ] }
    })
}

fn ingress(name: &str, host: &str, service: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": { "name": name, "namespace": "shop", "creationTimestamp": "2026-01-01T00:00:00Z" },
        "spec": {
            "ingressClassName": "hapwright",
            "rules": [ { "host": host, "http": { "paths": [ {
                "path": "/", "pathType": "Prefix",
                "backend": { "service": { "name": service, "port": { "number": 80 } } }
            } ] } } ]
        }
    })
}

#[test]
fn a_new_ingress_and_its_removal_need_no_reload_on_3_4() {
    let dynamic = dynamic_line();
    let (web, blog) = (upstream("web"), upstream("blog"));
    let (http, https) = (free_port(), free_port());
    let mut config = library::ingress_config(http, https);
    config["haproxy"] = json!({ "dynamicBackends": true });
    let resources = [
        (
            "ingresses",
            json!([ingress("shop", "shop.example.test", "web")]),
        ),
        ("services", json!([service("web"), service("blog")])),
        (
            "endpointslices",
            json!([
                library::loopback_slice("shop", "web", "", &[web]),
                library::loopback_slice("shop", "blog", "", &[blog])
            ]),
        ),
        ("secrets", json!([])),
    ];
    let sidecar = Sidecar::start(
        "hapwright-ingress-dynamic-",
        config,
        &resources,
        http,
        reqwest::blocking::Client::builder(),
    );
    sidecar.expect(http, "shop.example.test", "/", 200, "web");
    sidecar.expect(http, "blog.example.test", "/", 404, "default backend - 404");

    let reloads = sidecar.master_reloads();
    let deployed = sidecar.change(
        "ingresses",
        &json!([
            ingress("shop", "shop.example.test", "web"),
            ingress("blog", "blog.example.test", "blog")
        ]),
    );
    assert_route_change(&sidecar, &deployed, reloads, dynamic);
    assert_eq!(
        phase2_skipped(&sidecar),
        1,
        "the new route did not wait for haproxy -c"
    );
    sidecar.expect(http, "blog.example.test", "/", 200, "blog");
    sidecar.expect(http, "shop.example.test", "/", 200, "web");
    assert!(
        sidecar
            .deployed_config()
            .contains("\nbackend ing_shop_blog_80 from routes\n"),
        "{}",
        sidecar.deployed_config()
    );

    let reloads = sidecar.master_reloads();
    let deployed = sidecar.change(
        "ingresses",
        &json!([ingress("shop", "shop.example.test", "web")]),
    );
    assert_route_change(&sidecar, &deployed, reloads, dynamic);
    assert_eq!(phase2_skipped(&sidecar), 2);
    sidecar.expect(http, "blog.example.test", "/", 404, "default backend - 404");
    sidecar.expect(http, "shop.example.test", "/", 200, "web");
}

fn httproute(name: &str, host: &str, service: &str) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": { "name": name, "namespace": "shop", "creationTimestamp": "2026-01-01T00:00:00Z" },
        "spec": {
            "parentRefs": [ { "name": "edge", "namespace": "infra" } ],
            "hostnames": [ host ],
            "rules": [ { "backendRefs": [ { "name": service, "port": 80 } ] } ]
        }
    })
}

#[test]
fn a_new_httproute_and_its_removal_need_no_reload_on_3_4() {
    let dynamic = dynamic_line();
    let (web, blog) = (upstream("web"), upstream("blog"));
    let http = free_port();
    let mut config = library::gateway_config();
    config["haproxy"] = json!({ "dynamicBackends": true });
    let library_fixtures = library::library_value(&library::library_path(
        "examples/gateway-api/hapwright.yaml",
    ));
    let global = &library_fixtures["validationTests"]["_global"]["fixtures"];
    let gateway =
        library::edge_gateway(json!([ { "name": "http", "protocol": "HTTP", "port": http,
                             "allowedRoutes": { "namespaces": { "from": "All" } } } ]));
    let resources = [
        ("gatewayclasses", global["gatewayclasses"].clone()),
        ("gateways", gateway),
        (
            "httproutes",
            json!([httproute("shop", "shop.example.test", "web")]),
        ),
        ("grpcroutes", json!([])),
        ("tlsroutes", json!([])),
        ("tcproutes", json!([])),
        ("referencegrants", json!([])),
        ("namespaces", global["namespaces"].clone()),
        ("services", json!([service("web"), service("blog")])),
        (
            "endpointslices",
            json!([
                library::loopback_slice("shop", "web", "", &[web]),
                library::loopback_slice("shop", "blog", "", &[blog])
            ]),
        ),
        ("secrets", json!([])),
    ];
    let sidecar = Sidecar::start(
        "hapwright-gateway-dynamic-",
        config,
        &resources,
        http,
        reqwest::blocking::Client::builder(),
    );
    sidecar.expect(http, "shop.example.test", "/", 200, "web");

    let reloads = sidecar.master_reloads();
    let deployed = sidecar.change(
        "httproutes",
        &json!([
            httproute("shop", "shop.example.test", "web"),
            httproute("blog", "blog.example.test", "blog")
        ]),
    );
    assert_route_change(&sidecar, &deployed, reloads, dynamic);
    assert_eq!(
        phase2_skipped(&sidecar),
        1,
        "the new route did not wait for haproxy -c"
    );
    sidecar.expect(http, "blog.example.test", "/", 200, "blog");
    sidecar.expect(http, "shop.example.test", "/", 200, "web");

    let reloads = sidecar.master_reloads();
    let deployed = sidecar.change(
        "httproutes",
        &json!([httproute("shop", "shop.example.test", "web")]),
    );
    assert_route_change(&sidecar, &deployed, reloads, dynamic);
    assert_eq!(phase2_skipped(&sidecar), 2);
    assert_ne!(
        sidecar
            .get(http, "blog.example.test", "/")
            .map(|(status, _)| status),
        Ok(200)
    );
    sidecar.expect(http, "shop.example.test", "/", 200, "web");
}

fn tcproute(name: &str, service: &str) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1alpha2",
        "kind": "TCPRoute",
        "metadata": { "name": name, "namespace": "shop", "creationTimestamp": "2026-01-01T00:00:00Z" },
        "spec": {
            "parentRefs": [ { "name": "edge", "namespace": "infra", "sectionName": "tcp" } ],
            "rules": [ { "backendRefs": [ { "name": service, "port": 80 } ] } ]
        }
    })
}

/// TCPRoute backends are `backend NAME from tcproutes` with only servers, and the
/// TCP listener finds its route through `maps/tcp.map`: a new TCPRoute, and its
/// removal, deploy without a reload on 3.4 (the connections, HTTP to the web
/// upstream here, forwarded as a plain TCP stream).
#[test]
fn a_new_tcproute_and_its_removal_need_no_reload_on_3_4() {
    let dynamic = dynamic_line();
    let web = upstream("web");
    let (http, tcp) = (free_port(), free_port());
    let mut config = library::gateway_config();
    config["haproxy"] = json!({ "dynamicBackends": true });
    let library_fixtures = library::library_value(&library::library_path(
        "examples/gateway-api/hapwright.yaml",
    ));
    let global = &library_fixtures["validationTests"]["_global"]["fixtures"];
    let gateway = library::edge_gateway(json!([
        { "name": "http", "protocol": "HTTP", "port": http,
          "allowedRoutes": { "namespaces": { "from": "All" } } },
        { "name": "tcp", "protocol": "TCP", "port": tcp,
          "allowedRoutes": { "namespaces": { "from": "All" } } }
    ]));
    let resources = [
        ("gatewayclasses", global["gatewayclasses"].clone()),
        ("gateways", gateway),
        // An HTTPRoute beside, so removing the TCPRoute is not most of what is
        // served (the safety valve would hold it back).
        (
            "httproutes",
            json!([
                httproute("shop", "shop.example.test", "web"),
                httproute("blog", "blog.example.test", "web")
            ]),
        ),
        ("grpcroutes", json!([])),
        ("tlsroutes", json!([])),
        ("tcproutes", json!([])),
        ("referencegrants", json!([])),
        ("namespaces", global["namespaces"].clone()),
        ("services", json!([service("web")])),
        (
            "endpointslices",
            json!([library::loopback_slice("shop", "web", "", &[web])]),
        ),
        ("secrets", json!([])),
    ];
    let sidecar = Sidecar::start(
        "hapwright-gateway-dynamic-tcp-",
        config,
        &resources,
        http,
        reqwest::blocking::Client::builder(),
    );
    // No TCPRoute: the listener refuses the connection.
    assert!(sidecar.get(tcp, "any.example.test", "/").is_err());

    let reloads = sidecar.master_reloads();
    let deployed = sidecar.change("tcproutes", &json!([tcproute("db", "web")]));
    assert_route_change(&sidecar, &deployed, reloads, dynamic);
    sidecar.expect(tcp, "any.example.test", "/", 200, "web");

    let reloads = sidecar.master_reloads();
    let deployed = sidecar.change("tcproutes", &json!([]));
    assert_route_change(&sidecar, &deployed, reloads, dynamic);
    assert!(sidecar.get(tcp, "any.example.test", "/").is_err());
    let config = sidecar.deployed_config();
    assert!(!config.contains("tc_shop_db"), "{config}");
    sidecar.expect(http, "shop.example.test", "/", 200, "web");
}
