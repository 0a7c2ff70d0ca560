//! Crash safety with the real binary and a real managed HAProxy: the controller is
//! SIGKILLed at each step of a reloading deployment (fault injection pauses it there,
//! `HAPWRIGHT_FAULTS`), then started again. The instance converges to the desired
//! config with at most one reload, the files on disk match the state record and the
//! running worker, nothing is left in the config or temporary directories, and there
//! is exactly one HAProxy master.
//!
//! Also: a write that fails (a full disk, injected) keeps the last good files and
//! shows the error on `/debug/instances`, the status page and in a metric.

use std::path::Path;
use std::time::Duration;

use hapwright_deployer::haproxy::files::{ConfigDir, RecordCheck};
use hapwright_e2e::{Controller, WAIT, master_command, poll, quick_pacing, service_manifest};

const SHOP: &str = "shop.example.test";

/// Faster pacing than the quickstart's, so a repair is not held by the windows.
fn quick(config: &str) -> String {
    quick_pacing(config, "100ms")
}

fn faults(dir: &Path, spec: &str) -> String {
    format!("arm={},{spec}", dir.join("arm").display())
}

/// Every temporary file hapwright's writer could leave in the config directory.
fn leftovers(config_dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for dir in ["", "maps", "files", "certs"] {
        let Ok(entries) = std::fs::read_dir(config_dir.join(dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.contains("hapwright-tmp") {
                found.push(format!("{dir}/{name}"));
            }
        }
    }
    found
}

fn crash_at(step: &str) {
    let marks = tempfile::tempdir().unwrap();
    let spec = faults(
        marks.path(),
        &format!("pause={step}:{}", marks.path().join("paused").display()),
    );
    let mut controller = Controller::start_with_env(quick, &[("HAPWRIGHT_FAULTS", spec.as_str())]);
    controller.wait_deployed();
    let port = controller.ports().web_v2;

    // Arm the pause, then make a change that needs a reload (a new backend).
    std::fs::write(marks.path().join("arm"), "").unwrap();
    controller.write_resource("shop.yaml", &service_manifest("shop", SHOP, port));
    let paused = poll(WAIT, || marks.path().join("paused").exists().then_some(()));
    if paused.is_err() {
        controller.fail(&format!("the deployment never reached {step}"));
    }
    controller.kill();
    std::fs::remove_file(marks.path().join("arm")).unwrap();

    // A new controller, no faults: it converges.
    controller.relaunch(&[]);
    controller.wait_for_body(SHOP, &controller.demo_body(port));
    let instance = controller.wait_deployed();
    let reloads = controller.metric(
        "hapwright_reloads_total{instance=\"local\",reason=\"first_deploy\",result=\"success\"}",
    ) + controller.metric(
        "hapwright_reloads_total{instance=\"local\",reason=\"restart\",result=\"success\"}",
    ) + controller.metric(
        "hapwright_reloads_total{instance=\"local\",reason=\"new_file\",result=\"success\"}",
    ) + controller.metric(
        "hapwright_reloads_total{instance=\"local\",reason=\"structure\",result=\"success\"}",
    );
    assert!(
        reloads <= 1.0,
        "at most one reload after the restart, saw {reloads} ({instance:?})"
    );

    // The files are the record's, and the record is what the worker runs.
    let config_dir = controller.dir().join("run/haproxy");
    let RecordCheck::Consistent { marker, .. } =
        ConfigDir::new(&config_dir).check_record().unwrap()
    else {
        controller.fail("the files do not match the state record");
    };
    let env = master_command(
        &controller.master_socket(),
        "@1 show env HAPWRIGHT_CONFIG_VERSION",
    )
    .unwrap();
    assert!(
        env.contains(&marker),
        "worker runs {env}, record says {marker}"
    );
    assert_eq!(leftovers(&config_dir), Vec::<String>::new());

    // Exactly one master, with its own workers.
    let master = controller.master();
    let mut expected = master.workers.clone();
    expected.push(master.master_pid);
    expected.sort_unstable();
    let settled = poll(Duration::from_secs(10), || {
        (controller.haproxy_pids() == expected).then_some(())
    });
    if settled.is_err() {
        controller.fail(&format!(
            "HAProxy processes {:?}, expected only {expected:?}",
            controller.haproxy_pids()
        ));
    }
}

#[test]
fn sigkill_after_the_side_files_converges() {
    crash_at("after-side-files");
}

#[test]
fn sigkill_before_the_reload_converges() {
    crash_at("before-reload");
}

#[test]
fn sigkill_after_the_reload_converges() {
    crash_at("after-reload");
}

#[test]
fn a_failing_write_keeps_the_last_good_files_and_says_so() {
    let marks = tempfile::tempdir().unwrap();
    let spec = faults(marks.path(), "fail-write=maps/hosts.map");
    let controller = Controller::start_with_env(quick, &[("HAPWRIGHT_FAULTS", spec.as_str())]);
    controller.wait_deployed();
    let config_dir = controller.dir().join("run/haproxy");
    let before = std::fs::read(config_dir.join("maps/hosts.map")).unwrap();
    let cfg_before = std::fs::read(config_dir.join("haproxy.cfg")).unwrap();

    std::fs::write(marks.path().join("arm"), "").unwrap();
    let port = controller.ports().web_v2;
    controller.write_resource("shop.yaml", &service_manifest("shop", SHOP, port));
    let error = controller.wait_until("the failure shows on /debug/instances", WAIT, || {
        controller.instance().last_error.map(|e| e.to_string())
    });
    assert!(error.contains("No space left on device"), "{error}");
    assert_eq!(
        std::fs::read(config_dir.join("maps/hosts.map")).unwrap(),
        before
    );
    assert_eq!(
        std::fs::read(config_dir.join("haproxy.cfg")).unwrap(),
        cfg_before
    );
    assert_eq!(leftovers(&config_dir), Vec::<String>::new());
    assert!(
        controller.metric(
            "hapwright_deployments_total{instance=\"local\",result=\"failure\",strategy=\"reload\"}"
        ) >= 1.0
    );
    assert!(controller.status_page().contains("No space left on device"));

    // The disk has room again: the retry deploys.
    std::fs::remove_file(marks.path().join("arm")).unwrap();
    controller.wait_for_body(SHOP, &controller.demo_body(port));
}

/// A self-signed certificate and key for `cn`, base64 for a Secret's `data`.
fn tls_data(dir: &Path, cn: &str) -> (String, String) {
    use base64::Engine;
    let status = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", &format!("/CN={cn}")])
        .args([
            "-keyout",
            &format!("{cn}.key"),
            "-out",
            &format!("{cn}.crt"),
        ])
        .current_dir(dir)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success());
    let b64 = |file: String| {
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(dir.join(file)).unwrap())
    };
    (b64(format!("{cn}.crt")), b64(format!("{cn}.key")))
}

/// A TLS Secret manifest for host `<name>.test`.
fn tls_secret(dir: &Path, name: &str) -> String {
    let (crt, key) = tls_data(dir, &format!("{name}.test"));
    format!(
        "apiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\nmetadata:\n  namespace: default\n  \
         name: {name}\ndata:\n  tls.crt: {crt}\n  tls.key: {key}\n"
    )
}

/// The subject HAProxy on `port` presents for SNI `name` (`openssl s_client`).
fn served_subject(port: u16, name: &str) -> Option<String> {
    let output = std::process::Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(["-servername", name])
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("subject="))
        .map(|s| s.trim().to_owned())
}

/// The quickstart plus a TLS frontend on `https` once there is a Secret: one PEM per
/// Secret (a file set) in a crt-list with the Secret's host as SNI filter.
fn with_tls(config: &str, https: u16) -> String {
    let config = quick(config)
        .replacen(
            "watchedResources:\n",
            "watchedResources:\n  secrets:\n    files: { path: ./resources }\n    kind: Secret\n    \
             indexBy: [metadata.namespace, metadata.name]\n",
            1,
        )
        .replacen(
            "templateSnippets:\n",
            &format!(
                "templateSnippets:\n  demo-tls:\n    template: |\n      \
                 {{% if resources.secrets.list() %}}\n      frontend https\n          \
                 bind 127.0.0.1:{https} ssl strict-sni crt-list files/tls.crtlist\n          \
                 http-request return status 200 content-type text/plain string tls\n      \
                 {{% endif %}}\n"
            ),
            1,
        );
    format!(
        "{config}\nfiles:\n  tls.crtlist:\n    template: |\n      \
         {{% for s in resources.secrets.list() | sort_by('metadata.name') %}}\n      \
         certs/{{{{ s.metadata.name }}}}.pem {{{{ s.metadata.name }}}}.test\n      {{% endfor %}}\n\
         sslCertificates:\n  tls:\n    forEach: resources.secrets.list()\n    \
         name: \"{{{{ item.metadata.name }}}}.pem\"\n    template: |\n      \
         {{{{ item.data['tls.crt'] | b64decode | trim }}}}\n      \
         {{{{ item.data['tls.key'] | b64decode | trim }}}}\n"
    )
}

/// SIGKILL between two runtime steps of a certificate added without a reload (the
/// certificate is in HAProxy, its crt-list entry and the files are not yet). The
/// next controller converges: the new host's certificate is served, the old host
/// keeps its own, the files match the record and the worker, nothing is left
/// behind. (It starts its managed HAProxy from the files, as after every controller
/// crash; on a HAProxy that survives, the same steps find their work half done and
/// finish it: crates/deployer/tests/runtime_certificates.rs.)
#[test]
fn sigkill_between_runtime_certificate_steps_converges() {
    let marks = tempfile::tempdir().unwrap();
    let spec = faults(
        marks.path(),
        &format!(
            "pause=after-runtime-op:{}",
            marks.path().join("paused").display()
        ),
    );
    let https = hapwright_e2e::free_port();
    let mut controller = Controller::start_with_env(
        |config| with_tls(config, https),
        &[("HAPWRIGHT_FAULTS", spec.as_str())],
    );
    controller.write_resource("a-tls.yaml", &tls_secret(marks.path(), "a"));
    poll(WAIT, || {
        served_subject(https, "a.test").filter(|s| s.contains("a.test"))
    })
    .unwrap_or_else(|_| controller.fail("a.test was never served"));
    controller.wait_deployed();

    // Arm the pause, then add a second Secret: new certificate, then its entry.
    std::fs::write(marks.path().join("arm"), "").unwrap();
    controller.write_resource("b-tls.yaml", &tls_secret(marks.path(), "b"));
    if poll(WAIT, || marks.path().join("paused").exists().then_some(())).is_err() {
        controller.fail("the deployment never reached after-runtime-op");
    }
    controller.kill();
    std::fs::remove_file(marks.path().join("arm")).unwrap();
    // Half done: HAProxy knows the certificate but serves it for no name yet.
    assert_eq!(
        served_subject(https, "b.test"),
        None,
        "strict-sni, no entry yet"
    );

    controller.relaunch(&[]);
    let served = poll(WAIT, || {
        served_subject(https, "b.test").filter(|s| s.contains("b.test"))
    });
    if served.is_err() {
        controller.fail("b.test was never served after the restart");
    }
    controller.wait_deployed();
    assert!(
        served_subject(https, "a.test").is_some_and(|s| s.contains("a.test")),
        "a.test keeps its certificate"
    );
    // The new controller starts its managed HAProxy from the files (as after every
    // controller crash): at most that one start, no reload on top.
    let starts = controller.metric(
        "hapwright_reloads_total{instance=\"local\",reason=\"restart\",result=\"success\"}",
    ) + controller.metric(
        "hapwright_reloads_total{instance=\"local\",reason=\"new_file\",result=\"success\"}",
    ) + controller.metric(
        "hapwright_reloads_total{instance=\"local\",reason=\"runtime_failed\",result=\"success\"}",
    );
    assert!(
        starts <= 1.0,
        "at most one start after the crash, saw {starts}"
    );
    let config_dir = controller.dir().join("run/haproxy");
    let RecordCheck::Consistent { marker, .. } =
        ConfigDir::new(&config_dir).check_record().unwrap()
    else {
        controller.fail("the files do not match the state record");
    };
    let env = master_command(
        &controller.master_socket(),
        "@1 show env HAPWRIGHT_CONFIG_VERSION",
    )
    .unwrap();
    assert!(
        env.contains(&marker),
        "worker runs {env}, record says {marker}"
    );
    let list = std::fs::read_to_string(config_dir.join("files/tls.crtlist")).unwrap();
    let lines: Vec<&str> = list.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines, ["certs/a.pem a.test", "certs/b.pem b.test"]);
    assert_eq!(leftovers(&config_dir), Vec::<String>::new());
}
