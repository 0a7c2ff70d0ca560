//! Escaping by default: a value printed with `{{ }}` can never add a line, a section,
//! a directive or an argument to `haproxy.cfg` or a map, and never reaches HAProxy
//! as a sample fetch or an environment expansion.
//!
//! # How
//!
//! The engine runs in a custom auto-escape mode. Values the template does not
//! vouch for (everything from watched resources and HTTP sources, and anything
//! computed from them) are *untrusted*; trusted are the template's own text, string
//! literals written in the template, `extraContext`, the output of `include`, macros
//! and `{% set %}` blocks (whose untrusted parts were handled when they were
//! written), and values marked `|trusted`.
//!
//! The formatter writes an untrusted value that holds any byte HAProxy could read as
//! syntax ([`needs_escaping`]) between two invisible markers ([`wrap`]); a value
//! without such bytes is written as it is, so its output is byte for byte what
//! Jinja2 prints. Where the value finally lands is known only when the file's line
//! is complete up to it (a value may be captured by a macro and printed elsewhere),
//! so the markers are resolved while the output is written
//! ([`super::source_map::Stripper`]): the line so far says whether the value lands
//! in a comment, a bare word, a double- or single-quoted string, and whether that
//! word is a log-format argument ([`config_place`]); the value is then escaped for
//! exactly that place ([`escape_config`], [`escape_map`]) or refused ([`Refusal`]).
//!
//! Certificates and `files` are written as they are ([`Escaping::Raw`]): a PEM
//! block needs its line breaks, and neither is read as configuration.

use std::fmt;

use hapwright_eventbus::model::FileKind;

/// The name of the engine's auto-escape mode for HAProxy files.
pub(crate) const AUTO_ESCAPE: &str = "haproxy";

/// Opens an untrusted value in the engine's output (a Unicode noncharacter, like the
/// source map's markers).
pub(crate) const VALUE_START: char = '\u{FDD2}';
/// Closes an untrusted value.
pub(crate) const VALUE_END: char = '\u{FDD3}';
/// UTF-8 of [`VALUE_START`].
pub(crate) const START_BYTES: [u8; 3] = [0xEF, 0xB7, 0x92];
/// UTF-8 of [`VALUE_END`].
pub(crate) const END_BYTES: [u8; 3] = [0xEF, 0xB7, 0x93];

/// How untrusted values are written into one output file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Escaping {
    /// HAProxy configuration syntax (`haproxy.cfg`).
    Config,
    /// HAProxy map and ACL files: a key, then the rest of the line as the value.
    Map,
    /// Written as they are (certificates, `files`).
    Raw,
}

impl Escaping {
    /// The default for a file of this kind.
    pub fn for_kind(kind: FileKind) -> Self {
        match kind {
            FileKind::Main => Self::Config,
            FileKind::Map => Self::Map,
            FileKind::File | FileKind::Certificate => Self::Raw,
        }
    }
}

/// Bytes that make a value worth a second look: whitespace and control characters,
/// HAProxy's quoting, comment, expansion and log-format characters, and the lead
/// bytes of C1 controls (U+0080–U+009F) and of the markers' noncharacters.
const SPECIAL: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b <= 0x20 {
        table[b] = true;
        b += 1;
    }
    table[0x7F] = true;
    table[b'"' as usize] = true;
    table[b'#' as usize] = true;
    table[b'$' as usize] = true;
    table[b'%' as usize] = true;
    table[b'\'' as usize] = true;
    table[b'\\' as usize] = true;
    table[0xC2] = true;
    table[0xEF] = true;
    table
};

/// Whether an untrusted value must be marked for escaping: false for the plain
/// values (names, numbers, addresses, hosts) that make up nearly every print.
pub(crate) fn needs_escaping(text: &str) -> bool {
    text.bytes().any(|b| SPECIAL[usize::from(b)])
}

/// Stands in for a value marker found inside a value: a noncharacter the escaping
/// refuses, so a value can never end its own marking early.
const INNER_MARKER: char = '\u{FDD4}';

/// `text` between the value markers. A marker inside it (a value holding one, or
/// built from a macro's output that marked a value) becomes [`INNER_MARKER`] and
/// is refused where the value lands.
pub(crate) fn wrap(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2 * VALUE_START.len_utf8());
    out.push(VALUE_START);
    out.extend(text.chars().map(|c| {
        if c == VALUE_START || c == VALUE_END {
            INNER_MARKER
        } else {
            c
        }
    }));
    out.push(VALUE_END);
    out
}

/// Why a value was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A line break, NUL or other control character: it would end the line (or
    /// hide part of it) whatever the quoting.
    Control(char),
    /// A Unicode noncharacter of the range hapwright uses for its own markers.
    Noncharacter(char),
    /// Whitespace in a map key, which HAProxy ends at the first space or tab.
    MapKeySpace,
    /// A map key starting with `#`, which makes the line a comment.
    MapKeyComment,
    /// A filter cut a value's markers apart (say `truncate` of a macro's output).
    Unterminated,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Control(c) => {
                let what = match c {
                    '\n' => "a line break (\\n)",
                    '\r' => "a carriage return (\\r)",
                    '\0' => "a NUL character",
                    '\t' => "a tab",
                    _ => "a control character",
                };
                write!(
                    f,
                    "a printed value holds {what} (U+{:04X}), which would change the file's \
                     lines; the value is refused (an object's value never becomes \
                     configuration)",
                    u32::from(*c)
                )
            }
            Self::Noncharacter(c) => write!(
                f,
                "a printed value holds the Unicode noncharacter U+{:04X}; the value is \
                 refused",
                u32::from(*c)
            ),
            Self::MapKeySpace => f.write_str(
                "a printed value lands in a map key and holds a space, which would split \
                 the key; the value is refused",
            ),
            Self::MapKeyComment => f.write_str(
                "a printed value starts a map line with `#`, which would make the line a \
                 comment; the value is refused",
            ),
            Self::Unterminated => f.write_str(
                "a filter cut an escaped value apart (its end is missing), so it cannot be \
                 escaped for where it lands; print the value itself, or mark the \
                 template's own text `|trusted`",
            ),
        }
    }
}

/// Refuses control characters and the markers' noncharacters.
fn check_chars(value: &str) -> Result<(), Refusal> {
    for c in value.chars() {
        if c.is_control() {
            return Err(Refusal::Control(c));
        }
        if ('\u{FDD0}'..='\u{FDEF}').contains(&c) {
            return Err(Refusal::Noncharacter(c));
        }
    }
    Ok(())
}

// === haproxy.cfg ===

/// The quoting a value lands in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quote {
    /// A bare word: whitespace separates words, `#` starts a comment, quotes open
    /// a quoted part; `${NAME}` is not expanded.
    None,
    /// Inside `"..."`: backslash escapes and `${}` expansion still apply.
    Double,
    /// Inside `'...'`: nothing is special but the closing quote.
    Single,
}

/// Where on a `haproxy.cfg` line a value lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// After a `#` outside quotes: the rest of the line is a comment.
    pub comment: bool,
    /// The quoting the value lands in.
    pub quote: Quote,
    /// The word is a log-format argument, where `%` starts a sample or variable.
    pub logformat: bool,
}

impl Place {
    /// A bare word that is not a log-format argument.
    pub const WORD: Place = Place {
        comment: false,
        quote: Quote::None,
        logformat: false,
    };
}

/// Reads `line` (a `haproxy.cfg` line up to where a value lands) as HAProxy's
/// tokenizer does, and says where the value lands.
pub fn config_place(line: &[u8]) -> Place {
    let mut words: Vec<Vec<u8>> = Vec::new();
    let mut current = Vec::new();
    let mut in_word = false;
    let mut quote = Quote::None;
    let mut i = 0;
    while i < line.len() {
        let b = line[i];
        match quote {
            Quote::Single => {
                if b == b'\'' {
                    quote = Quote::None;
                } else {
                    current.push(b);
                }
            }
            Quote::Double => match b {
                b'"' => quote = Quote::None,
                b'\\' if i + 1 < line.len() => {
                    i += 1;
                    current.push(line[i]);
                }
                _ => current.push(b),
            },
            Quote::None => match b {
                b' ' | b'\t' => {
                    if in_word {
                        words.push(std::mem::take(&mut current));
                        in_word = false;
                    }
                }
                b'#' => {
                    return Place {
                        comment: true,
                        quote: Quote::None,
                        logformat: false,
                    };
                }
                b'\\' => {
                    in_word = true;
                    if i + 1 < line.len() {
                        i += 1;
                        current.push(line[i]);
                    }
                }
                b'"' => {
                    in_word = true;
                    quote = Quote::Double;
                }
                b'\'' => {
                    in_word = true;
                    quote = Quote::Single;
                }
                _ => {
                    in_word = true;
                    current.push(b);
                }
            },
        }
        i += 1;
    }
    let words: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
    Place {
        comment: false,
        quote,
        logformat: is_logformat(&words, words.len()),
    }
}

/// Whether word `index` of a line whose first words are `words` is a log-format
/// argument (HAProxy 2.6 to 3.4): the formats of `log-format` and friends, the
/// values of header, path, query, URI, method, variable, map and ACL actions, a
/// redirect's location, `return`/`deny` bodies and headers, `http-check send`
/// headers and bodies, and `use_backend`/`use-server` names (which HAProxy reads as
/// a format as soon as they hold a `%`).
pub fn is_logformat(words: &[&[u8]], index: usize) -> bool {
    match words.first().copied() {
        Some(b"log-format" | b"log-format-sd" | b"error-log-format" | b"unique-id-format") => {
            index >= 1
        }
        Some(b"http-request" | b"http-response" | b"http-after-response") => {
            action_logformat(words, 1, index)
        }
        Some(b"tcp-request" | b"tcp-response") => action_logformat(words, 2, index),
        Some(b"redirect") => after_any(words, index, &[b"location", b"prefix", b"scheme"]),
        Some(b"use_backend" | b"use-server") => index == 1,
        Some(b"http-check") => {
            words.get(1) == Some(&&b"send"[..])
                && (after_any(words, index, &[b"uri-lf", b"body-lf"])
                    || (index >= 2 && words.get(index - 2) == Some(&&b"hdr"[..])))
        }
        _ => false,
    }
}

/// Whether word `index - 1` is one of `keywords`.
fn after_any(words: &[&[u8]], index: usize, keywords: &[&[u8]]) -> bool {
    index >= 1
        && words
            .get(index - 1)
            .is_some_and(|word| keywords.contains(word))
}

/// Word `index` of a rule whose action is word `at`.
fn action_logformat(words: &[&[u8]], at: usize, index: usize) -> bool {
    let Some(action) = words.get(at).copied() else {
        return false;
    };
    if index <= at {
        return false;
    }
    // The condition after `if`/`unless` is no format.
    if words[at + 1..index.min(words.len())]
        .iter()
        .any(|w| *w == b"if" || *w == b"unless")
    {
        return false;
    }
    let arg = index - at;
    let starts = |prefix: &[u8]| action.starts_with(prefix);
    match action {
        b"set-header" | b"add-header" | b"early-hint" => arg >= 2,
        b"replace-header" | b"replace-value" => arg >= 3,
        b"set-path" | b"set-pathq" | b"set-query" | b"set-uri" | b"set-method" => arg >= 1,
        b"replace-path" | b"replace-pathq" | b"replace-uri" => arg >= 2,
        b"redirect" => after_any(words, index, &[b"location", b"prefix", b"scheme"]),
        b"return" | b"deny" | b"tarpit" => {
            after_any(words, index, &[b"lf-string"])
                || (index >= 2 && words.get(index - 2) == Some(&&b"hdr"[..]))
        }
        _ if starts(b"set-var-fmt(")
            || starts(b"set-map(")
            || starts(b"add-acl(")
            || starts(b"del-acl(")
            || starts(b"del-map(") =>
        {
            arg >= 1
        }
        _ => false,
    }
}

/// Appends `value`, escaped for `place`, to `out`.
pub fn escape_config(value: &str, place: Place, out: &mut Vec<u8>) -> Result<(), Refusal> {
    check_chars(value)?;
    if place.comment {
        out.extend_from_slice(value.as_bytes());
        return Ok(());
    }
    let mut buf = [0u8; 4];
    for c in value.chars() {
        match (place.quote, c) {
            (_, '%') if place.logformat => out.extend_from_slice(b"%%"),
            (Quote::Single, '\'') => out.extend_from_slice(b"'\\''"),
            // HAProxy expands `${NAME}` only inside double quotes; in a bare word a
            // `$` is plain text (and `\$` would stay two characters).
            (Quote::Double, '"' | '\\' | '$') | (Quote::None, ' ' | '"' | '\'' | '\\' | '#') => {
                out.push(b'\\');
                out.push(c as u8);
            }
            _ => out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes()),
        }
    }
    Ok(())
}

// === maps ===

/// Where on a map line a value lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapPlace {
    /// Nothing but whitespace before it: the value starts the key.
    KeyStart,
    /// Inside the key.
    Key,
    /// After the key: the rest of the line is the value.
    Value,
    /// The line is a comment.
    Comment,
}

/// Reads a map line up to where a value lands.
pub fn map_place(line: &[u8]) -> MapPlace {
    let blank = |b: &u8| matches!(b, b' ' | b'\t');
    match line.iter().position(|b| !blank(b)) {
        None => MapPlace::KeyStart,
        Some(start) if line[start] == b'#' => MapPlace::Comment,
        Some(start) if line[start..].iter().any(blank) => MapPlace::Value,
        Some(_) => MapPlace::Key,
    }
}

/// Appends `value` to `out` where it lands on a map line, or refuses it.
pub fn escape_map(value: &str, place: MapPlace, out: &mut Vec<u8>) -> Result<(), Refusal> {
    check_chars(value)?;
    if matches!(place, MapPlace::KeyStart | MapPlace::Key) {
        if value.contains([' ', '\t']) {
            return Err(Refusal::MapKeySpace);
        }
        if place == MapPlace::KeyStart && value.starts_with('#') {
            return Err(Refusal::MapKeyComment);
        }
    }
    out.extend_from_slice(value.as_bytes());
    Ok(())
}

/// Escapes one marked value for the line it lands on (`line`: the file's current
/// line up to the value), appending the result to `out`.
pub(crate) fn escape_value(
    escaping: Escaping,
    line: &[u8],
    value: &str,
    out: &mut Vec<u8>,
) -> Result<(), Refusal> {
    match escaping {
        Escaping::Config => escape_config(value, config_place(line), out),
        Escaping::Map => escape_map(value, map_place(line), out),
        Escaping::Raw => {
            out.extend_from_slice(value.as_bytes());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests;
