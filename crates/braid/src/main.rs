//! The `braid` command: glue between the command line and the crates that
//! do the work. Arguments are parsed in two stages, as ripgrep does: clap
//! reads raw flags, then each subcommand turns them into a checked
//! configuration before anything starts.
//!
//! Exit codes: 0 success, 1 the operation failed, 2 usage error.

mod attach;
mod attached;
mod bench;
// Doc comments in `cli` are --help text for people at a shell, where
// `ADDR[:PORT]` means an optional port, not a rustdoc link.
#[allow(rustdoc::broken_intra_doc_links)]
mod cli;
mod config;
mod console;
mod control;
mod copy;
mod ctl;
mod demo;
mod doctor;
mod gateway;
mod logging;
mod manual;
mod metrics;
mod multipath;
mod notify;
mod out;
mod pattern;
mod rates;
mod serve;
mod side;
mod signals;
mod status;
mod tls;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse_env();
    let demo = matches!(cli.command, cli::Command::Demo(_));
    logging::init(cli.verbose, cli.quiet, demo);
    let result = match cli.command {
        cli::Command::Serve(args) => serve::run(*args),
        cli::Command::Copy(args) => copy::run(args),
        cli::Command::Bench(args) => bench::run(args),
        cli::Command::Demo(args) => demo::run(args),
        cli::Command::Attach(args) => attach::run(args),
        cli::Command::Status(args) => status::status(args),
        cli::Command::Policy(args) => status::policy(args),
        cli::Command::Path(args) => status::path(args),
        cli::Command::ClearLoss(args) => status::clear_loss(args),
        cli::Command::Alua(args) => status::alua(args),
        cli::Command::Tls(cli::TlsCommand::Init(args)) => tls::init(args),
        cli::Command::Doctor(args) => doctor::run(args),
        cli::Command::Completions(args) => manual::completions(args),
        cli::Command::Manpages(args) => manual::manpages(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(cli::Exit(code)) = e.downcast_ref::<cli::Exit>() {
                return ExitCode::from(*code);
            }
            let usage = e.downcast_ref::<cli::UsageError>().is_some();
            out::errln!("braid: error: {e:#}");
            if usage {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
