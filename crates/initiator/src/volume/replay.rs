//! The replay window: writes the target acknowledged since the last FLUSH
//! that succeeded, kept so that a target that restarted (a new
//! `x-braid:instance`, which may have lost what it never flushed) can be
//! given them again before anything else, as NFS clients resend unstable
//! writes when the server's write verifier changes.
//!
//! A FUA write, or a FLUSH that covered a write, makes it durable: it
//! leaves the window. A later write over the same range replaces what it
//! overlaps, so a replay never puts old data over newer. Past its byte
//! limit the window gives up (it keeps nothing, and says so): a restart
//! seen while it is over the limit makes the next FLUSH fail with EIO, as
//! the writes it cannot give back may be gone.

use std::collections::BTreeMap;

use bytes::Bytes;

/// Acknowledged, unflushed writes by acknowledgement order.
#[derive(Debug, Default)]
pub(crate) struct ReplayWindow {
    /// (seq, offset) → data; seq grows with each acknowledgement, and the
    /// pieces a later write leaves of an entry keep its seq. Entries never
    /// overlap.
    entries: BTreeMap<(u64, u64), Bytes>,
    /// offset → seq of every entry: the same entries by where they lie,
    /// so that a write finds what it overlaps without looking at the whole
    /// window (which holds thousands of small writes between FLUSHes).
    by_offset: BTreeMap<u64, u64>,
    next_seq: u64,
    bytes: u64,
    limit: u64,
    /// More was acknowledged since the last FLUSH than the window holds.
    overflowed: bool,
}

impl ReplayWindow {
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// A write the target acknowledged. A FUA write is already durable:
    /// it only replaces older data in its range.
    pub fn acked(&mut self, offset: u64, data: Bytes, fua: bool) {
        self.punch(offset, data.len() as u64);
        if fua || self.overflowed || data.is_empty() {
            return;
        }
        if self.bytes + data.len() as u64 > self.limit {
            self.entries.clear();
            self.by_offset.clear();
            self.bytes = 0;
            self.overflowed = true;
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.put(seq, offset, data);
    }

    fn put(&mut self, seq: u64, offset: u64, data: Bytes) {
        self.bytes += data.len() as u64;
        self.by_offset.insert(offset, seq);
        self.entries.insert((seq, offset), data);
    }

    fn take(&mut self, seq: u64, offset: u64) -> Bytes {
        self.by_offset.remove(&offset);
        let d = self.entries.remove(&(seq, offset)).expect("indexed");
        self.bytes -= d.len() as u64;
        d
    }

    /// A FLUSH is being sent: it covers what was acknowledged so far. The
    /// mark goes to [`Self::flushed`] when it succeeds.
    pub fn mark(&self) -> u64 {
        self.next_seq
    }

    /// The FLUSH with `mark` succeeded: what it covered is durable. A
    /// window that had overflowed is whole again from here.
    pub fn flushed(&mut self, mark: u64) {
        let kept = self.entries.split_off(&(mark, 0));
        for &(_, o) in self.entries.keys() {
            self.by_offset.remove(&o);
        }
        self.entries = kept;
        self.bytes = self.entries.values().map(|d| d.len() as u64).sum();
        self.overflowed = false;
    }

    /// Forgets `[offset, offset + len)`: newer data is (or will be) there.
    pub fn punch(&mut self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let end = offset + len;
        // Entries never overlap, so by offset they also end in order: going
        // down from `end`, the first that ends at or before `offset` ends
        // the search.
        let mut hit = Vec::new();
        for (&o, &seq) in self.by_offset.range(..end).rev() {
            let d_end = o + self.entries[&(seq, o)].len() as u64;
            if d_end <= offset {
                break;
            }
            hit.push((seq, o));
        }
        for (seq, o) in hit {
            let d = self.take(seq, o);
            let d_end = o + d.len() as u64;
            // What lies outside the punched range stays, with its seq.
            if o < offset {
                self.put(seq, o, d.slice(..(offset - o) as usize));
            }
            if d_end > end {
                self.put(seq, end, d.slice((end - o) as usize..));
            }
        }
    }

    /// What to write again, oldest first; the window keeps it (it is still
    /// unflushed until a FLUSH succeeds).
    pub fn to_replay(&self) -> Vec<(u64, Bytes)> {
        self.entries
            .iter()
            .map(|((_, o), d)| (*o, d.clone()))
            .collect()
    }

    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// The driver's side of replay: the window, the instance the volume last
/// saw, and a replay under way (new requests wait behind it).
#[derive(Debug, Default)]
pub(crate) struct ReplayState {
    pub window: ReplayWindow,
    /// The target instance the volume's paths lead to; `None` from a target
    /// that does not say (replay is then unavailable).
    pub instance: Option<braid_proto::braid_ns::InstanceId>,
    /// The target reported an instance at open: replay is available.
    pub available: bool,
    /// Replay writes not yet completed.
    pub replaying: usize,
    /// Requests that came during a replay, in order: (engine request, the
    /// caller's state).
    pub deferred: std::collections::VecDeque<(crate::engine::Submit, super::core::Pending)>,
    /// FLUSHes that were out when the target restarted: sent again after
    /// the replay, so their success covers it.
    pub redo_flush: std::collections::HashSet<u64>,
    /// The target restarted while writes were acknowledged that could not
    /// be replayed: the next FLUSH fails with EIO.
    pub lost: bool,
    /// Times a restarted target was given the window again.
    pub replays: u64,
    /// FLUSHes failed because acknowledged writes may be gone.
    pub lost_flushes: u64,
}

impl super::core::Core {
    /// Keeps the window up to date with a request's outcome; a FLUSH after
    /// a restart that lost writes fails here.
    pub(super) fn account(
        &mut self,
        p: &super::core::Pending,
        result: Result<(), crate::engine::IoError>,
    ) -> Result<(), crate::engine::IoError> {
        use crate::engine::Op;
        let r = &mut self.replay;
        match (p.op, &result) {
            (Op::Write, Ok(())) => {
                if let Some(data) = &p.write {
                    let fua = p.flags.0 & braid_proto::CmdFlags::FUA != 0;
                    r.window.acked(p.offset, data.clone(), fua);
                }
            }
            (Op::Trim | Op::WriteZeroes, Ok(())) => r.window.punch(p.offset, p.len),
            (Op::Flush, Ok(())) if r.lost => {
                r.lost = false;
                r.lost_flushes += 1;
                tracing::error!(
                    "FLUSH failed: the target restarted while more writes were acknowledged \
                     since the last FLUSH than the replay window holds (--replay-window); \
                     some may be lost"
                );
                return Err(crate::engine::IoError::Target {
                    errno: braid_proto::Errno::Io,
                    message: "the target restarted and writes it had acknowledged could not \
                              be given back"
                        .into(),
                });
            }
            (Op::Flush, Ok(())) => r.window.flushed(p.flush_mark),
            _ => {}
        }
        result
    }

    /// One replay write finished; the last one lets the waiting requests go.
    pub(super) fn replayed(&mut self, now: std::time::Duration, ok: bool) {
        if !ok {
            // Kept for the next restart; the next FLUSH says it failed.
            self.replay.lost = true;
        }
        self.replay.replaying = self.replay.replaying.saturating_sub(1);
        if self.replay.replaying == 0 {
            tracing::info!("replay done");
            let waiting: Vec<_> = self.replay.deferred.drain(..).collect();
            for (submit, p) in waiting {
                self.start(now, submit, p);
            }
        }
    }

    /// A path's connections report the target's instance. Another instance
    /// than before means the target restarted: what it acknowledged and
    /// never flushed may be gone, so the window is written again before
    /// anything new, and FLUSHes already out are asked again after it.
    /// Call before the path is handed to the engine.
    pub(super) fn saw_instance(
        &mut self,
        now: std::time::Duration,
        seen: Option<braid_proto::braid_ns::InstanceId>,
    ) {
        let Some(seen) = seen else { return };
        let before = self.replay.instance.replace(seen);
        if before.is_none_or(|b| b == seen) {
            return;
        }
        self.target_restarted(now, &format!("new instance {seen}"));
    }

    /// The target may have lost what it acknowledged and never flushed
    /// (`how` says why braid thinks so): the window is written again before
    /// anything new, and FLUSHes already out are asked again after it.
    /// Over iSCSI, which has no instance, a unit attention for a reset
    /// (29/xx) seen by a new session is the sign. Call before the path is
    /// handed to the engine.
    pub(super) fn target_restarted(&mut self, now: std::time::Duration, how: &str) {
        use crate::engine::{Op, Submit};
        self.replay.replays += 1;
        // Writes still out are newer than the window's: never replay over
        // them. FLUSHes still out cover nothing of the replay.
        for (id, p) in &self.reqs {
            match p.op {
                Op::Write | Op::Trim | Op::WriteZeroes => self.replay.window.punch(p.offset, p.len),
                Op::Flush => {
                    self.replay.redo_flush.insert(*id);
                }
                _ => {}
            }
        }
        if self.replay.window.overflowed() {
            self.replay.lost = true;
            tracing::warn!(
                "the target restarted ({how}); more writes were acknowledged since the last \
                 FLUSH than the replay window holds, so the next FLUSH fails"
            );
            return;
        }
        let writes = self.replay.window.to_replay();
        let bytes: u64 = writes.iter().map(|(_, d)| d.len() as u64).sum();
        tracing::warn!(
            "the target restarted ({how}): writing again {} writes ({bytes} bytes) it \
             acknowledged but may have lost, before anything else",
            writes.len()
        );
        let mut started = 0;
        for (offset, data) in writes {
            let len = data.len() as u64;
            let p = super::core::Pending {
                op: Op::Write,
                offset,
                len,
                flags: braid_proto::CmdFlags(0),
                write: Some(data),
                done: Default::default(),
                tx: None,
                replay: true,
                flush_mark: 0,
            };
            let submit = Submit {
                op: Op::Write,
                offset,
                len,
                flags: braid_proto::CmdFlags(0),
            };
            let id = self.engine.submit(now, submit);
            self.reqs.insert(id.0, p);
            started += 1;
        }
        self.replay.replaying += started;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random writes, FUA writes, punches and FLUSHes against a byte-level
    /// model of what the window must give back: the newest unflushed data
    /// of every byte, nothing else.
    #[test]
    fn the_window_gives_back_exactly_the_newest_unflushed_bytes() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut w = ReplayWindow::new(u64::MAX);
        // Per byte: (seq of the write that put it, value), or none.
        let mut model: Vec<Option<(u64, u8)>> = vec![None; 4096];
        let mut seq = 0u64;
        for step in 0..4000 {
            let offset = rng.gen_range(0..4000u64);
            let len = rng.gen_range(1..=(4096 - offset).min(96));
            let range = offset as usize..(offset + len) as usize;
            match rng.gen_range(0..10) {
                0 => {
                    w.punch(offset, len);
                    model[range].fill(None);
                }
                1 => {
                    w.acked(offset, b(len as usize, 1), true);
                    model[range].fill(None);
                }
                2 => {
                    let mark = w.mark();
                    w.flushed(mark);
                    model.fill(None);
                }
                _ => {
                    let v = (step % 251) as u8 + 2;
                    w.acked(offset, b(len as usize, v), false);
                    model[range].fill(Some((seq, v)));
                    seq += 1;
                }
            }
            let mut got: Vec<Option<(u64, u8)>> = vec![None; 4096];
            let mut bytes = 0;
            for (o, d) in w.to_replay() {
                for (i, v) in d.iter().enumerate() {
                    assert!(
                        got[o as usize + i].is_none(),
                        "entries overlap at {}",
                        o as usize + i
                    );
                    got[o as usize + i] = Some((0, *v));
                }
                bytes += d.len() as u64;
            }
            let strip = |m: &[Option<(u64, u8)>]| -> Vec<Option<u8>> {
                m.iter().map(|x| x.map(|(_, v)| v)).collect()
            };
            assert_eq!(strip(&got), strip(&model), "after step {step}");
            assert_eq!(w.bytes(), bytes, "byte count after step {step}");
        }
    }

    fn b(len: usize, v: u8) -> Bytes {
        Bytes::from(vec![v; len])
    }

    #[test]
    fn a_flush_makes_what_it_covered_durable_and_only_that() {
        let mut w = ReplayWindow::new(1 << 20);
        w.acked(0, b(4096, 1), false);
        let mark = w.mark();
        w.acked(8192, b(4096, 2), false);
        w.flushed(mark);
        assert_eq!(w.to_replay(), vec![(8192, b(4096, 2))]);
        assert_eq!(w.bytes(), 4096);
    }

    #[test]
    fn newer_writes_replace_what_they_overlap_so_replay_never_goes_back() {
        let mut w = ReplayWindow::new(1 << 20);
        w.acked(0, b(12288, 1), false);
        w.acked(4096, b(4096, 2), true); // FUA: durable, only punches
        assert_eq!(w.to_replay(), vec![(0, b(4096, 1)), (8192, b(4096, 1))]);
        w.acked(2048, b(8192, 3), false);
        assert_eq!(
            w.to_replay(),
            vec![(0, b(2048, 1)), (10240, b(2048, 1)), (2048, b(8192, 3))]
        );
        assert_eq!(w.bytes(), 12288);
        w.punch(0, 1 << 20);
        assert!(w.to_replay().is_empty());
        assert_eq!(w.bytes(), 0);
    }

    #[test]
    fn past_its_limit_the_window_says_so_until_a_flush() {
        let mut w = ReplayWindow::new(8192);
        w.acked(0, b(4096, 1), false);
        w.acked(4096, b(4096, 1), false);
        assert!(!w.overflowed());
        w.acked(8192, b(4096, 1), false);
        assert!(w.overflowed() && w.to_replay().is_empty());
        w.acked(0, b(4096, 1), false);
        assert!(w.to_replay().is_empty(), "nothing is kept while overflowed");
        let mark = w.mark();
        w.flushed(mark);
        assert!(!w.overflowed());
        w.acked(0, b(4096, 4), false);
        assert_eq!(w.to_replay(), vec![(0, b(4096, 4))]);
    }
}
