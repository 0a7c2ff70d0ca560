//! `hapwright test`: runs the config file's `validationTests`.
//!
//! Each test stands its fixtures in for the watched resources, renders every template
//! once and checks its assertions against the result:
//!
//! 1. [`cases()`] selects the tests and merges `_global` ([`GLOBAL_TEST`]) into each:
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
//!
//! # Layout
//!
//! - `cases`: selection by name and the `_global` merge ([`TestCase`]).
//! - `fixtures`: fixture objects to snapshots ([`Fixtures`]).
//! - `runner`: renders, validates and checks the tests in parallel ([`run`]).
//! - `assertions`: one assertion against a test's [`Outcome`] ([`check`]).
//! - `excerpt`: the numbered excerpts in assertion messages.
//! - `report`: the results and their text form ([`SuiteReport`], [`format_text`]).

mod assertions;
mod cases;
mod excerpt;
mod fixtures;
mod report;
mod runner;

pub use assertions::{Outcome, check};
pub use cases::{GLOBAL_TEST, SelectError, TestCase, cases, merge_json};
pub use fixtures::{FixtureError, Fixtures, load_fixtures};
pub use report::{AssertionReport, OutputFormat, SuiteReport, TestReport, describe, format_text};
pub use runner::{default_parallelism, run};

#[cfg(test)]
mod tests;
