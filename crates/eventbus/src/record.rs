//! Small records hapwright keeps beside the deployed files so a state survives a
//! restart (the deployer's safety valve, the reconciler's quarantine): reading one
//! back, removing it durably, and picking the newest of several copies.
//!
//! A record is a JSON document with a format version. Writing stays with each
//! crate's own crash-safe writer (temporary file, fsync, rename, directory fsync).

use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::de::DeserializeOwned;

/// The JSON record at `path`; `None` when there is no file.
///
/// # Errors
///
/// When it cannot be read, or does not parse as `T` ([`io::ErrorKind::InvalidData`]).
pub fn read_json<T: DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Checks that a record read back has the format version this hapwright writes.
///
/// # Errors
///
/// [`io::ErrorKind::InvalidData`] naming both versions when they differ.
pub fn check_format(found: u32, expected: u32) -> io::Result<()> {
    if found == expected {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("format {found} (this hapwright reads {expected})"),
        ))
    }
}

/// Removes the file `name` from `dir` and fsyncs `dir` so the removal survives a
/// power loss; nothing when there is no such file.
///
/// # Errors
///
/// When the removal or the directory's fsync fails.
pub fn remove_durably(dir: &Path, name: &str) -> io::Result<()> {
    match std::fs::remove_file(dir.join(name)) {
        Ok(()) => std::fs::File::open(dir)?.sync_all(),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

/// The newest of the records `read` finds in `dirs`, by `written_at`. A directory
/// whose record cannot be read is passed to `unreadable` (to log it) and skipped.
pub fn read_newest<T>(
    dirs: &[PathBuf],
    read: impl Fn(&Path) -> io::Result<Option<T>>,
    written_at: impl Fn(&T) -> SystemTime,
    unreadable: impl Fn(&Path, io::Error),
) -> Option<T> {
    let mut newest: Option<T> = None;
    for dir in dirs {
        match read(dir) {
            Ok(Some(record)) => {
                if newest
                    .as_ref()
                    .is_none_or(|n| written_at(n) < written_at(&record))
                {
                    newest = Some(record);
                }
            }
            Ok(None) => {}
            Err(error) => unreadable(dir, error),
        }
    }
    newest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_record_reads_as_none_and_removes_as_nothing() {
        let dir = tempdir();
        assert!(read_json::<u32>(&dir.join("none.json")).unwrap().is_none());
        remove_durably(&dir, "none.json").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_record_that_does_not_parse_is_invalid_data() {
        let dir = tempdir();
        std::fs::write(dir.join("bad.json"), "{").unwrap();
        let error = read_json::<u32>(&dir.join("bad.json")).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        remove_durably(&dir, "bad.json").unwrap();
        assert!(!dir.join("bad.json").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn another_format_is_invalid_data() {
        check_format(1, 1).unwrap();
        let error = check_format(2, 1).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert_eq!(error.to_string(), "format 2 (this hapwright reads 1)");
    }

    #[test]
    fn the_newest_readable_record_wins() {
        let at = |secs| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        let dirs: Vec<PathBuf> = ["a", "b", "c", "d"].iter().map(PathBuf::from).collect();
        let skipped = std::cell::RefCell::new(Vec::new());
        let newest = read_newest(
            &dirs,
            |dir| match dir.to_str() {
                Some("a") => Ok(Some(at(5))),
                Some("b") => Ok(Some(at(9))),
                Some("c") => Err(io::Error::other("broken")),
                _ => Ok(None),
            },
            |t| *t,
            |dir, _| skipped.borrow_mut().push(dir.to_path_buf()),
        );
        assert_eq!(newest, Some(at(9)));
        assert_eq!(skipped.into_inner(), vec![PathBuf::from("c")]);
    }

    /// A fresh directory under the system's temp directory (no `tempfile` here).
    fn tempdir() -> PathBuf {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "hapwright-eventbus-record-{}-{n}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
