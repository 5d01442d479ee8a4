//! Turning the shared multipath flags into a volume configuration, and
//! printing what a volume's paths did.

use std::time::Duration;

use anyhow::{Context, Result};
use braid_initiator::{OpenError, Volume, VolumeConfig, VolumeReport, VolumeUri};
use braid_store::source::format_size;

use crate::cli::{MultipathArgs, UsageError};

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// Checks the flags and builds the configuration for `uri`.
pub fn config(uri: &str, args: &MultipathArgs) -> Result<VolumeConfig> {
    let uri: VolumeUri = uri.parse().map_err(usage)?;
    let iscsi = matches!(uri, VolumeUri::Iscsi(_));
    if !iscsi
        && (args.chap_secret_file.is_some()
            || args.initiator_name.is_some()
            || args.persistent_reservations)
    {
        return Err(usage(
            "--chap-secret-file, --initiator-name and --persistent-reservations are for iscsi:// \
             volumes",
        ));
    }
    let mut cfg = VolumeConfig::new(uri);
    if let Some(f) = &args.chap_secret_file {
        cfg.chap = Some(crate::config::chap_credentials(f)?);
    }
    cfg.initiator_name = args.initiator_name.clone();
    cfg.persistent_reservations = args.persistent_reservations;
    // A portal named without a port is on the protocol's own: 3260 for
    // iSCSI, 10809 for NBD.
    let port = if iscsi {
        braid_initiator::iscsi::DEFAULT_PORT
    } else {
        braid_initiator::uri::DEFAULT_PORT
    };
    for p in &args.portals {
        let addr = braid_initiator::uri::resolve_host_port(p, port)
            .map_err(|e| usage(format!("--portal {p:?}: {e}")))?;
        cfg.portals.push(addr);
    }
    cfg.locals = args.locals.clone();
    cfg.paths = args
        .paths
        .iter()
        .map(|r| r.clone().default_port(port))
        .collect();
    if let Some(ca) = &args.tls_ca {
        cfg.tls = Some(crate::tls::client(
            ca,
            args.tls_cert.as_deref(),
            args.tls_key.as_deref(),
        )?);
    }
    cfg.policy = args.policy.map(|p| p.as_str().to_owned());
    if args.connections_per_path == 0 {
        return Err(usage("--connections-per-path must be at least 1"));
    }
    cfg.connections_per_path = Some(args.connections_per_path);
    cfg.replay_window = braid_store::source::parse_size(&args.replay_window)
        .map_err(|e| usage(format!("--replay-window {:?}: {e}", args.replay_window)))?;
    cfg.no_path_timeout = match args.no_path_timeout.as_str() {
        "queue" => None,
        s => Some(Duration::from_secs_f64(
            s.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| {
                    usage(format!(
                        "--no-path-timeout {s:?}: give seconds (0 fails at once) or `queue`"
                    ))
                })?,
        )),
    };
    let secs = |v: f64, flag: &str| -> Result<Duration> {
        if v.is_finite() && v > 0.0 {
            Ok(Duration::from_secs_f64(v))
        } else {
            Err(usage(format!(
                "{flag} must be a positive number of seconds"
            )))
        }
    };
    cfg.timeout_floor = secs(args.timeout_floor, "--timeout-floor")?;
    cfg.timeout_ceiling = secs(args.timeout_ceiling, "--timeout-ceiling")?;
    if cfg.timeout_ceiling < cfg.timeout_floor {
        return Err(usage("--timeout-ceiling is below --timeout-floor"));
    }
    cfg.slow_reply_min = secs(args.slow_reply_min, "--slow-reply-min")?;
    cfg.slow_reply_max = secs(args.slow_reply_max, "--slow-reply-max")?;
    if cfg.slow_reply_max < cfg.slow_reply_min {
        return Err(usage("--slow-reply-max is below --slow-reply-min"));
    }
    Ok(cfg)
}

/// Opens a volume, turning usage mistakes into exit code 2.
pub async fn open(cfg: VolumeConfig) -> Result<Volume> {
    let uri = cfg.uri.to_string();
    match Volume::open(cfg).await {
        Ok(v) => Ok(v),
        Err(OpenError::Usage(m)) => Err(usage(m)),
        Err(e) => Err(e).with_context(|| format!("opening {uri}")),
    }
}

/// Each path's share of the bytes moved, e.g. `path 1 (…) 50.2%`.
pub fn shares(report: &VolumeReport) -> Vec<(String, u64, f64)> {
    let bytes: Vec<u64> = report
        .paths
        .iter()
        .map(|p| p.figures.counters.read_bytes + p.figures.counters.written_bytes)
        .collect();
    let total: u64 = bytes.iter().sum::<u64>().max(1);
    report
        .paths
        .iter()
        .zip(bytes)
        .map(|(p, b)| {
            let name = if p.local == "*" {
                format!("path {} ({})", p.index, p.portal)
            } else {
                format!("path {} ({} → {})", p.index, p.local, p.portal)
            };
            (name, b, b as f64 * 100.0 / total as f64)
        })
        .collect()
}

/// One line per path: bytes and share, for summaries.
pub fn share_lines(report: &VolumeReport) -> Vec<String> {
    shares(report)
        .into_iter()
        .map(|(name, b, pct)| format!("  {name}: {} ({pct:.1}%)", format_size(b)))
        .collect()
}
