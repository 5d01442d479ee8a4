//! Metrics of `braid serve`: per export and portal (so dashboards can sum
//! by either), from the live connections and those that have left.

use std::fmt;
use std::sync::Arc;

use braid_store::registry::Registry;
use braid_store::stats::Totals;
use braid_store::Exports;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::{counters, gauges, histograms, Buckets, Labels};

/// Reads the server's figures at each scrape.
pub struct TargetCollector {
    pub registry: Arc<Registry>,
    pub exports: Arc<Exports>,
}

impl fmt::Debug for TargetCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TargetCollector")
    }
}

type Counter = (&'static str, &'static str, fn(&Totals) -> u64);

const COUNTERS: &[Counter] = &[
    (
        "braid_target_read_bytes",
        "Payload bytes read (moves when a READ reply is handed to the writer)",
        |t| t.read_bytes,
    ),
    (
        "braid_target_written_bytes",
        "Payload bytes written (moves when a WRITE reply is handed to the writer)",
        |t| t.written_bytes,
    ),
    (
        "braid_target_reads",
        "READ requests answered successfully",
        |t| t.reads,
    ),
    (
        "braid_target_writes",
        "WRITE requests answered successfully",
        |t| t.writes,
    ),
    (
        "braid_target_other_requests",
        "Other requests answered successfully (flush, trim, zero, cache, block status)",
        |t| t.others,
    ),
    (
        "braid_target_errors",
        "Requests answered with an error",
        |t| t.errors,
    ),
    ("braid_target_connections", "Connections accepted", |t| {
        t.connections
    }),
    (
        "braid_target_fenced_connections",
        "Connections closed by an initiator's fence",
        |t| t.fenced,
    ),
];

impl Collector for TargetCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let live = self.registry.list();
        let totals = self.registry.stats.totals(&live);
        let labels = |(export, portal): &(String, String)| -> Labels {
            vec![("export", export.clone()), ("portal", portal.clone())]
        };
        for (name, help, read) in COUNTERS {
            let rows: Vec<(Labels, u64)> =
                totals.iter().map(|(k, t)| (labels(k), read(t))).collect();
            counters(&mut enc, name, help, &rows)?;
        }
        let open: Vec<(Labels, f64)> = totals
            .iter()
            .map(|(k, _)| {
                let now = live
                    .iter()
                    .filter(|c| {
                        c.portal == k.1
                            && c.export
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .as_deref()
                                .unwrap_or("")
                                == k.0
                    })
                    .count();
                (labels(k), now as f64)
            })
            .collect();
        gauges(
            &mut enc,
            "braid_target_open_connections",
            "Connections open now",
            &open,
        )?;
        let rows: Vec<(Labels, Buckets)> = totals
            .iter()
            .map(|(k, t)| (labels(k), Buckets::of_latencies(&t.flush_latency)))
            .collect();
        histograms(
            &mut enc,
            "braid_target_flush_duration_seconds",
            "Time from a FLUSH reaching the backend to its answer",
            &rows,
        )?;
        let sizes: Vec<(Labels, f64)> = self
            .exports
            .iter()
            .map(|e| (vec![("export", e.name.clone())], e.size() as f64))
            .collect();
        gauges(
            &mut enc,
            "braid_export_size_bytes",
            "Size of the export",
            &sizes,
        )?;
        let failed: Vec<(Labels, f64)> = self
            .exports
            .iter()
            .map(|e| {
                (
                    vec![("export", e.name.clone())],
                    f64::from(u8::from(e.failed())),
                )
            })
            .collect();
        gauges(
            &mut enc,
            "braid_export_failed",
            "1 once a cache flush of the export's storage failed: every FLUSH and FUA write \
             fails with EIO until braid serve is restarted",
            &failed,
        )?;
        super::gateway::encode(&mut enc, &self.exports)
    }
}
