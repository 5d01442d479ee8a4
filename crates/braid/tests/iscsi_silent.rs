//! braid's iSCSI target against initiators that stop: one that never
//! sends the data an R2T asked for, one that aborts such a WRITE (as
//! Linux does, sending no more of its data), one that holds a
//! reservation and goes silent. Task management answers without the
//! data, a Data-Out timeout drops the connection, and NOP-In pings find
//! a dead initiator and end its session, RESERVE(6) with it; a live
//! initiator answers the pings and is kept.

mod common;
mod iscsikit;

use std::time::Duration;

use braid_iscsi::pdu::Opcode;
use braid_iscsi_target::{IscsiConfig, Timers};
use common::{free_port, Serve};
use iscsikit::inproc::IscsiOnly;
use iscsikit::{who, Initiator, GOOD, RESERVATION_CONFLICT};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";
const TUR: [u8; 6] = [0; 6];

/// The target in this process over 1 MiB of memory, with `timers`.
fn start(timers: Timers) -> IscsiOnly {
    let cfg = IscsiConfig {
        timers,
        ..IscsiConfig::default()
    };
    IscsiOnly::over_memory(cfg, 1 << 20)
}

/// Timers whose Data-Out timeout cannot be what ends a test's wait.
fn patient() -> Timers {
    Timers {
        data_out: Duration::from_secs(60),
        ..Timers::default()
    }
}

/// `i` sends a WRITE(10) of 8 blocks and reads the R2T that asks for its
/// data, which never comes; its task tag.
fn write_owed_data(i: &mut Initiator) -> u32 {
    let itt = i.write10_without_data(0, 8);
    let r2t = i.next_pdu();
    assert_eq!(r2t.bhs.opcode(), Opcode::R2t, "{r2t:?}");
    itt
}

/// ABORT TASK of a WRITE whose R2T went unanswered answers FUNCTION
/// COMPLETE without the data, and the session goes on.
#[test]
fn an_abort_of_a_write_owed_data_answers_without_the_data() {
    let srv = start(patient());
    let mut i = Initiator::login(srv.addr, TARGET);
    let itt = write_owed_data(&mut i);
    i.stream()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(
        i.task_management(1, itt),
        0,
        "ABORT TASK: function complete"
    );
    assert!(i.exec(&TUR, &[], 0).good(), "the session goes on");
    assert!(!i.answered(itt), "the aborted WRITE is not answered");
}

/// PERSISTENT RESERVE OUT `action` of type `kind` with the two keys.
fn prout(i: &mut Initiator, action: u8, kind: u8, key: u64, sa_key: u64) -> u8 {
    let cdb = [0x5f, action, kind, 0, 0, 0, 0, 0, 24, 0];
    let mut params = key.to_be_bytes().to_vec();
    params.extend_from_slice(&sa_key.to_be_bytes());
    params.extend_from_slice(&[0; 8]);
    i.exec(&cdb, &params, 0).status
}

/// Another node's PREEMPT AND ABORT of a registration whose holder has a
/// WRITE owed data, and is silent, answers.
#[test]
fn preempt_and_abort_of_a_silent_holder_with_a_write_owed_data_answers() {
    let srv = start(patient());
    let mut a = Initiator::login_as(srv.addr, TARGET, &who("iqn.2026-11.org.example:a", 1));
    let mut b = Initiator::login_as(srv.addr, TARGET, &who("iqn.2026-11.org.example:b", 1));
    let (register, reserve, preempt_and_abort, write_exclusive) = (0, 1, 5, 1);
    assert_eq!(prout(&mut a, register, 0, 0, 0xa), GOOD);
    assert_eq!(prout(&mut b, register, 0, 0, 0xb), GOOD);
    assert_eq!(prout(&mut a, reserve, write_exclusive, 0xa, 0), GOOD);
    write_owed_data(&mut a);
    b.stream()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(
        prout(&mut b, preempt_and_abort, write_exclusive, 0xb, 0xa),
        GOOD
    );
    assert_eq!(b.registered_keys(), [0xb]);
}

/// A WRITE whose data never comes: the connection is dropped once the
/// Data-Out timeout passes.
#[test]
fn a_write_whose_data_never_comes_drops_the_connection_at_the_timeout() {
    let srv = start(Timers {
        data_out: Duration::from_millis(500),
        ..Timers::default()
    });
    let mut i = Initiator::login(srv.addr, TARGET);
    write_owed_data(&mut i);
    assert!(
        i.closed_within(Duration::from_secs(10)),
        "a connection whose WRITE never got its data was kept open"
    );
    let mut again = Initiator::login(srv.addr, TARGET);
    assert!(again.exec(&TUR, &[], 0).good());
}

/// `braid serve` pinging every second and taking a second's silence
/// after a ping for death: a session that took RESERVE(6) and then reads
/// and answers nothing is ended, and another session's TEST UNIT READY,
/// RESERVATION CONFLICT at first, is GOOD; a session that answers the
/// pings is kept.
#[test]
fn a_silent_session_is_ended_by_pings_and_its_reserve_with_it() {
    let port = free_port();
    let serve = Serve::start(&[
        &format!("--iscsi={port}"),
        "--iscsi-nopin-interval",
        "1",
        "--iscsi-nopin-timeout",
        "1",
        "vol=mem:1MiB",
    ]);
    let portal = format!("127.0.0.1:{port}").parse().unwrap();
    let mut a = Initiator::login_as(portal, TARGET, &who("iqn.2026-11.org.example:a", 1));
    let mut b = Initiator::login_as(portal, TARGET, &who("iqn.2026-11.org.example:b", 1));
    let mut live = Initiator::login_as(portal, TARGET, &who("iqn.2026-11.org.example:c", 1));
    assert!(a.exec(&[0x16, 0, 0, 0, 0, 0], &[], 0).good(), "RESERVE(6)");
    assert_eq!(b.exec(&TUR, &[], 0).status, RESERVATION_CONFLICT);
    // From here on a reads nothing and answers nothing.
    let mut freed = false;
    for _ in 0..50 {
        live.settle(Duration::from_millis(200), Duration::from_millis(200));
        if b.exec(&TUR, &[], 0).good() {
            freed = true;
            break;
        }
    }
    assert!(
        freed,
        "RESERVATION CONFLICT 10 s after the holder went silent:\n{}",
        serve.log()
    );
    assert!(
        serve.log().contains("no answer to a NOP-In ping"),
        "{}",
        serve.log()
    );
    live.settle(Duration::from_millis(2500), Duration::from_secs(3));
    assert!(
        live.exec(&TUR, &[], 0).good(),
        "a session that answers pings was cut:\n{}",
        serve.log()
    );
    drop(a);
}

/// A session that keeps talking but never reads: 48 READ(16)s of 1
/// MiB whose data it leaves in the socket (more than loopback buffers
/// take), then a NOP-Out every 100 ms.
/// Its READs hold the whole server-wide READ budget (4 MiB here), so
/// another session's READ waits on it. Talking is not a sign of life
/// while nothing sent to it is taken: it is pinged, never answers, and is
/// cut, and the other session's READ is answered.
#[test]
fn a_session_that_talks_but_never_reads_is_cut_and_frees_the_read_budget() {
    talker_is_cut(IscsiConfig {
        timers: Timers {
            nop_in_interval: Some(Duration::from_secs(1)),
            nop_in_timeout: Duration::from_secs(1),
            ..patient()
        },
        limits: braid_store::Limits {
            max_total_bytes: 4 << 20,
            send_timeout: None,
            ..braid_store::Limits::default()
        },
        ..IscsiConfig::default()
    });
}

/// The same talker with pings turned off: the send timeout alone (the
/// socket took nothing for a second) closes it.
#[test]
fn without_pings_the_send_timeout_cuts_a_session_that_never_reads() {
    talker_is_cut(IscsiConfig {
        timers: Timers {
            nop_in_interval: None,
            ..patient()
        },
        limits: braid_store::Limits {
            max_total_bytes: 4 << 20,
            send_timeout: Some(Duration::from_secs(1)),
            ..braid_store::Limits::default()
        },
        ..IscsiConfig::default()
    });
}

/// A session sends READs it never reads and keeps talking; another's
/// READ must be answered and the talker cut within 15 s.
fn talker_is_cut(cfg: IscsiConfig) {
    let srv = IscsiOnly::over_memory(cfg, 96 << 20);
    let addr = srv.addr;
    let talker = std::thread::spawn(move || {
        let mut i = Initiator::login_as(addr, TARGET, &who("iqn.2026-11.org.example:talker", 1));
        i.stream()
            .set_write_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        for k in 0..48u64 {
            let mut read16 = [0u8; 16];
            read16[0] = 0x88;
            read16[2..10].copy_from_slice(&(k * 2048).to_be_bytes());
            read16[10..14].copy_from_slice(&2048u32.to_be_bytes());
            i.send_command(&read16, &[], 1 << 20);
        }
        let end = std::time::Instant::now() + Duration::from_secs(15);
        while std::time::Instant::now() < end {
            if i.ping_unread(&bytes::Bytes::new()).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    });
    std::thread::sleep(Duration::from_millis(500));
    let mut reader = Initiator::login_as(addr, TARGET, &who("iqn.2026-11.org.example:reader", 1));
    reader
        .stream()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut read16 = [0u8; 16];
    read16[0] = 0x88;
    read16[10..14].copy_from_slice(&2048u32.to_be_bytes());
    let itt = reader.send_command(&read16, &[], 1 << 20);
    let r = reader.wait(itt);
    assert_eq!(r.status, GOOD, "{r:?}");
    assert_eq!(r.data, vec![0u8; 1 << 20], "the READ's data");
    assert!(
        talker.join().unwrap(),
        "the session that never reads was kept for 15 s"
    );
}
