//! The multipath engine: every decision about where I/O goes, with no I/O.
//!
//! The driver feeds it events — a request submitted, a reply received, a
//! path up or failed, the clock ticking — each with the current time as a
//! [`Duration`] since an epoch of the driver's choosing, and carries out the
//! [`Action`]s it queues: send a chunk on a connection, complete a request,
//! close or fence a path, reconnect later. Because it never touches a
//! socket, a task or a clock, the same code runs under the simulator with a
//! virtual clock.
//!
//! Rules it keeps:
//! - a request is split by the policy; it completes when all its chunks
//!   have, with the first error any chunk met;
//! - a failed path's reads are re-sent at once; its writes only after the
//!   target has fenced the failed connections (or, where the target cannot
//!   fence, after they are closed), so a stale write cannot land after a
//!   newer one;
//! - a FLUSH is sent only once every write submitted before it has been
//!   acknowledged, on whichever path;
//! - a READ or WRITE is held, in order, while the policy asks for it (it
//!   knows nothing yet of any usable path, and a reply will tell it);
//! - with no usable path, chunks wait up to the no-path timeout, then their
//!   requests fail with EIO; nothing is completed that the target did not
//!   acknowledge;
//! - what the target acknowledged and never made durable is kept (the
//!   replay window); a target that restarted gets it again before anything
//!   new, with every piece of a split write it had answered, and reads wait
//!   until it has landed (`restart.rs`); when that cannot make it whole,
//!   every FLUSH and FUA write fails until the loss is cleared.

mod access;
#[cfg(test)]
mod access_tests;
mod api;
mod counters;
mod depth;
mod failover;
#[cfg(test)]
mod fence_tests;
mod held;
pub mod lateness;
mod liveness;
#[cfg(test)]
mod no_path_tests;
pub mod path;
mod report;
mod request;
mod restart;
#[cfg(test)]
mod restart_tests;
#[cfg(test)]
mod sim;
pub mod stats;
#[cfg(test)]
mod tests;
pub mod window;
#[cfg(test)]
mod window_tests;
mod writeback;
#[cfg(test)]
mod writeback_tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use braid_block::Flags;
use braid_policy::{PathView, Policy, Request as PolicyRequest};
use braid_proto::Cookie;
use rustc_hash::FxHashMap;

pub use access::Access;
pub use api::{
    Action, ChunkInfo, EngineConfig, Event, FenceId, Instance, IoError, Op, PathId, PathReport,
    Payload, ReplayReport, ReqId, SendChunk, Submit,
};
pub use counters::VolumeCounters;
pub use liveness::KernelHealth;
use path::Path;
pub use path::{PathConfig, PathCounters, PathState};
pub use stats::{Ewma, Histogram};

/// Bytes per second assumed of a path before any is measured (100 Mbit/s):
/// slow enough not to fail a sound link early, fast enough to notice a dead
/// one in about a second.
const UNMEASURED_THROUGHPUT: f64 = 12.5e6;

/// A throughput estimate lower than the best path's, with no sample for
/// this long, is forgotten (see `refresh_views`).
const STALE_ESTIMATE: Duration = Duration::from_secs(1);

/// Non-data requests are cut into pieces no larger than this.
const NONDATA_PIECE: u64 = 1 << 30;

/// A path's share of a write goes out as requests of at most this many
/// bytes, one after another on the path.
///
/// A target applies a write only once its whole payload has arrived (so
/// a client that vanishes mid-payload changes nothing), and replies after
/// that: the time to apply the last request of a share is link time lost,
/// since the next request waits for the reply. Cut into pieces, the
/// earlier ones are applied while the later ones are still on the wire,
/// and only the last one's is exposed. Measured on the lab, 1 MiB writes
/// at queue depth 1 (alternating runs): 4 × 1gbit 446-455 -> 463-465 MB/s
/// of a 469 MB/s limit, 2 × 1gbit 221-225 -> 232-234 of 235; queue
/// depth 16 unchanged (paths busy with the next requests hide it anyway).
const WRITE_PIECE: u64 = 64 * 1024;

/// A fence asked for: which path failed, and the writes it holds.
#[derive(Debug)]
struct PendingFence {
    path: PathId,
    /// The target instance (epoch) the failed connections led to: a
    /// restart since means they are gone with it, fenced or not.
    epoch: u64,
    held: Vec<Piece>,
    /// Ranges of held writes that failed (no path in time) before the
    /// fence was confirmed: a stale copy of them may still land, so a
    /// newer write to an overlapping range waits for this fence too, lest
    /// the stale copy land on top of it.
    unsettled: Vec<(u64, u64)>,
}

impl PendingFence {
    fn overlaps(&self, offset: u64, len: u64) -> bool {
        let end = offset.saturating_add(len.max(1));
        self.unsettled
            .iter()
            .any(|&(o, l)| o < end && offset < o.saturating_add(l.max(1)))
    }
}

#[derive(Clone, Debug)]
struct Piece {
    req: ReqId,
    op: Op,
    flags: Flags,
    offset: u64,
    len: u32,
    req_offset: u64,
    /// When it began to need a path: at submission, or when the path it
    /// was on failed or refused it (for the no-path timeout).
    since: Duration,
}

impl Piece {
    /// Bytes `[req_offset, req_offset + len)` of request `req`, submitted
    /// as `s` at `since`.
    fn of(req: ReqId, s: &Submit, req_offset: u64, len: u64, since: Duration) -> Self {
        Self {
            req,
            op: s.op,
            flags: s.flags,
            offset: s.offset + req_offset,
            len: len as u32,
            req_offset,
            since,
        }
    }
}

#[derive(Debug)]
struct Chunk {
    /// The piece it carries; `None` for a probe, and for a piece taken
    /// back to be sent again (its reply then only counts as the path's).
    piece: Option<Piece>,
    path: usize,
    conn: usize,
    bytes: u64,
    ahead: u64,
    sent_at: Duration,
    op: Op,
    /// The target instance the path led to when it was sent.
    epoch: u64,
}

/// Who asked for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// The driver's caller: completed with [`Action::Complete`].
    User,
    /// The engine, giving a restarted target its window again.
    Replay,
    /// The engine, making the window durable (`writeback.rs`).
    Writeback,
}

#[derive(Debug)]
struct UserReq {
    op: Op,
    offset: u64,
    len: u64,
    flags: Flags,
    /// A WRITE's data and what it pins (see [`Payload`]).
    payload: Option<Payload>,
    origin: Origin,
    /// A replay write of a replay started again: it is not sent again,
    /// and its end is only awaited.
    cancelled: bool,
    pending: u32,
    error: Option<IoError>,
    /// For writes: position in submission order, for the flush rule.
    write_seq: Option<u64>,
    /// Pieces of a write the target acknowledged while the request was
    /// still under way: (offset within it, length, target epoch). A
    /// restart before the request completes sends them again.
    acked: Vec<(u64, u32, u64)>,
    /// For a FLUSH: the replay window's mark when it was last sent.
    mark: u64,
    /// Bytes per path when the plan split the request over several paths
    /// (empty otherwise, and once a piece is sent again elsewhere), and
    /// when it was placed: which path it waits for teaches each path's
    /// [`lateness`].
    split: Vec<(usize, u64)>,
    placed: Duration,
}

impl UserReq {
    fn new(s: &Submit, origin: Origin, write_seq: Option<u64>, now: Duration) -> Self {
        Self {
            op: s.op,
            offset: s.offset,
            len: s.len,
            flags: s.flags,
            payload: s.payload.clone(),
            origin,
            cancelled: false,
            pending: 0,
            error: None,
            write_seq,
            acked: Vec::new(),
            mark: 0,
            split: Vec::new(),
            placed: now,
        }
    }

    /// A placed write still under way (not held, deferred or done).
    fn writing(&self) -> bool {
        self.op.is_write() && self.pending > 0
    }
}

/// The multipath engine of one volume.
pub struct Engine {
    cfg: EngineConfig,
    policy: Box<dyn Policy>,
    paths: Vec<Path>,
    /// Keyed by counters, looked up several times per request: a
    /// multiply for a hash, not SipHash (whose defence against chosen
    /// keys these have no use for).
    chunks: FxHashMap<u64, Chunk>,
    reqs: FxHashMap<u64, UserReq>,
    next_cookie: u64,
    next_req: u64,
    next_write_seq: u64,
    /// Write sequence numbers not yet completed.
    open_writes: BTreeSet<u64>,
    /// Flushes waiting for earlier writes: (piece, last write seq covered).
    held_flushes: Vec<(Piece, u64)>,
    /// Pieces waiting for any usable path.
    waiting: VecDeque<Piece>,
    /// Pieces waiting for room on a path at its queue depth (`depth.rs`),
    /// and whether the last views left out a path only for its depth.
    backlog: VecDeque<Piece>,
    depth_full: bool,
    /// READs and WRITEs the policy holds until replies tell it more
    /// (see `Policy::hold`), in submission order, with when each came.
    held: VecDeque<(ReqId, Submit, Duration)>,
    /// Fences asked for and not confirmed, each with the writes it covers
    /// (sent on the connections it names).
    fences: BTreeMap<FenceId, PendingFence>,
    next_fence: u64,
    actions: VecDeque<Action>,
    views: Vec<PathView>,
    counters: VolumeCounters,
    /// What the target acknowledged and has not made durable.
    window: window::Window,
    /// The engine's own FLUSH, and the writes that will fill the window.
    writeback: writeback::Writeback,
    /// Restarts of the target seen so far; each path and chunk records
    /// the one it led to.
    epoch: u64,
    /// The target's name for its process, once one said it.
    instance: Option<u128>,
    /// Some path told of the target's life (an instance, or a reset at
    /// login): a restart can be seen, so replay is available.
    signals: bool,
    /// A replay under way, and what waits for it.
    replay: Option<restart::ReplayRun>,
    /// Requests that came during a replay, in order.
    deferred: VecDeque<(ReqId, Submit, Duration)>,
    /// Pieces of the user's requests that wait for the replay to land.
    after_replay: Vec<Piece>,
    /// Paths whose new session told of a reset, waiting to learn whether
    /// it is the restart already handled (see `restart.rs`).
    confirming: Vec<restart::Confirm>,
    /// Acknowledged writes may be gone: since when, and why.
    lost: Option<(Duration, String)>,
    last_replay: Option<(u64, Duration)>,
    #[cfg(test)]
    undo: restart::Undo,
}

impl Engine {
    pub fn new(cfg: EngineConfig, policy: Box<dyn Policy>) -> Self {
        Self {
            policy,
            paths: Vec::new(),
            chunks: FxHashMap::default(),
            reqs: FxHashMap::default(),
            next_cookie: 1,
            next_req: 1,
            next_write_seq: 1,
            open_writes: BTreeSet::new(),
            held_flushes: Vec::new(),
            waiting: VecDeque::new(),
            backlog: VecDeque::new(),
            depth_full: false,
            held: VecDeque::new(),
            fences: BTreeMap::new(),
            next_fence: 1,
            actions: VecDeque::new(),
            counters: VolumeCounters::default(),
            views: Vec::new(),
            window: window::Window::new(cfg.replay_window),
            writeback: Default::default(),
            epoch: 0,
            instance: None,
            signals: false,
            replay: None,
            deferred: VecDeque::new(),
            after_replay: Vec::new(),
            confirming: Vec::new(),
            lost: None,
            last_replay: None,
            #[cfg(test)]
            undo: Default::default(),
            cfg,
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Adds a path (in state `Connecting`); the driver connects it and then
    /// calls [`Self::path_up`].
    pub fn add_path(&mut self, config: PathConfig, now: Duration) -> PathId {
        self.paths.push(Path::new(config, now));
        PathId(self.paths.len() - 1)
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Switches policy on the live volume; requests in flight are not moved.
    pub fn set_policy(&mut self, policy: Box<dyn Policy>) {
        self.policy = policy;
    }

    /// The next thing for the driver to do.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Requests submitted and not completed.
    pub fn outstanding(&self) -> usize {
        self.reqs.len()
    }

    /// The kernel's figures of a path's connections (see `Path::wire`):
    /// bytes delivered, the smallest round trip, and what it says of the
    /// peer's health (see [`KernelHealth`]).
    pub fn wire(
        &mut self,
        now: Duration,
        path: PathId,
        bytes: u64,
        min_rtt: Option<Duration>,
        health: KernelHealth,
    ) {
        if let Some(p) = self.paths.get_mut(path.0) {
            p.wire(now, bytes, min_rtt);
            p.liveness.kernel(now, health);
        }
        self.release_held(now);
    }

    /// Takes a path out of use (maintenance) or puts it back. Chunks in
    /// flight on a disabled path finish there; nothing new is sent to it.
    pub fn set_enabled(&mut self, now: Duration, path: PathId, enabled: bool) {
        let p = &mut self.paths[path.0];
        let was = p.enabled;
        p.enabled = enabled;
        if enabled && !was {
            p.last_activity = now;
            let waiting: Vec<Piece> = self.waiting.drain(..).collect();
            for piece in waiting {
                self.dispatch(now, piece);
            }
        }
        self.release_held(now);
    }

    /// Changes a path's knobs (priority, weight, standby, ...) on the live
    /// volume. Chunks in flight stay where they are; what waits for a path
    /// is placed again, since a path that stood by may be eligible now.
    pub fn set_path_config(&mut self, now: Duration, path: PathId, config: PathConfig) {
        self.paths[path.0].config = config;
        let waiting: Vec<Piece> = self.waiting.drain(..).collect();
        for piece in waiting {
            self.dispatch(now, piece);
        }
        // A deeper queue has room now.
        self.release_backlog(now);
    }

    /// Places a piece on the best usable path, or queues it. Returns the
    /// path it went to.
    fn dispatch(&mut self, now: Duration, piece: Piece) -> Option<usize> {
        let r = self.reqs.get_mut(&piece.req.0)?;
        r.split.clear(); // sent again: which path it waits for says little
        if r.cancelled {
            // A replay write of a replay started again: what it carried
            // goes in the new replay.
            self.piece_done(now, piece.req, None);
            return None;
        }
        #[cfg(test)]
        let hold = !(self.undo.reads_during_replay && piece.op == Op::Read);
        #[cfg(not(test))]
        let hold = true;
        if hold && self.replay.is_some() && r.origin == Origin::User {
            // Nothing of the user's may land, read or be flushed before the
            // restarted target has back what it acknowledged.
            self.after_replay.push(piece);
            return None;
        }
        self.refresh_views(now);
        let req = PolicyRequest {
            len: if piece.op.moves_data() {
                u64::from(piece.len)
            } else {
                0
            },
            write: piece.op.is_write(),
        };
        match self.policy.choose(&req, &self.views) {
            Some(path) if self.views.get(path).is_some_and(|v| v.usable) => {
                self.send(now, piece, path);
                Some(path)
            }
            _ if self.only_full() => {
                self.wait_for_room(piece);
                None
            }
            _ => {
                if self.cfg.no_path_timeout == Some(Duration::ZERO) {
                    self.fail_piece(now, piece);
                } else {
                    self.waiting.push_back(piece);
                }
                None
            }
        }
    }

    fn send(&mut self, now: Duration, piece: Piece, path: usize) {
        if piece.op.is_write() {
            let len = u64::from(piece.len);
            if let Some(f) = self
                .fences
                .values_mut()
                .find(|f| f.overlaps(piece.offset, len))
            {
                f.held.push(piece);
                return;
            }
        }
        if self.paths[path].full() {
            // A plan made before the path filled: place it again.
            self.dispatch(now, piece);
            return;
        }
        let Some(conn) = self.paths[path].pick_conn() else {
            self.waiting.push_back(piece);
            return;
        };
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let bytes = if piece.op.moves_data() {
            u64::from(piece.len)
        } else {
            0
        };
        let ahead = self.paths[path].inflight_bytes();
        self.paths[path].sent(conn, bytes, now);
        let mark = self.window.mark();
        let payload = self.reqs.get_mut(&piece.req.0).and_then(|r| {
            if piece.op == Op::Flush {
                // A FLUSH covers what was acknowledged before it was sent.
                r.mark = mark;
            }
            let data = &r.payload.as_ref()?.data;
            let start = piece.req_offset as usize;
            Some(data.slice(start..start + piece.len as usize))
        });
        let epoch = self.paths[path].epoch;
        self.actions.push_back(Action::Send(SendChunk {
            path: PathId(path),
            conn,
            cookie: Cookie(cookie),
            op: piece.op,
            flags: piece.flags,
            offset: piece.offset,
            len: piece.len,
            req: Some(piece.req),
            req_offset: piece.req_offset,
            payload,
        }));
        self.chunks.insert(
            cookie,
            Chunk {
                op: piece.op,
                piece: Some(piece),
                path,
                conn,
                bytes,
                ahead,
                sent_at: now,
                epoch,
            },
        );
    }

    fn refresh_views(&mut self, now: Duration) {
        self.views.clear();
        self.views.extend(self.paths.iter().map(|p| p.view(now)));
        access::apply(&self.paths, &mut self.views);
        self.depth_full = depth::apply(&self.paths, &mut self.views);
        // A path measured slow and then starved (sent too little to be kept
        // full, so never measured again) would stay starved: after a while
        // without a sample its estimate is forgotten, so the policy tries it
        // like a new path and measures it afresh.
        let best = self.views.iter().map(|v| v.throughput).fold(0.0, f64::max);
        for (v, p) in self.views.iter_mut().zip(&self.paths) {
            let stale = p
                .throughput
                .last_sample()
                .is_some_and(|t| now.saturating_sub(t) > STALE_ESTIMATE);
            if stale && v.throughput < 0.8 * best {
                v.throughput = 0.0;
            }
        }
    }
}
