//! The `watchedResources` section of the config file: one entry per resource name
//! that templates see as `resources.<name>`, each with exactly one source (`files`,
//! `kubernetes` or `http`), an `indexBy` and optional `ignoreFields`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hapwright_eventbus::config::{ByteSize, ConfigIssue, Duration};
use hapwright_eventbus::model::FieldPath;
use serde::{Deserialize, Serialize};

use crate::manifest::Filter;

/// `watchedResources`: every watched resource, by name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Config {
    /// Resources by name, in name order.
    pub resources: BTreeMap<String, WatchedResource>,
}

/// One watched resource.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WatchedResource {
    /// Manifest files on disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<FilesConfig>,
    /// Kubernetes objects from the API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesConfig>,
    /// A document downloaded over HTTP(S) at an interval (an allow list, a tenant
    /// list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpConfig>,
    /// For `files`: keep only objects with this `apiVersion`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// For `files`: keep only objects of this `kind`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The fields templates look objects up by (`fetch(key...)`, `get(key...)`), in
    /// order. Default: `[metadata.namespace, metadata.name]`.
    #[serde(default = "default_index_by")]
    pub index_by: Vec<FieldPath>,
    /// Fields removed from every stored object (e.g. `metadata.managedFields`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore_fields: Vec<FieldPath>,
    /// For `kubernetes`: the kind may be missing from the cluster (an experimental
    /// CRD). While the API server does not serve it, the resource is empty and the
    /// source `degraded` with the reason, instead of holding back the first render;
    /// when the kind appears, its objects are picked up.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// The default `indexBy`: namespace, then name.
pub fn default_index_by() -> Vec<FieldPath> {
    ["metadata.namespace", "metadata.name"]
        .into_iter()
        .map(|p| FieldPath::parse(p).expect("static path parses"))
        .collect()
}

/// The `files` source: a directory of manifests or a single manifest file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FilesConfig {
    /// A directory (non-recursive: `*.yaml`, `*.yml`, `*.json`, hidden files skipped)
    /// or one file. Relative paths resolve against the config file's directory.
    pub path: PathBuf,
    /// Files larger than this are rejected (the file's last good objects stay).
    #[serde(default = "FilesConfig::default_max_file_size")]
    pub max_file_size: ByteSize,
    /// Quiet time after the last change notification before the directory is read,
    /// so a burst of writes (an editor's save, a ConfigMap swap) is read once.
    #[serde(default = "FilesConfig::default_settle")]
    pub settle: Duration,
    /// Interval of the safety-net rescan that re-reads and hashes every file even
    /// without notifications. It publishes nothing when nothing changed.
    #[serde(default = "FilesConfig::default_rescan_interval")]
    pub rescan_interval: Duration,
}

impl FilesConfig {
    /// A config for `path` with every default.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            max_file_size: Self::default_max_file_size(),
            settle: Self::default_settle(),
            rescan_interval: Self::default_rescan_interval(),
        }
    }

    /// 10 MiB.
    pub fn default_max_file_size() -> ByteSize {
        ByteSize::mib(10)
    }

    /// 25 ms.
    pub fn default_settle() -> Duration {
        Duration::from_millis(25)
    }

    /// 60 s.
    pub fn default_rescan_interval() -> Duration {
        Duration::from_secs(60)
    }
}

/// The `kubernetes` source: objects of one kind from the API server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesConfig {
    /// API group and version (`v1`, `discovery.k8s.io/v1`).
    pub api_version: String,
    /// Kind (`Service`, `EndpointSlice`).
    pub kind: String,
    /// Namespaces to watch; empty means every namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Label selector (`app=web,tier!=db`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// Field selector (`metadata.name=web`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_selector: Option<String>,
}

/// The `http` source: a document fetched at an interval, turned into objects by
/// `format` (see [`crate::http`]). `Debug` and `Serialize` show the URL without
/// user information or query ([`crate::http::fetch::display_url`]).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpConfig {
    /// `http://` or `https://` URL. User information in it (`user:pass@`) and its
    /// query are never shown; put credentials in `headers` read from files instead.
    #[serde(serialize_with = "serialize_url")]
    pub url: String,
    /// Time between two fetches of a healthy source; also the longest backoff after
    /// errors.
    #[serde(default = "HttpConfig::default_interval")]
    pub interval: Duration,
    /// Request headers. A value is a literal string or `{ file: PATH }`, read before
    /// every request (a rotated token is picked up). Values are never shown.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, HeaderValue>,
    /// Limit for one whole request: connecting, the answer and its body.
    #[serde(default = "HttpConfig::default_timeout")]
    pub timeout: Duration,
    /// PEM file with the certificate authorities that sign the server's certificate,
    /// for servers with a private CA (added to the system roots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// How the body becomes objects.
    #[serde(default)]
    pub format: HttpFormat,
    /// Largest body accepted; reading stops past it and the fetch fails (the last
    /// content stays).
    #[serde(default = "HttpConfig::default_max_bytes")]
    pub max_bytes: ByteSize,
}

fn shown_url(url: &str) -> String {
    reqwest::Url::parse(url).map_or_else(
        |_| "<invalid URL>".to_owned(),
        |url| crate::http::fetch::display_url(&url),
    )
}

fn serialize_url<S: serde::Serializer>(url: &str, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&shown_url(url))
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("url", &shown_url(&self.url))
            .field("interval", &self.interval)
            .field("headers", &self.headers)
            .field("timeout", &self.timeout)
            .field("ca_file", &self.ca_file)
            .field("format", &self.format)
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

impl HttpConfig {
    /// A config for `url` with every default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            interval: Self::default_interval(),
            headers: BTreeMap::new(),
            timeout: Self::default_timeout(),
            ca_file: None,
            format: HttpFormat::default(),
            max_bytes: Self::default_max_bytes(),
        }
    }

    /// 60 s.
    pub fn default_interval() -> Duration {
        Duration::from_secs(60)
    }

    /// 10 s.
    pub fn default_timeout() -> Duration {
        Duration::from_secs(10)
    }

    /// 16 MiB.
    pub fn default_max_bytes() -> ByteSize {
        ByteSize::mib(16)
    }
}

/// The format of an `http` source's body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HttpFormat {
    /// A JSON array of objects (one object per element), or one JSON object.
    #[default]
    Json,
    /// Like `json`, written in YAML.
    Yaml,
    /// One object `{line: TEXT}` per non-empty line that does not start with `#`.
    Lines,
    /// One object `{text: BODY}`.
    Text,
}

impl HttpFormat {
    /// The name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Yaml => "yaml",
            Self::Lines => "lines",
            Self::Text => "text",
        }
    }
}

/// A request header value: literal, or read from a file (credentials). Neither form
/// is ever shown: `Debug` and `Serialize` hide the literal text.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum HeaderValue {
    /// The value as written.
    Literal(String),
    /// The trimmed content of a file, read before every request.
    File {
        /// The file; relative paths resolve against the config file's directory.
        file: PathBuf,
    },
}

impl std::fmt::Debug for HeaderValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Literal(_) => f.write_str("Literal(<redacted>)"),
            Self::File { file } => f.debug_struct("File").field("file", file).finish(),
        }
    }
}

impl Serialize for HeaderValue {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            Self::Literal(_) => serializer.serialize_str("<redacted>"),
            Self::File { file } => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("file", file)?;
                map.end()
            }
        }
    }
}

/// The source of a watched resource, once validated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Source<'a> {
    /// Manifest files.
    Files(&'a FilesConfig),
    /// Kubernetes objects.
    Kubernetes(&'a KubernetesConfig),
    /// A document fetched over HTTP.
    Http(&'a HttpConfig),
}

impl WatchedResource {
    /// The configured source; `None` when none or several are set (see
    /// [`Config::validate`]).
    pub fn source(&self) -> Option<Source<'_>> {
        match (&self.files, &self.kubernetes, &self.http) {
            (Some(files), None, None) => Some(Source::Files(files)),
            (None, Some(kubernetes), None) => Some(Source::Kubernetes(kubernetes)),
            (None, None, Some(http)) => Some(Source::Http(http)),
            _ => None,
        }
    }

    /// The filter every object of this resource passes before it is stored: its
    /// `apiVersion`, `kind` and `ignoreFields`. One constructor, so the `files` source,
    /// `hapwright render` and the fixtures of `hapwright test` keep and trim exactly
    /// the same objects.
    pub fn filter(&self) -> Filter {
        Filter {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            ignore_fields: self.ignore_fields.clone(),
        }
    }
}

impl Config {
    /// Semantic checks the types cannot express. Paths are relative to
    /// `watchedResources`.
    pub fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        for (name, resource) in &self.resources {
            let at = |field: &str| {
                if field.is_empty() {
                    name.clone()
                } else {
                    format!("{name}.{field}")
                }
            };
            if !valid_resource_name(name) {
                issues.push(ConfigIssue::new(
                    at(""),
                    "resource names start with a letter or `_` and contain only letters, \
                     digits, `_` and `-`",
                ));
            }
            let set: Vec<&str> = [
                ("files", resource.files.is_some()),
                ("kubernetes", resource.kubernetes.is_some()),
                ("http", resource.http.is_some()),
            ]
            .into_iter()
            .filter_map(|(name, set)| set.then_some(name))
            .collect();
            match set.as_slice() {
                [] => issues.push(ConfigIssue::new(
                    at(""),
                    "no source: set `files`, `kubernetes` or `http`",
                )),
                [_] => {}
                [first, second] => issues.push(ConfigIssue::new(
                    at(second),
                    format!("a resource has one source, but both `{first}` and `{second}` are set"),
                )),
                [.., last] => issues.push(ConfigIssue::new(
                    at(last),
                    "a resource has one source, but `files`, `kubernetes` and `http` are set",
                )),
            }
            if resource.kubernetes.is_some() || resource.http.is_some() {
                for (field, set) in [
                    ("apiVersion", resource.api_version.is_some()),
                    ("kind", resource.kind.is_some()),
                ] {
                    if set {
                        issues.push(ConfigIssue::new(
                            at(field),
                            format!(
                                "`{field}` here filters `files` sources; for `kubernetes` set it inside `kubernetes:`, `http` sources have no kinds"
                            ),
                        ));
                    }
                }
            }
            if resource.optional && resource.kubernetes.is_none() {
                issues.push(ConfigIssue::new(
                    at("optional"),
                    "`optional` applies to `kubernetes` sources (a kind the API server may \
                     not serve); `files` and `http` sources are always watched",
                ));
            }
            if resource.index_by.is_empty() {
                issues.push(ConfigIssue::new(
                    at("indexBy"),
                    "indexBy is empty: list at least one field path, or omit it to index by \
                     [metadata.namespace, metadata.name]",
                ));
            }
            if let Some(files) = &resource.files {
                if files.path.as_os_str().is_empty() {
                    issues.push(ConfigIssue::new(at("files.path"), "path is empty"));
                }
                if files.max_file_size.bytes() == 0 {
                    issues.push(ConfigIssue::new(
                        at("files.maxFileSize"),
                        "maxFileSize must be larger than 0",
                    ));
                }
                if files.rescan_interval.get() < std::time::Duration::from_secs(1) {
                    issues.push(ConfigIssue::new(
                        at("files.rescanInterval"),
                        "rescanInterval must be at least 1s",
                    ));
                }
            }
            if let Some(http) = &resource.http {
                http_issues(http, &mut |field, message| {
                    issues.push(ConfigIssue::new(at(&format!("http.{field}")), message));
                });
            }
            if let Some(kubernetes) = &resource.kubernetes {
                if kubernetes.api_version.trim().is_empty() {
                    issues.push(ConfigIssue::new(
                        at("kubernetes.apiVersion"),
                        "apiVersion is empty",
                    ));
                }
                if kubernetes.kind.trim().is_empty() {
                    issues.push(ConfigIssue::new(at("kubernetes.kind"), "kind is empty"));
                }
            }
        }
        issues
    }

    /// Makes relative `files.path`s, `http.caFile`s and header files absolute
    /// against `base` (the config file's directory).
    pub fn resolve_paths(&mut self, base: &Path) {
        let resolve = |path: &mut PathBuf| {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        };
        for resource in self.resources.values_mut() {
            if let Some(files) = &mut resource.files {
                resolve(&mut files.path);
            }
            if let Some(http) = &mut resource.http {
                if let Some(ca_file) = &mut http.ca_file {
                    resolve(ca_file);
                }
                for value in http.headers.values_mut() {
                    if let HeaderValue::File { file } = value {
                        resolve(file);
                    }
                }
            }
        }
    }
}

fn http_issues(http: &HttpConfig, issue: &mut dyn FnMut(&str, String)) {
    match reqwest::Url::parse(&http.url) {
        Ok(url) if url.scheme() == "http" || url.scheme() == "https" => {
            if http.ca_file.is_some() && url.scheme() != "https" {
                issue(
                    "caFile",
                    "caFile is set but the url is not https://".to_owned(),
                );
            }
        }
        Ok(url) => issue(
            "url",
            format!("the scheme is `{}`; use http:// or https://", url.scheme()),
        ),
        // The parser's message names no part of the URL, which may hold credentials.
        Err(error) => issue("url", format!("not a valid URL: {error}")),
    }
    if http.interval.get() < std::time::Duration::from_secs(1) {
        issue("interval", "interval must be at least 1s".to_owned());
    }
    if http.timeout.get().is_zero() {
        issue("timeout", "timeout must be larger than 0".to_owned());
    }
    if http.max_bytes.bytes() == 0 {
        issue("maxBytes", "maxBytes must be larger than 0".to_owned());
    }
    for (name, value) in &http.headers {
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
            issue(
                &format!("headers.{name}"),
                "not a valid HTTP header name".to_owned(),
            );
        }
        if let HeaderValue::Literal(text) = value
            && reqwest::header::HeaderValue::from_str(text).is_err()
        {
            issue(
                &format!("headers.{name}"),
                "the value has characters a header cannot carry (control characters or newlines)"
                    .to_owned(),
            );
        }
    }
}

fn valid_resource_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::{Limits, parse_typed};

    fn parse(text: &str) -> Config {
        parse_typed(text, "t.yaml", &Limits::default()).unwrap()
    }

    #[test]
    fn files_and_kubernetes_sources_parse_with_defaults() {
        let config = parse(
            r#"
services:
  files: { path: ./resources }
  kind: Service
endpoints:
  kubernetes: { apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, namespaces: [default], labelSelector: "app=web" }
  indexBy: ['metadata.labels.kubernetes\.io/service-name']
  ignoreFields: [metadata.managedFields]
"#,
        );
        let services = &config.resources["services"];
        let Some(Source::Files(files)) = services.source() else {
            panic!("files source expected");
        };
        assert_eq!(files.max_file_size, ByteSize::mib(10));
        assert_eq!(files.settle, Duration::from_millis(25));
        assert_eq!(services.index_by, default_index_by());
        let endpoints = &config.resources["endpoints"];
        assert!(
            matches!(endpoints.source(), Some(Source::Kubernetes(k)) if k.kind == "EndpointSlice")
        );
        assert_eq!(
            endpoints.index_by[0].as_str(),
            r"metadata.labels.kubernetes\.io/service-name"
        );
        assert!(config.validate().is_empty(), "{:?}", config.validate());
    }

    #[test]
    fn semantic_checks() {
        let config = parse(
            r#"
both:
  files: { path: a }
  kubernetes: { apiVersion: v1, kind: Service }
none:
  indexBy: []
kube:
  kubernetes: { apiVersion: v1, kind: Service }
  kind: Service
"bad name":
  files: { path: a, maxFileSize: 0 }
"#,
        );
        let issues: Vec<String> = config.validate().iter().map(ToString::to_string).collect();
        assert!(
            issues
                .iter()
                .any(|i| i.starts_with("both.kubernetes: a resource has one source")),
            "{issues:?}"
        );
        assert!(
            issues.iter().any(|i| i.starts_with("none: no source")),
            "{issues:?}"
        );
        assert!(
            issues
                .iter()
                .any(|i| i.starts_with("none.indexBy: indexBy is empty")),
            "{issues:?}"
        );
        assert!(
            issues.iter().any(|i| i.starts_with("kube.kind: ")),
            "{issues:?}"
        );
        assert!(
            issues
                .iter()
                .any(|i| i.starts_with("bad name: resource names")),
            "{issues:?}"
        );
        assert!(
            issues
                .iter()
                .any(|i| i.starts_with("bad name.files.maxFileSize")),
            "{issues:?}"
        );
    }

    #[test]
    fn relative_paths_resolve_against_the_base() {
        let mut config = parse("a: { files: { path: res } }\nb: { files: { path: /abs } }\n");
        config.resolve_paths(Path::new("/etc/hapwright"));
        assert_eq!(
            config.resources["a"].files.as_ref().unwrap().path,
            Path::new("/etc/hapwright/res")
        );
        assert_eq!(
            config.resources["b"].files.as_ref().unwrap().path,
            Path::new("/abs")
        );
    }

    #[test]
    fn bad_index_paths_are_parse_errors() {
        let err = parse_typed::<Config>(
            "a:\n  files: {path: x}\n  indexBy: ['a..b']\n",
            "t.yaml",
            &Limits::default(),
        )
        .unwrap_err();
        assert!(err.message.starts_with("a.indexBy[0]: "), "{err}");
        assert_eq!(err.location.unwrap().line, Some(3));
    }

    #[test]
    fn http_sources_parse_with_defaults_and_are_checked() {
        let config = parse(
            r#"
allow:
  http:
    url: https://user:pw@lists.example.test/allow.txt?key=abc
    format: lines
    caFile: ca.pem
    headers:
      Authorization: { file: token }
      X-Api-Key: literal-key-value
  indexBy: [line]
bad:
  http: { url: "ftp://x/", interval: 100ms, timeout: 0s, maxBytes: 0, caFile: ca.pem, headers: { "bad header": x } }
  kind: Service
"#,
        );
        let allow = &config.resources["allow"];
        let Some(Source::Http(http)) = allow.source() else {
            panic!("http source expected");
        };
        assert_eq!(http.format, HttpFormat::Lines);
        assert_eq!(http.interval, Duration::from_secs(60));
        assert_eq!(http.timeout, Duration::from_secs(10));
        assert_eq!(http.max_bytes, ByteSize::mib(16));
        // Neither the URL's credentials and query nor header values are shown.
        for shown in [format!("{http:?}"), serde_json::to_string(http).unwrap()] {
            for secret in ["pw", "key=abc", "literal-key-value"] {
                assert!(!shown.contains(secret), "{secret} in {shown}");
            }
            assert!(
                shown.contains("https://lists.example.test/allow.txt?…"),
                "{shown}"
            );
        }
        let issues: Vec<String> = config.validate().iter().map(ToString::to_string).collect();
        for expected in [
            "bad.http.url: the scheme is `ftp`",
            "bad.http.interval: interval must be at least 1s",
            "bad.http.timeout: ",
            "bad.http.maxBytes: ",
            "bad.http.headers.bad header: not a valid HTTP header name",
            "bad.kind: ",
        ] {
            assert!(
                issues.iter().any(|i| i.starts_with(expected)),
                "{expected} not in {issues:?}"
            );
        }
        assert!(!issues.iter().any(|i| i.starts_with("allow")), "{issues:?}");
        let mut config = config;
        config.resolve_paths(Path::new("/etc/hapwright"));
        let http = config.resources["allow"].http.as_ref().unwrap();
        assert_eq!(
            http.ca_file.as_deref(),
            Some(Path::new("/etc/hapwright/ca.pem"))
        );
        assert_eq!(
            http.headers["Authorization"],
            HeaderValue::File {
                file: "/etc/hapwright/token".into()
            }
        );
    }
}
