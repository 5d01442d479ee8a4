//! Each policy with its knobs set, on two equal links of the lab, so that
//! what it does differs from round-robin and is the documented outcome:
//! failover follows priority (not discovery order), weighted sends to the
//! lowest weight, service-time splits by relative throughput, a standby
//! path of round-robin-subset carries nothing until the active set fails,
//! knobs change on the live volume, and a live switch to a spreading policy
//! is refused when the target's FLUSH would not cover every connection.

mod labkit;

use std::process::Command;
use std::time::Duration;

use braid_lab::{Cut, Lab, LabConfig, Rate, Side};
use labkit::{braid_bin, braid_client, Attach, LabServe};

/// A lab of two 1gbit paths with `braid serve` on both portals.
fn lab() -> Option<(Lab, LabServe, Vec<String>)> {
    if !braid_lab::require_or_skip("lab_policies") {
        return None;
    }
    let lab = Lab::up(LabConfig::new([Rate::GBIT, Rate::GBIT])).unwrap();
    let portals: Vec<String> = lab
        .paths()
        .iter()
        .map(|p| p.storage_addr.to_string())
        .collect();
    let mut args = vec!["vol=mem:64MiB"];
    for p in &portals {
        args.extend(["--listen", p]);
    }
    let serve = LabServe::start(&lab, &args, 1);
    Some((lab, serve, portals))
}

/// Bytes each path carried in a short read benchmark with `args`.
fn bench_bytes(lab: &Lab, portals: &[String], args: &[&str]) -> Vec<u64> {
    let uri = format!("nbd://{}/vol", portals[0]);
    let mut all = vec![
        "bench",
        &uri,
        "--rw",
        "read",
        "--bs",
        "4M",
        "--iodepth",
        "1",
        "--time",
        "2",
        "--json",
    ];
    all.extend_from_slice(args);
    let out = braid_client(lab, &all, Duration::from_secs(60));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench JSON");
    assert_eq!(v["errors"], 0, "{v}");
    v["paths"]
        .as_array()
        .expect("paths")
        .iter()
        .map(|p| p["bytes"].as_u64().unwrap())
        .collect()
}

fn share(bytes: &[u64], i: usize) -> f64 {
    bytes[i] as f64 / bytes.iter().sum::<u64>().max(1) as f64
}

#[test]
fn knobs_decide_where_failover_weighted_and_service_time_send() {
    let Some((lab, _serve, portals)) = lab() else {
        return;
    };
    let (p1, p2) = (portals[0].as_str(), portals[1].as_str());

    // Round-robin uses both: the baseline the others must differ from.
    let rr = bench_bytes(&lab, &portals, &["--policy", "round-robin"]);
    assert!((0.4..=0.6).contains(&share(&rr, 0)), "{rr:?}");

    // Failover by priority: path 2 first, though discovery lists path 1
    // first.
    let prio1 = format!("{p1},priority=2");
    let prio2 = format!("{p2},priority=1");
    let fo = bench_bytes(
        &lab,
        &portals,
        &["--policy", "failover", "--path", &prio1, "--path", &prio2],
    );
    assert_eq!(fo[0], 0, "failover used the lower-priority path: {fo:?}");
    assert!(fo[1] > 0, "{fo:?}");

    // Weighted paths: the lowest weight carries everything.
    let w1 = format!("{p1},weight=5");
    let w2 = format!("{p2},weight=1");
    let w = bench_bytes(
        &lab,
        &portals,
        &["--policy", "weighted", "--path", &w1, "--path", &w2],
    );
    assert_eq!(w[0], 0, "weighted used the heavier path: {w:?}");
    assert!(w[1] > 0, "{w:?}");

    // Service time with relative throughput 3:1 splits each request 3:1.
    let rt1 = format!("{p1},relative-throughput=3");
    let rt2 = format!("{p2},relative-throughput=1");
    let st = bench_bytes(
        &lab,
        &portals,
        &["--policy", "service-time", "--path", &rt1, "--path", &rt2],
    );
    let s = share(&st, 0);
    assert!(
        (0.70..=0.80).contains(&s),
        "service-time with relative throughput 3:1 gave path 1 {:.1}%: {st:?}",
        s * 100.0
    );
}

/// `braid status --json` figures of path `i` (0-based) of the attached volume.
fn carried(attach: &Attach, i: usize) -> u64 {
    let v = attach.status();
    let p = &v["paths"][i];
    assert!(p["read_bytes"].is_u64(), "{v}");
    p["read_bytes"].as_u64().unwrap() + p["written_bytes"].as_u64().unwrap()
}

/// Writes `len` bytes of `seed` at `offset` through the attach socket with
/// nbdcopy, in the client namespace, and reads them back the same way.
fn write_and_check(lab: &Lab, attach: &Attach, seed: u8, len: usize) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let back = dir.path().join("back");
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    std::fs::write(&src, &data).unwrap();
    for (from, to) in [
        (src.display().to_string(), attach.uri()),
        (attach.uri(), back.display().to_string()),
    ] {
        let mut c = Command::new("nbdcopy");
        c.args([from.as_str(), to.as_str()]);
        let out = lab
            .output(Side::Client, c, Duration::from_secs(60))
            .expect("nbdcopy runs");
        assert!(
            out.status.success(),
            "nbdcopy {from} {to}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // nbdcopy writes a file of the export's size: compare the part written.
    let got = std::fs::read(&back).unwrap();
    assert!(got[..len] == data[..], "data read back differs");
}

/// `braid path ARGS` against the attach's control socket.
fn braid_path(attach: &Attach, args: &[&str]) -> std::process::Output {
    Command::new(braid_bin())
        .arg("path")
        .arg(&attach.name)
        .args(args)
        .arg("--control")
        .arg(&attach.control)
        .output()
        .expect("braid path")
}

#[test]
fn a_standby_path_carries_nothing_until_the_active_set_fails() {
    let Some((lab, _serve, portals)) = lab() else {
        return;
    };
    let uri = format!("nbd://{}/vol", portals[0]);
    let standby = format!("{},standby", portals[1]);
    let attach = Attach::start(
        Some(&lab),
        &uri,
        "vol",
        &["--policy", "round-robin-subset", "--path", &standby],
    );
    write_and_check(&lab, &attach, 1, 16 << 20);
    let before = carried(&attach, 1);
    assert!(carried(&attach, 0) >= 32 << 20);
    // Only the initial probe may have touched the standby path.
    assert!(before < 1 << 20, "the standby path carried {before} bytes");

    lab.cut(1, Cut::LinkDown).unwrap();
    write_and_check(&lab, &attach, 2, 16 << 20);
    assert!(
        carried(&attach, 1) >= before + (32 << 20),
        "the standby path did not take over:\n{}",
        attach.log()
    );
    lab.restore(1).unwrap();

    // Knobs change live: path 2 stops standing by and shares the load.
    let out = braid_path(&attach, &["2", "standby=no"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("standby=no"));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while attach.status()["paths"][0]["state"] != "active" {
        assert!(
            std::time::Instant::now() < deadline,
            "path 1 never came back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (a, b) = (carried(&attach, 0), carried(&attach, 1));
    write_and_check(&lab, &attach, 3, 16 << 20);
    assert!(
        carried(&attach, 0) > a + (4 << 20),
        "path 1 idle after restore"
    );
    assert!(
        carried(&attach, 1) > b + (4 << 20),
        "path 2 idle after standby=no"
    );

    // A knob that does not exist is a usage error, and changes nothing.
    let out = braid_path(&attach, &["2", "wieght=3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("wieght"));
}

#[test]
fn a_live_switch_to_spreading_is_refused_without_multi_conn() {
    let Some((lab, serve, portals)) = lab() else {
        return;
    };
    drop(serve);
    // nbdkit on both portals of the storage namespace, with multi-conn
    // turned off: a FLUSH on one connection covers only that connection.
    let mut nbdkit = Command::new("nbdkit");
    nbdkit.args([
        "--foreground",
        "--exit-with-parent",
        "--filter=multi-conn",
        "memory",
        "64M",
        "multi-conn-mode=disable",
    ]);
    let _nbdkit = lab.spawn(Side::Storage, nbdkit).expect("nbdkit");
    let uri = format!("nbd://{}", portals[0]);
    let portal2 = portals[1].clone();
    // Wait (bounded) for nbdkit to listen.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut probe = Command::new("nbdinfo");
        probe.arg(&uri);
        let out = lab
            .output(Side::Client, probe, Duration::from_secs(10))
            .unwrap();
        if out.status.success() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "nbdkit did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let attach = Attach::start(
        Some(&lab),
        &uri,
        "vol",
        &[
            "--portal",
            &portals[0],
            "--portal",
            &portal2,
            "--policy",
            "failover",
        ],
    );
    let out = Command::new(braid_bin())
        .args(["policy", "vol", "round-robin", "--control"])
        .arg(&attach.control)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the switch was allowed");
    assert!(err.contains("CAN_MULTI_CONN"), "{err}");
    assert_eq!(attach.status()["policy"], "failover");
    write_and_check(&lab, &attach, 4, 4 << 20);
}
