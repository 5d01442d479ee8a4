//! What an engine chunk is in SCSI, and what a command's outcome means for
//! it: done, failed with which error, sent again (after a unit attention,
//! while the target is busy, or when a task management function of any
//! session aborted it before it ran), or sent to another path (ALUA).

use std::time::Duration;

use braid_iscsi::initiator::cdb;
use braid_iscsi::initiator::sense::{key, Attention, SenseData, Verdict};
use braid_iscsi::initiator::session::{Command, Outcome};
use braid_iscsi::initiator::unit::AccessState;
use braid_iscsi::scsi::sense::status;
use braid_proto::{CmdFlags, Errno};
use bytes::Bytes;

use super::conn::{Pending, UnitIo};
use crate::engine::{Op, SendChunk};

/// Times a command is sent again after unit attentions before it fails:
/// each attention is reported once, so a handful means something is wrong.
const ATTENTION_TRIES: u32 = 8;

/// Times a command is sent again while the target is busy, or its
/// command was aborted, and how long between tries.
const BUSY_TRIES: u32 = 100;
const BUSY_DELAY: Duration = Duration::from_millis(20);

/// What follows from an outcome.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Done: deliver the data and complete.
    Good,
    Fail(Errno, String),
    /// Send again after the delay (reporting the attention first).
    Again(Duration, Option<Attention>),
    /// Not executed: the port is not active; another path takes it.
    Elsewhere(AccessState),
}

/// The SCSI command for an engine chunk (not a probe); `None` for an
/// operation iSCSI paths do not offer (the volume never advertises it).
pub(super) fn command(s: &SendChunk, payload: Option<Bytes>, unit: UnitIo) -> Option<Command> {
    let bs = u64::from(unit.block_size.max(1));
    let lba = s.offset / bs;
    let blocks = u32::try_from(u64::from(s.len) / bs).ok()?;
    let fua = s.flags.0 & CmdFlags::FUA != 0;
    let (cdb, read, write) = match s.op {
        Op::Read => (cdb::read16(lba, blocks), s.len, None),
        Op::Write => (cdb::write16(lba, blocks, fua), 0, Some(payload?)),
        Op::Flush => (cdb::synchronize_cache16(), 0, None),
        Op::Trim | Op::WriteZeroes | Op::Cache | Op::BlockStatus => return None,
    };
    Some(Command {
        lun: unit.lun,
        cdb,
        read,
        write,
    })
}

/// Decides what a chunk's outcome means.
pub(super) fn judge(p: &Pending, o: &Outcome) -> Next {
    let name = match p.cmd.cdb[0] {
        0x88 => "READ (16)",
        0x8a => "WRITE (16)",
        0x91 => "SYNCHRONIZE CACHE (16)",
        _ => "command",
    };
    match o {
        Outcome::Status {
            status: status::GOOD,
            data_in,
            ..
        } => complete(p, *data_in, name),
        Outcome::Status {
            status: status::CHECK_CONDITION,
            sense: Some(sense),
            data_in,
            ..
        } => match sense.verdict() {
            Verdict::Success => complete(p, *data_in, name),
            Verdict::Attention(a) if p.attempts < ATTENTION_TRIES => {
                Next::Again(Duration::ZERO, Some(a))
            }
            Verdict::Retry if p.attempts < BUSY_TRIES => Next::Again(BUSY_DELAY, None),
            Verdict::Transitioning => Next::Elsewhere(AccessState::Transitioning),
            Verdict::Standby => Next::Elsewhere(AccessState::Standby),
            Verdict::Unavailable => Next::Elsewhere(AccessState::Unavailable),
            _ => Next::Fail(errno(sense), format!("{name}: {sense}")),
        },
        Outcome::Status {
            status: status::BUSY | status::TASK_SET_FULL,
            ..
        } if p.attempts < BUSY_TRIES => Next::Again(BUSY_DELAY, None),
        // Aborted by a task management function before it ran (tgt's
        // LOGICAL UNIT RESET, sent by a fence of this very volume, answers
        // the commands it finds queued so, whichever session sent them):
        // nothing of it happened, so it goes again.
        Outcome::Status {
            status: status::TASK_ABORTED,
            ..
        } if p.attempts < BUSY_TRIES => Next::Again(Duration::ZERO, None),
        Outcome::Status { status: s, .. } => {
            Next::Fail(Errno::Io, format!("{name}: SCSI status {s:#04x}"))
        }
        Outcome::TargetFailure { response } => Next::Fail(
            Errno::Io,
            format!("{name}: the target could not deliver it (iSCSI response {response:#04x})"),
        ),
        Outcome::Rejected { reason } => Next::Fail(
            Errno::Io,
            format!("{name}: rejected by the target (reason {reason:#04x})"),
        ),
        Outcome::Aborted => Next::Fail(Errno::Io, format!("{name}: aborted")),
    }
}

fn complete(p: &Pending, data_in: u32, name: &str) -> Next {
    if data_in != p.cmd.read {
        return Next::Fail(
            Errno::Io,
            format!("{name}: the target sent {data_in} of {} bytes", p.cmd.read),
        );
    }
    Next::Good
}

/// The NBD error a local client sees for a failed command.
fn errno(s: &SenseData) -> Errno {
    match (s.key, s.asc, s.ascq) {
        // SPACE ALLOCATION FAILED WRITE PROTECT, INSUFFICIENT RESOURCES.
        (key::DATA_PROTECT, 0x27, 0x07) | (_, 0x55, _) => Errno::NoSpc,
        (key::DATA_PROTECT, 0x27, _) => Errno::Perm,
        (key::ILLEGAL_REQUEST, 0x20, _) => Errno::NotSup,
        (key::ILLEGAL_REQUEST, 0x21, _) => Errno::Inval,
        _ => Errno::Io,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::Cookie;

    fn write(attempts: u32) -> Pending {
        Pending {
            cookie: Cookie(1),
            base: 0,
            cmd: Command {
                lun: 0,
                cdb: cdb::write16(0, 1, false),
                read: 0,
                write: Some(Bytes::from_static(&[0; 512])),
            },
            attempts,
            data: Vec::new(),
        }
    }

    fn status(s: u8) -> Outcome {
        Outcome::Status {
            status: s,
            sense: None,
            residual: 0,
            data_in: 0,
        }
    }

    #[test]
    fn a_command_aborted_before_it_ran_goes_again_and_other_statuses_fail() {
        assert_eq!(
            judge(&write(0), &status(status::TASK_ABORTED)),
            Next::Again(Duration::ZERO, None)
        );
        assert!(matches!(
            judge(&write(BUSY_TRIES), &status(status::TASK_ABORTED)),
            Next::Fail(Errno::Io, _)
        ));
        assert!(matches!(
            judge(&write(0), &status(0x22)),
            Next::Fail(Errno::Io, _)
        ));
        assert_eq!(judge(&write(0), &status(status::GOOD)), Next::Good);
    }
}
