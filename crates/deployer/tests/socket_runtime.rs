//! Runtime-only changes against a real HAProxy 2.6: traffic moves while the master's
//! reload counter stays put.

mod support;

use hapwright_deployer::Driver;
use std::fmt::Write as _;
use std::sync::Arc;

use hapwright_deployer::client::runtime::PatternKind;
use hapwright_deployer::driver::SocketDriver;
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::model::{DeployStrategy, RenderedConfig, SourceMap};
use support::tls::certificate;
use support::{
    Backend, Haproxy, bodies, config, free_port, rendered, rendered_with, wait_for_body,
};

/// A socket driver for `haproxy`, with metrics of its own.
fn driver_for(haproxy: &Haproxy) -> SocketDriver {
    SocketDriver::new(
        haproxy.instance.clone(),
        None,
        Metrics::unregistered().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_and_map_changes_apply_without_reload() {
    let (a, b, c, other) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
        Backend::start("other").await,
    );
    let port = free_port();
    let render = |servers: &str, map: &str| {
        rendered(
            &config(
                port,
                &format!(
                    "backend be_app\n    balance roundrobin\n{servers}\n\
backend be_other\n    server o1 127.0.0.1:{}\n",
                    other.port
                ),
            ),
            &[("hosts.map", map)],
        )
    };
    let v1 = render(
        &format!("    server s1 127.0.0.1:{}\n", a.port),
        "other.test be_other\n",
    );
    let haproxy = Haproxy::start("local", &v1, &v1.hash().short()).await;
    let driver = driver_for(&haproxy);

    // After a controller restart the files on disk with a matching marker are "running".
    let running = driver.deploy(v1.clone(), None, None, false).await.unwrap();
    assert_eq!(running.strategy, DeployStrategy::Noop);
    wait_for_body(port, "app.test", "a").await;
    wait_for_body(port, "other.test", "other").await;
    let reloads = haproxy.reloads().await;

    // Address change.
    let v2 = render(
        &format!("    server s1 127.0.0.1:{}\n", b.port),
        "other.test be_other\n",
    );
    let d2 = driver
        .deploy(v2.clone(), None, Some(running.into()), false)
        .await
        .unwrap();
    assert_eq!(d2.strategy, DeployStrategy::Runtime, "{:?}", d2.reason);
    assert_eq!(bodies(port, "app.test", 5).await, vec!["200 b"; 5]);

    // Weight change plus a dynamic server.
    let v3 = render(
        &format!(
            "    server s1 127.0.0.1:{} weight 2\n    server s2 127.0.0.1:{}\n",
            b.port, c.port
        ),
        "other.test be_other\n",
    );
    let d3 = driver
        .deploy(v3, None, Some(d2.into()), false)
        .await
        .unwrap();
    assert_eq!(d3.strategy, DeployStrategy::Runtime, "{:?}", d3.reason);
    let seen = bodies(port, "app.test", 12).await;
    assert!(
        seen.contains(&"200 b".to_owned()) && seen.contains(&"200 c".to_owned()),
        "{seen:?}"
    );

    // State change: s1 in maintenance.
    let v4 = render(
        &format!(
            "    server s1 127.0.0.1:{} weight 2 disabled\n    server s2 127.0.0.1:{}\n",
            b.port, c.port
        ),
        "other.test be_other\n",
    );
    let d4 = driver
        .deploy(v4, None, Some(d3.into()), false)
        .await
        .unwrap();
    assert_eq!(d4.strategy, DeployStrategy::Runtime, "{:?}", d4.reason);
    assert_eq!(bodies(port, "app.test", 6).await, vec!["200 c"; 6]);

    // Server removed, s1 back.
    let v5 = render(
        &format!("    server s1 127.0.0.1:{}\n", b.port),
        "other.test be_other\n",
    );
    let d5 = driver
        .deploy(v5.clone(), None, Some(d4.into()), false)
        .await
        .unwrap();
    assert_eq!(d5.strategy, DeployStrategy::Runtime, "{:?}", d5.reason);
    assert_eq!(bodies(port, "app.test", 6).await, vec!["200 b"; 6]);

    // A map above the 16 KB payload limit, replaced atomically in chunks.
    let mut big = String::new();
    for i in 0..1500 {
        writeln!(big, "h{i}.example.test be_other").unwrap();
    }
    assert!(big.len() > 16 * 1024);
    let v6 = render(&format!("    server s1 127.0.0.1:{}\n", b.port), &big);
    let d6 = driver
        .deploy(v6.clone(), None, Some(d5.into()), false)
        .await
        .unwrap();
    assert_eq!(d6.strategy, DeployStrategy::Runtime, "{:?}", d6.reason);
    assert_eq!(bodies(port, "h0.example.test", 1).await, vec!["200 other"]);
    assert_eq!(
        bodies(port, "h1499.example.test", 1).await,
        vec!["200 other"]
    );
    // Entries of the old version are gone.
    assert_eq!(bodies(port, "other.test", 1).await, vec!["200 b"]);

    // A few entries of that exact-match map change entry by entry: an added, a
    // changed and a removed key, while every other entry stays the one HAProxy holds
    // (the same reference in `show map`, where a new version would rebuild them all).
    let rt = driver.runtime();
    let file = map_file(&driver, "maps/hosts.map").await;
    let show = || async { rt.query(&format!("show map {file}")).await.unwrap() };
    let before = show().await;
    let edited = big
        .replace("h0.example.test be_other\n", "")
        .replace("h1.example.test be_other", "h1.example.test be_app")
        + "new.example.test be_other\n";
    let v7 = render(&format!("    server s1 127.0.0.1:{}\n", b.port), &edited);
    let d7 = driver
        .deploy(v7, None, Some(d6.into()), false)
        .await
        .unwrap();
    assert_eq!(d7.strategy, DeployStrategy::Runtime, "{:?}", d7.reason);
    assert_eq!(bodies(port, "new.example.test", 1).await, vec!["200 other"]);
    assert_eq!(bodies(port, "h1.example.test", 1).await, vec!["200 b"]);
    assert_eq!(bodies(port, "h2.example.test", 1).await, vec!["200 other"]);
    let after = show().await;
    assert_eq!(after.lines().filter(|l| !l.trim().is_empty()).count(), 1500);
    assert!(
        entry_reference(&after, "h0.example.test").is_none(),
        "h0 removed"
    );
    assert!(entry_reference(&before, "h7.example.test").is_some());
    assert_eq!(
        entry_reference(&before, "h7.example.test"),
        entry_reference(&after, "h7.example.test"),
        "untouched entries stay in place"
    );
    let big = edited;

    assert_eq!(haproxy.reloads().await, reloads, "no reload happened");
    // The files on disk follow, so a later reload keeps the state.
    let on_disk = std::fs::read_to_string(haproxy.path().join("haproxy.cfg")).unwrap();
    assert!(on_disk.contains(&format!("server s1 127.0.0.1:{}", b.port)));
    assert!(!on_disk.contains("s2"));
    let map = std::fs::read_to_string(haproxy.path().join("maps/hosts.map")).unwrap();
    assert_eq!(map, big);
    // The marker stays the one the worker runs.
    assert!(on_disk.contains(&format!("HAPWRIGHT_CONFIG_VERSION {}", v1.hash().short())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_changes_apply_without_reload() {
    let scratch = tempfile::tempdir().unwrap();
    let (v1_pem, v2_pem) = (
        certificate(scratch.path(), "v1"),
        certificate(scratch.path(), "v2"),
    );
    let a = Backend::start("a").await;
    let (port, tls_port) = (free_port(), free_port());
    let render = |pem: &str| {
        rendered_with(
            &config(
                port,
                &format!(
                    "frontend fe_tls\n    bind 127.0.0.1:{tls_port} ssl crt certs/site.pem\n    default_backend be_app\n\n\
backend be_app\n    server s1 127.0.0.1:{}\n",
                    a.port
                ),
            ),
            &[("hosts.map", "")],
            &[("site.pem", pem)],
        )
    };
    let v1 = render(&v1_pem);
    let haproxy = Haproxy::start("tls", &v1, &v1.hash().short()).await;
    let driver = driver_for(&haproxy);
    let running = driver.deploy(v1, None, None, false).await.unwrap();
    let reloads = haproxy.reloads().await;
    let subject = || async {
        driver
            .runtime()
            .command("show ssl cert certs/site.pem")
            .await
            .unwrap()
    };
    assert!(subject().await.contains("CN=v1"));

    let v2 = render(&v2_pem);
    support::deploy_by(&driver, v2, running.into(), DeployStrategy::Runtime).await;
    let shown = subject().await;
    assert!(shown.contains("CN=v2"), "{shown}");
    assert_eq!(haproxy.reloads().await, reloads);
    assert_eq!(
        std::fs::read_to_string(haproxy.path().join("certs/site.pem")).unwrap(),
        v2_pem
    );
}

/// A render whose `files/` hold an ACL pattern file and an error page.
fn with_files(main: &str, files: &[(&str, &str)]) -> std::sync::Arc<RenderedConfig> {
    std::sync::Arc::new(RenderedConfig::new(
        main,
        [("hosts.map".to_owned(), std::sync::Arc::<str>::from(""))].into(),
        files
            .iter()
            .map(|(name, content)| ((*name).to_owned(), std::sync::Arc::<str>::from(*content)))
            .collect(),
        Default::default(),
        SourceMap::default(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_files_change_at_runtime_and_other_files_reload() {
    let app = Backend::start("a").await;
    let port = free_port();
    let main = format!(
        "global\n    stats timeout 30s\n\n\
defaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n    \
errorfile 503 files/503.http\n\n\
frontend fe_main\n    bind 127.0.0.1:{port}\n    \
acl blocked hdr(host),lower,word(1,:) -f files/blocked.acl\n    \
http-request deny deny_status 403 if blocked\n    \
use_backend be_down if {{ hdr(host),lower,word(1,:) -m str down.test }}\n    \
default_backend be_app\n\n\
backend be_app\n    server s1 127.0.0.1:{}\n\n\
backend be_down\n",
        app.port
    );
    let page = |text: &str| {
        format!("HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n\r\n{text}\n")
    };
    let v1 = with_files(
        &main,
        &[
            ("blocked.acl", "blocked.test\n"),
            ("503.http", &page("down v1")),
        ],
    );
    let haproxy = Haproxy::start("local", &v1, &v1.hash().short()).await;
    let driver = driver_for(&haproxy);
    let running = driver.deploy(v1.clone(), None, None, false).await.unwrap();
    wait_for_body(port, "app.test", "a").await;
    assert_eq!(
        support::http_get(port, "blocked.test").await.unwrap().0,
        403
    );
    let reloads = haproxy.reloads().await;

    // The ACL file is a pattern file: replaced through the runtime API, one pattern
    // per command in batches (2,001 patterns need several requests).
    let mut acl = String::from("app.test\n");
    for i in 0..2000 {
        writeln!(acl, "h{i}.blocked.test").unwrap();
    }
    let v2 = with_files(
        &main,
        &[("blocked.acl", &acl), ("503.http", &page("down v1"))],
    );
    let d2 = driver
        .deploy(v2, None, Some(running.into()), false)
        .await
        .unwrap();
    assert_eq!(d2.strategy, DeployStrategy::Runtime, "{:?}", d2.reason);
    assert_eq!(support::http_get(port, "app.test").await.unwrap().0, 403);
    assert_eq!(bodies(port, "blocked.test", 2).await, vec!["200 a"; 2]);
    assert_eq!(haproxy.reloads().await, reloads, "no reload for the ACL");
    assert_eq!(
        support::http_get(port, "h1999.blocked.test")
            .await
            .unwrap()
            .0,
        403
    );
    let on_disk = std::fs::read_to_string(haproxy.path().join("files/blocked.acl")).unwrap();
    assert_eq!(on_disk, acl);

    // The error page is read only when HAProxy loads its config: a reload, with why.
    let (status, body) = support::http_get(port, "down.test").await.unwrap();
    assert_eq!((status, body.as_str()), (503, "down v1\n"));
    let v3 = with_files(
        &main,
        &[("blocked.acl", &acl), ("503.http", &page("down v2"))],
    );
    let d3 = driver
        .deploy(v3, None, Some(d2.into()), false)
        .await
        .unwrap();
    assert_eq!(d3.strategy, DeployStrategy::Reload, "{:?}", d3.reason);
    assert!(
        d3.reason.detail.contains("files/503.http changed"),
        "{:?}",
        d3.reason
    );
    assert_eq!(haproxy.reloads().await, reloads + 1);
    let (status, body) = support::http_get(port, "down.test").await.unwrap();
    assert_eq!((status, body.as_str()), (503, "down v2\n"));
    // The runtime ACL change survived the reload (the file on disk was rewritten).
    assert_eq!(support::http_get(port, "app.test").await.unwrap().0, 403);
}

/// A `map_beg` map changes entry by entry (HAProxy indexes it in a prefix tree and
/// answers with the longest matching key, whatever the order of the entries): over
/// random adds, changes and removals of nested prefixes, every lookup through the
/// running HAProxy gives the longest prefix of the map as rendered, as a HAProxy
/// started fresh from the last render does, with no reload and the untouched
/// entries left in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_maps_change_entry_by_entry_with_longest_match_kept() {
    const KEYS: [&str; 10] = ["k", "ka", "kab", "kabc", "kb", "kba", "m", "ma", "mab", "x"];
    const PROBES: [&str; 14] = [
        "k", "ka", "kab", "kabc", "kabcd", "kb", "kbx", "kc", "m", "mab", "mabz", "x", "xy", "z",
    ];
    let render = |port: u16, map: &std::collections::BTreeMap<&str, String>| {
        let main = format!(
            "global\n    stats timeout 30s\n\n\
defaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
frontend fe_main\n    bind 127.0.0.1:{port}\n    \
http-request return status 200 content-type text/plain lf-string \"%[req.hdr(host),map_beg(maps/prefix.map,none)]\"\n"
        );
        // Rendered in a shuffled order: the order must not matter.
        let mut lines: Vec<String> = map.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
        lines.reverse();
        rendered(&main, &[("prefix.map", &lines.concat())])
    };
    let expected = |map: &std::collections::BTreeMap<&str, String>, probe: &str| {
        map.iter()
            .filter(|(key, _)| probe.starts_with(*key))
            .max_by_key(|(key, _)| key.len())
            .map_or_else(|| "none".to_owned(), |(_, value)| value.clone())
    };
    let port = free_port();
    let mut map: std::collections::BTreeMap<&str, String> = [
        ("k", "v0".to_owned()),
        ("kab", "v1".to_owned()),
        ("m", "v2".to_owned()),
    ]
    .into();
    let first = render(port, &map);
    let haproxy = Haproxy::start("local", &first, &first.hash().short()).await;
    let driver = driver_for(&haproxy);
    let mut running = driver.deploy(first, None, None, false).await.unwrap();
    let reloads = haproxy.reloads().await;
    let mut seed: u64 = 0x5eed_0042;
    let mut next = |below: usize| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        usize::try_from(seed >> 33).unwrap() % below
    };
    for step in 0..40 {
        let last = map.clone();
        for _ in 0..=next(3) {
            let key = KEYS[next(KEYS.len())];
            if map.contains_key(key) && next(3) == 0 {
                map.remove(key);
            } else {
                map.insert(key, format!("s{step}"));
            }
        }
        let desired = render(port, &map);
        let deployed = driver
            .deploy(desired, None, Some(running.into()), false)
            .await
            .unwrap();
        let strategy = if map == last {
            DeployStrategy::Noop
        } else {
            DeployStrategy::Runtime
        };
        assert_eq!(deployed.strategy, strategy, "{:?}", deployed.reason);
        for probe in PROBES {
            assert_eq!(
                bodies(port, probe, 1).await,
                vec![format!("200 {}", expected(&map, probe))],
                "step {step}, {probe}, map {map:?}"
            );
        }
        running = deployed;
    }
    assert_eq!(haproxy.reloads().await, reloads, "no reload happened");

    // One more change: the untouched entries keep their place in HAProxy's map
    // (a new version of the map would have rebuilt them all).
    let rt = driver.runtime();
    let file = map_file(&driver, "maps/prefix.map").await;
    let show = || async { rt.query(&format!("show map {file}")).await.unwrap() };
    map.insert("kabc", "kept".to_owned());
    let deployed = driver
        .deploy(render(port, &map), None, Some(running.into()), false)
        .await
        .unwrap();
    map.insert("k", "a".to_owned());
    map.insert("x", "b".to_owned());
    map.remove("kb");
    map.insert("ma", "c".to_owned());
    let before = show().await;
    let deployed = driver
        .deploy(render(port, &map), None, Some(deployed.into()), false)
        .await
        .unwrap();
    assert_eq!(
        deployed.strategy,
        DeployStrategy::Runtime,
        "{:?}",
        deployed.reason
    );
    let after = show().await;
    assert!(entry_reference(&before, "kabc").is_some(), "{before}");
    assert_eq!(
        entry_reference(&before, "kabc"),
        entry_reference(&after, "kabc"),
        "untouched entries stay in place"
    );
    assert!(entry_reference(&after, "kb").is_none(), "kb removed");

    // A HAProxy started fresh from the last render answers every lookup the same.
    let fresh_port = free_port();
    let fresh = render(fresh_port, &map);
    let fresh_haproxy = Haproxy::start("fresh", &fresh, &fresh.hash().short()).await;
    for probe in PROBES {
        assert_eq!(
            bodies(fresh_port, probe, 1).await,
            bodies(port, probe, 1).await,
            "{probe}"
        );
    }
    drop(fresh_haproxy);
}

/// The name HAProxy knows the map ending in `suffix` by.
async fn map_file(driver: &SocketDriver, suffix: &str) -> String {
    driver
        .runtime()
        .pattern_files(PatternKind::Map)
        .await
        .unwrap()
        .into_iter()
        .find(|f| f.ends_with(suffix))
        .expect("HAProxy lists the map")
}

/// The reference of `key`'s entry in a `show map` listing: the same while the entry
/// stays in place, a new one when the map is built again.
fn entry_reference(listing: &str, key: &str) -> Option<String> {
    listing
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(key))
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
}

/// An ACL file replaced at runtime through the master CLI: its patterns go as chained
/// `add acl` commands, on lines the master runs whole on every line of HAProxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_file_of_thousands_of_patterns_is_replaced_at_runtime() {
    let a = Backend::start("a").await;
    let port = free_port();
    let render = |prefix: &str| {
        let main = config(
            port,
            &format!(
                "backend be_app\n    acl blocked req.hdr(host),lower,word(1,:) -f files/blocked.acl\n    \
http-request deny if blocked\n    server s1 127.0.0.1:{}\n",
                a.port
            ),
        );
        let mut acl = String::new();
        for i in 0..3000 {
            writeln!(acl, "{prefix}-{i}.blocked.example.test").unwrap();
        }
        Arc::new(
            RenderedConfig::builder(main)
                .map("hosts.map", "")
                .file("blocked.acl", acl)
                .build(),
        )
    };
    let v1 = render("old");
    let haproxy = Haproxy::start("local", &v1, &v1.hash().short()).await;
    let driver = driver_for(&haproxy);
    let running = driver.deploy(v1.clone(), None, None, false).await.unwrap();
    wait_for_body(port, "open.example.test", "a").await;
    assert_eq!(
        bodies(port, "old-2999.blocked.example.test", 1).await[0]
            .split(' ')
            .next(),
        Some("403")
    );
    let reloads = haproxy.reloads().await;

    let v2 = render("new");
    let d2 = driver
        .deploy(v2, None, Some(running.into()), false)
        .await
        .unwrap();
    assert_eq!(d2.strategy, DeployStrategy::Runtime, "{:?}", d2.reason);
    assert_eq!(haproxy.reloads().await, reloads, "no reload happened");
    for i in [0, 1234, 2999] {
        let new = bodies(port, &format!("new-{i}.blocked.example.test"), 1).await;
        assert!(new[0].starts_with("403"), "new-{i}: {new:?}");
        let old = bodies(port, &format!("old-{i}.blocked.example.test"), 1).await;
        assert_eq!(old, vec!["200 a"], "old-{i}");
    }
}
