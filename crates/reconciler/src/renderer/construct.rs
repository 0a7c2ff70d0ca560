//! The steps of [`Renderer::new`](super::Renderer::new), each named: name every
//! template (the outputs first, in render order, then the file sets' templates, then
//! the snippets), instrument them with line markers, and compile the file sets'
//! name templates and `forEach` expressions and every template into the
//! environment.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hapwright_eventbus::model::{Diagnostic, FileKind, RenderedFileRef, SourceLocation};
use minijinja::Environment;
use minijinja::value::Value;

use super::source_map::MarkerTable;
use super::{Entry, FileSet, compile_diagnostic, scan, sets};
use crate::renderer::LineIndex;

/// A template before instrumenting: its name, the file it renders to (`None`: a
/// snippet) and its source.
pub(super) type Source = (Arc<str>, Option<RenderedFileRef>, String);

/// The rendered files' templates, in render order: `haproxy.cfg`, then `groups`
/// (maps, files, certificates). Also returns each output name's paths, which
/// `render_glob` and the file functions resolve.
pub(super) fn name_outputs(
    main: String,
    groups: [(FileKind, BTreeMap<String, String>); 3],
) -> (Vec<Source>, BTreeMap<String, Vec<String>>) {
    let mut sources: Vec<Source> = vec![(
        Arc::from("haproxy.cfg"),
        Some(RenderedFileRef {
            kind: FileKind::Main,
            name: "haproxy.cfg".to_owned(),
        }),
        main,
    )];
    let mut paths: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (kind, group) in groups {
        for (name, source) in group {
            let path = kind.relative_path(&name);
            paths.entry(name.clone()).or_default().push(path.clone());
            sources.push((
                Arc::from(path),
                Some(RenderedFileRef { kind, name }),
                source,
            ));
        }
    }
    (sources, paths)
}

/// File sets: their templates are entries too (checked and compiled like the
/// others), rendered per item. Returns each set with the index of its template's
/// entry; a set whose path is a file's already is an error.
pub(super) fn name_sets(
    sources: &mut Vec<Source>,
    file_sets: Vec<FileSet>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Vec<(FileSet, usize)> {
    let mut set_entries = Vec::new();
    for set in file_sets {
        let path = set.kind.relative_path(&set.key);
        if sources.iter().any(|(n, _, _)| n.as_ref() == path) {
            diagnostics.push(
                Diagnostic::error(format!(
                    "{path} is both a file and a file set; rename one of them"
                ))
                .at(SourceLocation::new(path.clone(), None, None)),
            );
            continue;
        }
        let index = sources.len();
        sources.push((
            Arc::from(path),
            Some(RenderedFileRef {
                kind: set.kind,
                name: set.key.clone(),
            }),
            set.template.clone(),
        ));
        set_entries.push((set, index));
    }
    set_entries
}

/// The snippets, after every output; a snippet named like a rendered file is an
/// error. Returns the snippets' names.
pub(super) fn name_snippets(
    sources: &mut Vec<Source>,
    snippets: BTreeMap<String, String>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Vec<String> {
    let reserved: BTreeSet<Arc<str>> = sources.iter().map(|(n, _, _)| n.clone()).collect();
    let mut snippet_names = Vec::new();
    for (name, source) in snippets {
        if reserved.contains(name.as_str()) {
            diagnostics.push(
                Diagnostic::error(format!(
                    "snippet name `{name}` is reserved for a rendered file; rename the snippet"
                ))
                .at(SourceLocation::new(name.clone(), None, None)),
            );
            continue;
        }
        snippet_names.push(name.clone());
        sources.push((Arc::from(name), None, source));
    }
    snippet_names
}

/// Every template with a line marker per source line, the table of those markers,
/// and each entry's index by name.
pub(super) fn instrument(
    sources: Vec<Source>,
) -> (Vec<Entry>, MarkerTable, BTreeMap<Arc<str>, usize>) {
    let mut markers = MarkerTable::default();
    let entries: Vec<Entry> = sources
        .into_iter()
        .map(|(name, output, source)| {
            let instrumented = scan::instrument(&source, |line| Some(markers.marker(&name, line)));
            Entry {
                is_snippet: output.is_none(),
                lines: LineIndex::new(&source),
                name,
                output,
                source,
                instrumented,
            }
        })
        .collect();
    let by_name = entries
        .iter()
        .enumerate()
        .map(|(index, entry)| (entry.name.clone(), index))
        .collect();
    (entries, markers, by_name)
}

/// The file sets' name templates and `forEach` expressions, compiled into `env`.
/// A set's template renders per item, never as a file of its own, so it is neither
/// independent nor reusable as a file. Returns which entries are a set's template
/// and the compiled sets.
pub(super) fn compile_sets(
    env: &mut Environment<'static>,
    set_entries: Vec<(FileSet, usize)>,
    independent: &mut [bool],
    reusable: &mut [bool],
    diagnostics: &mut Vec<Diagnostic>,
) -> (Vec<bool>, Vec<sets::SetSpec>) {
    let mut in_set = vec![false; independent.len()];
    let mut set_specs = Vec::new();
    for (set, index) in set_entries {
        in_set[index] = true;
        let contained = reusable[index];
        independent[index] = false;
        reusable[index] = false;
        let name_template = sets::name_template(set.kind, &set.key);
        let path = set.kind.relative_path(&set.key);
        if let Err(error) = env.add_template_owned(name_template.clone(), set.name.clone()) {
            diagnostics.push(
                Diagnostic::error(format!("{path}: its file name template: {error}"))
                    .at(SourceLocation::new(path.clone(), None, None)),
            );
        }
        let pure_name = env.get_template(&name_template).is_ok_and(|template| {
            sets::pure_name(&set.name, &template.undeclared_variables(false))
        });
        if let Err(error) = env.compile_expression(&set.for_each) {
            diagnostics.push(
                Diagnostic::error(format!("{path}: its forEach expression: {error}"))
                    .at(SourceLocation::new(path.clone(), None, None)),
            );
        }
        set_specs.push(sets::SetSpec {
            kind: set.kind,
            key: set.key,
            entry: index,
            name_template,
            for_each: set.for_each,
            contained,
            pure_name,
        });
    }
    (in_set, set_specs)
}

/// Every instrumented template, compiled into `env` (literals of trusted text
/// marked as such); each compile error is located in the original source.
pub(super) fn compile_entries(
    env: &mut Environment<'static>,
    entries: &[Entry],
    diagnostics: &mut Vec<Diagnostic>,
) {
    for entry in entries {
        let source = scan::trust_literals(&entry.instrumented.source)
            .unwrap_or_else(|| entry.instrumented.source.clone());
        if let Err(error) = env.add_template_owned(entry.name.to_string(), source) {
            diagnostics.push(compile_diagnostic(env, entry, &error));
        }
    }
}

/// `per_entry` with every file set's template unset: a set's template is never a
/// file of its own.
pub(super) fn outside_sets(mut per_entry: Vec<bool>, in_set: &[bool]) -> Vec<bool> {
    for (flag, _) in per_entry.iter_mut().zip(in_set).filter(|(_, s)| **s) {
        *flag = false;
    }
    per_entry
}

/// The environment's functions, by name.
pub(super) fn globals(env: &Environment<'static>) -> BTreeMap<String, Value> {
    env.globals()
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
}
