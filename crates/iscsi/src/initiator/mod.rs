//! The initiator's side of iSCSI, without I/O: the login as the
//! initiator runs it, with CHAP and mutual CHAP ([`login`]); the full
//! feature phase of a connection — command window, Data-Out with
//! immediate and unsolicited data and R2T answers, Data-In with status,
//! NOP pings, task management, text requests, logout ([`session`]);
//! SendTargets answers read ([`sendtargets`]); the CDBs braid sends
//! ([`cdb`]); what a unit says about itself ([`mod@unit`]) and about its
//! persistent reservations ([`reservation`]); sense data and what it asks
//! of the initiator ([`sense`]).
//!
//! Like the target's side, nothing here owns a socket, a task, a clock or
//! a source of randomness: the driver in `braid-initiator` feeds PDUs in
//! and carries the PDUs and events out.

pub mod cdb;
pub mod login;
pub mod reservation;
pub mod sendtargets;
pub mod sense;
pub mod session;
pub mod unit;
pub mod verdict;
pub mod wire;

pub use login::{InitiatorLogin, Isid, Kind, LoggedIn, LoginConfig, LoginError, Step};
pub use session::{AsyncEvent, Command, Event, Outcome, Session, SessionError, TaskFunction};

#[cfg(test)]
mod login_tests;
#[cfg(test)]
mod session_tests;
#[cfg(test)]
mod unit_tests;
