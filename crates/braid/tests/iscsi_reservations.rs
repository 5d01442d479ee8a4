//! Persistent reservations on braid's iSCSI target, as clusters use them:
//! a PREEMPT AND ABORT fences the node it preempts (a write that node had
//! queued never lands, and its next one meets RESERVATION CONFLICT), and
//! registrations and the reservation survive a restart of `braid serve`
//! when the initiator asked for that (APTPL). Saving them does not stop
//! the server, and their answer waits for the save.

mod common;
mod iscsikit;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_iscsi_target::IscsiConfig;
use braid_store::backend::FileBackend;
use braid_store::Export;
use common::{free_port, sparse_file, Serve};
use iscsikit::inproc::{InProcess, IscsiOnly};
use iscsikit::{who, Initiator, GOOD, RESERVATION_CONFLICT};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";

/// PERSISTENT RESERVE OUT `action` of type `kind` with the two keys.
fn prout(i: &mut Initiator, action: u8, kind: u8, key: u64, sa_key: u64, aptpl: bool) -> u8 {
    let itt = send_prout(i, action, kind, key, sa_key, aptpl);
    i.wait(itt).status
}

/// Sends what [`prout`] runs; returns its task tag.
fn send_prout(i: &mut Initiator, action: u8, kind: u8, key: u64, sa_key: u64, aptpl: bool) -> u32 {
    let cdb = [0x5f, action, kind, 0, 0, 0, 0, 0, 24, 0];
    let mut params = key.to_be_bytes().to_vec();
    params.extend_from_slice(&sa_key.to_be_bytes());
    params.extend_from_slice(&[0, 0, 0, 0, u8::from(aptpl), 0, 0, 0]);
    i.send_command(&cdb, &params, 0)
}

/// PERSISTENT RESERVE IN `action`.
fn prin(i: &mut Initiator, action: u8) -> Vec<u8> {
    let r = i.exec(&[0x5e, action, 0, 0, 0, 0, 0, 0x02, 0, 0], &[], 512);
    assert_eq!(r.status, GOOD, "PERSISTENT RESERVE IN {action}");
    r.data
}

const WRITE_EXCLUSIVE: u8 = 1;
const REGISTER: u8 = 0;
const RESERVE: u8 = 1;
const PREEMPT_AND_ABORT: u8 = 5;

#[test]
fn preempt_and_abort_fences_the_preempted_nodes_queued_write() {
    let srv = InProcess::start(&["127.0.0.1", "127.0.0.2"]);
    let (node_a, node_b) = (
        "iqn.2026-11.org.example:node-a",
        "iqn.2026-11.org.example:node-b",
    );
    let mut a = Initiator::login_as(srv.portals[0], TARGET, &who(node_a, 1));
    let mut b = Initiator::login_as(srv.portals[1], TARGET, &who(node_b, 1));
    assert_eq!(prout(&mut a, REGISTER, 0, 0, 0xa, false), GOOD);
    assert_eq!(prout(&mut b, REGISTER, 0, 0, 0xb, false), GOOD);
    assert_eq!(prout(&mut a, RESERVE, WRITE_EXCLUSIVE, 0xa, 0, false), GOOD);
    a.write10(40, &[1; 512]);
    let r = b.exec(&iscsikit::write10_cdb(41, 1), &[2; 512], 0);
    assert_eq!(
        r.status, RESERVATION_CONFLICT,
        "b does not hold the reservation"
    );

    // Node a stalls with a write queued (held before the disk), and the
    // cluster fails over to b, which fences a and writes the block.
    srv.handle.hold(node_a, true);
    let stale = a.send_command(&iscsikit::write10_cdb(40, 1), &[0xaa; 512], 0);
    a.ping();
    assert_eq!(
        prout(&mut b, PREEMPT_AND_ABORT, WRITE_EXCLUSIVE, 0xb, 0xa, false),
        GOOD
    );
    b.write10(40, &[0xbb; 512]);
    srv.handle.hold(node_a, false);

    // a learns it was preempted, and its next write is refused.
    let r = a.exec(&[0; 6], &[], 0);
    assert_eq!(r.sense, Some((0x6, 0x2a, 0x05)), "REGISTRATIONS PREEMPTED");
    let r = a.exec(&iscsikit::write10_cdb(40, 1), &[0xcc; 512], 0);
    assert_eq!(r.status, RESERVATION_CONFLICT);
    assert!(!a.answered(stale), "the aborted write is not answered");
    assert_eq!(
        srv.read(40 * 512, 512),
        [0xbb; 512],
        "the preempted node's queued write never landed"
    );
    assert_eq!(b.registered_keys(), [0xb]);
}

#[test]
fn reservations_survive_a_restart_when_asked_to_and_only_then() {
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "disk.img", 4 << 20);
    let state = dir.path().join("state");
    let port = free_port();
    let start = || {
        Serve::start(&[
            "--listen",
            "127.0.0.1:0",
            "--iscsi",
            &port.to_string(),
            "--state-dir",
            state.to_str().unwrap(),
            &format!("vol={}", disk.display()),
        ])
    };
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let (node_a, node_b) = (
        "iqn.2026-11.org.example:node-a",
        "iqn.2026-11.org.example:node-b",
    );

    let srv = start();
    let mut a = Initiator::login_as(addr, TARGET, &who(node_a, 1));
    assert_eq!(prout(&mut a, REGISTER, 0, 0, 0x5eed, true), GOOD);
    assert_eq!(
        prout(&mut a, RESERVE, WRITE_EXCLUSIVE, 0x5eed, 0, false),
        GOOD
    );
    drop(a);
    drop(srv);

    let srv = start();
    let mut b = Initiator::login_as(addr, TARGET, &who(node_b, 1));
    assert_eq!(b.registered_keys(), [0x5eed], "the registration came back");
    let reservation = prin(&mut b, 1);
    assert_eq!(reservation[8..16], 0x5eedu64.to_be_bytes());
    assert_eq!(reservation[21], WRITE_EXCLUSIVE);
    assert_eq!(prin(&mut b, 2)[3] & 0x01, 1, "PTPL_A");
    let r = b.exec(&iscsikit::write10_cdb(0, 1), &[9; 512], 0);
    assert_eq!(r.status, RESERVATION_CONFLICT, "still reserved for a");
    let mut a = Initiator::login_as(addr, TARGET, &who(node_a, 1));
    a.write10(0, &[7; 512]);
    // Registered again without APTPL: the next restart forgets it all.
    assert_eq!(prout(&mut a, REGISTER, 0, 0x5eed, 0x5eed, false), GOOD);
    drop((a, b));
    drop(srv);

    let _srv = start();
    let mut b = Initiator::login_as(addr, TARGET, &who(node_b, 1));
    assert_eq!(b.registered_keys(), Vec::<u64>::new());
    b.write10(0, &[9; 512]);
}

/// The relative target port VPD page 0x83 names for this path.
fn relative_port(i: &mut Initiator) -> u16 {
    let page = i.exec(&iscsikit::vpd_cdb(0x83), &[], 256);
    assert!(page.good(), "{page:?}");
    let (port, _) = iscsikit::vpd::msdsm_port(&iscsikit::vpd::designators(&page.data));
    port.expect("a relative target port designator")
}

/// A portal keeps its relative port id across a restart with `--listen`
/// in another order and an address more, and so the registration made
/// through it: READ FULL STATUS shows it on the same relative port, and
/// the same path can withdraw it.
#[test]
fn a_portal_keeps_its_port_and_its_registrations_when_listen_is_reordered() {
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "disk.img", 4 << 20);
    let state = dir.path().join("state");
    let port = free_port();
    let start = |listen: &[&str]| {
        let listen: Vec<String> = listen.iter().map(|a| format!("{a}:0")).collect();
        let mut args: Vec<&str> = Vec::new();
        for l in &listen {
            args.extend(["--listen", l]);
        }
        let port = port.to_string();
        let state = state.to_str().unwrap();
        let vol = format!("vol={}", disk.display());
        args.extend(["--iscsi", &port, "--state-dir", state, &vol]);
        Serve::start(&args)
    };
    let portal_b = format!("127.0.0.2:{port}").parse().unwrap();
    let node = who("iqn.2026-11.org.example:node-b", 1);

    let srv = start(&["127.0.0.1", "127.0.0.2"]);
    let mut b = Initiator::login_as(portal_b, TARGET, &node);
    let before = relative_port(&mut b);
    assert_eq!(prout(&mut b, REGISTER, 0, 0, 0xb0b, true), GOOD);
    drop(b);
    drop(srv);

    let _srv = start(&["127.0.0.2", "127.0.0.1", "127.0.0.3"]);
    let mut b = Initiator::login_as(portal_b, TARGET, &node);
    assert_eq!(relative_port(&mut b), before, "portal B's relative port id");
    let full = prin(&mut b, 3);
    assert_eq!(
        (&full[8..16], u16::from_be_bytes([full[26], full[27]])),
        (&0xb0bu64.to_be_bytes()[..], before),
        "READ FULL STATUS: the key, registered through portal B's relative port"
    );
    assert_eq!(
        prout(&mut b, REGISTER, 0, 0xb0b, 0, false),
        GOOD,
        "the same path withdraws its registration"
    );
    assert_eq!(b.registered_keys(), Vec::<u64>::new());
}

/// Waits up to `limit` for `done`; whether it came.
fn within(limit: Duration, done: impl Fn() -> bool) -> bool {
    let end = Instant::now() + limit;
    while !done() {
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// A save of the reservations on a stalled disk (held before its fsync)
/// stops nothing but its own answer: another session's READs keep being
/// answered while it waits, on a server of one worker thread, where a
/// save made on that thread would stop every session; and the PERSISTENT
/// RESERVE OUT that asked for it is answered GOOD only once it has
/// ended.
#[test]
fn a_slow_save_of_reservations_holds_its_answer_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let volume = uuid::Uuid::new_v4();
    let export = Arc::new(Export::local(
        "vol",
        "memory",
        Arc::new(FileBackend::memory(4 << 20).expect("a memory volume")),
        false,
        volume,
    ));
    let cfg = IscsiConfig {
        state_dir: Some(state.clone()),
        ..IscsiConfig::default()
    };
    let srv = IscsiOnly::serving_on(1, cfg, export);
    let mut a = Initiator::login_as(srv.addr, TARGET, &who("iqn.2026-11.org.example:node-a", 1));
    let mut b = Initiator::login_as(srv.addr, TARGET, &who("iqn.2026-11.org.example:node-b", 1));

    srv.handle.hold_saves(true);
    let itt = send_prout(&mut a, REGISTER, 0, 0, 0x5eed, true);
    assert!(
        within(Duration::from_secs(10), || srv.handle.saves_waiting() == 1),
        "the REGISTER's save never began"
    );
    let (reads, going) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(true)),
    );
    let reader = {
        let (reads, going) = (reads.clone(), going.clone());
        std::thread::spawn(move || {
            while going.load(Ordering::Acquire) {
                assert_eq!(b.read10(0, 8), vec![0; 4096]);
                reads.fetch_add(1, Ordering::AcqRel);
            }
            b
        })
    };
    within(Duration::from_secs(5), || {
        reads.load(Ordering::Acquire) >= 10
    });
    let during = reads.load(Ordering::Acquire);
    let unanswered = a.silent_for(Duration::from_millis(300));
    let still_saving = srv.handle.saves_waiting();
    going.store(false, Ordering::Release);
    srv.handle.hold_saves(false);
    let mut b = reader.join().expect("the reader");
    assert!(
        during > 0,
        "{during} reads answered while the save was in progress"
    );
    assert!(
        unanswered && still_saving == 1,
        "the PERSISTENT RESERVE OUT was answered before its save had ended"
    );
    assert_eq!(a.wait(itt).status, GOOD, "the REGISTER, once saved");
    assert_eq!(b.registered_keys(), [0x5eed]);
    let saved = state.join("reservations").join(volume.to_string());
    assert!(saved.exists(), "{} was saved", saved.display());
}

/// `braid bench --persistent-reservations`: every path registers and the
/// unit is reserved while the volume is open, and nothing is left
/// registered after; a unit another initiator has reserved is refused at
/// open, naming why, and braid's registration is withdrawn.
#[test]
fn braid_holds_a_reservation_only_while_the_volume_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let disk = sparse_file(dir.path(), "disk.img", 16 << 20);
    let _serve = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.2:0",
        "--iscsi",
        &port.to_string(),
        &format!("vol={}", disk.display()),
    ]);
    let uri = format!("iscsi://127.0.0.1:{port}/{TARGET}/0");
    let bench = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_braid"))
            .args([
                "bench", &uri, "--rw", "randrw", "--bs", "64k", "--time", "0.5",
            ])
            .args(["--verify", "--json", "--persistent-reservations"])
            .env("NO_COLOR", "1")
            .output()
            .expect("braid runs")
    };
    let out = bench();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench JSON");
    assert_eq!(j["paths"].as_array().map(Vec::len), Some(2), "{j}");
    assert_eq!(
        (j["errors"].as_u64(), j["verify_errors"].as_u64()),
        (Some(0), Some(0))
    );

    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut other = Initiator::login_as(addr, TARGET, &who("iqn.2026-11.org.example:other", 3));
    assert!(
        other.registered_keys().is_empty(),
        "left registered: {:x?}",
        other.registered_keys()
    );
    assert_eq!(prout(&mut other, REGISTER, 0, 0, 0xabc, false), GOOD);
    assert_eq!(
        prout(&mut other, RESERVE, WRITE_EXCLUSIVE, 0xabc, 0, false),
        GOOD
    );
    let out = bench();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "opened a unit reserved by another initiator"
    );
    assert!(
        stderr.contains("another initiator holds a reservation on the unit"),
        "{stderr}"
    );
    assert_eq!(
        other.registered_keys(),
        [0xabc],
        "braid's key was not withdrawn"
    );
}
