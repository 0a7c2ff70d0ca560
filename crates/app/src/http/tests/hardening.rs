//! What a hostile or broken client can do to the listeners: idle and trickling
//! connections, clients that stop reading, connection and request floods, DNS
//! rebinding, cross-origin reload requests and reload spam.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::*;

/// Small timeouts so the tests see them fire; long ones where a test must not.
fn limits(max_connections: usize) -> Limits {
    Limits {
        header_read_timeout: Duration::from_millis(400),
        idle_timeout: Duration::from_millis(400),
        write_timeout: Duration::from_secs(60),
        max_connections,
        max_concurrent_requests: 32,
        shutdown_timeout: Duration::from_millis(300),
    }
}

/// Puts a rendered config of `size` bytes into the store, so `/debug/rendered` is a
/// response far larger than the socket buffers.
fn large_render(store: &StatusStore, size: usize) {
    let config = std::sync::Arc::new(
        hapwright_eventbus::model::RenderedConfig::builder("x".repeat(size)).build(),
    );
    store.apply(
        &event(
            1,
            None,
            TemplateRendered {
                config,
                duration: Duration::ZERO,
                render: Default::default(),
            },
        ),
        None,
    );
}

/// A client that asks for a large response and never reads it: its receive buffer
/// is tiny, so the server's writes stall.
async fn stuck_reader(addr: SocketAddr, path: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .unwrap();
    stream
}

/// Reads until the server closes the connection (EOF or reset), within `within`;
/// the bytes read.
async fn closed_by_server(stream: &mut TcpStream, within: Duration) -> usize {
    let mut total = 0;
    let mut buf = vec![0u8; 64 * 1024];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the server kept the connection open ({total} bytes read)"))
}

/// Raises this process's open-file limit towards its hard limit and returns how many
/// idle connections the test can open (both ends live in this process), at most 1,000.
fn idle_connection_budget() -> usize {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if let Some(hard) = limit.maximum {
        let wanted = hard.min(8192);
        if limit.current.is_some_and(|soft| soft < wanted) {
            limit.current = Some(wanted);
            let _ = setrlimit(Resource::Nofile, limit);
        }
    }
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    // Two descriptors per connection, and room for the runtime and the test.
    usize::try_from(soft.saturating_sub(256) / 2).map_or(1000, |n| n.min(1000))
}

#[tokio::test]
async fn idle_connections_and_a_stuck_reader_neither_block_healthz_nor_shutdown() {
    let connections = idle_connection_budget();
    assert!(
        connections >= 200,
        "too few file descriptors for the test: {connections}"
    );
    let h = Harness::start_with(limits(connections + 100)).await;
    let addr = h.server.local_addr();
    large_render(&h.store, 32 << 20);

    let mut idle = Vec::new();
    for _ in 0..connections {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let mut stuck = stuck_reader(addr, "/debug/rendered").await;
    // A kept-alive connection that served one request and then goes quiet.
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 256];
    let n = kept.read(&mut first).await.unwrap();
    assert!(
        String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&first[..n])
    );

    // A fresh connection is still answered.
    assert_eq!(h.get("/healthz").await, (200, "ok\n".into()));

    // Connections without a request, and the kept-alive one, are closed by the
    // server once their timeout passes.
    let closes = idle
        .iter_mut()
        .map(|stream| closed_by_server(stream, Duration::from_secs(20)));
    let read = futures::future::join_all(closes).await;
    assert!(read.iter().all(|&n| n == 0), "idle connections got data");
    closed_by_server(&mut kept, Duration::from_secs(20)).await;
    assert_eq!(h.get("/healthz").await, (200, "ok\n".into()));

    // The stuck reader's response cannot finish; shutdown gives it the deadline
    // (300 ms) and then drops it, long before its write timeout (60 s).
    tokio::time::timeout(Duration::from_secs(20), h.server.shutdown())
        .await
        .expect("shutdown waited for a client that never reads");
    let received = closed_by_server(&mut stuck, Duration::from_secs(20)).await;
    assert!(
        received < 32 << 20,
        "the stuck client got the whole response ({received} bytes)"
    );
}

#[tokio::test]
async fn a_client_that_stops_reading_is_dropped_after_the_write_timeout() {
    // One connection slot: the fresh request below is served only once the stuck
    // client's connection is gone.
    let h = Harness::start_with(Limits {
        header_read_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
        write_timeout: Duration::from_millis(300),
        max_connections: 1,
        ..limits(1)
    })
    .await;
    large_render(&h.store, 32 << 20);
    let mut stuck = stuck_reader(h.server.local_addr(), "/debug/rendered").await;
    assert_eq!(h.get("/healthz").await, (200, "ok\n".into()));
    let received = closed_by_server(&mut stuck, Duration::from_secs(20)).await;
    assert!(
        received < 32 << 20,
        "{received} bytes: the response completed"
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn connections_over_the_limit_wait_until_a_slot_frees() {
    let h = Harness::start_with(Limits {
        header_read_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
        ..limits(3)
    })
    .await;
    let addr = h.server.local_addr();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    // A fourth client is not served while three connections hold every slot...
    let waiting = tokio::spawn(raw_request(addr, "GET", "/healthz", "localhost", ""));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "served over the connection limit");
    // ...and is served as soon as one of them closes.
    held.pop();
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting client was never served")
        .unwrap();
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    drop(held);
    h.server.shutdown().await;
}

#[tokio::test]
async fn requests_over_the_concurrency_limit_are_shed_with_503() {
    let entered = Arc::new(tokio::sync::Semaphore::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    let app = {
        let (entered, release) = (entered.clone(), release.clone());
        Router::new()
            .route(
                "/slow",
                get(move || {
                    let (entered, release) = (entered.clone(), release.clone());
                    async move {
                        let released = release.notified();
                        entered.add_permits(1);
                        released.await;
                        "done"
                    }
                }),
            )
            .route("/fast", get(|| async { "fast" }))
    };
    let server = HttpServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        app,
        Limits {
            max_concurrent_requests: 2,
            ..Limits::default()
        },
    )
    .await
    .unwrap();
    let addr = server.local_addr();
    let slow: Vec<_> = (0..2)
        .map(|_| tokio::spawn(raw_request(addr, "GET", "/slow", "localhost", "")))
        .collect();
    let _both = tokio::time::timeout(Duration::from_secs(10), entered.acquire_many(2))
        .await
        .expect("the slow handlers never started");
    let (status, body) = raw_request(addr, "GET", "/fast", "localhost", "").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("too many concurrent requests"), "{body}");
    release.notify_waiters();
    for request in slow {
        assert_eq!(request.await.unwrap().0, 200);
    }
    assert_eq!(
        raw_request(addr, "GET", "/fast", "localhost", "").await.0,
        200
    );
    server.shutdown().await;
}

#[tokio::test]
async fn debug_status_and_reload_refuse_unexpected_hosts() {
    let mut h = Harness::start().await;
    let port = h.server.local_addr().port();
    for path in ["/debug/config", "/debug/components", "/"] {
        for host in [
            "attacker.example",
            "attacker.example:9400",
            "localhost.attacker.example",
            "",
        ] {
            let (status, body) = h.raw("GET", path, host, "").await;
            assert_eq!(status, 403, "{path} with Host {host:?}: {body}");
            assert!(body.contains("is not allowed"), "{body}");
        }
    }
    let (status, body) = h
        .raw(
            "POST",
            "/-/reload",
            "attacker.example",
            "X-Hapwright-Reload: 1\r\n",
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        h.reloads.try_recv().is_err(),
        "a rebinding request reached the reload loop"
    );

    for host in [
        "localhost".to_owned(),
        format!("localhost:{port}"),
        format!("LOCALHOST:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "[::1]".to_owned(),
    ] {
        assert_eq!(
            h.raw("GET", "/debug/config", &host, "").await.0,
            200,
            "{host}"
        );
    }
    // Probes and scrapes come by pod IP or service name: any Host.
    assert_eq!(h.raw("GET", "/healthz", "10.1.2.3:9400", "").await.0, 200);
    assert_eq!(
        h.raw("GET", "/metrics", "attacker.example", "").await.0,
        200
    );
    assert_eq!(h.raw("GET", "/readyz", "attacker.example", "").await.0, 503);

    // Names the operator allows.
    assert_eq!(
        h.raw("GET", "/debug/config", "hapwright.internal", "")
            .await
            .0,
        403
    );
    h.set_policy(|p| p.allowed_hosts = vec!["hapwright.internal".into()]);
    assert_eq!(
        h.raw("GET", "/debug/config", "Hapwright.Internal:8080", "")
            .await
            .0,
        200
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn a_simple_cross_origin_post_cannot_reload() {
    let mut h = Harness::start().await;
    // What a form on any web page can send: no custom header.
    for headers in [
        "",
        "Content-Type: application/x-www-form-urlencoded\r\n",
        "X-Hapwright-Reload: \r\n",
    ] {
        let (status, body) = h.raw("POST", "/-/reload", "localhost", headers).await;
        assert_eq!(status, 403, "{headers:?}: {body}");
        assert!(body.contains("X-Hapwright-Reload"), "{body}");
    }
    // The CORS preflight a page would need first is not approved.
    let (status, _) = h.raw("OPTIONS", "/-/reload", "localhost", "").await;
    assert_eq!(status, 405);
    assert!(
        h.reloads.try_recv().is_err(),
        "a simple POST reached the reload loop"
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn reload_spam_passes_one_request_per_window_and_reports_the_outcome() {
    let mut h = Harness::start().await;
    h.set_policy(|p| p.reload_interval = Duration::from_secs(3600));
    let mut reloads = std::mem::replace(&mut h.reloads, ReloadHandle::channel().1);
    let answered = tokio::spawn(async move {
        let mut passed = 0;
        while let Some(request) = reloads.recv().await {
            passed += 1;
            request.answer(ReloadOutcome::Unchanged);
        }
        passed
    });
    let addr = h.server.local_addr();
    let spam: Vec<_> = (0..20)
        .map(|_| {
            tokio::spawn(raw_request(
                addr,
                "POST",
                "/-/reload",
                "localhost",
                "X-Hapwright-Reload: 1\r\n",
            ))
        })
        .collect();
    let mut statuses = Vec::new();
    for request in spam {
        let (status, body) = request.await.unwrap();
        match status {
            200 => assert!(body.contains(r#""status":"unchanged""#), "{body}"),
            429 => assert!(body.contains(r#""status":"rate-limited""#), "{body}"),
            other => panic!("{other}: {body}"),
        }
        statuses.push(status);
    }
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 19);
    let limited = h
        .client
        .post(h.url("/-/reload"))
        .header("X-Hapwright-Reload", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(limited.status().as_u16(), 429);
    let retry: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((3500..=3600).contains(&retry), "Retry-After {retry}");

    // Once the window has passed, the next request goes through again.
    h.set_policy(|p| p.reload_interval = Duration::from_millis(50));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = h
            .raw(
                "POST",
                "/-/reload",
                "localhost",
                "X-Hapwright-Reload: 1\r\n",
            )
            .await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 429, "{body}");
        assert!(tokio::time::Instant::now() < deadline, "still rate-limited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.server.shutdown().await;
    drop(h.reloads);
    // The harness's handle (in the router state) is gone with the server.
    assert_eq!(answered.await.unwrap(), 2);
}

#[tokio::test]
async fn reload_outcomes_are_reported() {
    let mut h = Harness::start().await;
    h.set_policy(|p| p.reload_interval = Duration::ZERO);
    let mut reloads = std::mem::replace(&mut h.reloads, ReloadHandle::channel().1);
    let outcomes = [
        ReloadOutcome::Accepted,
        ReloadOutcome::Rejected(vec![
            "hapwright.yaml:3:5: controller.debounce: invalid".into(),
        ]),
    ];
    let answering = tokio::spawn(async move {
        for outcome in outcomes {
            reloads.recv().await.unwrap().answer(outcome);
        }
    });
    let header = "X-Hapwright-Reload: 1\r\n";
    let (status, body) = h.raw("POST", "/-/reload", "localhost", header).await;
    assert_eq!(status, 202, "{body}");
    assert!(body.contains(r#""status":"accepted""#), "{body}");
    let (status, body) = h.raw("POST", "/-/reload", "localhost", header).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("controller.debounce: invalid"), "{body}");
    answering.await.unwrap();
    h.server.shutdown().await;
}

#[tokio::test]
async fn lifecycle_api_off_removes_the_reload_endpoint() {
    let mut h = Harness::start().await;
    h.set_policy(|p| p.lifecycle_api = false);
    let (status, body) = h
        .raw(
            "POST",
            "/-/reload",
            "localhost",
            "X-Hapwright-Reload: 1\r\n",
        )
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("lifecycleApi: false"), "{body}");
    assert!(h.reloads.try_recv().is_err());
    h.server.shutdown().await;
}

#[test]
fn host_names_are_compared_without_port_case_or_trailing_dot() {
    let policy = Policy {
        allowed_hosts: vec!["ops.example".into()],
        ..Policy::default()
    };
    for ok in [
        "localhost",
        "localhost.",
        "127.0.0.1:1",
        "[::1]:9400",
        "OPS.example:80",
    ] {
        assert!(policy.allows_host(ok), "{ok}");
    }
    for refused in [
        "",
        "attacker.example",
        "127.0.0.2",
        "localhost:abc",
        "[::2]",
        "ops.example.attacker.example",
        "0.0.0.0",
    ] {
        assert!(!policy.allows_host(refused), "{refused}");
    }
}
