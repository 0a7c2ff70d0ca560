//! Dynamic backends against a real HAProxy: routes added and removed with
//! `haproxy.dynamicBackends` on. On 3.4 and later they are runtime changes (no reload,
//! no failed request, the files on disk say what runs); on the older lines (run by
//! `scripts/test.sh` with each line first on `PATH`) the same renders take the reload
//! path with the reason, and serve the same routes.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hapwright_deployer::Driver;
use hapwright_deployer::client::master::Version;
use hapwright_deployer::client::runtime::RuntimeClient;
use hapwright_deployer::client::socket::SocketAddress;
use hapwright_deployer::driver::{Deployed, SocketDriver};
use hapwright_deployer::haproxy::backends::Capability;
use hapwright_deployer::haproxy::files::ConfigDir;
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::model::{DeployStrategy, ReloadReason, RenderedConfig};
use support::traffic::{Client, Outcome, SlowBackend};
use support::{Backend, Haproxy, dynamic_driver, free_port, haproxy_line, http_get, routes_render};

const DELAY: Duration = Duration::from_millis(20);

/// Whether the `haproxy` on `PATH` has `add backend`.
fn dynamic_line() -> bool {
    haproxy_line() >= Version { major: 3, minor: 4 }
}

/// The config of [`routes_render`], routes named by the test.
fn render(port: u16, app: u16, routes: &BTreeMap<String, u16>) -> Arc<RenderedConfig> {
    routes_render(
        port,
        app,
        routes.iter().map(|(name, port)| (name.clone(), port)),
    )
}

/// Checks how a deployment that adds or removes routes went: a runtime change on 3.4,
/// else a reload saying the line has no `add backend`.
fn assert_route_change(deployed: &Deployed, dynamic: bool) {
    if dynamic {
        assert_eq!(
            deployed.strategy,
            DeployStrategy::Runtime,
            "{:?}",
            deployed.reason
        );
    } else {
        assert_eq!(
            deployed.strategy,
            DeployStrategy::Reload,
            "{:?}",
            deployed.reason
        );
        assert_eq!(deployed.reason.reload, Some(ReloadReason::Structure));
        assert!(
            deployed.reason.detail.contains("has no `add backend`"),
            "{}",
            deployed.reason.detail
        );
    }
}

/// `(status, body)` of `GET /` for every host, on a new connection each.
async fn served(port: u16, hosts: &[String]) -> BTreeMap<String, (u16, String)> {
    let mut out = BTreeMap::new();
    for host in hosts {
        let answer = http_get(port, host)
            .await
            .unwrap_or_else(|e| panic!("GET {host}: {e}"));
        out.insert(host.clone(), answer);
    }
    out
}

/// One request as a load client saw it.
struct Seen {
    host: String,
    expected: u16,
    outcome: Outcome,
    /// Whether the host was still routed when the answer came (a route being removed
    /// may answer from the default backend).
    still_routed: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_added_and_removed_under_load_fail_no_request() {
    let dynamic = dynamic_line();
    let app = SlowBackend::start(DELAY).await;
    let mut servers = Vec::new();
    for _ in 0..10 {
        servers.push(SlowBackend::start(DELAY).await);
    }
    let port = free_port();
    let mut routes = BTreeMap::new();
    let v1 = render(port, app.port, &routes);
    let haproxy = Haproxy::start("dynamic-load", &v1, &v1.hash().short()).await;
    let driver = dynamic_driver(&haproxy, Duration::from_secs(5));
    let mut running = driver.deploy(v1, None, None, false).await.unwrap();
    let reloads_before = haproxy.reloads().await;

    // The routes clients may use: (host, port of its server). `app.test` always.
    let live: Arc<Mutex<Vec<(String, u16)>>> =
        Arc::new(Mutex::new(vec![("app.test".to_owned(), app.port)]));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for (n, keep_alive) in [false, true, false, true, false, true]
        .into_iter()
        .enumerate()
    {
        let (stop, live) = (stop.clone(), live.clone());
        clients.spawn(async move {
            let mut client = Client::new(port, keep_alive);
            let mut seen = Vec::new();
            let mut turn = n;
            while !stop.load(Ordering::Relaxed) {
                let (host, expected) = {
                    let live = live.lock().unwrap();
                    turn += 1;
                    live[turn % live.len()].clone()
                };
                client.set_host(&host);
                let outcome = client.get().await;
                let still_routed = live.lock().unwrap().iter().any(|(h, _)| *h == host);
                seen.push(Seen {
                    host,
                    expected,
                    outcome,
                    still_routed,
                });
            }
            seen
        });
    }

    for (i, server) in servers.iter().enumerate() {
        routes.insert(format!("r{i}"), server.port);
        let desired = render(port, app.port, &routes);
        let deployed = driver
            .deploy(desired, None, Some(Arc::new(running)), false)
            .await
            .unwrap();
        assert_route_change(&deployed, dynamic);
        running = deployed;
        live.lock()
            .unwrap()
            .push((format!("r{i}.test"), server.port));
        tokio::time::sleep(DELAY * 4).await;
    }
    for i in 0..10 {
        live.lock()
            .unwrap()
            .retain(|(host, _)| *host != format!("r{i}.test"));
        routes.remove(&format!("r{i}"));
        let desired = render(port, app.port, &routes);
        let deployed = driver
            .deploy(desired, None, Some(Arc::new(running)), false)
            .await
            .unwrap();
        assert_route_change(&deployed, dynamic);
        running = deployed;
        tokio::time::sleep(DELAY * 4).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut seen = Vec::new();
    while let Some(done) = clients.join_next().await {
        seen.extend(done.unwrap());
    }

    let failed: Vec<_> = seen
        .iter()
        .filter(|s| !matches!(s.outcome.result, Ok((200, _))))
        .map(|s| (&s.host, &s.outcome))
        .collect();
    if dynamic {
        assert!(
            failed.is_empty(),
            "{} of {} requests failed: {failed:?}",
            failed.len(),
            seen.len()
        );
        assert_eq!(haproxy.reloads().await, reloads_before, "no reload");
    }
    // Every request to a routed host reached that host's server.
    let misrouted: Vec<_> = seen
        .iter()
        .filter(|s| s.still_routed)
        .filter(|s| matches!(&s.outcome.result, Ok((200, body)) if *body != s.expected.to_string()))
        .map(|s| (&s.host, s.expected, &s.outcome))
        .collect();
    assert!(misrouted.is_empty(), "misrouted: {misrouted:?}");
    assert!(seen.len() > 200, "only {} requests", seen.len());
    for server in &servers {
        assert!(
            !server.arrivals().is_empty(),
            "port {} never got a request",
            server.port
        );
    }
    // Nothing of the removed routes is left in HAProxy.
    let runtime = RuntimeClient::via_master(SocketAddress::Unix(haproxy.master_path()));
    let backends = runtime.query("show backend").await.unwrap();
    assert_eq!(
        backends
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect::<Vec<_>>(),
        ["be_app"],
        "{backends}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_from_the_files_on_disk_serves_exactly_the_live_routes() {
    let dynamic = dynamic_line();
    let app = Backend::start("app").await;
    let mut named = Vec::new();
    for i in 0..6 {
        named.push(Backend::start(&format!("r{i}")).await);
    }
    let port = free_port();
    let mut routes = BTreeMap::new();
    let v1 = render(port, app.port, &routes);
    let mut haproxy = Haproxy::start("dynamic-disk", &v1, &v1.hash().short()).await;
    let driver = dynamic_driver(&haproxy, Duration::from_secs(5));
    let mut running = driver.deploy(v1, None, None, false).await.unwrap();
    // r0..r5 added, then r1 and r4 removed, one deployment each.
    let steps: Vec<(usize, bool)> = (0..6)
        .map(|i| (i, true))
        .chain([(1, false), (4, false)])
        .collect();
    for (i, add) in steps {
        if add {
            routes.insert(format!("r{i}"), named[i].port);
        } else {
            routes.remove(&format!("r{i}"));
        }
        let deployed = driver
            .deploy(
                render(port, app.port, &routes),
                None,
                Some(Arc::new(running)),
                false,
            )
            .await
            .unwrap();
        assert_route_change(&deployed, dynamic);
        running = deployed;
    }
    let hosts: Vec<String> = (0..6)
        .map(|i| format!("r{i}.test"))
        .chain(["app.test".to_owned()])
        .collect();
    let live = served(port, &hosts).await;
    let expected: BTreeMap<String, (u16, String)> = hosts
        .iter()
        .map(|host| {
            let name = host.trim_end_matches(".test");
            let body = if ["r1", "r4", "app"].contains(&name) {
                "app"
            } else {
                name
            };
            (host.clone(), (200, body.to_owned()))
        })
        .collect();
    assert_eq!(live, expected);

    // The files on disk are the last render, and HAProxy started from them serves
    // the same routes.
    let (on_disk, _) = ConfigDir::new(haproxy.path())
        .read_rendered()
        .unwrap()
        .unwrap();
    assert_eq!(on_disk.hash(), running.config.hash());
    haproxy.kill();
    haproxy.restart().await;
    assert_eq!(served(port, &hosts).await, live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_add_backend_falls_back_to_a_reload_that_serves_the_route() {
    if !dynamic_line() {
        // Older lines never send `add backend`; the reload path is covered above.
        eprintln!("skipped: HAProxy {} has no `add backend`", haproxy_line());
        return;
    }
    let app = Backend::start("app").await;
    let shop = Backend::start("shop").await;
    let port = free_port();
    let mut routes = BTreeMap::new();
    let v1 = render(port, app.port, &routes);
    let haproxy = Haproxy::start("dynamic-refused", &v1, &v1.hash().short()).await;
    let driver = dynamic_driver(&haproxy, Duration::from_secs(5));
    let running = driver.deploy(v1, None, None, false).await.unwrap();
    let reloads_before = haproxy.reloads().await;

    // Someone created `be_shop` by hand: HAProxy refuses to create it again.
    let runtime = RuntimeClient::via_master(SocketAddress::Unix(haproxy.master_path()));
    runtime.add_backend("be_shop", "routes").await.unwrap();

    routes.insert("shop".to_owned(), shop.port);
    let deployed = driver
        .deploy(
            render(port, app.port, &routes),
            None,
            Some(Arc::new(running)),
            false,
        )
        .await
        .unwrap();
    assert_eq!(deployed.strategy, DeployStrategy::Reload);
    assert_eq!(deployed.reason.reload, Some(ReloadReason::RuntimeFailed));
    assert!(
        deployed
            .reason
            .detail
            .starts_with("runtime change refused by HAProxy (backend be_shop added from routes: HAProxy refused `add backend be_shop from routes`: Error during backend creation"),
        "{}",
        deployed.reason.detail
    );
    assert_eq!(haproxy.reloads().await, reloads_before + 1);
    assert_eq!(
        http_get(port, "shop.test").await.unwrap(),
        (200, "shop".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_route_waits_for_its_requests_and_past_the_drain_bound_stays_unpublished() {
    if !dynamic_line() {
        eprintln!("skipped: HAProxy {} has no `add backend`", haproxy_line());
        return;
    }
    let app = Backend::start("app").await;
    // Answers after 1.5 s: longer than the drain bound.
    let slow = SlowBackend::start(Duration::from_millis(1500)).await;
    let port = free_port();
    let mut routes = BTreeMap::from([("slow".to_owned(), slow.port)]);
    let v1 = render(port, app.port, &BTreeMap::new());
    let haproxy = Haproxy::start("dynamic-drain", &v1, &v1.hash().short()).await;
    let driver = dynamic_driver(&haproxy, Duration::from_millis(300));
    let running = driver.deploy(v1, None, None, false).await.unwrap();
    let running = driver
        .deploy(
            render(port, app.port, &routes),
            None,
            Some(Arc::new(running)),
            false,
        )
        .await
        .unwrap();
    assert_eq!(running.strategy, DeployStrategy::Runtime);

    // A request in flight on the route while it is removed.
    let in_flight = tokio::spawn(async move {
        let mut client = Client::new(port, true);
        client.set_host("slow.test");
        client.get().await
    });
    tokio::time::timeout(Duration::from_secs(5), async {
        while slow.arrivals().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the request reaches the slow server");
    routes.clear();
    let removed = driver
        .deploy(
            render(port, app.port, &routes),
            None,
            Some(Arc::new(running)),
            false,
        )
        .await
        .unwrap();
    assert_eq!(removed.strategy, DeployStrategy::Runtime);
    // The request in flight finishes on its server.
    let outcome = in_flight.await.unwrap();
    assert!(
        matches!(&outcome.result, Ok((200, body)) if *body == slow.port.to_string()),
        "{outcome:?}"
    );
    // The route is gone, the backend is unpublished (not deleted: it still had a
    // request when the bound passed), and the next add of the same name is refused by
    // HAProxy and falls back to a reload.
    assert_eq!(
        http_get(port, "slow.test").await.unwrap(),
        (200, "app".to_owned())
    );
    let runtime = RuntimeClient::via_master(SocketAddress::Unix(haproxy.master_path()));
    let listed = runtime.query("show backend").await.unwrap();
    assert!(listed.contains("be_slow"), "{listed}");
    let shop = Backend::start("slow-again").await;
    let again = driver
        .deploy(
            render(
                port,
                app.port,
                &BTreeMap::from([("slow".to_owned(), shop.port)]),
            ),
            None,
            Some(Arc::new(removed)),
            false,
        )
        .await
        .unwrap();
    assert_eq!(again.reason.reload, Some(ReloadReason::RuntimeFailed));
    assert_eq!(
        http_get(port, "slow.test").await.unwrap(),
        (200, "slow-again".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_instance_line_decides_whether_backends_are_added_at_runtime() {
    let app = Backend::start("app").await;
    let v1 = render(free_port(), app.port, &BTreeMap::new());
    let haproxy = Haproxy::start("dynamic-line", &v1, &v1.hash().short()).await;
    let off = SocketDriver::new(
        haproxy.instance.clone(),
        None,
        Metrics::unregistered().unwrap(),
    );
    assert_eq!(off.dynamic_backends().await, Capability::Off);
    let on = dynamic_driver(&haproxy, Duration::from_secs(1));
    let line = haproxy_line();
    let expected = if dynamic_line() {
        Capability::On
    } else {
        Capability::Unsupported(format!(
            "HAProxy {line} has no `add backend` (dynamicBackends needs 3.4 or later)"
        ))
    };
    // Asked twice: the line is asked once and kept (the warning is logged once).
    assert_eq!(on.dynamic_backends().await, expected);
    assert_eq!(on.dynamic_backends().await, expected);
}
