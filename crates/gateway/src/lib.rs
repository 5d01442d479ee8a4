//! `braid serve` as a gateway of Ceph RBD images, every gateway active.
//!
//! Each RBD export has a RADOS client of its own (`client.rs`), so that a
//! blocklist of one image's client cuts only that image's connections.
//! Each gateway of an image keeps a record in the image's metadata with
//! its portals and that client's address, under a lease renewed by heartbeats in
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
//! a renewal answered `ESHUTDOWN`, or its barrier watch broken) closes
//! that image's connections unanswered, waits for them to drain, and
//! reconnects it as a new RADOS client with a new record: a new
//! incarnation of the image's client. A gateway whose barrier watch went
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
mod client;
mod counters;
mod deadline;
mod fence;
mod figures;
mod hooks;
mod join;
pub mod lease;
mod osdmap;
mod rbd;
mod record;
mod rejoin;
mod reservations;
mod resize;
mod servable;
mod size;
mod volume;
mod watching;
mod writes;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use braid_proto::braid_ns::ConnId;
use braid_rbd::Cluster;
use tracing::warn;

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
    /// Where each RADOS client of this process opens its admin socket
    /// (`None`: nowhere).
    pub admin_sockets: Option<PathBuf>,
}

/// One RADOS client of one image of this process.
#[derive(Debug)]
pub(crate) struct Incarnation {
    pub cluster: Arc<Cluster>,
    /// Names its record (`lease::key`); a new client, a new tag.
    pub tag: u64,
    /// Its RADOS address, as a blocklist names it.
    pub addr: String,
    /// Its RADOS global id.
    pub gid: u64,
    /// Its fetches of the newest OSD map, for barrier acknowledgements.
    pub osdmap: Arc<osdmap::Fetcher>,
}

/// How this process reaches the cluster, and the RBD images it serves
/// (each with a RADOS client of its own).
#[derive(Debug)]
pub struct Ceph {
    opts: GatewayOptions,
    /// A client for what concerns no image (whether this user may
    /// blocklist), connected first so that a wrong configuration is said
    /// before any image is opened.
    probe: Arc<Cluster>,
    /// The high 64 bits of every connection id this process issues.
    tag: u64,
    /// False until started and once stopping: no connection is admitted.
    serving: AtomicBool,
    stopping: AtomicBool,
    can_blocklist: AtomicBool,
    volumes: Mutex<Vec<Weak<RbdVolume>>>,
    started: OnceLock<Started>,
    /// The origin of the lease clock.
    epoch: Instant,
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
    /// the options keep it. Admin sockets are opened only in the directory
    /// the options name, one per client (`$cctid` tells the clients of one
    /// process apart): a path from the configuration would be shared by
    /// every client of this process, and by other processes.
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
        let asok = admin_socket(opts.admin_sockets.as_deref());
        opts.connect.settings.extend(
            [
                ("rbd_cache", cache),
                ("admin_socket", &asok),
                ("rados_mon_op_timeout", &mon),
                ("client_mount_timeout", &mon),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
        let probe = Arc::new(Cluster::connect(&opts.connect).map_err(|e| e.to_string())?);
        Ok(Arc::new(Self {
            opts,
            probe,
            tag: fresh_tag(),
            serving: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            can_blocklist: AtomicBool::new(false),
            volumes: Mutex::new(Vec::new()),
            started: OnceLock::new(),
            epoch: Instant::now(),
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
            r.set_tag(self.tag);
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

    /// Whether connection ids with `tag` are this process's.
    pub(crate) fn own_tag(&self, tag: u64) -> bool {
        self.tag == tag
    }

    /// The tag of the connection ids this process issues.
    pub(crate) fn tag(&self) -> u64 {
        self.tag
    }

    pub(crate) fn connect_options(&self) -> &ConnectOptions {
        &self.opts.connect
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
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

    /// The connection registries of every front end, the portals and the
    /// runtime, once started.
    #[allow(clippy::type_complexity)]
    pub(crate) fn registries(
        &self,
    ) -> Option<(&[Arc<Registry>], &[String], &tokio::runtime::Handle)> {
        self.started
            .get()
            .map(|s| (&s.registries[..], &s.portals[..], &s.runtime))
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

    /// Whether connection `id` may be served: issued by this process,
    /// which is serving.
    pub(crate) fn admits(&self, id: ConnId) -> bool {
        self.serving.load(Ordering::SeqCst) && Registry::tag_of(id) == self.tag
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
        match self.probe.blocklist_add(
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
}

/// The `admin_socket` setting of every RADOS client of this process: in
/// `dir`, one per client (Ceph fills in `$cluster`, `$name`, `$pid` and
/// `$cctid`, the last unique per client within a process); `""` (none)
/// without a directory.
fn admin_socket(dir: Option<&Path>) -> String {
    dir.map_or_else(String::new, |d| {
        d.join("$cluster-$name.$pid.$cctid.asok")
            .display()
            .to_string()
    })
}

/// A random tag, never 0.
fn fresh_tag() -> u64 {
    let mut tag = uuid::Uuid::new_v4().as_u128() as u64;
    while tag == 0 {
        tag = uuid::Uuid::new_v4().as_u128() as u64;
    }
    tag
}

/// A fresh RADOS client with a fresh tag.
pub(crate) fn incarnation(opts: &ConnectOptions) -> Result<Incarnation, String> {
    let cluster = Arc::new(Cluster::connect(opts).map_err(|e| e.to_string())?);
    let addr = cluster.addrs().map_err(|e| e.to_string())?;
    let gid = cluster.instance_id();
    let fetching = cluster.clone();
    let osdmap = osdmap::Fetcher::new(move || osdmap::latest(&fetching).map_err(|e| e.to_string()));
    Ok(Incarnation {
        cluster,
        tag: fresh_tag(),
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
        if !ceph.serving.load(Ordering::SeqCst) || !vol.serving() {
            continue;
        }
        let tag = vol.current().tag;
        let v = vol.clone();
        match tokio::task::spawn_blocking(move || v.tick()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.blocklisted() => vol.lost(tag, format!("renewing the lease: {e}")),
            Ok(Err(e)) => warn!("{}: renewing this gateway's lease: {e}", vol.spec),
            Err(e) => warn!("lease task: {e}"),
        }
    }
}

/// The reservations of image `image_id` (export `export`), shared by its
/// gateways (`reservations.rs`).
pub(crate) fn shared_reservations(
    ceph: &Arc<Ceph>,
    export: &str,
    image_id: &str,
) -> Arc<dyn braid_store::shared::SharedState> {
    let shared = reservations::Shared::new(ceph.clone(), export.to_owned(), image_id);
    Arc::new(shared)
}

/// This host's name, for records people read.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}
