//! The verified write workload shared by the crash tests: workers write
//! versioned 4 KiB blocks with some FUA, a flusher sends FLUSHes, the
//! server is crashed (how is the caller's choice), and every restart reads
//! the whole volume back and judges each sector against what the NBD spec
//! says must have survived. `crash_consistency.rs` explains the rules.

// Each test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use braid_initiator::{NbdUri, Volume, VolumeConfig};
use bytes::Bytes;
use rand::{Rng, SeedableRng};

use crate::common::Serve;

pub const SECTOR: usize = 512;
pub const BLOCK: usize = 4096;
const SECTORS: usize = BLOCK / SECTOR;
/// A small volume, so blocks are overwritten many times between crashes.
pub const BLOCKS: u64 = 256;
/// Workers, each owning the blocks `b % WORKERS == worker`.
const WORKERS: u64 = 8;
/// One write in this many carries FUA.
const FUA_ONE_IN: u32 = 8;
/// Pause between FLUSHes.
const FLUSH_EVERY: Duration = Duration::from_millis(15);
/// The crash lands this long after the workload starts: random, bounded.
const CRASH_AFTER_MS: std::ops::Range<u64> = 60..400;
/// Bound on any single wait: an I/O, opening a volume, a process exiting.
pub const WAIT: Duration = Duration::from_secs(10);

/// The seed of a run: `BRAID_CRASH_SEED` repeats one.
pub fn seed(test: &str) -> u64 {
    let seed: u64 = std::env::var("BRAID_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test}: seed {seed} (BRAID_CRASH_SEED={seed} repeats the choices)");
    seed
}

/// Starts the server on `file`: the same state dir and control socket
/// every time, so it is the same volume.
pub fn start(file: &Path, state: &Path, control: &Path, extra: &[&str]) -> Serve {
    let mut args: Vec<String> = vec![
        format!("--state-dir={}", state.display()),
        // A crashed server leaves its control socket behind; keep it here.
        format!("--control={}", control.display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push(format!("vol={}", file.display()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Serve::start blocks (bounded) until braid logs its portal and export.
    tokio::task::block_in_place(|| Serve::start(&args))
}

/// Opens the volume through the multipath initiator. `no_path_timeout`
/// zero fails I/O at once when the server is gone.
pub async fn open(serve: &Serve, no_path_timeout: Duration) -> Arc<Volume> {
    let uri: NbdUri = serve.uri("vol").parse().expect("NBD URI");
    let mut cfg = VolumeConfig::new(uri);
    cfg.no_path_timeout = Some(no_path_timeout);
    // Two connections: a FLUSH on one must cover writes acknowledged on the
    // other (the target offers CAN_MULTI_CONN).
    cfg.connections_per_path = Some(2);
    cfg.connect_timeout = Duration::from_secs(5);
    let vol = tokio::time::timeout(WAIT, Volume::open(cfg))
        .await
        .expect("opening the volume is bounded")
        .unwrap_or_else(|e| panic!("opening {}: {e}; log:\n{}", serve.uri("vol"), serve.log()));
    Arc::new(vol)
}

/// Waits (bounded) until a killed server has exited.
pub fn wait_dead(serve: &mut Serve) {
    let deadline = Instant::now() + WAIT;
    while serve.alive() {
        assert!(Instant::now() < deadline, "braid serve outlived SIGKILL");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The host dies: the server stops on the spot (SIGSTOP: nothing more
/// reaches the disk or the wire), the power goes keeping each dirty sector
/// with probability `keep`, then the process is gone and power is back.
pub fn power_cut(
    serve: &mut Serve,
    pc: &braid_powercut::PowerCut,
    keep: f64,
    seed: u64,
) -> braid_powercut::Cut {
    crate::common::stop(serve.pid());
    let cut = pc.power_off(keep, seed);
    crate::common::signal(serve.pid(), libc::SIGKILL);
    wait_dead(serve);
    pc.power_on();
    cut
}

/// What a whole run saw.
pub struct Report {
    pub totals: Totals,
    pub checks: Checks,
    pub elapsed: Duration,
}

/// Runs `crashes` lifetimes of the server on `file`: each starts the
/// server, checks the volume, runs the workload and calls `crash` at a
/// random moment; `crash` must leave the server dead and say what it did.
/// A last start checks what the last crash left.
pub async fn cycles(
    file: &Path,
    crashes: usize,
    seed: u64,
    mut crash: impl FnMut(&mut Serve, &mut rand::rngs::StdRng) -> String,
) -> Report {
    let dir = tempfile::tempdir().expect("temporary dir");
    let state = dir.path().join("state");
    let control = dir.path().join("ctl.sock");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut model = Model::new();
    let mut checks = Checks::default();
    let started = Instant::now();

    for n in 1..=crashes {
        let mut serve = start(file, &state, &control, &[]);
        let vol = open(&serve, Duration::ZERO).await;
        let when = match n {
            1 => "on the fresh file".to_owned(),
            k => format!("after crash {}", k - 1),
        };
        checks.add(verify(&vol, &model, &when).await);

        let epoch = Arc::new(Epoch::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..WORKERS {
            let next = model.next_versions(worker);
            let (vol, epoch, stop) = (vol.clone(), epoch.clone(), stop.clone());
            let wseed = rng.gen();
            tasks.spawn(write_loop(vol, epoch, stop, worker, next, wseed));
        }
        {
            let (vol, epoch, stop) = (vol.clone(), epoch.clone(), stop.clone());
            tasks.spawn(flush_loop(vol, epoch, stop));
        }

        let delay = Duration::from_millis(rng.gen_range(CRASH_AFTER_MS));
        tokio::time::sleep(delay).await;
        let what = tokio::task::block_in_place(|| crash(&mut serve, &mut rng));
        // With no_path_timeout zero every I/O fails as soon as the server
        // is gone; `stop` ends loops that happen to be between I/Os.
        stop.store(true, Ordering::Release);
        while let Some(joined) = tokio::time::timeout(WAIT, tasks.join_next())
            .await
            .expect("workload stops within the bound after the crash")
        {
            joined.expect("workload task");
        }
        tokio::time::timeout(WAIT, vol.close())
            .await
            .expect("closing the volume is bounded");
        drop(vol);

        let summary = model.absorb(&epoch);
        eprintln!("crash {n} after {delay:?} ({what}): {summary}");
        drop(serve);
    }

    let serve = start(file, &state, &control, &[]);
    let vol = open(&serve, Duration::ZERO).await;
    checks.add(verify(&vol, &model, &format!("after crash {crashes}")).await);
    tokio::time::timeout(WAIT, vol.close())
        .await
        .expect("closing the volume is bounded");
    let report = Report {
        totals: model.totals,
        checks,
        elapsed: started.elapsed(),
    };
    let (t, c) = (&report.totals, &report.checks);
    eprintln!(
        "{crashes} crashes in {:?}; {} writes acknowledged ({} FUA), {} flushes \
         acknowledged; of {} block checks, {} allowed only the durable version, {} found a \
         version newer than the durable one, {} had lost an acknowledged write no FLUSH or \
         FUA covered (allowed), {} were torn",
        report.elapsed, t.acked, t.fua, t.flushes, c.blocks, c.pinned, c.later, c.lost, c.torn
    );
    // Not per lifetime: under load a crash may land before anything was
    // acknowledged, which is a fair crash too.
    assert!(
        t.acked > 0 && t.flushes > 0 && t.fua > 0,
        "the workload must get writes, FUA writes and FLUSHes acknowledged"
    );
    report
}

/// One server lifetime's record, shared by its workload tasks.
#[derive(Default)]
struct Epoch {
    /// Bumped as each write's acknowledgement arrives.
    acks: AtomicU64,
    /// The highest `acks` value read just before sending a FLUSH that was
    /// then acknowledged: every write acknowledged at or below it is
    /// stable.
    flushed: AtomicU64,
    flushes: AtomicU64,
    writes: Mutex<Vec<WriteRecord>>,
}

/// One write as the workload saw it.
struct WriteRecord {
    block: u64,
    version: u64,
    fua: bool,
    /// The `acks` number its acknowledgement got; `None` if it failed (the
    /// server was killed while it was in flight).
    ack: Option<u64>,
}

/// What is known about each block across every server lifetime.
struct Model {
    blocks: Vec<BlockHistory>,
    totals: Totals,
}

#[derive(Default, Clone)]
struct BlockHistory {
    /// Every version ever sent, ascending (see the module docs for why).
    sent: Vec<u64>,
    /// The newest version the spec guarantees survived; 0 for the zeroes of
    /// the fresh file.
    durable: u64,
    /// The newest version acknowledged at all.
    acked: u64,
}

#[derive(Default, Clone, Copy)]
pub struct Totals {
    pub acked: u64,
    pub fua: u64,
    pub flushes: usize,
}

/// What the read-backs found, summed over every restart.
#[derive(Default)]
pub struct Checks {
    pub blocks: usize,
    /// Blocks whose newest version sent was durable: only it was allowed.
    pub pinned: usize,
    /// Blocks that held a version newer than the durable one (allowed).
    pub later: usize,
    /// Blocks older than their newest acknowledged version: allowed when
    /// that version was not durable, and not expected from a SIGKILL.
    pub lost: usize,
    /// Blocks whose sectors held different allowed versions.
    pub torn: usize,
}

impl Checks {
    fn add(&mut self, other: Checks) {
        self.blocks += other.blocks;
        self.pinned += other.pinned;
        self.later += other.later;
        self.lost += other.lost;
        self.torn += other.torn;
    }
}

#[derive(Default)]
struct EpochSummary {
    sent: usize,
    acked: u64,
    fua: u64,
    flushes: u64,
    made_durable: usize,
}

impl std::fmt::Display for EpochSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} writes sent, {} acknowledged ({} FUA), {} flushes acknowledged, {} writes \
             known durable",
            self.sent, self.acked, self.fua, self.flushes, self.made_durable
        )
    }
}

impl Model {
    fn new() -> Self {
        Self {
            blocks: vec![BlockHistory::default(); BLOCKS as usize],
            totals: Totals::default(),
        }
    }

    /// The next version of each block `worker` owns.
    fn next_versions(&self, worker: u64) -> HashMap<u64, u64> {
        (worker..BLOCKS)
            .step_by(WORKERS as usize)
            .map(|b| {
                let last = self.blocks[b as usize].sent.last().copied().unwrap_or(0);
                (b, last + 1)
            })
            .collect()
    }

    /// Takes in a finished lifetime: what was sent, and what became
    /// durable by FUA or by a FLUSH acknowledged in the same lifetime.
    fn absorb(&mut self, epoch: &Epoch) -> EpochSummary {
        let flushed = epoch.flushed.load(Ordering::Acquire);
        let writes = epoch.writes.lock().expect("write log");
        let mut s = EpochSummary {
            sent: writes.len(),
            flushes: epoch.flushes.load(Ordering::Acquire),
            ..EpochSummary::default()
        };
        for w in writes.iter() {
            let b = &mut self.blocks[w.block as usize];
            debug_assert!(b.sent.last().is_none_or(|&v| v < w.version));
            b.sent.push(w.version);
            let Some(ack) = w.ack else { continue };
            b.acked = w.version;
            s.acked += 1;
            s.fua += u64::from(w.fua);
            if (w.fua || ack <= flushed) && w.version > b.durable {
                b.durable = w.version;
                s.made_durable += 1;
            }
        }
        self.totals.acked += s.acked;
        self.totals.fua += s.fua;
        self.totals.flushes += s.flushes as usize;
        s
    }
}

/// Writes random blocks of `worker`'s share until an I/O fails or `stop`.
async fn write_loop(
    vol: Arc<Volume>,
    epoch: Arc<Epoch>,
    stop: Arc<AtomicBool>,
    worker: u64,
    mut next: HashMap<u64, u64>,
    seed: u64,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let owned: Vec<u64> = (worker..BLOCKS).step_by(WORKERS as usize).collect();
    while !stop.load(Ordering::Acquire) {
        let block = owned[rng.gen_range(0..owned.len())];
        let version = next[&block];
        next.insert(block, version + 1);
        let fua = rng.gen_ratio(1, FUA_ONE_IN);
        let data = block_data(block, version);
        let result = tokio::time::timeout(WAIT, vol.write(block * BLOCK as u64, data, fua))
            .await
            .unwrap_or_else(|_| panic!("write of block {block} did not end within {WAIT:?}"));
        // Numbered on arrival, before anything else can read the counter.
        let ack = result
            .is_ok()
            .then(|| epoch.acks.fetch_add(1, Ordering::AcqRel) + 1);
        epoch.writes.lock().expect("write log").push(WriteRecord {
            block,
            version,
            fua,
            ack,
        });
        if ack.is_none() {
            return;
        }
    }
}

/// Sends a FLUSH every [`FLUSH_EVERY`] until one fails or `stop`.
async fn flush_loop(vol: Arc<Volume>, epoch: Arc<Epoch>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        tokio::time::sleep(FLUSH_EVERY).await;
        let covered = epoch.acks.load(Ordering::Acquire);
        let result = tokio::time::timeout(WAIT, vol.flush())
            .await
            .unwrap_or_else(|_| panic!("FLUSH did not end within {WAIT:?}"));
        if result.is_err() {
            return;
        }
        epoch.flushed.fetch_max(covered, Ordering::AcqRel);
        epoch.flushes.fetch_add(1, Ordering::AcqRel);
    }
}

/// The whole volume's bytes.
pub async fn read_disk(vol: &Volume, when: &str) -> Vec<u8> {
    let len = BLOCKS * BLOCK as u64;
    let mut disk = vec![0u8; len as usize];
    let chunk = 64 * 1024;
    for start in (0..len).step_by(chunk) {
        let pieces = tokio::time::timeout(WAIT, vol.read(start, chunk as u64))
            .await
            .expect("read bounded in time")
            .unwrap_or_else(|e| panic!("{when}: reading {start}+{chunk}: {e}"));
        // Piece offsets are within the request.
        for (offset, bytes) in pieces {
            let at = (start + offset) as usize;
            disk[at..at + bytes.len()].copy_from_slice(&bytes);
        }
    }
    disk
}

/// Reads the whole volume and checks every sector against the model.
/// Panics listing every violation; returns what it saw.
async fn verify(vol: &Volume, model: &Model, when: &str) -> Checks {
    let disk = read_disk(vol, when).await;
    let mut failures = Vec::new();
    let mut checks = Checks::default();
    for (b, history) in model.blocks.iter().enumerate() {
        let b = b as u64;
        checks.blocks += 1;
        if history.sent.last().copied().unwrap_or(0) == history.durable {
            checks.pinned += 1;
        }
        let mut seen = Vec::new();
        for s in 0..SECTORS {
            let at = b as usize * BLOCK + s * SECTOR;
            let sector = &disk[at..at + SECTOR];
            match decode_sector(b, s, sector) {
                None => failures.push(format!(
                    "block {b} sector {s}: bytes from no write of this block \
                     (first 24: {:02x?}); durable v{}, sent {:?}",
                    &sector[..24],
                    history.durable,
                    tail(&history.sent)
                )),
                Some(v) if v < history.durable => failures.push(format!(
                    "block {b} sector {s}: v{v}, older than v{} which was acknowledged as \
                     durable (FUA or covered by an acknowledged FLUSH); sent {:?}",
                    history.durable,
                    tail(&history.sent)
                )),
                Some(v) if v != 0 && history.sent.binary_search(&v).is_err() => {
                    failures.push(format!("block {b} sector {s}: v{v} was never sent"))
                }
                Some(v) => seen.push(v),
            }
        }
        seen.dedup();
        if seen.len() > 1 {
            checks.torn += 1;
        }
        if seen.iter().any(|&v| v > history.durable) {
            checks.later += 1;
        }
        if seen.iter().any(|&v| v < history.acked) {
            checks.lost += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{when}: {} sectors hold what the spec says cannot be there:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
    checks
}

pub fn tail(v: &[u64]) -> &[u64] {
    &v[v.len().saturating_sub(6)..]
}

/// The 512 bytes of `sector` of `block` at `version`: its three numbers,
/// then bytes that differ with each of them.
pub fn sector_bytes(block: u64, sector: usize, version: u64, out: &mut [u8]) {
    out[0..8].copy_from_slice(&block.to_le_bytes());
    out[8..16].copy_from_slice(&version.to_le_bytes());
    out[16..24].copy_from_slice(&(sector as u64).to_le_bytes());
    let mut x = block.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ version.wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
        ^ (sector as u64).wrapping_mul(0x1656_67b1_9e37_79f9)
        | 1;
    for word in out[24..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
    }
}

pub fn block_data(block: u64, version: u64) -> Bytes {
    let mut data = vec![0u8; BLOCK];
    for (s, sector) in data.chunks_mut(SECTOR).enumerate() {
        sector_bytes(block, s, version, sector);
    }
    Bytes::from(data)
}

/// The version a sector holds: 0 for zeroes, `None` for anything that is
/// not exactly what some version of this block wrote there.
pub fn decode_sector(block: u64, sector: usize, bytes: &[u8]) -> Option<u64> {
    if bytes.iter().all(|&b| b == 0) {
        return Some(0);
    }
    let version = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let mut want = [0u8; SECTOR];
    sector_bytes(block, sector, version, &mut want);
    (version != 0 && want[..] == *bytes).then_some(version)
}
