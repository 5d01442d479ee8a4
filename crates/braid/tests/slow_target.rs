//! A slow disk is not a dead path: writes that take two seconds each
//! (nbdkit's delay filter) on both portals of one server, or on one of two
//! servers over the same file, finish with no error and no path failed,
//! while a blackholed path in the same run is still failed promptly.

mod common;
mod labkit;

use braid_test_needs::needs;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use braid_lab::{Cut, Lab, LabConfig, Rate, Side};
use common::{free_port, random_file, tool, ChildGuard};
use labkit::braid_bin;

/// nbdkit serving `file` on `port` (every loopback address), with each
/// write delayed two seconds when `slow`.
fn nbdkit(file: &Path, port: u16, slow: bool) -> ChildGuard {
    let mut cmd = Command::new("nbdkit");
    cmd.args([
        "--foreground",
        "--exit-with-parent",
        "-p",
        &port.to_string(),
    ]);
    if slow {
        cmd.arg("--filter=delay");
    }
    cmd.arg("file").arg(file);
    if slow {
        cmd.arg("delay-write=2");
    }
    let guard = ChildGuard::spawn(cmd.stdin(Stdio::null()).stdout(Stdio::null()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nbdkit did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    guard
}

/// `braid copy SRC URI --verify ARGS`; returns (success, stdout, stderr).
fn copy(src: &Path, uri: &str, args: &[&str]) -> (bool, String, String) {
    let out = common::output(
        Command::new(braid_bin())
            .arg("copy")
            .arg(src)
            .arg(uri)
            .arg("--verify")
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1"),
        Duration::from_secs(300),
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_no_path_failed(ok: bool, stdout: &str, stderr: &str) {
    assert!(ok, "braid copy failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("verified: sha256"), "{stdout}");
    assert!(
        !stderr.contains(" failed:"),
        "a slow path was failed:\n{stderr}"
    );
}

#[needs("nbdkit")]
fn two_second_writes_on_both_portals_fail_no_path() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0u8; 16 << 20]).unwrap();
    let port = free_port();
    let _slow = nbdkit(&disk, port, true);
    let src = random_file(dir.path(), 2 << 20, 21);
    let p1 = format!("127.0.0.1:{port}");
    let p2 = format!("127.0.0.2:{port}");
    let (ok, out, err) = copy(
        &src,
        &format!("nbd://{p1}"),
        &["--portal", &p1, "--portal", &p2],
    );
    assert_no_path_failed(ok, &out, &err);
}

#[needs("nbdkit")]
fn one_slow_server_beside_a_fast_one_fails_no_path() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0u8; 16 << 20]).unwrap();
    let (fast_port, slow_port) = (free_port(), free_port());
    let _fast = nbdkit(&disk, fast_port, false);
    let _slow = nbdkit(&disk, slow_port, true);
    let src = random_file(dir.path(), 8 << 20, 22);
    let fast = format!("127.0.0.1:{fast_port}");
    let slow = format!("127.0.0.1:{slow_port}");
    let (ok, out, err) = copy(
        &src,
        &format!("nbd://{fast}"),
        &[
            "--portal",
            &fast,
            "--portal",
            &slow,
            "--policy",
            "round-robin",
        ],
    );
    assert_no_path_failed(ok, &out, &err);
}

#[needs("root", "nbdkit", "ip", "tc")]
fn a_blackholed_path_still_fails_fast_while_the_other_is_slow() {
    if !braid_lab::require_or_skip("a_blackholed_path_still_fails_fast_while_the_other_is_slow")
        || !tool("nbdkit")
    {
        return;
    }
    let lab = Lab::up(LabConfig::new([Rate::GBIT, Rate::GBIT])).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0u8; 32 << 20]).unwrap();
    // One nbdkit on every address of the storage namespace; writes slow.
    let mut kit = Command::new("nbdkit");
    kit.args([
        "--foreground",
        "--exit-with-parent",
        "--filter=delay",
        "file",
    ])
    .arg(&disk)
    .arg("delay-write=2");
    let _nbdkit = lab.spawn(Side::Storage, kit).expect("nbdkit");
    let portals: Vec<String> = lab
        .paths()
        .iter()
        .map(|p| p.storage_addr.to_string())
        .collect();
    let src = random_file(dir.path(), 4 << 20, 23);
    let mut cmd = Command::new(braid_bin());
    cmd.arg("copy")
        .arg(&src)
        .arg(format!("nbd://{}", portals[0]))
        .args(["--portal", &portals[0], "--portal", &portals[1], "--verify"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let copy = lab.spawn(Side::Client, cmd).expect("braid copy");
    // Let the copy start (nbdkit answers at once; writes then take 2 s).
    std::thread::sleep(Duration::from_millis(1500));
    lab.cut(2, Cut::Blackhole).unwrap();
    let mut copy = copy;
    let status = copy
        .wait_timeout(Duration::from_secs(300))
        .unwrap()
        .expect("braid copy ended");
    let mut err = String::new();
    let mut out = String::new();
    use std::io::Read;
    let child = copy.child_mut();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(status.success(), "braid copy failed:\n{out}\n{err}");
    assert!(out.contains("verified: sha256"), "{out}");
    let failed: Vec<&str> = err.lines().filter(|l| l.contains(": failed:")).collect();
    assert!(
        failed.iter().all(|l| l.contains("path{n=2 ")) && !failed.is_empty(),
        "only the blackholed path 2 should fail:\n{err}"
    );
}

/// nbdkit serving `file` with every FLUSH taking `secs` seconds (its eval
/// plugin: the delay filter of Debian's nbdkit has no flush delay).
fn nbdkit_slow_flush(file: &Path, port: u16, secs: u32) -> ChildGuard {
    let f = file.display();
    let mut cmd = Command::new("nbdkit");
    cmd.args([
        "--foreground",
        "--exit-with-parent",
        "-p",
        &port.to_string(),
        "eval",
    ])
    .arg(format!("get_size=stat -c %s {f}"))
    .arg(format!(
        "pread=dd if={f} skip=$4 count=$3 iflag=skip_bytes,count_bytes status=none"
    ))
    .arg(format!(
        "pwrite=dd of={f} seek=$4 oflag=seek_bytes conv=notrunc status=none"
    ))
    .arg(format!("flush=sleep {secs}; sync {f}"))
    .arg("can_write=exit 0")
    .arg("can_flush=exit 0")
    .arg("can_multi_conn=exit 0")
    .arg("thread_model=echo parallel");
    let guard = ChildGuard::spawn(cmd.stdin(Stdio::null()).stdout(Stdio::null()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nbdkit did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    guard
}

#[needs("nbdkit")]
fn a_flush_that_takes_seconds_fails_no_path() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0u8; 16 << 20]).unwrap();
    let port = free_port();
    let _kit = nbdkit_slow_flush(&disk, port, 3);
    let src = random_file(dir.path(), 8 << 20, 24);
    let p1 = format!("127.0.0.1:{port}");
    let p2 = format!("127.0.0.2:{port}");
    let (ok, out, err) = copy(
        &src,
        &format!("nbd://{p1}"),
        &["--portal", &p1, "--portal", &p2],
    );
    assert_no_path_failed(ok, &out, &err);
}
