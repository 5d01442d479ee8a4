//! The LUN behind an iSCSI target as the store's export makes it: how
//! SCSI describes the export, what [`braid_scsi::dispatch`] needs to know
//! of its storage, and the one place a block error becomes an answer (the
//! commands that touch the medium are in [`super::media`]).

use braid_block::Error;
use braid_scsi::dispatch::Medium;
use braid_scsi::respond::Unit;
use braid_scsi::Sense;

pub(crate) use braid_scsi::dispatch::{transfer_len, Outcome, BLOCK, MAX_TRANSFER};

use crate::export::Export;

/// The unit as SCSI describes it through the portal with tag `tag`, of
/// the target named `target`, served by the process `instance`.
pub fn describe(export: &Export, target: &str, tag: u16, instance: u128) -> Unit {
    // The instance tells an initiator whether what was acknowledged may be
    // gone. Servers of one export that lose nothing when one of them dies
    // (a Ceph image's gateways without a cache) name the export's, as
    // they do over NBD: else each gateway's path would look like one to
    // another process, a restart, and the initiator would fail the other
    // gateway's path and write its whole window again at every change.
    let instance = export
        .peers
        .as_ref()
        .and_then(|p| p.instance())
        .map_or(instance, |i| i.0);
    let a = export.storage.abilities();
    // UNMAP punches holes, which read back as zeroes; without allocation
    // status GET LBA STATUS could not answer. Storage reached elsewhere
    // makes no such promise of its holes.
    let thin = a.trim && a.block_status && export.storage.backend().is_some();
    Unit {
        blocks: export.size() / u64::from(BLOCK),
        block_size: BLOCK,
        uuid: *export.volume.as_bytes(),
        read_only: export.read_only || a.read_only,
        thin,
        zeroes_after_unmap: thin,
        rotational: a.rotational,
        max_transfer_blocks: MAX_TRANSFER / BLOCK,
        relative_port: tag,
        port_group: tag,
        target_port: format!("{target},t,0x{tag:04x}"),
        instance: Some(instance),
    }
}

/// What the dispatch needs to know of `export`'s storage, with the
/// caching page's WCE `write_cache`: whether COMPARE AND WRITE and
/// ORWRITE are offered (their read and write can be made atomic here, by
/// this server's range lock or, for COMPARE AND WRITE, by the storage).
pub fn medium(export: &Export, write_cache: bool) -> Medium {
    Medium {
        write_cache,
        atomic: braid_store::compound::atomic(export),
        compare_and_write: braid_store::compound::compares_and_writes(export),
    }
}

/// The one place a block error becomes the answer to a SCSI command. Storage
/// lost to this server is answered by closing the connection (the store's
/// rule, as over NBD): the initiator takes it for a failed path, fences
/// and sends the command elsewhere. A MEDIUM ERROR would tell it the data
/// itself is bad, which no multipath layer retries on another path; an
/// ALUA state or ABORTED COMMAND that the command never ran, so it would
/// be sent elsewhere at once, unfenced, though part of a write may have
/// landed. Anything else is a medium error in the direction the command
/// moved data (`write`: it changes the medium); the words go to the log.
pub(crate) fn failed(e: &Error, write: bool) -> Outcome {
    tracing::debug!(kind = %e.kind, "iSCSI command failed: {}", e.message);
    if braid_store::exec::lost(e) {
        return Outcome::Lost;
    }
    Outcome::Check(if write {
        Sense::WRITE_ERROR
    } else {
        Sense::READ_ERROR
    })
}
