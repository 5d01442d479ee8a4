//! The serve console's source: `braid status --json`'s view of the server
//! (read through the control socket's own handler), with what a page adds
//! (each portal's NIC and clients, fences given per export, a gateway's
//! peers and lease), and a timeline the server keeps by watching its
//! connections, fences and ALUA states once a second.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use braid_console::model::{ConnView, ExportView, PortalView, ServeView};
use braid_console::{Action, EventView, Snapshot, Source};
use braid_store::registry::Registry;
use braid_store::Exports;
use tokio::sync::broadcast;

use crate::control;
use crate::ctl::{Request, Status};
use crate::metrics::Scrape;

/// Events kept for a page that opens late.
const KEPT: usize = 256;

pub struct ServeSource {
    pub handler: control::Handler,
    pub registry: Arc<Registry>,
    pub exports: Arc<Exports>,
    /// Each NBD portal's address and the NIC it is bound to.
    pub portals: Vec<(String, Option<String>)>,
    /// A Ceph gateway's lease, when an export is an RBD image.
    pub lease: Option<Duration>,
    pub scrape: Scrape,
    pub events: ServeEvents,
}

/// The server's own timeline.
#[derive(Clone)]
pub struct ServeEvents {
    ring: Arc<Mutex<(VecDeque<EventView>, u64)>>,
    pub tx: broadcast::Sender<EventView>,
}

impl Default for ServeEvents {
    fn default() -> Self {
        Self {
            ring: Default::default(),
            tx: broadcast::channel(KEPT).0,
        }
    }
}

impl ServeEvents {
    pub fn record(&self, kind: &str, scope: &str, text: String) {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let ev = EventView {
            scope: scope.to_owned(),
            seq: ring.1,
            at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis() as u64,
            kind: kind.to_owned(),
            path: None,
            text,
            took_ms: None,
        };
        ring.1 += 1;
        if ring.0.len() == KEPT {
            ring.0.pop_front();
        }
        ring.0.push_back(ev.clone());
        let _ = self.tx.send(ev);
    }

    fn recent(&self) -> Vec<EventView> {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        ring.0.iter().cloned().collect()
    }
}

impl ServeSource {
    fn status(&self) -> Option<Status> {
        serde_json::from_value(self.handler.as_ref()(Request::Status)).ok()
    }

    /// Fences given so far, per export (connections that left included).
    fn fences(&self) -> HashMap<String, u64> {
        let live = self.registry.list();
        let mut out: HashMap<String, u64> = HashMap::new();
        for ((export, _), t) in self.registry.stats.totals(&live) {
            *out.entry(export).or_default() += t.fenced;
        }
        out
    }

    /// Watches the server once a second and records what changed: clients
    /// that came and went, fences given, ALUA states set (by the console
    /// or by `braid alua`).
    pub async fn watch(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut conns: HashMap<String, String> = HashMap::new();
        let mut fences = self.fences();
        let mut alua: HashMap<String, String> = HashMap::new();
        let mut first = true;
        loop {
            tick.tick().await;
            let Some(Status::Serve {
                connections,
                front_ends,
                ..
            }) = self.status()
            else {
                continue;
            };
            let iscsi = front_ends.iscsi;
            let now: HashSet<&str> = connections.iter().map(|c| c.id.as_str()).collect();
            for c in &connections {
                if !conns.contains_key(&c.id) && !first {
                    let export = c.export.clone().unwrap_or_default();
                    self.events.record(
                        "conn-open",
                        &export,
                        format!("{} connected to {}", c.peer, c.portal),
                    );
                }
            }
            for (id, what) in &conns {
                if !now.contains(id.as_str()) {
                    self.events
                        .record("conn-closed", "", format!("{what} left"));
                }
            }
            conns = connections
                .iter()
                .map(|c| {
                    let what = format!(
                        "{} ({} on {})",
                        c.peer,
                        c.export.as_deref().unwrap_or("handshake"),
                        c.portal
                    );
                    (c.id.clone(), what)
                })
                .collect();
            let given = self.fences();
            for (export, n) in &given {
                let before = fences.get(export).copied().unwrap_or(0);
                if *n > before {
                    self.events.record(
                        "fence-given",
                        export,
                        format!(
                            "{} connection(s) closed at an initiator's request (its failover)",
                            n - before
                        ),
                    );
                }
            }
            fences = given;
            for p in iscsi.iter().flat_map(|i| &i.portals) {
                let was = alua.insert(p.portal.clone(), p.state.clone());
                if was.as_ref().is_some_and(|w| *w != p.state) {
                    self.events.record(
                        "alua",
                        "",
                        format!("iSCSI portal {} is now {}", p.portal, p.state),
                    );
                }
            }
            first = false;
        }
    }
}

impl Source for ServeSource {
    fn snapshot(&self) -> Snapshot {
        let Some(Status::Serve {
            exports,
            connections,
            front_ends,
            ..
        }) = self.status()
        else {
            return Snapshot::Serve(ServeView::default());
        };
        let clients = |addr: &str| {
            let on: Vec<_> = connections.iter().filter(|c| c.portal == addr).collect();
            (
                on.len(),
                on.iter().map(|c| c.read_bytes_per_s).sum::<f64>(),
                on.iter().map(|c| c.write_bytes_per_s).sum::<f64>(),
            )
        };
        let nic_of = |addr: &str| {
            let ip = addr.rsplit_once(':').map_or(addr, |(ip, _)| ip);
            self.portals
                .iter()
                .find(|(a, _)| a.rsplit_once(':').map_or(a.as_str(), |(i, _)| i) == ip)
                .and_then(|(_, nic)| nic.clone())
        };
        let mut portals: Vec<PortalView> = self
            .portals
            .iter()
            .map(|(addr, nic)| {
                let (n, r, w) = clients(addr);
                PortalView {
                    address: addr.clone(),
                    protocol: "nbd".into(),
                    nic: nic.clone(),
                    group: None,
                    alua: None,
                    connections: n,
                    read_bytes_per_s: r,
                    write_bytes_per_s: w,
                }
            })
            .collect();
        for p in front_ends.iscsi.iter().flat_map(|i| &i.portals) {
            let (n, r, w) = clients(&p.portal);
            portals.push(PortalView {
                address: p.portal.clone(),
                protocol: "iscsi".into(),
                nic: nic_of(&p.portal),
                group: Some(p.group),
                alua: Some(p.state.clone()),
                connections: n,
                read_bytes_per_s: r,
                write_bytes_per_s: w,
            });
        }
        let fences = self.fences();
        let exports = exports
            .into_iter()
            .map(|e| ExportView {
                fences: fences.get(&e.name).copied().unwrap_or(0),
                peers: self
                    .exports
                    .iter()
                    .find(|x| x.name == e.name)
                    .and_then(|x| x.peers.as_ref().map(|p| p.portals())),
                name: e.name,
                identity: e.identity,
                backend: e.description,
                size: e.size,
                read_only: e.read_only,
            })
            .collect();
        let connections = connections
            .into_iter()
            .map(|c| ConnView {
                id: c.id,
                peer: c.peer,
                portal: c.portal,
                export: c.export,
                read_bytes_per_s: c.read_bytes_per_s,
                write_bytes_per_s: c.write_bytes_per_s,
                read_iops: c.read_iops,
                write_iops: c.write_iops,
                inflight: c.inflight,
                errors: c.errors,
            })
            .collect();
        Snapshot::Serve(ServeView {
            pid: std::process::id(),
            portals,
            exports,
            connections,
            gateway_lease_s: self.lease.map(|l| l.as_secs_f64()),
            events: self.events.recent(),
            alua_states: braid_iscsi::scsi::AccessState::ALL
                .iter()
                .map(|s| s.name().to_owned())
                .collect(),
        })
    }

    fn metrics(&self) -> Result<String, String> {
        self.scrape.text()
    }

    fn act(&self, action: &Action) -> Result<String, String> {
        match action.clone() {
            Action::Alua { portal, state } => {
                let done = format!("iSCSI portal {portal}: {state}");
                crate::console::act(&self.handler, Request::Alua { portal, state }, done)
            }
            _ => Err(
                "braid serve has no volumes to steer; switch policies and drain paths on the \
                 braid attach that has the volume"
                    .into(),
            ),
        }
    }
}

/// Starts the console and metrics listener: HTTPS with the server's
/// certificate when it has one (browsers bring no client certificate, so
/// none is asked for here).
pub(super) async fn start(
    http: &crate::console::Http,
    cfg: &super::ServeConfig,
    target: &braid_nbd_target::Target,
    portals: &[braid_store::portal::Portal],
    handler: control::Handler,
) -> anyhow::Result<()> {
    let tls = match &cfg.tls {
        Some((cert, key, _)) => Some(crate::tls::server(cert, key, None)?),
        None => None,
    };
    let exports = target.exports();
    let gateway = exports.iter().any(|e| e.peers.is_some());
    let source = Arc::new(ServeSource {
        handler,
        registry: target.registry(),
        exports: exports.clone(),
        portals: portals
            .iter()
            .zip(target.local_addrs())
            .map(|(p, a)| (a.to_string(), p.device.clone()))
            .collect(),
        lease: gateway.then_some(cfg.ceph.lease),
        scrape: crate::metrics::Scrape::new(crate::metrics::target::TargetCollector {
            registry: target.registry(),
            exports,
        }),
        events: ServeEvents::default(),
    });
    tokio::spawn(source.clone().watch());
    let events = source.events.tx.clone();
    crate::console::start(http, tls, source, events).await
}
