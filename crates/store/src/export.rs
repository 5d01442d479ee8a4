//! Exports: a name, the storage behind it, and who may use it; and
//! [`Exports`], the set a server offers. Each front end says them in its
//! own protocol's words (NBD's handshake in `braid-nbd-target`).

use std::net::IpAddr;
use std::sync::Arc;

use uuid::Uuid;

use crate::access::{allowed, Network};
use crate::backend::Backend;
use crate::rangelock::RangeLock;
use crate::storage::{OnHost, Storage};

/// One export as served.
#[derive(Debug)]
pub struct Export {
    pub name: String,
    pub description: String,
    /// Where its operations are carried out (through [`crate::exec`]).
    pub storage: Arc<dyn Storage>,
    pub read_only: bool,
    /// The `x-braid:volume` identity.
    pub volume: Uuid,
    /// Client networks allowed to use the export; empty allows all.
    pub allow: Vec<Network>,
    /// Other servers of the same export (the gateways of one Ceph image),
    /// when there can be any.
    pub peers: Option<Arc<dyn Peers>>,
    /// Writers in flight by range, whatever protocol they came by:
    /// COMPARE AND WRITE holds its range alone (see [`RangeLock`]).
    pub writes: Arc<RangeLock>,
}

/// A fence of another server's connections, under way.
pub type PeerFence =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// Other servers of one export, which clients use at the same time as this
/// one: what they are told about them, and fencing their connections.
pub trait Peers: Send + Sync + std::fmt::Debug {
    /// Portals of the other live servers, for `x-braid:portal`.
    fn portals(&self) -> Vec<String>;
    /// iSCSI portals of the other live servers with their portal group
    /// tags, for SendTargets.
    fn iscsi_portals(&self) -> Vec<(std::net::SocketAddr, u16)> {
        Vec::new()
    }
    /// What to report as `x-braid:instance` for this export instead of the
    /// process's own: `None` keeps the process's.
    fn instance(&self) -> Option<braid_proto::braid_ns::InstanceId>;
    /// Fences connections this server did not issue; answers only when no
    /// request they received can still reach the storage.
    fn fence(&self, ids: Vec<braid_proto::braid_ns::ConnId>) -> PeerFence;
    /// Whether connection `id` (issued when its transmission begins) may
    /// be served.
    fn admits(&self, id: braid_proto::braid_ns::ConnId) -> bool;
    /// The other servers and this one's fences, for metrics and status;
    /// `None` when it keeps no such figures.
    fn figures(&self) -> Option<crate::peer_figures::PeerFigures> {
        None
    }
    /// The unit's reservations as every server of the export shares them;
    /// `None`: each server keeps its own.
    fn reservations(&self) -> Option<Arc<dyn crate::shared::SharedState>> {
        None
    }
}

impl Export {
    /// An export of a backend on this host.
    pub fn local(
        name: impl Into<String>,
        description: impl Into<String>,
        backend: Arc<dyn Backend>,
        read_only: bool,
        volume: Uuid,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            storage: Arc::new(OnHost(backend)),
            read_only,
            volume,
            allow: Vec::new(),
            peers: None,
            writes: Arc::default(),
        }
    }

    /// Whether the export's storage failed a cache flush and fails every
    /// FLUSH and FUA write since (see `backend/durable.rs`).
    pub fn failed(&self) -> bool {
        self.storage.failed()
    }

    pub fn size(&self) -> u64 {
        self.storage.size()
    }

    /// Whether a client at `peer` (`None`: a local unix socket client)
    /// may use the export.
    pub fn admits(&self, peer: Option<IpAddr>) -> bool {
        allowed(&self.allow, peer)
    }
}

/// The exports a server offers, in the order they were given.
#[derive(Debug, Default, Clone)]
pub struct Exports {
    list: Vec<Arc<Export>>,
}

impl Exports {
    pub fn new(list: Vec<Arc<Export>>) -> Self {
        Self { list }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Export>> {
        self.list.iter()
    }

    /// The export a client means by `name`; `""` means the only export when
    /// there is exactly one.
    pub fn find(&self, name: &str) -> Option<&Arc<Export>> {
        if name.is_empty() && self.list.len() == 1 {
            return self.list.first();
        }
        self.list.iter().find(|e| e.name == name)
    }
}
