//! The flags of every command that opens a multipath volume, and the path
//! policies they name.

use std::path::PathBuf;

use clap::Args;

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
    /// give a restarted target again (one that may have lost them). At 32
    /// MiB (or half of it, if less) braid sends a FLUSH of its own (for
    /// clients that never flush, as VMware does); the rest is room for
    /// writes while that FLUSH is out, and writes that would fill it wait.
    /// A restart when more was acknowledged than this holds (one write
    /// larger than it, or braid's FLUSH failing) cannot be made whole:
    /// every FLUSH and FUA write then fails with EIO until `braid
    /// clear-loss`. Larger costs memory (counted by the buffers held, up to
    /// twice the data); smaller, writes wait sooner behind a slow FLUSH
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
