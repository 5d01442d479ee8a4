//! Power loss on demand, for durability tests.
//!
//! [`PowerCut::mount`] puts one file on a FUSE mount. Writes to it land in
//! a volatile cache and reach the "media" only when `fsync` or `fdatasync`
//! asks; [`PowerCut::power_off`] drops everything that did not, keeping a
//! chosen share of the dirty sectors (a write cut short keeps some sectors
//! and not others, never half of one). The same idea as LazyFS and
//! CrashMonkey, small enough to read in one sitting.
//!
//! Faults the tests also need: a cache flush that fails with EIO and, like
//! Linux's, forgets the dirty data so the next one succeeds
//! ([`PowerCut::fail_next_syncs`]); one that takes seconds
//! ([`PowerCut::delay_syncs`]); and a slow write at a chosen place
//! ([`PowerCut::delay_next_write_at`]), for a write a storage stack still
//! has under way when something else happens.
//!
//! Mounting needs root (`mount(2)` on `/dev/fuse`).

mod disk;
mod fs;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use disk::{Cut, SECTOR};

use fs::{PowerCutFs, Shared};

/// A mounted power-cut file system. Dropping it unmounts (lazily, so a
/// process that still has the file open cannot keep the test from ending).
pub struct PowerCut {
    shared: Arc<Shared>,
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
    file: PathBuf,
}

/// Where the delayed writes are: begun (waiting or landed) and landed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Delayed {
    pub begun: u64,
    pub landed: u64,
}

/// Counters of cache flushes, for a test to check its fault was reached.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Syncs {
    pub done: u64,
    pub failed: u64,
}

impl PowerCut {
    /// Mounts at `mountpoint` (an existing empty directory) a file system
    /// holding one zero-filled file `name` of `len` bytes.
    pub fn mount(mountpoint: &Path, name: &str, len: u64) -> io::Result<Self> {
        Self::mount_as(mountpoint, name, len, None)
    }

    /// As [`Self::mount`], the mount's type being `fuse.SUBTYPE` when a
    /// subtype is given, as a FUSE network file system's is
    /// (`fuse.glusterfs`, `fuse.sshfs`): what a program reads from
    /// `/proc/self/mountinfo` to tell what it runs on.
    pub fn mount_as(
        mountpoint: &Path,
        name: &str,
        len: u64,
        subtype: Option<&str>,
    ) -> io::Result<Self> {
        let shared = Arc::new(Shared::new(len));
        let fs = PowerCutFs {
            shared: shared.clone(),
            name: name.to_owned(),
            // SAFETY: getuid and getgid cannot fail and touch no memory.
            uid: unsafe { libc::getuid() },
            gid: unsafe { libc::getgid() },
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("braid-powercut".into()),
            fuser::MountOption::DefaultPermissions,
        ];
        // Workers enough that a slow flush or a delayed write does not
        // stall every other request behind it.
        config.n_threads = Some(4);
        let session = match subtype {
            None => fuser::spawn_mount(fs, mountpoint, &config)?,
            Some(sub) => {
                // fuser's own mount(2) always says "fuse": mounted here
                // with the type asked, then handed the device.
                let dev = mount_fuse(mountpoint, sub, fs.uid, fs.gid)?;
                let session = fuser::Session::from_fd(fs, dev, fuser::SessionACL::Owner, config);
                match session.and_then(fuser::Session::spawn) {
                    Ok(s) => s,
                    Err(e) => {
                        unmount(mountpoint);
                        return Err(e);
                    }
                }
            }
        };
        Ok(Self {
            shared,
            session: Some(session),
            mountpoint: mountpoint.to_owned(),
            file: mountpoint.join(name),
        })
    }

    /// The file's path.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Power loss. Each dirty sector survives with probability `keep`
    /// (drawn from `seed`, so a failing run can be repeated); every
    /// operation fails with EIO until [`PowerCut::power_on`].
    pub fn power_off(&self, keep: f64, seed: u64) -> Cut {
        let mut state = self.shared.lock();
        state.powered = false;
        let cut = state.disk.cut(keep, seed);
        drop(state);
        self.shared.power.notify_all();
        cut
    }

    pub fn power_on(&self) {
        self.shared.lock().powered = true;
    }

    /// The next `n` cache flushes fail with EIO.
    pub fn fail_next_syncs(&self, n: u32) {
        self.shared.lock().failing_syncs = n;
    }

    /// Every cache flush waits `delay` first.
    pub fn delay_syncs(&self, delay: Duration) {
        self.shared.lock().sync_delay = delay;
    }

    /// The next write that covers byte `offset` waits `delay` before it
    /// reaches the disk (its data lands at the end, whole), once; other
    /// requests, writes to the same bytes included, go on meanwhile, as
    /// a disk with a deep queue lets them. A power cut while it waits
    /// fails it.
    pub fn delay_next_write_at(&self, offset: u64, delay: Duration) {
        self.shared.lock().write_delay = Some((offset, delay));
    }

    /// What became of the writes [`PowerCut::delay_next_write_at`]
    /// delayed.
    pub fn delayed(&self) -> Delayed {
        let state = self.shared.lock();
        Delayed {
            begun: state.delayed_begun,
            landed: state.delayed_landed,
        }
    }

    pub fn syncs(&self) -> Syncs {
        let state = self.shared.lock();
        Syncs {
            done: state.syncs,
            failed: state.failed_syncs,
        }
    }

    /// Sectors written and not yet on the media.
    pub fn dirty_sectors(&self) -> usize {
        self.shared.lock().disk.dirty_sectors()
    }
}

impl Drop for PowerCut {
    fn drop(&mut self) {
        unmount(&self.mountpoint);
        // The mount is gone; fuser's own unmount of it fails quietly and
        // its thread ends when the last open file closes.
        drop(self.session.take());
    }
}

/// Detaches the mount at `at` (lazily: open files keep it until closed).
fn unmount(at: &Path) {
    if let Ok(path) = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()) {
        // SAFETY: a valid NUL-terminated path; umount2 keeps no pointer.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Opens `/dev/fuse` and mounts it at `at` as `fuse.SUBTYPE`; the kernel
/// then waits for the file system's answers on the returned descriptor.
fn mount_fuse(at: &Path, subtype: &str, uid: u32, gid: u32) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::AsRawFd;
    let dev = std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let c = |s: &str| {
        std::ffi::CString::new(s)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
    };
    let target = c(&at.to_string_lossy())?;
    let fstype = c(&format!("fuse.{subtype}"))?;
    let data = c(&format!(
        "fd={},rootmode=40000,user_id={uid},group_id={gid},default_permissions",
        dev.as_raw_fd()
    ))?;
    let source = c("braid-powercut")?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the
    // call; mount(2) keeps none of them.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(dev.into())
}
