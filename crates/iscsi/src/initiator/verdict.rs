//! What a command's outcome means to the initiator that sent it: done,
//! failed with which kind of error, sent again (after a unit attention,
//! while the target is busy, or when a task management function of any
//! session aborted it before it ran), or sent to another path (ALUA).
//! Decided here, without I/O, so that the rule is tested with byte
//! vectors and every driver of a session judges alike.

use std::time::Duration;

use braid_block::ErrorKind;

use super::sense::{key, Attention, SenseData, Verdict};
use super::session::{Command, Outcome};
use super::unit::AccessState;
use crate::scsi::sense::status;

/// Times a command is sent again after unit attentions before it fails:
/// each attention is reported once, so a handful means something is wrong.
pub const ATTENTION_TRIES: u32 = 8;

/// Times a command is sent again while the target is busy, or its
/// command was aborted, and how long between tries.
pub const BUSY_TRIES: u32 = 100;
pub const BUSY_DELAY: Duration = Duration::from_millis(20);

/// What follows from an outcome.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Done: deliver the data and complete.
    Good,
    Fail(ErrorKind, String),
    /// Send again after the delay (reporting the attention first).
    Again(Duration, Option<Attention>),
    /// Not executed: the port is not active; another path takes it.
    Elsewhere(AccessState),
}

/// Decides what the outcome `o` of `cmd`, sent `attempts` times before,
/// means.
pub fn judge(cmd: &Command, attempts: u32, o: &Outcome) -> Next {
    let name = match cmd.cdb.first() {
        Some(0x88) => "READ (16)",
        Some(0x8a) => "WRITE (16)",
        Some(0x91) => "SYNCHRONIZE CACHE (16)",
        _ => "command",
    };
    match o {
        Outcome::Status {
            status: status::GOOD,
            data_in,
            ..
        } => complete(cmd, *data_in, name),
        Outcome::Status {
            status: status::CHECK_CONDITION,
            sense: Some(sense),
            data_in,
            ..
        } => match sense.verdict() {
            Verdict::Success => complete(cmd, *data_in, name),
            Verdict::Attention(a) if attempts < ATTENTION_TRIES => {
                Next::Again(Duration::ZERO, Some(a))
            }
            Verdict::Retry if attempts < BUSY_TRIES => Next::Again(BUSY_DELAY, None),
            Verdict::Transitioning => Next::Elsewhere(AccessState::Transitioning),
            Verdict::Standby => Next::Elsewhere(AccessState::Standby),
            Verdict::Unavailable => Next::Elsewhere(AccessState::Unavailable),
            _ => Next::Fail(kind(sense), format!("{name}: {sense}")),
        },
        Outcome::Status {
            status: status::BUSY | status::TASK_SET_FULL,
            ..
        } if attempts < BUSY_TRIES => Next::Again(BUSY_DELAY, None),
        // Aborted by a task management function before it ran (tgt's
        // LOGICAL UNIT RESET, sent by a fence of this very volume, answers
        // the commands it finds queued so, whichever session sent them):
        // nothing of it happened, so it goes again.
        Outcome::Status {
            status: status::TASK_ABORTED,
            ..
        } if attempts < BUSY_TRIES => Next::Again(Duration::ZERO, None),
        Outcome::Status { status: s, .. } => {
            Next::Fail(ErrorKind::Io, format!("{name}: SCSI status {s:#04x}"))
        }
        Outcome::TargetFailure { response } => Next::Fail(
            ErrorKind::Io,
            format!("{name}: the target could not deliver it (iSCSI response {response:#04x})"),
        ),
        Outcome::Rejected { reason } => Next::Fail(
            ErrorKind::Io,
            format!("{name}: rejected by the target (reason {reason:#04x})"),
        ),
        Outcome::Aborted => Next::Fail(ErrorKind::Io, format!("{name}: aborted")),
    }
}

fn complete(cmd: &Command, data_in: u32, name: &str) -> Next {
    if data_in != cmd.read {
        return Next::Fail(
            ErrorKind::Io,
            format!("{name}: the target sent {data_in} of {} bytes", cmd.read),
        );
    }
    Next::Good
}

/// The one place a failed command's sense data becomes an error kind.
fn kind(s: &SenseData) -> ErrorKind {
    match (s.key, s.asc, s.ascq) {
        // SPACE ALLOCATION FAILED WRITE PROTECT, INSUFFICIENT RESOURCES.
        (key::DATA_PROTECT, 0x27, 0x07) | (_, 0x55, _) => ErrorKind::NoSpace,
        (key::DATA_PROTECT, 0x27, _) => ErrorKind::ReadOnly,
        (key::ILLEGAL_REQUEST, 0x20, _) => ErrorKind::NotSupported,
        (key::ILLEGAL_REQUEST, 0x21, _) => ErrorKind::OutOfRange,
        _ => ErrorKind::Io,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::initiator::cdb;
    use bytes::Bytes;

    fn write() -> Command {
        Command {
            lun: 0,
            cdb: cdb::write16(0, 1, false),
            read: 0,
            write: Some(Bytes::from_static(&[0; 512])),
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

    fn check(key: u8, asc: u8, ascq: u8) -> Outcome {
        Outcome::Status {
            status: status::CHECK_CONDITION,
            sense: Some(SenseData { key, asc, ascq }),
            residual: 0,
            data_in: 0,
        }
    }

    #[test]
    fn a_command_aborted_before_it_ran_goes_again_and_other_statuses_fail() {
        assert_eq!(
            judge(&write(), 0, &status(status::TASK_ABORTED)),
            Next::Again(Duration::ZERO, None)
        );
        assert!(matches!(
            judge(&write(), BUSY_TRIES, &status(status::TASK_ABORTED)),
            Next::Fail(ErrorKind::Io, _)
        ));
        assert!(matches!(
            judge(&write(), 0, &status(0x22)),
            Next::Fail(ErrorKind::Io, _)
        ));
        assert_eq!(judge(&write(), 0, &status(status::GOOD)), Next::Good);
    }

    #[test]
    fn sense_data_says_which_kind_of_error() {
        let kind_of = |o| match judge(&write(), 0, &o) {
            Next::Fail(k, _) => k,
            n => panic!("{n:?}"),
        };
        assert_eq!(
            kind_of(check(key::DATA_PROTECT, 0x27, 0x07)),
            ErrorKind::NoSpace
        );
        assert_eq!(
            kind_of(check(key::DATA_PROTECT, 0x27, 0)),
            ErrorKind::ReadOnly
        );
        assert_eq!(
            kind_of(check(key::ILLEGAL_REQUEST, 0x20, 0)),
            ErrorKind::NotSupported
        );
        assert_eq!(
            kind_of(check(key::ILLEGAL_REQUEST, 0x21, 0)),
            ErrorKind::OutOfRange
        );
        assert_eq!(kind_of(check(key::MEDIUM_ERROR, 0x11, 0)), ErrorKind::Io);
    }
}
