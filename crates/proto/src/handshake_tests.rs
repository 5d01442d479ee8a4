//! Whole handshakes, both sides, from byte vectors and in memory.

use bytes::BytesMut;

use crate::option::{
    encode_option, encode_reply, GoData, Info, MetaContext, MetaQuery, OptionReplyHeader,
    ServerEntry,
};
use crate::server::{Catalog, ExportInfo, Refusal};
use crate::wire::{info, OptCode, RepCode, TransmissionFlags, OPT_REPLY_MAGIC};
use crate::*;

struct TwoExports;

fn export(name: &str) -> ExportInfo {
    ExportInfo {
        name: name.into(),
        description: format!("the {name} volume"),
        size: 1 << 20,
        flags: TransmissionFlags(
            TransmissionFlags::SEND_FLUSH
                | TransmissionFlags::SEND_FUA
                | TransmissionFlags::SEND_DF
                | TransmissionFlags::CAN_MULTI_CONN,
        ),
        min_block: 1,
        preferred_block: 4096,
        max_payload: 1 << 25,
        volume: Some(format!("uuid-of-{name}")),
        peer_portals: Vec::new(),
        instance: None,
    }
}

impl Catalog for TwoExports {
    fn lookup(&self, name: &str) -> Result<ExportInfo, Refusal> {
        match name {
            "" | "a" => Ok(export("a")),
            "b" => Ok(export("b")),
            // A gateway of a shared volume: other servers' portals, and the
            // volume's own instance rather than the server's.
            "g" => Ok(ExportInfo {
                peer_portals: vec!["127.0.0.2:10809".into(), "10.0.0.9:10809".into()],
                instance: Some(braid_ns::InstanceId(7)),
                ..export("g")
            }),
            "secret" => Err(Refusal::Policy("not for you".into())),
            other => Err(Refusal::Unknown(format!("no export {other:?}; try a or b"))),
        }
    }

    fn list(&self) -> Vec<ServerEntry> {
        ["a", "b"]
            .iter()
            .map(|n| ServerEntry {
                name: (*n).into(),
                description: format!("the {n} volume"),
            })
            .collect()
    }
}

fn server() -> ServerHandshake {
    ServerHandshake::new(ServerConfig {
        conn_id: braid_ns::ConnId(0x42),
        portals: vec!["127.0.0.1:10809".into(), "127.0.0.2:10809".into()],
        ..ServerConfig::default()
    })
}

/// Starts a server, sends client flags, returns it with the greeting read.
fn started(flags: u32) -> ServerHandshake {
    let mut s = server();
    let greeting = s.take_output();
    assert_eq!(greeting.len(), 18);
    let mut input = BytesMut::from(&flags.to_be_bytes()[..]);
    assert_eq!(
        s.handle_input(&mut input, &TwoExports).unwrap(),
        ServerEvent::NeedInput
    );
    s
}

fn send(s: &mut ServerHandshake, code: OptCode, data: &[u8]) -> ServerEvent {
    let mut bytes = Vec::new();
    encode_option(&mut bytes, code, data);
    let mut input = BytesMut::from(&bytes[..]);
    let ev = s.handle_input(&mut input, &TwoExports).unwrap();
    assert!(input.is_empty());
    ev
}

/// Splits server output into option replies.
fn replies(mut out: &[u8]) -> Vec<(OptCode, RepCode, Vec<u8>)> {
    let mut v = Vec::new();
    while !out.is_empty() {
        let h = OptionReplyHeader::decode(out[..20].try_into().unwrap()).unwrap();
        let end = 20 + h.length as usize;
        v.push((h.option, h.code, out[20..end].to_vec()));
        out = &out[end..];
    }
    v
}

#[test]
fn greeting_is_fixed_newstyle_with_no_zeroes() {
    let mut s = server();
    assert_eq!(
        s.take_output(),
        [
            b'N', b'B', b'D', b'M', b'A', b'G', b'I', b'C', b'I', b'H', b'A', b'V', b'E', b'O',
            b'P', b'T', 0, 3
        ]
    );
}

#[test]
fn unknown_client_flags_close_the_connection() {
    let mut s = server();
    let mut input = BytesMut::from(&[0u8, 0, 0, 5][..]);
    assert_eq!(
        s.handle_input(&mut input, &TwoExports),
        Err(ProtoError::BadClientFlags(5))
    );
    let mut s = server();
    let mut input = BytesMut::from(&[0u8, 0, 0, 0][..]);
    assert_eq!(
        s.handle_input(&mut input, &TwoExports),
        Err(ProtoError::NotFixedNewstyle)
    );
}

#[test]
fn wrong_option_magic_is_an_error() {
    let mut s = started(3);
    let mut input = BytesMut::from(&b"IHAVEOPX\0\0\0\x07\0\0\0\0"[..]);
    assert!(matches!(
        s.handle_input(&mut input, &TwoExports),
        Err(ProtoError::BadMagic { what: "option", .. })
    ));
}

#[test]
fn unknown_options_get_err_unsup_and_the_handshake_goes_on() {
    let mut s = started(3);
    assert_eq!(
        send(&mut s, OptCode::Unknown(77), b"xyz"),
        ServerEvent::NeedInput
    );
    assert_eq!(
        send(&mut s, OptCode::ExtendedHeaders, b""),
        ServerEvent::NeedInput
    );
    assert_eq!(send(&mut s, OptCode::List, b""), ServerEvent::NeedInput);
    let r = replies(&s.take_output());
    assert_eq!(r[0].0, OptCode::Unknown(77));
    assert_eq!(r[0].1, RepCode::ErrUnsup);
    assert_eq!(r[1].1, RepCode::ErrUnsup);
    assert_eq!(r[2].1, RepCode::Server);
    assert_eq!(ServerEntry::decode(&r[2].2).unwrap().name, "a");
    assert_eq!(r[4].1, RepCode::Ack);
}

#[test]
fn list_with_data_is_invalid() {
    let mut s = started(3);
    send(&mut s, OptCode::List, b"x");
    assert_eq!(replies(&s.take_output())[0].1, RepCode::ErrInvalid);
}

#[test]
fn export_name_with_and_without_zeroes() {
    for (flags, len) in [(3u32, 10usize), (1, 134)] {
        let mut s = started(flags);
        match send(&mut s, OptCode::ExportName, b"b") {
            ServerEvent::Transmission(session) => {
                assert_eq!(session.export.name, "b");
                assert!(!session.structured);
                assert!(!session.flags.has(TransmissionFlags::SEND_DF));
            }
            other => panic!("{other:?}"),
        }
        let out = s.take_output();
        assert_eq!(out.len(), len);
        assert_eq!(&out[..8], &(1u64 << 20).to_be_bytes());
    }
}

#[test]
fn export_name_for_a_missing_export_closes() {
    let mut s = started(3);
    let mut bytes = Vec::new();
    encode_option(&mut bytes, OptCode::ExportName, b"nope");
    let mut input = BytesMut::from(&bytes[..]);
    assert!(matches!(
        s.handle_input(&mut input, &TwoExports),
        Err(ProtoError::ExportRefused { .. })
    ));
}

#[test]
fn go_reports_info_and_enters_transmission() {
    let mut s = started(3);
    send(&mut s, OptCode::StructuredReply, b"");
    let go = GoData {
        export: "a".into(),
        requests: vec![info::NAME, info::DESCRIPTION, info::BLOCK_SIZE],
    };
    let ServerEvent::Transmission(session) = send(&mut s, OptCode::Go, &go.encode()) else {
        panic!("no transmission");
    };
    assert!(session.structured && session.block_size_acked);
    assert!(session
        .flags
        .has(TransmissionFlags::SEND_DF | TransmissionFlags::HAS_FLAGS));
    let r = replies(&s.take_output());
    assert_eq!(r[0].1, RepCode::Ack);
    let infos: Vec<Info> = r[1..r.len() - 1]
        .iter()
        .map(|(_, c, d)| {
            assert_eq!(*c, RepCode::Info);
            Info::decode(d).unwrap()
        })
        .collect();
    assert!(infos.contains(&Info::Name("a".into())));
    assert!(infos.contains(&Info::Description("the a volume".into())));
    assert!(infos
        .iter()
        .any(|i| matches!(i, Info::Export { size, .. } if *size == 1 << 20)));
    assert_eq!(r.last().unwrap().1, RepCode::Ack);
}

#[test]
fn go_errors_keep_the_handshake_alive() {
    let mut s = started(3);
    let unknown = GoData {
        export: "zzz".into(),
        requests: vec![],
    };
    assert_eq!(
        send(&mut s, OptCode::Go, &unknown.encode()),
        ServerEvent::NeedInput
    );
    let secret = GoData {
        export: "secret".into(),
        requests: vec![],
    };
    assert_eq!(
        send(&mut s, OptCode::Info, &secret.encode()),
        ServerEvent::NeedInput
    );
    assert_eq!(
        send(&mut s, OptCode::Go, &[0, 0, 0, 9]),
        ServerEvent::NeedInput
    );
    let r = replies(&s.take_output());
    assert_eq!(r[0].1, RepCode::ErrUnknown);
    assert!(String::from_utf8_lossy(&r[0].2).contains("try a or b"));
    assert_eq!(r[1].1, RepCode::ErrPolicy);
    assert_eq!(r[2].1, RepCode::ErrInvalid);
    let ok = GoData {
        export: "".into(),
        requests: vec![],
    };
    assert!(matches!(
        send(&mut s, OptCode::Go, &ok.encode()),
        ServerEvent::Transmission(_)
    ));
}

#[test]
fn abort_is_acknowledged() {
    let mut s = started(3);
    assert_eq!(send(&mut s, OptCode::Abort, b""), ServerEvent::Closed);
    assert_eq!(replies(&s.take_output())[0].1, RepCode::Ack);
}

#[test]
fn starttls_without_tls_is_refused_by_policy() {
    let mut s = started(3);
    send(&mut s, OptCode::StartTls, b"");
    assert_eq!(replies(&s.take_output())[0].1, RepCode::ErrPolicy);
}

#[test]
fn forced_tls_refuses_everything_before_starttls() {
    let mut s = ServerHandshake::new(ServerConfig {
        tls: TlsMode::Required,
        ..ServerConfig::default()
    });
    s.take_output();
    let mut input = BytesMut::from(&3u32.to_be_bytes()[..]);
    s.handle_input(&mut input, &TwoExports).unwrap();
    send(&mut s, OptCode::List, b"");
    assert_eq!(replies(&s.take_output())[0].1, RepCode::ErrTlsReqd);
    assert_eq!(send(&mut s, OptCode::StartTls, b""), ServerEvent::StartTls);
    assert_eq!(replies(&s.take_output())[0].1, RepCode::Ack);
    s.tls_established();
    send(&mut s, OptCode::List, b"");
    assert_eq!(replies(&s.take_output())[0].1, RepCode::Server);
    send(&mut s, OptCode::StartTls, b"");
    assert_eq!(replies(&s.take_output())[0].1, RepCode::ErrInvalid);
}

fn meta(export: &str, queries: &[&str]) -> Vec<u8> {
    MetaQuery {
        export: export.into(),
        queries: queries.iter().map(|q| (*q).into()).collect(),
    }
    .encode()
}

fn context_names(out: &[u8]) -> Vec<(u32, String)> {
    replies(out)
        .into_iter()
        .filter(|(_, c, _)| *c == RepCode::MetaContext)
        .map(|(_, _, d)| {
            let m = MetaContext::decode(&d).unwrap();
            (m.id, m.name)
        })
        .collect()
}

#[test]
fn meta_contexts_need_structured_replies() {
    let mut s = started(3);
    send(&mut s, OptCode::ListMetaContext, &meta("a", &["base:"]));
    assert_eq!(replies(&s.take_output())[0].1, RepCode::ErrInvalid);
}

/// The context names listed for `export` and `queries`.
fn list_contexts(s: &mut ServerHandshake, export: &str, queries: &[&str]) -> Vec<String> {
    send(s, OptCode::ListMetaContext, &meta(export, queries));
    context_names(&s.take_output())
        .into_iter()
        .map(|c| c.1)
        .collect()
}

#[test]
fn listing_braid_contexts() {
    let mut s = started(3);
    send(&mut s, OptCode::StructuredReply, b"");
    s.take_output();
    assert_eq!(
        list_contexts(&mut s, "a", &["x-braid:"]),
        [
            "x-braid:volume=uuid-of-a",
            "x-braid:portal=127.0.0.1:10809",
            "x-braid:portal=127.0.0.2:10809",
            "x-braid:conn=00000000000000000000000000000042"
        ]
    );
    // Another server's portals follow the server's own, each once; the
    // export's instance replaces the server's.
    assert_eq!(
        list_contexts(&mut s, "g", &["x-braid:"]),
        [
            "x-braid:volume=uuid-of-g",
            "x-braid:portal=127.0.0.1:10809",
            "x-braid:portal=127.0.0.2:10809",
            "x-braid:portal=10.0.0.9:10809",
            "x-braid:conn=00000000000000000000000000000042",
            "x-braid:instance=00000000000000000000000000000007"
        ]
    );
    // No query: everything, base:allocation first.
    let names = list_contexts(&mut s, "b", &[]);
    assert_eq!(names[0], "base:allocation");
    assert!(names.contains(&"x-braid:volume=uuid-of-b".to_string()));
    // Unknown namespaces are ignored, ending with a lone ACK.
    send(
        &mut s,
        OptCode::ListMetaContext,
        &meta("b", &["qemu:dirty-bitmap:x"]),
    );
    let r = replies(&s.take_output());
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].1, RepCode::Ack);
    send(&mut s, OptCode::ListMetaContext, &meta("nope", &[]));
    assert_eq!(replies(&s.take_output())[0].1, RepCode::ErrUnknown);
}

#[test]
fn set_meta_context_selects_for_the_same_export_only() {
    let mut s = started(3);
    send(&mut s, OptCode::StructuredReply, b"");
    send(
        &mut s,
        OptCode::SetMetaContext,
        &meta(
            "a",
            &[
                "base:allocation",
                "base:",
                "x-braid:",
                "x-braid:volume=uuid-of-a",
            ],
        ),
    );
    assert_eq!(
        context_names(&s.take_output()),
        [
            (1, "base:allocation".to_string()),
            (2, "x-braid:volume=uuid-of-a".to_string())
        ]
    );
    let go_b = GoData {
        export: "b".into(),
        requests: vec![],
    };
    let ServerEvent::Transmission(session) = send(&mut s, OptCode::Go, &go_b.encode()) else {
        panic!()
    };
    assert!(session.contexts.is_empty());
    assert!(!session.negotiated().block_status);

    let mut s = started(3);
    send(&mut s, OptCode::StructuredReply, b"");
    send(
        &mut s,
        OptCode::SetMetaContext,
        &meta("a", &["base:allocation"]),
    );
    let go_a = GoData {
        export: "a".into(),
        requests: vec![],
    };
    let ServerEvent::Transmission(session) = send(&mut s, OptCode::Go, &go_a.encode()) else {
        panic!()
    };
    assert_eq!(session.contexts.len(), 1);
    assert_eq!(session.contexts[0].kind, ContextKind::Allocation);
    assert!(session.negotiated().block_status);
}

#[test]
fn fence_waits_for_the_driver() {
    let mut s = started(3);
    send(&mut s, OptCode::StructuredReply, b"");
    s.take_output();
    let ev = send(
        &mut s,
        OptCode::ListMetaContext,
        &meta(
            "a",
            &[
                "x-braid:session=00000000000000000000000000000abc",
                "x-braid:conn",
                "x-braid:fence=7,3,7",
            ],
        ),
    );
    assert_eq!(
        ev,
        ServerEvent::Fence {
            ids: vec![braid_ns::ConnId(3), braid_ns::ConnId(7)],
            export: "a".into(),
            session: Some(braid_ns::SessionToken(0xabc)),
        }
    );
    // Nothing is answered until the fence is done, even if more arrives.
    assert!(s.take_output().is_empty());
    s.fence_done(Ok(()));
    let names: Vec<String> = context_names(&s.take_output())
        .into_iter()
        .map(|c| c.1)
        .collect();
    assert_eq!(
        names,
        [
            "x-braid:session=00000000000000000000000000000abc",
            "x-braid:conn=00000000000000000000000000000042",
            "x-braid:fence=00000000000000000000000000000003,00000000000000000000000000000007"
        ]
    );
    send(
        &mut s,
        OptCode::ListMetaContext,
        &meta("a", &["x-braid:fence=9"]),
    );
    s.fence_done(Err("connection 9 is unknown".into()));
    assert_eq!(replies(&s.take_output())[0].1, RepCode::ErrPolicy);
}

#[test]
fn oversized_options_are_discarded_or_refused() {
    let mut s = started(3);
    let mut bytes = Vec::new();
    encode_option(&mut bytes, OptCode::Go, &vec![0u8; 100_000]);
    // Arrives in pieces; the data is skipped without being kept.
    for piece in bytes.chunks(7_000) {
        let mut input = BytesMut::from(piece);
        assert_eq!(
            s.handle_input(&mut input, &TwoExports).unwrap(),
            ServerEvent::NeedInput
        );
        assert!(input.is_empty());
    }
    assert_eq!(replies(&s.take_output())[0].1, RepCode::ErrTooBig);
    // A 4 GiB option is not read at all.
    let mut header = Vec::new();
    header.extend_from_slice(b"IHAVEOPT");
    header.extend_from_slice(&7u32.to_be_bytes());
    header.extend_from_slice(&u32::MAX.to_be_bytes());
    let mut input = BytesMut::from(&header[..]);
    assert!(matches!(
        s.handle_input(&mut input, &TwoExports),
        Err(ProtoError::OptionTooLong { .. })
    ));
}

#[test]
fn byte_at_a_time_gives_the_same_answers() {
    let mut script = Vec::new();
    script.extend_from_slice(&3u32.to_be_bytes());
    encode_option(&mut script, OptCode::StructuredReply, b"");
    encode_option(&mut script, OptCode::List, b"");
    encode_option(
        &mut script,
        OptCode::SetMetaContext,
        &meta("a", &["base:allocation"]),
    );
    encode_option(
        &mut script,
        OptCode::Go,
        &GoData {
            export: "a".into(),
            requests: vec![],
        }
        .encode(),
    );
    let mut whole = server();
    let mut input = BytesMut::from(&script[..]);
    let ev_whole = whole.handle_input(&mut input, &TwoExports).unwrap();
    let mut split = server();
    let mut input = BytesMut::new();
    let mut ev_split = ServerEvent::NeedInput;
    for b in &script {
        input.extend_from_slice(&[*b]);
        ev_split = split.handle_input(&mut input, &TwoExports).unwrap();
    }
    assert_eq!(ev_whole, ev_split);
    assert_eq!(whole.take_output(), split.take_output());
}

mod client;
mod properties;
