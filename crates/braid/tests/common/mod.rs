//! Shared harness for braid's integration tests: a real `braid serve`
//! process ([`Serve`]), guards for every other process a test spawns,
//! bounded runs of external tools, test data, and a raw NBD client
//! ([`raw::RawClient`]) for speaking bytes the real clients never would.
//!
//! Every process started here is stopped by PID from a guard, every wait is
//! bounded, and every file lives in a temporary directory, so a failing or
//! panicking test leaves nothing behind.

// Each test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

pub mod raw;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};

/// How long `braid serve` may take to log its portals and exports.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping process may take before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Default bound on one external tool run.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// `braid serve ARGS` with its state in `state`, expected to be refused
/// at start (exit status 1); its stderr.
pub fn refused(state: &Path, args: &[&str]) -> String {
    let out = output(
        Command::new(env!("CARGO_BIN_EXE_braid"))
            .arg("serve")
            .arg("--state-dir")
            .arg(state)
            .arg("--control")
            .arg(state.join("ctl"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args),
        Duration::from_secs(20),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "braid serve {args:?} was not refused"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `braid serve` flags that take no value. Every other flag written as
/// `--flag VALUE` is followed by its value, which is not an export even
/// when it looks like one (`--allow vol=10.0.0.0/8`).
const BOOL_FLAGS: [&str; 9] = [
    "--read-only",
    "--allow-network-fs",
    "--rbd-cache",
    "-v",
    "-vv",
    "-q",
    "-qq",
    "--verbose",
    "--quiet",
];

/// A running `braid serve`, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Serve {
    child: Child,
    portals: Vec<SocketAddr>,
    /// `(name, volume uuid)` in the order braid logged them.
    exports: Vec<(String, String)>,
    log: Arc<Mutex<String>>,
    /// Holds the state directory and control socket, unless the test
    /// chose its own, so nothing outlives the test.
    _scratch: tempfile::TempDir,
}

impl Serve {
    /// Starts `braid serve ARGS`. Without a `--listen`, one portal on
    /// `127.0.0.1:0` (the OS picks the port); without an export (or a
    /// `--config`), `vol=mem:64MiB`; without a `--state-dir` or a
    /// `--control`, ones in a temporary directory. Returns once every
    /// portal and export has been logged and SIGTERM is handled.
    pub fn start(args: &[&str]) -> Serve {
        Self::start_env(args, &[])
    }

    /// As [`Self::start`], with `env` added to the process's environment.
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Serve {
        let mut argv: Vec<String> = vec!["serve".into()];
        let has = |flag: &str| {
            args.iter()
                .any(|a| *a == flag || a.starts_with(&format!("{flag}=")))
        };
        let scratch = tempfile::tempdir().expect("temporary dir");
        if !has("--state-dir") {
            argv.push("--state-dir".into());
            argv.push(scratch.path().join("state").display().to_string());
        }
        // The default control socket lives in /run and would be left there
        // by a server that a test kills.
        if !has("--control") {
            argv.push("--control".into());
            argv.push(scratch.path().join("control.sock").display().to_string());
        }
        if !has("--listen") && !has("-l") {
            argv.extend(["--listen".into(), "127.0.0.1:0".into()]);
        }
        argv.extend(args.iter().map(|a| a.to_string()));
        let mut names = export_names(args);
        if names.is_empty() && !has("--config") {
            argv.push("vol=mem:64MiB".into());
            names.push("vol".into());
        }

        let mut child = Command::new(env!("CARGO_BIN_EXE_braid"))
            .args(&argv)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning braid serve");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel::<String>();
        let stderr = child.stderr.take().expect("stderr is piped");
        let sink = log.clone();
        // Keeps draining after startup so braid never blocks on a full pipe,
        // and so tests can read what it said (`log()`).
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let line = strip_ansi(&line);
                let mut l = sink.lock().unwrap_or_else(|p| p.into_inner());
                l.push_str(&line);
                l.push('\n');
                drop(l);
                let _ = tx.send(line);
            }
        });

        let mut serve = Serve {
            child,
            portals: Vec::new(),
            exports: Vec::new(),
            log,
            _scratch: scratch,
        };
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        // Portals are logged before exports, so once every export is in,
        // every portal is too. (Exports from a --config are not known
        // here: then the first export line is taken as the sign.)
        while serve.exports.len() < names.len().max(1) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => serve.parse_startup_line(&line),
                Err(e) => panic!(
                    "braid serve {argv:?} did not log its exports ({e}); log:\n{}",
                    serve.log()
                ),
            }
        }
        assert!(
            !serve.portals.is_empty(),
            "no portal logged:\n{}",
            serve.log()
        );
        // braid installs its SIGTERM handler only after logging startup; a
        // test that stops it at once must not race that (the race itself is
        // pinned by `sigterm_right_after_startup_exits_0`).
        while !catches_sigterm(serve.pid()) {
            assert!(
                Instant::now() < deadline,
                "braid serve never installed a SIGTERM handler:\n{}",
                serve.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        serve
    }

    fn parse_startup_line(&mut self, line: &str) {
        if let Some(rest) = line.split(" portal ").nth(1) {
            let addr = rest.split_whitespace().next().unwrap_or_default();
            let addr = addr
                .parse()
                .unwrap_or_else(|e| panic!("portal {addr:?}: {e}"));
            self.portals.push(addr);
        } else if let Some(rest) = line.split(" export \"").nth(1) {
            let name = rest.split('"').next().unwrap_or_default().to_owned();
            let volume = rest
                .rsplit("volume ")
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned();
            self.exports.push((name, volume));
        }
    }

    pub fn portals(&self) -> Vec<SocketAddr> {
        self.portals.clone()
    }

    /// The first portal.
    pub fn addr(&self) -> SocketAddr {
        self.portals[0]
    }

    /// `nbd://ADDR:PORT/EXPORT` on the first portal.
    pub fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{export}", self.addr())
    }

    /// The volume identity braid logged for an export.
    pub fn logged_volume(&self, export: &str) -> String {
        self.exports
            .iter()
            .find(|(n, _)| n == export)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no export {export:?} logged"))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything braid has written to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Asserts the process runs and never panicked: tokio catches a panic
    /// in a connection task, so only the log shows it.
    pub fn assert_healthy(&mut self) {
        assert!(self.alive(), "braid serve exited; log:\n{}", self.log());
        let log = self.log();
        assert!(!log.contains("panicked"), "braid serve panicked:\n{log}");
    }

    /// Resident memory of the server, in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid())
    }

    /// SIGTERM, then waits (bounded) for the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        signal(self.child.id(), libc::SIGTERM);
        match wait_timeout(&mut self.child, STOP_TIMEOUT) {
            Some(status) => status,
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "braid serve ignored SIGTERM for {STOP_TIMEOUT:?}:\n{}",
                    self.log()
                )
            }
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}

/// The export names among `braid serve` arguments: positional `NAME=SOURCE`.
fn export_names(args: &[&str]) -> Vec<String> {
    let mut names = Vec::new();
    let mut skip = false;
    for a in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        if a.starts_with('-') {
            skip = !a.contains('=') && !BOOL_FLAGS.contains(a);
            continue;
        }
        if let Some((name, _)) = a.split_once('=') {
            names.push(name.to_owned());
        }
    }
    names
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A spawned process that is stopped by PID when the guard drops.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    pub fn spawn(cmd: &mut Command) -> ChildGuard {
        ChildGuard(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}")),
        )
    }

    /// Waits at most `limit` for the exit status.
    pub fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        wait_timeout(&mut self.0, limit)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        stop_child(&mut self.0);
    }
}

fn stop_child(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    signal(child.id(), libc::SIGTERM);
    if wait_timeout(child, STOP_TIMEOUT).is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

pub fn signal(pid: u32, sig: i32) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill only reads its two integer arguments; the pid is one of
    // our own children that has not been reaped yet.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Stops `pid` (SIGSTOP) and returns once every one of its threads is
/// stopped. A signal is acted on only when one of the process's threads
/// runs: on a loaded machine another thread woken by a request can
/// answer it first, so a test that means "the server stalls here" waits
/// for the stop to be real before it sends anything more.
#[allow(dead_code)]
pub fn stop(pid: u32) {
    signal(pid, libc::SIGSTOP);
    let deadline = Instant::now() + Duration::from_secs(10);
    let stopped = || {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return true;
        };
        tasks.flatten().all(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // The state follows the command name's closing parenthesis.
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            state.starts_with('T') || state.starts_with('t') || state.is_empty()
        })
    };
    while !stopped() {
        assert!(
            Instant::now() < deadline,
            "process {pid} did not stop on SIGSTOP"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => return None,
        }
    }
}

/// Whether `pid` has a handler for SIGTERM (`SigCgt` in /proc/PID/status).
pub fn catches_sigterm(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGTERM - 1)) != 0)
}

pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

fn test_name() -> String {
    std::thread::current().name().unwrap_or("test").to_owned()
}

/// Whether `name` is on PATH. Outside CI a missing tool skips the test with
/// a loud line; in CI (env `CI` set) every tool must be there.
pub fn tool(name: &str) -> bool {
    let found = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(name)).is_ok_and(|m| {
                m.is_file()
                    && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
            })
        })
    });
    skip_unless(
        found,
        &format!("{name} not installed"),
        &format!("CI must install {name}"),
    )
}

/// Whether `path` (a header or library a test builds against) is
/// installed, as Debian's `package` puts it; same rule as [`tool`].
pub fn installed(path: &str, package: &str) -> bool {
    skip_unless(
        Path::new(path).exists(),
        &format!("{path} missing: install {package}"),
        &format!("CI must install {package}"),
    )
}

/// Whether the tests run as root (for FUSE mounts); same rule as [`tool`].
pub fn need_root() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    skip_unless(root, "needs root", "CI must run the tests as root")
}

fn skip_unless(ok: bool, why: &str, ci: &str) -> bool {
    if ok {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{ci}");
    }
    eprintln!("SKIPPED {}: {why}", test_name());
    false
}

/// A command for an external tool, with Debian's `/usr/bin` first on PATH:
/// nbdsh and the `nbd` Python module live with the system python3, which a
/// developer's own python3 (pyenv and the like) would otherwise shadow.
pub fn cmd(program: &str) -> Command {
    let mut c = Command::new(program);
    let path = std::env::var("PATH").unwrap_or_default();
    c.env("PATH", format!("/usr/bin:/bin:{path}"));
    c
}

/// Runs to completion within [`TOOL_TIMEOUT`] and asserts success.
pub fn run(cmd: &mut Command) -> Output {
    let out = output(cmd, TOOL_TIMEOUT);
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs to completion within `limit` (killed and a panic otherwise) and
/// returns its output whatever the exit status.
pub fn output(cmd: &mut Command, limit: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = ChildGuard::spawn(cmd);
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(child.0.stdout.take().map(|s| Box::new(s) as _));
    let stderr = drain(child.0.stderr.take().map(|s| Box::new(s) as _));
    let Some(status) = child.wait(limit) else {
        let _ = child.0.kill();
        let _ = child.0.wait();
        let err = stderr.join().unwrap_or_default();
        panic!(
            "{cmd:?} still running after {limit:?}; killed. stderr:\n{}",
            String::from_utf8_lossy(&err)
        );
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// GET /metrics from a `--metrics` listener on loopback, bounded in time;
/// the body.
pub fn scrape(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics listener");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    body.to_owned()
}

/// Runs a Python script under nbdsh (libnbd's shell; `nbd` is imported and
/// `h` is an unconnected handle) and returns its stdout.
pub fn nbdsh(script: &str) -> String {
    let out = run(cmd("nbdsh").arg("-c").arg(script));
    String::from_utf8(out.stdout).expect("nbdsh output is UTF-8")
}

/// `size` bytes from a seeded generator: the same seed, the same bytes.
pub fn random_bytes(size: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut buf = vec![0u8; size];
    rng.fill_bytes(&mut buf);
    buf
}

/// A file of `size` seeded random bytes in `dir`.
pub fn random_file(dir: &Path, size: usize, seed: u64) -> PathBuf {
    let path = dir.join(format!("random-{size}-{seed}.bin"));
    let mut f = std::fs::File::create(&path).expect("creating test data");
    f.write_all(&random_bytes(size, seed))
        .expect("writing test data");
    path
}

/// A sparse file of `size` bytes (all holes) in `dir`.
pub fn sparse_file(dir: &Path, name: &str, size: u64) -> PathBuf {
    let path = dir.join(name);
    let f = std::fs::File::create(&path).expect("creating sparse file");
    f.set_len(size).expect("sizing sparse file");
    path
}

pub fn sha256(path: &Path) -> String {
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut hasher = Sha256::new();
    std::io::copy(&mut f, &mut hasher).expect("hashing file");
    hex::encode(hasher.finalize())
}

pub fn sha256_bytes(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// A TCP port free on every address now, for a listener that must be named
/// before it starts. Drawn from below the kernel's ephemeral range: a port
/// the kernel handed out once (`bind(0)`) it hands out again, to another
/// test's listener or outgoing connection, in the moment between this
/// call and the bind that wants it. Each process walks its own stretch of
/// ports (by PID), and never repeats one.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (first, span) = (10_000u32, low.saturating_sub(10_000).max(1000));
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (first + (start + n) % span) as u16;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no free TCP port between {first} and {}", first + span)
}

/// Polls `done` every 20 ms for up to `limit`; whether it came true.
pub fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}
