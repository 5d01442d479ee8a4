//! Task management (RFC 7143 11.5, SAM-5 7): ABORT TASK, ABORT TASK SET,
//! CLEAR TASK SET, LOGICAL UNIT RESET and TARGET WARM RESET, carried out
//! on the logical unit's task set, which holds the tasks of every
//! session. The response goes only once every task the function covers
//! has ended (RFC 7143 4.2.3.3): waiting ones are dropped before they
//! reach the backend, running ones finish first, WRITEs owed data get it.
//!
//! Tasks of other sessions that a function ends are ended without a
//! response (the control mode page's TAS is 0); those sessions learn of
//! it by a unit attention: COMMANDS CLEARED BY ANOTHER INITIATOR. After a
//! reset every session, the one that asked included, is told BUS DEVICE
//! RESET FUNCTION OCCURRED.

use std::sync::Arc;

use braid_iscsi::pdu::{Bhs, Opcode, Pdu};
use braid_iscsi::window::{le, lt};
use braid_scsi::Sense;
use tracing::info;

use super::command::Lun;
use super::task::abort_all;

/// Task management response codes (RFC 7143 11.6.1).
pub(crate) mod code {
    pub const COMPLETE: u8 = 0;
    pub const NO_TASK: u8 = 1;
    pub const NO_LUN: u8 = 2;
    pub const REASSIGN_UNSUPPORTED: u8 = 4;
    pub const UNSUPPORTED: u8 = 5;
}

/// Carries out the function `req` asks for and returns the response
/// code; `exp_cmd_sn` is ExpCmdSN when the request arrived.
pub(crate) async fn perform(lun: &Arc<Lun>, req: &Bhs, exp_cmd_sn: u32) -> u8 {
    let function = req.0[1] & 0x7f;
    let on_lun_0 = req.lun() >> 48 == 0;
    let me = lun.nexus.id;
    let tasks = &lun.served.lu.tasks;
    match function {
        // ABORT TASK
        1 => {
            let referenced = req.u32_at(20);
            let found = tasks.select(|n, itt| n == me && itt == referenced);
            if found.is_empty() {
                // RFC 7143 11.5.1: a command not yet received whose CmdSN
                // lies in the window, below the request's own, counts as
                // received and aborted; one that completed (or was never
                // sent) does not exist.
                let ref_cmd_sn = req.u32_at(32);
                let cmd_sn = req.u32_at(24);
                let unreceived = le(exp_cmd_sn, ref_cmd_sn) && lt(ref_cmd_sn, cmd_sn);
                return if unreceived {
                    code::COMPLETE
                } else {
                    code::NO_TASK
                };
            }
            // A task whose response already left completed: to the
            // initiator it no longer exists.
            match abort_all(&found).await {
                0 => code::NO_TASK,
                _ => code::COMPLETE,
            }
        }
        // ABORT TASK SET: this session's tasks on the unit.
        2 if on_lun_0 => {
            abort_all(&tasks.select(|n, _| n == me)).await;
            code::COMPLETE
        }
        // CLEAR TASK SET: every session's (one task set, TST 0).
        4 if on_lun_0 => {
            let all = tasks.select(|_, _| true);
            for other in others(&all, me) {
                lun.served.lu.raise_on(other, Sense::COMMANDS_CLEARED);
            }
            abort_all(&all).await;
            code::COMPLETE
        }
        // LOGICAL UNIT RESET, TARGET WARM RESET (one unit per target).
        5 | 6 if function == 6 || on_lun_0 => {
            info!(
                function = if function == 5 {
                    "LOGICAL UNIT RESET"
                } else {
                    "TARGET WARM RESET"
                },
                "iSCSI reset"
            );
            abort_all(&tasks.select(|_, _| true)).await;
            lun.served.lu.reset();
            code::COMPLETE
        }
        2 | 4 | 5 => code::NO_LUN,
        8 => code::REASSIGN_UNSUPPORTED,
        // CLEAR ACA (no ACA is ever established), TARGET COLD RESET.
        _ => code::UNSUPPORTED,
    }
}

/// The other nexuses among `tasks`, once each.
fn others(tasks: &[Arc<super::task::TaskCtl>], me: u64) -> Vec<u64> {
    let mut v: Vec<u64> = tasks.iter().map(|t| t.nexus).filter(|n| *n != me).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The response PDU.
pub(crate) fn response(req: &Pdu, code: u8) -> Bhs {
    let mut r = Bhs::new(Opcode::TaskMgmtResponse);
    r.set_final(true);
    r.set_itt(req.bhs.itt());
    r.0[2] = code;
    r
}
