//! `braid status --json` and the control socket's messages have the shape
//! of `crate::ctl` (the same file, included through labkit): a serve and an
//! attach answer with every field typed and nothing unknown, and a
//! malformed request gets an answer that says so.

mod common;
mod labkit;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;

use common::Serve;
use labkit::{braid_bin, ctl, Attach};

fn status_json(control: &Path) -> ctl::Processes {
    let out = Command::new(braid_bin())
        .args(["status", "--json", "--control"])
        .arg(control)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
    })
}

/// One raw line to a control socket, one line back.
fn ask(control: &Path, line: &str) -> serde_json::Value {
    let mut s = UnixStream::connect(control).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    s.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer).unwrap();
    serde_json::from_str(&answer).unwrap()
}

#[test]
fn serve_and_attach_status_fit_the_typed_schema() {
    let dir = tempfile::tempdir().unwrap();
    let serve_ctl = dir.path().join("serve.sock");
    // With iSCSI, whose part of the status is a front end's own key.
    let serve = Serve::start(&["--control", serve_ctl.to_str().unwrap(), "--iscsi", "0"]);
    let attach = Attach::start(None, &serve.uri("vol"), "vol", &[]);

    let seen = status_json(&serve_ctl);
    match &seen.processes[..] {
        [ctl::Status::Serve {
            ok: true,
            portals,
            exports,
            connections,
            front_ends,
            ..
        }] => {
            assert_eq!(portals.len(), 1);
            let iscsi = front_ends.iscsi.as_ref().expect("the iSCSI side");
            assert_eq!(iscsi.portals.len(), 1, "{iscsi:?}");
            assert!(iscsi.targets[0].ends_with(":vol"), "{iscsi:?}");
            assert_eq!(exports[0].name, "vol");
            assert!(!connections.is_empty(), "the attach's connection is listed");
            assert!(connections
                .iter()
                .all(|c| c.export.as_deref() == Some("vol")));
        }
        other => panic!("not one serve: {other:?}"),
    }
    let seen = status_json(&attach.control);
    match &seen.processes[..] {
        [ctl::Status::Attach {
            ok: true, volumes, ..
        }] => {
            assert_eq!(volumes[0].name, "vol");
            assert_eq!(volumes[0].paths.len(), 1);
            assert_eq!(volumes[0].paths[0].state, "active");
        }
        other => panic!("not one attach: {other:?}"),
    }

    // The iSCSI part sits under "iscsi" in the serve's own object, where
    // it has always been, not under a key of the type that holds it.
    let raw = ask(&serve_ctl, r#"{"op":"status"}"#);
    assert!(raw["iscsi"]["portals"][0]["state"].is_string(), "{raw}");
    assert!(raw.get("front_ends").is_none(), "{raw}");

    // Requests: typed answers, and mistakes answered, not dropped.
    let ack: ctl::Ack = serde_json::from_value(ask(
        &attach.control,
        r#"{"op":"path","volume":"vol","path":1,"set":["weight=2"]}"#,
    ))
    .unwrap();
    assert!(ack.ok, "{ack:?}");
    assert!(ack.config.unwrap().contains("weight=2"));
    for bad in [
        r#"{"op":"reboot"}"#,
        r#"{"op":"path","volume":"vol"}"#,
        "not json",
    ] {
        let ack: ctl::Ack = serde_json::from_value(ask(&attach.control, bad)).unwrap();
        assert!(
            !ack.ok && ack.error.unwrap().contains("bad request"),
            "{bad}"
        );
    }
    let ack: ctl::Ack = serde_json::from_value(ask(
        &serve_ctl,
        r#"{"op":"policy","volume":"vol","policy":"failover"}"#,
    ))
    .unwrap();
    assert!(!ack.ok, "a serve has no policy to switch");
}

#[test]
fn requests_are_written_as_the_socket_reads_them() {
    let r: ctl::Request =
        serde_json::from_str(r#"{"op":"path","volume":"v","path":2,"set":["weight=3"]}"#).unwrap();
    assert_eq!(
        r,
        ctl::Request::Path {
            volume: "v".into(),
            path: 2,
            enable: None,
            set: Some(vec!["weight=3".into()])
        }
    );
    assert_eq!(
        serde_json::to_string(&ctl::Request::Status).unwrap(),
        r#"{"op":"status"}"#
    );
}
