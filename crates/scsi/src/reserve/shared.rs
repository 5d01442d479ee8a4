//! The reservations as the servers of one unit share them (the gateways
//! of a Ceph image keep them in one RADOS object), and what a change does
//! to nexuses on other servers, as the text one server sends the others.
//!
//! The shared copy is the file's text (`file.rs`) with two more lines:
//! whether the last REGISTER asked for persistence (`aptpl 0|1`), and the
//! RESERVE (6) holder (`legacy PORT NAME`). A file never holds them: a
//! file exists only while APTPL is set, and a RESERVE does not outlive a
//! restart; a unit whose ports are on several servers outlives each of
//! them, so both are kept with the rest.

use super::file::{escape, unescape};
use super::{Effects, NexusName, Reservations};
use crate::sense::{Key, Sense};

impl Reservations {
    /// The whole state as text, for the copy every server of the unit
    /// reads.
    pub fn to_shared(&self) -> String {
        let mut s = self.save();
        s += &format!("aptpl {}\n", u8::from(self.aptpl));
        if let Some(n) = &self.legacy {
            s += &format!("legacy {} {}\n", n.target_port, escape(&n.initiator_port));
        }
        s
    }

    /// What [`Reservations::to_shared`] wrote; empty text is no state.
    ///
    /// # Errors
    ///
    /// The line that could not be read.
    pub fn from_shared(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Ok(Self::default());
        }
        Self::load(text)
    }
}

impl Effects {
    /// What other servers must do for this change, as text: one line per
    /// nexus whose tasks end (`abort PORT NAME`) and per unit attention
    /// (`tell ASC ASCQ PORT NAME`), and `reset` when the unit was reset.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        if self.reset {
            s += "reset\n";
        }
        for n in &self.abort {
            s += &format!("abort {} {}\n", n.target_port, escape(&n.initiator_port));
        }
        for (n, sense) in &self.tell {
            s += &format!(
                "tell {:02x} {:02x} {} {}\n",
                sense.asc,
                sense.ascq,
                n.target_port,
                escape(&n.initiator_port)
            );
        }
        s
    }

    /// What [`Effects::to_text`] wrote (`changed` is set: it is sent only
    /// for a change).
    ///
    /// # Errors
    ///
    /// The line that could not be read.
    pub fn from_text(text: &str) -> Result<Self, String> {
        let mut fx = Effects {
            changed: true,
            ..Effects::default()
        };
        for line in text.lines().filter(|l| !l.is_empty()) {
            let bad = || format!("{line:?}");
            let nexus = |port: &str, name: &str| -> Result<NexusName, String> {
                Ok(NexusName {
                    initiator_port: unescape(name).ok_or_else(bad)?,
                    target_port: port.parse().map_err(|_| bad())?,
                })
            };
            let f: Vec<&str> = line.split(' ').collect();
            match f.as_slice() {
                ["reset"] => fx.reset = true,
                ["abort", port, name] => fx.abort.push(nexus(port, name)?),
                ["tell", asc, ascq, port, name] => {
                    let byte = |h: &str| u8::from_str_radix(h, 16).map_err(|_| bad());
                    let sense = Sense::new(Key::UnitAttention, byte(asc)?, byte(ascq)?);
                    fx.tell.push((nexus(port, name)?, sense));
                }
                _ => return Err(bad()),
            }
        }
        Ok(fx)
    }
}

#[cfg(test)]
mod tests {
    use super::super::REGISTRATIONS_PREEMPTED;
    use super::*;

    fn name(who: &str, port: u16) -> NexusName {
        NexusName::new(who, [0x40, 0, 0, 0, 0, 1], port)
    }

    fn params(key: u64, sa_key: u64, aptpl: bool) -> Vec<u8> {
        let mut p = key.to_be_bytes().to_vec();
        p.extend_from_slice(&sa_key.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 0, u8::from(aptpl), 0, 0, 0]);
        p
    }

    #[test]
    fn the_shared_copy_keeps_what_a_file_leaves_out() {
        let (a, b) = (name("iqn.2026-11.org.example:a", 1), name("iqn.x:b%", 7));
        let mut r = Reservations::default();
        r.out(&a, 0, 0, 0, &params(0, 0xa, false)).unwrap();
        r.out(&b, 0, 0, 0, &params(0, 0xb, false)).unwrap();
        r.out(&a, 1, 0, 1, &params(0xa, 0, false)).unwrap();
        let back = Reservations::from_shared(&r.to_shared()).unwrap();
        assert_eq!(back, r, "without APTPL too");
        assert!(!back.persistent());

        let mut legacy = Reservations::default();
        legacy.reserve(&b).unwrap();
        let back = Reservations::from_shared(&legacy.to_shared()).unwrap();
        assert_eq!(back, legacy);
        assert!(back.held());

        assert_eq!(
            Reservations::from_shared("").unwrap(),
            Reservations::default()
        );
        // A file never has these lines, and one that did is refused
        // as before (no format line: names as written).
        assert!(Reservations::load("generation 1\naptpl 0\n").is_err());
    }

    #[test]
    fn effects_cross_as_text_whole() {
        let (a, b) = (name("iqn.2026-11.org.example:a", 1), name("iqn.x:b c", 2));
        let fx = Effects {
            tell: vec![(b.clone(), REGISTRATIONS_PREEMPTED)],
            abort: vec![b, a],
            changed: true,
            reset: false,
        };
        assert_eq!(Effects::from_text(&fx.to_text()).unwrap(), fx);
        let reset = Effects { reset: true, ..fx };
        assert_eq!(Effects::from_text(&reset.to_text()).unwrap(), reset);
        assert!(Effects::from_text("abort x y\n").is_err());
    }
}
