//! Debian's `tgt` (the Linux SCSI target framework, userspace) as a peer
//! for braid's iSCSI initiator: one `tgtd` per test with its own control
//! port, targets and LUNs on files, one portal per address, CHAP
//! accounts; stopped by PID (tgtd ignores SIGTERM while a target exists,
//! so targets are taken offline and deleted first).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running tgtd.
pub struct Tgt {
    child: Option<Child>,
    /// Its control port (`-C`), unique per test process.
    control: u16,
    targets: Vec<u32>,
    /// Where to run tgtd and tgtadm: a lab namespace's `ip netns exec`
    /// prefix, or nothing for this host.
    prefix: Vec<String>,
}

/// A control port no other tgtd on this machine uses (tgtd takes a short
/// int; its control socket is `/var/run/tgtd/socket.N`): drawn from a
/// free TCP port's number, so tests running at once rarely draw alike,
/// and never one whose socket exists.
fn control_port() -> u16 {
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let n = 1000 + port % 31000;
        if !Path::new(&format!("/var/run/tgtd/socket.{n}")).exists() {
            return n;
        }
    }
}

impl Tgt {
    /// Starts tgtd on `portals` (the first given to tgtd, the rest added).
    pub fn start(portals: &[SocketAddr]) -> Tgt {
        Self::start_in(&[], portals)
    }

    /// As [`Self::start`], every command run behind `prefix` (for a lab
    /// namespace: `ip netns exec NAME`).
    pub fn start_in(prefix: &[&str], portals: &[SocketAddr]) -> Tgt {
        let control = control_port();
        let prefix: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
        let mut cmd = Self::command(&prefix, "tgtd");
        cmd.args(["-f", "-C", &control.to_string(), "--iscsi"])
            .arg(format!("portal={}", portals[0]))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().expect("spawning tgtd");
        let t = Tgt {
            child: Some(child),
            control,
            targets: Vec::new(),
            prefix,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !t.try_adm(&["--op", "show", "--mode", "system"]) {
            assert!(Instant::now() < deadline, "tgtd -C {control} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        for p in &portals[1..] {
            t.adm(&[
                "--lld",
                "iscsi",
                "--op",
                "new",
                "--mode",
                "portal",
                "--param",
                &format!("portal={p}"),
            ]);
        }
        t
    }

    fn command(prefix: &[String], program: &str) -> Command {
        match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(program);
                c
            }
            None => Command::new(program),
        }
    }

    fn try_adm(&self, args: &[&str]) -> bool {
        Self::command(&self.prefix, "tgtadm")
            .args(["-C", &self.control.to_string()])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Runs `tgtadm -C N ARGS` and asserts it succeeded.
    pub fn adm(&self, args: &[&str]) {
        let out = Self::command(&self.prefix, "tgtadm")
            .args(["-C", &self.control.to_string()])
            .args(args)
            .output()
            .expect("running tgtadm");
        assert!(
            out.status.success(),
            "tgtadm {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Target `tid` named `iqn`, open to every initiator, with LUN `lun` on
    /// `file`; `serial` sets the unit's serial (tgt derives its NAA
    /// identity from it, so two units with one serial look alike).
    pub fn target(&mut self, tid: u32, iqn: &str, lun: u16, file: &Path, serial: &str) {
        let t = tid.to_string();
        self.adm(&[
            "--lld", "iscsi", "--op", "new", "--mode", "target", "--tid", &t, "-T", iqn,
        ]);
        self.targets.push(tid);
        self.lun(tid, lun, file, serial);
        self.adm(&[
            "--lld", "iscsi", "--op", "bind", "--mode", "target", "--tid", &t, "-I", "ALL",
        ]);
    }

    /// Another LUN of target `tid`.
    pub fn lun(&self, tid: u32, lun: u16, file: &Path, serial: &str) {
        let (t, l) = (tid.to_string(), lun.to_string());
        let backing = file.display().to_string();
        self.adm(&[
            "--lld",
            "iscsi",
            "--op",
            "new",
            "--mode",
            "logicalunit",
            "--tid",
            &t,
            "--lun",
            &l,
            "-b",
            &backing,
        ]);
        self.lun_params(tid, lun, &format!("scsi_sn={serial},scsi_id={serial}"));
    }

    /// Sets the unit's parameters (`vendor_id=ACME,product_id=DISK`, as
    /// tgtadm takes them).
    pub fn lun_params(&self, tid: u32, lun: u16, params: &str) {
        let (t, l) = (tid.to_string(), lun.to_string());
        self.adm(&[
            "--lld",
            "iscsi",
            "--op",
            "update",
            "--mode",
            "logicalunit",
            "--tid",
            &t,
            "--lun",
            &l,
            "--params",
            params,
        ]);
    }

    /// Requires CHAP of initiators logging in to `tid` (and, with
    /// `target`, proves itself with that account: mutual CHAP).
    pub fn chap(&self, tid: u32, user: (&str, &str), target: Option<(&str, &str)>) {
        self.account(tid, user, false);
        if let Some(t) = target {
            self.account(tid, t, true);
        }
    }

    /// A CHAP account bound to `tid`: one initiators prove (incoming), or
    /// the one the target proves itself with (`outgoing`).
    fn account(&self, tid: u32, (user, secret): (&str, &str), outgoing: bool) {
        let t = tid.to_string();
        let iscsi = ["--lld", "iscsi", "--mode", "account", "--user", user];
        self.adm(&[&iscsi[..], &["--op", "new", "--password", secret]].concat());
        let mut bind = [&iscsi[..], &["--op", "bind", "--tid", &t]].concat();
        if outgoing {
            bind.push("--outgoing");
        }
        self.adm(&bind);
    }

    /// Stops tgtd: targets offline and deleted (with their sessions), the
    /// system deleted, then a bounded wait for the process (killed by PID
    /// past it).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        for tid in std::mem::take(&mut self.targets) {
            let t = tid.to_string();
            self.try_adm(&[
                "--op", "update", "--mode", "target", "--tid", &t, "-n", "state", "-v", "offline",
            ]);
            self.try_adm(&[
                "--lld", "iscsi", "--op", "delete", "--mode", "target", "--tid", &t, "--force",
            ]);
        }
        self.try_adm(&["--op", "delete", "--mode", "system"]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Tgt {
    fn drop(&mut self) {
        self.stop();
    }
}
