//! `hapwright check`, `render` and the start-up checks of `run`, through the real
//! binary on real files (and the real `haproxy -c` for `render`).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::{BIN, stderr};

fn quickstart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/quickstart")
}

/// A copy of the quickstart in a temp dir, with `edit` applied to its config text.
fn project(edit: impl FnOnce(String) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(quickstart().join("hapwright.yaml")).unwrap();
    std::fs::write(dir.path().join("hapwright.yaml"), edit(text)).unwrap();
    std::fs::create_dir(dir.path().join("resources")).unwrap();
    for entry in std::fs::read_dir(quickstart().join("resources")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            dir.path().join("resources").join(entry.file_name()),
        )
        .unwrap();
    }
    dir
}

fn hapwright(args: &[&str], dir: &Path) -> Output {
    support::hapwright(dir, args)
}

#[test]
fn check_accepts_the_quickstart() {
    let dir = project(|t| t);
    let output = hapwright(&["check", "-c", "hapwright.yaml"], dir.path());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout)
            .contains("ok (5 templates, 2 watched resources, 1 instance)")
    );
}

#[test]
fn every_command_help_lists_its_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    for command in ["check", "render", "test", "bench", "plan"] {
        let output = hapwright(&[command, "--help"], dir.path());
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(help.contains("exit"), "{command} --help: {help}");
    }
}

#[test]
fn check_exits_1_when_the_haproxy_binary_does_not_resolve() {
    let dir = project(|t| t.replace("  binary: haproxy", "  binary: haproxy-not-installed"));
    let output = hapwright(&["check", "-c", "hapwright.yaml"], dir.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("hapwright.yaml:93:")
            && err.contains("haproxy.binary `haproxy-not-installed` is not on PATH ("),
        "{err}"
    );

    let dir = project(|t| t.replace("  binary: haproxy", "  binary: /nonexistent/haproxy"));
    let output = hapwright(&["check", "-c", "hapwright.yaml"], dir.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("haproxy.binary `/nonexistent/haproxy` is not an executable file"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn render_names_haproxy_binary_and_path_when_haproxy_is_missing() {
    let dir = project(|t| t.replace("  binary: haproxy", "  binary: haproxy-not-installed"));
    let output = hapwright(&["render", "-c", "hapwright.yaml"], dir.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("haproxy.binary `haproxy-not-installed` is not on PATH"),
        "{err}"
    );
}

#[test]
fn check_exits_2_on_a_config_error_with_location_and_suggestion() {
    let dir = project(|t| t.replace("  debounce: 200ms", "  debunce: 200ms"));
    let output = hapwright(&["check", "-c", "hapwright.yaml"], dir.path());
    assert_eq!(output.status.code(), Some(2));
    let err = stderr(&output);
    assert!(err.contains("hapwright.yaml:"), "{err}");
    assert!(err.contains("controller.debunce"), "{err}");
    assert!(err.contains("did you mean `debounce`"), "{err}");
}

#[test]
fn check_exits_1_on_a_template_error_naming_template_and_line() {
    let dir = project(|t| t.replace("{{ endpoint.addresses[0] }}", "{{ endpoint.addresses[0] }"));
    let output = hapwright(&["check", "-c", "hapwright.yaml"], dir.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    // The config file's line and column (where users edit), then the snippet's line.
    assert!(
        err.contains("hapwright.yaml:58:86 (backend line 9): syntax error"),
        "line of the broken expression: {err}"
    );
}

#[test]
fn check_exits_1_on_an_unknown_filter_naming_snippet_and_line() {
    let dir = project(|t| {
        t.replace(
            "backend be_{{ ns }}_{{ name }}",
            "backend be_{{ ns }}_{{ name | uper }}",
        )
    });
    let output = hapwright(&["check", "-c", "hapwright.yaml"], dir.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains(
            "hapwright.yaml:52:37 (backend line 3): unknown filter `uper`; did you mean `upper`?"
        ),
        "the snippet, line and column of the filter: {err}"
    );
}

#[test]
fn render_prints_the_config_and_writes_the_layout() {
    let dir = project(|t| t);
    let output = hapwright(&["render", "-c", "hapwright.yaml"], dir.path());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let cfg = String::from_utf8_lossy(&output.stdout);
    assert!(cfg.contains("backend be_default_web"), "{cfg}");
    assert!(cfg.contains("server web-abc12-1 127.0.0.1:9101"), "{cfg}");

    let out = dir.path().join("out");
    let output = hapwright(
        &["render", "-c", "hapwright.yaml", "--out", "out"],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let map = std::fs::read_to_string(out.join("maps/hosts.map")).unwrap();
    assert!(map.contains("web.example.test be_default_web"), "{map}");
    assert!(out.join("haproxy.cfg").exists());
}

#[test]
fn render_out_writes_keys_private_and_replaces_links() {
    use std::os::unix::fs::PermissionsExt;
    let dir = project(|t| {
        format!(
            "{t}\nsslCertificates:\n  site.pem:\n    template: \"-----BEGIN PRIVATE KEY-----\"\n"
        )
    });
    let out = dir.path().join("out");
    // A link planted where the key goes must be replaced, not written through.
    let outside = dir.path().join("outside.txt");
    std::fs::write(&outside, "untouched").unwrap();
    std::fs::create_dir_all(out.join("certs")).unwrap();
    std::os::unix::fs::symlink(&outside, out.join("certs/site.pem")).unwrap();
    let output = hapwright(
        &["render", "-c", "hapwright.yaml", "--out", "out"],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let mode = |p: &str| {
        let meta = std::fs::symlink_metadata(out.join(p)).unwrap();
        assert!(meta.is_file(), "{p} is not a regular file");
        meta.permissions().mode() & 0o7777
    };
    assert_eq!(mode("certs/site.pem"), 0o600);
    assert_eq!(mode("maps/hosts.map"), 0o644);
    assert_eq!(mode("haproxy.cfg"), 0o644);
    assert!(
        std::fs::read_to_string(out.join("certs/site.pem"))
            .unwrap()
            .contains("BEGIN PRIVATE KEY")
    );
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "untouched");
    let leftovers: Vec<_> = std::fs::read_dir(out.join("certs"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn render_out_reports_a_failed_write_and_leaves_no_temporary_file() {
    let dir = project(|t| t);
    let out = dir.path().join("out");
    let output = Command::new(BIN)
        .args(["render", "-c", "hapwright.yaml", "--out", "out"])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .env("HAPWRIGHT_FAULTS", "fail-write=maps/hosts.map")
        .output()
        .expect("run hapwright");
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("No space left on device"), "{err}");
    assert!(err.contains("hosts.map"), "{err}");
    assert!(!out.join("maps/hosts.map").exists());
    let names: Vec<_> = std::fs::read_dir(out.join("maps"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(names.is_empty(), "{names:?}");
}

#[test]
fn render_treats_a_missing_fixtures_directory_as_no_objects() {
    let dir = project(|t| t);
    let fixtures = dir.path().join("fixtures");
    std::fs::create_dir_all(fixtures.join("services")).unwrap();
    std::fs::write(
        fixtures.join("services/shop.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: shop, annotations: {hapwright.io/host: shop.test}}\n",
    )
    .unwrap();
    // No fixtures/endpoints/: the shop backend renders without servers.
    let output = hapwright(
        &["render", "-c", "hapwright.yaml", "--fixtures", "fixtures"],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let cfg = String::from_utf8_lossy(&output.stdout);
    assert!(cfg.contains("backend be_default_shop"), "{cfg}");

    let output = hapwright(
        &["render", "-c", "hapwright.yaml", "--fixtures", "nowhere"],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("--fixtures nowhere: not a directory"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn render_reads_fixtures_per_watched_resource() {
    let dir = project(|t| t);
    let fixtures = dir.path().join("fixtures");
    for source in ["services", "endpoints"] {
        std::fs::create_dir_all(fixtures.join(source)).unwrap();
    }
    std::fs::write(
        fixtures.join("services/shop.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: shop, annotations: {hapwright.io/host: shop.test}}\n",
    )
    .unwrap();
    std::fs::write(
        fixtures.join("endpoints/shop.yaml"),
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: shop-1, labels: {kubernetes.io/service-name: shop}}\nports: [{port: 9201}]\nendpoints: [{addresses: [127.0.0.1]}]\n",
    )
    .unwrap();
    let output = hapwright(
        &["render", "-c", "hapwright.yaml", "--fixtures", "fixtures"],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let cfg = String::from_utf8_lossy(&output.stdout);
    assert!(cfg.contains("backend be_default_shop"), "{cfg}");
    assert!(
        !cfg.contains("be_default_web"),
        "only fixtures are read: {cfg}"
    );
}

#[test]
fn render_exits_1_when_haproxy_rejects_the_output_and_points_at_the_template() {
    let dir = project(|t| {
        t.replace(
            "        balance roundrobin",
            "        balance roundrobin\n          bogus-keyword on",
        )
    });
    let output = hapwright(&["render", "-c", "hapwright.yaml"], dir.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("bogus-keyword"), "{err}");
    assert!(
        err.contains("from backend:"),
        "mapped back to the snippet line: {err}"
    );
}

#[test]
fn render_exits_1_on_a_broken_manifest_with_its_location() {
    let dir = project(|t| t);
    std::fs::write(
        dir.path().join("resources/broken.yaml"),
        "kind: Service\nmetadata: [unclosed\n",
    )
    .unwrap();
    let output = hapwright(&["render", "-c", "hapwright.yaml"], dir.path());
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("broken.yaml:"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn run_exits_2_on_an_invalid_config_with_every_error() {
    let dir = project(|t| {
        t.replace("  debounce: 200ms", "  debounce: soon")
            .replace("  maxWait: 2s", "  maxwait: 2s")
    });
    let output = hapwright(&["run", "-c", "hapwright.yaml"], dir.path());
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("hapwright.yaml:"),
        "{}",
        stderr(&output)
    );
}

/// A Kubernetes source needs no cluster to start: without one, `run` keeps serving
/// and the source is `Unhealthy` with the reason (it retries with backoff).
#[tokio::test]
async fn run_starts_with_a_kubernetes_source_and_reports_it_unhealthy_without_a_cluster() {
    let port = hapwright_eventbus::testing::free_port();
    let dir = project(|t| {
        t.replace(
            "    files: { path: ./resources }\n    kind: EndpointSlice",
            "    kubernetes: { apiVersion: discovery.k8s.io/v1, kind: EndpointSlice }",
        )
        .replace(
            "listen: 127.0.0.1:9400",
            &format!("listen: 127.0.0.1:{port}"),
        )
    });
    let mut child = tokio::process::Command::new(BIN)
        .args(["run", "-c", "hapwright.yaml"])
        .current_dir(dir.path())
        .env("KUBECONFIG", dir.path().join("no-such-kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start hapwright run");
    let url = format!("http://127.0.0.1:{port}/debug/components");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let reason = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "source/endpoints never became unhealthy"
        );
        let components: Option<serde_json::Value> = match reqwest::get(&url).await {
            Ok(response) => response.json().await.ok(),
            Err(_) => None,
        };
        let endpoints = components.as_ref().and_then(|c| {
            c.as_array()?
                .iter()
                .find(|c| c["name"] == "source/endpoints")
                .cloned()
        });
        if let Some(endpoints) = endpoints
            && endpoints["health"] == "unhealthy"
        {
            break endpoints["reason"].as_str().unwrap_or_default().to_owned();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(
        reason.contains("cannot build a Kubernetes client"),
        "{reason}"
    );
    let pid = child.id().expect("running").to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait())
        .await
        .expect("hapwright stops on SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0));
}
