//! PERSISTENT RESERVE IN answers, as an initiator reads them (SPC-5
//! 6.16): READ KEYS and READ FULL STATUS, with how much room a complete
//! answer needs, so that a caller whose buffer was too small asks again
//! with one large enough rather than taking the first keys for all of
//! them. Untrusted bytes: short or inconsistent data is an error.

use super::unit::UnitError;

/// Bytes before the list in both answers: PRGENERATION and ADDITIONAL
/// LENGTH.
const HEADER: usize = 8;

/// The room a complete answer needs, from its header: the ADDITIONAL
/// LENGTH says how many bytes the whole list has, whatever the buffer
/// held. `None` when even the header is short.
pub fn needed(d: &[u8]) -> Option<usize> {
    let len = d.get(4..8)?;
    let listed = u32::from_be_bytes(len.try_into().ok()?) as usize;
    Some(HEADER.saturating_add(listed))
}

fn listed<'a>(what: &'static str, d: &'a [u8]) -> Result<&'a [u8], UnitError> {
    let Some(need) = needed(d) else {
        return Err(UnitError {
            what,
            why: format!("{} bytes, at least {HEADER} needed", d.len()),
        });
    };
    d.get(HEADER..need).ok_or_else(|| UnitError {
        what,
        why: format!(
            "the answer lists {} bytes but {} came: ask again with room for all",
            need - HEADER,
            d.len() - HEADER
        ),
    })
}

/// Every registered key (READ KEYS).
///
/// # Errors
///
/// The answer is short of what its ADDITIONAL LENGTH says (ask again with
/// [`needed`] bytes), or that length is not whole keys.
pub fn keys(d: &[u8]) -> Result<Vec<u64>, UnitError> {
    const WHAT: &str = "READ KEYS";
    let list = listed(WHAT, d)?;
    if !list.len().is_multiple_of(8) {
        return Err(UnitError {
            what: WHAT,
            why: format!("a list of {} bytes is not whole 8-byte keys", list.len()),
        });
    }
    Ok(list
        .chunks_exact(8)
        .map(|k| u64::from_be_bytes(k.try_into().expect("8 bytes")))
        .collect())
}

/// One registration, as READ FULL STATUS describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub key: u64,
    /// The registrant's iSCSI name (lowercase, as names compare), when
    /// its TransportID is iSCSI's.
    pub initiator: Option<String>,
    /// Its ISID, when the TransportID names the initiator port (format
    /// 01b: `NAME,i,0xISID`).
    pub isid: Option<[u8; 6]>,
}

/// Every registration (READ FULL STATUS).
///
/// # Errors
///
/// The answer is short of what its ADDITIONAL LENGTH says, or a
/// descriptor runs past the list.
pub fn full_status(d: &[u8]) -> Result<Vec<Registration>, UnitError> {
    const WHAT: &str = "READ FULL STATUS";
    let mut list = listed(WHAT, d)?;
    let mut out = Vec::new();
    while !list.is_empty() {
        let bad = |why: String| UnitError { what: WHAT, why };
        if list.len() < 24 {
            return Err(bad(format!("a descriptor of {} bytes", list.len())));
        }
        let key = u64::from_be_bytes(list[..8].try_into().expect("8 bytes"));
        let tid_len = u32::from_be_bytes(list[20..24].try_into().expect("4 bytes")) as usize;
        let Some(tid) = list.get(24..24usize.saturating_add(tid_len)) else {
            return Err(bad(format!(
                "a TransportID of {tid_len} bytes past the list's end"
            )));
        };
        let (initiator, isid) = iscsi_port(tid);
        out.push(Registration {
            key,
            initiator,
            isid,
        });
        list = &list[24 + tid_len..];
    }
    Ok(out)
}

/// An iSCSI TransportID's name and ISID (SPC-5 7.6.4.6); `(None, None)`
/// for another protocol's.
fn iscsi_port(tid: &[u8]) -> (Option<String>, Option<[u8; 6]>) {
    const ISCSI: u8 = 5;
    if tid.len() < 4 || tid[0] & 0x0f != ISCSI {
        return (None, None);
    }
    let len = usize::from(u16::from_be_bytes([tid[2], tid[3]]));
    let body = &tid[4..tid.len().min(4 + len)];
    let text = body.split(|b| *b == 0).next().unwrap_or_default();
    let text = String::from_utf8_lossy(text).to_lowercase();
    match text.split_once(",i,0x") {
        Some((name, isid)) => (Some(name.to_owned()), parse_isid(isid)),
        None => (Some(text), None),
    }
}

fn parse_isid(hex: &str) -> Option<[u8; 6]> {
    if hex.len() != 12 {
        return None;
    }
    let mut out = [0u8; 6];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(list: &[u8]) -> Vec<u8> {
        let mut d = 7u32.to_be_bytes().to_vec();
        d.extend_from_slice(&(list.len() as u32).to_be_bytes());
        d.extend_from_slice(list);
        d
    }

    #[test]
    fn read_keys_are_all_read_or_the_room_needed_is_said() {
        let list: Vec<u8> = (1..=70u64).flat_map(u64::to_be_bytes).collect();
        let whole = answer(&list);
        assert_eq!(keys(&whole).unwrap(), (1..=70).collect::<Vec<_>>());
        // What a 520-byte buffer holds: 64 keys of 70.
        let cut = &whole[..8 + 64 * 8];
        assert_eq!(needed(cut), Some(8 + 70 * 8));
        let e = keys(cut).unwrap_err();
        assert!(e.why.contains("ask again"), "{e}");
        assert!(keys(&whole[..5]).is_err());
        assert!(keys(&answer(&[0; 12])).is_err(), "not whole keys");
        assert_eq!(keys(&answer(&[])).unwrap(), Vec::<u64>::new());
    }

    fn descriptor(key: u64, tid: &[u8]) -> Vec<u8> {
        let mut d = key.to_be_bytes().to_vec();
        d.extend_from_slice(&[0; 10]);
        d.extend_from_slice(&[0, 1]); // relative target port 1
        d.extend_from_slice(&(tid.len() as u32).to_be_bytes());
        d.extend_from_slice(tid);
        d
    }

    fn iscsi_tid(format: u8, text: &str) -> Vec<u8> {
        let mut name = text.as_bytes().to_vec();
        name.push(0);
        while !name.len().is_multiple_of(4) {
            name.push(0);
        }
        let mut t = vec![format << 6 | 5, 0];
        t.extend_from_slice(&(name.len() as u16).to_be_bytes());
        t.extend(name);
        t
    }

    #[test]
    fn full_status_names_each_registrant_and_its_isid() {
        let mut list = descriptor(
            0x6272,
            &iscsi_tid(1, "IQN.2026-11.org.example:Host,i,0x80123456789a"),
        );
        list.extend(descriptor(
            9,
            &iscsi_tid(0, "iqn.2026-11.org.example:other"),
        ));
        list.extend(descriptor(3, &[0, 0, 0, 0, 1, 2, 3, 4])); // Fibre Channel
        let r = full_status(&answer(&list)).unwrap();
        assert_eq!(
            r,
            [
                Registration {
                    key: 0x6272,
                    initiator: Some("iqn.2026-11.org.example:host".into()),
                    isid: Some([0x80, 0x12, 0x34, 0x56, 0x78, 0x9a]),
                },
                Registration {
                    key: 9,
                    initiator: Some("iqn.2026-11.org.example:other".into()),
                    isid: None,
                },
                Registration {
                    key: 3,
                    initiator: None,
                    isid: None,
                },
            ]
        );
        let mut past = descriptor(1, &[0x45, 0, 0, 8]);
        past[23] = 200;
        assert!(full_status(&answer(&past)).is_err());
        assert!(full_status(&answer(&[0; 10])).is_err());
    }
}
