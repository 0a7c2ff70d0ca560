//! The change plan: what it takes to move an instance from the config it
//! runs to the desired one, computed from the parsed models without any I/O.
//!
//! Runtime API, no reload: server address/port, weight and admin state; servers added
//! or removed in backends whose balance algorithm is dynamic (with explicit
//! parameters: `default-server` is not inherited by `add server`); changed map, ACL and
//! certificate contents. Everything else — a section or keyword added, removed or
//! changed, other server options, a file added or removed — needs a reload, and the
//! plan says which one forced it.
//!
//! # Address changes and removals lose no request
//!
//! Measured on HAProxy 2.6.12 with requests in flight and keep-alive clients (details
//! in `docs/deployment.md`):
//! - `set server addr` alone lets requests in flight finish, but their connections
//!   return to the idle pool afterwards and later requests reuse them, reaching the
//!   old address (with `http-reuse` and keep-alive alike);
//! - adding `shutdown sessions server` stops that by answering every request in
//!   flight with 502, so hapwright never sends it;
//! - a server in maintenance takes no new request, lets requests in flight finish, and
//!   an address change closes its idle connections.
//!
//! So an address change of a server that takes traffic is a [`RuntimeOp::MoveServer`]:
//! a stand-in server at the new address takes the traffic while the server drains in
//! maintenance, changes its address (closing every connection to the old one) and
//! comes back; the stand-in is then drained and deleted. The server keeps the config's
//! name, so later plans and reloads address it as before. That needs a dynamic balance
//! algorithm (for `add server`); in other backends such an address change reloads,
//! which loses no request either. A server in maintenance just gets `set server addr`
//! ([`RuntimeOp::SetAddr`]). A removal ([`RuntimeOp::DelServer`]) puts the server in
//! maintenance and deletes it once its connections are gone, bounded by a drain
//! timeout; past it the server stays in maintenance until the next reload.
//!
//! # Whole backends
//!
//! With [`PlanOptions::dynamic_backends`] on (HAProxy 3.4), added and removed backends
//! of the form `backend NAME from PROFILE` are runtime changes too: see
//! [`crate::haproxy::backends`].

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use hapwright_eventbus::model::{DeployReason, DeployStrategy, ReloadReason, RenderedConfig};

use crate::client::runtime::MAX_PAYLOAD_BYTES;
use crate::haproxy::backends::{self, Capability, NotRuntime};
use crate::haproxy::config::{self as haproxy_config, Config, Directive, Section, Server};

/// What the instance can do beyond the runtime changes every line offers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanOptions {
    /// Whether added and removed backends can be runtime changes
    /// (`haproxy.dynamicBackends` and a line with `add backend`).
    pub dynamic_backends: Capability,
}

impl PlanOptions {
    /// The options of a socket instance running HAProxy `version` (`None`: the line
    /// could not be told) with `haproxy.dynamicBackends` set to `dynamic_backends`, as
    /// [`SocketDriver::plan_options`](crate::driver::SocketDriver) decides them.
    pub fn for_line(
        dynamic_backends: bool,
        version: Option<crate::client::master::Version>,
    ) -> Self {
        Self {
            dynamic_backends: Capability::for_line(dynamic_backends, version),
        }
    }
}

/// A server of a backend created at runtime ([`RuntimeOp::AddBackend`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewServer {
    /// Server.
    pub server: String,
    /// `ip:port`.
    pub address: String,
    /// Explicit parameters (`default-server` ones first, then the server's).
    pub params: Vec<String>,
    /// Whether to `enable server` (not `disabled`).
    pub enable: bool,
    /// Whether to `enable health` (`check` present).
    pub health: bool,
}

/// Server parameters `add server` refuses in HAProxy 2.6.
const DYNAMIC_REJECTED: &[&str] = &["cookie", "init-addr", "resolvers", "redir"];
/// `default-server` parameters that only matter for name resolution at start-up and
/// that `add server` refuses; left out of the explicit parameters.
const RESOLUTION_ONLY: &[&str] = &[
    "init-addr",
    "resolvers",
    "resolve-prefer",
    "resolve-net",
    "resolve-opts",
];

/// One runtime API change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuntimeOp {
    /// `set server <be>/<srv> addr <ip> port <port>`, for a server that takes no
    /// traffic (in maintenance), where closing its idle connections is all it takes.
    SetAddr {
        /// Backend.
        backend: String,
        /// Server.
        server: String,
        /// New IP.
        addr: String,
        /// New port.
        port: Option<u16>,
    },
    /// `set server <be>/<srv> weight <n>`.
    SetWeight {
        /// Backend.
        backend: String,
        /// Server.
        server: String,
        /// New weight.
        weight: u32,
    },
    /// `set server <be>/<srv> state <ready|maint>`.
    SetState {
        /// Backend.
        backend: String,
        /// Server.
        server: String,
        /// `ready` or `maint`.
        state: &'static str,
    },
    /// Moves a server that takes traffic to a new address without failing requests
    /// in flight: a stand-in server at the new address, the server drained in
    /// maintenance, its address changed, the stand-in removed (see
    /// [`RuntimeClient::move_server`](crate::client::runtime::RuntimeClient::move_server)).
    MoveServer {
        /// Backend.
        backend: String,
        /// Server.
        server: String,
        /// New IP.
        addr: String,
        /// New port.
        port: Option<u16>,
        /// `add server` parameters of the stand-in: the server's explicit
        /// parameters without health checks, so it takes traffic at once.
        params: Vec<String>,
    },
    /// `add server`, then `enable server` / `enable health` as the params ask.
    AddServer {
        /// Backend.
        backend: String,
        /// Server.
        server: String,
        /// `ip:port`.
        address: String,
        /// Explicit parameters (`default-server` ones first, then the server's).
        params: Vec<String>,
        /// Whether to `enable server` (not `disabled`).
        enable: bool,
        /// Whether to `enable health` (`check` present).
        health: bool,
    },
    /// Maintenance, then `del server` once the server has no connections (bounded by
    /// a drain timeout; past it the server stays in maintenance until the next
    /// reload).
    DelServer {
        /// Backend.
        backend: String,
        /// Server.
        server: String,
    },
    /// `add backend <be> from <profile>`, its servers added (and enabled, health
    /// checks started, as their lines ask), then `publish backend`. Planned before
    /// every other change, so no map entry routes to it before it runs.
    AddBackend {
        /// Backend.
        backend: String,
        /// The named `defaults` section it is created from.
        profile: String,
        /// Its servers.
        servers: Vec<NewServer>,
    },
    /// `enable dynamic-cookie backend <be>`: recomputes the dynamic cookie of every
    /// server of a backend with `cookie ... dynamic`. HAProxy 2.6's `add server` and
    /// address changes leave a server without one (so a client sent to it would lose
    /// its persistence); planned after the server changes of such a backend.
    RefreshDynamicCookies {
        /// Backend.
        backend: String,
    },
    /// `unpublish backend`, every server drained in maintenance and deleted (bounded
    /// by the drain timeout), `del backend`. Planned after every other change, so the
    /// map entries that routed to it are gone first. Past the drain timeout the
    /// backend stays unpublished until the next reload.
    DelBackend {
        /// Backend.
        backend: String,
    },
    /// Replace the contents of a map or ACL file (which one HAProxy uses it as is
    /// resolved at apply time with `show map` / `show acl`).
    ReplacePatterns {
        /// Path relative to the config directory (`maps/hosts.map`).
        file: String,
        /// The new content.
        content: std::sync::Arc<str>,
        /// The running content, when the file is used only as a map whose lookups
        /// do not depend on the order of its entries (`map(`, `map_str(` and
        /// `map_beg(` converters), so the change may be applied entry by entry
        /// ([`crate::client::runtime::entry_commands`]).
        previous: Option<std::sync::Arc<str>>,
    },
    /// Replace a certificate (`set ssl cert` + `commit ssl cert`).
    ReplaceCertificate {
        /// Path relative to the config directory (`certs/site.pem`).
        file: String,
        /// The new PEM.
        pem: Pem,
    },
    /// A certificate a crt-list entry is about to use: `new ssl cert` + `set ssl
    /// cert` + `commit ssl cert` ([`crate::haproxy`]'s certificate planning).
    AddCertificate {
        /// Path as the crt-list names it (`certs/shop_web.pem`).
        file: String,
        /// The PEM.
        pem: Pem,
    },
    /// A certificate no crt-list entry uses any more: `del ssl cert`.
    DelCertificate {
        /// Path as the crt-list named it.
        file: String,
    },
    /// A crt-list line added or changed: the certificate's entries in the list
    /// replaced by `line` (`del ssl crt-list` + `add ssl crt-list`).
    SetCrtListEntry {
        /// The crt-list, as the bind line names it (`files/tls.crtlist`).
        list: String,
        /// The certificate the line names.
        cert: String,
        /// The line: certificate, `[options]`, SNI filters.
        line: String,
    },
    /// A crt-list line removed: `del ssl crt-list`.
    DelCrtListEntry {
        /// The crt-list.
        list: String,
        /// The certificate whose entry goes.
        cert: String,
    },
}

/// A PEM bundle (certificate and private key): its `Debug` shows its size only, so
/// plans and operations can be logged without the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Pem(std::sync::Arc<str>);

impl From<std::sync::Arc<str>> for Pem {
    fn from(text: std::sync::Arc<str>) -> Self {
        Self(text)
    }
}

impl std::ops::Deref for Pem {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<PEM, {} bytes, not shown>", self.0.len())
    }
}

impl RuntimeOp {
    /// The `object` label of `hapwright_runtime_commands_total`.
    pub fn object(&self) -> &'static str {
        match self {
            RuntimeOp::ReplacePatterns { file, .. } if file.starts_with("maps/") => "map",
            RuntimeOp::ReplacePatterns { .. } => "pattern_file",
            RuntimeOp::ReplaceCertificate { .. }
            | RuntimeOp::AddCertificate { .. }
            | RuntimeOp::DelCertificate { .. } => "certificate",
            RuntimeOp::SetCrtListEntry { .. } | RuntimeOp::DelCrtListEntry { .. } => "crt_list",
            RuntimeOp::AddBackend { .. } | RuntimeOp::DelBackend { .. } => "backend",
            _ => "server",
        }
    }

    /// A short description for logs and deploy reasons.
    pub fn describe(&self) -> String {
        match self {
            RuntimeOp::SetAddr {
                backend,
                server,
                addr,
                port,
            } => match port {
                Some(port) => format!("server {backend}/{server} address {addr}:{port}"),
                None => format!("server {backend}/{server} address {addr}"),
            },
            RuntimeOp::SetWeight {
                backend,
                server,
                weight,
            } => {
                format!("server {backend}/{server} weight {weight}")
            }
            RuntimeOp::SetState {
                backend,
                server,
                state,
            } => {
                format!("server {backend}/{server} state {state}")
            }
            RuntimeOp::MoveServer {
                backend,
                server,
                addr,
                port,
                ..
            } => match port {
                Some(port) => format!("server {backend}/{server} moved to {addr}:{port}"),
                None => format!("server {backend}/{server} moved to {addr}"),
            },
            RuntimeOp::AddServer {
                backend, server, ..
            } => format!("server {backend}/{server} added"),
            RuntimeOp::DelServer { backend, server } => {
                format!("server {backend}/{server} removed")
            }
            RuntimeOp::AddBackend {
                backend, profile, ..
            } => format!("backend {backend} added from {profile}"),
            RuntimeOp::DelBackend { backend } => format!("backend {backend} removed"),
            RuntimeOp::RefreshDynamicCookies { backend } => {
                format!("backend {backend} dynamic cookies recomputed")
            }
            RuntimeOp::ReplacePatterns { file, .. } => format!("{file} contents"),
            RuntimeOp::ReplaceCertificate { file, .. } => format!("{file} replaced"),
            RuntimeOp::AddCertificate { file, .. } => format!("{file} added"),
            RuntimeOp::DelCertificate { file } => format!("{file} removed"),
            RuntimeOp::SetCrtListEntry { list, cert, .. } => format!("{list} entry {cert} set"),
            RuntimeOp::DelCrtListEntry { list, cert } => format!("{list} entry {cert} removed"),
        }
    }
}

/// The plan for one instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangePlan {
    /// Runtime changes, in the order to apply them.
    pub ops: Vec<RuntimeOp>,
    /// Set when a reload is needed: the first cause found.
    pub reload: Option<DeployReason>,
    /// Every cause of a reload the planner found, the first one (`reload`) first:
    /// what `hapwright plan` lists. Empty when nothing forces a reload.
    pub causes: Vec<DeployReason>,
    /// Servers (`backend`, `server`) whose address, port, weight or state changes;
    /// their lines are left out of the server-state file before a reload, so stale
    /// runtime values do not override the new config.
    pub changed_servers: HashSet<(String, String)>,
}

impl ChangePlan {
    /// A plan that reloads for `reason`.
    pub fn reload(reason: ReloadReason, detail: impl Into<String>) -> Self {
        let reason = DeployReason {
            reload: Some(reason),
            detail: detail.into(),
        };
        Self {
            reload: Some(reason.clone()),
            causes: vec![reason],
            ..Self::default()
        }
    }

    /// `noop`, `runtime` or `reload`.
    pub fn strategy(&self) -> DeployStrategy {
        if self.reload.is_some() {
            DeployStrategy::Reload
        } else if self.ops.is_empty() {
            DeployStrategy::Noop
        } else {
            DeployStrategy::Runtime
        }
    }

    /// Why this strategy, for events, logs and `/debug/instances`.
    pub fn reason(&self) -> DeployReason {
        if let Some(reason) = &self.reload {
            return reason.clone();
        }
        let detail = if self.ops.is_empty() {
            "no change HAProxy would see".to_owned()
        } else {
            let changes: Vec<String> = self.ops.iter().take(5).map(RuntimeOp::describe).collect();
            let more = self.ops.len().saturating_sub(changes.len());
            if more > 0 && changes.len() == 5 {
                format!("runtime: {} and more", changes.join(", "))
            } else {
                format!("runtime: {}", changes.join(", "))
            }
        };
        DeployReason {
            reload: None,
            detail,
        }
    }

    pub(crate) fn force(&mut self, reason: ReloadReason, detail: String) {
        let reason = DeployReason {
            reload: Some(reason),
            detail,
        };
        if self.reload.is_none() {
            self.reload = Some(reason.clone());
        }
        if !self.causes.contains(&reason) {
            self.causes.push(reason);
        }
    }
}

/// Plans from raw renders, parsing both (a parse failure plans a reload).
pub fn compute(running: &RenderedConfig, desired: &RenderedConfig) -> ChangePlan {
    compute_with(running, desired, &PlanOptions::default())
}

/// [`compute`] for an instance that can do what `options` say.
pub fn compute_with(
    running: &RenderedConfig,
    desired: &RenderedConfig,
    options: &PlanOptions,
) -> ChangePlan {
    match (
        haproxy_config::parse(running.main()),
        haproxy_config::parse(desired.main()),
    ) {
        (Ok(old), Ok(new)) => plan_with(running, &old, desired, &new, options),
        (_, Err(error)) | (Err(error), _) => ChangePlan::reload(
            ReloadReason::Structure,
            format!(
                "haproxy.cfg does not parse (line {}): {}",
                error.line, error.message
            ),
        ),
    }
}

/// Plans from renders and their parsed models.
pub fn plan(
    running: &RenderedConfig,
    running_model: &Config,
    desired: &RenderedConfig,
    desired_model: &Config,
) -> ChangePlan {
    plan_with(
        running,
        running_model,
        desired,
        desired_model,
        &PlanOptions::default(),
    )
}

/// [`plan`] for an instance that can do what `options` say.
pub fn plan_with(
    running: &RenderedConfig,
    running_model: &Config,
    desired: &RenderedConfig,
    desired_model: &Config,
    options: &PlanOptions,
) -> ChangePlan {
    let mut plan = ChangePlan::default();
    if running.hash() == desired.hash() {
        return plan;
    }
    let (added, removed) = plan_sections(&mut plan, running_model, desired_model, options);
    let handled = super::certs::plan_certificates(
        &mut plan,
        (running, running_model),
        (desired, desired_model),
    );
    plan_files(&mut plan, running, desired, &handled);
    if !added.is_empty() || !removed.is_empty() {
        // New backends run before any map entry routes to them; removed ones go after
        // the map entries that routed to them.
        let rest = std::mem::take(&mut plan.ops);
        plan.ops = added.into_iter().chain(rest).chain(removed).collect();
    }
    plan
}

fn key(section: &Section) -> (&str, Option<&str>) {
    (section.kind.keyword(), section.name.as_deref())
}

fn section_label(section: &Section) -> String {
    match &section.name {
        Some(name) => format!("{} {name}", section.kind.keyword()),
        None => section.kind.keyword().to_owned(),
    }
}

/// Plans the sections; returns the runtime operations of added backends (to run first)
/// and of removed ones (to run last) when the instance can deploy them at runtime.
fn plan_sections(
    plan: &mut ChangePlan,
    old: &Config,
    new: &Config,
    options: &PlanOptions,
) -> (Vec<RuntimeOp>, Vec<RuntimeOp>) {
    let same_keys = old.sections.len() == new.sections.len()
        && old
            .sections
            .iter()
            .zip(&new.sections)
            .all(|(a, b)| Arc::ptr_eq(a, b) || key(a) == key(b));
    let mut changes = backends::BackendChanges::default();
    let mut backend_ops = (Vec::new(), Vec::new());
    if !same_keys {
        match backends::split(old, new, &options.dynamic_backends) {
            Ok(split) => changes = split,
            Err((reason, detail)) => {
                plan.force(reason, detail);
                more_causes(plan, old, new);
                return backend_ops;
            }
        }
        backend_ops = backends::operations(new, &changes);
    }
    let kept_old = old.sections.iter().filter(|s| !changes.is_removed(s));
    let kept_new = new.sections.iter().filter(|s| !changes.is_added(s));
    for (old_section, new_section) in kept_old.zip(kept_new) {
        // A section both models share is the same section: nothing to plan.
        if !Arc::ptr_eq(old_section, new_section) {
            plan_section(plan, old, old_section, new, new_section);
        }
    }
    backend_ops
}

/// Once sections added, removed or reordered force a reload, the sections both
/// configs have (by kind and name) still tell what else changed: their causes are
/// added to the plan's, nothing else (the reload rebuilds every server anyway).
fn more_causes(plan: &mut ChangePlan, old: &Config, new: &Config) {
    let by_key: HashMap<_, &Section> = old.sections.iter().map(|s| (key(s), &**s)).collect();
    let mut scratch = ChangePlan::default();
    for new_section in &new.sections {
        if let Some(old_section) = by_key.get(&key(new_section)) {
            plan_section(&mut scratch, old, old_section, new, new_section);
        }
    }
    for cause in scratch.causes {
        if !plan.causes.contains(&cause) {
            plan.causes.push(cause);
        }
    }
}

/// Plans one section the old and the new config both have.
fn plan_section(
    plan: &mut ChangePlan,
    old: &Config,
    old_section: &Section,
    new: &Config,
    new_section: &Section,
) {
    if old_section.args != new_section.args {
        plan.force(
            ReloadReason::Structure,
            format!("{}: header changed", section_label(new_section)),
        );
        return;
    }
    if new_section.kind.has_servers() {
        if let Some(detail) = directive_change(
            old_section.directives_except_servers(),
            new_section.directives_except_servers(),
        ) {
            plan.force(
                ReloadReason::Structure,
                format!("{}: {detail}", section_label(new_section)),
            );
        }
        plan_servers(plan, old, old_section, new, new_section);
    } else if let Some(detail) =
        directive_change(old_section.directives.iter(), new_section.directives.iter())
    {
        plan.force(
            ReloadReason::Structure,
            format!("{}: {detail}", section_label(new_section)),
        );
    }
}

/// Describes the first difference between two directive lists, if any.
fn directive_change<'a>(
    old: impl Iterator<Item = &'a Directive>,
    new: impl Iterator<Item = &'a Directive>,
) -> Option<String> {
    let old: Vec<&Directive> = old.collect();
    let new: Vec<&Directive> = new.collect();
    if old.len() == new.len() && old.iter().zip(&new).all(|(a, b)| a.same_words(b)) {
        return None;
    }
    let words = |d: &Directive| (d.keyword.clone(), d.args.clone());
    let old_set: HashSet<_> = old.iter().map(|d| words(d)).collect();
    let new_set: HashSet<_> = new.iter().map(|d| words(d)).collect();
    let added = new.iter().find(|d| !old_set.contains(&words(d)));
    let removed = old.iter().find(|d| !new_set.contains(&words(d)));
    Some(match (added, removed) {
        (Some(added), Some(removed)) if added.keyword == removed.keyword => {
            format!("`{}` changed to `{}`", removed.text, added.text)
        }
        (Some(added), _) if !old.iter().any(|d| d.keyword == added.keyword) => {
            format!("new keyword `{}`", added.text)
        }
        (Some(added), _) => format!("new line `{}`", added.text),
        (None, Some(removed)) => format!("removed `{}`", removed.text),
        (None, None) => "lines reordered".to_owned(),
    })
}

/// The words of a server's params that the runtime API changes (weight, state)
/// separated from the rest.
struct ServerParams {
    weight: Option<u32>,
    disabled: bool,
    other: Vec<String>,
}

fn split_params(params: &[String]) -> ServerParams {
    let mut out = ServerParams {
        weight: None,
        disabled: false,
        other: Vec::new(),
    };
    let mut words = params.iter();
    while let Some(word) = words.next() {
        match word.as_str() {
            "weight" => match words.next() {
                Some(value) => match value.parse() {
                    Ok(weight) => out.weight = Some(weight),
                    Err(_) => out.other.extend([word.clone(), value.clone()]),
                },
                None => out.other.push(word.clone()),
            },
            "disabled" => out.disabled = true,
            "enabled" => out.disabled = false,
            _ => out.other.push(word.clone()),
        }
    }
    out
}

/// `default-server` words that apply to `section`: its defaults section's, then its own.
fn default_server_params(config: &Config, section: &Section) -> Vec<String> {
    let mut params = Vec::new();
    let own = section.directives_named("default-server");
    let inherited = config
        .defaults_for(section)
        .into_iter()
        .flat_map(|d| d.directives_named("default-server"));
    for directive in inherited.chain(own) {
        params.extend(directive.args.iter().cloned());
    }
    params
}

fn is_ip(address: &str) -> bool {
    address.parse::<IpAddr>().is_ok()
}

/// The address `add server` is given for `server`: `IP:port` (an IPv6 address in
/// brackets), or an abstract Unix socket `abns@NAME` (a name of letters, digits,
/// `-`, `_` and `.`), which `add server` accepts as well on every supported line;
/// `None` for anything else (a host name, a path, a missing port).
fn runtime_address(server: &Server) -> Option<String> {
    if let Some(name) = server.address.strip_prefix("abns@") {
        let plain = !name.is_empty()
            && server.port.is_none()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        return plain.then(|| server.address.clone());
    }
    let port = server.port.filter(|_| is_ip(&server.address))?;
    Some(if server.address.contains(':') {
        format!("[{}]:{port}", server.address)
    } else {
        format!("{}:{port}", server.address)
    })
}

fn plan_servers(
    plan: &mut ChangePlan,
    old_config: &Config,
    old: &Section,
    new_config: &Config,
    new: &Section,
) {
    // The same server lines word for word give the same servers: nothing to plan,
    // and nothing to build (at 10,000 backends building them for every backend
    // costs milliseconds on every deployment).
    if old
        .server_directives()
        .map(|d| &d.args)
        .eq(new.server_directives().map(|d| &d.args))
    {
        return;
    }
    let backend = new.name.clone().unwrap_or_default();
    let label = section_label(new);
    let old_servers = old.servers();
    let new_servers = new.servers();
    if old_servers.len() == new_servers.len()
        && old_servers.iter().zip(&new_servers).all(|(a, b)| {
            a.name == b.name && a.address == b.address && a.port == b.port && a.params == b.params
        })
    {
        return;
    }
    let old_defaults = split_params(&default_server_params(old_config, old));
    let new_defaults_words = default_server_params(new_config, new);
    let new_defaults = split_params(&new_defaults_words);
    let by_name: HashMap<&str, &Server> =
        old_servers.iter().map(|s| (s.name.as_str(), s)).collect();
    let new_names: HashSet<&str> = new_servers.iter().map(|s| s.name.as_str()).collect();
    if new_names.len() != new_servers.len() {
        plan.force(
            ReloadReason::Structure,
            format!("{label}: duplicate server names"),
        );
        return;
    }
    let dynamic = new_config.effective_balance(new).is_dynamic();
    let ops_before = plan.ops.len();
    for server in &new_servers {
        let name = server.name.clone();
        let Some(previous) = by_name.get(server.name.as_str()) else {
            plan_added_server(plan, &backend, &label, server, &new_defaults_words, dynamic);
            continue;
        };
        if previous.address == server.address
            && previous.port == server.port
            && previous.params == server.params
        {
            continue;
        }
        let before = split_params(&previous.params);
        let after = split_params(&server.params);
        if before.other != after.other {
            plan.force(
                ReloadReason::ServerOptions,
                format!(
                    "{label}: server {name} options changed from `{}` to `{}`",
                    before.other.join(" "),
                    after.other.join(" ")
                ),
            );
            continue;
        }
        plan.changed_servers.insert((backend.clone(), name.clone()));
        let disabled_before = before.disabled || old_defaults.disabled;
        let disabled_after = after.disabled || new_defaults.disabled;
        if previous.address != server.address || previous.port != server.port {
            if !is_ip(&server.address) || !is_ip(&previous.address) {
                plan.force(
                    ReloadReason::ServerOptions,
                    format!(
                        "{label}: server {name} address `{}` is not an IP address",
                        server.address
                    ),
                );
                continue;
            }
            if server.port.is_none() && previous.port.is_some() {
                plan.force(
                    ReloadReason::ServerOptions,
                    format!("{label}: server {name} port removed"),
                );
                continue;
            }
            if disabled_before {
                // No traffic: the address change closes its idle connections.
                plan.ops.push(RuntimeOp::SetAddr {
                    backend: backend.clone(),
                    server: name.clone(),
                    addr: server.address.clone(),
                    port: server.port,
                });
            } else if !dynamic {
                plan.force(
                    ReloadReason::ServerOptions,
                    format!(
                        "{label}: server {name} address changed; balance `{}` cannot add the \
                         stand-in server a lossless runtime move needs",
                        new_config.effective_balance(new).algorithm
                    ),
                );
                continue;
            } else {
                let mut params = dynamic_params(&new_defaults_words, &server.params);
                params.retain(|w| w != "check");
                plan.ops.push(RuntimeOp::MoveServer {
                    backend: backend.clone(),
                    server: name.clone(),
                    addr: server.address.clone(),
                    port: server.port,
                    params,
                });
            }
        }
        let weight_before = before.weight.or(old_defaults.weight).unwrap_or(1);
        let weight_after = after.weight.or(new_defaults.weight).unwrap_or(1);
        if weight_before != weight_after {
            if !dynamic {
                // HAProxy refuses `set server ... weight N` there ("only accepts
                // weights '0%' and '100%'"); the reload sets it.
                plan.force(
                    ReloadReason::ServerOptions,
                    format!(
                        "{label}: server {name} weight {weight_after}; balance `{}` cannot change weights at runtime",
                        new_config.effective_balance(new).algorithm
                    ),
                );
                continue;
            }
            if weight_after > 256 {
                plan.force(
                    ReloadReason::ServerOptions,
                    format!("{label}: server {name} weight {weight_after} is above 256"),
                );
                continue;
            }
            plan.ops.push(RuntimeOp::SetWeight {
                backend: backend.clone(),
                server: name.clone(),
                weight: weight_after,
            });
        }
        if disabled_before != disabled_after {
            plan.ops.push(RuntimeOp::SetState {
                backend: backend.clone(),
                server: name.clone(),
                state: if disabled_after { "maint" } else { "ready" },
            });
        }
    }
    for server in &old_servers {
        if new_names.contains(server.name.as_str()) {
            continue;
        }
        if !dynamic {
            plan.force(
                ReloadReason::Structure,
                format!(
                    "{label}: server {} removed; balance `{}` cannot remove servers at runtime",
                    server.name,
                    new_config.effective_balance(new).algorithm
                ),
            );
            continue;
        }
        plan.changed_servers
            .insert((backend.clone(), server.name.clone()));
        plan.ops.push(RuntimeOp::DelServer {
            backend: backend.clone(),
            server: server.name.clone(),
        });
    }
    let placed = plan.ops[ops_before..].iter().any(|op| {
        matches!(
            op,
            RuntimeOp::AddServer { .. } | RuntimeOp::MoveServer { .. } | RuntimeOp::SetAddr { .. }
        )
    });
    if placed && dynamic_cookie(new_config, new) {
        plan.ops.push(RuntimeOp::RefreshDynamicCookies { backend });
    }
}

/// Whether `section` (or the defaults section it uses) sets `cookie ... dynamic`.
fn dynamic_cookie(config: &Config, section: &Section) -> bool {
    // The section's own `cookie` line replaces the inherited one.
    section
        .last("cookie")
        .or_else(|| config.defaults_for(section).and_then(|d| d.last("cookie")))
        .is_some_and(|d| d.args.iter().any(|w| w == "dynamic"))
}

/// The explicit `add server` parameters of a server: the applicable `default-server`
/// words `add server` accepts (it does not inherit them), then the server's own,
/// without `disabled`/`enabled` (those become `enable server`) and without the words
/// `add server` refuses.
fn dynamic_params(defaults: &[String], own: &[String]) -> Vec<String> {
    let mut params = Vec::new();
    let mut words = defaults.iter().chain(own);
    while let Some(word) = words.next() {
        if RESOLUTION_ONLY.contains(&word.as_str()) || DYNAMIC_REJECTED.contains(&word.as_str()) {
            // `cookie` in default-server has no meaning without a per-server value.
            words.next();
        } else if word != "disabled" && word != "enabled" {
            params.push(word.clone());
        }
    }
    params
}

/// How `add server` creates `server` of `section` (a backend created at runtime):
/// explicit parameters, enable and health check; `Err` says why it cannot.
pub(crate) fn new_server(
    config: &Config,
    section: &Section,
    server: &Server,
) -> Result<NewServer, NotRuntime> {
    let name = &server.name;
    let Some(address) = runtime_address(server) else {
        return Err(NotRuntime::NotIpPort {
            server: name.clone(),
            address: server.address.clone(),
        });
    };
    if let Some(rejected) = server
        .params
        .iter()
        .find(|w| DYNAMIC_REJECTED.contains(&w.as_str()))
    {
        return Err(NotRuntime::Refused {
            server: name.clone(),
            param: rejected.clone(),
        });
    }
    let defaults = default_server_params(config, section);
    let split = split_params(
        defaults
            .iter()
            .chain(&server.params)
            .cloned()
            .collect::<Vec<_>>()
            .as_slice(),
    );
    Ok(NewServer {
        server: name.clone(),
        address,
        params: dynamic_params(&defaults, &server.params),
        enable: !split.disabled,
        health: split.other.iter().any(|w| w == "check"),
    })
}

fn plan_added_server(
    plan: &mut ChangePlan,
    backend: &str,
    label: &str,
    server: &Server,
    defaults: &[String],
    dynamic: bool,
) {
    let name = &server.name;
    if !dynamic {
        plan.force(
            ReloadReason::Structure,
            format!(
                "{label}: server {name} added; the balance algorithm cannot add servers at runtime"
            ),
        );
        return;
    }
    let Some(address) = runtime_address(server) else {
        plan.force(
            ReloadReason::ServerOptions,
            format!(
                "{label}: server {name} added with address `{}`, which is not IP:port",
                server.address
            ),
        );
        return;
    };
    if let Some(rejected) = server
        .params
        .iter()
        .find(|w| DYNAMIC_REJECTED.contains(&w.as_str()))
    {
        plan.force(
            ReloadReason::ServerOptions,
            format!("{label}: server {name} added with `{rejected}`, which `add server` refuses"),
        );
        return;
    }
    let split = split_params(
        defaults
            .iter()
            .chain(&server.params)
            .cloned()
            .collect::<Vec<_>>()
            .as_slice(),
    );
    let params = dynamic_params(defaults, &server.params);
    let health = split.other.iter().any(|w| w == "check");
    plan.changed_servers
        .insert((backend.to_owned(), name.clone()));
    plan.ops.push(RuntimeOp::AddServer {
        backend: backend.to_owned(),
        server: name.clone(),
        address,
        params,
        enable: !split.disabled,
        health,
    });
}

/// The file changes other than those `handled` by the certificate planning.
fn plan_files(
    plan: &mut ChangePlan,
    running: &RenderedConfig,
    desired: &RenderedConfig,
    handled: &std::collections::BTreeSet<String>,
) {
    let groups = [
        ("maps", running.maps(), desired.maps()),
        ("files", running.files(), desired.files()),
        ("certs", running.certificates(), desired.certificates()),
    ];
    for (dir, old, new) in groups {
        // One walk over both groups (most of thousands of files are unchanged, and
        // a group that did not change at all is shared by the two renders).
        let mut removed = None;
        for (name, previous, content) in crate::haproxy::certs::file_changes(old, new) {
            let file = format!("{dir}/{name}");
            if handled.contains(&file) {
                continue;
            }
            let (previous, content) = match (previous, content) {
                (_, None) => {
                    removed.get_or_insert(file);
                    continue;
                }
                (None, Some(_)) => {
                    plan.force(ReloadReason::NewFile, format!("{file} added"));
                    continue;
                }
                (Some(previous), Some(content)) => (previous, content),
            };
            if dir == "certs" {
                if content.len() > MAX_PAYLOAD_BYTES {
                    plan.force(
                        ReloadReason::NewFile,
                        format!("{file} changed and is too large for the runtime API"),
                    );
                } else {
                    plan.ops.push(RuntimeOp::ReplaceCertificate {
                        file,
                        pem: Pem::from(content.clone()),
                    });
                }
            } else if dir == "files" && !loaded_as_patterns(desired.main(), &file) {
                plan.force(
                    ReloadReason::NewFile,
                    format!(
                        "{file} changed; HAProxy reads it only when it loads the config \
                         (it is not used as a map or ACL file)"
                    ),
                );
            } else {
                plan.ops.push(RuntimeOp::ReplacePatterns {
                    previous: order_free_map(desired.main(), &file).then(|| previous.clone()),
                    file,
                    content: content.clone(),
                });
            }
        }
        if let Some(file) = removed {
            plan.force(ReloadReason::NewFile, format!("{file} removed"));
        }
    }
}

/// Whether `main` loads `file` as a pattern file the runtime API can replace: as the
/// argument of a `map*(...)` converter or an `*-map`/`*-acl` action, or after `-f` in
/// an ACL. Other uses (`crt-list`, `errorfile`, `lua-load`, ...) are read only when
/// HAProxy loads its configuration, so a change to such a file needs a reload.
fn loaded_as_patterns(main: &str, file: &str) -> bool {
    main.lines().any(|line| {
        let line = line.trim_start();
        if line.starts_with('#') {
            return false;
        }
        line.match_indices(file).any(|(at, _)| {
            let after = line[at + file.len()..].chars().next();
            if after.is_some_and(|c| !matches!(c, ')' | ',' | ' ' | '\t' | '"' | '\'')) {
                // A longer path that merely starts with this one.
                return false;
            }
            let before = line[..at].trim_end_matches(['"', '\'']);
            if let Some(call) = before.strip_suffix('(') {
                let name_start = call
                    .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                    .map_or(0, |i| i + 1);
                let name = &call[name_start..];
                name.starts_with("map") || name.ends_with("-map") || name.ends_with("-acl")
            } else {
                before.trim_end().ends_with(" -f") || before.trim_end() == "-f"
            }
        })
    })
}

/// Whether `main` uses `file` only as the file of map converters whose lookups do
/// not depend on the order of the entries when keys are unique, at least once, on
/// lines outside comments: exact matches (`map(`, `map_str(`, an index by key) and
/// prefix matches (`map_beg(`: HAProxy indexes them in a prefix tree and returns the
/// longest matching key). Not `set-map(`, `map_reg(`, `map_sub(`, `map_dom(` or
/// anything else, whose lookups go through the entries in order.
fn order_free_map(main: &str, file: &str) -> bool {
    let mut used = false;
    // Each mention within its line (one search through the text, not one per line).
    for (at, _) in main.match_indices(file) {
        let start = main[..at].rfind('\n').map_or(0, |i| i + 1);
        let end = main[at..].find('\n').map_or(main.len(), |i| at + i);
        let (line, at) = (&main[start..end], at - start);
        if line.trim_start().starts_with('#') {
            continue;
        }
        let after = line[at + file.len()..].chars().next();
        if after.is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')) {
            // A longer name that merely starts with this one.
            continue;
        }
        let before = line[..at].trim_end_matches(['"', '\'']);
        let Some(call) = before.strip_suffix('(') else {
            return false;
        };
        let name_start = call
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
            .map_or(0, |i| i + 1);
        if !matches!(&call[name_start..], "map" | "map_str" | "map_beg") {
            return false;
        }
        used = true;
    }
    used
}

#[cfg(test)]
mod pattern_file_tests {
    use super::{loaded_as_patterns, order_free_map};

    #[test]
    fn order_free_maps_are_used_by_map_map_str_and_map_beg_only() {
        let main = "frontend f\n    use_backend %[req.hdr(host),lower,map(maps/hosts.map,be_default)]\n    \
                    http-request set-var(txn.x) req.hdr(x),map_str(\"maps/str.map\")\n    \
                    http-request set-var(txn.y) path,map_beg(maps/beg.map)\n    \
                    http-request set-var(txn.r) path,map_reg(maps/reg.map)\n    \
                    http-request set-map(maps/set.map) %[src] 1\n    \
                    http-request set-var(txn.z) src,map(maps/set.map)\n    \
                    # map(maps/commented.map)\n";
        for (file, exact) in [
            ("maps/hosts.map", true),
            ("maps/str.map", true),
            ("maps/beg.map", true),
            ("maps/reg.map", false),
            ("maps/set.map", false),
            ("maps/commented.map", false),
            ("maps/hosts", false),
        ] {
            assert_eq!(order_free_map(main, file), exact, "{file}");
        }
    }

    #[test]
    fn maps_and_acl_files_are_patterns_other_uses_are_not() {
        let main = "frontend f\n    acl blocked src -f files/blocked.acl\n    \
                    use_backend %[req.hdr(host),lower,map_dom(files/hosts.txt,be_default)]\n    \
                    http-request set-map(files/seen.map) %[src] 1\n    \
                    bind :443 ssl crt-list files/tls.crtlist\n    \
                    errorfile 503 files/503.http\n    \
                    # map(files/commented.map)\n";
        assert!(loaded_as_patterns(main, "files/blocked.acl"));
        assert!(loaded_as_patterns(main, "files/hosts.txt"));
        assert!(loaded_as_patterns(main, "files/seen.map"));
        assert!(!loaded_as_patterns(main, "files/tls.crtlist"));
        assert!(!loaded_as_patterns(main, "files/503.http"));
        assert!(!loaded_as_patterns(main, "files/commented.map"));
        assert!(!loaded_as_patterns(main, "files/blocked"));
    }
}
