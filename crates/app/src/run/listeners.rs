//! The HTTP endpoints' wiring: the main, metrics and webhook listeners, which
//! outlive iterations and are rebound (new address bound before the old one is let
//! go) only when `controller.listen`, `metricsListen` or `controller.webhook`
//! change.

use std::net::SocketAddr;

use crate::config;
use crate::http::{self, HttpServer, HttpState, Limits};
use crate::webhook;

/// Why a listener could not be (re)bound. Not retryable: the address is taken or not
/// ours; the message names the config key and the address so users know what to edit.
#[derive(Debug, thiserror::Error)]
#[error("controller.{key}: cannot listen on {addr}: {error}")]
pub(super) struct ListenError {
    key: &'static str,
    addr: SocketAddr,
    error: std::io::Error,
}

/// Listeners that outlive iterations, rebound when their address changes.
#[derive(Default)]
pub(super) struct Listeners {
    main: Option<(SocketAddr, HttpServer)>,
    metrics: Option<(SocketAddr, HttpServer)>,
    /// The admission webhook's HTTPS listener, when `controller.webhook` is set.
    webhook: Option<(webhook::Listen, HttpServer)>,
}

impl Listeners {
    /// Makes the listeners serve `listen` and `metrics_listen` within `limits`,
    /// binding the new address before letting go of the old one, so a failure leaves
    /// the current listeners as they were. (When the new address cannot be bound while
    /// the old one holds the port, e.g. `0.0.0.0:9400` replacing `127.0.0.1:9400` or
    /// the same address with new limits, the old one is released first and restored
    /// if the new bind still fails.)
    pub(super) async fn ensure(
        &mut self,
        state: &HttpState,
        listen: SocketAddr,
        metrics_listen: Option<SocketAddr>,
        limits: &Limits,
    ) -> Result<(), ListenError> {
        let main = rebind(self.main.take(), Some(listen), limits, || {
            http::router(state.clone())
        })
        .await;
        let main = match main {
            Ok(main) => main,
            Err((old, error)) => {
                self.main = old;
                return Err(ListenError {
                    key: "listen",
                    addr: listen,
                    error,
                });
            }
        };
        self.main = main;
        let metrics = rebind(self.metrics.take(), metrics_listen, limits, || {
            http::metrics_router(state.clone())
        })
        .await;
        match metrics {
            Ok(metrics) => {
                self.metrics = metrics;
                Ok(())
            }
            Err((old, error)) => {
                self.metrics = old;
                Err(ListenError {
                    key: "metricsListen",
                    addr: metrics_listen.unwrap_or(listen),
                    error,
                })
            }
        }
    }

    /// Makes the webhook listener serve `wanted` (`None`: no listener), binding the
    /// new one before letting go of the old one when it can; on failure the old
    /// listener keeps serving.
    pub(super) async fn ensure_webhook(
        &mut self,
        wanted: Option<webhook::Listen>,
        slot: &webhook::Slot,
    ) -> Result<(), webhook::ListenError> {
        if self.webhook.as_ref().map(|(listen, _)| listen) == wanted.as_ref() {
            return Ok(());
        }
        let Some(wanted) = wanted else {
            if let Some((_, old)) = self.webhook.take() {
                old.shutdown().await;
            }
            return Ok(());
        };
        match wanted.bind(slot.clone()).await {
            Ok(server) => {
                if let Some((_, old)) = self.webhook.replace((wanted, server)) {
                    old.shutdown().await;
                }
                Ok(())
            }
            Err(first) => {
                // The old listener may hold the port (same port, or a new certificate
                // or limit on the same address).
                let Some((old_listen, old)) = self.webhook.take() else {
                    return Err(first);
                };
                let certificate = matches!(first, webhook::ListenError::CertificateFailed { .. });
                if certificate || old_listen.addr.port() != wanted.addr.port() {
                    self.webhook = Some((old_listen, old));
                    return Err(first);
                }
                old.shutdown().await;
                match wanted.bind(slot.clone()).await {
                    Ok(server) => {
                        self.webhook = Some((wanted, server));
                        Ok(())
                    }
                    Err(error) => {
                        if let Ok(restored) = old_listen.bind(slot.clone()).await {
                            self.webhook = Some((old_listen, restored));
                        }
                        Err(error)
                    }
                }
            }
        }
    }

    pub(super) async fn shutdown(self) {
        for server in self
            .main
            .into_iter()
            .chain(self.metrics)
            .map(|(_, server)| server)
            .chain(self.webhook.map(|(_, server)| server))
        {
            server.shutdown().await;
        }
    }
}

type Bound = Option<(SocketAddr, HttpServer)>;

/// Moves one listener from `current` to `wanted` (`None`: no listener) served within
/// `limits`. On failure returns the listener that is still serving (the old one) with
/// the error.
async fn rebind(
    current: Bound,
    wanted: Option<SocketAddr>,
    limits: &Limits,
    router: impl Fn() -> axum::Router,
) -> Result<Bound, (Bound, std::io::Error)> {
    let unchanged = match (&current, wanted) {
        (Some((addr, server)), Some(wanted)) => *addr == wanted && server.limits() == limits,
        (None, None) => true,
        _ => false,
    };
    if unchanged {
        return Ok(current);
    }
    let Some(addr) = wanted else {
        if let Some((_, old)) = current {
            old.shutdown().await;
        }
        return Ok(None);
    };
    match HttpServer::bind(addr, router(), limits.clone()).await {
        Ok(server) => {
            if let Some((_, old)) = current {
                old.shutdown().await;
            }
            Ok(Some((addr, server)))
        }
        Err(first) => {
            // The old listener may hold the port the new address needs.
            let Some((old_addr, old)) = current else {
                return Err((None, first));
            };
            if old_addr.port() != addr.port() {
                return Err((Some((old_addr, old)), first));
            }
            let old_limits = old.limits().clone();
            old.shutdown().await;
            match HttpServer::bind(addr, router(), limits.clone()).await {
                Ok(server) => Ok(Some((addr, server))),
                Err(error) => match HttpServer::bind(old_addr, router(), old_limits).await {
                    Ok(restored) => Err((Some((old_addr, restored)), error)),
                    Err(_) => Err((None, error)),
                },
            }
        }
    }
}

/// The webhook listener's settings of a `controller` section (`None`: no webhook).
pub(super) fn webhook_listen(controller: &config::Controller) -> Option<webhook::Listen> {
    controller
        .webhook
        .as_ref()
        .map(|w| webhook::Listen::new(w, Limits::from(&controller.http)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> axum::Router {
        axum::Router::new().route("/", axum::routing::get(|| async { "up" }))
    }

    async fn serves(addr: SocketAddr) -> bool {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    }

    #[tokio::test]
    async fn a_listener_that_cannot_move_keeps_serving_where_it_was() {
        let old = HttpServer::bind("127.0.0.1:0".parse().unwrap(), router(), Limits::default())
            .await
            .unwrap();
        let old_addr = old.local_addr();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken_addr = taken.local_addr().unwrap();

        let (kept, error) = rebind(
            Some((old_addr, old)),
            Some(taken_addr),
            &Limits::default(),
            router,
        )
        .await
        .expect_err("the address is taken");
        assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse);
        let (kept_addr, kept) = kept.expect("the old listener is still there");
        assert_eq!(kept_addr, old_addr);
        assert!(serves(old_addr).await);

        // A free address moves it, and the old one is released.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let free_addr = free.local_addr().unwrap();
        drop(free);
        let moved = rebind(
            Some((kept_addr, kept)),
            Some(free_addr),
            &Limits::default(),
            router,
        )
        .await
        .map_err(|(_, e)| e)
        .unwrap()
        .unwrap();
        assert_eq!(moved.0, free_addr);
        assert!(serves(free_addr).await);
        assert!(!serves(old_addr).await);
        moved.1.shutdown().await;
        drop(taken);
    }

    #[tokio::test]
    async fn a_listen_address_that_cannot_be_bound_names_its_key_and_address() {
        let state = HttpState::new(
            crate::status::StatusStore::default(),
            prometheus::Registry::new(),
            crate::http::ReloadHandle::channel().0,
        );
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken_addr = taken.local_addr().unwrap();
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let free_addr = free.local_addr().unwrap();
        drop(free);
        let mut listeners = Listeners::default();
        let error = listeners
            .ensure(&state, free_addr, Some(taken_addr), &Limits::default())
            .await
            .expect_err("the metrics address is taken")
            .to_string();
        assert!(
            error.starts_with(&format!(
                "controller.metricsListen: cannot listen on {taken_addr}: "
            )),
            "{error}"
        );
        let error = listeners
            .ensure(&state, taken_addr, None, &Limits::default())
            .await
            .expect_err("the main address is taken")
            .to_string();
        assert!(
            error.starts_with(&format!(
                "controller.listen: cannot listen on {taken_addr}: "
            )),
            "{error}"
        );
        listeners.shutdown().await;
        drop(taken);
    }

    #[tokio::test]
    async fn an_unchanged_address_is_kept_and_none_closes_it() {
        let server = HttpServer::bind("127.0.0.1:0".parse().unwrap(), router(), Limits::default())
            .await
            .unwrap();
        let addr = server.local_addr();
        let same = rebind(Some((addr, server)), Some(addr), &Limits::default(), router)
            .await
            .map_err(|(_, e)| e)
            .unwrap();
        assert_eq!(same.as_ref().map(|(a, _)| *a), Some(addr));
        let closed = rebind(same, None, &Limits::default(), router)
            .await
            .map_err(|(_, e)| e)
            .unwrap();
        assert!(closed.is_none());
        assert!(!serves(addr).await);
    }
}
