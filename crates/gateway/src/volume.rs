//! One RBD image served by this gateway: opened, checked and identified;
//! other gateways' portals and fencing their connections (`Peers`). Its
//! record and lease in the image are in `record.rs`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use braid_proto::braid_ns::{ConnId, InstanceId};
use braid_rbd::{Image, IoCtx, UpdateWatch, Watch};
use tracing::warn;
use uuid::Uuid;

use super::lease::{self, Entry, Observed};
use super::servable::{check_cache, exclusive_lock_refusal, identity_name, IDENTITY_NAMESPACE};
use super::size::Size;
use super::writes::{InFlight, Writes};
use super::Ceph;
use crate::export::{PeerFence, Peers};
use crate::source::RbdSpec;

/// An RBD image as an export of this gateway.
#[derive(Debug)]
pub struct RbdVolume {
    pub(crate) ceph: Arc<Ceph>,
    /// The export's name here.
    pub(super) export: String,
    pub(super) spec: RbdSpec,
    pub(super) read_only: bool,
    /// Changes with `rbd resize` (`resize.rs`).
    pub(crate) size: Size,
    /// The object map answers allocation without asking the OSDs.
    pub(crate) fast_diff: bool,
    pub(super) image_id: String,
    /// What this image's gateway records name (`lease::Scope`).
    pub(super) scope: lease::Scope,
    identity: Uuid,
    pub(super) handle: RwLock<Handle>,
    pub(super) lease: Mutex<LeaseState>,
    writes: Arc<Writes>,
    /// The barrier watch lapsed and is being registered again
    /// (`watching.rs`).
    pub(super) rewatching: AtomicBool,
    /// For metrics and status (`figures.rs`).
    pub(crate) counters: super::counters::Counters,
    /// The image's own RADOS client (`client.rs`).
    pub(super) inc: RwLock<Arc<super::Incarnation>>,
    /// False while the image reconnects on a new client.
    pub(super) serving: AtomicBool,
    pub(super) reopening: AtomicBool,
    /// Whether the monitors answer its client's OSD map fetches.
    pub(super) reach: Mutex<super::osdmap::Reach>,
    /// Bounds on braid's own RADOS operations of the image.
    pub(super) deadlines: super::deadline::Deadlines,
    /// What must follow the image onto a new client (`client.rs`).
    pub(super) on_rejoin: super::rejoin::OnRejoin,
}

/// The open image of the current incarnation.
#[derive(Debug)]
pub(super) struct Handle {
    pub io: Arc<IoCtx>,
    pub image: Arc<Image>,
    /// The barrier watch, for an image this gateway writes.
    pub watch: Option<Watch>,
    /// librbd's calls when the image changes (a resize).
    pub updates: Option<UpdateWatch>,
}

#[derive(Debug, Default)]
pub(super) struct LeaseState {
    pub(super) seq: u64,
    /// This incarnation's record key, once written.
    pub(super) own: Option<String>,
    pub(super) observed: Observed,
    /// Other gateways alive at the last look.
    pub(super) live: Vec<Entry>,
    /// Expired records that this user could not fence, already reported.
    pub(super) reported: Vec<u64>,
}

impl RbdVolume {
    /// Opens `spec` for export `export` and checks that it can be served
    /// as asked.
    ///
    /// # Errors
    ///
    /// No such pool, image or snapshot; no permission; or an image with
    /// exclusive-lock asked to be written (the message says what to run).
    pub fn open(
        ceph: &Arc<Ceph>,
        export: &str,
        spec: &RbdSpec,
        read_only: bool,
        identity: Option<Uuid>,
    ) -> Result<Arc<Self>, String> {
        let read_only = read_only || spec.snap.is_some();
        let inc = Arc::new(super::incarnation(ceph.connect_options())?);
        let io = inc
            .cluster
            .ioctx(&spec.pool, spec.namespace.as_deref())
            .map_err(|e| match e.errno {
                libc::ENOENT => format!("{spec}: the cluster has no pool {:?}", spec.pool),
                _ => format!("{spec}: {e}"),
            })?;
        let image =
            Image::open(&io, &spec.image, spec.snap.as_deref(), read_only).map_err(|e| match e
                .errno
            {
                libc::ENOENT => format!(
                    "{spec}: no such image{} in {} (rbd ls {} lists them{})",
                    if spec.snap.is_some() {
                        " or snapshot"
                    } else {
                        ""
                    },
                    match &spec.namespace {
                        Some(ns) => format!("namespace {ns:?} of pool {:?}", spec.pool),
                        None => format!("pool {:?}", spec.pool),
                    },
                    spec.rbd_dir(),
                    if spec.namespace.is_some() {
                        "; rbd namespace ls lists the namespaces"
                    } else {
                        ""
                    }
                ),
                _ => format!("{spec}: {e}"),
            })?;
        let features = image.features().map_err(|e| format!("{spec}: {e}"))?;
        if !read_only && features & braid_rbd::FEATURE_EXCLUSIVE_LOCK != 0 {
            return Err(exclusive_lock_refusal(spec, features));
        }
        check_cache(&image, spec, ceph.caches())?;
        let size = image.size().map_err(|e| format!("{spec}: {e}"))?;
        let image_id = image.id().map_err(|e| format!("{spec}: {e}"))?;
        let scope = lease::Scope {
            fsid: inc.cluster.fsid().map_err(|e| format!("{spec}: {e}"))?,
            pool: io.pool_id(),
            namespace: io.namespace().to_owned(),
            image: image_id.clone(),
        };
        let identity = match identity {
            Some(id) => id,
            None => {
                let mut name = identity_name(&scope);
                if let Some(snap) = &spec.snap {
                    let id = image.snap_id(snap).map_err(|e| format!("{spec}: {e}"))?;
                    name.push_str(&format!("@{id}"));
                }
                Uuid::new_v5(&IDENTITY_NAMESPACE, name.as_bytes())
            }
        };
        let vol = Arc::new(Self {
            ceph: ceph.clone(),
            export: export.to_owned(),
            spec: spec.clone(),
            read_only,
            size: Size::new(size),
            fast_diff: features & braid_rbd::FEATURE_FAST_DIFF != 0,
            image_id,
            scope,
            identity,
            handle: RwLock::new(Handle {
                io,
                image: Arc::new(image),
                watch: None,
                updates: None,
            }),
            lease: Mutex::new(LeaseState::default()),
            writes: Arc::default(),
            rewatching: AtomicBool::new(false),
            counters: Default::default(),
            inc: RwLock::new(inc),
            serving: AtomicBool::new(true),
            reopening: AtomicBool::new(false),
            reach: Mutex::default(),
            deadlines: Default::default(),
            on_rejoin: Default::default(),
        });
        let updates = vol.watch_size(&vol.image())?;
        vol.handle
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .updates = Some(updates);
        ceph.adopt(&vol);
        Ok(vol)
    }

    /// The `x-braid:volume` identity: the same on every gateway of the
    /// image (from the cluster's fsid, the pool's id, the namespace and the
    /// image's id).
    pub fn identity(&self) -> Uuid {
        self.identity
    }

    /// `POOL/[NAMESPACE/]IMAGE`, as the `rbd` command names the image.
    pub(crate) fn rbd_name(&self) -> String {
        self.spec.rbd_name()
    }

    /// How the export is described to clients and in logs.
    pub fn describe(&self) -> String {
        self.spec.to_string()
    }

    /// Whether this gateway writes the image, and so keeps a record in
    /// its registry and can be fenced.
    pub(crate) fn writes(&self) -> bool {
        !self.read_only
    }

    /// Other gateways' portals and fencing, for an image this gateway
    /// writes.
    pub fn peers(self: &Arc<Self>) -> Option<Arc<dyn Peers>> {
        self.writes().then(|| self.clone() as Arc<dyn Peers>)
    }

    pub(crate) fn image(&self) -> Arc<Image> {
        self.read_handle().image.clone()
    }

    pub(crate) fn ioctx(&self) -> Arc<IoCtx> {
        self.read_handle().io.clone()
    }

    fn read_handle(&self) -> std::sync::RwLockReadGuard<'_, Handle> {
        self.handle.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the image handle (and barrier watch) with one opened by a
    /// new incarnation; the old one is returned for closing elsewhere.
    pub(super) fn swap(&self, new: Handle) -> Handle {
        let mut h = self.handle.write().unwrap_or_else(|p| p.into_inner());
        let mut lease = self.lease();
        lease.own = None;
        let old = std::mem::replace(&mut *h, new);
        // A resize while the old client was cut off went unannounced: the
        // next write reads the size from the new handle.
        self.size.told();
        old
    }

    /// Opens this image again on `io` (a new incarnation's pool context).
    pub(super) fn reopen(self: &Arc<Self>, io: Arc<IoCtx>) -> Result<Handle, String> {
        let image = Image::open(
            &io,
            &self.spec.image,
            self.spec.snap.as_deref(),
            self.read_only,
        )
        .map_err(|e| format!("{}: {e}", self.spec))?;
        // An override set while this gateway ran takes effect at this open.
        check_cache(&image, &self.spec, self.ceph.caches())?;
        let id = image.id().map_err(|e| format!("{}: {e}", self.spec))?;
        if id != self.image_id {
            return Err(format!(
                "{}: the image was replaced (id {} is now {id}); restart braid serve",
                self.spec, self.image_id
            ));
        }
        let image = Arc::new(image);
        let updates = self.watch_size(&image)?;
        Ok(Handle {
            io,
            image,
            watch: None,
            updates: Some(updates),
        })
    }

    /// A clean stop, once every connection drained or the drain gave up:
    /// refuses further writes, waits up to `limit` for the writes still in
    /// flight to end, and only then removes this incarnation's record
    /// (`writes.rs` says why). Writes that do not end leave it in place,
    /// for the other gateways to fence this one.
    pub(crate) fn leave(&self, limit: std::time::Duration) {
        let left = self.writes.close_and_wait(limit);
        if left > 0 {
            warn!(
                "{}: {left} write(s) still in flight after {limit:?}: this gateway keeps its \
                 record in the image, so the other gateways fence it (blocklist) once its lease \
                 runs out, and none of those writes can land after a client re-sent it elsewhere",
                self.spec
            );
            return;
        }
        let own = self.lease().own.take();
        if let Some(key) = own {
            if let Err(e) = self.unrecord(&key) {
                warn!("{}: removing this gateway's record: {e}", self.spec);
            }
            super::barrier::announce(&self.ioctx(), &self.image_id);
        }
        self.unwatch();
    }

    /// Counts a write in flight before it goes to librbd (and holds it
    /// there under the test hook).
    ///
    /// # Errors
    ///
    /// `ESHUTDOWN` once the gateway is stopping: the connection closes
    /// unanswered and the client sends the write elsewhere.
    pub(crate) fn begin_write(&self) -> std::io::Result<InFlight> {
        let w = self
            .writes
            .begin()
            .ok_or_else(|| std::io::Error::from_raw_os_error(braid_rbd::EBLOCKLISTED))?;
        super::writes::hold_for_tests();
        Ok(w)
    }

    /// [`Self::begin_write`] for a write started without a thread to wait
    /// on: `None` when it must take the synchronous way.
    pub(crate) fn begin_write_now(&self) -> Option<InFlight> {
        if super::writes::holding_for_tests() {
            return None;
        }
        self.writes.begin()
    }

    /// Other gateways' records seen alive at the last look.
    pub(crate) fn live(&self) -> Vec<Entry> {
        self.lease().live.clone()
    }

    /// Whether this incarnation's record is written.
    pub(crate) fn joined(&self) -> bool {
        self.lease().own.is_some()
    }

    pub(super) fn lease(&self) -> MutexGuard<'_, LeaseState> {
        self.lease.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Before a write: makes sure this gateway missed no barrier. Its
    /// barrier watch is confirmed by the OSD every few seconds; one not
    /// confirmed for half its timeout may have lapsed (a process stopped
    /// for a while, or the OSDs), and a barrier may have passed without
    /// it, so the newest OSD map is fetched first, as it is while a watch
    /// that broke is registered again; a watch broken because this client
    /// was blocklisted means the gateway must reconnect, and the write is
    /// not made.
    ///
    /// # Errors
    ///
    /// `ESHUTDOWN` when the watch broke (the connection is then closed),
    /// or the monitors' error.
    pub(crate) fn before_write(&self) -> std::io::Result<()> {
        let seen = self.read_handle().watch.as_ref().map(Watch::check);
        match seen {
            None => Ok(()),
            Some(Ok(age)) if age < self.ceph.watch_timeout() / 2 => Ok(()),
            Some(Ok(_)) => self.check(super::osdmap::latest(&self.current().cluster)),
            Some(Err(e)) if e.blocklisted() => {
                self.lost_now(format!("{}: the barrier watch broke: {e}", self.spec));
                Err(std::io::Error::from_raw_os_error(braid_rbd::EBLOCKLISTED))
            }
            // Lapsed, not refused (the OSDs stalled): until it is watched
            // again (`watching.rs`), every write fetches the newest map
            // first, which is what a barrier would have made it do.
            Some(Err(_)) => self.check(super::osdmap::latest(&self.current().cluster)),
        }
    }

    /// The image's current client was found blocklisted, on a path that
    /// holds no `Arc` of the image.
    fn lost_now(&self, why: String) {
        if let Some(vol) = self.ceph.volume(&self.export) {
            vol.lost(vol.current().tag, why);
        }
    }

    /// Whether [`Self::before_write`] passes at once, with no call to the
    /// monitors: then a write may start with no thread waiting on it.
    pub(crate) fn write_ready_now(&self) -> bool {
        match self.read_handle().watch.as_ref().map(Watch::check) {
            None => true,
            Some(Ok(age)) => age < self.ceph.watch_timeout() / 2,
            Some(Err(_)) => false,
        }
    }

    /// Takes a librbd error: a blocklisted client makes the gateway
    /// reconnect as a new one.
    pub(crate) fn check<T>(&self, r: braid_rbd::Result<T>) -> std::io::Result<T> {
        checked(&self.ceph, &self.export, &self.spec, None, r)
    }

    /// [`Self::check`] for a completion, which runs on a librbd thread.
    pub(crate) fn checker(
        &self,
    ) -> impl FnOnce(braid_rbd::Result<()>) -> std::io::Result<()> + Send + 'static {
        // The client the operation went to: a completion of an earlier
        // one does not make the current one reconnect.
        let tag = self.current().tag;
        let (ceph, export, spec) = (self.ceph.clone(), self.export.clone(), self.spec.clone());
        move |r| checked(&ceph, &export, &spec, Some(tag), r)
    }
}

/// Takes a librbd error of export `export`'s client `tag` (`None`: the
/// current one).
fn checked<T>(
    ceph: &Arc<Ceph>,
    export: &str,
    spec: &RbdSpec,
    tag: Option<u64>,
    r: braid_rbd::Result<T>,
) -> std::io::Result<T> {
    r.map_err(|e| {
        if e.blocklisted() {
            if let Some(vol) = ceph.volume(export) {
                vol.lost(tag.unwrap_or(vol.current().tag), format!("{spec}: {e}"));
            }
        }
        e.into()
    })
}

impl Peers for RbdVolume {
    fn portals(&self) -> Vec<String> {
        self.lease()
            .live
            .iter()
            .flat_map(|e| e.portals.iter().cloned())
            .collect()
    }

    fn iscsi_portals(&self) -> Vec<(std::net::SocketAddr, u16)> {
        self.lease()
            .live
            .iter()
            .flat_map(|e| e.iscsi.iter())
            .filter_map(|(addr, tag)| Some((addr.parse().ok()?, *tag)))
            .collect()
    }

    fn instance(&self) -> Option<InstanceId> {
        // Without a cache an acknowledged write is in the cluster: no
        // gateway's restart can lose it, so every gateway reports the
        // image's own instance and a path to another gateway (or to a
        // restarted one) is no restart to the initiator. With the cache,
        // this process holds acknowledged writes: its own instance.
        (!self.ceph.caches())
            .then(|| InstanceId(Uuid::new_v5(&self.identity, b"instance").as_u128()))
    }

    fn fence(&self, ids: Vec<ConnId>) -> PeerFence {
        let me = self.ceph.volume(&self.export);
        Box::pin(async move {
            let Some(vol) = me else {
                return Err("the export is gone".to_owned());
            };
            tokio::task::spawn_blocking(move || {
                vol.counters.fence(super::fence::fence_ids(&vol, &ids))
            })
            .await
            .map_err(|e| format!("fence task: {e}"))?
        })
    }

    fn admits(&self, id: ConnId) -> bool {
        self.serving.load(Ordering::SeqCst) && self.ceph.admits(id)
    }

    fn figures(&self) -> Option<braid_store::peer_figures::PeerFigures> {
        Some(self.figures_now())
    }

    fn reservations(&self) -> Option<Arc<dyn braid_store::shared::SharedState>> {
        Some(super::shared_reservations(
            &self.ceph,
            &self.export,
            &self.image_id,
        ))
    }
}
