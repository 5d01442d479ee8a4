//! The iSCSI portals as SCSI sees them: each portal is its own portal
//! group (its tag counts from 1 in portal order), its own target port
//! (relative port id = tag) and its own target port group (id = tag),
//! with an asymmetric access state the operator may change
//! (`braid alua`). Every target shares the table: a portal drained is
//! drained for every export.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::{AccessState, PortGroup};

/// One portal.
#[derive(Debug)]
pub struct Port {
    pub addr: SocketAddr,
    /// Portal group tag, relative target port id and target port group
    /// id, all one number.
    pub tag: u16,
    state: AtomicU8,
}

impl Port {
    pub fn state(&self) -> AccessState {
        let code = self.state.load(Ordering::Acquire);
        AccessState::ALL
            .into_iter()
            .find(|s| s.code() == code)
            .expect("only codes of AccessState are stored")
    }
}

/// Every portal, in the order they were given.
#[derive(Debug)]
pub struct PortTable {
    ports: Vec<Port>,
}

/// Why an access state could not be set.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AluaError {
    #[error("no iSCSI portal {portal}; the portals are {known}")]
    UnknownPortal { portal: String, known: String },
}

impl PortTable {
    /// Portals `addrs`, every one active/optimized.
    pub fn new(addrs: &[SocketAddr]) -> Self {
        let ports = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| Port {
                addr: *a,
                tag: u16::try_from(i + 1).unwrap_or(u16::MAX),
                state: AtomicU8::new(AccessState::ActiveOptimized.code()),
            })
            .collect();
        Self { ports }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Port> {
        self.ports.iter()
    }

    /// The port with tag `tag`.
    pub fn get(&self, tag: u16) -> &Port {
        &self.ports[usize::from(tag) - 1]
    }

    /// The port groups as REPORT TARGET PORT GROUPS describes them.
    pub fn groups(&self) -> Vec<PortGroup> {
        self.ports
            .iter()
            .map(|p| PortGroup {
                id: p.tag,
                state: p.state(),
                ports: vec![p.tag],
            })
            .collect()
    }

    /// Sets the access state of the portal `portal` (`ADDR:PORT` as the
    /// portal list shows it); returns its tag and the state it had.
    ///
    /// # Errors
    ///
    /// [`AluaError::UnknownPortal`].
    pub fn set(&self, portal: &str, state: AccessState) -> Result<(u16, AccessState), AluaError> {
        let wanted: Option<SocketAddr> = portal.parse().ok();
        let Some(p) = self.ports.iter().find(|p| Some(p.addr) == wanted) else {
            let known: Vec<String> = self.ports.iter().map(|p| p.addr.to_string()).collect();
            return Err(AluaError::UnknownPortal {
                portal: portal.to_owned(),
                known: known.join(", "),
            });
        };
        let old = p.state();
        p.state.store(state.code(), Ordering::Release);
        Ok((p.tag, old))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_portal_is_its_own_group_and_only_its_state_changes() {
        let t = PortTable::new(&[
            "10.0.1.5:3260".parse().unwrap(),
            "[fd00::5]:3260".parse().unwrap(),
        ]);
        assert_eq!(
            t.set("[fd00::5]:3260", AccessState::Standby),
            Ok((2, AccessState::ActiveOptimized))
        );
        let g = t.groups();
        assert_eq!(
            (g[0].id, g[0].state, &g[0].ports[..]),
            (1, AccessState::ActiveOptimized, &[1][..])
        );
        assert_eq!(
            (g[1].id, g[1].state, &g[1].ports[..]),
            (2, AccessState::Standby, &[2][..])
        );
        assert_eq!(t.get(2).state(), AccessState::Standby);
        let e = t.set("10.0.9.9:3260", AccessState::Standby).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no iSCSI portal 10.0.9.9:3260; the portals are 10.0.1.5:3260, [fd00::5]:3260"
        );
    }
}
