//! The OSD map barrier behind a cross-gateway fence.
//!
//! Blocklisting a stale gateway makes the OSDs refuse its operations once
//! they hold the OSD map that names it. An OSD takes a new map before it
//! executes any operation stamped with a newer map epoch than its own, and
//! executes one placement group's operations in order; so an operation
//! that carries the blocklist's epoch shuts every later operation of the
//! stale client out of the data it touches. The gateway that blocklisted
//! has that epoch (`Cluster::blocklist_add` waits for it), but a client
//! re-sends the fenced writes through whichever gateway it likes, and
//! another gateway may still stamp them with an older epoch: an OSD behind
//! on maps could then execute the re-sent write and after it the stale
//! one. So before a fence is confirmed, every live gateway of the image is
//! made to fetch the newest map: each watches one object per image, and
//! the fencing gateway notifies it and waits for every watcher's
//! acknowledgement, which each sends only after
//! `rados_wait_for_latest_osdmap` returned (on a bounded pool of threads,
//! each waiting a bounded time: `acks.rs`, `osdmap.rs`). (An OSD drops the watches of a
//! blocklisted client, so the stale gateway is not waited for; if its
//! watch lingers, its timeout is excused by its global id.)
//!
//! The object, `braid_gateways.<image id>`, lives in the image's RADOS
//! namespace (so images of one name in two namespaces never share one),
//! holds the gateways' lease heartbeats in its map (`lease.rs`), and stays
//! after the image is removed (`rados -p POOL [-N
//! NAMESPACE] rm braid_gateways.<id>`).

use std::sync::Arc;
use std::time::Duration;

use braid_rbd::{IoCtx, Watch};
use tracing::{debug, warn};

use super::acks::Pool;

/// What a barrier notification carries.
const PAYLOAD: &[u8] = b"braid osdmap barrier v1";

/// A gateway joined or left the image's registry: every gateway reads it
/// again at once, rather than at its next lease renewal, so that clients
/// learn of a new gateway from any other right away.
const CHANGED: &[u8] = b"braid registry changed v1";

/// The object the gateways of image `id` watch.
pub fn object(image_id: &str) -> String {
    format!("braid_gateways.{image_id}")
}

/// How many threads acknowledge one image's barrier notifications, and
/// how many notifications may wait for them (`acks.rs`).
const ACK_THREADS: usize = 2;
const ACK_QUEUE: usize = 16;

/// Creates the image's barrier object if needed and watches it: each
/// barrier notification is acknowledged once `fresh` says this client has
/// the newest OSD map; `changed` runs when another gateway joined or left.
/// Both run on a bounded pool of threads (`acks.rs`): a notification that
/// finds it full goes unanswered, and its fence is asked again. `broken`
/// runs (on a librados thread) when the watch fails: this gateway may then
/// miss a barrier, so it must stop serving.
///
/// # Errors
///
/// The object cannot be created or watched.
pub fn watch(
    io: &Arc<IoCtx>,
    image_id: &str,
    timeout: Duration,
    fresh: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    changed: impl Fn() + Send + Sync + 'static,
    broken: impl Fn(i32) + Send + Sync + 'static,
) -> braid_rbd::Result<Watch> {
    let oid = object(image_id);
    io.touch(&oid)?;
    let acker = io.clone();
    let oid2 = oid.clone();
    let (fresh, changed) = (Arc::new(fresh), Arc::new(changed));
    let pool = Pool::new("braid-barrier", ACK_THREADS, ACK_QUEUE);
    io.watch(
        &oid,
        timeout,
        move |n| {
            let (io, oid, fresh, changed) =
                (acker.clone(), oid2.clone(), fresh.clone(), changed.clone());
            // Callbacks run on a librados thread, which must not wait.
            let queued = pool.try_run(move || {
                if n.data == CHANGED {
                    changed();
                }
                if n.data == PAYLOAD {
                    if let Err(e) = fresh() {
                        // Not acknowledged: the fence waits and retries.
                        warn!("barrier: could not fetch the newest OSD map: {e}");
                        return;
                    }
                }
                if let Err(e) = io.notify_ack(&oid, n.notify_id, n.cookie) {
                    debug!("barrier: acknowledging: {e}");
                }
            });
            if !queued {
                warn!(
                    "barrier: too many notifications waiting for the newest OSD map; this one \
                     goes unanswered, and its fence is asked again"
                );
            }
        },
        broken,
    )
}

/// Tells the other gateways of image `id` that the registry changed (no
/// answer awaited beyond a second; they also read it every period).
pub fn announce(io: &IoCtx, image_id: &str) {
    if let Err(e) = io.notify(&object(image_id), CHANGED, Duration::from_secs(1)) {
        debug!("announcing a registry change: {e}");
    }
}

/// Makes every gateway watching image `id`'s barrier object fetch the
/// newest OSD map; returns once all have said so, except those whose
/// global id is in `excused` (blocklisted ones).
///
/// # Errors
///
/// A watcher did not answer within `timeout`, or the notification failed:
/// the fence must not be confirmed yet.
pub fn run(io: &IoCtx, image_id: &str, timeout: Duration, excused: &[u64]) -> Result<(), String> {
    let oid = object(image_id);
    let outcome = io
        .notify(&oid, PAYLOAD, timeout)
        .map_err(|e| format!("OSD map barrier: {e}"))?;
    let late: Vec<u64> = outcome
        .timed_out
        .iter()
        .map(|&(gid, _)| gid)
        .filter(|gid| !excused.contains(gid))
        .collect();
    if late.is_empty() {
        debug!(acked = outcome.acked.len(), "OSD map barrier passed");
        Ok(())
    } else {
        Err(format!(
            "OSD map barrier: gateway client(s) {} did not confirm the newest OSD map within \
             {timeout:?}",
            late.iter()
                .map(|g| format!("client.{g}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}
