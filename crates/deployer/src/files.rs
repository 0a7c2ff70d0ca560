//! The files of an instance's config directory: atomic writes (temporary file in the
//! same directory, fsync, rename), the config version marker, and snapshots of the
//! last good files to restore after a failed reload.
//!
//! Layout (DESIGN §4): `haproxy.cfg`, `maps/<name>`, `files/<name>`, `certs/<name>`.
//!
//! # The version marker
//!
//! To confirm that a reload really runs the new files, the `haproxy.cfg` hapwright
//! writes carries `setenv HAPWRIGHT_CONFIG_VERSION <hash-short>` as the first line of
//! its `global` section (a `global` section is prepended when the render has none).
//! After a reload the driver reads it back with `@1 show env HAPWRIGHT_CONFIG_VERSION`.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hapwright_eventbus::model::{FileKind, RenderedConfig, RenderedFileRef, SourceMap};

/// The environment variable holding the config version in HAProxy's `global` section.
pub const VERSION_VARIABLE: &str = "HAPWRIGHT_CONFIG_VERSION";

/// The rendered `haproxy.cfg` with the version marker set to `version`: an existing
/// marker line is replaced; otherwise one is added after the `global` line, or a
/// `global` section holding it is prepended.
pub fn with_version_marker(main: &str, version: &str) -> String {
    let marker = format!("    setenv {VERSION_VARIABLE} {version}\n");
    let mut out = String::with_capacity(main.len() + marker.len() + 16);
    let mut inserted = false;
    for line in main.split_inclusive('\n') {
        if is_marker_line(line) {
            continue;
        }
        out.push_str(line);
        if !inserted && is_global_header(line) {
            if !line.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&marker);
            inserted = true;
        }
    }
    if !inserted {
        out.insert_str(0, &format!("global\n{marker}\n"));
    }
    out
}

/// Removes the version marker (the inverse of [`with_version_marker`] for a render
/// that had a `global` section), returning the marker's value.
pub fn strip_version_marker(main: &str) -> (String, Option<String>) {
    let mut version = None;
    let mut out = String::with_capacity(main.len());
    for line in main.split_inclusive('\n') {
        if is_marker_line(line) {
            version = line.split_whitespace().nth(2).map(str::to_owned);
        } else {
            out.push_str(line);
        }
    }
    (out, version)
}

fn is_marker_line(line: &str) -> bool {
    let mut words = line.split_whitespace();
    words.next() == Some("setenv") && words.next() == Some(VERSION_VARIABLE)
}

fn is_global_header(line: &str) -> bool {
    let trimmed = line.trim_end();
    // Section headers start in column 0 in practice; accept indentation too.
    let mut words = trimmed.split_whitespace();
    words.next() == Some("global") && words.next().is_none_or(|w| w.starts_with('#'))
}

/// Writes `content` to `path` atomically: a temporary file next to it, fsync, rename.
/// Readers see the old or the new content, never a mix.
pub fn write_atomic(path: &Path, content: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let tmp = dir.join(format!(".{}.hapwright-tmp", name.to_string_lossy()));
    {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(content)?;
        file.sync_all()?;
    }
    if let Err(error) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(error);
    }
    Ok(())
}

/// The files under one config directory, as bytes by relative path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirSnapshot {
    /// Content of every layout file present, by path relative to the config directory.
    pub files: BTreeMap<String, Vec<u8>>,
}

/// One instance's config directory.
#[derive(Clone, Debug)]
pub struct ConfigDir {
    root: PathBuf,
}

impl ConfigDir {
    /// The directory at `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Absolute path of a layout file.
    pub fn path_of(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    /// Writes every file of `config` atomically (maps, files and certificates first,
    /// `haproxy.cfg` with the version marker last) and removes layout files that
    /// `previous` had and `config` no longer has.
    pub fn write(
        &self,
        config: &RenderedConfig,
        version: &str,
        previous: Option<&RenderedConfig>,
    ) -> io::Result<()> {
        for (file, content) in config.iter() {
            if file.kind != FileKind::Main {
                write_atomic(&self.path_of(&file.relative_path()), content.as_bytes())?;
            }
        }
        write_atomic(
            &self.path_of("haproxy.cfg"),
            with_version_marker(config.main(), version).as_bytes(),
        )?;
        if let Some(previous) = previous {
            for (file, _) in previous.iter() {
                if file.kind != FileKind::Main && config.get(&file).is_none() {
                    remove_if_exists(&self.path_of(&file.relative_path()))?;
                }
            }
        }
        Ok(())
    }

    /// Reads every layout file present (`haproxy.cfg`, `maps/*`, `files/*`, `certs/*`).
    pub fn snapshot(&self) -> io::Result<DirSnapshot> {
        let mut files = BTreeMap::new();
        match std::fs::read(self.path_of("haproxy.cfg")) {
            Ok(bytes) => {
                files.insert("haproxy.cfg".to_owned(), bytes);
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
        for dir in ["maps", "files", "certs"] {
            let entries = match std::fs::read_dir(self.root.join(dir)) {
                Ok(entries) => entries,
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                Err(error) => return Err(error),
            };
            for entry in entries {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') || !entry.file_type()?.is_file() {
                    continue;
                }
                files.insert(format!("{dir}/{name}"), std::fs::read(entry.path())?);
            }
        }
        Ok(DirSnapshot { files })
    }

    /// Puts the directory back to `snapshot`: rewrites its files and removes layout
    /// files it did not have.
    pub fn restore(&self, snapshot: &DirSnapshot) -> io::Result<()> {
        let current = self.snapshot()?;
        for (relative, content) in &snapshot.files {
            if current.files.get(relative) != Some(content) {
                write_atomic(&self.path_of(relative), content)?;
            }
        }
        for relative in current.files.keys() {
            if !snapshot.files.contains_key(relative) {
                remove_if_exists(&self.path_of(relative))?;
            }
        }
        Ok(())
    }

    /// Rebuilds the rendered config the directory holds (marker removed), with the
    /// marker's version; `None` when there is no `haproxy.cfg`.
    pub fn read_rendered(&self) -> io::Result<Option<(RenderedConfig, Option<String>)>> {
        let snapshot = self.snapshot()?;
        let Some(main) = snapshot.files.get("haproxy.cfg") else {
            return Ok(None);
        };
        let (main, version) = strip_version_marker(&String::from_utf8_lossy(main));
        let mut maps = BTreeMap::new();
        let mut files = BTreeMap::new();
        let mut certs = BTreeMap::new();
        for (relative, content) in &snapshot.files {
            let Some((dir, name)) = relative.split_once('/') else {
                continue;
            };
            let content: Arc<str> = String::from_utf8_lossy(content).into();
            let target = match dir {
                "maps" => &mut maps,
                "files" => &mut files,
                "certs" => &mut certs,
                _ => continue,
            };
            target.insert(name.to_owned(), content);
        }
        Ok(Some((
            RenderedConfig::new(main, maps, files, certs, SourceMap::default()),
            version,
        )))
    }
}

fn remove_if_exists(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// The relative path of a rendered file (`maps/hosts.map`).
pub fn relative_path(file: &RenderedFileRef) -> String {
    file.relative_path()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_is_inserted_replaced_and_stripped() {
        let main = "global\n    maxconn 100\n\ndefaults\n    mode http\n";
        let with = with_version_marker(main, "abc");
        assert_eq!(
            with,
            "global\n    setenv HAPWRIGHT_CONFIG_VERSION abc\n    maxconn 100\n\ndefaults\n    mode http\n"
        );
        let again = with_version_marker(&with, "def");
        assert!(again.contains("HAPWRIGHT_CONFIG_VERSION def"));
        assert!(!again.contains("abc"));
        assert_eq!(
            strip_version_marker(&again),
            (main.to_owned(), Some("def".into()))
        );
        let no_global = with_version_marker("defaults\n    mode http\n", "x");
        assert!(no_global.starts_with("global\n    setenv HAPWRIGHT_CONFIG_VERSION x\n"));
    }

    #[test]
    fn writes_snapshots_and_restores() {
        let dir = tempfile::tempdir().unwrap();
        let config_dir = ConfigDir::new(dir.path());
        let mut maps = BTreeMap::new();
        maps.insert("hosts.map".to_owned(), Arc::<str>::from("a b\n"));
        let first = RenderedConfig::new(
            "global\n",
            maps,
            BTreeMap::new(),
            BTreeMap::new(),
            SourceMap::default(),
        );
        config_dir.write(&first, "v1", None).unwrap();
        let good = config_dir.snapshot().unwrap();
        assert_eq!(good.files.len(), 2);
        let second = RenderedConfig::new(
            "global\n    maxconn 1\n",
            BTreeMap::new(),
            BTreeMap::new(),
            BTreeMap::new(),
            SourceMap::default(),
        );
        config_dir.write(&second, "v2", Some(&first)).unwrap();
        assert!(!dir.path().join("maps/hosts.map").exists());
        config_dir.restore(&good).unwrap();
        assert_eq!(config_dir.snapshot().unwrap(), good);
        let (read, version) = config_dir.read_rendered().unwrap().unwrap();
        assert_eq!(read.hash(), first.hash());
        assert_eq!(version.as_deref(), Some("v1"));
    }
}
