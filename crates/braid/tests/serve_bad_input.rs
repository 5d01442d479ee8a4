//! Hostile and broken clients in the handshake, over raw sockets: garbage
//! client flags, wrong magic, truncated and oversized options, unknown and
//! malformed options, silent and dribbling clients (issue 2, item 5).
//! Bad requests in the transmission phase are in `serve_bad_requests.rs`.
//!
//! The rule every test checks: the bad connection gets the spec's error or
//! is closed, every other connection keeps being served byte for byte, and
//! the server neither exits nor panics.

mod common;

use std::time::Duration;

use braid_proto::option::{GoData, MetaQuery};
use braid_proto::wire::{client_flags, OptCode, RepCode, OPTS_MAGIC};
use common::random_bytes;
use common::raw::{assert_still_serving, cmd, serve, RawClient, SIZE};

fn option_bytes(code: OptCode, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    braid_proto::option::encode_option(&mut out, code, data);
    out
}

#[test]
fn garbage_client_flags_close_only_that_connection() {
    let mut serve = serve();
    for (i, flags) in [
        0xdead_beef_u32,
        0,                                   // oldstyle-like: no fixed newstyle
        client_flags::FIXED_NEWSTYLE | 0x80, // an unknown flag bit
    ]
    .into_iter()
    .enumerate()
    {
        let mut bad = RawClient::connect(serve.addr());
        bad.greeting();
        bad.send(&flags.to_be_bytes());
        assert!(bad.closed_by_server(), "client flags {flags:#x} accepted");
        assert_still_serving(&mut serve, i as u64);
    }
}

#[test]
fn wrong_option_magic_closes_only_that_connection() {
    let mut serve = serve();
    let mut bad = RawClient::start(serve.addr());
    let mut header = b"IHAVEOPX".to_vec();
    header.extend_from_slice(&7u32.to_be_bytes());
    header.extend_from_slice(&0u32.to_be_bytes());
    bad.send(&header);
    assert!(bad.closed_by_server(), "bad option magic accepted");
    assert_still_serving(&mut serve, 1);

    // A request header where an option belongs is wrong magic too.
    let mut bad = RawClient::start(serve.addr());
    bad.send(&[0x25, 0x60, 0x95, 0x13, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert!(
        bad.closed_by_server(),
        "request magic in the handshake accepted"
    );
    assert_still_serving(&mut serve, 2);
}

#[test]
fn truncated_handshakes_then_close_leave_the_server_serving() {
    let mut serve = serve();
    let go = option_bytes(
        OptCode::Go,
        &GoData {
            export: "vol".into(),
            requests: vec![],
        }
        .encode(),
    );
    let mut flags_then = client_flags::KNOWN.to_be_bytes().to_vec();
    flags_then.extend_from_slice(&go);
    let cuts: Vec<Vec<u8>> = vec![
        vec![],                            // connects, reads nothing, leaves
        vec![0, 0],                        // half the client flags
        flags_then[..4 + 10].to_vec(),     // half an option header
        flags_then[..4 + 16 + 3].to_vec(), // header, then part of its data
    ];
    for (i, bytes) in cuts.iter().enumerate() {
        let mut bad = RawClient::connect(serve.addr());
        if i > 0 {
            bad.greeting();
        }
        bad.send(bytes);
        bad.hang_up();
        assert_still_serving(&mut serve, i as u64);
    }
    // An option that claims 100 bytes, gives 10, and goes.
    let mut bad = RawClient::start(serve.addr());
    let mut header = OPTS_MAGIC.to_be_bytes().to_vec();
    header.extend_from_slice(&0x4242u32.to_be_bytes());
    header.extend_from_slice(&100u32.to_be_bytes());
    header.extend_from_slice(&[7; 10]);
    bad.send(&header);
    bad.hang_up();
    assert_still_serving(&mut serve, 9);
}

#[test]
fn option_with_a_4_gib_length_is_neither_read_nor_allocated() {
    let mut serve = serve();
    let rss_before = serve.rss_kib();
    let mut bad = RawClient::start(serve.addr());
    let mut header = OPTS_MAGIC.to_be_bytes().to_vec();
    header.extend_from_slice(&OptCode::Go.to_u32().to_be_bytes());
    header.extend_from_slice(&u32::MAX.to_be_bytes());
    bad.send(&header);
    // Keep pushing data as if the option were real; the server may hang up
    // at any point, which ends the sending.
    let junk = vec![0x55u8; 1 << 20];
    for _ in 0..16 {
        if bad.try_send(&junk).is_err() {
            break;
        }
    }
    assert_still_serving(&mut serve, 1);
    assert!(bad.closed_by_server(), "a 4 GiB option was being read");
    let grown = serve.rss_kib().saturating_sub(rss_before);
    assert!(grown < 16 << 10, "server RSS grew by {grown} KiB");
}

#[test]
fn oversized_option_gets_err_too_big_and_the_handshake_goes_on() {
    let mut serve = serve();
    let mut c = RawClient::start(serve.addr());
    // Larger than any sensible option (braid reads up to 64 KiB), small
    // enough that skipping it is cheaper than dropping the client.
    c.send(&option_bytes(
        OptCode::from_u32(0x4242),
        &vec![1u8; 1 << 20],
    ));
    let r = c.option_reply();
    assert!(r.code.is_error(), "oversized option answered {:?}", r.code);
    assert_still_serving(&mut serve, 1);
    c.negotiate("vol");
    let data = random_bytes(4097, 2);
    c.write(SIZE - 4097, &data).unwrap();
    assert_eq!(c.read(SIZE - 4097, 4097).unwrap(), data);
}

#[test]
fn unknown_options_get_err_unsup_and_the_handshake_goes_on() {
    let mut serve = serve();
    let mut c = RawClient::start(serve.addr());
    for (code, data) in [
        (0x4242u32, b"hello".to_vec()),
        (0, vec![]),
        (0x7fff_ffff, vec![0; 100]),
        (0xffff_ffff, vec![]),
    ] {
        c.send(&option_bytes(OptCode::from_u32(code), &data));
        let r = c.option_reply();
        assert_eq!(r.code, RepCode::ErrUnsup, "option {code:#x}");
    }
    assert_still_serving(&mut serve, 1);
    c.negotiate("vol");
    let data = random_bytes(65537, 3);
    c.write(12345, &data).unwrap();
    assert_eq!(c.read(12345, 65537).unwrap(), data);
    serve.assert_healthy();
}

#[test]
fn malformed_known_options_get_errors_and_the_handshake_goes_on() {
    let mut serve = serve();
    let mut c = RawClient::start(serve.addr());
    let mut lying_go = GoData {
        export: "vol".into(),
        requests: vec![],
    }
    .encode();
    lying_go[3] = 200; // name length past the end of the data
    let mut lying_meta = MetaQuery {
        export: "vol".into(),
        queries: vec!["base:".into()],
    }
    .encode();
    lying_meta[4 + 3] = 0x7f; // query count (after the name) far beyond what follows
    let cases: Vec<(OptCode, Vec<u8>, &str)> = vec![
        (OptCode::Go, lying_go.clone(), "GO with a lying name length"),
        (OptCode::Info, lying_go, "INFO with a lying name length"),
        (OptCode::Go, vec![0, 0], "GO cut short"),
        (OptCode::List, b"junk".to_vec(), "LIST with data"),
        (
            OptCode::StructuredReply,
            b"x".to_vec(),
            "STRUCTURED_REPLY with data",
        ),
        (
            OptCode::SetMetaContext,
            lying_meta,
            "SET_META_CONTEXT lying count",
        ),
        (
            OptCode::ListMetaContext,
            vec![0, 0, 0, 9],
            "LIST_META_CONTEXT cut short",
        ),
        (
            OptCode::Go,
            GoData {
                export: "nope".into(),
                requests: vec![],
            }
            .encode(),
            "GO for a missing export",
        ),
        (
            OptCode::StartTls,
            vec![],
            "STARTTLS on a server without TLS",
        ),
    ];
    for (code, data, what) in cases {
        c.send(&option_bytes(code, &data));
        let r = c.option_reply();
        assert!(r.code.is_error(), "{what}: answered {:?}", r.code);
    }
    assert_still_serving(&mut serve, 1);
    c.negotiate("vol");
    let data = random_bytes(1000, 4);
    c.write(0, &data).unwrap();
    assert_eq!(c.read(0, 1000).unwrap(), data);
}

#[test]
fn silent_clients_do_not_hold_up_anyone_else() {
    let mut serve = serve();
    // Connected and never a byte sent, some never even reading the greeting.
    let mut silent: Vec<RawClient> = (0..8).map(|_| RawClient::connect(serve.addr())).collect();
    for s in silent.iter_mut().take(4) {
        s.greeting();
    }
    // Silent in the transmission phase, and silent halfway through a
    // request header.
    let mut idle = RawClient::open(serve.addr(), "vol");
    let mut half = RawClient::open(serve.addr(), "vol");
    half.send(&[0x25, 0x60, 0x95, 0x13, 0, 0, 0, 1]);
    assert_still_serving(&mut serve, 1);
    // The idle connection still works when it wakes up.
    let data = random_bytes(777, 5);
    idle.write(SIZE - 777, &data).unwrap();
    assert_eq!(idle.read(SIZE - 777, 777).unwrap(), data);
    drop(silent);
    drop(half);
    assert_still_serving(&mut serve, 2);
}

#[test]
fn a_handshake_and_request_dribbled_a_byte_at_a_time_still_work() {
    let mut serve = serve();
    let mut c = RawClient::connect(serve.addr());
    c.greeting();
    let mut bytes = client_flags::KNOWN.to_be_bytes().to_vec();
    bytes.extend(option_bytes(OptCode::StructuredReply, &[]));
    bytes.extend(option_bytes(
        OptCode::Go,
        &GoData {
            export: "vol".into(),
            requests: vec![3],
        }
        .encode(),
    ));
    let dribble = |c: &mut RawClient, bytes: &[u8]| {
        for b in bytes {
            c.send(std::slice::from_ref(b));
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let (first, rest) = bytes.split_at(bytes.len() / 2);
    dribble(&mut c, first);
    // Other clients are served while this one is mid-handshake.
    assert_still_serving(&mut serve, 1);
    dribble(&mut c, rest);
    assert_eq!(c.option_reply().code, RepCode::Ack, "structured reply");
    c.structured = true;
    loop {
        match c.option_reply().code {
            RepCode::Ack => break,
            RepCode::Info => {}
            other => panic!("GO answered {other:?}"),
        }
    }
    // A WRITE dribbled header and payload alike, then read back normally.
    let data = random_bytes(300, 6);
    let (cookie, mut req) = c.encode_request(cmd::WRITE, 0, 4095, 300);
    req.extend_from_slice(&data);
    dribble(&mut c, &req);
    let r = c.reply().expect("reply to the dribbled write");
    assert_eq!((r.cookie, r.error), (cookie, None));
    let mut check = RawClient::open(serve.addr(), "vol");
    assert_eq!(check.read(4095, 300).unwrap(), data);
    serve.assert_healthy();
}

/// Clients that send READs and never read a reply: sixteen of them hold
/// the server-wide budget for payload (32 MiB here) with data their
/// sockets no longer take (past what loopback buffers hold), so another
/// client's READ waits on them. A connection whose socket has taken
/// nothing for `--send-timeout` is closed, what it held goes back, and
/// the other client's READ is answered, byte for byte.
#[test]
fn clients_that_never_read_replies_are_closed_and_free_what_they_held() {
    let serve = common::Serve::start(&[
        "--send-timeout",
        "1",
        "--max-inflight-per-connection",
        "32MiB",
        "--max-inflight-total",
        "32MiB",
        "vol=mem:64MiB",
    ]);
    let mut check = RawClient::open(serve.addr(), "vol");
    let data = random_bytes(1 << 20, 7);
    check.write(0, &data).unwrap();
    let stuck: Vec<RawClient> = (0..16)
        .map(|_| {
            let mut c = RawClient::open(serve.addr(), "vol");
            c.stream
                .set_write_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            for k in 0..24u64 {
                let (_, req) = c.encode_request(cmd::READ, 0, k << 20, 1 << 20);
                if c.try_send(&req).is_err() {
                    break;
                }
            }
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        check.read(0, 1 << 20).map_err(|e| format!("error {e}")),
        Ok(data),
        "a READ behind clients that never read:\n{}",
        serve.log()
    );
    // Those whose replies waited on the socket were closed; any whose
    // READs still waited for the budget hold nothing of it.
    assert!(
        serve
            .log()
            .contains("took nothing that was sent to it for 1s (--send-timeout)"),
        "no client was closed for taking nothing:\n{}",
        serve.log()
    );
    drop(stuck);
}
