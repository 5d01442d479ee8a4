//! One path as the engine keeps it: state, connections, load, and the
//! figures that policies read and users see.

use std::time::Duration;

use braid_policy::PathView;

use super::stats::{Ewma, Histogram, MinFilter, RateFilter, RecentLatency};

/// Where a path is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathState {
    /// Connections being made (at start, or after a failure).
    Connecting,
    /// Carrying I/O.
    Active,
    /// Failed; the driver reconnects in the background.
    Failed,
    /// Connected but taken out of use by the user; in-flight requests
    /// finish. (Reported state only: see `enabled`.)
    Disabled,
}

impl PathState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Connecting => "connecting",
            Self::Active => "active",
            Self::Failed => "failed",
            Self::Disabled => "disabled",
        }
    }
}

/// User-set attributes of a path (`--path ...,weight=3`), read by the
/// policies that name them; the others ignore them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathConfig {
    /// `failover`: lower is preferred.
    pub priority: u32,
    /// `weighted`: lower is preferred (MPIO's weighted paths).
    pub weight: u32,
    /// `service-time`: relative throughput; 0 reads as 1.
    pub relative_throughput: u32,
    /// `round-robin-subset`: used only while no active path is usable.
    pub standby: bool,
    /// `round-robin`, `round-robin-subset`: consecutive requests per turn;
    /// 0 takes the policy's own.
    pub repeat_count: u32,
    /// Every policy: the most requests kept in flight on the path (0: no
    /// limit). A full path is skipped like a busy one; what no path has
    /// room for waits in order for the first that has.
    pub queue_depth: u32,
}

/// One connection of a path.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConnSlot {
    pub up: bool,
    /// The target's id for this connection (`x-braid:conn`), for fencing.
    pub server_id: Option<braid_proto::braid_ns::ConnId>,
    pub inflight_requests: u32,
    pub inflight_bytes: u64,
}

/// Counters of a path; each moves when a chunk on the path completes
/// (or, for `failures` and `resent`, when the path fails).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathCounters {
    pub reads: u64,
    pub writes: u64,
    /// Flush, trim, write zeroes, cache, block status, probes.
    pub others: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// Chunks the target answered with an error.
    pub errors: u64,
    /// Times this path failed.
    pub failures: u64,
    /// Times it came back after failing.
    pub restores: u64,
    /// Chunks moved from this path to others when it failed.
    pub resent: u64,
    /// The most requests the path has held in flight at once.
    pub max_inflight: u32,
}

#[derive(Debug)]
pub(crate) struct Path {
    pub config: PathConfig,
    pub state: PathState,
    pub conns: Vec<ConnSlot>,
    pub counters: PathCounters,
    /// Latencies of the user's requests (not probes) since the path was
    /// added, and over the last minute.
    pub latency_hist: Histogram,
    pub recent_latency: RecentLatency,
    /// Payload bytes per second while busy.
    pub throughput: RateFilter,
    /// Send-to-reply time of each chunk.
    pub service_time: Ewma,
    /// Base round trip: service time less the transfer time.
    pub latency: MinFilter,
    /// How much later than predicted the path's pieces of split requests
    /// tend to finish (see `lateness.rs`).
    pub lateness: crate::lateness::Lateness,
    /// Last time a reply arrived, or the path went from idle to busy.
    pub last_progress: Duration,
    /// Last time anything completed or was sent.
    pub last_activity: Duration,
    /// When the path last became active (or was created).
    pub since: Duration,
    /// Busy time and bytes since the last throughput sample.
    /// Kept full without a break since this time.
    full_since: Option<Duration>,
    /// Where completion-based sampling last stopped.
    mark: Duration,
    sample_bytes: u64,
    sample_busy: Duration,
    /// The kernel's cumulative bytes for the path at the last wire sample.
    wire_last: Option<(Duration, u64)>,
    /// When the kernel's figures last gave a capacity sample; while they
    /// keep coming, completions are not used to measure capacity.
    wire_sampled: Option<Duration>,
    /// Consecutive failed reconnects, for backoff.
    pub attempts: u32,
    /// The target answers `x-braid:fence`.
    pub fencing: bool,
    /// The user has not disabled the path for maintenance.
    pub enabled: bool,
    /// Evidence that the path is alive while its replies are late.
    pub liveness: super::liveness::Liveness,
    /// The target's word on the path's port (ALUA).
    pub access: super::Access,
    /// The restart of the target (see `restart.rs`) its connections lead
    /// to.
    pub epoch: u64,
}

/// Throughput is sampled over at least this much busy time, so one small
/// chunk does not swing it. A path's first sample is taken sooner (after
/// [`SAMPLE_BYTES`]): until then it is modelled as the average measured
/// path, and on unequal links that costs more than a rough first figure.
/// On 1gbit + 100mbit at queue depth 1, 1 MiB reads, the slow path was
/// measured after its first 512 KiB piece but the fast one only after five,
/// and those five requests were split evenly, each waiting 44 ms for its
/// slow half where 8 ms would do (0.2 s of a 3 s run).
const SAMPLE_BUSY: Duration = Duration::from_millis(20);

/// Bytes a throughput sample needs at least.
const SAMPLE_BYTES: u64 = 256 * 1024;

/// Kernel capacity samples older than this no longer keep completions
/// from being sampled.
const WIRE_FRESH: Duration = Duration::from_millis(500);

/// Bounds of the bytes in flight that keep a path full (see
/// `Path::saturated`).
const SATURATED_MIN: u64 = 16 * 1024;
const SATURATED_MAX: u64 = 256 * 1024;

impl Path {
    pub fn new(config: PathConfig, now: Duration) -> Self {
        Self {
            config,
            state: PathState::Connecting,
            conns: Vec::new(),
            counters: PathCounters::default(),
            latency_hist: Histogram::default(),
            recent_latency: RecentLatency::default(),
            throughput: RateFilter::default(),
            service_time: Ewma::default(),
            latency: MinFilter::default(),
            lateness: Default::default(),
            last_progress: now,
            last_activity: now,
            since: now,
            full_since: None,
            mark: now,
            sample_bytes: 0,
            sample_busy: Duration::ZERO,
            wire_last: None,
            wire_sampled: None,
            attempts: 0,
            fencing: false,
            enabled: true,
            liveness: Default::default(),
            access: Default::default(),
            epoch: 0,
        }
    }

    /// Bytes in flight that keep the link busy: twice its bandwidth-delay
    /// product (64 KiB until measured). With that much in flight, the
    /// delivery rate is the link's capacity, not the load offered to it.
    fn saturated(&self) -> u64 {
        match (self.throughput.get(), self.latency.get()) {
            (Some(t), Some(l)) => ((2.0 * t * l) as u64).clamp(SATURATED_MIN, SATURATED_MAX),
            _ => 64 * 1024,
        }
    }

    /// The state as users see it.
    pub fn reported_state(&self) -> PathState {
        if self.state == PathState::Active && !self.enabled {
            PathState::Disabled
        } else {
            self.state
        }
    }

    /// At its queue depth: nothing more may be sent on it for now.
    pub fn full(&self) -> bool {
        self.config.queue_depth > 0 && self.inflight_requests() >= self.config.queue_depth
    }

    pub fn usable(&self) -> bool {
        self.state == PathState::Active && self.enabled && self.conns.iter().any(|c| c.up)
    }

    pub fn inflight_requests(&self) -> u32 {
        self.conns.iter().map(|c| c.inflight_requests).sum()
    }

    pub fn inflight_bytes(&self) -> u64 {
        self.conns.iter().map(|c| c.inflight_bytes).sum()
    }

    /// The connection with the least in flight, for the next chunk.
    pub fn pick_conn(&self) -> Option<usize> {
        self.conns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.up)
            .min_by_key(|(_, c)| (c.inflight_bytes, c.inflight_requests))
            .map(|(i, _)| i)
    }

    pub fn view(&self, now: Duration) -> PathView {
        PathView {
            usable: self.usable(),
            standby: self.config.standby,
            priority: self.config.priority,
            weight: self.config.weight,
            relative_throughput: self.config.relative_throughput.max(1),
            repeat: self.config.repeat_count,
            inflight_requests: self.inflight_requests(),
            inflight_bytes: self.inflight_bytes(),
            throughput: self.throughput.or_zero(),
            service_time: self.service_time.or_zero(),
            latency: self.latency.or_zero(),
            lateness: self.lateness.get(),
            idle: now.saturating_sub(self.last_activity).as_secs_f64(),
        }
    }

    /// Accounts a chunk sent on connection `conn`.
    pub fn sent(&mut self, conn: usize, bytes: u64, now: Duration) {
        if self.inflight_requests() == 0 {
            self.last_progress = now;
        }
        let c = &mut self.conns[conn];
        c.inflight_requests += 1;
        c.inflight_bytes += bytes;
        self.counters.max_inflight = self.counters.max_inflight.max(self.inflight_requests());
        self.last_activity = now;
        if self.full_since.is_none() && self.inflight_bytes() >= self.saturated() {
            self.full_since = Some(now);
            self.mark = now;
        }
    }

    /// Accounts a chunk's reply: load, progress and figures. `ahead` is the
    /// path's bytes in flight when the chunk was sent.
    pub fn completed(
        &mut self,
        conn: usize,
        bytes: u64,
        ahead: u64,
        sent_at: Duration,
        now: Duration,
    ) {
        if let Some(c) = self.conns.get_mut(conn) {
            c.inflight_requests = c.inflight_requests.saturating_sub(1);
            c.inflight_bytes = c.inflight_bytes.saturating_sub(bytes);
        }
        self.last_progress = now;
        self.last_activity = now;
        let service = now.saturating_sub(sent_at);
        self.liveness.replied(service);
        self.service_time.add(service.as_secs_f64(), 0.2);
        // Base latency comes only from chunks sent to an idle path: with
        // others ahead, the service time is mostly queueing, and splitting
        // it into latency and transfer by the throughput estimate couples
        // the two estimates' errors (seen at queue depth 16: "latencies" of
        // tens of milliseconds on a LAN, and paths starved for it).
        let transfer = match self.throughput.get().filter(|t| *t > 0.0) {
            Some(tput) => Some(bytes as f64 / tput),
            None => (bytes <= 4096).then_some(0.0),
        };
        if let (0, Some(transfer)) = (ahead, transfer) {
            self.latency
                .add(now, (service.as_secs_f64() - transfer).max(0.0));
        }
        // Capacity is measured only while the path is kept full: a path
        // that carries little because little is sent to it would otherwise
        // look slow, be sent even less, and never show its real speed.
        if self.full_since.is_some() {
            if !self.wire_recent(now) {
                self.sample_busy += now.saturating_sub(self.mark);
                self.sample_bytes += bytes;
            }
            self.mark = now;
        }
        if self.inflight_bytes() < self.saturated() {
            self.full_since = None;
        }
        let first = self.throughput.get().is_none() && !self.sample_busy.is_zero();
        if (first || self.sample_busy >= SAMPLE_BUSY) && self.sample_bytes >= SAMPLE_BYTES {
            self.throughput
                .add(now, self.sample_bytes, self.sample_busy);
            self.sample_bytes = 0;
            self.sample_busy = Duration::ZERO;
        }
    }

    /// The kernel's figures for the path's TCP connections: `bytes` moved
    /// so far (acknowledged and received, all connections) and their
    /// smallest round trip. Capacity is taken from bytes moved over
    /// intervals in which the path was kept full throughout, which this
    /// process's scheduling cannot distort.
    pub fn wire(&mut self, now: Duration, bytes: u64, min_rtt: Option<Duration>) {
        self.liveness.wire(now, bytes);
        if let Some(rtt) = min_rtt {
            self.latency.add(now, rtt.as_secs_f64());
        }
        if let (Some((t0, b0)), Some(since)) = (self.wire_last, self.full_since) {
            if since <= t0 && bytes >= b0 && now > t0 {
                self.throughput.add(now, bytes - b0, now - t0);
                self.wire_sampled = Some(now);
            }
        }
        self.wire_last = Some((now, bytes));
    }

    /// Whether the kernel's figures gave a capacity sample lately. They
    /// need the path kept full from one tick to the next, which a path
    /// that finishes each chunk within a tick (a fast link at queue depth
    /// 1) never is: there completions measure it instead.
    fn wire_recent(&self, now: Duration) -> bool {
        self.wire_sampled
            .is_some_and(|t| now.saturating_sub(t) < WIRE_FRESH)
    }

    /// How long the path may go without a reply while busy before it is
    /// declared failed: a few times the expected gap between replies (base
    /// latency plus the largest chunk's transfer), kept within the user's
    /// floor and ceiling. An unmeasured path is assumed to move `fallback`
    /// bytes per second (the other paths' mean, or a cautious guess).
    pub fn reply_timeout(
        &self,
        largest_inflight: u64,
        fallback: f64,
        floor: Duration,
        ceiling: Duration,
    ) -> Duration {
        let tput = self
            .throughput
            .get()
            .filter(|t| *t > 0.0)
            .unwrap_or(fallback.max(1.0));
        let expected = self.latency.or_zero() + largest_inflight as f64 / tput;
        Duration::from_secs_f64((expected * 4.0).clamp(floor.as_secs_f64(), ceiling.as_secs_f64()))
    }

    /// Takes a chunk off a connection's load without a reply to measure
    /// (the target sent it back unexecuted).
    pub fn released(&mut self, conn: usize, bytes: u64) {
        if let Some(c) = self.conns.get_mut(conn) {
            c.inflight_requests = c.inflight_requests.saturating_sub(1);
            c.inflight_bytes = c.inflight_bytes.saturating_sub(bytes);
        }
    }

    /// Forgets load after the path's connections are gone.
    pub fn reset_conns(&mut self) {
        for c in &mut self.conns {
            c.up = false;
            c.inflight_requests = 0;
            c.inflight_bytes = 0;
        }
        self.full_since = None;
        self.sample_bytes = 0;
        self.sample_busy = Duration::ZERO;
        self.wire_last = None;
        self.liveness.reset();
    }
}
