//! The files of an instance's config directory: crash-safe and permission-safe
//! writes (the [`mod@write`] module), the config version marker, snapshots of
//! the last good files to restore after a failed reload, the state record of the last
//! successful deployment ([`record`]), sweeping of leftovers, and fault injection for
//! tests ([`faults`]).
//!
//! Layout: `haproxy.cfg`, `maps/<name>`, `files/<name>`, `certs/<name>`,
//! plus hapwright's own `.hapwright-state.json` (and, while the safety valve holds a
//! removal, its `.hapwright-valve.json`: see [`crate::safety::ValveRecord`]; while
//! objects are quarantined, the renderer's `.hapwright-quarantine.json` and, during a
//! culprit search, `.hapwright-quarantine-baseline.json`). Files under `certs/` are written with
//! mode 0600 (or `socket.certMode` / `socket.certGroup`), everything else 0644 so
//! HAProxy can read it whatever user it runs as.
//!
//! Every function here is plain blocking code (it fsyncs): async callers run it on
//! the blocking pool (`tokio::task::spawn_blocking`).
//!
//! # Crash safety
//!
//! [`ConfigDir::write`] writes maps, files and certificates first and `haproxy.cfg`
//! last, each atomically; the caller then reloads and, once the reload is confirmed,
//! calls [`ConfigDir::write_record`]. After a restart, [`ConfigDir::check_record`]
//! tells whether the directory is exactly what the last successful deployment wrote;
//! anything else means the deployment died half-way (or someone edited the files),
//! and the instance must be treated as unknown.
//!
//! # The version marker
//!
//! To confirm that a reload really runs the new files, the `haproxy.cfg` hapwright
//! writes carries `setenv HAPWRIGHT_CONFIG_VERSION <hash-short>` as the first line of
//! its `global` section (a `global` section is prepended when the render has none).
//! After a reload the driver reads it back with `@1 show env HAPWRIGHT_CONFIG_VERSION`.

pub mod faults;
pub mod record;
pub mod write;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hapwright_eventbus::model::{FileKind, RenderedConfig, RenderedFileRef, SourceMap};

pub use faults::{FAULTS_VARIABLE, Faults, FaultsError, steps};
pub use record::{DeployRecord, RECORD_FILE, RecordCheck};
pub use write::{FileModes, TEMP_PREFIX, write_atomic, write_private};

use write::{Dirs, context, remove_file, write_file};

/// The subdirectories of the layout, in the order their files are written.
const SUBDIRS: [&str; 3] = ["maps", "files", "certs"];

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
    modes: FileModes,
    faults: Arc<Faults>,
    /// What the last complete [`write`](Self::write) or
    /// [`write_changes`](Self::write_changes) of this directory (and its clones) left
    /// there; cleared while a write runs and by anything else that changes the
    /// layout files, so it is never behind what is on disk.
    written: Arc<std::sync::Mutex<Option<Written>>>,
}

/// A render as written, with its version marker.
#[derive(Clone, Debug)]
struct Written {
    config: RenderedConfig,
    version: String,
}

impl ConfigDir {
    /// The directory at `root` (created on first write), with the default modes and
    /// the faults of [`FAULTS_VARIABLE`] (none unless a test sets it).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            modes: FileModes::default(),
            faults: Arc::new(Faults::from_env()),
            written: Arc::default(),
        }
    }

    /// Takes the record of the last complete write (see [`Self::written`]); a write
    /// that succeeds puts its own back.
    fn take_written(&self) -> Option<Written> {
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    fn set_written(&self, config: &RenderedConfig, version: &str) {
        *self
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Written {
            config: config.clone(),
            version: version.to_owned(),
        });
    }

    /// The config directory of a socket instance, with its configured file modes
    /// (`socket.certMode`, `socket.certGroup`) and the faults of
    /// [`FAULTS_VARIABLE`].
    pub fn for_instance(instance: &crate::client::socket::InstanceConfig) -> Self {
        Self::new(&instance.config_dir).with_modes(instance.file_modes.clone())
    }

    /// Replaces the file modes (from `socket.certMode` / `socket.certGroup`).
    #[must_use]
    pub fn with_modes(mut self, modes: FileModes) -> Self {
        self.modes = modes;
        self
    }

    /// Replaces the injected faults (tests).
    #[must_use]
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = Arc::new(faults);
        self
    }

    /// The injected faults; the driver calls [`Faults::reached`] at its steps.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The file modes.
    pub fn modes(&self) -> &FileModes {
        &self.modes
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Absolute path of a layout file.
    pub fn path_of(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    /// Writes one layout file safely with its layout mode, leaving the directory
    /// fsync to `dirty`.
    fn put(&self, relative: &str, content: &[u8], dirty: &mut Dirs) -> io::Result<()> {
        self.put_known(relative, content, None, dirty)
    }

    /// [`put`](Self::put) of a rendered file's shared content, which it need not read
    /// back when the file is as hapwright last left it ([`write::write_file_known`]).
    fn put_known(
        &self,
        relative: &str,
        content: &[u8],
        known: Option<&Arc<str>>,
        dirty: &mut Dirs,
    ) -> io::Result<()> {
        let plain = Path::new(relative)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            // Phase 1 rejects such names; never write outside the directory.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("`{relative}` is not a path inside the config directory"),
            ));
        }
        let (mode, group) = self.modes.for_path(relative);
        write::write_file_known(
            &self.path_of(relative),
            content,
            known,
            mode,
            group,
            &self.faults,
            Some(relative),
            dirty,
        )
    }

    /// Writes every file of `config` (maps, files and certificates first, then
    /// `haproxy.cfg` with the version marker) and removes every layout file `config`
    /// does not have, so the directory holds exactly the new render. Between the side
    /// files and `haproxy.cfg` it passes [`steps::AFTER_SIDE_FILES`].
    ///
    /// `previous` is no longer needed (stale files are found on disk); it is kept so
    /// callers need not change.
    ///
    /// # Errors
    ///
    /// The first failed step; files already renamed into place stay (restore a
    /// [`snapshot`](Self::snapshot) taken before), and no temporary file is left.
    pub fn write(
        &self,
        config: &RenderedConfig,
        version: &str,
        previous: Option<&RenderedConfig>,
    ) -> io::Result<()> {
        let _ = previous;
        self.take_written();
        self.write_all(config, version)?;
        self.set_written(config, version);
        Ok(())
    }

    /// Writes what differs between `previous` and `config`, when `previous` (with
    /// `version`) is what this directory's last complete write left: the maps, files
    /// and certificates added or changed, then `haproxy.cfg` when it changed, and
    /// removes those `config` no longer has. Files both renders share are not looked
    /// at: with 10,000 certificates a deployment that adds one touches one file, not
    /// 10,000. Anything else (no complete write yet in this process, a failed one,
    /// another render or version) is a full [`write`](Self::write).
    ///
    /// A file changed by hand between two deployments is not seen here; the drift
    /// check (`driftPreventionInterval`) reads every file and finds it.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write); the next write is then a full one.
    pub fn write_changes(
        &self,
        config: &RenderedConfig,
        version: &str,
        previous: &RenderedConfig,
    ) -> io::Result<()> {
        let written = self.take_written();
        let Some(written) = written.filter(|w| {
            w.version == version && w.config.hash() == previous.hash() && w.config == *previous
        }) else {
            return self.write(config, version, Some(previous));
        };
        let mut dirty = Dirs::default();
        let (old, new) = (written.config.groups(), config.groups());
        for ((old, new), kind) in old.into_iter().zip(new).zip(SUBDIRS) {
            for (name, _, now) in crate::haproxy::certs::file_changes(old, new) {
                let relative = format!("{kind}/{name}");
                match now {
                    Some(content) => {
                        self.put_known(&relative, content.as_bytes(), Some(content), &mut dirty)?;
                    }
                    None => remove_file(&self.path_of(&relative), &mut dirty)?,
                }
            }
        }
        // The side files' renames are durable before haproxy.cfg names them.
        dirty.sync()?;
        self.faults.reached(steps::AFTER_SIDE_FILES);
        if !hapwright_eventbus::model::same_text(written.config.main(), config.main()) {
            self.put(
                "haproxy.cfg",
                with_version_marker(config.main(), version).as_bytes(),
                &mut dirty,
            )?;
        }
        dirty.sync()?;
        self.set_written(config, version);
        Ok(())
    }

    /// [`write`](Self::write) itself.
    fn write_all(&self, config: &RenderedConfig, version: &str) -> io::Result<()> {
        let mut dirty = Dirs::default();
        let mut wanted = BTreeSet::new();
        for (file, content) in config.iter() {
            if file.kind != FileKind::Main {
                let relative = file.relative_path();
                self.put_known(&relative, content.as_bytes(), Some(content), &mut dirty)?;
                wanted.insert(relative);
            }
        }
        // The side files' renames are durable before haproxy.cfg names them.
        dirty.sync()?;
        self.faults.reached(steps::AFTER_SIDE_FILES);
        self.put(
            "haproxy.cfg",
            with_version_marker(config.main(), version).as_bytes(),
            &mut dirty,
        )?;
        for relative in self.layout_files()? {
            if relative != "haproxy.cfg" && !wanted.contains(&relative) {
                remove_file(&self.path_of(&relative), &mut dirty)?;
            }
        }
        dirty.sync()
    }

    /// Writes `config` as rendered (no version marker, no state record) with the
    /// layout's modes: `render --out`.
    pub fn write_rendered(&self, config: &RenderedConfig) -> io::Result<()> {
        self.take_written();
        let mut dirty = Dirs::default();
        for (file, content) in config.iter() {
            self.put(&file.relative_path(), content.as_bytes(), &mut dirty)?;
        }
        dirty.sync()
    }

    /// The relative paths of the layout files present (regular files only; hidden
    /// names such as temporary files and the state record are not layout files).
    fn layout_files(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        match std::fs::symlink_metadata(self.path_of("haproxy.cfg")) {
            Ok(_) => out.push("haproxy.cfg".to_owned()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
        for dir in SUBDIRS {
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
                out.push(format!("{dir}/{name}"));
            }
        }
        Ok(out)
    }

    /// Reads every layout file present (`haproxy.cfg`, `maps/*`, `files/*`, `certs/*`).
    pub fn snapshot(&self) -> io::Result<DirSnapshot> {
        let mut files = BTreeMap::new();
        for relative in self.layout_files()? {
            match std::fs::read(self.path_of(&relative)) {
                Ok(bytes) => {
                    files.insert(relative, bytes);
                }
                // A dangling haproxy.cfg link.
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => {
                    return Err(context(error, format!("cannot read {relative}")));
                }
            }
        }
        Ok(DirSnapshot { files })
    }

    /// Puts the directory back to `snapshot`, as safely as [`write`](Self::write):
    /// rewrites the files that differ (side files first, `haproxy.cfg` last) with the
    /// layout's modes, and removes layout files the snapshot did not have.
    pub fn restore(&self, snapshot: &DirSnapshot) -> io::Result<()> {
        self.take_written();
        self.faults.check_restore()?;
        let current = self.snapshot()?;
        let mut dirty = Dirs::default();
        let main = snapshot.files.get_key_value("haproxy.cfg");
        let side = snapshot.files.iter().filter(|(k, _)| *k != "haproxy.cfg");
        for (relative, content) in side.chain(main) {
            if current.files.get(relative) != Some(content) {
                self.put(relative, content, &mut dirty)?;
            }
        }
        for relative in current.files.keys() {
            if !snapshot.files.contains_key(relative) {
                remove_file(&self.path_of(relative), &mut dirty)?;
            }
        }
        dirty.sync()
    }

    /// Rebuilds the rendered config the directory holds (marker removed), with the
    /// marker's version; `None` when there is no `haproxy.cfg`.
    pub fn read_rendered(&self) -> io::Result<Option<(RenderedConfig, Option<String>)>> {
        Ok(rendered_of(&self.snapshot()?))
    }

    /// Records `record` as what the directory holds, atomically, as
    /// [`RECORD_FILE`]. Call it last, after the deployment it describes succeeded.
    pub fn write_record(&self, record: &DeployRecord) -> io::Result<()> {
        let json = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
        let mut dirty = Dirs::default();
        write_file(
            &self.path_of(RECORD_FILE),
            &json,
            write::PUBLIC_MODE,
            None,
            &self.faults,
            Some(RECORD_FILE),
            &mut dirty,
        )?;
        dirty.sync()
    }

    /// The version marker of the `haproxy.cfg` on disk (reads that file only);
    /// `None` when there is no file or no marker.
    pub fn marker(&self) -> io::Result<Option<String>> {
        match std::fs::read(self.path_of("haproxy.cfg")) {
            Ok(bytes) => Ok(strip_version_marker(&String::from_utf8_lossy(&bytes)).1),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The state record, `None` when there is none.
    pub fn read_record(&self) -> io::Result<Option<DeployRecord>> {
        let bytes = match std::fs::read(self.path_of(RECORD_FILE)) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(context(error, format!("cannot read {RECORD_FILE}"))),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Compares the directory with its state record ([`RecordCheck`]). Comparing
    /// the marker with the one the running worker reports is the caller's job.
    ///
    /// # Errors
    ///
    /// Only when the directory cannot be read; an unparsable record is a
    /// [`RecordCheck::Mismatch`].
    pub fn check_record(&self) -> io::Result<RecordCheck> {
        let record = match self.read_record() {
            Ok(Some(record)) => record,
            Ok(None) => return Ok(RecordCheck::Missing),
            Err(error) if error.kind() == io::ErrorKind::InvalidData => {
                return Ok(RecordCheck::Mismatch {
                    detail: format!("{RECORD_FILE} is unreadable: {error}"),
                });
            }
            Err(error) => return Err(error),
        };
        let snapshot = self.snapshot()?;
        if let Some(detail) = record::first_difference(&record, &snapshot.files) {
            return Ok(RecordCheck::Mismatch { detail });
        }
        let Some((config, marker)) = rendered_of(&snapshot) else {
            return Ok(RecordCheck::Mismatch {
                detail: "haproxy.cfg is missing".to_owned(),
            });
        };
        if marker.as_deref() != Some(record.marker.as_str()) {
            return Ok(RecordCheck::Mismatch {
                detail: format!(
                    "haproxy.cfg carries marker {}, the state record {}",
                    marker.as_deref().unwrap_or("(none)"),
                    record.marker
                ),
            });
        }
        Ok(RecordCheck::Consistent {
            marker: record.marker,
            config,
        })
    }

    /// Removes temporary files a killed hapwright left in the directory and its
    /// `maps/`, `files/` and `certs/` (names starting with [`TEMP_PREFIX`], and the
    /// `.<name>.hapwright-tmp` names of earlier versions); returns what it removed.
    /// Call it at start-up, before the first deployment to this directory.
    pub fn sweep(&self) -> io::Result<Vec<PathBuf>> {
        let mut removed = Vec::new();
        let mut dirty = Dirs::default();
        let dirs = std::iter::once(self.root.clone()).chain(SUBDIRS.map(|d| self.root.join(d)));
        for dir in dirs {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                Err(error) => return Err(context(error, format!("cannot list {}", dir.display()))),
            };
            for entry in entries {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let stale = name.starts_with(TEMP_PREFIX)
                    || (name.starts_with('.') && name.ends_with(write::LEGACY_TEMP_SUFFIX));
                // Never descend: a directory with such a name is not ours.
                if stale && !entry.file_type()?.is_dir() {
                    remove_file(&entry.path(), &mut dirty)?;
                    removed.push(entry.path());
                }
            }
        }
        dirty.sync()?;
        Ok(removed)
    }
}

/// The rendered config in a snapshot (marker removed) with the marker's value.
fn rendered_of(snapshot: &DirSnapshot) -> Option<(RenderedConfig, Option<String>)> {
    let main = snapshot.files.get("haproxy.cfg")?;
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
    Some((
        RenderedConfig::new(main, maps, files, certs, SourceMap::default()),
        version,
    ))
}

/// The relative path of a rendered file (`maps/hosts.map`).
pub fn relative_path(file: &RenderedFileRef) -> String {
    file.relative_path()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hapwright_eventbus::model::{FileGroup, HashedMain};

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

    /// A render of up to a few maps, files and certificates with names and contents
    /// drawn from `draw`; groups are carried over from `last` where `draw` keeps them,
    /// so renders share what did not change, as the renderer's do.
    fn next_render(
        last: Option<&RenderedConfig>,
        draw: &mut impl FnMut(u32) -> u32,
    ) -> RenderedConfig {
        let mut groups: [FileGroup; 3] = match last {
            Some(last) => last.groups().map(FileGroup::clone),
            None => Default::default(),
        };
        for files in &mut groups {
            if draw(3) == 0 {
                continue;
            }
            for _ in 0..draw(4) {
                let name = format!("f{}.pem", draw(6));
                match draw(3) {
                    0 => {
                        files.remove(&name);
                    }
                    _ => {
                        files.insert(name, Arc::from(format!("content {}\n", draw(4))));
                    }
                }
            }
        }
        let main = match (last, draw(3)) {
            (Some(last), 0 | 1) => last.main().to_string(),
            _ => format!("global\n    maxconn {}\n", draw(5)),
        };
        RenderedConfig::from_shared_groups(HashedMain::new(main), groups, Arc::default(), |_| None)
    }

    /// `write_changes` leaves the directory as a full `write` does: random renders,
    /// each written both ways into its own directory (now and then with another
    /// version, or after a write that failed half-way, which makes the next one
    /// full), compared file by file after every step.
    #[test]
    fn writing_the_changes_leaves_what_writing_everything_leaves() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut draw = move |below: u32| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % u64::from(below)) as u32
        };
        for _ in 0..40 {
            let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let (changes, full) = (ConfigDir::new(a.path()), ConfigDir::new(b.path()));
            let mut last = next_render(None, &mut draw);
            let mut version = "v0".to_owned();
            changes.write(&last, &version, None).unwrap();
            full.write(&last, &version, None).unwrap();
            for step in 0..12 {
                let next = next_render(Some(&last), &mut draw);
                if draw(8) == 0 {
                    version = format!("v{step}");
                }
                if draw(4) == 0 {
                    // A write that fails half-way (every map rewritten, then a
                    // certificate fails): the next one must not trust what this
                    // one left.
                    let failing = changes.clone().with_faults(Faults {
                        fail_write: Some("certs/failing.pem".to_owned()),
                        ..Faults::default()
                    });
                    let broken = RenderedConfig::new(
                        "global\n    maxconn 7\n",
                        (0..6)
                            .map(|k| (format!("f{k}.pem"), Arc::<str>::from("broken\n")))
                            .collect(),
                        BTreeMap::new(),
                        [("failing.pem".to_owned(), Arc::<str>::from("x\n"))].into(),
                        SourceMap::default(),
                    );
                    assert!(failing.write_changes(&broken, &version, &last).is_err());
                    assert!(
                        a.path().join("maps/f0.pem").exists(),
                        "the failed write got as far as the maps"
                    );
                }
                changes.write_changes(&next, &version, &last).unwrap();
                full.write(&next, &version, Some(&last)).unwrap();
                assert_eq!(changes.snapshot().unwrap(), full.snapshot().unwrap());
                last = next;
            }
        }
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
        let second = RenderedConfig::main_only("global\n    maxconn 1\n");
        config_dir.write(&second, "v2", Some(&first)).unwrap();
        assert!(!dir.path().join("maps/hosts.map").exists());
        config_dir.restore(&good).unwrap();
        assert_eq!(config_dir.snapshot().unwrap(), good);
        let (read, version) = config_dir.read_rendered().unwrap().unwrap();
        assert_eq!(read.hash(), first.hash());
        assert_eq!(version.as_deref(), Some("v1"));
    }
}
