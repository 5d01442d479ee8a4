//! iSCSI on every gateway of a Ceph RBD image, on a real throwaway
//! cluster (`cephkit`): two gateways serve the image over NBD and iSCSI at
//! once, and a gateway that the other blocklists (stalled past its lease)
//! closes its iSCSI sessions and drains them before it reconnects to the
//! cluster as a new client, so that an iSCSI write it held never lands
//! after a newer write made through the other gateway.

#![cfg(feature = "rbd")]

mod cephkit;
mod common;
mod iscsikit;

use braid_test_needs::needs;

use std::time::Duration;

use common::{free_port, signal, Serve};
use iscsikit::Initiator;

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";

/// 64 KiB of version `v` (128 blocks of 512 bytes).
fn version(v: u8) -> Vec<u8> {
    (0..64 * 1024)
        .map(|i| v.wrapping_mul(31).wrapping_add((i % 251) as u8))
        .collect()
}

/// Which of versions 1..=3 the image's first 64 KiB hold (0: none).
fn held_version(data: &[u8]) -> u8 {
    (1..=3)
        .find(|v| data[..64 * 1024] == version(*v)[..])
        .unwrap_or(0)
}

/// A gateway of `img` with iSCSI on its own port; returns it and its
/// iSCSI portal.
fn gateway(
    c: &cephkit::Cluster,
    img: &cephkit::Image,
    lease: &str,
    env: &[(&str, &str)],
) -> (Serve, std::net::SocketAddr) {
    let port = free_port();
    let g = c.gateway_env(
        img,
        &["--gateway-lease", lease, "--iscsi", &port.to_string()],
        env,
    );
    let addr = std::net::SocketAddr::new(g.addr().ip(), port);
    (g, addr)
}

/// Waits (bounded) until `g`'s log contains `what`; whether it did.
fn logs(g: &Serve, what: &str, limit: Duration) -> bool {
    common::wait_until(limit, || g.log().contains(what))
}

#[needs("ceph-mon")]
fn a_blocklisted_gateway_drains_its_iscsi_sessions_before_it_reconnects() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("iscsi-fence", "16M", Some("layering"));
    let dir = tempfile::tempdir().unwrap();
    let hold = dir.path().join("hold-writes");
    let hold_env = hold.display().to_string();
    let (a, a_iscsi) = gateway(c, &img, "3", &[]);
    let (b, b_iscsi) = gateway(
        c,
        &img,
        "3",
        &[("BRAID_TEST_HOLD_RBD_WRITES", hold_env.as_str())],
    );
    let mut via_a = Initiator::login(a_iscsi, TARGET);
    let mut via_b = Initiator::login(b_iscsi, TARGET);
    via_b.write10(0, &version(1));
    // Version 2 goes to B, which holds it inside, past the point where a
    // write has taken its place in the gateway and before librbd.
    std::fs::write(&hold, b"").unwrap();
    let held = via_b.send_command(&iscsikit::write10_cdb(0, 128), &version(2), 0);
    assert!(
        logs(&b, "TEST HOOK: holding a write", Duration::from_secs(20)),
        "B never held version 2:\n{}",
        b.log()
    );
    // B stalls past its lease: A blocklists it.
    common::stop(b.pid());
    assert!(
        logs(&a, "gateway fenced: blocklisted", Duration::from_secs(30)),
        "A never fenced the stalled B:\nA:\n{}",
        a.log()
    );
    via_a.write10(0, &version(3));
    signal(b.pid(), libc::SIGCONT);
    assert!(
        logs(&b, "lost its right to write", Duration::from_secs(20)),
        "B never found itself blocklisted:\n{}",
        b.log()
    );
    // A gateway that did not wait for its iSCSI sessions would be a new
    // RADOS client by now, and the held write would go out through it.
    let rejoined_early = logs(&b, "rejoined as a new RADOS client", Duration::from_secs(5));
    std::fs::remove_file(&hold).unwrap();
    let said = via_b.last_words(Duration::from_secs(20)).unwrap_or_else(|| {
        panic!(
            "B kept its iSCSI session open after it was blocklisted:\n{}",
            b.log()
        )
    });
    assert!(
        !said.iter().any(|p| p.bhs.itt() == held),
        "B answered the held write: {said:?}"
    );
    assert!(
        logs(
            &b,
            "rejoined as a new RADOS client",
            Duration::from_secs(30)
        ),
        "B never rejoined:\n{}",
        b.log()
    );
    let through_a = via_a.read10(0, 128);
    let exported = img.export();
    assert_eq!(
        (held_version(&through_a), held_version(&exported)),
        (3, 3),
        "the image must hold the newest write (B rejoined before its iSCSI session \
         ended: {rejoined_early})\nA:\n{}\nB:\n{}",
        a.log(),
        b.log()
    );
    assert!(
        !rejoined_early,
        "B rejoined while its iSCSI session held a write:\n{}",
        b.log()
    );
    // B serves again, as a new client: a new session writes through it.
    let mut again = Initiator::login(b_iscsi, TARGET);
    again.write10(0, &version(1));
    assert_eq!(held_version(&via_a.read10(0, 128)), 1);
}
