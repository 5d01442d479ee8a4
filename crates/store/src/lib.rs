//! braid's storage, whatever the protocol in front of it: exports and the
//! backends their bytes live on (a file, a block device, memory), storage
//! reached elsewhere (a multipath volume), the one [`Storage`] trait over
//! both, the range lock writers share, volume identities, the portals a
//! server listens on, and the limits it keeps.
//!
//! Every front end (NBD, iSCSI) serves the exports of this crate, and runs
//! its operations through the one [`exec`]utor; a copy the server makes
//! itself (SCSI EXTENDED COPY) goes through [`copy`].

pub mod access;
pub mod backend;
mod capabilities;
pub mod compound;
pub mod copy;
pub mod exec;
pub mod export;
pub mod hold;
pub mod identity;
mod limits;
pub mod lineage;
pub mod peer_figures;
pub mod portal;
pub mod rangelock;
pub mod registry;
pub mod shared;
pub mod source;
pub mod stats;
pub mod storage;

pub use capabilities::Capabilities;
pub use export::{Export, Exports, PeerFence, Peers};
pub use limits::Limits;
pub use storage::{Abilities, Done, Finished, Geometry, OnHost, Storage, Submitted};

/// Whether this build has the test hooks (`Registry::hold`,
/// `RangeLock::pause`, the gateway's blocklist switch): only test builds.
pub const TEST_HOOKS: bool = cfg!(feature = "test-hooks");
