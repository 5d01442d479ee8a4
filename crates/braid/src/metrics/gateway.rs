//! Metrics of `braid serve` as a Ceph gateway, per export: the image's
//! live gateways, the fences clients asked of this one and the ones it
//! gave, the gateways it blocklisted, and how long its OSD map barriers
//! and lease renewals took. Only exports with other servers (`Peers`)
//! have them; a serve with none exports none of these families.

use std::fmt;

use braid_store::peer_figures::PeerFigures;
use braid_store::stats::Latencies;
use braid_store::Exports;
use prometheus_client::encoding::DescriptorEncoder;

use super::{counters, gauges, histograms, Buckets, Labels};

type Counter = (&'static str, &'static str, fn(&PeerFigures) -> u64);

const COUNTERS: &[Counter] = &[
    (
        "braid_gateway_fences_asked",
        "Fences of another gateway's connections that clients asked of this gateway",
        |f| f.fences_asked,
    ),
    (
        "braid_gateway_fences_given",
        "Fences asked of this gateway that it confirmed (the other gateway blocklisted, \
         every live gateway past the OSD map barrier)",
        |f| f.fences_given,
    ),
    (
        "braid_gateway_blocklists",
        "Gateways this gateway blocklisted, for a client's fence or a lease that ran out",
        |f| f.blocklists,
    ),
];

type Histogram = (&'static str, &'static str, fn(&PeerFigures) -> &Latencies);

const HISTOGRAMS: &[Histogram] = &[
    (
        "braid_gateway_barrier_duration_seconds",
        "Time for every live gateway of the image to confirm the newest OSD map",
        |f| &f.barrier,
    ),
    (
        "braid_gateway_lease_renewal_duration_seconds",
        "Time to write this gateway's lease record in the image",
        |f| &f.renewal,
    ),
];

/// Encodes the gateway families, if any export has other servers.
pub fn encode(enc: &mut DescriptorEncoder, exports: &Exports) -> fmt::Result {
    let figures: Vec<(Labels, PeerFigures)> = exports
        .iter()
        .filter_map(|e| {
            let f = e.peers.as_ref()?.figures()?;
            Some((vec![("export", e.name.clone())], f))
        })
        .collect();
    if figures.is_empty() {
        return Ok(());
    }
    let live: Vec<(Labels, f64)> = figures
        .iter()
        .map(|(l, f)| (l.clone(), f.live() as f64))
        .collect();
    gauges(
        enc,
        "braid_gateway_live_gateways",
        "Gateways of the export's image alive as this one sees them, itself included once it \
         joined",
        &live,
    )?;
    for (name, help, read) in COUNTERS {
        let rows: Vec<(Labels, u64)> = figures.iter().map(|(l, f)| (l.clone(), read(f))).collect();
        counters(enc, name, help, &rows)?;
    }
    for (name, help, read) in HISTOGRAMS {
        let rows: Vec<(Labels, Buckets)> = figures
            .iter()
            .map(|(l, f)| (l.clone(), Buckets::of_latencies(read(f))))
            .collect();
        histograms(enc, name, help, &rows)?;
    }
    Ok(())
}
