//! `braid bench URI`: a bounded workload over the multipath volume, with
//! MB/s, IOPS and latency percentiles overall and per path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use braid_initiator::engine::Histogram;
use braid_initiator::{Volume, VolumeReport};
use braid_store::source::{format_size, parse_size};
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::cli::{BenchArgs, UsageError, Workload};
use crate::multipath;
use crate::out::outln;
use crate::pattern::Pattern;
use crate::side::concat;

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// A checked bench run.
#[derive(Clone, Debug)]
pub struct Plan {
    pub rw: Workload,
    pub bs: u64,
    pub depth: usize,
    pub time: Duration,
    pub span: Option<u64>,
    pub read_pct: u8,
    pub verify: bool,
}

/// What a run measured.
#[derive(Debug)]
pub struct Outcome {
    pub secs: f64,
    pub bytes: u64,
    pub ops: u64,
    pub errors: u64,
    pub verify_errors: u64,
    pub first_error: Option<String>,
    pub latency: Histogram,
    pub before: VolumeReport,
    pub after: VolumeReport,
}

pub fn plan(args: &BenchArgs) -> Result<Plan> {
    let rw = args.rw;
    let bs = parse_size(&args.bs).map_err(|e| usage(format!("--bs {:?}: {e}", args.bs)))?;
    if bs == 0 || bs > 32 << 20 {
        return Err(usage("--bs must be between 1 byte and 32 MiB"));
    }
    if args.iodepth == 0 || args.iodepth > 4096 {
        return Err(usage("--iodepth must be between 1 and 4096"));
    }
    if !(args.time.is_finite() && args.time > 0.0 && args.time <= 86_400.0) {
        return Err(usage("--time must be between 0 and 86400 seconds"));
    }
    if args.rwmixread > 100 {
        return Err(usage("--rwmixread is a percentage: 0 to 100"));
    }
    let span = args
        .size
        .as_deref()
        .map(|s| parse_size(s).map_err(|e| usage(format!("--size {s:?}: {e}"))))
        .transpose()?;
    Ok(Plan {
        rw,
        bs,
        depth: args.iodepth,
        time: Duration::from_secs_f64(args.time),
        span,
        read_pct: args.rwmixread,
        verify: args.verify,
    })
}

pub fn run(args: BenchArgs) -> Result<()> {
    let p = plan(&args)?;
    let cfg = multipath::config(&args.uri, &args.multipath)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let vol = Arc::new(multipath::open(cfg).await?);
        let out = execute(&vol, &p).await;
        vol.close().await;
        let out = out?;
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&to_json(&p, &out))?);
        } else {
            print_text(&p, &out);
        }
        if out.verify_errors > 0 {
            bail!(
                "{} reads did not return the data written; first: {}",
                out.verify_errors,
                out.first_error.unwrap_or_default()
            );
        }
        Ok(())
    })
}

/// Runs the workload on an open volume (shared with `braid demo`).
pub async fn execute(vol: &Arc<Volume>, p: &Plan) -> Result<Outcome> {
    let size = vol.info().size;
    let span = p.span.unwrap_or(size).min(size) / p.bs * p.bs;
    if span < p.bs {
        bail!(
            "the span ({}) is smaller than one block of {}",
            format_size(span),
            format_size(p.bs)
        );
    }
    let blocks = span / p.bs;
    let seed: u64 = rand::random();
    let pattern = Pattern::new(seed, p.bs as usize);
    let reads_only = matches!(p.rw, Workload::Read | Workload::RandRead);
    if p.verify && reads_only {
        fill(vol, &pattern, blocks, p.bs, p.depth).await?;
    }
    let before = vol.report();
    let shared = Arc::new(Run {
        next: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        ops: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        verify_errors: AtomicU64::new(0),
        first_error: Mutex::new(None),
        latency: Mutex::new(Histogram::default()),
    });
    let start = Instant::now();
    let deadline = start + p.time;
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..p.depth {
        let (vol, shared, pattern, p) = (vol.clone(), shared.clone(), pattern.clone(), p.clone());
        workers.spawn(worker(
            w, vol, shared, pattern, p, blocks, deadline, reads_only,
        ));
    }
    while let Some(r) = workers.join_next().await {
        r?;
    }
    let secs = start.elapsed().as_secs_f64();
    let after = vol.report();
    let run = Arc::try_unwrap(shared).ok().expect("workers are done");
    Ok(Outcome {
        secs,
        bytes: run.bytes.into_inner(),
        ops: run.ops.into_inner(),
        errors: run.errors.into_inner(),
        verify_errors: run.verify_errors.into_inner(),
        first_error: run
            .first_error
            .into_inner()
            .unwrap_or_else(|p| p.into_inner()),
        latency: run.latency.into_inner().unwrap_or_else(|p| p.into_inner()),
        before,
        after,
    })
}

struct Run {
    next: AtomicU64,
    bytes: AtomicU64,
    ops: AtomicU64,
    errors: AtomicU64,
    verify_errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    latency: Mutex<Histogram>,
}

impl Run {
    fn note(&self, msg: String) {
        let mut f = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        f.get_or_insert(msg);
    }
}

#[allow(clippy::too_many_arguments)]
async fn worker(
    w: usize,
    vol: Arc<Volume>,
    run: Arc<Run>,
    pattern: Pattern,
    p: Plan,
    blocks: u64,
    deadline: Instant,
    prefilled: bool,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64 ^ rand::random::<u64>());
    let mut hist = Histogram::default();
    // Random workers own the blocks b ≡ w (mod depth), so no two requests
    // touch one block at once and every read knows what it should see.
    let stripe = (p.depth as u64).min(blocks).max(1);
    let own = w as u64 % stripe;
    let owned = (blocks - own).div_ceil(stripe);
    let mut written = std::collections::HashSet::new();
    let fixed = pattern.block(0, p.bs as usize);
    while Instant::now() < deadline {
        let block = if p.rw.random() {
            own + rng.gen_range(0..owned) * stripe
        } else {
            run.next.fetch_add(1, Ordering::Relaxed) % blocks
        };
        let is_read = match p.rw {
            Workload::Read | Workload::RandRead => true,
            Workload::Write | Workload::RandWrite => false,
            Workload::RandRw => rng.gen_range(0..100) < u32::from(p.read_pct),
        };
        let offset = block * p.bs;
        let t = Instant::now();
        let result = if is_read {
            vol.read(offset, p.bs).await.map(|pieces| {
                let check = p.verify && (prefilled || written.contains(&block));
                if check {
                    let data = concat(pieces, p.bs as usize);
                    if let Err(e) = pattern.check(offset, &data) {
                        run.verify_errors.fetch_add(1, Ordering::Relaxed);
                        run.note(e);
                    }
                }
            })
        } else {
            // Without --verify one block serves every write: building a
            // fresh one costs a copy per write, which shows at line rate.
            let data = if p.verify {
                pattern.block(offset, p.bs as usize)
            } else {
                fixed.clone()
            };
            let r = vol.write(offset, data, false).await;
            if r.is_ok() {
                written.insert(block);
            }
            r
        };
        hist.record(t.elapsed());
        match result {
            Ok(()) => {
                run.bytes.fetch_add(p.bs, Ordering::Relaxed);
                run.ops.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                run.errors.fetch_add(1, Ordering::Relaxed);
                run.note(format!(
                    "{} at {offset}: {e}",
                    if is_read { "read" } else { "write" }
                ));
            }
        }
    }
    run.latency
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .merge(&hist);
}

/// Writes the pattern over the span, so reads can be checked.
async fn fill(
    vol: &Arc<Volume>,
    pattern: &Pattern,
    blocks: u64,
    bs: u64,
    depth: usize,
) -> Result<()> {
    let mut jobs = tokio::task::JoinSet::new();
    for b in 0..blocks {
        while jobs.len() >= depth.max(4) {
            if let Some(r) = jobs.join_next().await {
                r??;
            }
        }
        let (vol, data) = (vol.clone(), pattern.block(b * bs, bs as usize));
        jobs.spawn(async move { vol.write(b * bs, data, false).await });
    }
    while let Some(r) = jobs.join_next().await {
        r??;
    }
    Ok(())
}

/// Per path over the run: (index, local, portal, bytes, chunks).
type PathDelta = (usize, String, String, u64, u64);

fn path_deltas(o: &Outcome) -> Vec<PathDelta> {
    o.after
        .paths
        .iter()
        .map(|a| {
            let b = o.before.paths.iter().find(|b| b.index == a.index);
            let c = |p: &braid_initiator::PathFigures| {
                let k = &p.figures.counters;
                (k.read_bytes + k.written_bytes, k.reads + k.writes)
            };
            let (ab, ao) = c(a);
            let (bb, bo) = b.map(c).unwrap_or((0, 0));
            (a.index, a.local.clone(), a.portal.clone(), ab - bb, ao - bo)
        })
        .collect()
}

pub fn to_json(p: &Plan, o: &Outcome) -> serde_json::Value {
    let secs = o.secs.max(1e-9);
    let us = |q: f64| o.latency.quantile(q).as_micros() as u64;
    let paths: Vec<_> = path_deltas(o)
        .into_iter()
        .zip(&o.after.paths)
        .map(|((index, local, portal, bytes, chunks), after)| {
            json!({
                "index": index,
                "local": local,
                "portal": portal,
                "bytes": bytes,
                "mib_per_s": bytes as f64 / secs / 1048576.0,
                "iops": chunks as f64 / secs,
                // What the initiator believes of the path at the end.
                "estimated_mb_per_s": after.figures.throughput / 1e6,
                "estimated_latency_us": after.figures.base_latency.as_micros() as u64,
                // The path's queue depth (0: none) and the most it held.
                "queue_depth": after.figures.config.queue_depth,
                "max_inflight": after.figures.counters.max_inflight,
            })
        })
        .collect();
    json!({
        "rw": p.rw.name(),
        "bs": p.bs,
        "iodepth": p.depth,
        "seconds": o.secs,
        "policy": o.after.policy,
        "bytes": o.bytes,
        "ops": o.ops,
        "mib_per_s": o.bytes as f64 / secs / 1048576.0,
        "mb_per_s": o.bytes as f64 / secs / 1e6,
        "iops": o.ops as f64 / secs,
        "lat_us": {
            "p50": us(0.5),
            "p99": us(0.99),
            "p999": us(0.999),
            "mean": o.latency.mean().as_micros() as u64,
            "max": o.latency.max().as_micros() as u64,
        },
        "errors": o.errors,
        "verify_errors": o.verify_errors,
        "paths": paths,
    })
}

pub fn print_text(p: &Plan, o: &Outcome) {
    let secs = o.secs.max(1e-9);
    let ms = |q: f64| o.latency.quantile(q).as_secs_f64() * 1e3;
    outln!(
        "{} {} iodepth {} for {:.1} s, policy {}, {} paths",
        p.rw.name(),
        format_size(p.bs),
        p.depth,
        o.secs,
        o.after.policy,
        o.after.paths.len()
    );
    outln!(
        "  {:.1} MB/s ({:.1} MiB/s), {:.0} IOPS; latency p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms; errors {}{}",
        o.bytes as f64 / secs / 1e6,
        o.bytes as f64 / secs / 1048576.0,
        o.ops as f64 / secs,
        ms(0.5),
        ms(0.99),
        ms(0.999),
        o.errors,
        if p.verify {
            format!(", verify mismatches {}", o.verify_errors)
        } else {
            String::new()
        }
    );
    let total: u64 = path_deltas(o).iter().map(|d| d.3).sum::<u64>().max(1);
    for (index, local, portal, bytes, chunks) in path_deltas(o) {
        let name = if local == "*" {
            portal
        } else {
            format!("{local} → {portal}")
        };
        outln!(
            "  path {index} ({name}): {:.1} MB/s, {:.0} IOPS, {:.1}% of bytes",
            bytes as f64 / secs / 1e6,
            chunks as f64 / secs,
            bytes as f64 * 100.0 / total as f64
        );
    }
}
