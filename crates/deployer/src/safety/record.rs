//! The record of a held removal, kept beside the deployed files so a hold survives a
//! restart of hapwright (clean or killed).
//!
//! While the valve holds a removal it writes [`VALVE_RECORD_FILE`] into the config
//! directory of every socket instance (beside the state record of the deployed files,
//! [`crate::haproxy::files::RECORD_FILE`]): since when the removal is held, and the
//! high-water mark it is measured against as one config (the running config with
//! everything the window's earlier configs had put back). It is written atomically
//! (temporary file, fsync, rename, fsync of the directory) with mode 0600, since it
//! holds certificates; the hold's end removes it. At start the newest readable
//! record is read back: the first render is measured against it and, when it still
//! removes too much, the hold goes on with its first start.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use hapwright_eventbus::model::{RenderedConfig, SourceMap};
use hapwright_eventbus::record;
use serde::{Deserialize, Serialize};

use crate::haproxy::files::write_private;

/// File name of the valve's record in an instance's config directory. It starts with
/// a dot, so snapshots and the layout of the deployed files never include it.
pub const VALVE_RECORD_FILE: &str = ".hapwright-valve.json";

/// Version of the record's format.
const FORMAT: u32 = 1;

/// A held removal, as kept on disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValveRecord {
    /// Format version (1).
    pub format: u32,
    /// Since when the removal has been held (the first held render).
    pub held_since: SystemTime,
    /// When the record was written.
    pub written_at: SystemTime,
    /// The high-water mark the removal is measured against, as one config.
    pub baseline: RecordedConfig,
}

/// The files of a rendered config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedConfig {
    /// `haproxy.cfg`.
    pub main: String,
    /// `maps/<name>`.
    pub maps: BTreeMap<String, String>,
    /// `files/<name>`.
    pub files: BTreeMap<String, String>,
    /// `certs/<name>`.
    pub certificates: BTreeMap<String, String>,
}

impl RecordedConfig {
    /// The rendered config again (without a source map).
    pub fn into_config(self) -> RenderedConfig {
        let arcs = |files: BTreeMap<String, String>| {
            files
                .into_iter()
                .map(|(name, text)| (name, text.into()))
                .collect()
        };
        RenderedConfig::new(
            self.main,
            arcs(self.maps),
            arcs(self.files),
            arcs(self.certificates),
            SourceMap::default(),
        )
    }
}

impl ValveRecord {
    /// The record of a removal held since `held_since`, measured against `baseline`.
    pub fn new(held_since: SystemTime, baseline: &RenderedConfig) -> Self {
        let strings = |files: &hapwright_eventbus::model::FileGroup| {
            files
                .iter()
                .map(|(name, text)| (name.clone(), text.to_string()))
                .collect()
        };
        Self {
            format: FORMAT,
            held_since,
            written_at: SystemTime::now(),
            baseline: RecordedConfig {
                main: baseline.main().to_string(),
                maps: strings(baseline.maps()),
                files: strings(baseline.files()),
                certificates: strings(baseline.certificates()),
            },
        }
    }

    /// Writes the record into `dir`, atomically.
    pub fn write(&self, dir: &Path) -> io::Result<()> {
        let json = serde_json::to_vec(self).map_err(io::Error::other)?;
        write_private(&dir.join(VALVE_RECORD_FILE), &json)
    }

    /// The record in `dir`; `None` when there is none.
    ///
    /// # Errors
    ///
    /// When it cannot be read, or is not a record of this format
    /// ([`io::ErrorKind::InvalidData`]).
    pub fn read(dir: &Path) -> io::Result<Option<Self>> {
        let Some(record) = record::read_json::<Self>(&dir.join(VALVE_RECORD_FILE))? else {
            return Ok(None);
        };
        record::check_format(record.format, FORMAT)?;
        Ok(Some(record))
    }

    /// Removes the record from `dir` (nothing when there is none).
    pub fn remove(dir: &Path) -> io::Result<()> {
        record::remove_durably(dir, VALVE_RECORD_FILE)
    }
}

/// The newest readable record in `dirs`; unreadable ones are logged and skipped.
pub(super) fn read_newest(dirs: &[PathBuf]) -> Option<ValveRecord> {
    record::read_newest(
        dirs,
        ValveRecord::read,
        |record| record.written_at,
        |dir, error| {
            tracing::error!(
                path = %dir.join(VALVE_RECORD_FILE).display(),
                %error,
                "Safety valve: the record of a held removal is unreadable and is ignored"
            )
        },
    )
}

/// Writes `record` into every directory; failures are logged.
pub(super) fn write_all(dirs: &[PathBuf], record: &ValveRecord) {
    for dir in dirs {
        if let Err(error) = record.write(dir) {
            tracing::error!(
                path = %dir.join(VALVE_RECORD_FILE).display(),
                %error,
                "Safety valve: cannot write the record of the held removal; a restart would forget the hold"
            );
        }
    }
}

/// Removes the record from every directory; failures are logged.
pub(super) fn remove_all(dirs: &[PathBuf]) {
    for dir in dirs {
        if let Err(error) = ValveRecord::remove(dir) {
            tracing::error!(
                path = %dir.join(VALVE_RECORD_FILE).display(),
                %error,
                "Safety valve: cannot remove the record of an ended hold"
            );
        }
    }
}
