//! Deadlines on braid's own RADOS operations (the registry's records, lease
//! heartbeats, barrier notifications, blocklist commands), so that one
//! operation stalled on an OSD or a monitor cannot hold a fence or a lease
//! renewal past its deadline: the caller gets `ETIMEDOUT` and decides
//! (a fence fails and the client asks again; a renewal is tried next
//! period). librbd's data writes get no deadline: they wait out a
//! cluster-wide stall, as a librbd client's would.
//!
//! librados offers no way to abandon a synchronous call, so each runs on a
//! thread of its own that the caller stops waiting for at the deadline;
//! the thread ends when the cluster answers. An image keeps at most
//! [`OUTSTANDING`] such calls unanswered: past that, a call fails at once
//! rather than leave one more thread waiting on a stalled cluster.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// Calls of one image still waiting on the cluster after their deadline.
pub(crate) const OUTSTANDING: usize = 8;

/// How long a record, heartbeat or registry read may take.
pub(crate) const OP_DEADLINE: Duration = Duration::from_secs(5);

/// How long a change of the image's metadata (a record written or
/// removed) may take: librbd tells every watcher of the image and waits up
/// to 5 s for their answers before it returns, so a single gateway that
/// does not answer made a call bounded by [`OP_DEADLINE`] fail every time
/// though the change was made.
pub(crate) const METADATA_DEADLINE: Duration = Duration::from_secs(12);

/// Calls of one image that outlived their deadline and still run.
#[derive(Debug, Default)]
pub(crate) struct Deadlines {
    late: Arc<AtomicUsize>,
}

impl Deadlines {
    /// Runs `op` and waits for it up to `limit`.
    ///
    /// # Errors
    ///
    /// `op`'s own error; `ETIMEDOUT` when it did not return within `limit`
    /// (it goes on in the background), or when too many earlier calls are
    /// still waiting on the cluster.
    pub fn within<T: Send + 'static>(
        &self,
        limit: Duration,
        what: &str,
        op: impl FnOnce() -> braid_rbd::Result<T> + Send + 'static,
    ) -> braid_rbd::Result<T> {
        let timed_out = |why: String| braid_rbd::Error {
            what: format!("{what}: {why}"),
            errno: libc::ETIMEDOUT,
        };
        let late = self.late.load(Ordering::SeqCst);
        if late >= OUTSTANDING {
            return Err(timed_out(format!(
                "{late} earlier operations of this image still wait on the cluster"
            )));
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let counted = self.late.clone();
        // Counted as late from the start: a thread that answers in time
        // takes itself off again before the caller returns.
        counted.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new()
            .name("braid-rados-op".into())
            .spawn(move || {
                let r = op();
                counted.fetch_sub(1, Ordering::SeqCst);
                let _ = tx.send(r);
            });
        if let Err(e) = spawned {
            self.late.fetch_sub(1, Ordering::SeqCst);
            return Err(braid_rbd::Error {
                what: format!("{what}: starting a thread: {e}"),
                errno: libc::EAGAIN,
            });
        }
        match rx.recv_timeout(limit) {
            Ok(r) => r,
            Err(_) => Err(timed_out(format!(
                "no answer from the cluster within {limit:?}"
            ))),
        }
    }

    /// Calls that outlived their deadline and still run.
    #[cfg(test)]
    fn late(&self) -> usize {
        self.late.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn an_answer_in_time_is_returned_and_a_stalled_call_is_left_behind() {
        let d = Deadlines::default();
        assert_eq!(
            d.within(Duration::from_secs(60), "quick", || Ok(7))
                .unwrap(),
            7
        );
        let err = d
            .within(
                Duration::from_secs(60),
                "refused",
                || -> braid_rbd::Result<()> {
                    Err(braid_rbd::Error {
                        what: "refused".into(),
                        errno: libc::EPERM,
                    })
                },
            )
            .unwrap_err();
        assert_eq!(err.errno, libc::EPERM);
        // A call the cluster never answers (until released): the caller
        // gets ETIMEDOUT and the call goes on.
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let r = released.clone();
        let err = d
            .within(Duration::from_millis(20), "stalled", move || {
                r.lock().unwrap().recv().unwrap();
                Ok(())
            })
            .unwrap_err();
        assert_eq!(err.errno, libc::ETIMEDOUT);
        assert!(err.what.starts_with("stalled: no answer"), "{}", err.what);
        release.send(()).unwrap();
    }

    #[test]
    fn no_more_than_the_bound_of_stalled_calls_wait_on_the_cluster() {
        let d = Deadlines::default();
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        for _ in 0..OUTSTANDING {
            let r = released.clone();
            let got = d.within(Duration::from_millis(1), "stalled", move || {
                r.lock().unwrap().recv().unwrap();
                Ok(())
            });
            assert_eq!(got.unwrap_err().errno, libc::ETIMEDOUT);
        }
        assert_eq!(d.late(), OUTSTANDING);
        // The next is refused at once, without a thread: its closure
        // would answer at once, and is never run.
        let err = d
            .within(Duration::from_secs(60), "one more", || Ok(()))
            .unwrap_err();
        assert!(
            err.what.contains("still wait on the cluster"),
            "{}",
            err.what
        );
        // The cluster answers: the stalled calls end, and calls run again.
        for _ in 0..OUTSTANDING {
            release.send(()).unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while d.late() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(d.late(), 0);
        assert!(d
            .within(Duration::from_secs(60), "again", || Ok(()))
            .is_ok());
    }
}
