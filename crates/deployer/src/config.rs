//! The `haproxy` section of the config file (the HAProxy binary, static deploy
//! targets, dynamic discovery) and the deploy [`Timings`] of the `controller` section.
//!
//! Passwords are never in the config file itself: `dataplane.passwordFile` names a
//! file that [`Config::load_secrets`] reads into a [`Secret`], which prints as
//! `<redacted>` in `Debug`, logs and `/debug/config`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use hapwright_eventbus::config::{ConfigIssue, Duration, Secret};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The `haproxy` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The HAProxy binary used for phase-2 validation (`haproxy -c`) and for managed
    /// instances. A bare name is looked up on `PATH`.
    #[serde(default = "default_binary")]
    pub binary: PathBuf,
    /// Static deploy targets.
    #[serde(default)]
    pub instances: Vec<Instance>,
    /// Dynamic deploy targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<Discovery>,
    /// Whether phase 2 may pass by structural equivalence: a render that differs
    /// from the last one that passed `haproxy -c` only in server addresses, ports,
    /// weights or string-map entries is not given to `haproxy -c` again, which keeps
    /// HAProxy's start-up time off the path of endpoint changes. `false` runs
    /// `haproxy -c` for every render.
    #[serde(default = "default_true")]
    pub phase2_equivalence: bool,
    /// How long a managed HAProxy drains when hapwright stops it (soft stop: the
    /// requests in flight finish) before the connections still open are closed.
    #[serde(default = "default_hard_stop_after")]
    pub hard_stop_after: Duration,
    /// Whether added and removed backends of the form `backend NAME from PROFILE`
    /// (only `server` lines in the body) are deployed through the runtime API
    /// (`add backend`, `publish backend`, `unpublish backend`, `del backend`) instead of
    /// a reload. Needs HAProxy 3.4 or later on the socket instances; on an older line
    /// each instance warns once and reloads.
    #[serde(default)]
    pub dynamic_backends: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            binary: default_binary(),
            instances: Vec::new(),
            discovery: None,
            phase2_equivalence: true,
            hard_stop_after: default_hard_stop_after(),
            dynamic_backends: false,
        }
    }
}

fn default_hard_stop_after() -> Duration {
    Duration::from_secs(crate::driver::managed::DEFAULT_HARD_STOP_AFTER.as_secs())
}

fn default_binary() -> PathBuf {
    PathBuf::from("haproxy")
}

/// Finds the program `binary` names, as the process spawner would: a path is used as
/// is, a bare name is searched on `PATH`. `Err` says what was searched, naming
/// `haproxy.binary` and `PATH`, so a missing HAProxy is found by `check`, not at the
/// first render.
pub fn resolve_binary(binary: &Path) -> Result<PathBuf, BinaryError> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |path: &Path| {
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if binary.components().count() > 1 {
        return if runnable(binary) {
            Ok(binary.to_path_buf())
        } else {
            Err(BinaryError::NotExecutable(binary.to_path_buf()))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|candidate| runnable(candidate))
        .ok_or_else(|| BinaryError::NotOnPath {
            binary: binary.to_path_buf(),
            path: path.to_string_lossy().into_owned(),
        })
}

/// Why `haproxy.binary` names no program that can run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BinaryError {
    /// A path that is not an executable file.
    #[error("haproxy.binary `{}` is not an executable file", .0.display())]
    NotExecutable(PathBuf),
    /// A bare name found in no directory of `PATH`.
    #[error(
        "haproxy.binary `{}` is not on PATH ({path}); install HAProxy or set haproxy.binary to its full path",
        binary.display()
    )]
    NotOnPath {
        /// The name.
        binary: PathBuf,
        /// The `PATH` searched.
        path: String,
    },
}

/// Why a value of the config file does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Not octal permission bits.
    #[error("`{0}` is not a file mode: write octal permission bits such as \"0640\"")]
    NotFileMode(String),
    /// Octal, but with bits above the permission bits.
    #[error("`{0}` is above 0777: only permission bits can be set on written files")]
    FileModeTooHigh(String),
    /// An empty socket address.
    #[error("empty socket address")]
    EmptyAddress,
    /// Neither a path nor `host:port`.
    #[error("`{0}` is neither a socket path nor host:port with a port from 1 to 65535")]
    NotAddress(String),
}

/// The message for a failed start of `binary`: a missing program names
/// `haproxy.binary` and `PATH` (what [`resolve_binary`] says), anything else the OS error.
pub fn spawn_error(binary: &Path, error: &std::io::Error) -> String {
    if error.kind() == std::io::ErrorKind::NotFound
        && let Err(message) = resolve_binary(binary)
    {
        return format!("cannot run HAProxy: {message}");
    }
    format!("cannot run haproxy.binary `{}`: {error}", binary.display())
}

fn default_true() -> bool {
    true
}

/// One static deploy target, reached either through its local sockets or through the
/// Data Plane API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Instance {
    /// Unique name, used in logs, metrics and `/debug/instances`.
    pub name: String,
    /// Local master CLI / runtime API sockets and config directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<SocketTarget>,
    /// A remote HAProxy behind the Data Plane API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataplane: Option<DataplaneTarget>,
    /// hapwright starts and supervises this HAProxy itself (socket instances only).
    #[serde(default)]
    pub managed: bool,
    /// Environment of the HAProxy process (`${VAR}` in the config); also used for
    /// phase-2 validation of this instance. A value is a string, or `{ file: PATH }`
    /// for a secret read from a file (never shown; see [`EnvValue`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, EnvValue>,
}

/// One value of an instance's `env`.
#[derive(Clone, Debug, PartialEq)]
pub enum EnvValue {
    /// `NAME: "value"`: an ordinary value, shown in `/debug/config` and in
    /// validation messages.
    Plain(String),
    /// `NAME: { file: /run/secrets/x }`: a secret, read by [`Config::load_secrets`]
    /// (one trailing newline dropped) and watched like a `passwordFile`. It is
    /// redacted wherever hapwright shows text: `/debug/config` shows the path only,
    /// and the value is registered with the process-wide redaction set.
    File {
        /// Where the value is read from.
        file: PathBuf,
        /// The value; empty until loaded.
        value: Secret,
    },
}

impl EnvValue {
    /// The value given to HAProxy.
    pub fn value(&self) -> &str {
        match self {
            Self::Plain(value) => value,
            Self::File { value, .. } => value.expose(),
        }
    }

    /// Whether the value is a secret.
    pub fn is_secret(&self) -> bool {
        matches!(self, Self::File { .. })
    }
}

impl From<&str> for EnvValue {
    fn from(value: &str) -> Self {
        Self::Plain(value.to_owned())
    }
}

impl Serialize for EnvValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            Self::Plain(value) => serializer.serialize_str(value),
            Self::File { file, .. } => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("file", file)?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for EnvValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = EnvValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, or `{ file: PATH }` for a secret read from a file")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<EnvValue, E> {
                Ok(EnvValue::Plain(v.to_owned()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<EnvValue, E> {
                Ok(EnvValue::Plain(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<EnvValue, E> {
                Ok(EnvValue::Plain(v.to_string()))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<EnvValue, E> {
                Ok(EnvValue::Plain(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<EnvValue, A::Error> {
                let mut file: Option<PathBuf> = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "file" if file.is_none() => file = Some(map.next_value()?),
                        "file" => return Err(serde::de::Error::duplicate_field("file")),
                        other => return Err(serde::de::Error::unknown_field(other, &["file"])),
                    }
                }
                let file = file.ok_or_else(|| serde::de::Error::missing_field("file"))?;
                Ok(EnvValue::File {
                    file,
                    value: Secret::default(),
                })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// How an instance is reached, once validated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Driver<'a> {
    /// Local sockets.
    Socket(&'a SocketTarget),
    /// Data Plane API.
    Dataplane(&'a DataplaneTarget),
}

impl Instance {
    /// The environment HAProxy runs (and `haproxy -c` validates) with: every `env`
    /// value resolved.
    pub fn environment(&self) -> BTreeMap<String, String> {
        self.env
            .iter()
            .map(|(name, value)| (name.clone(), value.value().to_owned()))
            .collect()
    }

    /// The instance's driver; `None` when neither or both are configured (see
    /// [`Config::validate`]).
    pub fn driver(&self) -> Option<Driver<'_>> {
        match (&self.socket, &self.dataplane) {
            (Some(socket), None) => Some(Driver::Socket(socket)),
            (None, Some(dataplane)) => Some(Driver::Dataplane(dataplane)),
            _ => None,
        }
    }
}

/// A local HAProxy reached through its sockets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SocketTarget {
    /// Master CLI: a unix socket path or `host:port`.
    pub master: Address,
    /// Runtime API socket; by default commands go through the master (`@1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Address>,
    /// Where `haproxy.cfg`, `maps/`, `files/` and `certs/` are written.
    pub config_dir: PathBuf,
    /// Permission bits of the files under `certs/`. They hold private keys, so the
    /// default, 0600, lets only hapwright's user read them; HAProxy running as
    /// another user needs a group mode such as `"0640"` together with
    /// [`cert_group`](Self::cert_group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_mode: Option<FileMode>,
    /// Group given to the files under `certs/` (a name from `/etc/group` or a
    /// numeric gid), so HAProxy running as another user can read them through the
    /// group bits of [`cert_mode`](Self::cert_mode). Unset: the group of hapwright's
    /// user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_group: Option<Group>,
}

/// Unix permission bits written as an octal string in the config file (`"0640"`).
/// A string, because YAML readers disagree on whether an unquoted `0640` is octal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileMode(u32);

impl FileMode {
    /// The mode from its bits; `None` above 0o777 (hapwright never sets setuid,
    /// setgid or sticky bits on the files it writes).
    pub fn new(bits: u32) -> Option<Self> {
        (bits <= 0o777).then_some(Self(bits))
    }

    /// The permission bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Parses `"0640"` / `"640"` (octal digits only).
    pub fn parse(text: &str) -> Result<Self, ValueError> {
        let digits = text.strip_prefix("0o").unwrap_or(text);
        let invalid = || ValueError::NotFileMode(text.to_owned());
        if digits.is_empty() || !digits.chars().all(|c| ('0'..='7').contains(&c)) {
            return Err(invalid());
        }
        let bits = u32::from_str_radix(digits, 8).map_err(|_| invalid())?;
        Self::new(bits).ok_or_else(|| ValueError::FileModeTooHigh(text.to_owned()))
    }
}

impl fmt::Display for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl Serialize for FileMode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FileMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = FileMode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quoted octal file mode such as \"0640\"")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<FileMode, E> {
                FileMode::parse(text).map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<FileMode, E> {
                Err(E::custom(format!(
                    "write the mode as a quoted octal string (\"0{value}\"), not a number"
                )))
            }
            fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<FileMode, E> {
                self.visit_u64(value.unsigned_abs())
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A Unix group: a name looked up in `/etc/group` when a file is written, or a
/// numeric gid (for groups that only exist in a directory service).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Group {
    /// A numeric gid.
    Id(u32),
    /// A group name.
    Name(String),
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Group::Id(gid) => write!(f, "{gid}"),
            Group::Name(name) => f.write_str(name),
        }
    }
}

impl Serialize for Group {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Group::Id(gid) => serializer.serialize_u32(*gid),
            Group::Name(name) => serializer.serialize_str(name),
        }
    }
}

impl<'de> Deserialize<'de> for Group {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Group;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a group name or a numeric gid")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Group, E> {
                if text.is_empty() {
                    return Err(E::custom("the group name is empty"));
                }
                Ok(match text.parse::<u32>() {
                    Ok(gid) => Group::Id(gid),
                    Err(_) => Group::Name(text.to_owned()),
                })
            }
            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<Group, E> {
                u32::try_from(value)
                    .map(Group::Id)
                    .map_err(|_| E::custom(format!("gid {value} is out of range")))
            }
            fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<Group, E> {
                u64::try_from(value)
                    .map_err(|_| E::custom(format!("gid {value} is out of range")))
                    .and_then(|v| self.visit_u64(v))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A socket address: a unix socket path, or `host:port` for TCP. A value containing
/// `/`, or without `:`, is a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// Unix socket path.
    Unix(PathBuf),
    /// `host:port`.
    Tcp(String),
}

impl Address {
    /// Parses the config spelling.
    pub fn parse(text: &str) -> Result<Self, ValueError> {
        if text.is_empty() {
            return Err(ValueError::EmptyAddress);
        }
        if text.contains('/') || !text.contains(':') {
            return Ok(Address::Unix(PathBuf::from(text)));
        }
        let (host, port) = text.rsplit_once(':').expect("contains ':'");
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(ValueError::NotAddress(text.to_owned()));
        }
        Ok(Address::Tcp(text.to_owned()))
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(path) => write!(f, "{}", path.display()),
            Address::Tcp(addr) => f.write_str(addr),
        }
    }
}

impl Serialize for Address {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Address {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Address::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A remote HAProxy behind the Data Plane API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DataplaneTarget {
    /// Base URL (`http://10.0.0.2:5555`).
    pub url: String,
    /// Basic-auth user.
    pub username: String,
    /// File holding the password (trailing newline ignored). Watched: a change
    /// reloads the controller config.
    pub password_file: PathBuf,
    /// CA bundle to verify an `https` URL against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// The password, read from `password_file` by [`Config::load_secrets`].
    #[serde(skip_deserializing, default)]
    pub password: Option<Secret>,
}

/// `discovery`: dynamic deploy targets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Discovery {
    /// HAProxy pods found through the Kubernetes API, reached through their Data
    /// Plane API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesDiscovery>,
}

/// Pods to deploy to, found by label.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesDiscovery {
    /// Namespace of the pods.
    pub namespace: String,
    /// Label selector (`app=haproxy`).
    pub label_selector: String,
    /// Data Plane API port on each pod.
    pub port: u16,
    /// URL scheme of the pods' Data Plane API. `https` by default, because every pod
    /// receives the Data Plane password and every certificate with its private key;
    /// `http` needs [`allow_insecure_http`](Self::allow_insecure_http).
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// Opt-in for `scheme: http`: the password and private keys then cross the
    /// network in clear text, so this is refused unless set (a warning is logged at
    /// start and once per pod, and `hapwright_instance_insecure_transport` shows it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_insecure_http: bool,
    /// With `https`: the name every pod's certificate must carry (a DNS SAN) and the
    /// TLS server name sent, instead of the pod IP. Pods are addressed by IP, so
    /// without it each pod's certificate needs its IP as an IP SAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// Only pods running as this service account (`spec.serviceAccountName`) are
    /// deploy targets; other pods matching the labels are skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Only pods controlled by a workload of this kind (`DaemonSet`, `StatefulSet`,
    /// `ReplicaSet`, or `Deployment` through its ReplicaSets) are deploy targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_kind: Option<String>,
    /// With [`owner_kind`](Self::owner_kind): the name of that workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_name: Option<String>,
    /// The pods' container serving the Data Plane API (`dataplaneapi` when unset). A
    /// pod is a deploy target once this container is ready, whatever the readiness
    /// of its HAProxy container, so the HAProxy pod's own readiness can wait for a
    /// config hapwright deployed. A pod without a container of this name is a
    /// target while the pod is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataplane_container: Option<String>,
    /// Basic-auth user of the pods' Data Plane API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// File holding the Data Plane API password of the pods (trailing newline
    /// ignored). Watched like `instances[].dataplane.passwordFile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// CA bundle to verify the pods' `https` Data Plane API against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// The password, read from `password_file` by [`Config::load_secrets`].
    #[serde(skip_deserializing, default)]
    pub password: Option<Secret>,
}

fn default_scheme() -> String {
    "https".to_owned()
}

/// The owner kinds `discovery.kubernetes.ownerKind` accepts: workloads that create
/// HAProxy pods (a `Deployment` owns its pods through ReplicaSets).
pub const OWNER_KINDS: [&str; 4] = ["DaemonSet", "Deployment", "ReplicaSet", "StatefulSet"];

/// Whether `name` can name a container of a pod (an RFC 1123 label).
fn is_container_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('-')
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Whether `name` is a DNS name a certificate can carry (letters, digits, `-` and
/// `.`; no IP address, port or scheme).
fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.parse::<std::net::IpAddr>().is_err()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

impl Config {
    /// Semantic checks. Paths are relative to the `haproxy` section.
    pub fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        if self.binary.as_os_str().is_empty() {
            issues.push(ConfigIssue::new("binary", "binary is empty"));
        }
        if self.hard_stop_after.get().is_zero() {
            issues.push(ConfigIssue::new(
                "hardStopAfter",
                "hardStopAfter must be longer than 0s: it is how long a stopping managed \
                 HAProxy may finish the requests in flight",
            ));
        }
        let mut names = BTreeSet::new();
        for (index, instance) in self.instances.iter().enumerate() {
            let at = |field: &str| format!("instances[{index}].{field}");
            if instance.name.trim().is_empty() {
                issues.push(ConfigIssue::new(
                    at("name"),
                    "instance names must not be empty",
                ));
            } else if !names.insert(instance.name.as_str()) {
                issues.push(ConfigIssue::new(
                    at("name"),
                    format!("two instances are named `{}`", instance.name),
                ));
            }
            match (&instance.socket, &instance.dataplane) {
                (None, None) => issues.push(ConfigIssue::new(
                    format!("instances[{index}]"),
                    "no driver: set `socket` or `dataplane`",
                )),
                (Some(_), Some(_)) => issues.push(ConfigIssue::new(
                    at("dataplane"),
                    "an instance has one driver, but both `socket` and `dataplane` are set",
                )),
                _ => {}
            }
            if instance.managed && instance.socket.is_none() {
                issues.push(ConfigIssue::new(
                    at("managed"),
                    "only `socket` instances can be managed (hapwright starts HAProxy locally)",
                ));
            }
            if instance.managed
                && let Some(SocketTarget {
                    master: Address::Tcp(_),
                    ..
                }) = &instance.socket
            {
                issues.push(ConfigIssue::new(
                    at("socket.master"),
                    "a managed instance needs a unix master socket path",
                ));
            }
            if let Some(dataplane) = &instance.dataplane {
                if !(dataplane.url.starts_with("http://") || dataplane.url.starts_with("https://"))
                {
                    issues.push(ConfigIssue::new(
                        at("dataplane.url"),
                        "url must start with http:// or https://",
                    ));
                }
                if dataplane.ca_file.is_some() && !dataplane.url.starts_with("https://") {
                    issues.push(ConfigIssue::new(
                        at("dataplane.caFile"),
                        "caFile is only used with an https:// url",
                    ));
                }
            }
            for key in instance.env.keys() {
                let valid = key
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !valid {
                    issues.push(ConfigIssue::new(
                        at(&format!("env.{key}")),
                        "environment variable names are letters, digits and `_`, not starting with a digit",
                    ));
                }
            }
        }
        if let Some(Discovery {
            kubernetes: Some(kubernetes),
        }) = &self.discovery
        {
            if kubernetes.port == 0 {
                issues.push(ConfigIssue::new(
                    "discovery.kubernetes.port",
                    "port must be between 1 and 65535",
                ));
            }
            if kubernetes.namespace.trim().is_empty() {
                issues.push(ConfigIssue::new(
                    "discovery.kubernetes.namespace",
                    "namespace is empty",
                ));
            }
            if kubernetes.scheme != "http" && kubernetes.scheme != "https" {
                issues.push(ConfigIssue::new(
                    "discovery.kubernetes.scheme",
                    "scheme must be `http` or `https`",
                ));
            }
            if kubernetes.username.is_some() != kubernetes.password_file.is_some() {
                issues.push(ConfigIssue::new(
                    "discovery.kubernetes.passwordFile",
                    "set both `username` and `passwordFile`, or neither",
                ));
            }
            if kubernetes.ca_file.is_some() && kubernetes.scheme != "https" {
                issues.push(ConfigIssue::new(
                    "discovery.kubernetes.caFile",
                    "caFile is only used with scheme `https`",
                ));
            }
            if kubernetes.scheme == "http" && !kubernetes.allow_insecure_http {
                issues.push(ConfigIssue::new(
                    "discovery.kubernetes.scheme",
                    "`http` sends the Data Plane password and private keys in clear text: \
                     use `https` (the default), or set `allowInsecureHttp: true`",
                ));
            }
            if kubernetes.allow_insecure_http && kubernetes.scheme != "http" {
                issues.push(ConfigIssue::new(
                    "discovery.kubernetes.allowInsecureHttp",
                    "allowInsecureHttp is only used with scheme `http`",
                ));
            }
            if let Some(name) = &kubernetes.server_name {
                if kubernetes.scheme != "https" {
                    issues.push(ConfigIssue::new(
                        "discovery.kubernetes.serverName",
                        "serverName is only used with scheme `https`",
                    ));
                }
                if !is_dns_name(name) {
                    issues.push(ConfigIssue::new(
                        "discovery.kubernetes.serverName",
                        format!(
                            "`{name}` is not a DNS name (letters, digits, `-` and `.`; \
                             no IP address, port or scheme)"
                        ),
                    ));
                }
            }
            if kubernetes
                .service_account_name
                .as_deref()
                .is_some_and(|name| name.trim().is_empty())
            {
                issues.push(ConfigIssue::new(
                    "discovery.kubernetes.serviceAccountName",
                    "serviceAccountName is empty",
                ));
            }
            if let Some(kind) = &kubernetes.owner_kind
                && !OWNER_KINDS.contains(&kind.as_str())
            {
                issues.push(ConfigIssue::new(
                    "discovery.kubernetes.ownerKind",
                    format!(
                        "`{kind}` is not a workload kind hapwright can check: use one of {}",
                        OWNER_KINDS.join(", ")
                    ),
                ));
            }
            if let Some(name) = &kubernetes.dataplane_container
                && !is_container_name(name)
            {
                issues.push(ConfigIssue::new(
                    "discovery.kubernetes.dataplaneContainer",
                    format!(
                        "`{name}` is not a container name (lower-case letters, digits and \
                         `-`, at most 63, starting and ending with a letter or digit)"
                    ),
                ));
            }
            match (&kubernetes.owner_kind, &kubernetes.owner_name) {
                (None, Some(_)) => issues.push(ConfigIssue::new(
                    "discovery.kubernetes.ownerName",
                    "ownerName needs ownerKind (the kind of the workload it names)",
                )),
                (_, Some(name)) if name.trim().is_empty() => issues.push(ConfigIssue::new(
                    "discovery.kubernetes.ownerName",
                    "ownerName is empty",
                )),
                _ => {}
            }
        }
        issues
    }

    /// Makes relative paths (config directories, unix sockets, password and CA
    /// files) absolute against `base`, the config file's directory. A bare binary
    /// name stays as it is (looked up on `PATH`).
    pub fn resolve_paths(&mut self, base: &Path) {
        let resolve = |path: &mut PathBuf| {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        };
        if self.binary.components().count() > 1 && self.binary.is_relative() {
            self.binary = base.join(&self.binary);
        }
        for instance in &mut self.instances {
            if let Some(socket) = &mut instance.socket {
                resolve(&mut socket.config_dir);
                for address in std::iter::once(&mut socket.master).chain(socket.runtime.as_mut()) {
                    if let Address::Unix(path) = address {
                        resolve(path);
                    }
                }
            }
            for value in instance.env.values_mut() {
                if let EnvValue::File { file, .. } = value {
                    resolve(file);
                }
            }
            if let Some(dataplane) = &mut instance.dataplane {
                resolve(&mut dataplane.password_file);
                if let Some(ca) = &mut dataplane.ca_file {
                    resolve(ca);
                }
            }
        }
        if let Some(Discovery {
            kubernetes: Some(kubernetes),
        }) = &mut self.discovery
        {
            for path in kubernetes
                .password_file
                .iter_mut()
                .chain(kubernetes.ca_file.as_mut())
            {
                resolve(path);
            }
        }
    }

    /// Every file whose content is part of the configuration (password files, `env`
    /// values read from files), for the config watcher.
    pub fn secret_files(&self) -> Vec<PathBuf> {
        let env_files = self.instances.iter().flat_map(|i| {
            i.env.values().filter_map(|value| match value {
                EnvValue::File { file, .. } => Some(file.clone()),
                EnvValue::Plain(_) => None,
            })
        });
        self.instances
            .iter()
            .filter_map(|i| i.dataplane.as_ref())
            .map(|d| d.password_file.clone())
            .chain(env_files)
            .chain(
                self.discovery
                    .iter()
                    .filter_map(|d| d.kubernetes.as_ref())
                    .filter_map(|k| k.password_file.clone()),
            )
            .collect()
    }

    /// Reads every `passwordFile` into its `password` and checks that every `caFile`
    /// is readable. Problems are returned as issues at the key's path; the password
    /// never appears in them.
    pub fn load_secrets(&mut self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        for (index, instance) in self.instances.iter_mut().enumerate() {
            for (name, env) in &mut instance.env {
                if let EnvValue::File { file, value } = env {
                    let at = format!("instances[{index}].env.{name}.file");
                    if let Some(text) = read_secret_file(file, &at, &mut issues) {
                        *value = Secret::new(text);
                    }
                }
            }
            let Some(dataplane) = &mut instance.dataplane else {
                continue;
            };
            let at = format!("instances[{index}].dataplane");
            dataplane.password = load_secret(
                &dataplane.password_file,
                dataplane.ca_file.as_deref(),
                &at,
                &mut issues,
            );
        }
        if let Some(Discovery {
            kubernetes: Some(kubernetes),
        }) = &mut self.discovery
            && let Some(file) = &kubernetes.password_file
        {
            kubernetes.password = load_secret(
                file,
                kubernetes.ca_file.as_deref(),
                "discovery.kubernetes",
                &mut issues,
            );
        }
        issues
    }
}

/// Reads one password file (and checks the CA file), pushing issues at `at`.
fn load_secret(
    password_file: &Path,
    ca_file: Option<&Path>,
    at: &str,
    issues: &mut Vec<ConfigIssue>,
) -> Option<Secret> {
    let at = |field: &str| format!("{at}.{field}");
    let secret = read_secret_file(password_file, &at("passwordFile"), issues).map(|text| {
        if text.is_empty() {
            issues.push(ConfigIssue::new(
                at("passwordFile"),
                format!("{} is empty", password_file.display()),
            ));
        }
        Secret::new(text)
    });
    if let Some(ca) = ca_file
        && let Err(error) = std::fs::File::open(ca)
    {
        issues.push(ConfigIssue::new(
            at("caFile"),
            format!("cannot read {}: {error}", ca.display()),
        ));
    }
    secret
}

/// Reads a secret from `file`: UTF-8 text, one trailing newline (`\n` or `\r\n`)
/// dropped. Problems are pushed at `at`; the content never appears in them.
fn read_secret_file(file: &Path, at: &str, issues: &mut Vec<ConfigIssue>) -> Option<String> {
    match std::fs::read(file) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => {
                let value = text.strip_suffix('\n').unwrap_or(&text);
                let value = value.strip_suffix('\r').unwrap_or(value);
                Some(value.to_owned())
            }
            Err(_) => {
                issues.push(ConfigIssue::new(
                    at,
                    format!("{} is not UTF-8 text", file.display()),
                ));
                None
            }
        },
        Err(error) => {
            issues.push(ConfigIssue::new(
                at,
                format!("cannot read {}: {error}", file.display()),
            ));
            None
        }
    }
}

/// Deploy timings from the `controller` section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Timings {
    /// Minimum time between two deployments.
    pub min_deployment_interval: Duration,
    /// Minimum time between two reloads of one instance (runtime-API updates keep
    /// flowing meanwhile).
    pub min_reload_interval: Duration,
    /// Interval of the drift check that re-deploys instances that differ.
    pub drift_prevention_interval: Duration,
    /// Deadline of one deployment to one instance.
    pub deployment_timeout: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            min_deployment_interval: Duration::from_secs(2),
            min_reload_interval: Duration::from_secs(5),
            drift_prevention_interval: Duration::from_secs(60),
            deployment_timeout: Duration::from_secs(30),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        serde_saphyr::from_str(text).unwrap()
    }

    #[test]
    fn the_design_example_parses() {
        let config = parse(
            r#"
binary: haproxy
instances:
  - name: local
    socket:
      master: /run/haproxy/master.sock
      runtime: /run/haproxy/admin.sock
      configDir: /etc/haproxy
    managed: true
    env: { HTTP_PORT: "8080" }
  - name: edge-2
    dataplane: { url: http://10.0.0.2:5555, username: admin, passwordFile: /run/secrets/dp }
  - name: tcp
    socket: { master: "127.0.0.1:9999", configDir: /etc/x }
discovery:
  kubernetes: { namespace: ingress, labelSelector: app=haproxy, port: 5555 }
"#,
        );
        assert_eq!(config.instances.len(), 3);
        assert!(
            matches!(config.instances[0].driver(), Some(Driver::Socket(s)) if s.master == Address::Unix("/run/haproxy/master.sock".into()))
        );
        assert!(
            matches!(config.instances[2].driver(), Some(Driver::Socket(s)) if s.master == Address::Tcp("127.0.0.1:9999".into()))
        );
        assert!(config.validate().is_empty(), "{:?}", config.validate());
        assert_eq!(config.secret_files(), [PathBuf::from("/run/secrets/dp")]);
    }

    #[test]
    fn phase2_equivalence_is_on_unless_switched_off() {
        assert!(parse("binary: haproxy\n").phase2_equivalence);
        assert!(!parse("phase2Equivalence: false\n").phase2_equivalence);
        assert!(
            serde_saphyr::from_str::<Config>("phase2Equivalence: maybe\n").is_err(),
            "not a bool"
        );
    }

    #[test]
    fn semantic_checks() {
        let config = parse(
            r#"
instances:
  - name: a
  - name: a
    socket: { master: m.sock, configDir: d }
    dataplane: { url: ftp://x, username: u, passwordFile: p, caFile: ca }
  - name: b
    dataplane: { url: http://x, username: u, passwordFile: p }
    managed: true
    env: { "1BAD": x }
discovery: { kubernetes: { namespace: "", labelSelector: a, port: 0 } }
"#,
        );
        let issues: Vec<String> = config.validate().iter().map(ToString::to_string).collect();
        for wanted in [
            "instances[0]: no driver",
            "instances[1].name: two instances are named `a`",
            "instances[1].dataplane: an instance has one driver",
            "instances[1].dataplane.url: url must start",
            "instances[1].dataplane.caFile: caFile is only used",
            "instances[2].managed: only `socket` instances",
            "instances[2].env.1BAD: environment variable names",
            "discovery.kubernetes.port: port must be",
            "discovery.kubernetes.namespace: namespace is empty",
        ] {
            assert!(
                issues.iter().any(|i| i.starts_with(wanted)),
                "missing {wanted:?} in {issues:#?}"
            );
        }
    }

    #[test]
    fn addresses() {
        assert_eq!(
            Address::parse("/a/b.sock").unwrap(),
            Address::Unix("/a/b.sock".into())
        );
        assert_eq!(
            Address::parse("admin.sock").unwrap(),
            Address::Unix("admin.sock".into())
        );
        assert_eq!(
            Address::parse("host:1").unwrap(),
            Address::Tcp("host:1".into())
        );
        assert!(Address::parse("host:x").is_err());
        assert!(Address::parse(":80").is_err());
        assert!(Address::parse("").is_err());
    }

    #[test]
    fn env_values_read_from_files_are_secrets() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "env-s3cret-value\n").unwrap();
        let mut config = parse(
            r#"
instances:
  - name: local
    socket: { master: run/master.sock, configDir: etc }
    env: { PORT: 8080, TOKEN: { file: token }, MISSING: { file: nope } }
"#,
        );
        config.resolve_paths(dir.path());
        let issues: Vec<String> = config
            .load_secrets()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert!(
            issues[0].starts_with("instances[0].env.MISSING.file: cannot read"),
            "{issues:?}"
        );
        let environment = config.instances[0].environment();
        assert_eq!(environment["PORT"], "8080");
        assert_eq!(environment["TOKEN"], "env-s3cret-value");
        assert!(config.instances[0].env["TOKEN"].is_secret());
        assert!(config.secret_files().contains(&dir.path().join("token")));
        let json = serde_json::to_string(&config).unwrap();
        assert!(!json.contains("env-s3cret-value"), "{json}");
        assert!(json.contains("\"TOKEN\":{\"file\":"), "{json}");
        assert_eq!(
            hapwright_eventbus::redact::global().redact("x env-s3cret-value"),
            "x [redacted]"
        );

        let error = serde_saphyr::from_str::<Config>(
            "instances: [{ name: a, socket: { master: m, configDir: d }, env: { A: { path: x } } }]",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("unknown field `path`"), "{error}");
    }

    #[test]
    fn relative_paths_resolve_and_secrets_load_redacted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("dp"), "s3cret\n").unwrap();
        let mut config = parse(
            r#"
binary: ./bin/haproxy
instances:
  - name: local
    socket: { master: run/master.sock, runtime: "127.0.0.1:9000", configDir: etc }
  - name: edge
    dataplane: { url: https://x, username: admin, passwordFile: dp, caFile: missing.pem }
"#,
        );
        config.resolve_paths(dir.path());
        let socket = config.instances[0].socket.as_ref().unwrap();
        assert_eq!(
            socket.master,
            Address::Unix(dir.path().join("run/master.sock"))
        );
        assert_eq!(socket.runtime, Some(Address::Tcp("127.0.0.1:9000".into())));
        assert_eq!(socket.config_dir, dir.path().join("etc"));
        assert_eq!(config.binary, dir.path().join("./bin/haproxy"));

        let issues = config.load_secrets();
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert!(
            issues[0]
                .to_string()
                .starts_with("instances[1].dataplane.caFile: cannot read")
        );
        let password = config.instances[1]
            .dataplane
            .as_ref()
            .unwrap()
            .password
            .clone()
            .unwrap();
        assert_eq!(password.expose(), "s3cret");
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        let json = serde_json::to_string(&config).unwrap();
        assert!(!json.contains("s3cret"), "{json}");

        std::fs::remove_file(dir.path().join("dp")).unwrap();
        let issues = config.load_secrets();
        assert!(
            issues[0]
                .to_string()
                .starts_with("instances[1].dataplane.passwordFile: cannot read"),
            "{issues:?}"
        );
    }

    #[test]
    fn discovery_credentials_resolve_load_and_validate() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("dp"), "pod-secret\n").unwrap();
        let mut config = parse(
            r#"
discovery:
  kubernetes:
    namespace: ingress
    labelSelector: app=haproxy
    port: 5555
    scheme: https
    username: admin
    passwordFile: dp
    caFile: ca.pem
"#,
        );
        config.resolve_paths(dir.path());
        assert_eq!(config.secret_files(), [dir.path().join("dp")]);
        let issues = config.load_secrets();
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert!(
            issues[0]
                .to_string()
                .starts_with("discovery.kubernetes.caFile: cannot read"),
            "{issues:?}"
        );
        let kubernetes = config
            .discovery
            .as_ref()
            .unwrap()
            .kubernetes
            .as_ref()
            .unwrap();
        assert_eq!(kubernetes.password.as_ref().unwrap().expose(), "pod-secret");
        assert!(
            !serde_json::to_string(&config)
                .unwrap()
                .contains("pod-secret")
        );
        assert!(config.validate().is_empty(), "{:?}", config.validate());

        let config = parse(
            r#"
discovery:
  kubernetes: { namespace: x, labelSelector: a, port: 1, scheme: ftp, username: u, caFile: c }
"#,
        );
        let issues: Vec<String> = config.validate().iter().map(ToString::to_string).collect();
        for wanted in [
            "discovery.kubernetes.scheme: scheme must be",
            "discovery.kubernetes.passwordFile: set both",
            "discovery.kubernetes.caFile: caFile is only used",
        ] {
            assert!(
                issues.iter().any(|i| i.starts_with(wanted)),
                "missing {wanted:?} in {issues:#?}"
            );
        }
    }

    #[test]
    fn discovery_is_https_by_default_and_http_needs_an_explicit_opt_in() {
        let config =
            parse("discovery:\n  kubernetes: { namespace: x, labelSelector: a, port: 1 }\n");
        let kubernetes = config
            .discovery
            .as_ref()
            .unwrap()
            .kubernetes
            .clone()
            .unwrap();
        assert_eq!(kubernetes.scheme, "https");
        assert!(!kubernetes.allow_insecure_http);
        assert!(config.validate().is_empty(), "{:?}", config.validate());

        let issues = |extra: &str| -> Vec<String> {
            parse(&format!(
                "discovery:\n  kubernetes: {{ namespace: x, labelSelector: a, port: 1, {extra} }}\n"
            ))
            .validate()
            .iter()
            .map(ToString::to_string)
            .collect()
        };
        let refused = issues("scheme: http");
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(
            refused[0]
                .starts_with("discovery.kubernetes.scheme: `http` sends the Data Plane password"),
            "{refused:?}"
        );
        assert!(
            refused[0].contains("allowInsecureHttp: true"),
            "{refused:?}"
        );
        assert!(issues("scheme: http, allowInsecureHttp: true").is_empty());
        assert!(
            issues("serverName: haproxy.ingress.svc, serviceAccountName: haproxy, ownerKind: DaemonSet, ownerName: haproxy")
                .is_empty()
        );
        assert!(issues("ownerKind: Deployment").is_empty());
        assert!(issues("dataplaneContainer: haproxy-dataplane-2").is_empty());
        for (extra, wanted) in [
            (
                "allowInsecureHttp: true",
                "discovery.kubernetes.allowInsecureHttp: allowInsecureHttp is only used with scheme `http`",
            ),
            (
                "scheme: http, allowInsecureHttp: true, serverName: a.b",
                "discovery.kubernetes.serverName: serverName is only used with scheme `https`",
            ),
            (
                "serverName: \"10.0.0.1\"",
                "discovery.kubernetes.serverName: `10.0.0.1` is not a DNS name",
            ),
            (
                "serverName: \"https://a.b:5555\"",
                "discovery.kubernetes.serverName: `https://a.b:5555` is not a DNS name",
            ),
            (
                "serviceAccountName: \"\"",
                "discovery.kubernetes.serviceAccountName: serviceAccountName is empty",
            ),
            (
                "ownerKind: Pod",
                "discovery.kubernetes.ownerKind: `Pod` is not a workload kind",
            ),
            (
                "ownerName: haproxy",
                "discovery.kubernetes.ownerName: ownerName needs ownerKind",
            ),
            (
                "ownerKind: DaemonSet, ownerName: \" \"",
                "discovery.kubernetes.ownerName: ownerName is empty",
            ),
            (
                "dataplaneContainer: \"\"",
                "discovery.kubernetes.dataplaneContainer: `` is not a container name",
            ),
            (
                "dataplaneContainer: DataplaneAPI",
                "discovery.kubernetes.dataplaneContainer: `DataplaneAPI` is not a container name",
            ),
        ] {
            let found = issues(extra);
            assert!(
                found.iter().any(|i| i.starts_with(wanted)),
                "{extra}: missing {wanted:?} in {found:#?}"
            );
        }
        let unknown = serde_saphyr::from_str::<Config>(
            "discovery:\n  kubernetes: { namespace: x, labelSelector: a, port: 1, allowInsecureHTTP: true }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(unknown.contains("unknown field"), "{unknown}");
    }

    #[test]
    fn certificate_mode_and_group_parse_and_reach_the_file_modes() {
        let config = parse(
            r#"
instances:
  - name: a
    socket: { master: m.sock, configDir: d, certMode: "0640", certGroup: haproxy }
  - name: b
    socket: { master: m.sock, configDir: d, certGroup: 113 }
  - name: c
    socket: { master: m.sock, configDir: d, certGroup: "114" }
"#,
        );
        let socket = |i: usize| config.instances[i].socket.clone().unwrap();
        assert_eq!(socket(0).cert_mode, FileMode::new(0o640));
        assert_eq!(socket(0).cert_group, Some(Group::Name("haproxy".into())));
        assert_eq!(socket(1).cert_group, Some(Group::Id(113)));
        assert_eq!(socket(2).cert_group, Some(Group::Id(114)));
        let modes = crate::haproxy::files::FileModes::from_config(&socket(0));
        assert_eq!(modes.cert_mode, 0o640);
        assert_eq!(
            crate::haproxy::files::FileModes::from_config(&socket(1)).cert_mode,
            0o600
        );
        let json = serde_json::to_value(&config).unwrap();
        assert_eq!(json["instances"][0]["socket"]["certMode"], "0640");
        assert_eq!(json["instances"][1]["socket"]["certGroup"], 113);
    }

    #[test]
    fn bad_certificate_modes_and_unknown_socket_keys_are_rejected() {
        let error = |text: &str| {
            serde_saphyr::from_str::<Config>(text)
                .unwrap_err()
                .to_string()
        };
        let base = "instances:\n  - name: a\n    socket: { master: m.sock, configDir: d, ";
        for (extra, wanted) in [
            (r#"certMode: "0648" }"#, "not a file mode"),
            (r#"certMode: "4755" }"#, "above 0777"),
            ("certMode: 640 }", "quoted octal string"),
            (r#"certGroup: "" }"#, "group name is empty"),
            ("certMod: \"0640\" }", "unknown field"),
        ] {
            let message = error(&format!("{base}{extra}\n"));
            assert!(message.contains(wanted), "{extra}: {message}");
        }
        assert_eq!(FileMode::parse("0o600").unwrap().to_string(), "0600");
        assert_eq!(FileMode::parse("640").unwrap().bits(), 0o640);
    }

    #[test]
    fn a_bare_binary_name_stays_on_path() {
        let mut config = parse("binary: haproxy\n");
        config.resolve_paths(Path::new("/etc/hapwright"));
        assert_eq!(config.binary, PathBuf::from("haproxy"));
    }
}
