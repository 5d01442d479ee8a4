//! `braid serve --iscsi`: the same exports as iSCSI targets, one LUN each,
//! on every portal address. Both protocols share each export's storage, so
//! a SYNCHRONIZE CACHE covers writes made over NBD and a FLUSH covers
//! writes made over iSCSI.
//!
//! The protocol itself is `braid-iscsi`'s (sans-IO); this crate only
//! moves bytes and runs commands through the store's executor, on any
//! kind of storage (a multipath volume of `braid attach` too).

mod answer;
mod budget;
mod cache;
mod command;
mod conn;
mod durable;
mod lu;
mod media;
mod member;
mod out;
mod portids;
mod rod;
mod sessions;
mod slowsave;
mod task;
mod textreq;
mod timers;
mod tmf;
mod unit;
mod unitshared;
mod unitwide;
mod xcopy;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use braid_scsi::{ports, AccessState, Sense};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

use braid_store::export::{Export, Exports};
use braid_store::hold::Hold;
use braid_store::portal::Portal;
use braid_store::{access, backend, export, hold};

/// What braid's iSCSI target serves: no TLS (CHAP authenticates but does
/// not encrypt), sessions that take part in fencing across Ceph gateways
/// (each is in the connection registry a gateway's fence reaches:
/// `member.rs`), and every kind of storage (a multipath volume of `braid
/// attach` as well as this host's).
pub const CAPABILITIES: braid_store::Capabilities = braid_store::Capabilities {
    protocol: "iSCSI",
    tls: false,
    fenced_across_gateways: true,
    forwarded: true,
    log_target: module_path!(),
};

pub use ports::AluaError;
pub use timers::Timers;

/// Target names are this prefix and the export's name.
pub const DEFAULT_IQN_PREFIX: &str = "iqn.2026-11.org.braid-storage:";

/// The target name of the export `export` under `prefix`.
pub fn target_name(prefix: &str, export: &str) -> String {
    format!("{prefix}{}", export.to_ascii_lowercase())
}

/// What the iSCSI side serves.
#[derive(Clone, Debug)]
pub struct IscsiConfig {
    /// Prefix of every target name (`iqn.YYYY-MM.reversed.domain:`).
    pub iqn_prefix: String,
    /// Who may log in, with which CHAP credentials, and which targets
    /// each initiator sees (default: everyone, everything, no CHAP).
    pub access: braid_iscsi::access::Access,
    /// Where persistent reservations that must outlive a restart are
    /// kept (`reservations/<volume identity>`), an initiator's choice
    /// of the write cache (`write-cache/<volume identity>`) and each
    /// portal address's tag (`iscsi-ports`); `None`: in memory only, and
    /// portals tagged in their order.
    pub state_dir: Option<std::path::PathBuf>,
    /// Exports whose units start with the write cache on (WCE 1), for
    /// initiators that send SYNCHRONIZE CACHE; every other unit is
    /// write-through.
    pub write_cache: std::collections::HashSet<String>,
    /// The server's limits: connections in total and per client address,
    /// READ data held per connection and across the server (NBD's and
    /// iSCSI's are counted apart), and the time a login has (the
    /// handshake timeout).
    pub limits: braid_store::Limits,
    /// The process's instance, as NBD reports it (`x-braid:instance`),
    /// answered in VPD page 0xC0.
    pub instance: u128,
    /// Data-Out timeout and NOP-In pings.
    pub timers: Timers,
    /// Where every normal session is registered while it lives, for the
    /// fences that close connections there (a Ceph gateway's: it sets
    /// the ids' tag and cuts, drains and fences them as it does NBD's).
    /// Apart from NBD's registry, so that each protocol's limits and
    /// figures stay its own.
    pub connections: Arc<braid_store::registry::Registry>,
    /// Added to every portal's tag (portal group, relative target port,
    /// target port group): a Ceph gateway's own range among the gateways
    /// of its image, so that no two of them name a port alike.
    pub port_offset: u16,
}

impl Default for IscsiConfig {
    fn default() -> Self {
        Self {
            iqn_prefix: DEFAULT_IQN_PREFIX.to_owned(),
            access: braid_iscsi::access::Access::default(),
            state_dir: None,
            write_cache: std::collections::HashSet::new(),
            limits: braid_store::Limits::default(),
            instance: uuid::Uuid::new_v4().as_u128(),
            timers: Timers::default(),
            connections: Arc::default(),
            port_offset: 0,
        }
    }
}

/// One served target: its name, export and logical unit.
#[derive(Debug)]
pub(crate) struct Served {
    pub name: String,
    pub export: Arc<Export>,
    pub lu: Arc<lu::LogicalUnit>,
}

/// What every connection shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub targets: Vec<Arc<Served>>,
    pub ports: ports::PortTable,
    pub access: Arc<braid_iscsi::access::Access>,
    pub sessions: Arc<sessions::Sessions>,
    pub limits: braid_store::Limits,
    /// READ data held between storage and sockets, bounded by `limits`.
    pub budget: budget::Budget,
    /// The process's instance (VPD page 0xC0).
    pub instance: u128,
    pub timers: Timers,
    /// The registry sessions enter (`member.rs`).
    pub connections: Arc<braid_store::registry::Registry>,
    /// ROD tokens made by POPULATE TOKEN, for any unit's WRITE USING
    /// TOKEN (`rod.rs`).
    pub tokens: braid_scsi::rod::Tokens<Arc<Served>>,
    /// Connections open, by client address.
    clients: Mutex<HashMap<std::net::IpAddr, usize>>,
    /// Test hook: commands of an initiator's sessions wait before the
    /// backend while its hold is set (`IscsiHandle::hold`).
    holds: Mutex<HashMap<String, Arc<Hold>>>,
}

/// A connection counted against the limits; uncounted when dropped.
pub(crate) struct Admitted {
    shared: Arc<Shared>,
    ip: std::net::IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut c = self
            .shared
            .clients
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = c.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.remove(&self.ip);
            }
        }
    }
}

impl Shared {
    /// Counts a new connection from `ip`, unless that would pass a limit
    /// (then which one, for the log).
    fn admit(self: &Arc<Self>, ip: std::net::IpAddr) -> Result<Admitted, &'static str> {
        let mut c = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = c.values().sum();
        if total >= self.limits.max_connections {
            return Err("--max-connections");
        }
        let mine = c.entry(ip).or_default();
        if *mine >= self.limits.max_connections_per_client {
            return Err("--max-connections-per-client");
        }
        *mine += 1;
        Ok(Admitted {
            shared: self.clone(),
            ip,
        })
    }

    /// The hold of sessions of `initiator`.
    pub fn hold_for(&self, initiator: &str) -> Arc<Hold> {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        holds.entry(initiator.to_lowercase()).or_default().clone()
    }
}

/// Bound iSCSI portals, ready to run.
pub struct IscsiServer {
    listeners: Vec<TcpListener>,
    shared: Arc<Shared>,
}

/// A portal as the operator sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortalState {
    pub addr: SocketAddr,
    /// Portal group tag, which is also its target port group and
    /// relative target port id.
    pub tag: u16,
    pub state: AccessState,
}

/// The running iSCSI side, for the operator's controls.
#[derive(Clone, Debug)]
pub struct IscsiHandle {
    shared: Arc<Shared>,
}

impl IscsiHandle {
    /// Bytes of READ data held between storage and the sockets, across
    /// every connection (at most the limits' `max_total_bytes`).
    pub fn payload_in_flight(&self) -> usize {
        self.shared.budget.in_flight()
    }

    /// Target names, in export order.
    pub fn target_names(&self) -> Vec<String> {
        self.shared.targets.iter().map(|t| t.name.clone()).collect()
    }

    /// Every portal with its group and access state.
    pub fn portals(&self) -> Vec<PortalState> {
        self.shared
            .ports
            .iter()
            .map(|p| PortalState {
                addr: p.addr,
                tag: p.tag,
                state: p.state(),
            })
            .collect()
    }

    /// Puts the target port group of `portal` (`ADDR:PORT`) in `state`
    /// and, when that changes it, tells every I_T nexus of every target
    /// with ASYMMETRIC ACCESS STATE CHANGED (SPC-5 5.16.2.2: initiators
    /// then read REPORT TARGET PORT GROUPS again).
    ///
    /// # Errors
    ///
    /// [`AluaError::UnknownPortal`].
    pub fn set_access_state(&self, portal: &str, state: AccessState) -> Result<(), AluaError> {
        let (tag, old) = self.shared.ports.set(portal, state)?;
        if old != state {
            info!(
                portal,
                group = tag,
                from = old.name(),
                to = state.name(),
                "ALUA access state changed"
            );
            for t in &self.shared.targets {
                t.lu.raise(Sense::ACCESS_STATE_CHANGED, None);
            }
        }
        Ok(())
    }
}

#[cfg(any(test, feature = "test-hooks"))]
impl IscsiHandle {
    /// Test hook: while `on`, commands of every session of `initiator`
    /// wait before they reach the backend (as a stuck path would hold
    /// them), so that a test can abort or fence them.
    pub fn hold(&self, initiator: &str, on: bool) {
        self.shared.hold_for(initiator).set(on);
    }

    /// Test hook: while `on`, every save of reservations waits before its
    /// fsync, as on a stalled disk.
    pub fn hold_saves(&self, on: bool) {
        for t in &self.shared.targets {
            t.lu.slow_save.set(on);
        }
    }

    /// Test hook: saves of reservations waiting now.
    pub fn saves_waiting(&self) -> usize {
        self.shared
            .targets
            .iter()
            .map(|t| t.lu.slow_save.waiting())
            .sum()
    }
}

impl IscsiServer {
    /// Binds `portals` (one per portal; a wildcard address stands for
    /// each address of its family a client could reach, as for NBD) for
    /// the exports in `exports` that have local storage.
    ///
    /// # Errors
    ///
    /// The first address that cannot be bound, named in the message.
    pub async fn bind(
        portals: &[Portal],
        exports: &Exports,
        cfg: &IscsiConfig,
    ) -> io::Result<Self> {
        let mut listeners = Vec::new();
        for p in expand(portals)? {
            let l = braid_store::portal::bind(&p)
                .and_then(TcpListener::from_std)
                .map_err(|e| io::Error::new(e.kind(), format!("iSCSI {e}")))?;
            listeners.push(l);
        }
        let addrs: Vec<SocketAddr> = listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let targets: Vec<Arc<Served>> = exports
            .iter()
            .map(|e| {
                let kept = |what: &str| {
                    cfg.state_dir
                        .as_ref()
                        .map(|d| d.join(what).join(e.volume.to_string()))
                };
                let on = cfg.write_cache.contains(&e.name);
                let (cache, origin) = cache::WriteCache::load(kept("write-cache"), on)?;
                let name = target_name(&cfg.iqn_prefix, &e.name);
                log_write_cache(&name, cache.on(), origin);
                let shared = e.peers.as_ref().and_then(|p| p.reservations());
                let lu = Arc::new(lu::LogicalUnit::new(kept("reservations"), cache, shared)?);
                Ok(Arc::new(Served {
                    name,
                    export: e.clone(),
                    lu,
                }))
            })
            .collect::<io::Result<_>>()?;
        for t in &targets {
            unitshared::start(&t.lu).await?;
        }
        Ok(Self {
            listeners,
            shared: Arc::new(Shared {
                targets,
                ports: portids::table(cfg.state_dir.as_deref(), &addrs, cfg.port_offset)?,
                access: Arc::new(cfg.access.clone()),
                sessions: Arc::default(),
                limits: cfg.limits.clone(),
                budget: budget::Budget::new(cfg.limits.max_total_bytes),
                instance: cfg.instance,
                timers: cfg.timers,
                connections: cfg.connections.clone(),
                tokens: braid_scsi::rod::Tokens::default(),
                clients: Mutex::default(),
                holds: Mutex::default(),
            }),
        })
    }

    /// The addresses bound (with the ports the OS chose for port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.shared.ports.iter().map(|p| p.addr).collect()
    }

    /// Target names, in export order.
    pub fn target_names(&self) -> Vec<String> {
        self.handle().target_names()
    }

    /// The handle the operator's controls use.
    pub fn handle(&self) -> IscsiHandle {
        IscsiHandle {
            shared: self.shared.clone(),
        }
    }

    /// Serves until `stop` turns true; connections end with it.
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let mut accepting = JoinSet::new();
        for (l, port) in self.listeners.into_iter().zip(self.shared.ports.iter()) {
            accepting.spawn(accept(l, port.tag, self.shared.clone(), stop.clone()));
        }
        while accepting.join_next().await.is_some() {}
    }
}

/// Says at start what each unit's write cache is, and why.
fn log_write_cache(target: &str, on: bool, origin: cache::Origin) {
    let why = match (on, origin) {
        (_, cache::Origin::Initiator) => "as an initiator set it by MODE SELECT",
        (true, cache::Origin::Operator) => {
            "--iscsi-write-cache: WRITEs are durable once the initiator sends SYNCHRONIZE \
             CACHE, which ESXi never does"
        }
        (false, cache::Origin::Operator) => "write-through: every WRITE durable before GOOD",
    };
    let state = if on { "on" } else { "off" };
    info!(iqn = target, "iSCSI write cache {state} ({why})");
}

/// Wildcard portals replaced by every reachable address of their family
/// (SendTargets must name addresses a client can connect to, and each
/// address is its own port group).
fn expand(portals: &[Portal]) -> io::Result<Vec<Portal>> {
    let mut out: Vec<Portal> = Vec::new();
    for p in portals {
        let found = if p.addr.ip().is_unspecified() {
            let all = braid_netif::addrs().unwrap_or_default();
            let (reachable, _) = braid_netif::reachable(&all);
            let found: Vec<Portal> = reachable
                .iter()
                .filter(|a| a.ip.is_ipv4() == p.addr.is_ipv4())
                .map(|a| Portal {
                    addr: SocketAddr::new(a.ip, p.addr.port()),
                    device: None,
                })
                .collect();
            if found.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrNotAvailable,
                    format!(
                        "iSCSI portal {}: this host has no address of that family a client \
                         could reach; name the addresses to serve on with --listen",
                        p.addr
                    ),
                ));
            }
            found
        } else {
            vec![p.clone()]
        };
        for f in found {
            if !out.iter().any(|o| o.addr == f.addr) {
                out.push(f);
            }
        }
    }
    Ok(out)
}

async fn accept(l: TcpListener, tag: u16, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = l.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                let admitted = match shared.admit(peer.ip()) {
                    Ok(a) => a,
                    Err(limit) => {
                        warn!(%peer, "iSCSI connection refused: {limit} reached");
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                info!(%peer, portal_group = tag, "iSCSI connection");
                let ctx = conn::Ctx {
                    shared: shared.clone(),
                    tag,
                    stop: stop.clone(),
                };
                conns.spawn(async move {
                    conn::serve(stream, peer, ctx).await;
                    drop(admitted);
                });
            }
            Err(e) => {
                warn!("iSCSI accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        while conns.try_join_next().is_some() {}
    }
    // Each connection asks its initiator to log out and ends within a
    // few seconds; their tasks finish with them.
    while conns.join_next().await.is_some() {}
}
