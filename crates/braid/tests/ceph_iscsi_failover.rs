//! iSCSI through two gateways of one Ceph RBD image (`cephkit`'s
//! throwaway cluster) as initiators with a session on each expect it: a
//! LOGICAL UNIT RESET through one gateway resets the image's unit, so
//! every I_T nexus, on whichever gateway, is told so on its next command
//! (BUS DEVICE RESET FUNCTION OCCURRED), as SAM-5 asks of a reset.

#![cfg(feature = "rbd")]

mod cephkit;
mod common;
mod failkit;
mod iscsikit;
mod labkit;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use braid_test_needs::needs;
use common::{signal, Serve};
use iscsikit::{who, Initiator, CHECK_CONDITION, GOOD};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";
const NODE_A: &str = "iqn.2026-11.org.example:node-a";
const NODE_B: &str = "iqn.2026-11.org.example:node-b";

/// RFC 7143 11.5.1's LOGICAL UNIT RESET.
const LUN_RESET: u8 = 5;
/// UNIT ATTENTION, BUS DEVICE RESET FUNCTION OCCURRED.
const DEVICE_RESET: (u8, u8, u8) = (0x6, 0x29, 0x03);
const TEST_UNIT_READY: [u8; 6] = [0; 6];

/// A gateway of `img` with iSCSI on `port`.
fn gateway(c: &cephkit::Cluster, img: &cephkit::Image, port: u16) -> (Serve, SocketAddr) {
    let g = c.gateway(img, &["--iscsi", &port.to_string()]);
    (g, SocketAddr::from(([127, 0, 0, 1], port)))
}

#[needs("ceph-mon")]
fn a_logical_unit_reset_through_one_gateway_is_told_to_the_sessions_on_the_other() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("lureset", "16M", Some("layering"));
    let (_g1, at1) = gateway(c, &img, common::free_port());
    let (_g2, at2) = gateway(c, &img, common::free_port());

    let mut a = Initiator::login_as(at1, TARGET, &who(NODE_A, 1));
    let mut b = Initiator::login_as(at2, TARGET, &who(NODE_B, 1));
    let mut b1 = Initiator::login_as(at1, TARGET, &who(NODE_B, 2));
    assert_eq!(b.exec(&TEST_UNIT_READY, &[], 0).status, GOOD);

    assert_eq!(
        a.task_management(LUN_RESET, 0xffff_ffff),
        0,
        "LOGICAL UNIT RESET through gateway 1: FUNCTION COMPLETE"
    );
    let r = b.exec(&TEST_UNIT_READY, &[], 0);
    assert_eq!(
        (r.status, r.sense),
        (CHECK_CONDITION, Some(DEVICE_RESET)),
        "the next command through gateway 2 after a reset through gateway 1: {r:?}"
    );
    assert_eq!(
        b.exec(&TEST_UNIT_READY, &[], 0).status,
        GOOD,
        "reported once"
    );
    let r = b1.exec(&TEST_UNIT_READY, &[], 0);
    assert_eq!(
        r.sense,
        Some(DEVICE_RESET),
        "another nexus on gateway 1 is told too: {r:?}"
    );
    let r = a.exec(&TEST_UNIT_READY, &[], 0);
    assert_eq!(
        r.sense,
        Some(DEVICE_RESET),
        "and so is the nexus that reset: {r:?}"
    );
    b.write10(8, &[0xb; 512]);
    assert_eq!(
        a.read10(8, 1),
        [0xb; 512],
        "both serve the unit after the reset"
    );
}

/// READ CAPACITY (16)'s LBPME and LBPRZ: whether the unit is thin, and
/// whether what UNMAP deallocates reads back as zeroes.
fn provisioning(i: &mut Initiator) -> (bool, bool) {
    let r = i.exec(
        &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
        &[],
        32,
    );
    assert_eq!(r.status, GOOD, "READ CAPACITY (16): {r:?}");
    (r.data[14] & 0x80 != 0, r.data[14] & 0x40 != 0)
}

/// UNMAP of `blocks` blocks at `lba`.
fn unmap(i: &mut Initiator, lba: u64, blocks: u32) -> u8 {
    let mut params = vec![0, 22, 0, 16, 0, 0, 0, 0];
    params.extend_from_slice(&lba.to_be_bytes());
    params.extend_from_slice(&blocks.to_be_bytes());
    params.extend_from_slice(&[0; 4]);
    i.exec(&[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &params, 0)
        .status
}

#[needs("ceph-mon")]
fn what_unmap_promises_of_an_unaligned_range_holds_on_rbd() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("unmap", "16M", Some("layering"));
    let (_g, at) = gateway(c, &img, common::free_port());
    let mut i = Initiator::login_as(at, TARGET, &who(NODE_A, 1));
    let (thin, zeroes) = provisioning(&mut i);
    // 4 KiB from LBA 9: under librbd's 64 KiB discard granularity, and
    // off any 4 KiB boundary.
    i.write10(0, &[0x5a; 64 << 10]);
    assert_eq!(unmap(&mut i, 9, 8), GOOD, "UNMAP (thin: {thin})");
    let back = i.read10(0, 128);
    assert!(
        back[..9 * 512].iter().all(|&b| b == 0x5a),
        "before the range"
    );
    assert!(
        back[17 * 512..].iter().all(|&b| b == 0x5a),
        "after the range"
    );
    if zeroes {
        assert!(
            back[9 * 512..17 * 512].iter().all(|&b| b == 0),
            "READ CAPACITY (16) says LBPRZ: unmapped blocks read as zeroes, yet the 8 \
             blocks at 9 read back as they were written"
        );
    }
    assert!(thin, "an RBD image is thin: LBPME");
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[needs("ceph-mon")]
fn braids_initiator_over_two_gateways_loses_nothing_when_one_is_killed_and_restarted() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("iscsikill", "32M", Some("layering"));
    let lease = ["--gateway-lease", "3"];
    let (p1, p2) = (common::free_port(), common::free_port());
    let g2_args = |p: u16| -> Vec<String> {
        ["--iscsi", &p.to_string(), lease[0], lease[1]]
            .map(str::to_owned)
            .to_vec()
    };
    let start_gw = |p: u16| {
        let a = g2_args(p);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        c.gateway(&img, &a)
    };
    let _g1 = start_gw(p1);
    let mut g2 = start_gw(p2);
    let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    let uri = format!("iscsi://127.0.0.1:{p1}/{TARGET}/0");
    // Writes of a size hosts send (Linux splits at 128 KiB to 1 MiB).
    let bs = 128 * 1024;
    let rt = rt();
    let (log, acked, replay) = rt.block_on(async {
        let vol = failkit::open(&uri, |cfg| cfg.portals = vec![at(p1), at(p2)]).await;
        assert_eq!(vol.report().paths.len(), 2, "a path to each gateway");
        let start = Instant::now();
        let w = failkit::Workload {
            blocks: 128,
            bs,
            depth: 8,
            duration: Duration::from_secs(10),
        };
        let load = tokio::spawn(failkit::run(vol.clone(), w, start));
        tokio::time::sleep(Duration::from_secs(2)).await;
        signal(g2.pid(), libc::SIGKILL);
        tokio::time::sleep(Duration::from_secs(2)).await;
        drop(std::mem::replace(&mut g2, start_gw(p2)));
        let log = load.await.unwrap();
        let bad = failkit::check_acknowledged(&vol, &log, bs).await;
        assert!(bad.is_empty(), "{bad:?}");
        let acked: Vec<(u64, u64)> = log.acked.iter().map(|(b, (v, _))| (*b, *v)).collect();
        let r = vol.report();
        let failed = |p: u16| {
            cephkit::path_to(&r, &at(p).to_string())
                .figures
                .counters
                .failures
        };
        let failures = (failed(p1), failed(p2));
        let replay = r.replay.clone();
        vol.close().await;
        (log, acked, (replay, failures))
    });
    let (replay, (g1_failures, g2_failures)) = replay;
    // Without a cache every write a gateway acknowledged is in the
    // cluster: its restart is no restart of the unit, so the initiator
    // writes nothing again, and never takes the other gateway's path for
    // one to a process that is gone.
    assert_eq!(
        (replay.replays, g1_failures),
        (0, 0),
        "replays, and failures of the path to the gateway that lived (the restarted one's: \
         {g2_failures}): {replay:?}"
    );
    assert!(log.errors.is_empty(), "I/O errors: {:?}", log.errors);
    assert!(log.mismatches.is_empty(), "{:?}", log.mismatches);
    failkit::assert_holds(&img.export(), &acked, bs, "in the cluster");
    drop(g2);
}

/// A gateway stopped past its lease with writes in it, then let go: the
/// writes it held go through the other gateway once it is fenced, and
/// none of them lands later over a newer write.
///
/// The writes must reach the gateway after it stopped. A write it had
/// already handed to the cluster lands there before the fence and is
/// answered GOOD once the gateway runs again (seen: a 1 MiB write at
/// queue depth 1, one run in five, with nothing held), so a stop in the
/// middle of the load holds a write only by chance. Here the load pauses
/// between two runs, the gateway stops, and the second run's first
/// writes, split over both paths, wait in its socket.
#[needs("ceph-mon")]
fn a_stalled_gateways_held_write_never_lands_over_a_newer_one() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("iscsistall", "32M", Some("layering"));
    let (p1, p2) = (common::free_port(), common::free_port());
    let gw = |p: u16| c.gateway(&img, &["--iscsi", &p.to_string(), "--gateway-lease", "3"]);
    let (g1, g2) = (gw(p1), gw(p2));
    let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    let uri = format!("iscsi://127.0.0.1:{p1}/{TARGET}/0");
    // 1 MiB writes over 16 blocks: each block rewritten often, so a held
    // write landing late would be seen over a newer version.
    let bs = 1 << 20;
    let load = |duration: Duration| failkit::Workload {
        blocks: 16,
        bs,
        depth: 4,
        duration,
    };
    let rt = rt();
    let (log, acked) = rt.block_on(async {
        let vol = failkit::open(&uri, |cfg| cfg.portals = vec![at(p1), at(p2)]).await;
        // Both paths carry the first run, so the engine knows their speed
        // when the second begins.
        let before = failkit::run(vol.clone(), load(Duration::from_secs(2)), Instant::now()).await;
        let r = vol.report();
        let moved = |p: u16| {
            cephkit::path_to(&r, &at(p).to_string())
                .figures
                .counters
                .written_bytes
        };
        assert!(
            moved(p1) > 0 && moved(p2) > 0,
            "both paths carry writes before the stall: {:?}",
            before.samples.last()
        );
        // Stopped past its lease (3 s, and a third more), then let go
        // while the load still runs.
        signal(g2.pid(), libc::SIGSTOP);
        let run = tokio::spawn(failkit::run(
            vol.clone(),
            load(Duration::from_secs(10)),
            Instant::now(),
        ));
        tokio::time::sleep(Duration::from_secs(6)).await;
        signal(g2.pid(), libc::SIGCONT);
        let mut log = run.await.unwrap();
        let r = vol.report();
        let held = cephkit::path_to(&r, &at(p2).to_string())
            .figures
            .counters
            .resent;
        assert!(
            held > 0,
            "writes sent to the stopped gateway went again through the other (none did: \
             it was sent none, or it wrote them once let go, after its lease ran out): {:?}",
            r.paths
                .iter()
                .map(|p| &p.figures.counters)
                .collect::<Vec<_>>()
        );
        assert_eq!(r.replay.replays, 0, "a stall is no restart: {:?}", r.replay);
        // The second run's versions start again from 1: what it
        // acknowledged is what each block holds, and a block it never
        // wrote holds the first run's.
        for (block, first) in before.acked {
            log.acked.entry(block).or_insert(first);
        }
        log.errors.extend(before.errors);
        log.mismatches.extend(before.mismatches);
        let bad = failkit::check_acknowledged(&vol, &log, bs).await;
        assert!(bad.is_empty(), "{bad:?}");
        vol.close().await;
        let acked: Vec<(u64, u64)> = log.acked.iter().map(|(b, (v, _))| (*b, *v)).collect();
        (log, acked)
    });
    assert!(
        g1.log().contains("gateway fenced: blocklisted"),
        "gateway 1 fenced the stalled one: {}",
        g1.log()
    );
    assert!(log.errors.is_empty(), "I/O errors: {:?}", log.errors);
    assert!(log.mismatches.is_empty(), "{:?}", log.mismatches);
    // Time for a write the stalled gateway held to land, had it been let.
    std::thread::sleep(Duration::from_secs(2));
    failkit::assert_holds(&img.export(), &acked, bs, "in the cluster after the stall");
    drop(g2);
}

#[needs("ceph-mon")]
fn a_reserve_six_ends_on_every_gateway_before_its_logout_is_answered() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("r6logout", "16M", Some("layering"));
    let (_g1, at1) = gateway(c, &img, common::free_port());
    let (_g2, at2) = gateway(c, &img, common::free_port());
    let mut a = Initiator::login_as(at1, TARGET, &who(NODE_A, 1));
    let mut b = Initiator::login_as(at2, TARGET, &who(NODE_B, 1));
    const RESERVE6: [u8; 6] = [0x16, 0, 0, 0, 0, 0];
    assert_eq!(a.exec(&RESERVE6, &[], 0).status, GOOD);
    assert_eq!(a.logout(), 0, "logout");
    let r = b.exec(&RESERVE6, &[], 0);
    assert_eq!(
        r.status, GOOD,
        "RESERVE (6) through gateway 2 right after the holder logged out of gateway 1: {r:?}"
    );
}

/// A gateway killed for good: braid's target is fenced by reinstating
/// the failed session through its own portal group, which only the dead
/// gateway serves (without reservations the failed path's writes wait out
/// the no-path timeout, 60 s, then fail). With `--persistent-reservations`
/// the fence is a PREEMPT AND ABORT through the live gateway, which the
/// dead one cannot answer, so it is blocklisted before GOOD: the writes go
/// on at once.
#[needs("ceph-mon")]
fn with_reservations_a_gateway_killed_for_good_is_fenced_through_the_other() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("iscsigone", "32M", Some("layering"));
    let (p1, p2) = (common::free_port(), common::free_port());
    let gw = |p: u16| c.gateway(&img, &["--iscsi", &p.to_string(), "--gateway-lease", "3"]);
    let (g1, g2) = (gw(p1), gw(p2));
    let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    let uri = format!("iscsi://127.0.0.1:{p1}/{TARGET}/0");
    let bs = 128 << 10;
    let rt = rt();
    let (log, acked) = rt.block_on(async {
        let vol = failkit::open(&uri, |cfg| {
            cfg.portals = vec![at(p1), at(p2)];
            cfg.persistent_reservations = true;
        })
        .await;
        let w = failkit::Workload {
            blocks: 64,
            bs,
            depth: 8,
            duration: Duration::from_secs(8),
        };
        let load = tokio::spawn(failkit::run(vol.clone(), w, Instant::now()));
        tokio::time::sleep(Duration::from_secs(2)).await;
        signal(g2.pid(), libc::SIGKILL);
        let log = load.await.unwrap();
        let bad = failkit::check_acknowledged(&vol, &log, bs).await;
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(vol.report().replay.replays, 0);
        vol.close().await;
        let acked: Vec<(u64, u64)> = log.acked.iter().map(|(b, (v, _))| (*b, *v)).collect();
        (log, acked)
    });
    assert!(log.errors.is_empty(), "I/O errors: {:?}", log.errors);
    assert!(log.mismatches.is_empty(), "{:?}", log.mismatches);
    failkit::assert_holds(&img.export(), &acked, bs, "in the cluster");
    assert!(
        g1.log().contains("PREEMPT AND ABORT"),
        "the fence went through gateway 1: {}",
        g1.log()
    );
    drop(g2);
}
