//! A runtime deployment that outlives `deploymentTimeout`, against a real HAProxy: a
//! runtime socket that holds the map update until the test lets it through, while a
//! newer config arrives. The change in flight is not cut half-way; the next attempt
//! waits for it and plans from what it deployed, so the newer config goes out at
//! runtime too, with no reload and every map entry exactly once.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hapwright_deployer::Driver;
use hapwright_deployer::client::runtime::RuntimeClient;
use hapwright_deployer::client::socket::SocketAddress;
use hapwright_deployer::component::deployer::{Config, Deployer, LastDeployedStore};
use hapwright_deployer::driver::SocketDriver;
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::EventPayload;
use hapwright_eventbus::model::{DeployStrategy, RenderedConfig};
use hapwright_eventbus::testing::TestBus;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::time::timeout;

use support::{Haproxy, free_port, rendered};

/// A proxy in front of a runtime socket that holds the first connection carrying an
/// `add map` until [`Gate::release`].
struct Gate {
    held: Arc<Semaphore>,
    reached: Arc<tokio::sync::Notify>,
    _task: tokio_util::task::AbortOnDropHandle<()>,
}

impl Gate {
    fn start(listen: &Path, upstream: &Path) -> Self {
        let listener = UnixListener::bind(listen).unwrap();
        let upstream = upstream.to_path_buf();
        let held = Arc::new(Semaphore::new(0));
        let reached = Arc::new(tokio::sync::Notify::new());
        let used = Arc::new(AtomicBool::new(false));
        let (task_held, task_reached) = (held.clone(), reached.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let (upstream, held, reached, used) = (
                    upstream.clone(),
                    task_held.clone(),
                    task_reached.clone(),
                    used.clone(),
                );
                tokio::spawn(async move {
                    let mut first = vec![0u8; 64 * 1024];
                    let Ok(n) = client.read(&mut first).await else {
                        return;
                    };
                    first.truncate(n);
                    let update = String::from_utf8_lossy(&first).contains("add map");
                    if update && !used.swap(true, Ordering::SeqCst) {
                        reached.notify_one();
                        let _permit = held.acquire().await.unwrap();
                    }
                    let Ok(mut server) = UnixStream::connect(&upstream).await else {
                        return;
                    };
                    if server.write_all(&first).await.is_err() {
                        return;
                    }
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
        Self {
            held,
            reached,
            _task: tokio_util::task::AbortOnDropHandle::new(task),
        }
    }

    fn release(&self) {
        self.held.add_permits(1);
    }
}

fn version(port: u16, weight: u32, hosts: &str) -> Arc<RenderedConfig> {
    let main = support::config(
        port,
        &format!("backend be_app\n    server s1 127.0.0.1:9 weight {weight}\n"),
    )
    .replacen(
        "global\n",
        "global\n    stats socket unix@runtime.sock level admin\n",
        1,
    );
    rendered(&main, &[("hosts.map", hosts)])
}

#[tokio::test]
async fn a_runtime_change_past_the_deadline_finishes_and_the_next_goes_out_at_runtime() {
    let port = free_port();
    let v1 = version(port, 10, "a.test be_app\n");
    let v2 = version(port, 20, "a.test be_app\nb.test be_app\n");
    let v3 = version(port, 20, "a.test be_app\nb.test be_app\nc.test be_app\n");
    let haproxy = Haproxy::start("deadline", &v1, &v1.hash().short()).await;
    let runtime = haproxy.path().join("runtime.sock");
    let proxy = haproxy.path().join("gate.sock");
    let gate = Gate::start(&proxy, &runtime);

    let mut instance = haproxy.instance.clone();
    instance.runtime = Some(SocketAddress::Unix(proxy));
    let metrics = Metrics::unregistered().unwrap();
    let driver: Arc<dyn Driver> = Arc::new(SocketDriver::new(instance, None, metrics.clone()));
    let bus = TestBus::new();
    let mut events = support::deployments(&bus);
    let publisher = bus.publisher();
    let kernel = bus.start(|kernel| {
        kernel.register(Deployer::with_drivers(
            Config {
                deployment_timeout: Duration::from_secs(1),
                ..Config::default()
            },
            BTreeMap::from([("deadline".to_owned(), driver)]),
            LastDeployedStore::new(),
            None,
            metrics,
        ));
    });
    let mut next = async || support::next_outcome(&mut events, Duration::from_secs(30)).await;

    // v2: the weight at once, then the map update, held by the gate past the 1 s
    // deadline.
    publisher.publish(support::scheduled(&v2, &["deadline"]));
    timeout(Duration::from_secs(30), gate.reached.notified())
        .await
        .expect("the map update reaches the runtime socket");
    let EventPayload::InstanceDeploymentFailed(cut) = next().await else {
        panic!("the attempt past its deadline is reported");
    };
    assert_eq!(cut.hash, v2.hash());
    assert!(cut.error.message.contains("it goes on"), "{cut:?}");

    // v3 arrives while v2's change is still held; then the update goes through.
    publisher.publish(support::scheduled(&v3, &["deadline"]));
    gate.release();
    let mut deployed = Vec::new();
    while deployed.last().map(|(hash, _)| *hash) != Some(v3.hash()) {
        match next().await {
            EventPayload::InstanceDeployed(d) => deployed.push((d.hash, d.strategy)),
            EventPayload::InstanceDeploymentFailed(f) => {
                assert!(f.error.message.contains("it goes on"), "{f:?}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        deployed,
        [
            (v2.hash(), DeployStrategy::Runtime),
            (v3.hash(), DeployStrategy::Runtime)
        ]
    );
    assert_eq!(haproxy.reloads().await, 0, "no reload");

    // HAProxy holds every entry once (nothing was added twice) and the new weight.
    let direct = RuntimeClient::direct(SocketAddress::Unix(runtime));
    let map = direct.query("show map maps/hosts.map").await.unwrap();
    let mut keys: Vec<&str> = map
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, ["a.test", "b.test", "c.test"], "{map}");
    let weight = direct.query("get weight be_app/s1").await.unwrap();
    assert!(weight.starts_with("20 "), "{weight}");
    // And the files on disk are v3's.
    assert_eq!(
        std::fs::read_to_string(haproxy.path().join("maps/hosts.map")).unwrap(),
        "a.test be_app\nb.test be_app\nc.test be_app\n"
    );
    kernel.shutdown(Duration::from_secs(5)).await;
}
