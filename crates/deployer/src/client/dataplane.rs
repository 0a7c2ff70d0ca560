//! A client for the HAProxy Data Plane API v3 (the public OpenAPI specification's
//! request and response shapes): configuration version, raw configuration with
//! optimistic versioning, reload tracking, runtime servers, maps (storage and runtime
//! entries), SSL certificates and general files through storage.
//!
//! Every request carries basic auth and a timeout. Transport errors, timeouts and
//! `5xx` answers are retried with exponential backoff ([`Settings::attempts`]); a
//! `409 Conflict` on a versioned write re-reads the configuration version and tries
//! again ([`Settings::conflict_retries`]).

use std::path::Path;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use hapwright_eventbus::config::Secret;
use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Timeouts and retries of one Data Plane API client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Deadline of one HTTP request.
    pub request_timeout: Duration,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Attempts per request for transport errors, timeouts and `5xx` answers.
    pub attempts: usize,
    /// First backoff delay (doubles up to `max_delay`).
    pub min_delay: Duration,
    /// Longest backoff delay.
    pub max_delay: Duration,
    /// Versioned writes retried after a `409 Conflict`.
    pub conflict_retries: usize,
    /// Bound on waiting for one reload to finish.
    pub reload_timeout: Duration,
    /// Interval of reload status polls.
    pub poll_interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            attempts: 3,
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            conflict_retries: 5,
            reload_timeout: Duration::from_secs(30),
            poll_interval: Duration::from_millis(100),
        }
    }
}

/// Where a Data Plane API listens and how to log in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Base URL without the `/v3` prefix (`http://10.0.0.2:5555`).
    pub url: String,
    /// Basic-auth user.
    pub username: String,
    /// Basic-auth password (from `passwordFile`).
    pub password: Secret,
    /// PEM bundle of CAs to trust for an `https` URL (in addition to the system's).
    pub ca_file: Option<std::path::PathBuf>,
}

/// Why a Data Plane API call failed.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// The HTTP client could not be built (e.g. an unreadable CA file).
    #[error("cannot set up the Data Plane API client: {0}")]
    Setup(String),
    /// The request did not get an answer (connection refused, timeout, TLS).
    #[error("{method} {path} failed")]
    Transport {
        /// HTTP method.
        method: Method,
        /// Path below `/v3`.
        path: String,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// The API answered with an error status.
    #[error("{method} {path} answered {status}: {message}")]
    Status {
        /// HTTP method.
        method: Method,
        /// Path below `/v3`.
        path: String,
        /// The status code.
        status: u16,
        /// The error message (`message` of the v3 error body, or the body).
        message: String,
    },
    /// A versioned write kept conflicting with concurrent changes.
    #[error("{path}: configuration version conflict persisted after {attempts} attempts")]
    Conflict {
        /// Path below `/v3`.
        path: String,
        /// Attempts made.
        attempts: usize,
    },
    /// A reload HAProxy refused.
    #[error("reload {id} failed: {response}")]
    ReloadFailed {
        /// The reload id.
        id: String,
        /// HAProxy's output as reported by the API.
        response: String,
    },
    /// A reload did not finish in time.
    #[error("reload {id} not finished within {after:?}")]
    ReloadTimeout {
        /// The reload id.
        id: String,
        /// The bound.
        after: Duration,
    },
    /// The answer did not have the expected shape.
    #[error("{path}: unexpected answer: {detail}")]
    Decode {
        /// Path below `/v3`.
        path: String,
        /// What was wrong.
        detail: String,
    },
}

impl DataplaneError {
    fn retryable(&self) -> bool {
        match self {
            DataplaneError::Transport { .. } => true,
            DataplaneError::Status { status, .. } => *status >= 500,
            _ => false,
        }
    }

    /// The HTTP status of an error answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            DataplaneError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// `GET /v3/services/haproxy/reloads/{id}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reload {
    /// Reload id.
    pub id: String,
    /// `in_progress`, `succeeded` or `failed`.
    pub status: String,
    /// HAProxy's output of a failed reload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    /// Unix time of the reload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reload_timestamp: Option<i64>,
}

/// A runtime server (`/v3/services/haproxy/runtime/backends/{parent}/servers/{name}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeServer {
    /// Server name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Server id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Address (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Port (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// `ready`, `maint` or `drain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_state: Option<String>,
    /// `up`, `down` or `stopping`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operational_state: Option<String>,
}

/// The body of `POST /v3/services/haproxy/runtime/backends/{parent}/servers`
/// (`runtime_add_server`; only the fields hapwright sets).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeAddServer {
    /// Server name.
    pub name: String,
    /// IP address or host name.
    pub address: String,
    /// Port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// `enabled` to health-check the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    /// `enabled` to add it in maintenance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<String>,
    /// Check interval in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inter: Option<u64>,
    /// Successful checks to be up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rise: Option<u32>,
    /// Failed checks to be down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fall: Option<u32>,
    /// Connection limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maxconn: Option<u32>,
}

/// One runtime map entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapEntry {
    /// Entry id (the pointer HAProxy reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Key.
    pub key: String,
    /// Value.
    pub value: String,
}

/// One file in storage (`/v3/services/haproxy/storage/{maps,ssl_certificates,general}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFile {
    /// Name in storage.
    pub storage_name: String,
    /// Path on the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// The storage areas hapwright writes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// `storage/maps` (`maps/<name>`).
    Maps,
    /// `storage/ssl_certificates` (`certs/<name>`).
    Certificates,
    /// `storage/general` (`files/<name>`).
    General,
}

impl Storage {
    fn path(self) -> &'static str {
        match self {
            Storage::Maps => "/services/haproxy/storage/maps",
            Storage::Certificates => "/services/haproxy/storage/ssl_certificates",
            Storage::General => "/services/haproxy/storage/general",
        }
    }
}

#[derive(Deserialize)]
struct ErrorBody {
    message: Option<String>,
}

/// Encodes one path segment.
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A body that can be sent again on a retry.
#[derive(Clone, Debug)]
enum Body {
    None,
    Json(serde_json::Value),
    Text(String),
    /// Multipart `file_upload` with this file name and content.
    Upload(String, String),
}

/// The Data Plane API v3 client of one instance.
#[derive(Clone, Debug)]
pub struct DataplaneClient {
    http: reqwest::Client,
    base: String,
    username: String,
    password: Secret,
    settings: Settings,
}

impl DataplaneClient {
    /// A client for `endpoint`. Fails when the CA file cannot be read or parsed.
    pub fn new(endpoint: &Endpoint, settings: Settings) -> Result<Self, DataplaneError> {
        Self::with_resolve(endpoint, settings, &[])
    }

    /// A client for `endpoint` that connects to a fixed address for each host name in
    /// `resolve` instead of asking DNS (like curl's `--resolve`). The URL keeps the
    /// name, so TLS sends it and verifies the certificate against it: this is how a
    /// pod addressed by IP is checked against a DNS name in its certificate.
    pub fn with_resolve(
        endpoint: &Endpoint,
        settings: Settings,
        resolve: &[(String, std::net::SocketAddr)],
    ) -> Result<Self, DataplaneError> {
        let mut builder = reqwest::Client::builder()
            .timeout(settings.request_timeout)
            .connect_timeout(settings.connect_timeout)
            .user_agent(concat!("hapwright/", env!("CARGO_PKG_VERSION")));
        for (host, address) in resolve {
            builder = builder.resolve(host, *address);
        }
        if let Some(ca) = &endpoint.ca_file {
            for cert in read_ca(ca)? {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder
            .build()
            .map_err(|e| DataplaneError::Setup(e.to_string()))?;
        Ok(Self {
            http,
            base: format!("{}/v3", endpoint.url.trim_end_matches('/')),
            username: endpoint.username.clone(),
            password: endpoint.password.clone(),
            settings,
        })
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    async fn send_once(
        &self,
        method: &Method,
        path: &str,
        query: &[(&str, String)],
        body: &Body,
    ) -> Result<reqwest::Response, DataplaneError> {
        let mut url = format!("{}{path}", self.base);
        for (index, (key, value)) in query.iter().enumerate() {
            url.push(if index == 0 { '?' } else { '&' });
            url.push_str(&segment(key));
            url.push('=');
            url.push_str(&segment(value));
        }
        let mut request = self
            .http
            .request(method.clone(), url)
            .basic_auth(&self.username, Some(self.password.expose()));
        request = match body {
            Body::None => request,
            Body::Json(value) => request.json(value),
            Body::Text(text) => request
                .header(reqwest::header::CONTENT_TYPE, "text/plain")
                .body(text.clone()),
            Body::Upload(name, content) => {
                let part = reqwest::multipart::Part::text(content.clone())
                    .file_name(name.clone())
                    .mime_str("application/octet-stream")
                    .map_err(|e| DataplaneError::Setup(e.to_string()))?;
                request.multipart(reqwest::multipart::Form::new().part("file_upload", part))
            }
        };
        let response = request
            .send()
            .await
            .map_err(|source| DataplaneError::Transport {
                method: method.clone(),
                path: path.to_owned(),
                source,
            })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        Err(DataplaneError::Status {
            method: method.clone(),
            path: path.to_owned(),
            status,
            message: error_message(&text),
        })
    }

    /// One request, retried with backoff on transport errors, timeouts and `5xx`.
    async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Body,
    ) -> Result<reqwest::Response, DataplaneError> {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(self.settings.min_delay)
            .with_max_delay(self.settings.max_delay)
            .with_max_times(self.settings.attempts.saturating_sub(1));
        (|| self.send_once(&method, path, query, &body))
            .retry(backoff)
            .when(DataplaneError::retryable)
            .notify(|error, delay| {
                tracing::debug!(%error, ?delay, "Data Plane API request failed; retrying");
            })
            .await
    }

    async fn json<T: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        response: reqwest::Response,
    ) -> Result<T, DataplaneError> {
        let text = response.text().await.map_err(|e| DataplaneError::Decode {
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
        decode(path, &text)
    }

    /// `GET /v3/info`: API and system information.
    pub async fn info(&self) -> Result<serde_json::Value, DataplaneError> {
        let response = self.send(Method::GET, "/info", &[], Body::None).await?;
        self.json("/info", response).await
    }

    /// `GET /v3/services/haproxy/runtime/info`: the HAProxy process's `show info`
    /// (its `version` among them).
    pub async fn runtime_info(&self) -> Result<serde_json::Value, DataplaneError> {
        let path = "/services/haproxy/runtime/info";
        let response = self.send(Method::GET, path, &[], Body::None).await?;
        self.json(path, response).await
    }

    /// `GET /v3/services/haproxy/configuration/version`.
    pub async fn configuration_version(&self) -> Result<i64, DataplaneError> {
        let path = "/services/haproxy/configuration/version";
        let response = self.send(Method::GET, path, &[], Body::None).await?;
        self.json(path, response).await
    }

    /// `GET /v3/services/haproxy/configuration/raw`: the configuration file and its
    /// version (the `Configuration-Version` header, or `_version` of a JSON answer).
    pub async fn raw_configuration(&self) -> Result<(i64, String), DataplaneError> {
        let path = "/services/haproxy/configuration/raw";
        let response = self.send(Method::GET, path, &[], Body::None).await?;
        let header = response
            .headers()
            .get("Configuration-Version")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<i64>().ok());
        let text = response.text().await.map_err(|e| DataplaneError::Decode {
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
        let (version, text) = raw_configuration_answer(text, header);
        let version = match version {
            Some(version) => version,
            None => self.configuration_version().await?,
        };
        Ok((version, text))
    }

    /// A write with the `version` query parameter, retried on `409 Conflict` with a
    /// freshly read version. Returns the answer's `Reload-ID`, if any.
    async fn versioned(
        &self,
        method: Method,
        path: &str,
        extra: &[(&str, String)],
        body: Body,
    ) -> Result<Option<String>, DataplaneError> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let version = self.configuration_version().await?;
            let mut query: Vec<(&str, String)> = vec![("version", version.to_string())];
            query.extend(extra.iter().cloned());
            match self.send(method.clone(), path, &query, body.clone()).await {
                Ok(response) => return Ok(reload_id(&response)),
                Err(error) if error.status() == Some(409) => {
                    if attempts > self.settings.conflict_retries {
                        return Err(DataplaneError::Conflict {
                            path: path.to_owned(),
                            attempts,
                        });
                    }
                    tracing::debug!(path, attempts, "Configuration version conflict; retrying");
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// `POST /v3/services/haproxy/configuration/raw` (text/plain) with the current
    /// version; `skip_reload` only stores the file. Returns the reload id of a
    /// reload the API queued (`202`).
    pub async fn push_raw(
        &self,
        config: &str,
        skip_reload: bool,
    ) -> Result<Option<String>, DataplaneError> {
        self.versioned(
            Method::POST,
            "/services/haproxy/configuration/raw",
            &[("skip_reload", skip_reload.to_string())],
            Body::Text(config.to_owned()),
        )
        .await
    }

    /// `GET /v3/services/haproxy/reloads/{id}`.
    pub async fn reload(&self, id: &str) -> Result<Reload, DataplaneError> {
        let path = format!("/services/haproxy/reloads/{}", segment(id));
        let response = self.send(Method::GET, &path, &[], Body::None).await?;
        self.json(&path, response).await
    }

    /// Polls a reload until it `succeeded` (ok) or `failed` (error with HAProxy's
    /// output), bounded by [`Settings::reload_timeout`].
    pub async fn wait_reload(&self, id: &str) -> Result<Reload, DataplaneError> {
        let deadline = Instant::now() + self.settings.reload_timeout;
        loop {
            let reload = self.reload(id).await?;
            match reload.status.as_str() {
                "succeeded" => return Ok(reload),
                "failed" => {
                    return Err(DataplaneError::ReloadFailed {
                        id: id.to_owned(),
                        response: reload.response.unwrap_or_default(),
                    });
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(DataplaneError::ReloadTimeout {
                    id: id.to_owned(),
                    after: self.settings.reload_timeout,
                });
            }
            tokio::time::sleep(self.settings.poll_interval).await;
        }
    }

    /// `PUT /v3/services/haproxy/runtime/backends/{backend}/servers/{name}` with an
    /// `admin_state` (`ready`, `maint`, `drain`).
    pub async fn set_server_admin_state(
        &self,
        backend: &str,
        name: &str,
        state: &str,
    ) -> Result<RuntimeServer, DataplaneError> {
        let path = runtime_server_path(backend, Some(name));
        let body = serde_json::json!({ "admin_state": state });
        let response = self.send(Method::PUT, &path, &[], Body::Json(body)).await?;
        self.json(&path, response).await
    }

    /// `POST /v3/services/haproxy/runtime/backends/{backend}/servers`.
    pub async fn add_runtime_server(
        &self,
        backend: &str,
        server: &RuntimeAddServer,
    ) -> Result<(), DataplaneError> {
        let path = runtime_server_path(backend, None);
        let body = serde_json::to_value(server).map_err(|e| DataplaneError::Decode {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        self.send(Method::POST, &path, &[], Body::Json(body))
            .await
            .map(drop)
    }

    /// `DELETE /v3/services/haproxy/runtime/backends/{backend}/servers/{name}`.
    pub async fn delete_runtime_server(
        &self,
        backend: &str,
        name: &str,
    ) -> Result<(), DataplaneError> {
        let path = runtime_server_path(backend, Some(name));
        self.send(Method::DELETE, &path, &[], Body::None)
            .await
            .map(drop)
    }

    /// `GET /v3/services/haproxy/configuration/backends/{backend}/servers/{name}`:
    /// the server as configured (a JSON object of the `server` model).
    pub async fn configured_server(
        &self,
        backend: &str,
        name: &str,
    ) -> Result<serde_json::Value, DataplaneError> {
        let path = configured_server_path(backend, name);
        let response = self.send(Method::GET, &path, &[], Body::None).await?;
        let value: serde_json::Value = self.json(&path, response).await?;
        // Some answers wrap the object: {"_version": N, "data": {...}}.
        Ok(match value {
            serde_json::Value::Object(mut object) if object.contains_key("data") => {
                object.remove("data").unwrap_or_default()
            }
            other => other,
        })
    }

    /// `PUT /v3/services/haproxy/configuration/backends/{backend}/servers/{name}`
    /// with the current version. The API applies address, port and weight changes
    /// at runtime (`200`) or queues a reload (`202`, whose id is returned).
    pub async fn replace_configured_server(
        &self,
        backend: &str,
        name: &str,
        server: serde_json::Value,
    ) -> Result<Option<String>, DataplaneError> {
        let path = configured_server_path(backend, name);
        self.versioned(Method::PUT, &path, &[], Body::Json(server))
            .await
    }

    /// `GET /v3/services/haproxy/storage/{area}`.
    pub async fn stored_files(&self, area: Storage) -> Result<Vec<StoredFile>, DataplaneError> {
        let response = self.send(Method::GET, area.path(), &[], Body::None).await?;
        self.json(area.path(), response).await
    }

    /// Creates (`POST` multipart `file_upload`) or replaces (`PUT`) a file in
    /// storage. `skip_reload` asks the API not to reload for it. Returns the id of a
    /// reload the API queued.
    pub async fn put_stored_file(
        &self,
        area: Storage,
        name: &str,
        content: &str,
        exists: bool,
        skip_reload: bool,
    ) -> Result<Option<String>, DataplaneError> {
        let query = [("skip_reload", skip_reload.to_string())];
        let response = if exists {
            let path = format!("{}/{}", area.path(), segment(name));
            let body = match area {
                Storage::General => Body::Upload(name.to_owned(), content.to_owned()),
                Storage::Maps | Storage::Certificates => Body::Text(content.to_owned()),
            };
            self.send(Method::PUT, &path, &query, body).await?
        } else {
            self.send(
                Method::POST,
                area.path(),
                &query,
                Body::Upload(name.to_owned(), content.to_owned()),
            )
            .await?
        };
        Ok(reload_id(&response))
    }

    /// `GET /v3/services/haproxy/runtime/maps/{name}/entries`.
    pub async fn map_entries(&self, map: &str) -> Result<Vec<MapEntry>, DataplaneError> {
        let path = map_entries_path(map, None);
        let response = self.send(Method::GET, &path, &[], Body::None).await?;
        self.json(&path, response).await
    }

    /// `POST /v3/services/haproxy/runtime/maps/{name}/entries`.
    pub async fn add_map_entry(
        &self,
        map: &str,
        key: &str,
        value: &str,
    ) -> Result<(), DataplaneError> {
        let path = map_entries_path(map, None);
        let body = serde_json::json!({ "key": key, "value": value });
        self.send(Method::POST, &path, &[], Body::Json(body))
            .await
            .map(drop)
    }

    /// `PUT /v3/services/haproxy/runtime/maps/{name}/entries/{id}`.
    pub async fn replace_map_entry(
        &self,
        map: &str,
        id: &str,
        value: &str,
    ) -> Result<(), DataplaneError> {
        let path = map_entries_path(map, Some(id));
        let body = serde_json::json!({ "value": value });
        self.send(Method::PUT, &path, &[], Body::Json(body))
            .await
            .map(drop)
    }

    /// `DELETE /v3/services/haproxy/runtime/maps/{name}/entries/{id}`.
    pub async fn delete_map_entry(&self, map: &str, id: &str) -> Result<(), DataplaneError> {
        let path = map_entries_path(map, Some(id));
        self.send(Method::DELETE, &path, &[], Body::None)
            .await
            .map(drop)
    }
}

/// Decodes a JSON answer of the Data Plane API; the error names the path and quotes
/// the start of the answer.
///
/// # Errors
///
/// [`DataplaneError::Decode`] when the answer is not the JSON `T` reads.
pub fn decode<T: for<'de> Deserialize<'de>>(path: &str, text: &str) -> Result<T, DataplaneError> {
    serde_json::from_str(text).map_err(|e| DataplaneError::Decode {
        path: path.to_owned(),
        detail: format!("{e} in {}", text.chars().take(200).collect::<String>()),
    })
}

/// The message of an error answer: its JSON `message` field, or the whole text.
pub fn error_message(text: &str) -> String {
    serde_json::from_str::<ErrorBody>(text)
        .ok()
        .and_then(|b| b.message)
        .as_deref()
        .unwrap_or(text)
        .trim()
        .to_owned()
}

/// The configuration text of a `GET .../configuration/raw` answer and its version
/// when the answer gives one: older answers wrap the text as
/// `{"_version": N, "data": "..."}`, newer ones send it plain with the version in the
/// `Configuration-Version` header (`header`).
pub fn raw_configuration_answer(text: String, header: Option<i64>) -> (Option<i64>, String) {
    if let Ok(serde_json::Value::Object(object)) = serde_json::from_str(&text)
        && let Some(data) = object.get("data").and_then(|d| d.as_str())
    {
        let version = object
            .get("_version")
            .and_then(serde_json::Value::as_i64)
            .or(header);
        return (version, data.to_owned());
    }
    (header, text)
}

fn reload_id(response: &reqwest::Response) -> Option<String> {
    if response.status() != StatusCode::ACCEPTED {
        return None;
    }
    response
        .headers()
        .get("Reload-ID")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn runtime_server_path(backend: &str, name: Option<&str>) -> String {
    let mut path = format!(
        "/services/haproxy/runtime/backends/{}/servers",
        segment(backend)
    );
    if let Some(name) = name {
        path.push('/');
        path.push_str(&segment(name));
    }
    path
}

fn configured_server_path(backend: &str, name: &str) -> String {
    format!(
        "/services/haproxy/configuration/backends/{}/servers/{}",
        segment(backend),
        segment(name)
    )
}

fn map_entries_path(map: &str, id: Option<&str>) -> String {
    let mut path = format!("/services/haproxy/runtime/maps/{}/entries", segment(map));
    if let Some(id) = id {
        path.push('/');
        path.push_str(&segment(id));
    }
    path
}

fn read_ca(path: &Path) -> Result<Vec<reqwest::Certificate>, DataplaneError> {
    let pem = std::fs::read(path)
        .map_err(|e| DataplaneError::Setup(format!("cannot read {}: {e}", path.display())))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| DataplaneError::Setup(format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(DataplaneError::Setup(format!(
            "{} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_encoded() {
        assert_eq!(segment("be_app"), "be_app");
        assert_eq!(segment("a b/c"), "a%20b%2Fc");
        assert_eq!(
            map_entries_path("hosts.map", Some("0x1")),
            "/services/haproxy/runtime/maps/hosts.map/entries/0x1"
        );
    }

    #[test]
    fn an_unreadable_ca_file_is_a_setup_error() {
        let endpoint = Endpoint {
            url: "https://127.0.0.1:1".into(),
            username: "u".into(),
            password: Secret::new("p"),
            ca_file: Some("/nonexistent/ca.pem".into()),
        };
        let error = DataplaneClient::new(&endpoint, Settings::default()).unwrap_err();
        assert!(matches!(error, DataplaneError::Setup(_)), "{error}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("ca.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let endpoint = Endpoint {
            ca_file: Some(empty),
            ..endpoint
        };
        assert!(matches!(
            DataplaneClient::new(&endpoint, Settings::default()),
            Err(DataplaneError::Setup(_))
        ));
    }
}
