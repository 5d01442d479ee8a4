//! The LUN behind an iSCSI target as the store's export makes it: how
//! SCSI describes the export, and what [`braid_scsi::dispatch`] needs to
//! know of its storage (the commands that touch the medium are in
//! [`super::media`]).

use std::sync::Arc;

use braid_scsi::dispatch::Medium;
use braid_scsi::respond::Unit;

pub(crate) use braid_scsi::dispatch::{transfer_len, Outcome, BLOCK, MAX_TRANSFER};

use crate::backend::Backend;
use crate::export::{Export, Storage};

/// The unit as SCSI describes it through the portal with tag `tag`, of
/// the target named `target`, served by the process `instance`.
pub fn describe(export: &Export, target: &str, tag: u16, instance: u128) -> Unit {
    let (thin, rotational) = match &export.storage {
        Storage::Local(b) => {
            let c = b.caps();
            // UNMAP punches holes, which read back as zeroes; without
            // allocation status GET LBA STATUS could not answer.
            (c.trim && c.extents, c.rotational)
        }
        Storage::Forwarded(_) => (false, false),
    };
    Unit {
        blocks: export.size() / u64::from(BLOCK),
        block_size: BLOCK,
        uuid: *export.volume.as_bytes(),
        read_only: export.read_only,
        thin,
        zeroes_after_unmap: thin,
        rotational,
        max_transfer_blocks: MAX_TRANSFER / BLOCK,
        relative_port: tag,
        port_group: tag,
        target_port: format!("{target},t,0x{tag:04x}"),
        instance: Some(instance),
    }
}

pub(crate) fn backend(export: &Export) -> Option<Arc<dyn Backend>> {
    match &export.storage {
        Storage::Local(b) => Some(b.clone()),
        Storage::Forwarded(_) => None,
    }
}

/// What the dispatch needs to know of `export`'s storage, with the
/// caching page's WCE `write_cache`: whether this process has it, and
/// whether COMPARE AND WRITE is offered (no other gateway writes the
/// image).
pub fn medium(export: &Export, write_cache: bool) -> Medium {
    Medium {
        present: backend(export).is_some(),
        write_cache,
        atomic: export.peers.is_none(),
    }
}
