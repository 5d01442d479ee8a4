//! Being told when an image's header changes: `rbd resize`, a snapshot, a
//! feature or a flag changed by another client. librbd learns of it
//! through its own watch on the image header and calls every update
//! watcher; what changed is then read back (`Image::size`, which refreshes
//! the header first).

use std::ffi::c_void;
use std::sync::Arc;

use crate::error::{check, Result};
use crate::image::Image;
use crate::sys;

type Callback = Box<dyn Fn() + Send + Sync>;

/// A registered update watcher; dropping it unregisters it, after which no
/// call of it runs.
pub struct UpdateWatch {
    image: Arc<Image>,
    handle: u64,
    callback: *mut Callback,
}

// SAFETY: the callback is a Send + Sync closure; the handle a number.
unsafe impl Send for UpdateWatch {}
// SAFETY: as above.
unsafe impl Sync for UpdateWatch {}

impl std::fmt::Debug for UpdateWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpdateWatch")
            .field("handle", &self.handle)
            .finish()
    }
}

impl Image {
    /// Calls `on_update` (on a librbd thread: it must not block, nor call
    /// into this image) whenever the image's header changes.
    ///
    /// # Errors
    ///
    /// As librbd reports.
    pub fn watch_updates(
        self: &Arc<Self>,
        on_update: impl Fn() + Send + Sync + 'static,
    ) -> Result<UpdateWatch> {
        let callback: *mut Callback = Box::into_raw(Box::new(Box::new(on_update)));
        let mut handle = 0u64;
        // SAFETY: an open image; `callback` stays allocated until the
        // watcher is unregistered (Drop), after which librbd calls it no
        // more.
        let r = unsafe {
            sys::rbd_update_watch(self.handle, &mut handle, Some(updated), callback.cast())
        };
        if r < 0 {
            // SAFETY: not registered: nobody else holds it.
            drop(unsafe { Box::from_raw(callback) });
        }
        check(r.into(), || "watching the image header for changes".into())?;
        Ok(UpdateWatch {
            image: self.clone(),
            handle,
            callback,
        })
    }
}

unsafe extern "C" fn updated(arg: *mut c_void) {
    // SAFETY: arg is the Callback registered with this watcher, alive until
    // after rbd_update_unwatch returned.
    let cb = unsafe { &*arg.cast::<Callback>() };
    // A panic must not unwind into C.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(cb));
}

impl Drop for UpdateWatch {
    fn drop(&mut self) {
        // SAFETY: the handle was registered on this image, which the Arc
        // keeps open; librbd's unwatch waits for a call of the watcher in
        // progress, so the callback may be freed after it.
        unsafe {
            sys::rbd_update_unwatch(self.image.handle, self.handle);
            drop(Box::from_raw(self.callback));
        }
    }
}
