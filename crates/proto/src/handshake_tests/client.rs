//! A client and a server against each other in memory, and the client
//! against scripted servers.

use bytes::BytesMut;

use super::*;

/// Runs a client and a server against each other in memory.
fn converse(cfg: ClientConfig) -> (Result<ClientOutcome, ProtoError>, Option<ServerEvent>) {
    let mut client = ClientHandshake::new(cfg);
    let mut s = server();
    let mut to_client = BytesMut::new();
    let mut to_server = BytesMut::new();
    let mut last_server = None;
    for _ in 0..100 {
        to_client.extend_from_slice(&s.take_output());
        match client.handle_input(&mut to_client) {
            Ok(ClientEvent::Done(outcome)) => return (Ok(*outcome), last_server),
            Ok(ClientEvent::NeedInput) => {}
            Ok(ClientEvent::StartTls) => panic!("no TLS here"),
            Err(e) => return (Err(e), last_server),
        }
        to_server.extend_from_slice(&client.take_output());
        match s.handle_input(&mut to_server, &TwoExports).unwrap() {
            ServerEvent::Fence { .. } => s.fence_done(Ok(())),
            ev => last_server = Some(ev),
        }
    }
    panic!("conversation did not end");
}

#[test]
fn client_and_server_agree() {
    let mut cfg = ClientConfig::go("b");
    cfg.list_exports = true;
    cfg.list_queries = vec!["x-braid:".into()];
    cfg.set_contexts = vec!["base:allocation".into()];
    let (outcome, server_ev) = converse(cfg);
    let outcome = outcome.unwrap();
    assert!(outcome.transmission && outcome.structured);
    let export = outcome.export.unwrap();
    assert_eq!(export.size, 1 << 20);
    assert_eq!(export.name.as_deref(), Some("b"));
    assert_eq!(export.description.as_deref(), Some("the b volume"));
    assert_eq!(export.max_payload, 1 << 25);
    assert_eq!(outcome.exports.len(), 2);
    assert!(outcome
        .listed
        .contains(&"x-braid:volume=uuid-of-b".to_string()));
    assert_eq!(outcome.contexts[0].name, "base:allocation");
    let Some(ServerEvent::Transmission(session)) = server_ev else {
        panic!("server not in transmission")
    };
    assert_eq!(session.contexts[0].id, outcome.contexts[0].id);
}

#[test]
fn client_reports_refusals_with_the_servers_message() {
    let (outcome, _) = converse(ClientConfig::go("missing"));
    match outcome {
        Err(ProtoError::Refused { reply, message, .. }) => {
            assert_eq!(reply, "ERR_UNKNOWN");
            assert!(message.contains("try a or b"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn client_fence_then_abort() {
    let mut cfg = ClientConfig::go("a");
    let fence =
        braid_ns::BraidContext::Fence(vec![braid_ns::ConnId(1), braid_ns::ConnId(2)]).name();
    cfg.list_queries = vec![fence.clone()];
    cfg.finish = Finish::Abort;
    let (outcome, server_ev) = converse(cfg);
    let outcome = outcome.unwrap();
    assert_eq!(outcome.listed, [fence]);
    assert!(!outcome.transmission);
    assert_eq!(server_ev, Some(ServerEvent::Closed));
}

#[test]
fn client_info_only() {
    let mut cfg = ClientConfig::go("a");
    cfg.finish = Finish::Info;
    let (outcome, _) = converse(cfg);
    let outcome = outcome.unwrap();
    assert!(!outcome.transmission);
    assert_eq!(outcome.export.unwrap().size, 1 << 20);
}

/// A scripted old server: no NBD_OPT_GO, no structured replies.
#[test]
fn client_falls_back_to_export_name() {
    let mut client = ClientHandshake::new(ClientConfig::go("x"));
    let mut input = BytesMut::new();
    input.extend_from_slice(b"NBDMAGICIHAVEOPT\0\x01"); // no NO_ZEROES
    assert_eq!(
        client.handle_input(&mut input).unwrap(),
        ClientEvent::NeedInput
    );
    let out = client.take_output();
    assert_eq!(&out[..4], &[0, 0, 0, 1]);
    let mut r = Vec::new();
    encode_reply(&mut r, OptCode::StructuredReply, RepCode::ErrUnsup, b"");
    encode_reply(&mut r, OptCode::Go, RepCode::ErrUnsup, b"");
    r.extend_from_slice(&4096u64.to_be_bytes());
    r.extend_from_slice(&1u16.to_be_bytes());
    r.extend_from_slice(&[0u8; 124]);
    let mut input = BytesMut::from(&r[..]);
    let ClientEvent::Done(outcome) = client.handle_input(&mut input).unwrap() else {
        panic!()
    };
    assert!(outcome.transmission && !outcome.structured);
    assert_eq!(outcome.export.unwrap().size, 4096);
    let sent = client.take_output();
    assert!(sent.windows(8).any(|w| w == b"IHAVEOPT"));
    assert_eq!(&sent[sent.len() - 1..], b"x");
}

#[test]
fn client_rejects_bad_servers() {
    let mut c = ClientHandshake::new(ClientConfig::go("x"));
    let mut input = BytesMut::from(&b"NBDMAGIC\0\0\0\0\0\0\x10\0\0\x01"[..]);
    assert_eq!(
        c.handle_input(&mut input),
        Err(ProtoError::NotFixedNewstyle)
    );

    let mut c = ClientHandshake::new(ClientConfig::go("x"));
    let mut input = BytesMut::from(&b"NBDMAGICIHAVEOPT\0\x03"[..]);
    c.handle_input(&mut input).unwrap();
    let mut r = Vec::new();
    r.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    r.extend_from_slice(&8u32.to_be_bytes());
    r.extend_from_slice(&1u32.to_be_bytes());
    r.extend_from_slice(&u32::MAX.to_be_bytes());
    let mut input = BytesMut::from(&r[..]);
    assert!(matches!(
        c.handle_input(&mut input),
        Err(ProtoError::ReplyTooLong { .. })
    ));

    // ACK to GO with no NBD_INFO_EXPORT.
    let mut c = ClientHandshake::new(ClientConfig::go("x"));
    let mut input = BytesMut::from(&b"NBDMAGICIHAVEOPT\0\x03"[..]);
    c.handle_input(&mut input).unwrap();
    let mut r = Vec::new();
    encode_reply(&mut r, OptCode::StructuredReply, RepCode::Ack, b"");
    encode_reply(
        &mut r,
        OptCode::Go,
        RepCode::Info,
        &Info::Name("x".into()).encode(),
    );
    encode_reply(&mut r, OptCode::Go, RepCode::Ack, b"");
    let mut input = BytesMut::from(&r[..]);
    assert_eq!(
        c.handle_input(&mut input),
        Err(ProtoError::MissingExportInfo)
    );
}
