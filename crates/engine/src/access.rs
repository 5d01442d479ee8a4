//! Asymmetric access (ALUA, SPC-5): the target says, per port, whether a
//! path should carry I/O. Paths whose port is active/optimized are used;
//! active/non-optimized ones only while no optimized path is usable;
//! standby, unavailable and transitioning ones never (what a transition
//! holds back waits for a path, up to the no-path timeout, so it is
//! retried, not failed). Applied to the views every policy reads, so
//! every policy honours it.
//!
//! A command the target refuses because of its port's state was not
//! executed: [`Engine::retry_elsewhere`] places it again at once, writes
//! included, with no fence needed.

use std::time::Duration;

use braid_policy::PathView;
use braid_proto::Cookie;

use super::{Engine, PathId, Piece};
use crate::path::Path;

/// A path's port as the target describes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Access {
    /// Active/optimized, and every path of a target without ALUA.
    #[default]
    Optimized,
    NonOptimized,
    Standby,
    Unavailable,
    Transitioning,
}

impl Access {
    pub fn name(self) -> &'static str {
        match self {
            Self::Optimized => "active/optimized",
            Self::NonOptimized => "active/non-optimized",
            Self::Standby => "standby",
            Self::Unavailable => "unavailable",
            Self::Transitioning => "transitioning",
        }
    }
}

impl Engine {
    /// The target reports `path`'s port in state `access`. What waits for
    /// a path is placed again, since the paths that may take it changed.
    pub fn set_access(&mut self, now: Duration, path: PathId, access: Access) {
        let Some(p) = self.paths.get_mut(path.0) else {
            return;
        };
        if p.access == access {
            return;
        }
        p.access = access;
        let waiting: Vec<Piece> = self.waiting.drain(..).collect();
        for piece in waiting {
            self.dispatch(now, piece);
        }
        self.release_held(now);
    }

    /// The target did not execute chunk `cookie` (its port cannot serve
    /// the unit now): it is placed again, on a path that may take it, or
    /// waits for one. Unknown or moved chunks are ignored.
    pub fn retry_elsewhere(&mut self, now: Duration, cookie: Cookie) {
        let Some(chunk) = self.chunks.remove(&cookie.0) else {
            return;
        };
        let p = &mut self.paths[chunk.path];
        p.released(chunk.conn, chunk.bytes);
        if let Some(mut piece) = chunk.piece {
            p.counters.resent += 1;
            piece.since = now;
            self.dispatch(now, piece);
        }
        self.release_held(now);
    }
}

/// Narrows the views' `usable` to the paths ALUA lets carry I/O.
pub(super) fn apply(paths: &[Path], views: &mut [PathView]) {
    let optimized = paths
        .iter()
        .zip(views.iter())
        .any(|(p, v)| v.usable && p.access == Access::Optimized);
    for (p, v) in paths.iter().zip(views.iter_mut()) {
        v.usable &= match p.access {
            Access::Optimized => true,
            Access::NonOptimized => !optimized,
            Access::Standby | Access::Unavailable | Access::Transitioning => false,
        };
    }
}
