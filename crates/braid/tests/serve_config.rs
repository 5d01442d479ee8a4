//! `braid serve --config FILE`: the keys that mirror flags take effect (a
//! read-only export beside a writable one, connection limits), and a flag
//! on the command line wins over its key.

mod common;

use braid_test_needs::needs;

use std::time::Duration;

use common::{cmd, output, Serve};

/// nbdinfo's view of one export: whether it is read-only.
fn read_only(uri: &str) -> bool {
    let out = output(
        cmd("nbdinfo").args(["--json", uri]),
        Duration::from_secs(20),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "nbdinfo {uri}: {text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["exports"][0]["is_read_only"]
        .as_bool()
        .unwrap_or_else(|| panic!("no is_read_only in {text}"))
}

#[needs("nbdinfo")]
fn config_keys_set_per_export_read_only_and_limits() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("serve.toml");
    std::fs::write(
        &conf,
        r#"
max_connections_per_client = 1
handshake_timeout = 5

[[export]]
name = "rw"
source = "mem:1MiB"

[[export]]
name = "ro"
source = "mem:1MiB"
read_only = true
"#,
    )
    .unwrap();
    let serve = Serve::start(&["--config", conf.to_str().unwrap()]);
    assert!(!read_only(&serve.uri("rw")));
    assert!(read_only(&serve.uri("ro")));

    // One connection per client address: a second one is turned away
    // while the first is open.
    let first = std::net::TcpStream::connect(serve.addr()).unwrap();
    let out = output(cmd("nbdinfo").arg(serve.uri("rw")), Duration::from_secs(20));
    assert!(
        !out.status.success(),
        "a second connection got in: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    drop(first);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    // The server notices the first connection's close on its own time.
    while output(cmd("nbdinfo").arg(serve.uri("rw")), Duration::from_secs(20))
        .status
        .code()
        != Some(0)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the limit never let a connection in again:\n{}",
            serve.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A flag wins over its key.
    let serve = Serve::start(&[
        "--config",
        conf.to_str().unwrap(),
        "--max-connections-per-client",
        "4",
    ]);
    let _first = std::net::TcpStream::connect(serve.addr()).unwrap();
    assert!(
        !read_only(&serve.uri("rw")),
        "a second connection is allowed now"
    );
}

#[test]
fn read_only_export_flag_names_an_export() {
    let out = output(
        std::process::Command::new(env!("CARGO_BIN_EXE_braid")).args([
            "serve",
            "--read-only-export",
            "nope",
            "vol=mem:1MiB",
        ]),
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--read-only-export \"nope\""), "{err}");
}
