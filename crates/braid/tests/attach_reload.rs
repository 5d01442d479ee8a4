//! `systemctl reload braid-attach` (SIGHUP): `braid attach --config`
//! re-reads its file and attaches or detaches only the volumes that
//! changed. A client of a volume that stays keeps its connection across
//! the reload, and its data.

mod common;
mod labkit;

use braid_test_needs::needs;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{cmd, nbdsh, signal, ChildGuard, Serve};
use labkit::braid_bin;

/// An attach configuration naming `volumes` of `serve`, each on its own
/// socket in `dir`.
fn write_config(path: &Path, dir: &Path, serve: &Serve, volumes: &[&str]) {
    let mut text = String::new();
    for v in volumes {
        text.push_str(&format!(
            "[[volume]]\nuri = {:?}\nname = {v:?}\nsocket = {:?}\n\n",
            serve.uri(v),
            socket(dir, v).display().to_string()
        ));
    }
    std::fs::write(path, text).expect("writing the configuration");
}

fn socket(dir: &Path, volume: &str) -> PathBuf {
    dir.join(format!("{volume}.sock"))
}

/// The attached volume names `braid status --json` reports.
fn attached(control: &Path) -> Vec<String> {
    let out = Command::new(braid_bin())
        .args(["status", "--json", "--control"])
        .arg(control)
        .output()
        .expect("braid status");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let mut names: Vec<String> = v["processes"][0]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

fn wait_for(control: &Path, want: &[&str], log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while attached(control) != want {
        assert!(
            Instant::now() < deadline,
            "attached {:?}, want {want:?}; log:\n{}",
            attached(control),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn uri(dir: &Path, volume: &str) -> String {
    format!(
        "nbd+unix:///{volume}?socket={}",
        socket(dir, volume).display()
    )
}

#[needs("nbdsh")]
fn a_reload_attaches_and_detaches_one_volume_and_leaves_the_other_alone() {
    let serve = Serve::start(&["a=mem:8MiB", "b=mem:8MiB"]);
    let dir = tempfile::tempdir().expect("temporary dir");
    let config = dir.path().join("attach.toml");
    let control = dir.path().join("control.sock");
    let log = dir.path().join("attach.log");
    write_config(&config, dir.path(), &serve, &["a"]);
    let mut attach = ChildGuard::spawn(
        Command::new(braid_bin())
            .arg("attach")
            .arg("--config")
            .arg(&config)
            .arg("--control")
            .arg(&control)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file")),
    );
    wait_for(&control, &["a"], &log);

    // A client of "a" writes, then holds its connection open across both
    // reloads and reads back on the same connection afterwards.
    let script = format!(
        r#"
import sys
h.connect_uri({a:?})
h.pwrite(b"\xaa" * 65536, 0)
print("written", flush=True)
sys.stdin.readline()
ok = h.pread(65536, 0) == b"\xaa" * 65536
h.pwrite(b"\xbb" * 4096, 65536)
h.flush()
print("SAME CONNECTION OK" if ok else "DATA CHANGED", flush=True)
"#,
        a = uri(dir.path(), "a")
    );
    let mut client = ChildGuard::spawn(
        cmd("nbdsh")
            .arg("-c")
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let mut out = BufReader::new(client.0.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("client output");
    assert_eq!(line.trim(), "written");

    // Add "b".
    write_config(&config, dir.path(), &serve, &["a", "b"]);
    signal(attach.0.id(), libc::SIGHUP);
    wait_for(&control, &["a", "b"], &log);
    let got = nbdsh(&format!(
        "h.connect_uri({:?})\nh.pwrite(b'\\xcc' * 4096, 0)\nh.flush()\nprint(h.get_size())\n",
        uri(dir.path(), "b")
    ));
    assert_eq!(got.trim(), "8388608", "b is served");

    // A configuration that does not parse changes nothing.
    std::fs::write(&config, "[[volume]]\nuri = 42\n").expect("bad config");
    signal(attach.0.id(), libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("nothing changed")
    {
        assert!(Instant::now() < deadline, "the bad file was not reported");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(attached(&control), ["a", "b"]);

    // Drop "b" again.
    write_config(&config, dir.path(), &serve, &["a"]);
    signal(attach.0.id(), libc::SIGHUP);
    wait_for(&control, &["a"], &log);
    assert!(!socket(dir.path(), "b").exists(), "b's socket is removed");

    // "a" was never touched: its client carries on on the same connection.
    client
        .0
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"\n")
        .expect("resume the client");
    let mut line = String::new();
    out.read_line(&mut line).expect("client output");
    assert_eq!(
        line.trim(),
        "SAME CONNECTION OK",
        "log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    client.wait(Duration::from_secs(10));

    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("reload: 1 added, 0 removed, 0 changed, 0 failed"),
        "{text}"
    );
    assert!(
        text.contains("reload: 0 added, 1 removed, 0 changed, 0 failed"),
        "{text}"
    );
    assert!(
        attach.wait(Duration::ZERO).is_none(),
        "braid attach still runs"
    );
}
