//! Transmission replies: simple replies and structured reply chunks
//! (spec: "Simple reply message", "Structured reply chunk message",
//! "Structured reply types").
//!
//! Headers are fixed-size and decoded here; payloads are decoded from the
//! bytes the driver read for them, except READ data, which the driver copies
//! straight to where the caller wants it after [`OffsetData`]'s 8-byte
//! offset.

use crate::wire::{
    chunk_type, Cookie, Errno, CHUNK_HEADER_LEN, MAX_STRING_LEN, REPLY_FLAG_DONE, SIMPLE_REPLY_LEN,
    SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC,
};
use crate::ProtoError;

/// The header of any reply; which one it is shows in the first four bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyHeader {
    Simple(SimpleReply),
    Chunk(ChunkHeader),
}

impl ReplyHeader {
    /// How many header bytes a reply starting with `magic` occupies.
    ///
    /// # Errors
    ///
    /// [`ProtoError::BadMagic`] for anything but the two reply magics.
    pub fn header_len(magic: [u8; 4]) -> Result<usize, ProtoError> {
        match u32::from_be_bytes(magic) {
            SIMPLE_REPLY_MAGIC => Ok(SIMPLE_REPLY_LEN),
            STRUCTURED_REPLY_MAGIC => Ok(CHUNK_HEADER_LEN),
            other => Err(ProtoError::BadMagic {
                what: "reply",
                found: u64::from(other),
            }),
        }
    }

    /// Decodes a complete header whose length came from [`Self::header_len`].
    ///
    /// # Errors
    ///
    /// [`ProtoError::BadMagic`] or [`ProtoError::Truncated`].
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        if bytes.len() < 4 {
            return Err(ProtoError::Truncated {
                what: "reply header",
            });
        }
        let len = Self::header_len(bytes[0..4].try_into().expect("4 bytes"))?;
        if bytes.len() < len {
            return Err(ProtoError::Truncated {
                what: "reply header",
            });
        }
        if len == SIMPLE_REPLY_LEN {
            Ok(Self::Simple(SimpleReply::decode(
                bytes[..SIMPLE_REPLY_LEN]
                    .try_into()
                    .expect("checked length"),
            )))
        } else {
            Ok(Self::Chunk(ChunkHeader::decode(
                bytes[..CHUNK_HEADER_LEN]
                    .try_into()
                    .expect("checked length"),
            )))
        }
    }

    pub fn cookie(&self) -> Cookie {
        match self {
            Self::Simple(s) => s.cookie,
            Self::Chunk(c) => c.cookie,
        }
    }
}

/// A simple reply header; READ data follows when `error` is 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimpleReply {
    pub error: u32,
    pub cookie: Cookie,
}

impl SimpleReply {
    pub fn encode(&self) -> [u8; SIMPLE_REPLY_LEN] {
        let mut out = [0u8; SIMPLE_REPLY_LEN];
        out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        out[4..8].copy_from_slice(&self.error.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.0.to_be_bytes());
        out
    }

    fn decode(bytes: &[u8; SIMPLE_REPLY_LEN]) -> Self {
        Self {
            error: u32::from_be_bytes(bytes[4..8].try_into().expect("4 of 16")),
            cookie: Cookie(u64::from_be_bytes(
                bytes[8..16].try_into().expect("8 of 16"),
            )),
        }
    }

    /// The error carried, if any.
    pub fn errno(&self) -> Option<Errno> {
        (self.error != 0).then(|| Errno::from_u32(self.error))
    }
}

/// A structured reply chunk header; `length` payload bytes follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub kind: u16,
    pub cookie: Cookie,
    pub length: u32,
}

impl ChunkHeader {
    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut out = [0u8; CHUNK_HEADER_LEN];
        out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.kind.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.0.to_be_bytes());
        out[16..20].copy_from_slice(&self.length.to_be_bytes());
        out
    }

    fn decode(bytes: &[u8; CHUNK_HEADER_LEN]) -> Self {
        Self {
            flags: u16::from_be_bytes([bytes[4], bytes[5]]),
            kind: u16::from_be_bytes([bytes[6], bytes[7]]),
            cookie: Cookie(u64::from_be_bytes(
                bytes[8..16].try_into().expect("8 of 20"),
            )),
            length: u32::from_be_bytes(bytes[16..20].try_into().expect("4 of 20")),
        }
    }

    /// Whether this chunk ends its reply.
    pub fn done(&self) -> bool {
        self.flags & REPLY_FLAG_DONE != 0
    }

    pub fn is_error(&self) -> bool {
        self.kind & chunk_type::ERROR_BIT != 0
    }

    /// Checks the length field against the chunk type before any payload is
    /// read, so a lying length is caught without reading it.
    ///
    /// # Errors
    ///
    /// [`ProtoError::BadChunk`] when the length cannot be right for the type,
    /// or the type is unknown and not an error chunk (the spec requires a hard
    /// disconnect then).
    pub fn check(&self, max_payload: u32) -> Result<(), ProtoError> {
        let bad = |why: &'static str| ProtoError::BadChunk {
            kind: self.kind,
            length: self.length,
            why,
        };
        match self.kind {
            chunk_type::NONE if self.length != 0 => Err(bad("NONE chunk with a payload")),
            chunk_type::NONE if !self.done() => Err(bad("NONE chunk without the DONE flag")),
            chunk_type::OFFSET_DATA if self.length < 9 => Err(bad("OFFSET_DATA shorter than 9")),
            chunk_type::OFFSET_DATA if self.length - 8 > max_payload => {
                Err(bad("OFFSET_DATA larger than the maximum payload"))
            }
            chunk_type::OFFSET_HOLE if self.length != 12 => Err(bad("OFFSET_HOLE not 12 bytes")),
            chunk_type::BLOCK_STATUS
                if self.length < 12 || !(self.length - 4).is_multiple_of(8) =>
            {
                Err(bad("BLOCK_STATUS length not 4 + 8n"))
            }
            chunk_type::BLOCK_STATUS if self.length > 4 + 8 * (1 << 20) => {
                Err(bad("BLOCK_STATUS with more than 2^20 extents"))
            }
            chunk_type::ERROR if self.length < 6 => Err(bad("ERROR shorter than 6")),
            chunk_type::ERROR_OFFSET if self.length < 14 => {
                Err(bad("ERROR_OFFSET shorter than 14"))
            }
            k if k & chunk_type::ERROR_BIT != 0 && self.length < 6 => {
                Err(bad("error chunk shorter than 6"))
            }
            k if k & chunk_type::ERROR_BIT != 0
                && self.length as usize > 6 + MAX_STRING_LEN + 64 =>
            {
                Err(bad("error chunk too long"))
            }
            chunk_type::NONE
            | chunk_type::OFFSET_DATA
            | chunk_type::OFFSET_HOLE
            | chunk_type::BLOCK_STATUS => Ok(()),
            k if k & chunk_type::ERROR_BIT != 0 => Ok(()),
            _ => Err(bad("unknown chunk type")),
        }
    }
}

/// The fixed 8-byte start of an `OFFSET_DATA` payload; the data follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffsetData {
    pub offset: u64,
}

impl OffsetData {
    pub fn decode(bytes: &[u8; 8]) -> Self {
        Self {
            offset: u64::from_be_bytes(*bytes),
        }
    }
}

/// An `OFFSET_HOLE` payload: `length` bytes at `offset` read as zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffsetHole {
    pub offset: u64,
    pub length: u32,
}

impl OffsetHole {
    /// # Errors
    ///
    /// [`ProtoError::Truncated`] when fewer than 12 bytes were given.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        let bytes: &[u8; 12] =
            bytes
                .get(..12)
                .and_then(|b| b.try_into().ok())
                .ok_or(ProtoError::Truncated {
                    what: "OFFSET_HOLE",
                })?;
        Ok(Self {
            offset: u64::from_be_bytes(bytes[0..8].try_into().expect("8 of 12")),
            length: u32::from_be_bytes(bytes[8..12].try_into().expect("4 of 12")),
        })
    }
}

/// One extent of a `BLOCK_STATUS` chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub length: u32,
    pub flags: u32,
}

/// A decoded `BLOCK_STATUS` payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockStatus {
    pub context_id: u32,
    pub extents: Vec<Extent>,
}

impl BlockStatus {
    /// # Errors
    ///
    /// [`ProtoError::BadChunk`] when the layout is not 4 + 8n bytes with
    /// n ≥ 1, or an extent has length 0.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        let bad = |why| ProtoError::BadChunk {
            kind: chunk_type::BLOCK_STATUS,
            length: bytes.len() as u32,
            why,
        };
        if bytes.len() < 12 || !(bytes.len() - 4).is_multiple_of(8) {
            return Err(bad("BLOCK_STATUS length not 4 + 8n"));
        }
        let context_id = u32::from_be_bytes(bytes[0..4].try_into().expect("4 bytes"));
        let extents = bytes[4..]
            .chunks_exact(8)
            .map(|e| Extent {
                length: u32::from_be_bytes(e[0..4].try_into().expect("4 of 8")),
                flags: u32::from_be_bytes(e[4..8].try_into().expect("4 of 8")),
            })
            .collect::<Vec<_>>();
        if extents.iter().any(|e| e.length == 0) {
            return Err(bad("extent of length 0"));
        }
        Ok(Self {
            context_id,
            extents,
        })
    }

    /// Appends the payload (without chunk header).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.context_id.to_be_bytes());
        for e in &self.extents {
            out.extend_from_slice(&e.length.to_be_bytes());
            out.extend_from_slice(&e.flags.to_be_bytes());
        }
    }
}

/// A decoded error chunk (`ERROR`, `ERROR_OFFSET`, or an unknown error type).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorChunk {
    pub error: Errno,
    pub message: String,
    /// Present for `ERROR_OFFSET`.
    pub offset: Option<u64>,
}

impl ErrorChunk {
    /// # Errors
    ///
    /// [`ProtoError::BadChunk`] when the message length does not fit the
    /// payload or the error value is 0.
    pub fn decode(kind: u16, bytes: &[u8]) -> Result<Self, ProtoError> {
        let bad = |why| ProtoError::BadChunk {
            kind,
            length: bytes.len() as u32,
            why,
        };
        if bytes.len() < 6 {
            return Err(bad("error chunk shorter than 6"));
        }
        let error = u32::from_be_bytes(bytes[0..4].try_into().expect("4 bytes"));
        if error == 0 {
            return Err(bad("error chunk with error 0"));
        }
        let msg_len = usize::from(u16::from_be_bytes([bytes[4], bytes[5]]));
        let rest = &bytes[6..];
        if msg_len > rest.len() {
            return Err(bad("message longer than the chunk"));
        }
        let message = String::from_utf8_lossy(&rest[..msg_len]).into_owned();
        let offset = if kind == chunk_type::ERROR_OFFSET {
            let tail: [u8; 8] = rest[msg_len..]
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| bad("ERROR_OFFSET without its offset"))?;
            Some(u64::from_be_bytes(tail))
        } else {
            None
        };
        Ok(Self {
            error: Errno::from_u32(error),
            message,
            offset,
        })
    }
}

/// Encoders for the chunks a server sends; each appends header and payload.
pub mod encode {
    use super::*;

    /// `NONE` with DONE: ends a reply that succeeded.
    pub fn none(out: &mut Vec<u8>, cookie: Cookie) {
        out.extend_from_slice(
            &ChunkHeader {
                flags: REPLY_FLAG_DONE,
                kind: chunk_type::NONE,
                cookie,
                length: 0,
            }
            .encode(),
        );
    }

    /// The header of an `OFFSET_DATA` chunk carrying `data_len` bytes, plus
    /// its offset; the caller appends or writes the data itself.
    pub fn offset_data_header(
        out: &mut Vec<u8>,
        cookie: Cookie,
        offset: u64,
        data_len: u32,
        done: bool,
    ) {
        out.extend_from_slice(
            &ChunkHeader {
                flags: if done { REPLY_FLAG_DONE } else { 0 },
                kind: chunk_type::OFFSET_DATA,
                cookie,
                length: data_len + 8,
            }
            .encode(),
        );
        out.extend_from_slice(&offset.to_be_bytes());
    }

    pub fn offset_hole(out: &mut Vec<u8>, cookie: Cookie, hole: OffsetHole, done: bool) {
        out.extend_from_slice(
            &ChunkHeader {
                flags: if done { REPLY_FLAG_DONE } else { 0 },
                kind: chunk_type::OFFSET_HOLE,
                cookie,
                length: 12,
            }
            .encode(),
        );
        out.extend_from_slice(&hole.offset.to_be_bytes());
        out.extend_from_slice(&hole.length.to_be_bytes());
    }

    pub fn block_status(out: &mut Vec<u8>, cookie: Cookie, status: &BlockStatus, done: bool) {
        let length = 4 + 8 * status.extents.len() as u32;
        out.extend_from_slice(
            &ChunkHeader {
                flags: if done { REPLY_FLAG_DONE } else { 0 },
                kind: chunk_type::BLOCK_STATUS,
                cookie,
                length,
            }
            .encode(),
        );
        status.encode_into(out);
    }

    /// An `ERROR` chunk with DONE. The message is cut to the spec's limit.
    pub fn error(out: &mut Vec<u8>, cookie: Cookie, error: Errno, message: &str) {
        let msg = truncate_utf8(message, MAX_STRING_LEN);
        out.extend_from_slice(
            &ChunkHeader {
                flags: REPLY_FLAG_DONE,
                kind: chunk_type::ERROR,
                cookie,
                length: 6 + msg.len() as u32,
            }
            .encode(),
        );
        out.extend_from_slice(&error.to_u32().to_be_bytes());
        out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        out.extend_from_slice(msg.as_bytes());
    }

    /// A simple reply header (READ data, if any, follows).
    pub fn simple(out: &mut Vec<u8>, cookie: Cookie, error: Option<Errno>) {
        out.extend_from_slice(
            &SimpleReply {
                error: error.map_or(0, Errno::to_u32),
                cookie,
            }
            .encode(),
        );
    }
}

/// The longest prefix of `s` within `max` bytes that ends on a char boundary.
pub(crate) fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_reply_layout() {
        let mut out = Vec::new();
        encode::simple(&mut out, Cookie(0xaabb), Some(Errno::Perm));
        assert_eq!(
            out,
            [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xaa, 0xbb]
        );
        let h = ReplyHeader::decode(&out).unwrap();
        match h {
            ReplyHeader::Simple(s) => {
                assert_eq!(s.errno(), Some(Errno::Perm));
                assert_eq!(s.cookie, Cookie(0xaabb));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn none_chunk_layout() {
        let mut out = Vec::new();
        encode::none(&mut out, Cookie(1));
        assert_eq!(
            out,
            [0x66, 0x8e, 0x33, 0xef, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
        );
        let ReplyHeader::Chunk(c) = ReplyHeader::decode(&out).unwrap() else {
            panic!("not a chunk")
        };
        assert!(c.done());
        assert_eq!(c.check(1 << 25), Ok(()));
    }

    #[test]
    fn offset_data_header_layout() {
        let mut out = Vec::new();
        encode::offset_data_header(&mut out, Cookie(2), 0x200, 3, true);
        out.extend_from_slice(b"abc");
        assert_eq!(&out[4..8], &[0, 1, 0, 1]);
        assert_eq!(&out[16..20], &[0, 0, 0, 11]);
        assert_eq!(&out[20..28], &[0, 0, 0, 0, 0, 0, 2, 0]);
        let ReplyHeader::Chunk(c) = ReplyHeader::decode(&out).unwrap() else {
            panic!()
        };
        assert_eq!(c.check(1 << 25), Ok(()));
        assert_eq!(
            OffsetData::decode(out[20..28].try_into().unwrap()).offset,
            0x200
        );
    }

    #[test]
    fn chunk_length_checks() {
        let mk = |kind, length, flags| ChunkHeader {
            flags,
            kind,
            cookie: Cookie(0),
            length,
        };
        assert!(mk(chunk_type::NONE, 1, 1).check(100).is_err());
        assert!(mk(chunk_type::NONE, 0, 0).check(100).is_err());
        assert!(mk(chunk_type::OFFSET_DATA, 8, 0).check(100).is_err());
        assert!(mk(chunk_type::OFFSET_DATA, 109, 0).check(100).is_err());
        assert!(mk(chunk_type::OFFSET_DATA, 108, 0).check(100).is_ok());
        assert!(mk(chunk_type::OFFSET_HOLE, 13, 0).check(100).is_err());
        assert!(mk(chunk_type::BLOCK_STATUS, 4, 0).check(100).is_err());
        assert!(mk(chunk_type::BLOCK_STATUS, 13, 0).check(100).is_err());
        assert!(mk(chunk_type::BLOCK_STATUS, 20, 0).check(100).is_ok());
        assert!(mk(chunk_type::ERROR, 5, 1).check(100).is_err());
        assert!(mk(0x8007, 6, 1).check(100).is_ok());
        assert!(mk(0x8007, u32::MAX, 1).check(100).is_err());
        assert!(mk(77, 0, 1).check(100).is_err());
    }

    #[test]
    fn error_chunks_round_trip() {
        let mut out = Vec::new();
        encode::error(&mut out, Cookie(3), Errno::Io, "disk on fire");
        let ReplyHeader::Chunk(c) = ReplyHeader::decode(&out).unwrap() else {
            panic!()
        };
        assert!(c.is_error() && c.done());
        let e = ErrorChunk::decode(c.kind, &out[20..]).unwrap();
        assert_eq!(e.error, Errno::Io);
        assert_eq!(e.message, "disk on fire");
        assert_eq!(e.offset, None);

        let mut payload = vec![0, 0, 0, 5, 0, 2, b'h', b'i'];
        payload.extend_from_slice(&77u64.to_be_bytes());
        let e = ErrorChunk::decode(chunk_type::ERROR_OFFSET, &payload).unwrap();
        assert_eq!(e.offset, Some(77));
        assert!(ErrorChunk::decode(chunk_type::ERROR_OFFSET, &payload[..10]).is_err());
        assert!(ErrorChunk::decode(chunk_type::ERROR, &[0, 0, 0, 5, 0, 9, b'x']).is_err());
        assert!(ErrorChunk::decode(chunk_type::ERROR, &[0, 0, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let msg = "é".repeat(3000);
        let mut out = Vec::new();
        encode::error(&mut out, Cookie(3), Errno::Io, &msg);
        let e = ErrorChunk::decode(chunk_type::ERROR, &out[20..]).unwrap();
        assert_eq!(e.message.len(), MAX_STRING_LEN);
    }

    #[test]
    fn block_status_round_trip_and_rejects_zero_extents() {
        let s = BlockStatus {
            context_id: 9,
            extents: vec![
                Extent {
                    length: 4096,
                    flags: 3,
                },
                Extent {
                    length: 512,
                    flags: 0,
                },
            ],
        };
        let mut out = Vec::new();
        encode::block_status(&mut out, Cookie(5), &s, true);
        assert_eq!(BlockStatus::decode(&out[20..]).unwrap(), s);
        let mut payload = Vec::new();
        BlockStatus {
            context_id: 1,
            extents: vec![Extent {
                length: 0,
                flags: 0,
            }],
        }
        .encode_into(&mut payload);
        assert!(BlockStatus::decode(&payload).is_err());
        assert!(BlockStatus::decode(&payload[..7]).is_err());
    }

    #[test]
    fn bad_reply_magic() {
        assert!(matches!(
            ReplyHeader::decode(&[1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(ProtoError::BadMagic { what: "reply", .. })
        ));
        assert!(ReplyHeader::decode(&[0x67, 0x44, 0x66, 0x98, 0]).is_err());
    }

    #[test]
    fn hole_decode() {
        let mut out = Vec::new();
        encode::offset_hole(
            &mut out,
            Cookie(1),
            OffsetHole {
                offset: 4096,
                length: 512,
            },
            false,
        );
        assert_eq!(
            OffsetHole::decode(&out[20..]).unwrap(),
            OffsetHole {
                offset: 4096,
                length: 512
            }
        );
        assert!(OffsetHole::decode(&out[20..30]).is_err());
    }
}
