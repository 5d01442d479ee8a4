//! What an engine chunk is in SCSI. What its outcome means is decided
//! without I/O, in `braid_iscsi::initiator::verdict`.

use braid_iscsi::initiator::cdb;
use braid_iscsi::initiator::session::Command;
use bytes::Bytes;

use crate::engine::{Op, SendChunk};

/// The SCSI command for an engine chunk (not a probe) to unit `lun` of
/// `block_size` bytes a block; `None` for an operation iSCSI paths do not
/// offer (the volume never advertises it).
pub(super) fn command(
    s: &SendChunk,
    payload: Option<Bytes>,
    lun: u64,
    block_size: u32,
) -> Option<Command> {
    let bs = u64::from(block_size.max(1));
    let lba = s.offset / bs;
    let blocks = u32::try_from(u64::from(s.len) / bs).ok()?;
    let fua = s.flags.fua();
    let (cdb, read, write) = match s.op {
        Op::Read => (cdb::read16(lba, blocks), s.len, None),
        Op::Write => (cdb::write16(lba, blocks, fua), 0, Some(payload?)),
        Op::Flush => (cdb::synchronize_cache16(), 0, None),
        Op::Trim | Op::WriteZeroes | Op::Cache | Op::BlockStatus => return None,
    };
    Some(Command {
        lun,
        cdb,
        read,
        write,
    })
}
