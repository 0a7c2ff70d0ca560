//! Which tests run, and what each one is once `_global` is merged in: [`TestCase`],
//! built by [`cases()`] from the config's `validationTests`.

use std::collections::BTreeMap;

use hapwright_reconciler::config::{Assertion, TestDeployment, ValidationTest};
use serde_json::Value;

use crate::config::Config;

/// Name of the test that is merged into every other test and never runs on its own.
pub const GLOBAL_TEST: &str = "_global";

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
    /// The deployment status templates see: the test's own, else `_global`'s.
    pub deployment: Option<TestDeployment>,
}

/// Why no test could be selected. Not retryable: `--test` must name another test.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// `--test NAME` names no test.
    #[error("no test named `{name}`{}", available_tests(available))]
    NoSuchTest {
        /// The name asked for.
        name: String,
        /// The tests the config defines (without `_global`).
        available: Vec<String>,
    },
    /// `--test _global`: that one is merged into the others, not run.
    #[error(
        "`{GLOBAL_TEST}` is merged into every test and does not run on its own; name \
         another test"
    )]
    GlobalSelected,
}

/// The end of [`SelectError::NoSuchTest`]'s message: what the config has instead.
fn available_tests(available: &[String]) -> String {
    if available.is_empty() {
        ": the config has no validationTests".to_owned()
    } else {
        format!(" (validationTests has: {})", available.join(", "))
    }
}

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
    let mut deployment = None;
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
        if layer.deployment.is_some() {
            deployment.clone_from(&layer.deployment);
        }
    }
    TestCase {
        name: name.to_owned(),
        description: test.description.clone(),
        fixture_layers,
        extra_context,
        assertions,
        deployment,
    }
}
