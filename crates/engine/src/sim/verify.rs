//! What the simulation checks as requests complete: exactly once, reads
//! fresh, and what a FLUSH or FUA write promised on durable storage.

use super::{Op, Req, ReqId, Sim};
use crate::IoError;

impl Sim {
    pub(super) fn complete(&mut self, req: ReqId, result: Result<(), IoError>) {
        if let Some(b) = self.trace_block {
            if let Some(r) = self.reqs.get(&req) {
                if (r.block..r.block + r.blocks).contains(&b) || r.op == Op::Flush {
                    eprintln!("{:?}: complete {req:?} {:?} {result:?}", self.now, r.op);
                }
            }
        }
        if !self.completed.insert(req) {
            self.failures.push(format!("{req:?} completed twice"));
        }
        let Some(r) = self.reqs.get(&req).cloned() else {
            self.failures
                .push(format!("{req:?} completed but never submitted"));
            return;
        };
        if result.is_err() {
            self.errored.insert(req);
        }
        if r.op.is_write() {
            for (i, b) in (r.block..r.block + r.blocks).enumerate() {
                *self.writing.entry(b).or_default() -= 1;
                if result.is_ok() {
                    self.history.acked(b, r.writes[i], self.now);
                }
            }
        }
        if r.op == Op::Read && result.is_ok() {
            self.check_read(req, &r);
        }
        let promised = r.op == Op::Flush || (r.op.is_write() && r.fua);
        if promised && result.is_ok() {
            if let Some(since) = self.lost {
                self.failures.push(format!(
                    "{:?}: a {:?} succeeded after the loss reported at {since:?}",
                    self.now, r.op
                ));
            }
            self.check_durable(&r);
        }
    }

    /// A read must see, in every block, the last write acknowledged before
    /// it was submitted, or newer: unless a loss was reported (it then
    /// cannot promise that).
    fn check_read(&mut self, req: ReqId, r: &Req) {
        let Some(seen) = self.read_values.get(&req).cloned() else {
            return;
        };
        if self.lost.is_some() {
            return;
        }
        for (i, &c) in seen.iter().enumerate() {
            let b = r.block + i as u64;
            let Some(c) = c else {
                self.failures.push(format!(
                    "{:?}: read {req:?} left block {b} unread",
                    self.now
                ));
                continue;
            };
            if !self.history.fresh(b, c, r.submitted) {
                self.failures.push(format!(
                    "{:?}: read of block {b} saw {c:?}, older than {:?} acknowledged before it",
                    self.now,
                    self.history.last_acked(b, r.submitted)
                ));
            }
        }
    }

    /// A FLUSH (every block) or FUA write (its blocks) that succeeded: the
    /// durable copy holds what was acknowledged before it.
    fn check_durable(&mut self, r: &Req) {
        let blocks: Vec<u64> = if r.op == Op::Flush {
            self.history.blocks().collect()
        } else {
            (r.block..r.block + r.blocks).collect()
        };
        let at = if r.op == Op::Flush {
            r.submitted
        } else {
            self.now
        };
        for b in blocks {
            let durable = self.target.durable(b);
            if !self.history.fresh(b, durable, at) {
                self.failures.push(format!(
                    "{:?}: {:?} succeeded but block {b} is durably {durable:?}, older than {:?} \
                     acknowledged before it",
                    self.now,
                    r.op,
                    self.history.last_acked(b, at)
                ));
            }
        }
    }
}
