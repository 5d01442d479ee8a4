//! The writes of one image that are in flight in this gateway, and the
//! gate a stopping gateway closes before it leaves the image's registry.
//!
//! A gateway's record is what lets another gateway fence it: a fence that
//! finds no record takes the gateway for one that stopped cleanly, with
//! nothing left to land, and blocklists nothing. So a stopping gateway
//! removes its record only once no write of its own can still reach the
//! cluster: it closes the gate (a write that comes later is refused with
//! `ESHUTDOWN`, and the connection closes unanswered, so the client sends
//! it elsewhere), waits for every write that passed the gate to end (its
//! librbd completion ran: the OSDs applied or refused it), and only then
//! removes the record. Writes that do not end within the gateway's lease
//! (an OSD that does not answer) leave the record in place: renewals have
//! stopped, so the other gateways fence this one (blocklist, barrier) when
//! its lease runs out, and a client's fence finds the record too.
//!
//! Waiting rather than fencing itself first (blocklisting its own client)
//! keeps a clean stop free of blocklist entries, which every client and
//! OSD carries in its map until they expire, and works for a gateway that
//! may not blocklist (one that serves alone).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The in-flight writes of one image.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    state: Mutex<State>,
    ended: Condvar,
}

#[derive(Debug, Default)]
struct State {
    closed: bool,
    inflight: usize,
}

/// One write counted in flight; it ends when this is dropped (after the
/// OSDs answered it).
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Writes>);

impl Writes {
    /// Counts a write in flight, or `None` once the gate is closed.
    pub(crate) fn begin(self: &Arc<Self>) -> Option<InFlight> {
        let mut s = self.lock();
        if s.closed {
            return None;
        }
        s.inflight += 1;
        Some(InFlight(self.clone()))
    }

    /// Closes the gate and waits up to `limit` for the writes in flight to
    /// end; returns how many are left (blocking).
    pub(crate) fn close_and_wait(&self, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        let mut s = self.lock();
        s.closed = true;
        while s.inflight > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s = self
                .ended
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        s.inflight
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.inflight -= 1;
        if s.inflight == 0 {
            self.0.ended.notify_all();
        }
    }
}

/// Test hook: with `BRAID_TEST_HOLD_RBD_WRITES=PATH` in a build with the
/// `test-hooks` feature, a write that begins while PATH exists is held,
/// after it was counted in flight and before it reaches librbd, until PATH
/// is removed (at most two minutes): a write stuck inside a gateway, as a
/// monitor that does not answer `before_write` would hold it.
pub(crate) fn hold_for_tests() {
    super::hooks::hold(HOLD, "holding a write");
}

/// Whether [`hold_for_tests`] would hold a write now (then writes take the
/// synchronous way, on a thread that may wait).
pub(crate) fn holding_for_tests() -> bool {
    super::hooks::held(HOLD).is_some()
}

const HOLD: &str = "BRAID_TEST_HOLD_RBD_WRITES";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closing_waits_for_writes_in_flight_and_refuses_new_ones() {
        let w = Arc::new(Writes::default());
        let first = w.begin().expect("open");
        let second = w.begin().expect("open");
        let closer = {
            let w = w.clone();
            std::thread::spawn(move || w.close_and_wait(Duration::from_secs(30)))
        };
        // Closed once the closer holds the lock; no new write after that.
        while w.begin().is_some_and(drop_it) {
            std::thread::yield_now();
        }
        drop(first);
        drop(second);
        assert_eq!(closer.join().unwrap(), 0);
        assert!(w.begin().is_none(), "stays closed");
    }

    fn drop_it(f: InFlight) -> bool {
        drop(f);
        true
    }

    #[test]
    fn a_write_that_does_not_end_is_reported_left() {
        let w = Arc::new(Writes::default());
        let _stuck = w.begin().expect("open");
        assert_eq!(w.close_and_wait(Duration::from_millis(10)), 1);
    }
}
