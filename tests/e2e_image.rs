//! The container image (`scripts/image.sh`) running the quickstart: the image carries
//! the HAProxy line it was built for (`haproxy -v`, its label, and the HAProxy that
//! hapwright starts), the config is mounted at the image's default config path, the
//! container's own HAProxy routes requests, an EndpointSlice edit on the mounted volume
//! is applied through the runtime API without a reload, and stopping the container
//! leaves nothing behind.
//!
//! Runs when `HAPWRIGHT_TEST_IMAGE` names a built image: `scripts/test.sh` builds the
//! default one (Debian trixie, HAProxy 3.0) with `scripts/image.sh` and sets it (or
//! fails, unless `HAPWRIGHT_SKIP_IMAGE=1`). `HAPWRIGHT_TEST_IMAGE_HAPROXY_LINE` names
//! the line expected in it when the image was built with another `--haproxy-line`.
//! Without it the test says so and passes, so a plain `cargo test` needs no podman.
//! Uses podman as root with `--network=host`, as containers run on these machines
//! (scripts/image.sh configures podman for that).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use hapwright_e2e::{
    Value, free_port, master_command, parse_show_proc, poll, quickstart_dir, replace_numbers,
    write_atomically,
};

/// Start-up bound: the first render waits for `haproxy -c` inside the container.
const START: Duration = Duration::from_secs(60);
/// Bound for one change to reach HAProxy.
const CHANGE: Duration = Duration::from_secs(30);
/// The HAProxy line of the default image (`scripts/image.sh` without `--haproxy-line`).
const DEFAULT_LINE: &str = "3.0";

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("podman {args:?}: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A running container of the image on a private copy of the quickstart; removed
/// (with every process in it) when dropped, also when the test panics.
struct Container {
    name: String,
    http: u16,
    status: u16,
    web_v1: u16,
    web_v2: u16,
    api: u16,
    client: reqwest::blocking::Client,
    // Last: removed after the container is gone.
    dir: tempfile::TempDir,
}

impl Container {
    fn start(image: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("hapwright-image-")
            .tempdir()
            .expect("temporary directory");
        let (http, status, web_v1, web_v2, api) = (
            free_port(),
            free_port(),
            free_port(),
            free_port(),
            free_port(),
        );
        let ports = BTreeMap::from([
            ("8080", http.to_string()),
            ("9400", status.to_string()),
            ("9101", web_v1.to_string()),
            ("9102", web_v2.to_string()),
            ("9201", api.to_string()),
        ]);
        let source = quickstart_dir();
        let config = fs::read_to_string(source.join("hapwright.yaml")).expect("config");
        fs::write(
            dir.path().join("hapwright.yaml"),
            replace_numbers(&config, &ports),
        )
        .expect("write config");
        fs::create_dir(dir.path().join("resources")).expect("resources");
        for name in ["web.yaml", "api.yaml"] {
            let manifest = fs::read_to_string(source.join("resources").join(name))
                .expect("quickstart manifest");
            fs::write(
                dir.path().join("resources").join(name),
                replace_numbers(&manifest, &ports),
            )
            .expect("write manifest");
        }
        // The image runs as user 10001, which writes HAProxy's run directory here.
        chown_tree(dir.path(), 10001);

        let name = format!("hapwright-e2e-image-{}", std::process::id());
        let volume = format!("{}:/etc/hapwright", dir.path().display());
        // No arguments: the image's default command (`run`) and config path.
        let output = podman(&[
            "run",
            "--detach",
            "--name",
            &name,
            "--network=host",
            "--volume",
            &volume,
            image,
        ]);
        assert!(
            output.status.success(),
            "podman run {image}: {}",
            text(&output.stderr)
        );
        let client = reqwest::blocking::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(10))
            .build()
            .expect("HTTP client");
        let container = Self {
            name,
            http,
            status,
            web_v1,
            web_v2,
            api,
            client,
            dir,
        };
        container.wait_ready();
        container
    }

    fn fail(&self, message: &str) -> ! {
        let logs = podman(&["logs", "--tail", "60", &self.name]);
        panic!(
            "{message}\n--- container log ---\n{}{}",
            text(&logs.stdout),
            text(&logs.stderr)
        )
    }

    fn running(&self) -> bool {
        let output = podman(&["inspect", "--format", "{{.State.Running}}", &self.name]);
        text(&output.stdout).trim() == "true"
    }

    fn get(&self, port: u16, path: &str, host: Option<&str>) -> Option<(u16, String)> {
        let mut request = self.client.get(format!("http://127.0.0.1:{port}{path}"));
        if let Some(host) = host {
            request = request.header(reqwest::header::HOST, host);
        }
        let response = request.send().ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().ok()?))
    }

    fn wait_ready(&self) {
        let outcome = poll(START, || {
            if !self.running() {
                return Some(false);
            }
            matches!(self.get(self.status, "/readyz", None), Some((200, _))).then_some(true)
        });
        match outcome {
            Ok(true) => {}
            Ok(false) => self.fail("the container stopped before hapwright was ready"),
            Err(waited) => self.fail(&format!("/readyz not 200 after {waited:?}")),
        }
    }

    fn wait_for_body(&self, host: &str, body: &str) {
        let mut last = None;
        if poll(CHANGE, || {
            let reply = self.get(self.http, "/", Some(host));
            let done = reply.as_ref().is_some_and(|(s, b)| *s == 200 && b == body);
            last = reply;
            done.then_some(())
        })
        .is_err()
        {
            self.fail(&format!(
                "HAProxy never answered {body:?} for {host}; last answer {last:?}"
            ));
        }
    }

    /// The instance `local` on `/debug/instances`.
    fn instance(&self) -> Value {
        let (status, body) = self
            .get(self.status, "/debug/instances", None)
            .unwrap_or_else(|| self.fail("GET /debug/instances failed"));
        assert_eq!(status, 200, "{body}");
        let all: Value = serde_json::from_str(&body).expect("JSON");
        all.as_array()
            .and_then(|list| list.iter().find(|i| i["name"] == "local"))
            .cloned()
            .unwrap_or_else(|| self.fail(&format!("no instance `local` in {all}")))
    }

    /// Reloads HAProxy's master has done, by its own count (`show proc`).
    fn haproxy_reloads(&self) -> u64 {
        let socket = self.dir.path().join("run/master.sock");
        let reply = master_command(&socket, "show proc")
            .unwrap_or_else(|e| self.fail(&format!("show proc on {}: {e}", socket.display())));
        parse_show_proc(&reply)
            .unwrap_or_else(|| self.fail(&format!("bad show proc:\n{reply}")))
            .reloads
    }

    /// The version the running HAProxy's master reports (`show version`).
    fn haproxy_version(&self) -> String {
        let socket = self.dir.path().join("run/master.sock");
        master_command(&socket, "show version")
            .unwrap_or_else(|e| self.fail(&format!("show version on {}: {e}", socket.display())))
            .trim()
            .to_owned()
    }

    /// Host pids of every process in the container.
    fn host_pids(&self) -> Vec<u32> {
        let output = podman(&["top", &self.name, "hpid"]);
        assert!(output.status.success(), "{}", text(&output.stderr));
        text(&output.stdout)
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--time", "0", &self.name]);
    }
}

fn chown_tree(path: &Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).expect("chown");
    if path.is_dir() {
        for entry in fs::read_dir(path).expect("read dir") {
            chown_tree(&entry.expect("entry").path(), uid);
        }
    }
}

#[test]
fn image_serves_the_quickstart_and_applies_endpoint_changes_without_reload() {
    let Ok(image) = std::env::var("HAPWRIGHT_TEST_IMAGE") else {
        eprintln!(
            "skipped: HAPWRIGHT_TEST_IMAGE is not set (scripts/test.sh builds the image and sets it)"
        );
        return;
    };
    let line = std::env::var("HAPWRIGHT_TEST_IMAGE_HAPROXY_LINE")
        .unwrap_or_else(|_| DEFAULT_LINE.to_owned());

    // The image's HAProxy is the line it was built for, by its binary and its label.
    let version = podman(&[
        "run",
        "--rm",
        "--network=none",
        "--entrypoint",
        "haproxy",
        &image,
        "-v",
    ]);
    assert!(version.status.success(), "{}", text(&version.stderr));
    let version = text(&version.stdout);
    assert!(
        version.starts_with(&format!("HAProxy version {line}.")),
        "HAProxy {line} in {image}: {version}"
    );
    let label = podman(&[
        "image",
        "inspect",
        "--format",
        "{{index .Labels \"io.hapwright.haproxy.line\"}}",
        &image,
    ]);
    assert_eq!(text(&label.stdout).trim(), line, "{}", text(&label.stderr));

    let container = Container::start(&image);
    let body = |name: &str, port: u16| format!("{name} (port {port})\n");

    // Routes answer through the container's HAProxy.
    container.wait_for_body("web.example.test", &body("web v1", container.web_v1));
    container.wait_for_body("api.example.test", &body("api", container.api));
    let reloads_before = container.haproxy_reloads();
    let before = container.instance();
    // The HAProxy hapwright started (found on the image's PATH) is that line too.
    let running = container.haproxy_version();
    assert!(
        running.starts_with(&format!("{line}.")),
        "HAProxy {line} running in the container: {running:?}"
    );

    // Move web to its v2 port on the mounted volume, as the quickstart suggests.
    let web = container.dir.path().join("resources/web.yaml");
    let manifest = fs::read_to_string(&web).expect("read web.yaml");
    let from = format!("port: {}", container.web_v1);
    assert!(manifest.contains(&from), "{manifest}");
    write_atomically(
        &web,
        &manifest.replace(&from, &format!("port: {}", container.web_v2)),
    );
    container.wait_for_body("web.example.test", &body("web v2", container.web_v2));

    // Applied through the runtime API: no reload, by hapwright's and HAProxy's count.
    // (HAProxy may answer before hapwright has recorded the deployment.)
    let deployments = |instance: &Value| instance["deployments"].as_u64().unwrap_or(0);
    let instance = poll(CHANGE, || {
        let instance = container.instance();
        (deployments(&instance) > deployments(&before)).then_some(instance)
    })
    .unwrap_or_else(|_| container.fail("the change was never recorded as deployed"));
    assert_eq!(instance["last_strategy"], "runtime", "{instance}");
    assert_eq!(instance["reloads"], before["reloads"], "{instance}");
    assert_eq!(container.haproxy_reloads(), reloads_before);

    // A clean stop: hapwright exits 0 on SIGTERM and takes its HAProxy along.
    let pids = container.host_pids();
    assert!(
        pids.len() >= 3,
        "hapwright, HAProxy master and worker: {pids:?}"
    );
    let stop = podman(&["stop", "--time", "20", &container.name]);
    assert!(stop.status.success(), "{}", text(&stop.stderr));
    let exit = podman(&[
        "inspect",
        "--format",
        "{{.State.ExitCode}}",
        &container.name,
    ]);
    assert_eq!(
        text(&exit.stdout).trim(),
        "0",
        "hapwright's exit code after SIGTERM"
    );
    let removed = podman(&["rm", &container.name]);
    assert!(removed.status.success(), "{}", text(&removed.stderr));
    let listed = podman(&[
        "ps",
        "--all",
        "--quiet",
        "--filter",
        &format!("name=^{}$", container.name),
    ]);
    assert_eq!(
        text(&listed.stdout).trim(),
        "",
        "the container is still listed"
    );
    let left = poll(Duration::from_secs(10), || {
        let alive: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|pid| Path::new(&format!("/proc/{pid}")).exists())
            .collect();
        alive.is_empty().then_some(())
    });
    assert!(
        left.is_ok(),
        "processes of the container outlived it: {pids:?}"
    );
    assert!(
        !container.running(),
        "podman still reports the container running"
    );
}
