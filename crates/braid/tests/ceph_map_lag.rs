//! A gateway that joins an image while another gateway is being fenced,
//! on a throwaway cluster whose OSD lags behind the monitor on OSD maps
//! (`scripts/ceph-cluster --map-lag`: every message from the monitor to
//! the OSD held for a random time up to a few seconds).
//!
//! A blocklist shuts a stale gateway out only once the OSD has the map
//! that names it. The fencing gateway's barrier makes every gateway that
//! watches at that moment fetch that map, so that the writes it then
//! serves carry it, and the OSD takes the map before it applies them. A
//! gateway whose watch came after the barrier, and whose RADOS client
//! connected before the blocklist, must fetch the newest map itself before
//! it serves: otherwise the OSD, still behind, applies the write it
//! serves and after it the stale gateway's held write. Here the fence is
//! the blocklist alone (what the late gateway sees of one whose barrier it
//! missed), and the late gateway's join is held between connecting and
//! watching while the blocklist goes in.

#![cfg(feature = "rbd")]

mod cephkit;
mod common;

use braid_test_needs::needs;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{cmd, ChildGuard, Serve};

const BS: usize = 64 * 1024;

/// How long the OSD may hold each message from the monitor.
const LAG: Duration = Duration::from_secs(4);

/// Trials: with the gateway's wait for the newest map removed, each shows
/// the stale write landing unless the OSD happened to catch up within the
/// few hundred milliseconds the trial needs (5 runs of 5 failed at the
/// first); with the wait it never lands.
const TRIALS: usize = 2;

/// How often `needle` is in `log`.
fn count(log: &str, needle: &str) -> usize {
    log.matches(needle).count()
}

/// Waits (bounded) until `g`'s log holds `needle` at least `n` times.
fn logged(g: &Serve, needle: &str, n: usize) {
    cephkit::eventually(Duration::from_secs(30), needle, || {
        count(&g.log(), needle) >= n
    });
}

/// C's current RADOS address: its record's, or the one it rejoined with.
fn address(c_gw: &Serve, img: &cephkit::Image) -> String {
    let log = c_gw.log();
    if let Some(line) = log
        .lines()
        .rev()
        .find(|l| l.contains("rejoined as a new RADOS client"))
    {
        let addr = line.split("addr=").nth(1).expect("addr= in the log line");
        return addr
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned();
    }
    let records = img.gateways();
    let pid = u64::from(c_gw.pid());
    records
        .iter()
        .find(|r| r["pid"].as_u64() == Some(pid))
        .and_then(|r| r["addr"].as_str())
        .expect("C's record")
        .to_owned()
}

#[needs("ceph-mon", "nbdsh")]
fn a_gateway_that_joins_during_a_fence_serves_nothing_the_stale_gateway_can_overwrite() {
    let Some(c) = cephkit::ceph_lagging() else {
        return;
    };
    if !common::tool("nbdsh") {
        return;
    }
    let img = c.image("lag", "16M", Some("layering"));
    let scratch = tempfile::tempdir().unwrap();
    let hold = scratch.path().join("hold");
    let pause = scratch.path().join("pause");
    let (hold_env, pause_env) = (hold.display().to_string(), pause.display().to_string());
    // Leases long enough that no gateway is fenced for going silent here.
    let lease = ["--gateway-lease", "60"];
    let stale = c.gateway_env(&img, &lease, &[("BRAID_TEST_HOLD_RBD_WRITES", &hold_env)]);
    c.lag_maps(LAG);
    for trial in 1..=TRIALS {
        // C, the stale gateway, holds a client's write of version 2 (the
        // client is gone: nothing re-sends it).
        std::fs::write(&hold, b"").unwrap();
        let client = ChildGuard::spawn(
            cmd("nbdsh")
                .arg("-c")
                .arg(format!(
                    "import time\nh.connect_uri({:?})\nh.aio_pwrite(b'\\x02' * {BS}, 0)\n\
                     time.sleep(60)\n",
                    stale.uri("vol")
                ))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        logged(&stale, "TEST HOOK: holding a write", trial);
        drop(client);
        // B, the late gateway: connected to the cluster, its barrier watch
        // not yet registered.
        std::fs::write(&pause, b"").unwrap();
        let b_portal = format!("127.0.0.1:{}", common::free_port());
        let late = c.spawn_gateway(
            &img,
            &[&lease[..], &["--listen", &b_portal]].concat(),
            &[("BRAID_TEST_JOIN_PAUSE", &pause_env)],
        );
        cephkit::eventually(Duration::from_secs(30), "B's join paused", || {
            late.log().contains("TEST HOOK: join paused")
        });
        let fenced_at = c.mon_epoch() + 1;
        let c_addr = address(&stale, &img);
        c.ok("ceph", &["osd", "blocklist", "add", &c_addr]);
        // B goes on; a client writes version 3 through it as soon as it
        // serves (connected already, its handshake waits for B).
        std::fs::remove_file(&pause).unwrap();
        let mut writer = ChildGuard::spawn(
            cmd("nbdsh")
                .arg("-c")
                .arg(format!(
                    "h.connect_uri('nbd://{b_portal}/vol')\nh.pwrite(b'\\x03' * {BS}, 0)\n\
                     h.shutdown()\nprint('written', flush=True)\n"
                ))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null()),
        );
        let mut line = String::new();
        BufReader::new(writer.0.stdout.take().expect("piped"))
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "written", "B:\n{}", late.log());
        let osd_then = c.osd_epoch();
        // Now C's held write goes on to the OSD.
        std::fs::remove_file(&hold).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let landed = loop {
            if img.export()[..BS].iter().all(|&b| b == 2) {
                break true;
            }
            if count(&stale.log(), "old connections drained") >= trial {
                break false;
            }
            assert!(Instant::now() < deadline, "C:\n{}", stale.log());
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(
            !landed && img.export()[..BS].iter().all(|&b| b == 3),
            "trial {trial}: the blocklisted gateway's held write landed over the newer write \
             served by a gateway that joined during the fence (the OSD had map {osd_then} when \
             the newer write was acknowledged; the blocklist is in map {fenced_at})\nB:\n{}\n\
             C:\n{}",
            late.log(),
            stale.log()
        );
        assert!(
            late.log().contains("joined the image's gateways"),
            "{}",
            late.log()
        );
        drop(late);
        // C rejoins as a new RADOS client, for the next trial.
        logged(&stale, "rejoined as a new RADOS client", trial);
    }
    c.lag_maps(Duration::ZERO);
}

/// Writes the gateway's RADOS clients sent to the OSDs (librados' own
/// count, `op_w` of `perf dump`), socket by socket.
fn writes_sent(sockets: &[std::path::PathBuf]) -> Vec<u64> {
    sockets
        .iter()
        .map(|s| {
            let said = cephkit::admin_at(s, &serde_json::json!({"prefix": "perf dump"}));
            let v: serde_json::Value = serde_json::from_str(&said).expect("perf dump is JSON");
            v["objecter"]["op_w"].as_u64().expect("objecter op_w")
        })
        .collect()
}

/// `--ceph-admin-socket DIR`: each RADOS client of a gateway (the
/// process's own, and the image's that carries its writes) answers on a
/// socket of its own there, whose settings change the running client (how
/// the barrier test above slows one gateway's clients at one moment).
#[needs("ceph-mon", "nbdsh")]
fn a_gateways_rados_clients_answer_on_admin_sockets_in_the_directory_named() {
    let Some(c) = cephkit::ceph_lagging() else {
        return;
    };
    if !common::tool("nbdsh") {
        return;
    }
    let img = c.image("asok", "16M", Some("layering"));
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let refused = common::output(
        std::process::Command::new(env!("CARGO_BIN_EXE_braid"))
            .args(["serve", "--listen", "127.0.0.1:0", "--ceph-admin-socket"])
            .arg(&missing)
            .arg(format!("vol={}", img.spec())),
        Duration::from_secs(30),
    );
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("--ceph-admin-socket") && said.contains("not a directory"),
        "{said}"
    );
    let dir_arg = dir.path().display().to_string();
    let gw = c.gateway(&img, &["--ceph-admin-socket", &dir_arg]);
    let sockets = cephkit::sockets_in(dir.path());
    assert_eq!(
        sockets.len(),
        2,
        "one per client: {sockets:?}\n{}",
        gw.log()
    );
    for s in &sockets {
        let name = s.file_name().unwrap().to_string_lossy();
        assert!(
            name.starts_with("ceph-client.admin.") && name.contains(&format!(".{}.", gw.pid())),
            "{name}"
        );
        for (var, val) in [
            ("ms_inject_delay_max", "0.25"),
            ("ms_inject_delay_max", "0"),
        ] {
            let set = cephkit::admin_at(
                s,
                &serde_json::json!({"prefix": "config set", "var": var, "val": [val]}),
            );
            assert!(set.contains("success"), "{name}: {set}");
            let got =
                cephkit::admin_at(s, &serde_json::json!({"prefix": "config get", "var": var}));
            let got: serde_json::Value = serde_json::from_str(&got).expect("config get is JSON");
            assert_eq!(
                got[var].as_str().and_then(|v| v.parse::<f64>().ok()),
                Some(val.parse().unwrap()),
                "{name}: {got}"
            );
        }
    }
    // The sockets are the clients that serve: a write through the gateway
    // is counted by one of them, and reads back.
    let before = writes_sent(&sockets);
    let out = common::nbdsh(&format!(
        "h.connect_uri({:?})\nh.pwrite(b'\\x5a' * {BS}, 0)\nh.flush()\n\
         print(h.pread({BS}, 0) == b'\\x5a' * {BS})\nh.shutdown()\n",
        gw.uri("vol")
    ));
    assert_eq!(out.trim(), "True", "{}", gw.log());
    let after = writes_sent(&sockets);
    assert!(
        after.iter().zip(&before).any(|(a, b)| a > b),
        "no client counted the write: {before:?} then {after:?}"
    );
    assert!(img.export()[..BS].iter().all(|&b| b == 0x5a));
}
