//! `rbd resize` of an image two gateways serve over iSCSI, on a real
//! throwaway cluster (`cephkit`): every session, on either gateway, is
//! told CAPACITY DATA HAS CHANGED (2A/09) once, at its next command, and
//! then reads the new size from READ CAPACITY. After a growth a write past
//! the old end reaches the image and reads back through both gateways;
//! after a shrink a write past the new end is refused as out of range.

#![cfg(feature = "rbd")]

mod cephkit;
mod common;
mod iscsikit;

use braid_test_needs::needs;

use std::time::{Duration, Instant};

use common::{free_port, Serve};
use iscsikit::{Initiator, Reply, CHECK_CONDITION, GOOD};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";

/// UNIT ATTENTION, CAPACITY DATA HAS CHANGED.
const CAPACITY_CHANGED: (u8, u8, u8) = (0x6, 0x2a, 0x09);
/// ILLEGAL REQUEST, LOGICAL BLOCK ADDRESS OUT OF RANGE.
const LBA_OUT_OF_RANGE: (u8, u8, u8) = (0x5, 0x21, 0x00);

/// Blocks of 512 bytes in `mib` MiB.
fn blocks(mib: u32) -> u32 {
    mib << 11
}

/// A gateway of `img` with iSCSI on a port of its own; returns it and its
/// iSCSI portal.
fn gateway(c: &cephkit::Cluster, img: &cephkit::Image) -> (Serve, std::net::SocketAddr) {
    let port = free_port();
    let g = c.gateway(
        img,
        &["--gateway-lease", "15", "--iscsi", &port.to_string()],
    );
    let portal = std::net::SocketAddr::new(g.addr().ip(), port);
    (g, portal)
}

/// `rbd resize` of `img` to `mib` MiB.
fn resize(c: &cephkit::Cluster, img: &cephkit::Image, mib: u32) {
    let size = format!("{mib}M");
    let name = img.rbd_name();
    let args = ["resize", "--no-progress", "--allow-shrink", "--size", &size];
    c.ok("rbd", &[&args[..], &[name.as_str()]].concat());
}

/// 32 KiB (64 blocks) that differ with `seed`.
fn pattern(seed: u8) -> Vec<u8> {
    (0..32 * 1024)
        .map(|i: usize| seed.wrapping_mul(53).wrapping_add((i % 241) as u8))
        .collect()
}

const TUR: [u8; 6] = [0; 6];

/// Sends TEST UNIT READY until the session is told something, for at
/// most 10 s (librbd's watcher tells the gateway in its own time); checks
/// it is CAPACITY DATA HAS CHANGED, and that it is told once.
fn told_capacity_changed(i: &mut Initiator, who: &str, gw: &Serve) {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(10);
    let told: Reply = loop {
        let r = i.exec(&TUR, &[], 0);
        if !r.good() || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        (told.status, told.sense),
        (CHECK_CONDITION, Some(CAPACITY_CHANGED)),
        "{who}: TEST UNIT READY within 10 s of rbd resize; gateway's log:\n{}",
        gw.log()
    );
    eprintln!(
        "{who}: told {:?} after rbd resize returned",
        start.elapsed()
    );
    let again = i.exec(&TUR, &[], 0);
    assert_eq!(
        (again.status, again.sense),
        (GOOD, None),
        "{who}: the attention is reported once"
    );
}

#[needs("ceph-mon")]
fn every_iscsi_session_on_every_gateway_is_told_of_a_resize() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("iscsi-resize", "8M", Some("layering"));
    let (a, a_iscsi) = gateway(c, &img);
    let (b, b_iscsi) = gateway(c, &img);
    // Logging in takes the power on attention with a first command.
    let mut via = [
        (Initiator::login(a_iscsi, TARGET), "A", &a),
        (Initiator::login(b_iscsi, TARGET), "B", &b),
    ];
    for (i, who, _) in &mut via {
        assert_eq!(i.capacity(), (u64::from(blocks(8)), 512), "{who} at first");
    }

    resize(c, &img, 16);
    for (n, (i, who, gw)) in via.iter_mut().enumerate() {
        told_capacity_changed(i, who, gw);
        assert_eq!(i.capacity(), (u64::from(blocks(16)), 512), "{who} grown");
        // Past the old end, each session its own range, the last one
        // ending at the new end.
        let lba = blocks(16) - 64 * (n as u32 + 1);
        i.write10(lba, &pattern(n as u8 + 1));
    }
    let image = img.export();
    for (n, want) in [pattern(1), pattern(2)].iter().enumerate() {
        let lba = blocks(16) - 64 * (n as u32 + 1);
        for (i, who, _) in &mut via {
            assert!(
                i.read10(lba, 64) == *want,
                "{who} reads back the write past the old end made through session {n}"
            );
        }
        let at = lba as usize * 512;
        assert!(
            image[at..at + want.len()] == want[..],
            "the cluster holds the write past the old end made through session {n}"
        );
    }

    resize(c, &img, 4);
    for (i, who, gw) in &mut via {
        told_capacity_changed(i, who, gw);
        assert_eq!(i.capacity(), (u64::from(blocks(4)), 512), "{who} shrunk");
        let end = blocks(4);
        for (lba, n) in [(end, 1), (end - 1, 2)] {
            let r = i.exec(
                &iscsikit::write10_cdb(lba, n),
                &vec![7; 512 * usize::from(n)],
                0,
            );
            assert_eq!(
                (r.status, r.sense),
                (CHECK_CONDITION, Some(LBA_OUT_OF_RANGE)),
                "{who}: WRITE(10) of {n} blocks at {lba}, past the new end of {end}"
            );
        }
        i.write10(end - 1, &[9; 512]);
        assert_eq!(i.read10(end - 1, 1), [9; 512], "{who}: the last block");
    }
}
