//! The iSCSI write cache, through a power cut and a restart.
//!
//! VMware ESXi never sends SYNCHRONIZE CACHE, so braid's iSCSI units are
//! write-through unless told otherwise: WCE is 0 and every WRITE is on
//! stable storage before it is answered GOOD. The export is a file on
//! `braid-powercut`, which forgets on command every write not yet made
//! durable: a WRITE acknowledged without any SYNCHRONIZE CACHE survives
//! the cut; with the cache turned on (`--iscsi-write-cache`, for
//! initiators that flush) the same WRITE is lost, which shows the cut
//! bites. An initiator's MODE SELECT outlives a restart.
//!
//! Mounting needs root; the restart test does not.

mod common;
mod iscsikit;

use braid_test_needs::needs;

use std::path::Path;
use std::time::{Duration, Instant};

use braid_powercut::PowerCut;
use common::{free_port, signal, Serve};
use iscsikit::{Initiator, GOOD};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";
const BLOCKS: u16 = 64;

fn start(file: &Path, state: &Path, port: u16, extra: &[&str]) -> Serve {
    let mut args = vec![
        "--iscsi".to_owned(),
        port.to_string(),
        "--state-dir".into(),
        state.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push(format!("vol={}", file.display()));
    Serve::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The server stops on the spot, the power goes (no dirty sector kept),
/// then the process is gone and power is back.
fn power_cut(serve: &mut Serve, pc: &PowerCut) {
    common::stop(serve.pid());
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

/// MODE SELECT(6) of the caching page with WCE `on`.
fn set_write_cache(i: &mut Initiator, on: bool) {
    let mut page = vec![0u8; 4];
    page.extend_from_slice(&[0x08, 0x12, if on { 0x04 } else { 0 }]);
    page.resize(4 + 20, 0);
    let r = i.exec(&[0x15, 0x10, 0, 0, page.len() as u8, 0], &page, 0);
    assert_eq!((r.status, r.sense), (GOOD, None), "MODE SELECT");
}

fn data(fill: u8) -> Vec<u8> {
    vec![fill; usize::from(BLOCKS) * 512]
}

/// A file on braid-powercut in `dir`, unmounted when dropped.
fn powercut_disk(dir: &Path) -> PowerCut {
    let at = dir.join("mnt");
    std::fs::create_dir(&at).unwrap();
    PowerCut::mount(&at, "disk.img", 4 << 20).expect("mounting braid-powercut")
}

#[needs("root")]
fn a_write_acknowledged_without_synchronize_cache_survives_a_power_cut() {
    let dir = tempfile::tempdir().unwrap();
    let pc = powercut_disk(dir.path());
    let state = dir.path().join("state");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();

    // As ESXi writes: WRITE(10) without FUA, and never a SYNCHRONIZE CACHE.
    let mut serve = start(pc.file(), &state, port, &[]);
    let mut i = Initiator::login(addr, TARGET);
    i.write10(0, &data(0xa1));
    drop(i);
    power_cut(&mut serve, &pc);
    let mut serve = start(pc.file(), &state, port, &[]);
    let mut i = Initiator::login(addr, TARGET);
    assert_eq!(
        i.read10(0, BLOCKS),
        data(0xa1),
        "a WRITE answered GOOD was lost in the power cut"
    );
    assert!(!write_cache(&mut i), "MODE SENSE shows the cache off");

    // An initiator that flushes may have the cache: then the same WRITE,
    // unflushed, is lost (the cut bites).
    drop(i);
    serve.stop();
    let mut serve = start(pc.file(), &state, port, &["--iscsi-write-cache", "vol"]);
    let mut i = Initiator::login(addr, TARGET);
    assert!(write_cache(&mut i), "--iscsi-write-cache turns it on");
    i.write10(0, &data(0xb2));
    drop(i);
    power_cut(&mut serve, &pc);
    let _serve = start(pc.file(), &state, port, &["--iscsi-write-cache", "vol"]);
    let mut i = Initiator::login(addr, TARGET);
    assert_ne!(
        i.read10(0, BLOCKS),
        data(0xb2),
        "with the cache on, an unflushed write was lost (the cut works)"
    );
}

/// An initiator's choice of the write cache (MODE SELECT) is kept in the
/// state directory under the volume's identity: a restarted server still
/// answers MODE SENSE with it, and a unit another export of the same name
/// (another volume) does not inherit it.
#[test]
fn mode_select_of_the_write_cache_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk.img");
    std::fs::write(&file, vec![0u8; 4 << 20]).unwrap();
    let state = dir.path().join("state");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();

    let mut serve = start(&file, &state, port, &[]);
    let mut i = Initiator::login(addr, TARGET);
    assert!(!write_cache(&mut i));
    set_write_cache(&mut i, true);
    assert!(write_cache(&mut i));
    drop(i);
    assert!(serve.stop().success());

    let mut serve = start(&file, &state, port, &[]);
    let mut i = Initiator::login(addr, TARGET);
    assert!(write_cache(&mut i), "the initiator's choice was forgotten");
    set_write_cache(&mut i, false);
    drop(i);
    assert!(serve.stop().success());
    let mut serve = start(&file, &state, port, &[]);
    let mut i = Initiator::login(addr, TARGET);
    assert!(!write_cache(&mut i), "and so was turning it off again");
    drop(i);
    assert!(serve.stop().success());

    // Another file under the same export name is another volume.
    let other = dir.path().join("other.img");
    std::fs::write(&other, vec![0u8; 4 << 20]).unwrap();
    let mut serve = start(&file, &state, port, &[]);
    let mut i = Initiator::login(addr, TARGET);
    set_write_cache(&mut i, true);
    drop(i);
    assert!(serve.stop().success());
    let _serve = start(&other, &state, port, &[]);
    let mut i = Initiator::login(addr, TARGET);
    assert!(!write_cache(&mut i), "kept by volume identity, not by name");
}
