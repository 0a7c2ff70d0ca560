//! Differential test of `hapwright plan`'s verdict: random sequences of changes —
//! server weights, states, addresses, options, servers added and removed in a backend
//! with a dynamic and one with a static balance algorithm, map entries, a timeout, a
//! plain file added, changed and removed, whole backends added and removed
//! (`haproxy.dynamicBackends`), certificates of a crt-list added, renewed and removed
//! and their SNI filters changed, files edited behind hapwright's back, controller
//! restarts — are planned the way `hapwright plan` plans them (the instance's config
//! directory read back with [`Recorded::read`], [`plan_against`] with the options the
//! HAProxy binary's line gives), then deployed by the socket driver to a real HAProxy.
//! After every step the driver's strategy must be the plan's, and a reload's class
//! the plan's first cause.
//!
//! The sequence is drawn from a seed, printed as `HAPWRIGHT_SEED=<n>`; setting that
//! variable replays it.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::Driver;
use hapwright_deployer::driver::{Deployed, Recorded, plan_against};
use hapwright_deployer::haproxy::files::ConfigDir;
use hapwright_deployer::haproxy::plan::PlanOptions;
use hapwright_eventbus::model::{DeployStrategy, RenderedConfig, SourceMap, haproxy::parse_main};
use support::random::{Draw, seed};
use support::tls::certificate;
use support::{Haproxy, dynamic_driver, free_port, haproxy_line};

const STEPS: usize = 60;
/// Server slots of each of the two backends with servers that change.
const SLOTS: usize = 5;
/// Route backends (`backend be_r<i> from routes`) that come and go.
const ROUTES: usize = 4;

/// One server line's values.
#[derive(Clone, Debug)]
struct Server {
    /// Last octet of `127.0.0.x`.
    ip: u8,
    port: u16,
    weight: u32,
    disabled: bool,
    maxconn: Option<u32>,
}

impl Server {
    fn draw(draw: &mut Draw) -> Self {
        Self {
            ip: 1 + u8::try_from(draw.below(4)).unwrap(),
            port: 20000 + u16::try_from(draw.below(50)).unwrap(),
            weight: 1 + u32::try_from(draw.below(100)).unwrap(),
            disabled: draw.chance(4),
            maxconn: None,
        }
    }

    fn line(&self, name: &str) -> String {
        let mut line = format!(
            "    server {name} 127.0.0.{}:{} weight {}",
            self.ip, self.port, self.weight
        );
        if self.disabled {
            line.push_str(" disabled");
        }
        if let Some(maxconn) = self.maxconn {
            line.push_str(&format!(" maxconn {maxconn}"));
        }
        line
    }
}

/// What the render is made of; every mutation changes one part.
#[derive(Clone, Debug)]
struct Model {
    port: u16,
    timeout_client: u32,
    /// `be_pool` (roundrobin: servers can be added at runtime).
    pool: BTreeMap<usize, Server>,
    /// `be_hash` (`balance source`: servers cannot be added at runtime).
    hash: BTreeMap<usize, Server>,
    /// `hosts.map` entries: host number → route backend or `be_pool`.
    hosts: BTreeMap<usize, String>,
    /// Route backends present, each with its one server's port.
    routes: BTreeMap<usize, u16>,
    /// `files/extra.txt`, when present.
    extra: Option<String>,
    /// The TLS frontend's port.
    tls_port: u16,
    /// PEMs the certificates draw from.
    pems: Arc<Vec<String>>,
    /// `certs/<name>` → (PEM index, SNI filters of its `files/tls.crtlist` line).
    certs: BTreeMap<String, (usize, Vec<String>)>,
}

impl Model {
    fn render(&self) -> Arc<RenderedConfig> {
        let mut cfg = format!(
            "global\n    stats timeout 30s\n\n\
defaults routes\n    mode http\n    balance roundrobin\n    timeout connect 2s\n    timeout client {}s\n    timeout server 10s\n\n\
frontend fe_main from routes\n    bind 127.0.0.1:{}\n    use_backend %[req.hdr(host),lower,word(1,:),map(maps/hosts.map,be_pool)]\n    default_backend be_pool\n\n\
frontend fe_tls from routes\n    bind 127.0.0.1:{} ssl strict-sni crt-list files/tls.crtlist\n    http-request return status 200 content-type text/plain string ok\n\n\
backend be_pool from routes\n",
            self.timeout_client, self.port, self.tls_port
        );
        for (slot, server) in &self.pool {
            cfg.push_str(&server.line(&format!("p{slot}")));
            cfg.push('\n');
        }
        cfg.push_str("\nbackend be_hash from routes\n    balance source\n");
        for (slot, server) in &self.hash {
            cfg.push_str(&server.line(&format!("h{slot}")));
            cfg.push('\n');
        }
        for (route, port) in &self.routes {
            cfg.push_str(&format!(
                "\nbackend be_r{route} from routes\n    server s1 127.0.0.1:{port}\n"
            ));
        }
        let hosts: String = self
            .hosts
            .iter()
            .map(|(host, backend)| format!("h{host}.test {backend}\n"))
            .collect();
        let maps = BTreeMap::from([("hosts.map".to_owned(), Arc::from(hosts.as_str()))]);
        let mut list: String = self
            .certs
            .iter()
            .map(|(name, (_, filters))| format!("certs/{name} {}\n", filters.join(" ")))
            .collect();
        if list.is_empty() {
            list.push('\n');
        }
        let files = self
            .extra
            .iter()
            .map(|text| ("extra.txt".to_owned(), Arc::from(text.as_str())))
            .chain([("tls.crtlist".to_owned(), Arc::from(list.as_str()))])
            .collect();
        let certs = self
            .certs
            .iter()
            .map(|(name, (pem, _))| (name.clone(), Arc::from(self.pems[*pem].as_str())))
            .collect();
        Arc::new(RenderedConfig::new(
            cfg,
            maps,
            files,
            certs,
            SourceMap::default(),
        ))
    }

    /// Applies one random change; returns it in words.
    fn mutate(&mut self, draw: &mut Draw) -> String {
        match draw.below(17) {
            0..=5 => {
                let (name, servers) = if draw.chance(3) {
                    ("h", &mut self.hash)
                } else {
                    ("p", &mut self.pool)
                };
                let slot = draw.below(SLOTS);
                match servers.get_mut(&slot) {
                    None => {
                        servers.insert(slot, Server::draw(draw));
                        format!("add {name}{slot}")
                    }
                    Some(_) if draw.chance(3) => {
                        servers.remove(&slot);
                        format!("remove {name}{slot}")
                    }
                    Some(server) => match draw.below(4) {
                        0 => {
                            server.weight = 1 + u32::try_from(draw.below(100)).unwrap();
                            format!("{name}{slot} weight {}", server.weight)
                        }
                        1 => {
                            server.disabled = !server.disabled;
                            format!("{name}{slot} disabled={}", server.disabled)
                        }
                        2 => {
                            server.ip = 1 + u8::try_from(draw.below(4)).unwrap();
                            server.port = 20000 + u16::try_from(draw.below(50)).unwrap();
                            format!("{name}{slot} address 127.0.0.{}:{}", server.ip, server.port)
                        }
                        _ => {
                            server.maxconn = match server.maxconn {
                                Some(_) => None,
                                None => Some(100),
                            };
                            format!("{name}{slot} maxconn {:?}", server.maxconn)
                        }
                    },
                }
            }
            6..=9 => {
                let host = draw.below(6);
                if self.hosts.contains_key(&host) && draw.chance(2) {
                    self.hosts.remove(&host);
                    return format!("unroute h{host}");
                }
                let backend = match self.routes.keys().nth(draw.below(self.routes.len() + 1)) {
                    Some(route) => format!("be_r{route}"),
                    None => "be_pool".to_owned(),
                };
                let change = format!("route h{host} -> {backend}");
                self.hosts.insert(host, backend);
                change
            }
            10 => {
                self.timeout_client = if self.timeout_client == 10 { 30 } else { 10 };
                format!("timeout client {}s", self.timeout_client)
            }
            11 => match &self.extra {
                None => {
                    self.extra = Some("one\n".to_owned());
                    "add files/extra.txt".to_owned()
                }
                Some(_) if draw.chance(2) => {
                    self.extra = None;
                    "remove files/extra.txt".to_owned()
                }
                Some(text) => {
                    self.extra = Some(format!("{text}more\n"));
                    "change files/extra.txt".to_owned()
                }
            },
            14..=16 => {
                let cert = format!("c{}.pem", draw.below(4));
                let filters = |draw: &mut Draw| -> Vec<String> {
                    (0..draw.below(3))
                        .map(|_| format!("t{}.test", draw.below(4)))
                        .collect()
                };
                match (draw.below(3), self.certs.contains_key(&cert)) {
                    (0, _) => {
                        let pem = draw.below(self.pems.len());
                        let new_filters = filters(draw);
                        let entry = self.certs.entry(cert.clone()).or_insert((pem, new_filters));
                        entry.0 = pem;
                        format!("certs/{cert} {entry:?}")
                    }
                    (1, true) => {
                        let new_filters = filters(draw);
                        let change = format!("certs/{cert} filters {new_filters:?}");
                        self.certs.get_mut(&cert).unwrap().1 = new_filters;
                        change
                    }
                    _ => {
                        self.certs.remove(&cert);
                        format!("remove certs/{cert}")
                    }
                }
            }
            _ => {
                let route = draw.below(ROUTES);
                let backend = format!("be_r{route}");
                if self.routes.remove(&route).is_some() {
                    // Map entries that route to it go in the same render.
                    self.hosts.retain(|_, target| *target != backend);
                    format!("remove backend {backend}")
                } else {
                    let port = 21000 + u16::try_from(draw.below(50)).unwrap();
                    self.routes.insert(route, port);
                    format!("add backend {backend}")
                }
            }
        }
    }
}

/// What `hapwright plan` finds running in `dir`: the deployed config, or `None` when
/// the directory is unknown to the deployer.
fn recorded(dir: &std::path::Path) -> Option<Deployed> {
    match Recorded::read(&ConfigDir::new(dir)).unwrap() {
        Recorded::Found(deployed) => Some(deployed),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plan_verdict_is_what_the_deployer_then_does() {
    let seed = seed("HAPWRIGHT_SEED");
    println!("HAPWRIGHT_SEED={seed}");
    let mut draw = Draw(seed);
    let line = haproxy_line();
    // As `hapwright plan` decides the capability: from the line of the binary.
    let options = PlanOptions::for_line(true, Some(line));
    let scratch = tempfile::tempdir().unwrap();
    let pems: Vec<String> = (0..4)
        .map(|i| certificate(scratch.path(), &format!("pem{i}")))
        .collect();
    let mut model = Model {
        port: free_port(),
        timeout_client: 10,
        pool: BTreeMap::new(),
        hash: BTreeMap::new(),
        hosts: BTreeMap::new(),
        routes: BTreeMap::new(),
        extra: None,
        tls_port: free_port(),
        pems: Arc::new(pems),
        certs: BTreeMap::from([("base.pem".to_owned(), (0, vec!["base.test".to_owned()]))]),
    };
    for slot in 0..3 {
        model.pool.insert(slot, Server::draw(&mut draw));
        model.hash.insert(slot, Server::draw(&mut draw));
    }
    let v1 = model.render();
    let haproxy = Haproxy::start("plan-differential", &v1, &v1.hash().short()).await;
    let driver = dynamic_driver(&haproxy, Duration::from_secs(2));
    let mut running = Arc::new(driver.deploy(v1, None, None, false).await.unwrap());
    let mut history: Vec<String> = Vec::new();
    let mut seen = BTreeMap::<&str, usize>::new();

    for step in 0..STEPS {
        // Zero to three changes per deployment, mostly one.
        let count = match draw.below(6) {
            0 => 0,
            1..=3 => 1,
            _ => 2 + draw.below(2),
        };
        let mut changes = Vec::new();
        for _ in 0..count {
            changes.push(model.mutate(&mut draw));
        }
        // Now and then someone edits a file behind hapwright's back, or the controller
        // restarts (it then reads what the instance runs from the directory).
        let tampered = draw.chance(12);
        if tampered {
            let map = haproxy.path().join("maps/hosts.map");
            let mut text = std::fs::read_to_string(&map).unwrap();
            text.push_str("edited.test be_pool\n");
            std::fs::write(&map, text).unwrap();
            changes.push("maps/hosts.map edited on disk".to_owned());
        }
        let restart = tampered || draw.chance(5);
        if restart {
            changes.push("controller restart".to_owned());
        }
        history.push(if changes.is_empty() {
            "nothing".to_owned()
        } else {
            changes.join(", ")
        });
        let context = || format!("HAPWRIGHT_SEED={seed}, step {step}: {history:#?}");

        let desired = model.render();
        let desired_model = parse_main(&desired).unwrap();
        let found = recorded(haproxy.path());
        assert_eq!(found.is_none(), tampered, "{}", context());
        let plan = plan_against(found.as_ref(), &desired, &desired_model, &options);
        if let Some(found) = &found {
            // The directory says what the deployer remembers.
            let remembered = plan_against(Some(&running), &desired, &desired_model, &options);
            assert_eq!(remembered.strategy(), plan.strategy(), "{}", context());
            assert_eq!(found.config.hash(), running.config.hash(), "{}", context());
        }

        let deployed = driver
            .deploy(
                desired,
                Some(desired_model),
                (!restart).then(|| running.clone()),
                false,
            )
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", context()));
        assert_eq!(
            deployed.strategy,
            plan.strategy(),
            "{}\nplan: {:?}\ndeployed: {:?}",
            context(),
            plan.reason(),
            deployed.reason
        );
        if plan.strategy() == DeployStrategy::Reload {
            assert_eq!(
                deployed.reason.reload,
                plan.reason().reload,
                "{}\nplan: {:?}\ndeployed: {:?}",
                context(),
                plan.reason(),
                deployed.reason
            );
        }
        *seen.entry(plan.strategy().as_str()).or_default() += 1;
        running = Arc::new(deployed);
    }
    println!("HAPWRIGHT_SEED={seed}: verdicts {seen:?}");
    // Every verdict was put to the test.
    assert_eq!(seen.len(), 3, "HAPWRIGHT_SEED={seed}: verdicts {seen:?}");
}
