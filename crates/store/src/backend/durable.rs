//! Making writes stable, and remembering when that failed.
//!
//! When `fdatasync` fails, Linux marks the dirty pages it could not write
//! clean (or drops them) and reports the error once: the next call has
//! nothing left to write and succeeds, over data that never reached the
//! disk. PostgreSQL learned this in 2018 ("fsyncgate"); the only safe
//! answer is to stop promising durability for that file until it is
//! reopened. So the first failure is sticky: every later FLUSH and FUA
//! write fails with EIO, and the export reports itself failed.
//!
//! Flushes run concurrently (so the file system can commit many FUA writes
//! in one journal transaction), which leaves one race: a flush that
//! overlapped a failing one may find nothing left to write and succeed
//! before the failure is recorded. So a successful flush is answered only
//! once every flush that started before it ended has ended too, and then
//! only if none of them failed.

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::{Condvar, Mutex, MutexGuard};

/// A file's cache flushes, with the memory of a failed one.
#[derive(Debug, Default)]
pub struct Durability {
    state: Mutex<State>,
    /// Signalled as each flush ends.
    ended: Condvar,
}

#[derive(Debug, Default)]
struct State {
    failed: bool,
    /// The ticket of the next flush to start.
    next: u64,
    /// Tickets of the flushes running now.
    running: BTreeSet<u64>,
}

impl Durability {
    /// `fdatasync(file)`, unless one already failed.
    ///
    /// # Errors
    ///
    /// EIO once any flush of this file has failed, else the OS error.
    pub fn sync(&self, file: &File, path: &Path) -> io::Result<()> {
        let ticket = {
            let mut s = self.lock();
            if s.failed {
                return Err(eio());
            }
            let t = s.next;
            s.next += 1;
            s.running.insert(t);
            t
        };
        let result = file.sync_data();
        let mut s = self.lock();
        s.running.remove(&ticket);
        self.ended.notify_all();
        if let Err(e) = result {
            if !std::mem::replace(&mut s.failed, true) {
                tracing::error!(
                    "{}: a cache flush failed ({e}); writes acknowledged before it may never \
                     reach the disk, so this export now fails every FLUSH and FUA write with \
                     EIO. Check the disk and the kernel log, then restart braid serve to \
                     reopen it",
                    path.display()
                );
            }
            return Err(e);
        }
        // Every flush that started before this one ended; none waits here,
        // so waiting cannot deadlock.
        let horizon = s.next;
        while !s.failed && s.running.range(..horizon).next().is_some() {
            s = self.ended.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if s.failed {
            return Err(eio());
        }
        Ok(())
    }

    /// Whether a flush has failed since the file was opened.
    pub fn failed(&self) -> bool {
        self.lock().failed
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn flushes_succeed_until_one_fails_and_then_never() {
        let f = tempfile::tempfile().unwrap();
        let d = Durability::default();
        let p = Path::new("test");
        d.sync(&f, p).unwrap();
        d.sync(&f, p).unwrap();
        assert!(!d.failed());
        d.lock().failed = true;
        assert_eq!(d.sync(&f, p).unwrap_err().raw_os_error(), Some(libc::EIO));
        assert!(d.failed());
    }

    #[test]
    fn a_flush_that_overlapped_a_failed_one_fails_too() {
        let f = tempfile::tempfile().unwrap();
        let d = Arc::new(Durability::default());
        // An earlier flush is still running (as a failing fdatasync would
        // be while this one finds nothing to write).
        d.lock().running.insert(0);
        d.lock().next = 1;
        let waiter = {
            let (d, f) = (d.clone(), f.try_clone().unwrap());
            std::thread::spawn(move || d.sync(&f, Path::new("test")))
        };
        // The waiter cannot answer while ticket 0 runs; bounded wait until
        // it has finished its own fdatasync and is waiting.
        for _ in 0..1000 {
            if d.lock().next == 2 && !d.lock().running.contains(&1) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!waiter.is_finished());
        let mut s = d.lock();
        s.running.remove(&0);
        s.failed = true;
        drop(s);
        d.ended.notify_all();
        let r = waiter.join().unwrap();
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EIO));
    }
}
