//! The identity and ALUA view of `braid serve --iscsi` that stock
//! multipath initiators depend on: one unit name behind every portal as
//! Linux and Windows rank VPD 0x83's designators, a relative port and a
//! port group per portal, and `braid alua` draining a portal with every
//! session told (unit attention) and the drained port answering as SPC
//! says.

mod common;
mod iscsikit;

use std::net::SocketAddr;
use std::process::Command;

use common::{free_port, Serve};
use iscsikit::vpd::{self, designators};
use iscsikit::{Initiator, CHECK_CONDITION, GOOD};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";

fn serve(port: u16, extra: &[&str]) -> Serve {
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.2:0",
        "--iscsi",
    ];
    let port = port.to_string();
    args.push(&port);
    args.extend_from_slice(extra);
    args.push("vol=mem:16MiB");
    Serve::start(&args)
}

fn portals(port: u16) -> [SocketAddr; 2] {
    [
        format!("127.0.0.1:{port}").parse().unwrap(),
        format!("127.0.0.2:{port}").parse().unwrap(),
    ]
}

#[test]
fn every_portal_shows_one_unit_as_linux_and_windows_rank_its_names() {
    let port = free_port();
    let serve = serve(port, &[]);
    let volume = serve.logged_volume("vol").replace('-', "");
    let naa = format!("6b2a1d0{}", &volume[..25]);
    let mut seen = Vec::new();
    for addr in portals(port) {
        let mut i = Initiator::login(addr, TARGET);
        let page = i.exec(&iscsikit::vpd_cdb(0x83), &[], 256);
        assert!(page.good(), "{page:?}");
        let ds = designators(&page.data);
        assert!(
            !ds.iter().any(|d| d.association == 0 && d.kind == 8),
            "a SCSI name string of the unit would outrank NAA in Linux and MSDSM: {ds:?}"
        );
        let linux = vpd::linux_wwid(&ds).expect("Linux finds a wwid");
        let udev = vpd::udev_serial(&ds).expect("udev finds an ID_SERIAL");
        let msdsm = vpd::msdsm_identity(&ds).expect("MSDSM finds an identity");
        assert_eq!(linux, format!("naa.{naa}"), "the NAA 6 name is chosen");
        assert_eq!(udev, format!("3{naa}"));
        assert_eq!((msdsm.0, msdsm.1), (0, 3), "MSDSM picks the unit's NAA");
        let (port_id, group) = vpd::msdsm_port(&ds);
        assert_eq!(vpd::udev_port_group(&ds), group);
        let serial = i.exec(&iscsikit::vpd_cdb(0x80), &[], 255);
        seen.push((linux, udev, msdsm, serial.data, port_id, group));
    }
    let (a, b) = (&seen[0], &seen[1]);
    assert_eq!(
        (&a.0, &a.1, &a.2, &a.3),
        (&b.0, &b.1, &b.2, &b.3),
        "one identity behind both portals"
    );
    assert_eq!((a.4, a.5), (Some(1), Some(1)));
    assert_eq!(
        (b.4, b.5),
        (Some(2), Some(2)),
        "each portal its own port and group"
    );
}

/// Where `braid alua` looks for running serves (as `braid status` does).
fn control_dir() -> std::path::PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return "/run/braid/ctl".into();
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => std::path::PathBuf::from(d).join("braid/ctl"),
        None => std::env::temp_dir().join(format!("braid-{uid}/ctl")),
    }
}

/// Waits (bounded) for a serve's control socket: it is bound just after
/// the exports are logged.
fn wait_for(control: &std::path::Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !control.exists() {
        assert!(std::time::Instant::now() < deadline, "no control socket");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn braid(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_braid"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("braid runs")
}

const NOT_READY_STANDBY: Option<(u8, u8, u8)> = Some((0x2, 0x04, 0x0b));
const STATE_CHANGED: Option<(u8, u8, u8)> = Some((0x6, 0x2a, 0x06));

#[test]
fn braid_alua_drains_a_portal_and_every_session_hears_of_it() {
    let port = free_port();
    // In the directory `braid alua` searches, so that it finds this serve
    // by the portal alone.
    let control = control_dir().join(format!(
        "serve-alua-test-{}-{port}.sock",
        std::process::id()
    ));
    let control_arg = control.display().to_string();
    let serve = serve(port, &["--control", &control_arg]);
    wait_for(&control);
    let [p1, p2] = portals(port);
    let mut a = Initiator::login(p1, TARGET);
    let mut b = Initiator::login(p2, TARGET);
    let tur = [0u8; 6];
    let read = iscsikit::read10_cdb(0, 8);
    for i in [&mut a, &mut b] {
        assert_eq!(i.exec(&tur, &[], 0).status, GOOD);
    }

    let out = braid(&["alua", &p2.to_string(), "standby"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        serve.log()
    );

    // Every session is told once, on its next command but INQUIRY.
    let r = a.exec(&tur, &[], 0);
    assert_eq!((r.status, r.sense), (CHECK_CONDITION, STATE_CHANGED));
    assert!(a.exec(&read, &[], 4096).good(), "portal 1 still serves");
    assert!(b.exec(&iscsikit::vpd_cdb(0x83), &[], 255).good());
    let r = b.exec(&tur, &[], 0);
    assert_eq!((r.status, r.sense), (CHECK_CONDITION, STATE_CHANGED));

    // The drained port: NOT READY, TARGET PORT IN STANDBY STATE to I/O
    // and TEST UNIT READY; what describes the unit still answers.
    for cdb in [&tur[..], &read[..]] {
        let r = b.exec(cdb, &[], 4096);
        assert_eq!((r.status, r.sense), (CHECK_CONDITION, NOT_READY_STANDBY));
    }
    let r = b.exec(&iscsikit::write10_cdb(0, 1), &[7; 512], 0);
    assert_eq!((r.status, r.sense), (CHECK_CONDITION, NOT_READY_STANDBY));
    assert!(b.exec(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 8).good());
    let groups = b.exec(&iscsikit::rtpg_cdb(), &[], 1024);
    assert!(groups.good());
    assert_eq!(iscsikit::rtpg_states(&groups.data), [(1, 0x0), (2, 0x2)]);
    assert_eq!(
        a.read10(0, 1),
        vec![0; 512],
        "the write through standby never landed"
    );

    let shown = braid(&["status", "--control", &control_arg]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        text.contains(&format!("iSCSI portal {p2} group 2 standby")),
        "{text}"
    );

    // And back: told again, and I/O flows through portal 2.
    let out = braid(&[
        "alua",
        &p2.to_string(),
        "active-optimized",
        "--control",
        &control_arg,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = b.exec(&read, &[], 4096);
    assert_eq!((r.status, r.sense), (CHECK_CONDITION, STATE_CHANGED));
    assert!(b.exec(&read, &[], 4096).good());
    let r = a.exec(&tur, &[], 0);
    assert_eq!((r.status, r.sense), (CHECK_CONDITION, STATE_CHANGED));
}

#[test]
fn braid_alua_names_what_it_cannot_find() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let control_path = dir.path().join("c.sock");
    let control = control_path.to_str().unwrap();
    let _serve = serve(port, &["--control", control]);
    wait_for(&control_path);
    let out = braid(&["alua", "127.0.0.9:1", "standby", "--control", control]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "no iSCSI portal 127.0.0.9:1; the portals are 127.0.0.1:{port}, 127.0.0.2:{port}"
        )),
        "{err}"
    );
    let out = braid(&["alua", &format!("127.0.0.1:{port}"), "offline"]);
    assert_eq!(out.status.code(), Some(2), "not a state: a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("possible values"));
}
