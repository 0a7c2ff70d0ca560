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
