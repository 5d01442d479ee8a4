//! `braid serve NAME=rbd:POOL/IMAGE[@SNAP]`: a Ceph RBD image served over
//! NBD, on a real throwaway cluster (`cephkit`). Data goes in and out by
//! real clients and is checked against the cluster itself (`rbd export`,
//! no gateway involved); small zeroed ranges read back as zeroes; block
//! status sees holes; an acknowledged write survives the gateway's death
//! (and, to show that check bites, is lost with librbd's cache on); a
//! cache turned on by the pool's or the image's own settings is refused
//! with the command that turns it off for the image; an image with
//! exclusive-lock is refused writable with the command that fixes it; a
//! snapshot is served read-only; `rbd resize` reaches new connections on
//! every gateway, and after a shrink a write past the new end is refused
//! whole.

#![cfg(feature = "rbd")]

mod cephkit;
mod common;

use braid_test_needs::needs;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{cmd, output, random_file, run, sha256, sha256_bytes, signal, ChildGuard};

const MIB: usize = 1 << 20;

#[needs("ceph-mon")]
fn nbdcopy_in_and_out_match_by_sha256_and_by_rbd_export() {
    let Some(c) = cephkit::ceph() else { return };
    if !common::tool("nbdcopy") {
        return;
    }
    let img = c.image("copy", "64M", Some("layering"));
    let gw = c.gateway(&img, &[]);
    let dir = tempfile::tempdir().unwrap();
    let src = random_file(dir.path(), 64 * MIB, 21);
    run(cmd("nbdcopy").arg(&src).arg(gw.uri("vol")));
    let back = dir.path().join("back.raw");
    run(cmd("nbdcopy").arg(gw.uri("vol")).arg(&back));
    assert_eq!(sha256(&back), sha256(&src), "read back through the gateway");
    assert_eq!(
        sha256_bytes(&img.export()),
        sha256(&src),
        "read from the cluster by rbd export"
    );
}

#[needs("ceph-mon", "fio")]
fn fio_over_nbd_verifies_crc32c() {
    let Some(c) = cephkit::ceph() else { return };
    if !common::tool("fio") {
        return;
    }
    let img = c.image("fio", "32M", Some("layering"));
    let gw = c.gateway(&img, &[]);
    cephkit::fio_verify(&gw.uri("vol"), "4k");
}

#[needs("ceph-mon", "nbdsh")]
fn small_zeroed_ranges_read_back_as_zeroes_and_block_status_sees_holes() {
    let Some(c) = cephkit::ceph() else { return };
    if !common::tool("nbdsh") || !common::tool("nbdinfo") {
        return;
    }
    let img = c.image("zero", "16M", Some("layering"));
    let gw = c.gateway(&img, &[]);
    // 4 KiB zeroed inside written data (librbd's discard would leave it);
    // a whole 4 MiB object zeroed becomes a hole again.
    common::nbdsh(&format!(
        "h.connect_uri({uri:?})\n\
         h.pwrite(b'\\xaa' * (1 << 20), 0)\n\
         h.pwrite(b'\\xbb' * (4 << 20), 8 << 20)\n\
         h.zero(4096, 8192)\n\
         h.zero(4 << 20, 8 << 20)\n\
         assert h.pread(4096, 8192) == bytes(4096)\n\
         assert h.pread(4096, 4096) == b'\\xaa' * 4096\n\
         assert h.pread(4096, 12288) == b'\\xaa' * 4096\n\
         h.trim(1 << 20, 2 << 20)\n\
         h.shutdown()\n",
        uri = gw.uri("vol")
    ));
    let data = img.export();
    assert!(
        data[8192..12288].iter().all(|&b| b == 0),
        "zeroes in the cluster"
    );
    assert!(data[..8192].iter().all(|&b| b == 0xaa));
    assert!(data[12288..MIB].iter().all(|&b| b == 0xaa));
    let map = run(cmd("nbdinfo").args(["--map", &gw.uri("vol")]));
    let map = String::from_utf8_lossy(&map.stdout);
    // `offset length type description`, one run per line.
    let runs: Vec<(u64, u64, u32)> = map
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.parse().ok()?,
                f.get(1)?.parse().ok()?,
                f.get(2)?.parse().ok()?,
            ))
        })
        .collect();
    let at = |off: u64| {
        runs.iter()
            .find(|(o, l, _)| *o <= off && off < o + l)
            .map(|r| r.2)
            .unwrap_or_else(|| panic!("offset {off} not in the map:\n{map}"))
    };
    assert_eq!(at(0), 0, "written data:\n{map}");
    assert_eq!(at(8 << 20), 3, "a zeroed whole object is a hole:\n{map}");
    assert_eq!(at(14 << 20), 3, "never written:\n{map}");
}

/// Writes 1 MiB through a gateway of a new image started with `extra`,
/// kills the gateway (SIGKILL) as soon as the write is acknowledged (never
/// flushed, no FUA), and says whether the cluster has it.
fn acknowledged_write_survives_sigkill(c: &cephkit::Cluster, extra: &[&str], trial: u8) -> bool {
    let img = c.image("kill", "16M", Some("layering"));
    acknowledged_write_to_survives_sigkill(c, &img, extra, trial)
}

/// As [`acknowledged_write_survives_sigkill`], on `img`. A FLUSH goes
/// before the write (librbd's cache writes through until it sees one).
fn acknowledged_write_to_survives_sigkill(
    c: &cephkit::Cluster,
    img: &cephkit::Image,
    extra: &[&str],
    trial: u8,
) -> bool {
    let gw = c.gateway(img, extra);
    let pattern = format!("b'\\x{:02x}' * (1 << 20)", 0x40 + trial);
    let script = format!(
        "import sys, time\n\
         h.connect_uri({uri:?})\n\
         h.flush()\n\
         h.pwrite({pattern}, 0)\n\
         print('acked', flush=True)\n\
         time.sleep(60)\n",
        uri = gw.uri("vol")
    );
    let mut nbdsh = ChildGuard::spawn(
        cmd("nbdsh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    let mut line = String::new();
    BufReader::new(nbdsh.0.stdout.take().expect("piped"))
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "acked", "nbdsh did not write: {}", gw.log());
    signal(gw.pid(), libc::SIGKILL);
    drop(nbdsh);
    drop(gw);
    let data = img.export();
    data[..MIB].iter().all(|&b| b == 0x40 + trial)
}

#[needs("ceph-mon", "nbdsh")]
fn an_acknowledged_write_is_in_the_cluster_when_its_gateway_is_killed() {
    let Some(c) = cephkit::ceph() else { return };
    if !common::tool("nbdsh") {
        return;
    }
    for trial in 0..3 {
        assert!(
            acknowledged_write_survives_sigkill(c, &[], trial),
            "trial {trial}: an acknowledged write was lost with the gateway"
        );
    }
    // The same kill with librbd's write-back cache on loses what was not
    // flushed: the check above can fail. (That cache writes dirty data
    // back after `rbd cache max dirty age`, a second by default; a minute
    // here, so that the loss does not depend on how fast the kill comes.
    // Pacific's default policy, writearound, acknowledges writes while they
    // are still on their way to the OSDs: that window is too short to hit.)
    let conf = c.conf_with(
        "writeback",
        "rbd cache policy = writeback\nrbd cache max dirty age = 60",
    );
    let conf = conf.display().to_string();
    for trial in 0..2 {
        assert!(
            !acknowledged_write_survives_sigkill(c, &["--ceph-conf", &conf, "--rbd-cache"], trial),
            "trial {trial}: with --rbd-cache a kill did not lose an unflushed write"
        );
    }
}

#[needs("ceph-mon", "nbdsh")]
fn a_cache_turned_on_by_the_pool_or_the_image_is_refused_with_the_command_that_fixes_it() {
    let Some(c) = cephkit::ceph() else { return };
    if !common::tool("nbdsh") {
        return;
    }
    // What librbd's cache does to acknowledged writes when a pool turns it
    // on (as a pool of VM disks often does): held in the gateway's memory
    // for a minute before they go to the cluster.
    let pool = c.pool("cached");
    for (option, value) in [
        ("rbd_cache", "true"),
        ("rbd_cache_policy", "writeback"),
        ("rbd_cache_max_dirty_age", "60"),
    ] {
        c.ok("rbd", &["config", "pool", "set", &pool.name, option, value]);
    }
    let in_pool = c.image_in(&pool.name, "cached", "16M", Some("layering"));
    let mut gw = c.spawn_gateway(&in_pool, &[], &[]);
    let cephkit::Outcome::Refused(err) = gw.outcome(Duration::from_secs(60)) else {
        panic!(
            "a gateway served an image whose pool turns librbd's cache on:\n{}",
            gw.log()
        );
    };
    assert!(err.contains(&format!("set on pool {}", pool.name)), "{err}");
    let fix = format!(
        "rbd config image set {} rbd_cache false",
        in_pool.rbd_name()
    );
    assert!(err.contains(&format!("`{fix}`")), "{err}");
    // The image's own setting, in the shared pool.
    let own = c.image("cached", "16M", Some("layering"));
    c.ok(
        "rbd",
        &[
            "config",
            "image",
            "set",
            &own.rbd_name(),
            "rbd_cache",
            "true",
        ],
    );
    let cephkit::Outcome::Refused(err) = c
        .spawn_gateway(&own, &[], &[])
        .outcome(Duration::from_secs(60))
    else {
        panic!("a gateway served an image whose own setting turns librbd's cache on");
    };
    assert!(err.contains("set on the image"), "{err}");
    assert!(
        err.contains(&format!(
            "`rbd config image set {} rbd_cache false`",
            own.rbd_name()
        )),
        "{err}"
    );
    // The command it names makes the image servable, and then an
    // acknowledged write is in the cluster when the gateway dies.
    let args: Vec<&str> = fix.split_whitespace().skip(1).collect();
    c.ok("rbd", &args);
    assert!(
        acknowledged_write_to_survives_sigkill(c, &in_pool, &[], 7),
        "with the image's rbd_cache false, an acknowledged write was lost with the gateway"
    );
}

#[needs("ceph-mon")]
fn an_image_with_exclusive_lock_is_refused_writable_with_the_command_that_fixes_it() {
    let Some(c) = cephkit::ceph() else { return };
    // The cluster's default features: layering, exclusive-lock,
    // object-map, fast-diff, deep-flatten.
    let img = c.image("excl", "16M", None);
    let scratch = tempfile::tempdir().unwrap();
    let out = output(
        Command::new(env!("CARGO_BIN_EXE_braid"))
            .args(["serve", "--listen", "127.0.0.1:0", "--control"])
            .arg(scratch.path().join("ctl.sock"))
            .arg("--ceph-conf")
            .arg(&c.conf)
            .arg(format!("vol={}", img.spec())),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("exclusive-lock feature"), "{err}");
    let fix = format!(
        "rbd feature disable rbd/{} fast-diff object-map exclusive-lock",
        img.name
    );
    assert!(err.contains(&format!("`{fix}`")), "{err}");
    // Read-only it is served as it is.
    let ro = c.gateway(&img, &["--read-only"]);
    assert!(run(cmd("nbdinfo").arg(ro.uri("vol"))).status.success());
    drop(ro);
    // The command it names makes it servable writable.
    let args: Vec<&str> = fix.split_whitespace().skip(1).collect();
    c.ok("rbd", &args);
    let gw = c.gateway(&img, &[]);
    common::nbdsh(&format!(
        "h.connect_uri({:?})\nh.pwrite(b'x' * 4096, 0)\nh.shutdown()\n",
        gw.uri("vol")
    ));
    drop(gw);
    assert!(img.export()[..4096].iter().all(|&b| b == b'x'));
}

#[needs("ceph-mon", "nbdsh")]
fn a_snapshot_is_served_read_only_as_it_was_taken() {
    let Some(c) = cephkit::ceph() else { return };
    if !common::tool("nbdsh") {
        return;
    }
    let img = c.image("snap", "16M", Some("layering"));
    let gw = c.gateway(&img, &[]);
    let write = |byte: u8| {
        common::nbdsh(&format!(
            "h.connect_uri({:?})\nh.pwrite(bytes([{byte}]) * 65536, 0)\nh.shutdown()\n",
            gw.uri("vol")
        ))
    };
    write(1);
    c.ok("rbd", &["snap", "create", &format!("{}@before", img.name)]);
    write(2);
    let scratch = tempfile::tempdir().unwrap();
    let ctl = scratch.path().join("ctl.sock").display().to_string();
    let conf = c.conf.display().to_string();
    let snap = common::Serve::start(&[
        "--ceph-conf",
        &conf,
        "--control",
        &ctl,
        &format!("old={}@before", img.spec()),
    ]);
    let got = common::nbdsh(&format!(
        "h.connect_uri({:?})\n\
         print(h.is_read_only(), h.pread(65536, 0) == bytes([1]) * 65536)\n\
         try:\n    h.pwrite(b'z', 0)\n    print('written')\n\
         except nbd.Error as e:\n    print('refused')\n",
        snap.uri("old")
    ));
    assert_eq!(
        got.split_whitespace().collect::<Vec<_>>(),
        ["True", "True", "refused"],
        "{got}"
    );
    drop(snap);
    drop(gw);
    c.ok("rbd", &["snap", "purge", &img.name]);
}

/// Python for nbdsh: resizes `img` with `rbd resize` to `mib` MiB, then
/// waits (at most 20 s) until a new connection to each of `uris` sees the
/// new size; leaves `n` connected to the first.
fn resize_and_wait(
    c: &cephkit::Cluster,
    img: &cephkit::Image,
    mib: u64,
    uris: &[String],
) -> String {
    format!(
        "import subprocess, time\n\
         subprocess.run(['rbd', '-c', {conf:?}, 'resize', '--no-progress', '--allow-shrink', \
         '--size', '{mib}M', {name:?}], check=True)\n\
         deadline = time.monotonic() + 20\n\
         for uri in reversed({uris:?}):\n\
         \x20   while True:\n\
         \x20       n = nbd.NBD()\n\
         \x20       n.connect_uri(uri)\n\
         \x20       size = n.get_size()\n\
         \x20       if size == {mib} << 20:\n\
         \x20           break\n\
         \x20       n.shutdown()\n\
         \x20       assert time.monotonic() < deadline, f'{{uri}}: a new connection still sees {{size}} bytes'\n\
         \x20       time.sleep(0.1)\n",
        conf = c.conf.display().to_string(),
        name = img.rbd_name(),
    )
}

#[needs("ceph-mon", "nbdsh")]
fn a_grown_image_reaches_every_gateway_and_a_new_connection_writes_past_the_old_end() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("grow", "8M", Some("layering"));
    let (a, b) = (c.gateway(&img, &[]), c.gateway(&img, &[]));
    let uris = [a.uri("vol"), b.uri("vol")];
    let out = common::nbdsh(&format!(
        "h.connect_uri({first:?})\n\
         {resize}\
         data = bytes(range(256)) * 4096\n\
         n.pwrite(data, 12 << 20)\n\
         n.flush()\n\
         assert n.pread(1 << 20, 12 << 20) == data\n\
         print('old connection', h.get_size())\n",
        first = uris[0],
        resize = resize_and_wait(c, &img, 16, &uris),
    ));
    // NBD has no way to tell a connected client: it keeps its size.
    assert_eq!(out.trim(), format!("old connection {}", 8 * MIB), "{out}");
    let data = img.export();
    assert_eq!(data.len(), 16 * MIB, "rbd export of the grown image");
    let written: Vec<u8> = (0..=255u8).cycle().take(MIB).collect();
    assert!(
        data[12 * MIB..13 * MIB] == written[..],
        "past the old end, in the cluster"
    );
    assert!(
        a.log().contains("resized from 8 MiB to 16 MiB"),
        "{}",
        a.log()
    );
}

#[needs("ceph-mon", "nbdsh")]
fn after_a_shrink_a_write_past_the_new_end_is_refused_and_nothing_of_it_lands() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("shrink", "8M", Some("layering"));
    let gw = c.gateway(&img, &[]);
    let uris = [gw.uri("vol")];
    // A client connected before the shrink still thinks the image is 8 MiB
    // long: its write across the new end must fail whole, not be cut at
    // the end and acknowledged.
    let out = common::nbdsh(&format!(
        "h.connect_uri({uri:?})\n\
         h.pwrite(b'\\xaa' * (128 << 10), (4 << 20) - (64 << 10))\n\
         {resize}\
         try:\n\
         \x20   h.pwrite(b'\\xbb' * (64 << 10), (4 << 20) - (32 << 10))\n\
         \x20   print('acknowledged')\n\
         except nbd.Error as e:\n\
         \x20   print('refused', e.errno)\n\
         assert h.pread(4096, (4 << 20) - 4096) == b'\\xaa' * 4096\n",
        uri = uris[0],
        resize = resize_and_wait(c, &img, 4, &uris),
    ));
    assert_eq!(
        out.trim(),
        "refused ENOSPC",
        "a write across the new end:\n{}",
        gw.log()
    );
    let data = img.export();
    assert_eq!(data.len(), 4 * MIB);
    assert!(
        data[4 * MIB - (64 << 10)..].iter().all(|&x| x == 0xaa),
        "nothing of the refused write landed before the new end"
    );
}
