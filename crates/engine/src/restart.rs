//! A target that restarted: seen, replayed, or reported lost.
//!
//! A target that comes back as another process (a new `x-braid:instance`,
//! or a session told of a power on) may have lost everything it
//! acknowledged and never made durable. Each restart seen is an epoch:
//! every path, and every chunk sent, records the epoch it led to. When a
//! new one is seen:
//!
//! - paths still up on the old target are failed (their connections lead
//!   to a process that is gone), and fences of its connections are done:
//!   nothing they held can land any more;
//! - the window is written again, whole, before anything of the user's:
//!   requests that come meanwhile wait in order, and every piece of the
//!   user's requests still under way waits too, then goes (again) after
//!   it: a write's pieces the old target answered are as lost as any
//!   unflushed write, and a piece out on a path to the new target may land
//!   before the replay of its range, which would then put older data over
//!   it. So no read sees data older than an acknowledged write, no FLUSH
//!   answers for data not there, and nothing replayed lands over newer;
//! - a restart during a replay starts the replay again; the old replay's
//!   writes are not sent again but are waited for, lest one land late;
//! - if the window had let writes go (it overflowed), or a replay write
//!   failed, acknowledged data may be gone: the volume is lost, and every
//!   FLUSH and FUA write fails until the loss is cleared — on every
//!   request, not once.
//!
//! A session told of a reset cannot say which reset: after one restart
//! every path's new session is told. Such a sign is the restart already
//! handled if a path that came up since that restart still answers (its
//! connection would have died with another restart): the new path waits
//! for an answer from such a witness, and only if none comes is the sign a
//! new restart.

use std::time::Duration;

use braid_block::Flags;
use braid_proto::braid_ns::ConnId;

use super::window::Extent;
use super::{
    Action, Engine, Event, FenceId, Op, Origin, PathId, PathState, Piece, ReplayReport, Submit,
    UserReq,
};

/// Each of the fixes this module makes, undone, for tests that show the
/// simulator finds what each one prevents.
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Undo {
    /// Pieces of a write under way that the old target answered are not
    /// sent again (the write is assumed to land whole on the new one).
    pub split_writes: bool,
    /// A FLUSH makes a window that let writes go whole again.
    pub overflow: bool,
    /// The user's reads go out during a replay.
    pub reads_during_replay: bool,
    /// Zeroing and trims are not kept in the window.
    pub zeroes: bool,
    /// A restart takes the ranges of every write under way out of the
    /// window, the replay's own included.
    pub punch_replay: bool,
    /// Every reset a new session is told of is a restart.
    pub every_reset: bool,
    /// A loss fails one FLUSH, then is forgotten.
    pub loss_once: bool,
    /// The engine sends no FLUSH of its own (`writeback.rs`).
    pub no_writeback: bool,
    /// A restart does not cancel the engine's FLUSH out.
    pub writeback_kept: bool,
}

/// Bytes of replay writes out at once. The window goes out a part at a
/// time so that paths that come back during the replay take their share
/// (placed all at once, it all went to the first path back: a 255 MiB
/// replay over 2 x 1gbit ran at one link's 117 MB/s), and so that what
/// the paths hold stays what the policy would give them.
const REPLAY_INFLIGHT: u64 = 16 << 20;

/// A replay under way.
#[derive(Debug)]
pub(crate) struct ReplayRun {
    /// When the restart it answers was seen.
    started: Duration,
    /// Replay writes not ended, of this replay and of any it replaced.
    outstanding: usize,
    /// Extents of the window not yet sent, oldest first, and the bytes of
    /// those out.
    queue: std::collections::VecDeque<(u64, Extent)>,
    inflight: u64,
    bytes: u64,
    extents: usize,
    /// Why a replay write could not land, if one could not.
    failed: Option<String>,
    /// Being set up: it cannot end before all its writes are counted.
    starting: bool,
}

/// A path whose new session told of a reset, not yet up.
#[derive(Debug)]
pub(crate) struct Confirm {
    path: usize,
    ids: Vec<Option<ConnId>>,
    fencing: bool,
    parked: Duration,
    /// Paths up since the last restart seen: an answer from any of them
    /// to a request sent after `parked` shows the target is the same.
    witnesses: Vec<usize>,
}

impl Engine {
    /// A path's connections are up and say this of the target's life.
    /// Returns `false` when the path must wait to learn whether a reset
    /// it was told of is the restart already handled (it comes up later,
    /// by itself).
    pub(super) fn arriving(
        &mut self,
        now: Duration,
        path: usize,
        ids: &[Option<ConnId>],
        fencing: bool,
        instance: super::Instance,
    ) -> bool {
        use super::Instance;
        match instance {
            Instance::Unknown => {}
            Instance::Known(id) => {
                self.signals = true;
                if self.instance.replace(id).is_some_and(|before| before != id) {
                    let how = format!("new instance {id:032x}");
                    self.restarted(now, Some(path), how, true);
                }
            }
            Instance::ResetSeen => {
                self.signals = true;
                let witnesses = self.witnesses(path);
                if witnesses.is_empty() {
                    let how = "a new session was told of a power on or reset (29h)";
                    self.restarted(now, Some(path), how.to_owned(), false);
                } else {
                    for &w in &witnesses {
                        self.probe(now, w);
                    }
                    self.confirming.push(Confirm {
                        path,
                        ids: ids.to_vec(),
                        fencing,
                        parked: now,
                        witnesses,
                    });
                    return false;
                }
            }
        }
        self.paths[path].epoch = self.epoch;
        true
    }

    /// Paths up since the last restart seen, other than `path`.
    fn witnesses(&self, path: usize) -> Vec<usize> {
        #[cfg(test)]
        if self.undo.every_reset {
            return Vec::new();
        }
        (0..self.paths.len())
            .filter(|&i| {
                i != path
                    && self.paths[i].state == PathState::Active
                    && self.paths[i].epoch == self.epoch
            })
            .collect()
    }

    /// The target was seen to tell of its restarts (a session's first
    /// command told of a power on, as every new session is after one), so
    /// replay is available, though no restart is known of yet.
    pub fn restarts_told(&mut self) {
        self.signals = true;
    }

    /// The driver saw the target's instance other than on a path's new
    /// connections (a fence's connection): a new one is a restart.
    pub fn instance_seen(&mut self, now: Duration, id: u128) {
        self.signals = true;
        if self.instance.replace(id).is_some_and(|before| before != id) {
            self.restarted(now, None, format!("new instance {id:032x}"), true);
        }
        self.release_held(now);
    }

    /// A live path's session was told of a power on or reset that loses a
    /// write cache (not a LU reset by another initiator): the target may
    /// have lost what it had not made durable.
    pub fn restart_signalled(&mut self, now: Duration, path: PathId, how: &str) {
        self.signals = true;
        self.restarted(now, Some(path.0), how.to_owned(), false);
        self.release_held(now);
    }

    /// Clears a loss (an operator's decision that what was lost is dealt
    /// with): FLUSH and FUA writes succeed again. Returns what it cleared.
    pub fn clear_loss(&mut self) -> Option<(Duration, String)> {
        self.lost.take()
    }

    /// The replay window and the loss state.
    pub fn replay_report(&self) -> ReplayReport {
        ReplayReport {
            available: self.signals,
            window_bytes: self.window.bytes(),
            window_pinned: self.window.pinned(),
            window_limit: self.window.limit(),
            overflowed: self.window.overflowed(),
            restarts: self.counters.restarts,
            replaying: self.replay.is_some(),
            last_replay: self.last_replay,
            lost: self.lost.clone(),
            lost_flushes: self.counters.lost_flushes,
        }
    }

    /// An answer on `path` to a chunk sent at `sent_at`: a path waiting on
    /// it as a witness learns the target is the one it knew.
    pub(super) fn witnessed(&mut self, now: Duration, path: usize, sent_at: Duration) {
        let (same, rest): (Vec<Confirm>, Vec<Confirm>) = std::mem::take(&mut self.confirming)
            .into_iter()
            .partition(|c| c.witnesses.contains(&path) && sent_at >= c.parked);
        self.confirming = rest;
        for c in same {
            self.actions
                .push_back(Action::Event(Event::RestartAlreadyHandled {
                    path: PathId(c.path),
                }));
            self.paths[c.path].epoch = self.epoch;
            self.bring_up(now, PathId(c.path), c.ids, c.fencing);
        }
    }

    /// `path` failed: a path waiting on it as its last witness learns the
    /// reset it was told of is a new restart; a waiting path that failed
    /// waits no more.
    pub(super) fn witness_lost(&mut self, now: Duration, path: usize) {
        self.confirming.retain(|c| c.path != path);
        for c in &mut self.confirming {
            c.witnesses.retain(|&w| w != path);
        }
        if let Some(i) = self.confirming.iter().position(|c| c.witnesses.is_empty()) {
            let c = self.confirming.remove(i);
            self.paths[c.path].epoch = self.epoch;
            let how = "a new session was told of a power on or reset (29h), and no path up \
                       since the last restart answers";
            self.restarted(now, Some(c.path), how.to_owned(), false);
            self.bring_up(now, PathId(c.path), c.ids, c.fencing);
        }
    }

    /// Witnesses that take longer than the reply ceiling to answer are not
    /// waited for: the sign is taken for a new restart (a replay too many
    /// costs time; a restart missed costs data).
    pub(super) fn confirm_deadlines(&mut self, now: Duration) {
        let limit = self.cfg.timeout_ceiling;
        if let Some(i) = self
            .confirming
            .iter()
            .position(|c| now.saturating_sub(c.parked) >= limit)
        {
            let c = self.confirming.remove(i);
            self.paths[c.path].epoch = self.epoch;
            let how = "a new session was told of a power on or reset (29h), and no path up \
                       since the last restart answered in time";
            self.restarted(now, Some(c.path), how.to_owned(), false);
            self.bring_up(now, PathId(c.path), c.ids, c.fencing);
        }
    }

    /// A restart was seen (through `via`'s new connections, if a path's):
    /// see the module's comment for what follows. `proven` when the target
    /// named another process: only then are the old connections known to
    /// be gone, so that their fences need not be asked. A reset sign
    /// proves less (it may be a restart already handled, taken for a new
    /// one to be safe), and every fence is still asked.
    pub(super) fn restarted(
        &mut self,
        now: Duration,
        via: Option<usize>,
        how: String,
        proven: bool,
    ) {
        self.epoch += 1;
        self.counters.restarts += 1;
        if let Some(v) = via {
            self.paths[v].epoch = self.epoch;
        }
        let confirms = std::mem::take(&mut self.confirming);
        // A replay under way is started again; its writes not sent are
        // dropped, those out are waited for.
        let mut outstanding = 0;
        for r in self.reqs.values_mut() {
            if r.origin == Origin::Replay {
                r.cancelled = true;
                outstanding += 1;
            }
        }
        self.writeback_cancel();
        self.replay = Some(ReplayRun {
            started: now,
            outstanding,
            queue: Default::default(),
            inflight: 0,
            bytes: 0,
            extents: 0,
            failed: None,
            starting: true,
        });
        self.drop_cancelled_pieces(now);
        self.take_back(via);
        for i in 0..self.paths.len() {
            let p = &self.paths[i];
            if Some(i) != via && p.epoch < self.epoch && p.state == PathState::Active {
                self.path_failed(
                    now,
                    PathId(i),
                    "the target restarted: this path's connections led to the process that is gone",
                );
            }
        }
        let gone: Vec<FenceId> = self
            .fences
            .iter()
            .filter(|(_, f)| proven && f.epoch < self.epoch)
            .map(|(id, _)| *id)
            .collect();
        for fence in gone {
            // Nothing the old process held can land: as good as fenced.
            self.release_fence(now, fence, false);
        }
        #[cfg(test)]
        if self.undo.punch_replay || self.undo.split_writes {
            self.undone_punch(now);
        }
        let resent = self.resend_answered_pieces(now);
        if self.window.overflowed() {
            self.lose(
                now,
                format!(
                    "the target restarted ({how}) when more had been acknowledged since the \
                     last FLUSH than the replay window holds (--replay-window {} MiB)",
                    self.window.limit() >> 20
                ),
            );
        }
        let (bytes, extents) = self.start_replay(now);
        self.actions
            .push_back(Action::Event(Event::TargetRestarted {
                how,
                replay_bytes: bytes,
                replay_extents: extents,
                resent,
            }));
        for c in confirms {
            self.paths[c.path].epoch = self.epoch;
            self.bring_up(now, PathId(c.path), c.ids, c.fencing);
        }
        if let Some(run) = &mut self.replay {
            run.starting = false;
            if run.outstanding == 0 && run.queue.is_empty() {
                self.finish_replay(now);
            }
        }
    }

    /// Pieces of a replaced replay that wait for a path are not sent: they
    /// end here. Those out are waited for, and so are those a fence holds
    /// (a copy may still land until the fence is confirmed).
    fn drop_cancelled_pieces(&mut self, now: Duration) {
        let waiting = std::mem::take(&mut self.waiting);
        let mut dropped = Vec::new();
        for p in waiting {
            if self.reqs.get(&p.req.0).is_some_and(|r| r.cancelled) {
                dropped.push(p.req);
            } else {
                self.waiting.push_back(p);
            }
        }
        for req in dropped {
            self.piece_done(now, req, None);
        }
    }

    /// The user's pieces out on a path already at the new target (a reset
    /// told late) were answered, or will be, before the replay: their
    /// answers are ignored, and they go again after it. (Those out on paths
    /// to the old target go back when those paths fail.)
    fn take_back(&mut self, via: Option<usize>) {
        let Some(via) = via else { return };
        let mut cookies: Vec<u64> = self
            .chunks
            .iter()
            .filter(|(_, c)| c.path == via)
            .map(|(k, _)| *k)
            .collect();
        cookies.sort_unstable();
        for k in cookies {
            let chunk = self.chunks.get_mut(&k).expect("listed");
            let user = chunk
                .piece
                .as_ref()
                .and_then(|p| self.reqs.get(&p.req.0))
                .is_some_and(|r| r.origin == Origin::User);
            if !user {
                continue;
            }
            if chunk.op.is_write() {
                // Its copy out stays counted: the request ends only once
                // that copy is answered too, so it cannot land after a
                // newer write to its range was acknowledged.
                let piece = chunk.piece.clone().expect("a user's piece");
                if let Some(r) = self.reqs.get_mut(&piece.req.0) {
                    r.pending += 1;
                }
                self.after_replay.push(piece);
                continue;
            }
            let piece = chunk.piece.take().expect("a user's piece");
            if piece.op == Op::Read {
                self.actions.push_back(Action::Forget {
                    req: piece.req,
                    cookie: braid_proto::Cookie(k),
                });
            }
            self.after_replay.push(piece);
        }
    }

    /// Every piece of a write still under way that an earlier target
    /// answered goes again after the replay: it may be lost, and the
    /// replay may put older data over it (FUA pieces too).
    fn resend_answered_pieces(&mut self, now: Duration) -> usize {
        #[cfg(test)]
        if self.undo.split_writes {
            return 0;
        }
        let epoch = self.epoch;
        let mut again = Vec::new();
        for (&id, r) in self.reqs.iter_mut() {
            if r.origin != Origin::User || !r.writing() {
                continue;
            }
            let (old, kept): (Vec<_>, Vec<_>) = r.acked.drain(..).partition(|a| a.2 < epoch);
            r.acked = kept;
            for (req_offset, len, _) in old {
                r.pending += 1;
                again.push(piece_of(super::ReqId(id), r, req_offset, len, now));
            }
        }
        again.sort_by_key(|p| (p.req, p.req_offset));
        let n = again.len();
        self.after_replay.extend(again);
        n
    }

    /// Writes the window again (a part at a time, see [`REPLAY_INFLIGHT`]).
    /// Returns its bytes and extents.
    fn start_replay(&mut self, now: Duration) -> (u64, usize) {
        let extents = self.window.to_replay();
        let bytes: u64 = extents.iter().map(|(_, e)| e.len()).sum();
        let n = extents.len();
        if let Some(run) = &mut self.replay {
            run.bytes = bytes;
            run.extents = n;
            run.queue = extents.into();
        }
        self.counters.replay_bytes += bytes;
        self.feed_replay(now);
        (bytes, n)
    }

    /// Sends the window's next extents while fewer than
    /// [`REPLAY_INFLIGHT`] bytes of it are out.
    fn feed_replay(&mut self, now: Duration) {
        loop {
            let Some(run) = &mut self.replay else { return };
            if run.inflight >= REPLAY_INFLIGHT {
                return;
            }
            let Some((offset, extent)) = run.queue.pop_front() else {
                return;
            };
            run.outstanding += 1;
            // Zeroing and trims cost the link almost nothing.
            if let Extent::Data(d) = &extent {
                run.inflight += d.len() as u64;
            }
            let s = match extent {
                Extent::Data(data) => {
                    Submit::write(offset, Flags::empty(), super::Payload::new(data))
                }
                Extent::Zeroes { len, flags } => Submit::new(Op::WriteZeroes, offset, len, flags),
                Extent::Trim { len } => Submit::new(Op::Trim, offset, len, Flags::empty()),
            };
            let id = self.new_request(&s, Origin::Replay, now);
            if s.op == Op::Write {
                self.place(now, id, &s, now);
            } else {
                self.start(now, id, s, now);
            }
        }
    }

    /// A replay write ended (`r` is its request).
    pub(super) fn replay_write_done(&mut self, now: Duration, r: UserReq) {
        let Some(run) = &mut self.replay else {
            return;
        };
        run.outstanding = run.outstanding.saturating_sub(1);
        if !r.cancelled && r.op == Op::Write {
            run.inflight = run.inflight.saturating_sub(r.len);
        }
        if let (Some(e), false) = (&r.error, r.cancelled) {
            run.failed.get_or_insert_with(|| {
                format!("replaying {} bytes at offset {}: {e}", r.len, r.offset)
            });
        }
        let done = run.outstanding == 0 && run.queue.is_empty() && !run.starting;
        if done {
            self.finish_replay(now);
        } else {
            self.feed_replay(now);
        }
    }

    /// The window has landed (or could not): what waited for it goes on.
    fn finish_replay(&mut self, now: Duration) {
        let Some(run) = self.replay.take() else {
            return;
        };
        let took = now.saturating_sub(run.started);
        self.last_replay = Some((run.bytes, took));
        self.actions.push_back(Action::Event(Event::Replayed {
            bytes: run.bytes,
            extents: run.extents,
            took,
            failed: run.failed.clone(),
        }));
        if let Some(why) = run.failed {
            self.lose(
                now,
                format!("the target restarted and its replay failed: {why}"),
            );
        }
        let after = std::mem::take(&mut self.after_replay);
        for p in after {
            self.dispatch(now, p);
        }
        self.release_held(now);
        let deferred = std::mem::take(&mut self.deferred);
        for (id, s, since) in deferred {
            self.start(now, id, s, since);
        }
    }

    /// Acknowledged writes may be gone: from now on every FLUSH and FUA
    /// write fails, until [`Self::clear_loss`]. The first cause is kept.
    pub(super) fn lose(&mut self, now: Duration, cause: String) {
        if self.lost.is_some() {
            return;
        }
        self.counters.losses += 1;
        self.lost = Some((now, cause.clone()));
        self.actions.push_back(Action::Event(Event::Lost { cause }));
    }
}

#[cfg(test)]
impl Engine {
    pub(crate) fn set_undo(&mut self, undo: Undo) {
        self.window.undo_overflow = undo.overflow;
        self.undo = undo;
    }

    /// What restarts did before: every write under way (the replay's
    /// own, with `punch_replay`) is newer than the window, so its range
    /// leaves the window, and it goes on as it was.
    fn undone_punch(&mut self, now: Duration) {
        let replay = self.undo.punch_replay;
        let ranges: Vec<(u64, u64)> = self
            .reqs
            .values()
            .filter(|r| r.writing() && (r.origin == Origin::User || replay))
            .map(|r| (r.offset, r.len))
            .collect();
        for (offset, len) in ranges {
            self.window.punch(offset, len);
        }
        if self.undo.split_writes {
            // The pieces waiting for the replay go out now.
            let held = std::mem::take(&mut self.after_replay);
            let (writes, rest): (Vec<Piece>, Vec<Piece>) =
                held.into_iter().partition(|p| p.op.is_write());
            self.after_replay = rest;
            let run = self.replay.take();
            for p in writes {
                self.dispatch(now, p);
            }
            self.replay = run;
        }
    }
}

/// Bytes `[req_offset, req_offset + len)` of request `r` as a piece.
fn piece_of(req: super::ReqId, r: &UserReq, req_offset: u64, len: u32, now: Duration) -> Piece {
    Piece {
        req,
        op: r.op,
        flags: r.flags,
        offset: r.offset + req_offset,
        len,
        req_offset,
        since: now,
    }
}
