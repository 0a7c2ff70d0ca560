//! The Data Plane API driver: deploys a rendered config to one remote HAProxy through
//! its Data Plane API v3, with the same change plan as the socket driver.
//!
//! Per deployment (one at a time: the instance's worker is its only caller):
//! 1. what the instance runs: the last deployment, or (after a controller restart)
//!    the raw configuration when its `HAPWRIGHT_CONFIG_VERSION` marker is the desired
//!    config's;
//! 2. the [`ChangePlan`];
//! 3. runtime-only: each operation through the API (runtime server state, add and
//!    delete; address, port and weight through the configured-server endpoint, which
//!    the API applies without a reload; map entries through the runtime map API;
//!    certificates through storage), then the files are stored with `skip_reload` so
//!    a later reload keeps the state. A refused operation falls back to a raw push
//!    with a reload;
//! 4. reload: maps, certificates and files into storage (`skip_reload`), then the raw
//!    configuration with the version marker, `version` guarded (a `409` re-reads the
//!    version and retries), and the reload id polled until it `succeeded`; a `failed`
//!    reload is reported with HAProxy's output (the API keeps the old worker).
//!
//! Layout: the rendered config refers to `maps/<name>`, `certs/<name>` and
//! `files/<name>`; the Data Plane API's storage directories must be those
//! directories under HAProxy's working directory (see docs/dataplane.md).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use hapwright_eventbus::model::{
    DeployReason, DeployStrategy, InstanceDriver, ReloadReason, RenderedConfig, same_file,
    same_text,
};

use crate::client::dataplane::{
    DataplaneClient, DataplaneError, Endpoint, RuntimeAddServer, Settings, Storage,
};
use crate::client::runtime::RuntimeFailure;
use crate::driver::{DeployError, Deployed};
use crate::driver::{Driver, RuntimeOpsError};
use crate::haproxy::config::Config;
use crate::haproxy::files::{strip_version_marker, with_version_marker};
use crate::haproxy::plan::{ChangePlan, RuntimeOp};
use crate::metrics::Metrics;
use crate::version_check::VersionError;

/// Rendered files by name.
type Files = hapwright_eventbus::model::FileGroup;

/// Deploys to one HAProxy instance through its Data Plane API.
#[derive(Debug)]
pub struct DataplaneDriver {
    name: String,
    url: String,
    client: DataplaneClient,
    metrics: Metrics,
    /// The configuration version the API reported after the last deployment, with
    /// the marker it belongs to: a drift check with the same version needs no fetch.
    known_version: Mutex<Option<(String, i64)>>,
}

impl DataplaneDriver {
    /// A driver for the instance `name` at `url` (for logs and `/debug/instances`).
    pub fn new(
        name: impl Into<String>,
        url: impl Into<String>,
        client: DataplaneClient,
        metrics: Metrics,
    ) -> Self {
        Self {
            name: name.into(),
            url: url.into(),
            client,
            metrics,
            known_version: Mutex::new(None),
        }
    }

    /// A driver for the instance `name` reached at `endpoint`, with its own client.
    ///
    /// # Errors
    ///
    /// When the client cannot be built (e.g. an unreadable CA file).
    pub fn connect(
        name: impl Into<String>,
        endpoint: &Endpoint,
        settings: Settings,
        metrics: Metrics,
    ) -> Result<Self, DataplaneError> {
        let client = DataplaneClient::new(endpoint, settings)?;
        Ok(Self::new(name, endpoint.url.clone(), client, metrics))
    }

    /// The instance name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Data Plane API base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The API client.
    pub fn client(&self) -> &DataplaneClient {
        &self.client
    }

    async fn drift_of(&self, deployed: &Deployed) -> Result<Option<String>, DeployError> {
        let version = self.client.configuration_version().await?;
        let known = self
            .known_version
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if known.as_ref() == Some(&(deployed.marker.clone(), version)) {
            return Ok(None);
        }
        let (version, raw) = self.client.raw_configuration().await?;
        let (text, marker) = strip_version_marker(&raw);
        if marker.as_deref() != Some(deployed.marker.as_str()) {
            return Ok(Some(format!(
                "instance runs version {}, expected {}",
                marker.as_deref().unwrap_or("(none)"),
                deployed.marker
            )));
        }
        let (expected, _) = strip_version_marker(&with_version_marker(
            deployed.config.main(),
            &deployed.marker,
        ));
        if text != expected {
            return Ok(Some(format!(
                "the configuration (version {version}) was changed outside hapwright"
            )));
        }
        self.remember_version(&deployed.marker, version);
        Ok(None)
    }

    fn remember_version(&self, marker: &str, version: i64) {
        *self.known_version.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((marker.to_owned(), version));
    }

    /// What the instance runs when its marker says it is `desired`.
    async fn running_from_remote(
        &self,
        desired: &Arc<RenderedConfig>,
    ) -> Result<Option<Arc<Deployed>>, DeployError> {
        let (version, raw) = self.client.raw_configuration().await?;
        let (text, marker) = strip_version_marker(&raw);
        let mut wanted = desired.hash().short();
        // A config an earlier version of hapwright deployed carries the short form
        // of the content hash as that version computed it: recognised too, so that
        // an upgrade does not reload every instance.
        if marker.as_deref() != Some(wanted.as_str()) {
            let legacy = desired.legacy_hash().short();
            if marker.as_deref() == Some(legacy.as_str()) {
                wanted = legacy;
            }
        }
        let (expected, _) = strip_version_marker(&with_version_marker(desired.main(), &wanted));
        if marker.as_deref() != Some(wanted.as_str()) || text != expected {
            return Ok(None);
        }
        self.remember_version(&wanted, version);
        Ok(Some(Arc::new(Deployed::new(
            desired.clone(),
            wanted,
            DeployStrategy::Noop,
            DeployReason {
                reload: None,
                detail: "found running".to_owned(),
            },
        )?)))
    }

    /// Stores maps, certificates and files that differ from `previous` (all of them
    /// without one), without reloading.
    async fn store_side_files(
        &self,
        desired: &RenderedConfig,
        previous: Option<&RenderedConfig>,
    ) -> Result<(), DeployError> {
        let areas: [(Storage, &Files, Option<&Files>); 3] = [
            (
                Storage::Maps,
                desired.maps(),
                previous.map(RenderedConfig::maps),
            ),
            (
                Storage::Certificates,
                desired.certificates(),
                previous.map(RenderedConfig::certificates),
            ),
            (
                Storage::General,
                desired.files(),
                previous.map(RenderedConfig::files),
            ),
        ];
        for (area, files, before) in areas {
            let changed: Vec<(&String, &Arc<str>)> = files
                .iter()
                .filter(|(name, content)| {
                    !same_file(before.and_then(|b| b.get(*name)), Some(content))
                })
                .collect();
            if changed.is_empty() {
                continue;
            }
            let stored: Vec<String> = self
                .client
                .stored_files(area)
                .await?
                .into_iter()
                .map(|f| f.storage_name)
                .collect();
            for (name, content) in changed {
                let exists = stored.iter().any(|s| s == name);
                if let Some(id) = self
                    .client
                    .put_stored_file(area, name, content, exists, true)
                    .await?
                {
                    self.client.wait_reload(&id).await?;
                }
            }
        }
        Ok(())
    }

    /// Stores every changed file and the main config (keeping `marker`) without a
    /// reload, so a later reload keeps what runtime changes applied.
    async fn store_files(
        &self,
        desired: &RenderedConfig,
        marker: &str,
        previous: Option<&RenderedConfig>,
    ) -> Result<(), DeployError> {
        self.store_side_files(desired, previous).await?;
        if previous.is_none_or(|p| !same_text(p.main(), desired.main())) {
            let raw = with_version_marker(desired.main(), marker);
            if let Some(id) = self.client.push_raw(&raw, true).await? {
                self.client.wait_reload(&id).await?;
            }
        }
        let version = self.client.configuration_version().await?;
        self.remember_version(marker, version);
        Ok(())
    }

    /// Stores the files, pushes the raw configuration with a reload and waits for it.
    async fn reload(
        &self,
        desired: Arc<RenderedConfig>,
        desired_model: Arc<Config>,
        running: Option<&Deployed>,
        plan: ChangePlan,
    ) -> Result<Deployed, DeployError> {
        let reason = plan.reason();
        let label = reason.reload.unwrap_or(ReloadReason::Structure).as_str();
        let marker = desired.hash().short();
        let outcome = async {
            self.store_side_files(&desired, running.map(|r| &*r.config))
                .await?;
            let raw = with_version_marker(desired.main(), &marker);
            if let Some(id) = self.client.push_raw(&raw, false).await? {
                self.client.wait_reload(&id).await?;
            }
            let version = self.client.configuration_version().await?;
            self.remember_version(&marker, version);
            Ok::<(), DeployError>(())
        }
        .await;
        self.metrics.reload(&self.name, outcome.is_ok(), label);
        outcome?;
        tracing::info!(instance = %self.name, reason = %reason.detail, "Reloaded through the Data Plane API");
        Ok(Deployed {
            config: desired,
            model: desired_model,
            marker,
            strategy: DeployStrategy::Reload,
            reason,
            runtime_commands: 0,
            at: SystemTime::now(),
        })
    }

    /// Applies runtime changes in order; returns how many, or which one failed and how.
    async fn apply_runtime(&self, plan: &ChangePlan) -> Result<usize, RuntimeOpsError> {
        let mut count = 0;
        for op in &plan.ops {
            let outcome = self.apply_op(op).await;
            self.metrics
                .runtime_command(&self.name, op.object(), outcome.is_ok());
            match outcome {
                Ok(()) => count += 1,
                Err(OpError(class, error)) => {
                    return Err(RuntimeOpsError::new(op.describe(), class, error));
                }
            }
        }
        Ok(count)
    }

    async fn apply_op(&self, op: &RuntimeOp) -> Result<(), OpError> {
        let api = &self.client;
        let text = OpError::from;
        match op {
            // The Data Plane API changes the configured server and reloads when HAProxy
            // needs it; a reload loses no request, so a move needs no stand-in here.
            RuntimeOp::SetAddr {
                backend,
                server,
                addr,
                port,
            }
            | RuntimeOp::MoveServer {
                backend,
                server,
                addr,
                port,
                ..
            } => {
                self.update_server(backend, server, |object| {
                    object.insert("address".into(), addr.clone().into());
                    if let Some(port) = port {
                        object.insert("port".into(), (*port).into());
                    }
                })
                .await
            }
            RuntimeOp::SetWeight {
                backend,
                server,
                weight,
            } => {
                self.update_server(backend, server, |object| {
                    object.insert("weight".into(), (*weight).into());
                })
                .await
            }
            RuntimeOp::SetState {
                backend,
                server,
                state,
            } => api
                .set_server_admin_state(backend, server, state)
                .await
                .map(drop)
                .map_err(text),
            RuntimeOp::AddServer {
                backend,
                server,
                address,
                params,
                enable,
                health,
            } => {
                let body = add_server_body(server, address, params, *enable, *health)
                    .map_err(|e| OpError::refused(e.to_string()))?;
                api.add_runtime_server(backend, &body).await.map_err(text)
            }
            RuntimeOp::DelServer { backend, server } => {
                api.set_server_admin_state(backend, server, "maint")
                    .await
                    .map_err(text)?;
                api.delete_runtime_server(backend, server)
                    .await
                    .map_err(text)
            }
            // Never planned for this driver (it offers no dynamic backends); refused
            // so a plan that holds one falls back to a reload.
            // The Data Plane API has no call for it: refused, so such a plan falls
            // back to a reload (which computes the cookies).
            RuntimeOp::RefreshDynamicCookies { .. } => Err(OpError::refused(format!(
                "{}: the Data Plane API cannot recompute dynamic cookies",
                op.describe()
            ))),
            RuntimeOp::AddBackend { .. } | RuntimeOp::DelBackend { .. } => {
                Err(OpError::refused(format!(
                    "{}: the Data Plane API cannot add or delete backends at runtime",
                    op.describe()
                )))
            }
            RuntimeOp::ReplacePatterns { file, content, .. } => {
                let Some(name) = file.strip_prefix("maps/") else {
                    return Err(OpError::refused(format!(
                        "{file}: only maps can be changed through the Data Plane runtime API"
                    )));
                };
                self.replace_map(name, content).await
            }
            RuntimeOp::AddCertificate { .. }
            | RuntimeOp::DelCertificate { .. }
            | RuntimeOp::SetCrtListEntry { .. }
            | RuntimeOp::DelCrtListEntry { .. } => Err(OpError::refused(format!(
                "{}: the Data Plane API has no runtime call for adding or removing \
                 certificates and crt-list entries; a reload loads them",
                op.describe()
            ))),
            RuntimeOp::ReplaceCertificate { file, pem } => {
                let name = file.strip_prefix("certs/").unwrap_or(file);
                match api
                    .put_stored_file(Storage::Certificates, name, pem, true, true)
                    .await
                    .map_err(text)?
                {
                    Some(id) => api.wait_reload(&id).await.map(drop).map_err(text),
                    None => Ok(()),
                }
            }
        }
    }

    /// Fetches the configured server, lets `change` edit its fields, and replaces it.
    async fn update_server(
        &self,
        backend: &str,
        server: &str,
        change: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
    ) -> Result<(), OpError> {
        let mut configured = self
            .client
            .configured_server(backend, server)
            .await
            .map_err(OpError::from)?;
        let object = configured
            .as_object_mut()
            .ok_or_else(|| OpError::protocol("the configured server is not an object"))?;
        change(object);
        self.replace_server(backend, server, configured).await
    }

    async fn replace_server(
        &self,
        backend: &str,
        server: &str,
        configured: serde_json::Value,
    ) -> Result<(), OpError> {
        match self
            .client
            .replace_configured_server(backend, server, configured)
            .await
            .map_err(OpError::from)?
        {
            Some(id) => self
                .client
                .wait_reload(&id)
                .await
                .map(drop)
                .map_err(OpError::from),
            None => Ok(()),
        }
    }

    /// Moves the running map `name` to `content` entry by entry.
    async fn replace_map(&self, name: &str, content: &str) -> Result<(), OpError> {
        let text = OpError::from;
        let current = self.client.map_entries(name).await.map_err(text)?;
        let desired = map_pairs(content);
        let mut seen = std::collections::BTreeSet::new();
        for entry in &current {
            let id = entry.id.as_deref().unwrap_or(entry.key.as_str());
            match desired.get(entry.key.as_str()) {
                Some(value) if seen.insert(entry.key.as_str()) => {
                    if value != &entry.value {
                        self.client
                            .replace_map_entry(name, id, value)
                            .await
                            .map_err(text)?;
                    }
                }
                _ => self.client.delete_map_entry(name, id).await.map_err(text)?,
            }
        }
        for (key, value) in &desired {
            if !seen.contains(key) {
                self.client
                    .add_map_entry(name, key, value)
                    .await
                    .map_err(text)?;
            }
        }
        let after = self.client.map_entries(name).await.map_err(text)?;
        if after.len() != desired.len() {
            return Err(OpError::protocol(format!(
                "map {name} holds {} entries after the update, expected {}",
                after.len(),
                desired.len()
            )));
        }
        Ok(())
    }
}

/// A failed runtime op with its class: an HTTP 4xx answer is a refusal, a request
/// that never connected found the API unreachable, anything else is a protocol error.
#[derive(Debug)]
struct OpError(RuntimeFailure, Box<dyn std::error::Error + Send + Sync>);

impl OpError {
    fn refused(detail: impl Into<String>) -> Self {
        OpError(RuntimeFailure::Refused, detail.into().into())
    }

    fn protocol(detail: impl Into<String>) -> Self {
        OpError(RuntimeFailure::Protocol, detail.into().into())
    }
}

impl From<DataplaneError> for OpError {
    fn from(error: DataplaneError) -> Self {
        OpError(classify(&error), Box::new(error))
    }
}

/// How a Data Plane API failure counts for the reload fallback.
fn classify(error: &DataplaneError) -> RuntimeFailure {
    match error {
        DataplaneError::Setup(_) => RuntimeFailure::Unreachable,
        DataplaneError::Transport { source, .. } if source.is_connect() => {
            RuntimeFailure::Unreachable
        }
        DataplaneError::Status { status, .. } if (400..500).contains(status) => {
            RuntimeFailure::Refused
        }
        DataplaneError::ReloadFailed { .. } => RuntimeFailure::Refused,
        _ => RuntimeFailure::Protocol,
    }
}

/// The `key value` lines of a map file (first word the key, the rest the value).
pub fn map_pairs(content: &str) -> BTreeMap<&str, String> {
    let mut pairs = BTreeMap::new();
    for line in content.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = line
            .split_once(char::is_whitespace)
            .map_or((line, ""), |(k, v)| (k, v.trim()));
        pairs.entry(key).or_insert_with(|| value.to_owned());
    }
    pairs
}

/// Why an `add server` change has no Data Plane runtime API body. The plan falls
/// back to a reload; not retryable as it is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
enum AddServerError {
    /// The address's port is not a port number.
    #[error("bad port in {0}")]
    BadPort(String),
    /// A parameter that takes a number has none.
    #[error("`{0}` needs a number")]
    MissingNumber(&'static str),
    /// A parameter the API's server model has no field for.
    #[error("server parameter `{0}` cannot be set through the Data Plane runtime API")]
    Unsupported(String),
    /// An address the API's server model cannot hold (an abstract Unix socket).
    #[error("server address `{0}` cannot be given through the Data Plane runtime API")]
    Address(String),
}

/// The `runtime_add_server` body for an `add server` change; parameters the model
/// has no field for are refused (the plan then falls back to a raw push).
fn add_server_body(
    name: &str,
    address: &str,
    params: &[String],
    enable: bool,
    health: bool,
) -> Result<RuntimeAddServer, AddServerError> {
    if address.starts_with("abns@") {
        return Err(AddServerError::Address(address.to_owned()));
    }
    let (host, port) = match address.rsplit_once(':') {
        Some((host, port)) => (
            host.trim_start_matches('[').trim_end_matches(']'),
            Some(
                port.parse::<u16>()
                    .map_err(|_| AddServerError::BadPort(address.to_owned()))?,
            ),
        ),
        None => (address, None),
    };
    let mut body = RuntimeAddServer {
        name: name.to_owned(),
        address: host.to_owned(),
        port,
        check: health.then(|| "enabled".to_owned()),
        maintenance: (!enable).then(|| "enabled".to_owned()),
        ..RuntimeAddServer::default()
    };
    let mut words = params.iter();
    while let Some(word) = words.next() {
        let mut number = |what: &'static str| -> Result<u64, AddServerError> {
            words
                .next()
                .and_then(|v| v.trim_end_matches("ms").parse::<u64>().ok())
                .ok_or(AddServerError::MissingNumber(what))
        };
        match word.as_str() {
            "check" | "disabled" | "enabled" => {}
            "weight" => body.weight = Some(number("weight")? as u32),
            "inter" => body.inter = Some(number("inter")?),
            "rise" => body.rise = Some(number("rise")? as u32),
            "fall" => body.fall = Some(number("fall")? as u32),
            "maxconn" => body.maxconn = Some(number("maxconn")? as u32),
            other => return Err(AddServerError::Unsupported(other.to_owned())),
        }
    }
    Ok(body)
}

#[async_trait::async_trait]
impl Driver for DataplaneDriver {
    fn name(&self) -> &str {
        &self.name
    }

    async fn haproxy_version(&self) -> Result<String, VersionError> {
        let info = self.client.runtime_info().await?;
        crate::version_check::dataplane_version(&info).ok_or(VersionError::NoDataplaneVersion)
    }

    fn kind(&self) -> InstanceDriver {
        InstanceDriver::Dataplane
    }

    async fn recover(
        &self,
        desired: &Arc<RenderedConfig>,
    ) -> Result<Option<Arc<Deployed>>, DeployError> {
        self.running_from_remote(desired).await
    }

    /// Cheap when the configuration version did not move since the last deployment;
    /// otherwise the raw configuration is fetched and compared.
    async fn check_drift(&self, running: &Deployed) -> Result<Option<String>, DeployError> {
        self.drift_of(running).await
    }

    async fn apply_runtime_ops(&self, plan: &ChangePlan) -> Result<usize, RuntimeOpsError> {
        self.apply_runtime(plan).await
    }

    async fn persist(
        &self,
        desired: &Arc<RenderedConfig>,
        marker: &str,
        previous: &Arc<RenderedConfig>,
    ) -> Result<(), DeployError> {
        self.store_files(desired, marker, Some(previous)).await
    }

    async fn reload_with(
        &self,
        desired: Arc<RenderedConfig>,
        desired_model: Arc<Config>,
        running: Option<&Deployed>,
        plan: ChangePlan,
    ) -> Result<Deployed, DeployError> {
        self.reload(desired, desired_model, running, plan).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_lines_become_pairs() {
        let pairs = map_pairs("# c\na.example be_a\n\nb.example   be_b extra\na.example dup\n");
        assert_eq!(pairs.len(), 2);
        assert_eq!(pairs["a.example"], "be_a");
        assert_eq!(pairs["b.example"], "be_b extra");
    }

    #[test]
    fn add_server_params_map_onto_the_model() {
        let params: Vec<String> = ["weight", "5", "check", "inter", "2000"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let body = add_server_body("s1", "10.0.0.1:8080", &params, true, true).unwrap();
        assert_eq!(body.address, "10.0.0.1");
        assert_eq!(body.port, Some(8080));
        assert_eq!(body.weight, Some(5));
        assert_eq!(body.inter, Some(2000));
        assert_eq!(body.check.as_deref(), Some("enabled"));
        assert_eq!(body.maintenance, None);
        let refused = add_server_body("s1", "10.0.0.1:8080", &["ssl".to_owned()], true, false);
        assert_eq!(
            refused.unwrap_err(),
            AddServerError::Unsupported("ssl".to_owned())
        );
        let disabled = add_server_body("s1", "10.0.0.1", &[], false, false).unwrap();
        assert_eq!(disabled.maintenance.as_deref(), Some("enabled"));
        assert_eq!(disabled.port, None);
        let socket = add_server_body("s1", "abns@invalid-8404", &[], true, false);
        assert_eq!(
            socket.unwrap_err(),
            AddServerError::Address("abns@invalid-8404".to_owned())
        );
    }
}
