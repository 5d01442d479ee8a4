//! Running braid inside the lab: `braid serve` in the storage namespace and
//! braid commands in the client namespace, each process guarded by PID.

#![allow(dead_code)]

// The control socket's types, the very file the binary uses.
#[path = "../../src/ctl.rs"]
pub mod ctl;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use braid_lab::{ChildGuard, Lab, Side};

/// The braid binary: cargo names it for integration tests; examples find
/// it next to themselves (`target/<profile>/examples/..` → `braid`).
pub fn braid_bin() -> String {
    if let Some(p) = option_env!("CARGO_BIN_EXE_braid") {
        return p.to_owned();
    }
    let exe = std::env::current_exe().expect("own path");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>");
    dir.join("braid").display().to_string()
}

/// `braid serve` in the storage namespace.
pub struct LabServe {
    pub guard: ChildGuard,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl LabServe {
    /// Starts `braid serve ARGS` and waits (bounded) until it has logged
    /// `exports` exports, i.e. every portal is bound.
    pub fn start(lab: &Lab, args: &[&str], exports: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("serve.log");
        let mut cmd = Command::new(braid_bin());
        cmd.arg("serve")
            .arg("--state-dir")
            .arg(dir.path())
            .args(args)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let guard = lab.spawn(Side::Storage, cmd).expect("spawn braid serve");
        let s = Self {
            guard,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.log().matches(" export ").count() < exports {
            assert!(
                Instant::now() < deadline,
                "braid serve did not start:\n{}",
                s.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Runs `braid ARGS` in the client namespace to completion (bounded) and
/// asserts it succeeded.
pub fn braid_client(lab: &Lab, args: &[&str], limit: Duration) -> Output {
    let mut cmd = Command::new(braid_bin());
    cmd.args(args).env("NO_COLOR", "1");
    let out = lab.output(Side::Client, cmd, limit).expect("run braid");
    assert!(
        out.status.success(),
        "braid {args:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Percentages from the `path N (...): SIZE (P%)` lines of a copy summary.
pub fn shares(out: &Output) -> Vec<f64> {
    shares_of(&String::from_utf8_lossy(&out.stdout))
}

/// [`shares`] of a summary already read.
pub fn shares_of(summary: &str) -> Vec<f64> {
    summary
        .lines()
        .filter(|l| l.trim_start().starts_with("path "))
        .filter_map(|l| {
            l.rsplit('(')
                .next()?
                .trim_end_matches(['%', ')'])
                .parse()
                .ok()
        })
        .collect()
}

/// A `braid attach` process (in the lab's client namespace, or on this
/// host for loopback tests), with its NBD socket and control socket in a
/// temporary directory.
pub struct Attach {
    pub guard: Option<ChildGuard>,
    pub socket: PathBuf,
    pub control: PathBuf,
    pub name: String,
    log: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Attach {
    /// Starts `braid attach URI ARGS --name NAME` and waits (bounded) for
    /// its socket.
    pub fn start(lab: Option<&Lab>, uri: &str, name: &str, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join(format!("{name}.sock"));
        let control = dir.path().join("control.sock");
        let log = dir.path().join("attach.log");
        let mut a = Self {
            guard: None,
            socket,
            control,
            name: name.to_owned(),
            log,
            dir,
        };
        a.restart(lab, uri, args);
        a
    }

    /// Starts the process again (after [`Self::stop`]) with the same sockets.
    pub fn restart(&mut self, lab: Option<&Lab>, uri: &str, args: &[&str]) {
        let mut cmd = Command::new(braid_bin());
        cmd.arg("attach")
            .arg(uri)
            .args(["--name", &self.name])
            .arg("--socket")
            .arg(&self.socket)
            .arg("--control")
            .arg(&self.control)
            .args(args)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&self.log).unwrap());
        let guard = match lab {
            Some(lab) => lab.spawn(Side::Client, cmd).expect("spawn braid attach"),
            None => ChildGuard::new(cmd.spawn().expect("spawn braid attach"), "braid attach"),
        };
        self.guard = Some(guard);
        let deadline = Instant::now() + Duration::from_secs(15);
        while !(self.socket.exists() && self.control.exists()) {
            assert!(
                Instant::now() < deadline,
                "braid attach did not start:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///{}?socket={}", self.name, self.socket.display())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, bounded wait; returns whether it exited with status 0.
    pub fn stop(&mut self) -> bool {
        match self.guard.take() {
            Some(g) => g.stop().map(|s| s.success()).unwrap_or(false),
            None => true,
        }
    }

    /// `braid status --json --control ...` parsed.
    pub fn status(&self) -> serde_json::Value {
        let out = Command::new(braid_bin())
            .args(["status", "--json", "--control"])
            .arg(&self.control)
            .output()
            .expect("braid status");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The answer must have the shape of braid's own types.
        let typed: ctl::Processes = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "status --json does not fit crate::ctl: {e}\n{}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        assert!(!typed.processes.is_empty());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        v["processes"][0]["volumes"][0].clone()
    }
}

/// `braid CMD ARGS` on this host, asserting success.
pub fn braid_here(args: &[&str]) -> Output {
    let out = Command::new(braid_bin())
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run braid");
    assert!(
        out.status.success(),
        "braid {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
