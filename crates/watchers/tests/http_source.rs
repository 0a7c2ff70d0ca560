//! The `http` source against a real HTTP server on 127.0.0.1 (written here, so each
//! test controls status, headers, timing and body size), and over HTTPS with a test
//! CA made with `openssl`.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "../../../tests/support/certs.rs"]
mod certs;

use common::Harness;
use hapwright_eventbus::config::{ByteSize, Duration as ConfigDuration};
use hapwright_eventbus::model::ObjectKey;
use hapwright_eventbus::{EventPayload, HealthState};
use hapwright_watchers::config::{HeaderValue, HttpConfig, HttpFormat, WatchedResource};
use hapwright_watchers::http::{
    Fetch, FetchError, Fetched, Fetcher, HttpSource, HttpSourceMetrics,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

// === a scriptable HTTP/1.1 server ===

/// One answer of the test server.
#[derive(Clone, Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Wait this long before answering.
    delay: Duration,
    /// Send the body without `Content-Length` (read until close), so only the
    /// streaming limit can catch its size.
    chunked: bool,
}

impl Answer {
    fn ok(body: impl Into<Vec<u8>>) -> Self {
        Self {
            status: 200,
            headers: Vec::new(),
            body: body.into(),
            delay: Duration::ZERO,
            chunked: false,
        }
    }

    fn status(status: u16) -> Self {
        Self {
            status,
            ..Self::ok("")
        }
    }

    fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

type Script = Arc<dyn Fn(&str) -> Answer + Send + Sync>;

/// A server answering every request with `script(request head)`, recording the
/// request heads. Stops when dropped.
struct Server {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(script: impl Fn(&str) -> Answer + Send + Sync + 'static) -> Self {
        Self::start_with(script, None).await
    }

    async fn start_with(
        script: impl Fn(&str) -> Answer + Send + Sync + 'static,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let script: Script = Arc::new(script);
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (script, seen, tls) = (script.clone(), seen.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                serve(stream, script, seen).await;
                            }
                        }
                        None => serve(stream, script, seen).await,
                    }
                });
            }
        });
        Self {
            url: format!("http://{addr}/list"),
            requests,
            task,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

async fn serve(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    script: Script,
    seen: Arc<Mutex<Vec<String>>>,
) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    seen.lock().unwrap().push(head.clone());
    let answer = script(&head);
    tokio::time::sleep(answer.delay).await;
    let mut out = format!("HTTP/1.1 {} X\r\nConnection: close\r\n", answer.status);
    for (name, value) in &answer.headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    if !answer.chunked {
        out.push_str(&format!("Content-Length: {}\r\n", answer.body.len()));
    }
    out.push_str("\r\n");
    let _ = stream.write_all(out.as_bytes()).await;
    let _ = stream.write_all(&answer.body).await;
    let _ = stream.shutdown().await;
}

fn config(url: &str) -> HttpConfig {
    HttpConfig {
        format: HttpFormat::Lines,
        timeout: ConfigDuration::from_secs(5),
        ..HttpConfig::new(url)
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

// === fetches ===

#[tokio::test]
async fn etag_and_last_modified_round_trip_and_304_changes_nothing() {
    let server = Server::start(|head| {
        if header(head, "if-none-match") == Some("\"v1\"") {
            Answer::status(304)
        } else {
            Answer::ok("10.0.0.0/8\n")
                .header("ETag", "\"v1\"")
                .header("Last-Modified", "Wed, 25 Nov 2026 01:00:00 GMT")
        }
    })
    .await;
    let mut fetcher = Fetcher::new(&config(&server.url)).unwrap();
    let Fetched::Body { bytes, .. } = fetcher.fetch().await.unwrap() else {
        panic!("the first fetch has a body");
    };
    assert_eq!(bytes, b"10.0.0.0/8\n");
    assert_eq!(fetcher.fetch().await.unwrap(), Fetched::NotModified);
    let requests = server.requests();
    assert_eq!(header(&requests[0], "if-none-match"), None);
    assert_eq!(header(&requests[1], "if-none-match"), Some("\"v1\""));
    assert_eq!(
        header(&requests[1], "if-modified-since"),
        Some("Wed, 25 Nov 2026 01:00:00 GMT")
    );
}

#[tokio::test]
async fn the_same_body_again_is_reported_as_same() {
    let server = Server::start(|_| Answer::ok("a\nb\n")).await;
    let mut fetcher = Fetcher::new(&config(&server.url)).unwrap();
    assert!(matches!(
        fetcher.fetch().await.unwrap(),
        Fetched::Body { .. }
    ));
    assert_eq!(fetcher.fetch().await.unwrap(), Fetched::Same);
}

#[tokio::test]
async fn server_errors_and_refused_connections_fail() {
    let server = Server::start(|_| Answer::status(503)).await;
    let mut fetcher = Fetcher::new(&config(&server.url)).unwrap();
    let error = fetcher.fetch().await.unwrap_err();
    assert!(
        matches!(error, FetchError::StatusRejected(status) if status.as_u16() == 503),
        "{error:?}"
    );
    assert_eq!(error.chain(), "the server answered 503 Service Unavailable");

    // A port nobody listens on.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let mut fetcher = Fetcher::new(&config(&format!("http://{addr}/x"))).unwrap();
    let error = fetcher.fetch().await.unwrap_err();
    assert!(matches!(error, FetchError::RequestFailed(_)), "{error:?}");
    assert!(
        error.chain().to_lowercase().contains("connect"),
        "{}",
        error.chain()
    );
}

#[tokio::test]
async fn bodies_over_max_bytes_fail_with_and_without_a_length() {
    for chunked in [false, true] {
        let server = Server::start(move |_| Answer {
            chunked,
            ..Answer::ok(vec![b'x'; 64 * 1024])
        })
        .await;
        let mut fetcher = Fetcher::new(&HttpConfig {
            max_bytes: ByteSize(1024),
            ..config(&server.url)
        })
        .unwrap();
        let error = fetcher.fetch().await.unwrap_err();
        assert!(
            matches!(error, FetchError::BodyTooLarge(limit) if limit.bytes() == 1024),
            "chunked={chunked}: {error:?}"
        );
    }
}

#[tokio::test]
async fn a_slow_server_times_out() {
    let server = Server::start(|_| Answer {
        delay: Duration::from_secs(30),
        ..Answer::ok("late\n")
    })
    .await;
    let mut fetcher = Fetcher::new(&HttpConfig {
        timeout: ConfigDuration::from_millis(300),
        ..config(&server.url)
    })
    .unwrap();
    let error = tokio::time::timeout(Duration::from_secs(10), fetcher.fetch())
        .await
        .expect("the fetch ends by its own timeout")
        .unwrap_err();
    assert!(matches!(error, FetchError::TimedOut(_)), "{error:?}");
    assert_eq!(error.chain(), "no complete answer within 300ms (timeout)");
}

#[tokio::test]
async fn credentials_from_files_are_sent_and_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let token = "s3cr3t-t0ken-0f-the-http-source";
    std::fs::write(dir.path().join("token"), format!("Bearer {token}\n")).unwrap();
    let server = Server::start(|_| Answer::status(401)).await;
    let mut http = config(
        &server
            .url
            .replace("http://", "http://user:hunter2-password@"),
    );
    http.headers.insert(
        "Authorization".into(),
        HeaderValue::File {
            file: dir.path().join("token"),
        },
    );
    http.headers.insert(
        "X-Api-Key".into(),
        HeaderValue::Literal("literal-api-key-123".into()),
    );
    let mut fetcher = Fetcher::new(&http).unwrap();
    let error = fetcher.fetch().await.unwrap_err();
    let requests = server.requests();
    assert_eq!(
        header(&requests[0], "authorization"),
        Some(format!("Bearer {token}").as_str())
    );
    assert_eq!(
        header(&requests[0], "x-api-key"),
        Some("literal-api-key-123")
    );
    // Nothing that is shown carries a credential.
    let shown = [
        error.chain(),
        format!("{error:?}"),
        format!("{http:?}"),
        serde_json::to_string(&http).unwrap(),
        fetcher.display().to_owned(),
        format!("{fetcher:?}"),
    ];
    for text in &shown {
        for secret in [token, "hunter2-password", "literal-api-key-123"] {
            assert!(!text.contains(secret), "{secret} shown in {text}");
        }
    }
    // And the values are known to the redactor, which cleans logs and HTTP answers.
    let redactor = hapwright_eventbus::redact::global();
    for secret in [token, "hunter2-password", "literal-api-key-123"] {
        assert!(
            redactor.contains_secret(&format!("x {secret} y")),
            "{secret} not registered"
        );
    }
}

// === TLS with a private CA ===

fn acceptor(dir: &Path) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(dir.join("server.crt"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

#[tokio::test]
async fn https_with_a_private_ca_needs_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    // `ca.crt`, and `server.crt`/`server.key` for 127.0.0.1 signed by it.
    certs::leaf(dir.path(), "ca", "server");
    let server =
        Server::start_with(|_| Answer::ok("10.1.0.0/16\n"), Some(acceptor(dir.path()))).await;
    let url = server.url.replace("http://", "https://");

    let mut untrusted = Fetcher::new(&config(&url)).unwrap();
    let error = untrusted.fetch().await.unwrap_err();
    assert!(matches!(error, FetchError::RequestFailed(_)), "{error:?}");

    let mut trusted = Fetcher::new(&HttpConfig {
        ca_file: Some(dir.path().join("ca.crt")),
        ..config(&url)
    })
    .unwrap();
    let Fetched::Body { bytes, .. } = trusted.fetch().await.unwrap() else {
        panic!("a body over https");
    };
    assert_eq!(bytes, b"10.1.0.0/16\n");

    // A CA file that holds no certificate is its own error.
    std::fs::write(dir.path().join("empty.pem"), "nothing here\n").unwrap();
    let mut broken = Fetcher::new(&HttpConfig {
        ca_file: Some(dir.path().join("empty.pem")),
        ..config(&url)
    })
    .unwrap();
    let error = broken.fetch().await.unwrap_err();
    assert!(
        matches!(error, FetchError::CaFileInvalid { .. }),
        "{error:?}"
    );
}

// === the component ===

fn resource(http: HttpConfig) -> WatchedResource {
    let yaml = "http: { url: 'http://127.0.0.1:1/' }\nindexBy: [line]\n";
    let mut resource: WatchedResource =
        hapwright_watchers::yaml::parse_typed(yaml, "t.yaml", &Default::default()).unwrap();
    resource.http = Some(http);
    resource
}

impl Harness {
    /// Skips events until one matches, returning what `pick` made of it.
    async fn until<T>(&mut self, mut pick: impl FnMut(&EventPayload) -> Option<T>) -> T {
        loop {
            if let Some(found) = pick(&self.next().await) {
                return found;
            }
        }
    }
}

#[tokio::test]
async fn the_source_publishes_new_content_keeps_it_on_errors_and_recovers() {
    // Serves v1, then 503 twice, then v2.
    let calls = Arc::new(Mutex::new(0u32));
    let counter = calls.clone();
    let server = Server::start(move |_| {
        let mut calls = counter.lock().unwrap();
        *calls += 1;
        match *calls {
            1 => Answer::ok("10.0.0.0/8\n192.168.0.0/16\n"),
            2 | 3 => Answer::status(503),
            _ => Answer::ok("10.0.0.0/8\n172.16.0.0/12\n"),
        }
    })
    .await;
    let http = HttpConfig {
        interval: ConfigDuration::from_secs(1),
        ..config(&server.url)
    };
    let source = HttpSource::new("allow", &resource(http)).unwrap();
    let mut harness = Harness::source(source, Duration::from_secs(10));

    let first = harness
        .until(|event| match event {
            EventPayload::ResourceIndexUpdated(update) => Some(update.snapshot.clone()),
            _ => None,
        })
        .await;
    assert_eq!(first.len(), 2);
    assert!(first.unit().is_some(), "published as one unit");
    assert!(
        first
            .get_by_key(&ObjectKey::new("", "192.168.0.0/16"))
            .is_some()
    );
    harness
        .until(|event| matches!(event, EventPayload::ResourceSyncComplete(_)).then_some(()))
        .await;
    // The 503s: degraded, the content kept (no update in between).
    let reason = harness
        .until(|event| match event {
            EventPayload::ResourceIndexUpdated(_) => panic!("an error must not publish"),
            EventPayload::ComponentHealthChanged(changed)
                if changed.health.state == HealthState::Degraded =>
            {
                Some(changed.health.reason.clone().unwrap_or_default())
            }
            _ => None,
        })
        .await;
    assert!(
        reason.contains("keeping the content fetched before: the server answered 503"),
        "{reason}"
    );
    // Recovery after the backoff: v2, with one line replaced.
    let (second, change) = harness
        .until(|event| match event {
            EventPayload::ResourceIndexUpdated(update) => {
                Some((update.snapshot.clone(), update.change.clone()))
            }
            _ => None,
        })
        .await;
    assert_eq!(second.len(), 2);
    assert_eq!(change.added, [ObjectKey::new("", "172.16.0.0/12")]);
    assert_eq!(change.removed, [ObjectKey::new("", "192.168.0.0/16")]);
    assert!(
        change.modified.is_empty(),
        "unchanged lines keep their objects"
    );
    assert_ne!(first.unit(), second.unit());
    harness.stop().await;
}

/// Answers from a script, recording when each attempt was made.
struct Scripted {
    answers: std::collections::VecDeque<Result<Fetched, FetchError>>,
    calls: tokio::sync::mpsc::UnboundedSender<tokio::time::Instant>,
}

#[async_trait::async_trait]
impl Fetch for Scripted {
    async fn fetch(&mut self) -> Result<Fetched, FetchError> {
        let _ = self.calls.send(tokio::time::Instant::now());
        self.answers.pop_front().unwrap_or(Ok(Fetched::NotModified))
    }

    fn display(&self) -> &str {
        "scripted"
    }
}

#[tokio::test(start_paused = true)]
async fn errors_back_off_exponentially_up_to_the_interval_then_the_interval_resumes() {
    let unavailable = || {
        Err(FetchError::StatusRejected(
            reqwest::StatusCode::SERVICE_UNAVAILABLE,
        ))
    };
    let body = b"10.0.0.0/8\n".to_vec();
    let answers = vec![
        unavailable(),
        unavailable(),
        unavailable(),
        unavailable(),
        unavailable(),
        Ok(Fetched::Body {
            hash: hapwright_eventbus::model::ContentHash::of(&body),
            bytes: body,
        }),
        Ok(Fetched::NotModified),
        unavailable(),
    ];
    let (calls, mut called) = tokio::sync::mpsc::unbounded_channel();
    let http = HttpConfig {
        interval: ConfigDuration::from_secs(10),
        ..config("http://127.0.0.1:1/")
    };
    let registry = prometheus::Registry::new();
    let metrics = HttpSourceMetrics::register(&registry).unwrap();
    let source = HttpSource::new("allow", &resource(http))
        .unwrap()
        .with_metrics(metrics)
        .with_fetch(Box::new(Scripted {
            answers: answers.into(),
            calls,
        }));
    let mut harness = Harness::source(source, Duration::from_secs(600));
    let mut at = Vec::new();
    for _ in 0..9 {
        at.push(called.recv().await.expect("the source fetches"));
    }
    let gaps: Vec<u64> = at.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
    // Five failures: 1, 2, 4, 8, then the interval bounds the wait (10). After the
    // success the interval (10); a 304 keeps it (10); a new failure starts the
    // backoff over (1).
    assert_eq!(gaps, [1, 2, 4, 8, 10, 10, 10, 1]);
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    let metric = |name: &str, labels: &[(&str, &str)]| {
        text.lines()
            .filter(|line| line.starts_with(&format!("{name}{{")))
            .find(|line| {
                labels
                    .iter()
                    .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
            })
            .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let fetches = "hapwright_http_source_fetches_total";
    assert_eq!(metric(fetches, &[("result", "failure")]), Some(6.0));
    assert_eq!(metric(fetches, &[("result", "success")]), Some(1.0));
    // Nothing validates here: the content stays pending.
    let state = "hapwright_http_source_state";
    assert_eq!(metric(state, &[("state", "pending")]), Some(1.0));
    assert_eq!(metric(state, &[("state", "accepted")]), Some(0.0));
    // No sync before the first success; an update and a sync after it.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match harness.next().await {
            EventPayload::ResourceIndexUpdated(update) => {
                seen.push(format!("update {}", update.snapshot.len()))
            }
            EventPayload::ResourceSyncComplete(_) => seen.push("sync".to_owned()),
            _ => {}
        }
    }
    assert_eq!(seen, ["update 1", "sync"]);
    harness.stop().await;
}
