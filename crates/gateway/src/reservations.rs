//! The SCSI reservations of an image, shared by every gateway of it.
//!
//! They live in one RADOS object per image, `braid_reservations.<image
//! id>` (in the image's namespace), as the text of one attribute. A change
//! is a read, a decision on what was read (`braid_scsi::reserve`, by the
//! iSCSI target), and a compare-and-set of the attribute against the text
//! read: of two gateways deciding at once on one state, one replaces it
//! and the other reads again and decides on the new one. The whole text is
//! the version compared, so no change can be lost or applied twice.
//!
//! A gateway that changed them then notifies the object's watchers (every
//! other gateway of the image) with what the change does to their nexuses
//! (tasks to end for a PREEMPT AND ABORT, unit attentions); each reads the
//! state again, ends the tasks, and only then acknowledges. One that does
//! not acknowledge in time is blocklisted and the OSD map barrier passed,
//! as a fence does (`fence.rs`), before the command is answered: after
//! GOOD no gateway still checks commands against the old state, or it can
//! no longer write.
//!
//! What may be stale, and for how long: a gateway whose watch the OSD
//! dropped (it was not heard from for the watch timeout, `osd client watch
//! timeout`, 30 s by default) is not waited for, as it no longer watches;
//! until librados tells it its watch broke and it has registered the
//! watch again and read the state (at once, then a second apart while that
//! fails), its copy may miss changes made in between. The notifying
//! gateway logs each such gateway. A gateway that starts watches the
//! object before it reads the state, so no change falls between.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use braid_rbd::{IoCtx, Notification, Watch};
use braid_store::shared::{Acted, OnChange, SharedState};
use tracing::{info, warn};

use super::acks::Pool;
use super::Ceph;

/// The attribute that holds the state.
const ATTR: &str = "reservations";

/// What a change announced to the other gateways starts with; the
/// target's text follows.
const MESSAGE: &[u8] = b"braid reservations v1\n";

/// How long the other gateways have to act on a change before they are
/// blocklisted.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// How many times a broken watch is registered again (at once, then a
/// second apart) before the gateway gives up and says so.
const REWATCH_TRIES: u32 = 600;

/// The object that holds image `id`'s reservations.
pub fn object(image_id: &str) -> String {
    format!("braid_reservations.{image_id}")
}

/// One image's shared reservations, as this gateway reaches them.
#[derive(Debug)]
pub(crate) struct Shared {
    inner: Arc<Inner>,
}

struct Inner {
    ceph: Arc<Ceph>,
    export: String,
    oid: String,
    watch: Mutex<Option<Watch>>,
    on_change: Mutex<Option<(OnChange, tokio::runtime::Handle)>>,
    /// Runs the target's part of each change, off librados' threads.
    pool: Pool,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner").field("oid", &self.oid).finish()
    }
}

impl Shared {
    pub fn new(ceph: Arc<Ceph>, export: String, image_id: &str) -> Self {
        Self {
            inner: Arc::new(Inner {
                ceph,
                export,
                oid: object(image_id),
                watch: Mutex::default(),
                on_change: Mutex::default(),
                pool: Pool::new("braid-reservations", 2, 16),
            }),
        }
    }
}

impl Inner {
    fn volume(&self) -> Result<Arc<super::RbdVolume>, String> {
        self.ceph
            .volume(&self.export)
            .ok_or_else(|| format!("export {} is no longer served", self.export))
    }

    fn io(&self) -> Result<Arc<IoCtx>, String> {
        Ok(self.volume()?.ioctx())
    }
}

impl SharedState for Shared {
    fn load(&self) -> Result<Vec<u8>, String> {
        let vol = self.inner.volume()?;
        vol.check(vol.ioctx().xattr(&self.inner.oid, ATTR))
            .map_err(|e| format!("reading the reservations in {}: {e}", self.inner.oid))
    }

    fn replace(&self, seen: &[u8], new: &[u8]) -> Result<bool, String> {
        let vol = self.inner.volume()?;
        let io = vol.ioctx();
        vol.check(io.xattr_compare_and_set(&self.inner.oid, ATTR, seen, new))
            .map_err(|e| format!("storing the reservations in {}: {e}", self.inner.oid))
    }

    fn announce(&self, message: Vec<u8>) -> Acted {
        let inner = self.inner.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || announce(&inner, &message))
                .await
                .map_err(|e| format!("announcing a reservation change: {e}"))?
        })
    }

    fn subscribe(&self, on_change: OnChange) {
        let rt = tokio::runtime::Handle::current();
        *lock(&self.inner.on_change) = Some((on_change, rt));
        // A watch lives on one RADOS client: when the image rejoins on a
        // new one (its old one blocklisted or cut off), the watch is
        // registered again through the new client and the state read
        // again, or this gateway would go on checking commands against a
        // copy that no other gateway's change reaches.
        if let Ok(vol) = self.inner.volume() {
            let inner = Arc::downgrade(&self.inner);
            vol.on_rejoin
                .add(Box::new(move || rewatch_later(inner.clone())));
        }
        // The target read the state before it subscribed.
        if let Err(e) = register(&self.inner, false) {
            warn!(
                "watching {}: {e}; reservation changes made through other gateways are read \
                 once it is registered again",
                self.inner.oid
            );
            rewatch_later(Arc::downgrade(&self.inner));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Notifies every watcher of the change and fences those that did not
/// act on it in time (blocking).
fn announce(inner: &Inner, message: &[u8]) -> Result<(), String> {
    let vol = inner.volume()?;
    let io = vol.ioctx();
    let me = io.cluster().instance_id();
    let data = [MESSAGE, message].concat();
    let outcome = io
        .notify(&inner.oid, &data, ASK_TIMEOUT)
        .map_err(|e| format!("telling the other gateways of a reservation change: {e}"))?;
    let heard = |gid: u64| {
        outcome.acked.iter().any(|&(g, _)| g == gid)
            || outcome.timed_out.iter().any(|&(g, _)| g == gid)
    };
    for e in vol.live().iter().filter(|e| !heard(e.gid)) {
        warn!(
            gateway = %e.addr,
            host = %e.host,
            pid = e.pid,
            "a gateway alive by its lease does not watch the reservations now (its watch \
             lapsed): it reads them again once its watch is registered again"
        );
    }
    for (gid, _) in outcome.timed_out.into_iter().filter(|&(g, _)| g != me) {
        let Some(entry) = vol.live().into_iter().find(|e| e.gid == gid) else {
            return Err(format!(
                "gateway client.{gid} did not act on a reservation change within \
                 {ASK_TIMEOUT:?} and is not in the image's gateway registry, so it cannot be \
                 fenced from here; blocklist it (ceph osd blocklist add) or wait for its watch \
                 to lapse, then send the command again"
            ));
        };
        warn!(
            gateway = %entry.addr,
            host = %entry.host,
            pid = entry.pid,
            "a gateway did not act on a reservation change in time: blocklisting it"
        );
        super::fence::fence_entry(&vol, &entry)?;
    }
    Ok(())
}

/// Watches the object (created if needed), then has the target read the
/// state again when `reread` (from a thread outside the runtime).
fn register(inner: &Arc<Inner>, reread: bool) -> Result<(), String> {
    let io = inner.io()?;
    io.touch(&inner.oid)
        .map_err(|e| format!("creating {}: {e}", inner.oid))?;
    let me = io.cluster().instance_id();
    let (on_notify, on_error) = (Arc::downgrade(inner), Arc::downgrade(inner));
    let acker = io.clone();
    let watch = io
        .watch(
            &inner.oid,
            inner.ceph.watch_timeout(),
            move |n| notified(&on_notify, &acker, me, n),
            move |err| {
                warn!("the watch of the image's reservations broke ({err}); registering it again");
                rewatch_later(on_error.clone());
            },
        )
        .map_err(|e| format!("watching {}: {e}", inner.oid))?;
    *lock(&inner.watch) = Some(watch);
    if !reread {
        return Ok(());
    }
    // A change made while no watch was registered was not told to this
    // gateway: read the state again.
    run_change(inner, Vec::new())
}

/// A notification on the object: the target acts on another gateway's
/// change, then it is acknowledged (on the pool: librados' thread must
/// not wait).
fn notified(inner: &Weak<Inner>, io: &Arc<IoCtx>, me: u64, n: Notification) {
    let Some(inner) = inner.upgrade() else {
        return;
    };
    let io = io.clone();
    let oid = inner.oid.clone();
    let ack = move || {
        if let Err(e) = io.notify_ack(&oid, n.notify_id, n.cookie) {
            warn!("acknowledging a reservation change: {e}");
        }
    };
    let Some(text) = n.data.strip_prefix(MESSAGE).map(<[u8]>::to_vec) else {
        return ack();
    };
    if n.notifier == me {
        // This gateway's own change: already acted on.
        return ack();
    }
    let job = inner.clone();
    let queued = inner.pool.try_run(move || match run_change(&job, text) {
        Ok(()) => ack(),
        Err(e) => warn!("acting on another gateway's reservation change: {e}"),
    });
    if !queued {
        warn!("too many reservation changes waiting; this one goes unanswered");
    }
}

/// Runs the target's part of a change (blocking until it ends).
fn run_change(inner: &Inner, text: Vec<u8>) -> Result<(), String> {
    let Some((on_change, rt)) = lock(&inner.on_change).clone() else {
        return Ok(());
    };
    rt.block_on(on_change(text))
}

/// Registers the watch again from another thread, a second apart until
/// it holds (a callback of the broken watch must not wait for it).
fn rewatch_later(inner: Weak<Inner>) {
    let spawned = std::thread::Builder::new()
        .name("braid-reservations-watch".into())
        .spawn(move || {
            for i in 0..REWATCH_TRIES {
                if i > 0 {
                    std::thread::sleep(Duration::from_secs(1));
                }
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                lock(&inner.watch).take();
                match register(&inner, true) {
                    Ok(()) => {
                        info!("the watch of the image's reservations is registered again");
                        return;
                    }
                    Err(e) => warn!("{e}; trying again"),
                }
            }
            warn!("the watch of the image's reservations could not be registered again");
        });
    if let Err(e) = spawned {
        warn!("starting a thread to watch the reservations again: {e}");
    }
}
