//! The memory model of one disk behind a volatile write cache, with no FUSE
//! in it: what reads see, what would survive a power cut, and what a
//! failed or slow cache flush does. Kept apart so its rules are unit-tested
//! with plain byte vectors.

use std::collections::BTreeSet;

use rand::{Rng, SeedableRng};

/// The unit a disk writes atomically: a power cut keeps or loses whole
/// sectors, never part of one (what a 512e drive promises).
pub const SECTOR: u64 = 512;

/// One file's bytes, twice: as the page cache holds them and as the media
/// holds them.
pub struct Disk {
    /// What reads return: the media plus every write since.
    cached: Vec<u8>,
    /// What a power cut leaves.
    media: Vec<u8>,
    /// Sectors written since they last reached the media.
    dirty: BTreeSet<u64>,
}

/// What a power cut did, for the test's log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// Dirty sectors that never reached the media.
    pub lost: u64,
    /// Dirty sectors that happened to reach it before the lights went out.
    pub kept: u64,
}

impl Disk {
    pub fn new(len: u64) -> Self {
        let len = usize::try_from(len).expect("a disk that fits in memory");
        Self {
            cached: vec![0; len],
            media: vec![0; len],
            dirty: BTreeSet::new(),
        }
    }

    pub fn len(&self) -> u64 {
        self.cached.len() as u64
    }

    pub fn dirty_sectors(&self) -> usize {
        self.dirty.len()
    }

    /// Bytes at `offset`, short at the end of the disk as a file read is.
    pub fn read(&self, offset: u64, len: u64) -> &[u8] {
        let start = offset.min(self.len()) as usize;
        let end = offset.saturating_add(len).min(self.len()) as usize;
        &self.cached[start..end]
    }

    /// Writes into the cache; returns how many bytes fit before the end
    /// (the disk does not grow).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> usize {
        let start = offset.min(self.len()) as usize;
        let end = (start + data.len()).min(self.cached.len());
        self.cached[start..end].copy_from_slice(&data[..end - start]);
        self.mark_dirty(start as u64, end as u64);
        end - start
    }

    /// Zeroes a range in the cache (a punched hole or zeroed range).
    pub fn zero(&mut self, offset: u64, len: u64) {
        let start = offset.min(self.len());
        let end = offset.saturating_add(len).min(self.len());
        self.cached[start as usize..end as usize].fill(0);
        self.mark_dirty(start, end);
    }

    fn mark_dirty(&mut self, start: u64, end: u64) {
        if start < end {
            self.dirty.extend(start / SECTOR..end.div_ceil(SECTOR));
        }
    }

    fn sector(&self, s: u64) -> std::ops::Range<usize> {
        let start = (s * SECTOR) as usize;
        start..(start + SECTOR as usize).min(self.cached.len())
    }

    /// A cache flush that worked: every dirty sector is on the media.
    pub fn sync(&mut self) {
        for s in std::mem::take(&mut self.dirty) {
            let r = self.sector(s);
            self.media[r.clone()].copy_from_slice(&self.cached[r]);
        }
    }

    /// A cache flush that failed, as Linux handles one: the dirty pages are
    /// marked clean without reaching the media, so reads still see the new
    /// data until the next power cut, and the next flush has nothing to do
    /// and succeeds. Only the caller that saw the error knows.
    pub fn sync_failed(&mut self) {
        self.dirty.clear();
    }

    /// Power loss: each dirty sector reaches the media with probability
    /// `keep`, chosen by `seed`; everything else is gone, and the cache
    /// restarts from the media.
    pub fn cut(&mut self, keep: f64, seed: u64) -> Cut {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut cut = Cut::default();
        for s in std::mem::take(&mut self.dirty) {
            if rng.gen_bool(keep.clamp(0.0, 1.0)) {
                let r = self.sector(s);
                self.media[r.clone()].copy_from_slice(&self.cached[r]);
                cut.kept += 1;
            } else {
                cut.lost += 1;
            }
        }
        self.cached.copy_from_slice(&self.media);
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_drops_what_was_not_synced_and_keeps_what_was() {
        let mut d = Disk::new(4 * SECTOR);
        d.write(0, &[1; 512]);
        d.sync();
        d.write(512, &[2; 512]);
        d.write(0, &[3; 10]);
        assert_eq!(d.read(0, 1), [3]);
        assert_eq!(d.dirty_sectors(), 2);
        let cut = d.cut(0.0, 1);
        assert_eq!(cut, Cut { lost: 2, kept: 0 });
        assert_eq!(d.read(0, 512), [1; 512]);
        assert_eq!(d.read(512, 512), [0; 512]);
    }

    #[test]
    fn a_cut_keeps_whole_sectors_or_none() {
        let mut d = Disk::new(64 * SECTOR);
        d.write(0, &[9; 64 * 512]);
        let cut = d.cut(0.5, 7);
        assert_eq!(cut.kept + cut.lost, 64);
        assert!(cut.kept > 0 && cut.lost > 0, "{cut:?}");
        for s in 0..64 {
            let sector = d.read(s * SECTOR, SECTOR);
            assert!(sector == [9; 512] || sector == [0; 512], "sector {s} torn");
        }
    }

    #[test]
    fn a_failed_sync_forgets_the_data_but_reads_still_see_it() {
        let mut d = Disk::new(2 * SECTOR);
        d.write(0, &[5; 512]);
        d.sync_failed();
        assert_eq!(d.read(0, 512), [5; 512], "the cache still has it");
        assert_eq!(d.dirty_sectors(), 0, "so the next sync has nothing to do");
        d.sync();
        d.cut(1.0, 0);
        assert_eq!(d.read(0, 512), [0; 512], "it never reached the media");
    }

    #[test]
    fn writes_and_zeroes_stop_at_the_end_and_mark_partial_sectors() {
        let mut d = Disk::new(1000);
        assert_eq!(d.write(990, &[1; 20]), 10);
        assert_eq!(d.read(990, 100), [1; 10]);
        d.zero(995, 100);
        assert_eq!(d.read(990, 10), [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]);
        assert_eq!(d.dirty_sectors(), 1);
        d.sync();
        d.cut(0.0, 0);
        assert_eq!(d.read(990, 10), [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]);
    }
}
