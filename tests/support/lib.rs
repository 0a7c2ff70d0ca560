//! Shared helpers for hapwright's end-to-end tests: locating the built binary and
//! running it as a child process.

use std::path::PathBuf;

/// Path of the `hapwright` binary built for this test run.
///
/// Cargo builds the workspace's binaries before running the root package's
/// integration tests only when they are declared there, so the path is derived from the
/// test executable's own location: `target/<profile>/deps/<test>` → `target/<profile>/hapwright`.
pub fn hapwright_binary() -> PathBuf {
    let mut path = std::env::current_exe().expect("test executable path");
    path.pop();
    if path.ends_with("deps") {
        path.pop();
    }
    path.join(format!("hapwright{}", std::env::consts::EXE_SUFFIX))
}
