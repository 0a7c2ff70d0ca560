//! The validating admission webhook (`controller.webhook`): the API server asks
//! `POST /validate` on an HTTPS listener of its own whether an object may be
//! created, updated or deleted, and hapwright answers by rendering and validating
//! the configuration the object would produce.
//!
//! # Layout
//!
//! ```text
//! ResourceIndexUpdated ──▶ feed::Feed ──▶ feed::Current (latest snapshots, shared)
//!                                              │ copied per review
//! POST /validate ──▶ review::Engine: parse ─▶ select (which watched resources)
//!   (tls: cert re-read     ─▶ apply to the copy ─▶ render + phase 1 + phase 2
//!    when files change)    ─▶ allow / deny (template line, HAProxy's message)
//! ```
//!
//! - [`feed`]: the bus component that keeps the current snapshots (every replica
//!   runs it, so followers answer as well as the leader).
//! - [`select`]: the watched resources an object belongs to and how the source
//!   would store it.
//! - [`review`]: one decision within the timeout budget; on timeout, or before the
//!   sources finished their first listing, the `failurePolicy` decides.
//! - [`tls`]: the server certificate, reloaded when its files change.
//!
//! The listener outlives controller iterations (like the HTTP listeners); each
//! iteration installs its [`review::Engine`] into the listener's [`Slot`].

pub mod feed;
pub mod review;
pub mod select;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};

use crate::http::{HttpServer, Limits};

pub use feed::{Current, Feed};
pub use review::{Engine, Settings};
pub use select::Target;

/// The engine requests are answered with; empty while no iteration installed one.
pub type Slot = Arc<ArcSwapOption<Engine>>;

/// `hapwright_webhook_requests_total{resource,decision}` and
/// `hapwright_webhook_duration_seconds`: how often objects are refused, for which
/// resource, and how close decisions come to the API server's timeout.
#[derive(Clone, Debug)]
pub struct Metrics {
    requests: IntCounterVec,
    duration: Histogram,
}

impl Metrics {
    /// Creates and registers the webhook metrics.
    ///
    /// # Errors
    ///
    /// A metric with the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let requests = IntCounterVec::new(
            Opts::new(
                "hapwright_webhook_requests_total",
                "Admission reviews answered, by watched resource (`none`: not validated) \
                 and decision (allowed, denied, invalid).",
            ),
            &["resource", "decision"],
        )?;
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "hapwright_webhook_duration_seconds",
                "Time to answer one admission review.",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        Ok(Self { requests, duration })
    }

    /// Makes the counters of `resource` exist at 0, so an alert on the first
    /// denial sees it.
    pub fn start_at_zero(&self, resource: &str) {
        for decision in ["allowed", "denied"] {
            self.requests.with_label_values(&[resource, decision]);
        }
    }

    /// Counts one answer and its duration.
    pub fn record(&self, resource: &str, decision: &str, duration: Duration) {
        self.requests.with_label_values(&[resource, decision]).inc();
        self.duration.observe(duration.as_secs_f64());
    }
}

/// The webhook's routes: `POST /validate`, bodies up to `max_body` bytes (larger:
/// 413).
pub fn router(slot: Slot, max_body: usize) -> Router {
    Router::new()
        .route("/validate", post(validate))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(slot)
}

async fn validate(State(slot): State<Slot>, body: Bytes) -> Response {
    let Some(engine) = slot.load_full() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"error": "the webhook is starting"})),
        )
            .into_response();
    };
    let answer = engine.review(&body).await;
    (answer.status, axum::Json(answer.body)).into_response()
}

/// Why the webhook listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// The certificate files are not usable.
    #[error("controller.webhook: {reason}")]
    CertificateFailed {
        /// What is wrong with the files.
        reason: tls::Error,
    },
    /// The address cannot be bound.
    #[error("controller.webhook.listen: cannot listen on {addr}: {error}")]
    BindFailed {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        error: std::io::Error,
    },
}

/// What a running webhook listener was started with; a change rebinds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listen {
    /// The address.
    pub addr: SocketAddr,
    /// The certificate file.
    pub cert_file: std::path::PathBuf,
    /// The key file.
    pub key_file: std::path::PathBuf,
    /// The body limit.
    pub max_body: usize,
    /// Connection limits (`controller.http`).
    pub limits: Limits,
}

impl Listen {
    /// The listener settings of a `controller.webhook` section.
    pub fn new(webhook: &crate::config::Webhook, limits: Limits) -> Self {
        Self {
            addr: webhook.listen,
            cert_file: webhook.cert_file.clone(),
            key_file: webhook.key_file.clone(),
            max_body: usize::try_from(webhook.max_request_bytes.bytes()).unwrap_or(usize::MAX),
            limits,
        }
    }

    /// Binds the HTTPS listener, answering with whatever engine `slot` holds.
    ///
    /// # Errors
    ///
    /// The certificate cannot be loaded or the address bound.
    pub async fn bind(&self, slot: Slot) -> Result<HttpServer, ListenError> {
        let acceptor = tls::acceptor(&self.cert_file, &self.key_file)
            .map_err(|reason| ListenError::CertificateFailed { reason })?;
        HttpServer::bind_tls(
            self.addr,
            router(slot, self.max_body),
            self.limits.clone(),
            acceptor,
        )
        .await
        .map_err(|error| ListenError::BindFailed {
            addr: self.addr,
            error,
        })
    }
}
