//! Checking one assertion against what a test produced ([`check`]): the assertion
//! types, their regexes (multi-line mode) and their messages, which quote the pattern
//! and show an excerpt of the target.

use std::fmt::Write as _;

use hapwright_deployer::component::validator::Rejection;
use hapwright_eventbus::model::{Diagnostic, RenderedConfig};
use hapwright_reconciler::config::{Assertion, AssertionType, RENDERING_ERROR_TARGET};
use regex::{Regex, RegexBuilder};
use serde_json::Value;

use super::excerpt::{around, closest_excerpt, excerpt, indent, lines_of, numbered, plural};
use super::report::AssertionReport;

/// Longest JSON value quoted in a `jsonpath` message.
const MAX_JSON_CHARS: usize = 400;
/// Most matched lines listed by a failing `match_count`.
const MAX_LISTED_MATCHES: usize = 10;

/// What a test produced, for [`check`].
#[derive(Clone, Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "one per running test, never stored in bulk"
)]
pub enum Outcome {
    /// The fixtures are invalid; nothing was rendered.
    Setup(Vec<String>),
    /// The fixtures loaded and the templates were rendered.
    Rendered {
        /// The `jsonpath` context ([`Fixtures::context`](super::fixtures::Fixtures::context)).
        context: Value,
        /// The render, or its errors.
        render: Result<RenderedConfig, Vec<Diagnostic>>,
        /// Both validation phases, when the render succeeded and an assertion is
        /// `haproxy_valid`: the warnings, or the rejection.
        validation: Option<Result<Vec<Diagnostic>, Rejection>>,
        /// The statuses `statusTemplates` rendered from the fixtures, and the
        /// template errors, when an assertion targets a status.
        statuses: Option<RenderedStatuses>,
    },
}

/// How an assertion that could be checked came out; the message is what the report
/// shows.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Verdict {
    /// The assertion holds: what was found.
    Holds(String),
    /// The assertion does not hold: why, with an excerpt of the target.
    Fails(String),
}

/// Why an assertion could not be checked at all (it fails in the report).
#[derive(Debug, thiserror::Error)]
enum NotChecked {
    /// The test's fixtures did not load.
    #[error("not checked: the test's fixtures are invalid:\n{}", indent(&.0.join("\n"), 2))]
    InvalidFixtures(Vec<String>),
    /// The render failed (for `haproxy_valid`).
    #[error("not checked: the render failed:\n{}", indent(&render_error_text(.0), 2))]
    RenderFailed(Vec<Diagnostic>),
    /// The render failed, so the target file does not exist.
    #[error(
        "not checked: the render failed, so there is no {target}:\n{}",
        indent(&render_error_text(errors), 2)
    )]
    NoTarget {
        /// The assertion's target.
        target: String,
        /// The render errors.
        errors: Vec<Diagnostic>,
    },
    /// Validation did not run for a `haproxy_valid` assertion.
    #[error("not checked: validation did not run")]
    ValidationDidNotRun,
    /// The target names no rendered file.
    #[error("{0} is not a rendered file")]
    NotRendered(String),
    /// The target is not a `status/<resource>/<namespace>/<name>` target.
    #[error("{0} is not a status target")]
    NotStatusTarget(String),
    /// The status template failed for the target's object.
    #[error("not checked: the status template failed for {object}:\n  {error}")]
    StatusTemplateFailed {
        /// `namespace/name`, or the name of a cluster-scoped object.
        object: String,
        /// The template's error.
        error: Box<Diagnostic>,
    },
    /// A pattern is not a valid regex.
    #[error("invalid regex `{pattern}`: {error}")]
    InvalidRegex {
        /// The pattern as written.
        pattern: String,
        /// Why it does not compile.
        error: regex::Error,
    },
    /// The `path` of a `jsonpath` assertion does not parse.
    #[error("invalid JSONPath `{path}`: {error}")]
    InvalidJsonPath {
        /// The path as written.
        path: String,
        /// Why it does not parse.
        error: serde_json_path::ParseError,
    },
}

/// What the status templates rendered for one test.
#[derive(Clone, Debug, Default)]
pub struct RenderedStatuses {
    /// Every non-empty status.
    pub statuses: Vec<hapwright_eventbus::RenderedStatus>,
    /// One error per failing object.
    pub errors: Vec<Diagnostic>,
}

impl RenderedStatuses {
    /// The text of the `status/<resource>/<namespace>/<name>` target: the object's
    /// rendered status as YAML, empty when its template renders nothing (the status
    /// is left alone), or the template's error for it.
    fn text(&self, target: &str) -> Result<String, NotChecked> {
        let Some((resource, namespace, name)) = hapwright_reconciler::config::status_target(target)
        else {
            return Err(NotChecked::NotStatusTarget(target.to_owned()));
        };
        let object = if namespace.is_empty() {
            name.to_owned()
        } else {
            format!("{namespace}/{name}")
        };
        let template = hapwright_reconciler::status::template_name(resource);
        if let Some(error) = self.errors.iter().find(|e| {
            let text = e.to_string();
            text.starts_with(&template) && text.contains(&format!(" {object}: "))
        }) {
            return Err(NotChecked::StatusTemplateFailed {
                object,
                error: Box::new(error.clone()),
            });
        }
        Ok(self
            .statuses
            .iter()
            .find(|s| s.resource.as_ref() == resource && s.namespace == namespace && s.name == name)
            .map(|s| serde_saphyr::to_string(&s.status).unwrap_or_else(|e| e.to_string()))
            .unwrap_or_default())
    }
}

/// Checks one assertion against a test's outcome.
pub fn check(assertion: &Assertion, outcome: &Outcome) -> AssertionReport {
    let target = match assertion.kind {
        AssertionType::HaproxyValid => None,
        AssertionType::Jsonpath => assertion.path.clone(),
        _ => assertion.target.clone(),
    };
    let (passed, message) = match evaluate(assertion, outcome) {
        Ok(Verdict::Holds(message)) => (true, message),
        Ok(Verdict::Fails(message)) => (false, message.trim_end().to_owned()),
        Err(not_checked) => (false, not_checked.to_string().trim_end().to_owned()),
    };
    AssertionReport {
        kind: assertion.kind.as_str(),
        target,
        description: assertion.description.clone(),
        passed,
        message,
    }
}

/// The assertion's verdict, or why it could not be checked.
fn evaluate(assertion: &Assertion, outcome: &Outcome) -> Result<Verdict, NotChecked> {
    let (context, render, validation, statuses) = match outcome {
        Outcome::Setup(errors) => return Err(NotChecked::InvalidFixtures(errors.clone())),
        Outcome::Rendered {
            context,
            render,
            validation,
            statuses,
        } => (context, render, validation, statuses),
    };
    match assertion.kind {
        AssertionType::HaproxyValid => match (render, validation) {
            (Err(errors), _) => Err(NotChecked::RenderFailed(errors.clone())),
            (Ok(_), Some(Ok(warnings))) if warnings.is_empty() => Ok(Verdict::Holds(
                "both validation phases accept the render".to_owned(),
            )),
            (Ok(_), Some(Ok(warnings))) => Ok(Verdict::Holds(format!(
                "both validation phases accept the render, with warnings:\n{}",
                indent(&render_error_text(warnings), 2)
            ))),
            (Ok(_), Some(Err(rejection))) => Ok(Verdict::Fails(format!(
                "{}{}",
                rejection,
                if rejection.tool_failure {
                    "\n(HAProxy could not judge the configuration: check haproxy.binary)"
                } else {
                    ""
                }
            ))),
            (Ok(_), None) => Err(NotChecked::ValidationDidNotRun),
        },
        AssertionType::Jsonpath => {
            let path = assertion.path.as_deref().unwrap_or_default();
            let expected = assertion.expected.as_ref().unwrap_or(&Value::Null);
            check_jsonpath(path, expected, context)
        }
        _ => {
            let target = assertion.target.as_deref().unwrap_or_default();
            let text = match statuses {
                Some(statuses)
                    if target.starts_with(hapwright_reconciler::config::STATUS_TARGET_PREFIX) =>
                {
                    statuses.text(target)?
                }
                _ => target_text(target, render)?,
            };
            match assertion.kind {
                AssertionType::Contains => {
                    contains(target, text, assertion.pattern.as_deref().unwrap_or(""))
                }
                AssertionType::NotContains => {
                    not_contains(target, text, assertion.pattern.as_deref().unwrap_or(""))
                }
                AssertionType::MatchCount => match_count(
                    target,
                    text,
                    assertion.pattern.as_deref().unwrap_or(""),
                    assertion.count.unwrap_or(0),
                ),
                AssertionType::MatchOrder => match_order(
                    target,
                    text,
                    assertion.patterns.as_deref().unwrap_or_default(),
                ),
                AssertionType::Equals => equals(
                    target,
                    text,
                    assertion
                        .expected
                        .as_ref()
                        .and_then(Value::as_str)
                        .unwrap_or(""),
                ),
                AssertionType::HaproxyValid | AssertionType::Jsonpath => {
                    unreachable!("handled above")
                }
            }
        }
    }
}

/// The text an assertion's `target` names.
fn target_text(
    target: &str,
    render: &Result<RenderedConfig, Vec<Diagnostic>>,
) -> Result<String, NotChecked> {
    match render {
        Ok(_) if target == RENDERING_ERROR_TARGET => Ok(String::new()),
        Err(errors) if target == RENDERING_ERROR_TARGET => Ok(render_error_text(errors)),
        Err(errors) => Err(NotChecked::NoTarget {
            target: target.to_owned(),
            errors: errors.clone(),
        }),
        Ok(rendered) => rendered
            .iter()
            .find(|(file, _)| {
                file.relative_path() == hapwright_reconciler::config::target_path(target)
            })
            .map(|(_, content)| content.to_string())
            .ok_or_else(|| NotChecked::NotRendered(target.to_owned())),
    }
}

/// Render (or validation) diagnostics as the `rendering_error` target: one per line,
/// `template:line:column: message`.
fn render_error_text(errors: &[Diagnostic]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

fn compile(pattern: &str) -> Result<Regex, NotChecked> {
    RegexBuilder::new(pattern)
        .multi_line(true)
        .build()
        .map_err(|error| NotChecked::InvalidRegex {
            pattern: pattern.to_owned(),
            error,
        })
}

/// 1-based line number of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

fn describe_target(target: &str, text: &str) -> String {
    if target == RENDERING_ERROR_TARGET && text.is_empty() {
        "rendering_error (empty: the render succeeded)".to_owned()
    } else {
        target.to_owned()
    }
}

fn contains(target: &str, text: String, pattern: &str) -> Result<Verdict, NotChecked> {
    let regex = compile(pattern)?;
    match regex.find(&text) {
        Some(found) => Ok(Verdict::Holds(format!(
            "`{pattern}` matches {target} at line {}",
            line_of(&text, found.start())
        ))),
        None => Ok(Verdict::Fails(format!(
            "`{pattern}` does not match {}\n{}",
            describe_target(target, &text),
            closest_excerpt(target, &text, pattern)
        ))),
    }
}

fn not_contains(target: &str, text: String, pattern: &str) -> Result<Verdict, NotChecked> {
    let regex = compile(pattern)?;
    match regex.find(&text) {
        None => Ok(Verdict::Holds(format!(
            "`{pattern}` does not match {}",
            describe_target(target, &text)
        ))),
        Some(found) => {
            let line = line_of(&text, found.start());
            Ok(Verdict::Fails(format!(
                "`{pattern}` matches {target} at line {line}, expected no match\n{}",
                excerpt(target, &text, &[line])
            )))
        }
    }
}

fn match_count(
    target: &str,
    text: String,
    pattern: &str,
    count: u64,
) -> Result<Verdict, NotChecked> {
    let regex = compile(pattern)?;
    let lines: Vec<usize> = regex
        .find_iter(&text)
        .map(|m| line_of(&text, m.start()))
        .collect();
    let found = lines.len() as u64;
    let times = |n: u64| {
        if n == 1 {
            "once".to_owned()
        } else {
            format!("{n} times")
        }
    };
    if found == count {
        return Ok(Verdict::Holds(format!(
            "`{pattern}` matches {target} {}",
            times(found)
        )));
    }
    let detail = if lines.is_empty() {
        closest_excerpt(target, &text, pattern)
    } else {
        let mut distinct = lines.clone();
        distinct.dedup();
        let listed: Vec<usize> = distinct.iter().copied().take(MAX_LISTED_MATCHES).collect();
        let mut out = format!("matching lines of {target}:\n");
        out.push_str(&numbered(&text, &listed, &listed));
        if distinct.len() > listed.len() {
            let _ = writeln!(out, "      ... and {} more", distinct.len() - listed.len());
        }
        out
    };
    Ok(Verdict::Fails(format!(
        "`{pattern}` matches {} {}, expected {}\n{detail}",
        describe_target(target, &text),
        times(found),
        times(count)
    )))
}

fn match_order(target: &str, text: String, patterns: &[String]) -> Result<Verdict, NotChecked> {
    let regexes = patterns
        .iter()
        .map(|p| compile(p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut position = 0;
    let mut previous: Option<(&str, usize)> = None;
    let mut found_lines = Vec::new();
    for (pattern, regex) in patterns.iter().zip(&regexes) {
        match regex.find_at(&text, position) {
            Some(found) => {
                let line = line_of(&text, found.start());
                found_lines.push(line);
                previous = Some((pattern, line));
                position = found.end();
            }
            None => {
                let problem = match (previous, regex.find(&text)) {
                    (None, _) | (_, None) => format!(
                        "`{pattern}` does not match {}",
                        describe_target(target, &text)
                    ),
                    (Some((before, before_line)), Some(earlier)) => format!(
                        "`{pattern}` matches {target} only before `{before}` (line {}, which is \
                         not before line {before_line})",
                        line_of(&text, earlier.start())
                    ),
                };
                let shown = match regex.find(&text) {
                    Some(earlier) => {
                        let mut lines = found_lines.clone();
                        lines.push(line_of(&text, earlier.start()));
                        excerpt(target, &text, &lines)
                    }
                    None if found_lines.is_empty() => closest_excerpt(target, &text, pattern),
                    None => excerpt(target, &text, &found_lines),
                };
                return Ok(Verdict::Fails(format!(
                    "{problem}; expected the patterns in this order: {}\n{shown}",
                    quote_list(patterns)
                )));
            }
        }
    }
    Ok(Verdict::Holds(format!(
        "{} match {target} in this order (lines {})",
        quote_list(patterns),
        found_lines
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

pub(super) fn quote_list(patterns: &[String]) -> String {
    patterns
        .iter()
        .map(|p| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn equals(target: &str, text: String, expected: &str) -> Result<Verdict, NotChecked> {
    if text == expected {
        return Ok(Verdict::Holds(format!("{target} is exactly as expected")));
    }
    let shown = describe_target(target, &text);
    let (actual_lines, expected_lines) = (lines_of(&text), lines_of(expected));
    if actual_lines == expected_lines {
        let newlines = |t: &str| t.len() - t.trim_end_matches('\n').len();
        return Ok(Verdict::Fails(format!(
            "{shown} differs from `expected` only at the end: it ends with {}, `expected` with {}",
            plural(newlines(&text), "newline"),
            plural(newlines(expected), "newline"),
        )));
    }
    let line = actual_lines
        .iter()
        .zip(&expected_lines)
        .position(|(a, e)| a != e)
        .unwrap_or(actual_lines.len().min(expected_lines.len()))
        + 1;
    let mut out = format!(
        "{shown} differs from `expected` at line {line} ({} rendered, {} expected)\n",
        plural(actual_lines.len(), "line"),
        plural(expected_lines.len(), "line"),
    );
    let side = |out: &mut String, label: &str, content: &str| {
        let _ = writeln!(out, "{label}:");
        if line > lines_of(content).len() {
            let _ = writeln!(out, "      (ends before line {line})");
        }
        out.push_str(&numbered(content, &around(line, content), &[line]));
    };
    side(&mut out, "expected", expected);
    side(&mut out, &format!("rendered {target}"), &text);
    Ok(Verdict::Fails(out.trim_end().to_owned()))
}

fn check_jsonpath(path: &str, expected: &Value, context: &Value) -> Result<Verdict, NotChecked> {
    let query =
        serde_json_path::JsonPath::parse(path).map_err(|error| NotChecked::InvalidJsonPath {
            path: path.to_owned(),
            error,
        })?;
    let nodes: Vec<&Value> = query.query(context).all();
    let as_list = Value::Array(nodes.iter().copied().cloned().collect());
    let single_match = matches!(nodes.as_slice(), [only] if json_eq(only, expected));
    if single_match || json_eq(&as_list, expected) {
        return Ok(Verdict::Holds(format!(
            "`{path}` yields {}",
            short_json(expected)
        )));
    }
    let found = match nodes.as_slice() {
        [] => "nothing (no node matches)".to_owned(),
        [only] => short_json(only),
        _ => format!("{} nodes: {}", nodes.len(), short_json(&as_list)),
    };
    Ok(Verdict::Fails(format!(
        "`{path}` yields {found}, expected {}\n(evaluated on {{\"resources\": {{<watched resource>: [objects]}}, \"extraContext\": ...}})",
        short_json(expected)
    )))
}

/// JSON equality with numbers compared by value (`2` equals `2.0`).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || matches!((x.as_f64(), y.as_f64()), (Some(x), Some(y)) if x == y)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_eq(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(key, value)| y.get(key).is_some_and(|other| json_eq(value, other)))
        }
        _ => a == b,
    }
}

pub(super) fn short_json(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= MAX_JSON_CHARS {
        text
    } else {
        let cut: String = text.chars().take(MAX_JSON_CHARS).collect();
        format!("{cut}...")
    }
}
