//! Shared fixtures for the policies' unit tests: links of known speed and
//! small simulations of how their figures move.

use crate::{PathView, Policy, Request, SplitRules};

/// A 1 Gbit/s link as braid would measure it (about 117 MB/s of goodput).
pub(crate) fn gbit() -> PathView {
    PathView {
        relative_throughput: 10,
        throughput: 117e6,
        service_time: 0.0008,
        latency: 0.0002,
        ..PathView::default()
    }
}

/// A 100 Mbit/s link: a tenth of the bandwidth, more latency.
pub(crate) fn mbit100() -> PathView {
    PathView {
        relative_throughput: 1,
        throughput: 11.7e6,
        service_time: 0.006,
        latency: 0.0005,
        ..PathView::default()
    }
}

pub(crate) fn req(len: u64) -> Request {
    Request { len, write: false }
}

/// An export with 4 KiB blocks, chunks of 1 MiB and a 32 MiB payload limit.
pub(crate) fn rules() -> SplitRules {
    SplitRules {
        align: 4096,
        chunk: 1 << 20,
        max: 32 << 20,
    }
}

/// `n` choices against figures that do not move: queue depth 1, each
/// request answered before the next is sent.
pub(crate) fn choices(
    policy: &mut dyn Policy,
    len: u64,
    paths: &[PathView],
    n: usize,
) -> Vec<usize> {
    (0..n)
        .map(|_| policy.choose(&req(len), paths).expect("a usable path"))
        .collect()
}

/// How many of `picks` went to each of `paths` paths.
pub(crate) fn tally(picks: &[usize], paths: usize) -> Vec<usize> {
    let mut counts = vec![0; paths];
    for &p in picks {
        counts[p] += 1;
    }
    counts
}

/// Two equal links; path 0 stops answering. Every request sent on it stays
/// in flight and it never completes anything again, while path 1 answers
/// each request at once. Returns the path of each of `steps` choices of
/// 64 KiB, a millisecond apart.
pub(crate) fn with_one_path_stuck(policy: &mut dyn Policy, steps: usize) -> Vec<usize> {
    let mut paths = [gbit(), gbit()];
    (0..steps)
        .map(|_| {
            let len = 64 << 10;
            let chosen = policy.choose(&req(len), &paths).expect("a usable path");
            if chosen == 0 {
                paths[0].inflight_requests += 1;
                paths[0].inflight_bytes += len;
            }
            paths[0].idle += 0.001;
            chosen
        })
        .collect()
}

/// Asserts that a stuck path (see [`with_one_path_stuck`]) soon stops
/// being chosen.
pub(crate) fn assert_stuck_path_abandoned(policy: &mut dyn Policy) {
    let picks = with_one_path_stuck(policy, 2000);
    let on_stuck = picks.iter().filter(|&&p| p == 0).count();
    assert!(
        on_stuck <= 4,
        "{}: {on_stuck} requests sent to the stuck path",
        policy.name()
    );
    assert!(
        picks[10..].iter().all(|&p| p == 1),
        "{}: stuck path still chosen after the first few requests",
        policy.name()
    );
}
