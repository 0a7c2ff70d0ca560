//! `hapwright plan`: what a deployment of a render would do to each instance — nothing,
//! runtime commands, or a reload and why — decided without touching HAProxy, by the
//! deployer's own planner ([`hapwright_deployer::driver::plan_against`]).
//!
//! The desired side is one render of the config file from its `files` sources or from
//! `--fixtures DIR`, validated as the controller validates it (both phases). The
//! running side is, per instance, either a config directory hapwright deployed to
//! (its files and `.hapwright-state.json`, read as the socket driver reads them after
//! a restart: [`Recorded`]) or a second fixtures directory rendered the same way.
//! Without `--running` or `--running-fixtures` the socket instances of the config
//! file are compared, each with its `configDir`.
//!
//! What the instance can do beyond every line's runtime changes (added and removed
//! backends, `haproxy.dynamicBackends`) depends on its HAProxy line: taken from
//! `--haproxy-version`, or else from `haproxy -v` of `haproxy.binary` (the binary
//! phase 2 runs), where the deployer asks each instance's master.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hapwright_deployer::client::master::Version;
use hapwright_deployer::component::validator;
use hapwright_deployer::driver::{Deployed, Recorded, plan_against};
use hapwright_deployer::haproxy::files::ConfigDir;
use hapwright_deployer::haproxy::plan::{ChangePlan, PlanOptions, RuntimeOp};
use hapwright_eventbus::model::{DeployReason, DeployStrategy, ReloadReason, haproxy::parse_main};
use serde::Serialize;

use crate::build;
use crate::commands::{load, print_errors, render_once};
use crate::config;
use crate::run::exit;
use crate::validation_tests::OutputFormat;

/// Exit codes of `hapwright plan` beyond [`exit`]'s: the most disruptive verdict over
/// every instance (0, [`exit::OK`], is no change anywhere).
pub mod verdict_exit {
    /// At least one instance gets runtime commands, none reloads.
    pub const RUNTIME: u8 = 3;
    /// At least one instance reloads.
    pub const RELOAD: u8 = 4;
}

/// What `hapwright plan` compares the render with.
#[derive(Clone, Debug, Default)]
pub struct Running {
    /// Config directories hapwright deployed to (`--running DIR`).
    pub dirs: Vec<PathBuf>,
    /// Fixtures directories, each rendered as the running config
    /// (`--running-fixtures DIR`).
    pub fixtures: Vec<PathBuf>,
}

/// The whole answer, as `--output json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The most disruptive strategy over every instance: `noop`, `runtime` or `reload`.
    pub verdict: DeployStrategy,
    /// One entry per compared instance, in the order given.
    pub instances: Vec<InstancePlan>,
}

/// The deployment one instance would get.
#[derive(Clone, Debug, Serialize)]
pub struct InstancePlan {
    /// The instance's name in the config file, or the directory's path when it is no
    /// configured instance's `configDir`.
    pub instance: String,
    /// What the running side was read from.
    pub compared_with: Source,
    /// That directory.
    pub path: PathBuf,
    /// `noop`, `runtime` or `reload`.
    pub strategy: DeployStrategy,
    /// With `runtime`: the runtime commands in the order they would run, in words
    /// (the deployer's log wording). Empty otherwise: a reload applies everything.
    pub runtime: Vec<String>,
    /// With `reload`: every cause the planner found, the one the deployer reports
    /// first. Empty otherwise.
    pub reload: Vec<Cause>,
}

/// Where `hapwright plan` read what an instance runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A config directory hapwright deployed to, with its state record.
    ConfigDir,
    /// A fixtures directory, rendered.
    Fixtures,
}

/// One cause of a reload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cause {
    /// Its class, the `reason` label of `hapwright_reloads_total` (`structure`,
    /// `server_options`, `new_file`, `first_deploy`).
    pub reason: &'static str,
    /// The exact cause, in the words of the deployer's logs and events.
    pub detail: String,
}

impl From<&DeployReason> for Cause {
    fn from(reason: &DeployReason) -> Self {
        Self {
            reason: reason.reload.unwrap_or(ReloadReason::Structure).as_str(),
            detail: reason.detail.clone(),
        }
    }
}

/// One instance to compare with.
struct Target {
    name: String,
    compared_with: Source,
    path: PathBuf,
}

/// `plan -c FILE [--fixtures DIR] [--running DIR]... [--running-fixtures DIR]...
/// [--haproxy-version X.Y] [--output text|json]`.
pub async fn command(
    path: &Path,
    fixtures: Option<&Path>,
    running: &Running,
    haproxy_version: Option<Version>,
    output: OutputFormat,
) -> u8 {
    let loaded = match load(path) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let config = &loaded.config;
    let targets = match targets(config, running) {
        Ok(targets) => targets,
        Err(message) => {
            eprintln!("{}: {message}", path.display());
            return exit::CONFIG;
        }
    };
    let desired = match render_once(&loaded, fixtures) {
        Ok(rendered) => Arc::new(rendered),
        Err(code) => return code,
    };
    match validator::validate(&desired, &build::validator_config(config)).await {
        Ok(warnings) => print_errors(&loaded.templates_at.locate(warnings)),
        Err(rejection) => {
            print_errors(&loaded.templates_at.locate(rejection.errors));
            return exit::FAILURE;
        }
    }
    let desired_model = match parse_main(&desired) {
        Ok(model) => model,
        Err(error) => {
            print_errors(&[error.to_diagnostic(desired.main())]);
            return exit::FAILURE;
        }
    };
    let options = plan_options(config, haproxy_version).await;
    let mut report = Report {
        verdict: DeployStrategy::Noop,
        instances: Vec::new(),
    };
    for target in targets {
        let running = match running_of(&loaded, &target) {
            Ok(running) => running,
            Err(code) => return code,
        };
        let plan = match &running {
            Ok(deployed) => plan_against(Some(deployed), &desired, &desired_model, &options),
            Err(unknown) => {
                let mut plan = plan_against(None, &desired, &desired_model, &options);
                for cause in plan.causes.iter_mut().chain(plan.reload.as_mut()) {
                    cause.detail = format!("{} ({unknown})", cause.detail);
                }
                plan
            }
        };
        let entry = instance_plan(target, &plan);
        report.verdict = most_disruptive(report.verdict, entry.strategy);
        report.instances.push(entry);
    }
    if output.print(&report, || format_text(&report)).is_err() {
        return exit::FAILURE;
    }
    exit_code(report.verdict)
}

/// The exit status of a verdict.
pub fn exit_code(verdict: DeployStrategy) -> u8 {
    match verdict {
        DeployStrategy::Noop => exit::OK,
        DeployStrategy::Runtime => verdict_exit::RUNTIME,
        DeployStrategy::Reload => verdict_exit::RELOAD,
    }
}

fn rank(strategy: DeployStrategy) -> u8 {
    match strategy {
        DeployStrategy::Noop => 0,
        DeployStrategy::Runtime => 1,
        DeployStrategy::Reload => 2,
    }
}

fn most_disruptive(a: DeployStrategy, b: DeployStrategy) -> DeployStrategy {
    if rank(b) > rank(a) { b } else { a }
}

/// No instance to compare with: none given, and no socket instance configured.
#[derive(Debug, thiserror::Error)]
#[error(
    "no socket instance to compare with: give --running DIR (an instance's config directory) \
     or --running-fixtures DIR"
)]
struct NoTarget;

/// The instances to compare with: the ones given, or else every socket instance of
/// the config file with its `configDir`.
fn targets(config: &config::Config, running: &Running) -> Result<Vec<Target>, NoTarget> {
    let instances = build::socket_instances(config);
    if running.dirs.is_empty() && running.fixtures.is_empty() {
        let elsewhere = config.haproxy.instances.len() - instances.len();
        if elsewhere > 0 || config.haproxy.discovery.is_some() {
            // What they run is only known through their API.
            eprintln!(
                "note: Data Plane and discovered instances are not planned ({} configured)",
                crate::commands::count(elsewhere, "Data Plane instance")
            );
        }
        if instances.is_empty() {
            return Err(NoTarget);
        }
        return Ok(instances
            .into_iter()
            .map(|instance| Target {
                name: instance.name,
                compared_with: Source::ConfigDir,
                path: instance.config_dir,
            })
            .collect());
    }
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    let mut targets = Vec::new();
    for dir in &running.dirs {
        let name = instances
            .iter()
            .find(|instance| same(&instance.config_dir, dir))
            .map_or_else(|| dir.display().to_string(), |i| i.name.clone());
        targets.push(Target {
            name,
            compared_with: Source::ConfigDir,
            path: dir.clone(),
        });
    }
    for dir in &running.fixtures {
        targets.push(Target {
            name: dir.display().to_string(),
            compared_with: Source::Fixtures,
            path: dir.clone(),
        });
    }
    Ok(targets)
}

/// Why the deployer does not know what an instance runs (its next deployment
/// reloads).
#[derive(Debug, thiserror::Error)]
enum Unknown {
    /// Nothing was deployed there by hapwright.
    #[error("{} holds no state record", .0.display())]
    NoRecord(PathBuf),
    /// The files differ from the state record.
    #[error("{} does not match its state record: {detail}", .dir.display())]
    Mismatch {
        /// The config directory.
        dir: PathBuf,
        /// The first difference.
        detail: String,
    },
    /// The recorded `haproxy.cfg` does not parse.
    #[error(
        "{}: the recorded haproxy.cfg does not parse (line {}): {}",
        .dir.display(),
        .error.line,
        .error.message
    )]
    Unparsable {
        /// The config directory.
        dir: PathBuf,
        /// Where and why.
        error: hapwright_eventbus::model::haproxy::ParseError,
    },
}

/// What `target` runs: `Ok(Ok(_))` a known config, `Ok(Err(why))` unknown to the
/// deployer (its next deployment reloads), `Err(exit code)` after printing the error.
fn running_of(loaded: &config::Loaded, target: &Target) -> Result<Result<Deployed, Unknown>, u8> {
    if target.compared_with == Source::Fixtures {
        let rendered = render_once(loaded, Some(&target.path))?;
        return Deployed::new(
            Arc::new(rendered),
            String::new(),
            DeployStrategy::Noop,
            DeployReason {
                reload: None,
                detail: "rendered from fixtures".to_owned(),
            },
        )
        .map(Ok)
        .map_err(|error| {
            eprintln!(
                "{}: the running render's haproxy.cfg does not parse (line {}): {}",
                target.path.display(),
                error.line,
                error.message
            );
            exit::FAILURE
        });
    }
    let dir = &target.path;
    let recorded = match Recorded::read(&ConfigDir::new(dir)) {
        Ok(recorded) => recorded,
        Err(error) => {
            eprintln!("{}: {error}", dir.display());
            return Err(exit::FAILURE);
        }
    };
    Ok(match recorded {
        Recorded::Found(deployed) => Ok(deployed),
        Recorded::NoRecord => Err(Unknown::NoRecord(dir.clone())),
        Recorded::Mismatch(detail) => Err(Unknown::Mismatch {
            dir: dir.clone(),
            detail,
        }),
        Recorded::Unparsable(error) => Err(Unknown::Unparsable {
            dir: dir.clone(),
            error,
        }),
    })
}

/// The instances' capabilities: only `haproxy.dynamicBackends` depends on the line,
/// so the version is looked up only when it is on.
async fn plan_options(config: &config::Config, given: Option<Version>) -> PlanOptions {
    if !config.haproxy.dynamic_backends {
        return PlanOptions::default();
    }
    let version = match given {
        Some(version) => Some(version),
        None => {
            match hapwright_deployer::version_check::binary_version(&config.haproxy.binary).await {
                Ok(text) => Version::parse(&text),
                Err(error) => {
                    eprintln!(
                        "warning: {error}; planning as for an instance whose HAProxy line \
                         cannot be told (added and removed backends reload)"
                    );
                    None
                }
            }
        }
    };
    PlanOptions::for_line(true, version)
}

fn instance_plan(target: Target, plan: &ChangePlan) -> InstancePlan {
    let strategy = plan.strategy();
    InstancePlan {
        instance: target.name,
        compared_with: target.compared_with,
        path: target.path,
        strategy,
        runtime: if strategy == DeployStrategy::Runtime {
            plan.ops.iter().map(RuntimeOp::describe).collect()
        } else {
            Vec::new()
        },
        reload: if strategy == DeployStrategy::Reload {
            let causes = if plan.causes.is_empty() {
                plan.reload.as_slice()
            } else {
                plan.causes.as_slice()
            };
            causes.iter().map(Cause::from).collect()
        } else {
            Vec::new()
        },
    }
}

/// The text report: one block per instance.
///
/// ```text
/// local: runtime (2 commands)
///   server be_default_web/web-abc12-1 address 127.0.0.2:9101
///   maps/hosts.map contents
/// edge: reload
///   structure: backend be_default_api: new keyword `option httpchk`
/// ```
pub fn format_text(report: &Report) -> String {
    let mut out = String::new();
    for entry in &report.instances {
        match entry.strategy {
            DeployStrategy::Noop => out.push_str(&format!("{}: no change\n", entry.instance)),
            DeployStrategy::Runtime => {
                out.push_str(&format!(
                    "{}: runtime ({})\n",
                    entry.instance,
                    crate::commands::count(entry.runtime.len(), "command")
                ));
                for command in &entry.runtime {
                    out.push_str(&format!("  {command}\n"));
                }
            }
            DeployStrategy::Reload => {
                out.push_str(&format!("{}: reload\n", entry.instance));
                for cause in &entry.reload {
                    out.push_str(&format!("  {}: {}\n", cause.reason, cause.detail));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_is_the_most_disruptive_strategy() {
        use DeployStrategy::{Noop, Reload, Runtime};
        assert_eq!(most_disruptive(Noop, Runtime), Runtime);
        assert_eq!(most_disruptive(Reload, Runtime), Reload);
        assert_eq!(most_disruptive(Runtime, Noop), Runtime);
        assert_eq!(exit_code(Noop), 0);
        assert_eq!(exit_code(Runtime), 3);
        assert_eq!(exit_code(Reload), 4);
    }
}
