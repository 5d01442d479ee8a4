//! The engine's events as log lines: one per event, in the span of the
//! path it is about (inside the volume's), so the text need not name
//! either.

use std::time::Duration;

use tracing::{error, info, warn};

use super::core::Core;
use super::timeline::EventKind;
use crate::engine::{Event, PathId};

impl Core {
    /// Logs an event and keeps it in the volume's timeline (`timeline.rs`).
    pub(super) fn log(&mut self, now: Duration, ev: Event) {
        let span = match &ev {
            Event::PathFailed { path, .. }
            | Event::Fenced { path, .. }
            | Event::PathRestored { path }
            | Event::RestartAlreadyHandled { path } => self.paths[path.0].span.clone(),
            Event::NoPathTimeout { .. }
            | Event::TargetRestarted { .. }
            | Event::Replayed { .. }
            | Event::Lost { .. }
            | Event::WritebackFailed { .. } => self.span.clone(),
        };
        let _entered = span.enter();
        match ev {
            Event::PathFailed {
                path,
                reason,
                resent,
                held,
                queued,
            } => {
                let mut parts = Vec::new();
                for (to, n) in &resent {
                    parts.push(format!("{n} requests re-sent on path {}", to.0 + 1));
                }
                if held > 0 {
                    parts.push(format!("{held} writes held until the target fences it"));
                }
                if queued > 0 {
                    parts.push(format!("{queued} waiting for a path"));
                }
                let tail = if parts.is_empty() {
                    String::new()
                } else {
                    format!("; {}", parts.join(", "))
                };
                let line = format!("failed: {reason}{tail}");
                warn!("{line}");
                let silent = self.engine.path_report(path, now).idle;
                let moved = held + queued > 0 || !resent.is_empty();
                self.timeline.path_failed(path.0 + 1, &line, silent, moved);
                if held == 0
                    && !self.warned_no_fencing
                    && !resent.is_empty()
                    && !self.engine_fences(path)
                {
                    self.warned_no_fencing = true;
                    warn!(
                        "the target does not fence (x-braid:fence): writes of a failed path are \
                         re-sent once its connections are closed, which a plain NBD server \
                         cannot guarantee to be final"
                    );
                }
            }
            Event::Fenced {
                path,
                fence,
                resent,
            } => {
                let n: usize = resent.iter().map(|(_, n)| n).sum();
                let line = format!("fenced by the target; {n} writes re-sent");
                info!(fence = fence.0, "{line}");
                self.timeline.fenced(path.0 + 1, &line);
            }
            Event::PathRestored { path } => {
                info!("restored");
                self.timeline.restored(path.0 + 1, "restored");
            }
            Event::NoPathTimeout { failed } => {
                let line = format!(
                    "no path for longer than the no-path timeout: {failed} requests failed with EIO"
                );
                warn!("{line}");
                self.timeline
                    .record(EventKind::NoPathTimeout, None, line, None);
            }
            Event::TargetRestarted {
                how,
                replay_bytes,
                replay_extents,
                resent,
            } => {
                let line = format!(
                    "the target restarted ({how}): writing again {replay_extents} writes \
                     ({replay_bytes} bytes) it acknowledged since the last FLUSH and may have \
                     lost, and {resent} pieces of writes still under way, before anything else"
                );
                warn!(replay_bytes, replay_extents, resent, "{line}");
                self.timeline
                    .record(EventKind::TargetRestarted, None, line, None);
            }
            Event::Replayed {
                bytes,
                took,
                failed: None,
                ..
            } => {
                let line = "replay done: the restarted target has back what it had acknowledged";
                info!(bytes, ms = took.as_millis() as u64, "{line}");
                self.timeline.record(
                    EventKind::Replayed,
                    None,
                    format!("{line} ({bytes} bytes)"),
                    Some(took),
                );
            }
            Event::Replayed {
                failed: Some(why),
                took,
                ..
            } => {
                let line = format!("replay failed: {why}");
                error!("{line}");
                self.timeline
                    .record(EventKind::Replayed, None, line, Some(took));
            }
            Event::RestartAlreadyHandled { path } => {
                let line = "the new session was told of a power on or reset: the restart \
                            already handled (a path that came up since it still answers)";
                info!("{line}");
                self.timeline.record(
                    EventKind::RestartAlreadyHandled,
                    Some(path.0 + 1),
                    line,
                    None,
                );
            }
            Event::Lost { cause } => {
                let line = format!("acknowledged writes may have been lost: {cause}");
                error!(
                    "{line}. Every FLUSH and FUA write of this volume fails with EIO until the \
                     volume is detached or `braid clear-loss` is run"
                );
                self.timeline.record(EventKind::Lost, None, line, None);
            }
            Event::WritebackFailed { error, retry } => {
                let line = format!(
                    "braid's own FLUSH (sent to keep the replay window from filling) failed: \
                     {error}; the window keeps what it covered, and another goes in {} s",
                    retry.as_secs()
                );
                warn!(
                    "{line}. While FLUSHes fail the window may fill, and a restart of the \
                     target would then lose writes"
                );
                self.timeline
                    .record(EventKind::WritebackFailed, None, line, None);
            }
        }
    }

    fn engine_fences(&self, path: PathId) -> bool {
        self.engine.path_report(path, Duration::ZERO).fencing
    }
}
