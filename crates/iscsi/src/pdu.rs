//! iSCSI PDUs on the wire (RFC 7143, "iSCSI PDU"): a 48-byte basic header
//! segment (BHS), optional additional header segments (AHS), an optional
//! header digest, a data segment padded to four bytes, and an optional
//! data digest.
//!
//! [`Framer`] cuts a byte stream into PDUs without I/O: feed it what was
//! read, take PDUs out. It checks lengths before it waits for or keeps any
//! data, so a peer cannot make it hold more than the negotiated
//! `MaxRecvDataSegmentLength`, and it checks digests.

use bytes::{Buf, Bytes, BytesMut};

use crate::digest::{self, Digests, DIGEST_LEN};

/// Length of the basic header segment.
pub const BHS_LEN: usize = 48;

/// Operation codes (the low six bits of byte 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    NopOut,
    ScsiCommand,
    TaskMgmtRequest,
    LoginRequest,
    TextRequest,
    DataOut,
    LogoutRequest,
    Snack,
    NopIn,
    ScsiResponse,
    TaskMgmtResponse,
    LoginResponse,
    TextResponse,
    DataIn,
    LogoutResponse,
    R2t,
    AsyncMessage,
    Reject,
    /// Vendor-specific or reserved: answered with a Reject, never acted on.
    Other(u8),
}

impl Opcode {
    pub fn from_byte(b: u8) -> Self {
        match b & 0x3f {
            0x00 => Self::NopOut,
            0x01 => Self::ScsiCommand,
            0x02 => Self::TaskMgmtRequest,
            0x03 => Self::LoginRequest,
            0x04 => Self::TextRequest,
            0x05 => Self::DataOut,
            0x06 => Self::LogoutRequest,
            0x10 => Self::Snack,
            0x20 => Self::NopIn,
            0x21 => Self::ScsiResponse,
            0x22 => Self::TaskMgmtResponse,
            0x23 => Self::LoginResponse,
            0x24 => Self::TextResponse,
            0x25 => Self::DataIn,
            0x26 => Self::LogoutResponse,
            0x31 => Self::R2t,
            0x32 => Self::AsyncMessage,
            0x3f => Self::Reject,
            other => Self::Other(other),
        }
    }

    pub fn byte(self) -> u8 {
        match self {
            Self::NopOut => 0x00,
            Self::ScsiCommand => 0x01,
            Self::TaskMgmtRequest => 0x02,
            Self::LoginRequest => 0x03,
            Self::TextRequest => 0x04,
            Self::DataOut => 0x05,
            Self::LogoutRequest => 0x06,
            Self::Snack => 0x10,
            Self::NopIn => 0x20,
            Self::ScsiResponse => 0x21,
            Self::TaskMgmtResponse => 0x22,
            Self::LoginResponse => 0x23,
            Self::TextResponse => 0x24,
            Self::DataIn => 0x25,
            Self::LogoutResponse => 0x26,
            Self::R2t => 0x31,
            Self::AsyncMessage => 0x32,
            Self::Reject => 0x3f,
            Self::Other(b) => b & 0x3f,
        }
    }

    /// Whether initiators send it (the others come from targets).
    pub fn from_initiator(self) -> bool {
        self.byte() < 0x20
    }
}

/// A basic header segment, with accessors for the fields every PDU has at
/// the same place. Opcode-specific fields are read with the byte helpers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Bhs(pub [u8; BHS_LEN]);

impl std::fmt::Debug for Bhs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bhs")
            .field("opcode", &self.opcode())
            .field("immediate", &self.immediate())
            .field("final", &self.final_bit())
            .field("ahs_len", &self.ahs_len())
            .field("data_len", &self.data_len())
            .field("itt", &format_args!("{:#010x}", self.itt()))
            .finish()
    }
}

impl Bhs {
    pub fn new(opcode: Opcode) -> Self {
        let mut b = [0u8; BHS_LEN];
        b[0] = opcode.byte();
        Self(b)
    }

    pub fn opcode(&self) -> Opcode {
        Opcode::from_byte(self.0[0])
    }

    /// The I bit: delivered for immediate processing (initiator PDUs).
    pub fn immediate(&self) -> bool {
        self.0[0] & 0x40 != 0
    }

    pub fn set_immediate(&mut self, on: bool) {
        self.set_bit(0, 0x40, on);
    }

    /// The F bit: the last PDU of a sequence.
    pub fn final_bit(&self) -> bool {
        self.0[1] & 0x80 != 0
    }

    pub fn set_final(&mut self, on: bool) {
        self.set_bit(1, 0x80, on);
    }

    /// Total length of the AHS in bytes (the wire counts four-byte words).
    pub fn ahs_len(&self) -> usize {
        usize::from(self.0[4]) * 4
    }

    /// Length of the data segment, padding excluded.
    pub fn data_len(&self) -> usize {
        (usize::from(self.0[5]) << 16) | (usize::from(self.0[6]) << 8) | usize::from(self.0[7])
    }

    /// Sets the data segment length (24 bits; larger values are cut, which
    /// the encoder never asks for).
    pub fn set_data_len(&mut self, len: usize) {
        self.0[5] = (len >> 16) as u8;
        self.0[6] = (len >> 8) as u8;
        self.0[7] = len as u8;
    }

    /// Bytes 8..16: the LUN in SCSI PDUs, opcode-specific elsewhere.
    pub fn lun(&self) -> u64 {
        self.u64_at(8)
    }

    pub fn set_lun(&mut self, lun: u64) {
        self.0[8..16].copy_from_slice(&lun.to_be_bytes());
    }

    /// The initiator task tag.
    pub fn itt(&self) -> u32 {
        self.u32_at(16)
    }

    pub fn set_itt(&mut self, itt: u32) {
        self.set_u32(16, itt);
    }

    /// A big-endian 32-bit field at `at`.
    pub fn u32_at(&self, at: usize) -> u32 {
        u32::from_be_bytes(self.0[at..at + 4].try_into().expect("four bytes"))
    }

    pub fn set_u32(&mut self, at: usize, v: u32) {
        self.0[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }

    pub fn u64_at(&self, at: usize) -> u64 {
        u64::from_be_bytes(self.0[at..at + 8].try_into().expect("eight bytes"))
    }

    fn set_bit(&mut self, byte: usize, mask: u8, on: bool) {
        if on {
            self.0[byte] |= mask;
        } else {
            self.0[byte] &= !mask;
        }
    }
}

/// One PDU: header, additional header segments and data, digests checked
/// and padding removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pdu {
    pub bhs: Bhs,
    pub ahs: Bytes,
    pub data: Bytes,
}

impl Pdu {
    pub fn new(bhs: Bhs, data: Bytes) -> Self {
        Self {
            bhs,
            ahs: Bytes::new(),
            data,
        }
    }

    /// The PDU on the wire: lengths filled in from `ahs` and `data`, data
    /// padded to four bytes, digests as negotiated.
    ///
    /// # Panics
    ///
    /// If the AHS is not a whole number of words up to 1020 bytes or the
    /// data is 16 MiB or more: the caller's bug, not the peer's.
    pub fn encode(&self, digests: Digests, out: &mut Vec<u8>) {
        assert!(
            self.ahs.len().is_multiple_of(4) && self.ahs.len() <= 255 * 4,
            "AHS length"
        );
        assert!(self.data.len() < 1 << 24, "data segment length");
        let mut bhs = self.bhs;
        bhs.0[4] = (self.ahs.len() / 4) as u8;
        bhs.set_data_len(self.data.len());
        let start = out.len();
        out.extend_from_slice(&bhs.0);
        out.extend_from_slice(&self.ahs);
        if digests.header {
            let d = digest::wire(&out[start..]);
            out.extend_from_slice(&d);
        }
        if !self.data.is_empty() {
            let data_start = out.len();
            out.extend_from_slice(&self.data);
            out.resize(data_start + padded(self.data.len()), 0);
            if digests.data {
                let d = digest::wire(&out[data_start..]);
                out.extend_from_slice(&d);
            }
        }
    }
}

/// `len` rounded up to a multiple of four.
pub fn padded(len: usize) -> usize {
    len.div_ceil(4) * 4
}

/// Why a byte stream is not iSCSI the framer can accept. Each ends the
/// connection (RFC 7143 has a header digest error end it, since the length
/// fields cannot be trusted; a data digest error could be retried at
/// ErrorRecoveryLevel 1, which braid does not offer).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("header digest mismatch: the PDU header was damaged in transit")]
    HeaderDigest,
    #[error("data digest mismatch on a {opcode:?} PDU: its data was damaged in transit")]
    DataDigest { opcode: Opcode },
    #[error("a {opcode:?} PDU carries {len} bytes of data, more than the {max} negotiated")]
    DataTooLong {
        opcode: Opcode,
        len: usize,
        max: usize,
    },
}

/// Cuts a received byte stream into PDUs.
#[derive(Debug)]
pub struct Framer {
    digests: Digests,
    max_data: usize,
}

impl Framer {
    /// `max_data` is what this side declared as `MaxRecvDataSegmentLength`
    /// (8192 until negotiated, the RFC's default for login).
    pub fn new(max_data: usize) -> Self {
        Self {
            digests: Digests::default(),
            max_data,
        }
    }

    /// Applies what login negotiated, for every PDU after the login phase.
    pub fn set(&mut self, digests: Digests, max_data: usize) {
        self.digests = digests;
        self.max_data = max_data;
    }

    /// The next whole PDU in `buf`, consumed from it; `Ok(None)` if more
    /// bytes are needed.
    ///
    /// # Errors
    ///
    /// [`FrameError`]: the connection must end.
    pub fn next(&self, buf: &mut BytesMut) -> Result<Option<Pdu>, FrameError> {
        if buf.len() < BHS_LEN {
            return Ok(None);
        }
        let mut bhs = Bhs([0; BHS_LEN]);
        bhs.0.copy_from_slice(&buf[..BHS_LEN]);
        let opcode = bhs.opcode();
        let data_len = bhs.data_len();
        if data_len > self.max_data {
            return Err(FrameError::DataTooLong {
                opcode,
                len: data_len,
                max: self.max_data,
            });
        }
        let header_len = BHS_LEN + bhs.ahs_len();
        let header_digest = if self.digests.header { DIGEST_LEN } else { 0 };
        let data_wire = if data_len == 0 {
            0
        } else {
            padded(data_len) + if self.digests.data { DIGEST_LEN } else { 0 }
        };
        let total = header_len + header_digest + data_wire;
        if buf.len() < total {
            buf.reserve(total - buf.len());
            return Ok(None);
        }
        if self.digests.header {
            let got = &buf[header_len..header_len + DIGEST_LEN];
            if got != digest::wire(&buf[..header_len]) {
                return Err(FrameError::HeaderDigest);
            }
        }
        if data_len > 0 && self.digests.data {
            let at = header_len + header_digest;
            let end = at + padded(data_len);
            if buf[end..end + DIGEST_LEN] != digest::wire(&buf[at..end]) {
                return Err(FrameError::DataDigest { opcode });
            }
        }
        let mut pdu = buf.split_to(total).freeze();
        pdu.advance(BHS_LEN);
        let ahs = pdu.split_to(header_len - BHS_LEN);
        pdu.advance(header_digest);
        let data = pdu.split_to(data_len);
        Ok(Some(Pdu { bhs, ahs, data }))
    }
}
