//! `hapwright plan` through the real binary on real files: fixtures against fixtures,
//! against a config directory the deployer's writer left (with its state record), and
//! the real `haproxy -c` behind the render it plans. Each verdict has its exit status.

mod support;

use std::path::Path;
use std::process::Output;

use hapwright_deployer::haproxy::files::{ConfigDir, DeployRecord};
use support::{hapwright, stderr, stdout};

const CONFIG: &str = r#"
watchedResources:
  services:
    files: { path: ./resources }
    kind: Service
    indexBy: [metadata.namespace, metadata.name]
haproxyConfig:
  template: |
    global
        stats timeout 30s
    defaults routes
        mode http
        timeout connect 2s
        timeout client 10s
        timeout server 10s
    frontend fe from routes
        bind 127.0.0.1:18093
        use_backend %[req.hdr(host),lower,word(1,:),map(maps/hosts.map,be_default)]
        default_backend be_default
    backend be_default from routes
        http-request return status 404
    {%- for service in resources.services.list() | sort_by("metadata.name") %}
    backend be_{{ service.metadata.name }} from routes
        {%- if service.spec.httpchk %}
        option httpchk
        {%- endif %}
        server s1 {{ service.spec.address }} weight {{ service.spec.weight | default(1) }}
    {%- endfor %}
maps:
  hosts.map:
    template: |
      {%- for service in resources.services.list() | sort_by("metadata.name") %}
      {{ service.metadata.name }}.test be_{{ service.metadata.name }}
      {%- endfor %}
haproxy:
  binary: haproxy
  dynamicBackends: DYNAMIC
  instances:
    - name: edge
      socket: { master: ./run/master.sock, configDir: ./run/haproxy }
"#;

/// A Service manifest; `httpchk` adds `option httpchk` to its backend.
fn service(name: &str, address: &str, weight: u32, httpchk: bool) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{ name: {name}, namespace: default }}\n\
         spec: {{ address: \"{address}\", weight: {weight}, httpchk: {httpchk} }}\n"
    )
}

/// A project whose config has `haproxy.dynamicBackends: dynamic`, with fixtures
/// directories `<name>/services/` holding the given manifests.
fn project(dynamic: bool, fixtures: &[(&str, &[String])]) -> tempfile::TempDir {
    let dir = support::project(&CONFIG.replace("DYNAMIC", &dynamic.to_string()));
    for (name, services) in fixtures {
        let services_dir = dir.path().join(name).join("services");
        std::fs::create_dir_all(&services_dir).unwrap();
        for (i, manifest) in services.iter().enumerate() {
            std::fs::write(services_dir.join(format!("{i}.yaml")), manifest).unwrap();
        }
    }
    dir
}

/// The base fixtures: one Service `web`.
fn base() -> Vec<String> {
    vec![service("web", "127.0.0.1:9101", 1, false)]
}

/// Runs `hapwright plan -c hapwright.yaml --fixtures FIXTURES ARGS` in `dir`.
fn plan(dir: &Path, fixtures: &str, args: &[&str]) -> Output {
    let mut all = vec!["plan", "-c", "hapwright.yaml", "--fixtures", fixtures];
    all.extend_from_slice(args);
    hapwright(dir, &all)
}

/// Plans the fixtures `next` against the running fixtures `now`, with more `args`.
fn plan_next_over_now(dir: &Path, args: &[&str]) -> Output {
    let mut all = vec!["--running-fixtures", "now"];
    all.extend_from_slice(args);
    plan(dir, "next", &all)
}

/// Asserts the exit status (showing both streams when it differs) and returns
/// standard output.
fn expect_exit(output: &Output, code: i32) -> String {
    let text = stdout(output);
    assert_eq!(
        output.status.code(),
        Some(code),
        "stdout: {text}\nstderr: {}",
        stderr(output)
    );
    text
}

#[test]
fn the_same_render_plans_no_change_and_exits_0() {
    let dir = project(false, &[("now", &base()), ("next", &base())]);
    let text = expect_exit(&plan_next_over_now(dir.path(), &[]), 0);
    assert_eq!(text, "now: no change\n");
}

#[test]
fn a_weight_change_plans_a_runtime_command_and_exits_3() {
    let next = vec![service("web", "127.0.0.1:9101", 5, false)];
    let dir = project(false, &[("now", &base()), ("next", &next)]);
    let text = expect_exit(&plan_next_over_now(dir.path(), &[]), 3);
    assert_eq!(
        text,
        "now: runtime (1 command)\n  server be_web/s1 weight 5\n"
    );
}

#[test]
fn a_new_keyword_plans_a_reload_with_every_cause_and_exits_4() {
    let next = vec![
        service("web", "127.0.0.1:9101", 1, true),
        service("api", "127.0.0.1:9201", 1, false),
    ];
    let dir = project(false, &[("now", &base()), ("next", &next)]);
    let text = expect_exit(&plan_next_over_now(dir.path(), &[]), 4);
    assert!(text.starts_with("now: reload\n"), "{text}");
    // The added backend and the new keyword: both causes, each with its class.
    assert!(text.contains("  structure: "), "{text}");
    assert!(text.contains("backend be_api"), "{text}");
    assert!(
        text.contains("backend be_web: new keyword `option httpchk`"),
        "{text}"
    );
}

#[test]
fn json_output_has_the_documented_shape() {
    let next = vec![service("web", "127.0.0.2:9101", 1, false)];
    let changed = vec![service("web", "127.0.0.1:9101", 1, true)];
    let dir = project(
        false,
        &[("now", &base()), ("next", &next), ("other", &changed)],
    );
    let output = plan_next_over_now(
        dir.path(),
        &["--running-fixtures", "other", "--output", "json"],
    );
    let json: serde_json::Value = serde_json::from_str(&expect_exit(&output, 4)).unwrap();
    assert_eq!(json["verdict"], "reload", "{json}");
    let instances = json["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 2, "{json}");
    assert_eq!(instances[0]["instance"], "now");
    assert_eq!(instances[0]["compared_with"], "fixtures");
    assert_eq!(instances[0]["path"], "now");
    assert_eq!(instances[0]["strategy"], "runtime");
    assert_eq!(
        instances[0]["runtime"],
        serde_json::json!(["server be_web/s1 moved to 127.0.0.2:9101"])
    );
    assert_eq!(instances[0]["reload"], serde_json::json!([]));
    assert_eq!(instances[1]["strategy"], "reload");
    assert_eq!(instances[1]["runtime"], serde_json::json!([]));
    assert_eq!(instances[1]["reload"][0]["reason"], "structure");
    assert!(
        instances[1]["reload"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("`option httpchk`"),
        "{json}"
    );
}

/// Writes the render of `fixtures` into `config_dir` as the deployer leaves a directory
/// it deployed: the files with the version marker, then the state record.
fn deploy_offline(project: &Path, fixtures: &str, config_dir: &Path) {
    let scratch = project.join("scratch");
    let output = hapwright(
        project,
        &[
            "render",
            "-c",
            "hapwright.yaml",
            "--fixtures",
            fixtures,
            "--out",
            scratch.to_str().unwrap(),
        ],
    );
    expect_exit(&output, 0);
    let (rendered, _) = ConfigDir::new(&scratch).read_rendered().unwrap().unwrap();
    let dir = ConfigDir::new(config_dir);
    dir.write(&rendered, "0123abcd", None).unwrap();
    dir.write_record(&DeployRecord::new(&rendered, "0123abcd"))
        .unwrap();
}

#[test]
fn a_config_directory_is_compared_by_what_its_state_record_says() {
    let next = vec![service("web", "127.0.0.1:9101", 7, false)];
    let dir = project(false, &[("now", &base()), ("next", &next)]);
    let config_dir = dir.path().join("run/haproxy");
    // Never deployed: the deployer's first deployment reloads.
    let text = expect_exit(&plan(dir.path(), "next", &[]), 4);
    assert!(
        text.starts_with("edge: reload\n  first_deploy: first deployment to this instance"),
        "{text}"
    );

    deploy_offline(dir.path(), "now", &config_dir);
    // The configured instance by default, and by its directory (named after it).
    for args in [&[][..], &["--running", "run/haproxy"]] {
        let text = expect_exit(&plan(dir.path(), "next", args), 3);
        assert_eq!(
            text,
            "edge: runtime (1 command)\n  server be_web/s1 weight 7\n"
        );
    }
    let text = expect_exit(&plan(dir.path(), "now", &[]), 0);
    assert_eq!(text, "edge: no change\n");

    // A file edited behind hapwright's back: the deployer rewrites and reloads.
    std::fs::write(config_dir.join("maps/hosts.map"), "edited.test be_web\n").unwrap();
    let text = expect_exit(&plan(dir.path(), "now", &[]), 4);
    assert!(text.contains("first_deploy: "), "{text}");
    assert!(
        text.contains("maps/hosts.map differs from the state record"),
        "{text}"
    );
}

#[test]
fn added_backends_are_runtime_changes_only_on_a_line_with_add_backend() {
    let next = vec![
        service("web", "127.0.0.1:9101", 1, false),
        service("api", "127.0.0.1:9201", 1, false),
    ];
    let dir = project(true, &[("now", &base()), ("next", &next)]);
    let plan = |version: &str| plan_next_over_now(dir.path(), &["--haproxy-version", version]);
    let text = expect_exit(&plan("3.4"), 3);
    assert_eq!(
        text,
        "now: runtime (2 commands)\n  backend be_api added from routes\n  maps/hosts.map contents\n"
    );
    let text = expect_exit(&plan("3.2"), 4);
    assert!(text.contains("HAProxy 3.2 has no `add backend`"), "{text}");
    expect_exit(&plan("three"), 2);
}

#[test]
fn a_bad_fixture_exits_1_naming_the_file_and_the_cause() {
    let broken = vec!["apiVersion: v1\nkind: Service\nmetadata: { name: [unclosed\n".to_owned()];
    let dir = project(false, &[("now", &base()), ("next", &broken)]);
    let output = plan_next_over_now(dir.path(), &[]);
    let text = expect_exit(&output, 1);
    let errors = stderr(&output);
    assert!(errors.contains("next/services/0.yaml"), "{errors}");
    assert!(text.is_empty(), "{text}");
}

#[test]
fn a_render_haproxy_rejects_exits_1() {
    // HAProxy takes weights up to 256.
    let bad = vec![service("web", "127.0.0.1:9101", 1000, false)];
    let dir = project(false, &[("now", &base()), ("next", &bad)]);
    let output = plan_next_over_now(dir.path(), &[]);
    expect_exit(&output, 1);
    assert!(stderr(&output).contains("weight"), "{}", stderr(&output));
}
