//! Transmission requests: the 28-byte header (spec: "Request message") and
//! the one check every request passes before a backend sees it.
//!
//! The WRITE payload that follows a header is not read here: the driver
//! reads exactly `length` bytes once [`Request::validate`] has accepted the
//! request, so a hostile length never turns into an allocation.

use crate::wire::{
    CmdFlags, Command, Cookie, Errno, TransmissionFlags, REQUEST_HEADER_LEN, REQUEST_MAGIC,
};
use crate::ProtoError;

/// One request header as it travels on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: CmdFlags,
    pub command: Command,
    pub cookie: Cookie,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    /// Writes the header into `out` (exactly [`REQUEST_HEADER_LEN`] bytes).
    pub fn encode(&self, out: &mut [u8; REQUEST_HEADER_LEN]) {
        out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.0.to_be_bytes());
        out[6..8].copy_from_slice(&self.command.to_u16().to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.0.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.length.to_be_bytes());
    }

    /// Appends the header to a buffer.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let mut header = [0u8; REQUEST_HEADER_LEN];
        self.encode(&mut header);
        out.extend_from_slice(&header);
    }

    /// Parses a header.
    ///
    /// # Errors
    ///
    /// [`ProtoError::BadMagic`] when the magic is wrong: the stream is out of
    /// step and the connection must be closed.
    pub fn decode(bytes: &[u8; REQUEST_HEADER_LEN]) -> Result<Self, ProtoError> {
        let magic = u32::from_be_bytes(bytes[0..4].try_into().expect("4 of 28 bytes"));
        if magic != REQUEST_MAGIC {
            return Err(ProtoError::BadMagic {
                what: "request",
                found: u64::from(magic),
            });
        }
        Ok(Self {
            flags: CmdFlags(u16::from_be_bytes([bytes[4], bytes[5]])),
            command: Command::from_u16(u16::from_be_bytes([bytes[6], bytes[7]])),
            cookie: Cookie(u64::from_be_bytes(
                bytes[8..16].try_into().expect("8 of 28"),
            )),
            offset: u64::from_be_bytes(bytes[16..24].try_into().expect("8 of 28")),
            length: u32::from_be_bytes(bytes[24..28].try_into().expect("4 of 28")),
        })
    }

    /// Number of payload bytes that follow this header on the wire.
    pub fn payload_len(&self) -> u32 {
        if self.command == Command::Write {
            self.length
        } else {
            0
        }
    }

    /// Checks the request against what was negotiated, as the spec asks a
    /// server to ("Error values", "Size constraints", each command's text).
    ///
    /// # Errors
    ///
    /// The NBD error value to reply with. A WRITE that fails here still has
    /// its payload on the wire; the caller must discard it (or close the
    /// connection when the length is too large to be worth reading).
    pub fn validate(&self, ctx: &Negotiated) -> Result<(), Errno> {
        let flags = ctx.flags;
        let end = self.offset.checked_add(u64::from(self.length));
        let within = matches!(end, Some(end) if end <= ctx.size);
        let aligned = self.offset.is_multiple_of(u64::from(ctx.min_block))
            && self.length.is_multiple_of(ctx.min_block);
        let allowed_flags = match self.command {
            Command::Read => CmdFlags::FUA | if ctx.structured { CmdFlags::DF } else { 0 },
            Command::Write | Command::Trim => CmdFlags::FUA,
            Command::WriteZeroes => CmdFlags::FUA | CmdFlags::NO_HOLE | CmdFlags::FAST_ZERO,
            Command::BlockStatus => CmdFlags::FUA | CmdFlags::REQ_ONE,
            Command::Flush | Command::Cache | Command::Disc => CmdFlags::FUA,
            Command::Unknown(_) => return Err(Errno::Inval),
        };
        if self.flags.0 & !allowed_flags != 0 {
            return Err(Errno::Inval);
        }
        if self.flags.fua() && !flags.has(TransmissionFlags::SEND_FUA) {
            return Err(Errno::Inval);
        }
        match self.command {
            Command::Read | Command::Cache => {
                if !within || !aligned {
                    return Err(Errno::Inval);
                }
                if self.command == Command::Read && self.length > ctx.max_payload {
                    return Err(Errno::Inval);
                }
            }
            Command::Write => {
                if flags.read_only() {
                    return Err(Errno::Perm);
                }
                if self.length > ctx.max_payload {
                    return Err(Errno::Inval);
                }
                if !aligned {
                    return Err(Errno::Inval);
                }
                if !within {
                    return Err(Errno::NoSpc);
                }
            }
            Command::Trim | Command::WriteZeroes => {
                // Read-only first: such exports never offer TRIM or ZERO,
                // and the spec (like nbdkit) answers writes with EPERM.
                if flags.read_only() {
                    return Err(Errno::Perm);
                }
                let supported = if self.command == Command::Trim {
                    TransmissionFlags::SEND_TRIM
                } else {
                    TransmissionFlags::SEND_WRITE_ZEROES
                };
                if !flags.has(supported) {
                    return Err(Errno::Inval);
                }
                if self.flags.has(CmdFlags::FAST_ZERO)
                    && !flags.has(TransmissionFlags::SEND_FAST_ZERO)
                {
                    return Err(Errno::Inval);
                }
                if !aligned {
                    return Err(Errno::Inval);
                }
                if !within {
                    return Err(if self.command == Command::Trim {
                        Errno::Inval
                    } else {
                        Errno::NoSpc
                    });
                }
            }
            Command::BlockStatus => {
                if !ctx.structured || !ctx.block_status {
                    return Err(Errno::Inval);
                }
                if !within || !aligned {
                    return Err(Errno::Inval);
                }
            }
            Command::Flush => {
                if !flags.has(TransmissionFlags::SEND_FLUSH) {
                    return Err(Errno::Inval);
                }
            }
            Command::Disc | Command::Unknown(_) => {}
        }
        Ok(())
    }
}

/// What the handshake settled that the transmission phase must respect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// Export size in bytes.
    pub size: u64,
    pub flags: TransmissionFlags,
    /// Smallest addressable unit; a power of two.
    pub min_block: u32,
    /// Largest READ or WRITE payload.
    pub max_payload: u32,
    /// Structured replies were agreed.
    pub structured: bool,
    /// `base:allocation` was selected, so BLOCK_STATUS is allowed.
    pub block_status: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Negotiated {
        Negotiated {
            size: 1 << 20,
            flags: TransmissionFlags(
                TransmissionFlags::HAS_FLAGS
                    | TransmissionFlags::SEND_FLUSH
                    | TransmissionFlags::SEND_FUA
                    | TransmissionFlags::SEND_TRIM
                    | TransmissionFlags::SEND_WRITE_ZEROES
                    | TransmissionFlags::SEND_FAST_ZERO,
            ),
            min_block: 1,
            max_payload: 1 << 16,
            structured: true,
            block_status: true,
        }
    }

    fn req(command: Command, offset: u64, length: u32) -> Request {
        Request {
            flags: CmdFlags(0),
            command,
            cookie: Cookie(7),
            offset,
            length,
        }
    }

    #[test]
    fn encodes_spec_layout() {
        let r = Request {
            flags: CmdFlags(CmdFlags::FUA),
            command: Command::Write,
            cookie: Cookie(0x0102_0304_0506_0708),
            offset: 0x1000,
            length: 512,
        };
        let mut out = [0u8; REQUEST_HEADER_LEN];
        r.encode(&mut out);
        assert_eq!(
            out,
            [
                0x25, 0x60, 0x95, 0x13, // magic
                0x00, 0x01, // FUA
                0x00, 0x01, // WRITE
                1, 2, 3, 4, 5, 6, 7, 8, // cookie
                0, 0, 0, 0, 0, 0, 0x10, 0, // offset
                0, 0, 2, 0, // length
            ]
        );
        assert_eq!(Request::decode(&out).unwrap(), r);
        assert_eq!(r.payload_len(), 512);
    }

    #[test]
    fn wrong_magic_is_an_error() {
        let mut out = [0u8; REQUEST_HEADER_LEN];
        req(Command::Read, 0, 1).encode(&mut out);
        out[0] = 0x12;
        assert!(matches!(
            Request::decode(&out),
            Err(ProtoError::BadMagic {
                what: "request",
                ..
            })
        ));
    }

    #[test]
    fn unknown_command_survives_decoding() {
        let mut out = [0u8; REQUEST_HEADER_LEN];
        req(Command::Unknown(99), 0, 0).encode(&mut out);
        let r = Request::decode(&out).unwrap();
        assert_eq!(r.command, Command::Unknown(99));
        assert_eq!(r.validate(&ctx()), Err(Errno::Inval));
    }

    #[test]
    fn past_the_end_is_rejected_per_command() {
        let c = ctx();
        assert_eq!(
            req(Command::Read, (1 << 20) - 1, 2).validate(&c),
            Err(Errno::Inval)
        );
        assert_eq!(
            req(Command::Write, (1 << 20) - 1, 2).validate(&c),
            Err(Errno::NoSpc)
        );
        assert_eq!(
            req(Command::Trim, 1 << 20, 1).validate(&c),
            Err(Errno::Inval)
        );
        assert_eq!(
            req(Command::WriteZeroes, 1 << 20, 1).validate(&c),
            Err(Errno::NoSpc)
        );
        assert_eq!(
            req(Command::Read, u64::MAX, 2).validate(&c),
            Err(Errno::Inval)
        );
        assert_eq!(req(Command::Read, (1 << 20) - 1, 1).validate(&c), Ok(()));
    }

    #[test]
    fn oversized_payloads_are_rejected() {
        let c = ctx();
        // The spec keeps EOVERFLOW for DF and payload-less commands.
        assert_eq!(
            req(Command::Read, 0, (1 << 16) + 1).validate(&c),
            Err(Errno::Inval)
        );
        assert_eq!(
            req(Command::Write, 0, u32::MAX).validate(&c),
            Err(Errno::Inval)
        );
        // No payload: the effect length may exceed max_payload.
        assert_eq!(req(Command::WriteZeroes, 0, 1 << 20).validate(&c), Ok(()));
    }

    #[test]
    fn read_only_exports_refuse_writes_with_eperm() {
        let mut c = ctx();
        c.flags.0 |= TransmissionFlags::READ_ONLY;
        // As a read-only export is offered: without TRIM and ZERO.
        c.flags.0 &= !(TransmissionFlags::SEND_TRIM | TransmissionFlags::SEND_WRITE_ZEROES);
        for cmd in [Command::Write, Command::Trim, Command::WriteZeroes] {
            assert_eq!(req(cmd, 0, 1).validate(&c), Err(Errno::Perm), "{cmd:?}");
        }
        assert_eq!(req(Command::Read, 0, 1).validate(&c), Ok(()));
    }

    #[test]
    fn flags_must_belong_to_the_command() {
        let c = ctx();
        let mut r = req(Command::Read, 0, 1);
        r.flags = CmdFlags(CmdFlags::NO_HOLE);
        assert_eq!(r.validate(&c), Err(Errno::Inval));
        r.flags = CmdFlags(CmdFlags::DF);
        assert_eq!(r.validate(&c), Ok(()));
        let mut z = req(Command::WriteZeroes, 0, 4);
        z.flags = CmdFlags(CmdFlags::NO_HOLE | CmdFlags::FAST_ZERO | CmdFlags::FUA);
        assert_eq!(z.validate(&c), Ok(()));
        let mut no_sr = c.clone();
        no_sr.structured = false;
        assert_eq!(r.validate(&no_sr), Err(Errno::Inval));
    }

    #[test]
    fn alignment_follows_min_block() {
        let mut c = ctx();
        c.min_block = 512;
        assert_eq!(req(Command::Read, 1, 512).validate(&c), Err(Errno::Inval));
        assert_eq!(req(Command::Read, 512, 511).validate(&c), Err(Errno::Inval));
        assert_eq!(req(Command::Read, 512, 1024).validate(&c), Ok(()));
    }

    #[test]
    fn block_status_needs_a_selected_context() {
        let mut c = ctx();
        assert_eq!(req(Command::BlockStatus, 0, 10).validate(&c), Ok(()));
        c.block_status = false;
        assert_eq!(
            req(Command::BlockStatus, 0, 10).validate(&c),
            Err(Errno::Inval)
        );
    }
}
