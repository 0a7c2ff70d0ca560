//! End-to-end runtime deploy of one server change against a real HAProxy 2.6
//! (target ≤ 5 ms): plan, `set server addr` + `shutdown sessions` through the master
//! CLI, files rewritten atomically.
//!
//! `cargo bench -p hapwright-deployer --bench deploy`

use hapwright_deployer::Driver;
use std::cell::RefCell;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use hapwright_deployer::client::socket::{InstanceConfig, SocketAddress};
use hapwright_deployer::driver::{Deployed, SocketDriver};
use hapwright_deployer::haproxy::files::ConfigDir;
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::model::{DeployStrategy, RenderedConfig};

fn render(port: u16, server_port: u16) -> Arc<RenderedConfig> {
    let main = format!(
        "global\n    stats timeout 30s\n\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
frontend fe_main\n    bind 127.0.0.1:{port}\n    default_backend be_app\n\n\
backend be_app\n    balance roundrobin\n    server s1 127.0.0.1:{server_port}\n"
    );
    Arc::new(RenderedConfig::main_only(main))
}

/// Kills and reaps HAProxy when the benchmark ends.
struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let _ = self.0.wait();
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = hapwright_eventbus::testing::free_port();
    let first = render(port, 9001);
    ConfigDir::new(dir.path())
        .write(&first, &first.hash().short(), None)
        .unwrap();
    let master = dir.path().join("master.sock");
    let _guard = Guard(
        Command::new("haproxy")
            .arg("-W")
            .arg("-S")
            .arg(&master)
            .arg("-f")
            .arg("haproxy.cfg")
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("haproxy runs"),
    );
    let driver = SocketDriver::new(
        InstanceConfig::new("bench", SocketAddress::Unix(master), dir.path()),
        None,
        Metrics::unregistered().unwrap(),
    );
    let running: Arc<Deployed> = rt.block_on(async {
        for _ in 0..500 {
            if let Ok(deployed) = driver.deploy(first.clone(), None, None, false).await {
                return Arc::new(deployed);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("haproxy did not start");
    });
    let configs = [render(port, 9002), first.clone()];
    let state = RefCell::new((running, 0usize));
    c.bench_function("runtime_deploy_one_server_change", |b| {
        b.iter(|| {
            let (running, n) = state.borrow().clone();
            let desired = configs[n % 2].clone();
            let deployed = rt
                .block_on(driver.deploy(desired, None, Some(running), false))
                .unwrap();
            assert_eq!(deployed.strategy, DeployStrategy::Runtime);
            *state.borrow_mut() = (Arc::new(deployed), n + 1);
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
