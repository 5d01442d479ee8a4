//! Command numbering (RFC 7143, "Command Numbering and Acknowledging"):
//! CmdSN, ExpCmdSN and MaxCmdSN compared as serial numbers (RFC 1982), so
//! that they keep working when they wrap past 2^32.

/// `a < b` in 32-bit serial number arithmetic.
pub fn lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 1 << 31
}

/// `a <= b` in serial number arithmetic.
pub fn le(a: u32, b: u32) -> bool {
    a == b || lt(a, b)
}

/// The target's command window for one session: which CmdSNs it accepts,
/// and what it tells the initiator in every response.
///
/// MaxCmdSN is honest about what the target can queue: `depth` commands
/// may be running at once, so the window offers `depth` minus those still
/// running. Taking a command moves ExpCmdSN and fills one place, leaving
/// MaxCmdSN where it was; finishing one frees its place and moves MaxCmdSN
/// on. So MaxCmdSN never goes back, and with every place taken it is
/// ExpCmdSN - 1, which RFC 7143 reads as "no room now".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The next CmdSN expected.
    pub exp: u32,
    depth: u32,
    running: u32,
    /// Immediate SCSI commands taken and not yet finished.
    immediate: u32,
}

/// Immediate SCSI commands a session may have running at once. They take
/// no place in the window, so without a bound of their own an initiator
/// could start any number (RFC 7143 3.2.2.1 leaves the bound to the
/// target). Linux and libiscsi send none; an initiator that does sends
/// one now and then, which a handful covers.
pub const IMMEDIATE_DEPTH: u32 = 8;

/// What becomes of an immediate SCSI command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Immediate {
    /// Run it; it holds one of [`IMMEDIATE_DEPTH`] places until
    /// [`Window::finish_immediate`].
    Take,
    /// Its CmdSN is acceptable but [`IMMEDIATE_DEPTH`] are running:
    /// Reject it with reason 0x06, Immediate Command Reject (RFC 7143
    /// 11.17.1), which says exactly that and costs no task. TASK SET FULL
    /// would say the same but needs the command entered as a task first.
    Reject,
    /// Its CmdSN is outside the window: ignored, as for any command.
    Ignore,
}

/// Where a non-immediate command's CmdSN falls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// It is the next one and there is room: take it.
    Next,
    /// Within the window but ahead of a gap: hold it until the gap fills
    /// (commands may arrive out of order over several connections).
    Ahead,
    /// Already seen, or beyond what the target allowed: the RFC has it
    /// silently ignored.
    Outside,
}

impl Window {
    /// A window starting at `exp` (the CmdSN of the login) with room for
    /// `depth` commands at once.
    pub fn new(exp: u32, depth: u32) -> Self {
        Self {
            exp,
            depth: depth.max(1),
            running: 0,
            immediate: 0,
        }
    }

    /// MaxCmdSN as responses state it: the last CmdSN accepted now.
    pub fn max(&self) -> u32 {
        self.exp
            .wrapping_add(self.depth - self.running)
            .wrapping_sub(1)
    }

    /// Commands taken and not yet finished.
    pub fn running(&self) -> u32 {
        self.running
    }

    /// Classifies a non-immediate command's CmdSN.
    pub fn place(&self, cmd_sn: u32) -> Place {
        if self.running == self.depth {
            Place::Outside
        } else if cmd_sn == self.exp {
            Place::Next
        } else if lt(self.exp, cmd_sn) && le(cmd_sn, self.max()) {
            Place::Ahead
        } else {
            Place::Outside
        }
    }

    /// The next command was taken: ExpCmdSN moves on, and the command
    /// holds a place until [`Self::finish`].
    pub fn take(&mut self) {
        self.exp = self.exp.wrapping_add(1);
        self.running = (self.running + 1).min(self.depth);
    }

    /// A command taken earlier has finished: its place is free again.
    pub fn finish(&mut self) {
        self.running = self.running.saturating_sub(1);
    }

    /// Whether an immediate command's CmdSN is acceptable: immediate
    /// commands carry the CmdSN of the next non-immediate command and do
    /// not advance it. They take no place (task management must get
    /// through a full queue), so any CmdSN from ExpCmdSN to the end of
    /// the whole window will do.
    pub fn immediate_ok(&self, cmd_sn: u32) -> bool {
        le(self.exp, cmd_sn) && le(cmd_sn, self.exp.wrapping_add(self.depth - 1))
    }

    /// Decides an immediate SCSI command (task management, pings and
    /// text take [`Self::immediate_ok`] alone: they must get through).
    pub fn take_immediate(&mut self, cmd_sn: u32) -> Immediate {
        if !self.immediate_ok(cmd_sn) {
            Immediate::Ignore
        } else if self.immediate >= IMMEDIATE_DEPTH {
            Immediate::Reject
        } else {
            self.immediate += 1;
            Immediate::Take
        }
    }

    /// An immediate SCSI command taken earlier has been answered.
    pub fn finish_immediate(&mut self) {
        self.immediate = self.immediate.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_comparisons_survive_the_wrap() {
        assert!(lt(1, 2));
        assert!(!lt(2, 1));
        assert!(lt(u32::MAX, 0), "0 follows 2^32 - 1");
        assert!(lt(u32::MAX - 5, 3));
        assert!(!lt(5, 5) && le(5, 5));
    }

    #[test]
    fn the_window_takes_the_next_holds_ahead_and_ignores_the_rest() {
        let mut w = Window::new(u32::MAX - 1, 4);
        assert_eq!(w.max(), 1);
        assert_eq!(w.place(u32::MAX - 1), Place::Next);
        assert_eq!(w.place(u32::MAX), Place::Ahead);
        assert_eq!(w.place(1), Place::Ahead, "across the wrap");
        assert_eq!(w.place(2), Place::Outside, "beyond MaxCmdSN");
        assert_eq!(w.place(u32::MAX - 2), Place::Outside, "already taken");
        w.take();
        w.take();
        w.finish();
        w.finish();
        assert_eq!((w.exp, w.max()), (0, 3));
        assert!(w.immediate_ok(0) && w.immediate_ok(3) && !w.immediate_ok(4));
        assert_eq!(
            Window::new(7, 0).max(),
            7,
            "a window holds at least one command"
        );
    }

    #[test]
    fn max_cmd_sn_offers_only_free_places_and_never_goes_back() {
        let mut w = Window::new(10, 3);
        assert_eq!(w.max(), 12);
        w.take();
        assert_eq!((w.exp, w.max()), (11, 12), "taking leaves MaxCmdSN");
        w.take();
        w.take();
        assert_eq!((w.exp, w.max(), w.running()), (13, 12, 3));
        assert_eq!(w.place(13), Place::Outside, "no room: ExpCmdSN - 1");
        assert!(w.immediate_ok(13), "task management still gets in");
        w.finish();
        assert_eq!(w.max(), 13, "a finished command frees its place");
        assert_eq!(w.place(13), Place::Next);
    }

    #[test]
    fn immediate_commands_are_bounded_apart_from_the_window() {
        let mut w = Window::new(10, 2);
        assert_eq!(w.take_immediate(9), Immediate::Ignore, "already taken");
        assert_eq!(w.take_immediate(12), Immediate::Ignore, "past the window");
        for _ in 0..IMMEDIATE_DEPTH {
            assert_eq!(w.take_immediate(10), Immediate::Take);
        }
        assert_eq!(w.take_immediate(11), Immediate::Reject);
        assert_eq!((w.exp, w.max()), (10, 11), "the window did not move");
        w.finish_immediate();
        assert_eq!(w.take_immediate(10), Immediate::Take, "a place came back");
        assert!(w.immediate_ok(10), "task management still gets in");
    }
}
