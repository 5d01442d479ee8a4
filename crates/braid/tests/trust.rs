//! Trust: TLS with client certificates against libnbd's clients, braid's
//! initiator against nbdkit with TLS required, allow-lists, and clients
//! that flood or stall while another one keeps its throughput.

mod common;

use braid_test_needs::needs;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::raw::RawClient;
use common::{cmd, free_port, output, random_file, run, sha256, ChildGuard, Serve};

fn braid() -> std::process::Command {
    cmd(env!("CARGO_BIN_EXE_braid"))
}

/// `braid tls init` into `dir`, for localhost and 127.0.0.1.
fn tls_dir(dir: &Path) -> PathBuf {
    run(braid().args(["tls", "init"]).arg(dir).args([
        "--name",
        "localhost",
        "--name",
        "127.0.0.1",
    ]));
    dir.to_owned()
}

/// A libnbd certificate directory made of chosen files.
fn libnbd_dir(root: &Path, name: &str, files: &[(&Path, &str)]) -> PathBuf {
    let d = root.join(name);
    std::fs::create_dir_all(&d).unwrap();
    for (src, as_name) in files {
        std::fs::copy(src, d.join(as_name)).unwrap();
    }
    d
}

fn tls_serve(certs: &Path) -> Serve {
    let s = |f: &str| certs.join(f).display().to_string();
    Serve::start(&[
        "--tls-cert",
        &s("server-cert.pem"),
        "--tls-key",
        &s("server-key.pem"),
        "--tls-client-ca",
        &s("ca-cert.pem"),
        "vol=mem:64MiB",
    ])
}

#[needs("nbdinfo", "nbdcopy")]
fn libnbd_clients_need_a_certificate_from_the_right_ca() {
    let tmp = tempfile::tempdir().unwrap();
    let good = tls_dir(&tmp.path().join("good"));
    let other = tls_dir(&tmp.path().join("other"));
    let mut serve = tls_serve(&good);
    let port = serve.addr().port();
    let uri = |dir: &Path| {
        format!(
            "nbds://127.0.0.1:{port}/vol?tls-certificates={}",
            dir.display()
        )
    };

    let out = run(cmd("nbdinfo").arg("--json").arg(uri(&good)));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["TLS"], true, "{j}");

    let src = random_file(tmp.path(), 16 << 20, 7);
    let back = tmp.path().join("back.img");
    run(cmd("nbdcopy").arg(&src).arg(uri(&good)));
    run(cmd("nbdcopy").arg(uri(&good)).arg(&back));
    let head: Vec<u8> = std::fs::read(&back).unwrap()[..16 << 20].to_vec();
    assert_eq!(common::sha256_bytes(&head), sha256(&src));

    let no_cert = libnbd_dir(
        tmp.path(),
        "no-cert",
        &[(&good.join("ca-cert.pem"), "ca-cert.pem")],
    );
    let foreign = libnbd_dir(
        tmp.path(),
        "foreign",
        &[
            (&good.join("ca-cert.pem"), "ca-cert.pem"),
            (&other.join("client-cert.pem"), "client-cert.pem"),
            (&other.join("client-key.pem"), "client-key.pem"),
        ],
    );
    for (what, dir) in [
        ("no client certificate", &no_cert),
        ("another CA's certificate", &foreign),
    ] {
        let out = output(cmd("nbdinfo").arg(uri(dir)), Duration::from_secs(30));
        assert!(!out.status.success(), "{what}: accepted");
    }
    // Without TLS nothing is served, not even the list of exports.
    let out = output(
        cmd("nbdinfo")
            .arg("--list")
            .arg(format!("nbd://127.0.0.1:{port}")),
        Duration::from_secs(30),
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("vol"),
        "exports listed before TLS"
    );
    serve.assert_healthy();
}

#[needs("nbdkit")]
fn the_initiator_reaches_nbdkit_with_tls_required() {
    let tmp = tempfile::tempdir().unwrap();
    let certs = tls_dir(&tmp.path().join("certs"));
    let port = free_port();
    let _nbdkit = ChildGuard::spawn(
        cmd("nbdkit")
            .args([
                "-f",
                "-i",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "--tls=require",
            ])
            .arg(format!("--tls-certificates={}", certs.display()))
            .args(["memory", "32M"]),
    );
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "nbdkit did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let src = random_file(tmp.path(), 8 << 20, 9);
    let ca = certs.join("ca-cert.pem");
    let out = run(braid()
        .arg("copy")
        .arg(&src)
        .arg(format!("nbds://127.0.0.1:{port}/"))
        .arg("--tls-ca")
        .arg(&ca)
        .arg("--verify"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("verified"));
    // The same server refuses a client that does not start TLS.
    let out = output(
        braid()
            .arg("copy")
            .arg(&src)
            .arg(format!("nbd://127.0.0.1:{port}/")),
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
}

#[needs("nbdinfo")]
fn an_address_outside_the_allow_list_is_refused_and_logged() {
    let mut serve = Serve::start(&["--allow", "vol=127.0.0.2/32", "vol=mem:16MiB"]);
    let uri = serve.uri("vol");
    // nbdinfo connects from 127.0.0.1: refused.
    let out = output(cmd("nbdinfo").arg(&uri), Duration::from_secs(30));
    assert!(
        !out.status.success(),
        "a client outside the allow-list got in"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !serve.log().contains("allow-list") {
        assert!(
            Instant::now() < deadline,
            "refusal not logged: {}",
            serve.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        serve.log().contains("127.0.0.1"),
        "the log names the address"
    );
    // From 127.0.0.2 it works.
    let tmp = tempfile::tempdir().unwrap();
    let src = random_file(tmp.path(), 1 << 20, 3);
    run(braid()
        .arg("copy")
        .arg(&src)
        .arg(&uri)
        .args(["--local", "127.0.0.2", "--verify"]));
    serve.assert_healthy();
}

/// MiB/s of a short read bench from 127.0.0.2 (attackers use 127.0.0.1).
fn throughput(uri: &str) -> f64 {
    let out = run(braid().args([
        "bench",
        uri,
        "--rw",
        "read",
        "--bs",
        "256K",
        "--iodepth",
        "4",
        "--time",
        "2",
        "--local",
        "127.0.0.2",
        "--json",
    ]));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["errors"], 0, "{j}");
    j["mib_per_s"].as_f64().unwrap()
}

#[test]
fn floods_and_stalls_cost_other_clients_little_and_memory_stays_bounded() {
    let mut serve = Serve::start(&[
        "--handshake-timeout",
        "2",
        "--max-connections-per-client",
        "64",
        "vol=mem:256MiB",
    ]);
    let uri = serve.uri("vol");
    let addr = serve.addr();
    let unloaded = throughput(&uri);

    // Thousands of 32 MiB reads whose replies are never read.
    let mut flood = RawClient::open(addr, "vol");
    for i in 0..2000u64 {
        let (_, req) = flood.encode_request(0, 0, (i % 8) << 25, 32 << 20);
        if flood.try_send(&req).is_err() {
            break;
        }
    }
    // A WRITE that claims 4 GiB of payload.
    let mut huge = RawClient::open(addr, "vol");
    let (_, req) = huge.encode_request(1, 0, 0, u32::MAX);
    let _ = huge.try_send(&req);

    // Many connections that never speak (past the per-client limit).
    let idle: Vec<TcpStream> = (0..200)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    // Slowloris: handshakes dribbled a byte at a time.
    let slow: Vec<std::thread::JoinHandle<()>> = (0..10)
        .map(|_| {
            std::thread::spawn(move || {
                let Ok(mut s) = TcpStream::connect(addr) else {
                    return;
                };
                for b in [0u8, 0, 0, 3, b'I', b'H', b'A', b'V', b'E'] {
                    if s.write_all(&[b]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(700));
                }
            })
        })
        .collect();
    let loaded = throughput(&uri);
    let rss_mib = serve.rss_kib() / 1024;
    eprintln!("throughput {unloaded:.0} MiB/s alone, {loaded:.0} MiB/s under attack; server RSS {rss_mib} MiB");
    assert!(
        loaded >= 0.5 * unloaded,
        "other clients' throughput fell from {unloaded:.0} to {loaded:.0} MiB/s"
    );
    assert!(rss_mib < 768, "server memory grew to {rss_mib} MiB");
    drop(idle);
    drop(flood);
    drop(huge);
    for t in slow {
        let _ = t.join();
    }
    serve.assert_healthy();
}
