//! Path selectors for braid's multipath engine.
//!
//! A policy sees one request and a snapshot of every path's live figures
//! ([`PathView`]) and says which path each part of the request goes to.
//! Policies never touch sockets, clocks or tasks: everything they know comes
//! in through their arguments, so each is unit-tested with plain values.
//! Keeping the figures up to date, sending the chunks and re-sending them
//! when a path fails belong to the initiator, not here.
//!
//! The names are the ones storage users know (DESIGN.md, "Path selection"):
//!
//! | name | chooses |
//! |---|---|
//! | `failover` | the best usable path by priority; others stand by |
//! | `round-robin` | usable paths in turn, `repeat` requests each |
//! | `round-robin-subset` | round-robin over the active (non-standby) set; standbys only when no active path is usable |
//! | `least-queue-depth` | fewest requests in flight |
//! | `least-blocks` | fewest bytes in flight |
//! | `weighted` | the usable path with the lowest configured weight (a priority order, not a proportional split) |
//! | `service-time` | least (bytes in flight + this request) / relative throughput |
//! | `historical-service-time` | shortest predicted completion: (1 + in flight) × moving average of service time; idle stale paths get a probe |
//! | `adaptive` (default) | splits and sends each chunk where it is predicted to finish first, from measured throughput and latency |
//!
//! Large requests are cut into aligned chunks before they are placed
//! ([`Policy::plan`]), so that even one request at a time uses every path.

mod adaptive;
mod hst;
mod load;
mod order;
mod plan;
mod rotor;
mod round_robin;
#[cfg(test)]
mod testkit;

pub use adaptive::MIN_SPLIT;

/// Every policy name [`by_name`] accepts; the first is the default.
pub const NAMES: &[&str] = &[
    "adaptive",
    "failover",
    "round-robin",
    "round-robin-subset",
    "least-queue-depth",
    "least-blocks",
    "weighted",
    "service-time",
    "historical-service-time",
];

/// A path selector: decides where each request, or each chunk of one, goes.
///
/// A policy may keep state between calls (a round-robin cursor, say), but
/// everything it knows about the paths comes from the views it is handed,
/// so switching policy on a live volume only loses that small state.
pub trait Policy: Send {
    /// The user-facing name (e.g. "least-queue-depth").
    fn name(&self) -> &'static str;

    /// Index of the path for one chunk, or None when no path is usable.
    ///
    /// The index is into `paths` and always names a usable path.
    fn choose(&mut self, req: &Request, paths: &[PathView]) -> Option<usize>;

    /// Cuts a request into chunks and places each.
    ///
    /// The assignments are in offset order and cover exactly `[0, req.len)`;
    /// every cut point is a multiple of `rules.align` and no chunk is longer
    /// than `rules.max` (provided `rules.max >= rules.align`). A request of
    /// 0 bytes (FLUSH, or TRIM's placement) gets one assignment of length 0.
    /// With no usable path the plan is empty.
    ///
    /// The provided method keeps requests up to `rules.chunk` whole and cuts
    /// larger ones into chunks of `rules.chunk`, placing each with
    /// [`choose`](Policy::choose) as if the chunks before it were already in
    /// flight, so load-aware policies spread them.
    fn plan(&mut self, req: &Request, paths: &[PathView], rules: &SplitRules) -> Vec<Assignment> {
        plan::spread(self, req, paths, rules)
    }

    /// Whether a READ or WRITE should wait for the next reply instead of
    /// being placed now: the policy knows too little about every usable
    /// path to place it, and what it lacks comes with replies. The engine
    /// asks before placing each such request and again as replies arrive;
    /// it must answer `false` once no reply is awaited on some usable path.
    fn hold(&self, _paths: &[PathView]) -> bool {
        false
    }
}

/// Knobs some policies take; the rest ignore them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PolicyOptions {
    /// `round-robin` and `round-robin-subset`: consecutive choices of one
    /// path before moving to the next (dm's `repeat_count`); 0 counts as 1.
    pub rr_repeat: u32,
    /// `historical-service-time`: seconds without a completion after which
    /// an idle path is sent a request as a probe, while another path is
    /// busy, so its service-time estimate never goes stale.
    pub hst_probe_after: f64,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        Self {
            rr_repeat: 1,
            hst_probe_after: 1.0,
        }
    }
}

/// A policy name that [`by_name`] does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown path policy {name:?}; valid policies are {valid}", valid = NAMES.join(", "))]
#[non_exhaustive]
pub struct UnknownPolicy {
    /// The name as it was given.
    pub name: String,
}

/// Builds the policy users know by `name` (one of [`NAMES`]).
///
/// # Errors
///
/// [`UnknownPolicy`] when `name` is not exactly one of [`NAMES`].
pub fn by_name(name: &str, opts: &PolicyOptions) -> Result<Box<dyn Policy>, UnknownPolicy> {
    Ok(match name {
        "adaptive" => Box::new(adaptive::Adaptive::default()),
        "failover" => Box::new(order::Failover),
        "round-robin" => Box::new(round_robin::RoundRobin::new(opts.rr_repeat)),
        "round-robin-subset" => Box::new(round_robin::RoundRobinSubset::new(opts.rr_repeat)),
        "least-queue-depth" => Box::new(load::LeastQueueDepth::default()),
        "least-blocks" => Box::new(load::LeastBlocks::default()),
        "weighted" => Box::new(order::Weighted::default()),
        "service-time" => Box::new(load::ServiceTime::default()),
        "historical-service-time" => {
            Box::new(hst::HistoricalServiceTime::new(opts.hst_probe_after))
        }
        _ => {
            return Err(UnknownPolicy {
                name: name.to_owned(),
            })
        }
    })
}

/// One path as a policy sees it: a snapshot taken just before the choice.
///
/// Figures count every volume that uses the link, as MPIO's queue depth
/// counts all LUNs on a path.
#[derive(Clone, Debug, PartialEq)]
pub struct PathView {
    /// May receive requests now: connected, healthy and not disabled.
    pub usable: bool,
    /// Configured as a standby path (used by `round-robin-subset`).
    pub standby: bool,
    /// Failover priority: lower is preferred.
    pub priority: u32,
    /// `weighted` policy weight: lower is preferred.
    pub weight: u32,
    /// `service-time` relative throughput, at least 1.
    pub relative_throughput: u32,
    /// `round-robin` and `round-robin-subset`: consecutive choices of this
    /// path per turn (dm's per-path `rr_min_io`); 0 takes the policy's
    /// own [`PolicyOptions::rr_repeat`].
    pub repeat: u32,
    /// Requests sent on this path and not yet answered.
    pub inflight_requests: u32,
    /// Payload bytes of those requests.
    pub inflight_bytes: u64,
    /// Measured goodput in bytes per second (moving average); 0 when the
    /// path has not carried enough traffic to measure.
    pub throughput: f64,
    /// Moving average of request service time in seconds (send to reply);
    /// 0 when unmeasured.
    pub service_time: f64,
    /// Base latency in seconds: the round trip a small request sees on an
    /// idle path; 0 when unmeasured.
    pub latency: f64,
    /// Seconds to add to this path's predicted finish: how much later its
    /// pieces of split requests tend to finish than its rate and latency
    /// predict, relative to the other paths of those requests (negative:
    /// earlier). 0 when unmeasured.
    pub lateness: f64,
    /// Seconds since this path last completed a request (or since it came
    /// up, if it never has).
    pub idle: f64,
}

impl Default for PathView {
    fn default() -> Self {
        Self {
            usable: true,
            standby: false,
            priority: 0,
            weight: 0,
            relative_throughput: 1,
            repeat: 0,
            inflight_requests: 0,
            inflight_bytes: 0,
            throughput: 0.0,
            service_time: 0.0,
            latency: 0.0,
            lateness: 0.0,
            idle: 0.0,
        }
    }
}

/// The request (or the part of it) being placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Bytes the request moves (payload for READ and WRITE; the effect
    /// length counts as 0 for TRIM, WRITE_ZEROES, FLUSH).
    pub len: u64,
    /// The request writes (WRITE, WRITE_ZEROES, TRIM). No policy here
    /// treats writes differently yet; the flag is carried so one can.
    pub write: bool,
}

/// How a request may be cut into chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitRules {
    /// Every chunk boundary is a multiple of this (the export's preferred
    /// block size, at least its minimum block size); a power of two.
    pub align: u64,
    /// Requests up to this many bytes are never split; larger ones are cut
    /// into chunks of about this size (policies other than `adaptive`).
    pub chunk: u64,
    /// No chunk is larger than this (the export's maximum payload).
    pub max: u64,
}

/// One chunk of a planned request: `len` bytes starting `offset` bytes into
/// the request, sent on `path` (an index into the slice of views).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// Index into the `paths` slice the plan was made from.
    pub path: usize,
    /// Bytes from the start of the request to the first byte of this chunk.
    pub offset: u64,
    /// Bytes in this chunk; 0 only when the whole request is 0 bytes long.
    pub len: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{gbit, mbit100, req, rules};

    fn all() -> Vec<Box<dyn Policy>> {
        NAMES
            .iter()
            .map(|name| by_name(name, &PolicyOptions::default()).expect("every listed name builds"))
            .collect()
    }

    #[test]
    fn every_listed_name_builds_a_policy_of_that_name() {
        for (name, policy) in NAMES.iter().zip(all()) {
            assert_eq!(policy.name(), *name);
        }
        assert_eq!(NAMES[0], "adaptive", "the default comes first");
    }

    #[test]
    fn unknown_name_is_refused_with_the_valid_ones_listed() {
        let err = by_name("fastest", &PolicyOptions::default())
            .err()
            .expect("not a policy");
        let msg = err.to_string();
        assert!(msg.starts_with("unknown path policy \"fastest\""), "{msg}");
        for name in NAMES {
            assert!(msg.contains(name), "{msg}");
        }
        assert!(!msg.ends_with('.'), "{msg}");
    }

    #[test]
    fn no_usable_path_means_no_choice_and_an_empty_plan() {
        let paths = [
            PathView {
                usable: false,
                ..gbit()
            },
            PathView {
                usable: false,
                ..mbit100()
            },
        ];
        for mut policy in all() {
            assert_eq!(policy.choose(&req(4096), &paths), None, "{}", policy.name());
            for len in [0, 4096, 8 << 20] {
                assert!(
                    policy.plan(&req(len), &paths, &rules()).is_empty(),
                    "{}",
                    policy.name()
                );
            }
            assert_eq!(policy.choose(&req(4096), &[]), None, "{}", policy.name());
            assert!(
                policy.plan(&req(4096), &[], &rules()).is_empty(),
                "{}",
                policy.name()
            );
        }
    }

    #[test]
    fn one_path_takes_everything() {
        let paths = [gbit()];
        for mut policy in all() {
            for _ in 0..5 {
                assert_eq!(
                    policy.choose(&req(65536), &paths),
                    Some(0),
                    "{}",
                    policy.name()
                );
            }
            let plan = policy.plan(&req(8 << 20), &paths, &rules());
            assert!(plan.iter().all(|a| a.path == 0), "{}", policy.name());
            assert_eq!(plan.iter().map(|a| a.len).sum::<u64>(), 8 << 20);
        }
    }

    #[test]
    fn unusable_paths_are_never_chosen() {
        // The unusable paths look best by every policy's measure.
        let idle_fast = PathView {
            usable: false,
            priority: 0,
            weight: 0,
            relative_throughput: 100,
            service_time: 0.0001,
            ..gbit()
        };
        let busy_slow = PathView {
            priority: 9,
            weight: 9,
            inflight_requests: 30,
            inflight_bytes: 30 << 20,
            service_time: 0.5,
            ..mbit100()
        };
        let paths = [idle_fast.clone(), busy_slow, idle_fast];
        for mut policy in all() {
            for _ in 0..10 {
                assert_eq!(
                    policy.choose(&req(65536), &paths),
                    Some(1),
                    "{}",
                    policy.name()
                );
            }
            let plan = policy.plan(&req(16 << 20), &paths, &rules());
            assert!(plan.iter().all(|a| a.path == 1), "{}", policy.name());
        }
    }

    #[test]
    fn zero_length_request_gets_one_empty_assignment() {
        let paths = [gbit(), mbit100()];
        for mut policy in all() {
            let plan = policy.plan(&req(0), &paths, &rules());
            assert_eq!(plan.len(), 1, "{}", policy.name());
            assert_eq!((plan[0].offset, plan[0].len), (0, 0), "{}", policy.name());
        }
    }

    #[test]
    fn path_set_changes_never_panic() {
        let four = [gbit(), mbit100(), gbit(), mbit100()];
        for mut policy in all() {
            for n in [4, 1, 3, 0, 2, 4, 1] {
                if let Some(i) = policy.choose(&req(4096), &four[..n]) {
                    assert!(i < n, "{}", policy.name());
                }
                let _ = policy.plan(&req(3 << 20), &four[..n], &rules());
            }
        }
    }
}
