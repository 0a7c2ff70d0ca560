//! File sets through `hapwright check`, `render` and `test`: the real binary on a
//! small config whose `files` entry renders one page per Service, and the real
//! `haproxy -c` behind `render`.

#[macro_use]
mod support;

use support::{stderr, stdout};

const CONFIG: &str = concat!(
    watched_services!(),
    r#"    indexBy: [metadata.namespace, metadata.name]
"#,
    haproxy_config_start!(),
    r#"    frontend fe
        bind 127.0.0.1:18081
        http-request return status 200 content-type text/plain string ok
files:
  pages:
    forEach: "resources.services.list()"
    name: "{{ item.metadata.namespace }}_{{ item.metadata.name }}.txt"
    template: "page of {{ item.metadata.name }}\n"
haproxy: { binary: haproxy }
"#
);

fn service(namespace: &str, name: &str) -> String {
    format!("apiVersion: v1\nkind: Service\nmetadata:\n  namespace: {namespace}\n  name: {name}\n")
}

#[test]
fn check_render_and_test_support_file_sets() {
    let tests = r#"
validationTests:
  pages:
    fixtures:
      services:
        - { apiVersion: v1, kind: Service, metadata: { namespace: shop, name: web } }
    assertions:
      - { type: equals, target: files/shop_web.txt, expected: "page of web\n" }
      - { type: contains, target: "file:shop_web.txt", pattern: "web" }
"#;
    let dir = support::project(&format!("{CONFIG}{tests}"));
    let output = support::hapwright(dir.path(), &["check", "-c", "hapwright.yaml"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

    std::fs::write(
        dir.path().join("resources/svc.yaml"),
        format!("{}---\n{}", service("shop", "web"), service("blog", "www")),
    )
    .unwrap();
    let output = support::hapwright(
        dir.path(),
        &["render", "-c", "hapwright.yaml", "--out", "out"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let out = dir.path().join("out/files");
    assert_eq!(
        std::fs::read_to_string(out.join("shop_web.txt")).unwrap(),
        "page of web\n"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("blog_www.txt")).unwrap(),
        "page of www\n"
    );

    let output = support::hapwright(dir.path(), &["test", "-c", "hapwright.yaml"]);
    assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
    assert!(
        stdout(&output).ends_with("1 passed, 0 failed\n"),
        "{}",
        stdout(&output)
    );
}

#[test]
fn render_names_the_objects_behind_a_duplicate_or_hostile_file_name() {
    let config = CONFIG.replace(
        "{{ item.metadata.namespace }}_{{ item.metadata.name }}.txt",
        "{{ item.metadata.name }}.txt",
    );
    let dir = support::project(&config);
    std::fs::write(
        dir.path().join("resources/svc.yaml"),
        format!("{}---\n{}", service("shop", "web"), service("blog", "web")),
    )
    .unwrap();
    let output = support::hapwright(dir.path(), &["render", "-c", "hapwright.yaml"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains(
            "files.pages: Service shop/web and Service blog/web both render files/web.txt"
        ),
        "{err}"
    );
    // Located at the set's template in the config file.
    assert!(err.contains("hapwright.yaml:"), "{err}");
}

#[test]
fn check_rejects_half_a_file_set_and_sets_outside_the_file_sections() {
    let config = CONFIG
        .replace(
            "    name: \"{{ item.metadata.namespace }}_{{ item.metadata.name }}.txt\"\n",
            "",
        )
        .replace(
            "haproxyConfig:\n  template:",
            "haproxyConfig:\n  forEach: \"[1]\"\n  template:",
        );
    let dir = support::project(&config);
    let output = support::hapwright(dir.path(), &["check", "-c", "hapwright.yaml"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("files.pages.forEach: a file set needs `name` too"),
        "{err}"
    );
    assert!(
        err.contains(
            "haproxyConfig.forEach: only maps, files and sslCertificates entries may be file sets"
        ),
        "{err}"
    );
}
