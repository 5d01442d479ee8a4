//! braid's multipath NBD initiator.
//!
//! The [`engine`] decides (sans-IO); the rest carries its decisions out
//! with tokio: NBD client connections, paths, discovery, and the
//! [`Volume`] handle callers use.

pub mod engine;
