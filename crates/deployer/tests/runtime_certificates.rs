//! Certificates and crt-list entries added, renewed and removed through the runtime
//! API, on a real HAProxy (the one on PATH; scripts/test.sh runs this file on every
//! supported line): TLS handshakes with the new SNI succeed after an add, fail after
//! a removal, present the new certificate after a renewal, with 0 reloads while TLS
//! clients of another host see no failure. A differential test checks, after every
//! random step, that the running HAProxy serves each SNI the certificate a fresh
//! HAProxy started from the files on disk serves.

mod support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hapwright_deployer::driver::Driver;
use hapwright_deployer::driver::socket::SocketDriver;
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::model::{DeployStrategy, RenderedConfig, SourceMap};
use rustls::pki_types::ServerName;
use support::random::seed;
use support::tls::{any_certificate_client, certificate, der};
use support::{Haproxy, free_port};
use tokio::net::TcpStream;

fn connector() -> tokio_rustls::TlsConnector {
    tokio_rustls::TlsConnector::from(Arc::new(any_certificate_client()))
}

/// The certificate HAProxy on `port` presents for SNI `name` (DER), or `None` when
/// the handshake fails.
async fn served(connector: &tokio_rustls::TlsConnector, port: u16, name: &str) -> Option<Vec<u8>> {
    let stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let name = ServerName::try_from(name.to_owned()).ok()?;
    let tls = connector.connect(name, stream).await.ok()?;
    let (_, session) = tls.get_ref();
    Some(session.peer_certificates()?.first()?.as_ref().to_vec())
}

/// haproxy.cfg with one TLS frontend: `strict-sni`, certificates from the crt-list.
fn main_config(port: u16) -> String {
    format!(
        "global\n    stats timeout 30s\n\n\
defaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
frontend fe_tls\n    bind 127.0.0.1:{port} ssl strict-sni crt-list files/tls.crtlist\n    \
http-request return status 200 content-type text/plain string ok\n"
    )
}

/// A render: the crt-list lines, and the certificates by file name.
fn render(port: u16, lines: &[String], certs: &BTreeMap<String, String>) -> Arc<RenderedConfig> {
    let mut list: String = lines.iter().map(|l| format!("{l}\n")).collect();
    if list.is_empty() {
        list.push('\n');
    }
    Arc::new(RenderedConfig::new(
        main_config(port),
        BTreeMap::new(),
        [("tls.crtlist".to_owned(), Arc::<str>::from(list))].into(),
        certs
            .iter()
            .map(|(name, pem)| (name.clone(), Arc::<str>::from(pem.as_str())))
            .collect(),
        SourceMap::default(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_and_sni_filters_change_at_runtime_under_tls_load() {
    let scratch = tempfile::tempdir().unwrap();
    let pems: BTreeMap<&str, String> = ["a", "b", "b-renewed", "c", "d", "d-renewed"]
        .into_iter()
        .map(|cn| (cn, certificate(scratch.path(), cn)))
        .collect();
    let port = free_port();
    let mut certs = BTreeMap::from([("a.pem".to_owned(), pems["a"].clone())]);
    let mut lines = vec!["certs/a.pem a.test".to_owned()];
    let v1 = render(port, &lines, &certs);
    let haproxy = Haproxy::start("certs", &v1, &v1.hash().short()).await;
    let driver = SocketDriver::new(
        haproxy.instance.clone(),
        None,
        Metrics::unregistered().unwrap(),
    );
    let mut running = Arc::new(driver.deploy(v1, None, None, false).await.unwrap());
    let reloads = haproxy.reloads().await;
    let tls = connector();
    assert_eq!(served(&tls, port, "a.test").await, Some(der(&pems["a"])));
    assert_eq!(served(&tls, port, "b.test").await, None, "strict-sni");

    // TLS clients of a.test the whole time.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load = {
        let (stop, ok, failed, tls) = (stop.clone(), ok.clone(), failed.clone(), tls.clone());
        let expected = der(&pems["a"]);
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if served(&tls, port, "a.test").await.as_ref() == Some(&expected) {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    let mut step = async |lines: &[String], certs: &BTreeMap<String, String>| {
        let desired = render(port, lines, certs);
        let deployed = driver
            .deploy(desired.clone(), None, Some(running.clone()), false)
            .await
            .unwrap();
        assert_eq!(
            deployed.strategy,
            DeployStrategy::Runtime,
            "{:?}",
            deployed.reason
        );
        running = Arc::new(deployed);
        // The files on disk are the render.
        assert_eq!(
            std::fs::read_to_string(haproxy.path().join("files/tls.crtlist")).unwrap(),
            &**desired.files().get("tls.crtlist").unwrap()
        );
        let mut on_disk: Vec<String> = std::fs::read_dir(haproxy.path().join("certs"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        on_disk.sort();
        assert_eq!(on_disk, certs.keys().cloned().collect::<Vec<_>>());
    };

    // Added: a certificate and its line, with options and two SNI filters.
    certs.insert("b.pem".into(), pems["b"].clone());
    lines.push("certs/b.pem [alpn h2,http/1.1] b.test www.b.test".into());
    step(&lines, &certs).await;
    assert_eq!(served(&tls, port, "b.test").await, Some(der(&pems["b"])));
    assert_eq!(
        served(&tls, port, "www.b.test").await,
        Some(der(&pems["b"]))
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(haproxy.path().join("certs/b.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "private keys stay private");
    }

    // Renewed.
    certs.insert("b.pem".into(), pems["b-renewed"].clone());
    step(&lines, &certs).await;
    assert_eq!(
        served(&tls, port, "b.test").await,
        Some(der(&pems["b-renewed"]))
    );

    // SNI filters changed: www.b.test goes, api.b.test comes.
    lines[1] = "certs/b.pem b.test api.b.test".into();
    step(&lines, &certs).await;
    assert_eq!(
        served(&tls, port, "api.b.test").await,
        Some(der(&pems["b-renewed"]))
    );
    assert_eq!(served(&tls, port, "www.b.test").await, None);

    // Another certificate added and b removed in one deployment.
    certs.insert("c.pem".into(), pems["c"].clone());
    certs.remove("b.pem");
    lines[1] = "certs/c.pem c.test".into();
    step(&lines, &certs).await;
    assert_eq!(served(&tls, port, "c.test").await, Some(der(&pems["c"])));
    assert_eq!(served(&tls, port, "b.test").await, None);
    let known = driver.runtime().ssl_certs().await.unwrap();
    assert!(!known.iter().any(|c| c == "certs/b.pem"), "{known:?}");

    // Added after the driver kept HAProxy's listing of loaded certificates (from
    // b's renewal), then renewed: missing from the kept listing, it is found in a
    // fresh one.
    certs.insert("d.pem".into(), pems["d"].clone());
    lines.push("certs/d.pem d.test".into());
    step(&lines, &certs).await;
    certs.insert("d.pem".into(), pems["d-renewed"].clone());
    step(&lines, &certs).await;
    assert_eq!(
        served(&tls, port, "d.test").await,
        Some(der(&pems["d-renewed"]))
    );

    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert_eq!(haproxy.reloads().await, reloads, "no reload");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "a.test handshakes failed"
    );
    assert!(ok.load(Ordering::Relaxed) > 0);
}

/// An HAProxy serving `a.pem` for `a.test` from a crt-list, with a driver, and a
/// second certificate `b` not deployed yet.
struct Serving {
    _scratch: tempfile::TempDir,
    a: String,
    b: String,
    port: u16,
    v1: Arc<RenderedConfig>,
    haproxy: Haproxy,
    driver: SocketDriver,
}

impl Serving {
    async fn start(name: &str) -> Self {
        let scratch = tempfile::tempdir().unwrap();
        let a = certificate(scratch.path(), "a");
        let b = certificate(scratch.path(), "b");
        let port = free_port();
        let v1 = render(
            port,
            &["certs/a.pem a.test".to_owned()],
            &BTreeMap::from([("a.pem".to_owned(), a.clone())]),
        );
        let haproxy = Haproxy::start(name, &v1, &v1.hash().short()).await;
        let driver = SocketDriver::new(
            haproxy.instance.clone(),
            None,
            Metrics::unregistered().unwrap(),
        );
        Self {
            _scratch: scratch,
            a,
            b,
            port,
            v1,
            haproxy,
            driver,
        }
    }
}

/// The certificate of PEM `cert` with the key of PEM `key`: HAProxy refuses the pair.
fn mismatched(cert: &str, key: &str) -> String {
    const KEY: &str = "-----BEGIN PRIVATE KEY-----";
    cert.split(KEY).next().unwrap().to_owned() + KEY + key.split(KEY).nth(1).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pem_haproxy_refuses_is_reported_with_its_message_and_leaves_nothing_behind() {
    let Serving {
        a,
        b,
        port,
        haproxy: _haproxy,
        driver,
        ..
    } = Serving::start("refused").await;
    let runtime = driver.runtime();
    // b's certificate with a's key: HAProxy refuses the pair.
    let mismatched = mismatched(&b, &a);
    for bad in ["garbage\n", mismatched.as_str()] {
        let error = runtime
            .add_certificate("certs/bad.pem", bad)
            .await
            .unwrap_err()
            .to_string();
        // HAProxy's own words: garbage at `set`, a mismatched key at `commit`.
        assert!(
            error.contains("HAProxy refused `set ssl cert certs/bad.pem <<`: unable to load")
                || error.contains(
                    "HAProxy refused `commit ssl cert certs/bad.pem`: inconsistencies between \
                     private key and certificate"
                ),
            "{error}"
        );
        assert!(
            !error.contains("PRIVATE KEY"),
            "the key never shows: {error}"
        );
        let known = runtime.ssl_certs().await.unwrap();
        assert_eq!(known, ["certs/a.pem"], "nothing left behind");
    }
    let tls = connector();
    assert_eq!(served(&tls, port, "a.test").await, Some(der(&a)));
    // Operations find their work half done and finish it.
    runtime.add_certificate("certs/b.pem", &b).await.unwrap();
    runtime.add_certificate("certs/b.pem", &b).await.unwrap();
    runtime
        .set_crt_list_entry("files/tls.crtlist", "certs/b.pem", "certs/b.pem b.test")
        .await
        .unwrap();
    runtime
        .set_crt_list_entry("files/tls.crtlist", "certs/b.pem", "certs/b.pem b.test")
        .await
        .unwrap();
    let entries = runtime.crt_list_entries("files/tls.crtlist").await.unwrap();
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(served(&tls, port, "b.test").await, Some(der(&b)));
    runtime
        .delete_crt_list_entry("files/tls.crtlist", "certs/b.pem")
        .await
        .unwrap();
    runtime
        .delete_crt_list_entry("files/tls.crtlist", "certs/b.pem")
        .await
        .unwrap();
    runtime.delete_certificate("certs/b.pem").await.unwrap();
    runtime.delete_certificate("certs/b.pem").await.unwrap();
    assert_eq!(served(&tls, port, "b.test").await, None);
}

/// A child process killed and reaped when dropped, even when an assertion fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A small seeded generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// The certificate each SNI of `names` gets from HAProxy on `port`.
async fn served_all(
    tls: &tokio_rustls::TlsConnector,
    port: u16,
    names: &[String],
) -> Vec<Option<Vec<u8>>> {
    let mut out = Vec::new();
    for name in names {
        out.push(served(tls, port, name).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_every_random_step_the_running_haproxy_serves_what_its_files_say() {
    let seed = seed("HAPWRIGHT_SEED");
    println!("HAPWRIGHT_SEED={seed}");
    let mut rng = Rng(seed);
    let scratch = tempfile::tempdir().unwrap();
    // Two PEMs per certificate name, so a renewal changes what is served.
    let pool: Vec<String> = (0..8)
        .map(|i| certificate(scratch.path(), &format!("pool{i}")))
        .collect();
    let hosts: Vec<String> = (0..5).map(|i| format!("h{i}.test")).collect();
    let port = free_port();
    // Certificate name → (PEM index, SNI filters).
    let mut state: BTreeMap<String, (usize, Vec<String>)> =
        BTreeMap::from([("base.pem".to_owned(), (0, vec!["base.test".to_owned()]))]);
    let build = |state: &BTreeMap<String, (usize, Vec<String>)>| {
        let lines: Vec<String> = state
            .iter()
            .map(|(name, (_, filters))| format!("certs/{name} {}", filters.join(" ")))
            .collect();
        let certs = state
            .iter()
            .map(|(name, (pem, _))| (name.clone(), pool[*pem].clone()))
            .collect();
        render(port, &lines, &certs)
    };
    let v1 = build(&state);
    let haproxy = Haproxy::start("differential", &v1, &v1.hash().short()).await;
    let driver = SocketDriver::new(
        haproxy.instance.clone(),
        None,
        Metrics::unregistered().unwrap(),
    );
    let mut running = Arc::new(driver.deploy(v1, None, None, false).await.unwrap());
    let reloads = haproxy.reloads().await;
    let tls = connector();
    let (mut runtime, mut reloaded) = (0, 0);
    let mut names: Vec<String> = hosts.clone();
    names.push("base.test".into());
    for step in 0..12 {
        let cert = format!("c{}.pem", rng.below(4));
        match (rng.below(3), state.contains_key(&cert)) {
            // Add, or renew an existing one.
            (0, _) => {
                let filters = vec![hosts[rng.below(hosts.len())].clone()];
                let pem = 1 + rng.below(pool.len() - 1);
                let entry = state.entry(cert).or_insert((pem, filters));
                entry.0 = pem;
            }
            // New SNI filters.
            (1, true) => {
                let filters: Vec<String> = (0..1 + rng.below(2))
                    .map(|_| hosts[rng.below(hosts.len())].clone())
                    .collect();
                state.get_mut(&cert).unwrap().1 = filters;
            }
            // Remove.
            _ => {
                state.remove(&cert);
            }
        }
        let desired = build(&state);
        let deployed = driver
            .deploy(desired, None, Some(running.clone()), false)
            .await
            .unwrap();
        // Only two entries serving one name need the order of a fresh start.
        if deployed.strategy == DeployStrategy::Reload {
            assert!(
                deployed.reason.detail.contains("both serve"),
                "step {step}: {:?}",
                deployed.reason
            );
            reloaded += 1;
        } else {
            runtime += 1;
        }
        println!(
            "step {step}: {:?} {:?} {state:?}",
            deployed.strategy, deployed.reason.detail
        );
        running = Arc::new(deployed);
        let live = served_all(&tls, port, &names).await;

        // A fresh HAProxy from a copy of the files on disk, on another port.
        let fresh_dir = tempfile::tempdir().unwrap();
        for sub in ["files", "certs"] {
            std::fs::create_dir(fresh_dir.path().join(sub)).unwrap();
            for entry in std::fs::read_dir(haproxy.path().join(sub)).unwrap() {
                let entry = entry.unwrap();
                if entry.file_name().to_string_lossy().starts_with('.') {
                    continue;
                }
                std::fs::copy(
                    entry.path(),
                    fresh_dir.path().join(sub).join(entry.file_name()),
                )
                .unwrap();
            }
        }
        let fresh_port = free_port();
        let cfg = std::fs::read_to_string(haproxy.path().join("haproxy.cfg"))
            .unwrap()
            .replace(
                &format!("127.0.0.1:{port}"),
                &format!("127.0.0.1:{fresh_port}"),
            );
        std::fs::write(fresh_dir.path().join("haproxy.cfg"), cfg).unwrap();
        let mut fresh = KillOnDrop(
            Command::new("haproxy")
                .args(["-f", "haproxy.cfg"])
                .current_dir(fresh_dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("haproxy runs"),
        );
        let mut ready = false;
        for _ in 0..500 {
            if TcpStream::connect(("127.0.0.1", fresh_port)).await.is_ok() {
                ready = true;
                break;
            }
            if let Ok(Some(status)) = fresh.0.try_wait() {
                panic!("step {step}: the fresh HAProxy exited: {status}");
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(ready, "step {step}: the fresh HAProxy never listened");
        let expected = served_all(&tls, fresh_port, &names).await;
        for ((name, live), expected) in names.iter().zip(&live).zip(&expected) {
            assert_eq!(
                live.is_some(),
                expected.is_some(),
                "step {step}: SNI {name}, state {state:?}"
            );
            assert!(
                live == expected,
                "step {step}: SNI {name} differs, state {state:?}"
            );
        }
    }
    assert_eq!(haproxy.reloads().await, reloads + reloaded, "reloads");
    assert!(runtime > 0, "no step ran at runtime");
}

/// A certificate HAProxy refuses at runtime (here a key that does not match, which
/// the deployer is handed directly, as when a check before it let it through): the
/// runtime change fails, the reload that replaces it fails too, and afterwards the
/// files on disk and the running HAProxy agree on the last good state, which keeps
/// serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_refused_at_runtime_leaves_disk_and_haproxy_agreeing() {
    let Serving {
        a,
        b,
        port,
        v1,
        haproxy,
        driver,
        ..
    } = Serving::start("refused-deploy").await;
    let running = driver.deploy(v1.clone(), None, None, false).await.unwrap();
    let reloads = haproxy.reloads().await;
    let key_of_a = a.split("-----BEGIN PRIVATE KEY-----").nth(1).unwrap();
    let mismatched = mismatched(&b, &a);
    let v2 = render(
        port,
        &[
            "certs/a.pem a.test".to_owned(),
            "certs/bad.pem bad.test".to_owned(),
        ],
        &BTreeMap::from([
            ("a.pem".to_owned(), a.clone()),
            ("bad.pem".to_owned(), mismatched),
        ]),
    );
    let outcome = driver
        .deploy(v2, None, Some(Arc::new(running)), false)
        .await;
    let error = outcome.expect_err("HAProxy cannot load the certificate, by runtime or reload");
    let message = format!("{error:#}");
    // The runtime change failed and the reload that replaced it failed too.
    assert!(message.contains("reload failed"), "{message}");
    assert!(
        !message.contains(key_of_a.lines().nth(1).unwrap()),
        "the key never shows: {message}"
    );

    // The disk holds the last good state again ...
    let dir = haproxy.path();
    assert!(!dir.join("certs/bad.pem").exists(), "{message}");
    assert_eq!(
        std::fs::read_to_string(dir.join("files/tls.crtlist")).unwrap(),
        "certs/a.pem a.test\n"
    );
    // ... and so does HAProxy: the same worker, nothing of the refused change left.
    let runtime = driver.runtime();
    assert_eq!(runtime.ssl_certs().await.unwrap(), ["certs/a.pem"]);
    let entries = runtime.crt_list_entries("files/tls.crtlist").await.unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let tls = connector();
    assert_eq!(served(&tls, port, "a.test").await, Some(der(&a)));
    assert_eq!(served(&tls, port, "bad.test").await, None);
    assert!(
        haproxy.reloads().await <= reloads + 1,
        "at most the failed reload"
    );

    // The next good render deploys from there.
    let deployed = driver.deploy(v1.clone(), None, None, false).await.unwrap();
    assert_eq!(deployed.config.hash(), v1.hash());
    assert_eq!(served(&tls, port, "a.test").await, Some(der(&a)));
}

/// The first entry of a bind line's crt-list holds its default certificate (without
/// `strict-sni`, it answers every name no entry has), and HAProxy will not delete
/// that entry at runtime (`cannot be deleted, it is used as default certificate`).
/// A change to its SNI filters must not leave the old entry serving beside the new
/// one: the refusal is seen and the change is reloaded, after which HAProxy's
/// crt-list holds what the file says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_to_the_default_certificates_entry_is_not_left_half_done() {
    let scratch = tempfile::tempdir().unwrap();
    let a = certificate(scratch.path(), "a");
    let b = certificate(scratch.path(), "b");
    let port = free_port();
    let certs = BTreeMap::from([
        ("a.pem".to_owned(), a.clone()),
        ("b.pem".to_owned(), b.clone()),
    ]);
    let render = |lines: &[&str]| {
        let lines: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
        let strict = render(port, &lines, &certs);
        Arc::new(RenderedConfig::new(
            strict.main().replace(" strict-sni", ""),
            strict.maps().clone().into_iter().collect(),
            strict.files().clone().into_iter().collect(),
            strict.certificates().clone().into_iter().collect(),
            SourceMap::default(),
        ))
    };
    let v1 = render(&["certs/a.pem a.test", "certs/b.pem b.test"]);
    let haproxy = Haproxy::start("default-entry", &v1, &v1.hash().short()).await;
    let driver = SocketDriver::new(
        haproxy.instance.clone(),
        None,
        Metrics::unregistered().unwrap(),
    );
    let running = driver.deploy(v1, None, None, false).await.unwrap();
    let listed = || async {
        let answer = driver
            .runtime()
            .query("show ssl crt-list files/tls.crtlist")
            .await
            .unwrap();
        let mut lines: Vec<String> = answer
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect();
        lines.sort();
        lines
    };
    assert_eq!(listed().await, ["certs/a.pem a.test", "certs/b.pem b.test"]);

    // The second entry changes at runtime: its delete is not refused.
    let v2 = render(&["certs/a.pem a.test", "certs/b.pem b2.test"]);
    let reloads = haproxy.reloads().await;
    let running = driver
        .deploy(v2, None, Some(Arc::new(running)), false)
        .await
        .unwrap();
    assert_eq!(running.strategy, DeployStrategy::Runtime);
    assert_eq!(haproxy.reloads().await, reloads);
    assert_eq!(
        listed().await,
        ["certs/a.pem a.test", "certs/b.pem b2.test"]
    );

    // The first (default) entry's filters change: HAProxy refuses the delete.
    let v3 = render(&["certs/a.pem a2.test", "certs/b.pem b2.test"]);
    let deployed = driver
        .deploy(v3, None, Some(Arc::new(running)), false)
        .await
        .expect("deployed by a reload");
    assert_eq!(deployed.strategy, DeployStrategy::Reload);
    assert_eq!(
        listed().await,
        ["certs/a.pem a2.test", "certs/b.pem b2.test"],
        "the old entry of the default certificate is left"
    );
    let tls = connector();
    assert_eq!(served(&tls, port, "b2.test").await, Some(der(&b)));
}
