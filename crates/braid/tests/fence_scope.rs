//! A fence (`x-braid:fence=<ids>`) closes only connections the asker owns:
//! those of the same export opened with the same initiator session token.
//! A plain NBD client, a client of another export and a client of the same
//! export with another token all name a victim's connection ids, fence
//! nothing, are told so, and the victim's I/O carries on.

mod common;
mod labkit;

use std::process::Command;

use common::{cmd, random_bytes, run, tool, Serve};
use labkit::{braid_bin, ctl, Attach};

/// The ids of the connections `braid serve` has open for `export`.
fn conn_ids(control: &std::path::Path, export: &str) -> Vec<String> {
    let out = Command::new(braid_bin())
        .args(["status", "--json", "--control"])
        .arg(control)
        .output()
        .unwrap();
    let p: ctl::Processes = serde_json::from_slice(&out.stdout).unwrap();
    match &p.processes[..] {
        [ctl::Status::Serve { connections, .. }] => connections
            .iter()
            .filter(|c| c.export.as_deref() == Some(export))
            .map(|c| c.id.to_string())
            .collect(),
        other => panic!("{other:?}"),
    }
}

/// Asks for a fence of `ids` over a fresh connection as libnbd would,
/// with `extra` queries (a session token) first; returns what happened.
fn try_fence(uri_host: &str, port: u16, export: &str, extra: &[String], ids: &[String]) -> String {
    let mut queries: Vec<String> = extra.to_vec();
    queries.push(format!("x-braid:fence={}", ids.join(",")));
    let adds: String = queries
        .iter()
        .map(|q| format!("h.add_meta_context({q:?})\n"))
        .collect();
    let script = format!(
        "h.set_opt_mode(True)\n\
h.set_export_name({export:?})\n\
h.connect_tcp({uri_host:?}, '{port}')\n\
{adds}\
try:\n    got = []\n    h.opt_list_meta_context(lambda name: got.append(name))\n    print('LISTED', got)\n\
except nbd.Error as e:\n    print('REFUSED', e)\n\
h.opt_abort()\n"
    );
    nbdsh(&script)
}

use common::nbdsh;

/// Writes a pattern through the attach socket and reads it back.
fn io_carries_on(attach: &Attach, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let back = dir.path().join("back");
    let data = random_bytes(4 << 20, seed);
    std::fs::write(&src, &data).unwrap();
    run(cmd("nbdcopy").arg(&src).arg(attach.uri()));
    run(cmd("nbdcopy").arg(attach.uri()).arg(&back));
    assert!(
        std::fs::read(&back).unwrap()[..data.len()] == data[..],
        "data differs"
    );
}

#[cfg_attr(
    braid_skip = "nbdsh",
    ignore = "needs nbdsh: install it (scripts/test-all installs every tool the tests use)"
)]
#[cfg_attr(
    braid_skip = "nbdcopy",
    ignore = "needs nbdcopy: install it (scripts/test-all installs every tool the tests use)"
)]
#[test]
fn only_the_owner_of_a_connection_can_fence_it() {
    if !tool("nbdsh") || !tool("nbdcopy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("serve.sock");
    let serve = Serve::start(&[
        "--control",
        control.to_str().unwrap(),
        "vol=mem:64MiB",
        "other=mem:64MiB",
    ]);
    let attach = Attach::start(None, &serve.uri("vol"), "vol", &[]);
    io_carries_on(&attach, 1);
    let victims = conn_ids(&control, "vol");
    assert!(!victims.is_empty());
    let addr = serve.addr();
    let (host, port) = (addr.ip().to_string(), addr.port());

    let stranger = format!("x-braid:session={}", "5".repeat(32));
    for (who, export, extra) in [
        ("a plain NBD client", "vol", vec![]),
        (
            "a client of another export",
            "other",
            vec![stranger.clone()],
        ),
        (
            "a client of the same export with another session",
            "vol",
            vec![stranger.clone()],
        ),
    ] {
        let said = try_fence(&host, port, export, &extra, &victims);
        assert!(said.contains("REFUSED"), "{who} was not refused: {said}");
        assert_eq!(
            conn_ids(&control, "vol"),
            victims,
            "{who} fenced the victims"
        );
        let v = attach.status();
        assert_eq!(
            v["paths"][0]["failures"], 0,
            "{who} broke the victim's path: {v}"
        );
        io_carries_on(&attach, 2);
    }
    let log = serve.log();
    assert!(
        log.matches("fence refused").count() >= 3,
        "each refusal is logged with the peer:\n{log}"
    );
    assert!(log.contains("127.0.0.1"), "{log}");
}
