//! The names of a render's files, as phase 1 checks the config's file references
//! against them.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use hapwright_eventbus::model::{FileGroup, RenderedConfig};

/// The directories of the config directory's layout, in the order of a render's
/// groups (maps, files, certificates).
pub(crate) const LAYOUT_DIRS: [&str; 3] = ["maps/", "files/", "certs/"];

/// The paths of a render's files relative to the config directory
/// (`haproxy.cfg`, `maps/NAME`, `files/NAME`, `certs/NAME`): what the phase-1 check
/// of file references ([`super::check`]) looks paths up in.
///
/// Built from a render, it holds the render's groups ([`FileGroup`], persistent
/// maps) rather than a string per file: building it costs nothing, and two of them
/// from renders that share most of their files are compared by the parts they do
/// not share ([`FileNames::same`]), so a render of 10,000 certificates that adds
/// one is not a set of 10,000 paths built again.
#[derive(Clone, Default)]
pub struct FileNames {
    /// The names in `maps/`, `files/` and `certs/` (the contents are not used).
    groups: [FileGroup; 3],
    /// Every other path (`haproxy.cfg` for a render).
    other: BTreeSet<String>,
}

impl FileNames {
    /// The paths of `rendered`'s files.
    pub fn of(rendered: &RenderedConfig) -> Self {
        Self {
            groups: rendered.groups().map(FileGroup::clone),
            other: BTreeSet::from(["haproxy.cfg".to_owned()]),
        }
    }

    /// The paths in `paths` (relative to the config directory).
    pub fn from_paths<S: AsRef<str>>(paths: impl IntoIterator<Item = S>) -> Self {
        let mut names = Self::default();
        let empty: Arc<str> = Arc::from("");
        for path in paths {
            let path = path.as_ref();
            match split(path) {
                Some((slot, name)) => {
                    names.groups[slot].insert(name.to_owned(), Arc::clone(&empty));
                }
                None => {
                    names.other.insert(path.to_owned());
                }
            }
        }
        names
    }

    /// Whether `path` is one of the paths.
    pub fn contains(&self, path: &str) -> bool {
        match split(path) {
            Some((slot, name)) => self.groups[slot].contains_key(name),
            None => self.other.contains(path),
        }
    }

    /// Whether some path starts with `prefix`.
    pub fn any_starting_with(&self, prefix: &str) -> bool {
        let in_groups = LAYOUT_DIRS.iter().zip(&self.groups).any(|(dir, group)| {
            if let Some(rest) = prefix.strip_prefix(dir) {
                // The first name at or after `rest` is the one that may start with it.
                group
                    .range(rest.to_owned()..)
                    .next()
                    .is_some_and(|(name, _)| name.starts_with(rest))
            } else {
                // `prefix` is shorter than the directory, or elsewhere.
                dir.starts_with(prefix) && !group.is_empty()
            }
        });
        in_groups
            || self
                .other
                .range(prefix.to_owned()..)
                .next()
                .is_some_and(|path| path.starts_with(prefix))
    }

    /// The names in `dir` (one of `maps/`, `files/`, `certs/`), in order.
    pub fn names_in<'a>(&'a self, dir: &str) -> impl Iterator<Item = &'a str> + 'a {
        let slot = LAYOUT_DIRS.iter().position(|d| *d == dir);
        slot.into_iter()
            .flat_map(|slot| self.groups[slot].keys().map(String::as_str))
    }

    /// Whether both hold the same paths. Groups taken from renders that share
    /// most of their files compare only the parts they do not share.
    pub fn same(&self, other: &Self) -> bool {
        use imbl::ordmap::DiffItem;
        self.other == other.other
            && self.groups.iter().zip(&other.groups).all(|(a, b)| {
                a.ptr_eq(b)
                    || (a.len() == b.len()
                        && a.diff(b)
                            .all(|item| matches!(item, DiffItem::Update { .. })))
            })
    }

    /// The paths added in `self` and removed from `before`, in order: each
    /// with `true` when it is new.
    pub fn changes_since<'a>(&'a self, before: &'a Self) -> Vec<(String, bool)> {
        use imbl::ordmap::DiffItem;
        let mut out = Vec::new();
        for ((dir, old), new) in LAYOUT_DIRS.iter().zip(&before.groups).zip(&self.groups) {
            for item in old.diff(new) {
                match item {
                    DiffItem::Add(name, _) => out.push((format!("{dir}{name}"), true)),
                    DiffItem::Remove(name, _) => out.push((format!("{dir}{name}"), false)),
                    DiffItem::Update { .. } => {}
                }
            }
        }
        out.extend(
            self.other
                .difference(&before.other)
                .map(|path| (path.clone(), true)),
        );
        out.extend(
            before
                .other
                .difference(&self.other)
                .map(|path| (path.clone(), false)),
        );
        out
    }

    /// Every path, in the order of [`RenderedConfig::iter`] (`haproxy.cfg` and the
    /// other paths first, then maps, files and certificates by name).
    pub fn paths(&self) -> impl Iterator<Item = String> + '_ {
        self.other.iter().cloned().chain(
            LAYOUT_DIRS
                .iter()
                .zip(&self.groups)
                .flat_map(|(dir, group)| group.keys().map(move |name| format!("{dir}{name}"))),
        )
    }

    /// The name of `path` in its directory (`path` itself outside the layout's
    /// directories).
    pub fn name_of(path: &str) -> &str {
        split(path).map_or(path, |(_, name)| name)
    }

    /// The number of paths.
    pub fn len(&self) -> usize {
        self.other.len() + self.groups.iter().map(FileGroup::len).sum::<usize>()
    }

    /// Whether there are no paths.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl PartialEq for FileNames {
    fn eq(&self, other: &Self) -> bool {
        self.same(other)
    }
}

impl fmt::Debug for FileNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.paths()).finish()
    }
}

/// The group and the name of a path in one of the layout's directories.
fn split(path: &str) -> Option<(usize, &str)> {
    LAYOUT_DIRS
        .iter()
        .enumerate()
        .find_map(|(slot, dir)| path.strip_prefix(dir).map(|name| (slot, name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn path() -> impl Strategy<Value = String> {
        (
            prop::sample::select(vec!["maps/", "files/", "certs/", "", "ma", "certs/a/"]),
            "[ab./]{0,3}",
        )
            .prop_map(|(dir, name)| format!("{dir}{name}"))
    }

    proptest! {
        /// Every question answers as the same question to the set of the paths as
        /// strings does.
        #[test]
        fn answers_as_a_set_of_paths(
            paths in prop::collection::btree_set(path(), 0..12),
            others in prop::collection::btree_set(path(), 0..12),
            probe in path(),
        ) {
            let names = FileNames::from_paths(&paths);
            let other = FileNames::from_paths(&others);
            prop_assert_eq!(names.contains(&probe), paths.contains(&probe));
            prop_assert_eq!(
                names.any_starting_with(&probe),
                paths.iter().any(|p| p.starts_with(&probe))
            );
            for dir in LAYOUT_DIRS {
                let listed: Vec<&str> = names.names_in(dir).collect();
                let expected: Vec<&str> =
                    paths.iter().filter_map(|p| p.strip_prefix(dir)).collect();
                prop_assert_eq!(listed, expected);
            }
            prop_assert_eq!(names.same(&other), paths == others);
            prop_assert_eq!(names.len(), paths.len());
            let mut listed: Vec<String> = names.paths().collect();
            listed.sort();
            prop_assert_eq!(listed, paths.iter().cloned().collect::<Vec<_>>());
            let mut changes = other.changes_since(&names);
            changes.sort();
            let mut expected: Vec<(String, bool)> = others
                .difference(&paths)
                .map(|p| (p.clone(), true))
                .chain(paths.difference(&others).map(|p| (p.clone(), false)))
                .collect();
            expected.sort();
            prop_assert_eq!(changes, expected);
        }
    }

    #[test]
    fn a_render_shares_its_groups() {
        let rendered = RenderedConfig::builder("global\n")
            .map("hosts.map", "a b\n")
            .certificate("a.pem", "x")
            .build();
        let names = FileNames::of(&rendered);
        assert!(names.contains("haproxy.cfg"));
        assert!(names.contains("maps/hosts.map"));
        assert!(names.contains("certs/a.pem"));
        assert!(!names.contains("certs/b.pem"));
        assert!(names.any_starting_with("certs/"));
        assert!(!names.any_starting_with("files/"));
        assert!(names.same(&FileNames::from_paths([
            "haproxy.cfg",
            "maps/hosts.map",
            "certs/a.pem"
        ])));
    }
}
