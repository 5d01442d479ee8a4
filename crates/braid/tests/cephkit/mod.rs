//! A throwaway Ceph cluster for the `ceph_*` tests: one monitor on
//! 127.0.0.1 and one OSD keeping its data in memory, started by
//! `scripts/ceph-cluster` under a temporary directory (on /dev/shm where
//! there is one) once per test binary
//! (about 8 s), and stopped by that script's watcher, by PID, when the test
//! process exits. Each test makes its own small images and removes them
//! when done (the OSD holds them in RAM).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::common::{free_port, output, ChildGuard, Serve};

pub mod cut;

/// The shared cluster.
pub struct Cluster {
    pub dir: PathBuf,
    pub conf: PathBuf,
}

/// Started once; a start that failed is reported to every test, not tried
/// again by each.
static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

/// Whether the Ceph daemons and tools are installed; same rule as
/// `common::tool` (in CI they must be).
pub fn available() -> bool {
    ["ceph-mon", "ceph-osd", "rbd", "ceph"]
        .iter()
        .all(|t| crate::common::tool(t))
}

/// The cluster, or `None` (the test then skips, saying so) outside CI
/// without Ceph installed.
pub fn ceph() -> Option<&'static Cluster> {
    available().then(cluster)
}

/// As [`ceph`], with an OSD that can be made to lag behind the monitor on
/// OSD maps ([`Cluster::lag_maps`]); a test binary uses one kind or the
/// other.
pub fn ceph_lagging() -> Option<&'static Cluster> {
    available().then(|| start(&["--map-lag"]))
}

/// Waits (bounded) until `f` holds.
pub fn eventually(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "not within {limit:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The figures of a volume's path to `portal`.
pub fn path_to<'r>(
    r: &'r braid_initiator::VolumeReport,
    portal: &str,
) -> &'r braid_initiator::PathFigures {
    r.paths
        .iter()
        .find(|p| p.portal == portal)
        .unwrap_or_else(|| panic!("no path to {portal}: {r:?}"))
}

/// The cluster of this test binary, started on first use.
pub fn cluster() -> &'static Cluster {
    start(&[])
}

fn start(options: &[&str]) -> &'static Cluster {
    let started = CLUSTER.get_or_init(|| {
        // In memory where there is a tmpfs: the OSD keeps its data in RAM
        // anyway, and a monitor refuses to start on a nearly full disk.
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_owned()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!(
            "braid-ceph-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-cluster");
        let out = output(
            Command::new(script)
                .arg("start")
                .arg(&dir)
                .args(["--port", &free_port().to_string()])
                .args(["--watch", &std::process::id().to_string()])
                .args(options),
            Duration::from_secs(120),
        );
        if !out.status.success() {
            return Err(format!(
                "scripts/ceph-cluster start failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(Cluster {
            conf: dir.join("ceph.conf"),
            dir,
        })
    });
    match started {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}

impl Cluster {
    /// Runs a Ceph tool (`rbd`, `ceph`, `rados`) on this cluster; they
    /// ignore SIGTERM, so a hung one is killed outright at the bound.
    pub fn tool(&self, tool: &str, args: &[&str]) -> Output {
        output(
            Command::new(tool).arg("-c").arg(&self.conf).args(args),
            Duration::from_secs(120),
        )
    }

    /// As [`Self::tool`], asserting success; returns stdout.
    pub fn ok(&self, tool: &str, args: &[&str]) -> Vec<u8> {
        let out = self.tool(tool, args);
        assert!(
            out.status.success(),
            "{tool} {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// A new image of `size` (e.g. "64M") in pool `rbd`; `features` as
    /// `rbd create --image-feature` takes them (`None`: the cluster's
    /// defaults, with exclusive-lock).
    pub fn image(&self, hint: &str, size: &str, features: Option<&str>) -> Image<'_> {
        self.image_in("rbd", hint, size, features)
    }

    /// As [`Self::image`], in `pool`.
    pub fn image_in(
        &self,
        pool: &str,
        hint: &str,
        size: &str,
        features: Option<&str>,
    ) -> Image<'_> {
        self.image_named(pool, None, &unique(hint), size, features)
    }

    /// An image called exactly `name` in `pool`, inside RADOS `namespace`
    /// (made with [`Self::namespace`]) or the pool's default one.
    pub fn image_named(
        &self,
        pool: &str,
        namespace: Option<&Namespace>,
        name: &str,
        size: &str,
        features: Option<&str>,
    ) -> Image<'_> {
        let ns = namespace.map(|n| n.name.clone());
        let spec = image_spec(pool, ns.as_deref(), name);
        let mut args = vec!["create", "--size", size];
        if let Some(f) = features {
            args.extend(["--image-feature", f]);
        }
        args.push(&spec);
        self.ok("rbd", &args);
        self.adopt_in(pool, ns.as_deref(), name)
    }

    /// An image that exists already (made by `rbd clone`, `rbd cp`...),
    /// removed like the others when dropped.
    pub fn adopt(&self, pool: &str, name: &str) -> Image<'_> {
        self.adopt_in(pool, None, name)
    }

    fn adopt_in(&self, pool: &str, namespace: Option<&str>, name: &str) -> Image<'_> {
        let spec = image_spec(pool, namespace, name);
        let info = self.ok("rbd", &["info", "--format", "json", &spec]);
        let info: serde_json::Value = serde_json::from_slice(&info).expect("rbd info json");
        let id = info["id"].as_str().expect("image id").to_owned();
        Image {
            cluster: self,
            pool: pool.to_owned(),
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
            id,
        }
    }

    /// A new RADOS namespace in pool `rbd` (`rbd namespace create`),
    /// removed when dropped (after the images made in it).
    pub fn namespace(&self, hint: &str) -> Namespace<'_> {
        let name = unique(hint);
        self.ok("rbd", &["namespace", "create", &format!("rbd/{name}")]);
        Namespace {
            cluster: self,
            name,
        }
    }

    /// A new pool of its own (a pool's settings reach every image in it),
    /// removed when dropped.
    pub fn pool(&self, hint: &str) -> Pool<'_> {
        let name = unique(hint);
        self.ok("ceph", &["osd", "pool", "create", &name, "8"]);
        let pool = Pool {
            cluster: self,
            name,
        };
        self.ok("rbd", &["pool", "init", &pool.name]);
        pool
    }

    /// Has the OSD hold every message from the monitor, OSD maps among
    /// them, for a random time up to `max` (each in order), or no longer
    /// (`Duration::ZERO`). Needs a cluster from [`ceph_lagging`].
    pub fn lag_maps(&self, max: Duration) {
        let (probability, secs) = if max.is_zero() {
            ("0", "0".to_owned())
        } else {
            ("1", format!("{}", max.as_secs_f64()))
        };
        for (var, val) in [
            ("ms_inject_delay_max", secs.as_str()),
            ("ms_inject_delay_probability", probability),
        ] {
            let said = self.admin(
                "osd.0",
                &serde_json::json!({"prefix": "config set", "var": var, "val": [val]}),
            );
            assert!(said.contains("success"), "setting {var} on osd.0: {said}");
        }
    }

    /// The newest OSD map epoch that the OSD has.
    pub fn osd_epoch(&self) -> u64 {
        let said = self.admin("osd.0", &serde_json::json!({"prefix": "status"}));
        let v: serde_json::Value = serde_json::from_str(&said).expect("status is JSON");
        v["newest_map"].as_u64().expect("newest_map")
    }

    /// The monitor's newest OSD map epoch.
    pub fn mon_epoch(&self) -> u64 {
        let out = self.ok("ceph", &["osd", "dump", "--format", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("osd dump is JSON");
        v["epoch"].as_u64().expect("epoch")
    }

    /// One command to a daemon's admin socket (`ceph daemon NAME ...`).
    fn admin(&self, daemon: &str, command: &serde_json::Value) -> String {
        admin_at(
            &self.dir.join("run").join(format!("ceph-{daemon}.asok")),
            command,
        )
    }

    /// How many watches the OSD holds on `object` (`dump_watchers` on its
    /// admin socket, which answers while client I/O is paused).
    pub fn watches_on(&self, object: &str) -> usize {
        let said = self.admin("osd.0", &serde_json::json!({"prefix": "dump_watchers"}));
        let v: serde_json::Value = serde_json::from_str(&said)
            .unwrap_or_else(|e| panic!("dump_watchers is not JSON ({e}): {said}"));
        v.as_array()
            .unwrap_or_else(|| panic!("dump_watchers is no list: {said}"))
            .iter()
            .filter(|w| w["object"] == object)
            .count()
    }

    /// Lines of `ceph osd blocklist ls` that name one of `addrs`.
    pub fn blocklisted(&self, addrs: &[String]) -> Vec<String> {
        let out = self.tool("ceph", &["osd", "blocklist", "ls"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| addrs.iter().any(|a| l.starts_with(a.as_str())))
            .map(str::to_owned)
            .collect()
    }

    /// A configuration file for this cluster with `lines` added to its
    /// `[client]` section.
    pub fn conf_with(&self, name: &str, lines: &str) -> PathBuf {
        let base = std::fs::read_to_string(&self.conf).expect("ceph.conf");
        let path = self.dir.join(format!("{name}.conf"));
        std::fs::write(&path, format!("{base}\n{lines}\n")).expect("writing a ceph.conf");
        path
    }

    /// `braid serve` as a gateway of `image` (export `vol`), with `extra`
    /// flags (a `--ceph-conf` among them replaces the cluster's).
    pub fn gateway(&self, image: &Image, extra: &[&str]) -> Serve {
        self.gateway_env(image, extra, &[])
    }

    /// `braid serve` as a gateway of `image` (export `vol`), with `extra`
    /// flags and `env`, started without waiting: it may serve or refuse
    /// ([`Spawned::outcome`]).
    pub fn spawn_gateway(&self, image: &Image, extra: &[&str], env: &[(&str, &str)]) -> Spawned {
        let scratch = tempfile::tempdir().expect("temporary dir");
        let listen = if extra.contains(&"--listen") {
            &[][..]
        } else {
            &["--listen", "127.0.0.1:0"][..]
        };
        let mut child = ChildGuard::spawn(
            Command::new(env!("CARGO_BIN_EXE_braid"))
                .arg("serve")
                .args(listen)
                .arg("--control")
                .arg(scratch.path().join("ctl.sock"))
                .arg("--state-dir")
                .arg(scratch.path().join("state"))
                .arg("--ceph-conf")
                .arg(&self.conf)
                .args(extra)
                .arg(format!("vol={}", image.spec()))
                .env("NO_COLOR", "1")
                .env("RUST_LOG", "info")
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
        );
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        let stderr = child.0.stderr.take().expect("stderr is piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut l = sink.lock().unwrap_or_else(|p| p.into_inner());
                l.push_str(&line);
                l.push('\n');
            }
        });
        Spawned {
            child,
            log,
            _scratch: scratch,
        }
    }

    /// As [`Self::gateway`], with `env` added to its environment.
    pub fn gateway_env(&self, image: &Image, extra: &[&str], env: &[(&str, &str)]) -> Serve {
        let conf = self.conf.display().to_string();
        let spec = format!("vol={}", image.spec());
        let mut args: Vec<&str> = Vec::new();
        if !extra.contains(&"--ceph-conf") {
            args.extend(["--ceph-conf", &conf]);
        }
        args.extend(extra);
        args.push(&spec);
        Serve::start_env(&args, env)
    }
}

/// One command to the admin socket at `path` (`ceph --admin-daemon PATH
/// ...` without the Python tool's start-up time): the JSON command, a NUL;
/// back a 32-bit big-endian length and the answer.
pub fn admin_at(path: &Path, command: &serde_json::Value) -> String {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = command.to_string().into_bytes();
    req.push(0);
    s.write_all(&req).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut answer = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut answer).unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// The admin sockets in `dir` (a gateway's `--ceph-admin-socket`): one per
/// RADOS client of the process.
pub fn sockets_in(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "asok"))
        .collect();
    found.sort();
    found
}

/// fio's nbd engine on `uri`: random reads and writes of `bs` over 16 MiB
/// with every block checked by CRC32C; asserts no error and some of both.
pub fn fio_verify(uri: &str, bs: &str) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("fio.json");
    crate::common::run(
        crate::common::cmd("fio")
            .current_dir(dir.path())
            .args(["--name=verify", "--ioengine=nbd", "--size=16m"])
            .arg(format!("--bs={bs}"))
            .args(["--iodepth=16", "--rw=randrw", "--verify=crc32c"])
            .args(["--do_verify=1", "--verify_fatal=1", "--verify_state_save=0"])
            .args(["--runtime=30", "--output-format=json"])
            .arg(format!("--uri={uri}"))
            .arg(format!("--output={}", json.display())),
    );
    let text = std::fs::read_to_string(&json).unwrap();
    let j: serde_json::Value =
        serde_json::from_str(&text[text.find('{').expect("fio JSON")..]).unwrap();
    for job in j["jobs"].as_array().expect("jobs") {
        assert_eq!(job["error"], 0, "{job:#}");
        assert!(job["read"]["io_bytes"].as_u64() > Some(0), "no reads");
        assert!(job["write"]["io_bytes"].as_u64() > Some(0), "no writes");
    }
}

/// A name no other test of this run uses.
fn unique(hint: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{hint}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// A `braid serve` started by [`Cluster::spawn_gateway`], stopped by PID
/// when dropped.
pub struct Spawned {
    child: ChildGuard,
    log: Arc<Mutex<String>>,
    _scratch: tempfile::TempDir,
}

/// What a spawned gateway did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It logged its export: it serves.
    Serving,
    /// It exited with status 1, having said why (its log).
    Refused(String),
}

impl Spawned {
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits (at most `limit`) until it serves or has exited; an exit with
    /// a status other than 1 fails the test.
    pub fn outcome(&mut self, limit: Duration) -> Outcome {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.0.try_wait() {
                // Whatever it wrote last is read before its log is judged.
                std::thread::sleep(Duration::from_millis(100));
                assert_eq!(status.code(), Some(1), "{}", self.log());
                return Outcome::Refused(self.log());
            }
            // The serving line, not the refusal: the error a refused
            // image exits with also begins `export "vol": `, and it can be
            // in the log a moment before the process has exited.
            if self
                .log()
                .lines()
                .any(|l| l.contains("INFO") && l.contains(" export \"vol\": "))
            {
                return Outcome::Serving;
            }
            assert!(
                Instant::now() < deadline,
                "braid serve neither served nor exited within {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `POOL/[NAMESPACE/]NAME`, as the `rbd` command takes an image.
fn image_spec(pool: &str, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{pool}/{ns}/{name}"),
        None => format!("{pool}/{name}"),
    }
}

/// A RADOS namespace in pool `rbd`, removed when dropped.
pub struct Namespace<'a> {
    cluster: &'a Cluster,
    pub name: String,
}

impl Drop for Namespace<'_> {
    fn drop(&mut self) {
        let _ = self.cluster.tool(
            "rbd",
            &["namespace", "remove", &format!("rbd/{}", self.name)],
        );
    }
}

/// A pool of the shared cluster, removed when dropped.
pub struct Pool<'a> {
    cluster: &'a Cluster,
    pub name: String,
}

impl Drop for Pool<'_> {
    fn drop(&mut self) {
        let n = self.name.as_str();
        let _ = self.cluster.tool(
            "ceph",
            &["osd", "pool", "rm", n, n, "--yes-i-really-really-mean-it"],
        );
    }
}

/// An image of the shared cluster, removed when dropped.
pub struct Image<'a> {
    cluster: &'a Cluster,
    pub pool: String,
    /// Its RADOS namespace, `None` for the pool's default one.
    pub namespace: Option<String>,
    pub name: String,
    pub id: String,
}

impl Image<'_> {
    /// `rbd:POOL/[NAMESPACE/]NAME`.
    pub fn spec(&self) -> String {
        format!("rbd:{}", self.rbd_name())
    }

    /// `POOL/[NAMESPACE/]NAME`, as the `rbd` command takes it.
    pub fn rbd_name(&self) -> String {
        image_spec(&self.pool, self.namespace.as_deref(), &self.name)
    }

    /// The image's bytes as `rbd export` reads them from the cluster,
    /// without any gateway.
    pub fn export(&self) -> Vec<u8> {
        self.cluster
            .ok("rbd", &["export", "--no-progress", &self.rbd_name(), "-"])
    }

    /// The image's metadata (`rbd image-meta list`).
    pub fn meta(&self) -> Vec<(String, String)> {
        let out = self.cluster.ok(
            "rbd",
            &["image-meta", "list", "--format", "json", &self.rbd_name()],
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
        v.as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The gateway records in the image's metadata.
    pub fn gateways(&self) -> Vec<serde_json::Value> {
        self.meta()
            .into_iter()
            .filter(|(k, _)| k.starts_with("braid.gateway."))
            .map(|(_, v)| serde_json::from_str(&v).expect("a gateway record is JSON"))
            .collect()
    }
}

impl Drop for Image<'_> {
    fn drop(&mut self) {
        // Frees the OSD's memory; what a killed gateway left is removed too.
        let _ = self
            .cluster
            .tool("rbd", &["rm", "--no-progress", &self.rbd_name()]);
        let barrier = format!("braid_gateways.{}", self.id);
        let mut args = vec!["-p", &self.pool];
        if let Some(ns) = &self.namespace {
            args.extend(["-N", ns]);
        }
        args.extend(["rm", &barrier]);
        let _ = self.cluster.tool("rados", &args);
    }
}
