//! hapwright's template functions and filters, and the Jinja2-compatible value
//! formatter.
//!
//! Functions: `fail(msg)`, `path(name)`, `render_glob(pattern)` (rewritten at load,
//! see [`super::scan`]). Filters: `b64decode`, `glob_match` (also a test),
//! `haproxy_escape`, `regex_escape`, `sort_by`, `tojson` (Jinja2's: keys sorted,
//! HTML-safe), `trusted` (the opt-out of escaping, see [`super::escape`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use base64::Engine;
use minijinja::value::{Kwargs, Rest, Value, ValueKind, ValueOrKwargs};
use minijinja::{Environment, Error, ErrorKind, Output, State};

use super::OutputSyntax;
use super::context::{ResourceList, ResourceStore};
use super::escape;
use super::lazy::View;
use super::scan::{GLOB_HELPER, LITERAL_FILTER};

/// The filters [`register`] adds (kept in step with it by a test in `check`).
pub(crate) const FILTERS: &[&str] = &[
    "b64decode",
    "glob_match",
    "haproxy_escape",
    "map_lines",
    "regex_escape",
    "sort_by",
    "tojson",
    "trusted",
];

/// The tests [`register`] adds.
pub(crate) const TESTS: &[&str] = &["glob_match"];

/// Registers every hapwright function and filter, and the formatter.
pub(crate) fn register(
    env: &mut Environment<'static>,
    snippets: Arc<Vec<String>>,
    paths: Arc<BTreeMap<String, Vec<String>>>,
    output: OutputSyntax,
) {
    match output {
        OutputSyntax::Haproxy => env.set_formatter(format_haproxy),
        OutputSyntax::Plain => env.set_formatter(format_value),
    }
    env.add_filter(LITERAL_FILTER, trust);
    env.add_filter("trusted", trust);
    env.add_filter("haproxy_escape", haproxy_escape);
    env.add_function("fail", fail);
    env.add_function("path", move |name: &str| path(&paths, name));
    let globs = GlobCache::new(snippets);
    env.add_function(GLOB_HELPER, move |pattern: &str| globs.matching(pattern));
    env.add_function("render_glob", |_: Rest<Value>| -> Result<Value, Error> {
        Err(Error::new(
            ErrorKind::InvalidOperation,
            "render_glob(...) must be used on its own, as {{ render_glob(\"pattern\") }}",
        ))
    });
    env.add_filter("b64decode", b64decode);
    env.add_filter("glob_match", glob_match_filter);
    env.add_test("glob_match", glob_match_test);
    env.add_filter("regex_escape", |text: &str| regex::escape(text));
    let memos = Arc::new(LinesMemos::default());
    env.add_filter(
        "map_lines",
        move |state: &State, items: &Value, value: Option<Value>| {
            memos.print(state.name(), output, items, value.as_ref())
        },
    );
    env.add_filter("sort_by", sort_by);
    env.add_filter(
        "tojson",
        move |value: &Value, indent: Option<Value>, kwargs: Kwargs| {
            let json = tojson(value, indent, kwargs)?;
            // In HAProxy files JSON is text like any other: a resource's value inside it
            // is escaped where it lands.
            Ok::<_, Error>(match output {
                OutputSyntax::Haproxy => Value::from(json.as_str().unwrap_or_default()),
                OutputSyntax::Plain => json,
            })
        },
    );
}

/// `json` as a template value whose strings are trusted text (`extraContext`).
pub(crate) fn trusted_value(json: &serde_json::Value) -> Value {
    match json {
        serde_json::Value::String(text) => Value::from_safe_string(text.clone()),
        serde_json::Value::Array(items) => {
            Value::from(items.iter().map(trusted_value).collect::<Vec<_>>())
        }
        serde_json::Value::Object(map) => Value::from_pairs(
            map.iter()
                .map(|(key, value)| (key.as_str(), trusted_value(value))),
        ),
        other => Value::from(minijinja::value::Serde(other)),
    }
}

/// `value|trusted`: the value is written as it is, never escaped. For values the
/// template's author vouches for; `hapwright check` warns where it is applied to a
/// value that may come from a watched resource.
fn trust(value: Value) -> Value {
    if value.is_safe() {
        return value;
    }
    match value.as_str() {
        Some(text) => Value::from_safe_string(text.to_owned()),
        None => Value::from_safe_string(value.to_string()),
    }
}

/// `value|haproxy_escape("place")`: the value escaped for a place named by hand
/// (`word`, `quoted`, `single-quoted`, `logformat`, `logformat-quoted`, `comment`,
/// `map-key`, `map-value`), for text the template builds before printing it. Fails
/// like an escaped value that lands there: on a control character, or whitespace
/// in a map key.
fn haproxy_escape(value: &Value, place: &str) -> Result<Value, Error> {
    use super::escape::{MapPlace, Place, Quote};
    let config = |quote, logformat| Place {
        comment: false,
        quote,
        logformat,
    };
    let text = match value.as_str() {
        Some(text) => Cow::Borrowed(text),
        None => Cow::Owned(value.to_string()),
    };
    let mut out = Vec::with_capacity(text.len() + 8);
    let written = match place {
        "word" => escape::escape_config(&text, Place::WORD, &mut out),
        "quoted" => escape::escape_config(&text, config(Quote::Double, false), &mut out),
        "single-quoted" => escape::escape_config(&text, config(Quote::Single, false), &mut out),
        "logformat" => escape::escape_config(&text, config(Quote::None, true), &mut out),
        "logformat-quoted" => escape::escape_config(&text, config(Quote::Double, true), &mut out),
        "comment" => escape::escape_config(
            &text,
            Place {
                comment: true,
                ..Place::WORD
            },
            &mut out,
        ),
        "map-key" => escape::escape_map(&text, MapPlace::KeyStart, &mut out),
        "map-value" => escape::escape_map(&text, MapPlace::Value, &mut out),
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "haproxy_escape({other:?}): unknown place; use word, quoted, single-quoted, \
                     logformat, logformat-quoted, comment, map-key or map-value"
                ),
            ));
        }
    };
    written.map_err(|refusal| Error::new(ErrorKind::InvalidOperation, refusal.to_string()))?;
    Ok(Value::from_safe_string(
        String::from_utf8(out).expect("escaping keeps UTF-8"),
    ))
}

/// [`format_value`] for HAProxy files: an untrusted value that HAProxy could read
/// as syntax is written between value markers, to be escaped for where it lands
/// ([`super::escape`]); every other value is written as [`format_value`] writes it.
fn format_haproxy(out: &mut Output, state: &mut State, value: &Value) -> Result<(), Error> {
    let text = match value.kind() {
        ValueKind::String => match value.as_str() {
            Some(text) if value.is_safe() || !escape::needs_escaping(text) => {
                return out.write_str(text).map_err(Error::from);
            }
            Some(text) => Cow::Borrowed(text),
            None => Cow::Owned(value.to_string()),
        },
        ValueKind::None | ValueKind::Bool => return format_value(out, state, value),
        // A number prints as digits, sign, point and exponent (or inf/NaN): nothing
        // to escape, so it is written without an intermediate string.
        ValueKind::Number => return write!(out, "{value}").map_err(Error::from),
        // Lists, maps and the rest as minijinja prints them, checked like a string.
        _ => Cow::Owned(value.to_string()),
    };
    if escape::needs_escaping(&text) {
        out.write_str(&escape::wrap(&text)).map_err(Error::from)
    } else {
        out.write_str(&text).map_err(Error::from)
    }
}

/// Prints values the way Jinja2 does where minijinja differs: `None`, `True`,
/// `False`. Everything else prints as minijinja prints it (no escaping: the outputs
/// are HAProxy files, not HTML).
fn format_value(out: &mut Output, state: &mut State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        // The common case, written directly rather than through `Display`.
        ValueKind::String => match value.as_str() {
            Some(text) => out.write_str(text).map_err(Error::from),
            None => minijinja::escape_formatter(out, state, value),
        },
        ValueKind::None => out.write_str("None").map_err(Error::from),
        ValueKind::Bool => out
            .write_str(if value.is_true() { "True" } else { "False" })
            .map_err(Error::from),
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// `items | map_lines` / `items | map_lines(value)`: one line per item, what a loop
/// printing each item's parts separated by single spaces (and `value` after them)
/// prints, without the engine's cost per line (a map of 10,000 lines). An item is
/// a list of parts or one part. Each part is written as the formatter writes a
/// printed value: an untrusted value that needs it between the value markers, so
/// it is escaped where it lands (a map key or value) or refused, exactly as when
/// printed with `{{ }}`.
fn map_lines(output: OutputSyntax, items: &Value, value: Option<&Value>) -> Result<Value, Error> {
    let mut out = String::new();
    match super::context::shared_items(items) {
        Some(items) => {
            for item in items {
                print_line(&mut out, item, value, output)?;
            }
        }
        None => {
            for item in items.try_iter()? {
                print_line(&mut out, &item, value, output)?;
            }
        }
    }
    Ok(Value::from_safe_string(out))
}

/// One line of `map_lines`: the item's parts (or the item), then `value`. Parts of
/// a list are read in place where the list allows it.
fn print_line(
    out: &mut String,
    item: &Value,
    value: Option<&Value>,
    output: OutputSyntax,
) -> Result<(), Error> {
    let mut parts = |parts: &mut dyn Iterator<Item = &Value>| -> Result<(), Error> {
        for (index, part) in parts.enumerate() {
            if index > 0 {
                out.push(' ');
            }
            push_printed(out, part, output)?;
        }
        Ok(())
    };
    if item.kind() == ValueKind::Seq {
        if let Some(list) = item.downcast_object_ref::<Vec<Value>>() {
            parts(&mut list.iter())?;
        } else if let Some(list) = super::context::shared_items(item) {
            parts(&mut list.iter())?;
        } else {
            let owned: Vec<Value> = item.try_iter()?.collect();
            parts(&mut owned.iter())?;
        }
    } else {
        push_printed(out, item, output)?;
    }
    if let Some(value) = value {
        out.push(' ');
        push_printed(out, value, output)?;
    }
    out.push('\n');
    Ok(())
}

/// At most this many remembered `map_lines` outputs per template (a template that
/// prints several lists keeps one for each of the first few).
const LINES_MEMOS_PER_TEMPLATE: usize = 4;

/// What `map_lines` printed for lists built in `shared`, per template, from one
/// render to the next. A line depends only on its item and `value`, so when the
/// list of this render holds the items of a remembered one, with others added,
/// replaced or taken out between a common start and a common end, the output is
/// the remembered text around the lines of the items in between: a map of 10,000
/// lines with one host added prints one line. Items are compared by what they
/// print (a list the template built by identity first, then part by part).
#[derive(Default)]
struct LinesMemos(Mutex<HashMap<String, Vec<Arc<LinesMemo>>>>);

/// One remembered output: the items, `value`, the text and where each item's line
/// ends in it.
struct LinesMemo {
    items: imbl::Vector<Value>,
    value: Option<Value>,
    text: Value,
    ends: Vec<usize>,
}

impl LinesMemos {
    fn print(
        &self,
        template: &str,
        output: OutputSyntax,
        items: &Value,
        value: Option<&Value>,
    ) -> Result<Value, Error> {
        let Some(list) = super::context::shared_items(items) else {
            return map_lines(output, items, value);
        };
        let candidates = self.lock().get(template).cloned().unwrap_or_default();
        let best = candidates
            .iter()
            .filter(|memo| match (&memo.value, value) {
                (None, None) => true,
                (Some(old), Some(new)) => same_printed(old, new),
                _ => false,
            })
            .map(|memo| (memo, common_ends(&memo.items, list)))
            // A remembered list that shares nothing with this one is another
            // list of the template: it stays for that one.
            .filter(|(_, (prefix, suffix))| prefix + suffix > 0)
            .max_by_key(|(_, (prefix, suffix))| prefix + suffix);
        let memo = match best {
            Some((old, (prefix, suffix))) => {
                if prefix == old.items.len() && prefix == list.len() {
                    return Ok(old.text.clone());
                }
                let text = old.text.as_str().unwrap_or_default();
                let at = |ends: &[usize], count: usize| count.checked_sub(1).map_or(0, |i| ends[i]);
                let head = at(&old.ends, prefix);
                let tail = at(&old.ends, old.items.len() - suffix);
                let mut out = String::with_capacity(text.len() + 64);
                out.push_str(&text[..head]);
                let mut ends = Vec::with_capacity(list.len());
                ends.extend_from_slice(&old.ends[..prefix]);
                for item in list.iter().skip(prefix).take(list.len() - prefix - suffix) {
                    print_line(&mut out, item, value, output)?;
                    ends.push(out.len());
                }
                let shift = out.len();
                out.push_str(&text[tail..]);
                ends.extend(
                    old.ends[old.items.len() - suffix..]
                        .iter()
                        .map(|end| end - tail + shift),
                );
                LinesMemo {
                    items: list.clone(),
                    value: value.cloned(),
                    text: Value::from_safe_string(out),
                    ends,
                }
            }
            None => {
                let mut out = String::new();
                let mut ends = Vec::with_capacity(list.len());
                for item in list {
                    print_line(&mut out, item, value, output)?;
                    ends.push(out.len());
                }
                LinesMemo {
                    items: list.clone(),
                    value: value.cloned(),
                    text: Value::from_safe_string(out),
                    ends,
                }
            }
        };
        let text = memo.text.clone();
        let memo = Arc::new(memo);
        let replaced = best.map(|(old, _)| Arc::as_ptr(old));
        let mut memos = self.lock();
        let kept = memos.entry(template.to_owned()).or_default();
        match replaced.and_then(|old| kept.iter().position(|m| Arc::as_ptr(m) == old)) {
            Some(place) => kept[place] = memo,
            None => {
                if kept.len() == LINES_MEMOS_PER_TEMPLATE {
                    kept.remove(0);
                }
                kept.push(memo);
            }
        }
        Ok(text)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Arc<LinesMemo>>>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// How many items `old` and `new` share at the start and, after those, at the end
/// (items that print the same, [`same_printed`]).
fn common_ends(old: &imbl::Vector<Value>, new: &imbl::Vector<Value>) -> (usize, usize) {
    let shortest = old.len().min(new.len());
    // A list built from the last render's (a `shared.put` on the pass's list)
    // shares its storage with it but for the chunks an edit touched: the items of
    // a chunk both hold are the same values, and are not compared one by one.
    let same_chunk = |(a, b): (&[Value], &[Value])| a.len() == b.len() && std::ptr::eq(a, b);
    let shared = |chunks: &mut dyn Iterator<Item = (&[Value], &[Value])>| {
        chunks
            .take_while(|pair| same_chunk(*pair))
            .map(|(a, _)| a.len())
            .sum::<usize>()
    };
    let mut prefix = shared(&mut old.leaves().zip(new.leaves())).min(shortest);
    prefix += (prefix..shortest)
        .take_while(|&at| same_printed(&old[at], &new[at]))
        .count();
    let room = shortest - prefix;
    let mut suffix = shared(&mut old.leaves().rev().zip(new.leaves().rev())).min(room);
    suffix += (suffix..room)
        .take_while(|&back| same_printed(&old[old.len() - 1 - back], &new[new.len() - 1 - back]))
        .count();
    (prefix, suffix)
}

/// Whether `a` and `b` print the same in `map_lines` (and are refused alike):
/// strings of the same text and trust, equal numbers of the same kind, equal `none`
/// and booleans, and lists the template built whose parts are so (the same list
/// at once). Anything else is taken as different.
fn same_printed(a: &Value, b: &Value) -> bool {
    if a.kind() != b.kind() {
        return false;
    }
    match a.kind() {
        ValueKind::String => a.is_safe() == b.is_safe() && a.as_str() == b.as_str(),
        ValueKind::None | ValueKind::Bool => a == b,
        ValueKind::Number => {
            a.is_integer() == b.is_integer()
                && a == b
                && (a.is_integer() || a.to_string() == b.to_string())
        }
        ValueKind::Seq => match (
            a.downcast_object_ref::<Vec<Value>>(),
            b.downcast_object_ref::<Vec<Value>>(),
        ) {
            (Some(x), Some(y)) => {
                std::ptr::eq(x, y)
                    || (x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_printed(p, q)))
            }
            _ => false,
        },
        _ => false,
    }
}

/// Appends `value` as the formatter prints it ([`format_haproxy`], or
/// [`format_value`] for plain output).
fn push_printed(out: &mut String, value: &Value, output: OutputSyntax) -> Result<(), Error> {
    use std::fmt::Write as _;
    let text = match value.kind() {
        ValueKind::Undefined => {
            return Err(Error::new(
                ErrorKind::UndefinedError,
                "map_lines: an item or part is undefined",
            ));
        }
        ValueKind::None => Cow::Borrowed("None"),
        ValueKind::Bool => Cow::Borrowed(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => {
            return write!(out, "{value}").map_err(|_| fmt_error());
        }
        ValueKind::String => match value.as_str() {
            Some(text) if value.is_safe() => {
                out.push_str(text);
                return Ok(());
            }
            Some(text) => Cow::Borrowed(text),
            None => Cow::Owned(value.to_string()),
        },
        _ => Cow::Owned(value.to_string()),
    };
    if output == OutputSyntax::Haproxy && escape::needs_escaping(&text) {
        out.push_str(&escape::wrap(&text));
    } else {
        out.push_str(&text);
    }
    Ok(())
}

fn fmt_error() -> Error {
    Error::new(ErrorKind::WriteFailure, "map_lines: formatting failed")
}

/// `fail("message")`: stops the render with this message, at this line.
fn fail(message: Value) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "fail(): {}",
            message
                .as_str()
                .map_or_else(|| message.to_string(), str::to_owned)
        ),
    ))
}

/// `path("hosts.map")` → `maps/hosts.map`: where a rendered map, file or certificate
/// lands, relative to the instance's config directory.
fn path(paths: &BTreeMap<String, Vec<String>>, name: &str) -> Result<Value, Error> {
    match paths.get(name).map(Vec::as_slice) {
        Some([only]) => Ok(Value::from(only.as_str())),
        Some(several) => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "path({name:?}) is ambiguous: {}; rename one of them",
                several.join(", ")
            ),
        )),
        None => {
            let known: Vec<&str> = paths.keys().map(String::as_str).collect();
            Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "path({name:?}): no map, file or certificate has this name (known: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            ))
        }
    }
}

/// The sorted snippet names matching each `render_glob` pattern, computed once.
struct GlobCache {
    snippets: Arc<Vec<String>>,
    cache: Mutex<HashMap<String, Value>>,
}

impl GlobCache {
    fn new(snippets: Arc<Vec<String>>) -> Self {
        Self {
            snippets,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn matching(&self, pattern: &str) -> Result<Value, Error> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(names) = cache.get(pattern) {
            return Ok(names.clone());
        }
        let matcher = compile_glob(pattern, "render_glob")?;
        let names: Vec<Value> = self
            .snippets
            .iter()
            .filter(|name| matcher.is_match(name.as_str()))
            .map(|name| Value::from(name.as_str()))
            .collect();
        let names = Value::from(names);
        cache.insert(pattern.to_owned(), names.clone());
        Ok(names)
    }
}

/// Compiles a glob: `*` and `?` match any characters including `/`, `[..]` classes,
/// `{a,b}` alternatives.
pub(crate) fn compile_glob(pattern: &str, what: &str) -> Result<globset::GlobMatcher, Error> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(false)
        .build()
        .map(|glob| glob.compile_matcher())
        .map_err(|error| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("{what}: invalid glob pattern {pattern:?}: {error}"),
            )
        })
}

/// `value | b64decode`: standard base64 (padding optional, whitespace ignored) to text.
fn b64decode(value: &str) -> Result<String, Error> {
    let compact: String = value.chars().filter(|c| !c.is_whitespace()).collect();
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let bytes = engine.decode(compact.as_bytes()).map_err(|error| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("b64decode: input is not valid base64: {error}"),
        )
    })?;
    String::from_utf8(bytes).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            "b64decode: the decoded bytes are not UTF-8 text",
        )
    })
}

/// `name | glob_match("web-*")` → bool; `names | glob_match("web-*")` → the matching
/// names.
fn glob_match_filter(value: &Value, pattern: &str) -> Result<Value, Error> {
    let matcher = compile_glob(pattern, "glob_match")?;
    if let Some(text) = value.as_str() {
        return Ok(Value::from(matcher.is_match(text)));
    }
    match value.kind() {
        ValueKind::Seq | ValueKind::Iterable => Ok(Value::from(
            value
                .try_iter()?
                .filter(|item| item.as_str().is_some_and(|s| matcher.is_match(s)))
                .collect::<Vec<_>>(),
        )),
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("glob_match: expected a string or a list of strings, got {kind}"),
        )),
    }
}

/// `name is glob_match("web-*")`.
fn glob_match_test(value: &str, pattern: &str) -> Result<bool, Error> {
    Ok(compile_glob(pattern, "glob_match")?.is_match(value))
}

/// One sort key of `sort_by`: a dotted attribute path (validated once per call),
/// descending when written with a leading `-`.
struct SortKey<'a> {
    path: &'a str,
    descending: bool,
}

impl<'a> SortKey<'a> {
    fn parse(text: &'a str) -> Result<Self, Error> {
        let (descending, path) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        if path.is_empty() || path.split('.').any(str::is_empty) {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("sort_by: invalid attribute path {text:?}"),
            ));
        }
        Ok(Self { path, descending })
    }

    /// The key of one item: the value at the path, `none` where it is missing. A
    /// numeric segment indexes a list.
    fn extract(&self, item: &Value) -> Value {
        fn step(base: &Value, segment: &str) -> Option<Value> {
            let next = match base.kind() {
                ValueKind::Seq => match segment.parse::<i64>() {
                    Ok(index) => base.get_item(&Value::from(index)),
                    Err(_) => base.get_attr(segment),
                },
                _ => base.get_attr(segment),
            };
            match next {
                Ok(value) if !value.is_undefined() => Some(value),
                _ => None,
            }
        }
        let mut segments = self.path.split('.');
        let first = segments.next().unwrap_or_default();
        let Some(mut current) = step(item, first) else {
            return Value::from(());
        };
        for segment in segments {
            match step(&current, segment) {
                Some(next) => current = next,
                None => return Value::from(()),
            }
        }
        current
    }
}

/// The order `keys` put `items` in (a stable sort; `reverse` reverses it), or `None`
/// when that is the order they are already in.
fn sorted_order(items: &[Value], keys: &[SortKey<'_>], reverse: bool) -> Option<Vec<usize>> {
    // Row `i`'s keys are `extracted[i * width..(i + 1) * width]`.
    let width = keys.len();
    let mut extracted = Vec::with_capacity(items.len() * width);
    for item in items {
        extracted.extend(keys.iter().map(|key| key.extract(item)));
    }
    let row = |i: usize| &extracted[i * width..(i + 1) * width];
    let compare = |a: usize, b: usize| {
        for ((x, y), key) in row(a).iter().zip(row(b)).zip(keys) {
            let ordering = if key.descending { y.cmp(x) } else { x.cmp(y) };
            if ordering.is_ne() {
                return ordering;
            }
        }
        std::cmp::Ordering::Equal
    };
    let in_order = (1..items.len()).all(|i| compare(i - 1, i).is_le());
    if in_order && !reverse {
        return None;
    }
    let mut order: Vec<usize> = (0..items.len()).collect();
    if !in_order {
        order.sort_by(|a, b| compare(*a, *b));
    }
    if reverse {
        order.reverse();
    }
    Some(order)
}

/// The order [`sorted_order`] gives `items`, worked out from `old`: the previous
/// version of the list, sorted by the same keys. The objects of both versions (the
/// same values: an object that did not change keeps its value) keep their order
/// among themselves, so only the others are put where they sort, by binary search,
/// ties after the objects before them in `items`. `None` when that is not cheaper
/// (more than a quarter of the objects are new) or an item is not a resource object.
fn resorted(
    items: &[Value],
    old: &[Value],
    keys: &[SortKey<'_>],
    reverse: bool,
) -> Option<Option<Vec<usize>>> {
    let mut place: foldhash::HashMap<(usize, u32), usize> = foldhash::HashMap::default();
    place.reserve(items.len());
    for (index, item) in items.iter().enumerate() {
        place.insert(super::lazy::identity(item)?, index);
    }
    let mut seen = vec![false; items.len()];
    let kept_in = |value: &Value| {
        let index = *place.get(&super::lazy::identity(value)?)?;
        (!std::mem::replace(&mut seen[index], true)).then_some(index)
    };
    // The previous order, forwards.
    let mut order: Vec<usize> = if reverse {
        old.iter().rev().filter_map(kept_in).collect()
    } else {
        old.iter().filter_map(kept_in).collect()
    };
    let added: Vec<usize> = (0..items.len()).filter(|&i| !seen[i]).collect();
    if added.len() > items.len() / 4 + 8 {
        return None;
    }
    let extract = |index: usize| -> Vec<Value> {
        keys.iter().map(|key| key.extract(&items[index])).collect()
    };
    for index in added {
        let row = extract(index);
        // The first place whose object sorts after the new one.
        let at = order.partition_point(|&other| {
            let other_row = extract(other);
            let ordering = other_row
                .iter()
                .zip(&row)
                .zip(keys)
                .map(|((x, y), key)| if key.descending { y.cmp(x) } else { x.cmp(y) })
                .find(|ordering| ordering.is_ne())
                .unwrap_or_else(|| other.cmp(&index));
            ordering.is_lt()
        });
        order.insert(at, index);
    }
    if reverse {
        order.reverse();
    } else if order.iter().enumerate().all(|(at, &index)| at == index) {
        return Some(None);
    }
    Some(Some(order))
}

/// `items | sort_by("metadata.namespace", "-spec.priority", reverse=false)`: a stable
/// sort by one or more attribute paths (dotted; numeric segments index lists). A
/// leading `-` sorts that key descending; `reverse=true` reverses the whole order.
/// Missing attributes sort as `none`, before everything else.
///
/// A list that is already in order (the common case: `list()` is ordered by
/// namespace and name, and small lists often are) is returned as it is, without
/// copying. The lists `resources.<name>.list()` and `fetch()` return remember how they
/// were sorted, so sorting them the same way again — in the next render, until the
/// resource changes — costs a lookup, not a sort.
fn sort_by(value: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    // Keyword arguments come last; most calls pass none, and then no `Kwargs` (which
    // allocates) is made at all.
    let (paths, kwargs) = match args.split_last() {
        Some((last, rest)) if last.is_kwargs() => (rest, Some(Kwargs::try_from((**last).clone())?)),
        _ => (&args[..], None),
    };
    let reverse: Option<bool> = match &kwargs {
        Some(kwargs) => {
            let reverse = kwargs.get("reverse")?;
            kwargs.assert_all_used()?;
            reverse
        }
        None => None,
    };
    if paths.is_empty() {
        return Err(Error::new(
            ErrorKind::MissingArgument,
            "sort_by: give at least one attribute path, e.g. sort_by(\"metadata.name\")",
        ));
    }
    // Paths are strings; anything else is used in its printed form, as Jinja2 would.
    let paths: Vec<Cow<'_, str>> = paths
        .iter()
        .map(|p| match (p.kind(), p.as_str()) {
            (ValueKind::String, Some(text)) => Cow::Borrowed(text),
            _ => Cow::Owned(p.to_string()),
        })
        .collect();
    let reverse = reverse == Some(true);
    let parse = || {
        paths
            .iter()
            .map(|p| SortKey::parse(p))
            .collect::<Result<Vec<_>, _>>()
    };
    let reorder = |items: &[Value], order: Vec<usize>| {
        Value::from(
            order
                .into_iter()
                .map(|i| items[i].clone())
                .collect::<Vec<_>>(),
        )
    };
    // A store sorts as its `list()`.
    let store_list;
    let value = match value.downcast_object_ref::<ResourceStore>() {
        Some(store) => {
            store_list = store.list_value();
            &store_list
        }
        None => value,
    };
    // Resource lists (and the lists inside resource objects): sorted once per change.
    // A remembered order was sorted with valid paths.
    if let Some(list) = value.downcast_object_ref::<ResourceList>() {
        if let Some(sorted) = list.sorted(&paths, reverse) {
            return Ok(sorted.unwrap_or_else(|| value.clone()));
        }
        let keys = parse()?;
        let items = list.items();
        if items.len() <= 1 {
            return Ok(value.clone());
        }
        let order = list
            .base_order(&paths, reverse)
            .and_then(|old| resorted(items, old, &keys, reverse))
            .unwrap_or_else(|| sorted_order(items, &keys, reverse));
        let sorted = order.map(|order| reorder(items, order));
        list.remember_sorted(&paths, reverse, sorted.clone());
        return Ok(sorted.unwrap_or_else(|| value.clone()));
    }
    // Arrays inside resource objects: sorted once per object version.
    if let Some(view) = value.downcast_object_ref::<View>()
        && view.is_array()
    {
        if let Some(sorted) = view.sorted(&paths, reverse) {
            return Ok(sorted.unwrap_or_else(|| value.clone()));
        }
        let keys = parse()?;
        let items = view.items();
        if items.len() <= 1 {
            return Ok(value.clone());
        }
        let order = sorted_order(&items, &keys, reverse);
        view.remember_sorted(&paths, reverse, order.as_deref());
        return Ok(match order {
            Some(order) => reorder(&items, order),
            None => value.clone(),
        });
    }
    let keys = parse()?;
    // Other lists are read in place, and handed back unchanged when already in order.
    if let Some(items) = value.downcast_object_ref::<Vec<Value>>() {
        if items.len() <= 1 {
            return Ok(value.clone());
        }
        return Ok(match sorted_order(items, &keys, reverse) {
            Some(order) => reorder(items, order),
            None => value.clone(),
        });
    }
    let items: Vec<Value> = value.try_iter()?.collect();
    Ok(match sorted_order(&items, &keys, reverse) {
        Some(order) => reorder(&items, order),
        None => Value::from(items),
    })
}

/// `value | tojson` / `tojson(indent=2)`: JSON as Jinja2 writes it — keys sorted,
/// `", "` and `": "` separators, and `<`, `>`, `&`, `'` escaped so the result is safe
/// inside HTML and single-quoted strings.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(indent) => Some(indent),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(value) if value.is_none() => None,
        Some(value) => match value.as_usize() {
            Some(width) => Some(width),
            None => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: indent must be a number, got {}", value.kind()),
                ));
            }
        },
    };
    let mut json = serde_json::to_value(value).map_err(|error| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: cannot serialize this value: {error}"),
        )
    })?;
    sort_keys(&mut json);
    let mut bytes = Vec::new();
    let written = match indent {
        Some(width) => {
            let spaces = " ".repeat(width);
            let formatter = serde_json::ser::PrettyFormatter::with_indent(spaces.as_bytes());
            let mut serializer = serde_json::Serializer::with_formatter(&mut bytes, formatter);
            serde::Serialize::serialize(&json, &mut serializer)
        }
        None => {
            let mut serializer = serde_json::Serializer::with_formatter(&mut bytes, Spaced);
            serde::Serialize::serialize(&json, &mut serializer)
        }
    };
    written.map_err(|error| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: cannot serialize this value: {error}"),
        )
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => escaped.push_str("\\u003c"),
            '>' => escaped.push_str("\\u003e"),
            '&' => escaped.push_str("\\u0026"),
            '\'' => escaped.push_str("\\u0027"),
            other => escaped.push(other),
        }
    }
    Ok(Value::from_safe_string(escaped))
}

fn sort_keys(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.sort_keys();
            map.values_mut().for_each(sort_keys);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(sort_keys),
        _ => {}
    }
}

/// Python's `json.dumps` default separators: `", "` and `": "`.
struct Spaced;

impl serde_json::ser::Formatter for Spaced {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}
