//! Token copy (SBC-4 5.x POPULATE TOKEN and WRITE USING TOKEN, SPC-4
//! 6.21 RECEIVE ROD TOKEN INFORMATION): what Windows calls ODX. An
//! initiator asks the unit for a token that stands for a list of its
//! ranges, reads the token back, and hands it to any unit of the same
//! copy manager with ranges of its own to write: the blocks then move
//! inside the target, not through the host.
//!
//! This module reads the parameter lists, holds the tokens (server-wide,
//! since a token may be written to another unit than the one that made
//! it) with their inactivity timeouts, maps a token's ranges onto the
//! destination's, and builds the answers; the time and the random bytes
//! that make a token unguessable are passed in. The target carries out
//! the copy (`braid-iscsi-target`'s `rod`). Time is a [`Duration`] from
//! any start the caller keeps, so no clock is read here.
//!
//! The one token type offered is "access upon reference" (SPC-4's ROD
//! type 0080_0000h): a WRITE USING TOKEN copies the source blocks as they
//! are when it runs, as SPC-4 allows a copy manager to choose when the
//! initiator leaves the type to it (Windows does). A token that is
//! unknown, expired or deleted is refused with INVALID TOKEN OPERATION
//! before any block moves.

use std::sync::Mutex;
use std::time::Duration;

use crate::be::{be16, be32, be64};
use crate::sense::{Key, Sense};

/// Service actions of operation code 0x83 and 0x84 this module answers.
pub const POPULATE_TOKEN: u8 = 0x10;
pub const WRITE_USING_TOKEN: u8 = 0x11;
pub const RECEIVE_ROD_TOKEN_INFORMATION: u8 = 0x07;

/// Bytes of a ROD token (SPC-4 8.3.1: the type, the length 01F8h, and
/// 504 bytes more).
pub const TOKEN_LEN: usize = 512;

/// Random bytes a token carries so that no initiator can forge one.
pub const RANDOM_LEN: usize = 384;

/// The ROD type of every token made here: access upon reference.
pub const ROD_TYPE_AUR: u32 = 0x0080_0000;

/// Most block device range descriptors one list may carry.
pub const MAX_RANGES: u16 = 64;

/// Most blocks one token may stand for, and one WRITE USING TOKEN may
/// write: 256 MiB of 512-byte blocks, so that the copy one command asks
/// for ends well inside an initiator's command timeout (Windows sends
/// the rest as further commands).
pub const MAX_TOKEN_BLOCKS: u64 = 512 * 1024;

/// Inactivity timeouts, in seconds: the one used when the initiator asks
/// for 0, and the most it may ask for.
pub const DEFAULT_TIMEOUT: u32 = 60;
pub const MAX_TIMEOUT: u32 = 600;

/// Most tokens held at once across the server; past it an expired one
/// goes first, and when none has expired POPULATE TOKEN is refused with
/// INSUFFICIENT RESOURCES TO CREATE ROD TOKEN.
pub const MAX_TOKENS: usize = 1024;

const HEADER_POPULATE: usize = 16;
const HEADER_WRITE: usize = 536;
const RANGE_LEN: usize = 16;

pub const INVALID_FIELD_IN_PARAMETERS: Sense = Sense::new(Key::IllegalRequest, 0x26, 0x00);
/// INVALID TOKEN OPERATION, with its causes (SPC-4 table D.2, ASC 23h).
pub const TOKEN_UNSUPPORTED_TYPE: Sense = Sense::new(Key::IllegalRequest, 0x23, 0x01);
pub const TOKEN_UNKNOWN: Sense = Sense::new(Key::IllegalRequest, 0x23, 0x04);
pub const TOKEN_EXPIRED: Sense = Sense::new(Key::IllegalRequest, 0x23, 0x07);
pub const TOKEN_DELETED: Sense = Sense::new(Key::IllegalRequest, 0x23, 0x09);
pub const INSUFFICIENT_RESOURCES: Sense = Sense::new(Key::IllegalRequest, 0x55, 0x0c);
/// A list identifier still in use by a copy of the same nexus.
pub const OPERATION_IN_PROGRESS: Sense = Sense::new(Key::IllegalRequest, 0x0d, 0x00);

/// One block device range descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub lba: u64,
    pub blocks: u32,
}

/// A POPULATE TOKEN parameter list, read and checked against the unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Populate {
    /// The token's inactivity timeout.
    pub timeout: Duration,
    pub ranges: Vec<Range>,
}

/// A WRITE USING TOKEN parameter list, read and checked against the unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteUsing {
    /// Blocks of the token's data to pass over before the first written.
    pub offset: u64,
    pub token: [u8; TOKEN_LEN],
    pub ranges: Vec<Range>,
    /// DEL_TKN: the token ends once this copy has read it.
    pub delete: bool,
}

/// Reads a POPULATE TOKEN parameter list for a unit of `capacity` blocks.
///
/// # Errors
///
/// PARAMETER LIST LENGTH ERROR for lengths that disagree, INVALID FIELD
/// IN PARAMETER LIST for a timeout past [`MAX_TIMEOUT`], a ROD type other
/// than access upon reference, overlapping ranges or more blocks than
/// [`MAX_TOKEN_BLOCKS`], LBA OUT OF RANGE for a range past the end.
pub fn parse_populate(params: &[u8], capacity: u64) -> Result<Populate, Sense> {
    let body = framed(params, HEADER_POPULATE, 14)?;
    let rtv = body[2] & 0x02 != 0;
    let timeout = be32(&body[4..8]);
    if timeout > MAX_TIMEOUT {
        return Err(INVALID_FIELD_IN_PARAMETERS);
    }
    if rtv && be32(&body[8..12]) != ROD_TYPE_AUR {
        return Err(INVALID_FIELD_IN_PARAMETERS);
    }
    let ranges = ranges(&body[HEADER_POPULATE..], capacity)?;
    let timeout = if timeout == 0 {
        DEFAULT_TIMEOUT
    } else {
        timeout
    };
    Ok(Populate {
        timeout: Duration::from_secs(u64::from(timeout)),
        ranges,
    })
}

/// Reads a WRITE USING TOKEN parameter list for a unit of `capacity`
/// blocks.
///
/// # Errors
///
/// As [`parse_populate`], for the destination ranges.
pub fn parse_write(params: &[u8], capacity: u64) -> Result<WriteUsing, Sense> {
    let body = framed(params, HEADER_WRITE, 534)?;
    let mut token = [0u8; TOKEN_LEN];
    token.copy_from_slice(&body[16..16 + TOKEN_LEN]);
    Ok(WriteUsing {
        offset: be64(&body[8..16]),
        token,
        ranges: ranges(&body[HEADER_WRITE..], capacity)?,
        delete: body[2] & 0x02 != 0,
    })
}

/// The list cut to what its lengths say: the DATA LENGTH (bytes 0..2)
/// counts what follows it, the range descriptor length (at `ranges_at`)
/// the descriptors after the `header`.
fn framed(params: &[u8], header: usize, ranges_at: usize) -> Result<&[u8], Sense> {
    if params.len() < header {
        return Err(Sense::PARAMETER_LIST_LENGTH);
    }
    let data_len = usize::from(be16(&params[0..2])) + 2;
    let ranges_len = usize::from(be16(&params[ranges_at..ranges_at + 2]));
    if ranges_len == 0 || ranges_len % RANGE_LEN != 0 {
        return Err(INVALID_FIELD_IN_PARAMETERS);
    }
    if ranges_len / RANGE_LEN > usize::from(MAX_RANGES) {
        return Err(INVALID_FIELD_IN_PARAMETERS);
    }
    let end = header + ranges_len;
    if data_len < end || params.len() < end {
        return Err(Sense::PARAMETER_LIST_LENGTH);
    }
    Ok(&params[..end])
}

/// The ranges, each inside the unit, none overlapping another, at most
/// [`MAX_TOKEN_BLOCKS`] in all. A range of no blocks is passed over.
fn ranges(at: &[u8], capacity: u64) -> Result<Vec<Range>, Sense> {
    let mut out: Vec<Range> = Vec::new();
    let mut total = 0u64;
    for d in at.chunks_exact(RANGE_LEN) {
        let r = Range {
            lba: be64(&d[0..8]),
            blocks: be32(&d[8..12]),
        };
        if r.blocks == 0 {
            continue;
        }
        crate::check_range(r.lba, r.blocks, capacity)?;
        let end = r.lba + u64::from(r.blocks);
        if out
            .iter()
            .any(|o| r.lba < o.lba + u64::from(o.blocks) && o.lba < end)
        {
            return Err(INVALID_FIELD_IN_PARAMETERS);
        }
        total += u64::from(r.blocks);
        out.push(r);
    }
    if total == 0 || total > MAX_TOKEN_BLOCKS {
        return Err(INVALID_FIELD_IN_PARAMETERS);
    }
    Ok(out)
}

/// One piece of a WRITE USING TOKEN: `blocks` from `source_lba` of the
/// token's unit to `destination_lba` of the unit written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub source_lba: u64,
    pub destination_lba: u64,
    pub blocks: u64,
}

/// The pieces that write the destination `ranges` in order from the
/// token's data (its `source` ranges laid end to end), starting `offset`
/// blocks in. Where the token holds fewer blocks past the offset than the
/// ranges ask for, the pieces write what it holds (the transfer count
/// tells the initiator, which sends the rest with another token).
///
/// # Errors
///
/// INVALID FIELD IN PARAMETER LIST for an offset at or past the token's
/// end.
pub fn plan(source: &[Range], offset: u64, ranges: &[Range]) -> Result<Vec<Piece>, Sense> {
    let held: u64 = source.iter().map(|r| u64::from(r.blocks)).sum();
    if offset >= held {
        return Err(INVALID_FIELD_IN_PARAMETERS);
    }
    // Where the token's data stands: which source range, how far in.
    let (mut s, mut skip) = (0usize, offset);
    while skip >= u64::from(source[s].blocks) {
        skip -= u64::from(source[s].blocks);
        s += 1;
    }
    let mut pieces = Vec::new();
    'ranges: for d in ranges {
        let (mut at, mut left) = (d.lba, u64::from(d.blocks));
        while left > 0 {
            let Some(src) = source.get(s) else {
                break 'ranges;
            };
            let n = left.min(u64::from(src.blocks) - skip);
            pieces.push(Piece {
                source_lba: src.lba + skip,
                destination_lba: at,
                blocks: n,
            });
            at += n;
            left -= n;
            skip += n;
            if skip == u64::from(src.blocks) {
                s += 1;
                skip = 0;
            }
        }
    }
    Ok(pieces)
}

/// What a token is made of besides the random bytes: the unit it reads
/// (its NAA designator, as VPD page 0x83 gives it) and the block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Creator {
    pub naa: [u8; 16],
    pub block_size: u32,
}

/// The bytes of a token (SPC-4 8.3.x): ROD type, length, the copy
/// manager's token identifier, the creator unit as an identification
/// descriptor, the bytes it stands for, the block length where READ
/// CAPACITY (16) has it, and random bytes after.
fn token_bytes(id: u64, creator: Creator, blocks: u64, random: &[u8; RANDOM_LEN]) -> [u8; 512] {
    let mut t = [0u8; TOKEN_LEN];
    t[0..4].copy_from_slice(&ROD_TYPE_AUR.to_be_bytes());
    t[6..8].copy_from_slice(&((TOKEN_LEN - 8) as u16).to_be_bytes());
    t[8..16].copy_from_slice(&id.to_be_bytes());
    // Identification descriptor target descriptor: a block device named
    // by its NAA designator (code set binary, association unit, type NAA).
    t[16] = 0xe4;
    t[20] = 0x01;
    t[21] = 0x03;
    t[23] = 16;
    t[24..40].copy_from_slice(&creator.naa);
    t[45..48].copy_from_slice(&creator.block_size.to_be_bytes()[1..]);
    let bytes = u128::from(blocks) * u128::from(creator.block_size);
    t[48..64].copy_from_slice(&bytes.to_be_bytes());
    t[96..100].copy_from_slice(&creator.block_size.to_be_bytes());
    t[TOKEN_LEN - RANDOM_LEN..].copy_from_slice(random);
    t
}

/// A token held: what it stands for and when it was last used.
#[derive(Debug)]
struct Held<U> {
    bytes: [u8; TOKEN_LEN],
    unit: U,
    ranges: Vec<Range>,
    timeout: Duration,
    used: Duration,
    /// WRITE USING TOKEN commands reading it now.
    readers: usize,
    deleted: bool,
}

impl<U> Held<U> {
    fn expired(&self, now: Duration) -> bool {
        self.readers == 0 && now.saturating_sub(self.used) > self.timeout
    }

    /// Expired, or deleted and read by no copy: it may be swept.
    fn gone(&self, now: Duration) -> bool {
        self.expired(now) || (self.deleted && self.readers == 0)
    }
}

/// The tokens a copy manager holds, for every unit it serves; `U` is the
/// target's handle on a unit.
#[derive(Debug)]
pub struct Tokens<U> {
    held: Mutex<Vec<Held<U>>>,
    next: Mutex<u64>,
}

impl<U> Default for Tokens<U> {
    fn default() -> Self {
        Self {
            held: Mutex::default(),
            next: Mutex::new(1),
        }
    }
}

/// A token taken by a WRITE USING TOKEN: its unit and ranges. Given
/// back with [`Taken::put_back`] once the copy ended, or when dropped (a
/// copy whose task was aborted), so that no token is kept alive by a
/// copy that is gone.
#[derive(Debug)]
pub struct Taken<'a, U> {
    pub unit: U,
    pub ranges: Vec<Range>,
    bytes: [u8; TOKEN_LEN],
    tokens: &'a Tokens<U>,
    back: bool,
}

impl<U> Taken<'_, U> {
    /// Gives the token back at `now`; `delete` (WRITE USING TOKEN's
    /// DEL_TKN) ends it once no other copy reads it.
    pub fn put_back(mut self, delete: bool, now: Option<Duration>) {
        self.back = true;
        self.tokens.release(&self.bytes, delete, now);
    }
}

impl<U> Drop for Taken<'_, U> {
    fn drop(&mut self) {
        if !self.back {
            self.tokens.release(&self.bytes, false, None);
        }
    }
}

impl<U> Tokens<U> {
    fn release(&self, bytes: &[u8; TOKEN_LEN], delete: bool, now: Option<Duration>) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = held.iter_mut().find(|h| h.bytes == *bytes) {
            h.readers = h.readers.saturating_sub(1);
            if let Some(now) = now {
                h.used = now;
            }
            h.deleted |= delete;
        }
    }
}

impl<U: Clone> Tokens<U> {
    /// Makes a token for `ranges` of `unit`, as of `now`.
    ///
    /// # Errors
    ///
    /// INSUFFICIENT RESOURCES when [`MAX_TOKENS`] are held and none has
    /// expired.
    pub fn create(
        &self,
        unit: U,
        creator: Creator,
        populate: Populate,
        now: Duration,
        random: &[u8; RANDOM_LEN],
    ) -> Result<[u8; TOKEN_LEN], Sense> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.retain(|h| !h.gone(now));
        if held.len() >= MAX_TOKENS {
            return Err(INSUFFICIENT_RESOURCES);
        }
        let id = {
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            *next += 1;
            *next - 1
        };
        let blocks = populate.ranges.iter().map(|r| u64::from(r.blocks)).sum();
        let bytes = token_bytes(id, creator, blocks, random);
        held.push(Held {
            bytes,
            unit,
            ranges: populate.ranges,
            timeout: populate.timeout,
            used: now,
            readers: 0,
            deleted: false,
        });
        Ok(bytes)
    }

    /// The token `bytes` names, for a WRITE USING TOKEN starting at `now`.
    ///
    /// # Errors
    ///
    /// INVALID TOKEN OPERATION: unknown, expired, deleted, or of a type
    /// this copy manager does not make.
    pub fn take(&self, bytes: &[u8; TOKEN_LEN], now: Duration) -> Result<Taken<'_, U>, Sense> {
        if be32(&bytes[0..4]) != ROD_TYPE_AUR {
            return Err(TOKEN_UNSUPPORTED_TYPE);
        }
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let Some(h) = held.iter_mut().find(|h| h.bytes == *bytes) else {
            return Err(TOKEN_UNKNOWN);
        };
        if h.deleted {
            return Err(TOKEN_DELETED);
        }
        if h.expired(now) {
            return Err(TOKEN_EXPIRED);
        }
        h.readers += 1;
        h.used = now;
        Ok(Taken {
            unit: h.unit.clone(),
            ranges: h.ranges.clone(),
            bytes: *bytes,
            tokens: self,
            back: false,
        })
    }

    /// Tokens held now (expired ones included until the next
    /// [`Tokens::create`] sweeps them).
    pub fn len(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no token is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How a POPULATE TOKEN or WRITE USING TOKEN ended, for RECEIVE ROD TOKEN
/// INFORMATION.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The service action it answers (POPULATE TOKEN or WRITE USING TOKEN).
    pub action: u8,
    /// The sense it ended with, `None` for success.
    pub sense: Option<Sense>,
    /// Blocks the token stands for (POPULATE TOKEN) or blocks written
    /// (WRITE USING TOKEN).
    pub blocks: u64,
    /// The token made, for POPULATE TOKEN.
    pub token: Option<[u8; TOKEN_LEN]>,
}

/// The outcomes of token commands that ended, by I_T nexus and list
/// identifier: the latest of each, at most 256 per unit.
pub type Results = crate::held::Held<Outcome>;

/// RECEIVE ROD TOKEN INFORMATION (SPC-4 6.21) about `outcome`, cut to
/// `alloc`: the copy's status (completed, or completed with errors and
/// its sense), the transfer count in blocks, and the token a POPULATE
/// TOKEN made.
///
/// # Errors
///
/// INVALID FIELD IN CDB (the list identifier) where no outcome is held.
pub fn receive_rod_token_information(
    outcome: Option<Outcome>,
    alloc: u32,
) -> Result<Vec<u8>, Sense> {
    let Some(o) = outcome else {
        return Err(Sense::INVALID_FIELD_IN_CDB.in_cdb_field(2, 7));
    };
    let sense = o.sense.map(|s| s.fixed().to_vec()).unwrap_or_default();
    let mut d = vec![0u8; 32];
    d[4] = o.action;
    // Completed without errors (01h) or with them (02h), and the status
    // the command itself was answered with.
    d[5] = if o.sense.is_none() { 0x01 } else { 0x02 };
    d[12] = if o.sense.is_none() { 0x00 } else { 0x02 };
    d[13] = sense.len() as u8;
    d[14] = sense.len() as u8;
    d[15] = 0xf1; // transfer count in logical blocks
    d[16..24].copy_from_slice(&o.blocks.to_be_bytes());
    d.extend_from_slice(&sense);
    match o.token {
        Some(t) => {
            d.extend_from_slice(&((TOKEN_LEN + 2) as u32).to_be_bytes());
            d.extend_from_slice(&[0, 0]);
            d.extend_from_slice(&t);
        }
        None => d.extend_from_slice(&0u32.to_be_bytes()),
    }
    let available = (d.len() - 4) as u32;
    d[0..4].copy_from_slice(&available.to_be_bytes());
    d.truncate(alloc as usize);
    Ok(d)
}

/// The third-party copy VPD page's descriptors for token copy (SPC-4
/// 7.8.17): the Block Device ROD Token Limits, the ROD Token Features
/// and the Supported ROD Types, after the Supported Commands descriptor
/// [`crate::xcopy`] writes.
pub fn third_party_copy_descriptors() -> Vec<u8> {
    let mut d = Vec::new();
    // Block Device ROD Token Limits (0000h): ranges, timeouts, sizes.
    let mut limits = vec![0u8; 32];
    limits[6..8].copy_from_slice(&MAX_RANGES.to_be_bytes());
    limits[8..12].copy_from_slice(&MAX_TIMEOUT.to_be_bytes());
    limits[12..16].copy_from_slice(&DEFAULT_TIMEOUT.to_be_bytes());
    limits[16..24].copy_from_slice(&MAX_TOKEN_BLOCKS.to_be_bytes());
    limits[24..32].copy_from_slice(&MAX_TOKEN_BLOCKS.to_be_bytes());
    descriptor(&mut d, 0x0000, &limits);
    // ROD Token Features (0106h): no remote tokens; a token lives while
    // it is used (no lifetime past its inactivity timeout); one block
    // device type features descriptor.
    let mut features = vec![0u8; 44];
    features[12..16].copy_from_slice(&1u32.to_be_bytes());
    features[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
    features[20..24].copy_from_slice(&MAX_TIMEOUT.to_be_bytes());
    features[42..44].copy_from_slice(&48u16.to_be_bytes());
    let mut block = vec![0u8; 48];
    block[2..4].copy_from_slice(&44u16.to_be_bytes());
    let bytes = MAX_TOKEN_BLOCKS * 512;
    for at in [8, 16, 24, 32] {
        block[at..at + 8].copy_from_slice(&bytes.to_be_bytes());
    }
    features.extend_from_slice(&block);
    descriptor(&mut d, 0x0106, &features);
    // Supported ROD Types (0108h): access upon reference, in and out.
    let mut types = vec![0u8; 4];
    types[2..4].copy_from_slice(&64u16.to_be_bytes());
    let mut aur = vec![0u8; 64];
    aur[0..4].copy_from_slice(&ROD_TYPE_AUR.to_be_bytes());
    aur[4] = 0x02 | 0x01; // TOKEN_IN, TOKEN_OUT
    types.extend_from_slice(&aur);
    descriptor(&mut d, 0x0108, &types);
    d
}

fn descriptor(out: &mut Vec<u8>, kind: u16, body: &[u8]) {
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(body);
}

#[cfg(test)]
#[path = "rod_tests.rs"]
mod tests;
