//! The Data Plane API driver against the in-test v3 server: first deployment, the
//! runtime-only plan mapped onto API calls, the raw-push fallback, drift, and the
//! failure paths (409 conflicts, 5xx, timeouts, slow answers, failed reloads, bad
//! credentials).

mod support;

use hapwright_deployer::Driver;
use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::client::dataplane::{DataplaneClient, DataplaneError, Endpoint, Settings};
use hapwright_deployer::driver::dataplane::DataplaneDriver;
use hapwright_deployer::driver::{DeployError, Deployed};
use hapwright_deployer::haproxy::files::VERSION_VARIABLE;
use hapwright_deployer::metrics::Metrics;
use hapwright_eventbus::config::Secret;
use hapwright_eventbus::model::{DeployStrategy, ReloadReason, RenderedConfig};
use support::dataplane::{DataplaneServer, Faults, PASSWORD, USER};
use support::rendered;

fn settings() -> Settings {
    Settings {
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
        attempts: 3,
        min_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        conflict_retries: 3,
        reload_timeout: Duration::from_secs(5),
        poll_interval: Duration::from_millis(5),
    }
}

fn driver_with(server: &DataplaneServer, settings: Settings, password: &str) -> DataplaneDriver {
    let endpoint = Endpoint {
        url: server.url.clone(),
        username: USER.to_owned(),
        password: Secret::new(password),
        ca_file: None,
    };
    DataplaneDriver::new(
        "edge",
        server.url.clone(),
        DataplaneClient::new(&endpoint, settings).unwrap(),
        Metrics::unregistered().unwrap(),
    )
}

fn driver(server: &DataplaneServer) -> DataplaneDriver {
    driver_with(server, settings(), PASSWORD)
}

fn render(servers: &str, map: &str) -> Arc<RenderedConfig> {
    rendered(
        &format!(
            "global\n    stats timeout 30s\n\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
frontend fe_main\n    bind 127.0.0.1:8080\n    use_backend %[req.hdr(host),lower,map(maps/hosts.map,be_app)]\n    default_backend be_app\n\n\
backend be_app\n    balance roundrobin\n{servers}\n\
backend be_other\n    server o1 127.0.0.1:9100\n"
        ),
        &[("hosts.map", map)],
    )
}

fn v1() -> Arc<RenderedConfig> {
    render(
        "    server s1 127.0.0.1:9001\n",
        "a.test be_other\nb.test be_app\n",
    )
}

async fn first(server: &DataplaneServer, driver: &DataplaneDriver) -> Arc<Deployed> {
    let deployed = driver.deploy(v1(), None, None, false).await.unwrap();
    assert_eq!(deployed.strategy, DeployStrategy::Reload);
    assert_eq!(deployed.reason.reload, Some(ReloadReason::FirstDeploy));
    {
        let state = server.state();
        assert!(
            state.running_raw.contains(&format!(
                "setenv {VERSION_VARIABLE} {}",
                v1().hash().short()
            )),
            "{}",
            state.running_raw
        );
    }
    Arc::new(deployed)
}

#[tokio::test]
async fn first_deployment_pushes_files_and_raw_config_and_tracks_the_reload() {
    let server = DataplaneServer::start("global\n").await;
    server.faults(Faults {
        reload_polls: 3,
        ..Faults::default()
    });
    let driver = driver(&server);
    first(&server, &driver).await;
    assert_eq!(
        server.map("hosts.map"),
        [
            ("a.test".to_owned(), "be_other".to_owned()),
            ("b.test".to_owned(), "be_app".to_owned())
        ]
    );
    assert_eq!(
        server.server("be_app", "s1").unwrap().port,
        Some(9001),
        "the reload loaded the servers"
    );
    // The reload id was polled until it succeeded.
    assert!(server.requests("GET /v3/services/haproxy/reloads/") >= 4);
    // The maps went to storage without a reload of their own.
    assert!(server.requests("POST /v3/services/haproxy/storage/maps?skip_reload=true") == 1);
    let info = driver.client().info().await.unwrap();
    assert!(info["api"]["version"].is_string());
}

#[tokio::test]
async fn runtime_changes_use_the_api_without_a_reload() {
    let server = DataplaneServer::start("global\n").await;
    let driver = driver(&server);
    let running = first(&server, &driver).await;
    let reloads = server.state().reload_count;

    // Address, weight, a new server and map entries: all at runtime.
    let v2 = render(
        "    server s1 127.0.0.2:9002 weight 5\n    server s2 127.0.0.1:9003\n",
        "a.test be_app\nc.test be_other\n",
    );
    let deployed = support::deploy_by(
        &driver,
        v2.clone(),
        running.clone(),
        DeployStrategy::Runtime,
    )
    .await;
    assert_eq!(server.state().reload_count, reloads, "no reload");
    let s1 = server.server("be_app", "s1").unwrap();
    assert_eq!(
        (s1.address.as_str(), s1.port, s1.weight),
        ("127.0.0.2", Some(9002), 5)
    );
    assert_eq!(server.server("be_app", "s2").unwrap().port, Some(9003));
    assert_eq!(
        server.map("hosts.map"),
        [
            ("a.test".to_owned(), "be_app".to_owned()),
            ("c.test".to_owned(), "be_other".to_owned())
        ]
    );
    // Storage holds the new map and the raw config the new render (keeping the
    // running marker) for the next reload.
    {
        let state = server.state();
        assert_eq!(
            state.storage["maps"]["hosts.map"],
            "a.test be_app\nc.test be_other\n"
        );
        assert!(state.raw.contains("server s2 127.0.0.1:9003"));
        assert!(state.raw.contains(&running.marker));
    }

    // Removing a server: maintenance, then delete.
    let v3 = render(
        "    server s1 127.0.0.2:9002 weight 5\n",
        "a.test be_app\nc.test be_other\n",
    );
    let deployed = driver
        .deploy(v3, None, Some(Arc::new(deployed)), false)
        .await
        .unwrap();
    assert_eq!(deployed.strategy, DeployStrategy::Runtime);
    assert!(server.server("be_app", "s2").is_none());
    assert_eq!(server.state().reload_count, reloads);
}

#[tokio::test]
async fn a_refused_runtime_change_falls_back_to_a_raw_push() {
    let server = DataplaneServer::start("global\n").await;
    let driver = driver(&server);
    let running = first(&server, &driver).await;
    server.faults(Faults {
        refuse_add_server: true,
        ..Faults::default()
    });
    let v2 = render(
        "    server s1 127.0.0.1:9001\n    server s2 127.0.0.1:9003\n",
        "a.test be_other\nb.test be_app\n",
    );
    let deployed = driver
        .deploy(v2.clone(), None, Some(running), false)
        .await
        .unwrap();
    assert_eq!(deployed.strategy, DeployStrategy::Reload);
    assert!(
        deployed.reason.detail.contains("runtime change refused"),
        "{}",
        deployed.reason.detail
    );
    assert_eq!(server.server("be_app", "s2").unwrap().port, Some(9003));
    assert!(server.state().running_raw.contains(&v2.hash().short()));
}

#[tokio::test]
async fn version_conflicts_are_retried_with_a_fresh_version() {
    let server = DataplaneServer::start("global\n").await;
    server.faults(Faults {
        conflicts: 2,
        ..Faults::default()
    });
    let driver = driver(&server);
    first(&server, &driver).await;
    assert_eq!(
        server.requests("POST /v3/services/haproxy/configuration/raw"),
        3
    );

    // A conflict that persists is an error naming it.
    server.faults(Faults {
        conflicts: 100,
        ..Faults::default()
    });
    let v2 = render("    server s1 127.0.0.1:9001\n    option redispatch\n", "");
    let error = driver.deploy(v2, None, None, false).await.unwrap_err();
    assert!(
        matches!(
            error,
            DeployError::Dataplane(DataplaneError::Conflict { attempts: 4, .. })
        ),
        "{error}"
    );
}

#[tokio::test]
async fn server_errors_are_retried_with_backoff_and_reported_when_they_persist() {
    let server = DataplaneServer::start("global\n").await;
    server.faults(Faults {
        unavailable: 2,
        ..Faults::default()
    });
    let driver = driver(&server);
    first(&server, &driver).await;

    server.faults(Faults {
        unavailable: 1000,
        ..Faults::default()
    });
    let error = driver.client().configuration_version().await.unwrap_err();
    assert_eq!(error.status(), Some(503), "{error}");
    assert!(error.to_string().contains("try again"), "{error}");
}

#[tokio::test]
async fn timeouts_fail_and_slow_answers_within_the_deadline_succeed() {
    let server = DataplaneServer::start("global\n").await;
    // Slow but within the deadline.
    server.faults(Faults {
        delay: Some(Duration::from_millis(30)),
        ..Faults::default()
    });
    let driver = driver(&server);
    first(&server, &driver).await;

    // Slower than the request timeout, every attempt.
    server.faults(Faults {
        delay: Some(Duration::from_secs(2)),
        ..Faults::default()
    });
    let impatient = driver_with(
        &server,
        Settings {
            request_timeout: Duration::from_millis(100),
            attempts: 2,
            ..settings()
        },
        PASSWORD,
    );
    let error = impatient
        .client()
        .configuration_version()
        .await
        .unwrap_err();
    let DataplaneError::Transport { source, .. } = &error else {
        panic!("expected a transport error, got {error}");
    };
    assert!(source.is_timeout(), "{source}");
}

#[tokio::test]
async fn a_failed_reload_is_reported_with_haproxys_output() {
    let server = DataplaneServer::start("global\n").await;
    let driver = driver(&server);
    let running = first(&server, &driver).await;
    server.faults(Faults {
        failing_reloads: 1,
        reload_polls: 2,
        ..Faults::default()
    });
    let v2 = render("    server s1 127.0.0.1:9001\n    option redispatch\n", "");
    let error = driver
        .deploy(v2.clone(), None, Some(running.clone()), false)
        .await
        .unwrap_err();
    let DeployError::Dataplane(DataplaneError::ReloadFailed { response, .. }) = &error else {
        panic!("expected a failed reload, got {error}");
    };
    assert!(response.contains("[ALERT]"), "{response}");
    // The old config keeps running; the next attempt succeeds.
    assert!(server.state().running_raw.contains(&running.marker));
    let deployed = driver.deploy(v2, None, Some(running), false).await.unwrap();
    assert_eq!(deployed.strategy, DeployStrategy::Reload);
}

#[tokio::test]
async fn bad_credentials_are_an_error_status() {
    let server = DataplaneServer::start("global\n").await;
    let driver = driver_with(&server, settings(), "wrong");
    let error = driver.deploy(v1(), None, None, false).await.unwrap_err();
    assert!(error.to_string().contains("401"), "{error}");
}

#[tokio::test]
async fn drift_is_found_by_version_and_content_and_repaired() {
    let server = DataplaneServer::start("global\n").await;
    let driver = driver(&server);
    let running = first(&server, &driver).await;
    assert_eq!(driver.check_drift(&running).await.unwrap(), None);

    // A change that keeps the marker: the version moved, the content differs.
    let raw = server
        .state()
        .raw
        .replace("timeout client 10s", "timeout client 99s");
    server.change_out_of_band(&raw);
    let detail = driver.check_drift(&running).await.unwrap().unwrap();
    assert!(detail.contains("changed outside hapwright"), "{detail}");

    // A version bump with the same content is not drift.
    let same = server
        .state()
        .raw
        .replace("timeout client 99s", "timeout client 10s");
    server.change_out_of_band(&same);
    assert_eq!(driver.check_drift(&running).await.unwrap(), None);

    // A marker change (another controller deployed) is drift, and a drift-checked
    // deployment repairs it with a reload.
    server.change_out_of_band("global\n    setenv HAPWRIGHT_CONFIG_VERSION other\n");
    let detail = driver.check_drift(&running).await.unwrap().unwrap();
    assert!(detail.contains("runs version other"), "{detail}");
    let deployed = driver
        .deploy(v1(), None, Some(running.clone()), true)
        .await
        .unwrap();
    assert_eq!(deployed.reason.reload, Some(ReloadReason::Drift));
    assert_eq!(driver.check_drift(&deployed).await.unwrap(), None);

    // After a controller restart (no record) the marker says what runs: a no-op.
    let fresh = driver_with(&server, settings(), PASSWORD);
    let again = fresh.deploy(v1(), None, None, false).await.unwrap();
    assert_eq!(again.strategy, DeployStrategy::Noop);
}

/// After an upgrade, a config an earlier version of hapwright deployed (its marker
/// the short form of the content hash as that version computed it) counts as
/// running: the same render is a no-op, not a reload of every instance; a changed
/// render keeps that marker for its runtime changes.
#[tokio::test]
async fn a_config_deployed_by_an_earlier_version_is_recognised_after_an_upgrade() {
    let server = DataplaneServer::start("global\n").await;
    let driver = driver(&server);
    first(&server, &driver).await;
    let legacy = v1().legacy_hash().short();
    assert_ne!(legacy, v1().hash().short());
    let raw = server.state().raw.replace(&v1().hash().short(), &legacy);
    server.change_out_of_band(&raw);
    let reloads = server.state().reloads.len();

    let upgraded = driver_with(&server, settings(), PASSWORD);
    let found = upgraded.deploy(v1(), None, None, false).await.unwrap();
    assert_eq!(found.strategy, DeployStrategy::Noop, "{:?}", found.reason);
    assert_eq!(found.marker, legacy);
    assert_eq!(server.state().reloads.len(), reloads);

    // Another marker is still not what runs: that deployment reloads.
    server.change_out_of_band(&raw.replace(&legacy, "0123456789ab"));
    let other = driver_with(&server, settings(), PASSWORD);
    let reloaded = other.deploy(v1(), None, None, false).await.unwrap();
    assert_eq!(reloaded.strategy, DeployStrategy::Reload);
}

/// The instance's HAProxy version for the line check comes from the API's runtime
/// info (`show info` of its HAProxy); a failing API says why.
#[tokio::test]
async fn the_haproxy_version_comes_from_the_runtime_info() {
    let server = DataplaneServer::start("global\n").await;
    let driver = driver(&server);
    assert_eq!(driver.haproxy_version().await.unwrap(), "3.2.4-1");
    assert_eq!(server.requests("GET /v3/services/haproxy/runtime/info"), 1);

    let refused = driver_with(&server, settings(), "wrong password");
    let error = refused.haproxy_version().await.unwrap_err().to_string();
    assert!(error.contains("401"), "{error}");
}

/// A render with a TLS frontend whose crt-list names `certs`, one PEM each.
fn render_tls(certs: &[&str]) -> Arc<RenderedConfig> {
    let list: String = certs
        .iter()
        .map(|c| format!("certs/{c}.pem {c}.test\n"))
        .collect();
    Arc::new(RenderedConfig::new(
        "global\n    stats timeout 30s\n\ndefaults\n    mode http\n    timeout connect 2s\n    \
         timeout client 10s\n    timeout server 10s\n\nfrontend fe_tls\n    \
         bind 127.0.0.1:8443 ssl crt-list files/tls.crtlist\n    default_backend be_app\n\n\
         backend be_app\n    server s1 127.0.0.1:9001\n",
        Default::default(),
        [("tls.crtlist".to_owned(), Arc::<str>::from(list))].into(),
        certs
            .iter()
            .map(|c| {
                (
                    format!("{c}.pem"),
                    Arc::<str>::from(format!("PEM of {c}\n")),
                )
            })
            .collect(),
        hapwright_eventbus::model::SourceMap::default(),
    ))
}

#[tokio::test]
async fn a_certificate_added_reloads_with_the_reason_the_api_has_no_runtime_call() {
    let server = DataplaneServer::start("global\n").await;
    let driver = driver(&server);
    let running = Arc::new(
        driver
            .deploy(render_tls(&["a"]), None, None, false)
            .await
            .unwrap(),
    );
    let v2 = render_tls(&["a", "b"]);
    let deployed = driver
        .deploy(v2.clone(), None, Some(running), false)
        .await
        .unwrap();
    assert_eq!(deployed.strategy, DeployStrategy::Reload);
    assert_eq!(deployed.reason.reload, Some(ReloadReason::RuntimeFailed));
    assert!(
        deployed.reason.detail.contains("certs/b.pem added")
            && deployed
                .reason
                .detail
                .contains("the Data Plane API has no runtime call"),
        "{}",
        deployed.reason.detail
    );
    let state = server.state();
    assert!(state.running_raw.contains(&v2.hash().short()));
    assert_eq!(
        state.storage["ssl_certificates"]
            .get("b.pem")
            .map(String::as_str),
        Some("PEM of b\n")
    );
}
