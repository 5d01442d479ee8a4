//! `braid serve --iscsi`: the same exports as iSCSI targets, one LUN each,
//! on every portal address. Both protocols share each export's backend, so
//! a SYNCHRONIZE CACHE covers writes made over NBD and a FLUSH covers
//! writes made over iSCSI.
//!
//! The protocol itself is `braid-iscsi`'s (sans-IO); this module only
//! moves bytes and calls the backend. Exports forwarded to another server
//! (braid attach) are not offered over iSCSI.

mod conn;
mod unit;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::export::{Export, Exports, Storage};

/// Target names are this prefix and the export's name.
pub const DEFAULT_IQN_PREFIX: &str = "iqn.2026-11.org.braid-storage:";

/// What the iSCSI side serves.
#[derive(Clone, Debug)]
pub struct IscsiConfig {
    /// Prefix of every target name (`iqn.YYYY-MM.reversed.domain:`).
    pub iqn_prefix: String,
    /// CHAP credentials every login must prove (`None`: no
    /// authentication).
    pub chap: Option<braid_iscsi::chap::Credentials>,
}

impl Default for IscsiConfig {
    fn default() -> Self {
        Self {
            iqn_prefix: DEFAULT_IQN_PREFIX.to_owned(),
            chap: None,
        }
    }
}

/// One served target: its name and export.
#[derive(Clone, Debug)]
pub(crate) struct Served {
    pub name: String,
    pub export: Arc<Export>,
}

/// Bound iSCSI portals, ready to run.
pub struct IscsiServer {
    listeners: Vec<TcpListener>,
    chap: Option<Arc<braid_iscsi::chap::Credentials>>,
    targets: Arc<Vec<Served>>,
    portals: Arc<Vec<SocketAddr>>,
}

impl IscsiServer {
    /// Binds `addrs` (one per portal) for the exports in `exports` that
    /// have local storage.
    ///
    /// # Errors
    ///
    /// The first address that cannot be bound, named in the message.
    pub async fn bind(
        addrs: &[SocketAddr],
        exports: &Exports,
        cfg: &IscsiConfig,
    ) -> io::Result<Self> {
        let mut listeners = Vec::new();
        for a in addrs {
            let l = TcpListener::bind(a)
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("iSCSI portal {a}: {e}")))?;
            listeners.push(l);
        }
        let portals: Vec<SocketAddr> = listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let targets: Vec<Served> = exports
            .iter()
            .filter(|e| matches!(e.storage, Storage::Local(_)))
            .map(|e| Served {
                name: format!("{}{}", cfg.iqn_prefix, e.name.to_ascii_lowercase()),
                export: e.clone(),
            })
            .collect();
        Ok(Self {
            listeners,
            chap: cfg.chap.clone().map(Arc::new),
            targets: Arc::new(targets),
            portals: Arc::new(portals),
        })
    }

    /// The addresses bound (with the ports the OS chose for port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.portals.as_ref().clone()
    }

    /// Target names, in export order.
    pub fn target_names(&self) -> Vec<String> {
        self.targets.iter().map(|t| t.name.clone()).collect()
    }

    /// Serves until `stop` turns true; connections end with it.
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let mut accepting = JoinSet::new();
        for (i, l) in self.listeners.into_iter().enumerate() {
            let (targets, portals, stop) =
                (self.targets.clone(), self.portals.clone(), stop.clone());
            let chap = self.chap.clone();
            // Relative target port ids count from 1.
            let port_id = u16::try_from(i + 1).unwrap_or(u16::MAX);
            accepting.spawn(accept(l, port_id, targets, portals, chap, stop));
        }
        while accepting.join_next().await.is_some() {}
    }
}

async fn accept(
    l: TcpListener,
    port_id: u16,
    targets: Arc<Vec<Served>>,
    portals: Arc<Vec<SocketAddr>>,
    chap: Option<Arc<braid_iscsi::chap::Credentials>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = l.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                info!(%peer, port = port_id, "iSCSI connection");
                let ctx = conn::Ctx {
                    targets: targets.clone(),
                    portals: portals.clone(),
                    port_id,
                    chap: chap.clone(),
                    stop: stop.clone(),
                };
                conns.spawn(conn::serve(stream, peer, ctx));
            }
            Err(e) => {
                warn!("iSCSI accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        while conns.try_join_next().is_some() {}
    }
    conns.shutdown().await;
}
