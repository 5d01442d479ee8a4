//! braid's NBD target: exports over backends, served on portals.
//!
//! [`Target`] binds portals and accepts connections; each connection runs
//! the `braid-proto` handshake and then a transmission loop that validates
//! every request once, at the edge, and hands it to the export's
//! [`backend::Backend`]. All connections to an export share one backend, so
//! exports offer CAN_MULTI_CONN. Fencing (`x-braid:fence`) is answered from
//! the connection [`registry::Registry`].

pub mod access;
pub mod backend;
mod conn;
pub mod export;
pub mod forward;
#[cfg(feature = "rbd")]
pub mod gateway;
mod hold;
pub mod identity;
pub mod iscsi;
pub mod lineage;
pub mod portal;
pub mod rangelock;
pub mod registry;
mod server;
pub mod source;
pub mod stats;

pub use conn::{ConnError, Limits};
pub use export::{Export, Exports, PeerFence, Peers, Storage};
pub use forward::{Forward, ForwardFuture, Forwarded};
pub use server::{StopHandle, Target};
