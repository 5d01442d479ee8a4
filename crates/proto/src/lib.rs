//! The NBD protocol as braid speaks it: wire format, handshake state
//! machines for both sides, and the `x-braid:` metadata namespace.
//!
//! This crate does no I/O. It never opens a socket, spawns a task or reads
//! the clock: bytes go in, bytes and events come out, and the drivers in
//! `braid-nbd-target` and `braid-initiator` carry them out. That is what lets
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

/// Entry points for fuzz targets (`fuzz/` at the top of the workspace) and
/// for the regression replay in `tests/fuzz_regressions.rs`; not part of
/// the API.
///
/// Each function takes arbitrary bytes and must never panic. Beyond "does
/// not crash", they check what the parsers promise:
///
/// - the handshakes reach the same events, output and end however the
///   input is cut into reads ("incomplete is not an error"): every input is
///   fed once whole and once a byte at a time;
/// - a request that passes `Request::validate` is one a backend may run
///   (inside the export, aligned, within the payload limit, not a write to
///   a read-only export), for a fixed and a fuzzed negotiation, and for the
///   negotiation the server handshake itself produced;
/// - every header decodes back to the bytes it came from.
#[doc(hidden)]
pub mod fuzzing {
    use bytes::BytesMut;

    use crate::client::{ClientEvent, Finish};
    use crate::reply::{self, ReplyHeader};
    use crate::server::{Catalog, ExportInfo, Refusal, ServerEvent, TlsMode};
    use crate::wire::{CmdFlags, Command, REQUEST_HEADER_LEN};
    use crate::{
        option, ClientConfig, ClientHandshake, Negotiated, ProtoError, Request, ServerConfig,
        ServerHandshake, TransmissionFlags,
    };

    struct OneExport;

    impl Catalog for OneExport {
        fn lookup(&self, name: &str) -> Result<ExportInfo, Refusal> {
            match name {
                "" | "vol" => Ok(ExportInfo {
                    name: "vol".into(),
                    description: "fuzz".into(),
                    size: 1 << 20,
                    flags: crate::TransmissionFlags(0x0dfd),
                    min_block: 1,
                    preferred_block: 4096,
                    max_payload: 1 << 25,
                    volume: Some("00000000-0000-0000-0000-000000000001".into()),
                    peer_portals: Vec::new(),
                    instance: None,
                }),
                "secret" => Err(Refusal::Policy("not for you".into())),
                _ => Err(Refusal::Unknown(format!("no export {name:?}"))),
            }
        }

        fn list(&self) -> Vec<option::ServerEntry> {
            vec![option::ServerEntry {
                name: "vol".into(),
                description: "fuzz".into(),
            }]
        }
    }

    /// Feeds arbitrary client bytes to a server handshake, with TLS off and
    /// required, whole and a byte at a time; after the handshake the rest
    /// is read as requests and validated against what was negotiated.
    pub fn server_handshake(data: &[u8]) {
        for tls in [TlsMode::Off, TlsMode::Required] {
            let whole = ServerRun::drive(tls, data, data.len().max(1));
            let bytewise = ServerRun::drive(tls, data, 1);
            assert_eq!(
                whole, bytewise,
                "server handshake ({tls:?}) differs when fed a byte at a time"
            );
            if let (Some(ServerEvent::Transmission(session)), Some(used)) =
                (whole.events.last(), whole.consumed)
            {
                requests_after_handshake(&data[used..], &session.negotiated());
            }
        }
    }

    /// Feeds arbitrary server bytes to client handshakes of several
    /// configurations, whole and a byte at a time.
    pub fn client_handshake(data: &[u8]) {
        for cfg in client_configs() {
            let whole = ClientRun::drive(cfg.clone(), data, data.len().max(1));
            let bytewise = ClientRun::drive(cfg.clone(), data, 1);
            assert_eq!(
                whole, bytewise,
                "client handshake ({cfg:?}) differs when fed a byte at a time"
            );
            if let Some(ClientEvent::Done(outcome)) = &whole.end {
                if let Some(e) = &outcome.export {
                    assert!(
                        e.min_block.is_power_of_two()
                            && e.preferred_block >= e.min_block
                            && e.max_payload >= e.min_block,
                        "client accepted impossible block sizes {e:?}"
                    );
                }
            }
        }
    }

    /// Parses arbitrary bytes as a request header and validates it, against
    /// a fixed negotiation and one made from the bytes after the header.
    pub fn request(data: &[u8]) {
        let Some(header) = data
            .get(..REQUEST_HEADER_LEN)
            .and_then(|h| <&[u8; REQUEST_HEADER_LEN]>::try_from(h).ok())
        else {
            return;
        };
        let Ok(r) = Request::decode(header) else {
            return;
        };
        let mut again = [0u8; REQUEST_HEADER_LEN];
        r.encode(&mut again);
        assert_eq!(&again, header, "request {r:?} does not encode back");
        check_validate(
            &r,
            &Negotiated {
                size: 1 << 20,
                flags: crate::TransmissionFlags(0x0dfd),
                min_block: 512,
                max_payload: 1 << 25,
                structured: true,
                block_status: true,
            },
        );
        if let Some(ctx) = negotiated_from(&data[REQUEST_HEADER_LEN..]) {
            check_validate(&r, &ctx);
        }
    }

    /// Parses arbitrary bytes as a reply header and, for a chunk that passes
    /// its length check, the rest as each kind of chunk payload.
    pub fn reply(data: &[u8]) {
        match ReplyHeader::decode(data) {
            Ok(ReplyHeader::Simple(s)) => {
                assert_eq!(&s.encode()[..], &data[..16], "simple reply round trip");
                let _ = s.errno();
            }
            Ok(ReplyHeader::Chunk(c)) => {
                assert_eq!(&c.encode()[..], &data[..20], "chunk header round trip");
                let payload = &data[20..];
                if c.check(1 << 25).is_ok() {
                    if let Ok(s) = reply::BlockStatus::decode(payload) {
                        assert!(!s.extents.is_empty() && s.extents.iter().all(|e| e.length > 0));
                        let mut out = Vec::new();
                        s.encode_into(&mut out);
                        assert_eq!(out, payload, "BLOCK_STATUS round trip");
                    }
                    if let Ok(e) = reply::ErrorChunk::decode(c.kind, payload) {
                        assert_ne!(e.error.to_u32(), 0, "error chunk with error 0");
                    }
                    if let Ok(h) = reply::OffsetHole::decode(payload) {
                        let mut out = Vec::new();
                        reply::encode::offset_hole(&mut out, c.cookie, h, c.done());
                        assert_eq!(&out[20..], &payload[..12], "OFFSET_HOLE round trip");
                    }
                    if let Some(head) = payload.get(..8).and_then(|b| b.try_into().ok()) {
                        let _ = reply::OffsetData::decode(head);
                    }
                }
            }
            Err(_) => {}
        }
    }

    /// What one server handshake did: every event, all output, how it
    /// ended, and how many input bytes it had used when it ended.
    #[derive(Debug, PartialEq)]
    struct ServerRun {
        events: Vec<ServerEvent>,
        output: Vec<u8>,
        error: Option<ProtoError>,
        /// Set when the handshake ended in transmission: where the
        /// transmission phase's bytes start.
        consumed: Option<usize>,
    }

    impl ServerRun {
        fn drive(tls: TlsMode, data: &[u8], step: usize) -> Self {
            let mut hs = ServerHandshake::new(ServerConfig {
                portals: vec!["127.0.0.1:10809".into(), "[::1]:10809".into()],
                tls,
                // Small, so the discard path is reachable by short inputs.
                max_option_len: 1024,
                ..ServerConfig::default()
            });
            let mut run = Self {
                events: Vec::new(),
                output: hs.take_output(),
                error: None,
                consumed: None,
            };
            let mut input = BytesMut::new();
            let mut fed = 0;
            'feed: for piece in data.chunks(step) {
                input.extend_from_slice(piece);
                fed += piece.len();
                // Each event but NeedInput changes state, so this ends; the
                // bound turns a handshake that stops progressing into a
                // failure instead of a hang.
                for _ in 0..=data.len() + 2 {
                    let result = hs.handle_input(&mut input, &OneExport);
                    run.output.extend(hs.take_output());
                    match result {
                        Ok(ServerEvent::NeedInput) => continue 'feed,
                        Ok(ServerEvent::StartTls) => {
                            run.events.push(ServerEvent::StartTls);
                            hs.tls_established();
                        }
                        Ok(fence @ ServerEvent::Fence { .. }) => {
                            // Both outcomes, chosen by the input.
                            let even = matches!(&fence, ServerEvent::Fence { ids, .. } if ids.len() % 2 == 0);
                            hs.fence_done(if even { Ok(()) } else { Err("fuzz".into()) });
                            run.events.push(fence);
                        }
                        Ok(end @ ServerEvent::Transmission(_)) => {
                            run.events.push(end);
                            run.consumed = Some(fed - input.len());
                            break 'feed;
                        }
                        Ok(ServerEvent::Closed) => {
                            run.events.push(ServerEvent::Closed);
                            break 'feed;
                        }
                        Err(e) => {
                            run.error = Some(e);
                            break 'feed;
                        }
                    }
                    run.output.extend(hs.take_output());
                }
                panic!("server handshake made no progress");
            }
            run.output.extend(hs.take_output());
            run
        }
    }

    /// What one client handshake did.
    #[derive(Debug, PartialEq)]
    struct ClientRun {
        tls_upgrades: usize,
        output: Vec<u8>,
        end: Option<ClientEvent>,
        error: Option<ProtoError>,
        /// What the client makes of the server closing at the end.
        eof: Option<Box<crate::ClientOutcome>>,
    }

    impl ClientRun {
        fn drive(cfg: ClientConfig, data: &[u8], step: usize) -> Self {
            let mut hs = ClientHandshake::new(cfg);
            let mut run = Self {
                tls_upgrades: 0,
                output: hs.take_output(),
                end: None,
                error: None,
                eof: None,
            };
            let mut input = BytesMut::new();
            'feed: for piece in data.chunks(step) {
                input.extend_from_slice(piece);
                for _ in 0..=data.len() + 2 {
                    let result = hs.handle_input(&mut input);
                    run.output.extend(hs.take_output());
                    match result {
                        Ok(ClientEvent::NeedInput) => continue 'feed,
                        Ok(ClientEvent::StartTls) => {
                            run.tls_upgrades += 1;
                            hs.tls_established();
                        }
                        Ok(done @ ClientEvent::Done(_)) => {
                            run.end = Some(done);
                            break 'feed;
                        }
                        Err(e) => {
                            run.error = Some(e);
                            break 'feed;
                        }
                    }
                }
                panic!("client handshake made no progress");
            }
            if run.end.is_none() && run.error.is_none() {
                run.eof = hs.eof().map(Box::new);
            }
            run.output.extend(hs.take_output());
            run
        }
    }

    fn client_configs() -> [ClientConfig; 4] {
        let mut meta = ClientConfig::go("vol");
        meta.list_queries = vec!["x-braid:".into()];
        meta.set_contexts = vec!["base:allocation".into()];
        let mut info = ClientConfig::go("vol");
        info.list_exports = true;
        info.finish = Finish::Info;
        let mut tls_list = ClientConfig::go("");
        tls_list.tls = true;
        tls_list.list_exports = true;
        tls_list.structured = false;
        tls_list.finish = Finish::Abort;
        let mut plain = ClientConfig::go("vol");
        plain.structured = false;
        [meta, info, tls_list, plain]
    }

    /// Reads what follows a handshake as request headers (skipping WRITE
    /// payloads) and validates each against the session's negotiation.
    fn requests_after_handshake(mut rest: &[u8], ctx: &Negotiated) {
        while let Some(header) = rest
            .get(..REQUEST_HEADER_LEN)
            .and_then(|h| <&[u8; REQUEST_HEADER_LEN]>::try_from(h).ok())
        {
            let Ok(r) = Request::decode(header) else {
                return;
            };
            check_validate(&r, ctx);
            let skip = REQUEST_HEADER_LEN.saturating_add(r.payload_len() as usize);
            rest = rest.get(skip..).unwrap_or_default();
        }
    }

    /// A negotiation made from fuzz bytes, as any server could have agreed.
    fn negotiated_from(bytes: &[u8]) -> Option<Negotiated> {
        let b: &[u8; 16] = bytes.get(..16)?.try_into().ok()?;
        let min_block = 1u32 << (b[10] % 17);
        Some(Negotiated {
            size: u64::from_be_bytes(b[0..8].try_into().ok()?),
            flags: TransmissionFlags(u16::from_be_bytes([b[8], b[9]])),
            min_block,
            max_payload: u32::from_be_bytes(b[11..15].try_into().ok()?).max(min_block),
            structured: b[15] & 1 != 0,
            block_status: b[15] & 2 != 0,
        })
    }

    /// Validation's promise: a request it accepts is one a backend may run
    /// as it is (backends assume valid input).
    fn check_validate(r: &Request, ctx: &Negotiated) {
        if r.validate(ctx).is_err() {
            return;
        }
        let end = r.offset.checked_add(u64::from(r.length));
        let inside = matches!(end, Some(end) if end <= ctx.size);
        let aligned = r.offset.is_multiple_of(u64::from(ctx.min_block))
            && r.length.is_multiple_of(ctx.min_block);
        match r.command {
            Command::Read
            | Command::Write
            | Command::Cache
            | Command::Trim
            | Command::WriteZeroes
            | Command::BlockStatus => {
                assert!(inside, "accepted {r:?} outside the export ({ctx:?})");
                assert!(aligned, "accepted unaligned {r:?} ({ctx:?})");
            }
            Command::Flush | Command::Disc => {}
            Command::Unknown(_) => panic!("accepted unknown command {r:?}"),
        }
        if matches!(r.command, Command::Read | Command::Write) {
            assert!(
                r.length <= ctx.max_payload,
                "accepted {r:?} above the maximum payload ({ctx:?})"
            );
        }
        if matches!(
            r.command,
            Command::Write | Command::Trim | Command::WriteZeroes
        ) {
            assert!(
                !ctx.flags.read_only(),
                "accepted {r:?} on a read-only export"
            );
        }
        if r.flags.has(CmdFlags::FUA) {
            assert!(
                ctx.flags.has(TransmissionFlags::SEND_FUA),
                "accepted FUA {r:?} without SEND_FUA"
            );
        }
    }
}
