//! `bench/ceph-lab`'s gateway kill: a verified write-then-read load over
//! every gateway of a volume, one gateway SIGKILLed part way while the load
//! goes on, and what that cost: the longest gap in completions after the
//! kill, I/O errors, blocks that read back wrong, and every acknowledged
//! block read back through the gateways left. The blocks acknowledged last
//! are written to a file, so that the volume's bytes read some other way
//! (`rbd export`) can be checked against them with `holds`.
//!
//!   gateway_kill run URI --kill PID --at SECS --seconds N --acked FILE
//!                        [--portal ADDR:PORT]... [--persistent-reservations]
//!   gateway_kill holds --acked FILE --image FILE
//!
//! Each prints one JSON object.

#[path = "../../tests/failkit/mod.rs"]
mod failkit;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;

/// Writes of a size hosts send, over a span small enough to rewrite each
/// block many times a run (so a late write would be seen over a newer one).
const BS: usize = 256 * 1024;
const BLOCKS: u64 = 256;
const DEPTH: usize = 8;

struct Run {
    uri: String,
    portals: Vec<SocketAddr>,
    reservations: bool,
    kill: i32,
    at: Duration,
    seconds: Duration,
    acked: String,
}

fn usage() -> ! {
    eprintln!(
        "usage: gateway_kill run URI --kill PID --at SECS --seconds N --acked FILE \
         [--portal ADDR:PORT]... [--persistent-reservations]\n       \
         gateway_kill holds --acked FILE --image FILE"
    );
    std::process::exit(2);
}

fn main() {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("run") => run(parse_run(args)),
        Some("holds") => {
            let (mut acked, mut image) = (None, None);
            while let Some(a) = args.next() {
                match a.as_str() {
                    "--acked" => acked = args.next(),
                    "--image" => image = args.next(),
                    _ => usage(),
                }
            }
            let (Some(acked), Some(image)) = (acked, image) else {
                usage()
            };
            holds(&acked, &image);
        }
        _ => usage(),
    }
}

fn parse_run(mut args: impl Iterator<Item = String>) -> Run {
    let mut r = Run {
        uri: args.next().unwrap_or_else(|| usage()),
        portals: Vec::new(),
        reservations: false,
        kill: 0,
        at: Duration::ZERO,
        seconds: Duration::ZERO,
        acked: String::new(),
    };
    let secs = |v: Option<String>| {
        Duration::from_secs_f64(v.and_then(|v| v.parse().ok()).unwrap_or_else(|| usage()))
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--portal" => r.portals.push(
                args.next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage()),
            ),
            "--persistent-reservations" => r.reservations = true,
            "--kill" => {
                r.kill = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage())
            }
            "--at" => r.at = secs(args.next()),
            "--seconds" => r.seconds = secs(args.next()),
            "--acked" => r.acked = args.next().unwrap_or_else(|| usage()),
            _ => usage(),
        }
    }
    if r.kill <= 1 || r.at.is_zero() || r.seconds <= r.at || r.acked.is_empty() {
        usage();
    }
    r
}

fn run(r: Run) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt.block_on(async {
        let vol = failkit::open(&r.uri, |cfg| {
            cfg.portals = r.portals.clone();
            cfg.persistent_reservations = r.reservations;
        })
        .await;
        let paths = vol.report().paths.len();
        let start = Instant::now();
        let w = failkit::Workload {
            blocks: BLOCKS,
            bs: BS,
            depth: DEPTH,
            duration: r.seconds,
        };
        let load = tokio::spawn(failkit::run(vol.clone(), w, start));
        tokio::time::sleep(r.at).await;
        // SAFETY: kill(2) on a PID the caller named; no memory involved.
        let killed = unsafe { libc::kill(r.kill, libc::SIGKILL) } == 0;
        let kill_at = start.elapsed();
        let log = load.await.expect("load");
        let end = start.elapsed();
        let bad = failkit::check_acknowledged(&vol, &log, BS).await;
        let report = vol.report();
        vol.close().await;
        let acked: Vec<(u64, u64)> = log
            .acked
            .iter()
            .filter(|(_, (v, _))| *v > 0)
            .map(|(b, (v, _))| (*b, *v))
            .collect();
        std::fs::write(&r.acked, serde_json::to_vec(&acked).expect("json")).expect("--acked");
        let ms = |d: Option<Duration>| d.map(|d| (d.as_secs_f64() * 1e4).round() / 10.0);
        let moved: u64 = log.ops.iter().filter(|o| o.ok).count() as u64 * BS as u64;
        json!({
            "paths_at_start": paths,
            "killed": killed,
            "kill_at_ms": ms(Some(kill_at)),
            "seconds": end.as_secs_f64(),
            "ops": log.ops.len(),
            "mb_per_s": moved as f64 / end.as_secs_f64() / 1e6,
            "errors": log.errors.len(),
            "first_error": log.errors.first(),
            "mismatches": log.mismatches.len(),
            "first_mismatch": log.mismatches.first(),
            "acked_blocks": acked.len(),
            "bad_through_volume": bad.len(),
            "first_bad": bad.first(),
            "in_flight_done_ms": ms(log.failover_time(kill_at)),
            "longest_gap_ms": ms(Some(log.longest_stall(kill_at, end))),
            "longest_gap_before_ms": ms(Some(log.longest_stall(Duration::ZERO, kill_at))),
            "replays": report.replay.replays,
        })
    });
    println!("{out}");
}

/// Checks the volume's bytes in `image` against the blocks in `acked`.
fn holds(acked: &str, image: &str) {
    let acked: Vec<(u64, u64)> =
        serde_json::from_slice(&std::fs::read(acked).expect("--acked")).expect("--acked JSON");
    let data = std::fs::read(image).expect("--image");
    let lost: Vec<u64> = acked
        .iter()
        .filter(|&&(block, version)| {
            let at = block as usize * BS;
            data.get(at..at + BS) != Some(&failkit::block_data(block, version, BS)[..])
        })
        .map(|&(block, _)| block)
        .collect();
    println!(
        "{}",
        json!({
            "blocks": acked.len(),
            "lost_blocks": lost.len(),
            "lost_bytes": lost.len() * BS,
            "first_lost": lost.first(),
        })
    );
}
