//! The Gateway API template library in `examples/gateway-api/`: `hapwright check` and
//! every `validationTests` entry pass under the real HAProxy (`hapwright test`), every
//! feature has its test, a backendRef weight change plans as `set server weight` only,
//! and end to end the library routes real requests with the Gateway objects as
//! manifest files: routing precedence, a redirect, a rewrite with header changes,
//! weights (their distribution, and a weight change deployed without a reload), TLS
//! with SNI, TLS passthrough by SNI, a GRPCRoute over HTTP/2, and a cross-namespace
//! backendRef that is refused until a ReferenceGrant allows it; a rule with usable
//! and unusable backendRefs answering the unusable share 500; TCPRoutes forwarding
//! raw TCP connections by weight.

mod library;

#[path = "support/certs.rs"]
mod certs;

use std::path::PathBuf;

use hapwright_deployer::haproxy::plan::{self, RuntimeOp};
use hapwright_e2e::{WAIT, free_port, poll};
use hapwright_eventbus::model::DeployStrategy;
use library::{Sidecar, hapwright, library_path, render, rendered, test_fixtures, text, upstream};
use serde_json::{Value, json};

/// One test per feature of the library (docs/gateway-api.md).
const FEATURE_TESTS: &[&str] = &[
    "routing-basics",
    "gatewayclass-selection",
    "listeners-and-ports",
    "listener-conflicts-and-unsupported",
    "certificate-refs",
    "hostnames-and-wildcards",
    "attachment-section-and-port",
    "allowed-routes-namespaces",
    "allowed-routes-kinds",
    "path-match-types",
    "match-precedence",
    "filter-header-modifiers",
    "filter-request-redirect",
    "filter-url-rewrite",
    "filter-request-mirror-unsupported",
    "route-timeouts",
    "route-retry",
    "filter-cors",
    "session-persistence",
    "session-persistence-unsupported",
    "backend-tls-policy",
    "backend-tls-policy-refused",
    "backend-weights",
    "cross-namespace-backend-refs",
    "invalid-backend-refs",
    "partially-invalid-backend-refs",
    "unsafe-values-are-skipped",
    "grpcroute",
    "tlsroute-passthrough",
    "tcproute",
    "host-normalisation",
    "regex-paths-checked",
    "conflicts-oldest-wins",
    "host-ownership",
    "tls-every-secret",
    "status-gatewayclass",
    "status-gateway",
    "status-routes",
    "status-deployment",
    "health-and-metrics-frontend",
];

fn library_config() -> PathBuf {
    library_path("examples/gateway-api/hapwright.yaml")
}

fn library_value() -> Value {
    library::library_value(&library_config())
}

#[test]
fn the_library_passes_check() {
    let output = hapwright(&["check"], &library_config());
    assert!(output.status.success(), "{}", text(&output));
}

#[test]
fn every_validation_test_passes_under_haproxy() {
    library::assert_every_validation_test_passes(&library_config(), FEATURE_TESTS);
}

#[test]
fn each_feature_test_checks_something_of_its_own() {
    library::assert_each_feature_test_checks_something_of_its_own(&library_config(), FEATURE_TESTS);
}

#[test]
fn a_weight_change_is_a_runtime_only_deployment() {
    let before = test_fixtures(&library_value(), "backend-weights");
    // The canary gets everything: 90/10 becomes 0/100.
    let mut after = before.clone();
    let rule = &mut after["httproutes"][0]["spec"]["rules"][0];
    rule["backendRefs"][0]["weight"] = json!(0);
    rule["backendRefs"][1]["weight"] = json!(100);

    let dir = tempfile::tempdir().expect("temp dir");
    let running = rendered(&render(
        &library_config(),
        &dir.path().join("before"),
        &before,
    ));
    let desired = rendered(&render(
        &library_config(),
        &dir.path().join("after"),
        &after,
    ));
    assert_ne!(running.hash(), desired.hash());
    let plan = plan::compute(&running, &desired);
    assert_eq!(plan.reload, None, "no reload for a weight change");
    assert_eq!(plan.strategy(), DeployStrategy::Runtime);
    let weights: Vec<(&str, &str, u32)> = plan
        .ops
        .iter()
        .filter_map(|op| match op {
            RuntimeOp::SetWeight {
                backend,
                server,
                weight,
            } => Some((backend.as_str(), server.as_str(), *weight)),
            _ => None,
        })
        .collect();
    assert_eq!(
        weights,
        [
            ("hr_shop_canary_0", "web-10.244.1.5-8080", 0),
            ("hr_shop_canary_0", "web-10.244.2.7-8080", 0),
            ("hr_shop_canary_0", "web-canary-10.244.5.1-8080", 100),
        ]
    );
    assert_eq!(weights.len(), plan.ops.len(), "{:?}", plan.ops);
}

/// Route timeouts the library refuses, as a `hapwright test` entry: their render
/// fails (so quarantine holds such a route back), which the library's own
/// `validationTests` cannot hold since their `_global` asks every render to be valid.
const INVALID_RULE_VALUES: &str = include_str!("gateway_library/invalid-rule-values.yaml");

/// HTTPRouteTimeouts: a value that is not a Gateway API duration (GEP-2257), or a
/// backendRequest longer than request (the specification requires it to be no more);
/// HTTPRouteRetry: a code HAProxy cannot retry on, attempts that are not a number, a
/// backoff (HAProxy retries at once); HTTPCORSFilter: an origin or header name that
/// is not one: each fails the render naming the route and rule, and the route's `Accepted`
/// condition is `False` with reason `UnsupportedValue`.
#[test]
fn invalid_timeouts_retries_and_cors_fail_the_render_and_the_route_is_not_accepted_unsupported_value()
 {
    let mut library = library_value();
    let test: Value = serde_saphyr::from_str(INVALID_RULE_VALUES).expect("test YAML");
    let global = library["validationTests"]["_global"]["fixtures"].clone();
    library["validationTests"] = json!({
        "_global": { "fixtures": global },
        "route-values-invalid": test,
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("hapwright.yaml");
    std::fs::write(&config, serde_json::to_string(&library).expect("json")).expect("write");
    let output = hapwright(&["test"], &config);
    let report = text(&output);
    assert!(output.status.success(), "{report}");
    assert!(report.contains("1 passed, 0 failed"), "{report}");
}

/// Session persistence values the library refuses, as a `hapwright test` entry.
const INVALID_SESSION_PERSISTENCE: &str =
    include_str!("gateway_library/invalid-session-persistence.yaml");

/// sessionPersistence: a sessionName that is not a token (a newline and a directive
/// in it), a timeout that is not a duration, a Permanent cookie without
/// absoluteTimeout: each fails the render naming the route and rule, and the route's
/// `Accepted` condition is `False` with reason `UnsupportedValue`; nothing of them
/// reaches haproxy.cfg.
#[test]
fn invalid_session_persistence_fails_the_render_and_the_route_is_not_accepted() {
    let mut library = library_value();
    let test: Value = serde_saphyr::from_str(INVALID_SESSION_PERSISTENCE).expect("test YAML");
    let global = library["validationTests"]["_global"]["fixtures"].clone();
    library["validationTests"] = json!({
        "_global": { "fixtures": global },
        "session-persistence-invalid": test,
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("hapwright.yaml");
    std::fs::write(&config, serde_json::to_string(&library).expect("json")).expect("write");
    let output = hapwright(&["test"], &config);
    let report = text(&output);
    assert!(output.status.success(), "{report}");
    assert!(report.contains("1 passed, 0 failed"), "{report}");
}

// === end to end: the library on an HAProxy started as in deploy/sidecar/ ===

/// The Gateway's listener ports.
struct Ports {
    http: u16,
    https: u16,
    passthrough: u16,
    grpc: u16,
}

fn service(namespace: &str, name: &str, port: u16) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name, "namespace": namespace },
        "spec": { "ports": [ { "port": port, "protocol": "TCP" } ] }
    })
}

fn gateway(ports: &Ports) -> Value {
    json!([{
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": { "name": "edge", "namespace": "infra" },
        "spec": {
            "gatewayClassName": "hapwright",
            "listeners": [
                { "name": "http", "protocol": "HTTP", "port": ports.http,
                  "allowedRoutes": { "namespaces": { "from": "All" } } },
                { "name": "https", "protocol": "HTTPS", "port": ports.https,
                  "tls": { "certificateRefs": [ { "name": "shop-tls", "namespace": "shop" } ] },
                  "allowedRoutes": { "namespaces": { "from": "All" } } },
                { "name": "passthrough", "protocol": "TLS", "port": ports.passthrough,
                  "tls": { "mode": "Passthrough" },
                  "allowedRoutes": { "namespaces": { "from": "All" } } },
                { "name": "grpc", "protocol": "HTTP", "port": ports.grpc,
                  "allowedRoutes": { "namespaces": { "from": "All" }, "kinds": [ { "kind": "GRPCRoute" } ] } }
            ]
        }
    }])
}

/// An HTTPRoute of namespace shop on the Gateway's HTTP listener for `hostname`.
fn http_route(name: &str, hostname: &str, rules: Value) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": { "name": name, "namespace": "shop" },
        "spec": {
            "parentRefs": [ { "name": "edge", "namespace": "infra", "sectionName": "http" } ],
            "hostnames": [ hostname ],
            "rules": rules
        }
    })
}

/// The HTTPRoutes: the storefront on every HTTP(S) listener, with `split` as the
/// weights of web and canary on /split, and the ledger route across namespaces.
fn httproutes(split: (u32, u32)) -> Value {
    let prefix = |value: &str| json!({ "path": { "type": "PathPrefix", "value": value } });
    let to = |name: &str| json!([ { "name": name, "port": 80 } ]);
    json!([
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": { "name": "storefront", "namespace": "shop" },
            "spec": {
                "parentRefs": [ { "name": "edge", "namespace": "infra" } ],
                "hostnames": [ "shop.example.test", "passthru.example.test" ],
                "rules": [
                    { "matches": [ prefix("/") ], "backendRefs": to("web") },
                    { "matches": [ prefix("/api") ], "backendRefs": to("api") },
                    { "matches": [ { "path": { "type": "PathPrefix", "value": "/api" },
                                     "headers": [ { "name": "X-Version", "value": "2" } ] } ],
                      "backendRefs": to("api-v2") },
                    { "matches": [ { "path": { "type": "Exact", "value": "/api/health" } } ],
                      "backendRefs": to("web") },
                    { "matches": [ prefix("/old") ],
                      "filters": [ { "type": "RequestRedirect", "requestRedirect": {
                          "hostname": "new.example.test", "statusCode": 301,
                          "path": { "type": "ReplacePrefixMatch", "replacePrefixMatch": "/new" } } } ] },
                    { "matches": [ prefix("/shop-api") ],
                      "filters": [
                          { "type": "URLRewrite", "urlRewrite": {
                              "path": { "type": "ReplacePrefixMatch", "replacePrefixMatch": "/" } } },
                          { "type": "RequestHeaderModifier", "requestHeaderModifier": {
                              "set": [ { "name": "X-Env", "value": "prod" } ], "remove": [ "X-Internal" ] } },
                          { "type": "ResponseHeaderModifier", "responseHeaderModifier": {
                              "set": [ { "name": "X-Served-By", "value": "hapwright" } ] } }
                      ],
                      "backendRefs": to("api") },
                    { "matches": [ prefix("/split") ],
                      "backendRefs": [ { "name": "web", "port": 80, "weight": split.0 },
                                       { "name": "web-canary", "port": 80, "weight": split.1 } ] }
                ]
            }
        },
        http_route(
            "ledger",
            "ledger.example.test",
            json!([ { "backendRefs": [ { "name": "ledger", "namespace": "billing", "port": 80 } ] } ])
        ),
        http_route(
            "reports",
            "slow.example.test",
            json!([
                { "matches": [ prefix("/request") ],
                  "timeouts": { "request": "1s" }, "backendRefs": to("slow") },
                { "matches": [ prefix("/backend-request") ],
                  "timeouts": { "request": "10s", "backendRequest": "1s" }, "backendRefs": to("slow") },
                { "matches": [ prefix("/retry") ],
                  "retry": { "codes": [ 503 ], "attempts": 1 }, "backendRefs": to("slow") },
                { "matches": [ prefix("/no-retry") ], "backendRefs": to("slow") },
                { "matches": [ prefix("/cors") ],
                  "filters": [ { "type": "CORS", "cors": {
                      "allowOrigins": [ "https://*.example.test" ], "allowMethods": [ "PUT" ],
                      "allowHeaders": [ "X-Token" ], "exposeHeaders": [ "X-Request-Id" ],
                      "allowCredentials": true, "maxAge": 600 } } ],
                  "backendRefs": to("slow") }
            ])
        ),
        http_route("grpc-relay", "grpc.example.test", json!([ { "backendRefs": to("api") } ]))
    ])
}

/// `_global`'s ReferenceGrants (the Gateway may use the shop's certificate), plus,
/// with `ledger`, the one that lets shop's HTTPRoutes use billing/ledger.
fn referencegrants(ledger: bool) -> Value {
    let library = library_value();
    let mut grants = library["validationTests"]["_global"]["fixtures"]["referencegrants"].clone();
    if ledger {
        grants.as_array_mut().expect("grants").push(json!({
            "apiVersion": "gateway.networking.k8s.io/v1beta1",
            "kind": "ReferenceGrant",
            "metadata": { "name": "shop-to-ledger", "namespace": "billing" },
            "spec": {
                "from": [ { "group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "shop" } ],
                "to": [ { "group": "", "kind": "Service", "name": "ledger" } ]
            }
        }));
    }
    grants
}

#[test]
fn the_library_routes_real_traffic() {
    let ports = Ports {
        http: free_port(),
        https: free_port(),
        passthrough: free_port(),
        grpc: free_port(),
    };
    let upstreams: Vec<(&str, &str, u16)> = vec![
        ("shop", "web", upstream("web")),
        ("shop", "web-canary", upstream("canary")),
        ("shop", "api", upstream("api")),
        ("shop", "api-v2", upstream("api-v2")),
        ("billing", "ledger", upstream("ledger")),
        ("shop", "slow", upstream("slow")),
        // TLS passthrough goes to the Gateway's own HTTPS listener: only a listener
        // holding the certificate can complete the handshake.
        ("shop", "loopback-https", ports.https),
        // gRPC goes over HTTP/2 (`proto h2`) to the Gateway's HTTP listener, which
        // speaks cleartext HTTP/2 and relays to an HTTP/1.1 upstream.
        ("shop", "loopback-http", ports.http),
    ];

    let config = library::gateway_config();

    let library = library_value();
    let global = &library["validationTests"]["_global"]["fixtures"];
    let services: Vec<Value> = upstreams
        .iter()
        .map(|(ns, name, _)| service(ns, name, 80))
        .collect();
    let slices: Vec<Value> = upstreams
        .iter()
        .map(|(ns, name, port)| library::loopback_slice(ns, name, "", &[*port]))
        .collect();
    let tlsroutes = json!([{
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "TLSRoute",
        "metadata": { "name": "passthru", "namespace": "shop" },
        "spec": {
            "parentRefs": [ { "name": "edge", "namespace": "infra", "sectionName": "passthrough" } ],
            "hostnames": [ "passthru.example.test" ],
            "rules": [ { "backendRefs": [ { "name": "loopback-https", "port": 80 } ] } ]
        }
    }]);
    let grpcroutes = json!([{
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GRPCRoute",
        "metadata": { "name": "catalog", "namespace": "shop" },
        "spec": {
            "parentRefs": [ { "name": "edge", "namespace": "infra", "sectionName": "grpc" } ],
            "hostnames": [ "grpc.example.test" ],
            "rules": [ {
                "matches": [ { "method": { "service": "shop.Catalog", "method": "GetItem" } } ],
                "backendRefs": [ { "name": "loopback-http", "port": 80 } ]
            } ]
        }
    }]);
    let resources = [
        ("gatewayclasses", global["gatewayclasses"].clone()),
        ("gateways", gateway(&ports)),
        ("httproutes", httproutes((3, 1))),
        ("grpcroutes", grpcroutes),
        ("tlsroutes", tlsroutes),
        ("tcproutes", json!([])),
        ("referencegrants", referencegrants(false)),
        ("namespaces", global["namespaces"].clone()),
        ("services", Value::Array(services)),
        ("endpointslices", Value::Array(slices)),
        ("secrets", global["secrets"].clone()),
    ];
    let client = reqwest::blocking::Client::builder()
        .resolve("shop.example.test", ([127, 0, 0, 1], ports.https).into())
        .resolve(
            "passthru.example.test",
            ([127, 0, 0, 1], ports.passthrough).into(),
        )
        .resolve(
            "other.example.test",
            ([127, 0, 0, 1], ports.passthrough).into(),
        );
    let sidecar = Sidecar::start("hapwright-gateway-", config, &resources, ports.http, client);
    let http = ports.http;
    let send = |request: reqwest::blocking::RequestBuilder| {
        sidecar
            .send(request)
            .unwrap_or_else(|e| sidecar.fail(&format!("request failed: {e}")))
    };
    let get = |path: &str| {
        sidecar
            .client
            .get(format!("http://127.0.0.1:{http}{path}"))
            .header(reqwest::header::HOST, "shop.example.test")
    };

    // Routing precedence: the longest prefix on path segments, a header match over
    // the same prefix without one, an exact path over both.
    sidecar.expect(http, "shop.example.test", "/", 200, "web\n");
    sidecar.expect(http, "Shop.Example.Test:80", "/cart", 200, "web\n");
    sidecar.expect(http, "shop.example.test", "/api/orders", 200, "api\n");
    sidecar.expect(http, "shop.example.test", "/apis", 200, "web\n");
    sidecar.expect(http, "unknown.example.test", "/", 404, "no route - 404");
    let (status, _, body) = send(get("/api/orders").header("X-Version", "2"));
    assert_eq!(
        (status, body.lines().next()),
        (200, Some("api-v2")),
        "{body}"
    );
    let (status, _, body) = send(get("/api/health").header("X-Version", "2"));
    assert_eq!((status, body.lines().next()), (200, Some("web")), "{body}");

    // A redirect: new host, the matched prefix replaced, the query kept.
    let (status, location, _) = send(get("/old/page?q=1"));
    assert_eq!(status, 301);
    assert_eq!(
        location,
        format!("http://new.example.test:{http}/new/page?q=1")
    );

    // A rewrite with header changes: the prefix is replaced by "/", X-Env is set,
    // X-Internal removed, and the response gets X-Served-By.
    let response = get("/shop-api/v1/items?q=2")
        .header("X-Internal", "secret")
        .send()
        .unwrap_or_else(|e| sidecar.fail(&format!("{e:?}")));
    assert_eq!(
        response
            .headers()
            .get("x-served-by")
            .and_then(|v| v.to_str().ok()),
        Some("hapwright")
    );
    let body = response.text().expect("body").to_lowercase();
    assert!(
        body.starts_with("api\nget /v1/items?q=2 http/1.1\r\n"),
        "{body}"
    );
    assert!(body.contains("\r\nx-env: prod\r\n"), "{body}");
    assert!(!body.contains("x-internal"), "{body}");

    // Weights 3:1 over web and canary (round robin: every cycle of 4 sends 3 to web).
    let split = |n: usize| -> (usize, usize) {
        let mut counts = (0, 0);
        for _ in 0..n {
            let (_, _, body) = send(get("/split"));
            match body.lines().next() {
                Some("web") => counts.0 += 1,
                Some("canary") => counts.1 += 1,
                other => sidecar.fail(&format!("/split answered by {other:?}")),
            }
        }
        counts
    };
    let (web, canary) = split(200);
    // 150:50 on 2.6 to 3.2. HAProxy 3.4's round robin over its threads is not exact:
    // 40 requests were seen to split anywhere from 31:9 to 21:19, and 200 requests
    // from 146:54 to 129:71. The check asks for a split clearly away from the
    // 100:100 of equal weights, over enough requests for 3.4's spread.
    assert!(
        2 * web >= 3 * canary && canary >= 25,
        "3:1 weights sent {web} to web and {canary} to canary"
    );

    // The weights change to 0:1: a runtime-only deployment, and the canary gets all.
    let reloads = sidecar.master_reloads();
    let deployed = sidecar.change("httproutes", &httproutes((0, 1)));
    assert_eq!(deployed["last_strategy"], "runtime", "{deployed}");
    assert_eq!(sidecar.master_reloads(), reloads, "HAProxy did not reload");
    assert_eq!(split(12), (0, 12));

    // TLS with SNI: the HTTPS listener serves the shop's certificate.
    let (status, _, body) = send(
        sidecar
            .client
            .get(format!("https://shop.example.test:{}/", ports.https)),
    );
    assert_eq!((status, body.lines().next()), (200, Some("web")), "{body}");

    // A second HTTPS listener with its own certificate Secret: served for its
    // hostname at once, without a reload, and gone again the same way.
    let reloads = sidecar.master_reloads();
    let mut with_apps = gateway(&ports);
    with_apps[0]["spec"]["listeners"]
        .as_array_mut()
        .expect("listeners")
        .push(json!({
            "name": "https-apps", "protocol": "HTTPS", "port": ports.https,
            "hostname": "*.apps.example.test",
            "tls": { "certificateRefs": [ { "name": "apps-wildcard-tls" } ] },
            "allowedRoutes": { "namespaces": { "from": "All" } }
        }));
    let deployed = sidecar.change("gateways", &with_apps);
    assert_eq!(deployed["last_strategy"], "runtime", "{deployed}");
    let apps = sidecar.served_certificate(ports.https, "a.apps.example.test");
    assert!(apps.contains("apps.example.test"), "{apps}");
    let deployed = sidecar.change("gateways", &gateway(&ports));
    assert_eq!(deployed["last_strategy"], "runtime", "{deployed}");
    let back = sidecar.served_certificate(ports.https, "a.apps.example.test");
    assert!(back.contains("shop.example.test"), "{back}");
    assert_eq!(sidecar.master_reloads(), reloads, "HAProxy did not reload");

    // TLS passthrough: the TLS listener holds no certificate and forwards the
    // connection for the TLSRoute's SNI (here to the HTTPS listener, which completes
    // the handshake and routes); an SNI without a TLSRoute is refused.
    let (status, _, body) = send(sidecar.client.get(format!(
        "https://passthru.example.test:{}/",
        ports.passthrough
    )));
    assert_eq!((status, body.lines().next()), (200, Some("web")), "{body}");
    let refused = sidecar
        .client
        .get(format!("https://other.example.test:{}/", ports.passthrough))
        .send();
    assert!(refused.is_err(), "{refused:?}");

    // GRPCRoute: the service and method route over HTTP/2 (cleartext, prior
    // knowledge, as gRPC clients connect); another method of the service has no route.
    let h2 = reqwest::blocking::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .resolve("grpc.example.test", ([127, 0, 0, 1], ports.grpc).into())
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .expect("HTTP/2 client");
    let grpc = |method: &str| {
        sidecar.send(
            h2.post(format!(
                "http://grpc.example.test:{}/shop.Catalog/{method}",
                ports.grpc
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(vec![0u8, 0, 0, 0, 0]),
        )
    };
    match grpc("GetItem") {
        Ok((200, _, body)) => assert!(
            body.starts_with("api\nPOST /shop.Catalog/GetItem HTTP/1.1\r\n"),
            "{body}"
        ),
        other => sidecar.fail(&format!("gRPC GetItem: {other:?}")),
    }
    match grpc("ListItems") {
        Ok((404, _, _)) => {}
        other => sidecar.fail(&format!("gRPC ListItems: expected 404, got {other:?}")),
    }

    // A backendRef to another namespace: 500 without a ReferenceGrant, routed with;
    // the route's status says why, then that its references resolve.
    sidecar.expect(http, "ledger.example.test", "/", 500, "");
    assert_eq!(
        resolved_refs(&sidecar, "ledger"),
        ("False".to_owned(), "RefNotPermitted".to_owned())
    );
    sidecar.change("referencegrants", &referencegrants(true));
    sidecar.expect(http, "ledger.example.test", "/", 200, "ledger\n");
    let resolved = poll(WAIT, || {
        let condition = resolved_refs(&sidecar, "ledger");
        (condition.0 == "True").then_some(condition)
    })
    .unwrap_or_else(|_| sidecar.fail("the ledger route's ResolvedRefs never became True"));
    assert_eq!(resolved.1, "ResolvedRefs");

    // HTTPRouteRetry: a 503 listed in codes is retried (the backend fails every other
    // request), so the client gets the second answer; without retry it gets the 503.
    sidecar.expect(
        http,
        "slow.example.test",
        "/retry?fail-every-other",
        200,
        "slow\n",
    );
    sidecar.expect(
        http,
        "slow.example.test",
        "/no-retry?fail-every-other",
        503,
        "slow\n",
    );
    sidecar.expect(
        http,
        "slow.example.test",
        "/no-retry?fail-every-other",
        200,
        "slow\n",
    );

    // HTTPCORSFilter: a preflight from an allowed origin (a wildcard host) is answered
    // by the gateway with the allowed method, headers, credentials and maxAge; one
    // from another origin gets no CORS headers. An actual request from an allowed
    // origin gets Access-Control-Allow-Origin (the request's Origin, as credentials
    // are allowed) and the exposed headers; one from another origin does not.
    let cors = |method: reqwest::Method, origin: &str| {
        let response = sidecar
            .client
            .request(method, format!("http://127.0.0.1:{http}/cors/items"))
            .header(reqwest::header::HOST, "slow.example.test")
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "PUT")
            .send()
            .unwrap_or_else(|e| sidecar.fail(&format!("CORS request: {e}")));
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let headers = [
            "access-control-allow-origin",
            "access-control-allow-methods",
            "access-control-allow-headers",
            "access-control-allow-credentials",
            "access-control-max-age",
            "access-control-expose-headers",
        ]
        .map(header);
        (response.status().as_u16(), headers)
    };
    let origin = "https://app.example.test";
    let some = |v: &str| Some(v.to_owned());
    assert_eq!(
        cors(reqwest::Method::OPTIONS, origin),
        (
            204,
            [
                some(origin),
                some("PUT"),
                some("X-Token"),
                some("true"),
                some("600"),
                None
            ]
        )
    );
    assert_eq!(
        cors(reqwest::Method::OPTIONS, "https://evil.test"),
        (204, [None, None, None, None, None, None])
    );
    assert_eq!(
        cors(reqwest::Method::GET, origin),
        (
            200,
            [
                some(origin),
                None,
                None,
                some("true"),
                None,
                some("X-Request-Id")
            ]
        )
    );
    assert_eq!(
        cors(reqwest::Method::GET, "https://example.test.evil.test"),
        (200, [None, None, None, None, None, None])
    );

    // HTTPRouteTimeouts: the gateway answers 504 when the backend has not answered
    // within the request timeout, or within backendRequest (the timeout of each
    // request to a backend); a faster answer passes.
    // (The slow backend answers one request at a time: the fast requests go first.)
    sidecar.expect(
        http,
        "slow.example.test",
        "/request?delay-ms=100",
        200,
        "slow\n",
    );
    sidecar.expect(
        http,
        "slow.example.test",
        "/backend-request?delay-ms=100",
        200,
        "slow\n",
    );
    sidecar.expect(http, "slow.example.test", "/request?delay-ms=2500", 504, "");
    sidecar.expect(
        http,
        "slow.example.test",
        "/backend-request?delay-ms=2500",
        504,
        "",
    );

    // A timeout that is not a Gateway API duration (here trying to add a line) fails
    // the render naming the route and rule: quarantine holds that route back, and the
    // other routes keep serving: the weight change beside it deploys.
    let mut routes = httproutes((1, 0));
    routes.as_array_mut().expect("routes").push(http_route(
        "bad-timeout",
        "bad.example.test",
        json!([ { "timeouts": { "request": "1s\n    timeout server 1" },
                  "backendRefs": [ { "name": "web", "port": 80 } ] } ]),
    ));
    sidecar.change("httproutes", &routes);
    let quarantine = sidecar.quarantine(1);
    let held = &quarantine["objects"][0];
    assert_eq!(held["name"], "bad-timeout", "{quarantine}");
    assert!(
        quarantine
            .to_string()
            .contains("HTTPRoute shop/bad-timeout rule 0: timeouts.request"),
        "{quarantine}"
    );
    sidecar.expect(http, "bad.example.test", "/", 404, "no route - 404");
    sidecar.expect(http, "shop.example.test", "/", 200, "web\n");
    assert_eq!(split(4), (4, 0));
    let deployed = sidecar.deployed_config();
    assert!(!deployed.contains("hr_shop_bad-timeout"), "{deployed}");
}

/// The `ResolvedRefs` condition (status, reason) of HTTPRoute `shop/<route>`'s first
/// parent, as `/debug/status` shows the last rendered statuses (objects of `files`
/// sources are rendered, never written), waiting until it is rendered.
fn resolved_refs(sidecar: &Sidecar, route: &str) -> (String, String) {
    poll(WAIT, || {
        let status = sidecar.rendered_status("httproutes", "shop", route)?;
        let condition = status["parents"][0]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "ResolvedRefs")?;
        Some((
            condition["status"].as_str()?.to_owned(),
            condition["reason"].as_str()?.to_owned(),
        ))
    })
    .unwrap_or_else(|_| sidecar.fail(&format!("no status rendered for HTTPRoute shop/{route}")))
}

/// The rendered status of `resource` `namespace/name` as `/debug/status` shows the
/// last rendered statuses, once `done` accepts it.
fn status_where(
    sidecar: &Sidecar,
    resource: &str,
    object: (&str, &str),
    done: impl Fn(&Value) -> bool,
) -> Value {
    poll(WAIT, || {
        let status = sidecar.rendered_status(resource, object.0, object.1)?;
        done(&status).then_some(status)
    })
    .unwrap_or_else(|_| {
        sidecar.fail(&format!(
            "{resource} {}/{}: the status never rendered as expected",
            object.0, object.1
        ))
    })
}

/// Condition `kind` (status, reason) of the first parent of route `resource`
/// `namespace/name`, once `done` accepts it.
fn condition_where(
    sidecar: &Sidecar,
    resource: &str,
    object: (&str, &str),
    kind: &str,
    done: impl Fn(&(String, String)) -> bool,
) -> (String, String) {
    let find = |status: &Value| -> Option<(String, String)> {
        let condition = status["parents"][0]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == kind)?;
        Some((
            condition["status"].as_str()?.to_owned(),
            condition["reason"].as_str()?.to_owned(),
        ))
    };
    let status = status_where(sidecar, resource, object, |status| {
        find(status).is_some_and(|c| done(&c))
    });
    find(&status).unwrap_or_else(|| sidecar.fail("the condition vanished"))
}

/// The ReferenceGrant that lets `from_kind`s of namespace shop use billing/ledger.
fn ledger_grant(from_kind: &str) -> Value {
    json!([{
        "apiVersion": "gateway.networking.k8s.io/v1beta1",
        "kind": "ReferenceGrant",
        "metadata": { "name": "shop-to-ledger", "namespace": "billing" },
        "spec": {
            "from": [ { "group": "gateway.networking.k8s.io", "kind": from_kind, "namespace": "shop" } ],
            "to": [ { "group": "", "kind": "Service", "name": "ledger" } ]
        }
    }])
}

/// The fixtures every end-to-end test below shares, then `routes` and `grants`.
fn resources_with(
    gateways: Value,
    upstreams: &[(&str, &str, u16)],
    routes: &[(&'static str, Value)],
    grants: Value,
) -> Vec<(&'static str, Value)> {
    let library = library_value();
    let global = &library["validationTests"]["_global"]["fixtures"];
    let services: Vec<Value> = upstreams
        .iter()
        .map(|(ns, name, _)| service(ns, name, 80))
        .collect();
    let slices: Vec<Value> = upstreams
        .iter()
        .map(|(ns, name, port)| library::loopback_slice(ns, name, "", &[*port]))
        .collect();
    let mut resources = vec![
        ("gatewayclasses", global["gatewayclasses"].clone()),
        ("gateways", gateways),
        ("referencegrants", grants),
        ("namespaces", global["namespaces"].clone()),
        ("services", Value::Array(services)),
        ("endpointslices", Value::Array(slices)),
        ("secrets", json!([])),
    ];
    for kind in ["httproutes", "grpcroutes", "tlsroutes", "tcproutes"] {
        let objects = routes
            .iter()
            .find(|(name, _)| *name == kind)
            .map_or(json!([]), |(_, objects)| objects.clone());
        resources.push((kind, objects));
    }
    resources
}

/// HTTPRoutePartiallyInvalidViaInvalidReferenceGrant: a rule whose backendRefs are
/// web (weight 3) and billing/ledger (weight 1) without a ReferenceGrant sends three
/// requests in four to web and answers the fourth 500, exactly as a rule without a
/// usable backendRef answers; the route is Accepted and its ResolvedRefs is False,
/// RefNotPermitted. A ReferenceGrant gives the fourth to the ledger, and its removal
/// takes it back: both at runtime (the 500 share is a server, `add server` takes its
/// abstract socket), without a reload.
#[test]
fn a_partially_invalid_rule_answers_500_for_the_share_of_its_unusable_backend_refs() {
    let http = free_port();
    let upstreams: Vec<(&str, &str, u16)> = vec![
        ("shop", "web", upstream("web")),
        ("billing", "ledger", upstream("ledger")),
    ];
    let prefix = |value: &str| json!([ { "path": { "type": "PathPrefix", "value": value } } ]);
    let web = json!([ { "name": "web", "port": 80 } ]);
    let routes = json!([http_route(
        "partial",
        "partial.example.test",
        json!([
            { "matches": prefix("/split"),
              "backendRefs": [ { "name": "web", "port": 80, "weight": 3 },
                               { "name": "ledger", "namespace": "billing", "port": 80, "weight": 1 } ] },
            { "matches": prefix("/none"), "backendRefs": [ { "name": "ghost", "port": 80 } ] },
            // More servers, so taking the ledger's away again is a small part of
            // what is served (the safety valve would hold a large removal back).
            { "matches": prefix("/a"), "backendRefs": web },
            { "matches": prefix("/b"), "backendRefs": web },
            { "matches": prefix("/c"), "backendRefs": web }
        ])
    )]);
    let resources = resources_with(
        library::edge_gateway(json!([ { "name": "http", "protocol": "HTTP", "port": http,
                               "allowedRoutes": { "namespaces": { "from": "All" } } } ])),
        &upstreams,
        &[("httproutes", routes)],
        json!([]),
    );
    let sidecar = Sidecar::start(
        "hapwright-gateway-partial-",
        library::gateway_config(),
        &resources,
        http,
        reqwest::blocking::Client::builder(),
    );
    let answer = |path: &str| {
        let response = sidecar
            .client
            .get(format!("http://127.0.0.1:{http}{path}"))
            .header(reqwest::header::HOST, "partial.example.test")
            .send()
            .unwrap_or_else(|e| sidecar.fail(&format!("{path}: {e}")));
        let status = response.status().as_u16();
        let mut headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_owned()))
            .collect();
        headers.sort();
        let body = response.text().unwrap_or_default();
        (status, headers, body)
    };
    let split = |n: usize| -> (usize, usize, usize) {
        let mut counts = (0, 0, 0);
        for _ in 0..n {
            let (status, _, body) = answer("/split");
            match (status, body.lines().next()) {
                (200, Some("web")) => counts.0 += 1,
                (200, Some("ledger")) => counts.1 += 1,
                (500, _) => counts.2 += 1,
                other => sidecar.fail(&format!("/split answered {other:?}")),
            }
        }
        counts
    };
    // A change and the deployment that applies it (a removal waits for the files
    // source's quiet period, so the write's own deployment may change nothing).
    let deploy = |name: &str, objects: &Value| -> Value {
        let before = sidecar.instance()["deployments"].as_u64();
        library::write_objects(sidecar.dir.path(), name, objects);
        poll(WAIT, || {
            let instance = sidecar.instance();
            (instance["deployments"].as_u64() > before && instance["last_strategy"] != "noop")
                .then_some(instance)
        })
        .unwrap_or_else(|_| sidecar.fail(&format!("the change of {name} was never deployed")))
    };

    // The unusable share answers 500 as a rule with no usable backendRef does:
    // the same status, headers and (empty) body.
    let none = answer("/none");
    assert_eq!((none.0, none.2.as_str()), (500, ""), "{none:?}");
    let (web, ledger, errors) = split(200);
    assert_eq!(ledger, 0);
    // 150:50 on 2.6 to 3.2; HAProxy 3.4's round robin over threads is not exact
    // (see the weights in the_library_routes_real_traffic): a split clearly away
    // from 1:1 and from all-or-nothing.
    assert!(
        2 * web >= 3 * errors && errors >= 25,
        "3:1 weights sent {web} to web and answered {errors} with 500"
    );
    // Any one 500 of the share (HAProxy 3.4's round robin over threads can send
    // a run of requests to the other server).
    let failed = (0..40)
        .map(|_| answer("/split"))
        .find(|(status, _, _)| *status == 500)
        .unwrap_or_else(|| sidecar.fail("no 500 in 40 requests"));
    assert_eq!(failed, none, "the unusable share's 500 is the usual 500");

    // The route is accepted; ResolvedRefs says which reference is refused.
    let object = ("shop", "partial");
    let resolved = condition_where(&sidecar, "httproutes", object, "ResolvedRefs", |_| true);
    assert_eq!(resolved, ("False".to_owned(), "RefNotPermitted".to_owned()));
    let accepted = condition_where(&sidecar, "httproutes", object, "Accepted", |_| true);
    assert_eq!(accepted, ("True".to_owned(), "Accepted".to_owned()));

    // A ReferenceGrant: the ledger gets the fourth request, no more 500s, without
    // a reload.
    let reloads = sidecar.master_reloads();
    let deployed = deploy("referencegrants", &ledger_grant("HTTPRoute"));
    assert_eq!(deployed["last_strategy"], "runtime", "{deployed}");
    let (web, ledger, errors) = split(200);
    assert_eq!(errors, 0, "{web}:{ledger}");
    assert!(
        2 * web >= 3 * ledger && ledger >= 25,
        "3:1 weights sent {web} to web and {ledger} to the ledger"
    );
    // The ledger resolves; ResolvedRefs names the next unusable one (/none's).
    let resolved = condition_where(&sidecar, "httproutes", object, "ResolvedRefs", |c| {
        c.1 != "RefNotPermitted"
    });
    assert_eq!(resolved, ("False".to_owned(), "BackendNotFound".to_owned()));
    assert!(
        !sidecar
            .deployed_config()
            .contains("server gw-invalid-backendrefs")
    );

    // The ReferenceGrant goes: the fourth answers 500 again, also at runtime.
    let deployed = deploy("referencegrants", &json!([]));
    assert_eq!(deployed["last_strategy"], "runtime", "{deployed}");
    assert_eq!(sidecar.master_reloads(), reloads, "HAProxy did not reload");
    let (web, ledger, errors) = split(200);
    assert_eq!(ledger, 0, "{web}:{errors}");
    assert!(2 * web >= 3 * errors && errors >= 25, "{web}:{errors}");
}

/// A TCP server on loopback that greets every connection with `name` and a
/// newline, then echoes what it receives. It lives as long as the test process.
fn tcp_upstream(name: &'static str) -> u16 {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind TCP upstream");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                if stream.write_all(format!("{name}\n").as_bytes()).is_err() {
                    return;
                }
                let mut buffer = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buffer) {
                    if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// Connects to `port`, sends `ping` and returns the greeting's name and the echo,
/// or `None` when the connection is closed without an answer (refused).
fn tcp_exchange(port: u16) -> Option<(String, String)> {
    use std::io::{BufRead, BufReader, Write};
    let stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut greeting = String::new();
    if reader.read_line(&mut greeting).ok()? == 0 {
        return None;
    }
    (&stream).write_all(b"ping\n").ok()?;
    let mut echo = String::new();
    reader.read_line(&mut echo).ok()?;
    Some((greeting.trim_end().to_owned(), echo.trim_end().to_owned()))
}

/// TCPRoute: a TCP listener forwards connections to its TCPRoute's backends by
/// weight, refusing the share of a backendRef that cannot be used (here a Service
/// that does not exist, weight 1 against 3); a second, newer TCPRoute on the same
/// listener is accepted but Conflicted and serves once the older one is gone; a
/// backendRef to another namespace is refused until a ReferenceGrant allows it.
#[test]
fn tcp_routes_forward_real_connections() {
    let db = free_port();
    let queue = free_port();
    let upstreams: Vec<(&str, &str, u16)> = vec![
        ("shop", "db-primary", tcp_upstream("db-primary")),
        ("shop", "db-replica", tcp_upstream("db-replica")),
        ("billing", "ledger", tcp_upstream("ledger")),
    ];
    let tcp_route = |name: &str, timestamp: &str, section: &str, refs: Value| {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1alpha2",
            "kind": "TCPRoute",
            "metadata": { "name": name, "namespace": "shop", "creationTimestamp": timestamp },
            "spec": {
                "parentRefs": [ { "name": "edge", "namespace": "infra", "sectionName": section } ],
                "rules": [ { "backendRefs": refs } ]
            }
        })
    };
    let primary = tcp_route(
        "primary",
        "2026-01-01T00:00:00Z",
        "db",
        json!([ { "name": "db-primary", "port": 80, "weight": 3 },
                { "name": "ghost", "port": 80, "weight": 1 } ]),
    );
    let replica = tcp_route(
        "replica",
        "2026-01-02T00:00:00Z",
        "db",
        json!([ { "name": "db-replica", "port": 80 } ]),
    );
    let ledger = tcp_route(
        "ledger",
        "2026-01-03T00:00:00Z",
        "queue",
        json!([ { "name": "ledger", "namespace": "billing", "port": 80 } ]),
    );
    let resources = resources_with(
        library::edge_gateway(json!([
            { "name": "db", "protocol": "TCP", "port": db,
              "allowedRoutes": { "namespaces": { "from": "All" } } },
            { "name": "queue", "protocol": "TCP", "port": queue,
              "allowedRoutes": { "namespaces": { "from": "All" }, "kinds": [ { "kind": "TCPRoute" } ] } }
        ])),
        &upstreams,
        &[(
            "tcproutes",
            json!([primary.clone(), replica.clone(), ledger.clone()]),
        )],
        json!([]),
    );
    let sidecar = Sidecar::start(
        "hapwright-gateway-tcp-",
        library::gateway_config(),
        &resources,
        db,
        reqwest::blocking::Client::builder(),
    );

    // Weights 3:1 over the primary and the missing Service: a connection in four
    // is refused; the replica's newer route does not serve while the primary's does.
    let connections = |n: usize| -> (usize, usize, usize) {
        let mut counts = (0, 0, 0);
        for _ in 0..n {
            match tcp_exchange(db) {
                Some((name, echo)) if name == "db-primary" && echo == "ping" => counts.0 += 1,
                Some((name, echo)) if name == "db-replica" && echo == "ping" => counts.1 += 1,
                None => counts.2 += 1,
                other => sidecar.fail(&format!("unexpected answer {other:?}")),
            }
        }
        counts
    };
    let (served, replica_served, refused) = connections(200);
    assert_eq!(replica_served, 0);
    assert!(
        2 * served >= 3 * refused && refused >= 25,
        "3:1 weights served {served} connections and refused {refused}"
    );
    let primary_status = ("shop", "primary");
    assert_eq!(
        condition_where(
            &sidecar,
            "tcproutes",
            primary_status,
            "ResolvedRefs",
            |_| true
        ),
        ("False".to_owned(), "BackendNotFound".to_owned())
    );
    assert_eq!(
        condition_where(&sidecar, "tcproutes", primary_status, "Accepted", |_| true),
        ("True".to_owned(), "Accepted".to_owned())
    );
    let replica_status = ("shop", "replica");
    assert_eq!(
        condition_where(&sidecar, "tcproutes", replica_status, "Accepted", |_| true),
        ("True".to_owned(), "Accepted".to_owned())
    );
    assert_eq!(
        condition_where(
            &sidecar,
            "tcproutes",
            replica_status,
            "hapwright.io/Conflicted",
            |_| true
        ),
        ("True".to_owned(), "PortConflict".to_owned())
    );

    // Another namespace's Service: refused until a ReferenceGrant allows it.
    assert_eq!(tcp_exchange(queue), None);
    assert_eq!(
        condition_where(
            &sidecar,
            "tcproutes",
            ("shop", "ledger"),
            "ResolvedRefs",
            |_| true
        ),
        ("False".to_owned(), "RefNotPermitted".to_owned())
    );
    sidecar.change("referencegrants", &ledger_grant("TCPRoute"));
    assert_eq!(
        tcp_exchange(queue),
        Some(("ledger".to_owned(), "ping".to_owned()))
    );
    assert_eq!(
        condition_where(
            &sidecar,
            "tcproutes",
            ("shop", "ledger"),
            "ResolvedRefs",
            |c| { c.0 == "True" }
        ),
        ("True".to_owned(), "ResolvedRefs".to_owned())
    );

    status_where(&sidecar, "gateways", ("infra", "edge"), |status| {
        status["listeners"][0]["attachedRoutes"] == 2
    });

    // The older route goes: the replica's route serves the listener.
    sidecar.change("tcproutes", &json!([replica, ledger]));
    assert_eq!(connections(8), (0, 8, 0));
    assert_eq!(
        condition_where(
            &sidecar,
            "tcproutes",
            replica_status,
            "hapwright.io/Conflicted",
            |c| c.0 == "False"
        ),
        ("False".to_owned(), "NoConflicts".to_owned())
    );
    // The listener counts the routes attached to it, and supports TCPRoutes only.
    let gateway = status_where(&sidecar, "gateways", ("infra", "edge"), |status| {
        status["listeners"][0]["attachedRoutes"] == 1
    });
    assert_eq!(
        gateway["listeners"][0]["supportedKinds"],
        json!([ { "group": "gateway.networking.k8s.io", "kind": "TCPRoute" } ]),
        "{gateway}"
    );
    assert_eq!(gateway["listeners"][1]["attachedRoutes"], 1, "{gateway}");
}

/// sessionPersistence (Cookie) end to end: of a Service with three endpoints, requests
/// without the cookie are spread and each answer sets it (a Permanent cookie: Max-Age
/// is absoluteTimeout); a client sending it back stays on one endpoint. A new endpoint
/// is an `add server` without a reload, and a client the new server answered sticks to
/// it too (HAProxy 2.6 computes the new server's cookie only when told to); a client
/// of an endpoint that was removed is served by another one and gets its cookie.
#[test]
fn session_persistence_keeps_a_client_on_one_endpoint_across_endpoint_changes() {
    let http = free_port();
    let first = [upstream("s1"), upstream("s2"), upstream("s3")];
    let added = upstream("s4");
    let mut config = library::gateway_config();
    config["extraContext"]["sessionCookieKey"] = json!("test-k3y-0f1e2d");
    let library = library_value();
    let global = &library["validationTests"]["_global"]["fixtures"];
    let gateways =
        library::edge_gateway(json!([ { "name": "http", "protocol": "HTTP", "port": http,
                             "allowedRoutes": { "namespaces": { "from": "All" } } } ]));
    let routes = json!([http_route(
        "sticky",
        "sticky.example.test",
        json!([ {
            "sessionPersistence": { "sessionName": "GW_SESSION", "idleTimeout": "30m",
                                    "absoluteTimeout": "1h",
                                    "cookieConfig": { "lifetimeType": "Permanent" } },
            "backendRefs": [ { "name": "sticky", "port": 80 } ]
        } ])
    )]);
    let slices = |ports: &[u16]| json!([library::loopback_slice("shop", "sticky", "", ports)]);
    let resources = [
        ("gatewayclasses", global["gatewayclasses"].clone()),
        ("gateways", gateways),
        ("httproutes", routes),
        ("grpcroutes", json!([])),
        ("tlsroutes", json!([])),
        ("referencegrants", json!([])),
        ("namespaces", global["namespaces"].clone()),
        ("services", json!([service("shop", "sticky", 80)])),
        ("endpointslices", slices(&first)),
        ("secrets", json!([])),
    ];
    let sidecar = Sidecar::start(
        "hapwright-gateway-sticky-",
        config,
        &resources,
        http,
        reqwest::blocking::Client::builder(),
    );
    // One request, with `cookie` sent back when given: who answered and the cookie
    // the answer set ("" when none).
    let ask = |cookie: Option<&str>| -> (String, String) {
        let mut request = sidecar
            .client
            .get(format!("http://127.0.0.1:{http}/"))
            .header(reqwest::header::HOST, "sticky.example.test");
        if let Some(cookie) = cookie {
            request = request.header(reqwest::header::COOKIE, cookie);
        }
        let response = request
            .send()
            .unwrap_or_else(|e| sidecar.fail(&format!("request: {e}")));
        let set_cookie = response
            .headers()
            .get(reqwest::header::SET_COOKIE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let status = response.status().as_u16();
        let body = response.text().unwrap_or_default();
        assert_eq!(status, 200, "{body}");
        (
            body.lines().next().unwrap_or_default().to_owned(),
            set_cookie,
        )
    };
    let deployed = sidecar.deployed_config();
    assert!(
        deployed.contains(
            "    cookie GW_SESSION insert indirect nocache dynamic maxidle 1800s maxlife 3600s attr \"Max-Age=3600\"\n    dynamic-cookie-key test-k3y-0f1e2d\n"
        ) && deployed.contains("backend hr_shop_sticky_0 from routes_sp_GW_SESSION_1800_3600_p\n"),
        "{deployed}"
    );

    // Without the cookie: spread over the endpoints, each answer setting the cookie.
    // (HAProxy 3.x's round robin over threads is not exact: up to 30 requests.)
    let mut spread = std::collections::BTreeMap::<String, String>::new();
    for _ in 0..30 {
        if spread.len() == 3 {
            break;
        }
        let (server, set_cookie) = ask(None);
        assert!(
            set_cookie.starts_with("GW_SESSION=") && set_cookie.contains("Max-Age=3600"),
            "{set_cookie}"
        );
        spread.insert(
            server,
            set_cookie.split(';').next().unwrap_or_default().to_owned(),
        );
    }
    assert_eq!(
        spread.keys().map(String::as_str).collect::<Vec<_>>(),
        ["s1", "s2", "s3"],
        "round robin without the cookie"
    );
    // With it: every request to the endpoint that set it.
    for (server, cookie) in &spread {
        for _ in 0..10 {
            assert_eq!(&ask(Some(cookie)).0, server, "{cookie}");
        }
    }

    // A new endpoint: `add server` at runtime, no reload; a client it answered sticks.
    let reloads = sidecar.master_reloads();
    let after = sidecar.change(
        "endpointslices",
        &slices(&[first[0], first[1], first[2], added]),
    );
    assert_eq!(after["last_strategy"], "runtime", "{after}");
    assert_eq!(sidecar.master_reloads(), reloads, "HAProxy did not reload");
    let cookie = (0..40)
        .map(|_| ask(None))
        .find(|(server, _)| server == "s4")
        .map(|(_, set_cookie)| set_cookie.split(';').next().unwrap_or_default().to_owned())
        .unwrap_or_else(|| sidecar.fail("the new endpoint never answered"));
    assert!(
        cookie.len() > "GW_SESSION=".len()
            && !spread
                .values()
                .any(|c| c.split('|').next() == cookie.split('|').next()),
        "the new server has a cookie of its own: {cookie} {spread:?}"
    );
    for _ in 0..10 {
        assert_eq!(ask(Some(&cookie)).0, "s4", "{cookie}");
    }
    for (server, cookie) in &spread {
        assert_eq!(&ask(Some(cookie)).0, server, "{cookie}");
    }

    // An endpoint removed: its client is served by another one, which sets its cookie.
    let after = sidecar.change("endpointslices", &slices(&[first[1], first[2], added]));
    assert_eq!(after["last_strategy"], "runtime", "{after}");
    let (server, set_cookie) = ask(Some(&spread["s1"]));
    assert_ne!(server, "s1");
    let cookie = set_cookie.split(';').next().unwrap_or_default().to_owned();
    // The value is the server's hash, then the cookie's dates (maxidle, maxlife).
    let server_hash = |c: &str| c.split('|').next().unwrap_or_default().to_owned();
    if let Some(known) = spread.get(&server) {
        assert_eq!(server_hash(&cookie), server_hash(known), "{cookie} {known}");
    }
    assert!(
        cookie.starts_with("GW_SESSION=") && cookie.len() > "GW_SESSION=".len(),
        "{set_cookie}"
    );
    for _ in 0..5 {
        assert_eq!(ask(Some(&cookie)).0, server, "{cookie}");
    }
    assert_eq!(sidecar.master_reloads(), reloads, "HAProxy did not reload");
}

/// `openssl s_server -www` on a free port: a TLS backend presenting `<cert>.crt` of
/// `dir` (for localhost), answering every request with 200 and a page describing the
/// TLS session; stopped when dropped.
struct TlsBackend {
    child: std::process::Child,
    port: u16,
}

impl TlsBackend {
    fn start(dir: &std::path::Path, cert: &str) -> TlsBackend {
        let port = free_port();
        let child = std::process::Command::new("openssl")
            .args(["s_server", "-accept", &format!("127.0.0.1:{port}")])
            .args([
                "-cert",
                &format!("{cert}.crt"),
                "-key",
                &format!("{cert}.key"),
            ])
            .arg("-www")
            .current_dir(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run openssl s_server");
        let backend = TlsBackend { child, port };
        poll(WAIT, || {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .ok()
                .map(drop)
        })
        .unwrap_or_else(|_| panic!("openssl s_server never listened on {port}"));
        backend
    }
}

impl Drop for TlsBackend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A condition of BackendTLSPolicy shop/`name`'s first ancestor, once it is
/// `(status, reason)` (bounded wait).
fn expect_policy_condition(sidecar: &Sidecar, name: &str, kind: &str, expected: (&str, &str)) {
    let mut last = None;
    let found = poll(WAIT, || {
        let status = sidecar.rendered_status("backendtlspolicies", "shop", name)?;
        let condition = status["ancestors"][0]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == kind)?
            .clone();
        last = Some(condition.clone());
        (condition["status"] == expected.0 && condition["reason"] == expected.1).then_some(())
    });
    if found.is_err() {
        sidecar.fail(&format!(
            "BackendTLSPolicy shop/{name} {kind}: expected {expected:?}, last {last:?}"
        ));
    }
}

/// BackendTLSPolicy end to end: HAProxy connects to a TLS backend (openssl s_server
/// with a certificate for localhost from a test CA) verifying its certificate against
/// the CA of the policy's ConfigMap and the policy's hostname: 200. A second endpoint
/// is added at runtime without a reload (HAProxy 2.6's `add server` takes the CA file
/// the configuration loaded) and takes requests. A wrong hostname or another CA: the
/// handshake is refused, 503. The ConfigMap gone: the policy's ResolvedRefs is False
/// (InvalidCACertificateRef) and the Service is not served in plaintext: 500.
#[test]
fn backend_tls_policy_verifies_the_backend_certificate() {
    let certs_dir = tempfile::tempdir().expect("temp dir");
    let dir = certs_dir.path();
    certs::leaf(dir, "backend-ca", "backend");
    let other_ca = String::from_utf8(certs::ca(dir, "other-ca")).expect("PEM");
    let backend_ca =
        String::from_utf8(std::fs::read(dir.join("backend-ca.crt")).expect("CA")).expect("PEM");
    let first = TlsBackend::start(dir, "backend");
    let second = TlsBackend::start(dir, "backend");

    let http = free_port();
    let config = library::gateway_config();
    let stats = config["extraContext"]["statsPort"]
        .as_u64()
        .expect("stats port");
    let library = library_value();
    let global = &library["validationTests"]["_global"]["fixtures"];
    let gateways =
        library::edge_gateway(json!([ { "name": "http", "protocol": "HTTP", "port": http,
                             "allowedRoutes": { "namespaces": { "from": "All" } } } ]));
    let routes = json!([http_route(
        "secure",
        "secure.example.test",
        json!([ { "backendRefs": [ { "name": "secure", "port": 80 } ] } ])
    )]);
    let policy = |hostname: &str| {
        json!([{
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "BackendTLSPolicy",
            "metadata": { "name": "secure-tls", "namespace": "shop" },
            "spec": {
                "targetRefs": [ { "group": "", "kind": "Service", "name": "secure" } ],
                "validation": {
                    "hostname": hostname,
                    "caCertificateRefs": [ { "group": "", "kind": "ConfigMap", "name": "secure-ca" } ]
                }
            }
        }])
    };
    let configmap = |pem: &str| {
        json!([{
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": "secure-ca", "namespace": "shop" },
            "data": { "ca.crt": pem }
        }])
    };
    let slices = |ports: &[u16]| json!([library::loopback_slice("shop", "secure", "", ports)]);
    let resources = [
        ("gatewayclasses", global["gatewayclasses"].clone()),
        ("gateways", gateways),
        ("httproutes", routes),
        ("namespaces", global["namespaces"].clone()),
        ("services", json!([service("shop", "secure", 80)])),
        ("endpointslices", slices(&[first.port])),
        ("backendtlspolicies", policy("localhost")),
        ("configmaps", configmap(&backend_ca)),
    ];
    let sidecar = Sidecar::start(
        "hapwright-gateway-btls-",
        config,
        &resources,
        http,
        reqwest::blocking::Client::builder(),
    );
    let ask = || {
        sidecar
            .get(http, "secure.example.test", "/")
            .unwrap_or_else(|e| sidecar.fail(&e))
    };
    let (status, body) = ask();
    assert!(
        status == 200 && body.contains("Cipher is"),
        "{status} {body}"
    );
    let deployed = sidecar.deployed_config();
    assert!(
        deployed.contains(&format!(
            "server secure-127.0.0.1-{} 127.0.0.1:{} weight 1 ssl verify required ca-file files/backend-ca_shop_secure-tls.pem sni str(localhost) verifyhost localhost\n",
            first.port, first.port
        )),
        "{deployed}"
    );
    expect_policy_condition(&sidecar, "secure-tls", "Accepted", ("True", "Accepted"));
    expect_policy_condition(
        &sidecar,
        "secure-tls",
        "ResolvedRefs",
        ("True", "ResolvedRefs"),
    );

    // A second endpoint: `add server` with the loaded CA file, no reload.
    let reloads = sidecar.master_reloads();
    let after = sidecar.change("endpointslices", &slices(&[first.port, second.port]));
    assert_eq!(after["last_strategy"], "runtime", "{after}");
    assert_eq!(sidecar.master_reloads(), reloads, "HAProxy did not reload");
    for _ in 0..6 {
        let (status, body) = ask();
        assert!(
            status == 200 && body.contains("Cipher is"),
            "{status} {body}"
        );
    }
    let csv = sidecar
        .client
        .get(format!("http://127.0.0.1:{stats}/stats;csv"))
        .send()
        .and_then(|r| r.text())
        .unwrap_or_else(|e| sidecar.fail(&format!("stats: {e}")));
    let served = csv
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "hr_shop_secure_0,secure-127.0.0.1-{},",
                second.port
            ))
        })
        .and_then(|l| l.split(',').nth(7))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| sidecar.fail(&format!("no stats for the new server: {csv}")));
    assert!(served > 0, "the new server took requests: {csv}");

    // A hostname the certificate does not carry: the handshake fails, 503.
    sidecar.change("backendtlspolicies", &policy("wrong.example.test"));
    let (status, body) = ask();
    assert_eq!(status, 503, "{body}");
    // The right hostname, another CA: 503.
    sidecar.change("backendtlspolicies", &policy("localhost"));
    assert_eq!(ask().0, 200);
    sidecar.change("configmaps", &configmap(&other_ca));
    let (status, body) = ask();
    assert_eq!(status, 503, "{body}");
    // A ca.crt shaped like PEM that is no certificate: HAProxy refuses it (`haproxy
    // -c`), quarantine holds the ConfigMap back at its last good version.
    library::write_objects(
        sidecar.dir.path(),
        "configmaps",
        &configmap("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
    );
    let quarantine = sidecar.quarantine(1);
    assert_eq!(
        quarantine["objects"][0]["resource"], "configmaps",
        "{quarantine}"
    );
    assert!(
        sidecar
            .deployed_config()
            .contains("ca-file files/backend-ca_shop_secure-tls.pem")
    );
    assert_eq!(ask().0, 503);
    // The ConfigMap gone: not served at all (not in plaintext), 500. (Removing every
    // server of the backend is held by the safety valve, which keeps them deployed
    // behind the 500 until the operator approves.)
    sidecar.change("configmaps", &json!([]));
    let (status, body) = ask();
    assert_eq!(status, 500, "{body}");
    let approved = sidecar
        .client
        .post(format!("http://127.0.0.1:{}/-/approve", sidecar.status))
        .header("X-Hapwright-Approve", "1")
        .send()
        .map(|r| r.status().as_u16())
        .unwrap_or_else(|e| sidecar.fail(&format!("approve: {e}")));
    assert_eq!(approved, 202);
    poll(WAIT, || {
        (!sidecar.deployed_config().contains("ssl verify")).then_some(())
    })
    .unwrap_or_else(|_| sidecar.fail("the TLS servers were never removed"));
    assert_eq!(ask().0, 500);
    expect_policy_condition(
        &sidecar,
        "secure-tls",
        "ResolvedRefs",
        ("False", "InvalidCACertificateRef"),
    );
    expect_policy_condition(
        &sidecar,
        "secure-tls",
        "Accepted",
        ("False", "NoValidCACertificate"),
    );
}

/// With `haproxy.dynamicBackends` (HAProxy 3.4), the deployer's own plan: a new rule
/// with sessionPersistence settings an existing rule already has, or to a Service of a
/// BackendTLSPolicy already in use, is a backend created at runtime from its profile
/// (its servers carrying the TLS parameters, the CA file already loaded); a rule with
/// new cookie settings needs a new profile, so it reloads.
#[test]
fn sticky_and_backend_tls_rules_are_added_at_runtime_once_their_profile_and_ca_exist() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut library = library_value();
    library["extraContext"]["sessionCookieKey"] = json!("plan-k3y");
    let config = dir.path().join("hapwright.yaml");
    std::fs::write(&config, serde_json::to_string(&library).expect("json")).expect("write");
    let mut before = test_fixtures(&library, "session-persistence");
    let tls = test_fixtures(&library, "backend-tls-policy");
    before["configmaps"] = tls["configmaps"].clone();
    before["backendtlspolicies"] = tls["backendtlspolicies"].clone();
    before["httproutes"].as_array_mut().expect("routes").extend(
        tls["httproutes"]
            .as_array()
            .expect("routes")
            .iter()
            .cloned(),
    );
    let route = |name: &str, rule: Value| {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": { "name": name, "namespace": "shop" },
            "spec": {
                "parentRefs": [ { "name": "edge", "namespace": "infra", "sectionName": "http" } ],
                "hostnames": [ format!("{name}.example.test") ],
                "rules": [ rule ]
            }
        })
    };
    let with = |extra: Value| {
        let mut fixtures = before.clone();
        fixtures["httproutes"]
            .as_array_mut()
            .expect("routes")
            .push(extra);
        fixtures
    };
    let options = plan::PlanOptions {
        dynamic_backends: hapwright_deployer::haproxy::backends::Capability::On,
    };
    let running = rendered(&render(&config, &dir.path().join("before"), &before));
    let plan_for = |name: &str, fixtures: &Value| {
        let desired = rendered(&render(&config, &dir.path().join(name), fixtures));
        plan::compute_with(&running, &desired, &options)
    };

    let same = plan_for(
        "same",
        &with(route(
            "sticky-too",
            json!({ "sessionPersistence": { "sessionName": "GW_SESSION", "absoluteTimeout": "1h",
                                            "idleTimeout": "30m",
                                            "cookieConfig": { "lifetimeType": "Permanent" } },
                    "backendRefs": [ { "name": "web", "port": 80 } ] }),
        )),
    );
    assert_eq!(same.reload, None, "{:?}", same.causes);
    assert!(
        same.ops.iter().any(
            |op| matches!(op, RuntimeOp::AddBackend { backend, profile, .. }
            if backend == "hr_shop_sticky-too_0" && profile == "routes_sp_GW_SESSION_1800_3600_p")
        ),
        "{:?}",
        same.ops
    );

    let secure = plan_for(
        "secure",
        &with(route(
            "secure-too",
            json!({ "backendRefs": [ { "name": "web", "port": 80 } ] }),
        )),
    );
    assert_eq!(secure.reload, None, "{:?}", secure.causes);
    let servers = secure
        .ops
        .iter()
        .find_map(|op| match op {
            RuntimeOp::AddBackend {
                backend, servers, ..
            } if backend == "hr_shop_secure-too_0" => Some(servers.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{:?}", secure.ops));
    assert!(
        servers.iter().all(|s| s.params.join(" ").ends_with(
            "ssl verify required ca-file files/backend-ca_shop_web-tls.pem sni str(web.shop.internal) verifyhost web.shop.internal"
        )) && !servers.is_empty(),
        "{servers:?}"
    );

    let new_settings = plan_for(
        "new-settings",
        &with(route(
            "sticky-other",
            json!({ "sessionPersistence": { "sessionName": "OTHER" },
                    "backendRefs": [ { "name": "web", "port": 80 } ] }),
        )),
    );
    assert!(new_settings.reload.is_some(), "{:?}", new_settings.ops);
}
