//! Fault injection for tests: make one file write fail, or stop a deployment at a
//! named step so a test can SIGKILL the controller exactly there.
//!
//! In-process tests attach [`Faults`] to a [`ConfigDir`](super::ConfigDir) with
//! [`with_faults`](super::ConfigDir::with_faults). End-to-end tests of the real binary
//! set the environment variable [`FAULTS_VARIABLE`] (`HAPWRIGHT_FAULTS`), which every
//! `ConfigDir` reads when it is created. Its value is a comma-separated list of:
//!
//! - `fail-write=<relative path>` — writing that layout file (`maps/hosts.map`,
//!   `certs/site.pem`, `haproxy.cfg`, `.hapwright-state.json`) fails with ENOSPC
//!   ("No space left on device") after its temporary file was created, as a full
//!   disk would;
//! - `pause=<step>:<marker file>` — when the deployment reaches `<step>` (see
//!   [`steps`]), the marker file is created and the calling thread blocks forever;
//! - `fail-restore` — putting the last good files back fails with ENOSPC, as a disk
//!   that filled up during the deployment would;
//! - `arm=<file>` — the other faults act only while this file exists, so a test can
//!   let the controller start and deploy normally, then create the file before the
//!   change it wants to break (and remove it to let the retries succeed).
//!
//! Example: `HAPWRIGHT_FAULTS=pause=after-side-files:/tmp/t/paused`. Leave it unset in
//! production; an invalid value is logged and ignored.

use std::io;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The environment variable read by [`Faults::from_env`].
pub const FAULTS_VARIABLE: &str = "HAPWRIGHT_FAULTS";

/// The step names a deployment passes, for `pause=<step>:<file>`.
pub mod steps {
    /// Maps, files and certificates are written; `haproxy.cfg` is not yet
    /// (reached inside [`ConfigDir::write`](crate::haproxy::files::ConfigDir::write)).
    pub const AFTER_SIDE_FILES: &str = "after-side-files";
    /// Every file is written; the reload is not sent yet (reached by the driver).
    pub const BEFORE_RELOAD: &str = "before-reload";
    /// The reload is confirmed; the state record is not written yet (reached by the
    /// driver).
    pub const AFTER_RELOAD: &str = "after-reload";
    /// The first runtime change of a runtime-only deployment is applied, the others
    /// and the files are not yet (reached by the socket driver).
    pub const AFTER_RUNTIME_OP: &str = "after-runtime-op";
    /// The quarantine changed; its record is not written yet (reached by the
    /// renderer, through the pause hook the application gives its record).
    pub const QUARANTINE_DECIDED: &str = "quarantine-decided";
    /// The quarantine's record is written; nothing depending on it went out yet.
    pub const QUARANTINE_RECORDED: &str = "quarantine-recorded";
    /// Every step name, to check a `pause=` spec against.
    pub const ALL: [&str; 6] = [
        AFTER_SIDE_FILES,
        BEFORE_RELOAD,
        AFTER_RELOAD,
        AFTER_RUNTIME_OP,
        QUARANTINE_DECIDED,
        QUARANTINE_RECORDED,
    ];
}

/// Why a fault spec was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FaultsError {
    /// An entry is not `fail-write=<path>` or `pause=<step>:<file>`.
    #[error(
        "`{0}` is not `fail-write=<relative path>`, `fail-restore`, `pause=<step>:<marker file>` or `arm=<file>`"
    )]
    ParseEntry(String),
    /// `pause=` names a step deployments do not have.
    #[error(
        "unknown step `{0}` (steps: after-side-files, before-reload, after-reload, after-runtime-op, quarantine-decided, quarantine-recorded)"
    )]
    UnknownStep(String),
}

/// Faults to inject (module doc); the default injects none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Writing this layout file (relative path) fails with ENOSPC.
    pub fail_write: Option<String>,
    /// At this step, create the marker file and block the thread forever.
    pub pause: Option<(String, PathBuf)>,
    /// Restoring a snapshot fails with ENOSPC.
    pub fail_restore: bool,
    /// When set, the faults act only while this file exists.
    pub arm: Option<PathBuf>,
}

impl Faults {
    /// Parses the [`FAULTS_VARIABLE`] syntax (module doc).
    pub fn parse(spec: &str) -> Result<Self, FaultsError> {
        let mut faults = Faults::default();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let invalid = || FaultsError::ParseEntry(entry.to_owned());
            match entry.split_once('=') {
                Some(("fail-write", path)) if !path.is_empty() => {
                    faults.fail_write = Some(path.to_owned());
                }
                None if entry == "fail-restore" => faults.fail_restore = true,
                Some(("arm", file)) if !file.is_empty() => {
                    faults.arm = Some(PathBuf::from(file));
                }
                Some(("pause", rest)) => {
                    let (step, file) = rest.split_once(':').ok_or_else(invalid)?;
                    if !steps::ALL.contains(&step) {
                        return Err(FaultsError::UnknownStep(step.to_owned()));
                    }
                    if file.is_empty() {
                        return Err(invalid());
                    }
                    faults.pause = Some((step.to_owned(), PathBuf::from(file)));
                }
                _ => return Err(invalid()),
            }
        }
        Ok(faults)
    }

    /// The faults in [`FAULTS_VARIABLE`], read once per process; none when unset or
    /// invalid (an invalid value is logged as an error).
    pub fn from_env() -> Self {
        static FROM_ENV: OnceLock<Faults> = OnceLock::new();
        FROM_ENV
            .get_or_init(|| match std::env::var(FAULTS_VARIABLE) {
                Ok(spec) => match Faults::parse(&spec) {
                    Ok(faults) => {
                        tracing::warn!(variable = FAULTS_VARIABLE, ?faults, "Fault injection is on");
                        faults
                    }
                    Err(error) => {
                        tracing::error!(variable = FAULTS_VARIABLE, %error, "Ignoring invalid fault injection");
                        Faults::default()
                    }
                },
                Err(_) => Faults::default(),
            })
            .clone()
    }

    /// Whether [`Self::reached`] may pause at `step` (a pause is configured there),
    /// so a caller off the blocking pool can skip going there for nothing.
    pub fn pauses_at(&self, step: &str) -> bool {
        self.pause.as_ref().is_some_and(|(at, _)| at == step)
    }

    /// Whether no fault is configured.
    pub fn is_empty(&self) -> bool {
        self.fail_write.is_none() && self.pause.is_none() && !self.fail_restore
    }

    /// Whether the faults act now (no `arm=` file given, or it exists).
    fn armed(&self) -> bool {
        self.arm.as_ref().is_none_or(|file| file.exists())
    }

    /// Marks that a deployment (or the quarantine's record) reached `step`. With
    /// `pause=<step>:<file>` this creates the marker file and blocks the calling
    /// thread forever (call it from blocking code; the test SIGKILLs the process).
    /// Otherwise it returns at once.
    pub fn reached(&self, step: &str) {
        let Some((paused_at, marker)) = &self.pause else {
            return;
        };
        if paused_at != step || !self.armed() {
            return;
        }
        tracing::warn!(step, marker = %marker.display(), "Paused by fault injection");
        if let Err(error) = std::fs::write(marker, step) {
            tracing::error!(%error, marker = %marker.display(), "Cannot create the fault injection marker");
        }
        loop {
            std::thread::park();
        }
    }

    /// The injected error for restoring a snapshot, if any.
    pub(crate) fn check_restore(&self) -> io::Result<()> {
        if self.fail_restore && self.armed() {
            return Err(io::Error::from_raw_os_error(
                rustix::io::Errno::NOSPC.raw_os_error(),
            ));
        }
        Ok(())
    }

    /// The injected error for writing `relative`, if any.
    pub(crate) fn check_write(&self, relative: &str) -> io::Result<()> {
        if self.fail_write.as_deref() == Some(relative) && self.armed() {
            return Err(io::Error::from_raw_os_error(
                rustix::io::Errno::NOSPC.raw_os_error(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(Faults::parse("").unwrap(), Faults::default());
        let faults =
            Faults::parse("fail-write=maps/hosts.map, pause=before-reload:/tmp/x").unwrap();
        assert_eq!(faults.fail_write.as_deref(), Some("maps/hosts.map"));
        assert_eq!(
            faults.pause,
            Some(("before-reload".to_owned(), PathBuf::from("/tmp/x")))
        );
        assert_eq!(
            Faults::parse("pause=later:/tmp/x").unwrap_err(),
            FaultsError::UnknownStep("later".into())
        );
        for bad in [
            "fail-write=",
            "pause=before-reload",
            "pause=before-reload:",
            "x=y",
            "z",
        ] {
            assert!(
                matches!(Faults::parse(bad), Err(FaultsError::ParseEntry(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn failing_write_reports_a_full_disk() {
        let faults = Faults::parse("fail-write=maps/a.map").unwrap();
        assert!(faults.check_write("maps/b.map").is_ok());
        let error = faults.check_write("maps/a.map").unwrap_err();
        assert!(
            error.to_string().contains("No space left on device"),
            "{error}"
        );
        // A step without a pause returns.
        faults.reached(steps::AFTER_SIDE_FILES);
    }

    #[test]
    fn faults_act_only_while_armed() {
        let dir = tempfile::tempdir().unwrap();
        let arm = dir.path().join("arm");
        let faults = Faults::parse(&format!(
            "arm={},fail-write=maps/a.map,pause=after-reload:{}",
            arm.display(),
            dir.path().join("paused").display()
        ))
        .unwrap();
        assert!(faults.check_write("maps/a.map").is_ok());
        // Not armed: the pause step returns at once.
        faults.reached(steps::AFTER_RELOAD);
        assert!(!dir.path().join("paused").exists());
        std::fs::write(&arm, "").unwrap();
        assert!(faults.check_write("maps/a.map").is_err());
    }
}
