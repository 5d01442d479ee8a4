//! A test hook: hold a connection's requests before they reach the
//! backend, as a stuck disk or a slow server would, so that a test can
//! make a write that lands late (`Registry::hold`, `Registry::release`).
//!
//! Only built with the `test-hooks` feature, which braid's own tests turn
//! on; in every other build [`Hold`] is empty and its checks are constants
//! the compiler removes from the request path.

#[cfg(any(test, feature = "test-hooks"))]
mod imp {
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::sync::Notify;

    #[derive(Debug, Default)]
    pub struct Hold {
        held: AtomicBool,
        changed: Notify,
    }

    impl Hold {
        pub fn held(&self) -> bool {
            self.held.load(Ordering::Acquire)
        }

        pub fn set(&self, held: bool) {
            self.held.store(held, Ordering::Release);
            self.changed.notify_waiters();
        }

        /// Wakes waiters to look again (a fence drops what they hold).
        pub fn wake(&self) {
            self.changed.notify_waiters();
        }

        /// Waits while held, or until `stop()` says to give up.
        pub async fn wait(&self, stop: impl Fn() -> bool) {
            loop {
                let changed = self.changed.notified();
                if !self.held() || stop() {
                    return;
                }
                changed.await;
            }
        }
    }
}

#[cfg(not(any(test, feature = "test-hooks")))]
mod imp {
    #[derive(Debug, Default)]
    pub struct Hold {}

    impl Hold {
        pub const fn held(&self) -> bool {
            false
        }

        pub fn wake(&self) {}

        pub async fn wait(&self, _stop: impl Fn() -> bool) {}
    }
}

pub use imp::Hold;
