//! The NBD protocol as braid speaks it: wire format, handshake state
//! machines for both sides, and the `x-braid:` metadata namespace.
//!
//! This crate does no I/O. It never opens a socket, spawns a task or reads
//! the clock: bytes go in, bytes and events come out, and the drivers in
//! `braid-target` and `braid-initiator` carry them out. That is what lets
//! every message be tested from byte vectors and every parser be fuzzed.
//!
//! The spec is `doc/proto.md` in the NetworkBlockDevice/nbd repository;
//! section names in comments refer to it.

pub mod braid_ns;
pub mod client;
pub mod option;
pub mod reply;
pub mod request;
pub mod server;
pub mod wire;

#[cfg(test)]
mod handshake_tests;

pub use client::{
    ClientConfig, ClientEvent, ClientHandshake, ClientOutcome, ExportDetails, Finish,
};
pub use request::{Negotiated, Request};
pub use server::{
    Catalog, ContextKind, ExportInfo, Refusal, SelectedContext, ServerConfig, ServerEvent,
    ServerHandshake, Session, TlsMode,
};
pub use wire::{CmdFlags, Command, Cookie, Errno, TransmissionFlags};

/// A violation of the protocol by the peer, or a refusal the handshake
/// cannot continue past. Either way the connection ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    #[error("bad {what} magic {found:#x}")]
    BadMagic { what: &'static str, found: u64 },
    #[error("{what} is truncated")]
    Truncated { what: &'static str },
    #[error("{what} has trailing bytes")]
    TrailingData { what: &'static str },
    #[error("bad string in {what}: {why}")]
    BadString {
        what: &'static str,
        why: &'static str,
    },
    #[error("client sent unknown flags {0:#x}")]
    BadClientFlags(u32),
    #[error("peer does not speak fixed newstyle negotiation (oldstyle and plain newstyle are not supported)")]
    NotFixedNewstyle,
    #[error("option {code} carries {length} bytes of data, more than this server reads")]
    OptionTooLong { code: u32, length: u32 },
    #[error("option reply of {length} bytes is larger than any valid reply")]
    ReplyTooLong { length: u32 },
    #[error("export {name:?} refused: {why}")]
    ExportRefused { name: String, why: String },
    #[error("TLS is required before choosing an export")]
    TlsRequired,
    #[error("server refused option {option} with {reply}: {message}")]
    Refused {
        option: u32,
        reply: &'static str,
        message: String,
    },
    #[error("unexpected reply {reply:#x} to option {option}")]
    UnexpectedReply { option: u32, reply: u32 },
    #[error("server accepted the export without sending NBD_INFO_EXPORT")]
    MissingExportInfo,
    #[error("bad NBD_REP_INFO of type {kind}: {why}")]
    BadInfo { kind: u16, why: &'static str },
    #[error("bad structured reply chunk (type {kind}, length {length}): {why}")]
    BadChunk {
        kind: u16,
        length: u32,
        why: &'static str,
    },
}

/// Entry points for fuzz targets; not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    use bytes::BytesMut;

    use crate::server::{Catalog, ExportInfo, Refusal};
    use crate::{option, reply, ClientConfig, ClientHandshake, ServerConfig, ServerHandshake};

    struct OneExport;

    impl Catalog for OneExport {
        fn lookup(&self, name: &str) -> Result<ExportInfo, Refusal> {
            if name.is_empty() || name == "vol" {
                Ok(ExportInfo {
                    name: "vol".into(),
                    description: "fuzz".into(),
                    size: 1 << 20,
                    flags: crate::TransmissionFlags(0x0dfd),
                    min_block: 1,
                    preferred_block: 4096,
                    max_payload: 1 << 25,
                    volume: Some("00000000-0000-0000-0000-000000000001".into()),
                })
            } else {
                Err(Refusal::Unknown(format!("no export {name:?}")))
            }
        }

        fn list(&self) -> Vec<option::ServerEntry> {
            Vec::new()
        }
    }

    /// Feeds arbitrary client bytes to a server handshake.
    pub fn server_handshake(data: &[u8]) {
        let mut hs = ServerHandshake::new(ServerConfig {
            portals: vec!["127.0.0.1:10809".into()],
            ..ServerConfig::default()
        });
        let mut input = BytesMut::from(data);
        let _ = hs.handle_input(&mut input, &OneExport);
        hs.fence_done(Ok(()));
        let _ = hs.handle_input(&mut input, &OneExport);
    }

    /// Feeds arbitrary server bytes to a client handshake.
    pub fn client_handshake(data: &[u8]) {
        let mut cfg = ClientConfig::go("vol");
        cfg.list_queries = vec!["x-braid:".into()];
        cfg.set_contexts = vec!["base:allocation".into()];
        let mut hs = ClientHandshake::new(cfg);
        let mut input = BytesMut::from(data);
        let _ = hs.handle_input(&mut input);
    }

    /// Parses arbitrary bytes as a request header and validates it.
    pub fn request(data: &[u8]) {
        if let Some(header) = data.get(..28).and_then(|h| h.try_into().ok()) {
            if let Ok(r) = crate::Request::decode(header) {
                let _ = r.validate(&crate::Negotiated {
                    size: 1 << 20,
                    flags: crate::TransmissionFlags(0x0dfd),
                    min_block: 512,
                    max_payload: 1 << 25,
                    structured: true,
                    block_status: true,
                });
            }
        }
    }

    /// Parses arbitrary bytes as a reply header and its payload.
    pub fn reply(data: &[u8]) {
        if let Ok(reply::ReplyHeader::Chunk(c)) = reply::ReplyHeader::decode(data) {
            let payload = &data[data.len().min(20)..];
            if c.check(1 << 25).is_ok() {
                let _ = reply::BlockStatus::decode(payload);
                let _ = reply::ErrorChunk::decode(c.kind, payload);
                let _ = reply::OffsetHole::decode(payload);
            }
        }
    }
}
