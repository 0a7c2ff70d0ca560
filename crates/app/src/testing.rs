//! `hapwright test`: runs the config file's `validationTests`.
//!
//! Each test stands its fixtures in for the watched resources, renders every template
//! once and checks its assertions against the result:
//!
//! 1. [`cases`] selects the tests and merges `_global` ([`GLOBAL_TEST`]) into each:
//!    its fixtures come first (a test's object with the same namespace/name replaces
//!    the global one), its `extraContext` is merged between the top-level one and the
//!    test's own, its assertions run before the test's.
//! 2. [`load_fixtures`] turns the fixture objects into snapshots the way the `files`
//!    source does: `List` kinds unpacked, the watched resource's `apiVersion`/`kind`
//!    filter applied, a missing namespace set to `default`, `ignoreFields` removed,
//!    indexed by `indexBy`.
//! 3. [`run`] renders every test (one compiled renderer per distinct `extraContext`),
//!    runs `haproxy -c` for tests with a `haproxy_valid` assertion, and checks the
//!    assertions ([`check`]); tests run in parallel, their reports come back in name
//!    order. (The validator runs one `haproxy -c` at a time per process, so that step
//!    queues; everything else overlaps.)
//! 4. [`format_text`] and the [`SuiteReport`]'s JSON form print the results.
//!
//! Regexes run in multi-line mode (`^` and `$` match at line boundaries). A failing
//! assertion's message names the assertion and the pattern and shows an excerpt of the
//! target with line numbers: the lines around the match, the closest line, or the first
//! difference.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use hapwright_deployer::component::validator::{self, Rejection};
use hapwright_eventbus::model::{
    Diagnostic, ObjectKey, RenderedConfig, ResourceSnapshot, StoredObject,
};
use hapwright_reconciler::config::{
    Assertion, AssertionType, RENDERING_ERROR_TARGET, ValidationTest,
};
use hapwright_reconciler::renderer::{Renderer, Resources};
use hapwright_watchers::config::WatchedResource;
use hapwright_watchers::manifest::{self, Filter};
use hapwright_watchers::yaml::Limits;
use regex::{Regex, RegexBuilder};
use serde::Serialize;
use serde_json::Value;

use crate::build;
use crate::config::Config;

/// Name of the test that is merged into every other test and never runs on its own.
pub const GLOBAL_TEST: &str = "_global";

/// Lines shown on each side of the line an excerpt centres on.
const EXCERPT_RADIUS: usize = 2;
/// Lines an excerpt shows when there is no line to centre on.
const EXCERPT_HEAD: usize = 10;
/// Longest JSON value quoted in a `jsonpath` message.
const MAX_JSON_CHARS: usize = 400;
/// Most matched lines listed by a failing `match_count`.
const MAX_LISTED_MATCHES: usize = 10;

/// How `hapwright test` and `hapwright bench` print their results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// For people: `test` prints one line per test and every assertion of a failing
    /// test with an excerpt; `bench` prints a table with one row per scale.
    #[default]
    Text,
    /// One JSON document (`test`: tests with their assertions; `bench`: one entry per scale).
    Json,
}

// === selection and `_global` ===

/// One test ready to run: `_global` merged in.
#[derive(Clone, Debug, PartialEq)]
pub struct TestCase {
    /// The test's name in `validationTests`.
    pub name: String,
    /// The test's own description.
    pub description: Option<String>,
    /// Fixture layers, lowest first, each labelled with its config path
    /// (`validationTests._global.fixtures`, then the test's own). An object in a later
    /// layer replaces the object with the same namespace/name in an earlier one.
    pub fixture_layers: Vec<(String, BTreeMap<String, Vec<Value>>)>,
    /// `extraContext` as the templates see it: the top-level one, with `_global`'s and
    /// then the test's merged over it ([`merge_json`]).
    pub extra_context: Value,
    /// `_global`'s assertions, then the test's own.
    pub assertions: Vec<Assertion>,
}

/// Why no test could be selected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SelectError {
    /// `--test NAME` names no test.
    NoSuchTest {
        /// The name asked for.
        name: String,
        /// The tests the config defines (without `_global`).
        available: Vec<String>,
    },
    /// `--test _global`: that one is merged into the others, not run.
    GlobalSelected,
}

impl std::fmt::Display for SelectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SelectError::NoSuchTest { name, available } if available.is_empty() => {
                write!(
                    f,
                    "no test named `{name}`: the config has no validationTests"
                )
            }
            SelectError::NoSuchTest { name, available } => write!(
                f,
                "no test named `{name}` (validationTests has: {})",
                available.join(", ")
            ),
            SelectError::GlobalSelected => write!(
                f,
                "`{GLOBAL_TEST}` is merged into every test and does not run on its own; name \
                 another test"
            ),
        }
    }
}

impl std::error::Error for SelectError {}

/// Merges `over` into `base`: mappings merge key by key, recursively; any other value
/// in `over` replaces the one in `base`.
pub fn merge_json(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(base), Value::Object(over)) => {
            for (key, value) in over {
                match base.get_mut(key) {
                    Some(existing) => merge_json(existing, value),
                    None => {
                        base.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (base, over) => *base = over.clone(),
    }
}

/// The tests to run, in name order, with `_global` merged into each: every test, or
/// only `only`.
///
/// # Errors
///
/// `only` names no test, or names `_global`.
pub fn cases(config: &Config, only: Option<&str>) -> Result<Vec<TestCase>, SelectError> {
    let tests = &config.templates.validation_tests;
    let global = tests.get(GLOBAL_TEST);
    if let Some(name) = only {
        if name == GLOBAL_TEST {
            return Err(SelectError::GlobalSelected);
        }
        if !tests.contains_key(name) {
            return Err(SelectError::NoSuchTest {
                name: name.to_owned(),
                available: tests
                    .keys()
                    .filter(|n| *n != GLOBAL_TEST)
                    .cloned()
                    .collect(),
            });
        }
    }
    Ok(tests
        .iter()
        .filter(|(name, _)| *name != GLOBAL_TEST && only.is_none_or(|only| only == *name))
        .map(|(name, test)| merge_case(&config.templates.extra_context, global, name, test))
        .collect())
}

fn merge_case(
    base_context: &Value,
    global: Option<&ValidationTest>,
    name: &str,
    test: &ValidationTest,
) -> TestCase {
    let mut extra_context = base_context.clone();
    let mut fixture_layers = Vec::new();
    let mut assertions = Vec::new();
    for (label, layer) in global
        .map(|g| (GLOBAL_TEST, g))
        .into_iter()
        .chain([(name, test)])
    {
        if let Some(context) = &layer.extra_context {
            merge_json(&mut extra_context, context);
        }
        if !layer.fixtures.is_empty() {
            fixture_layers.push((
                format!("validationTests.{label}.fixtures"),
                layer.fixtures.clone(),
            ));
        }
        assertions.extend(layer.assertions.iter().cloned());
    }
    TestCase {
        name: name.to_owned(),
        description: test.description.clone(),
        fixture_layers,
        extra_context,
        assertions,
    }
}

// === fixtures ===

/// A test's resources: the snapshots the renderer reads and the context `jsonpath`
/// assertions evaluate.
#[derive(Clone, Debug)]
pub struct Fixtures {
    /// The template view of every watched resource.
    pub resources: Resources,
    /// `{"resources": {<name>: [objects in list() order]}, "extraContext": ...}`: every
    /// watched resource (empty when the test has no fixtures for it), objects as the
    /// templates see them.
    pub context: Value,
}

/// Builds a test's snapshots from its fixture layers, the way the `files` source reads
/// manifests: [`manifest::parse`] with the watched resource's filter, so `List` kinds
/// are unpacked, objects of another `apiVersion`/`kind` are dropped, a missing
/// namespace becomes `default` and `ignoreFields` are removed.
///
/// # Errors
///
/// One message per bad fixture object (no `metadata.name`, not a mapping, the same
/// namespace/name twice in one layer), each naming the object
/// (`validationTests.t.fixtures.services[1]`).
pub fn load_fixtures(config: &Config, case: &TestCase) -> Result<Fixtures, Vec<String>> {
    let watched = &config.watched_resources.resources;
    let mut objects: BTreeMap<&str, BTreeMap<ObjectKey, Arc<Value>>> = BTreeMap::new();
    let mut errors = Vec::new();
    for (label, layer) in &case.fixture_layers {
        for (name, items) in layer {
            let Some(resource) = watched.get(name) else {
                errors.push(format!(
                    "{label}.{name}: `{name}` is not a watched resource"
                ));
                continue;
            };
            let mut seen: BTreeMap<ObjectKey, usize> = BTreeMap::new();
            let merged = objects.entry(name.as_str()).or_default();
            for (index, item) in items.iter().enumerate() {
                let at = format!("{label}.{name}[{index}]");
                match normalize(item, resource, &at) {
                    Ok(found) => {
                        for (key, object) in found {
                            if let Some(first) = seen.insert(key.clone(), index) {
                                errors.push(format!(
                                    "{at}: object {key} is already defined by {label}.{name}[{first}]"
                                ));
                                continue;
                            }
                            merged.insert(key, object);
                        }
                    }
                    Err(message) => errors.push(message),
                }
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut resources = Resources::new();
    let mut lists = serde_json::Map::new();
    for (name, resource) in watched {
        let mut snapshot = ResourceSnapshot::new(resource.index_by.clone());
        for (key, object) in objects.remove(name.as_str()).unwrap_or_default() {
            snapshot.upsert(key, &object);
        }
        lists.insert(
            name.clone(),
            Value::Array(snapshot.list().map(StoredObject::parse).collect()),
        );
        resources.update(&Arc::from(name.as_str()), Arc::new(snapshot), None);
    }
    let context = serde_json::json!({
        "resources": Value::Object(lists),
        "extraContext": case.extra_context,
    });
    Ok(Fixtures { resources, context })
}

/// One fixture item through the manifest parser: zero objects (filtered out), one, or
/// several (a `List`).
fn normalize(
    item: &Value,
    resource: &WatchedResource,
    at: &str,
) -> Result<Vec<(ObjectKey, Arc<Value>)>, String> {
    let filter = Filter {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
        ignore_fields: resource.ignore_fields.clone(),
    };
    let bytes = serde_json::to_vec(item).map_err(|error| format!("{at}: {error}"))?;
    let manifest = manifest::parse(&bytes, at, &filter, &Limits::default())
        .map_err(|diagnostic| format!("{at}: {}", diagnostic.message))?;
    if let Some(warning) = manifest.warnings.first() {
        // A `List` defining the same object twice.
        return Err(format!("{at}: {}", warning.message));
    }
    Ok(manifest.objects.into_iter().collect())
}

// === running ===

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
        /// The `jsonpath` context (see [`Fixtures::context`]).
        context: Value,
        /// The render, or its errors.
        render: Result<RenderedConfig, Vec<Diagnostic>>,
        /// Both validation phases, when the render succeeded and an assertion is
        /// `haproxy_valid`: the warnings, or the rejection.
        validation: Option<Result<Vec<Diagnostic>, Rejection>>,
    },
}

/// Default number of tests run at once: the cores, at least 2.
pub fn default_parallelism() -> usize {
    std::thread::available_parallelism()
        .map_or(2, std::num::NonZeroUsize::get)
        .clamp(2, 16)
}

/// Runs `cases` against `config`, at most `parallelism` at a time.
///
/// # Errors
///
/// The templates do not compile (the diagnostics `check` would print).
pub async fn run(
    config: &Config,
    cases: Vec<TestCase>,
    parallelism: usize,
) -> Result<SuiteReport, Vec<Diagnostic>> {
    // One compiled renderer per distinct extraContext; the config's own first, so a
    // template error is reported once, as `check` reports it.
    let mut renderers: BTreeMap<String, Renderer> = BTreeMap::new();
    let base = build::renderer(config)?;
    renderers.insert(context_key(&config.templates.extra_context), base);
    let watched = build::watched_names(config);
    for case in &cases {
        let key = context_key(&case.extra_context);
        if let std::collections::btree_map::Entry::Vacant(entry) = renderers.entry(key) {
            let mut templates = build::templates(config);
            templates.extra_context = case.extra_context.clone();
            entry.insert(Renderer::new(templates, &watched)?);
        }
    }
    let config = Arc::new(config.clone());
    let validator = Arc::new(build::validator_config(&config));
    let tests: Vec<TestReport> = futures::stream::iter(cases)
        .map(|case| {
            let renderer = renderers[&context_key(&case.extra_context)].clone();
            let config = config.clone();
            let validator = validator.clone();
            let name = case.name.clone();
            let description = case.description.clone();
            async move {
                let handle = tokio::spawn(run_case(config, case, renderer, validator));
                handle.await.unwrap_or_else(|error| TestReport {
                    name,
                    description,
                    passed: false,
                    duration_ms: 0,
                    assertions: vec![AssertionReport {
                        kind: "test",
                        target: None,
                        description: None,
                        passed: false,
                        message: format!("the test runner failed: {error}"),
                    }],
                })
            }
        })
        .buffered(parallelism.max(1))
        .collect()
        .await;
    let passed = tests.iter().filter(|t| t.passed).count();
    Ok(SuiteReport {
        failed: tests.len() - passed,
        passed,
        tests,
    })
}

fn context_key(context: &Value) -> String {
    context.to_string()
}

async fn run_case(
    config: Arc<Config>,
    case: TestCase,
    renderer: Renderer,
    validator: Arc<validator::Config>,
) -> TestReport {
    let started = Instant::now();
    let wants_validation = case
        .assertions
        .iter()
        .any(|a| a.kind == AssertionType::HaproxyValid);
    let case = Arc::new(case);
    let prepared = {
        let case = case.clone();
        tokio::task::spawn_blocking(move || {
            load_fixtures(&config, &case)
                .map(|fixtures| (renderer.render(&fixtures.resources), fixtures.context))
        })
        .await
    };
    let outcome = match prepared {
        Err(error) => Outcome::Setup(vec![format!("rendering failed unexpectedly: {error}")]),
        Ok(Err(errors)) => Outcome::Setup(errors),
        Ok(Ok((render, context))) => {
            let validation = match &render {
                Ok(rendered) if wants_validation => {
                    Some(validator::validate(rendered, &validator).await)
                }
                _ => None,
            };
            Outcome::Rendered {
                context,
                render,
                validation,
            }
        }
    };
    let assertions: Vec<AssertionReport> =
        case.assertions.iter().map(|a| check(a, &outcome)).collect();
    TestReport {
        name: case.name.clone(),
        description: case.description.clone(),
        passed: assertions.iter().all(|a| a.passed),
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        assertions,
    }
}

// === assertions ===

/// Checks one assertion against a test's outcome.
pub fn check(assertion: &Assertion, outcome: &Outcome) -> AssertionReport {
    let target = match assertion.kind {
        AssertionType::HaproxyValid => None,
        AssertionType::Jsonpath => assertion.path.clone(),
        _ => assertion.target.clone(),
    };
    let result = evaluate(assertion, outcome);
    let (passed, message) = match result {
        Ok(message) => (true, message),
        Err(message) => (false, message.trim_end().to_owned()),
    };
    AssertionReport {
        kind: assertion.kind.as_str(),
        target,
        description: assertion.description.clone(),
        passed,
        message,
    }
}

/// `Ok(what held)` or `Err(why not, with an excerpt)`.
fn evaluate(assertion: &Assertion, outcome: &Outcome) -> Result<String, String> {
    let (context, render, validation) = match outcome {
        Outcome::Setup(errors) => {
            return Err(format!(
                "not checked: the test's fixtures are invalid:\n{}",
                indent(&errors.join("\n"), 2)
            ));
        }
        Outcome::Rendered {
            context,
            render,
            validation,
        } => (context, render, validation),
    };
    match assertion.kind {
        AssertionType::HaproxyValid => match (render, validation) {
            (Err(errors), _) => Err(format!(
                "not checked: the render failed:\n{}",
                indent(&render_error_text(errors), 2)
            )),
            (Ok(_), Some(Ok(warnings))) if warnings.is_empty() => {
                Ok("both validation phases accept the render".to_owned())
            }
            (Ok(_), Some(Ok(warnings))) => Ok(format!(
                "both validation phases accept the render, with warnings:\n{}",
                indent(&render_error_text(warnings), 2)
            )),
            (Ok(_), Some(Err(rejection))) => Err(format!(
                "{}{}",
                rejection,
                if rejection.tool_failure {
                    "\n(HAProxy could not judge the configuration: check haproxy.binary)"
                } else {
                    ""
                }
            )),
            (Ok(_), None) => Err("not checked: validation did not run".to_owned()),
        },
        AssertionType::Jsonpath => {
            let path = assertion.path.as_deref().unwrap_or_default();
            let expected = assertion.expected.as_ref().unwrap_or(&Value::Null);
            check_jsonpath(path, expected, context)
        }
        _ => {
            let target = assertion.target.as_deref().unwrap_or_default();
            let text = target_text(target, render)?;
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
) -> Result<String, String> {
    match render {
        Ok(_) if target == RENDERING_ERROR_TARGET => Ok(String::new()),
        Err(errors) if target == RENDERING_ERROR_TARGET => Ok(render_error_text(errors)),
        Err(errors) => Err(format!(
            "not checked: the render failed, so there is no {target}:\n{}",
            indent(&render_error_text(errors), 2)
        )),
        Ok(rendered) => rendered
            .iter()
            .find(|(file, _)| {
                file.relative_path() == hapwright_reconciler::config::target_path(target)
            })
            .map(|(_, content)| content.to_string())
            .ok_or_else(|| format!("{target} is not a rendered file")),
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

fn compile(pattern: &str) -> Result<Regex, String> {
    RegexBuilder::new(pattern)
        .multi_line(true)
        .build()
        .map_err(|error| format!("invalid regex `{pattern}`: {error}"))
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

fn contains(target: &str, text: String, pattern: &str) -> Result<String, String> {
    let regex = compile(pattern)?;
    match regex.find(&text) {
        Some(found) => Ok(format!(
            "`{pattern}` matches {target} at line {}",
            line_of(&text, found.start())
        )),
        None => Err(format!(
            "`{pattern}` does not match {}\n{}",
            describe_target(target, &text),
            closest_excerpt(target, &text, pattern)
        )),
    }
}

fn not_contains(target: &str, text: String, pattern: &str) -> Result<String, String> {
    let regex = compile(pattern)?;
    match regex.find(&text) {
        None => Ok(format!(
            "`{pattern}` does not match {}",
            describe_target(target, &text)
        )),
        Some(found) => {
            let line = line_of(&text, found.start());
            Err(format!(
                "`{pattern}` matches {target} at line {line}, expected no match\n{}",
                excerpt(target, &text, &[line])
            ))
        }
    }
}

fn match_count(target: &str, text: String, pattern: &str, count: u64) -> Result<String, String> {
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
        return Ok(format!("`{pattern}` matches {target} {}", times(found)));
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
    Err(format!(
        "`{pattern}` matches {} {}, expected {}\n{detail}",
        describe_target(target, &text),
        times(found),
        times(count)
    ))
}

fn match_order(target: &str, text: String, patterns: &[String]) -> Result<String, String> {
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
                return Err(format!(
                    "{problem}; expected the patterns in this order: {}\n{shown}",
                    quote_list(patterns)
                ));
            }
        }
    }
    Ok(format!(
        "{} match {target} in this order (lines {})",
        quote_list(patterns),
        found_lines
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

fn quote_list(patterns: &[String]) -> String {
    patterns
        .iter()
        .map(|p| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn equals(target: &str, text: String, expected: &str) -> Result<String, String> {
    if text == expected {
        return Ok(format!("{target} is exactly as expected"));
    }
    let shown = describe_target(target, &text);
    let (actual_lines, expected_lines) = (lines_of(&text), lines_of(expected));
    if actual_lines == expected_lines {
        let newlines = |t: &str| t.len() - t.trim_end_matches('\n').len();
        return Err(format!(
            "{shown} differs from `expected` only at the end: it ends with {}, `expected` with {}",
            plural(newlines(&text), "newline"),
            plural(newlines(expected), "newline"),
        ));
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
    Err(out.trim_end().to_owned())
}

fn check_jsonpath(path: &str, expected: &Value, context: &Value) -> Result<String, String> {
    let query = serde_json_path::JsonPath::parse(path)
        .map_err(|error| format!("invalid JSONPath `{path}`: {error}"))?;
    let nodes: Vec<&Value> = query.query(context).all();
    let as_list = Value::Array(nodes.iter().copied().cloned().collect());
    let single_match = matches!(nodes.as_slice(), [only] if json_eq(only, expected));
    if single_match || json_eq(&as_list, expected) {
        return Ok(format!("`{path}` yields {}", short_json(expected)));
    }
    let found = match nodes.as_slice() {
        [] => "nothing (no node matches)".to_owned(),
        [only] => short_json(only),
        _ => format!("{} nodes: {}", nodes.len(), short_json(&as_list)),
    };
    Err(format!(
        "`{path}` yields {found}, expected {}\n(evaluated on {{\"resources\": {{<watched resource>: [objects]}}, \"extraContext\": ...}})",
        short_json(expected)
    ))
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

fn short_json(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= MAX_JSON_CHARS {
        text
    } else {
        let cut: String = text.chars().take(MAX_JSON_CHARS).collect();
        format!("{cut}...")
    }
}

// === excerpts ===

/// The lines of a text; a final newline ends the last line rather than starting an
/// empty one.
fn lines_of(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.split('\n').collect();
    if lines.len() > 1 && lines.last() == Some(&"") {
        lines.pop();
    }
    lines
}

fn plural(count: usize, word: &str) -> String {
    if count == 1 {
        format!("1 {word}")
    } else {
        format!("{count} {word}s")
    }
}

fn indent(text: &str, by: usize) -> String {
    let pad = " ".repeat(by);
    text.lines()
        .map(|line| format!("{pad}{line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The line numbers within [`EXCERPT_RADIUS`] of `line`, clipped to the text.
fn around(line: usize, text: &str) -> Vec<usize> {
    let total = lines_of(text).len();
    (line.saturating_sub(EXCERPT_RADIUS).max(1)..=(line + EXCERPT_RADIUS).min(total)).collect()
}

/// The lines of `text` around each of `centres` (merged), with line numbers and the
/// centres marked.
fn excerpt(target: &str, text: &str, centres: &[usize]) -> String {
    let mut lines: Vec<usize> = centres.iter().flat_map(|&c| around(c, text)).collect();
    lines.sort_unstable();
    lines.dedup();
    format!("{target}:\n{}", numbered(text, &lines, centres))
}

/// Numbered lines, `>` marking `marked` and `...` between gaps.
fn numbered(text: &str, lines: &[usize], marked: &[usize]) -> String {
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
fn closest_excerpt(target: &str, text: &str, pattern: &str) -> String {
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
fn literals(pattern: &str) -> Vec<String> {
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
fn closest_line(text: &str, pattern: &str) -> Option<usize> {
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

// === text output ===

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

#[cfg(test)]
mod tests {
    use super::*;
    use hapwright_eventbus::model::SourceMap;
    use serde_json::json;

    fn rendered(main: &str, maps: &[(&str, &str)]) -> Outcome {
        Outcome::Rendered {
            context: json!({"resources": {"services": [{"metadata": {"name": "web"}}]}, "extraContext": {"port": 8080}}),
            render: Ok(RenderedConfig::new(
                main,
                maps.iter()
                    .map(|(n, c)| ((*n).to_owned(), Arc::from(*c)))
                    .collect(),
                BTreeMap::new(),
                BTreeMap::new(),
                SourceMap::default(),
            )),
            validation: None,
        }
    }

    fn failed_render() -> Outcome {
        Outcome::Rendered {
            context: json!({}),
            render: Err(vec![Diagnostic::error("fail(): no backends").at(
                hapwright_eventbus::model::SourceLocation::new("haproxy.cfg", Some(3), Some(4)),
            )]),
            validation: None,
        }
    }

    fn assertion(yaml: &str) -> Assertion {
        let assertion: Assertion = serde_saphyr::from_str(yaml).unwrap();
        assert!(
            assertion.validate().is_empty(),
            "{:?}",
            assertion.validate()
        );
        assertion
    }

    const CFG: &str = "global\n    log stderr\n\nfrontend http\n    bind :80\n\nbackend be_default_web\n    server web-1 10.0.0.1:80\n    server web-2 10.0.0.2:80\n";

    #[test]
    fn contains_passes_and_fails_with_the_closest_line() {
        let outcome = rendered(CFG, &[]);
        let ok = check(
            &assertion("{type: contains, target: haproxy.cfg, pattern: 'backend be_default_web'}"),
            &outcome,
        );
        assert!(ok.passed, "{}", ok.message);
        assert!(ok.message.contains("line 7"), "{}", ok.message);
        let bad = check(
            &assertion("{type: contains, target: haproxy.cfg, pattern: 'backend be_default_api'}"),
            &outcome,
        );
        assert!(!bad.passed);
        assert!(
            bad.message
                .contains("`backend be_default_api` does not match haproxy.cfg")
        );
        assert!(bad.message.contains("closest line, 7"), "{}", bad.message);
        assert!(
            bad.message.contains("> 7 | backend be_default_web"),
            "{}",
            bad.message
        );
        assert!(
            bad.message.contains("  9 |     server web-2"),
            "{}",
            bad.message
        );
    }

    #[test]
    fn regexes_are_multi_line() {
        let outcome = rendered(CFG, &[]);
        let ok = check(
            &assertion(
                "{type: match_count, target: haproxy.cfg, pattern: '^    server ', count: 2}",
            ),
            &outcome,
        );
        assert!(ok.passed, "{}", ok.message);
    }

    #[test]
    fn a_pattern_sharing_nothing_shows_the_first_lines() {
        let outcome = rendered(CFG, &[]);
        let bad = check(
            &assertion("{type: contains, target: haproxy.cfg, pattern: 'xyzzy'}"),
            &outcome,
        );
        assert!(!bad.passed);
        assert!(
            bad.message.contains("first 9 of 9 lines"),
            "{}",
            bad.message
        );
        assert!(bad.message.contains("1 | global"), "{}", bad.message);
    }

    #[test]
    fn not_contains_shows_the_match() {
        let outcome = rendered(CFG, &[]);
        let ok = check(
            &assertion("{type: not_contains, target: haproxy.cfg, pattern: 'staging'}"),
            &outcome,
        );
        assert!(ok.passed);
        let bad = check(
            &assertion("{type: not_contains, target: haproxy.cfg, pattern: 'bind :\\d+'}"),
            &outcome,
        );
        assert!(!bad.passed);
        assert!(
            bad.message
                .contains("`bind :\\d+` matches haproxy.cfg at line 5, expected no match"),
            "{}",
            bad.message
        );
        assert!(
            bad.message.contains("> 5 |     bind :80"),
            "{}",
            bad.message
        );
    }

    #[test]
    fn match_count_lists_the_matching_lines() {
        let outcome = rendered(CFG, &[]);
        let bad = check(
            &assertion("{type: match_count, target: haproxy.cfg, pattern: 'server ', count: 3}"),
            &outcome,
        );
        assert!(!bad.passed);
        assert!(
            bad.message
                .contains("`server ` matches haproxy.cfg 2 times, expected 3 times"),
            "{}",
            bad.message
        );
        assert!(
            bad.message.contains("> 8 |     server web-1"),
            "{}",
            bad.message
        );
        assert!(
            bad.message.contains("> 9 |     server web-2"),
            "{}",
            bad.message
        );
        let zero = check(
            &assertion("{type: match_count, target: haproxy.cfg, pattern: 'listen ', count: 0}"),
            &outcome,
        );
        assert!(zero.passed, "{}", zero.message);
        let once = check(
            &assertion("{type: match_count, target: haproxy.cfg, pattern: 'frontend', count: 2}"),
            &outcome,
        );
        assert!(
            once.message.contains("once, expected 2 times"),
            "{}",
            once.message
        );
    }

    #[test]
    fn match_order_reports_the_pattern_out_of_order() {
        let outcome = rendered(CFG, &[]);
        let ok = check(
            &assertion(
                "{type: match_order, target: haproxy.cfg, patterns: [global, frontend, backend]}",
            ),
            &outcome,
        );
        assert!(ok.passed, "{}", ok.message);
        assert!(ok.message.contains("lines 1, 4, 7"), "{}", ok.message);
        let bad = check(
            &assertion("{type: match_order, target: haproxy.cfg, patterns: [backend, frontend]}"),
            &outcome,
        );
        assert!(!bad.passed);
        assert!(
            bad.message
                .contains("`frontend` matches haproxy.cfg only before `backend` (line 4"),
            "{}",
            bad.message
        );
        assert!(
            bad.message.contains("> 4 | frontend http"),
            "{}",
            bad.message
        );
        let missing = check(
            &assertion("{type: match_order, target: haproxy.cfg, patterns: [global, peers]}"),
            &outcome,
        );
        assert!(
            missing
                .message
                .contains("`peers` does not match haproxy.cfg")
        );
    }

    #[test]
    fn equals_shows_the_first_difference() {
        let outcome = rendered(CFG, &[("hosts.map", "a.example be_a\nb.example be_b\n")]);
        let ok = check(
            &assertion(
                "{type: equals, target: maps/hosts.map, expected: \"a.example be_a\\nb.example be_b\\n\"}",
            ),
            &outcome,
        );
        assert!(ok.passed, "{}", ok.message);
        let bad = check(
            &assertion(
                "{type: equals, target: maps/hosts.map, expected: \"a.example be_a\\nb.example be_c\\n\"}",
            ),
            &outcome,
        );
        assert!(!bad.passed);
        assert!(
            bad.message
                .contains("maps/hosts.map differs from `expected` at line 2"),
            "{}",
            bad.message
        );
        assert!(
            bad.message.contains("> 2 | b.example be_c"),
            "{}",
            bad.message
        );
        assert!(
            bad.message.contains("> 2 | b.example be_b"),
            "{}",
            bad.message
        );
    }

    #[test]
    fn jsonpath_compares_one_node_or_the_node_list() {
        let outcome = rendered(CFG, &[]);
        for yaml in [
            "{type: jsonpath, path: '$.resources.services[0].metadata.name', expected: web}",
            "{type: jsonpath, path: '$.resources.services[*].metadata.name', expected: [web]}",
            "{type: jsonpath, path: '$.extraContext.port', expected: 8080.0}",
            "{type: jsonpath, path: '$.resources.nothing[*]', expected: []}",
        ] {
            let report = check(&assertion(yaml), &outcome);
            assert!(report.passed, "{yaml}: {}", report.message);
        }
        let bad = check(
            &assertion(
                "{type: jsonpath, path: '$.resources.services[0].metadata.name', expected: api}",
            ),
            &outcome,
        );
        assert!(!bad.passed);
        assert!(
            bad.message.contains("yields \"web\", expected \"api\""),
            "{}",
            bad.message
        );
        assert_eq!(
            bad.target.as_deref(),
            Some("$.resources.services[0].metadata.name")
        );
        let none = check(
            &assertion("{type: jsonpath, path: '$.resources.nope', expected: 1}"),
            &outcome,
        );
        assert!(none.message.contains("yields nothing"), "{}", none.message);
        let invalid = check(
            &assertion("{type: jsonpath, path: 'resources[', expected: 1}"),
            &outcome,
        );
        assert!(!invalid.passed);
        assert!(
            invalid.message.starts_with("invalid JSONPath `resources[`"),
            "{}",
            invalid.message
        );
    }

    #[test]
    fn a_failed_render_fails_file_assertions_but_feeds_rendering_error() {
        let outcome = failed_render();
        let on_file = check(
            &assertion("{type: not_contains, target: haproxy.cfg, pattern: x}"),
            &outcome,
        );
        assert!(!on_file.passed);
        assert!(
            on_file
                .message
                .starts_with("not checked: the render failed, so there is no haproxy.cfg"),
            "{}",
            on_file.message
        );
        assert!(
            on_file
                .message
                .contains("haproxy.cfg:3:4: fail(): no backends")
        );
        let valid = check(&assertion("{type: haproxy_valid}"), &outcome);
        assert!(!valid.passed);
        assert!(valid.message.starts_with("not checked: the render failed"));
        let error = check(
            &assertion(
                "{type: contains, target: rendering_error, pattern: 'fail\\(\\): no backends'}",
            ),
            &outcome,
        );
        assert!(error.passed, "{}", error.message);
        // Without a render error, `rendering_error` is empty.
        let ok = rendered(CFG, &[]);
        let expects_error = check(
            &assertion("{type: contains, target: rendering_error, pattern: fail}"),
            &ok,
        );
        assert!(!expects_error.passed);
        assert!(
            expects_error
                .message
                .contains("rendering_error (empty: the render succeeded)"),
            "{}",
            expects_error.message
        );
        assert!(
            check(
                &assertion("{type: equals, target: rendering_error, expected: ''}"),
                &ok
            )
            .passed
        );
    }

    #[test]
    fn invalid_fixtures_fail_every_assertion() {
        let outcome = Outcome::Setup(vec![
            "validationTests.t.fixtures.services[0]: Service has no metadata.name".to_owned(),
        ]);
        for yaml in [
            "{type: haproxy_valid}",
            "{type: contains, target: rendering_error, pattern: x}",
            "{type: jsonpath, path: '$', expected: 1}",
        ] {
            let report = check(&assertion(yaml), &outcome);
            assert!(!report.passed);
            assert!(
                report.message.contains("fixtures are invalid"),
                "{}",
                report.message
            );
            assert!(
                report.message.contains("has no metadata.name"),
                "{}",
                report.message
            );
        }
    }

    #[test]
    fn extra_context_merges_mappings_recursively() {
        let mut base = json!({"a": 1, "nested": {"x": 1, "y": [1, 2]}, "keep": true});
        merge_json(
            &mut base,
            &json!({"a": 2, "nested": {"y": [3], "z": null}, "new": "v"}),
        );
        assert_eq!(
            base,
            json!({"a": 2, "nested": {"x": 1, "y": [3], "z": null}, "keep": true, "new": "v"})
        );
        let mut scalar = json!({"a": 1});
        merge_json(&mut scalar, &json!([1]));
        assert_eq!(scalar, json!([1]));
    }

    #[test]
    fn equals_names_a_difference_in_final_newlines() {
        let outcome = rendered(CFG, &[("hosts.map", "a b\n")]);
        let bad = check(
            &assertion("{type: equals, target: maps/hosts.map, expected: 'a b'}"),
            &outcome,
        );
        assert!(!bad.passed);
        assert_eq!(
            bad.message,
            "maps/hosts.map differs from `expected` only at the end: it ends with 1 newline, \
             `expected` with 0 newlines"
        );
        let longer = check(
            &assertion("{type: equals, target: maps/hosts.map, expected: \"a b\\nc d\\n\"}"),
            &outcome,
        );
        assert!(longer.message.contains("at line 2"), "{}", longer.message);
        assert!(
            longer.message.contains("(ends before line 2)"),
            "{}",
            longer.message
        );
    }

    fn config(tests: &str) -> Config {
        serde_saphyr::from_str(&format!(
            r#"
watchedResources:
  services:
    files: {{ path: /nonexistent }}
    kind: Service
    indexBy: [metadata.namespace, metadata.name]
    ignoreFields: [status]
haproxyConfig: {{ template: "x" }}
extraContext: {{ a: 1, nested: {{ b: 2 }} }}
validationTests:
{tests}
"#
        ))
        .unwrap()
    }

    #[test]
    fn cases_merge_global_and_select_by_name() {
        let config = config(
            r#"
  _global:
    fixtures: { services: [ { apiVersion: v1, kind: Service, metadata: { name: g } } ] }
    extraContext: { nested: { c: 3 } }
    assertions: [ { type: haproxy_valid, description: global } ]
  b:
    description: second
    extraContext: { a: 9 }
    assertions: [ { type: contains, target: haproxy.cfg, pattern: x } ]
  a:
    fixtures: { services: [ { apiVersion: v1, kind: Service, metadata: { name: own } } ] }
    assertions: [ { type: contains, target: haproxy.cfg, pattern: x } ]
"#,
        );
        let all = cases(&config, None).unwrap();
        let names: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        let b = &all[1];
        assert_eq!(b.description.as_deref(), Some("second"));
        assert_eq!(b.extra_context, json!({"a": 9, "nested": {"b": 2, "c": 3}}));
        assert_eq!(b.assertions.len(), 2);
        assert_eq!(b.assertions[0].description.as_deref(), Some("global"));
        assert_eq!(b.fixture_layers.len(), 1);
        assert_eq!(all[0].fixture_layers.len(), 2);
        assert_eq!(
            all[0].fixture_layers[0].0,
            "validationTests._global.fixtures"
        );
        assert_eq!(all[0].fixture_layers[1].0, "validationTests.a.fixtures");

        assert_eq!(cases(&config, Some("b")).unwrap().len(), 1);
        assert_eq!(
            cases(&config, Some("c")).unwrap_err().to_string(),
            "no test named `c` (validationTests has: a, b)"
        );
        assert_eq!(
            cases(&config, Some(GLOBAL_TEST)).unwrap_err(),
            SelectError::GlobalSelected
        );
    }

    #[test]
    fn fixtures_layer_by_key_and_follow_the_source_rules() {
        let config = config(
            r#"
  _global:
    fixtures:
      services:
        - { apiVersion: v1, kind: Service, metadata: { name: web }, spec: { port: 1 } }
        - { apiVersion: v1, kind: Service, metadata: { name: keep, namespace: ops }, status: { x: 1 } }
    assertions: [ { type: haproxy_valid } ]
  t:
    fixtures:
      services:
        - { apiVersion: v1, kind: Service, metadata: { name: web, namespace: default }, spec: { port: 2 } }
        - { apiVersion: v1, kind: Secret, metadata: { name: dropped } }
    assertions: [ { type: haproxy_valid } ]
"#,
        );
        let case = cases(&config, Some("t")).unwrap().remove(0);
        let fixtures = load_fixtures(&config, &case).unwrap();
        assert_eq!(
            fixtures.context["resources"]["services"],
            json!([
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"}, "spec": {"port": 2}},
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "keep", "namespace": "ops"}},
            ])
        );
        assert_eq!(
            fixtures.context["extraContext"],
            json!({"a": 1, "nested": {"b": 2}})
        );
        let store = fixtures.resources.get("services").unwrap();
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn literals_skip_escapes_and_short_runs() {
        assert_eq!(literals(r"^\s+server web-\d+ (?i)x"), ["server", "web"]);
        assert_eq!(
            literals("backend be_default_web"),
            ["backend", "be_default_web"]
        );
    }

    #[test]
    fn numbered_marks_gaps() {
        let text = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl";
        let shown = excerpt("t", text, &[2, 10]);
        assert!(
            shown.contains("...\n") || shown.contains("... |"),
            "{shown}"
        );
        assert!(shown.contains(">  2 | b"), "{shown}");
        assert!(shown.contains("> 10 | j"), "{shown}");
        assert!(!shown.contains(" 6 | f"), "{shown}");
    }
}
