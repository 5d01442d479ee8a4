//! The `braid` command: glue between the command line and the crates that
//! do the work. Arguments are parsed in two stages, as ripgrep does: clap
//! reads raw flags, then each subcommand turns them into a checked
//! configuration before anything starts.
//!
//! Exit codes: 0 success, 1 the operation failed, 2 usage error.

mod cli;
mod logging;
mod serve;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    logging::init(cli.verbose, cli.quiet);
    let result = match cli.command {
        cli::Command::Serve(args) => serve::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let usage = e.downcast_ref::<cli::UsageError>().is_some();
            eprintln!("braid: error: {e:#}");
            if usage {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
