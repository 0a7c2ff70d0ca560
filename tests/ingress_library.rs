//! The Ingress template library in `examples/kubernetes-ingress/`: its
//! `validationTests` all pass under the real HAProxy (`hapwright test`), every
//! feature has its test, and the deployer's change plan applies endpoint changes and
//! certificate renewals at runtime (`add server` / `del server`, `set ssl cert`)
//! without a reload. End to end, the library routes real requests (hosts, path
//! prefixes, TLS through the crt-list) on an HAProxy started exactly as the sidecar
//! manifest starts it, with files standing in for the API server.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::haproxy::plan::{self, RuntimeOp};
use hapwright_e2e::{
    Signal, WAIT, free_port, hapwright_binary, master_command, parse_show_proc, poll,
    processes_matching, send_signal,
};
use hapwright_eventbus::model::{DeployStrategy, RenderedConfig, SourceMap};
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
    "default-backend-from-ingress",
    "default-backend-404",
    "tls-from-secrets",
    "tls-default-certificate",
    "tls-wildcard-and-shared-secret",
    "tls-missing-secret",
    "tls-slot-overflow",
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
];

fn library() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kubernetes-ingress/hapwright.yaml")
}

fn hapwright(args: &[&str], config: &Path) -> Output {
    Command::new(hapwright_binary())
        .args(args)
        .arg("-c")
        .arg(config)
        .output()
        .expect("run hapwright")
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The library as JSON (for its fixtures).
fn library_value() -> Value {
    let text = fs::read_to_string(library()).expect("read the library");
    serde_saphyr::from_str(&text).expect("library YAML")
}

#[test]
fn the_library_passes_check() {
    let output = hapwright(&["check"], &library());
    assert!(output.status.success(), "{}", text(&output));
}

#[test]
fn every_validation_test_passes_under_haproxy() {
    let output = hapwright(&["test", "--output", "json"], &library());
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("the JSON report does not parse ({e}): {}", text(&output)));
    let failed: Vec<&Value> = report["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .filter(|t| t["passed"] != Value::Bool(true))
        .collect();
    assert!(
        failed.is_empty(),
        "failing library tests:\n{}",
        serde_json::to_string_pretty(&failed).unwrap_or_default()
    );
    assert_eq!(report["failed"], json!(0));
    assert!(output.status.success(), "{}", text(&output));
    let names: BTreeSet<&str> = report["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for feature in FEATURE_TESTS {
        assert!(names.contains(feature), "no library test named {feature}");
    }
    // Every test checks that HAProxy accepts the render (`_global`'s assertion).
    for test in report["tests"].as_array().expect("tests") {
        assert_eq!(
            test["assertions"][0]["type"], "haproxy_valid",
            "{}: the first assertion is _global's haproxy_valid",
            test["name"]
        );
    }
}

#[test]
fn each_feature_test_checks_something_of_its_own() {
    let library = library_value();
    for feature in FEATURE_TESTS {
        let test = &library["validationTests"][feature];
        let assertions = test["assertions"].as_array().map(Vec::len).unwrap_or(0);
        assert!(assertions >= 1, "{feature} has no assertions of its own");
        assert!(
            test["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{feature} has no description"
        );
    }
}

/// Writes `fixtures` (resource name → objects) as `DIR/<name>/objects.yaml` (JSON
/// is YAML) and renders them into `DIR/out`.
fn render(dir: &Path, fixtures: &Value) -> PathBuf {
    let input = dir.join("fixtures");
    for (name, objects) in fixtures.as_object().expect("fixtures") {
        let resource = input.join(name);
        fs::create_dir_all(&resource).expect("fixture dir");
        fs::write(
            resource.join("objects.json"),
            serde_json::to_string_pretty(objects).expect("json"),
        )
        .expect("write fixtures");
    }
    let out = dir.join("out");
    let output = Command::new(hapwright_binary())
        .arg("render")
        .arg("-c")
        .arg(library())
        .arg("--fixtures")
        .arg(&input)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run hapwright render");
    assert!(output.status.success(), "{}", text(&output));
    out
}

/// A rendered directory (`haproxy.cfg`, `maps/`, `files/`, `certs/`) as the render
/// the deployer plans with.
fn rendered(dir: &Path) -> RenderedConfig {
    let read = |sub: &str| -> BTreeMap<String, Arc<str>> {
        let Ok(entries) = fs::read_dir(dir.join(sub)) else {
            return BTreeMap::new();
        };
        entries
            .map(|entry| {
                let path = entry.expect("entry").path();
                let content = fs::read_to_string(&path).expect("read rendered file");
                (
                    path.file_name().unwrap().to_string_lossy().into_owned(),
                    Arc::from(content),
                )
            })
            .collect()
    };
    let main = fs::read_to_string(dir.join("haproxy.cfg")).expect("haproxy.cfg");
    RenderedConfig::new(
        main,
        read("maps"),
        read("files"),
        read("certs"),
        SourceMap::default(),
    )
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
    let running = rendered(&render(&dir.path().join("before"), &before));
    let desired = rendered(&render(&dir.path().join("after"), &after));
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
    let running = rendered(&render(&dir.path().join("before"), &before));
    let desired = rendered(&render(&dir.path().join("after"), &after));
    let plan = plan::compute(&running, &desired);
    assert_eq!(plan.reload, None, "no reload for a renewed certificate");
    assert!(
        matches!(
            plan.ops.as_slice(),
            [RuntimeOp::ReplaceCertificate { file, .. }] if file == "certs/tls-0.pem"
        ),
        "{:?}",
        plan.ops
    );
}

#[test]
fn a_new_tls_secret_reloads_because_the_crt_list_changes() {
    let library = library_value();
    let before = storefront_fixtures();
    let mut after = before.clone();
    after["ingresses"] =
        library["validationTests"]["tls-from-secrets"]["fixtures"]["ingresses"].clone();

    let dir = tempfile::tempdir().expect("temp dir");
    let running = rendered(&render(&dir.path().join("before"), &before));
    let desired = rendered(&render(&dir.path().join("after"), &after));
    let plan = plan::compute(&running, &desired);
    // The HTTPS bind line appears: a documented reload (docs/kubernetes-ingress.md).
    assert_eq!(plan.strategy(), DeployStrategy::Reload);
}

// === end to end: the library on an HAProxy started as in deploy/sidecar/ ===

/// An HTTP server on loopback that answers every request with `name` (one thread,
/// one connection at a time; it lives as long as the test process).
fn upstream(name: &'static str) -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind upstream");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buffer = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buffer[..n]),
                }
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
                name.len()
            );
        }
    });
    port
}

/// `hapwright run` and the HAProxy it deploys to, stopped (and their leftovers
/// killed) when dropped.
struct Sidecar {
    dir: tempfile::TempDir,
    haproxy: Option<Child>,
    hapwright: Option<Child>,
    http: u16,
    https: u16,
    status: u16,
    client: reqwest::blocking::Client,
}

impl Sidecar {
    fn log(&self) -> String {
        let read = |name: &str| fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!(
            "--- hapwright.log ---\n{}\n--- haproxy.log ---\n{}",
            read("hapwright.log"),
            read("haproxy.log")
        )
    }

    fn fail(&self, message: &str) -> ! {
        panic!("{message}\n{}", self.log())
    }

    fn get(&self, host: &str, path: &str) -> Result<(u16, String), String> {
        let response = self
            .client
            .get(format!("http://127.0.0.1:{}{path}", self.http))
            .header(reqwest::header::HOST, host)
            .send()
            .map_err(|e| format!("{e:?}"))?;
        let status = response.status().as_u16();
        Ok((status, response.text().map_err(|e| format!("{e:?}"))?))
    }

    fn expect(&self, host: &str, path: &str, status: u16, body: &str) {
        match self.get(host, path) {
            Ok((s, b)) if s == status && b.contains(body) => {}
            other => self.fail(&format!(
                "{host}{path}: expected {status} {body:?}, got {other:?}"
            )),
        }
    }

    fn instance(&self) -> Value {
        let text = self
            .client
            .get(format!("http://127.0.0.1:{}/debug/instances", self.status))
            .send()
            .and_then(|r| r.text())
            .unwrap_or_else(|e| self.fail(&format!("/debug/instances: {e}")));
        let all: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| self.fail(&format!("{e}: {text}")));
        all.as_array()
            .and_then(|list| list.iter().find(|i| i["name"] == "local").cloned())
            .unwrap_or_else(|| self.fail(&format!("no instance local: {text}")))
    }

    fn master_reloads(&self) -> u64 {
        let answer = master_command(&self.dir.path().join("run/master.sock"), "show proc")
            .unwrap_or_else(|e| self.fail(&format!("show proc: {e}")));
        parse_show_proc(&answer)
            .unwrap_or_else(|| self.fail(&format!("show proc: {answer}")))
            .reloads
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        for child in [self.hapwright.take(), self.haproxy.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            send_signal(child.id(), Signal::TERM);
            if poll(Duration::from_secs(10), || child.try_wait().ok().flatten()).is_err() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let needle = format!("{}/", self.dir.path().display());
        for pid in processes_matching("haproxy", &needle) {
            send_signal(pid, Signal::KILL);
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log());
        }
    }
}

/// The sidecar manifest's haproxy container command and working directory, with the
/// pod's paths (`/etc/haproxy`, `/run/haproxy`) moved into `dir`, and the bootstrap
/// `haproxy.cfg` of its ConfigMap.
fn sidecar_haproxy(dir: &Path) -> (Vec<String>, PathBuf, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/sidecar");
    let docs = |file: &str| -> Vec<Value> {
        serde_saphyr::from_multiple(&fs::read_to_string(root.join(file)).expect("manifest"))
            .expect("manifest YAML")
    };
    let deployment = docs("deployment.yaml").remove(0);
    let container = deployment
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["name"] == "haproxy"))
        .expect("haproxy container")
        .clone();
    let local = |path: &str| {
        path.replace("/etc/haproxy", &dir.join("haproxy").display().to_string())
            .replace("/run/haproxy", &dir.join("run").display().to_string())
    };
    let command = container["command"]
        .as_array()
        .expect("command")
        .iter()
        .map(|a| local(a.as_str().expect("string")))
        .collect();
    let working_dir = PathBuf::from(local(container["workingDir"].as_str().expect("workingDir")));
    let bootstrap = docs("haproxy-bootstrap.yaml").remove(0)["data"]["haproxy.cfg"]
        .as_str()
        .expect("bootstrap haproxy.cfg")
        .to_owned();
    (command, working_dir, bootstrap)
}

fn write_objects(dir: &Path, name: &str, objects: &Value) {
    let resource = dir.join("resources").join(name);
    fs::create_dir_all(&resource).expect("resource dir");
    let path = resource.join("objects.json");
    let temporary = resource.join(".objects.json.tmp");
    fs::write(
        &temporary,
        serde_json::to_string_pretty(objects).expect("json"),
    )
    .expect("write");
    fs::rename(&temporary, &path).expect("rename");
}

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

fn start_sidecar(web: u16, api: u16) -> Sidecar {
    let dir = tempfile::Builder::new()
        .prefix("hapwright-ingress-")
        .tempdir()
        .expect("temp dir");
    let (http, https, stats, status) = (free_port(), free_port(), free_port(), free_port());

    // The config: the library with files sources standing in for the API server.
    let mut config = library_value();
    let object = config.as_object_mut().expect("config");
    object.remove("validationTests");
    for (name, api_version, kind) in [
        ("ingresses", "networking.k8s.io/v1", "Ingress"),
        ("services", "v1", "Service"),
        ("endpointslices", "discovery.k8s.io/v1", "EndpointSlice"),
        ("secrets", "v1", "Secret"),
    ] {
        let resource = config["watchedResources"][name]
            .as_object_mut()
            .expect("watched resource");
        assert!(
            resource.remove("kubernetes").is_some(),
            "{name} is a kubernetes source"
        );
        resource.insert(
            "files".into(),
            json!({ "path": format!("./resources/{name}") }),
        );
        resource.insert("apiVersion".into(), json!(api_version));
        resource.insert("kind".into(), json!(kind));
    }
    config["extraContext"]["httpPort"] = json!(http);
    config["extraContext"]["httpsPort"] = json!(https);
    config["extraContext"]["statsPort"] = json!(stats);
    config["extraContext"]["maxconn"] = json!(1000);
    config["haproxy"] = json!({
        "binary": "haproxy",
        "instances": [ { "name": "local", "socket": { "master": "./run/master.sock", "configDir": "./haproxy" } } ]
    });
    config["controller"] = json!({
        "listen": format!("127.0.0.1:{status}"),
        "debounce": "20ms", "maxWait": "200ms",
        "minDeploymentInterval": "50ms", "minReloadInterval": "50ms"
    });
    fs::write(
        dir.path().join("hapwright.yaml"),
        serde_json::to_string_pretty(&config).expect("json"),
    )
    .expect("write config");

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
    write_objects(dir.path(), "ingresses", &ingresses);
    write_objects(
        dir.path(),
        "services",
        &fixtures["_global"]["fixtures"]["services"],
    );
    write_objects(
        dir.path(),
        "secrets",
        &fixtures["_global"]["fixtures"]["secrets"],
    );
    write_objects(
        dir.path(),
        "endpointslices",
        &json!([endpoint_slice("web", &[web]), endpoint_slice("api", &[api])]),
    );

    // HAProxy as the pod starts it: the init container's bootstrap, then the
    // manifest's command in the manifest's working directory.
    let (command, working_dir, bootstrap) = sidecar_haproxy(dir.path());
    for sub in ["haproxy/maps", "haproxy/files", "haproxy/certs", "run"] {
        fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
    }
    fs::write(
        dir.path().join("haproxy/haproxy.cfg"),
        bootstrap.replace("bind :8080", &format!("bind 127.0.0.1:{http}")),
    )
    .expect("bootstrap config");
    let log = |name: &str| fs::File::create(dir.path().join(name)).expect("log file");
    let haproxy = Command::new(&command[0])
        .args(&command[1..])
        .current_dir(&working_dir)
        .stdin(Stdio::null())
        .stdout(log("haproxy.log"))
        .stderr(log("haproxy.err"))
        .spawn()
        .expect("start haproxy");
    let hapwright = Command::new(hapwright_binary())
        .arg("run")
        .arg("-c")
        .arg(dir.path().join("hapwright.yaml"))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log("hapwright.log"))
        .stderr(log("hapwright.err"))
        .spawn()
        .expect("start hapwright");
    let client = reqwest::blocking::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .redirect(reqwest::redirect::Policy::none())
        .danger_accept_invalid_certs(true)
        .resolve("secure.example.test", ([127, 0, 0, 1], https).into())
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client");
    let sidecar = Sidecar {
        dir,
        haproxy: Some(haproxy),
        hapwright: Some(hapwright),
        http,
        https,
        status,
        client,
    };
    let ready = poll(WAIT, || {
        let response = sidecar
            .client
            .get(format!("http://127.0.0.1:{status}/readyz"))
            .send()
            .ok()?;
        (response.status().as_u16() == 200).then_some(())
    });
    if ready.is_err() {
        sidecar.fail("hapwright never became ready (no deployment to the sidecar HAProxy)");
    }
    sidecar
}

#[test]
fn the_library_runs_on_haproxy_started_as_in_the_sidecar_manifest() {
    let (web_a, web_b, api) = (upstream("web-a"), upstream("web-b"), upstream("api"));
    let sidecar = start_sidecar(web_a, api);

    // The first deployment replaced the bootstrap config with a reload.
    let instance = sidecar.instance();
    assert_eq!(instance["last_strategy"], "reload", "{instance}");
    assert_eq!(sidecar.master_reloads(), 1);

    // Host and path routing through the maps.
    sidecar.expect("shop.example.test", "/", 200, "web-a");
    sidecar.expect("Shop.Example.Test:8080", "/cart", 200, "web-a");
    sidecar.expect("shop.example.test", "/api", 200, "api");
    sidecar.expect("shop.example.test", "/api/orders", 200, "api");
    sidecar.expect("shop.example.test", "/apis", 200, "web-a");
    sidecar.expect("shop.example.test", "/checkout", 200, "web-a");
    sidecar.expect("unknown.example.test", "/", 404, "default backend - 404");
    // TLS from the Secret through the crt-list, and the redirect to it.
    match sidecar.get("secure.example.test", "/") {
        Ok((308, _)) => {}
        other => sidecar.fail(&format!("expected a redirect to HTTPS, got {other:?}")),
    }
    let https = sidecar
        .client
        .get(format!("https://secure.example.test:{}/", sidecar.https))
        .send()
        .and_then(|r| r.text())
        .unwrap_or_else(|e| sidecar.fail(&format!("HTTPS request: {e:?}")));
    assert_eq!(https, "api");

    // A pod is replaced: the new endpoint is added and the old one removed at
    // runtime, without a reload.
    let deployments = instance["deployments"].as_u64().expect("deployments");
    write_objects(
        sidecar.dir.path(),
        "endpointslices",
        &json!([
            endpoint_slice("web", &[web_b]),
            endpoint_slice("api", &[api])
        ]),
    );
    let deployed = poll(WAIT, || {
        let instance = sidecar.instance();
        (instance["deployments"].as_u64() > Some(deployments)).then_some(instance)
    })
    .unwrap_or_else(|_| sidecar.fail("the endpoint change was never deployed"));
    assert_eq!(deployed["last_strategy"], "runtime", "{deployed}");
    assert_eq!(sidecar.master_reloads(), 1, "HAProxy did not reload");
    sidecar.expect("shop.example.test", "/", 200, "web-b");
}
