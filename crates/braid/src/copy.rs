//! `braid copy SRC DST`: files, devices and multipath volumes, sparse
//! aware, with progress, per-path shares and an optional sha256 check.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use braid_initiator::Volume;
use braid_store::source::{format_size, parse_size};
use sha2::{Digest, Sha256};
use tokio::task::JoinSet;

use crate::cli::{CopyArgs, UsageError};
use crate::multipath;
use crate::out::{err, outln};
use crate::side::Side;

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

fn is_uri(s: &str) -> bool {
    s.starts_with("nbd://")
        || s.starts_with("nbd+")
        || s.starts_with("nbds://")
        || s.starts_with("nbds+")
        || s.starts_with("iscsi://")
}

pub fn run(args: CopyArgs) -> Result<()> {
    let bs = parse_size(&args.bs).map_err(|e| usage(format!("--bs {:?}: {e}", args.bs)))?;
    if bs == 0 || bs > 32 << 20 {
        return Err(usage("--bs must be between 1 byte and 32 MiB"));
    }
    if args.requests == 0 {
        return Err(usage("--requests must be at least 1"));
    }
    if is_uri(&args.src) && is_uri(&args.dst) && !args.multipath.portals.is_empty() {
        return Err(usage(
            "--portal is ambiguous when both sides are volumes; copy through a file, or let \
             braid discover portals",
        ));
    }
    let src_cfg = is_uri(&args.src)
        .then(|| multipath::config(&args.src, &args.multipath))
        .transpose()?;
    let dst_cfg = is_uri(&args.dst)
        .then(|| multipath::config(&args.dst, &args.multipath))
        .transpose()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let (src, src_vol) = match src_cfg {
            Some(cfg) => {
                let v = Arc::new(multipath::open(cfg).await?);
                (Side::Volume(v.clone()), Some(v))
            }
            None => (Side::open_source(Path::new(&args.src))?, None),
        };
        let size = src.size();
        let (dst, dst_vol, fresh) = match dst_cfg {
            Some(cfg) => {
                let v = Arc::new(multipath::open(cfg).await?);
                if v.info().size < size {
                    bail!(
                        "the destination volume holds {} but the source is {}",
                        format_size(v.info().size),
                        format_size(size)
                    );
                }
                (Side::Volume(v.clone()), Some(v), false)
            }
            None => {
                let p = Path::new(&args.dst);
                let fresh = !p.exists() || std::fs::metadata(p).is_ok_and(|m| m.is_file());
                (Side::open_dest(p, size)?, None, fresh)
            }
        };
        let vols: Vec<Arc<Volume>> = src_vol.iter().chain(dst_vol.iter()).cloned().collect();
        let done = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let progress = (!args.no_progress && stderr_is_terminal())
            .then(|| tokio::spawn(progress(done.clone(), size, start, vols.clone())));
        let result = copy(&src, &dst, size, bs, args.requests, fresh, done.clone()).await;
        if let Some(p) = progress {
            p.abort();
            err!("\r\x1b[2K");
        }
        result?;
        dst.flush().await.context("flushing the destination")?;
        let secs = start.elapsed().as_secs_f64();
        outln!(
            "copied {} from {} to {} in {secs:.2} s ({:.1} MB/s)",
            format_size(size),
            src.describe(),
            dst.describe(),
            size as f64 / secs.max(1e-9) / 1e6
        );
        for v in &vols {
            for line in multipath::share_lines(&v.report()) {
                outln!("{line}");
            }
        }
        if args.verify {
            let (a, b) = tokio::try_join!(
                hash(&src, size, bs, args.requests),
                hash(&dst, size, bs, args.requests)
            )?;
            if a != b {
                bail!("verify failed: source sha256 {a} but destination sha256 {b}");
            }
            outln!("verified: sha256 {a} on both sides");
        }
        for v in &vols {
            v.close().await;
        }
        Ok(())
    })
}

fn stderr_is_terminal() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(2) == 1 }
}

async fn copy(
    src: &Side,
    dst: &Side,
    size: u64,
    bs: u64,
    depth: usize,
    fresh: bool,
    done: Arc<AtomicU64>,
) -> Result<()> {
    let zeroes = zero_ranges(src, size).await;
    let mut jobs = JoinSet::new();
    let mut at = 0u64;
    let mut zi = 0;
    while at < size {
        // Known-zero ranges are written as zeroes (or left as holes).
        if let Some(&(zs, ze)) = zeroes.get(zi) {
            if at >= ze {
                zi += 1;
                continue;
            }
            if at >= zs {
                let n = (ze - at).min(1 << 30);
                let (dst, done) = (dst.clone(), done.clone());
                spawn_bounded(&mut jobs, depth, async move {
                    dst.zero(at, n, fresh).await?;
                    done.fetch_add(n, Ordering::Relaxed);
                    Ok(())
                })
                .await?;
                at += n;
                continue;
            }
        }
        let limit = zeroes.get(zi).map_or(size, |z| z.0);
        let n = bs.min(limit - at).min(size - at);
        let (src, dst, done) = (src.clone(), dst.clone(), done.clone());
        spawn_bounded(&mut jobs, depth, async move {
            let data = src.read(at, n as usize).await?;
            if data.iter().all(|piece| piece.iter().all(|&b| b == 0)) {
                dst.zero(at, n, fresh).await?;
            } else {
                dst.write(at, data).await?;
            }
            done.fetch_add(n, Ordering::Relaxed);
            Ok(())
        })
        .await?;
        at += n;
    }
    while let Some(r) = jobs.join_next().await {
        r??;
    }
    Ok(())
}

async fn spawn_bounded(
    jobs: &mut JoinSet<Result<()>>,
    depth: usize,
    job: impl std::future::Future<Output = Result<()>> + Send + 'static,
) -> Result<()> {
    while jobs.len() >= depth {
        if let Some(r) = jobs.join_next().await {
            r??;
        }
    }
    jobs.spawn(job);
    Ok(())
}

/// Ranges of the source known to read as zero, in order.
async fn zero_ranges(src: &Side, size: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    match src {
        Side::File { .. } => {
            // Probe in 64 MiB steps: cheap for files (SEEK_DATA).
            let step = 64 << 20;
            let mut at = 0;
            while at < size {
                let n = step.min(size - at);
                if src.known_zero(at, n).await {
                    push_range(&mut out, at, at + n);
                }
                at += n;
            }
        }
        Side::Volume(v) => {
            let mut at = 0u64;
            let mut rounds = 0;
            while at < size && rounds < 100_000 {
                rounds += 1;
                let n = (size - at).min(1 << 31);
                let Ok(extents) = v.block_status(at, n).await else {
                    break;
                };
                if extents.is_empty() {
                    break;
                }
                for e in extents {
                    let len = e.len.min(size - at);
                    if e.zero {
                        push_range(&mut out, at, at + len);
                    }
                    at += len;
                    if at >= size {
                        break;
                    }
                }
            }
        }
    }
    out
}

fn push_range(v: &mut Vec<(u64, u64)>, start: u64, end: u64) {
    match v.last_mut() {
        Some(last) if last.1 == start => last.1 = end,
        _ => v.push((start, end)),
    }
}

/// sha256 of `[0, size)`, reading `depth` blocks ahead.
async fn hash(side: &Side, size: u64, bs: u64, depth: usize) -> Result<String> {
    let mut hasher = Sha256::new();
    let mut ahead: VecDeque<tokio::task::JoinHandle<Result<Vec<bytes::Bytes>>>> = VecDeque::new();
    let mut at = 0u64;
    loop {
        while at < size && ahead.len() < depth {
            let n = bs.min(size - at) as usize;
            let s = side.clone();
            let off = at;
            ahead.push_back(tokio::spawn(async move { s.read(off, n).await }));
            at += n as u64;
        }
        let Some(next) = ahead.pop_front() else {
            break;
        };
        for piece in next.await?? {
            hasher.update(&piece);
        }
    }
    Ok(hex::encode(hasher.finalize()))
}

async fn progress(done: Arc<AtomicU64>, size: u64, start: Instant, vols: Vec<Arc<Volume>>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let d = done.load(Ordering::Relaxed);
        let secs = start.elapsed().as_secs_f64().max(1e-3);
        let rate = d as f64 / secs;
        let eta = if rate > 0.0 {
            (size.saturating_sub(d)) as f64 / rate
        } else {
            0.0
        };
        let mut line = format!(
            "{} / {}  {:.1} MB/s  ETA {:.0} s",
            format_size(d),
            format_size(size),
            rate / 1e6,
            eta
        );
        for v in &vols {
            for (i, (_, _, pct)) in multipath::shares(&v.report()).iter().enumerate().take(8) {
                line.push_str(&format!("  path {} {pct:.0}%", i + 1));
            }
        }
        err!("\r\x1b[2K{line}");
    }
}
