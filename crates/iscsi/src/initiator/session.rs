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

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use super::login::LoggedIn;
use super::sense::SenseData;
use crate::negotiate::Params;
use crate::pdu::{Bhs, Opcode, Pdu};
use crate::window::{le, lt};

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

    /// Handles one PDU from the target.
    ///
    /// # Errors
    ///
    /// [`SessionError`]: the target broke the protocol; end the
    /// connection.
    pub fn receive(&mut self, pdu: Pdu) -> Result<(), SessionError> {
        let op = pdu.bhs.opcode();
        if op.from_initiator() || matches!(op, Opcode::LoginResponse | Opcode::Other(_)) {
            return err(format!("a {op:?} PDU in full feature phase"));
        }
        self.numbers(&pdu.bhs);
        match op {
            Opcode::DataIn => self.data_in(pdu)?,
            Opcode::ScsiResponse => self.scsi_response(&pdu)?,
            Opcode::R2t => self.r2t(&pdu.bhs)?,
            Opcode::NopIn => self.nop_in(&pdu.bhs)?,
            Opcode::TaskMgmtResponse => self.tmf_response(&pdu.bhs)?,
            Opcode::TextResponse => self.text_response(pdu)?,
            Opcode::LogoutResponse => {
                let itt = self.status_pdu(&pdu.bhs, |k| matches!(k, Kind::Logout))?;
                self.tasks.remove(&itt);
                self.events.push_back(Event::Logout {
                    itt,
                    response: pdu.bhs.0[2],
                });
            }
            Opcode::AsyncMessage => self.async_message(&pdu),
            Opcode::Reject => self.reject(&pdu)?,
            _ => unreachable!("initiator opcodes refused above"),
        }
        self.flush_queue();
        Ok(())
    }

    /// ExpCmdSN and MaxCmdSN, which every target PDU carries. A MaxCmdSN
    /// below ExpCmdSN - 1 is invalid and ignored, and neither number ever
    /// moves back (PDUs can overtake each other on the way).
    fn numbers(&mut self, b: &Bhs) {
        let (exp, max) = (b.u32_at(28), b.u32_at(32));
        if lt(max, exp.wrapping_sub(1)) {
            return;
        }
        if lt(self.exp_cmd_sn, exp) {
            self.exp_cmd_sn = exp;
        }
        if lt(self.max_cmd_sn, max) {
            self.max_cmd_sn = max;
        }
    }

    /// A PDU carrying a status: its StatSN is acknowledged, and its ITT
    /// must name a task of the kind `want` accepts.
    fn status_pdu(&mut self, b: &Bhs, want: impl Fn(&Kind) -> bool) -> Result<u32, SessionError> {
        let sn = b.u32_at(24);
        if le(self.exp_stat_sn, sn) {
            self.exp_stat_sn = sn.wrapping_add(1);
        }
        let itt = b.itt();
        match self.tasks.get(&itt) {
            Some(t) if want(&t.kind) => Ok(itt),
            _ => err(format!(
                "a {:?} for task {itt:#x}, which is not one it can answer",
                b.opcode()
            )),
        }
    }

    fn scsi_task(&mut self, itt: u32, what: &str) -> Result<&mut Scsi, SessionError> {
        match self.tasks.get_mut(&itt).map(|t| &mut t.kind) {
            Some(Kind::Scsi(s)) if s.cmd_sn.is_some() => Ok(s),
            _ => err(format!(
                "{what} for task {itt:#x}, which has no command out"
            )),
        }
    }

    fn data_in(&mut self, pdu: Pdu) -> Result<(), SessionError> {
        let b = pdu.bhs;
        let itt = b.itt();
        let flags = b.0[1];
        let status = flags & 0x01 != 0;
        let s = self.scsi_task(itt, "Data-In")?;
        let (offset, len) = (b.u32_at(40), pdu.data.len() as u32);
        if b.u32_at(36) != s.data_sn {
            return err(format!(
                "Data-In DataSN {} where {} was next",
                b.u32_at(36),
                s.data_sn
            ));
        }
        // DataPDUInOrder and DataSequenceInOrder are Yes: contiguous.
        if offset != s.received {
            return err(format!(
                "Data-In at offset {offset} where {} was next",
                s.received
            ));
        }
        if u64::from(offset) + u64::from(len) > u64::from(s.cmd.read) {
            return err(format!(
                "Data-In of {len} bytes at {offset} runs past the {} the command reads",
                s.cmd.read
            ));
        }
        s.data_sn = s.data_sn.wrapping_add(1);
        s.received += len;
        let data_in = s.received;
        if len > 0 {
            self.events.push_back(Event::Data {
                itt,
                offset,
                data: pdu.data,
            });
        }
        if status {
            if flags & 0x80 == 0 {
                return err("Data-In with status but without the F bit");
            }
            self.status_pdu(&b, |k| matches!(k, Kind::Scsi(_)))?;
            self.tasks.remove(&itt);
            self.events.push_back(Event::Complete {
                itt,
                outcome: Outcome::Status {
                    status: b.0[3],
                    sense: None,
                    residual: residual(flags, b.u32_at(44)),
                    data_in,
                },
            });
        }
        Ok(())
    }

    fn scsi_response(&mut self, pdu: &Pdu) -> Result<(), SessionError> {
        let b = &pdu.bhs;
        let itt = self.status_pdu(b, |k| matches!(k, Kind::Scsi(s) if s.cmd_sn.is_some()))?;
        let Some(Task {
            kind: Kind::Scsi(s),
            ..
        }) = self.tasks.remove(&itt)
        else {
            unreachable!("checked by status_pdu")
        };
        let outcome = if b.0[2] != 0 {
            Outcome::TargetFailure { response: b.0[2] }
        } else {
            // The data segment: SenseLength, then sense data.
            let sense = match pdu.data.len() {
                0 => None,
                1 => return err("a one-byte SCSI Response data segment"),
                n => {
                    let want = usize::from(u16::from_be_bytes([pdu.data[0], pdu.data[1]]));
                    if 2 + want > n {
                        return err(format!("SenseLength {want} in a {n}-byte data segment"));
                    }
                    SenseData::parse(&pdu.data[2..2 + want])
                }
            };
            Outcome::Status {
                status: b.0[3],
                sense,
                residual: residual(b.0[1], b.u32_at(44)),
                data_in: s.received,
            }
        };
        self.events.push_back(Event::Complete { itt, outcome });
        Ok(())
    }

    fn r2t(&mut self, b: &Bhs) -> Result<(), SessionError> {
        let itt = b.itt();
        let max_pdu = self.params.peer_max_recv_data.max(512);
        let exp_stat_sn = self.exp_stat_sn;
        let s = self.scsi_task(itt, "R2T")?;
        let Some(data) = s.cmd.write.clone() else {
            return err(format!("R2T for task {itt:#x}, which writes nothing"));
        };
        let (ttt, offset, len) = (b.u32_at(20), b.u32_at(40), b.u32_at(44));
        if b.u32_at(36) != s.r2t_sn {
            return err(format!(
                "R2TSN {} where {} was next",
                b.u32_at(36),
                s.r2t_sn
            ));
        }
        if ttt == RESERVED_TAG || len == 0 || u64::from(offset) + u64::from(len) > data.len() as u64
        {
            return err(format!(
                "R2T for {len} bytes at {offset} of a {}-byte write (tag {ttt:#x})",
                data.len()
            ));
        }
        s.r2t_sn = s.r2t_sn.wrapping_add(1);
        let lun = s.cmd.lun;
        let pdus = data_out(
            itt,
            lun,
            ttt,
            &data,
            offset,
            offset + len,
            max_pdu,
            exp_stat_sn,
        );
        self.out.extend(pdus);
        Ok(())
    }

    fn nop_in(&mut self, b: &Bhs) -> Result<(), SessionError> {
        let itt = b.itt();
        if itt != RESERVED_TAG {
            self.status_pdu(b, |k| matches!(k, Kind::Nop))?;
            self.tasks.remove(&itt);
            self.events.push_back(Event::Pong { itt });
            return Ok(());
        }
        let ttt = b.u32_at(20);
        if ttt != RESERVED_TAG {
            // The target pings: answer with its tag (RFC 7143, "NOP-In").
            let mut r = Bhs::new(Opcode::NopOut);
            r.set_immediate(true);
            r.set_final(true);
            r.set_lun(b.lun());
            r.set_itt(RESERVED_TAG);
            r.set_u32(20, ttt);
            self.push(r, Bytes::new());
        }
        Ok(())
    }

    fn tmf_response(&mut self, b: &Bhs) -> Result<(), SessionError> {
        let itt = self.status_pdu(b, |k| matches!(k, Kind::Tmf { .. }))?;
        let Some(Task {
            lun,
            kind: Kind::Tmf {
                function,
                referenced,
            },
        }) = self.tasks.remove(&itt)
        else {
            unreachable!("checked by status_pdu")
        };
        let response = b.0[2];
        // Function complete, or (ABORT TASK) the task no longer exists:
        // commands the function covered get no answer of their own.
        if response == 0 || (response == 1 && function == TaskFunction::AbortTask) {
            let ended: Vec<u32> = self
                .tasks
                .iter()
                .filter(|(k, t)| match (&t.kind, function) {
                    (Kind::Scsi(s), TaskFunction::AbortTask) => {
                        **k == referenced && s.cmd_sn.is_some()
                    }
                    (Kind::Scsi(s), TaskFunction::TargetWarmReset) => s.cmd_sn.is_some(),
                    (Kind::Scsi(s), _) => t.lun == lun && s.cmd_sn.is_some(),
                    _ => false,
                })
                .map(|(k, _)| *k)
                .collect();
            for k in ended {
                self.tasks.remove(&k);
                self.events.push_back(Event::Complete {
                    itt: k,
                    outcome: Outcome::Aborted,
                });
            }
        }
        self.events
            .push_back(Event::TaskManagement { itt, response });
        Ok(())
    }

    fn text_response(&mut self, pdu: Pdu) -> Result<(), SessionError> {
        let b = pdu.bhs;
        let itt = self.status_pdu(&b, |k| matches!(k, Kind::Text(_)))?;
        let Some(Task {
            kind: Kind::Text(buf),
            ..
        }) = self.tasks.get_mut(&itt)
        else {
            unreachable!("checked by status_pdu")
        };
        if buf.len() + pdu.data.len() > MAX_TEXT {
            return err(format!("a text answer longer than {MAX_TEXT} bytes"));
        }
        buf.extend_from_slice(&pdu.data);
        let (fin, more) = (b.0[1] & 0x80 != 0, b.0[1] & 0x40 != 0);
        if fin && more {
            return err("a Text Response with both F and C set");
        }
        if fin {
            let data = Bytes::from(std::mem::take(buf));
            self.tasks.remove(&itt);
            self.events.push_back(Event::Text { itt, data });
        } else {
            // More follows when asked with an empty request and its tag.
            self.text_request(itt, b.u32_at(20), Bytes::new());
        }
        Ok(())
    }

    fn async_message(&mut self, pdu: &Pdu) {
        let b = &pdu.bhs;
        let sn = b.u32_at(24);
        if le(self.exp_stat_sn, sn) {
            self.exp_stat_sn = sn.wrapping_add(1);
        }
        let event = match b.0[36] {
            0 => {
                let d = &pdu.data;
                let sense = (d.len() >= 2)
                    .then(|| usize::from(u16::from_be_bytes([d[0], d[1]])))
                    .and_then(|n| d.get(2..2 + n))
                    .and_then(SenseData::parse);
                AsyncEvent::Scsi {
                    lun: b.lun(),
                    sense,
                }
            }
            1 => AsyncEvent::LogoutRequested {
                seconds: u16::from_be_bytes([b.0[42], b.0[43]]),
            },
            2 => AsyncEvent::Dropping { all: false },
            3 => AsyncEvent::Dropping { all: true },
            other => AsyncEvent::Other(other),
        };
        self.events.push_back(Event::Async(event));
    }

    fn reject(&mut self, pdu: &Pdu) -> Result<(), SessionError> {
        let b = &pdu.bhs;
        let sn = b.u32_at(24);
        if le(self.exp_stat_sn, sn) {
            self.exp_stat_sn = sn.wrapping_add(1);
        }
        let reason = b.0[2];
        let Some(header) = pdu.data.get(..crate::BHS_LEN) else {
            return err(format!(
                "Reject (reason {reason:#x}) without the rejected header"
            ));
        };
        let itt = u32::from_be_bytes(header[16..20].try_into().expect("four bytes"));
        let opcode = Opcode::from_byte(header[0]);
        // A rejected command, ping or request is over; a rejected Data-Out
        // or NOP-Out answer leaves its task waiting, and nothing braid
        // sends can be fixed by sending it again the same way.
        match (opcode, self.tasks.get(&itt).map(|t| &t.kind)) {
            (Opcode::ScsiCommand, Some(Kind::Scsi(_))) => {
                self.tasks.remove(&itt);
                self.events.push_back(Event::Complete {
                    itt,
                    outcome: Outcome::Rejected { reason },
                });
                Ok(())
            }
            _ => err(format!(
                "the target rejected a {opcode:?} PDU (reason {reason:#04x})"
            )),
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

/// Residual from a response's flags: O (0x04) overflow, U (0x02)
/// underflow.
fn residual(flags: u8, count: u32) -> i64 {
    if flags & 0x02 != 0 {
        i64::from(count)
    } else if flags & 0x04 != 0 {
        -i64::from(count)
    } else {
        0
    }
}

/// A SCSI Command PDU and the unsolicited Data-Out that follows it:
/// immediate data up to FirstBurstLength and the target's
/// MaxRecvDataSegmentLength, and, without InitialR2T, Data-Out up to
/// FirstBurstLength.
fn command_pdus(itt: u32, cmd_sn: u32, exp_stat_sn: u32, cmd: &Command, p: &Params) -> Vec<Pdu> {
    let data = cmd.write.clone().unwrap_or_default();
    let total = data.len() as u32;
    let max_pdu = p.peer_max_recv_data.max(512);
    let first_burst = p.first_burst.min(p.max_burst).max(1);
    let immediate = if p.immediate_data {
        total.min(first_burst).min(max_pdu)
    } else {
        0
    };
    let unsolicited = if p.initial_r2t {
        immediate
    } else {
        total.min(first_burst)
    };
    let mut b = Bhs::new(Opcode::ScsiCommand);
    // F: no unsolicited Data-Out follows; ATTR 1: simple.
    b.0[1] = if unsolicited == immediate { 0x80 } else { 0 }
        | if cmd.read > 0 { 0x40 } else { 0 }
        | if cmd.write.is_some() { 0x20 } else { 0 }
        | 0x01;
    b.set_lun(cmd.lun);
    b.set_itt(itt);
    b.set_u32(20, if cmd.write.is_some() { total } else { cmd.read });
    b.set_u32(24, cmd_sn);
    b.set_u32(28, exp_stat_sn);
    b.0[32..48].copy_from_slice(&cmd.cdb);
    let mut out = vec![Pdu::new(b, data.slice(..immediate as usize))];
    if unsolicited > immediate {
        out.extend(data_out(
            itt,
            cmd.lun,
            RESERVED_TAG,
            &data,
            immediate,
            unsolicited,
            max_pdu,
            exp_stat_sn,
        ));
    }
    out
}

/// Data-Out PDUs for bytes `[from, to)` of `data`: one sequence, DataSN
/// from 0, at most `max_pdu` bytes each, F on the last.
#[allow(clippy::too_many_arguments)]
fn data_out(
    itt: u32,
    lun: u64,
    ttt: u32,
    data: &Bytes,
    from: u32,
    to: u32,
    max_pdu: u32,
    exp_stat_sn: u32,
) -> Vec<Pdu> {
    let mut out = Vec::with_capacity(((to - from) / max_pdu + 1) as usize);
    let mut at = from;
    let mut data_sn = 0u32;
    while at < to {
        let n = (to - at).min(max_pdu);
        let mut b = Bhs::new(Opcode::DataOut);
        b.set_final(at + n == to);
        b.set_lun(lun);
        b.set_itt(itt);
        b.set_u32(20, ttt);
        b.set_u32(28, exp_stat_sn);
        b.set_u32(36, data_sn);
        b.set_u32(40, at);
        out.push(Pdu::new(b, data.slice(at as usize..(at + n) as usize)));
        at += n;
        data_sn += 1;
    }
    out
}
