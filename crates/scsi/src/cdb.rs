//! SCSI command descriptor blocks (SBC-4, SPC-5) a block target must read,
//! parsed into one [`Command`] each. A CDB that is too short, or whose
//! fields are not allowed, is an error with the sense to answer; an
//! opcode braid does not implement is [`Command::Unsupported`], answered
//! INVALID COMMAND OPERATION CODE, never a crash.

use super::be::{be16, be32, be64};
use super::sense::Sense;

/// A parsed CDB. Lengths and addresses are in logical blocks unless named
/// as bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    TestUnitReady,
    Inquiry {
        /// `Some(page)` for a vital product data page (EVPD set).
        vpd: Option<u8>,
        alloc: u16,
    },
    RequestSense {
        alloc: u8,
    },
    ReadCapacity10,
    ReadCapacity16 {
        alloc: u32,
    },
    Read {
        lba: u64,
        blocks: u32,
        fua: bool,
    },
    Write {
        lba: u64,
        blocks: u32,
        fua: bool,
    },
    SynchronizeCache {
        lba: u64,
        /// 0: to the end of the medium.
        blocks: u32,
    },
    ReportLuns {
        alloc: u32,
    },
    /// UNMAP: the block descriptors come in the parameter list.
    Unmap {
        param_len: u16,
    },
    /// WRITE SAME (10) or (16): one block of data (none with NDOB, which
    /// means zeroes) repeated over `blocks` (0: to the end of the medium).
    WriteSame {
        lba: u64,
        blocks: u32,
        unmap: bool,
        no_data: bool,
    },
    /// COMPARE AND WRITE: the data-out buffer holds `blocks` blocks to
    /// compare with the medium, then `blocks` blocks to write if they
    /// matched.
    CompareAndWrite {
        lba: u64,
        blocks: u32,
        fua: bool,
    },
    /// GET LBA STATUS (SERVICE ACTION IN, service action 0x12).
    GetLbaStatus {
        lba: u64,
        alloc: u32,
    },
    /// REPORT TARGET PORT GROUPS (MAINTENANCE IN, service action 0x0a).
    ReportTargetPortGroups {
        /// The extended header (parameter data format 1) was asked for.
        extended: bool,
        alloc: u32,
    },
    ModeSense {
        page: u8,
        subpage: u8,
        /// The page control field: current, changeable, default, saved.
        control: u8,
        /// Block descriptors left out (DBD).
        no_block_descriptors: bool,
        alloc: u16,
        /// MODE SENSE(10) rather than (6): the header is eight bytes.
        ten: bool,
    },
    /// VERIFY (10) or (16). `bytchk` 0: the medium is only checked; 1:
    /// `blocks` blocks of data-out are compared with it; 3: one block of
    /// data-out is compared with each block.
    Verify {
        lba: u64,
        blocks: u32,
        bytchk: u8,
    },
    /// WRITE AND VERIFY (10) or (16): written through to the medium, then
    /// read back and compared.
    WriteAndVerify {
        lba: u64,
        blocks: u32,
    },
    /// ORWRITE (16): the data sent is ORed into the blocks, atomically.
    OrWrite {
        lba: u64,
        blocks: u32,
        fua: bool,
    },
    /// PRE-FETCH (10) or (16).
    Prefetch {
        lba: u64,
        blocks: u32,
    },
    /// MODE SELECT (6) or (10): a parameter list of `param_len` bytes.
    ModeSelect {
        param_len: u16,
        ten: bool,
    },
    /// REPORT SUPPORTED OPERATION CODES (MAINTENANCE IN, service action
    /// 0x0c).
    ReportOpcodes {
        /// Reporting options: 0 every command, 1 one opcode, 2 one opcode
        /// and service action, 3 either.
        options: u8,
        opcode: u8,
        action: u16,
        /// Command timeouts descriptors asked for (RCTD).
        timeouts: bool,
        alloc: u32,
    },
    /// PERSISTENT RESERVE IN.
    PersistentReserveIn {
        action: u8,
        alloc: u16,
    },
    /// PERSISTENT RESERVE OUT: the parameter list carries the keys.
    PersistentReserveOut {
        action: u8,
        scope: u8,
        kind: u8,
        param_len: u32,
    },
    /// EXTENDED COPY (LID1): the copy is described in the parameter
    /// list ([`crate::xcopy`]).
    ExtendedCopy {
        param_len: u32,
    },
    /// POPULATE TOKEN: a token for the ranges its parameter list names
    /// ([`crate::rod`]), its outcome held under `list_id`.
    PopulateToken {
        list_id: u32,
        param_len: u32,
    },
    /// WRITE USING TOKEN: the ranges its parameter list names written
    /// from a token's data.
    WriteUsingToken {
        list_id: u32,
        param_len: u32,
    },
    /// RECEIVE ROD TOKEN INFORMATION about the token command `list_id`.
    ReceiveRodTokenInformation {
        list_id: u32,
        alloc: u32,
    },
    /// RECEIVE COPY RESULTS with this service action, about the copy
    /// with list identifier `list_id`.
    ReceiveCopyResults {
        action: u8,
        list_id: u8,
        alloc: u32,
    },
    /// RESERVE (6) or (10): the whole unit, for this I_T nexus.
    Reserve,
    /// RELEASE (6) or (10).
    Release,
    /// An operation code braid does not implement.
    Unsupported {
        opcode: u8,
    },
}

/// The CDB's length by its group code (the top three bits of the opcode),
/// for the groups braid reads.
fn cdb_len(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// FUA is bit 3 of byte 1 in READ and WRITE (10), (12) and (16).
fn fua(cdb: &[u8]) -> bool {
    cdb[1] & 0x08 != 0
}

/// RDPROTECT / WRPROTECT (byte 1, bits 5-7) ask for protection
/// information, which a unit without it must refuse.
fn protect(cdb: &[u8]) -> Result<(), Sense> {
    if cdb[1] & 0xe0 == 0 {
        Ok(())
    } else {
        Err(Sense::INVALID_FIELD_IN_CDB)
    }
}

impl Command {
    /// Parses `cdb` (an iSCSI SCSI Command carries 16 bytes, padded; a
    /// longer CDB would come in an AHS, which no command here needs).
    ///
    /// # Errors
    ///
    /// The sense to answer: INVALID FIELD IN CDB for a CDB shorter than
    /// its opcode's length or a field braid does not allow.
    pub fn parse(cdb: &[u8]) -> Result<Command, Sense> {
        let Some(&opcode) = cdb.first() else {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        };
        if let Some(len) = cdb_len(opcode) {
            if cdb.len() < len {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
        }
        Ok(match opcode {
            0x00 => Command::TestUnitReady,
            0x03 => Command::RequestSense { alloc: cdb[4] },
            0x12 => {
                let evpd = cdb[1] & 1 != 0;
                // A page code without EVPD is obsolete and not allowed.
                if !evpd && cdb[2] != 0 {
                    return Err(Sense::INVALID_FIELD_IN_CDB);
                }
                Command::Inquiry {
                    vpd: evpd.then_some(cdb[2]),
                    alloc: be16(&cdb[3..5]),
                }
            }
            0x08 | 0x0a => {
                let lba = (u64::from(cdb[1] & 0x1f) << 16) | u64::from(be16(&cdb[2..4]));
                // Zero blocks means 256 in the six-byte forms.
                let blocks = if cdb[4] == 0 { 256 } else { u32::from(cdb[4]) };
                if opcode == 0x08 {
                    Command::Read {
                        lba,
                        blocks,
                        fua: false,
                    }
                } else {
                    Command::Write {
                        lba,
                        blocks,
                        fua: false,
                    }
                }
            }
            0x28 | 0x2a | 0xa8 | 0xaa | 0x88 | 0x8a if protect(cdb).is_err() => {
                return Err(Sense::INVALID_FIELD_IN_CDB)
            }
            0x28 | 0x2a => {
                let (lba, blocks) = (u64::from(be32(&cdb[2..6])), u32::from(be16(&cdb[7..9])));
                rw(opcode == 0x28, lba, blocks, fua(cdb))
            }
            0xa8 | 0xaa => rw(
                opcode == 0xa8,
                u64::from(be32(&cdb[2..6])),
                be32(&cdb[6..10]),
                fua(cdb),
            ),
            0x88 | 0x8a => rw(
                opcode == 0x88,
                be64(&cdb[2..10]),
                be32(&cdb[10..14]),
                fua(cdb),
            ),
            0x25 => Command::ReadCapacity10,
            0x9e if cdb[1] & 0x1f == 0x10 => Command::ReadCapacity16 {
                alloc: be32(&cdb[10..14]),
            },
            0x35 => Command::SynchronizeCache {
                lba: u64::from(be32(&cdb[2..6])),
                blocks: u32::from(be16(&cdb[7..9])),
            },
            0x91 => Command::SynchronizeCache {
                lba: be64(&cdb[2..10]),
                blocks: be32(&cdb[10..14]),
            },
            0x42 => {
                if cdb[1] & 0x01 != 0 {
                    // ANCHOR: anchored blocks are not offered.
                    return Err(Sense::INVALID_FIELD_IN_CDB);
                }
                Command::Unmap {
                    param_len: be16(&cdb[7..9]),
                }
            }
            0x41 | 0x93 => {
                protect(cdb)?;
                if cdb[1] & 0x10 != 0 {
                    return Err(Sense::INVALID_FIELD_IN_CDB);
                }
                let (lba, blocks) = if opcode == 0x41 {
                    (u64::from(be32(&cdb[2..6])), u32::from(be16(&cdb[7..9])))
                } else {
                    (be64(&cdb[2..10]), be32(&cdb[10..14]))
                };
                Command::WriteSame {
                    lba,
                    blocks,
                    unmap: cdb[1] & 0x08 != 0,
                    no_data: opcode == 0x93 && cdb[1] & 0x01 != 0,
                }
            }
            0x89 => {
                protect(cdb)?;
                Command::CompareAndWrite {
                    lba: be64(&cdb[2..10]),
                    blocks: u32::from(cdb[13]),
                    fua: fua(cdb),
                }
            }
            0x9e if cdb[1] & 0x1f == 0x12 => Command::GetLbaStatus {
                lba: be64(&cdb[2..10]),
                alloc: be32(&cdb[10..14]),
            },
            0xa3 if cdb[1] & 0x1f == 0x0a => Command::ReportTargetPortGroups {
                extended: cdb[1] >> 5 == 1,
                alloc: be32(&cdb[6..10]),
            },
            0xa0 => Command::ReportLuns {
                alloc: be32(&cdb[6..10]),
            },
            0x1a | 0x5a => {
                let ten = opcode == 0x5a;
                Command::ModeSense {
                    page: cdb[2] & 0x3f,
                    control: cdb[2] >> 6,
                    subpage: cdb[3],
                    no_block_descriptors: cdb[1] & 0x08 != 0,
                    alloc: if ten {
                        be16(&cdb[7..9])
                    } else {
                        u16::from(cdb[4])
                    },
                    ten,
                }
            }
            0x2f | 0x8f | 0xaf => {
                protect(cdb)?;
                let bytchk = (cdb[1] >> 1) & 0x03;
                if bytchk == 2 {
                    return Err(Sense::INVALID_FIELD_IN_CDB);
                }
                let (lba, blocks) = address(opcode, cdb);
                Command::Verify {
                    lba,
                    blocks,
                    bytchk,
                }
            }
            0x2e | 0x8e | 0xae => {
                protect(cdb)?;
                let (lba, blocks) = address(opcode, cdb);
                Command::WriteAndVerify { lba, blocks }
            }
            0x8b => {
                protect(cdb)?;
                Command::OrWrite {
                    lba: be64(&cdb[2..10]),
                    blocks: be32(&cdb[10..14]),
                    fua: fua(cdb),
                }
            }
            0x34 | 0x90 => {
                let (lba, blocks) = address(opcode, cdb);
                Command::Prefetch { lba, blocks }
            }
            0x15 | 0x55 => {
                // SP: saved pages are not kept.
                if cdb[1] & 0x01 != 0 {
                    return Err(Sense::INVALID_FIELD_IN_CDB);
                }
                let ten = opcode == 0x55;
                Command::ModeSelect {
                    param_len: if ten {
                        be16(&cdb[7..9])
                    } else {
                        u16::from(cdb[4])
                    },
                    ten,
                }
            }
            0xa3 if cdb[1] & 0x1f == 0x0c => {
                let options = cdb[2] & 0x07;
                if options > 3 {
                    return Err(Sense::INVALID_FIELD_IN_CDB.in_cdb_field(2, 2));
                }
                Command::ReportOpcodes {
                    options,
                    opcode: cdb[3],
                    action: be16(&cdb[4..6]),
                    timeouts: cdb[2] & 0x80 != 0,
                    alloc: be32(&cdb[6..10]),
                }
            }
            0x5e => Command::PersistentReserveIn {
                action: cdb[1] & 0x1f,
                alloc: be16(&cdb[7..9]),
            },
            0x5f => Command::PersistentReserveOut {
                action: cdb[1] & 0x1f,
                scope: cdb[2] >> 4,
                kind: cdb[2] & 0x0f,
                param_len: be32(&cdb[5..9]),
            },
            0x16 | 0x17 | 0x56 | 0x57 => {
                // Third-party reservations (and their long ids) are not
                // offered.
                if opcode & 0x40 != 0 && cdb[1] & 0x12 != 0 {
                    return Err(Sense::INVALID_FIELD_IN_CDB);
                }
                if opcode & 0x01 == 0 {
                    Command::Reserve
                } else {
                    Command::Release
                }
            }
            0x83 if cdb[1] & 0x1f == 0x00 => Command::ExtendedCopy {
                param_len: be32(&cdb[10..14]),
            },
            0x83 if cdb[1] & 0x1f == crate::rod::POPULATE_TOKEN => Command::PopulateToken {
                list_id: be32(&cdb[6..10]),
                param_len: be32(&cdb[10..14]),
            },
            0x83 if cdb[1] & 0x1f == crate::rod::WRITE_USING_TOKEN => Command::WriteUsingToken {
                list_id: be32(&cdb[6..10]),
                param_len: be32(&cdb[10..14]),
            },
            0x84 if cdb[1] & 0x1f == crate::rod::RECEIVE_ROD_TOKEN_INFORMATION => {
                Command::ReceiveRodTokenInformation {
                    list_id: be32(&cdb[2..6]),
                    alloc: be32(&cdb[10..14]),
                }
            }
            0x84 => Command::ReceiveCopyResults {
                action: cdb[1] & 0x1f,
                list_id: cdb[2],
                alloc: be32(&cdb[10..14]),
            },
            other => Command::Unsupported { opcode: other },
        })
    }

    /// Bytes of data the command takes from the initiator (Data-Out), if
    /// any: a WRITE's blocks, WRITE SAME's one block, UNMAP's parameters.
    pub fn data_out_len(&self, block: u32) -> Option<u64> {
        match *self {
            Command::Write { blocks, .. } => Some(u64::from(blocks) * u64::from(block)),
            Command::CompareAndWrite { blocks, .. } => {
                Some(2 * u64::from(blocks) * u64::from(block))
            }
            Command::WriteSame { no_data: false, .. } => Some(u64::from(block)),
            Command::Unmap { param_len } => Some(u64::from(param_len)),
            Command::Verify {
                blocks, bytchk: 1, ..
            }
            | Command::WriteAndVerify { blocks, .. }
            | Command::OrWrite { blocks, .. } => Some(u64::from(blocks) * u64::from(block)),
            Command::Verify { bytchk: 3, .. } => Some(u64::from(block)),
            Command::ModeSelect { param_len, .. } => Some(u64::from(param_len)),
            Command::PersistentReserveOut { param_len, .. }
            | Command::ExtendedCopy { param_len }
            | Command::PopulateToken { param_len, .. }
            | Command::WriteUsingToken { param_len, .. } => Some(u64::from(param_len)),
            _ => None,
        }
    }

    /// Whether the command moves data from the initiator (Data-Out).
    pub fn writes(&self) -> bool {
        self.data_out_len(512).is_some()
    }
}

/// The address and length of a (10), (12) or (16) CDB of the READ/WRITE
/// layout, by its group code.
fn address(opcode: u8, cdb: &[u8]) -> (u64, u32) {
    match opcode >> 5 {
        4 => (be64(&cdb[2..10]), be32(&cdb[10..14])),
        5 => (u64::from(be32(&cdb[2..6])), be32(&cdb[6..10])),
        _ => (u64::from(be32(&cdb[2..6])), u32::from(be16(&cdb[7..9]))),
    }
}

fn rw(read: bool, lba: u64, blocks: u32, fua: bool) -> Command {
    if read {
        Command::Read { lba, blocks, fua }
    } else {
        Command::Write { lba, blocks, fua }
    }
}

/// Checks that `blocks` at `lba` lie within a medium of `capacity` blocks.
///
/// # Errors
///
/// LOGICAL BLOCK ADDRESS OUT OF RANGE, without overflowing on any input.
pub fn check_range(lba: u64, blocks: u32, capacity: u64) -> Result<(), Sense> {
    match lba.checked_add(u64::from(blocks)) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(Sense::LBA_OUT_OF_RANGE),
    }
}

/// One UNMAP block descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnmapRange {
    pub lba: u64,
    pub blocks: u32,
}

/// The block descriptors of an UNMAP parameter list.
///
/// # Errors
///
/// PARAMETER LIST LENGTH ERROR when the lengths inside disagree with the
/// data, INVALID FIELD for more than `max` descriptors.
pub fn unmap_ranges(params: &[u8], max: usize) -> Result<Vec<UnmapRange>, Sense> {
    if params.is_empty() {
        return Ok(Vec::new());
    }
    if params.len() < 8 {
        return Err(Sense::PARAMETER_LIST_LENGTH);
    }
    let desc_len = usize::from(be16(&params[2..4]));
    if desc_len % 16 != 0 || 8 + desc_len > params.len() {
        return Err(Sense::PARAMETER_LIST_LENGTH);
    }
    if desc_len / 16 > max {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    Ok(params[8..8 + desc_len]
        .chunks_exact(16)
        .map(|d| UnmapRange {
            lba: be64(&d[0..8]),
            blocks: be32(&d[8..12]),
        })
        .collect())
}
