//! `bench/failover`: how long I/O waits when a link is cut, and how soon a
//! restored link carries traffic again, over many cuts.
//!
//! Two 1gbit lab paths carry a verified write-then-read workload; path 1 is
//! cut every few seconds (alternating link down and a silent blackhole) and
//! restored. For each cut: the time until every I/O in flight at the cut
//! had completed (on the surviving path), and the time from the restore
//! until path 1 moved data again. Then the cost of a replay: the window
//! filled, the target killed and restarted (`replay.rs`). Medians and
//! maxima go to a markdown file.

#[path = "../../tests/failkit/mod.rs"]
mod failkit;
#[path = "../../tests/labkit/mod.rs"]
mod labkit;
mod replay;

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use braid_lab::{Cut, Lab, LabConfig, Rate, Side};

fn main() {
    let mut cuts = 20usize;
    let mut out = String::from("bench/results/failover.md");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--cuts" => cuts = args.next().and_then(|v| v.parse().ok()).expect("--cuts N"),
            "--out" => out = args.next().expect("--out FILE"),
            _ => {
                eprintln!("usage: failover [--cuts N] [--out FILE]");
                std::process::exit(2);
            }
        }
    }
    braid_lab::available().expect("the lab needs root, ip and tc");
    let lab = Lab::up(LabConfig::new([Rate::GBIT, Rate::GBIT])).expect("lab up");
    let portals: Vec<String> = lab
        .paths()
        .iter()
        .map(|p| p.storage_addr.to_string())
        .collect();
    // A fixed identity, so that the restarted target (a fresh memory
    // volume: a power cut) is the same volume to the initiator.
    let mut sargs = vec![
        "vol=mem:512MiB",
        "--volume-id",
        "vol=6f1c2a4e-7b3d-4e8a-9c51-2d7f0a8b3e64",
    ];
    for p in &portals {
        sargs.extend(["--listen", p.as_str()]);
    }
    let mut serve = labkit::LabServe::start(&lab, &sargs, 1);
    let uri = format!("nbd://{}/vol", portals[0]);
    let period = Duration::from_secs(4);
    let outage = Duration::from_millis(1500);
    let first = Duration::from_secs(2);
    let start = Instant::now();
    let events: Mutex<Vec<(Cut, Duration, Duration)>> = Mutex::new(Vec::new());
    let log = std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..cuts {
                let how = if i % 2 == 0 {
                    Cut::LinkDown
                } else {
                    Cut::Blackhole
                };
                let at = start + first + period * i as u32;
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
                lab.cut(1, how).expect("cut");
                let cut = start.elapsed();
                std::thread::sleep((at + outage).saturating_duration_since(Instant::now()));
                lab.restore(1).expect("restore");
                let restore = start.elapsed();
                events.lock().unwrap().push((how, cut, restore));
            }
        });
        lab.enter(Side::Client, || {
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    let vol = failkit::open(&uri, |_| {}).await;
                    let work = failkit::Workload {
                        blocks: 128,
                        bs: 256 * 1024,
                        depth: 8,
                        duration: first + period * cuts as u32,
                    };
                    let log = failkit::run(vol.clone(), work, start).await;
                    vol.close().await;
                    log
                })
        })
        .expect("enter the client namespace")
    });
    let events = events.into_inner().unwrap();
    // A full window: what the default --replay-window holds of 1 MiB
    // writes (each buffer and its entry counted).
    let window = braid_initiator::engine::EngineConfig::default().replay_window;
    let replay = replay::measure(&lab, &mut serve, &sargs, &uri, window - (1 << 20));
    let mut over = Vec::new();
    let mut back = Vec::new();
    let mut rows = String::new();
    for (i, (how, cut, restore)) in events.iter().enumerate() {
        let f = log.failover_time(*cut);
        let b = log.failback_time(1, *restore);
        let ms = |d: Option<Duration>| {
            d.map_or("none".into(), |d| format!("{:.0}", d.as_secs_f64() * 1e3))
        };
        let _ = writeln!(rows, "| {} | {how:?} | {} | {} |", i + 1, ms(f), ms(b));
        over.extend(f);
        back.extend(b);
    }
    let stat = |v: &mut Vec<Duration>| -> (f64, f64) {
        v.sort();
        let med = v
            .get(v.len() / 2)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
        let max = v.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
        (med, max)
    };
    // A cut whose I/O never completed elsewhere, or whose path never came
    // back, is a failure: it is counted and shown, never left out.
    let never_over = events.len() - over.len();
    let never_back = events.len() - back.len();
    let (om, ox) = stat(&mut over);
    let (bm, bx) = stat(&mut back);
    let shown = |v: f64, never: usize| {
        if never > 0 {
            format!("never ({never} cuts)")
        } else {
            format!("{v:.0}")
        }
    };
    let (ox, bx) = (shown(ox, never_over), shown(bx, never_back));
    let commit = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let engine = braid_initiator::engine::EngineConfig::default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let date = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let mut md = String::new();
    let _ = writeln!(md, "# Failover: time to fail over and to fail back\n");
    let _ = writeln!(
        md,
        "{date}, kernel {}, {} cuts of path 1 ({} ms each, alternating link down and a silent \
         blackhole) under a verified write-then-read workload (8 × 256 KiB) over two 1gbit lab paths, \
         policy adaptive, reply timeout floor {:.1} s, ceiling {:.0} s, slow-reply patience {:.0}–{:.0} s.\n\n\
         Commit `{commit}`, command `{command}` (run by `bench/failover`).\n",
        kernel.trim(),
        events.len(),
        outage.as_millis(),
        engine.timeout_floor.as_secs_f64(),
        engine.timeout_ceiling.as_secs_f64(),
        engine.slow_reply_min.as_secs_f64(),
        engine.slow_reply_max.as_secs_f64(),
    );
    let _ = writeln!(md, "| | median | max | target |\n|---|---|---|---|");
    let _ = writeln!(md, "| cut → all I/O in flight at the cut completed (ms) | {om:.0} | {ox} | median < 1000, max < 2000 |");
    let _ = writeln!(
        md,
        "| restore → path carries data again (ms) | {bm:.0} | {bx} | median < 1000, max < 2000 |"
    );
    let _ = writeln!(
        md,
        "\nI/O errors: {}; data mismatches: {}; cuts never failed over: {never_over}; never \
         failed back: {never_back}. For comparison, iSCSI with dm-multipath's defaults notices a \
         dead path after 10–15 s (NOP-out 5 s + 5 s, then fast_io_fail_tmo 5 s).\n",
        log.errors.len(),
        log.mismatches.len()
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let _ = writeln!(
        md,
        "## A replay\n\nThe window filled with {} MiB of 1 MiB writes acknowledged and never \
         flushed, the target killed and started again on a fresh memory volume (a power cut), \
         on the same two 1gbit paths:\n\n\
         | | ms |\n|---|---|\n\
         | restart seen → every replayed write acknowledged | {:.0} |\n\
         | restart seen → first request answered (it waited for the replay) | {:.0} |\n\n\
         Replayed at {:.0} MB/s; errors and blocks read back wrong: {}.\n",
        replay.window >> 20,
        ms(replay.replay),
        ms(replay.first_answer),
        replay.window as f64 / replay.replay.as_secs_f64().max(1e-9) / 1e6,
        replay.errors.len()
    );
    let _ = writeln!(
        md,
        "| cut | kind | failover (ms) | failback (ms) |\n|---|---|---|---|\n{rows}"
    );
    std::fs::write(&out, &md).expect("write the results");
    print!("{md}");
    if !log.errors.is_empty()
        || !log.mismatches.is_empty()
        || never_over + never_back > 0
        || !replay.errors.is_empty()
    {
        eprintln!(
            "errors: {:?}\nmismatches: {:?}\nreplay: {:?}",
            log.errors, log.mismatches, replay.errors
        );
        std::process::exit(1);
    }
}
