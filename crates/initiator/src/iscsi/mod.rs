//! iSCSI paths: the tokio side of `braid-iscsi`'s initiator. A path of a
//! volume may be an iSCSI session instead of NBD connections; the engine,
//! the policies, splitting, failover, fencing and replay are the same
//! (the volume's side of an iSCSI path, its `Transport`, is
//! `volume/iscsi/`).
//!
//! - `iscsi://` URIs in libiscsi's form are [`crate::uri::iscsi`];
//! - [`login`]: a login run over a stream;
//! - [`conn`]: a session at work, carrying engine chunks as SCSI commands
//!   and probes as NOP-Out pings;
//! - `chunk`: iSCSI's words in the engine's: an engine chunk as a SCSI
//!   command, an ALUA state as an access, a unit attention as a signal
//!   (what a command's outcome means is `braid_iscsi::initiator::verdict`);
//! - [`open`]: a path opened and its unit identified;
//! - [`discover`]: SendTargets and portal probing;
//! - [`fence`]: which fence a unit gets, and fencing a failed session by
//!   reinstating its ISID (with tgt's LOGICAL UNIT RESET after it);
//! - [`reserve`]: fencing by persistent reservations, when asked for.

mod chunk;
pub mod conn;
pub mod discover;
pub mod fence;
pub mod login;
pub mod open;
pub mod reserve;

pub use crate::uri::iscsi::{IscsiUri, DEFAULT_PORT};
pub(crate) use chunk::{access, signal_of};
pub use conn::Conn;
pub use open::{Opened, SessionConfig};

/// The initiator name braid uses unless told another: the host's
/// open-iscsi name if it has one (so existing ACLs admit braid too), else
/// one made of the host name.
pub fn default_initiator_name() -> String {
    if let Ok(text) = std::fs::read_to_string("/etc/iscsi/initiatorname.iscsi") {
        for line in text.lines() {
            if let Some(name) = line.trim().strip_prefix("InitiatorName=") {
                if !name.is_empty() {
                    return name.trim().to_owned();
                }
            }
        }
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("iqn.2026-11.org.braid-storage:{host}")
}
