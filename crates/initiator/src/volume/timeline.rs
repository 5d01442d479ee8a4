//! The volume's recent events, for people watching it: a bounded ring of
//! the last [`KEPT`] events (wall-clock time, kind, path, text) and a
//! broadcast of each one as it happens, so a console can show a failover
//! while it runs and a page opened later still sees the last ones.
//!
//! The log lines stay the record of truth; this only keeps what they say
//! in a form a page can read. It measures what a log reader would work
//! out by hand: how long a failover took (from the failed path's last
//! reply to its requests being on other paths, held writes included) and
//! how long a path was down before it came back.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::broadcast;

/// Events kept for a page that opens late.
pub const KEPT: usize = 256;

/// What happened. A new kind is a new variant and its [`name`](Self::name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// A path failed; its requests moved to other paths.
    PathFailed,
    /// The target confirmed the fence of a failed path; its held writes
    /// were re-sent.
    Fenced,
    /// A failed path came back (failback).
    PathRestored,
    /// Requests waited longer than the no-path timeout and failed.
    NoPathTimeout,
    /// The policy was switched on the live volume.
    PolicySwitched,
    /// A path was taken out of use (drained) by an operator.
    PathDisabled,
    /// A drained path was put back into use.
    PathEnabled,
    /// The ALUA state of a path's port changed.
    AccessChanged,
    /// The target restarted: what it acknowledged and never made durable
    /// is written again before anything new.
    TargetRestarted,
    /// A replay ended (`took`: from the restart seen).
    Replayed,
    /// A new session's sign of a reset was the restart already handled.
    RestartAlreadyHandled,
    /// Acknowledged writes may be gone: FLUSH and FUA writes fail.
    Lost,
    /// An operator cleared a loss.
    LossCleared,
    /// braid's own FLUSH of the replay window failed (tried again soon).
    WritebackFailed,
}

impl EventKind {
    /// The kind as a page or a JSON reader names it.
    pub fn name(self) -> &'static str {
        match self {
            Self::PathFailed => "path-failed",
            Self::Fenced => "fenced",
            Self::PathRestored => "path-restored",
            Self::NoPathTimeout => "no-path-timeout",
            Self::PolicySwitched => "policy",
            Self::PathDisabled => "path-disabled",
            Self::PathEnabled => "path-enabled",
            Self::AccessChanged => "alua",
            Self::TargetRestarted => "restart",
            Self::Replayed => "replayed",
            Self::RestartAlreadyHandled => "restart-known",
            Self::Lost => "lost",
            Self::LossCleared => "loss-cleared",
            Self::WritebackFailed => "writeback-failed",
        }
    }
}

/// One event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimelineEvent {
    /// Grows by one per event of this volume.
    pub seq: u64,
    pub at: SystemTime,
    pub kind: EventKind,
    /// 1-based, as users count paths; `None` for the whole volume.
    pub path: Option<usize>,
    pub text: String,
    /// What the event measured: for a failover (`PathFailed` with requests
    /// moved, `Fenced`), the time from the path's last reply until its
    /// requests were on other paths; for `PathRestored`, how long the path
    /// was down.
    pub took: Option<Duration>,
}

/// The ring and its subscribers; cheap to clone (one shared record).
#[derive(Clone)]
pub struct Timeline(Arc<Inner>);

struct Inner {
    ring: Mutex<Ring>,
    tx: broadcast::Sender<TimelineEvent>,
}

#[derive(Default)]
struct Ring {
    events: VecDeque<TimelineEvent>,
    next: u64,
    /// Per failed path: when it failed, and when it last answered before.
    down: HashMap<usize, (Instant, Instant)>,
}

impl Default for Timeline {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Timeline({} events)", self.lock().events.len())
    }
}

impl Timeline {
    pub fn new() -> Self {
        // A subscriber that falls this far behind loses the oldest events
        // (and is told so), never the volume's time.
        let (tx, _) = broadcast::channel(KEPT);
        Self(Arc::new(Inner {
            ring: Mutex::new(Ring::default()),
            tx,
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.0.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every event to come, as it happens.
    pub fn subscribe(&self) -> broadcast::Receiver<TimelineEvent> {
        self.0.tx.subscribe()
    }

    /// The events kept, oldest first.
    pub fn recent(&self) -> Vec<TimelineEvent> {
        self.lock().events.iter().cloned().collect()
    }

    /// Keeps and announces one event.
    pub fn record(
        &self,
        kind: EventKind,
        path: Option<usize>,
        text: impl Into<String>,
        took: Option<Duration>,
    ) {
        let mut ring = self.lock();
        let ev = TimelineEvent {
            seq: ring.next,
            at: SystemTime::now(),
            kind,
            path,
            text: text.into(),
            took,
        };
        ring.next += 1;
        if ring.events.len() == KEPT {
            ring.events.pop_front();
        }
        ring.events.push_back(ev.clone());
        // Sent under the lock, so subscribers see events in `seq` order.
        let _ = self.0.tx.send(ev);
    }

    /// Path `path` (1-based) failed after `silent` without a reply;
    /// `moved` says whether it had requests that went elsewhere (only then
    /// is there a failover to time).
    pub fn path_failed(&self, path: usize, text: &str, silent: Duration, moved: bool) {
        let now = Instant::now();
        let last_reply = now.checked_sub(silent).unwrap_or(now);
        self.lock().down.insert(path, (now, last_reply));
        self.record(
            EventKind::PathFailed,
            Some(path),
            text,
            moved.then_some(silent),
        );
    }

    /// The fence of failed path `path` was confirmed and its writes sent.
    pub fn fenced(&self, path: usize, text: &str) {
        let took = self.lock().down.get(&path).map(|(_, last)| last.elapsed());
        self.record(EventKind::Fenced, Some(path), text, took);
    }

    /// Failed path `path` is back.
    pub fn restored(&self, path: usize, text: &str) {
        let took = self.lock().down.remove(&path).map(|(at, _)| at.elapsed());
        self.record(EventKind::PathRestored, Some(path), text, took);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_events_in_order_and_announces_each() {
        let t = Timeline::new();
        let mut rx = t.subscribe();
        for i in 0..KEPT + 5 {
            t.record(EventKind::PolicySwitched, None, format!("e{i}"), None);
        }
        let kept = t.recent();
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept[0].seq, 5);
        assert_eq!(kept.last().unwrap().text, format!("e{}", KEPT + 4));
        assert!(kept.windows(2).all(|w| w[1].seq == w[0].seq + 1));
        // The subscriber lagged by five: it is told, then reads on.
        assert!(matches!(
            rx.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(5))
        ));
        assert_eq!(rx.try_recv().unwrap().seq, 5);
    }

    #[test]
    fn a_failover_is_timed_from_the_last_reply_and_a_failback_from_the_failure() {
        let t = Timeline::new();
        t.path_failed(2, "failed", Duration::from_millis(500), true);
        t.fenced(2, "fenced");
        t.restored(2, "restored");
        let ev = t.recent();
        let took: Vec<_> = ev.iter().map(|e| e.took).collect();
        assert_eq!(took[0], Some(Duration::from_millis(500)));
        assert!(took[1].unwrap() >= Duration::from_millis(500));
        assert!(
            took[2].is_some(),
            "a failback says how long the path was down"
        );
        assert_eq!(ev[2].kind.name(), "path-restored");
        assert_eq!(ev[2].path, Some(2));
        // A path that failed idle moved nothing: no failover to time.
        t.path_failed(1, "failed", Duration::from_secs(3), false);
        assert_eq!(t.recent().last().unwrap().took, None);
    }
}
