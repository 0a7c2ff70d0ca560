//! Change-plan decisions and reasons, without HAProxy.

use std::collections::BTreeMap;
use std::sync::Arc;

use hapwright_deployer::haproxy::plan::{RuntimeOp, compute};
use hapwright_eventbus::model::{DeployStrategy, ReloadReason, RenderedConfig, SourceMap};

fn render(backend: &str) -> RenderedConfig {
    let main = format!(
        "global\n    maxconn 100\n\ndefaults\n    mode http\n    default-server inter 3s\n\n{backend}"
    );
    let mut maps = BTreeMap::new();
    maps.insert("hosts.map".to_owned(), Arc::<str>::from("a be_a\n"));
    RenderedConfig::new(
        main,
        maps,
        BTreeMap::new(),
        BTreeMap::new(),
        SourceMap::default(),
    )
}

#[test]
fn added_server_gets_explicit_default_server_params() {
    let old =
        render("backend be_a\n    default-server check maxconn 7\n    server s1 10.0.0.1:80\n");
    let new = render(
        "backend be_a\n    default-server check maxconn 7\n    server s1 10.0.0.1:80\n    server s2 10.0.0.2:80 weight 5\n",
    );
    let plan = compute(&old, &new);
    assert_eq!(plan.strategy(), DeployStrategy::Runtime);
    let RuntimeOp::AddServer {
        params,
        health,
        enable,
        address,
        ..
    } = &plan.ops[0]
    else {
        panic!("{plan:?}");
    };
    assert_eq!(address, "10.0.0.2:80");
    assert_eq!(
        params,
        &["inter", "3s", "check", "maxconn", "7", "weight", "5"]
    );
    assert!(*health && *enable);
}

/// An abstract Unix socket (`abns@NAME`, as the Gateway API library's servers for
/// unusable backendRefs use) is an address `add server` takes; a path or a host
/// name is not.
#[test]
fn an_added_abstract_socket_server_is_runtime_a_path_or_host_name_reloads() {
    let old = render("backend be_a\n    server s1 10.0.0.1:80\n");
    let new = render(
        "backend be_a\n    server s1 10.0.0.1:80\n    server s2 abns@invalid-8404 weight 3\n",
    );
    let plan = compute(&old, &new);
    assert_eq!(plan.strategy(), DeployStrategy::Runtime, "{plan:?}");
    let RuntimeOp::AddServer {
        server, address, ..
    } = &plan.ops[0]
    else {
        panic!("{plan:?}");
    };
    assert_eq!(
        (server.as_str(), address.as_str()),
        ("s2", "abns@invalid-8404")
    );
    // Removing it again is a `del server`.
    let back = compute(&new, &old);
    assert_eq!(back.strategy(), DeployStrategy::Runtime, "{back:?}");
    for address in [
        "unix@/run/app.sock",
        "/run/app.sock",
        "app.internal:80",
        "abns@",
        "abns@a:80",
        "abns@a$b",
    ] {
        let new = render(&format!(
            "backend be_a\n    server s1 10.0.0.1:80\n    server s2 {address}\n"
        ));
        let plan = compute(&old, &new);
        assert_eq!(
            plan.reload.as_ref().map(|r| r.reload),
            Some(Some(ReloadReason::ServerOptions)),
            "{address}: {plan:?}"
        );
    }
}

/// A backend with `cookie ... dynamic` (its own or its defaults profile's): a server
/// added or moved is followed by `enable dynamic-cookie backend`, which HAProxy 2.6
/// needs to give the new server its cookie; removals and weights need none, nor does a
/// backend without dynamic cookies.
#[test]
fn added_servers_of_a_dynamic_cookie_backend_get_their_cookies_computed() {
    let profile = "defaults sticky\n    mode http\n    cookie S insert indirect nocache dynamic\n    dynamic-cookie-key k\n\n";
    let old = render(&format!(
        "{profile}backend be_a from sticky\n    server s1 10.0.0.1:80\n    server s2 10.0.0.2:80\n"
    ));
    let added = render(&format!(
        "{profile}backend be_a from sticky\n    server s1 10.0.0.1:80\n    server s2 10.0.0.2:80\n    server s3 10.0.0.3:80\n"
    ));
    let plan = compute(&old, &added);
    assert_eq!(plan.strategy(), DeployStrategy::Runtime);
    assert!(matches!(&plan.ops[0], RuntimeOp::AddServer { server, .. } if server == "s3"));
    assert_eq!(
        plan.ops[1..],
        [RuntimeOp::RefreshDynamicCookies {
            backend: "be_a".into()
        }]
    );
    let moved = render(&format!(
        "{profile}backend be_a from sticky\n    server s1 10.0.0.1:80\n    server s2 10.0.0.9:80\n"
    ));
    let plan = compute(&old, &moved);
    assert!(
        matches!(&plan.ops[0], RuntimeOp::MoveServer { .. }),
        "{plan:?}"
    );
    assert_eq!(plan.ops.len(), 2, "{plan:?}");
    assert!(matches!(
        &plan.ops[1],
        RuntimeOp::RefreshDynamicCookies { .. }
    ));
    let removed = render(&format!(
        "{profile}backend be_a from sticky\n    server s1 10.0.0.1:80 weight 3\n"
    ));
    let plan = compute(&old, &removed);
    assert!(
        !plan
            .ops
            .iter()
            .any(|op| matches!(op, RuntimeOp::RefreshDynamicCookies { .. })),
        "{plan:?}"
    );
    let plain_old = render("backend be_b\n    server s1 10.0.0.1:80\n");
    let plain_new = render("backend be_b\n    server s1 10.0.0.1:80\n    server s2 10.0.0.2:80\n");
    assert_eq!(compute(&plain_old, &plain_new).ops.len(), 1);
}

#[test]
fn static_algorithms_and_new_keywords_reload_with_a_reason() {
    let old = render("backend be_x\n    balance static-rr\n    server s1 10.0.0.1:80\n");
    let added = render(
        "backend be_x\n    balance static-rr\n    server s1 10.0.0.1:80\n    server s2 10.0.0.2:80\n",
    );
    let plan = compute(&old, &added);
    assert_eq!(
        plan.reload.as_ref().unwrap().reload,
        Some(ReloadReason::Structure)
    );

    let keyword = render(
        "backend be_x\n    balance static-rr\n    option httpchk\n    server s1 10.0.0.1:80\n",
    );
    let plan = compute(&old, &keyword);
    assert_eq!(
        plan.reason().detail,
        "backend be_x: new keyword `option httpchk`"
    );

    let options = render("backend be_x\n    balance static-rr\n    server s1 10.0.0.1:80 check\n");
    let plan = compute(&old, &options);
    assert_eq!(plan.reason().reload, Some(ReloadReason::ServerOptions));
}

#[test]
fn address_weight_and_state_changes_are_runtime() {
    let old = render("backend be_a\n    server s1 10.0.0.1:80\n");
    let new = render("backend be_a\n    server s1 10.0.0.9:81 weight 3 disabled\n");
    let plan = compute(&old, &new);
    assert_eq!(plan.strategy(), DeployStrategy::Runtime);
    let described: Vec<String> = plan.ops.iter().map(RuntimeOp::describe).collect();
    assert_eq!(
        described,
        vec![
            "server be_a/s1 moved to 10.0.0.9:81",
            "server be_a/s1 weight 3",
            "server be_a/s1 state maint",
        ]
    );
    assert!(
        plan.changed_servers
            .contains(&("be_a".to_owned(), "s1".to_owned()))
    );
    // A host name cannot be set at runtime.
    let fqdn = render("backend be_a\n    server s1 app.internal:80\n");
    assert_eq!(
        compute(&old, &fqdn).reason().reload,
        Some(ReloadReason::ServerOptions)
    );
}

#[test]
fn a_weight_change_under_a_static_balance_algorithm_reloads() {
    // HAProxy refuses `set server be_h/s1 weight 5` there: "Backend is using a static
    // LB algorithm and only accepts weights '0%' and '100%'".
    let old = render("backend be_h\n    balance source\n    server s1 10.0.0.1:80 weight 2\n");
    let new = render("backend be_h\n    balance source\n    server s1 10.0.0.1:80 weight 5\n");
    let plan = compute(&old, &new);
    assert_eq!(plan.reason().reload, Some(ReloadReason::ServerOptions));
    assert!(
        plan.reason().detail.contains("cannot change weights"),
        "{:?}",
        plan.reason()
    );
    // With consistent hashing the algorithm is dynamic: a runtime change.
    let consistent = |weight: u32| {
        render(&format!(
            "backend be_h\n    balance source\n    hash-type consistent\n    server s1 10.0.0.1:80 weight {weight}\n"
        ))
    };
    assert_eq!(
        compute(&consistent(2), &consistent(5)).strategy(),
        DeployStrategy::Runtime
    );
}

#[test]
fn unchanged_or_comment_only_renders_are_noops() {
    let old = render("backend be_a\n    server s1 10.0.0.1:80\n");
    assert_eq!(compute(&old, &old).strategy(), DeployStrategy::Noop);
    let commented = render("# routing\nbackend be_a\n    server s1 10.0.0.1:80 # main\n");
    assert_eq!(compute(&old, &commented).strategy(), DeployStrategy::Noop);
}

#[test]
fn a_changed_file_that_is_not_a_pattern_file_reloads_with_the_reason() {
    let with_files = |crt_list: &str, acl: &str| {
        let main = "global\n    maxconn 100\n\nfrontend f\n    mode http\n    bind :8443 ssl crt-list files/tls.crtlist\n    acl blocked src -f files/blocked.acl\n    http-request deny if blocked\n";
        let mut files = BTreeMap::new();
        files.insert("tls.crtlist".to_owned(), Arc::<str>::from(crt_list));
        files.insert("blocked.acl".to_owned(), Arc::<str>::from(acl));
        RenderedConfig::new(
            main.to_owned(),
            BTreeMap::new(),
            files,
            BTreeMap::new(),
            SourceMap::default(),
        )
    };
    let old = with_files("certs/a.pem\n", "10.0.0.1\n");

    let acl_only = compute(&old, &with_files("certs/a.pem\n", "10.0.0.2\n"));
    assert_eq!(acl_only.strategy(), DeployStrategy::Runtime);
    assert!(matches!(
        &acl_only.ops[..],
        [RuntimeOp::ReplacePatterns { file, .. }] if file == "files/blocked.acl"
    ));

    let crt_list = compute(
        &old,
        &with_files("certs/a.pem\ncerts/b.pem\n", "10.0.0.1\n"),
    );
    let reload = crt_list.reload.as_ref().unwrap();
    assert_eq!(reload.reload, Some(ReloadReason::NewFile));
    // The new line names a certificate hapwright does not render: only a reload
    // loads it (crt-list changes with rendered certificates apply at runtime, see
    // runtime_certificates.rs).
    assert!(
        reload
            .detail
            .contains("a crt-list names certs/b.pem, which hapwright does not render"),
        "{reload:?}"
    );
}

#[test]
fn address_changes_move_through_a_stand_in_without_shutting_sessions() {
    let old = render("backend be_a\n    server s1 10.0.0.1:80 check cookie a\n");
    let new = render("backend be_a\n    server s1 10.0.0.9:81 check cookie a\n");
    let plan = compute(&old, &new);
    assert_eq!(
        plan.strategy(),
        DeployStrategy::Runtime,
        "{:?}",
        plan.reason()
    );
    // The stand-in takes the defaults' words explicitly, without the health check
    // (it must take traffic at once) and without what `add server` refuses.
    assert_eq!(
        plan.ops,
        vec![RuntimeOp::MoveServer {
            backend: "be_a".into(),
            server: "s1".into(),
            addr: "10.0.0.9".into(),
            port: Some(81),
            params: vec!["inter".into(), "3s".into()],
        }]
    );

    // A server in maintenance takes no traffic: the address alone is enough.
    let old = render("backend be_a\n    server s1 10.0.0.1:80 disabled\n");
    let new = render("backend be_a\n    server s1 10.0.0.9:80 disabled\n");
    let plan = compute(&old, &new);
    assert_eq!(
        plan.ops.iter().map(RuntimeOp::describe).collect::<Vec<_>>(),
        vec!["server be_a/s1 address 10.0.0.9:80"]
    );

    // Without a dynamic balance algorithm there is no stand-in: a reload moves it.
    let old = render("backend be_a\n    balance static-rr\n    server s1 10.0.0.1:80\n");
    let new = render("backend be_a\n    balance static-rr\n    server s1 10.0.0.9:80\n");
    let plan = compute(&old, &new);
    assert_eq!(plan.strategy(), DeployStrategy::Reload);
    assert_eq!(plan.reason().reload, Some(ReloadReason::ServerOptions));
    assert!(
        plan.reason().detail.contains("stand-in"),
        "{}",
        plan.reason().detail
    );
}

#[test]
fn removed_servers_are_one_drained_delete() {
    let old = render("backend be_a\n    server s1 10.0.0.1:80\n    server s2 10.0.0.2:80\n");
    let new = render("backend be_a\n    server s1 10.0.0.1:80\n");
    let plan = compute(&old, &new);
    assert_eq!(
        plan.ops,
        vec![RuntimeOp::DelServer {
            backend: "be_a".into(),
            server: "s2".into(),
        }]
    );
}
