//! Online resize: `rbd resize` of an image this gateway serves.
//!
//! librbd learns of a resize through its watch on the image header and
//! calls the update watcher registered at every open (`Image::
//! watch_updates`); the size is then read back (`rbd_get_size`, which
//! refreshes the header first) on a thread of its own, as the watcher runs
//! on a librbd thread. What each side sees:
//!
//! - A connection opened after that sees the new size: NBD tells a client
//!   the size once, in the handshake, and has no way to tell it again, so a
//!   client connected before keeps the size it was told until it
//!   reconnects.
//! - An iSCSI session already logged in is told at its next command:
//!   its unit follows the size read here, and its nexus is owed CAPACITY
//!   DATA HAS CHANGED (`braid-iscsi-target`'s `unit::Described`). Every
//!   gateway hears librbd's watch for itself, so each tells its own
//!   sessions, with no message between gateways.
//! - Such a client may still send a write past the new end of a shrunk
//!   image. librbd would cut it at the end it knows and report success, so
//!   every write is checked against the size here first and refused whole
//!   (`ENOSPC`, as NBD answers a write past the end). A change announced
//!   and not yet read back makes the next write read the size itself (on
//!   the synchronous path) before it goes to librbd.

use std::sync::Arc;

use braid_rbd::{Image, UpdateWatch};
use braid_store::source::format_size;
use tracing::{info, warn};

use super::volume::RbdVolume;

fn past_the_end() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::ENOSPC)
}

impl RbdVolume {
    /// Registers the update watcher on `image` (one opened for this
    /// volume): a change makes the size read again.
    pub(crate) fn watch_size(self: &Arc<Self>, image: &Arc<Image>) -> Result<UpdateWatch, String> {
        let me = Arc::downgrade(self);
        image
            .watch_updates(move || {
                let Some(vol) = me.upgrade() else { return };
                vol.size.told();
                std::thread::spawn(move || {
                    if let Err(e) = vol.reread_size() {
                        warn!("{}: reading the size after a change: {e}", vol.spec);
                    }
                });
            })
            .map_err(|e| format!("{}: {e}", self.spec))
    }

    /// Reads the image's size from librbd and keeps it.
    ///
    /// # Errors
    ///
    /// librbd's, when the header cannot be read.
    pub(crate) fn reread_size(&self) -> std::io::Result<u64> {
        let announced = self.size.announced();
        let now = self.check(self.image().size())?;
        let before = self.size.keep(announced, now);
        if before != now {
            info!(
                "{}: the image was resized from {} to {} (rbd resize): new connections see the \
                 new size and iSCSI sessions are told at their next command; an NBD client \
                 connected before keeps the old one until it reconnects{}",
                self.spec,
                format_size(before),
                format_size(now),
                if now < before {
                    ", and its writes past the new end are refused"
                } else {
                    ""
                }
            );
        }
        Ok(now)
    }

    /// Checks that a write of `len` bytes at `offset` ends inside the
    /// image as it is now, reading the size first if it changed.
    ///
    /// # Errors
    ///
    /// `ENOSPC` past the end; librbd's error reading the size.
    pub(crate) fn within(&self, offset: u64, len: u64) -> std::io::Result<()> {
        let size = if self.size.fresh() {
            self.size.get()
        } else {
            self.reread_size()?
        };
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(past_the_end()),
        }
    }

    /// Whether [`Self::within`] passes without asking librbd: then the
    /// write may start with no thread waiting on it.
    pub(crate) fn within_now(&self, offset: u64, len: u64) -> bool {
        self.size.fresh()
            && offset
                .checked_add(len)
                .is_some_and(|end| end <= self.size.get())
    }
}
