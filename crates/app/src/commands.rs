//! `hapwright check`, `hapwright render` and `hapwright test`: one-shot uses of the
//! pipeline, without a bus, for CI and for looking at what a config produces.

use std::path::{Path, PathBuf};

use hapwright_deployer::component::validator;
use hapwright_eventbus::model::{Diagnostic, SourceLocation};
use hapwright_reconciler::renderer::Resources;

use crate::build;
use crate::config;
use crate::run::exit;
use crate::validation_tests::{self, OutputFormat};

/// Prints diagnostics to stderr, one per line, each followed by its source line.
pub(crate) fn print_errors(errors: &[Diagnostic]) {
    for error in errors {
        eprintln!("{error}");
        if let Some(line) = &error.source_line {
            eprintln!("    | {line}");
        }
    }
}

/// Loads the config file, or prints its errors and returns the config-error exit code.
pub(crate) fn load(path: &Path) -> Result<config::Loaded, u8> {
    config::load(path).map_err(|errors| {
        print_errors(&errors);
        exit::CONFIG
    })
}

/// `n` and `noun`, with an `s` unless `n` is 1 (`1 instance`, `2 instances`).
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// `check -c FILE`: the config file is valid (exit 2 otherwise) and every template
/// compiles with its references resolved (exit 1 otherwise).
pub fn check(path: &Path) -> u8 {
    let loaded = match load(path) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    if let Err(message) = hapwright_deployer::config::resolve_binary(&loaded.config.haproxy.binary)
    {
        // Phase 2 (`haproxy -c`) and managed instances need it: the controller would
        // fail at its first render.
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let (line, column) = config::Locator::new(&text).locate("haproxy.binary").unzip();
        print_errors(&[
            Diagnostic::error(message.to_string()).at(SourceLocation::new(
                path.display().to_string(),
                line,
                column,
            )),
        ]);
        return exit::FAILURE;
    }
    match build::renderer(&loaded.config) {
        Ok(renderer) => {
            // Warnings do not fail the check: the templates load and render.
            print_errors(&loaded.templates_at.locate(renderer.warnings().to_vec()));
            let templates = &loaded.config.templates;
            println!(
                "{}: ok ({}, {}, {})",
                path.display(),
                count(
                    1 + templates.template_snippets.len()
                        + templates.maps.len()
                        + templates.files.len()
                        + templates.ssl_certificates.len()
                        + templates.status_templates.len(),
                    "template"
                ),
                count(
                    loaded.config.watched_resources.resources.len(),
                    "watched resource"
                ),
                count(loaded.config.haproxy.instances.len(), "instance"),
            );
            exit::OK
        }
        Err(errors) => {
            print_errors(&loaded.templates_at.locate(errors));
            exit::FAILURE
        }
    }
}

/// `render -c FILE [--fixtures DIR] [--out DIR]`: one render from the configured file
/// sources or from fixtures, then both validation phases. Prints `haproxy.cfg`, or
/// writes the whole layout under `out`.
pub async fn render(path: &Path, fixtures: Option<&Path>, out: Option<&Path>) -> u8 {
    let loaded = match load(path) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let config = &loaded.config;
    let rendered = match render_once(&loaded, fixtures) {
        Ok(rendered) => rendered,
        Err(code) => return code,
    };
    match validator::validate(&rendered, &build::validator_config(config)).await {
        Ok(warnings) => print_errors(&loaded.templates_at.locate(warnings)),
        Err(rejection) => {
            print_errors(&loaded.templates_at.locate(rejection.errors));
            return exit::FAILURE;
        }
    }
    match out {
        None => {
            print!("{}", rendered.main());
            exit::OK
        }
        Some(dir) => match write_layout(dir, &rendered) {
            Ok(written) => {
                for file in written {
                    eprintln!("wrote {}", file.display());
                }
                exit::OK
            }
            Err(error) => {
                eprintln!("{}: {error}", dir.display());
                exit::FAILURE
            }
        },
    }
}

/// One render of the loaded config from its `files` sources, or from `fixtures`
/// (`DIR/<watched resource name>/`), without validation; every error is printed and
/// gives the failure exit code.
pub(crate) fn render_once(
    loaded: &config::Loaded,
    fixtures: Option<&Path>,
) -> Result<hapwright_eventbus::model::RenderedConfig, u8> {
    let config = &loaded.config;
    let renderer = build::renderer(config).map_err(|errors| {
        print_errors(&loaded.templates_at.locate(errors));
        exit::FAILURE
    })?;
    let mut resources = Resources::new();
    let mut errors = Vec::new();
    for (name, resource) in &config.watched_resources.resources {
        match build::scan_once(name, resource, fixtures) {
            Ok(snapshot) => resources.update(&name.as_str().into(), snapshot, None),
            Err(found) => errors.extend(found),
        }
    }
    if !errors.is_empty() {
        print_errors(&errors);
        return Err(exit::FAILURE);
    }
    renderer.render(&resources).map_err(|errors| {
        print_errors(&loaded.templates_at.locate(errors));
        exit::FAILURE
    })
}

/// `test -c FILE [--test NAME] [--output text|json]`: runs the config's
/// `validationTests` (see [`validation_tests`]) and prints the results. Exit 0 when every test
/// passes, 1 when one fails or a template does not compile, 2 when the config file is
/// invalid or `NAME` is not a test.
pub async fn test(path: &Path, only: Option<&str>, output: OutputFormat) -> u8 {
    let loaded = match load(path) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let config = &loaded.config;
    let cases = match validation_tests::cases(config, only) {
        Ok(cases) => cases,
        Err(error) => {
            eprintln!("{}: {error}", path.display());
            return exit::CONFIG;
        }
    };
    if cases.is_empty() {
        eprintln!("{}: no validationTests to run", path.display());
    }
    let report = match validation_tests::run(
        config,
        cases.clone(),
        validation_tests::default_parallelism(),
    )
    .await
    {
        Ok(report) => report,
        Err(errors) => {
            print_errors(&errors);
            return exit::FAILURE;
        }
    };
    if output
        .print(&report, || validation_tests::format_text(&report, &cases))
        .is_err()
    {
        return exit::FAILURE;
    }
    if report.all_passed() {
        exit::OK
    } else {
        exit::FAILURE
    }
}

/// Writes the layout through the deployer's safe writer: no partial files, and
/// certificates (private keys) readable only by the current user (0600).
fn write_layout(
    dir: &Path,
    rendered: &hapwright_eventbus::model::RenderedConfig,
) -> std::io::Result<Vec<PathBuf>> {
    let config_dir = hapwright_deployer::haproxy::files::ConfigDir::new(dir);
    config_dir.write_rendered(rendered)?;
    Ok(rendered
        .iter()
        .map(|(file, _)| config_dir.path_of(&file.relative_path()))
        .collect())
}

#[cfg(test)]
mod count_tests {
    use super::count;

    #[test]
    fn counts_read_right_in_the_singular() {
        assert_eq!(count(1, "instance"), "1 instance");
        assert_eq!(count(0, "instance"), "0 instances");
        assert_eq!(count(2, "watched resource"), "2 watched resources");
    }
}
