//! What a task management function (SAM-5 7) covers, without carrying
//! it out: ABORT TASK, ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT
//! RESET and TARGET WARM RESET on a unit with one task set (TST 0),
//! whose only logical unit is LUN 0. The target aborts what [`plan`]
//! names, waits for it, and answers with [`Response::code`].
//!
//! Tasks of other nexuses that a function ends are ended without a
//! response (the control mode page's TAS is 0); those nexuses learn of it
//! by a unit attention: COMMANDS CLEARED BY ANOTHER INITIATOR
//! ([`others`]). After a reset every nexus, the one that asked included,
//! is told BUS DEVICE RESET FUNCTION OCCURRED ([`crate::lu::LogicalUnit::reset`]).

/// The answer to a function (RFC 7143 11.6.1 numbers them as SAM-5's
/// service responses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Response {
    /// FUNCTION COMPLETE.
    Complete,
    /// The task referenced does not exist (it completed, or never came).
    NoTask,
    /// No logical unit at the LUN named.
    NoLun,
    /// TASK REASSIGN: braid keeps no connection allegiance to move.
    ReassignUnsupported,
    /// FUNCTION REJECTED: CLEAR ACA (no ACA is ever established), TARGET
    /// COLD RESET and anything unknown.
    Unsupported,
}

impl Response {
    /// The response code of an iSCSI Task Management Function Response.
    pub fn code(self) -> u8 {
        match self {
            Response::Complete => 0,
            Response::NoTask => 1,
            Response::NoLun => 2,
            Response::ReassignUnsupported => 4,
            Response::Unsupported => 5,
        }
    }
}

/// Which tasks a function ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// ABORT TASK: the task of this nexus with this tag; when none is
    /// found the answer depends on whether it was still to come (the
    /// transport knows), and when it is found but has answered already,
    /// [`Response::NoTask`].
    AbortTask(u32),
    /// ABORT TASK SET: every task of this nexus.
    AbortMine,
    /// CLEAR TASK SET: every task of every nexus; the others are told.
    ClearAll,
    /// LOGICAL UNIT RESET or TARGET WARM RESET (one unit per target):
    /// every task, then the unit is reset.
    Reset {
        /// TARGET WARM RESET rather than LOGICAL UNIT RESET.
        target: bool,
    },
    /// Nothing is ended: answered at once.
    Answer(Response),
}

/// What `function` (the function code, RFC 7143 11.5.1) asks of the
/// unit, sent for LUN `lun`; `referenced` is the tag ABORT TASK names.
pub fn plan(function: u8, lun: u64, referenced: u32) -> Plan {
    let on_lun_0 = lun == 0;
    match function {
        1 => Plan::AbortTask(referenced),
        2 if on_lun_0 => Plan::AbortMine,
        4 if on_lun_0 => Plan::ClearAll,
        5 if on_lun_0 => Plan::Reset { target: false },
        6 => Plan::Reset { target: true },
        2 | 4 | 5 => Plan::Answer(Response::NoLun),
        8 => Plan::Answer(Response::ReassignUnsupported),
        _ => Plan::Answer(Response::Unsupported),
    }
}

/// The nexuses among `owners` (each task's nexus) other than `me`, once
/// each: those a CLEAR TASK SET tells.
pub fn others(owners: impl IntoIterator<Item = u64>, me: u64) -> Vec<u64> {
    let mut v: Vec<u64> = owners.into_iter().filter(|n| *n != me).collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_on_another_lun_find_no_unit_but_a_target_reset_does() {
        assert_eq!(plan(2, 0, 0), Plan::AbortMine);
        assert_eq!(plan(2, 1, 0), Plan::Answer(Response::NoLun));
        assert_eq!(plan(4, 3, 0), Plan::Answer(Response::NoLun));
        assert_eq!(plan(5, 1, 0), Plan::Answer(Response::NoLun));
        assert_eq!(plan(6, 1, 0), Plan::Reset { target: true });
        assert_eq!(plan(1, 7, 42), Plan::AbortTask(42));
        assert_eq!(plan(8, 0, 0), Plan::Answer(Response::ReassignUnsupported));
        assert_eq!(Response::ReassignUnsupported.code(), 4);
        assert_eq!(plan(3, 0, 0), Plan::Answer(Response::Unsupported));
        assert_eq!(others([3, 1, 3, 2, 1], 2), vec![1, 3]);
    }
}
