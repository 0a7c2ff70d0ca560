//! Rendered configurations: `haproxy.cfg` plus named maps, files and certificates,
//! a content hash and a source map back to the templates.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use sha2::{Digest, Sha256};

/// The kind of a rendered file, which fixes where it lands under an instance's config
/// directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// `haproxy.cfg`.
    Main,
    /// `maps/<name>`.
    Map,
    /// `files/<name>`.
    File,
    /// `certs/<name>`.
    Certificate,
}

impl FileKind {
    /// The directory under the config directory, if any.
    pub fn directory(self) -> Option<&'static str> {
        match self {
            FileKind::Main => None,
            FileKind::Map => Some("maps"),
            FileKind::File => Some("files"),
            FileKind::Certificate => Some("certs"),
        }
    }

    /// Where a file of this kind named `name` lands, relative to the config directory
    /// (`maps/hosts.map`); the main config is always `haproxy.cfg`. The same string
    /// names the file in error messages.
    pub fn relative_path(self, name: &str) -> String {
        match self.directory() {
            None => "haproxy.cfg".to_owned(),
            Some(dir) => format!("{dir}/{name}"),
        }
    }
}

/// Identifies one rendered file: its kind and name (the main config's name is
/// `haproxy.cfg`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RenderedFileRef {
    /// Kind of file.
    pub kind: FileKind,
    /// Name as configured (`hosts.map`).
    pub name: String,
}

impl RenderedFileRef {
    /// Path relative to the config directory.
    pub fn relative_path(&self) -> String {
        self.kind.relative_path(&self.name)
    }
}

/// A SHA-256 over a rendered configuration, printed as lowercase hex (the same digits
/// `sha256sum` would print over the same bytes when it covers one file).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ContentHash([u8; 32]);

impl ContentHash {
    /// The hash of one byte string.
    pub fn of(bytes: &[u8]) -> Self {
        let digest = Sha256::digest(bytes);
        let mut out = [0u8; 32];
        out.copy_from_slice(&digest);
        Self(out)
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The first 12 hex digits, for logs and labels.
    pub fn short(&self) -> String {
        hex(&self.0[..6])
    }
}

/// Lower-case hex of `bytes`, without the formatting machinery (hashes are printed
/// in every log line and event of a render).
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

impl fmt::Display for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Debug for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContentHash({})", self.short())
    }
}

impl Serialize for ContentHash {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The template line that produced one rendered line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LineOrigin {
    /// Template or snippet name (`haproxy.cfg`, `backend-servers`, `maps/hosts.map`).
    pub template: Arc<str>,
    /// 1-based line in that template.
    pub line: u32,
}

/// For every rendered file, the origin of each of its lines (index 0 = line 1).
///
/// A line's origin is kept as a number into a table of origins that a renderer
/// shares between all its renders (one per template line that writes output), so a
/// file of 60,000 lines costs four bytes a line and no reference counting.
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    /// A persistent map: a render that changes a few of 10,000 files copies the
    /// last render's map in constant time and updates those.
    files: imbl::OrdMap<RenderedFileRef, Arc<[Option<u32>]>>,
    origins: Arc<[LineOrigin]>,
}

impl SourceMap {
    /// An empty map whose files' lines number into `origins`
    /// ([`SourceMap::insert_indexed`]).
    pub fn with_origins(origins: Arc<[LineOrigin]>) -> Self {
        Self {
            files: imbl::OrdMap::new(),
            origins,
        }
    }

    /// Records the origins of a rendered file's lines.
    pub fn insert(&mut self, file: RenderedFileRef, lines: Vec<Option<LineOrigin>>) {
        let mut origins = self.origins.to_vec();
        let indexed: Vec<Option<u32>> = lines
            .into_iter()
            .map(|line| {
                line.map(|origin| {
                    let index = origins
                        .iter()
                        .position(|known| *known == origin)
                        .unwrap_or_else(|| {
                            origins.push(origin);
                            origins.len() - 1
                        });
                    u32::try_from(index).unwrap_or(u32::MAX)
                })
            })
            .collect();
        self.origins = origins.into();
        self.files.insert(file, indexed.into());
    }

    /// Records a rendered file's lines as numbers into the origins the map was made
    /// with ([`SourceMap::with_origins`]); shared with their owner (a renderer keeps
    /// the lines of the files it may reuse).
    pub fn insert_indexed(&mut self, file: RenderedFileRef, lines: Arc<[Option<u32>]>) {
        self.files.insert(file, lines);
    }

    /// Takes every file of `other` (made with the same origins: both from one
    /// renderer) into this map, replacing what it had for them.
    pub fn absorb(&mut self, other: SourceMap) {
        debug_assert!(Arc::ptr_eq(&self.origins, &other.origins) || other.files.is_empty());
        self.files.extend(other.files);
    }

    /// Whether this map already gives every file of `other` the lines `other` gives
    /// it (both numbered into the same origins): taking `other` in
    /// ([`SourceMap::absorb`]) would change nothing.
    pub fn covers(&self, other: &SourceMap) -> bool {
        (Arc::ptr_eq(&self.origins, &other.origins) || other.files.is_empty())
            && other.files.iter().all(|(file, lines)| {
                self.files
                    .get(file)
                    .is_some_and(|own| Arc::ptr_eq(own, lines) || own[..] == lines[..])
            })
    }

    /// Forgets a file's lines.
    pub fn remove(&mut self, file: &RenderedFileRef) {
        self.files.remove(file);
    }

    /// A file's lines as numbers into the origins ([`SourceMap::insert_indexed`]).
    pub fn lines(&self, file: &RenderedFileRef) -> Option<&Arc<[Option<u32>]>> {
        self.files.get(file)
    }

    /// Where line `line` (1-based) of `file` came from, when known.
    pub fn origin(&self, file: &RenderedFileRef, line: u32) -> Option<&LineOrigin> {
        let index = usize::try_from(line).ok()?.checked_sub(1)?;
        let origin = (*self.files.get(file)?.get(index)?)?;
        self.origins.get(usize::try_from(origin).ok()?)
    }

    /// Looks a file up by its path relative to the config directory.
    pub fn origin_by_path(&self, relative_path: &str, line: u32) -> Option<&LineOrigin> {
        let file = self
            .files
            .keys()
            .find(|file| file.relative_path() == relative_path)?;
        self.origin(file, line)
    }

    /// Each line's origin, resolved.
    fn resolved<'a>(
        &'a self,
        lines: &'a [Option<u32>],
    ) -> impl Iterator<Item = Option<&'a LineOrigin>> + 'a {
        lines
            .iter()
            .map(|line| line.and_then(|index| self.origins.get(usize::try_from(index).ok()?)))
    }
}

/// Two maps are equal when they give every file's lines the same origins, however
/// their tables are numbered.
impl PartialEq for SourceMap {
    fn eq(&self, other: &Self) -> bool {
        self.files.len() == other.files.len()
            && self
                .files
                .iter()
                .zip(other.files.iter())
                .all(|((a, la), (b, lb))| {
                    a == b
                        && la.len() == lb.len()
                        && ((Arc::ptr_eq(&self.origins, &other.origins) && la == lb)
                            || self.resolved(la).eq(other.resolved(lb)))
                })
    }
}

impl Eq for SourceMap {}

/// Serialized as each file's list of origins: `{"files": {file: [origin or null]}}`.
impl Serialize for SourceMap {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;

        struct Lines<'a>(&'a SourceMap, &'a [Option<u32>]);
        impl Serialize for Lines<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.resolved(self.1))
            }
        }
        struct Files<'a>(&'a SourceMap);
        impl Serialize for Files<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_map(
                    self.0
                        .files
                        .iter()
                        .map(|(file, lines)| (file, Lines(self.0, lines))),
                )
            }
        }
        let mut state = serializer.serialize_struct("SourceMap", 1)?;
        state.serialize_field("files", &Files(self))?;
        state.end()
    }
}

/// One group of a render's files (maps, files or certificates) by name: a
/// persistent map, so a render that changes a few of 10,000 certificates shares the
/// rest of the group with the render before it (cloning is constant time), and two
/// renders' groups are compared by the parts they do not share
/// ([`imbl::OrdMap::diff`]).
pub type FileGroup = imbl::OrdMap<String, Arc<str>>;

/// One complete render: `haproxy.cfg` plus the named auxiliary files, with a content
/// hash over all of them and a source map.
///
/// Contents are `Arc<str>`, so events and caches share one copy.
#[derive(Clone)]
pub struct RenderedConfig {
    main: Arc<str>,
    // Shared: a renderer builds the next render's groups from these
    // ([`RenderedConfig::groups`]) without copying a group that did not change.
    maps: FileGroup,
    files: FileGroup,
    certificates: FileGroup,
    hash: ContentHash,
    source_map: Arc<SourceMap>,
}

/// Equal when every file is: contents shared by pointer are not compared byte by
/// byte ([`same_text`]), and two renders whose hashes differ are not compared at all.
impl PartialEq for RenderedConfig {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
            && same_text(&self.main, &other.main)
            && same_files(&self.maps, &other.maps)
            && same_files(&self.files, &other.files)
            && same_files(&self.certificates, &other.certificates)
            && (Arc::ptr_eq(&self.source_map, &other.source_map)
                || self.source_map == other.source_map)
    }
}

impl Eq for RenderedConfig {}

impl fmt::Debug for RenderedConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Certificates may hold private keys: never print contents.
        f.debug_struct("RenderedConfig")
            .field("hash", &self.hash)
            .field("main_bytes", &self.main.len())
            .field("maps", &self.maps.keys().collect::<Vec<_>>())
            .field("files", &self.files.keys().collect::<Vec<_>>())
            .field(
                "certificates",
                &self.certificates.keys().collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// How one render went: how many files and snippet outputs the template engine
/// rendered and how many were taken unchanged from the previous render because
/// nothing they read changed,
/// and why everything was rendered when it was. Users ask "why did this render take
/// so long?": the status page answers "incremental" or "full, because ...".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RenderSummary {
    /// Files and cached snippet outputs rendered by the template engine.
    pub rendered: usize,
    /// Files and cached snippet outputs reused from the previous render.
    pub reused: usize,
    /// Why every file was rendered (`None`: the render was incremental).
    pub full_reason: Option<String>,
}

impl RenderSummary {
    /// `incremental`, or `full, because <reason>`.
    pub fn mode(&self) -> String {
        match &self.full_reason {
            None => "incremental".to_owned(),
            Some(reason) => format!("full, because {reason}"),
        }
    }
}

/// Whether two file contents are equal: by pointer first, then by bytes. Renders
/// share the contents of unchanged files, but `==` on `Arc<str>` always compares
/// the bytes (the standard library takes the pointer shortcut for sized types
/// only), which at 10,000 certificates is 25 MB compared on every change.
pub fn same_text(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

/// [`same_text`] of two files either of which may be missing.
pub fn same_file(a: Option<&Arc<str>>, b: Option<&Arc<str>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => same_text(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// Whether two sets of files have the same names and contents: the parts the two
/// groups share are not compared ([`imbl::OrdMap::diff`]).
pub fn same_files(a: &FileGroup, b: &FileGroup) -> bool {
    a.ptr_eq(b) || (a.len() == b.len() && a.diff(b).next().is_none())
}

/// The SHA-256 of one file's content: what a render's content hash takes of each
/// file ([`RenderedConfig::new`]). A renderer that hands out a file again unchanged
/// can hand out its digest with it ([`RenderedConfig::from_hashed_main_with`]), so
/// a render of 10,000 certificates that renews one hashes one.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileDigest([u8; 32]);

impl FileDigest {
    /// The digest of `content`.
    pub fn of(content: &str) -> Self {
        let mut out = [0u8; 32];
        out.copy_from_slice(&Sha256::digest(content.as_bytes()));
        Self(out)
    }

    /// The digest of `content`, with the states its next version's digest can
    /// resume from (`None` for a file too small to be worth them), computed from the
    /// states `last` kept for an earlier version of the file where the two start
    /// alike: a map of 10,000 lines that gains a line near its end (an Ingress newer
    /// than the others) hashes its last stretch, not its whole length again. The
    /// digest is always [`FileDigest::of`]`(content)`.
    pub fn of_resumable(
        content: &Arc<str>,
        last: Option<&DigestResume>,
    ) -> (Self, Option<DigestResume>) {
        let (digest, resume, _) = Self::resumed(content, last);
        (digest, resume)
    }

    /// [`FileDigest::of_resumable`], with the number of bytes it hashed.
    fn resumed(
        content: &Arc<str>,
        last: Option<&DigestResume>,
    ) -> (Self, Option<DigestResume>, usize) {
        let bytes = content.as_bytes();
        if bytes.len() < 2 * RESUME_STEP {
            return (Self::of(content), None, bytes.len());
        }
        // The leading stretches both versions share: the state after each of them
        // is the same for both.
        let kept = last.map_or(0, |last| {
            let old = last.content.as_bytes();
            last.states
                .iter()
                .enumerate()
                .take_while(|(index, _)| {
                    let end = (index + 1) * RESUME_STEP;
                    end <= bytes.len()
                        && end <= old.len()
                        && bytes[index * RESUME_STEP..end] == old[index * RESUME_STEP..end]
                })
                .count()
        });
        let mut states: Vec<Sha256> =
            last.map_or_else(Vec::new, |last| last.states[..kept].to_vec());
        let mut hasher = states.last().cloned().unwrap_or_default();
        let mut at = kept * RESUME_STEP;
        while at + RESUME_STEP <= bytes.len() {
            hasher.update(&bytes[at..at + RESUME_STEP]);
            at += RESUME_STEP;
            states.push(hasher.clone());
        }
        hasher.update(&bytes[at..]);
        let mut out = [0u8; 32];
        out.copy_from_slice(&hasher.finalize());
        let resume = DigestResume {
            content: content.clone(),
            states,
        };
        (Self(out), Some(resume), bytes.len() - kept * RESUME_STEP)
    }
}

/// How far apart the states kept for resuming a file's digest are
/// ([`DigestResume`]).
const RESUME_STEP: usize = 16 << 10;

/// The SHA-256 states part way through one version of a file, every 16 KiB, with
/// that version: what [`FileDigest::of_resumable`] resumes the next version's digest
/// from.
#[derive(Clone)]
pub struct DigestResume {
    content: Arc<str>,
    /// The state after the first `(i + 1) * RESUME_STEP` bytes.
    states: Vec<Sha256>,
}

impl fmt::Debug for DigestResume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DigestResume")
            .field("bytes", &self.content.len())
            .field("states", &self.states.len())
            .finish()
    }
}

impl fmt::Debug for FileDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FileDigest({})", hex(&self.0[..6]))
    }
}

/// `haproxy.cfg` with its digest already computed, so a renderer can hash it (the
/// largest file) while the other files are still rendering; see
/// [`RenderedConfig::from_hashed_main`]. Cloning copies the digest, so a renderer
/// can keep a file it may hand out again unchanged.
#[derive(Clone)]
pub struct HashedMain {
    main: Arc<str>,
    digest: FileDigest,
}

impl HashedMain {
    /// Hashes `main` as the first file of a render.
    pub fn new(main: impl Into<Arc<str>>) -> Self {
        let main = main.into();
        let digest = FileDigest::of(&main);
        Self { main, digest }
    }

    /// The text of `haproxy.cfg`.
    pub fn text(&self) -> &str {
        &self.main
    }
}

impl fmt::Debug for HashedMain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HashedMain")
            .field("main_bytes", &self.main.len())
            .finish()
    }
}

/// Adds one file to a render's hash: its path relative to the config directory,
/// length first (so no two different layouts hash alike), then the digest of its
/// content. The path is written in its parts, as `<dir>/<name>`, without building it.
fn hash_entry(hasher: &mut Sha256, kind: FileKind, name: &str, digest: &FileDigest) {
    match kind.directory() {
        None => {
            let path = b"haproxy.cfg";
            hasher.update((path.len() as u64).to_le_bytes());
            hasher.update(path);
        }
        Some(dir) => {
            let length = ((dir.len() + 1 + name.len()) as u64).to_le_bytes();
            // One update for an entry that fits a small buffer (nearly all do): the
            // hasher's cost per call shows at 10,000 files.
            let mut entry = [0u8; 256];
            let size = length.len() + dir.len() + 1 + name.len() + digest.0.len();
            if size <= entry.len() {
                let mut at = 0;
                for part in [
                    &length[..],
                    dir.as_bytes(),
                    b"/",
                    name.as_bytes(),
                    &digest.0,
                ] {
                    entry[at..at + part.len()].copy_from_slice(part);
                    at += part.len();
                }
                hasher.update(&entry[..size]);
                return;
            }
            hasher.update(length);
            hasher.update(dir.as_bytes());
            hasher.update(b"/");
            hasher.update(name.as_bytes());
        }
    }
    hasher.update(digest.0);
}

/// The content hash of earlier versions of hapwright (SHA-256 over each file's path
/// and whole content, both length-prefixed), kept to recognise what an earlier
/// version deployed ([`RenderedConfig::legacy_hash`]).
fn legacy_hash(config: &RenderedConfig) -> ContentHash {
    let mut hasher = Sha256::new();
    for (file, content) in config.iter() {
        for part in [file.relative_path().as_bytes(), content.as_bytes()] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
    }
    let mut hash = ContentHash::default();
    hash.0.copy_from_slice(&hasher.finalize());
    hash
}

impl RenderedConfig {
    /// Assembles a render and computes its hash. The hash covers every file's kind,
    /// name and bytes in a fixed order, so the same inputs always hash the same: it
    /// is the SHA-256 over, for each file in [`Self::iter`] order, the length of its
    /// path relative to the config directory (8 bytes, little-endian), the path,
    /// and the SHA-256 of its content ([`FileDigest`]).
    pub fn new(
        main: impl Into<Arc<str>>,
        maps: BTreeMap<String, Arc<str>>,
        files: BTreeMap<String, Arc<str>>,
        certificates: BTreeMap<String, Arc<str>>,
        source_map: SourceMap,
    ) -> Self {
        Self::from_hashed_main(HashedMain::new(main), maps, files, certificates, source_map)
    }

    /// A render of `haproxy.cfg` alone, with no maps, files, certificates or source
    /// map: what most tests and benchmarks need, without four empty arguments.
    pub fn main_only(main: impl Into<Arc<str>>) -> Self {
        Self::builder(main).build()
    }

    /// Starts a render of `main` to which maps, files and certificates are added one
    /// at a time; [`RenderedConfigBuilder::build`] hashes it as [`RenderedConfig::new`]
    /// does. Meant for tests and tools that assemble a render by hand.
    pub fn builder(main: impl Into<Arc<str>>) -> RenderedConfigBuilder {
        RenderedConfigBuilder {
            config: Self {
                main: main.into(),
                maps: FileGroup::default(),
                files: FileGroup::default(),
                certificates: FileGroup::default(),
                hash: ContentHash::default(),
                source_map: Arc::default(),
            },
        }
    }

    /// [`RenderedConfig::new`] with `haproxy.cfg` already hashed: the same config and
    /// the same hash.
    pub fn from_hashed_main(
        main: HashedMain,
        maps: BTreeMap<String, Arc<str>>,
        files: BTreeMap<String, Arc<str>>,
        certificates: BTreeMap<String, Arc<str>>,
        source_map: SourceMap,
    ) -> Self {
        Self::from_hashed_main_with(main, maps, files, certificates, source_map, |_| None)
    }

    /// [`RenderedConfig::from_hashed_main`], taking the digest of a file from `known`
    /// where it gives one (it must be the digest of that content: a renderer gives
    /// the digest it computed when it rendered the same allocation): the same config
    /// and the same hash.
    pub fn from_hashed_main_with(
        main: HashedMain,
        maps: BTreeMap<String, Arc<str>>,
        files: BTreeMap<String, Arc<str>>,
        certificates: BTreeMap<String, Arc<str>>,
        source_map: SourceMap,
        known: impl Fn(&Arc<str>) -> Option<FileDigest>,
    ) -> Self {
        Self::from_shared_groups(
            main,
            [maps, files, certificates].map(FileGroup::from),
            Arc::new(source_map),
            known,
        )
    }

    /// [`RenderedConfig::from_hashed_main_with`] from shared groups (maps, files,
    /// certificates) and source map, as [`RenderedConfig::groups`] and
    /// [`RenderedConfig::source_map_shared`] give them: a renderer hands a group
    /// that did not change to the next render as it is.
    pub fn from_shared_groups(
        main: HashedMain,
        groups: [FileGroup; 3],
        source_map: Arc<SourceMap>,
        known: impl Fn(&Arc<str>) -> Option<FileDigest>,
    ) -> Self {
        Self::assemble(main, groups, source_map, |_, _, content| {
            known(content).unwrap_or_else(|| FileDigest::of(content))
        })
    }

    /// [`RenderedConfig::from_shared_groups`] with the digest of every file of
    /// `groups` given, by kind and name, in `digests` (each the digest of that
    /// file's content): the same config and the same hash, with no digest looked
    /// up. A renderer keeps the digests of its last render's groups and updates
    /// them for the files that changed. A file `digests` does not name in its
    /// place is hashed here.
    pub fn from_digested_groups(
        main: HashedMain,
        groups: [FileGroup; 3],
        digests: &[imbl::OrdMap<String, FileDigest>; 3],
        source_map: Arc<SourceMap>,
    ) -> Self {
        // Each group's digests in step with its files, while they name them.
        let mut given = std::array::from_fn::<_, 3, _>(|slot| {
            (groups[slot].len() == digests[slot].len()).then(|| digests[slot].iter())
        });
        Self::assemble(
            main,
            groups,
            source_map,
            |slot, name, content| match given[slot].as_mut().and_then(Iterator::next) {
                Some((named, digest)) if named == name => *digest,
                _ => {
                    given[slot] = None;
                    FileDigest::of(content)
                }
            },
        )
    }

    /// A render of `main` and `groups` with its hash, taking each file's digest
    /// from `digest` (called in [`Self::iter`] order with the group's index, the
    /// name and the content).
    fn assemble(
        main: HashedMain,
        groups: [FileGroup; 3],
        source_map: Arc<SourceMap>,
        mut digest: impl FnMut(usize, &str, &Arc<str>) -> FileDigest,
    ) -> Self {
        let HashedMain {
            main,
            digest: main_digest,
        } = main;
        let [maps, files, certificates] = groups;
        let mut config = Self {
            main,
            maps,
            files,
            certificates,
            hash: ContentHash::default(),
            source_map,
        };
        let mut hasher = Sha256::new();
        hash_entry(&mut hasher, FileKind::Main, "haproxy.cfg", &main_digest);
        // `iter` order.
        for (slot, (kind, group)) in [
            (FileKind::Map, &config.maps),
            (FileKind::File, &config.files),
            (FileKind::Certificate, &config.certificates),
        ]
        .into_iter()
        .enumerate()
        {
            for (name, content) in group.iter() {
                hash_entry(&mut hasher, kind, name, &digest(slot, name, content));
            }
        }
        config.hash.0.copy_from_slice(&hasher.finalize());
        config
    }

    /// The content hash earlier versions of hapwright gave this render (SHA-256 over
    /// each file's length-prefixed path and whole content): how the Data Plane driver
    /// recognises, after an upgrade, the config an earlier version deployed by its
    /// version marker. Reads every file.
    pub fn legacy_hash(&self) -> ContentHash {
        legacy_hash(self)
    }

    /// The content of `haproxy.cfg`.
    pub fn main(&self) -> &Arc<str> {
        &self.main
    }

    /// The maps, files and certificates groups, shared ([`Self::from_shared_groups`]).
    pub fn groups(&self) -> [&FileGroup; 3] {
        [&self.maps, &self.files, &self.certificates]
    }

    /// The source map, shared ([`Self::from_shared_groups`]).
    pub fn source_map_shared(&self) -> &Arc<SourceMap> {
        &self.source_map
    }

    /// The rendered maps by name.
    pub fn maps(&self) -> &FileGroup {
        &self.maps
    }

    /// The rendered general files by name.
    pub fn files(&self) -> &FileGroup {
        &self.files
    }

    /// The rendered certificates by name.
    pub fn certificates(&self) -> &FileGroup {
        &self.certificates
    }

    /// The content hash.
    pub fn hash(&self) -> ContentHash {
        self.hash
    }

    /// The source map from rendered lines to template lines.
    pub fn source_map(&self) -> &SourceMap {
        &self.source_map
    }

    /// Every file, main config first, then maps, files and certificates by name.
    pub fn iter(&self) -> impl Iterator<Item = (RenderedFileRef, &Arc<str>)> + '_ {
        let main = std::iter::once((
            RenderedFileRef {
                kind: FileKind::Main,
                name: "haproxy.cfg".to_owned(),
            },
            &self.main,
        ));
        fn named(
            kind: FileKind,
            map: &FileGroup,
        ) -> impl Iterator<Item = (RenderedFileRef, &Arc<str>)> + '_ {
            map.iter().map(move |(name, content)| {
                (
                    RenderedFileRef {
                        kind,
                        name: name.clone(),
                    },
                    content,
                )
            })
        }
        main.chain(named(FileKind::Map, &self.maps))
            .chain(named(FileKind::File, &self.files))
            .chain(named(FileKind::Certificate, &self.certificates))
    }

    /// The content of one file.
    pub fn get(&self, file: &RenderedFileRef) -> Option<&Arc<str>> {
        match file.kind {
            FileKind::Main => Some(&self.main),
            FileKind::Map => self.maps.get(&file.name),
            FileKind::File => self.files.get(&file.name),
            FileKind::Certificate => self.certificates.get(&file.name),
        }
    }
}

/// A [`RenderedConfig`] assembled file by file (from [`RenderedConfig::builder`]), so
/// a test names only the files it cares about.
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct RenderedConfigBuilder {
    /// The files so far; its hash is computed by `build`.
    config: RenderedConfig,
}

impl RenderedConfigBuilder {
    /// Adds (or replaces) the map file `maps/<name>`.
    pub fn map(mut self, name: impl Into<String>, content: impl Into<Arc<str>>) -> Self {
        self.config.maps.insert(name.into(), content.into());
        self
    }

    /// Adds (or replaces) the general file `files/<name>`.
    pub fn file(mut self, name: impl Into<String>, content: impl Into<Arc<str>>) -> Self {
        self.config.files.insert(name.into(), content.into());
        self
    }

    /// Adds (or replaces) the certificate `certs/<name>`.
    pub fn certificate(mut self, name: impl Into<String>, content: impl Into<Arc<str>>) -> Self {
        self.config.certificates.insert(name.into(), content.into());
        self
    }

    /// Sets the source map (default: empty).
    pub fn source_map(mut self, source_map: SourceMap) -> Self {
        self.config.source_map = Arc::new(source_map);
        self
    }

    /// Hashes the files and returns the render.
    pub fn build(self) -> RenderedConfig {
        let RenderedConfig {
            main,
            maps,
            files,
            certificates,
            source_map,
            ..
        } = self.config;
        RenderedConfig::from_shared_groups(
            HashedMain::new(main),
            [maps, files, certificates],
            source_map,
            |_| None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(main: &str, map: &str) -> RenderedConfig {
        RenderedConfig::builder(main).map("hosts.map", map).build()
    }

    #[test]
    fn hash_is_deterministic_and_covers_every_file() {
        let a = config("global\n", "a b\n");
        assert_eq!(a.hash(), config("global\n", "a b\n").hash());
        assert_ne!(a.hash(), config("global\n", "a c\n").hash());
        // Moving bytes between files changes the hash.
        assert_ne!(config("ab", "c").hash(), config("a", "bc").hash());
        assert_eq!(a.hash().to_string().len(), 64);
        assert_eq!(a.hash().short().len(), 12);
        assert!(a.hash().to_string().starts_with(&a.hash().short()));
        assert_eq!(
            ContentHash::of(b"").to_string(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn a_pre_hashed_main_gives_the_same_config_and_hash() {
        let a = config("global\n", "a b\n");
        let b = RenderedConfig::from_hashed_main(
            HashedMain::new("global\n"),
            a.maps().clone().into_iter().collect(),
            BTreeMap::new(),
            BTreeMap::new(),
            SourceMap::default(),
        );
        assert_eq!(a, b);
        assert_eq!(a.hash(), b.hash());
        // The formula is pinned (SHA-256 over each file's length-prefixed path and
        // the SHA-256 of its content, as computed independently): the Data Plane
        // driver recognises what runs by its version marker after a restart.
        assert_eq!(
            a.hash().to_string(),
            "3a749ff459c82741751f03b1e952d46b0eed821ccc9ab548587f78da67bf9353"
        );
        // And the earlier formula (SHA-256 over length-prefixed path and content),
        // by which it recognises what an earlier version deployed.
        assert_eq!(
            a.legacy_hash().to_string(),
            "2e090460d2a5bf3c683c3de92a352f42a0ad35b1b9f994ce1473d19ac1ebdf18"
        );
    }

    #[test]
    fn given_digests_give_the_same_hash_and_wrong_ones_are_not_used() {
        let config = RenderedConfig::builder("global\n")
            .map("a.map", "a b\n")
            .map("b.map", "c d\n")
            .certificate("x.pem", "x")
            .build();
        let groups = config.groups().map(FileGroup::clone);
        let digests = |group: &FileGroup| -> imbl::OrdMap<String, FileDigest> {
            group
                .iter()
                .map(|(name, content)| (name.clone(), FileDigest::of(content)))
                .collect()
        };
        let right = groups.each_ref().map(digests);
        let built = |given: &[imbl::OrdMap<String, FileDigest>; 3]| {
            RenderedConfig::from_digested_groups(
                HashedMain::new("global\n"),
                groups.clone(),
                given,
                Arc::default(),
            )
        };
        assert_eq!(built(&right), config);
        // A digest missing, one too many, or one under another name: those files
        // are hashed from their content, and the hash is the same.
        let mut missing = right.clone();
        missing[0].remove("a.map");
        let mut extra = right.clone();
        extra[2].insert("y.pem".to_owned(), FileDigest::of("y"));
        let mut renamed = right.clone();
        let digest = renamed[0].remove("b.map").unwrap();
        renamed[0].insert("c.map".to_owned(), digest);
        for given in [missing, extra, renamed, Default::default()] {
            assert_eq!(built(&given).hash(), config.hash());
        }
    }

    #[test]
    fn single_file_hash_matches_sha256sum() {
        // printf 'hello\n' | sha256sum
        assert_eq!(
            ContentHash::of(b"hello\n").to_string(),
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
    }

    #[test]
    fn paths_and_source_map_lookup() {
        let file = RenderedFileRef {
            kind: FileKind::Map,
            name: "hosts.map".into(),
        };
        assert_eq!(file.relative_path(), "maps/hosts.map");
        assert_eq!(FileKind::Main.relative_path("x"), "haproxy.cfg");
        let mut map = SourceMap::default();
        let origin = LineOrigin {
            template: "maps/hosts.map".into(),
            line: 3,
        };
        map.insert(file.clone(), vec![None, Some(origin.clone())]);
        assert_eq!(map.origin(&file, 2), Some(&origin));
        assert_eq!(map.origin(&file, 1), None);
        assert_eq!(map.origin(&file, 0), None);
        assert_eq!(map.origin_by_path("maps/hosts.map", 2), Some(&origin));
    }

    #[test]
    fn debug_never_prints_contents() {
        let config = RenderedConfig::builder("x")
            .certificate("a.pem", "-----BEGIN PRIVATE KEY-----")
            .build();
        assert!(!format!("{config:?}").contains("PRIVATE"));
    }

    /// One edit of a file between versions, for the resumable digest's test.
    #[derive(Clone, Debug)]
    enum Edit {
        /// Bytes put in at a fraction of the length.
        Insert(f64, String),
        /// A stretch of bytes from a fraction of the length taken out.
        Remove(f64, usize),
        /// The file cut at a fraction of its length.
        Truncate(f64),
        /// The file written afresh.
        Replace(usize),
    }

    fn apply(text: &str, edit: &Edit, version: usize) -> String {
        let at = |fraction: f64| ((text.len() as f64) * fraction) as usize;
        match edit {
            Edit::Insert(fraction, bytes) => {
                let at = at(*fraction);
                format!("{}{bytes}{}", &text[..at], &text[at..])
            }
            Edit::Remove(fraction, length) => {
                let start = at(*fraction);
                let end = (start + length).min(text.len());
                format!("{}{}", &text[..start], &text[end..])
            }
            Edit::Truncate(fraction) => text[..at(*fraction)].to_owned(),
            Edit::Replace(lines) => (0..*lines)
                .map(|line| format!("host-{version}-{line}.example.test backend-{line}\n"))
                .collect(),
        }
    }

    fn edit() -> impl proptest::strategy::Strategy<Value = Edit> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0.0..=1.0f64, "[a-z .\n]{0,3000}").prop_map(|(f, s)| Edit::Insert(f, s)),
            // Near the end, as a new Ingress's lines land.
            3 => (0.9..=1.0f64, "[a-z .\n]{1,80}").prop_map(|(f, s)| Edit::Insert(f, s)),
            3 => (0.0..=1.0f64, 0usize..40_000).prop_map(|(f, n)| Edit::Remove(f, n)),
            1 => (0.0..=1.0f64).prop_map(Edit::Truncate),
            1 => (0usize..3_000).prop_map(Edit::Replace),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Each version's digest resumed from the states of the version before it
        /// is the digest of its whole content, whatever changed where (and the
        /// states then kept are for that version).
        #[test]
        fn a_resumed_digest_is_the_digest_of_the_whole_content(
            lines in 0usize..4_000,
            edits in proptest::collection::vec(edit(), 1..12),
        ) {
            let mut text = apply("", &Edit::Replace(lines), 0);
            let mut resume: Option<DigestResume> = None;
            for (version, edit) in edits.iter().enumerate() {
                let content: Arc<str> = Arc::from(text.as_str());
                let (digest, next) = FileDigest::of_resumable(&content, resume.as_ref());
                proptest::prop_assert_eq!(digest, FileDigest::of(&content));
                proptest::prop_assert_eq!(next.is_some(), content.len() >= 2 * RESUME_STEP);
                if let Some(next) = &next {
                    proptest::prop_assert_eq!(next.states.len(), content.len() / RESUME_STEP);
                }
                // A resume kept from an unrelated file is only compared, never trusted.
                if version % 5 == 4 {
                    let other: Arc<str> = Arc::from(apply("", &Edit::Replace(lines + 7), 99));
                    resume = FileDigest::of_resumable(&other, None).1.or(next);
                } else {
                    resume = next;
                }
                text = apply(&text, edit, version + 1);
                while !text.is_char_boundary(text.len()) {
                    text.pop();
                }
            }
        }
    }

    #[test]
    fn a_file_that_gains_a_line_at_its_end_hashes_only_its_last_stretch() {
        let text = apply("", &Edit::Replace(4_000), 0);
        let content: Arc<str> = Arc::from(text.as_str());
        let (_, resume) = FileDigest::of_resumable(&content, None);
        let resume = resume.expect("a file of 4,000 lines keeps states");
        let grown: Arc<str> = Arc::from(format!("{text}new.example.test backend-new\n"));
        let (digest, next, hashed) = FileDigest::resumed(&grown, Some(&resume));
        assert_eq!(digest, FileDigest::of(&grown));
        assert!(next.is_some());
        assert!(
            hashed <= RESUME_STEP + 40,
            "hashed {hashed} of {} bytes",
            grown.len()
        );
        // A line changed at its start: all of it again.
        let changed: Arc<str> = Arc::from(format!("x{}", &text[1..]));
        let (digest, _, hashed) = FileDigest::resumed(&changed, Some(&resume));
        assert_eq!(digest, FileDigest::of(&changed));
        assert_eq!(hashed, changed.len());
    }
}
