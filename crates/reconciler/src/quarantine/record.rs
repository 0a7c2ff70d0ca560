//! The record of the quarantine, kept beside the deployed files so a quarantined
//! object keeps serving its last accepted version across a restart of hapwright
//! (clean or killed).
//!
//! Whenever the list of quarantined objects changes, [`Kept::save`] writes
//! [`QUARANTINE_RECORD_FILE`] into the config directory of every local instance
//! (beside the deployer's `.hapwright-state.json` and the safety valve's
//! `.hapwright-valve.json`): per object its watched resource, namespace and name,
//! the change held back, the version held back, its last accepted version (none
//! when it was new), the errors and since when. When nothing is quarantined any
//! more the record is removed. Writes are atomic (temporary file, fsync, rename,
//! fsync of the directory) with mode 0600, since objects may be Secrets.
//!
//! At start the newest readable record is read back once per process
//! ([`Kept::keep_in`]); the renderer takes it before its first render
//! ([`Kept::take_restored`]). An unreadable record is logged with its path and
//! cause and ignored: hapwright starts with an empty quarantine.
//!
//! The record names the controller config that judged the objects (the hash of the
//! loaded config). Read back under the same config, the objects are held back again
//! at once ([`Restored::hold`]); under another one (new templates may accept them)
//! the renderer checks the current objects first.
//!
//! A search takes a while (up to `maxValidations` renders and validations), and
//! until its result is recorded a restart would find no last accepted versions. So
//! when a search starts, the last good objects it searches against (every object of
//! the last render that validated) are written to [`BASELINE_FILE`] the same way
//! ([`Kept::save_baseline`]), and removed once the search's outcome is recorded or
//! a render validates (a search that gave up leaves it: the change is tried again).
//! A process that finds it at start (it was killed during a search) searches again
//! against those objects, so the culprits keep their last accepted versions.
//!
//! Payload changes (a whole HTTP source's list, held back as one unit) are not
//! recorded: their last accepted version is the whole previous list, which is not
//! kept. After a restart such a change is searched again.

use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use hapwright_eventbus::model::{Diagnostic, ObjectKey, StoredObject};
use hapwright_eventbus::record;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::changes::Snapshots;
use super::engine::{Culprit, Entry, Quarantine};

/// File name of the quarantine's record in an instance's config directory. It starts
/// with a dot, so snapshots and the layout of the deployed files never include it.
pub const QUARANTINE_RECORD_FILE: &str = ".hapwright-quarantine.json";

/// File name of the last good objects of a search in progress, beside
/// [`QUARANTINE_RECORD_FILE`].
pub const BASELINE_FILE: &str = ".hapwright-quarantine-baseline.json";

/// Name prefix of the temporary file written before the rename: the deployer's
/// start-up sweep removes one a killed hapwright left behind.
const TEMP_PREFIX: &str = ".hapwright-tmp-";

/// Version of the record's format.
const FORMAT: u32 = 1;

/// The steps [`Kept::save`] reports to its pause hook (fault injection for tests that
/// kill hapwright there).
pub mod steps {
    /// The quarantine changed; the record is not written yet.
    pub const DECIDED: &str = "quarantine-decided";
    /// The record is written (or removed).
    pub const RECORDED: &str = "quarantine-recorded";
}

/// The quarantine, as kept on disk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QuarantineRecord {
    /// Format version (1).
    pub format: u32,
    /// When the record was written.
    pub written_at: SystemTime,
    /// The hash of the controller config that judged the objects (see
    /// [`Kept::keep_in`]); `None` when unknown.
    #[serde(default)]
    pub config: Option<String>,
    /// The quarantined objects.
    pub objects: Vec<RecordedObject>,
}

/// One quarantined object, as kept on disk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedObject {
    /// The watched resource.
    pub resource: String,
    /// The object's namespace (empty when it has none).
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// `added`, `modified` or `removed`: the change held back.
    pub change: String,
    /// The version held back; `null` for a removal held back.
    pub held: Option<Value>,
    /// The last accepted version, served while the change is held back; `null` when
    /// the object was new.
    pub last_accepted: Option<Value>,
    /// Why the config with the change failed.
    pub errors: Vec<Diagnostic>,
    /// When the object was quarantined.
    pub since: SystemTime,
}

impl QuarantineRecord {
    /// The record of `quarantine` judged under the controller config `config`
    /// (payload changes left out).
    pub fn of(quarantine: &Quarantine, config: Option<String>) -> Self {
        Self {
            format: FORMAT,
            written_at: SystemTime::now(),
            config,
            objects: quarantine
                .entries()
                .filter(|entry| !entry.culprit.payload)
                .map(RecordedObject::of)
                .collect(),
        }
    }

    /// The quarantine entries again.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidData`] when an entry names an unknown change.
    pub fn into_entries(self) -> io::Result<Vec<Entry>> {
        self.objects
            .into_iter()
            .map(RecordedObject::into_entry)
            .collect()
    }

    /// Writes the record into `dir` (created when missing), atomically.
    ///
    /// # Errors
    ///
    /// When a step of the write fails.
    pub fn write(&self, dir: &Path) -> io::Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        write_private(dir, QUARANTINE_RECORD_FILE, &json)
    }

    /// The record in `dir`; `None` when there is none.
    ///
    /// # Errors
    ///
    /// When it cannot be read, or is not a record of this format
    /// ([`io::ErrorKind::InvalidData`]).
    pub fn read(dir: &Path) -> io::Result<Option<Self>> {
        let Some(record) = record::read_json::<Self>(&dir.join(QUARANTINE_RECORD_FILE))? else {
            return Ok(None);
        };
        record::check_format(record.format, FORMAT)?;
        for object in &record.objects {
            object.kind()?;
        }
        Ok(Some(record))
    }

    /// Removes the record from `dir` (nothing when there is none).
    ///
    /// # Errors
    ///
    /// When the file or the directory's fsync fails.
    pub fn remove(dir: &Path) -> io::Result<()> {
        record::remove_durably(dir, QUARANTINE_RECORD_FILE)
    }
}

impl RecordedObject {
    fn of(entry: &Entry) -> Self {
        let culprit = &entry.culprit;
        Self {
            resource: culprit.resource.to_string(),
            namespace: culprit.key.namespace.clone(),
            name: culprit.key.name.clone(),
            change: culprit.change.to_owned(),
            held: culprit.content.as_ref().map(StoredObject::parse),
            last_accepted: culprit.last_accepted.as_ref().map(StoredObject::parse),
            errors: culprit.errors.clone(),
            since: entry.since,
        }
    }

    /// The change held back, as the engine names it.
    fn kind(&self) -> io::Result<&'static str> {
        match self.change.as_str() {
            "added" => Ok("added"),
            "modified" => Ok("modified"),
            "removed" => Ok("removed"),
            other => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "object {} {}: unknown change `{other}`",
                    self.resource,
                    ObjectKey::new(&self.namespace, &self.name)
                ),
            )),
        }
    }

    fn into_entry(self) -> io::Result<Entry> {
        let change = self.kind()?;
        Ok(Entry {
            culprit: Culprit {
                resource: self.resource.into(),
                key: ObjectKey::new(self.namespace, self.name),
                change,
                content: self.held.as_ref().map(StoredObject::from_value),
                last_accepted: self.last_accepted.as_ref().map(StoredObject::from_value),
                payload: false,
                errors: self.errors,
            },
            since: self.since,
        })
    }
}

// === impl Baseline ===

/// The last good objects of a search in progress, as kept on disk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Baseline {
    /// Format version (1).
    pub format: u32,
    /// When it was written.
    pub written_at: SystemTime,
    /// The hash of the controller config the objects validated with.
    #[serde(default)]
    pub config: Option<String>,
    /// The objects, per watched resource (payload resources left out).
    pub resources: Vec<BaselineResource>,
}

/// The last good objects of one watched resource.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaselineResource {
    /// The watched resource.
    pub resource: String,
    /// Its objects.
    pub objects: Vec<BaselineObject>,
}

/// One last good object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaselineObject {
    /// The object's namespace (empty when it has none).
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The object.
    pub object: Value,
}

impl Baseline {
    /// The baseline of `snapshots` validated under `config`.
    pub fn of(snapshots: &Snapshots, config: Option<String>) -> Self {
        Self {
            format: FORMAT,
            written_at: SystemTime::now(),
            config,
            resources: snapshots
                .iter()
                .filter(|(_, snapshot)| snapshot.unit().is_none())
                .map(|(resource, snapshot)| BaselineResource {
                    resource: resource.to_string(),
                    objects: snapshot
                        .iter()
                        .map(|(key, object)| BaselineObject {
                            namespace: key.namespace.clone(),
                            name: key.name.clone(),
                            object: object.parse(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// The baseline in `dir`; `None` when there is none.
    ///
    /// # Errors
    ///
    /// When it cannot be read, or is not a baseline of this format
    /// ([`io::ErrorKind::InvalidData`]).
    pub fn read(dir: &Path) -> io::Result<Option<Self>> {
        let Some(baseline) = record::read_json::<Self>(&dir.join(BASELINE_FILE))? else {
            return Ok(None);
        };
        record::check_format(baseline.format, FORMAT)?;
        Ok(Some(baseline))
    }
}

/// Writes `content` to `dir/name` atomically with mode 0600: a temporary file
/// created exclusively in `dir`, written and fsynced, renamed over the target, and
/// the directory fsynced so the rename survives a power loss.
fn write_private(dir: &Path, name: &str, content: &[u8]) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)?;
    tmp.write_all(content)?;
    tmp.as_file().sync_all()?;
    tmp.persist(dir.join(name)).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()
}

// === impl Kept ===

/// What [`Kept::take_restored`] read back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Restored {
    /// The quarantined objects of the record.
    pub entries: Vec<Entry>,
    /// The record was written under the running controller config: the objects
    /// still at their quarantined version are held back again at once. Otherwise
    /// the current objects are checked with the running config first.
    pub hold: bool,
    /// The last good objects of a search the earlier run did not finish, when it
    /// ran under the running controller config: the baseline to search against.
    pub baseline: Option<Baseline>,
}

/// Called with a step name of [`steps`] around each write of the record.
pub type Pause = Arc<dyn Fn(&str) + Send + Sync>;

/// Where the quarantine is kept across restarts (see the [module docs](self)). Kept
/// by the process and shared by every iteration; cheap to clone. Without
/// directories (no local instance) the quarantine lives in memory only.
#[derive(Clone, Default)]
pub struct Kept {
    inner: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// Config directories the record is written to.
    dirs: Vec<PathBuf>,
    /// Whether the record was looked for (once per process).
    loaded: bool,
    /// The hash of the running controller config.
    config: Option<String>,
    /// The entries read back, until the renderer takes them, and the config that
    /// judged them.
    restored: Vec<Entry>,
    restored_config: Option<String>,
    /// The baseline read back, until the renderer takes it.
    baseline: Option<Baseline>,
    /// The snapshots of the baseline last written by this process (or `None`: a
    /// baseline may be on disk, so [`Kept::forget_baseline`] removes it).
    baseline_written: Option<Snapshots>,
    /// The config and objects last written by this process (`None`: nothing yet, so
    /// the next save writes, replacing an unreadable or outdated record).
    written: Option<(Option<String>, Vec<RecordedObject>)>,
    pause: Option<Pause>,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("Kept")
            .field("dirs", &state.dirs)
            .field("restored", &state.restored.len())
            .finish_non_exhaustive()
    }
}

impl Kept {
    /// Nothing kept yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls `pause` with [`steps::DECIDED`] before each write of the record and
    /// [`steps::RECORDED`] after it (fault injection: a test makes it block, then
    /// kills hapwright there).
    #[must_use]
    pub fn with_pause(self, pause: Pause) -> Self {
        self.lock().pause = Some(pause);
        self
    }

    /// Keeps the record in `dirs` (the config directories of the local instances),
    /// for the controller config whose hash is `config` (each iteration passes its
    /// own). The first call of the process reads the newest readable record back
    /// for [`take_restored`](Self::take_restored); an unreadable one is logged and
    /// ignored.
    pub fn keep_in(&self, dirs: Vec<PathBuf>, config: Option<String>) {
        let mut state = self.lock();
        state.dirs = dirs;
        state.config = config;
        if state.loaded {
            return;
        }
        state.loaded = true;
        state.baseline = read_newest_baseline(&state.dirs);
        if let Some(baseline) = &state.baseline {
            tracing::warn!(
                objects = baseline
                    .resources
                    .iter()
                    .map(|r| r.objects.len())
                    .sum::<usize>(),
                "Quarantine: the last run left the last good objects of an unfinished culprit search; they are the baseline of the first search"
            );
        }
        let Some(record) = read_newest(&state.dirs) else {
            return;
        };
        let config = record.config.clone();
        // `read` checked every entry.
        let entries = record.into_entries().unwrap_or_default();
        if !entries.is_empty() {
            tracing::warn!(
                objects = entries.len(),
                "Quarantine read back: objects quarantined before the restart keep their last accepted version until they change"
            );
        }
        state.restored = entries;
        state.restored_config = config;
    }

    /// The entries read back at start (once; empty afterwards).
    pub fn take_restored(&self) -> Restored {
        let mut state = self.lock();
        let baseline = state
            .baseline
            .take()
            .filter(|baseline| baseline.config == state.config);
        Restored {
            entries: std::mem::take(&mut state.restored),
            hold: state.restored_config == state.config,
            baseline,
        }
    }

    /// Writes `snapshots`, the last good objects a search is about to run against,
    /// as the baseline into every directory, unless they are what was last written.
    /// Blocking (it fsyncs); failures are logged.
    pub fn save_baseline(&self, snapshots: &Snapshots) {
        let (dirs, config) = {
            let state = self.lock();
            let same = state.baseline_written.as_ref().is_some_and(|written| {
                written.len() == snapshots.len()
                    && written
                        .iter()
                        .zip(snapshots)
                        .all(|((a, x), (b, y))| a == b && Arc::ptr_eq(x, y))
            });
            if same {
                return;
            }
            (state.dirs.clone(), state.config.clone())
        };
        if dirs.is_empty() {
            return;
        }
        let json = match serde_json::to_vec(&Baseline::of(snapshots, config)) {
            Ok(json) => json,
            Err(error) => {
                tracing::error!(%error, "Quarantine: cannot serialize the last good objects");
                return;
            }
        };
        for dir in &dirs {
            if let Err(error) = write_private(dir, BASELINE_FILE, &json) {
                tracing::error!(
                    path = %dir.join(BASELINE_FILE).display(),
                    %error,
                    "Quarantine: cannot write the last good objects of the search"
                );
            }
        }
        self.lock().baseline_written = Some(snapshots.clone());
    }

    /// Whether a baseline may be on disk (written by this process, or found at
    /// start and not removed yet), for [`forget_baseline`](Self::forget_baseline).
    pub fn may_hold_baseline(&self) -> bool {
        !self
            .lock()
            .baseline_written
            .as_ref()
            .is_some_and(Snapshots::is_empty)
    }

    /// Removes the baseline once the search's outcome is recorded, or a render
    /// validated. Blocking; failures are logged.
    pub fn forget_baseline(&self) {
        let dirs = {
            let mut state = self.lock();
            if state
                .baseline_written
                .as_ref()
                .is_some_and(Snapshots::is_empty)
            {
                return;
            }
            state.baseline_written = Some(Snapshots::new());
            state.dirs.clone()
        };
        for dir in &dirs {
            let result = record::remove_durably(dir, BASELINE_FILE);
            if let Err(error) = result {
                tracing::error!(
                    path = %dir.join(BASELINE_FILE).display(),
                    %error,
                    "Quarantine: cannot remove the last good objects of a finished search"
                );
            }
        }
    }

    /// Writes the record of `quarantine` into every directory (removes it when
    /// nothing is quarantined), unless it is what was last written. Blocking (it
    /// fsyncs); failures are logged.
    pub fn save(&self, quarantine: &Quarantine) {
        let (record, dirs, pause) = {
            let state = self.lock();
            let record = QuarantineRecord::of(quarantine, state.config.clone());
            if state.written.as_ref() == Some(&(record.config.clone(), record.objects.clone())) {
                return;
            }
            (record, state.dirs.clone(), state.pause.clone())
        };
        if dirs.is_empty() {
            return;
        }
        if let Some(pause) = &pause {
            pause(steps::DECIDED);
        }
        let mut all_written = true;
        for dir in &dirs {
            let path = dir.join(QUARANTINE_RECORD_FILE);
            let result = if record.objects.is_empty() {
                QuarantineRecord::remove(dir)
            } else {
                record.write(dir)
            };
            if let Err(error) = result {
                all_written = false;
                tracing::error!(
                    path = %path.display(),
                    %error,
                    "Quarantine: cannot write the record; a restart would forget the quarantine"
                );
            }
        }
        self.lock().written = all_written.then_some((record.config, record.objects));
        if let Some(pause) = &pause {
            pause(steps::RECORDED);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The newest readable baseline in `dirs`; unreadable ones are logged and skipped.
fn read_newest_baseline(dirs: &[PathBuf]) -> Option<Baseline> {
    record::read_newest(
        dirs,
        Baseline::read,
        |baseline| baseline.written_at,
        |dir, error| {
            tracing::error!(
                path = %dir.join(BASELINE_FILE).display(),
                %error,
                "Quarantine: the last good objects of an unfinished search are unreadable and are ignored"
            )
        },
    )
}

/// The newest readable record in `dirs`; unreadable ones are logged (with their
/// path and cause) and skipped.
fn read_newest(dirs: &[PathBuf]) -> Option<QuarantineRecord> {
    record::read_newest(
        dirs,
        QuarantineRecord::read,
        |record| record.written_at,
        |dir, error| {
            tracing::error!(
                path = %dir.join(QUARANTINE_RECORD_FILE).display(),
                %error,
                "Quarantine: the record is unreadable and is ignored; starting with an empty quarantine"
            );
        },
    )
}

#[cfg(test)]
mod tests;
