use super::*;
use crate::haproxy::config::parse;

fn footprint(main: &str, maps: &[(&str, &str)]) -> Footprint {
    let mut builder = RenderedConfig::builder(main);
    for (name, text) in maps {
        builder = builder.map(*name, *text);
    }
    let config = builder.build();
    Footprint::of(&config, &parse(main).unwrap())
}

/// `backends` backends of `servers` servers each, plus a frontend that has none.
fn fleet(backends: usize, servers: usize) -> String {
    let mut text = String::from("frontend http\n    bind :80\n");
    for b in 0..backends {
        text.push_str(&format!("backend be_{b}\n"));
        for s in 0..servers {
            text.push_str(&format!("    server s{s} 10.0.{b}.{s}:80\n"));
        }
    }
    text
}

#[test]
fn counts_backends_listens_servers_and_map_entries() {
    let f = footprint(
        "frontend f\n    bind :80\nbackend a\n    server a1 1.1.1.1:80\n    server a2 1.1.1.2:80\n\
         listen l\n    bind :81\n    server l1 1.1.1.3:80\nbackend empty\n",
        &[("hosts.map", "# comment\n\na.test be_a\nb.test be_b\n")],
    );
    assert_eq!(f.backends(), 3);
    assert_eq!(f.servers(), 3);
    assert_eq!(f.map_entries(), 2);
}

#[test]
fn an_emptied_source_removes_everything_and_says_so() {
    let running = footprint(&fleet(3, 40), &[("hosts.map", "a be_0\nb be_1\nc be_2\n")]);
    let next = footprint(&fleet(0, 0), &[("hosts.map", "")]);
    let removal = assess(&running, &next);
    assert_eq!(
        removal.backends,
        RemovalCount {
            removed: 3,
            total: 3
        }
    );
    assert_eq!(
        removal.servers,
        RemovalCount {
            removed: 120,
            total: 120
        }
    );
    assert_eq!(
        removal.map_entries,
        RemovalCount {
            removed: 3,
            total: 3
        }
    );
    assert_eq!(removal.removed_backends, ["be_0", "be_1", "be_2"]);
    assert_eq!(
        removal.to_string(),
        "would remove 3 of 3 backends (100%), 120 of 120 servers (100%), 3 of 3 map entries (100%)"
    );
    assert!(exceeds(&removal, MaxRemoval::Percent(50)));
    assert!(!exceeds(&removal, MaxRemoval::Off));
}

#[test]
fn servers_count_as_the_net_drop_per_backend() {
    // 100 of 120 servers go; a backend whose servers are renamed loses none.
    let mut before = String::from("backend big\n");
    let mut after = String::from("backend big\n");
    for s in 0..120 {
        before.push_str(&format!("    server old{s} 10.0.0.{s}:80\n"));
    }
    for s in 0..20 {
        after.push_str(&format!("    server new{s} 10.0.1.{s}:80\n"));
    }
    let removal = assess(&footprint(&before, &[]), &footprint(&after, &[]));
    assert_eq!(
        removal.servers,
        RemovalCount {
            removed: 100,
            total: 120
        }
    );
    assert_eq!(removal.backends.removed, 0);
    assert_eq!(removal.to_string(), "would remove 100 of 120 servers (83%)");

    let renamed = before.replace("server old", "server renamed");
    let removal = assess(&footprint(&before, &[]), &footprint(&renamed, &[]));
    assert_eq!(removal.servers.removed, 0);
    assert_eq!(removal.to_string(), "would remove nothing");
}

#[test]
fn the_threshold_is_more_than_the_share() {
    let running = footprint(&fleet(4, 1), &[]);
    // Two of four backends: exactly 50% is not more than 50%.
    let half = assess(&running, &footprint(&fleet(2, 1), &[]));
    assert_eq!(
        half.backends,
        RemovalCount {
            removed: 2,
            total: 4
        }
    );
    assert!(!exceeds(&half, MaxRemoval::Percent(50)));
    assert!(exceeds(&half, MaxRemoval::Percent(49)));
    // Three of four.
    let most = assess(&running, &footprint(&fleet(1, 1), &[]));
    assert!(exceeds(&most, MaxRemoval::Percent(50)));
    assert!(!exceeds(&most, MaxRemoval::Percent(100)));
    // Growing never exceeds, nor does anything measured against an empty config.
    assert!(!exceeds(
        &assess(&running, &footprint(&fleet(8, 2), &[])),
        MaxRemoval::Percent(1)
    ));
    assert!(!exceeds(
        &assess(&Footprint::default(), &footprint(&fleet(0, 0), &[])),
        MaxRemoval::Percent(1)
    ));
}

#[test]
fn max_removal_parses_percentages_and_off() {
    for (text, want) in [
        ("50%", MaxRemoval::Percent(50)),
        ("50", MaxRemoval::Percent(50)),
        (" 100 % ", MaxRemoval::Percent(100)),
        ("1%", MaxRemoval::Percent(1)),
        ("0%", MaxRemoval::Off),
        ("0", MaxRemoval::Off),
        ("off", MaxRemoval::Off),
        ("OFF", MaxRemoval::Off),
    ] {
        assert_eq!(text.parse::<MaxRemoval>(), Ok(want), "{text}");
    }
    assert_eq!(
        "150%".parse::<MaxRemoval>().unwrap_err().to_string(),
        "invalid maxRemoval `150%`: a percentage from 0% to 100%"
    );
    assert!(matches!(
        "half".parse::<MaxRemoval>(),
        Err(Error::ParsePercent(_))
    ));
    assert_eq!(MaxRemoval::Percent(50).to_string(), "50%");
}

#[test]
fn the_section_deserializes_with_defaults_and_yaml_forms() {
    let parse = |text: &str| serde_saphyr::from_str::<Config>(text);
    assert_eq!(parse("{}").unwrap(), Config::default());
    let config = parse("maxRemoval: 30%\nconfirmAfter: 1m\n").unwrap();
    assert_eq!(config.max_removal, MaxRemoval::Percent(30));
    assert_eq!(config.confirm_after, Duration::from_secs(60));
    assert_eq!(
        parse("maxRemoval: 25\n").unwrap().max_removal,
        MaxRemoval::Percent(25)
    );
    assert_eq!(
        parse("maxRemoval: off\n").unwrap().max_removal,
        MaxRemoval::Off
    );
    assert_eq!(
        parse("maxRemoval: 0\n").unwrap().max_removal,
        MaxRemoval::Off
    );
    assert!(parse("maxRemoval: 200%\n").is_err());
    assert!(parse("maxRemovel: 20%\n").is_err());
    let zero = parse("confirmAfter: 0s\n").unwrap();
    assert_eq!(zero.validate()[0].path, "confirmAfter");
    assert!(
        parse("maxRemoval: off\nconfirmAfter: 0s\n")
            .unwrap()
            .validate()
            .is_empty()
    );
}

fn released(main: &str, maps: &[(&str, &str)], files: &[(&str, &str)]) -> Released {
    let mut builder = RenderedConfig::builder(main);
    for (name, text) in maps {
        builder = builder.map(*name, *text);
    }
    for (name, text) in files {
        builder = builder.file(*name, *text);
    }
    let config = std::sync::Arc::new(builder.build());
    let model = std::sync::Arc::new(parse(main).unwrap());
    Released::new(config, model)
}

#[test]
fn keeping_puts_back_sections_servers_map_entries_and_files_only() {
    let before = released(
        "global\n    maxconn 100\nfrontend f\n    bind :80\n    use_backend %[req.hdr(host),map(maps/hosts.map)]\n\
         backend a\n    # a comment inside\n    server a1 1.1.1.1:80\n    server a2 1.1.1.2:80\n    server a3 1.1.1.3:80\n\n\
         listen l\n    bind :81\n    server l1 2.2.2.2:80\nbackend b\n    http-request return status 200 file files/page.html\n",
        &[("hosts.map", "a.test a\nb.test b\nmoved.test a\n")],
        &[("page.html", "<p>hi</p>\n")],
    );
    // The render drops `listen l`, backend b with its file, a2 and a3 of backend a
    // (and adds a4), the route b.test, and moves moved.test to backend c.
    let desired = released(
        "global\n    maxconn 200\nfrontend f\n    bind :80\n    use_backend %[req.hdr(host),map(maps/hosts.map)]\n\
         backend a\n    server a1 1.1.1.1:80\n    server a4 1.1.1.4:80\nbackend c\n    server c1 3.3.3.3:80\n",
        &[("hosts.map", "a.test a\nmoved.test c\n")],
        &[],
    );
    let kept = keep_held(&desired, &[before]);
    assert_eq!(
        (kept.backends, kept.servers, kept.map_entries, kept.files),
        (2, 1, 1, 1)
    );
    let main = kept.config.main();
    let model = parse(main).expect("the kept config parses");
    // What the render changed stays as rendered.
    assert!(
        main.contains("maxconn 200") && !main.contains("maxconn 100"),
        "{main}"
    );
    let a = model
        .section(crate::haproxy::config::SectionKind::Backend, "a")
        .unwrap();
    let names: Vec<String> = a.servers().into_iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        ["a1", "a4", "a2"],
        "one server back for the net drop of one"
    );
    assert!(
        model
            .section(crate::haproxy::config::SectionKind::Backend, "c")
            .is_some()
    );
    // What it removed is back, whole.
    let l = model
        .section(crate::haproxy::config::SectionKind::Listen, "l")
        .unwrap();
    assert_eq!(l.server_count(), 1);
    let b = model
        .section(crate::haproxy::config::SectionKind::Backend, "b")
        .unwrap();
    assert_eq!(b.directives.len(), 1);
    assert_eq!(
        &*kept.config.maps()["hosts.map"],
        "a.test a\nmoved.test c\nb.test b\n"
    );
    assert_eq!(&*kept.config.files()["page.html"], "<p>hi</p>\n");
    assert!(main.contains(KEPT_HEADER));
}

#[test]
fn keeping_nothing_leaves_the_render_as_it_is() {
    let running = released(&fleet(2, 2), &[("hosts.map", "a be_0\n")], &[]);
    let desired = released(&fleet(3, 2), &[("hosts.map", "a be_1\nb be_2\n")], &[]);
    let kept = keep_held(&desired, &[running]);
    assert!(kept.is_empty());
    assert_eq!(kept.config.hash(), desired.config.hash());
}

#[test]
fn the_high_water_mark_takes_the_largest_count_of_each() {
    let one = footprint(&fleet(2, 3), &[("hosts.map", "a x\nb y\n")]);
    let two = footprint(
        &fleet(4, 1),
        &[("hosts.map", "a x\n"), ("other.map", "c z\n")],
    );
    let high = Footprint::high_water([&one, &two]);
    assert_eq!(high.backends(), 4);
    assert_eq!(high.servers(), 3 + 3 + 1 + 1);
    assert_eq!(high.map_entries(), 3);
}

proptest::proptest! {
    /// The high-water mark merged in name order is the one built a name at a time.
    #[test]
    fn the_merged_high_water_mark_is_the_one_built_name_by_name(
        footprints in proptest::collection::vec(
            (
                proptest::collection::btree_map("[a-e]{1,3}", 0..5usize, 0..12),
                proptest::collection::btree_map("[a-c]\\.map", 0..5usize, 0..3),
            ),
            0..5,
        )
    ) {
        let footprints: Vec<Footprint> = footprints
            .into_iter()
            .map(|(backends, maps)| Footprint { backends, maps })
            .collect();
        let mut expected = Footprint::default();
        for footprint in &footprints {
            for (name, &servers) in &footprint.backends {
                let slot = expected.backends.entry(name.clone()).or_default();
                *slot = (*slot).max(servers);
            }
            for (name, &entries) in &footprint.maps {
                let slot = expected.maps.entry(name.clone()).or_default();
                *slot = (*slot).max(entries);
            }
        }
        proptest::prop_assert_eq!(Footprint::high_water(&footprints), expected);
    }
}

proptest::proptest! {
    /// Covering, told in one walk of both footprints, is a lookup of every name.
    #[test]
    fn covering_is_every_name_with_at_least_its_count(
        a in proptest::collection::btree_map("[a-d]{1,2}", 0..4usize, 0..10),
        b in proptest::collection::btree_map("[a-d]{1,2}", 0..4usize, 0..10),
        maps in proptest::collection::btree_map("[a-b]\\.map", 0..3usize, 0..2),
    ) {
        let have = Footprint { backends: a, maps: maps.clone() };
        let need = Footprint { backends: b, maps };
        let expected = need
            .backends
            .iter()
            .all(|(name, &servers)| have.backends.get(name).is_some_and(|&h| h >= servers));
        proptest::prop_assert_eq!(have.covers(&need), expected);
        proptest::prop_assert!(have.covers(&have));
    }
}

fn map_line() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    prop_oneof![
        6 => "[a-z]{1,8}\\.test [a-z_]{1,8}",
        1 => Just(String::new()),
        1 => Just("   ".to_owned()),
        1 => Just("# a comment".to_owned()),
        1 => Just("  #x".to_owned()),
        1 => Just("a.test be\r".to_owned()),
    ]
}

proptest::proptest! {
    /// A map's versions counted one after another, each from the last one's count
    /// over the lines that changed, count as a read of the whole map.
    #[test]
    fn map_entries_counted_from_the_last_version_equal_a_full_count(
        first in proptest::collection::vec(map_line(), 0..40),
        edits in proptest::collection::vec(
            (0usize..50, 0usize..4, proptest::collection::vec(map_line(), 0..3), proptest::bool::ANY),
            1..10,
        ),
    ) {
        let counts = MapCounts(crate::haproxy::config::LastVersions::new());
        let mut lines = first;
        for (at, removed, added, newline) in edits {
            let mut text = lines.join("\n");
            if newline {
                text.push('\n');
            }
            let text: std::sync::Arc<str> = std::sync::Arc::from(text.as_str());
            proptest::prop_assert_eq!(counts.entries("hosts.map", &text), map_entries(&text));
            // The same allocation again, and another map beside it.
            proptest::prop_assert_eq!(counts.entries("hosts.map", &text), map_entries(&text));
            let other: std::sync::Arc<str> = std::sync::Arc::from(format!("x.test a\n{text}"));
            proptest::prop_assert_eq!(counts.entries("other.map", &other), map_entries(&other));
            let at = at.min(lines.len());
            let end = (at + removed).min(lines.len());
            lines.splice(at..end, added);
        }
    }
}
