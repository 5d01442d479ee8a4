//! What a lab is made of: link rates, the addressing scheme, and the small
//! enums that name a side or a kind of cut. Parsing and printing only; nothing
//! here touches the system.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::LabError;

/// The most paths a lab builds; the same-subnet scheme numbers client
/// addresses from .101, so the limit keeps every address inside one /24.
pub const MAX_PATHS: usize = 32;

/// A link rate, in SI units as tc counts them (1gbit = 10^9 bit/s), or
/// `unlimited` for an unshaped veth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Rate {
    /// Shaped to this many bits per second of link-layer bytes.
    BitsPerSec(u64),
    /// No shaping at all.
    Unlimited,
}

impl Rate {
    /// 1 gigabit per second.
    pub const GBIT: Rate = Rate::BitsPerSec(1_000_000_000);
    /// 100 megabits per second.
    pub const MBIT_100: Rate = Rate::BitsPerSec(100_000_000);

    /// Bits per second, or `None` when unlimited.
    pub fn bits_per_sec(self) -> Option<u64> {
        match self {
            Rate::BitsPerSec(b) => Some(b),
            Rate::Unlimited => None,
        }
    }
}

const UNITS: [(&str, u64); 5] = [
    ("tbit", 1_000_000_000_000),
    ("gbit", 1_000_000_000),
    ("mbit", 1_000_000),
    ("kbit", 1_000),
    ("bit", 1),
];

impl FromStr for Rate {
    type Err = LabError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| LabError::InvalidRate {
            input: s.to_owned(),
            reason,
        };
        let lower = s.trim().to_ascii_lowercase();
        if lower == "unlimited" {
            return Ok(Rate::Unlimited);
        }
        let (number, scale) = UNITS
            .iter()
            .find_map(|(unit, scale)| lower.strip_suffix(unit).map(|n| (n, *scale)))
            .ok_or_else(|| bad("missing unit (bit, kbit, mbit, gbit, tbit)"))?;
        let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
        let (int, frac) = match number.split_once('.') {
            Some((int, frac)) if digits(frac) => (int, frac),
            Some(_) => return Err(bad("not a decimal number")),
            None => (number, ""),
        };
        if !digits(int) {
            return Err(bad("not a decimal number"));
        }
        // Integer arithmetic so that "2.5gbit" is exactly 2_500_000_000.
        let mut bits: u64 = int
            .parse::<u64>()
            .ok()
            .and_then(|i| i.checked_mul(scale))
            .ok_or_else(|| bad("too large"))?;
        let mut place = scale;
        for d in frac.bytes() {
            place /= 10;
            if place == 0 {
                return Err(bad("finer than one bit per second"));
            }
            bits = bits
                .checked_add(u64::from(d - b'0') * place)
                .ok_or_else(|| bad("too large"))?;
        }
        if bits == 0 {
            return Err(bad("zero; use `unlimited` for no shaping"));
        }
        Ok(Rate::BitsPerSec(bits))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bits = match self {
            Rate::Unlimited => return f.write_str("unlimited"),
            Rate::BitsPerSec(b) => *b,
        };
        // The largest unit that shows the value exactly with at most three
        // decimals, so that printing then parsing gives the same rate.
        for (unit, scale) in UNITS {
            if bits >= scale && (scale < 1000 || bits % (scale / 1000) == 0) {
                let whole = bits / scale;
                let milli = (bits % scale) / (scale / 1000).max(1);
                if milli == 0 {
                    return write!(f, "{whole}{unit}");
                }
                let frac = format!("{milli:03}");
                return write!(f, "{whole}.{}{unit}", frac.trim_end_matches('0'));
            }
        }
        write!(f, "{bits}bit")
    }
}

impl TryFrom<String> for Rate {
    type Error = LabError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Rate> for String {
    fn from(r: Rate) -> String {
        r.to_string()
    }
}

/// How the paths' addresses and routes are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Addressing {
    /// Path i has its own /24: storage 10.77.i.1, client 10.77.i.2.
    #[default]
    Split,
    /// Every path in 10.77.0.0/24 (storage .i, client .100+i), with
    /// source-based policy routing on both sides so each address's traffic
    /// leaves through its own veth.
    SameSubnet,
    /// Every path in 10.77.0.0/24 with the distro default on the client:
    /// one route per interface, lowest metric wins, so the kernel sends
    /// everything out of path 1's veth whatever the source address ("ARP
    /// flux"). Only binding a socket to an interface spreads traffic. The
    /// storage side keeps per-path routing, as a braid target host would;
    /// otherwise its replies would arrive on the wrong veth and sockets
    /// bound to an interface would never see them.
    SameSubnetFlux,
}

impl Addressing {
    /// (client, storage, prefix length) for a 1-based path index.
    pub(crate) fn addrs(self, index: usize) -> (Ipv4Addr, Ipv4Addr, u8) {
        let i = u8::try_from(index).expect("path index is at most MAX_PATHS, checked in Lab::up");
        match self {
            Addressing::Split => (Ipv4Addr::new(10, 77, i, 2), Ipv4Addr::new(10, 77, i, 1), 24),
            Addressing::SameSubnet | Addressing::SameSubnetFlux => (
                Ipv4Addr::new(10, 77, 0, 100 + i),
                Ipv4Addr::new(10, 77, 0, i),
                24,
            ),
        }
    }
}

impl FromStr for Addressing {
    type Err = LabError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "split" => Ok(Addressing::Split),
            "same-subnet" => Ok(Addressing::SameSubnet),
            "flux" | "same-subnet-flux" => Ok(Addressing::SameSubnetFlux),
            _ => Err(LabError::InvalidConfig {
                reason: format!("unknown addressing {s:?}; use split, same-subnet or flux"),
            }),
        }
    }
}

impl fmt::Display for Addressing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Addressing::Split => "split",
            Addressing::SameSubnet => "same-subnet",
            Addressing::SameSubnetFlux => "flux",
        })
    }
}

/// How a rate is enforced on a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shaping {
    /// tbf over GSO super-packets of about 0.4 ms of link time, with the
    /// per-frame wire overhead charged: what the lab's figures are measured
    /// on (see `topo.rs` for why).
    #[default]
    Gso,
    /// tbf over MTU-sized packets (GSO off) with a 64 KiB bucket: a coarser
    /// shaper, closer to a switch port that lets bursts through, so that
    /// results are not tuned to one shaper's timing.
    Frames,
}

impl FromStr for Shaping {
    type Err = LabError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "gso" => Ok(Shaping::Gso),
            "frames" => Ok(Shaping::Frames),
            _ => Err(LabError::InvalidConfig {
                reason: format!("unknown shaping {s:?}; use gso or frames"),
            }),
        }
    }
}

impl fmt::Display for Shaping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Shaping::Gso => "gso",
            Shaping::Frames => "frames",
        })
    }
}

/// What to build.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabConfig {
    /// One entry per path, in path order (path 1 first).
    pub rates: Vec<Rate>,
    /// How addresses and routes are laid out.
    pub addressing: Addressing,
    /// How the rates are enforced.
    pub shaping: Shaping,
    /// `None` for a throwaway lab named after this process (tests); a name
    /// for a persistent lab (`braid-<name>-s` / `-c`) that leftover cleanup
    /// never touches.
    pub name: Option<String>,
}

impl LabConfig {
    /// A throwaway lab with these rates and split addressing.
    pub fn new(rates: impl IntoIterator<Item = Rate>) -> Self {
        LabConfig {
            rates: rates.into_iter().collect(),
            ..LabConfig::default()
        }
    }

    /// The same configuration with another shaping.
    pub fn shaping(mut self, shaping: Shaping) -> Self {
        self.shaping = shaping;
        self
    }

    /// The same configuration with another addressing scheme.
    pub fn addressing(mut self, addressing: Addressing) -> Self {
        self.addressing = addressing;
        self
    }
}

/// One of the lab's two hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The host running the initiator.
    Client,
    /// The host running the target.
    Storage,
}

impl FromStr for Side {
    type Err = LabError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "client" => Ok(Side::Client),
            "storage" => Ok(Side::Storage),
            _ => Err(LabError::InvalidConfig {
                reason: format!("unknown side {s:?}; use client or storage"),
            }),
        }
    }
}

/// How a path is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The client-side veth goes down: the kernel knows at once, sockets on
    /// it fail with "network unreachable" and routes through it vanish.
    LinkDown,
    /// Every packet of the path is dropped in both directions while the link
    /// stays up: only timeouts can notice, as with a dead switch.
    Blackhole,
}

/// A persistent lab's name becomes part of namespace names and file names.
pub(crate) fn check_name(name: &str) -> Result<(), LabError> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && (name.bytes()).all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(LabError::InvalidConfig {
            reason: format!("lab name {name:?}: use 1 to 32 of a-z, 0-9 and -"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_print() {
        for (text, bits, shown) in [
            ("1gbit", 1_000_000_000, "1gbit"),
            ("100mbit", 100_000_000, "100mbit"),
            ("2.5gbit", 2_500_000_000, "2.5gbit"),
            ("1000mbit", 1_000_000_000, "1gbit"),
            ("1.25GBit", 1_250_000_000, "1.25gbit"),
            ("640kbit", 640_000, "640kbit"),
            ("1500bit", 1_500, "1.5kbit"),
            ("7bit", 7, "7bit"),
            ("1234567bit", 1_234_567, "1234.567kbit"),
            ("1234567891bit", 1_234_567_891, "1234567.891kbit"),
        ] {
            let rate: Rate = text.parse().unwrap();
            assert_eq!(rate, Rate::BitsPerSec(bits), "{text}");
            assert_eq!(rate.to_string(), shown, "{text}");
            assert_eq!(shown.parse::<Rate>().unwrap(), rate, "{text}");
        }
        assert_eq!("unlimited".parse::<Rate>().unwrap(), Rate::Unlimited);
        assert_eq!(Rate::Unlimited.to_string(), "unlimited");
    }

    #[test]
    fn bad_rates_are_refused() {
        for text in [
            "",
            "1",
            "gbit",
            "1.gbit",
            "-1gbit",
            "0mbit",
            "1.5bit",
            "99999999tbit",
        ] {
            assert!(text.parse::<Rate>().is_err(), "{text:?} parsed");
        }
    }

    #[test]
    fn addressing_round_trips() {
        for a in [
            Addressing::Split,
            Addressing::SameSubnet,
            Addressing::SameSubnetFlux,
        ] {
            assert_eq!(a.to_string().parse::<Addressing>().unwrap(), a);
        }
        assert_eq!(
            Addressing::Split.addrs(2),
            (Ipv4Addr::new(10, 77, 2, 2), Ipv4Addr::new(10, 77, 2, 1), 24)
        );
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("lab").is_ok());
        assert!(check_name("two-paths-1").is_ok());
        for bad in ["", "Lab", "a/b", "a b", &"x".repeat(33)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
