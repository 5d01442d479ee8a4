//! The simulated target: what it holds (a volatile cache over durable
//! storage), which process answers (an instance that changes at each
//! power cut), and what happens to each message on the way.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

use super::check::Content;
use super::{Ev, FenceTask, Link, Signal, Sim, RETRANSMIT};
use crate::{Instance, Op, PathId};
use braid_proto::braid_ns::ConnId;

/// The storage host.
pub(super) struct Target {
    pub instance: u128,
    pub up: bool,
    /// Written, not yet durable.
    cache: HashMap<u64, Content>,
    durable: HashMap<u64, Content>,
    /// Target connection id → the instance it was made with.
    conns: HashMap<u64, u128>,
    /// Per initiator port (path): the instance it last logged in to, so
    /// that a port's first session after a start is told of the power on.
    seen: Vec<u128>,
    /// Connections whose next command is to be told of the power on, and
    /// those whose answer telling it is on the way (the session's later
    /// answers come after it).
    told: HashSet<u64>,
    telling: HashSet<u64>,
    pub restarts: u64,
}

impl Target {
    pub fn new(paths: usize) -> Self {
        Self {
            instance: 1,
            up: true,
            cache: HashMap::new(),
            durable: HashMap::new(),
            conns: HashMap::new(),
            seen: vec![1; paths],
            told: HashSet::new(),
            telling: HashSet::new(),
            restarts: 0,
        }
    }

    pub fn connected(&mut self, conn: u64, _path: usize) {
        self.conns.insert(conn, self.instance);
    }

    /// Whether a connection still leads to a live process.
    fn alive(&self, conn: u64) -> bool {
        self.up && self.conns.get(&conn) == Some(&self.instance)
    }

    fn read(&self, block: u64) -> Content {
        self.cache
            .get(&block)
            .or_else(|| self.durable.get(&block))
            .copied()
            .unwrap_or(Content::Zero)
    }

    pub fn durable(&self, block: u64) -> Content {
        self.durable.get(&block).copied().unwrap_or(Content::Zero)
    }

    fn write(&mut self, block: u64, c: Content, fua: bool) {
        self.cache.insert(block, c);
        if fua {
            self.durable.insert(block, c);
        }
    }

    fn flush(&mut self) {
        for (b, c) in self.cache.drain() {
            self.durable.insert(b, c);
        }
    }

    /// The power goes: what was not durable is gone, but for a random
    /// share of it when `keep` (a cache that drained part way).
    pub fn lose_power(&mut self, rng: &mut StdRng, keep: bool) {
        let mut cache: Vec<(u64, Content)> = self.cache.drain().collect();
        cache.sort_unstable_by_key(|(b, _)| *b);
        for (b, c) in cache {
            if keep && rng.gen_bool(0.5) {
                self.durable.insert(b, c);
            }
        }
    }
}

impl Sim {
    /// The target loses power; it comes back as another instance a little
    /// later. Some initiator connections see a reset at once (the host's
    /// kernel answers for the dead process); others hear nothing.
    pub(super) fn power_cut(&mut self) {
        if self.trace {
            eprintln!("{:?}: power cut", self.now);
        }
        let keep = self.cfg.keep_dirty;
        self.target.lose_power(&mut self.rng, keep);
        self.target.up = false;
        self.target.restarts += 1;
        self.target.told.clear();
        self.target.telling.clear();
        for path in 0..self.conn_ids.len() {
            if self.rng.gen_bool(0.5) {
                let l = self.latency();
                self.at(l, Ev::Reset(PathId(path), self.conn_ids[path]));
            }
        }
        let down = Duration::from_millis(self.rng.gen_range(10..300));
        self.at(down, Ev::PowerOn);
    }

    pub(super) fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Arrive(f) => {
                if self.closed.contains(&f.server_conn) || !self.target.alive(f.server_conn) {
                    return; // given up, or the process it was for is gone
                }
                if self.links[f.path] != Link::Up {
                    self.at(RETRANSMIT, Ev::Arrive(f));
                    return;
                }
                if self.target.told.remove(&f.server_conn) {
                    self.target.telling.insert(f.server_conn);
                    let l = self.latency();
                    self.at(l, Ev::Attention(f));
                    return;
                }
                // Service time; now and then a long stall (a held write, a
                // slow FLUSH).
                let service = if self.cfg.stalls && self.rng.gen_ratio(1, 20) {
                    Duration::from_millis(self.rng.gen_range(200..1500))
                } else {
                    Duration::from_micros(self.rng.gen_range(10..500))
                };
                self.at(service, Ev::Execute(f));
            }
            Ev::Execute(f) => self.execute(f),
            Ev::Reply(f, value) => {
                if self.closed.contains(&f.server_conn) || !self.target.alive(f.server_conn) {
                    return;
                }
                if self.links[f.path] != Link::Up || self.target.telling.contains(&f.server_conn) {
                    self.at(RETRANSMIT, Ev::Reply(f, value));
                    return;
                }
                if let (Some(v), Some(info)) = (value, self.engine.chunk(f.cookie)) {
                    let blocks = info.req.and_then(|r| self.reqs.get(&r)).map(|r| r.blocks);
                    if let (Some(req), Some(blocks)) = (info.req, blocks) {
                        let seen = self
                            .read_values
                            .entry(req)
                            .or_insert_with(|| vec![None; blocks as usize]);
                        let at = (info.req_offset / super::BLOCK) as usize;
                        for (i, c) in v.into_iter().enumerate() {
                            if let Some(slot) = seen.get_mut(at + i) {
                                *slot = Some(c);
                            }
                        }
                    }
                }
                self.engine.reply(self.now, f.cookie, Ok(()));
                self.pump();
            }
            Ev::Attention(f) => {
                if self.closed.contains(&f.server_conn) || !self.target.alive(f.server_conn) {
                    return;
                }
                if self.links[f.path] != Link::Up {
                    self.at(RETRANSMIT, Ev::Attention(f));
                    return;
                }
                self.target.telling.remove(&f.server_conn);
                // The session reports it and sends the command again.
                let how = "a unit attention told of a power on (29h)";
                self.engine.restart_signalled(self.now, PathId(f.path), how);
                self.pump();
                let l = self.latency();
                self.at(l, Ev::Arrive(f));
            }
            Ev::FenceTry(task) => {
                if !self.fence_wanted(&task) {
                    return; // the driver stops fencing what is not held
                }
                // Fences are slow, late and fail: a busy target, a lost
                // connection, no working path for a while.
                if !self.target.up || !self.links.contains(&Link::Up) || self.rng.gen_ratio(1, 4) {
                    let backoff = Duration::from_millis(self.rng.gen_range(50..300));
                    self.at(backoff, Ev::FenceTry(task));
                    return;
                }
                let travel = self.latency();
                let slow = Duration::from_millis(self.rng.gen_range(0..800));
                self.at(travel + slow, Ev::FenceAtTarget(task));
            }
            Ev::FenceAtTarget(task) => self.fence_at_target(task),
            Ev::FenceReply(task) => {
                if !self.links.contains(&Link::Up) {
                    // The confirmation was lost: ask again (fencing twice
                    // is harmless).
                    let backoff = Duration::from_millis(self.rng.gen_range(50..300));
                    self.at(backoff, Ev::FenceTry(task));
                    return;
                }
                if self.fence_wanted(&task) {
                    self.fence_done(&task);
                    self.pump();
                }
            }
            Ev::Reconnect(path) => self.reconnect(path),
            Ev::Reset(path, conn) => {
                if self.conn_ids[path.0] == conn {
                    let why = "connection reset by the target's host";
                    self.engine.path_failed(self.now, path, why);
                    self.pump();
                }
            }
            Ev::PowerOn => {
                self.target.instance += 1;
                self.target.up = true;
            }
        }
    }

    fn execute(&mut self, f: super::InFlight) {
        if self.fenced.contains(&f.server_conn) || !self.target.alive(f.server_conn) {
            return; // dropped by the fence, or by the power cut
        }
        if let Some(b) = self.trace_block {
            if (f.block..f.block + f.blocks).contains(&b) {
                eprintln!(
                    "{:?}: execute {:?} blocks {}+{} req {:?} path {} conn {} content {:?}",
                    self.now,
                    f.op,
                    f.block,
                    f.blocks,
                    f.req,
                    f.path,
                    f.server_conn,
                    f.contents.get((b - f.block) as usize)
                );
            }
        }
        let value = match f.op {
            Op::Write | Op::WriteZeroes | Op::Trim => {
                for (i, &c) in f.contents.iter().enumerate() {
                    let b = f.block + i as u64;
                    if self.lost.is_none() && !self.history.fresh(b, c, self.now) {
                        self.failures.push(format!(
                            "{:?}: stale write of {c:?} landed on block {b} over {:?} \
                             acknowledged",
                            self.now,
                            self.history.last_acked(b, self.now)
                        ));
                    }
                    let failed = f.req.is_some_and(|r| self.errored.contains(&r));
                    if !failed && f.req.is_some_and(|r| self.completed.contains(&r)) {
                        self.failures.push(format!(
                            "{:?}: stale write of {c:?} landed on block {b} after its request \
                             completed",
                            self.now
                        ));
                    }
                    self.target.write(b, c, f.fua);
                }
                None
            }
            Op::Read => Some(
                (f.block..f.block + f.blocks)
                    .map(|b| self.target.read(b))
                    .collect(),
            ),
            Op::Flush => {
                self.target.flush();
                None
            }
            _ => None,
        };
        let l = self.latency();
        self.at(l, Ev::Reply(f, value));
    }

    fn fence_at_target(&mut self, task: FenceTask) {
        if !self.target.up {
            self.at(RETRANSMIT, Ev::FenceTry(task));
            return;
        }
        let stale = task.conns.iter().any(|c| {
            self.target
                .conns
                .get(c)
                .is_some_and(|&i| i != self.target.instance)
        });
        if stale && self.cfg.signal == Signal::Instance {
            // braid's target refuses to fence connections it never
            // made; the fence's own connection names the new instance.
            self.engine.instance_seen(self.now, self.target.instance);
            self.pump();
            if self.fence_wanted(&task) {
                self.at(RETRANSMIT, Ev::FenceTry(task));
            }
            return;
        }
        self.fenced.extend(task.conns.iter().copied());
        let l = self.latency();
        self.at(l, Ev::FenceReply(task));
    }

    fn reconnect(&mut self, path: PathId) {
        if self.links[path.0] != Link::Up || !self.target.up {
            self.engine.reconnect_failed(path);
            self.pump();
            return;
        }
        self.next_conn += 1;
        let conn = self.next_conn;
        self.conn_ids[path.0] = conn;
        self.target.connected(conn, path.0);
        let first = self.target.seen[path.0] != self.target.instance;
        self.target.seen[path.0] = self.target.instance;
        let instance = match self.cfg.signal {
            _ if !self.cfg.restarts => Instance::Unknown,
            Signal::Instance => Instance::Known(self.target.instance),
            Signal::ResetAtLogin if first => Instance::ResetSeen,
            Signal::ResetLate if first => {
                self.target.told.insert(conn);
                Instance::Unknown
            }
            _ => Instance::Unknown,
        };
        self.engine.path_up_with(
            self.now,
            path,
            vec![Some(ConnId(u128::from(conn)))],
            true,
            instance,
        );
        self.pump();
    }
}
