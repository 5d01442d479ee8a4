//! braid's initiator over iSCSI on real links: every policy against tgt
//! and braid's own target on two equal links and on 1gbit + 100mbit, with
//! every byte read checked; discovery when a portal of the SendTargets
//! answer does not answer; and ALUA states changed on braid's target
//! while a verified load runs, the bytes following the states.

mod common;
mod failkit;
mod iscsilab;
mod labkit;
mod tgtkit;

use braid_test_needs::needs;

use std::process::Command;
use std::time::{Duration, Instant};

use braid_lab::{Cut, Lab, LabConfig, Rate, Side};
use failkit::Workload;
use iscsilab::{Kind, Target};
use labkit::{braid_bin, braid_client};

const POLICIES: [&str; 9] = [
    "adaptive",
    "round-robin",
    "round-robin-subset",
    "least-queue-depth",
    "least-blocks",
    "weighted",
    "service-time",
    "historical-service-time",
    "failover",
];

/// A `braid bench --json` run's JSON, asserted free of I/O errors and
/// verify mismatches.
fn clean(out: &std::process::Output, what: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench JSON");
    assert_eq!(
        (v["errors"].as_u64(), v["verify_errors"].as_u64()),
        (Some(0), Some(0)),
        "{what}: {v}"
    );
    v
}

/// Bytes each path carried in a short verified mixed benchmark.
fn bench(lab: &Lab, target: &Target, policy: &str) -> Vec<u64> {
    let uri = target.uri();
    let portals = target.portal_args();
    let mut args = vec![
        "bench",
        &uri,
        "--rw",
        "randrw",
        "--bs",
        "256k",
        "--iodepth",
        "8",
        "--time",
        "0.6",
        "--verify",
        "--json",
        "--policy",
        policy,
    ];
    args.extend(portals.iter().map(String::as_str));
    let out = braid_client(lab, &args, Duration::from_secs(60));
    let v = clean(&out, &format!("{:?} {policy}", target.kind));
    v["paths"]
        .as_array()
        .expect("paths")
        .iter()
        .map(|p| p["bytes"].as_u64().unwrap())
        .collect()
}

#[needs("root", "ip", "tc", "tgtd")]
fn every_policy_over_iscsi_on_equal_and_unequal_links() {
    if !braid_lab::require_or_skip("every_policy_over_iscsi") {
        return;
    }
    let lab = Lab::up(LabConfig::new([Rate::GBIT, Rate::GBIT])).unwrap();
    let targets = [
        Target::start(&lab, Kind::Braid, 3260),
        Target::start(&lab, Kind::Tgt, 3261),
    ];
    for rate in [Rate::GBIT, Rate::MBIT_100] {
        lab.set_rate(2, rate).unwrap();
        for target in &targets {
            for policy in POLICIES {
                let bytes = bench(&lab, target, policy);
                let what = format!("{:?}, {policy}, path 2 at {rate:?}: {bytes:?}", target.kind);
                assert_eq!(bytes.len(), 2, "{what}");
                let used = bytes.iter().filter(|b| **b > 0).count();
                match policy {
                    "failover" => assert_eq!(used, 1, "failover used both paths: {what}"),
                    "round-robin" | "adaptive" => {
                        assert_eq!(used, 2, "a path was left idle: {what}")
                    }
                    _ => assert!(used >= 1, "{what}"),
                }
                if policy == "adaptive" && rate == Rate::MBIT_100 {
                    let fast = bytes[0] as f64 / bytes.iter().sum::<u64>() as f64;
                    assert!(fast >= 0.75, "the 1gbit path got too little: {what}");
                }
            }
        }
    }
}

#[needs("root", "ip", "tc")]
fn a_portal_in_the_send_targets_answer_that_never_answers_is_left_out_quickly() {
    if !braid_lab::require_or_skip("a_portal_in_the_send_targets_answer_that_never_answers") {
        return;
    }
    let lab = Lab::up(LabConfig::new([Rate::GBIT, Rate::GBIT])).unwrap();
    let target = Target::start(&lab, Kind::Braid, 3260);
    // Path 2 drops every packet, silently: a connect there would wait
    // for the kernel's SYN retries (over a minute).
    lab.cut(2, Cut::Blackhole).unwrap();
    let began = Instant::now();
    let out = braid_client(
        &lab,
        &[
            "bench",
            &target.uri(),
            "--rw",
            "randrw",
            "--bs",
            "64k",
            "--time",
            "0.5",
            "--verify",
            "--json",
        ],
        Duration::from_secs(60),
    );
    let took = began.elapsed();
    let v = clean(&out, "one portal silent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let paths = v["paths"].as_array().expect("paths");
    assert_eq!(paths.len(), 1, "the silent portal became a path: {v}");
    let unreachable = format!("{}", target.portals[1]);
    assert!(
        stderr.contains(&unreachable) && stderr.contains("left out"),
        "no note of the portal left out:\n{stderr}"
    );
    // One probe's timeout (1 s) on top of the run, not a TCP connect's.
    assert!(
        took < Duration::from_secs(15),
        "the open waited for the silent portal: {took:?}\n{stderr}"
    );
}

/// Bytes path `i` (0-based) had moved by `at`.
fn moved(log: &failkit::RunLog, i: usize, at: Duration) -> u64 {
    log.samples
        .iter()
        .rev()
        .find(|s| s.at <= at)
        .map_or(0, |s| s.bytes[i])
}

fn alua(target: &Target, portal: usize, state: &str) {
    let out = Command::new(braid_bin())
        .args(["alua", &target.portals[portal].to_string(), state])
        .arg("--control")
        .arg(&target.control)
        .env("NO_COLOR", "1")
        .output()
        .expect("braid alua runs");
    assert!(
        out.status.success(),
        "braid alua {state}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[needs("root", "ip", "tc")]
fn alua_states_steer_a_verified_load_without_an_error() {
    if !braid_lab::require_or_skip("alua_states_steer_a_verified_load") {
        return;
    }
    let lab = Lab::up(LabConfig::new([Rate::GBIT, Rate::GBIT])).unwrap();
    let target = Target::start(&lab, Kind::Braid, 3260);
    let uri = target.uri();
    let start = Instant::now();
    let at = |s: f64| {
        std::thread::sleep(
            (start + Duration::from_secs_f64(s)).saturating_duration_since(Instant::now()),
        )
    };
    let t = |s: f64| Duration::from_secs_f64(s);
    let log = std::thread::scope(|s| {
        s.spawn(|| {
            at(1.5);
            alua(&target, 1, "active-non-optimized");
            // The only optimized path goes: the non-optimized one serves.
            at(3.0);
            lab.cut(1, Cut::LinkDown).unwrap();
            at(4.5);
            lab.restore(1).unwrap();
            at(5.0);
            alua(&target, 1, "standby");
            at(7.0);
            alua(&target, 1, "active-optimized");
        });
        lab.enter(Side::Client, || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let vol = failkit::open(&uri, |_| {}).await;
                let w = Workload {
                    blocks: 128,
                    bs: 256 * 1024,
                    depth: 8,
                    duration: t(9.0),
                };
                let log = failkit::run(vol.clone(), w, start).await;
                vol.close().await;
                log
            })
        })
        .unwrap()
    });
    let context = target.log();
    assert!(log.errors.is_empty(), "{:?}\n{context}", log.errors);
    assert!(log.mismatches.is_empty(), "{:?}\n{context}", log.mismatches);
    let p2 = |from: f64, to: f64| moved(&log, 1, t(to)) - moved(&log, 1, t(from));
    let p1 = |from: f64, to: f64| moved(&log, 0, t(to)) - moved(&log, 0, t(from));
    let windows = format!(
        "path 2 moved: both optimized {} / non-optimized {} / the optimized one cut {} / standby {} / optimized again {}; \
         path 1 while path 2 was non-optimized: {}",
        p2(0.2, 1.5),
        p2(2.0, 3.0),
        p2(3.6, 4.5),
        p2(5.5, 7.0),
        p2(7.5, 9.0),
        p1(2.0, 3.0)
    );
    eprintln!("{windows}");
    assert!(p2(0.2, 1.5) > 0, "{windows}");
    assert_eq!(
        p2(2.0, 3.0),
        0,
        "a non-optimized path carried I/O beside an optimized one: {windows}"
    );
    assert!(p1(2.0, 3.0) > 0, "{windows}");
    assert!(
        p2(3.6, 4.5) > 0,
        "with no optimized path, the non-optimized one must serve: {windows}"
    );
    assert_eq!(p2(5.5, 7.0), 0, "a standby path carried I/O: {windows}");
    assert!(p2(7.5, 9.0) > 0, "path 2 was not used again: {windows}");
}
