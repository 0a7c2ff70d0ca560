//! HAProxy configuration tokenizer, model and phase-1 checks.
//!
//! The tokenizer and the model live in the event bus crate
//! (`hapwright_eventbus::model::haproxy`), so that events carry the parsed model
//! typed; they are re-exported here beside the checks. [`parse`] turns `haproxy.cfg` text into a [`Config`]: the sections in file order,
//! each with its directives (keyword, unquoted arguments, line number, text as
//! written). It follows HAProxy 2.6's own line parser for quoting, escapes, comments
//! and `${ENV}` references (kept as written, so one model serves every instance
//! environment), and keeps `.if`/`.elif`/`.else`/`.endif` lines as directives in
//! place, checking only that they nest. Lines before the first section header are
//! an error like in HAProxy, except conditional and diagnostic (`.notice`) lines,
//! which go into a synthetic [`SectionKind::Preamble`] section.
//!
//! [`check`] runs the phase-1 checks of the validator (duplicate proxy names, missing
//! `use_backend` targets, references to files that were not rendered), and [`print()`]
//! writes a model back canonically.
//!
//! Nothing here panics on any input; the property tests and the fuzz target in
//! `fuzz/` hold it to that.
//!
//! ```
//! use hapwright_deployer::haproxy::config::{self as haproxy_config, SectionKind};
//!
//! let config = haproxy_config::parse(
//!     "backend be_web\n    balance roundrobin\n    server s1 10.0.0.1:8080 check\n",
//! )
//! .unwrap();
//! let backend = config.section(SectionKind::Backend, "be_web").unwrap();
//! let servers = backend.servers();
//! assert_eq!(servers[0].address, "10.0.0.1");
//! assert_eq!(servers[0].port, Some(8080));
//! assert!(config.effective_balance(backend).is_dynamic());
//! ```

mod checks;
mod file_names;
mod incremental;

use hapwright_eventbus::model::{Diagnostic, SourceLocation};

pub use checks::check;
pub use file_names::FileNames;
pub use hapwright_eventbus::model::haproxy::{
    Balance, Config, Directive, MAIN_FILE, MAX_WORDS, ParseError, Section, SectionKind, Server,
    parse, parse_lenient, print, split_address,
};
pub use incremental::parse_reusing;
pub(crate) use incremental::{LastVersions, changed_lines, common_prefix, common_suffix};

/// The whole of phase 1 on one `haproxy.cfg` text: every parse error, the missing
/// final newline HAProxy 2.6 rejects, and the [`check`] results (errors and
/// warnings), all located in [`MAIN_FILE`], in line order.
pub fn phase1(text: &str, rendered_paths: &FileNames) -> Vec<Diagnostic> {
    phase1_parsed(text, rendered_paths).1
}

/// [`phase1`], also returning the parsed model (complete when no diagnostic is an
/// error), so that a validated config is parsed exactly once.
pub fn phase1_parsed(text: &str, rendered_paths: &FileNames) -> (Config, Vec<Diagnostic>) {
    phase1_reusing(None, text, rendered_paths)
}

/// A `haproxy.cfg` text that passed phase 1, with its model and the rendered files it
/// was checked against: what [`phase1_reusing`] starts from.
#[derive(Clone, Copy, Debug)]
pub struct Passed<'a> {
    /// The text.
    pub text: &'a str,
    /// Its model.
    pub model: &'a Config,
    /// The rendered files it was checked against (as `rendered_paths`).
    pub rendered_paths: &'a FileNames,
}

/// [`phase1_parsed`], parsing only the changed sections when `previous` (a text and
/// its model, which passed phase 1) allows it ([`parse_reusing`]), and checking only
/// them when that shows the whole model clean ([`checks::clean_after_change`]); the
/// same result.
pub fn phase1_reusing(
    previous: Option<Passed<'_>>,
    text: &str,
    rendered_paths: &FileNames,
) -> (Config, Vec<Diagnostic>) {
    let reparsed =
        previous.and_then(|previous| incremental::reparse(previous.text, previous.model, text));
    let (config, errors, clean) = match (reparsed, previous) {
        (Some(reparsed), Some(previous)) => {
            // The old model passed phase 1 without a `.`-line (or it would not have
            // been reused), so the checks found nothing in it.
            let clean = (std::ptr::eq(previous.rendered_paths, rendered_paths)
                || previous.rendered_paths.same(rendered_paths))
                && checks::clean_after_change(
                    previous.model,
                    reparsed.old_changed,
                    &reparsed.config,
                    reparsed.new_changed,
                    rendered_paths,
                );
            (reparsed.config, Vec::new(), clean)
        }
        _ => {
            let (config, errors) = parse_lenient(text);
            (config, errors, false)
        }
    };
    let mut diagnostics: Vec<Diagnostic> = errors.iter().map(|e| e.to_diagnostic(text)).collect();
    if let Some(last) = text.rsplit('\n').next()
        && !last.is_empty()
    {
        let line = u32::try_from(text.split('\n').count()).unwrap_or(u32::MAX);
        diagnostics.push(
            Diagnostic::error("Missing LF on last line, file might have been truncated.")
                .at(SourceLocation::new(MAIN_FILE, Some(line), None))
                .with_source_line(last.trim()),
        );
    }
    if !clean {
        diagnostics.extend(check(&config, rendered_paths));
    }
    diagnostics.sort_by_key(|d| d.location.as_ref().and_then(|l| l.line));
    (config, diagnostics)
}

#[cfg(test)]
mod tests;
