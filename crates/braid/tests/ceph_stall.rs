//! A cluster-wide stall is not a gateway failure, on a real throwaway Ceph
//! cluster of its own (`cephkit`; `ceph osd pause` stops every OSD of it,
//! so no other test shares it): under a verified write load through two
//! gateways, the OSDs paused for 40 s and resumed; the load waits and
//! resumes with them, with no I/O error and nothing lost, and no gateway
//! is blocklisted for it.

#![cfg(feature = "rbd")]

mod cephkit;
mod common;
mod failkit;

use braid_test_needs::needs;

use std::time::Duration;

/// How long the OSDs stay paused: past the point where a gateway's barrier
/// watch times out (30 s, `Ceph::watch_timeout`).
const PAUSE: Duration = Duration::from_secs(40);

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
    let pause = || {
        c.ok("ceph", &["osd", "pause"]);
        let guard = Unpause(c);
        std::thread::sleep(PAUSE);
        drop(guard);
    };
    let duration = PAUSE + Duration::from_secs(8);
    let (log, acked) = failkit::under_load(&a.uri("vol"), |_| {}, 4, duration, pause);
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
