//! The PDUs a SCSI command goes out as: the command with its immediate
//! data, then Data-Out, unsolicited or for an R2T.

use bytes::Bytes;

use super::{Command, RESERVED_TAG};
use crate::negotiate::Params;
use crate::pdu::{Bhs, Opcode, Pdu};

/// A SCSI Command PDU and the unsolicited Data-Out that follows it:
/// immediate data up to FirstBurstLength and the target's
/// MaxRecvDataSegmentLength, and, without InitialR2T, Data-Out up to
/// FirstBurstLength.
pub(super) fn command_pdus(
    itt: u32,
    cmd_sn: u32,
    exp_stat_sn: u32,
    cmd: &Command,
    p: &Params,
) -> Vec<Pdu> {
    let data = cmd.write.clone().unwrap_or_default();
    let total = data.len() as u32;
    let max_pdu = p.peer_max_recv_data.max(512);
    let first_burst = p.first_burst.min(p.max_burst).max(1);
    let immediate = if p.immediate_data {
        total.min(first_burst).min(max_pdu)
    } else {
        0
    };
    let unsolicited = if p.initial_r2t {
        immediate
    } else {
        total.min(first_burst)
    };
    let mut b = Bhs::new(Opcode::ScsiCommand);
    // F: no unsolicited Data-Out follows; ATTR 1: simple.
    b.0[1] = if unsolicited == immediate { 0x80 } else { 0 }
        | if cmd.read > 0 { 0x40 } else { 0 }
        | if cmd.write.is_some() { 0x20 } else { 0 }
        | 0x01;
    b.set_lun(cmd.lun);
    b.set_itt(itt);
    b.set_u32(20, if cmd.write.is_some() { total } else { cmd.read });
    b.set_u32(24, cmd_sn);
    b.set_u32(28, exp_stat_sn);
    b.0[32..48].copy_from_slice(&cmd.cdb);
    let mut out = vec![Pdu::new(b, data.slice(..immediate as usize))];
    if unsolicited > immediate {
        out.extend(data_out(
            itt,
            cmd.lun,
            RESERVED_TAG,
            &data,
            immediate,
            unsolicited,
            max_pdu,
            exp_stat_sn,
        ));
    }
    out
}

/// Data-Out PDUs for bytes `[from, to)` of `data`: one sequence, DataSN
/// from 0, at most `max_pdu` bytes each, F on the last.
#[allow(clippy::too_many_arguments)]
pub(super) fn data_out(
    itt: u32,
    lun: u64,
    ttt: u32,
    data: &Bytes,
    from: u32,
    to: u32,
    max_pdu: u32,
    exp_stat_sn: u32,
) -> Vec<Pdu> {
    let mut out = Vec::with_capacity(((to - from) / max_pdu + 1) as usize);
    let mut at = from;
    let mut data_sn = 0u32;
    while at < to {
        let n = (to - at).min(max_pdu);
        let mut b = Bhs::new(Opcode::DataOut);
        b.set_final(at + n == to);
        b.set_lun(lun);
        b.set_itt(itt);
        b.set_u32(20, ttt);
        b.set_u32(28, exp_stat_sn);
        b.set_u32(36, data_sn);
        b.set_u32(40, at);
        out.push(Pdu::new(b, data.slice(at as usize..(at + n) as usize)));
        at += n;
        data_sn += 1;
    }
    out
}
