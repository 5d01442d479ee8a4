//! braid's multipath NBD initiator.
//!
//! One [`Volume`] is one export reached over every path a client has to
//! its target. The [`engine`] (the `braid-engine` crate) makes every
//! decision — which path each chunk takes, when a path has failed, what is
//! re-sent and when — without I/O; this crate carries its decisions out
//! with tokio: NBD client connections
//! ([`conn`]), discovery and path pairing ([`discover`]), and the volume
//! driver with its background recovery.

pub mod conn;
pub mod discover;
pub mod iscsi;
pub mod pathrule;
pub mod uri;
mod volume;

pub use braid_engine as engine;

pub use discover::LocalSpec;
pub use engine::{IoError, Op};
pub use iscsi::IscsiUri;
pub use pathrule::{PathAttrs, PathRule};
pub use uri::{Endpoint, NbdUri, VolumeUri};
pub use volume::{
    plan, Done, EventKind, Loss, OpenError, PathFigures, Plan, PolicyError, ReplayReport, Timeline,
    TimelineEvent, Volume, VolumeConfig, VolumeInfo, VolumeReport,
};
