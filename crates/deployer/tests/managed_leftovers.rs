//! Managed HAProxy leftovers, with real processes: a controller killed with SIGKILL
//! (a child process of this test, running a supervisor) never leaves a second
//! master behind. With the parent-death signal the master dies with its controller;
//! without it (an older controller, or no `setpriv`), the next supervisor adopts
//! the master that answers on the instance's socket, and stops one that does not.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hapwright_deployer::client::socket::{InstanceConfig, SocketAddress};
use hapwright_deployer::driver::managed::{
    ManagedHaproxy, PIDFILE, ProcessState, SupervisorConfig, masters_of,
};
use support::{free_port, http_get};

const CHILD_DIR: &str = "HAPWRIGHT_TEST_CONTROLLER_DIR";
const CHILD_PDEATHSIG: &str = "HAPWRIGHT_TEST_CONTROLLER_PDEATHSIG";

fn supervisor(parent_death_signal: bool) -> ManagedHaproxy {
    ManagedHaproxy::with_config(
        "haproxy",
        SupervisorConfig {
            stop_grace: Duration::from_secs(2),
            parent_death_signal,
            ..support::quick_supervisor()
        },
    )
}

fn instance(dir: &Path) -> InstanceConfig {
    let mut instance =
        InstanceConfig::new("edge", SocketAddress::Unix(dir.join("master.sock")), dir);
    instance.managed = true;
    instance
}

/// A config whose frontend answers with the worker's PID.
fn write_config(dir: &Path, port: u16) {
    std::fs::write(
        dir.join("haproxy.cfg"),
        format!(
            "global\n    stats timeout 30s\n\n\
defaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
frontend fe\n    bind 127.0.0.1:{port}\n    http-request return status 200 content-type text/plain lf-string \"pid=%pid\"\n"
        ),
    )
    .unwrap();
}

fn config_file(dir: &Path) -> PathBuf {
    dir.join("haproxy.cfg")
}

/// Polls `check` every 20 ms until it holds or `bound` passes.
async fn eventually(bound: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        if check() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The "controller" run in a child process: starts a managed HAProxy in `$CHILD_DIR`,
/// prints its master PID and waits to be killed. Does nothing in a normal test run.
#[tokio::test]
#[ignore = "the body of a child process started by the other tests"]
async fn controller_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let pdeathsig = std::env::var(CHILD_PDEATHSIG).as_deref() == Ok("1");
    let managed = supervisor(pdeathsig);
    let instance = instance(Path::new(&dir));
    managed.ensure_started(&instance).await.unwrap();
    let Some(ProcessState::Running { pid }) = managed.state("edge").await else {
        panic!("not running");
    };
    println!("READY {pid}");
    std::future::pending::<()>().await;
}

/// Runs [`controller_child`] in a new process and returns it once its HAProxy runs,
/// with the master's PID.
fn start_controller(dir: &Path, pdeathsig: bool) -> (Child, u32) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "controller_child", "--ignored", "--nocapture"])
        .env(CHILD_DIR, dir)
        .env(CHILD_PDEATHSIG, if pdeathsig { "1" } else { "0" })
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(pid) = line.strip_prefix("READY ") {
            return (child, pid.trim().parse().unwrap());
        }
    }
    let status = child.wait().unwrap();
    panic!("the controller process ended ({status}) before its HAProxy ran");
}

/// Kills whatever HAProxy runs on `dir`'s config, for cleanup after a failure.
struct Sweep(PathBuf);

impl Drop for Sweep {
    fn drop(&mut self) {
        for pid in masters_of(&config_file(&self.0)) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_controller_takes_its_haproxy_along_with_the_parent_death_signal() {
    if which_setpriv().is_none() {
        eprintln!("setpriv is not installed; skipping");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweep(dir.path().to_owned());
    let port = free_port();
    write_config(dir.path(), port);
    let (mut controller, pid) = start_controller(dir.path(), true);
    assert_eq!(masters_of(&config_file(dir.path())), [pid]);
    assert_eq!(
        std::fs::read_to_string(dir.path().join(PIDFILE))
            .unwrap()
            .trim(),
        pid.to_string()
    );

    controller.kill().unwrap();
    controller.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || masters_of(&config_file(
            dir.path()
        ))
        .is_empty())
        .await,
        "the master outlived its controller"
    );
    assert!(
        eventually(Duration::from_secs(10), || http_get_blocking(port)
            .is_none())
        .await,
        "a worker still serves"
    );

    // The next controller starts exactly one new master.
    let managed = supervisor(true);
    managed.ensure_started(&instance(dir.path())).await.unwrap();
    let masters = masters_of(&config_file(dir.path()));
    assert_eq!(masters.len(), 1, "{masters:?}");
    assert_ne!(masters[0], pid);
    managed.stop().await;
    assert!(masters_of(&config_file(dir.path())).is_empty());
    assert!(
        !dir.path().join(PIDFILE).exists(),
        "the pidfile is removed on stop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_left_by_a_killed_controller_is_adopted_without_downtime() {
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweep(dir.path().to_owned());
    let port = free_port();
    write_config(dir.path(), port);
    // An older controller without the parent-death signal.
    let (mut controller, pid) = start_controller(dir.path(), false);
    controller.kill().unwrap();
    controller.wait().unwrap();
    let (status, body) = http_get(port, "x").await.unwrap();
    assert_eq!(status, 200, "the orphan still serves");
    let worker_body = body;

    let managed = supervisor(true);
    managed.ensure_started(&instance(dir.path())).await.unwrap();
    assert_eq!(
        managed.state("edge").await,
        Some(ProcessState::Running { pid }),
        "the orphaned master is adopted"
    );
    assert_eq!(
        masters_of(&config_file(dir.path())),
        [pid],
        "never two masters"
    );
    // Same worker: it was not restarted.
    assert_eq!(http_get(port, "x").await.unwrap(), (200, worker_body));
    assert!(
        managed
            .logs("edge")
            .await
            .unwrap()
            .since(0)
            .iter()
            .any(|line| line.contains(&format!("adopted the HAProxy master (pid {pid})")))
    );

    // The adopted master is supervised by its PID: when it dies, a new one starts.
    let mut states = managed.watch("edge").await.unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let restarted = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            states.changed().await.unwrap();
            if let ProcessState::Running { pid: new } = *states.borrow_and_update()
                && new != pid
            {
                return new;
            }
        }
    })
    .await
    .expect("a new master after the adopted one died");
    assert_eq!(masters_of(&config_file(dir.path())), [restarted]);

    managed.stop().await;
    assert!(
        eventually(Duration::from_secs(5), || masters_of(&config_file(
            dir.path()
        ))
        .is_empty())
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leftover_master_that_does_not_answer_is_stopped_before_a_new_one_starts() {
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweep(dir.path().to_owned());
    let port = free_port();
    write_config(dir.path(), port);
    // A master on this config whose master socket is elsewhere (and no pidfile):
    // found by the /proc scan, not adoptable.
    let mut stray = Command::new("haproxy")
        .arg("-W")
        .arg("-S")
        .arg(dir.path().join("other.sock"))
        .arg("-f")
        .arg(config_file(dir.path()))
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stray_pid = stray.id();
    assert!(
        eventually(Duration::from_secs(10), || masters_of(&config_file(
            dir.path()
        )) == [stray_pid])
        .await
    );
    assert!(
        eventually(Duration::from_secs(10), || http_get_blocking(port)
            .is_some())
        .await,
        "the stray serves"
    );

    let managed = supervisor(true);
    managed.ensure_started(&instance(dir.path())).await.unwrap();
    // The stray has exited (reaped here, as its parent) ...
    stray.wait().unwrap();
    // ... and exactly one master, the new one, serves.
    let masters = masters_of(&config_file(dir.path()));
    assert_eq!(masters.len(), 1, "{masters:?}");
    assert_ne!(masters[0], stray_pid);
    assert_eq!(
        std::fs::read_to_string(dir.path().join(PIDFILE))
            .unwrap()
            .trim(),
        masters[0].to_string()
    );
    managed.stop().await;
    assert!(masters_of(&config_file(dir.path())).is_empty());
}

fn which_setpriv() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join("setpriv"))
        .find(|path| path.is_file())
}

/// One plain HTTP request with a short timeout; `None` when nothing answers.
fn http_get_blocking(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    stream.read_to_string(&mut out).ok()?;
    (!out.is_empty()).then_some(out)
}
