//! Policies that follow a configured order and ignore load: `failover`
//! (by priority) and `weighted` (by weight, MPIO's "weighted paths").
//!
//! Neither looks at requests or bytes in flight; a path that is slow but
//! still usable keeps its place until the engine marks it unusable.

use crate::rotor::Rotor;
use crate::{PathView, Policy, Request};

/// `failover`: every request on the usable path with the lowest priority;
/// the others stand by.
///
/// Ties go to the lowest index rather than rotating, so that all I/O stays
/// on one path, which is what "fail over only" promises (some targets
/// behave best with a single active path).
#[derive(Clone, Debug, Default)]
pub(crate) struct Failover;

impl Policy for Failover {
    fn name(&self) -> &'static str {
        "failover"
    }

    fn choose(&mut self, _req: &Request, paths: &[PathView]) -> Option<usize> {
        // min_by_key keeps the first of equal keys: the lowest index.
        (0..paths.len())
            .filter(|&i| paths[i].usable)
            .min_by_key(|&i| paths[i].priority)
    }
}

/// `weighted`: the usable path with the lowest weight.
///
/// MPIO defines weighted paths as a priority order, not a proportional
/// split; equally weighted paths share the load in turn.
#[derive(Clone, Debug, Default)]
pub(crate) struct Weighted {
    ties: Rotor,
}

impl Policy for Weighted {
    fn name(&self) -> &'static str {
        "weighted"
    }

    fn choose(&mut self, _req: &Request, paths: &[PathView]) -> Option<usize> {
        self.ties
            .least(paths, |a, b| paths[a].weight.cmp(&paths[b].weight))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{choices, gbit, mbit100, req, rules, tally};

    #[test]
    fn failover_uses_the_lowest_priority_path_only() {
        let paths = [
            PathView {
                priority: 2,
                ..gbit()
            },
            PathView {
                priority: 1,
                ..mbit100()
            },
            PathView {
                priority: 3,
                ..gbit()
            },
        ];
        assert_eq!(choices(&mut Failover, 4096, &paths, 5), [1; 5]);
    }

    #[test]
    fn failover_breaks_priority_ties_by_lowest_index() {
        let paths = [
            PathView {
                priority: 5,
                ..gbit()
            },
            PathView {
                priority: 1,
                ..gbit()
            },
            PathView {
                priority: 1,
                ..gbit()
            },
        ];
        assert_eq!(choices(&mut Failover, 4096, &paths, 4), [1; 4]);
    }

    #[test]
    fn failover_moves_to_the_next_priority_when_the_best_is_unusable() {
        let mut paths = [
            PathView {
                priority: 0,
                ..mbit100()
            },
            PathView {
                priority: 1,
                ..gbit()
            },
        ];
        assert_eq!(Failover.choose(&req(4096), &paths), Some(0));
        paths[0].usable = false;
        assert_eq!(Failover.choose(&req(4096), &paths), Some(1));
    }

    #[test]
    fn failover_ignores_load_even_when_its_path_is_stuck() {
        // By design: only the engine's health check takes a path away.
        let paths = [
            PathView {
                inflight_requests: 500,
                inflight_bytes: 1 << 30,
                ..gbit()
            },
            PathView {
                priority: 1,
                ..gbit()
            },
        ];
        assert_eq!(choices(&mut Failover, 4096, &paths, 3), [0; 3]);
    }

    #[test]
    fn failover_plan_keeps_every_chunk_on_one_path() {
        let paths = [
            PathView {
                priority: 1,
                ..gbit()
            },
            PathView {
                priority: 0,
                ..mbit100()
            },
        ];
        let plan = Failover.plan(&req(8 << 20), &paths, &rules());
        assert_eq!(plan.len(), 8);
        assert!(plan.iter().all(|a| a.path == 1));
    }

    #[test]
    fn weighted_prefers_the_lowest_weight_not_a_proportional_split() {
        let paths = [
            PathView {
                weight: 10,
                ..gbit()
            },
            PathView {
                weight: 1,
                ..mbit100()
            },
        ];
        assert_eq!(choices(&mut Weighted::default(), 4096, &paths, 6), [1; 6]);
    }

    #[test]
    fn weighted_rotates_among_equal_weights() {
        let paths = [
            PathView {
                weight: 1,
                ..gbit()
            },
            PathView {
                weight: 7,
                ..gbit()
            },
            PathView {
                weight: 1,
                ..mbit100()
            },
        ];
        let picks = choices(&mut Weighted::default(), 4096, &paths, 6);
        assert_eq!(picks, [0, 2, 0, 2, 0, 2]);
    }

    #[test]
    fn weighted_falls_back_to_heavier_paths_only_when_lighter_are_unusable() {
        let paths = [
            PathView {
                weight: 1,
                usable: false,
                ..gbit()
            },
            PathView {
                weight: 3,
                ..gbit()
            },
            PathView {
                weight: 2,
                ..mbit100()
            },
        ];
        let picks = choices(&mut Weighted::default(), 4096, &paths, 10);
        assert_eq!(tally(&picks, 3), [0, 0, 10]);
    }
}
