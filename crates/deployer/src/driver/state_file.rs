//! Where the server state is saved before a reload: the `server-state-file` of the
//! rendered config (relative to `server-state-base`, then to the config directory),
//! but only inside the instance's config directory.
//!
//! The rendered config comes from user templates, so the path it names is not
//! trusted: hapwright writes the file itself (often as root), and a path such as
//! `/etc/cron.d/x` or `../../x` must not let a template write anywhere else. A path is
//! refused when, with `.` and `..` removed, it lies outside the config directory,
//! when a directory on the way is a symbolic link leading out of it, when it names
//! one of the files hapwright deploys there, or when it uses `${VAR}` (HAProxy expands
//! it from its own environment, which hapwright cannot check). The config is not
//! refused for it: one render serves every instance, each with its own config
//! directory, and the state dump is best effort, so the reload goes ahead without it.

use std::io;
use std::path::{Component, Path, PathBuf};

/// Why a server state file path was refused. None of these stops the reload.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// The path uses an environment variable, which only HAProxy can expand.
    #[error("`{path}` uses an environment variable; write the path without `${{...}}`")]
    EnvironmentReference {
        /// The path as written.
        path: String,
    },
    /// The path, with `.` and `..` resolved, lies outside the config directory.
    #[error("{} lies outside the config directory {}", path.display(), config_dir.display())]
    OutsideConfigDir {
        /// The resolved path.
        path: PathBuf,
        /// The instance's config directory.
        config_dir: PathBuf,
    },
    /// A directory on the way is a symbolic link that leads out of the config
    /// directory.
    #[error(
        "{} leads through a symbolic link to {}, outside the config directory {}",
        path.display(),
        resolved.display(),
        config_dir.display()
    )]
    SymlinkEscape {
        /// The resolved path.
        path: PathBuf,
        /// Where its existing part really is.
        resolved: PathBuf,
        /// The instance's config directory.
        config_dir: PathBuf,
    },
    /// The path names a file hapwright deploys (`haproxy.cfg`, `maps/`, `files/`,
    /// `certs/`) or keeps (names starting with `.`).
    #[error("{} would overwrite a file hapwright deploys", path.display())]
    DeployedFile {
        /// The resolved path.
        path: PathBuf,
    },
    /// The config directory or a directory on the way could not be looked at.
    #[error("cannot check where {} leads", path.display())]
    CheckFailed {
        /// The resolved path.
        path: PathBuf,
        /// The file system's error.
        #[source]
        source: io::Error,
    },
}

/// The path to write the server state to: `file`, relative to `base` when given,
/// then to `config_dir`; refused unless it stays inside `config_dir`.
///
/// # Errors
///
/// [`StateFileError`] when the path leaves the config directory (lexically or
/// through a symbolic link), names a deployed file or cannot be checked.
pub fn resolve(
    config_dir: &Path,
    file: &str,
    base: Option<&str>,
) -> Result<PathBuf, StateFileError> {
    for written in std::iter::once(file).chain(base) {
        if written.contains('$') {
            return Err(StateFileError::EnvironmentReference {
                path: written.to_owned(),
            });
        }
    }
    let config_dir = normalize(&absolute(config_dir)?);
    let mut path = PathBuf::from(file);
    if path.is_relative() {
        if let Some(base) = base {
            path = Path::new(base).join(path);
        }
        if path.is_relative() {
            path = config_dir.join(path);
        }
    }
    let path = normalize(&path);
    let Ok(relative) = path.strip_prefix(&config_dir) else {
        return Err(StateFileError::OutsideConfigDir { path, config_dir });
    };
    let first = relative.components().next();
    let deployed = match first {
        None => true,
        Some(Component::Normal(name)) => {
            let name = name.to_string_lossy();
            name.starts_with('.')
                || matches!(name.as_ref(), "haproxy.cfg" | "maps" | "files" | "certs")
        }
        Some(_) => true,
    };
    if deployed {
        return Err(StateFileError::DeployedFile { path });
    }
    // The parts that exist already, resolved through any symbolic links, must stay
    // inside the (resolved) config directory too.
    let check_failed = |source| StateFileError::CheckFailed {
        path: path.clone(),
        source,
    };
    let real_dir = config_dir.canonicalize().map_err(check_failed)?;
    let existing = path
        .parent()
        .into_iter()
        .flat_map(Path::ancestors)
        .find(|dir| dir.exists())
        .unwrap_or(&config_dir);
    let resolved = existing.canonicalize().map_err(check_failed)?;
    if !resolved.starts_with(&real_dir) {
        return Err(StateFileError::SymlinkEscape {
            path,
            resolved,
            config_dir,
        });
    }
    Ok(path)
}

fn absolute(path: &Path) -> Result<PathBuf, StateFileError> {
    std::path::absolute(path).map_err(|source| StateFileError::CheckFailed {
        path: path.to_path_buf(),
        source,
    })
}

/// `path` with `.` removed and `..` applied, without looking at the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_resolve_inside_the_config_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        assert_eq!(
            resolve(&root, "state/servers", None).unwrap(),
            root.join("state/servers")
        );
        assert_eq!(
            resolve(&root, "servers", Some("state")).unwrap(),
            root.join("state/servers")
        );
        assert_eq!(
            resolve(&root, "./a/../servers", None).unwrap(),
            root.join("servers")
        );
        let absolute = root.join("servers").display().to_string();
        assert_eq!(
            resolve(&root, &absolute, None).unwrap(),
            root.join("servers")
        );
    }

    #[test]
    fn paths_leaving_the_config_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        for (file, base) in [
            ("/tmp/servers", None),
            ("../servers", None),
            ("a/../../servers", None),
            ("servers", Some("/tmp")),
            ("servers", Some("..")),
        ] {
            let error = resolve(&root, file, base).unwrap_err();
            assert!(
                matches!(error, StateFileError::OutsideConfigDir { .. }),
                "{file} {base:?}: {error}"
            );
        }
        assert!(matches!(
            resolve(&root, "${HOME}/servers", None),
            Err(StateFileError::EnvironmentReference { .. })
        ));
        for deployed in ["haproxy.cfg", "maps/hosts.map", ".hapwright-state", "."] {
            assert!(
                matches!(
                    resolve(&root, deployed, None),
                    Err(StateFileError::DeployedFile { .. })
                ),
                "{deployed}"
            );
        }
    }

    #[test]
    fn a_symbolic_link_out_of_the_config_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("link")).unwrap();
        let error = resolve(&root, "link/servers", None).unwrap_err();
        assert!(
            matches!(error, StateFileError::SymlinkEscape { .. }),
            "{error}"
        );
        let error = resolve(&root, "link/deeper/servers", None).unwrap_err();
        assert!(
            matches!(error, StateFileError::SymlinkEscape { .. }),
            "{error}"
        );
    }
}
