//! The state record: what the last successful deployment put in the config
//! directory, written last, so a crash in the middle of a deployment can be told
//! apart from a finished one after a restart.
//!
//! `.hapwright-state.json` holds the version marker and the SHA-256 of every layout
//! file (`haproxy.cfg` as written, with its marker line). It is only rewritten after
//! the deployment it describes succeeded; a deployment that dies half-way leaves the
//! previous record, which then no longer matches the files.

use std::collections::BTreeMap;

use hapwright_eventbus::model::{ContentHash, RenderedConfig};
use serde::{Deserialize, Serialize};

use super::with_version_marker;

/// File name of the state record in the config directory. It starts with a dot, so
/// snapshots and the layout never include it.
pub const RECORD_FILE: &str = ".hapwright-state.json";

/// What one successful deployment wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployRecord {
    /// The version marker in `haproxy.cfg` (and in the worker after a reload).
    pub marker: String,
    /// Lowercase hex SHA-256 of every layout file, by path relative to the config
    /// directory (`haproxy.cfg`, `maps/hosts.map`).
    pub files: BTreeMap<String, String>,
}

impl DeployRecord {
    /// The record of `config` written with `marker` by
    /// [`ConfigDir::write`](super::ConfigDir::write): the hashes are of the bytes on
    /// disk, so `haproxy.cfg` is hashed with its marker line.
    pub fn new(config: &RenderedConfig, marker: &str) -> Self {
        Self::new_reusing(config, marker, None)
    }

    /// [`new`](Self::new), taking the hash of every file `config` shares with the
    /// render of `previous` (the same content, by pointer) from its record instead
    /// of hashing the file again: a deployment that changed one of 10,000
    /// certificates hashes one.
    pub fn new_reusing(
        config: &RenderedConfig,
        marker: &str,
        previous: Option<(&RenderedConfig, &DeployRecord)>,
    ) -> Self {
        let mut files = BTreeMap::new();
        for (file, content) in config.iter() {
            let relative = file.relative_path();
            if relative == "haproxy.cfg" {
                continue;
            }
            let known = previous.and_then(|(config, record)| {
                config
                    .get(&file)
                    .filter(|was| std::sync::Arc::ptr_eq(was, content))
                    .and_then(|_| record.files.get(&relative))
            });
            let hash = match known {
                Some(hash) => hash.clone(),
                None => hex(content.as_bytes()),
            };
            files.insert(relative, hash);
        }
        files.insert(
            "haproxy.cfg".to_owned(),
            hex(with_version_marker(config.main(), marker).as_bytes()),
        );
        Self {
            marker: marker.to_owned(),
            files,
        }
    }
}

/// How the config directory compares with its state record.
#[derive(Clone, Debug, PartialEq)]
pub enum RecordCheck {
    /// Every layout file, no more and no fewer, has its recorded hash, and
    /// `haproxy.cfg` carries the recorded marker: the directory is what the last
    /// successful deployment wrote.
    Consistent {
        /// The recorded marker.
        marker: String,
        /// The files, marker line removed (as [`ConfigDir::read_rendered`](super::ConfigDir::read_rendered)).
        config: RenderedConfig,
    },
    /// No record: nothing was deployed here by a hapwright that keeps records.
    Missing,
    /// The files are not what the record says (a deployment died half-way, or
    /// someone edited them): treat the instance as unknown.
    Mismatch {
        /// The first difference (`maps/hosts.map differs from the record`).
        detail: String,
    },
}

/// Lowercase hex SHA-256 of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    ContentHash::of(bytes).to_string()
}

/// The first difference between the recorded hashes and the files present, or `None`.
pub(crate) fn first_difference(
    record: &DeployRecord,
    on_disk: &BTreeMap<String, Vec<u8>>,
) -> Option<String> {
    let mut paths: Vec<&String> = record.files.keys().chain(on_disk.keys()).collect();
    paths.sort();
    paths.dedup();
    for path in paths {
        match (record.files.get(path), on_disk.get(path)) {
            (Some(_), None) => return Some(format!("{path} is in the state record but missing")),
            (None, Some(_)) => return Some(format!("{path} is not in the state record")),
            (Some(hash), Some(bytes)) if *hash != hex(bytes) => {
                return Some(format!("{path} differs from the state record"));
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_record_reusing_the_last_one_equals_one_made_afresh() {
        let shared: Arc<str> = Arc::from("PEM of a\n");
        let first = RenderedConfig::builder("global\n")
            .certificate("a.pem", shared.clone())
            .certificate("b.pem", "PEM of b\n")
            .map("hosts.map", "a.test be_a\n")
            .build();
        let last = DeployRecord::new(&first, "m1");
        // b changes in place, c is new, the map is rebuilt with equal text, a is
        // shared: only a may be taken from the last record.
        let second = RenderedConfig::builder("global\n    maxconn 10\n")
            .certificate("a.pem", shared)
            .certificate("b.pem", "PEM of b, renewed\n")
            .certificate("c.pem", "PEM of c\n")
            .map("hosts.map", "a.test be_a\n")
            .build();
        let reused = DeployRecord::new_reusing(&second, "m2", Some((&first, &last)));
        assert_eq!(reused, DeployRecord::new(&second, "m2"));
        assert_ne!(reused.files["certs/b.pem"], last.files["certs/b.pem"]);
        // Only files shared by pointer are taken from the last record: a wrong hash
        // there is copied for a, never for b.
        let mut wrong = last.clone();
        wrong.files.insert("certs/a.pem".to_owned(), "0".repeat(64));
        wrong.files.insert("certs/b.pem".to_owned(), "0".repeat(64));
        let from_wrong = DeployRecord::new_reusing(&second, "m2", Some((&first, &wrong)));
        assert_eq!(from_wrong.files["certs/a.pem"], "0".repeat(64));
        assert_eq!(from_wrong.files["certs/b.pem"], reused.files["certs/b.pem"]);
    }
}
