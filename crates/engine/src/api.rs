//! What the engine's driver sees: the requests it submits, the actions it
//! carries out, and the figures it reports.

use std::time::Duration;

use braid_block::{ErrorKind, Flags};
use braid_policy::SplitRules;
use braid_proto::Cookie;
use bytes::Bytes;

use super::stats::Histogram;
use super::{PathCounters, PathState};

/// A path's index in the engine, in the order paths were added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathId(pub usize);

/// A request submitted to the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqId(pub u64);

pub use braid_block::Op;

/// A request as submitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submit {
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    pub flags: Flags,
    /// A WRITE's data (`len` bytes); nothing for other operations.
    pub payload: Option<Payload>,
}

impl Submit {
    /// A request without data.
    pub fn new(op: Op, offset: u64, len: u64, flags: Flags) -> Self {
        Self {
            op,
            offset,
            len,
            flags,
            payload: None,
        }
    }

    /// A WRITE of `payload`.
    pub fn write(offset: u64, flags: Flags, payload: Payload) -> Self {
        Self {
            op: Op::Write,
            offset,
            len: payload.data.len() as u64,
            flags,
            payload: Some(payload),
        }
    }
}

/// A WRITE's data, and how much memory keeping it keeps alive: the
/// buffer it is a slice of may be larger (a pooled buffer of the next
/// size class), and the replay window counts what it pins, not what it
/// would write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payload {
    pub data: Bytes,
    pub pinned: u64,
}

impl Payload {
    /// Data that pins no more than itself.
    pub fn new(data: Bytes) -> Self {
        let pinned = data.len() as u64;
        Self { data, pinned }
    }
}

/// What a path's new connections say of the target's life, so that a
/// target that restarted (and may have lost what it never made durable)
/// is told apart from the one the volume knew.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Instance {
    /// The target names its process (`x-braid:instance`, or braid's
    /// vendor VPD page over iSCSI): a new name is a restart.
    Known(u128),
    /// The target names nothing, but the new session was told of a
    /// power on or reset (a unit attention 29h on its first command).
    /// Every new session may be told so after one restart: the engine
    /// decides whether this is the restart it knows of (see `restart.rs`).
    ResetSeen,
    /// Nothing either way.
    #[default]
    Unknown,
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IoError {
    #[error("target: {kind}: {message}")]
    Target { kind: ErrorKind, message: String },
    #[error("no path to the volume for {0:?}")]
    NoPath(Duration),
    /// The target restarted and writes it had acknowledged may be gone:
    /// every FLUSH and FUA write fails until the loss is cleared.
    #[error("acknowledged writes may have been lost: {0}")]
    Lost(String),
}

impl IoError {
    /// The NBD error to hand a local client.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Target { kind, .. } => *kind,
            Self::NoPath(_) | Self::Lost(_) => ErrorKind::Io,
        }
    }
}

/// One chunk to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendChunk {
    pub path: PathId,
    /// Connection index within the path.
    pub conn: usize,
    pub cookie: Cookie,
    pub op: Op,
    pub flags: Flags,
    /// Absolute offset on the volume.
    pub offset: u64,
    pub len: u32,
    /// The request it belongs to; `None` for a health probe.
    pub req: Option<ReqId>,
    /// Where in that request the chunk starts.
    pub req_offset: u64,
    /// A WRITE's data for this chunk.
    pub payload: Option<Bytes>,
}

/// Something the user should be told, once, in a log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A path failed. `resent` says where its chunks went; `held` chunks
    /// (writes) wait for the fence; `queued` wait for any path.
    PathFailed {
        path: PathId,
        reason: String,
        resent: Vec<(PathId, usize)>,
        held: usize,
        queued: usize,
    },
    /// The held writes of one failure of a path were re-sent after its
    /// fence.
    Fenced {
        path: PathId,
        fence: FenceId,
        resent: Vec<(PathId, usize)>,
    },
    PathRestored {
        path: PathId,
    },
    /// Requests waited longer than the no-path timeout and failed.
    NoPathTimeout {
        failed: usize,
    },
    /// The target restarted (`how` says how the engine knows): what it
    /// acknowledged and never made durable is written again before
    /// anything new. `resent` pieces of writes still under way that the
    /// old target had acknowledged go again too.
    TargetRestarted {
        how: String,
        replay_bytes: u64,
        replay_extents: usize,
        resent: usize,
    },
    /// A replay ended: `took` from the restart seen to the last replayed
    /// write acknowledged; `failed` says why it could not land.
    Replayed {
        bytes: u64,
        extents: usize,
        took: Duration,
        failed: Option<String>,
    },
    /// A sign of a reset that the engine found to be the restart it had
    /// already handled (another path's new session told of it too).
    RestartAlreadyHandled {
        path: PathId,
    },
    /// Acknowledged writes may be gone: every FLUSH and FUA write fails
    /// from now on, until the loss is cleared.
    Lost {
        cause: String,
    },
    /// The FLUSH the engine sent on its own to keep the replay window from
    /// filling failed (`error`, the target's); another goes after `retry`.
    /// Meanwhile the window may fill and let writes go.
    WritebackFailed {
        error: String,
        retry: Duration,
    },
}

/// One fence: the connections of one failure of a path, and the writes
/// sent on them, which wait for it and for nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FenceId(pub u64);

/// What the driver must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Send(SendChunk),
    Complete {
        req: ReqId,
        result: Result<(), IoError>,
    },
    /// Close every connection of the path (replies on them no longer count).
    Close {
        path: PathId,
    },
    /// Ask the target, on a fresh connection, to fence these connection
    /// ids (one failure of `path`), then call
    /// [`Engine::fence_done`](super::Engine::fence_done) with `fence`. Keep
    /// trying while [`Engine::fence_pending`](super::Engine::fence_pending)
    /// says it is wanted: each failure has its own fence, and a later
    /// failure of the same path never ends an earlier one's.
    Fence {
        path: PathId,
        fence: FenceId,
        conns: Vec<braid_proto::braid_ns::ConnId>,
    },
    /// READ data that arrived for `cookie` is no longer wanted: the piece
    /// is read again (after a replay), so drop what was kept of it.
    Forget {
        req: ReqId,
        cookie: Cookie,
    },
    /// Try connecting the path again after this delay.
    Reconnect {
        path: PathId,
        after: Duration,
    },
    Event(Event),
}

/// Settings of an engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub split: SplitRules,
    /// Volume size, and its smallest block, for health probes.
    pub size: u64,
    pub min_block: u32,
    /// Bounds on the no-reply timeout derived from each path's figures.
    pub timeout_floor: Duration,
    pub timeout_ceiling: Duration,
    /// How long I/O waits with no usable path; `None` waits forever.
    pub no_path_timeout: Option<Duration>,
    /// An idle path is probed this often.
    pub probe_interval: Duration,
    /// How long a busy path whose connection still answers (the peer
    /// acknowledges bytes) may go without a reply: four times the slowest
    /// reply it has given, within these bounds. A busy disk's 2 s write or
    /// a long FLUSH is slow, not dead.
    pub slow_reply_min: Duration,
    pub slow_reply_max: Duration,
    /// Reconnect backoff: first delay, doubled per failure up to the cap.
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// Attempts made at most `reconnect_max` apart (a link pulled for a
    /// moment comes back within a fraction of a second; 60 attempts are
    /// half a minute when the kernel refuses at once, longer when dials
    /// time out); past them the
    /// delay doubles again, up to `reconnect_slow_max`, so a portal no
    /// client can reach (a NIC of another network, a dead host) costs a
    /// dial a minute, not two a second forever.
    pub reconnect_fast_attempts: u32,
    pub reconnect_slow_max: Duration,
    /// Memory the replay window may hold (see `window.rs`): writes
    /// acknowledged since the last FLUSH, kept to give a restarted target.
    pub replay_window: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            split: SplitRules {
                align: 4096,
                chunk: 256 * 1024,
                max: 32 << 20,
            },
            size: 0,
            min_block: 1,
            timeout_floor: Duration::from_millis(500),
            timeout_ceiling: Duration::from_secs(10),
            no_path_timeout: Some(Duration::from_secs(60)),
            probe_interval: Duration::from_secs(1),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_millis(500),
            reconnect_fast_attempts: 60,
            slow_reply_min: Duration::from_secs(30),
            slow_reply_max: Duration::from_secs(120),
            reconnect_slow_max: Duration::from_secs(60),
            replay_window: 256 << 20,
        }
    }
}

/// A chunk in flight, as a connection's reader sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkInfo {
    pub path: PathId,
    pub op: Op,
    pub len: u32,
    pub offset: u64,
    pub req: Option<ReqId>,
    pub req_offset: u64,
}

/// One path's figures at a moment.
#[derive(Clone, Debug)]
pub struct PathReport {
    pub state: PathState,
    pub connections: usize,
    pub counters: PathCounters,
    pub inflight_requests: u32,
    pub inflight_bytes: u64,
    /// Measured capacity in bytes per second (0 until measured).
    pub throughput: f64,
    /// Estimated base latency (round trip and server time, no queueing).
    pub base_latency: Duration,
    /// Latency of the user's requests since the path was added.
    pub latency: Histogram,
    /// The same over the last 10 s and the last minute.
    pub latency_10s: Histogram,
    pub latency_1m: Histogram,
    pub idle: Duration,
    pub fencing: bool,
    /// What the target says of the path's port (ALUA).
    pub access: super::Access,
    /// The knobs set for the path (priority, weight, standby, ...).
    pub config: super::PathConfig,
}

/// The replay window and the loss state, for reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// The target says which process answers (or tells each new session of
    /// a power on), so a restart is seen and replayed.
    pub available: bool,
    /// Bytes acknowledged since the last FLUSH and kept for replay.
    pub window_bytes: u64,
    /// Memory those hold (the buffers they keep alive), and the bound.
    pub window_pinned: u64,
    pub window_limit: u64,
    /// Acknowledged writes were let go to stay within the bound, and no
    /// FLUSH has covered them yet: a restart now cannot be made whole.
    pub overflowed: bool,
    /// Restarts seen, and replays done.
    pub restarts: u64,
    /// A replay is under way (new requests wait for it).
    pub replaying: bool,
    /// The last replay: bytes, and time from the restart seen to its end.
    pub last_replay: Option<(u64, Duration)>,
    /// Acknowledged writes may be gone: since when (engine time) and why.
    pub lost: Option<(Duration, String)>,
    /// FLUSHes and FUA writes failed because of a loss.
    pub lost_flushes: u64,
}
