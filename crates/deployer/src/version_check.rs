//! One HAProxy build, checked: phase 2 validates every render with `haproxy -c` of
//! `haproxy.binary`, which says little about a fleet that runs another HAProxy line
//! (a keyword 3.0 accepts may be refused by 2.6, and the reverse). [`VersionCheck`]
//! reads the validator's line from `haproxy -v` and each instance's from its runtime
//! API (`show info`, `Version:`; through the Data Plane API its runtime info) after
//! every reload or start, and when the lines differ:
//!
//! - logs a warning once per instance and pair of versions,
//! - sets `hapwright_instance_haproxy_line_mismatch{instance}` to 1 (0 when they
//!   match), next to `hapwright_instance_haproxy_version_info{instance,version}` and
//!   `hapwright_validator_haproxy_version_info{version}`,
//! - shows both versions and `haproxy_line_mismatch` in `/debug/instances`.
//!
//! Only the release line (`major.minor`) is compared: patch releases of one line
//! accept the same configurations.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use prometheus::{IntGaugeVec, Opts, Registry};
use serde::Serialize;
use tracing::Instrument;

use crate::client::master::Version;
use crate::driver::Driver;

/// The `Version:` of a runtime API `show info` answer (`2.6.12-1+deb12u4`).
pub fn info_version(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|line| line.strip_prefix("Version:"))
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// The HAProxy version in the Data Plane API's runtime info: `info.version` of the
/// process object, or of the first one when the API lists one per process.
pub fn dataplane_version(info: &serde_json::Value) -> Option<String> {
    let process = match info {
        serde_json::Value::Array(list) => list.first()?,
        other => other,
    };
    process
        .pointer("/info/version")
        .or_else(|| process.get("version"))
        .and_then(serde_json::Value::as_str)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// Why a HAProxy version could not be read, from `haproxy -v` or from an instance.
#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    /// `binary -v` could not run.
    #[error("cannot run `{} -v`: {error}", binary.display())]
    Run {
        /// The binary.
        binary: PathBuf,
        /// Why it could not run.
        error: std::io::Error,
    },
    /// `binary -v` printed no version on its first line.
    #[error("`{} -v` did not print a version: {first_line}", binary.display())]
    NotPrinted {
        /// The binary.
        binary: PathBuf,
        /// Its first line of output, trimmed.
        first_line: String,
    },
    /// The instance's runtime API did not answer `show info`.
    #[error(transparent)]
    Runtime(#[from] crate::client::runtime::RuntimeError),
    /// The Data Plane API did not answer with its runtime info.
    #[error(transparent)]
    Dataplane(#[from] crate::client::dataplane::DataplaneError),
    /// `show info` answered without a `Version:` line.
    #[error("`show info` has no Version line")]
    NoInfoVersion,
    /// The Data Plane API's runtime info names no version.
    #[error("the Data Plane API's runtime info has no HAProxy version")]
    NoDataplaneVersion,
    /// The driver has no way to ask.
    #[error("this driver cannot ask the instance for its HAProxy version")]
    Unsupported,
}

/// The version `haproxy -v` of `binary` reports (`3.0.11-1`): the word after
/// `version` on its first line.
pub async fn binary_version(binary: &Path) -> Result<String, VersionError> {
    let output = tokio::process::Command::new(binary)
        .arg("-v")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|error| VersionError::Run {
            binary: binary.to_owned(),
            error,
        })?;
    let text = String::from_utf8_lossy(&output.stdout);
    let first = text.lines().next().unwrap_or_default();
    first
        .split_whitespace()
        .skip_while(|word| !word.eq_ignore_ascii_case("version"))
        .nth(1)
        .map(str::to_owned)
        .ok_or_else(|| VersionError::NotPrinted {
            binary: binary.to_owned(),
            first_line: first.trim().to_owned(),
        })
}

/// One instance's HAProxy version as `/debug/instances` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InstanceVersion {
    /// The instance's version (`3.0.11-1`).
    pub haproxy_version: String,
    /// The version of `haproxy.binary`, which validates for it, when known.
    pub validator_version: Option<String>,
    /// Whether their release lines differ.
    pub haproxy_line_mismatch: bool,
}

#[derive(Default)]
struct State {
    validator: Option<String>,
    instances: BTreeMap<String, String>,
    /// `(instance, instance version, validator version)` already warned about.
    warned: BTreeSet<(String, String, String)>,
}

struct Inner {
    state: Mutex<State>,
    mismatch: IntGaugeVec,
    instance_info: IntGaugeVec,
    validator_info: IntGaugeVec,
}

/// The versions seen and the mismatch metrics. Created once per process; cheap to
/// clone.
#[derive(Clone)]
pub struct VersionCheck {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for VersionCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VersionCheck").finish_non_exhaustive()
    }
}

fn line(version: &str) -> Option<Version> {
    Version::parse(version)
}

impl VersionCheck {
    /// Registers the metrics.
    ///
    /// # Errors
    ///
    /// A metric with the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let mismatch = IntGaugeVec::new(
            Opts::new(
                "hapwright_instance_haproxy_line_mismatch",
                "1 when the instance runs another HAProxy line (major.minor) than haproxy.binary, which validates its configs.",
            ),
            &["instance"],
        )?;
        let instance_info = IntGaugeVec::new(
            Opts::new(
                "hapwright_instance_haproxy_version_info",
                "The HAProxy version the instance reports (show info), as a label; always 1.",
            ),
            &["instance", "version"],
        )?;
        let validator_info = IntGaugeVec::new(
            Opts::new(
                "hapwright_validator_haproxy_version_info",
                "The version of haproxy.binary (haproxy -v), which runs phase 2; always 1.",
            ),
            &["version"],
        )?;
        registry.register(Box::new(mismatch.clone()))?;
        registry.register(Box::new(instance_info.clone()))?;
        registry.register(Box::new(validator_info.clone()))?;
        Ok(Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                mismatch,
                instance_info,
                validator_info,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the validator's version (`haproxy -v` of `haproxy.binary`).
    pub fn set_validator_version(&self, version: &str) {
        let mut state = self.state();
        if let Some(old) = state.validator.replace(version.to_owned())
            && old != version
        {
            let _ = self.inner.validator_info.remove_label_values(&[&old]);
        }
        self.inner
            .validator_info
            .with_label_values(&[version])
            .set(1);
        self.compare(&mut state);
    }

    /// Reads the validator's version from `binary -v`; a binary that cannot tell is
    /// logged and leaves the comparison off.
    pub async fn read_validator(&self, binary: &Path) {
        match binary_version(binary).await {
            Ok(version) => {
                tracing::info!(binary = %binary.display(), %version, "Validator HAProxy version");
                self.set_validator_version(&version);
            }
            Err(reason) => {
                tracing::warn!(%reason, "Cannot tell the validator's HAProxy version; instance versions are not compared");
            }
        }
    }

    /// Records what `instance` runs.
    pub fn record_instance(&self, instance: &str, version: &str) {
        let mut state = self.state();
        if let Some(old) = state
            .instances
            .insert(instance.to_owned(), version.to_owned())
            && old != version
        {
            let _ = self
                .inner
                .instance_info
                .remove_label_values(&[instance, &old]);
        }
        self.inner
            .instance_info
            .with_label_values(&[instance, version])
            .set(1);
        self.compare(&mut state);
    }

    /// Forgets an instance that left the fleet, with its series.
    pub fn forget_instance(&self, instance: &str) {
        let mut state = self.state();
        if let Some(old) = state.instances.remove(instance) {
            let _ = self
                .inner
                .instance_info
                .remove_label_values(&[instance, &old]);
            let _ = self.inner.mismatch.remove_label_values(&[instance]);
        }
    }

    /// Sets the mismatch gauges, warning once per new mismatch.
    fn compare(&self, state: &mut State) {
        let Some(validator) = state.validator.clone() else {
            return;
        };
        let expected = line(&validator);
        let instances: Vec<(String, String)> = state
            .instances
            .iter()
            .map(|(name, version)| (name.clone(), version.clone()))
            .collect();
        for (instance, version) in instances {
            let differs = line(&version) != expected;
            self.inner
                .mismatch
                .with_label_values(&[instance.as_str()])
                .set(i64::from(differs));
            if differs
                && state
                    .warned
                    .insert((instance.clone(), version.clone(), validator.clone()))
            {
                tracing::warn!(
                    %instance,
                    instance_version = %version,
                    validator_version = %validator,
                    "The instance runs another HAProxy line than haproxy.binary, which validates its configs: \
                     a config that passed phase 2 may fail on the instance, or use less than it offers; \
                     set haproxy.binary to the instances' line"
                );
            }
        }
    }

    /// What `/debug/instances` shows for `instance`, once its version is known.
    pub fn instance(&self, instance: &str) -> Option<InstanceVersion> {
        let state = self.state();
        let version = state.instances.get(instance)?;
        let validator = state.validator.clone();
        Some(InstanceVersion {
            haproxy_line_mismatch: validator
                .as_deref()
                .is_some_and(|v| line(v) != line(version)),
            haproxy_version: version.clone(),
            validator_version: validator,
        })
    }

    /// Asks `driver`'s instance for its version in the background and records it; a
    /// failure is logged at DEBUG (the deployment itself already succeeded).
    pub fn spawn_check(&self, driver: Arc<dyn Driver>) {
        let check = self.clone();
        let span = tracing::debug_span!("haproxy_version", instance = %driver.name());
        tokio::spawn(
            async move {
                match driver.haproxy_version().await {
                    Ok(version) => check.record_instance(driver.name(), &version),
                    Err(reason) => {
                        tracing::debug!(%reason, "Cannot read the instance's HAProxy version");
                    }
                }
            }
            .instrument(span),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_show_info_and_the_data_plane_api() {
        let info = "Name: HAProxy\nVersion: 3.0.11-1\nRelease_date: 2025/06/03\n";
        assert_eq!(info_version(info), Some("3.0.11-1"));
        assert_eq!(info_version("Name: HAProxy\n"), None);
        let single = serde_json::json!({"info": {"version": "3.2.4", "pid": 7}});
        assert_eq!(dataplane_version(&single).as_deref(), Some("3.2.4"));
        let list = serde_json::json!([{"info": {"version": "2.6.12"}}]);
        assert_eq!(dataplane_version(&list).as_deref(), Some("2.6.12"));
        assert_eq!(dataplane_version(&serde_json::json!({})), None);
    }

    #[test]
    fn only_the_release_line_is_compared_and_series_follow_changes() {
        let registry = Registry::new();
        let check = VersionCheck::register(&registry).unwrap();
        check.record_instance("a", "2.6.12-1+deb12u4");
        assert!(
            !check.instance("a").unwrap().haproxy_line_mismatch,
            "no validator yet"
        );
        check.set_validator_version("2.6.9");
        assert!(!check.instance("a").unwrap().haproxy_line_mismatch);
        check.record_instance("a", "3.0.11-1");
        let shown = check.instance("a").unwrap();
        assert!(shown.haproxy_line_mismatch);
        assert_eq!(shown.validator_version.as_deref(), Some("2.6.9"));
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        assert!(
            text.contains("hapwright_instance_haproxy_line_mismatch{instance=\"a\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "hapwright_instance_haproxy_version_info{instance=\"a\",version=\"3.0.11-1\"} 1"
            ),
            "{text}"
        );
        assert!(
            !text.contains("2.6.12-1+deb12u4"),
            "the old version's series is gone: {text}"
        );
        check.forget_instance("a");
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        assert!(!text.contains("instance=\"a\""), "{text}");
    }
}
