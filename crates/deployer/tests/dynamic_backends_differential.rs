//! Differential test of dynamic backends: random sequences of route adds and removals
//! mixed with endpoint changes are deployed to a real HAProxy with
//! `haproxy.dynamicBackends` on; after every step the routes it serves must equal those
//! of a fresh HAProxy started from the files on disk (only its listening port
//! changed). On 3.4 every step is a runtime change (no reload); on older lines the
//! same sequences take the reload path.
//!
//! The sequence is drawn from a seed: `HAPWRIGHT_DIFF_SEED=<n>` replays one (every
//! failure message names its seed).

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::Driver;
use hapwright_deployer::client::master::Version;
use hapwright_deployer::haproxy::files::ConfigDir;
use hapwright_eventbus::model::{DeployStrategy, RenderedConfig};
use support::random::{Draw, seed};
use support::{Backend, Haproxy, dynamic_driver, free_port, haproxy_line, http_get, routes_render};

/// Routes the sequences draw from, and the servers their backends point at.
const ROUTES: usize = 8;
const SERVERS: usize = 5;
const STEPS: usize = 24;

/// The config of [`routes_render`], route `i` named `r<i>`.
fn render(port: u16, app: u16, routes: &BTreeMap<usize, u16>) -> Arc<RenderedConfig> {
    routes_render(
        port,
        app,
        routes
            .iter()
            .map(|(route, port)| (format!("r{route}"), port)),
    )
}

/// What each host is served: `(status, body)`.
async fn served(port: u16) -> BTreeMap<String, (u16, String)> {
    let mut out = BTreeMap::new();
    for host in (0..ROUTES)
        .map(|r| format!("r{r}.test"))
        .chain(["app.test".to_owned()])
    {
        let answer = http_get(port, &host)
            .await
            .unwrap_or_else(|e| panic!("GET {host} on port {port}: {e}"));
        out.insert(host, answer);
    }
    out
}

/// The files in `dir` as a render, listening on `port` instead of `live_port`.
fn files_on(dir: &std::path::Path, live_port: u16, port: u16) -> Arc<RenderedConfig> {
    let (on_disk, _) = ConfigDir::new(dir).read_rendered().unwrap().unwrap();
    let bind = format!("bind 127.0.0.1:{live_port}\n");
    assert!(on_disk.main().contains(&bind));
    Arc::new(RenderedConfig::new(
        on_disk
            .main()
            .replace(&bind, &format!("bind 127.0.0.1:{port}\n")),
        on_disk.maps().clone().into_iter().collect(),
        on_disk.files().clone().into_iter().collect(),
        on_disk.certificates().clone().into_iter().collect(),
        on_disk.source_map().clone(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_route_changes_serve_what_a_fresh_haproxy_on_the_files_serves() {
    let dynamic = haproxy_line() >= Version { major: 3, minor: 4 };
    let seed = seed("HAPWRIGHT_DIFF_SEED");
    let mut draw = Draw(seed);
    let app = Backend::start("app").await;
    let mut servers = Vec::new();
    for i in 0..SERVERS {
        servers.push(Backend::start(&format!("server-{i}")).await);
    }
    let port = free_port();
    let mut routes: BTreeMap<usize, u16> = BTreeMap::new();
    let v1 = render(port, app.port, &routes);
    let haproxy = Haproxy::start("differential", &v1, &v1.hash().short()).await;
    let driver = dynamic_driver(&haproxy, Duration::from_secs(2));
    let mut running = Arc::new(driver.deploy(v1, None, None, false).await.unwrap());
    let reloads_before = haproxy.reloads().await;
    let mut history = Vec::new();

    for step in 0..STEPS {
        // One to three changes per deployment.
        let mut changes = Vec::new();
        for _ in 0..=draw.below(3) {
            let route = draw.below(ROUTES);
            let server = servers[draw.below(SERVERS)].port;
            let change = match routes.get(&route) {
                None => {
                    routes.insert(route, server);
                    format!("add r{route}->{server}")
                }
                Some(_) if draw.below(2) == 0 => {
                    routes.remove(&route);
                    format!("remove r{route}")
                }
                Some(_) => {
                    routes.insert(route, server);
                    format!("move r{route}->{server}")
                }
            };
            changes.push(change);
        }
        history.push(changes.join(", "));
        let deployed = driver
            .deploy(
                render(port, app.port, &routes),
                None,
                Some(running.clone()),
                false,
            )
            .await
            .unwrap_or_else(|e| panic!("seed {seed}, step {step} ({history:?}): {e}"));
        if dynamic {
            assert_ne!(
                deployed.strategy,
                DeployStrategy::Reload,
                "seed {seed}, step {step} ({history:?}): {:?}",
                deployed.reason
            );
        }
        running = Arc::new(deployed);

        let live = served(port).await;
        // What the render says: each route's server, everything else the default.
        let expected: BTreeMap<String, (u16, String)> = (0..ROUTES)
            .map(|r| {
                let body = match routes.get(&r) {
                    Some(port) => {
                        let i = servers.iter().position(|s| s.port == *port).unwrap();
                        format!("server-{i}")
                    }
                    None => "app".to_owned(),
                };
                (format!("r{r}.test"), (200, body))
            })
            .chain([("app.test".to_owned(), (200, "app".to_owned()))])
            .collect();
        assert_eq!(live, expected, "seed {seed}, step {step} ({history:?})");

        let fresh_port = free_port();
        let fresh = Haproxy::start(
            "differential-fresh",
            &files_on(haproxy.path(), port, fresh_port),
            &running.marker,
        )
        .await;
        assert_eq!(
            served(fresh_port).await,
            live,
            "seed {seed}, step {step} ({history:?}): a fresh HAProxy on the files serves other routes"
        );
        drop(fresh);
    }
    if dynamic {
        assert_eq!(
            haproxy.reloads().await,
            reloads_before,
            "seed {seed}: no reload ({history:?})"
        );
    }
}
