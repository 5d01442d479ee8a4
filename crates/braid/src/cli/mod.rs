//! Raw command-line flags, as clap reads them. Checking and combining them
//! happens in each subcommand's module. The flags live here by job: a
//! module per subcommand (or family of them), re-exported under `cli::`.

mod control;
mod doctor;
mod multipath;
mod serve;
mod volume;

pub use control::*;
pub use doctor::*;
pub use multipath::*;
pub use serve::*;
pub use volume::*;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// A mistake in how braid was called (exit code 2).
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Exit with this status; the command has already said why.
#[derive(Debug)]
pub struct Exit(pub u8);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}

impl std::error::Error for Exit {}

#[derive(Parser, Debug)]
#[command(
    name = "braid",
    version,
    about = "Multipath network block storage over NBD",
    long_about = "braid serves volumes over NBD on every address of a storage host, and uses \
every path a client has to that host at once: the bandwidth of all links, no I/O error when \
a link fails, and every path's figures visible live."
)]
pub struct Cli {
    /// More log output (-v debug, -vv trace)
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Less log output (-q warnings only, -qq errors only)
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub quiet: u8,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The command line of this process, read by clap.
    pub fn parse_env() -> Self {
        Self::parse_from(serve::iscsi_port_apart(std::env::args_os()))
    }

    /// As `parse_env`, from given words; for tests.
    #[cfg(test)]
    pub fn try_parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString>,
    {
        Self::try_parse_from(serve::iscsi_port_apart(args.into_iter().map(Into::into)))
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Export volumes over NBD on one or more portals (runs in the foreground)
    #[command(after_long_help = SERVE_EXAMPLES)]
    Serve(Box<ServeArgs>),
    /// Copy between local files or devices and NBD volumes, over every path
    #[command(after_long_help = COPY_EXAMPLES)]
    Copy(CopyArgs),
    /// Measure a volume over every path: MB/s, IOPS, latency, per path
    #[command(after_long_help = BENCH_EXAMPLES)]
    Bench(BenchArgs),
    /// Serve a demo volume on two loopback portals and use it with multipath
    Demo(DemoArgs),
    /// Make a multipath volume a local NBD export for the kernel, qemu, nbdfuse
    #[command(after_long_help = ATTACH_EXAMPLES)]
    Attach(AttachArgs),
    /// Show every running serve and attach: volumes, paths, live figures
    Status(StatusArgs),
    /// Switch the path policy of an attached volume, live
    Policy(PolicyArgs),
    /// Take a path of an attached volume out of use, or back (maintenance)
    Path(PathArgs),
    /// Clear an attached volume's loss of acknowledged writes, so that FLUSH
    /// and FUA writes succeed again
    #[command(after_long_help = CLEAR_LOSS_HELP)]
    ClearLoss(ClearLossArgs),
    /// Set the ALUA state of a serve's iSCSI portal (drain it before maintenance)
    #[command(after_long_help = ALUA_EXAMPLES)]
    Alua(AluaArgs),
    /// TLS helpers: `braid tls init DIR` makes a CA and certificates
    #[command(subcommand)]
    Tls(TlsCommand),
    /// Find what holds this host's paths and disks back, and say how to fix it
    #[command(after_long_help = DOCTOR_EXAMPLES)]
    Doctor(DoctorArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    #[command(after_long_help = "Examples:
  braid completions bash > /usr/share/bash-completion/completions/braid
  braid completions zsh > /usr/local/share/zsh/site-functions/_braid
  braid completions fish > ~/.config/fish/completions/braid.fish")]
    Completions(CompletionsArgs),
    /// Write the manual pages (braid.1, braid-serve.1, ...) into a directory
    #[command(after_long_help = "Example:
  braid manpages /usr/local/share/man/man1 && man braid-serve")]
    Manpages(ManpagesArgs),
}

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub struct ManpagesArgs {
    /// Directory for the pages (created if missing)
    pub dir: PathBuf,
}

#[derive(Subcommand, Debug)]
pub enum TlsCommand {
    /// Make a CA, a server certificate and a client certificate in DIR
    /// (the layout nbdkit, qemu and libnbd use)
    Init(TlsInitArgs),
}

#[derive(Args, Debug)]
pub struct TlsInitArgs {
    /// Directory for the PEM files
    pub dir: PathBuf,
    /// A name or address the server certificate is valid for (repeatable)
    /// [default: localhost, this host's addresses and hostname]
    #[arg(long = "name", value_name = "NAME|ADDR")]
    pub names: Vec<String>,
    /// Replace existing certificates
    #[arg(long)]
    pub force: bool,
}
