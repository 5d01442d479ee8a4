//! FLUSHes of the engine's own, so that a client that never sends one
//! still loses nothing to a target restart.
//!
//! VMware sends no SYNCHRONIZE CACHE, and a stream of writes between a
//! kernel's FLUSHes can be larger than the replay window: either way the
//! window filled, let its oldest writes go, and a restart then found the
//! volume lost. Like the kernel's writeback, the engine now sends a FLUSH
//! itself once the window and the writes under way reach 32 MiB (or half
//! its limit, if less); when it succeeds, what it covered is durable and
//! leaves the window. Writes that would take the window past its limit
//! wait, in order, until that FLUSH is answered, so the window never has
//! to let an acknowledged write go while a FLUSH that would cover it is
//! on its way.
//!
//! The FLUSH is the engine's: no caller waits for it, and its result
//! reaches no caller. A restart while it is out cancels it: a FLUSH the
//! new target answers says nothing of writes the old one lost, so its
//! success must not take them out of the window. One that fails is tried
//! again after [`RETRY`], twice that after a second failure in a row, and
//! so on up to [`RETRY_MAX`]; meanwhile writes go on, and the window lets its
//! oldest go as before (a restart then reports the loss).

use std::time::Duration;

use braid_block::Flags;

use super::window::ENTRY_COST;
use super::{Action, Engine, Event, Op, Origin, Payload, ReqId, Submit, UserReq};

/// The window's fill at which the engine sends its FLUSH: this, or half
/// the window if that is less. Kept small, the window stays small too: a
/// client that never flushes keeps about this much memory pinned in
/// `braid attach`, not half of the default 256 MiB, and a restart has that
/// much to replay. The rest of the window is room for writes while the
/// FLUSH is out. (Under 4 KiB random writes through attach with no FLUSH,
/// the two cost about the same CPU: 4.93-5.30 s/GiB at 32 MiB against
/// 5.15-5.80 at half, in alternating rounds on a noisy host.)
pub(super) const WRITEBACK_AT: u64 = 32 << 20;

/// How long after a failed FLUSH of its own the engine tries another...
pub(super) const RETRY: Duration = Duration::from_secs(1);
/// ...doubled after each failure in a row, up to this: a target whose
/// every FLUSH fails is asked (and the failure logged) twice a minute, not
/// every second.
pub(super) const RETRY_MAX: Duration = Duration::from_secs(30);

/// The engine's FLUSH under way, and what it covers.
#[derive(Debug, Default)]
pub(super) struct Writeback {
    /// The FLUSH out (its request), and the last write seq it covers:
    /// writes after that one are the ones that may wait for it.
    out: Option<(ReqId, u64)>,
    /// Window cost of the user's writes, zeroing and trims not yet
    /// completed: what the window will hold once they are.
    under_way: u64,
    /// No new FLUSH before this, after one failed.
    retry_at: Duration,
    /// The wait after the last failure in a row (zero after a success).
    backoff: Duration,
}

impl Writeback {
    /// What a user's request would add to the window once acknowledged.
    pub(super) fn cost(op: Op, flags: Flags, payload: Option<&Payload>) -> u64 {
        if !op.is_write() || flags.fua() {
            return 0;
        }
        let data = payload.map_or(0, |p| p.pinned.max(p.data.len() as u64));
        data + ENTRY_COST
    }
}

impl Engine {
    /// A user's write was registered (its cost is counted as under way):
    /// sends the engine's FLUSH if the window will be full enough.
    pub(super) fn writeback_admit(&mut self, now: Duration, cost: u64) {
        self.writeback.under_way += cost;
        self.writeback_maybe(now);
    }

    /// A user's write, zeroing or trim ended, acknowledged or not.
    pub(super) fn writeback_settled(&mut self, cost: u64) {
        self.writeback.under_way = self.writeback.under_way.saturating_sub(cost);
    }

    /// Sends the engine's FLUSH when the window, with what is under way,
    /// holds [`WRITEBACK_AT`] or half its limit, none is out, and no
    /// replay is under way (its writes are not the window's until they
    /// land).
    pub(super) fn writeback_maybe(&mut self, now: Duration) {
        #[cfg(test)]
        if self.undo.no_writeback {
            return;
        }
        let w = &self.writeback;
        let filled = self.window.pinned() + w.under_way;
        if w.out.is_some()
            || self.window.limit() == 0
            || self.replay.is_some()
            || now < w.retry_at
            || filled < (self.window.limit() / 2).min(WRITEBACK_AT)
        {
            return;
        }
        let s = Submit::new(Op::Flush, 0, 0, Flags::empty());
        let id = self.new_request(&s, Origin::Writeback, now);
        self.counters.writeback_flushes += 1;
        self.writeback.out = Some((id, self.next_write_seq - 1));
        self.start(now, id, s, now);
    }

    /// Whether the user's request `id` waits for the engine's FLUSH: a
    /// write, one is out that does not cover it, and the window with every
    /// write under way would pass its limit. Writes the FLUSH covers never
    /// wait (it waits for them). Costs nothing while no FLUSH is out.
    pub(super) fn writeback_holds(&self, id: ReqId) -> bool {
        let Some((_, covers)) = self.writeback.out else {
            return false;
        };
        self.window.pinned() + self.writeback.under_way > self.window.limit()
            && self
                .reqs
                .get(&id.0)
                .and_then(|r| r.write_seq)
                .is_some_and(|seq| seq > covers)
    }

    /// The engine's FLUSH `r` ended: what it covered is durable unless a
    /// restart cancelled it; one that failed is tried again later.
    pub(super) fn writeback_done(&mut self, now: Duration, id: ReqId, r: UserReq) {
        if self.writeback.out.is_some_and(|(out, _)| out == id) {
            self.writeback.out = None;
        }
        if r.cancelled {
            return;
        }
        if let Some(e) = &r.error {
            self.counters.writeback_failures += 1;
            let w = &mut self.writeback;
            w.backoff = (w.backoff * 2).clamp(RETRY, RETRY_MAX);
            w.retry_at = now + w.backoff;
            self.actions
                .push_back(Action::Event(Event::WritebackFailed {
                    error: e.to_string(),
                    retry: w.backoff,
                }));
        } else {
            self.writeback.backoff = Duration::ZERO;
            self.window.flushed(r.mark);
        }
        // Still full enough (writes came meanwhile): the next one goes
        // now, before the writes that waited are let go.
        self.writeback_maybe(now);
        self.release_held(now);
    }

    /// A restart: the engine's FLUSH out, if any, covers nothing the new
    /// target has; its answer is only awaited. The old target's failures
    /// say nothing of the new one, which is asked without their wait.
    pub(super) fn writeback_cancel(&mut self) {
        self.writeback.backoff = Duration::ZERO;
        self.writeback.retry_at = Duration::ZERO;
        #[cfg(test)]
        if self.undo.writeback_kept {
            return;
        }
        if let Some((id, _)) = self.writeback.out {
            if let Some(r) = self.reqs.get_mut(&id.0) {
                r.cancelled = true;
            }
        }
    }
}
