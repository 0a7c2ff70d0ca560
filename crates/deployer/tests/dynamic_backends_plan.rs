//! Plans of added and removed `backend NAME from PROFILE` sections (dynamic backends,
//! HAProxy 3.4), without HAProxy: which renders become runtime changes, in which
//! order, and the reason of every one that reloads.

use std::collections::BTreeMap;
use std::sync::Arc;

use hapwright_deployer::client::master::Version;
use hapwright_deployer::haproxy::backends::Capability;
use hapwright_deployer::haproxy::plan::{NewServer, PlanOptions, RuntimeOp, compute_with};
use hapwright_eventbus::model::{DeployStrategy, ReloadReason, RenderedConfig, SourceMap};

const HEAD: &str = "global\n    maxconn 100\n\n\
    defaults routes\n    mode http\n    balance roundrobin\n    default-server inter 3s maxconn 50\n    timeout client 5s\n    timeout server 5s\n    timeout connect 1s\n\n\
    frontend fe\n    bind 127.0.0.1:8080\n    use_backend %[req.hdr(host),lower,map(maps/hosts.map)]\n\n";

fn render(backends: &str, hosts: &str) -> RenderedConfig {
    let mut maps = BTreeMap::new();
    maps.insert("hosts.map".to_owned(), Arc::<str>::from(hosts));
    RenderedConfig::new(
        format!("{HEAD}{backends}"),
        maps,
        BTreeMap::new(),
        BTreeMap::new(),
        SourceMap::default(),
    )
}

fn on() -> PlanOptions {
    PlanOptions {
        dynamic_backends: Capability::On,
    }
}

const A: &str = "backend be_a from routes\n    server s1 10.0.0.1:80\n\n";
const B: &str = "backend be_b from routes\n    server s1 10.0.0.2:80 check\n    server s2 10.0.0.3:80 disabled\n\n";

#[test]
fn an_added_backend_runs_and_is_published_before_its_map_entry() {
    let old = render(A, "a.test be_a\n");
    let new = render(&format!("{A}{B}"), "a.test be_a\nb.test be_b\n");
    let plan = compute_with(&old, &new, &on());
    assert_eq!(
        plan.strategy(),
        DeployStrategy::Runtime,
        "{:?}",
        plan.reason()
    );
    assert_eq!(
        plan.ops[0],
        RuntimeOp::AddBackend {
            backend: "be_b".to_owned(),
            profile: "routes".to_owned(),
            servers: vec![
                NewServer {
                    server: "s1".to_owned(),
                    address: "10.0.0.2:80".to_owned(),
                    params: ["inter", "3s", "maxconn", "50", "check"]
                        .map(str::to_owned)
                        .to_vec(),
                    enable: true,
                    health: true,
                },
                NewServer {
                    server: "s2".to_owned(),
                    address: "10.0.0.3:80".to_owned(),
                    params: ["inter", "3s", "maxconn", "50"].map(str::to_owned).to_vec(),
                    enable: false,
                    health: false,
                },
            ],
        }
    );
    assert!(
        matches!(&plan.ops[1], RuntimeOp::ReplacePatterns { file, .. } if file == "maps/hosts.map")
    );
    assert_eq!(plan.ops.len(), 2);
    assert_eq!(
        plan.reason().detail,
        "runtime: backend be_b added from routes, maps/hosts.map contents"
    );
}

#[test]
fn a_removed_backend_goes_after_its_map_entry() {
    let old = render(&format!("{A}{B}"), "a.test be_a\nb.test be_b\n");
    let new = render(A, "a.test be_a\n");
    let plan = compute_with(&old, &new, &on());
    assert_eq!(
        plan.strategy(),
        DeployStrategy::Runtime,
        "{:?}",
        plan.reason()
    );
    assert!(matches!(&plan.ops[0], RuntimeOp::ReplacePatterns { .. }));
    assert_eq!(
        plan.ops[1],
        RuntimeOp::DelBackend {
            backend: "be_b".to_owned()
        }
    );
    assert_eq!(plan.ops[1].object(), "backend");
}

#[test]
fn adds_removals_and_endpoint_changes_plan_together() {
    let old = render(A, "a.test be_a\n");
    let a_moved_weight = "backend be_a from routes\n    server s1 10.0.0.1:80 weight 7\n\n";
    let new = render(
        &format!("{B}{a_moved_weight}"),
        "a.test be_a\nb.test be_b\n",
    );
    let plan = compute_with(&old, &new, &on());
    assert_eq!(
        plan.strategy(),
        DeployStrategy::Runtime,
        "{:?}",
        plan.reason()
    );
    let described: Vec<String> = plan.ops.iter().map(RuntimeOp::describe).collect();
    assert_eq!(
        described,
        [
            "backend be_b added from routes",
            "server be_a/s1 weight 7",
            "maps/hosts.map contents"
        ]
    );
}

#[test]
fn without_the_option_an_added_backend_reloads_as_before() {
    let old = render(A, "a.test be_a\n");
    let new = render(&format!("{A}{B}"), "a.test be_a\nb.test be_b\n");
    let plan = compute_with(&old, &new, &PlanOptions::default());
    assert_eq!(plan.strategy(), DeployStrategy::Reload);
    assert_eq!(plan.reason().detail, "backend be_b added");
}

#[test]
fn a_line_without_add_backend_reloads_and_says_why() {
    let old = render(A, "a.test be_a\n");
    let new = render(&format!("{A}{B}"), "a.test be_a\nb.test be_b\n");
    let options = PlanOptions {
        dynamic_backends: Capability::for_line(true, Some(Version { major: 3, minor: 2 })),
    };
    let plan = compute_with(&old, &new, &options);
    assert_eq!(plan.strategy(), DeployStrategy::Reload);
    let reason = plan.reason();
    assert_eq!(reason.reload, Some(ReloadReason::Structure));
    assert_eq!(
        reason.detail,
        "backend be_b added; HAProxy 3.2 has no `add backend` (dynamicBackends needs 3.4 or later)"
    );
    assert_eq!(
        Capability::for_line(true, Some(Version { major: 3, minor: 4 })),
        Capability::On
    );
    assert_eq!(
        Capability::for_line(false, Some(Version { major: 3, minor: 4 })),
        Capability::Off
    );
}

/// Every form that `add backend` cannot create reloads, naming the backend and why.
#[test]
fn backends_runtime_cannot_create_reload_with_the_reason() {
    let cases = [
        (
            "backend be_b from routes\n    server s1 10.0.0.2:80\n    http-request set-header X 1\n\n",
            "backend be_b added; it cannot be added at runtime: line 21 `http-request set-header X 1`: only `server` lines can be created at runtime",
        ),
        (
            "backend be_b\n    server s1 10.0.0.2:80\n\n",
            "backend be_b added; it cannot be added at runtime: it is not of the form `backend NAME from PROFILE`",
        ),
        (
            "backend be_b from routes\n    server s1 app.internal:80\n\n",
            "backend be_b added; it cannot be added at runtime: server s1 address `app.internal` is not IP:port",
        ),
        (
            "backend be_b from routes\n    server s1 10.0.0.2:80 cookie s1\n\n",
            "backend be_b added; it cannot be added at runtime: server s1 has `cookie`, which `add server` refuses",
        ),
        (
            "backend be_b from routes\n    server s1 10.0.0.2:80\n    server s1 10.0.0.3:80\n\n",
            "backend be_b added; it cannot be added at runtime: duplicate server name s1",
        ),
        (
            "frontend fe_b\n    bind 127.0.0.1:8081\n\n",
            "frontend fe_b added",
        ),
    ];
    for (added, reason) in cases {
        let old = render(A, "a.test be_a\n");
        let new = render(&format!("{A}{added}"), "a.test be_a\n");
        let plan = compute_with(&old, &new, &on());
        assert_eq!(plan.strategy(), DeployStrategy::Reload, "{added}");
        assert_eq!(plan.reason().detail, reason);
    }
}

#[test]
fn a_profile_changed_by_the_render_reloads() {
    let old = render(A, "a.test be_a\n");
    let mut new = render(&format!("{A}{B}"), "a.test be_a\nb.test be_b\n")
        .main()
        .to_string();
    new = new.replace("timeout server 5s", "timeout server 9s");
    let new = RenderedConfig::new(
        new,
        [(
            "hosts.map".to_owned(),
            Arc::<str>::from("a.test be_a\nb.test be_b\n"),
        )]
        .into_iter()
        .collect(),
        BTreeMap::new(),
        BTreeMap::new(),
        SourceMap::default(),
    );
    let plan = compute_with(&old, &new, &on());
    assert_eq!(plan.strategy(), DeployStrategy::Reload);
    assert_eq!(
        plan.reason().detail,
        "defaults routes: `timeout server 5s` changed to `timeout server 9s`"
    );
}

#[test]
fn a_profile_without_mode_or_a_static_balance_reloads() {
    let no_mode = HEAD.replace("    mode http\n", "");
    let old = RenderedConfig::new(
        format!("{no_mode}{A}"),
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
        SourceMap::default(),
    );
    let new = RenderedConfig::new(
        format!("{no_mode}{A}{B}"),
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
        SourceMap::default(),
    );
    let plan = compute_with(&old, &new, &on());
    assert_eq!(
        plan.reason().detail,
        "backend be_b added; it cannot be added at runtime: `defaults routes` sets no `mode`, which `add backend` needs"
    );
    let static_rr = HEAD.replace("balance roundrobin", "balance static-rr");
    let old = RenderedConfig::new(
        format!("{static_rr}{A}"),
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
        SourceMap::default(),
    );
    let new = RenderedConfig::new(
        format!("{static_rr}{A}{B}"),
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
        SourceMap::default(),
    );
    let plan = compute_with(&old, &new, &on());
    assert_eq!(
        plan.reason().detail,
        "backend be_b added; it cannot be added at runtime: balance `static-rr` cannot add servers at runtime"
    );
}

#[test]
fn a_backend_moved_between_others_is_still_a_runtime_change_but_reordering_reloads() {
    let c = "backend be_c from routes\n    server s1 10.0.0.9:80\n\n";
    // be_b added between be_a and be_c: the kept sections keep their order.
    let old = render(&format!("{A}{c}"), "");
    let new = render(&format!("{A}{B}{c}"), "");
    assert_eq!(
        compute_with(&old, &new, &on()).strategy(),
        DeployStrategy::Runtime
    );
    // be_a and be_c swapped while be_b is added: a reload.
    let new = render(&format!("{c}{B}{A}"), "");
    let plan = compute_with(&old, &new, &on());
    assert_eq!(plan.strategy(), DeployStrategy::Reload);
    assert_eq!(plan.reason().detail, "sections reordered");
}
