//! The config directory's files on a real filesystem: modes and groups, planted
//! symlinks, injected write failures, the state record, and the sweeps of leftovers
//! a killed controller leaves behind; and keys through real HAProxy reloads.

mod support;

#[path = "../../../tests/support/certs.rs"]
#[allow(dead_code)]
mod certs;

use hapwright_deployer::Driver;
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hapwright_deployer::component::validator::{SCRATCH_PREFIX, sweep_scratch};
use hapwright_deployer::config::Group;
use hapwright_deployer::haproxy::files::{
    ConfigDir, DeployRecord, Faults, FileModes, RECORD_FILE, RecordCheck, steps,
};
use hapwright_eventbus::model::{RenderedConfig, SourceMap};

fn rendered(main: &str, maps: &[(&str, &str)], certs: &[(&str, &str)]) -> RenderedConfig {
    let to_map = |entries: &[(&str, &str)]| {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Arc::<str>::from(*v)))
            .collect::<BTreeMap<_, _>>()
    };
    RenderedConfig::new(
        main,
        to_map(maps),
        BTreeMap::new(),
        to_map(certs),
        SourceMap::default(),
    )
}

fn v1() -> RenderedConfig {
    rendered(
        "global\n    maxconn 10\n",
        &[("hosts.map", "a.test be_a\n")],
        &[("site.pem", "KEY ONE\n")],
    )
}

fn v2() -> RenderedConfig {
    rendered(
        "global\n    maxconn 20\n",
        &[("hosts.map", "b.test be_b\n")],
        &[("site.pem", "KEY TWO\n")],
    )
}

/// A config directory without fault injection from the environment.
fn config_dir(path: &Path) -> ConfigDir {
    ConfigDir::new(path).with_faults(Faults::default())
}

fn mode(path: &Path) -> u32 {
    let meta = std::fs::symlink_metadata(path).unwrap();
    assert!(meta.is_file(), "{} is not a regular file", path.display());
    meta.permissions().mode() & 0o7777
}

/// Every hidden entry under the directory and its layout subdirectories except the
/// state record: temporary files that were left behind.
fn leftovers(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in [
        root.to_path_buf(),
        root.join("maps"),
        root.join("files"),
        root.join("certs"),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name != RECORD_FILE {
                out.push(dir.join(name));
            }
        }
    }
    out
}

#[test]
fn keys_are_private_after_write_and_restore_and_other_files_stay_readable() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = config_dir(tmp.path());
    // A restrictive umask must not change the modes: they are set explicitly.
    let old_umask = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    dir.write(&v1(), "m1", None).unwrap();
    rustix::process::umask(old_umask);
    assert_eq!(mode(&tmp.path().join("certs/site.pem")), 0o600);
    assert_eq!(mode(&tmp.path().join("maps/hosts.map")), 0o644);
    assert_eq!(mode(&tmp.path().join("haproxy.cfg")), 0o644);
    let dir_mode = |p: &str| std::fs::metadata(tmp.path().join(p)).unwrap().mode() & 0o7777;
    assert_eq!(dir_mode("certs"), 0o755, "HAProxy must reach the files");
    assert_eq!(dir_mode("maps"), 0o755);

    let good = dir.snapshot().unwrap();
    dir.write(&v2(), "m2", None).unwrap();
    dir.restore(&good).unwrap();
    assert_eq!(dir.snapshot().unwrap(), good);
    assert_eq!(mode(&tmp.path().join("certs/site.pem")), 0o600);
    assert_eq!(mode(&tmp.path().join("maps/hosts.map")), 0o644);
}

/// The first group in /etc/group other than root's, for a group given by name.
fn some_group() -> (String, u32) {
    let table = std::fs::read_to_string("/etc/group").unwrap();
    table
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            Some((fields.first()?.to_string(), fields.get(2)?.parse().ok()?))
        })
        .find(|(_, gid)| *gid != 0)
        .expect("a non-root group in /etc/group")
}

#[test]
fn the_configured_group_mode_applies_to_certificates_only() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: changing a file's group to any gid needs root");
        return;
    }
    let (name, gid) = some_group();
    let tmp = tempfile::tempdir().unwrap();
    let dir = config_dir(tmp.path()).with_modes(FileModes {
        cert_mode: 0o640,
        cert_group: Some(Group::Name(name)),
    });
    dir.write(&v1(), "m1", None).unwrap();
    let cert = tmp.path().join("certs/site.pem");
    assert_eq!(mode(&cert), 0o640);
    assert_eq!(std::fs::metadata(&cert).unwrap().gid(), gid);
    let map = tmp.path().join("maps/hosts.map");
    assert_eq!(mode(&map), 0o644);
    assert_ne!(std::fs::metadata(&map).unwrap().gid(), gid);

    // Restore uses the same modes; a numeric gid works without /etc/group.
    let good = dir.snapshot().unwrap();
    let dir = dir.with_modes(FileModes {
        cert_mode: 0o640,
        cert_group: Some(Group::Id(54321)),
    });
    dir.write(&v2(), "m2", None).unwrap();
    assert_eq!(std::fs::metadata(&cert).unwrap().gid(), 54321);
    dir.restore(&good).unwrap();
    assert_eq!(mode(&cert), 0o640);
    assert_eq!(std::fs::metadata(&cert).unwrap().gid(), 54321);
}

#[test]
fn an_unknown_group_name_fails_the_write_and_keeps_the_old_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = config_dir(tmp.path());
    dir.write(&v1(), "m1", None).unwrap();
    let before = dir.snapshot().unwrap();
    let error = dir
        .clone()
        .with_modes(FileModes {
            cert_mode: 0o640,
            cert_group: Some(Group::Name("no-such-group-hapwright".into())),
        })
        .write(&v2(), "m2", None)
        .unwrap_err();
    assert!(error.to_string().contains("certs/site.pem"), "{error}");
    assert!(
        error.to_string().contains("no-such-group-hapwright"),
        "{error}"
    );
    assert_eq!(
        dir.snapshot().unwrap().files["certs/site.pem"],
        before.files["certs/site.pem"]
    );
    assert!(leftovers(tmp.path()).is_empty());
}

#[test]
fn planted_symlinks_are_never_written_through() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    let root = tmp.path();
    for sub in ["maps", "certs"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    let plant = |link: PathBuf| std::os::unix::fs::symlink(&victim, link).unwrap();
    // The predictable names earlier versions used.
    plant(root.join(".haproxy.cfg.hapwright-tmp"));
    plant(root.join("maps/.hosts.map.hapwright-tmp"));
    plant(root.join("certs/.site.pem.hapwright-tmp"));
    // Names that look like the random ones (dangling links too).
    for (i, name) in ["aaaaaa", "AbC123", "zzzzzz", "000000"].iter().enumerate() {
        plant(root.join(format!("certs/.hapwright-tmp-{name}")));
        std::os::unix::fs::symlink(
            outside.path().join(format!("created-{i}")),
            root.join(format!("maps/.hapwright-tmp-{name}")),
        )
        .unwrap();
    }
    // The final path of the key itself.
    plant(root.join("certs/site.pem"));

    let dir = config_dir(root);
    dir.write(&v1(), "m1", None).unwrap();

    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert_eq!(mode(&victim), 0o644);
    let created: Vec<_> = std::fs::read_dir(outside.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(created, ["victim"], "nothing new appears outside");
    // The link at the final path was replaced by a private regular file.
    assert_eq!(mode(&root.join("certs/site.pem")), 0o600);
    assert_eq!(
        std::fs::read_to_string(root.join("certs/site.pem")).unwrap(),
        "KEY ONE\n"
    );

    // The sweep removes the planted links themselves, not their targets.
    let removed = dir.sweep().unwrap();
    assert_eq!(removed.len(), 11, "{removed:?}");
    assert!(leftovers(root).is_empty(), "{:?}", leftovers(root));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
}

#[test]
fn an_injected_write_failure_keeps_every_previous_file_and_leaves_no_temp_file() {
    let tmp = tempfile::tempdir().unwrap();
    config_dir(tmp.path()).write(&v1(), "m1", None).unwrap();
    let before = config_dir(tmp.path()).snapshot().unwrap();

    let faults = Faults::parse("fail-write=maps/hosts.map").unwrap();
    let dir = config_dir(tmp.path()).with_faults(faults);
    let error = dir.write(&v2(), "m2", None).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::StorageFull);
    let text = error.to_string();
    assert!(text.contains("No space left on device"), "{text}");
    assert!(text.contains("hosts.map"), "{text}");
    assert_eq!(dir.snapshot().unwrap(), before, "files are byte-identical");
    assert!(
        leftovers(tmp.path()).is_empty(),
        "{:?}",
        leftovers(tmp.path())
    );

    // haproxy.cfg fails after the side files were replaced: restoring the snapshot
    // brings back every byte, and the key keeps its mode.
    let dir = config_dir(tmp.path()).with_faults(Faults::parse("fail-write=haproxy.cfg").unwrap());
    dir.write(&v2(), "m2", None).unwrap_err();
    assert_eq!(
        dir.snapshot().unwrap().files["maps/hosts.map"],
        b"b.test be_b\n"
    );
    dir.restore(&before).unwrap();
    assert_eq!(dir.snapshot().unwrap(), before);
    assert_eq!(mode(&tmp.path().join("certs/site.pem")), 0o600);
    assert!(leftovers(tmp.path()).is_empty());

    // A failure while restoring is reported too.
    let dir = config_dir(tmp.path());
    dir.write(&v2(), "m2", None).unwrap();
    let failing = dir.with_faults(Faults::parse("fail-write=certs/site.pem").unwrap());
    let error = failing.restore(&before).unwrap_err();
    assert!(error.to_string().contains("No space left"), "{error}");
    assert!(leftovers(tmp.path()).is_empty());
}

#[test]
fn a_failed_rename_or_directory_creation_leaves_no_temporary_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = config_dir(tmp.path());
    dir.write(&v1(), "m1", None).unwrap();
    // A directory where the map goes: the rename over it fails.
    std::fs::remove_file(tmp.path().join("maps/hosts.map")).unwrap();
    std::fs::create_dir(tmp.path().join("maps/hosts.map")).unwrap();
    let error = dir.write(&v2(), "m2", None).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("cannot rename the temporary file to"),
        "{error}"
    );
    assert!(
        leftovers(tmp.path()).is_empty(),
        "{:?}",
        leftovers(tmp.path())
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("haproxy.cfg")).unwrap(),
        "global\n    setenv HAPWRIGHT_CONFIG_VERSION m1\n    maxconn 10\n"
    );

    // A file where the certs directory goes.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("certs"), "not a directory").unwrap();
    let error = config_dir(other.path())
        .write(&v1(), "m1", None)
        .unwrap_err();
    assert!(
        error.to_string().contains("certs"),
        "the error names the path: {error}"
    );
    assert!(!other.path().join("haproxy.cfg").exists());
    assert!(leftovers(other.path()).is_empty());
}

#[test]
fn write_removes_layout_files_the_new_render_does_not_have() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = config_dir(tmp.path());
    dir.write(&v1(), "m1", None).unwrap();
    // A stale file from a render before the controller restarted.
    std::fs::write(tmp.path().join("maps/old.map"), "x y\n").unwrap();
    let without_cert = rendered("global\n", &[("hosts.map", "c d\n")], &[]);
    dir.write(&without_cert, "m3", None).unwrap();
    let files: Vec<String> = dir.snapshot().unwrap().files.into_keys().collect();
    assert_eq!(files, ["haproxy.cfg", "maps/hosts.map"]);
}

/// A write replaces only the files whose content, mode or owner differ: an
/// unchanged certificate keeps its inode (no temporary file, fsync or rename), while
/// a changed one, and one whose mode or content was changed behind hapwright's back
/// or that is a hard link, is written anew.
#[test]
fn a_write_leaves_files_that_are_already_there_as_they_are() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = config_dir(tmp.path());
    let three = |a: &str, b: &str, c: &str| {
        rendered(
            "global\n",
            &[("hosts.map", "a.test be_a\n")],
            &[("a.pem", a), ("b.pem", b), ("c.pem", c)],
        )
    };
    dir.write(&three("A1\n", "B1\n", "C1\n"), "m1", None)
        .unwrap();
    let inode = |name: &str| std::fs::metadata(tmp.path().join(name)).unwrap().ino();
    let before: Vec<u64> = [
        "certs/a.pem",
        "certs/b.pem",
        "certs/c.pem",
        "maps/hosts.map",
    ]
    .iter()
    .map(|name| inode(name))
    .collect();
    // b.pem loses its private mode, c.pem gains a second link: both are rewritten
    // even though their content is what the render holds.
    std::fs::set_permissions(
        tmp.path().join("certs/b.pem"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let link = tmp.path().join("elsewhere");
    std::fs::hard_link(tmp.path().join("certs/c.pem"), &link).unwrap();

    dir.write(&three("A2\n", "B1\n", "C1\n"), "m2", None)
        .unwrap();
    assert_ne!(
        inode("certs/a.pem"),
        before[0],
        "a changed content is replaced"
    );
    assert_ne!(
        inode("certs/b.pem"),
        before[1],
        "a changed mode is replaced"
    );
    assert_eq!(mode(&tmp.path().join("certs/b.pem")), 0o600);
    assert_ne!(
        inode("certs/c.pem"),
        before[2],
        "a hard-linked file is replaced"
    );
    assert_eq!(
        inode("maps/hosts.map"),
        before[3],
        "an unchanged file stays"
    );
    assert_eq!(std::fs::read_to_string(&link).unwrap(), "C1\n");

    // Once more with nothing changed but the marker: only haproxy.cfg is new.
    let kept: Vec<u64> = ["certs/a.pem", "certs/b.pem", "certs/c.pem"]
        .iter()
        .map(|name| inode(name))
        .collect();
    dir.write(&three("A2\n", "B1\n", "C1\n"), "m3", None)
        .unwrap();
    assert_eq!(
        ["certs/a.pem", "certs/b.pem", "certs/c.pem"]
            .map(inode)
            .to_vec(),
        kept
    );
    assert!(
        std::fs::read_to_string(tmp.path().join("haproxy.cfg"))
            .unwrap()
            .contains("m3")
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("certs/a.pem")).unwrap(),
        "A2\n"
    );
    assert!(leftovers(tmp.path()).is_empty());
}

#[test]
fn restore_removes_files_the_snapshot_did_not_have() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = config_dir(tmp.path());
    let small = rendered("global\n", &[], &[]);
    dir.write(&small, "m0", None).unwrap();
    let good = dir.snapshot().unwrap();
    dir.write(&v1(), "m1", None).unwrap();
    dir.restore(&good).unwrap();
    assert_eq!(dir.snapshot().unwrap(), good);
    assert!(!tmp.path().join("certs/site.pem").exists());
}

#[test]
fn the_state_record_tells_a_finished_deployment_from_a_broken_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = config_dir(tmp.path());
    assert_eq!(dir.check_record().unwrap(), RecordCheck::Missing);
    dir.write(&v1(), "m1", None).unwrap();
    assert_eq!(dir.check_record().unwrap(), RecordCheck::Missing);
    dir.write_record(&DeployRecord::new(&v1(), "m1")).unwrap();
    match dir.check_record().unwrap() {
        RecordCheck::Consistent { marker, config } => {
            assert_eq!(marker, "m1");
            assert_eq!(config.hash(), v1().hash());
        }
        other => panic!("expected consistent, got {other:?}"),
    }
    let good = dir.snapshot().unwrap();
    let mismatch = |dir: &ConfigDir| match dir.check_record().unwrap() {
        RecordCheck::Mismatch { detail } => detail,
        other => panic!("expected a mismatch, got {other:?}"),
    };

    // Edited.
    std::fs::write(tmp.path().join("maps/hosts.map"), "evil be_x\n").unwrap();
    assert_eq!(
        mismatch(&dir),
        "maps/hosts.map differs from the state record"
    );
    dir.restore(&good).unwrap();
    assert!(matches!(
        dir.check_record().unwrap(),
        RecordCheck::Consistent { .. }
    ));

    // Added.
    std::fs::write(tmp.path().join("maps/extra.map"), "x y\n").unwrap();
    assert_eq!(mismatch(&dir), "maps/extra.map is not in the state record");
    dir.restore(&good).unwrap();

    // Removed.
    std::fs::remove_file(tmp.path().join("certs/site.pem")).unwrap();
    assert_eq!(
        mismatch(&dir),
        "certs/site.pem is in the state record but missing"
    );
    dir.restore(&good).unwrap();

    // A deployment that died after the side files: the record is the old one.
    let dir_failing =
        config_dir(tmp.path()).with_faults(Faults::parse("fail-write=haproxy.cfg").unwrap());
    dir_failing.write(&v2(), "m2", None).unwrap_err();
    assert_eq!(
        mismatch(&dir),
        "certs/site.pem differs from the state record"
    );
    dir.restore(&good).unwrap();

    // A record whose marker is not the one in haproxy.cfg.
    let mut record = DeployRecord::new(&v1(), "m1");
    record.marker = "other".to_owned();
    dir.write_record(&record).unwrap();
    assert_eq!(
        mismatch(&dir),
        "haproxy.cfg carries marker m1, the state record other"
    );

    // An unreadable record.
    std::fs::write(tmp.path().join(RECORD_FILE), "{ not json").unwrap();
    assert!(mismatch(&dir).starts_with(".hapwright-state.json is unreadable"));

    // The record is not a layout file: snapshots and restores leave it alone.
    assert!(!dir.snapshot().unwrap().files.contains_key(RECORD_FILE));
}

#[test]
fn writing_the_record_can_fail_and_keeps_the_previous_record() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = config_dir(tmp.path());
    dir.write(&v1(), "m1", None).unwrap();
    dir.write_record(&DeployRecord::new(&v1(), "m1")).unwrap();
    dir.write(&v2(), "m2", None).unwrap();
    let failing = dir
        .clone()
        .with_faults(Faults::parse(&format!("fail-write={RECORD_FILE}")).unwrap());
    let error = failing
        .write_record(&DeployRecord::new(&v2(), "m2"))
        .unwrap_err();
    assert!(error.to_string().contains("No space left"), "{error}");
    assert_eq!(dir.read_record().unwrap().unwrap().marker, "m1");
    assert!(matches!(
        dir.check_record().unwrap(),
        RecordCheck::Mismatch { .. }
    ));
    assert!(leftovers(tmp.path()).is_empty());
}

#[test]
fn a_pause_stops_the_write_between_side_files_and_haproxy_cfg() {
    let tmp = tempfile::tempdir().unwrap();
    config_dir(tmp.path()).write(&v1(), "m1", None).unwrap();
    let marker = tmp.path().join("paused");
    let faults = Faults::parse(&format!(
        "pause={}:{}",
        steps::AFTER_SIDE_FILES,
        marker.display()
    ))
    .unwrap();
    let dir = config_dir(tmp.path()).with_faults(faults);
    // The thread stays parked until the test process exits, as the controller
    // would stay until the test kills it.
    std::thread::spawn(move || dir.write(&v2(), "m2", None));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the pause was never reached");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "after-side-files"
    );
    let on_disk = config_dir(tmp.path()).snapshot().unwrap();
    assert_eq!(on_disk.files["maps/hosts.map"], b"b.test be_b\n");
    assert_eq!(on_disk.files["certs/site.pem"], b"KEY TWO\n");
    let (_, version) = config_dir(tmp.path()).read_rendered().unwrap().unwrap();
    assert_eq!(
        version.as_deref(),
        Some("m1"),
        "haproxy.cfg is not written yet"
    );
}

#[test]
fn sweep_removes_stale_temp_files_only() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = config_dir(tmp.path());
    dir.write(&v1(), "m1", None).unwrap();
    dir.write_record(&DeployRecord::new(&v1(), "m1")).unwrap();
    let stale = [
        ".hapwright-tmp-Xy12ab",
        "maps/.hapwright-tmp-000000",
        "maps/.hosts.map.hapwright-tmp",
        "certs/.hapwright-tmp-keykey",
    ];
    for path in stale {
        std::fs::write(tmp.path().join(path), "half").unwrap();
    }
    // Not ours: a directory with the prefix, and ordinary dotfiles.
    std::fs::create_dir(tmp.path().join("files")).unwrap();
    std::fs::create_dir(tmp.path().join("files/.hapwright-tmp-dir")).unwrap();
    std::fs::write(tmp.path().join("maps/.keep"), "").unwrap();

    let mut removed = dir.sweep().unwrap();
    removed.sort();
    let mut expected: Vec<PathBuf> = stale.iter().map(|p| tmp.path().join(p)).collect();
    expected.sort();
    assert_eq!(removed, expected);
    assert!(tmp.path().join("files/.hapwright-tmp-dir").is_dir());
    assert!(tmp.path().join("maps/.keep").exists());
    assert!(tmp.path().join(RECORD_FILE).exists());
    assert!(matches!(
        dir.check_record().unwrap(),
        RecordCheck::Consistent { .. }
    ));
    assert!(dir.sweep().unwrap().is_empty());
}

#[test]
fn scratch_sweep_removes_dead_controllers_dirs_and_keeps_live_ones() {
    let root = tempfile::tempdir().unwrap();
    // A pid that has exited: a reaped child.
    let dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    let mut dead = dead;
    dead.wait().unwrap();
    // A live process other than this one.
    let mut live = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let dir = |name: String| {
        let path = root.path().join(name);
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("haproxy.cfg"), "global\n").unwrap();
        path
    };
    let dead_dir = dir(format!("{SCRATCH_PREFIX}{dead_pid}-AbCdEf"));
    let live_dir = dir(format!("{SCRATCH_PREFIX}{}-AbCdEf", live.id()));
    let own_dir = dir(format!("{SCRATCH_PREFIX}{}-AbCdEf", std::process::id()));
    let old_legacy = dir(format!("{SCRATCH_PREFIX}Qw3rTy"));
    let new_legacy = dir(format!("{SCRATCH_PREFIX}Zx9vBn"));
    std::fs::File::open(&old_legacy)
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(7200))
        .unwrap();
    // A file and a link with the prefix are not scratch directories.
    std::fs::write(root.path().join(format!("{SCRATCH_PREFIX}1-file")), "").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        outside.path(),
        root.path().join(format!("{SCRATCH_PREFIX}1-link")),
    )
    .unwrap();
    let unrelated = dir("something-else".to_owned());

    let outcome = sweep_scratch(Some(root.path()));
    live.kill().unwrap();
    live.wait().unwrap();
    let mut removed = outcome.unwrap();
    removed.sort();
    let mut expected = vec![dead_dir.clone(), old_legacy.clone()];
    expected.sort();
    assert_eq!(removed, expected);
    assert!(!dead_dir.exists() && !old_legacy.exists());
    for kept in [&live_dir, &own_dir, &new_legacy, &unrelated] {
        assert!(kept.is_dir(), "{} was removed", kept.display());
    }
    assert!(outside.path().is_dir());
}

/// A self-signed certificate and its key in one PEM, with `CN=<cn>`.
fn certificate(dir: &Path, cn: &str) -> String {
    let crt = String::from_utf8(certs::ca(dir, cn)).unwrap();
    crt + &std::fs::read_to_string(dir.join(format!("{cn}.key"))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_stay_private_through_real_reloads_and_a_failed_reload() {
    use hapwright_deployer::driver::SocketDriver;
    use hapwright_deployer::metrics::Metrics;
    use hapwright_eventbus::model::DeployStrategy;
    use support::{Backend, Haproxy, config, free_port, rendered_with};

    let scratch = tempfile::tempdir().unwrap();
    let pems: Vec<String> = ["v1", "v2", "v3"]
        .iter()
        .map(|cn| certificate(scratch.path(), cn))
        .collect();
    let backend = Backend::start("a").await;
    let (port, tls_port) = (free_port(), free_port());
    let render = |extra: &str, pem: &str| {
        rendered_with(
            &config(
                port,
                &format!(
                    "frontend fe_tls\n    bind 127.0.0.1:{tls_port} ssl crt certs/site.pem\n    default_backend be_app\n\n\
backend be_app\n{extra}    server s1 127.0.0.1:{}\n",
                    backend.port
                ),
            ),
            &[("hosts.map", "")],
            &[("site.pem", pem)],
        )
    };
    let v1 = render("", &pems[0]);
    let haproxy = Haproxy::start("keys", &v1, &v1.hash().short()).await;
    let key = haproxy.path().join("certs/site.pem");
    assert_eq!(mode(&key), 0o600);
    let driver = SocketDriver::new(
        haproxy.instance.clone(),
        None,
        Metrics::unregistered().unwrap(),
    );
    let running = driver.deploy(v1, None, None, false).await.unwrap();

    // A structural change reloads; HAProxy (root here) loads the private key.
    let v2 = render("    balance first\n", &pems[1]);
    let deployed = support::deploy_by(&driver, v2, running.into(), DeployStrategy::Reload).await;
    let shown = driver
        .runtime()
        .command("show ssl cert certs/site.pem")
        .await
        .unwrap();
    assert!(shown.contains("CN=v2"), "{shown}");
    assert_eq!(mode(&key), 0o600);

    // HAProxy rejects the next config: the last good key comes back, still private,
    // and no temporary file stays.
    let v3 = render("    bogus_keyword\n", &pems[2]);
    let error = driver
        .deploy(v3, None, Some(deployed.into()), false)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("reload failed"), "{error}");
    assert_eq!(std::fs::read_to_string(&key).unwrap(), pems[1]);
    assert_eq!(mode(&key), 0o600);
    assert!(
        leftovers(haproxy.path()).is_empty(),
        "{:?}",
        leftovers(haproxy.path())
    );
}
