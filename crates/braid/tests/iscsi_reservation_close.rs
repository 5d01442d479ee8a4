//! A volume that fences by persistent reservation leaves no key behind
//! when it closes, even while a path is still reconnecting: a session
//! that logs in after the volume withdrew its keys must withdraw its own.
//!
//! The path's portal is a relay the test controls, so the reconnect can
//! be held at the door while the volume closes, then let in.

mod common;
mod iscsikit;
mod relaykit;

use std::net::SocketAddr;
use std::time::Duration;

use braid_initiator::{Volume, VolumeConfig};
use common::{free_port, wait_until, Serve};
use iscsikit::Initiator;
use relaykit::Relay;

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";

#[test]
fn a_path_that_reconnects_while_the_volume_closes_leaves_no_key() {
    let port = free_port();
    let _serve = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.2:0",
        "--iscsi",
        &port.to_string(),
        "vol=mem:16MiB",
    ]);
    let direct: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let relay = Relay::start("127.0.0.3:0", format!("127.0.0.2:{port}").parse().unwrap());
    let keys = || Initiator::login(direct, TARGET).registered_keys();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let vol = rt.block_on(async {
        let mut cfg = VolumeConfig::new(
            format!("iscsi://{direct}/{TARGET}/0")
                .parse::<braid_initiator::VolumeUri>()
                .unwrap(),
        );
        cfg.portals = vec![direct, relay.addr];
        cfg.persistent_reservations = true;
        let vol = Volume::open(cfg).await.expect("open the volume");
        vol.write(0, bytes::Bytes::from(vec![7u8; 64 << 10]), true)
            .await
            .expect("a write");
        vol
    });
    assert_eq!(vol.report().paths.len(), 2, "both portals are paths");
    assert_eq!(keys().len(), 2, "each path's session registered a key");
    while relay.accepted.try_recv().is_ok() {}

    // The relayed path fails; its reconnect is held at the door.
    relay.cut_and_hold();
    relay
        .accepted
        .recv_timeout(Duration::from_secs(10))
        .expect("the failed path redials");
    rt.block_on(vol.close());
    relay.open();

    // The reconnect runs to its end, whichever way it ends.
    assert!(
        wait_until(Duration::from_secs(10), || rt.metrics().num_alive_tasks()
            == 0),
        "the volume's tasks ended"
    );
    assert!(
        wait_until(Duration::from_secs(5), || relay.live() == 0),
        "the relayed sessions ended"
    );
    let left = keys();
    assert!(
        left.is_empty(),
        "keys left registered after the volume closed: {left:x?}"
    );
}
