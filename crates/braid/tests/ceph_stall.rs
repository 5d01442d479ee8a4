//! A cluster-wide stall is not a gateway failure, on a real throwaway Ceph
//! cluster of its own (`cephkit`; `ceph osd pause` stops every OSD of it,
//! so no other test shares it): under a verified write load through two
//! gateways, the OSDs paused until they have dropped the gateways' barrier
//! watches (30 s) and resumed; the load waits and resumes with them, with
//! no I/O error and nothing lost, and no gateway is blocklisted for it.

#![cfg(feature = "rbd")]

mod cephkit;
mod common;
mod failkit;

use braid_test_needs::needs;

use std::time::{Duration, Instant};

/// A gateway's barrier watch times out 30 s after its last ping
/// (`Ceph::watch_timeout`); the OSDs stay paused until the OSD has dropped
/// both, which it does within this.
const WATCHES_DROPPED_WITHIN: Duration = Duration::from_secs(45);

/// The load before the pause (`failkit::under_load`), the pause (the
/// watches' 30 s and a second more) and about 6 s after it.
const LOAD: Duration = Duration::from_secs(2 + 31 + 7);

/// Unpauses the OSDs when dropped, whatever the test did.
struct Unpause<'a>(&'a cephkit::Cluster);

impl Drop for Unpause<'_> {
    fn drop(&mut self) {
        let _ = self.0.tool("ceph", &["osd", "unpause"]);
    }
}

#[needs("ceph-mon")]
fn a_cluster_wide_stall_is_waited_out_with_no_error_and_no_gateway_blocklisted() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("stall", "32M", Some("layering"));
    let lease = ["--gateway-lease", "6"];
    let a = c.gateway(&img, &lease);
    let b = c.gateway(&img, &lease);
    cephkit::eventually(Duration::from_secs(20), "two records", || {
        img.gateways().len() == 2
    });
    let addrs: Vec<String> = img
        .gateways()
        .iter()
        .map(|g| g["addr"].as_str().unwrap_or_default().to_owned())
        .collect();
    let barrier = format!("braid_gateways.{}", img.id);
    assert_eq!(
        c.watches_on(&barrier),
        2,
        "each gateway watches the barrier"
    );
    let pause = || {
        c.ok("ceph", &["osd", "pause"]);
        let guard = Unpause(c);
        let paused = Instant::now();
        cephkit::eventually(
            WATCHES_DROPPED_WITHIN,
            "the OSD dropped the gateways' barrier watches",
            || c.watches_on(&barrier) == 0,
        );
        eprintln!(
            "the watches were dropped {:?} into the pause",
            paused.elapsed()
        );
        std::thread::sleep(Duration::from_secs(1));
        drop(guard);
    };
    let (log, acked) = failkit::under_load(&a.uri("vol"), |_| {}, 4, LOAD, pause);
    assert!(
        log.samples.iter().all(|s| s.states.len() == 2),
        "both gateways from one URI"
    );
    let listed = c.blocklisted(&addrs);
    assert!(
        log.errors.is_empty(),
        "I/O errors: {:?}\nblocklisted: {listed:?}\nA:\n{}\nB:\n{}",
        log.errors,
        a.log(),
        b.log()
    );
    assert!(log.mismatches.is_empty(), "{:?}", log.mismatches);
    assert!(
        listed.is_empty(),
        "gateways blocklisted for a stall: {listed:?}\nA:\n{}\nB:\n{}",
        a.log(),
        b.log()
    );
    let data = img.export();
    failkit::assert_holds(&data, &acked, failkit::BS, "in the cluster");
    assert!(
        !a.log().contains("lost its right to write")
            && !b.log().contains("lost its right to write"),
        "a gateway stopped serving for a stall:\nA:\n{}\nB:\n{}",
        a.log(),
        b.log()
    );
    drop((a, b));
}
