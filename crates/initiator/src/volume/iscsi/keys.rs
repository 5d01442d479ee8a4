//! The persistent-reservation keys a volume's sessions registered, so that
//! closing can withdraw every one of them.
//!
//! A key is recorded before its REGISTER goes out, not once the target
//! answers: a dial dropped while the command is in flight (the losers of a
//! staggered reconnect) or timed out waiting for the answer may still
//! leave the key registered, and closing preempts only keys it knows.
//! Closing also shuts the set: a session that logs in afterwards registers
//! nothing, and one whose REGISTER was in flight as the volume closed
//! withdraws its own key.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};

#[derive(Debug, Default)]
pub(crate) struct Keys {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    keys: HashSet<u64>,
    closed: bool,
}

impl Keys {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `key` as about to be registered; false once the volume has
    /// closed, when nothing may be registered any more.
    pub fn admit(&self, key: u64) -> bool {
        let mut inner = self.lock();
        if !inner.closed {
            inner.keys.insert(key);
        }
        !inner.closed
    }

    /// Whether the volume has closed (see [`Keys::close`]).
    pub fn closed(&self) -> bool {
        self.lock().closed
    }

    /// `keys` are no longer registered (withdrawn or preempted).
    pub fn forget(&self, keys: impl IntoIterator<Item = u64>) {
        let mut inner = self.lock();
        for k in keys {
            inner.keys.remove(&k);
        }
    }

    /// Shuts the set as the volume closes, and returns every key in it.
    pub fn close(&self) -> Vec<u64> {
        let mut inner = self.lock();
        inner.closed = true;
        inner.keys.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_set_admits_nothing_and_keeps_what_it_had() {
        let keys = Keys::default();
        assert!(keys.admit(1));
        assert!(keys.admit(2));
        keys.forget([2]);
        assert!(!keys.closed());
        assert_eq!(keys.close(), [1]);
        assert!(keys.closed());
        assert!(!keys.admit(3), "nothing is registered after closing");
        assert_eq!(keys.close(), [1]);
    }
}
