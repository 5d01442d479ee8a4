//! CDBs written out byte by byte, as initiators send them.

use super::cdb::{check_range, Command};
use super::sense::Sense;

fn cdb16(bytes: &[u8]) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[..bytes.len()].copy_from_slice(bytes);
    c
}

#[test]
fn reads_and_writes_of_every_size() {
    // READ(10), FUA, LBA 0x1000, 8 blocks.
    let c = cdb16(&[0x28, 0x08, 0, 0, 0x10, 0, 0, 0, 8, 0]);
    assert_eq!(
        Command::parse(&c),
        Ok(Command::Read {
            lba: 0x1000,
            blocks: 8,
            fua: true
        })
    );
    // WRITE(6): 21-bit LBA, and 0 blocks means 256.
    let c = cdb16(&[0x0a, 0x1f, 0xff, 0xff, 0, 0]);
    assert_eq!(
        Command::parse(&c),
        Ok(Command::Write {
            lba: 0x1f_ffff,
            blocks: 256,
            fua: false
        })
    );
    // READ(12): 32-bit length.
    let c = cdb16(&[0xa8, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0]);
    assert_eq!(
        Command::parse(&c),
        Ok(Command::Read {
            lba: 1,
            blocks: 0x1_0000,
            fua: false
        })
    );
    // WRITE(16): 64-bit LBA.
    let c = [0x8a, 0x08, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0x20, 0, 0];
    assert_eq!(
        Command::parse(&c),
        Ok(Command::Write {
            lba: 1 << 32,
            blocks: 0x20,
            fua: true
        })
    );
    assert!(Command::parse(&c).unwrap().writes());
}

#[test]
fn inquiry_capacity_luns_sync_and_mode_sense() {
    assert_eq!(
        Command::parse(&cdb16(&[0x12, 0, 0, 0, 36, 0])),
        Ok(Command::Inquiry {
            vpd: None,
            alloc: 36
        })
    );
    assert_eq!(
        Command::parse(&cdb16(&[0x12, 1, 0x83, 0x01, 0x00, 0])),
        Ok(Command::Inquiry {
            vpd: Some(0x83),
            alloc: 256
        })
    );
    assert_eq!(Command::parse(&cdb16(&[0x25])), Ok(Command::ReadCapacity10));
    assert_eq!(
        Command::parse(&cdb16(&[
            0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0
        ])),
        Ok(Command::ReadCapacity16 { alloc: 32 })
    );
    assert_eq!(
        Command::parse(&cdb16(&[0x9e, 0x11])),
        Ok(Command::Unsupported { opcode: 0x9e }),
        "another service action"
    );
    assert_eq!(
        Command::parse(&cdb16(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0])),
        Ok(Command::ReportLuns { alloc: 4096 })
    );
    assert_eq!(
        Command::parse(&cdb16(&[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0])),
        Ok(Command::SynchronizeCache { lba: 0, blocks: 0 })
    );
    assert_eq!(
        Command::parse(&cdb16(&[0x5a, 0x08, 0x48, 0, 0, 0, 0, 0, 0xfc, 0])),
        Ok(Command::ModeSense {
            page: 0x08,
            subpage: 0,
            control: 1,
            no_block_descriptors: true,
            alloc: 0xfc,
            ten: true
        })
    );
}

#[test]
fn bad_and_unknown_cdbs_get_sense_not_a_crash() {
    assert_eq!(Command::parse(&[]), Err(Sense::INVALID_FIELD_IN_CDB));
    assert_eq!(
        Command::parse(&[0x28, 0, 0]),
        Err(Sense::INVALID_FIELD_IN_CDB),
        "short"
    );
    assert_eq!(
        Command::parse(&cdb16(&[0x12, 0, 0x83, 0, 36, 0])),
        Err(Sense::INVALID_FIELD_IN_CDB),
        "a page code without EVPD"
    );
    assert_eq!(
        Command::parse(&cdb16(&[0xc0])),
        Ok(Command::Unsupported { opcode: 0xc0 })
    );
    for opcode in 0..=255u8 {
        let _ = Command::parse(&cdb16(&[opcode, 0xff, 0xff, 0xff, 0xff, 0xff]));
        let _ = Command::parse(&[opcode]);
    }
}

#[test]
fn ranges_are_checked_without_overflow() {
    assert_eq!(check_range(0, 8, 8), Ok(()));
    assert_eq!(check_range(1, 8, 8), Err(Sense::LBA_OUT_OF_RANGE));
    assert_eq!(
        check_range(u64::MAX, 1, u64::MAX),
        Err(Sense::LBA_OUT_OF_RANGE)
    );
    assert_eq!(check_range(8, 0, 8), Ok(()), "zero blocks at the end");
}
