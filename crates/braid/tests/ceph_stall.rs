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

use std::time::{Duration, Instant};

/// How long the OSDs stay paused: past the point where a gateway's barrier
/// watch times out (30 s, `Ceph::watch_timeout`).
const PAUSE: Duration = Duration::from_secs(40);

/// Lines of `ceph osd blocklist ls` that name one of `addrs`.
fn blocklisted(c: &cephkit::Cluster, addrs: &[String]) -> Vec<String> {
    let out = c.tool("ceph", &["osd", "blocklist", "ls"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| addrs.iter().any(|a| l.starts_with(a.as_str())))
        .map(str::to_owned)
        .collect()
}

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
    let bs = 64 * 1024;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let (log, acked) = rt.block_on(async {
        let vol = failkit::open(&a.uri("vol"), |_| {}).await;
        assert_eq!(vol.info().paths.len(), 2, "both gateways from one URI");
        let w = failkit::Workload {
            blocks: 128,
            bs,
            depth: 4,
            duration: PAUSE + Duration::from_secs(8),
        };
        let load = tokio::spawn(failkit::run(vol.clone(), w, Instant::now()));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let paused = tokio::task::spawn_blocking(move || {
            let c = cephkit::cluster();
            c.ok("ceph", &["osd", "pause"]);
            let guard = Unpause(c);
            std::thread::sleep(PAUSE);
            drop(guard);
        });
        paused.await.unwrap();
        let log = load.await.unwrap();
        let bad = failkit::check_acknowledged(&vol, &log, bs).await;
        assert!(bad.is_empty(), "{bad:?}");
        let acked: Vec<(u64, u64)> = log.acked.iter().map(|(b, (v, _))| (*b, *v)).collect();
        vol.close().await;
        (log, acked)
    });
    eprintln!("load and pause took {:?}", started.elapsed());
    let listed = blocklisted(c, &addrs);
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
    failkit::assert_holds(&data, &acked, bs, "in the cluster");
    assert!(
        !a.log().contains("lost its right to write")
            && !b.log().contains("lost its right to write"),
        "a gateway stopped serving for a stall:\nA:\n{}\nB:\n{}",
        a.log(),
        b.log()
    );
    drop((a, b));
}
