//! The size of an image as a gateway knows it, and whether librbd
//! announced a change since it was read (`resize.rs` reads it again).

use std::sync::atomic::{AtomicU64, Ordering};

/// The image's size as this gateway knows it.
#[derive(Debug)]
pub(crate) struct Size {
    bytes: AtomicU64,
    /// Changes librbd announced, and how many of them the size read last
    /// takes into account.
    told: AtomicU64,
    read: AtomicU64,
}

impl Size {
    pub(crate) fn new(bytes: u64) -> Self {
        Self {
            bytes: AtomicU64::new(bytes),
            told: AtomicU64::new(0),
            read: AtomicU64::new(0),
        }
    }

    pub(crate) fn get(&self) -> u64 {
        self.bytes.load(Ordering::SeqCst)
    }

    /// No change announced since the size was last read.
    pub(crate) fn fresh(&self) -> bool {
        self.read.load(Ordering::SeqCst) >= self.told.load(Ordering::SeqCst)
    }

    /// A change was announced (or may have been missed, as on a reopen).
    pub(crate) fn told(&self) {
        self.told.fetch_add(1, Ordering::SeqCst);
    }

    /// How many changes were announced so far.
    pub(crate) fn announced(&self) -> u64 {
        self.told.load(Ordering::SeqCst)
    }

    /// Keeps `now`, read after `announced` changes were announced; returns
    /// the size before.
    pub(crate) fn keep(&self, announced: u64, now: u64) -> u64 {
        let before = self.bytes.swap(now, Ordering::SeqCst);
        self.read.fetch_max(announced, Ordering::SeqCst);
        before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_announced_while_the_size_was_read_leaves_it_stale() {
        let s = Size::new(8);
        assert!(s.fresh());
        s.told();
        assert!(!s.fresh(), "announced, not read yet");
        let seen = s.announced();
        // Another announcement comes while librbd is asked.
        s.told();
        assert_eq!(s.keep(seen, 16), 8);
        assert_eq!(s.get(), 16);
        assert!(!s.fresh(), "the second change may not be in what was read");
        assert_eq!(s.keep(s.announced(), 4), 16);
        assert!(s.fresh());
    }
}
