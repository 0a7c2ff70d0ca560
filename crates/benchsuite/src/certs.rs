//! Certificates at scale (issue 38): the Ingress library serving `secrets` TLS
//! Secrets (each its own Ingress and host), deployed to HAProxy as the sidecar
//! manifest starts it. Measured, one change at a time:
//! - a new certificate: a Secret and the Ingress that uses it, written, until a TLS
//!   handshake with its host as SNI presents it (and the request through it answers);
//! - a renewal: the Secret's certificate replaced, until the handshake presents the
//!   new one;
//! - a removal: both deleted, until the handshake no longer presents it;
//!
//! plus the render of the whole set (the renders until the first deployment), and
//! hapwright's peak RSS. HAProxy reloads are counted with the master's `show proc`.
//!
//! The background Secrets share one certificate (generating 10,000 keys would take
//! the suite minutes and measure `openssl`); each is still its own PEM file, crt-list
//! line and certificate store in HAProxy.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;

use base64::Engine as _;
use serde_json::{Value, json};

#[path = "../../../tests/library/mod.rs"]
#[allow(clippy::all, clippy::pedantic, missing_docs, unreachable_pub)]
mod library;

use library::Sidecar;

// The deployer tests' TLS helpers: the client that accepts any certificate, and
// the DER of a PEM.
#[path = "../../deployer/tests/support/tls.rs"]
#[allow(dead_code, missing_docs, unreachable_pub)]
mod tls;

use tls::der;

use hapwright_app::bench::parse_status_kb;

use crate::scenarios::{Latency, Stages, metric_sum};

/// How long a change may take before the scenario fails.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(120);
const PROBE_PAUSE: Duration = Duration::from_millis(1);
/// How long the first deployment of the whole set may take.
const START_TIMEOUT: Duration = Duration::from_secs(600);

/// What one size measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CertPropagation {
    /// TLS Secrets served.
    pub secrets: usize,
    /// Write → the new certificate presented for its host.
    pub add: Latency,
    /// Secret changed → the renewed certificate presented.
    pub renew: Latency,
    /// Deleted → the certificate no longer presented.
    pub remove: Latency,
    /// HAProxy reloads during the changes.
    pub reloads: u64,
    /// Mean render time of the whole set until the first deployment, ms.
    pub full_render_ms: f64,
    /// Mean render time during the changes, ms.
    pub change_render_ms: f64,
    /// From `hapwright run` starting to its first deployment, s.
    pub startup_s: f64,
    /// `VmHWM` of `hapwright run` at the end, bytes.
    pub peak_rss_bytes: u64,
    /// Where the time went, per change: stage means over the adds, renewals and
    /// removals (hapwright's histograms, read before each change and once it runs).
    pub stages: [Stages; 3],
}

/// A self-signed certificate and key for `host` (PEMs).
fn certificate(dir: &Path, host: &str) -> (String, String) {
    let name = host.replace('.', "_");
    let status = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "30"])
        .arg("-subj")
        .arg(format!("/CN={host}"))
        .arg("-addext")
        .arg(format!("subjectAltName=DNS:{host}"))
        .arg("-keyout")
        .arg(dir.join(format!("{name}.key")))
        .arg("-out")
        .arg(dir.join(format!("{name}.crt")))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run openssl");
    assert!(status.success(), "openssl req for {host}");
    let read = |ext: &str| {
        std::fs::read_to_string(dir.join(format!("{name}.{ext}"))).expect("read the PEM")
    };
    (read("crt"), read("key"))
}

fn secret(name: &str, (crt, key): &(String, String)) -> Value {
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": { "name": name, "namespace": "bench" },
        "data": { "tls.crt": b64(crt), "tls.key": b64(key) }
    })
}

fn ingress(name: &str, host: &str, secret: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {
            "name": name, "namespace": "bench",
            "creationTimestamp": "2030-01-01T00:00:00Z"
        },
        "spec": {
            "ingressClassName": "hapwright",
            "tls": [ { "hosts": [host], "secretName": secret } ],
            "rules": [ { "host": host, "http": { "paths": [ {
                "path": "/", "pathType": "Prefix",
                "backend": { "service": { "name": "web", "port": { "number": 80 } } }
            } ] } } ]
        }
    })
}

/// Writes `objects` as `resources/<kind>/<file>.json`, atomically.
fn write(dir: &Path, kind: &str, file: &str, objects: &Value) {
    let resource = dir.join("resources").join(kind);
    std::fs::create_dir_all(&resource).expect("resource dir");
    let temporary = resource.join(format!(".{file}.json.tmp"));
    std::fs::write(&temporary, serde_json::to_vec(objects).expect("json")).expect("write");
    std::fs::rename(&temporary, resource.join(format!("{file}.json"))).expect("rename");
}

/// A TLS client without session resumption: every handshake is a full one, so the
/// certificate it reports is the one HAProxy presents now.
fn tls_client() -> Arc<rustls::ClientConfig> {
    let mut config = tls::any_certificate_client();
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// The status of `GET /` through HAProxy on `https` with SNI and Host `host`, and
/// the certificate its handshake presented; `None` when no handshake succeeds.
fn presented(tls: &Arc<rustls::ClientConfig>, https: u16, host: &str) -> Option<(u16, Vec<u8>)> {
    let name = ServerName::try_from(host.to_owned()).ok()?;
    let mut connection = rustls::ClientConnection::new(tls.clone(), name).ok()?;
    let mut socket = TcpStream::connect(("127.0.0.1", https)).ok()?;
    socket.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // One write of the whole request, sent at once: a request in pieces on a Nagle
    // socket waits for HAProxy's delayed ACK (40 ms) now and then, which is the
    // client's time, not the change's.
    socket.set_nodelay(true).ok()?;
    let mut stream = rustls::Stream::new(&mut connection, &mut socket);
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    let status = std::str::from_utf8(&head[9..12]).ok()?.parse().ok()?;
    let der = connection.peer_certificates()?.first()?.as_ref().to_vec();
    Some((status, der))
}

/// Sends requests for `host` back to back until `done` holds for one (status and
/// presented certificate); the time since `since`, in ms.
fn until(
    sidecar: &Sidecar,
    tls: &Arc<rustls::ClientConfig>,
    https: u16,
    host: &str,
    since: Instant,
    what: &str,
    done: impl Fn(u16, &[u8]) -> bool,
) -> f64 {
    loop {
        if presented(tls, https, host).is_some_and(|(status, der)| done(status, &der)) {
            return since.elapsed().as_secs_f64() * 1_000.0;
        }
        if since.elapsed() > CHANGE_TIMEOUT {
            sidecar.fail(&format!("{host}: {what} never happened"));
        }
        std::thread::sleep(PROBE_PAUSE);
    }
}

/// Waits until the instance runs the last render, and then until the scheduler's
/// `minDeploymentInterval` and the debouncer's quiet period since have passed, so
/// that the next change starts from a settled controller, outside the windows where
/// the configured rate limits hold it back (as the other latency benchmarks space
/// their changes).
fn settle(sidecar: &Sidecar, what: &str) {
    let get = |path: &str| -> Option<Value> {
        let text = sidecar
            .client
            .get(format!("http://127.0.0.1:{}{path}", sidecar.status))
            .send()
            .and_then(|r| r.text())
            .ok()?;
        serde_json::from_str(&text).ok()
    };
    let done = hapwright_e2e::poll(CHANGE_TIMEOUT, || {
        let rendered = get("/debug/rendered")?["hash"].as_str()?.to_owned();
        (sidecar.instance()["last_hash"].as_str() == Some(rendered.as_str())).then_some(())
    });
    if done.is_err() {
        sidecar.fail(&format!("{what}: the instance never ran the last render"));
    }
    std::thread::sleep(Duration::from_millis(
        library::MIN_DEPLOYMENT_INTERVAL_MS + library::DEBOUNCE_MS,
    ));
}

/// hapwright's `/metrics` text (empty when it does not answer).
fn metrics_text(sidecar: &Sidecar) -> String {
    sidecar
        .client
        .get(format!("http://127.0.0.1:{}/metrics", sidecar.status))
        .send()
        .and_then(|r| r.text())
        .unwrap_or_default()
}

fn render_seconds(sidecar: &Sidecar) -> (f64, f64) {
    let text = metrics_text(sidecar);
    (
        metric_sum(&text, "hapwright_render_duration_seconds_sum", ""),
        metric_sum(&text, "hapwright_render_duration_seconds_count", ""),
    )
}

/// `secrets` TLS Secrets served; `changes` certificates added, renewed and removed.
pub fn certificate_propagation(secrets: usize, changes: usize) -> CertPropagation {
    let scratch = tempfile::tempdir().expect("temporary directory");
    let shared = certificate(scratch.path(), "bench.test");
    let new_hosts: Vec<String> = (0..changes)
        .map(|k| format!("new-{k}.bench.test"))
        .collect();
    let fresh: Vec<((String, String), (String, String))> = new_hosts
        .iter()
        .map(|host| {
            (
                certificate(scratch.path(), host),
                certificate(scratch.path(), &format!("renewed.{host}")),
            )
        })
        .collect();

    let upstream = library::upstream("web");
    let (http, https) = (hapwright_e2e::free_port(), hapwright_e2e::free_port());
    let config = library::ingress_config(http, https);
    let tls = tls_client();
    let service = json!([{
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": "web", "namespace": "bench" },
        "spec": { "ports": [ { "name": "http", "port": 80, "targetPort": 8080 } ] }
    }]);
    let slice = json!([library::loopback_slice("bench", "web", "http", &[upstream])]);

    // The first deployment (and HAProxy's first load of every certificate) happens
    // with everything in place: the objects are written before hapwright starts.
    let all = |f: &dyn Fn(usize) -> Value| Value::Array((0..secrets).map(f).collect());
    let resources = [
        ("secrets", all(&|k| secret(&format!("s{k}"), &shared))),
        (
            "ingresses",
            all(&|k| {
                ingress(
                    &format!("i{k}"),
                    &format!("h{k}.bench.test"),
                    &format!("s{k}"),
                )
            }),
        ),
        ("services", service),
        ("endpointslices", slice),
    ];
    let bootstrap = hapwright_e2e::free_port();
    let started = Instant::now();
    let sidecar = Sidecar::start_waiting(
        "hapwright-bench-certs-",
        config,
        &resources,
        bootstrap,
        reqwest::blocking::Client::builder(),
        &[],
        START_TIMEOUT,
    );
    let startup_s = started.elapsed().as_secs_f64();
    let (sum, count) = render_seconds(&sidecar);
    let full_render_ms = if count > 0.0 {
        sum / count * 1_000.0
    } else {
        0.0
    };
    let dir = sidecar.dir.path().to_owned();
    let reloads_before = sidecar.master_reloads();

    let mut add = Latency {
        backends: secrets,
        path: "new certificate".to_owned(),
        samples_ms: Vec::new(),
    };
    let mut renew = Latency {
        backends: secrets,
        path: "renewal".to_owned(),
        samples_ms: Vec::new(),
    };
    let mut remove = Latency {
        backends: secrets,
        path: "removal".to_owned(),
        samples_ms: Vec::new(),
    };
    let mut stages: [Vec<Stages>; 3] = Default::default();
    for (k, host) in new_hosts.iter().enumerate() {
        let (first, renewed) = &fresh[k];
        let (first_der, renewed_der) = (der(&first.0), der(&renewed.0));
        let file = format!("new-{k}");

        let before = metrics_text(&sidecar);
        let since = Instant::now();
        write(&dir, "secrets", &file, &json!([secret(&file, first)]));
        write(
            &dir,
            "ingresses",
            &file,
            &json!([ingress(&file, host, &file)]),
        );
        add.samples_ms.push(until(
            &sidecar,
            &tls,
            https,
            host,
            since,
            "the new certificate",
            |status, der| status == 200 && der == first_der.as_slice(),
        ));
        settle(&sidecar, "add");
        stages[0].push(Stages::between(&before, &metrics_text(&sidecar), 1));

        let before = metrics_text(&sidecar);
        let since = Instant::now();
        write(&dir, "secrets", &file, &json!([secret(&file, renewed)]));
        renew.samples_ms.push(until(
            &sidecar,
            &tls,
            https,
            host,
            since,
            "the renewal",
            |status, der| status == 200 && der == renewed_der.as_slice(),
        ));
        settle(&sidecar, "renewal");
        stages[1].push(Stages::between(&before, &metrics_text(&sidecar), 1));

        let before = metrics_text(&sidecar);
        let since = Instant::now();
        for kind in ["ingresses", "secrets"] {
            std::fs::remove_file(
                dir.join("resources")
                    .join(kind)
                    .join(format!("{file}.json")),
            )
            .expect("remove");
        }
        remove.samples_ms.push(until(
            &sidecar,
            &tls,
            https,
            host,
            since,
            "the removal",
            |_, der| der != renewed_der.as_slice(),
        ));
        settle(&sidecar, "removal");
        stages[2].push(Stages::between(&before, &metrics_text(&sidecar), 1));
    }
    let reloads = sidecar.master_reloads() - reloads_before;
    let (sum_after, count_after) = render_seconds(&sidecar);
    let change_render_ms = if count_after > count {
        (sum_after - sum) / (count_after - count) * 1_000.0
    } else {
        0.0
    };
    let peak_rss_bytes = sidecar
        .hapwright_pid()
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .and_then(|status| parse_status_kb(&status, "VmHWM:"))
        .unwrap_or(0)
        * 1024;
    CertPropagation {
        secrets,
        add,
        renew,
        remove,
        reloads,
        full_render_ms,
        change_render_ms,
        startup_s,
        peak_rss_bytes,
        stages: stages.map(|runs| Stages::mean(&runs)),
    }
}
