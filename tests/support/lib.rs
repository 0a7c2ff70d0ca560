//! Shared helpers for hapwright's end-to-end tests, which run the real binary.

use std::path::PathBuf;

/// Path of the `hapwright` binary built alongside these tests.
///
/// `cargo test --workspace` builds every member's binaries before running any test;
/// the binary sits next to the test executable's `deps/` directory. `HAPWRIGHT_BIN`
/// overrides the path (for testing an installed binary).
pub fn hapwright_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("HAPWRIGHT_BIN") {
        return PathBuf::from(path);
    }
    let mut dir = std::env::current_exe().expect("test executable path");
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let binary = dir.join(format!("hapwright{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "{} is missing: run the end-to-end tests with `cargo test --workspace` \
         (or `cargo build -p hapwright-app` first)",
        binary.display()
    );
    binary
}
