//! What a SCSI logical unit decides, without I/O: the block commands it
//! answers read from their CDBs ([`cdb`]), the data describing the unit
//! ([`respond`]), status and sense ([`sense`]), the asymmetric access
//! states of its ports ([`alua`], [`ports`]), its reservations
//! ([`reserve`]) and the unit attentions each nexus is owed
//! ([`attention`]), across every nexus of the unit ([`lu`]); the way one
//! command goes through all of it ([`dispatch`]) and what a task
//! management function covers ([`tmf`]); EXTENDED COPY's parameter
//! list and limits ([`xcopy`]), token copy's ([`rod`]), and what both
//! leave for the initiator to ask after ([`held`]). Like `braid-iscsi`
//! for the transport, it owns no socket, task, file or clock; the iSCSI
//! target (`braid-iscsi-target`) moves the bytes and calls the storage.

pub mod alua;
pub mod attention;
mod be;
pub mod cdb;
pub mod dispatch;
pub mod held;
pub mod instance;
pub mod lu;
pub mod opcodes;
pub mod ports;
pub mod reserve;
pub mod respond;
pub mod rod;
pub mod sense;
pub mod tmf;
pub mod xcopy;

pub use alua::{AccessState, PortGroup};
pub use attention::{Attentions, Delivery};
pub use cdb::{check_range, Command};
pub use instance::decode_instance_page;
pub use ports::{AluaError, PortTable};
pub use reserve::{NexusName, Refusal, Reservations};
pub use sense::{Key, Sense};

#[cfg(test)]
mod reserve_tests;
#[cfg(test)]
mod tests;
