//! Splits one configuration line into words the way HAProxy 2.6's `parse_line()`
//! does for configuration files, and quotes words back for printing.
//!
//! Rules (from `src/tools.c`, options `ENV | DQUOTE | SQUOTE | BKSLASH | SHARP |
//! WORD_EXPAND`):
//! - leading blanks are skipped; runs of blanks separate words;
//! - `\n`, `\r` and NUL end the line, even inside quotes;
//! - `#` outside quotes starts a comment, even in the middle of a word;
//! - `"…"` and `'…'` quote (and can start or end mid-word: `a"b c"d` is one word);
//! - outside single quotes a backslash escapes ` `, `\`, `#`, `'`, `"`, and `$` (the
//!   last only inside double quotes); `\t`, `\n`, `\r` and `\xHH` are control
//!   characters; any other backslash stays as written;
//! - inside double quotes `$NAME`, `${NAME}`, `${NAME-default}` and `${NAME[*]}` are
//!   environment references. HAProxy expands them; we keep them **as written** so the
//!   model is independent of the environment. A `$` that does not start a valid
//!   reference is an error there, exactly as in HAProxy;
//! - an empty last word (`foo ""`) is dropped, and a line whose first word is empty
//!   is treated as blank;
//! - more than [`MAX_WORDS`] words is an error.

/// HAProxy's `MAX_LINE_ARGS`: the most words one line may hold.
pub const MAX_WORDS: usize = 64;

/// Why a line could not be split into words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("column {column}: {message}")]
pub struct TokenError {
    /// 1-based character column of the offending character.
    pub column: u32,
    /// What is wrong.
    pub message: String,
}

/// Whether HAProxy's `isspace()` holds, for the bytes that can occur within a line.
fn is_blank(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | 0x0b | 0x0c)
}

fn ends_line(byte: u8) -> bool {
    matches!(byte, b'\n' | b'\r' | 0)
}

/// 1-based character column of byte offset `at` in `line`.
fn column(line: &str, at: usize) -> u32 {
    let at = at.min(line.len());
    // `at` may fall inside a multi-byte character; count characters that start before it.
    let chars = line
        .char_indices()
        .take_while(|(index, _)| *index < at)
        .count();
    u32::try_from(chars + 1).unwrap_or(u32::MAX)
}

/// Length in bytes of the environment reference starting with the `$` at `start`,
/// or the byte offset and description of why it is not a valid one.
pub(crate) fn env_reference_len(
    bytes: &[u8],
    start: usize,
) -> Result<usize, (usize, &'static str)> {
    let mut at = start + 1;
    let brace = (bytes.get(at) == Some(&b'{')).then_some(at);
    if brace.is_some() {
        at += 1;
    }
    let first = bytes.get(at).copied().unwrap_or(0);
    if !(first.is_ascii_alphabetic() || first == b'_' || first == b'.') {
        return Err((at, "forbidden first char in environment variable name"));
    }
    let name_start = at;
    if first == b'.' {
        at += 1;
    }
    while bytes
        .get(at)
        .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
    {
        at += 1;
    }
    if first == b'.' && !matches!(&bytes[name_start..at], b".LINE" | b".FILE" | b".SECTION") {
        return Err((name_start, "unsupported internal variable name"));
    }
    if let Some(brace) = brace {
        if bytes.get(at) == Some(&b'[') {
            if bytes.get(at + 1) == Some(&b'*') && bytes.get(at + 2) == Some(&b']') {
                at += 3;
            } else {
                return Err((at, "wrong word expansion (only '[*]' is supported)"));
            }
        }
        if bytes.get(at) == Some(&b'-') {
            match bytes[at..].iter().position(|b| *b == b'}') {
                Some(offset) => at += offset,
                None => return Err((brace, "unmatched brace in environment variable name")),
            }
        }
        if bytes.get(at) != Some(&b'}') {
            return Err((brace, "unmatched brace in environment variable name"));
        }
        at += 1;
    }
    Ok(at - start)
}

fn hex_value(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Splits one line (without its `\n`) into unquoted words.
///
/// Returns an empty vector for blank and comment-only lines. Never panics.
pub fn split_words(line: &str) -> Result<Vec<String>, TokenError> {
    let bytes = line.as_bytes();
    let error = |at: usize, message: &str| TokenError {
        column: column(line, at),
        message: message.to_owned(),
    };
    let mut at = 0;
    while at < bytes.len() && is_blank(bytes[at]) {
        at += 1;
    }
    let mut words: Vec<Vec<u8>> = Vec::new();
    let mut current: Vec<u8> = Vec::new();
    let mut squote = false;
    let mut dquote = false;
    let mut quote_at: Option<usize> = None;
    while let Some(&byte) = bytes.get(at) {
        if ends_line(byte) {
            break;
        }
        match byte {
            b'#' if !squote && !dquote => break,
            b'"' if !squote => {
                dquote = !dquote;
                quote_at = dquote.then_some(at);
                at += 1;
            }
            b'\'' if !dquote => {
                squote = !squote;
                quote_at = squote.then_some(at);
                at += 1;
            }
            b'\\' if !squote => {
                let next = bytes.get(at + 1).copied().unwrap_or(0);
                match next {
                    b' ' | b'\\' | b'#' | b'\'' | b'"' => {
                        current.push(next);
                        at += 2;
                    }
                    b'$' if dquote => {
                        current.push(b'$');
                        at += 2;
                    }
                    b't' => {
                        current.push(b'\t');
                        at += 2;
                    }
                    b'n' => {
                        current.push(b'\n');
                        at += 2;
                    }
                    b'r' => {
                        current.push(b'\r');
                        at += 2;
                    }
                    b'x' => {
                        let high = bytes.get(at + 2).copied().and_then(hex_value);
                        let low = bytes.get(at + 3).copied().and_then(hex_value);
                        match (high, low) {
                            (Some(high), Some(low)) => {
                                current.push(high << 4 | low);
                                at += 4;
                            }
                            _ => return Err(error(at, "invalid or incomplete hex sequence")),
                        }
                    }
                    _ => {
                        // Not an escape sequence: the backslash stays.
                        current.push(b'\\');
                        at += 1;
                    }
                }
            }
            b'$' if dquote => match env_reference_len(bytes, at) {
                Ok(len) => {
                    current.extend_from_slice(&bytes[at..at + len]);
                    at += len;
                }
                Err((position, message)) => return Err(error(position, message)),
            },
            _ if is_blank(byte) && !squote && !dquote => {
                while bytes.get(at).is_some_and(|b| is_blank(*b)) {
                    at += 1;
                }
                words.push(std::mem::take(&mut current));
                if words.len() > MAX_WORDS {
                    return Err(error(
                        at,
                        &format!("too many words, truncating after word {MAX_WORDS}"),
                    ));
                }
            }
            _ => {
                current.push(byte);
                at += 1;
            }
        }
    }
    if let Some(quote) = quote_at {
        return Err(error(quote, "unmatched quote"));
    }
    if !current.is_empty() {
        words.push(current);
    }
    if words.len() > MAX_WORDS {
        return Err(error(
            bytes.len(),
            &format!("too many words, truncating after word {MAX_WORDS}"),
        ));
    }
    if words.first().is_some_and(Vec::is_empty) {
        return Ok(Vec::new());
    }
    // Each word grew a byte at a time: keep only its bytes (the parsed model of a
    // large config holds every word).
    Ok(words
        .into_iter()
        .map(|word| match String::from_utf8(word) {
            Ok(mut text) => {
                text.shrink_to_fit();
                text
            }
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        })
        .collect())
}

/// Whether `word` can be printed without quotes and read back unchanged.
fn is_bare(word: &str) -> bool {
    !word.is_empty()
        && word
            .bytes()
            .all(|b| !(b < 0x20 || b == 0x7f || matches!(b, b' ' | b'#' | b'"' | b'\'' | b'\\')))
}

/// Writes `word` so that [`split_words`] reads it back as the same word: bare when
/// possible, otherwise in double quotes with escapes. Environment references are
/// written as they are (so they stay references).
pub(crate) fn quote_word(word: &str, out: &mut String) {
    if is_bare(word) {
        out.push_str(word);
        return;
    }
    let bytes = word.as_bytes();
    let mut raw: Vec<u8> = Vec::with_capacity(bytes.len() + 2);
    raw.push(b'"');
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        match byte {
            b'$' => match env_reference_len(bytes, at) {
                Ok(len) => {
                    raw.extend_from_slice(&bytes[at..at + len]);
                    at += len;
                    continue;
                }
                Err(_) => raw.extend_from_slice(b"\\$"),
            },
            b'"' => raw.extend_from_slice(b"\\\""),
            b'\\' => raw.extend_from_slice(b"\\\\"),
            b'\n' => raw.extend_from_slice(b"\\n"),
            b'\r' => raw.extend_from_slice(b"\\r"),
            b'\t' => raw.extend_from_slice(b"\\t"),
            b if b < 0x20 || b == 0x7f => {
                raw.extend_from_slice(format!("\\x{b:02x}").as_bytes());
            }
            b => raw.push(b),
        }
        at += 1;
    }
    raw.push(b'"');
    // Only ASCII escapes were added to valid UTF-8, so this never replaces anything.
    out.push_str(&String::from_utf8_lossy(&raw));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        split_words(line).unwrap()
    }

    #[test]
    fn blanks_separate_words_and_comments_end_lines() {
        assert_eq!(
            words("  server s1\t127.0.0.1:80  check "),
            ["server", "s1", "127.0.0.1:80", "check"]
        );
        assert_eq!(words("bind :80 # comment"), ["bind", ":80"]);
        assert_eq!(words("a#b c"), ["a"]);
        assert!(words("   # only a comment").is_empty());
        assert!(words("").is_empty());
        assert_eq!(words("a\rb c"), ["a"]);
    }

    #[test]
    fn quotes_join_and_protect() {
        assert_eq!(words(r#"a"b c"d e"#), ["ab cd", "e"]);
        assert_eq!(words(r#"x 'it''s' "#), ["x", "its"]);
        assert_eq!(words(r#"x "it's" '"q"' "#), ["x", "it's", "\"q\""]);
        assert_eq!(
            words(r##"x "# not a comment" y"##),
            ["x", "# not a comment", "y"]
        );
        assert_eq!(words(r#"x "" y"#), ["x", "", "y"]);
        // A trailing empty word is dropped, as HAProxy does.
        assert_eq!(words(r#"x """#), ["x"]);
        assert!(words(r#""" x"#).is_empty());
    }

    #[test]
    fn escapes_follow_haproxy() {
        assert_eq!(words(r"a\ b c"), ["a b", "c"]);
        assert_eq!(words(r"a\#b"), ["a#b"]);
        assert_eq!(words(r"a\\b \d"), [r"a\b", r"\d"]);
        assert_eq!(words(r"\x41\x62"), ["Ab"]);
        assert_eq!(words(r#"'a\nb' "a\tb""#), [r"a\nb", "a\tb"]);
        assert_eq!(words(r#""\$x" \$x"#), ["$x", r"\$x"]);
        let err = split_words(r"x \xZ1").unwrap_err();
        assert_eq!(err.column, 3);
    }

    #[test]
    fn environment_references_stay_as_written() {
        assert_eq!(
            words(r#"bind "127.0.0.1:${PORT}""#),
            ["bind", "127.0.0.1:${PORT}"]
        );
        assert_eq!(
            words(r#"x "${A-de fault}" "$HOME/x" "${L[*]}""#),
            ["x", "${A-de fault}", "$HOME/x", "${L[*]}"]
        );
        assert_eq!(
            words("bind 127.0.0.1:${PORT}"),
            ["bind", "127.0.0.1:${PORT}"]
        );
        assert_eq!(words("x '$5'"), ["x", "$5"]);
        assert_eq!(
            split_words(r#"x "a$""#).unwrap_err().message,
            "forbidden first char in environment variable name"
        );
        assert!(split_words(r#"x "${A""#).is_err());
        assert!(split_words(r#"x "${A[1]}""#).is_err());
        assert!(split_words(r#"x "${.NOPE}""#).is_err());
        assert_eq!(words(r#"x "${.LINE}""#), ["x", "${.LINE}"]);
    }

    #[test]
    fn unmatched_quotes_are_located() {
        let err = split_words(r#"    server s1 "127.0.0.1:80 "#).unwrap_err();
        assert_eq!(err.message, "unmatched quote");
        assert_eq!(err.column, 15);
        assert!(split_words("x 'a").is_err());
    }

    #[test]
    fn too_many_words_is_an_error() {
        let line = vec!["w"; MAX_WORDS].join(" ");
        assert_eq!(words(&line).len(), MAX_WORDS);
        assert!(split_words(&format!("{line} extra")).is_err());
        assert!(split_words(&format!("{line} extra ")).is_err());
    }

    #[test]
    fn quoting_round_trips() {
        for word in [
            "plain",
            "",
            "a b",
            "#",
            "it's",
            "\"",
            "\\",
            "$5",
            "${A-x y}",
            "a\nb\t\u{1}",
            "é ü",
            "${A",
            "$",
            "x${B}y z",
        ] {
            let mut printed = String::new();
            quote_word(word, &mut printed);
            let line = format!("k {printed} end");
            assert_eq!(words(&line), ["k", word, "end"], "printed as {printed}");
        }
    }
}
