//! The HAProxy configuration model carried on the bus: the tokenizer and the ordered
//! model of a `haproxy.cfg` (sections, directives, servers, balance algorithms).
//!
//! [`parse`] turns `haproxy.cfg` text into a [`Config`]: the sections in file order,
//! each with its directives (keyword, unquoted arguments, line number, text as
//! written). It follows HAProxy 2.6's own line parser for quoting, escapes, comments
//! and `${ENV}` references (kept as written, so one model serves every instance
//! environment), and keeps `.if`/`.elif`/`.else`/`.endif` lines as directives in
//! place, checking only that they nest. Lines before the first section header are
//! an error like in HAProxy, except conditional and diagnostic (`.notice`) lines,
//! which go into a synthetic [`SectionKind::Preamble`] section.
//!
//! The validator parses each rendered config once and hands the model on inside
//! `ValidationCompleted` and `DeploymentScheduled`, so the scheduler and the deployer
//! never parse it again. It lives here, beside the event catalogue, so that events
//! can name it; the deployer's `haproxy::config` re-exports it with its phase-1
//! checks. Nothing here panics on any input.

mod model;
mod tokenizer;

use std::sync::Arc;

use super::{Diagnostic, RenderedConfig, SourceLocation};

pub use model::{
    Balance, Config, Directive, ParseError, Section, SectionKind, Server, parse, parse_lenient,
    print, split_address,
};
pub use tokenizer::{MAX_WORDS, TokenError, split_words};

/// The rendered file a model is parsed from, and that parse errors are located in.
pub const MAIN_FILE: &str = "haproxy.cfg";

/// Parses the `haproxy.cfg` of a render into the model events carry.
pub fn parse_main(config: &RenderedConfig) -> Result<Arc<Config>, ParseError> {
    parse(config.main()).map(Arc::new)
}

impl ParseError {
    /// The error as a diagnostic located in the rendered [`MAIN_FILE`], with the
    /// offending line's text taken from `text` (the parsed text).
    pub fn to_diagnostic(&self, text: &str) -> Diagnostic {
        let mut diagnostic = Diagnostic::error(self.message.clone()).at(SourceLocation::new(
            MAIN_FILE,
            Some(self.line),
            self.column,
        ));
        let index = usize::try_from(self.line)
            .unwrap_or(usize::MAX)
            .saturating_sub(1);
        if let Some(line) = text.split('\n').nth(index) {
            diagnostic = diagnostic.with_source_line(line.trim());
        }
        diagnostic
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_render_that_does_not_parse_gives_its_cause_not_an_empty_model() {
        let good = RenderedConfig::main_only("backend be\n    server s1 10.0.0.1:80\n");
        let model = parse_main(&good).expect("parses");
        assert_eq!(model.backends().count(), 1);

        let text = "backend be\n    server s1 \"10.0.0.1:80\n";
        let error = parse_main(&RenderedConfig::main_only(text)).expect_err("unterminated quote");
        assert_eq!(error.line, 2);
        let diagnostic = error.to_diagnostic(text);
        let location = diagnostic.location.expect("located");
        assert_eq!(location.file, MAIN_FILE);
        assert_eq!(location.line, Some(2));
    }
}
