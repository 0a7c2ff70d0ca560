//! One runtime change (a server weight) deployed by the deployer component to a fleet
//! of 1 and 10 local HAProxy 2.6 processes (socket driver) and 1 and 50 in-process
//! Data Plane API v3 test servers answering after 1 ms (a network round trip), in
//! parallel (bounded). Target: 50 instances take at most 3× one instance.
//!
//! `fleet_runtime_latency`: the time until every healthy instance of 10 local ones
//! took a runtime change (its `InstanceDeployed`), with all 10 healthy and with one
//! of them hanging (its master socket accepts and never answers). Each instance has
//! its own owner, so the hanging one must not slow the others down. Target: p50
//! with one hanging ≤ 1.2× the all-healthy p50.
//!
//! `cargo bench -p hapwright-deployer --bench fleet`

#[allow(unused_imports)]
#[path = "../tests/support/mod.rs"]
mod support;

use hapwright_deployer::Driver;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use hapwright_deployer::client::dataplane::{DataplaneClient, Endpoint, Settings};
use hapwright_deployer::driver::SocketDriver;
use hapwright_deployer::driver::dataplane::DataplaneDriver;
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::config::Secret;
use hapwright_eventbus::model::RenderedConfig;
use hapwright_eventbus::testing::TestBus;
use hapwright_eventbus::{EventKind, EventPayload, RunningKernel, Subscription};
use support::dataplane::{DataplaneServer, Faults, PASSWORD, USER};
use support::{BlackHole, Haproxy, rendered};

/// One render for every instance: the frontend binds a unix socket relative to the
/// instance's config directory (HAProxy's working directory), so instances do not
/// compete for a port.
fn render(weight: u32) -> Arc<RenderedConfig> {
    rendered(
        &format!(
            "global\n    stats timeout 30s\n\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
frontend fe_main\n    bind unix@fe.sock\n    use_backend %[req.hdr(host),lower,map(maps/hosts.map,be_app)]\n    default_backend be_app\n\n\
backend be_app\n    balance roundrobin\n    server s1 127.0.0.1:9001 weight {weight}\n"
        ),
        &[("hosts.map", "a.test be_app\n")],
    )
}

struct Fleet {
    kernel: Option<RunningKernel>,
    publisher: hapwright_eventbus::Publisher,
    completed: Subscription,
    names: Vec<String>,
    _haproxies: Vec<Haproxy>,
    _servers: Vec<DataplaneServer>,
    _holes: Vec<BlackHole>,
}

impl Fleet {
    async fn start(sockets: usize, dataplanes: usize) -> Self {
        Self::start_with(sockets, dataplanes, 0).await
    }

    /// `hanging` of the socket instances stop answering on their master socket
    /// (killed, and a listener that accepts and never answers bound in its place).
    async fn start_with(sockets: usize, dataplanes: usize, hanging: usize) -> Self {
        let metrics = Metrics::unregistered().unwrap();
        let mut haproxies = Vec::new();
        let mut drivers = BTreeMap::new();
        let first = render(1);
        for i in 0..sockets {
            let haproxy = Haproxy::start(&format!("local-{i}"), &first, "boot").await;
            let driver = SocketDriver::new(haproxy.instance.clone(), None, metrics.clone());
            drivers.insert(
                haproxy.instance.name.clone(),
                Arc::new(driver) as Arc<dyn Driver>,
            );
            haproxies.push(haproxy);
        }
        let mut servers = Vec::new();
        let mut dataplane = Vec::new();
        for i in 0..dataplanes {
            let server = DataplaneServer::start("global\n").await;
            // Remote instances answer over a network: 1 ms per request, so the
            // numbers show the deployer's parallelism, not the test servers sharing
            // the benchmark's CPUs.
            server.faults(Faults {
                delay: Some(Duration::from_millis(1)),
                ..Faults::default()
            });
            let endpoint = Endpoint {
                url: server.url.clone(),
                username: USER.to_owned(),
                password: Secret::new(PASSWORD),
                ca_file: None,
            };
            dataplane.push(DataplaneDriver::new(
                format!("dp-{i}"),
                server.url.clone(),
                DataplaneClient::new(&endpoint, Settings::default()).unwrap(),
                metrics.clone(),
            ));
            servers.push(server);
        }
        let bus = TestBus::new();
        let completed = bus.subscribe(
            "bench",
            [EventKind::DeploymentCompleted, EventKind::InstanceDeployed],
        );
        let publisher = bus.publisher();
        let deployer = support::fleet_deployer(drivers, metrics).with_dataplane(dataplane);
        let names = deployer.instance_names();
        let mut fleet = Self {
            kernel: Some(bus.start_one(deployer)),
            publisher,
            completed,
            names,
            _haproxies: Vec::new(),
            _servers: servers,
            _holes: Vec::new(),
        };
        // The first deployment (a reload everywhere) is not measured.
        fleet.deploy(first).await;
        for haproxy in haproxies.iter_mut().take(hanging) {
            haproxy.kill();
            fleet._holes.push(BlackHole::bind(&haproxy.master_path()));
        }
        fleet._haproxies = haproxies;
        fleet
    }

    /// Schedules `config` for every instance of the fleet.
    fn schedule(&self, config: Arc<RenderedConfig>) {
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        self.publisher.publish(support::scheduled(&config, &names));
    }

    /// Deploys `config` and returns once `healthy` instances took it.
    async fn deploy_to_healthy(&mut self, config: Arc<RenderedConfig>, healthy: usize) {
        let hash = config.hash();
        self.schedule(config);
        let mut took = 0;
        while took < healthy {
            let event = self.completed.recv().await.expect("bus open");
            if let EventPayload::InstanceDeployed(done) = &event.payload
                && done.hash == hash
            {
                took += 1;
            }
        }
    }

    async fn deploy(&mut self, config: Arc<RenderedConfig>) {
        self.schedule(config);
        self.wait().await;
    }

    async fn wait(&mut self) {
        loop {
            let event = self.completed.recv().await.expect("bus open");
            if let EventPayload::DeploymentCompleted(done) = &event.payload {
                assert!(done.summary.failed.is_empty(), "{:?}", done.summary);
                return;
            }
        }
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("fleet_runtime_change");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    for (kind, sockets, dataplanes) in [
        ("socket", 1, 0),
        ("socket", 10, 0),
        ("dataplane_1ms_rtt", 0, 1),
        ("dataplane_1ms_rtt", 0, 50),
    ] {
        let mut fleet = rt.block_on(Fleet::start(sockets, dataplanes));
        let count = sockets + dataplanes;
        let mut weight = 1;
        group.bench_function(BenchmarkId::new(kind, count), |b| {
            b.iter(|| {
                weight = if weight == 1 { 2 } else { 1 };
                rt.block_on(fleet.deploy(render(weight)));
            });
        });
        if let Some(kernel) = fleet.kernel.take() {
            rt.block_on(kernel.shutdown(Duration::from_secs(5)));
        }
    }
    group.finish();

    let mut group = c.benchmark_group("fleet_runtime_latency");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(5));
    for (kind, hanging) in [("all_healthy", 0), ("one_hanging", 1)] {
        let mut fleet = rt.block_on(Fleet::start_with(10, 0, hanging));
        let mut weight = 1;
        group.bench_function(BenchmarkId::new(kind, 10), |b| {
            b.iter(|| {
                weight = if weight == 1 { 2 } else { 1 };
                rt.block_on(fleet.deploy_to_healthy(render(weight), 10 - hanging));
            });
        });
        if let Some(kernel) = fleet.kernel.take() {
            rt.block_on(kernel.shutdown(Duration::from_secs(5)));
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
