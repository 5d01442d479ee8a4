//! EXTENDED COPY carried out in the target: the parameter list read by
//! [`braid_scsi::xcopy`], each unit it names found among every target
//! this server serves (by the NAA designator VPD page 0x83 gives it, so
//! a copy may go from one export to another), then copied by the store
//! ([`braid_store::copy`]) without the data crossing the network. A
//! unit other than the one the command was sent to is held to its own
//! reservations, as the same initiator port's READ or WRITE through this
//! target port would be.

use std::sync::Arc;

use braid_scsi::xcopy::{self, Found, Status};
use braid_store::copy::{self, End};
use tracing::debug;

use braid_scsi::{Command, NexusName};

use super::unit::{self, Outcome, BLOCK};
use crate::{Served, Shared};

/// Runs the EXTENDED COPY whose parameter list is `params`, sent by
/// `nexus` to `served` through the portal group `tag`. Each segment's
/// blocks reach stable storage before GOOD unless its destination's
/// write cache is on, as a WRITE's would.
pub async fn execute(
    shared: &Shared,
    tag: u16,
    served: &Served,
    nexus: &NexusName,
    params: &[u8],
) -> Outcome {
    let list = match xcopy::parse(params) {
        Ok(l) => l,
        Err(sense) => return Outcome::Check(sense),
    };
    let copies = match xcopy::resolve(&list, BLOCK, |naa| find(shared, tag, naa)) {
        Ok(c) => c,
        Err(sense) => return Outcome::Check(sense),
    };
    // The unit the command was sent to passed the reservation rules as
    // a write; any other a segment reads or writes passes them here, for
    // the same initiator port through the same target port.
    for c in &copies {
        let blocks = u32::try_from(c.blocks).unwrap_or(u32::MAX);
        let read = Command::Read {
            lba: c.source_lba,
            blocks,
            fua: false,
        };
        let write = Command::Write {
            lba: c.destination_lba,
            blocks,
            fua: false,
        };
        for (unit, cmd) in [(&c.source, read), (&c.destination, write)] {
            if !std::ptr::eq(&**unit, served) && unit.lu.conflicts(nexus, &cmd) {
                return Outcome::Conflict;
            }
        }
    }
    let mut status = Status {
        ok: true,
        segments: 0,
        bytes: 0,
    };
    let mut outcome = Outcome::Good(Vec::new());
    for c in copies {
        let durable = !c.destination.lu.write_cache.on();
        let len = c.blocks * u64::from(BLOCK);
        let from = End {
            export: c.source.export.clone(),
            offset: c.source_lba * u64::from(BLOCK),
        };
        let to = End {
            export: c.destination.export.clone(),
            offset: c.destination_lba * u64::from(BLOCK),
        };
        match copy::copy(&from, &to, len, durable).await {
            Ok(done) => debug!(
                from = %c.source.name,
                to = %c.destination.name,
                in_kernel = done.in_kernel,
                through_memory = done.through_memory,
                "EXTENDED COPY segment"
            ),
            Err(e) => {
                status.ok = false;
                outcome = unit::failed(&e, true);
                break;
            }
        }
        status.segments += 1;
        status.bytes += len;
    }
    if let Some(id) = list.list_id {
        served.lu.copies.put(nexus, id.into(), status);
    }
    outcome
}

/// The served target whose unit is named `naa`: with its capacity in
/// blocks and whether it may be written.
fn find(shared: &Shared, tag: u16, naa: &[u8; 16]) -> Option<Found<Arc<Served>>> {
    shared.targets.iter().find_map(|t| {
        let u = unit::describe(&t.export, &t.name, tag, shared.instance);
        (u.naa() == *naa).then(|| (t.clone(), u.blocks, !u.read_only))
    })
}
