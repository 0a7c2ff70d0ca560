//! A first guess at the culprits: the changed objects whose new values appear in the
//! error.
//!
//! HAProxy and the validator quote what they refuse: "invalid address: '300.1.2.3'",
//! the rendered line with the server's name. A value that a change introduced (a
//! string or number in the new version that the last good version does not have) and
//! that the error quotes points at that change. The search
//! ([`search_with_suspects`](super::search::search_with_suspects)) tries the other
//! changes first, so a right guess isolates one bad object among many in two probes;
//! a wrong guess costs one probe and the search goes on by halves.
//!
//! Only values of at least [`MIN_VALUE_LEN`] characters count (a `1` or `80` is in
//! every error), and each change scores the total length of its new values the error
//! quotes: the suspects are the changes with the highest score. A guess that takes in
//! half the changes or more is no guess (every change moved to the same port, say)
//! and the search ignores it.

use std::collections::BTreeSet;

use hapwright_eventbus::model::Diagnostic;
use serde_json::Value;

use super::changes::ChangeSet;

/// Shortest value that counts as quoted by an error.
pub const MIN_VALUE_LEN: usize = 3;

/// The indexes of the changes in `set` that `errors` most likely come from,
/// ascending; empty when nothing points at any change.
pub fn suspects(set: &ChangeSet, errors: &[Diagnostic]) -> Vec<usize> {
    let text = error_text(errors);
    if text.is_empty() {
        return Vec::new();
    }
    let scores: Vec<usize> = set
        .changes()
        .iter()
        .map(|change| {
            let Some(new) = &change.new else {
                return 0;
            };
            let old = change
                .old
                .as_ref()
                .map(|old| leaves(&old.object().parse()))
                .unwrap_or_default();
            leaves(&new.object().parse())
                .difference(&old)
                .filter(|value| value.len() >= MIN_VALUE_LEN && text.contains(value.as_str()))
                .map(String::len)
                .sum()
        })
        .collect();
    let best = scores.iter().copied().max().unwrap_or(0);
    if best == 0 {
        return Vec::new();
    }
    scores
        .iter()
        .enumerate()
        .filter(|(_, score)| **score == best)
        .map(|(index, _)| index)
        .collect()
}

/// Everything the errors say: messages and the offending lines.
fn error_text(errors: &[Diagnostic]) -> String {
    let mut text = String::new();
    for error in errors {
        text.push_str(&error.message);
        text.push('\n');
        if let Some(line) = &error.source_line {
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

/// Every string and number in `value`, as text.
fn leaves(value: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::String(s) => {
                out.insert(s.clone());
            }
            Value::Number(n) => {
                out.insert(n.to_string());
            }
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.values()),
            Value::Bool(_) | Value::Null => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hapwright_eventbus::model::{ObjectKey, ResourceSnapshot};
    use serde_json::json;

    use super::*;
    use crate::quarantine::changes::Snapshots;

    fn slice(name: &str, address: &str, port: u16) -> Value {
        json!({
            "metadata": {"namespace": "default", "name": name},
            "endpoints": [{"addresses": [address]}],
            "ports": [{"port": port}],
        })
    }

    fn snapshots(objects: &[Value]) -> Snapshots {
        let mut snapshot = ResourceSnapshot::new(Vec::new());
        for object in objects {
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            snapshot.upsert(ObjectKey::new("default", name), object);
        }
        Snapshots::from([(Arc::<str>::from("endpoints"), Arc::new(snapshot))])
    }

    fn set(before: &[Value], after: &[Value]) -> ChangeSet {
        ChangeSet::between(&snapshots(before), &snapshots(after))
    }

    fn names(set: &ChangeSet, indexes: &[usize]) -> Vec<String> {
        indexes
            .iter()
            .map(|i| set.changes()[*i].key.name.clone())
            .collect()
    }

    #[test]
    fn the_change_whose_new_value_the_error_quotes_is_the_suspect() {
        let before: Vec<Value> = (0..10)
            .map(|i| slice(&format!("s{i}"), "127.0.0.1", 8080))
            .collect();
        let mut after: Vec<Value> = (0..10)
            .map(|i| slice(&format!("s{i}"), "127.0.0.1", 8081))
            .collect();
        after[7] = slice("s7", "300.1.2.3", 8081);
        let set = set(&before, &after);
        let errors = [Diagnostic::error(
            "parsing [haproxy.cfg:40] : 'server srv1' : invalid address: '300.1.2.3:8081'",
        )];
        assert_eq!(names(&set, &suspects(&set, &errors)), ["s7"]);
    }

    #[test]
    fn a_value_every_change_shares_is_no_guess() {
        let before: Vec<Value> = (0..4)
            .map(|i| slice(&format!("s{i}"), "127.0.0.1", 8080))
            .collect();
        let after: Vec<Value> = (0..4)
            .map(|i| slice(&format!("s{i}"), "127.0.0.1", 8081))
            .collect();
        let set = set(&before, &after);
        let errors = [Diagnostic::error("port 8081 is refused")];
        // All four tie: the search ignores a guess of half the changes or more.
        assert_eq!(suspects(&set, &errors).len(), 4);
    }

    #[test]
    fn nothing_quoted_or_values_too_short_give_no_suspect() {
        let before = [slice("s0", "127.0.0.1", 80)];
        let after = [slice("s0", "127.0.0.1", 81)];
        let set = set(&before, &after);
        assert!(suspects(&set, &[Diagnostic::error("port 81 refused")]).is_empty());
        assert!(suspects(&set, &[Diagnostic::error("template bug")]).is_empty());
        assert!(suspects(&set, &[]).is_empty());
    }

    #[test]
    fn the_offending_line_counts_too() {
        let before = [slice("a", "127.0.0.1", 80), slice("b", "127.0.0.1", 80)];
        let after = [slice("a", "10.0.0.77", 80), slice("b", "10.0.0.88", 80)];
        let set = set(&before, &after);
        let mut error = Diagnostic::error("invalid server line");
        error.source_line = Some("    server srv1 10.0.0.88:80 check".to_owned());
        assert_eq!(names(&set, &suspects(&set, &[error])), ["b"]);
    }
}
