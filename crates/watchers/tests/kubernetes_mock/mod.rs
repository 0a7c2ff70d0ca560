//! A scripted Kubernetes API server for protocol-level tests: a `tower-test` mock
//! pair behind a real `kube::Client`. Tests take each request the client sends,
//! check its method, path and query, and answer it (or hold it open, as an idle
//! watch). [`Writing`] puts components that write to it on the shared test bus
//! (`hapwright_eventbus::testing`).

#![allow(dead_code)]

use std::collections::BTreeMap;

use http::{Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};
use tokio::time::timeout;

/// How long a test waits for the client's next request.
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(120);

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Responder = tower_test::mock::SendResponse<Response<Body>>;

/// A client wired to a scripted server.
pub fn pair() -> (kube::Client, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (
        kube::Client::new(service, "default"),
        ApiServer {
            handle,
            held: Vec::new(),
        },
    )
}

/// The server side of the pair.
pub struct ApiServer {
    handle: Handle,
    /// Requests answered with nothing yet (idle watches); kept so they stay open.
    held: Vec<Responder>,
}

/// One request from the client, waiting for its answer.
pub struct Exchange {
    /// HTTP method.
    pub method: http::Method,
    /// URI path.
    pub path: String,
    /// Decoded query parameters.
    pub query: BTreeMap<String, String>,
    /// Request body.
    pub body: Vec<u8>,
    /// `Content-Type` header.
    pub content_type: Option<String>,
    responder: Option<Responder>,
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {:?}", self.method, self.path, self.query)
    }
}

impl ApiServer {
    /// The next request; panics after [`WAIT`].
    pub async fn next(&mut self) -> Exchange {
        let (request, responder) = timeout(WAIT, self.handle.next_request())
            .await
            .expect("timed out waiting for the client's next request")
            .expect("the client is gone");
        let (parts, body) = request.into_parts();
        let body = body.collect_bytes().await.unwrap_or_default().to_vec();
        Exchange {
            method: parts.method,
            path: parts.uri.path().to_owned(),
            query: parse_query(parts.uri.query().unwrap_or("")),
            body,
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            responder: Some(responder),
        }
    }

    /// The next request, which must be a GET of `path`.
    pub async fn expect_get(&mut self, path: &str) -> Exchange {
        let exchange = self.next().await;
        assert_eq!(exchange.method, http::Method::GET, "{exchange:?}");
        assert_eq!(exchange.path, path, "{exchange:?}");
        exchange
    }

    /// The next request, which must be a LIST (GET without `watch`) of `path`.
    pub async fn expect_list(&mut self, path: &str) -> Exchange {
        let exchange = self.expect_get(path).await;
        assert!(!exchange.is_watch(), "expected a list: {exchange:?}");
        exchange
    }

    /// The next request, which must be a WATCH of `path`.
    pub async fn expect_watch(&mut self, path: &str) -> Exchange {
        let exchange = self.expect_get(path).await;
        assert!(exchange.is_watch(), "expected a watch: {exchange:?}");
        exchange
    }

    /// The next request for `path`; watches of other paths that arrive first are held
    /// open (streams of other namespaces re-watching), anything else fails the test.
    pub async fn next_on(&mut self, path: &str) -> Exchange {
        loop {
            let exchange = self.next().await;
            if exchange.path == path {
                return exchange;
            }
            assert!(exchange.is_watch(), "unexpected request: {exchange:?}");
            self.hold(exchange);
        }
    }

    /// Keeps `exchange` open without answering (an idle watch).
    pub fn hold(&mut self, mut exchange: Exchange) {
        self.held
            .push(exchange.responder.take().expect("not answered yet"));
    }
}

impl Exchange {
    /// True for `?watch=true`.
    pub fn is_watch(&self) -> bool {
        self.query.get("watch").map(String::as_str) == Some("true")
    }

    /// Query parameter `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str)
    }

    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    /// Answers with `status` and a JSON body.
    pub fn respond(mut self, status: u16, body: &Value) {
        self.respond_raw(status, serde_json::to_vec(body).unwrap());
    }

    /// Answers with `status` and `body`.
    pub fn respond_raw(&mut self, status: u16, body: Vec<u8>) {
        let response = Response::builder()
            .status(StatusCode::from_u16(status).unwrap())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap();
        self.responder
            .take()
            .expect("answered once")
            .send_response(response);
    }

    /// Answers a watch with these events, one JSON line each; the stream then ends
    /// (as when the server's watch timeout closes it).
    pub fn respond_events(mut self, events: &[Value]) {
        let mut body = Vec::new();
        for event in events {
            body.extend(serde_json::to_vec(event).unwrap());
            body.push(b'\n');
        }
        self.respond_raw(200, body);
    }

    /// Answers with a `Status` failure.
    pub fn respond_status(self, code: u16, reason: &str, message: &str) {
        self.respond(code, &status(code, reason, message));
    }
}

/// A `meta/v1` `Status` failure.
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    })
}

/// An `APIResourceList` for `group_version` with one resource.
pub fn resource_list(group_version: &str, plural: &str, kind: &str, namespaced: bool) -> Value {
    json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
        "resources": [
            {"name": plural, "singularName": kind.to_lowercase(), "namespaced": namespaced, "kind": kind,
             "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]},
            {"name": format!("{plural}/status"), "singularName": "", "namespaced": namespaced, "kind": kind,
             "verbs": ["get", "patch", "update"]},
        ],
    })
}

/// A list response (items without `apiVersion`/`kind`, as the API server sends them).
pub fn list(kind: &str, resource_version: &str, items: &[Value]) -> Value {
    let items: Vec<Value> = items
        .iter()
        .map(|item| {
            let mut item = item.clone();
            if let Some(map) = item.as_object_mut() {
                map.remove("apiVersion");
                map.remove("kind");
            }
            item
        })
        .collect();
    json!({
        "kind": format!("{kind}List"), "apiVersion": "v1",
        "metadata": {"resourceVersion": resource_version},
        "items": items,
    })
}

/// A watch event line.
pub fn event(kind: &str, object: &Value) -> Value {
    json!({"type": kind, "object": object})
}

/// A `BOOKMARK` event at `resource_version`.
pub fn bookmark(api_version: &str, kind: &str, resource_version: &str) -> Value {
    json!({"type": "BOOKMARK", "object": {
        "apiVersion": api_version, "kind": kind,
        "metadata": {"resourceVersion": resource_version},
    }})
}

/// An `ERROR` event carrying a `Status`.
pub fn error_event(code: u16, reason: &str, message: &str) -> Value {
    json!({"type": "ERROR", "object": status(code, reason, message)})
}

fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key), decode(value))
        })
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

/// The watched resource `ingresses`: `networking.k8s.io/v1` Ingresses.
pub fn ingresses() -> [(
    std::sync::Arc<str>,
    hapwright_watchers::kubernetes::WatchedKind,
); 1] {
    [(
        std::sync::Arc::from("ingresses"),
        hapwright_watchers::kubernetes::WatchedKind {
            api_version: "networking.k8s.io/v1".into(),
            kind: "Ingress".into(),
        },
    )]
}

/// A component that writes to the API server, on a test bus: the running kernel,
/// the test's publisher, the components' health changes (subscribed before the
/// kernel started) and the scripted API server behind their client.
pub struct Writing {
    /// The running kernel.
    pub kernel: hapwright_eventbus::RunningKernel,
    /// Publishes the events the test plays.
    pub publisher: hapwright_eventbus::Publisher,
    /// The components' health changes.
    pub health: hapwright_eventbus::Subscription,
    /// The server side of the client the components were given.
    pub api: ApiServer,
}

impl Writing {
    /// Starts the components `register` adds, given a client of the scripted server.
    pub fn start(
        register: impl FnOnce(
            hapwright_watchers::kubernetes::ClientFactory,
            &mut hapwright_eventbus::Kernel,
        ),
    ) -> Self {
        let (client, api) = pair();
        let bus = hapwright_eventbus::testing::TestBus::new();
        let health = bus.subscribe(
            "test",
            [hapwright_eventbus::EventKind::ComponentHealthChanged],
        );
        let publisher = bus.publisher();
        let client = hapwright_watchers::kubernetes::ClientFactory::with_client(client);
        let kernel = bus.start(|kernel| register(client, kernel));
        Self {
            kernel,
            publisher,
            health,
            api,
        }
    }

    /// Waits until `component` reports `state`; returns the reason it gave.
    pub async fn health(
        &mut self,
        component: &str,
        state: hapwright_eventbus::HealthState,
    ) -> String {
        hapwright_eventbus::testing::health_reported(&mut self.health, component, state, WAIT).await
    }

    /// Shuts the kernel down and checks that no component had to be aborted.
    pub async fn stop(self) {
        hapwright_eventbus::testing::stop(self.kernel).await;
    }
}
