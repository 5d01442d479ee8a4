//! `braid serve`'s flags.

use std::path::PathBuf;

use braid_store::portal::ListenSpec;
use braid_store::source::ExportSpec;
use clap::Args;

pub(super) const SERVE_EXAMPLES: &str = "\
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
    /// ALUA port group, all active/optimized. Give the port with `=`
    /// (--iscsi=3261): a word after a bare --iscsi is an export
    // require_equals: an optional value that may stand apart takes the
    // export after it (`--iscsi vol=/srv/v.img`) as its port.
    // `--iscsi 3261`, which cannot be an export, still means the port:
    // see `Cli::parse_args`.
    #[arg(
        long,
        value_name = "PORT",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "3260"
    )]
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

    /// Who may log in over iSCSI, from FILE (TOML): [[initiator]] tables,
    /// each an InitiatorName with its own CHAP user and secret (optional
    /// target_user and target_secret for mutual CHAP) and the exports it
    /// may see; [discovery] with discovery's own user and secret;
    /// [unlisted] for initiators not listed, who are refused without it.
    /// A file holding secrets must be mode 0600. Not with --iscsi-chap
    /// (one credential for every initiator)
    #[arg(
        long,
        value_name = "FILE",
        requires = "iscsi",
        conflicts_with = "iscsi_chap"
    )]
    pub iscsi_acl: Option<PathBuf>,

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

    /// Close a connection, NBD's or iSCSI's, whose client has taken none
    /// of its replies for this many seconds (0: never), freeing what they
    /// held for other clients [default: 60]
    #[arg(long, value_name = "SECONDS")]
    pub send_timeout: Option<f64>,

    /// When NBD READs of 64 KiB or more go from the file to the socket
    /// with sendfile, not copied: `remote`, to clients on other hosts
    /// (over loopback the copy costs less: 2.7 GB/s against 2.0 at 1 MiB
    /// reads on a 2-CPU machine); `always`; `never`. TLS connections are
    /// always copied [default: remote]
    #[arg(long, value_enum, value_name = "WHEN")]
    pub sendfile: Option<SendfileArg>,

    /// Drop an iSCSI connection whose WRITE has waited this many seconds
    /// for the data its R2T asked for [default: 5]
    #[arg(long, value_name = "SECONDS")]
    pub iscsi_dataout_timeout: Option<f64>,

    /// Ping (NOP-In) an iSCSI initiator silent this many seconds (0:
    /// never) [default: 15]
    #[arg(long, value_name = "SECONDS")]
    pub iscsi_nopin_interval: Option<f64>,

    /// End an iSCSI session whose ping went unanswered this many seconds,
    /// and what it held (RESERVE(6), its tasks) [default: 15]
    #[arg(long, value_name = "SECONDS")]
    pub iscsi_nopin_timeout: Option<f64>,

    /// Ceph configuration for rbd: exports [default: Ceph's usual places:
    /// $CEPH_CONF, /etc/ceph/ceph.conf, ~/.ceph/config]
    #[arg(long, value_name = "FILE")]
    pub ceph_conf: Option<PathBuf>,

    /// Ceph user for rbd: exports, without `client.` (its keyring from the
    /// configuration's `keyring` or Ceph's usual places) [default: admin]
    #[arg(long, value_name = "NAME")]
    pub ceph_id: Option<String>,

    /// Give each of the gateway's RADOS clients (one per image, one more
    /// for the process) an admin socket in this directory, named
    /// `ceph-client.ID.PID.N.asok`, for `ceph --admin-daemon SOCKET` (`perf
    /// dump`, `objecter_requests`, `config show`, `config set`); whoever
    /// may open them may change those clients' settings, so keep DIR
    /// private. Without it none is opened, whatever the configuration
    /// says: the clients of one process would share one path
    #[arg(long, value_name = "DIR")]
    pub ceph_admin_socket: Option<PathBuf>,

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
    /// mem:SIZE or rbd:POOL/[NAMESPACE/]IMAGE[@SNAPSHOT] (e.g.
    /// vol=/srv/disk.img, demo=mem:1GiB, vol=rbd:rbd/vol,
    /// vol=rbd:rbd/tenant1/vol)
    #[arg(required_unless_present = "config", value_name = "NAME=SOURCE")]
    pub exports: Vec<ExportSpec>,
}

/// `braid serve --iscsi 3261` was the way to give the port before it had
/// to follow `=`, and scripts have it: a word of digits after `--iscsi`
/// cannot be an export (NAME=SOURCE), so it is still taken as the port.
pub(super) fn iscsi_port_apart(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = args.into_iter().collect();
    // The subcommand is the first word that is not a flag (the global
    // flags, -v and -q, take no value).
    let Some(sub) = args
        .iter()
        .skip(1)
        .position(|a| !a.to_string_lossy().starts_with('-'))
    else {
        return args;
    };
    if args[sub + 1] != "serve" {
        return args;
    }
    let mut i = sub + 2;
    while i + 1 < args.len() && args[i] != "--" {
        let digits = args[i + 1]
            .to_str()
            .is_some_and(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()));
        if args[i] == "--iscsi" && digits {
            let mut joined = std::ffi::OsString::from("--iscsi=");
            joined.push(args.remove(i + 1));
            args[i] = joined;
        }
        i += 1;
    }
    args
}

/// `--sendfile`: see [`braid_nbd_target::Sendfile`].
#[derive(clap::ValueEnum, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SendfileArg {
    Remote,
    Always,
    Never,
}

impl From<SendfileArg> for braid_nbd_target::Sendfile {
    fn from(a: SendfileArg) -> Self {
        match a {
            SendfileArg::Remote => Self::Remote,
            SendfileArg::Always => Self::Always,
            SendfileArg::Never => Self::Never,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::iscsi_port_apart;
    use crate::cli::{Cli, Command, ServeArgs};

    fn serve(args: &[&str]) -> Result<ServeArgs, clap::Error> {
        let argv = ["braid", "serve"].iter().chain(args).copied();
        match Cli::try_parse_args(argv)?.command {
            Command::Serve(args) => Ok(*args),
            other => panic!("parsed as {other:?}"),
        }
    }

    /// `--iscsi` before an export, the order people write first, leaves the
    /// export an export.
    #[test]
    fn iscsi_takes_no_export_as_its_port() {
        let args = serve(&["--listen", "127.0.0.1", "--iscsi", "vol=/srv/v.img"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(args.iscsi, Some(3260));
        assert_eq!(args.exports.len(), 1);
    }

    /// The spellings of the port that were never ambiguous still work.
    #[test]
    fn iscsi_port_spellings() {
        for (words, port) in [
            (&["--iscsi=3261", "vol=mem:1MiB"][..], Some(3261)),
            (&["--iscsi", "3261", "vol=mem:1MiB"][..], Some(3261)),
            (&["vol=mem:1MiB", "--iscsi", "3261"][..], Some(3261)),
            (&["-v", "vol=mem:1MiB", "--iscsi"][..], Some(3260)),
            (
                &["--iscsi", "--listen", "127.0.0.1", "vol=mem:1MiB"][..],
                Some(3260),
            ),
            (&["vol=mem:1MiB"][..], None),
        ] {
            let args = serve(words).unwrap_or_else(|e| panic!("{words:?}: {e}"));
            assert_eq!(args.iscsi, port, "{words:?}");
            assert_eq!(args.exports.len(), 1, "{words:?}");
        }
        // Only serve's --iscsi is rewritten, and not past `--`.
        let argv = ["braid", "-v", "serve", "--", "--iscsi", "3261"].map(std::ffi::OsString::from);
        assert_eq!(iscsi_port_apart(argv.clone()), argv.to_vec());
    }

    /// The help shows the port joined by `=`.
    #[test]
    fn iscsi_help_teaches_equals() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("serve")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(help.contains("--iscsi[=<PORT>]"), "{help}");
    }
}
