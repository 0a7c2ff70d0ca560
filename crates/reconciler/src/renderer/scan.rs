//! A small scanner over Jinja template sources that mirrors minijinja's lexer closely
//! enough to find tags, data, comments and raw blocks without compiling.
//!
//! It serves three purposes:
//!
//! - **instrumentation** for the source map: line markers are inserted into template
//!   data (see [`super::source_map`] for why and where);
//! - the **`render_glob` rewrite**: `{{ render_glob(pattern) }}` becomes a loop that
//!   includes every matching snippet, so matching snippets render exactly like
//!   `include`d ones (same context, same fuel, same recursion limit);
//! - **static checks**: literal `include`/`import`/`from`/`extends` targets,
//!   literal `render_glob` patterns and `resources.<name>` references, each with the
//!   byte offset where it was written.
//!
//! The scanner never decides whether a template is valid: anything it cannot make
//! sense of (an unterminated tag, say) is left as it is for minijinja to report.

use std::ops::Range;

/// The loop variable of the `render_glob` rewrite.
pub(crate) const GLOB_LOOP_VAR: &str = "__glob_snippet";
/// The helper function the `render_glob` rewrite calls for the matching names.
pub(crate) const GLOB_HELPER: &str = "__render_glob";

// === impl LineIndex ===

/// Maps byte offsets of a source to 1-based lines and columns.
#[derive(Clone, Debug)]
pub(crate) struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    pub(crate) fn new(source: &str) -> Self {
        let mut starts = vec![0];
        starts.extend(
            source
                .bytes()
                .enumerate()
                .filter(|(_, b)| *b == b'\n')
                .map(|(i, _)| i + 1),
        );
        Self { starts }
    }

    /// Number of lines (a trailing newline does not open a new line).
    pub(crate) fn len(&self) -> usize {
        self.starts.len()
    }

    /// 1-based line of a byte offset.
    pub(crate) fn line(&self, offset: usize) -> u32 {
        let index = self.starts.partition_point(|start| *start <= offset);
        u32::try_from(index.max(1)).unwrap_or(u32::MAX)
    }

    /// 1-based column (in characters) of a byte offset.
    pub(crate) fn column(&self, source: &str, offset: usize) -> u32 {
        let line = self.line(offset) as usize;
        let start = self.starts[line - 1];
        let end = offset.min(source.len());
        let prefix = source.get(start..end).unwrap_or("");
        u32::try_from(prefix.chars().count() + 1).unwrap_or(u32::MAX)
    }

    /// The text of a 1-based line, without its line ending.
    pub(crate) fn text<'a>(&self, source: &'a str, line: u32) -> Option<&'a str> {
        let index = usize::try_from(line).ok()?.checked_sub(1)?;
        let start = *self.starts.get(index)?;
        let end = self
            .starts
            .get(index + 1)
            .map_or(source.len(), |next| next - 1);
        let text = source.get(start..end)?;
        Some(text.strip_suffix('\r').unwrap_or(text))
    }
}

// === Pieces ===

/// Whether a tag prints (`{{ }}`) or is a statement (`{% %}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TagKind {
    Variable,
    Block,
}

/// One `{{ }}` or `{% %}` tag.
#[derive(Clone, Debug)]
pub(crate) struct Tag {
    pub(crate) kind: TagKind,
    /// The whole tag, delimiters included.
    pub(crate) range: Range<usize>,
    /// Between the delimiters and their whitespace-control characters.
    pub(crate) inner: Range<usize>,
    /// `{{-` / `{%-`: strips whitespace before the tag.
    pub(crate) trim_left: bool,
    /// `-}}` / `-%}`: strips whitespace after the tag.
    pub(crate) trim_right: bool,
}

/// A syntactic piece of a template source.
#[derive(Clone, Debug)]
pub(crate) enum Piece {
    /// Template data, printed as written.
    Data(Range<usize>),
    /// `{# ... #}`.
    Comment,
    /// The content of a `{% raw %}...{% endraw %}` block (printed as written).
    Raw(Range<usize>),
    /// A tag.
    Tag(Tag),
}

/// Splits a source into pieces, in order. An unterminated tag or comment ends the scan
/// (the rest counts as data; minijinja reports the syntax error).
pub(crate) fn pieces(source: &str) -> Vec<Piece> {
    let bytes = source.as_bytes();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let Some((start, opener)) = next_opener(bytes, pos) else {
            out.push(Piece::Data(pos..bytes.len()));
            break;
        };
        if start > pos {
            out.push(Piece::Data(pos..start));
        }
        match opener {
            b'#' => match find(bytes, start + 2, b"#}") {
                Some(end) => {
                    out.push(Piece::Comment);
                    pos = end + 2;
                }
                None => {
                    out.push(Piece::Data(start..bytes.len()));
                    break;
                }
            },
            _ => {
                let kind = if opener == b'{' {
                    TagKind::Variable
                } else {
                    TagKind::Block
                };
                let Some(tag) = scan_tag(source, start, kind) else {
                    out.push(Piece::Data(start..bytes.len()));
                    break;
                };
                pos = tag.range.end;
                if kind == TagKind::Block && first_word(source, &tag) == Some("raw") {
                    match find_endraw(source, pos) {
                        Some((content_end, after)) => {
                            out.push(Piece::Tag(tag));
                            out.push(Piece::Raw(pos..content_end));
                            pos = after;
                        }
                        None => {
                            out.push(Piece::Data(tag.range.start..bytes.len()));
                            break;
                        }
                    }
                } else {
                    out.push(Piece::Tag(tag));
                }
            }
        }
    }
    out
}

fn next_opener(bytes: &[u8], from: usize) -> Option<(usize, u8)> {
    let mut pos = from;
    while pos + 1 < bytes.len() {
        if bytes[pos] == b'{' && matches!(bytes[pos + 1], b'{' | b'%' | b'#') {
            return Some((pos, bytes[pos + 1]));
        }
        pos += 1;
    }
    None
}

fn find(bytes: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    if from > bytes.len() {
        return None;
    }
    bytes[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// Scans a tag starting at `start` (`{{` or `{%`) to its end delimiter, skipping
/// string literals and tracking brackets the way minijinja's lexer does.
fn scan_tag(source: &str, start: usize, kind: TagKind) -> Option<Tag> {
    let bytes = source.as_bytes();
    let close = if kind == TagKind::Variable {
        b'}'
    } else {
        b'%'
    };
    let mut pos = start + 2;
    let trim_left = bytes.get(pos) == Some(&b'-');
    if matches!(bytes.get(pos), Some(b'-' | b'+')) {
        pos += 1;
    }
    let inner_start = pos;
    let mut depth = 0usize;
    while pos < bytes.len() {
        match bytes[pos] {
            quote @ (b'"' | b'\'') => {
                pos += 1;
                while pos < bytes.len() && bytes[pos] != quote {
                    if bytes[pos] == b'\\' {
                        pos += 1;
                    }
                    pos += 1;
                }
                pos += 1;
                continue;
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' => depth = depth.saturating_sub(1),
            b'}' if depth > 0 => depth -= 1,
            c if depth == 0 => {
                let ws = matches!(c, b'-' | b'+');
                let at = if ws { pos + 1 } else { pos };
                if bytes.get(at) == Some(&close) && bytes.get(at + 1) == Some(&b'}') {
                    return Some(Tag {
                        kind,
                        range: start..at + 2,
                        inner: inner_start..pos,
                        trim_left,
                        trim_right: c == b'-',
                    });
                }
            }
            _ => {}
        }
        pos += 1;
    }
    None
}

/// Finds `{% endraw %}` (with optional whitespace control) after a raw tag; returns
/// the end of the raw content and the end of the closing tag.
fn find_endraw(source: &str, from: usize) -> Option<(usize, usize)> {
    let bytes = source.as_bytes();
    let mut pos = from;
    while let Some(open) = find(bytes, pos, b"{%") {
        let mut p = open + 2;
        if matches!(bytes.get(p), Some(b'-' | b'+')) {
            p += 1;
        }
        while bytes.get(p).is_some_and(u8::is_ascii_whitespace) {
            p += 1;
        }
        if source[p..].starts_with("endraw") {
            p += "endraw".len();
            while bytes.get(p).is_some_and(u8::is_ascii_whitespace) {
                p += 1;
            }
            if matches!(bytes.get(p), Some(b'-' | b'+')) {
                p += 1;
            }
            if source[p..].starts_with("%}") {
                return Some((open, p + 2));
            }
        }
        pos = open + 2;
    }
    None
}

/// The first identifier inside a tag (the statement keyword of a block tag).
pub(crate) fn first_word<'a>(source: &'a str, tag: &Tag) -> Option<&'a str> {
    match tokens(source, tag.inner.clone()).first() {
        Some(Token {
            kind: TokenKind::Ident(word),
            ..
        }) => Some(word),
        _ => None,
    }
}

// === Tokens ===

/// A token inside a tag: just enough to find names, strings and brackets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TokenKind<'a> {
    Ident(&'a str),
    Str(String),
    Punct(u8),
    Other,
}

/// A token with its byte range in the source.
#[derive(Clone, Debug)]
pub(crate) struct Token<'a> {
    pub(crate) kind: TokenKind<'a>,
    pub(crate) range: Range<usize>,
}

/// Tokenizes `range` of `source` (the inside of a tag).
pub(crate) fn tokens(source: &str, range: Range<usize>) -> Vec<Token<'_>> {
    let bytes = source.as_bytes();
    let mut out = Vec::new();
    let mut pos = range.start;
    while pos < range.end {
        let c = bytes[pos];
        let start = pos;
        if c.is_ascii_whitespace() {
            pos += 1;
            continue;
        }
        let kind = if c.is_ascii_alphabetic() || c == b'_' {
            while pos < range.end && (bytes[pos].is_ascii_alphanumeric() || bytes[pos] == b'_') {
                pos += 1;
            }
            TokenKind::Ident(&source[start..pos])
        } else if c.is_ascii_digit() {
            while pos < range.end && (bytes[pos].is_ascii_alphanumeric() || bytes[pos] == b'_') {
                pos += 1;
            }
            TokenKind::Other
        } else if c == b'"' || c == b'\'' {
            pos += 1;
            let mut text = Vec::new();
            while pos < range.end && bytes[pos] != c {
                if bytes[pos] == b'\\' && pos + 1 < range.end {
                    pos += 1;
                    text.push(match bytes[pos] {
                        b'n' => b'\n',
                        b't' => b'\t',
                        b'r' => b'\r',
                        other => other,
                    });
                } else {
                    text.push(bytes[pos]);
                }
                pos += 1;
            }
            pos = (pos + 1).min(range.end);
            TokenKind::Str(String::from_utf8_lossy(&text).into_owned())
        } else if c.is_ascii() {
            pos += 1;
            TokenKind::Punct(c)
        } else {
            pos += source[pos..].chars().next().map_or(1, char::len_utf8);
            TokenKind::Other
        };
        out.push(Token {
            kind,
            range: start..pos,
        });
    }
    out
}

// === Analysis ===

/// What a template refers to, found without rendering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ReferenceKind {
    /// `include`, `import`, `from` or `extends` with literal names (a list for
    /// `include [..]`, which takes the first that exists).
    Template {
        keyword: &'static str,
        names: Vec<String>,
        ignore_missing: bool,
    },
    /// `render_glob("pattern")` with a literal pattern.
    Glob(String),
    /// `resources.<name>` or `resources["name"]`.
    Resource(String),
}

/// A reference and the byte offset (in the original source) where it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reference {
    pub(crate) kind: ReferenceKind,
    pub(crate) offset: usize,
}

/// A problem the scanner itself detects (misuse of `render_glob`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ScanError {
    pub(crate) message: String,
    pub(crate) offset: usize,
}

/// One replacement made while instrumenting: `len` bytes at `original` (in the
/// original source) became `new_len` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Edit {
    pub(crate) original: usize,
    pub(crate) len: usize,
    pub(crate) new_len: usize,
}

/// A template source prepared for rendering, with what the scan found.
#[derive(Clone, Debug)]
pub(crate) struct Instrumented {
    /// The source with line markers and the `render_glob` rewrite.
    pub(crate) source: String,
    /// Edits in ascending order, to map offsets back to the original source.
    pub(crate) edits: Vec<Edit>,
    pub(crate) references: Vec<Reference>,
    pub(crate) errors: Vec<ScanError>,
}

impl Instrumented {
    /// Maps a byte offset of the instrumented source back to the original source.
    /// Offsets inside an inserted marker or a rewrite map to its start.
    pub(crate) fn original_offset(&self, offset: usize) -> usize {
        let mut shift: isize = 0;
        for edit in &self.edits {
            let start = (edit.original as isize + shift) as usize;
            if offset < start {
                break;
            }
            if offset < start + edit.new_len {
                return edit.original;
            }
            shift += edit.new_len as isize - edit.len as isize;
        }
        (offset as isize - shift).max(0) as usize
    }
}

/// Instruments `source`: calls `marker(line)` for the marker text of each marked line
/// (`None` leaves it unmarked), rewrites `render_glob` calls and collects references.
pub(crate) fn instrument(
    source: &str,
    mut marker: impl FnMut(u32) -> Option<String>,
) -> Instrumented {
    let lines = LineIndex::new(source);
    let mut marked = vec![false; lines.len() + 1];
    let mut insertions: Vec<(usize, usize, String)> = Vec::new();
    let mut references = Vec::new();
    let mut errors = Vec::new();
    // Inside `{% set x %}`, `{% macro %}` or `{% call %}` bodies the output is captured
    // into a value the template may inspect, so no markers go there.
    let mut capture_depth = 0usize;

    let mut mark = |offset: usize, marked: &mut [bool], insertions: &mut Vec<_>| {
        let line = lines.line(offset);
        if let Some(slot) = marked.get_mut(line as usize).filter(|slot| !**slot) {
            *slot = true;
            if let Some(text) = marker(line) {
                insertions.push((offset, 0, text));
            }
        }
    };

    for piece in pieces(source) {
        match piece {
            Piece::Comment => {}
            Piece::Data(range) | Piece::Raw(range) => {
                if capture_depth > 0 {
                    continue;
                }
                let text = &source[range.clone()];
                let mut line_start = 0;
                for segment in text.split_inclusive('\n') {
                    if let Some(first) = segment.find(|c: char| !c.is_whitespace()) {
                        mark(
                            range.start + line_start + first,
                            &mut marked,
                            &mut insertions,
                        );
                    }
                    line_start += segment.len();
                }
            }
            Piece::Tag(tag) => {
                let toks = tokens(source, tag.inner.clone());
                if tag.kind == TagKind::Variable {
                    if let Some(args) = glob_call(&toks) {
                        let args_text = &source[args.clone()];
                        if let Some(pattern) = literal_argument(&toks) {
                            references.push(Reference {
                                kind: ReferenceKind::Glob(pattern),
                                offset: tag.range.start,
                            });
                        }
                        let rewrite = glob_rewrite(args_text, tag.trim_left, tag.trim_right);
                        insertions.push((tag.range.start, tag.range.len(), rewrite));
                        scan_names(&toks, 1, &mut references, &mut errors);
                        continue;
                    }
                    if capture_depth == 0 && !tag.trim_left {
                        mark(tag.range.start, &mut marked, &mut insertions);
                    }
                } else {
                    block_statement(&toks, &mut capture_depth, &mut references, tag.range.start);
                }
                scan_names(&toks, 0, &mut references, &mut errors);
            }
        }
    }

    insertions.sort_by_key(|(offset, _, _)| *offset);
    let mut out = String::with_capacity(source.len() + insertions.len() * 12);
    let mut edits = Vec::with_capacity(insertions.len());
    let mut pos = 0;
    for (offset, len, text) in insertions {
        out.push_str(&source[pos..offset]);
        out.push_str(&text);
        edits.push(Edit {
            original: offset,
            len,
            new_len: text.len(),
        });
        pos = offset + len;
    }
    out.push_str(&source[pos..]);
    Instrumented {
        source: out,
        edits,
        references,
        errors,
    }
}

/// The filter the literal rewrite calls (see [`trust_literals`]).
pub(crate) const LITERAL_FILTER: &str = "__literal";

/// Block tags whose string literals name templates or blocks, and stay literal.
const NAMING_TAGS: &[&str] = &["include", "import", "extends", "from", "filter", "block"];

/// Makes the string literals written in tags trusted text: every literal that holds
/// a byte the escaping would change ([`super::escape::needs_escaping`]) becomes
/// `("literal"|__literal)`, a string the engine prints as it is, so
/// `{{ " proto h2" if grpc }}` and `hosts | join(" ")` print what the template's
/// author wrote. Literals that name templates stay as they are, and the rewrite adds
/// no line breaks (every line keeps its number). `None` when nothing was rewritten.
pub(crate) fn trust_literals(source: &str) -> Option<String> {
    let mut out = String::new();
    let mut pos = 0;
    for piece in pieces(source) {
        let Piece::Tag(tag) = piece else {
            continue;
        };
        let toks = tokens(source, tag.inner.clone());
        if tag.kind == TagKind::Block
            && matches!(
                toks.first(),
                Some(Token { kind: TokenKind::Ident(word), .. }) if NAMING_TAGS.contains(word)
            )
        {
            continue;
        }
        for tok in &toks {
            let TokenKind::Str(text) = &tok.kind else {
                continue;
            };
            if !super::escape::needs_escaping(text) {
                continue;
            }
            if out.is_empty() {
                out.reserve(source.len() + 64);
            }
            out.push_str(&source[pos..tok.range.start]);
            out.push('(');
            out.push_str(&source[tok.range.clone()]);
            out.push('|');
            out.push_str(LITERAL_FILTER);
            out.push(')');
            pos = tok.range.end;
        }
    }
    if pos == 0 {
        return None;
    }
    out.push_str(&source[pos..]);
    Some(out)
}

/// The filter the fragment rewrite calls (see [`rewrite_includes`]).
pub(crate) const FRAGMENT_FILTER: &str = "__fragment";

/// Rewrites every `{% include "name" %}` (one literal name, nothing else in the tag)
/// whose snippet `cacheable` accepts into `{% filter __fragment("name") %}{% endfilter %}`,
/// which prints the snippet's output through the fragment cache. The rewrite keeps the
/// tag's whitespace control (`-`, `+`), stays a block tag (so `trimBlocks` and
/// `lstripBlocks` treat it as before) and keeps its line breaks, so every later line
/// keeps its number. `None` when nothing was rewritten.
pub(crate) fn rewrite_includes(source: &str, cacheable: &dyn Fn(&str) -> bool) -> Option<String> {
    let mut out = String::with_capacity(source.len());
    let mut pos = 0;
    for piece in pieces(source) {
        let Piece::Tag(tag) = piece else {
            continue;
        };
        let Some(name) = literal_include(source, &tag).filter(|name| cacheable(name)) else {
            continue;
        };
        let open = &source[tag.range.start..tag.inner.start];
        let close = &source[tag.inner.end..tag.range.end];
        let breaks = "\n".repeat(source[tag.range.clone()].matches('\n').count());
        out.push_str(&source[pos..tag.range.start]);
        out.push_str(&format!(
            "{open} filter {FRAGMENT_FILTER}(\"{name}\"){breaks} %}}{{% endfilter {close}"
        ));
        pos = tag.range.end;
    }
    if pos == 0 {
        return None;
    }
    out.push_str(&source[pos..]);
    Some(out)
}

/// The snippet of `{% include "name" %}`: one literal, plain name (letters, digits,
/// `-`, `_`, `.`, `/`) and nothing else in the tag.
fn literal_include(source: &str, tag: &Tag) -> Option<String> {
    if tag.kind != TagKind::Block {
        return None;
    }
    let toks = tokens(source, tag.inner.clone());
    let [
        Token {
            kind: TokenKind::Ident("include"),
            ..
        },
        Token {
            kind: TokenKind::Str(name),
            ..
        },
    ] = toks.as_slice()
    else {
        return None;
    };
    let plain = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    plain.then(|| name.clone())
}

/// The filter a rewritten loop calls (see [`rewrite_loops`]).
pub(crate) const LOOP_FILTER: &str = "__loop";

/// The filter of a loop's probe (see [`LoopSite::probe`]).
pub(crate) const LOOP_PROBE_FILTER: &str = "__loop_probe";

/// A loop of a file's own template, outside every other block, that includes one
/// snippet for each object of a resource list:
///
/// ```jinja
/// {% for svc in resources.services.list() | sort_by("metadata.name") %}
/// {% include "backend" %}
/// {% endfor %}
/// ```
///
/// Its body holds nothing but template data around the `include` (no other tag, no
/// comment, no `else`), and the iterable is `resources.<name>.list()`, sorted or not
/// by `sort_by` with literal paths. Each iteration then prints the same text before
/// and after the snippet's output, so the loop's output is, for each object in
/// order, that text around the snippet's output for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LoopSite {
    /// From the `for` tag to the end of the `endfor` tag.
    range: Range<usize>,
    /// The `for` tag's opening delimiter with its whitespace control (`{%-`).
    open: String,
    /// The `endfor` tag's closing delimiter with its whitespace control (`-%}`).
    close: String,
    /// The loop variable.
    pub(crate) var: String,
    /// The iterable, as written.
    pub(crate) iter: String,
    /// The included snippet.
    pub(crate) snippet: String,
    /// The loop over one item, with the `include` replaced by the probe filter:
    /// renders to the text before the snippet's output, [`LOOP_PROBE_FILTER`]'s
    /// output, and the text after it.
    pub(crate) probe: String,
}

/// Finds the [loops](LoopSite) of `source` whose snippet `cacheable` accepts.
pub(crate) fn find_loops(source: &str, cacheable: &dyn Fn(&str) -> bool) -> Vec<LoopSite> {
    let pieces = pieces(source);
    let mut found = Vec::new();
    let mut depth = 0usize;
    let mut index = 0;
    while index < pieces.len() {
        let Piece::Tag(tag) = &pieces[index] else {
            index += 1;
            continue;
        };
        if tag.kind != TagKind::Block {
            index += 1;
            continue;
        }
        if depth == 0
            && let Some((site, next)) = loop_at(source, &pieces, index, cacheable)
        {
            found.push(site);
            index = next;
            continue;
        }
        let toks = tokens(source, tag.inner.clone());
        match toks.first().map(|t| &t.kind) {
            Some(TokenKind::Ident(
                "for" | "if" | "macro" | "call" | "filter" | "block" | "with" | "autoescape",
            )) => depth += 1,
            Some(TokenKind::Ident("set")) if !has_assignment(&toks) => depth += 1,
            Some(TokenKind::Ident(word)) if word.starts_with("end") => {
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        index += 1;
    }
    found
}

/// The loop starting at `pieces[start]`, if it is one, and the index after it.
fn loop_at(
    source: &str,
    pieces: &[Piece],
    start: usize,
    cacheable: &dyn Fn(&str) -> bool,
) -> Option<(LoopSite, usize)> {
    let Piece::Tag(head) = &pieces[start] else {
        return None;
    };
    let toks = tokens(source, head.inner.clone());
    let (var, iter) = loop_head(source, &toks)?;
    // The body: data, the include, data, then `endfor`.
    let mut at = start + 1;
    let data = |at: &mut usize| match pieces.get(*at) {
        Some(Piece::Data(range)) => {
            *at += 1;
            range.clone()
        }
        _ => 0..0,
    };
    let before = data(&mut at);
    let Some(Piece::Tag(include)) = pieces.get(at) else {
        return None;
    };
    at += 1;
    let snippet = literal_include(source, include).filter(|name| cacheable(name))?;
    let after = data(&mut at);
    let Some(Piece::Tag(end)) = pieces.get(at) else {
        return None;
    };
    let end_toks = tokens(source, end.inner.clone());
    if end.kind != TagKind::Block
        || !matches!(
            end_toks.as_slice(),
            [Token {
                kind: TokenKind::Ident("endfor"),
                ..
            }]
        )
    {
        return None;
    }
    let open = source[head.range.start..head.inner.start].to_string();
    let close = source[end.inner.end..end.range.end].to_string();
    let probe = format!(
        "{open} for {var} in [0] {}{}{} filter {LOOP_PROBE_FILTER} %}}{{% endfilter {}{}{}",
        &source[head.inner.end..head.range.end],
        &source[before],
        &source[include.range.start..include.inner.start],
        &source[include.inner.end..include.range.end],
        &source[after],
        &source[end.range.clone()],
    );
    let site = LoopSite {
        range: head.range.start..end.range.end,
        open,
        close,
        var: var.to_string(),
        iter: iter.to_string(),
        snippet,
        probe,
    };
    Some((site, at + 1))
}

/// `for <var> in resources.<name>.list()`, optionally followed by
/// `| sort_by("path", ...)` with literal paths, and nothing else: the variable and
/// the iterable as written.
fn loop_head<'a>(source: &'a str, toks: &[Token<'a>]) -> Option<(&'a str, &'a str)> {
    use TokenKind::{Ident, Punct, Str};
    let [
        Token {
            kind: Ident("for"), ..
        },
        Token {
            kind: Ident(var), ..
        },
        Token {
            kind: Ident("in"), ..
        },
        iterable @ ..,
    ] = toks
    else {
        return None;
    };
    if matches!(*var, "loop" | "resources" | "in" | "for") {
        return None;
    }
    let (list, rest) = iterable.split_at_checked(6)?;
    let [
        Token {
            kind: Ident("resources"),
            ..
        },
        Token {
            kind: Punct(b'.'), ..
        },
        Token { kind: Ident(_), .. },
        Token {
            kind: Punct(b'.'), ..
        },
        Token {
            kind: Ident("list"),
            ..
        },
        Token {
            kind: Punct(b'('), ..
        },
    ] = list
    else {
        return None;
    };
    let rest = match rest {
        [
            Token {
                kind: Punct(b')'), ..
            },
            rest @ ..,
        ] => rest,
        _ => return None,
    };
    match rest {
        [] => {}
        [
            Token {
                kind: Punct(b'|'), ..
            },
            Token {
                kind: Ident("sort_by"),
                ..
            },
            Token {
                kind: Punct(b'('), ..
            },
            args @ ..,
            Token {
                kind: Punct(b')'), ..
            },
        ] => {
            // "path" (, "path")*
            let literal = |t: &Token<'_>| matches!(t.kind, Str(_));
            let comma = |t: &Token<'_>| matches!(t.kind, Punct(b','));
            let well_formed = !args.is_empty()
                && args.len() % 2 == 1
                && args
                    .iter()
                    .enumerate()
                    .all(|(i, t)| if i % 2 == 0 { literal(t) } else { comma(t) });
            if !well_formed {
                return None;
            }
        }
        _ => return None,
    }
    let first = iterable.first()?.range.start;
    let last = toks.last()?.range.end;
    Some((var, &source[first..last]))
}

/// Replaces each loop of `sites` (found in `source` by [`find_loops`], the `n`th
/// with number `numbers[n]`) with `{% filter __loop(number) %}{% endfilter %}`,
/// keeping the whitespace control of its `for` and `endfor` tags and its line
/// breaks, so every later line keeps its number.
pub(crate) fn rewrite_loops(source: &str, sites: &[(usize, &LoopSite)]) -> String {
    let mut out = String::with_capacity(source.len());
    let mut pos = 0;
    for (number, site) in sites {
        let breaks = "\n".repeat(source[site.range.clone()].matches('\n').count());
        out.push_str(&source[pos..site.range.start]);
        out.push_str(&format!(
            "{} filter {LOOP_FILTER}({number}){breaks} %}}{{% endfilter {}",
            site.open, site.close
        ));
        pos = site.range.end;
    }
    out.push_str(&source[pos..]);
    out
}

/// `render_glob(...)` as the whole content of a `{{ }}` tag: the byte range of the
/// arguments.
fn glob_call(toks: &[Token<'_>]) -> Option<Range<usize>> {
    let [first, open, .., close] = toks else {
        return None;
    };
    if first.kind != TokenKind::Ident("render_glob")
        || open.kind != TokenKind::Punct(b'(')
        || close.kind != TokenKind::Punct(b')')
    {
        return None;
    }
    // The closing parenthesis must match the opening one.
    let mut depth = 0usize;
    for (index, tok) in toks.iter().enumerate().skip(1) {
        match tok.kind {
            TokenKind::Punct(b'(' | b'[' | b'{') => depth += 1,
            TokenKind::Punct(b')' | b']' | b'}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 && index != toks.len() - 1 {
                    return None;
                }
            }
            _ => {}
        }
    }
    Some(open.range.end..close.range.start)
}

/// The pattern of `render_glob("literal")`.
fn literal_argument(toks: &[Token<'_>]) -> Option<String> {
    match toks {
        [
            _,
            _,
            Token {
                kind: TokenKind::Str(pattern),
                ..
            },
            _,
        ] => Some(pattern.clone()),
        _ => None,
    }
}

/// Every matching snippet, included in name order and separated by newlines, with the
/// whitespace behaviour of the `{{ }}` tag it replaces (never trimmed by
/// `trimBlocks`/`lstripBlocks`, trimmed by `-` where the tag had one). Stays on the
/// lines the arguments were written on.
fn glob_rewrite(args: &str, trim_left: bool, trim_right: bool) -> String {
    let left = if trim_left { '-' } else { '+' };
    let right = if trim_right { '-' } else { '+' };
    format!(
        "{{%{left} for {GLOB_LOOP_VAR} in {GLOB_HELPER}({args}) +%}}\
         {{%+ if not loop.first +%}}{{{{ \"\\n\" }}}}{{%+ endif +%}}\
         {{%+ include {GLOB_LOOP_VAR} +%}}{{%+ endfor {right}%}}"
    )
}

/// Tracks capture blocks and records literal template references of a block tag.
fn block_statement(
    toks: &[Token<'_>],
    capture_depth: &mut usize,
    references: &mut Vec<Reference>,
    offset: usize,
) {
    let Some(Token {
        kind: TokenKind::Ident(keyword),
        ..
    }) = toks.first()
    else {
        return;
    };
    match *keyword {
        "set" if !has_assignment(toks) => *capture_depth += 1,
        "macro" | "call" => *capture_depth += 1,
        "endset" | "endmacro" | "endcall" => *capture_depth = capture_depth.saturating_sub(1),
        "include" | "import" | "from" | "extends" => {
            let keyword: &'static str = match *keyword {
                "include" => "include",
                "import" => "import",
                "from" => "from",
                _ => "extends",
            };
            let names = match &toks[1..] {
                [
                    Token {
                        kind: TokenKind::Str(name),
                        ..
                    },
                    ..,
                ] => vec![name.clone()],
                [
                    Token {
                        kind: TokenKind::Punct(b'['),
                        ..
                    },
                    rest @ ..,
                ] => {
                    let mut names = Vec::new();
                    for tok in rest {
                        match &tok.kind {
                            TokenKind::Str(name) => names.push(name.clone()),
                            TokenKind::Punct(b',') => {}
                            TokenKind::Punct(b']') => break,
                            // Not a literal list: checked at render time.
                            _ => return,
                        }
                    }
                    names
                }
                _ => return,
            };
            let ignore_missing = toks.windows(2).any(|w| {
                w[0].kind == TokenKind::Ident("ignore") && w[1].kind == TokenKind::Ident("missing")
            });
            references.push(Reference {
                kind: ReferenceKind::Template {
                    keyword,
                    names,
                    ignore_missing,
                },
                offset,
            });
        }
        _ => {}
    }
}

/// Whether a `set` statement assigns (`set x = ...`) rather than captures a block.
fn has_assignment(toks: &[Token<'_>]) -> bool {
    let mut depth = 0usize;
    for (index, tok) in toks.iter().enumerate() {
        match tok.kind {
            TokenKind::Punct(b'(' | b'[' | b'{') => depth += 1,
            TokenKind::Punct(b')' | b']' | b'}') => depth = depth.saturating_sub(1),
            TokenKind::Punct(b'=') if depth == 0 => {
                let before = index
                    .checked_sub(1)
                    .and_then(|i| toks.get(i))
                    .map(|t| &t.kind);
                let after = toks.get(index + 1).map(|t| &t.kind);
                let compound = matches!(before, Some(TokenKind::Punct(b'=' | b'!' | b'<' | b'>')))
                    || matches!(after, Some(TokenKind::Punct(b'=')));
                if !compound {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// Records `resources.<name>` / `resources["name"]` and flags `render_glob` used
/// anywhere but as a whole `{{ }}` expression. Starts at token `from`.
fn scan_names(
    toks: &[Token<'_>],
    from: usize,
    references: &mut Vec<Reference>,
    errors: &mut Vec<ScanError>,
) {
    for index in from..toks.len() {
        let TokenKind::Ident(name) = toks[index].kind else {
            continue;
        };
        let after_dot = index
            .checked_sub(1)
            .is_some_and(|i| toks[i].kind == TokenKind::Punct(b'.'));
        if after_dot {
            continue;
        }
        match name {
            "resources" => {
                let resource = match (toks.get(index + 1), toks.get(index + 2)) {
                    (
                        Some(Token {
                            kind: TokenKind::Punct(b'.'),
                            ..
                        }),
                        Some(Token {
                            kind: TokenKind::Ident(name),
                            ..
                        }),
                    ) => Some((*name).to_owned()),
                    (
                        Some(Token {
                            kind: TokenKind::Punct(b'['),
                            ..
                        }),
                        Some(Token {
                            kind: TokenKind::Str(name),
                            ..
                        }),
                    ) => Some(name.clone()),
                    _ => None,
                };
                if let Some(resource) = resource {
                    references.push(Reference {
                        kind: ReferenceKind::Resource(resource),
                        offset: toks[index].range.start,
                    });
                }
            }
            "render_glob" => errors.push(ScanError {
                message: "render_glob(...) must be used on its own, as `{{ render_glob(\"pattern\") }}`; \
                          wrap it in `{% filter ... %}` to post-process its output"
                    .to_owned(),
                offset: toks[index].range.start,
            }),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(source: &str) -> String {
        instrument(source, |line| Some(format!("<{line}>"))).source
    }

    #[test]
    fn marks_the_first_content_of_each_data_line() {
        assert_eq!(marks("a\n  b\n\nc"), "<1>a\n  <2>b\n\n<4>c");
    }

    #[test]
    fn marks_variables_but_not_blocks_and_not_left_trimmed_tags() {
        assert_eq!(
            marks("{% if x %}\n  {{ y }} z\n{%- endif %}\n{{- w }}"),
            "{% if x %}\n  <2>{{ y }} z\n{%- endif %}\n{{- w }}"
        );
        assert_eq!(marks("{% if a %}b{% endif %}"), "{% if a %}<1>b{% endif %}");
    }

    #[test]
    fn no_markers_inside_capturing_blocks() {
        assert_eq!(
            marks(
                "{% set x %}\na\n{% endset %}\n{% set y = 1 %}\nb\n{% macro m() %}c{% endmacro %}"
            ),
            "{% set x %}\na\n{% endset %}\n{% set y = 1 %}\n<5>b\n{% macro m() %}c{% endmacro %}"
        );
    }

    #[test]
    fn comments_and_strings_hide_delimiters() {
        assert_eq!(marks("{# {{ x }} #}a"), "{# {{ x }} #}<1>a");
        assert_eq!(marks("{{ '}}' }}b"), "<1>{{ '}}' }}b");
        assert_eq!(marks("{{ {'a': {'b': 1}} }}"), "<1>{{ {'a': {'b': 1}} }}");
    }

    #[test]
    fn raw_blocks_are_data() {
        assert_eq!(
            marks("{% raw %}\n{{ x }}\n{% endraw %}"),
            "{% raw %}\n<2>{{ x }}\n{% endraw %}"
        );
    }

    #[test]
    fn render_glob_is_rewritten_and_recorded() {
        let out = instrument("x\n  {{- render_glob('be-*') }}\n", |_| None);
        assert!(
            out.source
                .starts_with("x\n  {%- for __glob_snippet in __render_glob('be-*') +%}")
        );
        assert!(out.source.ends_with("{%+ endfor +%}\n"));
        assert_eq!(out.references[0].kind, ReferenceKind::Glob("be-*".into()));
        assert!(out.errors.is_empty());

        let misuse = instrument("{{ render_glob('a') | upper }}", |_| None);
        assert_eq!(misuse.errors.len(), 1);
    }

    #[test]
    fn finds_template_and_resource_references() {
        let out = instrument(
            "{% include 'a' %}{% include ['b', 'c'] ignore missing %}{% from \"m\" import x %}\
             {{ resources.services.list() }}{{ resources['endpoints'] }}{{ x.resources.y }}{% include name %}",
            |_| None,
        );
        let kinds: Vec<_> = out.references.iter().map(|r| r.kind.clone()).collect();
        assert_eq!(
            kinds,
            vec![
                ReferenceKind::Template {
                    keyword: "include",
                    names: vec!["a".into()],
                    ignore_missing: false
                },
                ReferenceKind::Template {
                    keyword: "include",
                    names: vec!["b".into(), "c".into()],
                    ignore_missing: true
                },
                ReferenceKind::Template {
                    keyword: "from",
                    names: vec!["m".into()],
                    ignore_missing: false
                },
                ReferenceKind::Resource("services".into()),
                ReferenceKind::Resource("endpoints".into()),
            ]
        );
    }

    #[test]
    fn cacheable_includes_become_fragment_filters_on_the_same_lines() {
        let source = "a\n  {%- include 'x' +%}\n{% include 'y' %}{% include 'x' ignore missing %}{% include\n'x' %}";
        let out = rewrite_includes(source, &|name| name == "x").expect("rewritten");
        assert_eq!(
            out,
            "a\n  {%- filter __fragment(\"x\") %}{% endfilter +%}\n{% include 'y' %}\
             {% include 'x' ignore missing %}{% filter __fragment(\"x\")\n %}{% endfilter %}"
        );
        assert_eq!(
            rewrite_includes("{% include 'y' %}", &|name| name == "x"),
            None
        );
    }

    #[test]
    fn loops_over_a_list_including_one_snippet_become_loop_filters_on_the_same_lines() {
        let source = "a\n{%- for s in resources.services.list() | sort_by(\"metadata.name\", '-x') %}\n\n{% include 'x' %}\n{%- endfor +%}\nb";
        let sites = find_loops(source, &|name| name == "x");
        assert_eq!(sites.len(), 1);
        let site = &sites[0];
        assert_eq!(site.var, "s");
        assert_eq!(
            site.iter,
            "resources.services.list() | sort_by(\"metadata.name\", '-x')"
        );
        assert_eq!(site.snippet, "x");
        assert_eq!(
            site.probe,
            "{%- for s in [0] %}\n\n{% filter __loop_probe %}{% endfilter %}\n{%- endfor +%}"
        );
        let out = rewrite_loops(source, &[(7, site)]);
        assert_eq!(out, "a\n{%- filter __loop(7)\n\n\n %}{% endfilter +%}\nb");
        assert_eq!(out.matches('\n').count(), source.matches('\n').count());
    }

    #[test]
    fn only_plain_top_level_loops_over_a_list_are_found() {
        let found = |source: &str| find_loops(source, &|name| name == "x").len();
        let plain = "{% for s in resources.a.list() %}{% include 'x' %}{% endfor %}";
        assert_eq!(found(plain), 1);
        for source in [
            // Not cacheable, or more than the include in the body.
            "{% for s in resources.a.list() %}{% include 'y' %}{% endfor %}",
            "{% for s in resources.a.list() %}{{ s }}{% include 'x' %}{% endfor %}",
            "{% for s in resources.a.list() %}{# c #}{% include 'x' %}{% endfor %}",
            "{% for s in resources.a.list() %}{% include 'x' %}{% else %}{% endfor %}",
            // Another iterable, a filter, a condition, `recursive`, unpacking.
            "{% for s in resources.a.fetch('n') %}{% include 'x' %}{% endfor %}",
            "{% for s in resources.a.list() | reverse %}{% include 'x' %}{% endfor %}",
            "{% for s in resources.a.list() | sort_by(p) %}{% include 'x' %}{% endfor %}",
            "{% for s in resources.a.list() if s %}{% include 'x' %}{% endfor %}",
            "{% for s in resources.a.list() recursive %}{% include 'x' %}{% endfor %}",
            "{% for k, v in resources.a.list() %}{% include 'x' %}{% endfor %}",
            "{% for loop in resources.a.list() %}{% include 'x' %}{% endfor %}",
            // Inside another block.
            "{% if y %}{% for s in resources.a.list() %}{% include 'x' %}{% endfor %}{% endif %}",
            "{% set c %}{% for s in resources.a.list() %}{% include 'x' %}{% endfor %}{% endset %}",
            "{% macro m() %}{% for s in resources.a.list() %}{% include 'x' %}{% endfor %}{% endmacro %}",
        ] {
            assert_eq!(found(source), 0, "{source}");
        }
        // After a closed block, and after an assigning `set`, loops are found again.
        let after = format!("{{% if y %}}{{% endif %}}{{% set z = 1 %}}{plain}");
        assert_eq!(found(&after), 1);
    }

    #[test]
    fn maps_offsets_back_through_edits() {
        let out = instrument("ab\ncd", |_| Some("##".into()));
        assert_eq!(out.source, "##ab\n##cd");
        assert_eq!(out.original_offset(0), 0);
        assert_eq!(out.original_offset(2), 0);
        assert_eq!(out.original_offset(3), 1);
        assert_eq!(out.original_offset(5), 3);
        assert_eq!(out.original_offset(7), 3);
        assert_eq!(out.original_offset(8), 4);
    }

    #[test]
    fn line_index_lines_columns_and_text() {
        let src = "ab\ncdé\n";
        let index = LineIndex::new(src);
        assert_eq!(index.line(0), 1);
        assert_eq!(index.line(3), 2);
        assert_eq!(index.column(src, 5), 3);
        assert_eq!(index.text(src, 2), Some("cdé"));
        assert_eq!(index.text(src, 9), None);
    }

    #[test]
    fn literals_with_special_bytes_become_trusted_and_template_names_stay_literal() {
        let src = "{{ \" proto h2\" if g }}{{ 'plain' }}{% set s = \"%[path]\" %}\n\
                   {% include \"a b\" %}{% from \"x y\" import m %}{# \" c\" #} \" d\"";
        let out = trust_literals(src).expect("rewritten");
        assert_eq!(
            out,
            "{{ (\" proto h2\"|__literal) if g }}{{ 'plain' }}{% set s = (\"%[path]\"|__literal) %}\n\
             {% include \"a b\" %}{% from \"x y\" import m %}{# \" c\" #} \" d\""
        );
        assert_eq!(trust_literals("{{ 'a' ~ x }} plain text"), None);
    }
}
