//! Unit attention conditions (SAM-5 5.14, SPC-5 5.14): news the logical
//! unit owes one I_T nexus (its port group changed state, another
//! initiator reset the unit, its reservation was preempted, its capacity
//! changed), delivered on
//! that nexus's next command instead of running it.
//!
//! One [`Attentions`] per I_T nexus, kept by the caller. braid reports
//! with UA_INTLCK_CTRL 00b: a condition is reported once, in a CHECK
//! CONDITION, and is then cleared.

use std::collections::VecDeque;

use super::cdb::Command;
use super::sense::{Key, Sense};

/// Conditions braid establishes.
impl Sense {
    /// BUS DEVICE RESET FUNCTION OCCURRED: a LOGICAL UNIT RESET or
    /// TARGET WARM RESET from another nexus.
    pub const DEVICE_RESET: Sense = Sense::new(Key::UnitAttention, 0x29, 0x03);
    /// ASYMMETRIC ACCESS STATE CHANGED.
    pub const ACCESS_STATE_CHANGED: Sense = Sense::new(Key::UnitAttention, 0x2a, 0x06);
    /// CAPACITY DATA HAS CHANGED: the unit's size changed under the
    /// nexus (SBC-4 4.6), as after `rbd resize` of a gateway's image.
    pub const CAPACITY_CHANGED: Sense = Sense::new(Key::UnitAttention, 0x2a, 0x09);
    /// COMMANDS CLEARED BY ANOTHER INITIATOR: a CLEAR TASK SET ended this
    /// nexus's tasks.
    pub const COMMANDS_CLEARED: Sense = Sense::new(Key::UnitAttention, 0x2f, 0x00);
    /// REPORTED LUNS DATA HAS CHANGED.
    pub const REPORTED_LUNS_CHANGED: Sense = Sense::new(Key::UnitAttention, 0x3f, 0x0e);
}

/// Most conditions kept for one nexus: past it the oldest are dropped,
/// which SAM allows (a device server may keep fewer and report the most
/// important).
const MAX_PENDING: usize = 16;

/// The unit attention conditions pending for one I_T nexus, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attentions {
    pending: VecDeque<Sense>,
}

/// What a command meets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Nothing pending that this command reports: run it.
    Run,
    /// Answer CHECK CONDITION with this sense instead of running it.
    Report(Sense),
    /// REQUEST SENSE: return this as its parameter data.
    AsSenseData(Sense),
}

impl Attentions {
    /// Establishes `sense` for this nexus; one already pending is not
    /// repeated.
    pub fn raise(&mut self, sense: Sense) {
        if self.pending.contains(&sense) {
            return;
        }
        if self.pending.len() == MAX_PENDING {
            self.pending.pop_front();
        }
        self.pending.push_back(sense);
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// What `cmd` meets: INQUIRY never reports nor clears a condition;
    /// REPORT LUNS clears only REPORTED LUNS DATA HAS CHANGED and runs;
    /// REQUEST SENSE returns the oldest condition as its data; any other
    /// command is answered with the oldest, which is then cleared.
    pub fn deliver(&mut self, cmd: &Command) -> Delivery {
        match cmd {
            Command::Inquiry { .. } => Delivery::Run,
            Command::ReportLuns { .. } => {
                self.pending.retain(|s| *s != Sense::REPORTED_LUNS_CHANGED);
                Delivery::Run
            }
            Command::RequestSense { .. } => match self.pending.pop_front() {
                Some(s) => Delivery::AsSenseData(s),
                None => Delivery::Run,
            },
            _ => match self.pending.pop_front() {
                Some(s) => Delivery::Report(s),
                None => Delivery::Run,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_is_reported_once_to_the_next_command_but_inquiry() {
        let mut a = Attentions::default();
        assert_eq!(a.deliver(&Command::TestUnitReady), Delivery::Run);
        a.raise(Sense::ACCESS_STATE_CHANGED);
        a.raise(Sense::ACCESS_STATE_CHANGED);
        a.raise(Sense::DEVICE_RESET);
        let inquiry = Command::Inquiry {
            vpd: None,
            alloc: 36,
        };
        assert_eq!(a.deliver(&inquiry), Delivery::Run, "not for INQUIRY");
        assert_eq!(a.deliver(&Command::ReportLuns { alloc: 16 }), Delivery::Run);
        assert_eq!(
            a.deliver(&Command::TestUnitReady),
            Delivery::Report(Sense::ACCESS_STATE_CHANGED),
            "once, however often it was raised"
        );
        assert_eq!(
            a.deliver(&Command::RequestSense { alloc: 18 }),
            Delivery::AsSenseData(Sense::DEVICE_RESET)
        );
        assert!(a.is_empty());
        assert_eq!(a.deliver(&Command::TestUnitReady), Delivery::Run);
    }

    #[test]
    fn report_luns_clears_only_its_own_condition_and_the_queue_is_bounded() {
        let mut a = Attentions::default();
        a.raise(Sense::REPORTED_LUNS_CHANGED);
        a.raise(Sense::ACCESS_STATE_CHANGED);
        a.deliver(&Command::ReportLuns { alloc: 16 });
        assert_eq!(
            a.deliver(&Command::TestUnitReady),
            Delivery::Report(Sense::ACCESS_STATE_CHANGED)
        );
        for ascq in 0..40 {
            a.raise(Sense::new(Key::UnitAttention, 0x2a, ascq));
        }
        let mut n = 0;
        while a.deliver(&Command::TestUnitReady) != Delivery::Run {
            n += 1;
        }
        assert_eq!(n, MAX_PENDING);
    }
}
