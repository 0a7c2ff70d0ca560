//! Differential tests: the incremental parse against the whole parse, on generated
//! configs and edits.

use proptest::prelude::*;

use super::super::{parse, parse_lenient};
use super::parse_reusing;

const QUICKSTART: &str = "global\n    log stderr format raw local0 notice\n\n\
defaults routes\n    mode http\n    balance roundrobin\n\n\
defaults\n    mode http\n    timeout connect 2s\n\n\
frontend http\n    bind 127.0.0.1:${HTTP_PORT}\n    use_backend %[var(txn.host),map(maps/hosts.map)]\n    default_backend be_no_route\n\n\
backend be_no_route\n    http-request return status 404 content-type text/plain string \"no route\\n\"\n\n\
backend be_default_a from routes\n    server a-1 127.0.0.1:9201\n\n\
backend be_default_c from routes\n    server c-1 127.0.0.1:9201\n    server c-2 127.0.0.1:9202\n\n\
frontend demo_app_9101\n    bind 127.0.0.1:9101\n    http-request return status 200 content-type text/plain string \"web v1\\n\"\n";

/// The incremental parse of `new` from `old`, checked against the whole parse.
fn reparse(old: &str, new: &str) -> Option<super::Config> {
    let model = parse(old).expect("the old text parses");
    let reused = parse_reusing(old, &model, new);
    if let Some(reused) = &reused {
        assert_eq!(*reused, parse_lenient(new).0, "old:\n{old}\nnew:\n{new}");
    }
    reused
}

#[test]
fn an_added_backend_reuses_the_rest() {
    let new = QUICKSTART.replace(
        "backend be_default_c",
        "backend be_default_b from routes\n    server b-1 127.0.0.1:9201\n\nbackend be_default_c",
    );
    assert!(reparse(QUICKSTART, &new).is_some());
    // And its removal again.
    assert!(reparse(&new, QUICKSTART).is_some());
}

#[test]
fn a_moved_server_and_a_changed_last_line_reuse_the_rest() {
    let new = QUICKSTART.replace("c-2 127.0.0.1:9202", "c-2 127.0.0.1:9302");
    assert!(reparse(QUICKSTART, &new).is_some());
    let new = QUICKSTART.replace("web v1", "web v1.1");
    assert!(reparse(QUICKSTART, &new).is_some());
    assert!(reparse(QUICKSTART, QUICKSTART).is_some());
}

#[test]
fn a_line_added_at_the_end_of_a_section_joins_that_section() {
    let new = QUICKSTART.replace(
        "    server a-1 127.0.0.1:9201\n",
        "    server a-1 127.0.0.1:9201\n    server a-2 127.0.0.1:9202\n",
    );
    let parsed = reparse(QUICKSTART, &new).expect("reused");
    let a = parsed
        .section(super::super::SectionKind::Backend, "be_default_a")
        .expect("backend");
    assert_eq!(a.servers().len(), 2);
}

#[test]
fn what_cannot_be_reused_is_parsed_whole() {
    // A change in the first section parses from the start, one on the first header
    // line as a whole.
    let new = QUICKSTART.replace("notice", "info");
    assert!(reparse(QUICKSTART, &new).is_some());
    let new = QUICKSTART.replacen("global", "global # first", 1);
    assert!(reparse(QUICKSTART, &new).is_none());
    // A conditional block in the old config.
    let old = QUICKSTART.replace(
        "    mode http\n    timeout",
        "    .if defined(X)\n    mode http\n    .endif\n    timeout",
    );
    let new = old.replace("9202", "9203");
    assert!(reparse(&old, &new).is_none());
    // A conditional block or a parse error in the change.
    let new = QUICKSTART.replace("    server c-1", "    .if defined(X)\n    server c-1");
    assert!(reparse(QUICKSTART, &new).is_none());
    let new = QUICKSTART.replace("    server c-1", "    server \"c-1");
    assert!(reparse(QUICKSTART, &new).is_none());
}

/// Lines a generated config is made of: headers, directives of every shape the
/// tokenizer knows, blanks and comments, and now and then a conditional or a broken
/// quote.
fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        9 => plain_line(),
        1 => Just("    .if defined(X)".to_owned()),
        1 => Just("    .endif".to_owned()),
        1 => Just("    bind \"unterminated".to_owned()),
    ]
}

/// [`line`] without conditionals and broken quotes.
fn plain_line() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0..6u32, 0..4u32).prop_map(|(b, s)| format!("    server s{s} 10.0.0.{b}:80{s}")),
        3 => (0..8u32).prop_map(|b| format!("backend be_{b} from routes")),
        2 => (0..8u32).prop_map(|b| format!("backend be_{b}")),
        1 => (0..3u32).prop_map(|f| format!("frontend fe_{f}")),
        1 => Just("defaults routes".to_owned()),
        1 => Just("defaults".to_owned()),
        1 => Just("global".to_owned()),
        1 => (0..3u32).prop_map(|l| format!("listen li_{l}")),
        2 => Just("    mode http".to_owned()),
        2 => Just("    balance roundrobin".to_owned()),
        1 => Just("    use_backend %[req.hdr(host),map(maps/hosts.map)]".to_owned()),
        1 => Just("    http-request return string \"no # route\\n\" # comment".to_owned()),
        2 => Just(String::new()),
        1 => Just("    # a comment".to_owned()),
        1 => Just("  \t ".to_owned()),
        1 => Just("    option 'a b'".to_owned()),
    ]
}

/// An edit of a list of lines.
#[derive(Clone, Debug)]
enum Edit {
    Insert(usize, Vec<String>),
    Remove(usize, usize),
    Replace(usize, String),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), prop::collection::vec(line(), 1..6))
            .prop_map(|(at, l)| Edit::Insert(at, l)),
        (any::<usize>(), 1..6usize).prop_map(|(at, n)| Edit::Remove(at, n)),
        (any::<usize>(), line()).prop_map(|(at, l)| Edit::Replace(at, l)),
    ]
}

fn apply(lines: &mut Vec<String>, edit: &Edit) {
    let len = lines.len();
    match edit {
        Edit::Insert(at, new) => {
            let at = at % (len + 1);
            lines.splice(at..at, new.iter().cloned());
        }
        Edit::Remove(at, n) if len > 0 => {
            let at = at % len;
            lines.drain(at..(at + n).min(len));
        }
        Edit::Replace(at, new) if len > 0 => lines[at % len] = new.clone(),
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// Whenever the incremental parse answers, it is the whole parse of the new text.
    #[test]
    fn incremental_equals_whole(
        body in prop_oneof![
            4 => prop::collection::vec(plain_line(), 0..40),
            1 => prop::collection::vec(line(), 0..40),
        ],
        edits in prop::collection::vec(edit(), 1..4),
        final_newline in any::<bool>(),
    ) {
        let mut lines = vec!["global".to_owned(), "    maxconn 10".to_owned()];
        lines.extend(body);
        let mut old = lines.join("\n");
        old.push('\n');
        let Ok(model) = parse(&old) else { return Ok(()) };
        for edit in &edits {
            apply(&mut lines, edit);
        }
        let mut new = lines.join("\n");
        if final_newline {
            new.push('\n');
        }
        if let Some(reused) = parse_reusing(&old, &model, &new) {
            prop_assert_eq!(reused, parse_lenient(&new).0);
        }
    }
}
