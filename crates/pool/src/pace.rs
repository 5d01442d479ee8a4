//! How many bytes to hand the kernel in one send.
//!
//! On a link slower than the machine, one `writev` or `sendfile` of
//! megabytes runs TCP, the qdisc and (on a veth) the peer's receive path
//! for all of them inside one system call, holding the socket and the
//! worker thread while acknowledgements and the other paths' sends wait.
//! Measured on the lab (2 × 1gbit, 2 CPUs): sending at most 64 KiB per call
//! raised 1 MiB reads at queue depth 16 from 167 to 227 MB/s and writes
//! from 139 to 163 MB/s; on loopback the same cap cost a third of the read
//! throughput, where larger calls are simply cheaper. So the size follows
//! the connection's own measured rate: half a millisecond of it, never
//! below 64 KiB, and no limit until it has been measured.

use std::time::Duration;

/// The smallest slice: what the lab measured best on a gigabit link.
pub const MIN_SLICE: usize = 64 * 1024;

/// Time of the connection's rate one send may carry.
const SLICE_TIME: f64 = 0.000_5;

/// Busy time over which one rate is measured.
const WINDOW: Duration = Duration::from_millis(20);

/// The sending rate of one connection, and the slice size it implies.
#[derive(Clone, Debug, Default)]
pub struct Pace {
    bytes: u64,
    busy: Duration,
    rate: Option<f64>,
}

impl Pace {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The most bytes the next send should carry.
    #[must_use]
    pub fn slice(&self) -> usize {
        match self.rate {
            None => usize::MAX,
            Some(rate) => MIN_SLICE.max((rate * SLICE_TIME) as usize),
        }
    }

    /// `bytes` were sent in `busy`: from the first attempt (waits for
    /// room in the socket included) to the last byte taken. Time with
    /// nothing to send is not counted, so the rate is what the connection
    /// moves when it has work: the link's when the link is the limit.
    pub fn record(&mut self, bytes: usize, busy: Duration) {
        self.bytes += bytes as u64;
        self.busy += busy;
        if self.busy >= WINDOW {
            self.rate = Some(self.bytes as f64 / self.busy.as_secs_f64());
            self.bytes = 0;
            self.busy = Duration::ZERO;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_limit_until_measured() {
        let mut p = Pace::new();
        assert_eq!(p.slice(), usize::MAX);
        // Less than one window of busy time measures nothing yet.
        p.record(1 << 20, Duration::from_millis(5));
        assert_eq!(p.slice(), usize::MAX);
    }

    #[test]
    fn a_gigabit_connection_sends_the_smallest_slices() {
        let mut p = Pace::new();
        for _ in 0..5 {
            p.record(117_000, Duration::from_millis(1));
        }
        assert_eq!(p.slice(), usize::MAX, "4 ms is not a window");
        for _ in 0..16 {
            p.record(117_000, Duration::from_millis(1));
        }
        assert_eq!(p.slice(), MIN_SLICE);
    }

    #[test]
    fn a_fast_connection_sends_half_a_millisecond_at_a_time() {
        let mut p = Pace::new();
        p.record(50_000_000, Duration::from_millis(20));
        assert_eq!(p.slice(), 1_250_000);
        // The next window replaces the figure: the link got slower.
        p.record(2_000_000, Duration::from_millis(20));
        assert_eq!(p.slice(), MIN_SLICE);
    }
}
