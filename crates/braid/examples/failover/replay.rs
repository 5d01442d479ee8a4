//! The cost of a replay: the volume's window filled to its bound
//! (acknowledged, never flushed), the target killed and started again with
//! a memory volume (a power cut: everything it held is gone), and the
//! time from the new instance seen until the first new request is
//! answered. The data read back afterwards is checked byte for byte.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use braid_lab::{Lab, Side};

use super::{failkit, labkit};

/// What one replay cost.
pub struct ReplayCost {
    /// Bytes the window held when the target restarted.
    pub window: u64,
    /// Restart seen → every replayed write acknowledged (the engine's own
    /// measure).
    pub replay: Duration,
    /// Restart seen (as `braid status` would show it) → the first request
    /// submitted after it answered.
    pub first_answer: Duration,
    /// Requests that failed, and blocks that read back wrong.
    pub errors: Vec<String>,
}

/// Writes one MiB blocks (unflushed) until the window holds `fill` bytes,
/// restarts the target, and measures.
pub fn measure(
    lab: &Lab,
    serve: &mut labkit::LabServe,
    serve_args: &[&str],
    uri: &str,
    fill: u64,
) -> ReplayCost {
    const BS: usize = 1 << 20;
    let blocks = fill / BS as u64;
    let ready = Arc::new(AtomicBool::new(false));
    let restarted: Mutex<Option<labkit::LabServe>> = Mutex::new(None);
    let cost = std::thread::scope(|s| {
        s.spawn(|| {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !ready.load(Ordering::Acquire) {
                assert!(Instant::now() < deadline, "the window never filled");
                std::thread::sleep(Duration::from_millis(10));
            }
            // Power cut: the process and what it held go at once.
            let _ = serve.guard.child_mut().kill();
            let _ = serve.guard.child_mut().wait();
            *restarted.lock().unwrap() = Some(labkit::LabServe::start(lab, serve_args, 1));
        });
        lab.enter(Side::Client, || {
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(client(uri, blocks, BS, &ready))
        })
        .expect("enter the client namespace")
    });
    if let Some(new) = restarted.into_inner().unwrap() {
        *serve = new;
    }
    cost
}

async fn client(uri: &str, blocks: u64, bs: usize, ready: &AtomicBool) -> ReplayCost {
    let vol = failkit::open(uri, |c| c.no_path_timeout = Some(Duration::from_secs(60))).await;
    let mut errors = Vec::new();
    if let Err(e) = vol.flush().await {
        errors.push(format!("first FLUSH: {e}"));
    }
    // Eight writes in flight, as a kernel's writeback keeps several.
    let mut tasks = tokio::task::JoinSet::new();
    for b in 0..blocks {
        if tasks.len() >= 8 {
            if let Some(Ok(Err(e))) = tasks.join_next().await {
                errors.push(e);
            }
        }
        let vol = vol.clone();
        tasks.spawn(async move {
            let data = failkit::block_data(b, 1, bs);
            vol.write(b * bs as u64, data, false)
                .await
                .map_err(|e| format!("write of block {b}: {e}"))
        });
    }
    while let Some(done) = tasks.join_next().await {
        if let Ok(Err(e)) = done {
            errors.push(e);
        }
    }
    let window = vol.report().replay.window_bytes;
    ready.store(true, Ordering::Release);
    // The moment the restart is seen, as `braid status` would show it.
    let seen: Arc<Mutex<Option<Instant>>> = Arc::default();
    let poller = {
        let (vol, seen) = (vol.clone(), seen.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            while Instant::now() < deadline {
                if vol.report().replay.replays > 0 {
                    *seen.lock().unwrap() = Some(Instant::now());
                    return;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    // One small read after another: the first answered after the restart
    // was seen waited for the replay.
    let mut first_answer = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    while first_answer.is_none() && Instant::now() < deadline {
        let read = vol.read(0, 4096).await;
        let answered = Instant::now();
        if let Err(e) = read {
            errors.push(format!("read during the restart: {e}"));
            break;
        }
        if let Some(at) = *seen.lock().unwrap() {
            first_answer = Some(answered.saturating_duration_since(at));
        }
    }
    poller.abort();
    let replay = vol
        .report()
        .replay
        .last_replay
        .map_or(Duration::ZERO, |(_, t)| t);
    // Everything acknowledged must be back.
    for b in 0..blocks {
        match vol.read(b * bs as u64, bs as u64).await {
            Ok(pieces) => {
                let got: Vec<u8> = pieces.into_iter().flat_map(|(_, d)| d.to_vec()).collect();
                if got[..] != failkit::block_data(b, 1, bs)[..] {
                    errors.push(format!("block {b} read back wrong after the replay"));
                }
            }
            Err(e) => errors.push(format!("reading block {b} back: {e}")),
        }
    }
    vol.close().await;
    ReplayCost {
        window,
        replay,
        first_answer: first_answer.unwrap_or(Duration::MAX),
        errors,
    }
}
