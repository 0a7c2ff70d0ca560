use super::excerpt::{excerpt, literals};

use hapwright_eventbus::model::{Diagnostic, RenderedConfig};
use hapwright_reconciler::config::Assertion;

use super::*;
use crate::config::Config;
use serde_json::json;

fn rendered(main: &str, maps: &[(&str, &str)]) -> Outcome {
    Outcome::Rendered {
        context: json!({"resources": {"services": [{"metadata": {"name": "web"}}]}, "extraContext": {"port": 8080}}),
        render: Ok(maps
            .iter()
            .fold(RenderedConfig::builder(main), |config, (name, content)| {
                config.map(*name, *content)
            })
            .build()),
        validation: None,
        statuses: None,
    }
}

fn failed_render() -> Outcome {
    Outcome::Rendered {
        context: json!({}),
        render: Err(vec![Diagnostic::error("fail(): no backends").at(
            hapwright_eventbus::model::SourceLocation::new("haproxy.cfg", Some(3), Some(4)),
        )]),
        validation: None,
        statuses: None,
    }
}

fn assertion(yaml: &str) -> Assertion {
    let assertion: Assertion = serde_saphyr::from_str(yaml).unwrap();
    assert!(
        assertion.validate().is_empty(),
        "{:?}",
        assertion.validate()
    );
    assertion
}

const CFG: &str = "global\n    log stderr\n\nfrontend http\n    bind :80\n\nbackend be_default_web\n    server web-1 10.0.0.1:80\n    server web-2 10.0.0.2:80\n";

#[test]
fn contains_passes_and_fails_with_the_closest_line() {
    let outcome = rendered(CFG, &[]);
    let ok = check(
        &assertion("{type: contains, target: haproxy.cfg, pattern: 'backend be_default_web'}"),
        &outcome,
    );
    assert!(ok.passed, "{}", ok.message);
    assert!(ok.message.contains("line 7"), "{}", ok.message);
    let bad = check(
        &assertion("{type: contains, target: haproxy.cfg, pattern: 'backend be_default_api'}"),
        &outcome,
    );
    assert!(!bad.passed);
    assert!(
        bad.message
            .contains("`backend be_default_api` does not match haproxy.cfg")
    );
    assert!(bad.message.contains("closest line, 7"), "{}", bad.message);
    assert!(
        bad.message.contains("> 7 | backend be_default_web"),
        "{}",
        bad.message
    );
    assert!(
        bad.message.contains("  9 |     server web-2"),
        "{}",
        bad.message
    );
}

#[test]
fn regexes_are_multi_line() {
    let outcome = rendered(CFG, &[]);
    let ok = check(
        &assertion("{type: match_count, target: haproxy.cfg, pattern: '^    server ', count: 2}"),
        &outcome,
    );
    assert!(ok.passed, "{}", ok.message);
}

#[test]
fn a_pattern_sharing_nothing_shows_the_first_lines() {
    let outcome = rendered(CFG, &[]);
    let bad = check(
        &assertion("{type: contains, target: haproxy.cfg, pattern: 'xyzzy'}"),
        &outcome,
    );
    assert!(!bad.passed);
    assert!(
        bad.message.contains("first 9 of 9 lines"),
        "{}",
        bad.message
    );
    assert!(bad.message.contains("1 | global"), "{}", bad.message);
}

#[test]
fn not_contains_shows_the_match() {
    let outcome = rendered(CFG, &[]);
    let ok = check(
        &assertion("{type: not_contains, target: haproxy.cfg, pattern: 'staging'}"),
        &outcome,
    );
    assert!(ok.passed);
    let bad = check(
        &assertion("{type: not_contains, target: haproxy.cfg, pattern: 'bind :\\d+'}"),
        &outcome,
    );
    assert!(!bad.passed);
    assert!(
        bad.message
            .contains("`bind :\\d+` matches haproxy.cfg at line 5, expected no match"),
        "{}",
        bad.message
    );
    assert!(
        bad.message.contains("> 5 |     bind :80"),
        "{}",
        bad.message
    );
}

#[test]
fn match_count_lists_the_matching_lines() {
    let outcome = rendered(CFG, &[]);
    let bad = check(
        &assertion("{type: match_count, target: haproxy.cfg, pattern: 'server ', count: 3}"),
        &outcome,
    );
    assert!(!bad.passed);
    assert!(
        bad.message
            .contains("`server ` matches haproxy.cfg 2 times, expected 3 times"),
        "{}",
        bad.message
    );
    assert!(
        bad.message.contains("> 8 |     server web-1"),
        "{}",
        bad.message
    );
    assert!(
        bad.message.contains("> 9 |     server web-2"),
        "{}",
        bad.message
    );
    let zero = check(
        &assertion("{type: match_count, target: haproxy.cfg, pattern: 'listen ', count: 0}"),
        &outcome,
    );
    assert!(zero.passed, "{}", zero.message);
    let once = check(
        &assertion("{type: match_count, target: haproxy.cfg, pattern: 'frontend', count: 2}"),
        &outcome,
    );
    assert!(
        once.message.contains("once, expected 2 times"),
        "{}",
        once.message
    );
}

#[test]
fn match_order_reports_the_pattern_out_of_order() {
    let outcome = rendered(CFG, &[]);
    let ok = check(
        &assertion(
            "{type: match_order, target: haproxy.cfg, patterns: [global, frontend, backend]}",
        ),
        &outcome,
    );
    assert!(ok.passed, "{}", ok.message);
    assert!(ok.message.contains("lines 1, 4, 7"), "{}", ok.message);
    let bad = check(
        &assertion("{type: match_order, target: haproxy.cfg, patterns: [backend, frontend]}"),
        &outcome,
    );
    assert!(!bad.passed);
    assert!(
        bad.message
            .contains("`frontend` matches haproxy.cfg only before `backend` (line 4"),
        "{}",
        bad.message
    );
    assert!(
        bad.message.contains("> 4 | frontend http"),
        "{}",
        bad.message
    );
    let missing = check(
        &assertion("{type: match_order, target: haproxy.cfg, patterns: [global, peers]}"),
        &outcome,
    );
    assert!(
        missing
            .message
            .contains("`peers` does not match haproxy.cfg")
    );
}

#[test]
fn equals_shows_the_first_difference() {
    let outcome = rendered(CFG, &[("hosts.map", "a.example be_a\nb.example be_b\n")]);
    let ok = check(
        &assertion(
            "{type: equals, target: maps/hosts.map, expected: \"a.example be_a\\nb.example be_b\\n\"}",
        ),
        &outcome,
    );
    assert!(ok.passed, "{}", ok.message);
    let bad = check(
        &assertion(
            "{type: equals, target: maps/hosts.map, expected: \"a.example be_a\\nb.example be_c\\n\"}",
        ),
        &outcome,
    );
    assert!(!bad.passed);
    assert!(
        bad.message
            .contains("maps/hosts.map differs from `expected` at line 2"),
        "{}",
        bad.message
    );
    assert!(
        bad.message.contains("> 2 | b.example be_c"),
        "{}",
        bad.message
    );
    assert!(
        bad.message.contains("> 2 | b.example be_b"),
        "{}",
        bad.message
    );
}

#[test]
fn jsonpath_compares_one_node_or_the_node_list() {
    let outcome = rendered(CFG, &[]);
    for yaml in [
        "{type: jsonpath, path: '$.resources.services[0].metadata.name', expected: web}",
        "{type: jsonpath, path: '$.resources.services[*].metadata.name', expected: [web]}",
        "{type: jsonpath, path: '$.extraContext.port', expected: 8080.0}",
        "{type: jsonpath, path: '$.resources.nothing[*]', expected: []}",
    ] {
        let report = check(&assertion(yaml), &outcome);
        assert!(report.passed, "{yaml}: {}", report.message);
    }
    let bad = check(
        &assertion(
            "{type: jsonpath, path: '$.resources.services[0].metadata.name', expected: api}",
        ),
        &outcome,
    );
    assert!(!bad.passed);
    assert!(
        bad.message.contains("yields \"web\", expected \"api\""),
        "{}",
        bad.message
    );
    assert_eq!(
        bad.target.as_deref(),
        Some("$.resources.services[0].metadata.name")
    );
    let none = check(
        &assertion("{type: jsonpath, path: '$.resources.nope', expected: 1}"),
        &outcome,
    );
    assert!(none.message.contains("yields nothing"), "{}", none.message);
    let invalid = check(
        &assertion("{type: jsonpath, path: 'resources[', expected: 1}"),
        &outcome,
    );
    assert!(!invalid.passed);
    assert!(
        invalid.message.starts_with("invalid JSONPath `resources[`"),
        "{}",
        invalid.message
    );
}

#[test]
fn a_failed_render_fails_file_assertions_but_feeds_rendering_error() {
    let outcome = failed_render();
    let on_file = check(
        &assertion("{type: not_contains, target: haproxy.cfg, pattern: x}"),
        &outcome,
    );
    assert!(!on_file.passed);
    assert!(
        on_file
            .message
            .starts_with("not checked: the render failed, so there is no haproxy.cfg"),
        "{}",
        on_file.message
    );
    assert!(
        on_file
            .message
            .contains("haproxy.cfg:3:4: fail(): no backends")
    );
    let valid = check(&assertion("{type: haproxy_valid}"), &outcome);
    assert!(!valid.passed);
    assert!(valid.message.starts_with("not checked: the render failed"));
    let error = check(
        &assertion("{type: contains, target: rendering_error, pattern: 'fail\\(\\): no backends'}"),
        &outcome,
    );
    assert!(error.passed, "{}", error.message);
    // Without a render error, `rendering_error` is empty.
    let ok = rendered(CFG, &[]);
    let expects_error = check(
        &assertion("{type: contains, target: rendering_error, pattern: fail}"),
        &ok,
    );
    assert!(!expects_error.passed);
    assert!(
        expects_error
            .message
            .contains("rendering_error (empty: the render succeeded)"),
        "{}",
        expects_error.message
    );
    assert!(
        check(
            &assertion("{type: equals, target: rendering_error, expected: ''}"),
            &ok
        )
        .passed
    );
}

#[test]
fn invalid_fixtures_fail_every_assertion() {
    let outcome = Outcome::Setup(vec![
        "validationTests.t.fixtures.services[0]: Service has no metadata.name".to_owned(),
    ]);
    for yaml in [
        "{type: haproxy_valid}",
        "{type: contains, target: rendering_error, pattern: x}",
        "{type: jsonpath, path: '$', expected: 1}",
    ] {
        let report = check(&assertion(yaml), &outcome);
        assert!(!report.passed);
        assert!(
            report.message.contains("fixtures are invalid"),
            "{}",
            report.message
        );
        assert!(
            report.message.contains("has no metadata.name"),
            "{}",
            report.message
        );
    }
}

#[test]
fn extra_context_merges_mappings_recursively() {
    let mut base = json!({"a": 1, "nested": {"x": 1, "y": [1, 2]}, "keep": true});
    merge_json(
        &mut base,
        &json!({"a": 2, "nested": {"y": [3], "z": null}, "new": "v"}),
    );
    assert_eq!(
        base,
        json!({"a": 2, "nested": {"x": 1, "y": [3], "z": null}, "keep": true, "new": "v"})
    );
    let mut scalar = json!({"a": 1});
    merge_json(&mut scalar, &json!([1]));
    assert_eq!(scalar, json!([1]));
}

#[test]
fn equals_names_a_difference_in_final_newlines() {
    let outcome = rendered(CFG, &[("hosts.map", "a b\n")]);
    let bad = check(
        &assertion("{type: equals, target: maps/hosts.map, expected: 'a b'}"),
        &outcome,
    );
    assert!(!bad.passed);
    assert_eq!(
        bad.message,
        "maps/hosts.map differs from `expected` only at the end: it ends with 1 newline, \
         `expected` with 0 newlines"
    );
    let longer = check(
        &assertion("{type: equals, target: maps/hosts.map, expected: \"a b\\nc d\\n\"}"),
        &outcome,
    );
    assert!(longer.message.contains("at line 2"), "{}", longer.message);
    assert!(
        longer.message.contains("(ends before line 2)"),
        "{}",
        longer.message
    );
}

fn config(tests: &str) -> Config {
    serde_saphyr::from_str(&format!(
        r#"
watchedResources:
  services:
    files: {{ path: /nonexistent }}
    kind: Service
    indexBy: [metadata.namespace, metadata.name]
    ignoreFields: [status]
haproxyConfig: {{ template: "x" }}
extraContext: {{ a: 1, nested: {{ b: 2 }} }}
validationTests:
{tests}
"#
    ))
    .unwrap()
}

#[test]
fn cases_merge_global_and_select_by_name() {
    let config = config(
        r#"
  _global:
    fixtures: { services: [ { apiVersion: v1, kind: Service, metadata: { name: g } } ] }
    extraContext: { nested: { c: 3 } }
    assertions: [ { type: haproxy_valid, description: global } ]
  b:
    description: second
    extraContext: { a: 9 }
    assertions: [ { type: contains, target: haproxy.cfg, pattern: x } ]
  a:
    fixtures: { services: [ { apiVersion: v1, kind: Service, metadata: { name: own } } ] }
    assertions: [ { type: contains, target: haproxy.cfg, pattern: x } ]
"#,
    );
    let all = cases(&config, None).unwrap();
    let names: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    let b = &all[1];
    assert_eq!(b.description.as_deref(), Some("second"));
    assert_eq!(b.extra_context, json!({"a": 9, "nested": {"b": 2, "c": 3}}));
    assert_eq!(b.assertions.len(), 2);
    assert_eq!(b.assertions[0].description.as_deref(), Some("global"));
    assert_eq!(b.fixture_layers.len(), 1);
    assert_eq!(all[0].fixture_layers.len(), 2);
    assert_eq!(
        all[0].fixture_layers[0].0,
        "validationTests._global.fixtures"
    );
    assert_eq!(all[0].fixture_layers[1].0, "validationTests.a.fixtures");

    assert_eq!(cases(&config, Some("b")).unwrap().len(), 1);
    assert_eq!(
        cases(&config, Some("c")).unwrap_err().to_string(),
        "no test named `c` (validationTests has: a, b)"
    );
    assert_eq!(
        cases(&config, Some(GLOBAL_TEST)).unwrap_err(),
        SelectError::GlobalSelected
    );
}

#[test]
fn fixtures_layer_by_key_and_follow_the_source_rules() {
    let config = config(
        r#"
  _global:
    fixtures:
      services:
        - { apiVersion: v1, kind: Service, metadata: { name: web }, spec: { port: 1 } }
        - { apiVersion: v1, kind: Service, metadata: { name: keep, namespace: ops }, status: { x: 1 } }
    assertions: [ { type: haproxy_valid } ]
  t:
    fixtures:
      services:
        - { apiVersion: v1, kind: Service, metadata: { name: web, namespace: default }, spec: { port: 2 } }
        - { apiVersion: v1, kind: Secret, metadata: { name: dropped } }
    assertions: [ { type: haproxy_valid } ]
"#,
    );
    let case = cases(&config, Some("t")).unwrap().remove(0);
    let fixtures = load_fixtures(&config, &case).unwrap();
    assert_eq!(
        fixtures.context["resources"]["services"],
        json!([
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"}, "spec": {"port": 2}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "keep", "namespace": "ops"}},
        ])
    );
    assert_eq!(
        fixtures.context["extraContext"],
        json!({"a": 1, "nested": {"b": 2}})
    );
    let store = fixtures.resources.get("services").unwrap();
    assert_eq!(store.len(), 2);
}

#[test]
fn literals_skip_escapes_and_short_runs() {
    assert_eq!(literals(r"^\s+server web-\d+ (?i)x"), ["server", "web"]);
    assert_eq!(
        literals("backend be_default_web"),
        ["backend", "be_default_web"]
    );
}

#[test]
fn numbered_marks_gaps() {
    let text = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl";
    let shown = excerpt("t", text, &[2, 10]);
    assert!(
        shown.contains("...\n") || shown.contains("... |"),
        "{shown}"
    );
    assert!(shown.contains(">  2 | b"), "{shown}");
    assert!(shown.contains("> 10 | j"), "{shown}");
    assert!(!shown.contains(" 6 | f"), "{shown}");
}

#[tokio::test]
async fn status_targets_assert_on_the_rendered_status_of_one_object() {
    let config: Config = serde_saphyr::from_str(
        r#"
watchedResources:
  services:
    files: { path: /nonexistent }
    kind: Service
haproxyConfig: { template: "global\n" }
extraContext: { address: 192.0.2.7 }
statusTemplates:
  services:
    template: |
      {% if object.metadata.name == 'broken' %}{{ fail('no address') }}{% endif %}
      {% if object.metadata.name != 'skipped' %}
      loadBalancer:
        ingress:
        - ip: {{ extraContext.address }}
      conditions:
      - type: Ready
        status: "True"
      {% endif %}
validationTests:
  t:
    fixtures:
      services:
        - { apiVersion: v1, kind: Service, metadata: { name: web, namespace: shop } }
        - { apiVersion: v1, kind: Service, metadata: { name: skipped, namespace: shop } }
        - { apiVersion: v1, kind: Service, metadata: { name: broken, namespace: shop } }
    assertions:
      - { type: contains, target: status/services/shop/web, pattern: 'ip: .?192\.0\.2\.7' }
      - { type: contains, target: status/services/shop/web, pattern: 'lastTransitionTime: .?1970-01-01T00:00:00Z' }
      - { type: equals, target: status/services/shop/skipped, expected: '' }
      - { type: contains, target: status/services/shop/broken, pattern: 'ip:' }
"#,
    )
    .unwrap();
    assert!(config.validate().is_empty(), "{:?}", config.validate());
    let all = cases(&config, None).unwrap();
    let report = run(&config, all, 1).await.unwrap();
    let results: Vec<(bool, &str)> = report.tests[0]
        .assertions
        .iter()
        .map(|a| (a.passed, a.message.as_str()))
        .collect();
    assert!(results[0].0, "{results:?}");
    assert!(results[1].0, "{results:?}");
    assert!(results[2].0, "{results:?}");
    // The object whose template failed: the error, named, instead of a status.
    assert!(!results[3].0);
    assert!(
        results[3]
            .1
            .contains("the status template failed for shop/broken")
            && results[3].1.contains("no address"),
        "{results:?}"
    );
}

#[test]
fn status_targets_must_name_a_status_template() {
    let config: Config = serde_saphyr::from_str(
        r#"
watchedResources:
  services: { files: { path: /nonexistent }, kind: Service }
haproxyConfig: { template: "global\n" }
statusTemplates:
  services: { template: "a: 1" }
validationTests:
  t:
    assertions:
      - { type: contains, target: status/endpoints/shop/web, pattern: x }
      - { type: contains, target: status/services, pattern: x }
"#,
    )
    .unwrap();
    let issues: Vec<String> = config.validate().iter().map(|i| i.to_string()).collect();
    assert!(
        issues.iter().any(|i| i.contains("assertions[0].target")
            && i.contains("`endpoints` has no status template")),
        "{issues:?}"
    );
    assert!(
        issues
            .iter()
            .any(|i| i.contains("assertions[1].target") && i.contains("not a status target")),
        "{issues:?}"
    );
}
