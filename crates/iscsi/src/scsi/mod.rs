//! The SCSI block commands an iSCSI target answers, without I/O: CDBs in
//! ([`cdb`]), status and sense out ([`sense`]).

pub mod cdb;
pub mod sense;

pub use cdb::{check_range, Command};
pub use sense::{Key, Sense};

#[cfg(test)]
mod tests;
