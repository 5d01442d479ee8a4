//! `braid serve --iscsi`: the exports as iSCSI targets, checked with
//! libiscsi's own tools (discovery, INQUIRY, READ CAPACITY and its
//! conformance suites, writes included) and, byte for byte, across both
//! protocols: data written over iSCSI reads back over NBD and the other
//! way round.

mod common;
mod iscsikit;

use braid_test_needs::needs;

use std::process::Command;
use std::time::Duration;

use common::{cmd, free_port, output, random_bytes, sha256, sha256_bytes, sparse_file, Serve};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";
const SIZE: usize = 16 << 20;

fn serve(dir: &std::path::Path, port: u16) -> Serve {
    let disk = sparse_file(dir, "disk.img", SIZE as u64);
    Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.2:0",
        "--iscsi",
        &port.to_string(),
        &format!("vol={}", disk.display()),
    ])
}

fn run(c: &mut Command) -> String {
    let out = output(c, Duration::from_secs(120));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{c:?} failed:\n{text}");
    text
}

#[needs("iscsi-ls")]
fn libiscsi_discovers_every_portal_and_sees_one_unit_behind_them() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let serve = serve(dir.path(), port);
    let listed = run(cmd("iscsi-ls").args(["-s", &format!("iscsi://127.0.0.1:{port}")]));
    assert!(
        listed.contains(&format!("Target:{TARGET}")),
        "{listed}\n{}",
        serve.log()
    );
    for portal in [format!("127.0.0.1:{port},1"), format!("127.0.0.2:{port},2")] {
        assert!(listed.contains(&portal), "{portal} missing:\n{listed}");
    }
    let serials: Vec<String> = ["127.0.0.1", "127.0.0.2"]
        .iter()
        .map(|host| {
            let url = format!("iscsi://{host}:{port}/{TARGET}/0");
            run(cmd("iscsi-inq").args(["-e", "1", "-c", "128", &url]))
        })
        .collect();
    assert_eq!(serials[0], serials[1], "one unit behind both portals");
    let volume: String = serve.logged_volume("vol").replace('-', "");
    assert!(
        serials[0].contains(&volume),
        "the serial is the volume identity: {}",
        serials[0]
    );
    let ids = run(cmd("iscsi-inq").args([
        "-e",
        "1",
        "-c",
        "131",
        &format!("iscsi://127.0.0.1:{port}/{TARGET}/0"),
    ]));
    for want in [
        "Designator Type:(3) NAA",
        "Designator Type:(8) SCSI_NAME_STRING",
        "Designator Type:(5) TARGET_PORT_GROUP",
        "Designator Type:(4) RELATIVE_TARGET_PORT",
    ] {
        assert!(ids.contains(want), "{want} missing from VPD 0x83:\n{ids}");
    }
    let cap = run(cmd("iscsi-readcapacity16").arg(format!("iscsi://127.0.0.1:{port}/{TARGET}/0")));
    assert!(cap.contains(&format!("Total size:{SIZE}")), "{cap}");
}

/// Runs libiscsi's conformance suite (`iscsi-test-cu -t ALL`, writes
/// allowed) against `urls` and returns CUnit's counts of tests: total,
/// ran, passed, failed.
fn conformance(urls: &[String]) -> (String, Vec<u64>) {
    let out = output(
        cmd("iscsi-test-cu")
            .args(["--dataloss", "-t", "ALL"])
            .args(urls),
        Duration::from_secs(300),
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // CUnit's summary: "tests  TOTAL  RAN  PASSED  FAILED  INACTIVE".
    let counts: Vec<u64> = text
        .lines()
        .find(|l| l.trim_start().starts_with("tests "))
        .unwrap_or_else(|| panic!("no summary:\n{text}"))
        .split_whitespace()
        .skip(1)
        .filter_map(|n| n.parse().ok())
        .collect();
    assert!(counts.len() >= 4, "{text}");
    (text, counts)
}

#[needs("iscsi-test-cu")]
fn libiscsis_whole_conformance_suite_passes_on_one_portal_and_on_two() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let serve = serve(dir.path(), port);
    let url = |host: &str| format!("iscsi://{host}:{port}/{TARGET}/0");
    // With two URLs its multipath tests run, one session through each.
    for urls in [
        vec![url("127.0.0.1")],
        vec![url("127.0.0.1"), url("127.0.0.2")],
    ] {
        let (text, counts) = conformance(&urls);
        assert!(
            counts[1] >= 200,
            "the suite ran only {} tests:\n{text}",
            counts[1]
        );
        assert_eq!(counts[3], 0, "failed:\n{text}\n{}", serve.log());
    }
}

#[needs("nbdcopy")]
fn data_crosses_between_iscsi_and_nbd_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let serve = serve(dir.path(), port);
    let addr: std::net::SocketAddr = format!("127.0.0.2:{port}").parse().unwrap();
    let mut i = iscsikit::Initiator::login(addr, TARGET);

    // Over iSCSI: 1 MiB at block 2048 (immediate data, then R2Ts), and a
    // small write at block 0.
    let big = random_bytes(1 << 20, 7);
    i.write10(2048, &big);
    let small = random_bytes(4096, 8);
    i.write10(0, &small);
    assert_eq!(
        i.read10(2048, 2048),
        big,
        "iSCSI reads back what iSCSI wrote"
    );
    assert_eq!(i.read10(0, 8), small);

    // Over NBD, the same bytes.
    let image = dir.path().join("via-nbd.img");
    run(cmd("nbdcopy").arg(serve.uri("vol")).arg(&image));
    let mut want = vec![0u8; SIZE];
    want[..4096].copy_from_slice(&small);
    want[2048 * 512..2048 * 512 + big.len()].copy_from_slice(&big);
    assert_eq!(
        sha256(&image),
        sha256_bytes(&want),
        "NBD sees the iSCSI writes"
    );

    // And the other way: written over NBD, read over iSCSI.
    let src = common::random_file(dir.path(), SIZE, 9);
    run(cmd("nbdcopy").arg(&src).arg(serve.uri("vol")));
    let back = i.read10(4096, 2048);
    let whole = std::fs::read(&src).unwrap();
    assert_eq!(
        back,
        whole[4096 * 512..4096 * 512 + (1 << 20)],
        "iSCSI sees the NBD writes"
    );
}

#[needs("iscsi-ls")]
fn an_export_allow_list_hides_its_target_from_other_networks() {
    let port = free_port();
    let _serve = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--iscsi",
        &port.to_string(),
        "--allow",
        "vol=10.9.9.0/24",
        "vol=mem:8MiB",
        "open=mem:8MiB",
    ]);
    let listed = run(cmd("iscsi-ls").args(["-s", &format!("iscsi://127.0.0.1:{port}")]));
    assert!(
        listed.contains("iqn.2026-11.org.braid-storage:open"),
        "{listed}"
    );
    assert!(
        !listed.contains(TARGET),
        "a target the client may not use was listed:\n{listed}"
    );
    let out = output(
        cmd("iscsi-inq").arg(format!("iscsi://127.0.0.1:{port}/{TARGET}/0")),
        Duration::from_secs(60),
    );
    assert!(
        !out.status.success(),
        "a login to the hidden target succeeded"
    );
}

#[test]
fn iscsi_is_refused_beside_tls() {
    let out = Command::new(env!("CARGO_BIN_EXE_braid"))
        .args([
            "serve",
            "--iscsi",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "vol=mem:1MiB",
        ])
        .output()
        .expect("braid serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no TLS"), "{err}");
}

/// Whether the target closes `s` (a read sees the end) within 10 s.
fn closed_by_target(s: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    match s.read(&mut [0u8; 64]) {
        Ok(n) => n == 0,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// Waits up to 10 s for `text` in the server's log.
fn logged(serve: &Serve, text: &str) -> bool {
    common::wait_until(Duration::from_secs(10), || serve.log().contains(text))
}

#[test]
fn iscsi_connections_are_bounded_per_client_and_must_log_in_in_time() {
    let port = free_port();
    let serve = Serve::start(&[
        "--iscsi",
        &port.to_string(),
        "--max-connections-per-client",
        "2",
        "--handshake-timeout",
        "1",
        "vol=mem:1MiB",
    ]);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let connect = || std::net::TcpStream::connect(addr).unwrap();
    let (mut a, mut b) = (connect(), connect());
    // Both are counted before the third arrives: the server logs each
    // connection it accepts.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while serve.log().matches("portal_group=").count() < 2 {
        assert!(std::time::Instant::now() < deadline, "{}", serve.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut third = connect();
    assert!(
        closed_by_target(&mut third),
        "a third connection from one client is closed"
    );
    assert!(
        logged(&serve, "--max-connections-per-client reached"),
        "{}",
        serve.log()
    );
    // Neither of the two logs in: each is closed after the handshake timeout.
    assert!(closed_by_target(&mut a) && closed_by_target(&mut b));
    assert!(logged(&serve, "no login within"), "{}", serve.log());
    let mut i = iscsikit::Initiator::login(addr, TARGET);
    assert!(
        i.exec(&[0; 6], &[], 0).good(),
        "a client that logs in is served"
    );
}

#[test]
fn targets_are_named_after_the_operators_iqn_prefix() {
    let port = free_port();
    let serve = Serve::start(&[
        "--iscsi",
        &port.to_string(),
        "--iscsi-iqn",
        "iqn.2024-05.com.example.nas",
        "vol=mem:1MiB",
        "db_1=mem:1MiB",
    ]);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut i = iscsikit::Initiator::login(addr, "iqn.2024-05.com.example.nas:vol");
    assert!(i.exec(&[0; 6], &[], 0).good(), "TEST UNIT READY");
    // An export name RFC 3722 does not allow is served, with a warning
    // that initiators checking names may refuse it; a good one is not.
    assert!(
        logged(
            &serve,
            "iSCSI target iqn.2024-05.com.example.nas:db_1 has '_' at byte"
        ),
        "{}",
        serve.log()
    );
    assert!(!serve.log().contains("nas:vol has"), "{}", serve.log());
    let out = Command::new(env!("CARGO_BIN_EXE_braid"))
        .args([
            "serve",
            "--iscsi",
            "--iscsi-iqn",
            "nas.example.com",
            "vol=mem:1MiB",
        ])
        .output()
        .expect("braid serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("an IQN starts with") && err.contains("e.g."),
        "{err}"
    );
}

#[needs("iscsi-ls")]
fn with_chap_only_the_right_secret_logs_in() {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("chap.toml");
    std::fs::write(
        &creds,
        "user = \"alice\"\nsecret = \"correcthorsebattery\"\n",
    )
    .unwrap();
    let port = free_port();
    let serve = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--iscsi",
        &port.to_string(),
        "--iscsi-chap",
        creds.to_str().unwrap(),
        "vol=mem:8MiB",
    ]);
    let inq = |userinfo: &str| {
        output(
            cmd("iscsi-inq").arg(format!("iscsi://{userinfo}127.0.0.1:{port}/{TARGET}/0")),
            Duration::from_secs(60),
        )
    };
    let ok = inq("alice%correcthorsebattery@");
    assert!(
        ok.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&ok.stderr),
        serve.log()
    );
    for who in ["alice%wrongsecret1234@", "mallory%correcthorsebattery@", ""] {
        let out = inq(who);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !out.status.success() && said.contains("Authentication failure"),
            "{who:?} got in:\n{said}"
        );
    }
    let listed = run(cmd("iscsi-ls").args([
        "-s",
        &format!("iscsi://alice%correcthorsebattery@127.0.0.1:{port}"),
    ]));
    assert!(listed.contains(TARGET), "{listed}");
}

#[test]
fn chap_secrets_shorter_than_twelve_bytes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("chap.toml");
    std::fs::write(&creds, "user = \"alice\"\nsecret = \"short\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_braid"))
        .args([
            "serve",
            "--iscsi",
            "--iscsi-chap",
            creds.to_str().unwrap(),
            "vol=mem:1MiB",
        ])
        .output()
        .expect("braid serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("12 to 255 bytes"), "{err}");
}

#[test]
fn writes_whose_data_never_comes_cannot_pin_unbounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut serve = serve(dir.path(), port);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut i = iscsikit::Initiator::login(addr, TARGET);
    // 8 MiB each, data never sent: the first four fit the 32 MiB a
    // connection may hold for waiting WRITEs and are asked for (R2T); the
    // fifth is turned away with TASK SET FULL.
    let itts: Vec<u32> = (0..5).map(|_| i.write10_without_data(0, 16384)).collect();
    let mut r2ts = 0;
    loop {
        let p = i.next_pdu();
        match p.bhs.opcode() {
            braid_iscsi::Opcode::R2t => r2ts += 1,
            braid_iscsi::Opcode::ScsiResponse => {
                assert_eq!(p.bhs.itt(), itts[4], "the fifth WRITE is the one refused");
                assert_eq!(p.bhs.0[3], 0x28, "TASK SET FULL");
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(r2ts, 4);
    serve.assert_healthy();
}

#[test]
fn a_stopping_server_asks_each_session_to_log_out_first() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut serve = serve(dir.path(), port);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut polite = iscsikit::Initiator::login(addr, TARGET);
    let mut other = iscsikit::DEFAULT_INITIATOR;
    other.isid[5] = 2;
    let mut silent = iscsikit::Initiator::login_as(addr, TARGET, &other);
    common::signal(serve.pid(), libc::SIGTERM);
    for i in [&mut polite, &mut silent] {
        let m = i.async_message();
        assert_eq!(m.bhs.0[36], 1, "AsyncEvent 1: the target asks for a logout");
        assert_eq!(&m.bhs.0[42..44], &[0, 2], "within 2 seconds");
    }
    assert_eq!(polite.logout(), 0, "logged out");
    assert!(
        silent.closed_within(Duration::from_secs(10)),
        "a session that does not log out is closed after the grace:\n{}",
        serve.log()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while serve.alive() {
        assert!(std::time::Instant::now() < deadline, "{}", serve.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(serve.log().contains("stopped"), "{}", serve.log());
}
