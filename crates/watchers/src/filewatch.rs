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
//! Any notification (except our own reads) counts as "something changed". A burst of
//! notifications is coalesced: [`FileWatch::next`] returns once no new notification
//! arrived for the settle time (bounded by a maximum, so a file written continuously
//! is still read). After each wake-up the watches are re-armed, which picks up
//! directories that appeared or were replaced. A slow periodic rescan is the safety
//! net for anything the kernel did not report (network filesystems, overflowed event
//! queues); callers re-read and compare hashes, so a rescan that finds nothing new
//! costs a read and publishes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Timing of a [`FileWatch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchOptions {
    /// Quiet time after the last notification before [`FileWatch::next`] returns.
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
    events: mpsc::UnboundedReceiver<()>,
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
            let relevant = match &event {
                Ok(event) => is_change(&event.kind),
                Err(error) => {
                    tracing::warn!(%error, "File notification error; rescanning");
                    true
                }
            };
            if relevant {
                let _ = tx.send(());
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
        let wake = tokio::select! {
            biased;
            Some(()) = self.events.recv() => Wake::Changed,
            () = tokio::time::sleep_until(self.next_rescan) => Wake::Rescan,
        };
        if wake == Wake::Changed {
            let deadline = Instant::now() + self.options.max_settle;
            loop {
                let quiet_until = (Instant::now() + self.options.settle).min(deadline);
                match tokio::time::timeout_at(quiet_until, self.events.recv()).await {
                    Ok(Some(())) if Instant::now() < deadline => continue,
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

    #[tokio::test]
    async fn a_burst_of_writes_wakes_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut watch = FileWatch::new(
            vec![dir.path().to_path_buf()],
            WatchOptions {
                settle: Duration::from_millis(50),
                ..WatchOptions::default()
            },
        )
        .unwrap();
        for i in 0..10 {
            std::fs::write(dir.path().join("a.yaml"), format!("v: {i}\n")).unwrap();
        }
        let wake = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .expect("a change is noticed");
        assert_eq!(wake, Wake::Changed);
        // Everything of the burst was consumed by the first wake-up.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), watch.next())
                .await
                .is_err()
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
