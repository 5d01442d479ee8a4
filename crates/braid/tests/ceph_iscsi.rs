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
    extra: &[&str],
) -> (Serve, std::net::SocketAddr) {
    gateway_on(c, img, lease, env, extra, free_port())
}

/// As [`gateway`], with iSCSI on `port`.
fn gateway_on(
    c: &cephkit::Cluster,
    img: &cephkit::Image,
    lease: &str,
    env: &[(&str, &str)],
    extra: &[&str],
    port: u16,
) -> (Serve, std::net::SocketAddr) {
    let port_text = port.to_string();
    let flags = [
        &["--gateway-lease", lease, "--iscsi", &port_text][..],
        extra,
    ]
    .concat();
    let g = c.gateway_env(img, &flags, env);
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
    let (a, a_iscsi) = gateway(c, &img, "3", &[], &[]);
    let (b, b_iscsi) = gateway(
        c,
        &img,
        "3",
        &[("BRAID_TEST_HOLD_RBD_WRITES", hold_env.as_str())],
        &[],
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
    let said = via_b
        .last_words(Duration::from_secs(20))
        .unwrap_or_else(|| {
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

/// COMPARE AND WRITE of one block at `lba`: `cmp`, then `data`.
fn caw(i: &mut Initiator, lba: u64, cmp: &[u8], data: &[u8]) -> iscsikit::Reply {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x89;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[13] = 1;
    i.exec(&cdb, &[cmp, data].concat(), 0)
}

/// What initiator `who` (0 or 1) tries to write over `prev` in round
/// `round`: `prev`'s bytes up to a point that moves each round, then its
/// own, every one of them different from `prev`'s and from the other's.
fn next_value(prev: &[u8], round: usize, who: u8) -> (Vec<u8>, usize) {
    let from = round * 37 % 512;
    let mut v = prev.to_vec();
    for b in &mut v[from..] {
        *b ^= 1 + who;
    }
    (v, from)
}

#[needs("ceph-mon")]
fn compare_and_write_is_atomic_across_gateways() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("iscsi-caw", "16M", Some("layering"));
    let (_a, a_iscsi) = gateway(c, &img, "15", &[], &[]);
    let (_b, b_iscsi) = gateway(c, &img, "15", &[], &[]);
    // In the image's second object, so that an offset librbd gave
    // within the object would show.
    let lba = (4u64 << 20) / 512 + 3;
    let mut reader = Initiator::login(a_iscsi, TARGET);
    let start = vec![0u8; 512];
    let (to_a, to_b) = (std::sync::mpsc::channel(), std::sync::mpsc::channel());
    let (back_tx, back) = std::sync::mpsc::channel();
    let go = std::sync::Arc::new(std::sync::Barrier::new(2));
    let workers: Vec<_> = [(a_iscsi, to_a.1, 0u8), (b_iscsi, to_b.1, 1u8)]
        .into_iter()
        .map(|(addr, jobs, who)| {
            let (go, back) = (go.clone(), back_tx.clone());
            let who_name = format!("iqn.2026-11.org.braid-storage:racer-{who}");
            std::thread::spawn(move || {
                let mut i = Initiator::login_as(addr, TARGET, &iscsikit::who(&who_name, who));
                for (cmp, data) in jobs {
                    let (cmp, data): (Vec<u8>, Vec<u8>) = (cmp, data);
                    go.wait();
                    let r = caw(&mut i, lba, &cmp, &data);
                    back.send((who, r)).unwrap();
                }
            })
        })
        .collect();
    let mut prev = start;
    let mut wins = [0usize; 2];
    for round in 0..100 {
        let (mine_a, from) = next_value(&prev, round, 0);
        let (mine_b, _) = next_value(&prev, round, 1);
        to_a.0.send((prev.clone(), mine_a.clone())).unwrap();
        to_b.0.send((prev.clone(), mine_b.clone())).unwrap();
        let mut replies = [back.recv().unwrap(), back.recv().unwrap()];
        replies.sort_by_key(|(who, _)| *who);
        let good: Vec<u8> = replies
            .iter()
            .filter(|(_, r)| r.good())
            .map(|(w, _)| *w)
            .collect();
        assert_eq!(
            good.len(),
            1,
            "round {round}: exactly one wins: {replies:?}"
        );
        let winner = good[0];
        let (_, lost) = &replies[usize::from(1 - winner)];
        assert_eq!(
            (lost.status, lost.sense),
            (iscsikit::CHECK_CONDITION, Some((0x0e, 0x1d, 0x00))),
            "round {round}: the other gets MISCOMPARE"
        );
        assert_eq!(
            lost.information,
            Some(from as u32),
            "round {round}: the first byte that differed"
        );
        let written = if winner == 0 { mine_a } else { mine_b };
        assert_eq!(
            reader.read10(lba as u32, 1),
            written,
            "round {round}: the block holds what the winner wrote"
        );
        wins[usize::from(winner)] += 1;
        prev = written;
    }
    drop((to_a.0, to_b.0));
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(img.export()[lba as usize * 512..][..512], prev[..]);
    eprintln!("wins through A and B: {wins:?}");
}

/// The relative target port and target port group VPD page 0x83 names
/// through `i`, and the groups REPORT TARGET PORT GROUPS lists with their
/// access states.
fn port_ids(i: &mut Initiator) -> ((u16, u16), Vec<(u16, u8)>) {
    let page = i.exec(&iscsikit::vpd_cdb(0x83), &[], 0x400);
    assert!(page.good(), "VPD 0x83: {page:?}");
    let ds = iscsikit::vpd::designators(&page.data);
    let id = |kind: u8| {
        let d = ds
            .iter()
            .find(|d| d.association == 1 && d.kind == kind)
            .unwrap_or_else(|| panic!("no designator of type {kind}: {ds:?}"));
        u16::from_be_bytes([d.value[2], d.value[3]])
    };
    let rtpg = i.exec(&iscsikit::rtpg_cdb(), &[], 0x400);
    assert!(rtpg.good(), "REPORT TARGET PORT GROUPS: {rtpg:?}");
    ((id(4), id(5)), iscsikit::rtpg_states(&rtpg.data))
}

#[needs("ceph-mon")]
fn port_ids_are_unique_across_the_gateways_of_an_image_and_stable_across_restarts() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("iscsi-ports", "16M", Some("layering"));
    let dir = tempfile::tempdir().unwrap();
    let state = |name: &str| dir.path().join(name).display().to_string();
    let (a_state, b_state) = (state("a"), state("b"));
    let (a, a_iscsi) = gateway(c, &img, "15", &[], &["--state-dir", &a_state]);
    let (b, b_iscsi) = gateway(c, &img, "15", &[], &["--state-dir", &b_state]);
    let (a_ids, a_groups) = port_ids(&mut Initiator::login(a_iscsi, TARGET));
    let (b_ids, b_groups) = port_ids(&mut Initiator::login(b_iscsi, TARGET));
    assert_ne!(a_ids.0, b_ids.0, "relative target ports");
    assert_ne!(a_ids.1, b_ids.1, "target port groups");
    // Active/optimized (0), each group through its own gateway.
    assert_eq!(a_groups, [(a_ids.1, 0)]);
    assert_eq!(b_groups, [(b_ids.1, 0)]);
    drop(b);
    // Tags are kept by portal address (`iscsi-ports`): the same one again.
    let flags = ["--state-dir", &b_state];
    let (_b, b_iscsi) = gateway_on(c, &img, "15", &[], &flags, b_iscsi.port());
    let (again, _) = port_ids(&mut Initiator::login(b_iscsi, TARGET));
    assert_eq!(again, b_ids, "B's ids after its restart\nA:\n{}", a.log());
}

/// What libiscsi's discovery through `portal` lists.
fn discovered(portal: std::net::SocketAddr) -> String {
    let out = common::output(
        common::cmd("iscsi-ls").args(["-s", &format!("iscsi://{portal}")]),
        Duration::from_secs(30),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[needs("ceph-mon", "iscsi-ls")]
fn send_targets_names_every_live_gateways_portals() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("iscsi-discovery", "16M", Some("layering"));
    let (a, a_iscsi) = gateway(c, &img, "3", &[], &[]);
    let (b, b_iscsi) = gateway(c, &img, "3", &[], &[]);
    // B's portal with B's own portal group tag (its range starts at 257).
    let (a_listed, b_listed) = (format!("{a_iscsi},1"), format!("{b_iscsi},257"));
    let mut listed = String::new();
    let both = common::wait_until(Duration::from_secs(20), || {
        listed = discovered(a_iscsi);
        listed.contains(&a_listed) && listed.contains(&b_listed)
    });
    assert!(both, "A's discovery:\n{listed}\nA:\n{}", a.log());
    assert!(discovered(b_iscsi).contains(&a_listed), "B lists A too");
    // B dies: once its lease has run out, A lists only its own portal.
    signal(b.pid(), libc::SIGKILL);
    let gone = common::wait_until(Duration::from_secs(30), || {
        listed = discovered(a_iscsi);
        listed.contains(&a_listed) && !listed.contains(&b_listed)
    });
    assert!(gone, "A still lists the dead B:\n{listed}\nA:\n{}", a.log());
    drop(b);
}
