//! The status page in a real browser: headless Chromium loads `/` from a running
//! controller and the rendered DOM shows the components and the instance.
//!
//! Skipped (with a message) only when `/usr/bin/chromium` is missing and
//! `HAPWRIGHT_REQUIRE_BROWSER` is unset; `scripts/test.sh` installs Chromium and sets
//! the variable, so CI never skips.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hapwright_e2e::{Controller, Signal, poll, signal_group};

const CHROMIUM: &str = "/usr/bin/chromium";
const BROWSER_TIMEOUT: Duration = Duration::from_secs(90);

/// Chromium and every process it started (its own process group), killed on drop.
struct Browser {
    child: Child,
}

impl Drop for Browser {
    fn drop(&mut self) {
        signal_group(self.child.id(), Signal::KILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `chromium --dump-dom url`: the DOM after the page loaded.
fn dump_dom(url: &str) -> String {
    let work = tempfile::tempdir().expect("temporary directory");
    let profile = work.path().join("profile");
    let out = work.path().join("dom.html");
    let err = work.path().join("chromium.log");
    let child = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(url)
        .env("HOME", work.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("dom file"))
        .stderr(std::fs::File::create(&err).expect("log file"))
        .process_group(0)
        .spawn()
        .expect("start chromium");
    let mut browser = Browser { child };
    let status = poll(BROWSER_TIMEOUT, || browser.child.try_wait().ok().flatten());
    let log = std::fs::read_to_string(&err).unwrap_or_default();
    let status = status.unwrap_or_else(|waited| {
        panic!("chromium did not finish within {waited:?}; its log:\n{log}")
    });
    drop(browser);
    assert!(
        status.success(),
        "chromium failed: {status}; its log:\n{log}"
    );
    std::fs::read_to_string(&out).expect("read the DOM")
}

/// The part of `dom` from `<table id="{id}"` to its `</table>`.
fn table<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("<table id=\"{id}\""))
        .unwrap_or_else(|| panic!("no table #{id} in the DOM:\n{dom}"));
    let end = dom[start..]
        .find("</table>")
        .unwrap_or_else(|| panic!("table #{id} is not closed"));
    &dom[start..start + end]
}

/// The cells (inner HTML of each `<td>`) of every data row of a table.
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .split("<tr")
        .skip(1)
        .filter(|row| row.contains("<td"))
        .map(|row| {
            row.split("<td")
                .skip(1)
                .map(|cell| {
                    let start = cell.find('>').map_or(0, |i| i + 1);
                    let end = cell.find("</td>").unwrap_or(cell.len());
                    cell[start..end].trim().to_owned()
                })
                .collect()
        })
        .collect()
}

#[test]
fn status_page_renders_components_and_instances_in_chromium() {
    if !Path::new(CHROMIUM).exists() {
        assert!(
            std::env::var_os("HAPWRIGHT_REQUIRE_BROWSER").is_none(),
            "{CHROMIUM} is missing and HAPWRIGHT_REQUIRE_BROWSER is set"
        );
        println!("SKIPPED: {CHROMIUM} is not installed (scripts/test.sh installs it)");
        return;
    }
    let controller = Controller::start();
    let instance = controller.wait_deployed();
    let dom = dump_dom(&format!("http://127.0.0.1:{}/", controller.ports().status));

    assert!(dom.contains("<title>hapwright status</title>"), "{dom}");
    assert!(
        dom.contains(r#"<span class="badge success">ready</span>"#),
        "the page says ready:\n{dom}"
    );

    let components = rows(table(&dom, "components"));
    for name in [
        "config-watcher",
        "source/services",
        "source/endpoints",
        "debouncer",
        "executor",
        "renderer",
        "validator",
        "scheduler",
        "deployer",
    ] {
        let row = components
            .iter()
            .find(|row| row.first().map(String::as_str) == Some(name))
            .unwrap_or_else(|| panic!("no row for {name} in {components:#?}"));
        assert_eq!(
            row.get(1).map(String::as_str),
            Some(r#"<span class="badge healthy">healthy</span>"#),
            "{name}: {row:?}"
        );
    }

    let instances = rows(table(&dom, "instances"));
    assert_eq!(instances.len(), 1, "{instances:#?}");
    let row = &instances[0];
    assert_eq!(row[0], "local", "{row:?}");
    let strategy = instance.last_strategy.expect("a strategy");
    assert_eq!(
        row[2],
        format!(r#"<span class="badge {strategy}">{strategy}</span>"#),
        "{row:?}"
    );
    let hash = instance.last_hash.expect("a hash");
    assert_eq!(row[1], format!("<code>{}</code>", &hash[..12]), "{row:?}");
    assert_eq!(row[4], instance.reloads.to_string(), "reloads: {row:?}");
    assert_eq!(
        row[5],
        instance.deployments.to_string(),
        "deployments: {row:?}"
    );
}
