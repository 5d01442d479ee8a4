//! Byte-range locks over one export's writers, across protocols: every
//! write (NBD WRITE, WRITE_ZEROES and TRIM; iSCSI WRITE, WRITE SAME and
//! UNMAP) holds its range shared while it runs, and iSCSI's COMPARE AND
//! WRITE holds its range alone from the read that compares to the write
//! that follows. So no write of either protocol can land between the two
//! (SBC-4 5.3: VMware's ATS heartbeats and locks depend on it).
//!
//! Synchronous on purpose: backend calls run on blocking threads (or
//! inline for memory, where nothing waits long). Exclusive holders are
//! served first: once one waits, new shared holders of an overlapping
//! range wait behind it, so a stream of writes cannot starve it.

use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Debug, Default)]
struct State {
    /// Ranges held: (start, end, exclusive, id).
    held: Vec<(u64, u64, bool, u64)>,
    /// Exclusive holders waiting for their range.
    waiting: Vec<(u64, u64)>,
    /// Shared holders waiting (a test looks at it).
    blocked: usize,
    next: u64,
    /// Wake-ups sent to waiters (a test counts them).
    wakes: u64,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl State {
    /// Whether a shared holder of `range` must wait: an exclusive holder
    /// holds or waits for part of it.
    fn shared_waits(&self, range: (u64, u64)) -> bool {
        self.held.iter().any(|h| h.2 && overlaps((h.0, h.1), range))
            || self.waiting.iter().any(|w| overlaps(*w, range))
    }
}

fn hold_id(s: &mut State, range: (u64, u64), exclusive: bool) -> u64 {
    let id = s.next;
    s.next += 1;
    s.held.push((range.0, range.1, exclusive, id));
    id
}

/// The range locks of one export.
#[derive(Debug, Default)]
pub struct RangeLock {
    state: Mutex<State>,
    freed: Condvar,
    /// Test hook: exclusive holders stop at their checkpoint while set.
    pause: Mutex<(bool, usize)>,
    resumed: Condvar,
}

/// A range held; released when dropped.
#[derive(Debug)]
pub struct RangeGuard<'a> {
    lock: &'a RangeLock,
    id: u64,
}

impl RangeGuard<'_> {
    /// Where an exclusive holder is between what it read and what it
    /// writes; a test can stop it here (`RangeLock::pause`), to let other
    /// writers try to get in.
    pub fn checkpoint(&self) {
        if cfg!(any(test, feature = "test-hooks")) {
            let mut p = self.lock.pause.lock().unwrap_or_else(|p| p.into_inner());
            if p.0 {
                p.1 += 1;
                while p.0 {
                    p = self.lock.resumed.wait(p).unwrap_or_else(|p| p.into_inner());
                }
            }
        }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        self.lock.release(self.id);
    }
}

impl RangeLock {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&'a self, s: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.freed.wait(s).unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the waiters, if any: a condvar's notify is a system call
    /// even with nobody waiting, and every write releases its range (one
    /// futex call per 4 KiB write, 1M in 5 s under fio at QD32).
    ///
    /// Waiters count themselves under the mutex before they wait, so none
    /// is missed.
    fn wake(&self, mut s: MutexGuard<'_, State>) {
        if s.blocked == 0 && s.waiting.is_empty() {
            return;
        }
        s.wakes += 1;
        drop(s);
        self.freed.notify_all();
    }

    fn hold(&self, s: &mut State, range: (u64, u64), exclusive: bool) -> RangeGuard<'_> {
        RangeGuard {
            lock: self,
            id: hold_id(s, range, exclusive),
        }
    }

    /// Holds `[offset, offset + len)` beside other writers, waiting while
    /// a COMPARE AND WRITE holds or waits for an overlapping range.
    pub fn shared(&self, offset: u64, len: u64) -> RangeGuard<'_> {
        let range = (offset, offset.saturating_add(len.max(1)));
        let mut s = self.state();
        let mut counted = false;
        loop {
            if !s.shared_waits(range) {
                if counted {
                    s.blocked -= 1;
                }
                return self.hold(&mut s, range, false);
            }
            if !counted {
                s.blocked += 1;
                counted = true;
            }
            s = self.wait(s);
        }
    }

    /// Holds `[offset, offset + len)` beside other writers if that needs
    /// no wait, and returns the hold's id for [`Self::release`]: for a
    /// write that ends on another thread (an asynchronous backend's
    /// completion), where a guard borrowing the lock cannot go.
    pub fn try_shared(&self, offset: u64, len: u64) -> Option<u64> {
        let range = (offset, offset.saturating_add(len.max(1)));
        let mut s = self.state();
        if s.shared_waits(range) {
            return None;
        }
        Some(hold_id(&mut s, range, false))
    }

    /// Ends the hold `id` (from [`Self::try_shared`] or a guard's drop).
    pub fn release(&self, id: u64) {
        let mut s = self.state();
        s.held.retain(|h| h.3 != id);
        self.wake(s);
    }

    /// Holds `[offset, offset + len)` alone: waits until no writer holds
    /// any of it.
    pub fn exclusive(&self, offset: u64, len: u64) -> RangeGuard<'_> {
        let range = (offset, offset.saturating_add(len.max(1)));
        let mut s = self.state();
        s.waiting.push(range);
        while s.held.iter().any(|h| overlaps((h.0, h.1), range)) {
            s = self.wait(s);
        }
        if let Some(at) = s.waiting.iter().position(|w| *w == range) {
            s.waiting.remove(at);
        }
        let g = self.hold(&mut s, range, true);
        // Shared writers that waited only behind this one's wait look
        // again (they still wait if the range is held).
        self.wake(s);
        g
    }

    /// Shared holders waiting behind an exclusive one (for tests).
    pub fn blocked(&self) -> usize {
        self.state().blocked
    }

    /// Test hook: while `on`, exclusive holders stop at their
    /// checkpoint.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn pause(&self, on: bool) {
        self.pause.lock().unwrap_or_else(|p| p.into_inner()).0 = on;
        self.resumed.notify_all();
    }

    /// Test hook: how many exclusive holders reached a checkpoint while
    /// paused.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn paused(&self) -> usize {
        self.pause.lock().unwrap_or_else(|p| p.into_inner()).1
    }

    #[cfg(test)]
    fn wakes(&self) -> u64 {
        self.state().wakes
    }

    #[cfg(test)]
    fn exclusive_waiting(&self) -> usize {
        self.state().waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    /// A writer of `[offset, offset + len)` started while `held` is held,
    /// seen blocked, and let through by dropping `held`; returns once it
    /// is done.
    fn writer_waits_behind(l: &Arc<RangeLock>, held: impl Sized, offset: u64, len: u64) {
        let l2 = l.clone();
        let w = std::thread::spawn(move || drop(l2.shared(offset, len)));
        while l.blocked() == 0 {
            std::thread::yield_now();
        }
        drop(held);
        w.join().unwrap();
    }

    #[test]
    fn writers_share_and_an_exclusive_holder_waits_for_them_and_they_for_it() {
        let l = Arc::new(RangeLock::default());
        let a = l.shared(0, 512);
        let b = l.shared(256, 512);
        let other = l.shared(4096, 512);
        let (tx, rx) = std::sync::mpsc::channel();
        let l2 = l.clone();
        let t = std::thread::spawn(move || {
            let g = l2.exclusive(0, 512);
            tx.send(()).unwrap();
            // A writer of the same range waits until this one is done.
            writer_waits_behind(&l2, g, 100, 10);
        });
        while l.exclusive_waiting() == 0 {
            std::thread::yield_now();
        }
        assert!(rx.try_recv().is_err(), "not while writers hold the range");
        drop(other);
        drop(a);
        drop(b);
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        t.join().unwrap();
        assert_eq!(l.blocked(), 0);
        let _unrelated = l.exclusive(1 << 20, 512);
        drop(l.shared(0, 512));
    }

    #[test]
    fn a_hold_taken_without_waiting_keeps_an_exclusive_holder_out_until_released() {
        let l = Arc::new(RangeLock::default());
        let id = l.try_shared(0, 512).expect("nothing holds the range");
        let l2 = l.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let _g = l2.exclusive(256, 512);
            tx.send(()).unwrap();
        });
        while l.exclusive_waiting() == 0 {
            std::thread::yield_now();
        }
        assert!(rx.try_recv().is_err(), "not while the hold lasts");
        // Waiting behind an exclusive holder is a wait: refused at once.
        assert_eq!(l.try_shared(300, 10), None);
        assert!(
            l.try_shared(4096, 512).is_some(),
            "an unrelated range is free"
        );
        l.release(id);
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn writers_that_nobody_waits_for_wake_no_one_and_a_waiter_is_still_woken() {
        let l = Arc::new(RangeLock::default());
        for i in 0..1000u64 {
            drop(l.shared(i * 4096, 4096));
            l.release(l.try_shared(i * 4096, 4096).unwrap());
        }
        drop(l.exclusive(0, 512));
        assert_eq!(l.wakes(), 0, "wake-ups sent with nobody waiting");
        // A writer behind an exclusive holder is woken by its release.
        let g = l.exclusive(0, 512);
        writer_waits_behind(&l, g, 0, 512);
        assert!(l.wakes() > 0);
        assert_eq!(l.blocked(), 0);
    }
}
