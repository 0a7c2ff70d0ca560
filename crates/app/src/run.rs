//! `hapwright run`: the reinit loop.
//!
//! Each valid configuration runs as one *iteration*: a fresh bus, fresh components,
//! one kernel. A new configuration (the file or a password file changed, SIGHUP,
//! `POST /-/reload`) is loaded and fully checked — YAML, semantics, template
//! compilation — while the old iteration keeps running. Only a valid one replaces it:
//! the old kernel is cancelled within a deadline and a new one is built.
//!
//! A mandatory component that exits outside shutdown (returns, fails or panics) gets
//! the same treatment: components cannot be rebuilt one by one (`run` consumes the
//! component, and subscriptions are fixed when the bus starts), so the whole
//! iteration is rebuilt from the running config after a [`RestartBackoff`] delay
//! (1 s doubling to 60 s; a run of 2 min resets it). The failed iteration keeps
//! running meanwhile, so its healthy components go on deploying. Every restart is
//! logged with the reason and counted in `hapwright_component_restarts_total`.
//!
//! What outlives iterations: the metrics registry, the HTTP listeners
//! (rebound only when `controller.listen` or `metricsListen` change), the managed
//! HAProxy processes, the status store and the last deployed state per instance — so
//! an unchanged render after a reinit is a no-op, not a reload. The Kubernetes client
//! and leader election (`controller.leaderElection`) outlive iterations too, so a
//! reinit never drops leadership; at shutdown the leader releases its Lease.
//!
//! # Layout
//!
//! ```text
//! process      what outlives iterations: metrics, stores, managed HAProxy, the
//!              Kubernetes client, leader election
//! candidate    a new config checked completely before it may replace the running one
//! iteration    one iteration: a fresh bus and kernel, started and stopped
//! assembly     component spawning: the components one config registers
//! listeners    the HTTP endpoints' wiring: listeners rebound when their address changes
//! controller   the reinit loop: what each wake-up means for the running iteration
//! ```

mod assembly;
mod candidate;
mod controller;
mod iteration;
mod listeners;
mod process;

use std::path::PathBuf;

use candidate::{Candidate, prepare};
use controller::Controller;

use crate::commands::print_errors;
use crate::config;
use crate::telemetry;

/// Exit codes.
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// The checked thing failed (or the controller could not run).
    pub const FAILURE: u8 = 1;
    /// Usage or config error.
    pub const CONFIG: u8 = 2;
}

/// Runs the controller until SIGTERM/SIGINT. Returns the process exit code.
pub async fn run(path: PathBuf) -> u8 {
    let loaded = match config::load(&path) {
        Ok(loaded) => loaded,
        Err(errors) => {
            print_errors(&errors);
            return exit::CONFIG;
        }
    };
    let controller = loaded.config.controller.clone();
    let traces = match telemetry::init_logging(
        &controller.log_level,
        controller.log_format,
        controller.tracing.as_ref(),
    ) {
        Ok(traces) => traces,
        Err(error @ telemetry::LoggingError::FilterInvalid { .. }) => {
            eprintln!("{}: controller.logLevel: {error}", path.display());
            return exit::CONFIG;
        }
        Err(error) => {
            eprintln!(
                "{}: controller.tracing: {:#}",
                path.display(),
                anyhow::Error::from(error)
            );
            return exit::CONFIG;
        }
    };
    let code = run_configured(loaded).await;
    if let Some(traces) = traces {
        // Flush the spans of the last reconciliations (a blocking export).
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    code
}

/// [`run`] once logging (and traces) are set up.
async fn run_configured(loaded: config::Loaded) -> u8 {
    let candidate = match prepare(loaded) {
        Ok(candidate) => candidate,
        Err(errors) => {
            print_errors(&errors);
            return exit::CONFIG;
        }
    };
    match run_loop(candidate).await {
        Ok(()) => exit::OK,
        Err(error) => {
            tracing::error!(error = %format!("{error:#}"), "The controller stopped");
            eprintln!("hapwright: {error:#}");
            exit::FAILURE
        }
    }
}

async fn run_loop(candidate: Candidate) -> anyhow::Result<()> {
    let mut controller = Controller::spawn(&candidate.loaded).await?;
    let outcome = controller.run(candidate).await;
    controller.shutdown().await;
    outcome
}
