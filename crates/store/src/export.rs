//! Exports: a name, a backend, and what clients are told about them; and
//! [`Exports`], the set a server offers, which the handshake consults.

use std::net::IpAddr;
use std::sync::Arc;

use tracing::warn;

use braid_proto::option::ServerEntry;
use braid_proto::wire::DEFAULT_MAX_PAYLOAD;
use braid_proto::{Catalog, ExportInfo, Refusal, TransmissionFlags};
use uuid::Uuid;

use crate::access::{allowed, Network};
use crate::backend::Backend;
use crate::forward::Forward;
use crate::rangelock::RangeLock;

/// Where an export's requests are carried out.
#[derive(Debug, Clone)]
pub enum Storage {
    /// A file, device or memory on this host.
    Local(Arc<dyn Backend>),
    /// Another NBD export (the multipath volume of `braid attach`).
    Forwarded(Arc<dyn Forward>),
}

/// One export as served.
#[derive(Debug)]
pub struct Export {
    pub name: String,
    pub description: String,
    pub storage: Storage,
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
    pub writes: RangeLock,
}

/// A fence of another server's connections, under way.
pub type PeerFence =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// Other servers of one export, which clients use at the same time as this
/// one: what they are told about them, and fencing their connections.
pub trait Peers: Send + Sync + std::fmt::Debug {
    /// Portals of the other live servers, for `x-braid:portal`.
    fn portals(&self) -> Vec<String>;
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
}

impl Export {
    /// Largest READ or WRITE payload accepted: the spec's interoperable
    /// 32 MiB, which also bounds the memory one request can pin.
    pub const MAX_PAYLOAD: u32 = DEFAULT_MAX_PAYLOAD;
    /// Every byte is addressable: file and memory backends need no
    /// read-modify-write.
    pub const MIN_BLOCK: u32 = 1;
    pub const PREFERRED_BLOCK: u32 = 4096;

    /// A local export.
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
            storage: Storage::Local(backend),
            read_only,
            volume,
            allow: Vec::new(),
            peers: None,
            writes: RangeLock::default(),
        }
    }

    /// Whether the export's storage failed a cache flush and fails every
    /// FLUSH and FUA write since (see `backend/durable.rs`).
    pub fn failed(&self) -> bool {
        match &self.storage {
            Storage::Local(b) => b.failed(),
            Storage::Forwarded(_) => false,
        }
    }

    pub fn size(&self) -> u64 {
        match &self.storage {
            Storage::Local(b) => b.size(),
            Storage::Forwarded(f) => f.size(),
        }
    }

    /// Transmission flags offered for this export.
    pub fn flags(&self) -> TransmissionFlags {
        let f = match &self.storage {
            Storage::Local(backend) => {
                let caps = backend.caps();
                let mut f = TransmissionFlags::HAS_FLAGS
                    | TransmissionFlags::SEND_FLUSH
                    | TransmissionFlags::SEND_FUA
                    | TransmissionFlags::SEND_DF
                    | TransmissionFlags::SEND_CACHE
                    // One backend object serves every connection of the
                    // export, so a flush on any connection covers writes
                    // completed on all of them.
                    | TransmissionFlags::CAN_MULTI_CONN;
                if !self.read_only {
                    f |= TransmissionFlags::SEND_WRITE_ZEROES | TransmissionFlags::SEND_FAST_ZERO;
                    if caps.trim {
                        f |= TransmissionFlags::SEND_TRIM;
                    }
                }
                if caps.rotational {
                    f |= TransmissionFlags::ROTATIONAL;
                }
                f
            }
            // What the export behind offers, passed through; replies are
            // built here, so DF can always be honoured.
            Storage::Forwarded(fwd) => {
                fwd.flags().0 | TransmissionFlags::HAS_FLAGS | TransmissionFlags::SEND_DF
            }
        };
        let read_only = if self.read_only {
            TransmissionFlags::READ_ONLY
        } else {
            0
        };
        TransmissionFlags(f | read_only)
    }

    /// The export as the handshake describes it.
    pub fn info(&self) -> ExportInfo {
        let (min_block, preferred_block, max_payload) = match &self.storage {
            Storage::Local(_) => (Self::MIN_BLOCK, Self::PREFERRED_BLOCK, Self::MAX_PAYLOAD),
            Storage::Forwarded(f) => (
                f.min_block(),
                f.preferred_block(),
                f.max_payload().min(Self::MAX_PAYLOAD),
            ),
        };
        ExportInfo {
            name: self.name.clone(),
            description: self.description.clone(),
            size: self.size(),
            flags: self.flags(),
            min_block,
            preferred_block,
            max_payload,
            volume: Some(self.volume.to_string()),
            peer_portals: self.peers.as_ref().map(|p| p.portals()).unwrap_or_default(),
            instance: self.peers.as_ref().and_then(|p| p.instance()),
        }
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

impl Exports {
    /// The exports as a client at `peer` sees them (`None`: a local unix
    /// socket client).
    pub fn for_peer(&self, peer: Option<IpAddr>) -> PeerCatalog<'_> {
        PeerCatalog {
            exports: self,
            peer,
        }
    }
}

/// The catalog one client's handshake consults: exports whose allow-list
/// excludes it are refused by policy and left out of listings.
pub struct PeerCatalog<'a> {
    exports: &'a Exports,
    peer: Option<IpAddr>,
}

impl PeerCatalog<'_> {
    /// Names this client may know of (others are not even named to it).
    fn visible_names(&self) -> String {
        self.list()
            .into_iter()
            .map(|e| e.name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl Catalog for PeerCatalog<'_> {
    fn lookup(&self, name: &str) -> Result<ExportInfo, Refusal> {
        match self.exports.find(name) {
            Some(e) if allowed(&e.allow, self.peer) => Ok(e.info()),
            Some(e) => {
                let peer = self.peer.map_or("?".to_string(), |p| p.to_string());
                warn!(export = %e.name, %peer, "refused: client address not in the export's allow-list");
                Err(Refusal::Policy(format!(
                    "export {:?} is not available to clients at {peer}",
                    e.name
                )))
            }
            None if name.is_empty() => Err(Refusal::Unknown(format!(
                "no default export: this server has several ({}); name one",
                self.visible_names()
            ))),
            None => Err(Refusal::Unknown(format!(
                "no export named {name:?}; this server has: {}",
                self.visible_names()
            ))),
        }
    }

    fn list(&self) -> Vec<ServerEntry> {
        self.exports
            .list
            .iter()
            .filter(|e| allowed(&e.allow, self.peer))
            .map(|e| ServerEntry {
                name: e.name.clone(),
                description: e.description.clone(),
            })
            .collect()
    }
}
