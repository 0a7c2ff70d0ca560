//! A stateful in-test HAProxy Data Plane API v3 server (axum) implementing the
//! endpoints the driver uses, with v3-shaped payloads, and fault injection: `409`
//! version conflicts, `5xx` answers, slow answers and failing reloads.
//!
//! A "reload" loads the stored raw configuration: runtime servers come from its
//! `server` lines, runtime map entries from the stored maps. A failed reload keeps
//! the previous configuration (like HAProxy keeping the old worker).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Value, json};

/// A runtime server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    /// Address.
    pub address: String,
    /// Port.
    pub port: Option<u16>,
    /// Weight.
    pub weight: u32,
    /// `ready` or `maint`.
    pub admin_state: String,
}

/// Faults to inject; each counter is consumed by the requests it hits.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Versioned writes answered `409 Conflict`.
    pub conflicts: usize,
    /// Requests answered `503`.
    pub unavailable: usize,
    /// Delay before every answer.
    pub delay: Option<Duration>,
    /// Reloads that fail.
    pub failing_reloads: usize,
    /// Polls a reload stays `in_progress` before it finishes.
    pub reload_polls: usize,
    /// Runtime server additions refused with `400`.
    pub refuse_add_server: bool,
}

/// The server's state.
#[derive(Debug, Default)]
pub struct DpState {
    /// Configuration version.
    pub version: i64,
    /// The stored raw configuration.
    pub raw: String,
    /// The configuration the "running HAProxy" loaded at the last good reload.
    pub running_raw: String,
    /// Reloads by id: (status, response, polls left in progress).
    pub reloads: BTreeMap<String, (String, String, usize)>,
    /// Runtime servers by (backend, server).
    pub servers: BTreeMap<(String, String), Server>,
    /// Storage by area (`maps`, `ssl_certificates`, `general`) and name.
    pub storage: BTreeMap<String, BTreeMap<String, String>>,
    /// Runtime map entries by map name: (id, key, value).
    pub entries: BTreeMap<String, Vec<(String, String, String)>>,
    next_id: u64,
    /// Faults to inject.
    pub faults: Faults,
    /// Every request as `METHOD path?query`.
    pub log: Vec<String>,
    /// The length of `log`, for tests that wait for a request to arrive.
    pub seen: tokio::sync::watch::Sender<usize>,
    /// Reloads performed (successful ones).
    pub reload_count: u64,
}

/// A running test server.
pub struct DataplaneServer {
    /// Base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    /// Shared state.
    pub state: Arc<Mutex<DpState>>,
    task: tokio::task::JoinHandle<()>,
}

/// User and password the server accepts.
pub const USER: &str = "admin";
/// Password the server accepts.
pub const PASSWORD: &str = "s3cret";

impl DataplaneServer {
    /// Starts a server holding `raw` as a running configuration.
    pub async fn start(raw: &str) -> Self {
        let state = Arc::new(Mutex::new(DpState {
            version: 1,
            ..DpState::default()
        }));
        {
            let mut s = state.lock().unwrap();
            s.raw = raw.to_owned();
            load(&mut s);
        }
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, state, task }
    }

    /// Locks the state.
    pub fn state(&self) -> std::sync::MutexGuard<'_, DpState> {
        self.state.lock().unwrap()
    }

    /// Sets the faults.
    pub fn faults(&self, faults: Faults) {
        self.state().faults = faults;
    }

    /// The runtime entries of a map as `key value` pairs, sorted.
    pub fn map(&self, name: &str) -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> = self
            .state()
            .entries
            .get(name)
            .map(|e| e.iter().map(|(_, k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        pairs.sort();
        pairs
    }

    /// One runtime server.
    pub fn server(&self, backend: &str, name: &str) -> Option<Server> {
        self.state()
            .servers
            .get(&(backend.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Changes the configuration behind hapwright's back (and reloads).
    pub fn change_out_of_band(&self, raw: &str) {
        let mut s = self.state();
        s.raw = raw.to_owned();
        s.version += 1;
        load(&mut s);
    }

    /// Waits until the server has seen `count` requests in all (answered or not:
    /// a request counts as it arrives, before any fault delays its answer).
    pub async fn wait_for_requests(&self, count: usize) {
        let mut seen = self.state().seen.subscribe();
        tokio::time::timeout(Duration::from_secs(30), seen.wait_for(|n| *n >= count))
            .await
            .expect("the requests arrive")
            .expect("the server runs");
    }

    /// Requests seen that start with `prefix` (`"POST /v3/services/haproxy/configuration/raw"`).
    pub fn requests(&self, prefix: &str) -> usize {
        self.state()
            .log
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }
}

impl Drop for DataplaneServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// "Reloads": the running configuration becomes the stored one.
fn load(s: &mut DpState) {
    s.running_raw = s.raw.clone();
    s.servers.clear();
    let mut backend = None;
    for line in s.raw.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["backend", name, ..] => backend = Some((*name).to_owned()),
            ["frontend" | "defaults" | "global" | "listen", ..] => backend = None,
            ["server", name, addr, rest @ ..] => {
                if let Some(b) = &backend {
                    let (address, port) = match addr.rsplit_once(':') {
                        Some((a, p)) => (a.to_owned(), p.parse().ok()),
                        None => ((*addr).to_owned(), None),
                    };
                    let weight = rest
                        .iter()
                        .position(|w| *w == "weight")
                        .and_then(|i| rest.get(i + 1))
                        .and_then(|w| w.parse().ok())
                        .unwrap_or(1);
                    let admin_state = if rest.contains(&"disabled") {
                        "maint"
                    } else {
                        "ready"
                    };
                    s.servers.insert(
                        (b.clone(), (*name).to_owned()),
                        Server {
                            address,
                            port,
                            weight,
                            admin_state: admin_state.to_owned(),
                        },
                    );
                }
            }
            _ => {}
        }
    }
    s.entries.clear();
    let maps = s.storage.get("maps").cloned().unwrap_or_default();
    for (name, content) in maps {
        let mut entries = Vec::new();
        for line in content.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line
                .split_once(char::is_whitespace)
                .map_or((line, ""), |(k, v)| (k, v.trim()));
            s.next_id += 1;
            entries.push((format!("0x{:x}", s.next_id), k.to_owned(), v.to_owned()));
        }
        s.entries.insert(name, entries);
    }
    s.reload_count += 1;
}

fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(json!({ "code": status.as_u16(), "message": message })),
    )
        .into_response()
}

fn query(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

fn decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&segment[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The content of the multipart `file_upload` part and its file name.
fn multipart(headers: &HeaderMap, body: &[u8]) -> Option<(String, String)> {
    let content_type = headers.get("content-type")?.to_str().ok()?;
    let boundary = content_type.split("boundary=").nth(1)?.trim_matches('"');
    let text = String::from_utf8_lossy(body);
    let delimiter = format!("--{boundary}");
    for part in text.split(&delimiter) {
        let Some((head, content)) = part.split_once("\r\n\r\n") else {
            continue;
        };
        if !head.contains("name=\"file_upload\"") {
            continue;
        }
        let name = head
            .split("filename=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("")
            .to_owned();
        let content = content.strip_suffix("\r\n").unwrap_or(content).to_owned();
        return Some((name, content));
    }
    None
}

fn reload(s: &mut DpState, previous_raw: String) -> String {
    s.next_id += 1;
    let id = format!("2026-11-22-{}", s.next_id);
    if s.faults.failing_reloads > 0 {
        s.faults.failing_reloads -= 1;
        // HAProxy refused it: the old config stays.
        s.raw = previous_raw;
        s.version += 1;
        s.reloads.insert(
            id.clone(),
            (
                "failed".to_owned(),
                "[ALERT] config : parsing [haproxy.cfg:3]: unknown keyword".to_owned(),
                s.faults.reload_polls,
            ),
        );
    } else {
        load(s);
        s.reloads.insert(
            id.clone(),
            ("succeeded".to_owned(), String::new(), s.faults.reload_polls),
        );
    }
    id
}

fn accepted(id: String, body: Value) -> Response {
    let mut response = (StatusCode::ACCEPTED, axum::Json(body)).into_response();
    response
        .headers_mut()
        .insert("Reload-ID", id.parse().unwrap());
    response
}

async fn handle(
    State(state): State<Arc<Mutex<DpState>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let delay = {
        let mut s = state.lock().unwrap();
        s.log.push(format!(
            "{method} {}{}",
            uri.path(),
            uri.query().map(|q| format!("?{q}")).unwrap_or_default()
        ));
        s.seen.send_replace(s.log.len());
        s.faults.delay
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
    );
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(expected.as_str()) {
        return error(StatusCode::UNAUTHORIZED, "authentication failed");
    }
    let mut s = state.lock().unwrap();
    if s.faults.unavailable > 0 {
        s.faults.unavailable -= 1;
        return error(StatusCode::SERVICE_UNAVAILABLE, "try again");
    }
    let q = query(&uri);
    let skip_reload = q.get("skip_reload").is_some_and(|v| v == "true");
    let path: Vec<String> = uri
        .path()
        .trim_start_matches("/v3/")
        .split('/')
        .map(decode)
        .collect();
    let path: Vec<&str> = path.iter().map(String::as_str).collect();
    let text = String::from_utf8_lossy(&body).into_owned();
    // Versioned writes.
    if let Some(version) = q.get("version") {
        if s.faults.conflicts > 0 {
            s.faults.conflicts -= 1;
            s.version += 1;
            return error(StatusCode::CONFLICT, "version mismatch");
        }
        if version.parse::<i64>().ok() != Some(s.version) {
            return error(StatusCode::CONFLICT, "version mismatch");
        }
    }
    match (method.as_str(), path.as_slice()) {
        ("GET", ["info"]) => axum::Json(json!({
            "api": { "version": "v3.0.0 test", "build_date": "2026-01-01T00:00:00Z" },
            "system": { "hostname": "test" }
        }))
        .into_response(),
        // As the Data Plane API v3 answers: one entry per HAProxy process.
        ("GET", ["services", "haproxy", "runtime", "info"]) => axum::Json(json!([
            { "info": { "version": "3.2.4-1", "release_date": "2025/08/20", "pid": 7 }, "runtimeAPI": "/run/haproxy/admin.sock" }
        ]))
        .into_response(),
        ("GET", ["services", "haproxy", "configuration", "version"]) => {
            axum::Json(json!(s.version)).into_response()
        }
        ("GET", ["services", "haproxy", "configuration", "raw"]) => {
            let mut response = s.raw.clone().into_response();
            response.headers_mut().insert(
                "Configuration-Version",
                s.version.to_string().parse().unwrap(),
            );
            response
        }
        ("POST", ["services", "haproxy", "configuration", "raw"]) => {
            if !q.contains_key("version") {
                return error(StatusCode::BAD_REQUEST, "version or transaction required");
            }
            let previous = std::mem::replace(&mut s.raw, text.clone());
            s.version += 1;
            if skip_reload {
                (StatusCode::CREATED, text).into_response()
            } else {
                let id = reload(&mut s, previous);
                let mut response = (StatusCode::ACCEPTED, text).into_response();
                response
                    .headers_mut()
                    .insert("Reload-ID", id.parse().unwrap());
                response
            }
        }
        ("GET", ["services", "haproxy", "reloads", id]) => {
            let Some(entry) = s.reloads.get_mut(*id) else {
                return error(StatusCode::NOT_FOUND, "no such reload");
            };
            let status = if entry.2 > 0 {
                entry.2 -= 1;
                "in_progress".to_owned()
            } else {
                entry.0.clone()
            };
            let mut body = json!({ "id": id, "status": status, "reload_timestamp": 1_700_000_000 });
            if status == "failed" {
                body["response"] = json!(entry.1);
            }
            axum::Json(body).into_response()
        }
        (
            m,
            [
                "services",
                "haproxy",
                "runtime",
                "backends",
                backend,
                "servers",
                rest @ ..,
            ],
        ) => {
            let backend = (*backend).to_owned();
            match (m, rest) {
                ("POST", []) => {
                    if s.faults.refuse_add_server {
                        return error(StatusCode::BAD_REQUEST, "add server refused");
                    }
                    let v: Value = serde_json::from_str(&text).unwrap_or_default();
                    let name = v["name"].as_str().unwrap_or_default().to_owned();
                    let key = (backend, name);
                    if s.servers.contains_key(&key) {
                        return error(StatusCode::CONFLICT, "server exists");
                    }
                    s.servers.insert(
                        key,
                        Server {
                            address: v["address"].as_str().unwrap_or_default().to_owned(),
                            port: v["port"].as_u64().map(|p| p as u16),
                            weight: v["weight"].as_u64().unwrap_or(1) as u32,
                            admin_state: if v["maintenance"] == "enabled" {
                                "maint".into()
                            } else {
                                "ready".into()
                            },
                        },
                    );
                    (StatusCode::CREATED, axum::Json(v)).into_response()
                }
                (m, [name]) => {
                    let key = (backend.clone(), (*name).to_owned());
                    let Some(server) = s.servers.get_mut(&key) else {
                        return error(StatusCode::NOT_FOUND, "no such server");
                    };
                    match m {
                        "GET" => {}
                        "PUT" => {
                            let v: Value = serde_json::from_str(&text).unwrap_or_default();
                            if let Some(state) = v["admin_state"].as_str() {
                                server.admin_state = state.to_owned();
                            }
                        }
                        "DELETE" => {
                            if server.admin_state != "maint" {
                                return error(
                                    StatusCode::BAD_REQUEST,
                                    "server must be in maintenance",
                                );
                            }
                            s.servers.remove(&key);
                            return StatusCode::NO_CONTENT.into_response();
                        }
                        _ => return error(StatusCode::METHOD_NOT_ALLOWED, "no"),
                    }
                    let server = s.servers[&key].clone();
                    axum::Json(json!({
                        "name": name, "id": "1", "address": server.address, "port": server.port,
                        "admin_state": server.admin_state, "operational_state": "up"
                    }))
                    .into_response()
                }
                _ => error(StatusCode::NOT_FOUND, "not found"),
            }
        }
        (
            m,
            [
                "services",
                "haproxy",
                "configuration",
                "backends",
                backend,
                "servers",
                name,
            ],
        ) => {
            let key = ((*backend).to_owned(), (*name).to_owned());
            let Some(server) = s.servers.get(&key).cloned() else {
                return error(StatusCode::NOT_FOUND, "no such server");
            };
            match m {
                "GET" => axum::Json(json!({
                    "name": name, "address": server.address, "port": server.port,
                    "weight": server.weight, "check": "enabled"
                }))
                .into_response(),
                "PUT" => {
                    let v: Value = serde_json::from_str(&text).unwrap_or_default();
                    let updated = Server {
                        address: v["address"].as_str().unwrap_or(&server.address).to_owned(),
                        port: v["port"].as_u64().map(|p| p as u16).or(server.port),
                        weight: v["weight"].as_u64().map_or(server.weight, |w| w as u32),
                        admin_state: server.admin_state.clone(),
                    };
                    // Rewrite the server line in the stored config (what the real API
                    // does), and apply at runtime without a reload.
                    let line_prefix = format!("server {name} ");
                    let raw: String = s
                        .raw
                        .lines()
                        .map(|l| {
                            if l.trim_start().starts_with(&line_prefix) {
                                format!(
                                    "    server {name} {}:{} weight {}",
                                    updated.address,
                                    updated.port.unwrap_or(0),
                                    updated.weight
                                )
                            } else {
                                l.to_owned()
                            }
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                        + "\n";
                    s.raw = raw;
                    s.version += 1;
                    s.servers.insert(key, updated);
                    axum::Json(v).into_response()
                }
                _ => error(StatusCode::METHOD_NOT_ALLOWED, "no"),
            }
        }
        (m, ["services", "haproxy", "storage", area, rest @ ..]) => {
            let area = (*area).to_owned();
            match (m, rest) {
                ("GET", []) => {
                    let list: Vec<Value> = s
                        .storage
                        .get(&area)
                        .map(|files| {
                            files
                                .keys()
                                .map(|n| json!({ "storage_name": n, "file": format!("/etc/haproxy/{area}/{n}"), "description": "" }))
                                .collect()
                        })
                        .unwrap_or_default();
                    axum::Json(Value::Array(list)).into_response()
                }
                ("POST", []) => {
                    let Some((name, content)) = multipart(&headers, &body) else {
                        return error(StatusCode::BAD_REQUEST, "file_upload missing");
                    };
                    let files = s.storage.entry(area.clone()).or_default();
                    if files.contains_key(&name) {
                        return error(StatusCode::CONFLICT, "file exists");
                    }
                    files.insert(name.clone(), content);
                    let body = json!({ "storage_name": name });
                    if skip_reload {
                        (StatusCode::CREATED, axum::Json(body)).into_response()
                    } else {
                        let previous = s.raw.clone();
                        let id = reload(&mut s, previous);
                        accepted(id, body)
                    }
                }
                ("GET", [name]) => match s.storage.get(&area).and_then(|f| f.get(*name)) {
                    Some(content) => content.clone().into_response(),
                    None => error(StatusCode::NOT_FOUND, "no such file"),
                },
                ("PUT", [name]) => {
                    let content = if area == "general" {
                        match multipart(&headers, &body) {
                            Some((_, content)) => content,
                            None => return error(StatusCode::BAD_REQUEST, "file_upload missing"),
                        }
                    } else {
                        text.clone()
                    };
                    let files = s.storage.entry(area.clone()).or_default();
                    if !files.contains_key(*name) {
                        return error(StatusCode::NOT_FOUND, "no such file");
                    }
                    files.insert((*name).to_owned(), content);
                    let body = json!({ "storage_name": name });
                    if skip_reload {
                        axum::Json(body).into_response()
                    } else {
                        let previous = s.raw.clone();
                        let id = reload(&mut s, previous);
                        accepted(id, body)
                    }
                }
                ("DELETE", [name]) => {
                    match s.storage.get_mut(&area).and_then(|f| f.remove(*name)) {
                        Some(_) => StatusCode::NO_CONTENT.into_response(),
                        None => error(StatusCode::NOT_FOUND, "no such file"),
                    }
                }
                _ => error(StatusCode::NOT_FOUND, "not found"),
            }
        }
        (
            m,
            [
                "services",
                "haproxy",
                "runtime",
                "maps",
                map,
                "entries",
                rest @ ..,
            ],
        ) => {
            let map = (*map).to_owned();
            if !s.entries.contains_key(&map) {
                return error(StatusCode::NOT_FOUND, "map not loaded");
            }
            match (m, rest) {
                ("GET", []) => {
                    let list: Vec<Value> = s.entries[&map]
                        .iter()
                        .map(|(id, k, v)| json!({ "id": id, "key": k, "value": v }))
                        .collect();
                    axum::Json(Value::Array(list)).into_response()
                }
                ("POST", []) => {
                    let v: Value = serde_json::from_str(&text).unwrap_or_default();
                    s.next_id += 1;
                    let id = format!("0x{:x}", s.next_id);
                    let entry = (
                        id.clone(),
                        v["key"].as_str().unwrap_or_default().to_owned(),
                        v["value"].as_str().unwrap_or_default().to_owned(),
                    );
                    s.entries.get_mut(&map).unwrap().push(entry);
                    (
                        StatusCode::CREATED,
                        axum::Json(json!({"id": id, "key": v["key"], "value": v["value"]})),
                    )
                        .into_response()
                }
                ("PUT", [id]) => {
                    let v: Value = serde_json::from_str(&text).unwrap_or_default();
                    let entries = s.entries.get_mut(&map).unwrap();
                    match entries.iter_mut().find(|(i, ..)| i == id) {
                        Some(entry) => {
                            entry.2 = v["value"].as_str().unwrap_or_default().to_owned();
                            axum::Json(json!({"id": id, "key": entry.1, "value": entry.2}))
                                .into_response()
                        }
                        None => error(StatusCode::NOT_FOUND, "no such entry"),
                    }
                }
                ("DELETE", [id]) => {
                    let entries = s.entries.get_mut(&map).unwrap();
                    let before = entries.len();
                    entries.retain(|(i, ..)| i != id);
                    if entries.len() == before {
                        error(StatusCode::NOT_FOUND, "no such entry")
                    } else {
                        StatusCode::NO_CONTENT.into_response()
                    }
                }
                _ => error(StatusCode::NOT_FOUND, "not found"),
            }
        }
        _ => error(StatusCode::NOT_FOUND, "not found"),
    }
}
