//! The LUN behind an iSCSI target as the store's export makes it: how
//! SCSI describes the export (and how one session's description follows
//! its size), what [`braid_scsi::dispatch`] needs to know of its storage,
//! and the one place a block error becomes an answer (the commands that
//! touch the medium are in [`super::media`]).

use std::sync::{Arc, PoisonError, RwLock};

use braid_block::{Error, ErrorKind};
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

/// The unit as one session's nexus last had it described, kept with the
/// session. An export's size can change under a live session (`rbd
/// resize` of a gateway's image, which the gateway learns from librbd's
/// watch): everything that answers from the size (READ CAPACITY, the
/// range checks, the block count in VPD pages and copy descriptors) must
/// then follow it, and the nexus is owed CAPACITY DATA HAS CHANGED
/// (SBC-4 4.6). Comparing at each command is enough: a unit attention is
/// only ever delivered to a command, and the size is one atomic read.
#[derive(Debug)]
pub(crate) struct Described(RwLock<Arc<Unit>>);

impl Described {
    /// The unit as [`describe`] has it now.
    pub fn of(export: &Export, target: &str, tag: u16, instance: u128) -> Self {
        Self(RwLock::new(Arc::new(describe(
            export, target, tag, instance,
        ))))
    }

    /// The unit with the export's size as it is now, `size` bytes. When
    /// that changed since the last call, `changed` runs with the blocks
    /// before and now, once per change however many commands ask at the
    /// same time.
    pub fn now(&self, size: u64, changed: impl FnOnce(u64, u64)) -> Arc<Unit> {
        let blocks = size / u64::from(BLOCK);
        let unit = self.0.read().unwrap_or_else(PoisonError::into_inner);
        if unit.blocks == blocks {
            return unit.clone();
        }
        drop(unit);
        let mut unit = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if unit.blocks != blocks {
            changed(unit.blocks, blocks);
            let mut next = Unit::clone(&unit);
            next.blocks = blocks;
            *unit = Arc::new(next);
        }
        unit.clone()
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

/// As [`failed`], for a job of `len` bytes at `offset` on `export`. A
/// write the storage refused for want of room that no longer ends inside
/// the export met a shrink between the range check and the storage (a
/// gateway reads the size again before it refuses such a write whole:
/// `resize.rs`): it is answered as the range check answers now, LOGICAL
/// BLOCK ADDRESS OUT OF RANGE, not as a medium error. (A file export's
/// size never changes while it is served, so there the rule never
/// applies.)
pub(crate) fn failed_at(e: &Error, export: &Export, offset: u64, len: u64, write: bool) -> Outcome {
    let past_end = offset
        .checked_add(len)
        .is_none_or(|end| end > export.size());
    if write && e.kind == ErrorKind::NoSpace && past_end {
        return Outcome::Check(Sense::LBA_OUT_OF_RANGE);
    }
    failed(e, write)
}

#[cfg(test)]
mod tests {
    use braid_store::backend::FileBackend;

    use super::*;

    #[test]
    fn a_sessions_unit_follows_the_exports_size_and_a_change_is_news_once() {
        let storage = Arc::new(FileBackend::memory(8 << 20).unwrap());
        let export = Export::local("vol", "", storage, false, uuid::Uuid::nil());
        let described = Described::of(&export, "iqn.2026-11.org.example:t", 1, 7);
        let mut news = Vec::new();
        let mut blocks = |size: u64| described.now(size, |was, now| news.push((was, now))).blocks;
        assert_eq!(blocks(8 << 20), 16384);
        assert_eq!(blocks(16 << 20), 32768, "grown");
        assert_eq!(blocks(16 << 20), 32768);
        assert_eq!(blocks(4 << 20), 8192, "shrunk");
        assert_eq!(news, [(16384, 32768), (32768, 8192)], "each change once");
        let unit = described.now(4 << 20, |_, _| panic!("no change"));
        assert_eq!(
            (unit.block_size, unit.target_port.as_str()),
            (512, "iqn.2026-11.org.example:t,t,0x0001"),
            "the rest of the description kept"
        );
    }

    #[test]
    fn a_write_refused_past_a_new_end_is_out_of_range_not_a_medium_error() {
        let storage = Arc::new(FileBackend::memory(8 << 20).unwrap());
        let export = Export::local("vol", "", storage, false, uuid::Uuid::nil());
        let full = Error::new(ErrorKind::NoSpace, "writing 512 bytes");
        let answer = |offset, write| match failed_at(&full, &export, offset, 512, write) {
            Outcome::Check(s) => s,
            other => panic!("{other:?}"),
        };
        assert_eq!(answer(8 << 20, true), Sense::LBA_OUT_OF_RANGE);
        assert_eq!(answer((8 << 20) - 256, true), Sense::LBA_OUT_OF_RANGE);
        assert_eq!(answer(0, true), Sense::WRITE_ERROR, "no room inside it");
        assert_eq!(answer(8 << 20, false), Sense::READ_ERROR);
    }
}
