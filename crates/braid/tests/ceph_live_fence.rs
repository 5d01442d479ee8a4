//! Fences that hit no more than they must, on a real throwaway Ceph
//! cluster (`cephkit`): a client whose path to a live gateway breaks (a
//! relay the test cuts, the gateway itself fine) fails over to the other
//! gateway and has it fence the broken path's connections; the live
//! gateway is asked through the image's barrier object, drops them and
//! answers, and nothing is blocklisted, while a verified write load runs
//! through it all without an error.

#![cfg(feature = "rbd")]

mod cephkit;
mod common;
mod failkit;
mod relaykit;

use braid_test_needs::needs;

use std::time::{Duration, Instant};

use braid_initiator::PathRule;

/// Lines of `ceph osd blocklist ls` that name one of `addrs`.
fn blocklisted(c: &cephkit::Cluster, addrs: &[String]) -> Vec<String> {
    let out = c.tool("ceph", &["osd", "blocklist", "ls"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| addrs.iter().any(|a| l.starts_with(a.as_str())))
        .map(str::to_owned)
        .collect()
}

/// The RADOS addresses in the image's gateway records.
fn addresses(img: &cephkit::Image) -> Vec<String> {
    img.gateways()
        .iter()
        .map(|g| g["addr"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[needs("ceph-mon")]
fn a_live_gateways_path_fault_ends_with_its_connections_dropped_and_no_blocklist_entry() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("pathfault", "32M", Some("layering"));
    let lease = ["--gateway-lease", "6"];
    let a = c.gateway(&img, &lease);
    let b = c.gateway(&img, &lease);
    cephkit::eventually(Duration::from_secs(20), "two records", || {
        img.gateways().len() == 2
    });
    let addrs = addresses(&img);
    // The client reaches B only through the relay: cutting it breaks that
    // path and nothing else; B stays alive, its lease renewed.
    let relay = relaykit::Relay::start("127.0.0.1:0", b.addr());
    let bs = 64 * 1024;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let (log, acked) = rt.block_on(async {
        // Every request goes through the relay to B while that path works.
        let portals = vec![relay.addr, a.addr()];
        let rules: Vec<PathRule> = [
            format!("{},priority=0", relay.addr),
            format!("{},priority=1", a.addr()),
        ]
        .iter()
        .map(|r| r.parse().unwrap())
        .collect();
        let vol = failkit::open(&a.uri("vol"), |cfg| {
            cfg.portals = portals;
            cfg.paths = rules;
            cfg.policy = Some("failover".into());
        })
        .await;
        assert_eq!(
            vol.info().paths.len(),
            2,
            "a path to A and one through the relay"
        );
        let w = failkit::Workload {
            blocks: 128,
            bs,
            depth: 8,
            duration: Duration::from_secs(8),
        };
        let load = tokio::spawn(failkit::run(vol.clone(), w, Instant::now()));
        tokio::time::sleep(Duration::from_secs(2)).await;
        relay.cut_and_hold();
        let log = load.await.unwrap();
        let bad = failkit::check_acknowledged(&vol, &log, bs).await;
        assert!(bad.is_empty(), "{bad:?}");
        let acked: Vec<(u64, u64)> = log.acked.iter().map(|(b, (v, _))| (*b, *v)).collect();
        vol.close().await;
        (log, acked)
    });
    eprintln!("load and cut took {:?}", started.elapsed());
    let (a_log, b_log) = (a.log(), b.log());
    let listed = blocklisted(c, &addrs);
    assert!(
        log.errors.is_empty() && log.mismatches.is_empty(),
        "I/O errors: {:?}, mismatches: {:?}\nA:\n{a_log}\nB:\n{b_log}",
        log.errors,
        log.mismatches
    );
    assert!(
        listed.is_empty(),
        "a live gateway blocklisted for one broken path: {listed:?}\nA:\n{a_log}\nB:\n{b_log}"
    );
    assert!(
        a_log.contains("alive: it dropped them"),
        "the client's fence of the broken path never reached B through A:\nA:\n{a_log}\nB:\n\
         {b_log}"
    );
    assert!(
        b_log.contains("another gateway asks this one to drop connections"),
        "B:\n{b_log}"
    );
    assert!(!b_log.contains("lost its right to write"), "B:\n{b_log}");
    failkit::assert_holds(&img.export(), &acked, bs, "in the cluster");
    drop((a, b));
}
