//! `braid attach` stopped after its target went away (the storage host
//! down, then `systemctl stop`). With nothing written since the last
//! FLUSH it stops at once: its last FLUSH would cover nothing, and with
//! no path it would wait out the whole no-path timeout only to fail.
//! With writes not yet flushed it waits for a path to flush them, says
//! so, and a second SIGTERM stops it without, saying what that costs.
//! A reload that drops such a volume waits the same way, and a SIGTERM
//! meanwhile is heard at once.
//! The writes are 1 MiB, the kernel's shape, from libnbd over two
//! connections at once, to a volume of two paths.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{nbdsh, signal, tool, wait_until, ChildGuard, Serve};

/// Longer than any stop here should take, well short of the no-path
/// timeout (60 s) that the old stop waited out.
const PROMPT: Duration = Duration::from_secs(20);

struct Attached {
    child: ChildGuard,
    socket: PathBuf,
    log: PathBuf,
}

impl Attached {
    fn start(uri: &str, dir: &Path) -> Self {
        let socket = dir.join("vol.sock");
        let log = dir.join("attach.log");
        let child = ChildGuard::spawn(
            Command::new(env!("CARGO_BIN_EXE_braid"))
                .args(["attach", "--no-path-timeout", "60", "--socket"])
                .arg(&socket)
                .arg("--control")
                .arg(dir.join("control.sock"))
                .arg(uri)
                .env("NO_COLOR", "1")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap()),
        );
        let a = Self { child, socket, log };
        a.wait_log("attached", Duration::from_secs(10));
        a
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_log(&self, text: &str, limit: Duration) {
        assert!(
            wait_until(limit, || self.log().contains(text)),
            "attach did not log {text:?} in {limit:?}:\n{}",
            self.log()
        );
    }

    /// Writes 4 MiB in 1 MiB requests through the socket over two
    /// connections at once (the kernel's multi-conn), then a FLUSH on the
    /// first only if `flush` (it covers the other's writes too), and
    /// disconnects both (NBD_CMD_DISC flushes nothing).
    fn write(&self, flush: bool) {
        let flush = if flush { "h.flush()" } else { "pass" };
        nbdsh(&format!(
            "uri = 'nbd+unix:///vol?socket={}'\n\
             h.connect_uri(uri)\nh2 = nbd.NBD()\nh2.connect_uri(uri)\n\
             for i in range(4):\n    (h, h2)[i % 2].pwrite(bytes([0x5a + i]) * 1048576, i * 1048576)\n\
             {flush}\nh.shutdown()\nh2.shutdown()\n",
            self.socket.display()
        ));
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

/// A volume written through attach (and flushed if `flush`), its target
/// then killed outright (no goodbye on its connections) and attach sent
/// SIGTERM once it saw a path fail. `None` where nbdsh is missing
/// outside CI.
fn stopping(flush: bool) -> Option<(Attached, tempfile::TempDir)> {
    if !tool("nbdsh") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    // Two portals: attach's 1 MiB writes go over two paths.
    let serve = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.2:0",
        "vol=mem:64MiB",
    ]);
    let attach = Attached::start(&serve.uri("vol"), dir.path());
    attach.write(flush);
    signal(serve.pid(), libc::SIGKILL);
    attach.wait_log("failed:", Duration::from_secs(10));
    signal(attach.pid(), libc::SIGTERM);
    Some((attach, dir))
}

#[test]
fn attach_with_everything_flushed_stops_at_once_when_its_target_is_gone() {
    let Some((mut attach, _dir)) = stopping(true) else {
        return;
    };
    let status = attach.child.wait(PROMPT).unwrap_or_else(|| {
        panic!(
            "attach still running {PROMPT:?} after SIGTERM:\n{}",
            attach.log()
        )
    });
    let log = attach.log();
    assert!(status.success(), "attach exited {status}:\n{log}");
    assert!(!log.contains("flush failed"), "{log}");
}

#[test]
fn attach_with_unflushed_writes_waits_for_a_path_and_a_second_sigterm_stops_it() {
    let Some((mut attach, _dir)) = stopping(false) else {
        return;
    };
    waits_and_a_second_sigterm_stops_it(&mut attach);
}

/// A configuration of `volumes` (name, URI), each on its own socket in
/// `dir`, with a no-path timeout of `no_path` seconds.
fn write_config(path: &Path, dir: &Path, volumes: &[(&str, String)], no_path: u32) {
    let mut text = String::new();
    for (name, uri) in volumes {
        text.push_str(&format!(
            "[[volume]]\nname = {name:?}\nuri = {uri:?}\nsocket = {:?}\nno_path_timeout = {no_path}\n\n",
            dir.join(format!("{name}.sock")).display().to_string()
        ));
    }
    std::fs::write(path, text).unwrap();
}

/// `braid attach --config` of "vol" and "other", each from its own braid
/// serve, reloading without "vol" after "vol" was written (not flushed)
/// and its target killed: the reload waits to flush "vol".
struct Reloading {
    attach: Attached,
    dir: tempfile::TempDir,
    config: PathBuf,
    stays: Serve,
    no_path: u32,
}

impl Reloading {
    /// `None` where nbdsh is missing outside CI.
    fn start(no_path: u32) -> Option<Self> {
        if !tool("nbdsh") {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let gone = Serve::start(&[
            "--listen",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.2:0",
            "vol=mem:64MiB",
        ]);
        let stays = Serve::start(&["other=mem:8MiB", "third=mem:8MiB"]);
        let config = dir.path().join("attach.toml");
        let both = [("vol", gone.uri("vol")), ("other", stays.uri("other"))];
        write_config(&config, dir.path(), &both, no_path);
        let log = dir.path().join("attach.log");
        let child = ChildGuard::spawn(
            Command::new(env!("CARGO_BIN_EXE_braid"))
                .arg("attach")
                .arg("--config")
                .arg(&config)
                .arg("--control")
                .arg(dir.path().join("control.sock"))
                .env("NO_COLOR", "1")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap()),
        );
        let attach = Attached {
            child,
            socket: dir.path().join("vol.sock"),
            log,
        };
        attach.wait_log("attached volume=other", Duration::from_secs(10));
        attach.write(false);
        signal(gone.pid(), libc::SIGKILL);
        attach.wait_log("failed:", Duration::from_secs(10));

        write_config(&config, dir.path(), &both[1..], no_path);
        signal(attach.pid(), libc::SIGHUP);
        attach.wait_log("no longer configured", Duration::from_secs(10));
        Some(Self {
            attach,
            dir,
            config,
            stays,
            no_path,
        })
    }
}

/// A reload (SIGHUP) that drops a volume whose target is gone, with
/// writes not yet flushed, waits for a path to flush them like a stop
/// does; a SIGTERM meanwhile is heard at once (the reload used to hold
/// every signal until the no-path timeout ran out), and a second one
/// stops attach, naming what it left unflushed.
#[test]
fn a_sigterm_while_a_reload_waits_to_flush_a_dropped_volume_is_heard_at_once() {
    let Some(mut r) = Reloading::start(60) else {
        return;
    };
    signal(r.attach.pid(), libc::SIGTERM);
    waits_and_a_second_sigterm_stops_it(&mut r.attach);
}

/// A SIGHUP while a reload waits (the file edited again meanwhile) is
/// kept, and the file read again once the first reload is done: the
/// volume the second edit added is attached.
#[test]
fn a_sighup_while_a_reload_waits_is_kept_and_the_file_read_again() {
    let Some(mut r) = Reloading::start(3) else {
        return;
    };
    let third = [
        ("other", r.stays.uri("other")),
        ("third", r.stays.uri("third")),
    ];
    write_config(&r.config, r.dir.path(), &third, r.no_path);
    signal(r.attach.pid(), libc::SIGHUP);
    r.attach
        .wait_log("SIGHUP during a reload", Duration::from_secs(10));
    // The first reload ends when the dropped volume's flush gives up.
    let limit = Duration::from_secs(u64::from(r.no_path) + 10);
    r.attach.wait_log("attached volume=third", limit);
    signal(r.attach.pid(), libc::SIGTERM);
    let status = r.attach.child.wait(PROMPT).unwrap_or_else(|| {
        panic!(
            "attach still running {PROMPT:?} after SIGTERM:\n{}",
            r.attach.log()
        )
    });
    assert!(
        status.success(),
        "attach exited {status}:\n{}",
        r.attach.log()
    );
}

/// A stopping attach with "vol" unflushed says what it waits for and how
/// to stop it, and a second SIGTERM stops it: non-zero, naming "vol".
fn waits_and_a_second_sigterm_stops_it(attach: &mut Attached) {
    // It says what it waits for and how to stop it.
    attach.wait_log("SIGTERM again", Duration::from_secs(10));
    assert!(
        attach.child.0.try_wait().unwrap().is_none(),
        "attach stopped without flushing or saying so:\n{}",
        attach.log()
    );
    signal(attach.pid(), libc::SIGTERM);
    let status = attach.child.wait(PROMPT).unwrap_or_else(|| {
        panic!(
            "attach still running {PROMPT:?} after a second SIGTERM:\n{}",
            attach.log()
        )
    });
    let log = attach.log();
    assert!(
        !status.success(),
        "a stop that dropped a flush exited 0:\n{log}"
    );
    assert!(
        log.contains("without its final flush") && log.contains("\"vol\""),
        "the log does not name what was not flushed:\n{log}"
    );
}
