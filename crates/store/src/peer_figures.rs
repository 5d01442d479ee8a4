//! What a server of shared storage (a Ceph gateway) knows of the other
//! servers of an export and of the fences it made, for metrics and
//! `braid status`.

use crate::stats::Latencies;

/// Another live server of the export.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerInfo {
    /// Its address in the storage cluster (what a fence blocklists).
    pub addr: String,
    pub host: String,
    pub pid: u32,
    /// Where clients reach it.
    pub portals: Vec<String>,
}

/// Figures of one export on one server, at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerFigures {
    /// The other servers alive as this one sees them.
    pub peers: Vec<PeerInfo>,
    /// Whether this server is one of the export's live servers itself
    /// (its own record written and renewed).
    pub joined: bool,
    /// Fences of other servers' connections that clients asked of this one.
    pub fences_asked: u64,
    /// Of those, the ones confirmed.
    pub fences_given: u64,
    /// Other servers this one shut out of the storage (for a client's
    /// fence or a lease that ran out).
    pub blocklists: u64,
    /// How long making every live server take the newest cluster map took.
    pub barrier: Latencies,
    /// How long writing this server's lease record took.
    pub renewal: Latencies,
}

impl PeerFigures {
    /// The export's live servers, this one included once it joined.
    pub fn live(&self) -> usize {
        self.peers.len() + usize::from(self.joined)
    }
}
