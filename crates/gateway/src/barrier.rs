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

use braid_proto::braid_ns::ConnId;
use braid_rbd::{IoCtx, Watch};
use tracing::{debug, warn};

use super::acks::Pool;

/// What a barrier notification carries.
const PAYLOAD: &[u8] = b"braid osdmap barrier v1";

/// A gateway joined or left the image's registry: every gateway reads it
/// again at once, rather than at its next lease renewal, so that clients
/// learn of a new gateway from any other right away.
const CHANGED: &[u8] = b"braid registry changed v1";

/// Asks the gateway that issued the connection ids that follow (hex,
/// comma-separated) to close them and answer once every request they had
/// received has ended: a fence of a live gateway without a blocklist.
const DROP: &[u8] = b"braid drop v1 ";

/// What a gateway asked to drop connections did.
#[derive(Debug, PartialEq, Eq)]
pub enum Asked {
    /// It closed them, and nothing they received is still in flight.
    Dropped,
    /// It did not answer in time: it must be blocklisted.
    Late,
    /// It does not watch the object now (its watch lapsed and is being
    /// registered again, or it left): nothing can be said yet.
    Absent,
}

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
    drop_conns: impl Fn(Vec<ConnId>) + Send + Sync + 'static,
    changed: impl Fn() + Send + Sync + 'static,
    broken: impl Fn(i32) + Send + Sync + 'static,
) -> braid_rbd::Result<Watch> {
    let oid = object(image_id);
    io.touch(&oid)?;
    let acker = io.clone();
    let oid2 = oid.clone();
    let (fresh, changed) = (Arc::new(fresh), Arc::new(changed));
    let drop_conns = Arc::new(drop_conns);
    let pool = Pool::new("braid-barrier", ACK_THREADS, ACK_QUEUE);
    io.watch(
        &oid,
        timeout,
        move |n| {
            let (io, oid, fresh, changed) =
                (acker.clone(), oid2.clone(), fresh.clone(), changed.clone());
            let drop_conns = drop_conns.clone();
            // Callbacks run on a librados thread, which must not wait.
            let queued = pool.try_run(move || {
                if n.data == CHANGED {
                    changed();
                }
                if let Some(ids) = dropped(&n.data) {
                    drop_conns(ids);
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

/// The connection ids a drop request names.
fn dropped(data: &[u8]) -> Option<Vec<ConnId>> {
    let list = std::str::from_utf8(data.strip_prefix(DROP)?).ok()?;
    list.split(',')
        .map(|id| u128::from_str_radix(id, 16).ok().map(ConnId))
        .collect()
}

/// Asks the gateway whose RADOS client is `gid` to drop connections
/// `ids` (its own) and waits up to `timeout` for it to say they ended.
///
/// # Errors
///
/// The notification failed.
pub fn ask_drop(
    io: &IoCtx,
    image_id: &str,
    gid: u64,
    ids: &[ConnId],
    timeout: Duration,
) -> Result<Asked, String> {
    let mut data = DROP.to_vec();
    let list: Vec<String> = ids.iter().map(|id| format!("{:x}", id.0)).collect();
    data.extend_from_slice(list.join(",").as_bytes());
    let outcome = io
        .notify(&object(image_id), &data, timeout)
        .map_err(|e| format!("asking a gateway to drop connections: {e}"))?;
    Ok(if outcome.acked.iter().any(|&(g, _)| g == gid) {
        Asked::Dropped
    } else if outcome.timed_out.iter().any(|&(g, _)| g == gid) {
        Asked::Late
    } else {
        Asked::Absent
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drop_request_names_its_connections_and_nothing_else_is_one() {
        let ids = [ConnId(0xab << 64 | 1), ConnId(7)];
        let list: Vec<String> = ids.iter().map(|id| format!("{:x}", id.0)).collect();
        let data = [DROP, list.join(",").as_bytes()].concat();
        assert_eq!(dropped(&data), Some(ids.to_vec()));
        assert_eq!(dropped(PAYLOAD), None);
        assert_eq!(dropped(b"braid drop v1 zz"), None);
    }
}
