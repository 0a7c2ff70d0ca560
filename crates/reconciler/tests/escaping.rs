//! Values from watched resources never become HAProxy syntax: random strings (all
//! code points, control characters, HAProxy's quoting, comment, expansion and
//! log-format characters) printed in every place a template can put them either
//! refuse the render or reach HAProxy as exactly the intended text.
//!
//! The second test runs the real `haproxy`: it accepts the rendered config
//! (`haproxy -c`), then answers each value back (as a response body, a `Location`
//! header or a map lookup), byte for byte, and never with the secret from its
//! environment.

#[path = "../testdata/fixtures.rs"]
mod fixtures;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hapwright_eventbus::model::{FileKind, RenderedFileRef};
use hapwright_reconciler::renderer::{Renderer, Resources, Templates};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRng, TestRunner};
use serde_json::json;

const SECRET: &str = "s3cr3t-from-the-environment";

/// Characters that mean something to HAProxy or to the renderer, and others.
fn hostile_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => prop::sample::select(vec![
            ' ', '"', '\'', '\\', '#', '$', '%', '{', '}', '[', ']', '(', ')', ',', ':', '/',
            '=', '|', '?', '&', '*',
        ]),
        3 => prop::char::range('a', 'z'),
        1 => prop::sample::select(vec!['é', '日', '\u{1F600}', '\u{A0}', '\u{2028}']),
        1 => prop::sample::select(vec![
            '\n', '\r', '\0', '\t', '\u{7F}', '\u{85}', '\u{1B}', '\u{FDD0}', '\u{FDD1}',
            '\u{FDD2}', '\u{FDD3}', '\u{FDE5}',
        ]),
        1 => any::<char>(),
    ]
}

/// Strings built from [`hostile_char`], with the expansions an attacker writes.
fn hostile_string() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        6 => hostile_char().prop_map(String::from),
        1 => Just("%[env(SECRET)]".to_owned()),
        1 => Just("${SECRET}".to_owned()),
        1 => Just("%{+Q}o".to_owned()),
        1 => Just("\nlisten evil\n".to_owned()),
    ];
    prop::collection::vec(piece, 1..12).prop_map(|pieces| pieces.concat())
}

/// What no printed value may hold: a control character or a marker noncharacter.
fn refusable(value: &str) -> bool {
    value
        .chars()
        .any(|c| c.is_control() || ('\u{FDD0}'..='\u{FDEF}').contains(&c))
}

/// The template view of one object per value, in order (`spec.value`, `spec.index`).
fn resources(values: &[String]) -> Resources {
    let objects = values.iter().enumerate().map(|(index, value)| {
        json!({
            "metadata": { "namespace": "tenant", "name": format!("v{index:04}") },
            "spec": { "value": value, "index": index },
        })
    });
    let mut resources = Resources::new();
    let snapshot = fixtures::snapshot(&["metadata.namespace", "metadata.name"], objects);
    resources.update(&Arc::from("values"), snapshot, None);
    resources
}

fn renderer(templates: Templates) -> Renderer {
    Renderer::new(templates, &["values"]).unwrap_or_else(|errors| panic!("{errors:#?}"))
}

fn map_file() -> RenderedFileRef {
    RenderedFileRef {
        kind: FileKind::Map,
        name: "m.map".into(),
    }
}

// === every place, in process ===

/// Lines that put the value in each place of `haproxy.cfg`: a comment, bare words
/// (plain and log-format), double- and single-quoted strings (plain and
/// log-format), the middle of a word.
const PLACES: &str = "\
frontend f
    # object {{ v.spec.value }} ends here
    http-request return status 200 string {{ v.spec.value }} if TRUE
    http-request return status 200 string \"{{ v.spec.value }}\" if TRUE
    http-request return status 200 string '{{ v.spec.value }}' if TRUE
    http-request return status 200 lf-string x{{ v.spec.value }}y if TRUE
    http-request return status 200 lf-string \"{{ v.spec.value }}\" if TRUE
    http-request redirect location '/{{ v.spec.value }}' if TRUE
";

#[test]
fn a_value_is_refused_or_stays_on_its_line_in_every_place() {
    let mut templates = Templates::new(format!(
        "{{% for v in resources.values.list() %}}{PLACES}{{% endfor %}}"
    ));
    templates.maps.insert(
        "m.map".into(),
        "{% for v in resources.values.list() %}/k {{ v.spec.value }}\n{{ v.spec.value }} value\n{% endfor %}"
            .into(),
    );
    let renderer = renderer(templates);
    let lines = PLACES.lines().count();
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 1000,
        ..ProptestConfig::default()
    });
    runner
        .run(&hostile_string(), |value| {
            let rendered = renderer.render(&resources(std::slice::from_ref(&value)));
            let map_key_breaks = value.contains([' ', '\t']) || value.starts_with('#');
            match rendered {
                Err(errors) => {
                    prop_assert!(
                        refusable(&value) || map_key_breaks,
                        "refused without a reason: {value:?}: {errors:#?}"
                    );
                    prop_assert!(
                        errors.iter().all(|e| e.message.contains("refused")),
                        "{errors:#?}"
                    );
                }
                Ok(config) => {
                    prop_assert!(!refusable(&value) && !map_key_breaks, "{value:?}");
                    prop_assert_eq!(config.main().lines().count(), lines, "{:?}", config.main());
                    let map = config.get(&map_file()).expect("the map");
                    prop_assert_eq!(map.lines().count(), 2, "{:?}", map);
                    prop_assert!(!config.main().contains("listen evil"));
                }
            }
            Ok(())
        })
        .expect("every value is refused or stays in its place");
}

/// Both renderers print the same map for `resources`, or both refuse a value.
fn same_map_or_refused(
    looped: &Renderer,
    filtered: &Renderer,
    resources: &Resources,
    values: &dyn std::fmt::Debug,
) -> Result<(), TestCaseError> {
    match (looped.render(resources), filtered.render(resources)) {
        (Ok(a), Ok(b)) => {
            let (a, b) = (a.get(&map_file()), b.get(&map_file()));
            prop_assert_eq!(a, b, "{:?}", values);
        }
        (Err(a), Err(b)) => {
            prop_assert!(
                a.iter().chain(&b).all(|e| e.message.contains("refused")),
                "{a:#?} {b:#?}"
            );
        }
        (a, b) => prop_assert!(false, "{values:?}: {a:?} against {b:?}"),
    }
    Ok(())
}

/// `map_lines` prints what the loop it replaces prints, byte for byte, and refuses
/// what the loop refuses: random lists of hostile values as keys and values, mixed
/// with the template's own (trusted) text, a number, `none` and a constant value.
#[test]
fn map_lines_prints_and_refuses_as_the_loop() {
    const COLLECT: &str = "{% for v in resources.values.list() %}\
{% set _ = shared.append('pairs', [v.spec.value, 'be_' ~ v.spec.index]) %}\
{% set _ = shared.append('pairs', ['/k' ~ v.spec.index, v.spec.value]) %}\
{% set _ = shared.append('keys', v.spec.value) %}\
{% endfor %}{% set _ = shared.append('pairs', ['trusted-key', 7, none]) %}global\n";
    let make = |map: &str| {
        let mut templates = Templates::new(COLLECT);
        templates.maps.insert("m.map".into(), map.into());
        renderer(templates)
    };
    let looped = make(
        "{% for line in shared.get('pairs', []) %}\
{% for part in line %}{% if not loop.first %} {% endif %}{{ part }}{% endfor %}\n{% endfor %}\
{% for key in shared.get('keys', []) %}{{ key }} 1\n{% endfor %}",
    );
    let filtered = make(
        "{{ shared.get('pairs', []) | map_lines }}{{ shared.get('keys', []) | map_lines('1') }}",
    );
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 400,
        ..ProptestConfig::default()
    });
    runner
        .run(&prop::collection::vec(hostile_string(), 0..6), |values| {
            same_map_or_refused(&looped, &filtered, &resources(&values), &values)
        })
        .expect("map_lines prints and refuses as the loop");
}

/// The template view of one object per `(key, value)`, in order (`spec.value`,
/// `spec.key`, `spec.index`).
fn keyed_resources(values: &[(u8, String)]) -> Resources {
    let objects = values.iter().enumerate().map(|(index, (key, value))| {
        json!({
            "metadata": { "namespace": "tenant", "name": format!("v{index:04}") },
            "spec": { "value": value, "key": format!("k{key}"), "index": index },
        })
    });
    let mut resources = Resources::new();
    let snapshot = fixtures::snapshot(&["metadata.namespace", "metadata.name"], objects);
    resources.update(&Arc::from("values"), snapshot, None);
    resources
}

/// One edit of the list between two renders.
#[derive(Clone, Debug)]
enum Edit {
    Insert(usize, (u8, String)),
    Remove(usize),
    Replace(usize, String),
    Same,
}

fn edit() -> impl Strategy<Value = Edit> {
    let entry = (
        0u8..6,
        prop_oneof![3 => "[a-z]{1,6}", 1 => hostile_string()],
    );
    prop_oneof![
        4 => (any::<usize>(), entry).prop_map(|(at, entry)| Edit::Insert(at, entry)),
        2 => any::<usize>().prop_map(Edit::Remove),
        2 => (any::<usize>(), prop_oneof![3 => "[a-z]{1,6}", 1 => hostile_string()])
            .prop_map(|(at, value)| Edit::Replace(at, value)),
        1 => Just(Edit::Same),
    ]
}

/// `map_lines` keeps its output from one render to the next and prints only the
/// lines of items that changed: after every edit of a list built in `shared` (by a
/// pass whose unchanged iterations are reused, so items are the same values, and
/// by `append` and `put`), its output equals the loop's, byte for byte, and it
/// refuses what the loop refuses.
#[test]
fn map_lines_prints_a_changed_list_as_the_loop_prints_it() {
    let collect = "{% set _ = shared.append('pairs', [v.spec.value, 'be_' ~ v.spec.key]) %}\
{% set _ = shared.append('keys', v.spec.value) %}\
{% set _ = shared.put('table', v.spec.key, [v.spec.key, v.spec.value]) %}";
    let make = |map: &str| {
        let mut templates = Templates::new(
            "{% for v in resources.values.list() %}{% include 'collect' %}{% endfor %}global\n",
        );
        templates.snippets.insert("collect".into(), collect.into());
        templates.maps.insert("m.map".into(), map.into());
        renderer(templates)
    };
    let looped = make(
        "{% for line in shared.get('pairs', []) %}\
{% for part in line %}{% if not loop.first %} {% endif %}{{ part }}{% endfor %}\n{% endfor %}\
{% for key in shared.get('keys', []) %}{{ key }} 1\n{% endfor %}\
{% for line in shared.get('table', []) %}{{ line[0] }} {{ line[1] }}\n{% endfor %}",
    );
    let filtered = make(
        "{{ shared.get('pairs', []) | map_lines }}{{ shared.get('keys', []) | map_lines('1') }}\
{{ shared.get('table', []) | map_lines }}",
    );
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    });
    let start = prop::collection::vec((0u8..6, "[a-z]{1,6}"), 0..80);
    runner
        .run(
            &(start, prop::collection::vec(edit(), 1..24)),
            |(start, edits)| {
                let mut values = start;
                for edit in std::iter::once(Edit::Same).chain(edits) {
                    match edit {
                        Edit::Insert(at, entry) => values.insert(at % (values.len() + 1), entry),
                        Edit::Remove(at) if !values.is_empty() => {
                            values.remove(at % values.len());
                        }
                        Edit::Replace(at, value) if !values.is_empty() => {
                            let at = at % values.len();
                            values[at].1 = value;
                        }
                        _ => {}
                    }
                    same_map_or_refused(&looped, &filtered, &keyed_resources(&values), &values)?;
                }
                Ok(())
            },
        )
        .expect("map_lines prints a changed list as the loop prints it");
}

// === real HAProxy ===

/// The config that answers each value back: `/<place>/<index>` returns it.
const ANSWERS: &str = r#"global
    setenv SECRET {{ extraContext.secret }}
defaults
    mode http
    timeout client 5s
    timeout server 5s
    timeout connect 1s
frontend f
    bind unix@{{ extraContext.socket }}
{% for v in resources.values.list() %}
    # {{ v.spec.value }}
    http-request return status 200 content-type text/plain string {{ v.spec.value }} if { path /word/{{ v.spec.index }} }
    http-request return status 200 content-type text/plain string "{{ v.spec.value }}" if { path /quoted/{{ v.spec.index }} }
    http-request return status 200 content-type text/plain string '{{ v.spec.value }}' if { path /single/{{ v.spec.index }} }
    http-request return status 200 content-type text/plain lf-string {{ v.spec.value }} if { path /lf/{{ v.spec.index }} }
    http-request return status 200 content-type text/plain lf-string "{{ v.spec.value }}" if { path /lf-quoted/{{ v.spec.index }} }
    http-request return status 200 content-type text/plain lf-string '{{ v.spec.value }}' if { path /lf-single/{{ v.spec.index }} }
    http-request redirect location /to/{{ v.spec.value }} if { path /redirect/{{ v.spec.index }} }
    http-request return status 200 content-type text/plain hdr X-Value "{{ v.spec.value }}" if { path /header/{{ v.spec.index }} }
{% endfor %}
    http-request return status 200 content-type text/plain lf-string "%[path,map(maps/m.map)]"
"#;

const MAP: &str = "{% for v in resources.values.list() %}/map/{{ v.spec.index }} {{ v.spec.value }}\n{% endfor %}";

/// A `haproxy` process, stopped when dropped.
struct Haproxy(Child);

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(dir: &Path, socket: &Path) -> Haproxy {
    let child = Command::new("haproxy")
        .args(["-db", "-f", "haproxy.cfg"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("haproxy starts");
    let mut haproxy = Haproxy(child);
    // Ready once it accepts a connection on its socket.
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(socket).is_err() {
        assert!(
            haproxy.0.try_wait().expect("haproxy status").is_none(),
            "haproxy exited before listening"
        );
        assert!(
            Instant::now() < deadline,
            "haproxy did not listen within 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    haproxy
}

/// The response to `GET path` (HTTP/1.0): head and body.
fn get(socket: &Path, path: &str) -> (String, Vec<u8>) {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").expect("request");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("response");
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete head");
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    (head, response[split + 4..].to_vec())
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name)
            .then(|| value.trim_start_matches([' ', '\t']))
    })
}

/// Random values without what is refused anyway (tested above), none empty.
fn printable_values(count: usize, seed: u8) -> Vec<String> {
    let mut runner = TestRunner::new_with_rng(
        ProptestConfig::default(),
        TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &[seed; 32]),
    );
    let strategy = hostile_string().prop_filter("printable", |v| !refusable(v));
    (0..count)
        .map(|_| strategy.new_tree(&mut runner).expect("a value").current())
        .collect()
}

#[test]
fn haproxy_reads_every_value_back_exactly_and_never_expands_it() {
    if Command::new("haproxy").arg("-v").output().is_err() {
        panic!("this test needs the haproxy binary on PATH (scripts/test.sh installs it)");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let socket: PathBuf = dir.path().join("h.sock");
    let mut values = printable_values(200, 7);
    // The attacks of the issue, whole.
    values.extend(
        [
            "%[env(SECRET)]",
            "${SECRET}",
            "\"${SECRET}\"",
            "' %[env(SECRET)] '",
            "a b # c",
            "\\\"%[env(SECRET)]\\",
        ]
        .map(String::from),
    );
    let mut templates = Templates::new(ANSWERS);
    templates.maps.insert("m.map".into(), MAP.into());
    templates.extra_context = json!({
        "secret": SECRET,
        "socket": socket.display().to_string(),
    });
    let config = renderer(templates)
        .render(&resources(&values))
        .unwrap_or_else(|errors| panic!("{errors:#?}"));
    std::fs::create_dir_all(dir.path().join("maps")).expect("maps dir");
    std::fs::write(dir.path().join("haproxy.cfg"), config.main().as_bytes()).expect("write");
    std::fs::write(
        dir.path().join("maps/m.map"),
        config.get(&map_file()).expect("map").as_bytes(),
    )
    .expect("write map");

    let check = Command::new("haproxy")
        .args(["-c", "-f", "haproxy.cfg"])
        .current_dir(dir.path())
        .output()
        .expect("haproxy -c runs");
    assert!(
        check.status.success(),
        "haproxy -c refused the config: {}\n{}",
        String::from_utf8_lossy(&check.stderr),
        config.main()
    );

    let _haproxy = start(dir.path(), &socket);
    for (index, value) in values.iter().enumerate() {
        for place in ["word", "quoted", "single", "lf", "lf-quoted", "lf-single"] {
            let (head, body) = get(&socket, &format!("/{place}/{index}"));
            assert!(
                head.starts_with("HTTP/1.1 200"),
                "{place} {value:?}: {head}"
            );
            assert_eq!(
                String::from_utf8_lossy(&body),
                value.as_str(),
                "{place} {value:?}"
            );
        }
        let (head, _) = get(&socket, &format!("/redirect/{index}"));
        assert_eq!(
            header(&head, "location"),
            Some(format!("/to/{value}").as_str()),
            "redirect {value:?}: {head}"
        );
        let (head, _) = get(&socket, &format!("/header/{index}"));
        assert_eq!(
            header(&head, "x-value"),
            // The head's reader drops the blanks before a header's value.
            Some(value.trim_start_matches([' ', '\t'])),
            "header {value:?}: {head}"
        );
        // HAProxy trims the blanks around a map value.
        let (_, body) = get(&socket, &format!("/map/{index}"));
        assert_eq!(
            String::from_utf8_lossy(&body),
            value.trim_matches([' ', '\t']),
            "map {value:?}"
        );
        assert!(
            !String::from_utf8_lossy(&body).contains(SECRET) && !head.contains(SECRET),
            "the secret leaked for {value:?}"
        );
    }
}
