//! An open volume across power cuts of `braid serve`: the server's file is
//! on `braid-powercut` (a FUSE file system that forgets what was never
//! synced), the host is cut five times under a verified load and comes
//! back, and the initiator's replay window gives each restarted server
//! every write it had acknowledged and not made durable, before anything
//! else. Nothing acknowledged is lost, and no read ever returns data older
//! than an acknowledged write.
//!
//! The loads are the shapes real clients use: 1 MiB writes (a kernel's
//! writeback through `braid attach`), mixed sizes from 4 KiB to 1 MiB over
//! two paths with reads and WRITE_ZEROES among them, and 4 KiB writes. A
//! write of more than 64 KiB goes to the server in pieces, so a cut lands
//! between the pieces of some write almost every time: the old server
//! acknowledged some of them, the new one never saw them.
//!
//! The same through `braid attach`'s socket, as the kernel and hypervisors
//! reach the volume: four connections of 128 KiB to 1 MiB writes with no
//! FLUSH at all (VMware's shape: only the replay window keeps them), then
//! with FLUSH and FUA (a kernel's writeback), the host cut under each.
//!
//! Mounting needs root.

mod attachload;
mod common;
mod crashkit;
mod labkit;

use braid_test_needs::needs;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use braid_initiator::Volume;
use braid_powercut::PowerCut;
use bytes::{Bytes, BytesMut};
use common::{cmd, free_port};
use crashkit::{block_data, decode_sector, power_cut, BLOCK, SECTOR, WAIT};
use rand::{Rng, SeedableRng};

/// Bound on each whole test.
const WHOLE_TEST: Duration = Duration::from_secs(120);
const WORKERS: u64 = 4;
const CUTS: usize = 5;

/// What a run writes and over what.
struct Load {
    /// Write sizes in 4 KiB blocks, picked at random.
    sizes: &'static [u64],
    /// Portals of the server, each a path.
    paths: usize,
    /// One request in five is a read of the worker's own blocks, checked.
    reads: bool,
    /// One request in eight zeroes a range (WRITE_ZEROES).
    zeroes: bool,
    /// The volume, in blocks: a region per worker.
    blocks: u64,
}

#[needs("root")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_volume_loses_nothing_across_power_cuts() {
    let load = Load {
        sizes: &[1],
        paths: 1,
        reads: false,
        zeroes: false,
        blocks: 256,
    };
    bounded(run(load, "4 KiB writes")).await;
}

#[needs("root")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mib_writes_lose_nothing_across_power_cuts() {
    let load = Load {
        sizes: &[256],
        paths: 1,
        reads: true,
        zeroes: false,
        blocks: 4096,
    };
    bounded(run(load, "1 MiB writes, one path")).await;
}

#[needs("root")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_sizes_reads_and_zeroes_over_two_paths_lose_nothing_across_power_cuts() {
    let load = Load {
        sizes: &[1, 2, 8, 16, 32, 64, 256],
        paths: 2,
        reads: true,
        zeroes: true,
        blocks: 4096,
    };
    bounded(run(load, "mixed sizes, two paths")).await;
}

async fn bounded(run: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(WHOLE_TEST, run)
        .await
        .expect("power-loss replay test bounded in time");
}

/// Through `braid attach` (two portals, so two paths), three cuts under
/// each shape; the attach process stays up across them all. The volume's
/// file is then cut once more keeping nothing dirty and read directly.
#[needs("root", "nbdsh")]
fn through_the_attach_socket_nothing_acknowledged_is_lost_across_power_cuts() {
    let shapes = [
        (
            "no FLUSH, four connections",
            attachload::Shape {
                conns: 4,
                sizes: attachload::WRITEBACK,
                flush_every: 0,
                fua: false,
            },
        ),
        (
            "FLUSH and FUA, two connections",
            attachload::Shape {
                conns: 2,
                sizes: attachload::WRITEBACK,
                flush_every: 8,
                fua: true,
            },
        ),
    ];
    let status = cuts_through_attach("through attach", &[], &shapes);
    assert!(
        status["replays"].as_u64() >= Some(6),
        "every restart was replayed: {status}"
    );
}

/// A client that never flushes and writes many times the replay window
/// between cuts (VMware's shape, with a window of 4 MiB so that 128 KiB to
/// 1 MiB writes over four connections fill it in milliseconds): braid
/// flushes on its own before the window fills, so every cut is replayed
/// whole and the volume is never lost. Before, the window let its oldest
/// writes go and a cut lost them: a read after the replay saw a torn
/// block older than the last write acknowledged.
#[needs("root", "nbdsh")]
fn a_client_that_never_flushes_loses_nothing_when_it_writes_past_the_window() {
    let shapes = [(
        "no FLUSH past the window, four connections",
        attachload::Shape {
            conns: 4,
            sizes: attachload::WRITEBACK,
            flush_every: 0,
            fua: false,
        },
    )];
    let status = cuts_through_attach("past the window", &["--replay-window", "4MiB"], &shapes);
    assert!(status["lost"].is_null(), "no loss: {status}");
    assert!(
        status["writeback_flushes"].as_u64() >= Some(3),
        "braid flushed on its own: {status}"
    );
}

/// Serves a volume on braid-powercut, attaches it (with `args`), runs each
/// shape with three cuts under it, then FLUSHes through the socket, cuts
/// once more keeping nothing dirty, and checks the file byte for byte.
/// Returns attach's status before that last FLUSH.
fn cuts_through_attach(
    name: &str,
    args: &[&str],
    shapes: &[(&str, attachload::Shape)],
) -> serde_json::Value {
    const VOLUME: u64 = 8192;
    let dir = tempfile::tempdir().expect("temporary dir");
    let at = dir.path().join("mnt");
    std::fs::create_dir(&at).expect("mount point");
    let pc =
        PowerCut::mount(&at, "disk.img", VOLUME * BLOCK as u64).expect("mounting braid-powercut");
    let (state, control) = (dir.path().join("state"), dir.path().join("ctl.sock"));
    let listens = [
        format!("--listen=127.0.0.1:{}", free_port()),
        format!("--listen=127.0.0.2:{}", free_port()),
    ];
    let start = || crashkit::start(pc.file(), &state, &control, &[&listens[0], &listens[1]]);
    let seed = crashkit::seed(name);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut serve = start();
    // Long enough to ride out every restart: no request may fail.
    let mut attach_args = vec!["--no-path-timeout", "60"];
    attach_args.extend_from_slice(args);
    let attach = labkit::Attach::start(None, &serve.uri("vol"), "vol", &attach_args);
    let mut acked = attachload::Acked::new();
    let mut lost = 0;
    for (n, (shape_name, shape)) in shapes.iter().enumerate() {
        let base = (n as u64) << 32;
        let load = attachload::Load::start(&attach.uri(), VOLUME, shape, rng.gen(), &acked, base);
        for cut in 1..=3 {
            std::thread::sleep(Duration::from_millis(rng.gen_range(300..700)));
            let c = power_cut(&mut serve, &pc, 0.5, rng.gen());
            eprintln!(
                "{shape_name}, cut {cut}: {} dirty sectors lost, {} kept",
                c.lost, c.kept
            );
            lost += c.lost;
            drop(serve);
            serve = start();
        }
        // Some load on the last server too, past its replay.
        std::thread::sleep(Duration::from_millis(500));
        acked.extend(load.finish());
    }
    assert!(lost > 0, "no cut dropped anything: nothing to replay");
    let status = attach.status();
    let script = format!(
        "h.connect_uri({:?})\nh.flush()\nh.shutdown()\n",
        attach.uri()
    );
    let flushed = common::output(cmd("nbdsh").args(["-c", &script]), common::TOOL_TIMEOUT);
    assert!(
        flushed.status.success(),
        "{name}: the last FLUSH failed: {}\nattach's status: {status}\n{}",
        String::from_utf8_lossy(&flushed.stderr),
        attach.log()
    );
    let cut = power_cut(&mut serve, &pc, 0.0, 0);
    eprintln!("last cut: {} dirty sectors lost", cut.lost);
    attachload::check(&pc.file().display().to_string(), &acked, VOLUME);
    status
}

/// The last version of each block acknowledged (0: zeroes).
type Acked = Arc<Mutex<HashMap<u64, u64>>>;

async fn run(load: Load, name: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().expect("temporary dir");
    let at = dir.path().join("mnt");
    std::fs::create_dir(&at).expect("mount point");
    let pc = PowerCut::mount(&at, "disk.img", load.blocks * BLOCK as u64)
        .expect("mounting braid-powercut");
    let state = dir.path().join("state");
    let control = dir.path().join("ctl.sock");
    let listens: Vec<String> = (0..load.paths)
        .map(|i| format!("--listen=127.0.0.{}:{}", i + 1, free_port()))
        .collect();
    let start = || {
        let extra: Vec<&str> = listens.iter().map(String::as_str).collect();
        crashkit::start(pc.file(), &state, &control, &extra)
    };
    let seed = crashkit::seed(name);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    let mut serve = start();
    // Long enough to ride out every restart: no request may fail.
    let vol = crashkit::open(&serve, Duration::from_secs(30)).await;
    assert_eq!(vol.report().paths.len(), load.paths, "a path per portal");
    let acked: Acked = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let load = Arc::new(load);
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..WORKERS {
        let (vol, acked, stop, load) = (vol.clone(), acked.clone(), stop.clone(), load.clone());
        let wseed = rng.gen();
        tasks.spawn(async move { work(&vol, &load, worker, wseed, &acked, &stop).await });
    }
    {
        let (vol, stop) = (vol.clone(), stop.clone());
        tasks.spawn(async move {
            while !stop.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(40)).await;
                bounded_io("FLUSH", vol.flush()).await?;
            }
            Ok(())
        });
    }

    let mut lost = 0;
    for n in 1..=CUTS {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(150..500))).await;
        let cut = tokio::task::block_in_place(|| power_cut(&mut serve, &pc, 0.5, rng.gen()));
        eprintln!(
            "cut {n}: {} dirty sectors lost, {} kept",
            cut.lost, cut.kept
        );
        lost += cut.lost;
        drop(serve);
        serve = tokio::task::block_in_place(start);
    }
    stop.store(true, Ordering::Release);
    while let Some(joined) = tasks.join_next().await {
        if let Err(e) = joined.expect("workload task") {
            panic!("{e}; the server's log since the last cut:\n{}", serve.log());
        }
    }
    assert!(lost > 0, "no cut dropped anything: nothing to replay");
    bounded_io("final FLUSH", vol.flush())
        .await
        .expect("final FLUSH");
    let replay = vol.report().replay;
    tokio::time::timeout(WAIT, vol.close())
        .await
        .expect("close");
    drop(vol);

    // Only what is durable counts now: a last cut keeps nothing dirty.
    let cut = tokio::task::block_in_place(|| power_cut(&mut serve, &pc, 0.0, 0));
    drop(serve);
    let serve = tokio::task::block_in_place(start);
    let vol = crashkit::open(&serve, Duration::ZERO).await;
    let acked = acked.lock().unwrap().clone();
    let mut wrong = Vec::new();
    let chunk = 256u64;
    for first in (0..load.blocks).step_by(chunk as usize) {
        let data = read(&vol, first, chunk).await.expect("reading back");
        for (i, b) in (first..first + chunk).enumerate() {
            let want = acked.get(&b).copied().unwrap_or(0);
            if let Some(got) = block_version(b, &data[i * BLOCK..(i + 1) * BLOCK]) {
                if got != want {
                    wrong.push(format!("block {b}: v{got}, want v{want}"));
                }
            } else {
                wrong.push(format!("block {b}: torn or foreign, want v{want}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{name}: {} blocks are not the last acknowledged write (the last cut dropped {} dirty \
         sectors; replay {:?}):\n  {}",
        wrong.len(),
        cut.lost,
        replay,
        wrong[..wrong.len().min(40)].join("\n  ")
    );
    assert!(
        replay.replays >= CUTS as u64,
        "{name}: every restart was replayed: {replay:?}"
    );
    tokio::time::timeout(WAIT, vol.close())
        .await
        .expect("close");
}

/// One worker: writes, zeroes and reads of its own region, one at a time;
/// a read must see exactly what the worker last had acknowledged.
async fn work(
    vol: &Volume,
    load: &Load,
    worker: u64,
    seed: u64,
    acked: &Acked,
    stop: &AtomicBool,
) -> Result<(), String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let region = load.blocks / WORKERS;
    let base = worker * region;
    let mut mine: HashMap<u64, u64> = HashMap::new();
    let mut version = 0u64;
    while !stop.load(Ordering::Acquire) {
        let n = load.sizes[rng.gen_range(0..load.sizes.len())].min(region);
        let first = base + rng.gen_range(0..=region - n) / n * n;
        let blocks = first..first + n;
        match rng.gen_range(0..40) {
            0..=7 if load.reads => {
                let data = read(vol, first, n).await?;
                for (i, b) in blocks.enumerate() {
                    let want = mine.get(&b).copied().unwrap_or(0);
                    let got = block_version(b, &data[i * BLOCK..(i + 1) * BLOCK]);
                    if got != Some(want) {
                        return Err(format!(
                            "worker {worker}: a read of block {b} saw {got:?}, the last write \
                             acknowledged was v{want}"
                        ));
                    }
                }
            }
            8..=12 if load.zeroes => {
                let len = n * BLOCK as u64;
                bounded_io(
                    "WRITE_ZEROES",
                    vol.write_zeroes(first * BLOCK as u64, len, false),
                )
                .await?;
                record(&mut mine, acked, blocks, 0);
            }
            k => {
                version += 1;
                let v = version * WORKERS + worker;
                let mut data = BytesMut::with_capacity(n as usize * BLOCK);
                for b in blocks.clone() {
                    data.extend_from_slice(&block_data(b, v));
                }
                let fua = k == 39;
                bounded_io("write", vol.write(first * BLOCK as u64, data.freeze(), fua))
                    .await
                    .map_err(|e| format!("{e} (blocks {first}+{n}, v{v})"))?;
                record(&mut mine, acked, blocks, v);
            }
        }
    }
    Ok(())
}

fn record(mine: &mut HashMap<u64, u64>, acked: &Acked, blocks: std::ops::Range<u64>, v: u64) {
    let mut all = acked.lock().unwrap();
    for b in blocks {
        mine.insert(b, v);
        all.insert(b, v);
    }
}

/// `n` blocks from `first`, contiguous.
async fn read(vol: &Volume, first: u64, n: u64) -> Result<Bytes, String> {
    let len = n * BLOCK as u64;
    let pieces = bounded_io("read", vol.read(first * BLOCK as u64, len)).await?;
    let mut out = vec![0u8; len as usize];
    for (offset, bytes) in pieces {
        out[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes);
    }
    Ok(Bytes::from(out))
}

/// The version a block holds, if all its sectors agree.
fn block_version(block: u64, data: &[u8]) -> Option<u64> {
    let mut seen = None;
    for (s, sector) in data.chunks(SECTOR).enumerate() {
        let v = decode_sector(block, s, sector)?;
        if seen.is_some_and(|x| x != v) {
            return None;
        }
        seen = Some(v);
    }
    seen
}

async fn bounded_io<T, E: std::fmt::Display>(
    what: &str,
    io: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    tokio::time::timeout(WAIT * 4, io)
        .await
        .map_err(|_| format!("{what} did not end"))?
        .map_err(|e| format!("{what} failed: {e}"))
}
