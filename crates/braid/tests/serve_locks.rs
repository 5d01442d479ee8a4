//! One writer per image (issue 16 point 5): a second `braid serve` of the
//! same file is refused, braid and qemu refuse each other, read-only
//! exports share, and a block device another program holds is refused.

mod common;

use braid_test_needs::needs;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{cmd, free_port, output, ChildGuard, Serve};

/// `braid serve ARGS` expected to fail at start; its stderr.
fn refused(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    common::refused(dir.path(), args)
}

fn image(dir: &std::path::Path) -> String {
    let p = dir.join("disk.img");
    std::fs::write(&p, vec![0u8; 4 << 20]).unwrap();
    p.display().to_string()
}

#[test]
fn a_second_writer_of_an_image_is_refused_and_readers_share() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let first = Serve::start(&[&format!("vol={img}")]);
    let err = refused(&[&format!("vol={img}")]);
    assert!(err.contains("in use") && err.contains("disk.img"), "{err}");
    // A read-only export cannot join a writer either.
    let err = refused(&["--read-only", &format!("vol={img}")]);
    assert!(err.contains("in use"), "{err}");
    drop(first);
    // Readers share.
    let _r1 = Serve::start(&["--read-only", &format!("vol={img}")]);
    let _r2 = Serve::start(&["--read-only-export", "vol", &format!("vol={img}")]);
    let err = refused(&[&format!("vol={img}")]);
    assert!(err.contains("in use"), "{err}");
}

#[needs("qemu-io", "qemu-nbd")]
fn braid_and_qemu_refuse_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    {
        let _serve = Serve::start(&[&format!("vol={img}")]);
        let out = output(
            cmd("qemu-io").args(["-f", "raw", "-c", "write 0 4k", &img]),
            Duration::from_secs(20),
        );
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && said.contains("lock"),
            "qemu-io wrote an image braid serves: {said}"
        );
    }
    let port = free_port();
    let mut nbd = ChildGuard::spawn(
        cmd("qemu-nbd")
            .args([
                "-f",
                "raw",
                "-p",
                &port.to_string(),
                "-b",
                "127.0.0.1",
                &img,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null()),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "qemu-nbd did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = refused(&[&format!("vol={img}")]);
    assert!(err.contains("in use"), "{err}");
    assert!(nbd.wait(Duration::ZERO).is_none(), "qemu-nbd kept running");
}

/// A loop device over a file, detached when dropped.
struct Loop(String);

impl Loop {
    /// A loop device over `img`.
    fn over(img: &str) -> Loop {
        let out = output(
            Command::new("losetup").args(["--find", "--show", img]),
            Duration::from_secs(20),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Loop(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

#[needs("root", "losetup")]
fn a_block_device_held_by_another_writer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Loop::over(&image(dir.path()));
    let _first = Serve::start(&[&format!("vol={}", dev.0)]);
    let err = refused(&[&format!("vol={}", dev.0)]);
    assert!(err.contains("in use") && err.contains(&dev.0), "{err}");
}

/// A read-only export takes no exclusive claim on a block device: a
/// writer (here a writable `braid serve`, which opens it with O_EXCL)
/// still gets it while braid reads it.
#[needs("root", "losetup")]
fn a_read_only_export_takes_no_exclusive_claim_on_a_block_device() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Loop::over(&image(dir.path()));
    let _reader = Serve::start(&["--read-only", &format!("vol={}", dev.0)]);
    // Serve::start panics with the log if the writer is refused.
    let _writer = Serve::start(&[&format!("vol={}", dev.0)]);
}

/// A FUSE mount whose type is a network file system's, as GlusterFS's
/// client mounts (`fuse.glusterfs`): braid reads the type, which is all it
/// can know of any file system (a real GlusterFS cannot run here).
fn on_glusterfs(dir: &std::path::Path) -> braid_powercut::PowerCut {
    let at = dir.join("gv0");
    std::fs::create_dir(&at).unwrap();
    braid_powercut::PowerCut::mount_as(&at, "disk.img", 4 << 20, Some("glusterfs"))
        .expect("mounting braid-powercut as fuse.glusterfs")
}

/// An image on a network file system is locked on this host only: a
/// writable export of it is refused unless `--allow-network-fs` accepts
/// that, and every start says so.
#[needs("root")]
fn an_image_on_a_network_file_system_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let fs = on_glusterfs(dir.path());
    let img = format!("vol={}", fs.file().display());
    let err = refused(&[&img]);
    assert!(
        err.contains("GlusterFS") || err.contains("glusterfs"),
        "refused, naming the file system: {err}"
    );
    assert!(err.contains("--allow-network-fs"), "and the flag: {err}");
    {
        let reader = Serve::start(&["--read-only", &img]);
        assert!(reader.log().contains("this host only"), "{}", reader.log());
    }
    let writer = Serve::start(&["--allow-network-fs", &img]);
    assert!(writer.log().contains("this host only"), "{}", writer.log());
}
