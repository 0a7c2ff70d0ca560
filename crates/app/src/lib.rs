//! The hapwright application: configuration assembly, the reinit loop that runs one
//! kernel iteration per valid configuration, the HTTP surface (metrics, health, debug
//! JSON, status page) and the command line.
//!
//! # Layout
//!
//! ```text
//! main.rs          argument parsing, tracing set-up, exit codes (thin)
//! commands         check, render, version: one function per subcommand
//! config/          the config file: one file per controller section (controller,
//!                  http, leaderElection, quarantine, status, tracing, webhook),
//!                  template places, load, located errors (locate), the
//!                  config-file watcher component (watch)
//! build            a config → the components of one kernel iteration (sources,
//!                  renderer, validator, scheduler, deployer)
//! run/             `hapwright run`, one module per job: the process-wide parts
//!                  (process: metrics registry, status store, managed HAProxy
//!                  supervisor, last-deployed store, leader election), a config
//!                  checked before it runs (candidate), one iteration (iteration) and
//!                  its components (assembly), the HTTP listeners (listeners), the
//!                  reinit loop (controller: config changes, SIGHUP, POST /-/reload,
//!                  component failures → a new iteration)
//! http             the HTTP surface: /metrics, /healthz, /readyz, /-/reload, /debug/*
//! status           the status store fed by the status and event-log components
//! status_page      the HTML status page
//! telemetry        logging (text or JSON) and its filter
//! traces           OpenTelemetry traces of reconciliations over OTLP/HTTP
//! validation_tests `hapwright test`: cases, fixtures, runner, assertions, report
//! webhook          the validating admission webhook: its HTTPS listener, the
//!                  current objects it validates against, one review's decision
//! bench            `hapwright bench`: synthetic clusters rendered and validated at scale
//! plan             `hapwright plan`: what a deployment would do per instance, by the
//!                  deployer's planner, without touching HAProxy
//! ```
//!
//! Data moves through `run`: a loaded config is built into a kernel iteration whose
//! components meet on the bus; the status components turn events into the store that
//! `http` and the status page read; a config change or a failed mandatory component
//! ends the iteration and the loop builds the next.

pub mod bench;
pub mod build;
pub mod commands;
pub mod config;
pub mod http;
pub mod plan;
pub mod run;
pub mod status;
pub mod status_page;
pub mod telemetry;
pub mod traces;
pub mod validation_tests;
pub mod webhook;
