//! The iSCSI portals as SCSI sees them: each portal is its own portal
//! group, its own target port (relative port id = tag) and its own target
//! port group (id = tag), with an asymmetric access state the operator
//! may change (`braid alua`). Every target shares the table: a portal
//! drained is drained for every export.
//!
//! A tag belongs to a portal address, not to its place in `--listen`:
//! saved reservations name the relative port, and initiators remember
//! port groups, so reordering `--listen` or adding an address must not
//! move them to another portal. [`PortIds`] keeps the tags given so far
//! (the target saves its text in the state directory); a new address gets
//! the next tag never given, and no tag is given twice.

use std::fmt::Write as _;
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

/// Tags given to portal addresses, kept across restarts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortIds {
    given: Vec<(SocketAddr, u16)>,
}

/// Why kept tags could not be read or another given.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PortIdsError {
    #[error(
        "line {line}: expected `TAG ADDRESS:PORT` with a tag from 1 to 65535, found {found:?}"
    )]
    Line { line: usize, found: String },
    #[error("line {line}: tag {tag} or address {addr} is given twice")]
    Twice {
        line: usize,
        tag: u16,
        addr: SocketAddr,
    },
    #[error("every tag from 1 to 65535 has been given to a portal address")]
    Exhausted,
}

impl PortIds {
    /// The tags in `text`, as [`Self::save`] writes them.
    ///
    /// # Errors
    ///
    /// A line that is not `TAG ADDRESS:PORT`, or a tag or address twice.
    pub fn load(text: &str) -> Result<Self, PortIdsError> {
        let mut ids = Self::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || PortIdsError::Line {
                line: n + 1,
                found: line.chars().take(80).collect(),
            };
            let (tag, addr) = line.split_once(' ').ok_or_else(bad)?;
            let tag: u16 = tag.parse().map_err(|_| bad())?;
            let addr: SocketAddr = addr.trim().parse().map_err(|_| bad())?;
            if tag == 0 {
                return Err(bad());
            }
            if ids.given.iter().any(|(a, t)| *a == addr || *t == tag) {
                return Err(PortIdsError::Twice {
                    line: n + 1,
                    tag,
                    addr,
                });
            }
            ids.given.push((addr, tag));
        }
        Ok(ids)
    }

    /// The text [`Self::load`] reads: one `TAG ADDRESS:PORT` a line. An
    /// address's text has no space or line break, so no line can be
    /// forged through one.
    pub fn save(&self) -> String {
        let mut out = String::from(
            "# iSCSI portal group tags (relative target port and target port group ids) by \
             portal address; a tag is never given to another address\n",
        );
        for (addr, tag) in &self.given {
            let _ = writeln!(out, "{tag} {addr}");
        }
        out
    }

    /// The tag of each of `addrs`, giving each address new to these ids
    /// the next tag never given; whether any was new.
    ///
    /// # Errors
    ///
    /// [`PortIdsError::Exhausted`].
    pub fn assign(&mut self, addrs: &[SocketAddr]) -> Result<(Vec<u16>, bool), PortIdsError> {
        let mut new = false;
        let mut tags = Vec::with_capacity(addrs.len());
        for a in addrs {
            let tag = match self.given.iter().find(|(g, _)| g == a) {
                Some((_, t)) => *t,
                None => {
                    let last = self.given.iter().map(|(_, t)| *t).max().unwrap_or(0);
                    let t = last.checked_add(1).ok_or(PortIdsError::Exhausted)?;
                    self.given.push((*a, t));
                    new = true;
                    t
                }
            };
            tags.push(tag);
        }
        Ok((tags, new))
    }
}

impl PortTable {
    /// Portals `addrs`, tagged from 1 in their order (nothing kept), every
    /// one active/optimized.
    pub fn new(addrs: &[SocketAddr]) -> Self {
        let tagged: Vec<(SocketAddr, u16)> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| (*a, u16::try_from(i + 1).unwrap_or(u16::MAX)))
            .collect();
        Self::tagged(&tagged)
    }

    /// Portals with the tags given (by [`PortIds::assign`]), every one
    /// active/optimized.
    pub fn tagged(ports: &[(SocketAddr, u16)]) -> Self {
        let ports = ports
            .iter()
            .map(|(addr, tag)| Port {
                addr: *addr,
                tag: *tag,
                state: AtomicU8::new(AccessState::ActiveOptimized.code()),
            })
            .collect();
        Self { ports }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Port> {
        self.ports.iter()
    }

    /// The port with tag `tag` (one of the table's).
    pub fn get(&self, tag: u16) -> &Port {
        self.ports
            .iter()
            .find(|p| p.tag == tag)
            .expect("a tag of this table")
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

    #[test]
    fn a_portal_keeps_its_tag_whatever_the_order_and_no_tag_is_given_twice() {
        let (a, b, c): (SocketAddr, SocketAddr, SocketAddr) = (
            "10.0.1.5:3260".parse().unwrap(),
            "[fd00::5]:3260".parse().unwrap(),
            "10.0.2.5:3260".parse().unwrap(),
        );
        let mut ids = PortIds::default();
        assert_eq!(ids.assign(&[a, b]), Ok((vec![1, 2], true)));
        let mut ids = PortIds::load(&ids.save()).unwrap();
        assert_eq!(ids.assign(&[b, a]), Ok((vec![2, 1], false)));
        assert_eq!(ids.assign(&[c, b]), Ok((vec![3, 2], true)));
        // a is not served now, and its tag stays its own.
        let mut ids = PortIds::load(&ids.save()).unwrap();
        let d: SocketAddr = "10.0.3.5:3260".parse().unwrap();
        assert_eq!(ids.assign(&[d, a]), Ok((vec![4, 1], true)));
        let t = PortTable::tagged(&[(d, 4), (a, 1)]);
        assert_eq!(t.get(1).addr, a);
        assert_eq!(t.groups().iter().map(|g| g.id).collect::<Vec<_>>(), [4, 1]);
    }

    #[test]
    fn kept_tags_that_are_not_what_braid_writes_are_refused_by_line() {
        let e = PortIds::load("1 10.0.1.5:3260\n2 10.0.1.5:3260\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 2: tag 2 or address 10.0.1.5:3260 is given twice"
        );
        for bad in [
            "0 10.0.1.5:3260",
            "1 10.0.1.5",
            "x 10.0.1.5:3260",
            "65536 10.0.1.5:1",
        ] {
            assert!(
                matches!(PortIds::load(bad), Err(PortIdsError::Line { line: 1, .. })),
                "{bad}"
            );
        }
        let mut full = PortIds::load("65535 10.0.1.5:3260").unwrap();
        let other: SocketAddr = "10.0.1.6:3260".parse().unwrap();
        assert_eq!(full.assign(&[other]), Err(PortIdsError::Exhausted));
    }
}
