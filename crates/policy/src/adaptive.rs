//! `adaptive`, braid's default: each byte goes where it is predicted to
//! finish first, from each path's measured throughput and latency.
//!
//! A path is modelled as a pipe that first drains what it already has in
//! flight and then moves new bytes at its throughput: x more bytes on path
//! i finish at latencyᵢ + latenessᵢ + (inflight_bytesᵢ + x) / throughputᵢ,
//! where lateness is what the engine learned of which path split requests
//! wait for: it puts each path last about as often as its share of the
//! bytes, which is what makes the expected completion of a split request
//! smallest when finishes vary (`PathView::lateness`). `choose`
//! minimises that for one chunk; `plan` splits a large request so that all
//! the paths it uses finish together (see [`share`]). The figures are the
//! engine's measurements; this module never measures anything itself.
//!
//! Paths whose measured rates are within [`ALIKE`] of each other, and which
//! all have at least [`BUSY`] bytes queued, are instead given even queues.
//! A path that never runs dry delivers its link's rate whatever the split,
//! and completions clock the traffic: a path is sent more as soon as it
//! has drained. Rates that close are within what a busy machine distorts:
//! measured while the CPU, not the link, is the bottleneck, a path's rate
//! follows how much was queued on it, so splitting by it drifts towards
//! whichever path happened to get more (shares of 16% / 84% over two equal
//! links). Rates further apart are real, and even queues would tie the
//! caller's requests to the slow path's long queue: there the rates rule.

mod share;

use crate::plan;
use crate::rotor::{cmp_f64, mean_measured, measured, Rotor};
use crate::{Assignment, PathView, Policy, Request, SplitRules};

/// One value per path, on the stack for up to eight paths: a decision
/// is made for every request, and heap vectors here were five of the
/// fifteen allocations `braid attach` made per 4 KiB read.
type PerPath<T> = smallvec::SmallVec<[T; 8]>;

/// The smallest share of a request `adaptive` gives a path (or the
/// export's alignment, if larger).
///
/// Each piece is one more NBD request: a header, a reply and a round trip
/// on its path. Below this size that overhead is comparable to the time the
/// piece saves, and predictions built from moving averages are not precise
/// enough to be worth acting on, so smaller shares are folded into the
/// others and requests up to this size are never split.
pub const MIN_SPLIT: u64 = 64 * 1024;

/// Bytes in flight from which a path counts as busy (see the module
/// documentation): four [`MIN_SPLIT`] pieces, 2 ms of a gigabit link, so
/// that queue depth 1 (paths idle between requests) and small random I/O
/// (a few KiB per path) keep the rate model.
const BUSY: u64 = 4 * MIN_SPLIT;

/// The largest ratio of measured rates still treated as equal links when
/// every path is busy (see the module documentation).
const ALIKE: f64 = 2.0;

/// The largest part of a request's predicted time a path's lateness may
/// add or take away (see [`models`]); the engine keeps the learned offset
/// within the same fraction of the split request it learned from.
const LATENESS_BOUND: f64 = 0.25;

/// Rates within this ratio of each other count as one rate.
///
/// Two paths over the same kind of link measure a few percent apart, and
/// apart by more for a while on a busy machine, and at queue depth 1 a
/// request split by those figures waits for its larger piece. On 2 x
/// 1gbit under the lab's coarser shaper (`--shaping frames`), 1 MiB QD1
/// writes were split as unevenly as 44% / 56%; in alternating runs they
/// moved 217-224 MB/s before this and 223-227 with it (round-robin's
/// even halves: 210-226), and 195-199 against 200-218 while the machine
/// was busier. Links that really differ by less than this lose at most
/// half of it (the slower one's piece is that much late); links of
/// different kinds differ by far more, and keep their split (1gbit +
/// 100mbit: 90.5% / 9.5% either way).
const SAME_RATE: f64 = 1.1;

/// Throughput assumed for every path while none has been measured: any
/// value would do as long as all paths get the same one, and a realistic
/// one keeps latency and bytes in sensible proportion.
const NOMINAL_THROUGHPUT: f64 = 125e6;

/// Bytes in flight with which a path not yet measured is being measured:
/// it is sent nothing more until it is (see [`probing`]). Enough for one
/// throughput sample (the engine takes one from 256 KiB delivered while
/// the path was kept busy).
pub const PROBE: u64 = 256 * 1024;

/// Throughputs below this are treated as this, so that predictions stay
/// finite however bad a measurement looks.
const FLOOR_THROUGHPUT: f64 = 1.0;

/// `adaptive`: see the module documentation.
#[derive(Clone, Debug, Default)]
pub(crate) struct Adaptive {
    ties: Rotor,
}

impl Policy for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    /// The path where `req.len` more bytes are predicted to finish first;
    /// ties go to fewer requests in flight, then in turn.
    fn choose(&mut self, req: &Request, paths: &[PathView]) -> Option<usize> {
        let models = models(paths, req.len);
        let finish = |i: usize| models[i].finish(req.len);
        let candidates = candidates(paths);
        self.ties.least_among(
            paths.len(),
            |i| candidates.contains(&i),
            |a, b| {
                cmp_f64(finish(a), finish(b))
                    .then_with(|| paths[a].inflight_requests.cmp(&paths[b].inflight_requests))
            },
        )
    }

    /// Splits the request over the usable paths so that every path used is
    /// predicted to finish at the same time, one contiguous piece per path
    /// (cut further only where `rules.max` demands).
    ///
    /// A share smaller than [`MIN_SPLIT`] is not sent: its path leaves the
    /// split and the request is shared out again among the rest, so the
    /// bytes go to whichever paths can best absorb them and those still
    /// finish together. Requests up to [`MIN_SPLIT`] go whole to
    /// [`choose`](Policy::choose). `rules.chunk` does not apply: the shares
    /// are sized from the paths' speeds instead.
    fn plan(&mut self, req: &Request, paths: &[PathView], rules: &SplitRules) -> Vec<Assignment> {
        let min = MIN_SPLIT.max(rules.align);
        if req.len <= min {
            return plan::whole(self, req, paths, rules);
        }
        let mut active = candidates(paths);
        let mut models = models(paths, req.len);
        if alike_and_busy(&models, &active, paths) {
            models = queue_models(paths);
        }
        loop {
            let shares = share::water_fill(&models, &active, req.len, rules.align);
            if shares.len() <= 1 {
                return plan::whole(self, req, paths, rules);
            }
            let smallest = shares
                .iter()
                .min_by_key(|&&(path, bytes)| (bytes, std::cmp::Reverse(path)))
                .map(|&(path, _)| path)
                .expect("more than one share");
            if shares.iter().all(|&(_, bytes)| bytes >= min) {
                return lay_out(&shares, rules);
            }
            // Paths that got nothing stay in: with one fewer path sharing,
            // the level rises and they may now be worth a share.
            active.retain(|p| *p != smallest);
        }
    }

    /// Holds requests while every usable path is [`probing`]: at the start,
    /// the paths' speeds are unknown, and a request placed then is split
    /// evenly, as if they were alike. On 1gbit + 100mbit, 32 requests of
    /// 1 MiB submitted at once put 16 MiB on the slow path, 1.4 s of it,
    /// and a 64 MiB copy took 1.35 s where 0.52 s would do. The first reply
    /// measures a path and ends the hold.
    fn hold(&self, paths: &[PathView]) -> bool {
        let mut usable = paths.iter().filter(|p| p.usable).peekable();
        usable.peek().is_some() && usable.all(probing)
    }
}

/// Whether `path` is not yet measured and already holds a [`PROBE`]'s
/// bytes: sending it more would be a guess, and its first reply will tell.
///
/// Modelled as the average measured path, an unmeasured one would be sent
/// that share of every request until its first reply, which on a slow link
/// takes long: an idle second makes the engine forget a slow path's figure
/// (so that a path starved on an old figure is tried again), and a burst
/// then put many MiB on it.
fn probing(path: &PathView) -> bool {
    measured(path.throughput).is_none() && path.inflight_bytes >= PROBE
}

/// The usable paths that may be sent more: those not [`probing`], or all
/// usable ones if every one is (the engine holds data requests then, so
/// only requests that carry no data get here).
fn candidates(paths: &[PathView]) -> PerPath<usize> {
    let usable = || (0..paths.len()).filter(|&i| paths[i].usable);
    let free: PerPath<usize> = usable().filter(|&i| !probing(&paths[i])).collect();
    if free.is_empty() {
        usable().collect()
    } else {
        free
    }
}

/// What `adaptive` predicts about one path.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Model {
    /// Seconds from now until the path could finish a request of 0 more
    /// bytes: its latency plus draining what is already in flight.
    start: f64,
    /// Bytes per second it moves once it gets to new bytes.
    rate: f64,
}

impl Model {
    /// Predicted seconds until `bytes` more bytes sent now would finish.
    fn finish(&self, bytes: u64) -> f64 {
        self.start + bytes as f64 / self.rate
    }
}

/// One model per view, unusable paths included (nobody asks about them).
///
/// A path not yet measured is modelled as the average measured path: were
/// it taken as infinitely slow it would never carry the traffic that
/// measures it, and as infinitely fast it would be flooded. With nothing
/// measured anywhere, all paths are modelled alike.
///
/// Usable paths whose rates are all within [`SAME_RATE`] of each other are
/// given their mean rate.
///
/// A path's lateness counts for at most [`LATENESS_BOUND`] of the time
/// `len` more bytes would take on it: the engine learns it from split
/// requests only, and bounds it by a fraction of the latest one's time, so
/// an offset learned while 1 MiB requests took 70 ms would otherwise stay
/// in force for 4 KiB requests that take one, which are never split and
/// never correct it. Two equal gigabit paths then carried 4 KiB random
/// reads on one path only (28K IOPS through `braid attach` on the lab's 2
/// x 1gbit after sequential reads, against 54K spread over both before
/// them).
fn models(paths: &[PathView], len: u64) -> PerPath<Model> {
    let usable = || paths.iter().filter(|p| p.usable);
    let typical_rate = mean_measured(usable().map(|p| p.throughput)).unwrap_or(NOMINAL_THROUGHPUT);
    let typical_latency = mean_measured(usable().map(|p| p.latency)).unwrap_or(0.0);
    let mut rates: PerPath<f64> = paths
        .iter()
        .map(|p| {
            measured(p.throughput)
                .unwrap_or(typical_rate)
                .max(FLOOR_THROUGHPUT)
        })
        .collect();
    let usable_rates: PerPath<f64> = (0..paths.len())
        .filter(|&i| paths[i].usable)
        .map(|i| rates[i])
        .collect();
    if let Some(one) = one_rate(&usable_rates) {
        for (rate, p) in rates.iter_mut().zip(paths) {
            if p.usable {
                *rate = one;
            }
        }
    }
    paths
        .iter()
        .zip(rates)
        .map(|(p, rate)| {
            let latency = measured(p.latency).unwrap_or(typical_latency);
            let start = latency + p.inflight_bytes as f64 / rate;
            let bound = LATENESS_BOUND * (start + len as f64 / rate);
            Model {
                start: start + p.lateness.clamp(-bound, bound),
                rate,
            }
        })
        .collect()
}

/// The mean of `rates` when there are several and all are within
/// [`SAME_RATE`] of each other.
fn one_rate(rates: &[f64]) -> Option<f64> {
    let fastest = rates.iter().copied().fold(0.0, f64::max);
    let slowest = rates.iter().copied().fold(f64::INFINITY, f64::min);
    (rates.len() >= 2 && fastest <= SAME_RATE * slowest)
        .then(|| rates.iter().sum::<f64>() / rates.len() as f64)
}

/// Every path in `active` has [`BUSY`] bytes queued, and their rates are
/// within [`ALIKE`] of each other.
fn alike_and_busy(models: &[Model], active: &[usize], paths: &[PathView]) -> bool {
    if !active.iter().all(|&i| paths[i].inflight_bytes >= BUSY) {
        return false;
    }
    let rates = || active.iter().map(|&i| models[i].rate);
    let fastest = rates().fold(0.0, f64::max);
    let slowest = rates().fold(f64::INFINITY, f64::min);
    fastest <= ALIKE * slowest
}

/// Models in which every path moves bytes at the same rate and starts once
/// its queue is drained: water-filling them evens out bytes in flight.
fn queue_models(paths: &[PathView]) -> PerPath<Model> {
    paths
        .iter()
        .map(|p| Model {
            start: p.inflight_bytes as f64 / NOMINAL_THROUGHPUT,
            rate: NOMINAL_THROUGHPUT,
        })
        .collect()
}

/// The shares as assignments, back to back from offset 0.
fn lay_out(shares: &[(usize, u64)], rules: &SplitRules) -> Vec<Assignment> {
    let mut out = Vec::with_capacity(shares.len());
    let mut offset = 0;
    for &(path, bytes) in shares {
        plan::cut(&mut out, path, offset, bytes, rules);
        offset += bytes;
    }
    out
}

#[cfg(test)]
mod tests;
