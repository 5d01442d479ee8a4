//! `braid doctor`: finds what holds a host's paths and disks back, and says
//! how to fix it.
//!
//! Checks are functions over what was read: the reading goes through a
//! [`Root`] (the live `/` or a captured tree of `/sys` and `/proc`, so the
//! fixtures in `fixtures/` stand in for hardware this kernel cannot make),
//! and each check turns the values into [`Finding`]s with the evidence
//! (value and where it was read), why it matters for multipath storage, and
//! the command that fixes it. Nothing here changes the host: fixes are text
//! until the caller runs them ([`apply`]).
//!
//! What each part reads:
//!
//! | part | reads |
//! |---|---|
//! | [`export`] | `/proc/self/mountinfo` |
//! | [`block`] | `/sys/block/X/{dev,slaves/,queue/*,device/queue_depth,device/scsi_disk/*/cache_type}` |
//! | [`md`] | `/sys/block/mdX/md/*`, `/proc/mdstat`, `/proc/meminfo` |
//! | [`nic`] | `/sys/class/net/IF/{speed,duplex,operstate,mtu,device,bonding/*}`, `/proc/net/bonding/*` |

pub mod apply;
pub mod block;
pub mod export;
pub mod finding;
pub mod md;
pub mod nic;
pub mod parse;
pub mod render;
pub mod root;
pub mod serve;
pub mod units;

pub use export::ExportRef;
pub use finding::{Evidence, Finding, Fix, Report, Severity, Subject};
pub use root::Root;
pub use serve::ServeScope;
