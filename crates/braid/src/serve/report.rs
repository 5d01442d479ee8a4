//! What a running `braid serve` tells: the control socket's answers
//! (status, ALUA changes) and the per-connection rates behind them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use braid_store::Exports;

use crate::control;
use crate::rates::{Counts, Rates};

fn conn_counts(c: &braid_store::registry::Conn) -> Counts {
    use std::sync::atomic::Ordering::Relaxed;
    Counts {
        read_bytes: c.stats.read_bytes.load(Relaxed),
        written_bytes: c.stats.written_bytes.load(Relaxed),
        reads: c.stats.reads.load(Relaxed),
        writes: c.stats.writes.load(Relaxed),
    }
}

pub(super) async fn sample(
    registry: Arc<braid_store::registry::Registry>,
    rates: Arc<Mutex<Rates>>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let snap = registry
            .list()
            .iter()
            .map(|c| (format!("conn/{}", c.id), conn_counts(c)))
            .collect();
        rates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(Instant::now(), snap);
    }
}

/// Each front end's own figures, read at every status request.
pub(super) type FrontEnds = Arc<dyn Fn() -> crate::ctl::FrontEndStatus + Send + Sync>;

/// The control socket's answers: status for every front end, and ALUA
/// changes for iSCSI's portals (`iscsi`, when served).
pub(super) fn handler(
    registry: Arc<braid_store::registry::Registry>,
    exports: Arc<Exports>,
    portals: Vec<String>,
    iscsi: Option<braid_iscsi_target::IscsiHandle>,
    front_ends: FrontEnds,
    rates: Arc<Mutex<Rates>>,
) -> control::Handler {
    use crate::ctl;
    Arc::new(move |req: ctl::Request| {
        match req {
            ctl::Request::Status => {}
            ctl::Request::Alua { portal, state } => {
                let ack = super::iscsi::set_alua(iscsi.as_ref(), &portal, &state);
                return serde_json::to_value(ack).unwrap_or_default();
            }
            _ => {
                let no = ctl::Ack::refused("braid serve answers op status and alua");
                return serde_json::to_value(no).unwrap_or_default();
            }
        }
        let rates = rates.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let connections = registry
            .list()
            .iter()
            .map(|c| {
                use std::sync::atomic::Ordering::Relaxed;
                let counts = conn_counts(c);
                let r = rates.rate(&format!("conn/{}", c.id), counts, now);
                ctl::ConnStatus {
                    id: c.id.to_string(),
                    peer: c.peer.clone(),
                    portal: c.portal.clone(),
                    export: c.export.lock().unwrap_or_else(|p| p.into_inner()).clone(),
                    read_bytes_per_s: r.read_bytes,
                    write_bytes_per_s: r.written_bytes,
                    read_iops: r.reads,
                    write_iops: r.writes,
                    read_bytes: counts.read_bytes,
                    written_bytes: counts.written_bytes,
                    reads: counts.reads,
                    writes: counts.writes,
                    others: c.stats.others.load(Relaxed),
                    errors: c.stats.errors.load(Relaxed),
                    inflight: c.inflight(),
                }
            })
            .collect();
        let exports = exports
            .iter()
            .map(|e| ctl::ExportStatus {
                name: e.name.clone(),
                description: e.description.clone(),
                size: e.size(),
                read_only: e.read_only,
                identity: e.volume.to_string(),
                peers: crate::status::peers_of(e),
            })
            .collect();
        let status = ctl::Status::Serve {
            ok: true,
            pid: std::process::id(),
            portals: portals.clone(),
            exports,
            connections,
            front_ends: front_ends(),
        };
        serde_json::to_value(status).unwrap_or_default()
    })
}
