//! The SCSI block commands an iSCSI target answers, without I/O: CDBs in
//! ([`cdb`]), the data describing the unit out ([`respond`]), status and
//! sense ([`sense`]).

pub mod alua;
pub mod attention;
pub mod cdb;
pub mod instance;
pub mod opcodes;
pub mod reserve;
pub mod respond;
pub mod sense;

pub use alua::{AccessState, PortGroup};
pub use attention::{Attentions, Delivery};
pub use cdb::{check_range, Command};
pub use instance::decode_instance_page;
pub use reserve::{NexusName, Refusal, Reservations};
pub use sense::{Key, Sense};

#[cfg(test)]
mod reserve_tests;
#[cfg(test)]
mod tests;
