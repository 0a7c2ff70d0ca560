//! YAML and JSON parsing with input budgets and located errors.
//!
//! Every parse here runs under [`Limits`] (nesting depth, aliases, nodes, documents),
//! so a deeply nested document or an alias bomb is rejected quickly with a clear
//! message instead of exhausting memory or stack. Errors come back as
//! [`Diagnostic`]s located at `file:line:column`; typed parses
//! ([`parse_typed`]) also name the key path (`controller.debunce: unknown field,
//! did you mean `debounce`?`). JSON is parsed by the same YAML parser (JSON is YAML
//! 1.2), so both get the same limits and error format.

// `Diagnostic` is the project's shared error type; these errors are the cold path of
// parsing a file, so its size does not matter.
#![allow(clippy::result_large_err)]

use hapwright_eventbus::config::did_you_mean;
use hapwright_eventbus::model::{Diagnostic, SourceLocation};
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_saphyr::budget::BudgetBreach;

/// Input budgets for one parse. The defaults suit manifests and config files written by
/// people and generators; they reject pathological input long before it costs much.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Deepest nesting of mappings and sequences.
    pub max_depth: usize,
    /// Alias uses (`*name`) per file.
    pub max_aliases: usize,
    /// Documents per file (`---` separators).
    pub max_documents: usize,
    /// Nodes (scalars, mappings, sequences) per file.
    pub max_nodes: usize,
    /// Events replayed through aliases: bounds the expanded size of an alias bomb.
    pub max_alias_replay: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_depth: 64,
            max_aliases: 1_000,
            max_documents: 10_000,
            max_nodes: 2_000_000,
            max_alias_replay: 100_000,
        }
    }
}

impl Limits {
    /// serde-saphyr options enforcing these limits.
    pub fn options(&self) -> serde_saphyr::Options {
        let mut budget = serde_saphyr::Budget::default();
        budget.max_depth = self.max_depth;
        budget.max_aliases = self.max_aliases;
        budget.max_documents = self.max_documents;
        budget.max_nodes = self.max_nodes;
        budget.max_reader_input_bytes = None;
        let mut options = serde_saphyr::Options::default();
        options.budget = Some(budget);
        options.alias_limits.max_total_replayed_events = self.max_alias_replay;
        options.alias_limits.max_replay_stack_depth = self.max_depth;
        options.with_snippet = false;
        options
    }
}

/// Parses every document of a YAML (or JSON) text into JSON values. Empty documents
/// (a lone `---`, only comments) are skipped.
pub fn parse_documents(text: &str, file: &str, limits: &Limits) -> Result<Vec<Value>, Diagnostic> {
    let documents: Vec<Value> = serde_saphyr::from_multiple_with_options(text, limits.options())
        .map_err(|error| diagnostic(&error, file, None))?;
    Ok(documents
        .into_iter()
        .filter(|document| !document.is_null())
        .collect())
}

/// Parses one YAML document into `T`, naming the key path in errors. Type errors,
/// unknown keys (with a suggestion), missing keys and invalid values all come back as
/// one located diagnostic.
pub fn parse_typed<T: DeserializeOwned>(
    text: &str,
    file: &str,
    limits: &Limits,
) -> Result<T, Diagnostic> {
    let mut path: Option<String> = None;
    let result = serde_saphyr::with_deserializer_from_str_with_options(
        text,
        limits.options(),
        |deserializer| {
            serde_path_to_error::deserialize(deserializer).map_err(|error| {
                path = Some(error.path().to_string());
                error.into_inner()
            })
        },
    );
    result.map_err(|error| {
        // `?` is serde's "somewhere unknown": no path is better than that.
        let path = path.filter(|p| !p.is_empty() && p != "." && p != "?");
        diagnostic(&error, file, path.as_deref())
    })
}

/// Turns a serde-saphyr error into a diagnostic at `file:line:column`, prefixed with
/// the key path when known.
pub fn diagnostic(error: &serde_saphyr::Error, file: &str, path: Option<&str>) -> Diagnostic {
    let mut inner = error.without_snippet();
    let location = inner.location().map(|l| (l.line(), l.column()));
    while let serde_saphyr::Error::AliasError { error, .. } = inner {
        inner = error.without_snippet();
    }
    let message = match inner {
        serde_saphyr::Error::SerdeUnknownField {
            field, expected, ..
        } => {
            // The path already ends with the unknown key.
            let path = path.map_or_else(|| field.clone(), str::to_owned);
            unknown_field_message(&path, expected)
        }
        serde_saphyr::Error::Budget { breach, .. } => with_path(path, &budget_message(breach)),
        serde_saphyr::Error::AliasReplayLimitExceeded {
            max_total_replayed_events,
            ..
        } => with_path(
            path,
            &format!(
                "input rejected by parse limits: aliases expand to more than {max_total_replayed_events} nodes (alias bomb?)"
            ),
        ),
        serde_saphyr::Error::AliasExpansionLimitExceeded { .. }
        | serde_saphyr::Error::AliasReplayCounterOverflow { .. } => with_path(
            path,
            "input rejected by parse limits: too many alias expansions (alias bomb?)",
        ),
        serde_saphyr::Error::AliasReplayStackDepthExceeded { max_depth, .. } => with_path(
            path,
            &format!("input rejected by parse limits: aliases nest deeper than {max_depth} levels"),
        ),
        other => {
            let text = serde_saphyr::MessageFormatter::format_message(
                &serde_saphyr::UserMessageFormatter,
                other,
            );
            let mut text: String = text
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            if text.contains("recursion limit exceeded") {
                // The parser's own nesting guard for flow collections (`[[[[...`).
                text = "input rejected by parse limits: nesting is too deep (recursion limit exceeded)"
                    .to_owned();
            }
            with_path(path, &plain_words(&text, path))
        }
    };
    let location = match location {
        Some((line, column)) if line > 0 => SourceLocation::new(
            file,
            Some(u32::try_from(line).unwrap_or(u32::MAX)),
            Some(u32::try_from(column.max(1)).unwrap_or(u32::MAX)),
        ),
        _ => SourceLocation::new(file, None, None),
    };
    Diagnostic::error(message).at(location)
}

/// `path: unknown field, did you mean `x`?` or, without a close match, the list of
/// accepted keys.
pub fn unknown_field_message(path: &str, expected: &[&str]) -> String {
    let field = path.rsplit(['.', ']']).next().unwrap_or(path);
    match did_you_mean(field, expected.iter().copied()) {
        Some(suggestion) => format!("{path}: unknown field, did you mean `{suggestion}`?"),
        None if expected.is_empty() => format!("{path}: unknown field"),
        None => format!(
            "{path}: unknown field (expected one of: {})",
            expected.join(", ")
        ),
    }
}

/// Keys whose value is one template, written `{ template: … }` (file names may
/// contain dots, so everything under those sections counts).
fn is_template_key(path: &str) -> bool {
    path == "haproxyConfig"
        || ["templateSnippets.", "maps.", "files.", "sslCertificates."]
            .iter()
            .any(|section| path.starts_with(section))
}

/// The parser's wording for a value of the wrong shape, in the words of someone
/// editing the file, with the fix. Anything not listed passes through unchanged.
fn plain_words(text: &str, path: Option<&str>) -> String {
    let path = path.unwrap_or_default();
    let last_key = path.rsplit('.').next().unwrap_or(path);
    if text.contains("expected sequence start") {
        return if matches!(last_key, "indexBy" | "ignoreFields") {
            "expected a list (e.g. `[metadata.name]`)".to_owned()
        } else {
            "expected a list (e.g. `[a, b]`, or one `- item` per line)".to_owned()
        };
    }
    if text.contains("expected mapping start") {
        return if is_template_key(path) {
            "expected `{ template: … }`".to_owned()
        } else if ["templateSnippets", "maps", "files", "sslCertificates"].contains(&path) {
            "expected names, each with `{ template: … }`".to_owned()
        } else {
            "expected keys and values (`key: value` lines, or `{ key: value }`)".to_owned()
        };
    }
    let integer = [
        "u8", "u16", "u32", "u64", "usize", "i8", "i16", "i32", "i64", "isize",
    ]
    .iter()
    .any(|kind| text.trim() == format!("invalid {kind}"));
    if integer {
        return "expected a whole number".to_owned();
    }
    if ["invalid f32", "invalid f64"].contains(&text.trim()) {
        return "expected a number".to_owned();
    }
    if text.trim() == "invalid boolean" {
        return "expected true or false".to_owned();
    }
    if text.contains("invalid socket address syntax") {
        return "expected ip:port (host names are not accepted)".to_owned();
    }
    if text.contains("expected string scalar") {
        return "expected a single value, not a list or keys".to_owned();
    }
    text.to_owned()
}

fn with_path(path: Option<&str>, message: &str) -> String {
    match path {
        Some(path) => format!("{path}: {message}"),
        None => message.to_owned(),
    }
}

fn budget_message(breach: &BudgetBreach) -> String {
    let detail = match breach {
        BudgetBreach::Depth { depth } => format!("nesting depth {depth} exceeds the limit"),
        BudgetBreach::Aliases { aliases } => format!("{aliases} alias uses exceed the limit"),
        BudgetBreach::Anchors { anchors } => format!("{anchors} anchors exceed the limit"),
        BudgetBreach::Documents { documents } => {
            format!("{documents} documents exceed the limit")
        }
        BudgetBreach::Nodes { nodes } => format!("{nodes} nodes exceed the limit"),
        BudgetBreach::Events { events } => format!("{events} parser events exceed the limit"),
        BudgetBreach::ScalarBytes { total_scalar_bytes } => {
            format!("{total_scalar_bytes} bytes of scalars exceed the limit")
        }
        BudgetBreach::AliasAnchorRatio { aliases, anchors } => {
            format!("{aliases} alias uses for {anchors} anchors look like an alias bomb")
        }
        other => format!("{other:?}"),
    };
    format!("input rejected by parse limits: {detail}")
}

/// The text of a file, without a leading byte-order mark; invalid UTF-8 is an error
/// located at the line and column (in characters) where decoding failed.
pub fn decode_utf8<'a>(bytes: &'a [u8], file: &str) -> Result<&'a str, Diagnostic> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Ok(text.strip_prefix('\u{feff}').unwrap_or(text)),
        Err(error) => Err(invalid_utf8(bytes, &error, file)),
    }
}

/// Locates the first invalid byte: line and column (in characters) of where decoding
/// failed.
fn invalid_utf8(bytes: &[u8], error: &std::str::Utf8Error, file: &str) -> Diagnostic {
    let valid = &bytes[..error.valid_up_to()];
    let valid = std::str::from_utf8(valid).unwrap_or_default();
    let line = valid.matches('\n').count() + 1;
    let column = valid.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Diagnostic::error(format!(
        "invalid UTF-8 (byte 0x{:02x} at offset {}); manifests must be UTF-8 text",
        bytes[error.valid_up_to()],
        error.valid_up_to()
    ))
    .at(SourceLocation::new(
        file,
        u32::try_from(line).ok(),
        u32::try_from(column).ok(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Controller {
        debounce: Option<String>,
        max_wait: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Top {
        controller: Option<Controller>,
    }

    #[test]
    fn unknown_keys_name_path_location_and_suggestion() {
        let err = parse_typed::<Top>(
            "controller:\n  debunce: 200ms\n",
            "hapwright.yaml",
            &Limits::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "hapwright.yaml:2:3: controller.debunce: unknown field, did you mean `debounce`?"
        );
    }

    #[test]
    fn unknown_keys_without_a_close_match_list_the_choices() {
        let err =
            parse_typed::<Top>("controller:\n  zzz: 1\n", "f", &Limits::default()).unwrap_err();
        assert_eq!(
            err.message,
            "controller.zzz: unknown field (expected one of: debounce, maxWait)"
        );
    }

    #[test]
    fn type_errors_name_the_path() {
        let err = parse_typed::<Top>("controller:\n  maxWait: [1]\n", "f", &Limits::default())
            .unwrap_err();
        assert!(err.message.starts_with("controller.maxWait: "), "{err}");
        assert_eq!(err.location.unwrap().line, Some(2));
    }

    #[test]
    fn syntax_errors_are_located() {
        let err = parse_documents("a: 1\n---\nb: [\n", "m.yaml", &Limits::default()).unwrap_err();
        let location = err.location.clone().unwrap();
        assert_eq!(location.file, "m.yaml");
        assert_eq!(location.line, Some(3));
        assert!(err.message.contains("unclosed bracket"), "{err}");
    }

    #[test]
    fn deep_nesting_is_rejected_by_the_budget() {
        let text = format!("{}{}", "[".repeat(500), "]".repeat(500));
        let err = parse_documents(&text, "deep.yaml", &Limits::default()).unwrap_err();
        assert!(
            err.message.starts_with("input rejected by parse limits: "),
            "{err}"
        );
        let block = (0..200).fold(String::new(), |mut text, depth| {
            text.push_str(&" ".repeat(depth * 2));
            text.push_str("k:\n");
            text
        });
        let err = parse_documents(&block, "deep.yaml", &Limits::default()).unwrap_err();
        assert!(
            err.message.starts_with("input rejected by parse limits: "),
            "{err}"
        );
        assert!(err.location.unwrap().line.is_some());
    }

    #[test]
    fn alias_bombs_are_rejected_by_the_budget() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for level in 1..12 {
            let prev = level - 1;
            text.push_str(&format!(
                "a{level}: &a{level} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
            ));
        }
        let err = parse_documents(&text, "bomb.yaml", &Limits::default()).unwrap_err();
        assert!(err.location.is_some());
        assert!(err.message.contains("alias bomb"), "{err}");
    }

    #[test]
    fn json_and_multiple_documents() {
        let docs = parse_documents(r#"{"a": [1, 2]}"#, "j.json", &Limits::default()).unwrap();
        assert_eq!(docs, vec![serde_json::json!({"a": [1, 2]})]);
        let docs = parse_documents("---\n# c\n---\na: 1\n---\n", "m", &Limits::default()).unwrap();
        assert_eq!(docs.len(), 1);
    }
}
