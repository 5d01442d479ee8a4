//! `historical-service-time`, after Linux dm-ps-historical-service-time:
//! each request goes where it is predicted to complete soonest, from a
//! moving average of each path's service time.
//!
//! The moving average itself is the engine's (it is `PathView::service_time`);
//! this module only predicts from it and decides when an estimate is too
//! old to trust.

use crate::rotor::{cmp_f64, mean_measured, measured, Rotor};
use crate::{PathView, Policy, Request};

/// `historical-service-time`: the shortest predicted completion,
/// (1 + requests in flight) × service time, with probes for paths whose
/// estimate is missing or stale.
///
/// An estimate only changes when the path completes requests, so a path
/// that once looked slow would never be tried again. Two kinds of idle path
/// therefore get a request as a probe, whatever their prediction: one never
/// measured, and one that has completed nothing for `probe_after` seconds
/// while another path is busy (were all paths quiet, there would be nothing
/// to gain by moving). Only a path with nothing in flight is probed, so a
/// path that has stopped answering is not fed more requests. Each choice
/// probes at most one path, the stalest.
#[derive(Clone, Debug)]
pub(crate) struct HistoricalServiceTime {
    probe_after: f64,
    ties: Rotor,
}

impl HistoricalServiceTime {
    /// A path idle for `probe_after` seconds while another is busy is due a
    /// probe.
    pub(crate) fn new(probe_after: f64) -> Self {
        Self {
            probe_after,
            ties: Rotor::default(),
        }
    }
}

impl Policy for HistoricalServiceTime {
    fn name(&self) -> &'static str {
        "historical-service-time"
    }

    fn choose(&mut self, _req: &Request, paths: &[PathView]) -> Option<usize> {
        // A candidate has nothing in flight itself, so any busy path is
        // another one.
        let any_busy = paths.iter().any(|p| p.usable && p.inflight_requests > 0);
        let due_probe = |i: usize| {
            let p = &paths[i];
            p.usable
                && p.inflight_requests == 0
                && (measured(p.service_time).is_none() || (p.idle >= self.probe_after && any_busy))
        };
        if (0..paths.len()).any(due_probe) {
            // Stalest first: never measured, then longest without a completion.
            let staleness = |i: usize| match measured(paths[i].service_time) {
                None => f64::INFINITY,
                Some(_) => measured(paths[i].idle).unwrap_or(0.0),
            };
            return self.ties.least_among(paths.len(), due_probe, |a, b| {
                cmp_f64(staleness(b), staleness(a))
            });
        }

        // A path with requests out but no estimate yet is predicted like an
        // average one: 0 would make it look free and flood it, and a guess
        // that grows with its queue lets it be left if it never answers.
        let typical =
            mean_measured(paths.iter().filter(|p| p.usable).map(|p| p.service_time)).unwrap_or(1.0);
        let predicted = |i: usize| {
            let p = &paths[i];
            (1.0 + f64::from(p.inflight_requests)) * measured(p.service_time).unwrap_or(typical)
        };
        self.ties
            .least(paths, |a, b| cmp_f64(predicted(a), predicted(b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{assert_stuck_path_abandoned, choices, gbit, mbit100, req, rules};

    fn hst() -> HistoricalServiceTime {
        HistoricalServiceTime::new(1.0)
    }

    #[test]
    fn hst_picks_the_shortest_predicted_completion() {
        // 4 × 0.8 ms on the fast path beats 1 × 6 ms on the slow one ...
        let mut paths = [
            PathView {
                inflight_requests: 3,
                ..gbit()
            },
            mbit100(),
        ];
        assert_eq!(choices(&mut hst(), 4096, &paths, 3), [0; 3]);
        // ... but 9 × 0.8 ms does not.
        paths[0].inflight_requests = 8;
        assert_eq!(choices(&mut hst(), 4096, &paths, 3), [1; 3]);
    }

    #[test]
    fn hst_stays_on_the_faster_path_at_depth_one() {
        let paths = [mbit100(), gbit()];
        assert_eq!(choices(&mut hst(), 1 << 20, &paths, 4), [1; 4]);
    }

    #[test]
    fn hst_rotates_among_equal_predictions() {
        let paths = [gbit(), gbit()];
        assert_eq!(choices(&mut hst(), 4096, &paths, 4), [0, 1, 0, 1]);
    }

    #[test]
    fn hst_probes_an_unmeasured_path_once_then_predicts_it_as_average() {
        let mut paths = [
            gbit(),
            PathView {
                service_time: 0.0,
                ..mbit100()
            },
        ];
        assert_eq!(hst().choose(&req(4096), &paths), Some(1));
        // With its probe still out it is no longer free: (1 + 1) × 0.8 ms.
        paths[1].inflight_requests = 1;
        assert_eq!(choices(&mut hst(), 4096, &paths, 3), [0; 3]);
    }

    #[test]
    fn hst_probes_a_stale_idle_path_while_another_is_busy() {
        let stale = PathView {
            idle: 5.0,
            ..mbit100()
        };
        let busy = [
            PathView {
                inflight_requests: 2,
                ..gbit()
            },
            stale.clone(),
        ];
        assert_eq!(hst().choose(&req(4096), &busy), Some(1));
        // Nothing busy: no reason to probe, the prediction decides.
        let quiet = [gbit(), stale];
        assert_eq!(hst().choose(&req(4096), &quiet), Some(0));
    }

    #[test]
    fn hst_probe_threshold_is_configurable() {
        let paths = [
            PathView {
                inflight_requests: 2,
                ..gbit()
            },
            PathView {
                idle: 0.5,
                ..mbit100()
            },
        ];
        assert_eq!(hst().choose(&req(4096), &paths), Some(0));
        assert_eq!(
            HistoricalServiceTime::new(0.25).choose(&req(4096), &paths),
            Some(1)
        );
    }

    #[test]
    fn hst_probes_the_stalest_path_first_and_one_per_choice() {
        let paths = [
            PathView {
                inflight_requests: 1,
                ..gbit()
            },
            PathView {
                idle: 2.0,
                ..mbit100()
            },
            PathView {
                idle: 3.0,
                ..mbit100()
            },
        ];
        assert_eq!(hst().choose(&req(4096), &paths), Some(2));
        let plan = hst().plan(&req(3 << 20), &paths, &rules());
        let order: Vec<_> = plan.iter().map(|a| a.path).collect();
        assert_eq!(order, [2, 1, 0]);
    }

    #[test]
    fn hst_never_probes_a_path_with_requests_in_flight() {
        let paths = [
            gbit(),
            PathView {
                idle: 10.0,
                inflight_requests: 1,
                ..mbit100()
            },
            PathView {
                inflight_requests: 1,
                ..gbit()
            },
        ];
        assert_eq!(hst().choose(&req(4096), &paths), Some(0));
    }

    #[test]
    fn hst_abandons_a_path_that_stops_answering() {
        assert_stuck_path_abandoned(&mut hst());
    }

    #[test]
    fn hst_abandons_an_unmeasured_path_that_never_answers() {
        let mut paths = [
            gbit(),
            PathView {
                service_time: 0.0,
                ..gbit()
            },
        ];
        let mut policy = hst();
        let mut on_silent = 0;
        for _ in 0..100 {
            if policy.choose(&req(4096), &paths) == Some(1) {
                on_silent += 1;
                paths[1].inflight_requests += 1;
            }
        }
        assert!(
            on_silent <= 2,
            "{on_silent} requests sent to a path that never answered"
        );
    }
}
