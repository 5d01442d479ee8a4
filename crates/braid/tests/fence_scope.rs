//! A fence (`x-braid:fence=<ids>`) closes only connections the asker owns:
//! those of the same export opened with the same initiator session token.
//! A plain NBD client, a client of another export and a client of the same
//! export with another token all name a victim's connection ids, fence
//! nothing, are told so, and the victim's I/O carries on.

mod common;
mod labkit;

use braid_test_needs::needs;

use std::process::Command;

use common::{cmd, random_bytes, run, Serve};
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

#[needs("nbdsh", "nbdcopy")]
fn only_the_owner_of_a_connection_can_fence_it() {
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

/// The `x-braid:fence=` context in a confirmed fence's answer.
fn confirmed(said: &str) -> bool {
    said.contains("LISTED") && said.contains("x-braid:fence=")
}

/// A made-up session token: the ids named are not this server's, so the
/// session check has nothing to compare it with.
fn token(fill: char) -> Vec<String> {
    vec![format!("x-braid:session={}", fill.to_string().repeat(32))]
}

/// A fence is confirmed only for connections the server itself issued:
/// ids it never issued may be another server's, whose requests it cannot
/// drain, so it says so and the initiator asks elsewhere. Two `braid
/// serve` processes with one `--volume-id` (two heads over one shared
/// LUN, a setup README no longer describes) are where that bites: a
/// client fails over to the second head, which confirmed the first
/// head's connections as fenced while their writes were still running.
#[needs("nbdsh", "nbdcopy")]
fn a_fence_of_connections_this_server_never_issued_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("a.sock");
    let one_id = "vol=4a0c5e2e-6f0b-4d53-a0d4-1c2b3d4e5f60";
    let a = Serve::start(&[
        "--control",
        control.to_str().unwrap(),
        "--volume-id",
        one_id,
        "vol=mem:64MiB",
    ]);
    let b = Serve::start(&["--volume-id", one_id, "vol=mem:64MiB"]);
    let attach = Attach::start(None, &a.uri("vol"), "vol", &[]);
    io_carries_on(&attach, 3);
    let a_ids = conn_ids(&control, "vol");
    assert!(!a_ids.is_empty());
    let made_up = vec![format!("{:032x}", 0x5eed_u128 << 70 | 0x1234)];
    for (who, serve, ids) in [
        ("another server's connections", &b, &a_ids),
        ("a made-up id, asked of the other server", &b, &made_up),
        ("a made-up id, asked of the server", &a, &made_up),
    ] {
        let addr = serve.addr();
        let said = try_fence(&addr.ip().to_string(), addr.port(), "vol", &token('7'), ids);
        assert!(
            !confirmed(&said) && said.contains("REFUSED"),
            "{who}: a fence of ids this server never issued was confirmed: {said}"
        );
    }
    for serve in [&a, &b] {
        let log = serve.log();
        assert!(
            log.contains("fence refused") && log.contains("not issued by this server"),
            "the refusal is logged and says why:\n{log}"
        );
    }
    assert_eq!(conn_ids(&control, "vol"), a_ids, "nothing was fenced");
    io_carries_on(&attach, 4);
}

/// A server that restarts with the same `--state-dir` knows the ids its
/// earlier process issued: that process is gone, and so is everything it
/// had in flight, so a fence of them is confirmed (an initiator whose
/// path failed with the server fences before it re-sends). With another
/// state directory it cannot tell them from another server's.
#[needs("nbdsh", "nbdcopy")]
fn a_restarted_server_confirms_fences_of_its_earlier_process() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let control = dir.path().join("serve.sock");
    let port = common::free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let args = |state: &std::path::Path| -> Vec<String> {
        vec![
            "--listen".into(),
            listen.clone(),
            "--state-dir".into(),
            state.display().to_string(),
            "--control".into(),
            control.display().to_string(),
            "vol=mem:64MiB".into(),
        ]
    };
    let start = |state: &std::path::Path| {
        let a = args(state);
        Serve::start(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let mut first = start(&state);
    let attach = Attach::start(None, &first.uri("vol"), "vol", &[]);
    io_carries_on(&attach, 5);
    let old = conn_ids(&control, "vol");
    drop(attach);
    common::signal(first.pid(), libc::SIGKILL);
    first.stop();

    let mut second = start(&state);
    let said = try_fence("127.0.0.1", second.addr().port(), "vol", &token('8'), &old);
    assert!(
        confirmed(&said),
        "the earlier process's connections are gone: {said}"
    );
    second.stop();
    let _third = start(&dir.path().join("another-state"));
    let said = try_fence("127.0.0.1", _third.addr().port(), "vol", &token('9'), &old);
    assert!(
        !confirmed(&said),
        "with another state directory they are strangers: {said}"
    );
}
