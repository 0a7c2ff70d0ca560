//! The source map: for every rendered line, the template or snippet line that
//! produced it.
//!
//! # Approach: line markers
//!
//! When the config loads, every template is *instrumented* (see the `scan` module): at the
//! first piece of content of each template line — the first non-blank character of
//! template data, or a `{{ }}` tag — an invisible marker is inserted that names the
//! template and the line. Markers are template data, so minijinja emits them exactly
//! when it emits that line's content: once per loop iteration, inside `include`d
//! snippets and `render_glob` snippets with *their* names and lines, never for a
//! branch that was not taken. After rendering, `strip` removes the markers in one
//! pass and records, for each output line, the first marker found on it.
//!
//! A marker is a run of Unicode *noncharacters* (U+FDD0–U+FDEF), which the Unicode
//! standard reserves for exactly this kind of internal use and which never appear in
//! real configuration data: `U+FDD0`, the marker's index in hexadecimal with the
//! digits encoded as U+FDE0–U+FDEF, then `U+FDD1`. Anything that is not a complete,
//! known marker is left in the output untouched.
//!
//! Why markers rather than minijinja's instruction line table: the engine does not
//! expose the current line while writing output, and markers follow includes, loops,
//! macros called from other lines and whitespace control for free.
//!
//! Rules that keep the rendered bytes identical to an uninstrumented render:
//!
//! - markers never go into whitespace that `trimBlocks`, `lstripBlocks` or `-`
//!   whitespace control could strip, nor before a `{{-` tag (which strips backwards);
//! - no markers inside `{% set %}...{% endset %}`, `{% macro %}` and `{% call %}`
//!   bodies, whose output becomes a value the template may compare or measure.
//!
//! Lines without a marker of their own (the second line of a multi-line value, the
//! output of a macro) take the origin of the nearest marker before them, which is
//! the expression or call that produced them; blank lines have no origin.

use std::sync::Arc;

use hapwright_eventbus::model::LineOrigin;

use super::escape::{self, END_BYTES, Escaping, Refusal, START_BYTES};
use super::words::equal_bytes;

const START: char = '\u{FDD0}';
const END: char = '\u{FDD1}';
const DIGIT_BASE: u32 = 0xFDE0;
/// UTF-8 lead byte of U+FDD0..U+FDEF.
const LEAD: u8 = 0xEF;

/// Every marker of one compiled config, by index.
#[derive(Clone, Debug, Default)]
pub(crate) struct MarkerTable {
    origins: Vec<LineOrigin>,
}

impl MarkerTable {
    /// Registers a marker for `template:line` and returns its text.
    pub(crate) fn marker(&mut self, template: &Arc<str>, line: u32) -> String {
        let index = self.origins.len();
        self.origins.push(LineOrigin {
            template: template.clone(),
            line,
        });
        encode(index)
    }

    pub(crate) fn get(&self, index: usize) -> Option<&LineOrigin> {
        self.origins.get(index)
    }

    /// Every origin, by index (what the numbers in [`Stripped::lines`] refer to).
    pub(crate) fn origins(&self) -> Arc<[LineOrigin]> {
        Arc::from(self.origins.as_slice())
    }
}

fn encode(index: usize) -> String {
    let mut text = String::with_capacity(3 * 6);
    text.push(START);
    let digits = format!("{index:x}");
    for digit in digits.chars() {
        let value = digit.to_digit(16).unwrap_or(0);
        text.push(char::from_u32(DIGIT_BASE + value).unwrap_or(START));
    }
    text.push(END);
    text
}

/// Tries to read a marker at the start of `text`; returns its index and byte length.
///
/// Works on the UTF-8 bytes: every marker character is `EF B7 xx` (U+FDC0–U+FDFF),
/// `xx` being `90` for the start, `91` for the end and `A0`–`AF` for the digits.
#[cfg(test)]
fn decode(text: &str) -> Option<(usize, usize)> {
    decode_bytes(text.as_bytes())
}

/// [`decode`] over bytes.
fn decode_bytes(bytes: &[u8]) -> Option<(usize, usize)> {
    const START_BYTE: u8 = 0x90;
    const END_BYTE: u8 = 0x91;
    const DIGIT_BYTES: std::ops::RangeInclusive<u8> = 0xA0..=0xAF;
    let char_at = |at: usize| match bytes.get(at..at + 3) {
        Some([LEAD, 0xB7, last]) => Some(*last),
        _ => None,
    };
    if char_at(0)? != START_BYTE {
        return None;
    }
    let mut index = 0usize;
    let mut digits = 0;
    let mut at = 3;
    loop {
        match char_at(at)? {
            END_BYTE => return (digits > 0).then_some((index, at + 3)),
            digit if DIGIT_BYTES.contains(&digit) => {
                digits += 1;
                if digits > 12 {
                    return None;
                }
                index = index * 16 + usize::from(digit - DIGIT_BYTES.start());
            }
            _ => return None,
        }
        at += 3;
    }
}

/// The position of the first newline or marker lead byte, eight bytes at a time.
fn find_newline_or_lead(bytes: &[u8]) -> Option<usize> {
    let mut start = 0;
    for chunk in bytes.chunks_exact(8) {
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        if equal_bytes(word, b'\n') | equal_bytes(word, LEAD) != 0 {
            break;
        }
        start += 8;
    }
    bytes[start..]
        .iter()
        .position(|&b| b == b'\n' || b == LEAD)
        .map(|at| start + at)
}

/// A rendered file with its markers removed.
#[derive(Debug)]
pub(crate) struct Stripped {
    /// The file's content, ending with a newline unless empty.
    pub(crate) text: String,
    /// The origin of each line (index 0 = line 1), as an index into the marker
    /// table.
    pub(crate) lines: Vec<Option<u32>>,
}

/// Removes markers from a rendered output, records each line's origin, and ends the
/// text with a newline if it lacks one (HAProxy rejects a config whose last line has
/// no LF). An empty output stays empty.
#[cfg(test)]
pub(crate) fn strip(rendered: &str, table: &MarkerTable) -> Stripped {
    let mut stripper = Stripper::new(table, rendered.len());
    stripper.push(rendered);
    stripper.finish()
}

/// A stripper's position in its output and the state it strips the next piece in
/// ([`Stripper::mark`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Mark {
    text: usize,
    lines: usize,
    last_origin: Option<usize>,
    line_origin: Option<usize>,
    line_start: usize,
}

impl Mark {
    /// Bytes of text before the mark.
    pub(crate) fn text(&self) -> usize {
        self.text
    }
}

/// Strips markers from a render while it is being written, piece by piece, so only
/// the final text is ever held (never the text with its markers as well).
///
/// One pass over the bytes, stopping only at newlines and at the lead byte of a
/// marker; the text between markers is copied in runs, and only a line without a
/// marker of its own is looked at again (to tell content from blank). Pushing the
/// output in pieces gives the same result as pushing it whole, as long as no piece
/// ends inside a marker: the engine writes each piece of template data (which holds
/// whole markers) in one go.
pub(crate) struct Stripper<'t> {
    table: &'t MarkerTable,
    /// The text so far: whole strings the engine wrote, markers (whole UTF-8
    /// characters) taken out, so always UTF-8; checked once, in [`Self::finish`].
    text: Vec<u8>,
    lines: Vec<Option<u32>>,
    /// The latest marker seen.
    last_origin: Option<usize>,
    /// The first marker of the current line.
    line_origin: Option<usize>,
    /// Where the current line starts in `text`.
    line_start: usize,
    /// How values between value markers are written ([`super::escape`]).
    escaping: Escaping,
    /// The first value refused, if any.
    refused: Option<Refusal>,
}

impl<'t> Stripper<'t> {
    /// An empty output; `capacity` is a guess of the final text's size. Marked
    /// values are written as they are; see [`Self::escaping`].
    pub(crate) fn new(table: &'t MarkerTable, capacity: usize) -> Self {
        Self {
            table,
            text: Vec::with_capacity(capacity),
            lines: Vec::new(),
            last_origin: None,
            line_origin: None,
            line_start: 0,
            escaping: Escaping::Raw,
            refused: None,
        }
    }

    /// Escapes marked values for `escaping` (the kind of file this output is).
    pub(crate) fn escaping(mut self, escaping: Escaping) -> Self {
        self.escaping = escaping;
        self
    }

    /// The first value refused, if any: the output is then incomplete.
    pub(crate) fn refused(&self) -> Option<&Refusal> {
        self.refused.as_ref()
    }

    /// Lines completed so far.
    pub(crate) fn line_count(&self) -> usize {
        self.lines.len()
    }

    /// Bytes of text so far, markers not counted.
    pub(crate) fn len(&self) -> usize {
        self.text.len()
    }

    /// Where the stripper is now, and the state the next piece is stripped in.
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            text: self.text.len(),
            lines: self.lines.len(),
            last_origin: self.last_origin,
            line_origin: self.line_origin,
            line_start: self.line_start,
        }
    }

    /// Whether the next piece would be stripped now as it was at `mark` of an
    /// earlier output whose text was `earlier`: the same markers seen, and the same
    /// bytes of the current line so far.
    pub(crate) fn same_state(&self, mark: &Mark, earlier: &str) -> bool {
        self.last_origin == mark.last_origin
            && self.line_origin == mark.line_origin
            && earlier
                .as_bytes()
                .get(mark.line_start..mark.text)
                .is_some_and(|line| line == &self.text[self.line_start..])
    }

    /// Appends what an earlier output (`text`, `lines`) got from `from` to `to`, and
    /// takes the state it had at `to`: what pushing the same pieces gives when
    /// [`Self::same_state`] holds at `from`.
    pub(crate) fn copy(&mut self, text: &str, lines: &[Option<u32>], from: &Mark, to: &Mark) {
        self.text
            .extend_from_slice(&text.as_bytes()[from.text..to.text]);
        self.lines.extend_from_slice(&lines[from.lines..to.lines]);
        self.last_origin = to.last_origin;
        self.line_origin = to.line_origin;
        self.line_start = self.text.len() - (to.text - to.line_start);
    }

    /// The template line that produced the latest output.
    pub(crate) fn last_origin(&self) -> Option<&LineOrigin> {
        self.last_origin.and_then(|index| self.table.get(index))
    }

    fn origin_of(
        &self,
        line_origin: Option<usize>,
        has_content: impl FnOnce() -> bool,
    ) -> Option<u32> {
        line_origin
            // No marker of its own: content lines inherit, blank lines do not.
            .or_else(|| {
                if has_content() {
                    self.last_origin
                } else {
                    None
                }
            })
            .filter(|&index| self.table.get(index).is_some())
            .and_then(|index| u32::try_from(index).ok())
    }

    /// [`Self::push_bytes`] of a string.
    #[cfg(test)]
    pub(crate) fn push(&mut self, rendered: &str) {
        self.push_bytes(rendered.as_bytes());
    }

    /// Appends the next piece of the rendered output: the UTF-8 bytes of a whole
    /// string (the engine writes strings only).
    pub(crate) fn push_bytes(&mut self, bytes: &[u8]) {
        let content = |line: &[u8]| line.iter().any(|b| !matches!(b, b' ' | b'\t' | b'\r'));
        // `bytes[copied..]` is not yet in `text`.
        let mut copied = 0;
        let mut pos = 0;
        // Where the current line starts in `rendered`, once a line starts in it.
        let mut line_start = None;
        while let Some(found) = find_newline_or_lead(&bytes[pos..]) {
            let at = pos + found;
            if bytes[at] == b'\n' {
                let line_origin = self.line_origin.take();
                // Without a marker on this line, nothing of it was removed: its bytes
                // are what `text` has of it plus this piece up to here.
                let origin = self.origin_of(line_origin, || match line_start {
                    Some(start) => content(&bytes[start..at]),
                    None => content(&self.text[self.line_start..]) || content(&bytes[..at]),
                });
                self.lines.push(origin);
                pos = at + 1;
                line_start = Some(pos);
                // `bytes[copied..pos]` goes into `text` unchanged.
                self.line_start = self.text.len() + (pos - copied);
                continue;
            }
            if bytes[at..].starts_with(&START_BYTES) || bytes[at..].starts_with(&END_BYTES) {
                self.text.extend_from_slice(&bytes[copied..at]);
                pos = self.value(bytes, at);
                copied = pos;
                continue;
            }
            match decode_bytes(&bytes[at..]) {
                Some((index, len)) if self.table.get(index).is_some() => {
                    self.text.extend_from_slice(&bytes[copied..at]);
                    pos = at + len;
                    copied = pos;
                    self.line_origin.get_or_insert(index);
                    self.last_origin = Some(index);
                }
                _ => pos = at + 1,
            }
        }
        self.text.extend_from_slice(&bytes[copied..]);
    }

    /// Writes the marked value that starts at `bytes[at]` (everything before it is
    /// in `text`), escaped for where it lands; returns where the bytes after it
    /// start. In a raw file the markers are dropped and the value's bytes are read
    /// on as any others (they may hold line breaks); a stray end marker is dropped.
    /// Out of line: few values need escaping, and inlined it slowed the loop of
    /// [`Self::push_bytes`] for every byte (callgrind, see docs/benchmarks.md).
    #[cold]
    #[inline(never)]
    fn value(&mut self, bytes: &[u8], at: usize) -> usize {
        let after_marker = at + START_BYTES.len();
        if self.escaping == Escaping::Raw || bytes[at..].starts_with(&END_BYTES) {
            return after_marker;
        }
        let Some(length) = bytes[after_marker..]
            .windows(END_BYTES.len())
            .position(|w| w == END_BYTES)
        else {
            self.refused.get_or_insert(Refusal::Unterminated);
            return bytes.len();
        };
        let end = after_marker + length;
        let value = String::from_utf8_lossy(&bytes[after_marker..end]);
        let line = &self.text[self.line_start.min(self.text.len())..];
        let mut escaped = Vec::with_capacity(value.len() + 8);
        if let Err(refusal) = escape::escape_value(self.escaping, line, &value, &mut escaped) {
            self.refused.get_or_insert(refusal);
        }
        self.text.extend_from_slice(&escaped);
        end + END_BYTES.len()
    }

    /// The text, ended with a newline unless empty, and each line's origin.
    pub(crate) fn finish(mut self) -> Stripped {
        // Markers after the last newline open no line of their own.
        if !self.text.is_empty() && !self.text.ends_with(b"\n") {
            let line_origin = self.line_origin.take();
            let origin = self.origin_of(line_origin, || {
                self.text[self.line_start..]
                    .iter()
                    .any(|b| !matches!(b, b' ' | b'\t' | b'\r'))
            });
            self.lines.push(origin);
            self.text.push(b'\n');
        }
        Stripped {
            // Whole strings with whole characters taken out: the check passes.
            text: String::from_utf8(self.text)
                .unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned()),
            lines: self.lines,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> (MarkerTable, Vec<String>) {
        let mut table = MarkerTable::default();
        let name: Arc<str> = Arc::from("t");
        let markers = (1..=20).map(|line| table.marker(&name, line)).collect();
        (table, markers)
    }

    /// Each line's template line (marker `i` of [`table`] is line `i + 1`).
    fn lines(stripped: &Stripped) -> Vec<Option<u32>> {
        stripped.lines.iter().map(|o| o.map(|i| i + 1)).collect()
    }

    #[test]
    fn markers_round_trip() {
        for index in [0, 1, 15, 16, 255, 4096, 1 << 20] {
            let text = encode(index);
            assert_eq!(decode(&text), Some((index, text.len())));
        }
        assert_eq!(decode("\u{FDD0}\u{FDD1}"), None);
        assert_eq!(decode("\u{FDD0}x\u{FDD1}"), None);
        assert_eq!(decode("\u{FDD0}\u{FDE1}"), None);
    }

    /// The char-by-char decoder the byte decoder replaced.
    fn reference_decode(text: &str) -> Option<(usize, usize)> {
        let mut chars = text.char_indices();
        if chars.next()?.1 != START {
            return None;
        }
        let mut index = 0usize;
        let mut digits = 0;
        for (at, c) in chars {
            if c == END {
                return (digits > 0).then_some((index, at + c.len_utf8()));
            }
            let value = (c as u32).checked_sub(DIGIT_BASE).filter(|v| *v < 16)?;
            digits += 1;
            if digits > 12 {
                return None;
            }
            index = index * 16 + value as usize;
        }
        None
    }

    #[test]
    fn byte_decoding_agrees_with_char_decoding() {
        let chars = [
            START, END, '\u{FDE0}', '\u{FDE7}', '\u{FDEF}', '\u{FDDF}', '\u{FDF0}', '\u{FDC0}',
            'x', 'é', '\n',
        ];
        let mut inputs = vec![String::new()];
        for _ in 0..4 {
            let previous = inputs.clone();
            for text in previous {
                for c in chars {
                    inputs.push(format!("{text}{c}"));
                }
            }
        }
        inputs.push(format!("{START}{}{END}", "\u{FDE1}".repeat(12)));
        inputs.push(format!("{START}{}{END}", "\u{FDE1}".repeat(13)));
        for input in &inputs {
            assert_eq!(decode(input), reference_decode(input), "{input:?}");
        }
    }

    #[test]
    fn strips_markers_and_records_first_marker_per_line() {
        let (table, m) = table();
        let rendered = format!("{}a{}b\n  {}c\n\n{}d", m[0], m[4], m[1], m[2]);
        let out = strip(&rendered, &table);
        assert_eq!(out.text, "ab\n  c\n\nd\n");
        assert_eq!(lines(&out), vec![Some(1), Some(2), None, Some(3)]);
    }

    #[test]
    fn unmarked_content_inherits_and_blank_lines_do_not() {
        let (table, m) = table();
        let rendered = format!("{}x\ny\n \nz\n", m[6]);
        let out = strip(&rendered, &table);
        assert_eq!(out.text, "x\ny\n \nz\n");
        assert_eq!(lines(&out), vec![Some(7), Some(7), None, Some(7)]);
    }

    #[test]
    fn adds_the_final_newline_and_keeps_empty_output_empty() {
        let (table, m) = table();
        assert_eq!(strip("", &table).text, "");
        assert!(strip("", &table).lines.is_empty());
        let out = strip(&m[0], &table);
        assert_eq!(out.text, "");
        let out = strip(&format!("{}a\n{}", m[0], m[1]), &table);
        assert_eq!(out.text, "a\n");
        assert_eq!(lines(&out), vec![Some(1)]);
    }

    /// The straightforward byte-by-byte version [`strip`] replaced, kept as the
    /// reference it must agree with.
    fn reference_strip(rendered: &str, table: &MarkerTable) -> Stripped {
        let mut text = String::with_capacity(rendered.len());
        let mut lines = Vec::new();
        let mut line_origin: Option<usize> = None;
        let mut last_origin: Option<usize> = None;
        let mut has_content = false;
        let bytes = rendered.as_bytes();
        let mut copied = 0;
        let mut pos = 0;
        let finish_line = |line_origin: &mut Option<usize>,
                           last_origin: Option<usize>,
                           has_content: &mut bool,
                           lines: &mut Vec<_>| {
            let origin = line_origin
                .take()
                .or(if *has_content { last_origin } else { None })
                .filter(|&index| table.get(index).is_some())
                .and_then(|index| u32::try_from(index).ok());
            lines.push(origin);
            *has_content = false;
        };
        while pos < bytes.len() {
            match bytes[pos] {
                b'\n' => {
                    finish_line(&mut line_origin, last_origin, &mut has_content, &mut lines);
                    pos += 1;
                }
                0xEF => match decode(&rendered[pos..]) {
                    Some((index, len)) if table.get(index).is_some() => {
                        text.push_str(&rendered[copied..pos]);
                        pos += len;
                        copied = pos;
                        if line_origin.is_none() {
                            line_origin = Some(index);
                        }
                        last_origin = Some(index);
                    }
                    _ => {
                        has_content = true;
                        pos += 1;
                    }
                },
                b' ' | b'\t' | b'\r' => pos += 1,
                _ => {
                    has_content = true;
                    pos += 1;
                }
            }
        }
        text.push_str(&rendered[copied..]);
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
            finish_line(&mut line_origin, last_origin, &mut has_content, &mut lines);
        }
        Stripped { text, lines }
    }

    #[test]
    fn agrees_with_the_reference_on_mixed_input() {
        let (table, m) = table();
        let pieces: Vec<String> = [
            m[0].clone(),
            m[3].clone(),
            m[19].clone(),
            encode(999),
            "\u{FDD0}".to_owned(),
            "\u{FDD0}\u{FDE1}".to_owned(),
            "\n".to_owned(),
            " ".to_owned(),
            "\t\r".to_owned(),
            "x".to_owned(),
            "é".to_owned(),
            "\u{FDEF}".to_owned(),
        ]
        .into();
        // Every sequence of up to four pieces, plus a few longer deterministic mixes.
        let mut inputs: Vec<Vec<&str>> = vec![Vec::new()];
        for _ in 0..4 {
            let previous = inputs.clone();
            for text in previous {
                for piece in &pieces {
                    let mut longer = text.clone();
                    longer.push(piece);
                    inputs.push(longer);
                }
            }
        }
        let mut seed = 7usize;
        for _ in 0..500 {
            let mut text = Vec::new();
            for _ in 0..30 {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                text.push(pieces[(seed >> 33) % pieces.len()].as_str());
            }
            inputs.push(text);
        }
        for parts in &inputs {
            let input = parts.concat();
            let fast = strip(&input, &table);
            let slow = reference_strip(&input, &table);
            assert_eq!(fast.text, slow.text, "text of {input:?}");
            assert_eq!(fast.lines, slow.lines, "lines of {input:?}");
            // Written piece by piece, as the engine writes, the result is the same.
            let mut stripper = Stripper::new(&table, 0);
            for part in parts {
                stripper.push(part);
            }
            let streamed = stripper.finish();
            assert_eq!(streamed.text, slow.text, "streamed text of {parts:?}");
            assert_eq!(streamed.lines, slow.lines, "streamed lines of {parts:?}");
        }
    }

    #[test]
    fn unknown_or_broken_markers_stay_in_the_text() {
        let (table, _) = table();
        let foreign = format!("{}\n", encode(999));
        assert_eq!(strip(&foreign, &table).text, foreign);
        assert_eq!(strip("\u{FDD0}x\n", &table).text, "\u{FDD0}x\n");
        assert_eq!(strip("é\n", &table).text, "é\n");
    }
}
