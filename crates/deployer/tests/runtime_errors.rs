//! Runtime failures are classified (refused, unreachable, protocol) and a command is
//! sent again only when it provably was not sent: fake sockets for the transport, a
//! real HAProxy for the reload fallback's reason.

mod support;

use hapwright_deployer::Driver;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hapwright_deployer::client::runtime::{RuntimeClient, RuntimeError, RuntimeFailure};
use hapwright_deployer::client::socket::{CliClient, ClientConfig, SocketAddress};
use hapwright_deployer::driver::SocketDriver;
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::model::{DeployStrategy, ReloadReason};
use support::{Backend, Haproxy, config, free_port, rendered, wait_for_body};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};

/// Quick retries so the tests stay fast; the policy, not the timing, is under test.
fn quick() -> ClientConfig {
    ClientConfig {
        connect_timeout: Duration::from_secs(1),
        io_timeout: Duration::from_secs(2),
        attempts: 4,
        min_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(40),
    }
}

/// A fake Unix socket peer: counts connections, reads each request to the client's
/// half-close, then answers `answer` (nothing when `None`) and closes.
fn fake_unix(
    path: &std::path::Path,
    answer: Option<&'static str>,
) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let listener = UnixListener::bind(path).unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            let mut request = Vec::new();
            let _ = stream.read_to_end(&mut request).await;
            if let Some(answer) = answer {
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        }
    });
    (count, task)
}

#[tokio::test]
async fn a_peer_that_closes_without_answering_is_a_protocol_error_and_not_resent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin.sock");
    let (connections, task) = fake_unix(&path, None);
    let client = RuntimeClient::from_cli(
        CliClient::new(SocketAddress::Unix(path)).with_config(quick()),
        false,
    );

    let error = client
        .set_server_addr("be", "s1", "127.0.0.1", Some(1))
        .await
        .unwrap_err();
    assert_eq!(error.class(), RuntimeFailure::Protocol, "{error}");
    assert!(
        matches!(error, RuntimeError::Unexpected { .. }),
        "{error:?}"
    );
    assert_eq!(connections.load(Ordering::SeqCst), 1, "sent once");
    task.abort();
}

#[tokio::test]
async fn a_reset_after_the_request_was_written_is_a_protocol_error_and_not_resent() {
    // TCP, so the peer can reset (linger 0) after reading the request.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let connections = Arc::new(AtomicUsize::new(0));
    let seen = connections.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 256];
            let _ = stream.read(&mut buf).await;
            stream.set_zero_linger().unwrap();
            drop(stream);
        }
    });
    let cli = CliClient::new(SocketAddress::Tcp(address)).with_config(quick());
    let client = RuntimeClient::from_cli(cli.clone(), false);

    let error = client
        .set_server_state("be", "s1", "maint")
        .await
        .unwrap_err();
    assert_eq!(error.class(), RuntimeFailure::Protocol, "{error:?}");
    assert!(matches!(error, RuntimeError::Exchange { .. }), "{error:?}");
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "a change is never resent"
    );

    // A read may be repeated: `query` tries again after the same failure.
    let error = cli.query("show servers conn be").await.unwrap_err();
    assert!(!error.nothing_sent(), "{error}");
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1 + quick().attempts,
        "a read is retried"
    );
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_missing_socket_is_unreachable_after_retries() {
    let dir = tempfile::tempdir().unwrap();
    let client = RuntimeClient::from_cli(
        CliClient::new(SocketAddress::Unix(dir.path().join("missing.sock"))).with_config(quick()),
        false,
    );
    let started = tokio::time::Instant::now();
    let error = client.set_server_weight("be", "s1", 3).await.unwrap_err();
    assert_eq!(error.class(), RuntimeFailure::Unreachable, "{error:?}");
    // Three backoff delays passed (10 + 20 + 40 ms of paused time): it was retried.
    assert!(
        started.elapsed() >= Duration::from_millis(70),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_socket_that_appears_during_the_retries_gets_the_command_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("late.sock");
    let client = RuntimeClient::from_cli(
        CliClient::new(SocketAddress::Unix(path.clone())).with_config(quick()),
        false,
    );
    let command = tokio::spawn(async move { client.set_server_state("be", "s1", "ready").await });
    // The first attempt (t = 0) found no socket; it appears before the last retry.
    tokio::time::sleep(Duration::from_millis(15)).await;
    let (connections, task) = fake_unix(&path, Some("\n"));
    command.await.unwrap().unwrap();
    assert_eq!(connections.load(Ordering::SeqCst), 1);
    task.abort();
}

#[tokio::test]
async fn refusals_are_haproxys_answer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin.sock");
    let (_, task) = fake_unix(&path, Some("No such server.\n"));
    let client = RuntimeClient::from_cli(
        CliClient::new(SocketAddress::Unix(path)).with_config(quick()),
        false,
    );
    let error = client
        .set_server_state("be", "nosuch", "maint")
        .await
        .unwrap_err();
    assert_eq!(error.class(), RuntimeFailure::Refused);
    assert_eq!(
        error.to_string(),
        "HAProxy refused `set server be/nosuch state maint`: No such server."
    );
    task.abort();
}

/// The reload fallback's reason says how the runtime change failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reload_fallback_names_refused_and_unreachable() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let port = free_port();
    let render = |weight: u32| {
        rendered(
            &config(
                port,
                &format!(
                    "backend be_app\n    balance roundrobin\n    server s1 127.0.0.1:{}\n    server s2 127.0.0.1:{} weight {weight}\n",
                    a.port, b.port
                ),
            ),
            &[("hosts.map", "")],
        )
    };
    let v1 = render(1);
    let haproxy = Haproxy::start("fallback", &v1, &v1.hash().short()).await;
    let driver = SocketDriver::new(
        haproxy.instance.clone(),
        None,
        Metrics::unregistered().unwrap(),
    );
    let running = driver.deploy(v1, None, None, false).await.unwrap();

    // Refused: the server is gone from the running HAProxy, so `set server` is refused.
    let rt = driver.runtime();
    rt.set_server_state("be_app", "s2", "maint").await.unwrap();
    rt.command("del server be_app/s2").await.unwrap();
    let before = haproxy.reloads().await;
    let refused = driver
        .deploy(render(2), None, Some(running.into()), false)
        .await
        .unwrap();
    assert_eq!(refused.strategy, DeployStrategy::Reload);
    assert_eq!(refused.reason.reload, Some(ReloadReason::RuntimeFailed));
    assert!(
        refused.reason.detail.starts_with(
            "runtime change refused by HAProxy (server be_app/s2 weight 2: HAProxy refused"
        ),
        "{}",
        refused.reason.detail
    );
    assert_eq!(haproxy.reloads().await, before + 1);

    // Unreachable: the runtime socket does not exist; the master still reloads.
    let mut instance = haproxy.instance.clone();
    instance.runtime = Some(SocketAddress::Unix(haproxy.path().join("no-such.sock")));
    let driver = SocketDriver::new(instance, None, Metrics::unregistered().unwrap());
    let unreachable = driver
        .deploy(render(3), None, Some(refused.into()), false)
        .await
        .unwrap();
    assert_eq!(unreachable.reason.reload, Some(ReloadReason::RuntimeFailed));
    assert!(
        unreachable.reason.detail.starts_with(
            "runtime API unreachable (server be_app/s2 weight 3: cannot reach the runtime API"
        ),
        "{}",
        unreachable.reason.detail
    );
    assert_eq!(haproxy.reloads().await, before + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separators_and_newlines_in_words_never_run_extra_admin_commands() {
    let a = Backend::start("a").await;
    let port = free_port();
    let v1 = rendered(
        &config(
            port,
            &format!(
                "backend be_app\n    balance roundrobin\n    server s1 127.0.0.1:{}\n",
                a.port
            ),
        ),
        &[("hosts.map", "")],
    );
    let haproxy = Haproxy::start("hostile", &v1, &v1.hash().short()).await;
    let driver = SocketDriver::new(
        haproxy.instance.clone(),
        None,
        Metrics::unregistered().unwrap(),
    );
    let rt = driver.runtime();
    let s1_state = || async {
        let state = rt.show_servers_state(Some("be_app")).await.unwrap();
        state
            .lines()
            .find(|l| l.split_whitespace().nth(3) == Some("s1"))
            .and_then(|l| l.split_whitespace().nth(6).map(str::to_owned))
            .unwrap()
    };
    let ready = s1_state().await;

    // A `;` inside a parameter word stays inside that word: HAProxy refuses the odd
    // parameter instead of running `set server be_app/s1 state maint` after it.
    let error = rt
        .add_server(
            "be_app",
            "s2",
            "127.0.0.1:9",
            &["check;set server be_app/s1 state maint".to_owned()],
        )
        .await
        .unwrap_err();
    assert_eq!(error.class(), RuntimeFailure::Refused, "{error}");
    assert_eq!(s1_state().await, ready, "s1 was not put in maintenance");

    // A newline never reaches the socket at all.
    let error = rt
        .set_server_weight("be_app", "s1\nset server be_app/s1 state maint", 5)
        .await
        .unwrap_err();
    assert!(
        matches!(error, RuntimeError::UnsafeCommand { .. }),
        "{error}"
    );
    assert_eq!(s1_state().await, ready);
    wait_for_body(port, "app.test", "a").await;
}
