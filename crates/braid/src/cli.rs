//! Raw command-line flags, as clap reads them. Checking and combining them
//! happens in each subcommand's module.

use std::path::PathBuf;

use braid_store::portal::ListenSpec;
use braid_store::source::ExportSpec;
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

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Export volumes over NBD on one or more portals (runs in the foreground)
    #[command(after_long_help = SERVE_EXAMPLES)]
    Serve(ServeArgs),
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

const ATTACH_EXAMPLES: &str = "\
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
    #[command(flatten)]
    pub multipath: MultipathArgs,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Refresh in place every --interval seconds
    #[arg(long)]
    pub watch: bool,
    /// Seconds between refreshes with --watch
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    pub interval: f64,
    /// Stop after this many refreshes
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Print JSON for scripts
    #[arg(long)]
    pub json: bool,
    /// Ask only this control socket
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

/// A path policy, by the name users know (DESIGN.md, "Path selection").
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyName {
    /// Each chunk where it is predicted to finish first, from measured
    /// throughput and latency (the default)
    Adaptive,
    /// The usable path with the lowest priority; others stand by
    Failover,
    /// Paths in turn, repeat-count requests each
    RoundRobin,
    /// Round-robin over the non-standby paths; standbys only when all
    /// active ones fail
    RoundRobinSubset,
    /// Fewest requests in flight
    LeastQueueDepth,
    /// Fewest bytes in flight
    LeastBlocks,
    /// The usable path with the lowest weight (MPIO's weighted paths)
    Weighted,
    /// Least (bytes in flight + request) / relative throughput
    ServiceTime,
    /// Shortest predicted completion from measured service times
    HistoricalServiceTime,
}

impl PolicyName {
    /// The name the policy crate and the control socket use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Adaptive => "adaptive",
            Self::Failover => "failover",
            Self::RoundRobin => "round-robin",
            Self::RoundRobinSubset => "round-robin-subset",
            Self::LeastQueueDepth => "least-queue-depth",
            Self::LeastBlocks => "least-blocks",
            Self::Weighted => "weighted",
            Self::ServiceTime => "service-time",
            Self::HistoricalServiceTime => "historical-service-time",
        }
    }
}

impl std::fmt::Display for PolicyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
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

const CLEAR_LOSS_HELP: &str = "\
A volume is lost when its target restarted and braid could not give it back
every write it had acknowledged since the last FLUSH: more had been written
than --replay-window holds, or the replay failed. From then on every FLUSH
and FUA write of the volume fails with EIO, on every client, so that no file
system or database is told its data is safe when some of it may be gone.
`braid status` shows when the loss began and why.

Clear it only once what may have been lost is dealt with: the file system
checked (fsck) or the database recovered, or the data restored. Clearing
makes FLUSH succeed again; it gives nothing back. Detaching the volume
clears it too.

Example:
  braid clear-loss vol";

#[derive(Args, Debug)]
pub struct ClearLossArgs {
    /// The attached volume's name
    pub volume: String,
    /// The attach's control socket [default: found in /run/braid/ctl]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct PolicyArgs {
    /// The attached volume's name
    pub volume: String,
    /// The policy to switch to
    #[arg(value_enum)]
    pub policy: PolicyName,
    /// The attach's control socket [default: found in /run/braid/ctl]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

const ALUA_EXAMPLES: &str = "\
Each iSCSI portal of braid serve is its own target port group. Initiators
that follow ALUA (Linux multipath with prio alua, Windows MPIO, VMware's
VMW_SATP_ALUA) move I/O off a portal in standby or unavailable and back
when it is active again; every session is told with a unit attention.

Examples:
  braid alua 10.0.1.5:3260 standby            drain the portal
  braid alua 10.0.1.5:3260 active-optimized   and take it back
  braid status                                shows each portal's state";

/// An ALUA asymmetric access state (SPC-5 5.16.2.4).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AluaState {
    /// Full speed: the initiator's preferred paths
    ActiveOptimized,
    /// Works, but initiators use it only when no optimized path is left
    ActiveNonOptimized,
    /// Answers only inquiries (NOT READY to I/O): drained
    Standby,
    /// Answers only inquiries, and is not expected back soon
    Unavailable,
    /// Changing state: initiators retry I/O elsewhere or later
    Transitioning,
}

impl AluaState {
    /// The name the control socket uses.
    pub fn as_str(self) -> &'static str {
        match self {
            AluaState::ActiveOptimized => "active-optimized",
            AluaState::ActiveNonOptimized => "active-non-optimized",
            AluaState::Standby => "standby",
            AluaState::Unavailable => "unavailable",
            AluaState::Transitioning => "transitioning",
        }
    }
}

#[derive(Args, Debug)]
pub struct AluaArgs {
    /// The iSCSI portal, ADDR:PORT as `braid status` shows it
    pub portal: String,
    /// Its new access state
    #[arg(value_enum)]
    pub state: AluaState,
    /// The serve's control socket [default: the serve that has the portal]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct PathArgs {
    /// The attached volume's name
    pub volume: String,
    /// The path number, as `braid status` shows it
    pub path: usize,
    /// enable, disable, or knobs to set: priority=N, weight=N, standby=yes|no,
    /// relative-throughput=N, repeat-count=N, queue-depth=N (0: no limit)
    #[arg(required = true, num_args = 1..)]
    pub action: Vec<String>,
    /// The attach's control socket [default: found in /run/braid/ctl]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

const COPY_EXAMPLES: &str = "\
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

const BENCH_EXAMPLES: &str = "\
Examples:
  braid bench nbd://10.0.1.5/vol --rw read --bs 1M --iodepth 1 --time 10
  braid bench nbd://10.0.1.5/vol --rw randrw --bs 4K --iodepth 32 --verify
  braid bench nbd://10.0.1.5/vol --policy round-robin --json

Writes destroy the data in the span they use (--size, from offset 0).";

/// Flags shared by every command that opens a multipath volume.
#[derive(Args, Debug, Clone)]
pub struct MultipathArgs {
    /// Portal of the target to use as a path, ADDR[:PORT] (repeatable).
    /// Default: every portal a braid target advertises, or the URI's host
    #[arg(long = "portal", value_name = "ADDR[:PORT]")]
    pub portals: Vec<String>,

    /// Local address or interface to send from, one path each, paired with
    /// the portals (repeatable). Interfaces are bound with SO_BINDTODEVICE
    #[arg(long = "local", value_name = "ADDR|IFACE")]
    pub locals: Vec<braid_initiator::LocalSpec>,

    /// A path with its knobs: PORTAL[@LOCAL][,key=value...], e.g.
    /// 10.0.1.5@eth1,weight=3,priority=1 or @eth2,standby (repeatable).
    /// Keys: priority (failover order, lower first), weight (weighted,
    /// lower first), standby (round-robin-subset), relative-throughput
    /// (service-time), repeat-count (round-robin), queue-depth (every
    /// policy: the most requests in flight on the path; a full path is
    /// skipped as a busy one). Its portal joins those in use (advertised,
    /// or --portal), its local side joins --local
    #[arg(long = "path", value_name = "PORTAL@LOCAL,KEY=VALUE")]
    pub paths: Vec<braid_initiator::PathRule>,

    /// Path policy [default: adaptive]
    #[arg(long, value_enum, value_name = "NAME")]
    pub policy: Option<PolicyName>,

    /// NBD connections per path
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub connections_per_path: usize,

    /// Memory for the writes acknowledged since the last FLUSH, kept to
    /// give a restarted target again (one that may have lost them). A
    /// restart when more than this was acknowledged cannot be made whole:
    /// every FLUSH and FUA write then fails with EIO until `braid
    /// clear-loss`. Larger costs memory (counted by the buffers held, up to
    /// twice the data); smaller loses sooner on a long run without FLUSH
    #[arg(long, value_name = "SIZE", default_value = "256MiB")]
    pub replay_window: String,

    /// CA certificate (PEM) that signed the target's certificate; turns
    /// TLS on (nbds:// URIs need it)
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// Client certificate (PEM), for targets that check clients
    #[arg(long, value_name = "FILE", requires = "tls_ca")]
    pub tls_cert: Option<PathBuf>,

    /// Key of the client certificate (PEM)
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// How long I/O waits when no path works: seconds, 0 to fail at once,
    /// or `queue` to wait forever
    #[arg(long, value_name = "SECONDS|queue", default_value = "60")]
    pub no_path_timeout: String,

    /// Shortest no-reply time after which a busy path is declared failed
    #[arg(long, value_name = "SECONDS", default_value_t = 0.5)]
    pub timeout_floor: f64,

    /// Longest no-reply time a busy path is allowed
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub timeout_ceiling: f64,

    /// How long a busy path whose connection still answers (the target's
    /// host acknowledges bytes) waits for a reply at least before it is
    /// failed: slow is not dead. Patience is four times the slowest reply
    /// the path has given, within --slow-reply-min and --slow-reply-max
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    pub slow_reply_min: f64,

    /// The most a slow but live path is waited for. A FLUSH over a large
    /// dirty page cache on a slow disk can take minutes: raise it for such
    /// targets; lower it to fail over sooner from a target that hangs
    #[arg(long, value_name = "SECONDS", default_value_t = 120.0)]
    pub slow_reply_max: f64,

    /// iSCSI: CHAP credentials from FILE instead of the URI (TOML: user,
    /// secret, and for mutual CHAP target_user and target_secret; the
    /// format of braid serve --iscsi-chap; keep the file 0600)
    #[arg(long, value_name = "FILE")]
    pub chap_secret_file: Option<PathBuf>,

    /// iSCSI: the initiator name to log in as [default: the host's
    /// open-iscsi name, or iqn.2026-11.org.braid-storage:HOSTNAME]
    #[arg(long, value_name = "IQN")]
    pub initiator_name: Option<String>,

    /// iSCSI: fence a failed path by persistent reservation (PREEMPT AND
    /// ABORT of its key) instead of the fence braid knows for the target
    /// (session reinstatement for braid's own, and then LOGICAL UNIT RESET
    /// for tgt; any other target has a failed path's writes held until
    /// the no-path timeout fails them). Every path registers a key and
    /// the unit is reserved "write exclusive, all registrants", so other
    /// initiators cannot write while braid has it open; for LIO and other
    /// targets, and for targets that scope sessions to a portal group.
    /// Needs PREEMPT AND ABORT (tgt lacks it and is refused)
    #[arg(long)]
    pub persistent_reservations: bool,
}

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
  braid serve --listen all --ceph-conf /etc/ceph/ceph.conf vol=rbd:rbd/vol
      a gateway of a Ceph RBD image; start one on each gateway host, all
      active: clients find every gateway from any one

Clients: nbdinfo --list nbd://HOST, nbdcopy, qemu-img, nbd-client, or
braid attach/copy/bench for all paths at once.";

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Portal to serve on: ADDR[:PORT], IFACE[:PORT] (that interface's
    /// addresses, bound to the device), or all[:PORT] (every address a
    /// client on another host could reach: not loopback, link-local,
    /// container or hypervisor bridges (docker0, br-*, virbr*, cni*) and
    /// their ports, or tunnels; what is left out is logged at start).
    /// Repeat for several. Default 127.0.0.1:10809
    #[arg(short, long = "listen", value_name = "ADDR|IFACE|all")]
    pub listen: Vec<ListenSpec>,

    /// Refuse every write to every export
    #[arg(long)]
    pub read_only: bool,

    /// Refuse writes to this export only (repeatable)
    #[arg(long = "read-only-export", value_name = "NAME")]
    pub read_only_exports: Vec<String>,

    /// Serve writable images on a network file system (NFS, SMB, CephFS,
    /// GlusterFS, ...) even though braid's lock on an image holds on this
    /// host only: a braid serve, qemu or mount on another host would not
    /// see it and could write the same image. Only when this host alone
    /// uses the image
    #[arg(long)]
    pub allow_network_fs: bool,

    /// Create missing file sources as sparse files of this size (e.g. 10GiB)
    #[arg(long, value_name = "SIZE")]
    pub create: Option<String>,

    /// Set an export's volume identity (x-braid:volume) instead of the
    /// remembered or generated one: to keep a restored backup or a
    /// migrated image the same volume to its initiators (served nowhere
    /// else). Never give two servers one identity; repeatable
    #[arg(long = "volume-id", value_name = "NAME=UUID")]
    pub volume_ids: Vec<String>,

    /// Where volume identities are kept [default: /var/lib/braid as root,
    /// else ~/.local/state/braid]
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Portals and exports from a TOML file (see contrib/serve.toml)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Control socket for braid status [default: in /run/braid/ctl]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,

    /// Serve the live console (portals, exports, clients) at
    /// http://ADDR:PORT/ and Prometheus metrics (per export and portal) at
    /// /metrics; HTTPS with --tls-cert (--metrics is the older name)
    #[arg(long = "http", visible_alias = "metrics", value_name = "ADDR:PORT")]
    pub http: Option<String>,
    /// A file holding the console's token: actions (setting a portal's
    /// ALUA state) are allowed only with it, sent in the X-Braid-Token
    /// header; on a non-loopback --http address it guards every page too
    #[arg(long, value_name = "FILE")]
    pub http_token: Option<PathBuf>,

    /// Also serve every export over iSCSI, as LUN 0 of target
    /// iqn.2026-11.org.braid-storage:NAME (see --iscsi-iqn), on every
    /// portal's address at PORT [default: 3260]; each portal is its own
    /// ALUA port group, all active/optimized
    #[arg(long, value_name = "PORT", num_args = 0..=1, default_missing_value = "3260")]
    pub iscsi: Option<u16>,

    /// Name iSCSI targets PREFIX:NAME instead, e.g.
    /// iqn.2024-05.com.example.nas (your domain, reversed, after the month
    /// you held it). Initiators remember target names: change it before
    /// they log in, not after
    #[arg(long, value_name = "PREFIX", requires = "iscsi")]
    pub iscsi_iqn: Option<String>,

    /// Turn the iSCSI write cache of this export on (repeatable): WRITEs
    /// are then answered from the page cache and made durable by
    /// SYNCHRONIZE CACHE, which Linux (open-iscsi) and Windows send.
    /// VMware ESXi never sends it: leave its datastores write-through, the
    /// default (WCE 0: every WRITE on stable storage before GOOD). An
    /// initiator may change it with MODE SELECT, which --state-dir keeps
    #[arg(long = "iscsi-write-cache", value_name = "NAME", requires = "iscsi")]
    pub iscsi_write_cache: Vec<String>,

    /// Require CHAP of every iSCSI login, with the credentials in FILE
    /// (TOML: user, secret, and for mutual CHAP target_user and
    /// target_secret; secrets of 12 to 255 bytes; keep the file 0600)
    #[arg(long, value_name = "FILE", requires = "iscsi")]
    pub iscsi_chap: Option<PathBuf>,

    /// Server certificate (PEM); with --tls-key, TLS is required of every
    /// TCP client (nothing is listed or served before STARTTLS)
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// Key of the server certificate (PEM)
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Only clients with a certificate signed by this CA (PEM) get in
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Let only this client network use an export, e.g. vol=10.0.1.0/24
    /// (repeatable; an export without any is open to every client)
    #[arg(long = "allow", value_name = "NAME=CIDR")]
    pub allow: Vec<String>,

    /// Connections at once, in total (NBD's and iSCSI's each) [default:
    /// 1024]
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,

    /// Connections at once from one client address (NBD's and iSCSI's
    /// each) [default: 128]
    #[arg(long, value_name = "N")]
    pub max_connections_per_client: Option<usize>,

    /// Requests in flight per connection, NBD's or iSCSI's (more wait in
    /// the socket; an iSCSI command window is at most 64) [default: 256]
    #[arg(long, value_name = "N")]
    pub max_requests_per_connection: Option<usize>,

    /// Payload bytes in flight per connection (NBD's and iSCSI's)
    /// [default: 128M]
    #[arg(long, value_name = "SIZE")]
    pub max_inflight_per_connection: Option<String>,

    /// Payload bytes in flight on the whole server, across connections
    /// (NBD's and iSCSI's each) [default: 1G]
    #[arg(long, value_name = "SIZE")]
    pub max_inflight_total: Option<String>,

    /// Seconds a client has to finish the handshake, or an iSCSI login
    /// [default: 10]
    #[arg(long, value_name = "SECONDS")]
    pub handshake_timeout: Option<f64>,

    /// Close connections, NBD's and iSCSI's, idle this many seconds (0:
    /// never) [default: 0]
    #[arg(long, value_name = "SECONDS")]
    pub idle_timeout: Option<f64>,

    /// Ceph configuration for rbd: exports [default: Ceph's usual places:
    /// $CEPH_CONF, /etc/ceph/ceph.conf, ~/.ceph/config]
    #[arg(long, value_name = "FILE")]
    pub ceph_conf: Option<PathBuf>,

    /// Ceph user for rbd: exports, without `client.` (its keyring from the
    /// configuration's `keyring` or Ceph's usual places) [default: admin]
    #[arg(long, value_name = "NAME")]
    pub ceph_id: Option<String>,

    /// Keep librbd's write cache: writes are acknowledged from this
    /// gateway's memory and reach the cluster at FLUSH, so a crash loses
    /// them (clients replay what they did not flush) and no other gateway
    /// sees them: the gateway then serves its images alone. Off by
    /// default: an acknowledged write is in the cluster
    #[arg(long)]
    pub rbd_cache: bool,

    /// Seconds a gateway's record in an RBD image lives without renewal;
    /// a gateway silent this long is fenced by the others [default: 15]
    #[arg(long, value_name = "SECONDS")]
    pub gateway_lease: Option<f64>,

    /// Exports: NAME=SOURCE, where SOURCE is a file, a block device,
    /// mem:SIZE or rbd:POOL/IMAGE[@SNAPSHOT] (e.g. vol=/srv/disk.img,
    /// demo=mem:1GiB, vol=rbd:rbd/vol)
    #[arg(required_unless_present = "config", value_name = "NAME=SOURCE")]
    pub exports: Vec<ExportSpec>,
}

const DOCTOR_EXAMPLES: &str = "\
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

#[cfg(test)]
mod tests {
    use clap::ValueEnum;

    use super::PolicyName;

    /// The flag lists exactly the policies the engine knows, by the same
    /// names, default first.
    #[test]
    fn policy_values_are_the_policy_crates_names() {
        let listed: Vec<String> = PolicyName::value_variants()
            .iter()
            .map(|p| {
                let name = p.to_possible_value().unwrap().get_name().to_owned();
                assert_eq!(name, p.as_str());
                name
            })
            .collect();
        assert_eq!(listed, braid_policy::NAMES);
    }
}
