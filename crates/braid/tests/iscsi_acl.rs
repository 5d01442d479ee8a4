//! `braid serve --iscsi-acl FILE`: each initiator logs in with its own
//! CHAP secret and sees only its exports, discovery has its own
//! credential, and initiators not in the list are refused. Checked over
//! real TCP with braid's initiator (mutual CHAP, and a login that claims
//! another host's name and ISID to end its session) and libiscsi's
//! iscsi-ls and iscsi-inq as another initiator would use them.

mod common;

use braid_test_needs::needs;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use braid_initiator::iscsi::{open, reserve, SessionConfig};
use braid_iscsi::chap::Credentials;
use braid_iscsi::initiator::login::Isid;
use common::{cmd, free_port, output, Serve};

const A: &str = "iqn.2026-11.org.example:host-a";
const B: &str = "iqn.2026-11.org.example:host-b";
const STRANGER: &str = "iqn.2026-11.org.example:stranger";
const VOL0: &str = "iqn.2026-11.org.braid-storage:vol0";
const VOL1: &str = "iqn.2026-11.org.braid-storage:vol1";

const ACL: &str = r#"
[discovery]
user = "finder"
secret = "discovery-secret"

[[initiator]]
name = "iqn.2026-11.org.example:host-a"
user = "host-a"
secret = "host-a-secret-1"
target_user = "braid"
target_secret = "braid-mutual-secret"
exports = ["vol0"]

[[initiator]]
name = "iqn.2026-11.org.example:host-b"
user = "host-b"
secret = "host-b-secret-1"
"#;

const SECRETS: [&str; 4] = [
    "discovery-secret",
    "host-a-secret-1",
    "braid-mutual-secret",
    "host-b-secret-1",
];

fn acl_file(dir: &Path, body: &str, mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("acl.toml");
    std::fs::write(&p, body).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

fn serve(dir: &Path, port: u16) -> Serve {
    let acl = acl_file(dir, ACL, 0o600);
    let control = dir.join("control.sock");
    Serve::start(&[
        "--control",
        control.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--iscsi",
        &port.to_string(),
        "--iscsi-acl",
        acl.to_str().unwrap(),
        "vol0=mem:8MiB",
        "vol1=mem:8MiB",
    ])
}

fn creds(user: &str, secret: &str, mutual: Option<(&str, &str)>) -> Option<Credentials> {
    Some(Credentials {
        user: user.into(),
        secret: secret.as_bytes().to_vec(),
        mutual: mutual.map(|(u, s)| (u.to_owned(), s.as_bytes().to_vec())),
    })
}

fn session(initiator: &str, target: &str, chap: Option<Credentials>) -> SessionConfig {
    SessionConfig {
        initiator: initiator.into(),
        target: target.into(),
        lun: 0,
        chap,
        params: braid_iscsi::negotiate::Params::default(),
        isid_random: 0x2a,
        next_qualifier: 1.into(),
    }
}

/// An error with its causes, as braid prints one.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_login_claiming_another_hosts_name_cannot_end_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut serve = serve(dir.path(), port);
    let spec = braid_initiator::discover::PathSpec {
        local: Default::default(),
        portal: braid_initiator::Endpoint::Tcp(format!("127.0.0.1:{port}").parse().unwrap()),
    };
    let t = Duration::from_secs(10);
    let isid = Isid::random(0x2a, 7);
    rt().block_on(async {
        let a_creds = creds(
            "host-a",
            "host-a-secret-1",
            Some(("braid", "braid-mutual-secret")),
        );
        // A's session, the target proving itself too (mutual CHAP).
        let a = open::open(&spec, &session(A, VOL0, a_creds.clone()), isid, t)
            .await
            .expect("A logs in with its own secret");
        assert_eq!(reserve::keys(&a.conn, t).await, Ok(vec![]));

        // B's credentials are good, but not for A's name: the login that
        // would reinstate A's session (same name, same ISID) is refused.
        let b_creds = creds("host-b", "host-b-secret-1", None);
        let e = open::open(&spec, &session(A, VOL0, b_creds.clone()), isid, t)
            .await
            .expect_err("a login as A with B's secret was accepted");
        assert!(
            chain(&e).contains("authentication failed (check the CHAP user and secret)"),
            "{}",
            chain(&e)
        );
        assert_eq!(
            reserve::keys(&a.conn, t).await,
            Ok(vec![]),
            "A's session ended"
        );

        // B logs in as itself, to either export.
        let b = open::open(&spec, &session(B, VOL1, b_creds), isid, t)
            .await
            .expect("B logs in with its own secret");
        b.conn.logout(t).await;

        // A may not see vol1, and a stranger may not log in at all.
        let e = open::open(&spec, &session(A, VOL1, a_creds.clone()), isid, t)
            .await
            .expect_err("A reached vol1");
        assert!(chain(&e).contains("no such target"), "{}", chain(&e));
        let e = open::open(&spec, &session(STRANGER, VOL0, a_creds), isid, t)
            .await
            .expect_err("an initiator not in the list logged in");
        assert!(
            chain(&e).contains("status 0x02/0x02"),
            "authorization failure expected: {}",
            chain(&e)
        );
        a.conn.logout(t).await;
    });
    serve.assert_healthy();
    // The refusal reaches the initiator before the target logs it.
    common::wait_until(Duration::from_secs(10), || {
        serve.log().contains("is not in this target's access list")
    });
    let log = serve.log();
    assert!(log.contains("iSCSI access list: 2 initiators; initiators not listed refused; discovery with its own CHAP credential"), "{log}");
    assert!(log.contains("is not in this target's access list"), "{log}");
    assert!(!log.contains("iSCSI without CHAP"), "{log}");
    let status = output(
        Command::new(env!("CARGO_BIN_EXE_braid")).args([
            "status",
            "--control",
            dir.path().join("control.sock").to_str().unwrap(),
            "--json",
        ]),
        Duration::from_secs(30),
    );
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains(VOL0), "{status}");
    for s in SECRETS {
        assert!(!log.contains(s), "{s} in the log:\n{log}");
        assert!(!status.contains(s), "{s} in braid status:\n{status}");
    }
}

fn said(c: &mut Command) -> (bool, String) {
    let out = output(c, Duration::from_secs(60));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[needs("iscsi-ls")]
fn libiscsi_discovers_and_logs_in_as_the_list_allows() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let serve = serve(dir.path(), port);
    let portal = |userinfo: &str| format!("iscsi://{userinfo}127.0.0.1:{port}");
    let ls = |who: &str, userinfo: &str| said(cmd("iscsi-ls").args(["-i", who, &portal(userinfo)]));

    // Discovery with its own credential lists what each initiator may see.
    let (ok, a) = ls(A, "finder%discovery-secret@");
    assert!(
        ok && a.contains(VOL0) && !a.contains(VOL1),
        "{a}\n{}",
        serve.log()
    );
    let (ok, b) = ls(B, "finder%discovery-secret@");
    assert!(ok && b.contains(VOL0) && b.contains(VOL1), "{b}");
    // A session's secret is not discovery's, and strangers see nothing.
    for (who, userinfo) in [
        (A, "host-a%host-a-secret-1@"),
        (A, ""),
        (STRANGER, "finder%discovery-secret@"),
    ] {
        let (ok, text) = ls(who, userinfo);
        assert!(
            !ok && !text.contains(VOL0),
            "{who} {userinfo:?} listed:\n{text}"
        );
    }

    let inq = |who: &str, userinfo: &str, target: &str| {
        said(cmd("iscsi-inq").args(["-i", who, &format!("{}/{target}/0", portal(userinfo))]))
    };
    let (ok, text) = inq(A, "host-a%host-a-secret-1@", VOL0);
    assert!(ok && text.contains("BRAID"), "{text}\n{}", serve.log());
    for (who, userinfo, target, why) in [
        (A, "host-b%host-b-secret-1@", VOL0, "Authentication failure"),
        (A, "host-a%host-a-secret-1@", VOL1, "Target not found"),
        (
            STRANGER,
            "host-b%host-b-secret-1@",
            VOL0,
            "Authorization failure",
        ),
    ] {
        let (ok, text) = inq(who, userinfo, target);
        assert!(
            !ok && text.contains(why),
            "{who} {userinfo} {target}: want {why:?}:\n{text}"
        );
    }
}

/// `braid serve` with this ACL file: its exit code and what it said.
fn refused(body: &str, mode: u32) -> String {
    let dir = tempfile::tempdir().unwrap();
    let acl = acl_file(dir.path(), body, mode);
    let out = output(
        Command::new(env!("CARGO_BIN_EXE_braid")).args([
            "serve",
            "--state-dir",
            dir.path().to_str().unwrap(),
            &format!("--iscsi={}", free_port()),
            "--iscsi-acl",
            acl.to_str().unwrap(),
            "vol0=mem:1MiB",
        ]),
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    err
}

#[test]
fn an_acl_file_others_can_read_or_with_a_short_secret_is_refused() {
    let e = refused(ACL, 0o644);
    assert!(
        e.contains("acl.toml: holds CHAP secrets but its mode is 0644") && e.contains("chmod 600"),
        "{e}"
    );
    let e = refused(&ACL.replace("host-b-secret-1", "short"), 0o600);
    assert!(
        e.contains("acl.toml, line 17: secret is 5 bytes; CHAP secrets must be 12 to 255 bytes"),
        "{e}"
    );
    let e = refused(&ACL.replace("\"vol0\"", "\"vol9\""), 0o600);
    assert!(
        e.contains("acl.toml, line 12: export \"vol9\" is not served here"),
        "{e}"
    );
    for s in SECRETS {
        assert!(!e.contains(s), "{s} in {e}");
    }
}
