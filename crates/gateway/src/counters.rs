//! The figures a gateway counts of each image it writes: the fences
//! clients asked of it and the ones it gave, the gateways it blocklisted,
//! and how long its OSD map barriers and lease renewals took.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use braid_store::stats::LatencyHistogram;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub fences_asked: AtomicU64,
    pub fences_given: AtomicU64,
    pub blocklists: AtomicU64,
    pub barrier: LatencyHistogram,
    pub renewal: LatencyHistogram,
}

impl Counters {
    /// Counts a client's fence and whether it was confirmed.
    pub(crate) fn fence<T, E>(&self, outcome: Result<T, E>) -> Result<T, E> {
        self.fences_asked.fetch_add(1, Relaxed);
        if outcome.is_ok() {
            self.fences_given.fetch_add(1, Relaxed);
        }
        outcome
    }

    pub(crate) fn blocklisted(&self) {
        self.blocklists.fetch_add(1, Relaxed);
    }

    /// Runs `f`, a barrier, and records how long it took.
    pub(crate) fn barrier<T>(&self, f: impl FnOnce() -> T) -> T {
        timed(&self.barrier, f)
    }

    /// Runs `f`, a lease renewal, and records how long it took.
    pub(crate) fn renewal<T>(&self, f: impl FnOnce() -> T) -> T {
        timed(&self.renewal, f)
    }
}

fn timed<T>(h: &LatencyHistogram, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    h.record(start.elapsed());
    out
}
