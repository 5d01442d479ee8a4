//! Fetching the newest OSD map from the monitors: what a barrier's
//! acknowledgement, a join and a write after a lapsed watch wait for; a
//! bound on how long an acknowledgement waits for it ([`Fetcher`]), and
//! when a gateway whose fetches keep failing must stop serving ([`Reach`]).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use braid_rbd::Cluster;

/// Waits until `cluster` has the newest OSD map the monitors know.
///
/// # Errors
///
/// The monitors' error.
pub(crate) fn latest(cluster: &Cluster) -> braid_rbd::Result<()> {
    cut_off_for_tests();
    cluster.wait_for_latest_osdmap()
}

/// Test hook: with `BRAID_TEST_NO_OSDMAP=PATH` in a build with the
/// `test-hooks` feature, fetching the newest OSD map waits while PATH
/// exists (at most two minutes), as it does when the monitors cannot be
/// reached while the OSDs can.
fn cut_off_for_tests() {
    super::hooks::hold("BRAID_TEST_NO_OSDMAP", "no OSD map");
}

/// Fetches of the newest OSD map for one RADOS client: one at a time, on
/// a thread of its own, however many ask; each caller waits, up to its
/// bound, for a fetch that began after it asked (one already under way may
/// have asked the monitors before the map the caller must see).
pub(crate) struct Fetcher {
    state: Mutex<State>,
    cv: Condvar,
    fetch: Box<dyn Fn() -> Result<(), String> + Send + Sync>,
}

#[derive(Debug)]
struct State {
    /// Fetches begun and ended, counted.
    started: u64,
    done: u64,
    running: bool,
    /// The fetch the latest caller waits for.
    wanted: u64,
    /// What the latest fetch that ended said.
    last: Result<(), String>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher").finish_non_exhaustive()
    }
}

impl Fetcher {
    pub fn new(fetch: impl Fn() -> Result<(), String> + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                started: 0,
                done: 0,
                running: false,
                wanted: 0,
                last: Ok(()),
            }),
            cv: Condvar::new(),
            fetch: Box::new(fetch),
        })
    }

    /// Waits up to `limit` for a fetch begun after this call to end.
    ///
    /// # Errors
    ///
    /// The monitors did not answer within `limit`, or answered an error.
    pub fn fresh(self: &Arc<Self>, limit: Duration) -> Result<(), String> {
        let mut s = self.lock();
        let want = s.started + 1;
        s.wanted = s.wanted.max(want);
        if !s.running {
            self.start(&mut s);
        }
        let (s, _) = self
            .cv
            .wait_timeout_while(s, limit, |s| s.done < want)
            .unwrap_or_else(|p| p.into_inner());
        if s.done < want {
            return Err(format!(
                "the monitors did not send the newest OSD map within {limit:?}"
            ));
        }
        s.last.clone()
    }

    fn start(self: &Arc<Self>, s: &mut State) {
        s.started += 1;
        s.running = true;
        let (me, fetch) = (self.clone(), s.started);
        let spawned = std::thread::Builder::new()
            .name("braid-osdmap".into())
            .spawn(move || {
                let r = (me.fetch)();
                let mut s = me.lock();
                s.done = fetch;
                s.last = r;
                s.running = false;
                if s.wanted > s.done {
                    me.start(&mut s);
                }
                me.cv.notify_all();
            });
        if let Err(e) = spawned {
            s.running = false;
            s.done = s.started;
            s.last = Err(format!("starting a thread to fetch the OSD map: {e}"));
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether a gateway whose OSD map fetches keep failing is cut off from
/// the monitors: failing, with no success between, for its grace period.
/// It then stops serving (as a blocklisted one does) rather than leave
/// every fence of its images waiting on its acknowledgement.
#[derive(Debug, Default)]
pub(crate) struct Reach {
    failing_since: Option<Duration>,
}

impl Reach {
    /// A fetch succeeded.
    pub fn answered(&mut self) {
        self.failing_since = None;
    }

    /// A fetch begun at `began` had failed by `now` (a monotonic clock);
    /// whether failures have now lasted `grace`.
    pub fn failed(&mut self, began: Duration, now: Duration, grace: Duration) -> bool {
        let since = *self.failing_since.get_or_insert(began);
        now.saturating_sub(since) >= grace
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::mpsc;

    #[test]
    fn one_fetch_runs_at_a_time_and_a_caller_waits_for_one_begun_after_it_asked() {
        let calls = Arc::new(AtomicU32::new(0));
        let (release, released) = mpsc::channel::<Result<(), String>>();
        let released = Mutex::new(released);
        let counted = calls.clone();
        let f = Fetcher::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            released.lock().unwrap().recv().unwrap()
        });
        // The monitors do not answer: each caller gives up at its bound,
        // and no second fetch starts beside the first.
        let short = Duration::from_millis(20);
        assert!(f.fresh(short).unwrap_err().contains("did not send"));
        assert!(f.fresh(short).is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // The first ends: the one the later callers wanted starts, and a
        // caller gets its answer.
        release.send(Ok(())).unwrap();
        let g = f.clone();
        let waiter = std::thread::spawn(move || g.fresh(Duration::from_secs(60)));
        release.send(Err("refused".into())).unwrap();
        release.send(Ok(())).unwrap();
        let got = waiter.join().unwrap();
        assert!(
            got.is_ok() || got == Err("refused".into()),
            "an answer, not the bound: {got:?}"
        );
        assert!(calls.load(Ordering::SeqCst) >= 2);
    }

    #[test]
    fn cut_off_once_failures_last_the_grace_period_with_no_success_between() {
        let s = Duration::from_secs;
        let mut r = Reach::default();
        assert!(!r.failed(s(0), s(4), s(15)));
        assert!(!r.failed(s(5), s(9), s(15)));
        assert!(r.failed(s(12), s(16), s(15)), "failing since 0 s");
        r.answered();
        assert!(!r.failed(s(20), s(24), s(15)), "counted from 20 s again");
        assert!(r.failed(s(31), s(35), s(15)));
    }
}
