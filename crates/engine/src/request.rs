//! A request's life in the engine: submitted (or deferred behind a
//! replay), cut into pieces, answered piece by piece, and completed once,
//! with what its success makes durable or puts in the replay window.

use std::time::Duration;

use braid_block::{Error, ErrorKind, Flags};
use braid_proto::Cookie;

use super::window::Extent;
use super::writeback::Writeback;
use super::{Action, Engine, IoError, Op, Origin, Piece, ReqId, Submit, UserReq, NONDATA_PIECE};

impl Engine {
    /// Submits a request; its completion comes as [`Action::Complete`].
    pub fn submit(&mut self, now: Duration, s: Submit) -> ReqId {
        let id = self.new_request(&s, Origin::User, now);
        let cost = Writeback::cost(s.op, s.flags, s.payload.as_ref());
        if cost > 0 {
            self.writeback_admit(now, cost);
        }
        if self.replay.is_some() {
            // Nothing new may land, or read, before the restarted target
            // has back what it acknowledged.
            self.deferred.push_back((id, s, now));
            return id;
        }
        self.start(now, id, s, now);
        id
    }

    /// Registers a request; the caller starts it.
    pub(super) fn new_request(&mut self, s: &Submit, origin: Origin, now: Duration) -> ReqId {
        let id = ReqId(self.next_req);
        self.next_req += 1;
        let write_seq = (s.op.is_write() && origin == Origin::User).then(|| {
            let seq = self.next_write_seq;
            self.next_write_seq += 1;
            self.open_writes.insert(seq);
            seq
        });
        self.reqs
            .insert(id.0, UserReq::new(s, origin, write_seq, now));
        id
    }

    /// Cuts a registered request into pieces and sends them (or holds
    /// them, as the flush rule and the policy say). `since` is when it
    /// came, for the no-path timeout.
    pub(super) fn start(&mut self, now: Duration, id: ReqId, s: Submit, since: Duration) {
        let piece = |req_offset: u64, len: u64| Piece::of(id, &s, req_offset, len, since);
        let mut placed: Vec<Piece> = Vec::new();
        match s.op {
            Op::Read | Op::Write => {
                self.submit_data(now, id, s, since);
                return;
            }
            Op::Flush => {
                let covers = self.next_write_seq - 1;
                let p = piece(0, 0);
                if let Some(r) = self.reqs.get_mut(&id.0) {
                    r.pending = 1;
                }
                if self.open_writes.range(..=covers).next().is_some() {
                    self.held_flushes.push((p, covers));
                } else {
                    self.dispatch(now, p);
                }
                return;
            }
            Op::BlockStatus => placed.push(piece(0, s.len.min(u64::from(u32::MAX)))),
            Op::Trim | Op::WriteZeroes | Op::Cache => {
                let mut at = 0;
                while at < s.len || (at == 0 && s.len == 0) {
                    let n = (s.len - at).min(NONDATA_PIECE);
                    placed.push(piece(at, n));
                    at += n.max(1);
                }
            }
        }
        if let Some(r) = self.reqs.get_mut(&id.0) {
            r.pending = placed.len() as u32;
        }
        for p in placed {
            self.dispatch(now, p);
        }
    }

    /// A reply to the chunk `cookie` arrived: `Ok`, or the error the target
    /// sent. Replies for chunks already moved elsewhere are ignored.
    pub fn reply(&mut self, now: Duration, cookie: Cookie, outcome: Result<(), Error>) {
        self.take_reply(now, cookie, outcome);
        self.release_backlog(now);
        self.release_held(now);
    }

    fn take_reply(&mut self, now: Duration, cookie: Cookie, outcome: Result<(), Error>) {
        let Some(chunk) = self.chunks.remove(&cookie.0) else {
            return;
        };
        let path = &mut self.paths[chunk.path];
        path.completed(chunk.conn, chunk.bytes, chunk.ahead, chunk.sent_at, now);
        if chunk.piece.is_some() {
            // Probes are the engine's, not the user's: their latency would
            // flatter an idle path.
            let service = now.saturating_sub(chunk.sent_at);
            path.latency_hist.record(service);
            path.recent_latency.record(now, service);
        }
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
        // Any answer shows which target the path leads to (`restart.rs`).
        self.witnessed(now, chunk.path, chunk.sent_at);
        let Some(piece) = chunk.piece else {
            return; // a probe, or a piece taken back: its reply was all
        };
        match outcome {
            Ok(()) if piece.op.is_write() => {
                if let Some(r) = self.reqs.get_mut(&piece.req.0) {
                    r.acked.push((piece.req_offset, piece.len, chunk.epoch));
                }
            }
            Ok(()) => {}
            Err(Error {
                kind: ErrorKind::ShuttingDown,
                message,
            }) => {
                // The target is going away on this path: try elsewhere.
                let reason = format!("target shutting down: {message}");
                self.path_failed(now, super::PathId(chunk.path), &reason);
                self.dispatch(now, piece);
                return;
            }
            Err(Error { kind, message }) => {
                if let Some(r) = self.reqs.get_mut(&piece.req.0) {
                    r.error.get_or_insert(IoError::Target { kind, message });
                }
            }
        }
        self.piece_done(now, piece.req, Some(chunk.path));
    }

    /// One of `req`'s pieces ended, on path `on` if it was answered.
    pub(super) fn piece_done(&mut self, now: Duration, req: ReqId, on: Option<usize>) {
        let Some(r) = self.reqs.get_mut(&req.0) else {
            return;
        };
        r.pending = r.pending.saturating_sub(1);
        if r.pending > 0 {
            return;
        }
        let r = self.reqs.remove(&req.0).expect("present above");
        if let (Some(last), None, true) = (on, &r.error, r.split.len() > 1) {
            self.learn_lateness(&r.split, last, now.saturating_sub(r.placed));
        }
        if let Some(seq) = r.write_seq {
            self.open_writes.remove(&seq);
            self.release_flushes(now);
        }
        match r.origin {
            Origin::Replay => return self.replay_write_done(now, r),
            Origin::Writeback => return self.writeback_done(now, req, r),
            Origin::User => {}
        }
        self.writeback_settled(Writeback::cost(r.op, r.flags, r.payload.as_ref()));
        let result = self.conclude(&r);
        if let Err(e) = &result {
            self.counters.errors_returned += 1;
            if e.kind() == ErrorKind::Io {
                self.counters.eio_returned += 1;
            }
            if matches!(e, IoError::NoPath(_)) {
                self.counters.no_path_timeouts += 1;
            }
        }
        self.actions.push_back(Action::Complete { req, result });
    }

    /// What a user's request that ended tells the window, and what its
    /// caller is told: while acknowledged writes may be lost, no FLUSH or
    /// FUA write may say that data is safe.
    fn conclude(&mut self, r: &UserReq) -> Result<(), IoError> {
        if let Some(e) = &r.error {
            return Err(e.clone());
        }
        let fua = r.flags.fua();
        match r.op {
            Op::Write => {
                if let Some(p) = &r.payload {
                    self.window.acked_data(r.offset, p, fua);
                }
            }
            #[cfg(test)]
            Op::WriteZeroes | Op::Trim if self.undo.zeroes => self.window.punch(r.offset, r.len),
            Op::WriteZeroes => {
                let flags = r.flags.without(Flags::FUA);
                let extent = Extent::Zeroes { len: r.len, flags };
                self.window.acked_extent(r.offset, extent, fua);
            }
            Op::Trim => {
                let extent = Extent::Trim { len: r.len };
                self.window.acked_extent(r.offset, extent, fua);
            }
            Op::Flush => self.window.flushed(r.mark),
            Op::Read | Op::Cache | Op::BlockStatus => {}
        }
        let promises = r.op == Op::Flush || (r.op.is_write() && fua);
        match &self.lost {
            Some((_, cause)) if promises => {
                self.counters.lost_flushes += 1;
                let e = IoError::Lost(cause.clone());
                #[cfg(test)]
                if self.undo.loss_once {
                    self.lost = None;
                }
                Err(e)
            }
            _ => Ok(()),
        }
    }

    /// Whether a FLUSH now would make durable anything that is not
    /// already, or has a loss to report: a write, zeroing or trim not yet
    /// answered, or answered since the last FLUSH that succeeded (kept in
    /// the replay window, which a replay also gives back from, or let go
    /// from it), or a loss of acknowledged writes. A front end that is
    /// stopping skips its last FLUSH when this is `false`, so that it
    /// need not wait for a path to carry a FLUSH that covers nothing.
    pub fn unflushed(&self) -> bool {
        !self.window.is_empty()
            || self.window.overflowed()
            || !self.open_writes.is_empty()
            || self.lost.is_some()
    }

    pub(super) fn release_flushes(&mut self, now: Duration) {
        let oldest_open = self.open_writes.first().copied().unwrap_or(u64::MAX);
        let (ready, held): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held_flushes)
            .into_iter()
            .partition(|(_, covers)| *covers < oldest_open);
        self.held_flushes = held;
        for (p, _) in ready {
            self.dispatch(now, p);
        }
    }
}
