//! The driver's shared state: the engine, each request's data and waiter,
//! each path's live connections; and the one place where engine actions
//! are carried out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use braid_block::{Error, ErrorKind, Extent};
use braid_proto::Cookie;
use bytes::Bytes;
use smallvec::SmallVec;
use tokio::sync::oneshot;
use tracing::Instrument;

use self::reads::{assemble, forget, place, place_piped};
use super::link::Link;
use crate::discover::PathSpec;
use crate::engine::{Access, Action, Engine, FenceId, IoError, Op, PathId, ReqId};
use crate::sink::{Signal, Sink};
use braid_proto::braid_ns::ConnId;

mod reads;

/// What a completed request hands back.
#[derive(Debug, Default)]
pub struct Done {
    /// READ data as (offset within the request, bytes), in offset order,
    /// covering the request exactly.
    pub data: Vec<(u64, Bytes)>,
    /// BLOCK_STATUS's answer: allocation from the request's offset on.
    pub extents: Vec<Extent>,
    /// READ data in pipes instead of `data`, as (offset within the
    /// request, pipes), in offset order: only for a request started with
    /// [`Finish::piped`], and only for pieces that one reply of a plain
    /// TCP connection brought whole. With `data` it covers the request.
    pub piped: Vec<(u64, braid_pool::Piped)>,
}

#[derive(Debug)]
pub(crate) struct Pending {
    pub op: Op,
    pub len: u64,
    pub done: Done,
    /// The chunk each of `done.data`'s pieces came in on, so that what a
    /// chunk brought can be dropped when it is read again. Mostly one:
    /// kept inline rather than allocated for every read.
    pub sources: SmallVec<[u64; 2]>,
    /// The chunk each of `done.piped`'s pieces came in on.
    pub piped_sources: SmallVec<[u64; 2]>,
    pub finish: Finish,
}

/// Who is told that a request completed, and with what: called once,
/// from the task that completed it (a path's reader, mostly) with the
/// volume's lock held, so it must be short and must not reach into the
/// volume. A front end answers its client from there, with no task of its
/// own waiting per request. Dropped uncalled (the volume closed under
/// it), it is told so.
pub struct Finish {
    told: Option<Told>,
    /// The caller can take a READ's data as [`Done::piped`].
    pipe: bool,
}

type Told = Box<dyn FnOnce(Result<Done, IoError>) + Send>;

impl Finish {
    pub fn new(f: impl FnOnce(Result<Done, IoError>) + Send + 'static) -> Self {
        Self {
            told: Some(Box::new(f)),
            pipe: false,
        }
    }

    /// As [`Self::new`], for a caller that splices READ data from a pipe
    /// into its own socket: a READ answered whole by one plain TCP
    /// connection then comes back as [`Done::piped`], not copied through
    /// this process's memory.
    pub fn piped(f: impl FnOnce(Result<Done, IoError>) + Send + 'static) -> Self {
        let mut finish = Self::new(f);
        finish.pipe = true;
        finish
    }

    /// Whether the caller takes READ data as [`Done::piped`].
    pub(crate) fn takes_pipes(&self) -> bool {
        self.pipe
    }

    pub fn call(mut self, result: Result<Done, IoError>) {
        if let Some(f) = self.told.take() {
            f(result);
        }
    }

    /// What a waiting caller awaits instead.
    pub(crate) fn channel() -> (Self, oneshot::Receiver<Result<Done, IoError>>) {
        let (tx, rx) = oneshot::channel();
        (
            Self::new(move |r| {
                let _ = tx.send(r);
            }),
            rx,
        )
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        if let Some(f) = self.told.take() {
            f(Err(closed()));
        }
    }
}

/// What a request left unanswered by a closed volume fails with.
pub(crate) fn closed() -> IoError {
    IoError::Target {
        kind: ErrorKind::Io,
        message: "the volume was closed".into(),
    }
}

impl std::fmt::Debug for Finish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Finish")
    }
}

pub(crate) struct PathIo {
    pub spec: PathSpec,
    /// `path{n, via}`, inside the volume's span: what the path's log
    /// lines and background tasks run in.
    pub span: tracing::Span,
    pub conns: Vec<Option<Box<dyn Link>>>,
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
    /// `volume{export}`: what the volume's own log lines run in.
    pub span: tracing::Span,
    /// What `log` says, kept for people watching (`timeline.rs`).
    pub timeline: super::timeline::Timeline,
}

/// A background task of the volume, started by the core.
pub(crate) type Task = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The tasks that bring a path back, which the core starts when the
/// engine asks: given by whoever opens the volume (`recover.rs`'s), so
/// that the core, which those tasks drive, does not depend on them.
pub(crate) struct Tasks {
    /// Fence the named connections of a failed path.
    pub fence: fn(Arc<Shared>, PathId, FenceId, Vec<ConnId>) -> Task,
    /// Reconnect a path after a delay.
    pub reconnect: fn(Arc<Shared>, PathId, Duration) -> Task,
}

/// Everything the volume's tasks share.
pub(crate) struct Shared {
    pub core: Mutex<Core>,
    pub tasks: Tasks,
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
                Action::Send(mut s) => {
                    let payload = s.payload.take();
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
                Action::Complete { req, result } => self.complete(req, result),
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
                        (shared.tasks.fence)(shared.clone(), path, fence, conns).instrument(span),
                    );
                }
                Action::Fence { .. } => {}
                Action::Reconnect { path, after } if !shared.closed() => {
                    let p = &mut self.paths[path.0];
                    if !p.reconnecting {
                        p.reconnecting = true;
                        let span = p.span.clone();
                        tokio::spawn(
                            (shared.tasks.reconnect)(shared.clone(), path, after).instrument(span),
                        );
                    }
                }
                Action::Reconnect { .. } => {}
                Action::Forget { req, cookie } => {
                    if let Some(p) = self.reqs.get_mut(&req.0) {
                        forget(p, cookie.0);
                    }
                    self.received.remove(&cookie.0);
                }
                Action::Event(ev) => self.log(shared.now(), ev),
            }
        }
    }

    fn complete(&mut self, req: ReqId, result: Result<(), IoError>) {
        let Some(p) = self.reqs.remove(&req.0) else {
            return;
        };
        let Pending {
            op,
            len,
            done,
            finish,
            ..
        } = p;
        let result = result.and_then(|()| {
            if op == Op::Read {
                assemble(done, len)
            } else {
                Ok(done)
            }
        });
        finish.call(result);
    }
}

/// The engine's view of one connection's replies.
pub(crate) struct ConnSink {
    pub shared: Weak<Shared>,
    pub path: PathId,
    pub generation: u64,
}

impl ConnSink {
    fn with_core<T>(&self, f: impl FnOnce(&Arc<Shared>, &mut Core) -> T) -> Option<T> {
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

/// Hands the end of `cookie`'s reply to the engine and carries out what
/// follows from it.
fn finish(shared: &Arc<Shared>, core: &mut Core, cookie: Cookie, error: Option<Error>) {
    let received = core.received.remove(&cookie.0).unwrap_or(0);
    let outcome = match (error, core.engine.chunk(cookie)) {
        (Some(e), _) => Err(e),
        (None, Some(c)) if c.op == Op::Read && c.req.is_some() && received != u64::from(c.len) => {
            Err(Error::new(
                ErrorKind::Io,
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

    fn extents(&self, cookie: Cookie, extents: Vec<Extent>) {
        self.with_core(|_, core| {
            if let Some(req) = core.engine.chunk(cookie).and_then(|c| c.req) {
                if let Some(p) = core.reqs.get_mut(&req.0) {
                    p.done.extents.extend(extents);
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

    fn done(&self, cookie: Cookie, error: Option<Error>) {
        self.with_core(|shared, core| finish(shared, core, cookie, error));
    }

    fn pipe_ok(&self, cookie: Cookie, offset: Option<u64>, len: u32) -> bool {
        self.with_core(|_, core| reads::pipe_ok(core, cookie, offset, len).is_some())
            .unwrap_or(false)
    }

    fn piped_done(&self, cookie: Cookie, offset: Option<u64>, piped: braid_pool::Piped) {
        self.with_core(|shared, core| {
            place_piped(core, cookie, offset, piped);
            finish(shared, core, cookie, None);
        });
    }

    fn elsewhere(&self, cookie: Cookie, access: Access) {
        let shared = self.with_core(|shared, core| {
            let now = shared.now();
            core.engine.set_access(now, self.path, access);
            core.engine.retry_elsewhere(now, cookie);
            core.act(shared);
            shared.clone()
        });
        if let Some(shared) = shared {
            shared.settings.transport.watch_access(&shared, self.path);
        }
    }

    fn signal(&self, s: Signal) {
        // From the path's current connections only.
        if let Some(shared) = self.with_core(|shared, _| shared.clone()) {
            signal(&shared, self.path, s);
        }
    }

    fn lost(&self, reason: String) {
        self.with_core(|shared, core| {
            core.engine.path_failed(shared.now(), self.path, &reason);
            core.act(shared);
        });
    }
}

/// What a signal from `path`'s target means for the volume.
pub(crate) fn signal(shared: &Arc<Shared>, path: PathId, s: Signal) {
    match s {
        Signal::Restarted(how) => {
            let mut core = shared.lock();
            if shared.closed() {
                return;
            }
            core.engine.restart_signalled(shared.now(), path, how);
            core.act(shared);
        }
        Signal::AccessChanged => shared.settings.transport.refresh_access(shared),
    }
}

/// Submits one request; `finish` is told when it completes.
pub(crate) fn start(shared: &Arc<Shared>, req: super::Request, finish: Finish) {
    let super::Request {
        op,
        offset,
        len,
        flags,
        write,
    } = req;
    let mut core = shared.lock();
    let now = shared.now();
    let payload = write.map(|data| {
        // Writes come in pooled buffers of the next size class: the
        // replay window counts what its slices keep alive.
        let pinned = braid_pool::Pool::pinned(data.len());
        crate::engine::Payload { data, pinned }
    });
    let submit = crate::engine::Submit {
        op,
        offset,
        len,
        flags,
        payload,
    };
    let pending = Pending {
        op,
        len,
        done: Done::default(),
        sources: SmallVec::new(),
        piped_sources: SmallVec::new(),
        finish,
    };
    let id = core.engine.submit(now, submit);
    core.reqs.insert(id.0, pending);
    core.act(shared);
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
