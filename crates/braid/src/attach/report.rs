//! What a running `braid attach` tells: the control socket's answers
//! (status, live policy and path changes) and the rates behind them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::info;

use crate::attached::{Attached, Volumes};
use crate::rates::{Counts, Rates};
use crate::{control, ctl};

fn counts(p: &braid_initiator::PathFigures) -> Counts {
    let c = &p.figures.counters;
    Counts {
        read_bytes: c.read_bytes,
        written_bytes: c.written_bytes,
        reads: c.reads,
        writes: c.writes,
    }
}

/// Samples every volume's path counters twice a second, for the rates
/// `braid status` shows (over 5 s) and the console's (over the last
/// second).
pub(super) async fn sample(volumes: Volumes, rates: Arc<Mutex<Rates>>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let mut snap = HashMap::new();
        for a in volumes.snapshot() {
            for p in a.volume.report().paths {
                snap.insert(format!("{}/{}", a.name, p.index), counts(&p));
            }
        }
        rates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(Instant::now(), snap);
    }
}

/// The status of one attached volume, as `braid status --json` shows it,
/// with rates over the last `window`.
pub fn volume_status(a: &Attached, rates: &Rates, window: Duration) -> ctl::VolumeStatus {
    let info = a.volume.info();
    let report = a.volume.report();
    let now = Instant::now();
    let paths = report
        .paths
        .iter()
        .map(|p| {
            let f = &p.figures;
            let key = format!("{}/{}", a.name, p.index);
            let r = rates.rate_within(&key, counts(p), now, window);
            let us =
                |h: &braid_initiator::engine::Histogram, q: f64| h.quantile(q).as_micros() as u64;
            ctl::PathStatus {
                index: p.index,
                local: p.local.clone(),
                portal: p.portal.clone(),
                state: f.state.name().to_owned(),
                connections: f.connections,
                read_bytes_per_s: r.read_bytes,
                write_bytes_per_s: r.written_bytes,
                read_iops: r.reads,
                write_iops: r.writes,
                inflight_requests: f.inflight_requests,
                inflight_bytes: f.inflight_bytes,
                queue_depth: f.config.queue_depth,
                max_inflight: f.counters.max_inflight,
                // The user's requests over the last 10 s and minute, as
                // iostat shows them; probes left out.
                latency_p50_us: us(&f.latency_10s, 0.5),
                latency_p99_us: us(&f.latency_10s, 0.99),
                latency_p999_us: us(&f.latency_10s, 0.999),
                latency_1m_p50_us: us(&f.latency_1m, 0.5),
                latency_1m_p99_us: us(&f.latency_1m, 0.99),
                read_bytes: f.counters.read_bytes,
                written_bytes: f.counters.written_bytes,
                reads: f.counters.reads,
                writes: f.counters.writes,
                others: f.counters.others,
                errors: f.counters.errors,
                failures: f.counters.failures,
                restores: f.counters.restores,
                resent: f.counters.resent,
                config: knobs(&f.config),
            }
        })
        .collect();
    ctl::VolumeStatus {
        name: a.name.clone(),
        uri: a.uri.clone(),
        socket: a.socket.display().to_string(),
        identity: info.identity.clone(),
        size: info.size,
        policy: report.policy,
        fencing: info.fencing,
        fence: info.fence.to_owned(),
        replay: report.replay.available,
        replay_window_bytes: report.replay.window_bytes,
        replay_window_pinned: report.replay.window_pinned,
        replay_window_limit: report.replay.window_limit,
        replay_overflowed: report.replay.overflowed,
        replays: report.replay.replays,
        replaying: report.replay.replaying,
        lost: report.replay.lost.as_ref().map(loss_status),
        lost_flushes: report.replay.lost_flushes,
        writeback_flushes: report.counters.writeback_flushes,
        writeback_failures: report.counters.writeback_failures,
        paths,
    }
}

/// Answers the control socket: status, and live changes of policy and
/// paths.
pub(super) fn handler(volumes: Volumes, rates: Arc<Mutex<Rates>>) -> control::Handler {
    Arc::new(move |req: ctl::Request| {
        let find = |name: &str| volumes.find(name);
        let answer = |ack: ctl::Ack| serde_json::to_value(ack).unwrap_or_default();
        match req {
            ctl::Request::Status => {
                let rates = rates.lock().unwrap_or_else(|p| p.into_inner());
                let status = ctl::Status::Attach {
                    ok: true,
                    pid: std::process::id(),
                    volumes: (volumes.snapshot().iter())
                        .map(|a| volume_status(a, &rates, crate::rates::WINDOW))
                        .collect(),
                };
                serde_json::to_value(status).unwrap_or_default()
            }
            ctl::Request::Policy { volume, policy } => match find(&volume) {
                Some(a) => match a.volume.set_policy(&policy, &Default::default()) {
                    Ok(()) => {
                        info!(volume = %a.name, "policy switched to {policy}");
                        answer(ctl::Ack::ok())
                    }
                    Err(e) => answer(ctl::Ack::refused(e.to_string())),
                },
                None => answer(ctl::Ack::refused(format!(
                    "no volume named {volume:?} here"
                ))),
            },
            ctl::Request::Path {
                volume,
                path,
                enable,
                set,
            } => {
                let Some(a) = find(&volume) else {
                    return answer(ctl::Ack::refused(format!(
                        "no volume named {volume:?} here"
                    )));
                };
                match (enable, set) {
                    (Some(enable), None) => match a.volume.set_path_enabled(path, enable) {
                        Ok(()) => {
                            info!(volume = %a.name, "path {path} {}", if enable { "enabled" } else { "disabled" });
                            answer(ctl::Ack::ok())
                        }
                        Err(e) => answer(ctl::Ack::refused(e)),
                    },
                    (None, Some(items)) => {
                        match braid_initiator::PathAttrs::parse(items.iter().map(String::as_str))
                            .and_then(|attrs| a.volume.set_path_attrs(path, &attrs))
                        {
                            Ok(c) => {
                                info!(volume = %a.name, "path {path} set: {}", knobs(&c));
                                answer(ctl::Ack {
                                    config: Some(knobs(&c)),
                                    ..ctl::Ack::ok()
                                })
                            }
                            Err(e) => answer(ctl::Ack::refused(e)),
                        }
                    }
                    _ => answer(ctl::Ack::refused(
                        "give a path number, and either enable true/false or set [key=value]",
                    )),
                }
            }
            ctl::Request::Alua { .. } => answer(ctl::Ack::refused(
                "braid attach has no iSCSI portals; ask the braid serve that has them",
            )),
            ctl::Request::ClearLoss { volume } => match find(&volume) {
                Some(a) => answer(ctl::Ack {
                    cleared: a.volume.clear_loss().as_ref().map(loss_status),
                    ..ctl::Ack::ok()
                }),
                None => answer(ctl::Ack::refused(format!(
                    "no volume named {volume:?} here"
                ))),
            },
        }
    })
}

fn loss_status(l: &braid_initiator::Loss) -> ctl::LossStatus {
    ctl::LossStatus {
        since_unix: l
            .since
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        cause: l.cause.clone(),
    }
}

/// A path's knobs as `braid status` and the logs show them.
pub fn knobs(c: &braid_initiator::engine::PathConfig) -> String {
    format!(
        "priority={} weight={} standby={} relative-throughput={} repeat-count={} queue-depth={}",
        c.priority,
        c.weight,
        if c.standby { "yes" } else { "no" },
        c.relative_throughput.max(1),
        c.repeat_count,
        c.queue_depth
    )
}
