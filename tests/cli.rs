//! The real `hapwright` binary's basic command line behaviour.

use std::process::Command;

use hapwright_e2e::hapwright_binary;

#[test]
fn version_prints_the_package_version() {
    let output = Command::new(hapwright_binary())
        .arg("version")
        .output()
        .expect("run hapwright");
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("hapwright {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn help_lists_the_subcommands() {
    let output = Command::new(hapwright_binary())
        .arg("--help")
        .output()
        .expect("run hapwright");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("Usage: hapwright"), "{help}");
    assert!(help.contains("version"), "{help}");
}

#[test]
fn unknown_subcommand_is_a_usage_error() {
    let output = Command::new(hapwright_binary())
        .arg("frobnicate")
        .output()
        .expect("run hapwright");
    assert_eq!(output.status.code(), Some(2), "usage errors exit 2");
    assert!(String::from_utf8_lossy(&output.stderr).contains("frobnicate"));
}
