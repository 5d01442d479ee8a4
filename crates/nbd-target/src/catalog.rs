//! The store's exports in NBD's words: the transmission flags and sizes
//! the handshake offers, and the catalog one client's handshake consults.

use std::net::IpAddr;

use braid_proto::option::ServerEntry;
use braid_proto::wire::DEFAULT_MAX_PAYLOAD;
use braid_proto::{Catalog, ExportInfo, Refusal, TransmissionFlags};
use braid_store::{Export, Exports};
use tracing::warn;

/// Largest READ or WRITE payload accepted: the spec's interoperable
/// 32 MiB, which also bounds the memory one request can pin.
pub(crate) const MAX_PAYLOAD: u32 = DEFAULT_MAX_PAYLOAD;

/// Transmission flags offered for `e`: what its storage can do. Replies
/// are built here, so DF can always be honoured.
pub(crate) fn flags(e: &Export) -> TransmissionFlags {
    let a = e.storage.abilities();
    let mut f = TransmissionFlags::HAS_FLAGS | TransmissionFlags::SEND_DF;
    for (has, flag) in [
        (a.flush, TransmissionFlags::SEND_FLUSH),
        (a.fua, TransmissionFlags::SEND_FUA),
        (a.cache, TransmissionFlags::SEND_CACHE),
        (a.multi_conn, TransmissionFlags::CAN_MULTI_CONN),
        (a.rotational, TransmissionFlags::ROTATIONAL),
        (a.read_only || e.read_only, TransmissionFlags::READ_ONLY),
    ] {
        if has {
            f |= flag;
        }
    }
    if !e.read_only {
        for (has, flag) in [
            (a.write_zeroes, TransmissionFlags::SEND_WRITE_ZEROES),
            (a.fast_zero, TransmissionFlags::SEND_FAST_ZERO),
            (a.trim, TransmissionFlags::SEND_TRIM),
        ] {
            if has {
                f |= flag;
            }
        }
    }
    TransmissionFlags(f)
}

/// The export as the handshake describes it.
pub(crate) fn info(e: &Export) -> ExportInfo {
    let g = e.storage.geometry();
    ExportInfo {
        name: e.name.clone(),
        description: e.description.clone(),
        size: e.size(),
        flags: flags(e),
        min_block: g.min_block,
        preferred_block: g.preferred_block,
        max_payload: g.max_payload.min(MAX_PAYLOAD),
        volume: Some(e.volume.to_string()),
        peer_portals: e.peers.as_ref().map(|p| p.portals()).unwrap_or_default(),
        instance: e.peers.as_ref().and_then(|p| p.instance()),
    }
}

/// The catalog one client's handshake consults: exports whose allow-list
/// excludes it are refused by policy and left out of listings.
pub(crate) struct PeerCatalog<'a> {
    exports: &'a Exports,
    peer: Option<IpAddr>,
}

impl<'a> PeerCatalog<'a> {
    /// The exports as a client at `peer` sees them (`None`: a local unix
    /// socket client).
    pub(crate) fn new(exports: &'a Exports, peer: Option<IpAddr>) -> Self {
        Self { exports, peer }
    }

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
            Some(e) if e.admits(self.peer) => Ok(info(e)),
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
            .iter()
            .filter(|e| e.admits(self.peer))
            .map(|e| ServerEntry {
                name: e.name.clone(),
                description: e.description.clone(),
            })
            .collect()
    }
}
