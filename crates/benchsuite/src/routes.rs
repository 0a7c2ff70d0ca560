//! Route propagation (issue 37): a new Service with its host, from the file write to
//! the first answer from it, and its removal, from the file's deletion to the first
//! answer without it (the quickstart's `no route` 404), at one size. With
//! `dynamic`, the quickstart renders its per-Service backends as `backend NAME from
//! routes` and runs with `haproxy.dynamicBackends: true`, so on HAProxy 3.4 neither
//! change reloads (nor waits for `haproxy -c`: the render passes phase 2 by
//! equivalence); without it, or on an older line, each change is a reload.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hapwright_e2e::{Controller, Reply, quick_pacing, service_manifest};

use crate::scenarios::{
    CHANGE_TIMEOUT, Latency, Stages, first_answer, host, metric_sum, metrics, pause, start_with,
    wait_deployed,
};

/// What one size measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Propagation {
    /// Write → first answer from the new Service.
    pub add: Latency,
    /// Deletion → first answer without it.
    pub remove: Latency,
    /// Reloads during the changes (`hapwright_reloads_total`).
    pub reloads: f64,
    /// Runtime deployments during the changes.
    pub runtime_deployments: f64,
    /// Where the time of an add went: the stage means over the adds, from the
    /// controller's histograms read before each write and once it is deployed.
    pub add_stages: Stages,
}

/// The quickstart with its backends as `backend NAME from routes` (a named profile
/// before the unnamed `defaults`) and `haproxy.dynamicBackends: true`.
pub fn dynamic_quickstart(config: &str) -> String {
    let defaults = "    defaults\n        mode http\n        log global\n        timeout connect 2s\n        timeout client 30s\n        timeout server 30s\n";
    let backend = "      backend be_{{ ns }}_{{ name }}\n          balance roundrobin\n";
    let haproxy = "haproxy:\n  binary: haproxy\n";
    for part in [defaults, backend, haproxy] {
        assert!(
            config.contains(part),
            "examples/quickstart/hapwright.yaml no longer has {part:?}: update the route propagation scenario"
        );
    }
    let profile = defaults.replacen(
        "    defaults\n",
        "    defaults routes\n        balance roundrobin\n",
        1,
    );
    config
        .replacen(defaults, &format!("{profile}\n{defaults}"), 1)
        .replacen(
            backend,
            "      backend be_{{ ns }}_{{ name }} from routes\n",
            1,
        )
        .replacen(
            haproxy,
            "haproxy:\n  binary: haproxy\n  dynamicBackends: true\n",
            1,
        )
}

/// `config` with HAProxy's binary (phase 2 and the managed instance) set to
/// `binary`, when given (a newer line installed by scripts/haproxy-lines.sh).
pub fn with_binary(config: &str, binary: Option<&Path>) -> String {
    match binary {
        Some(binary) => config.replacen(
            "haproxy:\n  binary: haproxy\n",
            &format!("haproxy:\n  binary: {}\n", binary.display()),
            1,
        ),
        None => config.to_owned(),
    }
}

/// The line (`3.4`) of the HAProxy `binary` (`haproxy` on `PATH` when `None`).
pub fn haproxy_line(binary: Option<&Path>) -> String {
    std::process::Command::new(binary.unwrap_or(Path::new("haproxy")))
        .arg("-v")
        .output()
        .ok()
        .and_then(|out| {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let version = text.split_whitespace().nth(2)?.to_owned();
            let mut parts = version.split(['.', '-']);
            Some(format!("{}.{}", parts.next()?, parts.next()?))
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Waits until `host` answers 404 (no route), returning the time since `since`.
fn first_no_route(controller: &Controller, host: &str, since: Instant) -> f64 {
    loop {
        if let Ok(Reply { status: 404, .. }) = controller.route(host) {
            return since.elapsed().as_secs_f64() * 1_000.0;
        }
        if since.elapsed() > CHANGE_TIMEOUT {
            controller.fail(&format!("{host} was never removed"));
        }
    }
}

/// `changes` Services added, then removed again, one at a time, at `backends`.
pub fn route_propagation(
    backends: usize,
    changes: usize,
    dynamic: bool,
    binary: Option<&Path>,
) -> Propagation {
    let (controller, settings) = start_with(backends, |config| {
        let config = if dynamic {
            dynamic_quickstart(config)
        } else {
            config.to_owned()
        };
        with_binary(&config, binary)
    });
    let ports = controller.ports();
    let body = controller.demo_body(ports.api);
    let path = if dynamic { "dynamic" } else { "reload" };
    let mut add = Latency {
        backends,
        path: format!("add ({path})"),
        samples_ms: Vec::new(),
    };
    let mut remove = Latency {
        backends,
        path: format!("remove ({path})"),
        samples_ms: Vec::new(),
    };
    let before = metrics(&controller);
    let mut add_stages = Vec::new();
    // Spacing between changes so that each starts from a settled controller, outside
    // the min-interval windows.
    let spacing = settings
        .min_reload_interval_ms
        .max(settings.min_deployment_interval_ms)
        + settings.debounce_ms;
    for k in 0..changes {
        let name = format!("route-{k}");
        let file = format!("{name}.yaml");
        let stages_before = metrics(&controller);
        let started = Instant::now();
        controller.write_resource(&file, &service_manifest(&name, &host(&name), ports.api));
        add.samples_ms.push(first_answer(
            &controller,
            &host(&name),
            &body,
            started,
            CHANGE_TIMEOUT,
        ));
        wait_deployed(&controller);
        add_stages.push(Stages::between(&stages_before, &metrics(&controller), 1));
        pause(spacing);
        let started = Instant::now();
        std::fs::remove_file(controller.resource_path(&file)).expect("remove the Service");
        remove
            .samples_ms
            .push(first_no_route(&controller, &host(&name), started));
        wait_deployed(&controller);
        pause(spacing);
    }
    let after = metrics(&controller);
    Propagation {
        add,
        remove,
        reloads: metric_sum(&after, "hapwright_reloads_total", "")
            - metric_sum(&before, "hapwright_reloads_total", ""),
        runtime_deployments: metric_sum(&after, "hapwright_deployments_total", "runtime")
            - metric_sum(&before, "hapwright_deployments_total", "runtime"),
        add_stages: Stages::mean(&add_stages),
    }
}

/// What the long-lived connections saw.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LongLived {
    /// Routes served besides the changing ones.
    pub backends: usize,
    /// Streamed responses held open through an untouched route.
    pub streams: usize,
    /// Route adds (each followed by its removal).
    pub changes: usize,
    /// Streams that ended before the last change was live.
    pub closed: usize,
    /// Bytes the streams received in all.
    pub bytes: u64,
    /// Reloads during the changes.
    pub reloads: f64,
}

/// An upstream that answers every request with a chunked response that never ends:
/// a chunk every 50 ms while the connection lasts.
fn streaming_upstream(stop: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind the streaming upstream");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
                );
                while !stop.load(Ordering::Relaxed) {
                    if stream.write_all(b"6\r\ntick!\n\r\n").is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
        }
    });
    port
}

/// `streams` streamed responses through an untouched route stay open while
/// `changes` routes are added and removed again, on the quickstart with dynamic
/// backends (quick pacing) at `backends` routes; `closed` counts those that ended.
pub fn long_lived(
    backends: usize,
    streams: usize,
    changes: usize,
    binary: Option<&Path>,
) -> LongLived {
    let stop = Arc::new(AtomicBool::new(false));
    let upstream = streaming_upstream(stop.clone());
    let (controller, _) = start_with(backends, |config| {
        with_binary(&quick_pacing(&dynamic_quickstart(config), "100ms"), binary)
    });
    let ports = controller.ports();
    let body = controller.demo_body(ports.api);
    controller.write_resource(
        "stream.yaml",
        &service_manifest("stream", &host("stream"), upstream),
    );
    wait_deployed(&controller);
    let bytes = Arc::new(AtomicU64::new(0));
    let ended = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for _ in 0..streams {
        let mut stream = TcpStream::connect(("127.0.0.1", ports.http)).expect("connect to HAProxy");
        write!(
            stream,
            "GET /stream HTTP/1.1\r\nHost: {}\r\n\r\n",
            host("stream")
        )
        .expect("send the request");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        // The first bytes: the stream is open before the changes start.
        let mut buffer = [0u8; 4096];
        let first = stream.read(&mut buffer).unwrap_or(0);
        if first == 0 {
            controller.fail("the streamed response never started");
        }
        bytes.fetch_add(first as u64, Ordering::Relaxed);
        let (bytes, ended, stop) = (bytes.clone(), ended.clone(), stop.clone());
        readers.push(std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while !stop.load(Ordering::Relaxed) {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => {
                        ended.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    Ok(n) => {
                        bytes.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    let before = metrics(&controller);
    for k in 0..changes {
        let name = format!("route-{k}");
        let file = format!("{name}.yaml");
        let started = Instant::now();
        controller.write_resource(&file, &service_manifest(&name, &host(&name), ports.api));
        first_answer(&controller, &host(&name), &body, started, CHANGE_TIMEOUT);
        wait_deployed(&controller);
        let started = Instant::now();
        std::fs::remove_file(controller.resource_path(&file)).expect("remove the Service");
        first_no_route(&controller, &host(&name), started);
        wait_deployed(&controller);
    }
    let after = metrics(&controller);
    let closed = ended.load(Ordering::Relaxed) as usize;
    if closed > 0 {
        // HAProxy's log lines of the streams: how each ended (termination state).
        for line in controller
            .log_text()
            .lines()
            .filter(|l| l.contains("/stream"))
        {
            eprintln!("    {line}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    drop(controller);
    for reader in readers {
        let _ = reader.join();
    }
    LongLived {
        backends,
        streams,
        changes,
        closed,
        bytes: bytes.load(Ordering::Relaxed),
        reloads: metric_sum(&after, "hapwright_reloads_total", "")
            - metric_sum(&before, "hapwright_reloads_total", ""),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_quickstart_edit_gives_the_dynamic_form() {
        let config = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/quickstart/hapwright.yaml"
        ))
        .unwrap();
        let edited = super::dynamic_quickstart(&config);
        assert!(
            edited.contains("    defaults routes\n        balance roundrobin\n        mode http\n")
        );
        assert!(
            edited
                .contains("      backend be_{{ ns }}_{{ name }} from routes\n      {%- for slice")
        );
        assert!(edited.contains("  dynamicBackends: true\n"));
    }
}
