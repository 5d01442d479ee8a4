//! Task management (RFC 7143 11.5, SAM-5 7) carried out on the logical
//! unit's task set, which holds the tasks of every session: what a
//! function covers is [`braid_scsi::tmf`]'s to say. The response goes
//! only once every task the function covers has ended (RFC 7143
//! 4.2.3.3): waiting ones are dropped before they reach the backend,
//! running ones finish first, WRITEs owed data end without it (the
//! connection that owns them drops them once told, `Commands::sweep`).

use std::sync::Arc;

use braid_iscsi::pdu::{Bhs, Opcode, Pdu};
use braid_iscsi::window::{le, lt};
use braid_scsi::tmf::{self, Plan, Response};
use braid_scsi::Sense;
use tracing::info;

use super::command::Lun;
use super::task::abort_all;

/// Carries out the function `req` asks for and returns the response
/// code; `exp_cmd_sn` is ExpCmdSN when the request arrived.
pub(crate) async fn perform(lun: &Arc<Lun>, req: &Bhs, exp_cmd_sn: u32) -> u8 {
    let function = req.0[1] & 0x7f;
    let me = lun.nexus.id;
    let tasks = &lun.served.lu.tasks;
    let response = match tmf::plan(function, req.lun() >> 48, req.u32_at(20)) {
        Plan::AbortTask(referenced) => {
            let found = tasks.select(|n, itt| n == me && itt == referenced);
            if found.is_empty() {
                // RFC 7143 11.5.1: a command not yet received whose CmdSN
                // lies in the window, below the request's own, counts as
                // received and aborted; one that completed (or was never
                // sent) does not exist.
                let ref_cmd_sn = req.u32_at(32);
                let cmd_sn = req.u32_at(24);
                let unreceived = le(exp_cmd_sn, ref_cmd_sn) && lt(ref_cmd_sn, cmd_sn);
                if unreceived {
                    Response::Complete
                } else {
                    Response::NoTask
                }
            } else {
                // A task whose response already left completed: to the
                // initiator it no longer exists.
                match abort_all(&found).await {
                    0 => Response::NoTask,
                    _ => Response::Complete,
                }
            }
        }
        Plan::AbortMine => {
            abort_all(&tasks.select(|n, _| n == me)).await;
            Response::Complete
        }
        Plan::ClearAll => {
            let all = tasks.select(|_, _| true);
            for other in tmf::others(all.iter().map(|t| t.nexus), me) {
                lun.served.lu.raise_on(other, Sense::COMMANDS_CLEARED);
            }
            abort_all(&all).await;
            Response::Complete
        }
        Plan::Reset { target } => {
            info!(
                function = if target {
                    "TARGET WARM RESET"
                } else {
                    "LOGICAL UNIT RESET"
                },
                "iSCSI reset"
            );
            abort_all(&tasks.select(|_, _| true)).await;
            lun.served.lu.reset();
            super::unitshared::nexus_lost(&lun.served.lu, None).await;
            Response::Complete
        }
        Plan::Answer(r) => r,
    };
    response.code()
}

/// The response PDU.
pub(crate) fn response(req: &Pdu, code: u8) -> Bhs {
    let mut r = Bhs::new(Opcode::TaskMgmtResponse);
    r.set_final(true);
    r.set_itt(req.bhs.itt());
    r.0[2] = code;
    r
}
