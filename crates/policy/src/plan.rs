//! Cutting a request into chunks: the default [`Policy::plan`] and the
//! arithmetic every plan shares (aligned cut points, the payload limit).
//!
//! This module decides where the cuts fall, never which path is better;
//! that is the policy's `choose`, or `adaptive`'s own plan.

use crate::{Assignment, PathView, Policy, Request, SplitRules};

/// The default plan: requests up to `rules.chunk` (and `rules.max`) whole,
/// larger ones in chunks of `rules.chunk` rounded down to `rules.align`.
///
/// Each chunk is placed with `choose` on a scratch copy of the views in
/// which the chunks already placed count as in flight, so that
/// `least-queue-depth`, `least-blocks` and `service-time` spread one large
/// request the way they would spread many small ones.
pub(crate) fn spread<P: Policy + ?Sized>(
    policy: &mut P,
    req: &Request,
    paths: &[PathView],
    rules: &SplitRules,
) -> Vec<Assignment> {
    if req.len <= rules.chunk.min(rules.max) {
        return whole(policy, req, paths, rules);
    }
    let step = align_down(rules.chunk.min(rules.max), rules.align);
    let mut views = paths.to_vec();
    let mut plan = Vec::new();
    let mut offset = 0;
    while offset < req.len {
        let len = step.min(req.len - offset);
        let piece = Request { len, ..*req };
        let Some(path) = policy.choose(&piece, &views) else {
            // Usability does not change within a plan, so this only happens
            // on the first chunk: there is no usable path at all.
            return Vec::new();
        };
        charge(&mut views[path], len);
        plan.push(Assignment { path, offset, len });
        offset += len;
    }
    plan
}

/// The whole request on the one path `choose` picks, cut only where
/// `rules.max` demands. A request of 0 bytes gets one empty assignment.
pub(crate) fn whole<P: Policy + ?Sized>(
    policy: &mut P,
    req: &Request,
    paths: &[PathView],
    rules: &SplitRules,
) -> Vec<Assignment> {
    let Some(path) = policy.choose(req, paths) else {
        return Vec::new();
    };
    if req.len == 0 {
        return vec![Assignment {
            path,
            offset: 0,
            len: 0,
        }];
    }
    let mut plan = Vec::new();
    cut(&mut plan, path, 0, req.len, rules);
    plan
}

/// Appends `[offset, offset + len)` on `path` as consecutive pieces no
/// longer than `rules.max`. `offset` must be a multiple of `rules.align`;
/// every cut is then aligned too.
pub(crate) fn cut(
    plan: &mut Vec<Assignment>,
    path: usize,
    offset: u64,
    len: u64,
    rules: &SplitRules,
) {
    let step = align_down(rules.max, rules.align);
    let end = offset + len;
    let mut at = offset;
    while at < end {
        let len = step.min(end - at);
        plan.push(Assignment {
            path,
            offset: at,
            len,
        });
        at += len;
    }
}

/// `x` rounded down to a multiple of `align`, but never below one `align`:
/// a piece must move at least one block. When `max < align` (rules no
/// export should announce) pieces are therefore one block each, longer than
/// `max`: a cut off the block boundary would be the worse violation.
pub(crate) fn align_down(x: u64, align: u64) -> u64 {
    let align = align.max(1);
    (x / align * align).max(align)
}

/// Counts one more request of `len` bytes in flight on `view`.
fn charge(view: &mut PathView, len: u64) {
    view.inflight_requests = view.inflight_requests.saturating_add(1);
    view.inflight_bytes = view.inflight_bytes.saturating_add(len);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::LeastQueueDepth;
    use crate::order::Failover;
    use crate::testkit::{gbit, mbit100, req, rules};

    fn spans(plan: &[Assignment]) -> Vec<(u64, u64)> {
        plan.iter().map(|a| (a.offset, a.len)).collect()
    }

    #[test]
    fn requests_up_to_one_chunk_stay_whole() {
        let plan = spread(&mut Failover, &req(1 << 20), &[gbit()], &rules());
        assert_eq!(spans(&plan), [(0, 1 << 20)]);
    }

    #[test]
    fn larger_requests_are_cut_into_chunks_with_a_short_last_one() {
        let len = (3 << 20) + 8192;
        let plan = spread(&mut Failover, &req(len), &[gbit()], &rules());
        assert_eq!(
            spans(&plan),
            [
                (0, 1 << 20),
                (1 << 20, 1 << 20),
                (2 << 20, 1 << 20),
                (3 << 20, 8192)
            ]
        );
    }

    #[test]
    fn an_unaligned_chunk_size_is_rounded_down_to_the_alignment() {
        let rules = SplitRules {
            align: 4096,
            chunk: 10_000,
            max: 1 << 20,
        };
        let plan = spread(&mut Failover, &req(20_000), &[gbit()], &rules);
        assert_eq!(spans(&plan), [(0, 8192), (8192, 8192), (16384, 3616)]);
    }

    #[test]
    fn no_piece_exceeds_max_even_when_chunk_is_larger() {
        let rules = SplitRules {
            align: 4096,
            chunk: 1 << 20,
            max: 256 << 10,
        };
        let plan = spread(&mut Failover, &req(600 << 10), &[gbit()], &rules);
        assert_eq!(
            spans(&plan),
            [
                (0, 256 << 10),
                (256 << 10, 256 << 10),
                (512 << 10, 88 << 10)
            ]
        );
    }

    #[test]
    fn chunks_placed_earlier_count_as_in_flight_for_later_ones() {
        let plan = spread(
            &mut LeastQueueDepth::default(),
            &req(3 << 20),
            &[
                gbit(),
                PathView {
                    inflight_requests: 2,
                    ..mbit100()
                },
            ],
            &rules(),
        );
        let picks: Vec<_> = plan.iter().map(|a| a.path).collect();
        assert_eq!(picks, [0, 0, 1]);
    }

    #[test]
    fn zero_bytes_get_one_empty_assignment() {
        let plan = spread(&mut Failover, &req(0), &[gbit()], &rules());
        assert_eq!(
            plan,
            [Assignment {
                path: 0,
                offset: 0,
                len: 0
            }]
        );
    }

    #[test]
    fn align_down_keeps_at_least_one_block() {
        assert_eq!(align_down(10_000, 4096), 8192);
        assert_eq!(align_down(100, 4096), 4096);
        assert_eq!(align_down(7, 0), 7);
    }
}
