//! Fencing another gateway: the fence an initiator asks of a connection
//! id this gateway did not issue, and the cleaning of a record whose lease
//! ran out.
//!
//! A connection id names the gateway process that issued it (its high 64
//! bits are the process's tag, see `registry.rs`), and the image's gateway
//! registry maps a tag to the RADOS address of that process's client for
//! the image (`lease.rs`; each image of a gateway has its own client, so
//! a blocklist cuts that image's connections only). A process may have
//! two records for an image for a moment: an earlier client's (found
//! blocklisted, its connections closed and drained before the new client
//! wrote its record) and the current one's. Each is fenced as below, so a
//! gateway asked to fence ids of another process:
//!
//! - of its own: nothing to do here (its own registry fences them).
//! - with no record: nothing to do. A record goes only after its gateway
//!   stopped cleanly (no write of it left in flight, `writes.rs`) or after
//!   it was blocklisted and the OSD map barrier passed. A record copied
//!   from another image (`lease.rs`) is no record of this image's: it is
//!   removed, and its gateway is not fenced.
//! - with a record that is alive by its lease: it asks that gateway,
//!   through the barrier object, to close the named connections and
//!   answer once every request they had received has ended (the same
//!   promise as a fence on one server). A gateway that answers is not
//!   blocklisted: it was alive, and a client's opinion of one path (or a
//!   stall of the whole cluster, during which every path looks dead) is no
//!   reason to cut every connection of it. One that does not answer in
//!   time is treated as stalled, below; one that does not watch the object
//!   at that moment (its watch lapsed and is being registered again) makes
//!   the fence fail, and the client asks again.
//! - with a record that expired, or alive and silent: it blocklists that address, runs
//!   the OSD map barrier (`barrier.rs`), and only then removes the record
//!   and confirms. From then on the OSDs refuse everything the stale
//!   gateway still holds, so nothing it held can land after the re-sent
//!   writes. Without the capability to blocklist it refuses the fence,
//!   saying why; the initiator keeps the writes waiting and tries again.

use std::time::Duration;

use braid_proto::braid_ns::ConnId;
use tracing::{info, warn};

use super::barrier;
use super::lease::{self, Entry};
use super::volume::RbdVolume;
use crate::registry::Registry;

/// How long a live gateway has to drop the connections a client fences
/// before it is blocklisted.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long every live gateway has to confirm the newest OSD map.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(5);

/// How long past its own timeout a notification may take to return (an
/// OSD that does not answer the notification itself: `deadline.rs`).
const MARGIN: Duration = Duration::from_secs(2);

/// How long a blocklist command (and the wait for the OSD map that names
/// it) may take before the fence fails and is asked again; the monitors'
/// own bound is longer (`MON_TIMEOUT`).
const BLOCKLIST_DEADLINE: Duration = Duration::from_secs(10);

/// Fences connection ids this gateway does not have (blocking: Ceph calls).
///
/// # Errors
///
/// Why the fence cannot be confirmed (yet), for the asker.
pub(super) fn fence_ids(vol: &RbdVolume, ids: &[ConnId]) -> Result<(), String> {
    let mut tags: Vec<u64> = ids.iter().map(|id| Registry::tag_of(*id)).collect();
    tags.sort_unstable();
    tags.dedup();
    let mut listed = None;
    for tag in tags {
        if vol.ceph.own_tag(tag) {
            continue;
        }
        let listed = match &listed {
            Some(l) => l,
            None => listed.insert(vol.records().map_err(|e| e.to_string())?),
        };
        let named: Vec<ConnId> = ids
            .iter()
            .copied()
            .filter(|id| Registry::tag_of(*id) == tag)
            .collect();
        // Every record of that gateway process for this image: its current
        // client's, and an earlier client's not yet removed (one a fence
        // blocklisted, or one the process replaced itself).
        for entry in records_of(vol, listed, tag)? {
            fence_record(vol, &entry, &named)?;
        }
    }
    Ok(())
}

/// The records in `listed` of the gateway process whose connection ids
/// carry `tag`; records copied from another image are removed instead.
///
/// # Errors
///
/// A record under that process's key that this version cannot read.
fn records_of(
    vol: &RbdVolume,
    listed: &[(String, String)],
    tag: u64,
) -> Result<Vec<Entry>, String> {
    let mut out = Vec::new();
    for (key, value) in listed {
        let Some(entry) = Entry::parse(value) else {
            if *key == lease::key(tag) {
                return Err(format!(
                    "the record {key} in {}'s metadata is not one this braid can read; remove \
                     it once its gateway is stopped (rbd image-meta remove {} {key})",
                    vol.spec,
                    vol.rbd_name()
                ));
            }
            continue;
        };
        if entry.tag != tag {
            continue;
        }
        if entry.scope != vol.scope {
            vol.remove_foreign(&vol.image(), key);
            continue;
        }
        out.push(entry);
    }
    Ok(out)
}

/// Fences the client of `entry`, whose gateway issued connections
/// `named`: asked first if it is alive, blocklisted if not or if it does
/// not answer in time.
fn fence_record(vol: &RbdVolume, entry: &Entry, named: &[ConnId]) -> Result<(), String> {
    let key = entry.key();
    // Under the test hook nothing stands between a stalled gateway's held
    // write and the cluster: a drop request queued for it could close the
    // connection before the gateway, resumed, reads the write.
    if !skip_blocklist_for_tests() && vol.live().iter().any(|e| e.key() == key) {
        let (io, id, gid, named) = (vol.ioctx(), vol.image_id.clone(), entry.gid, named.to_vec());
        let asked = vol
            .deadlines
            .within(
                ASK_TIMEOUT + MARGIN,
                "asking a gateway to drop connections",
                move || Ok(barrier::ask_drop(&io, &id, gid, &named, ASK_TIMEOUT)),
            )
            .map_err(|e| e.to_string())??;
        match asked {
            barrier::Asked::Dropped => {
                info!(
                    gateway = %entry.addr,
                    host = %entry.host,
                    pid = entry.pid,
                    "a client fences connections of another gateway, alive: it dropped them"
                );
                return Ok(());
            }
            barrier::Asked::Absent => {
                return Err(format!(
                    "gateway {} (host {}, pid {}) is alive by its lease and not watching the \
                     image's barrier object now; ask again",
                    entry.addr, entry.host, entry.pid
                ));
            }
            barrier::Asked::Late => {}
        }
    }
    warn!(
        gateway = %entry.addr,
        host = %entry.host,
        pid = entry.pid,
        "a client fences connections of another gateway: blocklisting it"
    );
    fence_entry(vol, entry)
}

/// Blocklists the gateway of `entry`, passes the OSD map barrier, then
/// removes the record.
///
/// # Errors
///
/// This user may not blocklist, the monitors are unreachable, or a live
/// gateway did not confirm the barrier.
pub(super) fn fence_entry(vol: &RbdVolume, entry: &Entry) -> Result<(), String> {
    if !vol.ceph.can_blocklist() {
        return Err(format!(
            "gateway {} (host {}, pid {}) must be fenced, and this gateway's Ceph user may not \
             blocklist (add `osd blocklist` to its mon caps, e.g. mon 'profile rbd')",
            entry.addr, entry.host, entry.pid
        ));
    }
    let inc = vol.current();
    if skip_blocklist_for_tests() {
        warn!(gateway = %entry.addr, "TEST HOOK: not blocklisting the stale gateway");
    } else {
        let (cluster, addr) = (inc.cluster.clone(), entry.addr.clone());
        vol.deadlines
            .within(BLOCKLIST_DEADLINE, "blocklisting", move || {
                cluster.blocklist_add(&addr, None)
            })
            .map_err(|e| format!("blocklisting gateway {}: {e}", entry.addr))?;
        vol.counters.blocklisted();
    }
    if skip_barrier_for_tests() {
        warn!(gateway = %entry.addr, "TEST HOOK: confirming the fence without the OSD map barrier");
    } else {
        let (io, id, gid) = (vol.ioctx(), vol.image_id.clone(), entry.gid);
        vol.counters.barrier(|| {
            vol.deadlines
                .within(BARRIER_TIMEOUT + MARGIN, "OSD map barrier", move || {
                    Ok(super::barrier::run(&io, &id, BARRIER_TIMEOUT, &[gid]))
                })
                .map_err(|e| e.to_string())?
        })?;
    }
    vol.unrecord(&entry.key())
        .map_err(|e| format!("removing the record of fenced gateway {}: {e}", entry.addr))?;
    info!(
        gateway = %entry.addr,
        host = %entry.host,
        pid = entry.pid,
        "gateway fenced: blocklisted, every live gateway has the OSD map that says so, record removed"
    );
    Ok(())
}

/// Test hook: with `BRAID_DANGER_NO_BLOCKLIST` set in a build with the
/// `test-hooks` feature, fences skip the blocklist, and the request to a
/// live gateway to drop its connections before it (to show a test that
/// the stale write then lands).
fn skip_blocklist_for_tests() -> bool {
    danger_hook("BRAID_DANGER_NO_BLOCKLIST")
}

/// Test hook: with `BRAID_DANGER_NO_BARRIER` set in a build with the
/// `test-hooks` feature, a fence is confirmed once the blocklist is in,
/// without waiting for every live gateway to have the map that says so
/// (to show a test that a re-sent write served by a gateway still on an
/// older map can then be overwritten by the stale gateway's).
fn skip_barrier_for_tests() -> bool {
    danger_hook("BRAID_DANGER_NO_BARRIER")
}

/// Whether the test hook `var` is set, in a build with `test-hooks`.
fn danger_hook(var: &str) -> bool {
    braid_store::TEST_HOOKS && std::env::var_os(var).is_some()
}
