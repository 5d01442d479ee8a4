//! Safe bindings to the parts of Ceph's librados and librbd that braid's
//! RBD gateway uses: a cluster connection ([`Cluster`]), a pool
//! ([`IoCtx`]), watches and notifications on an object, an object's
//! attributes compared-and-set atomically and its key/value map, blocklisting, and an image
//! ([`Image`]) with synchronous and asynchronous I/O, its metadata, its
//! effective configuration, and a watcher of changes to it
//! ([`UpdateWatch`]: a resize by another client).
//!
//! The raw declarations are generated at build time by bindgen from the
//! headers of the library that is linked (Debian's librbd-dev and
//! librados-dev), behind the `librbd` feature; without it this crate is
//! empty, so that a workspace build needs no Ceph headers. Every `unsafe`
//! call lives here, each with the invariant that makes it sound.
//!
//! Nothing here decides anything for braid: lease, fencing and gateway
//! logic live in `braid-gateway`'s RBD backend.

#[cfg(feature = "librbd")]
mod compare;
#[cfg(feature = "librbd")]
mod config;
#[cfg(feature = "librbd")]
mod error;
#[cfg(feature = "librbd")]
mod image;
#[cfg(feature = "librbd")]
mod notify_reply;
#[cfg(feature = "librbd")]
mod omap;
#[cfg(feature = "librbd")]
mod rados;
#[cfg(feature = "librbd")]
mod sys;
#[cfg(feature = "librbd")]
mod update;
#[cfg(feature = "librbd")]
mod xattr;

#[cfg(feature = "librbd")]
pub use config::{ConfigOption, ConfigSource};
#[cfg(feature = "librbd")]
pub use error::{Error, Result};
#[cfg(feature = "librbd")]
pub use image::{
    Image, FEATURE_EXCLUSIVE_LOCK, FEATURE_FAST_DIFF, FEATURE_JOURNALING, FEATURE_OBJECT_MAP,
};
#[cfg(feature = "librbd")]
pub use notify_reply::NotifyOutcome;
#[cfg(feature = "librbd")]
pub use rados::{Cluster, ConnectOptions, IoCtx, Notification, Watch};
#[cfg(feature = "librbd")]
pub use update::UpdateWatch;

/// `EBLOCKLISTED`: what librados answers a client the OSDs were told to
/// refuse (Ceph defines it as `ESHUTDOWN`).
pub const EBLOCKLISTED: i32 = libc::ESHUTDOWN;
