//! What the command tests share: the real `hapwright` binary run in a temp project
//! directory, its output as text, and the starts their configs share
//! ([`watched_services!`], [`haproxy_config_start!`]).

// Each test file uses a part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// The binary under test, built by cargo for this test run.
pub const BIN: &str = env!("CARGO_BIN_EXE_hapwright");

/// A temp directory holding `config` as `hapwright.yaml` and an empty `resources/`
/// directory (where the configs' `files` sources point); deleted on drop.
pub fn project(config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("resources")).expect("resources dir");
    std::fs::write(dir.path().join("hapwright.yaml"), config).expect("write config");
    dir
}

/// Runs `hapwright ARGS` in `dir` and waits for it; `RUST_LOG` is removed so the
/// output does not depend on the caller's environment.
pub fn hapwright(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .output()
        .expect("run hapwright")
}

/// The start of the test configs that watch Services in files: a `services`
/// resource read from `./resources` (the project's directory), as a string literal
/// for `concat!`; the config may go on with more keys of that resource.
#[macro_export]
macro_rules! watched_services {
    () => {
        "
watchedResources:
  services:
    files: { path: ./resources }
    kind: Service
"
    };
}

/// The start of the `haproxyConfig` section the test configs share, as a string
/// literal for `concat!`: a template whose `global` logs to stderr and whose
/// `defaults` are HTTP with short timeouts. The config goes on with the template's
/// frontends and backends, indented by four spaces.
#[macro_export]
macro_rules! haproxy_config_start {
    () => {
        "haproxyConfig:
  template: |
    global
        log stderr format raw local0 notice
    defaults
        mode http
        timeout connect 1s
        timeout client 1s
        timeout server 1s
"
    };
}

/// Standard output as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Standard error as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
