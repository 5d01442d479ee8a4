//! A READ's pieces as they come back: where each lands in the caller's
//! request, which may wait in a pipe instead of a buffer, and the check
//! that together they cover the request exactly once.
//!
//! A split read's pieces come from different paths, in any order. A piece
//! that one reply brings whole, on a plain TCP connection, for a caller
//! that splices (`braid attach`'s NBD writer), may stay in the pipes it was
//! spliced into; the rest are buffers. Which pieces are piped changes
//! nothing the engine decides: it sees the same replies either way.

use braid_block::ErrorKind;
use bytes::Bytes;
use smallvec::SmallVec;

use super::{Core, Done, Pending};
use crate::engine::{ChunkInfo, IoError, Op};
use braid_proto::Cookie;

/// Where READ data that a reply puts at absolute `offset` (or, for a simple
/// reply, at the chunk's start) lands within the caller's request; `None`
/// if it does not lie inside the chunk.
pub(crate) fn place_in_request(info: &ChunkInfo, offset: Option<u64>, len: u64) -> Option<u64> {
    if info.op != Op::Read {
        return None;
    }
    let start = offset.unwrap_or(info.offset);
    let end = start.checked_add(len)?;
    (start >= info.offset && end <= info.offset + u64::from(info.len))
        .then(|| info.req_offset + (start - info.offset))
}

/// Whether chunk `cookie`'s READ data (`len` bytes at `offset`) may come
/// in a pipe: the reply brings the whole chunk at once, nothing of it has
/// arrived yet, and the request's caller takes piped data. The request's
/// id and where the piece lands in it.
pub(crate) fn pipe_ok(
    core: &Core,
    cookie: Cookie,
    offset: Option<u64>,
    len: u32,
) -> Option<(u64, u64)> {
    let info = core.engine.chunk(cookie)?;
    let req = info.req?;
    let p = core.reqs.get(&req.0)?;
    let at = place_in_request(&info, offset, u64::from(len))?;
    let whole = p.finish.takes_pipes() && info.len == len && !core.received.contains_key(&cookie.0);
    whole.then_some((req.0, at))
}

/// Drops what chunk `cookie` brought to a read: the piece is read again.
pub(crate) fn forget(p: &mut Pending, cookie: u64) {
    let mut keep = p.piped_sources.iter().map(|&c| c != cookie);
    p.done.piped.retain(|_| keep.next().unwrap_or(true));
    p.piped_sources.retain(|c| *c != cookie);
    let mut keep = p.sources.iter().map(|&c| c != cookie);
    p.done.data.retain(|_| keep.next().unwrap_or(true));
    p.sources.retain(|c| *c != cookie);
}

/// Puts a read's pieces, buffered and piped, in order and checks they
/// cover it exactly.
pub(crate) fn assemble(mut done: Done, len: u64) -> Result<Done, IoError> {
    done.data.sort_by_key(|(off, _)| *off);
    done.piped.sort_by_key(|(off, _)| *off);
    let mut spans: SmallVec<[(u64, u64); 4]> = done
        .data
        .iter()
        .map(|(off, b)| (*off, b.len() as u64))
        .chain(done.piped.iter().map(|(off, p)| (*off, p.len() as u64)))
        .collect();
    spans.sort_unstable();
    let mut at = 0u64;
    for (off, n) in spans {
        if off != at {
            return Err(short(format!(
                "server left bytes {at}..{off} of the read unanswered or answered twice"
            )));
        }
        at += n;
    }
    if at != len {
        return Err(short(format!(
            "server answered {at} of {len} bytes of a read"
        )));
    }
    Ok(done)
}

fn short(message: String) -> IoError {
    IoError::Target {
        kind: ErrorKind::Io,
        message,
    }
}

/// Adds READ data that arrived for `cookie` to its request.
pub(crate) fn place(core: &mut Core, cookie: Cookie, offset: Option<u64>, data: Bytes) {
    let Some(info) = core.engine.chunk(cookie) else {
        return;
    };
    let Some(req) = info.req else {
        return; // a probe's data is not needed
    };
    let Some(p) = core.reqs.get_mut(&req.0) else {
        return;
    };
    // Untrusted offsets: data outside its chunk is refused by leaving the
    // read short, which fails it.
    let Some(at) = place_in_request(&info, offset, data.len() as u64) else {
        return;
    };
    *core.received.entry(cookie.0).or_default() += data.len() as u64;
    p.done.data.push((at, data));
    p.sources.push(cookie.0);
}

/// Adds a piece that came whole in a pipe to its request; where it may
/// not stay piped (checked again: the lock was let go while the data came
/// in), its bytes are copied out and placed as any other.
pub(crate) fn place_piped(
    core: &mut Core,
    cookie: Cookie,
    offset: Option<u64>,
    piped: braid_pool::Piped,
) {
    let len = piped.len();
    match pipe_ok(core, cookie, offset, len as u32) {
        Some((req, at)) => {
            if let Some(p) = core.reqs.get_mut(&req) {
                core.received.insert(cookie.0, len as u64);
                p.done.piped.push((at, piped));
                p.piped_sources.push(cookie.0);
            }
        }
        None => {
            if let Ok(data) = piped.into_bytes() {
                place(core, cookie, offset, data);
            }
        }
    }
}
