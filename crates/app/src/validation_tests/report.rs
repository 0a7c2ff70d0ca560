//! The results of a run ([`SuiteReport`], whose serialization is the JSON output) and
//! their text form ([`format_text`]); [`OutputFormat`] picks one of the two, for
//! `hapwright bench` as well.

use std::fmt::Write as _;

use hapwright_reconciler::config::{Assertion, AssertionType};
use serde::Serialize;

use super::assertions::{quote_list, short_json};
use super::cases::TestCase;
use super::excerpt::indent;

/// How `hapwright test`, `bench` and `plan` print their results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// For people: `test` prints one line per test and every assertion of a failing
    /// test with an excerpt; `bench` prints a table with one row per scale; `plan` a
    /// verdict per instance with its commands or causes.
    #[default]
    Text,
    /// One JSON document (`test`: tests with their assertions; `bench`: one entry per
    /// scale; `plan`: the verdict and one entry per instance).
    Json,
}

impl OutputFormat {
    /// Prints a command's report on standard output: `text()` for people, or
    /// `report` as one pretty JSON document.
    ///
    /// # Errors
    ///
    /// When `report` cannot be written as JSON; the cause is printed on standard
    /// error, and the command exits with a failure.
    pub fn print<T: Serialize>(
        self,
        report: &T,
        text: impl FnOnce() -> String,
    ) -> Result<(), serde_json::Error> {
        match self {
            Self::Text => print!("{}", text()),
            Self::Json => match serde_json::to_string_pretty(report) {
                Ok(json) => println!("{json}"),
                Err(error) => {
                    eprintln!("cannot write the JSON report: {error}");
                    return Err(error);
                }
            },
        }
        Ok(())
    }
}

/// The result of one assertion.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AssertionReport {
    /// The assertion type (`contains`, ...).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// What it checked: the target file, `rendering_error`, the JSONPath of a
    /// `jsonpath` assertion, or `null` for `haproxy_valid`.
    pub target: Option<String>,
    /// The assertion's description, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Whether it held.
    pub passed: bool,
    /// What was found; for a failure the pattern and an excerpt of the target with
    /// line numbers (several lines).
    pub message: String,
}

/// The result of one test.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TestReport {
    /// The test's name.
    pub name: String,
    /// The test's description, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// True when every assertion held.
    pub passed: bool,
    /// Wall-clock time of the test: fixtures, render, validation (including waiting
    /// for another test's `haproxy -c`), assertions.
    pub duration_ms: u64,
    /// Every assertion, `_global`'s first, in order.
    pub assertions: Vec<AssertionReport>,
}

/// The results of a run; serialized as the JSON output
/// (`{"tests": [...], "passed": N, "failed": N}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SuiteReport {
    /// Every test that ran, in name order.
    pub tests: Vec<TestReport>,
    /// Tests whose assertions all held.
    pub passed: usize,
    /// Tests with at least one failing assertion.
    pub failed: usize,
}

impl SuiteReport {
    /// True when every test passed (also when there were none).
    pub fn all_passed(&self) -> bool {
        self.failed == 0
    }
}

/// One-line summary of an assertion: its type, target and pattern(s) or expectation.
pub fn describe(assertion: &Assertion) -> String {
    let mut out = assertion.kind.as_str().to_owned();
    if let Some(target) = &assertion.target {
        let _ = write!(out, " {target}");
    }
    if let Some(pattern) = &assertion.pattern {
        let _ = write!(out, " `{pattern}`");
    }
    if let Some(patterns) = &assertion.patterns {
        let _ = write!(out, " {}", quote_list(patterns));
    }
    if let Some(count) = assertion.count {
        let _ = write!(out, " count={count}");
    }
    if let Some(path) = &assertion.path {
        let _ = write!(out, " {path}");
    }
    if let Some(expected) = &assertion.expected
        && assertion.kind == AssertionType::Jsonpath
    {
        let _ = write!(out, " == {}", short_json(expected));
    }
    out
}

/// The text output: one line per test; for a failing test, every assertion, the
/// failing ones with their message; then `N passed, N failed`.
pub fn format_text(report: &SuiteReport, cases: &[TestCase]) -> String {
    let mut out = String::new();
    for test in &report.tests {
        let status = if test.passed { "PASS" } else { "FAIL" };
        let _ = write!(out, "{status} {} ({} ms)", test.name, test.duration_ms);
        if let Some(description) = &test.description {
            let _ = write!(out, ": {description}");
        }
        out.push('\n');
        if test.passed {
            continue;
        }
        let assertions = cases
            .iter()
            .find(|c| c.name == test.name)
            .map(|c| c.assertions.as_slice())
            .unwrap_or_default();
        for (index, result) in test.assertions.iter().enumerate() {
            let what = assertions
                .get(index)
                .map_or_else(|| result.kind.to_owned(), describe);
            let mark = if result.passed { "ok  " } else { "FAIL" };
            let _ = write!(out, "  {mark} {what}");
            if let Some(description) = &result.description {
                let _ = write!(out, " ({description})");
            }
            out.push('\n');
            if !result.passed {
                out.push_str(&indent(&result.message, 7));
                out.push('\n');
            }
        }
    }
    let _ = writeln!(out, "{} passed, {} failed", report.passed, report.failed);
    out
}
