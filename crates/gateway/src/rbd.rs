//! An RBD image as a backend (`NAME=rbd:POOL/[NAMESPACE/]IMAGE[@SNAP]`), through
//! librbd with its cache off: a write is acknowledged once the OSDs have
//! it, so FLUSH and FUA have nothing left to do and a gateway's death
//! loses nothing it acknowledged. (With `--rbd-cache` a FUA write and a
//! FLUSH write the cache back first.)
//!
//! The image handle belongs to the gateway's current RADOS incarnation
//! (`gateway::RbdVolume`); a call that finds the client blocklisted fails
//! with `ESHUTDOWN`, which the connection answers by closing (see
//! [`Backend`]), while the gateway reconnects. Every write is checked
//! against the image's size as it is now (`resize.rs`).

use std::io;

use braid_pool::Buf;

use crate::RbdVolume;
use braid_store::backend::{Backend, Caps, Done, Extent, ZeroError};

/// BLOCK_STATUS looks at most this far per request: the spec lets a
/// server answer less than asked, and without an object map every 4 MiB
/// object costs the OSDs a lookup.
const MAX_STATUS: u64 = 256 << 20;

impl Backend for RbdVolume {
    fn size(&self) -> u64 {
        self.size.get()
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
        true
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(self.image().read(buf, offset))
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.within(offset, buf.len() as u64)?;
        let _inflight = self.begin_write()?;
        self.before_write()?;
        let image = self.image();
        self.check(image.write(buf, offset))?;
        if fua && self.ceph.caches() {
            self.check(image.flush())?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.check(self.image().flush())
    }

    fn compares_and_writes(&self) -> bool {
        true
    }

    fn compare_and_write(
        &self,
        cmp: &[u8],
        data: &[u8],
        offset: u64,
        fua: bool,
    ) -> io::Result<Option<u64>> {
        // One operation on the object's OSD (librbd's compare-and-write),
        // which every gateway's writes of the object go through: atomic
        // across gateways, where this gateway's range lock is not.
        self.within(offset, cmp.len() as u64)?;
        let _inflight = self.begin_write()?;
        self.before_write()?;
        let image = self.image();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        image.aio_compare_and_write(offset, cmp.to_vec(), data.to_vec(), move |r| {
            let _ = tx.send(r);
        });
        let r = rx.recv().map_err(|_| {
            io::Error::other("compare and write: librbd dropped the request unanswered")
        })?;
        let outcome = self.check(r)?;
        if outcome.is_none() && fua && self.ceph.caches() {
            self.check(image.flush())?;
        }
        Ok(outcome)
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        // write_zeroes, not discard: librbd's discard leaves whatever is
        // under its 64 KiB granularity (and the partial ends of a larger
        // range) as it was, yet the unit tells iSCSI initiators that
        // unmapped blocks read as zeroes (LBPRZ) at a granularity of one
        // block, which they rely on to zero by UNMAP. write_zeroes
        // deallocates the whole objects in the range as discard does and
        // writes zeroes over the rest.
        self.within(offset, len)?;
        let _inflight = self.begin_write()?;
        self.before_write()?;
        let image = self.image();
        self.check(image.write_zeroes(offset, len))?;
        if fua && self.ceph.caches() {
            self.check(image.flush())?;
        }
        Ok(())
    }

    fn zero(
        &self,
        offset: u64,
        len: u64,
        _may_trim: bool,
        _fast: bool,
        fua: bool,
    ) -> Result<(), ZeroError> {
        // write_zeroes, never discard: a discard under 64 KiB leaves the
        // old data readable. librbd deallocates whole objects and writes
        // zeroes only over partial ones, so it is fast either way.
        self.within(offset, len)?;
        let _inflight = self.begin_write()?;
        self.before_write()?;
        let image = self.image();
        self.check(image.write_zeroes(offset, len))?;
        if fua && self.ceph.caches() {
            self.check(image.flush())?;
        }
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let end = offset
            .saturating_add(len.min(MAX_STATUS))
            .min(self.size.get());
        if offset >= end {
            return Ok(vec![Extent::data(1)]);
        }
        let mut found: Vec<(u64, u64)> = Vec::new();
        self.check(
            self.image()
                .allocated(offset, end - offset, self.fast_diff, |o, l| {
                    found.push((o, l));
                }),
        )?;
        Ok(runs(offset, end, &found))
    }

    fn cache(&self, _offset: u64, _len: u64) -> io::Result<()> {
        // Nothing is cached here to warm.
        Ok(())
    }

    fn can_start_read(&self) -> bool {
        true
    }

    fn can_start_write(&self, fua: bool) -> bool {
        // A write that must wait (for the newest OSD map, or a cache
        // flush after it) goes the synchronous way, on a blocking thread.
        !(fua && self.ceph.caches()) && self.write_ready_now()
    }

    fn start_read(&self, buf: Buf, offset: u64, done: Done) -> Result<(), (Buf, Done)> {
        let check = self.checker();
        self.image()
            .aio_read(offset, buf, move |b, r| done(b, check(r)));
        Ok(())
    }

    fn start_write(&self, buf: Buf, offset: u64, fua: bool, done: Done) -> Result<(), (Buf, Done)> {
        if !self.can_start_write(fua) || !self.within_now(offset, buf.len() as u64) {
            return Err((buf, done));
        }
        let Some(inflight) = self.begin_write_now() else {
            return Err((buf, done));
        };
        let check = self.checker();
        self.image().aio_write(offset, buf, move |b, r| {
            // In flight until the OSDs answered (see gateway/writes.rs).
            drop(inflight);
            done(b, check(r));
        });
        Ok(())
    }
}

/// `[offset, end)` as data where `found` says so, holes (reading as
/// zeroes) between. `found` is in order and may overlap or run past.
fn runs(offset: u64, end: u64, found: &[(u64, u64)]) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    let mut push = |e: Extent| {
        if e.len == 0 {
            return;
        }
        match out.last_mut() {
            Some(last) if (last.hole, last.zero) == (e.hole, e.zero) => last.len += e.len,
            _ => out.push(e),
        }
    };
    let mut pos = offset;
    for &(o, l) in found {
        let (start, stop) = (o.max(pos), o.saturating_add(l).min(end));
        if stop <= start {
            continue;
        }
        push(Extent::unallocated(start - pos));
        push(Extent::data(stop - start));
        pos = stop;
    }
    push(Extent::unallocated(end - pos));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_becomes_data_and_holes() {
        let (data, hole) = (Extent::data, Extent::unallocated);
        assert_eq!(runs(0, 100, &[]), vec![hole(100)]);
        assert_eq!(
            runs(10, 100, &[(0, 20), (20, 10), (50, 500)]),
            vec![data(20), hole(20), data(50)]
        );
        assert_eq!(runs(0, 10, &[(0, 10)]), vec![data(10)]);
    }
}
