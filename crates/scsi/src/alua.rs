//! Asymmetric logical unit access (SPC-5 5.16): each portal is its own
//! target port group, with an access state the operator may change (to
//! drain a portal before maintenance). This module says what each state
//! lets through and writes REPORT TARGET PORT GROUPS; it keeps no state.
//!
//! braid offers implicit ALUA only (TPGS = 01b): the target changes
//! states, initiators read them and never set them (SET TARGET PORT
//! GROUPS is not offered).

use super::cdb::Command;
use super::sense::{Key, Sense};

/// A target port group's asymmetric access state (SPC-5 table 83).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessState {
    ActiveOptimized,
    ActiveNonOptimized,
    Standby,
    Unavailable,
    Transitioning,
}

impl AccessState {
    /// Every state, in the order of their codes.
    pub const ALL: [AccessState; 5] = [
        AccessState::ActiveOptimized,
        AccessState::ActiveNonOptimized,
        AccessState::Standby,
        AccessState::Unavailable,
        AccessState::Transitioning,
    ];

    /// The ASYMMETRIC ACCESS STATE field's value.
    pub fn code(self) -> u8 {
        match self {
            AccessState::ActiveOptimized => 0x0,
            AccessState::ActiveNonOptimized => 0x1,
            AccessState::Standby => 0x2,
            AccessState::Unavailable => 0x3,
            AccessState::Transitioning => 0xf,
        }
    }

    /// The state's name as the command line and status show it.
    pub fn name(self) -> &'static str {
        match self {
            AccessState::ActiveOptimized => "active-optimized",
            AccessState::ActiveNonOptimized => "active-non-optimized",
            AccessState::Standby => "standby",
            AccessState::Unavailable => "unavailable",
            AccessState::Transitioning => "transitioning",
        }
    }

    /// The state named `name` (as [`Self::name`] writes it).
    pub fn from_name(name: &str) -> Option<AccessState> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether `cmd` may run through a port in this state; if not, the
    /// sense to answer (NOT READY, LOGICAL UNIT NOT ACCESSIBLE with the
    /// state's qualifier).
    ///
    /// The commands each state lets through are SPC-5 5.16.2.4.4 to
    /// 5.16.2.4.6 (and SBC-4 4.25, which adds READ CAPACITY in standby so
    /// that an initiator can size a device it sees only through a
    /// standby path). TEST UNIT READY is not among them: it is how
    /// initiators such as Linux's ALUA handler learn a path's state.
    ///
    /// # Errors
    ///
    /// The sense to answer instead of running the command.
    pub fn check(self, cmd: &Command) -> Result<(), Sense> {
        let always = matches!(
            cmd,
            Command::Inquiry { .. }
                | Command::ReportLuns { .. }
                | Command::ReportTargetPortGroups { .. }
                | Command::ReportOpcodes { .. }
                | Command::RequestSense { .. }
        );
        let (allowed, ascq) = match self {
            AccessState::ActiveOptimized | AccessState::ActiveNonOptimized => return Ok(()),
            AccessState::Standby => (
                always
                    || matches!(
                        cmd,
                        Command::ModeSense { .. }
                            | Command::ModeSelect { .. }
                            | Command::PersistentReserveIn { .. }
                            | Command::PersistentReserveOut { .. }
                            | Command::ReadCapacity10
                            | Command::ReadCapacity16 { .. }
                    ),
                0x0b,
            ),
            AccessState::Unavailable => (always, 0x0c),
            AccessState::Transitioning => (always, 0x0a),
        };
        if allowed {
            Ok(())
        } else {
            Err(Sense::new(Key::NotReady, 0x04, ascq))
        }
    }
}

/// A target port group as REPORT TARGET PORT GROUPS describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortGroup {
    pub id: u16,
    pub state: AccessState,
    /// Relative target port ids of the group's ports.
    pub ports: Vec<u16>,
}

/// States a braid port group can be put in: every one of SPC's primary
/// and secondary states except offline and logical-block dependent
/// (T_SUP, U_SUP, S_SUP, AN_SUP, AO_SUP).
const SUPPORTED: u8 = 0x80 | 0x08 | 0x04 | 0x02 | 0x01;

/// REPORT TARGET PORT GROUPS parameter data (SPC-5 6.38): one descriptor
/// per group, with its state and ports. With `extended`, the header of
/// format 1 (implicit transition time 0: a state changes at once).
pub fn report_target_port_groups(groups: &[PortGroup], extended: bool, alloc: u32) -> Vec<u8> {
    let mut body = Vec::new();
    for g in groups {
        // PREF is left clear on every group: none is preferred over
        // another, so initiators spread I/O over every active group.
        body.push(g.state.code());
        body.push(SUPPORTED);
        body.extend_from_slice(&g.id.to_be_bytes());
        // Reserved; STATUS CODE 02h when the operator set the state
        // (01h would say the target did it on its own); vendor specific.
        let status = u8::from(g.state != AccessState::ActiveOptimized) * 2;
        body.extend_from_slice(&[0, status, 0]);
        let ports = &g.ports[..g.ports.len().min(255)];
        body.push(ports.len() as u8);
        for &p in ports {
            body.extend_from_slice(&[0, 0]);
            body.extend_from_slice(&p.to_be_bytes());
        }
    }
    let header = if extended { 8 } else { 4 };
    let mut d = ((header - 4 + body.len()) as u32).to_be_bytes().to_vec();
    if extended {
        d.extend_from_slice(&[0x10, 0, 0, 0]);
    }
    d.extend(body);
    d.truncate(alloc as usize);
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups() -> Vec<PortGroup> {
        vec![
            PortGroup {
                id: 1,
                state: AccessState::ActiveOptimized,
                ports: vec![1],
            },
            PortGroup {
                id: 2,
                state: AccessState::Standby,
                ports: vec![2],
            },
        ]
    }

    #[test]
    fn every_group_is_described_with_its_state_and_port() {
        assert_eq!(
            report_target_port_groups(&groups(), false, 1024),
            [
                0, 0, 0, 24, // returned data length
                0x00, 0x8f, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, // group 1, port 1
                0x02, 0x8f, 0, 2, 0, 2, 0, 1, 0, 0, 0, 2, // group 2, standby
            ]
        );
        let ext = report_target_port_groups(&groups(), true, 1024);
        assert_eq!(&ext[..8], &[0, 0, 0, 28, 0x10, 0, 0, 0]);
        assert_eq!(ext.len(), 32);
        assert_eq!(report_target_port_groups(&groups(), true, 6).len(), 6);
    }

    #[test]
    fn a_standby_port_answers_what_spc_allows_and_not_ready_to_the_rest() {
        let read = Command::Read {
            lba: 0,
            blocks: 1,
            fua: false,
        };
        let inquiry = Command::Inquiry {
            vpd: Some(0x83),
            alloc: 255,
        };
        for s in [
            AccessState::ActiveOptimized,
            AccessState::ActiveNonOptimized,
        ] {
            assert_eq!(s.check(&read), Ok(()));
            assert_eq!(s.check(&Command::TestUnitReady), Ok(()));
        }
        let standby = AccessState::Standby;
        assert_eq!(
            standby.check(&read),
            Err(Sense::new(Key::NotReady, 0x04, 0x0b))
        );
        assert_eq!(
            standby.check(&Command::TestUnitReady),
            Err(Sense::new(Key::NotReady, 0x04, 0x0b))
        );
        assert_eq!(standby.check(&inquiry), Ok(()));
        assert_eq!(standby.check(&Command::ReadCapacity10), Ok(()));
        assert_eq!(
            AccessState::Unavailable.check(&Command::ReadCapacity10),
            Err(Sense::new(Key::NotReady, 0x04, 0x0c))
        );
        assert_eq!(
            AccessState::Transitioning.check(&read),
            Err(Sense::new(Key::NotReady, 0x04, 0x0a))
        );
        for s in AccessState::ALL {
            assert_eq!(s.check(&inquiry), Ok(()));
            assert_eq!(s.check(&Command::ReportLuns { alloc: 16 }), Ok(()));
            assert_eq!(
                s.check(&Command::ReportTargetPortGroups {
                    extended: false,
                    alloc: 16
                }),
                Ok(())
            );
            assert_eq!(AccessState::from_name(s.name()), Some(s));
        }
        assert_eq!(AccessState::from_name("offline"), None);
    }
}
