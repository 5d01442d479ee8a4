//! `braid attach`: the multipath volume as a local NBD export. A file
//! system made on it through nbdfuse and a loop device survives detach and
//! re-attach; qemu-img and fio work through its socket (qemu-img with
//! attach on two threads, fio on one); policy switches and path maintenance under
//! load cost no error; `braid status --json` and the metrics add up to the
//! traffic actually sent; READ data spliced from a path's socket comes
//! through whole when that path is cut in the middle of a reply.

mod common;
mod labkit;
mod relaykit;

use braid_test_needs::needs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use braid_lab::{ChildGuard, Lab, LabConfig, Rate};
use labkit::{braid_bin, braid_here, Attach, LabServe};

/// Whether `name` is installed; outside CI a missing tool skips loudly.
fn tool(name: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "CI must install {name}");
        eprintln!("SKIPPED: {name} not installed");
    }
    found
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `braid serve` on this host with two loopback portals.
struct LocalServe {
    _guard: ChildGuard,
    uri: String,
    _dir: tempfile::TempDir,
}

fn serve_loopback(export: &str) -> LocalServe {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let child = Command::new(braid_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.2:0",
            "--state-dir",
        ])
        .arg(dir.path())
        .arg(export)
        .env("NO_COLOR", "1")
        .stderr(std::fs::File::create(&log).unwrap())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let guard = ChildGuard::new(child, "braid serve");
    let deadline = Instant::now() + Duration::from_secs(10);
    let port = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let portal = text
            .lines()
            .filter_map(|l| l.split("portal ").nth(1))
            .find(|p| p.starts_with("127.0.0.1:"))
            .map(|p| p.split_whitespace().next().unwrap_or("").to_owned());
        if let (Some(p), true) = (portal, text.contains(" export ")) {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "braid serve did not start: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let name = export.split('=').next().unwrap();
    LocalServe {
        _guard: guard,
        uri: format!("nbd://{port}/{name}"),
        _dir: dir,
    }
}

/// Unmounts, detaches and stops in reverse order, whatever happened.
struct Mounted {
    fuse_dir: PathBuf,
    fuse: Option<ChildGuard>,
    loop_dev: Option<String>,
    mount_dir: Option<PathBuf>,
}

impl Mounted {
    fn open(attach: &Attach, fuse_dir: &Path) -> Self {
        std::fs::create_dir_all(fuse_dir).unwrap();
        let child = Command::new("nbdfuse")
            .env(
                "PATH",
                format!(
                    "/usr/bin:/bin:{}",
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .arg(fuse_dir)
            .arg(attach.uri())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let m = Self {
            fuse_dir: fuse_dir.to_owned(),
            fuse: Some(ChildGuard::new(child, "nbdfuse")),
            loop_dev: None,
            mount_dir: None,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !fuse_dir.join("nbd").exists() {
            assert!(Instant::now() < deadline, "nbdfuse did not mount");
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    fn attach_loop(&mut self) -> String {
        let dev = run(Command::new("losetup")
            .args(["-f", "--show"])
            .arg(self.fuse_dir.join("nbd")))
        .trim()
        .to_owned();
        self.loop_dev = Some(dev.clone());
        dev
    }

    fn mount(&mut self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        run(Command::new("mount")
            .arg(self.loop_dev.as_ref().unwrap())
            .arg(dir));
        self.mount_dir = Some(dir.to_owned());
    }

    fn close(&mut self) {
        if let Some(d) = self.mount_dir.take() {
            let _ = Command::new("umount").arg(&d).status();
        }
        if let Some(dev) = self.loop_dev.take() {
            let _ = Command::new("losetup").args(["-d", &dev]).status();
        }
        if self.fuse.is_some() {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.fuse_dir)
                .status();
            if let Some(mut f) = self.fuse.take() {
                let _ = f.wait_timeout(Duration::from_secs(10));
            }
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.close();
    }
}

/// Writes a tree of files with varied sizes; returns path → sha256.
fn write_tree(root: &Path) -> BTreeMap<String, String> {
    let mut sums = BTreeMap::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for d in 0..5 {
        let dir = root.join(format!("dir{d}/sub{}", d % 2));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..8 {
            let size = 1 + (x % (3 << 20)) as usize;
            let mut data = vec![0u8; size];
            for b in data.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let p = dir.join(format!("file{f}.bin"));
            std::fs::write(&p, &data).unwrap();
            sums.insert(
                p.strip_prefix(root).unwrap().display().to_string(),
                sha(&data),
            );
        }
    }
    sums
}

fn sha(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

fn read_tree(root: &Path, names: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    names
        .keys()
        .map(|n| {
            (
                n.clone(),
                sha(&std::fs::read(root.join(n)).unwrap_or_default()),
            )
        })
        .collect()
}

#[needs("root", "ip", "tc")]
fn filesystem_on_a_multipath_volume_survives_detach_and_reattach() {
    if !braid_lab::require_or_skip("filesystem_on_a_multipath_volume")
        || !["nbdfuse", "losetup", "mkfs.ext4", "fusermount3"]
            .iter()
            .all(|t| tool(t))
    {
        return;
    }
    let lab = Lab::up(LabConfig::new([Rate::GBIT, Rate::GBIT])).unwrap();
    let disk_dir = tempfile::tempdir().unwrap();
    let disk = disk_dir.path().join("disk.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let source = format!("vol={}", disk.display());
    let mut args = vec![source.as_str()];
    let portals: Vec<String> = lab
        .paths()
        .iter()
        .map(|p| p.storage_addr.to_string())
        .collect();
    for p in &portals {
        args.extend(["--listen", p.as_str()]);
    }
    let _serve = LabServe::start(&lab, &args, 1);
    let uri = format!("nbd://{}/vol", portals[0]);
    let mut attach = Attach::start(Some(&lab), &uri, "vol", &[]);
    let work = tempfile::tempdir().unwrap();
    let sums = {
        let mut m = Mounted::open(&attach, &work.path().join("fuse"));
        let dev = m.attach_loop();
        run(Command::new("mkfs.ext4").args(["-q", "-F", &dev]));
        m.mount(&work.path().join("mnt"));
        let sums = write_tree(&work.path().join("mnt"));
        run(&mut Command::new("sync"));
        m.close();
        sums
    };
    let status = attach.status();
    let paths = status["paths"].as_array().unwrap();
    assert_eq!(paths.len(), 2);
    for p in paths {
        assert!(
            p["written_bytes"].as_u64().unwrap() > 1 << 20,
            "a path carried no writes: {p}"
        );
    }
    assert!(
        attach.stop(),
        "braid attach did not exit cleanly:\n{}",
        attach.log()
    );
    attach.restart(Some(&lab), &uri, &[]);
    let mut m = Mounted::open(&attach, &work.path().join("fuse"));
    m.attach_loop();
    m.mount(&work.path().join("mnt"));
    let again = read_tree(&work.path().join("mnt"), &sums);
    m.close();
    assert_eq!(again, sums, "files differ after detach and re-attach");
}

#[needs("qemu-img", "fio")]
fn qemu_img_and_fio_work_through_the_attach_socket() {
    let serve = serve_loopback("vol=mem:128MiB");
    // qemu-img through an attach on two threads and fio through one on
    // one, so both runtimes are run whatever the host's default.
    let mut attach = Attach::start(None, &serve.uri, "vol", &["--threads", "2"]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.raw");
    let mut data = vec![0u8; 32 << 20];
    let mut x = 7u64;
    for b in data.iter_mut() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *b = (x >> 56) as u8;
    }
    std::fs::write(&src, &data).unwrap();
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(attach.uri()));
    let back = dir.path().join("back.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(attach.uri())
        .arg(&back));
    assert_eq!(sha(&std::fs::read(&back).unwrap()[..32 << 20]), sha(&data));
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&back)
        .arg(attach.uri()));
    // fio through an attach that runs on one thread (`--threads 1`): its
    // readers, writers and replies share it.
    assert!(attach.stop(), "braid attach did not stop cleanly");
    attach.restart(None, &serve.uri, &["--threads", "1"]);
    let out = run(Command::new("fio").current_dir(dir.path()).args([
        "--name=attach",
        "--ioengine=nbd",
        &format!("--uri={}", attach.uri()),
        "--rw=randrw",
        "--bs=4k",
        "--iodepth=16",
        "--size=32m",
        "--offset=64m",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_state_save=0",
        "--runtime=10",
        "--output-format=json",
    ]));
    // fio may print notes before its JSON.
    let json = &out[out.find('{').expect("fio printed JSON")..];
    let j: serde_json::Value = serde_json::from_str(json).expect("fio JSON");
    assert_eq!(j["jobs"][0]["error"], 0, "{j}");
}

fn path_bytes(status: &serde_json::Value) -> Vec<u64> {
    status["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["read_bytes"].as_u64().unwrap() + p["written_bytes"].as_u64().unwrap())
        .collect()
}

#[test]
fn policy_switch_and_path_disable_under_load_cost_no_error() {
    let serve = serve_loopback("vol=mem:128MiB");
    let attach = Attach::start(None, &serve.uri, "vol", &[]);
    let control = attach.control.to_str().unwrap().to_owned();
    let load = Command::new(braid_bin())
        .args([
            "bench",
            &attach.uri(),
            "--rw",
            "randrw",
            "--bs",
            "64K",
            "--iodepth",
            "8",
        ])
        .args(["--time", "6", "--size", "64M", "--verify", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let load = ChildGuard::new(load, "braid bench");
    std::thread::sleep(Duration::from_millis(800));
    braid_here(&["policy", "vol", "round-robin", "--control", &control]);
    assert_eq!(attach.status()["policy"], "round-robin");
    braid_here(&["path", "vol", "2", "disable", "--control", &control]);
    std::thread::sleep(Duration::from_millis(500));
    let a = path_bytes(&attach.status());
    std::thread::sleep(Duration::from_millis(1000));
    let b = path_bytes(&attach.status());
    assert_eq!(attach.status()["paths"][1]["state"], "disabled");
    assert!(
        b[0] > a[0],
        "path 1 stopped while path 2 was disabled: {a:?} {b:?}"
    );
    assert_eq!(b[1], a[1], "the disabled path still carried new requests");
    braid_here(&["path", "vol", "2", "enable", "--control", &control]);
    std::thread::sleep(Duration::from_millis(1000));
    let c = path_bytes(&attach.status());
    assert!(
        c[1] > b[1],
        "path 2 carried nothing after it was enabled again"
    );
    let mut load = load;
    let child = load.child_mut();
    let mut stdout = String::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let status = load
        .wait_timeout(Duration::from_secs(20))
        .unwrap()
        .expect("bench ended");
    assert!(status.success(), "bench failed: {stdout}");
    let j: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(j["errors"], 0, "{j}");
    assert_eq!(j["verify_errors"], 0, "{j}");
}

/// Sums a metric's samples whose labels contain `volume="vol"`.
fn metric_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains("volume=\"vol\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

#[needs("nbdcopy")]
fn status_and_metrics_add_up_to_the_traffic_sent() {
    let serve = serve_loopback("vol=mem:64MiB");
    let port = common::free_port();
    let metrics = format!("127.0.0.1:{port}");
    let attach = Attach::start(None, &serve.uri, "vol", &["--metrics", &metrics]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let data: Vec<u8> = (0..(24u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8 | 1)
        .collect();
    std::fs::write(&src, &data).unwrap();
    let nbdcopy = |a: &dyn AsRef<std::ffi::OsStr>, b: &dyn AsRef<std::ffi::OsStr>| {
        run(Command::new("nbdcopy")
            .env(
                "PATH",
                format!(
                    "/usr/bin:/bin:{}",
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .args(["--no-extents", "--flush"])
            .arg(a)
            .arg(b));
    };
    nbdcopy(&src, &attach.uri());
    let back = dir.path().join("back");
    let uri = format!("nbd+unix:///vol?socket={}", attach.socket.display());
    nbdcopy(&uri, &back);
    let status = attach.status();
    let sum = |key: &str| -> u64 {
        status["paths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[key].as_u64().unwrap())
            .sum()
    };
    // Everything nbdcopy wrote, and everything it read (the whole volume).
    assert_eq!(sum("written_bytes"), data.len() as u64, "{status}");
    assert_eq!(sum("read_bytes"), 64 << 20, "{status}");
    assert_eq!(sum("errors"), 0);
    let text = scrape(&metrics);
    assert_eq!(
        metric_sum(&text, "braid_path_written_bytes_total"),
        data.len() as u64
    );
    assert_eq!(metric_sum(&text, "braid_path_read_bytes_total"), 64 << 20);
    let reads = metric_sum(&text, "braid_path_reads_total");
    let writes = metric_sum(&text, "braid_path_writes_total");
    let timed = metric_sum(&text, "braid_path_request_duration_seconds_count");
    let others = metric_sum(&text, "braid_path_other_requests_total");
    assert_eq!(
        timed,
        reads + writes + others,
        "every completed request is timed once"
    );
    assert!(text.contains("# TYPE braid_path_request_duration_seconds histogram"));
}

/// The relay whose path carries requests now (the one whose count of
/// bytes sent upstream grows), if either does within `limit`.
fn busy(relays: &[relaykit::Relay], limit: Duration) -> Option<&relaykit::Relay> {
    let before: Vec<u64> = relays.iter().map(|r| r.sent()).collect();
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        // A few READ requests (28 bytes each) past where it stood.
        if let Some(r) = relays
            .iter()
            .zip(&before)
            .find(|(r, b)| r.sent() > *b + 28 * 4)
        {
            return Some(r.0);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

/// A READ reply that is one whole local request goes from the path's
/// socket into a pipe and from there into the local socket. Cutting the
/// path in the middle of such a payload must cost a retry on the other
/// path, never a short or wrong reply: nbdcopy reads the whole volume
/// through attach while the busy path is cut, and what it read is the
/// file byte for byte. The cut is repeated (bounded) until attach's log
/// shows one that landed inside a spliced payload.
#[needs("nbdcopy")]
fn spliced_reads_come_through_whole_when_a_path_is_cut_mid_payload() {
    // One path at a time, whole 256 KiB requests (nbdcopy's size): no
    // request is split, so every reply is one to splice.
    cut_inside_spliced_payloads("failover", 256 << 10);
}

/// The same for the pieces of split reads: round-robin cuts each 1 MiB
/// request into four 256 KiB chunks over both paths, each piece is
/// spliced into pipes of its own and the local reply is the pieces in
/// order, from pipes and buffers alike. A cut inside one piece's payload
/// costs that piece a retry; the rest of the reply is not lost, doubled
/// or reordered.
#[needs("nbdcopy")]
fn spliced_pieces_of_split_reads_come_through_whole_when_a_path_is_cut_mid_payload() {
    cut_inside_spliced_payloads("round-robin", 1 << 20);
}

/// nbdcopy reads a 64 MiB file through attach on two relayed paths under
/// `policy`, in requests of `request` bytes, while the busy path is cut
/// some way into its replies, until attach's log shows a cut inside a
/// spliced payload (at most 8 tries); every read is verified byte for
/// byte.
fn cut_inside_spliced_payloads(policy: &str, request: usize) {
    let dir = tempfile::tempdir().unwrap();
    let size = 64 << 20;
    let src = common::random_file(dir.path(), size, 37);
    let want = std::fs::read(&src).unwrap();
    let serve = serve_loopback(&format!("vol={}", src.display()));
    let upstream: std::net::SocketAddr = serve.uri["nbd://".len()..]
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let relays = [
        relaykit::Relay::start("127.0.0.1:0", upstream),
        relaykit::Relay::start("127.0.0.1:0", upstream),
    ];
    let (a, b) = (relays[0].addr.to_string(), relays[1].addr.to_string());
    let attach = Attach::start(
        None,
        &serve.uri,
        "vol",
        &["--portal", &a, "--portal", &b, "--policy", policy],
    );
    let back = dir.path().join("back");
    let mut landed = false;
    for try_no in 0..8u64 {
        let _ = std::fs::remove_file(&back);
        let mut copy = ChildGuard::new(
            Command::new("nbdcopy")
                .args(["--connections=1", "--requests=4"])
                .arg(format!("--request-size={request}"))
                .arg(attach.uri())
                .arg(&back)
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn nbdcopy"),
            "nbdcopy",
        );
        // Placed by bytes, not time: a cut some way into the replies that
        // follow lands inside a payload of 256 KiB (all but a reply's few
        // dozen header bytes is payload) however slowly braid serve
        // answers, where a cut at a moment (as soon as requests went up)
        // landed before any reply on a loaded machine: CI once saw 8 of 8
        // cuts end on a reply's edge.
        if let Some(relay) = busy(&relays, Duration::from_secs(10)) {
            relay.cut_after_received((100 << 10) + try_no * (37 << 10));
            let deadline = Instant::now() + Duration::from_secs(10);
            while !relay.cut_done() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(100));
            relay.open();
        }
        let status = copy
            .wait_timeout(Duration::from_secs(60))
            .unwrap()
            .expect("nbdcopy ended");
        let mut err = String::new();
        use std::io::Read;
        copy.child_mut()
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(status.success(), "nbdcopy failed: {err}\n{}", attach.log());
        let got = std::fs::read(&back).unwrap();
        assert!(
            got.len() == want.len() && got == want,
            "what nbdcopy read through attach differs from the file ({} bytes read)",
            got.len()
        );
        if attach.log().contains("payload spliced in") {
            landed = true;
            break;
        }
    }
    assert!(
        landed,
        "no cut landed inside a spliced payload in 8 tries:\n{}",
        attach.log()
    );
}
