//! Static checks when the config loads: references to watched resources, literal
//! `include`/`import`/`from`/`extends` targets, literal `render_glob` patterns,
//! cycles among templates, and filter and test names (minijinja resolves those only
//! when rendering; Jinja2 rejects unknown ones when compiling). The same walks find
//! which output templates cannot observe the render order and so may render in
//! parallel ([`independent`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hapwright_eventbus::config::did_you_mean;
use hapwright_eventbus::model::{Diagnostic, FileKind};
use minijinja::Environment;
use minijinja::machinery::ast;

use super::Entry;
use super::functions::{self, compile_glob};
use super::scan::ReferenceKind;

/// The literal references between templates: template → (target, offset of the
/// reference in the template). `include [a, b]` counts as its first existing target,
/// a `render_glob` pattern as every snippet it matches.
pub(crate) type Edges<'a> = BTreeMap<&'a str, Vec<(String, usize)>>;

/// Runs every static check over the instrumented templates; returns the problems
/// found and the reference graph.
pub(crate) fn check<'a>(
    entries: &'a [Entry],
    watched: &BTreeSet<&str>,
) -> (Vec<Diagnostic>, Edges<'a>) {
    let names: BTreeSet<&str> = entries.iter().map(|e| e.name.as_ref()).collect();
    let snippets: Vec<&str> = entries
        .iter()
        .filter(|e| e.is_snippet)
        .map(|e| e.name.as_ref())
        .collect();
    let mut diagnostics = Vec::new();
    let mut edges: Edges<'a> = BTreeMap::new();

    for entry in entries {
        for error in &entry.instrumented.errors {
            diagnostics.push(entry.diagnostic_at(error.message.clone(), error.offset));
        }
        let out = edges.entry(entry.name.as_ref()).or_default();
        for reference in &entry.instrumented.references {
            match &reference.kind {
                ReferenceKind::Resource(resource) => {
                    if !watched.contains(resource.as_str()) {
                        let known: Vec<&str> = watched.iter().copied().collect();
                        let mut message = format!(
                            "resources.{resource} is not a watched resource (watched: {})",
                            if known.is_empty() {
                                "none".to_owned()
                            } else {
                                known.join(", ")
                            }
                        );
                        if let Some(close) = closest(resource, known.iter().copied()) {
                            message.push_str(&format!("; did you mean resources.{close}?"));
                        }
                        diagnostics.push(entry.diagnostic_at(message, reference.offset));
                    }
                }
                ReferenceKind::Template {
                    keyword,
                    names: targets,
                    ignore_missing,
                } => {
                    let existing: Vec<&String> = targets
                        .iter()
                        .filter(|t| names.contains(t.as_str()))
                        .collect();
                    if existing.is_empty() && !ignore_missing {
                        let what = match targets.as_slice() {
                            [one] => format!("`{one}`"),
                            several => format!(
                                "any of {}",
                                several
                                    .iter()
                                    .map(|t| format!("`{t}`"))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        };
                        let mut message = format!("{keyword} of unknown snippet {what}");
                        if let Some(close) = targets
                            .first()
                            .and_then(|t| closest(t, snippets.iter().copied()))
                        {
                            message.push_str(&format!("; did you mean `{close}`?"));
                        }
                        diagnostics.push(entry.diagnostic_at(message, reference.offset));
                    }
                    // `include [a, b]` renders only the first that exists.
                    if let Some(first) = existing.first() {
                        out.push(((*first).clone(), reference.offset));
                    }
                }
                ReferenceKind::Glob(pattern) => match compile_glob(pattern, "render_glob") {
                    Ok(matcher) => {
                        for snippet in &snippets {
                            if matcher.is_match(snippet) {
                                out.push(((*snippet).to_owned(), reference.offset));
                            }
                        }
                    }
                    Err(error) => diagnostics.push(entry.diagnostic_at(
                        error.detail().unwrap_or("invalid glob").to_owned(),
                        reference.offset,
                    )),
                },
            }
        }
    }

    diagnostics.extend(cycles(entries, &edges));
    (diagnostics, edges)
}

/// Which templates render on the pool at the same time as `haproxy.cfg`: for each
/// entry, true when it is a map, file or certificate and [self-contained](self_contained).
pub(crate) fn independent(
    entries: &[Entry],
    edges: &Edges<'_>,
    facts: &[Option<Facts>],
) -> Vec<bool> {
    self_contained(entries, edges, facts)
        .into_iter()
        .zip(entries)
        .map(|(contained, e)| {
            contained && e.output.as_ref().is_some_and(|f| f.kind != FileKind::Main)
        })
        .collect()
}

/// For each entry, true when it is an output template (`haproxy.cfg`, a map, file or
/// certificate) and neither it nor any template it reaches through `include`,
/// `import`, `from`, `extends` or `render_glob` names `shared` (the per-render memo,
/// whose contents depend on the order files render in) or references a template by
/// a computed name (whose target cannot be known before rendering). Such a file's
/// output depends only on the templates, `extraContext` and the resources it reads:
/// it may render in any order, and its last output may be reused when none of its
/// reads changed. `facts` are per entry, as [`names_and_facts`] returns them (`None`:
/// the template did not parse).
pub(crate) fn self_contained(
    entries: &[Entry],
    edges: &Edges<'_>,
    facts: &[Option<Facts>],
) -> Vec<bool> {
    (0..entries.len())
        .map(|root| {
            entries[root].output.is_some()
                && reach(entries, edges, root).is_some_and(|r| {
                    r.iter().all(|&i| {
                        facts[i].is_some_and(|f| !f.reads_shared && !f.computed_reference)
                    })
                })
        })
        .collect()
}

/// For each entry, true when it is an output that names `shared` (it is not
/// [self-contained](self_contained)) and neither it nor anything it reaches
/// references a template by a computed name. Such files render one after the other
/// in entry order, `haproxy.cfg` first with `shared` empty, so each one's output
/// depends only on its reads and on what the files before it left in `shared`: when
/// every such file before it was reused (so `shared` holds what it held last time)
/// and none of its reads changed, its last output may be reused too.
pub(crate) fn chained(
    entries: &[Entry],
    edges: &Edges<'_>,
    facts: &[Option<Facts>],
    reusable: &[bool],
) -> Vec<bool> {
    (0..entries.len())
        .map(|root| {
            entries[root].output.is_some()
                && !reusable[root]
                && reach(entries, edges, root).is_some_and(|reached| {
                    reached
                        .iter()
                        .all(|&i| facts[i].is_some_and(|f| !f.computed_reference))
                })
        })
        .collect()
}

/// For each entry, true when its output may be put together again from the pieces
/// of its last render: an output that reaches a template whose `include`s go
/// through the fragment cache (`rewritten`), and is [self-contained](self_contained)
/// or is `haproxy.cfg` with neither it nor anything it reaches referencing a
/// template by a computed name. `haproxy.cfg` renders before every file that names
/// `shared`, so `shared` starts empty for it and what it does with `shared` depends
/// only on what it reads.
pub(crate) fn spliceable(
    entries: &[Entry],
    edges: &Edges<'_>,
    facts: &[Option<Facts>],
    reusable: &[bool],
    rewritten: &BTreeSet<Arc<str>>,
) -> Vec<bool> {
    (0..entries.len())
        .map(|root| {
            let Some(reached) = reach(entries, edges, root) else {
                return false;
            };
            let main = entries[root]
                .output
                .as_ref()
                .is_some_and(|f| f.kind == FileKind::Main);
            reached
                .iter()
                .any(|&i| rewritten.contains(&entries[i].name))
                && (reusable[root]
                    || (main
                        && reached
                            .iter()
                            .all(|&i| facts[i].is_some_and(|f| !f.computed_reference))))
        })
        .collect()
}

/// Every template `root` reaches through literal references (itself included), or
/// `None` when a reference names no known template.
pub(crate) fn reach(entries: &[Entry], edges: &Edges<'_>, root: usize) -> Option<Vec<usize>> {
    let index: BTreeMap<&str, usize> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| (e.name.as_ref(), i))
        .collect();
    let mut seen = BTreeSet::from([root]);
    let mut stack = vec![root];
    while let Some(i) = stack.pop() {
        let out = edges
            .get(entries[i].name.as_ref())
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for (target, _) in out {
            let &t = index.get(target.as_str())?;
            if seen.insert(t) {
                stack.push(t);
            }
        }
    }
    Some(seen.into_iter().collect())
}

/// Finds reference cycles by depth-first search; each distinct cycle is reported
/// once, at the reference that closes it.
fn cycles(entries: &[Entry], edges: &Edges<'_>) -> Vec<Diagnostic> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Active,
        Done,
    }
    let by_name: BTreeMap<&str, &Entry> = entries.iter().map(|e| (e.name.as_ref(), e)).collect();
    let mut marks: BTreeMap<&str, Mark> = entries
        .iter()
        .map(|e| (e.name.as_ref(), Mark::New))
        .collect();
    let mut reported: BTreeSet<BTreeSet<String>> = BTreeSet::new();
    let mut diagnostics = Vec::new();

    for root in entries.iter().map(|e| e.name.as_ref()) {
        if marks[root] != Mark::New {
            continue;
        }
        // Iterative DFS: (node, index of the next edge to follow).
        let mut stack: Vec<(&str, usize)> = vec![(root, 0)];
        marks.insert(root, Mark::Active);
        while let Some((node, next)) = stack.last().copied() {
            let out = edges.get(node).map(Vec::as_slice).unwrap_or(&[]);
            let Some((target, offset)) = out.get(next) else {
                marks.insert(node, Mark::Done);
                stack.pop();
                continue;
            };
            if let Some(top) = stack.last_mut() {
                top.1 += 1;
            }
            let Some((target, _)) = by_name.get_key_value(target.as_str()) else {
                continue;
            };
            match marks[target] {
                Mark::New => {
                    marks.insert(target, Mark::Active);
                    stack.push((target, 0));
                }
                Mark::Active => {
                    let start = stack.iter().position(|(n, _)| n == target).unwrap_or(0);
                    let mut path: Vec<String> = stack[start..]
                        .iter()
                        .map(|(n, _)| (*n).to_owned())
                        .collect();
                    let members: BTreeSet<String> = path.iter().cloned().collect();
                    if reported.insert(members) {
                        path.push((*target).to_owned());
                        let message = if path.len() == 2 {
                            format!("`{}` includes itself", path[0])
                        } else {
                            format!("include cycle: {}", path.join(" → "))
                        };
                        diagnostics.push(by_name[node].diagnostic_at(message, *offset));
                    }
                }
                Mark::Done => {}
            }
        }
    }
    diagnostics
}

// === filter and test names ===

/// minijinja's built-in filters for the enabled features (`builtins`, `json`,
/// `urlencode`). Only candidates for "did you mean": whether a name exists is asked
/// of the renderer's environment.
const BUILTIN_FILTERS: &[&str] = &[
    "abs",
    "attr",
    "batch",
    "bool",
    "capitalize",
    "chain",
    "count",
    "d",
    "default",
    "dictsort",
    "e",
    "escape",
    "first",
    "float",
    "format",
    "groupby",
    "indent",
    "int",
    "items",
    "join",
    "last",
    "length",
    "lines",
    "list",
    "lower",
    "map",
    "max",
    "min",
    "pprint",
    "reject",
    "rejectattr",
    "replace",
    "reverse",
    "round",
    "safe",
    "select",
    "selectattr",
    "slice",
    "sort",
    "split",
    "string",
    "sum",
    "title",
    "tojson",
    "trim",
    "unique",
    "upper",
    "urlencode",
    "zip",
];

/// minijinja's built-in tests (word names; `==`, `<`, ... cannot be written as a
/// test name).
const BUILTIN_TESTS: &[&str] = &[
    "boolean",
    "defined",
    "divisibleby",
    "endingwith",
    "eq",
    "equalto",
    "escaped",
    "even",
    "false",
    "filter",
    "float",
    "ge",
    "greaterthan",
    "gt",
    "in",
    "int",
    "integer",
    "iterable",
    "le",
    "lessthan",
    "lower",
    "lt",
    "mapping",
    "ne",
    "none",
    "number",
    "odd",
    "safe",
    "sameas",
    "sequence",
    "startingwith",
    "string",
    "test",
    "true",
    "undefined",
    "upper",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NameKind {
    Filter,
    Test,
}

/// What the AST walk finds in one template.
#[derive(Debug, Default)]
struct Uses<'a> {
    names: Vec<NameUse<'a>>,
    facts: Facts,
    variables: Variables,
    /// Where `|trusted` (or `|safe`) is applied to a value that may come from a
    /// watched resource: byte offsets of the filter names.
    trusted: Vec<usize>,
}

/// The variable names one template uses (see [`names_and_facts`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Variables {
    /// Every variable name the template reads or assigns.
    pub(crate) named: BTreeSet<String>,
    /// The names it assigns with `set`, `macro`, `import` or `from ... import`
    /// (which an `include` of it leaves set in the including template).
    pub(crate) assigned: BTreeSet<String>,
}

/// Adds the variable names of an assignment target (`x`, `a, b`).
fn assigned_names(target: &ast::Expr<'_>, out: &mut BTreeSet<String>) {
    match target {
        ast::Expr::Var(v) => {
            out.insert(v.id.to_owned());
        }
        ast::Expr::Tuple(t) => t.items.iter().for_each(|e| assigned_names(e, out)),
        ast::Expr::List(l) => l.items.iter().for_each(|e| assigned_names(e, out)),
        _ => {}
    }
}

/// What decides whether a template may render at the same time as others (see
/// [`independent`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Facts {
    /// The template names the variable `shared`.
    pub(crate) reads_shared: bool,
    /// The template names `debug` (whose output shows the whole context).
    pub(crate) names_debug: bool,
    /// The template references a template by a computed name: `include x`,
    /// `import x`, `render_glob(x)` with `x` not a string literal (or a list of
    /// them), or `render_glob` other than called with one literal.
    pub(crate) computed_reference: bool,
}

/// A filter or test name used by a template, at its byte offset in the source.
#[derive(Debug)]
struct NameUse<'a> {
    kind: NameKind,
    name: Cow<'a, str>,
    offset: usize,
}

/// Reports every filter and test name — in expressions, `{% filter %}` and
/// `{% set x | f %}` blocks, macros and `call` blocks, and the literal names given to
/// `select`/`reject`/`selectattr`/`rejectattr`/`map` — that `env` does not define.
/// Templates that do not parse are skipped: their compile error is reported.
///
/// Also returns each entry's [`Facts`] (`None` for a template that does not parse).
/// What [`names_and_facts`] finds besides errors: warnings, each template's facts
/// and variables.
pub(crate) struct Found {
    pub(crate) warnings: Vec<Diagnostic>,
    pub(crate) facts: Vec<Option<Facts>>,
    pub(crate) variables: Vec<Variables>,
}

pub(crate) fn names_and_facts(
    entries: &[Entry],
    env: &Environment<'static>,
) -> (Vec<Diagnostic>, Found) {
    let (diagnostics, warnings, facts, variables) = names_facts_and_warnings(entries, env);
    (
        diagnostics,
        Found {
            warnings,
            facts,
            variables,
        },
    )
}

fn names_facts_and_warnings(
    entries: &[Entry],
    env: &Environment<'static>,
) -> (
    Vec<Diagnostic>,
    Vec<Diagnostic>,
    Vec<Option<Facts>>,
    Vec<Variables>,
) {
    let mut diagnostics = Vec::new();
    let mut warnings = Vec::new();
    let mut facts = vec![None; entries.len()];
    let mut variables = vec![Variables::default(); entries.len()];
    let Ok(probe) = env.template_from_str("") else {
        return (diagnostics, warnings, facts, variables);
    };
    let state = probe.new_state();
    let known = |kind: NameKind, name: &str| match kind {
        NameKind::Filter => minijinja::tests::is_filter(&state, name),
        NameKind::Test => minijinja::tests::is_test(&state, name),
    };
    let candidates = |kind: NameKind| -> Vec<&'static str> {
        let (builtin, own) = match kind {
            NameKind::Filter => (BUILTIN_FILTERS, functions::FILTERS),
            NameKind::Test => (BUILTIN_TESTS, functions::TESTS),
        };
        builtin
            .iter()
            .chain(own)
            .copied()
            .filter(|name| known(kind, name))
            .collect()
    };
    let filters = candidates(NameKind::Filter);
    let tests = candidates(NameKind::Test);

    for ((entry, facts), variables) in entries.iter().zip(&mut facts).zip(&mut variables) {
        let Ok(template) =
            minijinja::machinery::parse(&entry.source, entry.name.as_ref(), env.syntax().clone())
        else {
            continue;
        };
        let mut uses = Uses::default();
        visit_stmt(&template, &mut uses);
        *facts = Some(uses.facts);
        *variables = std::mem::take(&mut uses.variables);
        for offset in uses.trusted {
            let mut warning = entry.diagnostic_at(
                "`trusted` is applied to a value that may come from a watched resource: it is \
                 written into the file unescaped, so whoever writes that object can add \
                 HAProxy syntax; escape it with `haproxy_escape` or print it as it is"
                    .to_owned(),
                offset,
            );
            warning.severity = hapwright_eventbus::model::Severity::Warning;
            warnings.push(warning);
        }
        for found in uses.names {
            if known(found.kind, &found.name) {
                continue;
            }
            let (what, names) = match found.kind {
                NameKind::Filter => ("filter", &filters),
                NameKind::Test => ("test", &tests),
            };
            let mut message = format!("unknown {what} `{}`", found.name);
            if let Some(close) = did_you_mean(&found.name, names.iter().copied()) {
                message.push_str(&format!("; did you mean `{close}`?"));
            }
            diagnostics.push(entry.diagnostic_at(message, found.offset));
        }
    }
    (diagnostics, warnings, facts, variables)
}

fn visit_stmts<'a>(stmts: &[ast::Stmt<'a>], uses: &mut Uses<'a>) {
    for stmt in stmts {
        visit_stmt(stmt, uses);
    }
}

fn visit_stmt<'a>(stmt: &ast::Stmt<'a>, uses: &mut Uses<'a>) {
    use ast::Stmt;
    match stmt {
        Stmt::Template(t) => visit_stmts(&t.children, uses),
        Stmt::EmitExpr(e) => visit_expr(&e.expr, uses),
        Stmt::EmitRaw(_) | Stmt::Continue(_) | Stmt::Break(_) => {}
        Stmt::ForLoop(f) => {
            visit_expr(&f.target, uses);
            visit_expr(&f.iter, uses);
            if let Some(filter) = &f.filter_expr {
                visit_expr(filter, uses);
            }
            visit_stmts(&f.body, uses);
            visit_stmts(&f.else_body, uses);
        }
        Stmt::IfCond(i) => {
            visit_expr(&i.expr, uses);
            visit_stmts(&i.true_body, uses);
            visit_stmts(&i.false_body, uses);
        }
        Stmt::WithBlock(w) => {
            for (target, value) in &w.assignments {
                visit_expr(target, uses);
                visit_expr(value, uses);
            }
            visit_stmts(&w.body, uses);
        }
        Stmt::Set(s) => {
            assigned_names(&s.target, &mut uses.variables.assigned);
            visit_expr(&s.target, uses);
            visit_expr(&s.expr, uses);
        }
        Stmt::SetBlock(s) => {
            assigned_names(&s.target, &mut uses.variables.assigned);
            visit_expr(&s.target, uses);
            if let Some(filter) = &s.filter {
                visit_expr(filter, uses);
            }
            visit_stmts(&s.body, uses);
        }
        Stmt::AutoEscape(a) => {
            visit_expr(&a.enabled, uses);
            visit_stmts(&a.body, uses);
        }
        Stmt::FilterBlock(f) => {
            visit_expr(&f.filter, uses);
            visit_stmts(&f.body, uses);
        }
        Stmt::Block(b) => visit_stmts(&b.body, uses),
        Stmt::Import(i) => {
            assigned_names(&i.name, &mut uses.variables.assigned);
            template_name(&i.expr, uses);
            visit_expr(&i.expr, uses);
            visit_expr(&i.name, uses);
        }
        Stmt::FromImport(f) => {
            template_name(&f.expr, uses);
            visit_expr(&f.expr, uses);
            for (name, alias) in &f.names {
                assigned_names(alias.as_ref().unwrap_or(name), &mut uses.variables.assigned);
                visit_expr(name, uses);
                if let Some(alias) = alias {
                    visit_expr(alias, uses);
                }
            }
        }
        Stmt::Extends(e) => {
            template_name(&e.name, uses);
            visit_expr(&e.name, uses);
        }
        Stmt::Include(i) => {
            template_name(&i.name, uses);
            visit_expr(&i.name, uses);
        }
        Stmt::Macro(m) => {
            uses.variables.assigned.insert(m.name.to_owned());
            uses.variables.named.insert(m.name.to_owned());
            visit_macro(m, uses);
        }
        Stmt::CallBlock(c) => {
            visit_call(&c.call, uses);
            visit_macro(&c.macro_decl, uses);
        }
        Stmt::Do(d) => visit_call(&d.call, uses),
    }
}

fn visit_macro<'a>(m: &ast::Macro<'a>, uses: &mut Uses<'a>) {
    visit_exprs(&m.args, uses);
    visit_exprs(&m.defaults, uses);
    visit_stmts(&m.body, uses);
}

fn visit_call<'a>(call: &ast::Call<'a>, uses: &mut Uses<'a>) {
    let literal_glob = matches!(&call.expr, ast::Expr::Var(v) if v.id == "render_glob")
        && matches!(call.args.as_slice(), [ast::CallArg::Pos(ast::Expr::Const(c))] if c.value.as_str().is_some());
    if !literal_glob {
        // Any other use of `render_glob` counts as a computed reference.
        visit_expr(&call.expr, uses);
    }
    visit_args(&call.args, uses);
}

/// Records a computed reference when a template name is not a string literal or a
/// literal list of them.
fn template_name(expr: &ast::Expr<'_>, uses: &mut Uses<'_>) {
    let literal =
        |e: &ast::Expr<'_>| matches!(e, ast::Expr::Const(c) if c.value.as_str().is_some());
    let is_literal = match expr {
        ast::Expr::List(l) => l.items.iter().all(literal),
        ast::Expr::Tuple(t) => t.items.iter().all(literal),
        other => literal(other),
    };
    if !is_literal {
        uses.facts.computed_reference = true;
    }
}

fn visit_args<'a>(args: &[ast::CallArg<'a>], uses: &mut Uses<'a>) {
    for arg in args {
        match arg {
            ast::CallArg::Pos(e)
            | ast::CallArg::Kwarg(_, e)
            | ast::CallArg::PosSplat(e)
            | ast::CallArg::KwargSplat(e) => visit_expr(e, uses),
        }
    }
}

fn visit_exprs<'a>(exprs: &[ast::Expr<'a>], uses: &mut Uses<'a>) {
    for expr in exprs {
        visit_expr(expr, uses);
    }
}

fn visit_expr<'a>(expr: &ast::Expr<'a>, uses: &mut Uses<'a>) {
    use ast::Expr;
    match expr {
        Expr::Var(v) => match v.id {
            id if !uses.variables.named.contains(id) => {
                uses.variables.named.insert(id.to_owned());
                visit_expr(expr, uses);
            }
            "shared" => uses.facts.reads_shared = true,
            "debug" => uses.facts.names_debug = true,
            "render_glob" => uses.facts.computed_reference = true,
            _ => {}
        },
        Expr::Const(_) => {}
        Expr::Slice(s) => {
            visit_expr(&s.expr, uses);
            for part in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                visit_expr(part, uses);
            }
        }
        Expr::UnaryOp(u) => visit_expr(&u.expr, uses),
        Expr::BinOp(b) => {
            visit_expr(&b.left, uses);
            visit_expr(&b.right, uses);
        }
        Expr::Compare(c) => {
            visit_expr(&c.expr, uses);
            for op in &c.ops {
                visit_expr(&op.expr, uses);
            }
        }
        Expr::IfExpr(i) => {
            visit_expr(&i.test_expr, uses);
            visit_expr(&i.true_expr, uses);
            if let Some(false_expr) = &i.false_expr {
                visit_expr(false_expr, uses);
            }
        }
        Expr::Filter(f) => {
            if matches!(f.name, "trusted" | "safe")
                && f.expr
                    .as_ref()
                    .is_some_and(|inner| may_hold_object_value(inner))
            {
                uses.trusted.push(f.span().start_offset as usize);
            }
            // The span starts at the name (for `{% filter %}` chains too).
            uses.names.push(NameUse {
                kind: NameKind::Filter,
                name: normalize(f.name),
                offset: f.span().start_offset as usize,
            });
            if let Some(inner) = &f.expr {
                visit_expr(inner, uses);
            }
            visit_args(&f.args, uses);
            literal_name_argument(f.name, &f.args, uses);
        }
        Expr::Test(t) => {
            uses.names.push(NameUse {
                kind: NameKind::Test,
                name: normalize(t.name),
                offset: t.span().start_offset as usize,
            });
            visit_expr(&t.expr, uses);
            visit_args(&t.args, uses);
        }
        Expr::GetAttr(g) => visit_expr(&g.expr, uses),
        Expr::GetItem(g) => {
            visit_expr(&g.expr, uses);
            visit_expr(&g.subscript_expr, uses);
        }
        Expr::Call(c) => visit_call(c, uses),
        Expr::List(l) => visit_exprs(&l.items, uses),
        Expr::Tuple(t) => visit_exprs(&t.items, uses),
        Expr::Map(m) => {
            visit_exprs(&m.keys, uses);
            visit_exprs(&m.values, uses);
        }
    }
}

/// Whether `expr` may evaluate to text taken from a watched resource: it names a
/// variable other than `extraContext` and `loop`, outside `haproxy_escape` (whose
/// output is escaped) and `path()`. Conservative: what it cannot tell counts.
fn may_hold_object_value(expr: &ast::Expr<'_>) -> bool {
    use ast::Expr;
    let any = |exprs: &[Expr<'_>]| exprs.iter().any(may_hold_object_value);
    let args = |args: &[ast::CallArg<'_>]| {
        args.iter().any(|arg| match arg {
            ast::CallArg::Pos(e)
            | ast::CallArg::Kwarg(_, e)
            | ast::CallArg::PosSplat(e)
            | ast::CallArg::KwargSplat(e) => may_hold_object_value(e),
        })
    };
    match expr {
        Expr::Const(_) | Expr::Test(_) | Expr::Compare(_) => false,
        Expr::Var(v) => !matches!(v.id, "extraContext" | "loop"),
        Expr::Filter(f) if f.name == "haproxy_escape" => false,
        Expr::Filter(f) => {
            f.expr.as_ref().is_some_and(|e| may_hold_object_value(e)) || args(&f.args)
        }
        Expr::Call(c) => match &c.expr {
            Expr::Var(v) if v.id == "path" => false,
            callee => may_hold_object_value(callee) || args(&c.args),
        },
        Expr::GetAttr(g) => may_hold_object_value(&g.expr),
        Expr::GetItem(g) => may_hold_object_value(&g.expr),
        Expr::Slice(s) => may_hold_object_value(&s.expr),
        Expr::UnaryOp(u) => may_hold_object_value(&u.expr),
        Expr::BinOp(b) => may_hold_object_value(&b.left) || may_hold_object_value(&b.right),
        Expr::IfExpr(i) => {
            may_hold_object_value(&i.true_expr)
                || i.false_expr
                    .as_ref()
                    .is_some_and(|e| may_hold_object_value(e))
        }
        Expr::List(l) => any(&l.items),
        Expr::Tuple(t) => any(&t.items),
        Expr::Map(m) => any(&m.keys) || any(&m.values),
    }
}

/// The test or filter a literal string argument names: `select("odd")`,
/// `selectattr("port", "gt", 80)`, `map("upper")` (not `map(attribute="x")`).
fn literal_name_argument<'a>(filter: &str, args: &[ast::CallArg<'a>], uses: &mut Uses<'a>) {
    let (kind, position) = match filter {
        "select" | "reject" => (NameKind::Test, 0),
        "selectattr" | "rejectattr" => (NameKind::Test, 1),
        "map" => (NameKind::Filter, 0),
        _ => return,
    };
    let mut positional = args.iter().filter_map(|arg| match arg {
        ast::CallArg::Pos(e) => Some(e),
        _ => None,
    });
    if let Some(ast::Expr::Const(constant)) = positional.nth(position)
        && let Some(name) = constant.value.as_str()
    {
        uses.names.push(NameUse {
            kind,
            name: Cow::Owned(name.to_owned()),
            offset: constant.span().start_offset as usize,
        });
    }
}

/// Filter and test names as the engine looks them up: whitespace inside a dotted
/// name is dropped.
fn normalize(name: &str) -> Cow<'_, str> {
    if name.bytes().any(|b| b.is_ascii_whitespace()) {
        Cow::Owned(name.chars().filter(|c| !c.is_ascii_whitespace()).collect())
    } else {
        Cow::Borrowed(name)
    }
}

/// The candidate closest to `word` by edit distance, if it is close enough to be a
/// likely typo.
pub(crate) fn closest<'a>(
    word: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .map(|c| (levenshtein(word, c), c))
        .filter(|(distance, c)| *distance <= (c.len().max(word.len()) / 3).max(1))
        .min()
        .map(|(_, c)| c)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let current = row[j + 1];
            row[j + 1] = if ca == *cb {
                previous
            } else {
                1 + previous.min(row[j]).min(row[j + 1])
            };
            previous = current;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of one of the environment's registries, from its `Debug` output
    /// (minijinja has no API to list them).
    fn registered(env: &Environment<'_>, field: &str) -> BTreeSet<String> {
        let debug = format!("{env:?}");
        let start = debug
            .find(&format!("{field}: ["))
            .expect("field in Debug output")
            + field.len()
            + 3;
        let end = start + debug[start..].find(']').expect("end of list");
        debug[start..end]
            .split(", ")
            .map(|key| key.trim_matches('"').to_owned())
            .filter(|key| !key.is_empty())
            .collect()
    }

    #[test]
    fn did_you_mean_candidates_are_exactly_the_renderers_filters_and_tests() {
        let env = super::super::build_environment(
            super::super::TemplatingSettings::default(),
            super::super::RenderLimits::default(),
            Vec::new(),
            BTreeMap::new(),
            super::super::OutputSyntax::Haproxy,
        )
        .expect("environment");
        let filters: BTreeSet<String> = BUILTIN_FILTERS
            .iter()
            .chain(functions::FILTERS)
            .map(|name| (*name).to_owned())
            .collect();
        // Hidden helpers of the load-time rewrites are not suggested.
        let visible: BTreeSet<String> = registered(&env, "filters")
            .into_iter()
            .filter(|name| !name.starts_with("__"))
            .collect();
        assert_eq!(visible, filters);
        let tests: BTreeSet<String> = BUILTIN_TESTS
            .iter()
            .chain(functions::TESTS)
            .map(|name| (*name).to_owned())
            .collect();
        let word_tests: BTreeSet<String> = registered(&env, "tests")
            .into_iter()
            .filter(|name| name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .collect();
        assert_eq!(word_tests, tests);
    }

    #[test]
    fn suggests_close_names_only() {
        let names = ["services", "endpoints", "ingresses"];
        assert_eq!(closest("servics", names.iter().copied()), Some("services"));
        assert_eq!(
            closest("endpoint", names.iter().copied()),
            Some("endpoints")
        );
        assert_eq!(closest("pods", names.iter().copied()), None);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
    }

    #[test]
    fn files_that_cannot_observe_render_order_render_in_parallel() {
        let snippets = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(n, s)| ((*n).to_owned(), (*s).to_owned()))
                .collect::<BTreeMap<_, _>>()
        };
        let templates = super::super::Templates {
            main: "{% do shared.setdefault('a', 1) %}{% include 'plain' %}\n".into(),
            snippets: snippets(&[
                ("plain", "x"),
                ("reads-shared", "{{ shared.a }}"),
                ("via-reads", "{% include 'reads-shared' %}"),
                ("macros", "{% macro m() %}{{ shared.a }}{% endmacro %}"),
                ("glob-1", "one"),
                ("glob-2", "{% include ['missing', 'plain'] %}"),
            ]),
            maps: snippets(&[
                ("a-plain", "{% include 'plain' %}"),
                ("b-shared-via-include", "{% include 'via-reads' %}"),
                ("c-computed-include", "{% set n = 'plain' %}{% include n %}"),
                ("d-literal-glob", "{{ render_glob('glob-*') }}"),
                (
                    "e-computed-glob",
                    "{% set p = 'glob-*' %}{{ render_glob(p) }}",
                ),
                ("f-import", "{% from 'macros' import m %}{{ m() }}"),
                ("h-shared-shadowed", "{% set shared = 1 %}{{ shared }}"),
                (
                    "i-literal-list",
                    "{% include ['missing', 'plain'] ignore missing %}",
                ),
            ]),
            ..super::super::Templates::default()
        };
        let renderer = super::super::Renderer::new(templates, &[] as &[&str]).expect("loads");
        let independent: BTreeMap<&str, bool> = renderer
            .inner
            .entries
            .iter()
            .zip(renderer.independent())
            .filter(|(e, _)| !e.is_snippet && e.name.as_ref() != "haproxy.cfg")
            .map(|(e, i)| (e.name.as_ref(), *i))
            .collect();
        assert_eq!(
            independent,
            BTreeMap::from([
                ("maps/a-plain", true),
                ("maps/b-shared-via-include", false),
                ("maps/c-computed-include", false),
                ("maps/d-literal-glob", true),
                ("maps/e-computed-glob", false),
                ("maps/f-import", false),
                // Conservative: any mention of the name counts.
                ("maps/h-shared-shadowed", false),
                ("maps/i-literal-list", true),
            ])
        );
        // And the render is the same as rendering one file after the other.
        let config = renderer
            .render(&super::super::Resources::new())
            .expect("renders");
        assert_eq!(config.maps()["b-shared-via-include"].as_ref(), "1\n");
        assert_eq!(config.maps()["d-literal-glob"].as_ref(), "one\nx\n");
        assert_eq!(config.maps()["f-import"].as_ref(), "1\n");
    }
}
