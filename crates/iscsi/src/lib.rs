//! iSCSI (RFC 7143) without I/O, for braid's iSCSI target and initiator:
//! PDU framing with CRC32C header and data digests ([`pdu`], [`digest`]),
//! text keys ([`text`]) and the negotiation of a login's operational keys
//! ([`negotiate`]). Like `braid-proto` for NBD, it owns no socket, task or
//! clock: callers feed it bytes and take bytes and PDUs out, and every rule
//! is tested with byte vectors.
//!
//! [`login`] is the target's side of a login (CHAP or none);
//! [`discovery`] answers SendTargets with every portal, and
//! [`text_exchange`] sends a long answer over as many Text Responses as
//! the initiator asks for; [`window`] keeps
//! the command numbering; [`transfer`] cuts READ data into Data-In and
//! gathers WRITE data from immediate data, unsolicited Data-Out and R2Ts.
//! [`initiator`] is the other side: the initiator's login (CHAP and
//! mutual CHAP), its full feature phase, SendTargets answers, the CDBs it
//! sends and the answers it reads.

pub mod access;
pub mod chap;
pub mod digest;
pub mod discovery;
#[doc(hidden)]
pub mod fuzzing;
pub mod initiator;
pub mod login;
pub mod names;
pub mod negotiate;
pub mod pdu;
pub mod text;
pub mod text_exchange;
pub mod transfer;
pub mod window;

/// The SCSI layer moved to its own crate; the initiator's modules still
/// name it through this crate.
pub use braid_scsi as scsi;
pub use digest::Digests;
pub use pdu::{Bhs, FrameError, Framer, Opcode, Pdu, BHS_LEN};

#[cfg(test)]
mod access_tests;
#[cfg(test)]
mod login_limits_tests;
#[cfg(test)]
mod login_tests;
#[cfg(test)]
mod tests;
