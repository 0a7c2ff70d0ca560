//! The renderer: golden outputs for a realistic routing template, determinism, the
//! source map, Jinja2 semantics, filters and functions, and that instrumentation for
//! the source map never changes a single rendered byte.

#[path = "../testdata/fixtures.rs"]
mod fixtures;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use hapwright_eventbus::model::{FileKind, RenderedConfig, RenderedFileRef};
use hapwright_reconciler::renderer::{Renderer, Resources, Templates, TemplatingSettings};
use serde_json::json;

fn renderer(templates: Templates, watched: &[&str]) -> Renderer {
    match Renderer::new(templates, watched) {
        Ok(renderer) => renderer,
        Err(errors) => panic!("templates do not load: {errors:#?}"),
    }
}

fn render_main(main: &str) -> String {
    render_templates(Templates::new(main))
}

fn render_templates(templates: Templates) -> String {
    let config = renderer(templates, &[])
        .render(&Resources::new())
        .unwrap_or_else(|errors| panic!("render failed: {errors:#?}"));
    config.main().to_string()
}

/// Renders `template` as a `files` entry, which is written as the engine prints it
/// (no escaping for HAProxy syntax): for tests of Jinja2 semantics.
fn render_text(template: &str) -> String {
    let config = renderer(text_templates(template), &[])
        .render(&Resources::new())
        .unwrap_or_else(|errors| panic!("render failed: {errors:#?}"));
    text_file(&config)
}

fn text_templates(template: &str) -> Templates {
    let mut templates = Templates::new("");
    templates.files.insert("out".into(), template.into());
    templates
}

fn text_file(config: &RenderedConfig) -> String {
    let file = RenderedFileRef {
        kind: FileKind::File,
        name: "out".into(),
    };
    config.get(&file).expect("file exists").to_string()
}

fn main_file() -> RenderedFileRef {
    RenderedFileRef {
        kind: FileKind::Main,
        name: "haproxy.cfg".into(),
    }
}

/// Every line of a rendered file with its origin, for snapshots.
fn annotated(config: &RenderedConfig, file: &RenderedFileRef) -> String {
    let text = config.get(file).expect("file exists");
    let mut out = String::new();
    for (index, line) in text.lines().enumerate() {
        let origin = config
            .source_map()
            .origin(file, index as u32 + 1)
            .map(|o| format!("{}:{}", o.template, o.line))
            .unwrap_or_else(|| "-".into());
        writeln!(out, "{origin:>22} | {line}").unwrap();
    }
    out
}

// === golden ===

#[test]
fn routing_example_golden_outputs() {
    let renderer = renderer(fixtures::routing_templates(), &fixtures::WATCHED);
    let config = renderer.render(&fixtures::resources(3)).expect("renders");
    insta::assert_snapshot!("routing_haproxy_cfg", config.main().as_ref());
    insta::assert_snapshot!("routing_hosts_map", config.maps()["hosts.map"].as_ref());
    insta::assert_snapshot!("routing_paths_map", config.maps()["paths.map"].as_ref());
    insta::assert_snapshot!("routing_503_http", config.files()["503.http"].as_ref());
    insta::assert_snapshot!(
        "routing_default_pem",
        config.certificates()["default.pem"].as_ref()
    );
    insta::assert_snapshot!(
        "routing_haproxy_cfg_source_map",
        annotated(&config, &main_file())
    );
    let paths = RenderedFileRef {
        kind: FileKind::Map,
        name: "paths.map".into(),
    };
    insta::assert_snapshot!("routing_paths_map_source_map", annotated(&config, &paths));
}

#[test]
fn rendering_is_deterministic() {
    let resources = fixtures::resources(50);
    let first = renderer(fixtures::routing_templates(), &fixtures::WATCHED)
        .render(&resources)
        .expect("renders");
    let again = renderer(fixtures::routing_templates(), &fixtures::WATCHED);
    for _ in 0..3 {
        let second = again.render(&resources).expect("renders");
        assert_eq!(first.hash(), second.hash());
        assert!(
            first == second,
            "same inputs must give the same bytes and source map"
        );
    }
    // A different input gives a different hash.
    let other = again.render(&fixtures::resources(51)).expect("renders");
    assert_ne!(first.hash(), other.hash());
}

/// Removes Service team-1/svc-1 from the fixtures' resources through an
/// incremental update, as a source reports it.
fn remove_svc_1(resources: &mut Resources) {
    let services = fixtures::cluster(2)["services"].clone();
    let mut next = (*services).clone();
    let key = hapwright_eventbus::model::ObjectKey::new("team-1", "svc-1");
    next.remove(&key);
    let change = hapwright_eventbus::model::ResourceChange {
        removed: vec![key],
        ..Default::default()
    };
    resources.update(&Arc::from("services"), services, None);
    resources.update(&Arc::from("services"), Arc::new(next), Some(&change));
}

#[test]
fn resource_updates_are_reflected_in_the_next_render() {
    let renderer = renderer(fixtures::routing_templates(), &fixtures::WATCHED);
    let mut resources = fixtures::resources(2);
    let before = renderer.render(&resources).expect("renders");
    assert!(before.main().contains("backend team-1_svc-1"));

    remove_svc_1(&mut resources);
    let after = renderer.render(&resources).expect("renders");
    assert!(!after.main().contains("backend team-1_svc-1"));
    assert!(after.main().contains("backend team-0_svc-0"));
    assert!(!after.maps()["hosts.map"].contains("svc-1"));
}

#[test]
fn a_file_rendered_again_to_the_same_text_is_handed_out_as_before() {
    // `steady.map` reads every Service, so it renders again when one goes, and
    // prints the same text: the render hands out last time's allocation, which
    // what compares renders by pointer (digests, the validator, the plan) takes
    // as unchanged.
    let mut templates = fixtures::routing_templates();
    templates.maps.insert(
        "steady.map".into(),
        "{% for s in resources.services.list() %}{% endfor %}steady value\n".into(),
    );
    let renderer = renderer(templates, &fixtures::WATCHED);
    let mut resources = fixtures::resources(2);
    let before = renderer.render(&resources).expect("renders");
    remove_svc_1(&mut resources);
    let (after, stats) = renderer.render_with_stats(&resources);
    let after = after.expect("renders");
    assert!(stats.rendered > 0, "{stats:?}");
    assert!(Arc::ptr_eq(
        &before.maps()["steady.map"],
        &after.maps()["steady.map"]
    ));
    assert_ne!(before.maps()["hosts.map"], after.maps()["hosts.map"]);
    assert_eq!(after, renderer.render(&resources).expect("renders"));
}

// === source map ===

#[test]
fn source_map_follows_literals_loops_includes_and_globs() {
    let mut templates = Templates::new(
        "global\n\
         {% for i in range(2) %}\n\
         \x20 line {{ i }}\n\
         {% endfor %}\n\
         {% include 'inc' %}\n\
         {{ render_glob('ext-*') }}\n\
         {{ 'multi\\nline' }}\n\
         \n\
         end\n",
    );
    templates.settings.trim_blocks = true;
    // trimBlocks eats the newline after `{% include %}` and Jinja drops the snippet's
    // final newline, so the snippet ends with an empty line to end its last line.
    templates
        .snippets
        .insert("inc".into(), "from inc\n\nsecond\n\n".into());
    templates.snippets.insert("ext-a".into(), "ext a".into());
    templates
        .snippets
        .insert("ext-b".into(), "{% if true %}\next b{% endif %}".into());
    let config = renderer(templates, &[])
        .render(&Resources::new())
        .expect("renders");
    insta::assert_snapshot!(annotated(&config, &main_file()), @r"
           haproxy.cfg:1 | global
           haproxy.cfg:3 |   line 0
           haproxy.cfg:3 |   line 1
                   inc:1 | from inc
                       - | 
                   inc:3 | second
                 ext-a:1 | ext a
                 ext-b:2 | ext b
           haproxy.cfg:7 | multi
           haproxy.cfg:7 | line
                       - | 
           haproxy.cfg:9 | end
    ");
}

#[test]
fn maps_files_and_certificates_have_source_maps_and_paths() {
    let mut templates =
        Templates::new("use {{ path('a.map') }} {{ path('e.http') }} {{ path('c.pem') }}");
    templates
        .maps
        .insert("a.map".into(), "k v\n{{ 'x y' }}".into());
    templates.files.insert("e.http".into(), "body".into());
    templates.certificates.insert("c.pem".into(), "pem".into());
    let config = renderer(templates, &[])
        .render(&Resources::new())
        .expect("renders");
    assert_eq!(
        config.main().as_ref(),
        "use maps/a.map files/e.http certs/c.pem\n"
    );
    assert_eq!(config.maps()["a.map"].as_ref(), "k v\nx y\n");
    let origin = config
        .source_map()
        .origin_by_path("maps/a.map", 2)
        .expect("mapped");
    assert_eq!((origin.template.as_ref(), origin.line), ("maps/a.map", 2));
    let origin = config
        .source_map()
        .origin_by_path("certs/c.pem", 1)
        .expect("mapped");
    assert_eq!(origin.template.as_ref(), "certs/c.pem");
    assert_eq!(config.files()["e.http"].as_ref(), "body\n");
}

// === instrumentation never changes output ===

/// Renders with plain minijinja (no instrumentation) for comparison.
fn plain(main: &str, snippets: &BTreeMap<String, String>, settings: TemplatingSettings) -> String {
    let mut env = minijinja::Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(settings.trim_blocks)
            .lstrip_blocks(settings.lstrip_blocks)
            .build()
            .unwrap(),
    );
    env.add_template_owned("haproxy.cfg", main.to_owned())
        .unwrap();
    for (name, source) in snippets {
        env.add_template_owned(name.clone(), source.clone())
            .unwrap();
    }
    let mut out = env
        .get_template("haproxy.cfg")
        .unwrap()
        .render(minijinja::context! {})
        .unwrap();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

#[test]
fn instrumentation_does_not_change_output() {
    let cases = [
        "a\n  {% if x is undefined %}\n  b\n  {% endif %}\nc\n",
        "{% for i in range(3) %}\n  {{ i }}\n{% endfor %}\n",
        "{%- for i in range(3) -%}\n  {{- i -}}\n{%- endfor %}\nz",
        "x {{ 'y' }}   {# c #}\n  {#- c2 -#}\n z\n",
        "{% set v %}\n  hi {{ '' }}\n{% endset %}[{{ v | trim }}]{{ v | length }}{% if v | trim %}T{% endif %}\n",
        "{% set e %}{{ '' }}{% endset %}{% if e %}nonempty{% else %}empty{% endif %}\n",
        "{% macro m(a) %}\n  m{{ a }}\n{% endmacro %}{{ m(1) }}{{ m(2) | length }}\n",
        "{% macro w() %}[{{ caller(1) }}]{% endmacro %}{% call(x) w() %}\n c{{ x }}\n{% endcall %}\n",
        "{% filter upper %}\n  abc {{ 'd' }}\n{% endfilter %}\n",
        "{% raw %}\n  {{ not a var }}\n{% endraw %}\n",
        "{% include 'snip' %}\n{% include 'snip' %}",
        "  {{ 'a' }}\n\t{% if true %}t{% endif %}\n",
        "{{ '{{' }} and {{ \"%}\" }} {{ {'k': {'n': 1}}['k']['n'] }}\n",
        "line1\r\nline2\r\n",
        "{% if true %}   \n   {{- ' joined' }}\n{% endif %}\n",
        "a   \n   {%- if true %}\nb{% endif %}\n",
        "{% for x in [1, 2] %}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}\n",
        "{% with a = 1 %}\n  {{ a }}\n{% endwith %}\n",
        "",
        "\n",
        "   \n",
    ];
    let mut snippets = BTreeMap::new();
    snippets.insert(
        "snip".to_owned(),
        "s1\n  {% if true %}\n  s2\n  {% endif %}\n".to_owned(),
    );
    for trim_blocks in [false, true] {
        for lstrip_blocks in [false, true] {
            let settings = TemplatingSettings {
                trim_blocks,
                lstrip_blocks,
                strict_undefined: false,
            };
            for case in cases {
                let mut templates = Templates::new(case);
                templates.snippets = snippets.clone();
                templates.settings = settings;
                assert_eq!(
                    render_templates(templates),
                    plain(case, &snippets, settings),
                    "case {case:?} with {settings:?}"
                );
            }
        }
    }
}

// === Jinja2 semantics ===

#[test]
fn final_newline_is_dropped_like_jinja2_also_in_includes() {
    let mut templates = Templates::new("a\n{% include 'snip' %}|\n");
    templates.snippets.insert("snip".into(), "inside\n".into());
    assert_eq!(render_templates(templates), "a\ninside|\n");
    // The file still ends with a newline.
    assert_eq!(render_main("no newline"), "no newline\n");
    assert_eq!(render_main("two\n\n"), "two\n");
}

#[test]
fn python_methods_and_values_print_like_jinja2() {
    let out = render_text(
        "{{ 'a-b-c'.replace('-', '_') }} {{ 'x={}'.format(1) }} {{ 'a,b'.split(',') | join('|') }} \
         {{ 'web-1'.startswith('web') }} {{ {'k': 1}.get('k') }} {{ {'k': 1}.get('z', 'dflt') }} \
         {% for k, v in {'b': 2, 'a': 1}.items() %}{{ k }}={{ v }};{% endfor %} \
         {{ none }} {{ true }} {{ false }} {{ '  pad '.strip() }} {{ 'Up'.lower() }} {{ 'a b'.title() }}",
    );
    assert_eq!(
        out,
        "a_b_c x=1 a|b True 1 dflt b=2;a=1; None True False pad up A B\n"
    );
}

#[test]
fn numbers_print_like_jinja2() {
    let out = render_main(
        "{{ 8080 }} {{ -3 }} {{ 0 }} {{ 1.0 }} {{ 2.5 }} {{ 18446744073709551615 }} \
         {{ -9223372036854775808 }} {{ 10 // 3 }} {{ 7 / 2 }} {{ [1, 2] | sum }}",
    );
    assert_eq!(
        out,
        "8080 -3 0 1.0 2.5 18446744073709551615 -9223372036854775808 3 3.5 3\n"
    );
}

#[test]
fn trim_and_lstrip_blocks_follow_the_settings() {
    let main = "x\n    {% if true %}\n    y\n    {% endif %}\nz";
    assert_eq!(render_main(main), "x\n    \n    y\n    \nz\n");
    let mut templates = Templates::new(main);
    templates.settings.trim_blocks = true;
    templates.settings.lstrip_blocks = true;
    assert_eq!(render_templates(templates), "x\n    y\nz\n");
}

#[test]
fn undefined_values_are_lenient_by_default() {
    assert_eq!(
        render_main(
            "[{{ nope }}][{{ nope | default('d') }}][{% if nope %}x{% endif %}][{% for x in nope %}{% endfor %}]"
        ),
        "[][d][][]\n"
    );
}

// === context and functions ===

#[test]
fn resources_list_fetch_get_and_iteration() {
    let resources = fixtures::resources(12);
    let templates = Templates::new(
        "{{ resources.services.list() | length }} {{ resources.services | length }} \
         {{ resources.services.fetch('team-3') | map(attribute='metadata.name') | join(',') }} \
         {{ resources.services.get('team-3', 'svc-13') is none }} \
         {{ resources.services.get('team-2', 'svc-2').metadata.name }} \
         {{ resources.endpoints.fetch('team-1', 'svc-11')[0].metadata.name }} \
         {% for s in resources.services %}{% if loop.first %}{{ s.metadata.name }}{% endif %}{% endfor %} \
         {{ resources.secrets.fetch() | length }}",
    );
    let config = renderer(templates, &fixtures::WATCHED)
        .render(&resources)
        .expect("renders");
    assert_eq!(
        config.main().as_ref(),
        "12 12 svc-3 True svc-2 svc-11-abcde svc-0 1\n"
    );
}

#[test]
fn sources_without_data_are_empty() {
    let templates = Templates::new(
        "{{ resources.services.list() | length }} {{ resources.services.fetch('a', 'b') | length }} {{ resources.services.get('a') }}",
    );
    let config = renderer(templates, &["services"])
        .render(&Resources::new())
        .expect("renders");
    assert_eq!(config.main().as_ref(), "0 0 None\n");
}

#[test]
fn extra_context_and_shared_memo_span_the_whole_render() {
    let mut templates = Templates::new(
        "{% set _ = shared.set('backends', ['a', 'b']) %}{{ shared.append('log', 1) }}{{ shared.append('log', 2) }}\
         {{ extraContext.port }} {{ shared.setdefault('x', 5) }} {{ shared.setdefault('x', 6) }} {{ shared.has('nope') }}",
    );
    templates.extra_context = json!({"port": 8080});
    templates.maps.insert(
        "m.map".into(),
        "{{ shared.backends | join(',') }} {{ shared.get('log') }} {{ shared['x'] }} {{ shared.get('nope', 'd') }} {{ shared.keys() | join(',') }}".into(),
    );
    let config = renderer(templates, &[])
        .render(&Resources::new())
        .expect("renders");
    assert_eq!(config.main().as_ref(), "8080 5 5 False\n");
    assert_eq!(
        config.maps()["m.map"].as_ref(),
        "a,b [1, 2] 5 d backends,log,x\n"
    );
}

/// A list built with `shared.append` is a list like any other to templates, and a
/// list read before an append keeps the items it had.
#[test]
fn shared_append_builds_a_plain_list_and_earlier_reads_keep_their_items() {
    let templates = Templates::new(
        "{% set _ = shared.set('l', ['a']) %}{{ shared.append('l', 'b') }}\
         {% set before = shared.get('l') %}{{ shared.append('l', 'c') }}\
         {{ before | join(',') }} {{ shared.l | join(',') }} {{ shared.l | length }} \
         {{ shared.l[-1] }} {{ shared.l[0] }} {{ (shared.l | tojson) == (['a', 'b', 'c'] | tojson) }} {{ shared.l == ['a', 'b', 'c'] }} \
         {% for x in shared.l %}{{ loop.index }}{{ x }}{% endfor %} {{ shared.l | reverse | join('') }} \
         {{ 'b' in shared.l }}{% for i in range(1000) %}{{ shared.append('n', i) }}{% endfor %} \
         {{ shared.n | length }} {{ shared.n | sum }}",
    );
    let config = renderer(templates, &[])
        .render(&Resources::new())
        .expect("renders");
    assert_eq!(
        config.main().as_ref(),
        "a,b a,b,c 3 c a True True 1a2b3c cba True 1000 499500\n"
    );
}

/// `shared.put` builds a keyed list: a new entry goes at the end, an entry put
/// again is replaced where it is, and to templates it is a plain list. `append`
/// on it, `put` on anything else and a key that is not a string are errors.
#[test]
fn shared_put_replaces_an_entry_in_place_and_adds_new_ones_at_the_end() {
    let config = renderer(
        Templates::new(
            "{{ shared.put('t', 'a', 1) }}{{ shared.put('t', 'b', 2) }}\
             {% set before = shared.get('t') %}{{ shared.put('t', 'a', 3) }}{{ shared.put('t', 'c', [4, 5]) }}\
             {{ before | join(',') }} {{ shared.t[:2] | join(',') }} {{ shared.t | length }} {{ shared.t[-1] | join('+') }}",
        ),
        &[],
    )
    .render(&Resources::new())
    .expect("renders");
    assert_eq!(config.main().as_ref(), "1,2 3,2 3 4+5\n");

    for (template, error) in [
        (
            "{{ shared.put('t', 'a', 1) }}{{ shared.append('t', 2) }}",
            "`t` is a keyed list (built with shared.put); add to it with put",
        ),
        (
            "{{ shared.append('t', 1) }}{{ shared.put('t', 'a', 2) }}",
            "`t` holds a sequence, not a keyed list",
        ),
        (
            "{{ shared.put('t', 1, 2) }}",
            "the entry's key must be a string, got number",
        ),
        ("{{ shared.put('t', 'a') }}", "takes 3 arguments, got 2"),
    ] {
        let errors = renderer(Templates::new(template), &[])
            .render(&Resources::new())
            .expect_err(template);
        assert!(
            errors.iter().any(|e| e.message.contains(error)),
            "{template}: {errors:#?}"
        );
    }
}

#[test]
fn files_that_use_shared_render_after_haproxy_cfg_in_order_while_others_run_in_parallel() {
    // Maps render in name order, then files, then certificates; the ones that name
    // `shared` see what haproxy.cfg and the earlier ones wrote, and the others (which
    // render in parallel) give the same bytes on every render.
    let mut templates = Templates::new("{{ shared.append('order', 'cfg') }}main");
    for (name, body) in [
        (
            "a.map",
            "{{ shared.append('order', 'a') }}{{ shared.order | join(',') }}",
        ),
        ("b.map", "{% for i in range(2000) %}{{ i }} {% endfor %}"),
        (
            "c.map",
            "{{ shared.append('order', 'c') }}{{ shared.order | join(',') }}",
        ),
    ] {
        templates.maps.insert(name.into(), body.into());
    }
    templates.files.insert(
        "f".into(),
        "{{ shared.append('order', 'f') }}{{ shared.order | join(',') }}".into(),
    );
    templates
        .certificates
        .insert("c.pem".into(), "{{ range(3) | join('-') }}".into());
    let renderer = renderer(templates, &[]);
    let first = renderer.render(&Resources::new()).expect("renders");
    assert_eq!(first.maps()["a.map"].as_ref(), "cfg,a\n");
    assert_eq!(first.maps()["c.map"].as_ref(), "cfg,a,c\n");
    assert_eq!(first.files()["f"].as_ref(), "cfg,a,c,f\n");
    assert_eq!(first.certificates()["c.pem"].as_ref(), "0-1-2\n");
    assert!(first.maps()["b.map"].starts_with("0 1 2 "));
    for _ in 0..20 {
        assert_eq!(
            renderer.render(&Resources::new()).expect("renders").hash(),
            first.hash()
        );
    }
}

#[test]
fn shared_does_not_leak_between_renders() {
    let templates = Templates::new("{{ shared.get('n', 0) }}{% set _ = shared.set('n', 1) %}");
    let renderer = renderer(templates, &[]);
    let resources = Resources::new();
    assert_eq!(renderer.render(&resources).unwrap().main().as_ref(), "0\n");
    assert_eq!(renderer.render(&resources).unwrap().main().as_ref(), "0\n");
}

#[test]
fn filters_b64decode_glob_match_regex_escape() {
    let out = render_text(
        "{{ 'aGVsbG8=' | b64decode }} {{ 'aGVsbG8' | b64decode }} {{ 'web-1' | glob_match('web-*') }} \
         {{ ['web-1', 'db-1', 'web-2'] | glob_match('web-*') | join(',') }} \
         {{ 'api' is glob_match('a?i') }} {{ 'a.b*c' | regex_escape }}",
    );
    assert_eq!(out, "hello hello True web-1,web-2 True a\\.b\\*c\n");
}

#[test]
fn sort_by_several_paths_descending_and_reverse() {
    let out = render_main(
        "{% set items = [{'n': 'b', 'p': 1, 'm': {'x': 2}}, {'n': 'a', 'p': 2, 'm': {'x': 1}}, {'n': 'c', 'p': 1, 'm': {'x': 3}}, {'n': 'd'}] %}\
         {{ items | sort_by('p', 'n') | map(attribute='n') | join }} \
         {{ items | sort_by('-p', 'n') | map(attribute='n') | join }} \
         {{ items | sort_by('m.x') | map(attribute='n') | join }} \
         {{ items | sort_by('n', reverse=true) | map(attribute='n') | join }} \
         {{ [[3], [1], [2]] | sort_by('0') | map('first') | join }}",
    );
    assert_eq!(out, "dbca abcd dabc dcba 123\n");
}

#[test]
fn sort_by_on_resource_lists_is_remembered_per_change_and_stays_correct() {
    let templates = text_templates(
        "{{ resources.services.list() | sort_by('-metadata.name') | map(attribute='metadata.name') | join(',') }} \
         {{ resources.services.list() | sort_by('-metadata.name') | map(attribute='metadata.name') | join(',') }} \
         {{ resources.services | sort_by('metadata.name', reverse=true) | first | attr('metadata') | attr('name') }} \
         {{ resources.services.list() | sort_by('metadata.name') | map(attribute='metadata.name') | join(',') }} \
         {% set slice = resources.endpoints.fetch('team-1', 'svc-1')[0] %}\
         {{ slice.endpoints | sort_by('-targetRef.name') | map(attribute='targetRef.name') | join(',') }} \
         {{ slice.endpoints | sort_by('-targetRef.name') | map(attribute='targetRef.name') | join(',') }} \
         {{ slice.endpoints | sort_by('targetRef.name') | map(attribute='targetRef.name') | join(',') }} \
         {{ slice.endpoints | length }} {{ slice.endpoints[-1].targetRef.name }} {{ slice.ports }}",
    );
    let renderer = renderer(templates, &fixtures::WATCHED);
    let mut resources = fixtures::resources(3);
    let expected = "svc-2,svc-1,svc-0 svc-2,svc-1,svc-0 svc-2 svc-0,svc-1,svc-2 \
                    svc-1-pod-2,svc-1-pod-1,svc-1-pod-0 svc-1-pod-2,svc-1-pod-1,svc-1-pod-0 \
                    svc-1-pod-0,svc-1-pod-1,svc-1-pod-2 3 svc-1-pod-2 \
                    [{'name': 'http', 'port': 8080, 'protocol': 'TCP'}]\n";
    // The first render sorts and remembers, the second answers from memory.
    for _ in 0..2 {
        let config = renderer.render(&resources).expect("renders");
        assert_eq!(text_file(&config), expected);
    }
    // A change brings new lists, sorted afresh.
    let services = fixtures::cluster(4)["services"].clone();
    resources.update(&Arc::from("services"), services, None);
    let config = renderer.render(&resources).expect("renders");
    assert!(
        text_file(&config).starts_with(
            "svc-3,svc-2,svc-1,svc-0 svc-3,svc-2,svc-1,svc-0 svc-3 svc-0,svc-1,svc-2,svc-3 "
        ),
        "{}",
        text_file(&config)
    );
}

/// A list sorted again after a change starts from the order of the version before
/// (the objects that did not change keep theirs; the others are put where they
/// sort): after every step of random adds, changes and removals (reported as a
/// watcher reports them), each sort of a long-lived renderer equals a fresh
/// renderer's, ties, missing keys, descending keys and `reverse` included.
#[test]
fn a_list_sorted_again_after_a_change_sorts_as_a_fresh_sort() {
    use hapwright_eventbus::model::{ObjectKey, ResourceChange, ResourceSnapshot, UpsertOutcome};
    let templates = text_templates(
        "{{ resources.items.list() | sort_by('spec.a') | map(attribute='metadata.name') | join(',') }}\n\
         {{ resources.items.list() | sort_by('-spec.a', 'spec.b') | map(attribute='metadata.name') | join(',') }}\n\
         {{ resources.items.list() | sort_by('spec.b', reverse=true) | map(attribute='metadata.name') | join(',') }}\n\
         {{ resources.items.list() | sort_by('metadata.namespace') | map(attribute='metadata.name') | join(',') }}",
    );
    let kept = renderer(templates.clone(), &["items"]);
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut draw = move |below: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % below
    };
    let mut snapshot = ResourceSnapshot::new(Vec::new());
    let mut resources = Resources::new();
    let mut sorted_again = 0;
    for step in 0..300 {
        let mut change = ResourceChange::default();
        for _ in 0..=draw(3) {
            let key = ObjectKey::new(format!("ns{}", draw(3)), format!("o{}", draw(40)));
            if draw(4) == 0 {
                if snapshot.remove(&key).is_some() {
                    change.removed.push(key);
                }
                continue;
            }
            let mut spec = serde_json::Map::new();
            if draw(5) != 0 {
                spec.insert("a".into(), json!(draw(6)));
            }
            spec.insert("b".into(), json!(["x", "y", "z"][draw(3) as usize]));
            let object = json!({
                "metadata": {"namespace": key.namespace, "name": key.name},
                "spec": spec,
            });
            match snapshot.upsert(key.clone(), &object) {
                Some(UpsertOutcome::Added) => change.added.push(key),
                Some(UpsertOutcome::Modified) => change.modified.push(key),
                None => {}
            }
        }
        if change.is_empty() {
            continue;
        }
        resources.update(
            &Arc::from("items"),
            Arc::new(snapshot.clone()),
            Some(&change),
        );
        let fresh = renderer(templates.clone(), &["items"]);
        let mut again = Resources::new();
        again.update(&Arc::from("items"), Arc::new(snapshot.clone()), None);
        let (a, b) = (
            kept.render(&resources).expect("renders"),
            fresh.render(&again).expect("renders"),
        );
        assert_eq!(text_file(&a), text_file(&b), "step {step}");
        sorted_again += 1;
    }
    assert!(sorted_again > 200, "{sorted_again} steps changed something");
}

#[test]
fn tojson_sorts_keys_and_is_html_safe_like_jinja2() {
    let out = render_text(
        "{{ {'b': 1, 'a': [1, 'x<y&\\'z'], 'c': none} | tojson }}\n{{ {'b': {'d': 1, 'c': 2}} | tojson(indent=2) }}",
    );
    assert_eq!(
        out,
        "{\"a\": [1, \"x\\u003cy\\u0026\\u0027z\"], \"b\": 1, \"c\": null}\n{\n  \"b\": {\n    \"c\": 2,\n    \"d\": 1\n  }\n}\n"
    );
}

#[test]
fn render_glob_renders_matching_snippets_in_name_order() {
    let mut templates =
        Templates::new("[{{ render_glob('feature-*') }}]\n[{{ render_glob('none-*') }}]");
    templates
        .snippets
        .insert("feature-b".into(), "B {{ loop.index }}".into());
    templates.snippets.insert("feature-a".into(), "A\n".into());
    templates
        .snippets
        .insert("feature-c".into(), "{% set x = 1 %}C{{ x }}".into());
    templates.snippets.insert("other".into(), "O".into());
    assert_eq!(render_templates(templates), "[A\nB 2\nC1]\n[]\n");
}

#[test]
fn render_glob_keeps_variable_tag_whitespace_under_trim_and_lstrip() {
    let mut templates =
        Templates::new("a\n    {{ render_glob('s-*') }}\nb\n  {{- render_glob('s-*') -}}  \nc");
    templates.settings.trim_blocks = true;
    templates.settings.lstrip_blocks = true;
    templates.snippets.insert("s-1".into(), "x".into());
    assert_eq!(render_templates(templates), "a\n    x\nbxc\n");
}
