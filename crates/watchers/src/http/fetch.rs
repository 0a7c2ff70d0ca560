//! One conditional GET of an `http` source's URL, with its limits: the request
//! headers (read from files before each request), a private CA, `If-None-Match` /
//! `If-Modified-Since` from the last answer, a timeout for the whole exchange and a
//! body size limit enforced while streaming.

use std::path::PathBuf;

use hapwright_eventbus::config::{ByteSize, Duration, Secret};
use hapwright_eventbus::model::ContentHash;
use reqwest::StatusCode;
use reqwest::header::{self, HeaderMap, HeaderName};

use crate::config::{HeaderValue, HttpConfig};

/// Why a fetch failed. Every variant is retryable: the source keeps its last content,
/// reports the reason and tries again after a backoff. Messages never include header
/// values or the URL's credentials.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// `url` does not parse (the config check catches this first).
    #[error("url is not a valid URL: {0}")]
    UrlInvalid(String),
    /// A header file could not be read.
    #[error("cannot read the file {} of header {name}", path.display())]
    HeaderFileUnreadable {
        /// The header.
        name: String,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A header value (literal or from its file) is not a valid header value.
    #[error("the value of header {name} has characters a header cannot carry")]
    HeaderValueInvalid {
        /// The header.
        name: String,
    },
    /// `caFile` could not be read.
    #[error("cannot read caFile {}", path.display())]
    CaFileUnreadable {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// `caFile` holds no usable certificate.
    #[error("caFile {} holds no usable PEM certificate", path.display())]
    CaFileInvalid {
        /// The file.
        path: PathBuf,
    },
    /// The HTTP client could not be built (TLS setup).
    #[error("cannot set up the HTTP client")]
    ClientBuildFailed(#[source] reqwest::Error),
    /// No complete answer within `timeout`.
    #[error("no complete answer within {0} (timeout)")]
    TimedOut(Duration),
    /// Connecting, TLS or the HTTP exchange failed.
    #[error("request failed")]
    RequestFailed(#[source] reqwest::Error),
    /// The server answered with a status other than 200 or 304.
    #[error("the server answered {0}")]
    StatusRejected(StatusCode),
    /// The body is larger than `maxBytes`; reading stopped there.
    #[error("the body is larger than maxBytes ({0})")]
    BodyTooLarge(ByteSize),
    /// The connection broke while reading the body.
    #[error("reading the body failed")]
    BodyReadFailed(#[source] reqwest::Error),
}

impl FetchError {
    /// The message with every cause, `outer: inner: innermost`, for health reasons
    /// and logs.
    pub fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(error) = cause {
            let next = error.to_string();
            if !text.ends_with(&next) {
                text.push_str(": ");
                text.push_str(&next);
            }
            cause = error.source();
        }
        hapwright_eventbus::redact::global()
            .redact(&text)
            .into_owned()
    }
}

/// The outcome of a successful fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetched {
    /// `304 Not Modified`: the content of the last fetch is current.
    NotModified,
    /// `200` with the same bytes as the last fetch.
    Same,
    /// `200` with new content.
    Body {
        /// The bytes.
        bytes: Vec<u8>,
        /// Their SHA-256.
        hash: ContentHash,
    },
}

/// Fetches one URL again and again, remembering the validators (`ETag`,
/// `Last-Modified`) and the hash of the last body.
pub struct Fetcher {
    config: HttpConfig,
    url: reqwest::Url,
    display: String,
    client: Option<reqwest::Client>,
    etag: Option<header::HeaderValue>,
    last_modified: Option<header::HeaderValue>,
    last_hash: Option<ContentHash>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("url", &self.display)
            .finish()
    }
}

/// Header names whose literal values are secrets: registered with the process-wide
/// redactor, so they are hidden wherever they might show up.
fn sensitive(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "authorization",
        "cookie",
        "token",
        "key",
        "secret",
        "password",
        "auth",
    ]
    .iter()
    .any(|word| name.contains(word))
}

/// Registers a credential with the redactor: the whole value and, for
/// `Scheme credentials` (`Bearer abc…`), the credentials alone, which may show up
/// without the scheme.
fn register(value: &str) -> Secret {
    if let Some((_, credentials)) = value.split_once(' ') {
        drop(Secret::new(credentials.trim()));
    }
    Secret::new(value)
}

/// The URL as shown in logs, health and errors: no user information, and `?…` in
/// place of a query (which may carry an API key).
pub fn display_url(url: &reqwest::Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    let query = shown.query().is_some();
    shown.set_query(None);
    shown.set_fragment(None);
    let mut text = shown.to_string();
    if query {
        text.push_str("?…");
    }
    text
}

impl Fetcher {
    /// A fetcher for `config`. Registers the URL's password and literal values of
    /// credential headers with the redactor.
    ///
    /// # Errors
    ///
    /// [`FetchError::UrlInvalid`].
    pub fn new(config: &HttpConfig) -> Result<Self, FetchError> {
        let url = reqwest::Url::parse(&config.url)
            .map_err(|error| FetchError::UrlInvalid(error.to_string()))?;
        if let Some(password) = url.password() {
            drop(Secret::new(password));
        }
        for (name, value) in &config.headers {
            if let HeaderValue::Literal(text) = value
                && sensitive(name)
            {
                drop(register(text));
            }
        }
        Ok(Self {
            display: display_url(&url),
            config: config.clone(),
            url,
            client: None,
            etag: None,
            last_modified: None,
            last_hash: None,
        })
    }

    /// The URL as shown (see [`display_url`]).
    pub fn display(&self) -> &str {
        &self.display
    }

    fn client(&mut self) -> Result<reqwest::Client, FetchError> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let mut builder = reqwest::Client::builder()
            .timeout(self.config.timeout.get())
            .user_agent(concat!("hapwright/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &self.config.ca_file {
            let pem = std::fs::read(path).map_err(|source| FetchError::CaFileUnreadable {
                path: path.clone(),
                source,
            })?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem)
                .ok()
                .filter(|certificates| !certificates.is_empty())
                .ok_or_else(|| FetchError::CaFileInvalid { path: path.clone() })?;
            builder = builder.tls_certs_merge(certificates);
        }
        let client = builder.build().map_err(FetchError::ClientBuildFailed)?;
        self.client = Some(client.clone());
        Ok(client)
    }

    fn headers(&self) -> Result<HeaderMap, FetchError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &self.config.headers {
            let invalid = || FetchError::HeaderValueInvalid { name: name.clone() };
            let header_name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid())?;
            let mut header_value = match value {
                HeaderValue::Literal(text) => {
                    header::HeaderValue::from_str(text).map_err(|_| invalid())?
                }
                HeaderValue::File { file } => {
                    let text = std::fs::read_to_string(file).map_err(|source| {
                        FetchError::HeaderFileUnreadable {
                            name: name.clone(),
                            path: file.clone(),
                            source,
                        }
                    })?;
                    let secret = register(text.trim());
                    header::HeaderValue::from_str(secret.expose()).map_err(|_| invalid())?
                }
            };
            header_value.set_sensitive(true);
            headers.insert(header_name, header_value);
        }
        if let Some(etag) = &self.etag {
            headers.insert(header::IF_NONE_MATCH, etag.clone());
        }
        if let Some(last_modified) = &self.last_modified {
            headers.insert(header::IF_MODIFIED_SINCE, last_modified.clone());
        }
        Ok(headers)
    }

    /// One conditional GET.
    ///
    /// # Errors
    ///
    /// Any [`FetchError`]; the validators and last hash stay as they were.
    pub async fn fetch(&mut self) -> Result<Fetched, FetchError> {
        let timeout = self.config.timeout;
        match tokio::time::timeout(timeout.get(), self.exchange()).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::TimedOut(timeout)),
        }
    }

    async fn exchange(&mut self) -> Result<Fetched, FetchError> {
        let client = self.client()?;
        let headers = self.headers()?;
        let timeout = self.config.timeout;
        let request_failed = |error: reqwest::Error| {
            if error.is_timeout() {
                FetchError::TimedOut(timeout)
            } else {
                FetchError::RequestFailed(error.without_url())
            }
        };
        let mut response = client
            .get(self.url.clone())
            .headers(headers)
            .send()
            .await
            .map_err(request_failed)?;
        let status = response.status();
        if status == StatusCode::NOT_MODIFIED {
            return Ok(Fetched::NotModified);
        }
        if status != StatusCode::OK {
            return Err(FetchError::StatusRejected(status));
        }
        let limit = self.config.max_bytes;
        if response
            .content_length()
            .is_some_and(|len| len > limit.bytes())
        {
            return Err(FetchError::BodyTooLarge(limit));
        }
        let etag = response.headers().get(header::ETAG).cloned();
        let last_modified = response.headers().get(header::LAST_MODIFIED).cloned();
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|error| {
            if error.is_timeout() {
                FetchError::TimedOut(timeout)
            } else {
                FetchError::BodyReadFailed(error.without_url())
            }
        })? {
            if (bytes.len() + chunk.len()) as u64 > limit.bytes() {
                return Err(FetchError::BodyTooLarge(limit));
            }
            bytes.extend_from_slice(&chunk);
        }
        self.etag = etag;
        self.last_modified = last_modified;
        let hash = ContentHash::of(&bytes);
        if self.last_hash == Some(hash) {
            return Ok(Fetched::Same);
        }
        self.last_hash = Some(hash);
        Ok(Fetched::Body { bytes, hash })
    }
}
