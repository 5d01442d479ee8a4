//! braid's multipath initiator, over NBD and iSCSI.
//!
//! One [`Volume`] is one export reached over every path a client has to
//! its target. The [`engine`] (the `braid-engine` crate) makes every
//! decision — which path each chunk takes, when a path has failed, what is
//! re-sent and when — without I/O; this crate carries its decisions out
//! with tokio: NBD client connections ([`conn`]), iSCSI sessions
//! ([`iscsi`]), discovery and path pairing ([`discover`]), and the volume
//! driver with its background recovery.
//!
//! The volume speaks no protocol itself: each is one implementation of
//! the volume's `Transport` trait (dial a path, fence a failed one, leave
//! before closing), whose connections are `Link`s (send a chunk, the
//! kernel's figures of the socket, close) and whose readers hand every
//! reply to the one neutral [`sink::Sink`].
//!
//! # Adding a protocol
//!
//! A new initiator-side protocol (NVMe/TCP, say) adds:
//!
//! - `src/nvme/`: its tokio side (dialing and logging in, a connection's
//!   writer and reader, the reader handing replies to [`sink::Sink`]), with
//!   its words mapped to the engine's in one place (as `iscsi/chunk.rs`
//!   does for iSCSI), over its sans-IO crate;
//! - `src/volume/nvme.rs` (or `volume/nvme/`): its `Transport`, `Dialed`
//!   and `Link` implementations, and its `open`, which turns what its
//!   first connection learns into the volume's `Plan`;
//! - `src/uri/nvme.rs`: its URI.
//!
//! and touches:
//!
//! 1. `src/uri/mod.rs`: its `VolumeUri` variant, its scheme in the
//!    parse, its arms in `name` and `Display`;
//! 2. `src/volume/mod.rs`: `mod nvme;` and its arm in `Volume::open`, the
//!    one place a protocol is chosen (and its options in `VolumeConfig`,
//!    if it has any of its own, with their flags in `crates/braid`);
//! 3. `src/lib.rs`: `pub mod nvme;`;
//! 4. `Cargo.toml` (this crate's): its sans-IO crate.
//!
//! The volume's core, recovery, opening, events and reports, the sink, the
//! engine and its simulator do not change.

pub mod conn;
pub mod discover;
pub mod iscsi;
pub mod pathrule;
pub mod sink;
pub mod uri;
mod volume;

pub use braid_engine as engine;

pub use discover::LocalSpec;
pub use engine::{IoError, Op};
pub use iscsi::IscsiUri;
pub use pathrule::{PathAttrs, PathRule};
pub use uri::{Endpoint, NbdUri, VolumeUri};
pub use volume::{
    plan, Done, EventKind, Finish, Loss, OpenError, PathFigures, Plan, PolicyError, ReplayReport,
    Request, Timeline, TimelineEvent, Volume, VolumeConfig, VolumeInfo, VolumeReport,
};
