//! Where an export's bytes live: the [`Backend`] trait and its
//! implementation for a file, a block device or sparse memory, and (with
//! the `rbd` feature) a Ceph RBD image.
//!
//! Backends are synchronous and assume valid input: offsets and lengths
//! were checked against the export by the front end, at its protocol's
//! edge, before any call reaches them.

mod durable;
mod file;
mod lock;
pub mod netfs;

use std::io;

use braid_pool::Buf;

pub use file::FileBackend;

/// What a backend can do, as nbdkit's `can_*` callbacks say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Holes can be punched (TRIM does something).
    pub trim: bool,
    /// WRITE_ZEROES is faster than writing zeroes (FAST_ZERO succeeds).
    pub fast_zero: bool,
    /// Allocation can be reported (holes, zeroes).
    pub extents: bool,
    /// The medium is rotational (a hint for clients' schedulers).
    pub rotational: bool,
}

/// Why WRITE_ZEROES did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ZeroError {
    /// FAST_ZERO was asked and zeroing would be no faster than writing.
    #[error("zeroing this range would not be faster than writing")]
    NotFast,
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// One run of equal allocation status, in the words every front end
/// maps to its own (NBD's `base:allocation`, SCSI's GET LBA STATUS).
pub use braid_block::Extent;

/// Storage behind an export.
///
/// Every method may be called from several threads at once; a backend
/// shared by all connections of an export is what makes CAN_MULTI_CONN
/// true (a flush on any connection covers writes completed on every one).
///
/// An error of `ESHUTDOWN` means this server lost the right to use the
/// storage (a Ceph client that another gateway blocklisted): the request
/// is not answered, its connection is closed instead, so that the client
/// fences it and re-sends elsewhere rather than seeing an I/O error.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Size in bytes, fixed while served.
    fn size(&self) -> u64;

    fn caps(&self) -> Caps;

    /// Whether calls may block on I/O (then they run on blocking threads).
    fn blocking(&self) -> bool;

    /// Fills `buf` from `offset`.
    ///
    /// # Errors
    ///
    /// The OS error, mapped to an NBD error by the caller.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Fills `buf` from `offset` only if that cannot block (the data is in
    /// memory); `None` means "could block, use [`Self::read_at`] on a
    /// blocking thread". Lets a blocking backend serve cached reads
    /// without handing them to another thread.
    fn try_read_now(&self, _buf: &mut [u8], _offset: u64) -> Option<io::Result<()>> {
        None
    }

    /// Writes `buf` at `offset`; with `fua`, returns only once it is stable.
    ///
    /// # Errors
    ///
    /// The OS error.
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()>;

    /// Makes every completed write stable.
    ///
    /// # Errors
    ///
    /// The OS error.
    fn flush(&self) -> io::Result<()>;

    /// Whether [`Self::compare_and_write`] is the storage's own operation,
    /// atomic against every writer of it, other servers' too (a Ceph
    /// image that several gateways write).
    fn compares_and_writes(&self) -> bool {
        false
    }

    /// Compares `cmp` with the medium at `offset` and writes `data` (as
    /// long as `cmp`) there only if every byte matched, as one operation
    /// of the storage itself: `Ok(None)` when written, `Ok(Some(at))` when
    /// not, byte `at` (from `offset`) being the first that differed.
    /// Only where [`Self::compares_and_writes`].
    ///
    /// # Errors
    ///
    /// The storage's error; `Unsupported` where it has no such operation.
    fn compare_and_write(
        &self,
        _cmp: &[u8],
        _data: &[u8],
        _offset: u64,
        _fua: bool,
    ) -> io::Result<Option<u64>> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this storage has no compare-and-write operation of its own",
        ))
    }

    /// Whether the backend can no longer promise durability (a cache
    /// flush failed) until it is reopened.
    fn failed(&self) -> bool {
        false
    }

    /// Discards a range if the backend can; a hint, so doing nothing is
    /// correct.
    ///
    /// # Errors
    ///
    /// The OS error.
    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()>;

    /// Makes a range read as zeroes; `may_trim` allows leaving a hole
    /// (NBD_CMD_FLAG_NO_HOLE not set), `fast` asks to fail instead of being
    /// slow (NBD_CMD_FLAG_FAST_ZERO).
    ///
    /// # Errors
    ///
    /// [`ZeroError::NotFast`] or the OS error.
    fn zero(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fast: bool,
        fua: bool,
    ) -> Result<(), ZeroError>;

    /// Allocation of `[offset, offset + len)`, starting at `offset`. May
    /// cover less than asked (never nothing) or run past the end of the
    /// range; the caller trims.
    ///
    /// # Errors
    ///
    /// The OS error.
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>>;

    /// A descriptor READ data can be sent from with `sendfile`, when reads
    /// of it never fail and never wait (files in memory): then replies skip
    /// the copy through user space.
    fn zero_copy_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// The file the bytes live in, whole and as they are, when the kernel
    /// may copy between it and another such file (`copy_file_range`:
    /// a server-side copy, see [`crate::copy`]).
    fn copy_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// Prefetches a range; a hint.
    ///
    /// # Errors
    ///
    /// The OS error.
    fn cache(&self, offset: u64, len: u64) -> io::Result<()>;

    /// Whether [`Self::start_read`] starts reads (the backend has
    /// asynchronous I/O).
    fn can_start_read(&self) -> bool {
        false
    }

    /// Whether [`Self::start_write`] would start this write now.
    fn can_start_write(&self, _fua: bool) -> bool {
        false
    }

    /// Starts filling `buf` from `offset` with no thread waiting for it,
    /// where the backend has asynchronous I/O (librbd's); `done` gets the
    /// buffer back with the outcome.
    ///
    /// # Errors
    ///
    /// The arguments back, when it did not start the read after all (the
    /// caller then runs [`Self::read_at`] on a blocking thread).
    fn start_read(&self, buf: Buf, _offset: u64, done: Done) -> Result<(), (Buf, Done)> {
        Err((buf, done))
    }

    /// Starts writing `buf` at `offset` as [`Self::start_read`] starts a
    /// read (`fua` as for [`Self::write_at`]).
    ///
    /// # Errors
    ///
    /// The arguments back, when it did not start the write after all (the
    /// caller then runs [`Self::write_at`] on a blocking thread).
    fn start_write(
        &self,
        buf: Buf,
        _offset: u64,
        _fua: bool,
        done: Done,
    ) -> Result<(), (Buf, Done)> {
        Err((buf, done))
    }
}

/// What an asynchronous request ([`Backend::start_read`]) runs once it
/// is over, with its buffer and the outcome, on a thread of the backend's
/// own: it must not block.
pub type Done = Box<dyn FnOnce(Buf, io::Result<()>) + Send>;
