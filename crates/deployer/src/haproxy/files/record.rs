//! The state record: what the last successful deployment put in the config
//! directory, written last, so a crash in the middle of a deployment can be told
//! apart from a finished one after a restart.
//!
//! `.hapwright-state.json` holds the version marker and the SHA-256 of every layout
//! file (`haproxy.cfg` as written, with its marker line). It is only rewritten after
//! the deployment it describes succeeded; a deployment that dies half-way leaves the
//! previous record, which then no longer matches the files.

use std::collections::BTreeMap;

use hapwright_eventbus::model::{ContentHash, FileKind, RenderedConfig};
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
    /// directory (`haproxy.cfg`, `maps/hosts.map`). A persistent map: the record of
    /// the next deployment shares the entries of the files it did not change.
    pub files: imbl::OrdMap<String, String>,
}

impl DeployRecord {
    /// The record of `config` written with `marker` by
    /// [`ConfigDir::write`](super::ConfigDir::write): the hashes are of the bytes on
    /// disk, so `haproxy.cfg` is hashed with its marker line.
    pub fn new(config: &RenderedConfig, marker: &str) -> Self {
        Self::new_reusing(config, marker, None)
    }

    /// [`new`](Self::new), starting from `previous` (the record of the last render
    /// written, with that render): the record of the files `config` does not
    /// share with it is updated ([`imbl::OrdMap::diff`], which compares contents
    /// only where the two renders do not share them), the rest is taken as it is.
    /// A deployment that changed one of 10,000 certificates hashes one file and
    /// touches one entry.
    pub fn new_reusing(
        config: &RenderedConfig,
        marker: &str,
        previous: Option<(&RenderedConfig, &DeployRecord)>,
    ) -> Self {
        use imbl::ordmap::DiffItem;
        let mut files = match previous {
            Some((last, record)) => {
                let mut files = record.files.clone();
                for ((kind, old), new) in KINDS.into_iter().zip(last.groups()).zip(config.groups())
                {
                    for item in old.diff(new) {
                        match item {
                            DiffItem::Add(name, content)
                            | DiffItem::Update {
                                new: (name, content),
                                ..
                            } => {
                                files.insert(kind.relative_path(name), hex(content.as_bytes()));
                            }
                            DiffItem::Remove(name, _) => {
                                files.remove(&kind.relative_path(name));
                            }
                        }
                    }
                }
                files
            }
            None => config
                .iter()
                .filter(|(file, _)| file.kind != FileKind::Main)
                .map(|(file, content)| (file.relative_path(), hex(content.as_bytes())))
                .collect(),
        };
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

/// The kinds of a render's groups, in [`RenderedConfig::groups`] order.
const KINDS: [FileKind; 3] = [FileKind::Map, FileKind::File, FileKind::Certificate];

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
        // Only unchanged files are taken from the last record: a wrong hash there
        // is copied for a, never for b.
        let mut wrong = last.clone();
        wrong.files.insert("certs/a.pem".to_owned(), "0".repeat(64));
        wrong.files.insert("certs/b.pem".to_owned(), "0".repeat(64));
        let from_wrong = DeployRecord::new_reusing(&second, "m2", Some((&first, &wrong)));
        assert_eq!(from_wrong.files["certs/a.pem"], "0".repeat(64));
        assert_eq!(from_wrong.files["certs/b.pem"], reused.files["certs/b.pem"]);
        // Files removed leave the record; one added to another kind joins it.
        let third = RenderedConfig::builder("global\n    maxconn 10\n")
            .certificate("b.pem", "PEM of b, renewed\n")
            .file("503.http", "HTTP/1.0 503\n")
            .build();
        let after = DeployRecord::new_reusing(&third, "m3", Some((&second, &reused)));
        assert_eq!(after, DeployRecord::new(&third, "m3"));
        assert!(
            !after.files.contains_key("certs/a.pem") && !after.files.contains_key("maps/hosts.map")
        );
    }
}
