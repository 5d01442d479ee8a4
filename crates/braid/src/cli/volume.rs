//! The flags of the commands that use a volume: attach, copy, bench and
//! demo.

use std::path::PathBuf;

use clap::Args;

use super::MultipathArgs;

pub(super) const ATTACH_EXAMPLES: &str = "\
Examples:
  braid attach nbd://10.0.1.5/vol
      every path to the volume; NBD on /run/braid/vol.sock
  braid attach nbd://10.0.1.5/vol --local eth1 --local eth2 --http 127.0.0.1:9810
      the live console at http://127.0.0.1:9810/, metrics at /metrics
  braid attach --config /etc/braid/attach.toml

Then, for a block device:   nbd-client -unix /run/braid/vol.sock /dev/nbd0 -N vol
or without the nbd module:  nbdfuse /mnt/vol 'nbd+unix:///vol?socket=/run/braid/vol.sock'
and watch it:               braid status --watch";

#[derive(Args, Debug)]
pub struct AttachArgs {
    /// The volume: nbd://HOST[:PORT]/EXPORT or
    /// iscsi://[USER@]HOST[:PORT]/IQN/LUN (optional with --config)
    pub uri: Option<String>,
    /// Local export name [default: the remote export's name]
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Unix socket to serve the volume on [default: /run/braid/NAME.sock]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Also serve on this loopback TCP address
    #[arg(long, value_name = "ADDR:PORT")]
    pub tcp: Option<String>,
    /// Volumes and settings from a TOML file (see contrib/attach.toml)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Serve the live console at http://ADDR:PORT/ and Prometheus metrics
    /// at /metrics (one listener; --metrics is the older name). Give a
    /// loopback address unless --http-token guards it
    #[arg(long = "http", visible_alias = "metrics", value_name = "ADDR:PORT")]
    pub http: Option<String>,
    /// A file holding the console's token: actions (policy, drain, enable)
    /// are allowed only with it, sent in the X-Braid-Token header; on a
    /// non-loopback --http address it guards every page too (open
    /// /?token=TOKEN)
    #[arg(long, value_name = "FILE")]
    pub http_token: Option<PathBuf>,
    /// Control socket for braid status/policy/path [default: in /run/braid/ctl]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Threads that carry requests between the local socket and the
    /// paths [default: 1 on a host of one or two cores, else one per
    /// core]. With 1, a reply goes from a path's reader to the local
    /// socket without waking another thread, which on two cores (the
    /// client on the other) measured faster and cheaper for everything:
    /// 4 KiB random writes +19% at 24% less CPU, 1 MiB writes +16%, reads
    /// the same at 15% less CPU. More threads let a fast link's copies
    /// use more cores
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    #[command(flatten)]
    pub multipath: MultipathArgs,
}

/// The workload kinds, as fio names them.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Sequential reads
    Read,
    /// Sequential writes
    Write,
    /// Random reads
    #[value(name = "randread")]
    RandRead,
    /// Random writes
    #[value(name = "randwrite")]
    RandWrite,
    /// Random reads and writes (--rwmixread of reads)
    #[value(name = "randrw")]
    RandRw,
}

impl Workload {
    pub fn random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite | Self::RandRw)
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::RandRead => "randread",
            Self::RandWrite => "randwrite",
            Self::RandRw => "randrw",
        }
    }
}

pub(super) const COPY_EXAMPLES: &str = "\
Examples:
  braid copy disk.img nbd://10.0.1.5/vol
      upload over every portal the target advertises
  braid copy nbd://10.0.1.5/vol backup.img --verify
      download, then read both back and compare sha256
  braid copy disk.img nbd://10.0.1.5/vol --local eth1 --local eth2
      one path per NIC, each bound to its interface
  braid copy disk.img nbd://host/vol --portal 10.0.1.5 --portal 10.0.2.5
      a plain NBD server (nbdkit, qemu-nbd): name its portals

Zero regions of the source become WRITE_ZEROES (or holes) on the
destination instead of data.";

pub(super) const BENCH_EXAMPLES: &str = "\
Examples:
  braid bench nbd://10.0.1.5/vol --rw read --bs 1M --iodepth 1 --time 10
  braid bench nbd://10.0.1.5/vol --rw randrw --bs 4K --iodepth 32 --verify
  braid bench nbd://10.0.1.5/vol --policy round-robin --json

Writes destroy the data in the span they use (--size, from offset 0).";

#[derive(Args, Debug)]
pub struct CopyArgs {
    /// Source: a file, a block device, nbd://HOST[:PORT]/EXPORT,
    /// nbd+unix:///EXPORT?socket=PATH, or iscsi://[USER@]HOST[:PORT]/IQN/LUN
    pub src: String,
    /// Destination, same forms; a missing file is created
    pub dst: String,
    /// Read both sides back afterwards and compare sha256
    #[arg(long)]
    pub verify: bool,
    /// Requests in flight, of --bs each
    // 32 x 1 MiB keeps four connections to one server as busy as nbdcopy
    // keeps them; 16 left them idle between replies.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub requests: usize,
    /// Size of each request
    #[arg(long, value_name = "SIZE", default_value = "1M")]
    pub bs: String,
    /// No progress bar (it is shown only on a terminal anyway)
    #[arg(long)]
    pub no_progress: bool,
    #[command(flatten)]
    pub multipath: MultipathArgs,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The volume: nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH
    /// or iscsi://[USER@]HOST[:PORT]/IQN/LUN
    pub uri: String,
    /// Workload, as fio names it
    #[arg(long, value_enum, default_value = "read")]
    pub rw: Workload,
    /// Request size
    #[arg(long, value_name = "SIZE", default_value = "1M")]
    pub bs: String,
    /// Requests in flight
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub iodepth: usize,
    /// How long to run, in seconds
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub time: f64,
    /// Span of the volume to use, from offset 0 [default: all of it]
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,
    /// Percentage of reads in randrw
    #[arg(long, value_name = "PERCENT", default_value_t = 50)]
    pub rwmixread: u8,
    /// Check every read against the pattern written (reads of a span not
    /// written in this run are preceded by writing it)
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub multipath: MultipathArgs,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Size of the demo volume
    #[arg(long, value_name = "SIZE", default_value = "512M")]
    pub size: String,
    /// Seconds for each benchmark step
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0)]
    pub time: f64,
}
