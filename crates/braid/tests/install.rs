//! What an operator installs and what systemd sees: `scripts/install` puts
//! the binary, manual pages, completions, units and configuration in place;
//! every unit in contrib/ passes `systemd-analyze verify`; and `braid serve`
//! and `braid attach` tell a `Type=notify` service manager they are ready
//! only once clients can connect.

mod common;

use braid_test_needs::needs;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{cmd, output, ChildGuard, Serve};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `scripts/install --destdir DIR --bin <this build's braid>`.
fn install_into(dir: &Path) {
    let out = output(
        Command::new(repo().join("scripts/install"))
            .arg("--destdir")
            .arg(dir)
            .arg("--bin")
            .arg(env!("CARGO_BIN_EXE_braid")),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "scripts/install failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[needs("man")]
fn install_step_gives_man_pages_completions_units_and_config() {
    let dir = tempfile::tempdir().unwrap();
    install_into(dir.path());
    let root = dir.path();
    assert!(root.join("usr/local/bin/braid").is_file());
    for unit in [
        "braid-serve.service",
        "braid-attach.service",
        "braid-nbd@.service",
    ] {
        let text = std::fs::read_to_string(root.join("etc/systemd/system").join(unit)).unwrap();
        assert!(text.contains("man:braid"), "{unit} cites no manual page");
    }
    assert!(root.join("etc/braid/serve.toml").is_file());
    let bash =
        std::fs::read_to_string(root.join("usr/local/share/bash-completion/completions/braid"))
            .unwrap();
    // Subcommands and the policy values come from the clap definitions.
    for word in ["serve", "attach", "--listen", "--policy"] {
        assert!(bash.contains(word), "bash completion lacks {word}");
    }

    // `man braid-serve` as a user would run it, with the staged pages on
    // the manual path.
    let man = output(
        cmd("man")
            .args(["-P", "cat", "braid-serve"])
            .env("MANPATH", root.join("usr/local/share/man"))
            .env("MANWIDTH", "80"),
        Duration::from_secs(30),
    );
    let page = String::from_utf8_lossy(&man.stdout);
    assert!(
        man.status.success(),
        "man braid-serve: {page}{}",
        String::from_utf8_lossy(&man.stderr)
    );
    assert!(
        page.contains("--listen") && page.contains("--read-only"),
        "{page}"
    );

    // A second install keeps the operator's configuration.
    std::fs::write(root.join("etc/braid/serve.toml"), "# mine\n").unwrap();
    install_into(root);
    assert_eq!(
        std::fs::read_to_string(root.join("etc/braid/serve.toml")).unwrap(),
        "# mine\n"
    );
}

#[needs("systemd-analyze", "man", "nbd-client")]
fn every_contrib_unit_passes_systemd_analyze_verify() {
    let dir = tempfile::tempdir().unwrap();
    install_into(dir.path());
    let units = dir.path().join("etc/systemd/system");
    // verify checks that ExecStart's program exists: point it at this build.
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&units).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            &path,
            text.replace("/usr/local/bin/braid", env!("CARGO_BIN_EXE_braid")),
        )
        .unwrap();
        names.push(path);
    }
    assert_eq!(names.len(), 3, "{names:?}");
    let man = format!("{}:", dir.path().join("usr/local/share/man").display());
    let out = output(
        cmd("systemd-analyze")
            .arg("verify")
            .args(&names)
            .current_dir(&units)
            .env("SYSTEMD_UNIT_PATH", format!("{}:", units.display()))
            .env("MANPATH", man),
        Duration::from_secs(60),
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify:\n{said}"
    );
}

/// `braid ARGS` run as systemd would run a `Type=notify` unit.
fn braid_notifying(notify: &Path, args: &[&str]) -> ChildGuard {
    ChildGuard::spawn(
        Command::new(env!("CARGO_BIN_EXE_braid"))
            .args(args)
            .env("NOTIFY_SOCKET", notify)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

/// Receives one notification within a bounded time.
fn recv(sock: &UnixDatagram) -> String {
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("a notification within 20 s");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn serve_notifies_ready_once_its_portal_listens_and_stopping_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let notify_path = dir.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    // A fixed port, picked free now, so the test can connect at READY
    // without reading braid's log first.
    let port = common::free_port();
    let state = dir.path().join("state");
    let mut serve = braid_notifying(
        &notify_path,
        &[
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--state-dir",
            state.to_str().unwrap(),
            "--control",
            dir.path().join("ctl.sock").to_str().unwrap(),
            "vol=mem:4MiB",
        ],
    );
    let ready = recv(&notify);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(
        ready.contains("STATUS=serving 1 export(s) on 1 portal(s)"),
        "{ready:?}"
    );
    // Ready means a client connects at once.
    std::net::TcpStream::connect(("127.0.0.1", port)).expect("the portal listens at READY=1");
    assert!(
        std::fs::metadata(dir.path().join("ctl.sock")).is_ok(),
        "the control socket exists at READY=1"
    );
    common::signal(serve.0.id(), libc::SIGTERM);
    assert_eq!(recv(&notify), "STOPPING=1");
    let status = serve
        .wait(Duration::from_secs(20))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{status}");
}

#[test]
fn attach_notifies_ready_once_its_socket_listens() {
    let target = Serve::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let notify_path = dir.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let sock = dir.path().join("vol.sock");
    let _attach = braid_notifying(
        &notify_path,
        &[
            "attach",
            &target.uri("vol"),
            "--socket",
            sock.to_str().unwrap(),
            "--control",
            dir.path().join("ctl.sock").to_str().unwrap(),
        ],
    );
    let ready = recv(&notify);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(ready.contains("1 volume(s) attached"), "{ready:?}");
    std::os::unix::net::UnixStream::connect(&sock).expect("the NBD socket listens at READY=1");
}

#[test]
fn bench_help_lists_every_policy_and_workload() {
    let out = output(
        Command::new(env!("CARGO_BIN_EXE_braid")).args(["bench", "--help"]),
        Duration::from_secs(20),
    );
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    for name in braid_policy::NAMES {
        assert!(
            help.contains(&format!("- {name}:")),
            "--help lacks policy {name}:\n{help}"
        );
    }
    for rw in ["read", "write", "randread", "randwrite", "randrw"] {
        assert!(
            help.contains(&format!("- {rw}:")),
            "--help lacks workload {rw}"
        );
    }
    // A value that is not one of them is refused by the parser, naming them.
    let bad = output(
        Command::new(env!("CARGO_BIN_EXE_braid")).args([
            "bench",
            "nbd://127.0.0.1/x",
            "--policy",
            "fastest",
        ]),
        Duration::from_secs(20),
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("service-time"));
}
