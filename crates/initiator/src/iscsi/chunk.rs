//! iSCSI's words in the engine's, one place each: what an engine chunk
//! is in SCSI, what a port's ALUA state is to the engine, and what a unit
//! attention tells the volume. What a command's outcome means is decided
//! without I/O, in `braid_iscsi::initiator::verdict`.

use braid_iscsi::initiator::cdb;
use braid_iscsi::initiator::sense::Attention;
use braid_iscsi::initiator::session::Command;
use braid_iscsi::initiator::unit::AccessState;
use bytes::Bytes;
use tracing::{info, warn};

use crate::engine::{Access, Op, SendChunk};
use crate::sink::Signal;

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

/// The engine's view of a port's ALUA state.
pub(crate) fn access(state: AccessState) -> Access {
    match state {
        AccessState::ActiveOptimized => Access::Optimized,
        AccessState::ActiveNonOptimized => Access::NonOptimized,
        AccessState::Standby => Access::Standby,
        AccessState::Transitioning => Access::Transitioning,
        AccessState::Unavailable | AccessState::Other(_) => Access::Unavailable,
    }
}

/// What a unit attention on a session of the volume tells it, if
/// anything.
pub(crate) fn signal_of(attention: Attention) -> Option<Signal> {
    match attention {
        Attention::Reset => Some(Signal::Restarted(
            "a live session was told of a power on or reset (29h)",
        )),
        // Another initiator's reset (29/03) aborts tasks but loses no
        // acknowledged write: nothing to replay.
        Attention::LuReset | Attention::NexusLoss => None,
        Attention::AccessChanged => Some(Signal::AccessChanged),
        // The command that met it is sent again; the volume keeps the
        // size it was opened at, as its NBD paths do, and a path that
        // reconnects is checked against that size.
        Attention::CapacityChanged => {
            info!(
                "the unit's capacity changed (2Ah/09h): the volume keeps the size it was \
                 opened at until it is attached again"
            );
            None
        }
        other => {
            warn!(?other, "unit attention");
            None
        }
    }
}
