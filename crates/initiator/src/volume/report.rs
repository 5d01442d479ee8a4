//! What a volume reports of itself: each path's figures, the replay
//! window and any loss, as `braid status`, the console and the metrics
//! read them.

use std::time::Duration;

use crate::engine::PathReport;

/// One path's figures with its name.
#[derive(Clone, Debug)]
pub struct PathFigures {
    /// 1-based, as users count paths.
    pub index: usize,
    pub local: String,
    pub portal: String,
    pub figures: PathReport,
}

/// The replay window's state and the loss state (see the engine's
/// `restart.rs`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// The target says which process answers (`x-braid:instance`, braid's
    /// VPD page) or tells new sessions of a power on, so a restart is seen
    /// and replayed; a plain NBD server does neither.
    pub available: bool,
    /// Bytes acknowledged since the last FLUSH and kept for replay.
    pub window_bytes: u64,
    /// Memory they hold (the buffers they keep alive), and its bound.
    pub window_pinned: u64,
    pub window_limit: u64,
    /// Acknowledged writes were let go to stay within the bound and no
    /// FLUSH has covered them yet.
    pub overflowed: bool,
    /// Restarts of the target seen, each replayed.
    pub replays: u64,
    /// A replay is under way: new requests wait for it.
    pub replaying: bool,
    /// The last replay's bytes and how long it took.
    pub last_replay: Option<(u64, Duration)>,
    /// Acknowledged writes may be gone: every FLUSH and FUA write fails.
    pub lost: Option<Loss>,
    /// FLUSHes and FUA writes failed because of a loss.
    pub lost_flushes: u64,
}

/// A loss of acknowledged writes: when it was found, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loss {
    pub since: std::time::SystemTime,
    pub cause: String,
}

/// A snapshot of the volume's figures.
#[derive(Clone, Debug)]
pub struct VolumeReport {
    pub policy: String,
    pub paths: Vec<PathFigures>,
    pub counters: crate::engine::VolumeCounters,
    pub replay: ReplayReport,
    /// Time since the volume was opened.
    pub uptime: Duration,
}
