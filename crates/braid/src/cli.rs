//! Raw command-line flags, as clap reads them. Checking and combining them
//! happens in each subcommand's module.

use std::path::PathBuf;

use braid_target::portal::ListenSpec;
use braid_target::source::ExportSpec;
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

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Export volumes over NBD on one or more portals (runs in the foreground)
    #[command(after_long_help = SERVE_EXAMPLES)]
    Serve(ServeArgs),
}

const SERVE_EXAMPLES: &str = "\
Examples:
  braid serve vol=/srv/disk.img
      one file on 127.0.0.1:10809 (loopback only)
  braid serve --listen all vol=/dev/sdb
      a block device on every non-loopback address of this host
  braid serve --listen eth1 --listen eth2 vol=/srv/disk.img
      on two interfaces' addresses, each portal bound to its NIC
  braid serve --create 10GiB vol=/srv/new.img
      creates the (sparse) file if it does not exist
  braid serve demo=mem:1GiB
      a memory volume for trying things out

Clients: nbdinfo --list nbd://HOST, nbdcopy, qemu-img, nbd-client, or
braid attach/copy/bench for all paths at once.";

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Portal to serve on: ADDR[:PORT], IFACE[:PORT] (that interface's
    /// addresses, bound to the device), or all[:PORT] (every non-loopback
    /// address). Repeat for several. Default 127.0.0.1:10809
    #[arg(short, long = "listen", value_name = "ADDR|IFACE|all")]
    pub listen: Vec<ListenSpec>,

    /// Refuse every write to every export
    #[arg(long)]
    pub read_only: bool,

    /// Create missing file sources as sparse files of this size (e.g. 10GiB)
    #[arg(long, value_name = "SIZE")]
    pub create: Option<String>,

    /// Set an export's volume identity (x-braid:volume) instead of the
    /// remembered or generated one; repeatable
    #[arg(long = "volume-id", value_name = "NAME=UUID")]
    pub volume_ids: Vec<String>,

    /// Where volume identities are kept [default: /var/lib/braid as root,
    /// else ~/.local/state/braid]
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Exports: NAME=SOURCE, where SOURCE is a file, a block device or
    /// mem:SIZE (e.g. vol=/srv/disk.img, demo=mem:1GiB)
    #[arg(required = true, value_name = "NAME=SOURCE")]
    pub exports: Vec<ExportSpec>,
}
