//! A per-path queue depth (`--path PORTAL,queue-depth=N`): four equal lab
//! links with depths 1, 4, 16 and 64 under 4 KiB random reads at queue
//! depth 128. No path ever holds more than its depth (the engine's own
//! high-water mark, reported per path), the shallow ones are kept full
//! (128 requests outnumber 1 + 4 + 16), and what each carries follows its
//! depth: a full path is skipped like a busy one, so the deeper paths take
//! the rest. (On one machine the deeper paths share two CPUs, so their
//! rates flatten out; on real links each would be bound by its own.)

mod labkit;

use std::time::Duration;

use braid_lab::{Lab, LabConfig, Rate};
use labkit::{braid_client, LabServe};

#[test]
fn no_path_holds_more_than_its_queue_depth_and_the_split_follows_the_depths() {
    if !braid_lab::require_or_skip("lab_queue_depth") {
        return;
    }
    let lab = Lab::up(LabConfig::new([Rate::GBIT; 4])).unwrap();
    let portals: Vec<String> = lab
        .paths()
        .iter()
        .map(|p| p.storage_addr.to_string())
        .collect();
    let mut args = vec!["vol=mem:64MiB"];
    for p in &portals {
        args.extend(["--listen", p.as_str()]);
    }
    let _serve = LabServe::start(&lab, &args, 1);
    let depths = [1u64, 4, 16, 64];
    let rules: Vec<String> = portals
        .iter()
        .zip(depths)
        .map(|(p, d)| format!("{p},queue-depth={d}"))
        .collect();
    let uri = format!("nbd://{}/vol", portals[0]);
    let mut all = vec![
        "bench",
        &uri,
        "--rw",
        "randread",
        "--bs",
        "4K",
        "--iodepth",
        "128",
        "--size",
        "64MiB",
        "--time",
        "3",
        "--json",
    ];
    for r in &rules {
        all.extend(["--path", r.as_str()]);
    }
    let out = braid_client(&lab, &all, Duration::from_secs(60));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bench JSON: {e}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(v["errors"], 0, "{v}");
    let paths = v["paths"].as_array().expect("paths");
    assert_eq!(paths.len(), 4, "{v}");
    let mut iops = Vec::new();
    for (p, depth) in paths.iter().zip(depths) {
        assert_eq!(p["queue_depth"].as_u64(), Some(depth), "{p}");
        let held = p["max_inflight"].as_u64().expect("max_inflight");
        assert!(
            held <= depth,
            "path {} held {held} requests at once, its depth is {depth}: {v}",
            p["index"]
        );
        if depth < 64 {
            assert_eq!(held, depth, "path {} was never kept full: {v}", p["index"]);
        }
        iops.push(p["iops"].as_f64().expect("iops"));
    }
    for (i, rate) in iops.iter().enumerate().skip(1) {
        assert!(
            *rate > iops[0] * 1.5,
            "path {} (depth {}) carries more than the path of depth 1: IOPS per path {iops:?}",
            i + 1,
            depths[i]
        );
    }
    eprintln!("IOPS per path for depths {depths:?}: {iops:?}");
}
