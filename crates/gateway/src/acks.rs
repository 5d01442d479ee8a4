//! A few threads that run barrier acknowledgements, with a bounded queue.
//!
//! An acknowledgement waits for the newest OSD map, which takes as long as
//! the monitors take to answer: forever when they cannot be reached. A
//! thread per notification would then pile up one thread per fence asked;
//! here a notification that finds the queue full is not acknowledged (the
//! fence fails and is asked again), and the gateway stops serving once it
//! has been cut off for its grace period (`osdmap.rs`).

use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send>;

/// Runs jobs on `threads` threads, with at most `queue` waiting.
#[derive(Debug)]
pub(crate) struct Pool {
    tx: SyncSender<Job>,
}

impl Pool {
    /// Starts the threads; they end once the pool is dropped and the jobs
    /// they run have returned.
    pub fn new(name: &str, threads: usize, queue: usize) -> Self {
        let (tx, rx) = mpsc::sync_channel::<Job>(queue);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..threads.max(1) {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(name.to_owned())
                .spawn(move || work(&rx));
            if let Err(e) = spawned {
                tracing::warn!("starting a {name} thread: {e}");
            }
        }
        Self { tx }
    }

    /// Queues `job`; `false` (and the job dropped) when the queue is full.
    pub fn try_run(&self, job: impl FnOnce() + Send + 'static) -> bool {
        match self.tx.try_send(Box::new(job)) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }
}

fn work(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv()
        };
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_its_threads_and_queue_a_job_is_refused_until_one_ends() {
        let pool = Pool::new("test", 1, 1);
        let (started_tx, started) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let blocking = |started_tx: mpsc::Sender<u32>, n: u32| {
            let released = released.clone();
            move || {
                started_tx.send(n).unwrap();
                let _ = released.lock().unwrap().recv();
            }
        };
        assert!(pool.try_run(blocking(started_tx.clone(), 1)));
        assert_eq!(started.recv().unwrap(), 1, "the one thread runs the first");
        assert!(
            pool.try_run(blocking(started_tx.clone(), 2)),
            "one may wait"
        );
        assert!(
            !pool.try_run(blocking(started_tx.clone(), 3)),
            "a third is refused, not given a thread"
        );
        release.send(()).unwrap();
        assert_eq!(started.recv().unwrap(), 2, "the waiting one runs next");
        assert!(pool.try_run(blocking(started_tx, 4)), "room again");
        release.send(()).unwrap();
        assert_eq!(started.recv().unwrap(), 4);
        release.send(()).unwrap();
    }
}
