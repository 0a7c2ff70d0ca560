//! The Ingress template library in `examples/kubernetes-ingress/`: its
//! `validationTests` all pass under the real HAProxy (`hapwright test`), every
//! feature has its test, and the deployer's change plan applies endpoint changes and
//! certificate renewals at runtime (`add server` / `del server`, `set ssl cert`)
//! without a reload. End to end, the library routes real requests (hosts, path
//! prefixes, TLS through the crt-list) on an HAProxy started exactly as the sidecar
//! manifest starts it, with files standing in for the API server.

mod library;

use std::path::PathBuf;

use hapwright_deployer::component::validator::{self, equivalence};
use hapwright_deployer::haproxy::plan::{self, RuntimeOp};
use hapwright_e2e::{WAIT, free_port, poll};
use hapwright_eventbus::model::DeployStrategy;
use library::{Sidecar, hapwright, library_path, render, rendered, text, upstream};
use serde_json::{Value, json};

/// One test per feature of the library (docs/kubernetes-ingress.md).
const FEATURE_TESTS: &[&str] = &[
    "host-and-prefix-routing",
    "path-exact",
    "path-prefix-segments",
    "path-implementation-specific",
    "path-regex",
    "unsafe-paths-are-skipped",
    "wildcard-and-hostless-rules",
    "host-normalisation",
    "regex-anchored-to-host",
    "conflicts-oldest-wins",
    "host-ownership",
    "tls-hosts-per-namespace",
    "default-backend-from-ingress",
    "default-backend-404",
    "tls-from-secrets",
    "tls-default-certificate",
    "tls-wildcard-and-shared-secret",
    "tls-missing-secret",
    "tls-every-secret",
    "ssl-redirect-opt-out",
    "ingress-class-filtering",
    "ingress-without-class-opt-in",
    "servers-from-endpointslices",
    "servers-dual-stack-and-ipv6",
    "service-problems",
    "service-balance-annotation",
    "health-and-metrics-frontend",
    "status-from-publish-service",
    "status-from-publish-addresses",
    "status-service-without-address",
    "status-waits-for-every-instance",
];

fn library_config() -> PathBuf {
    library_path("examples/kubernetes-ingress/hapwright.yaml")
}

/// The library as JSON (for its fixtures).
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

/// `_global`'s fixtures with the `storefront` Ingress.
fn storefront_fixtures() -> Value {
    let library = library_value();
    let mut fixtures = library["validationTests"]["_global"]["fixtures"].clone();
    fixtures["ingresses"] =
        library["validationTests"]["host-and-prefix-routing"]["fixtures"]["ingresses"].clone();
    fixtures
}

#[test]
fn an_endpoint_change_is_a_runtime_only_deployment() {
    let before = storefront_fixtures();
    // A pod is replaced: one endpoint goes, another comes, one becomes not ready.
    let mut after = before.clone();
    let web = after["endpointslices"]
        .as_array_mut()
        .expect("slices")
        .iter_mut()
        .find(|s| s["metadata"]["name"] == "web-7k2xq")
        .expect("web slice");
    let endpoints = web["endpoints"].as_array_mut().expect("endpoints");
    endpoints[0]["addresses"] = json!(["10.244.4.12"]);
    endpoints[1]["conditions"]["ready"] = json!(false);

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
    assert_eq!(plan.reload, None, "no reload for endpoint changes");
    assert_eq!(plan.strategy(), DeployStrategy::Runtime);
    let added: Vec<(&str, &str, &str)> = plan
        .ops
        .iter()
        .filter_map(|op| match op {
            RuntimeOp::AddServer {
                backend,
                server,
                address,
                ..
            } => Some((backend.as_str(), server.as_str(), address.as_str())),
            _ => None,
        })
        .collect();
    let removed: Vec<(&str, &str)> = plan
        .ops
        .iter()
        .filter_map(|op| match op {
            RuntimeOp::DelServer { backend, server } => Some((backend.as_str(), server.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        added,
        [(
            "ing_shop_web_http",
            "ep-10.244.4.12-8080",
            "10.244.4.12:8080"
        )]
    );
    assert_eq!(
        removed,
        [
            ("ing_shop_web_http", "ep-10.244.1.5-8080"),
            ("ing_shop_web_http", "ep-10.244.2.7-8080")
        ]
    );
    assert!(
        plan.ops.iter().all(|op| op.object() == "server"),
        "only servers change: {:?}",
        plan.ops
    );
}

/// Why phase 2 passes by equivalence for `to` after `from` passed `haproxy -c`
/// (`None`: `haproxy -c` must run).
fn phase2_skipped(
    from: &hapwright_eventbus::model::RenderedConfig,
    to: &hapwright_eventbus::model::RenderedConfig,
) -> Option<equivalence::SkipReason> {
    let model = |rendered| {
        let (_, model) = validator::validate_phase1_parsed(rendered).expect("phase 1 passes");
        std::sync::Arc::new(model)
    };
    let baseline = equivalence::Baseline {
        rendered: std::sync::Arc::new(from.clone()),
        model: model(from),
    };
    match equivalence::compare(&baseline, to, &model(to)) {
        equivalence::Equivalence::Equivalent(reason) => Some(reason),
        equivalence::Equivalence::Different(_) => None,
    }
}

#[test]
fn a_certificate_renewal_is_a_runtime_only_deployment() {
    let library = library_value();
    let mut before = storefront_fixtures();
    before["ingresses"] =
        library["validationTests"]["tls-from-secrets"]["fixtures"]["ingresses"].clone();
    // The Secret gets a new certificate and key (here: the other test pair).
    let mut after = before.clone();
    let secrets = after["secrets"].as_array_mut().expect("secrets");
    let renewed = secrets[1]["data"].clone();
    secrets[0]["data"] = renewed;

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
    assert_eq!(
        phase2_skipped(&running, &desired),
        Some(equivalence::SkipReason::Certificates),
        "a renewed certificate needs no haproxy -c"
    );
    let plan = plan::compute(&running, &desired);
    assert_eq!(plan.reload, None, "no reload for a renewed certificate");
    assert!(
        matches!(
            plan.ops.as_slice(),
            [RuntimeOp::ReplaceCertificate { file, .. }] if file == "certs/shop_shop-tls.pem"
        ),
        "{:?}",
        plan.ops
    );
}

#[test]
fn the_first_tls_secret_adds_the_https_listener_with_a_reload() {
    let library = library_value();
    let before = storefront_fixtures();
    let mut after = before.clone();
    after["ingresses"] =
        library["validationTests"]["tls-from-secrets"]["fixtures"]["ingresses"].clone();

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
    let plan = plan::compute(&running, &desired);
    // The HTTPS bind line appears: a documented reload (docs/kubernetes-ingress.md).
    assert_eq!(plan.strategy(), DeployStrategy::Reload);
}

#[test]
fn more_tls_secrets_are_added_and_removed_without_a_reload() {
    let library = library_value();
    let tests = &library["validationTests"];
    let mut one = storefront_fixtures();
    one["ingresses"] = tests["tls-from-secrets"]["fixtures"]["ingresses"].clone();
    let mut two = one.clone();
    let mut wild = tests["tls-wildcard-and-shared-secret"]["fixtures"]["ingresses"][0].clone();
    wild["metadata"]["creationTimestamp"] = json!("2030-01-01T00:00:00Z");
    two["ingresses"]
        .as_array_mut()
        .expect("ingresses")
        .push(wild);

    let dir = tempfile::tempdir().expect("temp dir");
    let with_one = rendered(&render(&library_config(), &dir.path().join("one"), &one));
    let with_two = rendered(&render(&library_config(), &dir.path().join("two"), &two));
    // The certificate and crt-list operations (the maps change at runtime too).
    let described = |plan: &plan::ChangePlan| -> Vec<String> {
        plan.ops
            .iter()
            .filter(|op| matches!(op.object(), "certificate" | "crt_list"))
            .map(RuntimeOp::describe)
            .collect()
    };
    // Neither waits for a haproxy -c that loads every certificate.
    for (from, to) in [(&with_one, &with_two), (&with_two, &with_one)] {
        assert_eq!(
            phase2_skipped(from, to),
            Some(equivalence::SkipReason::Certificates)
        );
    }
    let added = plan::compute(&with_one, &with_two);
    assert_eq!(added.reload, None, "{:?}", added.reload);
    assert_eq!(
        described(&added),
        [
            "certs/shop_apps-wildcard-tls.pem added",
            "files/tls.crtlist entry certs/shop_apps-wildcard-tls.pem set",
        ]
    );
    let removed = plan::compute(&with_two, &with_one);
    assert_eq!(removed.reload, None, "{:?}", removed.reload);
    assert_eq!(
        described(&removed),
        [
            "files/tls.crtlist entry certs/shop_apps-wildcard-tls.pem removed",
            "certs/shop_apps-wildcard-tls.pem removed",
        ]
    );
}

// === end to end: the library on an HAProxy started as in deploy/sidecar/ ===

fn endpoint_slice(service: &str, ports: &[u16]) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{service}-abcde"),
            "namespace": "shop",
            "labels": { "kubernetes.io/service-name": service }
        },
        "addressType": "IPv4",
        "ports": [ { "name": if service == "web" { "http" } else { "" }, "port": ports[0], "protocol": "TCP" } ],
        "endpoints": ports.iter().map(|_| json!({ "addresses": ["127.0.0.1"], "conditions": { "ready": true } })).collect::<Vec<_>>()
    })
}

/// The sidecar's Ingresses: the routing fixtures plus `secure`, with TLS.
fn sidecar_ingresses() -> Value {
    let library = library_value();
    let fixtures = &library["validationTests"];
    let mut ingresses = fixtures["host-and-prefix-routing"]["fixtures"]["ingresses"].clone();
    let mut secure = fixtures["tls-from-secrets"]["fixtures"]["ingresses"][0].clone();
    secure["metadata"]["name"] = json!("secure");
    secure["spec"]["tls"][0]["hosts"] = json!(["secure.example.test"]);
    secure["spec"]["rules"][0]["host"] = json!("secure.example.test");
    secure["spec"]["rules"][0]["http"]["paths"][0]["backend"] =
        json!({ "service": { "name": "api", "port": { "number": 80 } } });
    ingresses.as_array_mut().expect("ingresses").push(secure);
    ingresses
}

/// The sidecar with the library's ports.
struct Ports {
    http: u16,
    https: u16,
}

fn start_sidecar(web: u16, api: u16) -> (Sidecar, Ports) {
    let ports = Ports {
        http: free_port(),
        https: free_port(),
    };

    // The config: the library with files sources standing in for the API server.
    let config = library::ingress_config(ports.http, ports.https);

    let library = library_value();
    let fixtures = &library["validationTests"];
    let resources = [
        ("ingresses", sidecar_ingresses()),
        (
            "services",
            fixtures["_global"]["fixtures"]["services"].clone(),
        ),
        (
            "secrets",
            fixtures["_global"]["fixtures"]["secrets"].clone(),
        ),
        (
            "endpointslices",
            json!([endpoint_slice("web", &[web]), endpoint_slice("api", &[api])]),
        ),
    ];
    let client = reqwest::blocking::Client::builder()
        .resolve("secure.example.test", ([127, 0, 0, 1], ports.https).into());
    let sidecar = Sidecar::start("hapwright-ingress-", config, &resources, ports.http, client);
    (sidecar, ports)
}

#[test]
fn the_library_runs_on_haproxy_started_as_in_the_sidecar_manifest() {
    let (web_a, web_b, api) = (upstream("web-a"), upstream("web-b"), upstream("api"));
    let (sidecar, ports) = start_sidecar(web_a, api);
    let http = ports.http;

    // The first deployment replaced the bootstrap config with a reload.
    let instance = sidecar.instance();
    assert_eq!(instance["last_strategy"], "reload", "{instance}");
    assert_eq!(sidecar.master_reloads(), 1);

    // Host and path routing through the maps.
    sidecar.expect(http, "shop.example.test", "/", 200, "web-a");
    sidecar.expect(http, "Shop.Example.Test:8080", "/cart", 200, "web-a");
    sidecar.expect(http, "shop.example.test", "/api", 200, "api");
    sidecar.expect(http, "shop.example.test", "/api/orders", 200, "api");
    sidecar.expect(http, "shop.example.test", "/apis", 200, "web-a");
    sidecar.expect(http, "shop.example.test", "/checkout", 200, "web-a");
    sidecar.expect(
        http,
        "unknown.example.test",
        "/",
        404,
        "default backend - 404",
    );
    // TLS from the Secret through the crt-list, and the redirect to it.
    match sidecar.get(http, "secure.example.test", "/") {
        Ok((308, _)) => {}
        other => sidecar.fail(&format!("expected a redirect to HTTPS, got {other:?}")),
    }
    let https = sidecar
        .client
        .get(format!("https://secure.example.test:{}/", ports.https))
        .send()
        .and_then(|r| r.text())
        .unwrap_or_else(|e| sidecar.fail(&format!("HTTPS request: {e:?}")));
    assert!(https.starts_with("api\n"), "{https}");

    // A pod is replaced: the new endpoint is added and the old one removed at
    // runtime, without a reload.
    let deployed = sidecar.change(
        "endpointslices",
        &json!([
            endpoint_slice("web", &[web_b]),
            endpoint_slice("api", &[api])
        ]),
    );
    assert_eq!(deployed["last_strategy"], "runtime", "{deployed}");
    assert_eq!(sidecar.master_reloads(), 1, "HAProxy did not reload");
    sidecar.expect(http, "shop.example.test", "/", 200, "web-b");

    // A second TLS Ingress with its own Secret: its certificate is served for its
    // host at once, without a reload; removing the Ingress removes it again.
    let library = library_value();
    let fixtures = &library["validationTests"];
    let mut ingresses = sidecar_ingresses();
    let mut wild = fixtures["tls-wildcard-and-shared-secret"]["fixtures"]["ingresses"][0].clone();
    wild["metadata"]["creationTimestamp"] = json!("2030-01-01T00:00:00Z");
    ingresses.as_array_mut().expect("ingresses").push(wild);
    let deployed = sidecar.change("ingresses", &ingresses);
    assert_eq!(deployed["last_strategy"], "runtime", "{deployed}");
    let default = sidecar.served_certificate(ports.https, "secure.example.test");
    let wildcard = sidecar.served_certificate(ports.https, "a.apps.example.test");
    assert_ne!(wildcard, default, "the new Secret's certificate is served");
    let deployed = sidecar.change("ingresses", &sidecar_ingresses());
    assert_eq!(deployed["last_strategy"], "runtime", "{deployed}");
    assert_eq!(
        sidecar.served_certificate(ports.https, "a.apps.example.test"),
        default,
        "back to the default certificate"
    );
    assert_eq!(sidecar.master_reloads(), 1, "HAProxy did not reload");

    // A Secret whose key does not match its certificate: HAProxy refuses it, so the
    // Ingress that brings it is quarantined with HAProxy's message, while another
    // new TLS Ingress goes live beside it and every other certificate stays served.
    let global = &library["validationTests"]["_global"]["fixtures"]["secrets"];
    let data = |name: &str, key: &str| {
        global
            .as_array()
            .expect("secrets")
            .iter()
            .find(|s| s["metadata"]["name"] == name)
            .expect("fixture secret")["data"][key]
            .clone()
    };
    let mut secrets = global.clone();
    secrets.as_array_mut().expect("secrets").push(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": { "name": "broken-tls", "namespace": "shop" },
        "data": {
            "tls.crt": data("shop-tls", "tls.crt"),
            "tls.key": data("apps-wildcard-tls", "tls.key")
        }
    }));
    library::write_objects(sidecar.dir.path(), "secrets", &secrets);
    let mut broken = fixtures["tls-from-secrets"]["fixtures"]["ingresses"][0].clone();
    broken["metadata"]["name"] = json!("broken");
    broken["metadata"]["creationTimestamp"] = json!("2030-02-01T00:00:00Z");
    broken["spec"]["tls"] =
        json!([ { "hosts": ["broken.example.test"], "secretName": "broken-tls" } ]);
    broken["spec"]["rules"][0]["host"] = json!("broken.example.test");
    let mut wild = fixtures["tls-wildcard-and-shared-secret"]["fixtures"]["ingresses"][0].clone();
    wild["metadata"]["creationTimestamp"] = json!("2030-01-01T00:00:00Z");
    let mut ingresses = sidecar_ingresses();
    ingresses
        .as_array_mut()
        .expect("ingresses")
        .extend([wild, broken]);
    library::write_objects(sidecar.dir.path(), "ingresses", &ingresses);
    let quarantine = sidecar.quarantine(1);
    assert_eq!(quarantine["objects"][0]["name"], "broken", "{quarantine}");
    assert!(
        quarantine
            .to_string()
            .contains("inconsistencies between private key and certificate"),
        "HAProxy's message: {quarantine}"
    );
    assert!(
        !quarantine.to_string().contains("PRIVATE KEY-----"),
        "no key in the report: {quarantine}"
    );
    let wildcard_now = poll(WAIT, || {
        let subject = sidecar.served_certificate(ports.https, "a.apps.example.test");
        (subject != default).then_some(subject)
    })
    .unwrap_or_else(|_| sidecar.fail("the good TLS Ingress never went live"));
    assert_eq!(wildcard_now, wildcard);
    assert_eq!(
        sidecar.served_certificate(ports.https, "secure.example.test"),
        default,
        "the other certificates stay served"
    );
}
