//! A path's life: up, failed (its chunks re-sent, its writes held for the
//! fence), reconnected; and the clock that finds silent paths, probes idle
//! ones and fails requests that found no path in time.

use std::time::Duration;

use braid_block::Flags;
use braid_proto::braid_ns::ConnId;
use braid_proto::Cookie;

use super::{
    path, Action, Chunk, Engine, Event, FenceId, Instance, IoError, Op, PathId, PathState,
    PendingFence, Piece, SendChunk, UNMEASURED_THROUGHPUT,
};

impl Engine {
    /// The path's connections are up: it carries I/O from now on.
    /// `server_ids` are the target's ids of each connection (for fencing),
    /// `fencing` whether the target fences. The target says nothing of its
    /// life (see [`Self::path_up_with`]).
    pub fn path_up(
        &mut self,
        now: Duration,
        path: PathId,
        server_ids: Vec<Option<ConnId>>,
        fencing: bool,
    ) {
        self.path_up_with(now, path, server_ids, fencing, Instance::Unknown);
    }

    /// [`Self::path_up`], with what the connections say of the target's
    /// life: another instance than the volume knew is a restart, handled
    /// before the path carries anything (`restart.rs`). A path told of a
    /// reset may wait (in state `Connecting`) until the engine knows
    /// whether that reset is one it has handled; it then comes up by
    /// itself.
    pub fn path_up_with(
        &mut self,
        now: Duration,
        path: PathId,
        server_ids: Vec<Option<ConnId>>,
        fencing: bool,
        instance: Instance,
    ) {
        if self.arriving(now, path.0, &server_ids, fencing, instance) {
            self.bring_up(now, path, server_ids, fencing);
        } else {
            self.paths[path.0].state = PathState::Connecting;
        }
        self.release_held(now);
    }

    pub(super) fn bring_up(
        &mut self,
        now: Duration,
        path: PathId,
        server_ids: Vec<Option<ConnId>>,
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
        p.lateness = Default::default();
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
        self.release_backlog(now);
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
        let server_ids: Vec<ConnId> = p.conns.iter().filter_map(|c| c.server_id).collect();
        let fencing = p.fencing;
        let epoch = p.epoch;
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
            if let Some(mut piece) = c.piece {
                // Its wait for a path starts now, not at submission: the
                // no-path timeout is how long I/O goes without a path.
                piece.since = now;
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
            // This failure's own fence: its writes wait for exactly these
            // connections to be fenced, whatever other failures of the
            // same path (before or after) are still being fenced.
            let n = writes.len();
            let fence = FenceId(self.next_fence);
            self.next_fence += 1;
            self.fences.insert(
                fence,
                PendingFence {
                    path,
                    epoch,
                    held: writes,
                    unsettled: Vec::new(),
                },
            );
            self.actions.push_back(Action::Fence {
                path,
                fence,
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
        self.witness_lost(now, path.0);
        self.release_backlog(now);
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
        let cfg = &self.cfg;
        let after = match p.attempts.checked_sub(cfg.reconnect_fast_attempts) {
            None => cfg
                .reconnect_min
                .saturating_mul(1 << p.attempts.min(16))
                .min(cfg.reconnect_max),
            Some(slow) => cfg
                .reconnect_max
                .saturating_mul(1 << (slow + 1).min(16))
                .min(cfg.reconnect_slow_max.max(cfg.reconnect_max)),
        };
        p.attempts += 1;
        self.actions.push_back(Action::Reconnect { path, after });
    }

    /// The fence asked by [`Action::Fence`] completed: the writes it held
    /// (and only those) are re-sent. A fence confirmed twice, or unknown,
    /// changes nothing.
    pub fn fence_done(&mut self, now: Duration, fence: FenceId) {
        self.release_fence(now, fence, true);
    }

    /// Re-sends what `fence` held: it was confirmed by the target, or
    /// (`confirmed` false) the process that held its connections is gone.
    pub(super) fn release_fence(&mut self, now: Duration, fence: FenceId, confirmed: bool) {
        let Some(PendingFence { path, held, .. }) = self.fences.remove(&fence) else {
            return;
        };
        if confirmed {
            self.counters.fences += 1;
        }
        let mut resent = Vec::new();
        for piece in held {
            if let Some(to) = self.dispatch(now, piece) {
                count_into(&mut resent, to);
            }
        }
        if confirmed {
            self.actions.push_back(Action::Event(Event::Fenced {
                path,
                fence,
                resent,
            }));
        }
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
                self.judge_busy_path(now, i, limit);
            } else if p.enabled
                && now.saturating_sub(p.last_activity) >= self.cfg.probe_interval
                && self.cfg.size > 0
            {
                self.probe(now, i);
            }
        }
        self.expire(now);
        self.confirm_deadlines(now);
        self.release_backlog(now);
        self.release_held(now);
    }

    /// A busy path whose replies are `limit` late is dead only if its
    /// connection does not answer either (see `liveness.rs`): half way to
    /// the limit a probe goes out; at the limit, bytes the peer has
    /// acknowledged since (or the probe's reply) show it alive and it is
    /// waited for, up to its patience; silence fails it.
    fn judge_busy_path(&mut self, now: Duration, i: usize, limit: Duration) {
        let p = &self.paths[i];
        let quiet = now.saturating_sub(p.liveness.quiet_since(p.last_progress));
        let oldest = self
            .chunks
            .values()
            .filter(|c| c.path == i && c.piece.is_some())
            .map(|c| c.sent_at)
            .min();
        let waited = oldest.map_or(Duration::ZERO, |t| now.saturating_sub(t));
        let patience = p
            .liveness
            .patience(self.cfg.slow_reply_min, self.cfg.slow_reply_max);
        if waited > patience.max(limit) {
            let reason = format!(
                "no reply in {:.1} s, though its connection answers (slower than anything it \
                 has done: patience {:.0} s)",
                waited.as_secs_f64(),
                patience.as_secs_f64()
            );
            self.path_failed(now, PathId(i), &reason);
            return;
        }
        if quiet > limit / 2 && !p.liveness.probe_out() {
            self.probe(now, i);
            self.paths[i].liveness.probe_sent(now);
            return;
        }
        if quiet > limit {
            if self.paths[i].liveness.answered(now) {
                return;
            }
            // The limit can shrink under a silence already long (another
            // path's writes land here and the link is measured fast), so a
            // probe may go out with the path already past it: the probe
            // still gets the half limit every probe gets, or a live path
            // is failed a tick after it, before its ACK could come.
            let probe_age = self.paths[i].liveness.probe_age(now);
            if probe_age.is_some_and(|age| age <= limit / 2) {
                return;
            }
            let reason = format!(
                "no reply in {:.1} s, and its connection does not answer ({})",
                quiet.as_secs_f64(),
                self.paths[i].liveness.silence(now)
            );
            self.path_failed(now, PathId(i), &reason);
        }
    }

    pub(super) fn probe(&mut self, now: Duration, path: usize) {
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
        let epoch = self.paths[path].epoch;
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
                epoch,
            },
        );
        self.actions.push_back(Action::Send(SendChunk {
            path: PathId(path),
            conn,
            cookie: Cookie(cookie),
            op: Op::Read,
            flags: Flags::empty(),
            offset: 0,
            len,
            req: None,
            req_offset: 0,
            payload: None,
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
        for f in self.fences.values_mut() {
            let mut gone = Vec::new();
            f.held.retain(|p| {
                let keep = now.saturating_sub(p.since) < limit;
                if !keep {
                    gone.push(p.clone());
                }
                keep
            });
            for p in &gone {
                if p.op.is_write() {
                    f.unsettled.push((p.offset, u64::from(p.len)));
                }
            }
            expired.extend(gone);
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

    pub(super) fn fail_piece(&mut self, now: Duration, p: Piece) {
        if let Some(r) = self.reqs.get_mut(&p.req.0) {
            r.error
                .get_or_insert(IoError::NoPath(now.saturating_sub(p.since)));
        }
        self.piece_done(now, p.req, None);
    }
}

fn count_into(v: &mut Vec<(PathId, usize)>, path: usize) {
    match v.iter_mut().find(|(p, _)| p.0 == path) {
        Some((_, n)) => *n += 1,
        None => v.push((PathId(path), 1)),
    }
}
