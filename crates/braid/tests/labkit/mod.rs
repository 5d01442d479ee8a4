//! Running braid inside the lab: `braid serve` in the storage namespace and
//! braid commands in the client namespace, each process guarded by PID.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use braid_lab::{ChildGuard, Lab, Side};

pub fn braid_bin() -> &'static str {
    env!("CARGO_BIN_EXE_braid")
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
    String::from_utf8_lossy(&out.stdout)
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
