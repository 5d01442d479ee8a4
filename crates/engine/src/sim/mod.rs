//! A deterministic simulation of the engine against a simulated target over
//! paths that are cut, blackholed, slowed and restored at random, with a
//! virtual clock and a seed. The target has a volatile cache that FLUSH
//! and FUA make durable, and may lose power and come back as another
//! instance, telling new connections so by name or by a reset sign (as
//! NBD and iSCSI targets do). Invariants are checked after every step:
//!
//! - every request completes exactly once;
//! - nothing is sent on a path the engine considers failed;
//! - a write never lands over data newer than it that was acknowledged
//!   (fencing works, and a replay or a re-sent piece is never stale);
//! - a read returns what the last write acknowledged before it was
//!   submitted left, or something newer;
//! - a FLUSH or FUA write that succeeded left on durable storage, for
//!   every block, the last write acknowledged before it or something
//!   newer; after the final FLUSH, a power cut loses nothing acknowledged;
//! - once a loss is reported, no FLUSH succeeds;
//! - once every path is back, everything completes; with no path past the
//!   deadline, requests fail instead of hanging.
//!
//! The default configuration is the original one (one block per request,
//! no restarts): its seeds keep the meaning they had.

mod check;
mod fence_runs;
mod restart_runs;
mod target;
mod verify;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use braid_block::Flags;
use braid_policy::{by_name, PolicyOptions, SplitRules};
use braid_proto::braid_ns::ConnId;
use braid_proto::Cookie;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use check::{stamp, unstamp, Content, History};

const BLOCK: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    Up,
    /// Every packet dropped: nothing gets through, but, as with TCP, what
    /// was sent on a connection is sent again and arrives once the link
    /// heals, unless the connection was closed meanwhile.
    Blackhole,
}

/// How often a blackholed message is tried again.
const RETRANSMIT: Duration = Duration::from_millis(50);

/// How a restarted target tells new connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    /// By name (`x-braid:instance`, braid's VPD page).
    Instance,
    /// A new session's first command (at login) is told of a power on.
    ResetAtLogin,
    /// The first command of a new session after it carries I/O is told
    /// (sent again by the session, as iSCSI sessions do), so commands out
    /// beside it may have been answered by the new target already.
    ResetLate,
}

/// What a run simulates.
#[derive(Clone, Debug)]
pub(crate) struct SimConfig {
    pub blocks: u64,
    /// The largest request, in blocks.
    pub max_blocks: u64,
    pub link_faults: bool,
    /// Now and then a request stalls at the target for up to 1.5 s.
    pub stalls: bool,
    /// The target loses power now and then and comes back.
    pub restarts: bool,
    pub signal: Signal,
    /// WRITE_ZEROES and TRIM among the writes, and FUA on some.
    pub zeroes: bool,
    pub fua: bool,
    /// A power cut keeps a random share of what was not yet durable (a
    /// disk's cache drains partly before it dies).
    pub keep_dirty: bool,
    pub window: u64,
    pub steps: usize,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            blocks: 16,
            max_blocks: 1,
            link_faults: true,
            stalls: true,
            restarts: false,
            signal: Signal::Instance,
            zeroes: false,
            fua: false,
            keep_dirty: false,
            window: 256 << 20,
            steps: 3000,
        }
    }
}

/// A request as it travels: sent on (path, conn, target connection id).
#[derive(Clone, Debug)]
struct InFlight {
    cookie: Cookie,
    path: usize,
    server_conn: u64,
    op: Op,
    block: u64,
    blocks: u64,
    /// What a write puts in each of its blocks.
    contents: Vec<Content>,
    fua: bool,
    req: Option<ReqId>,
}

#[derive(Debug)]
enum Ev {
    /// A request reaches the target (if the link still carries it).
    Arrive(InFlight),
    /// The target executes it (unless that connection was fenced).
    Execute(InFlight),
    /// The reply reaches the initiator.
    Reply(InFlight, Option<Vec<Content>>),
    /// The first command of a new session is told of a power on; the
    /// session sends it again.
    Attention(InFlight),
    /// The driver asks the target to fence (over any working path); the
    /// attempt may fail and is then tried again, as the driver does.
    FenceTry(FenceTask),
    /// The fence reaches the target, which from then on drops whatever
    /// those connections still hold.
    FenceAtTarget(FenceTask),
    /// The target's confirmation reaches the driver.
    FenceReply(FenceTask),
    Reconnect(PathId),
    /// The initiator's kernel sees a connection reset (the dead target's
    /// host answered with RST).
    Reset(PathId, u64),
    /// The target is back after a power cut.
    PowerOn,
}

/// One fence the engine asked for, as the driver carries it out.
#[derive(Clone, Debug)]
struct FenceTask {
    fence: FenceId,
    conns: Vec<u64>,
}

/// A user request as the simulation knows it.
#[derive(Clone, Debug)]
struct Req {
    op: Op,
    block: u64,
    blocks: u64,
    submitted: Duration,
    /// Per block, its place in the history (writes).
    writes: Vec<usize>,
    fua: bool,
}

struct Sim {
    cfg: SimConfig,
    rng: StdRng,
    now: Duration,
    engine: Engine,
    links: Vec<Link>,
    /// Per path: the target's id of its current connection.
    conn_ids: Vec<u64>,
    next_conn: u64,
    fenced: HashSet<u64>,
    /// Target connection ids the initiator has closed: what was still on
    /// the way on them is never delivered (requests already at the target
    /// may still run: that is what fencing is for).
    closed: HashSet<u64>,
    target: target::Target,
    events: BTreeMap<(Duration, u64), Ev>,
    seq: u64,
    reqs: HashMap<ReqId, Req>,
    history: History,
    /// Per block: writes submitted and not completed.
    writing: HashMap<u64, u32>,
    completed: HashSet<ReqId>,
    /// Requests that completed with an error.
    errored: HashSet<ReqId>,
    /// What reads saw, per block of the request.
    read_values: HashMap<ReqId, Vec<Option<Content>>>,
    next_version: u64,
    /// The engine reported a loss (and when).
    lost: Option<Duration>,
    failures: Vec<String>,
    /// Print the engine's events, and what happens to one block.
    trace: bool,
    trace_block: Option<u64>,
}

impl Sim {
    fn new(seed: u64, paths: usize, policy: &str) -> Self {
        Self::with(seed, paths, policy, SimConfig::default())
    }

    fn with(seed: u64, paths: usize, policy: &str, cfg: SimConfig) -> Self {
        let big = cfg.max_blocks > 1;
        let mut engine = Engine::new(
            EngineConfig {
                split: SplitRules {
                    align: BLOCK,
                    chunk: if big { 16 * BLOCK } else { BLOCK },
                    max: if big { 256 * BLOCK } else { 4 * BLOCK },
                },
                size: BLOCK * cfg.blocks,
                min_block: 1,
                timeout_floor: Duration::from_millis(200),
                timeout_ceiling: Duration::from_secs(2),
                no_path_timeout: Some(Duration::from_secs(5)),
                probe_interval: Duration::from_millis(500),
                reconnect_min: Duration::from_millis(50),
                reconnect_max: Duration::from_millis(400),
                replay_window: cfg.window,
                ..EngineConfig::default()
            },
            by_name(policy, &PolicyOptions::default()).unwrap(),
        );
        let mut target = target::Target::new(paths);
        let mut conn_ids = Vec::new();
        for i in 0..paths {
            let p = engine.add_path(PathConfig::default(), Duration::ZERO);
            let conn = i as u64 + 1;
            target.connected(conn, i);
            let instance = match cfg.signal {
                Signal::Instance if cfg.restarts => Instance::Known(target.instance),
                _ => Instance::Unknown,
            };
            engine.path_up_with(
                Duration::ZERO,
                p,
                vec![Some(ConnId(u128::from(conn)))],
                true,
                instance,
            );
            conn_ids.push(conn);
        }
        let mut s = Self {
            cfg,
            rng: StdRng::seed_from_u64(seed),
            now: Duration::ZERO,
            engine,
            links: vec![Link::Up; paths],
            next_conn: paths as u64 + 1,
            conn_ids,
            fenced: HashSet::new(),
            closed: HashSet::new(),
            target,
            events: BTreeMap::new(),
            seq: 0,
            reqs: HashMap::new(),
            history: History::default(),
            writing: HashMap::new(),
            completed: HashSet::new(),
            errored: HashSet::new(),
            read_values: HashMap::new(),
            next_version: 1,
            lost: None,
            failures: Vec::new(),
            trace: false,
            trace_block: None,
        };
        s.pump();
        s
    }

    fn at(&mut self, delay: Duration, ev: Ev) {
        self.seq += 1;
        self.events.insert((self.now + delay, self.seq), ev);
    }

    fn latency(&mut self) -> Duration {
        Duration::from_micros(self.rng.gen_range(100..3_000))
    }

    /// Carries out the engine's actions.
    fn pump(&mut self) {
        while let Some(a) = self.engine.poll_action() {
            match a {
                Action::Send(s) => self.send(s),
                Action::Complete { req, result } => self.complete(req, result),
                Action::Close { path } => {
                    self.closed.insert(self.conn_ids[path.0]);
                }
                Action::Fence { fence, conns, .. } => {
                    let conns = conns.iter().map(|c| c.0 as u64).collect();
                    let task = FenceTask { fence, conns };
                    self.at(Duration::ZERO, Ev::FenceTry(task));
                }
                Action::Reconnect { path, after } => self.at(after, Ev::Reconnect(path)),
                Action::Forget { .. } => {}
                Action::Event(Event::Lost { .. }) => {
                    self.lost.get_or_insert(self.now);
                }
                Action::Event(e) => {
                    if self.trace {
                        eprintln!("{:?}: {e:?}", self.now);
                    }
                }
            }
        }
    }

    fn send(&mut self, s: SendChunk) {
        if self.engine.path_state(s.path) == PathState::Failed {
            self.failures
                .push(format!("{:?}: sent on failed path {:?}", self.now, s.path));
        }
        let blocks = (u64::from(s.len) / BLOCK).max(1);
        let contents = match (s.op, &s.payload) {
            (Op::Write, Some(p)) => p.chunks(BLOCK as usize).map(unstamp).collect(),
            (Op::Write, None) => {
                self.failures
                    .push(format!("{:?}: a WRITE sent without data", self.now));
                Vec::new()
            }
            (Op::WriteZeroes | Op::Trim, _) => vec![Content::Zero; blocks as usize],
            _ => Vec::new(),
        };
        let f = InFlight {
            cookie: s.cookie,
            path: s.path.0,
            server_conn: self.conn_ids[s.path.0],
            op: s.op,
            block: s.offset / BLOCK,
            blocks,
            contents,
            fua: s.flags.fua(),
            req: s.req.filter(|r| self.reqs.contains_key(r)),
        };
        let l = self.latency();
        self.at(l, Ev::Arrive(f));
    }

    fn submit_random(&mut self) {
        let block = self.rng.gen_range(0..self.cfg.blocks);
        let mut op = match self.rng.gen_range(0..10) {
            0..=4 => Op::Write,
            5..=8 => Op::Read,
            _ => Op::Flush,
        };
        let mut blocks = 1;
        let mut fua = false;
        if self.cfg.max_blocks > 1 {
            blocks = self.request_blocks().min(self.cfg.blocks - block);
        }
        if op == Op::Write && self.cfg.zeroes {
            op = match self.rng.gen_range(0..10) {
                0 => Op::WriteZeroes,
                1 => Op::Trim,
                _ => Op::Write,
            };
        }
        if op.is_write() && self.cfg.fua {
            fua = self.rng.gen_ratio(1, 8);
        }
        // One write per block at a time: concurrent writes to one block
        // may land in either order, which NBD allows and which would blur
        // what a read must return.
        let busy = (block..block + blocks).any(|b| self.writing.get(&b).copied().unwrap_or(0) > 0);
        if op.is_write() && busy {
            op = Op::Read;
        }
        let (offset, len) = match op {
            Op::Flush => (0, 0),
            _ => (block * BLOCK, blocks * BLOCK),
        };
        let flags = if fua { Flags::FUA } else { Flags::empty() };
        let mut writes = Vec::new();
        let submit = match op {
            Op::Write => {
                self.next_version += 1;
                let v = self.next_version;
                let mut data = vec![0u8; len as usize];
                for (i, b) in (block..block + blocks).enumerate() {
                    data[i * BLOCK as usize..][..8].copy_from_slice(&stamp(v));
                    writes.push(self.history.submitted(b, Content::Data(v), self.now));
                }
                Submit::write(offset, flags, Payload::new(Bytes::from(data)))
            }
            Op::WriteZeroes | Op::Trim => {
                for b in block..block + blocks {
                    writes.push(self.history.submitted(b, Content::Zero, self.now));
                }
                Submit::new(op, offset, len, flags)
            }
            _ => Submit::new(op, offset, len, flags),
        };
        if op.is_write() {
            for b in block..block + blocks {
                *self.writing.entry(b).or_default() += 1;
            }
        }
        let id = self.engine.submit(self.now, submit);
        if let Some(b) = self.trace_block {
            if (block..block + blocks).contains(&b) || op == Op::Flush {
                eprintln!(
                    "{:?}: submit {id:?} {op:?} blocks {block}+{blocks} fua {fua}",
                    self.now
                );
            }
        }
        let req = Req {
            op,
            block,
            blocks,
            submitted: self.now,
            writes,
            fua,
        };
        self.reqs.insert(id, req);
        self.pump();
    }

    /// Mostly small requests, some of a MiB, a few as large as allowed.
    fn request_blocks(&mut self) -> u64 {
        let max = self.cfg.max_blocks;
        match self.rng.gen_range(0..100) {
            0..=59 => self.rng.gen_range(1..=4.min(max)),
            60..=89 => self.rng.gen_range(1..=64.min(max)),
            90..=97 => self.rng.gen_range(1..=256.min(max)),
            _ => self.rng.gen_range(1..=max),
        }
    }

    fn fault(&mut self) {
        let p = self.rng.gen_range(0..self.links.len());
        self.links[p] = match self.links[p] {
            Link::Up => Link::Blackhole,
            Link::Blackhole => Link::Up,
        };
    }

    /// One random step: maybe a request, rarely a fault, then some time.
    fn random_step(&mut self) {
        match self.rng.gen_range(0..100) {
            0..=39 => self.submit_random(),
            40..=42 if self.cfg.link_faults => self.fault(),
            40..=42 => {}
            _ => {}
        }
        if self.cfg.restarts && self.target.up && self.rng.gen_ratio(1, 400) {
            self.power_cut();
        }
        let step = Duration::from_micros(self.rng.gen_range(50..2_000));
        self.advance(step);
    }

    /// Runs the configured steps, then heals every link, lets it settle,
    /// and checks that a final FLUSH makes everything durable.
    fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            self.random_step();
        }
        self.settle();
    }

    fn settle(&mut self) {
        for l in &mut self.links {
            *l = Link::Up;
        }
        self.wait_idle();
        let id = self
            .engine
            .submit(self.now, Submit::new(Op::Flush, 0, 0, Flags::empty()));
        self.reqs.insert(
            id,
            Req {
                op: Op::Flush,
                block: 0,
                blocks: 0,
                submitted: self.now,
                writes: Vec::new(),
                fua: false,
            },
        );
        self.pump();
        self.wait_idle();
        if self.engine.outstanding() != 0 {
            self.failures.push(format!(
                "{} requests never completed",
                self.engine.outstanding()
            ));
        }
        let never: Vec<_> = self
            .reqs
            .keys()
            .filter(|r| !self.completed.contains(r))
            .collect();
        if !never.is_empty() {
            self.failures
                .push(format!("requests without completion: {never:?}"));
        }
        let seen = self.engine.volume_counters().restarts;
        let quiet = !self.cfg.link_faults && !self.cfg.stalls;
        if quiet && self.cfg.signal != Signal::ResetLate && seen > self.target.restarts {
            // Nothing but restarts failed paths: every restart seen was
            // real (several seen as one is fine).
            self.failures.push(format!(
                "{seen} restarts seen, {} happened",
                self.target.restarts
            ));
        }
        if self.lost.is_none() && !self.errored.contains(&id) {
            // The final FLUSH succeeded: a power cut now loses nothing
            // acknowledged.
            self.target.lose_power(&mut self.rng, false);
            let blocks: Vec<u64> = self.history.blocks().collect();
            for b in blocks {
                let durable = self.target.durable(b);
                if !self.history.fresh(b, durable, self.now) {
                    self.failures.push(format!(
                        "after the final FLUSH and a power cut, block {b} is {durable:?}, not \
                         {:?} acknowledged",
                        self.history.last_acked(b, self.now)
                    ));
                }
            }
        }
    }

    fn wait_idle(&mut self) {
        for _ in 0..3000 {
            self.advance(Duration::from_millis(10));
            if self.engine.outstanding() == 0 {
                break;
            }
        }
    }

    fn advance(&mut self, d: Duration) {
        let until = self.now + d;
        while let Some((&(t, seq), _)) = self.events.iter().next() {
            if t > until {
                break;
            }
            let ev = self.events.remove(&(t, seq)).expect("present");
            self.now = t;
            self.handle(ev);
        }
        self.now = until;
        self.engine.tick(self.now);
        self.pump();
    }

    fn fence_wanted(&self, task: &FenceTask) -> bool {
        self.engine.fence_pending(task.fence)
    }

    fn fence_done(&mut self, task: &FenceTask) {
        self.engine.fence_done(self.now, task.fence);
    }

    /// Like [`Sim::run`], calling `each` before every step.
    fn run_with(&mut self, mut each: impl FnMut(&mut Sim)) {
        for _ in 0..self.cfg.steps {
            each(self);
            self.random_step();
        }
    }
}
