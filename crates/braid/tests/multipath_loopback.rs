//! The multipath initiator end to end on loopback: `braid serve` with two
//! portals (127.0.0.1 and 127.0.0.2), `braid copy` and `braid bench` over
//! both with every policy, the same against nbdkit with explicit portals,
//! and two different volumes offered as one refused.

mod common;

use braid_test_needs::needs;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use braid_policy::NAMES;
use common::{cmd, output, random_file, run, sha256, ChildGuard, Serve};

fn braid() -> std::process::Command {
    cmd(env!("CARGO_BIN_EXE_braid"))
}

fn two_portals(export: &str) -> Serve {
    Serve::start(&["--listen", "127.0.0.1:0", "--listen", "127.0.0.2:0", export])
}

/// `path N (...): 12 MiB (48.3%)` lines of a copy summary, as percentages.
fn shares(out: &Output) -> Vec<f64> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with("path "))
        .filter_map(|l| {
            let pct = l.rsplit('(').next()?.trim_end_matches(['%', ')']);
            pct.parse().ok()
        })
        .collect()
}

#[test]
fn copy_in_and_out_with_every_policy_is_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let src = random_file(dir.path(), 256 << 20, 1);
    let want = sha256(&src);
    let serve = two_portals("vol=mem:256MiB");
    let uri = serve.uri("vol");
    for &policy in NAMES {
        let out_file = dir.path().join(format!("out-{policy}.img"));
        let copy_in = run(braid()
            .args(["copy", "--policy", policy])
            .arg(&src)
            .arg(&uri));
        let copy_out = run(braid()
            .args(["copy", "--policy", policy, &uri])
            .arg(&out_file));
        assert_eq!(
            sha256(&out_file),
            want,
            "{policy}: bytes differ after the round trip"
        );
        std::fs::remove_file(&out_file).unwrap();
        for (what, out) in [("in", &copy_in), ("out", &copy_out)] {
            let s = shares(out);
            assert_eq!(
                s.len(),
                2,
                "{policy} copy {what}: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            if policy == "failover" {
                assert!(s.contains(&0.0), "failover used its standby: {s:?}");
            } else {
                assert!(
                    s.iter().all(|p| *p > 0.0),
                    "{policy} copy {what} left a path idle: {s:?}"
                );
            }
        }
    }
}

fn bench_json(uri: &str, extra: &[&str]) -> serde_json::Value {
    let out = run(braid().args(["bench", uri, "--json"]).args(extra));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bench output is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn path_bytes(j: &serde_json::Value) -> Vec<u64> {
    j["paths"]
        .as_array()
        .expect("paths array")
        .iter()
        .map(|p| p["bytes"].as_u64().expect("bytes"))
        .collect()
}

#[test]
fn bench_with_every_policy_verifies_and_uses_each_path() {
    let serve = two_portals("vol=mem:256MiB");
    let uri = serve.uri("vol");
    for &policy in NAMES {
        let j = bench_json(
            &uri,
            &[
                "--policy",
                policy,
                "--rw",
                "randrw",
                "--bs",
                "256K",
                "--iodepth",
                "8",
                "--time",
                "1",
                "--size",
                "64M",
                "--verify",
            ],
        );
        assert_eq!(j["errors"], 0, "{policy}: {j}");
        assert_eq!(j["verify_errors"], 0, "{policy}: {j}");
        assert!(j["iops"].as_f64().unwrap() > 0.0, "{policy}: {j}");
        for key in ["p50", "p99", "p999"] {
            assert!(
                j["lat_us"][key].as_u64().is_some(),
                "{policy}: lat_us.{key}"
            );
        }
        let bytes = path_bytes(&j);
        assert_eq!(bytes.len(), 2);
        if policy == "failover" {
            assert!(bytes.contains(&0), "failover used its standby: {bytes:?}");
        } else {
            assert!(
                bytes.iter().all(|b| *b > 0),
                "{policy} left a path idle: {bytes:?}"
            );
        }
    }
}

#[test]
fn sequential_read_at_depth_one_uses_both_paths() {
    let serve = two_portals("vol=mem:128MiB");
    let uri = serve.uri("vol");
    let j = bench_json(
        &uri,
        &[
            "--rw",
            "read",
            "--bs",
            "1M",
            "--iodepth",
            "1",
            "--time",
            "2",
        ],
    );
    let bytes = path_bytes(&j);
    assert!(bytes.iter().all(|b| *b > 0), "a path carried nothing: {j}");
    for p in j["paths"].as_array().unwrap() {
        for key in ["local", "portal", "mib_per_s", "iops", "bytes"] {
            assert!(!p[key].is_null(), "paths[].{key} missing: {p}");
        }
    }
    let j = bench_json(
        &uri,
        &[
            "--rw",
            "randrw",
            "--bs",
            "4K",
            "--iodepth",
            "16",
            "--time",
            "2",
            "--verify",
        ],
    );
    assert_eq!(j["verify_errors"], 0, "{j}");
    assert_eq!(j["errors"], 0, "{j}");
}

fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(Instant::now() < deadline, "nothing listening on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn nbdkit_file(ip: &str, file: &Path) -> (ChildGuard, SocketAddr) {
    let port = common::free_port();
    let guard = ChildGuard::spawn(
        cmd("nbdkit")
            .args(["-f", "-i", ip, "-p", &port.to_string(), "file"])
            .arg(format!("file={}", file.display())),
    );
    let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
    wait_listening(addr);
    (guard, addr)
}

#[needs("nbdkit")]
fn plain_nbd_server_with_explicit_portals() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    // Two nbdkit processes on one file: one page cache, so a flush on
    // either covers both, which is what nbdkit's CAN_MULTI_CONN promises.
    let (_a, pa) = nbdkit_file("127.0.0.1", &disk);
    let (_b, pb) = nbdkit_file("127.0.0.2", &disk);
    let src = random_file(dir.path(), 64 << 20, 2);
    let uri = format!("nbd://{pa}/");
    let portals = ["--portal", &pa.to_string(), "--portal", &pb.to_string()];
    for policy in ["adaptive", "round-robin", "failover"] {
        let back = dir.path().join(format!("back-{policy}.img"));
        let copy_in = run(braid()
            .args(["copy", "--policy", policy])
            .args(portals)
            .arg(&src)
            .arg(&uri));
        run(braid()
            .args(["copy", "--policy", policy])
            .args(portals)
            .arg(&uri)
            .arg(&back));
        assert_eq!(sha256(&back), sha256(&src), "{policy}");
        let s = shares(&copy_in);
        if policy == "failover" {
            assert!(s.contains(&0.0), "{s:?}");
        } else {
            assert!(
                s.iter().all(|p| *p > 0.0),
                "{policy} left a path idle: {s:?}"
            );
        }
    }
}

#[test]
fn two_different_volumes_are_refused_as_one() {
    let a = Serve::start(&["--listen", "127.0.0.1:0", "vol=mem:16MiB"]);
    let b = Serve::start(&["--listen", "127.0.0.2:0", "vol=mem:16MiB"]);
    let dir = tempfile::tempdir().unwrap();
    let src = random_file(dir.path(), 1 << 20, 3);
    let out = output(
        braid()
            .arg("copy")
            .arg(&src)
            .arg(a.uri("vol"))
            .args(["--portal", &a.addr().to_string()])
            .args(["--portal", &b.addr().to_string()]),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let (ia, ib) = (a.logged_volume("vol"), b.logged_volume("vol"));
    assert!(
        err.contains(&ia) && err.contains(&ib),
        "the message should name both identities ({ia}, {ib}): {err}"
    );
    assert!(err.contains("not the same volume"), "{err}");
}

/// Which of `braid copy`'s output streams nobody reads.
enum Closed {
    Stdout,
    Stderr,
}

/// Runs `braid copy --no-progress SRC DST` with one output stream a pipe
/// whose reader is gone; returns the exit status and what the other
/// stream carried.
fn copy_into_a_closed_pipe(src: &Path, dst: &str, closed: Closed) -> (ExitStatus, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut copy = braid();
    copy.args(["copy", "--no-progress"])
        .arg(src)
        .arg(dst)
        .stdin(Stdio::null());
    match closed {
        Closed::Stdout => copy.stdout(writer).stderr(Stdio::piped()),
        Closed::Stderr => copy.stdout(Stdio::piped()).stderr(writer),
    };
    let mut child = ChildGuard::spawn(&mut copy);
    let status = child
        .wait(Duration::from_secs(60))
        .expect("copy still running after 60 s");
    let other: Box<dyn Read> = match closed {
        Closed::Stdout => Box::new(child.0.stderr.take().unwrap()),
        Closed::Stderr => Box::new(child.0.stdout.take().unwrap()),
    };
    let mut said = String::new();
    other.take(1 << 20).read_to_string(&mut said).unwrap();
    (status, said)
}

#[test]
fn a_copy_whose_output_nobody_reads_still_completes() {
    // `braid copy ... | head -1`: the summary's later lines meet a closed
    // pipe. The copy is done by then and must say so by its exit status,
    // not end in a panic.
    let dir = tempfile::tempdir().unwrap();
    let src = random_file(dir.path(), 8 << 20, 7);
    let serve = two_portals("vol=mem:8MiB");
    let uri = serve.uri("vol");
    let (status, stderr) = copy_into_a_closed_pipe(&src, &uri, Closed::Stdout);
    assert!(status.success(), "copy failed with {status}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let back = dir.path().join("back.img");
    run(braid().args(["copy", "--no-progress", &uri]).arg(&back));
    assert_eq!(sha256(&back), sha256(&src));
}

#[test]
fn an_error_nobody_can_read_still_exits_with_its_own_status() {
    // `braid copy ... 2>&1 | head -0`, or a terminal that went away: the
    // error message meets a closed pipe. The exit status must still say
    // "failed" (1), not a panic's 101, and nothing may be written.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.img");
    let dest = dir.path().join("dest.img");
    let (status, _) = copy_into_a_closed_pipe(&missing, dest.to_str().unwrap(), Closed::Stderr);
    assert_eq!(status.code(), Some(1), "copy of a missing file: {status}");
    assert!(!dest.exists(), "a failed copy created its destination");
}
