//! SCSI reservations of a Ceph RBD image served over iSCSI by two
//! gateways (`cephkit`'s throwaway cluster): the image's reservations are
//! one state, kept in RADOS, whichever gateway a command goes through. A
//! registration made through one gateway is listed through the other; a
//! reservation taken through one refuses another initiator's write
//! through the other; and both outlive a restart of every gateway (each
//! starts with an empty state directory: nothing is kept on the host).
//!
//! A PREEMPT AND ABORT through one gateway answers GOOD only once the
//! preempted initiator's tasks on the other gateway have ended (a write
//! held inside it lands before GOOD, never after a newer one), or once
//! that gateway, stalled, was blocklisted (its queued write then never
//! lands). RESERVE (6) and RELEASE (6) are the image's too, and a RESERVE
//! ends with its session whichever gateway the next command goes through.

#![cfg(feature = "rbd")]

mod cephkit;
mod common;
mod iscsikit;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use braid_test_needs::needs;
use common::{signal, Serve};
use iscsikit::{who, Initiator, GOOD, RESERVATION_CONFLICT};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";
const NODE_A: &str = "iqn.2026-11.org.example:node-a";
const NODE_B: &str = "iqn.2026-11.org.example:node-b";

const REGISTER: u8 = 0;
const RESERVE: u8 = 1;
const PREEMPT_AND_ABORT: u8 = 5;
const WRITE_EXCLUSIVE: u8 = 1;

/// PERSISTENT RESERVE OUT `action` of type `kind` with the two keys
/// (APTPL off: the image's state outlives a gateway whatever it says).
fn prout(i: &mut Initiator, action: u8, kind: u8, key: u64, sa_key: u64) -> u8 {
    let itt = send_prout(i, action, kind, key, sa_key);
    i.wait(itt).status
}

/// Sends what [`prout`] runs; returns its task tag.
fn send_prout(i: &mut Initiator, action: u8, kind: u8, key: u64, sa_key: u64) -> u32 {
    let mut params = key.to_be_bytes().to_vec();
    params.extend_from_slice(&sa_key.to_be_bytes());
    params.extend_from_slice(&[0; 8]);
    let cdb = [0x5f, action, kind, 0, 0, 0, 0, 0, 24, 0];
    i.send_command(&cdb, &params, 0)
}

/// Node a registered through gateway 1 and holding Write Exclusive, node
/// b registered through gateway 2, block 8 written by a (0x01).
fn a_holds_b_waits(at1: SocketAddr, at2: SocketAddr) -> (Initiator, Initiator) {
    let mut a = Initiator::login_as(at1, TARGET, &who(NODE_A, 1));
    let mut b = Initiator::login_as(at2, TARGET, &who(NODE_B, 1));
    assert_eq!(prout(&mut a, REGISTER, 0, 0, 0xa), GOOD);
    assert_eq!(prout(&mut b, REGISTER, 0, 0, 0xb), GOOD);
    assert_eq!(prout(&mut a, RESERVE, WRITE_EXCLUSIVE, 0xa, 0), GOOD);
    a.write10(8, &[0x01; 512]);
    (a, b)
}

/// Waits (at most 20 s) until `g`'s log holds `line`.
fn logged(g: &Serve, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !g.log().contains(line) {
        assert!(
            Instant::now() < deadline,
            "never logged {line:?}:\n{}",
            g.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// READ RESERVATION: the holder's key and the type, if one is held.
fn holder(i: &mut Initiator) -> Option<(u64, u8)> {
    let r = i.exec(&[0x5e, 1, 0, 0, 0, 0, 0, 0, 64, 0], &[], 64);
    assert_eq!(r.status, GOOD, "READ RESERVATION: {r:?}");
    let len = u32::from_be_bytes(r.data[4..8].try_into().unwrap());
    (len >= 16).then(|| {
        let key = u64::from_be_bytes(r.data[8..16].try_into().unwrap());
        (key, r.data[21] & 0x0f)
    })
}

/// A gateway of `img` with iSCSI on `port`.
fn gateway(c: &cephkit::Cluster, img: &cephkit::Image, port: u16) -> (Serve, SocketAddr) {
    let g = c.gateway(img, &["--iscsi", &port.to_string()]);
    (g, SocketAddr::from(([127, 0, 0, 1], port)))
}

#[needs("ceph-mon")]
fn two_gateways_share_one_images_reservations_and_a_restart_keeps_them() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("prshare", "16M", Some("layering"));
    let (p1, p2) = (common::free_port(), common::free_port());
    let (g1, at1) = gateway(c, &img, p1);
    let (g2, at2) = gateway(c, &img, p2);

    let mut a = Initiator::login_as(at1, TARGET, &who(NODE_A, 1));
    let mut b = Initiator::login_as(at2, TARGET, &who(NODE_B, 1));
    assert_eq!(prout(&mut a, REGISTER, 0, 0, 0xa), GOOD);
    assert_eq!(
        b.registered_keys(),
        [0xa],
        "a registration made through gateway 1 is listed through gateway 2"
    );
    assert_eq!(prout(&mut b, REGISTER, 0, 0, 0xb), GOOD);
    assert_eq!(
        prout(&mut a, RESERVE, WRITE_EXCLUSIVE, 0xa, 0),
        GOOD,
        "a reserves through gateway 1"
    );
    let w = b.exec(&iscsikit::write10_cdb(8, 1), &[0xb; 512], 0);
    assert_eq!(
        w.status, RESERVATION_CONFLICT,
        "b, a registrant that does not hold the Write Exclusive reservation, writes through \
         gateway 2: {w:?}"
    );
    a.write10(8, &[0xa; 512]);
    assert_eq!(holder(&mut b), Some((0xa, WRITE_EXCLUSIVE)));

    // Every gateway stopped, then started again with an empty state
    // directory: the reservations are the image's, in RADOS.
    drop((a, b));
    drop((g1, g2));
    let (_g1, at1) = gateway(c, &img, p1);
    let (_g2, at2) = gateway(c, &img, p2);
    let mut a = Initiator::login_as(at2, TARGET, &who(NODE_A, 1));
    let mut b = Initiator::login_as(at1, TARGET, &who(NODE_B, 1));
    assert_eq!(a.registered_keys(), [0xa, 0xb], "after both restarted");
    assert_eq!(holder(&mut a), Some((0xa, WRITE_EXCLUSIVE)));
    let w = b.exec(&iscsikit::write10_cdb(8, 1), &[0xb; 512], 0);
    assert_eq!(
        w.status, RESERVATION_CONFLICT,
        "after both restarted: {w:?}"
    );
    assert_eq!(a.read10(8, 1), [0xa; 512], "b's writes never landed");
}

#[needs("ceph-mon")]
fn preempt_and_abort_through_one_gateway_ends_the_write_held_in_the_other_before_good() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("prabort", "16M", Some("layering"));
    let dir = tempfile::tempdir().unwrap();
    let hold = dir.path().join("hold");
    let hold_var = hold.display().to_string();
    let (p1, p2) = (common::free_port(), common::free_port());
    let env = [("BRAID_TEST_HOLD_RBD_WRITES", hold_var.as_str())];
    let g1 = c.gateway_env(&img, &["--iscsi", &p1.to_string()], &env);
    let (_g2, at2) = gateway(c, &img, p2);
    let (mut a, mut b) = a_holds_b_waits(SocketAddr::from(([127, 0, 0, 1], p1)), at2);

    // a's write is held inside gateway 1, past the reservation check and
    // before librbd; b preempts a through gateway 2.
    std::fs::write(&hold, b"").unwrap();
    let held = a.send_command(&iscsikit::write10_cdb(8, 1), &[0xaa; 512], 0);
    logged(&g1, "holding a write");
    let preempt = send_prout(&mut b, PREEMPT_AND_ABORT, WRITE_EXCLUSIVE, 0xb, 0xa);
    assert!(
        b.silent_for(Duration::from_secs(1)),
        "PREEMPT AND ABORT answered while a's write is held in gateway 1"
    );
    std::fs::remove_file(&hold).unwrap();
    assert_eq!(b.wait(preempt).status, GOOD);
    // After GOOD, b's write is the newest: a's held write must not land
    // over it.
    b.write10(8, &[0xbb; 512]);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        b.read10(8, 1),
        [0xbb; 512],
        "a's held write landed after GOOD"
    );
    assert_eq!(&img.export()[8 * 512..9 * 512], [0xbb; 512], "rbd export");
    let _ = held;
    let r = a.exec(&[0; 6], &[], 0);
    assert_eq!(r.sense, Some((0x6, 0x2a, 0x05)), "REGISTRATIONS PREEMPTED");
    let r = a.exec(&iscsikit::write10_cdb(9, 1), &[0xcc; 512], 0);
    assert_eq!(
        r.status, RESERVATION_CONFLICT,
        "a, preempted through gateway 2, writes through gateway 1: {r:?}"
    );
}

#[needs("ceph-mon")]
fn preempt_and_abort_blocklists_a_stalled_gateway_before_good() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("prstall", "16M", Some("layering"));
    let (p1, p2) = (common::free_port(), common::free_port());
    let (g1, at1) = gateway(c, &img, p1);
    let (g2, at2) = gateway(c, &img, p2);
    let (mut a, mut b) = a_holds_b_waits(at1, at2);

    // Gateway 1 stalls with a's write sent to it; b preempts a through
    // gateway 2, which cannot hear from gateway 1 and blocklists it.
    common::stop(g1.pid());
    a.send_command(&iscsikit::write10_cdb(8, 1), &[0xaa; 512], 0);
    assert_eq!(
        prout(&mut b, PREEMPT_AND_ABORT, WRITE_EXCLUSIVE, 0xb, 0xa),
        GOOD
    );
    assert!(
        g2.log()
            .contains("a gateway did not act on a reservation change in time: blocklisting it"),
        "GOOD before gateway 1 was fenced:\n{}",
        g2.log()
    );
    b.write10(8, &[0xbb; 512]);
    signal(g1.pid(), libc::SIGCONT);
    // Gateway 1 reads a's write and its own blocklisting: the write is
    // refused, and gateway 1 drops its old connections.
    logged(&g1, "old connections drained");
    assert_eq!(
        b.read10(8, 1),
        [0xbb; 512],
        "the stalled gateway's write landed"
    );
    assert_eq!(&img.export()[8 * 512..9 * 512], [0xbb; 512], "rbd export");
}

#[needs("ceph-mon")]
fn reserve_and_release_six_through_one_gateway_hold_on_the_other() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("prsix", "16M", Some("layering"));
    let (p1, p2) = (common::free_port(), common::free_port());
    let (_g1, at1) = gateway(c, &img, p1);
    let (_g2, at2) = gateway(c, &img, p2);
    let (reserve, release) = ([0x16, 0, 0, 0, 0, 0], [0x17, 0, 0, 0, 0, 0]);
    let mut a = Initiator::login_as(at1, TARGET, &who(NODE_A, 1));
    let mut b = Initiator::login_as(at2, TARGET, &who(NODE_B, 1));
    assert_eq!(
        a.exec(&reserve, &[], 0).status,
        GOOD,
        "a reserves through gateway 1"
    );
    let w = b.exec(&iscsikit::write10_cdb(4, 1), &[0xb; 512], 0);
    assert_eq!(
        w.status, RESERVATION_CONFLICT,
        "b writes through gateway 2: {w:?}"
    );
    let r = b.exec(&reserve, &[], 0);
    assert_eq!(
        r.status, RESERVATION_CONFLICT,
        "b reserves through gateway 2: {r:?}"
    );
    assert_eq!(a.exec(&release, &[], 0).status, GOOD);
    b.write10(4, &[0xb; 512]);

    // b's RESERVE ends with b's session: a may then reserve, through
    // the other gateway.
    assert_eq!(b.exec(&reserve, &[], 0).status, GOOD);
    let r = a.exec(&reserve, &[], 0);
    assert_eq!(r.status, RESERVATION_CONFLICT, "b holds it: {r:?}");
    assert_eq!(b.logout(), 0);
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = a.exec(&reserve, &[], 0);
        if r.status == GOOD {
            break;
        }
        assert!(
            r.status == RESERVATION_CONFLICT && Instant::now() < deadline,
            "a's RESERVE after b's session ended: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(a.read10(4, 1), [0xb; 512]);
}
