//! The FUSE side: one directory holding one file whose bytes live in a
//! [`Disk`]. Every open is direct I/O, so the kernel's page cache keeps
//! nothing of its own and a power cut here is the whole truth.

use std::ffi::OsStr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite,
    Request, TimeOrNow, WriteFlags,
};

use crate::disk::Disk;

const FILE: INodeNo = INodeNo(2);
const TTL: Duration = Duration::from_secs(1);

/// What the test controls and what the file system does, under one lock.
pub(crate) struct State {
    pub disk: Disk,
    /// Off: every operation fails with EIO, as a disk with no power does.
    pub powered: bool,
    /// This many of the next cache flushes fail with EIO.
    pub failing_syncs: u32,
    /// Each cache flush takes this long before it starts.
    pub sync_delay: Duration,
    pub syncs: u64,
    pub failed_syncs: u64,
    /// The next write that covers this byte waits this long before it
    /// reaches the disk (once).
    pub write_delay: Option<(u64, Duration)>,
    /// Writes that waited so: begun (waiting or landed), and landed.
    pub delayed_begun: u64,
    pub delayed_landed: u64,
}

pub(crate) struct Shared {
    pub state: Mutex<State>,
    /// Signalled when a delayed flush may be cut short by power loss.
    pub power: Condvar,
}

impl Shared {
    pub fn new(len: u64) -> Self {
        Self {
            state: Mutex::new(State {
                disk: Disk::new(len),
                powered: true,
                failing_syncs: 0,
                sync_delay: Duration::ZERO,
                syncs: 0,
                failed_syncs: 0,
                write_delay: None,
                delayed_begun: 0,
                delayed_landed: 0,
            }),
            power: Condvar::new(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere in a test must not hide what the disk holds.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(crate) struct PowerCutFs {
    pub shared: Arc<Shared>,
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl PowerCutFs {
    fn attr(&self, ino: INodeNo) -> FileAttr {
        let (kind, perm, size, nlink) = if ino == FILE {
            (
                FileType::RegularFile,
                0o600,
                self.shared.lock().disk.len(),
                1,
            )
        } else {
            (FileType::Directory, 0o755, 0, 2)
        };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        }
    }

    /// The state, or EIO when the power is off.
    fn powered(&self) -> Result<MutexGuard<'_, State>, Errno> {
        let state = self.shared.lock();
        if state.powered {
            Ok(state)
        } else {
            Err(Errno::EIO)
        }
    }

    /// Waits `delay` with the state unlocked (so other requests go on),
    /// on the condvar rather than in sleep, so that a power cut meanwhile
    /// fails the operation at once, as it would on real hardware.
    fn wait<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        delay: Duration,
    ) -> Result<MutexGuard<'a, State>, Errno> {
        let deadline = std::time::Instant::now() + delay;
        while state.powered {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .shared
                .power
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if state.powered {
            Ok(state)
        } else {
            Err(Errno::EIO)
        }
    }

    fn sync(&self) -> Result<(), Errno> {
        let mut state = self.powered()?;
        let delay = state.sync_delay;
        if !delay.is_zero() {
            state = self.wait(state, delay)?;
        }
        state.syncs += 1;
        if state.failing_syncs > 0 {
            state.failing_syncs -= 1;
            state.failed_syncs += 1;
            state.disk.sync_failed();
            return Err(Errno::EIO);
        }
        state.disk.sync();
        Ok(())
    }
}

fn empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for PowerCutFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == INodeNo::ROOT && name == OsStr::new(&self.name) {
            reply.entry(&TTL, &self.attr(FILE), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino {
            INodeNo::ROOT | FILE => reply.attr(&TTL, &self.attr(ino)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // The disk has the size it was made with; times and modes are not
        // what these tests are about.
        if size.is_some_and(|s| s != self.shared.lock().disk.len()) {
            reply.error(Errno::EPERM);
        } else {
            reply.attr(&TTL, &self.attr(ino));
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        match self.powered() {
            // Writes in parallel, as a disk takes them: one held in a
            // delay must not hold the others back behind the kernel's
            // per-file lock.
            Ok(_) => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.powered() {
            Ok(state) => reply.data(state.disk.read(offset, u64::from(size))),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let written = self.powered().and_then(|mut state| {
            let end = offset.saturating_add(data.len() as u64);
            if let Some((at, delay)) = state.write_delay {
                if offset <= at && at < end {
                    state.write_delay = None;
                    state.delayed_begun += 1;
                    state = self.wait(state, delay)?;
                    state.delayed_landed += 1;
                }
            }
            Ok(state.disk.write(offset, data))
        });
        match written {
            Ok(0) if !data.is_empty() => reply.error(Errno::ENOSPC),
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let zeroes = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        let result = self.powered().and_then(|mut state| {
            if mode & !(zeroes | libc::FALLOC_FL_KEEP_SIZE) != 0 {
                Err(Errno::EOPNOTSUPP)
            } else if mode & zeroes != 0 {
                state.disk.zero(offset, length);
                Ok(())
            } else if offset.saturating_add(length) > state.disk.len() {
                Err(Errno::EFBIG)
            } else {
                // Preallocation: every byte already exists.
                Ok(())
            }
        });
        empty(reply, result);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.sync());
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2), not a cache flush: nothing becomes durable.
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (FILE, FileType::RegularFile, self.name.as_str()),
        ];
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(ino, (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}
