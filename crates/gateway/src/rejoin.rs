//! What must follow an image onto a new RADOS client when it rejoins: a
//! watch that another part keeps on the image's objects (its shared
//! reservations) was registered through the old client, which no longer
//! hears anything, and must be registered again through the new one.

use std::sync::Mutex;

/// Callbacks run once an image rejoined on a new client.
#[derive(Default)]
pub(crate) struct OnRejoin(Mutex<Vec<Box<dyn Fn() + Send + Sync>>>);

impl OnRejoin {
    pub(crate) fn add(&self, f: Box<dyn Fn() + Send + Sync>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(f);
    }

    pub(crate) fn run(&self) {
        for f in self.0.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            f();
        }
    }
}

impl std::fmt::Debug for OnRejoin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().unwrap_or_else(|p| p.into_inner()).len();
        write!(f, "OnRejoin({n})")
    }
}
