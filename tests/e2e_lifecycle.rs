//! Process lifecycle and availability: SIGTERM leaves nothing behind, and traffic
//! never fails while the configuration changes structure again and again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hapwright_e2e::{
    Controller, Reply, WAIT, accepts_connections, quick_pacing, replace_once, service_manifest,
};

const WEB: &str = "web.example.test";
const API: &str = "api.example.test";

#[test]
fn sigterm_shuts_down_cleanly_leaving_no_processes() {
    let mut controller = Controller::start();
    let master = controller.master();
    let mut expected = master.workers.clone();
    expected.push(master.master_pid);
    expected.sort_unstable();
    assert_eq!(controller.haproxy_pids(), expected);
    let ports = controller.ports();
    assert!(accepts_connections(ports.http) && accepts_connections(ports.status));

    let status = controller.terminate(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "clean exit: {status:?}");

    let left = controller.haproxy_pids();
    assert!(left.is_empty(), "HAProxy processes left behind: {left:?}");
    for pid in expected {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} still exists"
        );
    }
    for (what, port) in [
        ("HAProxy", ports.http),
        ("the status listener", ports.status),
    ] {
        assert!(!accepts_connections(port), "{what} still listens on {port}");
    }
    let log = controller.log_text();
    assert!(log.contains("Shutting down reason=\"SIGTERM\""), "{log}");
    assert!(log.contains("Managed HAProxy stopped"), "{log}");
}

/// What the request loop saw.
#[derive(Debug, Default)]
struct Traffic {
    requests: usize,
    failures: Vec<String>,
}

#[test]
fn no_request_fails_across_20_structural_changes() {
    const CHANGES: usize = 20;
    // Quicker pacing than the quickstart's, so 20 reloads take seconds. The ten
    // services removed within seconds are a mass removal the safety valve holds
    // (tests/e2e_safety.rs); this test is about reloads, so the valve is off.
    let controller = Controller::start_with(|config| {
        replace_once(
            &quick_pacing(config, "200ms"),
            "  logLevel: info\n",
            "  logLevel: info\n  safety: { maxRemoval: off }\n",
        )
    });
    let ports = controller.ports();
    let expected = [
        (WEB, controller.body(WEB)),
        (API, controller.demo_body(ports.api)),
    ];
    let base = controller.wait_deployed();
    let master = controller.master();
    let stop = AtomicBool::new(false);

    let traffic = std::thread::scope(|scope| {
        let looping = scope.spawn(|| {
            let mut traffic = Traffic::default();
            let deadline = Instant::now() + Duration::from_secs(150);
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                for (host, body) in &expected {
                    traffic.requests += 1;
                    match controller.route(host) {
                        Ok(Reply {
                            status: 200,
                            body: b,
                        }) if &b == body => {}
                        other => traffic.failures.push(format!("{host}: {other:?}")),
                    }
                }
            }
            traffic
        });
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for change in 0..CHANGES {
                // Ten new services, then the same ten removed: every change adds or
                // removes a backend, so every change is a reload.
                let (name, added) = if change < CHANGES / 2 {
                    (format!("loop-{change}"), true)
                } else {
                    (format!("loop-{}", change - CHANGES / 2), false)
                };
                let host = format!("{name}.example.test");
                let file = format!("{name}.yaml");
                if added {
                    controller.write_resource(&file, &service_manifest(&name, &host, ports.api));
                } else {
                    std::fs::remove_file(controller.resource_path(&file)).expect("remove");
                }
                let target = base.reloads + change as u64 + 1;
                controller.wait_until(&format!("reload for change {change}"), WAIT, || {
                    (controller.instance().reloads >= target).then_some(())
                });
                let want = if added { 200 } else { 404 };
                controller.wait_until(&format!("{host} answers {want}"), WAIT, || {
                    (controller.route(&host).ok()?.status == want).then_some(())
                });
            }
        }));
        stop.store(true, Ordering::SeqCst);
        let traffic = looping.join().expect("request loop");
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
        traffic
    });

    assert!(
        traffic.failures.is_empty(),
        "{} of {} requests failed: {:#?}",
        traffic.failures.len(),
        traffic.requests,
        traffic.failures
    );
    assert!(
        traffic.requests >= 4 * CHANGES,
        "the loop kept sending through every change: {traffic:?}"
    );
    let after = controller.wait_deployed();
    assert_eq!(
        after.reloads,
        base.reloads + CHANGES as u64,
        "one reload per change: {after:?}"
    );
    let now = controller.master();
    assert_eq!(now.master_pid, master.master_pid);
    assert_eq!(now.reloads, master.reloads + CHANGES as u64, "{now:?}");
    eprintln!(
        "{} requests across {CHANGES} reloads, none failed",
        traffic.requests
    );
}
