//! Rates "over the last seconds": counters sampled every second or less, so a
//! status request can say MB/s and IOPS without waiting.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Counters of one thing (a path, a connection).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub reads: u64,
    pub writes: u64,
}

/// Per second, over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PerSecond {
    pub read_bytes: f64,
    pub written_bytes: f64,
    pub reads: f64,
    pub writes: f64,
}

/// How far back `braid status`'s rates look.
pub const WINDOW: Duration = Duration::from_secs(5);

/// A short history of counter snapshots.
#[derive(Default)]
pub struct Rates {
    history: VecDeque<(Instant, HashMap<String, Counts>)>,
}

impl Rates {
    /// Keeps a snapshot; older than twice the window are dropped.
    pub fn record(&mut self, now: Instant, snapshot: HashMap<String, Counts>) {
        self.history.push_back((now, snapshot));
        while self
            .history
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > 2 * WINDOW)
        {
            self.history.pop_front();
        }
    }

    /// `key`'s rates from the oldest snapshot within [`WINDOW`] to `current`.
    pub fn rate(&self, key: &str, current: Counts, now: Instant) -> PerSecond {
        self.rate_within(key, current, now, WINDOW)
    }

    /// The same over the last `window` (at most twice [`WINDOW`] is kept).
    pub fn rate_within(
        &self,
        key: &str,
        current: Counts,
        now: Instant,
        window: Duration,
    ) -> PerSecond {
        let Some((t, old)) = self
            .history
            .iter()
            .find(|(t, s)| now.duration_since(*t) <= window && s.contains_key(key))
            .map(|(t, s)| (*t, s[key]))
        else {
            return PerSecond::default();
        };
        let secs = now.duration_since(t).as_secs_f64();
        if secs < 0.2 {
            return PerSecond::default();
        }
        let d = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
        PerSecond {
            read_bytes: d(current.read_bytes, old.read_bytes),
            written_bytes: d(current.written_bytes, old.written_bytes),
            reads: d(current.reads, old.reads),
            writes: d(current.writes, old.writes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_over_the_window() {
        let mut r = Rates::default();
        let t0 = Instant::now();
        let c = |b| Counts {
            read_bytes: b,
            reads: b / 100,
            ..Counts::default()
        };
        r.record(t0, HashMap::from([("p1".to_string(), c(0))]));
        let now = t0 + Duration::from_secs(2);
        let p = r.rate("p1", c(2000), now);
        assert!((p.read_bytes - 1000.0).abs() < 1e-6);
        assert!((p.reads - 10.0).abs() < 1e-6);
        assert_eq!(r.rate("p2", c(5), now), PerSecond::default());
        // Beyond the window, the old snapshot no longer counts.
        let later = t0 + Duration::from_secs(20);
        assert_eq!(r.rate("p1", c(9000), later), PerSecond::default());
    }
}
