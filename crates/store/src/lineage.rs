//! Which connection ids a server may answer a fence for without asking
//! anyone: its own, and those of earlier processes that used the same
//! state directory and are gone.
//!
//! A fence is a promise that nothing a connection received can still
//! reach the storage. A server can keep it for connections it issued (it
//! drains them) and for those of an earlier process of its own (that
//! process is gone, and everything it had in flight with it: the usual
//! case after a crash or a power cut, when the initiator fences the failed
//! path at the restarted server). It cannot keep it for another server's,
//! which may still be writing, so such a fence is refused and the
//! initiator asks elsewhere.
//!
//! Each process draws a random tag (the high 64 bits of every connection
//! id it issues, see `registry.rs`) and records it as a file
//! `servers/<tag>` in the state directory, made durable before any id is
//! issued and locked (an OFD lock) while the process lives. A tag with a
//! file nobody holds locked was an earlier process's; a locked one is a
//! braid serve running beside this one with the same state directory.
//! Tags a Ceph gateway takes as it reconnects are answered by the
//! gateway's own registry in the image (`gateway::fence`).

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// How many earlier processes' tags are kept: a fence for connections of
/// a process this many restarts ago is long overdue.
const KEEP: usize = 32;

/// This process's record among the servers of one state directory.
#[derive(Debug)]
pub struct Lineage {
    dir: PathBuf,
    tag: u64,
    /// Holds the lock that says this process is alive.
    _own: File,
}

/// Who issued a connection id's tag, as far as the state directory tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Issuer {
    /// An earlier process with this state directory, no longer running.
    Earlier,
    /// Another process with this state directory, running now.
    Running,
    /// No process that used this state directory.
    Unknown,
}

impl Lineage {
    /// Draws a tag for this process and records it in `<state>/servers`,
    /// durably, before the caller issues any connection id under it.
    ///
    /// # Errors
    ///
    /// The directory or the file cannot be made, locked or synced.
    pub fn claim(state: &Path) -> io::Result<Self> {
        let dir = state.join("servers");
        fs::create_dir_all(&dir)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        let tag = loop {
            let t = uuid::Uuid::new_v4().as_u128() as u64;
            if !dir.join(name(t)).exists() {
                break t;
            }
        };
        let path = dir.join(name(tag));
        let mut own = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        lock(&own, libc::F_WRLCK)?;
        writeln!(own, "pid {}", std::process::id())?;
        own.sync_all()?;
        File::open(&dir)?.sync_all()?;
        prune(&dir, tag);
        Ok(Self {
            dir,
            tag,
            _own: own,
        })
    }

    /// The tag this process issues connection ids under.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// Who issued ids under `tag` (blocking: reads the directory).
    pub fn issuer(&self, tag: u64) -> Issuer {
        if tag == self.tag {
            return Issuer::Running;
        }
        let Ok(f) = File::open(self.dir.join(name(tag))) else {
            return Issuer::Unknown;
        };
        if locked(&f) {
            Issuer::Running
        } else {
            Issuer::Earlier
        }
    }
}

fn name(tag: u64) -> String {
    format!("{tag:016x}")
}

/// Removes the records of stopped processes past the newest [`KEEP`];
/// best effort (a record left over costs a few bytes).
fn prune(dir: &Path, mine: u64) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut stopped: Vec<(std::time::SystemTime, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name() != name(mine).as_str())
        .filter_map(|e| {
            let modified = e.metadata().ok()?.modified().ok()?;
            let f = File::open(e.path()).ok()?;
            (!locked(&f)).then(|| (modified, e.path()))
        })
        .collect();
    stopped.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
    for (_, p) in stopped.into_iter().skip(KEEP) {
        let _ = fs::remove_file(p);
    }
}

fn whole(kind: i32) -> libc::flock {
    // SAFETY: flock is plain integers; all-zero is valid (l_pid must be 0
    // for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl
}

fn lock(f: &File, kind: i32) -> io::Result<()> {
    let mut fl = whole(kind);
    // SAFETY: F_OFD_SETLK reads the flock passed, which lives for the call.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether another open file description holds a lock on `f`'s file.
fn locked(f: &File) -> bool {
    let mut fl = whole(libc::F_WRLCK);
    // SAFETY: F_OFD_GETLK writes the first conflicting lock into fl.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    rc == 0 && i32::from(fl.l_type) != libc::F_UNLCK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earlier_running_and_unknown_processes_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let first = Lineage::claim(dir.path()).unwrap();
        let beside = Lineage::claim(dir.path()).unwrap();
        let (t1, t2) = (first.tag(), beside.tag());
        assert_ne!(t1, t2);
        assert_eq!(beside.issuer(t1), Issuer::Running, "a live neighbour");
        drop(first);
        let later = Lineage::claim(dir.path()).unwrap();
        assert_eq!(later.issuer(t1), Issuer::Earlier, "gone: its lock with it");
        assert_eq!(later.issuer(t2), Issuer::Running);
        assert_eq!(later.issuer(later.tag()), Issuer::Running);
        assert_eq!(later.issuer(0x5eed), Issuer::Unknown);
    }

    #[test]
    fn only_the_newest_stopped_processes_are_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let mut gone = Vec::new();
        for _ in 0..KEEP + 3 {
            gone.push(Lineage::claim(dir.path()).unwrap().tag());
            // Distinct modification times, oldest first.
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let now = Lineage::claim(dir.path()).unwrap();
        let kept = fs::read_dir(dir.path().join("servers")).unwrap().count();
        assert_eq!(kept, KEEP + 1, "the newest stopped ones and this one");
        assert_eq!(now.issuer(gone[0]), Issuer::Unknown, "the oldest went");
        assert_eq!(now.issuer(gone[KEEP + 2]), Issuer::Earlier);
    }
}
