//! Route propagation (issue 37): a new Service with its host, from the file write to
//! the first answer from it, and its removal, from the file's deletion to the first
//! answer without it (the quickstart's `no route` 404), at one size. With
//! `dynamic`, the quickstart renders its per-Service backends as `backend NAME from
//! routes` and runs with `haproxy.dynamicBackends: true`, so on HAProxy 3.4 neither
//! change reloads (nor waits for `haproxy -c`: the render passes phase 2 by
//! equivalence); without it, or on an older line, each change is a reload.

use std::time::Instant;

use hapwright_e2e::{Controller, Reply, service_manifest};

use crate::scenarios::{
    CHANGE_TIMEOUT, Latency, first_answer, host, metric_sum, metrics, pause, start_with,
    wait_deployed,
};

/// What one size measured.
#[derive(Clone, Debug)]
pub struct Propagation {
    /// Write → first answer from the new Service.
    pub add: Latency,
    /// Deletion → first answer without it.
    pub remove: Latency,
    /// Reloads during the changes (`hapwright_reloads_total`).
    pub reloads: f64,
    /// Runtime deployments during the changes.
    pub runtime_deployments: f64,
}

/// The quickstart with its backends as `backend NAME from routes` (a named profile
/// before the unnamed `defaults`) and `haproxy.dynamicBackends: true`.
pub fn dynamic_quickstart(config: &str) -> String {
    let defaults = "    defaults\n        mode http\n        log global\n        timeout connect 2s\n        timeout client 30s\n        timeout server 30s\n";
    let backend = "      backend be_{{ ns }}_{{ name }}\n          balance roundrobin\n";
    let haproxy = "haproxy:\n  binary: haproxy\n";
    for part in [defaults, backend, haproxy] {
        assert!(
            config.contains(part),
            "examples/quickstart/hapwright.yaml no longer has {part:?}: update the route propagation scenario"
        );
    }
    let profile = defaults.replacen(
        "    defaults\n",
        "    defaults routes\n        balance roundrobin\n",
        1,
    );
    config
        .replacen(defaults, &format!("{profile}\n{defaults}"), 1)
        .replacen(
            backend,
            "      backend be_{{ ns }}_{{ name }} from routes\n",
            1,
        )
        .replacen(
            haproxy,
            "haproxy:\n  binary: haproxy\n  dynamicBackends: true\n",
            1,
        )
}

/// Waits until `host` answers 404 (no route), returning the time since `since`.
fn first_no_route(controller: &Controller, host: &str, since: Instant) -> f64 {
    loop {
        if let Ok(Reply { status: 404, .. }) = controller.route(host) {
            return since.elapsed().as_secs_f64() * 1_000.0;
        }
        if since.elapsed() > CHANGE_TIMEOUT {
            controller.fail(&format!("{host} was never removed"));
        }
    }
}

/// `changes` Services added, then removed again, one at a time, at `backends`.
pub fn route_propagation(backends: usize, changes: usize, dynamic: bool) -> Propagation {
    let (controller, settings) = if dynamic {
        start_with(backends, dynamic_quickstart)
    } else {
        start_with(backends, str::to_owned)
    };
    let ports = controller.ports();
    let body = controller.demo_body(ports.api);
    let path = if dynamic { "dynamic" } else { "reload" };
    let mut add = Latency {
        backends,
        path: format!("add ({path})"),
        samples_ms: Vec::new(),
    };
    let mut remove = Latency {
        backends,
        path: format!("remove ({path})"),
        samples_ms: Vec::new(),
    };
    let before = metrics(&controller);
    // Spacing between changes so that each starts from a settled controller, outside
    // the min-interval windows.
    let spacing = settings
        .min_reload_interval_ms
        .max(settings.min_deployment_interval_ms)
        + settings.debounce_ms;
    for k in 0..changes {
        let name = format!("route-{k}");
        let file = format!("{name}.yaml");
        let started = Instant::now();
        controller.write_resource(&file, &service_manifest(&name, &host(&name), ports.api));
        add.samples_ms.push(first_answer(
            &controller,
            &host(&name),
            &body,
            started,
            CHANGE_TIMEOUT,
        ));
        wait_deployed(&controller);
        pause(spacing);
        let started = Instant::now();
        std::fs::remove_file(controller.resource_path(&file)).expect("remove the Service");
        remove
            .samples_ms
            .push(first_no_route(&controller, &host(&name), started));
        wait_deployed(&controller);
        pause(spacing);
    }
    let after = metrics(&controller);
    Propagation {
        add,
        remove,
        reloads: metric_sum(&after, "hapwright_reloads_total", "")
            - metric_sum(&before, "hapwright_reloads_total", ""),
        runtime_deployments: metric_sum(&after, "hapwright_deployments_total", "runtime")
            - metric_sum(&before, "hapwright_deployments_total", "runtime"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_quickstart_edit_gives_the_dynamic_form() {
        let config = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/quickstart/hapwright.yaml"
        ))
        .unwrap();
        let edited = super::dynamic_quickstart(&config);
        assert!(
            edited.contains("    defaults routes\n        balance roundrobin\n        mode http\n")
        );
        assert!(
            edited
                .contains("      backend be_{{ ns }}_{{ name }} from routes\n      {%- for slice")
        );
        assert!(edited.contains("  dynamicBackends: true\n"));
    }
}
