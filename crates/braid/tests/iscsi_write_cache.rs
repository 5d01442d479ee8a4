//! The iSCSI write cache setting, through a power cut: the export is a
//! file on `braid-powercut`, which forgets on command every write not yet
//! made durable. With the write cache on (the default), a WRITE without
//! FUA or SYNCHRONIZE CACHE may be lost, and here is; once an initiator
//! turns it off with MODE SELECT (as Windows' "write caching" switch
//! does), every acknowledged WRITE survives the cut.
//!
//! Mounting needs root.

mod common;
mod iscsikit;

use std::path::Path;
use std::time::{Duration, Instant};

use braid_powercut::PowerCut;
use common::{free_port, need_root, signal, Serve};
use iscsikit::{Initiator, GOOD};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";
const BLOCKS: u16 = 64;

fn start(file: &Path, state: &Path, port: u16) -> Serve {
    Serve::start(&[
        "--iscsi",
        &port.to_string(),
        "--state-dir",
        state.to_str().unwrap(),
        &format!("vol={}", file.display()),
    ])
}

/// The server stops on the spot, the power goes (no dirty sector kept),
/// then the process is gone and power is back.
fn power_cut(serve: &mut Serve, pc: &PowerCut) {
    signal(serve.pid(), libc::SIGSTOP);
    pc.power_off(0.0, 1);
    signal(serve.pid(), libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(20);
    while serve.alive() {
        assert!(Instant::now() < deadline, "braid serve did not die");
        std::thread::sleep(Duration::from_millis(10));
    }
    pc.power_on();
}

/// The caching mode page as MODE SENSE(6) shows it now: WCE's bit.
fn write_cache(i: &mut Initiator) -> bool {
    let r = i.exec(&[0x1a, 0x08, 0x08, 0, 255, 0], &[], 255);
    assert_eq!(r.status, GOOD, "MODE SENSE");
    r.data[4 + 2] & 0x04 != 0
}

#[cfg_attr(
    braid_skip = "root",
    ignore = "needs root (FUSE mounts): run as root, or scripts/test-all"
)]
#[test]
fn with_the_write_cache_off_every_acknowledged_write_survives_a_power_cut() {
    if !need_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("mnt");
    std::fs::create_dir(&at).unwrap();
    let pc = PowerCut::mount(&at, "disk.img", 4 << 20).expect("mounting braid-powercut");
    let file = at.join("disk.img");
    let state = dir.path().join("state");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let data = |fill: u8| vec![fill; usize::from(BLOCKS) * 512];

    // Cache on: acknowledged, never flushed, gone with the power.
    let mut serve = start(&file, &state, port);
    let mut i = Initiator::login(addr, TARGET);
    assert!(write_cache(&mut i), "the write cache starts on");
    i.write10(0, &data(0xa1));
    drop(i);
    power_cut(&mut serve, &pc);
    let mut serve = start(&file, &state, port);
    let mut i = Initiator::login(addr, TARGET);
    assert_ne!(
        i.read10(0, BLOCKS),
        data(0xa1),
        "with the cache on, an unflushed write was lost (the cut works)"
    );

    // Cache off: MODE SELECT(6) with the caching page, WCE cleared.
    let mut page = vec![0u8; 4];
    page.extend_from_slice(&[0x08, 0x12, 0x00]);
    page.resize(4 + 20, 0);
    let r = i.exec(&[0x15, 0x10, 0, 0, page.len() as u8, 0], &page, 0);
    assert_eq!((r.status, r.sense), (GOOD, None), "MODE SELECT");
    assert!(!write_cache(&mut i), "MODE SENSE shows the cache off");
    i.write10(0, &data(0xb2));
    drop(i);
    power_cut(&mut serve, &pc);
    let _serve = start(&file, &state, port);
    let mut i = Initiator::login(addr, TARGET);
    assert_eq!(
        i.read10(0, BLOCKS),
        data(0xb2),
        "with the cache off, an acknowledged write survived the cut"
    );
    assert!(write_cache(&mut i), "a restart turns the cache back on");
}
