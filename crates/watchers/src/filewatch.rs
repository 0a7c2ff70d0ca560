//! Watching files and directories so that every way of changing them is noticed.
//!
//! [`FileWatch`] watches *directories*, never file paths: a watch on a file follows
//! its inode, which a Kubernetes ConfigMap update (a `..data` symlink swap), an
//! editor's write-to-temp-and-rename or a delete-and-recreate leave behind, after
//! which the watch is silently dead. A directory watch sees all of those as events
//! on its entries. So for each target it watches the target itself when that is a
//! directory, otherwise the directory holding it, and, while either is missing, the
//! nearest existing ancestor so the target's creation is noticed.
//!
//! Any notification (except our own reads) counts as "something changed". When the
//! kernel says a change is complete — a file closed after writing, a rename (an
//! editor's or `kubectl`'s write-to-temp-and-rename, a ConfigMap's `..data` swap), a
//! removal, a new directory — and no write is still open, [`FileWatch::next`] returns
//! at once. Only while a write may still be in progress (a file created or modified
//! and not yet closed, or a notification whose meaning is unknown) does it wait for
//! the settle time without notifications (bounded by a maximum, so a file written
//! continuously is still read). After each wake-up the watches are re-armed, which picks up
//! directories that appeared or were replaced. A slow periodic rescan is the safety
//! net for anything the kernel did not report (network filesystems, overflowed event
//! queues); callers re-read and compare hashes, so a rescan that finds nothing new
//! costs a read and publishes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Timing of a [`FileWatch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WatchOptions {
    /// Quiet time after the last notification before [`FileWatch::next`] returns,
    /// while a write may still be in progress (completed writes return at once).
    pub settle: Duration,
    /// Longest time [`FileWatch::next`] keeps waiting for quiet once a burst started.
    pub max_settle: Duration,
    /// Interval of the safety-net rescan.
    pub rescan_interval: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            settle: Duration::from_millis(25),
            max_settle: Duration::from_millis(500),
            rescan_interval: Duration::from_secs(60),
        }
    }
}

/// Why [`FileWatch::next`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// Notifications arrived and settled: something in a watched directory changed.
    Changed,
    /// The periodic rescan is due.
    Rescan,
}

/// Errors setting up a watch.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The platform's file notification facility could not be initialised (for
    /// example, inotify instance limits).
    #[error("cannot start file notifications")]
    Init(#[source] notify::Error),
}

/// Watches a set of files and directories; see the module documentation.
pub struct FileWatch {
    targets: Vec<PathBuf>,
    watcher: notify::RecommendedWatcher,
    /// Directories currently watched, with their identity when watched.
    watched: BTreeMap<PathBuf, Option<(u64, u64)>>,
    events: mpsc::UnboundedReceiver<Note>,
    options: WatchOptions,
    next_rescan: Instant,
}

impl std::fmt::Debug for FileWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWatch")
            .field("targets", &self.targets)
            .field("watched", &self.watched.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl FileWatch {
    /// Starts watching `targets` (files or directories, existing or not).
    pub fn new(targets: Vec<PathBuf>, options: WatchOptions) -> Result<Self, WatchError> {
        let (tx, events) = mpsc::unbounded_channel();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let note = match event {
                Ok(event) => Note::of(event),
                Err(error) => {
                    tracing::warn!(%error, "File notification error; rescanning");
                    Some(Note::unsure())
                }
            };
            if let Some(note) = note {
                let _ = tx.send(note);
            }
        })
        .map_err(WatchError::Init)?;
        let mut watch = Self {
            targets,
            watcher,
            watched: BTreeMap::new(),
            events,
            options,
            next_rescan: Instant::now() + options.rescan_interval,
        };
        watch.rearm();
        Ok(watch)
    }

    /// The directories currently watched.
    pub fn watched(&self) -> impl Iterator<Item = &Path> {
        self.watched.keys().map(PathBuf::as_path)
    }

    /// Waits until something changed (and the burst settled) or the rescan is due,
    /// then re-arms the watches.
    pub async fn next(&mut self) -> Wake {
        let first = tokio::select! {
            biased;
            Some(note) = self.events.recv() => Some(note),
            () = tokio::time::sleep_until(self.next_rescan) => None,
        };
        let wake = if first.is_some() {
            Wake::Changed
        } else {
            Wake::Rescan
        };
        if let Some(first) = first {
            let mut burst = Burst::default();
            burst.apply(first);
            let deadline = Instant::now() + self.options.max_settle;
            loop {
                // Whatever the kernel already queued belongs to this burst.
                while let Ok(note) = self.events.try_recv() {
                    burst.apply(note);
                }
                if burst.complete() {
                    break;
                }
                let quiet_until = (Instant::now() + self.options.settle).min(deadline);
                match tokio::time::timeout_at(quiet_until, self.events.recv()).await {
                    Ok(Some(note)) if Instant::now() < deadline => burst.apply(note),
                    _ => break,
                }
            }
        } else {
            self.next_rescan = Instant::now() + self.options.rescan_interval;
        }
        // Anything that arrived while settling is covered by the read that follows.
        while self.events.try_recv().is_ok() {}
        self.rearm();
        wake
    }

    /// Points the watches at the right directories again: a target directory that
    /// appeared, or one that was deleted and recreated (a new inode), gets a fresh
    /// watch; watches nobody needs any more are removed.
    pub fn rearm(&mut self) {
        let wanted: BTreeSet<PathBuf> =
            self.targets.iter().filter_map(|t| watch_point(t)).collect();
        let stale: Vec<PathBuf> = self
            .watched
            .iter()
            .filter(|(dir, id)| !wanted.contains(*dir) || identity(dir) != **id)
            .map(|(dir, _)| dir.clone())
            .collect();
        for dir in stale {
            let _ = self.watcher.unwatch(&dir);
            self.watched.remove(&dir);
            tracing::debug!(dir = %dir.display(), "Stopped watching directory");
        }
        for dir in wanted {
            if self.watched.contains_key(&dir) {
                continue;
            }
            let id = identity(&dir);
            match self.watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    tracing::debug!(dir = %dir.display(), "Watching directory");
                    self.watched.insert(dir, id);
                }
                Err(error) => {
                    tracing::warn!(dir = %dir.display(), %error, "Cannot watch directory; will retry");
                }
            }
        }
    }
}

/// Whether a notification means content may have changed. Opening or reading a file
/// (including our own reads) does not; finishing a write does.
fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// What one notification says about the writes in a watched directory.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// Content is being written to these paths (created or modified, not closed).
    Writing,
    /// Writes to these paths are complete: closed after writing, renamed away or
    /// removed.
    Done,
    /// A complete change that involves no open write (a rename's target, a new
    /// directory, a permission change).
    Settled,
    /// Unknown: wait for the settle time.
    Unsure,
}

/// One change notification: what happened and to which paths.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Note {
    step: Step,
    paths: Vec<PathBuf>,
}

impl Note {
    /// The note for a notify event; `None` when it is no change (a read).
    fn of(event: notify::Event) -> Option<Self> {
        if !is_change(&event.kind) {
            return None;
        }
        let step = match event.kind {
            EventKind::Access(AccessKind::Close(AccessMode::Write)) | EventKind::Remove(_) => {
                Step::Done
            }
            // A rename moves a complete file into place; the old name is gone, so a
            // write open under it is over as far as the directory is concerned.
            EventKind::Modify(ModifyKind::Name(_)) => Step::Done,
            EventKind::Create(CreateKind::Folder) | EventKind::Modify(ModifyKind::Metadata(_)) => {
                Step::Settled
            }
            EventKind::Create(_) | EventKind::Modify(ModifyKind::Data(_)) => Step::Writing,
            _ => Step::Unsure,
        };
        Some(Self {
            step,
            paths: event.paths,
        })
    }

    fn unsure() -> Self {
        Self {
            step: Step::Unsure,
            paths: Vec::new(),
        }
    }
}

/// The notifications of one burst: which writes are still open.
#[derive(Debug, Default)]
struct Burst {
    open: BTreeSet<PathBuf>,
    unsure: bool,
}

impl Burst {
    fn apply(&mut self, note: Note) {
        match note.step {
            Step::Writing if note.paths.is_empty() => self.unsure = true,
            Step::Writing => self.open.extend(note.paths),
            Step::Done => {
                for path in &note.paths {
                    self.open.remove(path);
                }
            }
            Step::Settled => {}
            Step::Unsure => self.unsure = true,
        }
    }

    /// Every write seen is complete and nothing unknown happened: read now.
    fn complete(&self) -> bool {
        self.open.is_empty() && !self.unsure
    }
}

/// The directory to watch for `target`: itself if it is a directory, else its parent,
/// else the nearest existing ancestor.
fn watch_point(target: &Path) -> Option<PathBuf> {
    if std::fs::metadata(target).is_ok_and(|m| m.is_dir()) {
        return Some(target.to_path_buf());
    }
    let mut dir = target.parent();
    while let Some(candidate) = dir {
        let candidate = if candidate.as_os_str().is_empty() {
            Path::new(".")
        } else {
            candidate
        };
        if std::fs::metadata(candidate).is_ok_and(|m| m.is_dir()) {
            return Some(candidate.to_path_buf());
        }
        dir = candidate.parent();
    }
    None
}

#[cfg(unix)]
fn identity(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity(dir: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(dir).ok().map(|_| (0, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_points() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.yaml");
        std::fs::write(&file, "a: 1").unwrap();
        assert_eq!(watch_point(dir.path()).unwrap(), dir.path());
        assert_eq!(watch_point(&file).unwrap(), dir.path());
        assert_eq!(
            watch_point(&dir.path().join("missing/deeper")).unwrap(),
            dir.path()
        );
    }

    #[test]
    fn reads_are_not_changes() {
        use notify::event::{CreateKind, ModifyKind};
        assert!(!is_change(&EventKind::Access(AccessKind::Open(
            AccessMode::Any
        ))));
        assert!(!is_change(&EventKind::Access(AccessKind::Close(
            AccessMode::Read
        ))));
        assert!(is_change(&EventKind::Access(AccessKind::Close(
            AccessMode::Write
        ))));
        assert!(is_change(&EventKind::Create(CreateKind::File)));
        assert!(is_change(&EventKind::Modify(ModifyKind::Any)));
    }

    /// A settle time no test outlives: a wake-up before it proves the watch did not
    /// wait for it.
    fn waits_forever() -> WatchOptions {
        WatchOptions {
            settle: Duration::from_secs(3600),
            max_settle: Duration::from_secs(7200),
            ..WatchOptions::default()
        }
    }

    #[tokio::test]
    async fn a_completed_write_wakes_without_the_settle_time() {
        let dir = tempfile::tempdir().unwrap();
        let mut watch = FileWatch::new(vec![dir.path().to_path_buf()], waits_forever()).unwrap();
        std::fs::write(dir.path().join("a.yaml"), "v: 1\n").unwrap();
        let wake = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("a closed write wakes at once");
        assert_eq!(wake, Wake::Changed);
    }

    #[tokio::test]
    async fn a_write_to_a_temporary_file_and_a_rename_wake_without_the_settle_time() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), "v: 1\n").unwrap();
        let mut watch = FileWatch::new(vec![dir.path().to_path_buf()], waits_forever()).unwrap();
        let temp = dir.path().join(".a.yaml.tmp");
        std::fs::write(&temp, "v: 2\n").unwrap();
        std::fs::rename(&temp, dir.path().join("a.yaml")).unwrap();
        // One or two wake-ups (the temporary file's close, the rename), none waiting.
        tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("the write wakes at once");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a.yaml")).unwrap(),
            "v: 2\n"
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_configmap_style_symlink_swap_wakes_without_the_settle_time() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("..v1")).unwrap();
        std::fs::write(dir.path().join("..v1/a.yaml"), "v: 1\n").unwrap();
        std::os::unix::fs::symlink("..v1", dir.path().join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/a.yaml", dir.path().join("a.yaml")).unwrap();
        let mut watch = FileWatch::new(vec![dir.path().to_path_buf()], waits_forever()).unwrap();
        // What the kubelet does: a new timestamped directory, a temporary link to it,
        // renamed over `..data`.
        std::fs::create_dir(dir.path().join("..v2")).unwrap();
        std::fs::write(dir.path().join("..v2/a.yaml"), "v: 2\n").unwrap();
        std::os::unix::fs::symlink("..v2", dir.path().join("..data_tmp")).unwrap();
        std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
        tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("the swap wakes at once");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a.yaml")).unwrap(),
            "v: 2\n"
        );
    }

    #[tokio::test]
    async fn a_write_still_open_waits_until_it_is_closed() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let mut watch = FileWatch::new(vec![dir.path().to_path_buf()], waits_forever()).unwrap();
        let mut file = std::fs::File::create(dir.path().join("a.yaml")).unwrap();
        file.write_all(b"v: ").unwrap();
        file.flush().unwrap();
        let next = watch.next();
        tokio::pin!(next);
        // Half a manifest is on disk and the writer still holds it: no wake-up.
        assert!(
            tokio::time::timeout(Duration::from_millis(300), &mut next)
                .await
                .is_err(),
            "woke while a write was still open"
        );
        file.write_all(b"1\n").unwrap();
        drop(file);
        let wake = tokio::time::timeout(Duration::from_secs(10), &mut next)
            .await
            .expect("closing the file wakes at once");
        assert_eq!(wake, Wake::Changed);
    }

    #[test]
    fn a_burst_is_complete_once_every_write_is_closed_or_renamed() {
        let note = |step: Step, path: &str| Note {
            step,
            paths: vec![PathBuf::from(path)],
        };
        let mut burst = Burst::default();
        burst.apply(note(Step::Writing, "/d/a"));
        burst.apply(note(Step::Writing, "/d/b"));
        assert!(!burst.complete());
        burst.apply(note(Step::Done, "/d/a"));
        assert!(!burst.complete());
        burst.apply(note(Step::Done, "/d/b"));
        assert!(burst.complete());
        burst.apply(note(Step::Settled, "/d/c"));
        assert!(burst.complete());
        burst.apply(Note::unsure());
        assert!(!burst.complete());

        use notify::event::{RemoveKind, RenameMode};
        let kind = |kind: EventKind| Note::of(notify::Event::new(kind)).map(|n| n.step);
        assert_eq!(
            kind(EventKind::Access(AccessKind::Close(AccessMode::Write))),
            Some(Step::Done)
        );
        assert_eq!(
            kind(EventKind::Modify(ModifyKind::Name(RenameMode::Both))),
            Some(Step::Done)
        );
        assert_eq!(kind(EventKind::Remove(RemoveKind::File)), Some(Step::Done));
        assert_eq!(
            kind(EventKind::Create(CreateKind::File)),
            Some(Step::Writing)
        );
        assert_eq!(
            kind(EventKind::Create(CreateKind::Folder)),
            Some(Step::Settled)
        );
        assert_eq!(kind(EventKind::Any), Some(Step::Unsure));
        assert_eq!(
            kind(EventKind::Access(AccessKind::Open(AccessMode::Any))),
            None
        );
    }

    #[tokio::test]
    async fn a_missing_directory_is_watched_once_it_appears() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("later");
        let mut watch = FileWatch::new(vec![target.clone()], WatchOptions::default()).unwrap();
        assert_eq!(watch.watched().collect::<Vec<_>>(), [dir.path()]);
        std::fs::create_dir(&target).unwrap();
        tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .unwrap();
        assert_eq!(watch.watched().collect::<Vec<_>>(), [target.as_path()]);
        std::fs::write(target.join("x.yaml"), "a: 1").unwrap();
        let wake = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .unwrap();
        assert_eq!(wake, Wake::Changed);
    }
}
