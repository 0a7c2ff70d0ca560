//! What the command tests share: the real `hapwright` binary run in a temp project
//! directory, and its output as text.

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

/// Standard output as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Standard error as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
