//! The driver's shared state: the engine, each request's data and waiter,
//! each path's live connections; and the one place where engine actions
//! are carried out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use braid_proto::reply::BlockStatus;
use braid_proto::{CmdFlags, Cookie, Errno};
use bytes::Bytes;
use tokio::sync::oneshot;
use tracing::{info, warn, Instrument};

use super::link::Link;
use super::timeline::EventKind;
use crate::conn::Sink;
use crate::discover::PathSpec;
use crate::engine::{Action, ChunkInfo, Engine, Event, IoError, Op, PathId, ReqId};

use super::recover;

/// What a completed request hands back.
#[derive(Debug, Default)]
pub struct Done {
    /// READ data as (offset within the request, bytes), in offset order,
    /// covering the request exactly.
    pub data: Vec<(u64, Bytes)>,
    /// BLOCK_STATUS answers for `base:allocation`.
    pub status: Vec<BlockStatus>,
}

#[derive(Debug)]
pub(crate) struct Pending {
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    pub flags: CmdFlags,
    pub write: Option<Bytes>,
    pub done: Done,
    pub tx: Option<oneshot::Sender<Result<Done, IoError>>>,
    /// A write the driver sends again to a restarted target (no caller).
    pub replay: bool,
    /// For a FLUSH: the replay window's mark when it was sent.
    pub flush_mark: u64,
}

pub(crate) struct PathIo {
    pub spec: PathSpec,
    /// `path{n, via}`, inside the volume's span: what the path's log
    /// lines and background tasks run in.
    pub span: tracing::Span,
    pub conns: Vec<Option<Link>>,
    /// Context id of `base:allocation` on each connection.
    pub allocation: Vec<Option<u32>>,
    /// Bumped whenever the connections are replaced, so late events from
    /// old ones are ignored.
    pub generation: u64,
    pub reconnecting: bool,
}

pub(crate) struct Core {
    pub engine: Engine,
    pub reqs: HashMap<u64, Pending>,
    pub paths: Vec<PathIo>,
    /// Bytes of READ data received per chunk, to catch short replies.
    pub received: HashMap<u64, u64>,
    pub warned_no_fencing: bool,
    pub replay: super::replay::ReplayState,
    /// `volume{export}`: what the volume's own log lines run in.
    pub span: tracing::Span,
    /// What `log` says, kept for people watching (`timeline.rs`).
    pub timeline: super::timeline::Timeline,
}

/// Everything the volume's tasks share.
pub(crate) struct Shared {
    pub core: Mutex<Core>,
    pub epoch: Instant,
    pub settings: super::Settings,
    /// The volume was closed: background tasks stop.
    pub closed: std::sync::atomic::AtomicBool,
}

/// Zeroes for OFFSET_HOLE replies, sliced without allocating.
static ZEROES: [u8; 1 << 20] = [0; 1 << 20];

impl Shared {
    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    pub fn closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Core {
    /// Carries out every queued engine action.
    pub fn act(&mut self, shared: &Arc<Shared>) {
        while let Some(action) = self.engine.poll_action() {
            match action {
                Action::Send(s) => {
                    let payload = match (s.op, s.req) {
                        (Op::Write, Some(req)) => self.reqs.get(&req.0).and_then(|p| {
                            let data = p.write.as_ref()?;
                            let start = s.req_offset as usize;
                            Some(data.slice(start..start + s.len as usize))
                        }),
                        _ => None,
                    };
                    let sent = self.paths[s.path.0]
                        .conns
                        .get(s.conn)
                        .and_then(Option::as_ref)
                        .is_some_and(|c| c.send(&s, payload));
                    if !sent {
                        let now = shared.now();
                        self.engine.path_failed(now, s.path, "connection gone");
                    }
                }
                Action::Complete { req, result } => self.complete(shared.now(), req, result),
                Action::Close { path } => {
                    let p = &mut self.paths[path.0];
                    p.generation += 1;
                    for c in p.conns.iter_mut() {
                        if let Some(h) = c.take() {
                            h.abort();
                        }
                    }
                    // Chunks of the closed connections were moved by the
                    // engine; forget what arrived for them.
                    let engine = &self.engine;
                    self.received
                        .retain(|k, _| engine.chunk(Cookie(*k)).is_some());
                }
                Action::Fence { path, fence, conns } if !shared.closed() => {
                    let span = self.paths[path.0].span.clone();
                    tokio::spawn(
                        recover::fence(shared.clone(), path, fence, conns).instrument(span),
                    );
                }
                Action::Fence { .. } => {}
                Action::Reconnect { path, after } if !shared.closed() => {
                    let p = &mut self.paths[path.0];
                    if !p.reconnecting {
                        p.reconnecting = true;
                        let span = p.span.clone();
                        tokio::spawn(
                            recover::reconnect(shared.clone(), path, after).instrument(span),
                        );
                    }
                }
                Action::Reconnect { .. } => {}
                Action::Event(ev) => self.log(shared.now(), ev),
            }
        }
    }

    /// Hands a request to the engine, or, while a replay is under way,
    /// keeps it until the replay is done (nothing new may land before the
    /// restarted target has the acknowledged writes back).
    pub fn start(&mut self, now: Duration, submit: crate::engine::Submit, mut p: Pending) {
        if self.replay.replaying > 0 {
            self.replay.deferred.push_back((submit, p));
            return;
        }
        if p.op == Op::Flush {
            p.flush_mark = self.replay.window.mark();
        }
        let id = self.engine.submit(now, submit);
        self.reqs.insert(id.0, p);
    }

    fn complete(&mut self, now: Duration, req: ReqId, result: Result<(), IoError>) {
        let Some(mut p) = self.reqs.remove(&req.0) else {
            return;
        };
        if p.replay {
            self.replayed(now, result.is_ok());
            return;
        }
        if self.replay.redo_flush.remove(&req.0) {
            // Sent before the restart was seen: its answer covers nothing
            // of the replay. Asked again, after it.
            let submit = crate::engine::Submit {
                op: Op::Flush,
                offset: 0,
                len: 0,
                flags: p.flags,
            };
            self.start(now, submit, p);
            return;
        }
        let result = self.account(&p, result);
        let result = result.and_then(|()| {
            let done = std::mem::take(&mut p.done);
            if p.op == Op::Read {
                assemble(done, p.len)
            } else {
                Ok(done)
            }
        });
        if let Some(tx) = p.tx.take() {
            let _ = tx.send(result);
        }
    }

    /// One line per event, in the span of the path it is about (inside
    /// the volume's), so the text need not name either.
    fn log(&mut self, now: Duration, ev: Event) {
        let span = match &ev {
            Event::PathFailed { path, .. }
            | Event::Fenced { path, .. }
            | Event::PathRestored { path } => self.paths[path.0].span.clone(),
            Event::NoPathTimeout { .. } => self.span.clone(),
        };
        let _entered = span.enter();
        match ev {
            Event::PathFailed {
                path,
                reason,
                resent,
                held,
                queued,
            } => {
                let mut parts = Vec::new();
                for (to, n) in &resent {
                    parts.push(format!("{n} requests re-sent on path {}", to.0 + 1));
                }
                if held > 0 {
                    parts.push(format!("{held} writes held until the target fences it"));
                }
                if queued > 0 {
                    parts.push(format!("{queued} waiting for a path"));
                }
                let tail = if parts.is_empty() {
                    String::new()
                } else {
                    format!("; {}", parts.join(", "))
                };
                let line = format!("failed: {reason}{tail}");
                warn!("{line}");
                let silent = self.engine.path_report(path, now).idle;
                let moved = held + queued > 0 || !resent.is_empty();
                self.timeline.path_failed(path.0 + 1, &line, silent, moved);
                if held == 0
                    && !self.warned_no_fencing
                    && !resent.is_empty()
                    && !self.engine_fences(path)
                {
                    self.warned_no_fencing = true;
                    warn!(
                        "the target does not fence (x-braid:fence): writes of a failed path are \
                         re-sent once its connections are closed, which a plain NBD server \
                         cannot guarantee to be final"
                    );
                }
            }
            Event::Fenced {
                path,
                fence,
                resent,
            } => {
                let n: usize = resent.iter().map(|(_, n)| n).sum();
                let line = format!("fenced by the target; {n} writes re-sent");
                info!(fence = fence.0, "{line}");
                self.timeline.fenced(path.0 + 1, &line);
            }
            Event::PathRestored { path } => {
                info!("restored");
                self.timeline.restored(path.0 + 1, "restored");
            }
            Event::NoPathTimeout { failed } => {
                let line = format!("no path for longer than the no-path timeout: {failed} requests failed with EIO");
                warn!("{line}");
                self.timeline
                    .record(EventKind::NoPathTimeout, None, line, None);
            }
        }
    }

    fn engine_fences(&self, path: PathId) -> bool {
        self.engine.path_report(path, Duration::ZERO).fencing
    }
}

/// Puts a read's pieces in order and checks they cover it exactly.
fn assemble(mut done: Done, len: u64) -> Result<Done, IoError> {
    done.data.sort_by_key(|(off, _)| *off);
    let mut at = 0u64;
    for (off, b) in &done.data {
        if *off != at {
            return Err(IoError::Target {
                errno: Errno::Io,
                message: format!(
                    "server left bytes {at}..{off} of the read unanswered or answered twice"
                ),
            });
        }
        at += b.len() as u64;
    }
    if at != len {
        return Err(IoError::Target {
            errno: Errno::Io,
            message: format!("server answered {at} of {len} bytes of a read"),
        });
    }
    Ok(done)
}

/// Where READ data that a reply puts at absolute `offset` (or, for a simple
/// reply, at the chunk's start) lands within the caller's request; `None`
/// if it does not lie inside the chunk.
pub(crate) fn place_in_request(info: &ChunkInfo, offset: Option<u64>, len: u64) -> Option<u64> {
    if info.op != Op::Read {
        return None;
    }
    let start = offset.unwrap_or(info.offset);
    let end = start.checked_add(len)?;
    (start >= info.offset && end <= info.offset + u64::from(info.len))
        .then(|| info.req_offset + (start - info.offset))
}

/// The engine's view of one connection's replies.
pub(crate) struct ConnSink {
    pub shared: Weak<Shared>,
    pub path: PathId,
    pub generation: u64,
    pub allocation: Option<u32>,
}

impl ConnSink {
    pub(super) fn with_core<T>(&self, f: impl FnOnce(&Arc<Shared>, &mut Core) -> T) -> Option<T> {
        let shared = self.shared.upgrade()?;
        let mut core = shared.lock();
        if core.paths[self.path.0].generation != self.generation {
            return None;
        }
        let out = f(&shared, &mut core);
        Some(out)
    }

    fn place(&self, cookie: Cookie, offset: Option<u64>, data: Bytes) {
        self.with_core(|_, core| place(core, cookie, offset, data));
    }
}

/// Adds READ data that arrived for `cookie` to its request.
pub(super) fn place(core: &mut Core, cookie: Cookie, offset: Option<u64>, data: Bytes) {
    let Some(info) = core.engine.chunk(cookie) else {
        return;
    };
    let Some(req) = info.req else {
        return; // a probe's data is not needed
    };
    let Some(p) = core.reqs.get_mut(&req.0) else {
        return;
    };
    // Untrusted offsets: data outside its chunk is refused by leaving the
    // read short, which fails it.
    let Some(at) = place_in_request(&info, offset, data.len() as u64) else {
        return;
    };
    *core.received.entry(cookie.0).or_default() += data.len() as u64;
    p.done.data.push((at, data));
}

/// Hands the end of `cookie`'s reply to the engine and carries out what
/// follows from it.
pub(super) fn finish(
    shared: &Arc<Shared>,
    core: &mut Core,
    cookie: Cookie,
    error: Option<(Errno, String)>,
) {
    let received = core.received.remove(&cookie.0).unwrap_or(0);
    let outcome = match (error, core.engine.chunk(cookie)) {
        (Some(e), _) => Err(e),
        (None, Some(c)) if c.op == Op::Read && c.req.is_some() && received != u64::from(c.len) => {
            Err((
                Errno::Io,
                format!("server answered {received} of {} bytes", c.len),
            ))
        }
        _ => Ok(()),
    };
    core.engine.reply(shared.now(), cookie, outcome);
    core.act(shared);
}

impl Sink for ConnSink {
    fn read_len(&self, cookie: Cookie) -> Option<u32> {
        self.with_core(|_, core| {
            core.engine
                .chunk(cookie)
                .filter(|c| c.op == Op::Read)
                .map(|c| c.len)
        })
        .flatten()
    }

    fn data(&self, cookie: Cookie, offset: Option<u64>, data: Bytes) {
        self.place(cookie, offset, data);
    }

    fn hole(&self, cookie: Cookie, offset: u64, len: u32) {
        let mut at = 0u64;
        while at < u64::from(len) {
            let n = (u64::from(len) - at).min(ZEROES.len() as u64) as usize;
            self.place(cookie, Some(offset + at), Bytes::from_static(&ZEROES[..n]));
            at += n as u64;
        }
    }

    fn extents(&self, cookie: Cookie, status: BlockStatus) {
        if Some(status.context_id) != self.allocation {
            return;
        }
        self.with_core(|_, core| {
            if let Some(req) = core.engine.chunk(cookie).and_then(|c| c.req) {
                if let Some(p) = core.reqs.get_mut(&req.0) {
                    p.done.status.push(status);
                }
            }
        });
    }

    fn data_done(&self, cookie: Cookie, offset: Option<u64>, data: Bytes) {
        // One lock for the common reply, not two.
        self.with_core(|shared, core| {
            place(core, cookie, offset, data);
            finish(shared, core, cookie, None);
        });
    }

    fn done(&self, cookie: Cookie, error: Option<(Errno, String)>) {
        self.with_core(|shared, core| finish(shared, core, cookie, error));
    }

    fn lost(&self, reason: String) {
        self.with_core(|shared, core| {
            core.engine.path_failed(shared.now(), self.path, &reason);
            core.act(shared);
        });
    }
}

/// Submits one request and waits for it.
pub(crate) async fn submit(
    shared: &Arc<Shared>,
    op: Op,
    offset: u64,
    len: u64,
    flags: CmdFlags,
    write: Option<Bytes>,
) -> Result<Done, IoError> {
    let (tx, rx) = oneshot::channel();
    {
        let mut core = shared.lock();
        let now = shared.now();
        let submit = crate::engine::Submit {
            op,
            offset,
            len,
            flags,
        };
        let pending = Pending {
            op,
            offset,
            len,
            flags,
            write,
            done: Done::default(),
            tx: Some(tx),
            replay: false,
            flush_mark: 0,
        };
        core.start(now, submit, pending);
        core.act(shared);
    }
    rx.await.unwrap_or_else(|_| {
        Err(IoError::Target {
            errno: Errno::Io,
            message: "the volume was closed".into(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineConfig, PathConfig, Submit};
    use braid_policy::{by_name, PolicyOptions, SplitRules, NAMES};
    use proptest::prelude::*;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    /// The byte the fake target holds at `offset`.
    fn byte_at(offset: u64) -> u8 {
        (offset.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn split_then_reassemble_returns_the_callers_bytes(
            align_shift in 0u32..13,
            offset_blocks in 0u64..5000,
            len_blocks in 1u64..3000,
            chunk_blocks in 1u64..600,
            paths in 1usize..6,
            policy in 0usize..9,
            seed: u64,
        ) {
            let align = 1u64 << align_shift;
            let offset = offset_blocks * align;
            let len = (len_blocks * align).min(64 << 20);
            let mut engine = Engine::new(
                EngineConfig {
                    split: SplitRules { align, chunk: chunk_blocks * align, max: (8 << 20) / align * align },
                    size: 1 << 40,
                    ..EngineConfig::default()
                },
                by_name(NAMES[policy], &PolicyOptions::default()).unwrap(),
            );
            for i in 0..paths {
                let p = engine.add_path(PathConfig::default(), Duration::ZERO);
                engine.path_up(
                    Duration::ZERO,
                    p,
                    vec![Some(braid_proto::braid_ns::ConnId(i as u128))],
                    true,
                );
            }
            while engine.poll_action().is_some() {}
            let id = engine.submit(Duration::ZERO, Submit { op: Op::Read, offset, len, flags: CmdFlags(0) });
            let mut sends = Vec::new();
            while let Some(a) = engine.poll_action() {
                if let Action::Send(s) = a { sends.push(s) }
            }
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            sends.shuffle(&mut rng);
            let mut done = Done::default();
            let mut result = None;
            for s in sends {
                let info = engine.chunk(s.cookie).unwrap();
                // The target may answer in several data chunks, any order.
                let cut = if s.len > 1 { rng.gen_range(0..s.len) } else { 0 };
                let mut parts = vec![(s.offset, cut), (s.offset + u64::from(cut), s.len - cut)];
                parts.retain(|(_, n)| *n > 0);
                parts.shuffle(&mut rng);
                for (at, n) in parts {
                    let bytes: Vec<u8> = (at..at + u64::from(n)).map(byte_at).collect();
                    let dest = place_in_request(&info, Some(at), u64::from(n)).unwrap();
                    done.data.push((dest, Bytes::from(bytes)));
                }
                engine.reply(Duration::ZERO, s.cookie, Ok(()));
                while let Some(a) = engine.poll_action() {
                    if let Action::Complete { req, result: r } = a {
                        prop_assert_eq!(req, id);
                        result = Some(r);
                    }
                }
            }
            prop_assert_eq!(result, Some(Ok(())));
            let got = assemble(done, len).unwrap();
            let flat: Vec<u8> = got.data.iter().flat_map(|(_, b)| b.iter().copied()).collect();
            let want: Vec<u8> = (offset..offset + len).map(byte_at).collect();
            prop_assert!(flat == want, "reassembled bytes differ");
        }
    }

    #[test]
    fn data_outside_its_chunk_is_refused() {
        let info = ChunkInfo {
            path: PathId(0),
            op: Op::Read,
            len: 100,
            offset: 1000,
            req: Some(ReqId(1)),
            req_offset: 50,
        };
        assert_eq!(place_in_request(&info, Some(1000), 100), Some(50));
        assert_eq!(place_in_request(&info, Some(1010), 10), Some(60));
        assert_eq!(place_in_request(&info, None, 100), Some(50));
        assert_eq!(place_in_request(&info, Some(999), 10), None);
        assert_eq!(place_in_request(&info, Some(1095), 10), None);
        assert_eq!(place_in_request(&info, Some(u64::MAX), 10), None);
    }

    #[test]
    fn gaps_and_overlaps_fail_the_read() {
        let d = Done {
            data: vec![
                (0, Bytes::from_static(b"ab")),
                (3, Bytes::from_static(b"d")),
            ],
            status: vec![],
        };
        assert!(assemble(d, 4).is_err());
        let d = Done {
            data: vec![
                (0, Bytes::from_static(b"ab")),
                (1, Bytes::from_static(b"bc")),
            ],
            status: vec![],
        };
        assert!(assemble(d, 3).is_err());
    }
}
