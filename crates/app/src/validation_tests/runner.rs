//! Running the selected tests: one compiled renderer per distinct `extraContext`, the
//! tests in parallel, each one rendered, validated when it asks for it, and checked
//! ([`run`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use hapwright_deployer::component::validator;
use hapwright_eventbus::model::ContentHash;
use hapwright_eventbus::model::Diagnostic;
use hapwright_reconciler::config::{AssertionType, TestDeployment, TestInstanceState};
use hapwright_reconciler::renderer::{Renderer, Resources};
use hapwright_reconciler::status::{Failure, Fleet, InstanceState, Running};
use serde_json::Value;

use super::assertions::{Outcome, RenderedStatuses, check};
use super::cases::TestCase;
use super::fixtures::load_fixtures;
use super::report::{AssertionReport, SuiteReport, TestReport};
use crate::build;
use crate::config::Config;

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

/// The time a test's statuses give new conditions (`lastTransitionTime`), fixed so
/// `equals` assertions on statuses are stable.
pub const STATUS_TEST_TIME: &str = "1970-01-01T00:00:00Z";

/// The render hash a test's statuses describe (tests render no real hash).
fn test_render() -> ContentHash {
    ContentHash::of(b"validationTests")
}

/// The fleet a test's status templates see: its `deployment`, else one instance,
/// `haproxy`, serving the render.
fn test_fleet(deployment: Option<&TestDeployment>) -> Fleet {
    let render = test_render();
    let Some(deployment) = deployment else {
        return Fleet::serving(render, ["haproxy"]);
    };
    let older = ContentHash::of(b"validationTests: an older config");
    let mut instances: Vec<InstanceState> = deployment
        .instances
        .iter()
        .map(|instance| {
            let mut state = InstanceState::new(instance.name.clone());
            match instance.state {
                TestInstanceState::Serving => {
                    state.runs = Some(Running {
                        hash: render,
                        snapshots: None,
                    });
                }
                TestInstanceState::Lagging | TestInstanceState::Failing => {
                    state.runs = Some(Running {
                        hash: older,
                        snapshots: None,
                    });
                }
                TestInstanceState::Pending => {}
            }
            if instance.state == TestInstanceState::Failing {
                state.failure = Some(Failure {
                    hash: render,
                    error: instance
                        .error
                        .clone()
                        .unwrap_or_else(|| "deployment failed".to_owned()),
                });
            }
            state
        })
        .collect();
    instances.sort_by(|a, b| a.name.cmp(&b.name));
    Fleet { render, instances }
}

/// Renders the status templates over a test's fixtures, with the test's
/// `extraContext` and `deployment`.
fn render_statuses(
    config: &Config,
    extra_context: &Value,
    deployment: Option<&TestDeployment>,
    resources: &Resources,
) -> RenderedStatuses {
    let mut templates = build::templates(config);
    templates.extra_context = extra_context.clone();
    match build::status_templates_with(config, &templates) {
        Ok(compiled) => {
            let (statuses, errors) = compiled.render(
                &resources.snapshots(),
                &test_fleet(deployment),
                STATUS_TEST_TIME,
            );
            RenderedStatuses { statuses, errors }
        }
        Err(errors) => RenderedStatuses {
            statuses: Vec::new(),
            errors,
        },
    }
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
    let wants_statuses = case.assertions.iter().any(|a| {
        a.target
            .as_deref()
            .is_some_and(|t| t.starts_with(hapwright_reconciler::config::STATUS_TARGET_PREFIX))
    });
    let case = Arc::new(case);
    let prepared = {
        let case = case.clone();
        tokio::task::spawn_blocking(move || {
            load_fixtures(&config, &case).map(|fixtures| {
                let statuses = wants_statuses.then(|| {
                    render_statuses(
                        &config,
                        &case.extra_context,
                        case.deployment.as_ref(),
                        &fixtures.resources,
                    )
                });
                (
                    renderer.render(&fixtures.resources),
                    fixtures.context,
                    statuses,
                )
            })
        })
        .await
    };
    let outcome = match prepared {
        Err(error) => Outcome::Setup(vec![format!("rendering failed unexpectedly: {error}")]),
        Ok(Err(errors)) => Outcome::Setup(errors.iter().map(ToString::to_string).collect()),
        Ok(Ok((render, context, statuses))) => {
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
                statuses,
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
