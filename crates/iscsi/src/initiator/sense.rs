//! Sense data as an initiator reads it (SPC-5, "Sense data"): fixed
//! (0x70/0x71) and descriptor (0x72/0x73) formats, and what the sense
//! means for the command that got it: retry it, send it elsewhere, note a
//! change on the unit, or report the error.

/// Sense keys an initiator acts on.
pub mod key {
    pub const NO_SENSE: u8 = 0x0;
    pub const RECOVERED_ERROR: u8 = 0x1;
    pub const NOT_READY: u8 = 0x2;
    pub const MEDIUM_ERROR: u8 = 0x3;
    pub const HARDWARE_ERROR: u8 = 0x4;
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    pub const UNIT_ATTENTION: u8 = 0x6;
    pub const DATA_PROTECT: u8 = 0x7;
    pub const ABORTED_COMMAND: u8 = 0xb;
}

/// The parts of sense data that decide what happens next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SenseData {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
}

impl std::fmt::Display for SenseData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sense key {:#x} ({}), ASC/ASCQ {:02x}/{:02x}",
            self.key,
            key_name(self.key),
            self.asc,
            self.ascq
        )
    }
}

fn key_name(k: u8) -> &'static str {
    match k {
        key::NO_SENSE => "no sense",
        key::RECOVERED_ERROR => "recovered error",
        key::NOT_READY => "not ready",
        key::MEDIUM_ERROR => "medium error",
        key::HARDWARE_ERROR => "hardware error",
        key::ILLEGAL_REQUEST => "illegal request",
        key::UNIT_ATTENTION => "unit attention",
        key::DATA_PROTECT => "data protect",
        key::ABORTED_COMMAND => "aborted command",
        0xe => "miscompare",
        _ => "other",
    }
}

impl SenseData {
    /// Reads sense data in either format; `None` for a response code
    /// that is neither, or data too short to hold the key and codes.
    pub fn parse(s: &[u8]) -> Option<Self> {
        match s.first()? & 0x7f {
            0x70 | 0x71 => Some(Self {
                key: s.get(2)? & 0x0f,
                // Short fixed sense (some targets send 8 bytes) has no
                // codes: they read as zero.
                asc: s.get(12).copied().unwrap_or(0),
                ascq: s.get(13).copied().unwrap_or(0),
            }),
            0x72 | 0x73 => Some(Self {
                key: s.get(1)? & 0x0f,
                asc: *s.get(2)?,
                ascq: *s.get(3)?,
            }),
            _ => None,
        }
    }

    /// What the sense means for the command and the path (see
    /// [`Verdict`]).
    pub fn verdict(&self) -> Verdict {
        match (self.key, self.asc, self.ascq) {
            // A unit attention says the command was not executed because
            // something changed: it is sent again, and the change noted.
            (key::UNIT_ATTENTION, 0x29, 0x07) => Verdict::Attention(Attention::NexusLoss),
            (key::UNIT_ATTENTION, 0x29, 0x03) => Verdict::Attention(Attention::LuReset),
            (key::UNIT_ATTENTION, 0x29, 0x00..=0x04) => Verdict::Attention(Attention::Reset),
            (key::UNIT_ATTENTION, 0x29, _) => Verdict::Attention(Attention::Other),
            (key::UNIT_ATTENTION, 0x2a, 0x06) => Verdict::Attention(Attention::AccessChanged),
            (key::UNIT_ATTENTION, 0x2a, 0x09) => Verdict::Attention(Attention::CapacityChanged),
            (key::UNIT_ATTENTION, 0x2a, 0x03..=0x05) => Verdict::Attention(Attention::Reservations),
            (key::UNIT_ATTENTION, 0x3f, 0x0e) => Verdict::Attention(Attention::LunsChanged),
            (key::UNIT_ATTENTION, _, _) => Verdict::Attention(Attention::Other),
            // ALUA (SPC-5, "Asymmetric logical unit access"): this port
            // cannot serve the unit now.
            (key::NOT_READY, 0x04, 0x0a) => Verdict::Transitioning,
            (key::NOT_READY, 0x04, 0x0b) => Verdict::Standby,
            (key::NOT_READY, 0x04, 0x0c) => Verdict::Unavailable,
            // Becoming ready, or an operation in progress: later.
            (key::NOT_READY, 0x04, 0x01 | 0x07 | 0x14) => Verdict::Retry,
            (key::ABORTED_COMMAND, _, _) => Verdict::Retry,
            (key::NO_SENSE | key::RECOVERED_ERROR, _, _) => Verdict::Success,
            _ => Verdict::Error,
        }
    }
}

/// What a CHECK CONDITION asks of the initiator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing went wrong after all (NO SENSE, RECOVERED ERROR).
    Success,
    /// Not executed because of a change: send again, after acting on it.
    Attention(Attention),
    /// Not executed; send again a little later (on any path).
    Retry,
    /// ALUA: the port is between states; send again a little later.
    Transitioning,
    /// ALUA: the port is in standby; send elsewhere.
    Standby,
    /// ALUA: the port is unavailable; send elsewhere.
    Unavailable,
    /// The command failed: report it.
    Error,
}

/// The change a unit attention announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attention {
    /// POWER ON, RESET, OR BUS DEVICE RESET OCCURRED (29/00), POWER ON
    /// (29/01), SCSI BUS RESET (29/02), DEVICE INTERNAL RESET (29/04): the
    /// unit may have lost what its volatile cache held.
    Reset,
    /// BUS DEVICE RESET FUNCTION OCCURRED (29/03): a logical unit or target
    /// reset (another initiator's task management). Tasks were aborted;
    /// nothing acknowledged was lost.
    LuReset,
    /// I_T NEXUS LOSS OCCURRED (29/07): this initiator's nexus was lost
    /// (a session ended), nothing more.
    NexusLoss,
    /// ASYMMETRIC ACCESS STATE CHANGED (2A/06): ask REPORT TARGET PORT
    /// GROUPS again.
    AccessChanged,
    /// CAPACITY DATA HAS CHANGED (2A/09).
    CapacityChanged,
    /// Reservations or registrations were preempted or released.
    Reservations,
    /// REPORTED LUNS DATA HAS CHANGED (3F/0E).
    LunsChanged,
    Other,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_and_descriptor_sense_read_alike() {
        let mut fixed = [0u8; 18];
        fixed[0] = 0x70;
        fixed[2] = 0x06;
        fixed[7] = 10;
        fixed[12] = 0x2a;
        fixed[13] = 0x06;
        let a = SenseData::parse(&fixed).unwrap();
        let d = SenseData::parse(&[0x72, 0x06, 0x2a, 0x06, 0, 0, 0, 0]).unwrap();
        assert_eq!(a, d);
        assert_eq!(a.verdict(), Verdict::Attention(Attention::AccessChanged));
        assert_eq!(
            a.to_string(),
            "sense key 0x6 (unit attention), ASC/ASCQ 2a/06"
        );
        // Deferred errors (0x71, 0x73) and the valid bit (0x80) parse too.
        assert_eq!(SenseData::parse(&[0xf1, 0, 0x03]).unwrap().key, 0x3);
        assert_eq!(SenseData::parse(&[0x73, 0x02, 4, 0x0b]).unwrap().asc, 4);
    }

    #[test]
    fn malformed_sense_is_none() {
        assert_eq!(SenseData::parse(&[]), None);
        assert_eq!(SenseData::parse(&[0x70, 0]), None);
        assert_eq!(SenseData::parse(&[0x72, 6, 0x29]), None);
        assert_eq!(SenseData::parse(&[0x00; 18]), None);
    }

    #[test]
    fn verdicts_follow_spc() {
        let v = |key, asc, ascq| SenseData { key, asc, ascq }.verdict();
        assert_eq!(v(6, 0x29, 0x00), Verdict::Attention(Attention::Reset));
        assert_eq!(v(6, 0x29, 0x07), Verdict::Attention(Attention::NexusLoss));
        assert_eq!(v(6, 0x29, 0x01), Verdict::Attention(Attention::Reset));
        assert_eq!(v(6, 0x29, 0x03), Verdict::Attention(Attention::LuReset));
        assert_eq!(v(6, 0x29, 0x05), Verdict::Attention(Attention::Other));
        assert_eq!(v(6, 0x3f, 0x0e), Verdict::Attention(Attention::LunsChanged));
        assert_eq!(v(2, 0x04, 0x0a), Verdict::Transitioning);
        assert_eq!(v(2, 0x04, 0x0b), Verdict::Standby);
        assert_eq!(v(2, 0x04, 0x0c), Verdict::Unavailable);
        assert_eq!(v(0xb, 0x47, 0x00), Verdict::Retry);
        assert_eq!(v(1, 0x17, 0x00), Verdict::Success);
        assert_eq!(v(3, 0x11, 0x00), Verdict::Error);
        assert_eq!(v(5, 0x21, 0x00), Verdict::Error);
    }
}
