//! REPORT SUPPORTED OPERATION CODES (SPC-5 6.35): which commands the unit
//! carries out and which bits of each CDB it reads, so an initiator can
//! learn (rather than probe for) UNMAP, WRITE SAME or COMPARE AND WRITE.

use super::sense::Sense;

/// A command braid answers: opcode, service action, and the CDB usage
/// data (the opcode, then a mask of the bits read in each later byte).
/// DPO is taken (and, as a hint about caching, needs nothing done)
/// wherever MODE SENSE's DPOFUA promises it.
struct Entry {
    opcode: u8,
    action: Option<u16>,
    usage: &'static [u8],
}

const fn e(opcode: u8, action: Option<u16>, usage: &'static [u8]) -> Entry {
    Entry {
        opcode,
        action,
        usage,
    }
}

const F: u8 = 0xff;

/// Every command, in opcode order.
const TABLE: &[Entry] = &[
    e(0x00, None, &[0x00, 0, 0, 0, 0, 0]),
    e(0x03, None, &[0x03, 0, 0, 0, F, 0]),
    e(0x08, None, &[0x08, 0x1f, F, F, F, 0]),
    e(0x0a, None, &[0x0a, 0x1f, F, F, F, 0]),
    e(0x12, None, &[0x12, 0x01, F, F, F, 0]),
    e(0x15, None, &[0x15, 0x10, 0, 0, F, 0]),
    e(0x16, None, &[0x16, 0, 0, 0, 0, 0]),
    e(0x17, None, &[0x17, 0, 0, 0, 0, 0]),
    e(0x1a, None, &[0x1a, 0x08, F, F, F, 0]),
    e(0x25, None, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    e(0x28, None, &[0x28, 0x18, F, F, F, F, 0, F, F, 0]),
    e(0x2a, None, &[0x2a, 0x18, F, F, F, F, 0, F, F, 0]),
    e(0x2e, None, &[0x2e, 0x16, F, F, F, F, 0, F, F, 0]),
    e(0x2f, None, &[0x2f, 0x16, F, F, F, F, 0, F, F, 0]),
    e(0x34, None, &[0x34, 0x02, F, F, F, F, 0, F, F, 0]),
    e(0x35, None, &[0x35, 0, F, F, F, F, 0, F, F, 0]),
    e(0x41, None, &[0x41, 0x08, F, F, F, F, 0, F, F, 0]),
    e(0x42, None, &[0x42, 0, 0, 0, 0, 0, 0, F, F, 0]),
    e(0x55, None, &[0x55, 0x10, 0, 0, 0, 0, 0, F, F, 0]),
    e(0x56, None, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    e(0x57, None, &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    e(0x5a, None, &[0x5a, 0x08, F, F, 0, 0, 0, F, F, 0]),
    e(0x5e, Some(0), &[0x5e, 0x1f, 0, 0, 0, 0, 0, F, F, 0]),
    e(0x5e, Some(1), &[0x5e, 0x1f, 0, 0, 0, 0, 0, F, F, 0]),
    e(0x5e, Some(2), &[0x5e, 0x1f, 0, 0, 0, 0, 0, F, F, 0]),
    e(0x5e, Some(3), &[0x5e, 0x1f, 0, 0, 0, 0, 0, F, F, 0]),
    e(0x5f, Some(0), &[0x5f, 0x1f, F, 0, 0, F, F, F, F, 0]),
    e(0x5f, Some(1), &[0x5f, 0x1f, F, 0, 0, F, F, F, F, 0]),
    e(0x5f, Some(2), &[0x5f, 0x1f, F, 0, 0, F, F, F, F, 0]),
    e(0x5f, Some(3), &[0x5f, 0x1f, F, 0, 0, F, F, F, F, 0]),
    e(0x5f, Some(4), &[0x5f, 0x1f, F, 0, 0, F, F, F, F, 0]),
    e(0x5f, Some(5), &[0x5f, 0x1f, F, 0, 0, F, F, F, F, 0]),
    e(0x5f, Some(6), &[0x5f, 0x1f, F, 0, 0, F, F, F, F, 0]),
    e(
        0x83,
        Some(0x00),
        &[0x83, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, F, F, F, F, 0, 0],
    ),
    e(
        0x83,
        Some(0x10),
        &[0x83, 0x1f, 0, 0, 0, 0, F, F, F, F, F, F, F, F, 0, 0],
    ),
    e(
        0x83,
        Some(0x11),
        &[0x83, 0x1f, 0, 0, 0, 0, F, F, F, F, F, F, F, F, 0, 0],
    ),
    e(
        0x84,
        Some(0x03),
        &[0x84, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, F, F, F, F, 0, 0],
    ),
    e(
        0x84,
        Some(0x07),
        &[0x84, 0x1f, F, F, F, F, 0, 0, 0, 0, F, F, F, F, 0, 0],
    ),
    e(
        0x88,
        None,
        &[0x88, 0x18, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0],
    ),
    e(
        0x89,
        None,
        &[0x89, 0x18, F, F, F, F, F, F, F, F, 0, 0, 0, F, 0, 0],
    ),
    e(
        0x8a,
        None,
        &[0x8a, 0x18, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0],
    ),
    e(
        0x8b,
        None,
        &[0x8b, 0x18, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0],
    ),
    e(
        0x8e,
        None,
        &[0x8e, 0x16, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0],
    ),
    e(
        0x8f,
        None,
        &[0x8f, 0x16, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0],
    ),
    e(
        0x90,
        None,
        &[0x90, 0x02, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0],
    ),
    e(
        0x91,
        None,
        &[0x91, 0, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0],
    ),
    e(
        0x93,
        None,
        &[0x93, 0x09, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0],
    ),
    e(
        0x9e,
        Some(0x10),
        &[0x9e, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, F, F, F, F, 0, 0],
    ),
    e(
        0x9e,
        Some(0x12),
        &[0x9e, 0x1f, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0],
    ),
    e(0xa0, None, &[0xa0, 0, F, 0, 0, 0, F, F, F, F, 0, 0]),
    e(
        0xa3,
        Some(0x0a),
        &[0xa3, 0xff, 0, 0, 0, 0, F, F, F, F, 0, 0],
    ),
    e(
        0xa3,
        Some(0x0c),
        &[0xa3, 0x1f, 0x87, F, F, F, F, F, F, F, 0, 0],
    ),
    e(0xa8, None, &[0xa8, 0x18, F, F, F, F, F, F, F, F, 0, 0]),
    e(0xaa, None, &[0xaa, 0x18, F, F, F, F, F, F, F, F, 0, 0]),
    e(0xae, None, &[0xae, 0x16, F, F, F, F, F, F, F, F, 0, 0]),
    e(0xaf, None, &[0xaf, 0x16, F, F, F, F, F, F, F, F, 0, 0]),
];

/// A command timeouts descriptor: no timeouts are promised (0: none
/// stated).
const TIMEOUTS: [u8; 12] = [0, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// The answer to REPORT SUPPORTED OPERATION CODES with `options` (0 every
/// command, 1 `opcode` alone, 2 `opcode` with service action `action`, 3
/// either), with timeouts descriptors when `timeouts`; `offered` says
/// whether this unit carries out a command of the table (UNMAP only where
/// holes can be punched, for one).
///
/// # Errors
///
/// INVALID FIELD IN CDB when options 1 names a command that has service
/// actions, or options 2 one that has none.
pub fn report(
    options: u8,
    opcode: u8,
    action: u16,
    timeouts: bool,
    alloc: u32,
    offered: impl Fn(u8, Option<u16>) -> bool,
) -> Result<Vec<u8>, Sense> {
    let rows = TABLE.iter().filter(|r| offered(r.opcode, r.action));
    let mut d = Vec::new();
    if options == 0 {
        let mut body = Vec::new();
        for r in rows {
            body.extend_from_slice(&[r.opcode, 0]);
            body.extend_from_slice(&r.action.unwrap_or(0).to_be_bytes());
            body.push(0);
            body.push(u8::from(timeouts) << 1 | u8::from(r.action.is_some()));
            body.extend_from_slice(&(r.usage.len() as u16).to_be_bytes());
            if timeouts {
                body.extend_from_slice(&TIMEOUTS);
            }
        }
        d.extend_from_slice(&(body.len() as u32).to_be_bytes());
        d.extend(body);
    } else {
        let has_actions = TABLE
            .iter()
            .any(|r| r.opcode == opcode && r.action.is_some());
        let found = match options {
            // Pointed at the reporting options, so that the initiator can
            // tell this from REPORT SUPPORTED OPERATION CODES itself missing.
            1 if has_actions => return Err(Sense::INVALID_FIELD_IN_CDB.in_cdb_field(2, 2)),
            2 if !has_actions && TABLE.iter().any(|r| r.opcode == opcode) => {
                return Err(Sense::INVALID_FIELD_IN_CDB.in_cdb_field(2, 2))
            }
            1 => rows.filter(|r| r.opcode == opcode).last(),
            _ => rows
                .filter(|r| r.opcode == opcode && r.action.is_none_or(|a| a == action))
                .find(|r| options == 3 || r.action.is_some()),
        };
        match found {
            Some(r) => {
                d.extend_from_slice(&[0, u8::from(timeouts) << 7 | 0x03]);
                d.extend_from_slice(&(r.usage.len() as u16).to_be_bytes());
                d.extend_from_slice(r.usage);
                if timeouts {
                    d.extend_from_slice(&TIMEOUTS);
                }
            }
            // SUPPORT 001b: not supported.
            None => d.extend_from_slice(&[0, u8::from(timeouts) << 7 | 0x01, 0, 0]),
        }
    }
    d.truncate(alloc as usize);
    Ok(d)
}
