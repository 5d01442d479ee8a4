//! Which path a split request waited for, and how much later a path's
//! pieces should be assumed to finish because of it.
//!
//! A request split over several paths completes when its last piece does.
//! Shares that make the paths' predicted finishes equal leave each path
//! last about as often as not, and that is not the best split when the
//! finishes vary: moving a byte from path j to path i changes the expected
//! completion by P(i last) / rateᵢ − P(j last) / ratej, so the expected
//! completion is smallest when each path is last in proportion to its rate,
//! that is to its share of the bytes. On 1gbit + 100mbit a byte on the slow
//! path costs ten times what it costs on the fast one, so the slow path
//! should be last about one request in ten, not one in two.
//!
//! The offset learned here is added to the path's predicted start: raised
//! a little each time the path's piece finished last, lowered a little each
//! time it did not, in proportion to its share, so that it settles where
//! the path is last in that same proportion (a stochastic approximation).
//! It learns whatever makes a path late that its rate does not show: a
//! token bucket that refills while the path waits for the others (its rate
//! then measures higher than it can sustain), a busy CPU, a slower reply.

use std::time::Duration;

use super::Engine;

impl Engine {
    /// A split request with `split` bytes per path completed after `took`,
    /// its last piece answered on path `last`.
    pub(super) fn learn_lateness(&mut self, split: &[(usize, u64)], last: usize, took: Duration) {
        let total: u64 = split.iter().map(|&(_, b)| b).sum();
        if total == 0 {
            return;
        }
        for &(path, bytes) in split {
            if let Some(p) = self.paths.get_mut(path) {
                let share = bytes as f64 / total as f64;
                p.lateness.learn(path == last, share, took.as_secs_f64());
            }
        }
    }
}

/// A path's learned offset.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Lateness {
    offset: f64,
}

impl Lateness {
    /// One request moves the offset by at most this fraction of its time:
    /// small enough that a few unlucky requests move a share by less than
    /// a block, large enough to settle within a second at queue depth 1
    /// (a hundred or so requests of 1 MiB on a gigabit link).
    const STEP: f64 = 1.0 / 256.0;

    /// The offset stays within this fraction of the latest request's time,
    /// so that no path is ever pushed out of splits altogether (it would
    /// then never show that it has become faster).
    const BOUND: f64 = 0.25;

    /// A request that took `took` seconds had `share` of its bytes on this
    /// path; `last` when this path's piece was the one it waited for.
    pub fn learn(&mut self, last: bool, share: f64, took: f64) {
        let target = if last { 1.0 } else { 0.0 };
        let bound = took * Self::BOUND;
        self.offset = (self.offset + took * Self::STEP * (target - share)).clamp(-bound, bound);
    }

    /// Seconds to add to the path's predicted finish.
    pub fn get(&self) -> f64 {
        self.offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `n` requests of 8 ms in which the path carries `share` of the
    /// bytes and is last whenever `last(i)` holds.
    fn feed(l: &mut Lateness, n: usize, share: f64, last: impl Fn(usize) -> bool) {
        for i in 0..n {
            l.learn(last(i), share, 0.008);
        }
    }

    #[test]
    fn a_path_last_more_often_than_its_share_is_assumed_later() {
        let mut slow = Lateness::default();
        // A tenth of the bytes, last every other request.
        feed(&mut slow, 100, 0.1, |i| i % 2 == 0);
        assert!(slow.get() > 0.0, "{}", slow.get());
        let mut fast = Lateness::default();
        feed(&mut fast, 100, 0.9, |i| i % 2 == 1);
        assert!(fast.get() < 0.0, "{}", fast.get());
        assert!(
            (slow.get() + fast.get()).abs() < 1e-12,
            "the offsets balance"
        );
    }

    #[test]
    fn a_path_last_in_proportion_to_its_share_stays_where_it_is() {
        let mut l = Lateness::default();
        feed(&mut l, 1000, 0.1, |i| i % 10 == 0);
        assert!(l.get().abs() < 1e-9, "{}", l.get());
    }

    #[test]
    fn the_offset_is_bounded_by_a_quarter_of_the_request() {
        let mut l = Lateness::default();
        feed(&mut l, 100_000, 0.1, |_| true);
        assert_eq!(l.get(), 0.002);
        // Shorter requests bound it more tightly at once.
        l.learn(true, 0.1, 0.001);
        assert_eq!(l.get(), 0.000_25);
    }
}

#[cfg(test)]
mod engine_tests {
    use std::time::Duration;

    use crate::tests::Harness;
    use crate::{EngineConfig, Op};

    /// 1 MiB reads at queue depth 1 over a 100 MB/s and a 10 MB/s path,
    /// 100 µs of latency each; the slow path's pieces take 5% longer and
    /// 5% shorter than its rate predicts, in turn, as a token bucket that
    /// refills while it waits makes them do. Returns, over the second half
    /// of `n` requests, how often the slow path was the one waited for
    /// and the mean time a request took.
    fn qd1_reads(n: usize) -> (f64, Duration) {
        let mut h = Harness::new("adaptive", 2, EngineConfig::default());
        let (mut slow_last, mut took) = (0, Duration::ZERO);
        for i in 0..n {
            h.submit(Op::Read, 0, 1 << 20);
            let start = h.now;
            let mut ends: Vec<_> = std::mem::take(&mut h.sent)
                .into_iter()
                .map(|s| {
                    let (rate, jitter) = match (s.path.0, i % 2) {
                        (0, _) => (100e6, 1.0),
                        (_, 0) => (10e6, 1.05),
                        _ => (10e6, 0.95),
                    };
                    let secs = 100e-6 + f64::from(s.len) / rate * jitter;
                    (start + Duration::from_secs_f64(secs), s.cookie, s.path.0)
                })
                .collect();
            ends.sort_by_key(|e| e.0);
            for &(at, cookie, _) in &ends {
                h.now = at;
                h.e.reply(h.now, cookie, Ok(()));
                h.pump();
            }
            if i >= n / 2 {
                slow_last += usize::from(ends.last().map(|e| e.2) == Some(1));
                took += h.now - start;
            }
            h.now += Duration::from_micros(50);
        }
        let half = (n - n / 2) as f64;
        (slow_last as f64 / half, took / (n - n / 2) as u32)
    }

    #[test]
    fn the_slow_path_is_waited_for_about_as_often_as_its_share() {
        let (slow_last, took) = qd1_reads(400);
        // Shares that only equalise the predicted finishes leave the slow
        // path last whenever its piece runs long: every other request,
        // 9.87 ms on average. Its share of the bytes is a tenth.
        assert!(
            slow_last < 0.25,
            "slow path last in {slow_last:.2} of requests"
        );
        // Both paths together move 110 MB/s: 9.63 ms per MiB, and a
        // block moved from the slow path adds 0.04 ms to the fast one.
        assert!(took < Duration::from_micros(9_750), "{took:?} per request");
    }
}
