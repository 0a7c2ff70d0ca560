//! Phase 2 by equivalence for added and removed `backend NAME from PROFILE` sections,
//! against the real `haproxy -c`: random route adds and removals (with endpoint and
//! weight changes) are passed by the rule, so a new route is not held back by
//! HAProxy's start-up, and every render the rule passes is accepted by `haproxy -c`;
//! added or removed backends outside the rule are never passed.
//!
//! The random test prints its seed on failure; `HAPWRIGHT_EQUIVALENCE_SEED` replays it.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;

use hapwright_deployer::component::validator::equivalence::{self, Baseline, Equivalence};
use hapwright_deployer::component::validator::{self};
use hapwright_eventbus::model::{RenderedConfig, SourceMap};
use support::random::{Draw, seed};
use support::validator_settings as settings;

const HEAD: &str = "global\n    maxconn 100\n\n\
defaults routes\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\n\
defaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\n\
frontend fe\n    bind 127.0.0.1:18080\n    use_backend %[req.hdr(host),lower,map(maps/hosts.map,be_default)]\n    default_backend be_default\n\n\
backend be_default\n    http-request return status 404\n\n";

/// Routes: name → its server lines' words after `server`.
fn render(routes: &BTreeMap<String, Vec<String>>, extra: &str) -> RenderedConfig {
    let mut main = HEAD.to_owned();
    let mut hosts = String::new();
    for (name, servers) in routes {
        main.push_str(&format!("backend be_{name} from routes\n"));
        for server in servers {
            main.push_str(&format!("    server {server}\n"));
        }
        main.push('\n');
        hosts.push_str(&format!("{name}.test be_{name}\n"));
    }
    main.push_str(extra);
    RenderedConfig::new(
        main,
        [("hosts.map".to_owned(), Arc::<str>::from(hosts))]
            .into_iter()
            .collect(),
        BTreeMap::new(),
        BTreeMap::new(),
        SourceMap::default(),
    )
}

fn baseline(rendered: &RenderedConfig) -> Baseline {
    let rendered = Arc::new(rendered.clone());
    let (_, model) = validator::validate_phase1_parsed(&rendered).expect("base passes phase 1");
    Baseline {
        rendered,
        model: Arc::new(model),
    }
}

fn verdict(baseline: &Baseline, candidate: &RenderedConfig) -> Option<Equivalence> {
    let (_, model) = validator::validate_phase1_parsed(candidate).ok()?;
    Some(equivalence::compare(baseline, candidate, &model))
}

fn random_server(draw: &mut Draw, name: usize) -> String {
    let address = if draw.below(4) == 0 {
        format!(
            "[2001:db8::{:x}]:{}",
            draw.below(65_000) + 1,
            draw.below(65_000) + 1
        )
    } else {
        format!(
            "10.{}.{}.{}:{}",
            draw.below(256),
            draw.below(256),
            draw.below(256),
            draw.below(65_000) + 1
        )
    };
    let mut words = vec![format!("s{name}"), address];
    if draw.below(2) == 0 {
        words.extend(["weight".to_owned(), draw.below(257).to_string()]);
    }
    if draw.below(3) == 0 {
        words.push("check".to_owned());
    }
    if draw.below(4) == 0 {
        words.extend(["proto".to_owned(), "h2".to_owned()]);
    }
    words.join(" ")
}

#[tokio::test]
async fn route_adds_and_removals_pass_by_equivalence_and_haproxy_c_agrees() {
    let seed = seed("HAPWRIGHT_EQUIVALENCE_SEED");
    let mut draw = Draw(seed);
    let scratch = tempfile::tempdir().unwrap();
    let config = settings(scratch.path());
    let mut routes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current = render(&routes, "");
    validator::validate(&current, &config)
        .await
        .unwrap_or_else(|rejection| panic!("the base config is valid: {rejection}"));
    for step in 0..40 {
        let before = baseline(&current);
        let mut done: Vec<String> = Vec::new();
        for _ in 0..=draw.below(3) {
            let route = format!("r{}", draw.below(12));
            // One change per route and step: a backend removed and added again with
            // other servers is a server change, not a covered one.
            if done.iter().any(|d| d.ends_with(&format!(" {route}"))) {
                continue;
            }
            if routes.contains_key(&route) && draw.below(3) == 0 {
                routes.remove(&route);
                done.push(format!("remove {route}"));
            } else if let Some(servers) = routes.get_mut(&route) {
                let i = draw.below(servers.len());
                let name = servers[i].split(' ').next().unwrap().to_owned();
                let replaced = random_server(&mut draw, 0);
                // Same name and words, other address (a covered endpoint change).
                let address = replaced.split(' ').nth(1).unwrap().to_owned();
                let mut words: Vec<String> = servers[i].split(' ').map(str::to_owned).collect();
                words[0] = name;
                words[1] = address;
                servers[i] = words.join(" ");
                done.push(format!("move {route}"));
            } else {
                let servers = (0..=draw.below(3))
                    .map(|n| random_server(&mut draw, n))
                    .collect();
                routes.insert(route.clone(), servers);
                done.push(format!("add {route}"));
            }
        }
        let candidate = render(&routes, "");
        match verdict(&before, &candidate) {
            Some(Equivalence::Equivalent(_)) => {}
            other => panic!(
                "seed {seed}, step {step}: {done:?} not passed by equivalence: {other:?}\n{}",
                candidate.main()
            ),
        }
        if let Err(rejection) = validator::validate_phase2(&candidate, &config).await {
            panic!(
                "seed {seed}, step {step}: passed by equivalence after {done:?} but haproxy -c \
                 rejects it: {rejection}\n{}",
                candidate.main()
            );
        }
        current = candidate;
    }
}

#[test]
fn added_or_removed_backends_outside_the_rule_are_never_passed() {
    let base_routes: BTreeMap<String, Vec<String>> =
        [("a".to_owned(), vec!["s1 10.0.0.1:80".to_owned()])].into();
    let base = baseline(&render(&base_routes, ""));
    let with = |name: &str, server: &str| {
        let mut routes = base_routes.clone();
        routes.insert(name.to_owned(), vec![server.to_owned()]);
        routes
    };
    let cases: Vec<(&str, RenderedConfig)> = vec![
        ("a host name", render(&with("b", "s1 app.internal:80"), "")),
        (
            "another keyword",
            render(&with("b", "s1 10.0.0.2:80 inter 3s"), ""),
        ),
        ("a variable", render(&with("b", "s1 ${ADDR}:80"), "")),
        ("no port", render(&with("b", "s1 10.0.0.2"), "")),
        (
            "a bad weight",
            render(&with("b", "s1 10.0.0.2:80 weight 300"), ""),
        ),
        (
            "another directive",
            render(
                &base_routes,
                "backend be_b from routes\n    server s1 10.0.0.2:80\n    http-request deny\n",
            ),
        ),
        (
            "no from",
            render(&base_routes, "backend be_b\n    server s1 10.0.0.2:80\n"),
        ),
        (
            "a profile used implicitly too",
            render(
                &base_routes,
                "defaults other\n    mode http\n    timeout connect 5s\n    timeout client 5s\n    timeout server 5s\n\
                 backend be_b from other\n    server s1 10.0.0.2:80\nbackend be_c\n    server s1 10.0.0.3:80\n",
            ),
        ),
        (
            "a removed backend still named in a sample fetch",
            render(
                &BTreeMap::new(),
                "backend be_x\n    http-request return status 200 if { nbsrv(be_a) gt 0 }\n",
            ),
        ),
        (
            "a removed backend still named in a rule",
            RenderedConfig::new(
                HEAD.replace(
                    "    default_backend be_default",
                    "    use_backend be_a if { path_beg /a }\n    default_backend be_default",
                ),
                [("hosts.map".to_owned(), Arc::<str>::from(""))]
                    .into_iter()
                    .collect(),
                BTreeMap::new(),
                BTreeMap::new(),
                SourceMap::default(),
            ),
        ),
    ];
    for (what, candidate) in cases {
        let verdict = verdict(&base, &candidate);
        assert!(
            !matches!(verdict, Some(Equivalence::Equivalent(_))),
            "{what}: passed by equivalence\n{}",
            candidate.main()
        );
    }
}

/// `count` routes named `{prefix}{i}`, one plain server each.
fn routes_named(prefix: &str, count: usize) -> BTreeMap<String, Vec<String>> {
    (0..count)
        .map(|i| {
            (
                format!("{prefix}{i}"),
                vec![format!("s1 10.0.{}.{}:80", i / 250, i % 250 + 1)],
            )
        })
        .collect()
}

/// Whether process `pid` is gone (or only waits to be reaped).
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit(") ")
            .next()
            .is_some_and(|rest| rest.starts_with('Z'))
    })
}

/// The rule checks every difference from the baseline again on each comparison, so
/// a render far from it (more than `REFRESH_AFTER` added backends) is checked with
/// the real `haproxy -c` in the background and becomes the baseline; a render HAProxy
/// refuses does not; and a validation that needs `haproxy -c` itself stops such a
/// run instead of waiting for it. The binary is a wrapper around `haproxy` that
/// refuses a config naming `be_refuse` and hangs on one naming `be_hold` (unless it
/// also has the test's extra frontend).
#[tokio::test]
async fn a_render_far_from_the_baseline_becomes_the_baseline_in_the_background() {
    use std::os::unix::fs::PermissionsExt;
    use validator::REFRESH_AFTER;

    let scratch = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let pid_file = bin.path().join("held.pid");
    let wrapper = bin.path().join("haproxy-wrapper");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n\
             if grep -q be_hold haproxy.cfg && ! grep -q 'frontend other' haproxy.cfg; then\n\
             echo $$ > {pid}; exec sleep 600\nfi\n\
             if grep -q be_refuse haproxy.cfg; then\n\
             echo '[ALERT]    (1) : config : refused by the test wrapper' >&2; exit 1\nfi\n\
             exec haproxy \"$@\"\n",
            pid = pid_file.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut config = settings(scratch.path());
    config.binary = wrapper;
    let service = validator::Service::new(config);
    let baseline_hash = || service.baseline().expect("a baseline").rendered.hash();
    let registry = prometheus::Registry::new();
    let metrics = validator::Metrics::register(&registry).unwrap();
    let metrics = Some(&metrics);
    let refreshes = |result: &str| -> u64 {
        let families = registry.gather();
        let family = families
            .iter()
            .find(|f| f.name() == "hapwright_validation_baseline_refreshes_total")
            .expect("registered");
        family
            .get_metric()
            .iter()
            .find(|m| m.get_label().iter().any(|l| l.value() == result))
            .map_or(0, |m| m.get_counter().get_value() as u64)
    };

    let base = Arc::new(render(&BTreeMap::new(), ""));
    let validated = service
        .validate(&base, metrics)
        .await
        .expect("the base passes");
    assert_eq!(
        validated.phase2_skipped, None,
        "the first render runs haproxy -c"
    );
    assert_eq!(baseline_hash(), base.hash());

    // As many added backends as the limit: passed by equivalence, no refresh.
    let near = Arc::new(render(&routes_named("r", REFRESH_AFTER), ""));
    let validated = service.validate(&near, metrics).await.expect("passes");
    assert!(validated.phase2_skipped.is_some());
    service.refreshed().await;
    assert_eq!(baseline_hash(), base.hash(), "not refreshed at the limit");
    assert_eq!(refreshes("refreshed"), 0);

    // One more: refreshed in the background, and the next render is compared with
    // it (one difference, not the limit and two).
    let far_routes = routes_named("r", REFRESH_AFTER + 1);
    let far = Arc::new(render(&far_routes, ""));
    let validated = service.validate(&far, metrics).await.expect("passes");
    assert!(
        validated.phase2_skipped.is_some(),
        "not held back by haproxy -c"
    );
    service.refreshed().await;
    assert_eq!(baseline_hash(), far.hash(), "refreshed past the limit");
    assert_eq!(refreshes("refreshed"), 1);
    let next = render(&routes_named("r", REFRESH_AFTER + 2), "");
    let (_, model) = validator::validate_phase1_parsed(&next).expect("phase 1");
    let (verdict, differences) =
        equivalence::compare_counted(&service.baseline().unwrap(), &next, &model);
    assert!(matches!(verdict, Equivalence::Equivalent(_)), "{verdict:?}");
    assert_eq!(differences, 1);

    // A render the rule passes and haproxy -c refuses is not the baseline.
    let mut refused = far_routes.clone();
    refused.extend(routes_named("refuse", REFRESH_AFTER + 1));
    let validated = service
        .validate(&Arc::new(render(&refused, "")), metrics)
        .await
        .expect("passes by equivalence");
    assert!(validated.phase2_skipped.is_some());
    service.refreshed().await;
    assert_eq!(
        baseline_hash(),
        far.hash(),
        "a refused render is not the baseline"
    );
    assert_eq!((refreshes("refreshed"), refreshes("refused")), (1, 1));

    // A refresh that hangs is stopped by a validation that needs haproxy -c.
    let mut held = far_routes.clone();
    held.extend(routes_named("hold", REFRESH_AFTER + 1));
    let validated = service
        .validate(&Arc::new(render(&held, "")), metrics)
        .await
        .expect("passes by equivalence");
    assert!(validated.phase2_skipped.is_some());
    // The wrapper writes its pid just before it blocks.
    let read_pid = || {
        std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok())
    };
    poll_until(|| read_pid().is_some(), "the background haproxy -c started").await;
    let pid = read_pid().unwrap();
    let other = Arc::new(render(
        &held,
        "frontend other\n    bind 127.0.0.1:18081\n    default_backend be_default\n",
    ));
    let validated = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        service.validate(&other, metrics),
    )
    .await
    .expect("not held back by the background run")
    .expect("passes haproxy -c");
    assert_eq!(validated.phase2_skipped, None);
    assert_eq!(baseline_hash(), other.hash());
    poll_until(|| gone(pid), "the stopped haproxy -c ended").await;
    // A stopped run has no result.
    assert_eq!(
        (
            refreshes("refreshed"),
            refreshes("refused"),
            refreshes("failed")
        ),
        (1, 1, 0)
    );
}

/// Polls `done` until it holds; panics after 30 s.
async fn poll_until(done: impl Fn() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "not so after 30 s: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
