//! Phase 1 parsing only what changed: a render that differs from the last one phase 1
//! passed in a few sections (a route added, an endpoint moved) is parsed from the
//! first section its change may touch to the last, and the sections before and after
//! are taken from the previous model (the ones after moved by the number of lines the
//! change added or removed).
//!
//! The result is exactly what [`parse_lenient`] gives for the whole text (the
//! differential tests hold it to that); where that cannot be told cheaply,
//! [`parse_reusing`] answers `None` and the caller parses the whole text:
//!
//! - the previous model holds a `.if`/`.notice`-style line or a preamble (a line's
//!   meaning then depends on lines before it);
//! - the change reaches the first header line (nothing before it to start from);
//! - the changed part has a parse error or a `.`-line of its own (errors are then
//!   reported by the whole parse, in its order).
//!
//! Why this is exact otherwise: HAProxy's line parser reads one line at a time, and a
//! line either opens a section (a header keyword) or adds a directive to the section
//! opened last. Every line before the first changed one is the same in both texts, so
//! every section that ends before it is the same; the section that holds it starts on
//! an unchanged header line and is parsed again with everything up to the first
//! header in the unchanged end of the text, whose sections are again the same, only
//! on other line numbers.

use std::ops::Range;
use std::sync::Arc;

use super::{Config, Section, parse_lenient};

/// Parses `text`, reusing the sections of `old`, the model of `old_text` (which must be
/// `parse_lenient(old_text)` and have parsed without errors). `None` when the reuse
/// cannot be shown to give the whole parse's result (module docs): parse `text`
/// whole then.
pub fn parse_reusing(old_text: &str, old: &Config, text: &str) -> Option<Config> {
    reparse(old_text, old, text).map(|reparsed| reparsed.config)
}

/// A model [`reparse`] built from the previous one.
#[derive(Debug)]
pub(crate) struct Reparsed {
    /// The model of the new text ([`parse_reusing`]'s answer).
    pub config: Config,
    /// The sections of the old model that were parsed again (every other one is in
    /// `config`, shared, before or after `new_changed`).
    pub old_changed: Range<usize>,
    /// The sections of `config` parsed from the new text; every other one is a
    /// section of the old model, shared when it did not move and a moved copy when
    /// it did.
    pub new_changed: Range<usize>,
}

/// [`parse_reusing`], also telling which sections were parsed again.
pub(crate) fn reparse(old_text: &str, old: &Config, text: &str) -> Option<Reparsed> {
    if !reusable(old) {
        return None;
    }
    let (a, b) = (old_text.as_bytes(), text.as_bytes());
    let prefix = common_prefix(a, b);
    let suffix = common_suffix(a, b, a.len().min(b.len()) - prefix);
    // Every line before `first_changed` is the same in both texts.
    let first_changed = line_number(&a[..prefix])?;
    // The last section starting before that line is parsed again (its end may have
    // changed); every one before it is unchanged.
    let start = old
        .sections
        .partition_point(|s| s.line < first_changed)
        .checked_sub(1)?;
    let start_line = old.sections[start].line;
    let start_at = back_lines(a, prefix, first_changed - start_line);

    // The unchanged end: from the first line that starts inside the common suffix.
    let (tail_old, tail_new) = (a.len() - suffix, b.len() - suffix);
    let (end, reused, shift) = match a[tail_old..].iter().position(|&c| c == b'\n') {
        Some(i) if tail_old + i + 1 < a.len() => {
            let (tail_old, tail_new) = (tail_old + i + 1, tail_new + i + 1);
            let old_line = first_changed.checked_add(newlines(&a[prefix..tail_old])?)?;
            let new_line = first_changed.checked_add(newlines(&b[prefix..tail_new])?)?;
            let first_kept = old
                .sections
                .partition_point(|s| s.line < old_line)
                .max(start + 1);
            match old.sections.get(first_kept) {
                Some(kept) => {
                    let header_at = forward_lines(a, tail_old, kept.line.checked_sub(old_line)?)?;
                    (
                        tail_new + (header_at - tail_old),
                        &old.sections[first_kept..],
                        i64::from(new_line) - i64::from(old_line),
                    )
                }
                None => (b.len(), &[][..], 0),
            }
        }
        _ => (b.len(), &[][..], 0),
    };
    let middle = text.get(start_at..end)?;
    let (parsed, errors) = parse_lenient(middle);
    if !errors.is_empty()
        || !reusable(&parsed)
        || parsed.sections.first().map(|s| s.line) != Some(1)
    {
        return None;
    }
    let old_changed = start..old.sections.len() - reused.len();
    let new_changed = start..start + parsed.sections.len();
    let mut sections = Vec::with_capacity(start + parsed.sections.len() + reused.len());
    // The unchanged sections before the change are shared, not copied.
    sections.extend(old.sections[..start].iter().cloned());
    for section in parsed.sections {
        sections.push(shifted(section, i64::from(start_line) - 1)?);
    }
    for section in reused {
        sections.push(shifted(Arc::clone(section), shift)?);
    }
    Some(Reparsed {
        config: Config { sections },
        old_changed,
        new_changed,
    })
}

/// Whether every line of `config` means the same wherever the text around it
/// changes: no preamble and no `.`-line (conditionals nest across sections).
fn reusable(config: &Config) -> bool {
    config.sections.iter().all(|section| {
        section.line > 0
            && section
                .directives
                .iter()
                .all(|d| !d.keyword.starts_with('.'))
    })
}

/// How many leading bytes `a` and `b` share.
pub(crate) fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const CHUNK: usize = 64;
    let mut at = 0;
    while at + CHUNK <= a.len().min(b.len()) && a[at..at + CHUNK] == b[at..at + CHUNK] {
        at += CHUNK;
    }
    at + a[at..]
        .iter()
        .zip(&b[at..])
        .take_while(|(x, y)| x == y)
        .count()
}

/// The whole lines of `old` and of `new` around the bytes that differ between them
/// (past the start and the end the two share); whole lines keep them on character
/// boundaries.
pub(crate) fn changed_lines<'a>(old: &'a str, new: &'a str) -> (&'a str, &'a str) {
    let (a, b) = (old.as_bytes(), new.as_bytes());
    let prefix = common_prefix(a, b);
    let suffix = common_suffix(a, b, a.len().min(b.len()) - prefix);
    fn around(text: &str, prefix: usize, suffix: usize) -> &str {
        let bytes = text.as_bytes();
        let start = memchr::memrchr(b'\n', &bytes[..prefix]).map_or(0, |at| at + 1);
        let end = text.len() - suffix;
        let end = memchr::memchr(b'\n', &bytes[end..]).map_or(text.len(), |at| end + at);
        text.get(start..end).unwrap_or_default()
    }
    (around(old, prefix, suffix), around(new, prefix, suffix))
}

/// The last version of each of a few named texts (maps by path), with what was
/// found of it: a check or a count of the next version can then read only the
/// [`changed_lines`] between the two. At most `LIMIT` names are kept, the one stored
/// longest ago forgotten first.
pub(crate) struct LastVersions<T, const LIMIT: usize>(std::sync::Mutex<Vec<LastVersion<T>>>);

/// A name, its last text and what was found of it.
type LastVersion<T> = (Box<str>, Arc<str>, T);

impl<T: Clone, const LIMIT: usize> LastVersions<T, LIMIT> {
    /// None kept yet.
    pub(crate) const fn new() -> Self {
        Self(std::sync::Mutex::new(Vec::new()))
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<LastVersion<T>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The last text kept for `name`, with what was found of it.
    pub(crate) fn get(&self, name: &str) -> Option<(Arc<str>, T)> {
        self.kept()
            .iter()
            .find(|(kept, ..)| **kept == *name)
            .map(|(_, text, found)| (Arc::clone(text), found.clone()))
    }

    /// Keeps `text` as the last version of `name`, with what was found of it.
    pub(crate) fn put(&self, name: &str, text: &Arc<str>, found: T) {
        let mut kept = self.kept();
        match kept.iter_mut().find(|(kept, ..)| **kept == *name) {
            Some(entry) => *entry = (Box::from(name), Arc::clone(text), found),
            None => {
                if kept.len() >= LIMIT {
                    kept.remove(0);
                }
                kept.push((Box::from(name), Arc::clone(text), found));
            }
        }
    }
}

/// How many trailing bytes `a` and `b` share, at most `limit`.
pub(crate) fn common_suffix(a: &[u8], b: &[u8], limit: usize) -> usize {
    const CHUNK: usize = 64;
    let mut n = 0;
    while n + CHUNK <= limit
        && a[a.len() - n - CHUNK..a.len() - n] == b[b.len() - n - CHUNK..b.len() - n]
    {
        n += CHUNK;
    }
    n + a[..a.len() - n]
        .iter()
        .rev()
        .zip(b[..b.len() - n].iter().rev())
        .take(limit - n)
        .take_while(|(x, y)| x == y)
        .count()
}

fn newlines(bytes: &[u8]) -> Option<u32> {
    u32::try_from(bytes.iter().filter(|&&c| c == b'\n').count()).ok()
}

/// The 1-based number of the line that starts after `before`.
fn line_number(before: &[u8]) -> Option<u32> {
    newlines(before)?.checked_add(1)
}

/// The start of the line `lines` lines before the one holding byte `at`.
fn back_lines(text: &[u8], at: usize, lines: u32) -> usize {
    let line_start = |end: usize| {
        text[..end]
            .iter()
            .rposition(|&c| c == b'\n')
            .map_or(0, |i| i + 1)
    };
    let mut start = line_start(at);
    for _ in 0..lines {
        start = line_start(start.saturating_sub(1));
    }
    start
}

/// The start of the line `lines` lines after the line starting at `at`.
fn forward_lines(text: &[u8], mut at: usize, lines: u32) -> Option<usize> {
    for _ in 0..lines {
        at += text.get(at..)?.iter().position(|&c| c == b'\n')? + 1;
    }
    Some(at)
}

/// `section` with every line number moved by `by`: the same section when `by` is 0,
/// else a copy (or the section itself, when nothing else holds it).
fn shifted(mut section: Arc<Section>, by: i64) -> Option<Arc<Section>> {
    if by != 0 {
        let shift = |line: u32| u32::try_from(i64::from(line) + by).ok();
        let section = Arc::make_mut(&mut section);
        section.line = shift(section.line)?;
        for directive in &mut section.directives {
            directive.line = shift(directive.line)?;
        }
    }
    Some(section)
}

#[cfg(test)]
mod tests;
