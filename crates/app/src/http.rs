//! The HTTP surface: `/metrics`, `/healthz`, `/readyz`, `POST /-/reload`,
//! the `/debug/*` JSON endpoints and the status page at `/`.
//!
//! The server outlives reinit iterations: it reads everything through the
//! process-wide [`StatusStore`] and the metrics [`Registry`], and the parts of the
//! config it enforces per request through [`Policy`]. Secrets never leave through it:
//! the effective config is serialized with secrets redacted, certificates and PEM key
//! material are replaced by a placeholder, and the `data` of Secret objects is hidden.
//!
//! Hardening, because the controller holds TLS keys and HAProxy admin access:
//! - every listener has header-read, idle and write timeouts, a connection and a
//!   request concurrency limit, and a shutdown deadline ([`server`]);
//! - `/`, `/debug/*` and `/-/*` answer only requests whose `Host` is a loopback name or
//!   one of `controller.allowedHosts` (403 otherwise), so a web page that points its
//!   own domain at 127.0.0.1 (DNS rebinding) cannot read them; `/metrics`, `/healthz`
//!   and `/readyz` answer any `Host`, as probes and Prometheus use pod IPs;
//! - `POST /-/reload` needs the [`RELOAD_HEADER`] (a web page cannot send a custom
//!   header cross-origin without a CORS preflight, which hapwright never approves),
//!   acts at most once per `controller.http.reloadInterval` (429 otherwise), and
//!   reports whether the config was unchanged, rejected or is being switched to;
//! - `POST /-/approve` (release a change the safety valve holds) follows the same
//!   rules with the [`APPROVE_HEADER`] and its own rate-limit window.

pub mod server;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use hapwright_eventbus::model::{ContentHash, FileKind, RenderedConfig, StoredObject};
use hapwright_eventbus::{CorrelationId, Publisher, ReloadSource, SafetyValveApproved};
use prometheus::{Encoder, Registry, TextEncoder};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use server::Limits;

use crate::config;
use crate::status::{EVENT_RING, Liveness, Readiness, StatusStore};

/// The request header `POST /-/reload` requires (any non-empty value; send `1`).
/// A custom header makes the request non-simple in CORS terms, so a plain form
/// POST from a web page on the same host cannot trigger a reload.
pub const RELOAD_HEADER: &str = "x-hapwright-reload";

/// The request header `POST /-/approve` requires (any non-empty value; send `1`),
/// for the same reason as [`RELOAD_HEADER`].
pub const APPROVE_HEADER: &str = "x-hapwright-approve";

/// How long `POST /-/reload` waits for the reinit loop's verdict before answering
/// that the request was queued with an unknown outcome.
const RELOAD_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// What the reinit loop made of a reload request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The config file (templates included) equals the running config: nothing
    /// was rebuilt.
    Unchanged,
    /// The new config is valid; the controller is switching to it.
    Accepted,
    /// The new config is invalid; the running one stays. The located errors.
    Rejected(Vec<String>),
}

/// A reload request as the reinit loop receives it.
#[derive(Debug)]
pub struct ReloadRequest {
    /// Who asked.
    pub source: ReloadSource,
    reply: Option<oneshot::Sender<ReloadOutcome>>,
}

impl ReloadRequest {
    /// A request nobody waits on (SIGHUP, tests).
    pub fn new(source: ReloadSource) -> Self {
        Self {
            source,
            reply: None,
        }
    }

    /// Tells the requester what happened (if it still waits).
    pub fn answer(self, outcome: ReloadOutcome) {
        if let Some(reply) = self.reply {
            let _ = reply.send(outcome);
        }
    }
}

/// Lets one request through per window: the rate limit of the lifecycle endpoints.
#[derive(Clone, Debug, Default)]
struct RateLimit {
    /// When the last request was let through.
    last: Arc<Mutex<Option<tokio::time::Instant>>>,
}

impl RateLimit {
    /// Lets a request through if none was within `interval`; otherwise how long to
    /// wait.
    fn admit(&self, interval: Duration) -> Result<(), Duration> {
        let now = tokio::time::Instant::now();
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(at) = *last {
            let next = at + interval;
            if now < next {
                return Err(next - now);
            }
        }
        *last = Some(now);
        Ok(())
    }
}

/// Asks the reinit loop to reload the controller configuration.
#[derive(Clone, Debug)]
pub struct ReloadHandle {
    sender: mpsc::Sender<ReloadRequest>,
    /// The rate limit of HTTP reloads.
    limit: RateLimit,
}

/// Why an HTTP reload request was not passed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReloadRefused {
    /// One reload per window: retry after this long.
    RateLimited(Duration),
    /// The reinit loop is not taking requests (shutting down, or its queue is full).
    Unavailable,
}

impl ReloadHandle {
    /// A handle and the receiving end the reinit loop listens on.
    pub fn channel() -> (Self, mpsc::Receiver<ReloadRequest>) {
        let (sender, receiver) = mpsc::channel(8);
        (
            Self {
                sender,
                limit: RateLimit::default(),
            },
            receiver,
        )
    }

    /// Requests a reload without waiting for the outcome. Requests that arrive
    /// while several are already queued are merged into those (they would reload
    /// the same file).
    pub fn request(&self, source: ReloadSource) {
        let _ = self.sender.try_send(ReloadRequest::new(source));
    }

    /// Passes a reload request on if none was let through within `interval`, and
    /// waits (bounded) for the outcome; `Ok(None)` when no verdict came in time.
    pub async fn request_limited(
        &self,
        source: ReloadSource,
        interval: Duration,
    ) -> Result<Option<ReloadOutcome>, ReloadRefused> {
        self.limit
            .admit(interval)
            .map_err(ReloadRefused::RateLimited)?;
        let (reply, answer) = oneshot::channel();
        self.sender
            .try_send(ReloadRequest {
                source,
                reply: Some(reply),
            })
            .map_err(|_| ReloadRefused::Unavailable)?;
        match tokio::time::timeout(RELOAD_ANSWER_TIMEOUT, answer).await {
            Ok(Ok(outcome)) => Ok(Some(outcome)),
            Ok(Err(_)) => Err(ReloadRefused::Unavailable),
            Err(_) => Ok(None),
        }
    }
}

/// Passes `POST /-/approve` on to the running controller iteration's bus, where the
/// scheduler releases the change its safety valve holds.
#[derive(Clone, Default)]
pub struct ApproveHandle {
    publisher: Arc<Mutex<Option<Publisher>>>,
    limit: RateLimit,
}

impl std::fmt::Debug for ApproveHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApproveHandle").finish_non_exhaustive()
    }
}

impl ApproveHandle {
    /// Points approvals at the bus of the iteration that runs now.
    pub fn set_publisher(&self, publisher: Publisher) {
        *self
            .publisher
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(publisher);
    }

    /// Publishes an approval for the held config `hash`; false when no iteration
    /// runs.
    fn approve(&self, hash: Option<ContentHash>) -> bool {
        let publisher = self
            .publisher
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match publisher {
            Some(publisher) => {
                publisher.publish(SafetyValveApproved { hash });
                true
            }
            None => false,
        }
    }
}

/// The parts of the config the handlers enforce per request. They change with the
/// config while the listeners stay bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Host names besides the loopback ones that the guarded endpoints answer to,
    /// lowercase.
    pub allowed_hosts: Vec<String>,
    /// Whether `POST /-/reload` and `POST /-/approve` exist.
    pub lifecycle_api: bool,
    /// `POST /-/reload` (and, separately, `POST /-/approve`) acts at most once per
    /// this window.
    pub reload_interval: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self::from(&config::Controller::default())
    }
}

impl From<&config::Controller> for Policy {
    fn from(controller: &config::Controller) -> Self {
        Self {
            allowed_hosts: controller
                .allowed_hosts
                .iter()
                .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
                .collect(),
            lifecycle_api: controller.lifecycle_api,
            reload_interval: controller.http.reload_interval.get(),
        }
    }
}

impl Policy {
    /// Whether a request with this `Host` header may reach the guarded endpoints:
    /// the host part (port removed, case and a trailing dot ignored) must be
    /// `localhost`, `127.0.0.1`, `[::1]` or an allowed host.
    pub fn allows_host(&self, host: &str) -> bool {
        let name = host_name(host).trim_end_matches('.').to_ascii_lowercase();
        matches!(name.as_str(), "localhost" | "127.0.0.1" | "[::1]")
            || self.allowed_hosts.contains(&name)
    }
}

/// The host part of a `Host` header value: `name:port` → `name`,
/// `[v6]:port` → `[v6]`.
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// What the handlers read.
#[derive(Clone, Debug)]
pub struct HttpState {
    /// Process-wide status.
    pub store: StatusStore,
    /// The metrics registry.
    pub registry: Registry,
    /// Where `POST /-/reload` goes.
    pub reload: ReloadHandle,
    /// Where `POST /-/approve` goes.
    pub approve: ApproveHandle,
    /// Host allow-list and lifecycle settings of the running config.
    pub policy: Arc<ArcSwap<Policy>>,
    /// The certificate digests `/debug/rendered` showed last.
    shown_digests: Arc<ShownDigests>,
}

impl HttpState {
    /// State with the default [`Policy`].
    pub fn new(store: StatusStore, registry: Registry, reload: ReloadHandle) -> Self {
        Self {
            store,
            registry,
            reload,
            approve: ApproveHandle::default(),
            policy: Arc::new(ArcSwap::from_pointee(Policy::default())),
            shown_digests: Arc::default(),
        }
    }
}

/// The SHA-256 `/debug/rendered` shows in place of each certificate, kept for the
/// render it showed last: a certificate whose content is the same allocation in the
/// next render (renders share unchanged files) is not hashed again, so showing a
/// render of 10,000 certificates after a change to one hashes one.
#[derive(Debug, Default)]
struct ShownDigests(Mutex<BTreeMap<String, (Arc<str>, ContentHash)>>);

impl ShownDigests {
    /// The digest of every certificate of `rendered`, by name; keeps them for the
    /// next call (and drops those of certificates `rendered` no longer has).
    fn of(&self, rendered: &RenderedConfig) -> BTreeMap<String, ContentHash> {
        let mut kept = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now: BTreeMap<String, (Arc<str>, ContentHash)> = rendered
            .certificates()
            .iter()
            .map(|(name, content)| {
                let digest = match kept.get(name) {
                    Some((shown, digest)) if Arc::ptr_eq(shown, content) => *digest,
                    _ => ContentHash::of(content.as_bytes()),
                };
                (name.clone(), (content.clone(), digest))
            })
            .collect();
        let digests = now
            .iter()
            .map(|(name, (_, d))| (name.clone(), *d))
            .collect();
        *kept = now;
        digests
    }
}

/// The full router for `controller.listen`.
pub fn router(state: HttpState) -> Router {
    let guarded = Router::new()
        .route("/", get(status_page))
        .route("/-/reload", post(reload))
        .route("/-/approve", post(approve))
        .route("/debug/components", get(debug_components))
        .route("/debug/events", get(debug_events))
        .route("/debug/config", get(debug_config))
        .route("/debug/rendered", get(debug_rendered))
        .route("/debug/resources/{name}", get(debug_resources))
        .route("/debug/instances", get(debug_instances))
        .route("/debug/quarantine", get(debug_quarantine))
        .route("/debug/status", get(debug_status))
        .route("/debug/safety", get(debug_safety))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_known_host,
        ));
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(guarded)
        .layer(axum::middleware::map_response(redact_response))
        .with_state(state)
}

/// The scrape-and-probe router for `controller.metricsListen`: only `/metrics`,
/// `/healthz` and `/readyz`.
pub fn metrics_router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .layer(axum::middleware::map_response(redact_response))
        .with_state(state)
}

/// Refuses guarded endpoints to requests whose `Host` is not expected
/// (DNS-rebinding protection).
async fn require_known_host(
    State(state): State<HttpState>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if state.policy.load().allows_host(host) {
        return next.run(request).await;
    }
    let shown: String = host.chars().take(100).collect();
    (
        StatusCode::FORBIDDEN,
        axum::Json(json!({
            "error": format!(
                "host `{shown}` is not allowed here: {} answers only to localhost, \
                 127.0.0.1, [::1] and the names in controller.allowedHosts",
                request.uri().path()
            ),
        })),
    )
        .into_response()
}

/// A running HTTP listener.
#[derive(Debug)]
pub struct HttpServer {
    local_addr: SocketAddr,
    limits: Limits,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl HttpServer {
    /// Binds `addr` and serves `router` within `limits` until
    /// [`shutdown`](Self::shutdown).
    pub async fn bind(addr: SocketAddr, router: Router, limits: Limits) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let cancel = CancellationToken::new();
        let task = tokio::spawn(server::serve(
            listener,
            router,
            limits.clone(),
            cancel.clone(),
        ));
        tracing::info!(%local_addr, "HTTP listener bound");
        Ok(Self {
            local_addr,
            limits,
            cancel,
            task,
        })
    }

    /// Like [`bind`](Self::bind), serving HTTPS: every connection first completes a
    /// TLS handshake with `tls` (the admission webhook's listener).
    pub async fn bind_tls(
        addr: SocketAddr,
        router: Router,
        limits: Limits,
        tls: tokio_rustls::TlsAcceptor,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let cancel = CancellationToken::new();
        let task = tokio::spawn(server::serve_tls(
            listener,
            router,
            limits.clone(),
            tls,
            cancel.clone(),
        ));
        tracing::info!(%local_addr, "HTTPS listener bound");
        Ok(Self {
            local_addr,
            limits,
            cancel,
            task,
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The limits it serves with.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Stops accepting, lets in-flight requests finish within the shutdown
    /// deadline, drops the connections still open, and waits for all of it.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        if let Err(error) = self.task.await {
            tracing::warn!(%error, "HTTP server task failed");
        }
    }
}

async fn metrics(State(state): State<HttpState>) -> Response {
    let mut body = Vec::new();
    let encoder = TextEncoder::new();
    match encoder.encode(&state.registry.gather(), &mut body) {
        Ok(()) => (
            [(header::CONTENT_TYPE, encoder.format_type().to_owned())],
            body,
        )
            .into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

/// Liveness: 503 when a mandatory component has been exited or unhealthy for longer
/// than `controller.livenessGrace`, naming it, so a probe restarts a controller that
/// stopped working; `ok` otherwise.
async fn healthz(State(state): State<HttpState>) -> Response {
    match state.store.liveness() {
        Liveness::Live => "ok\n".into_response(),
        Liveness::NotLive(dead) => {
            let grace = state.store.liveness_grace();
            let first = &dead[0];
            let reason = format!(
                "component `{}` has been {} for longer than controller.livenessGrace ({:?}){}",
                first.component,
                first.state,
                grace,
                first
                    .reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            );
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(json!({
                    "live": false,
                    "reason": reason,
                    "components": dead,
                })),
            )
                .into_response()
        }
    }
}

/// Readiness: 200 once serving (every watched resource synced and some deployment
/// succeeded), and from then on; `failing` names instances whose last deployment
/// attempt failed (they serve their last good config). 503 with the reason before.
async fn readyz(State(state): State<HttpState>) -> Response {
    match state.store.readiness() {
        Readiness::Ready { failing } => (
            StatusCode::OK,
            axum::Json(json!({"ready": true, "failing": failing})),
        )
            .into_response(),
        Readiness::NotReady { reason, failing } => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({
                "ready": false,
                "reason": reason,
                "failing": failing,
            })),
        )
            .into_response(),
    }
}

/// The checks every `/-/*` endpoint makes before acting: the lifecycle API is on
/// (404 otherwise) and the request carries the endpoint's custom header (403
/// otherwise). `header` is the lowercase name, `shown` how the error spells it.
fn lifecycle_refusal(
    policy: &Policy,
    headers: &HeaderMap,
    header: &str,
    shown: &str,
    endpoint: &str,
    purpose: &str,
) -> Option<Response> {
    if !policy.lifecycle_api {
        return Some(
            (
                StatusCode::NOT_FOUND,
                axum::Json(json!({
                    "error": "the lifecycle API is off (controller.lifecycleApi: false)",
                })),
            )
                .into_response(),
        );
    }
    if headers.get(header).is_none_or(|v| v.is_empty()) {
        return Some(
            (
                StatusCode::FORBIDDEN,
                axum::Json(json!({
                    "error": format!(
                        "POST {endpoint} needs the header `{shown}: 1` (this keeps web pages \
                         from {purpose})"
                    ),
                })),
            )
                .into_response(),
        );
    }
    None
}

/// The 429 answer of a rate-limited lifecycle request.
fn rate_limited(wait: Duration, what: &str, interval: Duration) -> Response {
    let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, seconds.to_string())],
        axum::Json(json!({
            "status": "rate-limited",
            "detail": format!(
                "one {what} per controller.http.reloadInterval ({interval:?}); retry in {seconds}s"
            ),
            "retryAfterSeconds": seconds,
        })),
    )
        .into_response()
}

async fn reload(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    let policy = state.policy.load();
    if let Some(refusal) = lifecycle_refusal(
        &policy,
        &headers,
        RELOAD_HEADER,
        "X-Hapwright-Reload",
        "/-/reload",
        "triggering reloads",
    ) {
        return refusal;
    }
    let json = |status: StatusCode, body: Value| (status, axum::Json(body)).into_response();
    match state
        .reload
        .request_limited(ReloadSource::Http, policy.reload_interval)
        .await
    {
        Ok(Some(ReloadOutcome::Unchanged)) => json(
            StatusCode::OK,
            json!({"status": "unchanged", "detail": "the config file equals the running config; nothing was rebuilt"}),
        ),
        Ok(Some(ReloadOutcome::Accepted)) => json(
            StatusCode::ACCEPTED,
            json!({"status": "accepted", "detail": "the new config is valid; the controller is switching to it"}),
        ),
        Ok(Some(ReloadOutcome::Rejected(errors))) => json(
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({"status": "rejected", "detail": "the new config is invalid; the running one stays", "errors": errors}),
        ),
        Ok(None) => json(
            StatusCode::ACCEPTED,
            json!({"status": "requested", "detail": "the reload is queued; its outcome is not known yet (see /debug/config)"}),
        ),
        Err(ReloadRefused::RateLimited(wait)) => {
            rate_limited(wait, "reload", policy.reload_interval)
        }
        Err(ReloadRefused::Unavailable) => json(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "unavailable", "detail": "the controller is not taking reload requests (shutting down or busy)"}),
        ),
    }
}

/// `POST /-/approve`: releases the change the safety valve holds. 200 with
/// `nothing-held` when nothing is held (nothing happens), 202 `approved` when the
/// approval went to the scheduler.
async fn approve(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    let policy = state.policy.load();
    if let Some(refusal) = lifecycle_refusal(
        &policy,
        &headers,
        APPROVE_HEADER,
        "X-Hapwright-Approve",
        "/-/approve",
        "approving held changes",
    ) {
        return refusal;
    }
    let json = |status: StatusCode, body: Value| (status, axum::Json(body)).into_response();
    let Some(hold) = state.store.safety_hold() else {
        return json(
            StatusCode::OK,
            json!({"status": "nothing-held", "detail": "the safety valve holds no change; nothing was done"}),
        );
    };
    if let Err(wait) = state.approve.limit.admit(policy.reload_interval) {
        return rate_limited(wait, "approval", policy.reload_interval);
    }
    if state.approve.approve(Some(hold.hash)) {
        json(
            StatusCode::ACCEPTED,
            json!({
                "status": "approved",
                "detail": format!("the held change goes out now: it {}", hold.removal),
                "hash": hold.hash,
            }),
        )
    } else {
        json(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "unavailable", "detail": "the controller is not running an iteration (starting or shutting down)"}),
        )
    }
}

/// `/debug/components`: every component's health.
fn components_json(store: &StatusStore) -> Value {
    let components: Vec<Value> = store
        .health()
        .snapshot()
        .into_iter()
        .map(|(name, health)| {
            json!({
                "name": name.as_ref(),
                "health": health.state.as_str(),
                "reason": health.reason,
                "since": health.since.duration_since(std::time::SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()),
            })
        })
        .collect();
    Value::Array(components)
}

async fn debug_components(State(state): State<HttpState>) -> axum::Json<Value> {
    axum::Json(components_json(&state.store))
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    limit: Option<usize>,
    correlation_id: Option<String>,
}

async fn debug_events(
    State(state): State<HttpState>,
    Query(query): Query<EventsQuery>,
) -> Response {
    let correlation = match query.correlation_id.as_deref().filter(|c| !c.is_empty()) {
        None => None,
        Some(text) => match CorrelationId::parse(text) {
            Some(id) => Some(id),
            None => {
                return (
                    StatusCode::BAD_REQUEST,
                    axum::Json(
                        json!({"error": format!("correlation_id `{text}` is not a hex id")}),
                    ),
                )
                    .into_response();
            }
        },
    };
    let limit = query.limit.unwrap_or(100).min(EVENT_RING);
    let events = state.store.events(limit, correlation);
    let mut events = serde_json::to_value(events).unwrap_or_else(|_| json!([]));
    // Each correlated event names its reconciliation's trace, to look it up in a
    // tracing backend.
    for event in events.as_array_mut().into_iter().flatten() {
        let trace_id = event
            .get("correlation_id")
            .and_then(Value::as_str)
            .and_then(CorrelationId::parse)
            .map(CorrelationId::trace_id_hex);
        if let (Some(trace_id), Some(object)) = (trace_id, event.as_object_mut()) {
            object.insert("trace_id".to_owned(), trace_id.into());
        }
    }
    axum::Json(json!({ "events": events })).into_response()
}

async fn debug_config(State(state): State<HttpState>) -> axum::Json<Value> {
    let config = state.store.config();
    axum::Json(json!({
        "path": config.path,
        "lastReloadSuccessful": config.last_reload_successful,
        "errors": config.errors,
        "errorsText": config.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "effective": config.effective,
    }))
}

async fn debug_rendered(State(state): State<HttpState>) -> Response {
    let Some(rendered) = state.store.rendered() else {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"error": "nothing rendered yet"})),
        )
            .into_response();
    };
    /// One file as the endpoint shows it. Serialized straight from the render: a
    /// file without PEM blocks is not copied before it is written out.
    #[derive(serde::Serialize)]
    struct ShownFile<'a> {
        path: String,
        kind: FileKind,
        content: Cow<'a, str>,
    }
    #[derive(serde::Serialize)]
    struct Shown<'a> {
        hash: ContentHash,
        files: Vec<ShownFile<'a>>,
    }
    let digests = state.shown_digests.of(&rendered);
    let files = rendered
        .iter()
        .map(|(file, content)| {
            let content = if file.kind == FileKind::Certificate {
                let digest = digests
                    .get(&file.name)
                    .copied()
                    .unwrap_or_else(|| ContentHash::of(content.as_bytes()));
                Cow::Owned(format!(
                    "<redacted: {} bytes, sha256 {digest}>",
                    content.len(),
                ))
            } else if content.contains("-----BEGIN ") {
                Cow::Owned(redact_pem(content))
            } else {
                Cow::Borrowed(&**content)
            };
            ShownFile {
                path: file.relative_path(),
                kind: file.kind,
                content,
            }
        })
        .collect();
    axum::Json(Shown {
        hash: rendered.hash(),
        files,
    })
    .into_response()
}

async fn debug_resources(State(state): State<HttpState>, Path(name): Path<String>) -> Response {
    let synced = state.store.is_synced(&name);
    let Some(snapshot) = state.store.resources(&name) else {
        if state.store.is_watched(&name) {
            // Watched but not synced yet: an empty list, not "unknown".
            return axum::Json(json!({"name": name, "count": 0, "objects": [], "synced": synced}))
                .into_response();
        }
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({
                "error": format!("`{name}` is not a watched resource"),
                "known": state.store.resource_names(),
            })),
        )
            .into_response();
    };
    let objects: Vec<Value> = snapshot.list().map(redact_secret).collect();
    axum::Json(json!({"name": name, "count": objects.len(), "objects": objects, "synced": synced}))
        .into_response()
}

async fn debug_instances(State(state): State<HttpState>) -> axum::Json<Value> {
    axum::Json(json!(state.store.instances()))
}

async fn debug_quarantine(State(state): State<HttpState>) -> axum::Json<Value> {
    let objects = state.store.quarantine();
    axum::Json(json!({"count": objects.len(), "objects": objects}))
}

async fn debug_status(State(state): State<HttpState>) -> axum::Json<Value> {
    match state.store.statuses() {
        Some(statuses) => axum::Json(json!(statuses)),
        None => axum::Json(json!({"hash": null, "statuses": [], "errors": []})),
    }
}

async fn debug_safety(State(state): State<HttpState>) -> axum::Json<Value> {
    let hold = state.store.safety_hold();
    axum::Json(json!({
        "held": hold.is_some(),
        "hold": hold,
        "lastRelease": state.store.safety_release(),
    }))
}

async fn status_page(State(state): State<HttpState>) -> Response {
    match crate::status_page::render(&state.store) {
        Ok(html) => Html(html).into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("status page failed to render: {error:#}"),
        )
            .into_response(),
    }
}

/// The last line of defence for every response: every known secret value (see
/// [`hapwright_eventbus::redact`]) in the body is replaced, whichever handler built
/// it and whichever error, event or rendered file it came from. Bodies are small and
/// already in memory; a body that cannot be read is replaced by an error.
async fn redact_response(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(error) => {
            tracing::warn!(%error, "Cannot read a response body to redact it");
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                "response body unavailable",
            )
                .into_response();
        }
    };
    match hapwright_eventbus::redact::global().redact_bytes(&bytes) {
        Cow::Borrowed(_) => Response::from_parts(parts, axum::body::Body::from(bytes)),
        Cow::Owned(redacted) => {
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, axum::body::Body::from(redacted))
        }
    }
}

/// Replaces every PEM block (`-----BEGIN X-----` … `-----END X-----`) with a
/// placeholder naming its type.
pub fn redact_pem(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        out.push_str(&rest[..start]);
        let block = &rest[start..];
        let label_end = block["-----BEGIN ".len()..]
            .find("-----")
            .map(|i| i + "-----BEGIN ".len());
        let Some(label_end) = label_end else {
            out.push_str("<redacted PEM block>");
            return out;
        };
        let label = &block["-----BEGIN ".len()..label_end];
        let end_marker = format!("-----END {label}-----");
        match block.find(&end_marker) {
            Some(end) => {
                out.push_str(&format!("<redacted {label}>"));
                rest = &block[end + end_marker.len()..];
            }
            None => {
                out.push_str(&format!("<redacted {label}>"));
                return out;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Hides the values of `data` and `stringData` in Kubernetes Secret objects.
pub fn redact_secret(object: &StoredObject) -> Value {
    let mut value = object.parse();
    if value.get("kind").and_then(Value::as_str) == Some("Secret") {
        for field in ["data", "stringData"] {
            if let Some(Value::Object(map)) = value.get_mut(field) {
                for entry in map.values_mut() {
                    *entry = Value::String("<redacted>".to_owned());
                }
            }
        }
    }
    value
}

#[cfg(test)]
mod tests;
