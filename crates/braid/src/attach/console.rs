//! The attach console's source: each volume's status as `braid status
//! --json` has it, with what a page adds (the transport, each path's NIC,
//! ALUA state and share of the bytes, the volume's timeline).

use std::sync::{Arc, Mutex};

use braid_console::model::{AttachView, PathView, ReplayView, VolumeView};
use braid_console::{Action, Snapshot, Source};

use super::report::volume_status;
use crate::attached::Volumes;
use crate::control;
use crate::ctl::Request;
use crate::metrics::Scrape;
use crate::rates::Rates;

/// Rates on the page look back this far, not `braid status`'s five
/// seconds: a chart should show a path's bytes stop as they stop.
const LIVE: std::time::Duration = std::time::Duration::from_secs(1);

pub struct AttachSource {
    pub volumes: Volumes,
    pub rates: Arc<Mutex<Rates>>,
    pub scrape: Scrape,
    /// The control socket's handler: actions go through it.
    pub handler: control::Handler,
}

impl Source for AttachSource {
    fn snapshot(&self) -> Snapshot {
        let rates = self.rates.lock().unwrap_or_else(|p| p.into_inner());
        let volumes = self
            .volumes
            .snapshot()
            .iter()
            .map(|a| {
                let s = volume_status(a, &rates, LIVE);
                let report = a.volume.report();
                let iscsi = a.volume.info().transport == "iscsi";
                let total: f64 = s
                    .paths
                    .iter()
                    .map(|p| p.read_bytes_per_s + p.write_bytes_per_s)
                    .sum();
                let paths = s
                    .paths
                    .iter()
                    .map(|p| {
                        let figures = report.paths.iter().find(|f| f.index == p.index);
                        let moved = p.read_bytes_per_s + p.write_bytes_per_s;
                        PathView {
                            index: p.index,
                            local: p.local.clone(),
                            nic: p.local.split_once('%').map(|(_, nic)| nic.to_owned()),
                            portal: p.portal.clone(),
                            state: p.state.clone(),
                            // NBD has no ALUA: every path reads as optimized there.
                            access: figures
                                .filter(|_| iscsi)
                                .map(|f| f.figures.access.name().to_owned()),
                            connections: p.connections,
                            read_bytes_per_s: p.read_bytes_per_s,
                            write_bytes_per_s: p.write_bytes_per_s,
                            read_iops: p.read_iops,
                            write_iops: p.write_iops,
                            latency_p50_us: p.latency_p50_us,
                            latency_p99_us: p.latency_p99_us,
                            inflight_requests: p.inflight_requests,
                            inflight_bytes: p.inflight_bytes,
                            share: if total > 0.0 { moved / total } else { 0.0 },
                            read_bytes: p.read_bytes,
                            written_bytes: p.written_bytes,
                            errors: p.errors,
                            failures: p.failures,
                            restores: p.restores,
                            config: p.config.clone(),
                            depth_limit: (p.queue_depth > 0).then_some(p.queue_depth),
                        }
                    })
                    .collect();
                VolumeView {
                    name: s.name.clone(),
                    uri: s.uri,
                    identity: s.identity,
                    size: s.size,
                    transport: a.volume.info().transport.to_owned(),
                    policy: s.policy,
                    fencing: s.fencing,
                    replay: ReplayView {
                        available: report.replay.available,
                        window_bytes: report.replay.window_bytes,
                        overflowed: report.replay.overflowed,
                        replays: report.replay.replays,
                        lost_flushes: report.replay.lost_flushes,
                        replaying: report.replay.replaying,
                        lost: report.replay.lost.as_ref().map(|l| l.cause.clone()),
                    },
                    paths,
                    events: (a.volume.timeline().recent().iter())
                        .map(|e| crate::console::event_view(&s.name, e))
                        .collect(),
                }
            })
            .collect();
        Snapshot::Attach(AttachView {
            pid: std::process::id(),
            volumes,
            policies: braid_policy::NAMES
                .iter()
                .map(|n| (*n).to_owned())
                .collect(),
        })
    }

    fn metrics(&self) -> Result<String, String> {
        self.scrape.text()
    }

    fn act(&self, action: &Action) -> Result<String, String> {
        let (req, done) = match action.clone() {
            Action::Policy { volume, policy } => (
                Request::Policy {
                    volume: volume.clone(),
                    policy: policy.clone(),
                },
                format!("{volume}: policy {policy}"),
            ),
            Action::Path {
                volume,
                path,
                enable,
            } => (
                Request::Path {
                    volume: volume.clone(),
                    path,
                    enable: Some(enable),
                    set: None,
                },
                format!(
                    "{volume}: path {path} {}",
                    if enable { "enabled" } else { "drained" }
                ),
            ),
            Action::Alua { .. } => {
                return Err(
                    "braid attach has no iSCSI portals; set ALUA states on the braid serve that has them"
                        .into(),
                )
            }
        };
        crate::console::act(&self.handler, req, done)
    }
}
