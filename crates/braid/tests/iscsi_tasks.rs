//! Tasks of an iSCSI session, against the target run in-process so that
//! a test can hold an initiator's commands before the backend (as a
//! stuck disk or path would): commands of one connection are taken while
//! earlier ones wait, task management really ends the waiting ones (they
//! never land), other sessions are told, a login that reinstates a
//! session fences the old one's writes, and a write within
//! FirstBurstLength needs no R2T.

mod common;
mod iscsikit;

use std::time::Duration;

use iscsikit::inproc::InProcess;
use iscsikit::{who, Initiator, CHECK_CONDITION, GOOD};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";

fn write(i: &mut Initiator, lba: u32, fill: u8) -> u32 {
    i.send_command(&iscsikit::write10_cdb(lba, 1), &[fill; 512], 0)
}

const TUR: [u8; 6] = [0; 6];

#[test]
fn abort_task_ends_a_waiting_write_and_only_that_one() {
    let srv = InProcess::start(&["127.0.0.1"]);
    let a = who("iqn.2026-11.org.example:a", 1);
    let mut i = Initiator::login_as(srv.portals[0], TARGET, &a);
    srv.handle.hold(a.initiator, true);
    let tags: Vec<u32> = (0..3).map(|n| write(&mut i, n, n as u8 + 1)).collect();
    // Taken while the three wait: the connection does not wait for them.
    assert_eq!(i.task_management(1, tags[1]), 0, "function complete");
    srv.handle.hold(a.initiator, false);
    assert!(i.wait(tags[0]).good());
    assert!(i.wait(tags[2]).good());
    assert!(i.exec(&TUR, &[], 0).good());
    assert!(!i.answered(tags[1]), "an aborted task is never answered");
    let mut want = vec![1u8; 512];
    want.extend([0u8; 512]);
    want.extend([3u8; 512]);
    assert_eq!(srv.read(0, 1536), want, "the aborted write never landed");
    assert_eq!(
        i.task_management(1, tags[0]),
        1,
        "a task that completed does not exist"
    );
}

#[test]
fn a_reset_from_another_session_ends_held_writes_and_tells_the_first() {
    let srv = InProcess::start(&["127.0.0.1"]);
    let a = who("iqn.2026-11.org.example:a", 1);
    let b = who("iqn.2026-11.org.example:b", 1);
    let mut ia = Initiator::login_as(srv.portals[0], TARGET, &a);
    let mut ib = Initiator::login_as(srv.portals[0], TARGET, &b);
    srv.handle.hold(a.initiator, true);
    let held = write(&mut ia, 10, 7);
    // Once a's ping is answered, its write (sent before) is in the task
    // set: the reset from the other connection cannot overtake it.
    ia.ping();
    assert_eq!(ib.task_management(5, 0xffff_ffff), 0, "LOGICAL UNIT RESET");
    srv.handle.hold(a.initiator, false);
    let r = ia.exec(&TUR, &[], 0);
    assert_eq!(
        (r.status, r.sense),
        (CHECK_CONDITION, Some((0x6, 0x29, 0x03))),
        "the other session is told of the reset"
    );
    assert!(!ia.answered(held));
    let r = ib.exec(&TUR, &[], 0);
    assert_eq!(
        r.sense,
        Some((0x6, 0x29, 0x03)),
        "and so is the one that reset (SAM-5 6.3.3)"
    );
    assert_eq!(ib.exec(&TUR, &[], 0).status, GOOD, "once");
    assert_eq!(
        srv.read(10 * 512, 512),
        [0; 512],
        "the held write never landed"
    );
    // ABORT TASK SET from a only touches a's own tasks.
    srv.handle.hold(a.initiator, true);
    let mine = write(&mut ia, 11, 8);
    srv.handle.hold(b.initiator, true);
    let theirs = write(&mut ib, 12, 9);
    assert_eq!(ia.task_management(2, 0xffff_ffff), 0, "ABORT TASK SET");
    srv.handle.hold(a.initiator, false);
    srv.handle.hold(b.initiator, false);
    assert!(ib.wait(theirs).good());
    assert!(ia.exec(&TUR, &[], 0).good());
    assert!(!ia.answered(mine));
    assert_eq!(srv.read(11 * 512, 1024), [[0u8; 512], [9u8; 512]].concat());
}

#[test]
fn a_login_that_reinstates_a_session_fences_its_held_writes() {
    let srv = InProcess::start(&["127.0.0.1"]);
    let x = who("iqn.2026-11.org.example:x", 1);
    let mut old = Initiator::login_as(srv.portals[0], TARGET, &x);
    let other_isid = who(x.initiator, 2);
    let mut other = Initiator::login_as(srv.portals[0], TARGET, &other_isid);
    srv.handle.hold(x.initiator, true);
    write(&mut old, 20, 9);
    old.ping();
    // The same initiator and ISID again: the old session is closed, and
    // the login completes only once its held write has been dropped. (Its
    // port is not new to the target: nothing to clear after login, and a
    // command would wait in the hold.)
    let mut new = Initiator::login_raw_as(srv.portals[0], TARGET, &x);
    assert!(
        old.closed_within(Duration::from_secs(10)),
        "the old session is closed"
    );
    srv.handle.hold(x.initiator, false);
    assert_eq!(
        new.read10(20, 1),
        [0; 512],
        "the old session's write never lands"
    );
    assert_eq!(srv.read(20 * 512, 512), [0; 512]);
    assert!(
        other.exec(&TUR, &[], 0).good(),
        "a session with another ISID is another session"
    );
}

#[test]
fn a_write_within_first_burst_needs_no_r2t() {
    let srv = InProcess::start(&["127.0.0.1"]);
    let mut u = who("iqn.2026-11.org.example:u", 1);
    u.unsolicited = true;
    let mut i = Initiator::login_as(srv.portals[0], TARGET, &u);
    // 8 KiB immediate, 56 KiB unsolicited Data-Out: one round trip.
    let data = common::random_bytes(64 << 10, 5);
    let itt = i.send_command_with(&iscsikit::write10_cdb(64, 128), &data, 0, 8 << 10);
    assert!(i.wait(itt).good());
    assert_eq!(i.r2ts, 0, "no R2T within FirstBurstLength");
    // A larger one: the first burst unsolicited, the rest asked for.
    let big = common::random_bytes(1 << 20, 6);
    i.write10(1024, &big);
    assert!(i.r2ts > 0);
    assert_eq!(i.read10(64, 128), data);
    assert_eq!(i.read10(1024, 2048), big);
    assert_eq!(srv.read(64 * 512, 64 << 10), data);
}

#[test]
fn many_commands_in_flight_on_one_connection_all_complete_byte_for_byte() {
    let srv = InProcess::start(&["127.0.0.1"]);
    let mut i = Initiator::login(srv.portals[0], TARGET);
    let blocks: Vec<Vec<u8>> = (0..48).map(|n| common::random_bytes(4096, n)).collect();
    let writes: Vec<u32> = blocks
        .iter()
        .enumerate()
        .map(|(n, b)| i.send_command(&iscsikit::write10_cdb(n as u32 * 8, 8), b, 0))
        .collect();
    for t in writes {
        assert!(i.wait(t).good());
    }
    let reads: Vec<u32> = (0..48)
        .map(|n| i.send_command(&iscsikit::read10_cdb(n * 8, 8), &[], 4096))
        .collect();
    for (n, t) in reads.into_iter().enumerate() {
        let r = i.wait(t);
        assert!(r.good());
        assert_eq!(r.data, blocks[n], "block {n}");
    }
}
