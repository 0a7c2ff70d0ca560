//! Static checks when the config loads: references to watched resources, literal
//! `include`/`import`/`from`/`extends` targets, literal `render_glob` patterns, and
//! cycles among templates.

use std::collections::{BTreeMap, BTreeSet};

use hapwright_eventbus::model::Diagnostic;

use super::Entry;
use super::functions::compile_glob;
use super::scan::ReferenceKind;

/// Runs every static check over the instrumented templates.
pub(crate) fn check(entries: &[Entry], watched: &BTreeSet<&str>) -> Vec<Diagnostic> {
    let names: BTreeSet<&str> = entries.iter().map(|e| e.name.as_ref()).collect();
    let snippets: Vec<&str> = entries
        .iter()
        .filter(|e| e.is_snippet)
        .map(|e| e.name.as_ref())
        .collect();
    let mut diagnostics = Vec::new();
    // Edges of the reference graph: template → (target, offset in the template).
    let mut edges: BTreeMap<&str, Vec<(String, usize)>> = BTreeMap::new();

    for entry in entries {
        for error in &entry.instrumented.errors {
            diagnostics.push(entry.diagnostic_at(error.message.clone(), error.offset));
        }
        let out = edges.entry(entry.name.as_ref()).or_default();
        for reference in &entry.instrumented.references {
            match &reference.kind {
                ReferenceKind::Resource(resource) => {
                    if !watched.contains(resource.as_str()) {
                        let known: Vec<&str> = watched.iter().copied().collect();
                        let mut message = format!(
                            "resources.{resource} is not a watched resource (watched: {})",
                            if known.is_empty() {
                                "none".to_owned()
                            } else {
                                known.join(", ")
                            }
                        );
                        if let Some(close) = closest(resource, known.iter().copied()) {
                            message.push_str(&format!("; did you mean resources.{close}?"));
                        }
                        diagnostics.push(entry.diagnostic_at(message, reference.offset));
                    }
                }
                ReferenceKind::Template {
                    keyword,
                    names: targets,
                    ignore_missing,
                } => {
                    let existing: Vec<&String> = targets
                        .iter()
                        .filter(|t| names.contains(t.as_str()))
                        .collect();
                    if existing.is_empty() && !ignore_missing {
                        let what = match targets.as_slice() {
                            [one] => format!("`{one}`"),
                            several => format!(
                                "any of {}",
                                several
                                    .iter()
                                    .map(|t| format!("`{t}`"))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        };
                        let mut message = format!("{keyword} of unknown snippet {what}");
                        if let Some(close) = targets
                            .first()
                            .and_then(|t| closest(t, snippets.iter().copied()))
                        {
                            message.push_str(&format!("; did you mean `{close}`?"));
                        }
                        diagnostics.push(entry.diagnostic_at(message, reference.offset));
                    }
                    // `include [a, b]` renders only the first that exists.
                    if let Some(first) = existing.first() {
                        out.push(((*first).clone(), reference.offset));
                    }
                }
                ReferenceKind::Glob(pattern) => match compile_glob(pattern, "render_glob") {
                    Ok(matcher) => {
                        for snippet in &snippets {
                            if matcher.is_match(snippet) {
                                out.push(((*snippet).to_owned(), reference.offset));
                            }
                        }
                    }
                    Err(error) => diagnostics.push(entry.diagnostic_at(
                        error.detail().unwrap_or("invalid glob").to_owned(),
                        reference.offset,
                    )),
                },
            }
        }
    }

    diagnostics.extend(cycles(entries, &edges));
    diagnostics
}

/// Finds reference cycles by depth-first search; each distinct cycle is reported
/// once, at the reference that closes it.
fn cycles(entries: &[Entry], edges: &BTreeMap<&str, Vec<(String, usize)>>) -> Vec<Diagnostic> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Active,
        Done,
    }
    let by_name: BTreeMap<&str, &Entry> = entries.iter().map(|e| (e.name.as_ref(), e)).collect();
    let mut marks: BTreeMap<&str, Mark> = entries
        .iter()
        .map(|e| (e.name.as_ref(), Mark::New))
        .collect();
    let mut reported: BTreeSet<BTreeSet<String>> = BTreeSet::new();
    let mut diagnostics = Vec::new();

    for root in entries.iter().map(|e| e.name.as_ref()) {
        if marks[root] != Mark::New {
            continue;
        }
        // Iterative DFS: (node, index of the next edge to follow).
        let mut stack: Vec<(&str, usize)> = vec![(root, 0)];
        marks.insert(root, Mark::Active);
        while let Some((node, next)) = stack.last().copied() {
            let out = edges.get(node).map(Vec::as_slice).unwrap_or(&[]);
            let Some((target, offset)) = out.get(next) else {
                marks.insert(node, Mark::Done);
                stack.pop();
                continue;
            };
            if let Some(top) = stack.last_mut() {
                top.1 += 1;
            }
            let Some((target, _)) = by_name.get_key_value(target.as_str()) else {
                continue;
            };
            match marks[target] {
                Mark::New => {
                    marks.insert(target, Mark::Active);
                    stack.push((target, 0));
                }
                Mark::Active => {
                    let start = stack.iter().position(|(n, _)| n == target).unwrap_or(0);
                    let mut path: Vec<String> = stack[start..]
                        .iter()
                        .map(|(n, _)| (*n).to_owned())
                        .collect();
                    let members: BTreeSet<String> = path.iter().cloned().collect();
                    if reported.insert(members) {
                        path.push((*target).to_owned());
                        let message = if path.len() == 2 {
                            format!("`{}` includes itself", path[0])
                        } else {
                            format!("include cycle: {}", path.join(" → "))
                        };
                        diagnostics.push(by_name[node].diagnostic_at(message, *offset));
                    }
                }
                Mark::Done => {}
            }
        }
    }
    diagnostics
}

/// The candidate closest to `word` by edit distance, if it is close enough to be a
/// likely typo.
pub(crate) fn closest<'a>(
    word: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .map(|c| (levenshtein(word, c), c))
        .filter(|(distance, c)| *distance <= (c.len().max(word.len()) / 3).max(1))
        .min()
        .map(|(_, c)| c)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let current = row[j + 1];
            row[j + 1] = if ca == *cb {
                previous
            } else {
                1 + previous.min(row[j]).min(row[j + 1])
            };
            previous = current;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let names = ["services", "endpoints", "ingresses"];
        assert_eq!(closest("servics", names.iter().copied()), Some("services"));
        assert_eq!(
            closest("endpoint", names.iter().copied()),
            Some("endpoints")
        );
        assert_eq!(closest("pods", names.iter().copied()), None);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
    }
}
