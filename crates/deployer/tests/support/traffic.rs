//! Real traffic for lossless-change tests: slow HTTP/1.1 backends that answer their
//! own port after a delay and record when each request arrived, and a client that
//! sends requests on a new connection each time or over one keep-alive connection.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::timeout;

/// An HTTP/1.1 backend with keep-alive that answers every request after `delay` with
/// its own port as the body, recording each request's arrival time.
pub struct SlowBackend {
    /// Its port.
    pub port: u16,
    arrivals: Arc<Mutex<Vec<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl SlowBackend {
    /// Starts the backend on a free loopback port.
    pub async fn start(delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let seen = arrivals.clone();
        let task = tokio::spawn(async move {
            // Dropping the set (when this task is aborted) aborts every connection.
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                connections.spawn(serve(stream, port, delay, seen.clone()));
                while connections.try_join_next().is_some() {}
            }
        });
        Self {
            port,
            arrivals,
            task,
        }
    }

    /// Arrival times of the requests so far.
    pub fn arrivals(&self) -> Vec<Instant> {
        self.arrivals.lock().unwrap().clone()
    }
}

impl Drop for SlowBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(stream: TcpStream, port: u16, delay: Duration, seen: Arc<Mutex<Vec<Instant>>>) {
    let mut stream = BufReader::new(stream);
    let body = port.to_string();
    loop {
        let mut close = false;
        let mut line = String::new();
        // Request head: lines up to the empty one.
        loop {
            line.clear();
            match stream.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line.to_ascii_lowercase().starts_with("connection: close") {
                close = true;
            }
            if line == "\r\n" {
                break;
            }
        }
        seen.lock().unwrap().push(Instant::now());
        tokio::time::sleep(delay).await;
        let connection = if close { "close" } else { "keep-alive" };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: {connection}\r\n\r\n{body}",
            body.len()
        );
        if stream
            .get_mut()
            .write_all(response.as_bytes())
            .await
            .is_err()
            || close
        {
            return;
        }
    }
}

/// One request's outcome, as the client saw it.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// When the request was sent.
    pub started: Instant,
    /// `Ok((status, body))`, or what went wrong.
    pub result: Result<(u16, String), String>,
}

/// An HTTP/1.1 client connection to `port`, kept alive between requests when
/// `keep_alive`, else a new connection per request.
pub struct Client {
    port: u16,
    keep_alive: bool,
    host: String,
    stream: Option<BufReader<TcpStream>>,
}

impl Client {
    /// A client for `port`.
    pub fn new(port: u16, keep_alive: bool) -> Self {
        Self {
            port,
            keep_alive,
            host: "app.test".to_owned(),
            stream: None,
        }
    }

    /// The Host header of the next requests (`app.test` by default).
    pub fn set_host(&mut self, host: &str) {
        host.clone_into(&mut self.host);
    }

    /// Sends `GET /` and reads the answer (bounded by 5 s).
    pub async fn get(&mut self) -> Outcome {
        let started = Instant::now();
        let result = match timeout(Duration::from_secs(5), self.exchange()).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("no answer within 5 s".to_owned()),
        };
        if result.is_err() || !self.keep_alive {
            self.stream = None;
        }
        Outcome { started, result }
    }

    async fn exchange(&mut self) -> std::io::Result<(u16, String)> {
        if self.stream.is_none() {
            let stream = TcpStream::connect(("127.0.0.1", self.port)).await?;
            self.stream = Some(BufReader::new(stream));
        }
        let stream = self.stream.as_mut().expect("connected above");
        let connection = if self.keep_alive {
            "keep-alive"
        } else {
            "close"
        };
        stream
            .get_mut()
            .write_all(
                format!(
                    "GET / HTTP/1.1\r\nHost: {}\r\nConnection: {connection}\r\n\r\n",
                    self.host
                )
                .as_bytes(),
            )
            .await?;
        let mut line = String::new();
        stream.read_line(&mut line).await?;
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no status line: {line:?}")))?;
        let mut length = 0;
        let mut closes = false;
        loop {
            line.clear();
            if stream.read_line(&mut line).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let lower = line.to_ascii_lowercase();
            if let Some(value) = lower.strip_prefix("content-length:") {
                length = value.trim().parse().unwrap_or(0);
            }
            if lower.starts_with("connection: close") {
                closes = true;
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await?;
        if closes {
            self.stream = None;
        }
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}
