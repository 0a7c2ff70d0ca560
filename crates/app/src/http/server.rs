//! Serving one listener: an accept loop bounded by a connection semaphore, one task
//! per connection driving hyper's HTTP/1 state machine, and the timeouts hyper alone
//! does not give.
//!
//! Per connection:
//! - *TLS handshake* (the webhook listener, [`serve_tls`]): complete within
//!   [`Limits::header_read_timeout`] of the accept;
//! - *header read*: a client must send a complete request head within
//!   [`Limits::header_read_timeout`] — on a new connection counted from the accept,
//!   otherwise from the head's first byte;
//! - *idle*: with no request in flight and no bytes moving for
//!   [`Limits::idle_timeout`], a kept-alive connection is closed;
//! - *write*: a write that makes no progress for [`Limits::write_timeout`] (a client
//!   that stopped reading) fails the connection ([`TimedIo`]).
//!
//! Per listener: at most [`Limits::max_connections`] connections (the rest wait in
//! the kernel's accept queue) and [`Limits::max_concurrent_requests`] requests in
//! handlers (the rest are answered 503 at once by tower's load shedding). Shutdown
//! stops accepting, lets in-flight requests finish for
//! [`Limits::shutdown_timeout`], then drops every connection still open.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::http::StatusCode;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::Service;

use crate::config;

/// Timeouts and limits of one listener (`controller.http`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest wait for a complete request head.
    pub header_read_timeout: Duration,
    /// Longest a kept-alive connection may sit without a request.
    pub idle_timeout: Duration,
    /// Longest a response write may make no progress.
    pub write_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
    /// Requests in handlers at most; more are answered 503.
    pub max_concurrent_requests: usize,
    /// How long in-flight requests get when the listener shuts down.
    pub shutdown_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self::from(&config::Http::default())
    }
}

impl From<&config::Http> for Limits {
    fn from(http: &config::Http) -> Self {
        Self {
            header_read_timeout: http.header_read_timeout.get(),
            idle_timeout: http.idle_timeout.get(),
            write_timeout: http.write_timeout.get(),
            max_connections: http.max_connections.max(1),
            max_concurrent_requests: http.max_concurrent_requests.max(1),
            shutdown_timeout: http.shutdown_timeout.get(),
        }
    }
}

/// Wraps `router` in the per-listener request concurrency limit: a request that
/// finds every slot taken is answered 503 at once instead of queueing.
pub fn limit_concurrency(router: Router, max: usize) -> Router {
    router.layer(
        tower::ServiceBuilder::new()
            .layer(HandleErrorLayer::new(|_: axum::BoxError| async {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too many concurrent requests; retry shortly\n",
                )
            }))
            .load_shed()
            .layer(tower::limit::GlobalConcurrencyLimitLayer::new(max)),
    )
}

/// Accepts connections on `listener` and serves `router` on them until `stop`
/// fires, then drains within the shutdown deadline.
pub async fn serve(listener: TcpListener, router: Router, limits: Limits, stop: CancellationToken) {
    serve_with(listener, router, limits, None, stop).await;
}

/// [`serve`] over TLS: each connection completes its TLS handshake within
/// [`Limits::header_read_timeout`] (a client that stalls the handshake holds a
/// connection slot no longer than one that trickles its request head), then is
/// served as in [`serve`].
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: tokio_rustls::TlsAcceptor,
    stop: CancellationToken,
) {
    serve_with(listener, router, limits, Some(tls), stop).await;
}

async fn serve_with(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: CancellationToken,
) {
    let router = limit_concurrency(router, limits.max_concurrent_requests);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    let force = CancellationToken::new();
    let local_addr = listener.local_addr().ok();
    loop {
        let Some(Ok(permit)) = stop
            .run_until_cancelled(slots.clone().acquire_owned())
            .await
        else {
            break;
        };
        let Some(accepted) = stop.run_until_cancelled(listener.accept()).await else {
            break;
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                // Out of file descriptors and the like: give closing connections a
                // moment instead of spinning.
                tracing::warn!(%error, "Accepting an HTTP connection failed");
                let pause = tokio::time::sleep(Duration::from_millis(100));
                if stop.run_until_cancelled(pause).await.is_none() {
                    break;
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        connections.spawn(serve_connection(
            stream,
            tls.clone(),
            router.clone(),
            limits.clone(),
            Shutdown {
                graceful: stop.clone(),
                force: force.clone(),
            },
            permit,
        ));
    }
    drop(listener);
    connections.close();
    if tokio::time::timeout(limits.shutdown_timeout, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            local_addr = ?local_addr,
            open = connections.len(),
            deadline = ?limits.shutdown_timeout,
            "HTTP connections still open at the shutdown deadline; closing them"
        );
        force.cancel();
        connections.wait().await;
    }
}

/// The two stages of a listener's shutdown as one connection sees them.
struct Shutdown {
    /// Finish the request in flight, then close.
    graceful: CancellationToken,
    /// The deadline passed: close now.
    force: CancellationToken,
}

async fn serve_connection(
    stream: TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    router: Router,
    limits: Limits,
    shutdown: Shutdown,
    slot: OwnedSemaphorePermit,
) {
    let activity = Arc::new(Activity::new());
    let io = TimedIo::new(stream, activity.clone(), limits.write_timeout);
    let Some(tls) = tls else {
        drive(TokioIo::new(io), activity, router, limits, shutdown, slot).await;
        return;
    };
    let accept = tokio::time::timeout(limits.header_read_timeout, tls.accept(io));
    let Some(handshake) = shutdown.graceful.run_until_cancelled(accept).await else {
        return;
    };
    match handshake {
        Ok(Ok(stream)) => {
            drive(
                TokioIo::new(stream),
                activity,
                router,
                limits,
                shutdown,
                slot,
            )
            .await;
        }
        Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
        Err(_) => tracing::debug!("TLS handshake not complete within the header read timeout"),
    }
}

/// Serves HTTP/1 on one established connection (plain or TLS).
async fn drive<I>(
    io: TokioIo<I>,
    activity: Arc<Activity>,
    router: Router,
    limits: Limits,
    shutdown: Shutdown,
    _slot: OwnedSemaphorePermit,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |request: axum::http::Request<Incoming>| {
            let in_flight = activity.begin_request();
            let call = router.clone().call(request);
            async move {
                let response = call.await;
                drop(in_flight);
                response
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // hyper's own header timer would also run while a kept-alive connection waits
    // for its next request; `Activity` keeps the two apart.
    builder.header_read_timeout(None).keep_alive(true);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let mut draining = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "HTTP connection ended with an error");
                }
                return;
            }
            () = shutdown.graceful.cancelled(), if !draining => {
                draining = true;
                connection.as_mut().graceful_shutdown();
            }
            () = shutdown.force.cancelled() => {
                tracing::debug!("HTTP connection dropped at the shutdown deadline");
                return;
            }
            why = activity.expired(&limits) => {
                tracing::debug!(reason = why, "HTTP connection closed");
                return;
            }
        }
    }
}

// === impl Activity ===

/// What one connection is doing, for the header-read and idle deadlines.
#[derive(Debug)]
struct Activity {
    state: Mutex<ActivityState>,
    /// A request started or ended: the deadline changed kind.
    changed: Notify,
}

#[derive(Debug)]
struct ActivityState {
    /// Requests in handlers.
    in_flight: usize,
    /// Requests handled so far.
    served: u64,
    /// Accept, or the last byte read or written.
    last_io: Instant,
    /// First byte of a request head not yet complete.
    head_started: Option<Instant>,
}

impl Activity {
    fn new() -> Self {
        Self {
            state: Mutex::new(ActivityState {
                in_flight: 0,
                served: 0,
                last_io: Instant::now(),
                head_started: None,
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn read(&self) {
        let now = Instant::now();
        let mut state = self.lock();
        state.last_io = now;
        if state.in_flight == 0 && state.head_started.is_none() {
            state.head_started = Some(now);
        }
    }

    fn wrote(&self) {
        self.lock().last_io = Instant::now();
    }

    fn begin_request(self: &Arc<Self>) -> InFlight {
        {
            let mut state = self.lock();
            state.in_flight += 1;
            state.head_started = None;
        }
        self.changed.notify_waiters();
        InFlight(self.clone())
    }

    /// When the connection must be closed if nothing changes, and why; `None` while
    /// a request is in a handler.
    fn deadline(&self, limits: &Limits) -> Option<(Instant, &'static str)> {
        let state = self.lock();
        if state.in_flight > 0 {
            None
        } else if let Some(started) = state.head_started {
            Some((
                started + limits.header_read_timeout,
                "request head not complete within the header read timeout",
            ))
        } else if state.served == 0 {
            Some((
                state.last_io + limits.header_read_timeout,
                "no request within the header read timeout",
            ))
        } else {
            Some((state.last_io + limits.idle_timeout, "idle timeout"))
        }
    }

    /// Completes when the connection has been idle, or has trickled a request
    /// head, for too long.
    async fn expired(&self, limits: &Limits) -> &'static str {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.deadline(limits) {
                None => changed.await,
                Some((at, why)) => {
                    if at <= Instant::now() {
                        return why;
                    }
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = changed => {}
                    }
                }
            }
        }
    }
}

/// A request in a handler; dropping it ends the request.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        {
            let mut state = self.0.lock();
            state.in_flight = state.in_flight.saturating_sub(1);
            state.served += 1;
            state.last_io = Instant::now();
        }
        self.0.changed.notify_waiters();
    }
}

// === impl TimedIo ===

/// A TCP stream that records traffic in the connection's [`Activity`] and fails a
/// write (or flush) that makes no progress for the write timeout.
struct TimedIo {
    stream: TcpStream,
    activity: Arc<Activity>,
    write_timeout: Duration,
    /// Running while a write is pending.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl TimedIo {
    fn new(stream: TcpStream, activity: Arc<Activity>, write_timeout: Duration) -> Self {
        Self {
            stream,
            activity,
            write_timeout,
            stalled: None,
        }
    }

    /// Turns the inner stream's answer to a write into ours: progress resets the
    /// stall timer, `Pending` runs it, and its expiry is an error.
    fn on_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(result) => {
                self.stalled = None;
                if result.is_ok() {
                    self.activity.wrote();
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                let timeout = self.write_timeout;
                let stalled = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                ready!(stalled.as_mut().poll(cx));
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client read nothing for {timeout:?} (write timeout)"),
                )))
            }
        }
    }
}

impl AsyncRead for TimedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = ready!(Pin::new(&mut this.stream).poll_read(cx, buf));
        if result.is_ok() && buf.filled().len() > before {
            this.activity.read();
        }
        Poll::Ready(result)
    }
}

impl AsyncWrite for TimedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_write(cx, data);
        this.on_write(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.on_write(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_flush(cx);
        this.on_write(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_shutdown(cx);
        this.on_write(cx, poll)
    }
}
