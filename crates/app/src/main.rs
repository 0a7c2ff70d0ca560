//! The `hapwright` command line.

use std::io::stdout;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use hapwright_app::validation_tests::OutputFormat;
use hapwright_app::{bench, commands, plan, run};
use hapwright_deployer::client::master::Version;

/// `--scale`'s parsed value (a type alias so clap does not treat it as a list of
/// arguments).
type Scales = Vec<usize>;

/// mimalloc: rendering allocates and frees many small template values, which it does
/// faster than the system allocator (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Keeps HAProxy configured from live data: watches resources, renders `haproxy.cfg`
/// and its map, certificate and other files from Jinja templates, validates them and
/// deploys them without a reload whenever HAProxy allows it.
#[derive(Debug, Parser)]
#[command(
    name = "hapwright",
    version,
    about = "Keeps HAProxy configured from live data through Jinja templates",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controller.
    Run {
        /// The config file.
        #[arg(short, long, value_name = "FILE", env = "HAPWRIGHT_CONFIG")]
        config: PathBuf,
    },
    /// Validate the config file, compile every template and find the HAProxy binary
    /// (exit 2: invalid config file, 1: a template or reference is wrong, or
    /// haproxy.binary is not found).
    Check {
        /// The config file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Render once from the file sources (or fixtures) and validate the result (exit
    /// 0: rendered and valid, 1: a manifest, template or validation error, 2: invalid
    /// config file).
    Render {
        /// The config file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// Read each watched resource from DIR/NAME/ (NAME: the watched resource) instead
        /// of its source.
        #[arg(long, value_name = "DIR")]
        fixtures: Option<PathBuf>,
        /// Write haproxy.cfg, maps/, files/ and certs/ under DIR instead of printing
        /// haproxy.cfg.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Run the config file's validationTests (exit 0: all pass, 1: a test fails or a
    /// template does not compile, 2: invalid config file or unknown test).
    Test {
        /// The config file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// Run only this test (`_global` is still merged into it).
        #[arg(long, value_name = "NAME")]
        test: Option<String>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
    },
    /// Measure compile, render, validation time and peak memory at growing numbers of
    /// generated objects (exit 1: a template fails or validation rejects, 2: invalid
    /// config file or scale list).
    Bench {
        /// The config file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// Comma-separated scales: Services (with an EndpointSlice and an Ingress
        /// each), or copies of the validationTests fixtures.
        #[arg(long, value_name = "N,N,...", default_value = "10,100,1000,10000", value_parser = bench::parse_scales)]
        scale: Scales,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
        /// Measure in this process instead of one child process per scale (then peak
        /// memory is the peak over all scales so far).
        #[arg(long, hide = true)]
        in_process: bool,
    },
    /// Tell, without touching HAProxy, what deploying a render would do to each
    /// instance: nothing, runtime commands, or a reload and why (exit 0: no change,
    /// 3: runtime commands only, 4: a reload, 1: a manifest, template, validation or
    /// read error, 2: invalid config file or arguments).
    Plan {
        /// The config file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// Render the desired side from DIR/NAME/ (NAME: the watched resource) instead
        /// of the file sources.
        #[arg(long, value_name = "DIR")]
        fixtures: Option<PathBuf>,
        /// Compare with the files an instance runs: a config directory hapwright
        /// deployed to (repeatable; default: every socket instance's configDir).
        #[arg(long, value_name = "DIR")]
        running: Vec<PathBuf>,
        /// Compare with a render of these fixtures, as if an instance ran it
        /// (repeatable).
        #[arg(long, value_name = "DIR")]
        running_fixtures: Vec<PathBuf>,
        /// The instances' HAProxy line (e.g. 3.4), which decides whether added and
        /// removed backends are runtime changes; default: `haproxy -v` of
        /// haproxy.binary.
        #[arg(long, value_name = "X.Y", value_parser = parse_version)]
        haproxy_version: Option<Version>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
    },
    /// Print the version of hapwright.
    Version,
    /// Print a shell completion script for SHELL to stdout, e.g.
    /// `hapwright completions bash > /etc/bash_completion.d/hapwright`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to stdout, e.g.
    /// `hapwright man > /usr/local/share/man/man1/hapwright.1`.
    Man,
}

/// `--haproxy-version`: a HAProxy line such as `3.4` or a full version `3.4.1-1`.
fn parse_version(text: &str) -> Result<Version, NotAVersion> {
    Version::parse(text).ok_or_else(|| NotAVersion(text.to_owned()))
}

/// A `--haproxy-version` that names no HAProxy version.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a HAProxy version such as 3.4")]
struct NotAVersion(String);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the Tokio runtime starts")
}

fn main() -> ExitCode {
    // clap exits 0 for --help/--version and 2 for usage errors, as docs/cli.md documents.
    let cli = Cli::try_parse().unwrap_or_else(|error| error.exit());
    let code = match cli.command {
        Command::Run { config } => runtime().block_on(run::run(config)),
        Command::Check { config } => commands::check(&config),
        Command::Render {
            config,
            fixtures,
            out,
        } => runtime().block_on(commands::render(
            &config,
            fixtures.as_deref(),
            out.as_deref(),
        )),
        Command::Test {
            config,
            test,
            output,
        } => runtime().block_on(commands::test(&config, test.as_deref(), output)),
        Command::Bench {
            config,
            scale,
            output,
            in_process,
        } => runtime().block_on(bench::command(&config, &scale, output, in_process)),
        Command::Plan {
            config,
            fixtures,
            running,
            running_fixtures,
            haproxy_version,
            output,
        } => runtime().block_on(plan::command(
            &config,
            fixtures.as_deref(),
            &plan::Running {
                dirs: running,
                fixtures: running_fixtures,
            },
            haproxy_version,
            output,
        )),
        Command::Version => {
            println!("hapwright {}", env!("CARGO_PKG_VERSION"));
            run::exit::OK
        }
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "hapwright", &mut stdout());
            run::exit::OK
        }
        Command::Man => match clap_mangen::Man::new(Cli::command()).render(&mut stdout()) {
            Ok(()) => run::exit::OK,
            Err(error) => {
                eprintln!("hapwright man: {error}");
                run::exit::FAILURE
            }
        },
    };
    ExitCode::from(code)
}
