//! Dynamic backends (HAProxy 3.4 and later, `haproxy.dynamicBackends: true`): a render
//! whose only structural change is added or removed backends of the form
//!
//! ```text
//! backend be_shop from routes
//!     server s1 10.0.0.7:8080 check
//! ```
//!
//! (the profile a named `defaults` section the render leaves unchanged, the body
//! only `server` lines) is deployed without a reload. An added backend becomes
//! [`RuntimeOp::AddBackend`] — `add backend NAME from PROFILE`, its servers added and
//! enabled, `publish backend` — placed before every other change of the plan, so the
//! backend runs before a map entry routes to it. A removed backend becomes
//! [`RuntimeOp::DelBackend`] — `unpublish backend`, its servers drained (bounded by
//! the drain timeout), `del backend` — placed after every other change, so the map
//! entries that routed to it are gone first.
//!
//! Anything else — a backend with other directives, a profile that is not a named
//! `defaults` section or sets no `mode` (which `add backend` refuses), a server that
//! `add server` cannot create, another section added or removed, sections reordered —
//! reloads, and the plan says why. So does a line without `add backend`
//! ([`Capability::Unsupported`]).

use std::collections::HashSet;

use hapwright_eventbus::model::ReloadReason;

use crate::client::master::Version;
use crate::haproxy::config::{Config, Section, SectionKind};
use crate::haproxy::plan::{self, NewServer, RuntimeOp};

/// The first HAProxy line with `add backend`.
pub const FIRST_LINE: Version = Version { major: 3, minor: 4 };

/// Whether an instance deploys added and removed backends at runtime.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Capability {
    /// `haproxy.dynamicBackends` is off (or the driver has no such commands).
    #[default]
    Off,
    /// It is on, but the instance cannot do it; the text says why (it ends up in
    /// the reload's reason).
    Unsupported(String),
    /// It is on and the instance runs a line with `add backend`.
    On,
}

impl Capability {
    /// The capability of an instance running `version` (`None`: the line could not
    /// be told) when `haproxy.dynamicBackends` is `enabled`.
    pub fn for_line(enabled: bool, version: Option<Version>) -> Self {
        match (enabled, version) {
            (false, _) => Capability::Off,
            (true, Some(version)) if version >= FIRST_LINE => Capability::On,
            (true, Some(version)) => Capability::Unsupported(format!(
                "HAProxy {version} has no `add backend` (dynamicBackends needs {FIRST_LINE} or later)"
            )),
            (true, None) => Capability::Unsupported(
                "the HAProxy line could not be told, so `add backend` is not used".to_owned(),
            ),
        }
    }
}

/// Backends a render adds and removes, when they can all be deployed at runtime.
#[derive(Debug, Default)]
pub struct BackendChanges<'a> {
    /// Added backends, in the order of the new config.
    pub added: Vec<&'a Section>,
    /// Removed backends, in the order of the old config.
    pub removed: Vec<&'a Section>,
    /// The addresses of `added` and `removed` (sections of the config being walked),
    /// so telling a section apart costs one lookup at 10,000 sections.
    added_at: HashSet<*const Section>,
    removed_at: HashSet<*const Section>,
}

impl<'a> BackendChanges<'a> {
    fn new(added: Vec<&'a Section>, removed: Vec<&'a Section>) -> Self {
        Self {
            added_at: added.iter().map(|s| std::ptr::from_ref(*s)).collect(),
            removed_at: removed.iter().map(|s| std::ptr::from_ref(*s)).collect(),
            added,
            removed,
        }
    }

    /// Whether `section` of the old config is one of the removed backends.
    pub fn is_removed(&self, section: &Section) -> bool {
        !self.removed_at.is_empty() && self.removed_at.contains(&std::ptr::from_ref(section))
    }

    /// Whether `section` of the new config is one of the added backends.
    pub fn is_added(&self, section: &Section) -> bool {
        !self.added_at.is_empty() && self.added_at.contains(&std::ptr::from_ref(section))
    }
}

fn key(section: &Section) -> (&str, Option<&str>) {
    (section.kind.keyword(), section.name.as_deref())
}

fn label(section: &Section) -> String {
    match &section.name {
        Some(name) => format!("{} {name}", section.kind.keyword()),
        None => section.kind.keyword().to_owned(),
    }
}

/// Splits the section lists of `old` and `new`, whose keys differ, into the added and
/// removed backends and the sections both keep. `Err` is the reload's reason: the
/// first added or removed section that cannot be deployed at runtime and why, or
/// `capability`'s reason when the instance cannot do it at all.
pub fn split<'a>(
    old: &'a Config,
    new: &'a Config,
    capability: &Capability,
) -> Result<BackendChanges<'a>, (ReloadReason, String)> {
    let old_keys: HashSet<_> = old.sections.iter().map(key).collect();
    let new_keys: HashSet<_> = new.sections.iter().map(key).collect();
    let changes = BackendChanges::new(
        new.sections
            .iter()
            .filter(|s| !old_keys.contains(&key(s)))
            .collect(),
        old.sections
            .iter()
            .filter(|s| !new_keys.contains(&key(s)))
            .collect(),
    );
    let structure = |detail: String| (ReloadReason::Structure, detail);
    let first = changes
        .added
        .iter()
        .map(|s| (*s, "added", new))
        .chain(changes.removed.iter().map(|s| (*s, "removed", old)));
    for (section, what, config) in first.clone() {
        if section.kind != SectionKind::Backend {
            return Err(structure(format!("{} {what}", label(section))));
        }
        if let Capability::Off = capability {
            return Err(structure(format!("{} {what}", label(section))));
        }
        if let Err(why) = eligible(config, section) {
            return Err(structure(format!(
                "{} {what}; it cannot be {what} at runtime: {why}",
                label(section)
            )));
        }
    }
    if let Capability::Unsupported(why) = capability
        && let Some((section, what, _)) = first.clone().next()
    {
        return Err(structure(format!("{} {what}; {why}", label(section))));
    }
    let kept_old = old
        .sections
        .iter()
        .filter(|s| !changes.is_removed(s))
        .map(key);
    let kept_new = new
        .sections
        .iter()
        .filter(|s| !changes.is_added(s))
        .map(key);
    if !kept_old.eq(kept_new) {
        return Err(structure("sections reordered".to_owned()));
    }
    Ok(changes)
}

/// Why `section` of `config` cannot be created (or deleted) with `add backend`, if
/// it cannot.
fn eligible(config: &Config, section: &Section) -> Result<(), String> {
    let Some(profile) = section.from_defaults() else {
        return Err("it is not of the form `backend NAME from PROFILE`".to_owned());
    };
    if section.args.len() != 2 {
        return Err("it is not of the form `backend NAME from PROFILE`".to_owned());
    }
    let Some(defaults) = config.section(SectionKind::Defaults, profile) else {
        return Err(format!("no `defaults {profile}` section"));
    };
    if defaults.last("mode").is_none() {
        return Err(format!(
            "`defaults {profile}` sets no `mode`, which `add backend` needs"
        ));
    }
    if let Some(other) = section.directives.iter().find(|d| d.keyword != "server") {
        return Err(format!(
            "line {} `{}`: only `server` lines can be created at runtime",
            other.line, other.text
        ));
    }
    if !config.effective_balance(section).is_dynamic() {
        return Err(format!(
            "balance `{}` cannot add servers at runtime",
            config.effective_balance(section).algorithm
        ));
    }
    let mut names = HashSet::new();
    for server in section.servers() {
        if !names.insert(server.name.clone()) {
            return Err(format!("duplicate server name {}", server.name));
        }
        plan::new_server(config, section, &server)?;
    }
    Ok(())
}

/// The runtime operations of `changes`: the added backends (to run before every other
/// change) and the removed ones (to run after every other change).
pub fn operations(new: &Config, changes: &BackendChanges<'_>) -> (Vec<RuntimeOp>, Vec<RuntimeOp>) {
    let added = changes
        .added
        .iter()
        .map(|section| {
            let servers: Vec<NewServer> = section
                .servers()
                .iter()
                .filter_map(|server| plan::new_server(new, section, server).ok())
                .collect();
            RuntimeOp::AddBackend {
                backend: section.name.clone().unwrap_or_default(),
                profile: section.from_defaults().unwrap_or_default().to_owned(),
                servers,
            }
        })
        .collect();
    let removed = changes
        .removed
        .iter()
        .map(|section| RuntimeOp::DelBackend {
            backend: section.name.clone().unwrap_or_default(),
        })
        .collect();
    (added, removed)
}
