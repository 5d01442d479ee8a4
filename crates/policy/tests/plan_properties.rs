//! Properties every policy's plan keeps, whatever the figures: it covers
//! the request exactly, in order, in aligned pieces no longer than the
//! export allows, on usable paths only.

use braid_policy::{by_name, Assignment, PathView, PolicyOptions, Request, SplitRules, NAMES};
use proptest::prelude::*;

/// Most pieces a generated case may need; keeps each case quick while
/// still cutting requests into thousands of chunks.
const MAX_PIECES: u64 = 2048;

fn figure(measured: std::ops::Range<f64>) -> impl Strategy<Value = f64> {
    prop_oneof![1 => Just(0.0), 3 => measured]
}

fn path() -> impl Strategy<Value = PathView> {
    (
        (any::<bool>(), any::<bool>(), 0u32..4, 0u32..4, 0u32..20),
        (0u32..64, 0u64..(1 << 32)),
        (
            figure(1e3..1e10),
            figure(1e-5..1.0),
            figure(1e-5..0.1),
            0.0..5.0f64,
            prop_oneof![1 => Just(0.0), 1 => -0.01..0.01f64],
        ),
    )
        .prop_map(
            |(
                (usable, standby, priority, weight, relative_throughput),
                (inflight_requests, inflight_bytes),
                (throughput, service_time, latency, idle, lateness),
            )| PathView {
                usable,
                standby,
                priority,
                weight,
                relative_throughput,
                repeat: 0,
                inflight_requests,
                inflight_bytes,
                throughput,
                service_time,
                latency,
                lateness,
                idle,
            },
        )
}

/// A request length and the rules to cut it by: `align` a power of two up
/// to 64 KiB, the length up to 64 MiB (a whole number of blocks, or not),
/// `chunk` and `max` anywhere from one block to well past the length, with
/// odd sizes mixed in.
fn request_and_rules() -> impl Strategy<Value = (u64, SplitRules)> {
    (0u32..=16, 0u64..=(64 << 20))
        .prop_flat_map(|(align_log, len)| {
            let align = 1u64 << align_log;
            let blocks = len / align;
            let least = (blocks / MAX_PIECES).max(1);
            let most = 2 * blocks.max(least);
            (
                Just(align),
                Just(blocks * align),
                prop_oneof![3 => Just(0), 1 => 0..align],
                spread_between(least, most),
                0..align,
                spread_between(least, most),
                0..align,
            )
        })
        .prop_map(
            |(align, len, tail, chunk_blocks, chunk_odd, max_blocks, max_odd)| {
                let rules = SplitRules {
                    align,
                    chunk: chunk_blocks * align + chunk_odd,
                    max: max_blocks * align + max_odd,
                };
                (len + tail, rules)
            },
        )
}

/// A value in `[lo, hi]` whose order of magnitude is uniform, so that small
/// chunks (many pieces) come up as often as large ones.
fn spread_between(lo: u64, hi: u64) -> impl Strategy<Value = u64> {
    let doublings = (hi / lo).max(1).ilog2();
    (0..=doublings).prop_flat_map(move |d| {
        let from = lo << d;
        from..=(from.saturating_mul(2) - 1).min(hi).max(from)
    })
}

fn paths_with_one_usable() -> impl Strategy<Value = Vec<PathView>> {
    (
        prop::collection::vec(path(), 1..=8),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(mut paths, pick)| {
            if !paths.iter().any(|p| p.usable) {
                let i = pick.index(paths.len());
                paths[i].usable = true;
            }
            paths
        })
}

fn check(
    plan: &[Assignment],
    len: u64,
    paths: &[PathView],
    rules: &SplitRules,
) -> Result<(), TestCaseError> {
    prop_assert!(!plan.is_empty());
    if len == 0 {
        prop_assert_eq!(plan.len(), 1);
        prop_assert_eq!((plan[0].offset, plan[0].len), (0, 0));
    }
    let mut offset = 0;
    for a in plan {
        prop_assert_eq!(a.offset, offset, "contiguous and in order");
        prop_assert!(a.len > 0 || len == 0, "no empty piece");
        prop_assert!(
            a.len <= rules.max,
            "piece of {} over max {}",
            a.len,
            rules.max
        );
        prop_assert_eq!(a.offset % rules.align, 0, "cut off the block boundary");
        prop_assert!(
            a.path < paths.len() && paths[a.path].usable,
            "path {} not usable",
            a.path
        );
        offset += a.len;
    }
    prop_assert_eq!(offset, len, "covers the request exactly");
    Ok(())
}

proptest! {
    #[test]
    fn every_plan_covers_the_request_in_aligned_pieces_on_usable_paths(
        (len, rules) in request_and_rules(),
        paths in paths_with_one_usable(),
    ) {
        for name in NAMES {
            let mut policy = by_name(name, &PolicyOptions::default()).expect("listed name");
            // Twice, so state carried between plans (cursors) is exercised.
            for _ in 0..2 {
                let plan = policy.plan(&Request { len, write: true }, &paths, &rules);
                check(&plan, len, &paths, &rules).map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
            }
            let chosen = policy.choose(&Request { len, write: false }, &paths);
            prop_assert!(chosen.is_some_and(|i| paths[i].usable), "{}: chose {:?}", name, chosen);
        }
    }

    #[test]
    fn with_no_usable_path_every_plan_is_empty(
        (len, rules) in request_and_rules(),
        mut paths in prop::collection::vec(path(), 0..=8),
    ) {
        for p in &mut paths {
            p.usable = false;
        }
        for name in NAMES {
            let mut policy = by_name(name, &PolicyOptions::default()).expect("listed name");
            prop_assert!(policy.plan(&Request { len, write: false }, &paths, &rules).is_empty(), "{}", name);
            prop_assert_eq!(policy.choose(&Request { len, write: false }, &paths), None, "{}", name);
        }
    }
}
