//! The OSD map barrier of a fence, on a throwaway cluster of two OSDs
//! (`scripts/ceph-cluster --osds 2`) where the test cuts chosen daemons
//! off from others on loopback (`cephkit::cut`).
//!
//! A blocklist shuts a stale gateway out only once the OSD holding the
//! data has the map that names it, and an OSD takes a newer map only when
//! the monitor, another OSD or an operation stamped with a newer epoch
//! brings it. The gateway that fences has that map; a client re-sends the
//! fenced writes through whichever gateway it likes, and one still on an
//! older map stamps them with it. On a data OSD that is behind too, the
//! re-sent write then lands, and after it the stale gateway's held one.
//!
//! Other things close that race most of the time, which is why a cluster
//! of one OSD never showed it: the record's removal and the image's header
//! notification go to an OSD that has the map and hands it out with its
//! replies, and a RADOS client that watches an object asks the monitor for
//! a newer map every few seconds. A gateway that hears none of them while
//! the fence runs (slow, or its links to the monitor and that OSD down
//! for a moment) serves the re-sent write on its old map. Here the image's
//! data is on osd.0 and its header and barrier object on osd.1
//! (`Cluster::split_image`); osd.0 hears nothing new from the monitor or
//! osd.1, and the carrier C hears nothing from either, until the fence is
//! confirmed or its barrier is seen waiting for C. Only the barrier, which
//! does not confirm the fence until every live gateway has said it has
//! the newest map, keeps the stale write out; the same test without it
//! sees the stale write land.
//!
//! The roles: A fences (its lease short, so it notices B's running out);
//! B is stale, holding a client's write (a test hook) and stopped so that
//! its lease runs out; C carries the re-sent write.

#![cfg(feature = "rbd")]

mod cephkit;
mod common;

use braid_test_needs::needs;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use cephkit::cut::{ports_of, Cut};
use common::{cmd, signal, ChildGuard, Serve};

const BS: usize = 64 * 1024;

/// A client of `g` that connects now and writes `version` at `offset`
/// once `go` exists, then says "written".
fn writer(
    g: &Serve,
    offset: u64,
    version: u8,
    go: &std::path::Path,
) -> (ChildGuard, mpsc::Receiver<String>) {
    let mut child = ChildGuard::spawn(
        cmd("nbdsh")
            .arg("-c")
            .arg(format!(
                "import os, time\nh.connect_uri({:?})\nprint('ready', flush=True)\n\
                 t = time.time()\nwhile not os.path.exists({:?}) and time.time() - t < 120:\n    \
                 time.sleep(0.02)\nh.pwrite(b'\\x{version:02x}' * {BS}, {offset})\n\
                 print('written', flush=True)\nh.shutdown()\n",
                g.uri("vol"),
                go.display().to_string()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    let (tx, rx) = mpsc::channel();
    let out = child.0.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let ready = rx.recv_timeout(Duration::from_secs(30));
    assert_eq!(ready.as_deref(), Ok("ready"), "{}", g.log());
    (child, rx)
}

/// Waits (bounded) until `done` holds, else fails with the gateways' logs.
fn wait(gateways: &[&Serve], limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    if !common::wait_until(limit, &mut done) {
        let logs: Vec<String> = gateways.iter().map(|g| g.log()).collect();
        panic!("not within {limit:?}: {what}\n{}", logs.join("\n----\n"));
    }
}

/// The two tests cut the same OSDs off: one at a time.
static RACE: Mutex<()> = Mutex::new(());

/// What one run of the race left: the version the cluster holds at the
/// block, whether the fencing gateway's barrier failed first for want of
/// C's answer, whether the re-sent write was acknowledged before the stale
/// gateway resumed, and the three gateways' logs.
struct Outcome {
    version: u8,
    barrier_waited: bool,
    acked_first: bool,
    logs: String,
}

/// B holds version 2 of the block and stops; A fences it while osd.0 and
/// C are cut off as above; once the fence is confirmed, version 3 goes
/// through C, and then B resumes with its held write. `a_env` goes to A.
fn race(c: &cephkit::Cluster, a_env: &[(&str, &str)]) -> Outcome {
    let _one = RACE.lock().unwrap_or_else(|p| p.into_inner());
    let img = c.split_image("barrier", "16M");
    let offset = 0u64;
    let scratch = tempfile::tempdir().unwrap();
    let (hold, go) = (scratch.path().join("hold"), scratch.path().join("go"));
    let hold_env = hold.display().to_string();
    let short = ["--gateway-lease", "3"];
    let a = c.gateway_env(&img, &short, a_env);
    // C's lease outlasts the test: it is never fenced itself.
    let cg = c.gateway(&img, &["--gateway-lease", "120"]);
    let b = c.gateway_env(&img, &short, &[("BRAID_TEST_HOLD_RBD_WRITES", &hold_env)]);
    wait(
        &[&a, &b, &cg],
        Duration::from_secs(30),
        "three records",
        || img.gateways().len() == 3,
    );
    let out = common::nbdsh(&format!(
        "h.connect_uri({:?})\nh.pwrite(b'\\x01' * {BS}, {offset})\nh.flush()\nprint('ok')\n",
        cg.uri("vol")
    ));
    assert_eq!(out.trim(), "ok", "version 1 through C:\n{}", cg.log());
    // B takes version 2 and holds it; its client is gone, nothing re-sends
    // it but the client below that writes version 3.
    std::fs::write(&hold, b"").unwrap();
    let client = ChildGuard::spawn(
        cmd("nbdsh")
            .arg("-c")
            .arg(format!(
                "import time\nh.connect_uri({:?})\nh.aio_pwrite(b'\\x02' * {BS}, {offset})\n\
                 time.sleep(60)\n",
                b.uri("vol")
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    wait(
        &[&a, &b, &cg],
        Duration::from_secs(30),
        "B holds version 2",
        || b.log().contains("TEST HOOK: holding a write"),
    );
    drop(client);
    let (mut v3, said) = writer(&cg, offset, 3, &go);
    common::stop(b.pid());
    let (mon, osd0, osd1) = (
        c.mon_port(),
        ports_of(c.daemon_pid("osd.0")),
        ports_of(c.daemon_pid("osd.1")),
    );
    let from: Vec<u16> = osd1.iter().copied().chain([mon]).collect();
    let to: Vec<u16> = osd0.iter().copied().chain(ports_of(b.pid())).collect();
    // osd.0 (and stopped B) hear nothing new: no map from the monitor or
    // from osd.1. C hears nothing from either: no header notification, no
    // map handed out with a reply, no barrier notification, and none of
    // the maps its RADOS client asks the monitor for every few seconds
    // while it watches an object.
    let behind = Cut::new("osd.0 and B behind on maps", &from, &to);
    let deaf = Cut::new(
        "C deaf to osd.1 and the monitor",
        &from,
        &ports_of(cg.pid()),
    );
    wait(
        &[&a, &b, &cg],
        Duration::from_secs(30),
        "A fences B",
        || a.log().contains("ran out: fencing it"),
    );
    // The fence is confirmed, or its barrier waits for C, which cannot
    // answer: C then hears from osd.1 and the monitor again, as when a
    // fault ends.
    let fenced = |a: &Serve| a.log().contains("gateway fenced");
    wait(
        &[&a, &b, &cg],
        Duration::from_secs(30),
        "the fence confirmed or waiting",
        || fenced(&a) || a.log().contains("did not confirm the newest OSD map"),
    );
    let barrier_waited = !fenced(&a);
    drop(deaf);
    wait(
        &[&a, &b, &cg],
        Duration::from_secs(60),
        "the fence confirmed",
        || fenced(&a),
    );
    // The client's re-sent write goes through C once the fence is
    // confirmed, as braid's initiator sends it.
    std::fs::write(&go, b"").unwrap();
    let acked_early = said.recv_timeout(Duration::from_secs(3)).is_ok();
    // B resumes; its held write goes to osd.0.
    let writes = c.osd_writes(0);
    std::fs::remove_file(&hold).unwrap();
    signal(b.pid(), libc::SIGCONT);
    wait(
        &[&a, &b, &cg],
        Duration::from_secs(20),
        "B's held write reached osd.0",
        || c.osd_writes(0) > writes,
    );
    drop(behind);
    let deadline = Instant::now() + Duration::from_secs(60);
    let acked =
        acked_early || said.recv_timeout(deadline - Instant::now()).as_deref() == Ok("written");
    assert!(acked, "version 3 never acknowledged\nC:\n{}", cg.log());
    let _ = v3.0.wait();
    let data = img.export();
    let at = offset as usize;
    let version = (1..=3)
        .find(|&v| data[at..at + BS].iter().all(|&b| b == v))
        .unwrap_or(0);
    let logs = format!("A:\n{}\nB:\n{}\nC:\n{}", a.log(), b.log(), cg.log());
    Outcome {
        version,
        barrier_waited,
        acked_first: acked_early,
        logs,
    }
}

#[needs("root", "ceph-mon", "nbdsh", "nft", "ss")]
fn a_fence_is_confirmed_only_once_every_gateway_has_the_map_so_no_stale_write_lands_after() {
    let Some(c) = cephkit::cut::ceph_two_osds() else {
        return;
    };
    let o = race(c, &[]);
    assert!(
        o.barrier_waited,
        "the barrier never waited for C: the race was not set up\n{}",
        o.logs
    );
    assert_eq!(
        o.version, 3,
        "the stale gateway's held write landed over the re-sent one\n{}",
        o.logs
    );
}

#[needs("root", "ceph-mon", "nbdsh", "nft", "ss")]
fn without_the_barrier_the_stale_write_lands_over_the_one_a_gateway_on_an_older_map_served() {
    let Some(c) = cephkit::cut::ceph_two_osds() else {
        return;
    };
    // What the barrier prevents: proof that the test above can fail.
    let o = race(c, &[("BRAID_DANGER_NO_BARRIER", "1")]);
    assert!(
        o.logs
            .contains("TEST HOOK: confirming the fence without the OSD map barrier"),
        "{}",
        o.logs
    );
    assert!(
        o.acked_first,
        "the re-sent write was not acknowledged before the stale gateway resumed\n{}",
        o.logs
    );
    assert_eq!(
        o.version, 2,
        "the stale write should land over the acknowledged one\n{}",
        o.logs
    );
}
