//! Water-filling: how many bytes of one request each path should carry so
//! that all of them are predicted to finish at the same moment, rounded to
//! whole blocks.
//!
//! This module sees only each path's model (when it could start on new
//! bytes, and how fast it moves them); which paths take part, and what to do
//! with shares too small to be worth a request, is the caller's business.

use super::Model;

/// Shares of `len` bytes over the paths in `active` (indices into
/// `models`), as `(path, bytes)` in the order the pieces should be laid
/// out: earliest start first, so the bytes at the front of the request
/// arrive first.
///
/// Every share is positive and all but the last are multiples of `align`;
/// the last takes the `len % align` bytes that do not fill a block, so the
/// shares add up to exactly `len` and every boundary between them is
/// aligned. Paths that would still be busy when the others finish get no
/// share. Returns nothing when `active` is empty.
pub(super) fn water_fill(
    models: &[Model],
    active: &[usize],
    len: u64,
    align: u64,
) -> Vec<(usize, u64)> {
    let align = align.max(1);
    let mut order = active.to_vec();
    order.sort_by(|&a, &b| models[a].start.total_cmp(&models[b].start).then(a.cmp(&b)));
    let exact = level(models, &order, len as f64);
    let finish = |k: usize, units: u64| {
        let m = models[order[k]];
        m.start + (units * align) as f64 / m.rate
    };
    let units = blocks(&exact, len / align, finish);
    let mut shares: Vec<(usize, u64)> = order
        .iter()
        .zip(units)
        .filter(|&(_, u)| u > 0)
        .map(|(&path, u)| (path, u * align))
        .collect();
    let tail = len % align;
    match shares.last_mut() {
        Some(last) => last.1 += tail,
        None if len > 0 => shares.extend(order.first().map(|&path| (path, len))),
        None => {}
    }
    shares
}

/// The real-valued shares for paths in `order` (sorted by start): the level
/// T with Σ max(0, (T − startᵢ) × rateᵢ) = `len`, and each path's part of it.
///
/// Filling proceeds from the earliest start: with the first k paths in, the
/// level is (len + Σ startᵢ·rateᵢ) / Σ rateᵢ, and the (k+1)-th path joins
/// only if that level lies beyond its start.
fn level(models: &[Model], order: &[usize], len: f64) -> Vec<f64> {
    let (mut weighted, mut rate) = (0.0, 0.0);
    let mut level = 0.0;
    let mut joined = 0;
    for (k, &i) in order.iter().enumerate() {
        let m = models[i];
        if k > 0 && m.start >= level {
            break;
        }
        weighted += m.start * m.rate;
        rate += m.rate;
        level = (len + weighted) / rate;
        joined = k + 1;
    }
    order
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let m = models[i];
            if k < joined {
                ((level - m.start) * m.rate).max(0.0)
            } else {
                0.0
            }
        })
        .collect()
}

/// `exact` rescaled to `total` whole blocks: each share gets the blocks it
/// fully earns, and each block left over goes to the share that would
/// finish it first (`finish(k, units)`: when share `k` would be done with
/// `units` blocks).
///
/// Left-over blocks are not worth the same everywhere. On 1gbit + 100mbit,
/// a 4 KiB block is 0.03 ms of the fast link and 0.35 ms of the slow one,
/// 4% of its share of a 1 MiB request; handed out by largest remainder,
/// the slow link got it whenever its remainder was the larger, and the
/// whole request waited for it.
fn blocks(exact: &[f64], total: u64, finish: impl Fn(usize, u64) -> f64) -> Vec<u64> {
    let sum: f64 = exact.iter().sum();
    if !(sum.is_finite() && sum > 0.0) {
        return vec![0; exact.len()];
    }
    let scaled: Vec<f64> = exact.iter().map(|x| x / sum * total as f64).collect();
    // `as` saturates, and the scaled values lie in [0, total].
    let mut units: Vec<u64> = scaled.iter().map(|x| x.floor() as u64).collect();
    let eligible: Vec<usize> = (0..scaled.len()).filter(|&i| scaled[i] > 0.0).collect();
    let mut assigned: u64 = units.iter().sum();
    // At most one block per share is left over, unless rounding error
    // piled up; each goes where it would be done soonest.
    while assigned < total {
        let next = eligible
            .iter()
            .copied()
            .min_by(|&a, &b| finish(a, units[a] + 1).total_cmp(&finish(b, units[b] + 1)))
            .expect("a positive sum has a positive share");
        units[next] += 1;
        assigned += 1;
    }
    while assigned > total {
        let latest = (0..units.len())
            .filter(|&i| units[i] > 0)
            .max_by(|&a, &b| finish(a, units[a]).total_cmp(&finish(b, units[b])))
            .expect("more blocks than the total means some share has one");
        units[latest] -= 1;
        assigned -= 1;
    }
    units
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(start: f64, rate: f64) -> Model {
        Model { start, rate }
    }

    #[test]
    fn equal_paths_share_equally() {
        let models = [model(0.001, 100e6), model(0.001, 100e6)];
        assert_eq!(
            water_fill(&models, &[0, 1], 1 << 20, 4096),
            [(0, 512 << 10), (1, 512 << 10)]
        );
    }

    #[test]
    fn shares_follow_rates_when_starts_are_equal() {
        let models = [model(0.0, 30e6), model(0.0, 10e6)];
        assert_eq!(
            water_fill(&models, &[0, 1], 4 << 20, 4096),
            [(0, 3 << 20), (1, 1 << 20)]
        );
    }

    #[test]
    fn a_later_start_is_made_up_before_sharing() {
        // Path 1 is free 10 ms after path 0: path 0 first moves 1 MB alone.
        let models = [model(0.0, 100e6), model(0.01, 100e6)];
        let shares = water_fill(&models, &[0, 1], 3_000_000, 1);
        assert_eq!(shares, [(0, 2_000_000), (1, 1_000_000)]);
    }

    #[test]
    fn a_path_still_busy_when_the_others_finish_gets_nothing() {
        let models = [model(1.0, 100e6), model(0.0, 100e6), model(0.0, 100e6)];
        let shares = water_fill(&models, &[0, 1, 2], 1 << 20, 4096);
        assert_eq!(shares, [(1, 512 << 10), (2, 512 << 10)]);
    }

    #[test]
    fn shares_are_whole_blocks_and_the_tail_goes_last() {
        let models = [model(0.0, 2e6), model(0.0, 1e6)];
        let shares = water_fill(&models, &[0, 1], 10 * 4096 + 100, 4096);
        assert_eq!(shares, [(0, 7 * 4096), (1, 3 * 4096 + 100)]);
    }

    #[test]
    fn a_block_left_over_goes_where_it_finishes_first() {
        // 1 MiB over 1gbit + 100mbit as measured: exactly 23.56 blocks
        // for the slow path. Rounded to 24, its piece takes 8.19 ms; the
        // block costs the fast path 0.03 ms (8.06 ms for 233).
        let models = [model(0.0, 118.4e6), model(0.0, 12.0e6)];
        let shares = water_fill(&models, &[0, 1], 1 << 20, 4096);
        assert_eq!(shares, [(0, 932 << 10), (1, 92 << 10)]);
    }

    #[test]
    fn the_earliest_start_is_laid_out_first() {
        let models = [model(0.002, 100e6), model(0.001, 100e6)];
        let shares = water_fill(&models, &[0, 1], 8 << 20, 4096);
        assert_eq!(shares.first().map(|s| s.0), Some(1));
    }

    #[test]
    fn rounding_keeps_the_total() {
        // Alike shares: the left-over block goes to the first of the tie.
        let alike = |_: usize, units: u64| units as f64;
        assert_eq!(blocks(&[1.0, 1.0, 1.0], 10, alike), [4, 3, 3]);
        assert_eq!(blocks(&[0.0, 5.0], 3, alike), [0, 3]);
        assert_eq!(blocks(&[0.0, 0.0], 3, alike), [0, 0]);
    }
}
