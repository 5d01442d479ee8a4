//! `braid doctor`'s flags.

use std::path::PathBuf;

use braid_store::portal::ListenSpec;
use clap::Args;

use super::MultipathArgs;

pub(super) const DOCTOR_EXAMPLES: &str = "\
Examples:
  braid doctor nbd://10.0.1.5/vol --local eth1 --local eth2
      on the client: every path's route, links, MTU, buffers, and a short read
  braid doctor --config /etc/braid/attach.toml
      the same for every volume of an attach configuration
  braid doctor --serve
      on the storage host: the running braid serve's exports, disks, md
      arrays and NICs (or give NAME=SOURCE exports, --listen, --config)
  braid doctor --serve --root /tmp/captured
      a captured /sys and /proc instead of this host's
  braid doctor nbd://10.0.1.5/vol --apply
      run the fixes of what it finds, after asking (--yes: without asking)

Every finding names its check, its severity (ok, warn, fail), what it is
about (a path, an interface, a device, an export), the values read and
where, why it matters, and the command that fixes it. Nothing is changed
without --apply. Exit status: 0 when every finding is ok, 1 when any is
warn or fail (or a fix failed), 2 for a usage error.";

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// The volume whose paths to check: nbd://HOST[:PORT]/EXPORT. With
    /// --serve: exports as braid serve takes them, NAME=SOURCE
    #[arg(value_name = "URI|NAME=SOURCE")]
    pub targets: Vec<String>,
    /// Check this host as a storage host: each export's file system and
    /// disks, md arrays, block queues, the NICs of its portals
    #[arg(long)]
    pub serve: bool,
    /// A braid configuration: an attach file (its volumes) or a serve file
    /// (its exports and portals)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// With --serve: the portals braid serves on, as braid serve's --listen
    #[arg(short, long = "listen", value_name = "ADDR|IFACE|all")]
    pub listen: Vec<ListenSpec>,
    /// Print {"findings": [{check, severity, subject, evidence, why, fix}]}
    #[arg(long, conflicts_with = "html")]
    pub json: bool,
    /// Print the findings as a web page that stands alone (for a support
    /// ticket): braid doctor --html > doctor.html
    #[arg(long)]
    pub html: bool,
    /// Read /sys and /proc under DIR instead of this host's (a captured
    /// tree); nothing is probed
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Run the fixes of the findings (after asking on the terminal)
    #[arg(long)]
    pub apply: bool,
    /// With --apply, run the fixes without asking
    #[arg(long, requires = "apply")]
    pub yes: bool,
    /// Skip the live probe (a short read over each path, a few seconds)
    #[arg(long)]
    pub no_probe: bool,
    #[command(flatten)]
    pub multipath: MultipathArgs,
}
