//! braid's storage, whatever the protocol in front of it: exports and the
//! backends their bytes live on (a file, a block device, memory), storage
//! forwarded to a multipath volume, the range lock writers share, volume
//! identities, the portals a server listens on, and the limits it keeps.
//!
//! Every front end (NBD, iSCSI) serves the exports of this crate; none of
//! it speaks a wire protocol of its own.

pub mod access;
pub mod backend;
pub mod export;
pub mod forward;
pub mod identity;
mod limits;
pub mod portal;
pub mod rangelock;
pub mod source;

pub use export::{Export, Exports, PeerFence, Peers, Storage};
pub use forward::{Forward, ForwardFuture, Forwarded};
pub use limits::Limits;
