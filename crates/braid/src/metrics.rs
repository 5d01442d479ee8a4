//! Prometheus metrics of attached volumes on `--metrics ADDR:PORT`:
//! counters, gauges and latency histograms per volume and per path,
//! labelled with volume, path, local address and portal (text format
//! 0.0.4, served at `/metrics` by a deliberately small HTTP responder).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::attach::Attached;

/// Binds `addr` and answers scrapes until the process ends.
///
/// # Errors
///
/// The address cannot be bound.
pub async fn serve(addr: SocketAddr, attached: Arc<Vec<Attached>>) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics address {addr}"))?;
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let attached = attached.clone();
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
                let (status, body) =
                    if line.starts_with("GET /metrics ") || line.starts_with("GET / ") {
                        ("200 OK", render(&attached))
                    } else {
                        ("404 Not Found", "see /metrics\n".to_owned())
                    };
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(resp.as_bytes()).await;
            });
        }
    });
    Ok(())
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The metrics text for every attached volume.
pub fn render(attached: &[Attached]) -> String {
    let mut out = String::new();
    let counters: [(&str, &str); 9] = [
        ("braid_path_read_bytes_total", "Bytes read over the path"),
        (
            "braid_path_written_bytes_total",
            "Bytes written over the path",
        ),
        (
            "braid_path_reads_total",
            "READ requests completed on the path",
        ),
        (
            "braid_path_writes_total",
            "WRITE requests completed on the path",
        ),
        (
            "braid_path_other_requests_total",
            "Other requests (flush, trim, zero, probes) completed",
        ),
        (
            "braid_path_errors_total",
            "Requests the target answered with an error",
        ),
        ("braid_path_failures_total", "Times the path failed"),
        (
            "braid_path_restores_total",
            "Times the path came back after failing",
        ),
        (
            "braid_path_resent_total",
            "Requests moved off the path when it failed",
        ),
    ];
    let reports: Vec<_> = attached.iter().map(|a| (a, a.volume.report())).collect();
    for (i, (name, help)) in counters.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter");
        for (a, r) in &reports {
            for p in &r.paths {
                let c = &p.figures.counters;
                let v = [
                    c.read_bytes,
                    c.written_bytes,
                    c.reads,
                    c.writes,
                    c.others,
                    c.errors,
                    c.failures,
                    c.restores,
                    c.resent,
                ][i];
                let _ = writeln!(out, "{name}{{{}}} {v}", labels(&a.name, p));
            }
        }
    }
    let gauges: [(&str, &str); 4] = [
        (
            "braid_path_inflight_requests",
            "Requests in flight on the path",
        ),
        (
            "braid_path_inflight_bytes",
            "Payload bytes in flight on the path",
        ),
        ("braid_path_up", "1 when the path carries I/O, else 0"),
        (
            "braid_path_connections",
            "NBD connections of the path that are up",
        ),
    ];
    for (i, (name, help)) in gauges.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} gauge");
        for (a, r) in &reports {
            for p in &r.paths {
                let f = &p.figures;
                let v = [
                    u64::from(f.inflight_requests),
                    f.inflight_bytes,
                    u64::from(f.state.name() == "active"),
                    f.connections as u64,
                ][i];
                let _ = writeln!(out, "{name}{{{}}} {v}", labels(&a.name, p));
            }
        }
    }
    let name = "braid_path_request_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Time from sending a request on the path to its reply.\n# TYPE {name} histogram"
    );
    for (a, r) in &reports {
        for p in &r.paths {
            let l = labels(&a.name, p);
            let h = &p.figures.latency;
            for (le, n) in h.cumulative() {
                let _ = writeln!(out, "{name}_bucket{{{l},le=\"{le}\"}} {n}");
            }
            let _ = writeln!(out, "{name}_bucket{{{l},le=\"+Inf\"}} {}", h.count());
            let sum = h.sum().as_secs_f64();
            let _ = writeln!(out, "{name}_sum{{{l}}} {sum}");
            let _ = writeln!(out, "{name}_count{{{l}}} {}", h.count());
        }
    }
    let _ = writeln!(
        out,
        "# HELP braid_volume_size_bytes Size of the volume.\n# TYPE braid_volume_size_bytes gauge"
    );
    for (a, r) in &reports {
        let _ = writeln!(
            out,
            "braid_volume_size_bytes{{volume=\"{}\",policy=\"{}\"}} {}",
            esc(&a.name),
            esc(&r.policy),
            a.volume.info().size
        );
    }
    out
}

fn labels(volume: &str, p: &braid_initiator::PathFigures) -> String {
    format!(
        "volume=\"{}\",path=\"{}\",local=\"{}\",portal=\"{}\"",
        esc(volume),
        p.index,
        esc(&p.local),
        esc(&p.portal)
    )
}
