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

/// Runs `hapwright ARGS` and returns its stdout, expecting exit 0.
fn stdout_of(args: &[&str]) -> String {
    let output = Command::new(hapwright_binary())
        .args(args)
        .output()
        .expect("run hapwright");
    assert!(
        output.status.success(),
        "hapwright {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

#[test]
fn bash_completion_completes_subcommands_and_options() {
    let script = stdout_of(&["completions", "bash"]);
    // Load the script into a real bash and ask it what `hapwright ren<TAB>` and
    // `hapwright render --fi<TAB>` complete to.
    let complete = |words: &str| {
        let program = format!(
            "{script}\nCOMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}; \
             _hapwright hapwright \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
             echo \"${{COMPREPLY[*]}}\""
        );
        let output = Command::new("bash")
            .args(["--norc", "--noprofile", "-c", &program])
            .output()
            .expect("run bash");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    assert_eq!(complete("hapwright ren"), "render");
    assert_eq!(complete("hapwright render --fi"), "--fixtures");
    assert_eq!(complete("hapwright pl"), "plan");
    assert_eq!(complete("hapwright plan --running-"), "--running-fixtures");
    assert!(complete("hapwright ''").contains("completions"));
}

#[test]
fn completions_exist_for_the_common_shells() {
    assert!(stdout_of(&["completions", "zsh"]).starts_with("#compdef hapwright"));
    let fish = stdout_of(&["completions", "fish"]);
    assert!(fish.contains("complete -c hapwright"), "{fish}");
    assert!(fish.contains("render"), "{fish}");
}

#[test]
fn man_page_documents_every_subcommand() {
    let page = stdout_of(&["man"]);
    assert!(page.contains(".TH hapwright 1"), "{page}");
    assert!(page.contains(".SH NAME"), "{page}");
    for command in [
        "run",
        "check",
        "render",
        "test",
        "bench",
        "completions",
        "man",
    ] {
        assert!(
            page.contains(&format!("hapwright\\-{command}")),
            "`{command}` missing from the man page:\n{page}"
        );
    }
}
