//! Secret values never leave through what hapwright shows: one known value (the
//! canary) is rendered into a userlist password, a map and a certificate from a
//! Kubernetes Secret, and given to HAProxy as an `env` value read from a file. A
//! valid render, an invalid render and a failing reload later, no HTTP endpoint, no
//! status page and no log line contains it.

use std::fs;
use std::net::TcpListener;
use std::path::Path;

use base64::Engine as _;
use hapwright_e2e::{Controller, WAIT, free_port, replace_once, write_atomically};

const CANARY: &str = "c4n4ry-S3cret-0d9e8f7a";

/// Every endpoint of the main listener (and the resources the test watches).
const ENDPOINTS: &[&str] = &[
    "/",
    "/metrics",
    "/healthz",
    "/readyz",
    "/debug/components",
    "/debug/events?limit=1000",
    "/debug/config",
    "/debug/rendered",
    "/debug/resources/secrets",
    "/debug/resources/services",
    "/debug/instances",
];

fn secret_manifest(name: &str, password: Option<&str>) -> String {
    let data = password.map_or(String::new(), |p| {
        format!(
            "data:\n  password: {}\n",
            base64::engine::general_purpose::STANDARD.encode(p)
        )
    });
    format!("apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: default\n{data}")
}

/// The quickstart with a `secrets` resource, the canary in four places and two
/// switches: Secret `bad` renders an invalid line holding the canary, Secret `busy`
/// adds a frontend named after it on a port that is already taken.
fn edit(config: &str, secrets: &Path, env_file: &Path, busy_port: u16) -> String {
    let config = replace_once(
        config,
        "watchedResources:\n",
        &format!(
            "watchedResources:\n  secrets:\n    files: {{ path: {} }}\n    kind: Secret\n    indexBy: [metadata.namespace, metadata.name]\n",
            secrets.display()
        ),
    );
    let canary = r#"{%- set s = resources.secrets.get("default", "canary") %}{%- set canary = (s.data.password | b64decode) if s else "" %}"#;
    let config = replace_once(
        &config,
        "    defaults\n",
        &format!(
            r#"    {canary}
    {{%- if canary %}}
    userlist canary_users
        user alice insecure-password {{{{ canary }}}}
        user bob insecure-password "${{CANARY}}"
    {{%- if resources.secrets.get("default", "bad") %}}
        bogus-canary-keyword {{{{ canary }}}}
    {{%- endif %}}
    {{%- if resources.secrets.get("default", "busy") %}}

    frontend fe_{{{{ canary }}}}
        bind 127.0.0.1:{busy_port}
    {{%- endif %}}
    {{%- endif %}}

    defaults
"#
        ),
    );
    let config = replace_once(
        &config,
        "maps:\n",
        &format!(
            "maps:\n  canary.map:\n    template: |\n      {canary}\n      {{{{ canary }}}} be_canary\n"
        ),
    );
    let config = replace_once(
        &config,
        "      env: { HTTP_PORT: ",
        &format!(
            "      env: {{ CANARY: {{ file: {} }}, HTTP_PORT: ",
            env_file.display()
        ),
    );
    format!(
        "{config}\nsslCertificates:\n  canary.pem:\n    template: |\n      {canary}\n      # {{{{ canary }}}}\n"
    )
}

/// Fails when any endpoint or the log holds the canary, in clear or as stored in
/// the Secret.
fn assert_no_canary(controller: &Controller, stage: &str) {
    let encoded = base64::engine::general_purpose::STANDARD.encode(CANARY);
    for path in ENDPOINTS {
        let (status, body) = controller.status_get(path);
        for needle in [CANARY, encoded.as_str()] {
            if body.contains(needle) {
                controller.fail(&format!(
                    "{stage}: GET {path} ({status}) shows the secret `{needle}`:\n{body}"
                ));
            }
        }
    }
    let log = controller.log_text();
    for needle in [CANARY, encoded.as_str()] {
        if let Some(line) = log.lines().find(|line| line.contains(needle)) {
            controller.fail(&format!("{stage}: the log shows the secret:\n{line}"));
        }
    }
}

#[test]
fn the_canary_never_appears_on_any_endpoint_page_or_log() {
    let outside = tempfile::tempdir().expect("temporary directory");
    let secrets = outside.path().join("secrets");
    fs::create_dir(&secrets).unwrap();
    let env_file = outside.path().join("canary.env");
    fs::write(&env_file, format!("{CANARY}\n")).unwrap();
    let busy_port = free_port();

    let controller = Controller::start_with(|config| edit(config, &secrets, &env_file, busy_port));
    assert_no_canary(&controller, "before the Secret");

    // A valid render: the canary reaches HAProxy's files, never the surfaces.
    write_atomically(
        &secrets.join("canary.yaml"),
        &secret_manifest("canary", Some(CANARY)),
    );
    let config_file = controller.dir().join("run/haproxy/haproxy.cfg");
    controller.wait_until("the canary is deployed", WAIT, || {
        let deployed = fs::read_to_string(&config_file).ok()?;
        deployed
            .contains(&format!("insecure-password {CANARY}"))
            .then_some(())
    });
    controller.wait_deployed();
    let map = fs::read_to_string(controller.dir().join("run/haproxy/maps/canary.map")).unwrap();
    assert!(map.contains(CANARY), "{map}");
    let (_, rendered) = controller.status_get("/debug/rendered");
    assert!(
        rendered.contains("insecure-password [redacted]"),
        "{rendered}"
    );
    assert!(rendered.contains("[redacted] be_canary"), "{rendered}");
    assert_no_canary(&controller, "after a valid render");

    // An invalid render: the offending line holds the canary.
    write_atomically(&secrets.join("bad.yaml"), &secret_manifest("bad", None));
    controller.wait_until("the invalid render is reported", WAIT, || {
        let (_, events) = controller.status_get("/debug/events?limit=1000");
        events.contains("bogus-canary-keyword").then_some(())
    });
    assert_no_canary(&controller, "after an invalid render");

    // A failing reload: a frontend named after the canary cannot bind.
    let _taken = TcpListener::bind(("127.0.0.1", busy_port)).expect("take the port");
    fs::remove_file(secrets.join("bad.yaml")).unwrap();
    write_atomically(&secrets.join("busy.yaml"), &secret_manifest("busy", None));
    controller.wait_until("the failed reload is reported", WAIT, || {
        controller.instance().last_error
    });
    let (_, instances) = controller.status_get("/debug/instances");
    assert!(
        instances.contains("fe_[redacted]") || !instances.contains("fe_"),
        "{instances}"
    );
    assert_no_canary(&controller, "after a failing reload");
}
