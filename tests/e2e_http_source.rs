//! An `http` source end to end: `hapwright run` fetches an IP allow list from an HTTP
//! server started here, renders it into a map that HAProxy checks every request
//! against, and deploys new lists through the runtime API. A list that fails
//! validation is rejected as a whole: the last accepted list stays live, and the
//! source says why.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use hapwright_e2e::{Controller, Value, WAIT, master_command, replace_once, service_manifest};

/// A plain HTTP server on 127.0.0.1 that answers every request with the current
/// list. Stops when dropped.
struct ListServer {
    port: u16,
    body: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ListServer {
    fn start(body: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the list server");
        let port = listener.local_addr().expect("address").port();
        let body = Arc::new(Mutex::new(body.to_owned()));
        let stop = Arc::new(AtomicBool::new(false));
        let (served, stopping) = (body.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().expect("clone stream"));
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let body = served.lock().unwrap().clone();
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(body.as_bytes());
            }
        });
        Self {
            port,
            body,
            stop,
            thread: Some(thread),
        }
    }

    fn serve(&self, body: &str) {
        *self.body.lock().unwrap() = body.to_owned();
    }
}

impl Drop for ListServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The quickstart plus the `allow` resource fetched from `port`, rendered into
/// `maps/allow.map`, and a rule that answers 403 to clients not on the list.
fn with_allow_list(config: &str, port: u16) -> String {
    let config = replace_once(
        config,
        "watchedResources:\n",
        &format!(
            "watchedResources:\n  allow:\n    http: {{ url: \"http://127.0.0.1:{port}/allow.txt\", format: lines, interval: 1s }}\n    indexBy: [line]\n"
        ),
    );
    let config = replace_once(
        &config,
        "        bind 127.0.0.1:${HTTP_PORT}\n",
        "        bind 127.0.0.1:${HTTP_PORT}\n        http-request deny deny_status 403 unless { src,map_ip({{ path(\"allow.map\") }}) -m found }\n",
    );
    replace_once(
        &config,
        "maps:\n",
        "maps:\n  allow.map:\n    template: |\n      {%- for entry in resources.allow.list() %}\n      {{ entry.line }} allowed\n      {%- endfor %}\n",
    )
}

fn status(controller: &Controller) -> u16 {
    controller
        .route("web.example.test")
        .unwrap_or_else(|e| controller.fail(&format!("request through HAProxy: {e}")))
        .status
}

fn wait_status(controller: &Controller, expected: u16) {
    controller.wait_until(&format!("HAProxy answers {expected}"), WAIT, || {
        (status(controller) == expected).then_some(())
    });
}

fn source_health(controller: &Controller) -> (String, String) {
    let components = controller.json("/debug/components");
    let source = components
        .as_array()
        .and_then(|all| {
            all.iter()
                .find(|c| c.get("name").and_then(Value::as_str) == Some("source/allow"))
        })
        .cloned()
        .unwrap_or_else(|| controller.fail(&format!("no source/allow in {components}")));
    let text = |key: &str| {
        source
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    (text("health"), text("reason"))
}

fn state(controller: &Controller, state: &str) -> f64 {
    controller.metric(&format!(
        "hapwright_http_source_state{{resource=\"allow\",state=\"{state}\"}}"
    ))
}

#[test]
fn a_list_that_fails_validation_is_rejected_whole_and_the_accepted_one_stays_live() {
    let server = ListServer::start("# who may connect\n127.0.0.1/32\n");
    let controller = Controller::start_with(|config| with_allow_list(config, server.port));
    let first = controller.wait_deployed();
    assert_eq!(status(&controller), 200, "127.0.0.1 is on the list");
    controller.wait_until("the first list is accepted", WAIT, || {
        (state(&controller, "accepted") == 1.0).then_some(())
    });

    // A new list without 127.0.0.1 goes live through the runtime API.
    server.serve("10.0.0.0/8\n");
    wait_status(&controller, 403);
    let after = controller.wait_deployed();
    assert_eq!(after.reloads, first.reloads, "a new list needs no reload");
    assert_eq!(after.last_strategy.as_deref(), Some("runtime"));

    // A list with one line HAProxy refuses: rejected as a whole. Its valid line
    // (127.0.0.1) does not go live on its own, the accepted list stays.
    server.serve("127.0.0.1/32\n300.1.2.3/8\n");
    let reason = controller.wait_until("the source reports the rejection", WAIT, || {
        let (health, reason) = source_health(&controller);
        (health == "degraded").then_some(reason)
    });
    assert!(
        reason.contains("failed validation") && reason.contains("300.1.2.3"),
        "{reason}"
    );
    assert_eq!(state(&controller, "rejected"), 1.0);
    let page = controller.status_page();
    assert!(
        page.contains("failed validation and is not used"),
        "the status page shows why"
    );
    assert_eq!(
        status(&controller),
        403,
        "the last accepted list stays live"
    );
    let quarantine = controller.status_get("/debug/quarantine").1;
    assert!(
        quarantine.contains("\"allow\"") && quarantine.contains("payload"),
        "one quarantine entry for the whole list: {quarantine}"
    );

    // Other sources' changes still go out meanwhile.
    controller.write_resource(
        "extra.yaml",
        &service_manifest("extra", "extra.example.test", controller.ports().api),
    );
    controller.wait_until("the new service is deployed", WAIT, || {
        let rendered = controller.json("/debug/rendered");
        let deployed = controller.instance().last_hash;
        (rendered.to_string().contains("extra.example.test")
            && deployed.as_deref() == rendered.get("hash").and_then(Value::as_str))
        .then_some(())
    });
    assert_eq!(status(&controller), 403);
    assert_eq!(source_health(&controller).0, "degraded");

    // A good list is accepted and goes live.
    server.serve("127.0.0.0/8\n");
    wait_status(&controller, 200);
    controller.wait_until("the source is healthy again", WAIT, || {
        (source_health(&controller).0 == "healthy" && state(&controller, "accepted") == 1.0)
            .then_some(())
    });
}

#[test]
fn a_hundred_thousand_line_list_reaches_haproxy_without_a_reload() {
    let server = ListServer::start("127.0.0.1/32\n");
    let controller = Controller::start_with(|config| with_allow_list(config, server.port));
    let first = controller.wait_deployed();
    assert_eq!(status(&controller), 200);

    let list: String = (0..100_000u32)
        .map(|i| format!("10.{}.{}.{}/32\n", i >> 16, (i >> 8) & 0xff, i & 0xff))
        .collect();
    server.serve(&list);
    wait_status(&controller, 403);
    let after = controller.wait_deployed();
    assert_eq!(
        after.reloads, first.reloads,
        "100,000 entries need no reload"
    );
    assert_eq!(after.last_strategy.as_deref(), Some("runtime"));
    let entries = master_command(&controller.master_socket(), "@1 show map maps/allow.map")
        .unwrap_or_else(|e| controller.fail(&format!("show map: {e}")));
    assert_eq!(
        entries.lines().filter(|l| !l.trim().is_empty()).count(),
        100_000,
        "HAProxy holds every entry"
    );
}
