//! What a gateway tells `--metrics` and `braid status` of each image it
//! writes (through `Peers::figures`): its live peers and its counters.

use std::sync::atomic::Ordering::Relaxed;

use braid_store::peer_figures::{PeerFigures, PeerInfo};

use super::volume::RbdVolume;

impl RbdVolume {
    pub(crate) fn figures_now(&self) -> PeerFigures {
        let c = &self.counters;
        PeerFigures {
            peers: self
                .live()
                .into_iter()
                .map(|e| PeerInfo {
                    addr: e.addr,
                    host: e.host,
                    pid: e.pid,
                    portals: e.portals,
                })
                .collect(),
            joined: self.joined(),
            fences_asked: c.fences_asked.load(Relaxed),
            fences_given: c.fences_given.load(Relaxed),
            blocklists: c.blocklists.load(Relaxed),
            barrier: c.barrier.snapshot(),
            renewal: c.renewal.snapshot(),
        }
    }
}
