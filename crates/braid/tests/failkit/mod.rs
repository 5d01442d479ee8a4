//! Failover scenarios on the lab: a verified write-then-read workload over
//! the multipath volume while paths are cut and restored, with every
//! operation's start, end and outcome recorded so the time to fail over
//! and to fail back can be measured, not guessed. Shared by the failover
//! tests and by `bench/failover`.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use braid_initiator::{Volume, VolumeConfig, VolumeUri};
use bytes::Bytes;

/// One I/O as the workload saw it, times relative to the run's start.
#[derive(Clone, Debug)]
pub struct OpRecord {
    pub start: Duration,
    pub end: Duration,
    pub ok: bool,
}

/// A sample of one path's figures.
#[derive(Clone, Debug)]
pub struct Sample {
    pub at: Duration,
    /// Bytes each path has moved so far, by path index.
    pub bytes: Vec<u64>,
    pub states: Vec<&'static str>,
}

/// What a run saw.
#[derive(Debug, Default)]
pub struct RunLog {
    pub ops: Vec<OpRecord>,
    pub errors: Vec<String>,
    pub mismatches: Vec<String>,
    pub samples: Vec<Sample>,
    /// Per block: the last version acknowledged, and the versions written
    /// after it that failed (any of which may or may not have landed).
    pub acked: HashMap<u64, (u64, Vec<u64>)>,
}

impl RunLog {
    /// Time from `cut` until every operation in flight at `cut` had ended:
    /// how long I/O on the failed path waited before it completed elsewhere.
    pub fn failover_time(&self, cut: Duration) -> Option<Duration> {
        self.ops
            .iter()
            .filter(|o| o.start <= cut && o.end > cut)
            .map(|o| o.end - cut)
            .max()
    }

    /// Time from `restore` until path `index` (1-based) moved data again.
    pub fn failback_time(&self, index: usize, restore: Duration) -> Option<Duration> {
        let at_restore = self
            .samples
            .iter()
            .rev()
            .find(|s| s.at <= restore)?
            .bytes
            .get(index - 1)
            .copied()?;
        self.samples
            .iter()
            .find(|s| s.at > restore && s.bytes.get(index - 1).copied().unwrap_or(0) > at_restore)
            .map(|s| s.at - restore)
    }

    /// Longest stretch with no operation completing, within `[from, to]`.
    pub fn longest_stall(&self, from: Duration, to: Duration) -> Duration {
        let mut ends: Vec<Duration> = self
            .ops
            .iter()
            .map(|o| o.end)
            .filter(|e| *e >= from && *e <= to)
            .collect();
        ends.sort();
        let mut last = from;
        let mut worst = Duration::ZERO;
        for e in ends {
            worst = worst.max(e - last);
            last = e;
        }
        worst.max(to.saturating_sub(last))
    }
}

/// Data of `block` at `version`: every 8 bytes differ with both.
pub fn block_data(block: u64, version: u64, bs: usize) -> Bytes {
    let mut v = Vec::with_capacity(bs);
    let mut x = (block.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        ^ version.wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
        | 1;
    while v.len() < bs {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = (bs - v.len()).min(8);
        v.extend_from_slice(&x.to_le_bytes()[..n]);
    }
    Bytes::from(v)
}

/// Asserts that `data` (a volume's bytes, read some other way) holds at
/// each block of `acked` the version acknowledged last; `whence` says
/// where `data` was read.
pub fn assert_holds(data: &[u8], acked: &[(u64, u64)], bs: usize, whence: &str) {
    for &(block, version) in acked {
        let at = block as usize * bs;
        assert_eq!(
            &data[at..at + bs],
            &block_data(block, version, bs)[..],
            "block {block} {whence}"
        );
    }
}

/// How the workload runs.
#[derive(Clone, Debug)]
pub struct Workload {
    pub blocks: u64,
    pub bs: usize,
    pub depth: usize,
    pub duration: Duration,
}

/// Opens the volume at `uri` with `cfg_fn` applied to its configuration.
pub async fn open(uri: &str, cfg_fn: impl FnOnce(&mut VolumeConfig)) -> Arc<Volume> {
    let uri: VolumeUri = uri.parse().expect("uri");
    let mut cfg = VolumeConfig::new(uri);
    cfg_fn(&mut cfg);
    Arc::new(Volume::open(cfg).await.expect("open volume"))
}

/// Runs the write-then-read workload for `w.duration`, sampling the
/// volume's paths every 20 ms. `start` is the run's time zero.
pub async fn run(vol: Arc<Volume>, w: Workload, start: Instant) -> RunLog {
    let log = Arc::new(Mutex::new(RunLog::default()));
    let deadline = start + w.duration;
    let sampler = {
        let (vol, log) = (vol.clone(), log.clone());
        tokio::spawn(async move {
            while Instant::now() < deadline {
                let r = vol.report();
                let s = Sample {
                    at: start.elapsed(),
                    bytes: r
                        .paths
                        .iter()
                        .map(|p| p.figures.counters.read_bytes + p.figures.counters.written_bytes)
                        .collect(),
                    states: r.paths.iter().map(|p| p.figures.state.name()).collect(),
                };
                log.lock().unwrap().samples.push(s);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..w.depth {
        let (vol, log, w) = (vol.clone(), log.clone(), w.clone());
        workers.spawn(async move {
            let mut version = 0u64;
            let mut block = worker as u64;
            while Instant::now() < deadline {
                block = (block + w.depth as u64) % w.blocks.max(1);
                version += 1;
                let offset = block * w.bs as u64;
                let data = block_data(block, version, w.bs);
                let t0 = start.elapsed();
                let wr = vol.write(offset, data, false).await;
                let t1 = start.elapsed();
                let written = {
                    let mut l = log.lock().unwrap();
                    l.ops.push(OpRecord {
                        start: t0,
                        end: t1,
                        ok: wr.is_ok(),
                    });
                    match wr {
                        Ok(()) => {
                            l.acked.insert(block, (version, Vec::new()));
                            true
                        }
                        Err(e) => {
                            l.errors.push(format!("write block {block} at {t1:?}: {e}"));
                            l.acked
                                .entry(block)
                                .or_insert((0, Vec::new()))
                                .1
                                .push(version);
                            false
                        }
                    }
                };
                if !written {
                    continue;
                }
                let rd = vol.read(offset, w.bs as u64).await;
                let t2 = start.elapsed();
                let mut l = log.lock().unwrap();
                l.ops.push(OpRecord {
                    start: t1,
                    end: t2,
                    ok: rd.is_ok(),
                });
                match rd {
                    Ok(pieces) => {
                        let got: Vec<u8> =
                            pieces.iter().flat_map(|(_, b)| b.iter().copied()).collect();
                        if got[..] != block_data(block, version, w.bs)[..] {
                            l.mismatches.push(format!(
                                "block {block} version {version} read back wrong at {t2:?}"
                            ));
                        }
                    }
                    Err(e) => l.errors.push(format!("read block {block} at {t2:?}: {e}")),
                }
            }
        });
    }
    while workers.join_next().await.is_some() {}
    let _ = sampler.await;
    Arc::try_unwrap(log)
        .expect("tasks done")
        .into_inner()
        .unwrap()
}

/// The smallest unit a target writes whole.
const SECTOR: usize = 512;

/// Whether every sector of `got` is that sector of one of `versions`.
fn torn_between(got: &[u8], block: u64, versions: &[u64], bs: usize) -> bool {
    let datas: Vec<Bytes> = versions.iter().map(|v| block_data(block, *v, bs)).collect();
    got.len() == bs
        && got.chunks(SECTOR).enumerate().all(|(i, sector)| {
            let at = i * SECTOR..i * SECTOR + sector.len();
            datas.iter().any(|d| d[at.clone()] == *sector)
        })
}

/// Reads every acknowledged block back through `vol` and returns the
/// blocks that do not hold what was acknowledged (blocks whose later
/// writes failed may hold one of them, or, sector by sector, a mix).
pub async fn check_acknowledged(vol: &Volume, log: &RunLog, bs: usize) -> Vec<String> {
    let mut bad = Vec::new();
    for (&block, (version, failed)) in &log.acked {
        if *version == 0 {
            continue; // never acknowledged: nothing was promised
        }
        let got = vol
            .read(block * bs as u64, bs as u64)
            .await
            .expect("read back after restore");
        let got: Vec<u8> = got.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        let allowed: Vec<u64> = std::iter::once(*version)
            .chain(failed.iter().copied())
            .collect();
        if allowed
            .iter()
            .any(|v| got[..] == block_data(block, *v, bs)[..])
        {
            continue;
        }
        // A write that failed may have landed in part (some of its pieces
        // were written before the failure, as on any disk: SCSI and NBD
        // leave a failed write's range undefined), so each sector may
        // hold the acknowledged version or a failed one, never anything
        // else.
        if !failed.is_empty() && torn_between(&got, block, &allowed, bs) {
            continue;
        }
        // Which version it holds, if any this run wrote, says whether an
        // older write landed late or the acknowledged one never landed.
        let holds = (0..=version + 64)
            .find(|v| got[..] == block_data(block, *v, bs)[..])
            .map_or_else(
                || "data no write of this run made".to_owned(),
                |v| format!("version {v}"),
            );
        bad.push(format!(
            "block {block}: not version {version} as acknowledged, but {holds} (failed writes \
             to it: {failed:?})"
        ));
    }
    bad
}

/// A verified write load of [`BS`] blocks on the volume at `uri`
/// (opened with `cfg`) for `duration`, with `during` run 2 s in; every
/// acknowledged block is read back through the volume. Returns the run
/// and the versions acknowledged last.
pub fn under_load(
    uri: &str,
    cfg: impl FnOnce(&mut braid_initiator::VolumeConfig),
    depth: usize,
    duration: Duration,
    during: impl FnOnce(),
) -> (RunLog, Vec<(u64, u64)>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let out = rt.block_on(async {
        let vol = open(uri, cfg).await;
        let w = Workload {
            blocks: 128,
            bs: BS,
            depth,
            duration,
        };
        let load = tokio::spawn(run(vol.clone(), w, Instant::now()));
        tokio::time::sleep(Duration::from_secs(2)).await;
        tokio::task::block_in_place(during);
        let log = load.await.unwrap();
        let bad = check_acknowledged(&vol, &log, BS).await;
        assert!(bad.is_empty(), "{bad:?}");
        let acked: Vec<(u64, u64)> = log.acked.iter().map(|(b, (v, _))| (*b, *v)).collect();
        vol.close().await;
        (log, acked)
    });
    eprintln!("the load took {:?}", started.elapsed());
    out
}

pub const BS: usize = 64 * 1024;
