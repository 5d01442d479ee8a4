//! The driver's shared state: the engine, each request's data and waiter,
//! each path's live connections; and the one place where engine actions
//! are carried out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use braid_proto::reply::BlockStatus;
use braid_proto::{CmdFlags, Cookie, Errno, Request};
use bytes::Bytes;
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::conn::{ConnHandle, Sink};
use crate::discover::PathSpec;
use crate::engine::{Action, Engine, Event, IoError, Op, PathId, ReqId};

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

pub(crate) struct Pending {
    pub op: Op,
    pub len: u64,
    pub write: Option<Bytes>,
    pub done: Done,
    pub tx: Option<oneshot::Sender<Result<Done, IoError>>>,
}

pub(crate) struct PathIo {
    pub spec: PathSpec,
    pub conns: Vec<Option<ConnHandle>>,
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
}

/// Everything the volume's tasks share.
pub(crate) struct Shared {
    pub core: Mutex<Core>,
    pub epoch: Instant,
    pub settings: super::Settings,
}

/// Zeroes for OFFSET_HOLE replies, sliced without allocating.
static ZEROES: [u8; 1 << 20] = [0; 1 << 20];

impl Shared {
    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
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
                    let req = Request {
                        flags: s.flags,
                        command: s.op.command(),
                        cookie: s.cookie,
                        offset: s.offset,
                        length: s.len,
                    };
                    let sent = self.paths[s.path.0]
                        .conns
                        .get(s.conn)
                        .and_then(Option::as_ref)
                        .is_some_and(|c| c.send(&req, payload));
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
                    self.received.retain(|k, _| engine.chunk(Cookie(*k)).is_some());
                }
                Action::Fence { path, conns } => {
                    tokio::spawn(recover::fence(shared.clone(), path, conns));
                }
                Action::Reconnect { path, after } => {
                    let p = &mut self.paths[path.0];
                    if !p.reconnecting {
                        p.reconnecting = true;
                        tokio::spawn(recover::reconnect(shared.clone(), path, after));
                    }
                }
                Action::Event(ev) => self.log(ev),
            }
        }
    }

    fn complete(&mut self, req: ReqId, result: Result<(), IoError>) {
        let Some(mut p) = self.reqs.remove(&req.0) else {
            return;
        };
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

    fn log(&mut self, ev: Event) {
        let name = |paths: &[PathIo], p: PathId| format!("path {} ({})", p.0 + 1, paths[p.0].spec);
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
                warn!("{} failed: {reason}{tail}", name(&self.paths, path));
                if held == 0 && !self.warned_no_fencing && !resent.is_empty() && !self.engine_fences(path) {
                    self.warned_no_fencing = true;
                    warn!(
                        "the target does not fence (x-braid:fence): writes of a failed path are \
                         re-sent once its connections are closed, which a plain NBD server \
                         cannot guarantee to be final"
                    );
                }
            }
            Event::Fenced { path, resent } => {
                let n: usize = resent.iter().map(|(_, n)| n).sum();
                info!("{} fenced by the target; {n} writes re-sent", name(&self.paths, path));
            }
            Event::PathRestored { path } => {
                info!("{} restored", name(&self.paths, path));
            }
            Event::NoPathTimeout { failed } => {
                warn!("no path for longer than the no-path timeout: {failed} requests failed with EIO");
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
                message: format!("server left bytes {at}..{off} of the read unanswered or answered twice"),
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

/// The engine's view of one connection's replies.
pub(crate) struct ConnSink {
    pub shared: Weak<Shared>,
    pub path: PathId,
    pub generation: u64,
    pub allocation: Option<u32>,
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
        self.with_core(|_, core| {
            let Some(info) = core.engine.chunk(cookie) else {
                return;
            };
            let Some(req) = info.req else {
                return; // a probe's data is not needed
            };
            let start = offset.unwrap_or(info.offset);
            let end = start + data.len() as u64;
            let inside = start >= info.offset && end <= info.offset + u64::from(info.len);
            let Some(p) = core.reqs.get_mut(&req.0) else {
                return;
            };
            if !inside || info.op != Op::Read {
                // Untrusted offsets: a reply outside its request is refused
                // by leaving the read short, which fails it.
                return;
            }
            *core.received.entry(cookie.0).or_default() += data.len() as u64;
            p.done
                .data
                .push((info.req_offset + (start - info.offset), data));
        });
    }
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

    fn done(&self, cookie: Cookie, error: Option<(Errno, String)>) {
        self.with_core(|shared, core| {
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
        });
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
        let id = core.engine.submit(
            now,
            crate::engine::Submit {
                op,
                offset,
                len,
                flags,
            },
        );
        core.reqs.insert(
            id.0,
            Pending {
                op,
                len,
                write,
                done: Done::default(),
                tx: Some(tx),
            },
        );
        core.act(shared);
    }
    rx.await.unwrap_or_else(|_| {
        Err(IoError::Target {
            errno: Errno::Io,
            message: "the volume was closed".into(),
        })
    })
}
