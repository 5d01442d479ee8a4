//! braid's iSCSI initiator on loopback, against braid's own target and
//! against tgt: `braid copy` in and out verified by sha256 over two
//! portals (found by SendTargets from braid's target, named with
//! `--portal` for tgt, whose SendTargets lists only the portal asked);
//! `bench --verify`; CHAP and mutual CHAP with right and wrong secrets;
//! a portal leading to another unit refused with both identities; and
//! `braid attach` of an iSCSI volume read through an NBD client, its
//! status naming the fence braid's target gets.

mod common;
mod labkit;
mod tgtkit;

use braid_test_needs::needs;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::{cmd, free_port, output, random_file, sha256, sparse_file, tool, Serve};
use tgtkit::Tgt;

const TGT_IQN: &str = "iqn.2026-11.org.example:disk";
const BRAID_IQN: &str = "iqn.2026-11.org.braid-storage:vol";

fn braid(args: &[&str]) -> Output {
    output(
        cmd(env!("CARGO_BIN_EXE_braid"))
            .args(args)
            .env("NO_COLOR", "1"),
        Duration::from_secs(120),
    )
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(args: &[&str]) -> String {
    let o = braid(args);
    let t = text(&o);
    assert!(o.status.success(), "braid {args:?} failed:\n{t}");
    t
}

/// `braid bench ... --json` run to success, its JSON read; no errors and
/// no verify mismatches asserted.
fn bench_clean(args: &[&str]) {
    let o = braid(args);
    assert!(o.status.success(), "braid {args:?} failed:\n{}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("bench JSON");
    assert_eq!(
        (j["errors"].as_u64(), j["verify_errors"].as_u64()),
        (Some(0), Some(0)),
        "{j}"
    );
}

fn fails(args: &[&str]) -> String {
    let o = braid(args);
    let t = text(&o);
    assert!(!o.status.success(), "braid {args:?} succeeded:\n{t}");
    t
}

/// braid serve with two portals (127.0.0.1 and .2) serving `vol` over NBD
/// and iSCSI on `port`, with any extra arguments.
fn braid_target(dir: &Path, port: u16, extra: &[&str]) -> Serve {
    let disk = sparse_file(dir, "disk.img", 64 << 20);
    let mut args = vec![
        "--listen".to_owned(),
        "127.0.0.1:0".into(),
        "--listen".into(),
        "127.0.0.2:0".into(),
        "--iscsi".into(),
        port.to_string(),
        format!("vol={}", disk.display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Serve::start(&args)
}

/// Copies a file in and back out and checks both copies byte for byte;
/// returns what the copy in printed.
fn copy_round_trip(dir: &Path, uri: &str, extra: &[&str]) -> String {
    // Not a whole number of blocks: the last one is merged with what the
    // volume holds.
    let src = random_file(dir, (24 << 20) + 1000, 7);
    let back = dir.join("back.img");
    let mut a = vec!["copy", "--verify", src.to_str().unwrap(), uri];
    a.extend(extra);
    let copied_in = ok(&a);
    assert!(copied_in.contains("verified: sha256"), "{copied_in}");
    let mut b = vec!["copy", "--verify", uri, back.to_str().unwrap()];
    b.extend(extra);
    ok(&b);
    let head = std::fs::read(&back).unwrap();
    let want = std::fs::read(&src).unwrap();
    assert_eq!(
        common::sha256_bytes(&head[..want.len()]),
        sha256(&src),
        "what came back out differs"
    );
    copied_in
}

#[test]
fn copy_and_bench_over_every_portal_of_braids_target() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let serve = braid_target(dir.path(), port, &[]);
    let uri = format!("iscsi://127.0.0.1:{port}/{BRAID_IQN}/0");
    let out = copy_round_trip(dir.path(), &uri, &[]);
    // SendTargets named the second portal: both carried data.
    for p in [format!("127.0.0.1:{port}"), format!("127.0.0.2:{port}")] {
        assert!(out.contains(&format!("({p})")), "{p} not used:\n{out}");
    }
    bench_clean(&[
        "bench", "--rw", "randrw", "--bs", "64k", "--time", "2", "--verify", "--json", &uri,
    ]);
    drop(serve);
}

/// tgt on `portals` serving target 1 ([`TGT_IQN`]) with LUN 1 on a new
/// sparse file `name` of `size` bytes in `dir`, its unit serial `serial`.
fn tgt_lun(portals: &[SocketAddr], dir: &Path, name: &str, size: u64, serial: &str) -> Tgt {
    let mut tgt = Tgt::start(portals);
    tgt.target(1, TGT_IQN, 1, &sparse_file(dir, name, size), serial);
    tgt
}

#[needs("root", "tgtd")]
fn copy_and_bench_against_tgt_with_a_portal_per_path() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let portals: Vec<SocketAddr> = ["127.0.0.1", "127.0.0.2"]
        .iter()
        .map(|a| format!("{a}:{port}").parse().unwrap())
        .collect();
    let mut tgt = tgt_lun(&portals, dir.path(), "lun.img", 64 << 20, "braid0001");
    let uri = format!("iscsi://127.0.0.1:{port}/{TGT_IQN}/1");
    let (p1, p2) = (portals[0].to_string(), portals[1].to_string());
    let paths = ["--portal", &p1, "--portal", &p2];
    let out = copy_round_trip(dir.path(), &uri, &paths);
    assert!(out.contains(&format!("({p2})")), "{out}");
    let mut args = vec![
        "bench", "--rw", "randrw", "--bs", "64k", "--time", "2", "--verify", "--json", &uri,
    ];
    args.extend(paths);
    bench_clean(&args);
    tgt.stop();
}

fn chap_file(dir: &Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    p.display().to_string()
}

/// The CHAP cases, against a target at `uri` that knows the initiator as
/// client / client-secret-1 and proves itself as nas / nas-secret-22.
fn chap_cases(dir: &Path, uri: &str) {
    let bench = |extra: &[&str]| {
        let mut a = vec!["bench", "--time", "0.5", "--bs", "64k", uri];
        a.extend(extra);
        braid(&a)
    };
    let good = |extra: &[&str]| {
        let o = bench(extra);
        assert!(o.status.success(), "{extra:?}:\n{}", text(&o));
    };
    let bad = |extra: &[&str]| {
        let o = bench(extra);
        assert!(!o.status.success(), "{extra:?} succeeded:\n{}", text(&o));
        text(&o)
    };
    let right = chap_file(
        dir,
        "right.toml",
        "user = \"client\"\nsecret = \"client-secret-1\"\n",
    );
    let mutual = chap_file(
        dir,
        "mutual.toml",
        "user = \"client\"\nsecret = \"client-secret-1\"\ntarget_user = \"nas\"\ntarget_secret = \"nas-secret-22\"\n",
    );
    let wrong = chap_file(
        dir,
        "wrong.toml",
        "user = \"client\"\nsecret = \"client-secret-X\"\n",
    );
    let bad_target = chap_file(
        dir,
        "bad-target.toml",
        "user = \"client\"\nsecret = \"client-secret-1\"\ntarget_user = \"nas\"\ntarget_secret = \"nas-secret-XX\"\n",
    );
    good(&["--chap-secret-file", &right]);
    good(&["--chap-secret-file", &mutual]);
    let e = bad(&[]);
    assert!(e.contains("authentication failed"), "no credentials:\n{e}");
    let e = bad(&["--chap-secret-file", &wrong]);
    assert!(
        e.contains("check the CHAP user and secret"),
        "wrong secret:\n{e}"
    );
    let e = bad(&["--chap-secret-file", &bad_target]);
    assert!(e.contains("mutual CHAP"), "the target's wrong secret:\n{e}");
    // The secret in the URI works too, and is never printed.
    let with_secret = uri.replacen("iscsi://", "iscsi://client%client-secret-1@", 1);
    let o = ok(&["bench", "--time", "0.5", "--bs", "64k", &with_secret]);
    assert!(!o.contains("client-secret-1"), "{o}");
}

#[test]
fn chap_and_mutual_chap_against_braids_target() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let creds = chap_file(
        dir.path(),
        "target.toml",
        "user = \"client\"\nsecret = \"client-secret-1\"\ntarget_user = \"nas\"\ntarget_secret = \"nas-secret-22\"\n",
    );
    let _serve = braid_target(dir.path(), port, &["--iscsi-chap", &creds]);
    chap_cases(
        dir.path(),
        &format!("iscsi://127.0.0.1:{port}/{BRAID_IQN}/0"),
    );
}

#[needs("root", "tgtd")]
fn chap_and_mutual_chap_against_tgt() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut tgt = tgt_lun(
        &[format!("127.0.0.1:{port}").parse().unwrap()],
        dir.path(),
        "lun.img",
        16 << 20,
        "braid0002",
    );
    tgt.chap(
        1,
        ("client", "client-secret-1"),
        Some(("nas", "nas-secret-22")),
    );
    chap_cases(dir.path(), &format!("iscsi://127.0.0.1:{port}/{TGT_IQN}/1"));
    tgt.stop();
}

#[test]
fn a_portal_leading_to_another_unit_is_refused_with_both_identities() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (pa, pb) = (free_port(), free_port());
    // Two targets of the same name and size: different units.
    let _one = braid_target(a.path(), pa, &[]);
    let _two = braid_target(b.path(), pb, &[]);
    let uri = format!("iscsi://127.0.0.1:{pa}/{BRAID_IQN}/0");
    let other = format!("127.0.0.1:{pb}");
    let e = fails(&[
        "bench",
        "--time",
        "0.5",
        &uri,
        "--portal",
        &format!("127.0.0.1:{pa}"),
        "--portal",
        &other,
    ]);
    assert!(
        e.contains(&format!("portal {other} serves LUN naa.")),
        "{e}"
    );
    assert!(
        e.matches("LUN naa.").count() == 2,
        "both identities named:\n{e}"
    );
    drop(dir);
}

#[test]
fn braid_attach_serves_an_iscsi_volume_to_nbd_clients() {
    if !tool("nbdcopy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _serve = braid_target(dir.path(), port, &[]);
    let uri = format!("iscsi://127.0.0.1:{port}/{BRAID_IQN}/0");
    let src = random_file(dir.path(), 8 << 20, 11);
    ok(&["copy", src.to_str().unwrap(), &uri]);
    let attach = labkit::Attach::start(None, &uri, "disk", &[]);
    let back = dir.path().join("through-nbd.img");
    let o = output(
        cmd("nbdcopy").arg(attach.uri()).arg(&back),
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}\n{}", text(&o), attach.log());
    let got = std::fs::read(&back).unwrap();
    assert_eq!(common::sha256_bytes(&got[..8 << 20]), sha256(&src));
    let status = attach.status();
    assert_eq!(
        status["paths"].as_array().map(Vec::len),
        Some(2),
        "{status}"
    );
    assert_eq!(status["fence"], "reinstatement", "{status}");
}

#[needs("root", "tgtd")]
fn a_tgt_portal_leading_to_another_lun_is_refused_with_both_identities() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let a: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let b: SocketAddr = format!("127.0.0.2:{port}").parse().unwrap();
    // Two tgt instances, one target name and LUN size, different units
    // (tgt names a unit by its serial).
    let mut one = tgt_lun(&[a], dir.path(), "a.img", 64 << 20, "braidA001");
    let mut two = tgt_lun(&[b], dir.path(), "b.img", 64 << 20, "braidB002");
    let uri = format!("iscsi://{a}/{TGT_IQN}/1");
    let (pa, pb) = (a.to_string(), b.to_string());
    let e = fails(&[
        "bench", "--time", "0.5", &uri, "--portal", &pa, "--portal", &pb,
    ]);
    assert!(e.contains(&format!("portal {pb} serves LUN ")), "{e}");
    assert!(
        e.matches("LUN ").count() >= 2,
        "both identities named:\n{e}"
    );
    one.stop();
    two.stop();
}
