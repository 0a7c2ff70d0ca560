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

/// [`plain_line`] and the lines the phase-1 checks look at across sections: static
/// `use_backend`/`default_backend` targets, profiles, names shared by proxies, and
/// references to rendered files and to files that may not be rendered.
fn checked_line() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => plain_line(),
        2 => (0..8u32).prop_map(|b| format!("    use_backend be_{b}")),
        1 => (0..8u32).prop_map(|b| format!("    default_backend be_{b}")),
        1 => (0..3u32).prop_map(|f| format!("    use_backend fe_{f}")),
        1 => (0..3u32).prop_map(|l| format!("backend li_{l}")),
        1 => (0..3u32).prop_map(|f| format!("listen fe_{f}")),
        1 => (0..8u32).prop_map(|b| format!("backend be_{b} from other")),
        1 => Just("defaults other".to_owned()),
        1 => Just("    http-request set-var(txn.x) str(a),map(maps/a.map)".to_owned()),
        1 => Just("    http-request set-var(txn.y) str(b),map(./maps/b.map)".to_owned()),
        1 => Just("    bind :443 ssl crt certs/".to_owned()),
    ]
}

/// A set of rendered files, from bits.
fn rendered_paths(bits: u8) -> super::super::FileNames {
    super::super::FileNames::from_paths(
        ["maps/a.map", "maps/b.map", "certs/site.pem"]
            .iter()
            .enumerate()
            .filter(|(i, _)| bits & (1 << i) != 0)
            .map(|(_, path)| *path),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Phase 1 from the previous text that passed it (parsing and checking only what
    /// changed when it can) gives exactly the whole phase 1's model and diagnostics.
    #[test]
    fn phase1_reusing_equals_whole(
        body in prop::collection::vec(checked_line(), 0..40),
        edits in prop::collection::vec(
            prop_oneof![
                4 => edit(),
                3 => (any::<usize>(), prop::collection::vec(checked_line(), 1..4))
                    .prop_map(|(at, l)| Edit::Insert(at, l)),
                2 => (any::<usize>(), checked_line()).prop_map(|(at, l)| Edit::Replace(at, l)),
            ],
            1..4,
        ),
        old_files in 0..8u8,
        new_files in prop_oneof![3 => Just(None), 1 => (0..8u8).prop_map(Some)],
    ) {
        use super::super::{Passed, phase1_parsed, phase1_reusing};
        let mut lines = vec![
            "global".to_owned(),
            "    maxconn 10".to_owned(),
            "defaults routes".to_owned(),
            "    mode http".to_owned(),
        ];
        lines.extend(body);
        let old_paths = rendered_paths(old_files);
        // Only a text that passed phase 1 is a starting point: the lines phase 1
        // reports are left out until it passes.
        let mut old = String::new();
        let mut passed = None;
        for _ in 0..20 {
            old = lines.join("\n");
            old.push('\n');
            let (model, found) = phase1_parsed(&old, &old_paths);
            let bad: std::collections::BTreeSet<usize> = found
                .iter()
                .filter(|d| d.severity == hapwright_eventbus::model::Severity::Error)
                .filter_map(|d| d.location.as_ref()?.line)
                .map(|line| line as usize - 1)
                .collect();
            if bad.is_empty() {
                passed = Some(model);
                break;
            }
            lines = lines
                .into_iter()
                .enumerate()
                .filter(|(index, _)| !bad.contains(index))
                .map(|(_, line)| line)
                .collect();
        }
        let Some(model) = passed else { return Ok(()) };
        for edit in &edits {
            apply(&mut lines, edit);
        }
        let mut new = lines.join("\n");
        new.push('\n');
        let new_paths = new_files.map_or_else(|| old_paths.clone(), rendered_paths);
        let previous = Passed { text: &old, model: &model, rendered_paths: &old_paths };
        let (reused, diagnostics) = phase1_reusing(Some(previous), &new, &new_paths);
        let (whole, whole_diagnostics) = phase1_parsed(&new, &new_paths);
        prop_assert_eq!(reused, whole);
        prop_assert_eq!(diagnostics, whole_diagnostics);
    }
}

#[test]
fn a_change_is_checked_against_the_whole_model() {
    use super::super::{Passed, phase1_parsed, phase1_reusing};
    let paths = super::super::FileNames::from_paths(["maps/hosts.map"]);
    let (model, found) = phase1_parsed(QUICKSTART, &paths);
    assert!(found.is_empty(), "{found:?}");
    let previous = Passed {
        text: QUICKSTART,
        model: &model,
        rendered_paths: &paths,
    };
    let errors = |new: &str| {
        let (_, diagnostics) = phase1_reusing(Some(previous), new, &paths);
        assert_eq!(diagnostics, phase1_parsed(new, &paths).1);
        diagnostics
            .into_iter()
            .map(|d| d.message)
            .collect::<Vec<_>>()
    };
    // A clean add, checked from its own section.
    let added = QUICKSTART.replace(
        "backend be_default_c",
        "backend be_default_b from routes\n    server b-1 127.0.0.1:9201\n\nbackend be_default_c",
    );
    assert!(errors(&added).is_empty());
    // An added backend named like one outside the change.
    let clash = QUICKSTART.replace(
        "backend be_default_c",
        "backend be_default_a from routes\n    server b-1 127.0.0.1:9201\n\nbackend be_default_c",
    );
    assert_eq!(errors(&clash).len(), 1, "the duplicate is reported");
    // A removed backend a static target still names.
    let targeted = QUICKSTART.replace(
        "default_backend be_no_route",
        "default_backend be_default_a",
    );
    let (model, _) = phase1_parsed(&targeted, &paths);
    let previous = Passed {
        text: &targeted,
        model: &model,
        rendered_paths: &paths,
    };
    let removed = targeted.replace(
        "backend be_default_a from routes\n    server a-1 127.0.0.1:9201\n\n",
        "",
    );
    let (_, diagnostics) = phase1_reusing(Some(previous), &removed, &paths);
    assert_eq!(diagnostics, phase1_parsed(&removed, &paths).1);
    assert_eq!(diagnostics.len(), 1, "the missing target is reported");
    // An added backend with a profile that does not exist, or a file not rendered.
    let profile = added.replace("be_default_b from routes", "be_default_b from rotues");
    assert_eq!(errors(&profile).len(), 1);
    let file = added.replace(
        "    server b-1 127.0.0.1:9201\n",
        "    server b-1 127.0.0.1:9201\n    http-request set-var(txn.x) str(a),map(maps/missing.map)\n",
    );
    assert_eq!(errors(&file).len(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// A model that shares the unchanged sections of the previous one is planned,
    /// compared by the equivalence rule and split into added and removed backends
    /// exactly as the whole parse of the same text is.
    #[test]
    fn shared_sections_plan_and_compare_as_whole_ones(
        body in prop::collection::vec(plain_line(), 0..40),
        edits in prop::collection::vec(edit(), 1..4),
    ) {
        use std::sync::Arc;
        use hapwright_eventbus::model::{RenderedConfig, SourceMap};
        use crate::component::validator::equivalence::{self, Baseline};
        use crate::haproxy::backends::{self, Capability};
        use crate::haproxy::plan::{self, PlanOptions};
        let mut lines = vec![
            "global".to_owned(),
            "    maxconn 10".to_owned(),
            "defaults routes".to_owned(),
            "    mode http".to_owned(),
        ];
        lines.extend(body);
        let mut old = lines.join("\n");
        old.push('\n');
        let Ok(model) = parse(&old) else { return Ok(()) };
        for edit in &edits {
            apply(&mut lines, edit);
        }
        let mut new = lines.join("\n");
        new.push('\n');
        let Some(shared) = parse_reusing(&old, &model, &new) else { return Ok(()) };
        let whole = parse_lenient(&new).0;
        let render = |text: &str| {
            Arc::new(RenderedConfig::new(
                text.to_owned(),
                Default::default(),
                Default::default(),
                Default::default(),
                SourceMap::default(),
            ))
        };
        let (running, desired) = (render(&old), render(&new));
        for capability in [Capability::On, Capability::Off] {
            let options = PlanOptions { dynamic_backends: capability };
            prop_assert_eq!(
                plan::plan_with(&running, &model, &desired, &shared, &options),
                plan::plan_with(&running, &model, &desired, &whole, &options)
            );
        }
        let baseline = Baseline { rendered: Arc::clone(&running), model: Arc::new(model.clone()) };
        prop_assert_eq!(
            equivalence::compare(&baseline, &desired, &shared),
            equivalence::compare(&baseline, &desired, &whole)
        );
        let by_key = |(added, removed): (Vec<&super::Section>, Vec<&super::Section>)| {
            (added.into_iter().cloned().collect::<Vec<_>>(), removed.into_iter().cloned().collect::<Vec<_>>())
        };
        prop_assert_eq!(
            by_key(backends::added_and_removed(&model, &shared)),
            by_key(backends::added_and_removed_indexed(&model, &whole))
        );
    }
}
