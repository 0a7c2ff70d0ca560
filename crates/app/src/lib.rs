//! The hapwright application: configuration assembly, the reinit loop that runs one
//! kernel iteration per valid configuration, the HTTP surface (metrics, health, debug
//! JSON, status page) and the command line.

pub mod bench;
pub mod build;
pub mod commands;
pub mod config;
pub mod http;
pub mod run;
pub mod status;
pub mod status_page;
pub mod telemetry;
pub mod validation_tests;
