//! Multipath over real links of known speed: `braid serve` in the lab's
//! storage namespace, `braid copy` in its client namespace, over shaped
//! veth pairs. Data is checked by sha256; each link's own counters show it
//! carried its share.

mod common;
mod labkit;

use braid_test_needs::needs;

use std::time::Duration;

use braid_lab::{Lab, LabConfig, Rate};
use labkit::{braid_client, shares, LabServe};

/// Copies a random file in and out over the lab; returns the shares of the
/// copy in, and the bytes each link carried (both directions).
fn round_trip(lab: &Lab) -> (Vec<f64>, Vec<u64>) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    let back = dir.path().join("back.img");
    let mut data = vec![0u8; 128 << 20];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    std::fs::write(&src, &data).unwrap();
    let portals: Vec<String> = lab
        .paths()
        .iter()
        .map(|p| p.storage_addr.to_string())
        .collect();
    let mut args = vec!["vol=mem:128MiB"];
    for p in &portals {
        args.push("--listen");
        args.push(p);
    }
    let _serve = LabServe::start(lab, &args, 1);
    let uri = format!("nbd://{}/vol", portals[0]);
    let before: Vec<_> = (1..=portals.len())
        .map(|i| lab.counters(i).unwrap())
        .collect();
    let limit = Duration::from_secs(120);
    let copy_in = braid_client(
        lab,
        &["copy", src.to_str().unwrap(), &uri, "--verify"],
        limit,
    );
    braid_client(lab, &["copy", &uri, back.to_str().unwrap()], limit);
    assert!(
        std::fs::read(&back).unwrap() == data,
        "the copy read back differs from what was written"
    );
    let carried = (1..=portals.len())
        .map(|i| {
            let c = lab.counters(i).unwrap();
            (c.tx_bytes - before[i - 1].tx_bytes) + (c.rx_bytes - before[i - 1].rx_bytes)
        })
        .collect();
    (shares(&copy_in), carried)
}

#[needs("root", "ip", "tc")]
fn copy_over_two_equal_gigabit_paths_uses_both_evenly() {
    if !braid_lab::require_or_skip("copy_over_two_equal_gigabit_paths_uses_both_evenly") {
        return;
    }
    let lab = Lab::up(LabConfig::new([Rate::GBIT, Rate::GBIT])).unwrap();
    let (shares, carried) = round_trip(&lab);
    assert_eq!(shares.len(), 2, "{shares:?}");
    for s in &shares {
        assert!(
            (30.0..=70.0).contains(s),
            "uneven split over equal links: {shares:?}"
        );
    }
    for c in &carried {
        assert!(*c > 100 << 20, "a link carried only {c} bytes: {carried:?}");
    }
}

#[needs("root", "ip", "tc")]
fn copy_over_unequal_paths_follows_their_speed() {
    if !braid_lab::require_or_skip("copy_over_unequal_paths_follows_their_speed") {
        return;
    }
    let lab = Lab::up(LabConfig::new([Rate::GBIT, Rate::MBIT_100])).unwrap();
    let (shares, carried) = round_trip(&lab);
    assert_eq!(shares.len(), 2, "{shares:?}");
    // 1 Gbit/s and 100 Mbit/s: about 91% and 9%.
    assert!(
        shares[0] >= 75.0,
        "the fast link got too little: {shares:?}"
    );
    assert!(shares[1] > 1.0, "the slow link was not used: {shares:?}");
    assert!(carried[0] > carried[1], "{carried:?}");
    assert!(carried[1] > 1 << 20, "{carried:?}");
}
