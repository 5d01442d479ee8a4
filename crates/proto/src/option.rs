//! Handshake framing: option requests a client sends and option replies a
//! server sends (spec: "Fixed newstyle negotiation", "Option types",
//! "Option reply types"), with the payloads both sides parse.

use crate::reply::truncate_utf8;
use crate::wire::{
    info, OptCode, RepCode, TransmissionFlags, MAX_STRING_LEN, OPTION_HEADER_LEN,
    OPTION_REPLY_HEADER_LEN, OPTS_MAGIC, OPT_REPLY_MAGIC,
};
use crate::ProtoError;

/// The header of an option request; `length` data bytes follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub code: OptCode,
    pub length: u32,
}

impl OptionHeader {
    /// # Errors
    ///
    /// [`ProtoError::BadMagic`] when the option does not start with
    /// `IHAVEOPT`.
    pub fn decode(bytes: &[u8; OPTION_HEADER_LEN]) -> Result<Self, ProtoError> {
        let magic = u64::from_be_bytes(bytes[0..8].try_into().expect("8 of 16"));
        if magic != OPTS_MAGIC {
            return Err(ProtoError::BadMagic {
                what: "option",
                found: magic,
            });
        }
        Ok(Self {
            code: OptCode::from_u32(u32::from_be_bytes(bytes[8..12].try_into().expect("4"))),
            length: u32::from_be_bytes(bytes[12..16].try_into().expect("4")),
        })
    }
}

/// Appends a whole option request (header and data).
pub fn encode_option(out: &mut Vec<u8>, code: OptCode, data: &[u8]) {
    out.extend_from_slice(&OPTS_MAGIC.to_be_bytes());
    out.extend_from_slice(&code.to_u32().to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// The header of an option reply; `length` data bytes follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: OptCode,
    pub code: RepCode,
    pub length: u32,
}

impl OptionReplyHeader {
    /// # Errors
    ///
    /// [`ProtoError::BadMagic`] when the reply magic is wrong.
    pub fn decode(bytes: &[u8; OPTION_REPLY_HEADER_LEN]) -> Result<Self, ProtoError> {
        let magic = u64::from_be_bytes(bytes[0..8].try_into().expect("8 of 20"));
        if magic != OPT_REPLY_MAGIC {
            return Err(ProtoError::BadMagic {
                what: "option reply",
                found: magic,
            });
        }
        Ok(Self {
            option: OptCode::from_u32(u32::from_be_bytes(bytes[8..12].try_into().expect("4"))),
            code: RepCode::from_u32(u32::from_be_bytes(bytes[12..16].try_into().expect("4"))),
            length: u32::from_be_bytes(bytes[16..20].try_into().expect("4")),
        })
    }
}

/// Appends a whole option reply.
pub fn encode_reply(out: &mut Vec<u8>, option: OptCode, code: RepCode, data: &[u8]) {
    out.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_u32().to_be_bytes());
    out.extend_from_slice(&code.to_u32().to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// Appends an error reply whose data is a message for a person.
pub fn encode_error(out: &mut Vec<u8>, option: OptCode, code: RepCode, message: &str) {
    encode_reply(
        out,
        option,
        code,
        truncate_utf8(message, MAX_STRING_LEN).as_bytes(),
    );
}

/// A reader over option data that fails, instead of panicking, on short
/// input.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Self { bytes, what }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.bytes.len() < n {
            return Err(ProtoError::Truncated { what: self.what });
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    pub(crate) fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2")))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4")))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8")))
    }

    /// A string of `len` bytes: UTF-8, no NUL, at most 4096 bytes.
    pub(crate) fn string(&mut self, len: usize) -> Result<String, ProtoError> {
        if len > MAX_STRING_LEN {
            return Err(ProtoError::BadString {
                what: self.what,
                why: "longer than 4096 bytes",
            });
        }
        let raw = self.take(len)?;
        let s = std::str::from_utf8(raw).map_err(|_| ProtoError::BadString {
            what: self.what,
            why: "not UTF-8",
        })?;
        if s.contains('\0') {
            return Err(ProtoError::BadString {
                what: self.what,
                why: "contains NUL",
            });
        }
        Ok(s.to_owned())
    }

    /// A string prefixed by its 32-bit length.
    pub(crate) fn lstring(&mut self) -> Result<String, ProtoError> {
        let len = self.u32()? as usize;
        self.string(len)
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

fn put_lstring(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Data of `NBD_OPT_INFO` and `NBD_OPT_GO`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoData {
    pub export: String,
    pub requests: Vec<u16>,
}

impl GoData {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.export.len() + 2 * self.requests.len());
        put_lstring(&mut out, &self.export);
        out.extend_from_slice(&(self.requests.len() as u16).to_be_bytes());
        for r in &self.requests {
            out.extend_from_slice(&r.to_be_bytes());
        }
        out
    }

    /// # Errors
    ///
    /// [`ProtoError::Truncated`] / [`ProtoError::BadString`] /
    /// [`ProtoError::TrailingData`] on a malformed option.
    pub fn decode(data: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(data, "NBD_OPT_GO data");
        let export = r.lstring()?;
        let n = r.u16()?;
        let requests = (0..n).map(|_| r.u16()).collect::<Result<Vec<_>, _>>()?;
        if !r.is_empty() {
            return Err(ProtoError::TrailingData { what: "NBD_OPT_GO" });
        }
        Ok(Self { export, requests })
    }
}

/// Data of `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaQuery {
    pub export: String,
    pub queries: Vec<String>,
}

impl MetaQuery {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_lstring(&mut out, &self.export);
        out.extend_from_slice(&(self.queries.len() as u32).to_be_bytes());
        for q in &self.queries {
            put_lstring(&mut out, q);
        }
        out
    }

    /// # Errors
    ///
    /// As [`GoData::decode`]; a query count larger than the data could hold
    /// fails before anything is allocated for it.
    pub fn decode(data: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(data, "meta context option data");
        let export = r.lstring()?;
        let n = r.u32()? as usize;
        // Each query takes at least 4 bytes: a count beyond that is a lie.
        if n > data.len() / 4 {
            return Err(ProtoError::Truncated {
                what: "meta context queries",
            });
        }
        let mut queries = Vec::with_capacity(n);
        for _ in 0..n {
            queries.push(r.lstring()?);
        }
        if !r.is_empty() {
            return Err(ProtoError::TrailingData {
                what: "meta context option",
            });
        }
        Ok(Self { export, queries })
    }
}

/// What an `NBD_REP_INFO` reply carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Info {
    Export {
        size: u64,
        flags: TransmissionFlags,
    },
    Name(String),
    Description(String),
    BlockSize {
        min: u32,
        preferred: u32,
        max: u32,
    },
    /// A type this implementation does not know; clients ignore it.
    Unknown(u16),
}

impl Info {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Self::Export { size, flags } => {
                out.extend_from_slice(&info::EXPORT.to_be_bytes());
                out.extend_from_slice(&size.to_be_bytes());
                out.extend_from_slice(&flags.0.to_be_bytes());
            }
            Self::Name(name) => {
                out.extend_from_slice(&info::NAME.to_be_bytes());
                out.extend_from_slice(truncate_utf8(name, MAX_STRING_LEN).as_bytes());
            }
            Self::Description(d) => {
                out.extend_from_slice(&info::DESCRIPTION.to_be_bytes());
                out.extend_from_slice(truncate_utf8(d, MAX_STRING_LEN).as_bytes());
            }
            Self::BlockSize {
                min,
                preferred,
                max,
            } => {
                out.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
                out.extend_from_slice(&min.to_be_bytes());
                out.extend_from_slice(&preferred.to_be_bytes());
                out.extend_from_slice(&max.to_be_bytes());
            }
            Self::Unknown(kind) => out.extend_from_slice(&kind.to_be_bytes()),
        }
        out
    }

    /// # Errors
    ///
    /// [`ProtoError::BadInfo`] when a known type has the wrong length or
    /// impossible values.
    pub fn decode(data: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(data, "NBD_REP_INFO");
        let kind = r.u16()?;
        let bad = |why| ProtoError::BadInfo { kind, why };
        let info = match kind {
            info::EXPORT => {
                if data.len() != 12 {
                    return Err(bad("INFO_EXPORT must be 12 bytes"));
                }
                Self::Export {
                    size: r.u64()?,
                    flags: TransmissionFlags(r.u16()?),
                }
            }
            info::NAME => Self::Name(r.string(data.len() - 2)?),
            info::DESCRIPTION => Self::Description(r.string(data.len() - 2)?),
            info::BLOCK_SIZE => {
                if data.len() != 14 {
                    return Err(bad("INFO_BLOCK_SIZE must be 14 bytes"));
                }
                let (min, preferred, max) = (r.u32()?, r.u32()?, r.u32()?);
                if !min.is_power_of_two() || min > 1 << 16 {
                    return Err(bad("minimum block size not a power of two up to 64 KiB"));
                }
                if !preferred.is_power_of_two() || preferred < min {
                    return Err(bad(
                        "preferred block size not a power of two at least the minimum",
                    ));
                }
                if max < min {
                    return Err(bad("maximum payload below the minimum block size"));
                }
                Self::BlockSize {
                    min,
                    preferred,
                    max,
                }
            }
            other => Self::Unknown(other),
        };
        Ok(info)
    }
}

/// An `NBD_REP_SERVER` entry: an export name and its description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerEntry {
    pub name: String,
    pub description: String,
}

impl ServerEntry {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_lstring(&mut out, truncate_utf8(&self.name, MAX_STRING_LEN));
        out.extend_from_slice(truncate_utf8(&self.description, MAX_STRING_LEN).as_bytes());
        out
    }

    /// # Errors
    ///
    /// [`ProtoError::Truncated`] / [`ProtoError::BadString`].
    pub fn decode(data: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(data, "NBD_REP_SERVER");
        let name = r.lstring()?;
        let rest = r.rest();
        Ok(Self {
            name,
            description: String::from_utf8_lossy(rest).into_owned(),
        })
    }
}

/// An `NBD_REP_META_CONTEXT` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaContext {
    pub id: u32,
    pub name: String,
}

impl MetaContext {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.name.len());
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(truncate_utf8(&self.name, MAX_STRING_LEN).as_bytes());
        out
    }

    /// # Errors
    ///
    /// [`ProtoError::Truncated`] / [`ProtoError::BadString`].
    pub fn decode(data: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(data, "NBD_REP_META_CONTEXT");
        let id = r.u32()?;
        let name = r.string(data.len() - 4)?;
        Ok(Self { id, name })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_header_layout() {
        let mut out = Vec::new();
        encode_option(&mut out, OptCode::Go, &[1, 2]);
        assert_eq!(&out[..8], b"IHAVEOPT");
        assert_eq!(&out[8..16], &[0, 0, 0, 7, 0, 0, 0, 2]);
        let h = OptionHeader::decode(out[..16].try_into().unwrap()).unwrap();
        assert_eq!(
            h,
            OptionHeader {
                code: OptCode::Go,
                length: 2
            }
        );
        let mut bad = out.clone();
        bad[0] = b'X';
        assert!(OptionHeader::decode(bad[..16].try_into().unwrap()).is_err());
    }

    #[test]
    fn reply_header_layout() {
        let mut out = Vec::new();
        encode_reply(&mut out, OptCode::List, RepCode::ErrUnsup, b"no");
        assert_eq!(
            out,
            [
                0, 3, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9, 0, 0, 0, 3, 0x80, 0, 0, 1, 0, 0, 0, 2,
                b'n', b'o'
            ]
        );
        let h = OptionReplyHeader::decode(out[..20].try_into().unwrap()).unwrap();
        assert_eq!(h.code, RepCode::ErrUnsup);
        assert_eq!(h.option, OptCode::List);
        assert_eq!(h.length, 2);
    }

    #[test]
    fn go_data_round_trip_and_malformed() {
        let g = GoData {
            export: "vol".into(),
            requests: vec![info::BLOCK_SIZE, info::NAME],
        };
        let bytes = g.encode();
        assert_eq!(bytes, [0, 0, 0, 3, b'v', b'o', b'l', 0, 2, 0, 3, 0, 1]);
        assert_eq!(GoData::decode(&bytes).unwrap(), g);
        for cut in 0..bytes.len() {
            assert!(GoData::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(GoData::decode(&trailing).is_err());
        // A name length far beyond the data.
        assert!(GoData::decode(&[0xff, 0xff, 0xff, 0xff, 0, 0]).is_err());
        // NUL in the name.
        assert!(GoData::decode(&[0, 0, 0, 1, 0, 0, 0]).is_err());
    }

    #[test]
    fn meta_query_round_trip_and_lying_count() {
        let q = MetaQuery {
            export: "".into(),
            queries: vec!["base:".into(), "x-braid:".into()],
        };
        let bytes = q.encode();
        assert_eq!(MetaQuery::decode(&bytes).unwrap(), q);
        for cut in 0..bytes.len() {
            assert!(MetaQuery::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        // Claims 2^32-1 queries in 8 bytes.
        assert!(MetaQuery::decode(&[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn info_round_trip() {
        for i in [
            Info::Export {
                size: 1 << 30,
                flags: TransmissionFlags(0x1ff),
            },
            Info::Name("vol".into()),
            Info::Description("a volume".into()),
            Info::BlockSize {
                min: 1,
                preferred: 4096,
                max: 1 << 25,
            },
            Info::Unknown(42),
        ] {
            assert_eq!(Info::decode(&i.encode()).unwrap(), i);
        }
        assert_eq!(
            Info::Export {
                size: 0x10,
                flags: TransmissionFlags(3)
            }
            .encode(),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 3]
        );
        assert!(Info::decode(&[0, 0, 1]).is_err());
        assert!(Info::decode(&[0, 3, 0, 0, 0, 3, 0, 0, 16, 0, 0, 0, 16, 0]).is_err());
        assert!(Info::decode(&[0]).is_err());
    }

    #[test]
    fn server_and_context_entries() {
        let s = ServerEntry {
            name: "a".into(),
            description: "desc".into(),
        };
        assert_eq!(ServerEntry::decode(&s.encode()).unwrap(), s);
        assert!(ServerEntry::decode(&[0, 0, 0, 9, b'a']).is_err());
        let m = MetaContext {
            id: 3,
            name: "base:allocation".into(),
        };
        assert_eq!(MetaContext::decode(&m.encode()).unwrap(), m);
        assert!(MetaContext::decode(&[0, 0]).is_err());
    }
}
