//! Either end of a copy: a local file or device, or a multipath volume,
//! behind one small set of async operations.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use braid_initiator::Volume;
use braid_proto::TransmissionFlags;
use bytes::{Bytes, BytesMut};

/// One end of a copy.
#[derive(Clone)]
pub enum Side {
    File {
        file: Arc<File>,
        path: PathBuf,
        size: u64,
        block_device: bool,
    },
    Volume(Arc<Volume>),
}

impl Side {
    /// Opens a local file or device for reading.
    pub fn open_source(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        Self::from_file(file, path)
    }

    /// Opens (or creates) a local destination of `size` bytes. A regular
    /// file is emptied first, so regions the copy skips are holes.
    pub fn open_dest(path: &Path, size: u64) -> Result<Self> {
        let meta = std::fs::metadata(path).ok();
        let is_dev = meta
            .as_ref()
            .is_some_and(|m| m.file_type().is_block_device());
        let file = std::fs::OpenOptions::new()
            .write(true)
            .read(true)
            .create(!is_dev)
            .truncate(!is_dev)
            .open(path)
            .with_context(|| format!("opening {} for writing", path.display()))?;
        if !is_dev {
            file.set_len(size)
                .with_context(|| format!("sizing {}", path.display()))?;
        }
        let side = Self::from_file(file, path)?;
        if side.size() < size {
            bail!(
                "{} holds {} bytes, less than the {size} to copy",
                path.display(),
                side.size()
            );
        }
        Ok(side)
    }

    fn from_file(file: File, path: &Path) -> Result<Self> {
        use std::io::{Seek, SeekFrom};
        let meta = file.metadata()?;
        let block_device = meta.file_type().is_block_device();
        if !block_device && !meta.is_file() {
            bail!("{}: not a regular file or block device", path.display());
        }
        let mut f = file;
        let size = f.seek(SeekFrom::End(0))?;
        Ok(Self::File {
            file: Arc::new(f),
            path: path.to_owned(),
            size,
            block_device,
        })
    }

    pub fn size(&self) -> u64 {
        match self {
            Self::File { size, .. } => *size,
            Self::Volume(v) => v.info().size,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Self::File { path, .. } => path.display().to_string(),
            Self::Volume(v) => format!("{} volume {:?}", v.info().transport, v.info().export),
        }
    }

    /// Reads `len` bytes at `offset` as pieces in order: a volume's reply
    /// may come in several (one per path), and joining them would copy
    /// every byte once more.
    pub async fn read(&self, offset: u64, len: usize) -> Result<Vec<Bytes>> {
        match self {
            Self::File { file, .. } => {
                let file = file.clone();
                tokio::task::spawn_blocking(move || {
                    let mut buf = BytesMut::zeroed(len);
                    file.read_exact_at(&mut buf, offset)?;
                    Ok::<_, std::io::Error>(vec![buf.freeze()])
                })
                .await?
                .with_context(|| format!("reading {len} bytes at {offset}"))
            }
            Self::Volume(v) => {
                let pieces = v
                    .read(offset, len as u64)
                    .await
                    .with_context(|| format!("reading {len} bytes at {offset}"))?;
                Ok(pieces.into_iter().map(|(_, b)| b).collect())
            }
        }
    }

    /// Writes `pieces`, in order, from `offset`.
    pub async fn write(&self, offset: u64, pieces: Vec<Bytes>) -> Result<()> {
        let len: usize = pieces.iter().map(Bytes::len).sum();
        let done: Result<()> = match self {
            Self::File { file, .. } => {
                let file = file.clone();
                tokio::task::spawn_blocking(move || pwrite_all(&file, &pieces, offset))
                    .await?
                    .map_err(Into::into)
            }
            Self::Volume(v) => {
                let data = concat(pieces.into_iter().map(|b| (0, b)).collect(), len);
                write_volume(v, offset, data).await
            }
        };
        done.with_context(|| format!("writing {len} bytes at {offset}"))
    }

    /// Makes a range read as zero, cheaply where possible. Returns `false`
    /// if nothing needed doing (a fresh file's hole).
    pub async fn zero(&self, offset: u64, len: u64, fresh: bool) -> Result<bool> {
        match self {
            Self::File {
                block_device: false,
                ..
            } if fresh => Ok(false),
            Self::File { file, .. } => {
                let file = file.clone();
                tokio::task::spawn_blocking(move || punch_or_write(&file, offset, len)).await??;
                Ok(true)
            }
            Self::Volume(v) => {
                if v.info().flags.has(TransmissionFlags::SEND_WRITE_ZEROES) {
                    v.write_zeroes(offset, len, true).await?;
                } else {
                    let mut at = 0;
                    while at < len {
                        let n = (len - at).min(1 << 20);
                        write_volume(v, offset + at, Bytes::from(vec![0u8; n as usize])).await?;
                        at += n;
                    }
                }
                Ok(true)
            }
        }
    }

    /// Whether `[offset, offset+len)` is known to read as zeroes.
    pub async fn known_zero(&self, offset: u64, len: u64) -> bool {
        match self {
            Self::File {
                file,
                block_device: false,
                ..
            } => {
                let file = file.clone();
                tokio::task::spawn_blocking(move || hole_covers(&file, offset, len))
                    .await
                    .unwrap_or(false)
            }
            Self::File { .. } => false,
            Self::Volume(v) => {
                // A server without base:allocation fails the query: then
                // nothing is known, and the data is copied.
                match v.block_status(offset, len).await {
                    Ok(extents) => {
                        let mut covered = 0u64;
                        for e in extents {
                            if !e.zero {
                                return false;
                            }
                            covered += e.len;
                            if covered >= len {
                                return true;
                            }
                        }
                        false
                    }
                    Err(_) => false,
                }
            }
        }
    }

    pub async fn flush(&self) -> Result<()> {
        match self {
            Self::File { file, .. } => {
                let file = file.clone();
                tokio::task::spawn_blocking(move || file.sync_all()).await??;
                Ok(())
            }
            Self::Volume(v) => Ok(v.flush().await?),
        }
    }
}

/// Writes `data` at `offset` on a volume. Where its ends are not whole
/// blocks of the target (a file whose size is not), the blocks are
/// completed with what the volume holds: read, merged, written whole.
/// That is safe only while nothing else writes those blocks, as in a copy,
/// whose pieces never overlap.
async fn write_volume(v: &Volume, offset: u64, data: Bytes) -> Result<()> {
    let block = u64::from(v.info().min_block.max(1));
    let end = offset + data.len() as u64;
    if offset.is_multiple_of(block) && end.is_multiple_of(block) {
        return Ok(v.write(offset, data, false).await?);
    }
    let start = offset / block * block;
    let whole = end.div_ceil(block) * block;
    let held = v.read(start, whole - start).await?;
    let mut buf = BytesMut::from(&concat(held, (whole - start) as usize)[..]);
    buf[(offset - start) as usize..(end - start) as usize].copy_from_slice(&data);
    Ok(v.write(start, buf.freeze(), false).await?)
}

/// Joins read pieces into one buffer (one piece is returned as is).
pub fn concat(mut pieces: Vec<(u64, Bytes)>, len: usize) -> Bytes {
    if pieces.len() == 1 {
        return pieces.pop().expect("one piece").1;
    }
    let mut buf = BytesMut::with_capacity(len);
    for (_, b) in pieces {
        buf.extend_from_slice(&b);
    }
    buf.freeze()
}

/// Writes every byte of `pieces` at `offset` with as few `pwritev` calls
/// as the kernel allows.
fn pwrite_all(file: &File, pieces: &[Bytes], mut offset: u64) -> std::io::Result<()> {
    let parts: Vec<&[u8]> = pieces.iter().map(|b| &b[..]).collect();
    let mut at = braid_pool::Progress::new(&parts);
    while !at.done(&parts) {
        let iov: Vec<libc::iovec> = at
            .pending(&parts)
            .map(|p| libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            })
            .collect();
        // SAFETY: every iovec points into a piece borrowed for the call.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                offset as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        at.advance(&parts, n as usize);
        offset += n as u64;
    }
    Ok(())
}

fn hole_covers(file: &File, offset: u64, len: u64) -> bool {
    // SAFETY: lseek only reads its integer arguments on an open fd.
    let data = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, libc::SEEK_DATA) };
    if data < 0 {
        // ENXIO: no data after offset — all hole.
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
    }
    data as u64 >= offset + len
}

fn punch_or_write(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: fallocate only reads its integer arguments on an open fd.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let zeroes = vec![0u8; len.min(1 << 20) as usize];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(zeroes.len() as u64) as usize;
        file.write_all_at(&zeroes[..n], offset + at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pwrite_all_writes_every_piece_in_order() {
        // More pieces than one pwritev takes, of uneven and empty sizes.
        let pieces: Vec<Bytes> = (0..3000u32)
            .map(|i| {
                let n = (i % 7) as usize * 3;
                Bytes::from(
                    (0..n)
                        .map(|k| (i as usize * 31 + k) as u8)
                        .collect::<Vec<u8>>(),
                )
            })
            .collect();
        let want: Vec<u8> = pieces.iter().flat_map(|b| b.iter().copied()).collect();
        let file = tempfile::tempfile().unwrap();
        pwrite_all(&file, &pieces, 5).unwrap();
        let mut got = vec![0u8; want.len() + 5];
        file.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(&got[..5], &[0; 5]);
        assert!(got[5..] == want[..], "bytes differ");
        assert_eq!(file.metadata().unwrap().len(), want.len() as u64 + 5);
    }
}
