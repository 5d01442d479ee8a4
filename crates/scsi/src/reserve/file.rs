//! The reservations as a file that outlives a restart: one item a line,
//! its fields split by spaces. Numbers cannot hold a space or a line
//! break; names (an initiator port is whatever name the initiator logged
//! in with) are escaped: every byte that is not printable ASCII, and `%`
//! itself, is written `%XX`, so any name reads back as it was and none
//! can add a field or a line. Files written before names were escaped
//! have no `format` line and are read with their names as written.

use super::{NexusName, Reservations, Type};

/// The first line of a file whose names are escaped.
const FORMAT: &str = "format 2";

impl Reservations {
    /// The state as text, one item a line, for a file that outlives a
    /// restart.
    pub fn save(&self) -> String {
        let mut s = format!("{FORMAT}\ngeneration {}\n", self.generation);
        for (r, k) in &self.registrations {
            let name = escape(&r.initiator_port);
            s += &format!("register {k:016x} {} {name}\n", r.target_port);
        }
        if let Some((h, t)) = &self.holder {
            let name = escape(&h.initiator_port);
            s += &format!("reserve {} {} {name}\n", *t as u8, h.target_port);
        }
        s
    }

    /// The state [`Reservations::save`] wrote, now or before names were
    /// escaped.
    ///
    /// # Errors
    ///
    /// The line that could not be read.
    pub fn load(text: &str) -> Result<Self, String> {
        let mut r = Reservations {
            aptpl: true,
            ..Default::default()
        };
        let escaped = text.lines().next() == Some(FORMAT);
        for (i, line) in text.lines().enumerate() {
            let bad = || format!("line {}: {line:?}", i + 1);
            let f: Vec<&str> = line.split(' ').collect();
            let nexus = |port: &str, name: &str| -> Result<NexusName, String> {
                let name = if escaped {
                    unescape(name).ok_or_else(bad)?
                } else {
                    name.to_owned()
                };
                Ok(NexusName {
                    initiator_port: name,
                    target_port: port.parse().map_err(|_| bad())?,
                })
            };
            match f.as_slice() {
                ["format", "2"] if i == 0 => {}
                ["generation", g] => r.generation = g.parse().map_err(|_| bad())?,
                ["register", k, port, name] => {
                    let k = u64::from_str_radix(k, 16).map_err(|_| bad())?;
                    r.registrations.push((nexus(port, name)?, k));
                }
                ["reserve", t, port, name] => {
                    let t = t.parse().ok().and_then(Type::from_code).ok_or_else(bad)?;
                    r.holder = Some((nexus(port, name)?, t));
                }
                // Only in the copy the gateways of an image share
                // (`shared.rs`): a file holds neither.
                ["aptpl", a] if escaped => r.aptpl = *a == "1",
                ["legacy", port, name] if escaped => r.legacy = Some(nexus(port, name)?),
                [""] => {}
                _ => return Err(bad()),
            }
        }
        Ok(r)
    }
}

/// `name` with every byte outside printable ASCII, and `%`, as `%XX`.
pub(super) fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for &b in name.as_bytes() {
        if b.is_ascii_graphic() && b != b'%' {
            out.push(char::from(b));
        } else {
            out += &format!("%{b:02X}");
        }
    }
    out
}

/// What [`escape`] wrote; `None` for a `%` not followed by two hex
/// digits, or bytes that are not UTF-8.
pub(super) fn unescape(field: &str) -> Option<String> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}
