//! Helpers shared by the tests of the template libraries in `examples/`
//! (`ingress_library.rs`, `gateway_library.rs`): running the `hapwright` CLI on a
//! library, rendering fixtures into files and reading them back as the deployer's
//! render, loopback upstreams that say who answered, and a [`Sidecar`]: `hapwright
//! run` with `files` sources standing in for the API server, deploying to an HAProxy
//! started exactly as the `deploy/sidecar/` manifest starts it.
//!
//! Every wait is a bounded poll; every process a test starts is stopped when the
//! value that owns it is dropped.

#![allow(dead_code)] // each test file uses its own subset

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hapwright_e2e::{
    Signal, WAIT, free_port, hapwright_binary, master_command, parse_show_proc, poll,
    processes_matching, send_signal,
};
use hapwright_eventbus::model::{RenderedConfig, SourceMap};
use serde_json::{Value, json};

/// The repository root (this file is also built into the benchmark suite, whose
/// package lives two levels below it).
fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|dir| dir.join("examples").is_dir() && dir.join("deploy").is_dir())
        .expect("the repository root")
}

/// A library's config file, relative to the repository root.
pub fn library_path(relative: &str) -> PathBuf {
    repository().join(relative)
}

/// A library's config as JSON (for its fixtures and to derive test configs).
pub fn library_value(config: &Path) -> Value {
    let text = fs::read_to_string(config).expect("read the library");
    serde_saphyr::from_str(&text).expect("library YAML")
}

/// Runs `hapwright <args> -c <config>`.
pub fn hapwright(args: &[&str], config: &Path) -> Output {
    Command::new(hapwright_binary())
        .args(args)
        .arg("-c")
        .arg(config)
        .output()
        .expect("run hapwright")
}

/// Exit code, stdout and stderr of a finished command, for assertion messages.
pub fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs `hapwright test --output json` on a library and asserts that every test
/// passed, that every name of `features` is a test, and that each test's first
/// assertion is `_global`'s `haproxy_valid`.
pub fn assert_every_validation_test_passes(config: &Path, features: &[&str]) {
    let output = hapwright(&["test", "--output", "json"], config);
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("the JSON report does not parse ({e}): {}", text(&output)));
    let tests = report["tests"].as_array().expect("tests");
    let failed: Vec<&Value> = tests
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
    for feature in features {
        assert!(
            tests.iter().any(|t| t["name"] == *feature),
            "no library test named {feature}"
        );
    }
    for test in tests {
        assert_eq!(
            test["assertions"][0]["type"], "haproxy_valid",
            "{}: the first assertion is _global's haproxy_valid",
            test["name"]
        );
    }
}

/// Asserts that each feature test has a description and assertions of its own (not
/// only `_global`'s).
pub fn assert_each_feature_test_checks_something_of_its_own(config: &Path, features: &[&str]) {
    let library = library_value(config);
    for feature in features {
        let test = &library["validationTests"][feature];
        let assertions = test["assertions"].as_array().map(Vec::len).unwrap_or(0);
        assert!(assertions >= 1, "{feature} has no assertions of its own");
        assert!(
            test["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{feature} has no description"
        );
    }
}

/// A test's fixtures with `_global`'s: per resource, `_global`'s objects first, an
/// object of the test with the same namespace/name replacing the global one (as
/// `hapwright test` merges them).
pub fn test_fixtures(library: &Value, test: &str) -> Value {
    let mut merged = library["validationTests"]["_global"]["fixtures"].clone();
    let own = library["validationTests"][test]["fixtures"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let key = |o: &Value| {
        (
            o["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_owned(),
            o["metadata"]["name"].as_str().unwrap_or("").to_owned(),
        )
    };
    for (name, objects) in own {
        let list = merged[&name].as_array().cloned().unwrap_or_default();
        let mut list: Vec<Value> = list;
        for object in objects.as_array().cloned().unwrap_or_default() {
            match list.iter_mut().find(|o| key(o) == key(&object)) {
                Some(slot) => *slot = object,
                None => list.push(object),
            }
        }
        merged[&name] = Value::Array(list);
    }
    merged
}

/// Writes `fixtures` (resource name → objects) as `DIR/fixtures/<name>/objects.json`
/// and renders them with the library `config` into `DIR/out`.
pub fn render(config: &Path, dir: &Path, fixtures: &Value) -> PathBuf {
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
        .arg(config)
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
pub fn rendered(dir: &Path) -> RenderedConfig {
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

/// An HTTP server on loopback that answers every request with 200 and a body of
/// `name`, a newline, then the request's head as received (request line and
/// headers), so a test sees who answered and what HAProxy sent. A request whose
/// target has `delay-ms=N` is answered N milliseconds late (a slow backend for
/// timeout tests); of the requests whose target has `fail-every-other`, the first,
/// third, ... are answered 503 (a backend for retry tests). One thread, one
/// connection at a time; it lives as long as the test process.
pub fn upstream(name: &'static str) -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind upstream");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        let mut failing = 0u64;
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
            let head = String::from_utf8_lossy(&request);
            let target = head.lines().next().unwrap_or_default();
            let delay = target
                .split("delay-ms=")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|ms| ms.parse().ok());
            if let Some(ms) = delay {
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
            // `status=NNN` in the target: that status (an upstream's error page).
            let asked = target
                .split("status=")
                .nth(1)
                .and_then(|rest| rest.get(..3))
                .filter(|code| code.bytes().all(|b| b.is_ascii_digit()))
                .map(|code| format!("{code} Asked For"));
            let status = if let Some(asked) = asked.as_deref() {
                asked
            } else if target.contains("fail-every-other") {
                failing += 1;
                if failing % 2 == 1 {
                    "503 Service Unavailable"
                } else {
                    "200 OK"
                }
            } else {
                "200 OK"
            };
            let body = format!("{name}\n{head}");
            // The whole response in one write: in pieces, the later ones can wait
            // for HAProxy's delayed ACK (Nagle), 40 ms now and then.
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nX-Upstream: {name}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.set_nodelay(true);
            let _ = stream.write_all(response.as_bytes());
        }
    });
    port
}

/// The Gateway API library's watched resources `(name, apiVersion, kind)`.
pub const GATEWAY_SOURCES: &[(&str, &str, &str)] = &[
    (
        "gatewayclasses",
        "gateway.networking.k8s.io/v1",
        "GatewayClass",
    ),
    ("gateways", "gateway.networking.k8s.io/v1", "Gateway"),
    ("httproutes", "gateway.networking.k8s.io/v1", "HTTPRoute"),
    ("grpcroutes", "gateway.networking.k8s.io/v1", "GRPCRoute"),
    ("tlsroutes", "gateway.networking.k8s.io/v1", "TLSRoute"),
    (
        "tcproutes",
        "gateway.networking.k8s.io/v1alpha2",
        "TCPRoute",
    ),
    (
        "referencegrants",
        "gateway.networking.k8s.io/v1beta1",
        "ReferenceGrant",
    ),
    ("namespaces", "v1", "Namespace"),
    ("services", "v1", "Service"),
    ("endpointslices", "discovery.k8s.io/v1", "EndpointSlice"),
    ("secrets", "v1", "Secret"),
    (
        "backendtlspolicies",
        "gateway.networking.k8s.io/v1",
        "BackendTLSPolicy",
    ),
    ("configmaps", "v1", "ConfigMap"),
];

/// The Ingress library's watched resources `(name, apiVersion, kind)`.
pub const INGRESS_SOURCES: &[(&str, &str, &str)] = &[
    ("ingresses", "networking.k8s.io/v1", "Ingress"),
    ("services", "v1", "Service"),
    ("endpointslices", "discovery.k8s.io/v1", "EndpointSlice"),
    ("secrets", "v1", "Secret"),
];

/// The Gateway API library with files sources standing in for the API server, a
/// free stats port and a small `maxconn`.
pub fn gateway_config() -> Value {
    let mut config = library_value(&library_path("examples/gateway-api/hapwright.yaml"));
    use_files_sources(&mut config, GATEWAY_SOURCES);
    config["extraContext"]["statsPort"] = json!(free_port());
    config["extraContext"]["maxconn"] = json!(1000);
    config
}

/// A Gateway `edge` in namespace infra of the class `hapwright`, with `listeners`.
pub fn edge_gateway(listeners: Value) -> Value {
    json!([{
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": { "name": "edge", "namespace": "infra" },
        "spec": { "gatewayClassName": "hapwright", "listeners": listeners }
    }])
}

/// The Ingress library with files sources standing in for the API server, its
/// frontends on `http` and `https`, a free stats port and a small `maxconn`.
pub fn ingress_config(http: u16, https: u16) -> Value {
    let mut config = library_value(&library_path("examples/kubernetes-ingress/hapwright.yaml"));
    use_files_sources(&mut config, INGRESS_SOURCES);
    config["extraContext"]["httpPort"] = json!(http);
    config["extraContext"]["httpsPort"] = json!(https);
    config["extraContext"]["statsPort"] = json!(free_port());
    config["extraContext"]["maxconn"] = json!(1000);
    config
}

/// Replaces the `kubernetes` source of each watched resource `(name, apiVersion,
/// kind)` with a `files` source reading `./resources/<name>` (without `optional`,
/// which only `kubernetes` sources take), and drops the library's `validationTests`.
pub fn use_files_sources(config: &mut Value, resources: &[(&str, &str, &str)]) {
    config
        .as_object_mut()
        .expect("config")
        .remove("validationTests");
    for (name, api_version, kind) in resources {
        let resource = config["watchedResources"][*name]
            .as_object_mut()
            .unwrap_or_else(|| panic!("watched resource {name}"));
        assert!(
            resource.remove("kubernetes").is_some(),
            "{name} is a kubernetes source"
        );
        resource.remove("optional");
        resource.insert(
            "files".into(),
            json!({ "path": format!("./resources/{name}") }),
        );
        resource.insert("apiVersion".into(), json!(api_version));
        resource.insert("kind".into(), json!(kind));
    }
}

/// The sidecar's `controller.debounce`.
pub const DEBOUNCE_MS: u64 = 20;

/// The sidecar's `controller.minDeploymentInterval`.
pub const MIN_DEPLOYMENT_INTERVAL_MS: u64 = 50;

/// Objects per file [`write_objects`] writes: thousands of TLS Secrets would pass the
/// files source's 10 MiB limit per file.
const OBJECTS_PER_FILE: usize = 1000;

/// Writes `objects` as `DIR/resources/<name>/objects.json` (a longer list as
/// `objects-<n>.json` files of [`OBJECTS_PER_FILE`] each), atomically per file.
pub fn write_objects(dir: &Path, name: &str, objects: &Value) {
    let resource = dir.join("resources").join(name);
    fs::create_dir_all(&resource).expect("resource dir");
    for entry in fs::read_dir(&resource).expect("resource dir") {
        let path = entry.expect("entry").path();
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default();
        if file.starts_with("objects-") && file.ends_with(".json") {
            fs::remove_file(&path).expect("remove an earlier part");
        }
    }
    let write = |file: &str, objects: &Value| {
        let temporary = resource.join(format!(".{file}.tmp"));
        fs::write(
            &temporary,
            serde_json::to_string_pretty(objects).expect("json"),
        )
        .expect("write");
        fs::rename(&temporary, resource.join(file)).expect("rename");
    };
    match objects.as_array() {
        Some(list) if list.len() > OBJECTS_PER_FILE => {
            for (n, part) in list.chunks(OBJECTS_PER_FILE).enumerate() {
                write(&format!("objects-{n}.json"), &Value::Array(part.to_vec()));
            }
            let _ = fs::remove_file(resource.join("objects.json"));
        }
        _ => write("objects.json", objects),
    }
}

/// An EndpointSlice of Service `namespace/service` with one ready endpoint on
/// 127.0.0.1 per port (the port named `port_name`).
pub fn loopback_slice(namespace: &str, service: &str, port_name: &str, ports: &[u16]) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{service}-abcde"),
            "namespace": namespace,
            "labels": { "kubernetes.io/service-name": service }
        },
        "addressType": "IPv4",
        "ports": ports.iter().map(|port| json!({ "name": port_name, "port": port, "protocol": "TCP" })).collect::<Vec<_>>(),
        "endpoints": [ { "addresses": ["127.0.0.1"], "conditions": { "ready": true } } ]
    })
}

/// The sidecar manifest's haproxy container command and working directory, with the
/// pod's paths (`/etc/haproxy`, `/run/haproxy`) moved into `dir`, and the bootstrap
/// `haproxy.cfg` of its ConfigMap.
fn sidecar_haproxy(dir: &Path) -> (Vec<String>, PathBuf, String) {
    let root = repository().join("deploy/sidecar");
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

/// `hapwright run` and the HAProxy it deploys to, stopped (and their leftovers
/// killed) when dropped.
pub struct Sidecar {
    /// The temporary directory: config, `resources/`, HAProxy's files and logs.
    pub dir: tempfile::TempDir,
    haproxy: Option<Child>,
    hapwright: Option<Child>,
    /// Port of hapwright's status server (`controller.listen`).
    pub status: u16,
    /// An HTTP client without proxies, pooling or redirects, accepting any
    /// certificate, with `resolve` entries added by [`Sidecar::start`]'s caller.
    pub client: reqwest::blocking::Client,
}

impl Sidecar {
    /// The status last rendered for `resource` `namespace/name`, as `/debug/status`
    /// shows it (objects of `files` sources are rendered, never written); `None`
    /// until there is one.
    pub fn rendered_status(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let text = self
            .client
            .get(format!("http://127.0.0.1:{}/debug/status", self.status))
            .send()
            .and_then(|r| r.text())
            .ok()?;
        let all: Value = serde_json::from_str(&text).ok()?;
        all["statuses"]
            .as_array()?
            .iter()
            .find(|s| s["resource"] == resource && s["namespace"] == namespace && s["name"] == name)
            .map(|s| s["status"].clone())
    }

    /// Starts HAProxy as the sidecar manifest does (its bootstrap config binding
    /// `bootstrap_port` instead of `:8080`), then `hapwright run` with `config`
    /// (whose `haproxy` and `controller` sections are set here) and the objects of
    /// `resources` (name → objects) as files, and waits until hapwright is ready
    /// (its first deployment done). `client` builds the HTTP client (add `resolve`
    /// entries there).
    pub fn start(
        prefix: &str,
        config: Value,
        resources: &[(&str, Value)],
        bootstrap_port: u16,
        client: reqwest::blocking::ClientBuilder,
    ) -> Sidecar {
        Self::start_with_env(prefix, config, resources, bootstrap_port, client, &[])
    }

    /// [`Sidecar::start`] with `env` added to HAProxy's environment (what its
    /// `%[env(NAME)]` and `${NAME}` would read).
    pub fn start_with_env(
        prefix: &str,
        config: Value,
        resources: &[(&str, Value)],
        bootstrap_port: u16,
        client: reqwest::blocking::ClientBuilder,
        env: &[(&str, &str)],
    ) -> Sidecar {
        Self::start_waiting(prefix, config, resources, bootstrap_port, client, env, WAIT)
    }

    /// [`Sidecar::start_with_env`], waiting up to `wait` for the first deployment
    /// (the benchmark suite starts it with thousands of objects).
    pub fn start_waiting(
        prefix: &str,
        mut config: Value,
        resources: &[(&str, Value)],
        bootstrap_port: u16,
        client: reqwest::blocking::ClientBuilder,
        env: &[(&str, &str)],
        wait: Duration,
    ) -> Sidecar {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("temp dir");
        let status = free_port();
        // `haproxy.dynamicBackends` given by the caller is kept.
        let dynamic_backends = config["haproxy"]["dynamicBackends"]
            .as_bool()
            .unwrap_or(false);
        config["haproxy"] = json!({
            "binary": "haproxy",
            "dynamicBackends": dynamic_backends,
            "instances": [ { "name": "local", "socket": { "master": "./run/master.sock", "configDir": "./haproxy" } } ]
        });
        config["controller"] = json!({
            "listen": format!("127.0.0.1:{status}"),
            "debounce": format!("{DEBOUNCE_MS}ms"), "maxWait": "200ms",
            "minDeploymentInterval": format!("{MIN_DEPLOYMENT_INTERVAL_MS}ms"),
            "minReloadInterval": "50ms"
        });
        fs::write(
            dir.path().join("hapwright.yaml"),
            serde_json::to_string_pretty(&config).expect("json"),
        )
        .expect("write config");
        for (name, objects) in resources {
            write_objects(dir.path(), name, objects);
        }
        // A files source the test gives no objects starts empty (a missing directory
        // would make it unhealthy).
        let watched = config["watchedResources"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for (name, source) in watched {
            if source.get("files").is_some() && !dir.path().join("resources").join(&name).exists() {
                write_objects(dir.path(), &name, &json!([]));
            }
        }

        // HAProxy as the pod starts it: the init container's bootstrap, then the
        // manifest's command in the manifest's working directory.
        let (command, working_dir, bootstrap) = sidecar_haproxy(dir.path());
        for sub in ["haproxy/maps", "haproxy/files", "haproxy/certs", "run"] {
            fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
        }
        fs::write(
            dir.path().join("haproxy/haproxy.cfg"),
            bootstrap.replace("bind :8080", &format!("bind 127.0.0.1:{bootstrap_port}")),
        )
        .expect("bootstrap config");
        let log = |name: &str| fs::File::create(dir.path().join(name)).expect("log file");
        let haproxy = Command::new(&command[0])
            .args(&command[1..])
            .envs(env.iter().copied())
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
        let client = client
            .no_proxy()
            .pool_max_idle_per_host(0)
            .redirect(reqwest::redirect::Policy::none())
            .danger_accept_invalid_certs(true)
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .build()
            .expect("HTTP client");
        let sidecar = Sidecar {
            dir,
            haproxy: Some(haproxy),
            hapwright: Some(hapwright),
            status,
            client,
        };
        let ready = poll(wait, || {
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

    /// The process id of `hapwright run`.
    pub fn hapwright_pid(&self) -> Option<u32> {
        self.hapwright.as_ref().map(Child::id)
    }

    /// hapwright's and HAProxy's logs.
    pub fn log(&self) -> String {
        let read = |name: &str| fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!(
            "--- hapwright.log ---\n{}\n--- hapwright.err ---\n{}\n--- haproxy.log ---\n{}",
            read("hapwright.log"),
            read("hapwright.err"),
            read("haproxy.log")
        )
    }

    /// Panics with `message` and the logs.
    pub fn fail(&self, message: &str) -> ! {
        panic!("{message}\n{}", self.log())
    }

    /// Sends `request` and returns its status, `Location` header and body.
    pub fn send(
        &self,
        request: reqwest::blocking::RequestBuilder,
    ) -> Result<(u16, String, String), String> {
        let response = request.send().map_err(|e| format!("{e:?}"))?;
        let status = response.status().as_u16();
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        Ok((
            status,
            location,
            response.text().map_err(|e| format!("{e:?}"))?,
        ))
    }

    /// `GET http://127.0.0.1:<port><path>` with `Host: host`: status and body.
    pub fn get(&self, port: u16, host: &str, path: &str) -> Result<(u16, String), String> {
        self.send(
            self.client
                .get(format!("http://127.0.0.1:{port}{path}"))
                .header(reqwest::header::HOST, host),
        )
        .map(|(status, _, body)| (status, body))
    }

    /// Asserts that `GET host path` on `port` answers `status` with a body that
    /// starts with `body`.
    pub fn expect(&self, port: u16, host: &str, path: &str, status: u16, body: &str) {
        match self.get(port, host, path) {
            Ok((s, b)) if s == status && b.starts_with(body) => {}
            other => self.fail(&format!(
                "{host}{path} on :{port}: expected {status} {body:?}, got {other:?}"
            )),
        }
    }

    /// The `local` instance of `/debug/instances`.
    pub fn instance(&self) -> Value {
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

    /// Writes `objects` for resource `name` and waits for the deployment that
    /// follows: the instance's status after it.
    pub fn change(&self, name: &str, objects: &Value) -> Value {
        let deployments = self.instance()["deployments"]
            .as_u64()
            .expect("deployments");
        write_objects(self.dir.path(), name, objects);
        poll(WAIT, || {
            let instance = self.instance();
            (instance["deployments"].as_u64() > Some(deployments)).then_some(instance)
        })
        .unwrap_or_else(|_| self.fail(&format!("the change of {name} was never deployed")))
    }

    /// The tenant scenario both libraries' tests set up (victim.test the victim's,
    /// `/admin` added by the attacker's newer object, its regex `/x|.*` on
    /// evil.test): the Host spellings an attacker tries (trailing dot, case, port)
    /// reach the victim's routes, the newer object only adds what nobody had, and the
    /// regex serves its own host only.
    pub fn expect_hosts_stay_their_owners(&self, http: u16) {
        for host in [
            "victim.test",
            "victim.test.",
            "VICTIM.TEST",
            "victim.test:80",
            "Victim.Test.:8080",
        ] {
            self.expect(http, host, "/", 200, "victim");
            self.expect(http, host, "/grab", 200, "victim");
            self.expect(http, host, "/login", 200, "victim");
        }
        // Objects of several namespaces share a host unless hostOwnership is on.
        self.expect(http, "victim.test", "/admin", 200, "evil");
        self.expect(http, "evil.test", "/x", 200, "evil");
        self.expect(http, "evil.test.", "/anything", 200, "evil");
        self.expect(http, "victim.test", "/x", 200, "victim");
        self.expect(http, "other.test", "/x", 200, "other");
    }

    /// The `haproxy.cfg` deployed to the sidecar HAProxy.
    pub fn deployed_config(&self) -> String {
        fs::read_to_string(self.dir.path().join("haproxy/haproxy.cfg"))
            .unwrap_or_else(|e| self.fail(&format!("the deployed haproxy.cfg: {e}")))
    }

    /// The subject of the certificate HAProxy presents on `port` for SNI `name`.
    pub fn served_certificate(&self, port: u16, name: &str) -> String {
        let output = Command::new("openssl")
            .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
            .args(["-servername", name])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| self.fail(&format!("run openssl s_client: {e}")));
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix("subject="))
            .map(str::to_owned)
            .unwrap_or_else(|| self.fail(&format!("no certificate for SNI {name}: {text}")))
    }

    /// `/debug/quarantine` once it holds `count` objects (bounded wait).
    pub fn quarantine(&self, count: u64) -> Value {
        poll(WAIT, || {
            let text = self
                .client
                .get(format!("http://127.0.0.1:{}/debug/quarantine", self.status))
                .send()
                .and_then(|r| r.text())
                .ok()?;
            let value: Value = serde_json::from_str(&text).ok()?;
            (value["count"] == count).then_some(value)
        })
        .unwrap_or_else(|_| self.fail(&format!("/debug/quarantine never held {count} objects")))
    }

    /// How often the HAProxy master reloaded (`show proc`).
    pub fn master_reloads(&self) -> u64 {
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
