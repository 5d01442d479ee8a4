//! A restarted target may have lost what it acknowledged and never flushed
//! (a power cut, a crash of its host). `braid serve` says which process
//! answers (`x-braid:instance`); when a path comes back to another one, the
//! initiator writes its window of unflushed writes again before anything
//! else, so the next FLUSH covers them. A memory volume models the power
//! cut exactly: a killed and restarted server starts with zeroes.

mod common;
mod labkit;

use braid_test_needs::needs;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{cmd, free_port, nbdsh, run, signal, Serve};
use labkit::{braid_bin, Attach};

const VOLUME_ID: &str = "0b6f4c1e-2d7a-4c52-9e1b-7f3a5d9c8e21";

fn serve(port: u16) -> Serve {
    Serve::start(&[
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--volume-id",
        &format!("vol={VOLUME_ID}"),
        "vol=mem:16MiB",
    ])
}

/// Runs `body` under nbdsh connected to the attach's socket.
fn through_attach(attach: &Attach, body: &str) -> String {
    nbdsh(&format!(
        "h.connect_uri({:?})\n{body}\nh.shutdown()\n",
        attach.uri()
    ))
}

#[needs("nbdsh")]
fn unflushed_writes_come_back_after_the_target_restarts() {
    let port = free_port();
    let mut first = serve(port);
    let attach = Attach::start(None, &first.uri("vol"), "vol", &["--no-path-timeout", "60"]);
    // Acknowledged, never flushed.
    through_attach(
        &attach,
        "for i in range(4):\n    h.pwrite(bytes([17 + i]) * (1 << 20), i * (1 << 20))",
    );
    assert!(attach.status()["replay_window_bytes"].as_u64().unwrap() >= 4 << 20);

    // Power cut: the process and everything it had not flushed are gone.
    signal(first.pid(), libc::SIGKILL);
    first.stop();
    let _second = serve(port);

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = attach.status();
        if v["replays"].as_u64() == Some(1) && v["paths"][0]["state"] == "active" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no replay: {v}\n{}",
            attach.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = through_attach(
        &attach,
        "h.flush()\nok = all(h.pread(1 << 20, i * (1 << 20)) == bytes([17 + i]) * (1 << 20) for i in range(4))\nprint('INTACT' if ok else 'LOST')",
    );
    assert!(
        out.contains("INTACT"),
        "acknowledged writes lost: {out}\n{}",
        attach.log()
    );
    assert!(
        attach.log().contains("the target restarted"),
        "{}",
        attach.log()
    );
}

/// A restart when more was acknowledged than the window holds: every
/// FLUSH and FUA write fails, from every client of the attach socket (the
/// kernel's nbd driver opens several), until `braid clear-loss`. Before the
/// loss was sticky, exactly one FLUSH failed: "a FLUSH succeeded after the
/// loss: SECOND FLUSHED".
#[needs("nbdsh")]
fn a_restart_past_the_window_fails_every_flush_of_every_client_until_cleared() {
    let port = free_port();
    let mut first = serve(port);
    let attach = Attach::start(None, &first.uri("vol"), "vol", &["--replay-window", "1MiB"]);
    through_attach(
        &attach,
        "for i in range(4):\n    h.pwrite(bytes([17 + i]) * (1 << 20), i * (1 << 20))",
    );
    signal(first.pid(), libc::SIGKILL);
    first.stop();
    let _second = serve(port);
    let deadline = Instant::now() + Duration::from_secs(60);
    while attach.status()["replays"].as_u64() != Some(1) {
        assert!(Instant::now() < deadline, "the restart was not seen");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Two clients of the socket, as the kernel's nbd driver has.
    let attempts = r#"
h2 = nbd.NBD()
h2.connect_uri(URI)
def attempt(what, f):
    try:
        f()
        print(what, "FLUSHED")
    except nbd.Error as e:
        print(what, "FAILED", e.errno)
attempt("FIRST", h.flush)
attempt("SECOND", h2.flush)
attempt("AGAIN", h.flush)
attempt("FUA", lambda: h2.pwrite(b"\x01" * 4096, 0, nbd.CMD_FLAG_FUA))
h2.shutdown()
"#
    .replace("URI", &format!("{:?}", attach.uri()));
    let out = through_attach(&attach, &attempts);
    for what in ["FIRST", "SECOND", "AGAIN", "FUA"] {
        assert!(
            out.contains(&format!("{what} FAILED EIO")),
            "a FLUSH succeeded after the loss: {out}\n{}",
            attach.log()
        );
    }
    let v = attach.status();
    assert!(
        v["lost"]["cause"]
            .as_str()
            .is_some_and(|c| c.contains("--replay-window")),
        "status names the loss and its cause: {v}"
    );
    let text = String::from_utf8_lossy(
        &run(Command::new(braid_bin())
            .args(["status", "--control"])
            .arg(&attach.control))
        .stdout,
    )
    .into_owned();
    assert!(text.contains("LOST since"), "{text}");
    assert!(
        attach
            .log()
            .contains("acknowledged writes may have been lost"),
        "the log names it: {}",
        attach.log()
    );
    let cleared = run(Command::new(braid_bin())
        .args(["clear-loss", "vol", "--control"])
        .arg(&attach.control));
    let said = String::from_utf8_lossy(&cleared.stdout);
    assert!(
        said.contains("cleared the loss") && said.contains("--replay-window"),
        "{said}"
    );
    let out = through_attach(&attach, "h.flush()\nprint('THEN FLUSHED')");
    assert!(out.contains("THEN FLUSHED"), "cleared: {out}");
    assert!(attach.status()["lost"].is_null());
}

/// Over iSCSI too: braid's target names its process in VPD page 0xC0, so
/// a path that comes back to a restarted `braid serve --iscsi` is known
/// to lead to a new process and the window is written again. Before, the
/// initiator read no instance over iSCSI and braid's target told no
/// restart: nothing was replayed ("acknowledged writes lost: LOST").
#[needs("nbdsh")]
fn unflushed_writes_come_back_after_braids_iscsi_target_restarts() {
    let (port, iscsi) = (free_port(), free_port());
    let start = || {
        Serve::start(&[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--iscsi",
            &iscsi.to_string(),
            "--volume-id",
            &format!("vol={VOLUME_ID}"),
            "vol=mem:16MiB",
        ])
    };
    let mut first = start();
    let uri = format!("iscsi://127.0.0.1:{iscsi}/iqn.2026-11.org.braid-storage:vol/0");
    let attach = Attach::start(None, &uri, "vol", &["--no-path-timeout", "60"]);
    assert_eq!(
        attach.status()["replay"],
        true,
        "the target names its process"
    );
    through_attach(
        &attach,
        "for i in range(4):\n    h.pwrite(bytes([17 + i]) * (1 << 20), i * (1 << 20))",
    );
    signal(first.pid(), libc::SIGKILL);
    first.stop();
    let _second = start();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = attach.status();
        if v["replays"].as_u64() == Some(1) && v["paths"][0]["state"] == "active" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no replay: {v}\n{}",
            attach.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = through_attach(
        &attach,
        "h.flush()\nok = all(h.pread(1 << 20, i * (1 << 20)) == bytes([17 + i]) * (1 << 20) for i in range(4))\nprint('INTACT' if ok else 'LOST')",
    );
    assert!(
        out.contains("INTACT"),
        "acknowledged writes lost: {out}\n{}",
        attach.log()
    );
    assert!(
        attach.log().contains("new instance"),
        "known by name, not guessed from a reset: {}",
        attach.log()
    );
}

#[needs("nbdkit")]
fn status_says_replay_is_unavailable_against_a_plain_server() {
    let port = free_port();
    let mut kit = common::ChildGuard::spawn(
        cmd("nbdkit")
            .args(["--foreground", "--exit-with-parent", "-i", "127.0.0.1"])
            .args(["-p", &port.to_string(), "memory", "16M"]),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nbdkit did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let attach = Attach::start(None, &format!("nbd://127.0.0.1:{port}"), "vol", &[]);
    assert_eq!(attach.status()["replay"], false);
    let out = run(Command::new(braid_bin())
        .args(["status", "--control"])
        .arg(&attach.control));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no replay"), "{text}");
    assert!(kit.wait(Duration::ZERO).is_none());
}
