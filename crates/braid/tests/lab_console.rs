//! The attach console watched in a real browser while a link fails: a
//! verified load runs through `braid attach` over two lab paths, the page
//! is open (headless Chromium in the client namespace, through WebDriver),
//! path 2 is cut; within 2 s the page shows path 2 failed, the failure on
//! the timeline and the load's bytes all on path 1; once the link is back it
//! shows the failback. The harness keeps a screenshot of the page.

mod browserkit;
mod common;
mod labkit;

use braid_test_needs::needs;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use braid_lab::{Cut, Lab, LabConfig, Rate};
use browserkit::{raw, screenshot_dir, Browser, StopOnDrop};
use common::{cmd, tool};
use labkit::{Attach, LabServe};

/// The console's port inside the client namespace (a fresh one: free).
const PORT: u16 = 9810;

/// What the page shows now: path 2 failed, its failure on the timeline,
/// path 1's share of the bytes moved over the last seconds.
const LOOK: &str = "
    const row = n => document.querySelector('#v0-paths tr[data-path=\"' + n + '\"]');
    const cells = n => row(n) ? [...row(n).querySelectorAll('td')].map(c => c.textContent) : [];
    const ev = k => document.querySelector('#v0-events li[data-kind=\"' + k + '\"]');
    const p1 = cells(1);
    return {
        failed: !!row(2) && row(2).classList.contains('st-down'),
        event: ev('path-failed') ? ev('path-failed').textContent : null,
        share1: p1.length ? parseFloat(row(1).querySelector('meter').value) : 0,
    };";

#[needs("root", "ip", "tc", "chromium", "chromedriver", "qemu-io")]
fn the_page_shows_a_cut_path_fail_over_and_come_back() {
    if !braid_lab::require_or_skip("the_page_shows_a_cut_path_fail_over_and_come_back")
        || !tool("chromium")
        || !tool("chromedriver")
        || !tool("qemu-io")
    {
        return;
    }
    let lab = Lab::up(LabConfig::new([Rate::GBIT, Rate::GBIT])).unwrap();
    let mut args = vec!["vol=mem:128MiB".to_string()];
    for p in lab.paths() {
        args.push("--listen".into());
        args.push(p.storage_addr.to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _serve = LabServe::start(&lab, &args, 1);
    let uri = format!("nbd://{}/vol", lab.paths()[0].storage_addr);
    let mut attach = Attach::start(
        Some(&lab),
        &uri,
        "vol",
        &["--http", &format!("127.0.0.1:{PORT}")],
    );
    let answered = || {
        lab.enter(braid_lab::Side::Client, || {
            raw(PORT, "GET", "/api/snapshot", &[], None).is_ok_and(|(s, _)| s == 200)
        })
        .unwrap_or(false)
    };
    assert!(
        common::wait_until(Duration::from_secs(10), answered),
        "no console:\n{}",
        attach.log()
    );
    let b = Browser::start(Some(&lab), 1280, 1240);
    b.open(&format!("http://127.0.0.1:{PORT}/"));
    b.wait_for(
        Duration::from_secs(5),
        "return document.getElementById('live').textContent === 'live';",
    )
    .expect("the push stream");

    let stop = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| {
            if let Err(e) = verified_load(&attach, &stop, &rounds) {
                failures.lock().unwrap().push(e);
            }
            stop.store(true, Ordering::Relaxed);
        });
        // Both paths carry the load before the cut.
        let both = b.wait_for(
            Duration::from_secs(10),
            "const r = [...document.querySelectorAll('#v0-paths tr')]; \
             return r.length === 2 && r.every(t => parseFloat(t.children[6].textContent) \
             + parseFloat(t.children[7].textContent) > 1);",
        );
        assert!(both.is_ok(), "the load did not reach both paths: {both:?}");

        lab.cut(2, Cut::LinkDown).unwrap();
        let cut = Instant::now();
        let mut seen = [None::<Duration>; 3];
        let mut last = serde_json::Value::Null;
        while cut.elapsed() < Duration::from_secs(2) && seen.iter().any(Option::is_none) {
            last = b.eval(LOOK);
            let now = cut.elapsed();
            let shown = [
                last["failed"] == true,
                last["event"]
                    .as_str()
                    .is_some_and(|t| t.contains("vol path 2")),
                last["share1"].as_f64().unwrap_or(0.0) > 0.95,
            ];
            for (at, shown) in seen.iter_mut().zip(shown) {
                // Seen by a look that ended within the 2 s.
                if shown && at.is_none() && now <= Duration::from_secs(2) {
                    *at = Some(now);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "after the cut, the page showed: path 2 failed at {:?}, the timeline at {:?}, \
             path 1 carrying the load at {:?}; last look {last}",
            seen[0], seen[1], seen[2]
        );
        assert!(
            seen.iter().all(Option::is_some),
            "within 2 s of the cut the page did not show it all: {last}\n{}",
            attach.log()
        );
        // The failover's time is on the timeline beside the failure.
        let event = last["event"].as_str().unwrap_or_default();
        assert!(
            event.contains("failover") && event.contains(" ms"),
            "{event}"
        );

        lab.restore(2).unwrap();
        let back = b
            .wait_for(
                Duration::from_secs(15),
                "const r = document.querySelector('#v0-paths tr[data-path=\"2\"]'); \
             const e = document.querySelector('#v0-events li[data-kind=\"path-restored\"]'); \
             return r && r.classList.contains('st-up') && e ? e.textContent : null;",
            )
            .unwrap_or_else(|v| panic!("no failback shown: {v}\n{}", attach.log()));
        assert!(
            back.as_str().unwrap_or_default().contains("was down"),
            "{back}"
        );
        // The charts hold a few seconds of both paths again.
        std::thread::sleep(Duration::from_secs(3));
        b.screenshot(&screenshot_dir().join("console-attach.png"));
        stop.store(true, Ordering::Relaxed);
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "the load failed: {failures:?}");
    assert!(rounds.load(Ordering::Relaxed) > 0);
    assert!(attach.stop());
}

/// Writes patterns through braid attach with qemu-io and reads each back
/// verified (`read -P`), many rounds per process so the load has no
/// pauses, until `stop`.
fn verified_load(attach: &Attach, stop: &AtomicBool, rounds: &AtomicU64) -> Result<(), String> {
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut c = cmd("qemu-io");
        c.args(["-f", "raw", &attach.uri()]);
        // 4 MiB requests: a path's replies stay quick, so a cut path is
        // judged dead at the reply timeout's floor, not after a long
        // request's own time.
        for k in 0..32u64 {
            let pattern = (round * 32 + k) % 250 + 1;
            let at = k * 4;
            c.args(["-c", &format!("write -P {pattern} {at}M 4M")]);
            c.args(["-c", &format!("read -P {pattern} {at}M 4M")]);
        }
        let out = common::output(&mut c, Duration::from_secs(120));
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() || text.contains("failed") || text.contains("error") {
            return Err(format!("qemu-io: {}: {text}", out.status));
        }
        round += 1;
        rounds.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}
