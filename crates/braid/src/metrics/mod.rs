//! Prometheus metrics of `braid attach` (per volume and per path) and of
//! `braid serve` (per export and per portal), through `prometheus-client`
//! in the OpenMetrics text format, served at `/metrics` by a deliberately
//! small HTTP responder.
//!
//! The figures live where the work happens (the engine's counters, the
//! target's export statistics); a [`Collector`] reads them at each scrape.
//! Latency histograms have one fixed set of buckets (powers of two
//! microseconds, [`braid_initiator::engine::Histogram::fixed_buckets`]), so
//! a series' `le` labels never change and `histogram_quantile` works.

pub mod attach;
pub mod target;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Label pairs of one series.
pub type Labels = Vec<(&'static str, String)>;

/// Binds `addr` and answers scrapes of `collector` until the process ends.
///
/// # Errors
///
/// The address cannot be bound.
pub async fn serve(addr: SocketAddr, collector: impl Collector) -> Result<()> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector));
    let registry = Arc::new(registry);
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics address {addr}"))?;
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let registry = registry.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                // Read the request head, bounded in size and time.
                let head = tokio::time::timeout(Duration::from_secs(5), async {
                    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
                        let n = stream.read(&mut buf).await.ok()?;
                        if n == 0 {
                            return None;
                        }
                        req.extend_from_slice(&buf[..n]);
                    }
                    Some(())
                })
                .await;
                if !matches!(head, Ok(Some(()))) {
                    return;
                }
                let line = String::from_utf8_lossy(&req);
                let (status, kind, body) =
                    if line.starts_with("GET /metrics ") || line.starts_with("GET / ") {
                        let mut text = String::new();
                        match prometheus_client::encoding::text::encode(&mut text, &registry) {
                            Ok(()) => (
                                "200 OK",
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                                text,
                            ),
                            Err(_) => (
                                "500 Internal Server Error",
                                "text/plain",
                                "encoding the metrics failed\n".to_owned(),
                            ),
                        }
                    } else {
                        ("404 Not Found", "text/plain", "see /metrics\n".to_owned())
                    };
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(resp.as_bytes()).await;
            });
        }
    });
    Ok(())
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
