//! One image's RADOS client: what a blocklist of it ends, and how the
//! image comes back on a new one.
//!
//! Every image a gateway serves has a client of its own, so that fencing
//! this gateway's client for one image (a client's fence, or a lease that
//! ran out) cuts that image's connections and no other's. A client found
//! blocklisted (an operation or a renewal answered `ESHUTDOWN`, or the
//! barrier watch broken) makes the image close its connections unanswered,
//! wait for them to drain, and reopen on a new client, which writes a new
//! record under a new key before the image serves again; the other images
//! go on as they were. The same happens to an image whose client cannot
//! get OSD maps from the monitors for its lease: its fences would
//! otherwise wait for it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use braid_proto::braid_ns::ConnId;
use tracing::{error, info, warn};

use super::volume::RbdVolume;
use super::{incarnation, lease, Incarnation, ACK_WAIT};
use crate::registry::Registry;

impl RbdVolume {
    /// The image's current RADOS client.
    pub(crate) fn current(&self) -> Arc<Incarnation> {
        self.inc.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// False while the image reconnects: none of its connections is
    /// admitted.
    pub(crate) fn serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
    }

    /// Runs one of braid's own RADOS operations of the image, waiting for
    /// it at most [`super::deadline::OP_DEADLINE`] (`deadline.rs`).
    pub(super) fn bounded<T: Send + 'static>(
        &self,
        what: &str,
        op: impl FnOnce() -> braid_rbd::Result<T> + Send + 'static,
    ) -> braid_rbd::Result<T> {
        self.bounded_by(super::deadline::OP_DEADLINE, what, op)
    }

    /// As [`Self::bounded`], waiting at most `limit`.
    pub(super) fn bounded_by<T: Send + 'static>(
        &self,
        limit: std::time::Duration,
        what: &str,
        op: impl FnOnce() -> braid_rbd::Result<T> + Send + 'static,
    ) -> braid_rbd::Result<T> {
        self.deadlines
            .within(limit, &format!("{}: {what}", self.spec), op)
    }

    /// The gateway records in the image's metadata, as listed.
    pub(super) fn records(&self) -> braid_rbd::Result<Vec<(String, String)>> {
        let image = self.image();
        self.bounded("reading the gateway registry", move || {
            image.metadata_list(lease::PREFIX)
        })
    }

    /// For a barrier acknowledgement of client `tag`: fetches the newest
    /// OSD map, waiting at most [`ACK_WAIT`]. Fetches that keep failing for
    /// a lease make the image stop serving, as if blocklisted: it drains
    /// its connections and drops its barrier watch, so fences of it no
    /// longer wait for this gateway, and rejoins once the monitors answer.
    pub(crate) fn fresh_osdmap(self: &Arc<Self>, tag: u64) -> Result<(), String> {
        let inc = self.current();
        if inc.tag != tag {
            return Err("the watch belongs to an earlier RADOS client".into());
        }
        let began = self.ceph.clock();
        let r = inc.osdmap.fresh(ACK_WAIT);
        let mut reach = self.reach.lock().unwrap_or_else(|p| p.into_inner());
        match &r {
            Ok(()) => reach.answered(),
            Err(e) => {
                if reach.failed(began, self.ceph.clock(), self.ceph.lease()) {
                    reach.answered();
                    drop(reach);
                    self.lost(
                        tag,
                        format!(
                            "cut off from the monitors: no OSD map for {:?} ({e})",
                            self.ceph.lease()
                        ),
                    );
                }
            }
        }
        r
    }

    /// Another gateway asks this one to drop connections `ids` (`fence.rs`)
    /// through the watch of client `tag`: closes those this process issued
    /// and returns once every request they had received has ended. Runs on
    /// a barrier thread, not the runtime's.
    pub(crate) fn drop_conns(&self, tag: u64, ids: &[ConnId]) {
        let Some((registries, _, runtime)) = self.ceph.registries() else {
            return;
        };
        if self.current().tag != tag {
            return;
        }
        let mine: Vec<ConnId> = ids
            .iter()
            .copied()
            .filter(|id| self.ceph.own_tag(Registry::tag_of(*id)))
            .collect();
        if mine.is_empty() {
            return;
        }
        info!(
            connections = mine.len(),
            "another gateway asks this one to drop connections a client fences: closing them"
        );
        runtime.block_on(async {
            for r in registries {
                r.fence(&mine).await;
            }
        });
    }

    /// Client `tag` lost its cluster connection or was blocklisted:
    /// reconnect the image on a new one (once, however many report it).
    pub(crate) fn lost(self: &Arc<Self>, tag: u64, why: String) {
        if self.current().tag != tag || self.ceph.stopping() {
            return;
        }
        if self.reopening.swap(true, Ordering::SeqCst) {
            return;
        }
        let Some((_, _, runtime)) = self.ceph.registries() else {
            self.reopening.store(false, Ordering::SeqCst);
            return;
        };
        let me = self.clone();
        runtime.spawn(async move {
            me.reconnect(&why).await;
            me.reopening.store(false, Ordering::SeqCst);
        });
    }

    async fn reconnect(self: &Arc<Self>, why: &str) {
        let Some((registries, portals, _)) = self.ceph.registries() else {
            return;
        };
        self.serving.store(false, Ordering::SeqCst);
        error!(
            "{}: this gateway lost its right to write ({why}): closing the image's connections \
             unanswered; clients fail over, and it rejoins as a new RADOS client",
            self.spec
        );
        let cut: usize = registries.iter().map(|r| r.cut_export(&self.export)).sum();
        // Nothing of the old client may still be running when the new one
        // opens the image: a request that began before the cut would
        // otherwise reach the new, unfenced client.
        for conn in registries.iter().flat_map(|r| r.list()) {
            let export = conn
                .export
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if export.as_deref() == Some(self.export.as_str()) {
                conn.drain().await;
            }
        }
        info!(image = %self.spec, connections = cut, "old connections drained");
        // Nothing of the old client runs: its barrier watch goes, so that
        // no fence waits for a client that no longer writes.
        let me = self.clone();
        let _ = tokio::task::spawn_blocking(move || me.unwatch()).await;
        let mut delay = Duration::from_millis(200);
        loop {
            if self.ceph.stopping() {
                return;
            }
            let me = self.clone();
            let portals = portals.to_vec();
            match tokio::task::spawn_blocking(move || me.replace_incarnation(&portals)).await {
                Ok(Ok(())) => break,
                Ok(Err(e)) => warn!("reconnecting to the cluster: {e}; retrying in {delay:?}"),
                Err(e) => warn!("reconnecting to the cluster: {e}"),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
        self.serving.store(true, Ordering::SeqCst);
        info!(image = %self.spec, addr = %self.current().addr, "rejoined as a new RADOS client");
        self.on_rejoin.run();
    }

    /// Connects anew, reopens the image on the new client, writes its new
    /// record; only then is the new client current.
    fn replace_incarnation(self: &Arc<Self>, portals: &[String]) -> Result<(), String> {
        let inc = Arc::new(incarnation(self.ceph.connect_options())?);
        let io = inc
            .cluster
            .ioctx(&self.spec.pool, self.spec.namespace.as_deref())
            .map_err(|e| format!("{}: {e}", self.spec))?;
        let handle = self.reopen(io)?;
        let old = std::mem::replace(
            &mut *self.inc.write().unwrap_or_else(|p| p.into_inner()),
            inc,
        );
        let old_handle = self.swap(handle);
        // Closing an image of a blocklisted client may wait on the
        // cluster: not on this path.
        std::thread::spawn(move || drop((old_handle, old)));
        if self.writes() {
            super::join::join(self, portals)?;
        }
        Ok(())
    }
}
