//! Phase 2 by structural equivalence against the real `haproxy -c`:
//!
//! - differential: random edits of the kinds the rule covers (IPv4/IPv6 literals,
//!   ports, weights, string-map entries) are accepted by the rule, and every accepted
//!   config is also accepted by HAProxy;
//! - negative: random edits outside the rule (host names, new keywords, malformed
//!   addresses and ports, `${VAR}`, added or removed servers, renamed backends,
//!   changed certificates, `map_ip` maps, ...) are never accepted;
//! - the component runs `haproxy -c` once for two renders that differ only in a
//!   server address, records the second as skipped with its reason, and runs it again
//!   for a new keyword.
//!
//! The random tests print their seed on failure; set `HAPWRIGHT_EQUIVALENCE_SEED`
//! to replay one.

mod support;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::component::validator::equivalence::{
    self, Baseline, Equivalence, SkipReason,
};
use hapwright_deployer::component::validator::{self, Validator};
use hapwright_eventbus::model::RenderedConfig;
use hapwright_eventbus::testing::TestBus;
use hapwright_eventbus::{
    CorrelationId, EventKind, EventMeta, EventPayload, TemplateRendered, ValidationPhase,
};
use prometheus::Registry;
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};
use support::random::seed;
use tokio::time::timeout;

/// Bound for every wait in this file.
const WAIT: Duration = Duration::from_secs(30);

/// At least this many covered edits are checked against `haproxy -c`.
const EDITS: usize = 1_000;

fn settings(scratch: &std::path::Path, equivalence: bool) -> validator::Config {
    validator::Config {
        binary: PathBuf::from("haproxy"),
        envs: Vec::new(),
        timeout: WAIT,
        scratch_root: Some(scratch.to_path_buf()),
        equivalence,
    }
}

// === a render as data ===

/// One `server` line: `server <name> <address> <before> weight <w> <after>`.
#[derive(Clone, Debug)]
struct Server {
    name: String,
    address: String,
    before: String,
    weight: Option<u32>,
    after: String,
}

impl Server {
    fn new(name: &str, address: &str, before: &str, weight: Option<u32>, after: &str) -> Self {
        Self {
            name: name.to_owned(),
            address: address.to_owned(),
            before: before.to_owned(),
            weight,
            after: after.to_owned(),
        }
    }

    fn line(&self) -> String {
        let mut words = vec!["server".to_owned(), self.name.clone(), self.address.clone()];
        words.extend(self.before.split_whitespace().map(str::to_owned));
        if let Some(weight) = self.weight {
            words.push("weight".to_owned());
            words.push(weight.to_string());
        }
        words.extend(self.after.split_whitespace().map(str::to_owned));
        words.join(" ")
    }
}

/// A proxy section holding servers.
#[derive(Clone, Debug)]
struct Proxy {
    header: String,
    settings: Vec<String>,
    servers: Vec<Server>,
    /// Comment or blank lines: before the header (`None`) or before the body line
    /// of that index (the number of body lines: after the last one).
    comments: Vec<(Option<usize>, String)>,
}

/// Everything a render holds, so edits can change one value and re-render.
#[derive(Clone, Debug)]
struct Render {
    proxies: Vec<Proxy>,
    /// `maps/hosts.map` (used by `map`), `maps/tiers.map` (by `map_str`),
    /// `maps/nets.map` (by `map_ip`).
    maps: BTreeMap<String, Vec<(String, String)>>,
    cert: String,
    extra_file: Option<(String, String)>,
}

const HEAD: &str = "global
    log stderr format short local0 notice

defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s

frontend fe_main
    bind 127.0.0.1:18080
    http-request set-header X-Tier %[req.hdr(host),lower,map_str(maps/tiers.map,none)]
    http-request set-header X-Net %[src,map_ip(maps/nets.map,none)]
    use_backend %[req.hdr(host),lower,map(maps/hosts.map,be_default)]
    default_backend be_default
";

impl Render {
    fn base() -> Self {
        let proxy = |header: &str, settings: &[&str], servers: Vec<Server>| Proxy {
            header: header.to_owned(),
            settings: settings.iter().map(|s| (*s).to_owned()).collect(),
            servers,
            comments: Vec::new(),
        };
        let pairs = |items: &[(&str, &str)]| {
            items
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<Vec<_>>()
        };
        Self {
            proxies: vec![
                proxy(
                    "backend be_default",
                    &[],
                    vec![Server::new("d1", "127.0.0.1:9001", "check", Some(10), "")],
                ),
                proxy(
                    "backend be_api",
                    &["balance leastconn", "option httpchk GET /healthz"],
                    vec![
                        Server::new("a1", "10.0.0.1:8080", "check", Some(10), "inter 2s"),
                        Server::new("a2", "[2001:db8::2]:8080", "", Some(20), "check"),
                        Server::new("a3", "10.0.0.3:8080", "maxconn 100", Some(1), ""),
                        Server::new("a4", "10.0.0.4:8080", "check", None, ""),
                    ],
                ),
                proxy(
                    "backend be_static",
                    &["balance roundrobin"],
                    vec![
                        Server::new("s1", "192.0.2.10:80", "", Some(256), ""),
                        Server::new("s2", "192.0.2.11:80", "backup", Some(0), ""),
                    ],
                ),
                proxy(
                    "listen li_admin",
                    &["bind 127.0.0.1:18081"],
                    vec![Server::new("m1", "127.0.0.1:9100", "", Some(5), "check")],
                ),
            ],
            maps: [
                (
                    "hosts.map".to_owned(),
                    pairs(&[
                        ("api.example.com", "be_api"),
                        ("static.example.com", "be_static"),
                    ]),
                ),
                (
                    "tiers.map".to_owned(),
                    pairs(&[("api.example.com", "gold")]),
                ),
                ("nets.map".to_owned(), pairs(&[("10.0.0.0/8", "internal")])),
            ]
            .into(),
            cert: "not used by the config, but deployed\n".to_owned(),
            extra_file: None,
        }
    }

    fn main(&self) -> String {
        let mut out = HEAD.to_owned();
        let comments = |out: &mut String, proxy: &Proxy, at: Option<usize>| {
            for (_, text) in proxy.comments.iter().filter(|(place, _)| *place == at) {
                out.push_str(text);
                out.push('\n');
            }
        };
        for proxy in &self.proxies {
            out.push('\n');
            comments(&mut out, proxy, None);
            out.push_str(&proxy.header);
            out.push('\n');
            let body: Vec<String> = proxy
                .settings
                .iter()
                .cloned()
                .chain(proxy.servers.iter().map(Server::line))
                .collect();
            for (index, line) in body.iter().enumerate() {
                comments(&mut out, proxy, Some(index));
                out.push_str("    ");
                out.push_str(line);
                out.push('\n');
            }
            // Comments placed past the end (the body may have lost lines) go last.
            for (_, text) in proxy
                .comments
                .iter()
                .filter(|(place, _)| place.is_some_and(|p| p >= body.len()))
            {
                out.push_str(text);
                out.push('\n');
            }
        }
        out
    }

    fn rendered(&self) -> RenderedConfig {
        let mut builder = RenderedConfig::builder(self.main());
        for (name, entries) in &self.maps {
            let text: String = entries.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
            builder = builder.map(name.clone(), text);
        }
        builder = builder.certificate("site.pem", self.cert.clone());
        if let Some((name, content)) = &self.extra_file {
            builder = builder.file(name.clone(), content.clone());
        }
        builder.build()
    }

    fn servers_mut(&mut self) -> Vec<&mut Server> {
        self.proxies
            .iter_mut()
            .flat_map(|p| p.servers.iter_mut())
            .collect()
    }
}

// === random values ===

struct Random {
    rng: TestRng,
}

impl Random {
    fn new(seed: u64) -> Self {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        Self {
            rng: TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
        }
    }

    fn below(&mut self, n: usize) -> usize {
        (self.rng.next_u64() % n as u64) as usize
    }

    fn range(&mut self, low: u32, high: u32) -> u32 {
        low + (self.rng.next_u64() % u64::from(high - low + 1)) as u32
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn ipv4(&mut self) -> Ipv4Addr {
        Ipv4Addr::from(self.rng.next_u64() as u32)
    }

    fn ipv6(&mut self) -> Ipv6Addr {
        let mut groups = [0u16; 8];
        for group in &mut groups {
            // Runs of zero groups make the `::` forms.
            if !self.chance(40) {
                *group = self.rng.next_u64() as u16;
            }
        }
        Ipv6Addr::from(groups)
    }

    /// An IP literal with a port, in every form the rule accepts.
    fn address(&mut self) -> String {
        let port = self.range(1, 65535);
        match self.below(3) {
            0 => format!("{}:{port}", self.ipv4()),
            1 => format!("[{}]:{port}", self.ipv6()),
            _ => format!("{}:{port}", self.ipv6()),
        }
    }

    fn word(&mut self, alphabet: &[u8], low: u32, high: u32) -> String {
        (0..self.range(low, high))
            .map(|_| char::from(*self.pick(alphabet)))
            .collect()
    }

    fn host(&mut self) -> String {
        format!(
            "{}.example.{}",
            self.word(b"abcdefghijklmnopqrstuvwxyz0123456789-", 1, 12),
            self.pick(&["com", "org", "net"])
        )
    }

    /// A map value: any printable text, spaces inside included.
    fn value(&mut self) -> String {
        let mut value = self.word(
            b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:;,!?=+*()[]{}<>@%&|~^` \"'\\#$",
            1,
            24,
        );
        if self.chance(10) {
            value.push_str("\u{e9}\u{4e2d}");
        }
        let value = value.trim();
        if value.is_empty() {
            "x".to_owned()
        } else {
            value.to_owned()
        }
    }
}

// === covered edits ===

/// Applies one random edit the rule covers; returns what it did.
fn covered_edit(render: &mut Render, random: &mut Random) -> &'static str {
    match random.below(7) {
        6 => {
            // Comment and blank lines added or removed: every line after them moves.
            let proxy = random.below(render.proxies.len());
            let proxy = &mut render.proxies[proxy];
            if !proxy.comments.is_empty() && random.chance(30) {
                let at = random.below(proxy.comments.len());
                proxy.comments.remove(at);
                return "comment removed";
            }
            let lines = proxy.settings.len() + proxy.servers.len();
            let place = random.below(lines + 2);
            let place = (place <= lines).then_some(place);
            let text = random
                .pick(&[
                    "",
                    "#",
                    "    # TLS: Secret shop/site is missing; its hosts are served over HTTP only",
                    "# hapwright:Conflict Ingress a/b: refused",
                    "\t# server x 10.0.0.1:80",
                ])
                .to_string();
            proxy.comments.push((place, text));
            "comment lines"
        }
        0 => {
            let servers = render.servers_mut();
            let at = random.below(servers.len());
            let address = random.address();
            servers.into_iter().nth(at).unwrap().address = address;
            "address"
        }
        1 => {
            let servers = render.servers_mut();
            let at = random.below(servers.len());
            let port = random.range(1, 65535);
            let server = servers.into_iter().nth(at).unwrap();
            let (host, _) = server.address.rsplit_once(':').unwrap();
            server.address = format!("{host}:{port}");
            "port"
        }
        2 => {
            let weight = random.range(0, 256);
            let weighted: Vec<&mut Server> = render
                .servers_mut()
                .into_iter()
                .filter(|s| s.weight.is_some())
                .collect();
            let at = random.below(weighted.len());
            weighted.into_iter().nth(at).unwrap().weight = Some(weight);
            "weight"
        }
        3 => {
            let map = if random.chance(50) {
                "hosts.map"
            } else {
                "tiers.map"
            };
            let value = if map == "hosts.map" && random.chance(50) {
                random
                    .pick(&["be_api", "be_static", "be_default", "li_admin"])
                    .to_string()
            } else {
                random.value()
            };
            let entries = render.maps.get_mut(map).unwrap();
            if entries.is_empty() {
                let host = random.host();
                entries.push((host, value));
            } else {
                let at = random.below(entries.len());
                entries[at].1 = value;
            }
            "map value"
        }
        4 => {
            let map = if random.chance(50) {
                "hosts.map"
            } else {
                "tiers.map"
            };
            let key = random.host();
            let value = random.value();
            render.maps.get_mut(map).unwrap().push((key, value));
            "map entry added"
        }
        _ => {
            let map = if random.chance(50) {
                "hosts.map"
            } else {
                "tiers.map"
            };
            let entries = render.maps.get_mut(map).unwrap();
            if !entries.is_empty() {
                let at = random.below(entries.len());
                entries.remove(at);
            }
            "map entry removed"
        }
    }
}

fn baseline(render: &Render) -> Baseline {
    let rendered = Arc::new(render.rendered());
    let (_, model) = validator::validate_phase1_parsed(&rendered).expect("base passes phase 1");
    Baseline {
        rendered,
        model: Arc::new(model),
    }
}

/// The rule's verdict on `candidate`, or `None` when phase 1 already rejects it
/// (then phase 2 is never reached, by equivalence or otherwise).
fn verdict(baseline: &Baseline, candidate: &RenderedConfig) -> Option<Equivalence> {
    let (_, model) = validator::validate_phase1_parsed(candidate).ok()?;
    Some(equivalence::compare(baseline, candidate, &model))
}

#[tokio::test]
async fn every_config_accepted_by_equivalence_passes_haproxy_c() {
    let seed = seed("HAPWRIGHT_EQUIVALENCE_SEED");
    let mut random = Random::new(seed);
    let scratch = tempfile::tempdir().unwrap();
    let config = settings(scratch.path(), true);
    let base = Render::base();
    validator::validate(&base.rendered(), &config)
        .await
        .unwrap_or_else(|rejection| panic!("the base config is valid: {rejection}"));
    let baseline = baseline(&base);

    let mut edits = 0;
    let mut variants = 0;
    let mut reasons = BTreeMap::new();
    while edits < EDITS {
        let mut variant = base.clone();
        let mut done = Vec::new();
        for _ in 0..random.range(1, 15) {
            done.push(covered_edit(&mut variant, &mut random));
        }
        edits += done.len();
        variants += 1;
        let rendered = variant.rendered();
        let verdict = verdict(&baseline, &rendered);
        let Some(Equivalence::Equivalent(reason)) = verdict else {
            panic!(
                "seed {seed}: covered edits {done:?} were not accepted by equivalence: \
                 {verdict:?}\n{}",
                rendered.main()
            );
        };
        *reasons.entry(reason.as_str()).or_insert(0) += 1;
        // The validator's guess before phase 1 agrees, so it does not start
        // `haproxy -c` early for a render the rule then passes.
        assert!(
            equivalence::likely_equivalent(&baseline, &rendered),
            "seed {seed}: covered edits {done:?} are not likely equivalent"
        );
        if let Err(rejection) = validator::validate_phase2(&rendered, &config).await {
            panic!(
                "seed {seed}: accepted by equivalence ({reason}) but haproxy -c rejects \
                 it after {done:?}: {rejection}\nhaproxy.cfg:\n{}\nmaps: {:?}",
                rendered.main(),
                rendered.maps()
            );
        }
    }
    assert!(variants >= 80, "seed {seed}: {variants} variants");
    assert!(
        reasons.contains_key(SkipReason::ServersAndMaps.as_str()),
        "seed {seed}: {reasons:?}"
    );
    eprintln!(
        "seed {seed}: {edits} edits in {variants} variants, all passed haproxy -c: {reasons:?}"
    );
}

// === edits outside the rule ===

/// Applies one random edit the rule must not accept; returns what it did.
fn uncovered_edit(render: &mut Render, random: &mut Random, kind: usize) -> String {
    let server = |render: &mut Render, random: &mut Random| -> (usize, usize) {
        let proxy = random.below(render.proxies.len());
        let server = random.below(render.proxies[proxy].servers.len());
        (proxy, server)
    };
    let (p, s) = server(render, random);
    let port = random.range(1, 65535);
    let target = &mut render.proxies[p].servers[s];
    match kind {
        0 => {
            let host = if random.chance(20) {
                "localhost".to_owned()
            } else {
                random.host()
            };
            target.address = format!("{host}:{port}");
            format!("host name {}", target.address)
        }
        1 => {
            let keyword = random
                .pick(&[
                    "backup",
                    "ssl verify none",
                    "maxconn 50",
                    "disabled",
                    "send-proxy",
                    "check",
                    "inter 3s",
                    "agent-check",
                    "slowstart 10s",
                    "nbd",
                ])
                .to_string();
            target.after = format!("{} {keyword}", target.after);
            format!("new keyword {keyword}")
        }
        2 => {
            let a = random.range(0, 255);
            let b = random.range(0, 255);
            let address = random
                .pick(&[
                    format!("{}.{a}.{b}.1:{port}", random_bad_octet(a)),
                    format!("{a}.{b}.3:{port}"),
                    format!("{a}.{b}.3.4"),
                    format!("{a}.{b}.3.4:0"),
                    format!("{a}.{b}.3.4:{}", 65536 + port),
                    format!("{a}.{b}.3.4:0{port}"),
                    format!("{a}.{b}.3.4:+{}", port % 10),
                    format!("{a}.{b}.3.4:{port}-{}", port + 1),
                    format!("[2001:db8::{a:x}]"),
                    format!("2001:db8::{a:x}::1:{port}"),
                    format!("ipv4@{a}.{b}.3.4:{port}"),
                    format!("unix@/run/s{a}.sock"),
                    format!("{a}.{b}.3.4:{port}x"),
                ])
                .clone();
            target.address = address.clone();
            format!("malformed address {address}")
        }
        3 => {
            target.address = random
                .pick(&[
                    format!("${{SRV_{port}}}:80"),
                    format!("10.0.0.1:${{PORT_{port}}}"),
                    "\"${SRV}\":80".to_owned(),
                ])
                .clone();
            format!("environment reference {}", target.address)
        }
        4 => {
            let address = random.address();
            let name = format!("n{port}");
            render.proxies[p]
                .servers
                .push(Server::new(&name, &address, "", None, ""));
            format!("added server {name}")
        }
        5 => {
            let removed = render.proxies[p].servers.remove(s);
            if render.proxies[p].servers.is_empty() {
                render.proxies[p].servers.push(Server::new(
                    "other",
                    &removed.address,
                    "",
                    None,
                    "",
                ));
            }
            format!("removed server {}", removed.name)
        }
        6 => {
            render.proxies[1].header = format!("backend be_api_{port}");
            "renamed backend".to_owned()
        }
        7 => {
            render.cert.push_str(&format!("# {port}\n"));
            "changed certificate".to_owned()
        }
        8 => {
            target.name = format!("{}_{port}", target.name);
            format!("renamed server {}", target.name)
        }
        9 => {
            let weight = random
                .pick(&[
                    (257 + port % 1000).to_string(),
                    "-1".to_owned(),
                    format!("0{}", port % 100),
                    "ten".to_owned(),
                    format!("{}%", port % 100),
                ])
                .clone();
            // Same words where the server had a weight, one more where it had none.
            target.weight = None;
            target.before = format!("{} weight {weight}", target.before);
            format!("bad weight {weight}")
        }
        10 => {
            let value = random.value();
            render
                .maps
                .get_mut("nets.map")
                .unwrap()
                .push((format!("192.168.{}.0/24", port % 256), value));
            "map_ip map changed".to_owned()
        }
        11 => {
            let control = *random.pick(&['\u{1}', '\r', '\u{7f}', '\u{1b}', '\0']);
            let value = format!("v{control}x");
            render
                .maps
                .get_mut("tiers.map")
                .unwrap()
                .push((random.host(), value));
            "control character in a map".to_owned()
        }
        12 => {
            let setting = random
                .pick(&[
                    "balance roundrobin".to_owned(),
                    format!("timeout server {}s", port % 60 + 1),
                    "option httpchk GET /ready".to_owned(),
                ])
                .clone();
            render.proxies[1].settings[0] = setting.clone();
            format!("changed setting {setting}")
        }
        13 => {
            target.address = format!("\"{}\"", random.address());
            "quoted address".to_owned()
        }
        14 => {
            render.extra_file = Some((format!("f{port}.txt"), "x\n".to_owned()));
            "new file".to_owned()
        }
        _ => {
            render.maps.insert(
                format!("new{port}.map"),
                vec![("a".to_owned(), "b".to_owned())],
            );
            "new map".to_owned()
        }
    }
}

/// A first octet above 255.
fn random_bad_octet(a: u32) -> u32 {
    256 + a
}

const UNCOVERED_KINDS: usize = 16;

#[test]
fn edits_outside_the_rule_are_never_accepted() {
    let seed = seed("HAPWRIGHT_EQUIVALENCE_SEED");
    let mut random = Random::new(seed);
    let base = Render::base();
    let baseline = baseline(&base);
    let mut judged = [0usize; UNCOVERED_KINDS];
    for round in 0..UNCOVERED_KINDS * 40 {
        let kind = round % UNCOVERED_KINDS;
        let mut variant = base.clone();
        // Mixed with covered edits (before, so they cannot undo it).
        for _ in 0..random.below(3) {
            covered_edit(&mut variant, &mut random);
        }
        let what = uncovered_edit(&mut variant, &mut random, kind);
        let rendered = variant.rendered();
        match verdict(&baseline, &rendered) {
            None => {}
            Some(Equivalence::Different(_)) => judged[kind] += 1,
            Some(Equivalence::Equivalent(reason)) => panic!(
                "seed {seed}: {what} was accepted by equivalence ({reason})\n{}\nmaps: {:?}",
                rendered.main(),
                rendered.maps()
            ),
        }
    }
    // Phase 1 may reject some of them first; the rule itself must see most of each kind.
    for (kind, count) in judged.iter().enumerate() {
        assert!(
            *count >= 20,
            "seed {seed}: kind {kind} judged by the rule only {count} times"
        );
    }
}

// === the component ===

struct Harness {
    registry: Registry,
    publisher: hapwright_eventbus::Publisher,
    probe: hapwright_eventbus::Subscription,
    running: hapwright_eventbus::RunningKernel,
}

impl Harness {
    fn start(config: validator::Config) -> Self {
        Self::start_shared(config, None)
    }

    fn start_shared(config: validator::Config, shared: Option<validator::Service>) -> Self {
        let bus = TestBus::new();
        let registry = bus.registry().clone();
        let probe = bus.subscribe(
            "probe",
            [EventKind::ValidationCompleted, EventKind::ValidationFailed],
        );
        let metrics = validator::Metrics::register(&registry).unwrap();
        let component = match shared {
            Some(service) => Validator::with_service(service, metrics),
            None => Validator::new(config, metrics),
        };
        let publisher = bus.publisher();
        let running = bus.start(|kernel| {
            kernel.register(component);
        });
        Self {
            registry,
            publisher,
            probe,
            running,
        }
    }

    /// Publishes a render and returns the validator's reply payload.
    async fn validate(&mut self, render: &Render) -> EventPayload {
        let correlation = CorrelationId::new();
        self.publisher.publish_with(
            TemplateRendered {
                config: Arc::new(render.rendered()),
                duration: Duration::ZERO,
                render: Default::default(),
            },
            EventMeta::correlated(correlation),
        );
        let reply = timeout(WAIT, self.probe.recv())
            .await
            .expect("the validator replies")
            .expect("the bus is open");
        assert_eq!(reply.correlation_id, Some(correlation));
        reply.payload.clone()
    }

    fn text(&self) -> String {
        let mut text = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&self.registry.gather(), &mut text)
            .unwrap();
        text
    }

    /// The value of one series; a labelled series not created yet counts as 0.
    fn metric(&self, series: &str) -> u64 {
        let mut text = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&self.registry.gather(), &mut text)
            .unwrap();
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// `haproxy -c` runs so far, whatever their result.
    fn haproxy_runs(&self) -> u64 {
        self.metric(r#"hapwright_validation_duration_seconds_count{phase="haproxy"}"#)
    }

    async fn stop(self) {
        let report = self.running.shutdown(WAIT).await;
        assert!(report.aborted.is_empty());
    }
}

fn skipped(payload: &EventPayload) -> Option<&'static str> {
    match payload {
        EventPayload::ValidationCompleted(done) => done.phase2_skipped,
        other => panic!("expected ValidationCompleted, got {other:?}"),
    }
}

#[tokio::test]
async fn the_component_skips_haproxy_c_for_an_equivalent_render_only() {
    let scratch = tempfile::tempdir().unwrap();
    let mut harness = Harness::start(settings(scratch.path(), true));
    for reason in SkipReason::ALL {
        let series = format!(
            "hapwright_validation_phase2_skipped_total{{reason=\"{}\"}}",
            reason.as_str()
        );
        let text = harness.text();
        assert!(
            text.contains(&format!("{series} 0")),
            "{series} starts at 0:\n{text}"
        );
    }
    let skipped_servers =
        r#"hapwright_validation_phase2_skipped_total{reason="equivalent_servers"}"#;

    // 1. The first render runs haproxy -c.
    let mut render = Render::base();
    assert_eq!(skipped(&harness.validate(&render).await), None);
    assert_eq!(harness.haproxy_runs(), 1);

    // 2. Only a server address differs: passed by equivalence.
    render.proxies[1].servers[0].address = "10.9.9.9:8443".to_owned();
    assert_eq!(
        skipped(&harness.validate(&render).await),
        Some("equivalent_servers")
    );
    assert_eq!(harness.haproxy_runs(), 1, "haproxy -c ran once");
    assert_eq!(harness.metric(skipped_servers), 1);

    // 3. A new keyword: haproxy -c runs again.
    render.proxies[1].servers[0].after = "inter 2s backup".to_owned();
    assert_eq!(skipped(&harness.validate(&render).await), None);
    assert_eq!(harness.haproxy_runs(), 2);

    // 4. Outside the rule and invalid: haproxy -c runs and rejects.
    let mut invalid = render.clone();
    invalid.proxies[2].servers[0].weight = Some(257);
    match harness.validate(&invalid).await {
        EventPayload::ValidationFailed(failed) => {
            assert_eq!(failed.phase, ValidationPhase::Haproxy);
        }
        other => panic!("expected ValidationFailed, got {other:?}"),
    }
    assert_eq!(harness.haproxy_runs(), 3);

    // 5. Compared with the last render that passed (3), not the rejected one.
    render.proxies[1].servers[1].address = "[2001:db8::99]:9000".to_owned();
    render
        .maps
        .get_mut("tiers.map")
        .unwrap()
        .push(("new.example.com".to_owned(), "silver".to_owned()));
    assert_eq!(
        skipped(&harness.validate(&render).await),
        Some("equivalent_servers_and_maps")
    );
    assert_eq!(harness.haproxy_runs(), 3);
    assert_eq!(harness.metric(skipped_servers), 1);
    assert_eq!(
        harness.metric(
            r#"hapwright_validation_phase2_skipped_total{reason="equivalent_servers_and_maps"}"#
        ),
        1
    );
    harness.stop().await;
}

/// The warnings of a validation, as `line: message` in `haproxy.cfg`.
fn warnings(payload: &EventPayload) -> Vec<(Option<u32>, String)> {
    match payload {
        EventPayload::ValidationCompleted(done) => done
            .warnings
            .iter()
            .filter(|w| w.location.as_ref().is_some_and(|l| l.file == "haproxy.cfg"))
            .map(|w| (w.location.as_ref().and_then(|l| l.line), w.message.clone()))
            .collect(),
        other => panic!("expected ValidationCompleted, got {other:?}"),
    }
}

/// The 1-based line of `text` that reads `line` (trimmed).
fn line_of(text: &str, line: &str) -> u32 {
    let index = text
        .lines()
        .position(|l| l.trim() == line)
        .unwrap_or_else(|| panic!("`{line}` in\n{text}"));
    u32::try_from(index + 1).unwrap()
}

#[tokio::test]
async fn the_references_warnings_follow_the_lines_comments_moved() {
    let scratch = tempfile::tempdir().unwrap();
    let mut harness = Harness::start(settings(scratch.path(), true));
    // A rule after use_backend: HAProxy warns about it, at its line.
    let mut render = Render::base();
    render.proxies.push(Proxy {
        header: "frontend fe_warn".to_owned(),
        settings: vec![
            "bind 127.0.0.1:18082".to_owned(),
            "use_backend be_api".to_owned(),
            "http-request set-header X-Late 1".to_owned(),
        ],
        servers: Vec::new(),
        comments: Vec::new(),
    });
    let late = "http-request set-header X-Late 1";
    let first = harness.validate(&render).await;
    assert_eq!(skipped(&first), None);
    let before = warnings(&first);
    let at = line_of(&render.main(), late);
    assert!(
        before.iter().any(|(line, _)| *line == Some(at)),
        "HAProxy warns at line {at}: {before:?}"
    );

    // Comment and blank lines before the frontend and inside it: the render passes
    // by equivalence, and the warning names the rule's new line.
    for (place, text) in [(None, "# one"), (None, ""), (Some(1), "    # two")] {
        render.proxies[4].comments.push((place, text.to_owned()));
    }
    render.proxies[0]
        .comments
        .push((None, "# TLS: Secret shop/site is missing".to_owned()));
    let second = harness.validate(&render).await;
    assert_eq!(skipped(&second), Some("identical"));
    assert_eq!(harness.haproxy_runs(), 1);
    let now = line_of(&render.main(), late);
    assert_eq!(now, at + 4);
    let after = warnings(&second);
    assert_eq!(after.len(), before.len(), "{after:?}");
    assert!(
        after.iter().any(|(line, _)| *line == Some(now)),
        "the warning moved to line {now}: {after:?}"
    );
    assert!(
        !after.iter().any(|(line, _)| *line == Some(at)),
        "no warning is left at line {at}: {after:?}"
    );
    // No message names the line the rule had before.
    for (_, message) in &after {
        assert!(!message.contains(&format!("haproxy.cfg:{at}")), "{message}");
    }
    harness.stop().await;
}

#[tokio::test]
async fn switched_off_every_render_runs_haproxy_c() {
    let scratch = tempfile::tempdir().unwrap();
    let mut harness = Harness::start(settings(scratch.path(), false));
    let mut render = Render::base();
    assert_eq!(skipped(&harness.validate(&render).await), None);
    render.proxies[1].servers[0].address = "10.9.9.9:8443".to_owned();
    assert_eq!(skipped(&harness.validate(&render).await), None);
    assert_eq!(harness.haproxy_runs(), 2);
    harness.stop().await;
}

#[tokio::test]
async fn a_render_that_passed_elsewhere_is_the_baseline_and_the_component_publishes_its_own() {
    let scratch = tempfile::tempdir().unwrap();
    let shared = validator::Service::new(settings(scratch.path(), true));
    let mut harness = Harness::start_shared(settings(scratch.path(), true), Some(shared.clone()));

    // Another step (the quarantine's search) passed `haproxy -c` with this render.
    let mut render = Render::base();
    shared
        .validate(&Arc::new(render.rendered()), None)
        .await
        .expect("the quarantine's probe passes");

    // Only a server address differs from it: no haproxy -c in the component.
    render.proxies[1].servers[0].address = "10.9.9.9:8443".to_owned();
    assert_eq!(
        skipped(&harness.validate(&render).await),
        Some("equivalent_servers")
    );
    assert_eq!(harness.haproxy_runs(), 0);

    // A render the component passes with haproxy -c is the shared baseline too.
    render.proxies[1].servers[0].after = "inter 2s backup".to_owned();
    assert_eq!(skipped(&harness.validate(&render).await), None);
    assert_eq!(harness.haproxy_runs(), 1);
    let published = shared.baseline().expect("published");
    assert_eq!(published.rendered.hash(), render.rendered().hash());
    harness.stop().await;
}
