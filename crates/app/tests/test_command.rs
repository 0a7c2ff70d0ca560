//! `hapwright test`: the real binary on small configs in temp dirs, with the real
//! `haproxy -c` behind `haproxy_valid`.

#[macro_use]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use support::{BIN, stderr, stdout};

/// A config with one watched resource (`services`), a main template, a map and a file.
/// `extraContext.fail` makes the main template call `fail()`; a Service with
/// `spec.broken: true` renders a line HAProxy rejects.
const BASE: &str = concat!(
    watched_services!(),
    r#"    indexBy: [metadata.namespace, metadata.name]
    ignoreFields: [metadata.managedFields]
"#,
    haproxy_config_start!(),
    r#"    frontend fe
        bind 127.0.0.1:{{ extraContext.port }}
        use_backend %[req.hdr(host),lower,map({{ path("hosts.map") }})]
    {%- for s in resources.services %}
    backend be_{{ s.metadata.namespace }}_{{ s.metadata.name }}
    {%- if s.spec.broken | default(false) %}
        bogus-keyword on
    {%- endif %}
    {%- for port in s.spec.ports | default([]) %}
        server {{ s.metadata.name }}-{{ loop.index }} 127.0.0.1:{{ port }}
    {%- endfor %}
    {%- endfor %}
    {%- if extraContext.fail | default(false) %}
    {{ fail("asked to fail by extraContext") }}
    {%- endif %}
maps:
  hosts.map:
    template: |
      {%- for s in resources.services %}
      {{ s.metadata.name }}.test be_{{ s.metadata.namespace }}_{{ s.metadata.name }}
      {%- endfor %}
files:
  motd.txt: { template: "hello {{ extraContext.greeting | default('world') }}\n" }
extraContext: { port: 18080, team: { name: edge, size: 3 } }
haproxy: { binary: haproxy }
"#
);

/// Writes `BASE` plus `tests` (the `validationTests:` section and anything after it)
/// to a temp dir.
fn project(tests: &str) -> tempfile::TempDir {
    project_with(BASE, tests)
}

fn project_with(base: &str, tests: &str) -> tempfile::TempDir {
    support::project(&format!("{base}\n{tests}"))
}

/// `hapwright test -c hapwright.yaml EXTRA` in `dir`.
fn hapwright(dir: &Path, extra: &[&str]) -> Output {
    support::hapwright(dir, &[&["test", "-c", "hapwright.yaml"], extra].concat())
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "stdout is not JSON ({error}):\n{}\nstderr:\n{}",
            stdout(output),
            stderr(output)
        )
    })
}

fn test_named<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["tests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no test {name} in {report:#}"))
}

const TWO_SERVICES: &str = r#"
      services:
        - { apiVersion: v1, kind: Service, metadata: { name: web }, spec: { ports: [9001, 9002] } }
        - { apiVersion: v1, kind: Service, metadata: { name: api, namespace: prod }, spec: { ports: [9003] } }
"#;

#[test]
fn every_assertion_type_passes_on_a_good_render() {
    let dir = project(&format!(
        r#"
validationTests:
  everything:
    description: one of each
    fixtures:{TWO_SERVICES}
    assertions:
      - {{ type: haproxy_valid }}
      - {{ type: contains, target: haproxy.cfg, pattern: '^backend default_web$' }}
      - {{ type: contains, target: haproxy.cfg, pattern: '^backend be_default_web$' }}
      - {{ type: not_contains, target: haproxy.cfg, pattern: bogus }}
      - {{ type: match_count, target: haproxy.cfg, pattern: '^\s+server ', count: 3 }}
      - {{ type: match_order, target: haproxy.cfg, patterns: ['^frontend fe', 'be_default_web', 'be_prod_api'] }}
      - {{ type: equals, target: maps/hosts.map, expected: "\nweb.test be_default_web\napi.test be_prod_api\n" }}
      - {{ type: equals, target: files/motd.txt, expected: "hello world\n" }}
      - {{ type: jsonpath, path: '$.resources.services[*].metadata.name', expected: [web, api] }}
      - {{ type: jsonpath, path: '$.extraContext.team.size', expected: 3 }}
      - {{ type: not_contains, target: rendering_error, pattern: '.' }}
"#
    ));
    let output = hapwright(dir.path(), &[]);
    let out = stdout(&output);
    // One deliberate mistake (`default_web` lacks the `be_` prefix) shows the test
    // fails; everything else passes.
    assert_eq!(output.status.code(), Some(1), "{out}{}", stderr(&output));
    assert!(out.contains("FAIL everything ("), "{out}");
    assert!(
        out.contains("  FAIL contains haproxy.cfg `^backend default_web$`"),
        "{out}"
    );
    assert_eq!(out.matches("\n  FAIL ").count(), 1, "{out}");
    assert_eq!(out.matches("\n  ok   ").count(), 10, "{out}");
    assert!(out.ends_with("0 passed, 1 failed\n"), "{out}");

    let fixed = project(&format!(
        r#"
validationTests:
  everything:
    fixtures:{TWO_SERVICES}
    assertions:
      - {{ type: haproxy_valid }}
      - {{ type: contains, target: haproxy.cfg, pattern: '^backend be_default_web$' }}
      - {{ type: not_contains, target: haproxy.cfg, pattern: bogus }}
      - {{ type: match_count, target: haproxy.cfg, pattern: '^\s+server ', count: 3 }}
      - {{ type: match_order, target: haproxy.cfg, patterns: ['^frontend fe', 'be_default_web', 'be_prod_api'] }}
      - {{ type: equals, target: files/motd.txt, expected: "hello world\n" }}
      - {{ type: jsonpath, path: '$.extraContext.team.size', expected: 3 }}
"#
    ));
    let output = hapwright(fixed.path(), &[]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}{}",
        stdout(&output),
        stderr(&output)
    );
    assert_eq!(
        stdout(&output)
            .lines()
            .next()
            .map(|l| l.starts_with("PASS everything (")),
        Some(true)
    );
    assert!(stdout(&output).ends_with("1 passed, 0 failed\n"));
}

#[test]
fn each_failing_assertion_shows_the_assertion_the_pattern_and_an_excerpt() {
    let dir = project(&format!(
        r#"
validationTests:
  failing:
    fixtures:{TWO_SERVICES}
    assertions:
      - {{ type: contains, target: haproxy.cfg, pattern: 'backend be_default_webapp' }}
      - {{ type: not_contains, target: haproxy.cfg, pattern: 'server api-1' }}
      - {{ type: match_count, target: haproxy.cfg, pattern: '^\s+server web-', count: 3 }}
      - {{ type: match_order, target: haproxy.cfg, patterns: ['be_prod_api', 'be_default_web'] }}
      - {{ type: equals, target: files/motd.txt, expected: "hello edge\n" }}
      - {{ type: jsonpath, path: '$.resources.services[0].metadata.namespace', expected: default }}
      - {{ type: contains, target: rendering_error, pattern: fail }}
"#
    ));
    let output = hapwright(dir.path(), &[]);
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{out}{}", stderr(&output));
    for expected in [
        // contains: the pattern, then the closest line with its number.
        "  FAIL contains haproxy.cfg `backend be_default_webapp`",
        "`backend be_default_webapp` does not match haproxy.cfg",
        "closest line, 11, in haproxy.cfg:",
        "> 11 | backend be_default_web",
        // not_contains: where it matched.
        "`server api-1` matches haproxy.cfg at line 15, expected no match",
        "> 15 |     server api-1 127.0.0.1:9003",
        // match_count: the matching lines.
        "`^\\s+server web-` matches haproxy.cfg 2 times, expected 3 times",
        "> 12 |     server web-1 127.0.0.1:9001",
        "> 13 |     server web-2 127.0.0.1:9002",
        // match_order: which pattern came too early.
        "`be_default_web` matches haproxy.cfg only before `be_prod_api` (line 11",
        // equals: the first difference on both sides.
        "files/motd.txt differs from `expected` at line 1",
        "> 1 | hello edge",
        "> 1 | hello world",
        // rendering_error of a render that worked is empty.
        "`fail` does not match rendering_error (empty: the render succeeded)\n",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    // The jsonpath assertion passes: `web` in `default` sorts before `api` in `prod`.
    assert!(
        out.contains("  ok   jsonpath $.resources.services[0].metadata.namespace"),
        "{out}"
    );
    assert!(out.ends_with("0 passed, 1 failed\n"), "{out}");
}

#[test]
fn jsonpath_failure_names_the_value_found() {
    let dir = project(
        r#"
validationTests:
  jp:
    assertions:
      - { type: jsonpath, path: '$.extraContext.team.name', expected: core }
      - { type: jsonpath, path: '$.resources.services', expected: [] }
"#,
    );
    let output = hapwright(dir.path(), &["--output", "json"]);
    assert_eq!(output.status.code(), Some(1));
    let report = json(&output);
    let assertions = test_named(&report, "jp")["assertions"].as_array().unwrap();
    assert_eq!(assertions[0]["passed"], false);
    assert_eq!(assertions[0]["target"], "$.extraContext.team.name");
    let message = assertions[0]["message"].as_str().unwrap();
    assert!(
        message.contains("yields \"edge\", expected \"core\""),
        "{message}"
    );
    assert_eq!(
        assertions[1]["passed"], true,
        "{}",
        assertions[1]["message"]
    );
}

#[test]
fn json_output_follows_the_documented_schema() {
    let dir = project(&format!(
        r#"
validationTests:
  good:
    description: passes
    fixtures:{TWO_SERVICES}
    assertions:
      - {{ type: haproxy_valid }}
      - {{ type: contains, target: haproxy.cfg, pattern: be_prod_api, description: api backend }}
  bad:
    assertions:
      - {{ type: contains, target: haproxy.cfg, pattern: be_prod_api }}
"#
    ));
    let output = hapwright(dir.path(), &["--output", "json"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let report = json(&output);
    let top: Vec<&str> = report
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(top, ["tests", "passed", "failed"]);
    assert_eq!(report["passed"], 1);
    assert_eq!(report["failed"], 1);
    let names: Vec<&str> = report["tests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bad", "good"], "tests come back in name order");
    for test in report["tests"].as_array().unwrap() {
        assert!(test["name"].is_string());
        assert!(test["passed"].is_boolean());
        assert!(test["duration_ms"].is_u64(), "{test}");
        for assertion in test["assertions"].as_array().unwrap() {
            assert!(assertion["type"].is_string(), "{assertion}");
            assert!(assertion["target"].is_string() || assertion["target"].is_null());
            assert!(assertion["passed"].is_boolean());
            assert!(assertion["message"].is_string());
        }
    }
    let good = test_named(&report, "good");
    assert_eq!(good["passed"], true);
    assert_eq!(good["description"], "passes");
    assert_eq!(good["assertions"][0]["type"], "haproxy_valid");
    assert_eq!(good["assertions"][0]["target"], Value::Null);
    assert_eq!(good["assertions"][1]["target"], "haproxy.cfg");
    assert_eq!(good["assertions"][1]["description"], "api backend");
    let bad = test_named(&report, "bad");
    assert_eq!(bad["passed"], false);
    assert!(
        bad["assertions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("`be_prod_api` does not match haproxy.cfg"),
        "{bad}"
    );
}

#[test]
fn global_is_merged_into_every_test_and_not_run_alone() {
    let dir = project(
        r#"
validationTests:
  _global:
    fixtures:
      services:
        - { apiVersion: v1, kind: Service, metadata: { name: web }, spec: { ports: [9001] } }
    extraContext: { team: { name: global-team } }
    assertions:
      - { type: contains, target: haproxy.cfg, pattern: '^backend be_default_web$', description: from _global }
  inherits:
    assertions:
      - { type: match_count, target: haproxy.cfg, pattern: '^backend ', count: 1 }
      - { type: jsonpath, path: '$.extraContext.team', expected: { name: global-team, size: 3 } }
  adds-and-overrides:
    fixtures:
      services:
        - { apiVersion: v1, kind: Service, metadata: { name: web }, spec: { ports: [7001, 7002] } }
        - { apiVersion: v1, kind: Service, metadata: { name: api }, spec: { ports: [9003] } }
    extraContext: { port: 18081, team: { size: 4 } }
    assertions:
      - { type: match_count, target: haproxy.cfg, pattern: '^backend ', count: 2 }
      - { type: contains, target: haproxy.cfg, pattern: 'server web-2 127\.0\.0\.1:7002' }
      - { type: not_contains, target: haproxy.cfg, pattern: '9001' }
      - { type: contains, target: haproxy.cfg, pattern: 'bind 127\.0\.0\.1:18081' }
      - { type: jsonpath, path: '$.extraContext.team', expected: { name: global-team, size: 4 } }
"#,
    );
    let output = hapwright(dir.path(), &["--output", "json"]);
    assert_eq!(output.status.code(), Some(0), "{:#}", json(&output));
    let report = json(&output);
    assert_eq!(report["tests"].as_array().unwrap().len(), 2, "{report:#}");
    assert!(
        report["tests"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["name"] != "_global")
    );
    for name in ["inherits", "adds-and-overrides"] {
        let test = test_named(&report, name);
        assert_eq!(
            test["assertions"][0]["description"], "from _global",
            "_global's assertions come first: {test:#}"
        );
    }
    assert_eq!(
        test_named(&report, "adds-and-overrides")["assertions"]
            .as_array()
            .unwrap()
            .len(),
        6
    );

    let selected = hapwright(dir.path(), &["--test", "_global"]);
    assert_eq!(selected.status.code(), Some(2));
    assert!(stderr(&selected).contains("`_global` is merged into every test"));
}

#[test]
fn fixtures_are_read_like_the_files_source() {
    let dir = project(
        r#"
validationTests:
  source-rules:
    fixtures:
      services:
        # No namespace: `default`, written into metadata.namespace.
        - apiVersion: v1
          kind: Service
          metadata: { name: web, managedFields: [{ manager: kubectl }] }
          spec: {}
        # Another kind: dropped by the `kind: Service` filter.
        - { apiVersion: v1, kind: ConfigMap, metadata: { name: settings } }
        # A List is unpacked.
        - apiVersion: v1
          kind: List
          items:
            - { apiVersion: v1, kind: Service, metadata: { name: api, namespace: prod }, spec: {} }
    assertions:
      - { type: jsonpath, path: '$.resources.services[*].metadata.name', expected: [web, api] }
      - { type: jsonpath, path: '$.resources.services[0].metadata.namespace', expected: default }
      - { type: jsonpath, path: '$.resources.services[0].metadata.managedFields', expected: [] }
      - { type: not_contains, target: haproxy.cfg, pattern: settings }
"#,
    );
    let output = hapwright(dir.path(), &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
}

#[test]
fn invalid_fixtures_fail_the_test_naming_the_object() {
    let dir = project(
        r#"
validationTests:
  nameless:
    fixtures:
      services:
        - { apiVersion: v1, kind: Service, metadata: { name: ok } }
        - { apiVersion: v1, kind: Service, metadata: { namespace: x } }
    assertions:
      - { type: haproxy_valid }
  twice:
    fixtures:
      services:
        - { apiVersion: v1, kind: Service, metadata: { name: web } }
        - { apiVersion: v1, kind: Service, metadata: { name: web, namespace: default } }
    assertions:
      - { type: contains, target: rendering_error, pattern: x }
  fine:
    assertions:
      - { type: contains, target: haproxy.cfg, pattern: frontend }
"#,
    );
    let output = hapwright(dir.path(), &[]);
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(
        out.contains("validationTests.nameless.fixtures.services[1]: Service has no metadata.name"),
        "{out}"
    );
    assert!(
        out.contains(
            "validationTests.twice.fixtures.services[1]: object default/web is already defined by \
             validationTests.twice.fixtures.services[0]"
        ),
        "{out}"
    );
    assert!(out.contains("PASS fine ("), "{out}");
    assert!(out.ends_with("1 passed, 2 failed\n"), "{out}");
}

#[test]
fn haproxy_valid_fails_with_haproxys_error_mapped_to_the_template() {
    let dir = project(
        r#"
validationTests:
  broken:
    fixtures:
      services:
        - { apiVersion: v1, kind: Service, metadata: { name: web }, spec: { broken: true } }
    assertions:
      - { type: haproxy_valid }
      - { type: contains, target: haproxy.cfg, pattern: bogus-keyword }
"#,
    );
    let output = hapwright(dir.path(), &["--output", "json"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let report = json(&output);
    let test = test_named(&report, "broken");
    assert_eq!(test["assertions"][0]["passed"], false);
    let message = test["assertions"][0]["message"].as_str().unwrap();
    assert!(message.contains("rejected the configuration"), "{message}");
    assert!(message.contains("bogus-keyword"), "{message}");
    assert!(
        message.contains("from haproxy.cfg:"),
        "mapped to the template: {message}"
    );
    assert_eq!(test["assertions"][1]["passed"], true);
}

#[test]
fn a_template_that_fails_to_render_still_reports_every_assertion() {
    let dir = project(
        r#"
validationTests:
  fails:
    extraContext: { fail: true }
    assertions:
      - { type: contains, target: rendering_error, pattern: 'asked to fail by extraContext' }
      - { type: contains, target: rendering_error, pattern: '^haproxy\.cfg:\d+' }
      - { type: haproxy_valid }
      - { type: not_contains, target: haproxy.cfg, pattern: anything }
      - { type: equals, target: files/motd.txt, expected: "hello world\n" }
      - { type: jsonpath, path: '$.extraContext.fail', expected: true }
"#,
    );
    let output = hapwright(dir.path(), &["--output", "json"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let report = json(&output);
    let test = test_named(&report, "fails");
    let assertions = test["assertions"].as_array().unwrap();
    assert_eq!(assertions.len(), 6);
    let passed: Vec<bool> = assertions.iter().map(|a| a["passed"] == true).collect();
    assert_eq!(passed, [true, true, false, false, false, true], "{test:#}");
    for failed in &assertions[2..5] {
        let message = failed["message"].as_str().unwrap();
        assert!(
            message.starts_with("not checked: the render failed"),
            "{message}"
        );
        assert!(
            message.contains("asked to fail by extraContext"),
            "{message}"
        );
    }
}

#[test]
fn only_the_named_test_runs() {
    let dir = project(
        r#"
validationTests:
  one:
    assertions: [ { type: contains, target: haproxy.cfg, pattern: frontend } ]
  two:
    assertions: [ { type: contains, target: haproxy.cfg, pattern: nope } ]
"#,
    );
    let output = hapwright(dir.path(), &["--test", "one"]);
    assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
    assert!(!stdout(&output).contains("two"));
    let output = hapwright(dir.path(), &["--test", "two"]);
    assert_eq!(output.status.code(), Some(1));

    let unknown = hapwright(dir.path(), &["--test", "three"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        stderr(&unknown).contains("no test named `three` (validationTests has: one, two)"),
        "{}",
        stderr(&unknown)
    );
}

#[test]
fn config_errors_exit_2_and_template_errors_exit_1() {
    let bad_field = project(
        r#"
validationTests:
  t:
    assertions: [ { type: contains, target: haproxy.cfg } ]
"#,
    );
    let output = hapwright(bad_field.path(), &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output)
            .contains("validationTests.t.assertions[0].type: `contains` assertions need `pattern`"),
        "{}",
        stderr(&output)
    );

    let bad_template = project_with(
        &BASE.replace("{{ extraContext.port }}", "{{ extraContext.port }"),
        "validationTests: { t: { assertions: [ { type: haproxy_valid } ] } }\n",
    );
    let output = hapwright(bad_template.path(), &[]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("haproxy.cfg:"),
        "{}",
        stderr(&output)
    );
    assert!(stdout(&output).is_empty());

    let bad_usage = Command::new(BIN)
        .args(["test", "-c", "hapwright.yaml", "--output", "yaml"])
        .current_dir(bad_field.path())
        .output()
        .unwrap();
    assert_eq!(bad_usage.status.code(), Some(2));
}

#[test]
fn a_config_without_tests_passes_with_a_note() {
    let dir = project("");
    let output = hapwright(dir.path(), &["--output", "json"]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        json(&output),
        serde_json::json!({"tests": [], "passed": 0, "failed": 0})
    );
    assert!(stderr(&output).contains("no validationTests to run"));
}

#[test]
fn many_tests_run_together_and_report_in_name_order() {
    let mut tests = String::from("validationTests:\n");
    for index in 0..12 {
        tests.push_str(&format!(
            "  t{index:02}:\n    extraContext: {{ port: {} }}\n    fixtures:\n      services: [ {{ apiVersion: v1, kind: Service, metadata: {{ name: s{index} }}, spec: {{ ports: [{}] }} }} ]\n    assertions:\n      - {{ type: haproxy_valid }}\n      - {{ type: contains, target: haproxy.cfg, pattern: 'server s{index}-1 127\\.0\\.0\\.1:{}$' }}\n",
            20000 + index,
            9000 + index,
            9000 + index
        ));
    }
    let dir = project(&tests);
    let output = hapwright(dir.path(), &["--output", "json"]);
    assert_eq!(output.status.code(), Some(0), "{:#}", json(&output));
    let report = json(&output);
    let names: Vec<String> = report["tests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (0..12).map(|i| format!("t{i:02}")).collect();
    assert_eq!(names, expected);
    assert_eq!(report["passed"], 12);
}

#[test]
fn the_quickstart_tests_pass() {
    let config: PathBuf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/quickstart/hapwright.yaml");
    let output = Command::new(BIN)
        .args(["test", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{out}{}", stderr(&output));
    for name in [
        "routes-appear-in-the-map",
        "backends-have-servers",
        "service-without-endpoints",
        "endpoints-not-ready-are-skipped",
    ] {
        assert!(out.contains(&format!("PASS {name} (")), "{out}");
    }
}

#[test]
fn haproxy_valid_fails_clearly_when_haproxy_cannot_run() {
    let base = BASE.replace(
        "haproxy: { binary: haproxy }",
        "haproxy: { binary: /nonexistent/haproxy }",
    );
    let dir = project_with(
        &base,
        r#"
validationTests:
  t:
    assertions:
      - { type: haproxy_valid }
      - { type: contains, target: haproxy.cfg, pattern: frontend }
"#,
    );
    let output = hapwright(dir.path(), &["--output", "json"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let report = json(&output);
    let test = test_named(&report, "t");
    assert_eq!(test["assertions"][0]["passed"], false);
    let message = test["assertions"][0]["message"].as_str().unwrap();
    assert!(message.contains("/nonexistent/haproxy"), "{message}");
    assert!(
        message.contains("HAProxy could not judge the configuration: check haproxy.binary"),
        "{message}"
    );
    assert_eq!(test["assertions"][1]["passed"], true);
}

#[test]
fn global_may_hold_only_fixtures_and_targets_accept_the_kind_prefix() {
    let dir = project(
        r#"
validationTests:
  _global:
    fixtures:
      services:
        - { apiVersion: v1, kind: Service, metadata: { name: web }, spec: { ports: [9001] } }
  prefixed-target:
    assertions:
      - { type: contains, target: haproxy.cfg, pattern: '^backend be_default_web$' }
      - { type: not_contains, target: map:hosts.map, pattern: 'no-such-host-zzz' }
"#,
    );
    let output = hapwright(dir.path(), &["--output", "json"]);
    assert_eq!(output.status.code(), Some(0), "{:#}", json(&output));
    let report = json(&output);
    let test = test_named(&report, "prefixed-target");
    assert_eq!(test["assertions"].as_array().unwrap().len(), 2, "{test:#}");
    assert_eq!(test["assertions"][1]["target"], "map:hosts.map");
    assert_eq!(test["passed"], true);
}
