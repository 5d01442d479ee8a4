//! The data `braid bench` writes: every 4 KiB sector carries its own
//! offset and the run's seed, then filler derived from the seed, so a read
//! can tell whether it got exactly the bytes written there.

use bytes::{Bytes, BytesMut};

const SECTOR: usize = 4096;
const HEADER: usize = 16;

/// The pattern of one run.
#[derive(Clone, Debug)]
pub struct Pattern {
    seed: u64,
    /// One block of filler, headers not yet written.
    template: Bytes,
}

impl Pattern {
    pub fn new(seed: u64, block: usize) -> Self {
        let mut x = seed | 1;
        let mut t = BytesMut::with_capacity(block);
        while t.len() < block {
            // xorshift64: fast, and different for every seed.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = (block - t.len()).min(8);
            t.extend_from_slice(&x.to_le_bytes()[..n]);
        }
        Self {
            seed,
            template: t.freeze(),
        }
    }

    fn header(&self, offset: u64) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        h[..8].copy_from_slice(&offset.to_le_bytes());
        h[8..].copy_from_slice(&self.seed.to_le_bytes());
        h
    }

    /// The block written at `offset`.
    pub fn block(&self, offset: u64, len: usize) -> Bytes {
        let mut b = BytesMut::from(&self.template[..len]);
        for (i, sector) in b.chunks_mut(SECTOR).enumerate() {
            let h = self.header(offset + (i * SECTOR) as u64);
            let n = sector.len().min(HEADER);
            sector[..n].copy_from_slice(&h[..n]);
        }
        b.freeze()
    }

    /// Checks a block read from `offset`; the message says where it differs.
    pub fn check(&self, offset: u64, data: &[u8]) -> Result<(), String> {
        for (i, sector) in data.chunks(SECTOR).enumerate() {
            let at = offset + (i * SECTOR) as u64;
            let h = self.header(at);
            let n = sector.len().min(HEADER);
            if sector[..n] != h[..n] {
                let found = u64::from_le_bytes(sector[..8.min(n)].try_into().unwrap_or([0; 8]));
                return Err(format!(
                    "sector at offset {at} holds the header of offset {found} (or foreign data)"
                ));
            }
            let start = i * SECTOR;
            if sector[n..] != self.template[start + n..start + sector.len()] {
                return Err(format!(
                    "sector at offset {at}: data differs from what was written"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_verify_only_where_written() {
        let p = Pattern::new(42, 1 << 20);
        let b = p.block(8 << 20, 1 << 20);
        assert!(p.check(8 << 20, &b).is_ok());
        assert!(p.check(9 << 20, &b).is_err(), "misplaced block accepted");
        let mut bad = b.to_vec();
        bad[5000] ^= 1;
        assert!(p.check(8 << 20, &bad).is_err(), "corruption accepted");
        let other = Pattern::new(43, 1 << 20);
        assert!(
            other.check(8 << 20, &b).is_err(),
            "another run's data accepted"
        );
    }

    #[test]
    fn small_blocks_work() {
        let p = Pattern::new(7, 512);
        let b = p.block(1024, 512);
        assert!(p.check(1024, &b).is_ok());
        let p = Pattern::new(7, 8);
        assert!(p.check(16, &p.block(16, 8)).is_ok());
    }
}
