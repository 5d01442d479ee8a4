//! EXTENDED COPY (LID1, SPC-4 6.4) as a copy manager inside the target:
//! the parameter list read into the copies it asks for, each named by
//! the units its target descriptors identify, and what an initiator
//! reads to learn the copy manager's limits (RECEIVE COPY RESULTS with
//! OPERATING PARAMETERS, and the third-party copy VPD page 0x8F). Only
//! what a block target needs is offered: identification descriptor
//! target descriptors (0xE4) naming a unit by its NAA designator, and
//! block-to-block segment descriptors (0x02). ESXi's full copy (VAAI
//! XCOPY) sends exactly these, so a clone is copied here instead of
//! through the host.
//!
//! Parsing is checked in the order SPC-4 gives its errors: lengths first
//! (PARAMETER LIST LENGTH ERROR), then the descriptor counts (TOO MANY
//! TARGET / SEGMENT DESCRIPTORS), then each descriptor's type code
//! (UNSUPPORTED ... DESCRIPTOR TYPE CODE); what a segment names that
//! cannot be reached or lies outside its unit is COPY ABORTED, found
//! before any block is moved.

use crate::be::{be16, be32, be64};
use crate::sense::{Key, Sense};

/// Most target descriptors one EXTENDED COPY may carry. A copy needs
/// two (a source and a destination unit), one when both are the same;
/// a few more let an initiator name every unit once in a list of
/// several segments.
pub const MAX_TARGETS: u16 = 8;

/// Most segment descriptors one EXTENDED COPY may carry. ESXi sends one
/// segment per command; 64 segments of the most a block-to-block
/// segment may carry (65535 blocks, about 32 MiB) keep one command under
/// 2 GiB of copying, which the target finishes well inside an
/// initiator's command timeout.
pub const MAX_SEGMENTS: u16 = 64;

/// Bytes of one identification target descriptor and of one
/// block-to-block segment descriptor.
const TARGET_LEN: usize = 32;
const SEGMENT_LEN: usize = 28;

/// Most bytes of descriptors one list may carry: every descriptor at
/// once, and no more (which also keeps the list inside the target's
/// bound on parameter data).
pub const MAX_LIST: u32 =
    MAX_TARGETS as u32 * TARGET_LEN as u32 + MAX_SEGMENTS as u32 * SEGMENT_LEN as u32;

/// Most bytes one segment may copy: a block-to-block segment counts
/// blocks in 16 bits.
pub const MAX_SEGMENT_BYTES: u32 = 0xffff * 512;

/// The parameter list header's length.
const HEADER: usize = 16;

/// Identification descriptor target descriptor (SPC-4 6.4.5.6).
const IDENTIFICATION: u8 = 0xe4;
/// Block device to block device segment descriptor (SPC-4 6.4.6.5).
const BLOCK_TO_BLOCK: u8 = 0x02;

/// RECEIVE COPY RESULTS service actions braid answers (SPC-4 6.18).
pub const COPY_STATUS: u8 = 0x00;
pub const OPERATING_PARAMETERS: u8 = 0x03;

pub const EXTENDED_COPY: u8 = 0x83;
pub const RECEIVE_COPY_RESULTS: u8 = 0x84;

const fn illegal(asc: u8, ascq: u8) -> Sense {
    Sense::new(Key::IllegalRequest, asc, ascq)
}

pub const INVALID_FIELD_IN_PARAMETERS: Sense = illegal(0x26, 0x00);
pub const TOO_MANY_TARGETS: Sense = illegal(0x26, 0x06);
pub const UNSUPPORTED_TARGET_TYPE: Sense = illegal(0x26, 0x07);
pub const TOO_MANY_SEGMENTS: Sense = illegal(0x26, 0x08);
pub const UNSUPPORTED_SEGMENT_TYPE: Sense = illegal(0x26, 0x09);
/// A segment names a target descriptor the list does not have, or a
/// unit this copy manager cannot reach.
pub const UNREACHABLE: Sense = Sense::new(Key::CopyAborted, 0x0d, 0x02);
/// A segment's blocks lie past the end of its unit.
pub const OUT_OF_RANGE: Sense = Sense::new(Key::CopyAborted, 0x00, 0x00);

/// A unit a target descriptor names: its NAA designator (VPD page 0x83)
/// and the block size it was named with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Named {
    pub naa: [u8; 16],
    pub block_size: u32,
}

/// One block-to-block segment, as sent: target descriptor indexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub source: u16,
    pub destination: u16,
    pub blocks: u16,
    pub source_lba: u64,
    pub destination_lba: u64,
}

/// An EXTENDED COPY parameter list, read and checked for form.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyList {
    /// The list identifier, when its results are to be held for COPY
    /// STATUS (LIST ID USAGE 00b or 10b).
    pub list_id: Option<u8>,
    /// Each target descriptor's unit, `None` for one that names a unit
    /// by another kind of designator (unreachable if a segment uses it).
    pub targets: Vec<Option<Named>>,
    pub segments: Vec<Segment>,
}

/// One copy to carry out: `blocks` from `source_lba` of unit `source` to
/// `destination_lba` of unit `destination`, the units being whatever the
/// target's resolver returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy<U> {
    pub source: U,
    pub source_lba: u64,
    pub destination: U,
    pub destination_lba: u64,
    pub blocks: u64,
}

/// Reads an EXTENDED COPY (LID1) parameter list. An empty list is no
/// copy at all (SPC-4: a parameter list length of 0 is not an error).
///
/// # Errors
///
/// The sense to answer, as the module describes.
pub fn parse(params: &[u8]) -> Result<CopyList, Sense> {
    if params.is_empty() {
        return Ok(CopyList::default());
    }
    if params.len() < HEADER {
        return Err(Sense::PARAMETER_LIST_LENGTH);
    }
    // LIST ID USAGE 01b is reserved; 11b asks that no results be held.
    let usage = (params[1] >> 3) & 0x03;
    if usage == 0x01 {
        return Err(INVALID_FIELD_IN_PARAMETERS);
    }
    let targets_len = usize::from(be16(&params[2..4]));
    let segments_len = be32(&params[8..12]) as usize;
    let inline_len = be32(&params[12..16]) as usize;
    let total = targets_len
        .checked_add(segments_len)
        .and_then(|n| n.checked_add(inline_len));
    match total {
        Some(n) if n <= MAX_LIST as usize && HEADER + n <= params.len() => {}
        _ => return Err(Sense::PARAMETER_LIST_LENGTH),
    }
    if inline_len != 0 {
        // No segment descriptor offered here reads inline data.
        return Err(INVALID_FIELD_IN_PARAMETERS);
    }
    let targets_at = &params[HEADER..HEADER + targets_len];
    let segments_at = &params[HEADER + targets_len..HEADER + targets_len + segments_len];
    if targets_len % TARGET_LEN != 0 {
        return Err(Sense::PARAMETER_LIST_LENGTH);
    }
    if targets_len / TARGET_LEN > usize::from(MAX_TARGETS) {
        return Err(TOO_MANY_TARGETS);
    }
    let segments = segment_slices(segments_at)?;
    if segments.len() > usize::from(MAX_SEGMENTS) {
        return Err(TOO_MANY_SEGMENTS);
    }
    let targets = targets_at
        .chunks_exact(TARGET_LEN)
        .map(target)
        .collect::<Result<_, _>>()?;
    let segments = segments
        .into_iter()
        .map(segment)
        .collect::<Result<_, _>>()?;
    Ok(CopyList {
        list_id: (usage != 0x03).then_some(params[0]),
        targets,
        segments,
    })
}

/// The segment descriptors, each with its own length (bytes 2..4 count
/// what follows byte 3).
fn segment_slices(mut at: &[u8]) -> Result<Vec<&[u8]>, Sense> {
    let mut out = Vec::new();
    while !at.is_empty() {
        if at.len() < 4 {
            return Err(Sense::PARAMETER_LIST_LENGTH);
        }
        let len = 4 + usize::from(be16(&at[2..4]));
        if at.len() < len {
            return Err(Sense::PARAMETER_LIST_LENGTH);
        }
        out.push(&at[..len]);
        at = &at[len..];
    }
    Ok(out)
}

/// One target descriptor: an identification descriptor naming a block
/// device. The LU ID TYPE and NUL bits are not read (SPC-4 made them
/// obsolete for this descriptor).
fn target(d: &[u8]) -> Result<Option<Named>, Sense> {
    if d[0] != IDENTIFICATION {
        return Err(UNSUPPORTED_TARGET_TYPE);
    }
    if d[1] & 0x1f != 0 {
        // Only direct-access block devices are copied to and from.
        return Err(UNSUPPORTED_TARGET_TYPE);
    }
    // The designation descriptor (bytes 4..24): code set binary,
    // association logical unit, type NAA, sixteen bytes.
    let (code_set, association, kind, len) = (d[4] & 0x0f, (d[5] >> 4) & 0x03, d[5] & 0x0f, d[7]);
    let block_size = u32::from_be_bytes([0, d[29], d[30], d[31]]);
    if code_set != 1 || association != 0 || kind != 3 || len != 16 {
        return Ok(None);
    }
    let mut naa = [0u8; 16];
    naa.copy_from_slice(&d[8..24]);
    Ok(Some(Named { naa, block_size }))
}

fn segment(d: &[u8]) -> Result<Segment, Sense> {
    if d[0] != BLOCK_TO_BLOCK {
        return Err(UNSUPPORTED_SEGMENT_TYPE);
    }
    if d.len() != SEGMENT_LEN {
        return Err(INVALID_FIELD_IN_PARAMETERS);
    }
    Ok(Segment {
        source: be16(&d[4..6]),
        destination: be16(&d[6..8]),
        blocks: be16(&d[10..12]),
        source_lba: be64(&d[12..20]),
        destination_lba: be64(&d[20..28]),
    })
}

/// What a unit the copy manager found is: `(unit, capacity in blocks,
/// writable)`.
pub type Found<U> = (U, u64, bool);

/// The copies `list` asks for, each unit found by `find` (the units this
/// target serves, by NAA designator), every segment checked before any
/// block moves: a segment whose descriptor or unit is missing, or whose
/// blocks lie outside its units, aborts the whole copy.
///
/// # Errors
///
/// COPY ABORTED (unreachable or out of range), or WRITE PROTECTED for a
/// destination that may not be written.
pub fn resolve<U: Clone>(
    list: &CopyList,
    block_size: u32,
    mut find: impl FnMut(&[u8; 16]) -> Option<Found<U>>,
) -> Result<Vec<Copy<U>>, Sense> {
    let mut unit = |index: u16| -> Result<Found<U>, Sense> {
        match list.targets.get(usize::from(index)) {
            Some(Some(n)) if n.block_size == block_size => find(&n.naa).ok_or(UNREACHABLE),
            _ => Err(UNREACHABLE),
        }
    };
    let mut copies = Vec::with_capacity(list.segments.len());
    for s in &list.segments {
        let (source, source_blocks, _) = unit(s.source)?;
        let (destination, destination_blocks, writable) = unit(s.destination)?;
        let blocks = u64::from(s.blocks);
        let inside =
            |lba: u64, capacity: u64| lba.checked_add(blocks).is_some_and(|e| e <= capacity);
        if !inside(s.source_lba, source_blocks) || !inside(s.destination_lba, destination_blocks) {
            return Err(OUT_OF_RANGE);
        }
        if !writable {
            return Err(Sense::WRITE_PROTECTED);
        }
        copies.push(Copy {
            source,
            source_lba: s.source_lba,
            destination,
            destination_lba: s.destination_lba,
            blocks,
        });
    }
    Ok(copies)
}

/// How a copy ended, held for COPY STATUS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// Every segment was copied.
    pub ok: bool,
    /// Segments copied whole.
    pub segments: u16,
    /// Bytes written to destinations.
    pub bytes: u64,
}

/// The results of copies that ended, by I_T nexus and list identifier
/// (SPC-4 holds them per nexus): the latest of each, at most 256 per
/// unit.
pub type Results = crate::held::Held<Status>;

/// RECEIVE COPY RESULTS with service action `action`, cut to `alloc`;
/// `held` gives the status of the copy asked about.
///
/// # Errors
///
/// INVALID FIELD IN CDB for COPY STATUS of a copy whose results are not
/// held, and for the service actions not offered (LID1 copies end before
/// EXTENDED COPY answers, so none is ever in progress to ask about).
pub fn receive_copy_results(
    action: u8,
    alloc: u32,
    held: impl FnOnce() -> Option<Status>,
) -> Result<Vec<u8>, Sense> {
    let mut d = match action {
        OPERATING_PARAMETERS => operating_parameters(),
        COPY_STATUS => match held() {
            Some(s) => copy_status(s),
            None => return Err(Sense::INVALID_FIELD_IN_CDB.in_cdb_field(2, 7)),
        },
        _ => return Err(Sense::INVALID_FIELD_IN_CDB.in_cdb_field(1, 4)),
    };
    d.truncate(alloc as usize);
    Ok(d)
}

/// COPY STATUS (SPC-4 6.18.3): completed with or without errors, the
/// segments processed, and the bytes written in the smallest unit that
/// holds the count in 32 bits.
fn copy_status(s: Status) -> Vec<u8> {
    let mut d = vec![0u8; 12];
    d[3] = 8;
    d[4] = if s.ok { 0x01 } else { 0x02 };
    d[5..7].copy_from_slice(&s.segments.to_be_bytes());
    // Units: bytes (00h), kibibytes (01h), mebibytes (02h), ... (F1h is
    // logical blocks, which this count is not).
    let (mut units, mut count) = (0u8, s.bytes);
    while count > u64::from(u32::MAX) {
        units += 1;
        count >>= 10;
    }
    d[7] = units;
    d[8..12].copy_from_slice(&(count as u32).to_be_bytes());
    d
}

/// OPERATING PARAMETERS (SPC-4 6.18.5): the copy manager's limits.
fn operating_parameters() -> Vec<u8> {
    let implemented = [BLOCK_TO_BLOCK, IDENTIFICATION];
    let mut d = vec![0u8; 44];
    d[4] = 0x01; // SNLID: a list identifier need not be unique
    d[8..10].copy_from_slice(&MAX_TARGETS.to_be_bytes());
    d[10..12].copy_from_slice(&MAX_SEGMENTS.to_be_bytes());
    d[12..16].copy_from_slice(&MAX_LIST.to_be_bytes());
    d[16..20].copy_from_slice(&MAX_SEGMENT_BYTES.to_be_bytes());
    // Inline data, held data and stream transfers: none (bytes 20..32).
    // One copy runs at a time per command; every command may copy.
    d[34..36].copy_from_slice(&1u16.to_be_bytes());
    d[36] = 1;
    d[37] = 9; // data segment granularity: 2^9, one block
    d[43] = implemented.len() as u8;
    d.extend_from_slice(&implemented);
    let available = (d.len() - 4) as u32;
    d[0..4].copy_from_slice(&available.to_be_bytes());
    d
}

/// The third-party copy VPD page's body (SPC-4 7.8.17): a Supported
/// Commands descriptor naming EXTENDED COPY (LID1), POPULATE TOKEN and
/// WRITE USING TOKEN, and RECEIVE COPY RESULTS' COPY STATUS, OPERATING
/// PARAMETERS and RECEIVE ROD TOKEN INFORMATION, so that an initiator
/// asks nothing else; then token copy's own descriptors
/// ([`crate::rod::third_party_copy_descriptors`]).
pub fn third_party_copy_page() -> Vec<u8> {
    use crate::rod::{POPULATE_TOKEN, RECEIVE_ROD_TOKEN_INFORMATION, WRITE_USING_TOKEN};
    let commands = [
        EXTENDED_COPY,
        3,
        0x00,
        POPULATE_TOKEN,
        WRITE_USING_TOKEN,
        RECEIVE_COPY_RESULTS,
        3,
        COPY_STATUS,
        OPERATING_PARAMETERS,
        RECEIVE_ROD_TOKEN_INFORMATION,
    ];
    let mut body = vec![commands.len() as u8];
    body.extend_from_slice(&commands);
    body.resize(body.len().div_ceil(4) * 4, 0);
    let mut d = 0x0001u16.to_be_bytes().to_vec(); // Supported Commands
    d.extend_from_slice(&(body.len() as u16).to_be_bytes());
    d.extend(body);
    d.extend(crate::rod::third_party_copy_descriptors());
    d
}

#[cfg(test)]
#[path = "xcopy_tests.rs"]
mod tests;
