//! `braid serve` as a gateway of Ceph RBD images, every gateway active.
//!
//! One RADOS client per process ([`Ceph`]) serves every RBD export. Each
//! gateway of an image keeps a record in the image's metadata with its
//! portals and its RADOS address, under a lease renewed by heartbeats in
//! the image's barrier object, naming the image it belongs to so that
//! copies of the metadata are told apart (`lease.rs`).
//! It joins with a compare-and-set, so that two joins at once cannot both
//! find an empty registry (`join.rs`). Every gateway answers
//! `x-braid:portal` with the portals of every live gateway, so one URI
//! gives an initiator every path through every gateway. The volume's
//! identity comes from the cluster's fsid, the pool, the RADOS namespace
//! and the image's id, the same on every gateway, and so does its instance
//! (an acknowledged write is in the cluster, whichever gateway took it).
//!
//! A stale gateway (stalled, partitioned, or its lease run out) is fenced
//! in Ceph itself: blocklisted, then every live gateway fetches the OSD
//! map that says so before the fence is confirmed (`fence.rs`,
//! `barrier.rs`). A gateway that finds itself blocklisted (an operation or
//! a renewal answered `ESHUTDOWN`, or its barrier watch broken) closes its
//! connections unanswered, waits for them to drain, and reconnects as a
//! new RADOS client with a new tag: a new incarnation, whose connection
//! ids differ from the old one's. A gateway whose barrier watch went
//! unconfirmed for a while (its process was stopped) fetches the newest
//! OSD map before its next write, as a barrier may have passed it by; a
//! joining gateway fetches it once its watch is registered. A gateway that
//! stops removes its record only once none of its writes is still in
//! flight (`writes.rs`).
//!
//! Active/active needs three things of every gateway: no write cache
//! (`rbd_cache = false`: an acknowledged write must be in the cluster, for
//! other gateways to read it and for no gateway's death to lose it; read
//! back after every open, as a pool's or an image's own setting overrides
//! it, `cache.rs`), an image without exclusive-lock (checked at open,
//! `volume.rs`), and the capability to blocklist (`osd blocklist` in the
//! user's mon caps, which `profile rbd` grants; probed at start). A gateway
//! with the cache on or without the capability serves its images alone: it
//! refuses to start beside another gateway, and others refuse to start
//! beside it.

#![cfg(feature = "rbd")]

mod acks;
mod barrier;
mod cache;
mod counters;
mod fence;
mod figures;
mod hooks;
mod join;
pub mod lease;
mod osdmap;
mod rbd;
mod resize;
mod servable;
mod size;
mod volume;
mod watching;
mod writes;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use braid_proto::braid_ns::ConnId;
use braid_rbd::Cluster;
use tracing::{error, info, warn};

pub use braid_rbd::ConnectOptions;
pub use volume::RbdVolume;

use braid_store::registry::{self, Registry};
use braid_store::{export, source};

/// How long a call to the monitors may take.
const MON_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a barrier acknowledgement waits for the newest OSD map: less
/// than the fencing gateway waits for it (`fence.rs`).
const ACK_WAIT: Duration = Duration::from_secs(4);

/// How `braid serve` reaches Ceph and behaves as a gateway.
#[derive(Clone, Debug)]
pub struct GatewayOptions {
    pub connect: ConnectOptions,
    /// How long a gateway's record lives without renewal.
    pub lease: Duration,
    /// Keep librbd's write cache (writes acknowledged before they reach
    /// the cluster; the gateway then serves alone).
    pub cache: bool,
}

/// One connection of this process to the cluster.
#[derive(Debug)]
pub(crate) struct Incarnation {
    pub cluster: Arc<Cluster>,
    /// The high 64 bits of the connection ids it issues.
    pub tag: u64,
    /// Its RADOS address, as a blocklist names it.
    pub addr: String,
    /// Its RADOS global id.
    pub gid: u64,
    /// Its fetches of the newest OSD map, for barrier acknowledgements.
    pub osdmap: Arc<osdmap::Fetcher>,
}

/// This process's RADOS client and the RBD images it serves.
#[derive(Debug)]
pub struct Ceph {
    opts: GatewayOptions,
    inc: RwLock<Arc<Incarnation>>,
    /// Tags of earlier incarnations of this process.
    past: Mutex<Vec<u64>>,
    /// False while reconnecting: no connection is admitted.
    serving: AtomicBool,
    reopening: AtomicBool,
    stopping: AtomicBool,
    can_blocklist: AtomicBool,
    volumes: Mutex<Vec<Weak<RbdVolume>>>,
    started: OnceLock<Started>,
    /// The origin of the lease clock.
    epoch: Instant,
    /// Whether the monitors answer this process's OSD map fetches.
    reach: Mutex<osdmap::Reach>,
    /// This gateway's iSCSI portals and tags, for its records.
    iscsi: Mutex<Vec<(String, u16)>>,
}

#[derive(Debug)]
struct Started {
    /// The connection registries of every front end (NBD's, iSCSI's):
    /// each fence, cut and drain covers them all.
    registries: Vec<Arc<Registry>>,
    portals: Vec<String>,
    runtime: tokio::runtime::Handle,
}

impl Ceph {
    /// Connects to the cluster (blocking). `rbd_cache` is set off unless
    /// the options keep it, and no admin socket is opened, so that several
    /// clients on one host never share one.
    ///
    /// # Errors
    ///
    /// The configuration, keyring or monitors cannot be used; the message
    /// says which.
    pub fn connect(mut opts: GatewayOptions) -> Result<Arc<Self>, String> {
        let cache = if opts.cache { "true" } else { "false" };
        // Bounds on what waits for the monitors (a blocklist, a connect):
        // a gateway cut off from them gives up and says so. Operations on
        // the OSDs get none: librbd's writes share them, and a write must
        // wait out a cluster-wide stall as a librbd client's would.
        let mon = MON_TIMEOUT.as_secs().to_string();
        opts.connect.settings.extend(
            [
                ("rbd_cache", cache),
                ("admin_socket", ""),
                ("rados_mon_op_timeout", &mon),
                ("client_mount_timeout", &mon),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
        let inc = incarnation(&opts.connect)?;
        Ok(Arc::new(Self {
            opts,
            inc: RwLock::new(Arc::new(inc)),
            past: Mutex::new(Vec::new()),
            serving: AtomicBool::new(false),
            reopening: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            can_blocklist: AtomicBool::new(false),
            volumes: Mutex::new(Vec::new()),
            started: OnceLock::new(),
            epoch: Instant::now(),
            reach: Mutex::default(),
            iscsi: Mutex::default(),
        }))
    }

    /// Joins every writable image's gateway registry, then admits
    /// connections. Call once the portals are bound and before serving;
    /// `registries` are where every front end keeps its connections.
    ///
    /// # Errors
    ///
    /// Another gateway serves an image alone, or this one must serve alone
    /// and another is there; a record cannot be written.
    pub async fn start(
        self: &Arc<Self>,
        registries: Vec<Arc<Registry>>,
        portals: Vec<String>,
    ) -> Result<(), String> {
        let me = self.clone();
        let can = tokio::task::spawn_blocking(move || me.probe_blocklist())
            .await
            .map_err(|e| e.to_string())??;
        self.can_blocklist.store(can, Ordering::SeqCst);
        if !can {
            warn!(
                "this Ceph user may not blocklist (`osd blocklist` is not in its mon caps; \
                 `profile rbd` grants it): a stalled gateway could not be fenced, so this \
                 gateway serves its images alone, and no other gateway may join it"
            );
        } else if self.opts.cache {
            warn!(
                "rbd cache on (--rbd-cache): writes are acknowledged from this gateway's memory \
                 before they reach the cluster, so a crash of this process loses them (clients \
                 replay what they did not flush) and no other gateway would see them: this \
                 gateway serves its images alone"
            );
        }
        let _ = self.started.set(Started {
            registries: registries.clone(),
            portals: portals.clone(),
            runtime: tokio::runtime::Handle::current(),
        });
        for vol in self.writable() {
            let (vol2, portals) = (vol.clone(), portals.clone());
            tokio::task::spawn_blocking(move || join::join(&vol2, &portals))
                .await
                .map_err(|e| e.to_string())??;
        }
        for r in &registries {
            r.set_tag(self.current().tag);
        }
        self.serving.store(true, Ordering::SeqCst);
        for vol in self.writable() {
            tokio::spawn(lease_loop(self.clone(), vol));
        }
        Ok(())
    }

    /// Leaves every image's registry (after the last connection drained,
    /// or the drain gave up): once the image's writes in flight have
    /// ended, within one lease, as renewals stop here.
    pub async fn stop(self: &Arc<Self>) {
        self.stopping.store(true, Ordering::SeqCst);
        self.serving.store(false, Ordering::SeqCst);
        let limit = self.lease();
        for vol in self.writable() {
            let _ = tokio::task::spawn_blocking(move || vol.leave(limit)).await;
        }
    }

    /// This gateway's iSCSI portals, as its records publish them.
    pub(crate) fn iscsi_portals(&self) -> Vec<(String, u16)> {
        self.iscsi.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Publishes this gateway's iSCSI portals (with their portal group
    /// tags) in its record of every image, for every gateway's
    /// SendTargets; records written later carry them too. Call once they
    /// are bound.
    ///
    /// # Errors
    ///
    /// A record could not be written.
    pub async fn publish_iscsi(
        self: &Arc<Self>,
        portals: Vec<(String, u16)>,
    ) -> Result<(), String> {
        *self.iscsi.lock().unwrap_or_else(|p| p.into_inner()) = portals;
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.rewrite_records())
            .await
            .map_err(|e| e.to_string())?
    }

    pub(crate) fn current(&self) -> Arc<Incarnation> {
        self.inc.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The tag of this process's current incarnation or of an earlier one.
    pub(crate) fn own_tag(&self, tag: u64) -> bool {
        self.current().tag == tag
            || self
                .past
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&tag)
    }

    pub(crate) fn can_blocklist(&self) -> bool {
        self.can_blocklist.load(Ordering::SeqCst)
    }

    pub(crate) fn caches(&self) -> bool {
        self.opts.cache
    }

    /// Whether this gateway must serve its images alone.
    pub(crate) fn alone(&self) -> bool {
        self.opts.cache || !self.can_blocklist()
    }

    pub(crate) fn lease(&self) -> Duration {
        self.opts.lease
    }

    /// How long the OSD keeps a silent gateway's barrier watch: its lease,
    /// but never under the 30 s Ceph's own watchers get, as watches are
    /// confirmed only every few seconds.
    pub(crate) fn watch_timeout(&self) -> Duration {
        self.opts.lease.max(Duration::from_secs(30))
    }

    /// The lease clock: monotonic, this process's own.
    pub(crate) fn clock(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Whether connection `id` may be served: issued by the current
    /// incarnation, which is serving.
    pub(crate) fn admits(&self, id: ConnId) -> bool {
        self.serving.load(Ordering::SeqCst) && Registry::tag_of(id) == self.current().tag
    }

    fn adopt(&self, vol: &Arc<RbdVolume>) {
        self.volumes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::downgrade(vol));
    }

    pub(crate) fn volume(&self, export: &str) -> Option<Arc<RbdVolume>> {
        self.all().into_iter().find(|v| v.export == export)
    }

    fn all(&self) -> Vec<Arc<RbdVolume>> {
        self.volumes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    fn writable(&self) -> Vec<Arc<RbdVolume>> {
        self.all().into_iter().filter(|v| v.writes()).collect()
    }

    /// Whether this user may blocklist: blocklists, for a second, an
    /// address in a range reserved for documentation (RFC 5737), which no
    /// client has.
    fn probe_blocklist(&self) -> Result<bool, String> {
        let nonce = uuid::Uuid::new_v4().as_u128() as u32;
        match self.current().cluster.blocklist_add(
            &format!("192.0.2.1:0/{nonce}"),
            Some(Duration::from_secs(1)),
        ) {
            Ok(()) => Ok(true),
            Err(e) if matches!(e.errno, libc::EACCES | libc::EPERM) => Ok(false),
            Err(e) => Err(format!(
                "checking whether this Ceph user may blocklist: {e}"
            )),
        }
    }

    /// For a barrier acknowledgement of incarnation `tag`: fetches the
    /// newest OSD map, waiting at most [`ACK_WAIT`]. Fetches that keep
    /// failing for a lease make the gateway stop serving, as if
    /// blocklisted: it drains its connections and drops its barrier
    /// watches, so fences of its images no longer wait for it, and rejoins
    /// once the monitors answer.
    pub(crate) fn fresh_osdmap(self: &Arc<Self>, tag: u64) -> Result<(), String> {
        let inc = self.current();
        if inc.tag != tag {
            return Err("the watch belongs to an earlier RADOS client".into());
        }
        let began = self.clock();
        let r = inc.osdmap.fresh(ACK_WAIT);
        let mut reach = self.reach.lock().unwrap_or_else(|p| p.into_inner());
        match &r {
            Ok(()) => reach.answered(),
            Err(e) => {
                if reach.failed(began, self.clock(), self.lease()) {
                    reach.answered();
                    drop(reach);
                    self.lost(
                        tag,
                        format!(
                            "cut off from the monitors: no OSD map for {:?} ({e})",
                            self.lease()
                        ),
                    );
                }
            }
        }
        r
    }

    /// Another gateway asks incarnation `tag` to drop connections `ids`
    /// (`fence.rs`): closes those it issued and returns once every request
    /// they had received has ended. Runs on a barrier thread, not the
    /// runtime's.
    pub(crate) fn drop_conns(&self, tag: u64, ids: &[ConnId]) {
        let Some(started) = self.started.get() else {
            return;
        };
        let mine: Vec<ConnId> = ids
            .iter()
            .copied()
            .filter(|id| Registry::tag_of(*id) == tag && self.current().tag == tag)
            .collect();
        if mine.is_empty() {
            return;
        }
        info!(
            connections = mine.len(),
            "another gateway asks this one to drop connections a client fences: closing them"
        );
        started.runtime.block_on(async {
            for r in &started.registries {
                r.fence(&mine).await;
            }
        });
    }

    /// Incarnation `tag` lost its cluster connection or was blocklisted:
    /// reconnect as a new one (once, however many report it).
    pub(crate) fn lost(self: &Arc<Self>, tag: u64, why: String) {
        if self.current().tag != tag || self.stopping.load(Ordering::SeqCst) {
            return;
        }
        if self.reopening.swap(true, Ordering::SeqCst) {
            return;
        }
        let Some(started) = self.started.get() else {
            self.reopening.store(false, Ordering::SeqCst);
            return;
        };
        let me = self.clone();
        started.runtime.spawn(async move {
            me.reconnect(&why).await;
            me.reopening.store(false, Ordering::SeqCst);
        });
    }

    async fn reconnect(self: &Arc<Self>, why: &str) {
        let Some(started) = self.started.get() else {
            return;
        };
        self.serving.store(false, Ordering::SeqCst);
        error!(
            "this gateway lost its right to write ({why}): closing its connections \
             unanswered; clients fail over, and it rejoins as a new RADOS client"
        );
        let mut cut = 0;
        for vol in self.all() {
            for r in &started.registries {
                cut += r.cut_export(&vol.export);
            }
        }
        // Nothing of the old incarnation may still be running when the new
        // one opens the images: a request that began before the cut would
        // otherwise reach the new, unfenced client.
        for conn in started.registries.iter().flat_map(|r| r.list()) {
            let export = conn
                .export
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if export.is_some_and(|e| self.volume(&e).is_some()) {
                conn.drain().await;
            }
        }
        info!(connections = cut, "old connections drained");
        // Nothing of the old incarnation runs: its barrier watches go, so
        // that no fence waits for a gateway that no longer writes.
        let me = self.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for vol in me.all() {
                vol.unwatch();
            }
        })
        .await;
        let mut delay = Duration::from_millis(200);
        loop {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let me = self.clone();
            let portals = started.portals.clone();
            match tokio::task::spawn_blocking(move || me.replace_incarnation(&portals)).await {
                Ok(Ok(())) => break,
                Ok(Err(e)) => warn!("reconnecting to the cluster: {e}; retrying in {delay:?}"),
                Err(e) => warn!("reconnecting to the cluster: {e}"),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
        for r in &started.registries {
            r.set_tag(self.current().tag);
        }
        self.serving.store(true, Ordering::SeqCst);
        info!(addr = %self.current().addr, "rejoined as a new RADOS client");
    }

    /// Connects anew, reopens every image on the new client, writes the
    /// new records; only then is the new incarnation current.
    fn replace_incarnation(self: &Arc<Self>, portals: &[String]) -> Result<(), String> {
        let inc = Arc::new(incarnation(&self.opts.connect)?);
        let mut opened = Vec::new();
        for vol in self.all() {
            let io = inc
                .cluster
                .ioctx(&vol.spec.pool, vol.spec.namespace.as_deref())
                .map_err(|e| format!("{}: {e}", vol.spec))?;
            opened.push((vol.clone(), vol.reopen(io)?));
        }
        let old = std::mem::replace(
            &mut *self.inc.write().unwrap_or_else(|p| p.into_inner()),
            inc,
        );
        self.past
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(old.tag);
        let mut old_handles = Vec::new();
        for (vol, handle) in opened {
            old_handles.push(vol.swap(handle));
        }
        // Closing images of a blocklisted client may wait on the cluster:
        // not on this path.
        std::thread::spawn(move || drop((old_handles, old)));
        for vol in self.writable() {
            join::join(&vol, portals)?;
        }
        Ok(())
    }
}

/// A fresh RADOS client with a fresh tag.
fn incarnation(opts: &ConnectOptions) -> Result<Incarnation, String> {
    let cluster = Arc::new(Cluster::connect(opts).map_err(|e| e.to_string())?);
    let addr = cluster.addrs().map_err(|e| e.to_string())?;
    let gid = cluster.instance_id();
    let fetching = cluster.clone();
    let osdmap = osdmap::Fetcher::new(move || osdmap::latest(&fetching).map_err(|e| e.to_string()));
    let mut tag = uuid::Uuid::new_v4().as_u128() as u64;
    while tag == 0 {
        tag = uuid::Uuid::new_v4().as_u128() as u64;
    }
    Ok(Incarnation {
        cluster,
        tag,
        addr,
        gid,
        osdmap,
    })
}

/// Renews `vol`'s record every third of the lease and fences expired
/// records, until the process stops.
async fn lease_loop(ceph: Arc<Ceph>, vol: Arc<RbdVolume>) {
    let period = ceph.lease() / 3;
    loop {
        tokio::time::sleep(period).await;
        if ceph.stopping.load(Ordering::SeqCst) {
            return;
        }
        if !ceph.serving.load(Ordering::SeqCst) {
            continue;
        }
        let tag = ceph.current().tag;
        let v = vol.clone();
        match tokio::task::spawn_blocking(move || v.tick()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.blocklisted() => ceph.lost(tag, format!("renewing the lease: {e}")),
            Ok(Err(e)) => warn!("{}: renewing this gateway's lease: {e}", vol.spec),
            Err(e) => warn!("lease task: {e}"),
        }
    }
}

/// This host's name, for records people read.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}
