//! One writer per image: an exported file or device is claimed so that a
//! second `braid serve`, a qemu or a mount cannot write it at the same
//! time (two writers that do not know of each other corrupt a disk as
//! surely as a crash).
//!
//! Files take an open file description lock over the whole file
//! (`F_OFD_SETLK`): exclusive for a writable export, shared for a
//! read-only one, so any number of readers may share an image and no
//! writer can join them. qemu takes OFD locks on bytes of the image too,
//! so braid and qemu refuse each other the same way. Block devices are
//! opened with `O_EXCL`, which the kernel refuses while the device is
//! mounted, part of a RAID or LVM volume, or opened exclusively by another
//! program.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Takes the file lock for `file` (at `path`); the lock lives as long as
/// the open file.
///
/// # Errors
///
/// Another process holds a conflicting lock (the message says who, as far
/// as the kernel tells, and what to do), or the file system refuses locks.
pub fn lock_file(file: &File, path: &Path, read_only: bool) -> io::Result<()> {
    let kind = if read_only {
        libc::F_RDLCK
    } else {
        libc::F_WRLCK
    };
    let mut fl = whole_file(kind);
    // SAFETY: fcntl with F_OFD_SETLK reads the flock we pass, which lives
    // for the call.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) {
        return Err(io::Error::new(
            e.kind(),
            format!("{}: cannot lock the file: {e}", path.display()),
        ));
    }
    Err(io::Error::new(
        io::ErrorKind::WouldBlock,
        format!(
            "{} is in use by another program that {} (held {}); stop it first, or serve the \
             export read-only (--read-only, --read-only-export) if both only read",
            path.display(),
            if read_only {
                "writes it"
            } else {
                "has it open"
            },
            holder(file)
        ),
    ))
}

/// Who holds the conflicting lock, as far as the kernel tells: OFD locks
/// (braid's, qemu's) carry no process id; classic POSIX locks do.
fn holder(file: &File) -> String {
    let mut fl = whole_file(libc::F_WRLCK);
    // SAFETY: F_OFD_GETLK writes the first conflicting lock into fl.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    if rc != 0 || i32::from(fl.l_type) == libc::F_UNLCK {
        return "a lock the kernel would not describe".into();
    }
    let what = if i32::from(fl.l_type) == libc::F_WRLCK {
        "a write lock"
    } else {
        "a shared lock"
    };
    if fl.l_pid > 0 {
        let name = std::fs::read_to_string(format!("/proc/{}/comm", fl.l_pid)).unwrap_or_default();
        format!("{what} by pid {} {}", fl.l_pid, name.trim())
    } else {
        format!(
            "{what}, as braid and qemu take; `fuser -v` or `lsof` on the file names the process"
        )
    }
}

fn whole_file(kind: i32) -> libc::flock {
    // SAFETY: flock is plain integers; all-zero is valid (l_pid must be 0
    // for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 0;
    fl
}

/// The error for a block device another program holds.
pub fn device_busy(path: &Path, e: &io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!(
            "{} is in use (mounted, part of a RAID or LVM volume, or opened exclusively by \
             another program: {e}); unmount or stop it first, or serve it --read-only",
            path.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_writer_many_readers() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        std::fs::write(&p, b"x").unwrap();
        let open = || File::options().read(true).write(true).open(&p).unwrap();
        let (a, b) = (open(), open());
        lock_file(&a, &p, false).unwrap();
        let e = lock_file(&b, &p, false).unwrap_err();
        assert!(e.to_string().contains("in use"), "{e}");
        assert!(e.to_string().contains("write lock"), "{e}");
        assert!(
            lock_file(&b, &p, true).is_err(),
            "no reader beside a writer"
        );
        drop(a);
        let (r1, r2) = (open(), open());
        lock_file(&r1, &p, true).unwrap();
        lock_file(&r2, &p, true).unwrap();
        assert!(
            lock_file(&b, &p, false).is_err(),
            "no writer beside readers"
        );
    }
}
