//! The `files` source: a directory of manifests (or one manifest file) turned into
//! `ResourceIndexUpdated` events carrying indexed snapshots.
//!
//! # Behaviour
//!
//! - The directory is read non-recursively: `*.yaml`, `*.yml` and `*.json`, hidden
//!   files (`.name`) skipped, symlinks followed (ConfigMap volumes are symlinks into
//!   `..data/`). A `path` naming a file reads just that file.
//! - Each file is hashed; only files whose content changed are parsed. A file that
//!   fails (syntax, budget, size limit, unreadable, invalid UTF-8, an object without
//!   a name) keeps its last good objects and makes the source `Unhealthy` with
//!   `file:line:column: cause`; the other files are unaffected; fixing the file makes
//!   the source healthy again. A deleted file removes its objects.
//! - The same object (namespace/name) in two files: the file first in name order
//!   wins, and a warning names both files.
//! - A missing directory makes the source `Unhealthy` (its objects, if any, are
//!   kept); it recovers when the directory appears.
//! - Every change publishes one `ResourceIndexUpdated` with the new snapshot (a
//!   persistent map: O(log n) per changed object, no copy) and what changed. The
//!   first successful listing also publishes `ResourceSyncComplete`.
//!
//! The [`Scanner`] is the synchronous core (listing, reading, parsing, snapshot
//! maintenance); [`FilesSource`] is the component that runs it on every settled
//! [`FileWatch`] wake-up.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use hapwright_eventbus::config::{ByteSize, ConfigIssue};
use hapwright_eventbus::model::{
    ContentHash, Diagnostic, FieldPath, IndexedObject, ObjectKey, ResourceChange, ResourceSnapshot,
    SourceLocation, UpsertOutcome,
};
use hapwright_eventbus::{
    Component, ComponentError, Context, EventPayload, Health, HealthState, ResourceIndexUpdated,
    ResourceSyncComplete,
};
use tracing::Instrument;

use crate::config::{FilesConfig, WatchedResource};
use crate::filewatch::{FileWatch, Wake, WatchOptions};
use crate::manifest::{self, Filter};
use crate::yaml::Limits;

/// Why the `files` source could not list its manifests. Retryable: the source keeps
/// its last good objects, reports itself `Unhealthy` with this message, and lists
/// again on the next change or poll.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ListError {
    /// The configured path does not exist (yet).
    #[error("{} does not exist", path.display())]
    PathMissing {
        /// The configured path.
        path: PathBuf,
    },
    /// The path exists but its metadata cannot be read (permissions, I/O).
    #[error("cannot access {}: {reason}", path.display())]
    AccessFailed {
        /// The configured path.
        path: PathBuf,
        /// The operating system's message (kept as text so the error compares equal
        /// across scans and a repeated failure is logged once).
        reason: String,
    },
    /// The directory cannot be read.
    #[error("cannot list directory {}: {reason}", path.display())]
    ReadDirFailed {
        /// The configured directory.
        path: PathBuf,
        /// The operating system's message.
        reason: String,
    },
}

/// File name extensions the directory listing picks up.
pub const EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// How much of each file a scan re-reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanMode {
    /// Re-read only files whose size, modification time or inode changed (after a
    /// change notification).
    Quick,
    /// Re-read and hash every file (the first scan and the periodic rescan).
    Full,
}

/// The outcome of one [`Scanner::scan`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScanReport {
    /// What changed in the snapshot.
    pub change: ResourceChange,
    /// Whether the directory (or file) could be listed.
    pub listed: bool,
    /// Warnings found in this scan: objects defined in two files, duplicates
    /// inside a file.
    pub warnings: Vec<Diagnostic>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: (u64, u64),
    changed: (i64, i64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        let (inode, changed) = {
            use std::os::unix::fs::MetadataExt;
            ((meta.dev(), meta.ino()), (meta.ctime(), meta.ctime_nsec()))
        };
        #[cfg(not(unix))]
        let (inode, changed) = ((0, 0), (0, 0));
        Self {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode,
            changed,
        }
    }
}

/// The files defining one object, in name order: almost always exactly one, so a
/// sorted vector (one small allocation) rather than a set (a tree node per object).
#[derive(Debug, Default)]
struct Owners(Vec<Arc<str>>);

impl Owners {
    fn insert(&mut self, name: Arc<str>) {
        if let Err(at) = self.0.binary_search(&name) {
            // Room for exactly the usual one (a plain push would make room for four).
            self.0.reserve_exact(1);
            self.0.insert(at, name);
        }
    }

    /// Removes `name`; whether no file is left.
    fn remove(&mut self, name: &Arc<str>) -> bool {
        if let Ok(at) = self.0.binary_search(name) {
            self.0.remove(at);
        }
        self.0.is_empty()
    }

    fn iter(&self) -> std::slice::Iter<'_, Arc<str>> {
        self.0.iter()
    }
}

#[derive(Debug)]
struct FileEntry {
    path: PathBuf,
    display: String,
    stamp: Option<Stamp>,
    /// Hash of the last content read (good or bad).
    hash: Option<ContentHash>,
    /// Last good objects, serialized and indexed (shared with the snapshot).
    objects: BTreeMap<ObjectKey, IndexedObject>,
    /// Why the content with `hash` was rejected.
    parse_error: Option<Diagnostic>,
    /// Why the file could not be read at the last attempt.
    read_error: Option<Diagnostic>,
}

impl FileEntry {
    fn error(&self) -> Option<&Diagnostic> {
        self.read_error.as_ref().or(self.parse_error.as_ref())
    }
}

enum Refresh {
    Unchanged,
    Replaced(BTreeMap<ObjectKey, IndexedObject>, Vec<Diagnostic>),
    Vanished,
}

/// Limits and filters applied while reading one file.
struct ReadContext<'a> {
    max_file_size: u64,
    filter: &'a Filter,
    limits: &'a Limits,
    /// The snapshot's `indexBy` paths: objects are indexed where they are parsed.
    index_by: &'a [FieldPath],
    /// What the other members of a shared scan saw in this round.
    reads: Option<&'a RoundReads>,
}

/// One round of a shared scan: each file's metadata and content as the first member
/// to look saw them, so that every member of the round sees the same files. Without
/// it, a file written while the round runs could reach one member and not the next
/// (a new Service without its EndpointSlice), and the two updates would go out one
/// reconciliation apart.
#[derive(Debug, Default)]
struct RoundReads {
    files: std::sync::Mutex<HashMap<PathBuf, Observed>>,
}

/// What one file looked like to the first member that looked.
#[derive(Debug, Default)]
struct Observed {
    meta: Option<Result<(Stamp, u64), SeenError>>,
    /// The whole content, kept only when it was read to its end.
    bytes: Option<Result<Arc<[u8]>, SeenError>>,
}

/// An I/O error, kept to be given to every member of the round.
#[derive(Clone, Debug)]
struct SeenError {
    kind: std::io::ErrorKind,
    message: String,
}

impl SeenError {
    fn of(error: &std::io::Error) -> Self {
        Self {
            kind: error.kind(),
            message: error.to_string(),
        }
    }

    fn to_error(&self) -> std::io::Error {
        std::io::Error::new(self.kind, self.message.clone())
    }
}

impl RoundReads {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Observed>> {
        self.files
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The file's stamp and length: as seen earlier in the round, else now.
    fn metadata(&self, path: &Path) -> std::io::Result<(Stamp, u64)> {
        self.observe(
            path,
            |observed| &mut observed.meta,
            || std::fs::metadata(path).map(|meta| (Stamp::of(&meta), meta.len())),
            |_| true,
        )
    }

    /// The file's content, at most `limit + 1` bytes: as read earlier in the round
    /// (when that read reached the end of the file), else now.
    fn read(&self, path: &Path, limit: u64, expected: u64) -> std::io::Result<Arc<[u8]>> {
        self.observe(
            path,
            |observed| &mut observed.bytes,
            || read_at_most(path, limit, expected).map(Arc::from),
            // A read cut at this member's limit is not the whole file another
            // member with a higher limit would read.
            |bytes| bytes.len() as u64 <= limit,
        )
    }

    /// One observation of `path`, in the field `slot` picks: the one made earlier in
    /// the round, else `look`'s, kept for the other members unless `keep` refuses a
    /// successful one.
    fn observe<T: Clone>(
        &self,
        path: &Path,
        slot: fn(&mut Observed) -> &mut Option<Result<T, SeenError>>,
        look: impl FnOnce() -> std::io::Result<T>,
        keep: impl FnOnce(&T) -> bool,
    ) -> std::io::Result<T> {
        if let Some(seen) = self.lock().get_mut(path).and_then(|o| slot(o).clone()) {
            return seen.map_err(|e| e.to_error());
        }
        let now = look();
        if now.as_ref().is_ok_and(|value| !keep(value)) {
            return now;
        }
        let now = now.map_err(|e| SeenError::of(&e));
        let mut files = self.lock();
        slot(files.entry(path.to_owned()).or_default())
            .get_or_insert(now)
            .clone()
            .map_err(|e| e.to_error())
    }
}

/// A file's content: read by this member, or shared by the members of a round.
enum FileBytes {
    Owned(Vec<u8>),
    Shared(Arc<[u8]>),
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Owned(bytes) => bytes,
            Self::Shared(bytes) => bytes,
        }
    }
}

/// At most `limit + 1` bytes of the file: enough to tell that it is over `limit`.
/// `expected` is the length its metadata gave.
fn read_at_most(path: &Path, limit: u64, expected: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(usize::try_from(expected.min(limit)).unwrap_or(0));
    std::fs::File::open(path).and_then(|file| file.take(limit + 1).read_to_end(&mut bytes))?;
    Ok(bytes)
}

/// The synchronous core of the files source: keeps every file's last good objects,
/// which file owns which object, and the published snapshot.
#[derive(Debug)]
pub struct Scanner {
    source: Arc<str>,
    path: PathBuf,
    max_file_size: ByteSize,
    filter: Filter,
    limits: Limits,
    files: BTreeMap<Arc<str>, FileEntry>,
    /// Files defining each object, in name order; the first one wins.
    owners: HashMap<ObjectKey, Owners>,
    snapshot: ResourceSnapshot,
    listing_error: Option<ListError>,
}

impl Scanner {
    /// A scanner for `files.path` that keeps objects passing `filter`, indexed by
    /// `index_by`.
    pub fn new(
        source: impl Into<Arc<str>>,
        files: &FilesConfig,
        filter: Filter,
        index_by: Vec<FieldPath>,
        limits: Limits,
    ) -> Self {
        Self {
            source: source.into(),
            path: files.path.clone(),
            max_file_size: files.max_file_size,
            filter,
            limits,
            files: BTreeMap::new(),
            owners: HashMap::new(),
            snapshot: ResourceSnapshot::new(index_by),
            listing_error: None,
        }
    }

    /// The current snapshot (cheap to clone).
    pub fn snapshot(&self) -> &ResourceSnapshot {
        &self.snapshot
    }

    /// The watched path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Errors of files whose last read or parse failed, in file name order.
    pub fn file_errors(&self) -> Vec<&Diagnostic> {
        self.files.values().filter_map(FileEntry::error).collect()
    }

    /// `Healthy` when the directory is listed and every file parsed, otherwise
    /// `Unhealthy` with the reason: the listing problem, or the first file error
    /// (`file:line:column: cause`) and how many more files fail.
    pub fn health(&self) -> Health {
        let unhealthy = |reason: String| Health::new(HealthState::Unhealthy, Some(reason));
        if let Some(reason) = &self.listing_error {
            return unhealthy(reason.to_string());
        }
        let errors = self.file_errors();
        match errors.as_slice() {
            [] => Health::new(HealthState::Healthy, None),
            [only] => unhealthy(only.to_string()),
            [first, rest @ ..] => unhealthy(format!(
                "{first} (and {} more file{} failing)",
                rest.len(),
                if rest.len() == 1 { "" } else { "s" }
            )),
        }
    }

    /// Lists the directory, re-reads what changed, and applies the differences to the
    /// snapshot.
    pub fn scan(&mut self, mode: ScanMode) -> ScanReport {
        let listing = self.list();
        self.scan_listed(mode, listing, None)
    }

    /// [`scan`](Self::scan) of the files in `listing`, with `reads` shared by the
    /// members of a shared scan's round.
    fn scan_listed(
        &mut self,
        mode: ScanMode,
        listing: Result<Vec<(Arc<str>, PathBuf)>, ListError>,
        reads: Option<&RoundReads>,
    ) -> ScanReport {
        let mut report = ScanReport::default();
        let listing = match listing {
            Ok(listing) => listing,
            Err(reason) => {
                if self.listing_error.as_ref() != Some(&reason) {
                    tracing::warn!(source = %self.source, %reason, "Cannot list manifests; keeping the last good objects");
                }
                self.listing_error = Some(reason);
                return report;
            }
        };
        self.listing_error = None;
        report.listed = true;

        let mut affected: BTreeSet<ObjectKey> = BTreeSet::new();
        let present: BTreeSet<Arc<str>> = listing.iter().map(|(name, _)| name.clone()).collect();
        let gone: Vec<Arc<str>> = self
            .files
            .keys()
            .filter(|name| !present.contains(*name))
            .cloned()
            .collect();
        for name in gone {
            self.drop_file(&name, &mut affected);
        }

        let context = ReadContext {
            max_file_size: self.max_file_size.bytes(),
            filter: &self.filter,
            limits: &self.limits,
            index_by: self.snapshot.index_by(),
            reads,
        };
        for (name, path) in listing {
            self.files.entry(name).or_insert_with(|| FileEntry {
                display: path.display().to_string(),
                path,
                stamp: None,
                hash: None,
                objects: BTreeMap::new(),
                parse_error: None,
                read_error: None,
            });
        }
        let mut work: Vec<(&Arc<str>, &mut FileEntry)> = self
            .files
            .iter_mut()
            .filter(|(name, _)| present.contains(*name))
            .collect();
        let results = refresh_all(&mut work, mode, &context);
        drop(work);

        let mut vanished = Vec::new();
        for (name, outcome) in results {
            let Some(entry) = self.files.get_mut(&name) else {
                continue;
            };
            match outcome {
                Refresh::Unchanged => {}
                Refresh::Vanished => vanished.push(name),
                Refresh::Replaced(objects, warnings) => {
                    report.warnings.extend(warnings);
                    let old = std::mem::replace(&mut entry.objects, objects);
                    for key in old.keys() {
                        if !entry.objects.contains_key(key) {
                            if let Some(set) = self.owners.get_mut(key)
                                && set.remove(&name)
                            {
                                self.owners.remove(key);
                            }
                            affected.insert(key.clone());
                        }
                    }
                    for (key, object) in &entry.objects {
                        if old.get(key) != Some(object) {
                            affected.insert(key.clone());
                        }
                        self.owners
                            .entry(key.clone())
                            .or_default()
                            .insert(name.clone());
                    }
                }
            }
        }
        for name in vanished {
            self.drop_file(&name, &mut affected);
        }

        for key in affected {
            let winner = self.owners.get(&key).and_then(|owners| {
                let mut names = owners.iter();
                let first = names.next()?;
                for other in names {
                    let message = format!(
                        "object {key} is defined in {} and {}; using the one from {} (first in name order)",
                        self.files[first].display, self.files[other].display, self.files[first].display
                    );
                    tracing::warn!(source = %self.source, object = %key, winner = %self.files[first].display, ignored = %self.files[other].display, "Object defined in two files; the first in name order wins");
                    report.warnings.push(
                        Diagnostic::warning(message)
                            .at(SourceLocation::new(self.files[other].display.clone(), None, None)),
                    );
                }
                self.files[first].objects.get(&key).cloned()
            });
            match winner {
                Some(object) => match self.snapshot.upsert_indexed(key.clone(), object) {
                    Some(UpsertOutcome::Added) => report.change.added.push(key),
                    Some(UpsertOutcome::Modified) => report.change.modified.push(key),
                    None => {}
                },
                None => {
                    if self.snapshot.remove(&key).is_some() {
                        report.change.removed.push(key);
                    }
                }
            }
        }
        report
    }

    fn drop_file(&mut self, name: &Arc<str>, affected: &mut BTreeSet<ObjectKey>) {
        let Some(entry) = self.files.remove(name) else {
            return;
        };
        tracing::debug!(source = %self.source, file = %entry.display, "Manifest file removed");
        for key in entry.objects.into_keys() {
            if let Some(set) = self.owners.get_mut(&key)
                && set.remove(name)
            {
                self.owners.remove(&key);
            }
            affected.insert(key);
        }
    }

    /// The files to read, in name order.
    fn list(&self) -> Result<Vec<(Arc<str>, PathBuf)>, ListError> {
        let path = || self.path.clone();
        let meta = std::fs::metadata(&self.path).map_err(|error| match error.kind() {
            std::io::ErrorKind::NotFound => ListError::PathMissing { path: path() },
            _ => ListError::AccessFailed {
                path: path(),
                reason: error.to_string(),
            },
        })?;
        if !meta.is_dir() {
            let name = self.path.file_name().map_or_else(
                || self.path.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            return Ok(vec![(name.into(), self.path.clone())]);
        }
        let read_dir_failed = |error: std::io::Error| ListError::ReadDirFailed {
            path: path(),
            reason: error.to_string(),
        };
        let entries = std::fs::read_dir(&self.path).map_err(read_dir_failed)?;
        let mut listing = Vec::new();
        for entry in entries {
            let entry = entry.map_err(read_dir_failed)?;
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str() else {
                tracing::warn!(source = %self.source, file = ?file_name, "Skipping a file whose name is not UTF-8");
                continue;
            };
            if name.starts_with('.') || !has_manifest_extension(name) {
                continue;
            }
            let path = entry.path();
            // Follows symlinks; a dangling link or a directory named `x.yaml` is skipped.
            if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                listing.push((Arc::from(name), path));
            }
        }
        listing.sort();
        Ok(listing)
    }
}

fn has_manifest_extension(name: &str) -> bool {
    Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
}

/// Refreshes every listed file; with many files, on several threads (reading and
/// parsing dominate an initial sync). Results come back in file name order.
fn refresh_all(
    work: &mut [(&Arc<str>, &mut FileEntry)],
    mode: ScanMode,
    context: &ReadContext<'_>,
) -> Vec<(Arc<str>, Refresh)> {
    const PARALLEL_FROM: usize = 32;
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(8);
    if work.len() < PARALLEL_FROM || threads < 2 {
        return work
            .iter_mut()
            .map(|(name, entry)| (Arc::clone(name), refresh(entry, mode, context)))
            .collect();
    }
    let chunk = work.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = work
            .chunks_mut(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter_mut()
                        .map(|(name, entry)| (Arc::clone(name), refresh(entry, mode, context)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

/// What reading one file found.
enum FileRead {
    /// Its stamp is as last read (quick scans only).
    Unchanged,
    /// It is gone.
    Vanished,
    /// Its bytes, with the stamp they were read at.
    Read(Stamp, FileBytes),
}

/// Reads `entry`'s file, unless a quick scan finds its stamp unchanged. A file
/// that cannot be read or is over `files.maxFileSize` is an error located at it.
fn read_file(
    entry: &FileEntry,
    mode: ScanMode,
    context: &ReadContext<'_>,
) -> Result<FileRead, Box<Diagnostic>> {
    let location = || SourceLocation::new(entry.display.clone(), None, None);
    let cannot_read = |error: std::io::Error| {
        Box::new(Diagnostic::error(format!("cannot read file: {error}")).at(location()))
    };
    let too_large = |size: u64| {
        Box::new(
            Diagnostic::error(format!(
                "file is too large: {size} bytes, over the {} limit (files.maxFileSize)",
                ByteSize(context.max_file_size)
            ))
            .at(location()),
        )
    };
    let metadata = match context.reads {
        Some(reads) => reads.metadata(&entry.path),
        None => std::fs::metadata(&entry.path).map(|meta| (Stamp::of(&meta), meta.len())),
    };
    let (stamp, len) = match metadata {
        Ok(seen) => seen,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(FileRead::Vanished);
        }
        Err(error) => return Err(cannot_read(error)),
    };
    if mode == ScanMode::Quick && entry.stamp == Some(stamp) {
        return Ok(FileRead::Unchanged);
    }
    if len > context.max_file_size {
        return Err(too_large(len));
    }
    let read = match context.reads {
        Some(reads) => reads
            .read(&entry.path, context.max_file_size, len)
            .map(FileBytes::Shared),
        None => read_at_most(&entry.path, context.max_file_size, len).map(FileBytes::Owned),
    };
    match read {
        Ok(bytes) if bytes.len() as u64 > context.max_file_size => {
            Err(too_large(bytes.len() as u64))
        }
        Ok(bytes) => Ok(FileRead::Read(stamp, bytes)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(FileRead::Vanished),
        Err(error) => Err(cannot_read(error)),
    }
}

/// Re-reads one file if needed. Read problems keep the last good objects.
fn refresh(entry: &mut FileEntry, mode: ScanMode, context: &ReadContext<'_>) -> Refresh {
    let (stamp, bytes) = match read_file(entry, mode, context) {
        Ok(FileRead::Read(stamp, bytes)) => (stamp, bytes),
        Ok(FileRead::Unchanged) => return Refresh::Unchanged,
        Ok(FileRead::Vanished) => return Refresh::Vanished,
        Err(problem) => {
            entry.read_error = Some(*problem);
            entry.stamp = None;
            return Refresh::Unchanged;
        }
    };
    entry.stamp = Some(stamp);
    entry.read_error = None;
    let hash = ContentHash::of(&bytes);
    if entry.hash == Some(hash) {
        return Refresh::Unchanged;
    }
    entry.hash = Some(hash);
    match manifest::parse(&bytes, &entry.display, context.filter, context.limits) {
        Ok(parsed) => {
            if entry.parse_error.take().is_some() {
                tracing::info!(file = %entry.display, "Manifest file parses again");
            }
            for warning in &parsed.warnings {
                tracing::warn!(file = %entry.display, warning = %warning, "Duplicate object in manifest file");
            }
            // Only the compact JSON text is kept: a parsed value costs several times
            // its size in heap.
            let objects = parsed
                .objects
                .into_iter()
                .map(|(key, value)| (key, IndexedObject::new(&value, context.index_by)))
                .collect();
            Refresh::Replaced(objects, parsed.warnings)
        }
        Err(error) => {
            tracing::warn!(file = %entry.display, %error, "Manifest file rejected; keeping its last good objects");
            entry.parse_error = Some(error);
            Refresh::Unchanged
        }
    }
}

// === impl FilesSource ===

/// The `files` source component. Its name is `source/<resource name>`.
pub struct FilesSource {
    component: String,
    resource: Arc<str>,
    work: Work,
}

/// What a [`FilesSource`] runs.
enum Work {
    /// Its own watch and scan.
    Own(Box<Scanner>, WatchOptions),
    /// One scan shared by the sources of one directory ([`FilesSource::share_scans`]).
    Shared(Arc<SharedScan>),
}

/// The watch and scan shared by files sources that read the same path with the same
/// timing. The member that runs first takes the work (one [`FileWatch`], every
/// member's [`Scanner`]) and publishes for all of them; each member reports its own
/// health, passed to it by that scan.
struct SharedScan {
    path: PathBuf,
    /// Taken by the member that runs first.
    work: std::sync::Mutex<Option<(Vec<Member>, WatchOptions)>>,
    /// Each member's health as the scan last found it (`None` before the first scan).
    health: BTreeMap<Arc<str>, tokio::sync::watch::Receiver<Option<Health>>>,
}

/// One watched resource inside a scan.
struct Member {
    resource: Arc<str>,
    scanner: Scanner,
    health: tokio::sync::watch::Sender<Option<Health>>,
    synced: bool,
}

impl Member {
    fn new(resource: Arc<str>, scanner: Scanner) -> Self {
        Self {
            resource,
            scanner,
            health: tokio::sync::watch::Sender::new(None),
            synced: false,
        }
    }
}

impl std::fmt::Debug for FilesSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = match &self.work {
            Work::Own(scanner, _) => &scanner.path,
            Work::Shared(shared) => &shared.path,
        };
        f.debug_struct("FilesSource")
            .field("resource", &self.resource)
            .field("path", path)
            .field("shared", &matches!(self.work, Work::Shared(_)))
            .finish()
    }
}

impl FilesSource {
    /// Builds the source for watched resource `name`. Fails when the resource has no
    /// `files` source.
    pub fn new(name: &str, resource: &WatchedResource) -> Result<Self, ConfigIssue> {
        let Some(files) = &resource.files else {
            return Err(ConfigIssue::new(name, "not a `files` source"));
        };
        Ok(Self::from_parts(
            name,
            files,
            resource.filter(),
            resource.index_by.clone(),
        ))
    }

    /// Builds the source from its parts.
    pub fn from_parts(
        name: &str,
        files: &FilesConfig,
        filter: Filter,
        index_by: Vec<FieldPath>,
    ) -> Self {
        let watch = WatchOptions {
            settle: files.settle.get(),
            max_settle: (files.settle.get() * 20).max(std::time::Duration::from_millis(200)),
            rescan_interval: files.rescan_interval.get(),
        };
        Self {
            component: format!("source/{name}"),
            resource: name.into(),
            work: Work::Own(
                Box::new(Scanner::new(
                    name,
                    files,
                    filter,
                    index_by,
                    Limits::default(),
                )),
                watch,
            ),
        }
    }

    /// Lets sources that read the same path with the same `settle` and
    /// `rescanInterval` share one watch and one scan per wake-up. Each stays a
    /// component of its own (name, health, objects), but one file write that
    /// changes objects of several of them (a Service and its EndpointSlice in one
    /// manifest) is published as back-to-back updates from one scan, not from scans
    /// that finish milliseconds apart, so the debouncer gathers them into one
    /// reconciliation. Sources alone on their path are returned unchanged, in order.
    pub fn share_scans(sources: Vec<FilesSource>) -> Vec<FilesSource> {
        let key = |source: &FilesSource| match &source.work {
            Work::Own(scanner, watch) => Some((scanner.path.clone(), *watch)),
            Work::Shared(_) => None,
        };
        let mut counts: HashMap<(PathBuf, WatchOptions), usize> = HashMap::new();
        for source in &sources {
            if let Some(key) = key(source) {
                *counts.entry(key).or_default() += 1;
            }
        }
        let mut groups: HashMap<(PathBuf, WatchOptions), Vec<Member>> = HashMap::new();
        let mut order = Vec::with_capacity(sources.len());
        for source in sources {
            match key(&source).filter(|key| counts[key] > 1) {
                Some(key) => {
                    let FilesSource {
                        component,
                        resource,
                        work,
                    } = source;
                    let Work::Own(scanner, _) = work else {
                        unreachable!("only sources with their own scan have a key")
                    };
                    groups
                        .entry(key.clone())
                        .or_default()
                        .push(Member::new(resource.clone(), *scanner));
                    order.push(Err((component, resource, key)));
                }
                None => order.push(Ok(source)),
            }
        }
        let shared: HashMap<(PathBuf, WatchOptions), Arc<SharedScan>> = groups
            .into_iter()
            .map(|(key, members)| {
                let health = members
                    .iter()
                    .map(|member| (member.resource.clone(), member.health.subscribe()))
                    .collect();
                let scan = SharedScan {
                    path: key.0.clone(),
                    work: std::sync::Mutex::new(Some((members, key.1))),
                    health,
                };
                (key, Arc::new(scan))
            })
            .collect();
        order
            .into_iter()
            .map(|entry| match entry {
                Ok(source) => source,
                Err((component, resource, key)) => FilesSource {
                    component,
                    resource,
                    work: Work::Shared(shared[&key].clone()),
                },
            })
            .collect()
    }
}

#[async_trait::async_trait]
impl Component for FilesSource {
    fn name(&self) -> &str {
        &self.component
    }

    async fn run(self: Box<Self>, ctx: Context) -> Result<(), ComponentError> {
        let FilesSource { resource, work, .. } = *self;
        let path = match &work {
            Work::Own(scanner, _) => scanner.path.clone(),
            Work::Shared(shared) => shared.path.clone(),
        };
        let span = tracing::info_span!("files_source", source = %resource, path = %path.display());
        match work {
            Work::Own(scanner, watch) => {
                let member = Member::new(resource.clone(), *scanner);
                run(resource, path, vec![member], watch, ctx)
                    .instrument(span)
                    .await
            }
            Work::Shared(shared) => {
                let taken = shared
                    .work
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
                match taken {
                    Some((members, watch)) => {
                        run(resource, path, members, watch, ctx)
                            .instrument(span)
                            .await
                    }
                    None => follow(resource, &shared, ctx).instrument(span).await,
                }
            }
        }
    }
}

/// Applies a scan's verdict to a component's health.
fn report_health(ctx: &Context, health: &Health) {
    ctx.health().set(health.state, health.reason.clone());
}

/// Watches the path and scans every member on each wake-up; publishes each member's
/// update, all after the whole scan. `own` is the running component's resource,
/// whose health goes to `ctx`; the other members get theirs through their channel.
async fn run(
    own: Arc<str>,
    path: PathBuf,
    mut members: Vec<Member>,
    options: WatchOptions,
    ctx: Context,
) -> Result<(), ComponentError> {
    let mut watch = FileWatch::new(vec![path], options)?;
    let mut mode = ScanMode::Full;
    loop {
        let started = std::time::Instant::now();
        let (scanned, reports) = tokio::task::spawn_blocking(move || {
            // One listing for every member, and on a quick scan (one after a change)
            // one read of each file: a file written while the round runs reaches
            // every member or none. A full scan (the first, and the periodic one)
            // reads for each member, so the round does not hold every file at once.
            let Some(first) = members.first() else {
                return (members, Vec::new());
            };
            let listing = first.scanner.list();
            let reads = (mode == ScanMode::Quick && members.len() > 1).then(RoundReads::default);
            let reports: Vec<ScanReport> = members
                .iter_mut()
                .map(|member| {
                    member
                        .scanner
                        .scan_listed(mode, listing.clone(), reads.as_ref())
                })
                .collect();
            (members, reports)
        })
        .await?;
        members = scanned;
        // Health first, so whoever sees an update also sees the matching health.
        for member in &members {
            let health = member.scanner.health();
            if member.resource == own {
                report_health(&ctx, &health);
            } else {
                member.health.send_replace(Some(health));
            }
        }
        // Every member's events go out together (see `Publisher::publish_all`).
        let mut events: Vec<EventPayload> = Vec::new();
        for (member, report) in members.iter_mut().zip(reports) {
            let first = !member.synced && report.listed;
            let current = &member.scanner;
            if !report.change.is_empty() || first {
                tracing::debug!(
                    source = %member.resource,
                    added = report.change.added.len(),
                    modified = report.change.modified.len(),
                    removed = report.change.removed.len(),
                    objects = current.snapshot.len(),
                    elapsed = ?started.elapsed(),
                    ?mode,
                    "Resources updated"
                );
                events.push(
                    ResourceIndexUpdated {
                        source: member.resource.clone(),
                        snapshot: Arc::new(current.snapshot.clone()),
                        change: Arc::new(report.change),
                    }
                    .into(),
                );
            }
            if first {
                member.synced = true;
                tracing::info!(
                    source = %member.resource,
                    objects = current.snapshot.len(),
                    files = current.files.len(),
                    "Initial sync complete"
                );
                events.push(
                    ResourceSyncComplete {
                        source: member.resource.clone(),
                    }
                    .into(),
                );
            }
        }
        if !events.is_empty() {
            ctx.publisher().publish_all(events);
        }
        tokio::select! {
            biased;
            () = ctx.cancelled() => return Ok(()),
            wake = watch.next() => {
                mode = match wake {
                    Wake::Changed => ScanMode::Quick,
                    Wake::Rescan => ScanMode::Full,
                };
            }
        }
    }
}

/// A member of a shared scan that another member runs: reports the health that scan
/// finds for it until shutdown. Ends with an error when the scan ends before that.
async fn follow(
    resource: Arc<str>,
    shared: &SharedScan,
    ctx: Context,
) -> Result<(), ComponentError> {
    let Some(health) = shared.health.get(&resource) else {
        return Err(format!(
            "{resource} is not a member of the scan of {}",
            shared.path.display()
        )
        .into());
    };
    let mut health = health.clone();
    loop {
        if let Some(found) = health.borrow_and_update().clone() {
            report_health(&ctx, &found);
        }
        tokio::select! {
            biased;
            () = ctx.cancelled() => return Ok(()),
            changed = health.changed() => {
                if changed.is_err() {
                    // The scanning member ended; at shutdown this one is cancelled too.
                    tokio::select! {
                        biased;
                        () = ctx.cancelled() => return Ok(()),
                        () = std::future::ready(()) => {}
                    }
                    return Err(format!(
                        "the scan of {} that this source shares with other sources stopped",
                        shared.path.display()
                    )
                    .into());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use hapwright_eventbus::model::ObjectKey;

    use super::{RoundReads, ScanMode, Scanner};
    use crate::config::{FilesConfig, default_index_by};
    use crate::manifest::Filter;
    use crate::yaml::Limits;

    fn scanner(path: &Path) -> Scanner {
        Scanner::new(
            "services",
            &FilesConfig::new(path),
            Filter::default(),
            default_index_by(),
            Limits::default(),
        )
    }

    fn service(name: &str, port: u16) -> String {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  ports:\n    - port: {port}\n"
        )
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("default", name)
    }

    /// The members of a shared scan see one listing and one read per file in a round:
    /// a file written between two members' scans reaches the second member only in
    /// the next round, together with the first.
    #[test]
    fn the_members_of_a_round_see_the_same_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), service("a", 1)).unwrap();
        let (mut first, mut second) = (scanner(dir.path()), scanner(dir.path()));
        for member in [&mut first, &mut second] {
            let listing = member.list();
            member.scan_listed(ScanMode::Full, listing, None);
        }

        // Round 1: `a.yaml` changes after the listing and after the first member
        // read it; `b.yaml` appears after the listing.
        let listing = first.list();
        std::fs::write(dir.path().join("a.yaml"), service("a", 2)).unwrap();
        let reads = RoundReads::default();
        let one = first.scan_listed(ScanMode::Quick, listing.clone(), Some(&reads));
        assert_eq!(one.change.modified, [key("a")]);
        std::fs::write(dir.path().join("a.yaml"), service("a", 3)).unwrap();
        std::fs::write(dir.path().join("b.yaml"), service("b", 1)).unwrap();
        let two = second.scan_listed(ScanMode::Quick, listing, Some(&reads));
        assert_eq!(two.change, one.change, "both members saw the same files");
        assert_eq!(
            first.snapshot().get_by_key(&key("a")).map(|o| o.parse()),
            second.snapshot().get_by_key(&key("a")).map(|o| o.parse()),
        );
        assert!(second.snapshot().get_by_key(&key("b")).is_none());

        // Round 2 picks up what came later, for both.
        let listing = first.list();
        let reads = RoundReads::default();
        let one = first.scan_listed(ScanMode::Quick, listing.clone(), Some(&reads));
        let two = second.scan_listed(ScanMode::Quick, listing, Some(&reads));
        assert_eq!(one.change.added, [key("b")]);
        assert_eq!(one.change.modified, [key("a")]);
        assert_eq!(two.change, one.change);
    }

    /// A read cut at one member's `maxFileSize` is not handed to a member with a
    /// higher limit.
    #[test]
    fn a_member_with_a_higher_size_limit_reads_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let text = service("a", 1);
        std::fs::write(dir.path().join("a.yaml"), &text).unwrap();
        let reads = RoundReads::default();
        let path = dir.path().join("a.yaml");
        let len = text.len() as u64;
        let cut = reads.read(&path, 10, len).unwrap();
        assert_eq!(cut.len(), 11);
        let whole = reads.read(&path, 1_000_000, len).unwrap();
        assert_eq!(&whole[..], text.as_bytes());
        let again = reads.read(&path, 10, len).unwrap();
        assert_eq!(
            again.len(),
            text.len(),
            "over the lower limit: too large for it"
        );
    }
}
