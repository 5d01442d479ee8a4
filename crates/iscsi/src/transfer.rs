//! Moving a command's data (RFC 7143, "Data Transfer"), target side:
//! a READ's data cut into Data-In PDUs, and a WRITE's data gathered from
//! immediate data, unsolicited Data-Out and Data-Out answering R2Ts.
//!
//! braid negotiates DataPDUInOrder and DataSequenceInOrder to Yes, so each
//! sequence's data arrives at increasing, contiguous offsets; anything
//! else is a protocol error that ends the connection.

use crate::pdu::{Bhs, Opcode};

/// The reserved "no transfer tag" value.
pub const NO_TAG: u32 = 0xffff_ffff;

/// How one Data-In PDU is laid out: where its data starts in the
/// command's buffer, how long it is, and its header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataIn {
    pub bhs: Bhs,
    pub offset: u32,
    pub len: u32,
}

/// The numbers the last Data-In needs when it carries the status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Numbers {
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// Cuts `have` bytes of READ data, for a command that expected
/// `expected`, into Data-In PDUs of at most `max_pdu` bytes (the
/// initiator's MaxRecvDataSegmentLength). The F bit closes each
/// sequence of `max_burst` bytes; the last PDU carries GOOD status (S
/// bit) with the residual, so no SCSI Response is needed. Only what the
/// initiator expected is sent; with nothing to send the answer is empty
/// and the caller sends a SCSI Response instead.
pub fn data_in(
    itt: u32,
    have: u32,
    expected: u32,
    max_pdu: u32,
    max_burst: u32,
    n: Numbers,
) -> Vec<DataIn> {
    let send = have.min(expected);
    if send == 0 {
        return Vec::new();
    }
    let max_pdu = max_pdu.max(1);
    let max_burst = max_burst.max(max_pdu);
    let mut out = Vec::new();
    let mut offset = 0;
    let mut data_sn = 0u32;
    loop {
        let burst_left = max_burst - offset % max_burst;
        let len = (send - offset).min(max_pdu).min(burst_left);
        let last = offset + len == send;
        let mut bhs = Bhs::new(Opcode::DataIn);
        let mut flags = 0u8;
        if last || len == burst_left {
            flags |= 0x80; // F: end of a sequence
        }
        if last {
            flags |= 0x01; // S: status here
            if have < expected {
                flags |= 0x02; // U
                bhs.set_u32(44, expected - have);
            } else if have > expected {
                flags |= 0x04; // O
                bhs.set_u32(44, have - expected);
            }
            bhs.set_u32(24, n.stat_sn);
        }
        bhs.0[1] = flags;
        bhs.set_itt(itt);
        bhs.set_u32(20, NO_TAG);
        bhs.set_u32(28, n.exp_cmd_sn);
        bhs.set_u32(32, n.max_cmd_sn);
        bhs.set_u32(36, data_sn);
        bhs.set_u32(40, offset);
        bhs.set_data_len(len as usize);
        out.push(DataIn { bhs, offset, len });
        offset += len;
        data_sn += 1;
        if last {
            return out;
        }
    }
}

/// Why a Data-Out cannot be accepted. Each ends the connection.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TransferError {
    #[error("Data-Out with transfer tag {0:#x}, which names no open R2T")]
    UnknownTag(u32),
    #[error("Data-Out at offset {got}, where {want} was next")]
    OutOfOrder { got: u32, want: u32 },
    #[error("Data-Out DataSN {got}, where {want} was next")]
    DataSn { got: u32, want: u32 },
    #[error("Data-Out of {len} bytes at {offset} runs past its sequence, which ends at {end}")]
    Overrun { offset: u32, len: u32, end: u32 },
    #[error("{got} bytes of immediate data, more than FirstBurstLength or the command's length allows ({max})")]
    TooMuchImmediate { got: u32, max: u32 },
}

/// One sequence of data the initiator sends: unsolicited, or asked for by
/// an R2T.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sequence {
    ttt: u32,
    next: u32,
    end: u32,
    data_sn: u32,
}

/// An R2T to send: ask for `len` bytes at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct R2t {
    pub ttt: u32,
    pub r2t_sn: u32,
    pub offset: u32,
    pub len: u32,
}

impl R2t {
    /// The R2T PDU's header.
    pub fn bhs(&self, itt: u32, lun: u64, n: Numbers) -> Bhs {
        let mut b = Bhs::new(Opcode::R2t);
        b.set_final(true);
        b.set_lun(lun);
        b.set_itt(itt);
        b.set_u32(20, self.ttt);
        b.set_u32(24, n.stat_sn);
        b.set_u32(28, n.exp_cmd_sn);
        b.set_u32(32, n.max_cmd_sn);
        b.set_u32(36, self.r2t_sn);
        b.set_u32(40, self.offset);
        b.set_u32(44, self.len);
        b
    }
}

/// The data of one WRITE, gathered.
#[derive(Debug)]
pub struct WriteTransfer {
    total: u32,
    received: u32,
    open: Vec<Sequence>,
    /// The first byte no sequence covers yet.
    unasked: u32,
    r2t_sn: u32,
    next_ttt: u32,
    max_burst: u32,
    max_r2t: usize,
}

impl WriteTransfer {
    /// A WRITE of `total` bytes whose command PDU carried `immediate`
    /// bytes. Without InitialR2T the initiator may send up to
    /// `first_burst` bytes (immediate included) before any R2T.
    ///
    /// # Errors
    ///
    /// [`TransferError::TooMuchImmediate`].
    pub fn new(
        total: u32,
        immediate: u32,
        initial_r2t: bool,
        first_burst: u32,
        max_burst: u32,
        max_outstanding_r2t: u32,
    ) -> Result<Self, TransferError> {
        let unsolicited = if initial_r2t {
            immediate
        } else {
            first_burst.min(total)
        };
        let max_immediate = first_burst.min(total);
        if immediate > max_immediate {
            return Err(TransferError::TooMuchImmediate {
                got: immediate,
                max: max_immediate,
            });
        }
        let mut open = Vec::new();
        if unsolicited > immediate {
            open.push(Sequence {
                ttt: NO_TAG,
                next: immediate,
                end: unsolicited,
                data_sn: 0,
            });
        }
        Ok(Self {
            total,
            received: immediate,
            open,
            unasked: unsolicited,
            r2t_sn: 0,
            next_ttt: 1,
            max_burst: max_burst.max(1),
            max_r2t: max_outstanding_r2t.max(1) as usize,
        })
    }

    /// R2Ts to send now: for bytes nobody has asked for yet, as many as
    /// MaxOutstandingR2T allows, each at most MaxBurstLength.
    pub fn r2ts(&mut self) -> Vec<R2t> {
        let mut out = Vec::new();
        while self.unasked < self.total
            && self.open.iter().filter(|s| s.ttt != NO_TAG).count() < self.max_r2t
        {
            let len = (self.total - self.unasked).min(self.max_burst);
            let r = R2t {
                ttt: self.next_ttt,
                r2t_sn: self.r2t_sn,
                offset: self.unasked,
                len,
            };
            self.next_ttt = self.next_ttt.wrapping_add(1).max(1);
            if self.next_ttt == NO_TAG {
                self.next_ttt = 1;
            }
            self.r2t_sn = self.r2t_sn.wrapping_add(1);
            self.open.push(Sequence {
                ttt: r.ttt,
                next: r.offset,
                end: r.offset + len,
                data_sn: 0,
            });
            self.unasked += len;
            out.push(r);
        }
        out
    }

    /// Accepts a Data-Out header carrying `len` bytes; returns the offset
    /// in the command's buffer where they go.
    ///
    /// # Errors
    ///
    /// [`TransferError`]: the connection must end.
    pub fn data_out(&mut self, bhs: &Bhs, len: u32) -> Result<u32, TransferError> {
        let ttt = bhs.u32_at(20);
        let data_sn = bhs.u32_at(36);
        let offset = bhs.u32_at(40);
        let at = self
            .open
            .iter()
            .position(|s| s.ttt == ttt)
            .ok_or(TransferError::UnknownTag(ttt))?;
        let s = &mut self.open[at];
        if offset != s.next {
            return Err(TransferError::OutOfOrder {
                got: offset,
                want: s.next,
            });
        }
        if data_sn != s.data_sn {
            return Err(TransferError::DataSn {
                got: data_sn,
                want: s.data_sn,
            });
        }
        if u64::from(offset) + u64::from(len) > u64::from(s.end) {
            return Err(TransferError::Overrun {
                offset,
                len,
                end: s.end,
            });
        }
        s.next += len;
        s.data_sn = s.data_sn.wrapping_add(1);
        if s.next == s.end {
            self.open.remove(at);
        }
        self.received += len;
        Ok(offset)
    }

    /// Every byte of the WRITE has arrived.
    pub fn complete(&self) -> bool {
        self.received == self.total
    }

    /// Whether data an R2T asked for is still to come. An aborted WRITE
    /// waits for it before it is forgotten: the initiator answers every
    /// R2T it was sent (RFC 7143 4.2.3.3), and its tag may be reused once
    /// the task management response is out.
    pub fn awaiting_solicited(&self) -> bool {
        self.open.iter().any(|s| s.ttt != NO_TAG)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: Numbers = Numbers {
        stat_sn: 40,
        exp_cmd_sn: 7,
        max_cmd_sn: 38,
    };

    fn flags(v: &[DataIn]) -> Vec<u8> {
        v.iter().map(|d| d.bhs.0[1]).collect()
    }

    #[test]
    fn read_data_is_cut_into_pdus_and_bursts_with_status_on_the_last() {
        let v = data_in(0x11, 100 << 10, 100 << 10, 32 << 10, 64 << 10, N);
        let layout: Vec<(u32, u32)> = v.iter().map(|d| (d.offset, d.len)).collect();
        assert_eq!(
            layout,
            [(0, 32768), (32768, 32768), (65536, 32768), (98304, 4096)]
        );
        assert_eq!(flags(&v), [0x00, 0x80, 0x00, 0x81]);
        let data_sns: Vec<u32> = v.iter().map(|d| d.bhs.u32_at(36)).collect();
        assert_eq!(data_sns, [0, 1, 2, 3]);
        let last = &v[3].bhs;
        assert_eq!(last.0[0], 0x25);
        assert_eq!((last.itt(), last.u32_at(20)), (0x11, NO_TAG));
        assert_eq!(
            (last.u32_at(24), last.u32_at(28), last.u32_at(32)),
            (40, 7, 38)
        );
        assert_eq!(last.u32_at(40), 98304, "buffer offset");
        assert_eq!(last.data_len(), 4096);
    }

    #[test]
    fn short_and_long_reads_report_their_residual() {
        let v = data_in(1, 4096, 8192, 65536, 262144, N);
        assert_eq!(flags(&v), [0x83], "F, S and underflow");
        assert_eq!(v[0].bhs.u32_at(44), 4096);
        let v = data_in(1, 8192, 4096, 65536, 262144, N);
        assert_eq!(
            (flags(&v), v[0].len),
            (vec![0x85], 4096),
            "F, S and overflow"
        );
        assert_eq!(v[0].bhs.u32_at(44), 4096);
        assert!(data_in(1, 0, 4096, 65536, 262144, N).is_empty());
    }

    fn data_out(ttt: u32, data_sn: u32, offset: u32) -> Bhs {
        let mut b = Bhs::new(Opcode::DataOut);
        b.set_u32(20, ttt);
        b.set_u32(36, data_sn);
        b.set_u32(40, offset);
        b
    }

    #[test]
    fn a_write_gathers_immediate_unsolicited_and_solicited_data() {
        let k = 1024;
        let mut w = WriteTransfer::new(256 * k, 8 * k, false, 64 * k, 64 * k, 1).unwrap();
        // Unsolicited Data-Out after the immediate data, up to FirstBurstLength.
        assert_eq!(w.data_out(&data_out(NO_TAG, 0, 8 * k), 24 * k), Ok(8 * k));
        assert_eq!(w.data_out(&data_out(NO_TAG, 1, 32 * k), 32 * k), Ok(32 * k));
        assert!(!w.awaiting_solicited(), "only unsolicited data so far");
        let r = w.r2ts();
        assert!(w.awaiting_solicited());
        assert_eq!(r.len(), 1, "MaxOutstandingR2T 1");
        assert_eq!((r[0].r2t_sn, r[0].offset, r[0].len), (0, 64 * k, 64 * k));
        assert!(w.r2ts().is_empty(), "one outstanding at a time");
        let ttt = r[0].ttt;
        assert_eq!(w.data_out(&data_out(ttt, 0, 64 * k), 64 * k), Ok(64 * k));
        let r = w.r2ts();
        assert_eq!((r[0].r2t_sn, r[0].offset), (1, 128 * k));
        assert_ne!(r[0].ttt, ttt);
        assert_eq!(
            w.data_out(&data_out(r[0].ttt, 0, 128 * k), 64 * k),
            Ok(128 * k)
        );
        let r = w.r2ts();
        assert_eq!(
            w.data_out(&data_out(r[0].ttt, 0, 192 * k), 64 * k),
            Ok(192 * k)
        );
        assert!(w.complete());
        assert!(!w.awaiting_solicited());
        assert!(w.r2ts().is_empty());

        let h = r[0].bhs(0x21, 0, N);
        assert_eq!((h.0[0], h.0[1]), (0x31, 0x80));
        assert_eq!(
            (h.u32_at(36), h.u32_at(40), h.u32_at(44)),
            (2, 192 * k, 64 * k)
        );
    }

    #[test]
    fn data_out_out_of_turn_is_refused() {
        let k = 1024;
        let mut w = WriteTransfer::new(128 * k, 0, true, 64 * k, 64 * k, 2).unwrap();
        let r = w.r2ts();
        assert_eq!(r.len(), 2);
        assert_eq!(
            w.data_out(&data_out(NO_TAG, 0, 0), 4 * k),
            Err(TransferError::UnknownTag(NO_TAG)),
            "no unsolicited data with InitialR2T"
        );
        let t = r[0].ttt;
        assert_eq!(
            w.data_out(&data_out(t, 0, 4 * k), 4 * k),
            Err(TransferError::OutOfOrder {
                got: 4 * k,
                want: 0
            })
        );
        assert_eq!(
            w.data_out(&data_out(t, 1, 0), 4 * k),
            Err(TransferError::DataSn { got: 1, want: 0 })
        );
        assert_eq!(
            w.data_out(&data_out(t, 0, 0), 65 * k),
            Err(TransferError::Overrun {
                offset: 0,
                len: 65 * k,
                end: 64 * k
            })
        );
        assert!(!w.complete());
        assert_eq!(
            WriteTransfer::new(4 * k, 8 * k, false, 64 * k, 64 * k, 1).err(),
            Some(TransferError::TooMuchImmediate {
                got: 8 * k,
                max: 4 * k
            })
        );
    }
}
