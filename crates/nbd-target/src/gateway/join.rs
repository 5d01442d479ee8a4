//! Joining an image's gateways: who else is there (a gateway that must
//! serve alone, or one beside which this one may not), waiting out records
//! whose gateways may be gone, watching the barrier object, and writing
//! this incarnation's record.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::info;

use super::volume::RbdVolume;
use super::{barrier, fence, lease};

/// Joins the registry of `vol`'s image: checks who else is there, watches
/// the barrier object, writes this incarnation's record.
pub(super) fn join(vol: &Arc<RbdVolume>, portals: &[String]) -> Result<(), String> {
    let ceph = &vol.ceph;
    let first = vol
        .look()
        .map_err(|e| format!("{}: reading the gateway registry: {e}", vol.spec))?;
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
                lease::key(e.tag)
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
                if e.seq
                    != conflicts
                        .iter()
                        .find(|c| c.tag == e.tag)
                        .map_or(e.seq, |c| c.seq)
                {
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
    vol.watch_barrier()?;
    vol.renew(portals).map_err(|e| {
        format!(
            "{}: writing this gateway's record in the image: {e}",
            vol.spec
        )
    })?;
    barrier::announce(&vol.ioctx(), &vol.image_id);
    info!(
        image = %vol.spec,
        gateways = vol.live().len() + 1,
        "joined the image's gateways"
    );
    Ok(())
}
