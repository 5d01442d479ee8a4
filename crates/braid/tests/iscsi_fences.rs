//! Which fence braid's iSCSI initiator uses for which target, each shown
//! against tgt with the write of a failed path still in tgt's backing
//! store (see `fencekit`): a stale write must never land after its
//! re-sent copy and a newer write.
//!
//! tgt ends a reinstated session's connection but lets the tasks already
//! in its backing store run on, and completes the new login at once, so
//! session reinstatement alone is no fence there; a unit braid knows no
//! fence for has the failed path's writes held until the no-path
//! timeout fails them. tgt has no PREEMPT AND ABORT, so
//! `--persistent-reservations` is refused at open.
//!
//! Needs root (tgtd's control socket, the FUSE mount) and tgt.

mod common;
mod fencekit;
mod relaykit;
mod tgtkit;

use braid_test_needs::needs;

use std::net::SocketAddr;
use std::time::Duration;

use braid_initiator::{Volume, VolumeConfig};
use common::free_port;
use fencekit::{rt, Outcome};
use relaykit::Relay;
use tgtkit::Tgt;

const IQN: &str = "iqn.2026-11.org.example:disk";

/// tgt on one portal with LUN 1 on `file`; `params` for the unit.
fn tgt(file: &std::path::Path, params: Option<&str>) -> (Tgt, SocketAddr) {
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut tgt = Tgt::start(&[addr]);
    tgt.target(1, IQN, 1, file, "fence0001");
    if let Some(p) = params {
        tgt.lun_params(1, 1, p);
    }
    (tgt, addr)
}

/// A volume of two paths to `direct`: the first through `relay`.
fn config(direct: SocketAddr, relay: &Relay) -> VolumeConfig {
    let mut cfg = VolumeConfig::new(
        format!("iscsi://{direct}/{IQN}/1")
            .parse::<braid_initiator::VolumeUri>()
            .unwrap(),
    );
    cfg.portals = vec![relay.addr, direct];
    cfg.initiator_name = Some("iqn.2026-11.org.example:braid".into());
    cfg
}

/// The held-write scenario against tgt, its unit given `params`; the
/// outcome, the restarts the volume saw and its fence.
fn held_write(params: Option<&str>, no_path: Option<Duration>) -> (Outcome, u64, &'static str) {
    let dir = tempfile::tempdir().unwrap();
    let pc = fencekit::mount(dir.path(), 16 << 20);
    let (mut tgt, direct) = tgt(pc.file(), params);
    let relay = Relay::start("127.0.0.3:0", direct);
    let seen = rt().block_on(async {
        let mut cfg = config(direct, &relay);
        cfg.no_path_timeout = no_path.or(cfg.no_path_timeout);
        let vol = Volume::open(cfg).await.expect("open");
        let delay = Duration::from_millis(1500);
        let out = fencekit::stale_write(&vol, &pc, &relay, delay, Duration::from_secs(30)).await;
        let restarts = vol.report().counters.restarts;
        vol.close().await;
        (out, restarts, vol.info().fence)
    });
    tgt.stop();
    seen
}

#[needs("root", "tgtd")]
fn tgt_a_write_held_in_the_backing_store_never_lands_after_its_resent_copy() {
    let (out, restarts, fence) = held_write(None, None);
    out.assert_fenced("the failed path's write landed after its re-sent copy and v2");
    assert_eq!(fence, "reinstatement+lu-reset");
    assert_eq!(
        restarts, 0,
        "the unit attention of the fence's own LOGICAL UNIT RESET was taken for a restart"
    );
}

#[needs("root", "tgtd")]
fn a_unit_braid_knows_no_fence_for_holds_a_failed_paths_writes_until_the_no_path_timeout() {
    // tgt as another vendor's target: braid cannot tell what fences it.
    let (out, _, fence) = held_write(
        Some("vendor_id=ACME,product_id=STORAGE"),
        Some(Duration::from_secs(2)),
    );
    assert_eq!(fence, "held");
    assert!(
        out.v1.is_err(),
        "the failed path's write was re-sent without a fence: {out:?}"
    );
    assert!(
        out.v2.is_err(),
        "a newer write to the block went out while the stale one could still land: {out:?}"
    );
    assert_eq!(out.found, 1, "{out:?}");
}

#[needs("root", "tgtd")]
fn tgt_has_no_preempt_and_abort_so_persistent_reservations_are_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let file = common::sparse_file(dir.path(), "lun.img", 16 << 20);
    let (mut tgt, direct) = tgt(&file, None);
    let relay = Relay::start("127.0.0.3:0", direct);
    let (opened, keys) = rt().block_on(async {
        let mut cfg = config(direct, &relay);
        cfg.persistent_reservations = true;
        let opened = match Volume::open(cfg).await {
            Ok(vol) => {
                vol.close().await;
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        };
        (opened, fencekit::registered_keys(direct, IQN, 1).await)
    });
    tgt.stop();
    let e = opened.expect_err("opened with a reservation fence that can never be confirmed");
    assert!(e.contains("PREEMPT AND ABORT"), "{e}");
    assert!(e.contains("leave out --persistent-reservations"), "{e}");
    assert!(keys.is_empty(), "braid left keys registered: {keys:x?}");
}
