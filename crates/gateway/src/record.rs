//! This gateway's record in an image and its lease: written when it
//! joins, renewed by a heartbeat every period, read to learn which other
//! gateways are alive, and the expired ones fenced (`lease.rs` decides;
//! this does the RADOS part).

use braid_rbd::Image;
use tracing::{info, warn};

use super::deadline::METADATA_DEADLINE;
use super::lease::{self, Entry};
use super::volume::RbdVolume;

impl RbdVolume {
    /// Writes this incarnation's record in the image's metadata (when it
    /// joins; `lease.rs`) and its first heartbeat.
    pub(crate) fn record(&self, portals: &[String]) -> braid_rbd::Result<()> {
        let inc = self.current();
        let (key, entry) = {
            let mut l = self.lease();
            l.seq += 1;
            let key = lease::key(inc.tag);
            let entry = Entry {
                v: lease::VERSION,
                scope: self.scope.clone(),
                tag: self.ceph.tag(),
                client: inc.tag,
                addr: inc.addr.clone(),
                gid: inc.gid,
                portals: portals.to_vec(),
                iscsi: self.ceph.iscsi_portals(),
                lease_ms: u64::try_from(self.ceph.lease().as_millis()).unwrap_or(u64::MAX),
                seq: l.seq,
                alone: self.ceph.alone(),
                host: super::hostname(),
                pid: std::process::id(),
            };
            (key, entry)
        };
        let (image, k, json) = (self.image(), key.clone(), entry.to_json());
        self.bounded_by(
            METADATA_DEADLINE,
            "writing this gateway's record",
            move || image.metadata_set(&k, &json),
        )?;
        self.lease().own = Some(key);
        self.beat()
    }

    /// Renews this incarnation's lease: a heartbeat in the barrier
    /// object's map, not a change of the image's metadata (`lease.rs`).
    pub(crate) fn beat(&self) -> braid_rbd::Result<()> {
        let (key, seq) = {
            let mut l = self.lease();
            l.seq += 1;
            (lease::key(self.current().tag), l.seq)
        };
        let oid = super::barrier::object(&self.image_id);
        let io = self.ioctx();
        self.counters.renewal(|| {
            self.bounded("renewing this gateway's lease", move || {
                io.omap_set(&oid, &key, seq.to_string().as_bytes())
            })
        })
    }

    /// Removes the record under `key` and its heartbeat.
    pub(super) fn unrecord(&self, key: &str) -> braid_rbd::Result<()> {
        let (image, io) = (self.image(), self.ioctx());
        let (key, oid) = (key.to_owned(), super::barrier::object(&self.image_id));
        self.bounded_by(METADATA_DEADLINE, "removing a gateway record", move || {
            image.metadata_remove(&key)?;
            io.omap_remove(&oid, &key)
        })
    }

    /// Takes this incarnation's record back (a join that met another).
    pub(crate) fn withdraw(&self) -> braid_rbd::Result<()> {
        let own = self.lease().own.take();
        match own {
            Some(key) => self.unrecord(&key),
            None => Ok(()),
        }
    }

    /// Reads the registry: remembers the live gateways, removes records
    /// copied from another image, and returns the records whose lease ran
    /// out.
    pub(crate) fn look(&self) -> braid_rbd::Result<lease::View> {
        let image = self.image();
        let listed = self.records()?;
        // Read after the records: a record's first heartbeat is written
        // after it, so a record listed is never judged without it.
        let (io, oid) = (self.ioctx(), super::barrier::object(&self.image_id));
        let beats =
            lease::heartbeats(&self.bounded("reading the lease heartbeats", move || {
                io.omap_list(&oid, lease::PREFIX)
            })?);
        let own = lease::key(self.current().tag);
        let now = self.ceph.clock();
        let view = {
            let mut l = self.lease();
            let view = l.observed.update(now, &own, &self.scope, &listed, &beats);
            l.live.clone_from(&view.live);
            view
        };
        for key in &view.foreign {
            self.remove_foreign(&image, key);
        }
        Ok(view)
    }

    /// Removes a record that names another image's gateway (copied with
    /// the image's metadata by a clone, copy or migration).
    pub(super) fn remove_foreign(&self, image: &Image, key: &str) {
        match image.metadata_remove(key) {
            Ok(()) => info!(
                "{}: removed {key}, a gateway record copied from another image (a clone, copy \
                 or migration copies the metadata); its gateway serves that image, not this one",
                self.spec
            ),
            Err(e) => warn!(
                "{}: removing {key}, copied from another image: {e}",
                self.spec
            ),
        }
    }

    /// One lease period's work: renew, look, fence what expired.
    pub(crate) fn tick(&self) -> braid_rbd::Result<()> {
        self.beat()?;
        let view = self.look()?;
        for e in view.expired {
            if !self.ceph.can_blocklist() {
                let mut l = self.lease();
                if !l.reported.contains(&e.tag) {
                    l.reported.push(e.tag);
                    warn!(
                        "{}: the lease of gateway {} (host {}, pid {}) ran out, and this Ceph \
                         user may not blocklist it; if it is gone, remove its record: rbd \
                         image-meta remove {} {}",
                        self.spec,
                        e.addr,
                        e.host,
                        e.pid,
                        self.rbd_name(),
                        e.key()
                    );
                }
                continue;
            }
            info!(
                "{}: the lease of gateway {} (host {}, pid {}) ran out: fencing it",
                self.spec, e.addr, e.host, e.pid
            );
            if let Err(why) = super::fence::fence_entry(self, &e) {
                warn!("{}: {why}; trying again next period", self.spec);
            }
        }
        Ok(())
    }
}
