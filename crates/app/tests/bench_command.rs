//! `hapwright bench`: the real binary on small configs in temp dirs, with the real
//! `haproxy -c` for phase 2. Only the shape of the report and the exit codes are
//! checked, never how fast anything is.

#[macro_use]
mod support;

use std::process::Output;

use serde_json::Value;
use support::{project, stderr, stdout};

/// Cluster mode: `services` has `kind: Service`, `endpoints` `kind: EndpointSlice`.
/// `extraContext.limit` makes the main template fail above that many Services.
const CLUSTER: &str = concat!(
    r#"
watchedResources:
  services:
    files: { path: ./resources }
    kind: Service
  endpoints:
    files: { path: ./resources }
    kind: EndpointSlice
    indexBy: [metadata.namespace, 'metadata.labels.kubernetes\.io/service-name']
"#,
    haproxy_config_start!(),
    r#"    frontend fe
        bind 127.0.0.1:18080
        use_backend %[req.hdr(host),lower,map({{ path("hosts.map") }})]
    {%- if resources.services.list() | length > extraContext.limit %}
    {{ fail("more than " ~ extraContext.limit ~ " services") }}
    {%- endif %}
    {%- for s in resources.services.list() %}
    backend be_{{ s.metadata.namespace }}_{{ s.metadata.name }}
    {%- for slice in resources.endpoints.fetch(s.metadata.namespace, s.metadata.name) %}
    {%- for ep in slice.endpoints %}
        server {{ ep.targetRef.name }} {{ ep.addresses[0] }}:{{ slice.ports[0].port }}
    {%- endfor %}
    {%- endfor %}
    {%- endfor %}
maps:
  hosts.map:
    template: |
      {%- for s in resources.services.list() %}
      {{ s.metadata.name }}.test be_{{ s.metadata.namespace }}_{{ s.metadata.name }}
      {%- endfor %}
extraContext: { limit: 1000 }
haproxy: { binary: haproxy }
"#
);

/// Fixture mode: the watched resource has no kind the generator knows, so the
/// `validationTests` fixtures are copied; `app` references `web` by name.
const FIXTURES: &str = concat!(
    r#"
watchedResources:
  apps:
    files: { path: ./resources }
    kind: App
"#,
    haproxy_config_start!(),
    r#"    frontend fe
        bind 127.0.0.1:18081
        http-request deny
    {%- for a in resources.apps.list() %}
    backend be_{{ a.metadata.name }}
        server s1 127.0.0.1:{{ a.spec.port }}
    {%- if a.spec.backup is defined %}
        server backup 127.0.0.1:{{ resources.apps.get(a.metadata.namespace, a.spec.backup).spec.port }}
    {%- endif %}
    {%- endfor %}
haproxy: { binary: haproxy }
validationTests:
  _global:
    fixtures:
      apps:
        - { kind: App, metadata: { name: web }, spec: { port: 9001 } }
  with-backup:
    fixtures:
      apps:
        - { kind: App, metadata: { name: api }, spec: { port: 9002, backup: web } }
    assertions:
      - { type: haproxy_valid }
"#
);

fn bench(dir: &tempfile::TempDir, args: &[&str]) -> Output {
    support::hapwright(
        dir.path(),
        &[&["bench", "-c", "hapwright.yaml"], args].concat(),
    )
}

fn json(output: &Output) -> Value {
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(output)))
}

const KEYS: [&str; 7] = [
    "scale",
    "objects",
    "compile_ms",
    "render_ms",
    "phase1_ms",
    "phase2_ms",
    "peak_rss_bytes",
];

fn assert_schema(report: &Value) -> &Vec<Value> {
    let object = report.as_object().expect("an object");
    assert_eq!(object.keys().collect::<Vec<_>>(), ["scales"], "{report}");
    let scales = report["scales"].as_array().expect("scales is a list");
    for scale in scales {
        let entry = scale.as_object().expect("each scale is an object");
        assert_eq!(entry.keys().collect::<Vec<_>>(), KEYS, "{scale}");
        for key in ["scale", "objects", "peak_rss_bytes"] {
            assert!(scale[key].is_u64(), "{key} is a whole number: {scale}");
        }
        for key in ["compile_ms", "render_ms", "phase1_ms", "phase2_ms"] {
            assert!(
                scale[key].as_f64().is_some_and(|v| v >= 0.0),
                "{key} is a number of milliseconds: {scale}"
            );
        }
        assert!(scale["peak_rss_bytes"].as_u64().unwrap_or(0) > 0, "{scale}");
    }
    scales
}

#[test]
fn json_report_has_one_entry_per_scale_in_cluster_mode() {
    let dir = project(CLUSTER);
    let report = json(&bench(&dir, &["--scale", "3,20", "--output", "json"]));
    let scales = assert_schema(&report);
    let counts: Vec<(u64, u64)> = scales
        .iter()
        .map(|s| (s["scale"].as_u64().unwrap(), s["objects"].as_u64().unwrap()))
        .collect();
    // One Service and one EndpointSlice per scale unit.
    assert_eq!(counts, [(3, 6), (20, 40)]);
}

#[test]
fn fixture_mode_copies_fixtures_with_unique_names() {
    let dir = project(FIXTURES);
    let report = json(&bench(&dir, &["--scale", "4", "--output", "json"]));
    let scales = assert_schema(&report);
    // `web` and `api`, four copies each. Phase 1 and `haproxy -c` passed, so every
    // backend name is unique and each `backup: web-<k>` found its own copy.
    assert_eq!(scales[0]["objects"], 8);
}

#[test]
fn in_process_mode_reports_the_same_schema() {
    let dir = project(CLUSTER);
    let report = json(&bench(
        &dir,
        &["--scale", "2,5", "--output", "json", "--in-process"],
    ));
    assert_eq!(assert_schema(&report).len(), 2);
}

#[test]
fn text_output_is_a_table() {
    let dir = project(CLUSTER);
    let output = bench(&dir, &["--scale", "1_0,2"]);
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    for column in [
        "scale",
        "objects",
        "compile ms",
        "render ms",
        "phase1 ms",
        "phase2 ms",
        "peak RSS MiB",
    ] {
        assert!(lines[0].contains(column), "{column} in {text}");
    }
    let first: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(&first[..2], ["10", "20"], "{text}");
    assert_eq!(lines[2].split_whitespace().next(), Some("2"), "{text}");
}

#[test]
fn bad_scale_arguments_exit_2() {
    let dir = project(CLUSTER);
    for bad in ["10,x", "0", "10,,100", "-5", ""] {
        let output = bench(&dir, &[&format!("--scale={bad}")]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "--scale {bad:?}: {}",
            stderr(&output)
        );
        assert!(stderr(&output).contains("--scale"), "{}", stderr(&output));
    }
}

#[test]
fn invalid_config_exits_2() {
    let dir = project("watchedResources: [not, a, map]\n");
    let output = bench(&dir, &["--scale", "10"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
}

#[test]
fn a_template_that_fails_to_render_exits_1_with_the_error() {
    let dir = project(&CLUSTER.replace("limit: 1000", "limit: 5"));
    // 3 renders; 10 does not.
    let output = bench(&dir, &["--scale", "3,10", "--output", "json"]);
    assert_eq!(output.status.code(), Some(1), "{}", stdout(&output));
    let err = stderr(&output);
    assert!(err.contains("more than 5 services"), "{err}");
    assert!(err.contains("scale 10: rendering failed"), "{err}");
    assert!(
        stdout(&output).is_empty(),
        "no partial report: {}",
        stdout(&output)
    );
}

#[test]
fn a_template_that_does_not_compile_exits_1() {
    let dir = project(&CLUSTER.replace(
        "{%- for s in resources.services.list() %}\n    backend",
        "{%- for s in resources.services.list() %}\n    {{ nope( }}\n    backend",
    ));
    let output = bench(&dir, &["--scale", "3"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(!stderr(&output).is_empty());
}

#[test]
fn haproxy_rejecting_the_render_exits_1() {
    let dir = project(&CLUSTER.replace(
        "    frontend fe\n",
        "    frontend fe\n        bogus-keyword on\n",
    ));
    let output = bench(&dir, &["--scale", "2"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("validation phase 2 (haproxy -c) failed"),
        "{err}"
    );
    assert!(err.contains("bogus-keyword"), "{err}");
}

#[test]
fn fixture_mode_without_fixtures_exits_1() {
    let config = FIXTURES
        .split("validationTests:")
        .next()
        .expect("config text")
        .to_owned();
    let dir = project(&config);
    let output = bench(&dir, &["--scale", "2"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("nothing to generate fixtures from"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn the_gateway_library_is_benched_with_a_generated_cluster() {
    // `kubernetes` sources name their kind inside their section; the Gateway library
    // watches GatewayClasses, Gateways and HTTPRoutes that way. Cluster mode gives
    // it one GatewayClass, one Gateway and one HTTPRoute per Service, which it must
    // render into a config `haproxy -c` accepts.
    let library = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/gateway-api/hapwright.yaml");
    let dir = tempfile::tempdir().expect("temp dir");
    let output = support::hapwright(
        dir.path(),
        &[
            "bench",
            "-c",
            library.to_str().expect("UTF-8 path"),
            "--scale",
            "3",
            "--output",
            "json",
        ],
    );
    let report = json(&output);
    let scales = assert_schema(&report);
    // Three Services, EndpointSlices and HTTPRoutes; one GatewayClass, Gateway and
    // TLS Secret.
    assert_eq!(scales[0]["objects"], 12, "{report}");
}
