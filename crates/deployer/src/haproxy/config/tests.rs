use hapwright_eventbus::model::Severity;

use super::*;

const SAMPLE: &str = r#"# generated
.if defined(HAPWRIGHT_DEBUG)
    .notice "debug build"
.endif
global
    log stderr format short local0 notice
    setenv CFG_VERSION 42

defaults
    mode http
    timeout client 30s   # trailing comment
    balance leastconn

defaults named
    hash-type consistent
    balance uri

frontend fe_main
    bind "127.0.0.1:${HTTP_PORT}"
    use_backend %[req.hdr(host),lower,map(maps/hosts.map,be_default)]
    use_backend be_api if { path_beg /api }
    default_backend be_default

backend be_default
    http-request return status 404 content-type text/plain string "no route\n"

backend be_api from named
    server api1 10.0.0.1:8080 check weight 10
    server api2 [2001:db8::1]:8443
    server api3 ${API_HOST}:${API_PORT}
    server sock unix@/run/app.sock
    server broken

listen stats
    bind :8404
    balance static-rr
    server s 127.0.0.1:9000
"#;

#[test]
fn sections_come_in_file_order_with_lines() {
    let config = parse(SAMPLE).unwrap();
    let kinds: Vec<(SectionKind, Option<&str>, u32)> = config
        .sections
        .iter()
        .map(|s| (s.kind.clone(), s.name.as_deref(), s.line))
        .collect();
    assert_eq!(
        kinds,
        [
            (SectionKind::Preamble, None, 0),
            (SectionKind::Global, None, 5),
            (SectionKind::Defaults, None, 9),
            (SectionKind::Defaults, Some("named"), 14),
            (SectionKind::Frontend, Some("fe_main"), 18),
            (SectionKind::Backend, Some("be_default"), 24),
            (SectionKind::Backend, Some("be_api"), 27),
            (SectionKind::Listen, Some("stats"), 34),
        ]
    );
    let preamble = &config.sections[0];
    assert_eq!(preamble.directives.len(), 3);
    assert!(preamble.directives[0].is_conditional());
    assert_eq!(preamble.directives[1].args, ["debug build"]);
}

#[test]
fn directives_keep_words_lines_and_text() {
    let config = parse(SAMPLE).unwrap();
    let fe = config.section(SectionKind::Frontend, "fe_main").unwrap();
    let bind = &fe.directives[0];
    assert_eq!(bind.keyword, "bind");
    assert_eq!(bind.args, ["127.0.0.1:${HTTP_PORT}"]);
    assert_eq!(bind.line, 19);
    assert_eq!(bind.text, r#"bind "127.0.0.1:${HTTP_PORT}""#);
    let defaults = &config.sections[2];
    assert_eq!(defaults.directives[1].args, ["client", "30s"]);
    let be = config.section(SectionKind::Backend, "be_default").unwrap();
    assert_eq!(be.directives[0].args.last().unwrap(), "no route\n");
    assert_eq!(config.frontends().count(), 1);
    assert_eq!(config.backends().count(), 2);
    assert_eq!(config.listens().count(), 1);
    assert_eq!(config.server_proxies().count(), 3);
    assert_eq!(
        config.global().unwrap().last("setenv").unwrap().args,
        ["CFG_VERSION", "42"]
    );
}

#[test]
fn servers_split_address_and_port() {
    let config = parse(SAMPLE).unwrap();
    let be = config.section(SectionKind::Backend, "be_api").unwrap();
    let servers = be.servers();
    let summary: Vec<(&str, &str, Option<u16>, usize, u32)> = servers
        .iter()
        .map(|s| {
            (
                s.name.as_str(),
                s.address.as_str(),
                s.port,
                s.params.len(),
                s.line,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("api1", "10.0.0.1", Some(8080), 3, 28),
            ("api2", "2001:db8::1", Some(8443), 0, 29),
            ("api3", "${API_HOST}", None, 0, 30),
            ("sock", "unix@/run/app.sock", None, 0, 31),
        ]
    );
    assert_eq!(servers[0].params, ["check", "weight", "10"]);
    assert_eq!(be.directives_except_servers().count(), 0);
    assert_eq!(be.from_defaults(), Some("named"));
}

#[test]
fn address_forms() {
    assert_eq!(split_address("::1:80"), ("::1".into(), Some(80)));
    assert_eq!(split_address("host"), ("host".into(), None));
    assert_eq!(split_address("host:99999"), ("host".into(), None));
    assert_eq!(split_address("host:+1"), ("host".into(), None));
    assert_eq!(
        split_address("ipv4@10.0.0.1:81"),
        ("ipv4@10.0.0.1".into(), Some(81))
    );
    assert_eq!(split_address("/run/x.sock"), ("/run/x.sock".into(), None));
    assert_eq!(split_address("[::1"), ("[::1".into(), None));
}

#[test]
fn balance_and_inheritance() {
    let config = parse(SAMPLE).unwrap();
    let api = config.section(SectionKind::Backend, "be_api").unwrap();
    assert_eq!(api.balance(), None);
    // `from named`: uri with consistent hashing, so servers can be added at runtime.
    let balance = config.effective_balance(api);
    assert_eq!(balance.algorithm, "uri");
    assert!(balance.is_hash_based());
    assert!(balance.is_dynamic());
    // be_default inherits the last defaults section before it (`named`).
    let default = config.section(SectionKind::Backend, "be_default").unwrap();
    assert_eq!(config.effective_balance(default).algorithm, "uri");
    let stats = config.section(SectionKind::Listen, "stats").unwrap();
    assert_eq!(stats.balance().unwrap().algorithm, "static-rr");
    assert!(!config.effective_balance(stats).is_dynamic());
    // No balance anywhere: HAProxy's roundrobin.
    let bare = parse("backend b\n").unwrap();
    assert_eq!(
        bare.effective_balance(&bare.sections[0]),
        Balance::default_roundrobin()
    );
}

#[test]
fn dynamic_algorithms_follow_haproxy() {
    let balance = |algorithm: &str, hash: Option<&str>| Balance {
        algorithm: algorithm.into(),
        args: vec![],
        hash_type: hash.map(|h| vec![h.to_owned()]),
    };
    for dynamic in ["roundrobin", "leastconn", "first", "random", "random(2)"] {
        assert!(balance(dynamic, None).is_dynamic(), "{dynamic}");
    }
    assert!(!balance("static-rr", None).is_dynamic());
    assert!(!balance("source", None).is_dynamic());
    assert!(!balance("hdr(host)", Some("map-based")).is_dynamic());
    assert!(balance("hdr(host)", Some("consistent")).is_dynamic());
    assert!(balance("hash", Some("consistent")).is_dynamic());
    assert!(!balance("nonsense", Some("consistent")).is_dynamic());
}

#[test]
fn structural_errors_carry_lines() {
    let err = parse("global\n    bogus \"unterminated\n").unwrap_err();
    assert_eq!((err.line, err.column), (2, Some(11)));
    assert_eq!(err.message, "unmatched quote.");
    assert_eq!(err.to_string(), "line 2, column 11: unmatched quote.");
    let err = parse("mode http\nglobal\n").unwrap_err();
    assert_eq!(err.line, 1);
    assert_eq!(err.message, "unknown keyword 'mode' out of section.");
    assert_eq!(
        parse("backend b\n.elif x\n").unwrap_err().message,
        "lone '.elif' with no matching '.if'."
    );
    assert_eq!(parse("backend b\n.endif\n").unwrap_err().line, 2);
    assert_eq!(parse(".if a\n.else\n.else\n.endif\n").unwrap_err().line, 3);
    let err = parse("global\n.if defined(X)\n    .if 1\n    .endif\n").unwrap_err();
    assert_eq!(
        (err.line, err.message.as_str()),
        (2, "non-terminated '.if' block.")
    );
    let (config, errors) = parse_lenient("global\n  a \"x\n  b 'y\n  c\n");
    assert_eq!(errors.iter().map(|e| e.line).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(config.sections[0].directives.len(), 1);
}

#[test]
fn print_is_canonical_and_reads_back() {
    let config = parse(SAMPLE).unwrap();
    let printed = print(&config);
    assert!(printed.starts_with("    .if defined(HAPWRIGHT_DEBUG)\n"));
    assert!(
        printed.contains(
            "\nbackend be_api from named\n    server api1 10.0.0.1:8080 check weight 10\n"
        )
    );
    assert!(printed.contains(r#"string "no route\n""#));
    let again = parse(&printed).unwrap();
    assert_eq!(print(&again), printed);
    for (a, b) in config.sections.iter().zip(&again.sections) {
        assert_eq!((&a.kind, &a.name, &a.args), (&b.kind, &b.name, &b.args));
        let words = |s: &Section| {
            s.directives
                .iter()
                .map(|d| (d.keyword.clone(), d.args.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(words(a), words(b));
    }
    // A trailing empty word survives printing.
    let config = parse("global\n    x \"\" \n").unwrap();
    assert_eq!(config.sections[0].directives[0].args, [""]);
    assert_eq!(
        parse(&print(&config)).unwrap().sections[0].directives[0].args,
        [""]
    );
}

fn paths(list: &[&str]) -> FileNames {
    FileNames::from_paths(list)
}

fn messages(text: &str, rendered: &[&str]) -> Vec<(u32, Severity, String)> {
    let config = parse(text).unwrap();
    check(&config, &paths(rendered))
        .into_iter()
        .map(|d| {
            let location = d.location.unwrap();
            assert_eq!(location.file, "haproxy.cfg");
            (location.line.unwrap(), d.severity, d.message)
        })
        .collect()
}

#[test]
fn sample_passes_the_checks() {
    assert_eq!(messages(SAMPLE, &["haproxy.cfg", "maps/hosts.map"]), []);
}

#[test]
fn duplicate_proxies_follow_haproxy_rules() {
    let text = "frontend x\nbackend x\nbackend x\nlisten y\nfrontend y\nfrontend z\nfrontend z\n";
    assert_eq!(
        messages(text, &[]),
        [
            (
                3,
                Severity::Error,
                "backend 'x' has the same name as backend 'x' declared at haproxy.cfg:2."
                    .to_owned()
            ),
            (
                5,
                Severity::Error,
                "frontend 'y' has the same name as listen 'y' declared at haproxy.cfg:4."
                    .to_owned()
            ),
            (
                7,
                Severity::Error,
                "frontend 'z' has the same name as frontend 'z' declared at haproxy.cfg:6."
                    .to_owned()
            ),
        ]
    );
    let diagnostics = check(&parse(text).unwrap(), &paths(&[]));
    assert_eq!(diagnostics[0].source_line.as_deref(), Some("backend x"));
}

#[test]
fn duplicates_in_exclusive_branches_are_fine() {
    let text = "global\n.if defined(A)\nbackend x\n.elif defined(B)\nbackend x\n.else\nbackend x\n.endif\n";
    assert_eq!(messages(text, &[]), []);
    let nested = "global\n.if defined(A)\nbackend x\n.if defined(B)\nbackend x\n.endif\n.endif\n";
    assert_eq!(messages(nested, &[]).len(), 1);
    let after = "global\n.if defined(A)\nbackend x\n.endif\nbackend x\n";
    assert_eq!(messages(after, &[]).len(), 1);
}

#[test]
fn missing_backend_targets_are_located() {
    let text = "frontend fe\n    use_backend be_missing if { path_beg /x }\n    use_backend %[var(txn.be)]\n    use_backend \"${BE}\"\n    default_backend fe\nbackend be_ok\ndefaults\n    default_backend be_ok\n";
    assert_eq!(
        messages(text, &[]),
        [
            (2, Severity::Error, "use_backend target does not exist: no backend or listen section is named 'be_missing'.".to_owned()),
            (5, Severity::Error, "default_backend target does not exist: 'fe' is a frontend, not a backend.".to_owned()),
        ]
    );
}

#[test]
fn a_misspelled_profile_is_located() {
    let text = "defaults routes\n    mode http\nfrontend fe\n    bind :80\nbackend be_shop from rotues\n    server s1 10.0.0.1:80\nbackend be_ok from routes\n";
    assert_eq!(
        messages(text, &[]),
        [(
            5,
            Severity::Error,
            "backend 'be_shop' is declared from defaults section 'rotues', which does not exist (named defaults sections: 'routes').".to_owned()
        )]
    );
    let diagnostics = check(&parse(text).unwrap(), &paths(&[]));
    assert_eq!(
        diagnostics[0].source_line.as_deref(),
        Some("backend be_shop from rotues")
    );
    let unnamed = "defaults\n    mode http\nbackend b from d\n";
    assert_eq!(
        messages(unnamed, &[])[0].2,
        "backend 'b' is declared from defaults section 'd', which does not exist (no defaults section has a name; name one `defaults NAME`)."
    );
}

#[test]
fn unrendered_files_are_reported() {
    let text = "frontend fe\n    bind :443 ssl crt certs/\n    http-request set-header X %[src,map_ip(maps/ips.map)]\n    errorfile 503 ./files/503.http\n.if defined(X)\n    acl a src -f files/extra.acl\n.endif\nbackend b\n    server s /etc/haproxy/maps/elsewhere\n";
    let found = messages(text, &["maps/hosts.map"]);
    assert_eq!(found.len(), 4);
    assert_eq!(
        found[0],
        (
            2,
            Severity::Error,
            "'bind' references 'certs/', which is not a rendered file (no certs are rendered)."
                .to_owned()
        )
    );
    assert_eq!(found[1], (3, Severity::Error, "'http-request' references 'maps/ips.map', which is not a rendered file (rendered maps: hosts.map).".to_owned()));
    assert_eq!(found[2].0, 4);
    assert_eq!(found[3].0, 6);
    assert_eq!(found[3].1, Severity::Warning);
    let all = [
        "maps/ips.map",
        "files/503.http",
        "files/extra.acl",
        "certs/site.pem",
    ];
    assert_eq!(messages(text, &all), []);
}

#[test]
fn phase1_collects_everything_in_line_order() {
    let text = "frontend fe\n    default_backend nope\n    bad \"quote\nbackend b";
    let diagnostics = phase1(text, &paths(&[]));
    let lines: Vec<u32> = diagnostics
        .iter()
        .map(|d| d.location.as_ref().unwrap().line.unwrap())
        .collect();
    assert_eq!(lines, [2, 3, 4]);
    assert_eq!(diagnostics[1].source_line.as_deref(), Some("bad \"quote"));
    assert_eq!(diagnostics[1].location.as_ref().unwrap().column, Some(9));
    assert!(diagnostics[2].message.starts_with("Missing LF"));
    assert_eq!(phase1("", &paths(&[])), []);
}

#[test]
fn server_directives_are_the_lines_servers_reads() {
    let config = parse_lenient(
        "backend be\n    server a 10.0.0.1:80 check\n    server lonely\n    balance roundrobin\n    server b [::1]:81\n",
    )
    .0;
    let be = config.section(SectionKind::Backend, "be").unwrap();
    let lines: Vec<u32> = be.server_directives().map(|d| d.line).collect();
    let from_servers: Vec<u32> = be.servers().iter().map(|s| s.line).collect();
    assert_eq!(lines, [2, 5]);
    assert_eq!(lines, from_servers);
    assert_eq!(be.server_count(), 2);
}
