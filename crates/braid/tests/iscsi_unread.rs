//! `braid serve --iscsi` against initiators that send and never read:
//! what a connection queues for its socket is bounded (the target stops
//! reading a connection whose answers are not taken), a command's place
//! in the window comes back only once its answer is sent, a NOP-Out's
//! data is echoed no longer than the initiator said it takes, and
//! immediate commands are counted against a bound of their own. Each
//! test speaks raw PDUs over loopback TCP to a real `braid serve`.

mod common;
mod iscsikit;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_iscsi::pdu::Opcode;
use braid_test_needs::needs;
use bytes::Bytes;
use common::{free_port, Serve};
use iscsikit::{who, Initiator};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";
const MIB: usize = 1 << 20;

/// `braid serve` with iSCSI on a port of its own; the portal's address.
fn serve() -> (Serve, SocketAddr) {
    let port = free_port();
    let serve = Serve::start(&[&format!("--iscsi={port}"), "vol=mem:64MiB"]);
    (serve, format!("127.0.0.1:{port}").parse().unwrap())
}

/// READ(16) of `blocks` 512-byte blocks at `lba`.
fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x88;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// A session floods 256 KiB NOP-Out pings and never reads (the issue's
/// 3 GiB in 14 s): the server's resident memory grows by less than
/// 64 MiB, the flood is held back by TCP (its writes block), and an NBD
/// client beside it writes and reads back 8 MiB, byte for byte.
#[needs("nbdsh")]
fn pings_never_read_hold_back_their_sender_not_the_servers_memory() {
    let (serve, portal) = serve();
    let before = serve.rss_kib();
    let pid = serve.pid();
    let flooding = Arc::new(AtomicBool::new(true));
    let sampler = {
        let flooding = flooding.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while flooding.load(Ordering::SeqCst) {
                most = most.max(common::rss_kib(pid));
                std::thread::sleep(Duration::from_millis(20));
            }
            most
        })
    };
    let flood = std::thread::spawn(move || {
        let mut i = Initiator::login(portal, TARGET);
        i.stream()
            .set_write_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let ping = Bytes::from(vec![0x5a; 256 << 10]);
        let end = Instant::now() + Duration::from_secs(3);
        let mut sent = 0usize;
        let mut held_back = false;
        while Instant::now() < end {
            if i.ping_unread(&ping).is_err() {
                held_back = true;
                break;
            }
            sent += 1;
        }
        (sent, held_back)
    });
    let script = format!(
        "import os\n\
         h.connect_uri('{}')\n\
         for k in range(8):\n    \
             d = os.urandom(1 << 20)\n    \
             h.pwrite(d, k << 20)\n    \
             assert h.pread(1 << 20, k << 20) == d, k\n\
         print('verified')\n",
        serve.uri("vol")
    );
    let nbd = common::nbdsh(&script);
    let (sent, held_back) = flood.join().unwrap();
    flooding.store(false, Ordering::SeqCst);
    let most = sampler.join().unwrap();
    assert_eq!(nbd.trim(), "verified", "{}", serve.log());
    let grew = most.saturating_sub(before) / 1024;
    eprintln!("{sent} pings of 256 KiB taken before TCP held them back; grew {grew} MiB");
    assert!(
        grew < 64,
        "braid serve grew by {grew} MiB ({before} KiB to {most} KiB) under \
         {sent} pings of 256 KiB never read"
    );
    assert!(
        held_back,
        "the target took all {sent} pings of 256 KiB (of a session that never reads)"
    );
}

/// A ping of 64 KiB from an initiator that takes 8 KiB a PDU is answered
/// with its first 8 KiB (RFC 7143 11.18.5: reflected data is limited to
/// the initiator's MaxRecvDataSegmentLength).
#[test]
fn ping_data_is_echoed_no_longer_than_the_initiator_takes() {
    let (serve, portal) = serve();
    let mut small = who("iqn.2026-11.org.example:small", 1);
    small.max_recv = 8192;
    let mut i = Initiator::login_as(portal, TARGET, &small);
    let data: Vec<u8> = (0..65536u32).map(|k| (k % 251) as u8).collect();
    i.ping_unread(&Bytes::from(data.clone())).unwrap();
    let echo = i.next_pdu();
    assert_eq!(echo.bhs.opcode(), Opcode::NopIn, "{}", serve.log());
    assert_eq!(
        echo.data.len(),
        8192,
        "ping data echoed to an initiator whose MaxRecvDataSegmentLength is 8192"
    );
    assert!(
        echo.data[..] == data[..8192],
        "the echo is not the ping's data"
    );
}

/// 40 READs of 1 MiB that the initiator does not read, then 100 TEST
/// UNIT READYs: the READs whose data is not yet sent still hold their
/// places in the window (64), so the TEST UNIT READYs past it are outside
/// the window and never answered, as RFC 7143 has it.
#[test]
fn a_commands_place_in_the_window_comes_back_once_its_answer_is_sent() {
    let (serve, portal) = serve();
    let mut i = Initiator::login(portal, TARGET);
    for k in 0..40u64 {
        i.send_command(&read16(k * 2048, 2048), &[], MIB as u32);
    }
    // Until the target has taken them and the socket is full.
    std::thread::sleep(Duration::from_millis(500));
    let turs: Vec<u32> = (0..100).map(|_| i.send_command(&[0; 6], &[], 0)).collect();
    std::thread::sleep(Duration::from_millis(500));
    i.settle(Duration::from_secs(1), Duration::from_secs(30));
    let answered = turs.iter().filter(|t| i.answered(**t)).count();
    assert!(
        answered < 64,
        "{answered} of 100 TEST UNIT READYs answered behind 40 unsent READs \
         in a window of 64:\n{}",
        serve.log()
    );
}

/// 100 immediate READs of 1 MiB that the initiator does not read: the
/// target runs a few and answers the rest with Reject, reason 0x06
/// (Immediate Command Reject, RFC 7143 11.17.1); each is answered one
/// way or the other.
#[test]
fn immediate_commands_past_their_bound_are_rejected() {
    let (serve, portal) = serve();
    let mut i = Initiator::login(portal, TARGET);
    i.immediate = true;
    let reads: Vec<u32> = (0..100u64)
        .map(|k| i.send_command(&read16(k * 2048, 2048), &[], MIB as u32))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    i.settle(Duration::from_secs(1), Duration::from_secs(30));
    let ran = reads.iter().filter(|t| i.answered(**t)).count();
    let rejected: Vec<u8> = i
        .other
        .iter()
        .filter(|p| p.bhs.opcode() == Opcode::Reject)
        .map(|p| p.bhs.0[2])
        .collect();
    assert!(
        !rejected.is_empty(),
        "all {ran} of 100 immediate READs ran, none rejected:\n{}",
        serve.log()
    );
    assert!(rejected.iter().all(|r| *r == 0x06), "reasons {rejected:?}");
    assert_eq!(ran + rejected.len(), 100, "each answered once");
}
