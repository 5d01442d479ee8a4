//! A test hook: hold every save of unit-wide state (reservations) before
//! its fsync, as a slow or stalled disk under `--state-dir` would, so
//! that a test can see what runs while a save is under way and that no
//! answer leaves before its save has ended.
//!
//! Only built with the `test-hooks` feature; in every other build
//! [`SlowSave`] is empty and [`SlowSave::pass`] does nothing.

#[cfg(any(test, feature = "test-hooks"))]
mod imp {
    use std::sync::{Condvar, Mutex};
    use std::time::{Duration, Instant};

    /// Longest a held save waits, so that a test that forgets to let go
    /// still ends.
    const MOST: Duration = Duration::from_secs(60);

    #[derive(Debug, Default)]
    pub struct SlowSave {
        /// Held, and how many saves wait.
        state: Mutex<(bool, usize)>,
        changed: Condvar,
    }

    impl SlowSave {
        pub fn set(&self, held: bool) {
            self.state.lock().unwrap_or_else(|p| p.into_inner()).0 = held;
            self.changed.notify_all();
        }

        /// Saves waiting now.
        pub fn waiting(&self) -> usize {
            self.state.lock().unwrap_or_else(|p| p.into_inner()).1
        }

        /// Blocks the calling thread while held (at most [`MOST`]).
        pub fn pass(&self) {
            let end = Instant::now() + MOST;
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            s.1 += 1;
            while s.0 && Instant::now() < end {
                s = self
                    .changed
                    .wait_timeout(s, end.saturating_duration_since(Instant::now()))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            s.1 -= 1;
        }
    }
}

#[cfg(not(any(test, feature = "test-hooks")))]
mod imp {
    #[derive(Debug, Default)]
    pub struct SlowSave {}

    impl SlowSave {
        pub fn pass(&self) {}
    }
}

pub(crate) use imp::SlowSave;
