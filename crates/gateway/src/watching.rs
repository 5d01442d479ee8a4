//! The barrier watch of an image this gateway writes (`barrier.rs`):
//! registered when the gateway joins, and registered again when it lapses.
//!
//! A watch breaks for two reasons. This client was blocklisted: it may
//! write nothing more, and reconnects as a new client (`Ceph::lost`). Or
//! the OSD went unheard for the watch's timeout, as in a cluster-wide
//! stall (`ceph osd pause`, every OSD busy): that is no failure of this
//! gateway, and stopping to serve for it would make its clients fence it
//! and leave it blocklisted when the cluster came back. So a lapsed watch
//! is registered again in the background, and until it is, every write
//! first fetches the newest OSD map (`RbdVolume::before_write`), which is
//! all a barrier would have made this gateway do. A barrier that passed
//! while the watch was gone did not wait for this gateway; so the new
//! watch is counted on only once the map fetched after its registration
//! has arrived: a barrier before the registration is covered by that
//! fetch, one after it reaches the watch.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use braid_proto::braid_ns::ConnId;
use braid_rbd::Watch;
use tracing::{info, warn};

use super::volume::RbdVolume;

impl RbdVolume {
    /// Starts watching the barrier object (an image this gateway writes).
    pub(crate) fn watch_barrier(self: &Arc<Self>) -> Result<(), String> {
        let watch = self.register()?;
        self.install(watch);
        Ok(())
    }

    /// Registers a watch of the barrier object for the image's current
    /// client, without counting on it yet.
    fn register(self: &Arc<Self>) -> Result<Watch, String> {
        let io = self.ioctx();
        let me = Arc::downgrade(self);
        let tag = self.current().tag;
        let reader = me.clone();
        let changed = move || {
            if let Some(vol) = reader.upgrade() {
                if let Err(e) = vol.look() {
                    warn!("{}: reading the gateway registry: {e}", vol.spec);
                }
            }
        };
        let lost = me.clone();
        let broken = move |err| {
            if err != braid_rbd::EBLOCKLISTED {
                if let Some(vol) = me.upgrade() {
                    vol.rewatch(tag, err);
                }
                return;
            }
            if let Some(vol) = lost.upgrade() {
                vol.lost(
                    tag,
                    format!(
                        "the watch on the barrier object broke ({})",
                        std::io::Error::from_raw_os_error(err)
                    ),
                );
            }
        };
        let vol = Arc::downgrade(self);
        let fresh = move || match vol.upgrade() {
            Some(vol) => vol.fresh_osdmap(tag),
            None => Err("the gateway is stopping".into()),
        };
        let vol = Arc::downgrade(self);
        let drop_conns = move |ids: Vec<ConnId>| {
            if let Some(vol) = vol.upgrade() {
                vol.drop_conns(tag, &ids);
            }
        };
        let timeout = self.ceph.watch_timeout();
        super::barrier::watch(
            &io,
            &self.image_id,
            timeout,
            fresh,
            drop_conns,
            changed,
            broken,
        )
        .map_err(|e| format!("{}: watching the barrier object: {e}", self.spec))
    }

    /// Counts on `watch` from now on (the one it replaces is unregistered
    /// outside the lock: its callbacks may be reading the handle).
    fn install(&self, watch: Watch) {
        let old = self
            .handle
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .watch
            .replace(watch);
        drop(old);
    }

    /// Stops watching the barrier object (an incarnation that stopped
    /// writing: its fences need not wait for it).
    pub(crate) fn unwatch(&self) {
        let watch = self
            .handle
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .watch
            .take();
        drop(watch);
    }

    /// The watch of incarnation `tag` lapsed with `err` (not a blocklist):
    /// registers it again on a thread of its own, retrying until it is
    /// watched, the incarnation is replaced or the gateway stops.
    fn rewatch(self: &Arc<Self>, tag: u64, err: i32) {
        if self.rewatching.swap(true, Ordering::SeqCst) {
            return;
        }
        warn!(
            "{}: the barrier watch lapsed ({}): each write fetches the newest OSD map first \
             until it is watched again",
            self.spec,
            std::io::Error::from_raw_os_error(err)
        );
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("braid-rewatch".into())
            .spawn(move || {
                let mut delay = Duration::from_millis(200);
                while me.current().tag == tag && !me.ceph.stopping() {
                    let again = me.register().and_then(|w| {
                        super::osdmap::latest(&me.current().cluster)
                            .map_err(|e| format!("{}: {e}", me.spec))?;
                        Ok(w)
                    });
                    match again {
                        Ok(w) if me.current().tag == tag => {
                            me.install(w);
                            info!("{}: the barrier object is watched again", me.spec);
                            break;
                        }
                        Ok(_) => break,
                        Err(e) => warn!("{e}; trying again in {delay:?}"),
                    }
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                me.rewatching.store(false, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            self.rewatching.store(false, Ordering::SeqCst);
            warn!(
                "{}: starting to watch the barrier object again: {e}",
                self.spec
            );
        }
    }
}
