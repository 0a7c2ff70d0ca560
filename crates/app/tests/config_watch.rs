//! The config watcher with real files and real notify watching: every wait is a
//! bounded receive from a bus subscription and the typed change channel.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hapwright_app::config::{Config, ConfigChange, ConfigWatcher, load};
use hapwright_eventbus::testing::{self, TestBus};
use hapwright_eventbus::{EventKind, EventPayload, HealthState, RunningKernel, Subscription};
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(10);

struct Harness {
    kernel: RunningKernel,
    events: Subscription,
    changes: tokio::sync::mpsc::UnboundedReceiver<ConfigChange>,
}

impl Harness {
    fn start(path: &Path) -> Self {
        let loaded = load(path).expect("the initial config is valid");
        let bus = TestBus::new();
        let events = bus.subscribe("test", [EventKind::ConfigLoaded, EventKind::ConfigInvalid]);
        let (sender, changes) = tokio::sync::mpsc::unbounded_channel();
        let watcher = ConfigWatcher::new(&loaded, sender)
            .with_timing(Duration::from_millis(30), Duration::from_secs(60));
        Self {
            kernel: bus.start_one(watcher),
            events,
            changes,
        }
    }

    async fn next(&mut self) -> EventPayload {
        testing::next(&mut self.events, WAIT).await.payload.clone()
    }

    async fn change(&mut self) -> ConfigChange {
        timeout(WAIT, self.changes.recv())
            .await
            .expect("timed out waiting for a config change")
            .expect("watcher running")
    }

    /// The next change is a valid config, announced on the bus with its hash.
    async fn loaded(&mut self) -> Config {
        let event = self.next().await;
        let ConfigChange::Loaded(loaded) = self.change().await else {
            panic!("expected a loaded config");
        };
        match event {
            EventPayload::ConfigLoaded(announced) => assert_eq!(announced.hash, loaded.hash),
            other => panic!("expected ConfigLoaded, got {other:?}"),
        }
        loaded.config
    }

    /// The next change is invalid, announced on the bus with the same errors.
    async fn invalid(&mut self) -> Vec<String> {
        let event = self.next().await;
        let ConfigChange::Invalid(errors) = self.change().await else {
            panic!("expected an invalid config");
        };
        match event {
            EventPayload::ConfigInvalid(announced) => assert_eq!(announced.errors, errors),
            other => panic!("expected ConfigInvalid, got {other:?}"),
        }
        errors.iter().map(ToString::to_string).collect()
    }

    async fn stop(self) {
        let report = self.kernel.shutdown(Duration::from_secs(5)).await;
        assert!(report.aborted.is_empty());
    }
}

fn config_text(debounce: &str) -> String {
    format!(
        "haproxyConfig: {{ template: x }}\nhaproxy:\n  instances:\n    - name: edge\n      dataplane: {{ url: http://x, username: u, passwordFile: dp }}\ncontroller:\n  debounce: {debounce}\n"
    )
}

fn setup() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dp"), "one\n").unwrap();
    let path = dir.path().join("hapwright.yaml");
    std::fs::write(&path, config_text("100ms")).unwrap();
    (dir, path)
}

fn password(config: &Config) -> String {
    config.haproxy.instances[0]
        .dataplane
        .as_ref()
        .unwrap()
        .password
        .as_ref()
        .unwrap()
        .expose()
        .to_owned()
}

#[tokio::test]
async fn valid_invalid_and_fixed_again() {
    let (_dir, path) = setup();
    let mut h = Harness::start(&path);

    std::fs::write(&path, config_text("300ms")).unwrap();
    let config = h.loaded().await;
    assert_eq!(config.controller.debounce.to_string(), "300ms");

    std::fs::write(&path, config_text_with_typo()).unwrap();
    let errors = h.invalid().await;
    assert_eq!(
        errors,
        [format!(
            "{}:7:3: controller.debunce: unknown field, did you mean `debounce`?",
            path.display()
        )]
    );
    let health = h.kernel.health().get(ConfigWatcher::NAME).unwrap();
    assert_eq!(health.state, HealthState::Unhealthy);

    std::fs::write(&path, config_text("500ms")).unwrap();
    let config = h.loaded().await;
    assert_eq!(config.controller.debounce.to_string(), "500ms");
    assert_eq!(
        h.kernel.health().get(ConfigWatcher::NAME).unwrap().state,
        HealthState::Healthy
    );
    h.stop().await;
}

#[tokio::test]
async fn a_template_that_does_not_compile_is_rejected_like_a_yaml_error() {
    let (_dir, path) = setup();
    let mut h = Harness::start(&path);

    std::fs::write(
        &path,
        config_text("100ms").replace("template: x", "template: \"{% for %}\""),
    )
    .unwrap();
    let errors = h.invalid().await;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("haproxy.cfg"), "{errors:?}");
    let health = h.kernel.health().get(ConfigWatcher::NAME).unwrap();
    assert_eq!(health.state, HealthState::Unhealthy);
    assert!(
        health
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("haproxy.cfg"),
        "{health:?}"
    );

    std::fs::write(&path, config_text("300ms")).unwrap();
    h.loaded().await;
    assert_eq!(
        h.kernel.health().get(ConfigWatcher::NAME).unwrap().state,
        HealthState::Healthy
    );
    h.stop().await;
}

fn config_text_with_typo() -> String {
    config_text("100ms").replace("  debounce:", "  debunce:")
}

#[tokio::test]
async fn a_password_file_change_reloads() {
    let (dir, path) = setup();
    let mut h = Harness::start(&path);
    // Secret volumes are updated like ConfigMaps: write elsewhere, rename in place.
    std::fs::write(dir.path().join(".dp.new"), "two\n").unwrap();
    std::fs::rename(dir.path().join(".dp.new"), dir.path().join("dp")).unwrap();
    let config = h.loaded().await;
    assert_eq!(password(&config), "two");

    std::fs::remove_file(dir.path().join("dp")).unwrap();
    let errors = h.invalid().await;
    assert!(
        errors[0].contains("haproxy.instances[0].dataplane.passwordFile: cannot read"),
        "{errors:?}"
    );
    assert!(!errors[0].contains("two"));
    h.stop().await;
}

#[tokio::test]
async fn unchanged_content_publishes_nothing() {
    let (_dir, path) = setup();
    let mut h = Harness::start(&path);
    std::fs::write(&path, config_text("100ms")).unwrap();
    std::fs::write(&path, config_text("100ms")).unwrap();
    // The next event is this real change: the rewrites above published nothing.
    std::fs::write(&path, config_text("700ms")).unwrap();
    let config = h.loaded().await;
    assert_eq!(config.controller.debounce.to_string(), "700ms");
    h.stop().await;
}

#[cfg(unix)]
#[tokio::test]
async fn configmap_swaps_of_the_config_file_are_seen_twice() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path();
    std::fs::write(mount.join("dp"), "one\n").unwrap();
    let swap = |generation: u32, debounce: &str| {
        let data_dir = format!("..gen{generation}");
        std::fs::create_dir(mount.join(&data_dir)).unwrap();
        std::fs::write(
            mount.join(&data_dir).join("hapwright.yaml"),
            config_text(debounce),
        )
        .unwrap();
        symlink(&data_dir, mount.join("..data_tmp")).unwrap();
        std::fs::rename(mount.join("..data_tmp"), mount.join("..data")).unwrap();
        if generation > 0 {
            std::fs::remove_dir_all(mount.join(format!("..gen{}", generation - 1))).unwrap();
        }
    };
    swap(0, "100ms");
    let path = mount.join("hapwright.yaml");
    symlink("..data/hapwright.yaml", &path).unwrap();
    let mut h = Harness::start(&path);

    swap(1, "200ms");
    assert_eq!(h.loaded().await.controller.debounce.to_string(), "200ms");
    swap(2, "300ms");
    assert_eq!(h.loaded().await.controller.debounce.to_string(), "300ms");
    h.stop().await;
}

#[tokio::test]
async fn a_discovery_password_file_change_reloads() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dp"), "one\n").unwrap();
    let path = dir.path().join("hapwright.yaml");
    std::fs::write(
        &path,
        "haproxyConfig: { template: x }\nhaproxy:\n  discovery:\n    kubernetes: { namespace: ingress, labelSelector: app=haproxy, port: 5555, username: admin, passwordFile: dp }\n",
    )
    .unwrap();
    let before = load(&path).unwrap().hash;
    let mut h = Harness::start(&path);
    std::fs::write(dir.path().join(".dp.new"), "two\n").unwrap();
    std::fs::rename(dir.path().join(".dp.new"), dir.path().join("dp")).unwrap();
    let config = h.loaded().await;
    let discovered = config.haproxy.discovery.as_ref().unwrap();
    let password = discovered.kubernetes.as_ref().unwrap().password.as_ref();
    assert_eq!(password.unwrap().expose(), "two");
    assert_ne!(load(&path).unwrap().hash, before);
    h.stop().await;
}
