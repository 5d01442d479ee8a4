//! Power loss under `braid serve`: the export is a file on a FUSE file
//! system (`braid-powercut`) that keeps writes in a volatile cache until
//! `fdatasync` makes them durable, and on command forgets what it did not,
//! keeping a random share of the dirty sectors as a disk cut mid-write does.
//! Unlike SIGKILL (`crash_consistency.rs`), this takes the page cache too,
//! so the file backend's `fdatasync` calls are what the tests check.
//!
//! - Every write acknowledged with FUA, or before a FLUSH that was then
//!   acknowledged, survives; nothing stale or torn across a flushed
//!   boundary appears (the rules are `crashkit`'s).
//! - With the initiator's replay window, a volume that stays open across the
//!   cuts loses nothing at all (`power_loss_replay.rs`).
//! - A failed `fdatasync` is remembered: every later FLUSH and FUA write on
//!   that export fails until `braid serve` reopens it.
//!
//! Mounting needs root.

mod common;
mod crashkit;

use braid_test_needs::needs;

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use braid_powercut::{Cut, PowerCut};
use common::{free_port, nbdsh};
use crashkit::{block_data, decode_sector, power_cut, read_disk, BLOCK, BLOCKS, SECTOR, WAIT};
use rand::Rng;

const CUTS: usize = 10;
/// Bound on each whole test.
const WHOLE_TEST: Duration = Duration::from_secs(120);

/// A power-cut file system on a fresh mount point, with the volume's file.
fn mount(dir: &Path) -> PowerCut {
    let at = dir.join("mnt");
    std::fs::create_dir(&at).expect("mount point");
    PowerCut::mount(&at, "disk.img", BLOCKS * BLOCK as u64).expect("mounting braid-powercut")
}

#[needs("root")]
fn the_harness_forgets_exactly_what_was_never_synced() {
    let dir = tempfile::tempdir().expect("temporary dir");
    let pc = mount(dir.path());
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(pc.file())
        .expect("open");
    f.write_all(&[1; 4096]).expect("write");
    f.sync_data().expect("fdatasync");
    f.seek(SeekFrom::Start(0)).expect("seek");
    f.write_all(&[2; 1024]).expect("write");
    assert_eq!(pc.dirty_sectors(), 2);
    let cut = pc.power_off(0.0, 1);
    assert_eq!(cut, Cut { lost: 2, kept: 0 });
    assert!(f.sync_data().is_err(), "a dead disk answers nothing");
    pc.power_on();
    let mut back = vec![0; 4096];
    f.seek(SeekFrom::Start(0)).expect("seek");
    f.read_exact(&mut back).expect("read");
    assert_eq!(back, [1; 4096], "only the synced data survives the cut");

    pc.fail_next_syncs(1);
    f.write_all(&[3; 512]).expect("write");
    assert!(f.sync_data().is_err(), "the injected failure");
    assert!(
        f.sync_data().is_ok(),
        "and, as on Linux, the next one forgets it"
    );
    assert_eq!(pc.syncs().failed, 1);
}

#[needs("root")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_flushes_and_fua_writes_survive_power_loss() {
    let dir = tempfile::tempdir().expect("temporary dir");
    let pc = mount(dir.path());
    let seed = crashkit::seed("power loss");
    let mut lost = 0;
    let run = crashkit::cycles(pc.file(), CUTS, seed, |serve, rng| {
        let cut = power_cut(serve, &pc, 0.5, rng.gen());
        lost += cut.lost;
        format!(
            "power cut: {} dirty sectors lost, {} kept",
            cut.lost, cut.kept
        )
    });
    let report = tokio::time::timeout(WHOLE_TEST, run)
        .await
        .expect("power-loss test bounded in time");
    // Without this the cuts could have landed when nothing was dirty, and
    // the test would prove nothing about fdatasync.
    assert!(lost > 0, "no cut found a dirty sector to drop");
    assert!(
        report.checks.lost > 0,
        "no cut lost an acknowledged, unflushed write: the harness is not cutting power"
    );
}

#[needs("root", "nbdsh")]
fn a_failed_fdatasync_fails_every_later_flush_until_reopened() {
    let dir = tempfile::tempdir().expect("temporary dir");
    let pc = mount(dir.path());
    let state = dir.path().join("state");
    let control = dir.path().join("ctl.sock");
    let metrics = format!("--metrics=127.0.0.1:{}", free_port());
    let start = || crashkit::start(pc.file(), &state, &control, &[&metrics]);
    let mut serve = start();
    let uri = serve.uri("vol");

    pc.fail_next_syncs(1);
    let out = nbdsh(&format!(
        r#"h.connect_uri({uri:?})
def attempt(what, f):
    try:
        f()
        print(what, "OK")
    except nbd.Error as e:
        print(what, "FAILED", e.errno)
h.pwrite(b"\x01" * 4096, 0)
attempt("first-flush", h.flush)
h.pwrite(b"\x02" * 4096, 4096)
attempt("second-flush", h.flush)
attempt("fua-write", lambda: h.pwrite(b"\x03" * 4096, 8192, nbd.CMD_FLAG_FUA))
attempt("fua-zero", lambda: h.zero(4096, 16384, nbd.CMD_FLAG_FUA))
attempt("fua-trim", lambda: h.trim(4096, 20480, nbd.CMD_FLAG_FUA))
attempt("plain-write", lambda: h.pwrite(b"\x04" * 4096, 12288))
h.shutdown()
"#
    ));
    assert_eq!(pc.syncs().failed, 1, "the injected failure was reached");
    for want in [
        "first-flush FAILED EIO",
        "second-flush FAILED EIO",
        "fua-write FAILED EIO",
        "fua-zero FAILED EIO",
        "fua-trim FAILED EIO",
        "plain-write OK",
    ] {
        assert!(
            out.contains(want),
            "want {want:?} in:\n{out}\n{}",
            serve.log()
        );
    }
    let log = serve.log();
    assert!(
        log.contains("a cache flush failed") && log.contains("restart braid serve"),
        "the log says the export failed:\n{log}"
    );
    let scraped = scrape(&metrics);
    assert!(
        scraped.contains("braid_export_failed{export=\"vol\"} 1"),
        "{scraped}"
    );

    serve.stop();
    drop(serve);
    let serve = start();
    let out = nbdsh(&format!(
        "h.connect_uri({:?})\nh.pwrite(b'\\x05' * 4096, 0)\nh.flush()\nprint('REOPENED OK')\nh.shutdown()\n",
        serve.uri("vol")
    ));
    assert!(out.contains("REOPENED OK"), "{out}");
    assert!(
        scrape(&metrics).contains("braid_export_failed{export=\"vol\"} 0"),
        "reopened"
    );
}

/// GET /metrics from `--metrics=ADDR`.
fn scrape(flag: &str) -> String {
    let addr = flag.trim_start_matches("--metrics=");
    let mut s = std::net::TcpStream::connect(addr).expect("metrics endpoint");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("request");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("response");
    body
}

#[needs("root")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fdatasync_taking_seconds_fails_no_path() {
    let dir = tempfile::tempdir().expect("temporary dir");
    let pc = mount(dir.path());
    let serve = crashkit::start(
        pc.file(),
        &dir.path().join("state"),
        &dir.path().join("ctl.sock"),
        &["--listen=127.0.0.1:0", "--listen=127.0.0.2:0"],
    );
    // A busy disk: every cache flush takes two seconds, longer than any
    // reply timeout a round trip would suggest.
    pc.delay_syncs(Duration::from_secs(2));
    let vol = crashkit::open(&serve, Duration::from_secs(60)).await;
    assert_eq!(vol.report().paths.len(), 2, "both portals are paths");
    let work = async {
        let mut tasks = tokio::task::JoinSet::new();
        for block in 0..BLOCKS {
            let v = vol.clone();
            // Some FUA writes: they wait for the disk too.
            tasks.spawn(async move {
                v.write(block * BLOCK as u64, block_data(block, 1), block % 32 == 0)
                    .await
                    .map_err(|e| format!("write of block {block}: {e}"))
            });
            if block % 64 == 63 {
                let v = vol.clone();
                tasks.spawn(async move { v.flush().await.map_err(|e| format!("FLUSH: {e}")) });
            }
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("task")?;
        }
        vol.flush().await.map_err(|e| format!("last FLUSH: {e}"))
    };
    let result = tokio::time::timeout(WHOLE_TEST, work)
        .await
        .expect("slow-flush load bounded in time");
    let report = vol.report();
    assert!(result.is_ok(), "{result:?}: {report:?}\n{}", serve.log());
    assert!(
        pc.syncs().done >= 5,
        "the slow flushes were reached: {:?}",
        pc.syncs()
    );
    for p in &report.paths {
        assert_eq!(
            p.figures.counters.failures, 0,
            "path {} was failed by a slow disk: {report:?}",
            p.index
        );
    }
    let disk = read_disk(&vol, "after the slow flushes").await;
    for block in 0..BLOCKS {
        for s in 0..BLOCK / SECTOR {
            let at = block as usize * BLOCK + s * SECTOR;
            assert_eq!(
                decode_sector(block, s, &disk[at..at + SECTOR]),
                Some(1),
                "block {block} sector {s}"
            );
        }
    }
    tokio::time::timeout(WAIT, vol.close())
        .await
        .expect("close");
}

#[needs("root", "nbdsh")]
fn sigterm_makes_unflushed_writes_durable_before_exit() {
    let dir = tempfile::tempdir().expect("temporary dir");
    let pc = mount(dir.path());
    let state = dir.path().join("state");
    let control = dir.path().join("ctl.sock");
    let mut serve = crashkit::start(pc.file(), &state, &control, &[]);
    nbdsh(&format!(
        "h.connect_uri({:?})\nh.pwrite(bytes(range(256)) * 64, 65536)\nh.shutdown()\n",
        serve.uri("vol")
    ));
    assert!(pc.dirty_sectors() > 0, "the write is still in the cache");
    let status = serve.stop();
    assert!(status.success(), "exit {status}:\n{}", serve.log());
    let cut = pc.power_off(0.0, 0);
    assert_eq!(
        cut.lost, 0,
        "braid serve exited with writes not on the disk"
    );
    pc.power_on();
    let mut back = vec![0; 16384];
    let f = std::fs::File::open(pc.file()).expect("open");
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 65536).expect("read");
    assert!(back.chunks(256).all(|c| c.iter().copied().eq(0..=255u8)));
}
