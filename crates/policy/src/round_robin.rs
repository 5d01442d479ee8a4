//! `round-robin` and `round-robin-subset`: paths in turn, with no feedback
//! from their figures.
//!
//! These exist because users know them (dm's `round-robin`, MPIO's Round
//! Robin and Round Robin With Subset). On unequal links they send as much to
//! the slow path as to the fast one, which is exactly why braid's default is
//! `adaptive`.

use crate::rotor::Rotor;
use crate::{PathView, Policy, Request};

/// `round-robin`: usable paths in turn, `repeat` consecutive choices each.
#[derive(Clone, Debug)]
pub(crate) struct RoundRobin {
    turn: Turn,
}

impl RoundRobin {
    /// `repeat` choices per path before moving on; 0 counts as 1.
    pub(crate) fn new(repeat: u32) -> Self {
        Self {
            turn: Turn::new(repeat),
        }
    }
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn choose(&mut self, _req: &Request, paths: &[PathView]) -> Option<usize> {
        self.turn.next(paths, |i| paths[i].usable)
    }
}

/// `round-robin-subset`: round-robin over the usable active (non-standby)
/// paths; standbys take turns only while no active path is usable.
#[derive(Clone, Debug)]
pub(crate) struct RoundRobinSubset {
    turn: Turn,
}

impl RoundRobinSubset {
    /// `repeat` choices per path before moving on; 0 counts as 1.
    pub(crate) fn new(repeat: u32) -> Self {
        Self {
            turn: Turn::new(repeat),
        }
    }
}

impl Policy for RoundRobinSubset {
    fn name(&self) -> &'static str {
        "round-robin-subset"
    }

    fn choose(&mut self, _req: &Request, paths: &[PathView]) -> Option<usize> {
        let want_standby = !paths.iter().any(|p| p.usable && !p.standby);
        self.turn.next(paths, |i| {
            paths[i].usable && paths[i].standby == want_standby
        })
    }
}

/// The shared cursor: which path has the turn and how many more choices it
/// gets.
#[derive(Clone, Debug)]
struct Turn {
    rotor: Rotor,
    repeat: u32,
    current: Option<usize>,
    left: u32,
}

impl Turn {
    fn new(repeat: u32) -> Self {
        Self {
            rotor: Rotor::default(),
            repeat: repeat.max(1),
            current: None,
            left: 0,
        }
    }

    fn next(&mut self, paths: &[PathView], eligible: impl Fn(usize) -> bool) -> Option<usize> {
        let len = paths.len();
        // The path set may have shrunk or the current path failed since the
        // last choice; its remaining turn is then forfeit.
        if let Some(i) = self
            .current
            .filter(|&i| self.left > 0 && i < len && eligible(i))
        {
            self.left -= 1;
            return Some(i);
        }
        let i = self.rotor.next(len, eligible)?;
        self.current = Some(i);
        // A path's own count wins over the policy's (dm sets rr_min_io per
        // path).
        let repeat = match paths[i].repeat {
            0 => self.repeat,
            own => own,
        };
        self.left = repeat - 1;
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{choices, gbit, mbit100, req, rules, tally};

    #[test]
    fn round_robin_takes_paths_in_turn() {
        let paths = [gbit(), gbit(), gbit()];
        assert_eq!(
            choices(&mut RoundRobin::new(1), 4096, &paths, 6),
            [0, 1, 2, 0, 1, 2]
        );
    }

    #[test]
    fn round_robin_repeats_each_path_rr_repeat_times() {
        let paths = [gbit(), gbit()];
        let picks = choices(&mut RoundRobin::new(3), 4096, &paths, 8);
        assert_eq!(picks, [0, 0, 0, 1, 1, 1, 0, 0]);
        assert_eq!(choices(&mut RoundRobin::new(0), 4096, &paths, 3), [0, 1, 0]);
    }

    #[test]
    fn a_paths_own_repeat_count_wins_over_the_policys() {
        let paths = [
            PathView {
                repeat: 3,
                ..gbit()
            },
            gbit(),
        ];
        let picks = choices(&mut RoundRobin::new(2), 4096, &paths, 10);
        assert_eq!(picks, [0, 0, 0, 1, 1, 0, 0, 0, 1, 1]);
    }

    #[test]
    fn round_robin_splits_evenly_even_on_unequal_links() {
        // The known weakness this policy is kept for comparison with.
        let paths = [gbit(), mbit100()];
        let picks = choices(&mut RoundRobin::new(1), 1 << 20, &paths, 100);
        assert_eq!(tally(&picks, 2), [50, 50]);
    }

    #[test]
    fn round_robin_skips_unusable_paths() {
        let paths = [
            gbit(),
            PathView {
                usable: false,
                ..gbit()
            },
            gbit(),
        ];
        assert_eq!(
            choices(&mut RoundRobin::new(1), 4096, &paths, 4),
            [0, 2, 0, 2]
        );
    }

    #[test]
    fn round_robin_stays_fair_when_paths_come_and_go() {
        let mut rr = RoundRobin::new(2);
        let mut paths = vec![gbit(), gbit(), gbit()];
        assert_eq!(choices(&mut rr, 4096, &paths, 3), [0, 0, 1]);
        // Path 1 fails mid-turn: its last repeat is forfeit.
        paths[1].usable = false;
        assert_eq!(choices(&mut rr, 4096, &paths, 4), [2, 2, 0, 0]);
        paths.truncate(1);
        assert_eq!(choices(&mut rr, 4096, &paths, 2), [0, 0]);
        paths.push(gbit());
        paths[1].usable = true;
        let picks = choices(&mut rr, 4096, &paths, 40);
        assert_eq!(tally(&picks, 2), [20, 20]);
    }

    #[test]
    fn round_robin_plan_deals_chunks_in_turn() {
        let paths = [gbit(), mbit100()];
        let plan = RoundRobin::new(1).plan(&req(4 << 20), &paths, &rules());
        let order: Vec<_> = plan.iter().map(|a| a.path).collect();
        assert_eq!(order, [0, 1, 0, 1]);
    }

    #[test]
    fn subset_never_uses_standbys_while_an_active_path_is_usable() {
        let paths = [
            PathView {
                standby: true,
                ..gbit()
            },
            mbit100(),
            PathView {
                standby: true,
                ..gbit()
            },
            mbit100(),
        ];
        let picks = choices(&mut RoundRobinSubset::new(1), 4096, &paths, 10);
        assert_eq!(tally(&picks, 4), [0, 5, 0, 5]);
    }

    #[test]
    fn subset_rotates_over_standbys_when_every_active_path_is_unusable() {
        let mut rr = RoundRobinSubset::new(1);
        let mut paths = [
            PathView {
                standby: true,
                ..gbit()
            },
            mbit100(),
            PathView {
                standby: true,
                ..gbit()
            },
        ];
        assert_eq!(choices(&mut rr, 4096, &paths, 2), [1, 1]);
        paths[1].usable = false;
        let picks = choices(&mut rr, 4096, &paths, 10);
        assert_eq!(tally(&picks, 3), [5, 0, 5]);
        // Failback: the active path returns and the standbys go quiet again.
        paths[1].usable = true;
        assert_eq!(choices(&mut rr, 4096, &paths, 3), [1, 1, 1]);
    }

    #[test]
    fn subset_uses_only_usable_standbys() {
        let paths = [
            PathView {
                usable: false,
                ..gbit()
            },
            PathView {
                standby: true,
                usable: false,
                ..gbit()
            },
            PathView {
                standby: true,
                ..mbit100()
            },
        ];
        assert_eq!(
            choices(&mut RoundRobinSubset::new(1), 4096, &paths, 3),
            [2, 2, 2]
        );
    }

    #[test]
    fn subset_with_only_standbys_configured_uses_them() {
        let paths = [
            PathView {
                standby: true,
                ..gbit()
            },
            PathView {
                standby: true,
                ..gbit()
            },
        ];
        assert_eq!(
            choices(&mut RoundRobinSubset::new(1), 4096, &paths, 4),
            [0, 1, 0, 1]
        );
    }
}
