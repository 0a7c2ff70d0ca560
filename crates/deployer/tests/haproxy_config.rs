//! Property tests of the HAProxy config tokenizer and model: it never panics on any
//! input, and tokenize → print → tokenize gives back the same model.

use hapwright_deployer::haproxy::config::{
    self as haproxy_config, Config, Directive, FileNames, Section, SectionKind, check, parse,
    parse_lenient, phase1, print,
};
use proptest::prelude::*;

/// One section's words: kind, name, header arguments, and each directive's words.
type SectionWords = (SectionKind, Option<String>, Vec<String>, Vec<Vec<String>>);

/// The model without line numbers and original text, which printing cannot keep.
fn words(config: &Config) -> Vec<SectionWords> {
    config
        .sections
        .iter()
        .map(|s| {
            (
                s.kind.clone(),
                s.name.clone(),
                s.args.clone(),
                s.directives
                    .iter()
                    .map(|d| {
                        let mut all = vec![d.keyword.clone()];
                        all.extend(d.args.iter().cloned());
                        all
                    })
                    .collect(),
            )
        })
        .collect()
}

/// Lines built from the characters that matter to the tokenizer.
fn config_like_text() -> impl Strategy<Value = String> {
    let word = prop_oneof![
        Just("backend".to_owned()),
        Just("frontend".to_owned()),
        Just("listen".to_owned()),
        Just("global".to_owned()),
        Just("defaults".to_owned()),
        Just("server".to_owned()),
        Just("use_backend".to_owned()),
        Just("default_backend".to_owned()),
        Just(".if".to_owned()),
        Just(".elif".to_owned()),
        Just(".else".to_owned()),
        Just(".endif".to_owned()),
        Just("maps/a.map".to_owned()),
        "[a-z0-9:._/-]{1,8}",
        "[ \\t\"'\\\\#${}\\[\\]*a-zA-Z0-9_.x-]{1,10}",
    ];
    let line = prop::collection::vec(word, 0..6).prop_map(|w| w.join(" "));
    let indent = prop_oneof![Just(""), Just("    "), Just("\t")];
    prop::collection::vec((indent, line), 0..25).prop_map(|lines| {
        lines
            .into_iter()
            .map(|(indent, line)| format!("{indent}{line}\n"))
            .collect()
    })
}

fn assert_round_trip(config: &Config) -> Result<(), TestCaseError> {
    let printed = print(config);
    let again = parse(&printed).map_err(|e| {
        TestCaseError::fail(format!("printed config does not parse: {e}\n{printed}"))
    })?;
    prop_assert_eq!(words(&again), words(config), "printed:\n{}", printed);
    prop_assert_eq!(print(&again), printed);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_panics_on_arbitrary_text(text in any::<String>()) {
        let (config, _errors) = parse_lenient(&text);
        let _ = print(&config);
        let _ = check(&config, &FileNames::default());
        let _ = phase1(&text, &FileNames::default());
        if let Ok(config) = parse(&text) {
            assert_round_trip(&config)?;
        }
    }

    #[test]
    fn never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = phase1(&text, &FileNames::default());
    }

    #[test]
    fn config_like_text_round_trips(text in config_like_text()) {
        let rendered = FileNames::from_paths(["maps/a.map"]);
        let _ = phase1(&text, &rendered);
        if let Ok(config) = parse(&text) {
            assert_round_trip(&config)?;
        }
    }

    #[test]
    fn any_word_survives_printing(word in any::<String>(), keyword in "[a-z][a-z-]{0,10}") {
        prop_assume!(SectionKind::from_keyword(&keyword).is_none());
        for args in [vec![word.clone(), "end".to_owned()], vec![word.clone()]] {
            let config = Config {
                sections: vec![std::sync::Arc::new(Section {
                    kind: SectionKind::Backend,
                    name: Some(word.clone()),
                    args: vec![],
                    line: 1,
                    directives: vec![Directive {
                        keyword: keyword.clone(),
                        args,
                        line: 2,
                        text: String::new(),
                    }],
                })],
            };
            // An empty name is an absent name once printed, as in HAProxy.
            if word.is_empty() {
                continue;
            }
            assert_round_trip(&config)?;
        }
    }
}

/// A config in the shape hapwright renders, with the quoting users write.
const REALISTIC: &str = r#"global
    stats socket /run/haproxy/admin.sock mode 600 level admin expose-fd listeners
    log stderr format short local0 notice
    setenv CFG_VERSION 42
    ssl-default-bind-ciphers ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256

defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    timeout client 30s
    timeout server 30s

frontend fe_main
    bind "127.0.0.1:${HTTP_PORT}"
    bind :443 ssl crt certs/ alpn h2,http/1.1
    http-request return status 200 content-type text/plain lf-string "pid=%pid\n" if { path /__pid }
    http-request set-header X-Forwarded-Proto https if { ssl_fc }
    log-format "%ci:%cp [%tr] %ft %b/%s %TR/%Tw/%Tc/%Tr/%Ta %ST %B %CC %CS %tsc %ac/%fc/%bc/%sc/%rc %sq/%bq %hr %hs %{+Q}r"
    acl blocked path_beg -f files/blocked.acl
    http-request deny deny_status 403 if blocked
    use_backend %[req.hdr(host),lower,word(1,:),map(maps/hosts.map,be_default)]
    default_backend be_default

backend be_default
    http-request return status 404 content-type text/plain string 'no route'
    errorfile 503 files/503.http

backend be_web
    balance roundrobin
    option httpchk GET /healthz "HTTP/1.1\r\nHost:\ www"
    default-server check inter 2s fall 3 rise 2
    server web1 10.0.0.1:8080 weight 10
    server web2 10.0.0.2:8080 weight 10 backup
    server-template slot 1-4 127.0.0.1:1 disabled
"#;

#[test]
fn realistic_config_round_trips_and_passes_checks() {
    let config = haproxy_config::parse(REALISTIC).unwrap();
    assert_round_trip(&config).unwrap();
    let rendered = FileNames::from_paths([
        "haproxy.cfg",
        "maps/hosts.map",
        "files/blocked.acl",
        "files/503.http",
        "certs/site.pem",
    ]);
    assert_eq!(phase1(REALISTIC, &rendered), []);
    let web = config.section(SectionKind::Backend, "be_web").unwrap();
    assert_eq!(web.servers().len(), 2);
    assert!(config.effective_balance(web).is_dynamic());
    let httpchk = web.last("option").unwrap();
    assert_eq!(
        httpchk.args,
        ["httpchk", "GET", "/healthz", "HTTP/1.1\r\nHost: www"]
    );
}
