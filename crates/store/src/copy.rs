//! A copy from one range of an export to a range of the same or another
//! export, carried out by the server itself (a SCSI EXTENDED COPY: the
//! clone an initiator would otherwise read and write through its host).
//!
//! Where both exports are files of this host the kernel copies
//! (`copy_file_range`, which shares the blocks on a file system that
//! can reflink and copies them in the page cache otherwise); anywhere
//! else, and where the kernel refuses, the bytes are read and written
//! through the [`exec`]utor in chunks of [`MEMORY_CHUNK`]. Either way each
//! chunk's destination range is held in the destination's range lock as
//! any write's is, so a COMPARE AND WRITE never sees half of a chunk;
//! and what fails is a block error of the executor's kinds, "storage
//! lost" included ([`exec::lost`]), for the front end to answer as for
//! a write.

use std::os::fd::RawFd;
use std::sync::Arc;

use braid_block::{Error, ErrorKind, Flags, Op};
use bytes::Bytes;

use crate::backend::Backend;
use crate::exec::{self, Job};
use crate::export::Export;

/// Most bytes one step of a copy by the kernel holds in the range lock.
pub const CHUNK: u64 = 8 << 20;

/// Most bytes one step of a copy through memory holds: with a command
/// window of 64, a connection's copies hold at most 64 MiB, as its READs
/// may.
pub const MEMORY_CHUNK: u64 = 1 << 20;

/// How a copy went: bytes the kernel copied between files, and bytes
/// read and written through memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    pub in_kernel: u64,
    pub through_memory: u64,
}

/// One end of a copy: an export and a byte offset in it.
#[derive(Clone, Debug)]
pub struct End {
    pub export: Arc<Export>,
    pub offset: u64,
}

/// Copies `len` bytes from `from` to `to`; with `durable` they are on
/// stable storage before it returns. Overlapping ranges of one export
/// end as if every byte had been read before any was written.
///
/// # Errors
///
/// The first storage error (what was copied before it stays copied), or
/// `Invalid` for a range past an export's end.
pub async fn copy(from: &End, to: &End, len: u64, durable: bool) -> Result<Copied, Error> {
    for (end, what) in [(from, "source"), (to, "destination")] {
        if end
            .offset
            .checked_add(len)
            .is_none_or(|e| e > end.export.size())
        {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "copy {what} {}..+{len} is past the end of {}",
                    end.offset, end.export.name
                ),
            ));
        }
    }
    if len == 0 {
        return Ok(Copied::default());
    }
    let same = Arc::ptr_eq(&from.export, &to.export);
    let overlap = same && from.offset < to.offset + len && to.offset < from.offset + len;
    if !overlap {
        if let Some(done) = in_kernel(from, to, len, durable).await {
            return done;
        }
    }
    through_memory(from, to, len, durable).await?;
    Ok(Copied {
        in_kernel: 0,
        through_memory: len,
    })
}

/// The file behind `export`, when it is of this host and the kernel may
/// copy from and to it.
fn file_of(export: &Export) -> Option<(Arc<dyn Backend>, RawFd)> {
    let b = export.storage.backend()?;
    let fd = b.copy_fd()?;
    Some((b.clone(), fd))
}

/// The copy by `copy_file_range`, on a blocking thread; `None` when the
/// exports are not both files of this host, or the kernel refused the
/// first chunk (another kind of file): then nothing was written.
async fn in_kernel(from: &End, to: &End, len: u64, durable: bool) -> Option<Result<Copied, Error>> {
    let (source, src_fd) = file_of(&from.export)?;
    let (destination, dst_fd) = file_of(&to.export)?;
    let writes = to.export.writes.clone();
    let (src_at, dst_at) = (from.offset, to.offset);
    tokio::task::spawn_blocking(move || {
        // Both files stay open while their backends are held.
        let _held = (&source, &destination);
        let mut done = 0u64;
        while done < len {
            let step = (len - done).min(CHUNK);
            let range = writes.shared(dst_at + done, step);
            let moved = copy_range(src_fd, src_at + done, dst_fd, dst_at + done, step);
            drop(range);
            match moved {
                Ok(()) => done += step,
                Err(e) if done == 0 && refused(&e) => return None,
                Err(e) => return Some(Err(exec::error("copy", dst_at + done, &e))),
            }
        }
        if durable {
            if let Err(e) = destination.flush() {
                return Some(Err(exec::error("flush after copy", 0, &e)));
            }
        }
        Some(Ok(Copied {
            in_kernel: len,
            through_memory: 0,
        }))
    })
    .await
    .expect("a copy panicked")
}

/// Errors by which the kernel says it cannot copy between these files
/// (other file systems, other kinds of file), not that the storage
/// failed.
fn refused(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EXDEV | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS | libc::EBADF)
    )
}

/// `len` bytes from `src` at `src_at` to `dst` at `dst_at`, the kernel
/// copying what it will each call.
fn copy_range(src: RawFd, src_at: u64, dst: RawFd, dst_at: u64, len: u64) -> std::io::Result<()> {
    let mut done = 0u64;
    while done < len {
        let mut off_in = (src_at + done) as libc::loff_t;
        let mut off_out = (dst_at + done) as libc::loff_t;
        // SAFETY: both descriptors are open files held by their backends
        // for the whole call; the offsets are locals the kernel updates.
        let n = unsafe {
            libc::copy_file_range(
                src,
                &mut off_in,
                dst,
                &mut off_out,
                (len - done) as usize,
                0,
            )
        };
        match n {
            n if n > 0 => done += n as u64,
            0 => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("copy source ended at {}", src_at + done),
                ))
            }
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// The copy through the executor, a chunk at a time: read whole, then
/// written (with its range locked by the executor). Chunks go from the
/// end when the destination lies after an overlapping source, so no
/// chunk is read after it was overwritten.
async fn through_memory(from: &End, to: &End, len: u64, durable: bool) -> Result<(), Error> {
    let chunks = len.div_ceil(MEMORY_CHUNK);
    let backwards = Arc::ptr_eq(&from.export, &to.export) && to.offset > from.offset;
    for i in 0..chunks {
        let i = if backwards { chunks - 1 - i } else { i };
        let at = i * MEMORY_CHUNK;
        let step = (len - at).min(MEMORY_CHUNK);
        let read = Job::new(Op::Read, from.offset + at, step);
        let done = exec::submit(&from.export, read, None).await?;
        let mut data = Vec::with_capacity(step as usize);
        for (_, piece) in done.data {
            data.extend_from_slice(&piece);
        }
        if data.len() as u64 != step {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "copy: {} gave {} bytes at offset {} where {step} were asked",
                    from.export.name,
                    data.len(),
                    from.offset + at
                ),
            ));
        }
        let mut write = Job::new(Op::Write, to.offset + at, step);
        if durable {
            write = write.with(Flags::FUA);
        }
        exec::submit(&to.export, write, Some(Bytes::from(data))).await?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "copy_tests.rs"]
mod tests;
