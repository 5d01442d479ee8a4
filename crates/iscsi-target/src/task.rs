//! Tasks (SAM-5 "task"): a SCSI command from the moment the target takes
//! it until its response is queued, kept in its logical unit's task set so
//! that task management from any session can find and abort it.
//!
//! A task waits (for WRITE data, for a test hold, for room in the read
//! budget) and can then be aborted outright: it never reaches the
//! backend. Once it runs its backend call cannot be taken back, so an
//! abort then waits for it to finish and only its response is dropped.
//! Either way, whoever aborts can wait until the task is gone, which is
//! what lets a task management response, a PREEMPT AND ABORT or a
//! session reinstatement promise that nothing of the aborted tasks lands
//! afterwards.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Where a task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Waiting,
    Running,
    /// Its response is on the way: too late to abort.
    Answered,
    Done,
}

/// One task's state, shared by the task and whoever may abort it.
#[derive(Debug)]
pub(crate) struct TaskCtl {
    /// The I_T nexus that sent it, and its initiator task tag.
    pub nexus: u64,
    pub itt: u32,
    phase: Mutex<Phase>,
    aborted: AtomicBool,
    changed: Notify,
    /// Woken on abort, so that the connection owning a WRITE that waits
    /// for data notices.
    pub owner: Arc<Notify>,
}

impl TaskCtl {
    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Aborts the task: waiting, it will never run; running, its
    /// response will not be sent. `false` when it is too late: the task
    /// has answered (or ended), and an abort must not claim otherwise,
    /// or the initiator would hear both that it completed and that it
    /// was aborted.
    pub fn abort(&self) -> bool {
        let p = self.phase();
        if matches!(*p, Phase::Answered | Phase::Done) {
            return false;
        }
        self.aborted.store(true, Ordering::Release);
        drop(p);
        self.changed.notify_waiters();
        self.owner.notify_one();
        true
    }

    /// Claims the right to send the task's response, unless it was
    /// aborted first (then `false`, and nothing may be sent).
    pub fn answer(&self) -> bool {
        let mut p = self.phase();
        if self.aborted() {
            return false;
        }
        *p = Phase::Answered;
        true
    }

    /// Moves from waiting to running, unless aborted: then `false`, and
    /// the task must end without touching the backend.
    pub fn start(&self) -> bool {
        let mut p = self.phase();
        if self.aborted() {
            return false;
        }
        *p = Phase::Running;
        true
    }

    /// Resolves once the task is aborted.
    pub async fn until_aborted(&self) {
        loop {
            let changed = self.changed.notified();
            if self.aborted() {
                return;
            }
            changed.await;
        }
    }

    /// Resolves once the task has ended.
    pub async fn until_done(&self) {
        loop {
            let changed = self.changed.notified();
            if *self.phase() == Phase::Done {
                return;
            }
            changed.await;
        }
    }

    fn finish(&self) {
        *self.phase() = Phase::Done;
        self.changed.notify_waiters();
    }
}

/// A logical unit's task set: every task of every nexus.
#[derive(Debug, Default)]
pub(crate) struct TaskSet {
    tasks: Mutex<HashMap<(u64, u32), Arc<TaskCtl>>>,
}

/// A task in its set; ends it (and leaves the set) when dropped.
#[derive(Debug)]
pub(crate) struct Task {
    pub ctl: Arc<TaskCtl>,
    set: Arc<TaskSet>,
}

impl Drop for Task {
    fn drop(&mut self) {
        self.set.lock().remove(&(self.ctl.nexus, self.ctl.itt));
        self.ctl.finish();
    }
}

/// A task tag already in use by the same nexus (SAM-5 5.10: OVERLAPPED
/// COMMANDS ATTEMPTED).
#[derive(Debug)]
pub(crate) struct Overlapped;

impl TaskSet {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u32), Arc<TaskCtl>>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enters a task of `nexus` tagged `itt`.
    ///
    /// # Errors
    ///
    /// [`Overlapped`] if that nexus already has a task with that tag.
    pub fn enter(
        self: &Arc<Self>,
        nexus: u64,
        itt: u32,
        owner: &Arc<Notify>,
    ) -> Result<Task, Overlapped> {
        let mut tasks = self.lock();
        if tasks.contains_key(&(nexus, itt)) {
            return Err(Overlapped);
        }
        let ctl = Arc::new(TaskCtl {
            nexus,
            itt,
            phase: Mutex::new(Phase::Waiting),
            aborted: AtomicBool::new(false),
            changed: Notify::new(),
            owner: owner.clone(),
        });
        tasks.insert((nexus, itt), ctl.clone());
        Ok(Task {
            ctl,
            set: self.clone(),
        })
    }

    /// The tasks `pick` chooses, each by (nexus, tag).
    pub fn select(&self, pick: impl Fn(u64, u32) -> bool) -> Vec<Arc<TaskCtl>> {
        self.lock()
            .values()
            .filter(|t| pick(t.nexus, t.itt))
            .cloned()
            .collect()
    }
}

/// Aborts `tasks` and waits until every one has ended; returns how many
/// were aborted (the rest had already answered).
pub(crate) async fn abort_all(tasks: &[Arc<TaskCtl>]) -> usize {
    let aborted = tasks.iter().filter(|t| t.abort()).count();
    for t in tasks {
        t.until_done().await;
    }
    aborted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_aborted_waiting_task_never_starts_and_its_abort_waits_for_the_end() {
        let set = Arc::new(TaskSet::default());
        let owner = Arc::new(Notify::new());
        let a = set.enter(1, 10, &owner).unwrap();
        assert!(set.enter(1, 10, &owner).is_err(), "one tag, one task");
        let b = set.enter(2, 10, &owner).unwrap();
        assert_eq!(set.select(|n, _| n == 1).len(), 1);

        let picked = set.select(|_, _| true);
        let ctl_a = a.ctl.clone();
        let waiting = tokio::spawn(async move {
            ctl_a.until_aborted().await;
            let started = ctl_a.start();
            drop(a);
            started
        });
        assert!(b.ctl.start(), "b runs before the abort");
        let ctl_b = b.ctl.clone();
        let aborting = tokio::spawn(async move { abort_all(&picked).await });
        tokio::task::yield_now().await;
        assert!(ctl_b.aborted());
        assert!(!aborting.is_finished(), "b is still running");
        drop(b);
        assert_eq!(aborting.await.unwrap(), 2);
        assert!(!waiting.await.unwrap(), "a never started");
        assert!(set.select(|_, _| true).is_empty());
    }

    #[tokio::test]
    async fn a_task_that_answered_is_not_aborted_and_one_aborted_does_not_answer() {
        let set = Arc::new(TaskSet::default());
        let owner = Arc::new(Notify::new());
        let done = set.enter(1, 1, &owner).unwrap();
        assert!(done.ctl.start());
        assert!(done.ctl.answer(), "its response may go");
        let picked = set.select(|_, _| true);
        let ctl = done.ctl.clone();
        let aborting = tokio::spawn(async move { abort_all(&picked).await });
        tokio::task::yield_now().await;
        assert!(!ctl.aborted(), "too late to abort");
        drop(done);
        assert_eq!(aborting.await.unwrap(), 0, "nothing was aborted");

        let late = set.enter(1, 2, &owner).unwrap();
        assert!(late.ctl.start());
        assert!(late.ctl.abort());
        assert!(!late.ctl.answer(), "an aborted task sends nothing");
    }
}
