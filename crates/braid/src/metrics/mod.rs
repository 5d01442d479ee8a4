//! Prometheus metrics of `braid attach` (per volume and per path) and of
//! `braid serve` (per export and per portal), through `prometheus-client`
//! in the OpenMetrics text format, served at `/metrics` by the daemon's
//! HTTP listener (`braid-console`).
//!
//! The figures live where the work happens (the engine's counters, the
//! target's export statistics); a [`Collector`] reads them at each scrape.
//! Latency histograms have one fixed set of buckets (powers of two
//! microseconds, [`braid_initiator::engine::Histogram::fixed_buckets`]), so
//! a series' `le` labels never change and `histogram_quantile` works.

pub mod attach;
pub mod gateway;
pub mod target;

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Label pairs of one series.
pub type Labels = Vec<(&'static str, String)>;

/// A registry holding one collector: what `/metrics` answers.
pub struct Scrape(Registry);

impl Scrape {
    pub fn new(collector: impl Collector) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(collector));
        Self(registry)
    }

    /// The OpenMetrics text of every figure now.
    ///
    /// # Errors
    ///
    /// A collector could not encode its figures.
    pub fn text(&self) -> Result<String, String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.0)
            .map_err(|e| format!("encoding the metrics: {e}"))?;
        Ok(text)
    }
}

/// One counter family: `name` gets `_total` in the exposition.
pub fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, u64)],
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

/// One gauge family.
pub fn gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, f64)],
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

/// A histogram as read at scrape time.
pub struct Buckets {
    pub sum: f64,
    pub count: u64,
    /// (upper edge in seconds, samples below it), cumulative, fixed edges.
    pub cumulative: Vec<(f64, u64)>,
}

impl Buckets {
    pub fn of(h: &braid_initiator::engine::Histogram) -> Self {
        Self {
            sum: h.sum().as_secs_f64(),
            count: h.count(),
            cumulative: h.fixed_buckets(),
        }
    }

    /// A server's histogram (the same fixed edges).
    pub fn of_latencies(l: &braid_store::stats::Latencies) -> Self {
        Self {
            sum: l.sum_us as f64 / 1e6,
            count: l.count(),
            cumulative: l.cumulative(),
        }
    }
}

impl EncodeMetric for Buckets {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        // The encoder wants each bucket's own count; it sums them itself.
        let mut own = Vec::with_capacity(self.cumulative.len() + 1);
        let mut below = 0;
        for (edge, n) in &self.cumulative {
            own.push((*edge, n - below));
            below = *n;
        }
        own.push((f64::INFINITY, self.count - below));
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &own, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// One histogram family.
pub fn histograms(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, Buckets)],
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, h) in rows {
        h.encode(m.encode_family(labels)?)?;
    }
    Ok(())
}
