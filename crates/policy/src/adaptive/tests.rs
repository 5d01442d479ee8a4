//! Behaviour of `adaptive`: where single chunks go, and how large requests
//! are shared out.

use super::*;
use crate::testkit::{assert_stuck_path_abandoned, choices, gbit, mbit100, req, rules};

fn plan_of(len: u64, paths: &[PathView]) -> Vec<Assignment> {
    Adaptive::default().plan(&req(len), paths, &rules())
}

/// Bytes planned for each path.
fn bytes_per_path(plan: &[Assignment], paths: usize) -> Vec<u64> {
    let mut bytes = vec![0; paths];
    for a in plan {
        bytes[a.path] += a.len;
    }
    bytes
}

#[test]
fn adaptive_sends_a_small_request_where_it_finishes_first() {
    let paths = [mbit100(), gbit()];
    assert_eq!(
        choices(&mut Adaptive::default(), 64 << 10, &paths, 3),
        [1; 3]
    );
}

#[test]
fn adaptive_sends_to_the_slow_path_once_the_fast_one_is_far_enough_behind() {
    // 8 MiB queued on 1 Gbit/s (72 ms) still beats 1 MiB on 100 Mbit/s
    // (90 ms); 16 MiB queued (143 ms) does not.
    let mut paths = [
        PathView {
            inflight_bytes: 8 << 20,
            ..gbit()
        },
        mbit100(),
    ];
    assert_eq!(Adaptive::default().choose(&req(1 << 20), &paths), Some(0));
    paths[0].inflight_bytes = 16 << 20;
    assert_eq!(Adaptive::default().choose(&req(1 << 20), &paths), Some(1));
}

#[test]
fn adaptive_rotates_among_equal_predictions() {
    let paths = [gbit(), gbit()];
    assert_eq!(
        choices(&mut Adaptive::default(), 4096, &paths, 4),
        [0, 1, 0, 1]
    );
}

#[test]
fn adaptive_breaks_ties_by_requests_in_flight() {
    let paths = [
        PathView {
            inflight_requests: 3,
            ..gbit()
        },
        gbit(),
    ];
    assert_eq!(choices(&mut Adaptive::default(), 4096, &paths, 3), [1; 3]);
}

#[test]
fn adaptive_abandons_a_path_that_stops_answering() {
    assert_stuck_path_abandoned(&mut Adaptive::default());
}

#[test]
fn adaptive_plan_splits_one_mib_about_ten_to_one_over_gbit_and_100mbit() {
    let plan = plan_of(1 << 20, &[gbit(), mbit100()]);
    assert_eq!(plan.len(), 2, "{plan:?}");
    assert_eq!(
        plan[0].path, 0,
        "the fast path, free sooner, takes the front"
    );
    let [fast, slow] = bytes_per_path(&plan, 2)[..] else {
        unreachable!()
    };
    let ratio = fast as f64 / slow as f64;
    assert!((9.0..12.0).contains(&ratio), "{fast}:{slow}");
}

#[test]
fn adaptive_plan_splits_equal_paths_evenly() {
    let plan = plan_of(1 << 20, &[gbit(), gbit()]);
    assert_eq!(bytes_per_path(&plan, 2), [512 << 10, 512 << 10]);
}

#[test]
fn adaptive_plan_splits_paths_measured_a_few_percent_apart_evenly() {
    // Two links of one kind, measured 8% apart: at queue depth 1 an
    // uneven split leaves the request waiting for its larger piece.
    let plan = plan_of(1 << 20, &[queued(0, 108e6), queued(0, 117e6)]);
    assert_eq!(bytes_per_path(&plan, 2), [512 << 10, 512 << 10]);
}

#[test]
fn adaptive_plan_follows_rates_more_than_a_tenth_apart() {
    let bytes = bytes_per_path(&plan_of(1 << 20, &[queued(0, 100e6), queued(0, 125e6)]), 2);
    // 4 to 5, to the 4 KiB block.
    assert!(bytes[0] < bytes[1], "{bytes:?}");
    let share = bytes[0] as f64 / (1 << 20) as f64;
    assert!((share - 4.0 / 9.0).abs() < 0.01, "{bytes:?}");
}

#[test]
fn adaptive_plan_gives_a_busy_path_less() {
    // Path 0 has 2 MiB to drain first; sharing 4 MiB evens that out.
    let paths = [
        PathView {
            inflight_bytes: 2 << 20,
            ..gbit()
        },
        gbit(),
    ];
    assert_eq!(
        bytes_per_path(&plan_of(4 << 20, &paths), 2),
        [1 << 20, 3 << 20]
    );
}

/// A path with `bytes` in flight, measured at `rate` bytes per second.
fn queued(bytes: u64, rate: f64) -> PathView {
    PathView {
        inflight_bytes: bytes,
        throughput: rate,
        ..gbit()
    }
}

#[test]
fn adaptive_plan_evens_out_queues_of_busy_paths_with_rates_alike() {
    // Rates say 3 to 2, but both paths have plenty queued: the request
    // brings both queues to the same level (4.5 MiB).
    let paths = [queued(4 << 20, 90e6), queued(1 << 20, 60e6)];
    assert_eq!(
        bytes_per_path(&plan_of(4 << 20, &paths), 2),
        [512 << 10, 3584 << 10]
    );
}

#[test]
fn adaptive_plan_keeps_rates_for_busy_paths_far_apart() {
    // By rates the slow path is 84 ms behind; the fast one takes it all.
    let paths = [queued(4 << 20, 117e6), queued(1 << 20, 11.7e6)];
    assert_eq!(bytes_per_path(&plan_of(4 << 20, &paths), 2), [4 << 20, 0]);
}

#[test]
fn adaptive_plan_keeps_rates_while_one_path_is_below_busy() {
    // Split by rates so both finish together (about 58 ms from now), not
    // into even queues (which would be 512 KiB and 3.5 MiB).
    let paths = [queued(4 << 20, 90e6), queued(BUSY - 4096, 60e6)];
    assert_eq!(
        bytes_per_path(&plan_of(4 << 20, &paths), 2),
        [243 * 4096, 781 * 4096]
    );
}

#[test]
fn adaptive_plan_skips_a_path_still_busy_when_the_others_would_finish() {
    let paths = [
        PathView {
            inflight_bytes: 64 << 20,
            ..gbit()
        },
        gbit(),
    ];
    let plan = plan_of(1 << 20, &paths);
    assert_eq!(
        plan,
        [Assignment {
            path: 1,
            offset: 0,
            len: 1 << 20
        }]
    );
}

#[test]
fn adaptive_plan_folds_a_share_below_min_split_into_the_other_paths() {
    // The 100 Mbit/s path's share of 256 KiB would be about 20 KiB.
    let plan = plan_of(256 << 10, &[gbit(), mbit100()]);
    assert_eq!(
        plan,
        [Assignment {
            path: 0,
            offset: 0,
            len: 256 << 10
        }]
    );
    // With three paths the two fast ones share the slow one's sliver.
    let plan = plan_of(512 << 10, &[gbit(), mbit100(), gbit()]);
    assert_eq!(bytes_per_path(&plan, 3), [256 << 10, 0, 256 << 10]);
}

#[test]
fn adaptive_keeps_requests_up_to_min_split_whole() {
    let plan = plan_of(MIN_SPLIT, &[gbit(), gbit()]);
    assert_eq!(plan.len(), 1);
    assert_eq!(plan[0].len, MIN_SPLIT);
}

#[test]
fn adaptive_cuts_a_share_larger_than_max_into_consecutive_pieces() {
    let rules = SplitRules {
        max: 256 << 10,
        ..rules()
    };
    let plan = Adaptive::default().plan(&req(4 << 20), &[gbit(), gbit()], &rules);
    assert_eq!(plan.len(), 16);
    assert!(plan.iter().all(|a| a.len == 256 << 10));
    let order: Vec<_> = plan.iter().map(|a| a.path).collect();
    assert_eq!(order, [[0; 8], [1; 8]].concat());
}

#[test]
fn adaptive_plan_covers_an_unaligned_length_with_aligned_cuts() {
    let len = (1 << 20) + 100;
    let plan = plan_of(len, &[gbit(), mbit100()]);
    let mut offset = 0;
    for a in &plan {
        assert_eq!(a.offset, offset);
        assert_eq!(a.offset % 4096, 0);
        offset += a.len;
    }
    assert_eq!(offset, len);
}

#[test]
fn adaptive_treats_an_unmeasured_path_as_an_average_one() {
    let unmeasured = PathView {
        throughput: 0.0,
        latency: 0.0,
        ..gbit()
    };
    assert_eq!(
        bytes_per_path(&plan_of(1 << 20, &[gbit(), unmeasured.clone()]), 2),
        [512 << 10, 512 << 10]
    );
    // Between the fast and the slow one: neither starved nor flooded.
    let bytes = bytes_per_path(&plan_of(8 << 20, &[gbit(), mbit100(), unmeasured]), 3);
    assert!(bytes[1] < bytes[2] && bytes[2] < bytes[0], "{bytes:?}");
}

#[test]
fn adaptive_treats_paths_alike_while_nothing_is_measured() {
    let paths = [PathView::default(), PathView::default()];
    assert_eq!(
        bytes_per_path(&plan_of(1 << 20, &paths), 2),
        [512 << 10, 512 << 10]
    );
    assert_eq!(
        choices(&mut Adaptive::default(), 4096, &paths, 4),
        [0, 1, 0, 1]
    );
}

#[test]
fn adaptive_uses_both_links_for_one_large_request_at_a_time() {
    let paths = [gbit(), gbit()];
    let mut policy = Adaptive::default();
    for _ in 0..3 {
        let plan = policy.plan(&req(4 << 20), &paths, &rules());
        assert_eq!(bytes_per_path(&plan, 2), [2 << 20, 2 << 20]);
    }
}

/// A path not yet measured with `bytes` in flight.
fn unmeasured(bytes: u64) -> PathView {
    PathView {
        throughput: 0.0,
        latency: 0.0,
        inflight_bytes: bytes,
        inflight_requests: 1,
        ..gbit()
    }
}

#[test]
fn adaptive_holds_requests_while_every_path_is_being_measured() {
    let policy = Adaptive::default();
    assert!(!policy.hold(&[unmeasured(0), unmeasured(0)]));
    assert!(!policy.hold(&[unmeasured(PROBE), unmeasured(PROBE - 1)]));
    assert!(policy.hold(&[unmeasured(PROBE), unmeasured(512 << 10)]));
    // One measured path is enough to place requests on.
    assert!(!policy.hold(&[gbit(), unmeasured(PROBE)]));
    // An unusable path is not waited for, and nothing is held for no path.
    let down = PathView {
        usable: false,
        ..unmeasured(0)
    };
    assert!(policy.hold(&[unmeasured(PROBE), down.clone()]));
    assert!(!policy.hold(&[down]));
}

#[test]
fn adaptive_sends_a_path_being_measured_nothing_more() {
    let paths = [gbit(), unmeasured(PROBE)];
    assert_eq!(bytes_per_path(&plan_of(8 << 20, &paths), 2), [8 << 20, 0]);
    assert_eq!(
        choices(&mut Adaptive::default(), 64 << 10, &paths, 3),
        [0; 3]
    );
    // Below a probe's worth in flight it still gets an average path's share.
    let paths = [gbit(), unmeasured(PROBE - 4096)];
    assert!(bytes_per_path(&plan_of(1 << 20, &paths), 2)[1] > 0);
}

#[test]
fn a_path_found_late_gets_less_of_a_split_request() {
    // 1gbit + 100mbit: about 95 KiB of 1 MiB would finish with the fast
    // path's rest. Found 0.5 ms late (and the fast path as much early,
    // since offsets balance), the slow path is given 0.5 ms less of its
    // link and the fast one that much more of its own.
    let even = bytes_per_path(&plan_of(1 << 20, &[gbit(), mbit100()]), 2);
    let late = [
        PathView {
            lateness: -0.000_5,
            ..gbit()
        },
        PathView {
            lateness: 0.000_5,
            ..mbit100()
        },
    ];
    let skewed = bytes_per_path(&plan_of(1 << 20, &late), 2);
    assert!(skewed[1] < even[1], "{skewed:?} against {even:?}");
    assert_eq!(skewed[0] + skewed[1], 1 << 20);
    assert!(skewed[1] >= MIN_SPLIT, "still split: {skewed:?}");
}

#[test]
fn lateness_learned_from_large_requests_does_not_keep_small_ones_off_a_path() {
    // Two equal gigabit paths after 1 MiB requests at queue depth 16: each
    // split request took about 70 ms, so the offsets learned from them
    // may reach a quarter of that either way. Small random reads follow,
    // which are never split and so never move the offsets again; each
    // takes about a millisecond. Placed one after another with what is in
    // flight counted, 32 of 4 KiB must use both paths (a quarter each at
    // least: the offsets still count, scaled to the small requests).
    let mut paths = [
        PathView {
            lateness: -0.017,
            ..gbit()
        },
        PathView {
            lateness: 0.017,
            ..gbit()
        },
    ];
    let mut adaptive = Adaptive::default();
    let mut per_path = [0; 2];
    for _ in 0..32 {
        let p = adaptive.choose(&req(4096), &paths).expect("a usable path");
        paths[p].inflight_requests += 1;
        paths[p].inflight_bytes += 4096;
        per_path[p] += 1;
    }
    assert!(
        per_path.iter().all(|&n| n >= 8),
        "4 KiB requests per path: {per_path:?}"
    );
}
