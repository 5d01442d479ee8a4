//! Placing READs and WRITEs, and holding them while the policy would only
//! be guessing (see `Policy::hold`): at the start, before any path is
//! measured, a burst of requests would all be split as if the paths were
//! alike.

use std::time::Duration;

use braid_policy::Request as PolicyRequest;
use smallvec::SmallVec;

use super::{Engine, Op, Piece, ReqId, Submit, WRITE_PIECE};

impl Engine {
    /// Places a READ or WRITE now, or holds it until the policy can place
    /// it. A request submitted while others are held waits behind them, so
    /// requests go out in the order they came.
    pub(super) fn submit_data(&mut self, now: Duration, id: ReqId, s: Submit, since: Duration) {
        self.refresh_views(now);
        if !self.held.is_empty() || self.policy.hold(&self.views) || self.writeback_holds(id) {
            self.held.push_back((id, s, since));
            return;
        }
        self.place(now, id, &s, since);
    }

    /// Places held requests, oldest first, for as long as the policy lets
    /// go of them. Called wherever what the policy knows may have changed:
    /// a reply, the kernel's figures, a path up, failed or re-enabled, and
    /// every tick.
    pub(super) fn release_held(&mut self, now: Duration) {
        // Held requests came before the restart was seen: they wait for
        // its replay like the ones that came after.
        while !self.held.is_empty() && self.replay.is_none() {
            self.refresh_views(now);
            let front = self.held.front().expect("not empty").0;
            if self.policy.hold(&self.views) || self.writeback_holds(front) {
                return;
            }
            let (id, s, since) = self.held.pop_front().expect("not empty");
            self.place(now, id, &s, since);
        }
    }

    /// Splits a request by the policy's plan and sends its pieces (those
    /// the plan leaves unplaced go to `dispatch`). `since` is when the
    /// request came, for the no-path timeout.
    pub(super) fn place(&mut self, now: Duration, id: ReqId, s: &Submit, since: Duration) {
        let piece = |req_offset: u64, len: u64| Piece::of(id, s, req_offset, len, since);
        // On the stack for the usual few pieces: this runs for every request.
        let mut placed: SmallVec<[(Piece, Option<usize>); 4]> = SmallVec::new();
        self.refresh_views(now);
        let req = PolicyRequest {
            len: s.len,
            write: s.op == Op::Write,
        };
        let plan = self.policy.plan(&req, &self.views, &self.cfg.split);
        if plan.is_empty() {
            let mut at = 0;
            while at < s.len || (at == 0 && s.len == 0) {
                let n = (s.len - at).min(self.cfg.split.max.max(1));
                placed.push((piece(at, n), None));
                at += n.max(1);
            }
        } else {
            let step = if s.op == Op::Write {
                WRITE_PIECE.max(self.cfg.split.align)
            } else {
                u64::MAX
            };
            for a in plan {
                let mut at = 0;
                loop {
                    let n = (a.len - at).min(step);
                    placed.push((piece(a.offset + at, n), Some(a.path)));
                    at += n;
                    if at >= a.len {
                        break;
                    }
                }
            }
        }
        if let Some(r) = self.reqs.get_mut(&id.0) {
            r.pending = placed.len() as u32;
            r.placed = now;
            r.split = bytes_per_path(&placed);
        }
        for (p, path) in placed {
            match path {
                Some(path) => self.send(now, p, path),
                None => {
                    self.dispatch(now, p);
                }
            }
        }
    }
}

/// Bytes per path of pieces the plan placed; empty unless all were
/// placed and on more than one path.
fn bytes_per_path(placed: &[(Piece, Option<usize>)]) -> Vec<(usize, u64)> {
    // Most requests go whole to one path: they need no vector at all.
    let first = placed.first().and_then(|(_, path)| *path);
    let unplaced = placed.iter().any(|(_, path)| path.is_none());
    if unplaced || placed.iter().all(|(_, path)| *path == first) {
        return Vec::new();
    }
    let mut per: Vec<(usize, u64)> = Vec::new();
    for (p, path) in placed
        .iter()
        .filter_map(|(p, path)| path.map(|path| (p, path)))
    {
        match per.iter_mut().find(|(q, _)| *q == path) {
            Some((_, b)) => *b += u64::from(p.len),
            None => per.push((path, u64::from(p.len))),
        }
    }
    per
}
