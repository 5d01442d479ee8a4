//! A path's queue depth (`--path ...,queue-depth=N`): the most requests
//! kept in flight on it. Applied to the views every policy reads, so every
//! policy skips a full path as it skips a busy one, and places on the
//! others; what no path has room for waits, in order, in a backlog that a
//! reply (which frees room) lets go. Unlike `waiting`, the backlog has
//! paths: it is not subject to the no-path timeout.

use std::time::Duration;

use braid_policy::PathView;

use super::{Engine, Piece};
use crate::path::Path;

/// Narrows the views' `usable` to paths with room. Returns whether a path
/// usable but for its depth was left out (then what finds no path waits in
/// the backlog, not for a path).
pub(super) fn apply(paths: &[Path], views: &mut [PathView]) -> bool {
    let mut full = false;
    for (p, v) in paths.iter().zip(views.iter_mut()) {
        if v.usable && p.full() {
            v.usable = false;
            full = true;
        }
    }
    full
}

impl Engine {
    /// Whether a piece that found no path waits for room, not for a path.
    pub(super) fn only_full(&self) -> bool {
        self.depth_full
    }

    pub(super) fn wait_for_room(&mut self, piece: Piece) {
        self.backlog.push_back(piece);
    }

    /// Sends what waits for room, oldest first, while a path has some.
    pub(super) fn release_backlog(&mut self, now: Duration) {
        while !self.backlog.is_empty() {
            self.refresh_views(now);
            if !self.views.iter().any(|v| v.usable) {
                if !self.depth_full {
                    // No path at all any more: the backlog waits for one,
                    // under the no-path timeout.
                    self.waiting.extend(self.backlog.drain(..));
                }
                return;
            }
            let p = self.backlog.pop_front().expect("not empty");
            let before = self.backlog.len();
            if self.dispatch(now, p).is_none() && self.backlog.len() > before {
                // It went back: put it first again and stop.
                let p = self.backlog.pop_back().expect("just pushed");
                self.backlog.push_front(p);
                return;
            }
        }
    }
}
