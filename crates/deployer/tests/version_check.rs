//! One HAProxy build, checked, with real binaries: a 3.0 instance (from
//! `target/haproxy-lines/`, see scripts/haproxy-lines.sh) validated by Debian's 2.6
//! `haproxy` is a line mismatch; the same instance validated by its own binary is not.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::client::runtime::RuntimeClient;
use hapwright_deployer::client::socket::{InstanceConfig, SocketAddress};
use hapwright_deployer::driver::Driver;
use hapwright_deployer::driver::socket::SocketDriver;
use hapwright_deployer::metrics::Metrics;
use hapwright_deployer::version_check::VersionCheck;
use prometheus::Registry;

/// Debian's HAProxy 2.6, the validator.
const VALIDATOR: &str = "/usr/sbin/haproxy";

/// The HAProxy 3.0 binary scripts/haproxy-lines.sh unpacks.
fn haproxy_30() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
        PathBuf::from,
    );
    let binary = target.join("haproxy-lines/3.0/usr/sbin/haproxy");
    assert!(
        binary.exists(),
        "{} is missing: run scripts/haproxy-lines.sh 3.0",
        binary.display()
    );
    binary
}

/// An HAProxy of `binary` with a runtime API socket, stopped on drop.
struct Instance {
    dir: tempfile::TempDir,
    child: Child,
}

impl Instance {
    async fn start(binary: &Path) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = hapwright_eventbus::testing::free_port();
        std::fs::write(
            dir.path().join("haproxy.cfg"),
            format!(
                "global\n    stats socket {}/admin.sock level admin\n\n\
                 defaults\n    mode http\n    timeout connect 1s\n    timeout client 1s\n    timeout server 1s\n\n\
                 frontend fe\n    bind 127.0.0.1:{port}\n    http-request return status 200\n",
                dir.path().display()
            ),
        )
        .unwrap();
        let child = Command::new(binary)
            .arg("-W")
            .arg("-S")
            .arg(dir.path().join("master.sock"))
            .arg("-f")
            .arg("haproxy.cfg")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("haproxy starts");
        let instance = Self { dir, child };
        let runtime = RuntimeClient::direct(instance.runtime());
        let answered = tokio::time::timeout(Duration::from_secs(10), async {
            while runtime.query("show info").await.is_err() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(answered.is_ok(), "the runtime API never answered");
        instance
    }

    fn runtime(&self) -> SocketAddress {
        SocketAddress::Unix(self.dir.path().join("admin.sock"))
    }

    fn driver(&self, name: &str) -> Arc<dyn Driver> {
        let mut config = InstanceConfig::new(
            name,
            SocketAddress::Unix(self.dir.path().join("master.sock")),
            self.dir.path(),
        );
        config.runtime = Some(self.runtime());
        Arc::new(SocketDriver::new(
            config,
            None,
            Metrics::register(&Registry::new()).unwrap(),
        ))
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn checked(
    check: &VersionCheck,
    instance: &str,
) -> hapwright_deployer::version_check::InstanceVersion {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(version) = check.instance(instance) {
                return version;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the instance's version was read")
}

fn metrics(registry: &Registry) -> String {
    prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap()
}

#[tokio::test]
async fn a_30_instance_validated_by_26_is_a_line_mismatch() {
    let binary = haproxy_30();
    let instance = Instance::start(&binary).await;
    let driver = instance.driver("edge");
    assert!(
        driver.haproxy_version().await.unwrap().starts_with("3.0."),
        "show info of the 3.0 instance"
    );

    let registry = Registry::new();
    let check = VersionCheck::register(&registry).unwrap();
    check.read_validator(Path::new(VALIDATOR)).await;
    check.spawn_check(driver.clone());
    let seen = checked(&check, "edge").await;
    assert!(seen.haproxy_version.starts_with("3.0."), "{seen:?}");
    assert!(
        seen.validator_version
            .as_deref()
            .is_some_and(|v| v.starts_with("2.6.")),
        "{seen:?}"
    );
    assert!(seen.haproxy_line_mismatch, "{seen:?}");
    let text = metrics(&registry);
    assert!(
        text.contains("hapwright_instance_haproxy_line_mismatch{instance=\"edge\"} 1"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "hapwright_instance_haproxy_version_info{{instance=\"edge\",version=\"{}\"}} 1",
            seen.haproxy_version
        )),
        "{text}"
    );

    // Validated by its own line: no mismatch, and the gauge says so.
    check.read_validator(&binary).await;
    let seen = check.instance("edge").unwrap();
    assert!(!seen.haproxy_line_mismatch, "{seen:?}");
    assert!(
        metrics(&registry)
            .contains("hapwright_instance_haproxy_line_mismatch{instance=\"edge\"} 0")
    );
}

/// A validator binary that cannot tell its version leaves the comparison off; an
/// instance that cannot be asked says why.
#[tokio::test]
async fn what_cannot_be_read_is_not_compared() {
    let registry = Registry::new();
    let check = VersionCheck::register(&registry).unwrap();
    check.read_validator(Path::new("/bin/true")).await;
    check.record_instance("edge", "3.0.11-1");
    let seen = check.instance("edge").unwrap();
    assert_eq!(seen.validator_version, None);
    assert!(!seen.haproxy_line_mismatch);
    assert!(!metrics(&registry).contains("hapwright_instance_haproxy_line_mismatch{"));

    // An instance whose runtime socket is gone: the error says why, nothing recorded.
    let gone = {
        let instance = Instance::start(&haproxy_30()).await;
        instance.driver("gone")
    };
    let error = gone.haproxy_version().await.unwrap_err().to_string();
    assert!(error.contains("cannot reach the runtime API"), "{error}");
    assert_eq!(check.instance("gone"), None);
}
