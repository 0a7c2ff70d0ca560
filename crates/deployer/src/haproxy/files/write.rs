//! The one way hapwright puts a file on disk: crash-safe and permission-safe.
//!
//! 1. A temporary file is created in the target's directory with
//!    `O_CREAT | O_EXCL` under a random name starting with [`TEMP_PREFIX`]: creation
//!    fails on anything already there, a planted symlink included, so nothing is ever
//!    written through a link (the `tempfile` crate retries with a new name).
//! 2. Its group and mode are set on the open file, before any content is in it, so a
//!    private key is never readable by others, not even for a moment.
//! 3. The content is written and fsynced, the file renamed over the target (a symlink
//!    at the target is replaced, never followed), and the directory fsynced so the
//!    rename survives a power loss.
//!
//! A file that is already there with the same content, mode, owner and group is
//! left as it is (only its directory is fsynced), so a deployment rewrites the files
//! that changed, not every file of the layout.
//!
//! On any error the temporary file is removed; after a SIGKILL it stays behind until
//! [`ConfigDir::sweep`](super::ConfigDir::sweep) removes it at the next start.

use std::collections::BTreeSet;
use std::fs::{File, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::Group;

use super::Faults;

/// Name prefix of the temporary files hapwright writes before renaming them into
/// place; [`ConfigDir::sweep`](super::ConfigDir::sweep) removes leftovers.
pub const TEMP_PREFIX: &str = ".hapwright-tmp-";

/// Suffix of the temporary files of hapwright versions before [`TEMP_PREFIX`]
/// (`.<name>.hapwright-tmp`); still swept.
pub const LEGACY_TEMP_SUFFIX: &str = ".hapwright-tmp";

/// Mode of files HAProxy must read whatever user it runs as (`haproxy.cfg`, maps,
/// other files): they hold no secrets.
pub const PUBLIC_MODE: u32 = 0o644;

/// Mode of the directories hapwright creates (`maps/`, `certs/`, ...).
const DIR_MODE: u32 = 0o755;

/// Default mode of certificates and keys: only hapwright's user reads them.
pub const PRIVATE_MODE: u32 = 0o600;

/// Permissions of the files hapwright writes into a config directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileModes {
    /// Mode of the files under `certs/` (they hold private keys).
    pub cert_mode: u32,
    /// Group of the files under `certs/`, so HAProxy running as another user can
    /// read them through the group bits; `None` keeps the writer's group.
    pub cert_group: Option<Group>,
}

impl Default for FileModes {
    fn default() -> Self {
        Self {
            cert_mode: PRIVATE_MODE,
            cert_group: None,
        }
    }
}

impl FileModes {
    /// The modes configured for a socket instance (`socket.certMode`,
    /// `socket.certGroup`).
    pub fn from_config(socket: &crate::config::SocketTarget) -> Self {
        Self {
            cert_mode: socket.cert_mode.map_or(PRIVATE_MODE, |m| m.bits()),
            cert_group: socket.cert_group.clone(),
        }
    }

    /// Mode and group for the layout file at `relative` (`certs/default.pem`).
    pub(crate) fn for_path(&self, relative: &str) -> (u32, Option<&Group>) {
        if relative.starts_with("certs/") {
            (self.cert_mode, self.cert_group.as_ref())
        } else {
            (PUBLIC_MODE, None)
        }
    }
}

/// Writes `content` to `path` atomically with mode 0644: readers see the old or the
/// new content, never a mix, and a crash leaves one of the two.
pub fn write_atomic(path: &Path, content: &[u8]) -> io::Result<()> {
    write_one(path, content, PUBLIC_MODE)
}

/// Writes `content` to `path` with the mode 0600 (keys, secrets).
pub fn write_private(path: &Path, content: &[u8]) -> io::Result<()> {
    write_one(path, content, PRIVATE_MODE)
}

/// Writes one file with `mode` on its own (no owner change, no fault points) and
/// syncs what it changed.
fn write_one(path: &Path, content: &[u8], mode: u32) -> io::Result<()> {
    let mut dirty = Dirs::default();
    write_file(
        path,
        content,
        mode,
        None,
        &Faults::default(),
        None,
        &mut dirty,
    )?;
    dirty.sync()
}

/// Directories whose entries changed and must be fsynced before the next step relies
/// on them.
#[derive(Debug, Default)]
pub(crate) struct Dirs {
    touched: BTreeSet<PathBuf>,
    /// Directories found or made during this batch: a batch of thousands of files
    /// in one directory looks it up once.
    present: BTreeSet<PathBuf>,
}

impl Dirs {
    /// Records that an entry of `dir` changed.
    pub(crate) fn touch(&mut self, dir: &Path) {
        if !self.touched.contains(dir) {
            self.touched.insert(dir.to_path_buf());
        }
    }

    /// Fsyncs every touched directory.
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        for dir in std::mem::take(&mut self.touched) {
            File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| context(e, format!("cannot fsync directory {}", dir.display())))?;
        }
        Ok(())
    }
}

/// Creates `dir` and its missing parents, recording each parent whose entries
/// changed.
pub(crate) fn ensure_dir(dir: &Path, dirty: &mut Dirs) -> io::Result<()> {
    if dirty.present.contains(dir) {
        return Ok(());
    }
    ensure_dir_uncached(dir, dirty)?;
    dirty.present.insert(dir.to_path_buf());
    Ok(())
}

fn ensure_dir_uncached(dir: &Path, dirty: &mut Dirs) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        ensure_dir(parent, dirty)?;
        dirty.touch(parent);
    }
    match std::fs::create_dir(dir) {
        // Explicitly 0755 whatever the umask: HAProxy, maybe another user, must be
        // able to reach the files (their own modes protect the keys).
        Ok(()) => std::fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))
            .map_err(|e| context(e, format!("cannot set the mode of {}", dir.display()))),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(context(
            error,
            format!("cannot create directory {}", dir.display()),
        )),
    }
}

/// The safe write (module doc). The directory's fsync is left to the caller through
/// `dirty`, so a batch of files costs one fsync per directory. `relative` names the
/// file for fault injection.
pub(crate) fn write_file(
    path: &Path,
    content: &[u8],
    mode: u32,
    group: Option<&Group>,
    faults: &Faults,
    relative: Option<&str>,
    dirty: &mut Dirs,
) -> io::Result<()> {
    write_file_known(path, content, None, mode, group, faults, relative, dirty)
}

/// [`write_file`] of a rendered file's shared content: when `known` is what
/// hapwright last found or wrote at `path` and the file has not been touched since
/// (its [`Stamp`]), it is not read back to be compared ([`Verified`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_file_known(
    path: &Path,
    content: &[u8],
    known: Option<&Arc<str>>,
    mode: u32,
    group: Option<&Group>,
    faults: &Faults,
    relative: Option<&str>,
    dirty: &mut Dirs,
) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    ensure_dir(dir, dirty)?;
    let at = |what: &str, error: io::Error| context(error, format!("{what} {}", path.display()));
    let gid = group
        .map(resolve_group)
        .transpose()
        .map_err(|e| at("cannot write", e))?;
    if let Some(relative) = relative {
        faults
            .check_write(relative)
            .map_err(|e| at("cannot write", e))?;
    }
    if already_there(path, content, known, mode, gid) {
        // Its content was fsynced when it was written; the directory's fsync makes
        // sure its name is durable too (a rename whose directory fsync failed).
        dirty.touch(dir);
        return Ok(());
    }
    let mut tmp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .permissions(Permissions::from_mode(PRIVATE_MODE))
        .tempfile_in(dir)
        .map_err(|e| at("cannot create a temporary file for", e))?;
    // From here on, dropping `tmp` removes the temporary file.
    if let Some(gid) = gid {
        std::os::unix::fs::fchown(tmp.as_file(), None, Some(gid))
            .map_err(|e| at(&format!("cannot give group {gid} to"), e))?;
    }
    tmp.as_file()
        .set_permissions(Permissions::from_mode(mode))
        .map_err(|e| at(&format!("cannot set mode {mode:04o} on"), e))?;
    tmp.write_all(content).map_err(|e| at("cannot write", e))?;
    tmp.as_file()
        .sync_all()
        .map_err(|e| at("cannot fsync", e))?;
    tmp.persist(path)
        .map_err(|e| at("cannot rename the temporary file to", e.error))?;
    dirty.touch(dir);
    match known {
        Some(known) => Verified::record(path, known),
        None => Verified::forget(path),
    }
    Ok(())
}

/// A file's identity and the times of its last change, as `stat` gives them: when
/// none of it changed, neither did the content (any write or rename changes the
/// ctime or the inode, and no call sets the ctime back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether the last change is old enough for a later one to show in the ctime:
    /// filesystems keep coarse timestamps, so a change in the same tick as the
    /// last could leave them equal (the file is compared until then).
    fn settled(&self) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        #[cfg(test)]
        let now = now + tests::CLOCK_AHEAD.get();
        self.ctime.0 < now - 1
    }
}

/// The rendered content hapwright last found (read back and compared) or wrote at
/// each path, with the file's [`Stamp`] then: a file whose stamp and content are the
/// same again is not read again. With thousands of certificates this saves reading
/// every one of them on every deployment. Entries hold the content (so a pointer
/// stays unique) and are dropped when the file is rewritten or removed.
struct Verified;

type VerifiedTable = std::collections::HashMap<PathBuf, (Stamp, Arc<str>)>;

static VERIFIED: std::sync::LazyLock<std::sync::Mutex<VerifiedTable>> =
    std::sync::LazyLock::new(Default::default);

impl Verified {
    fn table() -> std::sync::MutexGuard<'static, VerifiedTable> {
        VERIFIED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `content` is what was found at `path` when it had `stamp`.
    fn holds(path: &Path, stamp: &Stamp, content: &Arc<str>) -> bool {
        Self::table()
            .get(path)
            .is_some_and(|(was, held)| was == stamp && Arc::ptr_eq(held, content))
    }

    /// Records `content` as found at `path` with `stamp`, once the stamp has settled.
    fn found(path: &Path, stamp: Stamp, content: &Arc<str>) {
        let mut table = Self::table();
        if stamp.settled() {
            table.insert(path.to_path_buf(), (stamp, content.clone()));
        } else {
            table.remove(path);
        }
    }

    /// Records `content` as just written at `path`.
    fn record(path: &Path, content: &Arc<str>) {
        match std::fs::symlink_metadata(path) {
            Ok(meta) => Self::found(path, Stamp::of(&meta), content),
            Err(_) => Self::forget(path),
        }
    }

    fn forget(path: &Path) {
        Self::table().remove(path);
    }
}

/// Whether `path` is already a regular file of ours with exactly `content`, `mode`
/// and group `gid` (when given), not hard-linked elsewhere: writing it again would
/// change nothing but cost a temporary file, an fsync and a rename. With 1,000
/// certificates a change rewrites one file instead of 1,000.
fn already_there(
    path: &Path,
    content: &[u8],
    known: Option<&Arc<str>>,
    mode: u32,
    gid: Option<u32>,
) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return false;
    };
    let ours = meta.file_type().is_file()
        && meta.nlink() == 1
        && meta.len() == content.len() as u64
        && meta.mode() & 0o7777 == mode
        && meta.uid() == rustix::process::geteuid().as_raw()
        && gid.is_none_or(|gid| meta.gid() == gid);
    if !ours {
        return false;
    }
    let stamp = Stamp::of(&meta);
    if known.is_some_and(|known| Verified::holds(path, &stamp, known)) {
        return true;
    }
    #[cfg(test)]
    tests::READS.with(|reads| reads.set(reads.get() + 1));
    // Read through a descriptor that does not follow a link planted since.
    let same = File::options()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .and_then(|mut file| {
            let mut on_disk = Vec::with_capacity(content.len());
            std::io::Read::read_to_end(&mut file, &mut on_disk)?;
            Ok(on_disk == content)
        })
        .unwrap_or(false);
    if same && let Some(known) = known {
        Verified::found(path, stamp, known);
    }
    same
}

/// Removes `path` if it exists, recording its directory.
pub(crate) fn remove_file(path: &Path, dirty: &mut Dirs) -> io::Result<()> {
    Verified::forget(path);
    match std::fs::remove_file(path) {
        Ok(()) => {
            if let Some(dir) = path.parent() {
                dirty.touch(dir);
            }
            Ok(())
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(context(error, format!("cannot remove {}", path.display()))),
    }
}

/// The gid of `group`: numeric as given, a name looked up in `/etc/group`.
pub fn resolve_group(group: &Group) -> io::Result<u32> {
    match group {
        Group::Id(gid) => Ok(*gid),
        Group::Name(name) => {
            let table = std::fs::read_to_string("/etc/group")
                .map_err(|e| context(e, "cannot read /etc/group".to_owned()))?;
            gid_in(&table, name).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("group `{name}` is not in /etc/group (give its numeric gid instead)"),
                )
            })
        }
    }
}

/// The gid of `name` in the text of an `/etc/group` file.
fn gid_in(table: &str, name: &str) -> Option<u32> {
    table.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next() == Some(name))
            .then(|| fields.nth(1)?.parse().ok())
            .flatten()
    })
}

/// `error` with `what` in front of its message; the kind stays, so callers can still
/// tell "not found" from "no space left".
pub(crate) fn context(error: io::Error, what: String) -> io::Error {
    io::Error::new(error.kind(), format!("{what}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// Seconds the clock of [`Stamp::settled`] runs ahead, in this thread.
        pub(super) static CLOCK_AHEAD: Cell<i64> = const { Cell::new(0) };
        /// Files [`already_there`] read back, in this thread.
        pub(super) static READS: Cell<usize> = const { Cell::new(0) };
    }

    fn put(path: &Path, content: &Arc<str>) {
        let mut dirty = Dirs::default();
        write_file_known(
            path,
            content.as_bytes(),
            Some(content),
            PRIVATE_MODE,
            None,
            &Faults::default(),
            None,
            &mut dirty,
        )
        .unwrap();
    }

    fn reads() -> usize {
        READS.get()
    }

    #[test]
    fn a_file_left_as_written_is_not_read_again_until_it_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("site.pem");
        let pem: Arc<str> = Arc::from("PEM of site\n");
        put(&path, &pem);
        // Just written: its ctime has not settled, so it is read back next time.
        let start = reads();
        put(&path, &pem);
        assert_eq!(reads(), start + 1);
        put(&path, &pem);
        assert_eq!(reads(), start + 2, "still unsettled, still read");

        // Later: read back once more, then trusted while untouched.
        CLOCK_AHEAD.set(10);
        put(&path, &pem);
        assert_eq!(reads(), start + 3);
        put(&path, &pem);
        put(&path, &pem);
        assert_eq!(
            reads(),
            start + 3,
            "untouched and the same content: not read"
        );

        // The same text in another allocation is compared, not trusted.
        let copy: Arc<str> = Arc::from(&*pem);
        put(&path, &copy);
        assert_eq!(reads(), start + 4);

        // Changed in place behind hapwright's back (same length, times moved):
        // read, found different and written again.
        std::fs::write(&path, "PEM of evil\n").unwrap();
        let file = File::options().write(true).open(&path).unwrap();
        file.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000))
            .unwrap();
        drop(file);
        put(&path, &copy);
        assert_eq!(reads(), start + 5);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "PEM of site\n");

        // Replaced by another file (a new inode): read again.
        let other = dir.path().join("other");
        std::fs::write(&other, "PEM of site\n").unwrap();
        std::fs::set_permissions(&other, Permissions::from_mode(PRIVATE_MODE)).unwrap();
        put(&path, &copy);
        let before = reads();
        std::fs::rename(&other, &path).unwrap();
        put(&path, &copy);
        assert_eq!(reads(), before + 1);

        // Removed and written again: nothing is trusted from before.
        let mut dirty = Dirs::default();
        remove_file(&path, &mut dirty).unwrap();
        assert!(!Verified::table().contains_key(&path));
        CLOCK_AHEAD.set(0);
    }

    #[test]
    fn group_names_resolve_from_the_group_table() {
        let table = "root:x:0:\nhaproxy:x:113:\n# comment\nbroken\n";
        assert_eq!(gid_in(table, "haproxy"), Some(113));
        assert_eq!(gid_in(table, "root"), Some(0));
        assert_eq!(gid_in(table, "nobody"), None);
        assert_eq!(resolve_group(&Group::Id(42)).unwrap(), 42);
        let error = resolve_group(&Group::Name("no-such-group-hapwright".into())).unwrap_err();
        assert!(error.to_string().contains("numeric gid"), "{error}");
    }

    #[test]
    fn certificates_get_the_configured_mode_others_stay_public() {
        let modes = FileModes {
            cert_mode: 0o640,
            cert_group: Some(Group::Id(7)),
        };
        assert_eq!(modes.for_path("certs/a.pem"), (0o640, Some(&Group::Id(7))));
        assert_eq!(modes.for_path("maps/hosts.map"), (PUBLIC_MODE, None));
        assert_eq!(modes.for_path("haproxy.cfg"), (PUBLIC_MODE, None));
        assert_eq!(FileModes::default().cert_mode, 0o600);
    }
}
