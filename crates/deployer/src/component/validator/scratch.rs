//! Phase 2's scratch directories: `hapwright-validate-<pid>-<random>` in the temp
//! directory (or `validator::Config::scratch_root`), removed after each run. A
//! controller killed with SIGKILL cannot remove its own; the pid in the name lets
//! [`sweep_scratch`] tell them from those of a controller that is still running.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hapwright_eventbus::model::RenderedConfig;

use super::is_plain_relative;

/// Name prefix of every scratch directory; the owning process id follows.
pub const SCRATCH_PREFIX: &str = "hapwright-validate-";

/// Scratch directories of earlier hapwright versions carry no pid; they are removed
/// once older than this (a phase-2 run takes seconds).
const LEGACY_MAX_AGE: Duration = Duration::from_secs(3600);

/// Writes every rendered file under a new scratch directory, at its relative path;
/// files are private to the controller's user (certificates hold keys).
pub(crate) fn write_scratch(
    rendered: &RenderedConfig,
    root: Option<&Path>,
) -> io::Result<tempfile::TempDir> {
    let prefix = format!("{SCRATCH_PREFIX}{}-", std::process::id());
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    let scratch = match root {
        Some(root) => {
            std::fs::create_dir_all(root)?;
            builder.tempdir_in(root)?
        }
        None => builder.tempdir()?,
    };
    for (file, content) in rendered.iter() {
        let relative = file.relative_path();
        if !is_plain_relative(&relative) {
            // Phase 1 rejects these; never write outside the scratch directory.
            continue;
        }
        let path = scratch.path().join(&relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // The directory is new and private (0700), so nothing can be planted in it.
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut out = options.open(&path)?;
        out.write_all(content.as_bytes())?;
    }
    Ok(scratch)
}

/// Removes the scratch directories in `root` (the system temp dir when `None`) whose
/// owning process is gone: `hapwright-validate-<pid>-*` where no process `<pid>`
/// exists, and pid-less ones of earlier versions older than an hour. Directories of
/// live processes (this one included) and of other users are kept. Returns what it
/// removed. The validator calls it when it starts.
///
/// A pid reused by an unrelated process keeps its directory until a later sweep;
/// that only delays the clean-up.
pub fn sweep_scratch(root: Option<&Path>) -> io::Result<Vec<PathBuf>> {
    let root = root.map_or_else(std::env::temp_dir, Path::to_path_buf);
    let entries = match std::fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let me = rustix::process::geteuid().as_raw();
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(SCRATCH_PREFIX) else {
            continue;
        };
        // symlink_metadata: a link with that name is not a directory of ours.
        let meta = entry.path().symlink_metadata()?;
        if !meta.is_dir() || std::os::unix::fs::MetadataExt::uid(&meta) != me {
            continue;
        }
        let stale = match rest.split_once('-') {
            Some((pid, _)) => match pid.parse::<i32>() {
                Ok(pid) => !is_alive(pid),
                Err(_) => false,
            },
            None => meta
                .modified()
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .is_some_and(|age| age > LEGACY_MAX_AGE),
        };
        if stale {
            // remove_dir_all does not follow symlinks inside the directory.
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => removed.push(entry.path()),
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
        }
    }
    Ok(removed)
}

/// Whether a process with this id exists (signal 0; "permission denied" means it
/// exists under another user).
fn is_alive(pid: i32) -> bool {
    if pid as u32 == std::process::id() {
        return true;
    }
    let Some(pid) = rustix::process::Pid::from_raw(pid) else {
        return false;
    };
    !matches!(
        rustix::process::test_kill_process(pid),
        Err(rustix::io::Errno::SRCH)
    )
}
