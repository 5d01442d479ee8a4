//! The engine's events as log lines: one per event, in the span of the
//! path it is about (inside the volume's), so the text need not name
//! either.

use std::time::Duration;

use tracing::{error, info, warn};

use super::core::Core;
use crate::engine::{Event, PathId};

impl Core {
    pub(super) fn log(&mut self, ev: Event) {
        let span = match &ev {
            Event::PathFailed { path, .. }
            | Event::Fenced { path, .. }
            | Event::PathRestored { path }
            | Event::RestartAlreadyHandled { path } => self.paths[path.0].span.clone(),
            Event::NoPathTimeout { .. }
            | Event::TargetRestarted { .. }
            | Event::Replayed { .. }
            | Event::Lost { .. } => self.span.clone(),
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
                warn!("failed: {reason}{tail}");
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
            Event::Fenced { fence, resent, .. } => {
                let n: usize = resent.iter().map(|(_, n)| n).sum();
                info!(fence = fence.0, "fenced by the target; {n} writes re-sent");
            }
            Event::PathRestored { .. } => {
                info!("restored");
            }
            Event::NoPathTimeout { failed } => {
                warn!("no path for longer than the no-path timeout: {failed} requests failed with EIO");
            }
            Event::TargetRestarted {
                how,
                replay_bytes,
                replay_extents,
                resent,
            } => {
                warn!(
                    replay_bytes,
                    replay_extents,
                    resent,
                    "the target restarted ({how}): writing again {replay_extents} writes \
                     ({replay_bytes} bytes) it acknowledged since the last FLUSH and may have \
                     lost, and {resent} pieces of writes still under way, before anything else"
                );
            }
            Event::Replayed {
                bytes,
                took,
                failed: None,
                ..
            } => {
                info!(
                    bytes,
                    ms = took.as_millis() as u64,
                    "replay done: the restarted target has back what it had acknowledged"
                );
            }
            Event::Replayed {
                failed: Some(why), ..
            } => {
                error!("replay failed: {why}");
            }
            Event::RestartAlreadyHandled { .. } => {
                info!(
                    "the new session was told of a power on or reset: the restart already \
                     handled (another path that came up since it still answers)"
                );
            }
            Event::Lost { cause } => {
                error!(
                    "acknowledged writes may have been lost: {cause}. Every FLUSH and FUA write \
                     of this volume fails with EIO until the volume is detached or `braid \
                     clear-loss` is run"
                );
            }
        }
    }

    fn engine_fences(&self, path: PathId) -> bool {
        self.engine.path_report(path, Duration::ZERO).fencing
    }
}
