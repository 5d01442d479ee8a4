//! Small measuring instruments: a moving average and a latency histogram
//! with percentiles. No clock: callers hand in the values.

use std::time::Duration;

/// An exponentially weighted moving average; `None` until the first sample.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ewma {
    value: Option<f64>,
}

impl Ewma {
    /// Folds in a sample with weight `alpha` (0..=1; higher follows faster).
    pub fn add(&mut self, sample: f64, alpha: f64) {
        self.value = Some(match self.value {
            Some(v) => v + alpha * (sample - v),
            None => sample,
        });
    }

    pub fn get(&self) -> Option<f64> {
        self.value
    }

    /// The value, or 0 when nothing was measured (policies read 0 as
    /// "unmeasured").
    pub fn or_zero(&self) -> f64 {
        self.value.unwrap_or(0.0)
    }
}

/// A path's capacity: bytes delivered over time spent delivering them,
/// summed over a recent window.
///
/// A ratio of sums rather than an average or maximum of rates: completions
/// arrive in bursts (a server that was busy acknowledges a backlog at once),
/// so a short interval can show several times the link's speed or a small
/// fraction of it; summed over a window the bursts cancel out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RateFilter {
    samples: std::collections::VecDeque<(Duration, u64, Duration)>,
    estimate: Option<f64>,
    last: Option<Duration>,
}

impl RateFilter {
    /// Samples older than this no longer count.
    const WINDOW: Duration = Duration::from_secs(2);

    /// `bytes` were delivered in `busy` of time spent delivering, up to `now`.
    pub fn add(&mut self, now: Duration, bytes: u64, busy: Duration) {
        self.samples.push_back((now, bytes, busy));
        while self
            .samples
            .front()
            .is_some_and(|(t, _, _)| now.saturating_sub(*t) > Self::WINDOW)
        {
            self.samples.pop_front();
        }
        let (b, t) = self
            .samples
            .iter()
            .fold((0u64, Duration::ZERO), |(b, t), s| (b + s.1, t + s.2));
        if !t.is_zero() {
            self.estimate = Some(b as f64 / t.as_secs_f64());
        }
        self.last = Some(now);
    }

    /// The estimate; `None` until the first sample. Without new samples the
    /// last estimate stands.
    pub fn get(&self) -> Option<f64> {
        self.estimate
    }

    pub fn or_zero(&self) -> f64 {
        self.estimate.unwrap_or(0.0)
    }

    /// When the last sample was taken.
    pub fn last_sample(&self) -> Option<Duration> {
        self.last
    }
}

/// The smallest value seen over a window: a path's base latency, which
/// queueing can only inflate (like BBR's minimum round-trip filter).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MinFilter {
    samples: std::collections::VecDeque<(Duration, f64)>,
}

impl MinFilter {
    const WINDOW: Duration = Duration::from_secs(10);

    pub fn add(&mut self, now: Duration, value: f64) {
        // A new value makes every older, larger one irrelevant.
        while self.samples.back().is_some_and(|(_, v)| *v >= value) {
            self.samples.pop_back();
        }
        self.samples.push_back((now, value));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.saturating_sub(*t) > Self::WINDOW)
        {
            self.samples.pop_front();
        }
    }

    pub fn get(&self) -> Option<f64> {
        self.samples.front().map(|(_, v)| *v)
    }

    pub fn or_zero(&self) -> f64 {
        self.get().unwrap_or(0.0)
    }
}

/// Sub-buckets per power of two: percentiles are within 1/16 (6%).
const SUB: u32 = 16;
/// Powers of two from 1 µs: up to about 2^27 µs (over two minutes).
const POWERS: u32 = 28;

/// Latencies in buckets of about 6% width, from 1 µs to minutes, so
/// percentiles cost no memory per sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum_us: u64,
    max_us: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: vec![0; (SUB * POWERS) as usize],
            total: 0,
            sum_us: 0,
            max_us: 0,
        }
    }
}

impl Histogram {
    pub fn record(&mut self, d: Duration) {
        let us = d.as_micros().min(u128::from(u64::MAX)) as u64;
        self.counts[Self::bucket(us)] += 1;
        self.total += 1;
        self.sum_us = self.sum_us.saturating_add(us);
        self.max_us = self.max_us.max(us);
    }

    fn bucket(us: u64) -> usize {
        if us < u64::from(SUB) {
            return us as usize;
        }
        let power = 63 - us.leading_zeros(); // ≥ 4
        let shift = power - SUB.trailing_zeros();
        let sub = ((us >> shift) as u32) - SUB; // 0..SUB
        let idx = (power - SUB.trailing_zeros() + 1) * SUB + sub;
        (idx as usize).min((SUB * POWERS) as usize - 1)
    }

    /// The lower bound in µs of a bucket.
    fn lower(idx: usize) -> u64 {
        let idx = idx as u32;
        if idx < SUB {
            return u64::from(idx);
        }
        let group = idx / SUB - 1;
        let sub = idx % SUB;
        u64::from(SUB + sub) << group
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> Duration {
        Duration::from_micros(self.max_us)
    }

    /// Sum of every sample.
    pub fn sum(&self) -> Duration {
        Duration::from_micros(self.sum_us)
    }

    pub fn mean(&self) -> Duration {
        Duration::from_micros(self.sum_us.checked_div(self.total).unwrap_or(0))
    }

    /// The latency below which `q` (0..=1) of samples fall; zero when empty.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.total == 0 {
            return Duration::ZERO;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                // Report the bucket's upper edge, capped by the real maximum.
                let upper = Self::lower(i + 1).saturating_sub(1).max(Self::lower(i));
                return Duration::from_micros(upper.min(self.max_us));
            }
        }
        self.max()
    }

    /// Adds another histogram's samples (per-path into per-volume).
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
        self.max_us = self.max_us.max(other.max_us);
    }

    /// Non-empty buckets as (upper bound in seconds, cumulative count), for
    /// Prometheus-style export.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut out = Vec::new();
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            if *c > 0 {
                seen += c;
                out.push((Self::lower(i + 1) as f64 / 1e6, seen));
            }
        }
        out
    }
}

/// Latencies of the last minute, in slots of [`RecentLatency::SLOT`], so
/// `status` shows how a path does now (as `iostat` and `nvme top` do), not
/// since the volume opened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecentLatency {
    /// (slot number, samples of that slot), oldest first.
    slots: std::collections::VecDeque<(u64, Histogram)>,
}

impl RecentLatency {
    pub const SLOT: Duration = Duration::from_secs(5);
    const KEPT: u64 = 12;

    pub fn record(&mut self, now: Duration, d: Duration) {
        let slot = now.as_secs() / Self::SLOT.as_secs();
        if self.slots.back().is_none_or(|(s, _)| *s != slot) {
            self.slots.push_back((slot, Histogram::default()));
        }
        while self
            .slots
            .front()
            .is_some_and(|(s, _)| slot.saturating_sub(*s) >= Self::KEPT)
        {
            self.slots.pop_front();
        }
        if let Some((_, h)) = self.slots.back_mut() {
            h.record(d);
        }
    }

    /// Samples of the last `window` (rounded up to whole slots) before
    /// `now`.
    pub fn over(&self, now: Duration, window: Duration) -> Histogram {
        let slot = now.as_secs() / Self::SLOT.as_secs();
        let slots = window.as_secs().div_ceil(Self::SLOT.as_secs()).max(1);
        let mut out = Histogram::default();
        for (s, h) in &self.slots {
            if slot.saturating_sub(*s) < slots {
                out.merge(h);
            }
        }
        out
    }
}

/// Prometheus bucket edges: powers of two microseconds from 64 µs to about
/// 67 s. They are edges of [`Histogram`]'s own buckets, so each cumulative
/// count is exact, and the set never changes, as `histogram_quantile` and
/// dashboards need.
pub const PROMETHEUS_EDGES_US: std::ops::RangeInclusive<u32> = 6..=26;

impl Histogram {
    /// (upper edge in seconds, samples below it) at every power of two of
    /// [`PROMETHEUS_EDGES_US`], whether or not any sample fell there.
    pub fn fixed_buckets(&self) -> Vec<(f64, u64)> {
        PROMETHEUS_EDGES_US
            .map(|k| {
                let edge = 1u64 << k;
                let below: u64 = self
                    .counts
                    .iter()
                    .enumerate()
                    .take_while(|(i, _)| Self::lower(*i) < edge)
                    .map(|(_, c)| *c)
                    .sum();
                (edge as f64 / 1e6, below)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_buckets_are_always_the_same_set_and_exact() {
        let empty = Histogram::default().fixed_buckets();
        assert_eq!(empty.len(), 21);
        let mut h = Histogram::default();
        for us in [10u64, 63, 64, 65, 1000, 1023, 1024, 5_000_000] {
            h.record(Duration::from_micros(us));
        }
        let b = h.fixed_buckets();
        let edges: Vec<f64> = b.iter().map(|(e, _)| *e).collect();
        assert_eq!(edges, empty.iter().map(|(e, _)| *e).collect::<Vec<_>>());
        let at = |us: u64| {
            b.iter()
                .find(|(e, _)| (*e * 1e6).round() as u64 == us)
                .unwrap()
                .1
        };
        assert_eq!(at(64), 2, "10 and 63 are below 64 µs");
        assert_eq!(at(1024), 6);
        assert_eq!(at(1 << 22), 7);
        assert_eq!(at(1 << 23), 8);
        assert!(b.windows(2).all(|w| w[0].1 <= w[1].1));
    }

    #[test]
    fn recent_latency_forgets_what_is_older_than_its_window() {
        let mut r = RecentLatency::default();
        let s = Duration::from_secs;
        r.record(s(0), Duration::from_millis(100));
        r.record(s(30), Duration::from_millis(2));
        r.record(s(58), Duration::from_millis(1));
        assert_eq!(r.over(s(59), s(10)).count(), 1);
        assert_eq!(r.over(s(59), s(60)).count(), 3);
        r.record(s(70), Duration::from_millis(1));
        // The sample at 0 s has left the minute.
        assert_eq!(r.over(s(70), s(60)).count(), 3);
        assert_eq!(r.over(s(70), s(60)).max(), Duration::from_millis(2));
        assert_eq!(r.over(s(200), s(60)).count(), 0);
    }

    #[test]
    fn ewma_starts_at_first_sample() {
        let mut e = Ewma::default();
        assert_eq!(e.get(), None);
        e.add(10.0, 0.5);
        assert_eq!(e.get(), Some(10.0));
        e.add(20.0, 0.5);
        assert_eq!(e.get(), Some(15.0));
    }

    #[test]
    fn rate_filter_sums_over_the_window() {
        let mut f = RateFilter::default();
        assert_eq!(f.get(), None);
        let ms = Duration::from_millis;
        // A burst and a lull average out to the link's rate.
        f.add(ms(0), 4_000_000, ms(10));
        f.add(ms(100), 1_000_000, ms(40));
        assert_eq!(f.get(), Some(100e6));
        f.add(ms(5000), 700_000, ms(10));
        assert_eq!(f.get(), Some(70e6), "old samples age out");
        assert_eq!(f.last_sample(), Some(ms(5000)));
    }

    #[test]
    fn min_filter_keeps_the_smallest_recent_value() {
        let mut f = MinFilter::default();
        let s = Duration::from_secs;
        f.add(s(0), 5.0);
        f.add(s(1), 9.0);
        assert_eq!(f.get(), Some(5.0));
        f.add(s(2), 3.0);
        assert_eq!(f.get(), Some(3.0));
        f.add(s(20), 7.0);
        assert_eq!(f.get(), Some(7.0), "old minima age out");
    }

    #[test]
    fn buckets_are_monotonic_and_bound_values() {
        let mut last = 0;
        for us in [0u64, 1, 15, 16, 17, 31, 32, 100, 1000, 123_456, 10_000_000] {
            let b = Histogram::bucket(us);
            assert!(b >= last, "{us}");
            last = b;
            assert!(Histogram::lower(b) <= us, "{us} below its bucket");
            assert!(Histogram::lower(b + 1) > us, "{us} above its bucket");
        }
    }

    #[test]
    fn quantiles_within_bucket_precision() {
        let mut h = Histogram::default();
        for i in 1..=1000u64 {
            h.record(Duration::from_micros(i * 100));
        }
        let p50 = h.quantile(0.5).as_micros() as f64;
        assert!((p50 - 50_000.0).abs() / 50_000.0 < 0.07, "{p50}");
        let p99 = h.quantile(0.99).as_micros() as f64;
        assert!((p99 - 99_000.0).abs() / 99_000.0 < 0.07, "{p99}");
        assert_eq!(h.quantile(1.0), Duration::from_micros(100_000));
        assert_eq!(h.count(), 1000);
        let mut m = Histogram::default();
        m.merge(&h);
        m.merge(&h);
        assert_eq!(m.count(), 2000);
        assert_eq!(m.quantile(0.5), h.quantile(0.5));
    }
}
