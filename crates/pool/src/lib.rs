//! Reusable I/O buffers.
//!
//! Every READ reply and WRITE payload needs a buffer of up to 32 MiB. Fresh
//! allocations of that size come from `mmap`: each one page-faults, the
//! kernel zeroes every page, and freeing hands the pages back — measured at
//! a quarter of the target's CPU time on loopback. Buffers here are kept by
//! size class (powers of two) and handed out again, already mapped.
//!
//! A [`Buf`] returns to its pool when dropped, and so does a [`Bytes`] made
//! from one with [`Buf::into_bytes`], whenever its last clone goes.
//! [`write_all_vectored`] sends many of them (headers and data) in as few
//! system calls as the socket allows, each no larger than the connection's
//! [`Pace`] suggests; [`next_batch`] gathers what a writer's queue holds
//! into one such write.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;

mod pace;
mod pipe;
pub use pace::{Pace, MIN_SLICE};
pub use pipe::{PipeFill, Piped, PIPES, PIPE_MAX};

/// The smallest class: 4 KiB.
const MIN_SHIFT: u32 = 12;
/// The largest pooled class: 32 MiB; larger buffers are not kept.
const MAX_SHIFT: u32 = 25;
/// Each class keeps at most this many bytes idle. `braid attach`'s replay
/// window lets 32 MiB of writes go at once when the engine's own FLUSH is
/// answered, while the writes sent meanwhile still hold theirs: a class
/// that kept less (it kept 16 MiB) freed half of what the window let go,
/// and the next writes took fresh buffers that `calloc` zeroed (7% of
/// attach's samples under 1 MiB writes, gone at 64 MiB).
const KEEP_BYTES: usize = 64 << 20;
/// Every class together keeps at most this much idle...
const KEEP_TOTAL: usize = 128 << 20;
/// ...but each always has room for a few buffers.
const KEEP_MIN: usize = 2;

/// Buffers by size class.
pub struct Pool {
    classes: Vec<Mutex<Vec<Vec<u8>>>>,
    /// Bytes idle in every class (updated under each class's lock, so
    /// classes filling at once may pass [`KEEP_TOTAL`] by a buffer each).
    idle: AtomicUsize,
}

impl Pool {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            classes: (MIN_SHIFT..=MAX_SHIFT)
                .map(|_| Mutex::new(Vec::new()))
                .collect(),
            idle: AtomicUsize::new(0),
        })
    }

    /// The process-wide pool.
    pub fn global() -> &'static Arc<Pool> {
        static POOL: OnceLock<Arc<Pool>> = OnceLock::new();
        POOL.get_or_init(Pool::new)
    }

    fn class(len: usize) -> Option<usize> {
        let shift = len
            .max(1)
            .next_power_of_two()
            .trailing_zeros()
            .max(MIN_SHIFT);
        (shift <= MAX_SHIFT).then(|| (shift - MIN_SHIFT) as usize)
    }

    /// The memory a buffer of `len` bytes from the pool keeps alive: its
    /// size class, or `len` itself past the largest class. What a slice of
    /// such a buffer pins, for those who keep slices (the replay window).
    pub fn pinned(len: usize) -> u64 {
        match Self::class(len) {
            Some(class) => 1u64 << (class as u32 + MIN_SHIFT),
            None => len as u64,
        }
    }

    /// A buffer of `len` bytes. Its contents are whatever it held before
    /// (zeroes when new): callers overwrite what they use.
    pub fn get(self: &Arc<Self>, len: usize) -> Buf {
        let Some(class) = Self::class(len) else {
            return Buf {
                data: vec![0; len],
                len,
                pool: None,
            };
        };
        let reused = self.classes[class]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        if let Some(d) = &reused {
            self.idle.fetch_sub(d.len(), Ordering::Relaxed);
        }
        let data = reused.unwrap_or_else(|| vec![0; 1 << (class as u32 + MIN_SHIFT)]);
        Buf {
            data,
            len,
            pool: Some(self.clone()),
        }
    }

    fn put(&self, data: Vec<u8>) {
        let Some(class) = Self::class(data.len()) else {
            return;
        };
        if data.len() != 1 << (class as u32 + MIN_SHIFT) {
            return;
        }
        let keep = (KEEP_BYTES / data.len()).max(KEEP_MIN);
        let mut list = self.classes[class]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let room = self.idle.load(Ordering::Relaxed) + data.len() <= KEEP_TOTAL;
        if list.len() < KEEP_MIN || (list.len() < keep && room) {
            self.idle.fetch_add(data.len(), Ordering::Relaxed);
            list.push(data);
        }
    }

    /// Buffers kept idle, in bytes (for tests and figures).
    pub fn idle_bytes(&self) -> usize {
        self.classes
            .iter()
            .map(|c| {
                c.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .map(Vec::len)
                    .sum::<usize>()
            })
            .sum()
    }
}

/// A buffer from a [`Pool`]; back to it when dropped.
pub struct Buf {
    data: Vec<u8>,
    len: usize,
    pool: Option<Arc<Pool>>,
}

impl Buf {
    /// Shortens the buffer (the memory stays with it).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Shares the buffer as `Bytes`; it returns to the pool once the last
    /// clone is dropped.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data[..self.len]
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.data[..self.len]
    }
}

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for Buf {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.put(std::mem::take(&mut self.data));
        }
    }
}

/// The most slices one `writev` takes (Linux's `IOV_MAX`).
pub const IOV_MAX: usize = 1024;

/// How far a vectored write of a list of slices has got: which slice, and
/// how far into it. Every loop that writes a list of slices in as few calls
/// as the kernel takes keeps one of these.
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    idx: usize,
    off: usize,
}

impl Progress {
    /// At the first byte of `parts`.
    #[must_use]
    pub fn new(parts: &[&[u8]]) -> Self {
        let mut p = Self::default();
        p.skip_ended(parts);
        p
    }

    /// Every byte of `parts` is written.
    #[must_use]
    pub fn done(&self, parts: &[&[u8]]) -> bool {
        self.idx >= parts.len()
    }

    /// What is left to write, at most [`IOV_MAX`] slices.
    pub fn pending<'a, 'p>(&self, parts: &'p [&'a [u8]]) -> impl Iterator<Item = &'a [u8]> + 'p {
        std::iter::once(&parts[self.idx][self.off..])
            .chain(parts[self.idx + 1..].iter().copied())
            .take(IOV_MAX)
    }

    /// Like [`pending`](Self::pending), but at most `max` bytes in all
    /// (the last slice cut short).
    pub fn pending_upto<'a, 'p>(
        &self,
        parts: &'p [&'a [u8]],
        max: usize,
    ) -> impl Iterator<Item = &'a [u8]> + 'p {
        let mut left = max;
        self.pending(parts).map_while(move |p| {
            (left > 0).then(|| {
                let take = p.len().min(left);
                left -= take;
                &p[..take]
            })
        })
    }

    /// Moves past `n` bytes the kernel took.
    pub fn advance(&mut self, parts: &[&[u8]], mut n: usize) {
        while n > 0 {
            let left = parts[self.idx].len() - self.off;
            if n < left {
                self.off += n;
                break;
            }
            n -= left;
            self.idx += 1;
            self.off = 0;
        }
        self.skip_ended(parts);
    }

    fn skip_ended(&mut self, parts: &[&[u8]]) {
        while self.idx < parts.len() && parts[self.idx].len() == self.off {
            self.idx += 1;
            self.off = 0;
        }
    }
}

/// The most messages a writer takes from its queue for one batch.
pub const BATCH: usize = 64;

/// Waits for the next message and takes every other one already waiting
/// (up to [`BATCH`] in `batch`), so that they go out in the same system
/// call. `false` once the queue is closed and empty.
pub async fn next_batch<T>(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>,
    batch: &mut Vec<T>,
) -> bool {
    let Some(first) = rx.recv().await else {
        return false;
    };
    batch.push(first);
    while batch.len() < BATCH {
        match rx.try_recv() {
            Ok(out) => batch.push(out),
            Err(_) => break,
        }
    }
    true
}

/// Writes every slice in order, in as few `writev` calls as the socket and
/// `pace` allow, then flushes; the time taken is recorded in `pace`.
///
/// The flush matters for writers that buffer: TLS accepts plaintext into
/// its own records and, when the socket is full, returns before they are
/// sent; without a flush the last replies of a burst would wait for a next
/// write that never comes. On a bare socket it costs nothing.
///
/// Unlike the target's reply writer, it does not yield its worker between
/// slices. Tried for the initiator's requests: on 2 x 1gbit under the
/// lab's `--shaping frames`, with both CPUs busy, 1 MiB writes at queue
/// depth 1 fell from 204-221 to 175-178 MB/s (alternating runs).
///
/// # Errors
///
/// The writer's error, or `WriteZero` if it stops accepting bytes.
pub async fn write_all_vectored<W: tokio::io::AsyncWrite + Unpin>(
    wr: &mut W,
    parts: &[&[u8]],
    pace: &mut Pace,
    stall: Option<std::time::Duration>,
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let start = std::time::Instant::now();
    let mut at = Progress::new(parts);
    let mut sent = 0;
    while !at.done(parts) {
        let slices: Vec<std::io::IoSlice<'_>> = at
            .pending_upto(parts, pace.slice())
            .map(std::io::IoSlice::new)
            .collect();
        let n = taken_within(stall, wr.write_vectored(&slices)).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        at.advance(parts, n);
        sent += n;
    }
    taken_within(stall, wr.flush()).await?;
    pace.record(sent, start.elapsed());
    Ok(())
}

/// Awaits one step of sending (a socket becoming writable, one write)
/// for at most `stall`: a peer that takes none of what is sent for that
/// long gets `TimedOut`, so that its connection is closed and what it
/// held is freed rather than held for as long as it stays connected.
///
/// # Errors
///
/// The step's own error, or `TimedOut` naming the stall.
pub async fn taken_within<T>(
    stall: Option<std::time::Duration>,
    step: impl std::future::Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    let Some(limit) = stall else {
        return step.await;
    };
    tokio::time::timeout(limit, step).await.unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the peer took nothing that was sent to it for {limit:?} (--send-timeout)"),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_buffer_pins_is_its_size_class() {
        assert_eq!(Pool::pinned(1), 4096);
        assert_eq!(Pool::pinned(4096), 4096);
        assert_eq!(Pool::pinned(4097), 8192);
        assert_eq!(Pool::pinned(600 << 10), 1 << 20);
        assert_eq!(Pool::pinned((32 << 20) + 1), (32 << 20) + 1);
        let b = Pool::new().get(600 << 10);
        assert_eq!(b.data.capacity() as u64, Pool::pinned(600 << 10));
    }

    #[test]
    fn buffers_come_back_and_are_reused() {
        let pool = Pool::new();
        let mut a = pool.get(300_000);
        assert_eq!(a.len(), 300_000);
        a[0] = 7;
        let ptr = a.as_ptr();
        drop(a);
        assert_eq!(pool.idle_bytes(), 512 * 1024);
        let b = pool.get(262_145);
        assert_eq!(b.as_ptr(), ptr, "the same memory again");
        assert_eq!(pool.idle_bytes(), 0);
        let bytes = b.into_bytes();
        let clone = bytes.clone();
        drop(bytes);
        assert_eq!(pool.idle_bytes(), 0, "a clone still holds it");
        drop(clone);
        assert_eq!(pool.idle_bytes(), 512 * 1024);
    }

    /// A writer that takes at most `max` bytes per call and remembers what
    /// each call offered.
    struct Recorder {
        max: usize,
        data: Vec<u8>,
        offered: Vec<usize>,
    }

    impl Recorder {
        fn new(max: usize) -> Self {
            Self {
                max,
                data: Vec::new(),
                offered: Vec::new(),
            }
        }
    }

    impl tokio::io::AsyncWrite for Recorder {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[std::io::IoSlice::new(buf)])
        }
        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.offered.push(bufs.iter().map(|b| b.len()).sum());
            let mut n = 0;
            for b in bufs {
                let take = (self.max - n).min(b.len());
                self.data.extend_from_slice(&b[..take]);
                n += take;
                if n == self.max {
                    break;
                }
            }
            std::task::Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn vectored_writes_survive_partial_writes_and_empty_parts() {
        let parts: Vec<&[u8]> = vec![b"", b"header", b"", b"some data here", b"x", b""];
        let mut w = Recorder::new(7);
        write_all_vectored(&mut w, &parts, &mut Pace::new(), None)
            .await
            .unwrap();
        assert_eq!(w.data, b"headersome data herex");
        let mut w = Recorder::new(7);
        write_all_vectored(&mut w, &[b"", b""], &mut Pace::new(), None)
            .await
            .unwrap();
        assert!(w.data.is_empty());
    }

    #[tokio::test]
    async fn a_measured_pace_cuts_writes_into_slices() {
        let parts: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 100_000]).collect();
        let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        let mut w = Recorder::new(usize::MAX);
        write_all_vectored(&mut w, &refs, &mut Pace::new(), None)
            .await
            .unwrap();
        assert_eq!(w.offered, [300_000], "unmeasured: one call");

        // 100 MB/s: half a millisecond is less than the smallest slice.
        let mut pace = Pace::new();
        pace.record(2_000_000, std::time::Duration::from_millis(20));
        let mut w = Recorder::new(usize::MAX);
        write_all_vectored(&mut w, &refs, &mut pace, None)
            .await
            .unwrap();
        assert_eq!(w.data, parts.concat());
        assert_eq!(w.offered.len(), 300_000usize.div_ceil(MIN_SLICE));
        assert!(w.offered.iter().all(|&n| n <= MIN_SLICE), "{:?}", w.offered);
    }

    #[tokio::test]
    async fn vectored_writes_reach_past_a_buffering_writer() {
        // A writer that holds bytes back until flushed, as TLS does when
        // the socket is full.
        let mut w = tokio::io::BufWriter::with_capacity(1024, Vec::new());
        write_all_vectored(&mut w, &[b"head", b"tail"], &mut Pace::new(), None)
            .await
            .unwrap();
        assert_eq!(w.get_ref(), b"headtail");
    }

    #[test]
    fn idle_memory_is_bounded_and_huge_buffers_are_not_kept() {
        let pool = Pool::new();
        let many: Vec<Buf> = (0..100).map(|_| pool.get(1 << 20)).collect();
        drop(many);
        assert_eq!(pool.idle_bytes(), KEEP_BYTES);
        let huge = pool.get(64 << 20);
        assert_eq!(huge.len(), 64 << 20);
        drop(huge);
        assert_eq!(pool.idle_bytes(), KEEP_BYTES);
        let tiny = pool.get(1);
        assert_eq!(tiny.len(), 1);
    }

    #[test]
    fn every_class_together_keeps_at_most_the_total_but_each_keeps_a_few() {
        let pool = Pool::new();
        for shift in [20, 21, 22] {
            let many: Vec<Buf> = (0..100).map(|_| pool.get(1 << shift)).collect();
            drop(many);
        }
        // 64 MiB of 1 MiB buffers, 64 of 2 MiB, and of 4 MiB only the few
        // every class keeps.
        assert_eq!(pool.idle_bytes(), KEEP_TOTAL + KEEP_MIN * (4 << 20));
        let again: Vec<Buf> = (0..10).map(|_| pool.get(1 << 21)).collect();
        assert_eq!(
            pool.idle_bytes(),
            KEEP_TOTAL + KEEP_MIN * (4 << 20) - (20 << 20)
        );
        // Back, they fill the total again, which the few 4 MiB ones now
        // share: some of the ten are freed.
        drop(again);
        assert_eq!(pool.idle_bytes(), KEEP_TOTAL);
    }
}
