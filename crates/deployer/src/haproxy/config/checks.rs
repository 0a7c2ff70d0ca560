//! Phase-1 checks on a parsed configuration: the mistakes a template can make that
//! HAProxy reports late, without a location, or not at all.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

use hapwright_eventbus::model::{Diagnostic, SourceLocation};

use super::{Config, Directive, MAIN_FILE, SectionKind};

/// Directories of the rendered layout whose files a config may reference.
use super::file_names::{FileNames, LAYOUT_DIRS};

fn located(diagnostic: Diagnostic, line: u32, text: &str) -> Diagnostic {
    diagnostic
        .at(SourceLocation::new(MAIN_FILE, Some(line), None))
        .with_source_line(text)
}

/// Where a line sits in the `.if` structure: for each enclosing block, the block's
/// number and the branch (0 for `.if`, then 1, 2, … for each `.elif`/`.else`).
type Branches = Vec<(usize, usize)>;

/// Whether two places can never both be active: they sit in different branches of
/// one block.
fn exclusive(a: &Branches, b: &Branches) -> bool {
    for ((block_a, branch_a), (block_b, branch_b)) in a.iter().zip(b) {
        if block_a != block_b {
            return false;
        }
        if branch_a != branch_b {
            return true;
        }
    }
    false
}

struct Walker {
    stack: Branches,
    blocks: usize,
}

impl Walker {
    fn step(&mut self, directive: &Directive) {
        match directive.keyword.as_str() {
            ".if" => {
                self.blocks += 1;
                self.stack.push((self.blocks, 0));
            }
            ".elif" | ".else" => {
                if let Some((_, branch)) = self.stack.last_mut() {
                    *branch += 1;
                }
            }
            ".endif" => {
                self.stack.pop();
            }
            _ => {}
        }
    }
}

struct Proxy<'a> {
    kind: &'a SectionKind,
    line: u32,
    branches: Branches,
}

/// Whether two proxy sections with one name clash: frontends with frontends, backends
/// with backends, and a listen with any of the three (a frontend and a backend may
/// share a name).
fn clash(a: &SectionKind, b: &SectionKind) -> bool {
    a == b || *a == SectionKind::Listen || *b == SectionKind::Listen
}

/// Relative layout paths (`maps/hosts.map`, `certs/`) referenced in one word, found
/// at the start of the word or after a delimiter such as `(`, `,` or `=`.
fn layout_references(word: &str) -> Vec<&str> {
    let mut found = Vec::new();
    for (start, _) in word.char_indices() {
        let boundary = start == 0
            || word[..start]
                .chars()
                .next_back()
                .is_some_and(|c| matches!(c, '(' | ',' | '=' | '<' | '@' | ' ' | ':' | '"' | '\''));
        if !boundary {
            continue;
        }
        let rest = &word[start..];
        let rest = rest.strip_prefix("./").unwrap_or(rest);
        if !LAYOUT_DIRS.iter().any(|dir| rest.starts_with(dir)) {
            continue;
        }
        let end = rest
            .find(|c: char| {
                matches!(c, ',' | ')' | ']' | '}' | '>' | '"' | '\'') || c.is_whitespace()
            })
            .unwrap_or(rest.len());
        found.push(&rest[..end]);
    }
    found
}

/// Runs the phase-1 checks and returns one located diagnostic per problem (file
/// [`MAIN_FILE`], the line, the line's text):
///
/// - **duplicate proxy names**: two frontends, two backends, or a listen and any
///   proxy with one name (not when they sit in different branches of one `.if`);
/// - **missing `use_backend`/`default_backend` targets**: a static target (no `%[`
///   log-format, no `$` reference) that names no backend or listen section in any
///   branch;
/// - **unrendered files**: a `maps/…`, `files/…` or `certs/…` path (optionally with
///   `./`) that is not in `rendered_paths` (paths relative to the config directory,
///   as `RenderedFileRef::relative_path` gives them); a path ending in `/` must be
///   the prefix of a rendered file. Inside an `.if` block this is a warning, since
///   the branch may be inactive.
pub fn check(config: &Config, rendered_paths: &FileNames) -> Vec<Diagnostic> {
    let backends: BTreeSet<&str> = config
        .server_proxies()
        .filter_map(|s| s.name.as_deref())
        .collect();
    check_sections(
        config,
        0..config.sections.len(),
        |target| backends.contains(target),
        rendered_paths,
    )
}

/// The checks of [`check`] for the sections `range` of `config` (outside any `.if`
/// block when the range does not start at the first section): duplicates among them,
/// and each one's profile, targets (`is_backend`) and file references.
fn check_sections<'a>(
    config: &'a Config,
    range: Range<usize>,
    is_backend: impl Fn(&str) -> bool,
    rendered_paths: &FileNames,
) -> Vec<Diagnostic> {
    let mut diagnostics = Vec::new();
    let mut walker = Walker {
        stack: Vec::new(),
        blocks: 0,
    };
    let mut proxies: HashMap<&str, Vec<Proxy<'a>>> = HashMap::new();
    for section in &config.sections[range] {
        if section.kind.is_proxy()
            && let Some(name) = section.name.as_deref()
        {
            let previous = proxies.entry(name).or_default();
            if let Some(other) = previous
                .iter()
                .find(|p| clash(p.kind, &section.kind) && !exclusive(&p.branches, &walker.stack))
            {
                diagnostics.push(located(
                    Diagnostic::error(format!(
                        "{} '{name}' has the same name as {} '{name}' declared at {MAIN_FILE}:{}.",
                        section.kind, other.kind, other.line
                    )),
                    section.line,
                    &format!("{} {name}", section.kind.keyword()),
                ));
            }
            previous.push(Proxy {
                kind: &section.kind,
                line: section.line,
                branches: walker.stack.clone(),
            });
        }
        if section.kind.is_proxy()
            && let Some(profile) = section.from_defaults()
            && config.section(SectionKind::Defaults, profile).is_none()
        {
            diagnostics.push(located(
                unknown_profile(config, section, profile, !walker.stack.is_empty()),
                section.line,
                &section_header(section),
            ));
        }
        for directive in &section.directives {
            walker.step(directive);
            if matches!(
                directive.keyword.as_str(),
                "use_backend" | "default_backend"
            ) && let Some(target) = directive.args.first()
                && !target.is_empty()
                && !target.contains('%')
                && !target.contains('$')
                && !is_backend(target.as_str())
            {
                let what = if config.section(SectionKind::Frontend, target).is_some() {
                    format!("'{target}' is a frontend, not a backend")
                } else {
                    format!("no backend or listen section is named '{target}'")
                };
                diagnostics.push(located(
                    Diagnostic::error(format!(
                        "{} target does not exist: {what}.",
                        directive.keyword
                    )),
                    directive.line,
                    &directive.text,
                ));
            }
            let words = if directive.is_conditional() {
                &[][..]
            } else {
                &directive.args[..]
            };
            for word in words {
                for path in layout_references(word) {
                    if path.contains('$') || path.contains('%') || rendered(path, rendered_paths) {
                        continue;
                    }
                    let message = format!(
                        "'{}' references '{path}', which is not a rendered file{}.",
                        directive.keyword,
                        rendered_hint(path, rendered_paths)
                    );
                    let diagnostic = if walker.stack.is_empty() {
                        Diagnostic::error(message)
                    } else {
                        Diagnostic::warning(message)
                    };
                    diagnostics.push(located(diagnostic, directive.line, &directive.text));
                }
            }
        }
    }
    diagnostics
}

/// Most proxies a change may touch for [`clean_after_change`] to decide; past it
/// the whole model is checked (each one is compared with every other section).
const MAX_CHANGED_PROXIES: usize = 16;

/// Whether [`check`] finds nothing in `config`, shown from its sections `changed`
/// alone: `config` is `old` with `old`'s sections `replaced` replaced by `changed`
/// (phase 1 parsing only what changed), `old` had no `.`-line and [`check`] found
/// nothing in it against the same `rendered_paths`, and `config` has no `.`-line
/// either. `false` when that cannot be shown cheaply: [`check`] the whole model then.
///
/// Why this is exact: every check but three looks at one section, and the
/// unchanged sections passed them against the same rendered files. The three that
/// look across sections are covered here: a changed proxy named like any other
/// section of its kind (or a listen), a removed backend still named by a static
/// `use_backend`/`default_backend`, and a changed `defaults` section (a profile
/// gone) all fall back to the whole check.
pub(crate) fn clean_after_change(
    old: &Config,
    replaced: Range<usize>,
    config: &Config,
    changed: Range<usize>,
    rendered_paths: &FileNames,
) -> bool {
    let (Some(replaced_sections), Some(changed_sections)) = (
        old.sections.get(replaced.clone()),
        config.sections.get(changed.clone()),
    ) else {
        return false;
    };
    let touched = || changed_sections.iter().chain(replaced_sections);
    if touched().any(|s| s.kind == SectionKind::Defaults)
        || touched().filter(|s| s.kind.is_proxy()).count() > MAX_CHANGED_PROXIES
    {
        return false;
    }
    // A changed proxy clashing with a section outside the change.
    for section in changed_sections {
        let Some(name) = section.name.as_deref().filter(|_| section.kind.is_proxy()) else {
            continue;
        };
        let mut outside = config.sections[..changed.start]
            .iter()
            .chain(&config.sections[changed.end..]);
        if outside
            .any(|other| other.name.as_deref() == Some(name) && clash(&other.kind, &section.kind))
        {
            return false;
        }
    }
    // A removed backend some static target still names.
    let is_backend = |target: &str| {
        config
            .server_proxies()
            .any(|s| s.name.as_deref() == Some(target))
    };
    for section in replaced_sections {
        let Some(name) = section
            .name
            .as_deref()
            .filter(|_| section.kind.has_servers())
        else {
            continue;
        };
        if is_backend(name) {
            continue;
        }
        let targeted = config.sections.iter().any(|s| {
            s.directives.iter().any(|d| {
                matches!(d.keyword.as_str(), "use_backend" | "default_backend")
                    && d.args.first().map(String::as_str) == Some(name)
            })
        });
        if targeted {
            return false;
        }
    }
    check_sections(config, changed, is_backend, rendered_paths).is_empty()
}

/// `backend NAME from PROFILE` naming no `defaults PROFILE` section (HAProxy refuses
/// the config; `add backend` would refuse it too): an error naming the section and the
/// named defaults sections there are. A warning inside a `.if` block.
fn unknown_profile(
    config: &Config,
    section: &super::Section,
    profile: &str,
    conditional: bool,
) -> Diagnostic {
    let named: Vec<&str> = config
        .sections_of(SectionKind::Defaults)
        .filter_map(|d| d.name.as_deref())
        .collect();
    let hint = match named.as_slice() {
        [] => " (no defaults section has a name; name one `defaults NAME`)".to_owned(),
        names => format!(
            " (named defaults sections: {})",
            names
                .iter()
                .map(|n| format!("'{n}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let message = format!(
        "{} '{}' is declared from defaults section '{profile}', which does not exist{hint}.",
        section.kind,
        section.name.as_deref().unwrap_or_default()
    );
    if conditional {
        Diagnostic::warning(message)
    } else {
        Diagnostic::error(message)
    }
}

fn section_header(section: &super::Section) -> String {
    let mut words = vec![section.kind.keyword().to_owned()];
    words.extend(section.name.clone());
    words.extend(section.args.iter().cloned());
    words.join(" ")
}

fn rendered(path: &str, rendered_paths: &FileNames) -> bool {
    if path.ends_with('/') {
        rendered_paths.any_starting_with(path)
    } else {
        rendered_paths.contains(path)
    }
}

/// ` (rendered maps: a.map, b.map)` or ` (no maps are rendered)`.
fn rendered_hint(path: &str, rendered_paths: &FileNames) -> String {
    let Some(dir) = LAYOUT_DIRS.iter().find(|dir| path.starts_with(*dir)) else {
        return String::new();
    };
    let kind = dir.trim_end_matches('/');
    let names: Vec<&str> = rendered_paths.names_in(dir).take(10).collect();
    if names.is_empty() {
        format!(" (no {kind} are rendered)")
    } else {
        format!(" (rendered {kind}: {})", names.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_references_are_found_inside_expressions() {
        assert_eq!(
            layout_references("%[req.hdr(host),lower,map(maps/hosts.map,be_default)]"),
            ["maps/hosts.map"]
        );
        assert_eq!(layout_references("maps/a.map"), ["maps/a.map"]);
        assert_eq!(layout_references("./certs/"), ["certs/"]);
        assert_eq!(
            layout_references("/etc/haproxy/maps/a.map"),
            Vec::<&str>::new()
        );
        assert_eq!(layout_references("mymaps/a"), Vec::<&str>::new());
        assert_eq!(layout_references("é(files/x"), ["files/x"]);
    }

    #[test]
    fn exclusive_branches() {
        assert!(exclusive(&vec![(1, 0)], &vec![(1, 1)]));
        assert!(!exclusive(&vec![(1, 0)], &vec![(1, 0), (2, 1)]));
        assert!(!exclusive(&vec![], &vec![(1, 1)]));
        assert!(!exclusive(&vec![(1, 0)], &vec![(2, 0)]));
    }
}
