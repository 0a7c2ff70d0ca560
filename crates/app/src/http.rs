//! The HTTP surface (DESIGN §4): `/metrics`, `/healthz`, `/readyz`, `POST /-/reload`,
//! the `/debug/*` JSON endpoints and the status page at `/`.
//!
//! The server outlives reinit iterations: it reads everything through the
//! process-wide [`StatusStore`] and the metrics [`Registry`]. Secrets never leave
//! through it: the effective config is serialized with secrets redacted, certificates
//! and PEM key material are replaced by a placeholder, and the `data` of Secret
//! objects is hidden.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use hapwright_eventbus::model::{ContentHash, FileKind, StoredObject};
use hapwright_eventbus::{CorrelationId, ReloadSource};
use prometheus::{Encoder, Registry, TextEncoder};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::status::{EVENT_RING, Liveness, Readiness, StatusStore};

/// Asks the reinit loop to reload the controller configuration.
#[derive(Clone, Debug)]
pub struct ReloadHandle {
    sender: mpsc::Sender<ReloadSource>,
}

impl ReloadHandle {
    /// A handle and the receiving end the reinit loop listens on.
    pub fn channel() -> (Self, mpsc::Receiver<ReloadSource>) {
        let (sender, receiver) = mpsc::channel(8);
        (Self { sender }, receiver)
    }

    /// Requests a reload. Requests that arrive while several are already queued are
    /// merged into those (they would reload the same file).
    pub fn request(&self, source: ReloadSource) {
        let _ = self.sender.try_send(source);
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
}

/// The full router for `controller.listen`.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/", get(status_page))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/-/reload", post(reload))
        .route("/debug/components", get(debug_components))
        .route("/debug/events", get(debug_events))
        .route("/debug/config", get(debug_config))
        .route("/debug/rendered", get(debug_rendered))
        .route("/debug/resources/{name}", get(debug_resources))
        .route("/debug/instances", get(debug_instances))
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

/// A running HTTP listener.
#[derive(Debug)]
pub struct HttpServer {
    local_addr: SocketAddr,
    cancel: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl HttpServer {
    /// Binds `addr` and serves `router` until [`shutdown`](Self::shutdown).
    pub async fn bind(addr: SocketAddr, router: Router) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        });
        tracing::info!(%local_addr, "HTTP listener bound");
        Ok(Self {
            local_addr,
            cancel,
            task,
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, lets in-flight requests finish, and waits for the server.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "HTTP server ended with an error"),
            Err(error) => tracing::warn!(%error, "HTTP server task failed"),
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

/// Readiness: 200 when the last deployment attempt to every known instance
/// succeeded (and some deployment ever did); 503 with the failing instances otherwise.
async fn readyz(State(state): State<HttpState>) -> Response {
    match state.store.readiness() {
        Readiness::Ready => (StatusCode::OK, axum::Json(json!({"ready": true}))).into_response(),
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

async fn reload(State(state): State<HttpState>) -> Response {
    state.reload.request(ReloadSource::Http);
    (
        StatusCode::ACCEPTED,
        axum::Json(json!({"status": "reload requested"})),
    )
        .into_response()
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
    let files: Vec<Value> = rendered
        .iter()
        .map(|(file, content)| {
            let content = if file.kind == FileKind::Certificate {
                format!(
                    "<redacted: {} bytes, sha256 {}>",
                    content.len(),
                    ContentHash::of(content.as_bytes())
                )
            } else {
                redact_pem(content)
            };
            json!({"path": file.relative_path(), "kind": file.kind, "content": content})
        })
        .collect();
    axum::Json(json!({"hash": rendered.hash(), "files": files})).into_response()
}

async fn debug_resources(State(state): State<HttpState>, Path(name): Path<String>) -> Response {
    let Some(snapshot) = state.store.resources(&name) else {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({
                "error": format!("no watched resource named `{name}` has published objects"),
                "known": state.store.resource_names(),
            })),
        )
            .into_response();
    };
    let objects: Vec<Value> = snapshot.list().map(redact_secret).collect();
    axum::Json(json!({"name": name, "count": objects.len(), "objects": objects})).into_response()
}

async fn debug_instances(State(state): State<HttpState>) -> axum::Json<Value> {
    axum::Json(json!(state.store.instances()))
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
        std::borrow::Cow::Borrowed(_) => Response::from_parts(parts, axum::body::Body::from(bytes)),
        std::borrow::Cow::Owned(redacted) => {
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
