//! A regular file or a block device as a backend, and sparse memory
//! (`mem:SIZE`) as an anonymous in-memory file.
//!
//! Data moves with `pread`/`pwrite`; holes are punched and allocation is
//! read with `fallocate` and `lseek(SEEK_DATA/SEEK_HOLE)` where the file
//! system supports them, and the backend falls back to plain writes where
//! it does not.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};

use super::durable::Durability;
use super::{Backend, Caps, Extent, ZeroError};

/// At most this many extents per BLOCK_STATUS answer: the spec lets a
/// server answer less than asked, and clients ask again from where it ends.
const MAX_EXTENTS: usize = 4096;

/// A file or block device, opened once and shared by every connection.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    path: PathBuf,
    size: u64,
    block_device: bool,
    rotational: bool,
    /// `preadv2(RWF_NOWAIT)` is not supported for this file.
    no_nowait: std::sync::atomic::AtomicBool,
    /// The file lives in memory (tmpfs, ramfs): calls never wait for a disk.
    in_memory: bool,
    durability: Durability,
}

impl FileBackend {
    /// Opens `path` for reading, and for writing unless `read_only`.
    ///
    /// # Errors
    ///
    /// The OS error from opening or sizing the file, with its path in the
    /// message.
    pub fn open(path: &Path, read_only: bool) -> io::Result<Self> {
        // A block device is claimed as it is opened (O_EXCL), a file by a
        // lock right after (see lock.rs).
        let device = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
        let mut options = OpenOptions::new();
        options.read(true).write(!read_only);
        if device && !read_only {
            std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_EXCL);
        }
        let mut file = options.open(path).map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) if device => super::lock::device_busy(path, &e),
            _ => io::Error::new(e.kind(), format!("{}: {e}", path.display())),
        })?;
        let meta = file.metadata()?;
        let block_device = meta.file_type().is_block_device();
        if meta.is_file() {
            super::lock::lock_file(&file, path, read_only)?;
        }
        if !block_device && !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a regular file or block device", path.display()),
            ));
        }
        // Works for block devices too, where metadata().len() is 0.
        let size = file.seek(SeekFrom::End(0))?;
        let rotational = block_device && rotational(path);
        let in_memory = !block_device && in_memory(&file);
        Ok(Self {
            file,
            path: path.to_owned(),
            size,
            block_device,
            rotational,
            no_nowait: std::sync::atomic::AtomicBool::new(false),
            in_memory,
            durability: Durability::default(),
        })
    }

    /// A sparse volume of `size` bytes in memory (`mem:SIZE`), for demos,
    /// tests and benchmarks.
    ///
    /// An anonymous in-memory file (`memfd_create`) rather than a map of
    /// pages, so memory has everything a file on tmpfs has: pages are taken
    /// as they are written and given back when trimmed or zeroed, extents
    /// come from `SEEK_DATA`, and READ data goes to the socket with
    /// `sendfile` instead of being copied through a buffer first. That copy
    /// is what a 1 MiB read at queue depth 1 waited for before its first
    /// byte left (2 x 1gbit lab: 227 MB/s copied, 235 MB/s sent from the
    /// file, the link's limit).
    ///
    /// # Errors
    ///
    /// The OS error from `memfd_create` or from sizing the file.
    pub fn memory(size: u64) -> io::Result<Self> {
        // SAFETY: a NUL-terminated name and flags; the result is checked.
        let fd = unsafe { libc::memfd_create(c"braid-mem".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size)?;
        Ok(Self {
            file,
            path: PathBuf::from(format!("mem:{size}")),
            size,
            block_device: false,
            rotational: false,
            no_nowait: std::sync::atomic::AtomicBool::new(false),
            in_memory: true,
            durability: Durability::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of storage the data takes up; holes take none.
    ///
    /// # Errors
    ///
    /// The OS error from `fstat`.
    pub fn allocated(&self) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        // st_blocks counts 512-byte units whatever the file system's block.
        Ok(self.file.metadata()?.blocks() * 512)
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: fallocate only reads its integer arguments; the fd is
        // owned by self.file and open for the call's duration.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn lseek(&self, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
        // SAFETY: as above; lseek moves the shared offset, which this
        // backend never uses (all data moves by pread/pwrite).
        let rc = unsafe { libc::lseek(self.file.as_raw_fd(), offset as libc::off_t, whence) };
        if rc >= 0 {
            return Ok(Some(rc as u64));
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(err)
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let zeroes = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeroes.len() as u64) as usize;
            self.file.write_all_at(&zeroes[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
}

fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL) | Some(libc::ENODEV)
    )
}

/// Whether the file is on tmpfs or ramfs, where reads and writes are
/// memory copies and handing them to a blocking thread costs more than
/// doing them.
fn in_memory(file: &File) -> bool {
    const TMPFS_MAGIC: libc::__fsword_t = 0x0102_1994;
    const RAMFS_MAGIC: libc::__fsword_t = 0x8584_58f6;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fstatfs fills the struct on success; it is read only then.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), st.as_mut_ptr()) };
    if rc != 0 {
        return false;
    }
    // SAFETY: rc == 0, so the struct was filled.
    let kind = unsafe { st.assume_init() }.f_type;
    kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
}

/// Reads `/sys/class/block/<dev>/queue/rotational` for a device node.
fn rotational(path: &Path) -> bool {
    let Ok(real) = std::fs::canonicalize(path) else {
        return false;
    };
    let Some(name) = real.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    std::fs::read_to_string(format!("/sys/class/block/{name}/queue/rotational"))
        .map(|s| s.trim() == "1")
        .unwrap_or(false)
}

impl Backend for FileBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        Caps {
            trim: true,
            fast_zero: true,
            extents: !self.block_device,
            rotational: self.rotational,
        }
    }

    fn blocking(&self) -> bool {
        !self.in_memory
    }

    fn zero_copy_fd(&self) -> Option<std::os::fd::RawFd> {
        // Only in memory: sendfile from a disk file would wait for the disk
        // on the writer's task, and a read error after the reply header
        // could only end the connection.
        self.in_memory.then(|| self.file.as_raw_fd())
    }

    fn copy_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.file.as_raw_fd())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn try_read_now(&self, buf: &mut [u8], offset: u64) -> Option<io::Result<()>> {
        if self.no_nowait.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: one iovec over `buf`, which outlives the call; RWF_NOWAIT
        // makes the kernel return EAGAIN rather than wait for the disk.
        let n = unsafe {
            libc::preadv2(
                self.file.as_raw_fd(),
                &iov,
                1,
                offset as libc::off_t,
                libc::RWF_NOWAIT,
            )
        };
        if n == buf.len() as isize {
            return Some(Ok(()));
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL)
            ) {
                // Not supported here: stop trying.
                self.no_nowait
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        // EAGAIN, or only part was cached: the blocking path reads it all.
        None
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.file.write_all_at(buf, offset)?;
        if fua {
            self.durability.sync(&self.file, &self.path)?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.durability.sync(&self.file, &self.path)
    }

    fn failed(&self) -> bool {
        self.durability.failed()
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        match self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            Ok(()) => {}
            // TRIM is advisory: a file system that cannot punch holes
            // simply keeps the data.
            Err(e) if unsupported(&e) => return Ok(()),
            Err(e) => return Err(e),
        }
        if fua {
            self.durability.sync(&self.file, &self.path)?;
        }
        Ok(())
    }

    fn zero(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fast: bool,
        fua: bool,
    ) -> Result<(), ZeroError> {
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let zero_range = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        let done = if may_trim {
            self.fallocate(punch, offset, len)
                .or_else(|_| self.fallocate(zero_range, offset, len))
        } else {
            // ZERO_RANGE keeps blocks allocated; where it is missing (tmpfs),
            // punching then allocating gives the same result.
            self.fallocate(zero_range, offset, len).or_else(|_| {
                self.fallocate(punch, offset, len)?;
                self.fallocate(libc::FALLOC_FL_KEEP_SIZE, offset, len)
            })
        };
        match done {
            Ok(()) => {}
            Err(e) if unsupported(&e) => {
                if fast {
                    return Err(ZeroError::NotFast);
                }
                self.write_zeroes(offset, len)?;
            }
            Err(e) => return Err(e.into()),
        }
        if fua {
            self.durability.sync(&self.file, &self.path)?;
        }
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let end = offset.saturating_add(len).min(self.size);
        if self.block_device || offset >= end {
            return Ok(vec![Extent::data(end.saturating_sub(offset).max(1))]);
        }
        let mut out = Vec::new();
        let mut pos = offset;
        while pos < end && out.len() < MAX_EXTENTS {
            let data = match self.lseek(pos, libc::SEEK_DATA) {
                Ok(d) => d,
                // No SEEK_DATA here: report everything as data.
                Err(e) if unsupported(&e) => {
                    out.push(Extent::data(end - pos));
                    break;
                }
                Err(e) => return Err(e),
            };
            match data {
                None => {
                    out.push(Extent::unallocated(end - pos));
                    pos = end;
                }
                Some(d) if d > pos => {
                    let stop = d.min(end);
                    out.push(Extent::unallocated(stop - pos));
                    pos = stop;
                }
                Some(_) => {
                    let h = self.lseek(pos, libc::SEEK_HOLE)?.unwrap_or(self.size);
                    let stop = h.min(end).max(pos + 1);
                    out.push(Extent::data(stop - pos));
                    pos = stop;
                }
            }
        }
        Ok(out)
    }

    fn cache(&self, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: posix_fadvise only reads its integer arguments.
        let rc = unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(rc))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sparse(size: u64) -> (tempfile::NamedTempFile, FileBackend) {
        let f = tempfile::NamedTempFile::new().unwrap();
        f.as_file().set_len(size).unwrap();
        let b = FileBackend::open(f.path(), false).unwrap();
        (f, b)
    }

    #[test]
    fn reads_back_what_was_written() {
        let (_f, b) = sparse(1 << 20);
        b.write_at(b"hello", 4093, false).unwrap();
        let mut buf = [0u8; 7];
        b.read_at(&mut buf, 4092).unwrap();
        assert_eq!(&buf, b"\0hello\0");
    }

    #[test]
    fn extents_see_holes_and_data() {
        let (_f, b) = sparse(1 << 20);
        b.write_at(&[1u8; 4096], 65536, false).unwrap();
        let ext = b.extents(0, 1 << 20).unwrap();
        let total: u64 = ext.iter().map(|e| e.len).sum();
        assert_eq!(total, 1 << 20);
        // Somewhere in there is data, and the start is a hole (on file
        // systems without SEEK_DATA everything is data: accept that too).
        if ext.len() > 1 {
            assert_eq!(ext[0], Extent::unallocated(ext[0].len));
            assert!(ext.iter().any(|e| *e == Extent::data(e.len)));
        }
    }

    #[test]
    fn zero_and_trim_read_back_as_zero() {
        let (_f, b) = sparse(1 << 20);
        b.write_at(&[7u8; 8192], 0, false).unwrap();
        b.zero(100, 5000, false, false, true).unwrap();
        let mut buf = vec![0u8; 8192];
        b.read_at(&mut buf, 0).unwrap();
        assert!(buf[..100].iter().all(|&x| x == 7));
        assert!(buf[100..5100].iter().all(|&x| x == 0));
        assert!(buf[5100..].iter().all(|&x| x == 7));
        b.zero(0, 8192, true, false, false).unwrap();
        b.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&x| x == 0));
    }

    #[test]
    fn cached_reads_are_served_without_blocking() {
        let (_f, b) = sparse(1 << 20);
        b.write_at(b"cached", 100, false).unwrap();
        let mut buf = [0u8; 6];
        // Kernels or file systems without RWF_NOWAIT say so by None.
        if let Some(r) = b.try_read_now(&mut buf, 100) {
            r.unwrap();
            assert_eq!(&buf, b"cached");
        }
    }

    #[test]
    fn unwritten_memory_reads_as_zero_and_costs_nothing() {
        let m = FileBackend::memory(1 << 40).unwrap();
        let mut buf = vec![1u8; 100];
        m.read_at(&mut buf, 1 << 39).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(m.allocated().unwrap(), 0);
        let first = m.extents(0, 1 << 20).unwrap()[0];
        assert_eq!(first, Extent::unallocated(first.len));
    }

    #[test]
    fn memory_reads_back_across_pages_and_sends_from_its_file() {
        let m = FileBackend::memory(1 << 20).unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        m.write_at(&data, 65533, false).unwrap();
        let mut back = vec![0u8; data.len()];
        m.read_at(&mut back, 65533).unwrap();
        assert_eq!(back, data);
        assert!(m.zero_copy_fd().is_some());
        assert!(!m.blocking());
    }

    #[test]
    fn zeroing_memory_gives_whole_pages_back() {
        const K64: u64 = 64 * 1024;
        let m = FileBackend::memory(1 << 20).unwrap();
        m.write_at(&vec![9u8; 3 * K64 as usize], 0, false).unwrap();
        let before = m.allocated().unwrap();
        assert!(before >= 3 * K64, "{before}");
        m.zero(10, 2 * K64, true, false, false).unwrap();
        // Pages wholly inside the range are freed (page size <= 64 KiB).
        let after = m.allocated().unwrap();
        assert!(before - after >= K64, "{before} -> {after}");
        let mut b = vec![0u8; 3 * K64 as usize];
        m.read_at(&mut b, 0).unwrap();
        assert!(b[..10].iter().all(|&x| x == 9));
        assert!(b[10..10 + 2 * K64 as usize].iter().all(|&x| x == 0));
        assert!(b[10 + 2 * K64 as usize..].iter().all(|&x| x == 9));
    }

    #[test]
    fn refuses_directories() {
        let d = tempfile::tempdir().unwrap();
        let e = FileBackend::open(d.path(), true).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
