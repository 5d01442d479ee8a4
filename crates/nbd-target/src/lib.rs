//! braid's NBD server: the store's exports, served on portals.
//!
//! [`Target`] binds portals and accepts connections; each connection runs
//! the `braid-proto` handshake and then a transmission loop that validates
//! every request once, at the edge, and hands it to the export's
//! [`backend::Backend`]. All connections to an export share one backend, so
//! exports offer CAN_MULTI_CONN. Fencing (`x-braid:fence`) is answered from
//! the store's connection registry ([`braid_store::registry::Registry`]).

mod conn;
mod server;

use braid_store::{backend, export, forward, portal};
pub use conn::ConnError;
pub use server::{StopHandle, Target};
