//! Loading the controller's config file: the full example config, located parse errors,
//! semantic checks, path resolution and secret handling.

use std::path::{Path, PathBuf};

use hapwright_app::config::{Config, LogFormat, load};
use hapwright_deployer::config::{Address, Driver};
use hapwright_eventbus::config::Duration;
use hapwright_watchers::config::Source;

const DESIGN_EXAMPLE: &str = r#"watchedResources:
  services:
    files: { path: ./resources }
    kind: Service
    indexBy: [metadata.namespace, metadata.name]
  endpoints:
    kubernetes: { apiVersion: discovery.k8s.io/v1, kind: EndpointSlice,
                  namespaces: [default], labelSelector: "app=web" }
    indexBy: ['metadata.labels.kubernetes\.io/service-name']
    ignoreFields: [metadata.managedFields]
haproxyConfig: { template: "global\n" }
templateSnippets: { backend-servers: { template: "x" } }
maps: { hosts.map: { template: "a b" } }
files: { 503.http: { template: "HTTP/1.0 503" } }
sslCertificates: { default.pem: { template: "" } }
extraContext: { httpPort: 8080 }
templating:
  trimBlocks: false
  lstripBlocks: false
  strictUndefined: false
validationTests:
  basic-route:
    fixtures: { services: [ {apiVersion: v1, kind: Service, metadata: {name: web}} ] }
    assertions:
      - { type: haproxy_valid }
      - { type: contains, target: haproxy.cfg, pattern: 'backend default_web' }
haproxy:
  binary: haproxy
  instances:
    - name: local
      socket:
        master: run/master.sock
        runtime: /run/haproxy/admin.sock
        configDir: haproxy
      managed: true
      env: { HTTP_PORT: "8080" }
    - name: edge-2
      dataplane: { url: http://10.0.0.2:5555, username: admin, passwordFile: secrets/dp }
  discovery:
    kubernetes: { namespace: ingress, labelSelector: app=haproxy, port: 5555 }
controller:
  debounce: 200ms
  maxWait: 2s
  minDeploymentInterval: 2s
  minReloadInterval: 5s
  driftPreventionInterval: 60s
  deploymentTimeout: 30s
  listen: 127.0.0.1:9400
  metricsListen: 0.0.0.0:9401
  logLevel: info
  logFormat: json
"#;

fn setup(config: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("secrets")).unwrap();
    std::fs::write(dir.path().join("secrets/dp"), "hunter2\n").unwrap();
    let path = dir.path().join("hapwright.yaml");
    std::fs::write(&path, config).unwrap();
    (dir, path)
}

fn errors(config: &str) -> Vec<String> {
    let (_dir, path) = setup(config);
    load(&path)
        .expect_err("the config is invalid")
        .iter()
        .map(|d| {
            d.to_string()
                .replace(&path.display().to_string(), "hapwright.yaml")
        })
        .collect()
}

fn minimal(extra: &str) -> String {
    format!("haproxyConfig: {{ template: x }}\n{extra}")
}

#[test]
fn the_design_example_loads_with_paths_resolved() {
    let (dir, path) = setup(DESIGN_EXAMPLE);
    let loaded = load(&path).unwrap();
    let config = &loaded.config;
    let base = std::path::absolute(dir.path()).unwrap();
    let services = &config.watched_resources.resources["services"];
    assert!(
        matches!(services.source(), Some(Source::Files(f)) if f.path == base.join("./resources"))
    );
    assert!(matches!(
        config.watched_resources.resources["endpoints"].source(),
        Some(Source::Kubernetes(k)) if k.kind == "EndpointSlice"
    ));
    let Some(Driver::Socket(socket)) = config.haproxy.instances[0].driver() else {
        panic!("socket instance");
    };
    assert_eq!(socket.master, Address::Unix(base.join("run/master.sock")));
    assert_eq!(socket.config_dir, base.join("haproxy"));
    let Some(Driver::Dataplane(dataplane)) = config.haproxy.instances[1].driver() else {
        panic!("dataplane instance");
    };
    assert_eq!(dataplane.password.as_ref().unwrap().expose(), "hunter2");
    assert_eq!(config.controller.debounce, Duration::from_millis(200));
    assert_eq!(config.controller.log_format, LogFormat::Json);
    assert_eq!(
        config.controller.deploy_timings().min_reload_interval,
        Duration::from_secs(5)
    );
    assert_eq!(config.templates.extra_context["httpPort"], 8080);
    assert_eq!(
        loaded.watched_files,
        [path.clone(), base.join("secrets/dp")]
    );
}

#[test]
fn defaults_fill_a_minimal_file() {
    let (_dir, path) = setup(&minimal(""));
    let config = load(&path).unwrap().config;
    assert_eq!(config.controller.listen.to_string(), "127.0.0.1:9400");
    assert_eq!(config.controller.max_wait, Duration::from_secs(2));
    assert_eq!(config.controller.log_level, "info");
    assert_eq!(config.haproxy.binary, Path::new("haproxy"));
    assert!(config.watched_resources.resources.is_empty());
}

#[test]
fn secrets_never_reach_debug_or_json() {
    let (_dir, path) = setup(DESIGN_EXAMPLE);
    let loaded = load(&path).unwrap();
    let debug = format!("{loaded:?}");
    assert!(!debug.contains("hunter2"));
    let json = serde_json::to_string(&loaded.config).unwrap();
    assert!(!json.contains("hunter2"), "{json}");
    assert!(json.contains("<redacted>"));
    // The effective config serializes in the file's own (flat) shape.
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(value.get("haproxyConfig").is_some());
    assert!(value.get("watchedResources").is_some());
}

#[test]
fn unknown_keys_are_located_with_a_suggestion() {
    assert_eq!(
        errors(&minimal("controller:\n  debunce: 200ms\n")),
        ["hapwright.yaml:3:3: controller.debunce: unknown field, did you mean `debounce`?"]
    );
    assert_eq!(
        errors("haproxyConfig: { template: x }\nwatchedResource: {}\n"),
        ["hapwright.yaml:2:1: watchedResource: unknown field, did you mean `watchedResources`?"]
    );
    let nested = errors(&minimal(
        "watchedResources:\n  svc:\n    files: { path: x, setle: 10ms }\n",
    ));
    assert_eq!(
        nested,
        [
            "hapwright.yaml:4:23: watchedResources.svc.files.setle: unknown field, did you mean `settle`?"
        ]
    );
}

#[test]
fn bad_values_are_located() {
    let e = errors(&minimal("controller:\n  maxWait: 2x\n"));
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with(
            "hapwright.yaml:3:12: controller.maxWait: invalid duration `2x`: unknown unit `x`"
        ),
        "{e:?}"
    );
    let e = errors(&minimal("controller:\n  debounce: 200\n"));
    assert!(
        e[0].contains("controller.debounce: invalid duration `200`: missing unit"),
        "{e:?}"
    );
    let e = errors(&minimal("controller:\n  listen: nowhere\n"));
    assert!(
        e[0].starts_with("hapwright.yaml:3:11: controller.listen: "),
        "{e:?}"
    );
    let e = errors(&minimal("controller:\n  logFormat: xml\n"));
    assert!(
        e[0].starts_with("hapwright.yaml:3:14: controller.logFormat: "),
        "{e:?}"
    );
    let e = errors("maps: {}\n");
    assert!(e[0].contains("haproxyConfig"), "{e:?}");
    let e = errors(&minimal("maps: [\n"));
    assert!(e[0].starts_with("hapwright.yaml:"), "{e:?}");
}

#[test]
fn semantic_errors_are_located_and_all_reported() {
    let e = errors(&minimal(
        r#"watchedResources:
  both:
    files: { path: a }
    kubernetes: { apiVersion: v1, kind: Service }
  empty:
    files: { path: a }
    indexBy: []
haproxy:
  instances:
    - name: edge
      dataplane: { url: http://x, username: u, passwordFile: missing/dp }
validationTests:
  t:
    fixtures: { nope: [] }
    assertions: [ { type: haproxy_valid } ]
controller:
  debounce: 5s
  maxWait: 1s
  logLevel: "info,[["
"#,
    ));
    let expected = [
        "hapwright.yaml:5:5: watchedResources.both.kubernetes: a resource has one source, but both `files` and `kubernetes` are set",
        "hapwright.yaml:8:5: watchedResources.empty.indexBy: indexBy is empty",
        "hapwright.yaml:15:17: validationTests.t.fixtures.nope: `nope` is not a watched resource",
        "hapwright.yaml:12:48: haproxy.instances[0].dataplane.passwordFile: cannot read ",
        "hapwright.yaml:19:3: controller.maxWait: maxWait (1s) is shorter than debounce (5s)",
        "hapwright.yaml:20:3: controller.logLevel: not a log level",
    ];
    for wanted in expected {
        assert!(
            e.iter().any(|line| line.starts_with(wanted)),
            "missing {wanted:?} in {e:#?}"
        );
    }
    assert_eq!(e.len(), expected.len(), "{e:#?}");
    assert!(!e.iter().any(|line| line.contains("hunter2")));
}

#[test]
fn unreadable_and_non_utf8_config_files() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.yaml");
    let e = load(&missing).unwrap_err();
    assert!(
        e[0].to_string().contains("cannot read config file"),
        "{}",
        e[0]
    );
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, b"haproxyConfig: { template: \"\xff\" }\n").unwrap();
    let e = load(&bad).unwrap_err();
    assert!(
        e[0].to_string()
            .starts_with(&format!("{}:1:29: invalid UTF-8", bad.display())),
        "{}",
        e[0]
    );
}

#[test]
fn a_kubernetes_source_is_accepted_by_the_loader() {
    let (_dir, path) = setup(&minimal(
        "watchedResources:\n  pods:\n    kubernetes: { apiVersion: v1, kind: Pod }\n",
    ));
    let config: Config = load(&path).unwrap().config;
    assert!(matches!(
        config.watched_resources.resources["pods"].source(),
        Some(Source::Kubernetes(_))
    ));
}

#[test]
fn alias_bombs_in_the_config_file_are_rejected() {
    let mut text = minimal("extraContext:\n");
    text.push_str("  l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..10 {
        let p = level - 1;
        text.push_str(&format!("  l{level}: &l{level} [*l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}]\n"));
    }
    let e = errors(&text);
    assert!(e[0].contains("input rejected by parse limits"), "{e:?}");
}
