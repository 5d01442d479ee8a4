//! What `braid serve` promises beyond single requests, checked through real
//! clients: a FLUSH on one connection covers writes on another
//! (CAN_MULTI_CONN), `--read-only` refuses writes with EPERM, an export's
//! `x-braid:volume` identity survives restarts, and SIGTERM with clients
//! still connected exits 0 with every acknowledged write on disk.

mod common;

use braid_test_needs::needs;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::Duration;

use common::{cmd, nbdsh, random_file, run, sha256, sparse_file, ChildGuard, Serve};

const MIB: usize = 1 << 20;

/// Writes on connection A, flushes on B, reads on C, for each URI given.
fn write_flush_read_across_connections(uris: &[String; 3]) {
    let out = nbdsh(&format!(
        r#"
import os
conns = []
for uri in [{a:?}, {b:?}, {c:?}]:
    x = nbd.NBD()
    x.connect_uri(uri)
    assert x.can_multi_conn(), uri
    conns.append(x)
a, b, c = conns
for i in range(8):
    data = os.urandom(256 * 1024 + i)
    off = 1000003 * i + 7
    a.pwrite(data, off)
    b.flush()
    assert c.pread(len(data), off) == data, ('connection C missed a flushed write', i)
for x in conns:
    x.shutdown()
print('ok')
"#,
        a = uris[0],
        b = uris[1],
        c = uris[2],
    ));
    assert_eq!(out.trim(), "ok");
}

#[needs("nbdsh")]
fn flush_on_one_connection_covers_writes_completed_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "disk.img", 16 * MIB as u64);
    let serve = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.2:0",
        &format!("disk={}", disk.display()),
        "mem=mem:16MiB",
    ]);
    assert_eq!(serve.portals().len(), 2, "{}", serve.log());
    for export in ["disk", "mem"] {
        let uri = serve.uri(export);
        write_flush_read_across_connections(&[uri.clone(), uri.clone(), uri]);
        // Multi-conn holds across portals too: they serve one backend.
        let on = |p: std::net::SocketAddr| format!("nbd://{p}/{export}");
        let p = serve.portals();
        write_flush_read_across_connections(&[on(p[0]), on(p[1]), on(p[0])]);
    }
}

#[needs("nbdsh")]
fn read_only_serve_refuses_writes_with_eperm_and_serves_reads() {
    let dir = tempfile::tempdir().unwrap();
    let src = random_file(dir.path(), 4 * MIB, 7);
    let before = sha256(&src);
    let serve = Serve::start(&["--read-only", &format!("vol={}", src.display())]);
    let out = nbdsh(&format!(
        r#"
# Strict mode off: libnbd would refuse these itself; the server must too.
h.set_strict_mode(0)
h.connect_uri({uri:?})
assert h.is_read_only()
assert not h.can_trim() and not h.can_zero()
assert h.pread(4096, 4 * 1024 * 1024 - 4096) == open({src:?}, 'rb').read()[-4096:]
for name, op in [('write', lambda: h.pwrite(b'x', 0)),
                 ('write fua', lambda: h.pwrite(b'x' * 4096, 8192, nbd.CMD_FLAG_FUA)),
                 ('trim', lambda: h.trim(65536, 0)),
                 ('zero', lambda: h.zero(65536, 0))]:
    try:
        op()
        raise AssertionError(name + ' accepted on a read-only export')
    except nbd.Error as e:
        assert e.errno == 'EPERM', (name, e.errno, e.string)
# The connection survives the refusals.
h.flush()
assert len(h.pread(1 << 20, 1)) == 1 << 20
print('ok')
h.shutdown()
"#,
        uri = serve.uri("vol"),
        src = src.display().to_string(),
    ));
    assert_eq!(out.trim(), "ok");
    assert_eq!(sha256(&src), before, "a read-only export changed its file");
}

/// The `x-braid:volume=` value a client sees for `export`.
fn volume_seen(serve: &Serve, export: &str) -> String {
    let out = run(cmd("nbdinfo").arg("--json").arg(serve.uri(export)));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    j["exports"][0]["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c.as_str()?.strip_prefix("x-braid:volume="))
        .map(str::to_owned)
        .next()
        .unwrap_or_else(|| panic!("no x-braid:volume context in {j:#}"))
}

#[needs("nbdinfo")]
fn volume_identity_survives_restart_and_differs_between_files() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let state = state.to_str().unwrap();
    let a = sparse_file(dir.path(), "a.img", MIB as u64);
    let b = sparse_file(dir.path(), "b.img", MIB as u64);
    let (a_spec, b_spec) = (format!("a={}", a.display()), format!("b={}", b.display()));

    let mut first = Serve::start(&["--state-dir", state, &a_spec]);
    let id_a = volume_seen(&first, "a");
    assert!(first.stop().success());

    let second = Serve::start(&["--state-dir", state, &a_spec, &b_spec]);
    assert_eq!(
        volume_seen(&second, "a"),
        id_a,
        "identity changed on restart"
    );
    let id_b = volume_seen(&second, "b");
    assert_ne!(id_a, id_b, "two files share one identity");
    drop(second);

    // An identity set by hand is used, and remembered without the flag.
    let chosen = "6f1d3c2a-5b4e-4f8a-9c7d-0e1f2a3b4c5d";
    let third = Serve::start(&[
        "--state-dir",
        state,
        "--volume-id",
        &format!("b={chosen}"),
        &b_spec,
    ]);
    assert_eq!(volume_seen(&third, "b"), chosen);
    drop(third);
    let fourth = Serve::start(&["--state-dir", state, &b_spec]);
    assert_eq!(volume_seen(&fourth, "b"), chosen);
}

#[test]
fn a_file_name_with_a_newline_does_not_break_the_identity_store() {
    // Linux file names may hold any byte but '/' and NUL. The identity
    // store is line-based, so such a name must not be written raw: after
    // serving it once, braid must still start with that state dir.
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let state = state.to_str().unwrap();
    let odd = sparse_file(dir.path(), "odd\nname.img", MIB as u64);
    let plain = sparse_file(dir.path(), "plain.img", MIB as u64);
    let mut first = Serve::start(&["--state-dir", state, &format!("odd={}", odd.display())]);
    let status = first.stop();
    assert!(status.success(), "{status}:\n{}", first.log());
    // Serve::start panics with braid's log if braid refuses to start.
    let second = Serve::start(&[
        "--state-dir",
        state,
        &format!("plain={}", plain.display()),
        &format!("odd={}", odd.display()),
    ]);
    second.logged_volume("plain");
}

#[needs("nbdsh", "nbdcopy")]
fn sigterm_with_a_client_connected_exits_0_and_keeps_its_writes() {
    let dir = tempfile::tempdir().unwrap();
    let data = random_file(dir.path(), 8 * MIB, 8);
    let disk = sparse_file(dir.path(), "disk.img", 8 * MIB as u64);
    let spec = format!("vol={}", disk.display());
    let mut serve = Serve::start(&[&spec]);
    // nbdsh writes without FLUSH, says so, then keeps its connection open
    // until stdin closes: the server is stopped under a live client.
    let script = format!(
        r#"
import sys
h.connect_uri({uri:?})
data = open({data:?}, 'rb').read()
for off in range(0, len(data), 1 << 20):
    h.pwrite(data[off:off + (1 << 20)], off)
print('written', flush=True)
sys.stdin.readline()
"#,
        uri = serve.uri("vol"),
        data = data.display().to_string(),
    );
    let mut client = ChildGuard::spawn(
        cmd("nbdsh")
            .arg("-c")
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    let mut line = String::new();
    BufReader::new(client.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "written");

    let status = serve.stop();
    assert!(status.success(), "exit {status}:\n{}", serve.log());
    let _ = client.0.stdin.take().unwrap().write_all(b"\n");
    client.wait(Duration::from_secs(10));

    assert_eq!(sha256(&disk), sha256(&data), "file after stop");
    let serve = Serve::start(&[&spec]);
    let back = dir.path().join("back.bin");
    run(cmd("nbdcopy").arg(serve.uri("vol")).arg(&back));
    assert_eq!(sha256(&back), sha256(&data), "read back after restart");
}

/// `braid serve` of a 1 MiB memory export on a free loopback port, its
/// state and control socket in `dir` (a braid killed by a signal leaves the
/// socket behind there), logging at info level to a pipe on stderr.
fn serve_logging_to_a_pipe(dir: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_braid"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(dir)
        .arg("--control")
        .arg(dir.join("ctl.sock"))
        .arg("vol=mem:1MiB")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

#[test]
fn sigterm_right_after_startup_exits_0() {
    // A service manager may stop braid the moment it has started. Once
    // braid has said it serves, SIGTERM must mean an orderly stop (flush,
    // exit 0), never the default action of dying by the signal.
    let dir = tempfile::tempdir().unwrap();
    for round in 0..20 {
        let mut braid = ChildGuard::spawn(&mut serve_logging_to_a_pipe(dir.path()));
        let stderr = braid.0.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        // Drained on a thread so braid never blocks on a full pipe.
        loop {
            let line = lines.next().expect("braid logged its startup").unwrap();
            if line.contains(" export \"vol\"") {
                break;
            }
        }
        std::thread::spawn(move || lines.for_each(drop));
        common::signal(braid.0.id(), libc::SIGTERM);
        let status = braid.wait(Duration::from_secs(10));
        assert!(
            status.is_some_and(|s| s.success()),
            "round {round}: SIGTERM just after startup gave {status:?}"
        );
    }
}

#[test]
fn a_closed_log_pipe_neither_stops_serving_nor_blocks_sigterm() {
    // braid's stderr can go away under it: `braid serve ... | head`, or a
    // supervisor's log pipe that closes. Logging must then fail quietly,
    // not take the task that logged with it.
    let dir = tempfile::tempdir().unwrap();
    let mut braid = ChildGuard::spawn(&mut serve_logging_to_a_pipe(dir.path()));
    let mut port = None;
    {
        // Startup ends with the export line; only later lines (connections,
        // SIGTERM) meet the closed pipe.
        let mut lines = BufReader::new(braid.0.stderr.take().unwrap()).lines();
        loop {
            let line = lines.next().expect("braid logged its startup").unwrap();
            if let Some(p) = line.split(" portal 127.0.0.1:").nth(1) {
                port = p.trim().parse::<u16>().ok();
            }
            if line.contains(" export \"vol\"") {
                break;
            }
        }
        // The reader is dropped here: braid's stderr is now a broken pipe.
    }
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port.unwrap()));
    // Both symptoms are gathered before asserting, so a failure names all.
    let mut problems = Vec::new();
    for i in 0..3 {
        let greeting = std::net::TcpStream::connect(addr).and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            std::io::Read::read_exact(&mut s, &mut [0u8; 18])
        });
        if let Err(e) = greeting {
            problems.push(format!("connection {i} got no greeting: {e}"));
        }
    }
    common::signal(braid.0.id(), libc::SIGTERM);
    let status = braid.wait(Duration::from_secs(5));
    if status.is_none() {
        let _ = braid.0.kill();
    }
    if !status.is_some_and(|s| s.success()) {
        problems.push(format!("SIGTERM did not stop braid cleanly: {status:?}"));
    }
    assert!(problems.is_empty(), "with stderr closed: {problems:#?}");
}
