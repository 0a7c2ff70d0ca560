//! The `files` source end to end: real files in temp directories, real notify
//! watching, a real kernel and bus. Every wait is bounded by a timeout around a
//! receive from a bus subscription; absence of an event is proven by ordering (a
//! later sentinel change arrives first), never by sleeping.

mod common;

use common::Harness;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::config::{ByteSize, Duration as ConfigDuration};
use hapwright_eventbus::model::{
    FieldPath, ObjectKey, ResourceChange, ResourceSnapshot, StoredObject,
};
use hapwright_eventbus::{EventPayload, HealthState};
use hapwright_watchers::FilesSource;
use hapwright_watchers::config::{FilesConfig, WatchedResource};
use hapwright_watchers::files::{ScanMode, Scanner};
use hapwright_watchers::manifest::Filter;
use hapwright_watchers::yaml::Limits;

const WAIT: Duration = Duration::from_secs(10);

impl Harness {
    fn start(source: FilesSource) -> Self {
        Self::source(source, WAIT)
    }

    /// The next `ResourceIndexUpdated`, skipping other events.
    async fn update(&mut self) -> (Arc<ResourceSnapshot>, Arc<ResourceChange>) {
        loop {
            if let EventPayload::ResourceIndexUpdated(update) = self.next().await {
                return (update.snapshot, update.change);
            }
        }
    }

    /// Waits for a health change of the source matching `state`; returns the reason.
    async fn health(&mut self, state: HealthState) -> Option<String> {
        loop {
            if let EventPayload::ComponentHealthChanged(changed) = self.next().await
                && changed.health.state == state
            {
                return changed.health.reason;
            }
        }
    }

    /// The source's health as the kernel's table has it now.
    fn current_health(&self) -> HealthState {
        self.kernel
            .as_ref()
            .unwrap()
            .health()
            .get("source/services")
            .or_else(|| {
                self.kernel
                    .as_ref()
                    .unwrap()
                    .health()
                    .get("source/endpoints")
            })
            .expect("the source is registered")
            .state
    }

    async fn sync_complete(&mut self) {
        loop {
            if let EventPayload::ResourceSyncComplete(_) = self.next().await {
                return;
            }
        }
    }

    /// Initial update, sync complete and `Healthy`, in that order.
    async fn synced(&mut self) -> (Arc<ResourceSnapshot>, Arc<ResourceChange>) {
        let update = self.update().await;
        self.sync_complete().await;
        update
    }
}

fn files_config(path: &Path) -> FilesConfig {
    let mut config = FilesConfig::new(path);
    config.settle = ConfigDuration::from_millis(30);
    config
}

fn source(path: &Path) -> FilesSource {
    FilesSource::from_parts(
        "services",
        &files_config(path),
        Filter::default(),
        hapwright_watchers::config::default_index_by(),
    )
}

fn service(name: &str, port: u32) -> String {
    format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n  port: {port}\n")
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("default", name)
}

fn port(snapshot: &ResourceSnapshot, name: &str) -> Option<u64> {
    snapshot
        .get_by_key(&key(name))
        .and_then(|o| o.parse()["spec"]["port"].as_u64())
}

fn write(dir: &Path, name: &str, content: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path
}

#[tokio::test]
async fn initial_sync_reads_every_format_and_ends_with_sync_complete() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a.yaml",
        &format!("{}---\n{}", service("a", 1), service("b", 2)),
    );
    write(
        dir.path(),
        "b.json",
        r#"{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "c", "namespace": "prod"}}]}"#,
    );
    write(dir.path(), "c.yml", &service("d", 4));
    write(dir.path(), ".hidden.yaml", &service("hidden", 5));
    write(dir.path(), "notes.txt", &service("txt", 6));
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    write(
        &dir.path().join("sub"),
        "nested.yaml",
        &service("nested", 7),
    );

    let mut h = Harness::start(source(dir.path()));
    let (snapshot, change) = h.update().await;
    let keys: Vec<String> = snapshot.iter().map(|(k, _)| k.to_string()).collect();
    assert_eq!(keys, ["default/a", "default/b", "default/d", "prod/c"]);
    assert_eq!(change.added.len(), 4);
    h.sync_complete().await;
    assert_eq!(h.current_health(), HealthState::Healthy);
    h.stop().await;
}

/// The set-up most tests share: a directory holding `a.yaml` (Service `a`, port 1),
/// the source started on it, and its initial update and sync complete read. Returns
/// the directory (deleted on drop), the path of `a.yaml` and the harness.
async fn synced_with_a() -> (tempfile::TempDir, PathBuf, Harness) {
    let dir = tempfile::tempdir().unwrap();
    let a = write(dir.path(), "a.yaml", &service("a", 1));
    let mut h = Harness::start(source(dir.path()));
    h.synced().await;
    (dir, a, h)
}

#[tokio::test]
async fn files_added_modified_and_deleted() {
    let (dir, _, mut h) = synced_with_a().await;

    write(dir.path(), "b.yaml", &service("b", 2));
    let (snapshot, change) = h.update().await;
    assert_eq!(change.added, [key("b")]);
    assert_eq!(snapshot.len(), 2);

    write(dir.path(), "a.yaml", &service("a", 10));
    let (snapshot, change) = h.update().await;
    assert_eq!(change.modified, [key("a")]);
    assert_eq!(port(&snapshot, "a"), Some(10));

    std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
    let (snapshot, change) = h.update().await;
    assert_eq!(change.removed, [key("b")]);
    assert_eq!(snapshot.len(), 1);
    h.stop().await;
}

#[tokio::test]
async fn a_bad_file_keeps_its_objects_and_leaves_others_alone_until_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(dir.path(), "a.yaml", &service("a", 1));
    write(dir.path(), "b.yaml", &service("b", 2));
    let mut h = Harness::start(source(dir.path()));
    h.synced().await;
    assert_eq!(h.current_health(), HealthState::Healthy);

    write(dir.path(), "a.yaml", "metadata:\n  name: a\nspec: [\n");
    let reason = h.health(HealthState::Unhealthy).await.unwrap();
    let expected = format!("{}:3:7: unclosed bracket", a.display());
    assert!(reason.starts_with(&expected), "{reason}");

    // Another file still updates, and a's last good object is still there.
    write(dir.path(), "b.yaml", &service("b", 20));
    let (snapshot, change) = h.update().await;
    assert_eq!(change.modified, [key("b")]);
    assert_eq!(port(&snapshot, "a"), Some(1));

    write(dir.path(), "a.yaml", &service("a", 100));
    let (snapshot, change) = h.update().await;
    assert_eq!(change.modified, [key("a")]);
    assert_eq!(port(&snapshot, "a"), Some(100));
    assert_eq!(h.current_health(), HealthState::Healthy);
    h.stop().await;
}

#[tokio::test]
async fn fixing_a_file_back_to_its_last_good_content_is_healthy_without_an_update() {
    let (dir, _, mut h) = synced_with_a().await;
    write(dir.path(), "a.yaml", "{ not yaml");
    h.health(HealthState::Unhealthy).await;
    write(dir.path(), "a.yaml", &service("a", 1));
    h.health(HealthState::Healthy).await;
    // Nothing was published for the round trip: the next update is this sentinel.
    write(dir.path(), "z.yaml", &service("z", 9));
    let (_, change) = h.update().await;
    assert_eq!(change.added, [key("z")]);
    h.stop().await;
}

#[tokio::test]
async fn the_same_object_in_two_files_resolves_by_file_name() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "10-first.yaml", &service("dup", 1));
    write(dir.path(), "20-second.yaml", &service("dup", 2));
    let mut h = Harness::start(source(dir.path()));
    let (snapshot, _) = h.synced().await;
    assert_eq!(port(&snapshot, "dup"), Some(1));

    std::fs::remove_file(dir.path().join("10-first.yaml")).unwrap();
    let (snapshot, change) = h.update().await;
    assert_eq!(change.modified, [key("dup")]);
    assert_eq!(port(&snapshot, "dup"), Some(2));
    h.stop().await;
}

#[test]
fn duplicate_objects_warn_naming_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let first = write(dir.path(), "a.yaml", &service("dup", 1));
    let second = write(dir.path(), "b.yaml", &service("dup", 2));
    let mut scanner = scanner(dir.path());
    let report = scanner.scan(ScanMode::Full);
    assert_eq!(report.warnings.len(), 1);
    let warning = report.warnings[0].to_string();
    assert!(warning.contains(&first.display().to_string()), "{warning}");
    assert!(warning.contains(&second.display().to_string()), "{warning}");
    assert_eq!(port(scanner.snapshot(), "dup"), Some(1));
}

fn scanner(path: &Path) -> Scanner {
    Scanner::new(
        "services",
        &files_config(path),
        Filter::default(),
        hapwright_watchers::config::default_index_by(),
        Limits::default(),
    )
}

#[test]
fn rescans_without_changes_report_nothing() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &service("a", 1));
    let mut scanner = scanner(dir.path());
    assert_eq!(scanner.scan(ScanMode::Full).change.added, [key("a")]);
    assert!(scanner.scan(ScanMode::Full).change.is_empty());
    assert!(scanner.scan(ScanMode::Quick).change.is_empty());
    // A full rescan notices a change even when size and mtime look unchanged.
    let path = dir.path().join("a.yaml");
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    std::fs::write(&path, service("a", 2)).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    assert_eq!(scanner.scan(ScanMode::Full).change.modified, [key("a")]);
}

#[tokio::test]
async fn touching_a_file_without_changing_it_publishes_nothing() {
    let (dir, a, mut h) = synced_with_a().await;
    std::fs::File::options()
        .write(true)
        .open(&a)
        .unwrap()
        .set_modified(std::time::SystemTime::now() + Duration::from_secs(5))
        .unwrap();
    write(dir.path(), "a.yaml", &service("a", 1));
    write(dir.path(), "z.yaml", &service("z", 9));
    let (_, change) = h.update().await;
    assert_eq!(change.added, [key("z")]);
    assert!(change.modified.is_empty());
    h.stop().await;
}

#[tokio::test]
async fn a_missing_directory_is_unhealthy_until_it_appears() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("resources");
    let mut h = Harness::start(source(&dir));
    let reason = h.health(HealthState::Unhealthy).await.unwrap();
    assert!(reason.contains("does not exist"), "{reason}");

    std::fs::create_dir(&dir).unwrap();
    write(&dir, "a.yaml", &service("a", 1));
    let (snapshot, _) = h.update().await;
    if snapshot.is_empty() {
        // The directory was listed before the file landed; the file follows.
        h.sync_complete().await;
        let (snapshot, change) = h.update().await;
        assert_eq!(change.added, [key("a")]);
        assert_eq!(snapshot.len(), 1);
    } else {
        assert_eq!(snapshot.len(), 1);
        h.sync_complete().await;
    }
    assert_eq!(h.current_health(), HealthState::Healthy);
    h.stop().await;
}

#[tokio::test]
async fn a_deleted_and_recreated_directory_keeps_objects_meanwhile() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("resources");
    std::fs::create_dir(&dir).unwrap();
    write(&dir, "a.yaml", &service("a", 1));
    let mut h = Harness::start(source(&dir));
    h.synced().await;

    std::fs::remove_dir_all(&dir).unwrap();
    let reason = h.health(HealthState::Unhealthy).await.unwrap();
    assert!(reason.contains("does not exist"), "{reason}");

    // Recreate under a temporary name and move it in, so it appears complete.
    let staging = parent.path().join("staging");
    std::fs::create_dir(&staging).unwrap();
    write(&staging, "a.yaml", &service("a", 2));
    std::fs::rename(&staging, &dir).unwrap();
    let (snapshot, change) = h.update().await;
    assert_eq!(
        change.modified,
        [key("a")],
        "objects were kept while the directory was gone"
    );
    assert_eq!(port(&snapshot, "a"), Some(2));
    assert_eq!(h.current_health(), HealthState::Healthy);

    // The new directory is watched.
    write(&dir, "b.yaml", &service("b", 3));
    let (_, change) = h.update().await;
    assert_eq!(change.added, [key("b")]);
    h.stop().await;
}

/// Replays the kubelet's atomic writer: a new timestamped directory, a `..data_tmp`
/// symlink to it renamed over `..data`, the old directory removed. User-visible files
/// are symlinks through `..data`.
#[cfg(unix)]
#[tokio::test]
async fn configmap_symlink_swaps_are_seen_every_time() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path();
    let swap = |generation: u32, content: &str| {
        let data_dir = format!("..2026_01_01_00_00_0{generation}");
        std::fs::create_dir(mount.join(&data_dir)).unwrap();
        std::fs::write(mount.join(&data_dir).join("services.yaml"), content).unwrap();
        symlink(&data_dir, mount.join("..data_tmp")).unwrap();
        std::fs::rename(mount.join("..data_tmp"), mount.join("..data")).unwrap();
        if generation > 0 {
            let old = format!("..2026_01_01_00_00_0{}", generation - 1);
            std::fs::remove_dir_all(mount.join(old)).unwrap();
        }
    };
    swap(0, &service("web", 1));
    symlink("..data/services.yaml", mount.join("services.yaml")).unwrap();

    let mut h = Harness::start(source(mount));
    let (snapshot, _) = h.synced().await;
    assert_eq!(port(&snapshot, "web"), Some(1));

    swap(1, &service("web", 2));
    let (snapshot, change) = h.update().await;
    assert_eq!(change.modified, [key("web")]);
    assert_eq!(port(&snapshot, "web"), Some(2));

    swap(2, &service("web", 3));
    let (snapshot, change) = h.update().await;
    assert_eq!(change.modified, [key("web")]);
    assert_eq!(port(&snapshot, "web"), Some(3));
    h.stop().await;
}

#[tokio::test]
async fn editor_save_patterns_publish_one_modification() {
    let (dir, a, mut h) = synced_with_a().await;

    // Write to a temp file and rename over the original (VS Code, Kate, sed -i).
    let tmp = write(dir.path(), ".a.yaml.tmp1234", &service("a", 2));
    std::fs::rename(&tmp, &a).unwrap();
    let (snapshot, change) = h.update().await;
    assert_eq!(
        *change,
        ResourceChange {
            modified: vec![key("a")],
            ..ResourceChange::default()
        }
    );
    assert_eq!(port(&snapshot, "a"), Some(2));

    // Vim with backupcopy=no: move the original away, write a new file, drop the backup.
    std::fs::rename(&a, dir.path().join("a.yaml~")).unwrap();
    write(dir.path(), "a.yaml", &service("a", 3));
    std::fs::remove_file(dir.path().join("a.yaml~")).unwrap();
    let (snapshot, change) = h.update().await;
    assert_eq!(
        *change,
        ResourceChange {
            modified: vec![key("a")],
            ..ResourceChange::default()
        }
    );
    assert_eq!(port(&snapshot, "a"), Some(3));

    // Truncate, then write in place.
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&a).unwrap();
        file.write_all(service("a", 4).as_bytes()).unwrap();
    }
    let (snapshot, change) = h.update().await;
    assert_eq!(
        *change,
        ResourceChange {
            modified: vec![key("a")],
            ..ResourceChange::default()
        }
    );
    assert_eq!(port(&snapshot, "a"), Some(4));
    h.stop().await;
}

#[tokio::test]
async fn ten_rapid_edits_coalesce_into_one_update() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &service("a", 0));
    let mut h = Harness::start(source(dir.path()));
    h.synced().await;
    for port in 1..=10 {
        write(dir.path(), "a.yaml", &service("a", port));
    }
    let (snapshot, change) = h.update().await;
    assert_eq!(change.modified, [key("a")]);
    assert_eq!(
        port(&snapshot, "a"),
        Some(10),
        "the first update already has the last edit"
    );
    write(dir.path(), "z.yaml", &service("z", 1));
    let (_, change) = h.update().await;
    assert_eq!(
        change.added,
        [key("z")],
        "no intermediate updates were published"
    );
    h.stop().await;
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn an_unreadable_file_keeps_its_objects_until_readable() {
    let (dir, a, mut h) = synced_with_a().await;
    // Reading /proc/self/mem at offset 0 fails (EIO) even for root, unlike chmod 000.
    std::fs::remove_file(&a).unwrap();
    std::os::unix::fs::symlink("/proc/self/mem", &a).unwrap();
    let reason = h.health(HealthState::Unhealthy).await.unwrap();
    assert!(
        reason.starts_with(&format!("{}: cannot read file", a.display())),
        "{reason}"
    );

    std::fs::remove_file(&a).unwrap();
    write(dir.path(), "a.yaml", &service("a", 2));
    let (snapshot, change) = h.update().await;
    assert_eq!(
        change.modified,
        [key("a")],
        "the object was kept while unreadable"
    );
    assert_eq!(port(&snapshot, "a"), Some(2));
    assert_eq!(h.current_health(), HealthState::Healthy);
    h.stop().await;
}

#[tokio::test]
async fn invalid_utf8_is_located() {
    let (dir, _, mut h) = synced_with_a().await;
    let path = dir.path().join("a.yaml");
    std::fs::write(&path, b"metadata:\n  name: \xc3\x28\n").unwrap();
    let reason = h.health(HealthState::Unhealthy).await.unwrap();
    assert!(
        reason.starts_with(&format!("{}:2:9: invalid UTF-8", path.display())),
        "{reason}"
    );
    h.stop().await;
}

#[tokio::test]
async fn a_50_mb_file_is_rejected_by_the_size_limit() {
    let (dir, _, mut h) = synced_with_a().await;
    // Sparse: 50 MB long without writing 50 MB.
    let big = std::fs::File::create(dir.path().join("big.yaml")).unwrap();
    big.set_len(50 * 1024 * 1024).unwrap();
    drop(big);
    let reason = h.health(HealthState::Unhealthy).await.unwrap();
    assert!(
        reason.contains(
            "file is too large: 52428800 bytes, over the 10MiB limit (files.maxFileSize)"
        ),
        "{reason}"
    );
    h.stop().await;
}

#[test]
fn the_size_limit_is_configurable() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a.yaml",
        &format!("{}# {}\n", service("a", 1), "x".repeat(2000)),
    );
    let mut config = files_config(dir.path());
    config.max_file_size = ByteSize(1024);
    let mut scanner = Scanner::new(
        "s",
        &config,
        Filter::default(),
        hapwright_watchers::config::default_index_by(),
        Limits::default(),
    );
    scanner.scan(ScanMode::Full);
    let health = scanner.health();
    assert_eq!(health.state, HealthState::Unhealthy);
    let reason = health.reason.unwrap_or_default();
    assert!(reason.contains("over the 1KiB limit"), "{reason}");
    config.max_file_size = ByteSize(4096);
    let mut scanner = Scanner::new(
        "s",
        &config,
        Filter::default(),
        hapwright_watchers::config::default_index_by(),
        Limits::default(),
    );
    assert_eq!(scanner.scan(ScanMode::Full).change.added, [key("a")]);
}

#[tokio::test]
async fn deep_nesting_and_alias_bombs_are_rejected_by_budgets() {
    let (dir, _, mut h) = synced_with_a().await;

    let deep = format!(
        "metadata: {{name: a}}\nspec: {}{}\n",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    write(dir.path(), "a.yaml", &deep);
    let reason = h.health(HealthState::Unhealthy).await.unwrap();
    assert!(
        reason.contains("input rejected by parse limits"),
        "{reason}"
    );

    let mut bomb = String::from("metadata: {name: a}\nl0: &l0 [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..10 {
        let p = level - 1;
        bomb.push_str(&format!("l{level}: &l{level} [*l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}]\n"));
    }
    write(dir.path(), "a.yaml", &bomb);
    // Still unhealthy, now for the alias bomb; the reason changes.
    let reason = h.health(HealthState::Unhealthy).await.unwrap();
    assert!(reason.contains("alias bomb"), "{reason}");

    write(dir.path(), "z.yaml", &service("z", 1));
    let (snapshot, change) = h.update().await;
    assert_eq!(change.added, [key("z")]);
    assert_eq!(
        port(&snapshot, "a"),
        Some(1),
        "the last good object survived both"
    );
    h.stop().await;
}

#[tokio::test]
async fn index_by_escaped_label_paths_and_several_keys() {
    let dir = tempfile::tempdir().unwrap();
    let slice = |ns: &str, name: &str, svc: Option<&str>| {
        let labels = svc.map_or(String::new(), |s| {
            format!("    kubernetes.io/service-name: {s}\n")
        });
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n{labels}    x: y\n---\n"
        )
    };
    write(
        dir.path(),
        "slices.yaml",
        &[
            slice("a", "web-1", Some("web")),
            slice("a", "web-2", Some("web")),
            slice("a", "api-1", Some("api")),
            slice("b", "web-1", Some("web")),
            slice("a", "orphan", None),
        ]
        .concat(),
    );
    write(dir.path(), "other.yaml", &service("svc", 1));
    let resource: WatchedResource = hapwright_watchers::yaml::parse_typed(
        &format!(
            "files: {{ path: '{}', settle: 30ms }}\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nindexBy: [metadata.namespace, 'metadata.labels.kubernetes\\.io/service-name']\nignoreFields: [metadata.labels.x]\n",
            dir.path().display()
        ),
        "t.yaml",
        &Limits::default(),
    )
    .unwrap();
    let mut h = Harness::start(FilesSource::new("endpoints", &resource).unwrap());
    let (snapshot, _) = h.synced().await;
    let names = |objects: Vec<&StoredObject>| -> Vec<String> {
        objects
            .iter()
            .map(|o| o.parse()["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(snapshot.len(), 5, "the Service was filtered out by kind");
    assert_eq!(
        names(snapshot.fetch(&["a", "web"]).unwrap()),
        ["web-1", "web-2"]
    );
    assert_eq!(names(snapshot.fetch(&["a"]).unwrap()).len(), 4);
    assert_eq!(names(snapshot.fetch::<&str>(&[]).unwrap()).len(), 5);
    assert_eq!(names(snapshot.fetch(&["a", ""]).unwrap()), ["orphan"]);
    assert_eq!(
        names(vec![snapshot.get(&["a", "api"]).unwrap().unwrap()]),
        ["api-1"]
    );
    assert!(
        snapshot.get(&["a", "web"]).is_err(),
        "two objects: not exactly one"
    );
    assert!(snapshot.get(&["b", "api"]).unwrap().is_none());
    let web = snapshot.get(&["b", "web"]).unwrap().unwrap().parse();
    assert!(
        web["metadata"]["labels"].get("x").is_none(),
        "ignoreFields stripped"
    );
    assert_eq!(
        snapshot.index_by()[1],
        FieldPath::parse(r"metadata.labels.kubernetes\.io/service-name").unwrap()
    );
    h.stop().await;
}

#[tokio::test]
async fn a_single_file_path_is_watched_through_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "only.yaml", &service("a", 1));
    write(dir.path(), "ignored.yaml", &service("b", 1));
    let mut h = Harness::start(source(&file));
    let (snapshot, _) = h.synced().await;
    assert_eq!(snapshot.len(), 1);
    let tmp = write(dir.path(), "only.yaml.new", &service("a", 2));
    std::fs::rename(tmp, &file).unwrap();
    let (snapshot, change) = h.update().await;
    assert_eq!(change.modified, [key("a")]);
    assert_eq!(port(&snapshot, "a"), Some(2));

    std::fs::remove_file(&file).unwrap();
    let reason = h.health(HealthState::Unhealthy).await.unwrap();
    assert!(reason.contains("does not exist"), "{reason}");
    h.stop().await;
}

#[test]
fn many_files_are_read_in_parallel_with_the_same_result() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..100 {
        write(
            dir.path(),
            &format!("f{i:03}.yaml"),
            &service(&format!("s{i:03}"), i),
        );
    }
    // Two files define the same object: the first in name order still wins.
    write(dir.path(), "f999.yaml", &service("s000", 999));
    let mut scanner = scanner(dir.path());
    let report = scanner.scan(ScanMode::Full);
    assert_eq!(report.change.added.len(), 100);
    assert_eq!(port(scanner.snapshot(), "s000"), Some(0));
    assert_eq!(report.warnings.len(), 1);
    for i in 0..50 {
        std::fs::remove_file(dir.path().join(format!("f{i:03}.yaml"))).unwrap();
    }
    let report = scanner.scan(ScanMode::Quick);
    assert_eq!(report.change.removed.len(), 49);
    assert_eq!(report.change.modified, [key("s000")]);
    assert_eq!(port(scanner.snapshot(), "s000"), Some(999));
}

/// A watched resource of `kind` read from `dir` (the same timing for every kind).
fn resource_of(dir: &Path, api_version: &str, kind: &str) -> WatchedResource {
    hapwright_watchers::yaml::parse_typed(
        &format!(
            "files: {{ path: '{}', settle: 30ms }}\napiVersion: {api_version}\nkind: {kind}\n",
            dir.display()
        ),
        "t.yaml",
        &Limits::default(),
    )
    .unwrap()
}

fn endpoint_slice(name: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  labels:\n    kubernetes.io/service-name: {name}\n"
    )
}

/// The next event, waiting at most [`WAIT`].
async fn next(events: &mut hapwright_eventbus::Subscription) -> Arc<hapwright_eventbus::Event> {
    tokio::time::timeout(WAIT, events.recv())
        .await
        .expect("timed out waiting for an event")
        .expect("bus closed")
}

/// Two sources of one directory (Services and EndpointSlices) share one watch and
/// scan: one write holding both kinds gives two updates published back to back (no
/// event between them), so the debouncer sees them together; each source keeps its
/// own health, both following the same bad file, and both stop cleanly.
#[tokio::test]
async fn sources_of_one_directory_share_one_scan_and_publish_together() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &service("a", 1));
    let sources = FilesSource::share_scans(vec![
        FilesSource::new("services", &resource_of(dir.path(), "v1", "Service")).unwrap(),
        FilesSource::new(
            "endpoints",
            &resource_of(dir.path(), "discovery.k8s.io/v1", "EndpointSlice"),
        )
        .unwrap(),
    ]);
    assert_eq!(sources.len(), 2);
    let (kernel, mut events) = common::start_together(
        sources,
        [
            hapwright_eventbus::EventKind::ResourceIndexUpdated,
            hapwright_eventbus::EventKind::ResourceSyncComplete,
            hapwright_eventbus::EventKind::ComponentHealthChanged,
        ],
    );
    let health = kernel.health();
    // The initial sync of both: two updates, then two sync-completes.
    let mut synced = Vec::new();
    while synced.len() < 2 {
        if let EventPayload::ResourceSyncComplete(sync) = &next(&mut events).await.payload {
            synced.push(sync.source.to_string());
        }
    }
    synced.sort();
    assert_eq!(synced, ["endpoints", "services"]);

    // One write with a Service and its EndpointSlice.
    write(
        dir.path(),
        "b.yaml",
        &format!("{}---\n{}", service("b", 2), endpoint_slice("b")),
    );
    let first = loop {
        let event = next(&mut events).await;
        if matches!(event.payload, EventPayload::ResourceIndexUpdated(_)) {
            break event;
        }
    };
    let second = next(&mut events).await;
    assert_eq!(second.id.0, first.id.0 + 1, "published back to back");
    let mut sources = Vec::new();
    for event in [&first, &second] {
        let EventPayload::ResourceIndexUpdated(update) = &event.payload else {
            panic!("expected the second update, got {:?}", event.payload);
        };
        assert_eq!(update.change.added, [key("b")], "{}", update.source);
        sources.push(update.source.to_string());
    }
    sources.sort();
    assert_eq!(sources, ["endpoints", "services"]);

    // A bad file: both sources report it, each under its own name.
    write(dir.path(), "c.yaml", "kind: [unclosed\n");
    let state = |name: &str| health.get(name).map(|h| (h.state, h.reason));
    let mut unhealthy = Vec::new();
    while unhealthy.len() < 2 {
        if let EventPayload::ComponentHealthChanged(changed) = &next(&mut events).await.payload
            && changed.health.state == HealthState::Unhealthy
        {
            assert!(
                changed
                    .health
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.contains("c.yaml")),
                "{changed:?}"
            );
            unhealthy.push(changed.component.to_string());
        }
    }
    unhealthy.sort();
    assert_eq!(unhealthy, ["source/endpoints", "source/services"]);
    std::fs::remove_file(dir.path().join("c.yaml")).unwrap();
    let mut healthy = Vec::new();
    while healthy.len() < 2 {
        if let EventPayload::ComponentHealthChanged(changed) = &next(&mut events).await.payload
            && changed.health.state == HealthState::Healthy
        {
            healthy.push(changed.component.to_string());
        }
    }
    assert_eq!(state("source/services").unwrap().0, HealthState::Healthy);
    assert_eq!(state("source/endpoints").unwrap().0, HealthState::Healthy);

    let report = kernel.shutdown(Duration::from_secs(5)).await;
    assert!(report.aborted.is_empty(), "{report:?}");
    assert_eq!(report.stopped.len(), 2, "{report:?}");
    for name in ["source/services", "source/endpoints"] {
        let (state, reason) = state(name).unwrap();
        assert_eq!(
            (state, reason.as_deref()),
            (HealthState::Exited, Some("stopped")),
            "{name}"
        );
    }
}

/// Sources of different directories, or of one directory with different timing,
/// keep their own scans.
#[test]
fn only_sources_of_one_path_and_timing_share_a_scan() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let alone = |dir: &Path, name: &str, settle: u64| {
        let mut config = files_config(dir);
        config.settle = ConfigDuration::from_millis(settle);
        FilesSource::from_parts(name, &config, Filter::default(), Vec::new())
    };
    let shared = |source: &FilesSource| format!("{source:?}").contains("shared: true");
    let sources = FilesSource::share_scans(vec![
        alone(a.path(), "one", 30),
        alone(b.path(), "two", 30),
        alone(a.path(), "three", 60),
        alone(b.path(), "four", 30),
    ]);
    let names: Vec<String> = sources
        .iter()
        .map(|s| hapwright_eventbus::Component::name(s).to_owned())
        .collect();
    assert_eq!(
        names,
        ["source/one", "source/two", "source/three", "source/four"]
    );
    let flags: Vec<bool> = sources.iter().map(shared).collect();
    assert_eq!(flags, [false, true, false, true]);
}

/// A source whose shared scan is run by another source ends with an error when that
/// scan stops while it is still running (here: the other source's kernel shuts
/// down), instead of reporting a health nobody updates any more.
#[tokio::test]
async fn a_member_whose_shared_scan_stops_ends_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &service("a", 1));
    let mut sources = FilesSource::share_scans(vec![
        FilesSource::new("services", &resource_of(dir.path(), "v1", "Service")).unwrap(),
        FilesSource::new(
            "endpoints",
            &resource_of(dir.path(), "discovery.k8s.io/v1", "EndpointSlice"),
        )
        .unwrap(),
    ]);
    let follower = sources.pop().unwrap();
    let leader = sources.pop().unwrap();
    // The services source runs first, alone in its kernel: it takes the scan.
    let mut first = Harness::start(leader);
    first.synced().await;
    // The endpoints source runs in a second kernel and follows that scan.
    let (second, mut events) = common::start_alone(
        follower,
        [hapwright_eventbus::EventKind::ComponentHealthChanged],
    );
    first.stop().await;
    let reason = loop {
        if let EventPayload::ComponentHealthChanged(changed) = &next(&mut events).await.payload
            && changed.health.state == HealthState::Exited
        {
            assert_eq!(changed.component.as_ref(), "source/endpoints");
            break changed.health.reason.clone().unwrap_or_default();
        }
    };
    assert!(
        reason.contains("failed") && reason.contains("shares with other sources stopped"),
        "{reason}"
    );
    let report = second.shutdown(Duration::from_secs(5)).await;
    assert!(report.aborted.is_empty(), "{report:?}");
}
