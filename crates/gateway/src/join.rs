//! Joining an image's gateways: who else is there (a gateway that must
//! serve alone, or one beside which this one may not), waiting out records
//! whose gateways may be gone, watching the barrier object, and writing
//! this incarnation's record.
//!
//! Reading the registry and then writing a record are two steps, and two
//! gateways that join at once could each read a registry without the
//! other and both serve, though one of them must serve alone. So every
//! join counts itself on the barrier object (attribute `braid.joins`) with
//! a compare-and-set of the count it read before it looked at the
//! registry: of two joins that overlap, one finds the count changed, takes
//! its record back and looks again, and then sees the other's record.
//! (A join that completed before another looked has its record in what
//! the other reads: it wrote it before it counted itself.)
//!
//! A gateway that joins while another fences a stale one may register its
//! barrier watch after that fence's notification went out, so it is not
//! made to fetch the OSD map that blocklists the stale gateway; and its
//! RADOS client may have connected before that map. Its writes would then
//! carry an older map epoch, and an OSD still behind on maps would apply
//! them and after them the stale gateway's. So once its watch is
//! registered (any later barrier reaches it) it fetches the newest map,
//! and only then writes its record and serves.
//!
//! Each gateway also takes, once, a range of iSCSI port ids of its own
//! ([`super::Ceph::port_range`]), counted on the same object the same
//! way, so that initiators see every gateway's ports and port groups as
//! distinct, and a restarted gateway's as the ones it had.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::info;

use super::volume::RbdVolume;
use super::{barrier, fence, lease};

/// The barrier object's attribute that counts joins.
const JOINS: &str = "braid.joins";

/// How many times a join that kept meeting other joins looks again.
const ATTEMPTS: u32 = 10;

/// Joins the registry of `vol`'s image: checks who else is there, watches
/// the barrier object, fetches the newest OSD map, writes this
/// incarnation's record, and counts the join (retrying from the start if
/// another join came between).
pub(super) fn join(vol: &Arc<RbdVolume>, portals: &[String]) -> Result<(), String> {
    let io = vol.ioctx();
    let oid = barrier::object(&vol.image_id);
    let counting = |e: braid_rbd::Error| format!("{}: counting gateway joins: {e}", vol.spec);
    let mut watching = false;
    for attempt in 1..=ATTEMPTS {
        let count = io.xattr(&oid, JOINS).map_err(counting)?;
        settle(vol)?;
        pause_for_tests();
        if !watching {
            vol.watch_barrier()?;
            super::osdmap::latest(&vol.current().cluster)
                .map_err(|e| format!("{}: {e}", vol.spec))?;
            watching = true;
        }
        vol.record(portals).map_err(|e| {
            format!(
                "{}: writing this gateway's record in the image: {e}",
                vol.spec
            )
        })?;
        if io
            .xattr_compare_and_set(&oid, JOINS, &count, &next(&count))
            .map_err(counting)?
        {
            barrier::announce(&io, &vol.image_id);
            info!(
                image = %vol.spec,
                gateways = vol.live().len() + 1,
                "joined the image's gateways"
            );
            return Ok(());
        }
        info!(
            image = %vol.spec,
            attempt,
            "another gateway joined the image meanwhile: looking again"
        );
        vol.withdraw()
            .map_err(|e| format!("{}: taking this gateway's record back: {e}", vol.spec))?;
        // Apart, so that joins that keep meeting do not stay in step.
        let ms = 50 + u64::from(uuid::Uuid::new_v4().as_u128() as u8);
        std::thread::sleep(Duration::from_millis(ms));
    }
    Err(format!(
        "{}: other gateways kept joining the image at the same moment ({ATTEMPTS} tries); start \
         this one again",
        vol.spec
    ))
}

/// The join count after `count` (empty: none yet).
fn next(count: &[u8]) -> Vec<u8> {
    (parse(count).unwrap_or(0) + 1).to_string().into_bytes()
}

/// Test hook: with `BRAID_TEST_JOIN_PAUSE=PATH` in a build with the
/// `test-hooks` feature, a join that has read the registry (its RADOS
/// client connected, its barrier watch not yet registered, its record not
/// yet written) waits while PATH exists (at most two minutes), so that a
/// test can start two joins at once, or fence while one is under way.
fn pause_for_tests() {
    super::hooks::hold("BRAID_TEST_JOIN_PAUSE", "join paused");
}

/// Reads the registry and settles who else is there: a gateway that must
/// serve alone (or beside which this one must) stops the join, unless its
/// record goes unrenewed, when it is fenced.
fn settle(vol: &Arc<RbdVolume>) -> Result<(), String> {
    let ceph = &vol.ceph;
    let first = vol
        .look()
        .map_err(|e| format!("{}: reading the gateway registry: {e}", vol.spec))?;
    let first_marks = first.marks;
    let mut conflicts: Vec<lease::Entry> = first
        .live
        .into_iter()
        .filter(|e| ceph.alone() || e.alone)
        .collect();
    if !conflicts.is_empty() {
        if !ceph.can_blocklist() {
            let e = &conflicts[0];
            return Err(format!(
                "{}: gateway {} (host {}, pid {}) has a record in the image's metadata, and \
                 this Ceph user may not blocklist, so this gateway may only serve the image \
                 alone. Stop that gateway, or if it is gone remove its record (rbd image-meta \
                 remove {} {}), or give this user `osd blocklist` in its mon caps",
                vol.spec,
                e.addr,
                e.host,
                e.pid,
                vol.rbd_name(),
                e.key()
            ));
        }
        // A record that is never renewed is a gateway that is gone or
        // stalled: fenced once its lease runs out. One that is renewed is
        // a live gateway that cannot share the image.
        let deadline = Instant::now()
            + conflicts
                .iter()
                .map(lease::Entry::lease)
                .max()
                .unwrap_or_default()
            + Duration::from_secs(1);
        info!(
            "{}: waiting up to {:?} to see whether the gateway(s) recorded in the image are alive",
            vol.spec,
            deadline - Instant::now()
        );
        while !conflicts.is_empty() {
            std::thread::sleep(Duration::from_millis(250));
            let view = vol.look().map_err(|e| e.to_string())?;
            if let Some(e) = view
                .live
                .iter()
                .find(|e| conflicts.iter().any(|c| c.tag == e.tag))
            {
                if view.marks.get(&e.tag) != first_marks.get(&e.tag) {
                    return Err(format!(
                        "{}: gateway {} (host {}, pid {}) serves this image{}; {}",
                        vol.spec,
                        e.addr,
                        e.host,
                        e.pid,
                        if e.alone { " alone" } else { "" },
                        if ceph.alone() {
                            "this gateway must serve it alone (its rbd cache is on); stop the other"
                        } else {
                            "stop it first"
                        }
                    ));
                }
            }
            for e in view.expired {
                if conflicts.iter().any(|c| c.tag == e.tag) {
                    fence::fence_entry(vol, &e)?;
                    conflicts.retain(|c| c.tag != e.tag);
                }
            }
            if Instant::now() > deadline && !conflicts.is_empty() {
                return Err(format!(
                    "{}: the recorded gateways did not settle",
                    vol.spec
                ));
            }
        }
    }
    Ok(())
}

/// The barrier object's attribute that counts the port ranges given out
/// to the image's gateways, and the prefix of each gateway's own.
const PORT_RANGES: &str = "braid.port-ranges";
const PORT_RANGE: &str = "braid.port-range.";

/// Most port ranges one image gives out (each of 256 ids, within iSCSI's
/// 16-bit relative port and group ids).
const MAX_PORT_RANGES: u64 = 255;

impl super::Ceph {
    /// The range of iSCSI port ids (relative target ports, target port
    /// groups and portal group tags) of the gateway whose stable identity
    /// is `gateway` (kept in its state directory): its number among the
    /// gateways that ever served the first image this process serves, from
    /// 0, allocated once with a compare-and-set of a count on the image's
    /// barrier object, so that two gateways never share one and a
    /// restarted gateway gets its own back. `None` without an image to
    /// write (blocking: Ceph calls).
    ///
    /// # Errors
    ///
    /// The object could not be read or written, or every range is taken.
    pub fn port_range(&self, gateway: &str) -> Result<Option<u16>, String> {
        let Some(vol) = self.writable().into_iter().next() else {
            return Ok(None);
        };
        let (io, oid) = (vol.ioctx(), barrier::object(&vol.image_id));
        let failed = |e: braid_rbd::Error| format!("{}: numbering iSCSI ports: {e}", vol.spec);
        let key = format!("{PORT_RANGE}{gateway}");
        for _ in 0..ATTEMPTS * 4 {
            let mine = io.xattr(&oid, &key).map_err(failed)?;
            if !mine.is_empty() {
                return parse(&mine)
                    .and_then(|n| u16::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| {
                        format!(
                            "{}: attribute {key} of {oid} is not a number braid wrote",
                            vol.spec
                        )
                    });
            }
            let count = io.xattr(&oid, PORT_RANGES).map_err(failed)?;
            let n = parse(&count).unwrap_or(0);
            if n >= MAX_PORT_RANGES {
                return Err(format!(
                    "{}: {n} gateways have served this image with iSCSI, and each keeps its \
                     port ids for good; remove the attributes {PORT_RANGE}* of {oid} (rados \
                     rmxattr) of gateways that are gone for good",
                    vol.spec
                ));
            }
            if io
                .xattr_compare_and_set(&oid, PORT_RANGES, &count, &next(&count))
                .map_err(failed)?
            {
                // The range is this gateway's from now on; had the same
                // identity taken one meanwhile (it cannot: one process
                // per state directory), the loop reads that one.
                io.xattr_compare_and_set(&oid, &key, b"", n.to_string().as_bytes())
                    .map_err(failed)?;
            }
        }
        Err(format!(
            "{}: other gateways kept numbering their iSCSI ports at the same moment; start \
             this one again",
            vol.spec
        ))
    }
}

impl super::Ceph {
    /// Writes this incarnation's record of every image again (what it
    /// publishes changed), and tells the other gateways to read it.
    pub(super) fn rewrite_records(&self) -> Result<(), String> {
        let Some(started) = self.started.get() else {
            return Ok(());
        };
        for vol in self.writable().into_iter().filter(|v| v.joined()) {
            vol.record(&started.portals)
                .map_err(|e| format!("{}: writing this gateway's record: {e}", vol.spec))?;
            barrier::announce(&vol.ioctx(), &vol.image_id);
        }
        Ok(())
    }
}

fn parse(count: &[u8]) -> Option<u64> {
    std::str::from_utf8(count).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_join_count_starts_from_nothing_and_grows() {
        assert_eq!(next(b""), b"1");
        assert_eq!(next(b"41"), b"42");
        assert_eq!(next(b"not a number"), b"1");
    }
}
