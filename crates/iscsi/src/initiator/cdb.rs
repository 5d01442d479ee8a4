//! The CDBs an initiator sends a block device (SBC-4, SPC-5), zero-padded
//! to the 16 bytes a SCSI Command PDU holds, and the LUN field that
//! addresses them (SAM-5, "LUN representation").

/// A CDB as the SCSI Command PDU carries it.
pub type Cdb = [u8; 16];

/// The 8-byte LUN field for LUN `n`: peripheral device addressing below
/// 256, flat space addressing above (as Linux and libiscsi encode it).
pub fn lun_field(n: u16) -> u64 {
    let b0 = if n < 256 {
        0
    } else {
        0x40 | (n >> 8) as u8 & 0x3f
    };
    u64::from_be_bytes([b0, n as u8, 0, 0, 0, 0, 0, 0])
}

fn rw16(op: u8, lba: u64, blocks: u32, fua: bool) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = op;
    if fua {
        c[1] = 0x08;
    }
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// READ (16).
pub fn read16(lba: u64, blocks: u32) -> Cdb {
    rw16(0x88, lba, blocks, false)
}

/// WRITE (16); with `fua`, stable before it completes.
pub fn write16(lba: u64, blocks: u32, fua: bool) -> Cdb {
    rw16(0x8a, lba, blocks, fua)
}

/// SYNCHRONIZE CACHE (16) of the whole unit (0 blocks: to the end).
pub fn synchronize_cache16() -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x91;
    c
}

/// WRITE SAME (16) of the one block sent as data; with `unmap`, the
/// target may deallocate instead of writing (when the block is zero).
pub fn write_same16(lba: u64, blocks: u32, unmap: bool) -> Cdb {
    let mut c = rw16(0x93, lba, blocks, false);
    c[1] = if unmap { 0x08 } else { 0 };
    c
}

/// UNMAP with a parameter list of `len` bytes (see [`unmap_list`]).
pub fn unmap(len: u16) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x42;
    c[7..9].copy_from_slice(&len.to_be_bytes());
    c
}

/// UNMAP's parameter list: one block descriptor per `(lba, blocks)`.
pub fn unmap_list(ranges: &[(u64, u32)]) -> Vec<u8> {
    let descs = ranges.len() * 16;
    let mut p = vec![0u8; 8];
    p[0..2].copy_from_slice(&((descs + 6) as u16).to_be_bytes());
    p[2..4].copy_from_slice(&(descs as u16).to_be_bytes());
    for (lba, blocks) in ranges {
        p.extend_from_slice(&lba.to_be_bytes());
        p.extend_from_slice(&blocks.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
    }
    p
}

/// TEST UNIT READY.
pub fn test_unit_ready() -> Cdb {
    [0u8; 16]
}

/// INQUIRY: standard data (`page` `None`) or a VPD page.
pub fn inquiry(page: Option<u8>, alloc: u16) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x12;
    if let Some(p) = page {
        c[1] = 0x01; // EVPD
        c[2] = p;
    }
    c[3..5].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// READ CAPACITY (16).
pub fn read_capacity16(alloc: u32) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    c[10..14].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// MODE SENSE (6) of the caching page, current values, no block
/// descriptors (for WCE and DPOFUA).
pub fn mode_sense_caching(alloc: u8) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x1a;
    c[1] = 0x08; // DBD
    c[2] = 0x08; // caching mode page
    c[4] = alloc;
    c
}

/// REPORT TARGET PORT GROUPS (MAINTENANCE IN), length-only format.
pub fn report_target_port_groups(alloc: u32) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0xa3;
    c[1] = 0x0a;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// PERSISTENT RESERVE IN, READ KEYS (0) or READ RESERVATION (1).
pub fn persistent_reserve_in(action: u8, alloc: u16) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x5e;
    c[1] = action & 0x1f;
    c[7..9].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// PERSISTENT RESERVE OUT service actions braid uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReserveOut {
    Register = 0x00,
    Reserve = 0x01,
    PreemptAndAbort = 0x05,
    RegisterAndIgnore = 0x06,
}

/// Reservation type "write exclusive, all registrants": every registered
/// path may write and holds the reservation, so any path may reserve and
/// the reservation lasts while any path is registered; a preempted path
/// may not write.
pub const WRITE_EXCLUSIVE_ALL_REGISTRANTS: u8 = 0x7;

/// PERSISTENT RESERVE OUT and its 24-byte parameter list.
pub fn persistent_reserve_out(action: ReserveOut, key: u64, action_key: u64) -> (Cdb, Vec<u8>) {
    let mut c = [0u8; 16];
    c[0] = 0x5f;
    c[1] = action as u8;
    if matches!(action, ReserveOut::Reserve | ReserveOut::PreemptAndAbort) {
        c[2] = WRITE_EXCLUSIVE_ALL_REGISTRANTS; // scope 0: the unit
    }
    c[5..9].copy_from_slice(&24u32.to_be_bytes());
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&action_key.to_be_bytes());
    (c, p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn luns_are_encoded_as_sam_asks() {
        assert_eq!(lun_field(0), 0);
        assert_eq!(lun_field(3).to_be_bytes(), [0, 3, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            lun_field(0x123).to_be_bytes(),
            [0x41, 0x23, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn block_commands_by_the_byte() {
        assert_eq!(
            read16(0x0102_0304_0506_0708, 0x10),
            [0x88, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0x10, 0, 0]
        );
        assert_eq!(write16(2, 1, true)[..3], [0x8a, 0x08, 0]);
        assert_eq!(write_same16(8, 4, true)[..2], [0x93, 0x08]);
        assert_eq!(synchronize_cache16()[0], 0x91);
        assert_eq!(unmap(24)[7..9], [0, 24]);
        let list = unmap_list(&[(0x10, 8)]);
        assert_eq!(list.len(), 24);
        assert_eq!(list[..4], [0, 22, 0, 16]);
        assert_eq!(list[8..20], [0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 8]);
    }

    #[test]
    fn description_commands_by_the_byte() {
        assert_eq!(inquiry(None, 96)[..5], [0x12, 0, 0, 0, 96]);
        assert_eq!(inquiry(Some(0x83), 512)[..5], [0x12, 1, 0x83, 2, 0]);
        assert_eq!(read_capacity16(32)[..2], [0x9e, 0x10]);
        assert_eq!(read_capacity16(32)[13], 32);
        assert_eq!(
            report_target_port_groups(1024)[..10],
            [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 4, 0]
        );
        assert_eq!(mode_sense_caching(64)[..5], [0x1a, 0x08, 0x08, 0, 64]);
        let (c, p) = persistent_reserve_out(ReserveOut::PreemptAndAbort, 7, 9);
        assert_eq!(c[..9], [0x5f, 0x05, 0x07, 0, 0, 0, 0, 0, 24]);
        assert_eq!((p[7], p[15]), (7, 9));
    }
}
