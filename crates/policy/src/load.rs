//! Policies that follow the load already on each path: `least-queue-depth`
//! (requests in flight), `least-blocks` (bytes in flight) and
//! `service-time` (bytes in flight per unit of configured throughput).
//!
//! They see only the in-flight figures the engine hands them. A path that
//! stops answering keeps its requests in flight, so its figures grow and
//! these policies move away from it on their own, before any timeout.

use std::cmp::Ordering;

use crate::rotor::Rotor;
use crate::{PathView, Policy, Request};

/// `least-queue-depth`: the usable path with the fewest requests in flight.
///
/// Ties rotate: at queue depth 1 every path is idle at each choice, and
/// consecutive requests must still alternate for a single stream to use
/// more than one link.
#[derive(Clone, Debug, Default)]
pub(crate) struct LeastQueueDepth {
    ties: Rotor,
}

impl Policy for LeastQueueDepth {
    fn name(&self) -> &'static str {
        "least-queue-depth"
    }

    fn choose(&mut self, _req: &Request, paths: &[PathView]) -> Option<usize> {
        self.ties.least(paths, |a, b| {
            paths[a].inflight_requests.cmp(&paths[b].inflight_requests)
        })
    }
}

/// `least-blocks`: the usable path with the fewest bytes in flight; ties
/// rotate.
#[derive(Clone, Debug, Default)]
pub(crate) struct LeastBlocks {
    ties: Rotor,
}

impl Policy for LeastBlocks {
    fn name(&self) -> &'static str {
        "least-blocks"
    }

    fn choose(&mut self, _req: &Request, paths: &[PathView]) -> Option<usize> {
        self.ties.least(paths, |a, b| {
            paths[a].inflight_bytes.cmp(&paths[b].inflight_bytes)
        })
    }
}

/// `service-time`, as Linux dm-ps-service-time defines it: the least
/// (bytes in flight + this request) / relative throughput; then the fewest
/// requests in flight; then in turn.
#[derive(Clone, Debug, Default)]
pub(crate) struct ServiceTime {
    ties: Rotor,
}

impl Policy for ServiceTime {
    fn name(&self) -> &'static str {
        "service-time"
    }

    fn choose(&mut self, req: &Request, paths: &[PathView]) -> Option<usize> {
        self.ties.least(paths, |a, b| {
            service_cost(&paths[a], &paths[b], req.len)
                .then_with(|| paths[a].inflight_requests.cmp(&paths[b].inflight_requests))
        })
    }
}

/// Compares (bytes_a + len) / rt_a with (bytes_b + len) / rt_b by cross
/// multiplication, as dm does, so equal figures tie exactly; u128 keeps the
/// products from overflowing. A relative throughput of 0 is read as 1.
fn service_cost(a: &PathView, b: &PathView, len: u64) -> Ordering {
    let size = |p: &PathView| u128::from(p.inflight_bytes) + u128::from(len);
    let rate = |p: &PathView| u128::from(p.relative_throughput.max(1));
    (size(a) * rate(b)).cmp(&(size(b) * rate(a)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{assert_stuck_path_abandoned, choices, gbit, mbit100, req, rules, tally};

    #[test]
    fn least_queue_depth_alternates_idle_paths_at_depth_one() {
        let paths = [gbit(), mbit100()];
        let picks = choices(&mut LeastQueueDepth::default(), 1 << 20, &paths, 6);
        assert_eq!(picks, [0, 1, 0, 1, 0, 1]);
    }

    #[test]
    fn least_queue_depth_picks_the_fewest_requests_in_flight() {
        let paths = [
            PathView {
                inflight_requests: 3,
                ..gbit()
            },
            PathView {
                inflight_requests: 1,
                inflight_bytes: 1 << 30,
                ..mbit100()
            },
            PathView {
                inflight_requests: 2,
                ..gbit()
            },
        ];
        assert_eq!(
            choices(&mut LeastQueueDepth::default(), 4096, &paths, 3),
            [1; 3]
        );
    }

    #[test]
    fn least_queue_depth_rotates_only_among_the_tied() {
        let paths = [
            PathView {
                inflight_requests: 1,
                ..gbit()
            },
            PathView {
                inflight_requests: 2,
                ..gbit()
            },
            PathView {
                inflight_requests: 1,
                ..gbit()
            },
        ];
        let picks = choices(&mut LeastQueueDepth::default(), 4096, &paths, 4);
        assert_eq!(picks, [0, 2, 0, 2]);
    }

    #[test]
    fn least_queue_depth_abandons_a_path_that_stops_answering() {
        assert_stuck_path_abandoned(&mut LeastQueueDepth::default());
    }

    #[test]
    fn least_queue_depth_plan_spreads_chunks_over_idle_paths() {
        let paths = [gbit(), mbit100()];
        let plan = LeastQueueDepth::default().plan(&req(8 << 20), &paths, &rules());
        let picks: Vec<_> = plan.iter().map(|a| a.path).collect();
        assert_eq!(tally(&picks, 2), [4, 4]);
    }

    #[test]
    fn least_blocks_picks_the_fewest_bytes_in_flight() {
        let paths = [
            PathView {
                inflight_requests: 1,
                inflight_bytes: 8 << 20,
                ..gbit()
            },
            PathView {
                inflight_requests: 6,
                inflight_bytes: 6 * 4096,
                ..mbit100()
            },
        ];
        assert_eq!(
            choices(&mut LeastBlocks::default(), 4096, &paths, 3),
            [1; 3]
        );
    }

    #[test]
    fn least_blocks_alternates_idle_paths_at_depth_one() {
        let paths = [gbit(), mbit100()];
        let picks = choices(&mut LeastBlocks::default(), 1 << 20, &paths, 4);
        assert_eq!(picks, [0, 1, 0, 1]);
    }

    #[test]
    fn least_blocks_abandons_a_path_that_stops_answering() {
        assert_stuck_path_abandoned(&mut LeastBlocks::default());
    }

    #[test]
    fn least_blocks_plan_balances_bytes_across_uneven_chunks() {
        let paths = [
            PathView {
                inflight_bytes: 2 << 20,
                ..gbit()
            },
            mbit100(),
        ];
        let plan = LeastBlocks::default().plan(&req(4 << 20), &paths, &rules());
        let picks: Vec<_> = plan.iter().map(|a| a.path).collect();
        // Path 1 catches up to path 0's 2 MiB, then they share.
        assert_eq!(tally(&picks, 2), [1, 3]);
    }

    #[test]
    fn service_time_prefers_the_higher_relative_throughput_when_idle() {
        let paths = [mbit100(), gbit()];
        assert_eq!(
            choices(&mut ServiceTime::default(), 1 << 20, &paths, 3),
            [1; 3]
        );
    }

    #[test]
    fn service_time_plan_splits_in_proportion_to_relative_throughput() {
        let paths = [gbit(), mbit100()];
        let plan = ServiceTime::default().plan(&req(22 << 20), &paths, &rules());
        let picks: Vec<_> = plan.iter().map(|a| a.path).collect();
        assert_eq!(tally(&picks, 2), [20, 2]);
    }

    #[test]
    fn service_time_reads_zero_relative_throughput_as_one() {
        let paths = [
            PathView {
                relative_throughput: 0,
                inflight_bytes: 1 << 20,
                ..gbit()
            },
            PathView {
                relative_throughput: 1,
                ..gbit()
            },
        ];
        assert_eq!(ServiceTime::default().choose(&req(4096), &paths), Some(1));
    }

    #[test]
    fn service_time_breaks_ties_by_requests_in_flight_then_in_turn() {
        // Equal cost (1 MiB in flight each); path 1 has fewer requests.
        let paths = [
            PathView {
                inflight_requests: 4,
                inflight_bytes: 1 << 20,
                ..gbit()
            },
            PathView {
                inflight_requests: 1,
                inflight_bytes: 1 << 20,
                ..gbit()
            },
        ];
        assert_eq!(
            choices(&mut ServiceTime::default(), 4096, &paths, 2),
            [1, 1]
        );
        let idle = [gbit(), gbit()];
        assert_eq!(
            choices(&mut ServiceTime::default(), 4096, &idle, 4),
            [0, 1, 0, 1]
        );
    }

    #[test]
    fn service_time_abandons_a_path_that_stops_answering() {
        assert_stuck_path_abandoned(&mut ServiceTime::default());
    }
}
