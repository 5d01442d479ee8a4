//! `braid attach`: the multipath volume as a local NBD export, for the
//! kernel (nbd-client), qemu, nbdfuse and every other NBD client. The
//! front end is the target's own (handshake, validation, replies); each
//! request is forwarded to the volume, which spreads it over the paths.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use braid_initiator::forward::VolumeForward;
use braid_target::portal::Portal;
use braid_target::source::format_size;
use braid_target::{Export, Exports, Limits, Storage, Target};
use tracing::info;

use crate::attached::Attached;
use crate::cli::{AttachArgs, MultipathArgs, UsageError};
use crate::config::{self, AttachFile};
use crate::out::outln;
use crate::rates::{Counts, Rates};
use crate::{control, ctl, metrics, multipath};

/// One volume to attach.
struct Spec {
    name: String,
    uri: String,
    multipath: MultipathArgs,
    socket: PathBuf,
    tcp: Option<SocketAddr>,
}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// Where sockets go by default: `/run/braid` for root, else the runtime
/// directory.
fn socket_dir() -> PathBuf {
    control::dir()
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/braid"))
}

fn specs(args: &AttachArgs, file: &AttachFile) -> Result<Vec<Spec>> {
    let mut out = Vec::new();
    if let Some(uri) = &args.uri {
        let parsed: braid_initiator::NbdUri = uri.parse().map_err(usage)?;
        let name = args.name.clone().unwrap_or_else(|| parsed.export.clone());
        let name = if name.is_empty() {
            "default".into()
        } else {
            name
        };
        let tcp = args
            .tcp
            .as_deref()
            .map(|t| {
                t.parse()
                    .map_err(|_| usage(format!("--tcp {t:?}: expected ADDR:PORT")))
            })
            .transpose()?;
        out.push(Spec {
            socket: args
                .socket
                .clone()
                .unwrap_or_else(|| socket_dir().join(format!("{name}.sock"))),
            name,
            uri: uri.clone(),
            multipath: args.multipath.clone(),
            tcp,
        });
    }
    for v in &file.volumes {
        let parsed: braid_initiator::NbdUri = v.uri.parse().map_err(usage)?;
        let name = v.name.clone().unwrap_or_else(|| parsed.export.clone());
        let tcp = v
            .tcp
            .as_deref()
            .map(|t| {
                t.parse()
                    .map_err(|_| usage(format!("tcp {t:?}: expected ADDR:PORT")))
            })
            .transpose()?;
        out.push(Spec {
            socket: v
                .socket
                .clone()
                .unwrap_or_else(|| socket_dir().join(format!("{name}.sock"))),
            name,
            uri: v.uri.clone(),
            multipath: v.multipath()?,
            tcp,
        });
    }
    if out.is_empty() {
        return Err(usage(
            "nothing to attach: give a URI (braid attach nbd://HOST/EXPORT) or --config FILE",
        ));
    }
    let mut names = std::collections::HashSet::new();
    for s in &out {
        if !names.insert(s.name.clone()) {
            return Err(usage(format!(
                "two volumes are named {:?}; give one of them another name",
                s.name
            )));
        }
        braid_target::source::check_export_name(&s.name).map_err(|e| usage(e.0))?;
    }
    Ok(out)
}

pub fn run(args: AttachArgs) -> Result<()> {
    let file: AttachFile = match &args.config {
        Some(p) => config::load(p)?,
        None => AttachFile::default(),
    };
    let specs = specs(&args, &file)?;
    let configs = specs
        .iter()
        .map(|s| multipath::config(&s.uri, &s.multipath))
        .collect::<Result<Vec<_>>>()?;
    let metrics_addr: Option<SocketAddr> = args
        .metrics
        .as_deref()
        .or(file.metrics.as_deref())
        .map(|m| {
            m.parse()
                .map_err(|_| usage(format!("metrics {m:?}: expected ADDR:PORT")))
        })
        .transpose()?;
    let control_path = args
        .control
        .clone()
        .or(file.control.clone())
        .unwrap_or_else(|| control::default_path("attach"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let signals = crate::signals::Signals::install()?;
        let mut attached = Vec::new();
        let mut exports = Vec::new();
        for (spec, cfg) in specs.iter().zip(configs) {
            let vol = Arc::new(multipath::open(cfg).await?);
            let identity = vol
                .info()
                .identity
                .as_deref()
                .and_then(|i| uuid::Uuid::parse_str(i).ok())
                .unwrap_or_else(uuid::Uuid::new_v4);
            exports.push(Arc::new(Export {
                name: spec.name.clone(),
                description: format!("{} over {} paths", spec.uri, vol.info().paths.len()),
                storage: Storage::Forwarded(Arc::new(VolumeForward(vol.clone()))),
                read_only: false,
                volume: identity,
                allow: Vec::new(),
            }));
            attached.push(Attached {
                name: spec.name.clone(),
                uri: spec.uri.clone(),
                socket: spec.socket.clone(),
                volume: vol,
            });
        }
        let tcp: Vec<Portal> = specs
            .iter()
            .filter_map(|s| s.tcp)
            .map(|addr| Portal { addr, device: None })
            .collect();
        for p in &tcp {
            if !p.addr.ip().is_loopback() {
                return Err(usage(format!(
                    "--tcp {}: only loopback addresses (the volume is not access-controlled here)",
                    p.addr
                )));
            }
        }
        let mut target = Target::bind(Exports::new(exports), &tcp, Limits::default())?;
        for s in &specs {
            if let Some(dir) = s.socket.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            target.bind_unix(&s.socket)?;
            control::set_mode(&s.socket, 0o660);
        }
        let attached = Arc::new(attached);
        let rates = Arc::new(Mutex::new(Rates::default()));
        tokio::spawn(sample(attached.clone(), rates.clone()));
        let handler = handler(attached.clone(), rates.clone());
        let _control = control::serve(&control_path, handler)?;
        if let Some(addr) = metrics_addr {
            metrics::serve(addr, metrics::attach::AttachCollector(attached.clone())).await?;
            info!("metrics on http://{addr}/metrics");
        }
        let devices = free_nbd_devices(Path::new("/sys/block"), attached.len());
        for (a, dev) in attached.iter().zip(devices) {
            print_usage(a, &dev);
        }
        crate::notify::ready(&format!("{} volume(s) attached", attached.len()));
        tokio::spawn(signals.stop_on_signal(target.stop_handle()));
        target.run().await.context("flushing at exit")?;
        for a in attached.iter() {
            a.volume.close().await;
        }
        info!("detached");
        Ok(())
    })
}

/// Kernel NBD devices no one uses, lowest first, one per volume: a device
/// is busy while its `pid` attribute exists (an nbd-client holds it) or
/// its size is not zero. Without the nbd module there are none yet, and
/// `modprobe nbd` makes nbd0 onwards.
fn free_nbd_devices(sys_block: &Path, count: usize) -> Vec<String> {
    let mut devices: Vec<(u32, bool)> = std::fs::read_dir(sys_block)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n: u32 = e.file_name().to_str()?.strip_prefix("nbd")?.parse().ok()?;
            let dir = e.path();
            let size = std::fs::read_to_string(dir.join("size")).unwrap_or_default();
            Some((n, !dir.join("pid").exists() && size.trim() == "0"))
        })
        .collect();
    devices.sort_unstable();
    let mut out: Vec<String> = devices
        .iter()
        .filter(|(_, idle)| *idle)
        .map(|(n, _)| format!("/dev/nbd{n}"))
        .collect();
    // More volumes than free devices (or no module yet): name the ones
    // `modprobe nbd nbds_max=...` would add next.
    let mut next = devices.last().map_or(0, |(n, _)| n + 1);
    while out.len() < count {
        out.push(format!("/dev/nbd{next}"));
        next += 1;
    }
    out.truncate(count);
    out
}

fn print_usage(a: &Attached, device: &str) {
    let info = a.volume.info();
    let sock = a.socket.display();
    outln!(
        "attached {:?}: {} over {} paths, {}",
        a.name,
        format_size(info.size),
        info.paths.len(),
        info.paths.join(", ")
    );
    outln!("  NBD socket: {sock}");
    outln!("  kernel:  nbd-client -unix {sock} {device} -N {}", a.name);
    outln!(
        "  FUSE:    nbdfuse /mnt/{} 'nbd+unix:///{}?socket={sock}'",
        a.name,
        a.name
    );
    outln!(
        "  qemu:    -drive file=nbd+unix:///{}?socket={sock},format=raw",
        a.name
    );
    outln!("  status:  braid status");
}

fn counts(p: &braid_initiator::PathFigures) -> Counts {
    let c = &p.figures.counters;
    Counts {
        read_bytes: c.read_bytes,
        written_bytes: c.written_bytes,
        reads: c.reads,
        writes: c.writes,
    }
}

async fn sample(attached: Arc<Vec<Attached>>, rates: Arc<Mutex<Rates>>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let mut snap = HashMap::new();
        for a in attached.iter() {
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

/// The status of one attached volume, as `braid status --json` shows it.
pub fn volume_status(a: &Attached, rates: &Rates) -> ctl::VolumeStatus {
    let info = a.volume.info();
    let report = a.volume.report();
    let now = Instant::now();
    let paths = report
        .paths
        .iter()
        .map(|p| {
            let f = &p.figures;
            let r = rates.rate(&format!("{}/{}", a.name, p.index), counts(p), now);
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
        replay: report.replay.available,
        replay_window_bytes: report.replay.window_bytes,
        replays: report.replay.replays,
        paths,
    }
}

fn handler(attached: Arc<Vec<Attached>>, rates: Arc<Mutex<Rates>>) -> control::Handler {
    Arc::new(move |req: ctl::Request| {
        let find = |name: &str| attached.iter().find(|a| a.name == name);
        let answer = |ack: ctl::Ack| serde_json::to_value(ack).unwrap_or_default();
        match req {
            ctl::Request::Status => {
                let rates = rates.lock().unwrap_or_else(|p| p.into_inner());
                let status = ctl::Status::Attach {
                    ok: true,
                    pid: std::process::id(),
                    volumes: attached.iter().map(|a| volume_status(a, &rates)).collect(),
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
        }
    })
}

/// A path's knobs as `braid status` and the logs show them.
pub fn knobs(c: &braid_initiator::engine::PathConfig) -> String {
    format!(
        "priority={} weight={} standby={} relative-throughput={} repeat-count={}",
        c.priority,
        c.weight,
        if c.standby { "yes" } else { "no" },
        c.relative_throughput.max(1),
        c.repeat_count
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nbd(dir: &Path, n: u32, size: &str, pid: bool) {
        let d = dir.join(format!("nbd{n}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("size"), size).unwrap();
        if pid {
            std::fs::write(d.join("pid"), "4242\n").unwrap();
        }
    }

    #[test]
    fn the_hint_names_devices_no_one_uses() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path();
        // No nbd module yet: modprobe makes nbd0 onwards.
        assert_eq!(free_nbd_devices(sys, 2), ["/dev/nbd0", "/dev/nbd1"]);
        nbd(sys, 0, "2097152\n", true);
        nbd(sys, 1, "0\n", false);
        nbd(sys, 2, "0\n", true);
        nbd(sys, 3, "0\n", false);
        nbd(sys, 10, "0\n", false);
        std::fs::create_dir_all(sys.join("sda")).unwrap();
        assert_eq!(free_nbd_devices(sys, 1), ["/dev/nbd1"]);
        assert_eq!(
            free_nbd_devices(sys, 4),
            ["/dev/nbd1", "/dev/nbd3", "/dev/nbd10", "/dev/nbd11"]
        );
        // Every device busy: the next one, never a busy one.
        let busy = tempfile::tempdir().unwrap();
        nbd(busy.path(), 0, "0\n", true);
        assert_eq!(free_nbd_devices(busy.path(), 1), ["/dev/nbd1"]);
    }
}
