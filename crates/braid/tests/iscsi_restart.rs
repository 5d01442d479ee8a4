//! An initiator learns over iSCSI that braid's target restarted: the first
//! command of each initiator port new to the process (other than INQUIRY,
//! REPORT LUNS and REQUEST SENSE) is answered UNIT ATTENTION, POWER ON,
//! RESET, OR BUS DEVICE RESET OCCURRED (29h/00h), once; and VPD page 0xC0
//! carries the process's
//! instance, the same as NBD's `x-braid:instance`, so that a LOGICAL UNIT
//! RESET by another initiator (29h/03h, nothing lost) is not taken for a
//! restart.

mod common;
mod iscsikit;
mod tgtkit;

use braid_test_needs::needs;

use common::{free_port, nbdsh, Serve};
use iscsikit::{vpd_cdb, who, Initiator, CHECK_CONDITION, GOOD, POWER_ON};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";
const INITIATOR: &str = "iqn.2026-11.org.example:restart";
const TUR: [u8; 6] = [0; 6];

fn serve(port: u16) -> Serve {
    Serve::start(&[
        "--iscsi",
        &port.to_string(),
        "--volume-id",
        "vol=5d1c0a9e-3b7f-4e21-8c6d-2f4a1b9e7c30",
        "vol=mem:16MiB",
    ])
}

/// The instance VPD page 0xC0 carries, after checking page 0x00 lists it.
fn instance(i: &mut Initiator) -> u128 {
    let pages = i.exec(&vpd_cdb(0x00), &[], 255);
    assert_eq!(pages.status, GOOD);
    assert!(
        pages.data[4..].contains(&0xc0),
        "page 0x00: {:?}",
        pages.data
    );
    let page = i.exec(&vpd_cdb(0xc0), &[], 255);
    assert_eq!(page.status, GOOD, "{page:?}");
    braid_iscsi::scsi::decode_instance_page(&page.data)
        .unwrap_or_else(|| panic!("not braid's page: {:?}", page.data))
}

/// What NBD clients are told as `x-braid:instance`.
fn nbd_instance(serve: &Serve) -> u128 {
    let addr = serve.addr();
    let out = nbdsh(&format!(
        "h.set_opt_mode(True)\nh.set_export_name('vol')\nh.connect_tcp({:?}, '{}')\n\
h.add_meta_context('x-braid:instance')\ngot = []\n\
h.opt_list_meta_context(lambda name: got.append(name))\nprint('LISTED', got)\nh.opt_abort()\n",
        addr.ip().to_string(),
        addr.port()
    ));
    let hex = out
        .split("x-braid:instance=")
        .nth(1)
        .and_then(|r| r.get(..32))
        .unwrap_or_else(|| panic!("no instance listed: {out}"));
    u128::from_str_radix(hex, 16).unwrap()
}

#[needs("nbdsh")]
fn a_restart_is_told_by_power_on_and_the_instance_page_and_a_reset_is_not() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut first = serve(port);

    let mut a = Initiator::login_raw_as(addr, TARGET, &who(INITIATOR, 1));
    for (what, cdb) in [
        ("INQUIRY", vec![0x12, 0, 0, 0, 96, 0]),
        ("REPORT LUNS", vec![0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0]),
    ] {
        let r = a.exec(&cdb, &[], 96);
        assert_eq!(r.status, GOOD, "{what} reports no unit attention: {r:?}");
    }
    let r = a.exec(&TUR, &[], 0);
    assert_eq!(
        (r.status, r.sense),
        (CHECK_CONDITION, Some(POWER_ON)),
        "the first command of a new initiator port is told of the power on"
    );
    assert_eq!(a.exec(&TUR, &[], 0).status, GOOD, "once");
    let before = instance(&mut a);
    assert_eq!(before, nbd_instance(&first), "the instance NBD reports");
    assert_eq!(a.logout(), 0);

    // The same port again (a reinstated session): nothing to tell.
    let mut a = Initiator::login_raw_as(addr, TARGET, &who(INITIATOR, 1));
    assert_eq!(a.exec(&TUR, &[], 0).status, GOOD);
    // Another initiator resets the unit: a reset, not a restart.
    let mut b = Initiator::login(addr, TARGET);
    assert_eq!(b.task_management(5, 0xffff_ffff), 0, "LOGICAL UNIT RESET");
    let r = a.exec(&TUR, &[], 0);
    assert_eq!(r.sense, Some((0x6, 0x29, 0x03)), "{r:?}");
    assert_eq!(instance(&mut a), before, "the same process");
    drop((a, b));

    // The process restarts: the port is new to it.
    first.stop();
    let _second = serve(port);
    let mut a = Initiator::login_raw_as(addr, TARGET, &who(INITIATOR, 1));
    let r = a.exec(&TUR, &[], 0);
    assert_eq!((r.status, r.sense), (CHECK_CONDITION, Some(POWER_ON)));
    assert_ne!(instance(&mut a), before, "another process");
}

/// What tgt does, for README's table of targets: the first command of
/// every new session gets 29h/00h, whether tgtd restarted or the same
/// initiator port only logged in again, so to an initiator tgt's unit
/// attention says "new session", not "restart": it cannot tell the two
/// apart, and tgt has no instance to ask. Its file LUNs report the write
/// cache on.
#[needs("root", "tgtd")]
fn what_tgt_tells_of_restarts_and_its_write_cache() {
    const TGT_IQN: &str = "iqn.2026-11.org.example:tgt";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lun.img");
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    let port = free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let start = || {
        let mut t = tgtkit::Tgt::start(&[addr]);
        t.target(1, TGT_IQN, 1, &file, "braid0001");
        t
    };
    // The first two commands of a session of ISID `isid` on tgt's disk.
    let first_two = |isid| {
        let mut i = Initiator::login_raw_as(addr, TGT_IQN, &who(INITIATOR, isid));
        i.lun = 1;
        let first = i.exec(&TUR, &[], 0).sense;
        let second = i.exec(&TUR, &[], 0).sense;
        assert_eq!(i.logout(), 0);
        (first, second)
    };
    let told = (Some(POWER_ON), None);
    let mut tgt = start();
    let mut i = Initiator::login_as(addr, TGT_IQN, &who(INITIATOR, 9));
    i.lun = 1;
    let _ = i.exec(&TUR, &[], 0);
    let caching = i.exec(&[0x1a, 0x08, 0x08, 0, 255, 0], &[], 255);
    assert_eq!(caching.status, GOOD);
    assert_eq!(
        caching.data[4 + 2] & 0x04,
        0x04,
        "tgt's file LUN reports its write cache on (WCE), so an initiator that never \
         flushes (ESXi) may lose acknowledged writes: {caching:?}"
    );
    drop(i);
    assert_eq!(first_two(1), told, "a new port");
    assert_eq!(first_two(1), told, "the same port again, no restart");
    assert_eq!(first_two(2), told, "another port");
    tgt.stop();
    let _tgt = start();
    assert_eq!(first_two(1), told, "after tgtd restarted");
}
