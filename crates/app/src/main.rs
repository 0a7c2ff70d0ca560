//! The `hapwright` command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Keeps HAProxy configured from live data: watches resources, renders `haproxy.cfg`
/// and its map, certificate and other files from Jinja templates, validates them and
/// deploys them without a reload whenever HAProxy allows it.
#[derive(Debug, Parser)]
#[command(name = "hapwright", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the version of hapwright.
    Version,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            // clap exits 0 for --help/--version and 2 for usage errors, as DESIGN §4 asks.
            error.exit();
        }
    };
    match cli.command {
        Command::Version => {
            println!("hapwright {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
    }
}
