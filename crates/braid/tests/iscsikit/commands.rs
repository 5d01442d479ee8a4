//! The SCSI commands tests send most, as exact CDB bytes, and the
//! initiator's shorthands for them (each panics unless GOOD, so a test
//! reads as what it checks).

use super::{Initiator, GOOD};

impl Initiator {
    /// The unit's registered reservation keys (PERSISTENT RESERVE IN,
    /// READ KEYS, with room for 8000).
    pub fn registered_keys(&mut self) -> Vec<u64> {
        let r = self.exec(&[0x5e, 0, 0, 0, 0, 0, 0, 0xfa, 0, 0], &[], 0xfa00);
        assert!(r.good(), "READ KEYS: {r:?}");
        let listed = u32::from_be_bytes(r.data[4..8].try_into().unwrap()) as usize;
        r.data[8..8 + listed]
            .chunks(8)
            .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
            .collect()
    }

    /// Sends WRITE(10) of `blocks` at `lba` and no data at all, as a
    /// hostile or broken initiator would; returns its task tag.
    pub fn write10_without_data(&mut self, lba: u32, blocks: u16) -> u32 {
        let len = usize::from(blocks) * 512;
        // The data is kept so that R2Ts could be answered, but the test
        // reads PDUs itself and never does.
        self.send_command_with(&write10_cdb(lba, blocks), &vec![0; len], 0, 0)
    }

    /// WRITE(10) of `data` at `lba` (512-byte blocks); panics unless GOOD.
    pub fn write10(&mut self, lba: u32, data: &[u8]) {
        let blocks = u16::try_from(data.len() / 512).expect("fits WRITE(10)");
        let r = self.exec(&write10_cdb(lba, blocks), data, 0);
        assert_eq!((r.status, r.sense), (GOOD, None), "WRITE(10) status");
    }

    /// READ(10) of `blocks` at `lba`; panics unless GOOD.
    pub fn read10(&mut self, lba: u32, blocks: u16) -> Vec<u8> {
        let r = self.exec(&read10_cdb(lba, blocks), &[], u32::from(blocks) * 512);
        assert_eq!((r.status, r.sense), (GOOD, None), "READ(10) status");
        r.data
    }

    /// READ CAPACITY (16): the unit's number of blocks and their length;
    /// panics unless GOOD.
    pub fn capacity(&mut self) -> (u64, u32) {
        let r = self.exec(&read_capacity16_cdb(), &[], 32);
        assert_eq!(
            (r.status, r.sense),
            (GOOD, None),
            "READ CAPACITY (16) status"
        );
        let last = u64::from_be_bytes(r.data[0..8].try_into().unwrap());
        let len = u32::from_be_bytes(r.data[8..12].try_into().unwrap());
        (last + 1, len)
    }
}

pub fn read10_cdb(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x28;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub fn write10_cdb(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = read10_cdb(lba, blocks);
    c[0] = 0x2a;
    c
}

/// READ CAPACITY (16) with room for 32 bytes.
pub fn read_capacity16_cdb() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    c[13] = 32;
    c
}

/// INQUIRY for VPD page `page`.
pub fn vpd_cdb(page: u8) -> [u8; 6] {
    [0x12, 0x01, page, 0x01, 0x00, 0]
}

/// REPORT TARGET PORT GROUPS, extended format.
pub fn rtpg_cdb() -> [u8; 12] {
    [0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 0x04, 0, 0, 0]
}

/// The (group id, access state code) pairs of REPORT TARGET PORT GROUPS
/// data in the extended format.
pub fn rtpg_states(data: &[u8]) -> Vec<(u16, u8)> {
    let mut out = Vec::new();
    let mut at = 8;
    while at + 8 <= data.len() {
        let d = &data[at..];
        out.push((u16::from_be_bytes([d[2], d[3]]), d[0] & 0x0f));
        at += 8 + 4 * usize::from(d[7]);
    }
    out
}
