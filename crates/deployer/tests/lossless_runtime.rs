//! Runtime changes under real traffic lose no request: HAProxy 2.6 in front of backends
//! that answer after 50 ms, clients with and without keep-alive, `http-reuse always`,
//! while the socket driver moves a server 20 times and removes 10 servers.

mod support;

use hapwright_deployer::Driver;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hapwright_deployer::driver::{Deployed, SocketDriver};
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::model::{DeployStrategy, RenderedConfig};
use support::traffic::{Client, Outcome, SlowBackend};
use support::{Haproxy, free_port, rendered};

const DELAY: Duration = Duration::from_millis(50);

/// The config: `be_app` (roundrobin, `http-reuse always`) with `s1` at `s1_port` and
/// the servers `r<i>` still present at `removable[i]`.
fn render(port: u16, s1_port: u16, removable: &[(usize, u16)]) -> Arc<RenderedConfig> {
    let mut servers = format!("    server s1 127.0.0.1:{s1_port}\n");
    for (i, port) in removable {
        servers.push_str(&format!("    server r{i} 127.0.0.1:{port}\n"));
    }
    rendered(
        &format!(
            "global\n    stats timeout 30s\n\n\
defaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
frontend fe_main\n    bind 127.0.0.1:{port}\n    default_backend be_app\n\n\
backend be_app\n    balance roundrobin\n    http-reuse always\n{servers}"
        ),
        &[],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn address_flips_and_removals_lose_no_request_and_never_reach_the_old_address() {
    // A fresh backend for every address s1 takes, so "the old address" is never
    // legitimately used again, and one per removable server.
    let mut flips = Vec::new();
    for _ in 0..21 {
        flips.push(SlowBackend::start(DELAY).await);
    }
    let mut removables = Vec::new();
    for _ in 0..10 {
        removables.push(SlowBackend::start(DELAY).await);
    }
    let port = free_port();
    let mut present: Vec<(usize, u16)> = removables.iter().map(|b| b.port).enumerate().collect();
    let v1 = render(port, flips[0].port, &present);
    let haproxy = Haproxy::start("lossless", &v1, &v1.hash().short()).await;
    let driver = SocketDriver::new(
        haproxy.instance.clone(),
        None,
        Metrics::unregistered().unwrap(),
    );
    let mut running: Deployed = driver.deploy(v1, None, None, false).await.unwrap();
    let reloads_before = haproxy.reloads().await;

    // Clients: four on a new connection per request, four keep-alive.
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for keep_alive in [false, true, false, true, false, true, false, true] {
        let stop = stop.clone();
        clients.spawn(async move {
            let mut client = Client::new(port, keep_alive);
            let mut outcomes: Vec<Outcome> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                outcomes.push(client.get().await);
            }
            outcomes
        });
    }
    // Traffic reaches every server (and fills HAProxy's idle connection pools) before
    // the first change.
    tokio::time::timeout(Duration::from_secs(30), async {
        while std::iter::once(&flips[0])
            .chain(&removables)
            .any(|backend| backend.arrivals().len() < 2)
        {
            tokio::time::sleep(DELAY).await;
        }
    })
    .await
    .expect("traffic reaches every server");

    // (backend port that must see no new request, from when)
    let mut retired: Vec<(u16, Instant)> = Vec::new();
    for flip in 1..=20 {
        if flip % 2 == 0 {
            present.remove(0);
        }
        let desired = render(port, flips[flip].port, &present);
        let deployed = driver
            .deploy(desired, None, Some(Arc::new(running)), false)
            .await
            .unwrap();
        let live = Instant::now();
        assert_eq!(
            deployed.strategy,
            DeployStrategy::Runtime,
            "{:?}",
            deployed.reason
        );
        retired.push((flips[flip - 1].port, live));
        if flip % 2 == 0 {
            retired.push((removables[flip / 2 - 1].port, live));
        }
        running = deployed;
        // Requests in flight across the next change.
        tokio::time::sleep(DELAY * 3).await;
    }
    tokio::time::sleep(DELAY * 4).await;
    stop.store(true, Ordering::Relaxed);
    let mut outcomes = Vec::new();
    while let Some(done) = clients.join_next().await {
        outcomes.extend(done.unwrap());
    }

    let failed: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| !matches!(o.result, Ok((200, _))))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}",
        failed.len(),
        outcomes.len()
    );
    assert!(outcomes.len() > 200, "only {} requests", outcomes.len());
    assert_eq!(haproxy.reloads().await, reloads_before, "no reload");

    let all: Vec<&SlowBackend> = flips.iter().chain(&removables).collect();
    for (old, live) in &retired {
        let backend = all.iter().find(|b| b.port == *old).unwrap();
        let late = backend.arrivals().iter().filter(|at| *at > live).count();
        assert_eq!(
            late, 0,
            "port {old} got {late} requests after the change was live"
        );
    }
    // The traffic really went to the latest address, and nearly every retired
    // address carried traffic up to its change (roundrobin over up to 11 servers
    // leaves an address used for a moment now and then).
    assert!(!flips[20].arrivals().is_empty());
    let used = all.iter().filter(|b| !b.arrivals().is_empty()).count();
    assert!(
        used >= all.len() * 3 / 4,
        "only {used} of {} backends used",
        all.len()
    );
}
