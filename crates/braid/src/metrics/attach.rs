//! Metrics of attached volumes: per path (labelled with volume, path number,
//! local side and portal) and per volume.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::{counters, gauges, histograms, Buckets, Labels};
use crate::attached::Volumes;

/// Reads every attached volume's figures at each scrape.
pub struct AttachCollector(pub Volumes);

impl fmt::Debug for AttachCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AttachCollector({} volumes)", self.0.snapshot().len())
    }
}

/// Per-path counters: name, help, and how to read it.
type PathCounter = (
    &'static str,
    &'static str,
    fn(&braid_initiator::engine::PathCounters) -> u64,
);

const PATH_COUNTERS: &[PathCounter] = &[
    (
        "braid_path_read_bytes",
        "Bytes read over the path (moves when a READ chunk completes)",
        |c| c.read_bytes,
    ),
    (
        "braid_path_written_bytes",
        "Bytes written over the path (moves when a WRITE chunk completes)",
        |c| c.written_bytes,
    ),
    (
        "braid_path_reads",
        "READ chunks completed on the path",
        |c| c.reads,
    ),
    (
        "braid_path_writes",
        "WRITE chunks completed on the path",
        |c| c.writes,
    ),
    (
        "braid_path_other_requests",
        "Other chunks completed (flush, trim, zero, probes)",
        |c| c.others,
    ),
    (
        "braid_path_errors",
        "Chunks the target answered with an error",
        |c| c.errors,
    ),
    (
        "braid_path_failures",
        "Times the path failed (each a failover of its requests)",
        |c| c.failures,
    ),
    (
        "braid_path_restores",
        "Times the path came back after failing (failbacks)",
        |c| c.restores,
    ),
    (
        "braid_path_resent",
        "Chunks moved off the path when it failed",
        |c| c.resent,
    ),
];

/// Per-volume counters.
type VolumeCounter = (
    &'static str,
    &'static str,
    fn(&braid_initiator::engine::VolumeCounters) -> u64,
);

const VOLUME_COUNTERS: &[VolumeCounter] = &[
    (
        "braid_volume_errors_returned",
        "Requests completed with an error to the volume's user",
        |c| c.errors_returned,
    ),
    (
        "braid_volume_eio_returned",
        "Requests completed with EIO (the target's, or no path in time)",
        |c| c.eio_returned,
    ),
    (
        "braid_volume_no_path_timeouts",
        "Requests failed because no path came back within the no-path timeout",
        |c| c.no_path_timeouts,
    ),
    (
        "braid_volume_fences",
        "Fences of failed paths' connections the target confirmed",
        |c| c.fences,
    ),
    (
        "braid_volume_replay_bytes",
        "Bytes given again to restarted targets (the replay window at each restart)",
        |c| c.replay_bytes,
    ),
    (
        "braid_volume_losses",
        "Times the volume was found to have lost acknowledged writes (a restart the replay window could not cover, or a replay that failed)",
        |c| c.losses,
    ),
    (
        "braid_volume_writeback_flushes",
        "FLUSHes braid sent on its own to keep the replay window from filling (for clients that never flush, as VMware does)",
        |c| c.writeback_flushes,
    ),
    (
        "braid_volume_writeback_flush_failures",
        "Of those, the ones that failed (tried again a second later; meanwhile the window may let writes go)",
        |c| c.writeback_failures,
    ),
];

impl Collector for AttachCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let volumes = self.0.snapshot();
        let reports: Vec<_> = volumes.iter().map(|a| (a, a.volume.report())).collect();
        let paths = || {
            reports
                .iter()
                .flat_map(|(a, r)| r.paths.iter().map(move |p| (labels(&a.name, p), p)))
        };
        for (name, help, read) in PATH_COUNTERS {
            let rows: Vec<(Labels, u64)> = paths()
                .map(|(l, p)| (l, read(&p.figures.counters)))
                .collect();
            counters(&mut enc, name, help, &rows)?;
        }
        let gauge_rows = |read: fn(&braid_initiator::PathFigures) -> f64| -> Vec<(Labels, f64)> {
            paths().map(|(l, p)| (l, read(p))).collect()
        };
        gauges(
            &mut enc,
            "braid_path_inflight_requests",
            "Requests in flight on the path",
            &gauge_rows(|p| f64::from(p.figures.inflight_requests)),
        )?;
        gauges(
            &mut enc,
            "braid_path_inflight_bytes",
            "Payload bytes in flight on the path",
            &gauge_rows(|p| p.figures.inflight_bytes as f64),
        )?;
        gauges(
            &mut enc,
            "braid_path_up",
            "1 when the path carries I/O, else 0",
            &gauge_rows(|p| f64::from(u8::from(p.figures.state.name() == "active"))),
        )?;
        gauges(
            &mut enc,
            "braid_path_connections",
            "NBD connections of the path that are up",
            &gauge_rows(|p| p.figures.connections as f64),
        )?;
        let rows: Vec<(Labels, Buckets)> = paths()
            .map(|(l, p)| (l, Buckets::of(&p.figures.latency)))
            .collect();
        histograms(
            &mut enc,
            "braid_path_request_duration_seconds",
            "Time from sending a user's request on the path to its reply (probes excluded)",
            &rows,
        )?;
        let replay_rows = |read: fn(&braid_initiator::ReplayReport) -> u64| -> Vec<(Labels, u64)> {
            reports
                .iter()
                .map(|(a, r)| (vec![("volume", a.name.clone())], read(&r.replay)))
                .collect()
        };
        counters(&mut enc, "braid_volume_replays", "Times a restarted target was given the writes it acknowledged since the last FLUSH again", &replay_rows(|r| r.replays))?;
        counters(&mut enc, "braid_volume_replay_lost_flushes", "FLUSHes and FUA writes failed because acknowledged writes may have been lost, since the loss was found and until it is cleared", &replay_rows(|r| r.lost_flushes))?;
        let rows: Vec<(Labels, f64)> = reports
            .iter()
            .map(|(a, r)| {
                let lost = f64::from(u8::from(r.replay.lost.is_some()));
                (vec![("volume", a.name.clone())], lost)
            })
            .collect();
        gauges(&mut enc, "braid_volume_lost", "1 while acknowledged writes may have been lost and every FLUSH and FUA write fails (until braid clear-loss)", &rows)?;
        let rows: Vec<(Labels, f64)> = reports
            .iter()
            .map(|(a, r)| {
                (
                    vec![("volume", a.name.clone())],
                    r.replay.window_pinned as f64,
                )
            })
            .collect();
        gauges(
            &mut enc,
            "braid_volume_replay_window_bytes",
            "Memory the replay window holds (the buffers its writes keep alive)",
            &rows,
        )?;
        for (name, help, read) in VOLUME_COUNTERS {
            let rows: Vec<(Labels, u64)> = reports
                .iter()
                .map(|(a, r)| (vec![("volume", a.name.clone())], read(&r.counters)))
                .collect();
            counters(&mut enc, name, help, &rows)?;
        }
        let rows: Vec<(Labels, f64)> = reports
            .iter()
            .map(|(a, _)| {
                (
                    vec![("volume", a.name.clone())],
                    a.volume.info().size as f64,
                )
            })
            .collect();
        gauges(
            &mut enc,
            "braid_volume_size_bytes",
            "Size of the volume",
            &rows,
        )
    }
}

fn labels(volume: &str, p: &braid_initiator::PathFigures) -> Labels {
    vec![
        ("volume", volume.to_owned()),
        ("path", p.index.to_string()),
        ("local", p.local.clone()),
        ("portal", p.portal.clone()),
    ]
}
