//! A server's figures that outlive its connections: per export and portal
//! totals for metrics, which must only grow while connections come and go.
//!
//! Live connections count in their own [`crate::registry::ConnStats`];
//! when one leaves, its figures are folded into the totals here
//! ([`TargetStats::retire`]), so a scrape adds the live ones to the
//! retired ones and never sees a counter fall.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use crate::registry::Conn;

/// Bucket edges of the latency histograms: powers of two microseconds from
/// 64 µs to about 67 s (2^6 .. 2^26), the same edges the initiator exports.
pub const LATENCY_EDGES_POW2_US: std::ops::RangeInclusive<u32> = 6..=26;
const EDGES: usize = 21;

/// A latency histogram with fixed edges that many tasks record into.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Samples below each edge's power of two, but not below the one
    /// before (the last slot: at or above the last edge).
    below: [AtomicU64; EDGES + 1],
    sum_us: AtomicU64,
}

impl LatencyHistogram {
    pub fn record(&self, d: Duration) {
        let us = d.as_micros().min(u128::from(u64::MAX)) as u64;
        let slot = LATENCY_EDGES_POW2_US
            .clone()
            .position(|k| us < 1u64 << k)
            .unwrap_or(EDGES);
        self.below[slot].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    pub fn snapshot(&self) -> Latencies {
        let mut own = [0u64; EDGES + 1];
        for (o, b) in own.iter_mut().zip(&self.below) {
            *o = b.load(Relaxed);
        }
        Latencies {
            own,
            sum_us: self.sum_us.load(Relaxed),
        }
    }
}

/// A histogram's counts at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Latencies {
    /// Each slot's own count; the last is at or above the last edge.
    pub own: [u64; EDGES + 1],
    pub sum_us: u64,
}

impl Latencies {
    pub fn count(&self) -> u64 {
        self.own.iter().sum()
    }

    /// (edge in seconds, samples below it), cumulative, every edge.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut below = 0;
        LATENCY_EDGES_POW2_US
            .zip(self.own)
            .map(|(k, n)| {
                below += n;
                ((1u64 << k) as f64 / 1e6, below)
            })
            .collect()
    }

    fn add(&mut self, other: &Latencies) {
        for (a, b) in self.own.iter_mut().zip(other.own) {
            *a += b;
        }
        self.sum_us += other.sum_us;
    }
}

/// Figures of some connections, summed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub connections: u64,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub others: u64,
    pub errors: u64,
    pub fenced: u64,
    pub flush_latency: Latencies,
}

impl Totals {
    /// One connection's figures now.
    pub fn of(conn: &Conn) -> Self {
        let s = &conn.stats;
        Self {
            connections: 1,
            reads: s.reads.load(Relaxed),
            writes: s.writes.load(Relaxed),
            read_bytes: s.read_bytes.load(Relaxed),
            written_bytes: s.written_bytes.load(Relaxed),
            others: s.others.load(Relaxed),
            errors: s.errors.load(Relaxed),
            fenced: u64::from(conn.fenced()),
            flush_latency: s.flush_latency.snapshot(),
        }
    }

    fn add(&mut self, o: &Totals) {
        self.connections += o.connections;
        self.reads += o.reads;
        self.writes += o.writes;
        self.read_bytes += o.read_bytes;
        self.written_bytes += o.written_bytes;
        self.others += o.others;
        self.errors += o.errors;
        self.fenced += o.fenced;
        self.flush_latency.add(&o.flush_latency);
    }
}

/// Where a connection's figures are filed: its export (empty while it
/// has none, e.g. one that never finished the handshake) and its portal.
pub type Key = (String, String);

/// Totals of connections that have left.
#[derive(Debug, Default)]
pub struct TargetStats {
    retired: Mutex<HashMap<Key, Totals>>,
}

impl TargetStats {
    /// Folds a leaving connection's figures into the totals.
    pub fn retire(&self, conn: &Conn) {
        let key = key(conn);
        let t = Totals::of(conn);
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        retired.entry(key).or_default().add(&t);
    }

    /// Totals by export and portal: the retired connections' and `live`'s.
    pub fn totals(&self, live: &[std::sync::Arc<Conn>]) -> Vec<(Key, Totals)> {
        let mut all = self
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for c in live {
            all.entry(key(c)).or_default().add(&Totals::of(c));
        }
        let mut v: Vec<(Key, Totals)> = all.into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

fn key(conn: &Conn) -> Key {
    let export = conn
        .export
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_default();
    (export, conn.portal.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn latency_buckets_are_fixed_and_cumulative() {
        let h = LatencyHistogram::default();
        for us in [10u64, 63, 64, 1000, 5_000_000, 100_000_000] {
            h.record(Duration::from_micros(us));
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 6);
        let c = s.cumulative();
        assert_eq!(c.len(), EDGES);
        assert_eq!(c[0], (64e-6, 2));
        assert_eq!(c.last().unwrap().1, 5, "100 s is above the last edge");
        assert!(c.windows(2).all(|w| w[0].1 <= w[1].1));
    }

    #[test]
    fn totals_keep_a_connections_figures_after_it_leaves() {
        let reg = Registry::new();
        let a = reg.add("peer".into(), None, "127.0.0.1:1".into());
        *a.export.lock().unwrap() = Some("vol".into());
        a.stats.read_bytes.fetch_add(100, Relaxed);
        let b = reg.add("peer".into(), None, "127.0.0.1:1".into());
        *b.export.lock().unwrap() = Some("vol".into());
        b.stats.read_bytes.fetch_add(5, Relaxed);
        let before = reg.stats.totals(&reg.list());
        reg.remove(a.id);
        let after = reg.stats.totals(&reg.list());
        assert_eq!(before, after, "a leaving connection changes no total");
        let (key, t) = &after[0];
        assert_eq!(key, &("vol".to_owned(), "127.0.0.1:1".to_owned()));
        assert_eq!((t.connections, t.read_bytes), (2, 105));
    }
}
