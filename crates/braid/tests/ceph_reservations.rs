//! SCSI reservations of a Ceph RBD image served over iSCSI by two
//! gateways (`cephkit`'s throwaway cluster): the image's reservations are
//! one state, kept in RADOS, whichever gateway a command goes through. A
//! registration made through one gateway is listed through the other; a
//! reservation taken through one refuses another initiator's write
//! through the other; and both outlive a restart of every gateway (each
//! starts with an empty state directory: nothing is kept on the host).

#![cfg(feature = "rbd")]

mod cephkit;
mod common;
mod iscsikit;

use std::net::SocketAddr;

use braid_test_needs::needs;
use common::Serve;
use iscsikit::{who, Initiator, GOOD, RESERVATION_CONFLICT};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";
const NODE_A: &str = "iqn.2026-11.org.example:node-a";
const NODE_B: &str = "iqn.2026-11.org.example:node-b";

const REGISTER: u8 = 0;
const RESERVE: u8 = 1;
const WRITE_EXCLUSIVE: u8 = 1;

/// PERSISTENT RESERVE OUT `action` of type `kind` with the two keys
/// (APTPL off: the image's state outlives a gateway whatever it says).
fn prout(i: &mut Initiator, action: u8, kind: u8, key: u64, sa_key: u64) -> u8 {
    let mut params = key.to_be_bytes().to_vec();
    params.extend_from_slice(&sa_key.to_be_bytes());
    params.extend_from_slice(&[0; 8]);
    let cdb = [0x5f, action, kind, 0, 0, 0, 0, 0, 24, 0];
    i.exec(&cdb, &params, 0).status
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
