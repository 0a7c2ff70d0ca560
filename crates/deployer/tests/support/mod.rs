//! Test harness for the socket driver: free loopback ports, temporary config
//! directories, `haproxy -W -S` processes killed and reaped on drop, tiny HTTP
//! backends answering their own name, and a raw HTTP/1.1 client.

#![allow(dead_code)]

pub mod dataplane;
pub mod random;
pub mod tls;
pub mod traffic;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::Driver;
use hapwright_deployer::client::master::MasterClient;
use hapwright_deployer::client::socket::{InstanceConfig, SocketAddress};
use hapwright_deployer::component::deployer::{self, Deployer};
use hapwright_deployer::driver::managed::{ManagedHaproxy, SupervisorConfig};
use hapwright_deployer::driver::{Deployed, DriverConfig, SocketDriver};
use hapwright_deployer::haproxy::files::ConfigDir;
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::model::{DeployStrategy, RenderedConfig, SourceMap};
use hapwright_eventbus::testing::TestBus;
use hapwright_eventbus::{
    DeploymentScheduled, EventKind, EventPayload, Subscription, ValidationCompleted,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

/// A loopback TCP port nobody listens on right now (the allocator every crate's
/// tests share).
#[allow(unused_imports)] // each test file uses a part of this module
pub use hapwright_eventbus::testing::free_port;

/// Deploys `desired` over `running` with `driver` and checks that it took
/// `strategy` (the reason shows when it did not); returns the deployment.
pub async fn deploy_by(
    driver: &impl Driver,
    desired: Arc<RenderedConfig>,
    running: Arc<Deployed>,
    strategy: DeployStrategy,
) -> Deployed {
    let deployed = driver
        .deploy(desired, None, Some(running), false)
        .await
        .unwrap();
    assert_eq!(deployed.strategy, strategy, "{:?}", deployed.reason);
    deployed
}

/// Backends, servers and map entries of a render, as the safety valve counts them.
pub fn counts(config: &RenderedConfig) -> (usize, usize, usize) {
    let model = hapwright_deployer::haproxy::config::parse(config.main()).unwrap();
    let footprint = hapwright_deployer::safety::Footprint::of(config, &model);
    (
        footprint.backends(),
        footprint.servers(),
        footprint.map_entries(),
    )
}

/// The deployer of the fleet benchmark over `drivers`: nothing deployed yet and a
/// 2 s deployment timeout, so a first attempt that waited out a lost reload fails.
pub fn fleet_deployer(drivers: BTreeMap<String, Arc<dyn Driver>>, metrics: Metrics) -> Deployer {
    Deployer::with_drivers(
        deployer::Config {
            deployment_timeout: Duration::from_secs(2),
            ..deployer::Config::default()
        },
        drivers,
        deployer::LastDeployedStore::new(),
        None,
        metrics,
    )
}

/// A supervisor for tests: quick restarts (50 ms first backoff) and up to 10 s for
/// HAProxy to be ready.
pub fn quick_supervisor() -> SupervisorConfig {
    SupervisorConfig {
        min_backoff: Duration::from_millis(50),
        ready_timeout: Duration::from_secs(10),
        ..SupervisorConfig::default()
    }
}

/// A subscription to every instance's deployment outcome (`InstanceDeployed`,
/// `InstanceDeploymentFailed`), made before `bus` starts.
pub fn deployments(bus: &TestBus) -> Subscription {
    bus.subscribe(
        "test",
        [
            EventKind::InstanceDeployed,
            EventKind::InstanceDeploymentFailed,
        ],
    )
}

/// The next deployment outcome on `events` ([`deployments`]), waiting at most
/// `wait`.
pub async fn next_outcome(events: &mut Subscription, wait: Duration) -> EventPayload {
    hapwright_eventbus::testing::next(events, wait)
        .await
        .payload
        .clone()
}

/// `config` scheduled for `instances` (not a drift check), as the scheduler
/// publishes it.
pub fn scheduled(config: &Arc<RenderedConfig>, instances: &[&str]) -> DeploymentScheduled {
    DeploymentScheduled {
        model: hapwright_eventbus::model::haproxy::parse_main(config)
            .expect("the test config parses"),
        config: config.clone(),
        instances: instances.iter().map(|s| (*s).to_owned()).collect(),
        drift_check: false,
    }
}

/// `config` validated, as the validator publishes it (phase 2 run).
pub fn validated(config: &Arc<RenderedConfig>) -> ValidationCompleted {
    ValidationCompleted {
        model: hapwright_eventbus::model::haproxy::parse_main(config)
            .expect("the test config parses"),
        config: config.clone(),
        duration: Duration::ZERO,
        warnings: Vec::new(),
        phase2_skipped: None,
    }
}

/// A render with the given main config and maps.
pub fn rendered(main: &str, maps: &[(&str, &str)]) -> Arc<RenderedConfig> {
    rendered_with(main, maps, &[])
}

/// A render with maps and certificates.
pub fn rendered_with(
    main: &str,
    maps: &[(&str, &str)],
    certs: &[(&str, &str)],
) -> Arc<RenderedConfig> {
    let collect = |items: &[(&str, &str)]| -> BTreeMap<String, Arc<str>> {
        items
            .iter()
            .map(|(name, content)| ((*name).to_owned(), Arc::from(*content)))
            .collect()
    };
    Arc::new(RenderedConfig::new(
        main,
        collect(maps),
        BTreeMap::new(),
        collect(certs),
        SourceMap::default(),
    ))
}

/// The dynamic-backends config: `be_app` (the map's default) at `app`, and one
/// `backend be_<name> from routes` per route (its server at the port given), routed
/// by `<name>.test` through `maps/hosts.map`.
pub fn routes_render<'a>(
    port: u16,
    app: u16,
    routes: impl IntoIterator<Item = (String, &'a u16)>,
) -> Arc<RenderedConfig> {
    let mut backends = String::new();
    let mut hosts = String::new();
    for (name, server) in routes {
        backends.push_str(&format!(
            "backend be_{name} from routes\n    server s1 127.0.0.1:{server}\n\n"
        ));
        hosts.push_str(&format!("{name}.test be_{name}\n"));
    }
    rendered(
        &format!(
            "global\n    stats timeout 30s\n\n\
defaults routes\n    mode http\n    balance roundrobin\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
frontend fe_main from routes\n    bind 127.0.0.1:{port}\n    use_backend %[req.hdr(host),lower,word(1,:),map(maps/hosts.map,be_app)]\n    default_backend be_app\n\n\
backend be_app from routes\n    server s1 127.0.0.1:{app}\n\n\
{backends}"
        ),
        &[("hosts.map", &hosts)],
    )
}

/// An HTTP backend on a free port answering `200 <name>` to every request.
pub struct Backend {
    /// Its port.
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Backend {
    /// Starts the backend.
    pub async fn start(name: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let name = name.to_owned();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let name = name.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    // Read the request head, then answer and close.
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                seen.extend_from_slice(&buf[..n]);
                                if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                                    break;
                                }
                            }
                        }
                    }
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
                        name.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Self { port, task }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `GET /` with the given Host header on a new connection; returns status and body.
pub async fn http_get(port: u16, host: &str) -> std::io::Result<(u16, String)> {
    let fut = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(
                format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await?;
        let mut out = Vec::new();
        stream.read_to_end(&mut out).await?;
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no status line in {text:?}")))?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    };
    timeout(Duration::from_secs(5), fut)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

/// Polls `GET /` until the body equals `expected` (bounded).
pub async fn wait_for_body(port: u16, host: &str, expected: &str) {
    let result = timeout(Duration::from_secs(10), async {
        loop {
            if let Ok((200, body)) = http_get(port, host).await
                && body == expected
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        result.is_ok(),
        "{host} on :{port} never answered {expected:?}"
    );
}

/// Bodies of `n` requests.
pub async fn bodies(port: u16, host: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let (status, body) = http_get(port, host).await.unwrap();
        out.push(format!("{status} {body}"));
    }
    out
}

/// A temporary config directory plus an unmanaged `haproxy -W -S` started on it.
pub struct Haproxy {
    /// The temporary directory (config dir and sockets).
    pub dir: tempfile::TempDir,
    /// The instance description for drivers.
    pub instance: InstanceConfig,
    child: Option<Child>,
}

impl Haproxy {
    /// A config dir without a running HAProxy (managed-mode tests).
    pub fn dir_only(name: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let instance = InstanceConfig::new(
            name,
            SocketAddress::Unix(dir.path().join("master.sock")),
            dir.path(),
        );
        Self {
            dir,
            instance,
            child: None,
        }
    }

    /// Writes `config` (with `marker`) into a new directory and starts HAProxy on it,
    /// waiting until its worker answers through the master CLI.
    pub async fn start(name: &str, config: &RenderedConfig, marker: &str) -> Self {
        let mut haproxy = Self::start_listed(name, config, marker).await;
        haproxy.wait_worker().await;
        haproxy
    }

    /// Like [`Haproxy::start`], but returns as soon as the master lists a worker in
    /// `show proc`: from HAProxy 3.1 on that worker may still be loading its config
    /// (`@1 …` reaches nobody yet), the state a controller finds right after HAProxy
    /// was started next to it.
    pub async fn start_listed(name: &str, config: &RenderedConfig, marker: &str) -> Self {
        let mut haproxy = Self::dir_only(name);
        let dir = ConfigDir::new(haproxy.dir.path());
        dir.write(config, marker, None).unwrap();
        // As hapwright leaves a directory it deployed: with its state record.
        dir.write_record(&hapwright_deployer::haproxy::files::DeployRecord::new(
            config, marker,
        ))
        .unwrap();
        let log = std::fs::File::create(haproxy.dir.path().join("haproxy.log")).unwrap();
        let child = Command::new("haproxy")
            .arg("-W")
            .arg("-S")
            .arg(haproxy.master_path())
            .arg("-f")
            .arg("haproxy.cfg")
            .current_dir(haproxy.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("haproxy runs");
        haproxy.child = Some(child);
        haproxy.wait_ready().await;
        haproxy
    }

    /// Kills HAProxy (SIGKILL to the master; the worker follows), keeping the
    /// directory.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The worker may outlive the master for a moment; wait until the master
        // socket no longer answers.
        let _ = std::fs::remove_file(self.master_path());
    }

    /// Starts HAProxy again on the files in the directory.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "still running");
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.dir.path().join("haproxy.log"))
            .unwrap();
        let child = Command::new("haproxy")
            .arg("-W")
            .arg("-S")
            .arg(self.master_path())
            .arg("-f")
            .arg("haproxy.cfg")
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("haproxy runs");
        self.child = Some(child);
        self.wait_ready().await;
        self.wait_worker().await;
    }

    /// The master socket path.
    pub fn master_path(&self) -> PathBuf {
        self.dir.path().join("master.sock")
    }

    /// The config directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A master CLI client.
    pub fn master(&self) -> MasterClient {
        MasterClient::new(SocketAddress::Unix(self.master_path()))
    }

    /// The config version the running worker was started with
    /// (`HAPWRIGHT_CONFIG_VERSION`).
    pub async fn config_version(&self) -> Option<String> {
        self.master()
            .worker_env(hapwright_deployer::haproxy::files::VERSION_VARIABLE)
            .await
            .unwrap()
    }

    /// Master reload counter.
    pub async fn reloads(&self) -> u64 {
        self.master().show_proc().await.unwrap().reloads
    }

    /// HAProxy's own output (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("haproxy.log")).unwrap_or_default()
    }

    /// Waits until the worker answers `@1 show info` through the master CLI.
    async fn wait_worker(&mut self) {
        self.wait_until("haproxy's worker never answered", async |master| {
            master.worker_ready().await
        })
        .await;
    }

    /// Waits until the master lists a worker in `show proc`.
    async fn wait_ready(&mut self) {
        self.wait_until("haproxy never became ready", async |master| {
            master
                .try_show_proc()
                .await
                .is_ok_and(|info| !info.workers.is_empty())
        })
        .await;
    }

    /// Asks `ready` of the master CLI until it holds (10 s at most), failing at once
    /// with the log if HAProxy exits, and with `failure` when the time is up.
    async fn wait_until(&mut self, failure: &str, ready: impl AsyncFn(&MasterClient) -> bool) {
        let master = self.master();
        let done = timeout(Duration::from_secs(10), async {
            while !ready(&master).await {
                if let Some(child) = self.child.as_mut()
                    && let Ok(Some(status)) = child.try_wait()
                {
                    panic!("haproxy exited ({status}): {}", self.log());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(done.is_ok(), "{failure}: {}", self.log());
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        for _ in 0..200 {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A config with one frontend on `port` routing by Host through `maps/hosts.map`
/// (default `be_app`), plus `extra` appended verbatim.
pub fn config(port: u16, backends: &str) -> String {
    format!(
        "global\n    stats timeout 30s\n\n\
defaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
frontend fe_main\n    bind 127.0.0.1:{port}\n    use_backend %[req.hdr(host),lower,word(1,:),map(maps/hosts.map,be_app)]\n    default_backend be_app\n\n\
{backends}"
    )
}

/// A socket driver for `haproxy` with `haproxy.dynamicBackends` on, draining removed
/// servers for at most `drain`.
pub fn dynamic_driver(haproxy: &Haproxy, drain: Duration) -> SocketDriver {
    SocketDriver::new(
        haproxy.instance.clone().with_dynamic_backends(true),
        None,
        hapwright_deployer::metrics::Metrics::unregistered().unwrap(),
    )
    .with_config(DriverConfig {
        drain_timeout: drain,
        ..DriverConfig::default()
    })
}

/// The HAProxy line of the `haproxy` on `PATH` (what the tests start), from
/// `haproxy -v`.
pub fn haproxy_line() -> hapwright_deployer::client::master::Version {
    let output = Command::new("haproxy")
        .arg("-v")
        .output()
        .expect("haproxy -v runs");
    let text = String::from_utf8_lossy(&output.stdout);
    hapwright_deployer::client::master::Version::parse(&text)
        .unwrap_or_else(|| panic!("no version in `haproxy -v`: {text}"))
}

/// Stops a managed HAProxy's supervisor when dropped, even when an assertion fails.
pub struct StopOnDrop(pub ManagedHaproxy);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let managed = self.0.clone();
        // Runs beside the test's runtime; `stop` kills and reaps the processes.
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(managed.stop());
        })
        .join();
    }
}

/// A unix socket that accepts connections and never answers: an instance that hangs.
pub struct BlackHole {
    _task: tokio_util::task::AbortOnDropHandle<()>,
}

impl BlackHole {
    /// Binds `path` (which must not exist) and holds every accepted connection.
    pub fn bind(path: &std::path::Path) -> Self {
        let listener = tokio::net::UnixListener::bind(path).unwrap();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        Self {
            _task: tokio_util::task::AbortOnDropHandle::new(task),
        }
    }
}

/// The sum of the samples of metric `name` whose labels include `labels`: counters
/// and gauges alike (0 when no series matches).
pub fn counter(registry: &prometheus::Registry, name: &str, labels: &[(&str, &str)]) -> u64 {
    series(registry, name, labels).into_iter().sum::<f64>() as u64
}

/// The value of every series of metric `name` whose labels include `labels`
/// (counters and gauges), in the registry's order.
pub fn series(registry: &prometheus::Registry, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    let mut values = Vec::new();
    for family in registry.gather() {
        if family.name() != name {
            continue;
        }
        let gauge = family.get_field_type() == prometheus::proto::MetricType::GAUGE;
        for metric in family.get_metric() {
            let matches = labels.iter().all(|(key, value)| {
                metric
                    .get_label()
                    .iter()
                    .any(|l| l.name() == *key && l.value() == *value)
            });
            if matches {
                values.push(if gauge {
                    metric.get_gauge().get_value()
                } else {
                    metric.get_counter().get_value()
                });
            }
        }
    }
    values
}

/// Validator settings for tests: the `haproxy` on PATH, scratch directories under
/// `scratch`, a 30 s bound, phase 2 by equivalence on.
pub fn validator_settings(scratch: &Path) -> hapwright_deployer::component::validator::Config {
    hapwright_deployer::component::validator::Config {
        binary: PathBuf::from("haproxy"),
        envs: Vec::new(),
        timeout: Duration::from_secs(30),
        scratch_root: Some(scratch.to_path_buf()),
        equivalence: true,
    }
}
