//! SCSI status and sense data (SPC-5): how a command that did not succeed
//! says why. Sense data here is the fixed format (response code 0x70),
//! which every initiator reads; in an iSCSI SCSI Response it follows a
//! two-byte length.

/// SCSI status bytes.
pub mod status {
    pub const GOOD: u8 = 0x00;
    pub const CHECK_CONDITION: u8 = 0x02;
    pub const BUSY: u8 = 0x08;
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    pub const TASK_SET_FULL: u8 = 0x28;
    pub const TASK_ABORTED: u8 = 0x40;
}

/// Sense keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Key {
    NotReady = 0x2,
    MediumError = 0x3,
    HardwareError = 0x4,
    IllegalRequest = 0x5,
    UnitAttention = 0x6,
    DataProtect = 0x7,
    CopyAborted = 0xa,
    AbortedCommand = 0xb,
    Miscompare = 0xe,
}

/// A sense key with its additional sense code and qualifier, and the
/// INFORMATION field when the condition names a place (the offset of the
/// first byte that differed, after a miscompare).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sense {
    pub key: Key,
    pub asc: u8,
    pub ascq: u8,
    pub information: Option<u32>,
    /// The CDB byte (and bit) an INVALID FIELD IN CDB is about: the
    /// sense-key specific field pointer, which tells an initiator a field
    /// it set was refused rather than the command unknown.
    pub field: Option<(u16, u8)>,
}

impl Sense {
    pub const INVALID_OPCODE: Sense = Sense::new(Key::IllegalRequest, 0x20, 0x00);
    pub const LBA_OUT_OF_RANGE: Sense = Sense::new(Key::IllegalRequest, 0x21, 0x00);
    pub const INVALID_FIELD_IN_CDB: Sense = Sense::new(Key::IllegalRequest, 0x24, 0x00);
    pub const LUN_NOT_SUPPORTED: Sense = Sense::new(Key::IllegalRequest, 0x25, 0x00);
    pub const PARAMETER_LIST_LENGTH: Sense = Sense::new(Key::IllegalRequest, 0x1a, 0x00);
    pub const WRITE_PROTECTED: Sense = Sense::new(Key::DataProtect, 0x27, 0x00);
    pub const READ_ERROR: Sense = Sense::new(Key::MediumError, 0x11, 0x00);
    pub const WRITE_ERROR: Sense = Sense::new(Key::MediumError, 0x0c, 0x00);
    pub const MISCOMPARE: Sense = Sense::new(Key::Miscompare, 0x1d, 0x00);
    pub const POWER_ON_RESET: Sense = Sense::new(Key::UnitAttention, 0x29, 0x00);

    pub const fn new(key: Key, asc: u8, ascq: u8) -> Self {
        Self {
            key,
            asc,
            ascq,
            information: None,
            field: None,
        }
    }

    /// The same condition, pointing at bit `bit` of CDB byte `byte`.
    pub const fn in_cdb_field(self, byte: u16, bit: u8) -> Self {
        Self {
            field: Some((byte, bit)),
            ..self
        }
    }

    /// The same condition, naming `information`.
    pub const fn with_information(self, information: u32) -> Self {
        Self {
            information: Some(information),
            ..self
        }
    }

    /// Fixed-format sense data: 18 bytes.
    pub fn fixed(&self) -> [u8; 18] {
        let mut s = [0u8; 18];
        s[0] = 0x70; // current error, fixed format
        if let Some(info) = self.information {
            s[0] |= 0x80; // VALID: the INFORMATION field means something
            s[3..7].copy_from_slice(&info.to_be_bytes());
        }
        s[2] = self.key as u8;
        s[7] = 10; // additional sense length: bytes 8..18
        s[12] = self.asc;
        s[13] = self.ascq;
        if let Some((byte, bit)) = self.field {
            // SKSV, C/D (a CDB field), BPV, the bit; then the byte.
            s[15] = 0x80 | 0x40 | 0x08 | (bit & 0x07);
            s[16..18].copy_from_slice(&byte.to_be_bytes());
        }
        s
    }

    /// The data segment of an iSCSI SCSI Response carrying this sense:
    /// SenseLength, then the sense data.
    pub fn iscsi_segment(&self) -> Vec<u8> {
        let fixed = self.fixed();
        let mut out = Vec::with_capacity(2 + fixed.len());
        out.extend_from_slice(&(fixed.len() as u16).to_be_bytes());
        out.extend_from_slice(&fixed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_sense_for_an_unknown_opcode() {
        assert_eq!(
            Sense::INVALID_OPCODE.fixed(),
            [0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x20, 0, 0, 0, 0, 0]
        );
        let seg = Sense::LBA_OUT_OF_RANGE.iscsi_segment();
        assert_eq!(&seg[..2], &[0, 18]);
        assert_eq!((seg[2 + 2], seg[2 + 12]), (0x05, 0x21));
    }

    #[test]
    fn a_refused_field_is_pointed_at() {
        let s = Sense::INVALID_FIELD_IN_CDB.in_cdb_field(2, 2).fixed();
        assert_eq!(s[15..18], [0xca, 0, 2]);
        assert_eq!(Sense::INVALID_FIELD_IN_CDB.fixed()[15..18], [0, 0, 0]);
    }

    #[test]
    fn a_miscompare_names_the_first_byte_that_differed() {
        let s = Sense::MISCOMPARE.with_information(37).fixed();
        assert_eq!(&s[..8], &[0xf0, 0, 0x0e, 0, 0, 0, 37, 10]);
        assert_eq!((s[12], s[13]), (0x1d, 0x00));
    }
}
