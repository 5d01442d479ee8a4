//! The PDUs that answer a SCSI command: its status (GOOD with any
//! residual, CHECK CONDITION with sense, RESERVATION CONFLICT), its data
//! in Data-In PDUs, and Reject.

use braid_iscsi::negotiate::Params;
use braid_iscsi::pdu::{Bhs, Opcode, Pdu};
use braid_iscsi::scsi::sense::status;
use braid_iscsi::scsi::Sense;
use braid_iscsi::transfer::{self, Numbers, NO_TAG};
use bytes::Bytes;

use super::budget::Held;
use super::out::{Batch, Out, Sn};
use super::unit::Outcome;

/// Placeholder numbers: the writer fills them in.
pub(crate) const ZERO: Numbers = Numbers {
    stat_sn: 0,
    exp_cmd_sn: 0,
    max_cmd_sn: 0,
};

/// RESERVATION CONFLICT: a status with no sense data.
pub(crate) fn conflict(itt: u32) -> Out {
    response(itt, status::RESERVATION_CONFLICT, Bytes::new(), 0, 0)
}

/// A SCSI Response; `have` and `expected` bytes give the residual
/// (overflow when the command had more data than the initiator expected,
/// underflow when less).
pub(crate) fn response(itt: u32, st: u8, sense: Bytes, have: u32, expected: u32) -> Out {
    let mut b = Bhs::new(Opcode::ScsiResponse);
    b.set_final(true);
    b.set_itt(itt);
    b.0[3] = st;
    if have > expected {
        b.0[1] |= 0x04;
        b.set_u32(44, have - expected);
    } else if have < expected {
        b.0[1] |= 0x02;
        b.set_u32(44, expected - have);
    }
    Out::new(b, sense, Sn::Takes)
}

/// CHECK CONDITION with `sense`.
pub(crate) fn check(itt: u32, sense: Sense) -> Out {
    let segment = Bytes::from(sense.iscsi_segment());
    response(itt, status::CHECK_CONDITION, segment, 0, 0)
}

/// The answer to a command that sends data (or none): GOOD with the data
/// in Data-In PDUs, the last carrying the status, or a SCSI Response
/// when nothing is sent; or CHECK CONDITION.
pub(crate) fn outcome_batch(
    itt: u32,
    outcome: Outcome,
    expected: u32,
    params: &Params,
    permit: Option<Held>,
) -> Batch {
    let data = match outcome {
        Outcome::Check(sense) => return Batch::of(vec![check(itt, sense)]),
        Outcome::Conflict => return Batch::of(vec![conflict(itt)]),
        // Never sent: `run` closes the connection instead.
        Outcome::Lost => return Batch::of(Vec::new()),
        Outcome::Good(data) => data,
    };
    let have = data.len() as u32;
    if data.is_empty() || expected == 0 {
        return Batch::of(vec![response(
            itt,
            status::GOOD,
            Bytes::new(),
            have,
            expected,
        )]);
    }
    let data = Bytes::from(data);
    let (peer_max, burst) = (params.peer_max_recv_data, params.max_burst);
    let pdus = transfer::data_in(itt, have, expected, peer_max, burst, ZERO)
        .into_iter()
        .map(|d| {
            let slice = data.slice(d.offset as usize..(d.offset + d.len) as usize);
            let sn = if d.bhs.0[1] & 0x01 != 0 {
                Sn::Takes
            } else {
                Sn::Reserved
            };
            Out::new(d.bhs, slice, sn)
        })
        .collect();
    let mut b = Batch::of(pdus);
    b.permit = permit;
    b
}

/// The data a NOP-In reflects of a ping's `data`: at most the
/// initiator's MaxRecvDataSegmentLength, `peer_max` (RFC 7143 11.18.5
/// limits reflected data to it). The ping itself is no protocol error:
/// it fits the target's own MaxRecvDataSegmentLength, which the framer
/// holds it to, so there is nothing to Reject; an echo that the initiator
/// could not take would be the error, so the echo is cut instead.
pub(crate) fn echo(data: &Bytes, peer_max: u32) -> Bytes {
    data.slice(..data.len().min(peer_max as usize))
}

/// A Reject carrying the offending header (reason 0x04: protocol error,
/// 0x06: immediate command reject, 0x09: invalid PDU field).
pub(crate) fn reject(pdu: &Pdu, reason: u8) -> Out {
    let mut r = Bhs::new(Opcode::Reject);
    r.set_final(true);
    r.set_itt(NO_TAG);
    r.0[2] = reason;
    Out::new(r, Bytes::copy_from_slice(&pdu.bhs.0), Sn::Takes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ping_is_echoed_no_longer_than_the_initiator_takes() {
        let ping = Bytes::from(vec![7u8; 65536]);
        assert_eq!(echo(&ping, 8192).len(), 8192);
        assert_eq!(echo(&ping, 1 << 20).len(), 65536, "all of it when it fits");
        assert!(echo(&Bytes::new(), 8192).is_empty());
    }
}
