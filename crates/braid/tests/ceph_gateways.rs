//! Several `braid serve` gateways of one Ceph RBD image, every one active,
//! on a real throwaway cluster (`cephkit`): one URI finds every gateway's
//! portals; a copy through one URI uses every gateway and is checked by
//! sha256 and, independently, by `rbd export`; fio verifies through
//! `braid attach` over two gateways; a gateway killed under a verified
//! write load costs no I/O error and no replay, its record goes, and it
//! rejoins when restarted; a dead gateway's record expires and is removed;
//! a clone's or copy's gateways remove the records copied with the image's
//! metadata and never fence the original's gateway; two images of one name
//! in two RADOS namespaces are two volumes, each with its own records and
//! barrier; after `rbd resize` grows the image, `braid attach`'s path that
//! reconnects comes back and the volume keeps the size it was attached
//! with, and after a shrink that path stays out and the log says why.

#![cfg(feature = "rbd")]

mod cephkit;
mod common;
mod failkit;
mod labkit;

use braid_test_needs::needs;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{cmd, random_file, run, sha256, sha256_bytes, signal, Serve};

const MIB: usize = 1 << 20;

/// The `x-braid:` contexts a gateway lists.
fn contexts(g: &Serve) -> Vec<String> {
    let out = run(cmd("nbdinfo").args(["--list", &g.uri("vol")]));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("x-braid:"))
        .map(str::to_owned)
        .collect()
}

fn listed(g: &Serve, kind: &str) -> BTreeSet<String> {
    let prefix = format!("x-braid:{kind}=");
    contexts(g)
        .iter()
        .filter_map(|c| c.strip_prefix(&prefix).map(str::to_owned))
        .collect()
}

/// GET /api/snapshot of a serve console on loopback.
fn console_snapshot(port: u16) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the console");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /api/snapshot HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let body = resp.split_once("\r\n\r\n").expect("an HTTP answer").1;
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[needs("ceph-mon")]
fn one_uri_finds_every_gateway_and_a_copy_through_it_uses_all_three() {
    let Some(c) = cephkit::ceph() else { return };
    if !common::tool("nbdinfo") {
        return;
    }
    let img = c.image("three", "64M", Some("layering"));
    let http = common::free_port();
    let console = format!("127.0.0.1:{http}");
    let gws: Vec<Serve> = (0..3)
        .map(|i| match i {
            0 => c.gateway(&img, &["--http", &console]),
            _ => c.gateway(&img, &[]),
        })
        .collect();
    let all: BTreeSet<String> = gws.iter().map(|g| g.addr().to_string()).collect();
    for g in &gws {
        cephkit::eventually(
            Duration::from_secs(20),
            "every gateway lists all three",
            || listed(g, "portal") == all,
        );
    }
    // The serve console shows the gateway's live peers and its lease.
    let others: BTreeSet<String> = all
        .iter()
        .filter(|a| **a != gws[0].addr().to_string())
        .cloned()
        .collect();
    let snapshot = console_snapshot(http);
    let peers: BTreeSet<String> = snapshot["exports"][0]["peers"]
        .as_array()
        .unwrap_or_else(|| panic!("no peers: {snapshot}"))
        .iter()
        .filter_map(|p| p.as_str().map(str::to_owned))
        .collect();
    assert_eq!(peers, others, "{snapshot}");
    assert_eq!(snapshot["gateway_lease_s"], 15.0, "{snapshot}");
    // One volume to the initiator: the same identity and the same
    // instance whichever gateway answers.
    let volumes: BTreeSet<_> = gws.iter().flat_map(|g| listed(g, "volume")).collect();
    let instances: BTreeSet<_> = gws.iter().flat_map(|g| listed(g, "instance")).collect();
    assert_eq!(
        (volumes.len(), instances.len()),
        (1, 1),
        "{volumes:?} {instances:?}"
    );
    assert_eq!(img.gateways().len(), 3, "a record per gateway");

    let dir = tempfile::tempdir().unwrap();
    let src = random_file(dir.path(), 64 * MIB, 33);
    let copy = |from: &str, to: &str| {
        let out = run(Command::new(env!("CARGO_BIN_EXE_braid"))
            .args(["copy", "--verify", "--no-progress", from, to])
            .env("NO_COLOR", "1"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = copy(&src.display().to_string(), &gws[0].uri("vol"));
    // `  path N (PORTAL): SIZE (P%)` per path: each gateway carried some.
    let used: BTreeSet<String> = out
        .lines()
        .filter(|l| l.trim_start().starts_with("path "))
        .filter(|l| !l.trim_end().ends_with("(0.0%)"))
        .filter_map(|l| Some(l.split_once('(')?.1.split_once(')')?.0.to_owned()))
        .collect();
    assert_eq!(used, all, "every gateway carried part of the copy:\n{out}");
    let back = dir.path().join("back.raw");
    copy(&gws[1].uri("vol"), &back.display().to_string());
    assert_eq!(
        sha256(&back),
        sha256(&src),
        "read back through the gateways"
    );
    assert_eq!(
        sha256_bytes(&img.export()),
        sha256(&src),
        "rbd export of the cluster"
    );
}

#[needs("ceph-mon", "fio")]
fn fio_through_braid_attach_over_two_gateways_verifies_crc32c() {
    let Some(c) = cephkit::ceph() else { return };
    if !common::tool("fio") {
        return;
    }
    let img = c.image("attach", "32M", Some("layering"));
    let a = c.gateway(&img, &[]);
    let b = c.gateway(&img, &[]);
    cephkit::eventually(Duration::from_secs(20), "A lists B", || {
        listed(&a, "portal").contains(&b.addr().to_string())
    });
    let attach = labkit::Attach::start(None, &a.uri("vol"), "vol", &[]);
    cephkit::fio_verify(&attach.uri(), "64k");
    let status = attach.status();
    let paths = status["paths"].as_array().expect("paths");
    assert_eq!(paths.len(), 2, "{status:#}");
    for p in paths {
        assert!(
            p["written_bytes"].as_u64() > Some(0),
            "a gateway carried nothing: {p:#}"
        );
    }
}

#[needs("ceph-mon")]
fn a_gateway_killed_under_a_verified_write_load_costs_no_error_and_rejoins() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("kill", "32M", Some("layering"));
    let lease = ["--gateway-lease", "3"];
    let a = c.gateway(&img, &lease);
    let b_portal = format!("127.0.0.1:{}", common::free_port());
    let b_args = [&lease[..], &["--listen", &b_portal]].concat();
    let b = c.gateway(&img, &b_args);
    cephkit::eventually(Duration::from_secs(20), "A lists B", || {
        listed(&a, "portal").contains(&b_portal)
    });
    let bs = 64 * 1024;
    let rt = rt();
    let (log, acked) = rt.block_on(async {
        let vol = failkit::open(&a.uri("vol"), |_| {}).await;
        assert_eq!(vol.info().paths.len(), 2, "both gateways from one URI");
        let start = Instant::now();
        let w = failkit::Workload {
            blocks: 256,
            bs,
            depth: 8,
            duration: Duration::from_secs(8),
        };
        let load = tokio::spawn(failkit::run(vol.clone(), w, start));
        tokio::time::sleep(Duration::from_secs(2)).await;
        signal(b.pid(), libc::SIGKILL);
        let log = load.await.unwrap();
        let bad = failkit::check_acknowledged(&vol, &log, bs).await;
        assert!(bad.is_empty(), "{bad:?}");
        let acked: Vec<(u64, u64)> = log.acked.iter().map(|(b, (v, _))| (*b, *v)).collect();
        // A gateway's death lost nothing it acknowledged: no replay.
        assert_eq!(vol.report().replay.replays, 0);
        vol.close().await;
        (log, acked)
    });
    assert!(log.errors.is_empty(), "I/O errors: {:?}", log.errors);
    assert!(log.mismatches.is_empty(), "{:?}", log.mismatches);
    // What the cluster holds, read without any gateway.
    let data = img.export();
    failkit::assert_holds(&data, &acked, bs, "in the cluster");
    // B's record is gone: A fenced B (blocklisted it) when the client
    // asked it to fence B's connections.
    let a_addr = a.addr().to_string();
    cephkit::eventually(Duration::from_secs(30), "only A's record is left", || {
        let g = img.gateways();
        g.len() == 1 && g[0]["portals"][0] == a_addr.as_str()
    });
    assert!(!listed(&a, "portal").contains(&b_portal));
    assert!(
        a.log().contains("gateway fenced: blocklisted"),
        "{}",
        a.log()
    );
    drop(b);
    // Restarted on the same portal, B rejoins: A announces it again.
    let b = c.gateway(&img, &b_args);
    cephkit::eventually(Duration::from_secs(20), "A lists B again", || {
        listed(&a, "portal").contains(&b_portal)
    });
    assert_eq!(img.gateways().len(), 2);
    // And a client uses it again.
    rt.block_on(async {
        let vol = failkit::open(&a.uri("vol"), |_| {}).await;
        let w = failkit::Workload {
            blocks: 64,
            bs,
            depth: 4,
            duration: Duration::from_secs(2),
        };
        let log = failkit::run(vol.clone(), w, Instant::now()).await;
        assert!(log.errors.is_empty() && log.mismatches.is_empty());
        let r = vol.report();
        let to_b = cephkit::path_to(&r, &b_portal);
        assert!(
            to_b.figures.counters.written_bytes > 0,
            "B carried writes again"
        );
        vol.close().await;
    });
    drop(b);
}

#[needs("ceph-mon")]
fn a_dead_gateways_record_expires_and_is_removed() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("expire", "16M", Some("layering"));
    let lease = ["--gateway-lease", "2"];
    let a = c.gateway(&img, &lease);
    let b = c.gateway(&img, &lease);
    cephkit::eventually(Duration::from_secs(20), "A lists B", || {
        listed(&a, "portal").contains(&b.addr().to_string())
    });
    assert_eq!(img.gateways().len(), 2);
    signal(b.pid(), libc::SIGKILL);
    let killed = Instant::now();
    cephkit::eventually(Duration::from_secs(30), "B's record removed", || {
        img.gateways().len() == 1
    });
    // Not before its lease ran out by A's clock.
    assert!(
        killed.elapsed() >= Duration::from_secs(2),
        "{:?}",
        killed.elapsed()
    );
    assert!(a.log().contains("ran out: fencing it"), "{}", a.log());
    assert!(!listed(&a, "portal").contains(&b.addr().to_string()));
}

#[needs("ceph-mon")]
fn a_clone_or_copy_of_a_served_image_never_fences_the_originals_gateway() {
    let Some(c) = cephkit::ceph() else { return };
    let parent = c.image("parent", "16M", Some("layering"));
    let lease = ["--gateway-lease", "2"];
    let p = c.gateway(&parent, &lease);
    let p_addr = parent.gateways()[0]["addr"]
        .as_str()
        .expect("a record names its RADOS address")
        .to_owned();
    // Both copy the parent's metadata, its gateway's record included.
    let snap = format!("{}@base", parent.rbd_name());
    c.ok("rbd", &["snap", "create", &snap]);
    c.ok("rbd", &["snap", "protect", &snap]);
    let clone_name = format!("{}-clone", parent.name);
    c.ok("rbd", &["clone", &snap, &format!("rbd/{clone_name}")]);
    let clone = c.adopt("rbd", &clone_name);
    let copy_name = format!("{}-copy", parent.name);
    c.ok(
        "rbd",
        &[
            "cp",
            "--no-progress",
            &parent.rbd_name(),
            &format!("rbd/{copy_name}"),
        ],
    );
    let copy = c.adopt("rbd", &copy_name);
    for img in [&clone, &copy] {
        assert_eq!(img.gateways().len(), 1, "the parent's record was copied");
    }
    let gws: Vec<Serve> = [&clone, &copy]
        .iter()
        .map(|i| c.gateway(i, &lease))
        .collect();
    // Each copy's registry ends with its own gateway's record alone, and
    // the parent's gateway, whose record was copied, is never fenced.
    for (img, gw) in [&clone, &copy].iter().zip(&gws) {
        let own = gw.addr().to_string();
        cephkit::eventually(
            Duration::from_secs(15),
            "only its own record is left",
            || {
                let g = img.gateways();
                g.len() == 1 && g[0]["portals"][0] == own.as_str()
            },
        );
    }
    // The copied record is gone: removed as foreign, or fenced, which
    // blocklists before it removes.
    let blocklist =
        String::from_utf8_lossy(&c.ok("ceph", &["osd", "blocklist", "ls"])).into_owned();
    assert!(
        !blocklist.contains(&p_addr),
        "a copy's gateway blocklisted the parent's gateway {p_addr}:\n{blocklist}\nclone's \
         gateway:\n{}\ncopy's gateway:\n{}",
        gws[0].log(),
        gws[1].log()
    );
    assert!(!p.log().contains("lost its right to write"), "{}", p.log());
    assert_eq!(parent.gateways().len(), 1, "the parent's own record stays");
    drop(gws);
    drop(clone);
    c.ok("rbd", &["snap", "unprotect", &snap]);
    c.ok("rbd", &["snap", "purge", &parent.rbd_name()]);
}

/// `rados listwatchers` of an image's barrier object: how many gateways
/// watch it.
fn barrier_watchers(c: &cephkit::Cluster, img: &cephkit::Image) -> usize {
    let ns = img.namespace.as_deref().unwrap_or("");
    let out = c.ok(
        "rados",
        &[
            "-p",
            &img.pool,
            "-N",
            ns,
            "listwatchers",
            &format!("braid_gateways.{}", img.id),
        ],
    );
    String::from_utf8_lossy(&out).lines().count()
}

#[needs("ceph-mon", "nbdsh")]
fn two_images_of_one_name_in_two_namespaces_are_two_volumes_with_their_own_gateways() {
    let Some(c) = cephkit::ceph() else { return };
    let (ns_a, ns_b) = (c.namespace("tenant-a"), c.namespace("tenant-b"));
    let name = format!("same-{}", std::process::id());
    let a = c.image_named("rbd", Some(&ns_a), &name, "8M", Some("layering"));
    let b = c.image_named("rbd", Some(&ns_b), &name, "8M", Some("layering"));
    assert_eq!(a.spec(), format!("rbd:rbd/{}/{name}", ns_a.name));
    // One gateway serves both; a second serves A only.
    let conf = c.conf.display().to_string();
    let (spec_a, spec_b) = (format!("a={}", a.spec()), format!("b={}", b.spec()));
    let both = Serve::start(&["--ceph-conf", &conf, &spec_a, &spec_b]);
    let only_a = c.gateway(&a, &[]);
    assert!(
        both.log().contains(&a.spec()) && both.log().contains(&b.spec()),
        "each export is named with its namespace:\n{}",
        both.log()
    );

    let dir = tempfile::tempdir().unwrap();
    let data_a = random_file(dir.path(), MIB, 41);
    let data_b = random_file(dir.path(), MIB, 42);
    let write = |uri: &str, file: &std::path::Path| {
        common::nbdsh(&format!(
            "h.connect_uri({uri:?})\n\
             h.pwrite(open({file:?}, 'rb').read(), 0)\n\
             h.flush()\n\
             h.shutdown()\n",
            file = file.display().to_string()
        ));
    };
    write(&only_a.uri("vol"), &data_a);
    write(&both.uri("b"), &data_b);
    let read_a = common::nbdsh(&format!(
        "h.connect_uri({:?})\nimport hashlib\nprint(hashlib.sha256(h.pread({MIB}, 0)).hexdigest())\n",
        both.uri("a")
    ));
    assert_eq!(
        read_a.trim(),
        sha256(&data_a),
        "A read through the other gateway"
    );
    for (img, data) in [(&a, &data_a), (&b, &data_b)] {
        let exported = img.export();
        assert_eq!(
            sha256_bytes(&exported[..MIB]),
            sha256(data),
            "{} by rbd export",
            img.rbd_name()
        );
        assert!(
            exported[MIB..].iter().all(|&x| x == 0),
            "{}",
            img.rbd_name()
        );
    }

    // Two volumes, each with its own identity, leases and barrier.
    let (vol_a, vol_b) = (both.logged_volume("a"), both.logged_volume("b"));
    assert_ne!(vol_a, vol_b, "one identity for two images");
    assert_eq!(only_a.logged_volume("vol"), vol_a, "A's gateways agree");
    let records = |img: &cephkit::Image| {
        let recs = img.gateways();
        for r in &recs {
            assert_eq!(
                r["scope"]["namespace"].as_str(),
                img.namespace.as_deref(),
                "{r}"
            );
        }
        recs.len()
    };
    assert_eq!((records(&a), records(&b)), (2, 1), "records per image");
    assert_eq!(
        (barrier_watchers(c, &a), barrier_watchers(c, &b)),
        (2, 1),
        "barrier watches per image"
    );
    drop((both, only_a, a, b));
}

/// An 8 MiB image, its gateways A and B (B on a portal it keeps when
/// started again), and `braid attach` over both from A's URI; dropped in
/// that order backwards.
struct Attached<'c> {
    attach: labkit::Attach,
    b: Serve,
    b_portal: String,
    _a: Serve,
    img: cephkit::Image<'c>,
}

impl<'c> Attached<'c> {
    fn start(c: &'c cephkit::Cluster, hint: &str) -> Self {
        let img = c.image(hint, "8M", Some("layering"));
        let a = c.gateway(&img, &[]);
        let b_portal = format!("127.0.0.1:{}", common::free_port());
        let b = c.gateway(&img, &["--listen", &b_portal]);
        cephkit::eventually(Duration::from_secs(20), "A lists B", || {
            listed(&a, "portal").contains(&b_portal)
        });
        let attach = labkit::Attach::start(None, &a.uri("vol"), "vol", &[]);
        Self {
            attach,
            b,
            b_portal,
            _a: a,
            img,
        }
    }

    /// `rbd resize` to `mib` MiB.
    fn resize(&self, c: &cephkit::Cluster, mib: u64) {
        let size = format!("{mib}M");
        let name = self.img.rbd_name();
        let args = ["resize", "--no-progress", "--allow-shrink", "--size", &size];
        c.ok("rbd", &[&args[..], &[name.as_str()]].concat());
    }

    /// B stops and starts again on its portal, so the attach's path to it
    /// fails and must reconnect; returns the bytes written on that path
    /// before.
    fn restart_b(&mut self, c: &'c cephkit::Cluster) -> u64 {
        self.b.stop();
        cephkit::eventually(Duration::from_secs(20), "the path to B fails", || {
            self.path_to_b()["state"] != "active"
        });
        let written = self.path_to_b()["written_bytes"].as_u64().unwrap();
        self.b = c.gateway(&self.img, &["--listen", &self.b_portal]);
        written
    }

    /// `braid status --json`'s path to B.
    fn path_to_b(&self) -> serde_json::Value {
        let status = self.attach.status();
        let paths = status["paths"].as_array();
        let to_b = paths.and_then(|ps| ps.iter().find(|p| p["portal"] == *self.b_portal));
        to_b.cloned().unwrap_or_else(|| panic!("{status:#}"))
    }

    /// Python for nbdsh, connected to the attach.
    fn nbdsh(&self, script: &str) -> String {
        common::nbdsh(&format!(
            "h.connect_uri({:?})\nimport hashlib\n{script}",
            self.attach.uri()
        ))
    }
}

#[needs("ceph-mon", "nbdsh")]
fn a_path_that_reconnects_after_the_image_grew_comes_back_at_the_size_attached() {
    let Some(c) = cephkit::ceph() else { return };
    let mut v = Attached::start(c, "regrow");
    let dir = tempfile::tempdir().unwrap();
    let before = random_file(dir.path(), 8 * MIB, 51);
    let after = random_file(dir.path(), 8 * MIB, 52);
    // Written whole, then read back: the size seen and the bytes' sha256.
    let write = |v: &Attached, file: &std::path::Path| {
        v.nbdsh(&format!(
            "h.pwrite(open({file:?}, 'rb').read(), 0)\n\
             h.flush()\n\
             print(h.get_size(), hashlib.sha256(h.pread({len}, 0)).hexdigest())\n",
            file = file.display().to_string(),
            len = 8 * MIB,
        ))
    };
    let want = |file| format!("{} {}", 8 * MIB, sha256(file));
    assert_eq!(write(&v, &before).trim(), want(&before));
    v.resize(c, 16);
    let written = v.restart_b(c);
    cephkit::eventually(Duration::from_secs(30), "the path to B is back", || {
        v.path_to_b()["state"] == "active"
    });
    let script = format!("h.connect_uri({:?})\nprint(h.get_size())\n", v.b.uri("vol"));
    let b_size = common::nbdsh(&script);
    assert_eq!(b_size.trim(), (16 * MIB).to_string(), "B's size now");
    // The volume keeps the size it was attached with, and both paths
    // carry writes that read back byte for byte.
    assert_eq!(write(&v, &after).trim(), want(&after), "{}", v.attach.log());
    let to_b = v.path_to_b();
    assert!(
        to_b["written_bytes"].as_u64().unwrap() > written,
        "B carried none of the writes after it came back: {to_b:#}"
    );
    let data = v.img.export();
    assert_eq!(data.len(), 16 * MIB, "rbd export of the grown image");
    assert_eq!(
        sha256_bytes(&data[..8 * MIB]),
        sha256(&after),
        "in the cluster"
    );
}

#[needs("ceph-mon", "nbdsh")]
fn a_path_that_reconnects_after_the_image_shrank_stays_out_and_the_log_says_why() {
    let Some(c) = cephkit::ceph() else { return };
    let mut v = Attached::start(c, "reshrink");
    v.nbdsh("h.pwrite(bytes(range(256)) * 4096, 0)\nh.flush()\n");
    let first: Vec<u8> = (0..=255u8).cycle().take(MIB).collect();
    v.resize(c, 4);
    v.restart_b(c);
    cephkit::eventually(
        Duration::from_secs(30),
        "the attach says the image shrank",
        || {
            v.attach
                .log()
                .contains("the image shrank under a running attach")
        },
    );
    assert_ne!(v.path_to_b()["state"], "active");
    // The other path still serves what lies inside the new size.
    let read = v.nbdsh(&format!(
        "print(hashlib.sha256(h.pread({MIB}, 0)).hexdigest())\n"
    ));
    assert_eq!(read.trim(), sha256_bytes(&first), "{}", v.attach.log());
}
