//! Holding back only what a held removal removes.
//!
//! While a removal is held, the scheduler deploys the desired render with every item
//! it would remove (measured against the high-water mark) put back from the configs
//! the mark is made of, so the rest of the change (another tenant's new host, a pod
//! replaced behind an existing route) keeps going live:
//!
//! - a **backend** (or `listen`) the render no longer has is appended whole, as it
//!   was written in the config where it had the most servers (the newest of those);
//! - a backend the render keeps with fewer servers gets back the missing `server`
//!   lines (by server name, from the same config), as many as the net drop, after its
//!   last `server` line; servers the render has are never touched, so a replaced pod
//!   goes live;
//! - a **map** entry whose key (first word) the render's map no longer has is
//!   appended to that map (a key the render keeps, pointing elsewhere, stays as
//!   rendered);
//! - a **file** or **certificate** the render no longer has is kept, since the kept
//!   sections may refer to it.
//!
//! The kept config goes through the phase-1 checks; when it fails them ([`Kept::problems`])
//! the scheduler lets nothing of the render out, as a hold did before.
//!
//! Frontends, `use_backend` rules and every other line come from the render as it is:
//! a route written as a rule in `haproxy.cfg` (not in a map) that the render drops is
//! not put back, only its backend is.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hapwright_eventbus::model::{Diagnostic, HashedMain, RenderedConfig, Severity, SourceMap};

use super::Released;
use crate::haproxy::config::{self as haproxy_config, Config as Model, Section};

/// The comment heading the sections the valve keeps at the end of `haproxy.cfg`.
pub const KEPT_HEADER: &str =
    "# Kept by hapwright's safety valve while a removal is held (GET /debug/safety)";

/// The desired render with what a held removal removes put back.
#[derive(Clone, Debug)]
pub struct Kept {
    /// The config to deploy.
    pub config: Arc<RenderedConfig>,
    /// Its parsed `haproxy.cfg`.
    pub model: Arc<Model>,
    /// Backends (and listens) put back.
    pub backends: usize,
    /// `server` lines put back into backends the render keeps.
    pub servers: usize,
    /// Map entries put back.
    pub map_entries: usize,
    /// Files and certificates kept.
    pub files: usize,
    /// Errors of the phase-1 checks on the kept config (a kept section clashing
    /// with one the render added, say): when there are any, it must not go out.
    pub problems: Vec<Diagnostic>,
}

impl Kept {
    /// Whether anything was put back.
    pub fn is_empty(&self) -> bool {
        self.backends + self.servers + self.map_entries + self.files == 0
    }
}

/// `desired` with every backend, server, map entry and file of `sources` (newest
/// first) that it lacks put back: a missing backend or `listen` whole, from the
/// source where it had the most servers; missing `server` lines of a kept backend by
/// name, as many as the net drop; map entries by key (first word); files and
/// certificates by name. Everything else is as rendered.
pub fn keep_held(desired: &Released, sources: &[Released]) -> Kept {
    let sources: Vec<&Released> = sources.iter().collect();
    merge(desired, &sources)
}

/// The high-water mark as one config: `newest` with what `older` had put back.
pub(super) fn fold(newest: &Released, older: &[&Released]) -> RenderedConfig {
    if older.is_empty() {
        return newest.config.as_ref().clone();
    }
    Arc::unwrap_or_clone(merge(newest, older).config)
}

/// The best place to take a backend from: the source where it has the most servers.
struct Best<'a> {
    source: &'a Released,
    section: &'a Section,
    servers: usize,
}

fn merge(desired: &Released, sources: &[&Released]) -> Kept {
    let mut best: BTreeMap<&str, Best<'_>> = BTreeMap::new();
    for source in sources {
        for section in source.model.server_proxies() {
            let Some(name) = section.name.as_deref() else {
                continue;
            };
            let servers = section.server_count();
            match best.get(name) {
                Some(found) if found.servers >= servers => {}
                _ => {
                    best.insert(
                        name,
                        Best {
                            source,
                            section,
                            servers,
                        },
                    );
                }
            }
        }
    }

    let desired_text = desired.config.main();
    let desired_lines: Vec<&str> = desired_text.lines().collect();
    // Server lines to insert after a (0-based) line of the render.
    let mut inserts: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut appended = String::new();
    let (mut backends, mut servers) = (0, 0);
    for (name, found) in &best {
        let kept = desired
            .model
            .server_proxies()
            .find(|s| s.name.as_deref() == Some(*name));
        match kept {
            None => {
                let text = found.source.config.main();
                let lines: Vec<&str> = text.lines().collect();
                let range = section_range(&found.source.model, found.section, lines.len());
                if appended.is_empty() {
                    appended.push('\n');
                    appended.push_str(KEPT_HEADER);
                    appended.push('\n');
                }
                for line in &lines[range] {
                    appended.push_str(line);
                    appended.push('\n');
                }
                backends += 1;
            }
            Some(section) => {
                let have = section.server_count();
                if have >= found.servers {
                    continue;
                }
                let names: BTreeSet<&str> = section
                    .server_directives()
                    .map(|d| d.args[0].as_str())
                    .collect();
                let missing: Vec<String> = found
                    .section
                    .server_directives()
                    .filter(|d| !names.contains(d.args[0].as_str()))
                    .take(found.servers - have)
                    .map(|d| format!("    {}", d.text))
                    .collect();
                if missing.is_empty() {
                    continue;
                }
                let after = section
                    .server_directives()
                    .last()
                    .or_else(|| section.directives.last())
                    .map_or(section.line, |d| d.line);
                servers += missing.len();
                let slot = inserts.entry(after.saturating_sub(1) as usize).or_default();
                slot.push("    # kept by hapwright's safety valve while a removal is held".into());
                slot.extend(missing);
            }
        }
    }

    let mut main = String::with_capacity(desired_text.len() + appended.len());
    for (index, line) in desired_lines.iter().enumerate() {
        main.push_str(line);
        main.push('\n');
        if let Some(extra) = inserts.get(&index) {
            for line in extra {
                main.push_str(line);
                main.push('\n');
            }
        }
    }
    main.push_str(&appended);

    let mut maps = desired.config.maps().clone();
    let mut map_entries = 0;
    let map_names: BTreeSet<&String> = sources
        .iter()
        .flat_map(|s| s.config.maps().keys())
        .collect();
    for name in map_names {
        let current = maps.get(name).cloned().unwrap_or_else(|| Arc::from(""));
        let mut keys: BTreeSet<&str> = entries(&current).map(key).collect();
        let mut added = String::new();
        for source in sources {
            let Some(text) = source.config.maps().get(name) else {
                continue;
            };
            for line in entries(text) {
                if keys.insert(key(line)) {
                    added.push_str(line);
                    added.push('\n');
                    map_entries += 1;
                }
            }
        }
        if !added.is_empty() {
            let mut text = current.to_string();
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&added);
            maps.insert(name.clone(), Arc::from(text));
        }
    }

    let mut files = desired.config.files().clone();
    let mut certificates = desired.config.certificates().clone();
    let mut kept_files = 0;
    for source in sources {
        for (name, content) in source.config.files() {
            if !files.contains_key(name) {
                files.insert(name.clone(), content.clone());
                kept_files += 1;
            }
        }
        for (name, content) in source.config.certificates() {
            if !certificates.contains_key(name) {
                certificates.insert(name.clone(), content.clone());
                kept_files += 1;
            }
        }
    }

    if backends + servers + map_entries + kept_files == 0 {
        return Kept {
            config: desired.config.clone(),
            model: desired.model.clone(),
            backends,
            servers,
            map_entries,
            files: kept_files,
            problems: Vec::new(),
        };
    }
    // Inserted server lines move the lines after them: the render's source map
    // would point at the wrong template lines.
    let source_map = if inserts.is_empty() {
        desired.config.source_map().clone()
    } else {
        SourceMap::default()
    };
    let config = Arc::new(RenderedConfig::from_shared_groups(
        HashedMain::new(main),
        [maps, files, certificates],
        Arc::new(source_map),
        |_| None,
    ));
    let (model, diagnostics) =
        haproxy_config::phase1_parsed(config.main(), &haproxy_config::FileNames::of(&config));
    let problems = diagnostics
        .into_iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    let model = Arc::new(model);
    Kept {
        config,
        model,
        backends,
        servers,
        map_entries,
        files: kept_files,
        problems,
    }
}

/// The 0-based line range of `section` in its config text: from its header to the
/// next section's header.
fn section_range(model: &Model, section: &Section, total: usize) -> std::ops::Range<usize> {
    let start = (section.line as usize).saturating_sub(1);
    let end = model
        .sections
        .iter()
        .map(|s| s.line as usize)
        .filter(|&line| line > section.line as usize)
        .min()
        .map_or(total, |line| line - 1);
    start..end.max(start)
}

/// The entry lines of a map file: not blank, not `#` comments.
fn entries(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
}

/// The key of a map entry: its first word.
fn key(line: &str) -> &str {
    line.split_whitespace().next().unwrap_or(line)
}
