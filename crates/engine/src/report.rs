//! What the engine tells its driver and the user about itself: snapshots
//! of paths for reports, and lookups a driver makes while it works.

use std::time::Duration;

use braid_proto::Cookie;

use super::path::Path;
use super::{ChunkInfo, Engine, FenceId, PathId, PathReport, PathState, VolumeCounters};

impl Engine {
    /// A snapshot of one path for reports.
    pub fn path_report(&self, path: PathId, now: Duration) -> PathReport {
        let p = &self.paths[path.0];
        PathReport {
            state: p.reported_state(),
            connections: p.conns.iter().filter(|c| c.up).count(),
            counters: p.counters.clone(),
            inflight_requests: p.inflight_requests(),
            inflight_bytes: p.inflight_bytes(),
            throughput: p.throughput.or_zero(),
            base_latency: Duration::from_secs_f64(p.latency.or_zero()),
            latency: p.latency_hist.clone(),
            latency_10s: p.recent_latency.over(now, Duration::from_secs(10)),
            latency_1m: p.recent_latency.over(now, Duration::from_secs(60)),
            idle: now.saturating_sub(p.last_activity),
            fencing: p.fencing,
            access: p.access,
            config: p.config.clone(),
        }
    }

    /// Whether `fence` is still wanted: it has not been confirmed. It
    /// stays wanted even when the writes it held have timed out, since
    /// until it is confirmed a stale copy of them may still land.
    pub fn fence_pending(&self, fence: FenceId) -> bool {
        self.fences.contains_key(&fence)
    }

    /// Whether new chunks may go to `path` now.
    pub fn path_usable(&self, path: PathId) -> bool {
        self.paths.get(path.0).is_some_and(Path::usable)
    }

    /// The volume's own counters.
    pub fn volume_counters(&self) -> &VolumeCounters {
        &self.counters
    }

    pub fn path_count(&self) -> usize {
        self.paths.len()
    }

    pub fn path_state(&self, path: PathId) -> PathState {
        self.paths[path.0].reported_state()
    }

    /// What the reader of a connection needs to place a reply's data.
    pub fn chunk(&self, cookie: Cookie) -> Option<ChunkInfo> {
        self.chunks.get(&cookie.0).map(|c| ChunkInfo {
            path: PathId(c.path),
            op: c.op,
            len: c.piece.as_ref().map_or(c.bytes as u32, |p| p.len),
            offset: c.piece.as_ref().map_or(0, |p| p.offset),
            req: c.piece.as_ref().map(|p| p.req),
            req_offset: c.piece.as_ref().map_or(0, |p| p.req_offset),
        })
    }
}
