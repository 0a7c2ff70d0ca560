//! Excerpts of a rendered file for assertion messages: numbered lines around a line,
//! with the lines of interest marked, and the line closest to a pattern that does not
//! match.

use std::fmt::Write as _;

use hapwright_reconciler::config::RENDERING_ERROR_TARGET;

/// Lines shown on each side of the line an excerpt centres on.
pub(super) const EXCERPT_RADIUS: usize = 2;
/// Lines an excerpt shows when there is no line to centre on.
pub(super) const EXCERPT_HEAD: usize = 10;

/// The lines of a text; a final newline ends the last line rather than starting an
/// empty one.
pub(super) fn lines_of(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.split('\n').collect();
    if lines.len() > 1 && lines.last() == Some(&"") {
        lines.pop();
    }
    lines
}

pub(super) fn plural(count: usize, word: &str) -> String {
    if count == 1 {
        format!("1 {word}")
    } else {
        format!("{count} {word}s")
    }
}

pub(super) fn indent(text: &str, by: usize) -> String {
    let pad = " ".repeat(by);
    text.lines()
        .map(|line| format!("{pad}{line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The line numbers within [`EXCERPT_RADIUS`] of `line`, clipped to the text.
pub(super) fn around(line: usize, text: &str) -> Vec<usize> {
    let total = lines_of(text).len();
    (line.saturating_sub(EXCERPT_RADIUS).max(1)..=(line + EXCERPT_RADIUS).min(total)).collect()
}

/// The lines of `text` around each of `centres` (merged), with line numbers and the
/// centres marked.
pub(super) fn excerpt(target: &str, text: &str, centres: &[usize]) -> String {
    let mut lines: Vec<usize> = centres.iter().flat_map(|&c| around(c, text)).collect();
    lines.sort_unstable();
    lines.dedup();
    format!("{target}:\n{}", numbered(text, &lines, centres))
}

/// Numbered lines, `>` marking `marked` and `...` between gaps.
pub(super) fn numbered(text: &str, lines: &[usize], marked: &[usize]) -> String {
    let all = lines_of(text);
    let width = lines.iter().max().map_or(1, |l| l.to_string().len());
    let mut out = String::new();
    let mut last = None;
    for &line in lines {
        let Some(content) = all.get(line.wrapping_sub(1)) else {
            continue;
        };
        if last.is_some_and(|last| line > last + 1) {
            let _ = writeln!(out, "      {:>width$} |", "...");
        }
        let mark = if marked.contains(&line) { '>' } else { ' ' };
        let gap = if content.is_empty() { "" } else { " " };
        let _ = writeln!(out, "    {mark} {line:>width$} |{gap}{content}");
        last = Some(line);
    }
    out
}

/// For a pattern that does not match: the lines around the line that comes closest to
/// it, or the first lines when no line shares anything with it.
pub(super) fn closest_excerpt(target: &str, text: &str, pattern: &str) -> String {
    if text.is_empty() {
        // `describe_target` already says so for `rendering_error`.
        return if target == RENDERING_ERROR_TARGET {
            String::new()
        } else {
            format!("{target} is empty")
        };
    }
    match closest_line(text, pattern) {
        Some(line) => format!(
            "closest line, {line}, in {}",
            excerpt(target, text, &[line])
        ),
        None => {
            let total = lines_of(text).len();
            let shown: Vec<usize> = (1..=total.min(EXCERPT_HEAD)).collect();
            format!(
                "{target} (first {} of {total} lines):\n{}",
                shown.len(),
                numbered(text, &shown, &[])
            )
        }
    }
}

/// The literal words of a regex: runs of letters, digits and `_` outside escapes, at
/// least three characters long.
pub(super) fn literals(pattern: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            current.push(c.to_ascii_lowercase());
            continue;
        }
        if current.chars().count() >= 3 {
            words.push(std::mem::take(&mut current));
        }
        current.clear();
        if c == '\\' {
            chars.next();
        }
    }
    if current.chars().count() >= 3 {
        words.push(current);
    }
    words
}

/// The line sharing the most with the pattern's literal words (the longest prefix of
/// each word found in the line, summed); the first such line on ties.
pub(super) fn closest_line(text: &str, pattern: &str) -> Option<usize> {
    let words = literals(pattern);
    let mut best: Option<(usize, usize)> = None;
    for (index, line) in text.lines().enumerate() {
        let lower = line.to_lowercase();
        let score: usize = words
            .iter()
            .map(|word| {
                let chars: Vec<(usize, char)> = word.char_indices().collect();
                (3..=chars.len())
                    .rev()
                    .find(|&n| {
                        let end = chars.get(n).map_or(word.len(), |(i, _)| *i);
                        lower.contains(&word[..end])
                    })
                    .unwrap_or(0)
            })
            .sum();
        if score > 0 && best.is_none_or(|(_, top)| score > top) {
            best = Some((index + 1, score));
        }
    }
    best.map(|(line, _)| line)
}
