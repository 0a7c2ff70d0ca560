//! Every error path of the renderer names the template (or snippet) and the line, and
//! carries the offending source line: compile errors, static checks at load time and
//! render errors.

#[path = "../testdata/fixtures.rs"]
mod fixtures;

use hapwright_eventbus::config::ByteSize;
use hapwright_eventbus::model::Diagnostic;
use hapwright_reconciler::renderer::{self, RenderLimits, Renderer, Resources, Templates};

fn load_errors(templates: Templates, watched: &[&str]) -> Vec<Diagnostic> {
    match Renderer::new(templates, watched) {
        Ok(_) => panic!("expected the templates to be rejected"),
        Err(errors) => errors,
    }
}

fn render_errors(templates: Templates) -> Vec<Diagnostic> {
    let renderer = Renderer::new(templates, &["services"]).expect("templates load");
    match renderer.render(&Resources::new()) {
        Ok(config) => panic!("expected the render to fail, got:\n{}", config.main()),
        Err(errors) => errors,
    }
}

/// Asserts the single diagnostic's template, line and source line, returns its message.
#[track_caller]
fn located(errors: &[Diagnostic], template: &str, line: u32, source_line: &str) -> String {
    assert_eq!(errors.len(), 1, "expected one error, got {errors:#?}");
    let error = &errors[0];
    let location = error.location.as_ref().expect("error has a location");
    assert_eq!(location.file, template, "{error}");
    assert_eq!(location.line, Some(line), "{error}");
    assert_eq!(error.source_line.as_deref(), Some(source_line), "{error}");
    error.message.clone()
}

// === load time ===

#[test]
fn syntax_error_in_main_template() {
    let errors = load_errors(
        Templates::new("global\n{% if x %}\n  a\n{% endfi %}\n"),
        &[],
    );
    let message = located(&errors, "haproxy.cfg", 4, "{% endfi %}");
    assert!(message.contains("syntax error"), "{message}");
    assert!(errors[0].location.as_ref().unwrap().column.is_some());
}

#[test]
fn syntax_error_in_snippet_map_file_and_certificate_names_them() {
    for (kind, name) in [
        ("snippet", "backend-servers"),
        ("map", "maps/hosts.map"),
        ("file", "files/503.http"),
        ("certificate", "certs/default.pem"),
    ] {
        let mut templates = Templates::new("global");
        let source = "ok\n  {{ broken( }}\n".to_owned();
        match kind {
            "snippet" => drop(templates.snippets.insert(name.into(), source)),
            "map" => drop(templates.maps.insert("hosts.map".into(), source)),
            "file" => drop(templates.files.insert("503.http".into(), source)),
            _ => drop(templates.certificates.insert("default.pem".into(), source)),
        }
        let errors = load_errors(templates, &[]);
        let message = located(&errors, name, 2, "  {{ broken( }}");
        assert!(message.contains("syntax error"), "{message}");
    }
}

#[test]
fn column_points_into_the_original_line_despite_markers() {
    let errors = load_errors(Templates::new("abc\nxy {{ 1 + }}\n"), &[]);
    located(&errors, "haproxy.cfg", 2, "xy {{ 1 + }}");
    let column = errors[0].location.as_ref().unwrap().column.expect("column");
    assert!((9..=12).contains(&column), "column {column}");
}

#[test]
fn unknown_watched_resource_is_caught_at_load() {
    let errors = load_errors(
        Templates::new("global\n{% for s in resources.servics.list() %}{% endfor %}\n"),
        &["services", "endpoints"],
    );
    let message = located(
        &errors,
        "haproxy.cfg",
        2,
        "{% for s in resources.servics.list() %}{% endfor %}",
    );
    assert_eq!(
        message,
        "resources.servics is not a watched resource (watched: endpoints, services); did you mean resources.services?"
    );
    assert_eq!(errors[0].location.as_ref().unwrap().column, Some(13));
}

#[test]
fn missing_snippet_is_caught_at_load() {
    let mut templates = Templates::new("global\n\n{% include \"backend-server\" %}\n");
    templates
        .snippets
        .insert("backend-servers".into(), "x".into());
    let errors = load_errors(templates, &[]);
    let message = located(
        &errors,
        "haproxy.cfg",
        3,
        "{% include \"backend-server\" %}",
    );
    assert_eq!(
        message,
        "include of unknown snippet `backend-server`; did you mean `backend-servers`?"
    );
}

#[test]
fn optional_and_dynamic_includes_are_not_errors_at_load() {
    let mut templates = Templates::new(
        "{% include 'nope' ignore missing %}{% include ['nope', 'real'] %}{% include name %}",
    );
    templates.snippets.insert("real".into(), "r".into());
    assert!(renderer::check(&templates, &[] as &[&str]).is_ok());
}

#[test]
fn include_cycle_is_named() {
    let mut templates = Templates::new("{% include 'a' %}");
    templates
        .snippets
        .insert("a".into(), "a\n{% include 'b' %}".into());
    templates.snippets.insert(
        "b".into(),
        "{% if x %}\n{% include 'a' %}\n{% endif %}".into(),
    );
    let errors = load_errors(templates, &[]);
    let message = located(&errors, "b", 2, "{% include 'a' %}");
    assert_eq!(message, "include cycle: a → b → a");
}

#[test]
fn self_include_and_render_glob_cycles_are_named() {
    let mut templates = Templates::new("{{ render_glob('ext-*') }}");
    templates
        .snippets
        .insert("ext-1".into(), "{{ render_glob('ext-*') }}".into());
    let errors = load_errors(templates, &[]);
    let message = located(&errors, "ext-1", 1, "{{ render_glob('ext-*') }}");
    assert_eq!(message, "`ext-1` includes itself");
}

#[test]
fn render_glob_misuse_is_caught_at_load() {
    let errors = load_errors(
        Templates::new("a\n{{ render_glob('x-*') | indent(4) }}"),
        &[],
    );
    let message = located(
        &errors,
        "haproxy.cfg",
        2,
        "{{ render_glob('x-*') | indent(4) }}",
    );
    assert!(
        message.starts_with("render_glob(...) must be used on its own"),
        "{message}"
    );
}

#[test]
fn snippet_names_cannot_shadow_rendered_files() {
    let mut templates = Templates::new("x");
    templates.maps.insert("hosts.map".into(), "m".into());
    templates
        .snippets
        .insert("maps/hosts.map".into(), "s".into());
    let errors = load_errors(templates, &[]);
    assert_eq!(errors.len(), 1);
    assert!(errors[0].message.contains("reserved"), "{}", errors[0]);
}

#[test]
fn unknown_filter_is_caught_at_load_with_a_suggestion() {
    let errors = load_errors(
        Templates::new("global\n    server {{ name | uper }} {{ address }}\n"),
        &[],
    );
    let message = located(
        &errors,
        "haproxy.cfg",
        2,
        "    server {{ name | uper }} {{ address }}",
    );
    assert_eq!(message, "unknown filter `uper`; did you mean `upper`?");
    assert_eq!(errors[0].location.as_ref().unwrap().column, Some(22));
}

#[test]
fn unknown_test_is_caught_at_load_with_a_suggestion() {
    let errors = load_errors(
        Templates::new("{% if x is nmber %}\n{% endif %}\n{% if y is not nmber %}{% endif %}"),
        &[],
    );
    assert_eq!(errors.len(), 2, "{errors:#?}");
    let message = located(&errors[..1], "haproxy.cfg", 1, "{% if x is nmber %}");
    assert_eq!(message, "unknown test `nmber`; did you mean `number`?");
    assert_eq!(errors[0].location.as_ref().unwrap().column, Some(12));
    let second = errors[1].location.as_ref().unwrap();
    assert_eq!((second.line, second.column), (Some(3), Some(16)));
}

#[test]
fn unknown_filter_in_a_snippet_is_reported_against_the_snippet() {
    let mut templates = Templates::new("global\n{% include 'backend' %}\n");
    templates.snippets.insert(
        "backend".into(),
        "{% macro server(n) %}\n  server {{ n | uper }}\n{% endmacro %}\n{{ server('a') }}".into(),
    );
    let errors = load_errors(templates, &[]);
    let message = located(&errors, "backend", 2, "  server {{ n | uper }}");
    assert_eq!(message, "unknown filter `uper`; did you mean `upper`?");
}

#[test]
fn unknown_names_in_filter_blocks_call_blocks_and_literal_arguments_are_caught() {
    let source = "{% filter indent(4) | uper %}x{% endfilter %}\n\
                  {% set s | lowr %}y{% endset %}\n\
                  {% macro m() %}{{ caller() }}{% endmacro %}\n\
                  {% call m() %}{{ 1 | absolute }}{% endcall %}\n\
                  {{ xs | select('od') | map('uper') | selectattr('a', 'evn') | list }}\n\
                  {{ xs | map(attribute='uper') | list }}";
    let errors = load_errors(Templates::new(source), &[]);
    let found: Vec<(u32, &str)> = errors
        .iter()
        .map(|e| {
            (
                e.location.as_ref().unwrap().line.unwrap(),
                e.message.as_str(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            (1, "unknown filter `uper`; did you mean `upper`?"),
            (2, "unknown filter `lowr`; did you mean `lower`?"),
            (4, "unknown filter `absolute`"),
            (5, "unknown test `od`; did you mean `odd`?"),
            (5, "unknown filter `uper`; did you mean `upper`?"),
            (5, "unknown test `evn`; did you mean `even`?"),
        ],
        "{errors:#?}"
    );
}

#[test]
fn filter_blocks_and_names_that_are_variables_are_accepted() {
    let templates = Templates::new(
        "{% set uper = 1 %}{% filter upper %}{{ uper }}{% endfilter %}\n\
         {% macro number() %}n{% endmacro %}{{ number() }}{{ 'uper | nmber' }}\n\
         {# {{ x | uper }} #}{% raw %}{{ x | uper }}{% endraw %}\n\
         {% set s | trim %} y {% endset %}{{ s is string }}{{ x is glob_match('a*') }}",
    );
    assert!(renderer::check(&templates, &[] as &[&str]).is_ok());
}

#[test]
fn every_filter_and_test_the_docs_mention_is_accepted() {
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/templates.md"
    ))
    .unwrap();
    let section = docs
        .split("## Filters, tests and functions")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("the docs' filter section");
    // Filters: bare names in backticks in the prose (`default`) and `x | name`
    // usages; tests: `x is name` usages. Functions, methods and loop controls, and
    // the table's other words (Secrets' `data`), are not names.
    let prose_end = section.find("\n|").expect("the docs' filter table");
    let mut filters = std::collections::BTreeSet::new();
    let mut tests = std::collections::BTreeSet::new();
    let mut offset = 0;
    for (index, span) in section.split('`').enumerate() {
        let in_prose = offset < prose_end;
        offset += span.len() + 1;
        if index % 2 == 0 {
            continue;
        }
        let span = span.replace("\\|", "|");
        let word = |rest: &str| -> String {
            rest.trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        };
        if in_prose
            && span.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            && !["break", "continue"].contains(&span.as_str())
        {
            filters.insert(span.clone());
        }
        for (at, _) in span.match_indices('|') {
            filters.insert(word(&span[at + 1..]));
        }
        for (at, _) in span.match_indices(" is ") {
            tests.insert(word(&span[at + 4..]));
        }
    }
    filters.remove("");
    for expected in ["default", "selectattr", "b64decode", "sort_by", "tojson"] {
        assert!(filters.contains(expected), "{expected} from {filters:?}");
    }
    assert!(tests.contains("glob_match"), "{tests:?}");
    let mut source: String = filters
        .iter()
        .map(|name| format!("{{{{ x | {name} }}}}\n"))
        .collect();
    source.extend(tests.iter().map(|name| format!("{{{{ x is {name} }}}}\n")));
    let templates = Templates::new(source.as_str());
    if let Err(errors) = renderer::check(&templates, &[] as &[&str]) {
        panic!("{source}\n{errors:#?}");
    }
}

#[test]
fn every_problem_is_reported_at_once() {
    let mut templates = Templates::new("{{ resources.nope }}\n{% include 'missing' %}\n");
    templates.snippets.insert("bad".into(), "{% for %}".into());
    let errors = load_errors(templates, &["services"]);
    assert_eq!(errors.len(), 3, "{errors:#?}");
}

// === render time ===

#[test]
fn undefined_variable_in_strict_mode() {
    let mut templates = Templates::new("global\n    maxconn {{ extraContext.maxconn }}\n");
    templates.settings.strict_undefined = true;
    let errors = render_errors(templates);
    let message = located(
        &errors,
        "haproxy.cfg",
        2,
        "    maxconn {{ extraContext.maxconn }}",
    );
    assert!(message.starts_with("undefined value"), "{message}");
    assert!(message.contains("maxconn"), "{message}");
}

#[test]
fn fail_stops_the_render_with_its_message() {
    let errors = render_errors(Templates::new(
        "global\n{% if resources.services.list() | length == 0 %}\n{{ fail('no services are defined') }}\n{% endif %}",
    ));
    let message = located(
        &errors,
        "haproxy.cfg",
        3,
        "{{ fail('no services are defined') }}",
    );
    assert_eq!(message, "fail(): no services are defined");
}

#[test]
fn out_of_fuel_fails_with_a_clear_error() {
    let mut templates = Templates::new(
        "global\n{% for i in range(100000) %}\n{% for j in range(100000) %}{{ i * j }}{% endfor %}\n{% endfor %}\n",
    );
    templates.limits = RenderLimits {
        fuel: Some(100_000),
        ..RenderLimits::default()
    };
    let errors = render_errors(templates);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let location = errors[0].location.as_ref().expect("located");
    assert_eq!(location.file, "haproxy.cfg");
    assert!(matches!(location.line, Some(2..=3)), "{:?}", location.line);
    assert!(
        errors[0].message.contains("ran out of fuel after 100000")
            && errors[0].message.contains("raise templating.fuel"),
        "{}",
        errors[0]
    );
}

#[test]
fn runaway_recursion_hits_the_recursion_limit() {
    // A dynamic self-include escapes the static cycle check; the limit stops it.
    let mut templates = Templates::new("{% include 'loop' %}");
    templates.snippets.insert(
        "loop".into(),
        "x\n{% set name = 'lo' ~ 'op' %}{% include name %}".into(),
    );
    templates.limits.recursion_limit = 50;
    let errors = render_errors(templates);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let location = errors[0].location.as_ref().expect("located");
    assert_eq!(location.file, "loop");
    assert_eq!(location.line, Some(2));
    assert!(
        errors[0].message.contains("recursion limit")
            && errors[0].message.contains("templating.recursionLimit (50)"),
        "{}",
        errors[0]
    );
}

#[test]
fn errors_inside_snippets_name_the_snippet_and_the_include_chain() {
    let mut templates = Templates::new("global\n\n{% include 'outer' %}\n");
    templates
        .snippets
        .insert("outer".into(), "o\n{% include 'inner' %}".into());
    templates
        .snippets
        .insert("inner".into(), "line\n\n{{ fail('boom') }}".into());
    let errors = render_errors(templates);
    let message = located(&errors, "inner", 3, "{{ fail('boom') }}");
    assert_eq!(
        message,
        "fail(): boom (included from outer:2, included from haproxy.cfg:3)"
    );
}

#[test]
fn errors_inside_render_glob_snippets_name_the_snippet() {
    let mut templates = Templates::new("a\n{{ render_glob('x-*') }}");
    templates.snippets.insert("x-1".into(), "fine".into());
    templates
        .snippets
        .insert("x-2".into(), "{{ 1 / 0 }}".into());
    let errors = render_errors(templates);
    let message = located(&errors, "x-2", 1, "{{ 1 / 0 }}");
    assert!(message.contains("included from haproxy.cfg:2"), "{message}");
}

#[test]
fn errors_in_maps_files_and_certificates_are_all_reported() {
    let mut templates = Templates::new("ok");
    templates
        .maps
        .insert("a.map".into(), "x\n{{ fail('map') }}".into());
    templates
        .files
        .insert("f".into(), "{{ path('nope') }}".into());
    templates
        .certificates
        .insert("c.pem".into(), "{{ 'x' | b64decode }}".into());
    let errors = render_errors(templates);
    let where_: Vec<String> = errors
        .iter()
        .map(|e| e.location.as_ref().unwrap().to_string())
        .collect();
    assert_eq!(where_.len(), 3, "{errors:#?}");
    assert!(where_[0].starts_with("maps/a.map:2"), "{where_:?}");
    assert!(where_[1].starts_with("files/f:1"), "{where_:?}");
    assert!(where_[2].starts_with("certs/c.pem:1"), "{where_:?}");
    assert!(
        errors[1]
            .message
            .contains("path(\"nope\"): no map, file or certificate"),
        "{}",
        errors[1]
    );
    assert!(errors[2].message.contains("b64decode"), "{}", errors[2]);
}

#[test]
fn errors_come_in_file_order_whether_files_render_in_parallel_or_after_haproxy_cfg() {
    // `a.map` and `f` name `shared` (rendered after haproxy.cfg, in order); `b.map`
    // and `c.pem` do not (rendered in parallel with it).
    let mut templates = Templates::new("{% set _ = shared.set('k', 1) %}ok");
    templates
        .maps
        .insert("a.map".into(), "{{ shared.k }}\n{{ fail('a') }}".into());
    templates
        .maps
        .insert("b.map".into(), "{{ fail('b') }}".into());
    templates
        .files
        .insert("f".into(), "{{ fail('f ' ~ shared.k) }}".into());
    templates
        .certificates
        .insert("c.pem".into(), "x\ny\n{{ fail('c') }}".into());
    let errors = render_errors(templates);
    let found: Vec<(String, &str)> = errors
        .iter()
        .map(|e| (e.location.as_ref().unwrap().to_string(), e.message.as_str()))
        .collect();
    assert_eq!(found.len(), 4, "{errors:#?}");
    let expected = [
        ("maps/a.map:2", "fail(): a"),
        ("maps/b.map:1", "fail(): b"),
        ("files/f:1", "fail(): f 1"),
        ("certs/c.pem:3", "fail(): c"),
    ];
    for ((location, message), (want_location, want_message)) in found.iter().zip(expected) {
        assert!(location.starts_with(want_location), "{found:?}");
        assert_eq!(*message, want_message, "{found:?}");
    }
}

#[test]
fn a_failing_main_template_stops_before_the_other_files() {
    let mut templates = Templates::new("{{ fail('main') }}");
    templates
        .maps
        .insert("a.map".into(), "{{ fail('map') }}".into());
    let errors = render_errors(templates);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].message, "fail(): main");
}

#[test]
fn resource_lookup_errors_are_located() {
    let renderer = Renderer::new(
        Templates::new("a\n{{ resources.services.get('team-1') }}"),
        &fixtures::WATCHED,
    )
    .expect("loads");
    let errors = renderer
        .render(&fixtures::resources(30))
        .expect_err("ambiguous get");
    let message = located(
        &errors,
        "haproxy.cfg",
        2,
        "{{ resources.services.get('team-1') }}",
    );
    assert!(
        message.contains("expected at most one object, found 3; use fetch()"),
        "{message}"
    );

    let renderer = Renderer::new(
        Templates::new("{{ resources.services.fetch('a', 'b', 'c') }}"),
        &fixtures::WATCHED,
    )
    .expect("loads");
    let errors = renderer
        .render(&fixtures::resources(1))
        .expect_err("too many keys");
    assert!(
        errors[0]
            .message
            .contains("3 index keys given, but only 2 indexBy paths"),
        "{}",
        errors[0]
    );
}

#[test]
fn filter_argument_errors_are_located() {
    for (template, needle) in [
        (
            "{{ [1] | sort_by() }}",
            "sort_by: give at least one attribute path",
        ),
        ("{{ [1] | sort_by('a..b') }}", "invalid attribute path"),
        (
            "{{ [1, 2] | sort_by('a', revers=true) }}",
            "unknown keyword argument 'revers'",
        ),
        (
            "{{ resources.services.list() | sort_by('metadata..name') }}",
            "invalid attribute path",
        ),
        ("{{ 'x' | glob_match('[') }}", "invalid glob pattern"),
        ("{{ 1 | glob_match('*') }}", "expected a string or a list"),
        ("{{ shared.set('k') }}", "shared.set() takes 2 arguments"),
        ("{{ shared.nope() }}", "has no method named nope"),
        (
            "{{ resources.services.nope() }}",
            "resources.services has no method nope()",
        ),
        ("{{ path('a') }}", "no map, file or certificate"),
    ] {
        let errors = render_errors(Templates::new(format!("\n{template}")));
        let message = located(&errors, "haproxy.cfg", 2, template);
        assert!(message.contains(needle), "{template}: {message}");
    }
}

#[test]
fn diagnostics_display_like_a_compiler() {
    let errors = render_errors(Templates::new("global\n  {{ fail('stop') }}"));
    assert_eq!(errors[0].to_string(), "haproxy.cfg:2:6: fail(): stop");
}

#[test]
fn output_past_the_cap_stops_with_the_file_the_line_and_the_cap() {
    // 1,000 pieces of 1 MB would be 1 GB; the cap stops the map after two.
    let mut templates = Templates::new("global\n");
    templates.maps.insert(
        "big.map".into(),
        "# header\n{% for i in range(1000) %}{{ 'x' * 1000000 }}{% endfor %}\n".into(),
    );
    templates.limits.max_output_bytes = ByteSize::mib(1);
    let errors = render_errors(templates);
    let message = located(
        &errors,
        "maps/big.map",
        2,
        "{% for i in range(1000) %}{{ 'x' * 1000000 }}{% endfor %}",
    );
    assert!(
        message
            .starts_with("the output of maps/big.map grew past templating.maxOutputBytes (1MiB)"),
        "{message}"
    );
    assert!(
        message.contains("raise templating.maxOutputBytes"),
        "{message}"
    );
}

#[test]
fn output_of_all_files_together_is_capped_too() {
    // Each file alone fits under the cap; together they do not.
    let mut templates = Templates::new("global\n");
    for name in ["a.map", "b.map", "c.map"] {
        templates
            .maps
            .insert(name.into(), "{{ 'x' * 400000 }}\n".into());
    }
    templates.limits.max_output_bytes = ByteSize(1_000_000);
    let errors = render_errors(templates);
    assert!(!errors.is_empty());
    for error in &errors {
        assert!(
            error
                .message
                .starts_with("all rendered files together grew past templating.maxOutputBytes"),
            "{error}"
        );
        let location = error.location.as_ref().expect("located");
        assert!(location.file.starts_with("maps/"), "{error}");
        assert_eq!(location.line, Some(1), "{error}");
    }

    // Under the cap the same templates render, byte for byte.
    let mut templates = Templates::new("global\n");
    templates
        .maps
        .insert("a.map".into(), "{{ 'x' * 400000 }}\n".into());
    templates.limits.max_output_bytes = ByteSize(1_000_000);
    let renderer = Renderer::new(templates, &["services"]).expect("templates load");
    let config = renderer.render(&Resources::new()).expect("renders");
    assert_eq!(
        config.maps()["a.map"].as_ref(),
        format!("{}\n", "x".repeat(400_000))
    );
}
