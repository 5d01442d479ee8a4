//! `braid demo`: braid's main job on one machine. A memory volume is served
//! on two loopback portals, opened with multipath (the second portal found
//! by discovery), filled and read back with a sha256 check, then measured;
//! every step prints each path's share.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use braid_initiator::{NbdUri, Volume, VolumeConfig};
use braid_nbd_target::Target;
use braid_store::backend::FileBackend;
use braid_store::portal::Portal;
use braid_store::source::{format_size, parse_size};
use braid_store::{Export, Exports, Limits};
use bytes::Bytes;
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::bench::{self, Plan};
use crate::cli::Workload;
use crate::cli::{DemoArgs, UsageError};
use crate::multipath;
use crate::out::outln;
use crate::side::concat;

pub fn run(args: DemoArgs) -> Result<()> {
    let size =
        parse_size(&args.size).map_err(|e| UsageError(format!("--size {:?}: {e}", args.size)))?;
    if size < 16 << 20 {
        return Err(UsageError("--size must be at least 16 MiB".into()).into());
    }
    if !(args.time.is_finite() && args.time > 0.0 && args.time <= 600.0) {
        return Err(UsageError("--time must be between 0 and 600 seconds".into()).into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(demo(size, Duration::from_secs_f64(args.time)))
}

async fn demo(size: u64, step: Duration) -> Result<()> {
    let export = Arc::new(Export::local(
        "demo",
        "braid demo volume (memory)",
        Arc::new(FileBackend::memory(size).context("cannot make the demo volume")?),
        false,
        uuid::Uuid::new_v4(),
    ));
    let portals: Vec<Portal> = ["127.0.0.1:0", "127.0.0.2:0"]
        .iter()
        .map(|a| Portal {
            addr: a.parse().expect("literal address"),
            device: None,
        })
        .collect();
    let target = Target::bind(Exports::new(vec![export]), &portals, Limits::default())
        .context("serving the demo volume on 127.0.0.1 and 127.0.0.2")?;
    let addrs = target.local_addrs();
    let stop = target.stop_handle();
    let server = tokio::spawn(target.run());
    outln!(
        "braid demo: serving a {} memory volume on two portals:",
        format_size(size)
    );
    for a in &addrs {
        outln!("  {a}");
    }
    let uri: NbdUri = format!("nbd://{}/demo", addrs[0])
        .parse()
        .map_err(anyhow::Error::msg)?;
    outln!(
        "opening nbd://{}/demo; the other portal is found by discovery",
        addrs[0]
    );
    let vol = Arc::new(multipath::open(VolumeConfig::new(uri)).await?);
    for (i, p) in vol.info().paths.iter().enumerate() {
        outln!("  path {}: {p}", i + 1);
    }
    let result = steps(&vol, size, step).await;
    vol.close().await;
    stop.stop();
    let _ = server.await;
    result
}

async fn steps(vol: &Arc<Volume>, size: u64, step: Duration) -> Result<()> {
    let span = (size / 2).min(256 << 20) / (1 << 20) * (1 << 20);
    let mut data = vec![0u8; span as usize];
    rand::thread_rng().fill_bytes(&mut data);
    let data = Bytes::from(data);
    let want = hex::encode(Sha256::digest(&data));

    let before = vol.report();
    let t = Instant::now();
    parallel(vol, span, |v, off, n| {
        let d = data.slice(off as usize..(off + n) as usize);
        async move { v.write(off, d, false).await.map(|_| Bytes::new()) }
    })
    .await?;
    vol.flush().await?;
    report_step("copy in", span, t.elapsed(), &before, &vol.report());

    let before = vol.report();
    let t = Instant::now();
    let pieces = parallel(vol, span, |v, off, n| async move {
        v.read(off, n).await.map(|p| concat(p, n as usize))
    })
    .await?;
    let mut h = Sha256::new();
    for p in &pieces {
        h.update(p);
    }
    let got = hex::encode(h.finalize());
    report_step("copy out", span, t.elapsed(), &before, &vol.report());
    if got != want {
        bail!("read back sha256 {got}, but wrote {want}: data differs");
    }
    outln!("  verified: sha256 {want} matches");

    for (rw, bs, depth) in [(Workload::Read, 1 << 20, 4), (Workload::RandRw, 4096, 16)] {
        let plan = Plan {
            rw,
            bs,
            depth,
            time: step,
            span: Some(span),
            read_pct: 50,
            verify: true,
        };
        outln!();
        let out = bench::execute(vol, &plan).await?;
        bench::print_text(&plan, &out);
        if out.errors > 0 || out.verify_errors > 0 {
            bail!(
                "bench saw {} errors and {} mismatches: {}",
                out.errors,
                out.verify_errors,
                out.first_error.unwrap_or_default()
            );
        }
    }
    outln!();
    outln!("every path carried I/O for one volume; try `braid copy`, `braid bench` and `braid serve --help` next");
    Ok(())
}

/// Runs `op` over `[0, span)` in 1 MiB pieces, 16 at a time; results in order.
async fn parallel<F, Fut>(vol: &Arc<Volume>, span: u64, op: F) -> Result<Vec<Bytes>>
where
    F: Fn(Arc<Volume>, u64, u64) -> Fut,
    Fut: std::future::Future<Output = Result<Bytes, braid_initiator::IoError>> + Send + 'static,
{
    let bs = 1u64 << 20;
    let mut handles = std::collections::VecDeque::new();
    let mut out = Vec::new();
    let mut at = 0;
    while at < span || !handles.is_empty() {
        while at < span && handles.len() < 16 {
            let n = bs.min(span - at);
            handles.push_back(tokio::spawn(op(vol.clone(), at, n)));
            at += n;
        }
        if let Some(h) = handles.pop_front() {
            out.push(h.await??);
        }
    }
    Ok(out)
}

fn report_step(
    what: &str,
    bytes: u64,
    took: Duration,
    before: &braid_initiator::VolumeReport,
    after: &braid_initiator::VolumeReport,
) {
    outln!(
        "{what}: {} in {:.2} s ({:.1} MB/s)",
        format_size(bytes),
        took.as_secs_f64(),
        bytes as f64 / took.as_secs_f64().max(1e-9) / 1e6
    );
    let delta = braid_initiator::VolumeReport {
        policy: after.policy.clone(),
        uptime: after.uptime,
        counters: after.counters.clone(),
        replay: after.replay.clone(),
        paths: after
            .paths
            .iter()
            .map(|a| {
                let mut p = a.clone();
                if let Some(b) = before.paths.iter().find(|b| b.index == a.index) {
                    let (c, d) = (&mut p.figures.counters, &b.figures.counters);
                    c.read_bytes -= d.read_bytes;
                    c.written_bytes -= d.written_bytes;
                }
                p
            })
            .collect(),
    };
    for line in multipath::share_lines(&delta) {
        outln!("{line}");
    }
}
