//! braid's storage, whatever the protocol in front of it: exports and the
//! backends their bytes live on (a file, a block device, memory), storage
//! forwarded to a multipath volume, the range lock writers share, volume
//! identities, the portals a server listens on, and the limits it keeps.
//!
//! Every front end (NBD, iSCSI) serves the exports of this crate, and runs
//! its operations through the one [`exec`]utor.

pub mod access;
pub mod backend;
mod capabilities;
pub mod exec;
pub mod export;
pub mod forward;
pub mod hold;
pub mod identity;
mod limits;
pub mod lineage;
pub mod peer_figures;
pub mod portal;
pub mod rangelock;
pub mod registry;
pub mod source;
pub mod stats;

pub use capabilities::Capabilities;
pub use export::{Export, Exports, PeerFence, Peers, Storage};
pub use forward::{Forward, ForwardFuture, Forwarded};
pub use limits::Limits;

/// Whether this build has the test hooks (`Registry::hold`,
/// `RangeLock::pause`, the gateway's blocklist switch): only test builds.
pub const TEST_HOOKS: bool = cfg!(feature = "test-hooks");
