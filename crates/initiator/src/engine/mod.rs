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
//!   acknowledge.

mod held;
pub mod path;
#[cfg(test)]
mod sim;
pub mod stats;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use braid_policy::{PathView, Policy, Request as PolicyRequest, SplitRules};
use braid_proto::{CmdFlags, Command, Cookie, Errno};

use path::Path;
pub use path::{PathConfig, PathCounters, PathState};
pub use stats::{Ewma, Histogram};

/// A path's index in the engine, in the order paths were added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathId(pub usize);

/// A request submitted to the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqId(pub u64);

/// The operations a volume offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    Cache,
    BlockStatus,
}

impl Op {
    pub fn command(self) -> Command {
        match self {
            Self::Read => Command::Read,
            Self::Write => Command::Write,
            Self::Flush => Command::Flush,
            Self::Trim => Command::Trim,
            Self::WriteZeroes => Command::WriteZeroes,
            Self::Cache => Command::Cache,
            Self::BlockStatus => Command::BlockStatus,
        }
    }

    /// Changes the volume's contents (and so needs fencing to re-send).
    pub fn is_write(self) -> bool {
        matches!(self, Self::Write | Self::Trim | Self::WriteZeroes)
    }

    /// Carries payload bytes (the rest cost the link almost nothing).
    pub fn moves_data(self) -> bool {
        matches!(self, Self::Read | Self::Write)
    }
}

/// A request as submitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Submit {
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    pub flags: CmdFlags,
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IoError {
    #[error("target: {errno}: {message}")]
    Target { errno: Errno, message: String },
    #[error("no path to the volume for {0:?}")]
    NoPath(Duration),
}

impl IoError {
    /// The NBD error to hand a local client.
    pub fn errno(&self) -> Errno {
        match self {
            Self::Target { errno, .. } => *errno,
            Self::NoPath(_) => Errno::Io,
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
    pub flags: CmdFlags,
    /// Absolute offset on the volume.
    pub offset: u64,
    pub len: u32,
    /// The request it belongs to; `None` for a health probe.
    pub req: Option<ReqId>,
    /// Where in that request the chunk starts.
    pub req_offset: u64,
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
    /// The held writes of a failed path were re-sent after its fence.
    Fenced {
        path: PathId,
        resent: Vec<(PathId, usize)>,
    },
    PathRestored {
        path: PathId,
    },
    /// Requests waited longer than the no-path timeout and failed.
    NoPathTimeout {
        failed: usize,
    },
}

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
    /// ids, then call [`Engine::fence_done`].
    Fence {
        path: PathId,
        conns: Vec<u64>,
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
    /// Reconnect backoff: first delay, doubled per failure up to the cap.
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
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
        }
    }
}

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

#[derive(Clone, Debug)]
struct Piece {
    req: ReqId,
    op: Op,
    flags: CmdFlags,
    offset: u64,
    len: u32,
    req_offset: u64,
    /// When it first needed a path (for the no-path timeout).
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
    piece: Option<Piece>,
    path: usize,
    conn: usize,
    bytes: u64,
    ahead: u64,
    sent_at: Duration,
    op: Op,
}

#[derive(Debug)]
struct UserReq {
    op: Op,
    pending: u32,
    error: Option<IoError>,
    /// For writes: position in submission order, for the flush rule.
    write_seq: Option<u64>,
}

/// The multipath engine of one volume.
pub struct Engine {
    cfg: EngineConfig,
    policy: Box<dyn Policy>,
    paths: Vec<Path>,
    chunks: HashMap<u64, Chunk>,
    reqs: HashMap<u64, UserReq>,
    next_cookie: u64,
    next_req: u64,
    next_write_seq: u64,
    /// Write sequence numbers not yet completed.
    open_writes: BTreeSet<u64>,
    /// Flushes waiting for earlier writes: (piece, last write seq covered).
    held_flushes: Vec<(Piece, u64)>,
    /// Pieces waiting for any usable path.
    waiting: VecDeque<Piece>,
    /// READs and WRITEs the policy holds until replies tell it more
    /// (see `Policy::hold`), in submission order, with when each came.
    held: VecDeque<(ReqId, Submit, Duration)>,
    /// Per path: writes waiting for that path's fence.
    fence_hold: Vec<Vec<Piece>>,
    actions: VecDeque<Action>,
    views: Vec<PathView>,
}

impl Engine {
    pub fn new(cfg: EngineConfig, policy: Box<dyn Policy>) -> Self {
        Self {
            cfg,
            policy,
            paths: Vec::new(),
            chunks: HashMap::new(),
            reqs: HashMap::new(),
            next_cookie: 1,
            next_req: 1,
            next_write_seq: 1,
            open_writes: BTreeSet::new(),
            held_flushes: Vec::new(),
            waiting: VecDeque::new(),
            held: VecDeque::new(),
            fence_hold: Vec::new(),
            actions: VecDeque::new(),
            views: Vec::new(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Adds a path (in state `Connecting`); the driver connects it and then
    /// calls [`Self::path_up`].
    pub fn add_path(&mut self, config: PathConfig, now: Duration) -> PathId {
        self.paths.push(Path::new(config, now));
        self.fence_hold.push(Vec::new());
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

    /// Submits a request; its completion comes as [`Action::Complete`].
    pub fn submit(&mut self, now: Duration, s: Submit) -> ReqId {
        let id = ReqId(self.next_req);
        self.next_req += 1;
        let write_seq = s.op.is_write().then(|| {
            let seq = self.next_write_seq;
            self.next_write_seq += 1;
            self.open_writes.insert(seq);
            seq
        });
        let piece = |req_offset: u64, len: u64| Piece::of(id, &s, req_offset, len, now);
        let mut placed: Vec<(Piece, Option<usize>)> = Vec::new();
        match s.op {
            Op::Read | Op::Write => {
                self.submit_data(now, id, s, write_seq);
                return id;
            }
            Op::Flush => {
                let covers = self.next_write_seq - 1;
                let p = piece(0, 0);
                self.reqs.insert(
                    id.0,
                    UserReq {
                        op: s.op,
                        pending: 1,
                        error: None,
                        write_seq,
                    },
                );
                if self.open_writes.range(..=covers).next().is_some() {
                    self.held_flushes.push((p, covers));
                } else {
                    self.dispatch(now, p);
                }
                return id;
            }
            Op::BlockStatus => placed.push((piece(0, s.len.min(u64::from(u32::MAX))), None)),
            Op::Trim | Op::WriteZeroes | Op::Cache => {
                let mut at = 0;
                while at < s.len || (at == 0 && s.len == 0) {
                    let n = (s.len - at).min(NONDATA_PIECE);
                    placed.push((piece(at, n), None));
                    at += n.max(1);
                }
            }
        }
        self.reqs.insert(
            id.0,
            UserReq {
                op: s.op,
                pending: placed.len() as u32,
                error: None,
                write_seq,
            },
        );
        for (p, path) in placed {
            match path {
                Some(path) => self.send(now, p, path),
                None => {
                    self.dispatch(now, p);
                }
            }
        }
        id
    }

    /// A reply to the chunk `cookie` arrived: `Ok`, or the error the target
    /// sent. Replies for chunks already moved elsewhere are ignored.
    pub fn reply(&mut self, now: Duration, cookie: Cookie, outcome: Result<(), (Errno, String)>) {
        self.take_reply(now, cookie, outcome);
        self.release_held(now);
    }

    fn take_reply(&mut self, now: Duration, cookie: Cookie, outcome: Result<(), (Errno, String)>) {
        let Some(chunk) = self.chunks.remove(&cookie.0) else {
            return;
        };
        let path = &mut self.paths[chunk.path];
        path.completed(chunk.conn, chunk.bytes, chunk.ahead, chunk.sent_at, now);
        let c = &mut path.counters;
        match chunk.op {
            // Probes are health checks, not the user's data.
            _ if chunk.piece.is_none() => c.others += 1,
            Op::Read if outcome.is_ok() => {
                c.reads += 1;
                c.read_bytes += chunk.bytes;
            }
            Op::Write if outcome.is_ok() => {
                c.writes += 1;
                c.written_bytes += chunk.bytes;
            }
            _ if outcome.is_ok() => c.others += 1,
            _ => c.errors += 1,
        }
        let Some(piece) = chunk.piece else {
            return; // a probe: its reply was the point
        };
        match outcome {
            Ok(()) => {}
            Err((Errno::Shutdown, message)) => {
                // The target is going away on this path: try elsewhere.
                let reason = format!("target shutting down: {message}");
                self.path_failed(now, PathId(chunk.path), &reason);
                self.dispatch(now, piece);
                return;
            }
            Err((errno, message)) => {
                if let Some(r) = self.reqs.get_mut(&piece.req.0) {
                    r.error.get_or_insert(IoError::Target { errno, message });
                }
            }
        }
        self.piece_done(now, piece.req);
    }

    fn piece_done(&mut self, now: Duration, req: ReqId) {
        let Some(r) = self.reqs.get_mut(&req.0) else {
            return;
        };
        r.pending = r.pending.saturating_sub(1);
        if r.pending > 0 {
            return;
        }
        let r = self.reqs.remove(&req.0).expect("present above");
        if let Some(seq) = r.write_seq {
            self.open_writes.remove(&seq);
            self.release_flushes(now);
        }
        let _ = r.op;
        self.actions.push_back(Action::Complete {
            req,
            result: r.error.map_or(Ok(()), Err),
        });
    }

    fn release_flushes(&mut self, now: Duration) {
        let oldest_open = self.open_writes.first().copied().unwrap_or(u64::MAX);
        let (ready, held): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held_flushes)
            .into_iter()
            .partition(|(_, covers)| *covers < oldest_open);
        self.held_flushes = held;
        for (p, _) in ready {
            self.dispatch(now, p);
        }
    }

    /// The path's connections are up: it carries I/O from now on.
    /// `server_ids` are the target's ids of each connection (for fencing),
    /// `fencing` whether the target fences.
    pub fn path_up(
        &mut self,
        now: Duration,
        path: PathId,
        server_ids: Vec<Option<u64>>,
        fencing: bool,
    ) {
        let p = &mut self.paths[path.0];
        let was_failed = p.state == PathState::Failed;
        p.conns = server_ids
            .into_iter()
            .map(|server_id| path::ConnSlot {
                up: true,
                server_id,
                ..Default::default()
            })
            .collect();
        p.fencing = fencing;
        p.attempts = 0;
        p.since = now;
        p.last_progress = now;
        p.last_activity = now;
        p.state = PathState::Active;
        if was_failed {
            p.counters.restores += 1;
            self.actions
                .push_back(Action::Event(Event::PathRestored { path }));
        }
        let waiting: Vec<Piece> = self.waiting.drain(..).collect();
        for piece in waiting {
            self.dispatch(now, piece);
        }
        self.release_held(now);
    }

    /// A path failed (socket error, timeout, protocol violation): its
    /// chunks move to other paths, and the driver is told to close it,
    /// fence it and reconnect it later.
    pub fn path_failed(&mut self, now: Duration, path: PathId, reason: &str) {
        let p = &mut self.paths[path.0];
        if matches!(p.state, PathState::Failed) {
            return;
        }
        p.state = PathState::Failed;
        p.counters.failures += 1;
        // Chunks placed on this path earlier in the same call have not
        // reached the driver yet: they must not go out at all (they are
        // collected below with the rest of the path's chunks).
        self.actions
            .retain(|a| !matches!(a, Action::Send(s) if s.path == path));
        let server_ids: Vec<u64> = p.conns.iter().filter_map(|c| c.server_id).collect();
        let fencing = p.fencing;
        p.reset_conns();
        let mut cookies: Vec<u64> = self
            .chunks
            .iter()
            .filter(|(_, c)| c.path == path.0)
            .map(|(k, _)| *k)
            .collect();
        cookies.sort_unstable();
        let mut reads = Vec::new();
        let mut writes = Vec::new();
        for k in cookies {
            let c = self.chunks.remove(&k).expect("listed above");
            if let Some(piece) = c.piece {
                if piece.op.is_write() {
                    writes.push(piece);
                } else {
                    reads.push(piece);
                }
            }
        }
        self.paths[path.0].counters.resent += (reads.len() + writes.len()) as u64;
        self.actions.push_back(Action::Close { path });
        let before = self.waiting.len();
        let mut resent = Vec::new();
        for piece in reads {
            if let Some(to) = self.dispatch(now, piece) {
                count_into(&mut resent, to);
            }
        }
        let held = if !writes.is_empty() && fencing && !server_ids.is_empty() {
            let n = writes.len();
            self.fence_hold[path.0].extend(writes);
            self.actions.push_back(Action::Fence {
                path,
                conns: server_ids,
            });
            n
        } else {
            // No fencing: the connections are closed (Close above comes
            // first), which is the best a plain NBD server allows.
            for piece in writes {
                if let Some(to) = self.dispatch(now, piece) {
                    count_into(&mut resent, to);
                }
            }
            0
        };
        let queued = self.waiting.len().saturating_sub(before);
        self.actions.push_back(Action::Event(Event::PathFailed {
            path,
            reason: reason.to_owned(),
            resent,
            held,
            queued,
        }));
        self.schedule_reconnect(path);
        self.release_held(now);
    }

    /// A reconnect attempt failed; try again later, backing off.
    pub fn reconnect_failed(&mut self, path: PathId) {
        let p = &mut self.paths[path.0];
        if p.state == PathState::Connecting {
            p.state = PathState::Failed;
        }
        self.schedule_reconnect(path);
    }

    fn schedule_reconnect(&mut self, path: PathId) {
        let p = &mut self.paths[path.0];
        let shift = p.attempts.min(16);
        p.attempts += 1;
        let after = self
            .cfg
            .reconnect_min
            .saturating_mul(1 << shift)
            .min(self.cfg.reconnect_max);
        self.actions.push_back(Action::Reconnect { path, after });
    }

    /// The fence asked by [`Action::Fence`] completed: the held writes of
    /// `path` are re-sent.
    pub fn fence_done(&mut self, now: Duration, path: PathId) {
        let held = std::mem::take(&mut self.fence_hold[path.0]);
        let mut resent = Vec::new();
        for piece in held {
            if let Some(to) = self.dispatch(now, piece) {
                count_into(&mut resent, to);
            }
        }
        self.actions
            .push_back(Action::Event(Event::Fenced { path, resent }));
    }

    /// The kernel's figures of a path's connections (see `Path::wire`).
    pub fn wire(&mut self, now: Duration, path: PathId, bytes: u64, min_rtt: Option<Duration>) {
        if let Some(p) = self.paths.get_mut(path.0) {
            p.wire(now, bytes, min_rtt);
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

    /// Time passes: detects paths that stopped answering, probes idle
    /// ones, and fails requests that waited past the no-path timeout.
    pub fn tick(&mut self, now: Duration) {
        let measured: Vec<f64> = self
            .paths
            .iter()
            .filter_map(|p| p.throughput.get())
            .filter(|t| *t > 0.0)
            .collect();
        let fallback = if measured.is_empty() {
            UNMEASURED_THROUGHPUT
        } else {
            measured.iter().sum::<f64>() / measured.len() as f64
        };
        for i in 0..self.paths.len() {
            let p = &self.paths[i];
            if p.state != PathState::Active {
                continue;
            }
            let inflight = p.inflight_requests();
            if inflight > 0 {
                let largest = self
                    .chunks
                    .values()
                    .filter(|c| c.path == i)
                    .map(|c| c.bytes)
                    .max()
                    .unwrap_or(0);
                let limit = p.reply_timeout(
                    largest,
                    fallback,
                    self.cfg.timeout_floor,
                    self.cfg.timeout_ceiling,
                );
                let silent = now.saturating_sub(p.last_progress);
                if silent > limit {
                    let reason = format!("no reply in {:.1} s", silent.as_secs_f64());
                    self.path_failed(now, PathId(i), &reason);
                }
            } else if p.enabled
                && now.saturating_sub(p.last_activity) >= self.cfg.probe_interval
                && self.cfg.size > 0
            {
                self.probe(now, i);
            }
        }
        self.expire(now);
        self.release_held(now);
    }

    fn probe(&mut self, now: Duration, path: usize) {
        let Some(conn) = self.paths[path].pick_conn() else {
            return;
        };
        let len = self
            .cfg
            .min_block
            .max(1)
            .min(self.cfg.size.min(4096) as u32);
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.paths[path].sent(conn, u64::from(len), now);
        self.chunks.insert(
            cookie,
            Chunk {
                piece: None,
                path,
                conn,
                bytes: u64::from(len),
                ahead: 0,
                sent_at: now,
                op: Op::Read,
            },
        );
        self.actions.push_back(Action::Send(SendChunk {
            path: PathId(path),
            conn,
            cookie: Cookie(cookie),
            op: Op::Read,
            flags: CmdFlags(0),
            offset: 0,
            len,
            req: None,
            req_offset: 0,
        }));
    }

    fn expire(&mut self, now: Duration) {
        let Some(limit) = self.cfg.no_path_timeout else {
            return;
        };
        let mut expired = Vec::new();
        self.waiting.retain(|p| {
            let keep = now.saturating_sub(p.since) < limit;
            if !keep {
                expired.push(p.clone());
            }
            keep
        });
        for hold in &mut self.fence_hold {
            hold.retain(|p| {
                let keep = now.saturating_sub(p.since) < limit;
                if !keep {
                    expired.push(p.clone());
                }
                keep
            });
        }
        if expired.is_empty() {
            return;
        }
        self.actions.push_back(Action::Event(Event::NoPathTimeout {
            failed: expired.len(),
        }));
        for p in expired {
            self.fail_piece(now, p);
        }
    }

    fn fail_piece(&mut self, now: Duration, p: Piece) {
        if let Some(r) = self.reqs.get_mut(&p.req.0) {
            r.error
                .get_or_insert(IoError::NoPath(now.saturating_sub(p.since)));
        }
        self.piece_done(now, p.req);
    }

    /// Places a piece on the best usable path, or queues it. Returns the
    /// path it went to.
    fn dispatch(&mut self, now: Duration, piece: Piece) -> Option<usize> {
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
            Some(path) if self.paths.get(path).is_some_and(Path::usable) => {
                self.send(now, piece, path);
                Some(path)
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
            },
        );
    }

    fn refresh_views(&mut self, now: Duration) {
        self.views.clear();
        self.views.extend(self.paths.iter().map(|p| p.view(now)));
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

    /// A snapshot of one path for reports.
    pub fn path_report(&self, path: PathId, now: Duration) -> PathReport {
        let p = &self.paths[path.0];
        PathReport {
            state: p.reported_state(),
            connections: p.conns.iter().filter(|c| c.up).count(),
            counters: p.counters.clone(),
            inflight_requests: p.inflight_requests(),
            inflight_bytes: p.inflight_bytes(),
            throughput: p.throughput.or_zero(),
            base_latency: Duration::from_secs_f64(p.latency.or_zero()),
            latency: p.latency_hist.clone(),
            idle: now.saturating_sub(p.last_activity),
            fencing: p.fencing,
        }
    }

    /// Whether writes of `path` still wait for its fence.
    pub fn fence_pending(&self, path: PathId) -> bool {
        self.fence_hold.get(path.0).is_some_and(|h| !h.is_empty())
    }

    /// Whether new chunks may go to `path` now.
    pub fn path_usable(&self, path: PathId) -> bool {
        self.paths.get(path.0).is_some_and(Path::usable)
    }

    pub fn path_count(&self) -> usize {
        self.paths.len()
    }

    pub fn path_state(&self, path: PathId) -> PathState {
        self.paths[path.0].reported_state()
    }

    /// What the reader of a connection needs to place a reply's data.
    pub fn chunk(&self, cookie: Cookie) -> Option<ChunkInfo> {
        self.chunks.get(&cookie.0).map(|c| ChunkInfo {
            path: PathId(c.path),
            op: c.op,
            len: c.piece.as_ref().map_or(c.bytes as u32, |p| p.len),
            offset: c.piece.as_ref().map_or(0, |p| p.offset),
            req: c.piece.as_ref().map(|p| p.req),
            req_offset: c.piece.as_ref().map_or(0, |p| p.req_offset),
        })
    }
}

fn count_into(v: &mut Vec<(PathId, usize)>, path: usize) {
    match v.iter_mut().find(|(p, _)| p.0 == path) {
        Some((_, n)) => *n += 1,
        None => v.push((PathId(path), 1)),
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
    pub latency: Histogram,
    pub idle: Duration,
    pub fencing: bool,
}
