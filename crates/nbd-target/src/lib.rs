//! braid's NBD server: the store's exports, served on portals.
//!
//! [`Target`] binds portals and accepts connections; each connection runs
//! the `braid-proto` handshake and then a transmission loop that validates
//! every request once, at the edge, and hands it to the store's executor
//! (on a backend of this host, [`backend::Backend`], with zero-copy
//! replies). Exports are described in NBD's words in `catalog.rs`. Fencing (`x-braid:fence`) is answered from
//! the store's connection registry ([`braid_store::registry::Registry`]).

mod catalog;
mod conn;
mod server;

use braid_store::{backend, export, portal};
pub use conn::ConnError;
pub use server::{Sendfile, StopHandle, Target};

/// What braid's NBD server serves: over TLS when given a certificate,
/// RBD images from several gateways at once (its connections answer the
/// gateways' fences), and every kind of storage, forwarded too.
pub const CAPABILITIES: braid_store::Capabilities = braid_store::Capabilities {
    protocol: "NBD",
    tls: true,
    fenced_across_gateways: true,
    forwarded: true,
    log_target: module_path!(),
};
