//! What `hapwright run` writes to its log: plain text without colour codes when the
//! log is not a terminal, fields as plain values, and one flat JSON object per line
//! with `logFormat: json` (the keys docs/cli.md, "Logs", documents).

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

use hapwright_e2e::{
    Controller, Value, free_port, hapwright_binary, poll, quickstart_dir, replace_numbers,
    replace_once,
};

/// A correlation id as hapwright prints it: 16 lowercase hex digits.
fn is_plain_correlation_id(value: &str) -> bool {
    value.len() == 16 && value.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
}

/// The raw log (the harness's own accessors strip colour codes).
fn raw_log(controller: &Controller) -> String {
    fs::read_to_string(controller.dir().join("hapwright.log")).expect("read the log")
}

#[test]
fn text_log_in_a_file_has_no_colour_and_plain_correlation_ids() {
    // An empty NO_COLOR does not turn colour off (no-color.org), so only "is the log a
    // terminal?" decides here.
    let controller = Controller::start_with_env(|config| config.to_owned(), &[("NO_COLOR", "")]);
    controller.wait_deployed();
    let log = raw_log(&controller);
    assert!(
        !log.contains("\x1b["),
        "colour codes in a log written to a file:\n{log:?}"
    );
    assert!(
        !log.contains("Some(") && !log.contains("CorrelationId("),
        "Rust debug forms in the log:\n{log}"
    );
    let ids: Vec<&str> = log
        .split("correlation_id=")
        .skip(1)
        .map(|rest| {
            rest.split(|c: char| !c.is_ascii_alphanumeric())
                .next()
                .unwrap_or("")
        })
        .collect();
    assert!(!ids.is_empty(), "no correlation_id in the log:\n{log}");
    for id in ids {
        assert!(is_plain_correlation_id(id), "correlation_id={id}:\n{log}");
    }
}

#[test]
fn text_log_on_a_pipe_has_no_colour() {
    // A controller that cannot bind its listener logs the error and exits 1; its
    // stderr is a pipe.
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let status_port = taken.local_addr().expect("address").port().to_string();
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = fs::read_to_string(quickstart_dir().join("hapwright.yaml")).expect("config");
    let ports = BTreeMap::from([
        ("8080", free_port().to_string()),
        ("9400", status_port),
        ("9101", free_port().to_string()),
        ("9102", free_port().to_string()),
        ("9201", free_port().to_string()),
    ]);
    let config = replace_numbers(&config, &ports);
    fs::write(dir.path().join("hapwright.yaml"), config).expect("write config");
    fs::create_dir(dir.path().join("resources")).expect("resources");

    let mut child = Command::new(hapwright_binary())
        .args(["run", "-c"])
        .arg(dir.path().join("hapwright.yaml"))
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hapwright run");
    let mut stderr = child.stderr.take().expect("stderr pipe");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let status = poll(Duration::from_secs(30), || child.try_wait().ok().flatten());
    let Ok(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("hapwright run kept running with its listen address taken");
    };
    let text = reader.join().expect("stderr reader");
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(text.contains("The controller stopped"), "{text}");
    assert!(!text.contains("\x1b["), "colour codes on a pipe:\n{text:?}");
    drop(taken);
}

#[test]
fn json_log_is_one_flat_object_per_line() {
    let controller = Controller::start_with(|config| {
        replace_once(
            config,
            "logLevel: info",
            "logLevel: info\n  logFormat: json",
        )
    });
    controller.wait_deployed();
    let log = raw_log(&controller);
    let lines: Vec<Value> = log
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    assert!(lines.len() > 3, "{log}");
    for line in &lines {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(
                line.get(key).is_some_and(Value::is_string),
                "`{key}` missing or not a string: {line}"
            );
        }
    }
    // The deployment's lines carry its span's fields at the top level.
    let started = lines
        .iter()
        .find(|line| line["message"] == "Deployment started")
        .unwrap_or_else(|| panic!("no `Deployment started` line:\n{log}"));
    // Enclosing spans, outermost first: the kernel's `component`, then the deployment.
    assert_eq!(started["span"], "component:deployment", "{started}");
    assert_eq!(started["component"], "deployer", "{started}");
    let id = started["correlation_id"].as_str().unwrap_or_default();
    assert!(is_plain_correlation_id(id), "{started}");
    assert!(started["hash"].is_string(), "{started}");
    assert!(started["instances"].is_u64(), "{started}");
}
