//! The full feature phase of one connection, initiator side, without I/O
//! (RFC 7143, "iSCSI PDU" and "Command Numbering and Acknowledging"):
//! commands in, PDUs out; PDUs from the target in, events out.
//!
//! It keeps the command window: a non-immediate command goes out only
//! while its CmdSN is within the target's MaxCmdSN, and waits here, in
//! order, until the target opens the window (so queue depth follows what
//! the target allows, and nothing waits in a kernel). It sends a WRITE's
//! data as the session negotiated it: immediate data in the command, then
//! unsolicited Data-Out up to FirstBurstLength, then Data-Out for each
//! R2T; it checks every Data-In against the command it answers (order,
//! DataSN, bounds) and reads status from a SCSI Response or a final
//! Data-In. NOP-Out pings, answers to the target's NOP-In pings, task
//! management, text requests (SendTargets) and logout complete the set.
//! A target that breaks the protocol gets a [`SessionError`]: the
//! connection must end (ErrorRecoveryLevel 0).
//!
//! Here: the commands and requests going out and the window they wait
//! for; `receive` takes the target's PDUs in; `pdus` builds the PDUs a
//! command goes out as.

mod pdus;
mod receive;

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use self::pdus::command_pdus;
use super::login::LoggedIn;
use super::sense::SenseData;
use crate::negotiate::Params;
use crate::pdu::{Bhs, Opcode, Pdu};
use crate::window::le;

/// The reserved tag: "no task" (ITT) or "no transfer" (TTT).
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// Most text a target may send in answer to one text request (a
/// SendTargets answer of many targets and portals fits easily).
pub const MAX_TEXT: usize = 1 << 20;

/// A SCSI command to send.
#[derive(Clone, Debug)]
pub struct Command {
    pub lun: u64,
    /// The CDB, zero-padded to 16 bytes (longer CDBs need an AHS, which
    /// braid never sends).
    pub cdb: [u8; 16],
    /// Bytes the command reads (Data-In); 0 for none.
    pub read: u32,
    /// Bytes it writes (Data-Out), if any.
    pub write: Option<Bytes>,
}

/// How a command ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The target completed it with this SCSI status.
    Status {
        status: u8,
        sense: Option<SenseData>,
        /// Bytes short of (positive) or beyond (negative) what the command
        /// expected to move.
        residual: i64,
        /// Data-In bytes received for it.
        data_in: u32,
    },
    /// The target could not deliver it to the logical unit (iSCSI
    /// response "target failure").
    TargetFailure { response: u8 },
    /// The target rejected the PDU (RFC 7143, "Reject"): not executed.
    Rejected { reason: u8 },
    /// Ended by task management (ABORT TASK, ABORT TASK SET, LUN RESET)
    /// before the target answered it.
    Aborted,
}

impl Outcome {
    /// GOOD status: the command did what it was asked.
    pub fn is_good(&self) -> bool {
        matches!(self, Self::Status { status: 0, .. })
    }
}

/// Task management functions (RFC 7143, "Task Management Function
/// Request").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskFunction {
    AbortTask = 1,
    AbortTaskSet = 2,
    ClearTaskSet = 4,
    LunReset = 5,
    TargetWarmReset = 6,
}

/// What the target reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// READ data at `offset` in the command's buffer.
    Data { itt: u32, offset: u32, data: Bytes },
    /// A SCSI command ended.
    Complete { itt: u32, outcome: Outcome },
    /// A NOP-Out ping was answered.
    Pong { itt: u32 },
    /// A task management request was answered (0: function complete).
    TaskManagement { itt: u32, response: u8 },
    /// The whole answer to a text request.
    Text { itt: u32, data: Bytes },
    /// Logout answered (0: success); the connection may close.
    Logout { itt: u32, response: u8 },
    /// An asynchronous message (RFC 7143, "Asynchronous Message").
    Async(AsyncEvent),
}

/// Asynchronous messages the initiator must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// A SCSI asynchronous event, with its sense data (a unit attention,
    /// for instance an ALUA state change).
    Scsi { lun: u64, sense: Option<SenseData> },
    /// The target asks for a logout within `seconds`.
    LogoutRequested { seconds: u16 },
    /// The target will drop this connection (or all of the session's).
    Dropping { all: bool },
    /// Another event (renegotiation, vendor-specific): nothing to do.
    Other(u8),
}

/// The target broke the protocol; the connection must end.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("iSCSI protocol error from the target: {0}")]
pub struct SessionError(pub String);

fn err<T>(why: impl Into<String>) -> Result<T, SessionError> {
    Err(SessionError(why.into()))
}

#[derive(Debug)]
enum Kind {
    Scsi(Scsi),
    Nop,
    Tmf {
        function: TaskFunction,
        referenced: u32,
    },
    Text(Vec<u8>),
    Logout,
}

#[derive(Debug)]
struct Scsi {
    cmd: Command,
    /// Given when the command goes out; `None` while it waits for the
    /// window.
    cmd_sn: Option<u32>,
    received: u32,
    data_sn: u32,
    r2t_sn: u32,
}

#[derive(Debug)]
struct Task {
    lun: u64,
    kind: Kind,
}

/// One connection's full feature phase.
#[derive(Debug)]
pub struct Session {
    params: Params,
    cmd_sn: u32,
    exp_stat_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    next_itt: u32,
    tasks: HashMap<u32, Task>,
    /// SCSI commands waiting for the window, oldest first.
    queue: VecDeque<u32>,
    out: VecDeque<Pdu>,
    events: VecDeque<Event>,
}

impl Session {
    /// The session a completed login opened.
    pub fn new(login: &LoggedIn) -> Self {
        Self {
            params: login.params,
            cmd_sn: login.cmd_sn,
            exp_stat_sn: login.exp_stat_sn,
            exp_cmd_sn: login.exp_cmd_sn,
            max_cmd_sn: login.max_cmd_sn,
            next_itt: 1,
            tasks: HashMap::new(),
            queue: VecDeque::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Queues a SCSI command; it goes out as soon as the window allows.
    /// Returns its task tag.
    pub fn submit(&mut self, cmd: Command) -> u32 {
        let itt = self.itt();
        let lun = cmd.lun;
        self.tasks.insert(
            itt,
            Task {
                lun,
                kind: Kind::Scsi(Scsi {
                    cmd,
                    cmd_sn: None,
                    received: 0,
                    data_sn: 0,
                    r2t_sn: 0,
                }),
            },
        );
        self.queue.push_back(itt);
        self.flush_queue();
        itt
    }

    /// Sends a NOP-Out ping (immediate, outside the window); its answer
    /// comes as [`Event::Pong`].
    pub fn ping(&mut self) -> u32 {
        let itt = self.itt();
        self.tasks.insert(
            itt,
            Task {
                lun: 0,
                kind: Kind::Nop,
            },
        );
        let mut b = Bhs::new(Opcode::NopOut);
        b.set_immediate(true);
        b.set_final(true);
        b.set_itt(itt);
        b.set_u32(20, RESERVED_TAG);
        self.push(b, Bytes::new());
        itt
    }

    /// Sends a task management request (immediate). `referenced` names
    /// the task ABORT TASK aborts.
    pub fn task_management(&mut self, function: TaskFunction, lun: u64, referenced: u32) -> u32 {
        let itt = self.itt();
        let ref_cmd_sn = match self.tasks.get(&referenced).map(|t| &t.kind) {
            Some(Kind::Scsi(s)) => s.cmd_sn.unwrap_or(self.cmd_sn),
            _ => self.cmd_sn,
        };
        self.tasks.insert(
            itt,
            Task {
                lun,
                kind: Kind::Tmf {
                    function,
                    referenced,
                },
            },
        );
        let mut b = Bhs::new(Opcode::TaskMgmtRequest);
        b.set_immediate(true);
        b.0[1] = 0x80 | function as u8;
        b.set_lun(lun);
        b.set_itt(itt);
        b.set_u32(20, referenced);
        b.set_u32(32, ref_cmd_sn);
        self.push(b, Bytes::new());
        itt
    }

    /// Sends a text request (immediate), e.g. `SendTargets=All`; a long
    /// answer is gathered here and comes whole as [`Event::Text`].
    pub fn text(&mut self, data: Bytes) -> u32 {
        let itt = self.itt();
        self.tasks.insert(
            itt,
            Task {
                lun: 0,
                kind: Kind::Text(Vec::new()),
            },
        );
        self.text_request(itt, RESERVED_TAG, data);
        itt
    }

    /// Asks to close the session (immediate); the answer comes as
    /// [`Event::Logout`].
    pub fn logout(&mut self) -> u32 {
        let itt = self.itt();
        self.tasks.insert(
            itt,
            Task {
                lun: 0,
                kind: Kind::Logout,
            },
        );
        let mut b = Bhs::new(Opcode::LogoutRequest);
        b.set_immediate(true);
        b.0[1] = 0x80; // reason 0: close the session
        b.set_itt(itt);
        self.push(b, Bytes::new());
        itt
    }

    /// The next PDU to send.
    pub fn poll_transmit(&mut self) -> Option<Pdu> {
        self.out.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// SCSI commands sent and not answered.
    pub fn in_flight(&self) -> usize {
        self.tasks
            .values()
            .filter(|t| matches!(&t.kind, Kind::Scsi(s) if s.cmd_sn.is_some()))
            .count()
    }

    /// SCSI commands waiting for the target's window.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Commands the target accepts now beyond those sent: MaxCmdSN -
    /// CmdSN + 1 (0 when the window is closed).
    pub fn window(&self) -> u32 {
        if le(self.cmd_sn, self.max_cmd_sn) {
            self.max_cmd_sn.wrapping_sub(self.cmd_sn).wrapping_add(1)
        } else {
            0
        }
    }

    /// Sends queued commands while the window allows.
    fn flush_queue(&mut self) {
        while let Some(&itt) = self.queue.front() {
            if !le(self.cmd_sn, self.max_cmd_sn) {
                return;
            }
            self.queue.pop_front();
            let cmd_sn = self.cmd_sn;
            self.cmd_sn = self.cmd_sn.wrapping_add(1);
            let Some(Task {
                kind: Kind::Scsi(s),
                ..
            }) = self.tasks.get_mut(&itt)
            else {
                continue;
            };
            s.cmd_sn = Some(cmd_sn);
            let pdus = command_pdus(itt, cmd_sn, self.exp_stat_sn, &s.cmd, &self.params);
            self.out.extend(pdus);
        }
    }

    fn text_request(&mut self, itt: u32, ttt: u32, data: Bytes) {
        let mut b = Bhs::new(Opcode::TextRequest);
        b.set_immediate(true);
        b.set_final(true);
        b.set_itt(itt);
        b.set_u32(20, ttt);
        self.push(b, data);
    }

    /// Queues an immediate PDU: it carries the next CmdSN without taking
    /// it, and this side's ExpStatSN.
    fn push(&mut self, mut b: Bhs, data: Bytes) {
        b.set_u32(24, self.cmd_sn);
        b.set_u32(28, self.exp_stat_sn);
        self.out.push_back(Pdu::new(b, data));
    }

    fn itt(&mut self) -> u32 {
        loop {
            let itt = self.next_itt;
            self.next_itt = self.next_itt.wrapping_add(1);
            if itt != RESERVED_TAG && itt != 0 && !self.tasks.contains_key(&itt) {
                return itt;
            }
        }
    }
}
