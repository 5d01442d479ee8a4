//! Fair tie-breaking: a cursor that remembers where the last choice fell.
//!
//! Several policies end with a set of equally good paths. Taking the lowest
//! index would send every request of a quiet volume (queue depth 1, all
//! paths idle) down the same path, so ties go to the first candidate at or
//! after the cursor instead, and the cursor moves past it. This module owns
//! only that; which paths count as tied is each policy's business.

use std::cmp::Ordering;

use crate::PathView;

/// A rotating cursor over path indices.
///
/// It survives the path set changing size: the cursor is reduced modulo the
/// current length on each use, so it never indexes out of range and keeps
/// rotating through whatever paths exist now.
#[derive(Clone, Debug, Default)]
pub(crate) struct Rotor {
    next: usize,
}

impl Rotor {
    /// The first index, starting at the cursor and wrapping, for which
    /// `candidate` holds; the cursor then moves just past it.
    pub(crate) fn next(
        &mut self,
        len: usize,
        mut candidate: impl FnMut(usize) -> bool,
    ) -> Option<usize> {
        if len == 0 {
            return None;
        }
        let start = self.next % len;
        let found = (0..len)
            .map(|k| (start + k) % len)
            .find(|&i| candidate(i))?;
        self.next = found + 1;
        Some(found)
    }

    /// Among usable paths, those that `cmp` ranks least (`Equal` means
    /// tied), taken in turn.
    ///
    /// `cmp` compares two indices into `paths`, so keys that depend on the
    /// whole set (a mean, say) can be computed once by the caller.
    pub(crate) fn least(
        &mut self,
        paths: &[PathView],
        cmp: impl Fn(usize, usize) -> Ordering,
    ) -> Option<usize> {
        self.least_among(paths.len(), |i| paths[i].usable, cmp)
    }

    /// Among the indices below `len` for which `candidate` holds, those
    /// that `cmp` ranks least, taken in turn.
    pub(crate) fn least_among(
        &mut self,
        len: usize,
        candidate: impl Fn(usize) -> bool,
        cmp: impl Fn(usize, usize) -> Ordering,
    ) -> Option<usize> {
        let best = (0..len)
            .filter(|&i| candidate(i))
            .min_by(|&a, &b| cmp(a, b))?;
        self.next(len, |i| candidate(i) && cmp(i, best) != Ordering::Greater)
    }
}

/// Orders two non-negative finite figures, calling them equal when they
/// differ only by floating-point noise, so that paths with identical
/// figures tie even after different arithmetic on each.
pub(crate) fn cmp_f64(a: f64, b: f64) -> Ordering {
    const RELATIVE: f64 = 1e-9;
    if (a - b).abs() <= RELATIVE * a.abs().max(b.abs()) {
        Ordering::Equal
    } else {
        a.total_cmp(&b)
    }
}

/// A measured figure: positive and finite. Anything else (0 for "not yet
/// measured", or garbage) means unknown.
pub(crate) fn measured(x: f64) -> Option<f64> {
    (x.is_finite() && x > 0.0).then_some(x)
}

/// The mean of the measured values among `xs`, if any is measured.
pub(crate) fn mean_measured(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = xs
        .filter_map(measured)
        .fold((0.0, 0u32), |(sum, n), x| (sum + x, n + 1));
    (n > 0).then(|| sum / f64::from(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotor_takes_candidates_in_turn_and_wraps() {
        let mut rotor = Rotor::default();
        let picks: Vec<_> = (0..6).map(|_| rotor.next(3, |_| true)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2].map(Some));
    }

    #[test]
    fn rotor_skips_non_candidates() {
        let mut rotor = Rotor::default();
        let picks: Vec<_> = (0..4).map(|_| rotor.next(4, |i| i != 1)).collect();
        assert_eq!(picks, [0, 2, 3, 0].map(Some));
        assert_eq!(rotor.next(4, |_| false), None);
    }

    #[test]
    fn rotor_keeps_rotating_when_the_path_set_shrinks_and_grows() {
        let mut rotor = Rotor::default();
        assert_eq!(rotor.next(5, |_| true), Some(0));
        assert_eq!(rotor.next(5, |_| true), Some(1));
        assert_eq!(rotor.next(5, |_| true), Some(2));
        assert_eq!(rotor.next(5, |_| true), Some(3));
        // Four paths gone: the cursor (4) wraps instead of indexing past the end.
        assert_eq!(rotor.next(1, |_| true), Some(0));
        assert_eq!(rotor.next(2, |_| true), Some(1));
        assert_eq!(rotor.next(2, |_| true), Some(0));
        assert_eq!(rotor.next(0, |_| true), None);
    }

    #[test]
    fn float_noise_is_a_tie() {
        assert_eq!(cmp_f64(0.1 + 0.2, 0.3), Ordering::Equal);
        assert_eq!(cmp_f64(0.0, 0.0), Ordering::Equal);
        assert_eq!(cmp_f64(1.0, 1.001), Ordering::Less);
    }

    #[test]
    fn only_positive_finite_figures_count_as_measured() {
        assert_eq!(measured(0.0), None);
        assert_eq!(measured(-1.0), None);
        assert_eq!(measured(f64::NAN), None);
        assert_eq!(measured(f64::INFINITY), None);
        assert_eq!(mean_measured([0.0, 2.0, 4.0].into_iter()), Some(3.0));
        assert_eq!(mean_measured([0.0].into_iter()), None);
    }
}
