//! A sparse volume in memory (`mem:SIZE`), for demos and tests.
//!
//! Memory is taken a page at a time as pages are written, so `mem:1TiB`
//! costs nothing until used; pages that are trimmed or zeroed whole are
//! given back. Pages are spread over shards so that connections writing
//! different places do not wait for one lock.

use std::collections::HashMap;
use std::io;
use std::sync::{Mutex, MutexGuard};

use braid_proto::wire::state;

use super::{Backend, Caps, Extent, ZeroError};

const PAGE: u64 = 64 * 1024;
const SHARDS: usize = 64;

type Page = Box<[u8; PAGE as usize]>;

/// Sparse memory behind an export.
#[derive(Debug)]
pub struct MemBackend {
    size: u64,
    shards: Vec<Mutex<HashMap<u64, Page>>>,
}

impl MemBackend {
    pub fn new(size: u64) -> Self {
        Self {
            size,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, page: u64) -> MutexGuard<'_, HashMap<u64, Page>> {
        // A panic while holding a shard cannot leave a page half-updated
        // in a way later readers could not handle, so poison is ignored.
        self.shards[(page % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Calls `f(page, start_in_page, len, offset_in_range)` for each page
    /// piece of `[offset, offset + len)`.
    fn pieces(offset: u64, len: u64, mut f: impl FnMut(u64, usize, usize, usize)) {
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let page = pos / PAGE;
            let start = (pos % PAGE) as usize;
            let n = (PAGE - pos % PAGE).min(len - done) as usize;
            f(page, start, n, done as usize);
            done += n as u64;
        }
    }

    fn clear(&self, offset: u64, len: u64) {
        Self::pieces(offset, len, |page, start, n, _| {
            let mut shard = self.shard(page);
            if n as u64 == PAGE {
                shard.remove(&page);
            } else if let Some(p) = shard.get_mut(&page) {
                p[start..start + n].fill(0);
            }
        });
    }

    /// Bytes of memory held by written pages.
    pub fn resident(&self) -> u64 {
        (0..SHARDS)
            .map(|i| self.shard(i as u64).len() as u64 * PAGE)
            .sum()
    }
}

impl Backend for MemBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        Caps {
            trim: true,
            fast_zero: true,
            extents: true,
            rotational: false,
        }
    }

    fn blocking(&self) -> bool {
        false
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        Self::pieces(offset, buf.len() as u64, |page, start, n, at| {
            let out = &mut buf[at..at + n];
            match self.shard(page).get(&page) {
                Some(p) => out.copy_from_slice(&p[start..start + n]),
                None => out.fill(0),
            }
        });
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> io::Result<()> {
        Self::pieces(offset, buf.len() as u64, |page, start, n, at| {
            let mut shard = self.shard(page);
            let p = shard
                .entry(page)
                .or_insert_with(|| Box::new([0u8; PAGE as usize]));
            p[start..start + n].copy_from_slice(&buf[at..at + n]);
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64, _fua: bool) -> io::Result<()> {
        self.clear(offset, len);
        Ok(())
    }

    fn zero(
        &self,
        offset: u64,
        len: u64,
        _may_trim: bool,
        _fast: bool,
        _fua: bool,
    ) -> Result<(), ZeroError> {
        // An absent page reads as zero and is written on demand, so a hole
        // here is as good as allocated zeroes: NO_HOLE needs nothing more.
        self.clear(offset, len);
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let end = offset.saturating_add(len).min(self.size);
        let mut out: Vec<Extent> = Vec::new();
        Self::pieces(offset, end.saturating_sub(offset), |page, _, n, _| {
            let flags = if self.shard(page).contains_key(&page) {
                0
            } else {
                state::HOLE | state::ZERO
            };
            match out.last_mut() {
                Some(last) if last.flags == flags => last.len += n as u64,
                _ => out.push(Extent {
                    len: n as u64,
                    flags,
                }),
            }
        });
        if out.is_empty() {
            out.push(Extent { len: 1, flags: 0 });
        }
        Ok(out)
    }

    fn cache(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritten_memory_reads_as_zero_and_costs_nothing() {
        let m = MemBackend::new(1 << 40);
        let mut buf = vec![1u8; 100];
        m.read_at(&mut buf, 1 << 39).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(m.resident(), 0);
    }

    #[test]
    fn writes_across_pages_read_back() {
        let m = MemBackend::new(1 << 20);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        m.write_at(&data, PAGE - 3, false).unwrap();
        let mut back = vec![0u8; data.len()];
        m.read_at(&mut back, PAGE - 3).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn zeroing_whole_pages_frees_them() {
        let m = MemBackend::new(1 << 20);
        m.write_at(&vec![9u8; 3 * PAGE as usize], 0, false).unwrap();
        assert_eq!(m.resident(), 3 * PAGE);
        m.zero(10, 2 * PAGE, true, false, false).unwrap();
        assert_eq!(m.resident(), 2 * PAGE);
        let mut b = vec![0u8; 3 * PAGE as usize];
        m.read_at(&mut b, 0).unwrap();
        assert!(b[..10].iter().all(|&x| x == 9));
        assert!(b[10..10 + 2 * PAGE as usize].iter().all(|&x| x == 0));
        assert!(b[10 + 2 * PAGE as usize..].iter().all(|&x| x == 9));
    }

    #[test]
    fn extents_merge_runs() {
        let m = MemBackend::new(4 * PAGE);
        m.write_at(&[1], PAGE + 5, false).unwrap();
        let e = m.extents(0, 4 * PAGE).unwrap();
        assert_eq!(
            e,
            vec![
                Extent {
                    len: PAGE,
                    flags: state::HOLE | state::ZERO
                },
                Extent {
                    len: PAGE,
                    flags: 0
                },
                Extent {
                    len: 2 * PAGE,
                    flags: state::HOLE | state::ZERO
                },
            ]
        );
    }
}
