//! A verified load through `braid attach`'s local socket, as the kernel
//! and hypervisors drive it: several connections (attach offers
//! CAN_MULTI_CONN), writes of 128 KiB to 1 MiB, with FLUSH or without
//! (VMware sends none), and reads checked against what was acknowledged.
//! The load is libnbd's Python binding (`load.py`), a client braid did
//! not write; the test cuts power or links under it, stops it, and checks
//! the whole volume byte for byte against the last version of each block
//! acknowledged.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use braid_lab::{ChildGuard, Cut, Lab};

use crate::common::{cmd, output};
use crate::labkit::Attach;

const SCRIPT: &str = include_str!("load.py");
/// A load outlives its stop file by no more than this.
const STOP_WITHIN: Duration = Duration::from_secs(60);

/// How a client writes.
pub struct Shape {
    /// Connections, each a worker owning its share of the volume.
    pub conns: u64,
    /// Write sizes in 4 KiB blocks.
    pub sizes: &'static [u64],
    /// A FLUSH after this many writes of a connection; 0: never.
    pub flush_every: u32,
    /// One write in eight carries FUA.
    pub fua: bool,
}

/// 128 KiB to 1 MiB.
pub const WRITEBACK: &[u64] = &[32, 64, 128, 256];

/// The last version of each block acknowledged (absent: never written).
pub type Acked = BTreeMap<u64, u64>;

/// A running load.
pub struct Load {
    child: Option<ChildGuard>,
    dir: tempfile::TempDir,
}

fn script(dir: &Path) -> PathBuf {
    let path = dir.join("load.py");
    std::fs::write(&path, SCRIPT).expect("writing load.py");
    path
}

/// `acked` as a JSON file in `dir`, for load.py.
fn acked_file(dir: &Path, acked: &Acked) -> PathBuf {
    let path = dir.join("prior.json");
    let map: BTreeMap<String, u64> = acked.iter().map(|(b, v)| (b.to_string(), *v)).collect();
    std::fs::write(&path, serde_json::to_string(&map).expect("JSON")).expect("writing acked");
    path
}

impl Load {
    /// Starts `shape` on `blocks` 4 KiB blocks at `uri`, which holds
    /// `prior` (what earlier loads acknowledged); versions start above
    /// `version_base`, so a later load overwrites with newer ones.
    pub fn start(
        uri: &str,
        blocks: u64,
        shape: &Shape,
        seed: u64,
        prior: &Acked,
        version_base: u64,
    ) -> Load {
        let dir = tempfile::tempdir().expect("temporary dir");
        let prior = acked_file(dir.path(), prior);
        let args = serde_json::json!({
            "uri": uri,
            "blocks": blocks,
            "conns": shape.conns,
            "sizes": shape.sizes,
            "flush_every": shape.flush_every,
            "fua": shape.fua,
            "seed": seed,
            "prior": prior,
            "version_base": version_base,
            "stop_file": dir.path().join("stop"),
            "out": dir.path().join("acked.json"),
            "max_secs": 300,
        });
        let child = cmd("python3")
            .arg(script(dir.path()))
            .arg("load")
            .arg(args.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("stderr")).expect("stderr file"))
            .spawn()
            .expect("starting python3 load.py");
        Load {
            child: Some(ChildGuard::new(child, "load.py")),
            dir,
        }
    }

    /// Stops the load and returns what it had acknowledged; panics with
    /// its errors (an I/O error, a read that saw stale data) if any.
    pub fn finish(mut self) -> Acked {
        std::fs::write(self.dir.path().join("stop"), b"").expect("stop file");
        let mut child = self.child.take().expect("running");
        let status = child
            .wait_timeout(STOP_WITHIN)
            .expect("waiting for load.py")
            .expect("load.py stops after its stop file");
        let stderr = std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default();
        let text = std::fs::read_to_string(self.dir.path().join("acked.json"))
            .unwrap_or_else(|e| panic!("load.py left no result ({e}): {status}\n{stderr}"));
        let v: serde_json::Value = serde_json::from_str(&text).expect("load.py's JSON");
        assert!(
            status.success(),
            "the load through the socket failed: {}\n{stderr}",
            v["errors"]
        );
        eprintln!(
            "load: {} writes acknowledged ({} FUA), {} flushes",
            v["writes"], v["fua"], v["flushes"]
        );
        assert!(v["writes"].as_u64() > Some(0), "no write was acknowledged");
        v["acked"]
            .as_object()
            .expect("acked map")
            .iter()
            .map(|(b, v)| (b.parse().expect("block"), v.as_u64().expect("version")))
            .collect()
    }
}

/// Reads the whole volume at `source` (an NBD URI, or the path of the
/// file under it) and compares each block with `acked`; panics naming
/// the blocks that differ.
pub fn check(source: &str, acked: &Acked, blocks: u64) {
    let dir = tempfile::tempdir().expect("temporary dir");
    let acked_file = acked_file(dir.path(), acked);
    let out = output(
        cmd("python3")
            .arg(script(dir.path()))
            .arg("check")
            .arg(source)
            .arg(&acked_file)
            .arg(blocks.to_string()),
        STOP_WITHIN,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{source} is not what was acknowledged: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{source}: {}", text.trim());
}

/// What path `i` (from 0) of an attach has carried, both ways.
fn carried(attach: &Attach, i: usize) -> u64 {
    let v = attach.status();
    let p = &v["paths"][i];
    assert!(p["read_bytes"].is_u64(), "{v}");
    p["read_bytes"].as_u64().unwrap() + p["written_bytes"].as_u64().unwrap()
}

/// Both kinds of cut under one load through `attach`, on a lab of two
/// paths: path 1 goes link down at 1.5 s and comes back at 3.5 s, path 2
/// turns into a blackhole at 5 s and comes back at 7 s; the load (four
/// connections, FLUSH and FUA) stops at 9.5 s. No request may fail, each
/// path must carry traffic again after it is back, and the volume must
/// hold every acknowledged block.
pub fn cut_each_path(lab: &Lab, attach: &Attach, blocks: u64) {
    let shape = Shape {
        conns: 4,
        sizes: WRITEBACK,
        flush_every: 16,
        fua: true,
    };
    let seed = rand::random();
    eprintln!("load seed {seed}");
    let start = Instant::now();
    let at = |s: f64| {
        std::thread::sleep(
            (start + Duration::from_secs_f64(s)).saturating_duration_since(Instant::now()),
        )
    };
    let load = Load::start(&attach.uri(), blocks, &shape, seed, &Acked::new(), 0);
    at(1.5);
    lab.cut(1, Cut::LinkDown).unwrap();
    at(3.5);
    lab.restore(1).unwrap();
    let first = carried(attach, 0);
    at(5.0);
    assert!(
        carried(attach, 0) > first,
        "path 1 carried nothing in the 1.5 s after its link came back:\n{}",
        attach.log()
    );
    lab.cut(2, Cut::Blackhole).unwrap();
    at(7.0);
    lab.restore(2).unwrap();
    let second = carried(attach, 1);
    at(9.5);
    let acked = load.finish();
    assert!(
        carried(attach, 1) > second,
        "path 2 carried nothing in the 2.5 s after its blackhole ended:\n{}",
        attach.log()
    );
    check(&attach.uri(), &acked, blocks);
}
